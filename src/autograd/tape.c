/* tape.c - the autograd tape: variables, recording, backward traversal and gradient accumulation.
 * Ops are recorded by id; their backward rules and recompute flags come from the op table.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <stdlib.h>

#include "autograd/autograd.h"
#include "mesh/mesh.h"

/* Growth warning defaults: a tape that is never reset keeps the graph and the intermediate values
 * of every pass; past either threshold it says so once (DTENSOR_TAPE_WARN_NODES,
 * DTENSOR_TAPE_WARN_MB; 0 turns one off). One training step of a large model records some
 * thousands of nodes, so a million is many steps' worth. */
#define DT__TAPE_WARN_NODES 1000000
#define DT__TAPE_WARN_MB 65536

static const dt_handle_kind_t dt__tape_kind = {"tape"};
static const dt_handle_kind_t dt__var_kind = {"variable"};

static dt_status_t dt__tape_check(dt_tape_t t) { return dt_handle_check(t, &dt__tape_kind, "tape"); }
static dt_status_t dt__var_check(dt_var_t v);

static _Thread_local int dt__grad_off = 0;

void dt_grad_set_enabled(int enabled) { dt__grad_off = !enabled; }
int dt_grad_enabled(void) { return !dt__grad_off; }

struct dt_tape {
  dt__node_t** nodes;
  int64_t n_nodes, cap_nodes;
  dt_var_t* owned; /* tape-owned variables */
  int64_t n_owned, cap_owned;
  dt_ckpt_policy_fn policy;
  void* policy_ctx;
  int64_t saved_nbytes, recomputed;
  dt__span_t* spans; /* hooks around spans of nodes */
  int64_t n_spans, cap_spans;
  int64_t held_nbytes;             /* bytes of the tape-owned values held now (dt_tape_stats) */
  int in_backward;                 /* recomputations mark what they restore (dt__ensure_value) */
  int running;                     /* a backward pass is running on it, its hooks included: a
                                    * reset, a destroy or another backward pass from a hook is
                                    * refused (they would free or rewrite the graph it walks) */
  int64_t warn_nodes, warn_nbytes; /* growth warning thresholds (0: off), read at creation */
  int warned;                      /* the growth warning was given (once per tape) */
};

static int64_t dt__value_nbytes(dt_tensor_t t) {
  return t ? t->local_numel * (int64_t)dt__itemsize(t->dtype) : 0;
}

/* Says once per tape (on rank 0) that it has grown past a threshold: the usual cause is a
 * training loop that never calls dt_tape_reset. */
static void dt__tape_check_growth(dt_tape_t tape) {
  if (tape->warned) return;
  int nodes = tape->warn_nodes > 0 && tape->n_nodes > tape->warn_nodes;
  int bytes = tape->warn_nbytes > 0 && tape->held_nbytes > tape->warn_nbytes;
  if (!nodes && !bytes) return;
  tape->warned = 1;
  if (dt__world_rank() > 0) return; /* rank 0 only, as the library's other messages */
  dt__log("tape", "warning: a tape holds %lld recorded nodes and %.1f MiB of intermediate values "
          "(past %s=%lld): call dt_tape_reset after each backward pass, or every pass's graph "
          "and values stay; if one pass is this large, raise %s (0: off). Said once per tape.",
          (long long)tape->n_nodes, (double)tape->held_nbytes / 1048576.0,
          nodes ? "DTENSOR_TAPE_WARN_NODES" : "DTENSOR_TAPE_WARN_MB",
          nodes ? (long long)tape->warn_nodes : (long long)(tape->warn_nbytes / 1048576),
          nodes ? "DTENSOR_TAPE_WARN_NODES" : "DTENSOR_TAPE_WARN_MB");
}

int dt_ckpt_policy_default(const char* op, void* ctx) {
  (void)ctx;
  if (op == NULL) return 1; /* nothing to recompute by: save */
  const dt_op_info_t* info = dt__op_info(dt__op_find(op));
  /* pointwise ops and views are recomputed; matmuls, norms, softmax, attention, embedding,
   * reductions, routing, unknown names: saved */
  return info == NULL || !(info->flags & DT_OPF_RECOMPUTE);
}

static dt_status_t dt__tape_set_checkpoint_impl(dt_tape_t tape, dt_ckpt_policy_fn policy,
                                                void* ctx) {
  DT_CHECK(dt__tape_check(tape));
  tape->policy = policy;
  tape->policy_ctx = ctx;
  return DT_SUCCESS;
}

dt_status_t dt_tape_set_checkpoint(dt_tape_t tape, dt_ckpt_policy_fn policy, void* ctx) {
  DT_ENTRY_RETURN(dt__tape_set_checkpoint_impl(tape, policy, ctx));
}

/* Frees a recorded value; it comes back through dt__ensure_value. */
static void dt__var_drop(dt_tape_t tape, dt_var_t v) {
  tape->saved_nbytes += dt__value_nbytes(v->value);
  tape->held_nbytes -= dt__value_nbytes(v->value);
  dt__tensor_free(v->value);
  v->value = NULL;
  v->dropped = 1;
}

static dt_status_t dt__tape_checkpoint_impl(dt_tape_t tape, int n_keep, const dt_var_t* keep) {
  DT_CHECK(dt__tape_check(tape));
  if (n_keep < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_keep %d is negative (valid: 0 or more)", n_keep);
  if (n_keep > 0) DT_ARG_NOT_NULL(keep);
  for (int k = 0; k < n_keep; k++) DT_CHECK(dt__var_check(keep[k]));
  if (tape->policy == NULL) return DT_SUCCESS;
  for (int64_t i = 0; i < tape->n_owned; i++) {
    dt_var_t v = tape->owned[i];
    if (v->dropped || v->value == NULL || v->creator == NULL) continue;
    int kept = 0;
    for (int k = 0; k < n_keep; k++) kept |= keep[k] == v;
    if (kept || tape->policy(dt__op_info(v->creator->op)->name, tape->policy_ctx)) continue;
    dt__var_drop(tape, v);
  }
  return DT_SUCCESS;
}

dt_status_t dt_tape_checkpoint(dt_tape_t tape, int n_keep, const dt_var_t* keep) {
  DT_ENTRY_RETURN(dt__tape_checkpoint_impl(tape, n_keep, keep));
}

static dt_status_t dt__tape_checkpoint_stats_impl(dt_tape_t tape, int64_t* saved_nbytes,
                                                  int64_t* recomputed) {
  DT_CHECK(dt__tape_check(tape));
  if (saved_nbytes) *saved_nbytes = tape->saved_nbytes;
  if (recomputed) *recomputed = tape->recomputed;
  return DT_SUCCESS;
}

dt_status_t dt_tape_checkpoint_stats(dt_tape_t tape, int64_t* saved_nbytes, int64_t* recomputed) {
  DT_ENTRY_RETURN(dt__tape_checkpoint_stats_impl(tape, saved_nbytes, recomputed));
}

/* Brings back a dropped value by rerunning its producer (inputs first, recursively). */
static dt_status_t dt__ensure_value(dt_tape_t tape, dt_var_t v) {
  if (!v->dropped) return DT_SUCCESS;
  dt__node_t* n = v->creator;
  dt_tensor_t in[DT_OP_MAX_INPUTS], res[DT_OP_MAX_OUTPUTS] = {NULL};
  for (int t = 0; t < n->n_in; t++) {
    DT_CHECK(dt__ensure_value(tape, n->in[t]));
    in[t] = n->in[t]->value;
  }
  dt_status_t st = dt__op_apply(n->op, n->n_in, in, n->n_iargs, n->iargs, n->n_fargs, n->fargs,
                                n->n_out, res, NULL);
  if (st != DT_SUCCESS) return st;
  tape->recomputed++;
  for (int o = 0; o < n->n_out; o++) {
    dt_var_t w = n->out[o];
    if (w->dropped) {
      w->value = res[o];
      tape->held_nbytes += dt__value_nbytes(w->value);
      w->dropped = 0;
      w->restored = tape->in_backward;
      w->value->held = 1;
      dt__storage_set_category(w->value->storage, DT_MEM_ACTIVATIONS);
    } else {
      dt__tensor_free(res[o]);
    }
  }
  dt__tape_check_growth(tape);
  return DT_SUCCESS;
}

static dt_status_t dt__var_check(dt_var_t v) {
  DT_CHECK(dt_handle_check(v, &dt__var_kind, "variable"));
  if (v->destroyed)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "variable was destroyed (a tape that recorded it keeps "
                   "it until dt_tape_reset)");
  return DT_SUCCESS;
}

static dt_status_t dt__tape_create_impl(dt_tape_t* out) {
  DT_ARG_NOT_NULL(out);
  dt_tape_t t = (dt_tape_t)dt__calloc(1, sizeof(struct dt_tape));
  if (t == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a tape");
  t->warn_nodes = dt__env_int("DTENSOR_TAPE_WARN_NODES", 0, INT64_MAX, DT__TAPE_WARN_NODES,
                              "autograd", "a node count, 0 (no warning) or more");
  int64_t mb = dt__env_int("DTENSOR_TAPE_WARN_MB", 0, INT64_MAX >> 20, DT__TAPE_WARN_MB, "autograd",
                           "MiB, 0 (no warning) or more");
  t->warn_nbytes = mb > INT64_MAX / 1048576 ? INT64_MAX : mb * 1048576;
  dt_status_t st = dt_handle_register(t, &dt__tape_kind);
  if (st != DT_SUCCESS) {
    dt__free(t);
    return st;
  }
  *out = t;
  return DT_SUCCESS;
}

dt_status_t dt_tape_create(dt_tape_t* out) {
  DT_ENTRY_RETURN(dt__tape_create_impl(out));
}

/* Frees a variable (its handle is gone already when a destroyed leaf outlived it on a tape). */
static void dt__var_free(dt_var_t v) {
  if (v == NULL) return;
  dt__tensor_free(v->value);
  dt__tensor_free(v->grad);
  dt_handle_unregister(v, &dt__var_kind, "variable");
  dt_handle_free(v);
}

/* The tape's references to the leaves its nodes read (a destroyed leaf goes with the last). */
static void dt__node_release_inputs(dt__node_t* n) {
  for (int t = 0; t < n->n_in; t++) {
    dt_var_t v = n->in[t];
    if (v->leaf && --v->tape_refs == 0 && v->destroyed) dt__var_free(v);
  }
}

static dt_status_t dt__tape_reset_impl(dt_tape_t tape) {
  DT_CHECK(dt__tape_check(tape));
  if (tape->running)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "a backward pass is running on this tape (called from "
                   "one of its hooks?): reset or destroy the tape after dt_tape_backward returns");
  for (int64_t i = 0; i < tape->n_nodes; i++) {
    dt__node_release_inputs(tape->nodes[i]);
    dt__tensor_free(tape->nodes[i]->saved);
    dt__free(tape->nodes[i]);
  }
  tape->n_nodes = 0;
  for (int64_t i = 0; i < tape->n_owned; i++) dt__var_free(tape->owned[i]);
  tape->n_owned = 0;
  tape->n_spans = 0;
  tape->held_nbytes = 0;
  tape->saved_nbytes = 0;
  tape->recomputed = 0;
  return DT_SUCCESS;
}

dt_status_t dt_tape_reset(dt_tape_t tape) {
  DT_ENTRY_RETURN(dt__tape_reset_impl(tape));
}

static dt_status_t dt__tape_destroy_impl(dt_tape_t tape) {
  if (tape == NULL) return DT_SUCCESS;
  DT_CHECK(dt_tape_reset(tape));
  dt_handle_unregister(tape, &dt__tape_kind, "tape");
  dt__free(tape->nodes);
  dt__free(tape->owned);
  dt__free(tape->spans);
  dt_handle_free(tape);
  return DT_SUCCESS;
}

dt_status_t dt_tape_destroy(dt_tape_t tape) {
  DT_ENTRY_RETURN(dt__tape_destroy_impl(tape));
}

static dt_status_t dt__tape_stats_impl(dt_tape_t tape, int64_t* n_nodes, int64_t* nbytes) {
  DT_CHECK(dt__tape_check(tape));
  if (n_nodes) *n_nodes = tape->n_nodes;
  if (nbytes) {
    int64_t b = 0;
    for (int64_t i = 0; i < tape->n_owned; i++) {
      dt_tensor_t t = tape->owned[i]->value;
      if (t) b += t->local_numel * (int64_t)dt__itemsize(t->dtype);
    }
    *nbytes = b;
  }
  return DT_SUCCESS;
}

dt_status_t dt_tape_stats(dt_tape_t tape, int64_t* n_nodes, int64_t* nbytes) {
  DT_ENTRY_RETURN(dt__tape_stats_impl(tape, n_nodes, nbytes));
}

static dt_status_t dt__tape_own(dt_tape_t tape, dt_var_t v);

static dt_status_t dt__var_new(dt_tensor_t value, int requires_grad, int leaf, dt_var_t* out) {
  dt_var_t v = (dt_var_t)dt__calloc(1, sizeof *v);
  if (v == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a variable");
  dt_status_t st = dt_handle_register(v, &dt__var_kind);
  if (st != DT_SUCCESS) {
    dt__free(v);
    return st;
  }
  v->value = value;
  if (value != NULL) {
    value->held = 1;
    if (leaf && requires_grad) dt__storage_set_category(value->storage, DT_MEM_PARAMETERS);
    else if (!leaf) dt__storage_set_category(value->storage, DT_MEM_ACTIVATIONS);
  }
  v->requires_grad = requires_grad;
  v->leaf = leaf;
  *out = v;
  return DT_SUCCESS;
}

static dt_status_t dt__var_leaf_impl(dt_tensor_t value, int requires_grad, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tensor_check(value, "value"));
  if (value->held)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "value already belongs to a variable (a tensor can be "
                   "the value of one variable only)");
  return dt__var_new(value, requires_grad != 0, 1, out);
}

dt_status_t dt_var_leaf(dt_tensor_t value, int requires_grad, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__var_leaf_impl(value, requires_grad, out));
}

static dt_status_t dt__tape_constant_impl(dt_tape_t tape, dt_tensor_t value, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__tensor_check(value, "value"));
  if (value->held)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "value already belongs to a variable (a tensor can be "
                   "the value of one variable only)");
  dt_var_t v = NULL;
  DT_CHECK(dt__var_new(value, 0, 0, &v));
  dt_status_t st = dt__tape_own(tape, v);
  if (st != DT_SUCCESS) {
    value->held = 0;
    v->value = NULL; /* the caller keeps the tensor on failure */
    dt__var_free(v);
    return st;
  }
  dt__tape_check_growth(tape);
  *out = v;
  return DT_SUCCESS;
}

dt_status_t dt_tape_constant(dt_tape_t tape, dt_tensor_t value, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__tape_constant_impl(tape, value, out));
}

static dt_status_t dt__var_destroy_impl(dt_var_t v) {
  if (v == NULL) return DT_SUCCESS;
  DT_CHECK(dt__var_check(v));
  if (!v->leaf)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "v is tape-owned (the result of a recorded op): "
                   "dt_tape_reset frees it");
  if (v->tape_refs > 0) { /* recorded: the tapes keep it until their reset */
    v->destroyed = 1;
    v->hook = NULL;
    return DT_SUCCESS;
  }
  dt__var_free(v);
  return DT_SUCCESS;
}

dt_status_t dt_var_destroy(dt_var_t v) {
  DT_ENTRY_RETURN(dt__var_destroy_impl(v));
}

/* Borrowed tensors: marked as held so that dt_tensor_destroy refuses them. NULL for a value
 * dropped by checkpointing (until the backward pass recomputes it). */
static dt_tensor_t dt__lend(dt_tensor_t t) {
  if (t != NULL) t->held = 1;
  return t;
}
dt_tensor_t dt_var_value(dt_var_t v) {
  return dt__var_check(v) == DT_SUCCESS ? dt__lend(v->value) : NULL;
}
dt_tensor_t dt_var_grad(dt_var_t v) {
  return dt__var_check(v) == DT_SUCCESS ? dt__lend(v->grad) : NULL;
}

static dt_status_t dt__var_requires_grad_impl(dt_var_t v, int* requires_grad) {
  DT_ARG_NOT_NULL(requires_grad);
  *requires_grad = 0;
  DT_CHECK(dt__var_check(v));
  *requires_grad = v->requires_grad;
  return DT_SUCCESS;
}

dt_status_t dt_var_requires_grad(dt_var_t v, int* requires_grad) {
  DT_ENTRY_RETURN(dt__var_requires_grad_impl(v, requires_grad));
}

static dt_status_t dt__var_is_leaf_impl(dt_var_t v, int* is_leaf) {
  DT_ARG_NOT_NULL(is_leaf);
  *is_leaf = 0;
  DT_CHECK(dt__var_check(v));
  *is_leaf = v->leaf != 0;
  return DT_SUCCESS;
}

dt_status_t dt_var_is_leaf(dt_var_t v, int* is_leaf) {
  DT_ENTRY_RETURN(dt__var_is_leaf_impl(v, is_leaf));
}

static dt_status_t dt__var_set_requires_grad_impl(dt_var_t v, int requires_grad) {
  DT_CHECK(dt__var_check(v));
  if (!v->leaf)
    return DT_FAIL(DT_ERR_INVALID_ARG, "only a leaf's requires_grad can be set (dt_var_leaf); "
                   "an op's result requires a gradient when one of its inputs does");
  v->requires_grad = requires_grad != 0;
  if (v->requires_grad && v->value != NULL)
    dt__storage_set_category(v->value->storage, DT_MEM_PARAMETERS);
  return DT_SUCCESS;
}

dt_status_t dt_var_set_requires_grad(dt_var_t v, int requires_grad) {
  DT_ENTRY_RETURN(dt__var_set_requires_grad_impl(v, requires_grad));
}

static dt_status_t dt__var_zero_grad_impl(dt_var_t v) {
  DT_CHECK(dt__var_check(v));
  dt__tensor_free(v->grad);
  v->grad = NULL;
  return DT_SUCCESS;
}

dt_status_t dt_var_zero_grad(dt_var_t v) {
  DT_ENTRY_RETURN(dt__var_zero_grad_impl(v));
}

/* "f32 [8, 4] S(0)R" */
static void dt__describe(dt_tensor_t t, char* buf, size_t cap) {
  int w = snprintf(buf, cap, "%s [", dt_dtype_name(t->dtype));
  for (int d = 0; d < t->layout.ndim && w > 0 && (size_t)w < cap; d++)
    w += snprintf(buf + w, cap - (size_t)w, "%s%lld", d ? ", " : "", (long long)t->layout.shape[d]);
  if (w > 0 && (size_t)w < cap) w += snprintf(buf + w, cap - (size_t)w, "] ");
  if (w > 0 && (size_t)w < cap)
    dt_placements_format(t->layout.pl, t->layout.mesh_ndim, NULL, buf + w, cap - (size_t)w);
}

static int dt__same_layout(const dt_layout_t* a, const dt_layout_t* b) {
  if (a->ndim != b->ndim || a->mesh_ndim != b->mesh_ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  for (int i = 0; i < a->mesh_ndim; i++)
    if (!dt_placement_equal(a->pl[i], b->pl[i])) return 0;
  return 1;
}

static dt_status_t dt__var_set_value_impl(dt_var_t v, dt_tensor_t value) {
  DT_CHECK(dt__var_check(v));
  if (!v->leaf)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "v is not a leaf: only a leaf's value can be replaced");
  DT_CHECK(dt__tensor_check(value, "value"));
  if (value == v->value) return DT_SUCCESS; /* dt_var_set_value(v, dt_var_value(v)) */
  if (value->held)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "value already belongs to a variable (pass a tensor of "
                   "your own, e.g. a copy)");
  dt_tensor_t x = v->value;
  if (x != NULL) {
    if (value->mesh != x->mesh || value->dtype != x->dtype ||
        !dt__same_layout(&value->layout, &x->layout)) {
      char want[192], got[192];
      dt__describe(x, want, sizeof want);
      dt__describe(value, got, sizeof got);
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "value must have the same mesh, dtype, shape and placements as the old "
                     "one (old: %s; new: %s%s)", want, got,
                     value->mesh != x->mesh ? ", another mesh" : "");
    }
  }
  dt__tensor_free(x);
  value->held = 1;
  if (v->requires_grad) dt__storage_set_category(value->storage, DT_MEM_PARAMETERS);
  v->value = value;
  return DT_SUCCESS;
}

dt_status_t dt_var_set_value(dt_var_t v, dt_tensor_t value) {
  DT_ENTRY_RETURN(dt__var_set_value_impl(v, value));
}

static dt_status_t dt__tape_own(dt_tape_t tape, dt_var_t v) {
  if (tape->n_owned == tape->cap_owned) {
    int64_t cap = tape->cap_owned ? 2 * tape->cap_owned : 64;
    dt_var_t* p = (dt_var_t*)dt__realloc(tape->owned, sizeof(dt_var_t) * (size_t)cap);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "growing the tape");
    tape->owned = p;
    tape->cap_owned = cap;
  }
  tape->owned[tape->n_owned++] = v;
  tape->held_nbytes += dt__value_nbytes(v->value);
  return DT_SUCCESS;
}

static dt_status_t dt__tape_push(dt_tape_t tape, dt__node_t* n) {
  if (tape->n_nodes == tape->cap_nodes) {
    int64_t cap = tape->cap_nodes ? 2 * tape->cap_nodes : 64;
    dt__node_t** p = (dt__node_t**)dt__realloc(tape->nodes, sizeof(dt__node_t*) * (size_t)cap);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "growing the tape");
    tape->nodes = p;
    tape->cap_nodes = cap;
  }
  tape->nodes[tape->n_nodes++] = n;
  return DT_SUCCESS;
}

/* Wraps freshly computed tensors as tape-owned outputs and records the node when needed. */
static dt_status_t dt__record(dt_tape_t tape, int op, int n_inputs, const dt_var_t* inputs,
                              int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                              int n_outputs, dt_tensor_t* res, dt_tensor_t saved, dt_var_t* outs) {
  int needs = 0;
  for (int t = 0; t < n_inputs; t++) needs |= inputs[t]->requires_grad;
  needs &= !dt__grad_off;
  dt_status_t st = DT_SUCCESS;
  dt__node_t* node = NULL;
  const dt_op_info_t* info = dt__op_info(op);
  if (needs) {
    if (info->backward == NULL) {
      st = DT_FAIL(DT_ERR_UNSUPPORTED, "%s has no backward rule (run it with grad mode off or "
                                       "on inputs that need no gradient)", info->name);
      goto fail;
    }
    node = (dt__node_t*)dt__calloc(1, sizeof *node);
    if (node == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a tape node");
      goto fail;
    }
    node->op = op;
    node->n_in = n_inputs;
    node->n_out = n_outputs;
    for (int t = 0; t < n_inputs; t++) node->in[t] = inputs[t];
    node->n_iargs = n_iargs;
    node->n_fargs = n_fargs;
    if (n_iargs) memcpy(node->iargs, iargs, sizeof(int64_t) * (size_t)n_iargs);
    if (n_fargs) memcpy(node->fargs, fargs, sizeof(double) * (size_t)n_fargs);
  }
  for (int o = 0; o < n_outputs; o++) {
    /* integer outputs (topk indices) never need a gradient */
    int rg = needs && dt__dtype_is_float(res[o]->dtype);
    st = dt__var_new(res[o], rg, 0, &outs[o]);
    if (st == DT_SUCCESS) {
      res[o] = NULL;
      st = dt__tape_own(tape, outs[o]);
      if (st != DT_SUCCESS) {
        dt__var_free(outs[o]);
        outs[o] = NULL;
      }
    }
    if (st != DT_SUCCESS) {
      for (int j = 0; j < o; j++) outs[j] = NULL; /* already owned by the tape */
      goto fail;
    }
    if (node) {
      node->out[o] = outs[o];
      outs[o]->creator = node;
    }
  }
  if (node) {
    st = dt__tape_push(tape, node);
    if (st != DT_SUCCESS) goto fail;
    for (int t = 0; t < n_inputs; t++) inputs[t]->tape_refs += inputs[t]->leaf;
    node->saved = saved; /* the backward rule reuses it */
    saved = NULL;
  }
  dt__tensor_free(saved);
  dt__tape_check_growth(tape);
  return DT_SUCCESS;
fail:
  dt__tensor_free(saved);
  dt__free(node);
  for (int o = 0; o < n_outputs; o++) {
    dt__tensor_free(res[o]);
    outs[o] = NULL;
  }
  return st;
}

/* Runs op `id` on the inputs' values and records it (with its by-product for the backward). */
static dt_status_t dt__ag_apply(dt_tape_t tape, int id, int n_inputs, const dt_var_t* inputs,
                                int n_iargs, const int64_t* iargs, int n_fargs,
                                const double* fargs, int n_outputs, dt_var_t* outs) {
  dt_tensor_t vals[DT_OP_MAX_INPUTS] = {NULL}, res[DT_OP_MAX_OUTPUTS] = {NULL}, saved = NULL;
  for (int t = 0; t < n_inputs; t++) {
    DT_CHECK(dt__var_check(inputs[t]));
    DT_CHECK(dt__ensure_value(tape, inputs[t])); /* dropped by checkpointing: recompute */
    vals[t] = inputs[t]->value;
  }
  /* Operands of different dtypes that the op promotes: cast to the result dtype, each cast
   * recorded as a node when the op is, so that every input's gradient comes back in its own
   * dtype (PyTorch: a bf16 leaf's gradient is bf16); not recorded, dispatch casts them itself.
   * The casts and the op run before anything is recorded, so a failed cast or op leaves the tape
   * as it was; a failure while recording (out of memory) may leave the cast nodes recorded before
   * it, as a failed op leaves the ops before it: unused nodes, freed by the tape's reset. */
  dt_tensor_t cast[DT_OP_MAX_INPUTS] = {NULL};
  int needs = 0;
  for (int t = 0; t < n_inputs; t++) needs |= inputs[t]->requires_grad;
  needs &= !dt__grad_off;
  if (needs && (dt__op_info(id)->flags & DT_OPF_PROMOTES_MASK)) {
    DT_CHECK(dt__op_promote(id, n_inputs, vals, cast));
    for (int t = 0; t < n_inputs; t++) vals[t] = cast[t] != NULL ? cast[t] : vals[t];
  }
  dt_status_t st = dt__op_apply(id, n_inputs, vals, n_iargs, iargs, n_fargs, fargs, n_outputs,
                                res, &saved);
  dt_var_t in[DT_OP_MAX_INPUTS];
  for (int t = 0; t < n_inputs; t++) {
    in[t] = inputs[t];
    if (cast[t] == NULL) continue;
    if (st == DT_SUCCESS) { /* the cast's node: input t -> its value in the op's dtype */
      const int64_t code = (int64_t)cast[t]->dtype;
      st = dt__record(tape, DT_OP_CAST, 1, &inputs[t], 1, &code, 0, NULL, 1, &cast[t], NULL,
                      &in[t]);
      cast[t] = NULL; /* dt__record took it, or freed it on failure */
    }
    dt__tensor_free(cast[t]);
  }
  if (st != DT_SUCCESS) {
    for (int o = 0; o < n_outputs; o++) dt__tensor_free(res[o]);
    dt__tensor_free(saved);
    return st;
  }
  return dt__record(tape, id, n_inputs, in, n_iargs, iargs, n_fargs, fargs, n_outputs, res,
                    saved, outs);
}

static dt_status_t dt__ag_op_impl(dt_tape_t tape, const char* name, int n_inputs,
                                  const dt_var_t* inputs, int n_iargs, const int64_t* iargs,
                                  int n_fargs, const double* fargs, int n_outputs, dt_var_t* outs) {
  DT_ARG_NOT_NULL(outs);
  DT_ARG_NOT_NULL(inputs);
  if (n_inputs < 1 || n_inputs > DT_OP_MAX_INPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_inputs %d out of range [1, %d]", n_inputs,
                   DT_OP_MAX_INPUTS);
  dt_var_t in[DT_OP_MAX_INPUTS]; /* first: outs may be the inputs' array */
  memcpy(in, inputs, sizeof(dt_var_t) * (size_t)n_inputs);
  inputs = in;
  for (int o = 0; o < n_outputs && o < DT_OP_MAX_OUTPUTS; o++) outs[o] = NULL;
  DT_CHECK(dt__tape_check(tape));
  if (n_outputs < 1 || n_outputs > DT_OP_MAX_OUTPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_outputs %d out of range [1, %d]", n_outputs,
                   DT_OP_MAX_OUTPUTS);
  int id;
  DT_CHECK(dt__op_resolve(name, &id));
  return dt__ag_apply(tape, id, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs, outs);
}

dt_status_t dt_ag_op(dt_tape_t tape, const char* name, int n_inputs, const dt_var_t* inputs,
                     int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                     int n_outputs, dt_var_t* outs) {
  DT_ENTRY_RETURN(dt__ag_op_impl(tape, name, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs,
                                 n_outputs, outs));
}

/* The op arguments of n placements for a tensor of x's shape, each checked against that shape
 * first (so the message names the placement, not its code). */
static dt_status_t dt__ag_placement_codes(dt_var_t x, const dt_placement_t* pl, int n,
                                          int64_t* code) {
  for (int i = 0; i < n; i++) {
    dt_placement_t p = pl[i];
    DT_CHECK(dt_placement_normalize(&p, x->value->layout.ndim));
    code[i] = dt_placement_encode(p);
  }
  return DT_SUCCESS;
}

static dt_status_t dt__ag_redistribute_impl(dt_tape_t tape, dt_var_t x, const dt_placement_t* dst,
                                            dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(x));
  DT_ARG_NOT_NULL(dst);
  DT_CHECK(dt__ensure_value(tape, x));
  int nd = x->value->mesh->ndim;
  int64_t code[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__ag_placement_codes(x, dst, nd, code));
  return dt__ag_apply(tape, DT_OP_REDISTRIBUTE, 1, &x, nd, code, 0, NULL, 1, out);
}

dt_status_t dt_ag_redistribute(dt_tape_t tape, dt_var_t x, const dt_placement_t* dst,
                               dt_var_t* out) {
  DT_ENTRY_RETURN(dt__ag_redistribute_impl(tape, x, dst, out));
}

static dt_status_t dt__ag_cross_entropy_impl(dt_tape_t tape, dt_var_t logits, dt_var_t targets,
                                             dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  dt_var_t in[2] = {logits, targets};
  const int64_t mean[1] = {DT_LOSS_MEAN};
  return dt__ag_apply(tape, DT_OP_CROSS_ENTROPY, 2, in, 1, mean, 0, NULL, 1, out);
}

dt_status_t dt_ag_cross_entropy(dt_tape_t tape, dt_var_t logits, dt_var_t targets,
                                dt_var_t* out) {
  DT_ENTRY_RETURN(dt__ag_cross_entropy_impl(tape, logits, targets, out));
}

static dt_status_t dt__ag_to_local_impl(dt_tape_t tape, dt_var_t x,
                                        const dt_placement_t* grad_placements, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(x));
  DT_CHECK(dt__ensure_value(tape, x));
  int nd = x->value->mesh->ndim;
  int64_t code[DT_MAX_MESH_DIMS];
  if (grad_placements) DT_CHECK(dt__ag_placement_codes(x, grad_placements, nd, code));
  return dt__ag_apply(tape, DT_OP_TO_LOCAL, 1, &x, grad_placements ? nd : 0, code, 0, NULL, 1,
                      out);
}

dt_status_t dt_ag_to_local(dt_tape_t tape, dt_var_t x, const dt_placement_t* grad_placements,
                           dt_var_t* out) {
  DT_ENTRY_RETURN(dt__ag_to_local_impl(tape, x, grad_placements, out));
}

static dt_status_t dt__ag_from_local_impl(dt_tape_t tape, dt_var_t x, dt_var_t like,
                                          dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  dt_var_t in[2] = {x, like};
  return dt__ag_apply(tape, DT_OP_FROM_LOCAL, 2, in, 0, NULL, 0, NULL, 1, out);
}

dt_status_t dt_ag_from_local(dt_tape_t tape, dt_var_t x, dt_var_t like, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__ag_from_local_impl(tape, x, like, out));
}

static dt_status_t dt__ag_local_to_mesh_impl(dt_tape_t tape, dt_var_t x, dt_mesh_t mesh,
                                             dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(x));
  DT_ARG_NOT_NULL(mesh);
  DT_CHECK(dt__ensure_value(tape, x));
  dt_tensor_t v = x->value;
  if (v->mesh == mesh) {
    *out = x;
    return DT_SUCCESS;
  }
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  dt_tensor_t t;
  dt_var_t in[2] = {x, NULL};
  DT_CHECK(dt_tensor_meta(mesh, v->dtype, v->layout.ndim, v->local_shape, rep, &t));
  dt_status_t st = dt_tape_constant(tape, t, &in[1]);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(t);
    return st;
  }
  return dt__ag_apply(tape, DT_OP_FROM_LOCAL, 2, in, 0, NULL, 0, NULL, 1, out);
}

dt_status_t dt_ag_local_to_mesh(dt_tape_t tape, dt_var_t x, dt_mesh_t mesh, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__ag_local_to_mesh_impl(tape, x, mesh, out));
}

static dt_status_t dt__ag_all_to_all_impl(dt_tape_t tape, dt_var_t x, int mesh_dim, int n,
                                          const int64_t* send_counts, const int64_t* recv_counts,
                                          dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(x));
  DT_ARG_NOT_NULL(send_counts);
  DT_CHECK(dt__ensure_value(tape, x));
  dt_mesh_t mesh = x->value->mesh;
  int md = mesh_dim < 0 ? mesh_dim + mesh->ndim : mesh_dim;
  if (md < 0 || md >= mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mesh_dim=%d out of range for a %d-dim mesh (valid: %d "
                   "to %d)", mesh_dim, mesh->ndim, -mesh->ndim, mesh->ndim - 1);
  if (n != mesh->shape[md])
    return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d counts for mesh dim %d of %d ranks (valid: n = %d)",
                   n, mesh_dim, mesh->shape[md], mesh->shape[md]);
  int64_t* c = (int64_t*)dt__malloc(sizeof(int64_t) * 2 * (size_t)n);
  if (c == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "a list of %d counts", 2 * n);
  memcpy(c, send_counts, sizeof(int64_t) * (size_t)n);
  if (recv_counts) memcpy(c + n, recv_counts, sizeof(int64_t) * (size_t)n);
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const int64_t shape[1] = {recv_counts ? 2 * n : n};
  dt_tensor_t t;
  dt_status_t st = dt_tensor_from_full(mesh, DT_I64, 1, shape, rep, c, &t);
  dt__free(c);
  DT_CHECK(st);
  dt_var_t in[2];
  in[0] = x;
  st = dt_tape_constant(tape, t, &in[1]);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(t);
    return st;
  }
  const int64_t dim[1] = {md};
  return dt__ag_apply(tape, DT_OP_ALL_TO_ALL_SINGLE, 2, in, 1, dim, 0, NULL, 1, out);
}

dt_status_t dt_ag_all_to_all(dt_tape_t tape, dt_var_t x, int mesh_dim, int n,
                             const int64_t* send_counts, const int64_t* recv_counts,
                             dt_var_t* out) {
  DT_ENTRY_RETURN(dt__ag_all_to_all_impl(tape, x, mesh_dim, n, send_counts, recv_counts, out));
}

int dt_ag_has_backward(const char* name) {
  const dt_op_info_t* info = dt__op_info(dt__op_find(name));
  return info != NULL && info->backward != NULL;
}

/* Moves g (taken) to placements `want`. A Partial target is reached through Replicate (a new
 * Partial can only come from Replicate: the R -> P step is a local partition). */
static dt_status_t dt__to_placements(dt_tensor_t* g, const dt_placement_t* want) {
  int nd = (*g)->mesh->ndim, same = 1, partial = 0;
  dt_placement_t mid[DT_MAX_MESH_DIMS];
  for (int i = 0; i < nd; i++) {
    same &= dt_placement_equal((*g)->layout.pl[i], want[i]);
    partial |= want[i].kind == DT_PARTIAL && !dt_placement_equal((*g)->layout.pl[i], want[i]);
    mid[i] = want[i].kind == DT_PARTIAL ? dt_replicate() : want[i];
  }
  if (same) return DT_SUCCESS;
  dt_tensor_t a, b;
  DT_CHECK(dt_tensor_redistribute(*g, partial ? mid : want, &a));
  dt__tensor_free(*g);
  *g = a;
  if (!partial) return DT_SUCCESS;
  DT_CHECK(dt_tensor_redistribute(a, want, &b));
  dt__tensor_free(a);
  *g = b;
  return DT_SUCCESS;
}

/* grad += g (takes g). A leaf's gradient keeps the leaf's placements and owns its storage (a
 * rule may hand one tensor to several inputs, and views share storage: a caller scaling one
 * leaf's gradient in place must not change another's, as PyTorch's AccumulateGrad). */
static dt_status_t dt__accumulate(dt_var_t v, dt_tensor_t g) {
  dt_status_t st = DT_SUCCESS;
  int reduce = v->leaf && v->grad_mode == DT_GRAD_TO_PLACEMENTS;
  v->touched = 1;
  if (v->leaf) {
    if (reduce) st = dt__to_placements(&g, v->value->layout.pl);
    if (st == DT_SUCCESS && v->grad == NULL && dt__tensor_shared(g)) {
      dt_tensor_t c;
      st = dt__tensor_clone(g, &c);
      if (st == DT_SUCCESS) {
        dt__tensor_free(g);
        g = c;
      }
    }
    if (st != DT_SUCCESS) {
      dt__tensor_free(g);
      return st;
    }
  }
  if (v->grad == NULL) {
    dt__storage_set_category(g->storage, DT_MEM_GRADIENTS);
    v->grad = g;
    return DT_SUCCESS;
  }
  dt_tensor_t sum, in[2] = {v->grad, g};
  st = dt__op_apply(DT_OP_ADD, 2, in, 0, NULL, 0, NULL, 1, &sum, NULL);
  dt__tensor_free(g);
  if (st != DT_SUCCESS) return st;
  if (reduce) st = dt__to_placements(&sum, v->value->layout.pl);
  if (st != DT_SUCCESS) {
    dt__tensor_free(sum);
    return st;
  }
  dt__tensor_free(v->grad);
  dt__storage_set_category(sum->storage, DT_MEM_GRADIENTS);
  v->grad = sum;
  return DT_SUCCESS;
}

/* After node k: the hooks of the leaves whose gradient it completed (once each). */
static dt_status_t dt__leaf_hooks(dt__node_t* n, int64_t k) {
  for (int t = 0; t < n->n_in; t++) {
    dt_var_t v = n->in[t];
    if (!v->leaf || v->hook == NULL || v->ready_at != k) continue;
    v->ready_at = -1;
    if (v->touched) DT_CHECK(v->hook(v, v->hook_ctx));
  }
  return DT_SUCCESS;
}

/* Before node k (k = -1: after the last): post hooks of the spans the pass has left, inner span
 * first; then, when node k runs (`runs`), pre hooks of the spans it enters, outer span first. */
static dt_status_t dt__spans_fire(dt_tape_t tape, int64_t k, int runs) {
  for (;;) { /* post: the smallest span left */
    int64_t best = -1;
    for (int64_t s = 0; s < tape->n_spans; s++) {
      dt__span_t* p = &tape->spans[s];
      if (p->state != 1 || k >= p->first) continue;
      if (best < 0 || p->end - p->first < tape->spans[best].end - tape->spans[best].first) best = s;
    }
    if (best < 0) break;
    tape->spans[best].state = 2;
    if (tape->spans[best].post) DT_CHECK(tape->spans[best].post(tape, tape->spans[best].ctx));
  }
  while (runs) { /* pre: the largest span entered */
    int64_t best = -1;
    for (int64_t s = 0; s < tape->n_spans; s++) {
      dt__span_t* p = &tape->spans[s];
      if (p->state != 0 || k < p->first || k >= p->end) continue;
      if (best < 0 || p->end - p->first > tape->spans[best].end - tape->spans[best].first) best = s;
    }
    if (best < 0) break;
    tape->spans[best].state = 1;
    if (tape->spans[best].pre) DT_CHECK(tape->spans[best].pre(tape, tape->spans[best].ctx));
  }
  return DT_SUCCESS;
}

/* After node k's backward: the values this pass recomputed that no lower node names are
 * dropped again (checkpointing keeps them only for the nodes that need them, so the pass holds
 * one block's recomputed values at a time, not every block's). */
static void dt__release_restored(dt_tape_t tape, const dt__node_t* n, int64_t k) {
  for (int i = 0; i < n->n_in + n->n_out; i++) {
    dt_var_t v = i < n->n_in ? n->in[i] : n->out[i - n->n_in];
    if (!v->restored || v->dropped || v->first_use < k) continue;
    tape->held_nbytes -= dt__value_nbytes(v->value);
    dt__tensor_free(v->value);
    v->value = NULL;
    v->dropped = 1;
    v->restored = 0;
  }
}

static dt_status_t dt__tape_backward_impl(dt_tape_t tape, dt_var_t loss) {
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(loss));
  /* before anything is recomputed for it (a dropped loss), under this tape or inside a pass */
  if (tape->running)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "a backward pass is running on this tape already (called "
                   "from one of its hooks?): a pass cannot start inside another");
  if (!loss->leaf) { /* another tape's variable: this pass would reach none of its nodes, and the
                      * seed would stay on it and double its own tape's next pass */
    int64_t i = tape->n_owned - 1;
    while (i >= 0 && tape->owned[i] != loss) i--;
    if (i < 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "loss was not recorded on this tape (it belongs to "
                     "another tape: run the backward pass on the tape that recorded it)");
  }
  if (loss->dropped) /* dropped (dt_tape_drop, a checkpoint policy): recomputed, as an input is */
    DT_CHECK(dt__ensure_value(tape, loss));
  dt_tensor_t lv = loss->value;
  if (lv == NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "loss has no value (it was released and cannot be "
                   "recomputed)");
  if (lv->layout.ndim != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "loss has %d dims: backward needs a scalar (0-dim) loss "
                   "(reduce it first, e.g. with \"sum\" or \"mean\")", lv->layout.ndim);
  if (!loss->requires_grad)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "loss does not depend on any variable that requires a "
                   "gradient (dt_var_leaf with requires_grad = 1)");
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  dt_tensor_t seed;
  DT_CHECK(dt_tensor_full_value(lv->mesh, lv->dtype, 0, NULL, rep, 1.0, &seed));
  DT_CHECK(dt__accumulate(loss, seed));
  int prev = dt__grad_off;
  dt__grad_off = 1; /* backward computations (and hooks) are not recorded */
  dt_status_t st = DT_SUCCESS;
  /* hooked leaves: their gradient is complete after the lowest node that feeds them */
  for (int64_t k = tape->n_nodes - 1; k >= 0; k--)
    for (int t = 0; t < tape->nodes[k]->n_in; t++) {
      dt_var_t v = tape->nodes[k]->in[t];
      if (v->leaf && v->hook) {
        v->ready_at = k;
        v->touched = 0;
      }
    }
  for (int64_t s = 0; s < tape->n_spans; s++) tape->spans[s].state = 0;
  for (int64_t k = tape->n_nodes - 1; k >= 0; k--) /* each value's lowest user */
    for (int i = 0; i < tape->nodes[k]->n_in + tape->nodes[k]->n_out; i++) {
      dt__node_t* n = tape->nodes[k];
      dt_var_t v = i < n->n_in ? n->in[i] : n->out[i - n->n_in];
      v->first_use = k;
      v->restored = 0;
    }
  tape->in_backward = 1;
  tape->running = 1;
  for (int64_t k = tape->n_nodes - 1; k >= 0 && st == DT_SUCCESS; k--) {
    dt__node_t* n = tape->nodes[k];
    dt_tensor_t gout[DT_OP_MAX_OUTPUTS] = {NULL}, gin[DT_OP_MAX_INPUTS] = {NULL};
    int any = 0;
    for (int o = 0; o < n->n_out; o++) {
      gout[o] = n->out[o]->grad;
      any |= gout[o] != NULL;
    }
    st = dt__spans_fire(tape, k, any);
    if (st != DT_SUCCESS) break;
    if (!any) {
      dt__release_restored(tape, n, k);
      st = dt__leaf_hooks(n, k);
      continue;
    }
    for (int t = 0; t < n->n_in && st == DT_SUCCESS; t++) st = dt__ensure_value(tape, n->in[t]);
    for (int o = 0; o < n->n_out && st == DT_SUCCESS; o++) st = dt__ensure_value(tape, n->out[o]);
    if (st != DT_SUCCESS) break;
    dt_grad_ctx_t gc;
    memset(&gc, 0, sizeof gc);
    gc.op = n->op;
    gc.n_in = n->n_in;
    gc.n_out = n->n_out;
    for (int t = 0; t < n->n_in; t++) {
      gc.in[t] = n->in[t]->value;
      gc.needs[t] = n->in[t]->requires_grad;
    }
    for (int o = 0; o < n->n_out; o++) gc.out[o] = n->out[o]->value;
    gc.n_iargs = n->n_iargs;
    gc.n_fargs = n->n_fargs;
    gc.iargs = n->iargs;
    gc.fargs = n->fargs;
    gc.saved = n->saved;
    if (dt__prof_on()) { /* the rule's time in the op profile, "<op>.backward" */
      dt__prof_frame_t pf;
      dt__prof_begin(&pf);
      st = dt__op_info(n->op)->backward(&gc, gout, gin);
      dt__prof_end(&pf, dt__op_info(n->op)->name, DT__PROF_BACKWARD);
    } else {
      st = dt__op_info(n->op)->backward(&gc, gout, gin);
    }
    if (st != DT_SUCCESS) {
      for (int t = 0; t < n->n_in; t++) dt__tensor_free(gin[t]);
      break;
    }
    for (int t = 0; t < n->n_in && st == DT_SUCCESS; t++) {
      if (gin[t] == NULL) continue;
      if (!n->in[t]->requires_grad) { /* a rule that computes every input's gradient */
        dt__tensor_free(gin[t]);
        gin[t] = NULL;
        continue;
      }
      st = dt__accumulate(n->in[t], gin[t]);
      gin[t] = NULL;
    }
    for (int t = 0; t < n->n_in; t++) dt__tensor_free(gin[t]);
    /* an intermediate's gradient is not needed once its producer ran (a rule may have taken
     * it over as an input gradient: gout[o] is then NULL) */
    for (int o = 0; o < n->n_out; o++) {
      if (n->out[o]->grad != NULL && gout[o] == NULL) {
        n->out[o]->grad = NULL;
      } else if (!n->out[o]->leaf && n->out[o] != loss) {
        dt__tensor_free(n->out[o]->grad);
        n->out[o]->grad = NULL;
      }
    }
    if (st != DT_SUCCESS) break;
    dt__release_restored(tape, n, k);
    st = dt__leaf_hooks(n, k);
  }
  tape->in_backward = 0;
  if (st == DT_SUCCESS) st = dt__spans_fire(tape, -1, 0); /* every post hook still due */
  dt__grad_off = prev;
  /* no gradient of an intermediate (the loss included) outlives the pass: a later backward on
   * the same tape starts from its own loss only */
  for (int64_t i = 0; i < tape->n_owned; i++) {
    dt__tensor_free(tape->owned[i]->grad);
    tape->owned[i]->grad = NULL;
  }
  tape->running = 0;
  return st;
}

dt_status_t dt_tape_backward(dt_tape_t tape, dt_var_t loss) {
  DT_ENTRY_RETURN(dt__tape_backward_impl(tape, loss));
}

/* ---------------------------------------------------------------------------------------------
 * control for code built on top: gradient modes and hooks, span hooks, drop and restore */

/* `what`: the leaf's property being set, for the message. */
static dt_status_t dt__leaf_check(dt_var_t v, const char* what) {
  DT_CHECK(dt__var_check(v));
  if (!v->leaf)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "v is not a leaf variable: only leaves (dt_var_leaf) "
                   "have a %s", what);
  return DT_SUCCESS;
}

static dt_status_t dt__var_set_grad_mode_impl(dt_var_t v, dt_grad_mode_t mode) {
  DT_CHECK(dt__leaf_check(v, "gradient mode"));
  if (mode != DT_GRAD_TO_PLACEMENTS && mode != DT_GRAD_AS_IS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mode=%d is not a dt_grad_mode_t (valid: "
                   "DT_GRAD_TO_PLACEMENTS = %d or DT_GRAD_AS_IS = %d)", (int)mode,
                   (int)DT_GRAD_TO_PLACEMENTS, (int)DT_GRAD_AS_IS);
  v->grad_mode = mode;
  return DT_SUCCESS;
}

dt_status_t dt_var_set_grad_mode(dt_var_t v, dt_grad_mode_t mode) {
  DT_ENTRY_RETURN(dt__var_set_grad_mode_impl(v, mode));
}

static dt_status_t dt__var_set_grad_hook_impl(dt_var_t v, dt_grad_hook_fn fn, void* ctx) {
  DT_CHECK(dt__leaf_check(v, "gradient hook"));
  v->hook = fn;
  v->hook_ctx = fn ? ctx : NULL;
  return DT_SUCCESS;
}

dt_status_t dt_var_set_grad_hook(dt_var_t v, dt_grad_hook_fn fn, void* ctx) {
  DT_ENTRY_RETURN(dt__var_set_grad_hook_impl(v, fn, ctx));
}

static dt_status_t dt__var_reduce_grad_impl(dt_var_t v, const dt_placement_t* placements) {
  DT_CHECK(dt__leaf_check(v, "gradient to reduce"));
  if (v->grad == NULL) return DT_SUCCESS;
  dt_placement_t want[DT_MAX_MESH_DIMS];
  int nd = v->grad->mesh->ndim;
  for (int i = 0; i < nd; i++) {
    want[i] = placements ? placements[i] : v->value->layout.pl[i];
    if (dt_placement_normalize(&want[i], v->grad->layout.ndim) != DT_SUCCESS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s[%d] does not fit a %d-dim gradient",
                     placements ? "placements" : "the value's placements", i,
                     v->grad->layout.ndim);
  }
  /* on failure the gradient stays valid (as it was, or already Replicate on the way to a
   * Partial target): same values */
  dt_status_t st = dt__to_placements(&v->grad, want);
  dt__storage_set_category(v->grad->storage, DT_MEM_GRADIENTS);
  return st;
}

dt_status_t dt_var_reduce_grad(dt_var_t v, const dt_placement_t* placements) {
  DT_ENTRY_RETURN(dt__var_reduce_grad_impl(v, placements));
}

static dt_status_t dt__var_set_grad_impl(dt_var_t v, dt_tensor_t grad) {
  DT_CHECK(dt__leaf_check(v, "gradient to set"));
  if (grad != NULL) {
    DT_CHECK(dt__tensor_check(grad, "grad"));
    dt_tensor_t x = v->value;
    if (grad->mesh != x->mesh || grad->dtype != x->dtype || grad->layout.ndim != x->layout.ndim ||
        memcmp(grad->layout.shape, x->layout.shape, sizeof(int64_t) * (size_t)x->layout.ndim)) {
      char want[192], got[192];
      dt__describe(x, want, sizeof want);
      dt__describe(grad, got, sizeof got);
      return DT_FAIL(DT_ERR_INVALID_ARG, "grad must have the value's mesh, dtype and shape (value: "
                     "%s; grad: %s%s)", want, got, grad->mesh != x->mesh ? ", another mesh" : "");
    }
    if (grad == v->grad) return DT_SUCCESS;
    if (grad->held)
      return DT_FAIL(DT_ERR_INVALID_USAGE, "grad already belongs to a variable (pass a tensor of "
                     "your own)");
    grad->held = 1;
    dt__storage_set_category(grad->storage, DT_MEM_GRADIENTS);
  }
  dt__tensor_free(v->grad);
  v->grad = grad;
  return DT_SUCCESS;
}

dt_status_t dt_var_set_grad(dt_var_t v, dt_tensor_t grad) {
  DT_ENTRY_RETURN(dt__var_set_grad_impl(v, grad));
}

static dt_status_t dt__tape_add_span_hooks_impl(dt_tape_t tape, int64_t first, int64_t end,
                                                dt_tape_hook_fn pre, dt_tape_hook_fn post,
                                                void* ctx) {
  DT_CHECK(dt__tape_check(tape));
  if (first < 0 || end < first || end > tape->n_nodes)
    return DT_FAIL(DT_ERR_INVALID_ARG, "first=%lld, end=%lld: the span is outside the %lld "
                   "recorded nodes (valid: 0 <= first <= end <= %lld)", (long long)first,
                   (long long)end, (long long)tape->n_nodes, (long long)tape->n_nodes);
  if (pre == NULL && post == NULL) return DT_SUCCESS;
  if (tape->n_spans == tape->cap_spans) {
    int64_t cap = tape->cap_spans ? 2 * tape->cap_spans : 16;
    dt__span_t* p = (dt__span_t*)dt__realloc(tape->spans, sizeof(dt__span_t) * (size_t)cap);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "span hooks");
    tape->spans = p;
    tape->cap_spans = cap;
  }
  tape->spans[tape->n_spans++] = (dt__span_t){first, end, pre, post, ctx, 0};
  return DT_SUCCESS;
}

dt_status_t dt_tape_add_span_hooks(dt_tape_t tape, int64_t first, int64_t end,
                                   dt_tape_hook_fn pre, dt_tape_hook_fn post, void* ctx) {
  DT_ENTRY_RETURN(dt__tape_add_span_hooks_impl(tape, first, end, pre, post, ctx));
}

static dt_status_t dt__tape_drop_impl(dt_tape_t tape, dt_var_t v) {
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(v));
  if (v->creator == NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "v is not the output of a recorded op: only those can be "
                   "dropped and recomputed (not a leaf, a constant or an unrecorded result)");
  if (!v->dropped) dt__var_drop(tape, v);
  return DT_SUCCESS;
}

dt_status_t dt_tape_drop(dt_tape_t tape, dt_var_t v) {
  DT_ENTRY_RETURN(dt__tape_drop_impl(tape, v));
}

static dt_status_t dt__tape_restore_impl(dt_tape_t tape, dt_var_t v) {
  DT_CHECK(dt__tape_check(tape));
  DT_CHECK(dt__var_check(v));
  int prev = dt__grad_off;
  dt__grad_off = 1;
  dt_status_t st = dt__ensure_value(tape, v);
  dt__grad_off = prev;
  return st;
}

dt_status_t dt_tape_restore(dt_tape_t tape, dt_var_t v) {
  DT_ENTRY_RETURN(dt__tape_restore_impl(tape, v));
}

/* tp.c - tensor parallelism (dt_parallelize_module): a plan of module-path patterns and styles
 * places parameters on the tp mesh dim and sets layout boundaries (recorded redistributions) on
 * the modules' inputs and outputs through forward hooks. Public API only.
 *
 * Wrapping validates the whole plan first (every pattern matches a module, every parameter fits
 * its style), then makes the new sharded parameters (a local slice of the replicated ones: no
 * communication), attaches each styled module's state and hooks, and only then swaps the
 * parameters in, so an error leaves the module as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/check.h"
#include "dtensor/parallel.h"

#define TP_KEY "tp"
#define TP_PATH_MAX 256

/* Asynchronous TP: the colwise linears under one parent (q, k and v under the attention) share
 * one gathered input per forward of the parent (its "tp.async" attachment; the parent's forward
 * is wrapped so that the cache lives exactly as long as one run of it, failed or not). */
#define TP_ASYNC_KEY "tp.async"
typedef struct {
  int active; /* inside the parent's forward */
  dt_tape_t tape;
  dt_var_t in, gathered;      /* the input a colwise linear gathered, and the gathered variable */
  dt_module_forward_fn inner; /* the parent's own forward */
} tp_shared_t;

/* What a styled module keeps (its "tp" attachment, also the hooks' context). */
typedef struct {
  dt_tp_style_t style;
  int tp_dim;
  /* asynchronous: the module's own forward (run where the fused op does not apply), its weight's
   * name, and the parent's shared gather (colwise; NULL: none) */
  dt_module_forward_fn inner;
  char weight[TP_PATH_MAX];
  tp_shared_t* shared;
} tp_module_t;

/* One module the plan styles. */
typedef struct {
  dt_module_t m;
  int entry;
  char path[TP_PATH_MAX]; /* from the wrapped module ("" for it) */
} tp_target_t;

/* One parameter to place (a tied one once, for every module that holds it). */
typedef struct {
  dt_module_t owner; /* the styled module */
  const tp_target_t* target;
  char name[TP_PATH_MAX]; /* relative to owner */
  dt_var_t old, made;
  dt_placement_t pl[DT_MAX_MESH_DIMS];
} tp_param_t;

typedef struct {
  const dt_tp_plan_entry_t* plan;
  int n_plan;
  int* hits;
  tp_target_t* t;
  int n, cap;
  dt_status_t st;
} tp_walk_t;

dt_tp_style_t dt_tp_colwise(void) {
  dt_tp_style_t s;
  memset(&s, 0, sizeof s);
  s.kind = DT_TP_COLWISE;
  return s;
}

dt_tp_style_t dt_tp_rowwise(void) {
  dt_tp_style_t s;
  memset(&s, 0, sizeof s);
  s.kind = DT_TP_ROWWISE;
  s.out_mask = 1;
  s.out[0] = dt_replicate();
  return s;
}

dt_tp_style_t dt_tp_embedding_rowwise(void) {
  dt_tp_style_t s = dt_tp_rowwise();
  s.kind = DT_TP_EMBEDDING_ROWWISE;
  return s;
}

dt_tp_style_t dt_tp_embedding_colwise(void) {
  dt_tp_style_t s = dt_tp_colwise();
  s.kind = DT_TP_EMBEDDING_COLWISE;
  return s;
}

dt_tp_style_t dt_tp_sequence_parallel(int seq_dim) {
  dt_tp_style_t s;
  memset(&s, 0, sizeof s);
  s.kind = DT_TP_SEQUENCE_PARALLEL;
  s.in_mask = s.out_mask = 1;
  s.in[0] = s.out[0] = dt_shard(seq_dim);
  return s;
}

dt_tp_style_t dt_tp_prepare(void) {
  dt_tp_style_t s;
  memset(&s, 0, sizeof s);
  s.kind = DT_TP_PREPARE;
  return s;
}

/* ---- hooks ---------------------------------------------------------------------------------- */

/* Brings vars[i] (bit i of mask) to want[i] on the tp dim by a recorded redistribution. */
static dt_status_t tp_boundary(const tp_module_t* t, dt_module_t m, dt_tape_t tape, int n,
                               dt_var_t* vars, unsigned mask, const dt_placement_t* want,
                               const char* what) {
  for (int i = 0; i < n && i < DT_TP_IO_MAX; i++) {
    if (!((mask >> i) & 1u) || vars[i] == NULL) continue;
    dt_tensor_t v = dt_var_value(vars[i]);
    if (v == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "tp: %s %d of '%s' has no value", what, i,
                                  dt_module_name(m));
    int nd, mnd;
    dt_mesh_t mesh;
    dt_placement_t pl[DT_MAX_MESH_DIMS], w = want[i];
    DT_CHECK(dt_tensor_ndim(v, &nd));
    DT_CHECK(dt_tensor_mesh(v, &mesh));
    DT_CHECK(dt_mesh_ndim(mesh, &mnd));
    if (t->tp_dim >= mnd)
      return DT_FAIL(DT_ERR_INVALID_ARG, "tp: %s %d of '%s' lives on a mesh of %d dims, the tp "
                     "dim is %d", what, i, dt_module_name(m), mnd, t->tp_dim);
    if (dt_placement_normalize(&w, nd) != DT_SUCCESS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "tp: %s %d of '%s' has %d dims: its layout Shard(%d) "
                     "does not fit", what, i, dt_module_name(m), nd, want[i].dim);
    DT_CHECK(dt_tensor_placements(v, pl));
    pl[t->tp_dim] = w;
    DT_CHECK(dt_ag_redistribute(tape, vars[i], pl, &vars[i]));
  }
  return DT_SUCCESS;
}

static dt_status_t tp_pre_forward(dt_module_t m, dt_tape_t tape, int n, dt_var_t* vars,
                                  void* ctx) {
  const tp_module_t* t = ctx;
  return tp_boundary(t, m, tape, n, vars, t->style.in_mask, t->style.in, "input");
}

static dt_status_t tp_post_forward(dt_module_t m, dt_tape_t tape, int n, dt_var_t* vars,
                                   void* ctx) {
  const tp_module_t* t = ctx;
  return tp_boundary(t, m, tape, n, vars, t->style.out_mask, t->style.out, "output");
}

static void tp_free(dt_module_t m, void* data);

/* ---- asynchronous tensor parallelism ------------------------------------------------------- */

/* The parent's forward: its own, with the shared gather open for exactly that run. */
static dt_status_t tp_shared_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                     int n_out, dt_var_t* out) {
  tp_shared_t* sh = dt_module_attachment(m, TP_ASYNC_KEY);
  if (sh == NULL || sh->inner == NULL)
    return DT_FAIL(DT_ERR_INTERNAL, "tp: '%s' has no forward of its own", dt_module_name(m));
  sh->tape = NULL;
  sh->in = sh->gathered = NULL;
  sh->active = 1;
  dt_status_t st = sh->inner(m, tape, n_in, in, n_out, out);
  sh->active = 0;
  sh->tape = NULL;
  sh->in = sh->gathered = NULL;
  return st;
}

/* dim of placement p on a tensor of nd dims when it is a Shard of a row dim (not the last), else
 * -1. */
static int tp_row_shard(dt_placement_t p, int nd) {
  if (p.kind != DT_SHARD || dt_placement_normalize(&p, nd) != DT_SUCCESS) return -1;
  return p.dim < nd - 1 ? p.dim : -1;
}

/* The forward of an asynchronous colwise or rowwise linear: the fused op where its layout asks
 * for the collective (colwise: an input sharded on a row dim over the tp dim; rowwise: an output
 * boundary sharding a row dim), else the module's own forward. */
static dt_status_t tp_async_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                    int n_out, dt_var_t* out) {
  tp_module_t* t = dt_module_attachment(m, TP_KEY);
  if (t == NULL || t->inner == NULL)
    return DT_FAIL(DT_ERR_INTERNAL, "tp: '%s' has no forward of its own", dt_module_name(m));
  if (n_in != 1 || n_out < 1 || in[0] == NULL) return t->inner(m, tape, n_in, in, n_out, out);
  dt_var_t w = dt_module_get(m, t->weight);
  dt_tensor_t xv = dt_var_value(in[0]);
  if (w == NULL || xv == NULL) return t->inner(m, tape, n_in, in, n_out, out);
  int nd, mnd;
  dt_mesh_t mesh;
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_tensor_ndim(xv, &nd));
  DT_CHECK(dt_tensor_mesh(xv, &mesh));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  if (t->tp_dim >= mnd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tp: input 0 of '%s' lives on a mesh of %d dims, the tp "
                   "dim is %d", dt_module_name(m), mnd, t->tp_dim);
  DT_CHECK(dt_tensor_placements(xv, pl));
  const int64_t tp = t->tp_dim;
  if (t->style.kind == DT_TP_COLWISE) {
    const int g = tp_row_shard(pl[t->tp_dim], nd);
    if (g < 0) return t->inner(m, tape, n_in, in, n_out, out);
    tp_shared_t* sh = t->shared;
    if (sh && sh->active && tape != NULL && sh->tape == tape && sh->in == in[0])
      return t->inner(m, tape, 1, &sh->gathered, n_out, out); /* a sibling gathered it */
    const dt_var_t io[2] = {in[0], w};
    const int64_t ia[2] = {tp, g};
    dt_var_t o2[2];
    DT_CHECK(dt_ag_op(tape, "all_gather_linear", 2, io, 2, ia, 0, NULL, 2, o2));
    out[0] = o2[0];
    if (sh && sh->active && tape != NULL) {
      sh->tape = tape;
      sh->in = in[0];
      sh->gathered = o2[1];
    }
    return DT_SUCCESS;
  }
  /* rowwise */
  const int g = (t->style.out_mask & 1u) ? tp_row_shard(t->style.out[0], nd) : -1;
  if (g < 0) return t->inner(m, tape, n_in, in, n_out, out);
  const dt_var_t io[2] = {in[0], w};
  const int64_t ia[2] = {tp, g};
  return dt_ag_op(tape, "linear_reduce_scatter", 2, io, 2, ia, 0, NULL, 1, out);
}

/* Whether styled module m may run asynchronously: the style asks, it is colwise or rowwise, has
 * no children, and its one parameter is a 2-dim weight (*weight: its name). */
static int tp_async_fits(dt_module_t m, const dt_tp_style_t* s, char* weight, size_t cap) {
  if (!s->async_tp || (s->kind != DT_TP_COLWISE && s->kind != DT_TP_ROWWISE)) return 0;
  int np = 0, nc = 0, nd = 0;
  dt_var_t v;
  if (dt_module_num_params(m, &np) != DT_SUCCESS || np != 1) return 0;
  if (dt_module_num_children(m, &nc) != DT_SUCCESS || nc != 0) return 0;
  if (dt_module_param_at(m, 0, weight, cap, &v) != DT_SUCCESS) return 0;
  if (dt_tensor_ndim(dt_var_value(v), &nd) != DT_SUCCESS || nd != 2) return 0;
  return 1;
}

/* Makes styled module m asynchronous where it fits (tp_async_fits, and a forward of its own): its
 * forward replaced, a colwise one's parent (one with a forward) given the shared gather once.
 * *made_shared: whether this call made the parent's. */
static dt_status_t tp_async_setup(dt_module_t m, tp_module_t* t, int* made_shared) {
  *made_shared = 0;
  if (!tp_async_fits(m, &t->style, t->weight, sizeof t->weight)) return DT_SUCCESS;
  DT_CHECK(dt_module_set_forward(m, tp_async_forward, &t->inner));
  if (t->inner == NULL) { /* a container: nothing to take over */
    dt_module_set_forward(m, NULL, NULL);
    return DT_SUCCESS;
  }
  dt_module_t parent = dt_module_parent(m);
  if (t->style.kind != DT_TP_COLWISE || parent == NULL) return DT_SUCCESS;
  tp_shared_t* sh = dt_module_attachment(parent, TP_ASYNC_KEY);
  if (sh == NULL) {
    sh = calloc(1, sizeof *sh);
    if (sh == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "tp: the shared gather");
    dt_status_t st = dt_module_set_forward(parent, tp_shared_forward, &sh->inner);
    if (st != DT_SUCCESS || sh->inner == NULL) { /* a parent without a forward: no sharing */
      if (st == DT_SUCCESS) dt_module_set_forward(parent, NULL, NULL);
      free(sh);
      return st;
    }
    st = dt_module_attach(parent, TP_ASYNC_KEY, sh, tp_free);
    if (st != DT_SUCCESS) {
      dt_module_set_forward(parent, sh->inner, NULL);
      free(sh);
      return st;
    }
    *made_shared = 1;
  }
  t->shared = sh;
  return DT_SUCCESS;
}

/* Undoes tp_async_setup. */
static void tp_async_undo(dt_module_t m, tp_module_t* t, int made_shared) {
  if (t->inner) dt_module_set_forward(m, t->inner, NULL);
  t->inner = NULL;
  dt_module_t parent = dt_module_parent(m);
  if (made_shared && parent != NULL && t->shared != NULL) {
    dt_module_set_forward(parent, t->shared->inner, NULL);
    dt_module_detach(parent, TP_ASYNC_KEY);
    free(t->shared);
  }
  t->shared = NULL;
}

static void tp_free(dt_module_t m, void* data) {
  (void)m;
  free(data);
}

/* ---- the plan ------------------------------------------------------------------------------- */

static int tp_has_params(dt_tp_kind_t k) {
  return k == DT_TP_COLWISE || k == DT_TP_ROWWISE || k == DT_TP_EMBEDDING_ROWWISE ||
         k == DT_TP_EMBEDDING_COLWISE;
}

static const char* tp_kind_name(dt_tp_kind_t k) {
  switch (k) {
    case DT_TP_COLWISE: return "colwise";
    case DT_TP_ROWWISE: return "rowwise";
    case DT_TP_EMBEDDING_ROWWISE: return "embedding rowwise";
    case DT_TP_EMBEDDING_COLWISE: return "embedding colwise";
    case DT_TP_SEQUENCE_PARALLEL: return "sequence parallel";
    case DT_TP_PREPARE: return "prepare";
  }
  return "?";
}

static dt_status_t tp_check_style(int e, const dt_tp_style_t* s) {
  if (s->kind < DT_TP_COLWISE || s->kind > DT_TP_PREPARE)
    return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry %d: unknown style kind %d",
                   e, (int)s->kind);
  unsigned all = (1u << DT_TP_IO_MAX) - 1u;
  if ((s->in_mask & ~all) || (s->out_mask & ~all))
    return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry %d: layout masks have "
                   "bits beyond the %d inputs and outputs a style can set", e, DT_TP_IO_MAX);
  for (int io = 0; io < 2; io++) {
    unsigned mask = io ? s->out_mask : s->in_mask;
    const dt_placement_t* p = io ? s->out : s->in;
    for (int i = 0; i < DT_TP_IO_MAX; i++) {
      if (!((mask >> i) & 1u)) continue;
      if (p[i].kind != DT_REPLICATE && p[i].kind != DT_SHARD)
        return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry %d: %s %d must be "
                       "Replicate or Shard (a boundary reduces; Partial is what it reduces)", e,
                       io ? "output" : "input", i);
      if (p[i].kind == DT_SHARD && (p[i].dim >= DT_MAX_DIMS || p[i].dim < -DT_MAX_DIMS))
        return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry %d: %s %d: Shard(%d) "
                       "is outside any tensor", e, io ? "output" : "input", i, p[i].dim);
    }
  }
  return DT_SUCCESS;
}

/* Visits m and its descendants; named ones (and the root, as "") are matched against the plan. */
static void tp_walk(tp_walk_t* w, dt_module_t m, const char* path, int root) {
  if (w->st != DT_SUCCESS) return;
  const char* name = dt_module_name(m);
  char here[TP_PATH_MAX];
  if (root) {
    here[0] = '\0';
  } else if (name[0] == '\0') {
    snprintf(here, sizeof here, "%s", path);
  } else {
    int len = snprintf(here, sizeof here, "%s%s%s", path, path[0] ? "." : "", name);
    if (len < 0 || (size_t)len >= sizeof here) {
      w->st = DT_FAIL(DT_ERR_INVALID_ARG, "module path '%s.%s' is longer "
                      "than %d characters", path, name, TP_PATH_MAX - 1);
      return;
    }
  }
  if (root || name[0] != '\0') {
    for (int e = 0; e < w->n_plan; e++) {
      if (!dt_nn_name_match(w->plan[e].pattern, here)) continue;
      w->hits[e]++;
      if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 32;
        tp_target_t* t = realloc(w->t, sizeof *t * (size_t)cap);
        if (t == NULL) {
          w->st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "target list");
          return;
        }
        w->t = t;
        w->cap = cap;
      }
      w->t[w->n].m = m;
      w->t[w->n].entry = e;
      snprintf(w->t[w->n].path, sizeof w->t[w->n].path, "%s", here);
      w->n++;
      break;
    }
  }
  int nc = 0;
  w->st = dt_module_num_children(m, &nc);
  for (int i = 0; i < nc && w->st == DT_SUCCESS; i++) {
    dt_module_t c;
    w->st = dt_module_child(m, i, &c);
    if (w->st == DT_SUCCESS) tp_walk(w, c, here, 0);
  }
}

/* The placement a parameter of `ndim` dims takes on the tp dim under style kind k, or an error. */
static dt_status_t tp_param_placement(dt_tp_kind_t k, const char* mod, const char* pname,
                                      int ndim, const int64_t* shape, int tp_size,
                                      dt_placement_t* out) {
  int dim = -1;
  switch (k) {
    case DT_TP_COLWISE: dim = 0; break;
    case DT_TP_ROWWISE: dim = ndim == 2 ? 1 : -1; break;
    case DT_TP_EMBEDDING_ROWWISE: dim = 0; break;
    case DT_TP_EMBEDDING_COLWISE: dim = 1; break;
    default: break;
  }
  int embedding = k == DT_TP_EMBEDDING_ROWWISE || k == DT_TP_EMBEDDING_COLWISE;
  if ((embedding && ndim != 2) || (!embedding && ndim != 1 && ndim != 2))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s on '%s': %s has %d "
                   "dims (%s)", tp_kind_name(k), mod, pname, ndim,
                   embedding ? "an embedding table is (V, D)" : "weights are (out, in), biases 1-D");
  if (dim < 0) {
    *out = dt_replicate();
    return DT_SUCCESS;
  }
  if (shape[dim] % tp_size != 0) {
    int fit = tp_size; /* the largest tp size up to this one that divides the dim */
    while (fit > 1 && shape[dim] % fit != 0) fit--;
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s on '%s': dim %d of %s (size %lld) is not divisible "
                   "by the tp size %d (tensor parallelism shards it evenly): use a tp size that "
                   "divides %lld (at most %d here), or pad that dim to a multiple of %d",
                   tp_kind_name(k), mod, dim, pname, (long long)shape[dim], tp_size,
                   (long long)shape[dim], fit, tp_size);
  }
  *out = dt_shard(dim);
  return DT_SUCCESS;
}

/* The wrapper that owns m or a module below it ("fsdp", "ddp", "tp"), or NULL. */
static const char* tp_wrapped_below(dt_module_t m) {
  static const char* const keys[3] = {"fsdp", "ddp", TP_KEY};
  for (int k = 0; k < 3; k++)
    if (dt_module_attachment(m, keys[k])) return keys[k];
  int nc = 0;
  if (dt_module_num_children(m, &nc) != DT_SUCCESS) return NULL;
  for (int i = 0; i < nc; i++) {
    dt_module_t c;
    const char* w;
    if (dt_module_child(m, i, &c) == DT_SUCCESS && (w = tp_wrapped_below(c)) != NULL) return w;
  }
  return NULL;
}

/* Whether a is b or below it. */
static int tp_is_below(dt_module_t a, dt_module_t b) {
  for (; a; a = dt_module_parent(a))
    if (a == b) return 1;
  return 0;
}

/* "'output'" or "'tok_emb' (the parameter 'weight')": where a parameter of a styled module sits,
 * for messages. */
static void tp_where(const tp_target_t* t, const char* pname, char* buf, size_t cap) {
  const char* path = t->path[0] ? t->path : "(the wrapped module)";
  if (pname[0]) snprintf(buf, cap, "'%s' (its parameter '%s')", path, pname);
  else snprintf(buf, cap, "'%s'", path);
}

/* Checks every parameter below target t and appends it to *ps with its new placements. A
 * parameter tied to one an earlier target styled (the same variable under another module, as an
 * output projection tied to the embedding) is placed once, for every holder, when both styles
 * agree on its placement, and refused, naming both modules, when they do not. */
static dt_status_t tp_collect(const tp_target_t* tg, const dt_tp_style_t* s, dt_mesh_t mesh,
                              int tp_dim, int tp_size, const dt_tp_plan_entry_t* plan,
                              tp_param_t** ps, int* n, int* cap) {
  dt_module_t t = tg->m;
  int np = 0;
  DT_CHECK(dt_module_num_params(t, &np));
  const char* mod = tg->path[0] ? tg->path : dt_module_name(t);
  if (np == 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s on module '%s', which has no parameters (use a "
                   "prepare or sequence-parallel style for layouts only)", tp_kind_name(s->kind),
                   mod);
  for (int i = 0; i < np; i++) {
    if (*n == *cap) {
      int c = *cap ? 2 * *cap : 32;
      tp_param_t* q = realloc(*ps, sizeof *q * (size_t)c);
      if (q == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "the parameter list");
      *ps = q;
      *cap = c;
    }
    tp_param_t* q = &(*ps)[*n];
    memset(q, 0, sizeof *q);
    q->owner = t;
    q->target = tg;
    DT_CHECK(dt_module_param_at(t, i, q->name, sizeof q->name, &q->old));
    dt_tensor_t v = dt_var_value(q->old);
    dt_mesh_t pm;
    int nd;
    int64_t shape[DT_MAX_DIMS];
    char pname[sizeof q->name + 16] = "its weight"; /* a one-weight module's is unnamed */
    if (q->name[0]) snprintf(pname, sizeof pname, "parameter '%s'", q->name);
    DT_CHECK(dt_tensor_mesh(v, &pm));
    if (pm != mesh)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s of '%s' lives on another mesh", pname, mod);
    DT_CHECK(dt_tensor_ndim(v, &nd));
    DT_CHECK(dt_tensor_shape(v, shape));
    DT_CHECK(dt_tensor_placements(v, q->pl));
    if (q->pl[tp_dim].kind != DT_REPLICATE)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s of '%s' is not Replicate on the tp dim %d", pname,
                     mod, tp_dim);
    DT_CHECK(tp_param_placement(s->kind, mod, pname, nd, shape, tp_size, &q->pl[tp_dim]));
    int dup = 0;
    for (int j = 0; j < *n && !dup; j++) {
      tp_param_t* o = &(*ps)[j];
      if (o->old != q->old) continue;
      if (tp_is_below(t, o->owner) || tp_is_below(o->owner, t))
        return DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' of '%s' is styled twice (by '%s' and "
                       "by a module above or below it)", q->name, mod, o->target->path);
      /* tied: one variable held by two styled modules */
      char a[2 * TP_PATH_MAX + 32], b[2 * TP_PATH_MAX + 32];
      tp_where(o->target, o->name, a, sizeof a);
      tp_where(tg, q->name, b, sizeof b);
      if (!dt_placement_equal(o->pl[tp_dim], q->pl[tp_dim])) {
        char pa[32] = "", pb[32] = "";
        dt_placement_format(o->pl[tp_dim], pa, sizeof pa);
        dt_placement_format(q->pl[tp_dim], pb, sizeof pb);
        return DT_FAIL(DT_ERR_INVALID_ARG, "the tied parameter held by %s and by %s gets two "
                       "placements on the tp dim: %s from %s (plan entry '%s') and %s from %s "
                       "(plan entry '%s'); a tied parameter has one: give both holders styles "
                       "that agree (a tied embedding and output projection: embedding rowwise "
                       "and colwise, both Shard(0))", a, b, pa,
                       tp_kind_name(plan[o->target->entry].style.kind),
                       plan[o->target->entry].pattern, pb, tp_kind_name(s->kind),
                       plan[tg->entry].pattern);
      }
      dup = 1; /* placed once, through the first holder: every holder takes it */
    }
    if (!dup) (*n)++;
  }
  return DT_SUCCESS;
}

/* dt_parallelize_module's argument checks (local); *mesh_ok once mesh is a live handle. */
static dt_status_t tp_check_args(dt_module_t m, dt_mesh_t mesh, int tp_dim, int n,
                                 const dt_tp_plan_entry_t* plan, int* tp_size, int* mesh_ok) {
  DT_ARG_NOT_NULL(mesh);
  int nd, abstract;
  DT_CHECK(dt_mesh_ndim(mesh, &nd));
  *mesh_ok = 1;
  DT_ARG_NOT_NULL(m);
  if (n < 0 || (n > 0 && plan == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%d plan entries at %p", n,
                   (const void*)plan);
  int np;
  DT_CHECK(dt_module_num_params(m, &np)); /* checks the handle (a destroyed one: invalid usage) */
  DT_CHECK(dt_mesh_is_abstract(mesh, &abstract));
  if (abstract)
    return DT_FAIL(DT_ERR_INVALID_ARG, "an abstract mesh has no ranks");
  if (tp_dim < 0 || tp_dim >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tp dim %d outside a mesh of %d dims",
                   tp_dim, nd);
  DT_CHECK(dt_mesh_size(mesh, tp_dim, tp_size));
  for (int e = 0; e < n; e++) {
    if (plan[e].pattern == NULL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry %d has no pattern", e);
    DT_CHECK(tp_check_style(e, &plan[e].style));
  }
  for (dt_module_t a = m; a != NULL; a = dt_module_parent(a))
    if (dt_module_attachment(a, "fsdp") || dt_module_attachment(a, "ddp"))
      return DT_FAIL(DT_ERR_INVALID_USAGE, "'%s' is inside a module wrapped "
                     "by %s; apply tensor parallelism first", dt_module_name(m),
                     dt_module_attachment(a, "fsdp") ? "FSDP" : "DDP");
  const char* w = tp_wrapped_below(m);
  if (w != NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "'%s' or a module below it is "
                   "already wrapped (%s)", dt_module_name(m), w);
  return DT_SUCCESS;
}

static dt_status_t tp_parallelize(dt_module_t m, dt_mesh_t mesh, int tp_dim, int n,
                                  const dt_tp_plan_entry_t* plan) {
  int tp_size = 0, mesh_ok = 0;
  dt_status_t st = tp_check_args(m, mesh, tp_dim, n, plan, &tp_size, &mesh_ok);
  tp_walk_t walk = {plan, n, NULL, NULL, 0, 0, DT_SUCCESS};
  tp_param_t* ps = NULL;
  tp_module_t** made = NULL;
  int* made_shared = NULL;
  int nps = 0, cap_ps = 0, n_made = 0;
  if (st == DT_SUCCESS) {
    walk.hits = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    if (walk.hits == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "plan hits");
  }
  if (st == DT_SUCCESS) {
    tp_walk(&walk, m, "", 1);
    st = walk.st;
  }
  for (int e = 0; e < n && st == DT_SUCCESS; e++)
    if (walk.hits[e] == 0)
      st = DT_FAIL(DT_ERR_INVALID_ARG, "plan entry %d ('%s', %s) names no "
                   "module", e, plan[e].pattern, tp_kind_name(plan[e].style.kind));
  /* validate every parameter before changing anything */
  for (int i = 0; i < walk.n && st == DT_SUCCESS; i++) {
    const dt_tp_style_t* s = &plan[walk.t[i].entry].style;
    if (tp_has_params(s->kind))
      st = tp_collect(&walk.t[i], s, mesh, tp_dim, tp_size, plan, &ps, &nps, &cap_ps);
  }
  /* a check that failed on one rank fails them all, before anything changes (the others would
   * wait in the first forward's collective until the deadline) */
  if (mesh_ok) st = dt_mesh_agree(mesh, st, "dt_parallelize_module's checks");
  /* the sharded parameters: local slices of the replicated ones */
  for (int i = 0; i < nps && st == DT_SUCCESS; i++) {
    dt_tensor_t t = NULL;
    int rg = 1;
    st = dt_var_requires_grad(ps[i].old, &rg);
    if (st == DT_SUCCESS) st = dt_tensor_redistribute(dt_var_value(ps[i].old), ps[i].pl, &t);
    if (st == DT_SUCCESS) {
      st = dt_var_leaf(t, rg, &ps[i].made);
      if (st != DT_SUCCESS) dt_tensor_destroy(t);
    }
  }
  /* state and hooks of every styled module */
  if (st == DT_SUCCESS && walk.n > 0) {
    made = calloc((size_t)walk.n, sizeof *made);
    made_shared = calloc((size_t)walk.n, sizeof *made_shared);
    if (made == NULL || made_shared == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module state");
  }
  for (int i = 0; i < walk.n && st == DT_SUCCESS; i++) {
    tp_module_t* t = calloc(1, sizeof *t);
    if (t == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module state");
      break;
    }
    t->style = plan[walk.t[i].entry].style;
    t->tp_dim = tp_dim;
    dt_module_t tm = walk.t[i].m;
    st = dt_module_attach(tm, TP_KEY, t, tp_free);
    if (st != DT_SUCCESS) {
      free(t);
      break;
    }
    made[n_made++] = t;
    if (st == DT_SUCCESS && t->style.in_mask)
      st = dt_module_add_forward_pre_hook(tm, tp_pre_forward, t);
    if (st == DT_SUCCESS && t->style.out_mask)
      st = dt_module_add_forward_post_hook(tm, tp_post_forward, t);
    if (st == DT_SUCCESS) st = tp_async_setup(tm, t, &made_shared[i]);
  }
  if (st != DT_SUCCESS) {
    for (int i = n_made - 1; i >= 0; i--) {
      tp_async_undo(walk.t[i].m, made[i], made_shared[i]);
      dt_module_remove_hooks(walk.t[i].m, made[i]);
      dt_module_detach(walk.t[i].m, TP_KEY);
      free(made[i]);
    }
    for (int i = 0; i < nps; i++) dt_var_destroy(ps[i].made);
  } else {
    /* commit: the modules take the sharded parameters (the replicated ones are destroyed); a
     * tied parameter is replaced for every module that holds it, styled or not */
    for (int i = 0; i < nps; i++) {
      dt_status_t s2 = dt_module_set_param(ps[i].owner, ps[i].name, ps[i].made);
      if (s2 != DT_SUCCESS && st == DT_SUCCESS) st = s2;
    }
  }
  free(made);
  free(made_shared);
  free(ps);
  free(walk.t);
  free(walk.hits);
  return st;
}

dt_status_t dt_parallelize_module(dt_module_t m, dt_mesh_t mesh, int tp_dim, int n,
                                  const dt_tp_plan_entry_t* plan) {
  DT_ENTRY_RETURN(tp_parallelize(m, mesh, tp_dim, n, plan));
}

/* ---- the Llama plan ------------------------------------------------------------------------- */

static dt_status_t dt__tp_plan_llama(const dt_llama_config_t* cfg, int sequence_parallel,
                                     int loss_parallel, dt_tp_plan_entry_t* out, int cap, int* n) {
  DT_ARG_NOT_NULL(cfg);
  DT_ARG_NOT_NULL(out);
  DT_ARG_NOT_NULL(n);
  *n = 0;
  if (sequence_parallel < 0 || sequence_parallel > DT_TP_SP_ASYNC)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tp_plan_llama: sequence_parallel %d (0: none, 1: "
                   "sequence parallel, %d: with asynchronous TP)", sequence_parallel,
                   DT_TP_SP_ASYNC);
  const int async = sequence_parallel == DT_TP_SP_ASYNC;
  dt_tp_plan_entry_t e[16];
  int k = 0;
  /* the stream between blocks: replicated, or sequence shards */
  dt_tp_style_t norm = sequence_parallel ? dt_tp_sequence_parallel(1) : dt_tp_prepare();
  norm.out_mask = 1;
  norm.out[0] = dt_replicate(); /* the gathered input of the attention / MLP / output */
  /* asynchronous: the blocks' norms hand the colwise linears sequence shards (they gather). A
   * mixture of experts takes its tokens split over tp in every mode (a sequence shard: each tp
   * rank routes and computes its own, with no communication; replicated, every tp rank would
   * run every expert on every token) */
  dt_tp_style_t bnorm = norm, fnorm = norm;
  if (async) bnorm.out[0] = dt_shard(1);
  if (async || cfg->n_experts > 0) fnorm.out[0] = dt_shard(1);
  dt_tp_style_t row = dt_tp_rowwise(), emb = dt_tp_embedding_rowwise(), col = dt_tp_colwise();
  if (sequence_parallel) row.out[0] = emb.out[0] = dt_shard(1);
  row.async_tp = col.async_tp = async;
  dt_tp_style_t out_proj = dt_tp_colwise();
  if (!loss_parallel) {
    out_proj.out_mask = 1;
    out_proj.out[0] = dt_replicate();
  }
  e[k++] = (dt_tp_plan_entry_t){"tok_emb", emb};
  e[k++] = (dt_tp_plan_entry_t){"layers.*.attn_norm", bnorm};
  e[k++] = (dt_tp_plan_entry_t){"layers.*.wq", col};
  e[k++] = (dt_tp_plan_entry_t){"layers.*.wk", col};
  e[k++] = (dt_tp_plan_entry_t){"layers.*.wv", col};
  e[k++] = (dt_tp_plan_entry_t){"layers.*.wo", row};
  e[k++] = (dt_tp_plan_entry_t){"layers.*.ffn_norm", fnorm};
  if (cfg->n_experts == 0) {
    e[k++] = (dt_tp_plan_entry_t){"layers.*.w1", col};
    e[k++] = (dt_tp_plan_entry_t){"layers.*.w3", col};
    e[k++] = (dt_tp_plan_entry_t){"layers.*.w2", row};
  }
  e[k++] = (dt_tp_plan_entry_t){"norm", norm};
  e[k++] = (dt_tp_plan_entry_t){"output", out_proj};
  if (cap < k)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tp_plan_llama: the plan has %d entries, room for %d", k,
                   cap);
  memcpy(out, e, sizeof(dt_tp_plan_entry_t) * (size_t)k);
  *n = k;
  return DT_SUCCESS;
}

dt_status_t dt_tp_plan_llama(const dt_llama_config_t* cfg, int sequence_parallel, int loss_parallel,
                             dt_tp_plan_entry_t* out, int cap, int* n) {
  DT_ENTRY_RETURN(dt__tp_plan_llama(cfg, sequence_parallel, loss_parallel, out, cap, n));
}

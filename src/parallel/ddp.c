/* ddp.c - data parallelism (DDP): parameters stay replicated on the data dims, gradients are kept
 * as the backward pass produces them (Partial) and all-reduced in buckets. Public API only.
 *
 * Wrapping (dt_data_parallel) validates every parameter before changing anything, then:
 *  - groups the parameters that require a gradient into buckets: reverse registration order
 *    (gradients arrive roughly backwards), greedily up to bucket_nbytes, one dtype per bucket;
 *    each bucket has one flat 1-D send buffer (Partial(sum) on the data dims, Replicate elsewhere;
 *    its length is the bucket's local elements), allocated once and tagged communication;
 *  - puts every parameter in DT_GRAD_AS_IS mode with a gradient hook, and adds a backward pre-hook
 *    (a new pass: resets the per-pass state) and a backward post-hook (finishes the buckets) to
 *    the module.
 * During a backward pass with sync on: when the last gradient of a bucket arrives, the bucket's
 * gradients (brought to Partial(sum) on the data dims first when they are not) are copied into
 * its buffer and one asynchronous all-reduce (redistribution to Replicate) starts. When the
 * module's backward is done, buckets that got some but not all of their gradients are started
 * too (missing gradients count as zeros: every rank has the same graph, so every rank runs the
 * same collectives in the same order), every work is waited for in start order, and each
 * parameter's slice of the reduced bucket becomes its new (replicated) gradient: a view, no copy
 * (the gradients keep the bucket's output alive until they are dropped). With sync off nothing happens: the
 * gradients accumulate as Partial until a pass with sync on.
 *
 * The module hooks find the state through the module's "ddp" attachment and a serial number (a
 * wrap that fails half way removes the hooks it added).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/check.h"
#include "dtensor/parallel.h"

#define DT__DDP_KEY "ddp"
#define DT__DDP_DEFAULT_BUCKET_NBYTES ((int64_t)25 << 20)

typedef struct dt__ddp dt__ddp_t;

typedef struct {
  dt__ddp_t* ddp;
  dt_var_t v;
  int bucket;
  int64_t offset; /* elements into the bucket's buffer */
  int64_t numel;  /* local elements */
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  dt_placement_t pl[DT_MAX_MESH_DIMS];      /* the parameter's */
  dt_placement_t grad_pl[DT_MAX_MESH_DIMS]; /* Partial(sum) on the data dims, pl elsewhere */
  int ready;                                /* its gradient of this pass arrived */
  int sent;                                 /* it went into the buffer (else zeros) */
} dt__ddp_param_t;

typedef struct {
  dt_dtype_t dtype;
  size_t itemsize;
  int first, n;  /* params[first, first + n) */
  int64_t numel; /* local elements */
  int n_ready;
  int started;
  dt_tensor_t flat; /* send buffer */
  dt_tensor_t out;  /* the all-reduce's result while it is in flight */
  dt_work_t work;
} dt__ddp_bucket_t;

struct dt__ddp {
  uintptr_t serial;
  dt_mesh_t mesh;
  int mesh_ndim;
  int sync;
  int in_pass; /* between the module's backward pre- and post-hook */
  int n_params, n_buckets, n_started;
  dt__ddp_param_t* params;
  dt__ddp_bucket_t* buckets;
  int* order; /* buckets in the order they started this pass */
  dt_placement_t rep[DT_MAX_MESH_DIMS];
};

static uintptr_t dt__ddp_serial;

/* ---------------------------------------------------------------------------------------------
 * the backward pass */

/* Brings g to p->grad_pl when it is not there (a new tensor in *out, else *out = g). A data dim
 * holding a Shard (or a Partial other than sum) goes through Replicate: a new Partial cannot come
 * from a Shard. */
static dt_status_t dt__ddp_to_partial(dt__ddp_t* d, dt__ddp_param_t* p, dt_tensor_t g,
                                      dt_tensor_t* out) {
  *out = g;
  dt_placement_t pl[DT_MAX_MESH_DIMS], mid[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_tensor_placements(g, pl));
  int same = 1, via = 0;
  for (int i = 0; i < d->mesh_ndim; i++) {
    same &= dt_placement_equal(pl[i], p->grad_pl[i]);
    mid[i] = pl[i];
    if (p->grad_pl[i].kind == DT_PARTIAL && !dt_placement_equal(pl[i], p->grad_pl[i]) &&
        pl[i].kind != DT_REPLICATE) {
      mid[i] = dt_replicate();
      via = 1;
    }
  }
  if (same) return DT_SUCCESS;
  dt_tensor_t a = NULL;
  if (via) DT_CHECK(dt_tensor_redistribute(g, mid, &a));
  dt_status_t st = dt_tensor_redistribute(a ? a : g, p->grad_pl, out);
  dt_tensor_destroy(a);
  if (st != DT_SUCCESS) *out = g;
  return st;
}

/* Copies the bucket's gradients into its buffer and starts the all-reduce. */
static dt_status_t dt__ddp_start(dt__ddp_t* d, int bi) {
  dt__ddp_bucket_t* b = &d->buckets[bi];
  for (int k = 0; k < b->n; k++) {
    dt__ddp_param_t* p = &d->params[b->first + k];
    dt_tensor_t g = dt_var_grad(p->v);
    p->sent = 0;
    if (g == NULL) { /* no gradient on any rank (same graph): a zero slice */
      DT_CHECK(dt_tensor_fill_local(b->flat, 1, &p->offset, &p->numel, 0.0));
      continue;
    }
    dt_dtype_t gt;
    DT_CHECK(dt_tensor_dtype(g, &gt));
    if (gt != b->dtype)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "DDP: a gradient of dtype %s for a parameter of dtype %s",
                     dt_dtype_name(gt), dt_dtype_name(b->dtype));
    dt_tensor_t gp;
    DT_CHECK(dt__ddp_to_partial(d, p, g, &gp));
    int64_t n = 0;
    const int64_t zero = 0;
    dt_status_t st = dt_tensor_local_numel(gp, &n);
    if (st == DT_SUCCESS && n != p->numel)
      st = DT_FAIL(DT_ERR_INTERNAL, "DDP: gradient shard of %lld elements for a parameter shard "
                   "of %lld", (long long)n, (long long)p->numel);
    if (st == DT_SUCCESS) st = dt_tensor_copy_local(b->flat, gp, 1, &p->offset, &zero, &p->numel);
    if (gp != g) dt_tensor_destroy(gp);
    DT_CHECK(st);
    p->sent = 1;
  }
  DT_CHECK(dt_tensor_redistribute_async(b->flat, d->rep, &b->out, &b->work));
  b->started = 1;
  d->order[d->n_started++] = bi;
  return dt_tensor_set_memory_category(b->out, DT_MEM_COMMUNICATION);
}

/* Waits for bucket bi and hands each parameter its slice (a view) as its new gradient. */
static dt_status_t dt__ddp_unpack(dt__ddp_t* d, int bi) {
  dt__ddp_bucket_t* b = &d->buckets[bi];
  DT_CHECK(dt_work_wait(b->work));
  DT_CHECK(dt_tensor_set_memory_category(b->out, DT_MEM_GRADIENTS));
  for (int k = 0; k < b->n; k++) {
    dt__ddp_param_t* p = &d->params[b->first + k];
    if (!p->sent) continue;
    dt_tensor_t g; /* a view of the reduced bucket: no copy (the views keep it alive) */
    DT_CHECK(dt_tensor_view_local(b->out, p->offset, p->ndim, p->shape, p->pl, &g));
    int64_t n = 0;
    dt_status_t st = dt_tensor_local_numel(g, &n);
    if (st == DT_SUCCESS && n != p->numel)
      st = DT_FAIL(DT_ERR_INTERNAL, "DDP: a gradient shard of %lld elements, %lld expected",
                   (long long)n, (long long)p->numel);
    if (st == DT_SUCCESS) st = dt_var_set_grad(p->v, g);
    if (st != DT_SUCCESS) {
      dt_tensor_destroy(g);
      return st;
    }
  }
  return DT_SUCCESS;
}

/* Completes and frees every work in flight (start order) and resets the per-pass state. */
static void dt__ddp_reset(dt__ddp_t* d) {
  for (int k = 0; k < d->n_started; k++) {
    dt__ddp_bucket_t* b = &d->buckets[d->order[k]];
    dt_work_destroy(b->work);
    dt_tensor_destroy(b->out);
    b->work = NULL;
    b->out = NULL;
  }
  d->n_started = 0;
  for (int i = 0; i < d->n_buckets; i++) {
    d->buckets[i].n_ready = 0;
    d->buckets[i].started = 0;
  }
  for (int i = 0; i < d->n_params; i++) d->params[i].ready = d->params[i].sent = 0;
}

static dt_status_t dt__ddp_grad_hook(dt_var_t v, void* ctx) {
  (void)v;
  dt__ddp_param_t* p = ctx;
  dt__ddp_t* d = p->ddp;
  if (!d->sync || !d->in_pass || p->ready) return DT_SUCCESS;
  p->ready = 1;
  dt__ddp_bucket_t* b = &d->buckets[p->bucket];
  if (++b->n_ready == b->n && !b->started) return dt__ddp_start(d, p->bucket);
  return DT_SUCCESS;
}

static dt__ddp_t* dt__ddp_of(dt_module_t m, void* ctx) {
  dt__ddp_t* d = dt_module_attachment(m, DT__DDP_KEY);
  return d != NULL && d->serial == (uintptr_t)ctx ? d : NULL;
}

static dt_status_t dt__ddp_backward_pre(dt_module_t m, dt_tape_t tape, void* ctx) {
  (void)tape;
  dt__ddp_t* d = dt__ddp_of(m, ctx);
  if (d == NULL) return DT_SUCCESS;
  dt__ddp_reset(d); /* works left by a pass that failed */
  d->in_pass = 1;
  return DT_SUCCESS;
}

static dt_status_t dt__ddp_backward_post(dt_module_t m, dt_tape_t tape, void* ctx) {
  (void)tape;
  dt__ddp_t* d = dt__ddp_of(m, ctx);
  if (d == NULL || !d->in_pass) return DT_SUCCESS;
  d->in_pass = 0;
  dt_status_t st = DT_SUCCESS;
  if (d->sync) {
    for (int i = 0; i < d->n_buckets && st == DT_SUCCESS; i++)
      if (!d->buckets[i].started && d->buckets[i].n_ready > 0) st = dt__ddp_start(d, i);
    for (int k = 0; k < d->n_started && st == DT_SUCCESS; k++) st = dt__ddp_unpack(d, d->order[k]);
  }
  dt__ddp_reset(d);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * state */

static void dt__ddp_free(dt__ddp_t* d) {
  if (d == NULL) return;
  if (d->buckets) {
    dt__ddp_reset(d);
    for (int i = 0; i < d->n_buckets; i++) dt_tensor_destroy(d->buckets[i].flat);
  }
  free(d->params);
  free(d->buckets);
  free(d->order);
  free(d);
}

/* The attachment's free function: the module is being destroyed (its parameters right after). */
static void dt__ddp_detach_free(dt_module_t m, void* data) {
  (void)m;
  dt__ddp_t* d = data;
  for (int i = 0; i < d->n_params; i++) {
    int rg;
    if (dt_var_requires_grad(d->params[i].v, &rg) == DT_SUCCESS)
      dt_var_set_grad_hook(d->params[i].v, NULL, NULL);
  }
  dt__ddp_free(d);
}

/* ---------------------------------------------------------------------------------------------
 * wrapping */

typedef struct {
  dt_module_t m; /* the module being wrapped */
  dt_mesh_t mesh;
  int mesh_ndim, mesh_dim;
  dt_status_t st;
  dt_var_t* vars; /* the parameters that require a gradient, registration order, no repeats */
  int n, cap;
} dt__ddp_scan_t;

static int dt__ddp_visit(const char* name, dt_var_t v, void* ctx) {
  dt__ddp_scan_t* s = ctx;
  dt_tensor_t x = dt_var_value(v);
  if (x == NULL) {
    s->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is not a live variable", name);
    return 1;
  }
  dt_mesh_t pm;
  dt_dtype_t dt;
  int meta, rg;
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  s->st = dt_tensor_mesh(x, &pm);
  if (s->st == DT_SUCCESS) s->st = dt_tensor_dtype(x, &dt);
  if (s->st == DT_SUCCESS) s->st = dt_tensor_is_meta(x, &meta);
  if (s->st == DT_SUCCESS) s->st = dt_var_requires_grad(v, &rg);
  if (s->st != DT_SUCCESS) return 1;
  if (pm != s->mesh) {
    s->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' lives on another mesh than the one "
                    "given", name);
    return 1;
  }
  if (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16) {
    s->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is %s; f32, bf16 or f16 expected",
                    name, dt_dtype_name(dt));
    return 1;
  }
  if (meta) {
    s->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' holds no data (a meta tensor)", name);
    return 1;
  }
  if ((s->st = dt_tensor_placements(x, pl)) != DT_SUCCESS) return 1;
  for (int i = 0; i < s->mesh_ndim; i++) {
    if ((s->mesh_dim >= 0 && i != s->mesh_dim) || pl[i].kind == DT_REPLICATE) continue;
    char buf[32] = "";
    dt_placement_format(pl[i], buf, sizeof buf);
    s->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is %s on mesh dim %d, a data dim; "
                    "it must be Replicate there", name, buf, i);
    return 1;
  }
  if (!rg) return 0; /* frozen: never has a gradient to reduce */
  for (int i = 0; i < s->n; i++)
    if (s->vars[i] == v) return 0; /* registered twice: one gradient */
  /* tied (listed once): every use must be inside m, or its gradient would be reduced before the
   * uses outside m have added theirs */
  int holders = 0, here = 0;
  s->st = dt_module_param_holders(v, &holders);
  if (s->st == DT_SUCCESS && holders > 1)
    s->st = dt_module_param_names(s->m, v, 0, NULL, 0, &here);
  if (s->st != DT_SUCCESS) return 1;
  if (holders > 1 && here < holders) {
    s->st = DT_FAIL(DT_ERR_INVALID_ARG, "the parameter %s%s%s is tied to %d holder%s outside "
                    "module '%s' (it has %d in all): its gradient would be reduced before every "
                    "use has added to it; wrap a module that holds every use", name[0] ? "'" : "",
                    name[0] ? name : "(unnamed)", name[0] ? "'" : "", holders - here,
                    holders - here == 1 ? "" : "s", dt_module_name(s->m), holders);
    return 1;
  }
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 32;
    dt_var_t* p = realloc(s->vars, sizeof(dt_var_t) * (size_t)cap);
    if (p == NULL) {
      s->st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "parameter list");
      return 1;
    }
    s->vars = p;
    s->cap = cap;
  }
  s->vars[s->n++] = v;
  return 0;
}

/* Whether m or a module below it is wrapped already (its key). */
static const char* dt__ddp_wrapped_below(dt_module_t m) {
  if (dt_module_attachment(m, "ddp")) return "ddp";
  if (dt_module_attachment(m, "fsdp")) return "fsdp";
  int n = 0;
  if (dt_module_num_children(m, &n) != DT_SUCCESS) return NULL;
  for (int i = 0; i < n; i++) {
    dt_module_t c;
    if (dt_module_child(m, i, &c) != DT_SUCCESS) continue;
    const char* k = dt__ddp_wrapped_below(c);
    if (k) return k;
  }
  return NULL;
}

/* Builds the state (buckets, buffers) for the parameters in s; changes nothing outside it. */
static dt_status_t dt__ddp_build(const dt__ddp_scan_t* s, int64_t cap_nbytes, dt__ddp_t** out) {
  *out = NULL;
  dt_status_t st = DT_SUCCESS;
  dt__ddp_t* d = calloc(1, sizeof *d);
  if (d == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "DDP state");
  d->mesh = s->mesh;
  d->mesh_ndim = s->mesh_ndim;
  d->sync = 1;
  d->params = calloc((size_t)s->n, sizeof *d->params);
  d->buckets = calloc((size_t)s->n, sizeof *d->buckets); /* at most one per parameter */
  d->order = calloc((size_t)s->n, sizeof *d->order);
  if (d->params == NULL || d->buckets == NULL || d->order == NULL) {
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "DDP state for %d parameters", s->n);
    goto fail;
  }
  d->n_params = s->n; /* once the arrays exist: dt__ddp_free walks them */
  dt_placement_t flat_pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < s->mesh_ndim; i++) {
    int data = s->mesh_dim < 0 || i == s->mesh_dim;
    d->rep[i] = dt_replicate();
    flat_pl[i] = data ? dt_partial(DT_REDUCE_SUM) : dt_replicate();
  }
  int64_t bucket_nbytes = 0;
  for (int k = 0; k < s->n; k++) { /* reverse registration order */
    dt__ddp_param_t* p = &d->params[k];
    p->ddp = d;
    p->v = s->vars[s->n - 1 - k];
    dt_tensor_t x = dt_var_value(p->v);
    dt_dtype_t dt;
    size_t item;
    DT_CHECK_GOTO(dt_tensor_dtype(x, &dt), st, fail);
    DT_CHECK_GOTO(dt_dtype_itemsize(dt, &item), st, fail);
    DT_CHECK_GOTO(dt_tensor_ndim(x, &p->ndim), st, fail);
    DT_CHECK_GOTO(dt_tensor_shape(x, p->shape), st, fail);
    DT_CHECK_GOTO(dt_tensor_placements(x, p->pl), st, fail);
    DT_CHECK_GOTO(dt_tensor_local_numel(x, &p->numel), st, fail);
    for (int i = 0; i < s->mesh_ndim; i++)
      p->grad_pl[i] = flat_pl[i].kind == DT_PARTIAL ? flat_pl[i] : p->pl[i];
    int64_t nbytes = p->numel * (int64_t)item;
    dt__ddp_bucket_t* b = d->n_buckets ? &d->buckets[d->n_buckets - 1] : NULL;
    if (b == NULL || b->dtype != dt || (bucket_nbytes > 0 && bucket_nbytes + nbytes > cap_nbytes)) {
      b = &d->buckets[d->n_buckets++];
      b->dtype = dt;
      b->itemsize = item;
      b->first = k;
      bucket_nbytes = 0;
    }
    p->bucket = d->n_buckets - 1;
    p->offset = b->numel;
    b->numel += p->numel;
    b->n++;
    bucket_nbytes += nbytes;
  }
  for (int i = 0; i < d->n_buckets; i++) {
    dt__ddp_bucket_t* b = &d->buckets[i];
    DT_CHECK_GOTO(dt_tensor_empty(d->mesh, b->dtype, 1, &b->numel, flat_pl, &b->flat), st, fail);
    DT_CHECK_GOTO(dt_tensor_set_memory_category(b->flat, DT_MEM_COMMUNICATION), st, fail);
  }
  *out = d;
  return DT_SUCCESS;
fail:
  dt__ddp_free(d);
  return st;
}

/* dt_data_parallel's local part: the checks and the buckets (no communication), in *out.
 * *mesh_ok once mesh is a live handle: the ranks agree on the outcome over it. */
static dt_status_t dt__ddp_plan(dt_module_t m, dt_mesh_t mesh, const dt_ddp_config_t* cfg,
                                dt__ddp_t** out, int* mesh_ok) {
  DT_ARG_NOT_NULL(mesh);
  int n_all, nd, abstract;
  DT_CHECK(dt_mesh_ndim(mesh, &nd));
  *mesh_ok = 1;
  DT_ARG_NOT_NULL(m);
  DT_CHECK(dt_module_num_params(m, &n_all)); /* checks the handle */
  DT_CHECK(dt_mesh_is_abstract(mesh, &abstract));
  if (abstract)
    return DT_FAIL(DT_ERR_INVALID_ARG, "an abstract mesh cannot move gradients");
  const char* key = dt__ddp_wrapped_below(m);
  for (dt_module_t a = dt_module_parent(m); a != NULL && key == NULL; a = dt_module_parent(a))
    key = dt_module_attachment(a, "ddp") ? "ddp" : dt_module_attachment(a, "fsdp") ? "fsdp" : NULL;
  if (key)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s', a module inside it or around it is "
                   "wrapped already (%s)", dt_module_name(m), key);
  int mesh_dim = cfg ? cfg->mesh_dim : -1;
  int64_t cap = cfg && cfg->bucket_nbytes > 0 ? cfg->bucket_nbytes : DT__DDP_DEFAULT_BUCKET_NBYTES;
  if (mesh_dim < -1 || mesh_dim >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mesh_dim %d outside a %d-dim mesh (0 to %d, or -1 "
                   "for every dim)", mesh_dim, nd, nd - 1);

  dt__ddp_scan_t s = {m, mesh, nd, mesh_dim, DT_SUCCESS, NULL, 0, 0};
  dt_status_t st = dt_module_for_each_param(m, dt__ddp_visit, &s); /* (may stop part-way) */
  if (st == DT_SUCCESS) st = s.st;
  if (st == DT_SUCCESS && s.n == 0)
    st = DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s' has no parameter that requires a "
                 "gradient (%d parameters)", dt_module_name(m), n_all);
  if (st == DT_SUCCESS) st = dt__ddp_build(&s, cap, out);
  free(s.vars);
  return st;
}

static dt_status_t dt__data_parallel(dt_module_t m, dt_mesh_t mesh, const dt_ddp_config_t* cfg) {
  dt__ddp_t* d = NULL;
  int mesh_ok = 0;
  dt_status_t st = dt__ddp_plan(m, mesh, cfg, &d, &mesh_ok);
  /* a check that failed on one rank fails them all (the others would wait in the first
   * gradient all-reduce until the deadline) */
  if (mesh_ok) st = dt_mesh_agree(mesh, st, "dt_data_parallel's checks");
  if (st != DT_SUCCESS) {
    dt__ddp_free(d);
    return st;
  }

  /* Changes start here; a failure below removes the module hooks again (dt_module_remove_hooks). */
  d->serial = ++dt__ddp_serial;
  void* tag = (void*)d->serial;
  DT_CHECK_GOTO(dt_module_add_backward_pre_hook(m, dt__ddp_backward_pre, tag), st, fail);
  DT_CHECK_GOTO(dt_module_add_backward_post_hook(m, dt__ddp_backward_post, tag), st, fail);
  DT_CHECK_GOTO(dt_module_attach(m, DT__DDP_KEY, d, dt__ddp_detach_free), st, fail);
  for (int i = 0; i < d->n_params; i++) {
    dt__ddp_param_t* p = &d->params[i];
    st = dt_var_set_grad_mode(p->v, DT_GRAD_AS_IS);
    if (st == DT_SUCCESS) st = dt_var_set_grad_hook(p->v, dt__ddp_grad_hook, p);
    if (st != DT_SUCCESS) {
      for (int k = 0; k <= i; k++) {
        dt_var_set_grad_hook(d->params[k].v, NULL, NULL);
        dt_var_set_grad_mode(d->params[k].v, DT_GRAD_TO_PLACEMENTS);
      }
      dt_module_detach(m, DT__DDP_KEY);
      goto fail;
    }
  }
  return DT_SUCCESS;
fail:
  dt_module_remove_hooks(m, tag);
  dt__ddp_free(d);
  return st;
}

dt_status_t dt_data_parallel(dt_module_t m, dt_mesh_t mesh, const dt_ddp_config_t* cfg) {
  DT_ENTRY_RETURN(dt__data_parallel(m, mesh, cfg));
}

/* The DDP state of m itself. */
static dt_status_t dt__ddp_get(dt_module_t m, dt__ddp_t** out) {
  *out = NULL;
  DT_ARG_NOT_NULL(m);
  int n;
  DT_CHECK(dt_module_num_params(m, &n)); /* checks the handle */
  *out = dt_module_attachment(m, DT__DDP_KEY);
  if (*out == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' is not wrapped by dt_data_parallel",
                   dt_module_name(m));
  return DT_SUCCESS;
}

static dt_status_t dt__ddp_set_requires_gradient_sync(dt_module_t m, int sync) {
  dt__ddp_t* d;
  DT_CHECK(dt__ddp_get(m, &d));
  d->sync = sync != 0;
  return DT_SUCCESS;
}

dt_status_t dt_ddp_set_requires_gradient_sync(dt_module_t m, int sync) {
  DT_ENTRY_RETURN(dt__ddp_set_requires_gradient_sync(m, sync));
}

static dt_status_t dt__ddp_num_buckets(dt_module_t m, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  dt__ddp_t* d;
  DT_CHECK(dt__ddp_get(m, &d));
  *n = d->n_buckets;
  return DT_SUCCESS;
}

dt_status_t dt_ddp_num_buckets(dt_module_t m, int* n) {
  DT_ENTRY_RETURN(dt__ddp_num_buckets(m, n));
}

static dt_status_t dt__ddp_bucket_info(dt_module_t m, int i, int* n_params, int64_t* nbytes) {
  if (n_params) *n_params = 0;
  if (nbytes) *nbytes = 0;
  dt__ddp_t* d;
  DT_CHECK(dt__ddp_get(m, &d));
  if (i < 0 || i >= d->n_buckets)
    return DT_FAIL(DT_ERR_INVALID_ARG, "DDP: bucket %d of %d (0 to %d)", i, d->n_buckets,
                   d->n_buckets - 1);
  if (n_params) *n_params = d->buckets[i].n;
  if (nbytes) *nbytes = d->buckets[i].numel * (int64_t)d->buckets[i].itemsize;
  return DT_SUCCESS;
}

dt_status_t dt_ddp_bucket_info(dt_module_t m, int i, int* n_params, int64_t* nbytes) {
  DT_ENTRY_RETURN(dt__ddp_bucket_info(m, i, n_params, nbytes));
}

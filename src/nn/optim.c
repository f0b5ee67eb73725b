/* optim.c - AdamW (fp32 master weights, optional bf16 moments), gradient-norm clipping with one
 * all-reduce (two for norms whose sum of squares leaves f32's range), and the warmup + cosine
 * learning-rate schedule. Built on the public API only: the update is the adamw op, the norm's
 * local sums the sumsq op and the scaling the scale_ op, so any backend runs them and tensor
 * memory is read only through dt_tensor_read_local (the norm's scalar, all-reduced as a host
 * value). The moments and step counts are tensors (dt_adamw_state), which a checkpoint can save
 * and restore. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/check.h"
#include "dtensor/dtensor.h"
#include "dtensor/handle.h"
#include "dtensor/nn.h"

struct dt_adamw {
  dt_adamw_config_t cfg;
  int n;
  dt_var_t* params;
  /* per parameter, as variables (so that the tensors lent by dt_adamw_state cannot be
   * destroyed by the caller): first and second moments (its mesh and placements), and the step
   * count (0-d i64, Replicate) */
  dt_var_t* m;
  dt_var_t* v;
  dt_var_t* step;
};

static const dt_handle_kind_t dt__adamw_kind = {"optimizer"};

static dt_status_t dt__adamw_check(dt_adamw_t o) {
  return dt_handle_check(o, &dt__adamw_kind, "optimizer");
}

/* A zero tensor held by a new variable. */
static dt_status_t dt__state_var(dt_mesh_t mesh, dt_dtype_t dt, int nd, const int64_t* shape,
                                 const dt_placement_t* pl, dt_var_t* out) {
  dt_tensor_t t;
  DT_CHECK(dt_tensor_zeros(mesh, dt, nd, shape, pl, &t));
  dt_status_t st = dt_tensor_set_memory_category(t, DT_MEM_OPTIMIZER);
  if (st == DT_SUCCESS) st = dt_var_leaf(t, 0, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(t);
  return st;
}

dt_adamw_config_t dt_adamw_config_default(void) {
  dt_adamw_config_t c = {1e-3, 0.9, 0.999, 1e-8, 0.01, 0}; /* torch.optim.AdamW */
  return c;
}

static dt_status_t dt__adamw_create(const dt_adamw_config_t* cfg, int n, dt_var_t* params,
                                   dt_adamw_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(cfg);
  /* one message per broken field: the value and what is valid (dt_adamw_config_default) */
  if (n < 0 || (n > 0 && params == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d with params %s: n must be >= 0 "
                   "and params must hold n variables when n > 0", n, params ? "set" : "NULL");
  if (!(isfinite(cfg->lr) && cfg->lr >= 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cfg->lr=%g must be finite and >= 0 "
                   "(default 1e-3)", cfg->lr);
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cfg->beta1=%g out of range [0, 1) "
                   "(default 0.9)", cfg->beta1);
  if (!(cfg->beta2 >= 0 && cfg->beta2 < 1))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cfg->beta2=%g out of range [0, 1) "
                   "(default 0.999)", cfg->beta2);
  if (!(isfinite(cfg->eps) && cfg->eps > 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cfg->eps=%g must be finite and > 0 "
                   "(default 1e-8)", cfg->eps);
  if (!(isfinite(cfg->weight_decay) && cfg->weight_decay >= 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cfg->weight_decay=%g must be finite "
                   "and >= 0 (default 0.01)", cfg->weight_decay);
  for (int i = 0; i < n; i++) {
    int rg;
    dt_status_t st = dt_var_requires_grad(params[i], &rg);
    if (st != DT_SUCCESS) return DT_FAIL(st, "parameter %d: %s", i, dt_last_error());
  }
  /* one state per parameter: a tied parameter (one variable under two names) is listed once by
   * dt_module_params; listed twice it would be stepped twice */
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (params[j] == params[i])
        return DT_FAIL(DT_ERR_INVALID_ARG, "parameters %d and %d are the same variable (a tied "
                       "parameter is one parameter: list it once, as dt_module_params does)", j,
                       i);
  dt_adamw_t o = calloc(1, sizeof *o);
  if (o == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "adamw");
  if (dt_handle_register(o, &dt__adamw_kind) != DT_SUCCESS) {
    free(o);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "registering the handle");
  }
  o->cfg = *cfg;
  o->n = n;
  size_t k = (size_t)(n ? n : 1);
  o->params = calloc(k, sizeof(dt_var_t));
  o->m = calloc(k, sizeof(dt_var_t));
  o->v = calloc(k, sizeof(dt_var_t));
  o->step = calloc(k, sizeof(dt_var_t));
  if (!o->params || !o->m || !o->v || !o->step) {
    dt_adamw_destroy(o);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "adamw");
  }
  dt_dtype_t mdt = cfg->bf16_moments ? DT_BF16 : DT_F32;
  for (int i = 0; i < n; i++) {
    o->params[i] = params[i];
    dt_tensor_t t = params[i] ? dt_var_value(params[i]) : NULL;
    dt_status_t st = t ? DT_SUCCESS : DT_FAIL(DT_ERR_INVALID_ARG, "parameter %d", i);
    int nd = 0, mnd = 0;
    int64_t shape[DT_MAX_DIMS];
    dt_placement_t pl[DT_MAX_MESH_DIMS], rep[DT_MAX_MESH_DIMS];
    dt_mesh_t mesh = NULL;
    if (st == DT_SUCCESS) st = dt_tensor_ndim(t, &nd);
    if (st == DT_SUCCESS) st = dt_tensor_shape(t, shape);
    if (st == DT_SUCCESS) st = dt_tensor_placements(t, pl);
    if (st == DT_SUCCESS) st = dt_tensor_mesh(t, &mesh);
    if (st == DT_SUCCESS) st = dt_mesh_ndim(mesh, &mnd);
    for (int d = 0; d < mnd; d++) rep[d] = dt_replicate();
    if (st == DT_SUCCESS) st = dt__state_var(mesh, mdt, nd, shape, pl, &o->m[i]);
    if (st == DT_SUCCESS) st = dt__state_var(mesh, mdt, nd, shape, pl, &o->v[i]);
    if (st == DT_SUCCESS) st = dt__state_var(mesh, DT_I64, 0, NULL, rep, &o->step[i]);
    if (st != DT_SUCCESS) {
      dt_adamw_destroy(o);
      return st;
    }
  }
  *out = o;
  return DT_SUCCESS;
}

dt_status_t dt_adamw_create(const dt_adamw_config_t* cfg, int n, dt_var_t* params,
                            dt_adamw_t* out) {
  DT_ENTRY_RETURN(dt__adamw_create(cfg, n, params, out));
}

static dt_status_t dt__adamw_step(dt_adamw_t o, double lr) {
  DT_CHECK(dt__adamw_check(o));
  if (lr == DT_ADAMW_LR_CONFIG) lr = o->cfg.lr;
  if (!isfinite(lr) || lr < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: learning rate %g must be finite and >= 0 (or "
                   "DT_ADAMW_LR_CONFIG: the configured one)", lr);
  for (int i = 0; i < o->n; i++) { /* every parameter still alive before any changes */
    int rg;
    dt_status_t st = dt_var_requires_grad(o->params[i], &rg);
    if (st != DT_SUCCESS)
      return DT_FAIL(st, "adamw: parameter %d: %s%s", i, dt_last_error(),
                     st == DT_ERR_INVALID_USAGE
                         ? " (wrapping a module, dt_fully_shard or dt_parallelize_module, replaces "
                           "its parameters: create the optimizer after wrapping, from "
                           "dt_module_params)"
                         : "");
  }
  for (int i = 0; i < o->n; i++) {
    dt_tensor_t g = dt_var_grad(o->params[i]), w = dt_var_value(o->params[i]);
    if (g == NULL) continue;
    if (w == NULL)
      return DT_FAIL(DT_ERR_INVALID_USAGE, "adamw: parameter %d has a gradient and no value", i);
    int nd;
    DT_CHECK(dt_tensor_ndim(w, &nd));
    double fargs[5] = {lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps,
                       nd >= 2 ? o->cfg.weight_decay : 0.0};
    dt_tensor_t in[5] = {w, g, dt_var_value(o->m[i]), dt_var_value(o->v[i]),
                         dt_var_value(o->step[i])};
    dt_status_t st = dt_op_run_multi("adamw", 5, in, 0, NULL, 5, fargs, 0, NULL);
    if (st != DT_SUCCESS) return DT_FAIL(st, "adamw: parameter %d: %s", i, dt_last_error());
  }
  return DT_SUCCESS;
}

dt_status_t dt_adamw_step(dt_adamw_t o, double lr) { DT_ENTRY_RETURN(dt__adamw_step(o, lr)); }

static dt_status_t dt__adamw_state(dt_adamw_t o, int i, dt_tensor_t* exp_avg,
                                   dt_tensor_t* exp_avg_sq, dt_tensor_t* step) {
  DT_CHECK(dt__adamw_check(o));
  if (i < 0 || i >= o->n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: parameter %d out of range [0, %d)", i, o->n);
  if (exp_avg) *exp_avg = dt_var_value(o->m[i]);
  if (exp_avg_sq) *exp_avg_sq = dt_var_value(o->v[i]);
  if (step) *step = dt_var_value(o->step[i]);
  return DT_SUCCESS;
}

dt_status_t dt_adamw_state(dt_adamw_t o, int i, dt_tensor_t* exp_avg, dt_tensor_t* exp_avg_sq,
                           dt_tensor_t* step) {
  DT_ENTRY_RETURN(dt__adamw_state(o, i, exp_avg, exp_avg_sq, step));
}

static dt_status_t dt__adamw_param(dt_adamw_t o, int i, dt_var_t* param, int* n) {
  if (param) *param = NULL;
  if (n) *n = 0;
  DT_CHECK(dt__adamw_check(o));
  if (n) *n = o->n;
  if (param == NULL) return DT_SUCCESS;
  if (i < 0 || i >= o->n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "i=%d (valid: 0 to %d)", i, o->n - 1);
  *param = o->params[i];
  return DT_SUCCESS;
}

dt_status_t dt_adamw_param(dt_adamw_t o, int i, dt_var_t* param, int* n) {
  DT_ENTRY_RETURN(dt__adamw_param(o, i, param, n));
}

static dt_status_t dt__adamw_destroy(dt_adamw_t o) {
  if (o == NULL) return DT_SUCCESS;
  DT_CHECK(dt_handle_unregister(o, &dt__adamw_kind, "optimizer"));
  for (int i = 0; i < o->n; i++) {
    if (o->m) dt_var_destroy(o->m[i]);
    if (o->v) dt_var_destroy(o->v[i]);
    if (o->step) dt_var_destroy(o->step[i]);
  }
  free(o->m);
  free(o->v);
  free(o->step);
  free(o->params);
  dt_handle_free(o);
  return DT_SUCCESS;
}

dt_status_t dt_adamw_destroy(dt_adamw_t o) { DT_ENTRY_RETURN(dt__adamw_destroy(o)); }

/* acc += x for 0-d tensors (acc NULL: takes x). Consumes x. */
static dt_status_t dt__accumulate_scalar(dt_tensor_t* acc, dt_tensor_t x) {
  if (*acc == NULL) {
    *acc = x;
    return DT_SUCCESS;
  }
  dt_tensor_t s;
  dt_status_t st = dt_add(*acc, x, &s);
  dt_tensor_destroy(x);
  if (st != DT_SUCCESS) return st;
  dt_tensor_destroy(*acc);
  *acc = s;
  return DT_SUCCESS;
}

static int dt__ptr_cmp(const void* a, const void* b) {
  uintptr_t x = (uintptr_t)*(const dt_var_t*)a, y = (uintptr_t)*(const dt_var_t*)b;
  return x < y ? -1 : x > y;
}

/* Whether some variable appears twice in params[0..n) (sorting a copy: O(n log n)); -1 when out
 * of memory. */
static int dt__has_repeats(int n, const dt_var_t* params) {
  if (n < 2) return 0;
  dt_var_t* c = malloc(sizeof *c * (size_t)n);
  if (c == NULL) return -1;
  memcpy(c, params, sizeof *c * (size_t)n);
  qsort(c, (size_t)n, sizeof *c, dt__ptr_cmp);
  int rep = 0;
  for (int i = 1; i < n && !rep; i++) rep = c[i] == c[i - 1];
  free(c);
  return rep;
}

/* Whether params[i] appeared before i (a tied parameter listed twice counts once); `any` from
 * dt__has_repeats spares the scan when nothing repeats. */
static int dt__repeat(int any, dt_var_t* params, int i) {
  for (int j = 0; any && j < i; j++)
    if (params[j] == params[i]) return 1;
  return 0;
}

/* x * prescale in a new f32 tensor (bf16 and f16 through an f32 copy: the scaled values need
 * f32's range). */
static dt_status_t dt__prescaled(dt_tensor_t x, double prescale, dt_tensor_t* out) {
  dt_dtype_t dt;
  DT_CHECK(dt_tensor_dtype(x, &dt));
  if (dt == DT_F32) return dt_op_run("mul_scalar", 1, &x, 0, NULL, 1, &prescale, out);
  const int64_t f32 = DT_F32;
  DT_CHECK(dt_op_run("cast", 1, &x, 1, &f32, 0, NULL, out));
  dt_status_t st = dt_op_run_multi("scale_", 1, out, 0, NULL, 1, &prescale, 0, NULL);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(*out);
    *out = NULL;
  }
  return st;
}

/* 1 when x has no values to read (a meta tensor, or any tensor of a simulated run: its mesh's
 * backend is the meta device), which read as zeros. */
static dt_status_t dt__no_values(dt_tensor_t x, int* none) {
  dt_mesh_t mesh;
  dt_backend_t be;
  dt_device_t dev;
  DT_CHECK(dt_tensor_is_meta(x, none));
  DT_CHECK(dt_tensor_mesh(x, &mesh));
  DT_CHECK(dt_mesh_backend(mesh, &be));
  DT_CHECK(dt_backend_device(be, &dev));
  *none |= dev == DT_DEVICE_META;
  return DT_SUCCESS;
}

/* The sum of squares of the gradients (each taken times `prescale`, exact for a power of two
 * while no element leaves f32's range), summed over the ranks in f32: *total; *found 0 when no
 * parameter has a gradient (then nothing is reduced), *meta_any 1 when some gradient has no
 * values (dt__no_values). */
static dt_status_t dt__grad_sumsq(int n, dt_var_t* params, int any, double prescale,
                                  float* total, int* found, int* meta_any) {
  /* Per gradient the sum of squares of its shard (sumsq: Partial(sum) over the mesh dims that
   * shard it), brought to Partial(sum) on every mesh dim (a replicated dim divides by its size,
   * locally, so a replicated gradient counts once), added up: one Partial scalar per mesh (the
   * dense and the expert parameters of a MoE model live on two views of one world). */
  enum { MAX_MESHES = 8 };
  dt_mesh_t meshes[MAX_MESHES];
  dt_tensor_t accs[MAX_MESHES];
  int nm = 0;
  *total = 0.0f;
  *found = 0;
  *meta_any = 0;

  dt_status_t st = DT_SUCCESS;
  dt_placement_t ps[DT_MAX_MESH_DIMS];
  for (int d = 0; d < DT_MAX_MESH_DIMS; d++) ps[d] = dt_partial(DT_REDUCE_SUM);
  for (int i = 0; i < n && st == DT_SUCCESS; i++) {
    dt_tensor_t g = dt_var_grad(params[i]), x = NULL, s = NULL, p = NULL;
    if (g == NULL || dt__repeat(any, params, i)) continue;
    dt_mesh_t gm;
    int mnd, k = 0, meta = 0;
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    DT_CHECK_GOTO(dt_tensor_mesh(g, &gm), st, done);
    while (k < nm && meshes[k] != gm) k++;
    if (k == MAX_MESHES) {
      st = DT_FAIL(DT_ERR_UNSUPPORTED, "gradients on more than %d meshes",
                   MAX_MESHES);
      goto done;
    }
    if (k == nm) {
      meshes[nm] = gm;
      accs[nm++] = NULL;
    }
    DT_CHECK_GOTO(dt_mesh_ndim(gm, &mnd), st, done);
    DT_CHECK_GOTO(dt_tensor_placements(g, pl), st, done);
    for (int d = 0; d < mnd; d++)
      if (pl[d].kind == DT_PARTIAL) {
        st = DT_FAIL(DT_ERR_INVALID_ARG, "gradient %d is Partial (reduce it "
                     "first)", i);
        goto done;
      }
    /* a gradient without values reads as zeros, scaled or not: no copy for it */
    DT_CHECK_GOTO(dt__no_values(g, &meta), st, done);
    *meta_any |= meta;
    if (prescale != 1.0 && !meta) DT_CHECK_GOTO(dt__prescaled(g, prescale, &x), st, done);
    st = dt_op_run("sumsq", 1, x ? &x : &g, 0, NULL, 0, NULL, &s);
    dt_tensor_destroy(x);
    if (st != DT_SUCCESS) goto done;
    st = dt_tensor_redistribute(s, ps, &p);
    dt_tensor_destroy(s);
    if (st == DT_SUCCESS) st = dt__accumulate_scalar(&accs[k], p);
  }
  if (st != DT_SUCCESS || nm == 0) goto done;
  int world = 0, spans = 1; /* every mesh covers the world: partial scalars add up rank by rank */
  if (nm > 1) DT_CHECK_GOTO(dt_world_size(&world), st, done);
  for (int k = 0; k < nm && nm > 1; k++) {
    int numel, member;
    DT_CHECK_GOTO(dt_mesh_numel(meshes[k], &numel), st, done);
    DT_CHECK_GOTO(dt_mesh_is_member(meshes[k], &member), st, done);
    spans &= numel == world && member;
  }
  if (nm > 1 && !spans) {
    st = DT_FAIL(DT_ERR_UNSUPPORTED, "gradients on %d meshes that do not each "
                 "cover the world", nm);
    goto done;
  }
  /* this rank's share of every mesh's scalar, summed over the ranks of the first mesh (every
   * mesh spans the same ranks when there are several): one all-reduce of a host value */
  float sum = 0.0f;
  for (int k = 0; k < nm; k++) {
    float v = 0.0f;
    DT_CHECK_GOTO(dt_tensor_read_local(accs[k], 0, 1, &v), st, done);
    sum += v;
  }
  DT_CHECK_GOTO(dt_mesh_all_reduce_host(meshes[0], 0, NULL, &sum, 1, DT_F32, DT_REDUCE_SUM), st,
                done);
  *total = sum;
  *found = 1;
done:
  for (int k = 0; k < nm; k++) dt_tensor_destroy(accs[k]);
  return st;
}

static dt_status_t dt__clip_grad_norm(int n, dt_var_t* params, double max_norm, double* norm) {
  if (norm) *norm = 0.0;
  if (n < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "n = %d parameters", n);
  if (isnan(max_norm)) return DT_FAIL(DT_ERR_INVALID_ARG, "max_norm is NaN");
  if (n == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(params);
  for (int i = 0; i < n; i++) {
    int rg;
    dt_status_t st = dt_var_requires_grad(params[i], &rg);
    if (st != DT_SUCCESS) return DT_FAIL(st, "parameter %d: %s", i, dt_last_error());
  }
  int any = dt__has_repeats(n, params);
  if (any < 0) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%d parameters", n);
  float total;
  int found, meta;
  DT_CHECK(dt__grad_sumsq(n, params, any, 1.0, &total, &found, &meta));
  double nrm = sqrt((double)total);
  /* The f32 sum of squares holds norms from 2^-30 to 2^64 (squares from 2^-60, where a share
   * that underflowed no longer shows, to FLT_MAX, past which it is inf: 1e20 is a finite norm).
   * Outside, the same sums again on gradients times 2^-64 or 2^64 (a temporary copy of each,
   * one at a time, and a second all-reduce) cover every norm f32 holds. The decision reads the
   * all-reduced total, so every rank takes it. A NaN total (a NaN gradient) stays NaN, and an
   * inf element gives inf again. Gradients without values (a simulated run, whose gradients
   * read as zeros) keep the one all-reduce that a real step's gradients take. */
  if (found && !meta && (isinf(total) || total < 0x1p-60f)) {
    const int e = isinf(total) ? -64 : 64;
    DT_CHECK(dt__grad_sumsq(n, params, any, ldexp(1.0, e), &total, &found, &meta));
    nrm = ldexp(sqrt((double)total), -e);
  }
  if (norm) *norm = nrm;
  dt_status_t st = DT_SUCCESS;
  if (max_norm > 0 && nrm > max_norm) {
    double scale = (float)(max_norm / (nrm + 1e-6));
    for (int i = 0; i < n && st == DT_SUCCESS; i++) {
      dt_tensor_t g = dt_var_grad(params[i]);
      if (g != NULL && !dt__repeat(any, params, i))
        st = dt_op_run_multi("scale_", 1, &g, 0, NULL, 1, &scale, 0, NULL);
    }
  }
  return st;
}

dt_status_t dt_clip_grad_norm(int n, dt_var_t* params, double max_norm, double* norm) {
  DT_ENTRY_RETURN(dt__clip_grad_norm(n, params, max_norm, norm));
}

double dt_lr_schedule(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
  /* a negative step or warmup counts as 0; the differences in double (no int64 overflow) */
  const double s = step > 0 ? (double)step : 0.0, w = warmup > 0 ? (double)warmup : 0.0;
  if (s < w) return lr_max * (s + 1.0) / w;
  if ((double)total <= w) return lr_max;
  double p = (s - w) / ((double)total - w);
  if (p > 1.0) p = 1.0;
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + cos(3.14159265358979323846 * p));
}

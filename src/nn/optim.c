/* optim.c - AdamW on local shards (fp32 master weights, optional bf16 moments), gradient-norm
 * clipping with one all-reduce, and the warmup + cosine learning-rate schedule. Public API only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "dtensor/check.h"

struct dt_adamw {
  dt_adamw_config_t cfg;
  int n;
  dt_var_t* params;
  void** m; /* per parameter: local moment buffers (f32 or bf16) */
  void** v;
  int64_t* numel;
  int64_t step;
};

static uint16_t dt__to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
static float dt__from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

dt_status_t dt_adamw_create(const dt_adamw_config_t* cfg, int n, dt_var_t* params,
                            dt_adamw_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(cfg);
  if (n < 0 || (n > 0 && params == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: %d parameters", n);
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1) ||
      !(cfg->eps > 0) || !(cfg->weight_decay >= 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: betas in [0, 1), eps > 0, weight_decay >= 0");
  dt_adamw_t o = calloc(1, sizeof *o);
  if (o == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "adamw");
  o->cfg = *cfg;
  o->n = n;
  o->params = calloc((size_t)(n ? n : 1), sizeof(dt_var_t));
  o->m = calloc((size_t)(n ? n : 1), sizeof(void*));
  o->v = calloc((size_t)(n ? n : 1), sizeof(void*));
  o->numel = calloc((size_t)(n ? n : 1), sizeof(int64_t));
  if (!o->params || !o->m || !o->v || !o->numel) {
    dt_adamw_destroy(o);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "adamw");
  }
  size_t item = cfg->bf16_moments ? 2 : 4;
  for (int i = 0; i < n; i++) {
    o->params[i] = params[i];
    int64_t shape[8];
    int nd;
    dt_tensor_t t = dt_var_value(params[i]);
    dt_status_t st = t ? dt_tensor_ndim(t, &nd) : DT_FAIL(DT_ERR_INVALID_ARG, "parameter %d", i);
    if (st == DT_SUCCESS) {
      void* data;
      st = dt_tensor_to_local(t, &data, shape);
    }
    if (st != DT_SUCCESS) {
      dt_adamw_destroy(o);
      return st;
    }
    int64_t ln = 1;
    for (int d = 0; d < nd; d++) ln *= shape[d];
    o->numel[i] = ln;
    o->m[i] = calloc((size_t)(ln ? ln : 1), item);
    o->v[i] = calloc((size_t)(ln ? ln : 1), item);
    if (!o->m[i] || !o->v[i]) {
      dt_adamw_destroy(o);
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "adamw moments");
    }
  }
  *out = o;
  return DT_SUCCESS;
}

dt_status_t dt_adamw_step(dt_adamw_t o, double lr) {
  DT_ARG_NOT_NULL(o);
  o->step++;
  double b1 = o->cfg.beta1, b2 = o->cfg.beta2;
  double c1 = 1.0 - pow(b1, (double)o->step), c2 = 1.0 - pow(b2, (double)o->step);
  for (int i = 0; i < o->n; i++) {
    dt_tensor_t g = dt_var_grad(o->params[i]), w = dt_var_value(o->params[i]);
    if (g == NULL) continue;
    float *pw, *pg;
    DT_CHECK(dt_tensor_to_local(w, (void**)&pw, NULL));
    DT_CHECK(dt_tensor_to_local(g, (void**)&pg, NULL));
    int nd;
    DT_CHECK(dt_tensor_ndim(w, &nd));
    double wd = nd >= 2 ? o->cfg.weight_decay : 0.0;
    int64_t n = o->numel[i];
    if (o->cfg.bf16_moments) {
      uint16_t *m = o->m[i], *v = o->v[i];
      for (int64_t k = 0; k < n; k++) {
        float gk = pg[k];
        float mk = (float)(b1 * dt__from_bf16(m[k]) + (1 - b1) * gk);
        float vk = (float)(b2 * dt__from_bf16(v[k]) + (1 - b2) * gk * gk);
        m[k] = dt__to_bf16(mk);
        v[k] = dt__to_bf16(vk);
        pw[k] -= (float)(lr * (wd * pw[k] + (mk / c1) / (sqrt(vk / c2) + o->cfg.eps)));
      }
    } else {
      float *m = o->m[i], *v = o->v[i];
      const float fb1 = (float)b1, fb2 = (float)b2, a1 = (float)(1 - b1), a2 = (float)(1 - b2);
      const float ic1 = (float)(1.0 / c1), ic2 = (float)(1.0 / c2), flr = (float)lr,
                  fwd = (float)wd, eps = (float)o->cfg.eps;
      for (int64_t k = 0; k < n; k++) { /* f32 math: vectorizes */
        float gk = pg[k];
        float mk = fb1 * m[k] + a1 * gk, vk = fb2 * v[k] + a2 * gk * gk;
        m[k] = mk;
        v[k] = vk;
        pw[k] -= flr * (fwd * pw[k] + (mk * ic1) / (sqrtf(vk * ic2) + eps));
      }
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt_adamw_destroy(dt_adamw_t o) {
  if (o == NULL) return DT_SUCCESS;
  for (int i = 0; i < o->n; i++) {
    if (o->m) free(o->m[i]);
    if (o->v) free(o->v[i]);
  }
  free(o->m);
  free(o->v);
  free(o->numel);
  free(o->params);
  free(o);
  return DT_SUCCESS;
}

/* The local shard of a variable's gradient: data and element count. */
static dt_status_t dt__local_grad(dt_var_t v, float** data, int64_t* numel) {
  dt_tensor_t g = dt_var_grad(v);
  int64_t shape[8];
  int nd;
  DT_CHECK(dt_tensor_ndim(g, &nd));
  DT_CHECK(dt_tensor_to_local(g, (void**)data, shape));
  *numel = 1;
  for (int d = 0; d < nd; d++) *numel *= shape[d];
  return DT_SUCCESS;
}

dt_status_t dt_clip_grad_norm(int n, dt_var_t* params, double max_norm, double* norm) {
  if (norm) *norm = 0.0;
  if (n == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(params);
  /* Local sum of squares, each gradient weighted by 1 / (its replication factor): a replicated
   * gradient sits on every rank of its replicated mesh dims and must count once. */
  double local = 0.0;
  dt_mesh_t mesh = NULL;
  for (int i = 0; i < n; i++) {
    dt_tensor_t g = dt_var_grad(params[i]);
    if (g == NULL) continue;
    dt_mesh_t gm;
    DT_CHECK(dt_tensor_mesh(g, &gm));
    if (mesh != NULL && gm != mesh)
      return DT_FAIL(DT_ERR_INVALID_ARG, "clip_grad_norm: gradients on different meshes");
    mesh = gm;
    int mnd;
    DT_CHECK(dt_mesh_ndim(mesh, &mnd));
    dt_placement_t pl[4];
    DT_CHECK(dt_tensor_placements(g, pl));
    double rep = 1.0;
    for (int d = 0; d < mnd; d++) {
      if (pl[d].kind == DT_PARTIAL)
        return DT_FAIL(DT_ERR_INVALID_ARG, "clip_grad_norm: gradient %d is Partial", i);
      if (pl[d].kind == DT_REPLICATE) {
        int s;
        DT_CHECK(dt_mesh_size(mesh, d, &s));
        rep *= s;
      }
    }
    float* pg;
    int64_t ln;
    DT_CHECK(dt__local_grad(params[i], &pg, &ln));
    double s = 0.0;
    for (int64_t k = 0; k < ln; k++) s += (double)pg[k] * pg[k];
    local += s / rep;
  }
  if (mesh == NULL) return DT_SUCCESS;
  /* one all-reduce: a Partial(sum) scalar over the whole mesh brought to Replicate; on a mesh of
   * several dims spanning the world the dims are flattened (registered once, a no-op afterwards)
   * so the planner merges the per-dim reductions into a single all-reduce; a mesh over part of
   * the world keeps one all-reduce per mesh dim */
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  int world, mshape[4], mnumel = 1;
  DT_CHECK(dt_world_size(&world));
  DT_CHECK(dt_mesh_shape(mesh, mshape));
  for (int d = 0; d < mnd; d++) mnumel *= mshape[d];
  if (mnd > 1 && mnumel == world) { /* flattening is collective over the world */
    int dims[4] = {0, 1, 2, 3};
    DT_CHECK(dt_mesh_flatten(mesh, mnd, dims, NULL, NULL));
  }
  dt_placement_t ps[4], rp[4];
  for (int d = 0; d < 4; d++) {
    ps[d] = dt_partial(DT_REDUCE_SUM);
    rp[d] = dt_replicate();
  }
  float lv = (float)local;
  dt_tensor_t part, tot;
  DT_CHECK(dt_tensor_from_local(mesh, DT_F32, 0, NULL, ps, &lv, NULL, &part));
  dt_status_t st = dt_tensor_redistribute(part, rp, &tot);
  dt_tensor_destroy(part);
  DT_CHECK(st);
  float total;
  st = dt_tensor_full(tot, &total, sizeof total);
  dt_tensor_destroy(tot);
  DT_CHECK(st);
  double nrm = sqrt((double)total);
  if (norm) *norm = nrm;
  if (max_norm > 0 && nrm > max_norm) {
    float scale = (float)(max_norm / (nrm + 1e-6));
    for (int i = 0; i < n; i++) {
      dt_tensor_t g = dt_var_grad(params[i]);
      if (g == NULL) continue;
      float* pg;
      int64_t ln;
      DT_CHECK(dt__local_grad(params[i], &pg, &ln));
      for (int64_t k = 0; k < ln; k++) pg[k] *= scale;
    }
  }
  return DT_SUCCESS;
}

double dt_lr_schedule(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
  if (warmup > 0 && step < warmup) return lr_max * (double)(step + 1) / (double)warmup;
  if (total <= warmup) return lr_max;
  double p = (double)(step - warmup) / (double)(total - warmup);
  if (p > 1.0) p = 1.0;
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + cos(3.14159265358979323846 * p));
}

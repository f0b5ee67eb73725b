/* plan.c - plan objects, the per-mesh plan cache and the public planning API.
 *
 * The cache key is everything that changes the answer besides the mesh (which owns the cache):
 * dtype, global shape, source and target placements. It is cleared when the cost model changes
 * (generation counter) or when the mesh gains a flattened dim.
 */
#include <stdio.h>

#include <stddef.h>

#include "redistribute/planner.h"

/* A mesh keeps at most this many plans; past it the cache starts over (plans in use stay valid:
 * they are reference counted). Bounds memory for programs that see many shapes. */
#define DT_PLAN_CACHE_MAX 4096

typedef struct dt_plan_key {
  int32_t dtype, ndim;
  int64_t shape[DT_MAX_DIMS];
  dt_placement_t src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
} dt_plan_key_t;

struct dt_plan_cache {
  uint64_t gen;
  size_t cap, count;
  dt_plan_key_t* keys;
  struct dt_plan** plans;
};

static uint64_t dt__hash(const void* p, size_t n) { return dt__hash_bytes(p, n); }

void dt__plan_release(struct dt_plan* p) {
  if (p != NULL && --p->refcount == 0) dt__free(p);
}

void dt__plan_cache_clear(struct dt_plan_cache* c) {
  if (c == NULL) return;
  for (size_t i = 0; i < c->cap; i++)
    if (c->plans[i]) {
      dt__plan_release(c->plans[i]);
      c->plans[i] = NULL;
    }
  c->count = 0;
}

void dt__plan_cache_destroy(struct dt_plan_cache* c) {
  if (c == NULL) return;
  dt__plan_cache_clear(c);
  dt__free(c->keys);
  dt__free(c->plans);
  dt__free(c);
}

static dt_status_t dt__cache_grow(struct dt_plan_cache* c) {
  size_t ncap = c->cap ? c->cap * 2 : 64;
  dt_plan_key_t* keys = (dt_plan_key_t*)dt__calloc(ncap, sizeof *keys);
  struct dt_plan** plans = (struct dt_plan**)dt__calloc(ncap, sizeof *plans);
  if (!keys || !plans) {
    dt__free(keys);
    dt__free(plans);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "growing the plan cache");
  }
  for (size_t i = 0; i < c->cap; i++) {
    if (!c->plans[i]) continue;
    size_t j = dt__hash(&c->keys[i], sizeof c->keys[i]) & (ncap - 1);
    while (plans[j]) j = (j + 1) & (ncap - 1);
    keys[j] = c->keys[i];
    plans[j] = c->plans[i];
  }
  dt__free(c->keys);
  dt__free(c->plans);
  c->keys = keys;
  c->plans = plans;
  c->cap = ncap;
  return DT_SUCCESS;
}

static dt_status_t dt__plan_build(dt_mesh_t mesh, dt_dtype_t dtype, const dt_layout_t* src,
                                  const dt_placement_t* dst, int greedy, struct dt_plan** out) {
  *out = NULL;
  /* Only the header is cleared: steps beyond nsteps are never read (saves a 2 KiB memset per
   * plan on the strategy-selection miss path). */
  struct dt_plan* p = (struct dt_plan*)dt__malloc(sizeof *p);
  if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a plan");
  memset(p, 0, offsetof(struct dt_plan, steps));
  p->cost_us = 0.0;
  p->refcount = 1;
  p->src = *src;
  p->dtype = dtype;
  memcpy(p->dst, dst, sizeof(dt_placement_t) * (size_t)src->mesh_ndim);
  size_t item = dt__itemsize(dtype);
  dt_status_t st = greedy ? dt__plan_greedy(src, dst, item, p->steps, &p->nsteps, &p->cost_us)
                          : dt__plan_search(mesh, src, dst, item, p->steps, &p->nsteps,
                                            &p->cost_us);
  if (st != DT_SUCCESS) {
    dt__free(p);
    return st;
  }
  *out = p;
  return DT_SUCCESS;
}

dt_status_t dt__plan_get(dt_mesh_t mesh, dt_dtype_t dtype, const dt_layout_t* src,
                         const dt_placement_t* dst, struct dt_plan** out) {
  *out = NULL;
  if (mesh->cache == NULL) {
    mesh->cache = (struct dt_plan_cache*)dt__calloc(1, sizeof *mesh->cache);
    if (mesh->cache == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the plan cache");
    DT_CHECK(dt__cache_grow(mesh->cache));
    mesh->cache->gen = dt__cost_generation();
  }
  struct dt_plan_cache* c = mesh->cache;
  if (c->gen != dt__cost_generation()) {
    dt__plan_cache_clear(c);
    c->gen = dt__cost_generation();
  }
  dt_plan_key_t key;
  memset(&key, 0, sizeof key);
  key.dtype = dtype;
  key.ndim = src->ndim;
  memcpy(key.shape, src->shape, sizeof(int64_t) * (size_t)src->ndim);
  memcpy(key.src, src->pl, sizeof(dt_placement_t) * (size_t)src->mesh_ndim);
  memcpy(key.dst, dst, sizeof(dt_placement_t) * (size_t)src->mesh_ndim);
  size_t j = dt__hash(&key, sizeof key) & (c->cap - 1);
  while (c->plans[j]) {
    if (memcmp(&c->keys[j], &key, sizeof key) == 0) {
      mesh->counters.plan_cache_hits++;
      dt__ctx.counters.plan_cache_hits++;
      *out = c->plans[j];
      return DT_SUCCESS;
    }
    j = (j + 1) & (c->cap - 1);
  }
  mesh->counters.plan_cache_misses++;
  dt__ctx.counters.plan_cache_misses++;
  struct dt_plan* p;
  DT_CHECK(dt__plan_build(mesh, dtype, src, dst, 0, &p));
  if (c->count >= DT_PLAN_CACHE_MAX) dt__plan_cache_clear(c);
  if ((c->count + 1) * 2 > c->cap) {
    dt_status_t st = dt__cache_grow(c);
    if (st != DT_SUCCESS) {
      dt__plan_release(p);
      return st;
    }
  }
  j = dt__hash(&key, sizeof key) & (c->cap - 1); /* the table may have changed */
  while (c->plans[j]) j = (j + 1) & (c->cap - 1);
  c->keys[j] = key;
  c->plans[j] = p;
  c->count++;
  *out = p;
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * public API */

static dt_status_t dt__plan_args(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                 const dt_placement_t* src, const dt_placement_t* dst,
                                 dt_layout_t* l, dt_placement_t* ndst) {
  DT_CHECK(dt__mesh_check(mesh));
  if (!dt__dtype_valid(dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "dtype %d out of range [0, %d)", (int)dtype,
                   DT_DTYPE_COUNT);
  DT_ARG_NOT_NULL(src);
  DT_ARG_NOT_NULL(dst);
  DT_CHECK(dt__layout_init(l, mesh->ndim, mesh->shape, ndim, shape, src));
  for (int i = 0; i < mesh->ndim; i++) {
    ndst[i] = dst[i];
    if (ndst[i].kind == DT_SHARD && (ndst[i].dim < -ndim || ndst[i].dim >= ndim))
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "target placement for mesh dim %d: Shard dim %d out of range for a %d-dim "
                     "tensor", i, ndst[i].dim, ndim);
    DT_CHECK(dt_placement_normalize(&ndst[i], ndim));
  }
  return DT_SUCCESS;
}

dt_status_t dt_plan_create(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* src, const dt_placement_t* dst, dt_plan_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_layout_t l;
  dt_placement_t nd[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__plan_args(mesh, dtype, ndim, shape, src, dst, &l, nd));
  struct dt_plan* p;
  DT_CHECK(dt__plan_get(mesh, dtype, &l, nd, &p));
  p->refcount++;
  *out = p;
  return DT_SUCCESS;
}

dt_status_t dt_plan_create_greedy(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                  const int64_t* shape, const dt_placement_t* src,
                                  const dt_placement_t* dst, dt_plan_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_layout_t l;
  dt_placement_t nd[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__plan_args(mesh, dtype, ndim, shape, src, dst, &l, nd));
  return dt__plan_build(mesh, dtype, &l, nd, 1, out);
}

dt_status_t dt_plan_destroy(dt_plan_t plan) {
  if (plan == NULL) return DT_SUCCESS;
  if (plan->refcount <= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "plan handle is not live");
  dt__plan_release(plan);
  return DT_SUCCESS;
}

dt_status_t dt_plan_num_steps(dt_plan_t plan, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  DT_ARG_NOT_NULL(plan);
  *n = plan->nsteps;
  return DT_SUCCESS;
}

dt_status_t dt_plan_get_step(dt_plan_t plan, int i, dt_plan_step_t* step) {
  DT_ARG_NOT_NULL(plan);
  DT_ARG_NOT_NULL(step);
  memset(step, 0, sizeof *step);
  if (i < 0 || i >= plan->nsteps)
    return DT_FAIL(DT_ERR_INVALID_ARG, "step %d out of range [0, %d)", i, plan->nsteps);
  const dt_step_t* s = &plan->steps[i];
  step->coll = s->coll;
  for (int d = 0; d < plan->src.mesh_ndim; d++)
    if (s->mask & (1u << d)) {
      step->mesh_dims[step->n_mesh_dims] = d;
      step->from[step->n_mesh_dims] = s->before[d];
      step->to[step->n_mesh_dims] = s->after[d];
      step->n_mesh_dims++;
    }
  step->nbytes = s->nbytes;
  step->cost_us = s->cost_us;
  return DT_SUCCESS;
}

dt_status_t dt_plan_cost(dt_plan_t plan, double* cost_us) {
  DT_ARG_NOT_NULL(cost_us);
  *cost_us = 0.0;
  DT_ARG_NOT_NULL(plan);
  *cost_us = plan->cost_us;
  return DT_SUCCESS;
}

dt_status_t dt_plan_count(dt_plan_t plan, dt_collective_t c, int* count) {
  DT_ARG_NOT_NULL(count);
  *count = 0;
  DT_ARG_NOT_NULL(plan);
  if (c < 0 || c >= DT_COLL_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "collective %d out of range", (int)c);
  for (int i = 0; i < plan->nsteps; i++) *count += plan->steps[i].coll == c;
  return DT_SUCCESS;
}

dt_status_t dt_plan_format(dt_plan_t plan, char* buf, size_t cap) {
  DT_ARG_NOT_NULL(plan);
  DT_ARG_NOT_NULL(buf);
  if (cap == 0) return DT_FAIL(DT_ERR_INVALID_ARG, "cap is 0");
  size_t used = 0;
  char one[128];
  int m = plan->src.mesh_ndim;
  for (int i = 0; i <= plan->nsteps; i++) {
    const dt_placement_t* pl = i == 0 ? plan->src.pl : plan->steps[i - 1].after;
    DT_CHECK(dt_placements_format(pl, m, NULL, one, sizeof one));
    int w = snprintf(buf + used, cap - used, "%s%s", i ? " -> " : "", one);
    if (w < 0 || (size_t)w >= cap - used)
      return DT_FAIL(DT_ERR_INVALID_ARG, "buffer of %zu bytes too small", cap);
    used += (size_t)w;
  }
  return DT_SUCCESS;
}

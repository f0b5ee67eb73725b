/* plan.c - plan objects, the plan cache and the public planning API.
 *
 * The cache belongs to this layer: one table for every mesh, keyed by everything that changes the
 * answer: the mesh's id and generation (flattening a dim bumps it), the cost-model generation,
 * dtype, global shape, source and target placements. Stale entries (a changed cost model, a
 * flattened mesh, a destroyed mesh) are never hit again and go when the table starts over.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <stddef.h>
#include <stdio.h>

#include "redistribute/planner.h"

/* The cache keeps at most this many plans; past it, it starts over (plans in use stay valid: they
 * are reference counted). Bounds memory for programs that see many shapes and meshes. */
#define DT_PLAN_CACHE_MAX 4096

typedef struct dt_plan_key {
  uint64_t mesh_id, mesh_gen, cost_gen;
  int32_t dtype, ndim;
  int64_t shape[DT_MAX_DIMS];
  dt_placement_t src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
} dt_plan_key_t;

static struct {
  size_t cap, count;
  dt_plan_key_t* keys;
  struct dt_plan** plans;
} dt__cache;

void dt__plan_release(struct dt_plan* p) {
  if (p != NULL && --p->refcount == 0) dt_handle_free(p);
}

/* A plan is the caller's handle while user_refs > 0 (the same cached plan may be handed out
 * several times, each a reference that dt_plan_destroy gives back). */
static const dt_handle_kind_t dt__plan_kind = {"plan"};

static dt_status_t dt__plan_check(dt_plan_t p) { return dt_handle_check(p, &dt__plan_kind, "plan"); }

/* One more caller reference to p (registering it on the first). */
static dt_status_t dt__plan_give(struct dt_plan* p) {
  if (p->user_refs == 0) DT_CHECK(dt_handle_register(p, &dt__plan_kind));
  p->user_refs++;
  p->refcount++;
  return DT_SUCCESS;
}

/* Gives back one caller reference (the handle dies with the last). */
static void dt__plan_take_back(struct dt_plan* p) {
  if (--p->user_refs == 0) dt_handle_unregister(p, &dt__plan_kind, "plan");
  dt__plan_release(p);
}

static void dt__cache_clear(void) {
  for (size_t i = 0; i < dt__cache.cap; i++)
    if (dt__cache.plans[i]) {
      dt__plan_release(dt__cache.plans[i]);
      dt__cache.plans[i] = NULL;
    }
  dt__cache.count = 0;
}

void dt__plan_cache_release(void) {
  dt__cache_clear();
  dt__free(dt__cache.keys);
  dt__free(dt__cache.plans);
  memset(&dt__cache, 0, sizeof dt__cache);
}

static dt_status_t dt__cache_grow(void) {
  size_t ncap = dt__cache.cap ? dt__cache.cap * 2 : 64;
  dt_plan_key_t* keys = (dt_plan_key_t*)dt__calloc(ncap, sizeof *keys);
  struct dt_plan** plans = (struct dt_plan**)dt__calloc(ncap, sizeof *plans);
  if (!keys || !plans) {
    dt__free(keys);
    dt__free(plans);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "growing the plan cache");
  }
  for (size_t i = 0; i < dt__cache.cap; i++) {
    if (!dt__cache.plans[i]) continue;
    size_t j = dt__hash_bytes(&dt__cache.keys[i], sizeof dt__cache.keys[i]) & (ncap - 1);
    while (plans[j]) j = (j + 1) & (ncap - 1);
    keys[j] = dt__cache.keys[i];
    plans[j] = dt__cache.plans[i];
  }
  dt__free(dt__cache.keys);
  dt__free(dt__cache.plans);
  dt__cache.keys = keys;
  dt__cache.plans = plans;
  dt__cache.cap = ncap;
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
  dt_status_t st = greedy ? dt__plan_greedy(mesh, src, dst, item, p->steps, &p->nsteps,
                                            &p->cost_us)
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
  if (dt__cache.cap == 0) DT_CHECK(dt__cache_grow());
  dt_plan_key_t key;
  memset(&key, 0, sizeof key);
  key.mesh_id = mesh->id;
  key.mesh_gen = mesh->generation;
  key.cost_gen = dt__cost_generation();
  key.dtype = dtype;
  key.ndim = src->ndim;
  memcpy(key.shape, src->shape, sizeof(int64_t) * (size_t)src->ndim);
  memcpy(key.src, src->pl, sizeof(dt_placement_t) * (size_t)src->mesh_ndim);
  memcpy(key.dst, dst, sizeof(dt_placement_t) * (size_t)src->mesh_ndim);
  uint64_t h = dt__hash_bytes(&key, sizeof key);
  size_t j = h & (dt__cache.cap - 1);
  while (dt__cache.plans[j]) {
    if (memcmp(&dt__cache.keys[j], &key, sizeof key) == 0) {
      dt__count_plan_lookup(mesh, 1);
      *out = dt__cache.plans[j];
      return DT_SUCCESS;
    }
    j = (j + 1) & (dt__cache.cap - 1);
  }
  dt__count_plan_lookup(mesh, 0);
  struct dt_plan* p;
  DT_CHECK(dt__plan_build(mesh, dtype, src, dst, 0, &p));
  if (dt__cache.count >= DT_PLAN_CACHE_MAX) dt__cache_clear();
  if ((dt__cache.count + 1) * 2 > dt__cache.cap) {
    dt_status_t st = dt__cache_grow();
    if (st != DT_SUCCESS) {
      dt__plan_release(p);
      return st;
    }
  }
  j = h & (dt__cache.cap - 1); /* the table may have changed */
  while (dt__cache.plans[j]) j = (j + 1) & (dt__cache.cap - 1);
  dt__cache.keys[j] = key;
  dt__cache.plans[j] = p;
  dt__cache.count++;
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
                     "dst[%d] = S(%d): Shard dim %d out of range for a %d-dim tensor (valid: %d "
                     "to %d)", i, ndst[i].dim, ndst[i].dim, ndim, -ndim, ndim - 1);
    DT_CHECK(dt_placement_normalize(&ndst[i], ndim));
  }
  dt_layout_t dl; /* the target must be a valid layout too (no max/min Partial mixed in) */
  DT_CHECK(dt__layout_init(&dl, mesh->ndim, mesh->shape, ndim, shape, ndst));
  return DT_SUCCESS;
}

static dt_status_t dt__plan_create_impl(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                        const int64_t* shape, const dt_placement_t* src,
                                        const dt_placement_t* dst, dt_plan_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_layout_t l;
  dt_placement_t nd[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__plan_args(mesh, dtype, ndim, shape, src, dst, &l, nd));
  struct dt_plan* p;
  DT_CHECK(dt__plan_get(mesh, dtype, &l, nd, &p));
  DT_CHECK(dt__plan_give(p));
  *out = p;
  return DT_SUCCESS;
}

dt_status_t dt_plan_create(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* src, const dt_placement_t* dst, dt_plan_t* out) {
  DT_ENTRY_RETURN(dt__plan_create_impl(mesh, dtype, ndim, shape, src, dst, out));
}

static dt_status_t dt__plan_create_greedy_impl(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                               const int64_t* shape, const dt_placement_t* src,
                                               const dt_placement_t* dst, dt_plan_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_layout_t l;
  dt_placement_t nd[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__plan_args(mesh, dtype, ndim, shape, src, dst, &l, nd));
  struct dt_plan* p;
  DT_CHECK(dt__plan_build(mesh, dtype, &l, nd, 1, &p));
  dt_status_t st = dt__plan_give(p);
  dt__plan_release(p); /* the build's reference: the caller's is the one left */
  if (st == DT_SUCCESS) *out = p;
  return st;
}

dt_status_t dt_plan_create_greedy(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                  const int64_t* shape, const dt_placement_t* src,
                                  const dt_placement_t* dst, dt_plan_t* out) {
  DT_ENTRY_RETURN(dt__plan_create_greedy_impl(mesh, dtype, ndim, shape, src, dst, out));
}

static dt_status_t dt__plan_destroy_impl(dt_plan_t plan) {
  if (plan == NULL) return DT_SUCCESS;
  DT_CHECK(dt__plan_check(plan));
  dt__plan_take_back(plan);
  return DT_SUCCESS;
}

dt_status_t dt_plan_destroy(dt_plan_t plan) {
  DT_ENTRY_RETURN(dt__plan_destroy_impl(plan));
}

static dt_status_t dt__plan_num_steps_impl(dt_plan_t plan, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  DT_CHECK(dt__plan_check(plan));
  *n = plan->nsteps;
  return DT_SUCCESS;
}

dt_status_t dt_plan_num_steps(dt_plan_t plan, int* n) {
  DT_ENTRY_RETURN(dt__plan_num_steps_impl(plan, n));
}

static dt_status_t dt__plan_get_step_impl(dt_plan_t plan, int i, dt_plan_step_t* step) {
  DT_CHECK(dt__plan_check(plan));
  DT_ARG_NOT_NULL(step);
  memset(step, 0, sizeof *step);
  if (i < 0 || i >= plan->nsteps)
    return DT_FAIL(DT_ERR_INVALID_ARG, "i=%d out of range [0, %d) (the plan's steps)", i,
                   plan->nsteps);
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
  step->algo = s->algo;
  return DT_SUCCESS;
}

dt_status_t dt_plan_get_step(dt_plan_t plan, int i, dt_plan_step_t* step) {
  DT_ENTRY_RETURN(dt__plan_get_step_impl(plan, i, step));
}

static dt_status_t dt__plan_cost_impl(dt_plan_t plan, double* cost_us) {
  DT_ARG_NOT_NULL(cost_us);
  *cost_us = 0.0;
  DT_CHECK(dt__plan_check(plan));
  *cost_us = plan->cost_us;
  return DT_SUCCESS;
}

dt_status_t dt_plan_cost(dt_plan_t plan, double* cost_us) {
  DT_ENTRY_RETURN(dt__plan_cost_impl(plan, cost_us));
}

static dt_status_t dt__plan_count_impl(dt_plan_t plan, dt_collective_t c, int* count) {
  DT_ARG_NOT_NULL(count);
  *count = 0;
  DT_CHECK(dt__plan_check(plan));
  if (c < 0 || c >= DT_COLL_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "collective %d out of range [0, %d)", (int)c,
                   DT_COLL_COUNT);
  for (int i = 0; i < plan->nsteps; i++) *count += plan->steps[i].coll == c;
  return DT_SUCCESS;
}

dt_status_t dt_plan_count(dt_plan_t plan, dt_collective_t c, int* count) {
  DT_ENTRY_RETURN(dt__plan_count_impl(plan, c, count));
}

static dt_status_t dt__plan_format_impl(dt_plan_t plan, char* buf, size_t cap) {
  DT_CHECK(dt__plan_check(plan));
  return dt__plan_format(plan, buf, cap);
}

dt_status_t dt_plan_format(dt_plan_t plan, char* buf, size_t cap) {
  DT_ENTRY_RETURN(dt__plan_format_impl(plan, buf, cap));
}

dt_status_t dt__plan_lend(struct dt_plan* p, int* mark) {
  *mark = p->user_refs;
  return dt__plan_give(p);
}

void dt__plan_unlend(struct dt_plan* p, int mark) {
  if (p->user_refs > mark) dt__plan_take_back(p); /* unless the callback destroyed it */
}

dt_status_t dt__plan_format(const struct dt_plan* plan, char* buf, size_t cap) {
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
      return DT_FAIL(DT_ERR_INVALID_ARG, "cap=%zu bytes is too small for the plan's text", cap);
    used += (size_t)w;
  }
  return DT_SUCCESS;
}

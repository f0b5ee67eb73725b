/* redistribute.h - internal interface of the redistribute layer: plans, the plan cache, the cost
 * model and the executor. */
#ifndef DT_REDISTRIBUTE_REDISTRIBUTE_H
#define DT_REDISTRIBUTE_REDISTRIBUTE_H

#include "mesh/mesh.h"

/* One step of a plan: one collective (or local move) on the mesh dims in `mask`. */
typedef struct dt_step {
  dt_collective_t coll;
  unsigned mask; /* mesh dims touched */
  dt_placement_t before[DT_MAX_MESH_DIMS];
  dt_placement_t after[DT_MAX_MESH_DIMS]; /* full placement lists */
  uint64_t nbytes;
  double cost_us;
} dt_step_t;

#define DT_MAX_STEPS 16

struct dt_plan {
  int refcount;
  dt_layout_t src; /* source layout (dst is src.shape with the last step's `after`) */
  dt_placement_t dst[DT_MAX_MESH_DIMS];
  dt_dtype_t dtype;
  int nsteps;
  dt_step_t steps[DT_MAX_STEPS];
  double cost_us;
};

/* ---- plans and the plan cache (src/redistribute/plan.c) ------------------------------------ */
/* Finds the optimal plan, cached by (mesh id, mesh generation, cost-model generation, dtype,
 * shape, src, dst). Borrowed pointer, valid until the next dt__plan_get or cost-model change;
 * retain with plan->refcount++ to keep it longer and release with dt__plan_release. */
dt_status_t dt__plan_get(dt_mesh_t mesh, dt_dtype_t dtype, const dt_layout_t* src,
                         const dt_placement_t* dst, struct dt_plan** out);
void dt__plan_release(struct dt_plan* p);
/* Frees every cached plan (dt_finalize; plans retained elsewhere stay valid). */
void dt__plan_cache_release(void);
/* 1 if dst is reachable from src (no new Partial from a Shard, no Partial op change); no message:
 * for callers that test many candidates. */
int dt__plan_reachable(const dt_layout_t* src, const dt_placement_t* dst);

/* ---- cost model (src/redistribute/cost.c) -------------------------------------------------- */
/* Cost-model generation: bumps on every change so caches notice. */
uint64_t dt__cost_generation(void);
double dt__cost_of(dt_collective_t c, int n, uint64_t nbytes);
/* The same as cost = a + b * nbytes. */
void dt__cost_linear(dt_collective_t c, int n, double* a, double* b);
/* Loads $DTENSOR_COST_MODEL or $HOME/.cache/dtensor/cost_model.json when present (dt_init). */
dt_status_t dt__cost_model_autoload(void);

/* ---- executor (src/redistribute/execute.c) ------------------------------------------------- */
/* Executes a plan: src buffer (source layout's local box) -> dst buffer (target's local box), both
 * in backend b's memory (packing, copies and scaling go through b). */
dt_status_t dt__plan_execute(dt_mesh_t mesh, dt_backend_t b, const struct dt_plan* p,
                             const void* src, void* dst);

#endif

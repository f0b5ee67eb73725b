/* planner.h - internal interface of the redistribution planner (shared with its unit tests). */
#ifndef DT_REDISTRIBUTE_PLANNER_H
#define DT_REDISTRIBUTE_PLANNER_H

#include "redistribute/redistribute.h"

#define DT_MAX_EDGES \
  (DT_MAX_MESH_DIMS * (1 + DT_MAX_DIMS + DT_REDUCE_COUNT) + DT_MAX_FLAT * (2 + DT_MAX_DIMS))

/* Bits of the Partial ops and shard dims that intermediate states may use. */
typedef struct dt_search_space {
  unsigned pmask; /* reduce ops (bit = dt_reduce_op_t) */
  unsigned dmask; /* tensor dims that may be sharded */
  unsigned flat[DT_MAX_FLAT]; /* mesh-dim sets the caller flattened: merged collectives */
  int nflat;
  dt_mesh_t mesh; /* its per-dim cost parameters and backend price steps (NULL: the global model) */
} dt_search_space_t;

/* Space for src -> dst: Partial ops of src and dst; shard dims of src and dst plus, when
 * `prune` is 0, every dim, else up to mesh-ndim dims of each other size above 1; the flattened
 * dim sets of `mesh` (may be NULL). */
dt_search_space_t dt__plan_space(dt_mesh_t mesh, const dt_layout_t* src, const dt_placement_t* dst,
                                 int prune);
/* One single-mesh-dim step: mesh dim i of `cur` becomes `to`. Returns 0 if not a legal step. */
int dt__plan_edge(const dt_layout_t* l, size_t item, const dt_placement_t* cur, int i,
                  dt_placement_t to, const dt_search_space_t* sp, dt_step_t* step);
/* All legal steps from cur: single-mesh-dim steps, then steps merged on a flattened dim set
 * (all-gather of every dim, all-reduce or reduce-scatter onto one tensor dim of every dim, same
 * reduce op). Returns their number (at most DT_MAX_EDGES). */
int dt__plan_neighbors(const dt_layout_t* l, size_t item, const dt_placement_t* cur,
                       const dt_search_space_t* sp, dt_step_t* out);
/* Checks the pair is reachable under the public rules (no new Partial except from Replicate,
 * no P(x) -> P(y)), with a message naming the mesh dim when it is not. */
dt_status_t dt__plan_validate(const dt_layout_t* src, const dt_placement_t* dst);
/* Minimum-cost step sequence (Dijkstra over placement states; ties prefer fewer steps). */
dt_status_t dt__plan_search(dt_mesh_t mesh, const dt_layout_t* src, const dt_placement_t* dst, size_t item,
                            dt_step_t* steps, int* nsteps, double* cost);
/* PyTorch's greedy walk: right to left (with R for misaligned nesting), then left to right. */
dt_status_t dt__plan_greedy(dt_mesh_t mesh, const dt_layout_t* src, const dt_placement_t* dst,
                            size_t item, dt_step_t* steps, int* nsteps, double* cost);

#endif

/* redistribute_demo.c - the README's main example: distribute a tensor over a 2-D mesh, move it
 * through several placements, visualize the sharding and check the result.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 build/examples/redistribute_demo
 */
#include <stdio.h>
#include <stdlib.h>

#include "dtensor/dtensor.h"

#define CHECK(call)                                                                       \
  do {                                                                                    \
    dt_status_t st_ = (call);                                                             \
    if (st_ != DT_SUCCESS) {                                                              \
      fprintf(stderr, "%s failed: %s: %s\n", #call, dt_status_name(st_), dt_last_error()); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

int main(int argc, char** argv) {
  CHECK(dt_init(&argc, &argv));
  int rank, world;
  CHECK(dt_world_rank(&rank));
  CHECK(dt_world_size(&world));

  /* A (2, world/2) mesh when the world splits evenly, else 1-D. */
  int two_d = world >= 4 && world % 2 == 0;
  int shape[2] = {two_d ? 2 : world, world / 2};
  const char* names[2] = {"dp", "tp"};
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(two_d ? 2 : 1, shape, names, NULL, &mesh));
  int m = two_d ? 2 : 1;

  /* A 6 x 5 tensor 0..29 held by rank 0, scattered as [S(0), S(1)]: 6 and 5 do not divide
   * evenly, so some shards are shorter (torch.chunk rule). */
  int64_t tshape[2] = {6, 5};
  float full[30];
  for (int i = 0; i < 30; i++) full[i] = (float)i;
  dt_placement_t pl[2];
  int n;
  CHECK(dt_placements_parse(two_d ? "S0,S1" : "S0", pl, 2, &n));
  dt_tensor_t x;
  CHECK(dt_tensor_distribute(mesh, DT_F32, 2, tshape, pl, rank == 0 ? full : NULL, 0, &x));
  if (rank == 0) CHECK(dt_tensor_visualize(x, stdout));

  /* Move it around: transpose the sharding, replicate one dim, make it Partial, reduce back. */
  const char* route_2d[] = {"S1,S0", "R,S0", "P(sum),S0", "S0,R", "R,R"};
  const char* route_1d[] = {"S1", "R", "P(sum)", "S0", "R"};
  const char** route = two_d ? route_2d : route_1d;
  for (int k = 0; k < 5; k++) {
    dt_placement_t dst[2];
    CHECK(dt_placements_parse(route[k], dst, 2, &n));
    dt_plan_t plan;
    char line[256];
    CHECK(dt_plan_create(mesh, DT_F32, 2, tshape, pl, dst, &plan));
    CHECK(dt_plan_format(plan, line, sizeof line));
    double cost;
    CHECK(dt_plan_cost(plan, &cost));
    CHECK(dt_plan_destroy(plan));
    dt_tensor_t y;
    CHECK(dt_tensor_redistribute(x, dst, &y));
    if (rank == 0) printf("\n%-24s plan %s (est. %.1f us)\n", route[k], line, cost);
    if (rank == 0) CHECK(dt_tensor_visualize(y, stdout));
    CHECK(dt_tensor_destroy(x));
    x = y;
    for (int i = 0; i < m; i++) pl[i] = dst[i];
  }

  float back[30];
  CHECK(dt_tensor_gather_full(x, back, sizeof back));
  int bad = 0;
  for (int i = 0; i < 30; i++) bad += back[i] != full[i];
  dt_counters_t c;
  CHECK(dt_counters_get(mesh, &c));
  if (rank == 0) {
    printf("\ncollectives: all_gather=%llu all_reduce=%llu reduce_scatter=%llu all_to_all=%llu "
           "scatter=%llu broadcast=%llu\n",
           (unsigned long long)c.calls[DT_COLL_ALL_GATHER],
           (unsigned long long)c.calls[DT_COLL_ALL_REDUCE],
           (unsigned long long)c.calls[DT_COLL_REDUCE_SCATTER],
           (unsigned long long)c.calls[DT_COLL_ALL_TO_ALL],
           (unsigned long long)c.calls[DT_COLL_SCATTER],
           (unsigned long long)c.calls[DT_COLL_BROADCAST]);
    printf("%s: full tensor after %d redistributions %s the original\n", bad ? "FAILED" : "OK", 5,
           bad ? "differs from" : "equals");
  }
  CHECK(dt_tensor_destroy(x));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return bad ? 1 : 0;
}

/* main.c - a program outside the tree that uses an installed dtensor (CMake package or pkg-config). */
#include <stdio.h>
#include <string.h>

#include "dtensor/dtensor.h"

int main(void) {
  dt_mesh_t m;
  dt_plan_t p;
  int s[2] = {2, 2};
  int64_t sh[2] = {8, 8};
  dt_placement_t a[2] = {dt_shard(0), dt_shard(0)}, b[2] = {dt_replicate(), dt_replicate()};
  if (dt_mesh_create_abstract(2, s, NULL, &m) != DT_SUCCESS) return 1;
  if (dt_plan_create(m, DT_F32, 2, sh, a, b, &p) != DT_SUCCESS) return 1;
  char buf[128];
  if (dt_plan_format(p, buf, sizeof buf) != DT_SUCCESS) return 1;
  printf("dtensor %s: %s\n", dt_version(), buf);
  int ok = strcmp(buf, "S(0)S(0) -> S(0)R -> RR") == 0;
  dt_plan_destroy(p);
  dt_mesh_destroy(m);
  return ok ? 0 : 1;
}

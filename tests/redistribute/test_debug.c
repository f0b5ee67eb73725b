#define _POSIX_C_SOURCE 200809L
/* test_debug.c - with DTENSOR_DEBUG=redistribute, rank 0 prints one line per redistribute with
 * the plan ("S(0)S(0) -> S(0)R -> RR": the inner dim is gathered first); other ranks print nothing. Run at np 4 on a (2,2) mesh. */
#include <string.h>
#include <unistd.h>

#include "dt_test.h"

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank, world;
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_EQ(world, 4);
  int shape[2] = {2, 2};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(2, shape, NULL, NULL, &mesh));
  int64_t ts[2] = {8, 8};
  dt_placement_t src[2] = {dt_shard(0), dt_shard(0)}, dst[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t t, r;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, ts, src, &t));
  /* Capture stderr in a file around the call. */
  char path[64];
  snprintf(path, sizeof path, "/tmp/dt_debug_%d_%d.txt", (int)getpid(), rank);
  fflush(stderr);
  int saved = dup(2);
  FILE* f = fopen(path, "w+");
  DT_ASSERT_TRUE(f != NULL, "tmp file");
  dup2(fileno(f), 2);
  DT_ASSERT_OK(dt_tensor_redistribute(t, dst, &r));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char buf[4096] = {0};
  rewind(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  remove(path);
  if (rank == 0) {
    DT_ASSERT_TRUE(strstr(buf, "[dtensor redistribute] S(0)S(0) -> S(0)R -> RR\n") != NULL,
                   "unexpected debug output: '%s'", buf);
  } else {
    DT_ASSERT_TRUE(n == 0, "rank %d printed '%s'", rank, buf);
  }
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_destroy(r));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

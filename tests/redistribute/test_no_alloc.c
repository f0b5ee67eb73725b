/* test_no_alloc.c - dt_tensor_redistribute_into allocates nothing on the steady path.
 *
 * Linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc, so every allocation made by dtensor
 * code (the static library is linked into this program) is counted; Open MPI's own allocations
 * inside its shared libraries are not (the issue: "Open MPI's reductions allocate per call; we
 * must not add more"). After one warm-up call per pair (plans cached, workspace grown), repeated
 * calls over every pair of {R, S(0), S(1), P(sum)} on a (2, n/2) mesh must count zero.
 *
 * Asynchronous redistributions (dt_tensor_redistribute_async + wait + destroy) must allocate no
 * more than the blocking dt_tensor_redistribute that also returns a new tensor: their works,
 * scratch and request memory are reused. */
#include <stddef.h>
#include <string.h>

#include "dt_test.h"

static long g_allocs = 0;
void* __real_malloc(size_t n);
void* __real_calloc(size_t a, size_t b);
void* __real_realloc(void* p, size_t n);
void* __wrap_malloc(size_t n) {
  g_allocs++;
  return __real_malloc(n);
}
void* __wrap_calloc(size_t a, size_t b) {
  g_allocs++;
  return __real_calloc(a, b);
}
void* __wrap_realloc(void* p, size_t n) {
  g_allocs++;
  return __real_realloc(p, n);
}

static dt_placement_t opt(int k) {
  return k == 0 ? dt_replicate() : k == 1 ? dt_shard(0) : k == 2 ? dt_shard(1)
                                                                 : dt_partial(DT_REDUCE_SUM);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  int shape[2] = {2, world / 2};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(2, shape, NULL, NULL, &mesh));
  int both[2] = {0, 1};
  DT_ASSERT_OK(dt_mesh_flatten(mesh, 2, both, NULL, NULL));
  int64_t ts[2] = {37, 21}; /* uneven: exercises the packing paths */
  dt_tensor_t src[16], dst[16];
  for (int k = 0; k < 16; k++) {
    dt_placement_t pl[2] = {opt(k % 4), opt(k / 4)};
    DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, ts, pl, 0.0, 1.0, &src[k]));
    DT_ASSERT_OK(dt_tensor_empty(mesh, DT_F32, 2, ts, pl, &dst[k]));
  }
  long calls = 0;
  for (int round = 0; round < 3; round++) {
    long before = g_allocs;
    for (int a = 0; a < 16; a++)
      for (int b = 0; b < 16; b++) {
        int legal = !((a % 4 == 1 || a % 4 == 2) && b % 4 == 3) &&
                    !((a / 4 == 1 || a / 4 == 2) && b / 4 == 3);
        if (!legal) continue;
        DT_ASSERT_OK(dt_tensor_redistribute_into(src[a], dst[b]));
        if (round > 0) calls++;
      }
    long made = g_allocs - before;
    if (round > 0)
      DT_ASSERT_TRUE(made == 0, "round %d: %ld allocations in steady-state redistributions", round,
                     made);
    else
      DT_ASSERT_TRUE(made > 0, "warm-up should allocate (plans, workspace): counter not wired?");
  }
  long async_allocs = 0, block_allocs = 0;
  for (int round = 0; round < 3; round++) {
    for (int a = 0; a < 16; a++)
      for (int b = 0; b < 16; b++) {
        int legal = !((a % 4 == 1 || a % 4 == 2) && b % 4 == 3) &&
                    !((a / 4 == 1 || a / 4 == 2) && b / 4 == 3);
        if (!legal) continue;
        dt_placement_t pl[2] = {opt(b % 4), opt(b / 4)};
        dt_tensor_t r;
        dt_work_t w;
        long before = g_allocs;
        DT_ASSERT_OK(dt_tensor_redistribute(src[a], pl, &r));
        DT_ASSERT_OK(dt_tensor_destroy(r));
        long mid = g_allocs;
        DT_ASSERT_OK(dt_tensor_redistribute_async(src[a], pl, &r, &w));
        DT_ASSERT_OK(dt_work_wait(w));
        DT_ASSERT_OK(dt_work_destroy(w));
        DT_ASSERT_OK(dt_tensor_destroy(r));
        if (round > 0) {
          block_allocs += mid - before;
          async_allocs += g_allocs - mid;
        }
      }
  }
  DT_ASSERT_TRUE(async_allocs <= block_allocs,
                 "steady-state async redistributions allocated %ld times, blocking ones %ld",
                 async_allocs, block_allocs);
  for (int k = 0; k < 16; k++) {
    DT_ASSERT_OK(dt_tensor_destroy(src[k]));
    DT_ASSERT_OK(dt_tensor_destroy(dst[k]));
  }
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (rank == 0)
    printf("test_no_alloc np=%d: %ld steady-state redistributions, 0 allocations; async %ld "
           "allocations, blocking with a new tensor %ld\n", world, calls, async_allocs,
           block_allocs);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

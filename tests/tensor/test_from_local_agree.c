/* test_from_local_agree.c - dt_tensor_from_local with a bad argument on one rank only fails on
 * every rank of the mesh, at once: the failing rank with its own message, the others with one
 * naming it. Registered with DTENSOR_TIMEOUT_S=5, so a rank left waiting in a collective aborts
 * the job; every call must also come back within 4 s. Cases, each on the last rank only:
 *   - a local shape that breaks the chunk rule for the given global shape (the others return
 *     DT_SUCCESS without the agreement, and then wait in their next collective);
 *   - a negative local size with the global shape inferred (the others used to wait in the
 *     inference's all-reduce for the deadline);
 *   - a different number of dims with the global shape inferred;
 *   - a NULL buffer for a non-empty shard;
 * and after each, the ranks are still in step: a good from_local and a gather give the values.
 */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>

#include "dt_test.h"

static int g_rank, g_world;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* from_local returned DT_ERR_INVALID_ARG within 4 s with *out NULL; the last rank's message
 * contains `own`, the others' name the last rank. */
static void expect_agreed(dt_status_t st, double t0, dt_tensor_t t, const char* what,
                          const char* own) {
  double took = now_s() - t0;
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG, "%s: returned %s, expected DT_ERR_INVALID_ARG (%s)",
                 what, dt_status_name(st), dt_last_error());
  DT_ASSERT_TRUE(t == NULL, "%s: out not cleared", what);
  DT_ASSERT_TRUE(took < 4.0, "%s: took %.1f s", what, took);
  char want[128];
  if (g_rank == g_world - 1) snprintf(want, sizeof want, "%s", own);
  else
    snprintf(want, sizeof want,
             "dt_tensor_from_local: checking the arguments failed on rank %d of the mesh",
             g_world - 1);
  DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "%s: no '%s' in '%s'", what, want,
                 dt_last_error());
  /* the other ranks are told the last rank's reason too */
  DT_ASSERT_TRUE(g_rank == g_world - 1 || strstr(dt_last_error(), own) != NULL,
                 "%s: the last rank's reason '%s' is not relayed: '%s'", what, own,
                 dt_last_error());
}

/* A good from_local (4 rows per rank, global shape given or inferred) holds rank r's rows. */
static void in_step(dt_mesh_t mesh, int infer, const char* after) {
  float local[4 * 3], full[64 * 3];
  for (int i = 0; i < 12; i++) local[i] = (float)(g_rank * 12 + i);
  int64_t gshape[2] = {4 * g_world, 3}, lshape[2] = {4, 3};
  dt_placement_t s0 = dt_shard(0);
  dt_tensor_t t;
  const int64_t* g = infer ? NULL : gshape;
  DT_ASSERT_OK(dt_tensor_from_local(mesh, DT_F32, 2, g, &s0, local, lshape, &t));
  DT_ASSERT_OK(dt_tensor_gather_full(t, full, sizeof full));
  for (int i = 0; i < 12 * g_world; i++)
    DT_ASSERT_TRUE(full[i] == (float)i, "after %s: element %d is %g", after, i, full[i]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  int mshape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, mshape, NULL, NULL, &mesh));
  const int last = g_rank == g_world - 1;
  float buf[64];
  memset(buf, 0, sizeof buf);
  dt_placement_t s0 = dt_shard(0);
  int64_t gshape[2] = {4 * g_world, 3};

  /* the chunk rule, global shape given */
  int64_t l1[2] = {last ? 5 : 4, 3};
  dt_tensor_t t = NULL;
  double t0 = now_s();
  dt_status_t st = dt_tensor_from_local(mesh, DT_F32, 2, gshape, &s0, buf, l1, &t);
  expect_agreed(st, t0, t, "chunk rule", "does not follow the chunk rule");
  in_step(mesh, 0, "the chunk rule");

  /* a negative size, global shape inferred */
  int64_t l2[2] = {last ? -1 : 4, 3};
  t0 = now_s();
  st = dt_tensor_from_local(mesh, DT_F32, 2, NULL, &s0, buf, l2, &t);
  expect_agreed(st, t0, t, "negative size, inferred", "-1");
  in_step(mesh, 1, "a negative size");

  /* a different number of dims, global shape inferred */
  int64_t l3[3] = {4, 3, 1};
  t0 = now_s();
  st = dt_tensor_from_local(mesh, DT_F32, last ? 3 : 2, NULL, &s0, buf, l3, &t);
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG, "ndim: returned %s (%s)", dt_status_name(st),
                 dt_last_error());
  DT_ASSERT_TRUE(t == NULL && now_s() - t0 < 4.0, "ndim: out or time");
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dims") != NULL, "ndim: message '%s'", dt_last_error());
  in_step(mesh, 1, "a different ndim");

  /* a NULL buffer for a non-empty shard */
  int64_t l4[2] = {4, 3};
  t0 = now_s();
  st = dt_tensor_from_local(mesh, DT_F32, 2, gshape, &s0, last ? NULL : buf, l4, &t);
  expect_agreed(st, t0, t, "NULL buffer", "NULL");
  in_step(mesh, 0, "a NULL buffer");

  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_from_local_agree np=%d: ok\n", g_world);
  return 0;
}

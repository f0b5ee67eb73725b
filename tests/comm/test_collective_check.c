/* test_collective_check.c - the collective check (DTENSOR_DEBUG=collectives): ranks that make
 * different collective calls on a communicator all return DT_ERR_INVALID_USAGE with the same
 * message, which names the first mismatch (the lowest rank whose call differs from rank 0's, both
 * calls described with their plan step); no rank enters the call, so the communicators stay in
 * step (a matching redistribution right after gives the right values); and nothing waits for the
 * deadline (registered with DTENSOR_TIMEOUT_S=5: a hang aborts the job, and every mismatch must
 * come back within 4 s). argv[1]:
 *   on   (run with DTENSOR_DEBUG=collectives) the mismatch cases:
 *        (a) different target placements, S(0)->R against S(0)->S(1) (all_gather against
 *            all_to_all), blocking and asynchronous, and on a 2x2 mesh along mesh dim 1 only;
 *        (b) the same collective with different counts (the last rank's tensor is larger), for an
 *            all_gather and for an all_to_all (its counts are compared transposed);
 *        (c) different dtypes (f32 against i32: the same bytes, so without the check every rank
 *            returns DT_SUCCESS with wrong values);
 *        (d) an all_reduce against an all_gather of the same bytes: P->R against S(0)->R, and
 *            dt_mesh_all_reduce_host against a redistribution;
 *        and one that must pass: an exchange whose boxes are placed directly on some ranks and
 *        gathered into scratch on others (blocking and asynchronous);
 *   off  (DTENSOR_DEBUG unset) case (c) runs unchecked on every rank: the mode is off by default.
 */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>

#include "dt_test.h"

#define MSG 1024

static int g_rank, g_world;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This rank returned DT_ERR_INVALID_USAGE within 4 s with a mismatch message that every rank of
 * its group (the ranks passing the same `group`) returned too, and that contains each needle (a
 * NULL-terminated list; "%d" in a needle is replaced by the last world rank). */
static void expect_mismatch(dt_status_t st, double t0, int group, const char* what,
                            const char* const* needles) {
  double took = now_s() - t0;
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_USAGE, "%s: returned %s, expected DT_ERR_INVALID_USAGE (%s)",
                 what, dt_status_name(st), dt_last_error());
  DT_ASSERT_TRUE(took < 4.0, "%s: the mismatch took %.1f s", what, took);
  const char* m = strstr(dt_last_error(), "collective mismatch");
  DT_ASSERT_TRUE(m != NULL, "%s: message '%s'", what, dt_last_error());
  /* up to the end of the check's text: an asynchronous work's wait appends where it reported */
  char mine[MSG] = {0};
  snprintf(mine, sizeof mine, "%s", m);
  const char* tail = "(DTENSOR_DEBUG=collectives)";
  char* end = strstr(mine, tail);
  DT_ASSERT_TRUE(end != NULL, "%s: message '%s'", what, mine);
  end[strlen(tail)] = '\0';
  char* all = calloc((size_t)g_world, MSG);
  int* groups = calloc((size_t)g_world, sizeof(int));
  MPI_Allgather(mine, MSG, MPI_CHAR, all, MSG, MPI_CHAR, MPI_COMM_WORLD);
  MPI_Allgather(&group, 1, MPI_INT, groups, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < g_world; r++)
    if (groups[r] == group)
      DT_ASSERT_TRUE(strcmp(all + (size_t)r * MSG, mine) == 0,
                     "%s: rank %d's message differs from mine:\n  %s\n  %s", what, r,
                     all + (size_t)r * MSG, mine);
  for (int i = 0; needles[i] != NULL; i++) {
    char want[256];
    snprintf(want, sizeof want, needles[i], g_world - 1);
    DT_ASSERT_TRUE(strstr(mine, want) != NULL, "%s: no '%s' in '%s'", what, want, mine);
  }
  if (g_rank == 0) printf("test_collective_check: %s: %s\n", what, mine);
  free(all);
  free(groups);
}

/* The communicators are in step: a matching S(0)->R gives every rank the full tensor. */
static void in_step(dt_mesh_t mesh, const char* after) {
  int64_t shape[2] = {4 * g_world, 4};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, shape, &s0, 0.0, 1.0, &x));
  DT_ASSERT_OK(dt_tensor_redistribute(x, &r, &y));
  int n = 16 * g_world;
  float* got = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_OK(dt_tensor_gather_full(y, got, sizeof(float) * (size_t)n));
  for (int i = 0; i < n; i++)
    DT_ASSERT_TRUE(got[i] == (float)i, "after %s: element %d is %g", after, i, got[i]);
  free(got);
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
}

/* Redistributes an arange of `shape` (dtype) from `from` to `to`; returns the status. */
static dt_status_t move(dt_mesh_t mesh, dt_dtype_t dtype, const int64_t* shape,
                        const dt_placement_t* from, const dt_placement_t* to, int async) {
  dt_tensor_t x, y = NULL;
  DT_ASSERT_OK(dt_tensor_arange(mesh, dtype, 2, shape, from, 0.0, 1.0, &x));
  dt_status_t st;
  if (async) { /* the mismatch shows at the start or at the wait, whichever sees the check end */
    dt_work_t w = NULL;
    st = dt_tensor_redistribute_async(x, to, &y, &w);
    if (st == DT_SUCCESS) {
      st = dt_work_wait(w);
      DT_ASSERT_OK(dt_work_destroy(w));
    }
  } else {
    st = dt_tensor_redistribute(x, to, &y);
  }
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  return st;
}

/* No false mismatch: S(1)->R of 64 x (65 W - 1) (65 columns per rank, 64 on the last). The last
 * rank receives 65-column blocks (16,640 B, one message each) straight into their boxes; the
 * others receive a 64-column block (16,384 B, sent as eager pieces, which a box cannot take), so
 * they gather back to back and unpack: all_to_all_box places on one rank and declines on the
 * others, and both must be checked as the same call. */
static void case_box_mixed(dt_mesh_t mesh, int async) {
  int64_t shape[2] = {64, 65 * g_world - 1};
  dt_placement_t s1 = dt_shard(1), r = dt_replicate();
  dt_tensor_t x, y = NULL;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, shape, &s1, 0.0, 1.0, &x));
  if (async) {
    dt_work_t w;
    DT_ASSERT_OK(dt_tensor_redistribute_async(x, &r, &y, &w));
    DT_ASSERT_OK(dt_work_wait(w));
    DT_ASSERT_OK(dt_work_destroy(w));
  } else {
    DT_ASSERT_OK(dt_tensor_redistribute(x, &r, &y));
  }
  int64_t n = shape[0] * shape[1];
  float* got = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_OK(dt_tensor_gather_full(y, got, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++)
    DT_ASSERT_TRUE(got[i] == (float)i, "mixed boxes: element %lld is %g", (long long)i, got[i]);
  free(got);
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
}

static void case_placements(dt_mesh_t mesh, int async) {
  int64_t shape[2] = {4 * g_world, 4};
  dt_placement_t s0 = dt_shard(0), to = g_rank % 2 ? dt_shard(1) : dt_replicate();
  double t0 = now_s();
  dt_status_t st = move(mesh, DT_F32, shape, &s0, &to, async);
  const char* const needles[] = {"world ranks 0-%d",
                                 "world rank 0 calls all_gather f32 counts [16,16",
                                 "(mesh dim 0, step 1/1 S(0)->R)",
                                 "world rank 1 calls all_to_all f32 sends",
                                 "(mesh dim 0, step 1/1 S(0)->S(1))",
                                 "no rank entered it",
                                 NULL};
  expect_mismatch(st, t0, 0, async ? "(a) placements, async" : "(a) placements", needles);
  in_step(mesh, "(a)");
}

static void case_placements_2d(void) {
  int shape2[2] = {2, g_world / 2};
  dt_mesh_t m2;
  DT_ASSERT_OK(dt_mesh_create(2, shape2, NULL, NULL, &m2));
  int coords[2];
  DT_ASSERT_OK(dt_mesh_coordinate(m2, coords));
  int64_t shape[2] = {8, 8};
  dt_placement_t from[2] = {dt_replicate(), dt_shard(0)};
  dt_placement_t to[2] = {dt_replicate(), coords[1] ? dt_shard(1) : dt_replicate()};
  double t0 = now_s();
  dt_status_t st = move(m2, DT_F32, shape, from, to, 0);
  const char* const needles[] = {"communicator of 2 ranks", "calls all_gather f32",
                                 "(mesh dim 1, step 1/1 S(0)->R)", "calls all_to_all f32",
                                 "(mesh dim 1, step 1/1 S(0)->S(1))", NULL};
  expect_mismatch(st, t0, coords[0], "(a) placements on mesh dim 1 of a 2x2 mesh", needles);
  DT_ASSERT_OK(dt_mesh_destroy(m2));
}

static void case_counts(dt_mesh_t mesh) {
  int last = g_rank == g_world - 1;
  int64_t shape[2] = {4 * g_world, last ? 8 : 4};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  double t0 = now_s();
  dt_status_t st = move(mesh, DT_F32, shape, &s0, &r, 0);
  const char* const needles[] = {"world rank 0 calls all_gather f32 counts [16,16",
                                 "world rank %d calls all_gather f32 counts [32,32", NULL};
  expect_mismatch(st, t0, 0, "(b) counts", needles);
  in_step(mesh, "(b)");
  /* all_to_all: what the last rank sends to rank 0 is not what rank 0 expects from it */
  int64_t shape2[2] = {4 * g_world, (last ? 4 : 2) * g_world};
  dt_placement_t s1 = dt_shard(1);
  t0 = now_s();
  st = move(mesh, DT_F32, shape2, &s0, &s1, 0);
  const char* const needles2[] = {
      "world rank 0 sends 8 f32 elements to world rank %d, which expects 16 from it, in "
      "all_to_all (mesh dim 0, step 1/1 S(0)->S(1))",
      NULL};
  expect_mismatch(st, t0, 0, "(b) all_to_all counts", needles2);
  in_step(mesh, "(b) all_to_all");
}

static dt_status_t case_dtypes_status(dt_mesh_t mesh) {
  int64_t shape[2] = {4 * g_world, 4};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  return move(mesh, g_rank % 2 ? DT_I32 : DT_F32, shape, &s0, &r, 0);
}

static void case_dtypes(dt_mesh_t mesh) {
  double t0 = now_s();
  dt_status_t st = case_dtypes_status(mesh);
  const char* const needles[] = {"world rank 0 calls all_gather f32 counts",
                                 "world rank 1 calls all_gather i32 counts", NULL};
  expect_mismatch(st, t0, 0, "(c) dtypes", needles);
  in_step(mesh, "(c)");
}

static void case_kinds(dt_mesh_t mesh) {
  /* P->R (all_reduce of 8) on even ranks, S(0)->R (8 per rank) on odd ones: the same bytes */
  int odd = g_rank % 2;
  int64_t shape[2] = {odd ? 8 * g_world : 8, 1};
  dt_placement_t from = odd ? dt_shard(0) : dt_partial(DT_REDUCE_SUM), r = dt_replicate();
  double t0 = now_s();
  dt_status_t st = move(mesh, DT_F32, shape, &from, &r, 0);
  const char* const needles[] = {"world rank 0 calls all_reduce sum f32 count 8 (mesh dim 0",
                                 "world rank 1 calls all_gather f32 counts [8,8",
                                 "step 1/1 S(0)->R)", NULL};
  expect_mismatch(st, t0, 0, "(d) all_reduce against all_gather", needles);
  in_step(mesh, "(d)");
  /* dt_mesh_all_reduce_host (no plan step) against a redistribution */
  t0 = now_s();
  if (odd) {
    int64_t s2[2] = {8 * g_world, 1};
    dt_placement_t s0 = dt_shard(0);
    st = move(mesh, DT_F32, s2, &s0, &r, 0);
  } else {
    float buf[8] = {0};
    st = dt_mesh_all_reduce_host(mesh, 0, NULL, buf, 8, DT_F32, DT_REDUCE_MAX);
  }
  const char* const needles2[] = {"world rank 0 calls all_reduce max f32 count 8;",
                                  "world rank 1 calls all_gather f32 counts [8,8", NULL};
  expect_mismatch(st, t0, 0, "(d) dt_mesh_all_reduce_host against a redistribution", needles2);
  in_step(mesh, "(d) host");
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "on";
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  if (strcmp(mode, "off") == 0) {
    /* no check: f32 against i32 of the same bytes goes through unnoticed on every rank */
    DT_ASSERT_OK(case_dtypes_status(mesh));
    in_step(mesh, "the unchecked dtype mismatch");
  } else {
    in_step(mesh, "nothing");
    case_box_mixed(mesh, 0);
    case_box_mixed(mesh, 1);
    case_placements(mesh, 0);
    case_placements(mesh, 1);
    if (g_world == 4) case_placements_2d();
    case_counts(mesh);
    case_dtypes(mesh);
    case_kinds(mesh);
  }
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_collective_check %s np=%d: ok\n", mode, g_world);
  return 0;
}

/* test_async.c - asynchronous redistribution (dt_tensor_redistribute_async, dt_work_*).
 *
 * Every result is compared with the full tensor it must hold (small integers: sums are exact):
 *  - many works in flight on one mesh (more than its slots, so starts complete the oldest), their
 *    sources destroyed at once, waited for in reverse order, some only destroyed;
 *  - works on two meshes at once, with blocking redistributions and ops run in between (ops
 *    advance works in flight) and completion polled with dt_work_test;
 *  - an op whose two inputs both move (dispatch starts both before waiting);
 *  - meta tensors (complete at once), bad arguments, illegal targets (nothing started);
 *  - works left running at dt_finalize, their mesh destroyed first (finalize completes them;
 *    wait and destroy still work afterwards).
 */
#include <string.h>

#include "dt_test.h"

#define N0 9
#define N1 6

static float g_ref[N0 * N1];

static void make_ref(void) {
  for (int i = 0; i < N0 * N1; i++) g_ref[i] = (float)((i * 5 + 1) % 13) - 6.0f;
}

static dt_placement_t opt(int k) {
  switch (k % 4) {
    case 0: return dt_replicate();
    case 1: return dt_shard(0);
    case 2: return dt_shard(1);
    default: return dt_partial(DT_REDUCE_SUM);
  }
}

/* The full tensor of t must equal want (n elements). */
static void expect_full(dt_tensor_t t, const float* want, int n, const char* what) {
  float got[N0 * N1 * 2];
  DT_ASSERT_OK(dt_tensor_gather_full(t, got, sizeof(float) * (size_t)n));
  for (int i = 0; i < n; i++)
    DT_ASSERT_TRUE(got[i] == want[i], "%s: element %d is %g, expected %g", what, i, got[i],
                   want[i]);
}

/* A source with the reference values in placements pl. */
static dt_tensor_t source(dt_mesh_t mesh, const dt_placement_t* pl) {
  int64_t shape[2] = {N0, N1};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, shape, pl, g_ref, &t));
  return t;
}

/* Legal pairs on a 1-D mesh: no Shard -> Partial. */
static int legal(int a, int b) { return !((a % 4 == 1 || a % 4 == 2) && b % 4 == 3); }

static void many_in_flight(dt_mesh_t mesh) {
  enum { K = 20 }; /* more than the 8 slots of a mesh: 10 legal pairs, twice */
  dt_work_t w[K];
  dt_tensor_t out[K];
  int n = 0;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4 && n < K; b++) {
      if (a == b || !legal(a, b)) continue;
      for (int rep = 0; rep < 2 && n < K; rep++) {
        dt_placement_t src = opt(a), dst = opt(b);
        dt_tensor_t s = source(mesh, &src);
        DT_ASSERT_OK(dt_tensor_redistribute_async(s, &dst, &out[n], &w[n]));
        DT_ASSERT_TRUE(out[n] != NULL && w[n] != NULL, "async start gives a tensor and a work");
        DT_ASSERT_OK(dt_tensor_destroy(s)); /* the work holds its memory */
        n++;
      }
    }
  DT_ASSERT_TRUE(n == K, "built %d works", n);
  for (int k = n - 1; k >= 0; k--) { /* reverse order: the same on every rank */
    if (k % 5 == 0) {
      DT_ASSERT_OK(dt_work_destroy(w[k])); /* completes it */
    } else {
      DT_ASSERT_OK(dt_work_wait(w[k]));
      DT_ASSERT_OK(dt_work_destroy(w[k]));
    }
    expect_full(out[k], g_ref, N0 * N1, "many in flight");
    DT_ASSERT_OK(dt_tensor_destroy(out[k]));
  }
}

static void interleaved(dt_mesh_t m1, dt_mesh_t m2) {
  dt_placement_t s0 = dt_shard(0), s1 = dt_shard(1), r = dt_replicate();
  dt_placement_t p = dt_partial(DT_REDUCE_SUM);
  dt_placement_t pp[2] = {p, p}, s01[2] = {s0, s1}, rr[2] = {r, r}, s10[2] = {s1, s0};
  dt_tensor_t a = source(m1, &s0), b = source(m2, pp), c = source(m2, s01);
  dt_tensor_t ar, br, cr;
  dt_work_t wa, wb, wc;
  DT_ASSERT_OK(dt_tensor_redistribute_async(a, &s1, &ar, &wa));
  DT_ASSERT_OK(dt_tensor_redistribute_async(b, rr, &br, &wb));
  DT_ASSERT_OK(dt_tensor_redistribute_async(c, s10, &cr, &wc));
  /* blocking work on the same meshes while those are in flight */
  dt_tensor_t x = source(m1, &p), xr, y;
  DT_ASSERT_OK(dt_tensor_redistribute(x, &r, &xr));
  expect_full(xr, g_ref, N0 * N1, "blocking between async");
  DT_ASSERT_OK(dt_add(xr, xr, &y)); /* an op: advances the works in flight */
  float twice[N0 * N1];
  for (int i = 0; i < N0 * N1; i++) twice[i] = 2.0f * g_ref[i];
  expect_full(y, twice, N0 * N1, "op between async");
  int done = 0;
  for (int spin = 0; spin < 1000000 && !done; spin++) DT_ASSERT_OK(dt_work_test(wb, &done));
  DT_ASSERT_TRUE(done, "dt_work_test never saw the work complete");
  DT_ASSERT_OK(dt_work_wait(wa));
  DT_ASSERT_OK(dt_work_wait(wb));
  DT_ASSERT_OK(dt_work_wait(wc));
  expect_full(ar, g_ref, N0 * N1, "S0->S1 async");
  expect_full(br, g_ref, N0 * N1, "PP->RR async");
  expect_full(cr, g_ref, N0 * N1, "S0S1->S1S0 async");
  dt_tensor_t all[] = {a, b, c, ar, br, cr, x, xr, y};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) DT_ASSERT_OK(dt_tensor_destroy(all[i]));
  DT_ASSERT_OK(dt_work_destroy(wa));
  DT_ASSERT_OK(dt_work_destroy(wb));
  DT_ASSERT_OK(dt_work_destroy(wc));
}

/* add(P(sum), P(max)) -> neither input can stay: both move, started together. */
static void op_moves_two_inputs(dt_mesh_t mesh, int world) {
  dt_placement_t ps = dt_partial(DT_REDUCE_SUM), pm = dt_partial(DT_REDUCE_MAX);
  dt_tensor_t a = source(mesh, &ps), b = source(mesh, &pm), c;
  DT_ASSERT_OK(dt_counters_reset(mesh));
  DT_ASSERT_OK(dt_add(a, b, &c));
  dt_counters_t cnt;
  DT_ASSERT_OK(dt_counters_get(mesh, &cnt));
  DT_ASSERT_TRUE(cnt.redistributes == 2, "add(P(sum), P(max)) moved %llu inputs, expected 2",
                 (unsigned long long)cnt.redistributes);
  float want[N0 * N1];
  for (int i = 0; i < N0 * N1; i++) want[i] = 2.0f * g_ref[i];
  expect_full(c, want, N0 * N1, "add of two moved inputs");
  (void)world;
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_tensor_destroy(c));
}

static void meta_and_errors(dt_mesh_t mesh) {
  int64_t shape[2] = {N0, N1};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate(), p = dt_partial(DT_REDUCE_SUM);
  dt_tensor_t m, mr;
  dt_work_t w;
  DT_ASSERT_OK(dt_tensor_meta(mesh, DT_F32, 2, shape, &s0, &m));
  DT_ASSERT_OK(dt_tensor_redistribute_async(m, &r, &mr, &w));
  int done = 0, meta = 0;
  DT_ASSERT_OK(dt_work_test(w, &done));
  DT_ASSERT_TRUE(done == 1, "a meta redistribution is complete at once");
  DT_ASSERT_OK(dt_tensor_is_meta(mr, &meta));
  DT_ASSERT_TRUE(meta == 1, "the target of a meta tensor is meta");
  DT_ASSERT_OK(dt_work_wait(w));
  DT_ASSERT_OK(dt_work_destroy(w));
  DT_ASSERT_OK(dt_tensor_destroy(mr));
  DT_ASSERT_OK(dt_tensor_destroy(m));

  dt_tensor_t t = source(mesh, &s0), out = (dt_tensor_t)&out;
  w = (dt_work_t)&w;
  DT_ASSERT_STATUS(dt_tensor_redistribute_async(t, &p, &out, &w), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(out == NULL && w == NULL, "a failed start leaves no tensor and no work");
  DT_ASSERT_STATUS(dt_tensor_redistribute_async(t, &r, NULL, &w), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_redistribute_async(t, &r, &out, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_redistribute_async(t, NULL, &out, &w), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_redistribute_async(NULL, &r, &out, &w), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_work_wait(NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_work_test(NULL, &done), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_work_destroy(NULL));
  int junk[64] = {0};
  DT_ASSERT_STATUS(dt_work_wait((dt_work_t)junk), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_redistribute_async(t, &r, &out, &w));
  DT_ASSERT_STATUS(dt_work_test(w, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_work_wait(w));
  DT_ASSERT_OK(dt_work_destroy(w));
  expect_full(out, g_ref, N0 * N1, "after argument errors");
  DT_ASSERT_OK(dt_tensor_destroy(out));
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  make_ref();
  int flat[1] = {world}, grid[2] = {2, world / 2};
  dt_mesh_t m1, m2;
  DT_ASSERT_OK(dt_mesh_create(1, flat, NULL, NULL, &m1));
  DT_ASSERT_OK(dt_mesh_create(2, grid, NULL, NULL, &m2));
  for (int round = 0; round < 2; round++) { /* the second round reuses spare works */
    many_in_flight(m1);
    interleaved(m1, m2);
    op_moves_two_inputs(m1, world);
    meta_and_errors(m1);
  }
  /* works still running at finalize, their mesh and tensors gone first */
  dt_placement_t s0 = dt_shard(0), s1 = dt_shard(1);
  dt_tensor_t a = source(m1, &s0), ar;
  dt_work_t w;
  DT_ASSERT_OK(dt_tensor_redistribute_async(a, &s1, &ar, &w));
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  float got[N0 * N1];
  DT_ASSERT_OK(dt_work_wait(w));
  DT_ASSERT_OK(dt_tensor_gather_full(ar, got, sizeof got));
  DT_ASSERT_TRUE(memcmp(got, g_ref, sizeof got) == 0, "result after the mesh was destroyed");
  dt_tensor_t b = NULL, br;
  dt_work_t w2;
  {
    dt_mesh_t m3;
    DT_ASSERT_OK(dt_mesh_create(1, flat, NULL, NULL, &m3));
    b = source(m3, &s0);
    DT_ASSERT_OK(dt_tensor_redistribute_async(b, &s1, &br, &w2));
    DT_ASSERT_OK(dt_mesh_destroy(m3));
  }
  DT_ASSERT_OK(dt_tensor_destroy(ar));
  DT_ASSERT_OK(dt_work_destroy(w));
  if (rank == 0) printf("test_async np=%d: ok\n", world);
  DT_ASSERT_OK(dt_finalize()); /* completes w2 */
  DT_ASSERT_OK(dt_work_wait(w2));
  DT_ASSERT_OK(dt_work_destroy(w2));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_tensor_destroy(br));
  return 0;
}

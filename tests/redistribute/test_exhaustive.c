/* test_exhaustive.c - every source/target pair from {R, S(0), S(1), P(sum)} per mesh dim, on the
 * meshes that fit the world size ((2) at np 2; (4), (2,2) at np 4; (8), (2,2,2), (2,4) at np 8),
 * for even, uneven and empty-shard shapes, and every pair from {R, S(0), S(1), S(2), P(sum)} for
 * 3-D tensors on meshes of up to 2 dims: full_tensor after the redistribute must equal the
 * reference exactly (small integers, sums exact), and the collective counters must equal the
 * plan's counts. A second pass repeats (2,2)-style meshes with all dims flattened, so merged
 * collectives are executed too. A few dtypes other than f32 run on a subset, and medium shapes
 * (messages around the eager limit, strided blocks received in place) on the first mesh.
 *
 * Every mesh runs in three modes: blocking (dt_tensor_redistribute), asynchronous
 * (dt_tensor_redistribute_async, the source destroyed before the wait, completion polled with
 * dt_work_test) and blocking with the all-to-all reduction algorithm forced for every P -> S and
 * P -> R step. Registered a second time with DTENSOR_COMM_MAX_COUNT=3 so that every collective
 * also runs its chunked form (counts beyond one MPI call). */
#include <string.h>

#include "dt_test.h"

static const int64_t kShapes[][3] = {{13, 3}, {5, 4}, {1, 3}, {3, 13}, {8, 6}, {0, 3}};
/* 3-D tensors: blocks cut along a middle dim are strided boxes of more than two dims */
static const int64_t kShapes3[][3] = {{4, 6, 5}, {3, 5, 2}, {5, 2, 7}};
/* Medium f32 tensors: messages around the 4 KiB eager limit (split into eager pieces up to
 * 16 KiB) and strided blocks large enough to be received straight into place by default. */
static const int64_t kShapesM[][3] = {{40, 50}, {64, 48}, {130, 70}, {1000, 5}, {9, 1100}};
#define SHAPES(t) t, (int)(sizeof t / sizeof t[0])

/* Option k of R, S(0), S(1), [S(2) for 3-D tensors], P(sum). */
static dt_placement_t opt(int k, int tdim) {
  if (k == 0) return dt_replicate();
  if (k <= tdim) return dt_shard(k - 1);
  return dt_partial(DT_REDUCE_SUM);
}

enum { MODE_BLOCKING, MODE_ASYNC, MODE_A2A, MODE_COUNT };
static const char* const kModeNames[MODE_COUNT] = {"blocking", "async", "a2a"};
static int g_mode = MODE_BLOCKING;

/* t -> dst in the current mode; t is consumed in async mode (destroyed before the wait, the work
 * holds its memory) and *tp set to NULL. */
static void redistribute(dt_tensor_t* tp, const dt_placement_t* dst, dt_tensor_t* r) {
  if (g_mode != MODE_ASYNC) {
    DT_ASSERT_OK(dt_tensor_redistribute(*tp, dst, r));
    return;
  }
  dt_work_t w;
  DT_ASSERT_OK(dt_tensor_redistribute_async(*tp, dst, r, &w));
  DT_ASSERT_OK(dt_tensor_destroy(*tp));
  *tp = NULL;
  int done = 0;
  for (int spins = 0; spins < 3 && !done; spins++) DT_ASSERT_OK(dt_work_test(w, &done));
  DT_ASSERT_OK(dt_work_wait(w));
  DT_ASSERT_OK(dt_work_wait(w)); /* a second wait returns the same status */
  DT_ASSERT_OK(dt_work_test(w, &done));
  DT_ASSERT_TRUE(done == 1, "a waited work tests done");
  DT_ASSERT_OK(dt_work_destroy(w));
}

static double ref_value(int64_t i) { return (double)((i * 7 + 3) % 11) - 5.0; }

static void fill_ref(dt_dtype_t dt, void* buf, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double v = ref_value(i);
    switch (dt) {
      case DT_F32: ((float*)buf)[i] = (float)v; break;
      case DT_I32: ((int32_t*)buf)[i] = (int32_t)v; break;
      case DT_I64: ((int64_t*)buf)[i] = (int64_t)v; break;
      case DT_BF16: { /* small integers are exact in bf16: build via f32 bits */
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t*)buf)[i] = (uint16_t)(u >> 16);
        break;
      }
      default: break;
    }
  }
}

/* Every pair on mesh (m dims) for the tensors of tdim (2 or 3) dims in shapes[0..nshapes). */
static long long run_mesh(dt_mesh_t mesh, int m, dt_dtype_t dt, int shape_stride, int tdim,
                          const int64_t (*shapes)[3], int nshapes) {
  int nopt = tdim + 2, npl = 1;
  for (int i = 0; i < m; i++) npl *= nopt;
  size_t item;
  dt_dtype_itemsize(dt, &item);
  long long checked = 0;
  for (int s = 0; s < nshapes; s += shape_stride) {
    const int64_t* shape = shapes[s];
    int64_t n = shape[0] * shape[1] * (tdim == 3 ? shape[2] : 1);
    char* ref = (char*)calloc((size_t)n + 1, item);
    char* got = (char*)calloc((size_t)n + 1, item);
    fill_ref(dt, ref, n);
    for (int a = 0; a < npl; a++) {
      dt_placement_t src[4];
      for (int i = 0, v = a; i < m; i++, v /= nopt) src[i] = opt(v % nopt, tdim);
      dt_tensor_t t = NULL;
      for (int b = 0; b < npl; b++) {
        if (t == NULL) DT_ASSERT_OK(dt_tensor_from_full(mesh, dt, tdim, shape, src, ref, &t));
        dt_placement_t dst[4];
        int legal = 1;
        for (int i = 0, v = b; i < m; i++, v /= nopt) {
          dst[i] = opt(v % nopt, tdim);
          if (dst[i].kind == DT_PARTIAL && src[i].kind == DT_SHARD) legal = 0;
        }
        dt_tensor_t r = NULL;
        if (!legal) {
          DT_ASSERT_STATUS(dt_tensor_redistribute(t, dst, &r), DT_ERR_UNSUPPORTED);
          DT_ASSERT_TRUE(r == NULL, "out must be NULL on failure");
          continue;
        }
        dt_plan_t plan;
        DT_ASSERT_OK(dt_plan_create(mesh, dt, tdim, shape, src, dst, &plan));
        DT_ASSERT_OK(dt_counters_reset(mesh));
        redistribute(&t, dst, &r);
        dt_counters_t cnt;
        DT_ASSERT_OK(dt_counters_get(mesh, &cnt));
        static const dt_collective_t colls[4] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_REDUCE,
                                                 DT_COLL_REDUCE_SCATTER, DT_COLL_ALL_TO_ALL};
        for (int c = 0; c < 4; c++) {
          int want;
          DT_ASSERT_OK(dt_plan_count(plan, colls[c], &want));
          DT_ASSERT_EQ(cnt.calls[colls[c]], want);
        }
        dt_placement_t chk[4];
        DT_ASSERT_OK(dt_tensor_placements(r, chk));
        for (int i = 0; i < m; i++) DT_ASSERT_TRUE(dt_placement_equal(chk[i], dst[i]), "placement");
        memset(got, 0x5a, (size_t)n * item);
        DT_ASSERT_OK(dt_tensor_gather_full(r, got, (size_t)n * item));
        if (memcmp(got, ref, (size_t)n * item) != 0) {
          char ps[64], pd[64], pl[256];
          dt_placements_format(src, m, ",", ps, sizeof ps);
          dt_placements_format(dst, m, ",", pd, sizeof pd);
          dt_plan_format(plan, pl, sizeof pl);
          DT_ASSERT_TRUE(0, "%s: dtype %s shape (%lld,%lld,%lld) %s -> %s via %s: wrong full tensor",
                         kModeNames[g_mode], dt_dtype_name(dt), (long long)shape[0],
                         (long long)shape[1], tdim == 3 ? (long long)shape[2] : 1LL, ps, pd, pl);
        }
        if (g_mode == MODE_A2A)
          for (int k = 0, ns = 0; dt_plan_num_steps(plan, &ns) == DT_SUCCESS && k < ns; k++) {
            dt_plan_step_t st;
            DT_ASSERT_OK(dt_plan_get_step(plan, k, &st));
            if (st.coll == DT_COLL_ALL_REDUCE || st.coll == DT_COLL_REDUCE_SCATTER)
              DT_ASSERT_TRUE(st.algo == DT_ALGO_A2A, "forced a2a: step %d is %s", k,
                             dt_coll_algo_name(st.algo));
          }
        DT_ASSERT_OK(dt_plan_destroy(plan));
        DT_ASSERT_OK(dt_tensor_destroy(r));
        checked++;
      }
      DT_ASSERT_OK(dt_tensor_destroy(t));
    }
    free(ref);
    free(got);
  }
  return checked;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  int shapes[4][4], nd[4], nm = 0;
  if (world == 2) { nd[nm] = 1; shapes[nm][0] = 2; nm++; }
  if (world == 4) {
    nd[nm] = 1; shapes[nm][0] = 4; nm++;
    nd[nm] = 2; shapes[nm][0] = 2; shapes[nm][1] = 2; nm++;
  }
  if (world == 8) {
    nd[nm] = 1; shapes[nm][0] = 8; nm++;
    nd[nm] = 3; shapes[nm][0] = 2; shapes[nm][1] = 2; shapes[nm][2] = 2; nm++;
    nd[nm] = 2; shapes[nm][0] = 2; shapes[nm][1] = 4; nm++;
  }
  DT_ASSERT_TRUE(nm > 0, "run at np 2, 4 or 8 (got %d)", world);
  long long total = 0;
  for (int mode = 0; mode < MODE_COUNT; mode++)
  for (int k = 0; k < nm; k++) {
    g_mode = mode;
    DT_ASSERT_OK(dt_cost_model_force_algo(mode == MODE_A2A ? DT_ALGO_A2A : DT_ALGO_COUNT));
    dt_mesh_t mesh;
    DT_ASSERT_OK(dt_mesh_create(nd[k], shapes[k], NULL, NULL, &mesh));
    total += run_mesh(mesh, nd[k], DT_F32, 1, 2, SHAPES(kShapes));
    if (nd[k] <= 2) total += run_mesh(mesh, nd[k], DT_F32, 1, 3, SHAPES(kShapes3));
    if (nd[k] > 1) { /* flattened: merged collectives */
      int dims[4] = {0, 1, 2, 3};
      DT_ASSERT_OK(dt_mesh_flatten(mesh, nd[k], dims, "all", NULL));
      if (nd[k] == 3) DT_ASSERT_OK(dt_mesh_flatten(mesh, 2, dims + 1, "inner", NULL));
      total += run_mesh(mesh, nd[k], DT_F32, 2, 2, SHAPES(kShapes));
    }
    if (k == 0) {
      total += run_mesh(mesh, nd[k], DT_I32, 2, 2, SHAPES(kShapes));
      total += run_mesh(mesh, nd[k], DT_I64, 3, 2, SHAPES(kShapes));
      total += run_mesh(mesh, nd[k], DT_BF16, 3, 2, SHAPES(kShapes));
      total += run_mesh(mesh, nd[k], DT_BF16, 2, 3, SHAPES(kShapes3));
      total += run_mesh(mesh, nd[k], DT_F32, 1, 2, SHAPES(kShapesM));
    }
    DT_ASSERT_OK(dt_mesh_destroy(mesh));
  }
  if (rank == 0)
    printf("test_exhaustive np=%d: %lld redistributions checked (blocking, async, forced a2a)\n",
           world, total);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* test_tensor_api.c - distributed tensor construction and mesh features under MPI (np 2, 4, 8).
 *
 * Expected shards are computed in the test from the chunk rule, independently of the library's
 * box code: distribute from every source rank, from_full, from_local (borrowing and shape checks),
 * factories (values independent of the placement, random tensors identical across meshes),
 * mesh accessors, slicing, flattening, meshes over part of the world, visualize. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>

#include "dt_test.h"

static int g_rank, g_world;

/* Independent expected box: apply the chunk rule per sharded mesh dim, in mesh order. */
static void expect_box(int m, const int* mshape, const int* coords, const dt_placement_t* pl,
                       int nd, const int64_t* shape, int64_t* off, int64_t* len) {
  for (int d = 0; d < nd; d++) {
    off[d] = 0;
    len[d] = shape[d];
  }
  for (int i = 0; i < m; i++) {
    if (pl[i].kind != DT_SHARD) continue;
    int d = pl[i].dim < 0 ? pl[i].dim + nd : pl[i].dim;
    int64_t o, l;
    DT_ASSERT_OK(dt_chunk(len[d], mshape[i], coords[i], &o, &l));
    off[d] += o;
    len[d] = l;
  }
}

static float ref(int64_t i) { return (float)((i * 5 + 1) % 13) - 6.0f; }

/* Checks t's local shard against the reference box (Partial dims: the shard sums to ref). */
static void check_local(dt_tensor_t t, dt_mesh_t mesh, const float* full, int nd,
                        const int64_t* shape) {
  int m, mshape[4], coords[4];
  dt_placement_t pl[4];
  DT_ASSERT_OK(dt_mesh_ndim(mesh, &m));
  DT_ASSERT_OK(dt_mesh_shape(mesh, mshape));
  DT_ASSERT_OK(dt_mesh_coordinate(mesh, coords));
  DT_ASSERT_OK(dt_tensor_placements(t, pl));
  int64_t off[8], len[8], lshape[8], loff[8];
  expect_box(m, mshape, coords, pl, nd, shape, off, len);
  void* data;
  DT_ASSERT_OK(dt_tensor_to_local(t, &data, lshape));
  DT_ASSERT_OK(dt_tensor_local_offset(t, loff));
  double scale = 1.0;
  for (int i = 0; i < m; i++)
    if (pl[i].kind == DT_PARTIAL) scale /= mshape[i];
  for (int d = 0; d < nd; d++) {
    DT_ASSERT_EQ(lshape[d], len[d]);
    if (len[d] > 0) DT_ASSERT_EQ(loff[d], off[d]);
  }
  const float* x = (const float*)data;
  int64_t idx[8] = {0}, n = 1;
  for (int d = 0; d < nd; d++) n *= len[d];
  for (int64_t k = 0; k < n; k++) {
    int64_t g = 0;
    for (int d = 0; d < nd; d++) g = g * shape[d] + off[d] + idx[d];
    DT_ASSERT_TRUE(x[k] == (float)(full[g] * scale), "element %lld: %g vs %g", (long long)k,
                   x[k], full[g] * scale);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
}

static void test_distribute(dt_mesh_t mesh, int m) {
  const int64_t shapes[][2] = {{13, 3}, {5, 4}, {1, 7}, {0, 2}};
  for (int s = 0; s < 4; s++) {
    int64_t n = shapes[s][0] * shapes[s][1];
    float* full = malloc(sizeof(float) * (size_t)(n + 1));
    float* back = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) full[i] = ref(i);
    int npl = m == 1 ? 4 : 16;
    for (int a = 0; a < npl; a++) {
      dt_placement_t pl[2];
      for (int i = 0, v = a; i < m; i++, v /= 4) {
        int k = v % 4;
        pl[i] = k == 0 ? dt_replicate() : k == 1 ? dt_shard(0) : k == 2 ? dt_shard(-1)
                                                                        : dt_partial(DT_REDUCE_SUM);
      }
      for (int src = 0; src < g_world; src++) {
        dt_tensor_t t;
        DT_ASSERT_OK(dt_tensor_distribute(mesh, DT_F32, 2, shapes[s], pl,
                                          g_rank == src ? full : NULL, src, &t));
        check_local(t, mesh, full, 2, shapes[s]);
        memset(back, 0, sizeof(float) * (size_t)(n + 1));
        DT_ASSERT_OK(dt_tensor_gather_full(t, back, sizeof(float) * (size_t)n));
        DT_ASSERT_TRUE(memcmp(back, full, sizeof(float) * (size_t)n) == 0, "full after distribute");
        DT_ASSERT_OK(dt_tensor_destroy(t));
      }
      dt_tensor_t f;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, shapes[s], pl, full, &f));
      check_local(f, mesh, full, 2, shapes[s]);
      /* from_local over the same shard borrows the buffer */
      void* data;
      int64_t lshape[2];
      DT_ASSERT_OK(dt_tensor_to_local(f, &data, lshape));
      dt_tensor_t l;
      DT_ASSERT_OK(dt_tensor_from_local(mesh, DT_F32, 2, shapes[s], pl, data, lshape, &l));
      void* ldata;
      DT_ASSERT_OK(dt_tensor_to_local(l, &ldata, NULL));
      DT_ASSERT_TRUE(ldata == data, "from_local must borrow, not copy");
      DT_ASSERT_OK(dt_tensor_gather_full(l, back, sizeof(float) * (size_t)n));
      DT_ASSERT_TRUE(memcmp(back, full, sizeof(float) * (size_t)n) == 0, "full after from_local");
      DT_ASSERT_OK(dt_tensor_destroy(l));
      DT_ASSERT_OK(dt_tensor_destroy(f));
    }
    free(full);
    free(back);
  }
}

static void test_from_local_checks(dt_mesh_t mesh) {
  int n;
  DT_ASSERT_OK(dt_mesh_size(mesh, 0, &n));
  dt_placement_t pl[1] = {dt_shard(0)};
  int64_t gshape[2] = {4 * n + 1, 2}; /* uneven */
  int64_t off, len;
  int coord;
  DT_ASSERT_OK(dt_mesh_local_rank(mesh, 0, &coord));
  DT_ASSERT_OK(dt_chunk(gshape[0], n, coord, &off, &len));
  float buf[64] = {0};
  int64_t good[2] = {len, 2}, wrong[2] = {len + 1, 2};
  dt_tensor_t t = NULL;
  DT_ASSERT_STATUS(dt_tensor_from_local(mesh, DT_F32, 2, gshape, pl, buf, wrong, &t),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(t == NULL, "out must be NULL");
  char want[64];
  snprintf(want, sizeof want, "gives this rank [%lld, 2]", (long long)len);
  DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "message '%s' lacks '%s'",
                 dt_last_error(), want);
  DT_ASSERT_OK(dt_tensor_from_local(mesh, DT_F32, 2, gshape, pl, buf, good, &t));
  DT_ASSERT_OK(dt_tensor_destroy(t));
  /* global shape inferred: uneven shards make ranks disagree -> error on every rank */
  DT_ASSERT_STATUS(dt_tensor_from_local(mesh, DT_F32, 2, NULL, pl, buf, good, &t),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "uneven") != NULL, "%s", dt_last_error());
  /* even: inference works */
  int64_t even[2] = {3, 2};
  DT_ASSERT_OK(dt_tensor_from_local(mesh, DT_F32, 2, NULL, pl, buf, even, &t));
  int64_t gs[2];
  DT_ASSERT_OK(dt_tensor_shape(t, gs));
  DT_ASSERT_EQ(gs[0], 3 * n);
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

static void test_factories(dt_mesh_t mesh1, dt_mesh_t mesh2) {
  int64_t shape[2] = {7, 9};
  int64_t n = 63;
  float a[63], b[63];
  dt_placement_t p1[4][1] = {{dt_replicate()}, {dt_shard(0)}, {dt_shard(1)},
                             {dt_partial(DT_REDUCE_SUM)}};
  for (int k = 0; k < 4; k++) {
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_arange(mesh1, DT_F32, 2, shape, p1[k], 3.0, 2.0, &t));
    DT_ASSERT_OK(dt_tensor_gather_full(t, a, sizeof a));
    for (int64_t i = 0; i < n; i++) DT_ASSERT_TRUE(a[i] == 3.0f + 2.0f * i, "arange %lld", (long long)i);
    DT_ASSERT_OK(dt_tensor_destroy(t));
    DT_ASSERT_OK(dt_tensor_ones(mesh1, DT_F32, 2, shape, p1[k], &t));
    DT_ASSERT_OK(dt_tensor_gather_full(t, a, sizeof a));
    for (int64_t i = 0; i < n; i++) DT_ASSERT_TRUE(a[i] == 1.0f, "ones");
    DT_ASSERT_OK(dt_tensor_destroy(t));
    DT_ASSERT_OK(dt_tensor_full_value(mesh1, DT_F32, 2, shape, p1[k], -2.5, &t));
    DT_ASSERT_OK(dt_tensor_gather_full(t, a, sizeof a));
    for (int64_t i = 0; i < n; i++) DT_ASSERT_TRUE(a[i] == -2.5f, "full_value");
    DT_ASSERT_OK(dt_tensor_destroy(t));
    DT_ASSERT_OK(dt_tensor_zeros(mesh1, DT_F32, 2, shape, p1[k], &t));
    DT_ASSERT_OK(dt_tensor_gather_full(t, a, sizeof a));
    for (int64_t i = 0; i < n; i++) DT_ASSERT_TRUE(a[i] == 0.0f, "zeros");
    DT_ASSERT_OK(dt_tensor_destroy(t));
    /* integer arange with Partial(sum): exact */
    int32_t ia[63];
    DT_ASSERT_OK(dt_tensor_arange(mesh1, DT_I32, 2, shape, p1[k], -5.0, 1.0, &t));
    DT_ASSERT_OK(dt_tensor_gather_full(t, ia, sizeof ia));
    for (int64_t i = 0; i < n; i++) DT_ASSERT_EQ(ia[i], -5 + i);
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }
  /* rand / randn: same seed -> same global tensor under every placement and mesh */
  for (int which = 0; which < 2; which++) {
    dt_tensor_t t;
    float first[63];
    for (int k = 0; k < 3; k++) {
      if (which == 0) DT_ASSERT_OK(dt_tensor_rand(mesh1, DT_F32, 2, shape, p1[k], 42, &t));
      else DT_ASSERT_OK(dt_tensor_randn(mesh1, DT_F32, 2, shape, p1[k], 42, &t));
      DT_ASSERT_OK(dt_tensor_gather_full(t, k == 0 ? first : a, sizeof a));
      DT_ASSERT_OK(dt_tensor_destroy(t));
      if (k > 0) DT_ASSERT_TRUE(memcmp(first, a, sizeof a) == 0, "rand differs by placement");
    }
    if (mesh2 != NULL) {
      dt_placement_t p2[2] = {dt_shard(1), dt_shard(0)};
      if (which == 0) DT_ASSERT_OK(dt_tensor_rand(mesh2, DT_F32, 2, shape, p2, 42, &t));
      else DT_ASSERT_OK(dt_tensor_randn(mesh2, DT_F32, 2, shape, p2, 42, &t));
      DT_ASSERT_OK(dt_tensor_gather_full(t, a, sizeof a));
      DT_ASSERT_OK(dt_tensor_destroy(t));
      DT_ASSERT_TRUE(memcmp(first, a, sizeof a) == 0, "rand differs by mesh");
    }
    if (which == 0) DT_ASSERT_OK(dt_tensor_rand(mesh1, DT_F32, 2, shape, p1[0], 43, &t));
    else DT_ASSERT_OK(dt_tensor_randn(mesh1, DT_F32, 2, shape, p1[0], 43, &t));
    DT_ASSERT_OK(dt_tensor_gather_full(t, b, sizeof b));
    DT_ASSERT_OK(dt_tensor_destroy(t));
    DT_ASSERT_TRUE(memcmp(first, b, sizeof b) != 0, "different seeds must differ");
    if (which == 0)
      for (int i = 0; i < 63; i++) DT_ASSERT_TRUE(first[i] >= 0.0f && first[i] < 1.0f, "range");
  }
  /* randn moments over 10^4 samples */
  int64_t big[1] = {10000};
  dt_placement_t s0[1] = {dt_shard(0)};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_randn(mesh1, DT_F32, 1, big, s0, 7, &t));
  float* z = malloc(sizeof(float) * 10000);
  DT_ASSERT_OK(dt_tensor_gather_full(t, z, sizeof(float) * 10000));
  double mean = 0, var = 0;
  for (int i = 0; i < 10000; i++) mean += z[i];
  mean /= 10000;
  for (int i = 0; i < 10000; i++) var += (z[i] - mean) * (z[i] - mean);
  var /= 10000;
  DT_ASSERT_TRUE(fabs(mean) < 0.05 && fabs(var - 1.0) < 0.08, "randn mean %g var %g", mean, var);
  free(z);
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

static void test_mesh_features(void) {
  if (g_world < 4) return;
  int shape[2] = {2, g_world / 2};
  const char* names[2] = {"dp", "tp"};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(2, shape, names, NULL, &mesh));
  int c[2], wr;
  DT_ASSERT_OK(dt_mesh_coordinate(mesh, c));
  DT_ASSERT_EQ(c[0] * shape[1] + c[1], g_rank);
  DT_ASSERT_OK(dt_mesh_rank_at(mesh, c, &wr));
  DT_ASSERT_EQ(wr, g_rank);
  int d;
  DT_ASSERT_OK(dt_mesh_dim_index(mesh, "tp", &d));
  DT_ASSERT_EQ(d, 1);
  const char* nm;
  DT_ASSERT_OK(dt_mesh_dim_name(mesh, -1, &nm));
  DT_ASSERT_TRUE(strcmp(nm, "tp") == 0, "name");
  /* slice: the tp sub-mesh of this rank's dp row */
  const char* tp[1] = {"tp"};
  dt_mesh_t sub;
  DT_ASSERT_OK(dt_mesh_slice(mesh, 1, tp, &sub));
  int sz, sc, sr;
  DT_ASSERT_OK(dt_mesh_size(sub, 0, &sz));
  DT_ASSERT_EQ(sz, shape[1]);
  DT_ASSERT_OK(dt_mesh_local_rank(sub, 0, &sc));
  DT_ASSERT_EQ(sc, c[1]);
  int zero = 0;
  DT_ASSERT_OK(dt_mesh_rank_at(sub, &zero, &sr));
  DT_ASSERT_EQ(sr, c[0] * shape[1]);
  /* a redistribute on the sub-mesh only talks within the row */
  int64_t ts[1] = {10};
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_arange(sub, DT_F32, 1, ts, s0, 100.0 * c[0], 1.0, &x));
  DT_ASSERT_OK(dt_tensor_redistribute(x, r, &y));
  float got[10];
  DT_ASSERT_OK(dt_tensor_gather_full(y, got, sizeof got));
  for (int i = 0; i < 10; i++) DT_ASSERT_TRUE(got[i] == 100.0f * c[0] + i, "sub-mesh data");
  /* the deprecated older name still gathers the same values */
  float old[10] = {0};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  DT_ASSERT_OK(dt_tensor_full(y, old, sizeof old));
#pragma GCC diagnostic pop
  for (int i = 0; i < 10; i++) DT_ASSERT_TRUE(old[i] == got[i], "dt_tensor_full [%d]", i);
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_mesh_destroy(sub));
  /* flatten: 1-D mesh of all ranks, row-major coordinate; registered in the parent */
  int both[2] = {0, 1};
  dt_mesh_t flat;
  DT_ASSERT_OK(dt_mesh_flatten(mesh, 2, both, "dp_tp", &flat));
  int fn, fc;
  DT_ASSERT_OK(dt_mesh_numel(flat, &fn));
  DT_ASSERT_EQ(fn, g_world);
  DT_ASSERT_OK(dt_mesh_local_rank(flat, 0, &fc));
  DT_ASSERT_EQ(fc, g_rank);
  const char* fname[1] = {"dp_tp"};
  dt_mesh_t flat2;
  DT_ASSERT_OK(dt_mesh_slice(mesh, 1, fname, &flat2)); /* slicing by the flattened name */
  DT_ASSERT_OK(dt_mesh_numel(flat2, &fn));
  DT_ASSERT_EQ(fn, g_world);
  DT_ASSERT_OK(dt_mesh_destroy(flat2));
  /* a merged all-gather on the parent after flattening */
  int64_t ts2[2] = {9, 4};
  dt_placement_t ss[2] = {dt_shard(0), dt_shard(0)}, rr[2] = {dt_replicate(), dt_replicate()};
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, ts2, ss, 0.0, 1.0, &x));
  DT_ASSERT_OK(dt_counters_reset(mesh));
  DT_ASSERT_OK(dt_tensor_redistribute(x, rr, &y));
  dt_counters_t cnt;
  DT_ASSERT_OK(dt_counters_get(mesh, &cnt));
  /* (2,2): one merged all-gather is cheaper; (2,4): under the hop-latency model two separate
   * gathers are (4 hops against 7). Whatever the plan says must be what ran. */
  dt_plan_t plan;
  DT_ASSERT_OK(dt_plan_create(mesh, DT_F32, 2, ts2, ss, rr, &plan));
  int nsteps, merged = 0, ag;
  DT_ASSERT_OK(dt_plan_num_steps(plan, &nsteps));
  for (int k = 0; k < nsteps; k++) {
    dt_plan_step_t st;
    DT_ASSERT_OK(dt_plan_get_step(plan, k, &st));
    merged += st.n_mesh_dims > 1;
  }
  DT_ASSERT_OK(dt_plan_count(plan, DT_COLL_ALL_GATHER, &ag));
  DT_ASSERT_OK(dt_plan_destroy(plan));
  if (g_world == 4) DT_ASSERT_EQ(merged, 1);
  DT_ASSERT_EQ(cnt.calls[DT_COLL_ALL_GATHER], ag);
  DT_ASSERT_EQ(cnt.flat_calls[DT_COLL_ALL_GATHER], merged);
  float g2[36];
  DT_ASSERT_OK(dt_tensor_gather_full(y, g2, sizeof g2));
  for (int i = 0; i < 36; i++) DT_ASSERT_TRUE(g2[i] == (float)i, "merged all-gather data");
  /* visualize: one line per rank with its ranges */
  FILE* f = tmpfile();
  DT_ASSERT_OK(dt_tensor_visualize(x, f));
  rewind(f);
  char line[256];
  int lines = 0, found = 0;
  char mine[64];
  int64_t off, len;
  dt_chunk(9, shape[0], c[0], &off, &len);
  int64_t off2, len2;
  dt_chunk(len, shape[1], c[1], &off2, &len2);
  snprintf(mine, sizeof mine, "rank %3d coord (%d,%d): [%lld:%lld, 0:4]", g_rank, c[0], c[1],
           (long long)(off + off2), (long long)(off + off2 + len2));
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "coord (")) lines++;
    if (strstr(line, mine)) found = 1;
  }
  fclose(f);
  DT_ASSERT_EQ(lines, g_world);
  DT_ASSERT_TRUE(found, "visualize lacks '%s'", mine);
  DT_ASSERT_OK(dt_tensor_destroy(x));
  /* the mesh may be destroyed before its tensors: they keep it alive */
  DT_ASSERT_OK(dt_mesh_destroy(flat));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_tensor_gather_full(y, g2, sizeof g2));
  DT_ASSERT_OK(dt_tensor_destroy(y));
}

static void test_partial_world(void) {
  /* A mesh over ranks 1..world-1 (reversed order); rank 0 is not a member. */
  int n = g_world - 1;
  int ranks[8];
  for (int i = 0; i < n; i++) ranks[i] = g_world - 1 - i;
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &n, NULL, ranks, &mesh));
  int member;
  DT_ASSERT_OK(dt_mesh_is_member(mesh, &member));
  DT_ASSERT_EQ(member, g_rank != 0);
  int64_t ts[1] = {7};
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 1, ts, s0, 0.0, 1.0, &x));
  int64_t ln;
  DT_ASSERT_OK(dt_tensor_local_numel(x, &ln));
  if (!member) DT_ASSERT_EQ(ln, 0);
  DT_ASSERT_OK(dt_tensor_redistribute(x, r, &y));
  if (member) {
    float got[7];
    DT_ASSERT_OK(dt_tensor_gather_full(y, got, sizeof got));
    for (int i = 0; i < 7; i++) DT_ASSERT_TRUE(got[i] == (float)i, "partial-world data");
    int c;
    DT_ASSERT_OK(dt_mesh_local_rank(mesh, 0, &c));
    DT_ASSERT_EQ(c, g_world - 1 - g_rank);
  } else {
    int c;
    DT_ASSERT_STATUS(dt_mesh_local_rank(mesh, 0, &c), DT_ERR_INVALID_USAGE);
  }
  /* dt_tensor_item: the value on the members, NaN (not stack garbage) on rank 0 */
  dt_tensor_t one;
  DT_ASSERT_OK(dt_tensor_full_value(mesh, DT_F32, 0, NULL, r, 4.5, &one));
  double v = 0;
  DT_ASSERT_OK(dt_tensor_item(one, &v));
  DT_ASSERT_TRUE(member ? v == 4.5 : isnan(v), "item %g on a %smember", v, member ? "" : "non-");
  DT_ASSERT_OK(dt_tensor_destroy(one));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* dt_tensor_item: a one-element tensor of every dtype read as a double (a Partial(sum) one
 * reduced first); more than one element refused on every rank; a bf16 value is the bf16
 * rounding of the f32 one, not its raw bytes. */
static void test_item(dt_mesh_t mesh) {
  const dt_dtype_t dts[5] = {DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64};
  const double want[5] = {-2.5, 3.0, 0.75, -7.0, 123456789.0};
  dt_placement_t r = dt_replicate(), p = dt_partial(DT_REDUCE_SUM);
  for (int i = 0; i < 5; i++) {
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_full_value(mesh, dts[i], 0, NULL, &r, want[i], &t));
    double v = 0;
    DT_ASSERT_OK(dt_tensor_item(t, &v));
    DT_ASSERT_TRUE(v == want[i], "%s item %g, want %g", dt_dtype_name(dts[i]), v, want[i]);
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }
  const int64_t one[1] = {1}, two[1] = {2};
  float part = (float)(g_rank + 1);
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_local(mesh, DT_F32, 1, one, &p, &part, one, &t));
  double v = 0;
  DT_ASSERT_OK(dt_tensor_item(t, &v));
  DT_ASSERT_TRUE(v == g_world * (g_world + 1) / 2.0, "Partial item %g", v);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 1, two, &r, &t));
  DT_ASSERT_STATUS(dt_tensor_item(t, &v), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dt_tensor_item: t has 2 elements") != NULL,
                 "message: %s", dt_last_error());
  DT_ASSERT_STATUS(dt_tensor_item(t, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  dt_mesh_t m1, m2 = NULL;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &m1));
  test_distribute(m1, 1);
  test_from_local_checks(m1);
  if (g_world >= 4 && g_world % 2 == 0) {
    int s[2] = {2, g_world / 2};
    DT_ASSERT_OK(dt_mesh_create(2, s, NULL, NULL, &m2));
    test_distribute(m2, 2);
  }
  test_factories(m1, m2);
  test_mesh_features();
  test_partial_world();
  test_item(m1);
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  if (g_rank == 0) printf("test_tensor_api np=%d: ok\n", g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

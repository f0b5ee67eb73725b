/* test_tensor_api.c - distributed tensor construction and mesh features (np 2, 4, 8).
 *
 * Every expectation is derived from the documented semantics, independently of the library:
 *   - local shards: the torch.chunk rule applied per sharded mesh dim in mesh-dim order, written
 *     out here (no dt_chunk, no library box code);
 *   - Partial(sum) from a replicated value: floats divided by the mesh-dim size, integers kept on
 *     coordinate 0 and zero elsewhere; avg/max/min keep the value;
 *   - factories: global element i is a function of i (and the seed) only.
 * Reference values are small integers so that every sum is exact in any order.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dt_test.h"

static int g_rank, g_world;
static long long g_checks;

#define MAXM 4

/* ---------------------------------------------------------------------------------------------
 * independent reference helpers */

static void ref_chunk(int64_t n, int parts, int r, int64_t* off, int64_t* len) {
  int64_t c = n / parts + (n % parts != 0);
  int64_t s = c * r, e = c * (r + 1);
  if (e > n) e = n;
  *len = e > s ? e - s : 0;
  *off = s < n ? s : n;
}

/* Box held at `coords`: chunk the current range of dim d once per mesh dim sharding it. */
static void ref_box(int m, const int* mshape, const int* coords, const dt_placement_t* pl, int nd,
                    const int64_t* shape, int64_t* off, int64_t* len) {
  for (int d = 0; d < nd; d++) {
    off[d] = 0;
    len[d] = shape[d];
  }
  for (int i = 0; i < m; i++) {
    if (pl[i].kind != DT_SHARD) continue;
    int d = pl[i].dim < 0 ? pl[i].dim + nd : pl[i].dim;
    int64_t o, l;
    ref_chunk(len[d], mshape[i], coords[i], &o, &l);
    off[d] += o;
    len[d] = l;
  }
}

static int is_float(dt_dtype_t dt) { return dt == DT_F32 || dt == DT_BF16 || dt == DT_F16; }

static size_t isz(dt_dtype_t dt) {
  return dt == DT_I64 ? 8 : (dt == DT_BF16 || dt == DT_F16) ? 2 : 4;
}

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * ldexp((double)m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * ldexp((double)(m + 1024), e - 25);
}

static double load(const void* p, dt_dtype_t dt, int64_t i) {
  switch (dt) {
    case DT_F32: return ((const float*)p)[i];
    case DT_I32: return ((const int32_t*)p)[i];
    case DT_I64: return (double)((const int64_t*)p)[i];
    case DT_BF16: {
      uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case DT_F16: return half_to_double(((const uint16_t*)p)[i]);
    default: return NAN;
  }
}

/* Stores v, which must be exactly representable in dt (the test only uses such values). */
static void store(void* p, dt_dtype_t dt, int64_t i, double v) {
  switch (dt) {
    case DT_F32: ((float*)p)[i] = (float)v; break;
    case DT_I32: ((int32_t*)p)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t*)p)[i] = (int64_t)v; break;
    case DT_BF16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      DT_ASSERT_TRUE((u & 0xffffu) == 0, "%g is not exact in bf16", v);
      ((uint16_t*)p)[i] = (uint16_t)(u >> 16);
      break;
    }
    default: DT_ASSERT_TRUE(0, "store: dtype %d", (int)dt);
  }
}

/* The current reference: value of global flat index i. */
typedef enum { REF_PATTERN, REF_CONST, REF_ARANGE } ref_kind_t;
typedef struct {
  ref_kind_t kind;
  double a, b;
  double group_offset; /* added to every value (sub-mesh groups get different data) */
} ref_t;

static double ref_value(const ref_t* r, int64_t i) {
  switch (r->kind) {
    case REF_PATTERN: return (double)((i * 37) % 29) - 14.0 + r->group_offset;
    case REF_CONST: return r->a + r->group_offset;
    default: return r->a + r->b * (double)i + r->group_offset;
  }
}

/* A description of a mesh as seen by this rank. */
typedef struct {
  dt_mesh_t m;
  int nd, shape[MAXM], coords[MAXM], member, numel;
} mdesc_t;

static mdesc_t describe(dt_mesh_t m) {
  mdesc_t d;
  memset(&d, 0, sizeof d);
  d.m = m;
  DT_ASSERT_OK(dt_mesh_ndim(m, &d.nd));
  DT_ASSERT_OK(dt_mesh_shape(m, d.shape));
  DT_ASSERT_OK(dt_mesh_is_member(m, &d.member));
  DT_ASSERT_OK(dt_mesh_numel(m, &d.numel));
  if (d.member) DT_ASSERT_OK(dt_mesh_coordinate(m, d.coords));
  return d;
}

/* What this rank's local element holds for a global value v under the placements. */
static double local_value(const mdesc_t* md, const dt_placement_t* pl, dt_dtype_t dt, double v) {
  for (int i = 0; i < md->nd; i++) {
    if (pl[i].kind != DT_PARTIAL || pl[i].op != DT_REDUCE_SUM || md->shape[i] == 1) continue;
    if (is_float(dt)) v /= md->shape[i];
    else if (md->coords[i] != 0) v = 0.0;
  }
  return v;
}

static const char* pl_str(const dt_placement_t* pl, int m) {
  static char buf[96];
  if (dt_placements_format(pl, m, ",", buf, sizeof buf) != DT_SUCCESS) snprintf(buf, sizeof buf, "?");
  return buf;
}

/* Checks t's local shard (extent, offset, values) against the reference box. */
static void check_local(dt_tensor_t t, const mdesc_t* md, const dt_placement_t* pl, int nd,
                        const int64_t* shape, dt_dtype_t dt, const ref_t* ref, const char* what) {
  int64_t lshape[DT_MAX_DIMS], loff[DT_MAX_DIMS], numel = -1;
  void* data = NULL;
  DT_ASSERT_OK(dt_tensor_to_local(t, &data, lshape));
  DT_ASSERT_OK(dt_tensor_local_offset(t, loff));
  DT_ASSERT_OK(dt_tensor_local_numel(t, &numel));
  g_checks++;
  if (!md->member) {
    DT_ASSERT_TRUE(numel == 0, "%s: non-member holds %lld elements", what, (long long)numel);
    return;
  }
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], n = 1;
  ref_box(md->nd, md->shape, md->coords, pl, nd, shape, off, len);
  for (int d = 0; d < nd; d++) {
    n *= len[d];
    DT_ASSERT_TRUE(lshape[d] == len[d], "%s %s: local extent of dim %d is %lld, expected %lld",
                   what, pl_str(pl, md->nd), d, (long long)lshape[d], (long long)len[d]);
    if (len[d] > 0)
      DT_ASSERT_TRUE(loff[d] == off[d], "%s %s: local offset of dim %d is %lld, expected %lld",
                     what, pl_str(pl, md->nd), d, (long long)loff[d], (long long)off[d]);
  }
  DT_ASSERT_EQ(numel, n);
  if (n > 0) DT_ASSERT_TRUE(data != NULL, "%s: NULL data for %lld elements", what, (long long)n);
  int64_t idx[DT_MAX_DIMS] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t g = 0;
    for (int d = 0; d < nd; d++) g = g * shape[d] + off[d] + idx[d];
    double want = local_value(md, pl, dt, ref_value(ref, g));
    if (dt == DT_F32) want = (float)want;
    double got = load(data, dt, k);
    if (got != want) {
      fprintf(stderr, "[rank %d] %s %s dtype %s: local[%lld] (global %lld) = %g, expected %g\n",
              g_rank, what, pl_str(pl, md->nd), dt_dtype_name(dt), (long long)k, (long long)g,
              got, want);
      dt_test_die();
    }
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
}

/* Full tensor equals the reference exactly (checked on mesh members). */
static void check_full(dt_tensor_t t, const mdesc_t* md, int nd, const int64_t* shape,
                       dt_dtype_t dt, const ref_t* ref, const char* what) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  size_t bytes = (size_t)n * isz(dt);
  unsigned char* buf = malloc(bytes + 16);
  memset(buf, 0x5a, bytes + 16);
  DT_ASSERT_OK(dt_tensor_gather_full(t, buf, bytes));
  g_checks++;
  if (md->member) {
    for (int64_t i = 0; i < n; i++) {
      double want = ref_value(ref, i);
      if (dt == DT_F32) want = (float)want;
      double got = load(buf, dt, i);
      if (got != want) {
        dt_placement_t pl[MAXM];
        DT_ASSERT_OK(dt_tensor_placements(t, pl));
        fprintf(stderr, "[rank %d] %s %s dtype %s: full[%lld] = %g, expected %g\n", g_rank, what,
                pl_str(pl, md->nd), dt_dtype_name(dt), (long long)i, got, want);
        dt_test_die();
      }
    }
  }
  for (int i = 0; i < 16; i++) DT_ASSERT_TRUE(buf[bytes + i] == 0x5a, "%s: wrote past out", what);
  free(buf);
}

static void check_meta(dt_tensor_t t, const mdesc_t* md, const dt_placement_t* pl, int nd,
                       const int64_t* shape, dt_dtype_t dt) {
  dt_dtype_t gd;
  int gnd;
  int64_t gs[DT_MAX_DIMS];
  dt_placement_t gp[MAXM];
  dt_mesh_t gm;
  DT_ASSERT_OK(dt_tensor_dtype(t, &gd));
  DT_ASSERT_EQ(gd, dt);
  DT_ASSERT_OK(dt_tensor_ndim(t, &gnd));
  DT_ASSERT_EQ(gnd, nd);
  DT_ASSERT_OK(dt_tensor_shape(t, gs));
  for (int d = 0; d < nd; d++) DT_ASSERT_EQ(gs[d], shape[d]);
  DT_ASSERT_OK(dt_tensor_placements(t, gp));
  for (int i = 0; i < md->nd; i++) {
    dt_placement_t want = pl[i];
    if (want.kind == DT_SHARD && want.dim < 0) want.dim += nd; /* normalized */
    DT_ASSERT_TRUE(dt_placement_equal(gp[i], want), "placement %d", i);
  }
  DT_ASSERT_OK(dt_tensor_mesh(t, &gm));
  DT_ASSERT_TRUE(gm == md->m, "tensor mesh differs");
  g_checks++;
}

static void fill_ref(void* buf, dt_dtype_t dt, int64_t n, const ref_t* ref) {
  for (int64_t i = 0; i < n; i++) store(buf, dt, i, ref_value(ref, i));
}

static const dt_placement_t k_basic[4] = {{DT_REPLICATE, 0, 0}, {DT_SHARD, 0, 0},
                                          {DT_SHARD, 1, 0}, {DT_PARTIAL, 0, DT_REDUCE_SUM}};

static void placements_from_index(int a, int m, const dt_placement_t* set, int nset,
                                  dt_placement_t* pl) {
  for (int i = 0; i < m; i++, a /= nset) pl[i] = set[a % nset];
}

static int ipow(int b, int e) {
  int r = 1;
  while (e-- > 0) r *= b;
  return r;
}

/* ---------------------------------------------------------------------------------------------
 * distribute and from_full */

static void test_distribute_from_full(const mdesc_t* md) {
  const int W = g_world;
  const int64_t shapes[5][2] = {{W + 1, 3}, {3, 2 * W + 1}, {1, 5}, {0, 3}, {2 * W, W}};
  const int m = md->nd, npl = ipow(4, m);
  ref_t ref = {REF_PATTERN, 0, 0, 0};
  for (int s = 0; s < 5; s++) {
    const int64_t* shape = shapes[s];
    int64_t n = shape[0] * shape[1];
    const dt_dtype_t dts[3] = {DT_F32, DT_I32, DT_BF16};
    int ndt = s == 0 ? 3 : 1;
    for (int k = 0; k < ndt; k++) {
      dt_dtype_t dt = dts[k];
      void* full = malloc((size_t)(n + 1) * 8);
      fill_ref(full, dt, n, &ref);
      for (int a = 0; a < npl; a++) {
        dt_placement_t pl[MAXM];
        placements_from_index(a, m, k_basic, 4, pl);
        /* every source rank on 1-D/2-D meshes for the first two shapes; a few otherwise */
        int srcs[64], ns = 0;
        if (s < 2 && m <= 2 && dt == DT_F32) {
          for (int r = 0; r < W; r++) srcs[ns++] = r;
        } else {
          srcs[ns++] = W - 1;
          if (s == 0) srcs[ns++] = W / 2;
        }
        for (int q = 0; q < ns; q++) {
          int src = srcs[q];
          dt_tensor_t t;
          DT_ASSERT_OK(dt_tensor_distribute(md->m, dt, 2, shape, pl, g_rank == src ? full : NULL,
                                            src, &t));
          check_meta(t, md, pl, 2, shape, dt);
          check_local(t, md, pl, 2, shape, dt, &ref, "distribute");
          check_full(t, md, 2, shape, dt, &ref, "distribute");
          DT_ASSERT_OK(dt_tensor_destroy(t));
        }
        dt_tensor_t t;
        DT_ASSERT_OK(dt_tensor_from_full(md->m, dt, 2, shape, pl, full, &t));
        check_meta(t, md, pl, 2, shape, dt);
        check_local(t, md, pl, 2, shape, dt, &ref, "from_full");
        check_full(t, md, 2, shape, dt, &ref, "from_full");
        DT_ASSERT_OK(dt_tensor_destroy(t));
      }
      free(full);
    }
  }
  /* 1-D and 3-D tensors; negative shard dims are normalized */
  const int64_t s1[1] = {2 * W + 3}, s3[3] = {W + 1, 2, 3};
  int64_t n1 = s1[0], n3 = s3[0] * s3[1] * s3[2];
  float* f1 = malloc(sizeof(float) * (size_t)n1);
  float* f3 = malloc(sizeof(float) * (size_t)n3);
  fill_ref(f1, DT_F32, n1, &ref);
  fill_ref(f3, DT_F32, n3, &ref);
  for (int a = 0; a < npl; a++) {
    dt_placement_t pl1[MAXM], pl3[MAXM];
    const dt_placement_t set1[4] = {dt_replicate(), dt_shard(0), dt_shard(-1),
                                    dt_partial(DT_REDUCE_SUM)};
    const dt_placement_t set3[4] = {dt_replicate(), dt_shard(-3), dt_shard(2),
                                    dt_partial(DT_REDUCE_SUM)};
    placements_from_index(a, m, set1, 4, pl1);
    placements_from_index(a, m, set3, 4, pl3);
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_distribute(md->m, DT_F32, 1, s1, pl1, g_rank == 0 ? f1 : NULL, 0, &t));
    check_meta(t, md, pl1, 1, s1, DT_F32);
    check_local(t, md, pl1, 1, s1, DT_F32, &ref, "distribute 1-d");
    check_full(t, md, 1, s1, DT_F32, &ref, "distribute 1-d");
    DT_ASSERT_OK(dt_tensor_destroy(t));
    DT_ASSERT_OK(dt_tensor_distribute(md->m, DT_F32, 3, s3, pl3, g_rank == 0 ? f3 : NULL, 0, &t));
    check_meta(t, md, pl3, 3, s3, DT_F32);
    check_local(t, md, pl3, 3, s3, DT_F32, &ref, "distribute 3-d");
    check_full(t, md, 3, s3, DT_F32, &ref, "distribute 3-d");
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }
  /* a 0-dim tensor (a scalar) under R and P(sum) */
  dt_placement_t rr[MAXM], pp[MAXM];
  for (int i = 0; i < m; i++) {
    rr[i] = dt_replicate();
    pp[i] = dt_partial(DT_REDUCE_SUM);
  }
  float scalar = 12.0f;
  ref_t sref = {REF_CONST, 12.0, 0, 0};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_distribute(md->m, DT_F32, 0, NULL, rr, g_rank == 0 ? &scalar : NULL, 0, &t));
  check_local(t, md, rr, 0, NULL, DT_F32, &sref, "scalar");
  check_full(t, md, 0, NULL, DT_F32, &sref, "scalar");
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_from_full(md->m, DT_F32, 0, NULL, pp, &scalar, &t));
  check_local(t, md, pp, 0, NULL, DT_F32, &sref, "scalar P");
  check_full(t, md, 0, NULL, DT_F32, &sref, "scalar P");
  DT_ASSERT_OK(dt_tensor_destroy(t));
  free(f1);
  free(f3);
}

/* ---------------------------------------------------------------------------------------------
 * from_local */

static void test_from_local(const mdesc_t* md) {
  const int W = g_world, m = md->nd, npl = ipow(4, m);
  const int64_t gshape[2] = {W + 1, 3};
  ref_t ref = {REF_PATTERN, 0, 0, 0};
  for (int a = 0; a < npl; a++) {
    dt_placement_t pl[MAXM];
    placements_from_index(a, m, k_basic, 4, pl);
    int64_t off[2], len[2];
    ref_box(m, md->shape, md->coords, pl, 2, gshape, off, len);
    /* Partial(sum): the rank at coordinate 0 of every Partial dim holds the value, others 0 */
    int holder = 1;
    for (int i = 0; i < m; i++)
      if (pl[i].kind == DT_PARTIAL && md->coords[i] != 0) holder = 0;
    float* buf = malloc(sizeof(float) * (size_t)(len[0] * len[1] + 1));
    for (int64_t r = 0; r < len[0]; r++)
      for (int64_t c = 0; c < len[1]; c++)
        buf[r * len[1] + c] =
            holder ? (float)ref_value(&ref, (off[0] + r) * gshape[1] + off[1] + c) : 0.0f;
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_from_local(md->m, DT_F32, 2, gshape, pl, buf, len, &t));
    check_meta(t, md, pl, 2, gshape, DT_F32);
    void* data;
    int64_t lshape[2];
    DT_ASSERT_OK(dt_tensor_to_local(t, &data, lshape));
    DT_ASSERT_EQ(lshape[0], len[0]);
    DT_ASSERT_EQ(lshape[1], len[1]);
    if (len[0] * len[1] > 0) DT_ASSERT_TRUE(data == (void*)buf, "from_local copied the buffer");
    check_full(t, md, 2, gshape, DT_F32, &ref, "from_local");
    DT_ASSERT_OK(dt_tensor_destroy(t));
    /* the caller's buffer survives the tensor (borrowed, not freed) */
    if (len[0] * len[1] > 0 && holder)
      DT_ASSERT_TRUE(buf[0] == (float)ref_value(&ref, off[0] * gshape[1] + off[1]), "buffer");
    free(buf);
  }
  /* borrowing: changes to the caller's buffer are visible through the tensor (1-D S(0)) */
  dt_placement_t s0[MAXM], r[MAXM];
  for (int i = 0; i < m; i++) {
    s0[i] = i == 0 ? dt_shard(0) : dt_replicate();
    r[i] = dt_replicate();
  }
  int64_t off[2], len[2];
  ref_box(m, md->shape, md->coords, s0, 2, gshape, off, len);
  int64_t n = gshape[0] * gshape[1];
  float* buf = malloc(sizeof(float) * (size_t)(len[0] * len[1] + 1));
  for (int64_t k = 0; k < len[0] * len[1]; k++)
    buf[k] = (float)ref_value(&ref, off[0] * gshape[1] + k);
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_local(md->m, DT_F32, 2, gshape, s0, buf, len, &t));
  if (len[0] > 0) buf[0] += 1000.0f;
  void* data;
  DT_ASSERT_OK(dt_tensor_to_local(t, &data, NULL));
  if (len[0] > 0) DT_ASSERT_TRUE(((float*)data)[0] == buf[0], "change not visible via to_local");
  float* got = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_OK(dt_tensor_gather_full(t, got, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++) {
    double want = ref_value(&ref, i);
    int64_t row = i / gshape[1], col = i % gshape[1];
    /* every rank bumped the first element of its box: box starts are at the chunk offsets */
    if (col == 0) {
      int64_t c = (gshape[0] + md->shape[0] - 1) / md->shape[0];
      if (row % c == 0) want += 1000.0;
    }
    DT_ASSERT_TRUE(got[i] == (float)want, "full[%lld] = %g, expected %g after the change",
                   (long long)i, got[i], want);
  }
  /* redistribute reads the caller's current values too */
  dt_tensor_t rt;
  DT_ASSERT_OK(dt_tensor_redistribute(t, r, &rt));
  void* rdata;
  DT_ASSERT_OK(dt_tensor_to_local(rt, &rdata, NULL));
  DT_ASSERT_TRUE(memcmp(rdata, got, sizeof(float) * (size_t)n) == 0, "redistribute of borrowed");
  DT_ASSERT_OK(dt_tensor_destroy(rt));
  DT_ASSERT_OK(dt_tensor_destroy(t));
  free(got);
  free(buf);
  /* NULL global shape: inferred as local size times the mesh size on each sharded dim */
  dt_placement_t pl[MAXM];
  for (int i = 0; i < m; i++) pl[i] = i == m - 1 ? dt_shard(1) : dt_shard(0);
  int64_t lsh[2] = {2, 3}, want[2] = {2, 3};
  for (int i = 0; i < m; i++) want[pl[i].dim] *= md->shape[i];
  float* lb = calloc(6, sizeof(float));
  DT_ASSERT_OK(dt_tensor_from_local(md->m, DT_F32, 2, NULL, pl, lb, lsh, &t));
  int64_t gs[2];
  DT_ASSERT_OK(dt_tensor_shape(t, gs));
  DT_ASSERT_EQ(gs[0], want[0]);
  DT_ASSERT_EQ(gs[1], want[1]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_from_local(md->m, DT_F32, 2, NULL, r, lb, lsh, &t));
  DT_ASSERT_OK(dt_tensor_shape(t, gs));
  DT_ASSERT_EQ(gs[0], 2);
  DT_ASSERT_EQ(gs[1], 3);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  free(lb);
}

/* ---------------------------------------------------------------------------------------------
 * factories */

static void test_factories(const mdesc_t* md) {
  const int W = g_world, m = md->nd;
  const dt_placement_t set[7] = {dt_replicate(), dt_shard(0), dt_shard(1),
                                 dt_partial(DT_REDUCE_SUM), dt_partial(DT_REDUCE_AVG),
                                 dt_partial(DT_REDUCE_MAX), dt_partial(DT_REDUCE_MIN)};
  int nset = m == 1 ? 7 : m == 2 ? 5 : 4;
  int npl = ipow(nset, m);
  const int64_t shape[2] = {W + 1, 3};
  const dt_dtype_t dts[4] = {DT_F32, DT_I32, DT_I64, DT_BF16};
  for (int k = 0; k < 4; k++) {
    dt_dtype_t dt = dts[k];
    for (int a = 0; a < npl; a++) {
      dt_placement_t pl[MAXM];
      placements_from_index(a, m, set, nset, pl);
      for (int f = 0; f < 4; f++) {
        dt_tensor_t t;
        ref_t ref;
        switch (f) {
          case 0:
            DT_ASSERT_OK(dt_tensor_zeros(md->m, dt, 2, shape, pl, &t));
            ref = (ref_t){REF_CONST, 0.0, 0, 0};
            break;
          case 1:
            DT_ASSERT_OK(dt_tensor_ones(md->m, dt, 2, shape, pl, &t));
            ref = (ref_t){REF_CONST, 1.0, 0, 0};
            break;
          case 2: {
            double v = is_float(dt) ? -2.5 : -7.0;
            DT_ASSERT_OK(dt_tensor_full_value(md->m, dt, 2, shape, pl, v, &t));
            ref = (ref_t){REF_CONST, v, 0, 0};
            break;
          }
          default: {
            double st = is_float(dt) ? -0.5 : -2.0;
            DT_ASSERT_OK(dt_tensor_arange(md->m, dt, 2, shape, pl, 3.0, st, &t));
            ref = (ref_t){REF_ARANGE, 3.0, st, 0};
            break;
          }
        }
        check_meta(t, md, pl, 2, shape, dt);
        check_local(t, md, pl, 2, shape, dt, &ref, "factory");
        check_full(t, md, 2, shape, dt, &ref, "factory");
        DT_ASSERT_OK(dt_tensor_destroy(t));
      }
    }
  }
  /* empty: right extents (values unspecified) */
  dt_placement_t pl[MAXM];
  placements_from_index(npl - 1, m, set, nset, pl);
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_empty(md->m, DT_F32, 2, shape, pl, &t));
  check_meta(t, md, pl, 2, shape, DT_F32);
  int64_t lshape[2], off[2], len[2];
  DT_ASSERT_OK(dt_tensor_local_shape(t, lshape));
  ref_box(m, md->shape, md->coords, pl, 2, shape, off, len);
  DT_ASSERT_EQ(lshape[0], len[0]);
  DT_ASSERT_EQ(lshape[1], len[1]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

/* ---------------------------------------------------------------------------------------------
 * rand / randn */

static void* full_of(dt_tensor_t t, size_t bytes) {
  void* b = malloc(bytes ? bytes : 1);
  DT_ASSERT_OK(dt_tensor_gather_full(t, b, bytes));
  return b;
}

static void test_random(dt_mesh_t m1, dt_mesh_t m2) {
  const int W = g_world;
  const int64_t shape[2] = {W + 3, 5};
  const int64_t n = shape[0] * shape[1];
  const dt_dtype_t dts[3] = {DT_F32, DT_BF16, DT_F16};
  for (int k = 0; k < 3; k++) {
    dt_dtype_t dt = dts[k];
    size_t bytes = (size_t)n * isz(dt);
    for (int normal = 0; normal < 2; normal++) {
      dt_status_t (*gen)(dt_mesh_t, dt_dtype_t, int, const int64_t*, const dt_placement_t*,
                         uint64_t, dt_tensor_t*) = normal ? dt_tensor_randn : dt_tensor_rand;
      const dt_placement_t p1[5][1] = {{dt_replicate()}, {dt_shard(0)}, {dt_shard(1)},
                                       {dt_partial(DT_REDUCE_MAX)}, {dt_partial(DT_REDUCE_MIN)}};
      dt_tensor_t t;
      DT_ASSERT_OK(gen(m1, dt, 2, shape, p1[0], 1234, &t));
      void* base = full_of(t, bytes);
      DT_ASSERT_OK(dt_tensor_destroy(t));
      for (int a = 1; a < 5; a++) {
        DT_ASSERT_OK(gen(m1, dt, 2, shape, p1[a], 1234, &t));
        void* other = full_of(t, bytes);
        DT_ASSERT_TRUE(memcmp(base, other, bytes) == 0, "%s %s: [%s] differs from [R]",
                       normal ? "randn" : "rand", dt_dtype_name(dt), pl_str(p1[a], 1));
        free(other);
        DT_ASSERT_OK(dt_tensor_destroy(t));
        g_checks++;
      }
      /* P(sum) holds value/n per rank: the reduced value equals the original (n is a power of
       * two), bit for bit on f32 */
      if (dt == DT_F32) {
        const dt_placement_t ps[1] = {dt_partial(DT_REDUCE_SUM)};
        DT_ASSERT_OK(gen(m1, dt, 2, shape, ps, 1234, &t));
        void* other = full_of(t, bytes);
        DT_ASSERT_TRUE(memcmp(base, other, bytes) == 0, "rand [P(sum)] differs from [R]");
        free(other);
        DT_ASSERT_OK(dt_tensor_destroy(t));
      }
      const dt_placement_t p2[4][2] = {{dt_shard(0), dt_shard(1)},
                                       {dt_shard(1), dt_shard(0)},
                                       {dt_replicate(), dt_shard(0)},
                                       {dt_shard(0), dt_shard(0)}};
      for (int a = 0; a < 4; a++) {
        DT_ASSERT_OK(gen(m2, dt, 2, shape, p2[a], 1234, &t));
        void* other = full_of(t, bytes);
        DT_ASSERT_TRUE(memcmp(base, other, bytes) == 0, "2-D [%s] differs from 1-D [R]",
                       pl_str(p2[a], 2));
        free(other);
        DT_ASSERT_OK(dt_tensor_destroy(t));
        g_checks++;
      }
      /* depends on the flat index only: a 1-D tensor of n elements holds the same values */
      int64_t flat[1] = {n};
      const dt_placement_t fs[1] = {dt_shard(0)};
      DT_ASSERT_OK(gen(m1, dt, 1, flat, fs, 1234, &t));
      void* other = full_of(t, bytes);
      DT_ASSERT_TRUE(memcmp(base, other, bytes) == 0, "shape (%lld) differs from (%lld,%lld)",
                     (long long)n, (long long)shape[0], (long long)shape[1]);
      free(other);
      DT_ASSERT_OK(dt_tensor_destroy(t));
      /* another seed gives other values */
      DT_ASSERT_OK(gen(m1, dt, 2, shape, p1[0], 1235, &t));
      other = full_of(t, bytes);
      int64_t same = 0;
      for (int64_t i = 0; i < n; i++) same += load(base, dt, i) == load(other, dt, i);
      DT_ASSERT_TRUE(same <= n / 4, "seeds 1234 and 1235 agree on %lld of %lld values",
                     (long long)same, (long long)n);
      free(other);
      DT_ASSERT_OK(dt_tensor_destroy(t));
      free(base);
    }
  }
}

/* f32 -> bf16 -> f32 through the cast op (the vectorized conversion loops of every bf16 run)
 * against a scalar round-to-nearest-even written here: every exponent and sign, ties both ways,
 * infinities, NaNs (quieted, payload kept in the top bits), subnormals; the count is not a
 * multiple of a vector's width (the loops' tails). */
static uint16_t bf16_ref(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  const uint32_t lo = u & 0xffffu, hi = u >> 16;
  return (uint16_t)(lo > 0x8000u || (lo == 0x8000u && (hi & 1u)) ? hi + 1 : hi);
}

static void test_cast_bf16_bits(dt_mesh_t m1) {
  const int64_t n = (1 << 16) + 37;
  uint32_t* u = malloc(sizeof(uint32_t) * (size_t)n);
  uint16_t* b = malloc(sizeof(uint16_t) * (size_t)n);
  float* back = malloc(sizeof(float) * (size_t)n);
  uint64_t s = 0x243f6a8885a308d3ull;
  for (int64_t i = 0; i < n; i++) { /* a stride through all 2^32 patterns, low bits random */
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    u[i] = (uint32_t)((uint64_t)i * 65536u) ^ (uint32_t)(s >> 48);
  }
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x7f7fffffu,
                              0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa12345u, 0x7f800001u,
                              0x00000001u, 0x807fffffu, 0x00000000u, 0x80000000u};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) u[i] = special[i];
  const dt_placement_t r[1] = {dt_replicate()};
  dt_tensor_t t, tb, tf;
  DT_ASSERT_OK(dt_tensor_from_full(m1, DT_F32, 1, &n, r, u, &t));
  const int64_t to_bf16[1] = {DT_BF16}, to_f32[1] = {DT_F32};
  DT_ASSERT_OK(dt_op_run("cast", 1, &t, 1, to_bf16, 0, NULL, &tb));
  DT_ASSERT_OK(dt_op_run("cast", 1, &tb, 1, to_f32, 0, NULL, &tf));
  DT_ASSERT_OK(dt_tensor_gather_full(tb, b, sizeof(uint16_t) * (size_t)n));
  DT_ASSERT_OK(dt_tensor_gather_full(tf, back, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++) {
    uint32_t w;
    memcpy(&w, &back[i], sizeof w);
    DT_ASSERT_TRUE(b[i] == bf16_ref(u[i]) && w == (uint32_t)b[i] << 16, "bits 0x%08x: bf16 0x%04x "
                   "(want 0x%04x), back 0x%08x", u[i], b[i], bf16_ref(u[i]), w);
  }
  g_checks += (int)n;
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_destroy(tb));
  DT_ASSERT_OK(dt_tensor_destroy(tf));
  free(u), free(b), free(back);
}

/* Moments over 10^4+ samples, sharded so that every rank generates part of them. */
static void test_random_moments(dt_mesh_t m1) {
  const int64_t shape[1] = {12000};
  const int64_t n = shape[0];
  const dt_placement_t s0[1] = {dt_shard(0)};
  const dt_dtype_t dts[3] = {DT_F32, DT_BF16, DT_F16};
  int range_failures = 0; /* reported after every dtype has been looked at */
  for (int k = 0; k < 3; k++) {
    dt_dtype_t dt = dts[k];
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_rand(m1, dt, 1, shape, s0, 99, &t));
    void* u = full_of(t, (size_t)n * isz(dt));
    DT_ASSERT_OK(dt_tensor_destroy(t));
    double sum = 0.0;
    int64_t below_half = 0, distinct_hint = 0, outside = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
      double x = load(u, dt, i);
      if (!(x >= 0.0 && x < 1.0)) {
        outside++;
        if (first < 0) first = i;
      }
      sum += x;
      below_half += x < 0.5;
      if (i > 0) distinct_hint += x != load(u, dt, i - 1);
    }
    double mean = sum / (double)n;
    DT_ASSERT_TRUE(fabs(mean - 0.5) < 0.02, "rand %s mean %g", dt_dtype_name(dt), mean);
    DT_ASSERT_TRUE(fabs((double)below_half / (double)n - 0.5) < 0.03, "rand %s: %lld below 0.5",
                   dt_dtype_name(dt), (long long)below_half);
    DT_ASSERT_TRUE(distinct_hint > n * 9 / 10, "rand %s: repeated values", dt_dtype_name(dt));
    if (outside > 0) {
      if (g_rank == 0)
        fprintf(stderr, "rand %s: %lld of %lld values outside [0, 1) (first: index %lld = %.9g)\n",
                dt_dtype_name(dt), (long long)outside, (long long)n, (long long)first,
                load(u, dt, first));
      range_failures++;
    }
    free(u);
    g_checks++;

    DT_ASSERT_OK(dt_tensor_randn(m1, dt, 1, shape, s0, 99, &t));
    void* z = full_of(t, (size_t)n * isz(dt));
    DT_ASSERT_OK(dt_tensor_destroy(t));
    double s1 = 0.0, s2 = 0.0;
    int64_t neg = 0;
    for (int64_t i = 0; i < n; i++) {
      double x = load(z, dt, i);
      DT_ASSERT_TRUE(isfinite(x) && fabs(x) < 7.0, "randn %s value %g", dt_dtype_name(dt), x);
      s1 += x;
      s2 += x * x;
      neg += x < 0.0;
    }
    double zmean = s1 / (double)n, var = s2 / (double)n - zmean * zmean;
    DT_ASSERT_TRUE(fabs(zmean) < 0.05, "randn %s mean %g", dt_dtype_name(dt), zmean);
    DT_ASSERT_TRUE(fabs(var - 1.0) < 0.08, "randn %s variance %g", dt_dtype_name(dt), var);
    DT_ASSERT_TRUE(fabs((double)neg / (double)n - 0.5) < 0.03, "randn %s: %lld negative",
                   dt_dtype_name(dt), (long long)neg);
    free(z);
    g_checks++;
  }
  DT_ASSERT_TRUE(range_failures == 0, "rand: %d dtype(s) gave values outside [0, 1)",
                 range_failures);
}

/* ---------------------------------------------------------------------------------------------
 * mesh accessors, slicing, flattening */

static int linear(int nd, const int* shape, const int* c) {
  int v = 0;
  for (int i = 0; i < nd; i++) v = v * shape[i] + c[i];
  return v;
}

static void unlinear(int nd, const int* shape, int v, int* c) {
  for (int i = nd - 1; i >= 0; i--) {
    c[i] = v % shape[i];
    v /= shape[i];
  }
}

/* A full-world mesh created without ranks: row-major world ranks. */
static void test_mesh_accessors(const mdesc_t* md, const char* const* names) {
  DT_ASSERT_EQ(md->numel, g_world);
  DT_ASSERT_EQ(md->member, 1);
  int prod = 1, v;
  for (int i = 0; i < md->nd; i++) prod *= md->shape[i];
  DT_ASSERT_EQ(prod, g_world);
  DT_ASSERT_OK(dt_mesh_is_abstract(md->m, &v));
  DT_ASSERT_EQ(v, 0);
  /* coordinates are the row-major position of the world rank */
  int want[MAXM];
  unlinear(md->nd, md->shape, g_rank, want);
  for (int i = 0; i < md->nd; i++) {
    DT_ASSERT_EQ(md->coords[i], want[i]);
    DT_ASSERT_OK(dt_mesh_local_rank(md->m, i, &v));
    DT_ASSERT_EQ(v, md->coords[i]);
    DT_ASSERT_OK(dt_mesh_local_rank(md->m, i - md->nd, &v)); /* negative dims */
    DT_ASSERT_EQ(v, md->coords[i]);
    DT_ASSERT_OK(dt_mesh_size(md->m, i, &v));
    DT_ASSERT_EQ(v, md->shape[i]);
    DT_ASSERT_OK(dt_mesh_size(md->m, i - md->nd, &v));
    DT_ASSERT_EQ(v, md->shape[i]);
  }
  DT_ASSERT_OK(dt_mesh_rank_at(md->m, md->coords, &v));
  DT_ASSERT_EQ(v, g_rank);
  /* rank_at is the row-major bijection onto the world */
  for (int p = 0; p < md->numel; p++) {
    int c[MAXM];
    unlinear(md->nd, md->shape, p, c);
    DT_ASSERT_OK(dt_mesh_rank_at(md->m, c, &v));
    DT_ASSERT_EQ(v, p);
  }
  /* every rank agrees on its coordinates: gather them and compare with rank_at */
  int* all = malloc(sizeof(int) * MAXM * (size_t)g_world);
  int mine[MAXM] = {0};
  memcpy(mine, md->coords, sizeof(int) * (size_t)md->nd);
  MPI_Allgather(mine, MAXM, MPI_INT, all, MAXM, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < g_world; r++) {
    DT_ASSERT_OK(dt_mesh_rank_at(md->m, all + MAXM * r, &v));
    DT_ASSERT_EQ(v, r);
  }
  free(all);
  /* names */
  for (int i = 0; i < md->nd; i++) {
    const char* nm = NULL;
    DT_ASSERT_OK(dt_mesh_dim_name(md->m, i, &nm));
    DT_ASSERT_TRUE(nm != NULL, "NULL name");
    DT_ASSERT_TRUE(strcmp(nm, names ? names[i] : "") == 0, "dim %d name '%s'", i, nm);
    DT_ASSERT_OK(dt_mesh_dim_name(md->m, i - md->nd, &nm));
    DT_ASSERT_TRUE(strcmp(nm, names ? names[i] : "") == 0, "dim %d name '%s'", i, nm);
    if (names) {
      DT_ASSERT_OK(dt_mesh_dim_index(md->m, names[i], &v));
      DT_ASSERT_EQ(v, i);
    }
  }
  g_checks++;
}

/* Redistributes on a (sub-)mesh whose data depends on `group`, so that a communicator that
 * spans the wrong ranks gives wrong values. */
static void redistribute_on(const mdesc_t* md, double group, const char* what) {
  const int64_t shape[2] = {2 * md->numel + 1, 3};
  int64_t n = shape[0] * shape[1];
  ref_t ref = {REF_PATTERN, 0, 0, 1000.0 * group};
  float* full = malloc(sizeof(float) * (size_t)n);
  fill_ref(full, DT_F32, n, &ref);
  dt_placement_t a[MAXM], b[MAXM], c[MAXM], r[MAXM];
  for (int i = 0; i < md->nd; i++) {
    a[i] = i == 0 ? dt_shard(0) : dt_shard(1);
    b[i] = i == md->nd - 1 ? dt_shard(0) : dt_replicate();
    c[i] = dt_partial(DT_REDUCE_SUM);
    r[i] = dt_replicate();
  }
  dt_tensor_t t, u, v, w;
  DT_ASSERT_OK(dt_tensor_from_full(md->m, DT_F32, 2, shape, a, full, &t));
  DT_ASSERT_OK(dt_tensor_redistribute(t, b, &u));
  check_local(u, md, b, 2, shape, DT_F32, &ref, what);
  check_full(u, md, 2, shape, DT_F32, &ref, what);
  DT_ASSERT_OK(dt_tensor_from_full(md->m, DT_F32, 2, shape, c, full, &v));
  DT_ASSERT_OK(dt_tensor_redistribute(v, r, &w));
  check_local(w, md, r, 2, shape, DT_F32, &ref, what);
  check_full(w, md, 2, shape, DT_F32, &ref, what);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_destroy(u));
  DT_ASSERT_OK(dt_tensor_destroy(v));
  DT_ASSERT_OK(dt_tensor_destroy(w));
  free(full);
}

/* slice keeps the named dims for this rank's other coordinates */
static void check_slice(const mdesc_t* parent, int nkeep, const int* keep, const char* const* names) {
  dt_mesh_t sm;
  DT_ASSERT_OK(dt_mesh_slice(parent->m, nkeep, names, &sm));
  mdesc_t sd = describe(sm);
  DT_ASSERT_EQ(sd.nd, nkeep);
  DT_ASSERT_EQ(sd.member, 1);
  int numel = 1, group = 0;
  for (int k = 0; k < nkeep; k++) {
    DT_ASSERT_EQ(sd.shape[k], parent->shape[keep[k]]);
    DT_ASSERT_EQ(sd.coords[k], parent->coords[keep[k]]);
    const char* nm;
    DT_ASSERT_OK(dt_mesh_dim_name(sm, k, &nm));
    DT_ASSERT_TRUE(strcmp(nm, names[k]) == 0, "slice dim %d name '%s'", k, nm);
    numel *= sd.shape[k];
  }
  DT_ASSERT_EQ(sd.numel, numel);
  for (int i = 0; i < parent->nd; i++) {
    int kept = 0;
    for (int k = 0; k < nkeep; k++) kept |= keep[k] == i;
    if (!kept) group = group * parent->shape[i] + parent->coords[i];
  }
  /* world ranks: the parent's, with the other coordinates fixed to mine */
  for (int p = 0; p < numel; p++) {
    int c[MAXM], pc[MAXM], a, b;
    unlinear(nkeep, sd.shape, p, c);
    memcpy(pc, parent->coords, sizeof pc);
    for (int k = 0; k < nkeep; k++) pc[keep[k]] = c[k];
    DT_ASSERT_OK(dt_mesh_rank_at(sm, c, &a));
    DT_ASSERT_OK(dt_mesh_rank_at(parent->m, pc, &b));
    DT_ASSERT_EQ(a, b);
  }
  redistribute_on(&sd, group, "slice");
  DT_ASSERT_OK(dt_mesh_destroy(sm));
  g_checks++;
}

/* flatten gives a 1-D mesh of the product size, coordinate row-major over the flattened dims */
static void check_flatten(const mdesc_t* parent, int ndims, const int* dims, const char* name) {
  dt_mesh_t fm;
  DT_ASSERT_OK(dt_mesh_flatten(parent->m, ndims, dims, name, &fm));
  mdesc_t fd = describe(fm);
  int size = 1, coord = 0, group = 0;
  for (int k = 0; k < ndims; k++) {
    size *= parent->shape[dims[k]];
    coord = coord * parent->shape[dims[k]] + parent->coords[dims[k]];
  }
  for (int i = 0; i < parent->nd; i++) {
    int kept = 0;
    for (int k = 0; k < ndims; k++) kept |= dims[k] == i;
    if (!kept) group = group * parent->shape[i] + parent->coords[i];
  }
  DT_ASSERT_EQ(fd.nd, 1);
  DT_ASSERT_EQ(fd.shape[0], size);
  DT_ASSERT_EQ(fd.numel, size);
  DT_ASSERT_EQ(fd.coords[0], coord);
  if (name != NULL) {
    const char* nm;
    DT_ASSERT_OK(dt_mesh_dim_name(fm, 0, &nm));
    DT_ASSERT_TRUE(strcmp(nm, name) == 0, "flattened name '%s'", nm);
  }
  int sub[MAXM];
  for (int k = 0; k < size; k++) {
    int pc[MAXM], a, b;
    memcpy(pc, parent->coords, sizeof pc);
    unlinear(ndims, (int[]){parent->shape[dims[0]], ndims > 1 ? parent->shape[dims[1]] : 1,
                            ndims > 2 ? parent->shape[dims[2]] : 1},
             k, sub);
    for (int j = 0; j < ndims; j++) pc[dims[j]] = sub[j];
    DT_ASSERT_OK(dt_mesh_rank_at(fm, &k, &a));
    DT_ASSERT_OK(dt_mesh_rank_at(parent->m, pc, &b));
    DT_ASSERT_EQ(a, b);
  }
  redistribute_on(&fd, group, "flatten");
  DT_ASSERT_OK(dt_mesh_destroy(fm));
  /* the flattened name now slices out the same 1-D mesh */
  if (name != NULL && ndims > 1) {
    const char* nm[1] = {name};
    DT_ASSERT_OK(dt_mesh_slice(parent->m, 1, nm, &fm));
    mdesc_t sd = describe(fm);
    DT_ASSERT_EQ(sd.nd, 1);
    DT_ASSERT_EQ(sd.shape[0], size);
    DT_ASSERT_EQ(sd.coords[0], coord);
    redistribute_on(&sd, group, "slice of flattened");
    DT_ASSERT_OK(dt_mesh_destroy(fm));
  }
  g_checks++;
}

static void test_slice_flatten(void) {
  const int W = g_world;
  /* (2, W/2) */
  {
    int shape[2] = {2, W / 2};
    const char* names[2] = {"dp", "tp"};
    dt_mesh_t m;
    DT_ASSERT_OK(dt_mesh_create(2, shape, names, NULL, &m));
    mdesc_t md = describe(m);
    test_mesh_accessors(&md, names);
    const char* n_tp[1] = {"tp"};
    const char* n_dp[1] = {"dp"};
    int k1[1] = {1}, k0[1] = {0}, k01[2] = {0, 1};
    check_slice(&md, 1, k1, n_tp);
    check_slice(&md, 1, k0, n_dp);
    check_slice(&md, 2, k01, names);
    check_flatten(&md, 1, k1, NULL);
    check_flatten(&md, 2, k01, "flat");
    /* the parent still redistributes correctly with the flattened dim registered, and merged
     * steps are counted under flat_* */
    const int64_t shape_t[2] = {2 * W + 1, 3};
    int64_t n = shape_t[0] * shape_t[1];
    ref_t ref = {REF_PATTERN, 0, 0, 0};
    float* full = malloc(sizeof(float) * (size_t)n);
    fill_ref(full, DT_F32, n, &ref);
    const dt_placement_t pairs[3][2][2] = {
        {{dt_shard(0), dt_shard(0)}, {dt_replicate(), dt_replicate()}},
        {{dt_partial(DT_REDUCE_SUM), dt_partial(DT_REDUCE_SUM)}, {dt_replicate(), dt_replicate()}},
        {{dt_shard(0), dt_shard(0)}, {dt_shard(1), dt_shard(1)}}};
    for (int p = 0; p < 3; p++) {
      dt_plan_t plan;
      DT_ASSERT_OK(dt_plan_create(m, DT_F32, 2, shape_t, pairs[p][0], pairs[p][1], &plan));
      int nsteps, merged = 0;
      DT_ASSERT_OK(dt_plan_num_steps(plan, &nsteps));
      for (int s = 0; s < nsteps; s++) {
        dt_plan_step_t st;
        DT_ASSERT_OK(dt_plan_get_step(plan, s, &st));
        merged += st.n_mesh_dims > 1 && st.coll != DT_COLL_LOCAL;
      }
      DT_ASSERT_OK(dt_plan_destroy(plan));
      dt_tensor_t t, u;
      DT_ASSERT_OK(dt_tensor_from_full(m, DT_F32, 2, shape_t, pairs[p][0], full, &t));
      DT_ASSERT_OK(dt_counters_reset(m));
      DT_ASSERT_OK(dt_tensor_redistribute(t, pairs[p][1], &u));
      dt_counters_t cnt;
      DT_ASSERT_OK(dt_counters_get(m, &cnt));
      uint64_t flat = 0;
      for (int c = 0; c < DT_COLL_COUNT; c++)
        if (c != DT_COLL_LOCAL) flat += cnt.flat_calls[c];
      DT_ASSERT_EQ(flat, (uint64_t)merged);
      DT_ASSERT_EQ(cnt.redistributes, 1);
      check_full(u, &md, 2, shape_t, DT_F32, &ref, "flattened parent");
      DT_ASSERT_OK(dt_tensor_destroy(t));
      DT_ASSERT_OK(dt_tensor_destroy(u));
    }
    free(full);
    DT_ASSERT_OK(dt_mesh_destroy(m));
  }
  /* (W/2, 2) unnamed: accessors with empty names */
  {
    int shape[2] = {W / 2, 2};
    dt_mesh_t m;
    DT_ASSERT_OK(dt_mesh_create(2, shape, NULL, NULL, &m));
    mdesc_t md = describe(m);
    test_mesh_accessors(&md, NULL);
    int k10[2] = {0, 1};
    check_flatten(&md, 2, k10, NULL);
    DT_ASSERT_OK(dt_mesh_destroy(m));
  }
  /* (2, 2, W/4) */
  if (W % 4 == 0) {
    int shape[3] = {2, 2, W / 4};
    const char* names[3] = {"a", "b", "c"};
    dt_mesh_t m;
    DT_ASSERT_OK(dt_mesh_create(3, shape, names, NULL, &m));
    mdesc_t md = describe(m);
    test_mesh_accessors(&md, names);
    const char* n_ac[2] = {"a", "c"};
    const char* n_b[1] = {"b"};
    int kac[2] = {0, 2}, kb[1] = {1}, k12[2] = {1, 2}, k02[2] = {0, 2}, k012[3] = {0, 1, 2};
    check_slice(&md, 2, kac, n_ac);
    check_slice(&md, 1, kb, n_b);
    check_flatten(&md, 2, k12, "bc");
    check_flatten(&md, 2, k02, "ac_flat");
    check_flatten(&md, 3, k012, "all");
    DT_ASSERT_OK(dt_mesh_destroy(m));
  }
}

/* ---------------------------------------------------------------------------------------------
 * meshes over part of the world */

static void test_partial_world(void) {
  const int W = g_world;
  /* the odd world ranks, in reverse order */
  int nm = W / 2, *ranks = malloc(sizeof(int) * (size_t)nm);
  for (int i = 0; i < nm; i++) ranks[i] = W - 1 - 2 * i;
  for (int two_d = 0; two_d < 2; two_d++) {
    if (two_d && nm % 2) continue;
    int shape[2] = {two_d ? 2 : nm, two_d ? nm / 2 : 1};
    int nd = two_d ? 2 : 1;
    dt_mesh_t m;
    DT_ASSERT_OK(dt_mesh_create(nd, shape, NULL, ranks, &m));
    mdesc_t md = describe(m);
    int pos = -1;
    for (int i = 0; i < nm; i++)
      if (ranks[i] == g_rank) pos = i;
    DT_ASSERT_EQ(md.member, pos >= 0);
    DT_ASSERT_EQ(md.numel, nm);
    if (md.member) {
      DT_ASSERT_EQ(linear(nd, shape, md.coords), pos);
      for (int i = 0; i < nd; i++) {
        int v;
        DT_ASSERT_OK(dt_mesh_local_rank(m, i, &v));
        DT_ASSERT_EQ(v, md.coords[i]);
      }
    }
    for (int p = 0; p < nm; p++) {
      int c[MAXM], v;
      unlinear(nd, shape, p, c);
      DT_ASSERT_OK(dt_mesh_rank_at(m, c, &v));
      DT_ASSERT_EQ(v, ranks[p]);
    }
    /* tensors: members hold their boxes, non-members nothing; collectives run on members */
    const int64_t tshape[2] = {2 * nm + 1, 3};
    int64_t n = tshape[0] * tshape[1];
    ref_t ref = {REF_PATTERN, 0, 0, 0};
    float* full = malloc(sizeof(float) * (size_t)n);
    fill_ref(full, DT_F32, n, &ref);
    int npl = ipow(4, nd);
    for (int a = 0; a < npl; a++) {
      dt_placement_t pl[MAXM], r[MAXM];
      placements_from_index(a, nd, k_basic, 4, pl);
      for (int i = 0; i < nd; i++) r[i] = i == nd - 1 ? dt_shard(1) : dt_replicate();
      int src = ranks[a % nm];
      dt_tensor_t t, u, z;
      DT_ASSERT_OK(dt_tensor_distribute(m, DT_F32, 2, tshape, pl, g_rank == src ? full : NULL,
                                        src, &t));
      check_local(t, &md, pl, 2, tshape, DT_F32, &ref, "partial-world distribute");
      check_full(t, &md, 2, tshape, DT_F32, &ref, "partial-world distribute");
      DT_ASSERT_OK(dt_tensor_redistribute(t, r, &u));
      check_local(u, &md, r, 2, tshape, DT_F32, &ref, "partial-world redistribute");
      check_full(u, &md, 2, tshape, DT_F32, &ref, "partial-world redistribute");
      DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 2, tshape, pl, &z));
      int64_t ln;
      DT_ASSERT_OK(dt_tensor_local_numel(z, &ln));
      if (!md.member) DT_ASSERT_EQ(ln, 0);
      DT_ASSERT_OK(dt_tensor_destroy(t));
      DT_ASSERT_OK(dt_tensor_destroy(u));
      DT_ASSERT_OK(dt_tensor_destroy(z));
    }
    free(full);
    DT_ASSERT_OK(dt_mesh_destroy(m));
  }
  free(ranks);
}

/* ---------------------------------------------------------------------------------------------
 * visualize */

typedef struct {
  int rank, has_rank, nc, coords[MAXM], nr;
  int64_t lo[DT_MAX_DIMS], hi[DT_MAX_DIMS];
  int empty, partial;
} vis_line_t;

/* Parses one per-rank line: "... rank R ... (c0,c1,...) ... [a:b, c:d] ...". 0 if not one. */
static int parse_vis_line(const char* s, vis_line_t* v) {
  memset(v, 0, sizeof *v);
  const char* p = strstr(s, "rank");
  if (p != NULL) {
    v->rank = (int)strtol(p + 4, NULL, 10);
    v->has_rank = 1;
  }
  const char* o = strchr(s, '(');
  const char* b = strchr(s, '[');
  if (o == NULL || b == NULL || o > b) return 0;
  if (strstr(s, "coord") == NULL && !v->has_rank) return 0;
  const char* q = o + 1;
  while (*q && *q != ')' && v->nc < MAXM) {
    char* end;
    v->coords[v->nc++] = (int)strtol(q, &end, 10);
    q = end;
    while (*q == ',' || *q == ' ') q++;
  }
  q = b + 1;
  while (*q && *q != ']' && v->nr < DT_MAX_DIMS) {
    char* end;
    v->lo[v->nr] = strtoll(q, &end, 10);
    if (*end != ':') return 0;
    v->hi[v->nr] = strtoll(end + 1, &end, 10);
    v->nr++;
    q = end;
    while (*q == ',' || *q == ' ') q++;
  }
  v->empty = strstr(s, "empty") != NULL;
  v->partial = strstr(s, "partial") != NULL || strstr(s, "Partial") != NULL;
  return 1;
}

static void check_visualize(dt_mesh_t mesh, int abstract, const int* mshape, int m, int nd,
                            const int64_t* shape, const dt_placement_t* pl, dt_tensor_t t) {
  FILE* f = tmpfile();
  DT_ASSERT_TRUE(f != NULL, "tmpfile");
  if (t) DT_ASSERT_OK(dt_tensor_visualize(t, f));
  else DT_ASSERT_OK(dt_sharding_visualize(mesh, nd, shape, pl, f));
  rewind(f);
  int numel = 1;
  for (int i = 0; i < m; i++) numel *= mshape[i];
  int* seen = calloc((size_t)numel, sizeof(int));
  int has_partial = 0;
  for (int i = 0; i < m; i++) has_partial |= pl[i].kind == DT_PARTIAL;
  char line[512];
  int nlines = 0;
  while (fgets(line, sizeof line, f)) {
    vis_line_t v;
    if (!parse_vis_line(line, &v)) continue;
    nlines++;
    DT_ASSERT_TRUE(v.nc == m, "line '%s': %d coords", line, v.nc);
    DT_ASSERT_TRUE(v.nr == nd, "line '%s': %d ranges", line, v.nr);
    int pos = linear(m, mshape, v.coords);
    DT_ASSERT_TRUE(pos >= 0 && pos < numel, "line '%s'", line);
    seen[pos]++;
    if (!abstract) {
      DT_ASSERT_TRUE(v.has_rank, "line '%s' has no rank", line);
      int wr;
      DT_ASSERT_OK(dt_mesh_rank_at(mesh, v.coords, &wr));
      DT_ASSERT_TRUE(v.rank == wr, "line '%s': rank %d, expected %d", line, v.rank, wr);
    }
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], cnt = 1;
    ref_box(m, mshape, v.coords, pl, nd, shape, off, len);
    for (int d = 0; d < nd; d++) {
      cnt *= len[d];
      DT_ASSERT_TRUE(v.hi[d] - v.lo[d] == len[d], "line '%s': dim %d range %lld:%lld, expected "
                     "%lld elements", line, d, (long long)v.lo[d], (long long)v.hi[d],
                     (long long)len[d]);
      if (len[d] > 0)
        DT_ASSERT_TRUE(v.lo[d] == off[d], "line '%s': dim %d starts at %lld, expected %lld", line,
                       d, (long long)v.lo[d], (long long)off[d]);
    }
    DT_ASSERT_TRUE(v.empty == (cnt == 0), "line '%s': empty marker", line);
    DT_ASSERT_TRUE(v.partial == has_partial, "line '%s': partial marker", line);
  }
  DT_ASSERT_EQ(nlines, numel);
  for (int p = 0; p < numel; p++) DT_ASSERT_TRUE(seen[p] == 1, "position %d listed %d times", p, seen[p]);
  free(seen);
  fclose(f);
  g_checks++;
}

static void test_visualize(void) {
  const int W = g_world;
  int s1[1] = {W}, s2[2] = {2, W / 2};
  dt_mesh_t m1, m2, am;
  DT_ASSERT_OK(dt_mesh_create(1, s1, NULL, NULL, &m1));
  DT_ASSERT_OK(dt_mesh_create(2, s2, NULL, NULL, &m2));
  int as[2] = {3, 2};
  DT_ASSERT_OK(dt_mesh_create_abstract(2, as, NULL, &am));
  const int64_t shape[2] = {W + 1, 5};
  for (int a = 0; a < 4; a++) {
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_zeros(m1, DT_F32, 2, shape, &k_basic[a], &t));
    check_visualize(m1, 0, s1, 1, 2, shape, &k_basic[a], t);
    DT_ASSERT_OK(dt_tensor_destroy(t));
    check_visualize(m1, 0, s1, 1, 2, shape, &k_basic[a], NULL);
  }
  for (int a = 0; a < 16; a++) {
    dt_placement_t pl[2];
    placements_from_index(a, 2, k_basic, 4, pl);
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_zeros(m2, DT_F32, 2, shape, pl, &t));
    check_visualize(m2, 0, s2, 2, 2, shape, pl, t);
    DT_ASSERT_OK(dt_tensor_destroy(t));
    const int64_t ashape[2] = {7, 4};
    check_visualize(am, 1, as, 2, 2, ashape, pl, NULL);
  }
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_mesh_destroy(am));
}

/* ---------------------------------------------------------------------------------------------
 * main */

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_TRUE(g_world == 2 || g_world == 4 || g_world == 8, "run at np 2, 4 or 8 (got %d)",
                 g_world);
  /* meshes that fit the world: (W), (2, W/2), (W/2, 2), and (2, 2, W/4) when W % 4 == 0 */
  int shapes[4][3] = {{g_world}, {2, g_world / 2}, {g_world / 2, 2}, {2, 2, g_world / 4}};
  int nds[4] = {1, 2, 2, 3};
  int nmesh = g_world % 4 == 0 ? 4 : 3;
  dt_mesh_t meshes[4];
  for (int k = 0; k < nmesh; k++) {
    DT_ASSERT_OK(dt_mesh_create(nds[k], shapes[k], NULL, NULL, &meshes[k]));
    mdesc_t md = describe(meshes[k]);
    test_mesh_accessors(&md, NULL);
    test_distribute_from_full(&md);
    test_from_local(&md);
    test_factories(&md);
    if (g_rank == 0) {
      printf("mesh %d: done (%lld checks)\n", k, g_checks);
      fflush(stdout);
    }
  }
  test_random(meshes[0], meshes[1]);
  test_cast_bf16_bits(meshes[0]);
  test_slice_flatten();
  test_partial_world();
  test_visualize();
  test_random_moments(meshes[0]); /* last: rand in [0, 1) for every float dtype */
  for (int k = 0; k < nmesh; k++) DT_ASSERT_OK(dt_mesh_destroy(meshes[k]));
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) printf("test_tensor_api (api): %lld checks passed on %d ranks\n", g_checks, g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

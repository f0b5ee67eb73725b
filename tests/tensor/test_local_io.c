/* test_local_io.c - the local-transfer API and the host-value collective (np 2 and 4; on every
 * backend the suite runs: cpu, guarded, cuda-emu).
 *
 * dt_tensor_read_local / write_local move element ranges between a local shard and host memory,
 * read_local_box / write_local_box a box, copy_local ranges between two tensors' local shards
 * (on one backend and between the mesh's backend and a cpu tensor), fill_local sets ranges; all
 * checked against values computed from the global index (arange), for uneven shards and empty
 * ones. Bad arguments (ranges and boxes outside the shard, negative counts, dtype mismatch, meta
 * tensors, NULL buffers) return DT_ERR_INVALID_ARG or DT_ERR_INVALID_USAGE and change nothing.
 * dt_mesh_all_reduce_host sums, averages, takes max and min of host values over all dims, over
 * one dim and over two dims of a 2-D mesh, in f32, i32 and i64, and rejects bad dtypes and ops.
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"

static int g_rank, g_world;

/* x: (7, 5) f32 arange sharded S(0): uneven shards (4 + 3 rows at np 2, 2 2 2 1 at np 4) */
static void test_read_write(dt_mesh_t mesh) {
  dt_placement_t s0[1] = {dt_shard(0)};
  const int64_t shape[2] = {7, 5};
  dt_tensor_t x;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, shape, s0, 0.0, 1.0, &x));
  int64_t off[2], lshape[2], n;
  DT_ASSERT_OK(dt_tensor_local_offset(x, off));
  DT_ASSERT_OK(dt_tensor_local_shape(x, lshape));
  DT_ASSERT_OK(dt_tensor_local_numel(x, &n));
  DT_ASSERT_EQ(n, lshape[0] * lshape[1]);
  float buf[64];
  /* the whole shard, then a middle range */
  DT_ASSERT_OK(dt_tensor_read_local(x, 0, n, buf));
  for (int64_t i = 0; i < n; i++) DT_ASSERT_EQ(buf[i], off[0] * 5 + i);
  if (n >= 4) {
    float mid[2];
    DT_ASSERT_OK(dt_tensor_read_local(x, 2, 2, mid));
    DT_ASSERT_EQ(mid[0], off[0] * 5 + 2);
    DT_ASSERT_EQ(mid[1], off[0] * 5 + 3);
  }
  /* write a range, read back everything */
  if (n >= 3) {
    const float w[2] = {-1.5f, 1e6f};
    DT_ASSERT_OK(dt_tensor_write_local(x, 1, 2, w));
    DT_ASSERT_OK(dt_tensor_read_local(x, 0, n, buf));
    for (int64_t i = 0; i < n; i++)
      DT_ASSERT_TRUE(buf[i] == (i == 1 ? -1.5f : i == 2 ? 1e6f : (float)(off[0] * 5 + i)),
                     "element %lld is %g", (long long)i, buf[i]);
  }
  /* zero-length ranges are fine anywhere in [0, n], even with a NULL buffer */
  DT_ASSERT_OK(dt_tensor_read_local(x, n, 0, NULL));
  DT_ASSERT_OK(dt_tensor_write_local(x, 0, 0, NULL));
  /* out of range, negative, NULL */
  DT_ASSERT_STATUS(dt_tensor_read_local(x, 0, n + 1, buf), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_read_local(x, -1, 1, buf), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_read_local(x, 1, -1, buf), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_write_local(x, n, 1, buf), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_read_local(x, INT64_MAX, 2, buf), DT_ERR_INVALID_ARG);
  if (n > 0) DT_ASSERT_STATUS(dt_tensor_read_local(x, 0, 1, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_read_local(NULL, 0, 0, buf), DT_ERR_INVALID_ARG);
  /* a meta tensor has no data */
  dt_tensor_t m;
  DT_ASSERT_OK(dt_tensor_meta(mesh, DT_F32, 2, shape, s0, &m));
  DT_ASSERT_STATUS(dt_tensor_read_local(m, 0, 0, buf), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_tensor_destroy(m));
  DT_ASSERT_OK(dt_tensor_destroy(x));
}

/* Boxes of a (5, 6, 4) i64 replicated tensor: every rank holds it all. */
static void test_boxes(dt_mesh_t mesh) {
  dt_placement_t r[1] = {dt_replicate()};
  const int64_t shape[3] = {5, 6, 4};
  dt_tensor_t x;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_I64, 3, shape, r, 0.0, 1.0, &x));
  const int64_t bo[3] = {1, 2, 1}, bl[3] = {3, 3, 2};
  int64_t box[18];
  DT_ASSERT_OK(dt_tensor_read_local_box(x, bo, bl, box));
  int k = 0;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      for (int l = 0; l < 2; l++) DT_ASSERT_EQ(box[k++], ((1 + i) * 6 + 2 + j) * 4 + 1 + l);
  for (int i = 0; i < 18; i++) box[i] = -100 - i;
  DT_ASSERT_OK(dt_tensor_write_local_box(x, bo, bl, box));
  int64_t all[120];
  DT_ASSERT_OK(dt_tensor_read_local(x, 0, 120, all));
  k = 0;
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 6; j++)
      for (int l = 0; l < 4; l++) {
        int in = i >= 1 && i < 4 && j >= 2 && j < 5 && l >= 1 && l < 3;
        int64_t want = in ? -100 - (((i - 1) * 3 + (j - 2)) * 2 + (l - 1)) : (i * 6 + j) * 4 + l;
        DT_ASSERT_EQ(all[k], want);
        k++;
      }
  /* an empty box, and boxes that leave the shard */
  const int64_t e[3] = {0, 3, 2};
  DT_ASSERT_OK(dt_tensor_read_local_box(x, bo, e, NULL));
  const int64_t far[3] = {3, 0, 0}, big[3] = {3, 1, 1};
  DT_ASSERT_STATUS(dt_tensor_read_local_box(x, far, big, box), DT_ERR_INVALID_ARG);
  const int64_t neg[3] = {0, -1, 0};
  DT_ASSERT_STATUS(dt_tensor_write_local_box(x, neg, bl, box), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_read_local_box(x, NULL, bl, box), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_destroy(x));
}

/* Ranges between two tensors: gathering every other run of a into b, in one call; across the
 * mesh's backend and a cpu tensor too. */
static void test_copy_fill(dt_mesh_t mesh, dt_mesh_t cpu_mesh) {
  dt_placement_t r[1] = {dt_replicate()};
  const int64_t na = 40, nb = 24;
  dt_tensor_t a, b, c, h;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 1, &na, r, 0.0, 1.0, &a));
  DT_ASSERT_OK(dt_tensor_full_value(mesh, DT_F32, 1, &nb, r, 7.0, &b));
  const int64_t doff[3] = {0, 5, 20}, soff[3] = {30, 0, 10}, len[3] = {5, 3, 4};
  DT_ASSERT_OK(dt_tensor_copy_local(b, a, 3, doff, soff, len));
  /* fill two ranges */
  const int64_t foff[2] = {8, 14}, flen[2] = {2, 0};
  DT_ASSERT_OK(dt_tensor_fill_local(b, 2, foff, flen, -2.5));
  /* to a cpu tensor (host memory whatever the mesh's backend) */
  DT_ASSERT_OK(dt_tensor_zeros(cpu_mesh, DT_F32, 1, &nb, r, &h));
  const int64_t z = 0;
  DT_ASSERT_OK(dt_tensor_copy_local(h, b, 1, &z, &z, &nb));
  float got[24];
  DT_ASSERT_OK(dt_tensor_gather_full(h, got, sizeof got));
  for (int i = 0; i < 24; i++) {
    float want = 7.0f;
    if (i < 5) want = (float)(30 + i);
    else if (i < 8) want = (float)(i - 5);
    else if (i < 10) want = -2.5f;
    else if (i >= 20) want = (float)(10 + i - 20);
    DT_ASSERT_TRUE(got[i] == want, "b[%d] = %g, want %g", i, got[i], want);
  }
  /* back from the cpu tensor into the mesh's memory */
  DT_ASSERT_OK(dt_tensor_fill_local(h, 1, &z, &nb, 3.0));
  const int64_t back = 2;
  DT_ASSERT_OK(dt_tensor_copy_local(b, h, 1, &back, &z, &back));
  DT_ASSERT_OK(dt_tensor_gather_full(b, got, sizeof got));
  DT_ASSERT_TRUE(got[1] == 31.0f && got[2] == 3.0f && got[3] == 3.0f && got[4] == 34.0f,
                 "after the copy back: %g %g %g %g", got[1], got[2], got[3], got[4]);
  /* bad: dtype mismatch, a range past either end, n < 0 */
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_BF16, 1, &nb, r, &c));
  DT_ASSERT_STATUS(dt_tensor_copy_local(c, a, 1, &z, &z, &len[0]), DT_ERR_INVALID_ARG);
  const int64_t past = 38, three = 3;
  DT_ASSERT_STATUS(dt_tensor_copy_local(b, a, 1, &z, &past, &three), DT_ERR_INVALID_ARG);
  const int64_t late = 22;
  DT_ASSERT_STATUS(dt_tensor_copy_local(b, a, 1, &late, &z, &three), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_copy_local(b, a, -1, &z, &z, &three), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_fill_local(b, 1, &late, &three, 0.0), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_copy_local(b, a, 1, NULL, &z, &three), DT_ERR_INVALID_ARG);
  /* nothing changed by the refused calls */
  float again[24];
  DT_ASSERT_OK(dt_tensor_gather_full(b, again, sizeof again));
  DT_ASSERT_TRUE(memcmp(got, again, sizeof got) == 0, "a refused call changed b");
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  /* bf16 ranges move bits: -2.5 and 3 are exact in bf16 */
  DT_ASSERT_OK(dt_tensor_fill_local(c, 1, &z, &nb, 3.0));
  const int64_t two = 2, at = 5;
  DT_ASSERT_OK(dt_tensor_fill_local(c, 1, &at, &two, -2.5));
  uint16_t bits[24];
  DT_ASSERT_OK(dt_tensor_read_local(c, 0, nb, bits));
  for (int i = 0; i < 24; i++)
    DT_ASSERT_EQ(bits[i], i == 5 || i == 6 ? 0xC020 : 0x4040);
  DT_ASSERT_OK(dt_tensor_destroy(c));
  DT_ASSERT_OK(dt_tensor_destroy(h));
}

static void test_host_all_reduce(dt_mesh_t mesh1) {
  /* 1-D: sum, avg, max, min over the world */
  float f[3] = {(float)g_rank, 1.0f, -(float)g_rank};
  DT_ASSERT_OK(dt_mesh_all_reduce_host(mesh1, 0, NULL, f, 3, DT_F32, DT_REDUCE_SUM));
  DT_ASSERT_EQ(f[0], g_world * (g_world - 1) / 2);
  DT_ASSERT_EQ(f[1], g_world);
  int64_t l[2] = {g_rank, 10 + g_rank};
  DT_ASSERT_OK(dt_mesh_all_reduce_host(mesh1, 0, NULL, l, 2, DT_I64, DT_REDUCE_MAX));
  DT_ASSERT_EQ(l[0], g_world - 1);
  DT_ASSERT_EQ(l[1], 10 + g_world - 1);
  int32_t i[1] = {5 + g_rank};
  DT_ASSERT_OK(dt_mesh_all_reduce_host(mesh1, 0, NULL, i, 1, DT_I32, DT_REDUCE_MIN));
  DT_ASSERT_EQ(i[0], 5);
  float a[1] = {(float)(2 * g_rank)};
  DT_ASSERT_OK(dt_mesh_all_reduce_host(mesh1, 0, NULL, a, 1, DT_F32, DT_REDUCE_AVG));
  DT_ASSERT_TRUE(fabsf(a[0] - (float)(g_world - 1)) < 1e-6f, "avg %g", a[0]);
  /* 2-D (2, world/2): over dim 0, dim 1, both */
  if (g_world >= 4 && g_world % 2 == 0) {
    int shape[2] = {2, g_world / 2};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, shape, NULL, NULL, &m2));
    int co[2];
    DT_ASSERT_OK(dt_mesh_coordinate(m2, co));
    for (int d = 0; d < 2; d++) {
      int64_t v = 1 + co[0] * 100 + co[1];
      DT_ASSERT_OK(dt_mesh_all_reduce_host(m2, 1, &d, &v, 1, DT_I64, DT_REDUCE_SUM));
      int64_t want = d == 0 ? 2 + 100 + 2 * co[1] : (1 + co[0] * 100) * shape[1] + shape[1] * (shape[1] - 1) / 2;
      DT_ASSERT_EQ(v, want);
    }
    const int both[2] = {1, 0}; /* any order */
    int64_t v = 1;
    DT_ASSERT_OK(dt_mesh_all_reduce_host(m2, 2, both, &v, 1, DT_I64, DT_REDUCE_SUM));
    DT_ASSERT_EQ(v, g_world);
    const int twice[2] = {0, 0};
    DT_ASSERT_STATUS(dt_mesh_all_reduce_host(m2, 2, twice, &v, 1, DT_I64, DT_REDUCE_SUM),
                     DT_ERR_INVALID_ARG);
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
  /* bad dtype, op, dim, count */
  int64_t v = 0;
  const int bad = 3;
  DT_ASSERT_STATUS(dt_mesh_all_reduce_host(mesh1, 0, NULL, &v, 1, DT_BF16, DT_REDUCE_SUM),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_mesh_all_reduce_host(mesh1, 0, NULL, &v, 1, DT_I64, (dt_reduce_op_t)9),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_mesh_all_reduce_host(mesh1, 1, &bad, &v, 1, DT_I64, DT_REDUCE_SUM),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_mesh_all_reduce_host(mesh1, 0, NULL, &v, -1, DT_I64, DT_REDUCE_SUM),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_mesh_all_reduce_host(mesh1, 0, NULL, NULL, 1, DT_I64, DT_REDUCE_SUM),
                   DT_ERR_INVALID_ARG);
  /* the counters see it as one all-reduce */
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_reset(mesh1));
  DT_ASSERT_OK(dt_mesh_all_reduce_host(mesh1, 0, NULL, &v, 1, DT_I64, DT_REDUCE_SUM));
  DT_ASSERT_OK(dt_counters_get(mesh1, &c));
  DT_ASSERT_EQ(c.calls[DT_COLL_ALL_REDUCE], g_world > 1 ? 1 : 0);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  int shape[1] = {g_world};
  dt_mesh_t mesh, cpu_mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &cpu_mesh));
  dt_backend_t cpu;
  DT_ASSERT_OK(dt_backend_get("cpu", &cpu));
  DT_ASSERT_OK(dt_mesh_set_backend(cpu_mesh, cpu));
  test_read_write(mesh);
  test_boxes(mesh);
  test_copy_fill(mesh, cpu_mesh);
  test_host_all_reduce(mesh);
  dt_backend_t b;
  int64_t errs = 0;
  DT_ASSERT_OK(dt_mesh_backend(mesh, &b));
  DT_ASSERT_OK(dt_backend_verify(b, &errs));
  DT_ASSERT_EQ(errs, 0);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_mesh_destroy(cpu_mesh));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_local_io: passed on %d ranks\n", g_world);
  return 0;
}

/* test_views.c - views share storage (np 2 and 4).
 *
 * view, reshape, flatten, unflatten, squeeze and unsqueeze return tensors whose local shard is
 * the input's storage (same pointer); slice/narrow/split alias when their local result is one
 * contiguous run (the cut on the outermost dim of the shard) and copy otherwise. Writes through a
 * view are seen by the base and back; the storage outlives the tensor it was made from; a view
 * that needs data movement (an uneven reshape) is a new tensor with the right values; a
 * redistribution into a tensor that aliases its source is refused; two leaves given one gradient
 * by a backward rule get separate storage; dt_tensor_view_local packs tensors of their own layouts
 * into one flat buffer (shared writes, in-place ops, no new memory, bounds checked per rank).
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"

static int g_rank;

static float* local_of(dt_tensor_t t) {
  void* p;
  DT_ASSERT_OK(dt_tensor_to_local(t, &p, NULL));
  return (float*)p;
}

static void full_of(dt_tensor_t t, float* out, size_t n) {
  DT_ASSERT_OK(dt_tensor_gather_full(t, out, sizeof(float) * n));
}

static void test_reshape_aliases(dt_mesh_t mesh, int world) {
  dt_placement_t r[1] = {dt_replicate()}, s0[1] = {dt_shard(0)};
  int64_t shape[3] = {2 * world, 3, 4};
  dt_tensor_t x, y, z;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 3, shape, s0, 0.0, 1.0, &x));
  const int64_t flat[2] = {6 * world, 4};
  DT_ASSERT_OK(dt_counters_reset(mesh));
  DT_ASSERT_OK(dt_reshape(x, 2, flat, &y));
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_get(mesh, &c));
  DT_ASSERT_EQ(c.redistributes, 0); /* S(0) passes the reshape */
  DT_ASSERT_TRUE(local_of(x) == local_of(y), "reshape did not alias");
  /* flatten / unflatten / unsqueeze / squeeze of the view: still the same storage */
  const int64_t fl[2] = {0, 1}, uf[3] = {0, 2 * world, 3}, us[1] = {1}, sq[1] = {1};
  dt_tensor_t a, b, d, e;
  DT_ASSERT_OK(dt_op_run("flatten", 1, &x, 2, fl, 0, NULL, &a));
  DT_ASSERT_OK(dt_op_run("unflatten", 1, &a, 3, uf, 0, NULL, &b));
  DT_ASSERT_OK(dt_op_run("unsqueeze", 1, &b, 1, us, 0, NULL, &d));
  DT_ASSERT_OK(dt_op_run("squeeze", 1, &d, 1, sq, 0, NULL, &e));
  DT_ASSERT_TRUE(local_of(a) == local_of(x) && local_of(b) == local_of(x) &&
                     local_of(d) == local_of(x) && local_of(e) == local_of(x),
                 "a view of a view did not alias");
  /* writes through the view are seen by the base, and back */
  int64_t n;
  DT_ASSERT_OK(dt_tensor_local_numel(y, &n));
  const float m7 = -7.0f, m9 = -9.0f; /* written through the backend: may be device memory */
  if (n > 0) DT_ASSERT_OK(dt_tensor_write_local(y, 0, 1, &m7));
  float all[256];
  full_of(x, all, (size_t)(24 * world));
  int64_t off[3];
  DT_ASSERT_OK(dt_tensor_local_offset(x, off));
  for (int p = 0; p < world; p++) /* every rank's first element was overwritten */
    DT_ASSERT_TRUE(all[p * 24] == -7.0f, "rank %d's write through the view is not seen", p);
  if (n > 0) DT_ASSERT_OK(dt_tensor_write_local(x, 1, 1, &m9));
  full_of(y, all, (size_t)(24 * world));
  DT_ASSERT_TRUE(all[1] == -9.0f, "a write to the base is not seen through the view");
  /* the storage outlives the base: y still holds the values */
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_tensor_destroy(d));
  full_of(y, all, (size_t)(24 * world));
  for (int i = 0; i < 24 * world; i++) /* each rank wrote its local elements 0 and 1 */
    DT_ASSERT_EQ((int)all[i], i % 24 == 0 ? -7 : i % 24 == 1 ? -9 : i);
  full_of(e, all, (size_t)(24 * world));
  DT_ASSERT_EQ((int)all[1], -9);
  /* a redistribution into a tensor that aliases the source is refused */
  DT_ASSERT_OK(dt_reshape(y, 2, flat, &z));
  DT_ASSERT_STATUS(dt_tensor_redistribute_into(y, z), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_destroy(z));
  DT_ASSERT_OK(dt_tensor_destroy(e));
  /* an uneven reshape moves data: a new tensor, right values */
  int64_t us7[2] = {7, 6}, us42[1] = {42};
  dt_tensor_t u, v;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, us7, s0, 0.0, 1.0, &u));
  DT_ASSERT_OK(dt_reshape(u, 1, us42, &v));
  float got[42];
  full_of(v, got, 42);
  for (int i = 0; i < 42; i++) DT_ASSERT_EQ((int)got[i], i);
  int64_t un, vn;
  DT_ASSERT_OK(dt_tensor_local_numel(u, &un));
  DT_ASSERT_OK(dt_tensor_local_numel(v, &vn));
  if (un > 0 && vn > 0) DT_ASSERT_TRUE(local_of(u) != local_of(v), "a moved view aliased");
  DT_ASSERT_OK(dt_tensor_destroy(u));
  DT_ASSERT_OK(dt_tensor_destroy(v));
  DT_ASSERT_OK(dt_tensor_destroy(y));
  /* a Partial tensor's view aliases too */
  dt_placement_t p[1] = {dt_partial(DT_REDUCE_SUM)};
  int64_t ps[2] = {4, 6}, pf[1] = {24};
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, ps, p, 0.0, 1.0, &u));
  DT_ASSERT_OK(dt_reshape(u, 1, pf, &v));
  DT_ASSERT_TRUE(local_of(u) == local_of(v), "a Partial view did not alias");
  DT_ASSERT_OK(dt_tensor_destroy(u));
  DT_ASSERT_OK(dt_tensor_destroy(v));
  (void)r;
}

static void test_cuts(dt_mesh_t mesh, int world) {
  dt_placement_t r[1] = {dt_replicate()}, s1[1] = {dt_shard(1)};
  int64_t shape[2] = {6, 4 * world};
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, shape, s1, 0.0, 1.0, &x));
  /* rows 2..4 of a column-sharded matrix: one contiguous run of each rank's shard */
  DT_ASSERT_OK(dt_narrow(x, 0, 2, 3, &y));
  DT_ASSERT_TRUE(local_of(y) == local_of(x) + 2 * 4, "narrow on dim 0 did not alias at row 2");
  float got[64];
  full_of(y, got, (size_t)(12 * world));
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4 * world; j++) DT_ASSERT_EQ((int)got[i * 4 * world + j], (i + 2) * 4 * world + j);
  DT_ASSERT_OK(dt_tensor_destroy(y));
  /* split into row blocks: each piece aliases its range */
  dt_tensor_t parts[3];
  int np;
  DT_ASSERT_OK(dt_split(x, 2, 0, parts, 3, &np));
  DT_ASSERT_EQ(np, 3);
  for (int k = 0; k < 3; k++) {
    DT_ASSERT_TRUE(local_of(parts[k]) == local_of(x) + k * 2 * 4, "split piece %d", k);
    DT_ASSERT_OK(dt_tensor_destroy(parts[k]));
  }
  /* a column cut of a replicated matrix is strided: a copy */
  dt_tensor_t xr;
  DT_ASSERT_OK(dt_tensor_redistribute(x, r, &xr));
  DT_ASSERT_OK(dt_narrow(xr, 1, 1, 2, &y));
  float* py = local_of(y);
  float* px = local_of(xr);
  DT_ASSERT_TRUE(py < px || py >= px + 6 * 4 * world, "a strided narrow aliased");
  const float big = 1234.0f; /* a copy: the base does not change */
  DT_ASSERT_OK(dt_tensor_write_local(y, 0, 1, &big));
  float b1;
  DT_ASSERT_OK(dt_tensor_read_local(xr, 1, 1, &b1));
  DT_ASSERT_TRUE(b1 != 1234.0f, "the copy shares memory with the base");
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_tensor_destroy(xr));
  DT_ASSERT_OK(dt_tensor_destroy(x));
}

/* add hands one gradient to both inputs: two leaves must not share a gradient's storage */
static void test_grads_not_shared(dt_mesh_t mesh) {
  dt_placement_t r[1] = {dt_replicate()};
  int64_t shape[2] = {3, 4};
  dt_tensor_t a, b;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, shape, r, 0.0, 1.0, &a));
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, shape, r, 1.0, 1.0, &b));
  dt_var_t va, vb, s, l;
  DT_ASSERT_OK(dt_var_leaf(a, 1, &va));
  DT_ASSERT_OK(dt_var_leaf(b, 1, &vb));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t in[2] = {va, vb};
  DT_ASSERT_OK(dt_ag_op(tape, "add", 2, in, 0, NULL, 0, NULL, 1, &s));
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &s, 1, all, 0, NULL, 1, &l));
  DT_ASSERT_OK(dt_tape_backward(tape, l));
  float* ga = local_of(dt_var_grad(va));
  float* gb = local_of(dt_var_grad(vb));
  DT_ASSERT_TRUE(ga != gb, "two leaves share one gradient buffer");
  const float five = 5.0f;
  float gb0;
  DT_ASSERT_OK(dt_tensor_write_local(dt_var_grad(va), 0, 1, &five));
  DT_ASSERT_OK(dt_tensor_read_local(dt_var_grad(vb), 0, 1, &gb0));
  DT_ASSERT_TRUE(gb0 == 1.0f, "scaling one gradient changed the other");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(va));
  DT_ASSERT_OK(dt_var_destroy(vb));
}

/* Two Shard(0) matrices packed into one flat Shard(0) buffer as FSDP packs its shards: each
 * rank's segment holds A's rows (padded to ceil(rows / world)) then B's. */
static void test_view_local(dt_mesh_t mesh, int world) {
  dt_placement_t s0[1] = {dt_shard(0)};
  const int64_t ra = 2 * world + 1, ca = 3, rb = world, cb = 4; /* A uneven: chunks of 3 rows */
  const int64_t seg = 3 * ca + 1 * cb, n = world * seg;
  const int64_t sa[2] = {ra, ca}, sb[2] = {rb, cb};
  dt_tensor_t base, a, b;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 1, &n, s0, 0.0, 1.0, &base));
  dt_memory_stats_t m0, m1;
  DT_ASSERT_OK(dt_memory_stats(&m0));
  DT_ASSERT_OK(dt_tensor_view_local(base, 0, 2, sa, s0, &a));
  DT_ASSERT_OK(dt_tensor_view_local(base, 3 * ca, 2, sb, s0, &b));
  DT_ASSERT_OK(dt_memory_stats(&m1));
  DT_ASSERT_EQ(m1.total_current, m0.total_current); /* no new storage */
  DT_ASSERT_TRUE(local_of(a) == local_of(base) && local_of(b) == local_of(base) + 3 * ca,
                 "the views do not point into the base");
  dt_dtype_t dt;
  int64_t ls[2];
  DT_ASSERT_OK(dt_tensor_dtype(b, &dt));
  DT_ASSERT_EQ((int)dt, (int)DT_F32);
  DT_ASSERT_OK(dt_tensor_local_shape(b, ls));
  DT_ASSERT_EQ(ls[0], 1);
  DT_ASSERT_EQ(ls[1], cb);
  /* the global values: rank r's rows come from its segment */
  float got[64];
  full_of(a, got, (size_t)(ra * ca));
  for (int r = 0; r < world; r++) {
    int64_t off, len;
    DT_ASSERT_OK(dt_chunk(ra, world, r, &off, &len));
    for (int64_t i = 0; i < len * ca; i++) DT_ASSERT_EQ((int64_t)got[off * ca + i], r * seg + i);
  }
  /* an in-place op through one view changes its run of the base only */
  const double two = 2.0;
  DT_ASSERT_OK(dt_op_run_multi("scale_", 1, &b, 0, NULL, 1, &two, 0, NULL));
  float* pb = malloc(sizeof(float) * (size_t)(seg ? seg : 1));
  DT_ASSERT_OK(dt_tensor_read_local(base, 0, seg, pb));
  for (int64_t i = 0; i < seg; i++)
    DT_ASSERT_EQ((int64_t)pb[i], (g_rank * seg + i) * (i >= 3 * ca ? 2 : 1));
  free(pb);
  /* the views keep the storage alive */
  DT_ASSERT_OK(dt_tensor_destroy(base));
  full_of(b, got, (size_t)(rb * cb));
  for (int64_t i = 0; i < rb * cb; i++) DT_ASSERT_EQ((int64_t)got[i], 2 * ((i / cb) * seg + 3 * ca + i % cb));
  /* bounds: checked on each rank against its own shard */
  dt_tensor_t v = (dt_tensor_t)1;
  DT_ASSERT_STATUS(dt_tensor_view_local(a, -1, 2, sb, s0, &v), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(v == NULL, "the out-pointer is not NULL after a failure");
  DT_ASSERT_STATUS(dt_tensor_view_local(b, cb + 1, 1, &cb, s0, &v), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_view_local(b, 1, 2, sb, s0, &v), DT_ERR_INVALID_ARG); /* overruns */
  DT_ASSERT_STATUS(dt_tensor_view_local(NULL, 0, 2, sb, s0, &v), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_view_local(b, 0, 2, sb, s0, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_view_local(b, 0, 2, sb, NULL, &v), DT_ERR_INVALID_ARG);
  /* the end of the shard is a valid offset for an empty view */
  const int64_t zero = 0;
  DT_ASSERT_OK(dt_tensor_view_local(b, cb, 1, &zero, s0, &v));
  DT_ASSERT_OK(dt_tensor_destroy(v));
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  /* a view of a meta tensor is a meta tensor */
  dt_tensor_t mt;
  int meta = 0;
  DT_ASSERT_OK(dt_tensor_meta(mesh, DT_F32, 1, &n, s0, &mt));
  DT_ASSERT_OK(dt_tensor_view_local(mt, 0, 2, sa, s0, &v));
  DT_ASSERT_OK(dt_tensor_is_meta(v, &meta));
  DT_ASSERT_EQ(meta, 1);
  DT_ASSERT_OK(dt_tensor_destroy(v));
  DT_ASSERT_OK(dt_tensor_destroy(mt));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  test_reshape_aliases(mesh, world);
  test_cuts(mesh, world);
  test_grads_not_shared(mesh);
  test_view_local(mesh, world);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  dt_backend_t b;
  DT_ASSERT_OK(dt_backend_default(&b));
  DT_ASSERT_OK(dt_backend_verify(b, NULL)); /* on the guarded backend: no damage */
  if (g_rank == 0) printf("test_views np=%d: views alias, writes are shared, storage outlives\n", world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* test_backend_guarded.c - the guarded backend catches what it claims to (np 2).
 *
 * Through its vtable: a copy, box copy, fill or GEMM operand running past a block is
 * DT_ERR_INTERNAL naming the overrun, touching a freed block too. Damage found later: a write
 * past a block's end or before its start, a double free and a write into a freed block each raise
 * dt_backend_verify's problem count and make it fail. Through dispatch: a host kernel that writes
 * past its output or changes its input fails the op; an output a kernel was supposed to write in
 * full but did not reads back as NaN. The cpu backend gives the same results where nothing goes
 * wrong (checked by test_conformance); here it only runs the well-behaved op.
 */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "dt_test.h"

static dt_backend_t g_guard;

static void expect_internal(dt_status_t st, const char* what, const char* needle) {
  DT_ASSERT_TRUE(st == DT_ERR_INTERNAL, "%s: expected DT_ERR_INTERNAL, got %s", what,
                 dt_status_name(st));
  DT_ASSERT_TRUE(strstr(dt_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
                 dt_last_error(), needle);
}

static int64_t problems(void) {
  int64_t n = 0;
  dt_backend_verify(g_guard, &n);
  return n;
}

/* Checks that return their status (nothing is recorded). */
static void test_range_checks(void) {
  dt_backend_t b = g_guard;
  const struct dt_backend_i* f = b->iface;
  char* blk = (char*)dt__backend_alloc(b, 100);
  char host[256] = {0};
  DT_ASSERT_TRUE(blk != NULL, "guarded alloc");
  for (int i = 0; i < 100; i++) DT_ASSERT_EQ((unsigned char)blk[i], 0xFF); /* fresh = NaN bytes */
  DT_ASSERT_OK(f->copy(b, blk, host, 100, DT_COPY_H2H));
  expect_internal(f->copy(b, blk, host, 101, DT_COPY_H2H), "copy", "overruns a block of 100");
  expect_internal(f->copy(b, host, blk + 90, 20, DT_COPY_H2H), "copy source", "offset 90");
  expect_internal(f->memset(b, blk + 1, 0, 100), "memset", "overruns");
  expect_internal(f->fill(b, blk, DT_F32, 26, 1.0), "fill", "overruns");
  DT_ASSERT_OK(f->fill(b, blk, DT_F32, 25, 1.0));
  /* a 5x5 f32 box at (1, 1) of a 5x5 array needs 4 more rows and columns than it has */
  int64_t shape[2] = {5, 5}, off[2] = {1, 1}, ext[2] = {5, 5}, zero[2] = {0, 0};
  float src[25] = {0};
  expect_internal(f->box_copy(b, 2, 4, ext, blk, shape, off, src, shape, zero), "box copy",
                  "box copy destination");
  int64_t ext4[2] = {4, 4};
  DT_ASSERT_OK(f->box_copy(b, 2, 4, ext4, blk, shape, off, src, shape, zero));
  /* GEMM: C of 5x5 f32 (100 bytes) fits, 5x6 does not */
  float a[30] = {0}, bm[36] = {0};
  DT_ASSERT_OK(dt__gemm(b, 0, 0, 5, 5, 6, 1.0f, a, 6, bm, 5, 0.0f, (float*)blk, 5));
  expect_internal(dt__gemm(b, 0, 0, 5, 6, 6, 1.0f, a, 6, bm, 6, 0.0f, (float*)blk, 6), "gemm",
                  "GEMM result C");
  /* bf16 operands are counted in 2-byte elements: 10x5 bf16 fits in 100 bytes, 10x6 does not */
  dt_gemm_t g = {.m = 10, .n = 5, .k = 2, .batch = 1, .alpha = 1.0f, .ab_dtype = DT_BF16,
                 .c_dtype = DT_BF16, .a = a, .lda = 2, .b = bm, .ldb = 5, .c = blk, .ldc = 5};
  DT_ASSERT_OK(f->gemm(b, &g));
  g.n = g.ldb = g.ldc = 6;
  expect_internal(f->gemm(b, &g), "bf16 gemm", "GEMM result C");
  g.n = g.ldb = g.ldc = 5;
  g.bias = blk + 96; /* 5 bf16 values from byte 96 of a 100-byte block */
  expect_internal(f->gemm(b, &g), "gemm bias", "GEMM bias");
  /* range copies: each range is checked */
  int64_t doff[2] = {0, 50}, soff[2] = {0, 0}, nb[2] = {40, 51};
  expect_internal(f->copy_ranges(b, blk, host, 2, doff, soff, nb), "range copy",
                  "range copy destination");
  nb[1] = 50;
  DT_ASSERT_OK(f->copy_ranges(b, blk, host, 2, doff, soff, nb));
  expect_internal(f->scale_div(b, blk, DT_F32, 26, 2), "scale", "overruns");
  expect_internal(f->reduce(b, blk, blk, host, DT_F32, 26, DT_REDUCE_SUM), "reduce", "overruns");
  expect_internal(f->convert(b, host, DT_F32, blk, DT_BF16, 51), "convert", "conversion");
  dt__backend_free(b, blk, 100);
  expect_internal(f->memset(b, blk, 0, 4), "use after free", "freed block");
  DT_ASSERT_EQ(problems(), 0); /* none of the above damaged anything */
}

/* Damage found by dt_backend_verify (the count only grows). */
static void test_recorded_damage(void) {
  dt_backend_t b = g_guard;
  int64_t n0 = problems();
  char* p = (char*)dt__backend_alloc(b, 64);
  p[64] = 1; /* one byte past the end: only the guard region sees it */
  DT_ASSERT_STATUS(dt_backend_verify(b, NULL), DT_ERR_INTERNAL);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "past the end") != NULL, "%s", dt_last_error());
  int64_t n1 = problems();
  DT_ASSERT_TRUE(n1 > n0, "a write past the end was not counted");
  p[64] = (char)0xAB; /* repair, then before the start */
  p[-3] = 0;
  int64_t n2 = problems();
  DT_ASSERT_TRUE(n2 > n1, "a write before the start was not counted");
  p[-3] = (char)0xAB;
  dt__backend_free(b, p, 64);
  dt__backend_free(b, p, 64); /* double free */
  int64_t n3 = problems();
  DT_ASSERT_TRUE(n3 > n2, "a double free was not counted");
  char* q = (char*)dt__backend_alloc(b, 32);
  dt__backend_free(b, q, 32);
  q[5] = 7; /* write after free (the block is quarantined, its poison changes) */
  int64_t n4 = problems();
  DT_ASSERT_TRUE(n4 > n3, "a write into a freed block was not counted");
  DT_ASSERT_STATUS(dt_backend_verify(b, NULL), DT_ERR_INTERNAL);
}

/* Host ops: rows of x copied to the output (replicated only). */
static dt_status_t copy_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                              dt_op_rule_t* rules, int cap, int* n) {
  (void)cap;
  *n_out = 1;
  *out_meta = call->in[0];
  memset(rules, 0, sizeof *rules);
  *n = 1;
  return DT_SUCCESS;
}
static int64_t numel_of(const dt_local_tensor_t* t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}
static dt_status_t good_kernel(const dt_op_call_t* c, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  (void)c;
  memcpy(out->data, in->data, sizeof(float) * (size_t)numel_of(in));
  return DT_SUCCESS;
}
static dt_status_t overrun_kernel(const dt_op_call_t* c, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  (void)c;
  int64_t n = numel_of(in);
  memcpy(out->data, in->data, sizeof(float) * (size_t)n);
  ((float*)out->data)[n] = 1.0f; /* one element too many */
  return DT_SUCCESS;
}
static dt_status_t clobber_kernel(const dt_op_call_t* c, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  good_kernel(c, in, out);
  ((float*)in->data)[0] = 42.0f; /* inputs are read-only */
  return DT_SUCCESS;
}
static dt_status_t lazy_kernel(const dt_op_call_t* c, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  (void)c;
  memcpy(out->data, in->data, sizeof(float) * (size_t)(numel_of(in) - 1)); /* forgets the last */
  return DT_SUCCESS;
}

static dt_status_t even_kernel(const dt_op_call_t* c, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  (void)c;
  for (int64_t i = 0; i < numel_of(in); i += 2) ((float*)out->data)[i] = ((float*)in->data)[i];
  return DT_SUCCESS;
}

/* A host op's kernel that writes part of its output: the rest reads back as the zeros it was
 * given, also for bf16 tensors, whose kernels run on f32 copies from the storage pool (the block
 * a previous kernel's copy left there: 32 Ki elements, 128 KiB of f32, pooled). */
static void test_partial_writer(void) {
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh)); /* the cpu backend: pooled */
  dt_placement_t r[1] = {dt_replicate()};
  const int64_t n = 32768;
  dt_tensor_t x, y, z;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_BF16, 1, &n, r, 1.0, 0.0, &x)); /* all ones */
  DT_ASSERT_OK(dt_op_register("copy_all", 1, copy_rules, good_kernel));
  DT_ASSERT_OK(dt_op_register("copy_even", 1, copy_rules, even_kernel));
  DT_ASSERT_OK(dt_op_run("copy_all", 1, &x, 0, NULL, 0, NULL, &y));
  DT_ASSERT_OK(dt_op_run("copy_even", 1, &x, 0, NULL, 0, NULL, &z));
  float* got = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_TRUE(got != NULL, "memory");
  dt_tensor_t zf;
  DT_ASSERT_OK(dt_cast(z, DT_F32, &zf));
  DT_ASSERT_OK(dt_tensor_gather_full(zf, got, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++)
    DT_ASSERT_TRUE(got[i] == (i % 2 ? 0.0f : 1.0f), "element %lld of a half-written bf16 output "
                   "is %g", (long long)i, got[i]);
  free(got);
  dt_tensor_t all[4] = {x, y, z, zf};
  for (int i = 0; i < 4; i++) DT_ASSERT_OK(dt_tensor_destroy(all[i]));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* The storage pool (cpu backend): a freed block serves a later request of its class or of a
 * class up to a quarter smaller (the smallest such block first), and the memory statistics
 * count the request's class whichever block served it. Sizes of a few MiB, unlike any other
 * block this test leaves in the pool. */
static void* pool_block(dt_mesh_t mesh, int64_t n, dt_tensor_t* t, int64_t* counted) {
  dt_placement_t r[1] = {dt_replicate()};
  dt_memory_stats_t before, after;
  DT_ASSERT_OK(dt_memory_stats(&before));
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 1, &n, r, 1.0, 0.0, t));
  DT_ASSERT_OK(dt_memory_stats(&after));
  *counted = after.total_current - before.total_current;
  void* data;
  int64_t shape[1];
  DT_ASSERT_OK(dt_tensor_to_local(*t, &data, shape));
  return data;
}

static void test_pool_best_fit(void) {
  const char* cap = getenv("DTENSOR_POOL_MB"); /* a pool too small to keep the blocks */
  if (cap != NULL && *cap && strtol(cap, NULL, 10) < 16) return;
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  dt_backend_t cpu; /* pooled (whatever DTENSOR_BACKEND made the default) */
  DT_ASSERT_OK(dt_backend_get("cpu", &cpu));
  DT_ASSERT_OK(dt_mesh_set_backend(mesh, cpu));
  const int64_t class_of_a = 733 * 4096, class_of_e = 684 * 4096; /* 4 KiB multiples */
  dt_tensor_t a, e, b, c;
  int64_t na, ne, nb, nc;
  void* pa = pool_block(mesh, 750000, &a, &na); /* 3,000,000 bytes */
  void* pe = pool_block(mesh, 700000, &e, &ne); /* 2,800,000 bytes */
  DT_ASSERT_EQ(na, class_of_a);
  DT_ASSERT_EQ(ne, class_of_e);
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(e));
  /* its own class first, though a's block (7 % larger) fits too */
  void* pb = pool_block(mesh, 700000, &b, &nb);
  DT_ASSERT_TRUE(pb == pe, "a request of e's class takes e's block");
  DT_ASSERT_OK(dt_tensor_destroy(b));
  /* a class that no block has: 2,600,000 bytes, a's and e's blocks at most a quarter larger;
   * e's, the smaller, serves it, counted at the request's class */
  pb = pool_block(mesh, 650000, &b, &nb);
  DT_ASSERT_TRUE(pb == pe, "the smallest block that fits serves a missing class");
  DT_ASSERT_EQ(nb, 635 * 4096);
  /* 1,600,000 bytes: a's block is more than a quarter larger, so it stays in the pool */
  void* pc = pool_block(mesh, 400000, &c, &nc);
  DT_ASSERT_TRUE(pc != pa && pc != pe, "no block over a quarter larger serves a request");
  DT_ASSERT_EQ(nc, 391 * 4096);
  dt_tensor_t all[2] = {b, c};
  for (int i = 0; i < 2; i++) DT_ASSERT_OK(dt_tensor_destroy(all[i]));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

static void test_kernels(void) {
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  DT_ASSERT_OK(dt_mesh_set_backend(mesh, g_guard));
  dt_placement_t r[1] = {dt_replicate()};
  int64_t ts[2] = {3, 4};
  dt_tensor_t x, y = NULL;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, ts, r, 0.0, 1.0, &x));
  DT_ASSERT_OK(dt_op_register("copy_good", 1, copy_rules, good_kernel));
  DT_ASSERT_OK(dt_op_register("copy_overrun", 1, copy_rules, overrun_kernel));
  DT_ASSERT_OK(dt_op_register("copy_clobber", 1, copy_rules, clobber_kernel));
  DT_ASSERT_OK(dt_op_run("copy_good", 1, &x, 0, NULL, 0, NULL, &y));
  float got[12];
  DT_ASSERT_OK(dt_tensor_gather_full(y, got, sizeof got));
  for (int i = 0; i < 12; i++) DT_ASSERT_EQ((int)got[i], i);
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_EQ(problems(), 0);
  expect_internal(dt_op_run("copy_overrun", 1, &x, 0, NULL, 0, NULL, &y), "overrunning kernel",
                  "wrote outside a block");
  DT_ASSERT_TRUE(y == NULL, "no output on failure");
  expect_internal(dt_op_run("copy_clobber", 1, &x, 0, NULL, 0, NULL, &y), "clobbering kernel",
                  "modified its input 0");
  /* an output the kernel must write in full: the element it skipped reads back as NaN */
  dt_local_tensor_t lin, lout;
  void* data;
  int64_t lshape[2];
  DT_ASSERT_OK(dt_tensor_to_local(x, &data, lshape));
  memset(&lin, 0, sizeof lin);
  lin.dtype = DT_F32;
  lin.ndim = 2;
  lin.shape[0] = 3;
  lin.shape[1] = 4;
  lin.data = data;
  lin.backend = g_guard;
  lout = lin;
  lout.data = dt__backend_alloc(g_guard, sizeof(float) * 12);
  memset(lout.data, 0, sizeof(float) * 12);
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  call.op = "lazy";
  DT_ASSERT_OK(g_guard->iface->run_kernel(g_guard, lazy_kernel, DT_KERNEL_WRITES_ALL, &call, &lin,
                                          1, &lout, 1));
  DT_ASSERT_TRUE(isnan(((float*)lout.data)[11]), "the unwritten element is %g, not NaN",
                 ((float*)lout.data)[11]);
  DT_ASSERT_EQ(((float*)lout.data)[10], 10);
  dt__backend_free(g_guard, lout.data, sizeof(float) * 12);
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank;
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_backend_get("guarded", &g_guard));
  dt_backend_t cpu;
  DT_ASSERT_OK(dt_backend_get("cpu", &cpu));
  DT_ASSERT_OK(dt_backend_verify(cpu, NULL)); /* nothing to check: a no-op */
  dt_backend_t none;
  DT_ASSERT_STATUS(dt_backend_get("no-such-backend", &none), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(none == NULL, "out-pointer cleared");
  dt_device_t dev;
  DT_ASSERT_OK(dt_backend_device(g_guard, &dev));
  DT_ASSERT_EQ(dev, DT_DEVICE_HOST);
  DT_ASSERT_TRUE(strcmp(dt_backend_name(g_guard), "guarded") == 0, "name");
  DT_ASSERT_STATUS(dt_backend_device((dt_backend_t)(void*)&dev, &dev), DT_ERR_INVALID_ARG);
  test_range_checks();
  test_kernels();
  test_partial_writer();
  test_pool_best_fit();
  test_recorded_damage(); /* last: the problem count stays raised */
  if (rank == 0) printf("test_backend_guarded: every class of damage was caught\n");
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

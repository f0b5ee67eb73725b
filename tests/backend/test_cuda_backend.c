/* test_cuda_backend.c - every vtable member of the CUDA backends against the cpu backend (one
 * process, no mpirun).
 *
 * Runs on "cuda-emu" (the SIMT emulator: every machine whose build has it) and on "cuda" where a
 * GPU is usable; where dt_backend_get("cuda") fails with DT_ERR_CUDA the message is printed and
 * that half skipped. Exit code 77 (skipped) only when neither backend could be tested.
 *
 * Each member gets the same inputs as the cpu backend's (data moved with the backend's own H2D
 * and D2H copies) and must give the same bytes: memset, fill of every dtype (rounding, integer
 * truncation, f16 overflow to inf, NaN), the four copy kinds, copy_ranges, box and split copies
 * on random 1- to 4-D shapes with odd extents and every item size, scale_div, convert for every
 * dtype pair (bits of dt__host_convert), reduce with NaNs, and GEMMs of f32/bf16/f16 with every
 * transpose, batch, bias and beta, compared with dt__host_gemm bit for bit (small integer inputs
 * make every f32 product and sum exact, so any order gives the same bits). Then the allocator
 * (a freed block comes back without a cudaMalloc; the DTENSOR_CUDA_MAX_MB cap, set here before
 * any backend opens, makes a large allocation and dt_tensor_empty fail with out-of-memory),
 * events, host staging memory, run_kernel and release.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ops/ops.h"
#include "dt_test.h"

#define DT_TEST_SKIPPED 77
#define CAP_MB 64

/* The allocator statistics of each build (src/backend/cuda.h declares them under DT_CUDA_NAME,
 * for one build at a time). Weak: a library built without one leaves it NULL; a backend that
 * opened has its object, and with it the function, linked in. */
typedef dt_status_t (*stats_fn)(dt_backend_t, int64_t*, int64_t*, int64_t*, int64_t*);
extern dt_status_t dt__cudaemu_allocator_stats(dt_backend_t b, int64_t* live, int64_t* cached,
                                               int64_t* peak, int64_t* mallocs)
    __attribute__((weak));
extern dt_status_t dt__cuda_allocator_stats(dt_backend_t b, int64_t* live, int64_t* cached,
                                            int64_t* peak, int64_t* mallocs) __attribute__((weak));

static dt_backend_t g_cpu = &dt__backend_cpu;
static const dt_dtype_t k_dtypes[DT_DTYPE_COUNT] = {DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64};

/* ---------------------------------------------------------------------------------------------
 * helpers */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64* */
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 0x2545f4914f6cdd1dull;
}
static int64_t rnd_in(int64_t lo, int64_t hi) {
  return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}
static void rnd_bytes(void* p, size_t n) {
  for (size_t i = 0; i < n; i++) ((unsigned char*)p)[i] = (unsigned char)rnd();
}
static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  DT_ASSERT_TRUE(p != NULL, "malloc(%zu)", n);
  return p;
}

static void* dev_alloc(dt_backend_t b, size_t n) {
  void* p = b->iface->alloc(b, n ? n : 1);
  DT_ASSERT_TRUE(p != NULL, "%s alloc of %zu bytes", b->name, n);
  return p;
}
static void dev_free(dt_backend_t b, void* p, size_t n) { b->iface->free(b, p, n ? n : 1); }
static void* upload(dt_backend_t b, const void* host, size_t n) {
  void* d = dev_alloc(b, n);
  DT_ASSERT_OK(b->iface->copy(b, d, host, n, DT_COPY_H2D));
  return d;
}
static void download(dt_backend_t b, void* host, const void* dev, size_t n) {
  DT_ASSERT_OK(b->iface->copy(b, host, dev, n, DT_COPY_D2H));
}

/* The first differing byte, reported with the case's description. */
static void expect_same(const void* got, const void* want, size_t n, const char* what) {
  const unsigned char *g = (const unsigned char*)got, *w = (const unsigned char*)want;
  for (size_t i = 0; i < n; i++)
    DT_ASSERT_TRUE(g[i] == w[i], "%s: byte %zu of %zu is 0x%02x, the cpu backend's 0x%02x", what,
                   i, n, g[i], w[i]);
}

/* The device result of n bytes at dev against the host's. */
static void expect_dev(dt_backend_t b, const void* dev, const void* want, size_t n,
                       const char* what) {
  void* got = xmalloc(n);
  download(b, got, dev, n);
  expect_same(got, want, n, what);
  free(got);
}

/* n elements of dtype dt: the same bits, except that a NaN matches any NaN (the payload and sign
 * of a NaN that arithmetic makes are the hardware's: x86 keeps an operand's, a GPU makes its
 * canonical NaN). */
static void expect_dev_values(dt_backend_t b, const void* dev, const void* want, int64_t n,
                              dt_dtype_t dt, const char* what) {
  size_t item = dt__itemsize(dt);
  unsigned char* got = (unsigned char*)xmalloc((size_t)n * item);
  download(b, got, dev, (size_t)n * item);
  for (int64_t i = 0; i < n; i++) {
    const void *g = got + (size_t)i * item, *w = (const unsigned char*)want + (size_t)i * item;
    if (dt__dtype_is_float(dt) && isnan(dt__load(g, dt, 0)) && isnan(dt__load(w, dt, 0))) continue;
    DT_ASSERT_TRUE(memcmp(g, w, item) == 0, "%s: element %lld is %.9g, the cpu backend's %.9g",
                   what, (long long)i, dt__load(g, dt, 0), dt__load(w, dt, 0));
  }
  free(got);
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ---------------------------------------------------------------------------------------------
 * memory operations */

static void test_memset(dt_backend_t b) {
  enum { N = 1001 };
  unsigned char want[N];
  rnd_bytes(want, N);
  void* d = upload(b, want, N);
  DT_ASSERT_OK(b->iface->memset(b, (char*)d + 3, 0xA5, 500));
  DT_ASSERT_OK(b->iface->memset(b, d, 0x11, 0));
  memset(want + 3, 0xA5, 500);
  expect_dev(b, d, want, N, "memset");
  dev_free(b, d, N);
}

static void test_fill(dt_backend_t b) {
  const double values[] = {0.0, -0.0, 1.0, -3.75, 2.5, 1e30, -1e30, 65504.0, 65520.0, 1e-8,
                           NAN, INFINITY, -INFINITY, -7.9, 123456789.0, 3.0e9, -2.0e12};
  const int64_t n = 777, pad = 5;
  for (int t = 0; t < DT_DTYPE_COUNT; t++) {
    dt_dtype_t dt = k_dtypes[t];
    size_t item = dt__itemsize(dt), nb = (size_t)(n + pad) * item;
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
      double x = values[v];
      if (dt == DT_I32 && !(fabs(x) < 2147483648.0)) continue; /* out of range: C leaves it */
      if (dt == DT_I64 && !(fabs(x) < 9.2e18)) continue;       /* undefined */
      unsigned char* want = (unsigned char*)xmalloc(nb);
      memset(want, 0x5C, nb); /* the elements past n must stay */
      DT_ASSERT_OK(dt__host_fill(g_cpu, want, dt, n, x));
      void* d = dev_alloc(b, nb);
      DT_ASSERT_OK(b->iface->memset(b, d, 0x5C, nb));
      DT_ASSERT_OK(b->iface->fill(b, d, dt, n, x));
      char what[96];
      snprintf(what, sizeof what, "fill %s with %g", dt_dtype_name(dt), x);
      expect_dev(b, d, want, nb, what);
      /* what the host's rounding means, spelled out once */
      unsigned char got[8];
      download(b, got, (char*)d + 100 * item, item);
      uint16_t h;
      memcpy(&h, got, 2);
      if (dt == DT_F16 && x == 1e30) DT_ASSERT_EQ(h, 0x7c00);
      if (dt == DT_BF16 && isnan(x)) DT_ASSERT_TRUE((h & 0x7f80) == 0x7f80 && (h & 0x7f), "NaN");
      if (dt == DT_I32 && x == -3.75) DT_ASSERT_EQ(*(int32_t*)(void*)got, -3);
      dev_free(b, d, nb);
      free(want);
    }
  }
}

static void test_copy(dt_backend_t b) {
  enum { N = 3001 };
  unsigned char src[N], back[N], h2[N];
  rnd_bytes(src, N);
  void* d = upload(b, src, N); /* H2D */
  download(b, back, d, N);     /* D2H */
  expect_same(back, src, N, "copy H2D then D2H");
  void* d2 = dev_alloc(b, N);
  DT_ASSERT_OK(b->iface->memset(b, d2, 0, N));
  DT_ASSERT_OK(b->iface->copy(b, d2, (char*)d + 7, 2000, DT_COPY_D2D));
  DT_ASSERT_OK(b->iface->copy(b, d2, d2, N, DT_COPY_D2D)); /* onto itself: nothing */
  DT_ASSERT_OK(b->iface->copy(b, d2, d, 0, DT_COPY_D2D));
  memset(back, 0, N);
  memcpy(back, src + 7, 2000);
  expect_dev(b, d2, back, N, "copy D2D");
  DT_ASSERT_OK(b->iface->copy(b, h2, src, N, DT_COPY_H2H));
  expect_same(h2, src, N, "copy H2H");
  /* a kernel, then a D2D copy, then a D2H copy: stream order */
  DT_ASSERT_OK(b->iface->fill(b, d, DT_I32, 500, 77.0));
  DT_ASSERT_OK(b->iface->copy(b, d2, d, 2000, DT_COPY_D2D));
  int32_t ints[500];
  download(b, ints, d2, sizeof ints);
  for (int i = 0; i < 500; i++) DT_ASSERT_EQ(ints[i], 77);
  dev_free(b, d, N);
  dev_free(b, d2, N);
}

static void test_copy_ranges(dt_backend_t b) {
  enum { N = 4096 };
  unsigned char src[N], dst[N];
  rnd_bytes(src, N);
  rnd_bytes(dst, N);
  void* ds = upload(b, src, N);
  void* dd = upload(b, dst, N);
  const int64_t dst_off[] = {0, 100, 1000, 2000, 2999, 4000};
  const int64_t src_off[] = {5, 3000, 17, 1000, 0, 4095};
  const int64_t nbytes[] = {100, 0, 900, 999, 1000, 1};
  DT_ASSERT_OK(b->iface->copy_ranges(b, dd, ds, 6, dst_off, src_off, nbytes));
  DT_ASSERT_OK(dt__host_copy_ranges(g_cpu, dst, src, 6, dst_off, src_off, nbytes));
  expect_dev(b, dd, dst, N, "copy_ranges");
  dev_free(b, ds, N);
  dev_free(b, dd, N);
}

static const size_t k_items[] = {1, 2, 4, 8, 12};

static int64_t prod(int n, const int64_t* v) {
  int64_t p = 1;
  for (int i = 0; i < n; i++) p *= v[i];
  return p;
}

static void test_box_copy(dt_backend_t b) {
  for (int trial = 0; trial < 300; trial++) {
    const int ndim = (int)rnd_in(1, 4);
    const size_t item = k_items[rnd() % 5];
    int64_t ext[4], ss[4], so[4], ds[4], dof[4];
    for (int d = 0; d < ndim; d++) {
      ss[d] = rnd_in(1, 7) | 1; /* odd extents */
      ext[d] = rnd_in(1, ss[d]);
      so[d] = rnd_in(0, ss[d] - ext[d]);
      ds[d] = ext[d] + rnd_in(0, 2) * 2;
      dof[d] = rnd_in(0, ds[d] - ext[d]);
      if (d > 0 && rnd() % 3 == 0) { /* whole in both arrays: merged with the dim before */
        ext[d] = ss[d] = ds[d];
        so[d] = dof[d] = 0;
      }
    }
    if (trial % 50 == 7) ext[rnd() % ndim] = 0; /* an empty box: nothing happens */
    const size_t sn = (size_t)prod(ndim, ss) * item, dn = (size_t)prod(ndim, ds) * item;
    unsigned char* src = (unsigned char*)xmalloc(sn);
    unsigned char* dst = (unsigned char*)xmalloc(dn);
    rnd_bytes(src, sn);
    rnd_bytes(dst, dn);
    void* dsrc = upload(b, src, sn);
    void* ddst = upload(b, dst, dn);
    DT_ASSERT_OK(b->iface->box_copy(b, ndim, item, ext, ddst, ds, dof, dsrc, ss, so));
    DT_ASSERT_OK(dt__host_box_copy(g_cpu, ndim, item, ext, dst, ds, dof, src, ss, so));
    char what[64];
    snprintf(what, sizeof what, "box_copy trial %d (%d dims, %zu-byte items)", trial, ndim, item);
    expect_dev(b, ddst, dst, dn, what);
    dev_free(b, dsrc, sn);
    dev_free(b, ddst, dn);
    free(src);
    free(dst);
  }
}

static void test_split_copy(dt_backend_t b) {
  for (int trial = 0; trial < 200; trial++) {
    const int ndim = (int)rnd_in(1, 4), dim = (int)rnd_in(0, ndim - 1), n = (int)rnd_in(1, 5);
    const size_t item = k_items[rnd() % 5];
    const int to_packed = trial % 2;
    int64_t shape[4], offs[5], lens[5];
    for (int d = 0; d < ndim; d++) shape[d] = rnd_in(1, 6) | 1;
    shape[dim] = rnd_in(0, 9);
    /* n blocks covering [0, shape[dim]) in pieces (some empty), in a shuffled order */
    int64_t cut[6];
    cut[0] = 0;
    cut[n] = shape[dim];
    for (int q = 1; q < n; q++) cut[q] = rnd_in(0, shape[dim]);
    for (int q = 1; q < n; q++) /* sort the inner cuts */
      for (int r = q + 1; r < n; r++)
        if (cut[r] < cut[q]) {
          int64_t t = cut[r];
          cut[r] = cut[q];
          cut[q] = t;
        }
    for (int q = 0; q < n; q++) {
      offs[q] = cut[q];
      lens[q] = cut[q + 1] - cut[q];
    }
    for (int q = n - 1; q > 0; q--) {
      int r = (int)rnd_in(0, q);
      int64_t to = offs[q], tl = lens[q];
      offs[q] = offs[r];
      lens[q] = lens[r];
      offs[r] = to;
      lens[r] = tl;
    }
    const size_t an = (size_t)prod(ndim, shape) * item, pn = an; /* the blocks cover the array */
    unsigned char* arr = (unsigned char*)xmalloc(an);
    unsigned char* pk = (unsigned char*)xmalloc(pn);
    rnd_bytes(arr, an);
    rnd_bytes(pk, pn);
    void* darr = upload(b, arr, an);
    void* dpk = upload(b, pk, pn);
    DT_ASSERT_OK(b->iface->split_copy(b, ndim, item, shape, dim, n, offs, lens, darr, dpk,
                                      to_packed));
    DT_ASSERT_OK(dt__host_split_copy(g_cpu, ndim, item, shape, dim, n, offs, lens, arr, pk,
                                     to_packed));
    char what[80];
    snprintf(what, sizeof what, "split_copy trial %d (%d dims, dim %d, %d blocks, %s)", trial,
             ndim, dim, n, to_packed ? "pack" : "unpack");
    if (to_packed) expect_dev(b, dpk, pk, pn, what);
    else expect_dev(b, darr, arr, an, what);
    dev_free(b, darr, an);
    dev_free(b, dpk, pn);
    free(arr);
    free(pk);
  }
}

/* ---------------------------------------------------------------------------------------------
 * element-wise compute */

/* n values of dtype dt: random in [-range, range] (integral or with fractions), stored with the
 * host's rounding. */
static void rnd_values(void* buf, dt_dtype_t dt, int64_t n, double range) {
  for (int64_t i = 0; i < n; i++) {
    double v = ((double)(rnd() % 2000001) / 1000000.0 - 1.0) * range;
    dt__store(buf, dt, i, v);
  }
}

static void test_scale_div(dt_backend_t b) {
  const int divs[] = {1, 2, 3, -7, 1000};
  const int64_t n = 555;
  for (int t = 0; t < DT_DTYPE_COUNT; t++) {
    dt_dtype_t dt = k_dtypes[t];
    size_t nb = (size_t)n * dt__itemsize(dt);
    for (size_t k = 0; k < sizeof divs / sizeof divs[0]; k++) {
      unsigned char* h = (unsigned char*)xmalloc(nb);
      rnd_values(h, dt, n, dt == DT_I64 ? 1e15 : dt == DT_F16 ? 60000.0 : 1e6);
      void* d = upload(b, h, nb);
      DT_ASSERT_OK(b->iface->scale_div(b, d, dt, n, divs[k]));
      DT_ASSERT_OK(dt__host_scale_div(g_cpu, h, dt, n, divs[k]));
      char what[64];
      snprintf(what, sizeof what, "scale_div %s by %d", dt_dtype_name(dt), divs[k]);
      expect_dev(b, d, h, nb, what);
      dev_free(b, d, nb);
      free(h);
    }
  }
}

static int is_int(dt_dtype_t d) { return d == DT_I32 || d == DT_I64; }

/* Source values for a conversion from `from` to `to`: random ones every pair takes, then the
 * special values the pair defines (no NaN, inf or out-of-range value into an integer: C leaves
 * those undefined). Returns the count. */
static int64_t convert_source(void* buf, dt_dtype_t from, dt_dtype_t to) {
  int64_t n = 300;
  rnd_values(buf, from, n, from == DT_F16 ? 60000.0 : 30000.0);
  if (!is_int(from) && !is_int(to)) {
    const uint32_t bits[] = {0x7fc00001u, 0xffc00000u, 0x7f800001u, 0x7fa12345u, 0x7f800000u,
                             0xff800000u, 0x80000000u, 0x00000000u, 0x00000001u, 0x00800000u,
                             0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x477ff000u, 0x477fefffu,
                             0x33000000u, 0x33000001u, 0x387fc000u, 0x7f7fffffu, 0x38800000u};
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
      if (from == DT_F32) ((float*)buf)[n++] = bits_f32(bits[i]);
      else ((uint16_t*)buf)[n++] = (uint16_t)(bits[i] >> 16); /* the top half: a bf16 pattern */
      if (from != DT_F32) ((uint16_t*)buf)[n++] = (uint16_t)(bits[i] & 0xffffu);
    }
    const double vals[] = {65504.0, 65519.0, 65520.0, 70000.0, 1e-7, 6e-8, 3e-8, -1e-40, 1e30};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) dt__store(buf, from, n++, vals[i]);
  } else if (is_int(from) && !is_int(to)) {
    const double vals[] = {16777217.0, -16777219.0, 2147483647.0, -2147483648.0, 65520.0,
                           70000.0, 1e6 + 1};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) dt__store(buf, from, n++, vals[i]);
    if (from == DT_I64) {
      const int64_t big[] = {(1ll << 53) + 1, -(1ll << 62) + 12345, INT64_MAX, INT64_MIN,
                             (1ll << 40) + (1ll << 16) + 1};
      for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) ((int64_t*)buf)[n++] = big[i];
    }
  } else if (!is_int(from) && is_int(to)) {
    const double vals[] = {0.5, -0.5, 0.999, -1.999, 1e-30, -0.0, 32767.9};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) dt__store(buf, from, n++, vals[i]);
    if (from != DT_F16) {
      dt__store(buf, from, n++, -1e9);
      dt__store(buf, from, n++, 2.1e9);
      if (to == DT_I64) dt__store(buf, from, n++, 1e15);
    }
  } else {
    const int64_t vals[] = {INT32_MAX, INT32_MIN, -1, 0};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
      dt__store(buf, from, n++, (double)vals[i]);
    if (from == DT_I64 && to == DT_I64) ((int64_t*)buf)[n++] = INT64_MIN + 3;
  }
  return n;
}

static void test_convert(dt_backend_t b) {
  for (int f = 0; f < DT_DTYPE_COUNT; f++)
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
      dt_dtype_t from = k_dtypes[f], to = k_dtypes[t];
      unsigned char src[512 * 8];
      int64_t n = convert_source(src, from, to);
      size_t sn = (size_t)n * dt__itemsize(from), dn = (size_t)n * dt__itemsize(to);
      unsigned char* want = (unsigned char*)xmalloc(dn);
      DT_ASSERT_OK(dt__host_convert(g_cpu, src, from, want, to, n));
      void* ds = upload(b, src, sn);
      void* dd = dev_alloc(b, dn);
      DT_ASSERT_OK(b->iface->convert(b, ds, from, dd, to, n));
      char what[64];
      snprintf(what, sizeof what, "convert %s -> %s", dt_dtype_name(from), dt_dtype_name(to));
      expect_dev(b, dd, want, dn, what);
      dev_free(b, ds, sn);
      dev_free(b, dd, dn);
      free(want);
    }
}

static void test_reduce(dt_backend_t b) {
  const dt_reduce_op_t ops[] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN};
  const int64_t n = 513;
  for (int t = 0; t < DT_DTYPE_COUNT; t++) {
    dt_dtype_t dt = k_dtypes[t];
    size_t nb = (size_t)n * dt__itemsize(dt);
    for (int o = 0; o < 3; o++)
      for (int inplace = 0; inplace < 2; inplace++) {
        unsigned char *a = (unsigned char*)xmalloc(nb), *s = (unsigned char*)xmalloc(nb);
        unsigned char* want = (unsigned char*)xmalloc(nb);
        rnd_values(a, dt, n, 1000.0);
        rnd_values(s, dt, n, 1000.0);
        if (is_int(dt)) { /* sums that wrap */
          dt__store(a, dt, 0, dt == DT_I32 ? 2147483000.0 : 9.2e18);
          dt__store(s, dt, 0, dt == DT_I32 ? 2147483000.0 : 9.2e18);
        } else { /* NaN in either or both, infinities, signed zeros */
          for (int64_t i = 1; i < n; i += 37) dt__store(a, dt, i, NAN);
          for (int64_t i = 2; i < n; i += 41) dt__store(s, dt, i, -NAN);
          dt__store(a, dt, 2, NAN);
          dt__store(a, dt, 3, INFINITY);
          dt__store(s, dt, 3, -INFINITY);
          dt__store(a, dt, 4, 0.0);
          dt__store(s, dt, 4, -0.0);
          dt__store(a, dt, 5, -0.0);
          dt__store(s, dt, 5, 0.0);
        }
        void* da = upload(b, a, nb);
        void* dsrc = upload(b, s, nb);
        void* dd = inplace ? da : dev_alloc(b, nb);
        DT_ASSERT_OK(b->iface->reduce(b, dd, da, dsrc, dt, n, ops[o]));
        DT_ASSERT_OK(dt__host_reduce(g_cpu, inplace ? a : want, a, s, dt, n, ops[o]));
        char what[64];
        snprintf(what, sizeof what, "reduce %s %s%s", dt_reduce_op_name(ops[o]),
                 dt_dtype_name(dt), inplace ? " in place" : "");
        if (ops[o] == DT_REDUCE_SUM) expect_dev_values(b, dd, inplace ? a : want, n, dt, what);
        else expect_dev(b, dd, inplace ? a : want, nb, what); /* NaNs are chosen, not computed */
        if (!inplace) dev_free(b, dd, nb);
        dev_free(b, da, nb);
        dev_free(b, dsrc, nb);
        free(a);
        free(s);
        free(want);
      }
  }
  /* avg is not a local step: both refuse it the same way */
  float x = 1.0f;
  DT_ASSERT_STATUS(b->iface->reduce(b, &x, &x, &x, DT_F32, 1, DT_REDUCE_AVG), DT_ERR_INTERNAL);
}

/* ---------------------------------------------------------------------------------------------
 * GEMM */

/* Elements an operand of rows x cols (row stride ld) spans over `batch` matrices `stride` apart. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* One GEMM on both backends; small integers (halves for beta) keep every f32 step exact. */
static void gemm_case(dt_backend_t b, dt_dtype_t ab, dt_dtype_t ct, int ta, int tb, int64_t batch,
                      int bias, float beta, int64_t m, int64_t n, int64_t k) {
  const int64_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
  const int64_t lda = ca + 1, ldb = cb + 2, ldc = n + 1;
  const int64_t sa = ra * lda + 3, sb = rb * ldb + 1, sc = m * ldc + 5;
  const int64_t na = span(ra, ca, lda, sa, batch), nbm = span(rb, cb, ldb, sb, batch);
  const int64_t nc = span(m, n, ldc, sc, batch);
  const size_t ia = dt__itemsize(ab), ic = dt__itemsize(ct);
  unsigned char* ha = (unsigned char*)xmalloc((size_t)(na ? na : 1) * ia);
  unsigned char* hb = (unsigned char*)xmalloc((size_t)(nbm ? nbm : 1) * ia);
  unsigned char* hc = (unsigned char*)xmalloc((size_t)(nc ? nc : 1) * ic);
  unsigned char* hbias = (unsigned char*)xmalloc((size_t)n * ic + 1);
  for (int64_t i = 0; i < na; i++) dt__store(ha, ab, i, (double)rnd_in(-3, 3));
  for (int64_t i = 0; i < nbm; i++) dt__store(hb, ab, i, (double)rnd_in(-3, 3));
  for (int64_t i = 0; i < nc; i++) /* beta 0: C is not read, NaNs there do not matter */
    dt__store(hc, ct, i, beta == 0.0f && i % 7 == 0 ? NAN : (double)rnd_in(-4, 4));
  for (int64_t i = 0; i < n; i++) dt__store(hbias, ct, i, (double)rnd_in(-2, 2));
  void* da = upload(b, ha, (size_t)(na ? na : 1) * ia);
  void* db = upload(b, hb, (size_t)(nbm ? nbm : 1) * ia);
  void* dc = upload(b, hc, (size_t)(nc ? nc : 1) * ic);
  void* dbias = upload(b, hbias, (size_t)n * ic + 1);
  dt_gemm_t g = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .batch = batch,
                 .alpha = batch > 1 ? 2.0f : 1.0f, .beta = beta, .ab_dtype = ab, .c_dtype = ct,
                 .a = da, .lda = lda, .stride_a = sa, .b = db, .ldb = ldb, .stride_b = sb,
                 .c = dc, .ldc = ldc, .stride_c = sc, .bias = bias ? dbias : NULL};
  DT_ASSERT_OK(b->iface->gemm(b, &g));
  g.a = ha;
  g.b = hb;
  g.c = hc;
  g.bias = bias ? hbias : NULL;
  DT_ASSERT_OK(dt__host_gemm(g_cpu, &g));
  char what[128];
  snprintf(what, sizeof what, "gemm %s x %s -> %s, ta %d tb %d, %lldx%lldx%lld, batch %lld, "
           "bias %d, beta %g", dt_dtype_name(ab), dt_dtype_name(ab), dt_dtype_name(ct), ta, tb,
           (long long)m, (long long)n, (long long)k, (long long)batch, bias, beta);
  expect_dev(b, dc, hc, (size_t)nc * ic, what);
  dev_free(b, da, (size_t)(na ? na : 1) * ia);
  dev_free(b, db, (size_t)(nbm ? nbm : 1) * ia);
  dev_free(b, dc, (size_t)(nc ? nc : 1) * ic);
  dev_free(b, dbias, (size_t)n * ic + 1);
  free(ha);
  free(hb);
  free(hc);
  free(hbias);
}

static void test_gemm(dt_backend_t b) {
  const dt_dtype_t abs[] = {DT_F32, DT_BF16, DT_F16};
  for (int i = 0; i < 3; i++)
    for (int cf = 0; cf < 2; cf++) {
      dt_dtype_t ct = cf ? abs[i] : DT_F32;
      if (cf && abs[i] == DT_F32) continue;
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int64_t batch = 1; batch <= 3; batch += 2)
            for (int bias = 0; bias < 2; bias++)
              for (int be = 0; be < 2; be++)
                gemm_case(b, abs[i], ct, ta, tb, batch, bias, be ? 0.5f : 0.0f, 5, 7, 9);
    }
  /* larger shapes, the same plan twice (a cached plan), TF32 with exact inputs */
  gemm_case(b, DT_BF16, DT_F32, 0, 1, 2, 1, 0.5f, 67, 45, 130);
  gemm_case(b, DT_BF16, DT_F32, 0, 1, 2, 1, 0.5f, 67, 45, 130);
  gemm_case(b, DT_F16, DT_F16, 1, 0, 1, 0, 0.0f, 33, 64, 96);
  int tf32 = b->allow_tf32;
  b->allow_tf32 = 1;
  gemm_case(b, DT_F32, DT_F32, 0, 0, 1, 1, 1.0f, 40, 24, 64);
  b->allow_tf32 = tf32;
  /* k = 0: C = beta C (+ bias); m or n = 0: nothing */
  for (int i = 0; i < 3; i++) {
    gemm_case(b, abs[i], DT_F32, 0, 0, 3, 1, 0.5f, 4, 6, 0);
    gemm_case(b, abs[i], abs[i], 1, 1, 1, 0, 0.0f, 4, 6, 0);
    gemm_case(b, abs[i], DT_F32, 0, 0, 2, 1, 0.5f, 0, 6, 5);
    gemm_case(b, abs[i], abs[i], 0, 0, 2, 0, 0.5f, 4, 0, 5);
  }
  /* C of another dtype is not a GEMM this interface has */
  dt_gemm_t bad = {.m = 1, .n = 1, .k = 1, .batch = 1, .ab_dtype = DT_BF16, .c_dtype = DT_F16};
  DT_ASSERT_STATUS(b->iface->gemm(b, &bad), DT_ERR_UNSUPPORTED);
}

/* ---------------------------------------------------------------------------------------------
 * allocator, events, staging, kernels, release */

static void stats(stats_fn fn, dt_backend_t b, int64_t* live, int64_t* cached, int64_t* mallocs) {
  int64_t peak = -1;
  DT_ASSERT_OK(fn(b, live, cached, &peak, mallocs));
  DT_ASSERT_TRUE(peak >= *live, "peak %lld below live %lld", (long long)peak, (long long)*live);
}

static void test_allocator(dt_backend_t b, stats_fn fn) {
  const struct dt_backend_i* f = b->iface;
  int64_t live0, cached0, m0, live, cached, m;
  DT_ASSERT_STATUS(fn(g_cpu, &live, NULL, NULL, NULL), DT_ERR_INVALID_ARG);
  stats(fn, b, &live0, &cached0, &m0);
  /* a freed block is handed out again without cudaMalloc */
  void* p = dev_alloc(b, 1000);
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(live, live0 + 1024); /* 512-byte granules */
  f->free(b, p, 1000);
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(live, live0);
  DT_ASSERT_TRUE(cached >= 1024, "cached %lld after a free", (long long)cached);
  int64_t m1 = m;
  void* q = dev_alloc(b, 1000);
  DT_ASSERT_TRUE(q == p, "the cached block comes back");
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(m, m1);
  void* r = dev_alloc(b, 900); /* same class, none cached: a new block */
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_TRUE(r != q, "a second block");
  f->free(b, q, 1000);
  f->free(b, r, 900);
  /* large blocks: 2 MiB classes */
  p = dev_alloc(b, 3u << 20);
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(live, live0 + (4 << 20));
  f->free(b, p, 3u << 20);
  m1 = m;
  q = dev_alloc(b, (7u << 19)); /* 3.5 MiB: the same 4 MiB class */
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_TRUE(q == p && m == m1, "a 4 MiB block reused");
  f->free(b, q, 7u << 19);
  /* the cap (DTENSOR_CUDA_MAX_MB, set by main): too much is NULL; cached blocks make room */
  DT_ASSERT_TRUE(f->alloc(b, (size_t)(CAP_MB + 1) << 20) == NULL, "above the cap");
  p = dev_alloc(b, (size_t)40 << 20);
  f->free(b, p, (size_t)40 << 20);
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_TRUE(cached >= (40 << 20), "40 MiB cached");
  m1 = m;
  q = dev_alloc(b, (size_t)30 << 20); /* 40 cached + 30 > 64: the cache is released first */
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(m, m1 + 1);
  DT_ASSERT_TRUE(live + cached <= ((int64_t)CAP_MB << 20), "held %lld within the cap",
                 (long long)(live + cached));
  f->free(b, q, (size_t)30 << 20);
  /* through the tensor layer: out of memory, with a message */
  dt_mesh_t mesh = NULL;
  int one = 1;
  DT_ASSERT_OK(dt_mesh_create(1, &one, NULL, NULL, &mesh));
  DT_ASSERT_OK(dt_mesh_set_backend(mesh, b));
  dt_placement_t rep = dt_replicate();
  int64_t big = ((int64_t)(CAP_MB * 2) << 20) / 4, small = 1000;
  dt_tensor_t t = NULL;
  DT_ASSERT_STATUS(dt_tensor_empty(mesh, DT_F32, 1, &big, &rep, &t), DT_ERR_OUT_OF_MEMORY);
  DT_ASSERT_TRUE(t == NULL, "no tensor");
  DT_ASSERT_OK(dt_tensor_empty(mesh, DT_F32, 1, &small, &rep, &t));
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

static void test_events(dt_backend_t b) {
  const struct dt_backend_i* f = b->iface;
  void* ev = NULL;
  int done = -1;
  size_t nb = (size_t)1 << 20;
  void* d = dev_alloc(b, nb);
  DT_ASSERT_OK(f->fill(b, d, DT_F32, (int64_t)(nb / 4), 3.0));
  DT_ASSERT_OK(f->event_record(b, &ev));
  DT_ASSERT_TRUE(ev != NULL, "an event");
  DT_ASSERT_OK(f->event_wait(b, ev));
  DT_ASSERT_OK(f->event_sync(b, ev));
  DT_ASSERT_OK(f->event_query(b, ev, &done));
  DT_ASSERT_EQ(done, 1);
  f->event_free(b, ev);
  /* freed while (possibly) pending, then many at once (past the pool) */
  DT_ASSERT_OK(f->fill(b, d, DT_F32, (int64_t)(nb / 4), 4.0));
  DT_ASSERT_OK(f->event_record(b, &ev));
  f->event_free(b, ev);
  void* evs[100];
  for (int i = 0; i < 100; i++) DT_ASSERT_OK(f->event_record(b, &evs[i]));
  for (int i = 0; i < 100; i++) f->event_free(b, evs[i]);
  f->event_free(b, NULL);
  DT_ASSERT_OK(f->synchronize(b));
  float x = 0.0f;
  download(b, &x, (char*)d + nb - 4, 4);
  DT_ASSERT_TRUE(x == 4.0f, "fill before the events: %g", x);
  dev_free(b, d, nb);
}

static void test_host_staging(dt_backend_t b) {
  const struct dt_backend_i* f = b->iface;
  size_t n = 10000;
  unsigned char* h1 = (unsigned char*)f->host_alloc(b, n);
  unsigned char* h2 = (unsigned char*)f->host_alloc(b, n);
  DT_ASSERT_TRUE(h1 != NULL && h2 != NULL, "host_alloc");
  rnd_bytes(h1, n);
  void* d = upload(b, h1, n);
  download(b, h2, d, n);
  expect_same(h2, h1, n, "copy through host_alloc memory");
  dev_free(b, d, n);
  f->host_free(b, h1, n);
  f->host_free(b, h2, n);
  f->host_free(b, NULL, 0);
}

/* A "kernel" that works through the backend (so it runs on device memory too): out = in / 2. */
static dt_status_t halve_kernel(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                dt_local_tensor_t* out) {
  (void)call;
  dt_backend_t b = out[0].backend;
  if (in[0].dtype != DT_F32 || out[0].dtype != DT_F32) return DT_ERR_INTERNAL; /* f32 copies */
  DT_CHECK(b->iface->copy(b, out[0].data, in[0].data, (size_t)in[0].shape[0] * 4, DT_COPY_D2D));
  return b->iface->scale_div(b, out[0].data, DT_F32, in[0].shape[0], 2);
}

static void test_run_kernel(dt_backend_t b) {
  DT_ASSERT_TRUE(b->iface->run_kernel == dt__backend_run_kernel, "the generic run_kernel");
  const int64_t n = 100;
  uint16_t h[100], want[100];
  rnd_values(h, DT_BF16, n, 100.0);
  for (int64_t i = 0; i < n; i++) want[i] = dt__f32_to_bf16(dt__bf16_to_f32(h[i]) / 2.0f);
  void* din = upload(b, h, sizeof h);
  void* dout = dev_alloc(b, sizeof h);
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  call.op = "halve";
  call.n_inputs = 1;
  dt_local_tensor_t in, out;
  memset(&in, 0, sizeof in);
  in.dtype = DT_BF16;
  in.ndim = 1;
  in.shape[0] = n;
  in.data = din;
  in.backend = b;
  out = in;
  out.data = dout;
  DT_ASSERT_OK(b->iface->run_kernel(b, halve_kernel, DT_KERNEL_WRITES_ALL, &call, &in, 1, &out, 1));
  expect_dev(b, dout, want, sizeof want, "run_kernel with bf16 storage");
  dev_free(b, din, sizeof h);
  dev_free(b, dout, sizeof h);
}

/* The kernels that take bf16/f16 storage in place (DT_KERNEL_ONE_DTYPE, the GEMMs, attention)
 * check that their float tensors share one float dtype (dt_cu_one_float): an integer where a
 * float belongs fails through the runner (which copies only float tensors), a mix of float
 * dtypes when the kernel is called around the runner; index tensors are not looked at. The
 * dtype checks come before any data is read, so the tensors hold none. */
static void test_one_float(dt_backend_t b) {
  static const struct {
    int op, n_in, n_out;
    dt_dtype_t dt[6]; /* inputs then outputs */
    int direct;       /* call the kernel itself, not through run_kernel */
    const char* msg;
  } cases[] = {
      {DT_OP_RELU, 1, 1, {DT_I32, DT_I32}, 0, "dtype i32 is not supported"},
      {DT_OP_SUM, 1, 1, {DT_I32, DT_I32}, 0, "dtypes i32 -> i32 are not supported"}, /* i64 out */
      {DT_OP_SUM, 1, 1, {DT_F32, DT_BF16}, 1, "output 0 is bf16, input 0 is f32"},
      {DT_OP_EMBEDDING_GRAD, 2, 1, {DT_I64, DT_I64, DT_F32}, 0, "dtype i64 is not supported"},
      {DT_OP_EMBEDDING_GRAD, 2, 1, {DT_BF16, DT_I64, DT_F32}, 1, "output 0 is f32, input 0 is bf16"},
      {DT_OP_INDEX_ADD, 3, 1, {DT_F32, DT_I64, DT_BF16, DT_F32}, 1, "input 2 is bf16, input 0 is f32"},
      {DT_OP_RMS_NORM_GRAD, 3, 2, {DT_F32, DT_F32, DT_F32, DT_F32, DT_I32}, 0,
       "output 1 is i32, input 0 is f32"},
      {DT_OP_MM, 2, 1, {DT_F16, DT_F16, DT_F32}, 1, "output 0 is f32, input 0 is f16"},
      {DT_OP_SDPA, 3, 1, {DT_BF16, DT_I32, DT_BF16, DT_BF16}, 0, "input 1 is i32, input 0 is bf16"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    unsigned flags = 0;
    dt_op_kernel_fn fn = dt__op_kernel(cases[c].op, b, &flags);
    DT_ASSERT_TRUE(fn != NULL, "case %zu: no kernel", c);
    dt_local_tensor_t t[6];
    memset(t, 0, sizeof t);
    for (int i = 0; i < cases[c].n_in + cases[c].n_out; i++) {
      t[i].dtype = cases[c].dt[i];
      t[i].ndim = 2;
      t[i].shape[0] = t[i].shape[1] = 4;
      t[i].backend = b;
    }
    dt_op_call_t call;
    memset(&call, 0, sizeof call);
    call.op = dt__op_table[cases[c].op].name;
    call.n_inputs = cases[c].n_in;
    dt_local_tensor_t* out = &t[cases[c].n_in];
    dt_status_t st = cases[c].direct
                         ? fn(&call, t, out)
                         : b->iface->run_kernel(b, fn, flags, &call, t, cases[c].n_in, out,
                                                cases[c].n_out);
    DT_ASSERT_STATUS(st, DT_ERR_UNSUPPORTED);
    DT_ASSERT_TRUE(strstr(dt_last_error(), cases[c].msg) != NULL &&
                       strstr(dt_last_error(), call.op) != NULL,
                   "case %zu: %s", c, dt_last_error());
  }
}

/* release frees the cache and library handles; live blocks are freed later, and everything
 * works again afterwards. */
static void test_release(dt_backend_t b, stats_fn fn) {
  int64_t live0, live, cached, m;
  stats(fn, b, &live0, &cached, &m);
  void* keep = dev_alloc(b, 5000);
  void* drop = dev_alloc(b, 6000);
  b->iface->free(b, drop, 6000);
  b->iface->release(b);
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(cached, 0);
  DT_ASSERT_EQ(live, live0 + 5120);
  b->iface->free(b, keep, 5000); /* after release: straight back */
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_EQ(live, live0);
  DT_ASSERT_EQ(cached, 0);
  gemm_case(b, DT_F32, DT_F32, 0, 0, 1, 1, 0.0f, 3, 4, 5); /* handles come back */
  void* p = dev_alloc(b, 5000); /* and the cache */
  b->iface->free(b, p, 5000);
  int64_t m1 = 0;
  stats(fn, b, &live, &cached, &m1);
  void* q = dev_alloc(b, 5000);
  stats(fn, b, &live, &cached, &m);
  DT_ASSERT_TRUE(q == p && m == m1, "caching again after release");
  b->iface->free(b, q, 5000);
  void* ev = NULL;
  DT_ASSERT_OK(b->iface->event_record(b, &ev));
  b->iface->event_free(b, ev);
}

/* ---------------------------------------------------------------------------------------------
 * driver */

static void test_backend(dt_backend_t b, stats_fn fn, int kernel_set) {
  printf("%s: testing backend %s\n", __FILE__, dt_backend_name(b));
  fflush(stdout);
  dt_device_t dev;
  int ord = -2;
  DT_ASSERT_OK(dt_backend_device(b, &dev));
  DT_ASSERT_EQ(dev, DT_DEVICE_CUDA);
  DT_ASSERT_OK(dt_backend_ordinal(b, &ord));
  DT_ASSERT_TRUE(ord >= 0, "ordinal %d", ord);
  DT_ASSERT_EQ(b->kernel_set, kernel_set);
  DT_ASSERT_EQ(b->api_version, DT_BACKEND_API_VERSION);
  DT_ASSERT_EQ(b->pooled, 0);
  DT_ASSERT_OK(dt_backend_verify(b, NULL));
  DT_ASSERT_OK(dt_backend_synchronize(b));
  test_memset(b);
  test_fill(b);
  test_copy(b);
  test_copy_ranges(b);
  test_box_copy(b);
  test_split_copy(b);
  test_scale_div(b);
  test_convert(b);
  test_reduce(b);
  test_gemm(b);
  test_events(b);
  test_host_staging(b);
  test_run_kernel(b);
  test_one_float(b);
  if (fn != NULL) {
    test_allocator(b, fn);
    test_release(b, fn);
  } else {
    printf("%s: no allocator statistics linked for %s: allocator checks skipped\n", __FILE__,
           dt_backend_name(b));
  }
  DT_ASSERT_OK(dt_backend_synchronize(b));
  printf("%s: backend %s OK\n", __FILE__, dt_backend_name(b));
}

int main(void) {
  int tested = 0;
  dt_backend_t b = NULL;
  char cap[16];
  snprintf(cap, sizeof cap, "%d", CAP_MB);
  setenv("DTENSOR_CUDA_MAX_MB", cap, 1); /* read once, when the first backend opens */
  DT_ASSERT_OK(dt_init(NULL, NULL));

  dt_status_t st = dt_backend_get("cuda-emu", &b);
  if (st == DT_SUCCESS) {
    dt_backend_t again = NULL;
    DT_ASSERT_OK(dt_backend_get("cuda-emu", &again));
    DT_ASSERT_TRUE(again == b, "one cuda-emu backend");
    DT_ASSERT_TRUE(strcmp(dt_backend_name(b), "cuda-emu") == 0, "name %s", dt_backend_name(b));
    test_backend(b, dt__cudaemu_allocator_stats, DT_KERNELS_CUDA_EMU);
    tested++;
  } else {
    DT_ASSERT_TRUE(st == DT_ERR_UNSUPPORTED, "cuda-emu: %s: %s", dt_status_name(st),
                   dt_last_error());
    printf("%s: cuda-emu not built: %s\n", __FILE__, dt_last_error());
  }

  b = NULL;
  st = dt_backend_get("cuda", &b);
  if (st == DT_SUCCESS) {
    int ord = -1;
    dt_backend_t same = NULL;
    char name[16];
    DT_ASSERT_OK(dt_backend_ordinal(b, &ord));
    snprintf(name, sizeof name, "cuda:%d", ord);
    DT_ASSERT_OK(dt_backend_get(name, &same)); /* one object per device, however named */
    DT_ASSERT_TRUE(same == b && strcmp(dt_backend_name(b), "cuda") == 0, "%s is %s",
                   name, dt_backend_name(same));
    DT_ASSERT_STATUS(dt_backend_get("cuda:1000", &same), DT_ERR_INVALID_ARG);
    setenv("DTENSOR_CUDA_DEVICE", "zero", 1);
    DT_ASSERT_STATUS(dt_backend_get("cuda", &same), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "DTENSOR_CUDA_DEVICE") != NULL, "%s", dt_last_error());
    unsetenv("DTENSOR_CUDA_DEVICE");
    test_backend(b, dt__cuda_allocator_stats, DT_KERNELS_CUDA);
    tested++;
  } else if (st == DT_ERR_CUDA) {
    DT_ASSERT_TRUE(b == NULL, "no backend on failure");
    DT_ASSERT_TRUE(strstr(dt_last_error(), "unaffected") != NULL, "message: %s", dt_last_error());
    printf("%s: cuda backend not usable here (skipped): %s\n", __FILE__, dt_last_error());
    DT_ASSERT_STATUS(dt_backend_get("cuda:3", &b), DT_ERR_CUDA);
  } else {
    DT_ASSERT_TRUE(st == DT_ERR_UNSUPPORTED, "cuda: %s: %s", dt_status_name(st), dt_last_error());
    printf("%s: cuda backend not built: %s\n", __FILE__, dt_last_error());
  }
  DT_ASSERT_OK(dt_finalize());
  if (tested == 0) {
    printf("%s: no CUDA backend to test: skipped\n", __FILE__);
    return DT_TEST_SKIPPED;
  }
  return 0;
}

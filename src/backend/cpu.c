/* cpu.c - the CPU backend: host memory, OpenBLAS GEMM and the library's host kernels.
 *
 * The dt__host_* functions are the host implementation of every vtable member; the guarded
 * backend reuses them after its own checks. dt__backend_run_kernel (any backend) gives kernels
 * that compute in f32 f32 copies of bf16/f16 inputs and stores their f32 outputs back (converted
 * on load and store). GEMMs on bf16/f16 operands run in f32 on converted copies.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "placement/layout.h"

static void dt__blas_threads(void) {
  static int done = 0;
  if (done) return;
  done = 1;
  /* One BLAS thread per rank unless the user chose otherwise: ranks already run in parallel. */
  if (getenv("OPENBLAS_NUM_THREADS") == NULL) openblas_set_num_threads(1);
}

/* OpenBLAS picks its kernels by CPU model when it loads, and a release older than the CPU (Debian
 * 12's 0.3.21 on Sapphire and Emerald Rapids) falls back to its generic SSE3 kernels, 3-5x slower
 * than the AVX2 / AVX-512 ones the CPU runs (docs/performance.md). A DYNAMIC_ARCH OpenBLAS (every
 * distribution's) exports the selection it made at load: dt_init makes it again, naming through
 * OPENBLAS_CORETYPE the kernels the CPU's features allow (the variable is restored right after:
 * OpenBLAS reads it only there). Weak references: an OpenBLAS built for one target has no such
 * selection, and then only the notice is given. No BLAS call may run meanwhile: dt_init is the
 * first library call, and the rank's BLAS calls come from the library's thread. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static int dt__blas_core_generic(const char* core) {
  static const char* const kGeneric[] = {"prescott", "core2", "penryn", "dunnington", "nehalem",
                                         "atom"};
  if (core == NULL) return 0;
  for (size_t i = 0; i < sizeof kGeneric / sizeof kGeneric[0]; i++)
    if (strcasecmp(core, kGeneric[i]) == 0) return 1;
  return 0;
}

const char* dt__cpu_blas_select(void) {
  static char text[400];
  if (getenv("OPENBLAS_CORETYPE") != NULL) return NULL; /* the user's choice */
  const char* core = openblas_get_corename();
  if (!dt__blas_core_generic(core)) return NULL;
  /* the kernels to ask for, best first: an OpenBLAS older than the name (SkylakeX came in
   * 0.3.0) or built without AVX-512 kernels gives something else for it; Haswell is next */
  const char* want[2] = {NULL, NULL};
  int n_want = 0;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd"))
    want[n_want++] = "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) want[n_want++] = "Haswell";
#endif
  if (n_want == 0) return NULL;
  const char* isa = strcmp(want[0], "SkylakeX") == 0 ? "AVX-512" : "AVX2";
  char was[32];
  snprintf(was, sizeof was, "%s", core); /* the name's storage may change with the kernels */
  const int autocore = (int)dt__env_int("DTENSOR_BLAS_AUTOCORE", 0, 1, 1, "blas", "0 or 1");
  if (autocore && gotoblas_dynamic_init != NULL && gotoblas_dynamic_quit != NULL) {
    const char* now = core;
    for (int i = 0; i < n_want && dt__blas_core_generic(now); i++) {
      if (setenv("OPENBLAS_CORETYPE", want[i], 1) != 0) break;
      gotoblas_dynamic_quit();
      gotoblas_dynamic_init(); /* an unknown name: OpenBLAS's own fallback */
      unsetenv("OPENBLAS_CORETYPE");
      now = openblas_get_corename();
    }
    if (now != NULL && !dt__blas_core_generic(now)) {
      snprintf(text, sizeof text,
               "OpenBLAS chose its generic %s kernels on this CPU, which has %s: dt_init switched "
               "it to its %s kernels (OPENBLAS_CORETYPE picks them yourself; "
               "DTENSOR_BLAS_AUTOCORE=0 keeps OpenBLAS's choice)", was, isa, now);
      return text;
    }
    snprintf(text, sizeof text,
             "OpenBLAS runs its generic %s kernels on this CPU, which has %s: asking it for its "
             "%s%s%s kernels did not take (an OpenBLAS without them?); GEMMs are several times "
             "faster with an OpenBLAS that has them", now ? now : "(unknown)", isa, want[0],
             n_want > 1 ? " or " : "", n_want > 1 ? want[1] : "");
    return text;
  }
  snprintf(text, sizeof text,
           "OpenBLAS uses its generic %s kernels on this CPU, which has %s: GEMMs are several "
           "times faster with OPENBLAS_CORETYPE=%s in the environment%s", was, isa, want[0],
           autocore ? "" : " (DTENSOR_BLAS_AUTOCORE=0 kept them)");
  return text;
}

static void* dt__cpu_alloc(dt_backend_t b, size_t nbytes) {
  (void)b;
  return dt__malloc(nbytes);
}

static void dt__cpu_free(dt_backend_t b, void* p, size_t nbytes) {
  (void)b;
  (void)nbytes;
  dt__free(p);
}

dt_status_t dt__host_memset(dt_backend_t b, void* dst, int value, size_t nbytes) {
  (void)b;
  if (nbytes) memset(dst, value, nbytes);
  return DT_SUCCESS;
}

dt_status_t dt__host_fill(dt_backend_t b, void* dst, dt_dtype_t dtype, int64_t n, double value) {
  (void)b;
  if (n <= 0) return DT_SUCCESS;
  if (value == 0.0 && !signbit(value)) {
    memset(dst, 0, (size_t)n * dt__itemsize(dtype));
    return DT_SUCCESS;
  }
  if (dtype == DT_F32) {
    float v = (float)value, *f = (float*)dst;
    for (int64_t i = 0; i < n; i++) f[i] = v;
    return DT_SUCCESS;
  }
  dt__store(dst, dtype, 0, value);
  size_t item = dt__itemsize(dtype);
  for (int64_t i = 1; i < n; i++) memcpy((char*)dst + (size_t)i * item, dst, item);
  return DT_SUCCESS;
}

dt_status_t dt__host_copy(dt_backend_t b, void* dst, const void* src, size_t nbytes,
                          dt_copy_kind_t kind) {
  (void)b;
  (void)kind; /* host memory on both sides */
  if (nbytes && dst != src) memmove(dst, src, nbytes);
  return DT_SUCCESS;
}

dt_status_t dt__host_box_copy(dt_backend_t b, int ndim, size_t item, const int64_t* ext, void* dst,
                              const int64_t* dst_shape, const int64_t* dst_off, const void* src,
                              const int64_t* src_shape, const int64_t* src_off) {
  (void)b;
  dt__box_copy(ndim, item, ext, dst, dst_shape, dst_off, src, src_shape, src_off);
  return DT_SUCCESS;
}

dt_status_t dt__host_split_copy(dt_backend_t b, int ndim, size_t item, const int64_t* shape,
                                int dim, int n, const int64_t* offs, const int64_t* lens,
                                void* array, void* packed, int to_packed) {
  (void)b;
  dt__split_copy(ndim, item, shape, dim, n, offs, lens, array, packed, to_packed);
  return DT_SUCCESS;
}

dt_status_t dt__host_scale_div(dt_backend_t b, void* buf, dt_dtype_t dtype, int64_t n, int div) {
  (void)b;
  if (div == 1) return DT_SUCCESS;
  if (dtype == DT_F32) {
    float* f = (float*)buf;
    for (int64_t i = 0; i < n; i++) f[i] /= (float)div;
  } else if (dtype == DT_I32) {
    int32_t* v = (int32_t*)buf;
    for (int64_t i = 0; i < n; i++) v[i] /= div;
  } else if (dtype == DT_I64) {
    int64_t* v = (int64_t*)buf;
    for (int64_t i = 0; i < n; i++) v[i] /= div;
  } else {
    for (int64_t i = 0; i < n; i++) dt__store(buf, dtype, i, dt__load(buf, dtype, i) / div);
  }
  return DT_SUCCESS;
}

/* The bf16 conversions' loops, vectorized (DT_SIMD): every operand and bf16 kernel of a bf16 run
 * passes through them. */
DT_SIMD static void dt__f32_to_bf16_n(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = dt__f32_to_bf16(s[i]);
}
DT_SIMD static void dt__bf16_to_f32_n(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = dt__bf16_to_f32(s[i]);
}

dt_status_t dt__host_convert(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                             dt_dtype_t to, int64_t n) {
  (void)b;
  if (from == to) {
    if (n > 0 && dst != src) memmove(dst, src, (size_t)n * dt__itemsize(from));
  } else if (from == DT_F32 && to == DT_BF16) {
    dt__f32_to_bf16_n((const float*)src, (uint16_t*)dst, n);
  } else if (from == DT_BF16 && to == DT_F32) {
    dt__bf16_to_f32_n((const uint16_t*)src, (float*)dst, n);
  } else if (from == DT_F32 && to == DT_F16) {
    const float* s = (const float*)src;
    uint16_t* d = (uint16_t*)dst;
    for (int64_t i = 0; i < n; i++) d[i] = dt__f32_to_f16(s[i]);
  } else if (from == DT_F16 && to == DT_F32) {
    const uint16_t* s = (const uint16_t*)src;
    float* d = (float*)dst;
    for (int64_t i = 0; i < n; i++) d[i] = dt__f16_to_f32(s[i]);
  } else {
    for (int64_t i = 0; i < n; i++) dt__store(dst, to, i, dt__load(src, from, i));
  }
  return DT_SUCCESS;
}

#define DT__REDUCE_LOOP(T, EXPR)                         \
  do {                                                   \
    T* d = (T*)dst;                                      \
    const T *p = (const T*)a, *s = (const T*)src;        \
    for (int64_t i = 0; i < n; i++) {                    \
      T x = p[i], y = s[i];                              \
      d[i] = (EXPR);                                     \
    }                                                    \
  } while (0)

dt_status_t dt__host_reduce(dt_backend_t b, void* dst, const void* a, const void* src,
                            dt_dtype_t dtype, int64_t n, dt_reduce_op_t op) {
  (void)b;
  if (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN)
    return DT_FAIL(DT_ERR_INTERNAL, "local reduction with op %d", (int)op);
  switch (dtype) {
    case DT_F32:
      if (op == DT_REDUCE_SUM) DT__REDUCE_LOOP(float, x + y);
      else if (op == DT_REDUCE_MAX) DT__REDUCE_LOOP(float, (x > y || x != x) ? x : y);
      else DT__REDUCE_LOOP(float, (x < y || x != x) ? x : y);
      break;
    case DT_I32:
      if (op == DT_REDUCE_SUM) DT__REDUCE_LOOP(int32_t, (int32_t)((uint32_t)x + (uint32_t)y));
      else if (op == DT_REDUCE_MAX) DT__REDUCE_LOOP(int32_t, x > y ? x : y);
      else DT__REDUCE_LOOP(int32_t, x < y ? x : y);
      break;
    case DT_I64:
      if (op == DT_REDUCE_SUM) DT__REDUCE_LOOP(int64_t, (int64_t)((uint64_t)x + (uint64_t)y));
      else if (op == DT_REDUCE_MAX) DT__REDUCE_LOOP(int64_t, x > y ? x : y);
      else DT__REDUCE_LOOP(int64_t, x < y ? x : y);
      break;
    default: /* bf16/f16: in f32, rounded once per pairwise step (as the MPI user ops) */
      for (int64_t i = 0; i < n; i++) {
        float x = (float)dt__load(a, dtype, i), y = (float)dt__load(src, dtype, i);
        float r = op == DT_REDUCE_SUM ? x + y
                  : op == DT_REDUCE_MAX ? ((x > y || x != x) ? x : y)
                                        : ((x < y || x != x) ? x : y);
        dt__store(dst, dtype, i, r);
      }
      break;
  }
  return DT_SUCCESS;
}
#undef DT__REDUCE_LOOP

dt_status_t dt__host_copy_ranges(dt_backend_t b, void* dst, const void* src, int n,
                                 const int64_t* dst_off, const int64_t* src_off,
                                 const int64_t* nbytes) {
  (void)b;
  for (int i = 0; i < n; i++)
    if (nbytes[i] > 0) memmove((char*)dst + dst_off[i], (const char*)src + src_off[i], (size_t)nbytes[i]);
  return DT_SUCCESS;
}

/* f32 GEMMs through OpenBLAS, batch by batch. */
static dt_status_t dt__sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const float* a, int64_t lda, int64_t stride_a, const float* bm,
                             int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                             int64_t stride_c, int64_t batch) {
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "GEMM dimension beyond BLAS's int (%lld x %lld x %lld)",
                   (long long)m, (long long)n, (long long)k);
  dt__blas_threads();
  for (int64_t i = 0; i < batch; i++) {
    float* ci = c + i * stride_c;
    if (m == 0 || n == 0) continue;
    if (k == 0) { /* BLAS does not take k = 0 everywhere: C = beta C */
      for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) ci[r * ldc + j] = beta == 0.0f ? 0.0f : beta * ci[r * ldc + j];
      continue;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha,
                a + i * stride_a, (int)lda, bm + i * stride_b, (int)ldb, beta, ci, (int)ldc);
  }
  return DT_SUCCESS;
}

/* Elements a strided operand of `rows` x `cols` (row stride ld) spans over `batch` matrices
 * `stride` apart. */
static int64_t dt__span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* An f32 copy of a half operand's span (NULL when empty): from the storage pool on a pooled
 * backend (every step makes the same copies again; *got is the block's size), else from the heap
 * (*got 0: the emulated device's GEMMs run here too). dt__f32_copy_free releases it. */
static dt_status_t dt__f32_copy(dt_backend_t b, const void* src, dt_dtype_t dt, int64_t n,
                                float** out, size_t* got) {
  *out = NULL;
  *got = 0;
  if (n <= 0) return DT_SUCCESS;
  const size_t nbytes = sizeof(float) * (size_t)n;
  *out = (float*)(b->pooled ? dt__pool_alloc(b, nbytes, got) : dt__malloc(nbytes));
  if (*out == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "GEMM: f32 copy of %lld elements", (long long)n);
  return dt__host_convert(b, src, dt, *out, DT_F32, n);
}

static void dt__f32_copy_free(dt_backend_t b, float* p, size_t got) {
  if (got) dt__pool_free(b, p, got);
  else dt__free(p);
}

dt_status_t dt__host_gemm(dt_backend_t b, const dt_gemm_t* g) {
  const int64_t ra = g->trans_a ? g->k : g->m, ca = g->trans_a ? g->m : g->k;
  const int64_t rb = g->trans_b ? g->n : g->k, cb = g->trans_b ? g->k : g->n;
  dt_status_t st = DT_SUCCESS;
  float *a = (float*)g->a, *bm = (float*)g->b, *c = (float*)g->c;
  float *ta = NULL, *tb = NULL, *tc = NULL;
  size_t na = 0, nb = 0, nbc = 0;
  int64_t nc = dt__span(g->m, g->n, g->ldc, g->stride_c, g->batch);
  if (g->ab_dtype != DT_F32) { /* half operands: computed in f32 on converted copies */
    DT_CHECK_GOTO(dt__f32_copy(b, g->a, g->ab_dtype, dt__span(ra, ca, g->lda, g->stride_a, g->batch), &ta, &na), st, done);
    DT_CHECK_GOTO(dt__f32_copy(b, g->b, g->ab_dtype, dt__span(rb, cb, g->ldb, g->stride_b, g->batch), &tb, &nb), st, done);
    a = ta;
    bm = tb;
  }
  if (g->c_dtype != DT_F32) {
    DT_CHECK_GOTO(dt__f32_copy(b, g->c, g->c_dtype, nc, &tc, &nbc), st, done);
    c = tc;
  }
  DT_CHECK_GOTO(dt__sgemm(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, a, g->lda,
                          g->stride_a, bm, g->ldb, g->stride_b, g->beta, c, g->ldc, g->stride_c,
                          g->batch), st, done);
  if (g->bias != NULL)
    for (int64_t i = 0; i < g->batch; i++)
      for (int64_t r = 0; r < g->m; r++) {
        float* row = c + i * g->stride_c + r * g->ldc;
        for (int64_t j = 0; j < g->n; j++) row[j] += (float)dt__load(g->bias, g->c_dtype, j);
      }
  if (tc != NULL) st = dt__host_convert(b, tc, DT_F32, g->c, g->c_dtype, nc);
done:
  dt__f32_copy_free(b, ta, na);
  dt__f32_copy_free(b, tb, nb);
  dt__f32_copy_free(b, tc, nbc);
  return st;
}

static const struct dt_backend_i dt__cpu_iface = {
    .alloc = dt__cpu_alloc,
    .free = dt__cpu_free,
    .memset = dt__host_memset,
    .fill = dt__host_fill,
    .copy = dt__host_copy,
    .copy_ranges = dt__host_copy_ranges,
    .box_copy = dt__host_box_copy,
    .split_copy = dt__host_split_copy,
    .scale_div = dt__host_scale_div,
    .convert = dt__host_convert,
    .reduce = dt__host_reduce,
    .gemm = dt__host_gemm,
    .run_kernel = dt__backend_run_kernel,
};

struct dt_backend dt__backend_cpu = {
    .iface = &dt__cpu_iface,
    .api_version = DT_BACKEND_API_VERSION,
    .name = "cpu",
    .device = DT_DEVICE_HOST,
    .ordinal = -1,
    .kernel_set = DT_KERNELS_HOST,
    .pooled = 1,
};

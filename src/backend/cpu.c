/* cpu.c - the CPU backend: host memory, OpenBLAS GEMM and the library's host kernels.
 *
 * The dt__host_* functions are the host implementation of every vtable member; the guarded
 * backend reuses them after its own checks. run_kernel gives kernels that compute in f32 f32
 * copies of bf16/f16 inputs and stores their f32 outputs back (converted on load and store).
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>

#include "backend/backend.h"
#include "placement/layout.h"

static void dt__blas_threads(void) {
  static int done = 0;
  if (done) return;
  done = 1;
  /* One BLAS thread per rank unless the user chose otherwise: ranks already run in parallel. */
  if (getenv("OPENBLAS_NUM_THREADS") == NULL) openblas_set_num_threads(1);
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

dt_status_t dt__host_convert(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                             dt_dtype_t to, int64_t n) {
  (void)b;
  if (from == to) {
    if (n > 0 && dst != src) memmove(dst, src, (size_t)n * dt__itemsize(from));
  } else if (from == DT_F32 && (to == DT_BF16 || to == DT_F16)) {
    const float* s = (const float*)src;
    uint16_t* d = (uint16_t*)dst;
    for (int64_t i = 0; i < n; i++) d[i] = to == DT_BF16 ? dt__f32_to_bf16(s[i]) : dt__f32_to_f16(s[i]);
  } else if (to == DT_F32 && (from == DT_BF16 || from == DT_F16)) {
    const uint16_t* s = (const uint16_t*)src;
    float* d = (float*)dst;
    for (int64_t i = 0; i < n; i++) d[i] = from == DT_BF16 ? dt__bf16_to_f32(s[i]) : dt__f16_to_f32(s[i]);
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

dt_status_t dt__host_gemm(dt_backend_t b, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float* a, int64_t lda, int64_t stride_a,
                          const float* bm, int64_t ldb, int64_t stride_b, float beta, float* c,
                          int64_t ldc, int64_t stride_c, int64_t batch) {
  (void)b;
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

static int dt__half(dt_dtype_t t) { return t == DT_BF16 || t == DT_F16; }

static int64_t dt__local_numel(const dt_local_tensor_t* v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

dt_status_t dt__host_run_kernel(dt_backend_t b, dt_op_kernel_fn kernel, unsigned flags,
                                const dt_op_call_t* call, dt_local_tensor_t* in, int n_in,
                                dt_local_tensor_t* out, int n_out) {
  int convert = 0;
  for (int t = 0; t < n_in; t++) convert |= dt__half(in[t].dtype);
  for (int o = 0; o < n_out; o++) convert |= dt__half(out[o].dtype);
  if (!convert || (flags & DT_KERNEL_ANY_DTYPE)) return kernel(call, in, out);
  /* bf16/f16 storage: the kernel sees f32 copies (converted on load, stored back after) */
  dt_status_t st = DT_SUCCESS;
  void* tmp_in[DT_OP_MAX_INPUTS] = {NULL};
  void* tmp_out[DT_OP_MAX_OUTPUTS] = {NULL};
  size_t nb_in[DT_OP_MAX_INPUTS] = {0}, nb_out[DT_OP_MAX_OUTPUTS] = {0};
  dt_local_tensor_t lin[DT_OP_MAX_INPUTS], lout[DT_OP_MAX_OUTPUTS];
  for (int t = 0; t < n_in; t++) {
    lin[t] = in[t];
    if (!dt__half(in[t].dtype)) continue;
    int64_t n = dt__local_numel(&in[t]);
    nb_in[t] = sizeof(float) * (size_t)(n ? n : 1);
    tmp_in[t] = dt__backend_alloc(b, nb_in[t]);
    if (tmp_in[t] == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: f32 copy of input %d", call->op, t);
      goto done;
    }
    dt__mem_count(DT_MEM_OTHER, (int64_t)nb_in[t]);
    DT_CHECK_GOTO(b->iface->convert(b, in[t].data, in[t].dtype, tmp_in[t], DT_F32, n), st, done);
    lin[t].data = tmp_in[t];
    lin[t].dtype = DT_F32;
  }
  for (int o = 0; o < n_out; o++) {
    lout[o] = out[o];
    if (!dt__half(out[o].dtype)) continue;
    int64_t n = dt__local_numel(&out[o]);
    nb_out[o] = sizeof(float) * (size_t)(n ? n : 1);
    tmp_out[o] = dt__backend_alloc(b, nb_out[o]);
    if (tmp_out[o] == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: f32 buffer of output %d", call->op, o);
      goto done;
    }
    dt__mem_count(DT_MEM_OTHER, (int64_t)nb_out[o]);
    lout[o].data = tmp_out[o];
    lout[o].dtype = DT_F32;
  }
  DT_CHECK_GOTO(kernel(call, lin, lout), st, done);
  for (int o = 0; o < n_out; o++)
    if (tmp_out[o] != NULL)
      DT_CHECK_GOTO(b->iface->convert(b, tmp_out[o], DT_F32, out[o].data, out[o].dtype,
                                      dt__local_numel(&out[o])),
                    st, done);
done:
  for (int t = 0; t < n_in; t++)
    if (tmp_in[t] != NULL) {
      dt__backend_free(b, tmp_in[t], nb_in[t]);
      dt__mem_count(DT_MEM_OTHER, -(int64_t)nb_in[t]);
    }
  for (int o = 0; o < n_out; o++)
    if (tmp_out[o] != NULL) {
      dt__backend_free(b, tmp_out[o], nb_out[o]);
      dt__mem_count(DT_MEM_OTHER, -(int64_t)nb_out[o]);
    }
  return st;
}

static const struct dt_backend_i dt__cpu_iface = {
    .alloc = dt__cpu_alloc,
    .free = dt__cpu_free,
    .memset = dt__host_memset,
    .fill = dt__host_fill,
    .copy = dt__host_copy,
    .box_copy = dt__host_box_copy,
    .split_copy = dt__host_split_copy,
    .scale_div = dt__host_scale_div,
    .convert = dt__host_convert,
    .reduce = dt__host_reduce,
    .gemm = dt__host_gemm,
    .run_kernel = dt__host_run_kernel,
    .synchronize = NULL,
    .verify = NULL,
};

struct dt_backend dt__backend_cpu = {
    .iface = &dt__cpu_iface,
    .api_version = DT_BACKEND_API_VERSION,
    .name = "cpu",
    .device = DT_DEVICE_HOST,
    .pooled = 1,
};

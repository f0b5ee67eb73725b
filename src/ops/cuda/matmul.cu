/* matmul.cu - CUDA kernels of the matmul family (see cuda_ops.h for the conventions): mm, bmm,
 * mm_t, addmm, linear, linear_nobias, grouped_mm and grouped_mm_wgrad.
 *
 * Every product is one call of the backend's GEMM (dt_gemm_t: row-major, strided batches, an
 * optional bias epilogue); the kernels here only set up the descriptors and write what a GEMM
 * does not (addmm's scaled input, the zeros of empty groups). They are registered with
 * DT_KERNEL_ANY_DTYPE: bf16 and f16 operands go to the GEMM as they are, with C in the output's
 * dtype and f32 accumulation (tensor cores on a GPU), instead of f32 copies of every operand.
 *
 * The host kernels (src/ops/kernels_cpu.c, kernels_nn.c, kernels_moe.c) define the results. The
 * op table's rules give all operands of a call one dtype; an integer dtype reaches the kernel and
 * is refused with DT_ERR_UNSUPPORTED, as the host refuses it.
 *
 * grouped_mm and grouped_mm_wgrad need the per-expert row counts on the host to issue one GEMM
 * per expert: they copy the (E) counts from device memory once per call and wait for that copy
 * (see dt_mm_counts). Like the host kernels they add their FLOPs to dt_grouped_mm_flops.
 */
#include <string.h>

#include "ops/cuda/cuda_ops.h"
#ifdef DT_SIMT_EMULATE
#include "backend/cuda_rt_emu.h" /* cudaMemcpyAsync, cudaMemsetAsync, cudaStreamSynchronize */
#endif

/* Everything but the fill function has internal linkage: the file is compiled twice (nvcc and the
 * SIMT emulator) into one library, and the two builds' kernels must not meet at link time. */
namespace {

/* ---------------------------------------------------------------------------------------------
 * Helpers */

/* Element `i` of a buffer of `item`-byte elements. */
static inline void* dt_mm_at(const void* p, int64_t i, size_t item) {
  return (char*)p + (size_t)i * item;
}

/* Grid-stride loop over i in [0, n). */
#define DT_MM_FOR(i, n)                                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
       i += (int64_t)gridDim.x * blockDim.x)

/* out (rows, n) = beta * src, src (rows, n) (full) or a row (n) broadcast to every row: addmm's
 * input term, computed in f32 like the host's (float)beta * b. */
template <typename T, typename O>
__global__ void dt_mm_scaled_copy_kernel(O* out, const T* src, int64_t rows, int64_t n, int full,
                                         float beta) {
  DT_MM_FOR(i, rows * n) out[i] = dt_cu_from_f32<O>(beta * dt_cu_f32(src[full ? i : i % n]));
}
/* out = acc (f32) in the output's storage dtype: one rounding, as the host's store. */
template <typename T>
__global__ void dt_mm_store_kernel(T* out, const float* acc, int64_t n) {
  DT_MM_FOR(i, n) out[i] = dt_cu_from_f32<T>(acc[i]);
}

/* One GEMM (batch times) through the backend: C = alpha op(A) op(B) + beta C (+ bias), all
 * operands of float dtype dt (see dt_gemm_t; the backends' GEMMs take empty products and
 * k == 0, where C = beta C + bias). */
static dt_status_t dt_mm_gemm_c(const dt_local_tensor_t* t, dt_dtype_t dt, dt_dtype_t c_dt,
                                int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t batch,
                                float alpha, const void* a, int64_t lda, int64_t sa,
                                const void* b, int64_t ldb, int64_t sb, float beta, void* c,
                                int64_t ldc, int64_t sc, const void* bias) {
  dt_gemm_t g;
  memset(&g, 0, sizeof g);
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.alpha = alpha;
  g.beta = beta;
  g.ab_dtype = dt;
  g.c_dtype = c_dt;
  g.a = a;
  g.lda = lda;
  g.stride_a = sa;
  g.b = b;
  g.ldb = ldb;
  g.stride_b = sb;
  g.c = c;
  g.ldc = ldc;
  g.stride_c = sc;
  g.bias = bias;
  return t->backend->iface->gemm(t->backend, &g);
}

/* A GEMM whose C has the operands' dtype. */
static dt_status_t dt_mm_gemm(const dt_local_tensor_t* t, dt_dtype_t dt, int ta, int tb,
                              int64_t m, int64_t n, int64_t k, int64_t batch, float alpha,
                              const void* a, int64_t lda, int64_t sa, const void* b, int64_t ldb,
                              int64_t sb, float beta, void* c, int64_t ldc, int64_t sc,
                              const void* bias) {
  return dt_mm_gemm_c(t, dt, dt, ta, tb, m, n, k, batch, alpha, a, lda, sa, b, ldb, sb, beta, c,
                      ldc, sc, bias);
}

/* ---------------------------------------------------------------------------------------------
 * mm, mm_t, bmm */

/* mm: C (m, n) = A (m, k) B (k, n). */
DT_CU_KERNEL(dt_cu_mm) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 2, 0, out, 1, &dt));
  const int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  return dt_mm_gemm(&in[0], dt, 0, 0, m, n, k, 1, 1.0f, in[0].data, k, 0, in[1].data, n,
                    0, 0.0f, out[0].data, n, 0, NULL);
}

/* mm_t: C (m, n) = A^T B with A (k, m), B (k, n). */
DT_CU_KERNEL(dt_cu_mm_t) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 2, 0, out, 1, &dt));
  const int64_t k = in[0].shape[0], m = in[0].shape[1], n = in[1].shape[1];
  return dt_mm_gemm(&in[0], dt, 1, 0, m, n, k, 1, 1.0f, in[0].data, m, 0, in[1].data, n,
                    0, 0.0f, out[0].data, n, 0, NULL);
}

/* bmm: C_b (m, n) = A_b (m, k) B_b (k, n), one strided batched GEMM. */
DT_CU_KERNEL(dt_cu_bmm) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 2, 0, out, 1, &dt));
  const int64_t B = in[0].shape[0], m = in[0].shape[1], k = in[0].shape[2], n = in[1].shape[2];
  return dt_mm_gemm(&in[0], dt, 0, 0, m, n, k, B, 1.0f, in[0].data, k, m * k,
                    in[1].data, n, k * n, 0.0f, out[0].data, n, m * n, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * addmm, linear */

/* addmm (input, mat1 (M, K), mat2 (K, N)), fargs [beta = 1, alpha = 1]: out = beta * input +
 * alpha * mat1 mat2 with input (N) or (M, N). A row-vector input with beta 1 is the GEMM's bias
 * epilogue; otherwise beta * input is written first and the GEMM adds onto it (beta 1 there),
 * exactly the host's order: o = (float)beta * b, then o += alpha * mat1 mat2 (so a NaN in the
 * input stays a NaN even with beta 0). With bf16/f16 storage that sum is kept in an f32 scratch
 * and rounded to the storage dtype once, at the end, as the host's f32 kernel is. */
/* addmm's f32 sum of bf16/f16 storage (0: the bias epilogue, f32, or nothing to compute). */
static size_t dt_mm_addmm_acc_nbytes(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                     dt_dtype_t dt) {
  const double beta = dt__op_farg(DT_OP_ADDMM, call, 0);
  const int64_t M = in[1].shape[0], N = in[2].shape[1];
  if ((in[0].ndim != 2 && (float)beta == 1.0f) || M * N == 0 || dt == DT_F32) return 0;
  return sizeof(float) * (size_t)(M * N);
}
DT_CU_SCRATCH(dt_cu_addmm_scratch) {
  (void)out;
  const size_t nb = dt_mm_addmm_acc_nbytes(call, in, in[0].dtype);
  return nb ? dt_cu_scratch_size(nb) : 0;
}

DT_CU_KERNEL(dt_cu_addmm) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 3, 0, out, 1, &dt));
  const double beta = dt__op_farg(DT_OP_ADDMM, call, 0);
  const double alpha = dt__op_farg(DT_OP_ADDMM, call, 1);
  const int64_t M = in[1].shape[0], K = in[1].shape[1], N = in[2].shape[1];
  const int full = in[0].ndim == 2;
  if (!full && (float)beta == 1.0f)
    return dt_mm_gemm(&in[0], dt, 0, 0, M, N, K, 1, (float)alpha, in[1].data, K, 0,
                      in[2].data, N, 0, 0.0f, out[0].data, N, 0, in[0].data);
  if (M * N == 0)
    return dt_mm_gemm(&in[0], dt, 0, 0, M, N, K, 1, (float)alpha, in[1].data, K, 0,
                      in[2].data, N, 0, 1.0f, out[0].data, N, 0, NULL);
  float* acc = NULL; /* half storage: the f32 sum, rounded once into out at the end */
  const size_t acc_nb = dt_mm_addmm_acc_nbytes(call, in, dt);
  if (acc_nb) DT_CHECK(dt_cu_scratch(&out[0], call->op, acc_nb, (void**)&acc));
  dt_status_t st = dt_cu_float_dispatch(call->op, dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    const unsigned grid = dt_cu_grid(&out[0], M * N);
    if (acc == NULL)
      DT_CU_LAUNCH(call->op, (dt_mm_scaled_copy_kernel<T, T>), grid, DT_CU_BLOCK, 0,
                   dt_cu_stream(&out[0]), (T*)out[0].data, (const T*)in[0].data, M, N, full,
                   (float)beta);
    else
      DT_CU_LAUNCH(call->op, (dt_mm_scaled_copy_kernel<T, float>), grid, DT_CU_BLOCK, 0,
                   dt_cu_stream(&out[0]), acc, (const T*)in[0].data, M, N, full, (float)beta);
    DT_CHECK(dt_mm_gemm_c(&in[0], dt, acc ? DT_F32 : dt, 0, 0, M, N, K, 1, (float)alpha,
                          in[1].data, K, 0, in[2].data, N, 0, 1.0f, acc ? (void*)acc : out[0].data,
                          N, 0, NULL));
    if (acc != NULL)
      DT_CU_LAUNCH(call->op, dt_mm_store_kernel<T>, grid, DT_CU_BLOCK, 0, dt_cu_stream(&out[0]),
                   (T*)out[0].data, (const float*)acc, M * N);
    return DT_SUCCESS;
  });
  dt_cu_scratch_free(&out[0], acc, acc_nb);
  return st;
}

/* linear (x (..., K), weight (O, K)[, bias (O)]) and linear_nobias: out (..., O) = x weight^T
 * (+ bias), the bias through the GEMM's epilogue. Every dim of x but the last is a row. */
DT_CU_KERNEL(dt_cu_linear) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, call->n_inputs, 0, out, 1, &dt));
  const dt_local_tensor_t* x = &in[0];
  const int64_t K = x->ndim > 0 ? x->shape[x->ndim - 1] : 1, O = in[1].shape[0];
  int64_t N = 1;
  for (int d = 0; d + 1 < x->ndim; d++) N *= x->shape[d];
  return dt_mm_gemm(x, dt, 0, 1, N, O, K, 1, 1.0f, x->data, K, 0, in[1].data, K, 0,
                    0.0f, out[0].data, O, 0, call->n_inputs == 3 ? in[2].data : NULL);
}

/* ---------------------------------------------------------------------------------------------
 * grouped_mm, grouped_mm_wgrad */

/* The group offsets of the counts tensor c (E entries of i32 or i64, whole on every rank, in
 * device memory): off[e] .. off[e + 1] are expert e's rows. The counts must be non-negative and
 * sum to the T rows (the caller's data: DT_ERR_INVALID_ARG with the host kernel's message).
 * *off (E + 1 entries) is freed by the caller with dt__free.
 *
 * This is the one place the matmul kernels wait for the device: one GEMM per expert needs each
 * expert's row range on the host, and those sizes are data. The copy is issued on the compute
 * stream, after the kernel that wrote the counts, and the stream is synchronized before the
 * host reads them (on pageable memory cudaMemcpyAsync may return before the bytes arrived). */
static dt_status_t dt_mm_counts(const dt_op_call_t* call, const dt_local_tensor_t* c, int64_t T,
                                int64_t** off) {
  *off = NULL;
  if (c->dtype != DT_I32 && c->dtype != DT_I64)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: counts of dtype %s (i32 or i64 only)", call->op,
                   dt_dtype_name(c->dtype));
  const int64_t E = c->ndim > 0 ? c->shape[0] : 0;
  const size_t item = c->dtype == DT_I64 ? 8 : 4, nbytes = item * (size_t)E;
  int64_t* o = (int64_t*)dt__malloc(sizeof(int64_t) * (size_t)(E + 1) + nbytes);
  if (o == NULL)
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: %lld group offsets", call->op, (long long)E + 1);
  void* host = o + (E + 1); /* the raw counts after the offsets */
  if (nbytes > 0) {
    cudaStream_t s = dt_cu_stream(c);
    int rc = (int)cudaMemcpyAsync(host, c->data, nbytes, cudaMemcpyDeviceToHost, s);
    if (rc == 0) rc = (int)cudaStreamSynchronize(s);
    if (rc != 0) {
      dt__free(o);
      return DT_CUDA_NAME(status)(rc, "grouped_mm counts copy");
    }
  }
  o[0] = 0;
  for (int64_t e = 0; e < E; e++) {
    const int64_t n = item == 8 ? ((const int64_t*)host)[e] : ((const int32_t*)host)[e];
    if (n < 0) {
      dt__free(o);
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: counts[%lld] = %lld is negative", call->op,
                     (long long)e, (long long)n);
    }
    o[e + 1] = o[e] + n;
  }
  if (o[E] != T) {
    const int64_t sum = o[E];
    dt__free(o);
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: counts sum to %lld, the tokens have %lld rows",
                   call->op, (long long)sum, (long long)T);
  }
  *off = o;
  return DT_SUCCESS;
}

/* Zeros nbytes of device memory on t's stream (0 bits are 0.0 in every float dtype). */
static dt_status_t dt_mm_zero(const dt_local_tensor_t* t, void* p, size_t nbytes) {
  if (nbytes == 0) return DT_SUCCESS;
  const int rc = (int)cudaMemsetAsync(p, 0, nbytes, dt_cu_stream(t));
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, "matmul zero fill");
}

/* grouped_mm (x (T, K), w, counts (E)), iargs [trans = 1]: for each local expert e, the local rows
 * in [off[e], off[e + 1]) times W_e (w (E, N, K) with trans 1, (E, K, N) with trans 0; local
 * slices of its dims). Rows of experts this rank does not hold (experts sharded) are zeros. */
DT_CU_KERNEL(dt_cu_grouped_mm) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 2, 0, out, 1, &dt));
  int trans;
  DT_CHECK(dt__grouped_mm_args(call, &trans));
  const dt_local_tensor_t *x = &in[0], *w = &in[1];
  const size_t item = dt__itemsize(dt);
  int64_t* off;
  DT_CHECK(dt_mm_counts(call, &in[2], call->in[0].shape[0], &off));
  const int64_t r0 = x->offset[0], Tl = x->shape[0], K = x->shape[1], N = out[0].shape[1];
  const int64_t e0 = w->offset[0], El = w->shape[0];
  dt_status_t st = DT_SUCCESS;
  if (El != call->in[1].shape[0]) st = dt_mm_zero(&out[0], out[0].data, item * (size_t)(Tl * N));
  for (int64_t e = e0; e < e0 + El && st == DT_SUCCESS; e++) {
    const int64_t lo = off[e] > r0 ? off[e] : r0;
    const int64_t hi = off[e + 1] < r0 + Tl ? off[e + 1] : r0 + Tl;
    if (hi <= lo) continue;
    st = dt_mm_gemm(x, dt, 0, trans, hi - lo, N, K, 1, 1.0f,
                    dt_mm_at(x->data, (lo - r0) * K, item), K, 0,
                    dt_mm_at(w->data, (e - e0) * N * K, item), trans ? K : N, 0, 0.0f,
                    dt_mm_at(out[0].data, (lo - r0) * N, item), N, 0, NULL);
    if (st == DT_SUCCESS) dt__grouped_mm_flops_add(2 * (hi - lo) * N * K);
  }
  dt__free(off);
  return st;
}

/* grouped_mm_wgrad (a (T, M), b (T, N), counts (E)): out_e (M, N) = a_e^T b_e over the local rows
 * of each local expert; zeros for an expert without local rows. */
DT_CU_KERNEL(dt_cu_grouped_mm_wgrad) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 2, 0, out, 1, &dt));
  const dt_local_tensor_t *a = &in[0], *b = &in[1];
  const size_t item = dt__itemsize(dt);
  int64_t* off;
  DT_CHECK(dt_mm_counts(call, &in[2], call->in[0].shape[0], &off));
  const int64_t r0 = a->offset[0], Tl = a->shape[0], M = out[0].shape[1], N = out[0].shape[2];
  const int64_t e0 = out[0].offset[0], El = out[0].shape[0];
  dt_status_t st = DT_SUCCESS;
  for (int64_t e = e0; e < e0 + El && st == DT_SUCCESS; e++) {
    const int64_t lo = off[e] > r0 ? off[e] : r0;
    const int64_t hi = off[e + 1] < r0 + Tl ? off[e + 1] : r0 + Tl;
    void* oe = dt_mm_at(out[0].data, (e - e0) * M * N, item);
    if (hi <= lo) { /* no rows: a zero gradient */
      st = dt_mm_zero(&out[0], oe, item * (size_t)(M * N));
      continue;
    }
    st = dt_mm_gemm(a, dt, 1, 0, M, N, hi - lo, 1, 1.0f,
                    dt_mm_at(a->data, (lo - r0) * M, item), M, 0,
                    dt_mm_at(b->data, (lo - r0) * N, item), N, 0, 0.0f, oe, N, 0, NULL);
    if (st == DT_SUCCESS) dt__grouped_mm_flops_add(2 * (hi - lo) * M * N);
  }
  dt__free(off);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * Registration: every kernel takes bf16/f16 storage itself (the GEMM does). */

}  // namespace

DT_CU_FILL(matmul) {
  t[DT_OP_MM] = {dt_cu_mm, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_BMM] = {dt_cu_bmm, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_MM_T] = {dt_cu_mm_t, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ADDMM] = {dt_cu_addmm, DT_KERNEL_ANY_DTYPE, dt_cu_addmm_scratch};
  t[DT_OP_LINEAR] = {dt_cu_linear, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LINEAR_NOBIAS] = {dt_cu_linear, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_GROUPED_MM] = {dt_cu_grouped_mm, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_GROUPED_MM_WGRAD] = {dt_cu_grouped_mm_wgrad, DT_KERNEL_ANY_DTYPE, NULL};
}

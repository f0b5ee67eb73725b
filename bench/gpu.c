/* gpu.c - GPU benchmarks of the cuda backend (built with DTENSOR_CUDA; exits 77 without a GPU).
 *
 *   build/bench/bench_gpu [--quick]          (one rank: mpirun -np 1, or no mpirun)
 *
 * 1. dt_mm in bf16 (f32 accumulation) on n x n x n for n = 4096 and 8192 against the same
 *    cuBLASLt matmul made directly (same operand layout, compute type, workspace size and the
 *    first heuristic's algorithm), alternating the two 5 times, 20 products each, timed with
 *    CUDA events around the batch; the ratio is ours / direct in throughput (>= 0.95 wanted).
 *    The direct call is what dt_mm's kernel issues underneath, so the gap is dispatch, output
 *    allocation and the descriptor cache.
 * 2. The same in f32 with TF32 off and on (dt_backend_set_tf32), ours only, for reference.
 * 3. Host staging: redistribution of device tensors goes through host memory (the MPI comm is not
 *    CUDA-aware); this measures a 64 MiB device<->host copy each way (GB/s) so the staging cost
 *    of bench_redistribute runs with --device cuda can be read against the host path.
 * The last line: gemm_vs_cublaslt=<min over n of ours/direct> tflops_bf16_8192=<ours>
 * d2h_gbps=<x> h2d_gbps=<y>
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "bench.h"

#define CU(call)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                      \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)
#define LT(call)                                                                       \
  do {                                                                                 \
    cublasStatus_t s_ = (call);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      fprintf(stderr, "%s: cublas status %d\n", #call, (int)s_);                       \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* The direct cuBLASLt product C (n x n, row-major bf16) = A B, as the backend maps it:
 * column-major C^T = B^T A^T. Times `iters` calls on `stream`, in ms per call. */
static double direct_gemm_ms(int n, const void* a, const void* b, void* c, void* ws,
                             size_t ws_nbytes, cudaStream_t stream, int iters) {
  cublasLtHandle_t h;
  LT(cublasLtCreate(&h));
  cublasLtMatmulDesc_t op;
  LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t la, lb, lc;
  LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n)); /* B^T as col-major: first */
  LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n));
  LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &ws_nbytes, sizeof ws_nbytes));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(h, op, lb, la, lc, lc, pref, 1, &res, &found));
  if (found < 1) {
    fprintf(stderr, "bench_gpu: no cuBLASLt algorithm for %d^3 bf16\n", n);
    exit(1);
  }
  const float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  LT(cublasLtMatmul(h, op, &alpha, b, lb, a, la, &beta, c, lc, c, lc, &res.algo, ws, ws_nbytes,
                    stream)); /* warm-up */
  CU(cudaEventRecord(e0, stream));
  for (int i = 0; i < iters; i++)
    LT(cublasLtMatmul(h, op, &alpha, b, lb, a, la, &beta, c, lc, c, lc, &res.algo, ws,
                      ws_nbytes, stream));
  CU(cudaEventRecord(e1, stream));
  CU(cudaEventSynchronize(e1));
  float ms = 0.0f;
  CU(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
  return ms / iters;
}

/* dt_mm on the mesh's device: ms per product over `iters` products (outputs freed as made). */
static double ours_gemm_ms(dt_backend_t be, dt_tensor_t a, dt_tensor_t b, int iters) {
  dt_tensor_t c;
  CHECK(dt_mm(a, b, &c)); /* warm-up */
  CHECK(dt_tensor_destroy(c));
  CHECK(dt_backend_synchronize(be));
  double t0 = now_us();
  for (int i = 0; i < iters; i++) {
    CHECK(dt_mm(a, b, &c));
    CHECK(dt_tensor_destroy(c));
  }
  CHECK(dt_backend_synchronize(be));
  return (now_us() - t0) / 1e3 / iters;
}

int main(int argc, char** argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  CHECK(dt_init(&argc, &argv));
  dt_backend_t be;
  if (dt_backend_get("cuda", &be) != DT_SUCCESS) {
    printf("bench_gpu: skipped: %s\n", dt_last_error());
    dt_finalize();
    return 77;
  }
  int one = 1;
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &one, NULL, NULL, &mesh)); /* this rank alone */
  CHECK(dt_mesh_set_backend(mesh, be));
  struct cudaDeviceProp prop;
  int dev = 0, drv = 0;
  CU(cudaGetDevice(&dev));
  CU(cudaGetDeviceProperties(&prop, dev));
  CU(cudaDriverGetVersion(&drv));
  printf("# bench_gpu: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, drv / 1000,
         (drv % 1000) / 10);
  const int sizes[2] = {4096, 8192};
  double worst = 1e9, tf8192 = 0.0;
  dt_placement_t r[1] = {dt_replicate()};
  for (int si = 0; si < 2; si++) {
    const int n = sizes[si], iters = quick ? 5 : 20, rounds = quick ? 2 : 5;
    const int64_t shape[2] = {n, n};
    dt_tensor_t a, b;
    CHECK(dt_tensor_randn(mesh, DT_BF16, 2, shape, r, 1, &a));
    CHECK(dt_tensor_randn(mesh, DT_BF16, 2, shape, r, 2, &b));
    void *pa, *pb, *pc, *ws;
    CHECK(dt_tensor_to_local(a, &pa, NULL));
    CHECK(dt_tensor_to_local(b, &pb, NULL));
    const size_t ws_nbytes = (size_t)32 << 20;
    CU(cudaMalloc(&pc, (size_t)n * n * 2));
    CU(cudaMalloc(&ws, ws_nbytes));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double ours_best = 1e30, direct_best = 1e30, ratio_min = 1e30, ratio_max = 0.0;
    for (int k = 0; k < rounds; k++) { /* alternate; report the spread */
      double o = ours_gemm_ms(be, a, b, iters);
      double d = direct_gemm_ms(n, pa, pb, pc, ws, ws_nbytes, s, iters);
      double ratio = d / o; /* throughput ours / direct */
      if (ratio < ratio_min) ratio_min = ratio;
      if (ratio > ratio_max) ratio_max = ratio;
      if (o < ours_best) ours_best = o;
      if (d < direct_best) direct_best = d;
    }
    double tf_o = 2.0 * n * n * (double)n / (ours_best * 1e-3) / 1e12;
    double tf_d = 2.0 * n * n * (double)n / (direct_best * 1e-3) / 1e12;
    printf("gemm bf16 %5d^3: ours %.3f ms (%.1f TFLOP/s), cuBLASLt direct %.3f ms (%.1f TFLOP/s), "
           "ours/direct %.3f..%.3f over %d alternating rounds\n", n, ours_best, tf_o, direct_best,
           tf_d, ratio_min, ratio_max, rounds);
    if (ratio_min < worst) worst = ratio_min;
    if (n == 8192) tf8192 = tf_o;
    cudaStreamDestroy(s);
    cudaFree(pc);
    cudaFree(ws);
    CHECK(dt_tensor_destroy(a));
    CHECK(dt_tensor_destroy(b));
  }
  /* f32 with and without TF32 */
  {
    const int n = 4096;
    const int64_t shape[2] = {n, n};
    dt_tensor_t a, b;
    CHECK(dt_tensor_randn(mesh, DT_F32, 2, shape, r, 1, &a));
    CHECK(dt_tensor_randn(mesh, DT_F32, 2, shape, r, 2, &b));
    for (int tf = 0; tf < 2; tf++) {
      CHECK(dt_backend_set_tf32(be, tf));
      double ms = ours_gemm_ms(be, a, b, quick ? 3 : 10);
      printf("gemm f32 %d^3, tf32 %s: %.3f ms (%.1f TFLOP/s)\n", n, tf ? "on " : "off", ms,
             2.0 * n * n * (double)n / (ms * 1e-3) / 1e12);
    }
    CHECK(dt_backend_set_tf32(be, 0));
    CHECK(dt_tensor_destroy(a));
    CHECK(dt_tensor_destroy(b));
  }
  /* host staging bandwidth: 64 MiB each way through the local-transfer API */
  double d2h = 0.0, h2d = 0.0;
  {
    const int64_t n = (int64_t)16 << 20;
    dt_tensor_t t;
    CHECK(dt_tensor_zeros(mesh, DT_F32, 1, &n, r, &t));
    float* host = malloc(sizeof(float) * (size_t)n);
    if (host == NULL) return 1;
    for (int k = 0; k < 3; k++) {
      double t0 = now_us();
      CHECK(dt_tensor_read_local(t, 0, n, host));
      double t1 = now_us();
      CHECK(dt_tensor_write_local(t, 0, n, host));
      CHECK(dt_backend_synchronize(be));
      double t2 = now_us();
      double a = 4.0 * n / (t1 - t0) / 1e3, b = 4.0 * n / (t2 - t1) / 1e3;
      if (a > d2h) d2h = a;
      if (b > h2d) h2d = b;
    }
    printf("staging 64 MiB (pageable host memory): device->host %.1f GB/s, host->device %.1f GB/s\n",
           d2h, h2d);
    free(host);
    CHECK(dt_tensor_destroy(t));
  }
  printf("gemm_vs_cublaslt=%.3f tflops_bf16_8192=%.1f d2h_gbps=%.1f h2d_gbps=%.1f\n", worst,
         tf8192, d2h, h2d);
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

/* gpu.c - GPU benchmarks of the cuda backend (built with DTENSOR_CUDA; exits 77 without a GPU).
 *
 *   build/bench/bench_gpu [--quick]          (one rank: mpirun -np 1, or no mpirun)
 *   build/bench/bench_gpu --attention        (only 4. below)
 *   build/bench/bench_gpu --ring [bf16]      (only 5. below)
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
 * 4. (--attention) causal attention in bf16 at the two training shapes of tools/gpu_check.sh
 *    (~125M: B 8, S 1024, 14 heads of 64; ~1B: B 4, S 1024, 16 heads of 128; layout (B, S, H, D)
 *    as the trainer's): sdpa forward, and sdpa_grad (dQ, dK, dV), ms per call (median of 5
 *    rounds of 10 calls), through dt_op_run on the path DTENSOR_SDPA_PATH chose (read once per
 *    process: gpu_check.sh runs it once per path; bench/sdpa_torch_gpu.py times PyTorch's SDPA
 *    on the same shapes). Last line: attention path=<auto|gemm|flash> fwd_ms_125M=
 *    bwd_ms_125M= fwd_ms_1B= bwd_ms_1B=
 * 5. (--ring) ring attention's blocks in device memory: one rank, a cp dim of 1 (the ring is the
 *    rank's own shard: the load-balanced causal layout's two diagonal blocks and one full block),
 *    f32 (or bf16: k and v around the ring in bf16; the blocks on f32 copies, or under flash
 *    on tensor cores reading bf16 as stored), layout (B, S, H, D), a
 *    training step of the op (forward, sum, backward through the
 *    tape), ms per step (median of 5 rounds of 5), at B 1, S 8192, 16 heads of 64 (long context)
 *    and B 8, S 1024, 14 heads of 64 (the 125M model's shape), on the block path that
 *    DTENSOR_SDPA_PATH chose (flash: the fused kernels, one forward and two backward launches per
 *    block; auto, gemm: products and row steps per (batch, head)). gpu_check.sh alternates
 *    processes of the two. Last line: ring path= dtype= ms_8k= ms_1k=
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

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The median over 5 rounds (after one warm-up call) of the ms per call of fn(ctx), iters calls a
 * round, the device synchronized around each round. */
static double median_ms(dt_backend_t be, int iters, void (*fn)(void*), void* ctx) {
  double ms[5];
  for (int round = -1; round < 5; round++) {
    CHECK(dt_backend_synchronize(be));
    const double t0 = now_us();
    const int n = round < 0 ? 1 : iters;
    for (int i = 0; i < n; i++) fn(ctx);
    CHECK(dt_backend_synchronize(be));
    if (round >= 0) ms[round] = (now_us() - t0) / 1e3 / n;
  }
  qsort(ms, 5, sizeof ms[0], cmp_double);
  return ms[2];
}

/* One call of sdpa (grad 0) or sdpa_grad (grad 1) on q, k, v (and dO). */
typedef struct {
  const dt_tensor_t* qkvg;
  int grad;
} attention_call_t;
static void attention_call(void* ctx) {
  const attention_call_t* a = ctx;
  const int64_t iargs[2] = {1, 1}; /* causal, layout (B, S, H, D) */
  dt_tensor_t out[3];
  if (a->grad) {
    CHECK(dt_op_run_multi("sdpa_grad", 4, a->qkvg, 2, iargs, 0, NULL, 3, out));
    for (int k = 0; k < 3; k++) CHECK(dt_tensor_destroy(out[k]));
  } else {
    CHECK(dt_op_run("sdpa", 3, a->qkvg, 2, iargs, 0, NULL, &out[0]));
    CHECK(dt_tensor_destroy(out[0]));
  }
}
static double attention_ms(dt_backend_t be, const dt_tensor_t* qkvg, int grad) {
  attention_call_t a = {qkvg, grad};
  return median_ms(be, 10, attention_call, &a);
}

/* An attention shape: batch, sequence, heads, head size. */
typedef struct {
  const char* name;
  int64_t B, S, H, D;
} shape_t;

static int attention_bench(dt_mesh_t mesh, dt_backend_t be, int small) {
  shape_t shapes[2] = {{"125M", 8, 1024, 14, 64}, {"1B", 4, 1024, 16, 128}};
  for (int i = 0; small && i < 2; i++) shapes[i].B = 1, shapes[i].S = 80; /* the emulator */
  const char* path = getenv("DTENSOR_SDPA_PATH");
  double fwd[2], bwd[2];
  dt_placement_t r[1] = {dt_replicate()};
  for (int i = 0; i < 2; i++) {
    const int64_t shape[4] = {shapes[i].B, shapes[i].S, shapes[i].H, shapes[i].D};
    dt_tensor_t t[4];
    for (int k = 0; k < 4; k++) CHECK(dt_tensor_randn(mesh, DT_BF16, 4, shape, r, 10 + k, &t[k]));
    fwd[i] = attention_ms(be, t, 0);
    bwd[i] = attention_ms(be, t, 1);
    /* causal: half the S x S pairs; forward 2 products, backward 4 (dP, dV, dQ, dK) plus the
     * recomputed scores */
    const double pairs = 0.5 * shapes[i].B * shapes[i].H * (double)shapes[i].S * shapes[i].S;
    printf("attention %s (B %lld, S %lld, %lld heads of %lld, causal, bf16): forward %.3f ms "
           "(%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s of 5 products)\n", shapes[i].name,
           (long long)shapes[i].B, (long long)shapes[i].S, (long long)shapes[i].H,
           (long long)shapes[i].D, fwd[i], 4.0 * pairs * shapes[i].D / (fwd[i] * 1e9),
           bwd[i], 10.0 * pairs * shapes[i].D / (bwd[i] * 1e9));
    for (int k = 0; k < 4; k++) CHECK(dt_tensor_destroy(t[k]));
  }
  printf("attention path=%s fwd_ms_125M=%.3f bwd_ms_125M=%.3f fwd_ms_1B=%.3f bwd_ms_1B=%.3f\n",
         path && *path ? path : "auto", fwd[0], bwd[0], fwd[1], bwd[1]);
  return 0;
}

/* One ring_attention step (forward, sum, backward) on leaves q, k, v of a cp mesh of one rank. */
typedef struct {
  dt_tape_t tape;
  dt_var_t q, k, v;
} ring_call_t;
static void ring_call(void* ctx) {
  const ring_call_t* r = ctx;
  const int64_t ia[5] = {0, 1, 1, 1, 1}; /* cp dim, causal, layout, balanced, the ring */
  const dt_var_t in[3] = {r->q, r->k, r->v};
  dt_var_t o, loss;
  CHECK(dt_ag_op(r->tape, "ring_attention", 3, in, 5, ia, 0, NULL, 1, &o));
  CHECK(dt_ag_op(r->tape, "sum", 1, &o, 0, NULL, 0, NULL, 1, &loss));
  CHECK(dt_tape_backward(r->tape, loss));
  CHECK(dt_tape_reset(r->tape));
}
static double ring_ms(dt_backend_t be, dt_var_t vq, dt_var_t vk, dt_var_t vv) {
  ring_call_t r = {NULL, vq, vk, vv};
  CHECK(dt_tape_create(&r.tape));
  const double ms = median_ms(be, 5, ring_call, &r);
  CHECK(dt_tape_destroy(r.tape));
  return ms;
}

static int ring_bench(dt_mesh_t mesh, dt_backend_t be, int small, dt_dtype_t dt) {
  shape_t shapes[2] = {{"8k", 1, 8192, 16, 64}, {"1k", 8, 1024, 14, 64}};
  for (int i = 0; small && i < 2; i++) shapes[i].B = 1, shapes[i].S = 96; /* the emulator */
  const char* path = getenv("DTENSOR_SDPA_PATH");
  double ms[2];
  dt_placement_t sh[1] = {dt_shard(1)};
  for (int i = 0; i < 2; i++) {
    const int64_t shape[4] = {shapes[i].B, shapes[i].S, shapes[i].H, shapes[i].D};
    dt_var_t v[3];
    for (int k = 0; k < 3; k++) {
      dt_tensor_t t;
      CHECK(dt_tensor_randn(mesh, dt, 4, shape, sh, 20 + k, &t));
      CHECK(dt_var_leaf(t, 1, &v[k]));
    }
    ms[i] = ring_ms(be, v[0], v[1], v[2]);
    /* causal: half the S x S pairs (the diagonal blocks' masked halves computed too); forward 2
     * products, backward 5 (scores again, dP, dV, dQ, dK) */
    const double pairs = 0.5 * shapes[i].B * shapes[i].H * (double)shapes[i].S * shapes[i].S;
    printf("ring %s (B %lld, S %lld, %lld heads of %lld, causal, %s): step %.3f ms "
           "(%.1f TFLOP/s of 7 products)\n", shapes[i].name, (long long)shapes[i].B,
           (long long)shapes[i].S, (long long)shapes[i].H, (long long)shapes[i].D,
           dt_dtype_name(dt), ms[i],
           14.0 * pairs * shapes[i].D / (ms[i] * 1e9));
    for (int k = 0; k < 3; k++) CHECK(dt_var_destroy(v[k]));
  }
  printf("ring path=%s dtype=%s ms_8k=%.3f ms_1k=%.3f\n", path && *path ? path : "auto",
         dt_dtype_name(dt), ms[0], ms[1]);
  return 0;
}

int main(int argc, char** argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  int attention = argc > 1 && strcmp(argv[1], "--attention") == 0;
  int ring = argc > 1 && strcmp(argv[1], "--ring") == 0;
  const dt_dtype_t ring_dt = ring && argc > 2 && strcmp(argv[2], "bf16") == 0 ? DT_BF16 : DT_F32;
  CHECK(dt_init(&argc, &argv));
  /* (--attention and --ring run on another device backend too: BENCH_GPU_BACKEND=cuda-emu
   * checks the benchmark itself on a machine without a GPU; the times mean nothing there) */
  const char* bname =
      (attention || ring) && getenv("BENCH_GPU_BACKEND") ? getenv("BENCH_GPU_BACKEND") : "cuda";
  dt_backend_t be;
  if (dt_backend_get(bname, &be) != DT_SUCCESS) {
    printf("bench_gpu: skipped: %s\n", dt_last_error());
    dt_finalize();
    return 77;
  }
  int one = 1;
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &one, NULL, NULL, &mesh)); /* this rank alone */
  CHECK(dt_mesh_set_backend(mesh, be));
  if ((attention || ring) && strcmp(bname, "cuda") != 0) {
    if (attention) attention_bench(mesh, be, 1);
    if (ring) ring_bench(mesh, be, 1, ring_dt);
    CHECK(dt_mesh_destroy(mesh));
    CHECK(dt_finalize());
    return 0;
  }
  struct cudaDeviceProp prop;
  int dev = 0, drv = 0;
  CU(cudaGetDevice(&dev));
  CU(cudaGetDeviceProperties(&prop, dev));
  CU(cudaDriverGetVersion(&drv));
  printf("# bench_gpu: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, drv / 1000,
         (drv % 1000) / 10);
  if (attention || ring) {
    if (attention) attention_bench(mesh, be, 0);
    if (ring) ring_bench(mesh, be, 0, ring_dt);
    CHECK(dt_mesh_destroy(mesh));
    CHECK(dt_finalize());
    return 0;
  }
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

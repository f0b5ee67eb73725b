/* ring.cu - ring attention's row-wise steps in the CUDA backend's memory (the table behind
 * dt__ring_rows_for for the cuda and cuda-emu backends; the host loops of src/ops/kernels_ring.c
 * define what each computes; the table's fused blocks are attention.cu's). Where a block is not
 * fused, its products run through the backend's GEMM; these kernels do what lies between them:
 * the block's softmax numerators with their row max and sum, the merge into the running
 * (o, m, l), the final normalization and log-sum-exp, the backward's row dot, recomputed
 * probabilities and score gradients. f32 throughout (but the row dot, which reads bf16/f16 o
 * and dO as stored where the fused tensor-core blocks take them), one thread block per row (a
 * block's threads stride over the row's columns; maxima and sums are block reductions, so sums
 * differ from the host's double-precision ones in the last bits).
 *
 * Everything is issued on the backend's compute stream and nothing waits for it.
 */
#include <math.h>

#include "ops/cuda/cuda_ops.h"

namespace {

#define DT_RING_NT 128 /* threads per row */

/* Keys row i of a chunk sees among cols (d0 < 0: all; else 0 .. d0 + i). */
__device__ __forceinline__ int64_t dt_ring_vis(int64_t d0, int64_t i, int64_t cols) {
  return d0 < 0 || d0 + i + 1 > cols ? cols : d0 + i + 1;
}

/* p (rows x cols, ld apart): row i's visible scores -> exp(score - rowmax), the rest 0; mb, lb:
 * the row's max and sum. */
__global__ void __launch_bounds__(DT_RING_NT)
dt_ring_softmax_kernel(float* p, int64_t rows, int64_t cols, int64_t ld, int64_t d0, float* mb,
                       float* lb) {
  __shared__ float red[32];
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    float* row = p + i * ld;
    const int64_t vis = dt_ring_vis(d0, i, cols);
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < vis; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = dt_cu_block_max(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float e = j < vis ? expf(row[j] - mx) : 0.0f;
      row[j] = e;
      sum += e;
    }
    sum = dt_cu_block_sum(sum, red);
    if (threadIdx.x == 0) {
      mb[i] = mx;
      lb[i] = sum;
    }
  }
}

/* Row i: o_i = o_i a + t_i c, l = l a + lb c, m = max(m, mb) (a, c the rescalings to the new
 * max); o rows lo apart, t rows E apart; m, l of this block's rows. */
__global__ void __launch_bounds__(DT_RING_NT)
dt_ring_merge_kernel(float* o, int64_t lo, const float* t, int64_t E, int64_t rows, float* m,
                     float* l, const float* mb, const float* lb) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const float mo = m[i], mn = fmaxf(mo, mb[i]);
    const float a = mo == -INFINITY ? 0.0f : expf(mo - mn), c = expf(mb[i] - mn);
    float* orow = o + i * lo;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) orow[e] = orow[e] * a + t[i * E + e] * c;
    __syncthreads(); /* every thread has read m[i] */
    if (threadIdx.x == 0) {
      l[i] = l[i] * a + lb[i] * c;
      m[i] = mn;
    }
  }
}

/* The rows of (B, H, S): r = (b H + h) S + s; the row's offset in a (B, H, S, F) tensor of layout
 * 0 or a (B, S, H, F) one of layout 1. */
__device__ __forceinline__ int64_t dt_ring_row_off(int layout, int64_t r, int64_t H, int64_t S,
                                                   int64_t F) {
  const int64_t s = r % S, bh = r / S, h = bh % H, b = bh / H;
  return layout ? ((b * S + s) * H + h) * F : r * F;
}

/* o /= l, lse = m + log l (no visible key: o 0, lse -inf); lse may be m. */
__global__ void __launch_bounds__(DT_RING_NT)
dt_ring_finish_kernel(float* o, const float* m, const float* l, float* lse, int64_t rows,
                      int layout, int64_t H, int64_t S, int64_t E) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float lr = l[r], mr = m[r];
    const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
    float* orow = o + dt_ring_row_off(layout, r, H, S, E);
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) orow[e] *= inv;
    __syncthreads(); /* m[r] read by every thread before lse (maybe m) is written */
    if (threadIdx.x == 0) lse[r] = lr > 0.0f ? mr + logf(lr) : -INFINITY;
  }
}

/* d[r] = sum_e o[r, e] go[r, e] (o and go of the blocks' dtype, read as stored) */
template <typename T>
__global__ void __launch_bounds__(DT_RING_NT)
dt_ring_rowdot_kernel(const T* o, const T* go, float* d, int64_t rows, int layout, int64_t H,
                      int64_t S, int64_t E) {
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = dt_ring_row_off(layout, r, H, S, E);
    float acc = 0.0f;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      acc += dt_cu_f32(o[off + e]) * dt_cu_f32(go[off + e]);
    acc = dt_cu_block_sum(acc, red);
    if (threadIdx.x == 0) d[r] = acc;
  }
}

/* p (rows x cols scores, ld apart) -> exp(score - lse_i) where visible (lse -inf: 0), else 0 */
__global__ void __launch_bounds__(DT_RING_NT)
dt_ring_probs_kernel(float* p, int64_t rows, int64_t cols, int64_t ld, int64_t d0,
                     const float* lse) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    float* row = p + i * ld;
    const int64_t vis = dt_ring_vis(d0, i, cols);
    const float ls = lse[i];
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      row[j] = j < vis && ls != -INFINITY ? expf(row[j] - ls) : 0.0f;
  }
}

/* dp = p (dp - d_i) */
__global__ void __launch_bounds__(DT_RING_NT)
dt_ring_dscore_kernel(float* dp, const float* p, int64_t rows, int64_t cols, int64_t ld,
                      const float* dd) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const float di = dd[i];
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dp[i * ld + j] = p[i * ld + j] * (dp[i * ld + j] - di);
  }
}

/* blocks for `rows` rows: a few per SM, never more than the rows */
static unsigned dt_ring_grid(dt_backend_t b, int64_t rows) {
  int64_t cap = (int64_t)DT_CUDA_NAME(sm_count)(b) * 16;
  return (unsigned)(rows < 1 ? 1 : rows < cap ? rows : cap);
}

#define DT_RING_LAUNCH(what, kernel, b, rows, ...)                                             \
  do {                                                                                         \
    if ((rows) <= 0) return DT_SUCCESS;                                                        \
    int rc_ = dt_simt_launch(kernel, dim3(dt_ring_grid((b), (rows))), dim3(DT_RING_NT), 0,     \
                             dt_cu_backend_stream(b), __VA_ARGS__);                            \
    return rc_ == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc_, "ring_attention: " what);        \
  } while (0)

static dt_status_t dt_ring_softmax(dt_backend_t b, float* p, int64_t rows, int64_t cols,
                                   int64_t ld, int64_t d0, float* mb, float* lb) {
  DT_RING_LAUNCH("block softmax", dt_ring_softmax_kernel, b, rows, p, rows, cols, ld, d0, mb, lb);
}

static dt_status_t dt_ring_merge(dt_backend_t b, float* o, int64_t lo, const float* t, int64_t E,
                                 int64_t rows, float* m, float* l, const float* mb,
                                 const float* lb) {
  DT_RING_LAUNCH("merge", dt_ring_merge_kernel, b, rows, o, lo, t, E, rows, m, l, mb, lb);
}

static dt_status_t dt_ring_finish(dt_backend_t b, const dt__ring_geom_t* g, float* o,
                                  const float* m, const float* l, float* lse) {
  DT_RING_LAUNCH("finish", dt_ring_finish_kernel, b, g->B * g->H * g->S, o, m, l, lse,
                 g->B * g->H * g->S, g->layout, g->H, g->S, g->E);
}

static dt_status_t dt_ring_rowdot(dt_backend_t b, const dt__ring_geom_t* g, const void* o,
                                  const void* go, float* d) {
  return dt_cu_float_dispatch("ring_attention: row dot", g->dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    DT_RING_LAUNCH("row dot", dt_ring_rowdot_kernel<T>, b, g->B * g->H * g->S, (const T*)o,
                   (const T*)go, d, g->B * g->H * g->S, g->layout, g->H, g->S, g->E);
  });
}

static dt_status_t dt_ring_probs(dt_backend_t b, float* p, int64_t rows, int64_t cols,
                                 int64_t ld, int64_t d0, const float* lse) {
  DT_RING_LAUNCH("probabilities", dt_ring_probs_kernel, b, rows, p, rows, cols, ld, d0, lse);
}

static dt_status_t dt_ring_dscore(dt_backend_t b, float* dp, const float* p, int64_t rows,
                                  int64_t cols, int64_t ld, const float* dd) {
  DT_RING_LAUNCH("score gradient", dt_ring_dscore_kernel, b, rows, dp, p, rows, cols, ld, dd);
}

/* row_block 0: a block's C rows at once (one GEMM per product and slab; scratch is device
 * memory) */
const dt__ring_rows_t dt_ring_rows = {0,
                                      dt_ring_softmax,
                                      dt_ring_merge,
                                      dt_ring_finish,
                                      dt_ring_rowdot,
                                      dt_ring_probs,
                                      dt_ring_dscore,
                                      DT_CUDA_NAME(ring_fused),
                                      DT_CUDA_NAME(ring_block_fwd),
                                      DT_CUDA_NAME(ring_block_bwd)};

} /* namespace */

extern "C" const dt__ring_rows_t* DT_CUDA_NAME(ring_rows)(void) { return &dt_ring_rows; }

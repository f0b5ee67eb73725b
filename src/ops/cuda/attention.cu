/* attention.cu - CUDA kernels of scaled dot-product attention (see cuda_ops.h for the
 * conventions): sdpa and its gradient sdpa_grad, and ring attention's blocks fused (at the end).
 *
 * The host kernels (dt__kernel_sdpa in src/ops/kernels_nn.c, dt__kernel_sdpa_grad in
 * kernels_grad.c) define the results with the S x T formulation: per (batch, head), scores
 * P = softmax(scale Q K^T) (causal: query row i, at global position q0 + i, sees keys 0 .. q0 + i),
 * O = P V; the gradient recomputes P, then dV = P^T dO, dS = P * (dO V^T - rowdot), dQ = scale
 * dS K, dK = scale dS^T Q, dK and dV summed over the query heads of each kv head (grouped-query
 * attention: query head h reads kv head h / (H / G)). Layout 0 is (B, H, S, D), layout 1
 * (B, S, H, D); D is the q/k feature size, E the v feature size (they may differ).
 *
 * Two implementations; DTENSOR_SDPA_PATH (read once per process) chooses:
 *   auto (default)  bf16/f16 sdpa: the flash path where its tiles fit; sdpa_grad and f32: the
 *                   GEMM path when one (batch, kv head) entry fits the workspace cap, else the
 *                   flash path;
 *   gemm            the GEMM path always (an entry over the cap runs alone);
 *   flash           the flash path (the GEMM path where its tiles exceed shared memory, or, for
 *                   bf16/f16, where D or E exceeds 128).
 * auto's choice is measured (H200, 2026-11-29, bench_gpu --attention, bf16, causal, ms per call,
 * flash / GEMM path): forward 0.455 / 0.765 at B 8, S 1024, 14 heads of 64 and 0.489 / 0.578 at
 * B 4, S 1024, 16 heads of 128; backward 2.171 / 1.588 and 2.927 / 1.158. (PyTorch 2.11's SDPA:
 * forward 0.055 and 0.052, backward 0.181 and 0.170: both of ours are far from it yet.)
 *
 * The GEMM path ("materialized scores") runs every product through the backend's GEMM
 * (cuBLASLt on a GPU: tensor cores for bf16/f16, TF32 for f32 where allowed; the host GEMM in the
 * emulator) and only the row-wise steps in kernels here. Work is split into entries (b, g), one
 * per batch entry and kv head, each with its r = H / G query heads; entries go in chunks of as
 * many as fit DTENSOR_SDPA_WORKSPACE_MB (MiB of scratch, default 512; fractions allowed), one
 * strided batched GEMM per product per chunk with M = r S rows: a group's query heads are
 * consecutive row blocks (layout 0 as stored; layout 1 operands are first copied, chunk by chunk,
 * into that packed (entry, head, row, feature) order and the results copied back, which keeps
 * every product one GEMM and sums a group's dK and dV inside the GEMM, in f32, rounded once).
 * - forward: X = scale Q K^T (f32 scratch, r S x T per entry, rows padded to 8), P = softmax(X)
 *   with the causal mask (dt_attn_softmax_kernel; P in the operand dtype, written over X for
 *   f32), O = P V;
 * - backward: X and P again; X = dP = dO V^T (f32); dV = P^T dO; dS = scale P (dP - rowsum(P dP))
 *   written over P (dt_attn_ds_kernel); dK = dS^T Q (the sum over the group's heads is the
 *   GEMM's k = r S); dQ = dS K.
 * Scratch per entry: r S T (4 + item) bytes (forward f32: 4) plus, for layout 1, the packed
 * operands. P and dS are rounded to bf16/f16 for half inputs (as flash attention rounds them);
 * everything else accumulates in f32.
 *
 * The flash path is the same math tiled, flash-attention style. For bf16 and f16 its products run
 * on tensor cores (nvcuda::wmma; the dt_tc_* kernels, described where they are defined); for f32
 * (and as the definition those follow) in plain CUDA (inputs loaded as f32, outputs rounded once):
 * - forward (dt_attn_fwd_kernel): one block per (batch, head, tile of BQ query rows); the key
 *   and value tiles of BK keys stream through shared memory and every row keeps a running max m
 *   and sum l of its exponentials (online softmax), rescaling its output accumulator when m
 *   grows; O = acc / l at the end. Causal attention stops at the tile's last visible key.
 * - backward (flash-attention-2 style): the forward kernel runs again without writing O and
 *   leaves per row the log-sum-exp L = m + log l and delta = dO . O (= sum_j P_ij dP_ij, the host's
 *   row dot) in scratch; then P_ij = exp(scale q_i . k_j - L_i) is recomputed blockwise from Q, K,
 *   L, and dS_ij = P_ij (dO_i . v_j - delta_i). Two kernels, so that every gradient element has
 *   one writer and no float atomics are needed (deterministic): dt_attn_dq_kernel (one block per
 *   query tile, looping over key tiles) and dt_attn_dkv_kernel (one block per (batch, kv head,
 *   key tile), looping over the group's query heads and the query tiles; causal attention skips
 *   the query tiles that see none of its keys).
 * A block's tiles live in shared memory, 192 (D + E) bytes in the forward kernel and about
 * 320 (D + E) in the backward's dK/dV kernel (the largest); where they exceed the device's
 * per-block limit (227 KiB on an H100, which the emulator reports too: D + E above about 710 for
 * sdpa_grad, about 1200 for sdpa) the GEMM path runs instead.
 * Accumulation is f32 (exp through expf); the host sums the softmax denominator in double, so
 * f32 results agree to f32 rounding (about 1e-6 relative), not bit for bit.
 *
 * Both kernels take f32, bf16 and f16 storage themselves (DT_KERNEL_ANY_DTYPE; q, k, v and the
 * outputs share one dtype, as the op's rules require; a dO of another float dtype is converted
 * to theirs first).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "ops/cuda/cuda_ops.h"
#ifdef DT_SIMT_EMULATE
#include "backend/cuda_rt_emu.h" /* cudaMemsetAsync */
#endif

/* Everything but the fill function has internal linkage: the file is compiled twice (nvcc and the
 * SIMT emulator) into one library, and the two builds' kernels must not meet at link time. */
namespace {

/* ---------------------------------------------------------------------------------------------
 * Geometry and tiles */

#define DT_ATTN_BQ 16   /* query rows per tile (4 per warp) */
#define DT_ATTN_BK 32   /* keys per tile (one per lane) */
#define DT_ATTN_NT 128  /* threads per block: 4 warps */
#define DT_ATTN_RPW (DT_ATTN_BQ / (DT_ATTN_NT / 32)) /* query rows per warp */

/* Element offset of (batch b, head h, row i, feature 0) is b * sb + h * sh + i * ss. */
struct dt_attn_strides {
  int64_t sb, sh, ss;
};

/* Everything the kernels need about one call (passed by value). */
struct dt_attn_geom {
  int64_t B, H, G, S, T, D, E, rep; /* rep = H / G query heads per kv head */
  dt_attn_strides q, k, v, o;       /* q and dq; k and dk; v and dv; o and dO (E features) */
  int64_t q0;                       /* global position of the first local query row */
  int64_t lds;                      /* rows of the per-row arrays (lse, delta) per (batch, head):
                                       S, or a ring block's whole shard */
  int causal, layout;
  int accum; /* ring blocks (f32 kernels only): the forward merges into a running output (see
                dt_attn_fwd_kernel), the backward adds to dq, dk and dv */
  float scale; /* 0 when D == 0: the host's scores are then 0 whatever the scale */
};

static dt_attn_strides dt_attn_strides_of(int layout, int64_t heads, int64_t seq, int64_t feat) {
  dt_attn_strides s;
  s.sb = heads * seq * feat;
  s.sh = layout ? feat : seq * feat;
  s.ss = layout ? heads * feat : feat;
  return s;
}

/* Parses the call (as the host kernels do) and fills the geometry; q, k, v are inputs 0-2. */
static void dt_attn_geom_init(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_attn_geom* g) {
  const int layout = (int)dt__op_iarg(DT_OP_SDPA, call, 1); /* sdpa_grad shares the schema */
  const int hd = layout ? 2 : 1, sd = layout ? 1 : 2;
  const dt_local_tensor_t *q = &in[0], *k = &in[1], *v = &in[2];
  memset(g, 0, sizeof *g);
  g->B = q->shape[0];
  g->H = q->shape[hd];
  g->S = q->shape[sd];
  g->D = q->shape[3];
  g->G = k->shape[hd];
  g->T = k->shape[sd];
  g->E = v->shape[3];
  g->rep = g->G > 0 ? g->H / g->G : 1;
  g->q = dt_attn_strides_of(layout, g->H, g->S, g->D);
  g->k = dt_attn_strides_of(layout, g->G, g->T, g->D);
  g->v = dt_attn_strides_of(layout, g->G, g->T, g->E);
  g->o = dt_attn_strides_of(layout, g->H, g->S, g->E);
  g->q0 = q->offset[sd];
  g->lds = g->S;
  g->causal = (int)dt__op_iarg(DT_OP_SDPA, call, 0);
  g->layout = layout;
  double scale = dt__op_farg(DT_OP_SDPA, call, 0); /* NaN: the op's default 1/sqrt(D) */
  if (scale != scale) scale = 1.0 / sqrt((double)g->D);
  g->scale = g->D > 0 ? (float)scale : 0.0f;
}

/* Shared-memory floats of each kernel (K and V tiles that lanes read row-wise have an odd row
 * stride: no bank conflicts). */
__host__ __device__ __forceinline__ int dt_attn_odd(int64_t n) { return (int)(n | 1); }
static size_t dt_attn_fwd_smem(const dt_attn_geom* g) {
  const int64_t BQ = DT_ATTN_BQ, BK = DT_ATTN_BK;
  return sizeof(float) *
         (size_t)(BQ * g->D + BK * dt_attn_odd(g->D) + BK * g->E + BQ * g->E + BQ * BK + 2 * BQ);
}
static size_t dt_attn_dq_smem(const dt_attn_geom* g) {
  const int64_t BQ = DT_ATTN_BQ, BK = DT_ATTN_BK;
  return sizeof(float) * (size_t)(2 * BQ * g->D + BQ * g->E + BK * dt_attn_odd(g->D) +
                                  BK * dt_attn_odd(g->E) + BQ * BK + 2 * BQ);
}
static size_t dt_attn_dkv_smem(const dt_attn_geom* g) {
  const int64_t BQ = DT_ATTN_BQ, BK = DT_ATTN_BK;
  return sizeof(float) * (size_t)(BK * dt_attn_odd(g->D) + BK * dt_attn_odd(g->E) + BQ * g->D +
                                  BQ * g->E + 2 * BQ * BK + 2 * BQ + BK * g->D + BK * g->E);
}

/* The most dynamic shared memory one block may have (the opt-in limit). The emulator answers an
 * H100's 227 KiB so that it takes the paths a GPU takes. */
static size_t dt_attn_smem_limit(void) {
#ifdef DT_SIMT_EMULATE
  return 227 * 1024;
#else
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 48 * 1024;
  }
  return (size_t)v;
#endif
}

/* Lets `kernel` launch with `nbytes` of dynamic shared memory (above 48 KiB a GPU needs the
 * opt-in); 0 or a cudaError_t value. */
template <typename K>
static int dt_attn_allow_smem(K kernel, size_t nbytes) {
#ifdef DT_SIMT_EMULATE
  (void)kernel;
  (void)nbytes;
  return 0;
#else
  if (nbytes <= 48 * 1024) return 0;
  return (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)nbytes);
#endif
}

/* Blocks for a grid-stride loop over `items` tiles on backend b's device (a few per SM; at
 * least 1), or on t's. */
static unsigned dt_attn_grid_on(dt_backend_t b, int64_t items) {
  const int64_t cap = (int64_t)DT_CUDA_NAME(sm_count)(b) * 32;
  return (unsigned)(items < cap ? (items < 1 ? 1 : items) : cap);
}
static unsigned dt_attn_grid(const dt_local_tensor_t* t, int64_t items) {
  return dt_attn_grid_on(t->backend, items);
}

/* ---------------------------------------------------------------------------------------------
 * Device helpers */

#ifdef __CUDACC__
#define DT_ATTN_UNROLL _Pragma("unroll") /* the register arrays stay registers */
#else
#define DT_ATTN_UNROLL
#endif

/* dst[r * ldd + c] = src[r * ld + c] (as f32) for r < rows, c < cols; rows valid .. rows - 1 are
 * zeros. */
template <typename T>
__device__ __forceinline__ void dt_attn_load(float* dst, int ldd, const T* src, int64_t ld,
                                             int rows, int valid, int cols) {
  for (int x = threadIdx.x; x < rows * cols; x += DT_ATTN_NT) {
    const int r = x / cols, c = x - r * cols;
    dst[r * ldd + c] = r < valid ? dt_cu_f32(src[r * ld + c]) : 0.0f;
  }
}

/* acc[r] = A[row_r] . Bm[lane] over n features, row_r = warp + 4 r: the rows of the warp against
 * the lane's key (A rows are read by the whole warp at once: a broadcast). */
__device__ __forceinline__ void dt_attn_dots(const float* A, int lda, const float* Bm, int ldb,
                                             int n, int warp, int lane,
                                             float acc[DT_ATTN_RPW]) {
  const float* b = Bm + lane * ldb;
  for (int r = 0; r < DT_ATTN_RPW; r++) acc[r] = 0.0f;
  for (int d = 0; d < n; d++) {
    const float bv = b[d];
    for (int r = 0; r < DT_ATTN_RPW; r++)
      acc[r] += A[(warp + r * (DT_ATTN_NT / 32)) * lda + d] * bv;
  }
}

/* Work items of the flash kernels, handed out grid-stride. Query tiles (forward, dQ): item it of
 * (S / bq tiles) x (B H), the last tiles first (under causal masking they have the most keys).
 * Key tiles (dK/dV): item it of (T / bk tiles) x (B G). */
struct dt_attn_qitem {
  int64_t bh, b, h, kvh, i0; /* (batch, head) as one index and apart, its kv head, first row */
  int nq;                    /* rows of the tile (the last one may be partial) */
};
struct dt_attn_kitem {
  int64_t b, kvh, j0; /* batch, kv head, first key */
  int nk;             /* keys of the tile */
};
__host__ __device__ __forceinline__ int64_t dt_attn_qitems(const dt_attn_geom& g, int bq) {
  return (g.S + bq - 1) / bq * g.B * g.H;
}
__host__ __device__ __forceinline__ int64_t dt_attn_kitems(const dt_attn_geom& g, int bk) {
  return (g.T + bk - 1) / bk * g.B * g.G;
}
__device__ __forceinline__ dt_attn_qitem dt_attn_qitem_of(const dt_attn_geom& g, int bq,
                                                          int64_t it) {
  const int64_t BH = g.B * g.H, nqt = (g.S + bq - 1) / bq;
  dt_attn_qitem w;
  w.bh = it % BH;
  w.b = w.bh / g.H;
  w.h = w.bh % g.H;
  w.kvh = w.h / g.rep;
  w.i0 = (nqt - 1 - it / BH) * bq;
  w.nq = (int)(g.S - w.i0 < bq ? g.S - w.i0 : bq);
  return w;
}
__device__ __forceinline__ dt_attn_kitem dt_attn_kitem_of(const dt_attn_geom& g, int bk,
                                                          int64_t it) {
  const int64_t BG = g.B * g.G, bg = it % BG;
  dt_attn_kitem w;
  w.b = bg / g.G;
  w.kvh = bg % g.G;
  w.j0 = it / BG * bk;
  w.nk = (int)(g.T - w.j0 < bk ? g.T - w.j0 : bk);
  return w;
}

/* Key j (global) is visible from query row qi (local, global q0 + qi). */
__device__ __forceinline__ bool dt_attn_visible(const dt_attn_geom& g, int64_t qi, int64_t j) {
  return j < g.T && (!g.causal || j <= g.q0 + qi);
}

/* One past the last key any of the local query rows i0 .. i0 + nq - 1 sees. */
__device__ __forceinline__ int64_t dt_attn_key_end(const dt_attn_geom& g, int64_t i0, int nq) {
  if (!g.causal) return g.T;
  const int64_t e = g.q0 + i0 + nq;
  return e < g.T ? e : g.T;
}

/* ---------------------------------------------------------------------------------------------
 * Forward */

/* One block per query tile of a (batch, head) (dt_attn_qitem_of). Writes O (when o is not NULL);
 * with dout, the row statistics of the backward pass: lse = m + log l and delta = dO . O.
 * With g.accum (a ring attention block, src/ops/kernels_ring.c): o holds the rows' running
 * unnormalized output, lse their running max and delta their running sum of exponentials; the
 * tile's own (O l, m, l) merge into them, both rescaled to the larger max (dout is NULL). */
template <typename T>
__global__ void __launch_bounds__(DT_ATTN_NT)
    dt_attn_fwd_kernel(dt_attn_geom g, const T* q, const T* k, const T* v, T* o, float* lse,
                       float* delta, const T* dout) {
  DT_SIMT_DYN_SHARED(float, sm);
  const int BQ = DT_ATTN_BQ, BK = DT_ATTN_BK, D = (int)g.D, E = (int)g.E, ldk = dt_attn_odd(D);
  float* Qs = sm;            /* BQ x D */
  float* Ks = Qs + BQ * D;   /* BK x ldk */
  float* Vs = Ks + BK * ldk; /* BK x E */
  float* Os = Vs + BK * E;   /* BQ x E: the unnormalized output */
  float* Ps = Os + BQ * E;   /* BQ x BK: this key tile's exponentials */
  float* As = Ps + BQ * BK;  /* BQ: the rescale of the key tile; 1 / l at the end */
  float* Cs = As + BQ;       /* BQ: accum: the rescale of the tile's output */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t items = dt_attn_qitems(g, BQ);
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const dt_attn_qitem w = dt_attn_qitem_of(g, BQ, it);
    const int64_t bh = w.bh, b = w.b, h = w.h, i0 = w.i0, kvh = w.kvh;
    const int nq = w.nq;
    const T* kb = k + b * g.k.sb + kvh * g.k.sh;
    const T* vb = v + b * g.v.sb + kvh * g.v.sh;
    __syncthreads(); /* the previous item is done with the shared tiles */
    dt_attn_load(Qs, D, q + b * g.q.sb + h * g.q.sh + i0 * g.q.ss, g.q.ss, BQ, nq, D);
    for (int x = tid; x < BQ * E; x += DT_ATTN_NT) Os[x] = 0.0f;
    float m[DT_ATTN_RPW], l[DT_ATTN_RPW];
    for (int r = 0; r < DT_ATTN_RPW; r++) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
    const int64_t kend = dt_attn_key_end(g, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      const int nk = (int)(kend - j0 < BK ? kend - j0 : BK);
      __syncthreads(); /* everyone is done with the previous K, V and P tiles */
      dt_attn_load(Ks, ldk, kb + j0 * g.k.ss, g.k.ss, BK, nk, D);
      dt_attn_load(Vs, E, vb + j0 * g.v.ss, g.v.ss, BK, nk, E);
      __syncthreads();
      float s[DT_ATTN_RPW];
      dt_attn_dots(Qs, D, Ks, ldk, D, warp, lane, s);
      for (int r = 0; r < DT_ATTN_RPW; r++) {
        const int i = warp + r * (DT_ATTN_NT / 32);
        /* rows past S (a partial last tile) see the tile's keys: finite, never written */
        const bool vis = lane < nk && (i >= nq || dt_attn_visible(g, i0 + i, j0 + lane));
        const float x = vis ? s[r] * g.scale : -INFINITY;
        const float mn = fmaxf(m[r], dt_cu_warp_max(x)); /* NaN scores are skipped, as the host */
        const float p = vis ? expf(x - mn) : 0.0f;
        const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
        l[r] = l[r] * alpha + dt_cu_warp_sum(p);
        m[r] = mn;
        Ps[i * BK + lane] = p;
        if (lane == 0) As[i] = alpha;
      }
      __syncthreads();
      for (int x = tid; x < BQ * E; x += DT_ATTN_NT) {
        const int i = x / E, e = x - i * E;
        float acc = Os[x] * As[i];
        for (int j = 0; j < nk; j++) acc += Ps[i * BK + j] * Vs[j * E + e];
        Os[x] = acc;
      }
    }
    __syncthreads();
    if (g.accum) { /* the merge of kernels_ring.c's dt__rr_merge, row by row */
      for (int r = 0; r < DT_ATTN_RPW; r++) {
        const int i = warp + r * (DT_ATTN_NT / 32);
        if (lane != 0 || i >= nq) continue;
        const int64_t row = bh * g.lds + i0 + i;
        const float mo = lse[row], mn = mo > m[r] ? mo : m[r];
        const float a = mo == -INFINITY ? 0.0f : expf(mo - mn), c = expf(m[r] - mn);
        As[i] = a;
        Cs[i] = c;
        delta[row] = delta[row] * a + l[r] * c;
        lse[row] = mn;
      }
      __syncthreads();
      T* ob = o + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int x = tid; x < nq * E; x += DT_ATTN_NT) {
        const int i = x / E, e = x - i * E;
        ob[i * g.o.ss + e] =
            dt_cu_from_f32<T>(dt_cu_f32(ob[i * g.o.ss + e]) * As[i] + Os[x] * Cs[i]);
      }
      continue;
    }
    for (int r = 0; r < DT_ATTN_RPW; r++) {
      const int i = warp + r * (DT_ATTN_NT / 32);
      /* the host's inv = sum > 0 ? 1 / sum : 0 (no keys: zeros; a NaN sum: NaN stays) */
      if (lane == 0) As[i] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      if (lane == 0 && lse != NULL && i < nq) lse[bh * g.lds + i0 + i] = m[r] + logf(l[r]);
    }
    __syncthreads();
    if (o != NULL) {
      T* ob = o + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int x = tid; x < nq * E; x += DT_ATTN_NT) {
        const int i = x / E, e = x - i * E;
        ob[i * g.o.ss + e] = dt_cu_from_f32<T>(Os[x] * As[i]);
      }
    }
    if (dout != NULL) {
      const T* gb = dout + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int r = 0; r < DT_ATTN_RPW; r++) {
        const int i = warp + r * (DT_ATTN_NT / 32);
        float d = 0.0f;
        if (i < nq)
          for (int e = lane; e < E; e += 32)
            d += Os[i * E + e] * As[i] * dt_cu_f32(gb[i * g.o.ss + e]);
        d = dt_cu_warp_sum(d);
        if (lane == 0 && i < nq) delta[bh * g.lds + i0 + i] = d;
      }
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * Backward */

/* P and dS of one (query tile, key tile) pair for the warp's rows against the lane's key, from
 * Q (Qs), dO (dOs), K (Ks), V (Vs) in shared memory and the rows' lse (Ls) and delta (Dl); rows
 * past nq and keys past nk are 0. Writes Ps (may be NULL) and dSs, BQ x BK each. */
__device__ __forceinline__ void dt_attn_pds(const dt_attn_geom& g, const float* Qs,
                                            const float* dOs, const float* Ks, const float* Vs,
                                            const float* Ls, const float* Dl, int64_t i0, int nq,
                                            int64_t j0, int nk, float* Ps, float* dSs) {
  const int D = (int)g.D, E = (int)g.E, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float s[DT_ATTN_RPW], dp[DT_ATTN_RPW];
  dt_attn_dots(Qs, D, Ks, dt_attn_odd(D), D, warp, lane, s);
  dt_attn_dots(dOs, E, Vs, dt_attn_odd(E), E, warp, lane, dp);
  for (int r = 0; r < DT_ATTN_RPW; r++) {
    const int i = warp + r * (DT_ATTN_NT / 32);
    const bool vis = i < nq && lane < nk && dt_attn_visible(g, i0 + i, j0 + lane);
    const float p = vis ? expf(s[r] * g.scale - Ls[i]) : 0.0f;
    if (Ps != NULL) Ps[i * DT_ATTN_BK + lane] = p;
    dSs[i * DT_ATTN_BK + lane] = vis ? p * (dp[r] - Dl[i]) : 0.0f;
  }
}

/* Loads the query tile i0 (nq valid rows) of (b, h): Q, dO and the rows' lse and delta. */
template <typename T>
__device__ __forceinline__ void dt_attn_load_rows(const dt_attn_geom& g, const T* q,
                                                  const T* dout, const float* lse,
                                                  const float* delta, int64_t b, int64_t h,
                                                  int64_t i0, int nq, float* Qs, float* dOs,
                                                  float* Ls, float* Dl) {
  const int D = (int)g.D, E = (int)g.E;
  dt_attn_load(Qs, D, q + b * g.q.sb + h * g.q.sh + i0 * g.q.ss, g.q.ss, DT_ATTN_BQ, nq, D);
  dt_attn_load(dOs, E, dout + b * g.o.sb + h * g.o.sh + i0 * g.o.ss, g.o.ss, DT_ATTN_BQ, nq, E);
  const int64_t row = (b * g.H + h) * g.lds + i0;
  for (int i = threadIdx.x; i < DT_ATTN_BQ; i += DT_ATTN_NT) {
    Ls[i] = i < nq ? lse[row + i] : 0.0f;
    Dl[i] = i < nq ? delta[row + i] : 0.0f;
  }
}

/* dQ of query tile qt of (batch, head) bh: scale * sum over key tiles of dS K. */
template <typename T>
__global__ void __launch_bounds__(DT_ATTN_NT)
    dt_attn_dq_kernel(dt_attn_geom g, const T* q, const T* k, const T* v, const T* dout,
                      const float* lse, const float* delta, T* dq) {
  DT_SIMT_DYN_SHARED(float, sm);
  const int BQ = DT_ATTN_BQ, BK = DT_ATTN_BK, D = (int)g.D, E = (int)g.E;
  const int ldk = dt_attn_odd(D), ldv = dt_attn_odd(E);
  float* Qs = sm;            /* BQ x D */
  float* dOs = Qs + BQ * D;  /* BQ x E */
  float* Ks = dOs + BQ * E;  /* BK x ldk */
  float* Vs = Ks + BK * ldk; /* BK x ldv */
  float* dSs = Vs + BK * ldv; /* BQ x BK */
  float* dQs = dSs + BQ * BK; /* BQ x D */
  float* Ls = dQs + BQ * D;  /* BQ */
  float* Dl = Ls + BQ;       /* BQ */
  const int tid = threadIdx.x;
  const int64_t items = dt_attn_qitems(g, BQ);
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const dt_attn_qitem w = dt_attn_qitem_of(g, BQ, it);
    const int64_t b = w.b, h = w.h, i0 = w.i0, kvh = w.kvh;
    const int nq = w.nq;
    const T* kb = k + b * g.k.sb + kvh * g.k.sh;
    const T* vb = v + b * g.v.sb + kvh * g.v.sh;
    __syncthreads();
    dt_attn_load_rows(g, q, dout, lse, delta, b, h, i0, nq, Qs, dOs, Ls, Dl);
    for (int x = tid; x < BQ * D; x += DT_ATTN_NT) dQs[x] = 0.0f;
    const int64_t kend = dt_attn_key_end(g, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      const int nk = (int)(kend - j0 < BK ? kend - j0 : BK);
      __syncthreads();
      dt_attn_load(Ks, ldk, kb + j0 * g.k.ss, g.k.ss, BK, nk, D);
      dt_attn_load(Vs, ldv, vb + j0 * g.v.ss, g.v.ss, BK, nk, E);
      __syncthreads();
      dt_attn_pds(g, Qs, dOs, Ks, Vs, Ls, Dl, i0, nq, j0, nk, NULL, dSs);
      __syncthreads();
      for (int x = tid; x < BQ * D; x += DT_ATTN_NT) {
        const int i = x / D, d = x - i * D;
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) acc += dSs[i * BK + j] * Ks[j * ldk + d];
        dQs[x] += acc;
      }
    }
    __syncthreads();
    T* db = dq + b * g.q.sb + h * g.q.sh + i0 * g.q.ss;
    for (int x = tid; x < nq * D; x += DT_ATTN_NT) {
      const int i = x / D, d = x - i * D;
      const float prev = g.accum ? dt_cu_f32(db[i * g.q.ss + d]) : 0.0f;
      db[i * g.q.ss + d] = dt_cu_from_f32<T>(prev + g.scale * dQs[x]);
    }
  }
}

/* dK and dV of a key tile of a (batch, kv head) (dt_attn_kitem_of; the first key tiles first:
 * under causal masking they have the most queries): sums over the group's query heads and their
 * query tiles of scale dS^T Q and P^T dO. */
template <typename T>
__global__ void __launch_bounds__(DT_ATTN_NT)
    dt_attn_dkv_kernel(dt_attn_geom g, const T* q, const T* k, const T* v, const T* dout,
                       const float* lse, const float* delta, T* dk, T* dv) {
  DT_SIMT_DYN_SHARED(float, sm);
  const int BQ = DT_ATTN_BQ, BK = DT_ATTN_BK, D = (int)g.D, E = (int)g.E;
  const int ldk = dt_attn_odd(D), ldv = dt_attn_odd(E);
  float* Ks = sm;             /* BK x ldk */
  float* Vs = Ks + BK * ldk;  /* BK x ldv */
  float* Qs = Vs + BK * ldv;  /* BQ x D */
  float* dOs = Qs + BQ * D;   /* BQ x E */
  float* Ps = dOs + BQ * E;   /* BQ x BK */
  float* dSs = Ps + BQ * BK;  /* BQ x BK */
  float* Ls = dSs + BQ * BK;  /* BQ */
  float* Dl = Ls + BQ;        /* BQ */
  float* dKs = Dl + BQ;       /* BK x D */
  float* dVs = dKs + BK * D;  /* BK x E */
  const int tid = threadIdx.x;
  const int64_t items = dt_attn_kitems(g, BK);
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const dt_attn_kitem w = dt_attn_kitem_of(g, BK, it);
    const int64_t b = w.b, kvh = w.kvh, j0 = w.j0;
    const int nk = w.nk;
    __syncthreads();
    dt_attn_load(Ks, ldk, k + b * g.k.sb + kvh * g.k.sh + j0 * g.k.ss, g.k.ss, BK, nk, D);
    dt_attn_load(Vs, ldv, v + b * g.v.sb + kvh * g.v.sh + j0 * g.v.ss, g.v.ss, BK, nk, E);
    for (int x = tid; x < BK * D; x += DT_ATTN_NT) dKs[x] = 0.0f;
    for (int x = tid; x < BK * E; x += DT_ATTN_NT) dVs[x] = 0.0f;
    /* the first query row that sees key j0 (causal: global position q0 + i >= j0) */
    int64_t first = g.causal ? j0 - g.q0 : 0;
    if (first < 0) first = 0;
    for (int64_t h = kvh * g.rep; h < (kvh + 1) * g.rep; h++)
      for (int64_t i0 = first / BQ * BQ; i0 < g.S; i0 += BQ) {
        const int nq = (int)(g.S - i0 < BQ ? g.S - i0 : BQ);
        __syncthreads();
        dt_attn_load_rows(g, q, dout, lse, delta, b, h, i0, nq, Qs, dOs, Ls, Dl);
        __syncthreads();
        dt_attn_pds(g, Qs, dOs, Ks, Vs, Ls, Dl, i0, nq, j0, nk, Ps, dSs);
        __syncthreads();
        for (int x = tid; x < BK * E; x += DT_ATTN_NT) {
          const int j = x / E, e = x - j * E;
          float acc = 0.0f;
          for (int i = 0; i < nq; i++) acc += Ps[i * BK + j] * dOs[i * E + e];
          dVs[x] += acc;
        }
        for (int x = tid; x < BK * D; x += DT_ATTN_NT) {
          const int j = x / D, d = x - j * D;
          float acc = 0.0f;
          for (int i = 0; i < nq; i++) acc += dSs[i * BK + j] * Qs[i * D + d];
          dKs[x] += acc;
        }
      }
    __syncthreads();
    T* kd = dk + b * g.k.sb + kvh * g.k.sh + j0 * g.k.ss;
    T* vd = dv + b * g.v.sb + kvh * g.v.sh + j0 * g.v.ss;
    for (int x = tid; x < nk * D; x += DT_ATTN_NT) {
      const int j = x / D, d = x - j * D;
      const float prev = g.accum ? dt_cu_f32(kd[j * g.k.ss + d]) : 0.0f;
      kd[j * g.k.ss + d] = dt_cu_from_f32<T>(prev + g.scale * dKs[x]);
    }
    for (int x = tid; x < nk * E; x += DT_ATTN_NT) {
      const int j = x / E, e = x - j * E;
      const float prev = g.accum ? dt_cu_f32(vd[j * g.v.ss + e]) : 0.0f;
      vd[j * g.v.ss + e] = dt_cu_from_f32<T>(prev + dVs[x]);
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * The flash path on tensor cores (bf16 and f16 storage, D and E up to 128): the same tiling and
 * recomputation as the kernels above, every product through nvcuda::wmma (16 x 16 x 16, f32
 * accumulation), tiles of 64 query rows and 64 keys, each of the 4 warps owning 16 rows of the
 * tile (query rows in the forward and dQ kernels, keys in the dK/dV kernel). A warp's scores and
 * their exponentials stay in its slice of shared memory and its accumulators (O, dQ, or dK and
 * dV) in registers, so apart from the tile loads only __syncwarp orders its steps. Row-wise
 * steps: lane l takes row l % 16 of the warp's 16 and half l / 16 of the 64 columns (visited in
 * a lane-rotated order: no bank conflicts); the two lanes of a row combine with one shuffle.
 * The forward's online softmax rescales lazily: a row's reference max moves only when a score
 * exceeds it by more than DT_TC_TAU2 (the exponentials stay <= e^8, far from overflow, and the
 * result is the same up to rounding), so the output accumulator, whose fragments' layout is
 * opaque, makes a round trip through shared memory only in the rare key tile that moves a max.
 * P and dS are rounded to the storage dtype before their products (as the GEMM path and flash
 * attention do); features are padded to multiples of 16 with zeros in shared memory. */

#define DT_TC_B 64     /* query rows per query tile, keys per key tile */
#define DT_TC_NT 128   /* threads per block: 4 warps */
#define DT_TC_TAU2 11.5f /* lazy rescaling's threshold (log2 units: about e^8) */
#define DT_TC_LOG2E 1.44269504088896341f
#define DT_TC_LN2 0.693147180559945309f
#define DT_TC_MAXF 128 /* the largest D and E (accumulators of 8 fragments) */

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> dt_tc_acc;
template <typename T>
using dt_tc_a =
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>;
template <typename T>
using dt_tc_b =
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major>;
template <typename T>
using dt_tc_bt =
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::col_major>;

/* Leading dimensions (elements) of the shared tiles: 16-bit tiles of D and E features, the f32
 * score tile, the 16-bit score tile and the f32 staging of D and E features. Every one keeps
 * wmma's rules (rows a multiple of 16 bytes apart; 16-row and 16-column steps 32-byte aligned). */
struct dt_tc_ld {
  int dp, ep, q, v, s, p, d, e;
};
__host__ __device__ __forceinline__ dt_tc_ld dt_tc_ld_of(int64_t D, int64_t E) {
  dt_tc_ld l;
  l.dp = (int)((D + 15) / 16 * 16);
  l.ep = (int)((E + 15) / 16 * 16);
  l.q = l.dp + 8;
  l.v = l.ep + 8;
  l.s = DT_TC_B + 4;
  l.p = DT_TC_B + 8;
  l.d = l.dp + 4;
  l.e = l.ep + 4;
  return l;
}

/* Shared memory carved into regions of the given bytes, each 128-byte aligned: the kernels carve
 * their pointers and the host its sizes with the same calls. */
struct dt_tc_carve {
  size_t off;
  __host__ __device__ __forceinline__ size_t take(size_t nbytes) {
    const size_t o = off;
    off += (nbytes + 127) / 128 * 128;
    return o;
  }
};

/* The three kernels' regions (byte offsets), in one place. Forward (which 0): Q, K, V, scores
 * (f32), exponentials, output staging, 1/l per row (accumulating: the rescales of the running
 * and of the tile's output). dQ (1): Q, dO, K, V, scores, dS, dQ staging,
 * lse, delta. dK/dV (2): K, V, Q, dO, scores, P, dS, dK and dV staging, lse, delta. */
struct dt_tc_smem {
  size_t q, k, v, dout, s, p, ds, acc, acc2, l, dl, nbytes;
};
__host__ __device__ __forceinline__ dt_tc_smem dt_tc_smem_of(int which, int64_t D, int64_t E) {
  const dt_tc_ld ld = dt_tc_ld_of(D, E);
  const size_t B = DT_TC_B, h = 2, f = 4; /* bytes of a 16-bit and an f32 element */
  dt_tc_carve c = {0};
  dt_tc_smem m = {};
  if (which == 0) {
    m.q = c.take(B * ld.q * h);
    m.k = c.take(B * ld.q * h);
    m.v = c.take(B * ld.v * h);
    m.s = c.take(B * ld.s * f);
    m.p = c.take(B * ld.p * h);
    m.acc = c.take(B * ld.e * f);
    m.l = c.take(B * f);
    m.dl = c.take(B * f);
  } else if (which == 1) {
    m.q = c.take(B * ld.q * h);
    m.dout = c.take(B * ld.v * h);
    m.k = c.take(B * ld.q * h);
    m.v = c.take(B * ld.v * h);
    m.s = c.take(B * ld.s * f);
    m.ds = c.take(B * ld.p * h);
    m.acc = c.take(B * ld.d * f);
    m.l = c.take(B * f);
    m.dl = c.take(B * f);
  } else {
    m.k = c.take(B * ld.q * h);
    m.v = c.take(B * ld.v * h);
    m.q = c.take(B * ld.q * h);
    m.dout = c.take(B * ld.v * h);
    m.s = c.take(B * ld.s * f);
    m.p = c.take(B * ld.p * h);
    m.ds = c.take(B * ld.p * h);
    m.acc = c.take(B * ld.d * f);
    m.acc2 = c.take(B * ld.e * f);
    m.l = c.take(B * f);
    m.dl = c.take(B * f);
  }
  m.nbytes = c.off;
  return m;
}

/* Accumulator fragments of the register arrays: 4 (features up to 64) or 8 (up to 128); 0 where
 * the tensor-core kernels do not take D and E. */
static int dt_tc_frags(int64_t D, int64_t E) {
  const int64_t f = D > E ? D : E;
  return f <= 64 ? 4 : f <= DT_TC_MAXF ? 8 : 0;
}
/* Calls f(std::integral_constant<int, NF>) with the kernels' NF for g (where they take g). */
template <typename F>
static dt_status_t dt_tc_frags_dispatch(const dt_attn_geom& g, F&& f) {
  if (dt_tc_frags(g.D, g.E) == 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

/* dst[r * ldd + c] = src[r * ld + c] for r < valid, c < cols; zeros up to 64 rows and colsp
 * columns (the padding the products read). 16-byte copies where the layout allows. */
template <typename T>
__device__ __forceinline__ void dt_tc_load(T* dst, int ldd, const T* src, int64_t ld, int valid,
                                           int cols, int colsp) {
  const T zero = dt_cu_from_f32<T>(0.0f);
  if (cols == colsp && ld % 8 == 0 && (uintptr_t)src % 16 == 0) { /* 8 elements per copy */
    const int vc = cols / 8;
    for (int x = threadIdx.x; x < DT_TC_B * vc; x += DT_TC_NT) {
      const int r = x / vc, c = (x - r * vc) * 8;
      uint4 w = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid) w = *reinterpret_cast<const uint4*>(src + r * ld + c);
      *reinterpret_cast<uint4*>(dst + r * ldd + c) = w;
    }
    return;
  }
  for (int x = threadIdx.x; x < DT_TC_B * colsp; x += DT_TC_NT) {
    const int r = x / colsp, c = x - r * colsp;
    dst[r * ldd + c] = r < valid && c < cols ? src[r * ld + c] : zero;
  }
}

/* out (16 x 64, f32, lds) = A (16 rows of n16 * 16 features) Bm^T, Bm 64 rows of the same
 * features: the warp's 16 rows against the tile's 64 (scores, or dO V^T). */
template <typename T>
__device__ __forceinline__ void dt_tc_abt(float* out, int lds, const T* A, int lda, const T* Bm,
                                          int ldb, int n16) {
  for (int n = 0; n < DT_TC_B / 16; n++) {
    dt_tc_acc acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < n16; kk++) {
      dt_tc_a<T> a;
      dt_tc_bt<T> b;
      nvcuda::wmma::load_matrix_sync(a, A + kk * 16, lda);
      nvcuda::wmma::load_matrix_sync(b, Bm + n * 16 * ldb + kk * 16, ldb);
      nvcuda::wmma::mma_sync(acc, a, b, acc);
    }
    nvcuda::wmma::store_matrix_sync(out + n * 16, acc, lds, nvcuda::wmma::mem_row_major);
  }
}

/* acc[n] (16 x 16 block n of a 16 x n16 * 16 product) += A (16 x 64, lda) Bm (64 x n16 * 16,
 * ldb), n < n16 <= NF. */
template <typename T, int NF>
__device__ __forceinline__ void dt_tc_ab(dt_tc_acc (&acc)[NF], int n16, const T* A, int lda,
                                         const T* Bm, int ldb) {
  for (int kk = 0; kk < DT_TC_B / 16; kk++) {
    dt_tc_a<T> a;
    nvcuda::wmma::load_matrix_sync(a, A + kk * 16, lda);
DT_ATTN_UNROLL
    for (int n = 0; n < NF; n++)
      if (n < n16) {
        dt_tc_b<T> b;
        nvcuda::wmma::load_matrix_sync(b, Bm + kk * 16 * ldb + n * 16, ldb);
        nvcuda::wmma::mma_sync(acc[n], a, b, acc[n]);
      }
  }
}

template <int NF>
__device__ __forceinline__ void dt_tc_zero(dt_tc_acc (&acc)[NF]) {
DT_ATTN_UNROLL
  for (int n = 0; n < NF; n++) nvcuda::wmma::fill_fragment(acc[n], 0.0f);
}
/* Stores acc[n], n < n16, as a 16 x n16 * 16 row-major f32 block at out (ld). */
template <int NF>
__device__ __forceinline__ void dt_tc_store(float* out, int ld, const dt_tc_acc (&acc)[NF],
                                            int n16) {
DT_ATTN_UNROLL
  for (int n = 0; n < NF; n++)
    if (n < n16) nvcuda::wmma::store_matrix_sync(out + n * 16, acc[n], ld, nvcuda::wmma::mem_row_major);
}

/* Whether a tensor-core kernel accumulates (a ring block: g.accum, outputs in f32); false at
 * compile time where the outputs are of the inputs' type (sdpa: no accumulating code at all). */
template <typename T, typename TO>
__device__ __forceinline__ bool dt_tc_accum(const dt_attn_geom& g) {
  return !std::is_same<T, TO>::value && g.accum;
}

/* Column t (0 .. 31) of the calling lane's half row: lanes l and l ^ 16 share row l % 16. */
__device__ __forceinline__ int dt_tc_col(int lane, int t) {
  return (lane >> 4) * 32 + ((t + lane) & 31);
}

/* The columns of key tile j0 (nk keys) that query row qi sees are those below the result (at
 * most nk; qi < 0: every one): one comparison per score instead of dt_attn_visible's. */
__device__ __forceinline__ int dt_tc_row_lim(const dt_attn_geom& g, int64_t qi, int64_t j0,
                                             int nk) {
  if (qi < 0 || !g.causal) return nk;
  const int64_t e = g.q0 + qi - j0 + 1; /* keys j0 .. q0 + qi */
  return e < 0 ? 0 : e < nk ? (int)e : nk;
}

/* Forward on tensor cores: dt_attn_fwd_kernel's contract (one block per query tile of a (batch,
 * head), the last tiles first; O, and for the backward lse and delta; accumulating (TO f32,
 * g.accum: dt_tc_accum), a ring block merged into the running f32 output o, max lse and sum
 * delta). TO: O's type. NF: see dt_tc_frags. */
template <typename T, typename TO, int NF>
__global__ void __launch_bounds__(DT_TC_NT)
    dt_tc_fwd_kernel(dt_attn_geom g, const T* q, const T* k, const T* v, TO* o, float* lse,
                     float* delta, const T* dout) {
  DT_SIMT_DYN_SHARED(unsigned char, sm);
  const int B = DT_TC_B, D = (int)g.D, E = (int)g.E;
  const dt_tc_ld ld = dt_tc_ld_of(g.D, g.E);
  const dt_tc_smem L = dt_tc_smem_of(0, g.D, g.E);
  T* Qs = (T*)(sm + L.q);
  T* Ks = (T*)(sm + L.k);
  T* Vs = (T*)(sm + L.v);
  float* Sf = (float*)(sm + L.s);
  T* Ps = (T*)(sm + L.p);
  float* Of = (float*)(sm + L.acc);
  float* Is = (float*)(sm + L.l);
  float* Cs = (float*)(sm + L.dl);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane & 15;
  const int i = warp * 16 + r, ne16 = ld.ep / 16; /* i: the lane's row in the tile */
  float* Sw = Sf + warp * 16 * ld.s;
  T* Pw = Ps + warp * 16 * ld.p;
  float* Ow = Of + warp * 16 * ld.e;
  const int64_t items = dt_attn_qitems(g, B);
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const dt_attn_qitem w = dt_attn_qitem_of(g, B, it);
    const int64_t bh = w.bh, b = w.b, h = w.h, i0 = w.i0, kvh = w.kvh;
    const int nq = w.nq;
    const T* kb = k + b * g.k.sb + kvh * g.k.sh;
    const T* vb = v + b * g.v.sb + kvh * g.v.sh;
    __syncthreads(); /* the previous item is done with the shared tiles */
    dt_tc_load(Qs, ld.q, q + b * g.q.sb + h * g.q.sh + i0 * g.q.ss, g.q.ss, nq, D, ld.dp);
    dt_tc_acc acc[NF];
    dt_tc_zero(acc);
    /* the row's reference max (log2 units: the scores times scale log2(e)) and its sum of
     * exponentials (both lanes of the row hold them) */
    float m = -INFINITY, l = 0.0f;
    const float scale2 = g.scale * DT_TC_LOG2E;
    const int64_t kend = dt_attn_key_end(g, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += B) {
      const int nk = (int)(kend - j0 < B ? kend - j0 : B);
      /* the lane's row sees the tile's columns below lim (rows past S, of a partial last tile,
       * see all: finite, never written) */
      const int lim = dt_tc_row_lim(g, i < nq ? i0 + i : -1, j0, nk);
      __syncthreads(); /* everyone is done with the previous K and V tiles */
      dt_tc_load(Ks, ld.q, kb + j0 * g.k.ss, g.k.ss, nk, D, ld.dp);
      dt_tc_load(Vs, ld.v, vb + j0 * g.v.ss, g.v.ss, nk, E, ld.ep);
      __syncthreads();
      dt_tc_abt(Sw, ld.s, Qs + warp * 16 * ld.q, ld.q, Ks, ld.q, ld.dp / 16);
      __syncwarp();
      float x[32];
      float mx = -INFINITY;
      const float* Sr = Sw + r * ld.s + (lane >> 4) * 32;
DT_ATTN_UNROLL
      for (int t = 0; t < 32; t++) {
        const int c = (t + lane) & 31; /* the lane's column of its half, rotated */
        x[t] = (lane >> 4) * 32 + c < lim ? Sr[c] * scale2 : -INFINITY;
        mx = fmaxf(mx, x[t]); /* NaN scores are skipped, as the host */
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      float alpha = 1.0f;
      const bool had = m != -INFINITY; /* the row's accumulator holds earlier keys' terms */
      if (mx > m + DT_TC_TAU2) {       /* the reference max moves (and always from -inf) */
        alpha = had ? exp2f(m - mx) : 0.0f;
        m = mx;
      }
      /* masked columns (-inf) give 0; a row that has seen nothing yet (m -inf) only those */
      const float mref = m == -INFINITY ? 0.0f : m;
      float sum = 0.0f;
      T* Pr = Pw + r * ld.p + (lane >> 4) * 32;
DT_ATTN_UNROLL
      for (int t = 0; t < 32; t++) {
        const float p = exp2f(x[t] - mref);
        Pr[(t + lane) & 31] = dt_cu_from_f32<T>(p);
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      l = l * alpha + sum;
      /* rows whose accumulator holds terms and must shrink (alpha may underflow to 0): the
       * warp's fragments go through its staging rows (their layout is opaque) */
      if (__any_sync(0xffffffffu, alpha != 1.0f && had)) {
        dt_tc_store(Ow, ld.e, acc, ne16);
        __syncwarp();
        for (int e = lane >> 4; e < ld.ep; e += 2) Ow[r * ld.e + e] *= alpha;
        __syncwarp();
DT_ATTN_UNROLL
        for (int n = 0; n < NF; n++)
          if (n < ne16)
            nvcuda::wmma::load_matrix_sync(acc[n], Ow + n * 16, ld.e, nvcuda::wmma::mem_row_major);
      }
      __syncwarp();
      dt_tc_ab(acc, ne16, Pw, ld.p, Vs, ld.v);
    }
    dt_tc_store(Ow, ld.e, acc, ne16);
    __syncwarp();
    m *= DT_TC_LN2; /* natural log units, as lse and the ring's running max */
    if (dt_tc_accum<T, TO>(g)) { /* kernels_ring.c's dt__rr_merge (m: the reference max) */
      if (lane < 16 && i < nq) {
        const int64_t row = bh * g.lds + i0 + i;
        const float mo = lse[row], mn = fmaxf(mo, m);
        const float a = mo == -INFINITY ? 0.0f : expf(mo - mn);
        const float c = m == -INFINITY ? 0.0f : expf(m - mn);
        Is[i] = a;
        Cs[i] = c;
        delta[row] = delta[row] * a + l * c;
        lse[row] = mn;
      }
      __syncthreads();
      TO* ob = o + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int x = tid; x < nq * E; x += DT_TC_NT) {
        const int ii = x / E, e = x - ii * E;
        ob[ii * g.o.ss + e] = dt_cu_from_f32<TO>(dt_cu_f32(ob[ii * g.o.ss + e]) * Is[ii] +
                                                 Of[ii * ld.e + e] * Cs[ii]);
      }
      continue;
    }
    /* the host's inv = sum > 0 ? 1 / sum : 0 (no keys: zeros; a NaN sum: NaN stays) */
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (lane < 16) Is[i] = inv;
    if (lane < 16 && lse != NULL && i < nq) lse[bh * g.lds + i0 + i] = m + logf(l);
    if (dout != NULL) {
      float d = 0.0f;
      if (i < nq) {
        const T* gb = dout + b * g.o.sb + h * g.o.sh + (i0 + i) * g.o.ss;
        for (int e = lane >> 4; e < E; e += 2) d += Ow[r * ld.e + e] * inv * dt_cu_f32(gb[e]);
      }
      d += __shfl_xor_sync(0xffffffffu, d, 16);
      if (lane < 16 && i < nq) delta[bh * g.lds + i0 + i] = d;
    }
    if (o != NULL) {
      __syncthreads();
      TO* ob = o + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int x = tid; x < nq * E; x += DT_TC_NT) {
        const int ii = x / E, e = x - ii * E;
        ob[ii * g.o.ss + e] = dt_cu_from_f32<TO>(Of[ii * ld.e + e] * Is[ii]);
      }
    }
  }
}

/* Loads query tile i0 (nq rows) of (b, h) for the backward kernels: Q, dO, lse and delta. */
template <typename T>
__device__ __forceinline__ void dt_tc_load_rows(const dt_attn_geom& g, const dt_tc_ld& ld,
                                                const T* q, const T* dout, const float* lse,
                                                const float* delta, int64_t b, int64_t h,
                                                int64_t i0, int nq, T* Qs, T* dOs, float* Ls,
                                                float* Dl) {
  dt_tc_load(Qs, ld.q, q + b * g.q.sb + h * g.q.sh + i0 * g.q.ss, g.q.ss, nq, (int)g.D, ld.dp);
  dt_tc_load(dOs, ld.v, dout + b * g.o.sb + h * g.o.sh + i0 * g.o.ss, g.o.ss, nq, (int)g.E,
             ld.ep);
  const int64_t row = (b * g.H + h) * g.lds + i0;
  for (int x = threadIdx.x; x < DT_TC_B; x += DT_TC_NT) {
    Ls[x] = x < nq ? lse[row + x] * DT_TC_LOG2E : 0.0f; /* log2 units: P = 2^(s scale2 - L) */
    Dl[x] = x < nq ? delta[row + x] : 0.0f;
  }
}

/* dQ on tensor cores: dt_attn_dq_kernel's contract. A warp's rows: S = Q K^T, P (in registers),
 * dP = dO V^T over the same f32 slice, dS rounded, then dQ += dS K in registers. TO: dQ's type
 * (T, or f32 added to: dt_tc_accum). */
template <typename T, typename TO, int NF>
__global__ void __launch_bounds__(DT_TC_NT)
    dt_tc_dq_kernel(dt_attn_geom g, const T* q, const T* k, const T* v, const T* dout,
                    const float* lse, const float* delta, TO* dq) {
  DT_SIMT_DYN_SHARED(unsigned char, sm);
  const int B = DT_TC_B, D = (int)g.D, E = (int)g.E;
  const dt_tc_ld ld = dt_tc_ld_of(g.D, g.E);
  const dt_tc_smem L = dt_tc_smem_of(1, g.D, g.E);
  T* Qs = (T*)(sm + L.q);
  T* dOs = (T*)(sm + L.dout);
  T* Ks = (T*)(sm + L.k);
  T* Vs = (T*)(sm + L.v);
  float* Sf = (float*)(sm + L.s);
  T* dSs = (T*)(sm + L.ds);
  float* dQf = (float*)(sm + L.acc);
  float* Ls = (float*)(sm + L.l);
  float* Dl = (float*)(sm + L.dl);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane & 15;
  const int i = warp * 16 + r;
  const float scale2 = g.scale * DT_TC_LOG2E;
  float* Sw = Sf + warp * 16 * ld.s;
  T* dSw = dSs + warp * 16 * ld.p;
  const int64_t items = dt_attn_qitems(g, B);
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const dt_attn_qitem w = dt_attn_qitem_of(g, B, it);
    const int64_t b = w.b, h = w.h, i0 = w.i0, kvh = w.kvh;
    const int nq = w.nq;
    const T* kb = k + b * g.k.sb + kvh * g.k.sh;
    const T* vb = v + b * g.v.sb + kvh * g.v.sh;
    __syncthreads();
    dt_tc_load_rows(g, ld, q, dout, lse, delta, b, h, i0, nq, Qs, dOs, Ls, Dl);
    dt_tc_acc acc[NF];
    dt_tc_zero(acc);
    const int64_t kend = dt_attn_key_end(g, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += B) {
      const int nk = (int)(kend - j0 < B ? kend - j0 : B);
      __syncthreads();
      dt_tc_load(Ks, ld.q, kb + j0 * g.k.ss, g.k.ss, nk, D, ld.dp);
      dt_tc_load(Vs, ld.v, vb + j0 * g.v.ss, g.v.ss, nk, E, ld.ep);
      __syncthreads();
      dt_tc_abt(Sw, ld.s, Qs + warp * 16 * ld.q, ld.q, Ks, ld.q, ld.dp / 16);
      __syncwarp();
      float p[32];
      const int lim = i < nq ? dt_tc_row_lim(g, i0 + i, j0, nk) : 0;
      const float Li = Ls[i];
DT_ATTN_UNROLL
      for (int t = 0; t < 32; t++) {
        const int c = dt_tc_col(lane, t);
        /* rounded as the dK/dV kernel's P (and the GEMM path's): one dS for dQ and dK */
        p[t] = dt_cu_f32(dt_cu_from_f32<T>(c < lim ? exp2f(Sw[r * ld.s + c] * scale2 - Li) : 0.0f));
      }
      __syncwarp(); /* the scores are read: dP goes over them */
      dt_tc_abt(Sw, ld.s, dOs + warp * 16 * ld.v, ld.v, Vs, ld.v, ld.ep / 16);
      __syncwarp();
DT_ATTN_UNROLL
      for (int t = 0; t < 32; t++) {
        const int c = dt_tc_col(lane, t);
        dSw[r * ld.p + c] = dt_cu_from_f32<T>(p[t] * (Sw[r * ld.s + c] - Dl[i]));
      }
      __syncwarp();
      dt_tc_ab(acc, ld.dp / 16, dSw, ld.p, Ks, ld.q);
    }
    dt_tc_store(dQf + warp * 16 * ld.d, ld.d, acc, ld.dp / 16);
    __syncthreads();
    TO* db = dq + b * g.q.sb + h * g.q.sh + i0 * g.q.ss;
    for (int x = tid; x < nq * D; x += DT_TC_NT) {
      const int ii = x / D, d = x - ii * D;
      const float prev = dt_tc_accum<T, TO>(g) ? dt_cu_f32(db[ii * g.q.ss + d]) : 0.0f;
      db[ii * g.q.ss + d] = dt_cu_from_f32<TO>(prev + g.scale * dQf[ii * ld.d + d]);
    }
  }
}

/* dK and dV on tensor cores: dt_attn_dkv_kernel's contract. A warp owns 16 keys of the tile and
 * works on transposed scores (its keys against the query tile's 64 rows): S^T = K Q^T, P^T,
 * dP^T = V dO^T, dS^T, then dV += P^T dO and dK += dS^T Q in registers. TO: as dQ's. */
template <typename T, typename TO, int NF>
__global__ void __launch_bounds__(DT_TC_NT)
    dt_tc_dkv_kernel(dt_attn_geom g, const T* q, const T* k, const T* v, const T* dout,
                     const float* lse, const float* delta, TO* dk, TO* dv) {
  DT_SIMT_DYN_SHARED(unsigned char, sm);
  const int B = DT_TC_B, D = (int)g.D, E = (int)g.E;
  const dt_tc_ld ld = dt_tc_ld_of(g.D, g.E);
  const dt_tc_smem L = dt_tc_smem_of(2, g.D, g.E);
  T* Ks = (T*)(sm + L.k);
  T* Vs = (T*)(sm + L.v);
  T* Qs = (T*)(sm + L.q);
  T* dOs = (T*)(sm + L.dout);
  float* Sf = (float*)(sm + L.s);
  T* Ps = (T*)(sm + L.p);
  T* dSs = (T*)(sm + L.ds);
  float* dKf = (float*)(sm + L.acc);
  float* dVf = (float*)(sm + L.acc2);
  float* Ls = (float*)(sm + L.l);
  float* Dl = (float*)(sm + L.dl);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane & 15;
  const int jl = warp * 16 + r; /* the lane's key in the tile */
  const float scale2 = g.scale * DT_TC_LOG2E;
  float* Sw = Sf + warp * 16 * ld.s;
  T* Pw = Ps + warp * 16 * ld.p;
  T* dSw = dSs + warp * 16 * ld.p;
  const int64_t items = dt_attn_kitems(g, B);
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const dt_attn_kitem w = dt_attn_kitem_of(g, B, it);
    const int64_t b = w.b, kvh = w.kvh, j0 = w.j0;
    const int nk = w.nk;
    __syncthreads();
    dt_tc_load(Ks, ld.q, k + b * g.k.sb + kvh * g.k.sh + j0 * g.k.ss, g.k.ss, nk, D, ld.dp);
    dt_tc_load(Vs, ld.v, v + b * g.v.sb + kvh * g.v.sh + j0 * g.v.ss, g.v.ss, nk, E, ld.ep);
    dt_tc_acc dka[NF], dva[NF];
    dt_tc_zero(dka);
    dt_tc_zero(dva);
    /* the first query row that sees key j0 (causal: global position q0 + i >= j0) */
    int64_t first = g.causal ? j0 - g.q0 : 0;
    if (first < 0) first = 0;
    for (int64_t h = kvh * g.rep; h < (kvh + 1) * g.rep; h++)
      for (int64_t i0 = first / B * B; i0 < g.S; i0 += B) {
        const int nq = (int)(g.S - i0 < B ? g.S - i0 : B);
        __syncthreads();
        dt_tc_load_rows(g, ld, q, dout, lse, delta, b, h, i0, nq, Qs, dOs, Ls, Dl);
        __syncthreads();
        dt_tc_abt(Sw, ld.s, Ks + warp * 16 * ld.q, ld.q, Qs, ld.q, ld.dp / 16);
        __syncwarp();
        /* the query rows of the tile that see the lane's key: lo .. hi - 1 (causal: global
         * position q0 + i0 + c >= j0 + jl) */
        int lo = 0;
        if (g.causal) {
          const int64_t f = j0 + jl - g.q0 - i0;
          lo = f < 0 ? 0 : f < B ? (int)f : B;
        }
        const int hi = jl < nk ? nq : 0;
DT_ATTN_UNROLL
        for (int t = 0; t < 32; t++) {
          const int c = dt_tc_col(lane, t); /* query row of the tile */
          Pw[r * ld.p + c] =
              dt_cu_from_f32<T>(c >= lo && c < hi ? exp2f(Sw[r * ld.s + c] * scale2 - Ls[c]) : 0.0f);
        }
        __syncwarp(); /* the scores are read: dP^T goes over them */
        dt_tc_abt(Sw, ld.s, Vs + warp * 16 * ld.v, ld.v, dOs, ld.v, ld.ep / 16);
        __syncwarp();
        /* dS from the rounded P (as the GEMM path): the lane's own P elements, no registers kept
         * across the product */
DT_ATTN_UNROLL
        for (int t = 0; t < 32; t++) {
          const int c = dt_tc_col(lane, t);
          const float p = dt_cu_f32(Pw[r * ld.p + c]);
          dSw[r * ld.p + c] = dt_cu_from_f32<T>(p * (Sw[r * ld.s + c] - Dl[c]));
        }
        __syncwarp();
        dt_tc_ab(dva, ld.ep / 16, Pw, ld.p, dOs, ld.v);
        dt_tc_ab(dka, ld.dp / 16, dSw, ld.p, Qs, ld.q);
      }
    dt_tc_store(dKf + warp * 16 * ld.d, ld.d, dka, ld.dp / 16);
    dt_tc_store(dVf + warp * 16 * ld.e, ld.e, dva, ld.ep / 16);
    __syncthreads();
    TO* kd = dk + b * g.k.sb + kvh * g.k.sh + j0 * g.k.ss;
    TO* vd = dv + b * g.v.sb + kvh * g.v.sh + j0 * g.v.ss;
    for (int x = tid; x < nk * D; x += DT_TC_NT) {
      const int j = x / D, d = x - j * D;
      const float prev = dt_tc_accum<T, TO>(g) ? dt_cu_f32(kd[j * g.k.ss + d]) : 0.0f;
      kd[j * g.k.ss + d] = dt_cu_from_f32<TO>(prev + g.scale * dKf[j * ld.d + d]);
    }
    for (int x = tid; x < nk * E; x += DT_TC_NT) {
      const int j = x / E, e = x - j * E;
      const float prev = dt_tc_accum<T, TO>(g) ? dt_cu_f32(vd[j * g.v.ss + e]) : 0.0f;
      vd[j * g.v.ss + e] = dt_cu_from_f32<TO>(prev + dVf[j * ld.e + e]);
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * The GEMM path: scores materialized per chunk of (batch, kv head) entries, products through the
 * backend's GEMM, the row-wise steps here */

#define DT_ATTN_ALIGN 256 /* byte alignment of the scratch regions */

/* Chunk row r's query row, r % S: in 32 bits where both fit (a 64-bit division is a long
 * emulated sequence, once per row). */
__device__ __forceinline__ int64_t dt_attn_qrow(int64_t r, int64_t S) {
  return ((r | S) >> 31) == 0 ? (int64_t)((uint32_t)r % (uint32_t)S) : r % S;
}

/* The row kernels below take one row per warp (grid-stride over the rows, DT_ATTN_WPB rows per
 * block): a row's reductions are warp shuffles, and a lane's first DT_ATTN_WV values (columns
 * lane, lane + 32, ...) stay in registers; longer rows are read again. Column indices are 32-bit
 * (a row is at most ld elements of one scratch chunk). */
#define DT_ATTN_WV 32
#define DT_ATTN_WPB (DT_CU_BLOCK / 32)

/* P = softmax of the scores x row by row (the host's dt__attn_softmax_rows), `rows` rows of nk
 * keys, ld apart; row r is query row r % S (a chunk's rows are entry, head, query row), which
 * sees keys 0 .. last (causal: q0 + r % S); the other keys get 0. p may be x (f32): every
 * element is read and written by one thread. */
template <typename T>
__global__ void __launch_bounds__(DT_CU_BLOCK)
    dt_attn_softmax_kernel(const float* x, T* p, int64_t rows, int64_t S, int64_t nk, int64_t ld,
                           int64_t q0, int causal) {
  const int lane = threadIdx.x & 31, n = (int)nk;
  for (int64_t r = (int64_t)blockIdx.x * DT_ATTN_WPB + (threadIdx.x >> 5); r < rows;
       r += (int64_t)gridDim.x * DT_ATTN_WPB) {
    const float* xr = x + r * ld;
    T* pr = p + r * ld;
    int64_t l64 = causal ? q0 + dt_attn_qrow(r, S) : nk - 1;
    const int last = (int)(l64 < nk - 1 ? l64 : nk - 1); /* may be -1: no key visible */
    float v[DT_ATTN_WV];
    float mx = -INFINITY;
DT_ATTN_UNROLL
    for (int c = 0; c < DT_ATTN_WV; c++) {
      const int j = lane + 32 * c;
      v[c] = j <= last ? xr[j] : -INFINITY;
      mx = fmaxf(mx, v[c]); /* NaN scores are skipped, as the host's max skips them */
    }
    for (int j = lane + 32 * DT_ATTN_WV; j <= last; j += 32) mx = fmaxf(mx, xr[j]);
    mx = dt_cu_warp_max(mx);
    float sum = 0.0f;
DT_ATTN_UNROLL
    for (int c = 0; c < DT_ATTN_WV; c++)
      if (lane + 32 * c <= last) {
        v[c] = expf(v[c] - mx);
        sum += v[c];
      }
    for (int j = lane + 32 * DT_ATTN_WV; j <= last; j += 32) sum += expf(xr[j] - mx);
    sum = dt_cu_warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f; /* the host's (a NaN sum: 0, NaN stays) */
DT_ATTN_UNROLL
    for (int c = 0; c < DT_ATTN_WV; c++) {
      const int j = lane + 32 * c;
      if (j < n) pr[j] = dt_cu_from_f32<T>(j <= last ? v[c] * inv : 0.0f);
    }
    for (int j = lane + 32 * DT_ATTN_WV; j < n; j += 32)
      pr[j] = dt_cu_from_f32<T>(j <= last ? expf(xr[j] - mx) * inv : 0.0f);
  }
}

/* dS = scale P (dP - sum over the visible keys of P dP), row by row (the host's loop, with the
 * scale of dQ and dK folded in), written over P; rows as in dt_attn_softmax_kernel. */
template <typename T>
__global__ void __launch_bounds__(DT_CU_BLOCK)
    dt_attn_ds_kernel(const float* dp, T* p, int64_t rows, int64_t S, int64_t nk, int64_t ld,
                      int64_t q0, int causal, float scale) {
  const int lane = threadIdx.x & 31, n = (int)nk;
  for (int64_t r = (int64_t)blockIdx.x * DT_ATTN_WPB + (threadIdx.x >> 5); r < rows;
       r += (int64_t)gridDim.x * DT_ATTN_WPB) {
    const float* dr = dp + r * ld;
    T* pr = p + r * ld;
    const int64_t v64 = causal ? q0 + dt_attn_qrow(r, S) + 1 : nk; /* P is 0 past them */
    const int vis = (int)(v64 < nk ? v64 : nk);
    float pv[DT_ATTN_WV], dv[DT_ATTN_WV];
    float dot = 0.0f;
DT_ATTN_UNROLL
    for (int c = 0; c < DT_ATTN_WV; c++) {
      const int j = lane + 32 * c;
      pv[c] = j < n ? dt_cu_f32(pr[j]) : 0.0f;
      dv[c] = j < n ? dr[j] : 0.0f;
      if (j < vis) dot += pv[c] * dv[c];
    }
    for (int j = lane + 32 * DT_ATTN_WV; j < vis; j += 32) dot += dt_cu_f32(pr[j]) * dr[j];
    dot = dt_cu_warp_sum(dot);
DT_ATTN_UNROLL
    for (int c = 0; c < DT_ATTN_WV; c++) {
      const int j = lane + 32 * c;
      if (j < n) pr[j] = dt_cu_from_f32<T>(scale * (pv[c] * (dv[c] - dot)));
    }
    for (int j = lane + 32 * DT_ATTN_WV; j < n; j += 32)
      pr[j] = dt_cu_from_f32<T>(scale * (dt_cu_f32(pr[j]) * (dr[j] - dot)));
  }
}

/* Between an operand of layout 1 and its packed chunk (to_packed: tensor -> packed): entries
 * e0 .. e0 + n - 1, entry e being batch e / G with heads (e % G) hpe .. (e % G + 1) hpe - 1, each
 * head rows x feat, packed in (entry, head, row, feature) order. */
template <typename T>
__global__ void dt_attn_pack_kernel(T* packed, T* tensor, dt_attn_strides s, int64_t e0,
                                    int64_t n, int64_t G, int64_t hpe, int64_t rows, int64_t feat,
                                    int to_packed) {
  const int64_t total = n * hpe * rows * feat;
  for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total;
       x += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = x / feat;
    const int64_t f = x - t * feat, i = t % rows;
    t /= rows;
    const int64_t j = t % hpe, e = e0 + t / hpe;
    const int64_t off = e / G * s.sb + (e % G * hpe + j) * s.sh + i * s.ss + f;
    if (to_packed) packed[x] = tensor[off];
    else tensor[off] = packed[x];
  }
}

/* The rounded-up n. */
static int64_t dt_attn_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

/* Scratch regions of a chunk of n entries (byte offsets, each DT_ATTN_ALIGN-aligned; 0 bytes for
 * a region the case does not use): the f32 scores x, P (and dS), and for layout 1 the packed q
 * (then dq), k, v (then dv), o (O, or dO) and dk. */
struct dt_attn_ws {
  int64_t ldt;                          /* row stride of x and p (T rounded up to 8) */
  size_t x, p, q, k, v, o, dk, nbytes;  /* offsets and the total */
  size_t raw;                           /* the regions' bytes without alignment */
  int p_is_x;                           /* forward in f32: P written over the scores */
};

static void dt_attn_ws_plan(const dt_attn_geom& g, size_t item, int bwd, int64_t n,
                            dt_attn_ws* w) {
  const int64_t M = g.rep * g.S, packed = g.layout == 1;
  memset(w, 0, sizeof *w);
  w->ldt = dt_attn_up(g.T, 8);
  w->p_is_x = !bwd && item == sizeof(float);
  const size_t sizes[7] = {
      sizeof(float) * (size_t)(n * M * w->ldt),
      w->p_is_x ? 0 : item * (size_t)(n * M * w->ldt),
      packed ? item * (size_t)(n * M * g.D) : 0,
      packed ? item * (size_t)(n * g.T * g.D) : 0,
      packed ? item * (size_t)(n * g.T * g.E) : 0,
      packed ? item * (size_t)(n * M * g.E) : 0,
      packed && bwd ? item * (size_t)(n * g.T * g.D) : 0,
  };
  size_t* offs[7] = {&w->x, &w->p, &w->q, &w->k, &w->v, &w->o, &w->dk};
  size_t at = 0;
  for (int i = 0; i < 7; i++) {
    *offs[i] = at;
    at += (size_t)dt_attn_up((int64_t)sizes[i], DT_ATTN_ALIGN);
    w->raw += sizes[i];
  }
  w->nbytes = at;
  if (w->p_is_x) w->p = w->x;
}

/* DTENSOR_SDPA_PATH and DTENSOR_SDPA_WORKSPACE_MB, read once per process. */
enum { DT_ATTN_AUTO = 0, DT_ATTN_GEMM = 1, DT_ATTN_FLASH = 2 };

static int dt_attn_read_path(void) {
  const char* e = getenv("DTENSOR_SDPA_PATH");
  if (e == NULL || *e == '\0' || strcmp(e, "auto") == 0) return DT_ATTN_AUTO;
  if (strcmp(e, "gemm") == 0) return DT_ATTN_GEMM;
  if (strcmp(e, "flash") == 0) return DT_ATTN_FLASH;
  dt__log("cuda", "ignoring DTENSOR_SDPA_PATH=%s: expected auto, gemm or flash", e);
  return DT_ATTN_AUTO;
}
static size_t dt_attn_read_cap(void) {
  const size_t def = (size_t)512 << 20;
  const char* e = getenv("DTENSOR_SDPA_WORKSPACE_MB");
  if (e == NULL || *e == '\0') return def;
  char* end = NULL;
  const double mb = strtod(e, &end);
  if (end == e || *end != '\0' || !(mb >= 0.0 && mb <= 1e9)) {
    dt__log("cuda", "ignoring DTENSOR_SDPA_WORKSPACE_MB=%s: expected MiB, a number >= 0", e);
    return def;
  }
  return (size_t)(mb * 1048576.0);
}
static int dt_attn_path(void) {
  static const int path = dt_attn_read_path(); /* thread-safe initialization */
  return path;
}
static size_t dt_attn_cap(void) {
  static const size_t cap = dt_attn_read_cap();
  return cap;
}

/* Entries per chunk of the GEMM path, or 0 for the flash path, on a device with smem bytes of
 * shared memory per block (the flash path only where its kernels' tiles fit). */
static int dt_attn_flash_fits(const dt_attn_geom& g, size_t item, int bwd, size_t smem) {
  if (item == 2) /* bf16, f16: the tensor-core kernels */
    return dt_tc_frags(g.D, g.E) > 0 && dt_tc_smem_of(0, g.D, g.E).nbytes <= smem &&
           (!bwd || (dt_tc_smem_of(1, g.D, g.E).nbytes <= smem &&
                     dt_tc_smem_of(2, g.D, g.E).nbytes <= smem));
  return dt_attn_fwd_smem(&g) <= smem &&
         (!bwd || (dt_attn_dq_smem(&g) <= smem && dt_attn_dkv_smem(&g) <= smem));
}
static int64_t dt_attn_choose(const dt_attn_geom& g, size_t item, int bwd, size_t smem) {
  const int flash_ok = dt_attn_flash_fits(g, item, bwd, smem);
  const int path = dt_attn_path();
  if (path == DT_ATTN_FLASH && flash_ok) return 0;
  /* auto: a bf16/f16 forward on tensor cores (faster than the GEMM path, and no scratch) */
  if (path == DT_ATTN_AUTO && flash_ok && item == 2 && !bwd) return 0;
  const int64_t entries = g.B * g.G;
  const size_t cap = dt_attn_cap();
  dt_attn_ws one;
  dt_attn_ws_plan(g, item, bwd, 1, &one);
  if (one.nbytes > cap) return path == DT_ATTN_AUTO && flash_ok ? 0 : 1;
  /* n entries take at most n * (one entry's unaligned bytes) + the regions' alignment */
  const size_t slack = 7 * DT_ATTN_ALIGN;
  int64_t n = cap > slack + one.raw ? (int64_t)((cap - slack) / one.raw) : 1;
  return n < entries ? n : entries;
}

/* Operand of a chunk as the GEMMs see it: consecutive heads' rows back to back (ld = feat), entry
 * i at p + i * stride elements. */
struct dt_attn_view {
  char* p;
  int64_t ld, stride;
};

/* The view of an operand with strides s, hpe heads per entry of rows x feat: the tensor itself
 * from entry e0 (layout 0), else its packed region. */
static dt_attn_view dt_attn_view_of(const dt_attn_geom& g, void* tensor, const dt_attn_strides& s,
                                    int64_t hpe, int64_t rows, int64_t feat, size_t item,
                                    int64_t e0, char* packed) {
  dt_attn_view v;
  v.p = g.layout == 1 ? packed
                      : (char*)tensor + item * (size_t)(e0 / g.G * s.sb + e0 % g.G * hpe * s.sh);
  v.ld = feat > 0 ? feat : 1;
  v.stride = hpe * rows * feat;
  return v;
}

/* One strided batched GEMM through the backend: C_i = alpha op(A_i) op(B_i) (beta 0). */
static dt_status_t dt_attn_gemm(const dt_local_tensor_t* t, dt_dtype_t ab, dt_dtype_t c_dt, int ta,
                                int tb, int64_t m, int64_t n, int64_t k, int64_t batch,
                                float alpha, const void* a, int64_t lda, int64_t sa,
                                const void* b, int64_t ldb, int64_t sb, void* c, int64_t ldc,
                                int64_t sc) {
  dt_gemm_t gm;
  memset(&gm, 0, sizeof gm);
  gm.trans_a = ta;
  gm.trans_b = tb;
  gm.m = m;
  gm.n = n;
  gm.k = k;
  gm.batch = batch;
  gm.alpha = alpha;
  gm.beta = 0.0f;
  gm.ab_dtype = ab;
  gm.c_dtype = c_dt;
  gm.a = a;
  gm.lda = lda;
  gm.stride_a = sa;
  gm.b = b;
  gm.ldb = ldb;
  gm.stride_b = sb;
  gm.c = c;
  gm.ldc = ldc;
  gm.stride_c = sc;
  return t->backend->iface->gemm(t->backend, &gm);
}

/* Launches the pack kernel for one operand (nothing when it is empty). */
template <typename T>
static dt_status_t dt_attn_pack(const char* op, const dt_local_tensor_t* t, T* packed,
                                void* tensor, const dt_attn_strides& s, const dt_attn_geom& g,
                                int64_t e0, int64_t n, int64_t hpe, int64_t rows, int64_t feat,
                                int to_packed) {
  const int64_t total = n * hpe * rows * feat;
  if (total == 0) return DT_SUCCESS;
  DT_CU_LAUNCH(op, dt_attn_pack_kernel<T>, dt_cu_grid(t, total), DT_CU_BLOCK, 0, dt_cu_stream(t),
               packed, (T*)tensor, s, e0, n, g.G, hpe, rows, feat, to_packed);
  return DT_SUCCESS;
}

/* Entries e0 .. e0 + n - 1 of sdpa (bwd 0: out = {O}) or sdpa_grad (bwd 1: in gets dO, out =
 * {dQ, dK, dV}) in the scratch `ws` planned by w. */
template <typename T>
static dt_status_t dt_attn_chunk(const char* op, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out, const dt_attn_geom& g, dt_dtype_t dt,
                                 const dt_attn_ws& w, char* ws, int64_t e0, int64_t n, int bwd) {
  const size_t item = sizeof(T);
  const int64_t M = g.rep * g.S, ldt = w.ldt, sx = M * ldt, rows = n * M;
  const dt_local_tensor_t* t = &in[0];
  const cudaStream_t st = dt_cu_stream(t);
  float* x = (float*)(ws + w.x);
  T* p = (T*)(ws + w.p);
  const dt_attn_view q = dt_attn_view_of(g, in[0].data, g.q, g.rep, g.S, g.D, item, e0, ws + w.q);
  const dt_attn_view k = dt_attn_view_of(g, in[1].data, g.k, 1, g.T, g.D, item, e0, ws + w.k);
  const dt_attn_view v = dt_attn_view_of(g, in[2].data, g.v, 1, g.T, g.E, item, e0, ws + w.v);
  /* O (forward) or dO (backward) */
  const dt_attn_view o = dt_attn_view_of(g, bwd ? in[3].data : out[0].data, g.o, g.rep, g.S, g.E,
                                         item, e0, ws + w.o);
  if (g.layout == 1) {
    DT_CHECK(dt_attn_pack<T>(op, t, (T*)q.p, in[0].data, g.q, g, e0, n, g.rep, g.S, g.D, 1));
    DT_CHECK(dt_attn_pack<T>(op, t, (T*)k.p, in[1].data, g.k, g, e0, n, 1, g.T, g.D, 1));
    DT_CHECK(dt_attn_pack<T>(op, t, (T*)v.p, in[2].data, g.v, g, e0, n, 1, g.T, g.E, 1));
    if (bwd)
      DT_CHECK(dt_attn_pack<T>(op, t, (T*)o.p, in[3].data, g.o, g, e0, n, g.rep, g.S, g.E, 1));
  }
  /* the row kernels: a warp per row */
  const unsigned grid = dt_attn_grid(t, (rows + DT_ATTN_WPB - 1) / DT_ATTN_WPB);
  const int nt = DT_CU_BLOCK;
  /* X = scale Q K^T; P = softmax(X) */
  DT_CHECK(dt_attn_gemm(t, dt, DT_F32, 0, 1, M, g.T, g.D, n, g.scale, q.p, q.ld, q.stride, k.p,
                        k.ld, k.stride, x, ldt, sx));
  DT_CU_LAUNCH(op, dt_attn_softmax_kernel<T>, grid, nt, 0, st, (const float*)x, p, rows,
               g.S, g.T, ldt, g.q0, g.causal);
  if (!bwd) { /* O = P V */
    DT_CHECK(dt_attn_gemm(t, dt, dt, 0, 0, M, g.E, g.T, n, 1.0f, p, ldt, sx, v.p, v.ld, v.stride,
                          o.p, o.ld, o.stride));
    if (g.layout == 1)
      DT_CHECK(dt_attn_pack<T>(op, t, (T*)o.p, out[0].data, g.o, g, e0, n, g.rep, g.S, g.E, 0));
    return DT_SUCCESS;
  }
  /* X = dP = dO V^T; dV = P^T dO (layout 1: over the packed V, read by now) */
  DT_CHECK(dt_attn_gemm(t, dt, DT_F32, 0, 1, M, g.T, g.E, n, 1.0f, o.p, o.ld, o.stride, v.p, v.ld,
                        v.stride, x, ldt, sx));
  const dt_attn_view dv = dt_attn_view_of(g, out[2].data, g.v, 1, g.T, g.E, item, e0, ws + w.v);
  DT_CHECK(dt_attn_gemm(t, dt, dt, 1, 0, g.T, g.E, M, n, 1.0f, p, ldt, sx, o.p, o.ld, o.stride,
                        dv.p, dv.ld, dv.stride));
  /* dS = scale P (dP - rowsum(P dP)) over P; dK = dS^T Q (summed over the group's heads: k is
   * r S); dQ = dS K (layout 1: over the packed Q, read by now) */
  DT_CU_LAUNCH(op, dt_attn_ds_kernel<T>, grid, nt, 0, st, (const float*)x, p, rows, g.S,
               g.T, ldt, g.q0, g.causal, g.scale);
  const dt_attn_view dk = dt_attn_view_of(g, out[1].data, g.k, 1, g.T, g.D, item, e0, ws + w.dk);
  DT_CHECK(dt_attn_gemm(t, dt, dt, 1, 0, g.T, g.D, M, n, 1.0f, p, ldt, sx, q.p, q.ld, q.stride,
                        dk.p, dk.ld, dk.stride));
  const dt_attn_view dq = dt_attn_view_of(g, out[0].data, g.q, g.rep, g.S, g.D, item, e0, ws + w.q);
  DT_CHECK(dt_attn_gemm(t, dt, dt, 0, 0, M, g.D, g.T, n, 1.0f, p, ldt, sx, k.p, k.ld, k.stride,
                        dq.p, dq.ld, dq.stride));
  if (g.layout == 1) {
    DT_CHECK(dt_attn_pack<T>(op, t, (T*)dq.p, out[0].data, g.q, g, e0, n, g.rep, g.S, g.D, 0));
    DT_CHECK(dt_attn_pack<T>(op, t, (T*)dk.p, out[1].data, g.k, g, e0, n, 1, g.T, g.D, 0));
    DT_CHECK(dt_attn_pack<T>(op, t, (T*)dv.p, out[2].data, g.v, g, e0, n, 1, g.T, g.E, 0));
  }
  return DT_SUCCESS;
}

/* The GEMM path over all entries, `chunk` at a time, in one scratch block. */
template <typename T>
static dt_status_t dt_attn_gemm_path(const char* op, const dt_local_tensor_t* in,
                                     dt_local_tensor_t* out, const dt_attn_geom& g, dt_dtype_t dt,
                                     int bwd, int64_t chunk) {
  const int64_t entries = g.B * g.G;
  dt_attn_ws w;
  dt_attn_ws_plan(g, sizeof(T), bwd, chunk, &w);
  void* ws;
  DT_CHECK(dt_cu_scratch(&in[0], op, w.nbytes, &ws));
  dt_status_t st = DT_SUCCESS;
  for (int64_t e0 = 0; e0 < entries && st == DT_SUCCESS; e0 += chunk)
    st = dt_attn_chunk<T>(op, in, out, g, dt, w, (char*)ws, e0,
                          entries - e0 < chunk ? entries - e0 : chunk, bwd);
  dt_cu_scratch_free(&in[0], ws, w.nbytes); /* stream-ordered: after the kernels */
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * Kernels */

/* Zeros nbytes at p on t's stream. */
static dt_status_t dt_attn_zero(const dt_local_tensor_t* t, void* p, size_t nbytes) {
  if (nbytes == 0) return DT_SUCCESS;
  const int rc = (int)cudaMemsetAsync(p, 0, nbytes, dt_cu_stream(t));
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, "sdpa zero fill");
}
static size_t dt_attn_nbytes(const dt_local_tensor_t* t) {
  return dt__itemsize(t->dtype) * (size_t)dt_cu_numel(t);
}

/* sdpa (q, k, v), iargs [causal = 0, layout = 0], fargs [scale = 1 / sqrt(D)]: out = softmax(scale
 * q k^T) v, of q's layout with v's feature size. */
DT_CU_KERNEL(dt_cu_sdpa) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 3, 0, out, 1, &dt));
  dt_attn_geom g;
  dt_attn_geom_init(call, in, &g);
  if (g.B * g.H * g.S * g.E == 0) return DT_SUCCESS;
  if (g.T == 0) return dt_attn_zero(&out[0], out[0].data, dt_attn_nbytes(&out[0])); /* host's */
  const int64_t chunk = dt_attn_choose(g, dt__itemsize(dt), 0, dt_attn_smem_limit());
  return dt_cu_float_dispatch(call->op, dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    if (chunk > 0) return dt_attn_gemm_path<T>(call->op, in, out, g, dt, 0, chunk);
    if constexpr (sizeof(T) == 2) /* tensor cores */
      return dt_tc_frags_dispatch(g, [&](auto nf) -> dt_status_t {
        const auto kernel = dt_tc_fwd_kernel<T, T, decltype(nf)::value>;
        const size_t smem = dt_tc_smem_of(0, g.D, g.E).nbytes;
        const int rc = dt_attn_allow_smem(kernel, smem);
        if (rc != 0) return DT_CUDA_NAME(status)(rc, call->op);
        const int64_t items = dt_attn_qitems(g, DT_TC_B);
        DT_CU_LAUNCH(call->op, kernel, dt_attn_grid(&in[0], items), DT_TC_NT, smem,
                     dt_cu_stream(&in[0]), g, (const T*)in[0].data, (const T*)in[1].data,
                     (const T*)in[2].data, (T*)out[0].data, (float*)NULL, (float*)NULL,
                     (const T*)NULL);
        return DT_SUCCESS;
      });
    const size_t smem = dt_attn_fwd_smem(&g);
    const int rc = dt_attn_allow_smem(dt_attn_fwd_kernel<T>, smem);
    if (rc != 0) return DT_CUDA_NAME(status)(rc, call->op);
    const int64_t items = dt_attn_qitems(g, DT_ATTN_BQ);
    DT_CU_LAUNCH(call->op, dt_attn_fwd_kernel<T>, dt_attn_grid(&in[0], items), DT_ATTN_NT, smem,
                 dt_cu_stream(&in[0]), g, (const T*)in[0].data, (const T*)in[1].data,
                 (const T*)in[2].data, (T*)out[0].data, (float*)NULL, (float*)NULL,
                 (const T*)NULL);
    return DT_SUCCESS;
  });
}

/* The flash path of sdpa_grad's scratch: lse and delta per query row of every (batch, head). */
static size_t dt_attn_flash_grad_nbytes(const dt_attn_geom& g) {
  return sizeof(float) * (size_t)(2 * g.B * g.H * g.S);
}
/* sdpa_grad's copy of a dO whose float dtype is not q's (0: none). */
static size_t dt_attn_go_nbytes(const dt_local_tensor_t* in, dt_dtype_t dt) {
  return in[3].dtype == dt ? 0 : dt__itemsize(dt) * (size_t)dt_cu_numel(&in[3]);
}

/* The flash path of sdpa_grad: the three kernels (KF, KQ, KKV: the forward, dQ and dK/dV
 * kernels of either implementation, whose tiles are bq query rows and bk keys) with s_fwd, s_dq
 * and s_dkv bytes of shared memory and nt threads a block. */
template <typename T, typename KF, typename KQ, typename KKV>
static dt_status_t dt_attn_flash_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out, const dt_attn_geom& g, KF kfwd,
                                      KQ kdq, KKV kdkv, int bq, int bk, int nt, size_t s_fwd,
                                      size_t s_dq, size_t s_dkv) {
  int rc = dt_attn_allow_smem(kfwd, s_fwd);
  if (rc == 0) rc = dt_attn_allow_smem(kdq, s_dq);
  if (rc == 0) rc = dt_attn_allow_smem(kdkv, s_dkv);
  if (rc != 0) return DT_CUDA_NAME(status)(rc, call->op);
  /* per query row of every (batch, head): lse, then delta */
  const int64_t rows = g.B * g.H * g.S;
  const size_t nbytes = dt_attn_flash_grad_nbytes(g);
  void* scratch;
  DT_CHECK(dt_cu_scratch(&in[0], call->op, nbytes, &scratch));
  float *lse = (float*)scratch, *delta = lse + rows;
  const T *q = (const T*)in[0].data, *k = (const T*)in[1].data, *v = (const T*)in[2].data,
          *go = (const T*)in[3].data;
  T *dq = (T*)out[0].data, *dk = (T*)out[1].data, *dv = (T*)out[2].data;
  cudaStream_t st = dt_cu_stream(&in[0]);
  const int64_t q_items = dt_attn_qitems(g, bq), k_items = dt_attn_kitems(g, bk);
  rc = dt_simt_launch(kfwd, dt_attn_grid(&in[0], q_items), nt, s_fwd, st, g, q, k, v, (T*)NULL,
                      lse, delta, go);
  if (rc == 0)
    rc = dt_simt_launch(kdq, dt_attn_grid(&in[0], q_items), nt, s_dq, st, g, q, k, v, go,
                        (const float*)lse, (const float*)delta, dq);
  if (rc == 0)
    rc = dt_simt_launch(kdkv, dt_attn_grid(&in[0], k_items), nt, s_dkv, st, g, q, k, v, go,
                        (const float*)lse, (const float*)delta, dk, dv);
  dt_cu_scratch_free(&in[0], scratch, nbytes); /* stream-ordered: after the kernels */
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, call->op);
}

/* sdpa_grad (q, k, v, dO), sdpa's arguments: (dq, dk, dv). */
DT_CU_KERNEL(dt_cu_sdpa_grad) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 3, 0, out, 3, &dt));
  dt_attn_geom g;
  dt_attn_geom_init(call, in, &g);
  const dt_dtype_t gdt = in[3].dtype;
  if (gdt != DT_F32 && gdt != DT_BF16 && gdt != DT_F16)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dO dtype %s is not supported (float dtypes only)",
                   call->op, dt_dtype_name(gdt));
  if (g.B * g.H * g.S * g.T == 0) { /* the host's zeros */
    for (int i = 0; i < 3; i++)
      DT_CHECK(dt_attn_zero(&out[i], out[i].data, dt_attn_nbytes(&out[i])));
    return DT_SUCCESS;
  }
  /* dO of another float dtype than q, k, v (the rules leave it free; the host computes in f32):
   * a copy in theirs */
  dt_local_tensor_t args[4] = {in[0], in[1], in[2], in[3]};
  void* go = NULL;
  const size_t go_nb = dt_attn_go_nbytes(in, dt);
  if (gdt != dt) {
    DT_CHECK(dt_cu_scratch(&in[3], call->op, go_nb, &go));
    const dt_status_t cs = in[3].backend->iface->convert(in[3].backend, in[3].data, gdt, go, dt,
                                                         dt_cu_numel(&in[3]));
    if (cs != DT_SUCCESS) {
      dt_cu_scratch_free(&in[3], go, go_nb);
      return cs;
    }
    args[3].data = go;
    args[3].dtype = dt;
  }
  const int64_t chunk = dt_attn_choose(g, dt__itemsize(dt), 1, dt_attn_smem_limit());
  const dt_status_t st = dt_cu_float_dispatch(call->op, dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    if (chunk > 0) return dt_attn_gemm_path<T>(call->op, args, out, g, dt, 1, chunk);
    if constexpr (sizeof(T) == 2) /* tensor cores */
      return dt_tc_frags_dispatch(g, [&](auto nf) -> dt_status_t {
        constexpr int NF = decltype(nf)::value;
        return dt_attn_flash_grad<T>(call, args, out, g, dt_tc_fwd_kernel<T, T, NF>,
                                     dt_tc_dq_kernel<T, T, NF>, dt_tc_dkv_kernel<T, T, NF>, DT_TC_B,
                                     DT_TC_B, DT_TC_NT, dt_tc_smem_of(0, g.D, g.E).nbytes,
                                     dt_tc_smem_of(1, g.D, g.E).nbytes,
                                     dt_tc_smem_of(2, g.D, g.E).nbytes);
      });
    else
      return dt_attn_flash_grad<T>(call, args, out, g, dt_attn_fwd_kernel<T>,
                                   dt_attn_dq_kernel<T>, dt_attn_dkv_kernel<T>, DT_ATTN_BQ,
                                   DT_ATTN_BK, DT_ATTN_NT, dt_attn_fwd_smem(&g),
                                   dt_attn_dq_smem(&g), dt_attn_dkv_smem(&g));
  });
  dt_cu_scratch_free(&in[3], go, go_nb); /* stream-ordered: after the kernels */
  return st;
}

/* The device scratch sdpa (bwd 0) or sdpa_grad (bwd 1) holds at once for these tensors on a
 * device with smem bytes of shared memory per block: the kernels above decide the same way (the
 * path and chunk through dt_attn_choose, the sizes through dt_attn_ws_plan,
 * dt_attn_flash_grad_nbytes and dt_attn_go_nbytes). For simulated runs (dt_sim_set_device). */
static size_t dt_attn_scratch(const dt_op_call_t* call, const dt_local_tensor_t* in, int bwd,
                              size_t smem) {
  const dt_dtype_t dt = in[0].dtype;
  if (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16) return 0;
  dt_attn_geom g;
  dt_attn_geom_init(call, in, &g);
  const size_t item = dt__itemsize(dt);
  if (!bwd) {
    if (g.B * g.H * g.S * g.E == 0 || g.T == 0) return 0;
    const int64_t chunk = dt_attn_choose(g, item, 0, smem);
    if (chunk <= 0) return 0; /* the flash forward keeps everything on chip */
    dt_attn_ws w;
    dt_attn_ws_plan(g, item, 0, chunk, &w);
    return dt_cu_scratch_size(w.nbytes);
  }
  if (g.B * g.H * g.S * g.T == 0) return 0;
  const int64_t chunk = dt_attn_choose(g, item, 1, smem);
  size_t path = dt_attn_flash_grad_nbytes(g);
  if (chunk > 0) {
    dt_attn_ws w;
    dt_attn_ws_plan(g, item, 1, chunk, &w);
    path = w.nbytes;
  }
  const size_t go = dt_attn_go_nbytes(in, dt);
  return (go ? dt_cu_scratch_size(go) : 0) + dt_cu_scratch_size(path);
}
/* The shared memory per block of in[0]'s device, or of the one a simulation plays. */
static size_t dt_attn_smem_of(const dt_local_tensor_t* t) {
  return t->backend->device == DT_DEVICE_META ? DT_CU_SIM_SMEM : dt_attn_smem_limit();
}
DT_CU_SCRATCH(dt_cu_sdpa_scratch) {
  return (void)out, dt_attn_scratch(call, in, 0, dt_attn_smem_of(&in[0]));
}
DT_CU_SCRATCH(dt_cu_sdpa_grad_scratch) {
  return (void)out, dt_attn_scratch(call, in, 1, dt_attn_smem_of(&in[0]));
}

/* ---------------------------------------------------------------------------------------------
 * Ring attention's blocks (src/ops/kernels_ring.c, dt__ring_rows_t's block_fwd and block_bwd):
 * query rows qr .. qr + C of a rank's q against key rows kr .. kr + C of a k/v shard, every
 * (batch, head) in one launch of the f32 flash kernels above in their accumulating mode (the
 * forward merges into the ring's running output, max and sum; the backward adds to dq, dk, dv),
 * instead of four (forward) or seven (backward) launches per (batch, head) of the products and
 * row steps. The block's geometry: S = T = C, the strides of the whole shard's tensors (the
 * pointers advanced to the block's first rows), per-row arrays lds = S apart, and the causal
 * diagonal block as causal attention from position 0 (key j visible to query i when j <= i).
 * Taken (ring_fused) where the tiles fit in shared memory, and then the ring allocates no C x C
 * scratch: under DTENSOR_SDPA_PATH=flash always, under auto for bf16/f16 (the tensor-core kernels)
 * and for f32 blocks of up to DT_ATTN_RING_FUSED_F32_ROWS rows, never under gemm. bf16/f16 inputs
 * (dt__ring_geom_t's dt) take the tensor-core kernels in the same accumulating mode: q, k, v (and
 * dO) read as stored, the running output, max and sum and the gradients f32 (TO = float).
 * auto's choice is measured (H200, 2026-11-29, bench_gpu --ring, a training step of the op, ms):
 * bf16 fused 19.1 / products 31.5 at B 1, S 8192, 16 heads of 64 (blocks of 4096 rows) and
 * 3.5 / 24.9 at B 8, S 1024, 14 heads (blocks of 512); f32 (the fused kernels on CUDA cores
 * against cuBLASLt's products) 79.5 / 31.0 at the first shape and 9.6 / 23.5 at the second,
 * where the products' launches per (batch, head) cost more than they save. */
#define DT_ATTN_RING_FUSED_F32_ROWS 1024

static dt_attn_geom dt_attn_ring_geom(const dt__ring_geom_t* rg, int64_t C, int diag) {
  dt_attn_geom g;
  memset(&g, 0, sizeof g);
  g.B = rg->B;
  g.H = rg->H;
  g.G = rg->G;
  g.S = C;
  g.T = C;
  g.D = rg->D;
  g.E = rg->E;
  g.rep = g.G > 0 ? g.H / g.G : 1;
  g.q = dt_attn_strides_of(rg->layout, rg->H, rg->S, rg->D);
  g.k = dt_attn_strides_of(rg->layout, rg->G, rg->T, rg->D);
  g.v = dt_attn_strides_of(rg->layout, rg->G, rg->T, rg->E);
  g.o = dt_attn_strides_of(rg->layout, rg->H, rg->S, rg->E);
  g.lds = rg->S;
  g.causal = diag;
  g.layout = rg->layout;
  g.accum = 1;
  g.scale = rg->D > 0 ? (float)rg->scale : 0.0f;
  return g;
}

}  // namespace

/* Forward and backward tiles alike (the diagonal block's causal flag changes no tile size), for
 * inputs of rg->dt (bf16/f16: the tensor-core kernels'); on the meta backend (a simulated run
 * sizing the ring's scratch) for the device it plays. */
extern "C" int DT_CUDA_NAME(ring_fused)(const dt__ring_geom_t* rg, int64_t C) {
  const dt_attn_geom g = dt_attn_ring_geom(rg, C, 0);
  const size_t smem = rg->bk->device == DT_DEVICE_META ? DT_CU_SIM_SMEM : dt_attn_smem_limit();
  const size_t item = dt__itemsize(rg->dt);
  const int path = dt_attn_path();
  if (path == DT_ATTN_GEMM || !dt_attn_flash_fits(g, item, 1, smem)) return 0;
  /* auto: the comment above */
  return path == DT_ATTN_FLASH || item == 2 || C <= DT_ATTN_RING_FUSED_F32_ROWS;
}

extern "C" dt_status_t DT_CUDA_NAME(ring_block_fwd)(const dt__ring_geom_t* rg, const void* q,
                                                    const void* k, const void* v, int64_t qr,
                                                    int64_t kr, int64_t C, int diag, float* o,
                                                    float* m, float* l) {
  const dt_attn_geom g = dt_attn_ring_geom(rg, C, diag);
  if (g.B * g.H * C == 0) return DT_SUCCESS;
  const char* what = "ring_attention: block forward";
  cudaStream_t st = dt_cu_backend_stream(rg->bk);
  return dt_cu_float_dispatch(what, rg->dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    const T *qb = (const T*)q + qr * g.q.ss, *kb = (const T*)k + kr * g.k.ss,
            *vb = (const T*)v + kr * g.v.ss;
    /* the forward kernel with its shared memory and query tile */
    auto launch = [&](auto kernel, size_t smem, int bq, int nt) -> dt_status_t {
      int rc = dt_attn_allow_smem(kernel, smem);
      if (rc == 0)
        rc = dt_simt_launch(kernel, dt_attn_grid_on(rg->bk, dt_attn_qitems(g, bq)), nt, smem, st,
                            g, qb, kb, vb, o + qr * g.o.ss, m + qr, l + qr, (const T*)NULL);
      return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, what);
    };
    if constexpr (sizeof(T) == 2) /* tensor cores, accumulating into the f32 (o, m, l) */
      return dt_tc_frags_dispatch(g, [&](auto nf) -> dt_status_t {
        return launch(dt_tc_fwd_kernel<T, float, decltype(nf)::value>,
                      dt_tc_smem_of(0, g.D, g.E).nbytes, DT_TC_B, DT_TC_NT);
      });
    else
      return launch(dt_attn_fwd_kernel<float>, dt_attn_fwd_smem(&g), DT_ATTN_BQ, DT_ATTN_NT);
  });
}

extern "C" dt_status_t DT_CUDA_NAME(ring_block_bwd)(const dt__ring_geom_t* rg, const void* q,
                                                    const void* k, const void* v,
                                                    const void* go, const float* lse,
                                                    const float* dd, int64_t qr, int64_t kr,
                                                    int64_t C, int diag, float* dq, float* dk,
                                                    float* dv) {
  const dt_attn_geom g = dt_attn_ring_geom(rg, C, diag);
  if (g.B * g.H * C == 0) return DT_SUCCESS;
  const char* what = "ring_attention: block backward";
  cudaStream_t st = dt_cu_backend_stream(rg->bk);
  return dt_cu_float_dispatch(what, rg->dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    const T *qb = (const T*)q + qr * g.q.ss, *kb = (const T*)k + kr * g.k.ss,
            *vb = (const T*)v + kr * g.v.ss, *gb = (const T*)go + qr * g.o.ss;
    float *dqb = dq + qr * g.q.ss, *dkb = dk + kr * g.k.ss, *dvb = dv + kr * g.v.ss;
    /* the dQ kernel, then the dK/dV one, each with its shared memory and tile */
    auto launch = [&](auto kdq, auto kdkv, size_t s_dq, size_t s_dkv, int bq, int bk,
                      int nt) -> dt_status_t {
      int rc = dt_attn_allow_smem(kdq, s_dq);
      if (rc == 0) rc = dt_attn_allow_smem(kdkv, s_dkv);
      if (rc == 0)
        rc = dt_simt_launch(kdq, dt_attn_grid_on(rg->bk, dt_attn_qitems(g, bq)), nt, s_dq, st, g,
                            qb, kb, vb, gb, lse + qr, dd + qr, dqb);
      if (rc == 0)
        rc = dt_simt_launch(kdkv, dt_attn_grid_on(rg->bk, dt_attn_kitems(g, bk)), nt, s_dkv, st,
                            g, qb, kb, vb, gb, lse + qr, dd + qr, dkb, dvb);
      return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, what);
    };
    if constexpr (sizeof(T) == 2) /* tensor cores, adding to the f32 gradients */
      return dt_tc_frags_dispatch(g, [&](auto nf) -> dt_status_t {
        constexpr int NF = decltype(nf)::value;
        return launch(dt_tc_dq_kernel<T, float, NF>, dt_tc_dkv_kernel<T, float, NF>,
                      dt_tc_smem_of(1, g.D, g.E).nbytes, dt_tc_smem_of(2, g.D, g.E).nbytes,
                      DT_TC_B, DT_TC_B, DT_TC_NT);
      });
    else
      return launch(dt_attn_dq_kernel<float>, dt_attn_dkv_kernel<float>, dt_attn_dq_smem(&g),
                    dt_attn_dkv_smem(&g), DT_ATTN_BQ, DT_ATTN_BK, DT_ATTN_NT);
  });
}

/* ---------------------------------------------------------------------------------------------
 * Registration: every float dtype, as stored. */

DT_CU_FILL(attention) {
  t[DT_OP_SDPA] = {dt_cu_sdpa, DT_KERNEL_ANY_DTYPE, dt_cu_sdpa_scratch};
  t[DT_OP_SDPA_GRAD] = {dt_cu_sdpa_grad, DT_KERNEL_ANY_DTYPE, dt_cu_sdpa_grad_scratch};
}

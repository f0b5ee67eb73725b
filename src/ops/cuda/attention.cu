/* attention.cu - CUDA kernels of scaled dot-product attention (see cuda_ops.h for the
 * conventions): sdpa and its gradient sdpa_grad.
 *
 * The host kernels (dt__kernel_sdpa in src/ops/kernels_nn.c, dt__kernel_sdpa_grad in
 * kernels_grad.c) define the results with the S x T formulation: per (batch, head), scores
 * P = softmax(scale Q K^T) (causal: query row i, at global position q0 + i, sees keys 0 .. q0 + i),
 * O = P V; the gradient recomputes P, then dV = P^T dO, dS = P * (dO V^T - rowdot), dQ = scale
 * dS K, dK = scale dS^T Q, dK and dV summed over the query heads of each kv head (grouped-query
 * attention: query head h reads kv head h / (H / G)). Layout 0 is (B, H, S, D), layout 1
 * (B, S, H, D); D is the q/k feature size, E the v feature size (they may differ).
 *
 * Here the same math runs tiled, flash-attention style, in plain CUDA (no tensor cores, so the
 * SIMT emulator runs it; tensor-core versions come later):
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
 * Accumulation is f32 (exp through expf); the host sums the softmax denominator in double, so
 * results agree to f32 rounding (about 1e-6 relative), not bit for bit.
 *
 * The kernels take f32 only (registered without DT_KERNEL_ANY_DTYPE: the library hands them f32
 * copies of bf16/f16 tensors, whose cost is small next to attention's).
 *
 * Fallback: a block's tiles live in shared memory, 192 (D + E) bytes in the forward kernel and
 * about 320 (D + E) in the backward's dK/dV kernel (the largest). Where a kernel's tiles exceed
 * the device's per-block limit (227 KiB on an H100, which the emulator reports too: D + E above
 * about 710 for sdpa_grad, about 1200 for sdpa; on an A100's 163 KiB, D = E = 256 already
 * falls back in sdpa_grad), that op runs the host's S x T formulation instead (dt_attn_*_full:
 * backend GEMMs and row kernels on S x T floats of scratch, one (batch, head) at a time).
 */
#include <math.h>
#include <string.h>

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
  int causal;
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
  g->causal = (int)dt__op_iarg(DT_OP_SDPA, call, 0);
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
         (size_t)(BQ * g->D + BK * dt_attn_odd(g->D) + BK * g->E + BQ * g->E + BQ * BK + BQ);
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

/* Blocks for a grid-stride loop over `items` tiles (a few per SM; at least 1). */
static unsigned dt_attn_grid(const dt_local_tensor_t* t, int64_t items) {
  const int64_t cap = (int64_t)DT_CUDA_NAME(sm_count)(t->backend) * 32;
  return (unsigned)(items < cap ? (items < 1 ? 1 : items) : cap);
}

/* ---------------------------------------------------------------------------------------------
 * Device helpers */

/* dst[r * ldd + c] = src[r * ld + c] for r < rows, c < cols; rows valid .. rows - 1 are zeros. */
__device__ __forceinline__ void dt_attn_load(float* dst, int ldd, const float* src, int64_t ld,
                                             int rows, int valid, int cols) {
  for (int x = threadIdx.x; x < rows * cols; x += DT_ATTN_NT) {
    const int r = x / cols, c = x - r * cols;
    dst[r * ldd + c] = r < valid ? src[r * ld + c] : 0.0f;
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

/* Work item it: query tile qt (the last ones first: under causal masking they have the most
 * keys) of (batch, head) bh. Writes O (when o is not NULL); with dout, the row statistics of the
 * backward pass: lse = m + log l and delta = dO . O. */
__global__ void __launch_bounds__(DT_ATTN_NT)
    dt_attn_fwd_kernel(dt_attn_geom g, const float* q, const float* k, const float* v, float* o,
                       float* lse, float* delta, const float* dout) {
  DT_SIMT_DYN_SHARED(float, sm);
  const int BQ = DT_ATTN_BQ, BK = DT_ATTN_BK, D = (int)g.D, E = (int)g.E, ldk = dt_attn_odd(D);
  float* Qs = sm;            /* BQ x D */
  float* Ks = Qs + BQ * D;   /* BK x ldk */
  float* Vs = Ks + BK * ldk; /* BK x E */
  float* Os = Vs + BK * E;   /* BQ x E: the unnormalized output */
  float* Ps = Os + BQ * E;   /* BQ x BK: this key tile's exponentials */
  float* As = Ps + BQ * BK;  /* BQ: the rescale of the key tile; 1 / l at the end */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t nqt = (g.S + BQ - 1) / BQ, BH = g.B * g.H, items = nqt * BH;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t qt = nqt - 1 - it / BH, bh = it % BH, b = bh / g.H, h = bh % g.H;
    const int64_t i0 = qt * BQ, kvh = h / g.rep;
    const int nq = (int)(g.S - i0 < BQ ? g.S - i0 : BQ);
    const float* kb = k + b * g.k.sb + kvh * g.k.sh;
    const float* vb = v + b * g.v.sb + kvh * g.v.sh;
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
    for (int r = 0; r < DT_ATTN_RPW; r++) {
      const int i = warp + r * (DT_ATTN_NT / 32);
      /* the host's inv = sum > 0 ? 1 / sum : 0 (no keys: zeros; a NaN sum: NaN stays) */
      if (lane == 0) As[i] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      if (lane == 0 && lse != NULL && i < nq) lse[bh * g.S + i0 + i] = m[r] + logf(l[r]);
    }
    __syncthreads();
    if (o != NULL) {
      float* ob = o + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int x = tid; x < nq * E; x += DT_ATTN_NT) {
        const int i = x / E, e = x - i * E;
        ob[i * g.o.ss + e] = Os[x] * As[i];
      }
    }
    if (dout != NULL) {
      const float* gb = dout + b * g.o.sb + h * g.o.sh + i0 * g.o.ss;
      for (int r = 0; r < DT_ATTN_RPW; r++) {
        const int i = warp + r * (DT_ATTN_NT / 32);
        float d = 0.0f;
        if (i < nq)
          for (int e = lane; e < E; e += 32) d += Os[i * E + e] * As[i] * gb[i * g.o.ss + e];
        d = dt_cu_warp_sum(d);
        if (lane == 0 && i < nq) delta[bh * g.S + i0 + i] = d;
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
__device__ __forceinline__ void dt_attn_load_rows(const dt_attn_geom& g, const float* q,
                                                  const float* dout, const float* lse,
                                                  const float* delta, int64_t b, int64_t h,
                                                  int64_t i0, int nq, float* Qs, float* dOs,
                                                  float* Ls, float* Dl) {
  const int D = (int)g.D, E = (int)g.E;
  dt_attn_load(Qs, D, q + b * g.q.sb + h * g.q.sh + i0 * g.q.ss, g.q.ss, DT_ATTN_BQ, nq, D);
  dt_attn_load(dOs, E, dout + b * g.o.sb + h * g.o.sh + i0 * g.o.ss, g.o.ss, DT_ATTN_BQ, nq, E);
  const int64_t row = (b * g.H + h) * g.S + i0;
  for (int i = threadIdx.x; i < DT_ATTN_BQ; i += DT_ATTN_NT) {
    Ls[i] = i < nq ? lse[row + i] : 0.0f;
    Dl[i] = i < nq ? delta[row + i] : 0.0f;
  }
}

/* dQ of query tile qt of (batch, head) bh: scale * sum over key tiles of dS K. */
__global__ void __launch_bounds__(DT_ATTN_NT)
    dt_attn_dq_kernel(dt_attn_geom g, const float* q, const float* k, const float* v,
                      const float* dout, const float* lse, const float* delta, float* dq) {
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
  const int64_t nqt = (g.S + BQ - 1) / BQ, BH = g.B * g.H, items = nqt * BH;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t qt = nqt - 1 - it / BH, bh = it % BH, b = bh / g.H, h = bh % g.H;
    const int64_t i0 = qt * BQ, kvh = h / g.rep;
    const int nq = (int)(g.S - i0 < BQ ? g.S - i0 : BQ);
    const float* kb = k + b * g.k.sb + kvh * g.k.sh;
    const float* vb = v + b * g.v.sb + kvh * g.v.sh;
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
    float* db = dq + b * g.q.sb + h * g.q.sh + i0 * g.q.ss;
    for (int x = tid; x < nq * D; x += DT_ATTN_NT) {
      const int i = x / D, d = x - i * D;
      db[i * g.q.ss + d] = g.scale * dQs[x];
    }
  }
}

/* dK and dV of key tile kt of (batch, kv head) bg: sums over the group's query heads and their
 * query tiles of scale dS^T Q and P^T dO (the first key tiles first: under causal masking they
 * have the most queries). */
__global__ void __launch_bounds__(DT_ATTN_NT)
    dt_attn_dkv_kernel(dt_attn_geom g, const float* q, const float* k, const float* v,
                       const float* dout, const float* lse, const float* delta, float* dk,
                       float* dv) {
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
  const int64_t nkt = (g.T + BK - 1) / BK, BG = g.B * g.G, items = nkt * BG;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t kt = it / BG, bg = it % BG, b = bg / g.G, kvh = bg % g.G, j0 = kt * BK;
    const int nk = (int)(g.T - j0 < BK ? g.T - j0 : BK);
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
    float* kd = dk + b * g.k.sb + kvh * g.k.sh + j0 * g.k.ss;
    float* vd = dv + b * g.v.sb + kvh * g.v.sh + j0 * g.v.ss;
    for (int x = tid; x < nk * D; x += DT_ATTN_NT) {
      const int j = x / D, d = x - j * D;
      kd[j * g.k.ss + d] = g.scale * dKs[x];
    }
    for (int x = tid; x < nk * E; x += DT_ATTN_NT) {
      const int j = x / E, e = x - j * E;
      vd[j * g.v.ss + e] = dVs[x];
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * The S x T fallback (tiles too large for shared memory): the host's formulation, per
 * (batch, head) GEMMs through the backend and row kernels on an S x T score matrix. */

/* Max of v over the block (see dt_cu_block_sum). */
__device__ __forceinline__ float dt_attn_block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = dt_cu_warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float s = lane < nw ? smem[lane] : -INFINITY;
  s = dt_cu_warp_max(s);
  __syncthreads();
  return s;
}

/* Row-wise softmax of p (S, T) in place (the host's dt__attn_softmax_rows): row i sees keys
 * 0 .. last (causal: q0 + i), the rest become 0. One block per row. */
__global__ void dt_attn_softmax_kernel(float* p, int64_t S, int64_t T, int64_t q0, int causal) {
  __shared__ float red[32];
  for (int64_t i = blockIdx.x; i < S; i += gridDim.x) {
    float* row = p + i * T;
    int64_t last = causal ? q0 + i : T - 1;
    if (last > T - 1) last = T - 1;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = dt_attn_block_max(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    sum = dt_cu_block_sum(sum, red);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= last ? row[j] * inv : 0.0f;
  }
}

/* dP (S, T) = P * (dP - sum over the visible keys of P dP), row by row (the host's loop). */
__global__ void dt_attn_ds_kernel(const float* p, float* dp, int64_t S, int64_t T, int64_t q0,
                                  int causal) {
  __shared__ float red[32];
  for (int64_t i = blockIdx.x; i < S; i += gridDim.x) {
    const float* pr = p + i * T;
    float* dr = dp + i * T;
    int64_t vis = causal ? q0 + i + 1 : T;
    if (vis > T) vis = T;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < vis; j += blockDim.x) dot += pr[j] * dr[j];
    dot = dt_cu_block_sum(dot, red);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) dr[j] = pr[j] * (dr[j] - dot);
  }
}

/* An f32 GEMM through the backend (see dt_gemm_t); k > 0. */
static dt_status_t dt_attn_gemm(const dt_local_tensor_t* t, int ta, int tb, int64_t m, int64_t n,
                                int64_t k, float alpha, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dt_gemm_t gm;
  memset(&gm, 0, sizeof gm);
  gm.trans_a = ta;
  gm.trans_b = tb;
  gm.m = m;
  gm.n = n;
  gm.k = k;
  gm.batch = 1;
  gm.alpha = alpha;
  gm.beta = beta;
  gm.ab_dtype = DT_F32;
  gm.c_dtype = DT_F32;
  gm.a = a;
  gm.lda = lda;
  gm.b = b;
  gm.ldb = ldb;
  gm.c = c;
  gm.ldc = ldc;
  return t->backend->iface->gemm(t->backend, &gm);
}

/* Zeros the n floats at p on t's stream. */
static dt_status_t dt_attn_zero(const dt_local_tensor_t* t, float* p, int64_t n) {
  if (n <= 0) return DT_SUCCESS;
  const int rc = (int)cudaMemsetAsync(p, 0, sizeof(float) * (size_t)n, dt_cu_stream(t));
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, "sdpa zero fill");
}

/* P (S, T) of (b, h): softmax(scale q k^T) with the causal mask. */
static dt_status_t dt_attn_probs(const char* op, const dt_local_tensor_t* in,
                                 const dt_attn_geom& g, int64_t b, int64_t h, float* p) {
  const float* qh = (const float*)in[0].data + b * g.q.sb + h * g.q.sh;
  const float* kh = (const float*)in[1].data + b * g.k.sb + h / g.rep * g.k.sh;
  if (g.D > 0)
    DT_CHECK(dt_attn_gemm(&in[0], 0, 1, g.S, g.T, g.D, g.scale, qh, g.q.ss, kh, g.k.ss, 0.0f, p,
                          g.T));
  else
    DT_CHECK(dt_attn_zero(&in[0], p, g.S * g.T));
  DT_CU_LAUNCH(op, dt_attn_softmax_kernel, dt_attn_grid(&in[0], g.S), DT_CU_BLOCK, 0,
               dt_cu_stream(&in[0]), p, g.S, g.T, g.q0, g.causal);
  return DT_SUCCESS;
}

static dt_status_t dt_attn_fwd_full(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    float* o, const dt_attn_geom& g) {
  const size_t pn = sizeof(float) * (size_t)(g.S * g.T);
  void* scratch;
  DT_CHECK(dt_cu_scratch(&in[0], call->op, pn, &scratch));
  float* p = (float*)scratch;
  dt_status_t st = DT_SUCCESS;
  for (int64_t b = 0; b < g.B && st == DT_SUCCESS; b++)
    for (int64_t h = 0; h < g.H && st == DT_SUCCESS; h++) {
      st = dt_attn_probs(call->op, in, g, b, h, p);
      if (st == DT_SUCCESS)
        st = dt_attn_gemm(&in[0], 0, 0, g.S, g.E, g.T, 1.0f, p, g.T,
                          (const float*)in[2].data + b * g.v.sb + h / g.rep * g.v.sh, g.v.ss,
                          0.0f, o + b * g.o.sb + h * g.o.sh, g.o.ss);
    }
  dt_cu_scratch_free(&in[0], scratch, pn); /* stream-ordered: after the kernels */
  return st;
}

static dt_status_t dt_attn_bwd_full(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    float* dq, float* dk, float* dv, const dt_attn_geom& g) {
  DT_CHECK(dt_attn_zero(&in[0], dk, g.B * g.G * g.T * g.D));
  DT_CHECK(dt_attn_zero(&in[0], dv, g.B * g.G * g.T * g.E));
  const size_t pn = sizeof(float) * (size_t)(2 * g.S * g.T);
  void* scratch;
  DT_CHECK(dt_cu_scratch(&in[0], call->op, pn, &scratch));
  float *p = (float*)scratch, *dp = p + g.S * g.T;
  const float *q = (const float*)in[0].data, *k = (const float*)in[1].data,
              *v = (const float*)in[2].data, *go = (const float*)in[3].data;
  dt_status_t st = DT_SUCCESS;
  for (int64_t b = 0; b < g.B && st == DT_SUCCESS; b++)
    for (int64_t h = 0; h < g.H && st == DT_SUCCESS; h++) {
      const int64_t gi = h / g.rep;
      const int64_t oq = b * g.q.sb + h * g.q.sh, ok = b * g.k.sb + gi * g.k.sh,
                    ov = b * g.v.sb + gi * g.v.sh, og = b * g.o.sb + h * g.o.sh;
      st = dt_attn_probs(call->op, in, g, b, h, p);
      if (st != DT_SUCCESS) break;
      /* dv += P^T dO ; dP = dO v^T */
      st = dt_attn_gemm(&in[0], 1, 0, g.T, g.E, g.S, 1.0f, p, g.T, go + og, g.o.ss, 1.0f, dv + ov,
                        g.v.ss);
      if (st == DT_SUCCESS)
        st = g.E > 0 ? dt_attn_gemm(&in[0], 0, 1, g.S, g.T, g.E, 1.0f, go + og, g.o.ss, v + ov,
                                    g.v.ss, 0.0f, dp, g.T)
                     : dt_attn_zero(&in[0], dp, g.S * g.T);
      if (st != DT_SUCCESS) break;
      {
        int rc = dt_simt_launch(dt_attn_ds_kernel, dt_attn_grid(&in[0], g.S), DT_CU_BLOCK, 0,
                                dt_cu_stream(&in[0]), (const float*)p, dp, g.S, g.T, g.q0,
                                g.causal);
        if (rc != 0) st = DT_CUDA_NAME(status)(rc, call->op);
      }
      if (st == DT_SUCCESS && g.D > 0) {
        st = dt_attn_gemm(&in[0], 0, 0, g.S, g.D, g.T, g.scale, dp, g.T, k + ok, g.k.ss, 0.0f,
                          dq + oq, g.q.ss);
        if (st == DT_SUCCESS)
          st = dt_attn_gemm(&in[0], 1, 0, g.T, g.D, g.S, g.scale, dp, g.T, q + oq, g.q.ss, 1.0f,
                            dk + ok, g.k.ss);
      }
    }
  dt_cu_scratch_free(&in[0], scratch, pn);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * Kernels */

/* sdpa (q, k, v), iargs [causal = 0, layout = 0], fargs [scale = 1 / sqrt(D)]: out = softmax(scale
 * q k^T) v, of q's layout with v's feature size. */
DT_CU_KERNEL(dt_cu_sdpa) {
  DT_CHECK(dt_cu_need_f32(call, in, 3));
  DT_CHECK(dt_cu_need_f32(call, out, 1));
  dt_attn_geom g;
  dt_attn_geom_init(call, in, &g);
  float* o = (float*)out[0].data;
  if (g.B * g.H * g.S * g.E == 0) return DT_SUCCESS;
  if (g.T == 0) return dt_attn_zero(&out[0], o, g.B * g.H * g.S * g.E); /* the host's zeros */
  const size_t smem = dt_attn_fwd_smem(&g);
  if (smem > dt_attn_smem_limit()) return dt_attn_fwd_full(call, in, o, g);
  const int rc = dt_attn_allow_smem(dt_attn_fwd_kernel, smem);
  if (rc != 0) return DT_CUDA_NAME(status)(rc, call->op);
  const int64_t items = (g.S + DT_ATTN_BQ - 1) / DT_ATTN_BQ * g.B * g.H;
  DT_CU_LAUNCH(call->op, dt_attn_fwd_kernel, dt_attn_grid(&in[0], items), DT_ATTN_NT, smem,
               dt_cu_stream(&in[0]), g, (const float*)in[0].data, (const float*)in[1].data,
               (const float*)in[2].data, o, (float*)NULL, (float*)NULL, (const float*)NULL);
  return DT_SUCCESS;
}

/* sdpa_grad (q, k, v, dO), sdpa's arguments: (dq, dk, dv). */
DT_CU_KERNEL(dt_cu_sdpa_grad) {
  DT_CHECK(dt_cu_need_f32(call, in, 4));
  DT_CHECK(dt_cu_need_f32(call, out, 3));
  dt_attn_geom g;
  dt_attn_geom_init(call, in, &g);
  float *dq = (float*)out[0].data, *dk = (float*)out[1].data, *dv = (float*)out[2].data;
  if (g.B * g.H * g.S * g.T == 0) { /* the host's zeros */
    DT_CHECK(dt_attn_zero(&out[0], dq, dt_cu_numel(&out[0])));
    DT_CHECK(dt_attn_zero(&out[1], dk, dt_cu_numel(&out[1])));
    return dt_attn_zero(&out[2], dv, dt_cu_numel(&out[2]));
  }
  const size_t lim = dt_attn_smem_limit(), s_fwd = dt_attn_fwd_smem(&g),
               s_dq = dt_attn_dq_smem(&g), s_dkv = dt_attn_dkv_smem(&g);
  if (s_fwd > lim || s_dq > lim || s_dkv > lim) return dt_attn_bwd_full(call, in, dq, dk, dv, g);
  int rc = dt_attn_allow_smem(dt_attn_fwd_kernel, s_fwd);
  if (rc == 0) rc = dt_attn_allow_smem(dt_attn_dq_kernel, s_dq);
  if (rc == 0) rc = dt_attn_allow_smem(dt_attn_dkv_kernel, s_dkv);
  if (rc != 0) return DT_CUDA_NAME(status)(rc, call->op);
  /* per query row of every (batch, head): lse, then delta */
  const int64_t rows = g.B * g.H * g.S;
  const size_t nbytes = sizeof(float) * (size_t)(2 * rows);
  void* scratch;
  DT_CHECK(dt_cu_scratch(&in[0], call->op, nbytes, &scratch));
  float *lse = (float*)scratch, *delta = lse + rows;
  const float *q = (const float*)in[0].data, *k = (const float*)in[1].data,
              *v = (const float*)in[2].data, *go = (const float*)in[3].data;
  cudaStream_t st = dt_cu_stream(&in[0]);
  const int64_t q_items = (g.S + DT_ATTN_BQ - 1) / DT_ATTN_BQ * g.B * g.H;
  const int64_t k_items = (g.T + DT_ATTN_BK - 1) / DT_ATTN_BK * g.B * g.G;
  rc = dt_simt_launch(dt_attn_fwd_kernel, dt_attn_grid(&in[0], q_items), DT_ATTN_NT, s_fwd, st, g,
                      q, k, v, (float*)NULL, lse, delta, go);
  if (rc == 0)
    rc = dt_simt_launch(dt_attn_dq_kernel, dt_attn_grid(&in[0], q_items), DT_ATTN_NT, s_dq, st, g,
                        q, k, v, go, (const float*)lse, (const float*)delta, dq);
  if (rc == 0)
    rc = dt_simt_launch(dt_attn_dkv_kernel, dt_attn_grid(&in[0], k_items), DT_ATTN_NT, s_dkv, st,
                        g, q, k, v, go, (const float*)lse, (const float*)delta, dk, dv);
  dt_cu_scratch_free(&in[0], scratch, nbytes); /* stream-ordered: after the kernels */
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, call->op);
}

/* ---------------------------------------------------------------------------------------------
 * Registration: f32 kernels (bf16/f16 tensors reach them as f32 copies). */

}  // namespace

DT_CU_FILL(attention) {
  t[DT_OP_SDPA] = {dt_cu_sdpa, 0};
  t[DT_OP_SDPA_GRAD] = {dt_cu_sdpa_grad, 0};
}

/* reduce.cu - CUDA kernels of the reductions and the row-wise ops: sum, mean, amax, amin over any
 * set of dims, prod; softmax and log_softmax over any dim; rms_norm and layer_norm over the last
 * dim and their gradients; rotary embedding. They compute what the host kernels of kernels_cpu.c,
 * kernels_nn.c and kernels_grad.c compute (see cuda_ops.h for the conventions).
 *
 * Every reduction goes through one pattern: a "group" of G threads (1, a warp of 32, or the
 * whole block of 256) owns one output (one row), its threads stride over the reduced elements
 * and combine their partial results with warp shuffles and shared memory (dt_cu_group_reduce).
 * The host picks G from the row length. Partial results always combine in the same order, so a
 * result never changes from run to run (no float atomics anywhere in this file).
 *
 * Accumulation is in float. Where the host sums in double, the float sums here stay within about
 * 1e-6 relative of it: no thread sums more than a few thousand terms serially (long reductions
 * go in passes over chunks, see dt_cu_reduce_run), and the norms centre their rows on the first
 * element before summing for the mean (so a large common offset costs no precision). Rotary
 * angles are computed in double, as on the host.
 *
 * argmax, argmin, logsumexp, var and std (reduced dims whole on the rank) take a group per
 * output too.
 *
 * dtypes: every kernel here reads and writes f32, bf16 and f16 storage itself, computing in
 * float and rounding once on the store, as the host's f32 copies do (softmax, log_softmax, the
 * norms and rotary: DT_KERNEL_ANY_DTYPE; the reductions and the norm gradients:
 * DT_KERNEL_ONE_DTYPE, so a call that mixes dtypes gets f32 copies of its half tensors).
 */
#include <climits>
#include <type_traits>

#include "ops/cuda/cuda_ops.h"

/* Everything but the fill function has internal linkage: the file is compiled twice (nvcc and the
 * SIMT emulator) into one library, and the two builds' kernels must not meet at link time. */
namespace {

/* ---------------------------------------------------------------------------------------------
 * Combining values inside a group of threads */

/* How partial results combine: a sum; the host's amax / amin (a NaN wins, so it propagates);
 * fmaxf (NaN ignored), which softmax uses for its row maximum; a product (prod). V: float, or
 * long long for the integer reductions (sums and products wrap as two's complement, as
 * PyTorch's int64 sum and prod). */
enum { DT_CU_OP_SUM = 0, DT_CU_OP_MAX = 1, DT_CU_OP_MIN = 2, DT_CU_OP_FMAX = 3, DT_CU_OP_PROD = 4 };

template <int OP, typename V>
__device__ __forceinline__ V dt_cu_comb(V a, V b) {
  if constexpr (OP == DT_CU_OP_SUM && std::is_integral<V>::value)
    return (V)((unsigned long long)a + (unsigned long long)b);
  else if constexpr (OP == DT_CU_OP_SUM) return a + b;
  else if constexpr (OP == DT_CU_OP_PROD && std::is_integral<V>::value)
    return (V)((unsigned long long)a * (unsigned long long)b);
  else if constexpr (OP == DT_CU_OP_PROD) return a * b;
  else if constexpr (OP == DT_CU_OP_MAX) return (b > a || b != b) ? b : a;
  else if constexpr (OP == DT_CU_OP_MIN) return (b < a || b != b) ? b : a;
  else return fmaxf(a, b);
}
template <int OP, typename V = float>
__device__ __forceinline__ V dt_cu_ident() {
  if constexpr (OP == DT_CU_OP_SUM) return (V)0;
  else if constexpr (OP == DT_CU_OP_PROD) return (V)1;
  else if constexpr (std::is_integral<V>::value) return OP == DT_CU_OP_MIN ? LLONG_MAX : LLONG_MIN;
  else if constexpr (OP == DT_CU_OP_MIN) return INFINITY;
  else return -INFINITY;
}

/* v combined over the G threads of a group: G = 1 (nothing to do), 32 (a warp) or 256 (the
 * block; blockDim.x must be 256). Every thread of the group gets the result. smem: 32 values of
 * shared memory; a block-wide call synchronizes the block twice, so every thread of the block
 * must make it (the callers' loops run the same trip count on every thread of a group). */
template <int OP, int G, typename V>
__device__ __forceinline__ V dt_cu_group_reduce(V v, V* smem) {
  static_assert(G == 1 || G == 32 || G == DT_CU_BLOCK, "a group is a thread, a warp or the block");
  if constexpr (G > 1) {
    for (int o = 16; o > 0; o >>= 1) v = dt_cu_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  if constexpr (G > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < nw ? smem[lane] : dt_cu_ident<OP, V>();
    for (int o = 16; o > 0; o >>= 1) v = dt_cu_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); /* smem may be reused by the next call */
  }
  return v;
}

/* The group of the calling thread and the number of groups in the grid (a kernel hands out its
 * items grid-stride: item = group, group + groups, ...; the thread's lane is threadIdx.x % G). */
template <int G>
__device__ __forceinline__ int64_t dt_cu_group_id() {
  return ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
}
template <int G>
__device__ __forceinline__ int64_t dt_cu_group_count() {
  return (int64_t)gridDim.x * (blockDim.x / G);
}

/* Launches kernel on grid blocks of DT_CU_BLOCK threads (a function, unlike DT_CU_LAUNCH, so
 * that a template kernel's name, commas and all, can be passed to it). */
template <typename K, typename... A>
static dt_status_t dt_cu_run(const char* what, K kernel, unsigned grid, cudaStream_t stream,
                             A... args) {
  DT_CU_LAUNCH(what, kernel, grid, DT_CU_BLOCK, 0, stream, args...);
  return DT_SUCCESS;
}

/* Calls f(std::integral_constant<int, G>{}) for the group size g (1, 32 or DT_CU_BLOCK). */
template <typename F>
static dt_status_t dt_cu_group_dispatch(int g, F&& f) {
  if (g == 1) return f(std::integral_constant<int, 1>{});
  if (g == 32) return f(std::integral_constant<int, 32>{});
  return f(std::integral_constant<int, DT_CU_BLOCK>{});
}

/* Group size for rows of n contiguous elements: a thread for a handful, a warp up to 1024, the
 * block beyond. */
static int dt_cu_row_group(int64_t n) { return n <= 8 ? 1 : n <= 1024 ? 32 : DT_CU_BLOCK; }

/* ---------------------------------------------------------------------------------------------
 * sum, mean, amax, amin over a set of dims (iargs [keepdim, dim...]; no dim: all of them).
 * mean divides by the GLOBAL count of reduced elements (a sharded reduced dim gives an exact
 * Partial(sum)), as the host does. amax / amin: a NaN in the reduced elements gives NaN; an
 * empty reduction gives 0 (sum, mean), -inf (amax) or +inf (amin). Integers: dt_cu_reduce_int. */

/* The input seen as kept dims and reduced dims, each merged where neighbours are contiguous and
 * listed innermost first: output o sits at input offset sum_d (o's digit d) * ks[d] (digits of o
 * in the extents kn), reduced element r at offset sum_d (r's digit d) * rs[d] from there. */
typedef struct dt_cu_rgeom {
  int nk, nr;
  int64_t kn[DT_MAX_DIMS], ks[DT_MAX_DIMS];
  int64_t rn[DT_MAX_DIMS], rs[DT_MAX_DIMS];
} dt_cu_rgeom_t;

__device__ __forceinline__ int64_t dt_cu_digits_offset(int n, const int64_t* ext,
                                                       const int64_t* stride, int64_t i) {
  if (n == 1) return i * stride[0]; /* the common case: one merged dim */
  int64_t off = 0;
  for (int d = 0; d < n; d++) {
    off += (i % ext[d]) * stride[d];
    i /= ext[d];
  }
  return off;
}

/* Item `it` of items = outputs * splits: output it / splits over its reduced elements
 * [chunk * (it % splits), + chunk) (splits == 1: all R of them). y[it] gets the result, divided
 * by div unless div is 0, rounded once to TO. TI, TO: float, __nv_bfloat16 or __half (a pass of
 * several reads the input's storage and writes f32 partial results, the last pass reads those
 * and writes the output's storage). */
template <int OP, int G, typename TI, typename TO>
__global__ void dt_cu_reduce_k(const TI* x, TO* y, dt_cu_rgeom_t g, int64_t items, int64_t R,
                               int64_t chunk, int64_t splits, float div) {
  __shared__ float smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t it = dt_cu_group_id<G>(); it < items; it += step) {
    const int64_t o = it / splits, r0 = (it % splits) * chunk;
    const int64_t r1 = r0 + chunk < R ? r0 + chunk : R;
    const TI* xo = x + dt_cu_digits_offset(g.nk, g.kn, g.ks, o);
    float acc = dt_cu_ident<OP>();
    for (int64_t r = r0 + lane; r < r1; r += G)
      acc = dt_cu_comb<OP>(acc, dt_cu_f32(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]));
    acc = dt_cu_group_reduce<OP, G>(acc, smem);
    if (lane == 0) y[it] = dt_cu_from_f32<TO>(div != 0.0f ? acc / div : acc);
  }
}

template <int OP, typename TI, typename TO>
static dt_status_t dt_cu_reduce_pass(const char* op, const dt_local_tensor_t* t, int group,
                                     const TI* x, TO* y, const dt_cu_rgeom_t& g, int64_t items,
                                     int64_t R, int64_t chunk, int64_t splits, float div) {
  return dt_cu_group_dispatch(group, [&](auto gc) {
    constexpr int G = decltype(gc)::value;
    return dt_cu_run(op, dt_cu_reduce_k<OP, G, TI, TO>, dt_cu_grid(t, items * G), dt_cu_stream(t),
                     x, y, g, items, R, chunk, splits, div);
  });
}

/* Reductions longer than DT_CU_SPLIT_MIN go in passes: each pass reduces chunks of
 * DT_CU_SPLIT_CHUNK elements (a block each) into a scratch array of partial results, which the
 * next pass reduces in turn. That keeps the device busy when there are few outputs (the sum of
 * a whole tensor) and bounds every thread's serial float sum to a few dozen terms. */
#ifndef DT_CU_SPLIT_MIN /* (a test may define smaller ones to run many passes on small data) */
#define DT_CU_SPLIT_MIN 8192
#define DT_CU_SPLIT_CHUNK 4096
#endif

/* The partial results of one pass over rows of R elements: splits per output, and their bytes. */
static int64_t dt_cu_reduce_splits(int64_t R) {
  return (R + DT_CU_SPLIT_CHUNK - 1) / DT_CU_SPLIT_CHUNK;
}
static size_t dt_cu_reduce_part_nbytes(int64_t n_out, int64_t splits) {
  return sizeof(float) * (size_t)(n_out * splits);
}

/* The group per output of a last pass: contiguous rows a group sized by their length; strided
 * reductions a thread per output (reads coalesced across neighbouring outputs) when there are
 * enough of them. */
static int dt_cu_reduce_group(const dt_cu_rgeom_t& g, int64_t n_out, int64_t R) {
  const int contiguous = g.nr == 1 && g.rs[0] == 1;
  return !contiguous && (n_out >= 4096 || R <= 8) ? 1 : dt_cu_row_group(R);
}

template <int OP, typename T>
static dt_status_t dt_cu_reduce_run(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out, dt_cu_rgeom_t g, int64_t n_out,
                                    int64_t R, float div) {
  dt_status_t st = DT_SUCCESS;
  const float* x = NULL; /* the last pass's partial results (NULL: no pass yet, read the input) */
  void* scratch[2] = {NULL, NULL};
  size_t scratch_nbytes[2] = {0, 0};
  int pass = 0;
  while (R > DT_CU_SPLIT_MIN) {
    const int64_t splits = dt_cu_reduce_splits(R);
    const int k = pass++ & 1; /* two buffers in turn: a pass reads the other one */
    dt_cu_scratch_free(in, scratch[k], scratch_nbytes[k]); /* stream-ordered: safe to reuse */
    scratch[k] = NULL;
    scratch_nbytes[k] = dt_cu_reduce_part_nbytes(n_out, splits);
    DT_CHECK_GOTO(dt_cu_scratch(in, call->op, scratch_nbytes[k], &scratch[k]), st, done);
    float* part = (float*)scratch[k];
    if (x == NULL)
      DT_CHECK_GOTO(dt_cu_reduce_pass<OP>(call->op, in, DT_CU_BLOCK, (const T*)in->data, part, g,
                                          n_out * splits, R, DT_CU_SPLIT_CHUNK, splits, 0.0f),
                    st, done);
    else
      DT_CHECK_GOTO(dt_cu_reduce_pass<OP>(call->op, in, DT_CU_BLOCK, x, part, g, n_out * splits, R,
                                          DT_CU_SPLIT_CHUNK, splits, 0.0f),
                    st, done);
    /* the partial results form an (n_out, splits) row-major array */
    g.nk = 1;
    g.kn[0] = n_out;
    g.ks[0] = splits;
    g.nr = 1;
    g.rn[0] = splits;
    g.rs[0] = 1;
    x = part;
    R = splits;
  }
  {
    const int group = dt_cu_reduce_group(g, n_out, R);
    T* y = (T*)out->data;
    if (x == NULL)
      DT_CHECK_GOTO(dt_cu_reduce_pass<OP>(call->op, in, group, (const T*)in->data, y, g, n_out, R,
                                          R, 1, div),
                    st, done);
    else
      DT_CHECK_GOTO(dt_cu_reduce_pass<OP>(call->op, in, group, x, y, g, n_out, R, R, 1, div), st,
                    done);
  }
done:
  dt_cu_scratch_free(in, scratch[0], scratch_nbytes[0]);
  dt_cu_scratch_free(in, scratch[1], scratch_nbytes[1]);
  return st;
}

/* sum (into i64, wrapping), amax and amin (the dtype kept) of i32 / i64 (kernels_cpu.c
 * dt__reduce_int): a group per output (as the float reductions' last pass) combines its R
 * reduced elements in long long from the identity (0, or the extreme that an i32 output clamps
 * to its own: an empty local shard combines exactly). Exact in any order; no scratch (a whole
 * tensor's sum is one block's). */
template <int OP, int G, typename T>
__global__ void dt_cu_reduce_int_k(const T* x, void* y, dt_cu_rgeom_t g, int64_t n_out, int64_t R,
                                   int wide_out) {
  __shared__ long long smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t o = dt_cu_group_id<G>(); o < n_out; o += step) {
    const T* xo = x + dt_cu_digits_offset(g.nk, g.kn, g.ks, o);
    long long acc = dt_cu_ident<OP, long long>();
    for (int64_t r = lane; r < R; r += G)
      acc = dt_cu_comb<OP>(acc, (long long)xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]);
    acc = dt_cu_group_reduce<OP, G>(acc, smem);
    if (lane != 0) continue;
    if (wide_out) ((long long*)y)[o] = acc;
    else ((int*)y)[o] = (int)(acc < INT_MIN ? INT_MIN : acc > INT_MAX ? INT_MAX : acc);
  }
}

template <int OP, typename T>
static dt_status_t dt_cu_reduce_int_run(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                        dt_local_tensor_t* out, const dt_cu_rgeom_t& g,
                                        int64_t n_out, int64_t R) {
  return dt_cu_group_dispatch(dt_cu_reduce_group(g, n_out, R), [&](auto gc) {
    constexpr int G = decltype(gc)::value;
    return dt_cu_run(call->op, dt_cu_reduce_int_k<OP, G, T>, dt_cu_grid(in, n_out * G),
                     dt_cu_stream(in), (const T*)in->data, out->data, g, n_out, R,
                     (int)(out->dtype == DT_I64));
  });
}

template <typename T>
static dt_status_t dt_cu_reduce_int_t(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out, int kind, const dt_cu_rgeom_t& g,
                                      int64_t n_out, int64_t R) {
  if (kind == 0) return dt_cu_reduce_int_run<DT_CU_OP_SUM, T>(call, in, out, g, n_out, R);
  if (kind == 9) return dt_cu_reduce_int_run<DT_CU_OP_PROD, T>(call, in, out, g, n_out, R);
  if (kind == 2) return dt_cu_reduce_int_run<DT_CU_OP_MAX, T>(call, in, out, g, n_out, R);
  return dt_cu_reduce_int_run<DT_CU_OP_MIN, T>(call, in, out, g, n_out, R);
}

static dt_status_t dt_cu_reduce_int(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out, int kind, const dt_cu_rgeom_t& g,
                                    int64_t n_out, int64_t R) {
  const dt_dtype_t od = kind == 0 || kind == 9 ? dt__sum_dtype(in->dtype) : in->dtype;
  if (kind == 1 || out->dtype != od)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s are not supported by its CUDA kernel "
                   "(integer sum and prod give i64, amax / amin their input's dtype, mean "
                   "refuses integers)", call->op, dt_dtype_name(in->dtype),
                   dt_dtype_name(out->dtype));
  if (in->dtype == DT_I64) return dt_cu_reduce_int_t<long long>(call, in, out, kind, g, n_out, R);
  return dt_cu_reduce_int_t<int>(call, in, out, kind, g, n_out, R);
}

static int dt_cu_is_int(dt_dtype_t d) { return d == DT_I32 || d == DT_I64; }

/* The input of a reduction over the dims in mask as its geometry (merged innermost first;
 * size-1 dims change no offset), its number of outputs and of reduced elements per output;
 * checks that out has n_out elements. */
static dt_status_t dt_cu_reduce_geom(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                     unsigned mask, const dt_local_tensor_t* out, dt_cu_rgeom_t* g,
                                     int64_t* n_out, int64_t* R) {
  memset(g, 0, sizeof *g);
  int64_t stride = 1;
  *n_out = *R = 1;
  int last = -1; /* kind of the last dim listed: 0 kept, 1 reduced */
  for (int d = in->ndim - 1; d >= 0; d--) {
    const int64_t e = in->shape[d];
    const int red = (mask >> d) & 1u;
    if (red) *R *= e;
    else *n_out *= e;
    if (e != 1) {
      int* n = red ? &g->nr : &g->nk;
      int64_t* ext = red ? g->rn : g->kn;
      int64_t* str = red ? g->rs : g->ks;
      if (last == red && str[*n - 1] * ext[*n - 1] == stride) {
        ext[*n - 1] *= e; /* contiguous with the dim just inside it */
      } else {
        ext[*n] = e;
        str[*n] = stride;
        (*n)++;
      }
      last = red;
    }
    stride *= e;
  }
  if (*n_out != 0 && *n_out != dt_cu_numel(out))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: output has %lld elements, expected %lld", call->op,
                   (long long)dt_cu_numel(out), (long long)*n_out);
  return DT_SUCCESS;
}

/* kind: 0 sum, 1 mean, 2 amax, 3 amin, 9 prod (the host's numbering; prod's one reduced dim is
 * whole on the rank, its products in float trees as the sums: a product never changes from run
 * to run). */
static dt_status_t dt_cu_reduce(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                dt_local_tensor_t* out, int kind) {
  dt_dtype_t dt = DT_F32;
  if (!dt_cu_is_int(in->dtype) || kind == 1) DT_CHECK(dt_cu_one_float(call, in, 1, 0, out, 1, &dt));
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(DT_OP_SUM + kind, call, &mask, &keep));
  int64_t count = 1; /* global number of reduced elements (mean) */
  for (int d = 0; d < in->ndim; d++)
    if (mask & (1u << d)) count *= call->in[0].shape[d];
  dt_cu_rgeom_t g;
  int64_t n_out, R;
  DT_CHECK(dt_cu_reduce_geom(call, in, mask, out, &g, &n_out, &R));
  if (n_out == 0) return DT_SUCCESS;
  if (dt_cu_is_int(in->dtype)) return dt_cu_reduce_int(call, in, out, kind, g, n_out, R);
  /* mean of nothing: NaN (0 / 0), as the host */
  const float div = kind != 1 ? 0.0f : count > 0 ? (float)count : NAN;
  return dt_cu_float_dispatch(call->op, dt, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    switch (kind) {
      case 0:
      case 1: return dt_cu_reduce_run<DT_CU_OP_SUM, T>(call, in, out, g, n_out, R, div);
      case 2: return dt_cu_reduce_run<DT_CU_OP_MAX, T>(call, in, out, g, n_out, R, div);
      case 9: return dt_cu_reduce_run<DT_CU_OP_PROD, T>(call, in, out, g, n_out, R, div);
      default: return dt_cu_reduce_run<DT_CU_OP_MIN, T>(call, in, out, g, n_out, R, div);
    }
  });
}

/* The most scratch dt_cu_reduce_run holds: two consecutive passes' partial results. */
static size_t dt_cu_reduce_nbytes(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  int kind) {
  unsigned mask;
  int keep;
  if (dt__reduce_dims(DT_OP_SUM + kind, call, &mask, &keep) != DT_SUCCESS) return 0;
  if (dt_cu_is_int(in->dtype)) return 0; /* dt_cu_reduce_int: no scratch */
  int64_t n_out = 1, R = 1;
  for (int d = 0; d < in->ndim; d++) {
    if ((mask >> d) & 1u) R *= in->shape[d];
    else n_out *= in->shape[d];
  }
  if (n_out == 0) return 0;
  size_t peak = 0, prev = 0;
  while (R > DT_CU_SPLIT_MIN) {
    const int64_t splits = dt_cu_reduce_splits(R);
    const size_t now = dt_cu_scratch_size(dt_cu_reduce_part_nbytes(n_out, splits));
    if (prev + now > peak) peak = prev + now;
    prev = now;
    R = splits;
  }
  return peak;
}
DT_CU_SCRATCH(dt_cu_sum_scratch) { return (void)out, dt_cu_reduce_nbytes(call, in, 0); }
DT_CU_SCRATCH(dt_cu_mean_scratch) { return (void)out, dt_cu_reduce_nbytes(call, in, 1); }
DT_CU_SCRATCH(dt_cu_amax_scratch) { return (void)out, dt_cu_reduce_nbytes(call, in, 2); }
DT_CU_SCRATCH(dt_cu_amin_scratch) { return (void)out, dt_cu_reduce_nbytes(call, in, 3); }
DT_CU_SCRATCH(dt_cu_prod_scratch) { return (void)out, dt_cu_reduce_nbytes(call, in, 9); }

DT_CU_KERNEL(dt_cu_sum) { return dt_cu_reduce(call, in, out, 0); }
DT_CU_KERNEL(dt_cu_mean) { return dt_cu_reduce(call, in, out, 1); }
DT_CU_KERNEL(dt_cu_amax) { return dt_cu_reduce(call, in, out, 2); }
DT_CU_KERNEL(dt_cu_amin) { return dt_cu_reduce(call, in, out, 3); }
DT_CU_KERNEL(dt_cu_prod) { return dt_cu_reduce(call, in, out, 9); }

/* ---------------------------------------------------------------------------------------------
 * argmax / argmin / logsumexp over reduced dims whole on this rank (kernels_cpu.c dt__argext and
 * dt__kernel_logsumexp): a group per output (sized as the reductions' last pass), two sweeps
 * over its reduced elements. First the extreme m (dt_cu_comb: a NaN wins). Then argmax / argmin:
 * the lowest position r holding m (x == m, or both NaN; -0.0 == 0.0), each thread its first, the
 * group their minimum; r counts the reduced elements in row-major order, so it is PyTorch's index
 * (along the dim, or into the flattened tensor). logsumexp: log(sum exp(x - s)) + s with s = m,
 * or 0 where m is infinite (a row of -inf gives -inf, a +inf inf, a NaN NaN; nothing: -inf).
 * Positions are exact in any order, and no pass needs scratch. Integers (argmax / argmin of i32,
 * i64) compare in long long. */

template <typename T>
__device__ __forceinline__ auto dt_cu_arg_val(T v) {
  if constexpr (std::is_integral<T>::value) return (long long)v;
  else return dt_cu_f32(v);
}

template <int OP, int G, typename T>
__global__ void dt_cu_argext_k(const T* x, long long* y, dt_cu_rgeom_t g, int64_t n_out,
                               int64_t R) {
  using V = typename std::conditional<std::is_integral<T>::value, long long, float>::type;
  __shared__ V smv[32];
  __shared__ long long smi[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t o = dt_cu_group_id<G>(); o < n_out; o += step) {
    const T* xo = x + dt_cu_digits_offset(g.nk, g.kn, g.ks, o);
    V m = dt_cu_ident<OP, V>();
    for (int64_t r = lane; r < R; r += G)
      m = dt_cu_comb<OP>(m, dt_cu_arg_val(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]));
    m = dt_cu_group_reduce<OP, G>(m, smv);
    long long bi = LLONG_MAX;
    for (int64_t r = lane; r < R; r += G) {
      const V v = dt_cu_arg_val(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]);
      bool hit = v == m;
      if constexpr (!std::is_integral<V>::value) hit = hit || (v != v && m != m);
      if (hit) {
        bi = r;
        break;
      }
    }
    bi = dt_cu_group_reduce<DT_CU_OP_MIN, G>(bi, smi);
    if (lane == 0) y[o] = bi;
  }
}

template <int G, typename T>
__global__ void dt_cu_logsumexp_k(const T* x, T* y, dt_cu_rgeom_t g, int64_t n_out, int64_t R) {
  __shared__ float smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t o = dt_cu_group_id<G>(); o < n_out; o += step) {
    const T* xo = x + dt_cu_digits_offset(g.nk, g.kn, g.ks, o);
    float m = dt_cu_ident<DT_CU_OP_MAX>();
    for (int64_t r = lane; r < R; r += G)
      m = dt_cu_comb<DT_CU_OP_MAX>(m, dt_cu_f32(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]));
    m = dt_cu_group_reduce<DT_CU_OP_MAX, G>(m, smem);
    const float sh = isinf(m) ? 0.0f : m;
    float s = 0.0f;
    for (int64_t r = lane; r < R; r += G)
      s += expf(dt_cu_f32(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]) - sh);
    s = dt_cu_group_reduce<DT_CU_OP_SUM, G>(s, smem);
    if (lane == 0) y[o] = dt_cu_from_f32<T>(logf(s) + sh);
  }
}

/* var / std (sd) of each output's R reduced elements (kernels_cpu.c dt__var_std): centred on the
 * first element c (a large common offset costs no precision, as the norms'), the mean m of x - c,
 * then sum ((x - c) - m)^2 / div with div = max(0, R - correction) (NaN for R == 0), rounded once
 * (std: its square root). Both sums in double, as the host's: a spread of 1e20 squares past
 * f32's range although its std is finite. A NaN propagates, an inf gives NaN, as on the host. */
template <int G, typename T>
__global__ void dt_cu_var_k(const T* x, T* y, dt_cu_rgeom_t g, int64_t n_out, int64_t R,
                            double div, int sd) {
  __shared__ double smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t o = dt_cu_group_id<G>(); o < n_out; o += step) {
    const T* xo = x + dt_cu_digits_offset(g.nk, g.kn, g.ks, o);
    const double c = R > 0 ? (double)dt_cu_f32(xo[0]) : 0.0;
    double s = 0.0;
    for (int64_t r = lane; r < R; r += G)
      s += (double)dt_cu_f32(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]) - c;
    s = dt_cu_group_reduce<DT_CU_OP_SUM, G>(s, smem);
    const double m = s / (double)R;
    double q = 0.0;
    for (int64_t r = lane; r < R; r += G) {
      const double d = ((double)dt_cu_f32(xo[dt_cu_digits_offset(g.nr, g.rn, g.rs, r)]) - c) - m;
      q += d * d;
    }
    q = dt_cu_group_reduce<DT_CU_OP_SUM, G>(q, smem);
    const double v = q / div;
    if (lane == 0) y[o] = dt_cu_from_f32<T>((float)(sd ? sqrt(v) : v));
  }
}

/* kind: 4 argmax, 5 argmin, 6 logsumexp, 7 var, 8 std (the host's numbering, op DT_OP_SUM +
 * kind). */
static dt_status_t dt_cu_reduce_whole(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out, int kind) {
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(DT_OP_SUM + kind, call, &mask, &keep));
  double corr = 0.0;
  if (kind >= 7) DT_CHECK(dt__var_correction(DT_OP_SUM + kind, call, &corr));
  if (kind >= 6) {
    if (out->dtype != in->dtype || dt_cu_is_int(in->dtype)) /* (logsumexp: dispatch casts ints) */
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s are not supported by its CUDA "
                     "kernel (one float dtype)", call->op, dt_dtype_name(in->dtype),
                     dt_dtype_name(out->dtype));
  } else if (out->dtype != DT_I64 || !(dt_cu_is_int(in->dtype) || in->dtype == DT_F32 ||
                                       in->dtype == DT_BF16 || in->dtype == DT_F16)) {
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s are not supported by its CUDA kernel "
                   "(a float or integer input, i64 out)", call->op, dt_dtype_name(in->dtype),
                   dt_dtype_name(out->dtype));
  }
  dt_cu_rgeom_t g;
  int64_t n_out, R;
  DT_CHECK(dt_cu_reduce_geom(call, in, mask, out, &g, &n_out, &R));
  if (n_out == 0) return DT_SUCCESS;
  if (R == 0 && kind <= 5) /* (the rules refuse it first) */
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: an empty reduction has no position", call->op);
  const int group = dt_cu_reduce_group(g, n_out, R);
  auto launch = [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    return dt_cu_group_dispatch(group, [&](auto gc) -> dt_status_t {
      constexpr int G = decltype(gc)::value;
      const unsigned grid = dt_cu_grid(in, n_out * G);
      const cudaStream_t st = dt_cu_stream(in);
      if (kind == 4)
        return dt_cu_run(call->op, dt_cu_argext_k<DT_CU_OP_MAX, G, T>, grid, st,
                         (const T*)in->data, (long long*)out->data, g, n_out, R);
      if (kind == 5)
        return dt_cu_run(call->op, dt_cu_argext_k<DT_CU_OP_MIN, G, T>, grid, st,
                         (const T*)in->data, (long long*)out->data, g, n_out, R);
      if constexpr (!std::is_integral<T>::value) {
        if (kind >= 7) {
          const double div = R == 0 ? (double)NAN : fmax(0.0, (double)R - corr);
          return dt_cu_run(call->op, dt_cu_var_k<G, T>, grid, st, (const T*)in->data,
                           (T*)out->data, g, n_out, R, div, (int)(kind == 8));
        }
        return dt_cu_run(call->op, dt_cu_logsumexp_k<G, T>, grid, st, (const T*)in->data,
                         (T*)out->data, g, n_out, R);
      }
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: integer input (cast it to a float dtype)", call->op);
    });
  };
  if (in->dtype == DT_I64) return launch((long long)0);
  if (in->dtype == DT_I32) return launch((int)0);
  return dt_cu_float_dispatch(call->op, in->dtype, launch);
}

DT_CU_KERNEL(dt_cu_argmax) { return dt_cu_reduce_whole(call, in, out, 4); }
DT_CU_KERNEL(dt_cu_argmin) { return dt_cu_reduce_whole(call, in, out, 5); }
DT_CU_KERNEL(dt_cu_logsumexp) { return dt_cu_reduce_whole(call, in, out, 6); }
DT_CU_KERNEL(dt_cu_var) { return dt_cu_reduce_whole(call, in, out, 7); }
DT_CU_KERNEL(dt_cu_std) { return dt_cu_reduce_whole(call, in, out, 8); }

/* ---------------------------------------------------------------------------------------------
 * softmax / log_softmax along iargs[0] (whole on this rank). As the host: m = the row's fmaxf
 * (NaN ignored), s = sum exp(x - m), y = (x - m) - log s or exp(x - m) / s; a row with a NaN,
 * or of -inf only, gives NaN. */

/* Row q of outer * inner rows: elements (q / inner) * len * inner + q % inner + k * inner. */
template <typename T, int G, bool LOG>
__global__ void dt_cu_softmax_k(const T* x, T* y, int64_t rows, int64_t len, int64_t inner) {
  __shared__ float smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t q = dt_cu_group_id<G>(); q < rows; q += step) {
    const int64_t base = (q / inner) * len * inner + q % inner;
    const T* xr = x + base;
    T* yr = y + base;
    float m = -INFINITY;
    for (int64_t k = lane; k < len; k += G) m = fmaxf(m, dt_cu_f32(xr[k * inner]));
    m = dt_cu_group_reduce<DT_CU_OP_FMAX, G>(m, smem);
    float s = 0.0f;
    for (int64_t k = lane; k < len; k += G) s += expf(dt_cu_f32(xr[k * inner]) - m);
    s = dt_cu_group_reduce<DT_CU_OP_SUM, G>(s, smem);
    const float ls = logf(s);
    for (int64_t k = lane; k < len; k += G) {
      const float d = dt_cu_f32(xr[k * inner]) - m;
      yr[k * inner] = dt_cu_from_f32<T>(LOG ? d - ls : expf(d) / s);
    }
  }
}

template <bool LOG>
static dt_status_t dt_cu_softmax(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  const int nd = in->ndim;
  int dim;
  DT_CHECK(dt__softmax_dim(call, &dim));
  if (out->dtype != in->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: output dtype %s differs from the input's %s", call->op,
                   dt_dtype_name(out->dtype), dt_dtype_name(in->dtype));
  int64_t outer = 1, len = dim < 0 ? 1 : in->shape[dim], inner = 1; /* 0-d: one row of one */
  for (int d = 0; d < dim; d++) outer *= in->shape[d];
  for (int d = dim + 1; d < nd && dim >= 0; d++) inner *= in->shape[d];
  const int64_t rows = outer * inner;
  if (rows == 0 || len == 0) return DT_SUCCESS;
  /* inner > 1: the elements of a row are inner apart; a thread per row reads coalesced across
   * neighbouring rows, when there are enough rows and they are not long */
  int group = dt_cu_row_group(len);
  if (inner > 1 && len <= 1024 && (rows >= 4096 || len <= 8)) group = 1;
  return dt_cu_float_dispatch(call->op, in->dtype, [&](auto tag) {
    using T = decltype(tag);
    return dt_cu_group_dispatch(group, [&](auto gc) {
      constexpr int G = decltype(gc)::value;
      return dt_cu_run(call->op, dt_cu_softmax_k<T, G, LOG>, dt_cu_grid(in, rows * G),
                       dt_cu_stream(in), (const T*)in->data, (T*)out->data, rows, len, inner);
    });
  });
}

DT_CU_KERNEL(dt_cu_softmax_fwd) { return dt_cu_softmax<false>(call, in, out); }
DT_CU_KERNEL(dt_cu_log_softmax) { return dt_cu_softmax<true>(call, in, out); }

/* ---------------------------------------------------------------------------------------------
 * rms_norm (x, w) / layer_norm (x, w, b) over the last dim (fargs [eps], defaults 1e-6 / 1e-5 as
 * the host's; the schema marks eps optional without a default):
 *   y = (x - mean) / sqrt(var + eps) * w (+ b), mean = 0 and var = mean(x^2) for rms_norm. */

/* A row's statistics: the mean as x0 + d, x0 the row's first element (0 for rms_norm) and d the
 * mean of x - x0, so that x - mean = (x - x0) - d keeps its precision in float when a common
 * offset is much larger than the spread (the host subtracts a double mean); and
 * inv = 1 / sqrt(var + eps). */
typedef struct dt_cu_rowstat {
  float x0, d, inv;
} dt_cu_rowstat_t;

__device__ __forceinline__ float dt_cu_centred(const dt_cu_rowstat_t& rs, float x) {
  return (x - rs.x0) - rs.d;
}

/* The statistics of row xr (every thread of the group gets them): the mean's sum, then the
 * variance over the centred values in a second pass (as the host computes it). */
template <typename T, int G, bool LAYER>
__device__ __forceinline__ dt_cu_rowstat_t dt_cu_row_stats(const T* xr, int64_t D, float eps,
                                                           int64_t lane, float* smem) {
  dt_cu_rowstat_t rs = {0.0f, 0.0f, 0.0f};
  if constexpr (LAYER) {
    rs.x0 = dt_cu_f32(xr[0]);
    float s = 0.0f;
    for (int64_t j = lane; j < D; j += G) s += dt_cu_f32(xr[j]) - rs.x0;
    rs.d = dt_cu_group_reduce<DT_CU_OP_SUM, G>(s, smem) / (float)D;
  }
  float v = 0.0f;
  for (int64_t j = lane; j < D; j += G) {
    const float c = dt_cu_centred(rs, dt_cu_f32(xr[j]));
    v += c * c;
  }
  v = dt_cu_group_reduce<DT_CU_OP_SUM, G>(v, smem);
  rs.inv = 1.0f / sqrtf(v / (float)D + eps);
  return rs;
}

template <typename T, int G, bool LAYER>
__global__ void dt_cu_norm_k(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t D,
                             float eps) {
  __shared__ float smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t r = dt_cu_group_id<G>(); r < rows; r += step) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    const dt_cu_rowstat_t rs = dt_cu_row_stats<T, G, LAYER>(xr, D, eps, lane, smem);
    for (int64_t j = lane; j < D; j += G) {
      float v = dt_cu_centred(rs, dt_cu_f32(xr[j])) * rs.inv * dt_cu_f32(w[j]);
      if constexpr (LAYER) v += dt_cu_f32(b[j]);
      yr[j] = dt_cu_from_f32<T>(v);
    }
  }
}

/* eps as the host kernels read it */
static float dt_cu_norm_eps(const dt_op_call_t* call, int layer) {
  return (float)dt__op_farg(layer ? DT_OP_LAYER_NORM : DT_OP_RMS_NORM, call, 0); /* = the grads' */
}

/* The checks of dt__norm_rules that the kernel relies on (the dtypes included: the kernel reads
 * every tensor as the input's storage type). */
static dt_status_t dt_cu_norm_check(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    int n_params, const dt_local_tensor_t* out) {
  if (in[0].ndim < 1) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input must have a dim", call->op);
  const int64_t D = in[0].shape[in[0].ndim - 1];
  for (int t = 1; t <= n_params; t++)
    if (in[t].ndim != 1 || in[t].shape[0] != D || in[t].dtype != in[0].dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: parameter %d must be a %s vector of %lld", call->op,
                     t, dt_dtype_name(in[0].dtype), (long long)D);
  if (out->dtype != in[0].dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: output dtype %s differs from the input's %s", call->op,
                   dt_dtype_name(out->dtype), dt_dtype_name(in[0].dtype));
  return DT_SUCCESS;
}

template <bool LAYER>
static dt_status_t dt_cu_norm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  DT_CHECK(dt_cu_norm_check(call, in, LAYER ? 2 : 1, out));
  const int64_t D = in[0].shape[in[0].ndim - 1];
  const int64_t rows = D ? dt_cu_numel(&in[0]) / D : 0;
  if (rows == 0) return DT_SUCCESS;
  const float eps = dt_cu_norm_eps(call, LAYER);
  return dt_cu_float_dispatch(call->op, in[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    return dt_cu_group_dispatch(dt_cu_row_group(D), [&](auto gc) {
      constexpr int G = decltype(gc)::value;
      return dt_cu_run(call->op, dt_cu_norm_k<T, G, LAYER>, dt_cu_grid(in, rows * G),
                       dt_cu_stream(in), (const T*)in[0].data, (const T*)in[1].data,
                       LAYER ? (const T*)in[2].data : (const T*)NULL, (T*)out->data, rows, D, eps);
    });
  });
}

DT_CU_KERNEL(dt_cu_rms_norm) { return dt_cu_norm<false>(call, in, out); }
DT_CU_KERNEL(dt_cu_layer_norm) { return dt_cu_norm<true>(call, in, out); }

/* ---------------------------------------------------------------------------------------------
 * rms_norm_grad / layer_norm_grad (g, x, w) -> (gx, gw), over the last dim, every tensor in one
 * float dtype (computing in f32, each output rounded once):
 *   xhat = (x - mean) inv, dxhat = g w,
 *   gx = inv (dxhat - mean(dxhat) - xhat mean(dxhat xhat))   (mean(dxhat) for layer_norm only),
 *   gw = sum over this rank's rows of g xhat.
 * gw is a column reduction done without atomics, so that it is the same on every run: the row
 * kernel saves each row's statistics, blocks of columns sum chunks of rows into a scratch array
 * of partial sums, and a last kernel adds the chunks up in order. */

template <typename T, int G, bool LAYER>
__global__ void dt_cu_norm_grad_k(const T* g, const T* x, const T* w, T* gx,
                                  dt_cu_rowstat_t* stats, int64_t rows, int64_t D, float eps) {
  __shared__ float smem[32];
  const int64_t lane = threadIdx.x % G, step = dt_cu_group_count<G>();
  for (int64_t r = dt_cu_group_id<G>(); r < rows; r += step) {
    const T *xr = x + r * D, *gr = g + r * D;
    T* gxr = gx + r * D;
    const dt_cu_rowstat_t rs = dt_cu_row_stats<T, G, LAYER>(xr, D, eps, lane, smem);
    float m1 = 0.0f, m2 = 0.0f;
    for (int64_t j = lane; j < D; j += G) {
      const float dxh = dt_cu_f32(gr[j]) * dt_cu_f32(w[j]);
      if constexpr (LAYER) m1 += dxh;
      m2 += dxh * (dt_cu_centred(rs, dt_cu_f32(xr[j])) * rs.inv);
    }
    if constexpr (LAYER) m1 = dt_cu_group_reduce<DT_CU_OP_SUM, G>(m1, smem) / (float)D;
    m2 = dt_cu_group_reduce<DT_CU_OP_SUM, G>(m2, smem) / (float)D;
    for (int64_t j = lane; j < D; j += G) {
      const float xh = dt_cu_centred(rs, dt_cu_f32(xr[j])) * rs.inv;
      gxr[j] = dt_cu_from_f32<T>(rs.inv * (dt_cu_f32(gr[j]) * dt_cu_f32(w[j]) - m1 - xh * m2));
    }
    if (lane == 0) stats[r] = rs;
  }
}

/* Partial gw: part[c * D + j] = sum over rows [c * chunk, + chunk) of g xhat at column j, rounded
 * to TO (f32 partial sums, or gw itself when there is one chunk); a thread per column, a block
 * per (chunk, 256 columns). */
template <typename T, typename TO>
__global__ void dt_cu_norm_wgrad_k(const T* g, const T* x, const dt_cu_rowstat_t* stats,
                                   TO* part, int64_t rows, int64_t D, int64_t chunk,
                                   int64_t nchunks) {
  const int64_t colblocks = (D + blockDim.x - 1) / blockDim.x, items = colblocks * nchunks;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t c = it / colblocks, j = (it % colblocks) * blockDim.x + threadIdx.x;
    if (j >= D) continue;
    const int64_t r0 = c * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; r++)
      acc += dt_cu_f32(g[r * D + j]) *
             (dt_cu_centred(stats[r], dt_cu_f32(x[r * D + j])) * stats[r].inv);
    part[c * D + j] = dt_cu_from_f32<TO>(acc);
  }
}

/* gw[j] = sum over c < nchunks of part[c * D + j], in order of c. */
template <typename T>
__global__ void dt_cu_sum_chunks_k(const float* part, T* gw, int64_t D, int64_t nchunks) {
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D;
       j += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int64_t c = 0; c < nchunks; c++) acc += part[c * D + j];
    gw[j] = dt_cu_from_f32<T>(acc);
  }
}

/* The norm gradients' chunks of rows (at least 128 rows, at most 1024 chunks; no rows: one empty
 * chunk, gw = 0) and their scratch: per-row statistics, and per-chunk partial sums of gw. */
static void dt_cu_norm_grad_plan(int64_t rows, int64_t D, int64_t* chunk, int64_t* nchunks,
                                 size_t* stats_nbytes, size_t* part_nbytes) {
  *chunk = (rows + 1023) / 1024;
  if (*chunk < 128) *chunk = 128;
  *nchunks = rows ? (rows + *chunk - 1) / *chunk : 1;
  *stats_nbytes = sizeof(dt_cu_rowstat_t) * (size_t)rows;
  *part_nbytes = *nchunks > 1 ? sizeof(float) * (size_t)(*nchunks * D) : 0;
}
DT_CU_SCRATCH(dt_cu_norm_grad_scratch) {
  (void)call, (void)out;
  const dt_local_tensor_t* x = &in[1];
  if (x->ndim < 1 || x->shape[x->ndim - 1] == 0) return 0;
  const int64_t D = x->shape[x->ndim - 1], rows = dt_cu_numel(x) / D;
  int64_t chunk, nchunks;
  size_t stats, part;
  dt_cu_norm_grad_plan(rows, D, &chunk, &nchunks, &stats, &part);
  return dt_cu_scratch_size(stats) + (nchunks > 1 ? dt_cu_scratch_size(part) : 0);
}

template <typename T, bool LAYER>
static dt_status_t dt_cu_norm_grad_run(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                       dt_local_tensor_t* out, int64_t rows, int64_t D) {
  const dt_local_tensor_t* x = &in[1];
  const float eps = dt_cu_norm_eps(call, LAYER);
  const T *g = (const T*)in[0].data, *xv = (const T*)x->data, *w = (const T*)in[2].data;
  T *gx = (T*)out[0].data, *gw = (T*)out[1].data;
  const cudaStream_t stream = dt_cu_stream(x);
  int64_t chunk, nchunks;
  size_t stats_nbytes, part_nbytes;
  dt_cu_norm_grad_plan(rows, D, &chunk, &nchunks, &stats_nbytes, &part_nbytes);
  dt_status_t st = DT_SUCCESS;
  void *stats = NULL, *part = NULL;
  DT_CHECK_GOTO(dt_cu_scratch(x, call->op, stats_nbytes, &stats), st, done);
  if (nchunks > 1) DT_CHECK_GOTO(dt_cu_scratch(x, call->op, part_nbytes, &part), st, done);
  if (rows > 0)
    DT_CHECK_GOTO(dt_cu_group_dispatch(dt_cu_row_group(D),
                                       [&](auto gc) {
                                         constexpr int G = decltype(gc)::value;
                                         return dt_cu_run(call->op, dt_cu_norm_grad_k<T, G, LAYER>,
                                                          dt_cu_grid(x, rows * G), stream, g, xv, w,
                                                          gx, (dt_cu_rowstat_t*)stats, rows, D,
                                                          eps);
                                       }),
                  st, done);
  {
    const int64_t colblocks = (D + DT_CU_BLOCK - 1) / DT_CU_BLOCK;
    const unsigned grid = dt_cu_grid(x, colblocks * nchunks * DT_CU_BLOCK);
    const dt_cu_rowstat_t* rs = (const dt_cu_rowstat_t*)stats;
    if (nchunks > 1)
      DT_CHECK_GOTO(dt_cu_run(call->op, dt_cu_norm_wgrad_k<T, float>, grid, stream, g, xv, rs,
                              (float*)part, rows, D, chunk, nchunks),
                    st, done);
    else
      DT_CHECK_GOTO(dt_cu_run(call->op, dt_cu_norm_wgrad_k<T, T>, grid, stream, g, xv, rs, gw,
                              rows, D, chunk, nchunks),
                    st, done);
  }
  if (nchunks > 1)
    DT_CHECK_GOTO(dt_cu_run(call->op, dt_cu_sum_chunks_k<T>, dt_cu_grid(x, D), stream,
                            (const float*)part, gw, D, nchunks),
                  st, done);
done:
  dt_cu_scratch_free(x, part, part_nbytes);
  dt_cu_scratch_free(x, stats, stats_nbytes);
  return st;
}

template <bool LAYER>
static dt_status_t dt_cu_norm_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                   dt_local_tensor_t* out) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 3, 0, out, 2, &dt));
  const dt_local_tensor_t* x = &in[1];
  if (x->ndim < 1 || in[0].ndim != x->ndim || dt_cu_numel(&in[0]) != dt_cu_numel(x) ||
      in[2].ndim != 1 || in[2].shape[0] != x->shape[x->ndim - 1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: expects g and x of one shape and w of the last dim",
                   call->op);
  const int64_t D = x->shape[x->ndim - 1], rows = D ? dt_cu_numel(x) / D : 0;
  if (D == 0) return DT_SUCCESS;
  return dt_cu_float_dispatch(call->op, dt, [&](auto tag) {
    return dt_cu_norm_grad_run<decltype(tag), LAYER>(call, in, out, rows, D);
  });
}

DT_CU_KERNEL(dt_cu_rms_norm_grad) { return dt_cu_norm_grad<false>(call, in, out); }
DT_CU_KERNEL(dt_cu_layer_norm_grad) { return dt_cu_norm_grad<true>(call, in, out); }

/* ---------------------------------------------------------------------------------------------
 * rotary embedding (iargs [seq_dim=1, inverse=0, cp=0], fargs [theta=10000]) on interleaved
 * pairs (x[2i], x[2i+1]) of the last dim D: the pair turns by the angle pos * theta^(-2i/D) (the
 * opposite way with inverse), pos the GLOBAL index along seq_dim (the shard's offset plus the
 * local index; with cp > 0 its real position in the load-balanced order), as the host computes
 * it. */

/* cos and (dir) sin of every (local position p < L, pair i < H2), computed in double as the
 * host does: positions times frequencies reach 1e5 radians and more, far beyond what a float
 * angle resolves. */
__global__ void dt_cu_rotary_table_k(float* tab, int64_t L, int64_t H2, int64_t D, int64_t pos0,
                                     int64_t seq, int64_t cp, double theta, double dir) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < L * H2;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = k / H2, i = k % H2;
    const double ang = (double)dt__cp_position(pos0 + p, seq, cp) *
                       pow(theta, -2.0 * (double)i / (double)D);
    tab[2 * k] = (float)cos(ang);
    tab[2 * k + 1] = (float)(dir * sin(ang));
  }
}

/* Pair k of the tensor (row k / H2, pair k % H2); the row's position along seq_dim is
 * (row / inner) % L, inner the rows per step of seq_dim. */
template <typename T>
__global__ void dt_cu_rotary_k(const T* x, T* y, const float* tab, int64_t pairs, int64_t H2,
                               int64_t inner, int64_t L) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < pairs;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = k / H2, i = k % H2, t = ((row / inner) % L) * H2 + i;
    const float c = tab[2 * t], s = tab[2 * t + 1];
    const float x0 = dt_cu_f32(x[2 * k]), x1 = dt_cu_f32(x[2 * k + 1]);
    y[2 * k] = dt_cu_from_f32<T>(x0 * c - x1 * s);
    y[2 * k + 1] = dt_cu_from_f32<T>(x0 * s + x1 * c);
  }
}

/* rotary's table of (cos, sin) per position and pair, and the scratch it takes (x: its input). */
static size_t dt_cu_rotary_tab_nbytes(int64_t L, int64_t H2) {
  return sizeof(float) * 2 * (size_t)(L * H2);
}
DT_CU_SCRATCH(dt_cu_rotary_scratch) {
  (void)out;
  const dt_local_tensor_t* x = &in[0];
  const int nd = x->ndim;
  const int64_t seq_dim = dt__op_iarg(DT_OP_ROTARY, call, 0);
  const int64_t sd = seq_dim < 0 ? seq_dim + nd : seq_dim;
  if (nd < 2 || sd < 0 || sd >= nd - 1 || dt_cu_numel(x) / 2 == 0) return 0;
  return dt_cu_rotary_tab_nbytes(x->shape[sd], x->shape[nd - 1] / 2);
}

DT_CU_KERNEL(dt_cu_rotary) {
  const dt_local_tensor_t* x = &in[0];
  const int nd = x->ndim;
  const int64_t seq_dim = dt__op_iarg(DT_OP_ROTARY, call, 0);
  const int64_t sd = seq_dim < 0 ? seq_dim + nd : seq_dim;
  if (nd < 2 || sd < 0 || sd >= nd - 1 || x->shape[nd - 1] % 2 != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "rotary: x (.., S, .., D) with an even D and iargs [seq_dim] (not the last)");
  if (out->dtype != x->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "rotary: output dtype %s differs from the input's %s",
                   dt_dtype_name(out->dtype), dt_dtype_name(x->dtype));
  const double theta = dt__op_farg(DT_OP_ROTARY, call, 0);
  const double dir = dt__op_iarg(DT_OP_ROTARY, call, 1) ? -1.0 : 1.0; /* inverse rotation */
  const int64_t D = x->shape[nd - 1], H2 = D / 2, L = x->shape[sd];
  const int64_t pairs = dt_cu_numel(x) / 2;
  int64_t inner = 1;
  for (int d = (int)sd + 1; d < nd - 1; d++) inner *= x->shape[d];
  if (pairs == 0) return DT_SUCCESS;
  return dt_cu_float_dispatch("rotary", x->dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t tab_nbytes = dt_cu_rotary_tab_nbytes(L, H2);
    void* tab = NULL;
    DT_CHECK(dt_cu_scratch(x, "rotary", tab_nbytes, &tab));
    const cudaStream_t stream = dt_cu_stream(x);
    dt_status_t st = dt_cu_run("rotary", dt_cu_rotary_table_k, dt_cu_grid(x, L * H2), stream,
                               (float*)tab, L, H2, D, x->offset[sd], call->in[0].shape[sd],
                               dt__op_iarg(DT_OP_ROTARY, call, 2), theta, dir);
    if (st == DT_SUCCESS)
      st = dt_cu_run("rotary", dt_cu_rotary_k<T>, dt_cu_grid(x, pairs), stream, (const T*)x->data,
                     (T*)out->data, (const float*)tab, pairs, H2, inner, L);
    dt_cu_scratch_free(x, tab, tab_nbytes);
    return st;
  });
}

/* ---------------------------------------------------------------------------------------------
 * registration */

}  // namespace

DT_CU_FILL(reduce) {
  t[DT_OP_SUM] = {dt_cu_sum, DT_KERNEL_ONE_DTYPE, dt_cu_sum_scratch};
  t[DT_OP_MEAN] = {dt_cu_mean, DT_KERNEL_ONE_DTYPE, dt_cu_mean_scratch};
  t[DT_OP_AMAX] = {dt_cu_amax, DT_KERNEL_ONE_DTYPE, dt_cu_amax_scratch};
  t[DT_OP_AMIN] = {dt_cu_amin, DT_KERNEL_ONE_DTYPE, dt_cu_amin_scratch};
  t[DT_OP_ARGMAX] = {dt_cu_argmax, DT_KERNEL_ONE_DTYPE, NULL};
  t[DT_OP_ARGMIN] = {dt_cu_argmin, DT_KERNEL_ONE_DTYPE, NULL};
  t[DT_OP_LOGSUMEXP] = {dt_cu_logsumexp, DT_KERNEL_ONE_DTYPE, NULL};
  t[DT_OP_VAR] = {dt_cu_var, DT_KERNEL_ONE_DTYPE, NULL};
  t[DT_OP_STD] = {dt_cu_std, DT_KERNEL_ONE_DTYPE, NULL};
  t[DT_OP_PROD] = {dt_cu_prod, DT_KERNEL_ONE_DTYPE, dt_cu_prod_scratch};
  t[DT_OP_SOFTMAX] = {dt_cu_softmax_fwd, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LOG_SOFTMAX] = {dt_cu_log_softmax, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_RMS_NORM] = {dt_cu_rms_norm, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LAYER_NORM] = {dt_cu_layer_norm, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_RMS_NORM_GRAD] = {dt_cu_rms_norm_grad, DT_KERNEL_ONE_DTYPE, dt_cu_norm_grad_scratch};
  t[DT_OP_LAYER_NORM_GRAD] = {dt_cu_layer_norm_grad, DT_KERNEL_ONE_DTYPE, dt_cu_norm_grad_scratch};
  t[DT_OP_ROTARY] = {dt_cu_rotary, DT_KERNEL_ANY_DTYPE, dt_cu_rotary_scratch};
}

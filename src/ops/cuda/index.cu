/* index.cu - CUDA kernels of the shape, indexing and routing ops (see cuda_ops.h for the
 * conventions): the view family (view, reshape, flatten, unflatten, squeeze, unsqueeze),
 * permute / transpose / t, slice / narrow, cat, stack, expand, tril / triu, embedding and embedding_grad,
 * gather_dim, gather, index_select, scatter_add, index_add, topk and moe_route; and the scan
 * cumsum.
 *
 * The host kernels (src/ops/kernels_shape.c, kernels_cpu.c, kernels_nn.c, kernels_grad.c,
 * kernels_moe.c) define every result; these kernels match them bit for bit:
 * - Byte movers (the view family, permute, slice, cat; also embedding, gather_dim, gather and
 *   topk's values) copy raw storage, so every dtype moves exactly. One strided box copy serves
 *   all of them: it merges dims that stay contiguous on both sides and moves the widest unit
 *   (1 to 16 bytes) that the sizes and addresses allow.
 * - The scatter-adds (embedding_grad, index_add, scatter_add) are deterministic and add in the
 *   host's order: one thread sums each output element, starting from the host's value (0 or x)
 *   and adding its contributions in increasing index order, so the f32 sums are the host's
 *   exactly. No float atomics (embedding_grad and index_add group the indices by row with a
 *   counting sort; scatter_add walks each index fiber in order). embedding_grad and index_add
 *   read and write bf16/f16 storage themselves (an f32 sum, each output rounded once: the host's
 *   result on its f32 copies); scatter_add, whose additions land in the output one by one, takes
 *   f32 (f32 copies of half storage).
 * - topk sorts (value, index) pairs packed into distinct 64-bit keys, whose order is the host
 *   comparator's (NaN largest, ties to the lower index), so the indices match too.
 * - Data-checking ops scan their indices on the device (dt_cu_bad_index_k) and report the first
 *   bad one in index order, as the host does, with one device-to-host copy and stream
 *   synchronization at the end of the op (the only host waits in this file). Until then the
 *   kernels treat a bad index as one outside the local shard, so nothing is written out of
 *   bounds; the outputs of a rejected call are unspecified, as on the host.
 */
#include <string.h>

#include <type_traits>

#include "ops/cuda/cuda_ops.h"

/* Everything but the fill function has internal linkage: the file is compiled twice (nvcc and the
 * SIMT emulator) into one library, and the two builds' kernels must not meet at link time. */
namespace {

/* ---- helpers of this file ---------------------------------------------------------------- */

/* The index tensors of the ops are i32 or i64 (the rules check it); the host reads any other
 * dtype as i32, so does this. */
__device__ __forceinline__ int64_t dt_cu_index(const void* p, int is64, int64_t i) {
  return is64 ? ((const int64_t*)p)[i] : (int64_t)((const int32_t*)p)[i];
}

/* Grid-stride loop bounds of the calling thread. */
#define DT_CU_FOR(i, n)                                                                    \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
       i += (int64_t)gridDim.x * blockDim.x)

/* Scratch memory freed when it leaves scope (stream-ordered, see dt_cu_scratch_free). */
struct dt_cu_buf {
  const dt_local_tensor_t* t;
  size_t nbytes;
  void* p;
  explicit dt_cu_buf(const dt_local_tensor_t* owner) : t(owner), nbytes(0), p(nullptr) {}
  dt_cu_buf(const dt_cu_buf&) = delete;
  dt_cu_buf& operator=(const dt_cu_buf&) = delete;
  ~dt_cu_buf() { dt_cu_scratch_free(t, p, nbytes); }
  dt_status_t alloc(const char* op, size_t n) {
    nbytes = n;
    return dt_cu_scratch(t, op, n, &p);
  }
};

/* nbytes from device memory to the host, after everything issued so far on t's stream: the
 * result of a data check. The host waits for the stream here (unavoidable: the op's status
 * depends on the data). */
static dt_status_t dt_cu_d2h(const dt_local_tensor_t* t, const char* what, void* dst,
                             const void* src, size_t nbytes) {
#ifdef DT_SIMT_EMULATE
  (void)t;
  (void)what;
  memcpy(dst, src, nbytes); /* emulated launches have finished; device memory is host memory */
  return DT_SUCCESS;
#else
  cudaStream_t s = dt_cu_stream(t);
  cudaError_t rc = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(s);
  return DT_CUDA_NAME(status)((int)rc, what);
#endif
}

__global__ void dt_cu_fill_u64_k(unsigned long long* p, int64_t n, unsigned long long v) {
  DT_CU_FOR(i, n) p[i] = v;
}

/* *first = the least i < n whose index is outside [lo, hi) (left alone when none is). */
__global__ void dt_cu_bad_index_k(const void* ix, int is64, int64_t n, int64_t lo, int64_t hi,
                                  unsigned long long* first) {
  DT_CU_FOR(i, n) {
    int64_t v = dt_cu_index(ix, is64, i);
    if (v < lo || v >= hi) atomicMin(first, (unsigned long long)i);
  }
}

/* The scratch of a data check of ix's indices: a flag word, where there are indices. */
static size_t dt_cu_index_check_nbytes(const dt_local_tensor_t* ix) {
  return dt_cu_numel(ix) ? sizeof(unsigned long long) : 0;
}

/* A data check of the n indices of ix against [0, hi): start() launches the scan, finish()
 * copies its result back (waiting for the stream) and gives the position and value of the
 * first bad index (*pos = -1 when all are good). */
struct dt_cu_index_check {
  dt_cu_buf flag;
  const dt_local_tensor_t* ix;
  int64_t n;
  explicit dt_cu_index_check(const dt_local_tensor_t* t) : flag(t), ix(t), n(0) {}
  dt_status_t start(const char* op, const dt_local_tensor_t* idx, int64_t hi) {
    ix = idx;
    n = dt_cu_numel(idx);
    if (n == 0) return DT_SUCCESS;
    DT_CHECK(flag.alloc(op, dt_cu_index_check_nbytes(idx)));
    unsigned long long* f = (unsigned long long*)flag.p;
    cudaStream_t s = dt_cu_stream(idx);
    DT_CU_LAUNCH(op, dt_cu_fill_u64_k, 1, 1, 0, s, f, (int64_t)1, (unsigned long long)n);
    DT_CU_LAUNCH(op, dt_cu_bad_index_k, dt_cu_grid(idx, n), DT_CU_BLOCK, 0, s, idx->data,
                 (int)(idx->dtype == DT_I64), n, (int64_t)0, hi, f);
    return DT_SUCCESS;
  }
  dt_status_t finish(const char* op, int64_t* pos, int64_t* val) {
    *pos = -1;
    *val = 0;
    if (n == 0) return DT_SUCCESS;
    unsigned long long first = 0;
    DT_CHECK(dt_cu_d2h(ix, op, &first, flag.p, sizeof first));
    if (first >= (unsigned long long)n) return DT_SUCCESS;
    *pos = (int64_t)first;
    if (ix->dtype == DT_I64) {
      DT_CHECK(dt_cu_d2h(ix, op, val, (const int64_t*)ix->data + first, sizeof(int64_t)));
    } else {
      int32_t v32 = 0;
      DT_CHECK(dt_cu_d2h(ix, op, &v32, (const int32_t*)ix->data + first, sizeof v32));
      *val = v32;
    }
    return DT_SUCCESS;
  }
};

/* Calls f(U{}) with U an unsigned type of `unit` bytes (1, 2, 4, 8 or 16): the storage unit of
 * the byte movers. */
typedef uint4 dt_cu_u128;
template <typename F>
static dt_status_t dt_cu_unit_dispatch(size_t unit, F&& f) {
  switch (unit) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f((unsigned long long)0);
    case 16: return f(dt_cu_u128{});
    default: return DT_FAIL(DT_ERR_INTERNAL, "index.cu: no copy unit of %zu bytes", unit);
  }
}

/* The widest unit (<= cap bytes) that divides every value of v[0 .. n). */
static size_t dt_cu_unit_of(const uint64_t* v, int n, size_t cap) {
  size_t u = cap;
  for (int i = 0; i < n; i++)
    while (u > 1 && v[i] % u != 0) u >>= 1;
  return u;
}

/* ---- strided box copy: what every byte mover reduces to ---------------------------------- */

#define DT_CU_BOX_DIMS (DT_MAX_DIMS + 1)

/* A box of `nd` dims (outermost first), steps in units of the copy. */
struct dt_cu_box {
  int nd;
  int64_t shape[DT_CU_BOX_DIMS];
  int64_t dstep[DT_CU_BOX_DIMS];
  int64_t sstep[DT_CU_BOX_DIMS];
};

template <typename U>
__global__ void dt_cu_box_copy_k(U* dst, const U* src, dt_cu_box b, int64_t n) {
  DT_CU_FOR(k, n) {
    int64_t r = k, so = 0, d_off = 0;
    for (int d = b.nd - 1; d >= 0; d--) {
      int64_t c = r % b.shape[d];
      r /= b.shape[d];
      so += c * b.sstep[d];
      d_off += c * b.dstep[d];
    }
    dst[d_off] = src[so];
  }
}

/* dst[sum_d i_d dstep[d]] = src[sum_d i_d sstep[d]] for every index of the box `shape` (nd
 * dims, steps in elements of `item` bytes). Dims of extent 1 go, dims contiguous on both sides
 * merge, and the innermost run moves in the widest unit its size and both addresses allow. */
static dt_status_t dt_cu_copy_box(const dt_local_tensor_t* t, const char* what, void* dst,
                                  const void* src, int nd, const int64_t* shape,
                                  const int64_t* dstep, const int64_t* sstep, size_t item) {
  int64_t sh[DT_CU_BOX_DIMS], ds[DT_CU_BOX_DIMS], ss[DT_CU_BOX_DIMS];
  int m = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 0) return DT_SUCCESS;
    if (shape[d] == 1) continue;
    sh[m] = shape[d];
    ds[m] = dstep[d] * (int64_t)item;
    ss[m] = sstep[d] * (int64_t)item;
    m++;
  }
  sh[m] = (int64_t)item; /* the bytes of an element */
  ds[m] = ss[m] = 1;
  m++;
  /* merge from the inside: the outer dim folds into the inner one when it steps over it whole */
  dt_cu_box b;
  int64_t rs[DT_CU_BOX_DIMS], rd[DT_CU_BOX_DIMS], rss[DT_CU_BOX_DIMS]; /* innermost first */
  int k = 0;
  rs[0] = sh[m - 1];
  rd[0] = ds[m - 1];
  rss[0] = ss[m - 1];
  for (int d = m - 2; d >= 0; d--) {
    if (ds[d] == rd[k] * rs[k] && ss[d] == rss[k] * rs[k]) {
      rs[k] *= sh[d];
    } else {
      k++;
      rs[k] = sh[d];
      rd[k] = ds[d];
      rss[k] = ss[d];
    }
  }
  /* the innermost dim steps 1 byte on both sides: pick the unit */
  uint64_t v[2 * DT_CU_BOX_DIMS + 3];
  int nv = 0;
  v[nv++] = (uint64_t)rs[0];
  v[nv++] = (uint64_t)(uintptr_t)dst;
  v[nv++] = (uint64_t)(uintptr_t)src;
  for (int i = 1; i <= k; i++) {
    v[nv++] = (uint64_t)rd[i];
    v[nv++] = (uint64_t)rss[i];
  }
  size_t unit = dt_cu_unit_of(v, nv, 16);
  rs[0] /= (int64_t)unit;
  int lo = rs[0] == 1 ? 1 : 0; /* an innermost extent of one unit needs no dim */
  b.nd = 0;
  int64_t n = 1;
  for (int i = k; i >= lo; i--) {
    b.shape[b.nd] = rs[i];
    b.dstep[b.nd] = i == 0 ? 1 : rd[i] / (int64_t)unit;
    b.sstep[b.nd] = i == 0 ? 1 : rss[i] / (int64_t)unit;
    n *= rs[i];
    b.nd++;
  }
  return dt_cu_unit_dispatch(unit, [&](auto tag) -> dt_status_t {
    using U = decltype(tag);
    DT_CU_LAUNCH(what, dt_cu_box_copy_k<U>, dt_cu_grid(t, n), DT_CU_BLOCK, 0, dt_cu_stream(t),
                 (U*)dst, (const U*)src, b, n);
    return DT_SUCCESS;
  });
}

/* Row-major strides (in elements) of shape. */
static void dt_cu_strides(int nd, const int64_t* shape, int64_t* st) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
}

/* ---- view family, permute, slice, cat ---------------------------------------------------- */

/* view, reshape, flatten, unflatten, squeeze, unsqueeze: the local shard keeps its elements in
 * order, so the kernel (run when the op could not alias its input) is a copy. */
DT_CU_KERNEL(dt_cu_view) {
  int64_t n = dt_cu_numel(out);
  if (n != dt_cu_numel(&in[0]))
    return DT_FAIL(DT_ERR_INTERNAL, "%s: local shard of %lld elements for an output of %lld",
                   call->op, (long long)dt_cu_numel(&in[0]), (long long)n);
  int64_t one = 1;
  return dt_cu_copy_box(&in[0], call->op, out->data, in[0].data, 1, &n, &one, &one,
                        dt__itemsize(in[0].dtype));
}

/* permute / transpose / t: out dim i takes in dim perm[i]. */
static dt_status_t dt_cu_permute_copy(int op, const dt_op_call_t* call,
                                      const dt_local_tensor_t* in, dt_local_tensor_t* out) {
  int perm[DT_MAX_DIMS], nd = in->ndim;
  DT_CHECK(dt__view_perm(op, call, perm));
  int64_t ist[DT_MAX_DIMS], ost[DT_MAX_DIMS], sstep[DT_MAX_DIMS];
  dt_cu_strides(nd, in->shape, ist);
  dt_cu_strides(nd, out->shape, ost);
  for (int i = 0; i < nd; i++) sstep[i] = ist[perm[i]];
  return dt_cu_copy_box(in, call->op, out->data, in->data, nd, out->shape, ost, sstep,
                        dt__itemsize(in->dtype));
}
DT_CU_KERNEL(dt_cu_permute) { return dt_cu_permute_copy(DT_OP_PERMUTE, call, in, out); }
DT_CU_KERNEL(dt_cu_transpose) { return dt_cu_permute_copy(DT_OP_TRANSPOSE, call, in, out); }
DT_CU_KERNEL(dt_cu_t) { return dt_cu_permute_copy(DT_OP_T, call, in, out); }

/* slice / narrow: elements start, start + step, ... (len of them) along dim, which is whole. */
static dt_status_t dt_cu_cut(int op, const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  int dim;
  int64_t start, step, len;
  DT_CHECK(dt__slice_args(op, call, &dim, &start, &step, &len));
  const dt_local_tensor_t* x = &in[0];
  size_t item = dt__itemsize(x->dtype);
  int64_t outer = 1, inner = 1, L = x->shape[dim];
  for (int d = 0; d < dim; d++) outer *= x->shape[d];
  for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
  int64_t shape[3] = {outer, len, inner};
  int64_t dstep[3] = {len * inner, inner, 1};
  int64_t sstep[3] = {L * inner, step * inner, 1};
  const char* src = (const char*)x->data + (size_t)(start * inner) * item;
  return dt_cu_copy_box(x, call->op, out->data, src, 3, shape, dstep, sstep, item);
}
DT_CU_KERNEL(dt_cu_slice) { return dt_cu_cut(DT_OP_SLICE, call, in, out); }
DT_CU_KERNEL(dt_cu_narrow) { return dt_cu_cut(DT_OP_NARROW, call, in, out); }

/* cat: input t fills its range of the output's dim; one box copy per input. */
static dt_status_t dt_cu_join(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out, int stack) {
  int dim;
  int64_t outer, inner, blk[DT_OP_MAX_INPUTS];
  dt__cat_geom(stack, call, in, out, &dim, &outer, &inner, blk);
  size_t item = dt__itemsize(out->dtype);
  int64_t ostride = out->shape[dim] * inner, at = 0;
  for (int t = 0; t < call->n_inputs; t++) {
    int64_t shape[2] = {outer, blk[t]}, dstep[2] = {ostride, 1}, sstep[2] = {blk[t], 1};
    DT_CHECK(dt_cu_copy_box(out, call->op, (char*)out->data + (size_t)at * item, in[t].data, 2,
                            shape, dstep, sstep, item));
    at += blk[t];
  }
  return DT_SUCCESS;
}
DT_CU_KERNEL(dt_cu_cat) { return dt_cu_join(call, in, out, 0); }
DT_CU_KERNEL(dt_cu_stack) { return dt_cu_join(call, in, out, 1); }

/* ---- embedding, gather_dim, gather: masked lookups (raw storage) ------------------------- */

/* out row i (du units) = weight row ix[i] - v0 when it is one of the vl local rows, else 0. */
template <typename U>
__global__ void dt_cu_embedding_k(U* out, const U* w, const void* ix, int is64, int64_t n,
                                  int64_t du, int64_t v0, int64_t vl) {
  DT_CU_FOR(k, n * du) {
    int64_t i = k / du, c = k - i * du;
    int64_t row = dt_cu_index(ix, is64, i) - v0;
    out[k] = (row >= 0 && row < vl) ? w[row * du + c] : U{};
  }
}

/* embedding: rows of the local weight shard (global rows offset[0] .. + shape[0], the columns
 * it holds); an index outside the local vocabulary shard gives a zero row (masked lookup ->
 * Partial(sum)); any index outside [0, V) fails the call. */
DT_CU_KERNEL(dt_cu_embedding) {
  const dt_local_tensor_t *w = &in[0], *ix = &in[1];
  DT_CHECK(dt_cu_need_float(call, w));
  int64_t V = call->in[0].shape[0], v0 = w->offset[0], vl = w->shape[0], D = w->shape[1];
  int64_t n = dt_cu_numel(ix);
  size_t item = dt__itemsize(w->dtype);
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, V));
  uint64_t v[3] = {(uint64_t)D * item, (uint64_t)(uintptr_t)w->data,
                   (uint64_t)(uintptr_t)out->data};
  size_t unit = D > 0 ? dt_cu_unit_of(v, 3, 16) : item;
  int64_t du = D * (int64_t)item / (int64_t)unit;
  DT_CHECK(dt_cu_unit_dispatch(unit, [&](auto tag) -> dt_status_t {
    using U = decltype(tag);
    DT_CU_LAUNCH(call->op, dt_cu_embedding_k<U>, dt_cu_grid(w, n * du), DT_CU_BLOCK, 0,
                 dt_cu_stream(w), (U*)out->data, (const U*)w->data, ix->data,
                 (int)(ix->dtype == DT_I64), n, du, v0, vl);
    return DT_SUCCESS;
  }));
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  if (pos >= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "embedding: index %lld out of range [0, %lld)",
                   (long long)bad, (long long)V);
  return DT_SUCCESS;
}

/* out[i] = x[i, ix[i] - c0] when that column is local, else 0. */
template <typename U>
__global__ void dt_cu_gather_dim_k(U* out, const U* x, const void* ix, int is64, int64_t rows,
                                   int64_t c0, int64_t cl) {
  DT_CU_FOR(i, rows) {
    int64_t j = dt_cu_index(ix, is64, i) - c0;
    out[i] = (j >= 0 && j < cl) ? x[i * cl + j] : U{};
  }
}

/* gather_dim: out[i] = x[i, idx[i]] for the local rows; a class outside the local column range
 * gives 0 (masked gather -> Partial(sum) when x is class-sharded). */
DT_CU_KERNEL(dt_cu_gather_dim) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  DT_CHECK(dt_cu_need_float(call, x));
  int64_t C = call->in[0].shape[1], c0 = x->offset[1], cl = x->shape[1], rows = x->shape[0];
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, C));
  DT_CHECK(dt_cu_unit_dispatch(dt__itemsize(x->dtype), [&](auto tag) -> dt_status_t {
    using U = decltype(tag);
    DT_CU_LAUNCH(call->op, dt_cu_gather_dim_k<U>, dt_cu_grid(x, rows), DT_CU_BLOCK, 0,
                 dt_cu_stream(x), (U*)out->data, (const U*)x->data, ix->data,
                 (int)(ix->dtype == DT_I64), rows, c0, cl);
    return DT_SUCCESS;
  }));
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  if (pos >= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "gather_dim: index %lld out of range [0, %lld)",
                   (long long)bad, (long long)C);
  return DT_SUCCESS;
}

/* Geometry of gather / scatter_add: idx's local shape, x's strides, the dim and the local range
 * [x0, x0 + xl) of x along it. */
struct dt_cu_gather_geom {
  int nd, dim;
  int64_t ishape[DT_MAX_DIMS];
  int64_t xs[DT_MAX_DIMS];
  int64_t x0, xl;
};

static void dt_cu_gather_geom_of(const dt_op_call_t* call, const dt_local_tensor_t* x,
                                 const dt_local_tensor_t* ix, dt_cu_gather_geom* g) {
  g->nd = x->ndim;
  g->dim = (int)(call->iargs[0] < 0 ? call->iargs[0] + g->nd : call->iargs[0]);
  memcpy(g->ishape, ix->shape, sizeof g->ishape);
  dt_cu_strides(g->nd, x->shape, g->xs);
  g->x0 = x->offset[g->dim];
  g->xl = x->shape[g->dim];
}

/* out[i] = x at idx element i's coordinates with dim replaced by idx[i] - x0 (0 when not local). */
template <typename U>
__global__ void dt_cu_gather_k(U* out, const U* x, const void* ix, int is64, int64_t n,
                               dt_cu_gather_geom g) {
  DT_CU_FOR(i, n) {
    int64_t r = i, base = 0;
    for (int d = g.nd - 1; d >= 0; d--) {
      int64_t c = r % g.ishape[d];
      r /= g.ishape[d];
      if (d != g.dim) base += c * g.xs[d];
    }
    int64_t t = dt_cu_index(ix, is64, i) - g.x0;
    out[i] = (t >= 0 && t < g.xl) ? x[base + t * g.xs[g.dim]] : U{};
  }
}

/* gather along dim; indices are global along dim, local coordinates elsewhere. */
DT_CU_KERNEL(dt_cu_gather) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  DT_CHECK(dt_cu_need_float(call, x));
  dt_cu_gather_geom g;
  dt_cu_gather_geom_of(call, x, ix, &g);
  int64_t size = call->in[0].shape[g.dim], n = dt_cu_numel(ix);
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, size));
  DT_CHECK(dt_cu_unit_dispatch(dt__itemsize(x->dtype), [&](auto tag) -> dt_status_t {
    using U = decltype(tag);
    DT_CU_LAUNCH(call->op, dt_cu_gather_k<U>, dt_cu_grid(x, n), DT_CU_BLOCK, 0, dt_cu_stream(x),
                 (U*)out->data, (const U*)x->data, ix->data, (int)(ix->dtype == DT_I64), n, g);
    return DT_SUCCESS;
  }));
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  if (pos >= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: index %lld out of range [0, %lld)", call->op,
                   (long long)bad, (long long)size);
  return DT_SUCCESS;
}

/* ---- scatter-adds: deterministic, in the host's order ------------------------------------ */

/* scatter_add after out = x: one thread per fiber of idx (its coordinates other than dim), which
 * walks the fiber in order. The fibers' targets are disjoint (a target has the fiber's
 * coordinates), so every output element gets its additions in increasing idx order, as on the
 * host. */
__global__ void dt_cu_scatter_add_k(float* out, const float* src, const void* ix, int is64,
                                    int64_t fibers, dt_cu_gather_geom g) {
  int64_t J = g.ishape[g.dim], is_dim = 1;
  for (int d = g.nd - 1; d > g.dim; d--) is_dim *= g.ishape[d];
  DT_CU_FOR(f, fibers) {
    int64_t r = f, ibase = 0, xbase = 0, ist = 1;
    for (int d = g.nd - 1; d >= 0; d--) {
      if (d != g.dim) {
        int64_t c = r % g.ishape[d];
        r /= g.ishape[d];
        ibase += c * ist;
        xbase += c * g.xs[d];
      }
      ist *= g.ishape[d];
    }
    for (int64_t j = 0; j < J; j++) {
      int64_t i = ibase + j * is_dim;
      int64_t t = dt_cu_index(ix, is64, i) - g.x0;
      if (t >= 0 && t < g.xl) out[xbase + t * g.xs[g.dim]] += src[i];
    }
  }
}

/* scatter_add: x with x[..idx[..i..]..] += src[..i..] along dim, for the targets in the local
 * range of x along dim. */
DT_CU_KERNEL(dt_cu_scatter_add) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  DT_CHECK(dt_cu_need_f32(call, &in[0], 1));
  DT_CHECK(dt_cu_need_f32(call, &in[2], 1));
  dt_cu_gather_geom g;
  dt_cu_gather_geom_of(call, x, ix, &g);
  int64_t size = call->in[0].shape[g.dim], nx = dt_cu_numel(x), n = dt_cu_numel(ix);
  int64_t J = ix->shape[g.dim], fibers = J > 0 ? n / J : 0;
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, size));
  int64_t one = 1;
  DT_CHECK(dt_cu_copy_box(x, call->op, out->data, x->data, 1, &nx, &one, &one, sizeof(float)));
  DT_CU_LAUNCH(call->op, dt_cu_scatter_add_k, dt_cu_grid(x, fibers), DT_CU_BLOCK, 0,
               dt_cu_stream(x), (float*)out->data, (const float*)in[2].data, ix->data,
               (int)(ix->dtype == DT_I64), fibers, g);
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  if (pos >= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: index %lld out of range [0, %lld)", call->op,
                   (long long)bad, (long long)size);
  return DT_SUCCESS;
}

/* Row scatter-add (embedding_grad, index_add): out (rows, D) = base (or 0) plus, for every i in
 * increasing order whose ix[i] - r0 is a local row r, src row i added to row r (f32 sums of f32,
 * bf16 or f16 storage, each output rounded once). A counting
 * sort groups the i by row: count, scan, fill (atomic, so unordered within a row); then one
 * block per row ranks its list (indices are distinct: rank = how many are smaller, O(c^2) for
 * a row of c entries) and sums the rows in increasing i, one thread per column. */
__global__ void dt_cu_rows_count_k(const void* ix, int is64, int64_t n, int64_t r0, int64_t rows,
                                   unsigned long long* cnt) {
  DT_CU_FOR(i, n) {
    int64_t r = dt_cu_index(ix, is64, i) - r0;
    if (r >= 0 && r < rows) atomicAdd(&cnt[r], 1ull);
  }
}

/* One block of DT_CU_BLOCK threads: start[r] = sum of cnt[q] for q < r (r <= rows), and cnt
 * becomes start (the fill cursors). Thread t scans a contiguous range of rows. */
__global__ void dt_cu_rows_scan_k(unsigned long long* cnt, int64_t* start, int64_t rows) {
  __shared__ int64_t part[DT_CU_BLOCK];
  const int tid = threadIdx.x;
  int64_t per = (rows + DT_CU_BLOCK - 1) / DT_CU_BLOCK, lo = tid * per;
  int64_t hi = lo + per < rows ? lo + per : rows, s = 0;
  for (int64_t r = lo; r < hi; r++) s += (int64_t)cnt[r];
  part[tid] = s;
  __syncthreads();
  if (tid == 0) {
    int64_t acc = 0;
    for (int q = 0; q < DT_CU_BLOCK; q++) {
      int64_t c = part[q];
      part[q] = acc;
      acc += c;
    }
    start[rows] = acc;
  }
  __syncthreads();
  int64_t acc = part[tid];
  for (int64_t r = lo; r < hi; r++) {
    int64_t c = (int64_t)cnt[r];
    start[r] = acc;
    cnt[r] = (unsigned long long)acc;
    acc += c;
  }
}

__global__ void dt_cu_rows_fill_k(const void* ix, int is64, int64_t n, int64_t r0, int64_t rows,
                                  unsigned long long* cur, int64_t* list) {
  DT_CU_FOR(i, n) {
    int64_t r = dt_cu_index(ix, is64, i) - r0;
    if (r >= 0 && r < rows) list[atomicAdd(&cur[r], 1ull)] = i;
  }
}

template <typename T>
__global__ void dt_cu_rows_sum_k(const int64_t* start, const int64_t* list, int64_t* sorted,
                                 const T* src, const T* base, T* out, int64_t rows, int64_t D) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t s0 = start[r], c = start[r + 1] - s0;
    for (int64_t p = threadIdx.x; p < c; p += blockDim.x) {
      int64_t v = list[s0 + p], rank = 0;
      for (int64_t q = 0; q < c; q++) rank += list[s0 + q] < v;
      sorted[s0 + rank] = v;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = base ? dt_cu_f32(base[r * D + d]) : 0.0f;
      for (int64_t q = 0; q < c; q++) acc += dt_cu_f32(src[sorted[s0 + q] * D + d]);
      out[r * D + d] = dt_cu_from_f32<T>(acc);
    }
  }
}

/* dt_cu_rows_add's scratch for rows rows and n indices: counts, starts, and the list of
 * (row, index) pairs, then sorted. */
static void dt_cu_rows_add_sizes(int64_t rows, int64_t n, size_t nb[3]) {
  nb[0] = sizeof(unsigned long long) * (size_t)rows;
  nb[1] = sizeof(int64_t) * (size_t)(rows + 1);
  nb[2] = sizeof(int64_t) * (size_t)(2 * n);
}
/* embedding_grad's and index_add's scratch (the check's flag and dt_cu_rows_add's), rows the
 * local rows of output 0. */
DT_CU_SCRATCH(dt_cu_rows_add_scratch) {
  (void)call;
  size_t nb[3];
  dt_cu_rows_add_sizes(out[0].shape[0], dt_cu_numel(&in[1]), nb);
  return dt_cu_index_check_nbytes(&in[1]) + dt_cu_scratch_size(nb[0]) +
         dt_cu_scratch_size(nb[1]) + dt_cu_scratch_size(nb[2]);
}
/* The scratch of the kernels whose only scratch is the check of input 1's indices. */
DT_CU_SCRATCH(dt_cu_index_check_scratch) {
  return (void)call, (void)out, dt_cu_index_check_nbytes(&in[1]);
}

template <typename T>
static dt_status_t dt_cu_rows_add(const dt_op_call_t* call, const dt_local_tensor_t* ix,
                                  const T* src, const T* base, T* out, int64_t rows, int64_t D,
                                  int64_t r0) {
  const char* op = call->op;
  int64_t n = dt_cu_numel(ix);
  int is64 = ix->dtype == DT_I64;
  cudaStream_t s = dt_cu_stream(ix);
  dt_cu_buf cnt(ix), start(ix), list(ix);
  size_t nb[3];
  dt_cu_rows_add_sizes(rows, n, nb);
  DT_CHECK(cnt.alloc(op, nb[0]));
  DT_CHECK(start.alloc(op, nb[1]));
  DT_CHECK(list.alloc(op, nb[2])); /* the list, then sorted */
  unsigned long long* c = (unsigned long long*)cnt.p;
  int64_t *st = (int64_t*)start.p, *l = (int64_t*)list.p;
  DT_CU_LAUNCH(op, dt_cu_fill_u64_k, dt_cu_grid(ix, rows), DT_CU_BLOCK, 0, s, c, rows, 0ull);
  DT_CU_LAUNCH(op, dt_cu_rows_count_k, dt_cu_grid(ix, n), DT_CU_BLOCK, 0, s, ix->data, is64, n,
               r0, rows, c);
  DT_CU_LAUNCH(op, dt_cu_rows_scan_k, 1, DT_CU_BLOCK, 0, s, c, st, rows);
  DT_CU_LAUNCH(op, dt_cu_rows_fill_k, dt_cu_grid(ix, n), DT_CU_BLOCK, 0, s, ix->data, is64, n, r0,
               rows, c, l);
  DT_CU_LAUNCH(op, dt_cu_rows_sum_k<T>, dt_cu_grid(ix, rows, 1), DT_CU_BLOCK, 0, s,
               (const int64_t*)st, (const int64_t*)l, l + n, src, base, out, rows, D);
  return DT_SUCCESS;
}

/* embedding_grad (g (.., D), indices (..)) iargs [V]: the rows of the local vocabulary shard
 * (out rows offset[0] .. + shape[0]) accumulate the g rows of their tokens; other rows are 0. */
DT_CU_KERNEL(dt_cu_embedding_grad) {
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 2, 1u << 1, out, 1, &dt)); /* g and out; in[1]: indices */
  const dt_local_tensor_t *g = &in[0], *ix = &in[1];
  int64_t V = call->iargs[0], v0 = out->offset[0], vl = out->shape[0], D = out->shape[1];
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, V));
  DT_CHECK(dt_cu_float_dispatch(call->op, dt, [&](auto tag) {
    using T = decltype(tag);
    return dt_cu_rows_add<T>(call, ix, (const T*)g->data, (const T*)NULL, (T*)out->data, vl, D,
                             v0);
  }));
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  if (pos >= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "embedding_grad: index %lld out of range [0, %lld)",
                   (long long)bad, (long long)V);
  return DT_SUCCESS;
}

/* index_add (x (N, D), idx (T), src (T, D)): out = x; out[idx[i] - local row offset] += src[i]
 * for the indices in the local rows. */
DT_CU_KERNEL(dt_cu_index_add) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1], *src = &in[2];
  dt_dtype_t dt;
  DT_CHECK(dt_cu_one_float(call, in, 3, 1u << 1, out, 1, &dt)); /* x, src, out; in[1]: indices */
  int64_t N = call->in[0].shape[0], x0 = x->offset[0], xl = x->shape[0], D = x->shape[1];
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, N));
  DT_CHECK(dt_cu_float_dispatch(call->op, dt, [&](auto tag) {
    using T = decltype(tag);
    return dt_cu_rows_add<T>(call, ix, (const T*)src->data, (const T*)x->data, (T*)out->data, xl,
                             D, x0);
  }));
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  if (pos >= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_add: index %lld out of range [0, %lld)",
                   (long long)bad, (long long)N);
  return DT_SUCCESS;
}

/* ---- topk -------------------------------------------------------------------------------- */

/* A 64-bit key whose descending order is the host's order of (value, index) pairs: the high
 * word orders the values (NaN first, -0 equal to +0; ascending order for smallest), the low word
 * puts the lower index first among equal values. 0 is below every key (the padding). */
__device__ __forceinline__ unsigned long long dt_cu_topk_key(float v, int64_t j, int largest) {
  unsigned u;
  if (v != v) {
    u = largest ? 0xFFFFFFFFu : 0u; /* NaN counts as largest: first, or last when ascending */
  } else {
    u = __float_as_uint(v == 0.0f ? 0.0f : v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* monotone in v */
    if (!largest) u = ~u;
  }
  return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)j);
}

/* One block per row (p, q) of L elements along dim (stride inner): keys into buf (P2 >= L, a
 * power of two, padded with 0), a bitonic sort into descending order, the first k written out.
 * buf is the block's dynamic shared memory, or its slice of gbuf for long rows. */
template <typename T>
__global__ void dt_cu_topk_k(const T* x, T* ov, int64_t* oi, int64_t outer, int64_t L,
                             int64_t inner, int64_t k, int largest, int64_t P2,
                             unsigned long long* gbuf) {
  DT_SIMT_DYN_SHARED(unsigned long long, sbuf);
  unsigned long long* buf = gbuf ? gbuf + (int64_t)blockIdx.x * P2 : sbuf;
  for (int64_t row = blockIdx.x; row < outer * inner; row += gridDim.x) {
    int64_t p = row / inner, q = row - p * inner;
    const T* xr = x + p * L * inner + q;
    for (int64_t j = threadIdx.x; j < P2; j += blockDim.x)
      buf[j] = j < L ? dt_cu_topk_key(dt_cu_f32(xr[j * inner]), j, largest) : 0ull;
    __syncthreads();
    for (int64_t w = 2; w <= P2; w <<= 1)
      for (int64_t h = w >> 1; h > 0; h >>= 1) {
        for (int64_t i = threadIdx.x; i < P2; i += blockDim.x) {
          int64_t o = i ^ h;
          if (o > i) {
            unsigned long long a = buf[i], b = buf[o];
            /* blocks with (i & w) == 0 sort descending, the others ascending */
            if (((i & w) == 0) ? (a < b) : (a > b)) {
              buf[i] = b;
              buf[o] = a;
            }
          }
        }
        __syncthreads();
      }
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      int64_t src = (int64_t)(0xFFFFFFFFu - (unsigned)(buf[j] & 0xFFFFFFFFull));
      ov[(p * k + j) * inner + q] = xr[src * inner];
      oi[(p * k + j) * inner + q] = src;
    }
    __syncthreads(); /* buf is refilled for the next row */
  }
}

/* Rows whose keys fit in this many bytes sort in shared memory; longer ones in device scratch
 * (at most DT_CU_TOPK_GLOBAL_MAX bytes of it: fewer blocks, each taking more rows). */
#define DT_CU_TOPK_SHARED_MAX (32 << 10)
#define DT_CU_TOPK_GLOBAL_MAX ((size_t)64 << 20)

/* topk's launch over rows rows of L keys on a device of sms SMs: keys padded to P2 (a power of
 * 2), threads per block, blocks, and where the keys sort: shared memory (*smem bytes) or device
 * scratch (*scratch bytes). */
static void dt_cu_topk_plan(int64_t rows, int64_t L, int sms, int64_t* P2, int* threads,
                            unsigned* grid, size_t* smem, size_t* scratch) {
  *P2 = 1;
  while (*P2 < L) *P2 <<= 1;
  *threads = (int)(*P2 / 2 < 32 ? 32 : *P2 / 2 > DT_CU_BLOCK ? DT_CU_BLOCK : *P2 / 2);
  const size_t kbytes = sizeof(unsigned long long) * (size_t)*P2;
  *grid = dt_cu_grid_sms(rows, sms, 1);
  *smem = *scratch = 0;
  if (kbytes <= DT_CU_TOPK_SHARED_MAX) {
    *smem = kbytes;
  } else {
    size_t cap = DT_CU_TOPK_GLOBAL_MAX / kbytes;
    if (*grid > cap) *grid = cap < 1 ? 1 : (unsigned)cap;
    *scratch = kbytes * *grid;
  }
}
/* topk's rows (outer x inner) and keys per row (L) of x; 0 rows when it computes nothing. */
static void dt_cu_topk_shape(const dt_op_call_t* call, const dt_local_tensor_t* x, int64_t* rows,
                             int64_t* outer, int64_t* inner, int64_t* L) {
  int64_t k;
  int dim, largest;
  *rows = *outer = *inner = 1;
  *L = 0;
  if (dt__topk_args(call, &k, &dim, &largest) != DT_SUCCESS) {
    *rows = 0;
    return;
  }
  *L = x->shape[dim];
  for (int d = 0; d < dim; d++) *outer *= x->shape[d];
  for (int d = dim + 1; d < x->ndim; d++) *inner *= x->shape[d];
  *rows = k == 0 ? 0 : *outer * *inner;
}
DT_CU_SCRATCH(dt_cu_topk_scratch) {
  (void)out;
  int64_t rows, outer, inner, L, P2;
  dt_cu_topk_shape(call, &in[0], &rows, &outer, &inner, &L);
  if (rows == 0 || L > 0x7FFFFFFF) return 0;
  int threads;
  unsigned grid;
  size_t smem, scratch;
  dt_cu_topk_plan(rows, L, dt_cu_sms_of(&in[0]), &P2, &threads, &grid, &smem, &scratch);
  return scratch ? dt_cu_scratch_size(scratch) : 0;
}

/* topk: values and i64 indices along dim (whole on this rank), sorted; NaN counts as largest,
 * ties go to the lower index. */
DT_CU_KERNEL(dt_cu_topk) {
  int64_t k;
  int dim, largest;
  const dt_local_tensor_t* x = &in[0];
  DT_CHECK(dt_cu_need_float(call, x));
  DT_CHECK(dt__topk_args(call, &k, &dim, &largest));
  int64_t rows, outer, inner, L;
  dt_cu_topk_shape(call, x, &rows, &outer, &inner, &L);
  if (rows == 0) return DT_SUCCESS;
  if (L > 0x7FFFFFFF)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "topk: %lld elements along dim (at most 2^31 - 1)",
                   (long long)L);
  int64_t P2;
  int threads;
  unsigned grid;
  size_t smem, scratch_nbytes;
  dt_cu_topk_plan(rows, L, DT_CUDA_NAME(sm_count)(x->backend), &P2, &threads, &grid, &smem,
                  &scratch_nbytes);
  dt_cu_buf scratch(x);
  if (scratch_nbytes) DT_CHECK(scratch.alloc(call->op, scratch_nbytes));
  unsigned long long* gbuf = (unsigned long long*)scratch.p;
  return dt_cu_float_dispatch(call->op, x->dtype, [&](auto tag) -> dt_status_t {
    using T = decltype(tag);
    DT_CU_LAUNCH(call->op, dt_cu_topk_k<T>, grid, threads, smem, dt_cu_stream(x),
                 (const T*)x->data, (T*)out[0].data, (int64_t*)out[1].data, outer, L, inner, k,
                 largest, P2, gbuf);
    return DT_SUCCESS;
  });
}

/* ---- moe_route --------------------------------------------------------------------------- */

/* One block of DT_CU_BLOCK threads (a counting sort of S = N K slots by expert, small sizes):
 * 1. cnt[e] = the slots choosing expert e; *bad = the first slot with an expert outside
 *    [0, E) (S when none), and nothing else is written when there is one;
 * 2. counts[e] = kept slots (all, or at most capacity), start[e] their first position;
 * 3. the slots in chunks of blockDim, in slot order: a slot's rank among the chunk's earlier
 *    slots of its expert, plus the expert's slots of earlier chunks (cur[e]), says whether it
 *    is kept (position start[e] + that) or dropped (after every kept slot, in slot order). */
__global__ void dt_cu_moe_route_k(const void* ix, int is64, int64_t S, int64_t K, int64_t E,
                                  int64_t capacity, int64_t* order, int64_t* tok,
                                  int64_t* counts, unsigned long long* cnt,
                                  unsigned long long* cur, unsigned long long* bad) {
  __shared__ int64_t s_e[DT_CU_BLOCK];
  __shared__ int s_drop[DT_CU_BLOCK];
  __shared__ int64_t s_dropped; /* position of the next dropped slot */
  const int tid = threadIdx.x;
  if (tid == 0) *bad = (unsigned long long)S;
  for (int64_t e = tid; e < E; e += blockDim.x) cnt[e] = cur[e] = 0;
  __syncthreads();
  for (int64_t s = tid; s < S; s += blockDim.x) {
    int64_t e = dt_cu_index(ix, is64, s);
    if (e < 0 || e >= E) atomicMin(bad, (unsigned long long)s);
    else atomicAdd(&cnt[e], 1ull);
  }
  __syncthreads();
  if (*(volatile unsigned long long*)bad < (unsigned long long)S) return; /* the whole block */
  if (tid == 0) {
    int64_t kept = 0;
    for (int64_t e = 0; e < E; e++) {
      int64_t c = (int64_t)cnt[e];
      if (capacity > 0 && c > capacity) c = capacity;
      counts[e] = c;
      cnt[e] = (unsigned long long)kept; /* from here on: the expert's first position */
      kept += c;
    }
    s_dropped = kept;
  }
  __syncthreads();
  for (int64_t base = 0; base < S; base += blockDim.x) {
    int64_t s = base + tid;
    int valid = s < S;
    int64_t e = valid ? dt_cu_index(ix, is64, s) : -1;
    s_e[tid] = e;
    __syncthreads();
    int64_t rank = 0;
    for (int q = 0; q < tid; q++) rank += s_e[q] == e;
    int keep = valid && (int64_t)cur[e] + rank < counts[e];
    s_drop[tid] = valid && !keep;
    __syncthreads();
    if (valid) {
      int64_t p;
      if (keep) {
        p = (int64_t)cnt[e] + (int64_t)cur[e] + rank;
      } else {
        int64_t before = 0;
        for (int q = 0; q < tid; q++) before += s_drop[q];
        p = s_dropped + before;
      }
      order[p] = s;
      tok[p] = s / K;
    }
    __syncthreads(); /* every thread has read cur and s_dropped */
    if (valid) atomicAdd(&cur[e], 1ull);
    if (tid == 0) {
      int64_t nd = 0;
      for (int q = 0; q < (int)blockDim.x; q++) nd += s_drop[q];
      s_dropped += nd;
    }
    __syncthreads();
  }
}

/* moe_route's scratch for E experts: per-expert counts and cursors, and the flag word. */
static size_t dt_cu_moe_route_nbytes(int64_t E) {
  return sizeof(unsigned long long) * (size_t)(2 * E + 1);
}
DT_CU_SCRATCH(dt_cu_moe_route_scratch) {
  (void)in, (void)out;
  int64_t E, capacity;
  if (dt__moe_route_args(call, &E, &capacity) != DT_SUCCESS) return 0;
  return dt_cu_moe_route_nbytes(E);
}

/* moe_route (idx (N, K) of experts) iargs [experts, capacity = 0]: order, tok, counts (i64);
 * see rules_moe.c. */
DT_CU_KERNEL(dt_cu_moe_route) {
  int64_t E, capacity;
  DT_CHECK(dt__moe_route_args(call, &E, &capacity));
  const dt_local_tensor_t* ix = &in[0];
  int64_t N = ix->shape[0], K = ix->shape[1], S = N * K;
  dt_cu_buf scratch(ix);
  DT_CHECK(scratch.alloc(call->op, dt_cu_moe_route_nbytes(E)));
  unsigned long long* cnt = (unsigned long long*)scratch.p;
  DT_CU_LAUNCH(call->op, dt_cu_moe_route_k, 1, DT_CU_BLOCK, 0, dt_cu_stream(ix), ix->data,
               (int)(ix->dtype == DT_I64), S, K, E, capacity, (int64_t*)out[0].data,
               (int64_t*)out[1].data, (int64_t*)out[2].data, cnt, cnt + E, cnt + 2 * E);
  unsigned long long first = 0;
  DT_CHECK(dt_cu_d2h(ix, call->op, &first, cnt + 2 * E, sizeof first));
  if (first < (unsigned long long)S) {
    int64_t e = 0;
    if (ix->dtype == DT_I64) {
      DT_CHECK(dt_cu_d2h(ix, call->op, &e, (const int64_t*)ix->data + first, sizeof e));
    } else {
      int32_t e32 = 0;
      DT_CHECK(dt_cu_d2h(ix, call->op, &e32, (const int32_t*)ix->data + first, sizeof e32));
      e = e32;
    }
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "moe_route: expert index %lld of token %lld out of range [0, %lld)",
                   (long long)e, (long long)(first / (unsigned long long)K), (long long)E);
  }
  return DT_SUCCESS;
}

/* expand: x broadcast into out (numpy's rule from the right): a box copy whose source steps
 * (dt__expand_steps, shared with the host kernel) are 0 along the dims x lacks or holds once. */
DT_CU_KERNEL(dt_cu_expand) {
  const dt_local_tensor_t* x = &in[0];
  int no = out->ndim;
  int64_t ost[DT_MAX_DIMS], sst[DT_MAX_DIMS];
  DT_CHECK(dt__expand_steps(call, x, out, sst));
  dt_cu_strides(no, out->shape, ost);
  return dt_cu_copy_box(x, call->op, out->data, x->data, no, out->shape, ost, sst,
                        dt__itemsize(x->dtype));
}

/* ---- index_select: slices along a dim at the indices (raw storage) ------------------------ */

/* out[o, i, c] (inner_u units per slice) = x[o, ix[i] - x0, c] when that slice is local, else 0 */
template <typename U>
__global__ void dt_cu_index_select_k(U* out, const U* x, const void* ix, int is64, int64_t outer,
                                     int64_t L, int64_t inner_u, int64_t x0, int64_t xl) {
  DT_CU_FOR(k, outer * L * inner_u) {
    const int64_t c = k % inner_u, t = k / inner_u, i = t % L, o = t / L;
    const int64_t row = dt_cu_index(ix, is64, i) - x0;
    out[k] = (row >= 0 && row < xl) ? x[(o * xl + row) * inner_u + c] : U{};
  }
}
DT_CU_KERNEL(dt_cu_index_select) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  dt__index_select_geom_t g;
  DT_CHECK(dt__index_select_geom(call, x, ix, &g));
  const int64_t outer = g.outer, L = g.L, inner = g.inner;
  const size_t item = dt__itemsize(x->dtype);
  dt_cu_index_check check(ix);
  DT_CHECK(check.start(call->op, ix, g.N));
  const int64_t n = outer * L * inner;
  if (n > 0) {
    uint64_t v[3] = {(uint64_t)inner * item, (uint64_t)(uintptr_t)x->data,
                     (uint64_t)(uintptr_t)out->data};
    const size_t unit = dt_cu_unit_of(v, 3, 16);
    const int64_t inner_u = inner * (int64_t)item / (int64_t)unit;
    DT_CHECK(dt_cu_unit_dispatch(unit, [&](auto tag) -> dt_status_t {
      using U = decltype(tag);
      DT_CU_LAUNCH(call->op, dt_cu_index_select_k<U>, dt_cu_grid(x, outer * L * inner_u),
                   DT_CU_BLOCK, 0, dt_cu_stream(x), (U*)out->data, (const U*)x->data, ix->data,
                   (int)(ix->dtype == DT_I64), outer, L, inner_u, g.x0, g.xl);
      return DT_SUCCESS;
    }));
  }
  int64_t pos, bad;
  DT_CHECK(check.finish(call->op, &pos, &bad));
  return pos >= 0 ? dt__index_select_bad(&g, bad) : DT_SUCCESS;
}

/* ---- tril / triu, cumsum ------------------------------------------------------------------ */

/* tril / triu: element (row i, column j) of each R x C matrix is kept when j is among the local
 * columns dt__tri_cols gives global row r0 + i (the host kernel's rule), else 0. */
template <typename U>
__global__ void dt_cu_tri_k(U* out, const U* x, int64_t n, int64_t R, int64_t C, int64_t r0,
                            int64_t c0, int64_t k, int upper) {
  DT_CU_FOR(e, n) {
    const int64_t j = e % C, i = (e / C) % R;
    int64_t lo, hi;
    dt__tri_cols(upper, k, r0 + i, c0, C, &lo, &hi);
    out[e] = (j >= lo && j < hi) ? x[e] : U{};
  }
}
static dt_status_t dt_cu_tri(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out, int upper) {
  const dt_local_tensor_t* x = &in[0];
  const int nd = x->ndim;
  const int64_t n = dt_cu_numel(x), R = x->shape[nd - 2], C = x->shape[nd - 1];
  const int64_t k = dt__op_iarg(upper ? DT_OP_TRIU : DT_OP_TRIL, call, 0);
  if (n == 0) return DT_SUCCESS;
  return dt_cu_unit_dispatch(dt__itemsize(x->dtype), [&](auto tag) -> dt_status_t {
    using U = decltype(tag);
    DT_CU_LAUNCH(call->op, dt_cu_tri_k<U>, dt_cu_grid(x, n), DT_CU_BLOCK, 0, dt_cu_stream(x),
                 (U*)out->data, (const U*)x->data, n, R, C, x->offset[nd - 2], x->offset[nd - 1],
                 k, upper);
    return DT_SUCCESS;
  });
}
DT_CU_KERNEL(dt_cu_tril) { return dt_cu_tri(call, in, out, 0); }
DT_CU_KERNEL(dt_cu_triu) { return dt_cu_tri(call, in, out, 1); }

/* cumsum: a thread per (outer, inner) line scans it in the host's order and precision (f32 in
 * double, bf16 / f16 (f32 copies) in f32, each output rounded once; i32 / i64 into i64, wrapping),
 * so the results are the host's bit for bit. Lines are independent; a single very long line runs
 * on one thread. */
template <typename T>
__global__ void dt_cu_cumsum_k(const T* x, void* out, int64_t lines, int64_t L, int64_t inner,
                               int rev, int acc_f32) {
  DT_CU_FOR(line, lines) {
    const int64_t o = line / inner, c = line - o * inner, step = rev ? -inner : inner;
    int64_t at = (o * L + (rev ? L - 1 : 0)) * inner + c;
    if constexpr (std::is_same<T, float>::value) {
      if (acc_f32) {
        float s = 0.0f;
        for (int64_t j = 0; j < L; j++, at += step) ((float*)out)[at] = s += x[at];
      } else {
        double s = 0.0;
        for (int64_t j = 0; j < L; j++, at += step)
          ((float*)out)[at] = (float)(s += (double)x[at]);
      }
    } else {
      unsigned long long s = 0;
      for (int64_t j = 0; j < L; j++, at += step) {
        s += (unsigned long long)(long long)x[at];
        ((long long*)out)[at] = (long long)s;
      }
    }
  }
}
DT_CU_KERNEL(dt_cu_cumsum) {
  const dt_local_tensor_t* x = &in[0];
  dt__cumsum_geom_t g;
  DT_CHECK(dt__cumsum_geom(call, x, out, &g));
  const int64_t L = g.L, inner = g.inner, lines = g.outer * g.inner;
  const int rev = g.rev, acc = g.acc_f32;
  if (lines == 0 || L == 0) return DT_SUCCESS;
  const unsigned grid = dt_cu_grid(x, lines);
  if (x->dtype == DT_F32)
    DT_CU_LAUNCH(call->op, dt_cu_cumsum_k<float>, grid, DT_CU_BLOCK, 0, dt_cu_stream(x),
                 (const float*)x->data, out->data, lines, L, inner, rev, acc);
  else if (x->dtype == DT_I32)
    DT_CU_LAUNCH(call->op, dt_cu_cumsum_k<int32_t>, grid, DT_CU_BLOCK, 0, dt_cu_stream(x),
                 (const int32_t*)x->data, out->data, lines, L, inner, rev, acc);
  else
    DT_CU_LAUNCH(call->op, dt_cu_cumsum_k<long long>, grid, DT_CU_BLOCK, 0, dt_cu_stream(x),
                 (const long long*)x->data, out->data, lines, L, inner, rev, acc);
  return DT_SUCCESS;
}

/* ---- registration ------------------------------------------------------------------------ */

}  // namespace

DT_CU_FILL(index) {
  const dt_device_kernel_t view = {dt_cu_view, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_VIEW] = view;
  t[DT_OP_RESHAPE] = view;
  t[DT_OP_FLATTEN] = view;
  t[DT_OP_UNFLATTEN] = view;
  t[DT_OP_SQUEEZE] = view;
  t[DT_OP_UNSQUEEZE] = view;
  t[DT_OP_PERMUTE] = {dt_cu_permute, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_TRANSPOSE] = {dt_cu_transpose, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_T] = {dt_cu_t, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SLICE] = {dt_cu_slice, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_NARROW] = {dt_cu_narrow, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_CAT] = {dt_cu_cat, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_STACK] = {dt_cu_stack, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_EXPAND] = {dt_cu_expand, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_TRIL] = {dt_cu_tril, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_TRIU] = {dt_cu_triu, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_CUMSUM] = {dt_cu_cumsum, 0, NULL}; /* bf16 / f16 as f32 copies, as the host */
  /* lookups move raw bf16/f16 storage (no f32 round trip); the adds run on f32 */
  t[DT_OP_EMBEDDING] = {dt_cu_embedding, DT_KERNEL_ANY_DTYPE, dt_cu_index_check_scratch};
  t[DT_OP_GATHER_DIM] = {dt_cu_gather_dim, DT_KERNEL_ANY_DTYPE, dt_cu_index_check_scratch};
  t[DT_OP_GATHER] = {dt_cu_gather, DT_KERNEL_ANY_DTYPE, dt_cu_index_check_scratch};
  t[DT_OP_INDEX_SELECT] = {dt_cu_index_select, DT_KERNEL_ANY_DTYPE, dt_cu_index_check_scratch};
  t[DT_OP_TOPK] = {dt_cu_topk, DT_KERNEL_ANY_DTYPE, dt_cu_topk_scratch};
  t[DT_OP_EMBEDDING_GRAD] = {dt_cu_embedding_grad, DT_KERNEL_ONE_DTYPE, dt_cu_rows_add_scratch};
  t[DT_OP_SCATTER_ADD] = {dt_cu_scatter_add, 0, dt_cu_index_check_scratch};
  t[DT_OP_INDEX_ADD] = {dt_cu_index_add, DT_KERNEL_ONE_DTYPE, dt_cu_rows_add_scratch};
  t[DT_OP_MOE_ROUTE] = {dt_cu_moe_route, 0, dt_cu_moe_route_scratch};
}

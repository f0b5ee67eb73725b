/* kernels_shape.c - CPU kernels of the shape ops on local shards, any dtype (byte copies):
 * view-family reshapes, slice/narrow, cat, stack, expand, tril/triu and index_select; and the
 * scan cumsum. */
#include "ops/ops.h"

static int64_t dt__numel(const dt_local_tensor_t* t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

/* view, reshape, flatten, unflatten, squeeze, unsqueeze: the strategy guarantees the local shard
 * holds the same elements in the same order, so the local reshape is a copy. */
dt_status_t dt__kernel_view(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  int64_t n = dt__numel(out);
  if (n != dt__numel(&in[0]))
    return DT_FAIL(DT_ERR_INTERNAL, "%s: local shard of %lld elements for an output of %lld",
                   call->op, (long long)dt__numel(&in[0]), (long long)n);
  if (n > 0) memcpy(out->data, in[0].data, (size_t)n * dt__itemsize(in[0].dtype));
  return DT_SUCCESS;
}

/* Copies `rows` blocks: block r takes `len` items from src + r*src_stride (in items). */
static void dt__copy_blocks(char* dst, const char* src, int64_t rows, int64_t len,
                            int64_t dst_stride, int64_t src_stride, size_t item) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + (size_t)(r * dst_stride) * item, src + (size_t)(r * src_stride) * item,
           (size_t)len * item);
}

static dt_status_t dt__cut(int op, const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  int dim;
  int64_t start, step, len;
  DT_CHECK(dt__slice_args(op, call, &dim, &start, &step, &len));
  const dt_local_tensor_t* x = &in[0];
  size_t item = dt__itemsize(x->dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= x->shape[d];
  for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
  int64_t L = x->shape[dim]; /* the sliced dim is whole on every rank */
  const char* src = (const char*)x->data;
  char* dst = (char*)out->data;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < len; j++)
      memcpy(dst + (size_t)((o * len + j) * inner) * item,
             src + (size_t)((o * L + start + j * step) * inner) * item, (size_t)inner * item);
  return DT_SUCCESS;
}

dt_status_t dt__kernel_slice(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  return dt__cut(DT_OP_SLICE, call, in, out);
}
dt_status_t dt__kernel_narrow(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  return dt__cut(DT_OP_NARROW, call, in, out);
}

static dt_status_t dt__join(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out, int stack) {
  int dim;
  int64_t outer, inner, blk[DT_OP_MAX_INPUTS];
  dt__cat_geom(stack, call, in, out, &dim, &outer, &inner, blk);
  size_t item = dt__itemsize(out->dtype);
  int64_t ostride = out->shape[dim] * inner, at = 0;
  for (int t = 0; t < call->n_inputs; t++) {
    dt__copy_blocks((char*)out->data + (size_t)at * item, (const char*)in[t].data, outer, blk[t],
                    ostride, blk[t], item);
    at += blk[t];
  }
  return DT_SUCCESS;
}
dt_status_t dt__kernel_cat(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  return dt__join(call, in, out, 0);
}
/* stack: cat along the new dim, where each input holds one slice */
dt_status_t dt__kernel_stack(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  return dt__join(call, in, out, 1);
}

void dt__cat_geom(int stack, const dt_op_call_t* call, const dt_local_tensor_t* in,
                  const dt_local_tensor_t* out, int* dim, int64_t* outer, int64_t* inner,
                  int64_t* blk) {
  const int nd = out->ndim;
  const int64_t d = dt__op_iarg(stack ? DT_OP_STACK : DT_OP_CAT, call, 0);
  *dim = (int)(d < 0 ? d + nd : d);
  *outer = *inner = 1;
  for (int k = 0; k < *dim; k++) *outer *= out->shape[k];
  for (int k = *dim + 1; k < nd; k++) *inner *= out->shape[k];
  for (int t = 0; t < call->n_inputs; t++) blk[t] = (stack ? 1 : in[t].shape[*dim]) * *inner;
}

dt_status_t dt__expand_steps(const dt_op_call_t* call, const dt_local_tensor_t* x,
                             const dt_local_tensor_t* out, int64_t* sst) {
  int no = out->ndim, lead = no - x->ndim;
  int64_t s = 1;
  for (int d = no - 1; d >= 0; d--) {
    int xd = d - lead;
    if (xd >= 0 && x->shape[xd] != out->shape[d] && x->shape[xd] != 1)
      return DT_FAIL(DT_ERR_INTERNAL, "%s: local dim %d of %lld elements for an output of %lld",
                     call->op, xd, (long long)x->shape[xd], (long long)out->shape[d]);
    sst[d] = (xd < 0 || x->shape[xd] != out->shape[d]) ? 0 : s;
    if (xd >= 0) s *= x->shape[xd];
  }
  return DT_SUCCESS;
}

/* expand: out takes x broadcast, numpy's rule aligned from the right (a dim x lacks, or holds
 * once where out holds more, repeats). The rules keep broadcast dims whole, so the local shards
 * obey the same rule. Rows of the innermost dim are copied whole, or filled by doubling copies
 * where that dim repeats one element. */
dt_status_t dt__kernel_expand(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  const dt_local_tensor_t* x = &in[0];
  int no = out->ndim;
  size_t item = dt__itemsize(x->dtype);
  int64_t n = dt__numel(out);
  if (n == 0) return DT_SUCCESS;
  if (no == 0) {
    memcpy(out->data, x->data, item);
    return DT_SUCCESS;
  }
  int64_t sst[DT_MAX_DIMS];
  DT_CHECK(dt__expand_steps(call, x, out, sst));
  const int64_t len = out->shape[no - 1];
  const size_t row = (size_t)len * item;
  int64_t idx[DT_MAX_DIMS] = {0}, src = 0;
  const char* xp = (const char*)x->data;
  char* dst = (char*)out->data;
  for (int64_t r = 0; r < n / len; r++, dst += row) {
    if (sst[no - 1] != 0) {
      memcpy(dst, xp + (size_t)src * item, row);
    } else {
      memcpy(dst, xp + (size_t)src * item, item);
      for (size_t done = item; done < row; done *= 2)
        memcpy(dst + done, dst, done <= row - done ? done : row - done);
    }
    for (int d = no - 2; d >= 0; d--) { /* next row: the odometer over the outer dims */
      src += sst[d];
      if (++idx[d] < out->shape[d]) break;
      src -= sst[d] * idx[d];
      idx[d] = 0;
    }
  }
  return DT_SUCCESS;
}

/* tril / triu: each row of each matrix (the last two dims) keeps a run of columns and zeroes the
 * rest (zero bytes are 0 in every dtype). Global row and column come from the shards' offsets,
 * so a sharded matrix needs no move. */
static dt_status_t dt__tri(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out, int upper) {
  const dt_local_tensor_t* x = &in[0];
  const int nd = x->ndim;
  const int64_t k = dt__op_iarg(upper ? DT_OP_TRIU : DT_OP_TRIL, call, 0);
  const int64_t R = x->shape[nd - 2], C = x->shape[nd - 1];
  const int64_t r0 = x->offset[nd - 2], c0 = x->offset[nd - 1];
  const size_t item = dt__itemsize(x->dtype);
  int64_t mats = 1;
  for (int d = 0; d < nd - 2; d++) mats *= x->shape[d];
  const char* src = (const char*)x->data;
  char* dst = (char*)out->data;
  for (int64_t m = 0; m < mats; m++)
    for (int64_t i = 0; i < R; i++, src += (size_t)C * item, dst += (size_t)C * item) {
      int64_t lo, hi; /* the kept local columns [lo, hi) */
      dt__tri_cols(upper, k, r0 + i, c0, C, &lo, &hi);
      if (lo > 0) memset(dst, 0, (size_t)lo * item);
      if (hi > lo)
        memcpy(dst + (size_t)lo * item, src + (size_t)lo * item, (size_t)(hi - lo) * item);
      if (hi < C) memset(dst + (size_t)hi * item, 0, (size_t)(C - hi) * item);
    }
  return DT_SUCCESS;
}
dt_status_t dt__kernel_tril(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  return dt__tri(call, in, out, 0);
}
dt_status_t dt__kernel_triu(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  return dt__tri(call, in, out, 1);
}

dt_status_t dt__cumsum_geom(const dt_op_call_t* call, const dt_local_tensor_t* x,
                            const dt_local_tensor_t* out, dt__cumsum_geom_t* g) {
  int dim;
  DT_CHECK(dt__cumsum_args(call, &dim, &g->rev));
  g->is_int = x->dtype == DT_I32 || x->dtype == DT_I64;
  if ((!g->is_int && (x->dtype != DT_F32 || out->dtype != DT_F32)) ||
      (g->is_int && out->dtype != DT_I64))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "cumsum: dtypes %s -> %s are not supported",
                   dt_dtype_name(x->dtype), dt_dtype_name(out->dtype));
  /* PyTorch's CPU accumulator: double for f32, float for bf16 / f16 (at::acc_type) */
  g->acc_f32 = call->in[0].dtype == DT_BF16 || call->in[0].dtype == DT_F16;
  g->outer = g->L = g->inner = 1;
  if (dim >= 0) {
    for (int d = 0; d < dim; d++) g->outer *= x->shape[d];
    g->L = x->shape[dim];
    for (int d = dim + 1; d < x->ndim; d++) g->inner *= x->shape[d];
  }
  return DT_SUCCESS;
}

/* cumsum of f32 in double, of bf16 / f16 (f32 copies here) in f32, as PyTorch's CPU kernel, each
 * output rounded once; of i32 / i64 into i64 (wrapping): one pass per (outer, inner) line in the
 * scan's order. */
dt_status_t dt__kernel_cumsum(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  const dt_local_tensor_t* x = &in[0];
  dt__cumsum_geom_t g;
  DT_CHECK(dt__cumsum_geom(call, x, out, &g));
  const int64_t L = g.L, inner = g.inner, step = g.rev ? -inner : inner;
  const int is_int = g.is_int;
  for (int64_t o = 0; o < g.outer; o++)
    for (int64_t c = 0; c < inner; c++) {
      int64_t at = (o * L + (g.rev ? L - 1 : 0)) * inner + c;
      if (!is_int && g.acc_f32) {
        const float* a = (const float*)x->data;
        float* y = (float*)out->data;
        float s = 0.0f;
        for (int64_t j = 0; j < L; j++, at += step) y[at] = s += a[at];
      } else if (!is_int) {
        const float* a = (const float*)x->data;
        float* y = (float*)out->data;
        double s = 0.0;
        for (int64_t j = 0; j < L; j++, at += step) y[at] = (float)(s += a[at]);
      } else {
        uint64_t s = 0; /* wraps, as PyTorch's int64 sums */
        int64_t* y = (int64_t*)out->data;
        for (int64_t j = 0; j < L; j++, at += step) {
          s += x->dtype == DT_I64 ? (uint64_t)((const int64_t*)x->data)[at]
                                  : (uint64_t)(int64_t)((const int32_t*)x->data)[at];
          y[at] = (int64_t)s;
        }
      }
    }
  return DT_SUCCESS;
}

/* index_select: slice i of the output along dim is x's slice index[i] (raw bytes); an index whose
 * slice is not in the local shard (x sharded along dim) gives zeros, the masked lookup of a
 * Partial(sum). Every index is checked against the global extent first. */
dt_status_t dt__kernel_index_select(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  dt__index_select_geom_t g;
  DT_CHECK(dt__index_select_geom(call, x, ix, &g));
  const int w = ix->dtype == DT_I64;
  for (int64_t i = 0; i < g.L; i++) {
    const int64_t id = w ? ((const int64_t*)ix->data)[i] : ((const int32_t*)ix->data)[i];
    if (id < 0 || id >= g.N) return dt__index_select_bad(&g, id);
  }
  const size_t item = dt__itemsize(x->dtype), blk = (size_t)g.inner * item;
  const char* src = (const char*)x->data;
  char* dst = (char*)out->data;
  for (int64_t o = 0; o < g.outer; o++)
    for (int64_t i = 0; i < g.L; i++, dst += blk) {
      const int64_t row =
          (w ? ((const int64_t*)ix->data)[i] : ((const int32_t*)ix->data)[i]) - g.x0;
      if (row >= 0 && row < g.xl) memcpy(dst, src + (size_t)(o * g.xl + row) * blk, blk);
      else memset(dst, 0, blk);
    }
  return DT_SUCCESS;
}

dt_status_t dt__index_select_geom(const dt_op_call_t* call, const dt_local_tensor_t* x,
                                  const dt_local_tensor_t* ix, dt__index_select_geom_t* g) {
  DT_CHECK(dt__index_select_dim(call, &g->dim));
  const int zd = x->ndim == 0; /* a 0-d x: one slice of one element */
  g->N = zd ? 1 : call->in[0].shape[g->dim];
  g->x0 = zd ? 0 : x->offset[g->dim];
  g->xl = zd ? 1 : x->shape[g->dim];
  g->L = dt__numel(ix);
  g->outer = g->inner = 1;
  for (int d = 0; d < g->dim && !zd; d++) g->outer *= x->shape[d];
  for (int d = g->dim + 1; d < x->ndim; d++) g->inner *= x->shape[d];
  return DT_SUCCESS;
}
dt_status_t dt__index_select_bad(const dt__index_select_geom_t* g, int64_t index) {
  return DT_FAIL(DT_ERR_INVALID_ARG, "index_select: index %lld out of range [0, %lld) for dim %d",
                 (long long)index, (long long)g->N, g->dim);
}

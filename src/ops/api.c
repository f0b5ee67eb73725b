/* api.c - typed convenience entry points over dt_op_run for the shape, attention and indexing
 * ops (each one builds the op's argument list and names itself as the public entry point of its
 * error messages, DT_ENTRY_RETURN). */
#include <math.h>

#include "ops/ops.h"

static dt_status_t dt__reshape_impl(dt_tensor_t x, int ndim, const int64_t* shape,
                                    dt_tensor_t* out) {
  if (ndim < 0 || ndim > DT_OP_MAX_IARGS || (ndim > 0 && shape == NULL)) {
    if (out) *out = NULL;
    if (ndim > 0 && ndim <= DT_OP_MAX_IARGS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "shape is NULL with ndim=%d", ndim);
    return DT_FAIL(DT_ERR_INVALID_ARG, "ndim=%d out of range [0, %d]", ndim, DT_OP_MAX_IARGS);
  }
  return dt__opa(DT_OP_RESHAPE, 1, &x, ndim, shape, 0, NULL, out);
}

dt_status_t dt_reshape(dt_tensor_t x, int ndim, const int64_t* shape, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__reshape_impl(x, ndim, shape, out));
}

dt_status_t dt_transpose(dt_tensor_t x, int d0, int d1, dt_tensor_t* out) {
  const int64_t a[2] = {d0, d1};
  DT_ENTRY_RETURN(dt__opa(DT_OP_TRANSPOSE, 1, &x, 2, a, 0, NULL, out));
}

dt_status_t dt_narrow(dt_tensor_t x, int dim, int64_t start, int64_t length, dt_tensor_t* out) {
  const int64_t a[3] = {dim, start, length};
  DT_ENTRY_RETURN(dt__opa(DT_OP_NARROW, 1, &x, 3, a, 0, NULL, out));
}

dt_status_t dt_cat(int n, const dt_tensor_t* xs, int dim, dt_tensor_t* out) {
  const int64_t a[1] = {dim};
  DT_ENTRY_RETURN(dt__opa(DT_OP_CAT, n, xs, 1, a, 0, NULL, out));
}

/* Pieces [k*size, min((k+1)*size, L)) along dim, through narrow. */
static dt_status_t dt__split_impl(dt_tensor_t x, int64_t size, int dim, dt_tensor_t* outs,
                                  int cap, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  DT_CHECK(dt__tensor_check(x, "x"));
  int nd = x->layout.ndim, d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dim=%d out of range for a %d-dim x (valid: %d to %d)", dim,
                   nd, -nd, nd - 1);
  if (size <= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "size=%lld must be positive", (long long)size);
  int64_t L = x->layout.shape[d], pieces = L == 0 ? 1 : 1 + (L - 1) / size;
  if (pieces > 0 && outs == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "outs is NULL (room for %lld pieces needed)",
                   (long long)pieces);
  if (pieces > cap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cap=%d is too small: %lld pieces of size %lld along dim "
                   "%d (length %lld)", cap, (long long)pieces, (long long)size, d, (long long)L);
  for (int64_t k = 0; k < pieces; k++) {
    int64_t s = k * size, len = L - s < size ? L - s : size;
    dt_status_t st = dt_narrow(x, d, s, len, &outs[k]);
    if (st != DT_SUCCESS) {
      for (int64_t j = 0; j < k; j++) {
        dt__tensor_free(outs[j]);
        outs[j] = NULL;
      }
      return st;
    }
  }
  *n = (int)pieces;
  return DT_SUCCESS;
}

dt_status_t dt_split(dt_tensor_t x, int64_t size, int dim, dt_tensor_t* outs, int cap, int* n) {
  DT_ENTRY_RETURN(dt__split_impl(x, size, dim, outs, cap, n));
}

static dt_status_t dt__chunks_impl(dt_tensor_t x, int n_chunks, int dim, dt_tensor_t* outs,
                                   int cap, int* n) {
  if (n) *n = 0;
  DT_CHECK(dt__tensor_check(x, "x"));
  if (n_chunks <= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_chunks=%d must be positive", n_chunks);
  int nd = x->layout.ndim, d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dim=%d out of range for a %d-dim x (valid: %d to %d)", dim,
                   nd, -nd, nd - 1);
  int64_t L = x->layout.shape[d], size = (L + n_chunks - 1) / n_chunks; /* torch.chunk */
  return dt_split(x, size > 0 ? size : 1, d, outs, cap, n);
}

dt_status_t dt_chunks(dt_tensor_t x, int n_chunks, int dim, dt_tensor_t* outs, int cap, int* n) {
  DT_ENTRY_RETURN(dt__chunks_impl(x, n_chunks, dim, outs, cap, n));
}

dt_status_t dt_sdpa(dt_tensor_t q, dt_tensor_t k, dt_tensor_t v, int causal, double scale,
                    dt_tensor_t* out) {
  dt_tensor_t in[3] = {q, k, v};
  const int64_t a[1] = {causal != 0};
  const double f[1] = {scale};
  /* scale <= 0 or NaN: the default, left out; an infinite one is given, for the op to refuse */
  DT_ENTRY_RETURN(dt__opa(DT_OP_SDPA, 3, in, 1, a, scale > 0.0 || isinf(scale) ? 1 : 0, f, out));
}

int64_t dt_cp_position(int64_t index, int64_t seq, int cp) {
  if (cp <= 0) return index;
  if (seq <= 0 || seq % (2 * (int64_t)cp) != 0 || index < 0 || index >= seq) return -1;
  return dt__cp_position(index, seq, cp);
}

dt_status_t dt_ring_attention(dt_tensor_t q, dt_tensor_t k, dt_tensor_t v, int mesh_dim,
                              int causal, int balanced, double scale, dt_tensor_t* out) {
  const dt_tensor_t in[3] = {q, k, v};
  const int64_t a[4] = {mesh_dim, causal, 0, balanced};
  const double f[1] = {scale};
  DT_ENTRY_RETURN(
      dt__opa(DT_OP_RING_ATTENTION, 3, in, 4, a, scale > 0.0 || isinf(scale) ? 1 : 0, f, out));
}

static dt_status_t dt__all_gather_linear_impl(dt_tensor_t x, dt_tensor_t w, int mesh_dim,
                                              int gather_dim, dt_tensor_t* out,
                                              dt_tensor_t* gathered) {
  DT_ARG_NOT_NULL(out);
  const dt_tensor_t in[2] = {x, w};
  const int64_t a[2] = {mesh_dim, gather_dim};
  dt_tensor_t outs[2] = {NULL, NULL};
  DT_CHECK(dt__op_apply(DT_OP_ALL_GATHER_LINEAR, 2, in, 2, a, 0, NULL, 2, outs, NULL));
  *out = outs[0];
  if (gathered)
    *gathered = outs[1];
  else
    dt__tensor_free(outs[1]);
  return DT_SUCCESS;
}

dt_status_t dt_all_gather_linear(dt_tensor_t x, dt_tensor_t w, int mesh_dim, int gather_dim,
                                 dt_tensor_t* out, dt_tensor_t* gathered) {
  DT_ENTRY_RETURN(dt__all_gather_linear_impl(x, w, mesh_dim, gather_dim, out, gathered));
}

dt_status_t dt_linear_reduce_scatter(dt_tensor_t x, dt_tensor_t w, int mesh_dim, int scatter_dim,
                                     dt_tensor_t* out) {
  const dt_tensor_t in[2] = {x, w};
  const int64_t a[2] = {mesh_dim, scatter_dim};
  DT_ENTRY_RETURN(dt__opa(DT_OP_LINEAR_REDUCE_SCATTER, 2, in, 2, a, 0, NULL, out));
}

dt_status_t dt_rotary(dt_tensor_t x, int seq_dim, double theta, dt_tensor_t* out) {
  const int64_t a[1] = {seq_dim};
  const double f[1] = {theta};
  DT_ENTRY_RETURN(dt__opa(DT_OP_ROTARY, 1, &x, 1, a, 1, f, out));
}

static dt_status_t dt__topk_impl(dt_tensor_t x, int64_t k, int dim, dt_tensor_t* values,
                                 dt_tensor_t* indices) {
  DT_ARG_NOT_NULL(values);
  DT_ARG_NOT_NULL(indices);
  const int64_t a[2] = {k, dim};
  dt_tensor_t outs[2] = {NULL, NULL};
  dt_status_t st = dt__op_apply(DT_OP_TOPK, 1, &x, 2, a, 0, NULL, 2, outs, NULL);
  *values = outs[0];
  *indices = outs[1];
  return st;
}

dt_status_t dt_topk(dt_tensor_t x, int64_t k, int dim, dt_tensor_t* values,
                    dt_tensor_t* indices) {
  DT_ENTRY_RETURN(dt__topk_impl(x, k, dim, values, indices));
}

dt_status_t dt_gather(dt_tensor_t x, int dim, dt_tensor_t index, dt_tensor_t* out) {
  dt_tensor_t in[2] = {x, index};
  const int64_t a[1] = {dim};
  DT_ENTRY_RETURN(dt__opa(DT_OP_GATHER, 2, in, 1, a, 0, NULL, out));
}

dt_status_t dt_scatter_add(dt_tensor_t x, int dim, dt_tensor_t index, dt_tensor_t src,
                           dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, index, src};
  const int64_t a[1] = {dim};
  DT_ENTRY_RETURN(dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, a, 0, NULL, out));
}

dt_status_t dt_where(dt_tensor_t cond, dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[3] = {cond, a, b};
  DT_ENTRY_RETURN(dt__opa(DT_OP_WHERE, 3, in, 0, NULL, 0, NULL, out));
}

dt_status_t dt_cast(dt_tensor_t x, dt_dtype_t dtype, dt_tensor_t* out) {
  const int64_t a[1] = {(int64_t)dtype};
  DT_ENTRY_RETURN(dt__opa(DT_OP_CAST, 1, &x, 1, a, 0, NULL, out));
}

dt_status_t dt_dropout(dt_tensor_t x, double p, uint64_t seed, dt_tensor_t* out) {
  const int64_t a[1] = {(int64_t)seed};
  const double f[1] = {p};
  DT_ENTRY_RETURN(dt__opa(DT_OP_DROPOUT, 1, &x, 1, a, 1, f, out));
}

dt_status_t dt_grouped_mm(dt_tensor_t x, dt_tensor_t w, dt_tensor_t counts, int trans,
                          dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, w, counts};
  const int64_t a[1] = {trans};
  DT_ENTRY_RETURN(dt__opa(DT_OP_GROUPED_MM, 3, in, 1, a, 0, NULL, out));
}

static dt_status_t dt__moe_route_impl(dt_tensor_t idx, int64_t n_experts, int64_t capacity,
                                      dt_tensor_t* order, dt_tensor_t* tok, dt_tensor_t* counts) {
  dt_tensor_t outs[3];
  const int64_t a[2] = {n_experts, capacity};
  if (order) *order = NULL;
  if (tok) *tok = NULL;
  if (counts) *counts = NULL;
  DT_ARG_NOT_NULL(order);
  DT_ARG_NOT_NULL(tok);
  DT_ARG_NOT_NULL(counts);
  DT_CHECK(dt__op_apply(DT_OP_MOE_ROUTE, 1, &idx, 2, a, 0, NULL, 3, outs, NULL));
  *order = outs[0];
  *tok = outs[1];
  *counts = outs[2];
  return DT_SUCCESS;
}

dt_status_t dt_moe_route(dt_tensor_t idx, int64_t n_experts, int64_t capacity, dt_tensor_t* order,
                         dt_tensor_t* tok, dt_tensor_t* counts) {
  DT_ENTRY_RETURN(dt__moe_route_impl(idx, n_experts, capacity, order, tok, counts));
}

dt_status_t dt_index_add(dt_tensor_t x, dt_tensor_t idx, dt_tensor_t src, dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, idx, src};
  DT_ENTRY_RETURN(dt__opa(DT_OP_INDEX_ADD, 3, in, 0, NULL, 0, NULL, out));
}

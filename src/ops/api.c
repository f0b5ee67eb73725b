/* api.c - typed convenience entry points over dt_op_run for the shape, attention and indexing
 * ops (each one builds the op's argument list). */
#include "ops/ops.h"

dt_status_t dt_reshape(dt_tensor_t x, int ndim, const int64_t* shape, dt_tensor_t* out) {
  if (ndim < 0 || ndim > DT_OP_MAX_IARGS || (ndim > 0 && shape == NULL)) {
    if (out) *out = NULL;
    return DT_FAIL(DT_ERR_INVALID_ARG, "reshape: ndim %d out of range [0, %d] or NULL shape",
                   ndim, DT_OP_MAX_IARGS);
  }
  return dt__opa(DT_OP_RESHAPE, 1, &x, ndim, shape, 0, NULL, out);
}

dt_status_t dt_transpose(dt_tensor_t x, int d0, int d1, dt_tensor_t* out) {
  const int64_t a[2] = {d0, d1};
  return dt__opa(DT_OP_TRANSPOSE, 1, &x, 2, a, 0, NULL, out);
}

dt_status_t dt_narrow(dt_tensor_t x, int dim, int64_t start, int64_t length, dt_tensor_t* out) {
  const int64_t a[3] = {dim, start, length};
  return dt__opa(DT_OP_NARROW, 1, &x, 3, a, 0, NULL, out);
}

dt_status_t dt_cat(int n, const dt_tensor_t* xs, int dim, dt_tensor_t* out) {
  const int64_t a[1] = {dim};
  return dt__opa(DT_OP_CAT, n, xs, 1, a, 0, NULL, out);
}

/* Pieces [k*size, min((k+1)*size, L)) along dim, through narrow. */
dt_status_t dt_split(dt_tensor_t x, int64_t size, int dim, dt_tensor_t* outs, int cap, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  if (dt__tensor_check(x, "x") != DT_SUCCESS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "split: x is not a live tensor");
  int nd = x->layout.ndim, d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "split: dim %d out of range for %d dims", dim, nd);
  if (size <= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "split: size %lld must be positive",
                                (long long)size);
  int64_t L = x->layout.shape[d], pieces = L == 0 ? 1 : (L + size - 1) / size;
  if (pieces > cap || (pieces > 0 && outs == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "split: %lld pieces do not fit in cap %d",
                   (long long)pieces, cap);
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

dt_status_t dt_chunks(dt_tensor_t x, int n_chunks, int dim, dt_tensor_t* outs, int cap, int* n) {
  if (n) *n = 0;
  if (dt__tensor_check(x, "x") != DT_SUCCESS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "chunk: x is not a live tensor");
  if (n_chunks <= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "chunk: n_chunks %d must be positive",
                                    n_chunks);
  int nd = x->layout.ndim, d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "chunk: dim %d out of range for %d dims", dim, nd);
  int64_t L = x->layout.shape[d], size = (L + n_chunks - 1) / n_chunks; /* torch.chunk */
  return dt_split(x, size > 0 ? size : 1, d, outs, cap, n);
}

dt_status_t dt_sdpa(dt_tensor_t q, dt_tensor_t k, dt_tensor_t v, int causal, double scale,
                    dt_tensor_t* out) {
  dt_tensor_t in[3] = {q, k, v};
  const int64_t a[1] = {causal != 0};
  const double f[1] = {scale};
  return dt__opa(DT_OP_SDPA, 3, in, 1, a, scale > 0.0 ? 1 : 0, f, out);
}

dt_status_t dt_rotary(dt_tensor_t x, int seq_dim, double theta, dt_tensor_t* out) {
  const int64_t a[1] = {seq_dim};
  const double f[1] = {theta};
  return dt__opa(DT_OP_ROTARY, 1, &x, 1, a, 1, f, out);
}

dt_status_t dt_topk(dt_tensor_t x, int64_t k, int dim, dt_tensor_t* values,
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

dt_status_t dt_gather(dt_tensor_t x, int dim, dt_tensor_t index, dt_tensor_t* out) {
  dt_tensor_t in[2] = {x, index};
  const int64_t a[1] = {dim};
  return dt__opa(DT_OP_GATHER, 2, in, 1, a, 0, NULL, out);
}

dt_status_t dt_scatter_add(dt_tensor_t x, int dim, dt_tensor_t index, dt_tensor_t src,
                           dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, index, src};
  const int64_t a[1] = {dim};
  return dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, a, 0, NULL, out);
}

dt_status_t dt_where(dt_tensor_t cond, dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[3] = {cond, a, b};
  return dt__opa(DT_OP_WHERE, 3, in, 0, NULL, 0, NULL, out);
}

dt_status_t dt_cast(dt_tensor_t x, dt_dtype_t dtype, dt_tensor_t* out) {
  const int64_t a[1] = {(int64_t)dtype};
  return dt__opa(DT_OP_CAST, 1, &x, 1, a, 0, NULL, out);
}

dt_status_t dt_dropout(dt_tensor_t x, double p, uint64_t seed, dt_tensor_t* out) {
  const int64_t a[1] = {(int64_t)seed};
  const double f[1] = {p};
  return dt__opa(DT_OP_DROPOUT, 1, &x, 1, a, 1, f, out);
}

dt_status_t dt_grouped_mm(dt_tensor_t x, dt_tensor_t w, dt_tensor_t counts, int trans,
                          dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, w, counts};
  const int64_t a[1] = {trans};
  return dt__opa(DT_OP_GROUPED_MM, 3, in, 1, a, 0, NULL, out);
}

dt_status_t dt_moe_route(dt_tensor_t idx, int64_t n_experts, int64_t capacity, dt_tensor_t* order,
                         dt_tensor_t* tok, dt_tensor_t* counts) {
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

dt_status_t dt_index_add(dt_tensor_t x, dt_tensor_t idx, dt_tensor_t src, dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, idx, src};
  return dt__opa(DT_OP_INDEX_ADD, 3, in, 0, NULL, 0, NULL, out);
}

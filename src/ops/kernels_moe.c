/* kernels_moe.c - CPU kernels of the mixture-of-experts ops (f32): grouped_mm and
 * grouped_mm_wgrad (one backend GEMM, cblas_sgemm on the host, per expert group of rows),
 * moe_route (a counting sort of the routing choices by expert, with an optional capacity) and
 * index_add (rows added back at their tokens). Also the process-wide count of the FLOPs the
 * grouped GEMMs ran (dt_grouped_mm_flops). */
#include <stdlib.h>

#include "ops/ops.h"

static int64_t dt__grouped_flops = 0; /* 2 per multiply-add, since the last reset */

static dt_status_t dt__grouped_mm_flops(int64_t* flops) {
  DT_ARG_NOT_NULL(flops);
  *flops = dt__grouped_flops;
  return DT_SUCCESS;
}

dt_status_t dt_grouped_mm_flops(int64_t* flops) { DT_ENTRY_RETURN(dt__grouped_mm_flops(flops)); }

void dt__grouped_mm_flops_add(int64_t flops) { dt__grouped_flops += flops; }

dt_status_t dt_grouped_mm_flops_reset(void) {
  dt__grouped_flops = 0;
  return DT_SUCCESS;
}

static dt_status_t dt__f32(const dt_op_call_t* call, const dt_local_tensor_t* t, int n) {
  for (int i = 0; i < n; i++)
    if (t[i].dtype != DT_F32)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not supported by the CPU kernel",
                     call->op, dt_dtype_name(t[i].dtype));
  return DT_SUCCESS;
}

static int64_t dt__idx(const dt_local_tensor_t* t, int64_t i) {
  return t->dtype == DT_I64 ? ((const int64_t*)t->data)[i] : ((const int32_t*)t->data)[i];
}

/* The group offsets of counts (whole on every rank): off[e] .. off[e + 1] are expert e's rows.
 * The counts must be non-negative and sum to the T rows (a caller's data, so a clear error). */
static dt_status_t dt__group_offsets(const dt_op_call_t* call, const dt_local_tensor_t* counts,
                                     int64_t T, int64_t** off) {
  int64_t E = counts->shape[0];
  *off = (int64_t*)malloc(sizeof(int64_t) * (size_t)(E + 1));
  if (*off == NULL)
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: %lld group offsets", call->op, (long long)E + 1);
  (*off)[0] = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t c = dt__idx(counts, e);
    if (c < 0) {
      free(*off);
      *off = NULL;
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: counts[%lld] = %lld is negative", call->op,
                     (long long)e, (long long)c);
    }
    (*off)[e + 1] = (*off)[e] + c;
  }
  if ((*off)[E] != T) {
    int64_t sum = (*off)[E];
    free(*off);
    *off = NULL;
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: counts sum to %lld, the tokens have %lld rows",
                   call->op, (long long)sum, (long long)T);
  }
  return DT_SUCCESS;
}

/* grouped_mm: for each local expert e, the local rows in [off[e], off[e+1]) times W_e (local
 * slices of its dims). Rows of experts this rank does not hold (experts sharded) are zeros. */
dt_status_t dt__kernel_grouped_mm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  DT_CHECK(dt__f32(call, in, 2));
  const dt_local_tensor_t *x = &in[0], *w = &in[1];
  int trans;
  DT_CHECK(dt__grouped_mm_args(call, &trans));
  int64_t* off;
  DT_CHECK(dt__group_offsets(call, &in[2], call->in[0].shape[0], &off));
  int64_t r0 = x->offset[0], Tl = x->shape[0], K = x->shape[1], N = out->shape[1];
  int64_t e0 = w->offset[0], El = w->shape[0];
  float* o = (float*)out->data;
  if (El != call->in[1].shape[0] && Tl * N > 0) memset(o, 0, sizeof(float) * (size_t)(Tl * N));
  dt_status_t st = DT_SUCCESS;
  for (int64_t e = e0; e < e0 + El && st == DT_SUCCESS; e++) {
    int64_t lo = off[e] > r0 ? off[e] : r0, hi = off[e + 1] < r0 + Tl ? off[e + 1] : r0 + Tl;
    if (hi <= lo) continue;
    const float* we = (const float*)w->data + (e - e0) * N * K;
    st = dt__gemm(x->backend, 0, trans, hi - lo, N, K, 1.0f, (const float*)x->data + (lo - r0) * K,
                  K, we, trans ? K : N, 0.0f, o + (lo - r0) * N, N);
    dt__grouped_flops += 2 * (hi - lo) * N * K;
  }
  free(off);
  return st;
}

/* grouped_mm_wgrad: out_e (M, N) = a_e^T b_e over the local rows of each local expert. */
dt_status_t dt__kernel_grouped_mm_wgrad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                        dt_local_tensor_t* out) {
  DT_CHECK(dt__f32(call, in, 2));
  const dt_local_tensor_t *a = &in[0], *b = &in[1];
  int64_t* off;
  DT_CHECK(dt__group_offsets(call, &in[2], call->in[0].shape[0], &off));
  int64_t r0 = a->offset[0], Tl = a->shape[0], M = out->shape[1], N = out->shape[2];
  int64_t e0 = out->offset[0], El = out->shape[0];
  float* o = (float*)out->data;
  dt_status_t st = DT_SUCCESS;
  for (int64_t e = e0; e < e0 + El && st == DT_SUCCESS; e++) {
    int64_t lo = off[e] > r0 ? off[e] : r0, hi = off[e + 1] < r0 + Tl ? off[e + 1] : r0 + Tl;
    float* oe = o + (e - e0) * M * N;
    if (hi <= lo) { /* no rows: a zero gradient */
      if (M * N > 0) memset(oe, 0, sizeof(float) * (size_t)(M * N));
      continue;
    }
    st = dt__gemm(a->backend, 1, 0, M, N, hi - lo, 1.0f, (const float*)a->data + (lo - r0) * M, M,
                  (const float*)b->data + (lo - r0) * N, N, 0.0f, oe, N);
    dt__grouped_flops += 2 * (hi - lo) * M * N;
  }
  free(off);
  return st;
}

/* moe_route: a stable counting sort of the N K slots by expert (see rules_moe.c). */
dt_status_t dt__kernel_moe_route(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  int64_t E, capacity;
  DT_CHECK(dt__moe_route_args(call, &E, &capacity));
  const dt_local_tensor_t* ix = &in[0];
  int64_t N = ix->shape[0], K = ix->shape[1], S = N * K;
  int64_t *order = (int64_t*)out[0].data, *tok = (int64_t*)out[1].data,
          *counts = (int64_t*)out[2].data;
  int64_t* next = (int64_t*)malloc(sizeof(int64_t) * (size_t)(2 * E)); /* fill, limit */
  if (next == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe_route: %lld experts", (long long)E);
  int64_t* lim = next + E;
  for (int64_t e = 0; e < E; e++) counts[e] = 0;
  for (int64_t s = 0; s < S; s++) {
    int64_t e = dt__idx(ix, s);
    if (e < 0 || e >= E) {
      free(next);
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "moe_route: expert index %lld of token %lld out of range "
                     "[0, %lld)",
                     (long long)e, (long long)(s / K), (long long)E);
    }
    if (capacity == 0 || counts[e] < capacity) counts[e]++;
  }
  /* expert e's kept slots fill [next[e], lim[e]) in slot (= token) order; the dropped ones go
   * after every kept slot, in slot order */
  int64_t kept = 0;
  for (int64_t e = 0; e < E; e++) {
    next[e] = kept;
    kept += counts[e];
    lim[e] = kept;
  }
  int64_t drop = kept;
  for (int64_t s = 0; s < S; s++) {
    int64_t e = dt__idx(ix, s);
    int64_t p = next[e] < lim[e] ? next[e]++ : drop++;
    order[p] = s;
    tok[p] = s / K;
  }
  free(next);
  return DT_SUCCESS;
}

/* index_add: out = x; out[idx[i] - local row offset] += src[i] for the indices in the local rows.
 */
dt_status_t dt__kernel_index_add(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1], *src = &in[2];
  DT_CHECK(dt__f32(call, x, 1));
  DT_CHECK(dt__f32(call, src, 1));
  int64_t N = call->in[0].shape[0], x0 = x->offset[0], xl = x->shape[0], D = x->shape[1];
  float* o = (float*)out->data;
  const float* s = (const float*)src->data;
  if (xl * D > 0) memcpy(o, x->data, sizeof(float) * (size_t)(xl * D));
  for (int64_t i = 0; i < ix->shape[0]; i++) {
    int64_t t = dt__idx(ix, i);
    if (t < 0 || t >= N)
      return DT_FAIL(DT_ERR_INVALID_ARG, "index_add: index %lld out of range [0, %lld)",
                     (long long)t, (long long)N);
    int64_t r = t - x0;
    if (r < 0 || r >= xl) continue;
    float* orow = o + r * D;
    const float* srow = s + i * D;
    for (int64_t j = 0; j < D; j++) orow[j] += srow[j];
  }
  return DT_SUCCESS;
}

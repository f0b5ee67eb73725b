/* rules_moe.c - rule generators of the mixture-of-experts ops: grouped_mm (one GEMM per expert
 * group of rows), its weight gradient grouped_mm_wgrad, the router's moe_route (tokens sorted by
 * expert) and index_add (rows added back at their tokens).
 *
 * The rows of grouped_mm are sorted by expert and `counts` (E) says how many each expert gets;
 * counts are always whole (Replicate), since every rank needs them to find its rows' experts.
 * Rule tables (per mesh dim; [out; x, w, counts]), w (E, N, K) with trans = 1 (linear), (E, K, N)
 * with trans = 0:
 *   grouped_mm:        [R; R, R, R]
 *                      [S(0); S(0), R, R]     rows sharded: each rank runs the groups' rows it
 *                                             holds (the kernel places them by global row index)
 *                      [S(1); R, S(n), R]     the weights' output dim sharded (column parallel)
 *                      [P(sum); S(1), S(k), R] the contracted dim sharded (row parallel)
 *                      [P(sum); R, S(0), R]   experts sharded: each rank runs its own experts'
 *                                             groups and leaves zeros in the other rows
 *                      [P(op); P(op), R, R]  [P(op); R, P(op), R]  (linear in x and in w)
 *   A Shard(0) of the rows together with Shard(0) of the experts on the same mesh dim would need
 *   the rows of the local experts on each rank: that is what expert parallelism arranges
 *   explicitly (an all-to-all of the rows), not a placement, so no rule says it.
 *   grouped_mm_wgrad (a (T, M), b (T, N), counts) -> (E, M, N), out_e = a_e^T b_e:
 *                      [R; R, R, R]  [S(0); R, R, R] (each rank its own experts)
 *                      [P(sum); S(0), S(0), R] (rows sharded)  [S(1); S(1), R, R]
 *                      [S(2); R, S(1), R]  [P(op); P(op), R, R]  [P(op); R, P(op), R]
 *   moe_route:         [R, R, R; R] (a global sort: the routing choices are gathered first)
 *   index_add (x (N, D), idx (T), src (T, D)), rows: [R; R, R, R]  [S(1); S(1), R, S(1)]
 *                      [S(0); S(0), R, R] (each rank adds the updates landing in its rows)
 *                      [P(sum); P(sum), S(0), S(0)] (each rank adds its share of the updates)
 *                      [P(op); P(op), R, P(op)] (linear in x and src)
 */
#include <stdio.h>

#include "strategy/strategy.h"

static int dt__add(dt_op_rule_t* rules, int cap, int* n, const dt_op_rule_t* r) {
  if (*n >= cap) return 0;
  rules[(*n)++] = *r;
  return 1;
}

static int dt__is_index(dt_dtype_t t) { return t == DT_I32 || t == DT_I64; }

/* [P(op); P(op) on input t, R elsewhere] for sum and avg. */
static void dt__linear_in(dt_op_rule_t* rules, int cap, int* n, int t) {
  for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
    dt_op_rule_t r;
    memset(&r, 0, sizeof r);
    r.out[0] = r.in[t] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
}

/* counts: a 1-d integer tensor of E entries. */
static dt_status_t dt__check_counts(const dt_op_call_t* call, const dt_tensor_meta_t* c,
                                    int64_t E) {
  if (!dt__is_index(c->dtype) || c->ndim != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: counts must be a 1-d i32/i64 tensor (got %d-d %s)",
                   call->op, c->ndim, dt_dtype_name(c->dtype));
  if (c->shape[0] != E)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: counts has %lld entries for %lld experts", call->op,
                   (long long)c->shape[0], (long long)E);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * grouped_mm (x (T, K), w, counts (E)) iargs [trans = 1]: out (T, N); rows [o_e, o_e + c_e) of x
 * (o_e = c_0 + ... + c_{e-1}) times expert e's matrix: x W_e^T with w (E, N, K) (trans 1, the
 * PyTorch linear convention), x W_e with w (E, K, N) (trans 0). */

dt_status_t dt__grouped_mm_args(const dt_op_call_t* call, int* trans) {
  *trans = 1;
  if (call->n_iargs > 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "grouped_mm takes iargs [trans=1]; n_iargs=%d",
                   call->n_iargs);
  const int64_t t = dt__op_iarg(DT_OP_GROUPED_MM, call, 0); /* the schema's trans=1 */
  if (t != 0 && t != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "grouped_mm: trans %lld (iargs[0]) must be 1 (w (E, N, K)) "
                   "or 0 (w (E, K, N))", (long long)t);
  *trans = (int)t;
  return DT_SUCCESS;
}

dt_status_t dt__grouped_mm_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                 dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int trans;
  DT_CHECK(dt__grouped_mm_args(call, &trans));
  const dt_tensor_meta_t *x = &call->in[0], *w = &call->in[1];
  if (x->ndim != 2 || !dt__dtype_is_float(x->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "grouped_mm: x must be a 2-d float tensor (T, K), got "
                   "%d-d %s",
                   x->ndim, dt_dtype_name(x->dtype));
  if (w->ndim != 3 || w->dtype != x->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "grouped_mm: weights must be 3-d (E, %s) of x's dtype, "
                   "got %d-d %s",
                   trans ? "N, K" : "K, N", w->ndim, dt_dtype_name(w->dtype));
  int kd = trans ? 2 : 1, nd = trans ? 1 : 2; /* the weights' contracted and output dims */
  if (w->shape[kd] != x->shape[1])
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "grouped_mm: x (%lld, %lld) against weights (%lld, %lld, "
                   "%lld) with trans %d: inner sizes %lld and %lld differ",
                   (long long)x->shape[0], (long long)x->shape[1], (long long)w->shape[0],
                   (long long)w->shape[1], (long long)w->shape[2], trans, (long long)x->shape[1],
                   (long long)w->shape[kd]);
  DT_CHECK(dt__check_counts(call, &call->in[2], w->shape[0]));
  out_meta->dtype = x->dtype;
  out_meta->ndim = 2;
  out_meta->shape[0] = x->shape[0];
  out_meta->shape[1] = w->shape[nd];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  r.out[0] = r.in[0] = dt_shard(0);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_shard(1);
  r.in[1] = dt_shard(nd);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_partial(DT_REDUCE_SUM);
  r.in[0] = dt_shard(1);
  r.in[1] = dt_shard(kd);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_partial(DT_REDUCE_SUM);
  r.in[1] = dt_shard(0);
  dt__add(rules, cap, n, &r);
  dt__linear_in(rules, cap, n, 0);
  dt__linear_in(rules, cap, n, 1);
  return DT_SUCCESS;
}

/* grouped_mm_wgrad (a (T, M), b (T, N), counts (E)): out (E, M, N), out_e = a_e^T b_e over expert
 * e's rows (zeros for an expert without rows). */
dt_status_t dt__grouped_mm_wgrad_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                       int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t *a = &call->in[0], *b = &call->in[1];
  if (a->ndim != 2 || b->ndim != 2 || a->shape[0] != b->shape[0] || a->dtype != b->dtype ||
      !dt__dtype_is_float(a->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "grouped_mm_wgrad: a (T, M) and b (T, N) must be 2-d float "
                   "tensors of one dtype with the same rows");
  DT_CHECK(dt__check_counts(call, &call->in[2], call->in[2].ndim == 1 ? call->in[2].shape[0] : 0));
  out_meta->dtype = a->dtype;
  out_meta->ndim = 3;
  out_meta->shape[0] = call->in[2].shape[0];
  out_meta->shape[1] = a->shape[1];
  out_meta->shape[2] = b->shape[1];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  r.out[0] = dt_shard(0);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_partial(DT_REDUCE_SUM);
  r.in[0] = r.in[1] = dt_shard(0);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_shard(1);
  r.in[0] = dt_shard(1);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_shard(2);
  r.in[1] = dt_shard(1);
  dt__add(rules, cap, n, &r);
  dt__linear_in(rules, cap, n, 0);
  dt__linear_in(rules, cap, n, 1);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * moe_route (idx (N, K) i32/i64, the experts each token chose) iargs [experts, capacity = 0]:
 * order (N K) i64, tok (N K) i64, counts (experts) i64. Slot s = n K + j is token n's j-th
 * choice; order lists the slots sorted by expert (stable: token order within an expert), the
 * kept ones first, then the dropped ones in slot order; tok[i] = order[i] / K (the slot's token);
 * counts[e] the slots expert e keeps. With capacity c > 0 an expert keeps its first c slots in
 * token order and drops the rest; capacity 0 keeps every slot (dropless). */

dt_status_t dt__moe_route_args(const dt_op_call_t* call, int64_t* experts, int64_t* capacity) {
  *experts = *capacity = 0;
  if (call->n_iargs < 1 || call->n_iargs > 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "moe_route takes iargs [experts(, capacity=0)]; n_iargs=%d",
                   call->n_iargs);
  *experts = call->iargs[0];
  *capacity = dt__op_iarg(DT_OP_MOE_ROUTE, call, 1); /* the schema's capacity=0 */
  if (*experts < 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "moe_route: experts=%lld (iargs[0]) must be at least 1",
                   (long long)*experts);
  if (*capacity < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "moe_route: capacity=%lld (iargs[1]) must be >= 0 (0: "
                   "dropless)", (long long)*capacity);
  return DT_SUCCESS;
}

dt_status_t dt__moe_route_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 3;
  *n = 0;
  int64_t E, capacity;
  DT_CHECK(dt__moe_route_args(call, &E, &capacity));
  const dt_tensor_meta_t* ix = &call->in[0];
  if (ix->ndim != 2 || !dt__is_index(ix->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "moe_route: idx must be a 2-d i32/i64 tensor (N, K), got "
                   "%d-d %s",
                   ix->ndim, dt_dtype_name(ix->dtype));
  if (ix->shape[1] > E)
    return DT_FAIL(DT_ERR_INVALID_ARG, "moe_route: top_k %lld exceeds the %lld experts",
                   (long long)ix->shape[1], (long long)E);
  for (int o = 0; o < 3; o++) {
    out_meta[o].dtype = DT_I64;
    out_meta[o].ndim = 1;
    out_meta[o].shape[0] = o < 2 ? ix->shape[0] * ix->shape[1] : E;
  }
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * index_add (x (N, D), idx (T) i32/i64, src (T, D)): x with src's row i added to row idx[i]
 * (torch.index_add along dim 0). */

dt_status_t dt__index_add_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t *x = &call->in[0], *ix = &call->in[1], *s = &call->in[2];
  if (x->ndim != 2 || !dt__dtype_is_float(x->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_add: x must be a 2-d float tensor (N, D)");
  if (ix->ndim != 1 || !dt__is_index(ix->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_add: idx must be a 1-d i32/i64 tensor, got %d-d %s",
                   ix->ndim, dt_dtype_name(ix->dtype));
  if (s->ndim != 2 || s->dtype != x->dtype || s->shape[0] != ix->shape[0] ||
      s->shape[1] != x->shape[1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_add: src must be (%lld, %lld) of x's dtype",
                   (long long)ix->shape[0], (long long)x->shape[1]);
  *out_meta = *x;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  r.out[0] = r.in[0] = r.in[2] = dt_shard(1);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = r.in[0] = dt_shard(0);
  dt__add(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = r.in[0] = dt_partial(DT_REDUCE_SUM);
  r.in[1] = r.in[2] = dt_shard(0);
  dt__add(rules, cap, n, &r);
  for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
    memset(&r, 0, sizeof r);
    r.out[0] = r.in[0] = r.in[2] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

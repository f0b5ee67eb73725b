/* rules_grad.c - rule generators of the ops that backward passes use: act_grad (g * f'(x) of an
 * activation), rms_norm_grad, layer_norm_grad, embedding_grad and sdpa_grad.
 *   act_grad (g, x) iargs [kind]:      pointwise on one shape; Partial passes through g only
 *                                      (linear in g)
 *   rms_norm_grad / layer_norm_grad (g, x, w) -> (gx, gw): rows sharded give gx S(d) and gw P(sum)
 *   embedding_grad (g (.., D), idx (..)) iargs [V] -> gw (V, D): [S(0); R, R] by masked local
 *     accumulation (a vocabulary-sharded table), [S(1); S(last), R], [P(sum); S(d), S(d)] for
 *     index dims, Partial through g
 *   sdpa_grad (q, k, v, g) -> (dq, dk, dv): batch or heads sharded on all; queries sharded with
 *     k, v whole give dk, dv as P(sum)
 */
#include "strategy/strategy.h"

static int dt__add(dt_op_rule_t* rules, int cap, int* n, const dt_op_rule_t* r) {
  if (*n >= cap) return 0;
  rules[(*n)++] = *r;
  return 1;
}

dt_status_t dt__act_grad_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                      int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  if (call->n_iargs != 1 || call->iargs[0] < 0 || call->iargs[0] >= DT_ACT_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad takes iargs [kind] (0 to %d)", DT_ACT_COUNT - 1);
  if (call->n_fargs > 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad takes fargs [lo, hi] (clamp's bounds), got %d "
                   "values", call->n_fargs);
  const dt_tensor_meta_t *g = &call->in[0], *x = &call->in[1];
  if (g->ndim != x->ndim || memcmp(g->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad: g and x must have the same shape (no "
                   "broadcasting)");
  return dt__rules_pointwise(call, DT_LIN_NUMERATOR, out_meta, rules, cap, n);
}

dt_status_t dt__norm_grad_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                       int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 2;
  *n = 0;
  const dt_tensor_meta_t *g = &call->in[0], *x = &call->in[1], *w = &call->in[2];
  if (g->ndim != x->ndim || memcmp(g->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0 ||
      x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: expects g and x of one shape and w of the last dim",
                   call->op);
  out_meta[0] = *x;
  out_meta[1] = *w;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d + 1 < x->ndim; d++) {
    r.out[0] = r.in[0] = r.in[1] = dt_shard(d);
    r.out[1] = dt_partial(DT_REDUCE_SUM);
    dt__add(rules, cap, n, &r);
  }
  for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
    memset(&r, 0, sizeof r);
    r.out[0] = r.out[1] = r.in[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__embedding_grad_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                            int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t *g = &call->in[0], *ix = &call->in[1];
  if (call->n_iargs != 1 || call->iargs[0] < 0) /* 0: an empty table (a rank without rows) */
    return DT_FAIL(DT_ERR_INVALID_ARG, "embedding_grad takes iargs [vocab size]");
  if ((ix->dtype != DT_I32 && ix->dtype != DT_I64) || g->ndim != ix->ndim + 1 ||
      memcmp(g->shape, ix->shape, sizeof(int64_t) * (size_t)ix->ndim) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "embedding_grad: g must be indices.shape + (D)");
  out_meta->dtype = g->dtype;
  out_meta->ndim = 2;
  out_meta->shape[0] = call->iargs[0];
  out_meta->shape[1] = g->shape[g->ndim - 1];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  r.out[0] = dt_shard(0); /* each rank accumulates the rows of its vocabulary shard */
  dt__add(rules, cap, n, &r);
  r.out[0] = dt_shard(1);
  r.in[0] = dt_shard(g->ndim - 1);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < ix->ndim; d++) {
    memset(&r, 0, sizeof r);
    r.out[0] = dt_partial(DT_REDUCE_SUM);
    r.in[0] = r.in[1] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
    memset(&r, 0, sizeof r);
    r.out[0] = r.in[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__sdpa_grad_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                       int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 3;
  *n = 0;
  dt_op_call_t fwd = *call;
  fwd.n_inputs = 3;
  fwd.op = "sdpa";
  dt_op_rule_t tmp[8];
  int nt, nout;
  DT_CHECK(dt__sdpa_rules(&fwd, out_meta, &nout, tmp, 8, &nt)); /* validates q, k, v */
  const dt_tensor_meta_t* g = &call->in[3];
  if (g->ndim != 4 || memcmp(g->shape, out_meta[0].shape, sizeof(int64_t) * 4) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "sdpa_grad: g must have the output's shape");
  if (!dt__dtype_is_float(g->dtype)) /* another float dtype is converted by the kernels */
    return DT_FAIL(DT_ERR_INVALID_ARG, "sdpa_grad: g is %s, expected a float dtype",
                   dt_dtype_name(g->dtype));
  out_meta[0] = call->in[0];
  out_meta[1] = call->in[1];
  out_meta[2] = call->in[2];
  int hd, sd;
  DT_CHECK(dt__sdpa_layout(call, &hd, &sd));
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  const int dims[2] = {0, hd};
  for (int j = 0; j < 2; j++) {
    for (int t = 0; t < 4; t++) r.in[t] = dt_shard(dims[j]);
    for (int o = 0; o < 3; o++) r.out[o] = dt_shard(dims[j]);
    dt__add(rules, cap, n, &r);
  }
  memset(&r, 0, sizeof r);
  r.in[0] = r.in[3] = r.out[0] = dt_shard(sd);
  r.out[1] = r.out[2] = dt_partial(DT_REDUCE_SUM);
  dt__add(rules, cap, n, &r);
  return DT_SUCCESS;
}

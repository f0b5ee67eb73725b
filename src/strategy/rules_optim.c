/* rules_optim.c - rule generators of the in-place update ops (the optimizer's step, gradient
 * scaling) and of sumsq, the local piece of a gradient norm.
 *
 * Per mesh dim:
 *   adamw(p, g, m, v, step):  [; R, R, R, R, R]  [; S(d), S(d), S(d), S(d), R]  (elementwise;
 *                             the step count is a replicated scalar). p, m, v are written in
 *                             place, so only g can move: a Partial gradient is reduced to p's
 *                             placements on the way in (deferred gradient reduction).
 *   scale_(x):                R, S(d), P(sum), P(avg); P(max)/P(min) too for alpha >= 0 (the
 *                             placement of an in-place result cannot change).
 *   sumsq(x) -> 0-d:          [R; R]  [P(sum); S(d)]  (non-linear: Partial inputs are reduced).
 */
#include <math.h>

#include "strategy/strategy.h"

static int dt__push(dt_op_rule_t* rules, int cap, int* n, const dt_op_rule_t* r) {
  if (*n >= cap) return 0;
  rules[(*n)++] = *r;
  return 1;
}

static int dt__is_float(dt_dtype_t t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

static int dt__same_shape(const dt_tensor_meta_t* a, const dt_tensor_meta_t* b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

dt_status_t dt__adamw_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  (void)out_meta;
  *n_out = 0;
  *n = 0;
  static const char* const names[5] = {"param", "grad", "exp_avg", "exp_avg_sq", "step"};
  const dt_tensor_meta_t* in = call->in;
  if (in[0].dtype != DT_F32 || in[1].dtype != DT_F32)
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: param and grad must be f32 (got %s, %s)",
                   dt_dtype_name(in[0].dtype), dt_dtype_name(in[1].dtype));
  if ((in[2].dtype != DT_F32 && in[2].dtype != DT_BF16) || in[3].dtype != in[2].dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: exp_avg and exp_avg_sq must both be f32 or both "
                   "bf16 (got %s, %s)", dt_dtype_name(in[2].dtype), dt_dtype_name(in[3].dtype));
  for (int t = 1; t < 4; t++)
    if (!dt__same_shape(&in[t], &in[0]))
      return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: %s's shape differs from param's", names[t]);
  if (in[4].dtype != DT_I64 || in[4].ndim != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: step must be a 0-d i64 tensor");
  const double lr = dt__op_farg(DT_OP_ADAMW, call, 0), b1 = dt__op_farg(DT_OP_ADAMW, call, 1),
               b2 = dt__op_farg(DT_OP_ADAMW, call, 2), eps = dt__op_farg(DT_OP_ADAMW, call, 3),
               wd = dt__op_farg(DT_OP_ADAMW, call, 4);
  /* the one argument that is wrong, its value and what is valid (fargs in schema order) */
  if (!isfinite(lr))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: lr=%g (fargs[0]) must be finite", lr);
  if (!(b1 >= 0.0 && b1 < 1.0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: beta1=%g (fargs[1]) out of range [0, 1) (default "
                   "0.9)", b1);
  if (!(b2 >= 0.0 && b2 < 1.0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: beta2=%g (fargs[2]) out of range [0, 1) (default "
                   "0.999)", b2);
  if (!(eps > 0.0) || !isfinite(eps))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: eps=%g (fargs[3]) must be finite and > 0 (default "
                   "1e-8)", eps);
  if (!(wd >= 0.0) || !isfinite(wd))
    return DT_FAIL(DT_ERR_INVALID_ARG, "adamw: weight_decay=%g (fargs[4]) must be finite and >= 0 "
                   "(default 0)", wd);
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__push(rules, cap, n, &r);
  for (int d = 0; d < in[0].ndim; d++) {
    for (int t = 0; t < 4; t++) r.in[t] = dt_shard(d);
    r.in[4] = dt_replicate();
    dt__push(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__scale_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  (void)out_meta;
  *n_out = 0;
  *n = 0;
  if (!dt__is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "scale_: a float tensor is needed (got %s)",
                   dt_dtype_name(call->in[0].dtype));
  double alpha = dt__op_farg(DT_OP_SCALE_, call, 0);
  if (isnan(alpha)) return DT_FAIL(DT_ERR_INVALID_ARG, "scale_: alpha is NaN");
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__push(rules, cap, n, &r);
  for (int d = 0; d < call->in[0].ndim; d++) {
    r.in[0] = dt_shard(d);
    dt__push(rules, cap, n, &r);
  }
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    int linear = op == DT_REDUCE_SUM || op == DT_REDUCE_AVG;
    if (!linear && !(alpha >= 0.0)) continue;
    r.in[0] = dt_partial((dt_reduce_op_t)op);
    dt__push(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__sumsq_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  if (!dt__is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "sumsq: a float tensor is needed (got %s)",
                   dt_dtype_name(call->in[0].dtype));
  out_meta[0].dtype = DT_F32;
  out_meta[0].ndim = 0;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__push(rules, cap, n, &r);
  for (int d = 0; d < call->in[0].ndim; d++) {
    r.in[0] = dt_shard(d);
    r.out[0] = dt_partial(DT_REDUCE_SUM);
    dt__push(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

/* rules_nn.c - rule generators of the model ops: addmm, scalar ops, pow, where/masked_fill, casts,
 * scaled dot-product attention, rotary embedding, topk, gather, scatter_add and dropout.
 *
 * Partial rules follow linearity in each input for each reduce op:
 *   add_scalar  x + s:        P(avg), P(max), P(min) pass (a P(sum) would add s once per rank)
 *   mul_scalar  x * s:        P(sum), P(avg); P(max)/P(min) too for s >= 0 (swapped for s < 0)
 *   where(c, a, b):           [P(op); R, P(op), P(op)] for every op (an elementwise selection)
 *   masked_fill(x, m, v):     P(avg), P(max), P(min) pass
 *   rotary, dropout:          linear in x: P(sum), P(avg)
 *   gather:                   a selection: every Partial of x passes; x sharded on the gathered
 *                             dim gives P(sum) by a masked local gather
 *   scatter_add(x, i, src):   linear in (x, src): [P(op); P(op), R, P(op)] for sum/avg
 *   expm1 / log1p:            non-decreasing: P(max), P(min) pass / P(min) passes (NaN below -1)
 *   floor, ceil, round,       non-decreasing: P(max), P(min) pass; sign only for integers
 *   trunc, erf, sign:         (sign(NaN) = 0)
 *   pow, cast, sdpa, topk:    non-linear: Partial inputs are reduced first
 */
#include <math.h>
#include <stdio.h>

#include "strategy/strategy.h"
#include "tensor/tensor.h" /* dt__fill_check */

static int dt__add(dt_op_rule_t* rules, int cap, int* n, const dt_op_rule_t* r) {
  if (*n >= cap) return 0;
  rules[(*n)++] = *r;
  return 1;
}

static int64_t dt__norm_dim(int64_t d, int nd) { return d < 0 ? d + nd : d; }

static int dt__is_index(dt_dtype_t t) { return t == DT_I32 || t == DT_I64; }

/* [P(op); P(op) on the inputs in `mask`, R elsewhere] for each op whose bit is in `ops`. */
static void dt__partial_rules(dt_op_rule_t* rules, int cap, int* n, int n_inputs, unsigned mask,
                              unsigned ops) {
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    if (!(ops & (1u << op))) continue;
    dt_op_rule_t r;
    memset(&r, 0, sizeof r);
    r.out[0] = dt_partial((dt_reduce_op_t)op);
    for (int t = 0; t < n_inputs; t++)
      if (mask & (1u << t)) r.in[t] = r.out[0];
    dt__add(rules, cap, n, &r);
  }
}
#define DT__OPS_LINEAR ((1u << DT_REDUCE_SUM) | (1u << DT_REDUCE_AVG))
#define DT__OPS_ALL ((1u << DT_REDUCE_COUNT) - 1u)
#define DT__OPS_NOSUM (DT__OPS_ALL & ~(1u << DT_REDUCE_SUM))
#define DT__OPS_MAXMIN ((1u << DT_REDUCE_MAX) | (1u << DT_REDUCE_MIN))

/* ---------------------------------------------------------------------------------------------
 * addmm (input, mat1, mat2), fargs [beta, alpha] (default 1, 1): beta * input + alpha * m1 m2;
 * input (n) or (m, n). The input follows the output like linear's bias. */

dt_status_t dt__addmm_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                   int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  if (call->n_fargs > 2) return DT_FAIL(DT_ERR_INVALID_ARG, "addmm takes fargs [beta, alpha]");
  dt_op_call_t mm = *call;
  mm.n_inputs = 2;
  mm.in[0] = call->in[1];
  mm.in[1] = call->in[2];
  DT_CHECK(dt__rules_einsum("mk,kn->mn", &mm, 1, out_meta, rules, cap, n));
  const dt_tensor_meta_t* b = &call->in[0];
  int64_t M = out_meta->shape[0], N = out_meta->shape[1];
  int two = b->ndim == 2;
  if (b->dtype != out_meta->dtype || !((b->ndim == 1 && b->shape[0] == N) ||
                                       (two && b->shape[0] == M && b->shape[1] == N)))
    return DT_FAIL(DT_ERR_INVALID_ARG, "addmm: input must be a %s tensor of (%lld) or (%lld, %lld)",
                   dt_dtype_name(out_meta->dtype), (long long)N, (long long)M, (long long)N);
  for (int k = 0; k < *n; k++) {
    dt_op_rule_t* r = &rules[k];
    r->in[2] = r->in[1];
    r->in[1] = r->in[0];
    dt_placement_t o = r->out[0];
    r->in[0] = o.kind == DT_PARTIAL ? o
               : o.kind == DT_SHARD ? (two ? o : o.dim == 1 ? dt_shard(0) : dt_replicate())
                                    : dt_replicate();
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * scalar ops, pow, cast */

/* The common part of the scalar ops: one float scalar, a float tensor, pointwise rules. */
static dt_status_t dt__scalar_common(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                     int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  if (call->n_fargs != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes one scalar in fargs, got %d", call->op,
                   call->n_fargs);
  if (!dt__dtype_is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s needs a float tensor, got %s", call->op,
                   dt_dtype_name(call->in[0].dtype));
  return dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n);
}

dt_status_t dt__add_scalar_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                 dt_op_rule_t* rules, int cap, int* n) {
  DT_CHECK(dt__scalar_common(call, out_meta, n_out, rules, cap, n));
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_NOSUM);
  return DT_SUCCESS;
}

dt_status_t dt__mul_scalar_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                 dt_op_rule_t* rules, int cap, int* n) {
  DT_CHECK(dt__scalar_common(call, out_meta, n_out, rules, cap, n));
  double s = call->fargs[0];
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_LINEAR);
  if (s >= 0.0) {
    dt__partial_rules(rules, cap, n, 1, 1u, (1u << DT_REDUCE_MAX) | (1u << DT_REDUCE_MIN));
  } else if (s < 0.0) { /* max(-a) = -min(a): the reduce op swaps */
    dt_op_rule_t r;
    memset(&r, 0, sizeof r);
    r.in[0] = dt_partial(DT_REDUCE_MAX);
    r.out[0] = dt_partial(DT_REDUCE_MIN);
    dt__add(rules, cap, n, &r);
    r.in[0] = dt_partial(DT_REDUCE_MIN);
    r.out[0] = dt_partial(DT_REDUCE_MAX);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

/* pow: non-linear, no Partial */
/* pow's exponent is a double, so an integer tensor is refused: PyTorch's result dtype depends on
 * the exponent's Python type (torch.pow(i64, 2) is i64, torch.pow(i64, 2.0) f32), which a double
 * cannot tell; a cast names the dtype the caller wants. */
dt_status_t dt__pow_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                          dt_op_rule_t* rules, int cap, int* n) {
  if (!dt__dtype_is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "pow: %s tensors are not supported (its exponent is a "
                   "float scalar, so the result dtype PyTorch would give, an integer for an "
                   "integer exponent or f32, is unknown): cast x to a float dtype first, or "
                   "multiply integers with mul", dt_dtype_name(call->in[0].dtype));
  return dt__scalar_common(call, out_meta, n_out, rules, cap, n);
}

/* clamp, fargs [min, max] (either NaN or absent: no bound on that side). Monotone non-decreasing,
 * so clamp(max_i x_i) = max_i clamp(x_i): Partial(max) and Partial(min) pass through. */
dt_status_t dt__clamp_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  const double lo = dt__op_farg(DT_OP_CLAMP, call, 0), hi = dt__op_farg(DT_OP_CLAMP, call, 1);
  if (call->n_fargs > 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "clamp takes fargs [min, max], got %d values",
                   call->n_fargs);
  if (isnan(lo) && isnan(hi))
    return DT_FAIL(DT_ERR_INVALID_ARG, "clamp: give min or max (fargs [min, max]; NaN or absent "
                   "means no bound on that side), as PyTorch's 'at least one of min or max'");
  if (!dt__dtype_is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "clamp needs a float tensor (f32, bf16, f16), got %s "
                   "(cast it first)", dt_dtype_name(call->in[0].dtype));
  /* a finite bound past the dtype's range is refused, as PyTorch ("cannot be converted") */
  if (!isnan(lo)) DT_CHECK(dt__fill_check(call->in[0].dtype, lo, "clamp: min"));
  if (!isnan(hi)) DT_CHECK(dt__fill_check(call->in[0].dtype, hi, "clamp: max"));
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_MAXMIN);
  return DT_SUCCESS;
}

/* expm1 and log1p: non-decreasing, so f(max_i x_i) = max_i f(x_i) and f(min_i x_i) = min_i f(x_i)
 * (glibc 2.36's expm1f and log1pf are non-decreasing over every f32: checked exhaustively; CUDA's
 * are not checked, so a device might differ from reducing first by its ulp where two partials
 * are an ulp apart; rounding to bf16 / f16 keeps the order; the Partial(max/min) reductions
 * propagate NaN). expm1 maps every number to a number: P(max) and P(min) pass. log1p is NaN
 * below -1: a rank's x < -1 makes max_i log1p(x_i) NaN where log1p(max_i x_i) need not be, so
 * only P(min) passes (a minimum below -1 is NaN both ways). P(sum) and P(avg) are reduced first. */
dt_status_t dt__expm1_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_MAXMIN);
  return DT_SUCCESS;
}
dt_status_t dt__log1p_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  dt__partial_rules(rules, cap, n, 1, 1u, 1u << DT_REDUCE_MIN);
  return DT_SUCCESS;
}

/* floor, ceil, trunc, round and erf: non-decreasing, so P(max) and P(min) pass with no move, as
 * expm1's (floorf, ceilf, truncf and nearbyintf are exact, so monotone; round's x * 10^d (or
 * x / 10^d), its rounding to bf16, nearbyintf and the division back are each non-decreasing for
 * 10^d > 0, and an infinite 10^d makes every element NaN both ways; glibc 2.36's erff is
 * non-decreasing over every f32: checked exhaustively; CUDA's is not checked, as expm1's). Each
 * maps NaN to NaN, which the Partial(max/min) reductions propagate. An integer tensor (floor,
 * ceil, trunc and round keep it unchanged) passes P(max) and P(min) alike; P(sum) and P(avg) are
 * reduced first (an integer P(avg) would truncate, see dt__rules_pointwise). erf's integers are
 * cast to f32 by dispatch (DT__F0). */
dt_status_t dt__monotone_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                               dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_MAXMIN);
  return DT_SUCCESS;
}

/* round, iargs [decimals] (default 0): nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) *
 * 10^-d for d < 0, as torch 1.13's round_decimals_kernel. PyTorch 1.13 has no round with
 * decimals != 0 for integers ("round_cpu" not implemented for 'Int') nor for f16 at all; an
 * integer with decimals 0 is kept as torch.round(int), an f16 with decimals 0 is f32 rounded
 * once (exact: every f16 integer is an f16). */
dt_status_t dt__round_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  if (call->n_iargs > 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "round takes iargs [decimals], got %d values",
                   call->n_iargs);
  const int64_t d = dt__op_iarg(DT_OP_ROUND, call, 0);
  const dt_dtype_t t = call->in[0].dtype;
  if (d != 0 && (!dt__dtype_is_float(t) || t == DT_F16))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "round: decimals=%lld of a %s tensor is not supported "
                   "(PyTorch 1.13 has no such kernel: cast it to f32 or bf16 first, or give "
                   "decimals=0)", (long long)d, dt_dtype_name(t));
  return dt__monotone_rules(call, out_meta, n_out, rules, cap, n);
}

/* sign: -1, 0 or 1 in x's dtype, non-decreasing, but sign(NaN) = 0 (PyTorch's (0 < x) - (x < 0)):
 * a rank's NaN makes max_i x_i NaN, so sign(max_i x_i) = 0 where max_i sign(x_i) need not be.
 * Only an integer tensor (no NaN) passes P(max) and P(min); a float one is reduced first. */
dt_status_t dt__sign_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                           dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  if (!dt__dtype_is_float(call->in[0].dtype))
    dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_MAXMIN);
  return DT_SUCCESS;
}

dt_status_t dt__cast_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                  int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  if (call->n_iargs != 1 || call->iargs[0] < 0 || call->iargs[0] >= DT_DTYPE_COUNT ||
      !dt__dtype_valid((int)call->iargs[0]))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cast takes iargs [dtype] (a dt_dtype_t value)");
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  out_meta->dtype = (dt_dtype_t)call->iargs[0];
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * where (cond, a, b) and masked_fill (x, mask), fargs [value] */

static dt_status_t dt__select_rules(int where, const dt_op_call_t* call,
                                    dt_tensor_meta_t* out_meta, int* n_out, dt_op_rule_t* rules,
                                    int cap, int* n) {
  *n_out = 1;
  int ci = where ? 0 : 1, vi = where ? 1 : 0;
  /* the condition / mask may be of any dtype (nonzero = true, NaN too): the comparisons give
   * 1 / 0 in their operands' dtype, there being no bool dtype */
  if (where && call->in[1].dtype != call->in[2].dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "where: a and b differ in dtype (%s vs %s)",
                   dt_dtype_name(call->in[1].dtype), dt_dtype_name(call->in[2].dtype));
  if (!where && call->n_fargs != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "masked_fill takes fargs [value]");
  /* the value must fit x's dtype, as PyTorch's masked_fill ("value cannot be converted to type
   * ... without overflow"): an i32 x takes [-2^31, 2^31 - 1] before the truncation toward zero
   * (2147483647.5 is refused), an i64 x [-2^63, 2^63) (NaN and infinities neither), a float x
   * any value its dtype holds (infinities and NaN too) */
  if (!where) {
    const double v = call->fargs[0];
    if (call->in[0].dtype == DT_I32 && !(v >= -0x1p31 && v <= 0x1p31 - 1))
      return DT_FAIL(DT_ERR_INVALID_ARG, "masked_fill: value=%.17g does not fit dtype i32 "
                     "(valid: -2^31 to 2^31 - 1, a fraction then truncated toward zero)", v);
    DT_CHECK(dt__fill_check(call->in[0].dtype, v, "masked_fill: value"));
  }
  dt_op_call_t c = *call;
  c.in[ci].dtype = call->in[vi].dtype;
  DT_CHECK(dt__rules_pointwise(&c, DT_LIN_NONE, out_meta, rules, cap, n));
  if (where) dt__partial_rules(rules, cap, n, 3, 6u, DT__OPS_ALL);
  else /* P(max) and P(min) only: a P(avg) would sum k copies of the value before dividing,
        * which wraps in integers and overflows to inf in floats (f16 60000 on 2 ranks) or
        * rounds off by an ulp (3 v / 3) */
    dt__partial_rules(rules, cap, n, 2, 1u, DT__OPS_MAXMIN);
  return DT_SUCCESS;
}

dt_status_t dt__where_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  return dt__select_rules(1, call, out_meta, n_out, rules, cap, n);
}
dt_status_t dt__masked_fill_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                  dt_op_rule_t* rules, int cap, int* n) {
  return dt__select_rules(0, call, out_meta, n_out, rules, cap, n);
}

/* ---------------------------------------------------------------------------------------------
 * scaled dot-product attention: q (B, H, S, D), k (B, G, T, D), v (B, G, T, E) with H a multiple
 * of G (grouped-query heads: q head h reads kv head h / (H / G)); iargs [causal, layout] with
 * layout 1 meaning (B, S, H, D) tensors instead (no transposes around attention), fargs [scale]
 * (default 1/sqrt(D)). Out has q's layout with E last. Batch or heads sharded on all three;
 * queries sharded on S with k, v whole (the causal mask uses global query positions). */

dt_status_t dt__sdpa_layout(const dt_op_call_t* call, int* hd, int* sd) {
  /* sdpa and sdpa_grad share "causal=0, layout=0, scale:f?" (test_op_table checks it) */
  const int64_t causal = dt__op_iarg(DT_OP_SDPA, call, 0);
  const int64_t layout = dt__op_iarg(DT_OP_SDPA, call, 1);
  if (causal != 0 && causal != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: causal=%lld (iargs[0]), expected 0 or 1", call->op,
                   (long long)causal);
  if (layout != 0 && layout != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: layout=%lld (iargs[1]), expected 0 (B, H, S, D) or 1 "
                   "(B, S, H, D)", call->op, (long long)layout);
  const double scale = dt__op_farg(DT_OP_SDPA, call, 0);
  if (isinf(scale))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: scale=%g (fargs[0]): expected a finite number (absent "
                   "or NaN: 1/sqrt(D))", call->op, scale);
  *hd = layout ? 2 : 1;
  *sd = layout ? 1 : 2;
  return DT_SUCCESS;
}

dt_status_t dt__sdpa_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                  int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int hd, sd;
  DT_CHECK(dt__sdpa_layout(call, &hd, &sd));
  const dt_tensor_meta_t *q = &call->in[0], *k = &call->in[1], *v = &call->in[2];
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
    return DT_FAIL(DT_ERR_INVALID_ARG, "sdpa: q, k, v must be 4-dim (%s)",
                   hd == 1 ? "B, H, S, D" : "B, S, H, D");
  if (!dt__dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "sdpa: q, k, v must share one float dtype");
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] ||
      v->shape[hd] != k->shape[hd] || v->shape[sd] != k->shape[sd])
    return DT_FAIL(DT_ERR_INVALID_ARG, "sdpa: shapes q %lldx%lldx%lldx%lld, k %lldx%lldx%lldx%lld "
                   "and v %lldx%lldx%lldx%lld do not match (batch alike, k and v alike but for "
                   "the last dim, q's last dim k's)", (long long)q->shape[0],
                   (long long)q->shape[1], (long long)q->shape[2], (long long)q->shape[3],
                   (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                   (long long)k->shape[3], (long long)v->shape[0], (long long)v->shape[1],
                   (long long)v->shape[2], (long long)v->shape[3]);
  if (k->shape[hd] == 0 || q->shape[hd] % k->shape[hd] != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, k->shape[hd] == 0 ? "sdpa: k has 0 kv heads (valid: 1 or "
                   "more, %lld query heads a multiple of them)" : "sdpa: %lld query heads are not "
                   "a multiple of %lld kv heads", (long long)q->shape[hd],
                   (long long)k->shape[hd]);
  *out_meta = *q;
  out_meta->shape[3] = v->shape[3];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  const int dims[2] = {0, hd};
  for (int j = 0; j < 2; j++) {
    r.out[0] = r.in[0] = r.in[1] = r.in[2] = dt_shard(dims[j]);
    dt__add(rules, cap, n, &r);
  }
  memset(&r, 0, sizeof r);
  r.out[0] = r.in[0] = dt_shard(sd);
  dt__add(rules, cap, n, &r);
  return DT_SUCCESS;
}

/* Heads sharded: each rank's kv heads must be exactly the groups of its query heads. */
int dt__sdpa_check(dt_mesh_t mesh, const dt_op_call_t* call, const dt_op_choice_t* c) {
  int hd, sd;
  if (dt__sdpa_layout(call, &hd, &sd) != DT_SUCCESS) return 0;
  int heads = 0;
  for (int i = 0; i < mesh->ndim; i++)
    heads |= c->in[0][i].kind == DT_SHARD && c->in[0][i].dim == hd;
  int64_t H = call->in[0].shape[hd], G = call->in[1].shape[hd];
  if (!heads || H == G) return 1;
  dt_layout_t lq, lk;
  if (!dt__layout_try(&lq, mesh->ndim, mesh->shape, 4, call->in[0].shape, c->in[0]) ||
      !dt__layout_try(&lk, mesh->ndim, mesh->shape, 4, call->in[1].shape, c->in[1]))
    return 0;
  int64_t rep = H / G;
  for (int p = 0; p < mesh->numel; p++) {
    int coords[DT_MAX_MESH_DIMS];
    dt__grid_coords(mesh->ndim, mesh->shape, p, coords);
    int64_t qo[DT_MAX_DIMS], ql[DT_MAX_DIMS], ko[DT_MAX_DIMS], kl[DT_MAX_DIMS];
    dt__layout_box(&lq, coords, qo, ql);
    dt__layout_box(&lk, coords, ko, kl);
    if (ql[hd] != kl[hd] * rep || (ql[hd] > 0 && qo[hd] != ko[hd] * rep)) return 0;
  }
  return 1;
}

/* ---------------------------------------------------------------------------------------------
 * rotary embedding: x (..., S, ..., D) with D even, iargs [seq_dim] (default 1), fargs [theta]
 * (default 10000). Pairs (x[2i], x[2i+1]) turn by pos * theta^(-2i/D), pos the global index along
 * seq_dim (Meta Llama's interleaved convention); iargs[1] = 1 turns the other way (the inverse,
 * which is the gradient); iargs[2] = cp > 0: the sequence is in context parallelism's
 * load-balanced order of cp ranks, pos the real position of the index (dt_cp_position). Any dim
 * but the last may be sharded. */

dt_status_t dt__rotary_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                    int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  const int64_t seq_dim = dt__op_iarg(DT_OP_ROTARY, call, 0); /* the schema's seq_dim=1 */
  int64_t sd = dt__norm_dim(seq_dim, x->ndim);
  if (x->ndim < 2 || sd < 0 || sd >= x->ndim - 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "rotary: seq_dim=%lld (iargs[0]) for a %d-dim x: x must be "
                   "(.., S, .., D) with seq_dim any dim but the last (valid: %d to %d)",
                   (long long)seq_dim, x->ndim, x->ndim >= 2 ? -x->ndim : 0,
                   x->ndim >= 2 ? x->ndim - 2 : -1);
  const int64_t inverse = dt__op_iarg(DT_OP_ROTARY, call, 1);
  if (inverse != 0 && inverse != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "rotary: inverse=%lld (iargs[1]), expected 0 or 1",
                   (long long)inverse);
  if (x->shape[x->ndim - 1] % 2 != 0 || !dt__dtype_is_float(x->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "rotary: the last dim must be even and the dtype float");
  const int64_t cp = dt__op_iarg(DT_OP_ROTARY, call, 2);
  if (cp < 0 || cp > (1 << 20))
    return DT_FAIL(DT_ERR_INVALID_ARG, "rotary: cp=%lld (iargs[2]) out of range (valid: 0, no "
                   "context parallelism, to 2^20 ranks)", (long long)cp);
  if (cp > 0 && x->shape[sd] % (2 * cp) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "rotary: cp=%lld (iargs[2]): the sequence of %lld tokens "
                   "in the load-balanced order of cp ranks must split into 2 cp equal chunks",
                   (long long)cp, (long long)x->shape[sd]);
  *out_meta = *x;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d + 1 < x->ndim; d++) {
    r.out[0] = r.in[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_LINEAR);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * topk: iargs [k, dim(, largest 1|0)] -> values (x's dtype) and indices (i64), sorted; ties go to
 * the lower index. The dim must be whole; other dims stay sharded. */

dt_status_t dt__topk_args(const dt_op_call_t* call, int64_t* k, int* dim, int* largest) {
  const dt_tensor_meta_t* x = &call->in[0];
  if (call->n_iargs < 2 || call->n_iargs > 3)
    return DT_FAIL(DT_ERR_INVALID_ARG, "topk takes iargs [k, dim(, largest=1)]; n_iargs=%d",
                   call->n_iargs);
  int64_t d = dt__norm_dim(call->iargs[1], x->ndim);
  if (d < 0 || d >= x->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "topk: dim=%lld (iargs[1]) out of range for a %d-dim x",
                   (long long)call->iargs[1], x->ndim);
  if (call->iargs[0] < 0 || call->iargs[0] > x->shape[d])
    return DT_FAIL(DT_ERR_INVALID_ARG, "topk: k=%lld (iargs[0]) out of range [0, %lld]",
                   (long long)call->iargs[0], (long long)x->shape[d]);
  const int64_t lg = dt__op_iarg(DT_OP_TOPK, call, 2); /* the schema's largest=1 */
  if (lg != 0 && lg != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "topk: largest=%lld (iargs[2]), expected 0 or 1",
                   (long long)lg);
  *k = call->iargs[0];
  *dim = (int)d;
  *largest = (int)lg;
  return DT_SUCCESS;
}

dt_status_t dt__topk_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                  int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 2;
  *n = 0;
  int64_t k;
  int dim, largest;
  DT_CHECK(dt__topk_args(call, &k, &dim, &largest));
  if (!dt__dtype_is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "topk needs a float tensor");
  out_meta[0] = call->in[0];
  out_meta[0].shape[dim] = k;
  out_meta[1] = out_meta[0];
  out_meta[1].dtype = DT_I64;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < call->in[0].ndim; d++) {
    if (d == dim) continue;
    r.out[0] = r.out[1] = r.in[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * gather (x, idx) iargs [dim]: out[..i..] = x[..idx[..i..]..] along dim, out shape = idx shape
 * (every other dim of idx at most x's). scatter_add (x, idx, src) iargs [dim]: x with
 * x[..idx[..i..]..] += src[..i..] along dim; idx and src share a shape. */

static dt_status_t dt__gather_common(const dt_op_call_t* call, int nsrc, int* dim) {
  const dt_tensor_meta_t *x = &call->in[0], *ix = &call->in[1];
  if (call->n_iargs != 1) return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes iargs [dim]", call->op);
  int64_t d = dt__norm_dim(call->iargs[0], x->ndim);
  if (d < 0 || d >= x->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dim %lld out of range", call->op,
                   (long long)call->iargs[0]);
  if (!dt__is_index(ix->dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: indices must be i32 or i64, got %s", call->op,
                   dt_dtype_name(ix->dtype));
  if (ix->ndim != x->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: indices must have %d dims", call->op, x->ndim);
  for (int e = 0; e < x->ndim; e++)
    if (e != d && ix->shape[e] > x->shape[e])
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: indices dim %d (%lld) exceeds x's (%lld)", call->op,
                     e, (long long)ix->shape[e], (long long)x->shape[e]);
  if (nsrc) {
    const dt_tensor_meta_t* s = &call->in[2];
    if (s->dtype != x->dtype || s->ndim != ix->ndim ||
        memcmp(s->shape, ix->shape, sizeof(int64_t) * (size_t)ix->ndim) != 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "scatter_add: src must have x's dtype and idx's shape");
  }
  *dim = (int)d;
  return DT_SUCCESS;
}

dt_status_t dt__gather_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                    int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int dim;
  DT_CHECK(dt__gather_common(call, 0, &dim));
  const dt_tensor_meta_t *x = &call->in[0], *ix = &call->in[1];
  *out_meta = *ix;
  out_meta->dtype = x->dtype;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < x->ndim; d++) {
    if (d == dim || ix->shape[d] != x->shape[d]) continue;
    r.out[0] = r.in[0] = r.in[1] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  memset(&r, 0, sizeof r);
  r.out[0] = dt_partial(DT_REDUCE_SUM);
  r.in[0] = dt_shard(dim);
  dt__add(rules, cap, n, &r);
  dt__partial_rules(rules, cap, n, 2, 1u, DT__OPS_ALL);
  return DT_SUCCESS;
}

dt_status_t dt__scatter_add_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                         int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int dim;
  DT_CHECK(dt__gather_common(call, 1, &dim));
  const dt_tensor_meta_t *x = &call->in[0], *ix = &call->in[1];
  *out_meta = *x;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < x->ndim; d++) {
    if (d == dim || ix->shape[d] != x->shape[d]) continue;
    r.out[0] = r.in[0] = r.in[1] = r.in[2] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  /* x sharded along dim: each rank adds only the updates landing in its rows */
  memset(&r, 0, sizeof r);
  r.out[0] = r.in[0] = dt_shard(dim);
  dt__add(rules, cap, n, &r);
  dt__partial_rules(rules, cap, n, 3, 5u, DT__OPS_LINEAR);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * dropout: fargs [p], iargs [seed]; element g (global row-major index) is kept when
 * hash(seed, g) >= p, kept values scaled by 1/(1-p): the mask does not depend on placements. */

dt_status_t dt__dropout_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                     int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  if (call->n_fargs != 1 || call->n_iargs != 1 || !(call->fargs[0] >= 0.0) ||
      !(call->fargs[0] <= 1.0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "dropout takes fargs [p in 0..1] and iargs [seed]");
  if (!dt__dtype_is_float(call->in[0].dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "dropout needs a float tensor");
  DT_CHECK(dt__rules_pointwise(call, DT_LIN_NONE, out_meta, rules, cap, n));
  dt__partial_rules(rules, cap, n, 1, 1u, DT__OPS_LINEAR);
  return DT_SUCCESS;
}

/* rules.c - built-in single-mesh-dim rule generators: the matmul family from einsum equations and
 * pointwise ops with broadcasting and Partial linearity.
 *
 * Rule tables (per mesh dim; [out; inputs]):
 *   mm  "mk,kn->mn":  [R; R, R]  [S0; S0, R]  [S1; R, S1]  [P; S1, S0]  [P; P, R]  [P; R, P]
 *   bmm "bmk,bkn->bmn": [S0; S0, S0] (batch) plus the mm rules shifted by one dim
 *   add/sub:  [S(d); S(d) or R if broadcast, ...]  [P(op); P(op), P(op)]      op in {sum, avg}
 *   mul:      [S(d); ...]  [P(op); P(op), R]  [P(op); R, P(op)]
 *   div:      [S(d); ...]  [P(op); P(op), R]
 *   neg:      [S(d); S(d)]  [P(op); P(op)];   relu, exp, ...: [S(d); S(d)] only
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>

#include "strategy/strategy.h"

static int dt__add_rule(dt_op_rule_t* rules, int cap, int* n, const dt_op_rule_t* r) {
  if (*n >= cap) return 0;
  rules[(*n)++] = *r;
  return 1;
}

/* [P(op); P(op) on input `t`, R elsewhere] for op in {sum, avg}: the op is linear in input t. */
static void dt__add_linear_rules(dt_op_rule_t* rules, int cap, int* n, int t) {
  for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
    dt_op_rule_t r;
    memset(&r, 0, sizeof r);
    r.out[0] = r.in[t] = dt_partial((dt_reduce_op_t)op);
    dt__add_rule(rules, cap, n, &r);
  }
}

dt_status_t dt__rules_einsum(const char* eq, const dt_op_call_t* call, int bilinear,
                             dt_tensor_meta_t* out_meta, dt_op_rule_t* rules, int cap,
                             int* n_rules) {
  *n_rules = 0;
  /* Parse "ab,bc->ac". */
  char ins[DT_OP_MAX_INPUTS][DT_MAX_DIMS + 1], out[DT_MAX_DIMS + 1];
  int nin = 0, k = 0;
  const char* p = eq;
  memset(ins, 0, sizeof ins);
  memset(out, 0, sizeof out);
  while (*p && *p != '-') {
    if (*p == ',') {
      nin++;
      k = 0;
    } else if (isalpha((unsigned char)*p) && nin < DT_OP_MAX_INPUTS && k < DT_MAX_DIMS) {
      ins[nin][k++] = *p;
    }
    p++;
  }
  nin++;
  if (p[0] != '-' || p[1] != '>') return DT_FAIL(DT_ERR_INTERNAL, "bad einsum '%s'", eq);
  snprintf(out, sizeof out, "%s", p + 2);
  if (nin > call->n_inputs) /* extra inputs (a bias) are placed by the caller's generator */
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes %d inputs", call->op, nin);
  /* Sizes per letter, checked across operands. */
  int64_t size[128];
  for (int c = 0; c < 128; c++) size[c] = -1;
  for (int t = 0; t < nin; t++) {
    int nd = (int)strlen(ins[t]);
    if (call->in[t].ndim != nd)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input %d must have %d dims, has %d (operands %s)",
                     call->op, t, nd, call->in[t].ndim, eq);
    if (call->in[t].dtype != call->in[0].dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dtype mismatch (%s vs %s)", call->op,
                     dt_dtype_name(call->in[t].dtype), dt_dtype_name(call->in[0].dtype));
    for (int d = 0; d < nd; d++) {
      int c = ins[t][d];
      if (size[c] >= 0 && size[c] != call->in[t].shape[d])
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: shape mismatch on '%c': %lld vs %lld (input %d "
                       "dim %d; operands %s)", call->op, c, (long long)size[c],
                       (long long)call->in[t].shape[d], t, d, eq);
      size[c] = call->in[t].shape[d];
    }
  }
  out_meta->dtype = call->in[0].dtype;
  out_meta->ndim = (int)strlen(out);
  for (int d = 0; d < out_meta->ndim; d++) out_meta->shape[d] = size[(int)out[d]];

  dt_op_rule_t r;
  memset(&r, 0, sizeof r); /* all R */
  dt__add_rule(rules, cap, n_rules, &r);
  /* One rule per distinct letter, in order of first appearance. */
  char seen[128] = {0};
  for (int t = 0; t <= nin; t++) {
    const char* s = t < nin ? ins[t] : out;
    for (int d = 0; s[d]; d++) {
      int c = s[d];
      if (seen[c]) continue;
      seen[c] = 1;
      const char* o = strchr(out, c);
      memset(&r, 0, sizeof r);
      r.out[0] = o ? dt_shard((int)(o - out)) : dt_partial(DT_REDUCE_SUM);
      for (int u = 0; u < nin; u++) {
        const char* q = strchr(ins[u], c);
        r.in[u] = q ? dt_shard((int)(q - ins[u])) : dt_replicate();
      }
      dt__add_rule(rules, cap, n_rules, &r);
    }
  }
  if (bilinear)
    for (int u = 0; u < nin; u++) dt__add_linear_rules(rules, cap, n_rules, u);
  return DT_SUCCESS;
}

dt_status_t dt__rules_pointwise(const dt_op_call_t* call, dt_linearity_t lin,
                                dt_tensor_meta_t* out_meta, dt_op_rule_t* rules, int cap,
                                int* n_rules) {
  *n_rules = 0;
  int nin = call->n_inputs, nd = 0;
  for (int t = 0; t < nin; t++) {
    if (call->in[t].ndim > nd) nd = call->in[t].ndim;
    if (call->in[t].dtype != call->in[0].dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dtype mismatch (%s vs %s)", call->op,
                     dt_dtype_name(call->in[t].dtype), dt_dtype_name(call->in[0].dtype));
  }
  /* numpy broadcasting, aligned from the right */
  out_meta->dtype = call->in[0].dtype;
  out_meta->ndim = nd;
  for (int d = 0; d < nd; d++) {
    int64_t s = 1;
    for (int t = 0; t < nin; t++) {
      int td = d - (nd - call->in[t].ndim);
      if (td < 0) continue;
      int64_t v = call->in[t].shape[td];
      if (v != 1 && s != 1 && v != s)
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: shapes do not broadcast at dim %d (%lld vs %lld)",
                       call->op, d, (long long)s, (long long)v);
      if (v != 1) s = v;
    }
    out_meta->shape[d] = s;
  }
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n_rules, &r);
  for (int d = 0; d < nd; d++) {
    memset(&r, 0, sizeof r);
    r.out[0] = dt_shard(d);
    for (int t = 0; t < nin; t++) {
      int td = d - (nd - call->in[t].ndim);
      /* a broadcast dim (missing or size 1 against a larger output) is R for that input */
      r.in[t] = (td >= 0 && call->in[t].shape[td] == out_meta->shape[d]) ? dt_shard(td)
                                                                         : dt_replicate();
    }
    dt__add_rule(rules, cap, n_rules, &r);
  }
  /* an integer P(avg) is a truncating division of the sum: avg(a) + avg(b) and avg(a + b) may
   * round apart (a = b = (1, 0) on 2 ranks: 0 against 1), so integers pass P(sum) only */
  const int integer = !dt__dtype_is_float(call->in[0].dtype);
  for (int op = DT_REDUCE_SUM; op < DT_REDUCE_COUNT; op++) {
    dt_placement_t P = dt_partial((dt_reduce_op_t)op);
    int linear_op = op == DT_REDUCE_SUM || (op == DT_REDUCE_AVG && !integer);
    memset(&r, 0, sizeof r);
    r.out[0] = P;
    switch (lin) {
      case DT_LIN_UNARY:
      case DT_LIN_ADDITIVE:
        if (!linear_op) break;
        for (int t = 0; t < nin; t++) r.in[t] = P;
        dt__add_rule(rules, cap, n_rules, &r);
        break;
      case DT_LIN_MULT:
      case DT_LIN_NUMERATOR:
        if (!linear_op) break;
        for (int t = 0; t < (lin == DT_LIN_MULT ? nin : 1); t++) {
          memset(&r, 0, sizeof r);
          r.out[0] = P;
          r.in[t] = P;
          dt__add_rule(rules, cap, n_rules, &r);
        }
        break;
      case DT_LIN_MAX:
      case DT_LIN_MIN:
        if (op != (lin == DT_LIN_MAX ? DT_REDUCE_MAX : DT_REDUCE_MIN)) break;
        for (int t = 0; t < nin; t++) r.in[t] = P;
        dt__add_rule(rules, cap, n_rules, &r);
        break;
      default: break;
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt__reduce_dims(int id, const dt_op_call_t* call, unsigned* mask, int* keepdim) {
  int nd = call->in[0].ndim;
  const int64_t keep = dt__op_iarg(id, call, 0); /* the schema's keepdim=0 when not given */
  if (keep != 0 && keep != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: keepdim=%lld (iargs[0]), expected 0 or 1; iargs are "
                   "[keepdim, dim...]", call->op, (long long)keep);
  *keepdim = (int)keep;
  *mask = 0;
  if (call->n_iargs <= 1) { /* no dims: every dim */
    *mask = nd ? (1u << nd) - 1u : 0u;
    return DT_SUCCESS;
  }
  for (int k = 1; k < call->n_iargs; k++) {
    /* a 0-d tensor's dims wrap as a 1-d one's (PyTorch): 0 and -1 name it and reduce nothing */
    const int wrap = nd ? nd : 1;
    int64_t d = call->iargs[k] < 0 ? call->iargs[k] + wrap : call->iargs[k];
    if (d < 0 || d >= wrap)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dim=%lld (iargs[%d]) out of range for a %d-dim "
                     "tensor (valid: %d to %d)", call->op, (long long)call->iargs[k], k, nd,
                     -wrap, wrap - 1);
    if (nd == 0) {
      for (int j = 1; j < k; j++)
        if (call->iargs[j] == 0 || call->iargs[j] == -1)
          return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dim=%lld (iargs[%d]) repeated; each dim at "
                         "most once", call->op, (long long)call->iargs[k], k);
      continue;
    }
    if (*mask & (1u << d))
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dim=%lld (iargs[%d]) repeated; each dim at most once",
                     call->op, (long long)call->iargs[k], k);
    *mask |= 1u << d;
  }
  return DT_SUCCESS;
}

dt_status_t dt__var_correction(int id, const dt_op_call_t* call, double* corr) {
  *corr = dt__op_farg(id, call, 0); /* the schema's correction=1 when not given */
  if (!isfinite(*corr))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: correction=%g (fargs[0]) must be finite (1: the "
                   "unbiased estimate, 0: the population variance)", call->op, *corr);
  return DT_SUCCESS;
}

/* A reduction's output shape: in's dims, those in mask dropped (or 1 with keep); pos[d] is input
 * dim d's place in the output (-1: dropped). */
static void dt__reduced_shape(const dt_tensor_meta_t* in, unsigned mask, int keep,
                              dt_tensor_meta_t* out_meta, int* pos) {
  int nd = 0;
  for (int d = 0; d < in->ndim; d++) {
    pos[d] = -1;
    if ((mask & (1u << d)) && !keep) continue;
    pos[d] = nd;
    out_meta->shape[nd++] = (mask & (1u << d)) ? 1 : in->shape[d];
  }
  out_meta->ndim = nd;
}

/* argmax / argmin (kinds 4, 5) and logsumexp (6): the reduced dims must be whole on each rank
 * (R: argmax's indices are global positions, and neither op combines from per-rank results with
 * a Partial this library has); the kept dims stay sharded. No Partial passes: argmax(a + b) and
 * lse(a + b) are not sums of per-rank results, lse(max_i a_i) != max_i lse(a_i) (the max of the
 * ranks' tensors is taken element by element, lse sums over several of those elements), and
 * argmax of P(max) is not the argmax of one rank's tensor. argmax / argmin take at most one dim
 * (none: the index into the flattened tensor, a 0-d result, or all ones with keepdim, as
 * PyTorch) and give i64; they refuse an empty reduction (PyTorch raises). logsumexp keeps the
 * float dtype (integers are cast to f32 first, DT_OPF_INT_TO_FLOAT, as torch.logsumexp); its
 * empty reduction gives -inf. var / std (7, 8) need every reduced element on one rank for the
 * mean they centre on: Partial(sum) cannot pass (var(a + b) != var(a) + var(b)), nor P(avg)
 * (it is a sum scaled), nor P(max) / P(min) (the spread of an element-wise maximum is no
 * function of the ranks' spreads); they keep the float dtype and refuse integers with PyTorch's
 * words. prod (9) takes at most one dim, as torch.prod (none: every element); a sharded reduced
 * dim is gathered (there is no Partial(prod) to leave it in), and no Partial passes: prod(a + b)
 * is no sum of per-rank products (P(sum), P(avg)), and a product is not monotone once factors
 * may be negative (prod(max(a, b)) != max(prod a, prod b): a = (-1, -3) and b = (-2, -1) give 1
 * against 3), so P(max) / P(min) are reduced first too. Integers give i64 (wrapping, as
 * torch.prod), floats keep their dtype; an empty reduction gives 1. */
static dt_status_t dt__rules_reduce_whole(const dt_op_call_t* call, int kind, unsigned mask,
                                          int keep, dt_tensor_meta_t* out_meta,
                                          dt_op_rule_t* rules, int cap, int* n_rules) {
  const dt_tensor_meta_t* in = &call->in[0];
  if (kind <= 5 || kind == 9) {
    if (call->n_iargs > 2)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes iargs [keepdim, dim] with at most one dim (no "
                     "dim: %s), got %d dims", call->op, kind == 9 ? "the product of every "
                     "element" : "the index into the flattened tensor", call->n_iargs - 1);
    int64_t numel = 1;
    for (int d = 0; d < in->ndim; d++) numel *= in->shape[d];
    if (call->n_iargs <= 1 && numel == 0 && kind != 9)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: the tensor has no elements; give a dim of nonzero "
                     "size (as PyTorch: 'Expected reduction dim to be specified for "
                     "input.numel() == 0')", call->op);
    for (int d = 0; d < in->ndim; d++)
      if (call->n_iargs > 1 && (mask & (1u << d)) && in->shape[d] == 0 && kind != 9)
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: reduced dim %d has size 0 (the position of the "
                       "%s of no elements is undefined; PyTorch raises too)", call->op, d,
                       kind == 4 ? "maximum" : "minimum");
  } else if (kind >= 7) { /* var, std */
    double corr;
    DT_CHECK(dt__var_correction(DT_OP_SUM + kind, call, &corr));
    if (!dt__dtype_is_float(in->dtype))
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input dtype %s: std and var only support floating "
                     "point and complex dtypes (PyTorch's words; cast it to f32, bf16 or f16)",
                     call->op, dt_dtype_name(in->dtype));
  } else if (!dt__dtype_is_float(in->dtype)) { /* (dispatch casts integers to f32 before) */
    return DT_FAIL(DT_ERR_INVALID_ARG, "logsumexp: input dtype %s, expected a float dtype (f32, "
                   "bf16 or f16; an integer tensor is cast to f32 by dispatch)",
                   dt_dtype_name(in->dtype));
  }
  int pos[DT_MAX_DIMS];
  out_meta->dtype = kind <= 5 ? DT_I64 : kind == 9 ? dt__sum_dtype(in->dtype) : in->dtype;
  dt__reduced_shape(in, mask, keep, out_meta, pos);
  *n_rules = 0;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n_rules, &r);
  for (int d = 0; d < in->ndim; d++) {
    if (mask & (1u << d)) continue;
    r.in[0] = dt_shard(d);
    r.out[0] = dt_shard(pos[d]);
    dt__add_rule(rules, cap, n_rules, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__rules_reduce(const dt_op_call_t* call, int kind, dt_tensor_meta_t* out_meta,
                             dt_op_rule_t* rules, int cap, int* n_rules) {
  *n_rules = 0;
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(DT_OP_SUM + kind, call, &mask, &keep));
  const dt_tensor_meta_t* in = &call->in[0];
  const int integer = !dt__dtype_is_float(in->dtype);
  if (kind >= 4) /* argmax, argmin, logsumexp, var, std, prod */
    return dt__rules_reduce_whole(call, kind, mask, keep, out_meta, rules, cap, n_rules);
  if (kind == 1 && integer) /* torch.mean's own words */
    return DT_FAIL(DT_ERR_INVALID_ARG, "mean: could not infer output dtype: input dtype %s must "
                   "be a float dtype (f32, bf16 or f16), as torch.mean requires; cast it first, "
                   "or use sum", dt_dtype_name(in->dtype));
  for (int d = 0; d < in->ndim && kind >= 2; d++) /* amax/amin of nothing: PyTorch raises too */
    if ((mask & (1u << d)) && in->shape[d] == 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: reduced dim %d has size 0 (the %s of no elements "
                     "is undefined)", call->op, d, kind == 2 ? "maximum" : "minimum");
  int pos[DT_MAX_DIMS];
  out_meta->dtype = kind == 0 ? dt__sum_dtype(in->dtype) : in->dtype; /* sum: i32 -> i64 */
  dt__reduced_shape(in, mask, keep, out_meta, pos);
  static const dt_reduce_op_t partial_of[4] = {DT_REDUCE_SUM, DT_REDUCE_SUM, DT_REDUCE_MAX,
                                               DT_REDUCE_MIN};
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n_rules, &r);
  for (int d = 0; d < in->ndim; d++) {
    memset(&r, 0, sizeof r);
    r.in[0] = dt_shard(d);
    r.out[0] = (mask & (1u << d)) ? dt_partial(partial_of[kind]) : dt_shard(pos[d]);
    dt__add_rule(rules, cap, n_rules, &r);
  }
  /* Partial inputs that pass through: sum and mean are linear (P(sum), P(avg)); amax keeps
   * P(max), amin keeps P(min). Integer sums pass P(sum) only, and only i64 in: an i32 partial
   * value wraps at 32 bits, its i64 sum must not (the input is reduced first). */
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    int ok = kind <= 1 ? (op == DT_REDUCE_SUM || op == DT_REDUCE_AVG)
                       : op == (kind == 2 ? DT_REDUCE_MAX : DT_REDUCE_MIN);
    if (integer && kind == 0) ok = op == DT_REDUCE_SUM && in->dtype == out_meta->dtype;
    if (!ok) continue;
    memset(&r, 0, sizeof r);
    r.in[0] = dt_partial((dt_reduce_op_t)op);
    r.out[0] = dt_partial((dt_reduce_op_t)op);
    dt__add_rule(rules, cap, n_rules, &r);
  }
  return DT_SUCCESS;
}

/* softmax / log_softmax along iargs[0]: that dim must be whole on each rank (R); the others stay
 * sharded. Non-linear: no Partial passes. */
dt_status_t dt__softmax_dim(const dt_op_call_t* call, int* dim) {
  const int nd = call->in[0].ndim, wrap = nd ? nd : 1; /* a 0-d tensor's dims wrap as 1-d's */
  if (call->n_iargs != 1) return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes iargs [dim]", call->op);
  const int64_t d = call->iargs[0];
  if (d < -wrap || d >= wrap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dim %lld out of range for a %d-dim tensor (valid: %d "
                   "to %d)", call->op, (long long)d, nd, -wrap, wrap - 1);
  *dim = nd == 0 ? -1 : (int)(d < 0 ? d + nd : d);
  return DT_SUCCESS;
}

dt_status_t dt__softmax_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                     int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int nd = call->in[0].ndim, dim;
  DT_CHECK(dt__softmax_dim(call, &dim));
  if (!dt__dtype_is_float(call->in[0].dtype)) /* (as torch.softmax: probabilities are floats) */
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: x is %s, expected a float dtype (f32, bf16 or f16)",
                   call->op, dt_dtype_name(call->in[0].dtype));
  *out_meta = call->in[0];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n, &r);
  for (int d = 0; d < nd; d++) {
    if (d == dim) continue;
    r.out[0] = r.in[0] = dt_shard(d);
    dt__add_rule(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

/* The permutation a view op applies (out dim i = in dim perm[i]). */
dt_status_t dt__view_perm(int op, const dt_op_call_t* call, int* perm) {
  int nd = call->in[0].ndim;
  for (int d = 0; d < nd; d++) perm[d] = d;
  if (op == DT_OP_T) {
    if (nd > 2) return DT_FAIL(DT_ERR_INVALID_ARG, "t expects at most 2 dims, got %d", nd);
    if (nd == 2) perm[0] = 1, perm[1] = 0;
    return DT_SUCCESS;
  }
  if (op == DT_OP_TRANSPOSE) {
    if (call->n_iargs != 2) return DT_FAIL(DT_ERR_INVALID_ARG, "transpose takes iargs [d0, d1]");
    int64_t a = call->iargs[0] < 0 ? call->iargs[0] + nd : call->iargs[0];
    int64_t b = call->iargs[1] < 0 ? call->iargs[1] + nd : call->iargs[1];
    if (a < 0 || a >= nd || b < 0 || b >= nd)
      return DT_FAIL(DT_ERR_INVALID_ARG, "transpose: dims (%lld, %lld) out of range for %d dims",
                     (long long)call->iargs[0], (long long)call->iargs[1], nd);
    perm[a] = (int)b;
    perm[b] = (int)a;
    return DT_SUCCESS;
  }
  /* permute: iargs is the permutation */
  if (call->n_iargs != nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "permute needs %d dims in iargs, got %d", nd,
                   call->n_iargs);
  unsigned seen = 0;
  for (int d = 0; d < nd; d++) {
    int64_t p = call->iargs[d] < 0 ? call->iargs[d] + nd : call->iargs[d];
    if (p < 0 || p >= nd || (seen & (1u << p)))
      return DT_FAIL(DT_ERR_INVALID_ARG, "permute: iargs is not a permutation of %d dims", nd);
    seen |= 1u << p;
    perm[d] = (int)p;
  }
  return DT_SUCCESS;
}

/* permute / transpose / t: a shard follows its dim; every Partial passes (a view is linear and
 * keeps max/min). */
static dt_status_t dt__perm_rules(int op, const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                  int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int perm[DT_MAX_DIMS], nd = call->in[0].ndim;
  DT_CHECK(dt__view_perm(op, call, perm));
  out_meta->dtype = call->in[0].dtype;
  out_meta->ndim = nd;
  for (int i = 0; i < nd; i++) out_meta->shape[i] = call->in[0].shape[perm[i]];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n, &r);
  for (int i = 0; i < nd; i++) {
    r.out[0] = dt_shard(i);
    r.in[0] = dt_shard(perm[i]);
    dt__add_rule(rules, cap, n, &r);
  }
  for (int ro = 0; ro < DT_REDUCE_COUNT; ro++) {
    r.out[0] = r.in[0] = dt_partial((dt_reduce_op_t)ro);
    dt__add_rule(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__permute_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                              dt_op_rule_t* rules, int cap, int* n) {
  return dt__perm_rules(DT_OP_PERMUTE, call, out_meta, n_out, rules, cap, n);
}
dt_status_t dt__transpose_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                dt_op_rule_t* rules, int cap, int* n) {
  return dt__perm_rules(DT_OP_TRANSPOSE, call, out_meta, n_out, rules, cap, n);
}
dt_status_t dt__t_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                        dt_op_rule_t* rules, int cap, int* n) {
  return dt__perm_rules(DT_OP_T, call, out_meta, n_out, rules, cap, n);
}

/* rms_norm (x, weight) and layer_norm (x, weight, bias) over the last dim: it must be whole on
 * each rank, the leading dims stay sharded, the affine parameters are replicated. */
dt_status_t dt__norm_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                  int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  if (x->ndim < 1) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input must have a dim", call->op);
  int64_t D = x->shape[x->ndim - 1];
  for (int t = 1; t < call->n_inputs; t++)
    if (call->in[t].ndim != 1 || call->in[t].shape[0] != D || call->in[t].dtype != x->dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: parameter %d must be a %s vector of %lld", call->op,
                     t, dt_dtype_name(x->dtype), (long long)D);
  if (call->n_fargs > 1) return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes fargs [eps]", call->op);
  *out_meta = *x;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n, &r);
  for (int d = 0; d + 1 < x->ndim; d++) {
    r.out[0] = r.in[0] = dt_shard(d);
    dt__add_rule(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

/* embedding (weight (V, D), indices of i32/i64): the output is indices.shape + (D).
 *   [R; R, R]  [S(last); S(1), R]  [P(sum); S(0), R] (vocabulary-sharded: masked local lookup)
 *   [S(d); R, S(d)] for each index dim  [P(op); P(op), R] (the lookup is linear in the table) */
dt_status_t dt__embedding_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                       int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t *w = &call->in[0], *ix = &call->in[1];
  if (w->ndim != 2) return DT_FAIL(DT_ERR_INVALID_ARG, "embedding: weight must be (V, D)");
  if (ix->dtype != DT_I32 && ix->dtype != DT_I64)
    return DT_FAIL(DT_ERR_INVALID_ARG, "embedding: indices must be i32 or i64, got %s",
                   dt_dtype_name(ix->dtype));
  if (ix->ndim + 1 > DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "embedding: indices have too many dims");
  out_meta->dtype = w->dtype;
  out_meta->ndim = ix->ndim + 1;
  memcpy(out_meta->shape, ix->shape, sizeof(int64_t) * (size_t)ix->ndim);
  out_meta->shape[ix->ndim] = w->shape[1];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n, &r);
  r.out[0] = dt_shard(ix->ndim);
  r.in[0] = dt_shard(1);
  dt__add_rule(rules, cap, n, &r);
  r.out[0] = dt_partial(DT_REDUCE_SUM);
  r.in[0] = dt_shard(0);
  dt__add_rule(rules, cap, n, &r);
  for (int d = 0; d < ix->ndim; d++) {
    memset(&r, 0, sizeof r);
    r.out[0] = dt_shard(d);
    r.in[1] = dt_shard(d);
    dt__add_rule(rules, cap, n, &r);
  }
  dt__add_linear_rules(rules, cap, n, 0);
  return DT_SUCCESS;
}

/* gather_dim (x (N, C), idx (N) i32/i64): out[i] = x[i, idx[i]].
 *   [R; R, R]  [S(0); S(0), S(0)]  [P(sum); S(1), R] (class-sharded: masked local gather)
 *   [P(op); P(op), R] (linear in x) */
dt_status_t dt__gather_dim_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                        int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t *x = &call->in[0], *ix = &call->in[1];
  if (x->ndim != 2 || ix->ndim != 1 || ix->shape[0] != x->shape[0])
    return DT_FAIL(DT_ERR_INVALID_ARG, "gather_dim: expects x (N, C) and indices (N)");
  if (ix->dtype != DT_I32 && ix->dtype != DT_I64)
    return DT_FAIL(DT_ERR_INVALID_ARG, "gather_dim: indices must be i32 or i64, got %s",
                   dt_dtype_name(ix->dtype));
  out_meta->dtype = x->dtype;
  out_meta->ndim = 1;
  out_meta->shape[0] = x->shape[0];
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add_rule(rules, cap, n, &r);
  r.out[0] = r.in[0] = r.in[1] = dt_shard(0);
  dt__add_rule(rules, cap, n, &r);
  memset(&r, 0, sizeof r);
  r.out[0] = dt_partial(DT_REDUCE_SUM);
  r.in[0] = dt_shard(1);
  dt__add_rule(rules, cap, n, &r);
  dt__add_linear_rules(rules, cap, n, 0);
  return DT_SUCCESS;
}

/* linear (x (N, K), weight (O, K)[, bias (O)]): out = x weight^T + bias, "nk,ok->no".
 * The bias follows the output's O dim; where the output is Partial the bias is Partial too, so it
 * is added exactly once in the sum (R -> P(sum) partitions it locally). */
dt_status_t dt__linear_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                    int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  DT_CHECK(dt__rules_einsum("nk,ok->no", call, 1, out_meta, rules, cap, n));
  if (call->n_inputs == 3) {
    const dt_tensor_meta_t* b = &call->in[2];
    if (b->ndim != 1 || b->shape[0] != call->in[1].shape[0] || b->dtype != call->in[0].dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "linear: bias must be a %s vector of %lld",
                     dt_dtype_name(call->in[0].dtype), (long long)call->in[1].shape[0]);
    for (int k = 0; k < *n; k++) {
      dt_placement_t o = rules[k].out[0];
      rules[k].in[2] = o.kind == DT_PARTIAL               ? o
                       : (o.kind == DT_SHARD && o.dim == 1) ? dt_shard(0)
                                                            : dt_replicate();
    }
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * generators of the op table named by macro */

#define DT__EINSUM_OP(fname, eq, bilinear)                                                     \
  dt_status_t fname(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,   \
                           dt_op_rule_t* rules, int cap, int* n) {                             \
    *n_out = 1;                                                                                \
    return dt__rules_einsum(eq, call, bilinear, out_meta, rules, cap, n);                      \
  }
DT__EINSUM_OP(dt__mm_rules, "mk,kn->mn", 1)
DT__EINSUM_OP(dt__bmm_rules, "bmk,bkn->bmn", 1)
DT__EINSUM_OP(dt__mm_t_rules, "km,kn->mn", 1) /* a^T b (weight gradients without a transpose) */

#define DT__POINTWISE_OP(fname, lin)                                                           \
  dt_status_t fname(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,   \
                           dt_op_rule_t* rules, int cap, int* n) {                             \
    *n_out = 1;                                                                                \
    return dt__rules_pointwise(call, lin, out_meta, rules, cap, n);                            \
  }
#define DT__REDUCE_OP(fname, kind)                                                             \
  dt_status_t fname(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,   \
                           dt_op_rule_t* rules, int cap, int* n) {                             \
    *n_out = 1;                                                                                \
    return dt__rules_reduce(call, kind, out_meta, rules, cap, n);                              \
  }
/* kind k is op DT_OP_SUM + k (the reductions share one schema: "keepdim=0, dim:l") */
_Static_assert(DT_OP_MEAN == DT_OP_SUM + 1 && DT_OP_AMAX == DT_OP_SUM + 2 &&
                   DT_OP_AMIN == DT_OP_SUM + 3 && DT_OP_ARGMAX == DT_OP_SUM + 4 &&
                   DT_OP_ARGMIN == DT_OP_SUM + 5 && DT_OP_LOGSUMEXP == DT_OP_SUM + 6 &&
                   DT_OP_VAR == DT_OP_SUM + 7 && DT_OP_STD == DT_OP_SUM + 8 &&
                   DT_OP_PROD == DT_OP_SUM + 9,
               "the reductions are sum, mean, amax, amin, argmax, argmin, logsumexp, var, std, "
               "prod in this order");
DT__REDUCE_OP(dt__sum_rules, 0)
DT__REDUCE_OP(dt__mean_rules, 1)
DT__REDUCE_OP(dt__amax_rules, 2)
DT__REDUCE_OP(dt__amin_rules, 3)
DT__REDUCE_OP(dt__argmax_rules, 4)
DT__REDUCE_OP(dt__argmin_rules, 5)
DT__REDUCE_OP(dt__logsumexp_rules, 6)
DT__REDUCE_OP(dt__var_rules, 7)
DT__REDUCE_OP(dt__std_rules, 8)
DT__REDUCE_OP(dt__prod_rules, 9)

DT__POINTWISE_OP(dt__additive_rules, DT_LIN_ADDITIVE)
DT__POINTWISE_OP(dt__mult_rules, DT_LIN_MULT)
DT__POINTWISE_OP(dt__numerator_rules, DT_LIN_NUMERATOR)
DT__POINTWISE_OP(dt__unary_linear_rules, DT_LIN_UNARY)
DT__POINTWISE_OP(dt__nonlinear_rules, DT_LIN_NONE)
DT__POINTWISE_OP(dt__max_rules, DT_LIN_MAX)
DT__POINTWISE_OP(dt__min_rules, DT_LIN_MIN)

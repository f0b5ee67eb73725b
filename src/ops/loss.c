/* loss.c - cross-entropy with loss parallel, composed from registry ops (one implementation for
 * dt_cross_entropy and the autograd node, which keeps the row max and log-sum for its backward).
 *
 *   m    = amax(logits, dim -1, keepdim)    class-sharded: P(max), reduced by sub (N values)
 *   z    = logits - m                       stays class-sharded
 *   s    = sum(exp(z), dim -1, keepdim)     P(sum), reduced by log (N values)
 *   t    = gather_dim(z, targets)           P(sum) by masked local gather
 *   l    = (1 - eps)(log(s) - t) + eps (log(s) - sum(z, -1) / C)     per-row losses
 *   out  = l, mean(l) or sum(l)
 *   saved = [m, log(s)] (N, 2) under autograd, for the softmax exp((x - m) - log(s)) of the
 *           backward (and the row weights, (N, 3), with an ignore_index, below)
 * As PyTorch's log_softmax ((x - m) - log(s)), the losses never go through the row logsumexp
 * m + log(s) rounded to the logits' dtype (~5e-4 off at logits of 1e4 in f32): z cancels the
 * rows' common offset first, and the partial sums of t and sum(z) stay as small as the losses.
 * With an ignore_index (PyTorch's default -100; here only when given) the rows whose target it
 * is count nowhere: v = targets != ignore_index (0/1, element-wise on the targets' shards), t
 * gathers class 0 on them, l is multiplied by v and the mean is sum(l) / sum(v) (NaN when every
 * row is ignored), which costs one scalar all-reduce where the rows are sharded.
 * The logits never move when they are sharded on the class dim; only N-element vectors do.
 */
#include "ops/ops.h"

/* The rows to count (targets != ignore) as f32 0/1 and the targets with ignored rows at class 0
 * (gather_dim and scatter_add take an index in range), both element-wise on the targets' shards
 * with their placements: no collective (exact for |ignore| < 2^24: a target that the conversion
 * rounds is 2^24 or more in magnitude, out of every class range, and gather_dim refuses it). */
dt_status_t dt__ce_targets(dt_tensor_t tg, int64_t ignore, dt_tensor_t* valid, dt_tensor_t* safe) {
  *valid = NULL;
  if (safe) *safe = NULL;
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  dt_tensor_t tf = NULL, tfo = NULL, d = NULL, dd = NULL, one = NULL, sf = NULL, so = NULL,
              v = NULL;
  const double shift = -(double)ignore;
  dt_status_t st = dt__op_convert(tg, DT_F32, &tf, &tfo);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_ADD_SCALAR, 1, &tf, 0, NULL, 1, &shift, &d);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, d, d, &dd); /* 0 or at least 1 */
  if (st == DT_SUCCESS) st = dt_tensor_full_value(tg->mesh, DT_F32, 0, NULL, rep, 1.0, &one);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MINIMUM, dd, one, &v);
  if (st == DT_SUCCESS && safe) st = dt__op2(DT_OP_MUL, tf, v, &sf);
  if (st == DT_SUCCESS && safe) st = dt__op_convert(sf, tg->dtype, safe, &so);
  if (st == DT_SUCCESS && safe) so = NULL; /* now *safe */
  dt_tensor_t tmp[7] = {tfo, d, dd, one, sf, so, st == DT_SUCCESS ? NULL : v};
  for (int i = 0; i < 7; i++) dt__tensor_free(tmp[i]);
  if (st == DT_SUCCESS) *valid = v;
  else if (safe) *safe = NULL;
  return st;
}

dt_status_t dt__cross_entropy(dt_tensor_t x, dt_tensor_t tg, const dt__ce_args_t* a,
                              dt_tensor_t* loss, dt_tensor_t* saved) {
  *loss = NULL;
  if (saved) *saved = NULL;
  if (a->reduction < 0 || a->reduction >= DT_LOSS_REDUCTION_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: reduction=%lld out of range: 0 none, 1 "
                   "mean, 2 sum", (long long)a->reduction);
  const int masked = a->ignore_index != DT_OP_IARG_NONE; /* rows to ignore: only if asked */
  /* the mask compares in f32: exact while |ignore_index| < 2^24 and C <= 2^24 (a target that
   * rounds to another value is at least 2^24, past every class, and gather_dim refuses it) */
  if (masked && (a->ignore_index <= -(INT64_C(1) << 24) || a->ignore_index >= (INT64_C(1) << 24)))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: ignore_index=%lld (valid: above -2^24 "
                   "and below 2^24, e.g. PyTorch's -100)", (long long)a->ignore_index);
  if (!(a->label_smoothing >= 0.0 && a->label_smoothing <= 1.0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: label_smoothing=%g (valid: 0 to 1)",
                   a->label_smoothing);
  DT_CHECK(dt__tensor_check(x, "logits"));
  DT_CHECK(dt__tensor_check(tg, "targets"));
  if (x->layout.ndim != 2 || tg->layout.ndim != 1 || tg->layout.shape[0] != x->layout.shape[0] ||
      (tg->dtype != DT_I32 && tg->dtype != DT_I64))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "cross_entropy: expects logits (N, C) and i32/i64 targets (N); got logits of %d "
                   "dims (N=%lld) and %s targets of %d dims (%lld)", x->layout.ndim,
                   (long long)(x->layout.ndim ? x->layout.shape[0] : 0), dt_dtype_name(tg->dtype),
                   tg->layout.ndim, (long long)(tg->layout.ndim ? tg->layout.shape[0] : 0));
  const int64_t N = x->layout.shape[0], C = x->layout.shape[1];
  if (masked && C > (INT64_C(1) << 24))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "cross_entropy: ignore_index with %lld classes (at most "
                   "2^24)", (long long)C);
  const int64_t keep_last[2] = {1, -1}, drop_last[2] = {0, -1}, all[1] = {0}, flat[1] = {N},
                col[2] = {N, 1};
  const double eps = a->label_smoothing;
  dt_tensor_t m = NULL, z = NULL, e = NULL, s = NULL, ls = NULL, ls1 = NULL, t = NULL, l = NULL,
              v = NULL, safe = NULL, nll = NULL, sz = NULL, sm = NULL, w = NULL, w1 = NULL,
              cnt = NULL, c0 = NULL, tot = NULL, a1 = NULL, a2 = NULL, lv = NULL, vx = NULL,
              vxo = NULL, c32 = NULL, cnto = NULL;
  dt_status_t st = dt__opa(DT_OP_AMAX, 1, &x, 2, keep_last, 0, NULL, &m);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, x, m, &z);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_EXP, 1, &z, 0, NULL, 0, NULL, &e);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_SUM, 1, &e, 2, keep_last, 0, NULL, &s);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_LOG, 1, &s, 0, NULL, 0, NULL, &ls); /* (N, 1) */
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_RESHAPE, 1, &ls, 1, flat, 0, NULL, &ls1);
  if (st == DT_SUCCESS && masked) st = dt__ce_targets(tg, a->ignore_index, &v, &safe);
  /* the mask in the logits' dtype where it meets their losses (bf16 logits, bf16 losses); the
   * count is taken from the f32 mask (exact) and then converted */
  if (st == DT_SUCCESS && masked) st = dt__op_convert(v, x->dtype, &vx, &vxo);
  if (st == DT_SUCCESS) {
    st = dt__op2(DT_OP_GATHER_DIM, z, masked ? safe : tg, &t); /* x[t] - m */
    if (st == DT_ERR_INVALID_ARG) { /* a target out of range: say how rows are skipped */
      char msg[512];
      snprintf(msg, sizeof msg, "%s", dt__last_error_text());
      st = DT_FAIL(st, "cross_entropy: a target outside [0, %lld): %s%s", (long long)C, msg,
                   masked ? "" : " (to skip rows, as PyTorch's ignore_index=-100 does, give the "
                   "op \"cross_entropy\" iargs [reduction, ignore_index])");
    }
  }
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, ls1, t, &nll);
  if (st == DT_SUCCESS && eps > 0.0) { /* (1 - eps) nll + eps (log(s) - mean over classes of z) */
    const double inv_c = C > 0 ? 1.0 / (double)C : 0.0, keep = 1.0 - eps;
    st = dt__opa(DT_OP_SUM, 1, &z, 2, drop_last, 0, NULL, &sz);
    if (st == DT_SUCCESS) st = dt__opa(DT_OP_MUL_SCALAR, 1, &sz, 0, NULL, 1, &inv_c, &sm);
    if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, ls1, sm, &a1);
    if (st == DT_SUCCESS) st = dt__opa(DT_OP_MUL_SCALAR, 1, &a1, 0, NULL, 1, &eps, &a2);
    if (st == DT_SUCCESS) st = dt__opa(DT_OP_MUL_SCALAR, 1, &nll, 0, NULL, 1, &keep, &lv);
    if (st == DT_SUCCESS) {
      dt__tensor_free(a1);
      a1 = lv;
      lv = NULL;
      st = dt__op2(DT_OP_ADD, a1, a2, &lv);
    }
  }
  if (st == DT_SUCCESS && masked) st = dt__op2(DT_OP_MUL, lv ? lv : nll, vx, &l);
  dt_tensor_t* lp = l ? &l : lv ? &lv : &nll; /* the per-row losses */
  if (st == DT_SUCCESS && a->reduction == DT_LOSS_NONE) {
    *loss = *lp;
    *lp = NULL;
  } else if (st == DT_SUCCESS && !masked) { /* N rows: the mean's count is known */
    st = dt__opa(a->reduction == DT_LOSS_MEAN ? DT_OP_MEAN : DT_OP_SUM, 1, lp, 1, all, 0, NULL,
                 loss);
  } else if (st == DT_SUCCESS) {
    st = dt__opa(DT_OP_SUM, 1, &l, 1, all, 0, NULL, &tot);
    if (st == DT_SUCCESS && a->reduction == DT_LOSS_MEAN) {
      /* the count of the rows not ignored, reduced once (one scalar all-reduce where the rows
       * are sharded) for the loss and the backward's weights */
      dt_placement_t rep[DT_MAX_MESH_DIMS];
      for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
      st = dt__opa(DT_OP_SUM, 1, &v, 1, all, 0, NULL, &c0);
      if (st == DT_SUCCESS) st = dt_tensor_redistribute(c0, rep, &c32);
      if (st == DT_SUCCESS) st = dt__op_convert(c32, x->dtype, &cnt, &cnto);
      if (st == DT_SUCCESS) st = dt__op2(DT_OP_DIV, tot, cnt, loss);
    } else if (st == DT_SUCCESS) {
      *loss = tot;
      tot = NULL;
    }
  }
  /* saved for the backward: the row max and log-sum [m, log(s)] (N, 2), and with ignore_index
   * (N, 3): them and the row's weight in the loss (0 for an ignored row, 1 / count for mean,
   * else 1) */
  const int64_t dim1[1] = {1};
  if (st == DT_SUCCESS && saved != NULL && !masked) {
    dt_tensor_t ml[2] = {m, ls};
    st = dt__opa(DT_OP_CAT, 2, ml, 1, dim1, 0, NULL, saved);
  } else if (st == DT_SUCCESS && saved != NULL) {
    if (cnt != NULL) { /* 1 / max(count, 1): every row ignored gives a NaN loss, zero gradients */
      dt_tensor_t one = NULL, c1 = NULL;
      st = dt_tensor_full_value(cnt->mesh, cnt->dtype, 0, NULL, cnt->layout.pl, 1.0, &one);
      if (st == DT_SUCCESS) st = dt__op2(DT_OP_MAXIMUM, cnt, one, &c1);
      if (st == DT_SUCCESS) st = dt__op2(DT_OP_DIV, vx, c1, &w);
      dt__tensor_free(one);
      dt__tensor_free(c1);
    }
    if (st == DT_SUCCESS) st = dt__opa(DT_OP_RESHAPE, 1, w ? &w : &vx, 2, col, 0, NULL, &w1);
    dt_tensor_t mlw[3] = {m, ls, w1};
    if (st == DT_SUCCESS) st = dt__opa(DT_OP_CAT, 3, mlw, 1, dim1, 0, NULL, saved);
  }
  if (st != DT_SUCCESS) {
    dt__tensor_free(*loss);
    *loss = NULL;
  }
  dt_tensor_t tmp[23] = {m,  z, e,  s,  ls,  ls1, t,  l,  v,   vxo, safe, nll,
                         sz, sm, w, w1, c0, tot, a1, a2, lv, c32, cnto};
  for (int i = 0; i < 23; i++) dt__tensor_free(tmp[i]);
  return st;
}

/* The arguments of the composite op "cross_entropy" with the schema's defaults: iargs
 * [reduction=1, ignore_index (DT_OP_IARG_NONE when not given: no row ignored)], fargs
 * [label_smoothing=0]. */
dt__ce_args_t dt__ce_args(int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs) {
  dt__ce_args_t a;
  a.reduction = dt__op_iarg_n(DT_OP_CROSS_ENTROPY, n_iargs, iargs, 0);
  a.ignore_index = dt__op_iarg_n(DT_OP_CROSS_ENTROPY, n_iargs, iargs, 1);
  a.label_smoothing = dt__op_farg_n(DT_OP_CROSS_ENTROPY, n_fargs, fargs, 0);
  return a;
}

/* The composite op "cross_entropy" (logits, targets): *saved gets the row max, log-sum and (with
 * ignore_index) weights for the backward rule. */
dt_status_t dt__cross_entropy_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                  const int64_t* iargs, int n_fargs, const double* fargs,
                                  dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  const dt__ce_args_t a = dt__ce_args(n_iargs, iargs, n_fargs, fargs);
  return dt__cross_entropy(in[0], in[1], &a, &out[0], saved);
}

static dt_status_t dt__cross_entropy_public(dt_tensor_t logits, dt_tensor_t targets,
                                            dt_loss_reduction_t reduction, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  const int64_t iargs[1] = {(int64_t)reduction};
  const dt__ce_args_t a = dt__ce_args(1, iargs, 0, NULL);
  return dt__cross_entropy(logits, targets, &a, out, NULL);
}

dt_status_t dt_cross_entropy(dt_tensor_t logits, dt_tensor_t targets,
                             dt_loss_reduction_t reduction, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__cross_entropy_public(logits, targets, reduction, out));
}

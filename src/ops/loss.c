/* loss.c - cross-entropy with loss parallel, composed from registry ops (one implementation for
 * dt_cross_entropy and the autograd node, which keeps the row logsumexp for its backward).
 *
 *   m    = amax(logits, dim -1, keepdim)    class-sharded: P(max), reduced by sub (N values)
 *   z    = logits - m                       stays class-sharded
 *   s    = sum(exp(z), dim -1, keepdim)     P(sum), reduced by log (N values)
 *   lse  = log(s) + m                       (N, 1): the row logsumexp
 *   t    = gather_dim(logits, targets)      P(sum) by masked local gather
 *   l    = lse - t                          per-row losses
 *   out  = l, mean(l) or sum(l)
 * The logits never move when they are sharded on the class dim; only N-element vectors do.
 */
#include "ops/ops.h"

dt_status_t dt__cross_entropy(dt_tensor_t x, dt_tensor_t tg, dt_loss_reduction_t reduction,
                              dt_tensor_t* loss, dt_tensor_t* lse_out) {
  *loss = NULL;
  if (lse_out) *lse_out = NULL;
  if (reduction < 0 || reduction >= DT_LOSS_REDUCTION_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: reduction=%d out of range: 0 none, 1 mean, "
                   "2 sum", (int)reduction);
  DT_CHECK(dt__tensor_check(x, "logits"));
  DT_CHECK(dt__tensor_check(tg, "targets"));
  if (x->layout.ndim != 2 || tg->layout.ndim != 1 || tg->layout.shape[0] != x->layout.shape[0] ||
      (tg->dtype != DT_I32 && tg->dtype != DT_I64))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "cross_entropy: expects logits (N, C) and i32/i64 targets (N); got logits of %d "
                   "dims (N=%lld) and %s targets of %d dims (%lld)", x->layout.ndim,
                   (long long)(x->layout.ndim ? x->layout.shape[0] : 0), dt_dtype_name(tg->dtype),
                   tg->layout.ndim, (long long)(tg->layout.ndim ? tg->layout.shape[0] : 0));
  const int64_t keep_last[2] = {1, -1}, all[1] = {0};
  dt_tensor_t m = NULL, z = NULL, e = NULL, s = NULL, ls = NULL, lse = NULL, lse1 = NULL,
              t = NULL, l = NULL;
  dt_status_t st = dt__opa(DT_OP_AMAX, 1, &x, 2, keep_last, 0, NULL, &m);
  dt_tensor_t xm[2] = {x, m};
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_SUB, 2, xm, 0, NULL, 0, NULL, &z);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_EXP, 1, &z, 0, NULL, 0, NULL, &e);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_SUM, 1, &e, 2, keep_last, 0, NULL, &s);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_LOG, 1, &s, 0, NULL, 0, NULL, &ls);
  dt_tensor_t lm[2] = {ls, m};
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_ADD, 2, lm, 0, NULL, 0, NULL, &lse); /* (N, 1) */
  const int64_t flat[1] = {x->layout.shape[0]};
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_RESHAPE, 1, &lse, 1, flat, 0, NULL, &lse1);
  dt_tensor_t xt[2] = {x, tg};
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_GATHER_DIM, 2, xt, 0, NULL, 0, NULL, &t);
  dt_tensor_t lt[2] = {lse1, t};
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_SUB, 2, lt, 0, NULL, 0, NULL, &l);
  if (st == DT_SUCCESS) {
    if (reduction == DT_LOSS_NONE) {
      *loss = l;
      l = NULL;
    } else {
      st = dt__opa(reduction == DT_LOSS_MEAN ? DT_OP_MEAN : DT_OP_SUM, 1, &l, 1, all, 0, NULL, loss);
    }
  }
  dt_tensor_t tmp[8] = {m, z, e, s, ls, lse1, t, l};
  for (int i = 0; i < 8; i++) dt__tensor_free(tmp[i]);
  if (st == DT_SUCCESS && lse_out != NULL) *lse_out = lse;
  else dt__tensor_free(lse);
  return st;
}

/* The composite op "cross_entropy" (logits, targets) iargs [reduction]: *saved gets the row
 * logsumexp for the backward rule. */
dt_status_t dt__cross_entropy_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                  const int64_t* iargs, int n_fargs, const double* fargs,
                                  dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  (void)n_fargs;
  (void)fargs;
  const int64_t r = dt__op_iarg_n(DT_OP_CROSS_ENTROPY, n_iargs, iargs, 0); /* reduction=1 */
  if (r < 0 || r >= DT_LOSS_REDUCTION_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: reduction=%lld (iargs[0]) out of range: 0 "
                   "none, 1 mean, 2 sum", (long long)r);
  return dt__cross_entropy(in[0], in[1], (dt_loss_reduction_t)r, &out[0], saved);
}

static dt_status_t dt__cross_entropy_public(dt_tensor_t logits, dt_tensor_t targets,
                                            dt_loss_reduction_t reduction, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  return dt__cross_entropy(logits, targets, reduction, out, NULL);
}

dt_status_t dt_cross_entropy(dt_tensor_t logits, dt_tensor_t targets,
                             dt_loss_reduction_t reduction, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__cross_entropy_public(logits, targets, reduction, out));
}

/* loss.c - cross-entropy with loss parallel, composed from public ops.
 *
 *   m   = amax(logits, dim -1, keepdim)   class-sharded: P(max), reduced by sub (an all-reduce of N)
 *   z   = logits - m                      stays class-sharded
 *   s   = sum(exp(z), dim -1)             P(sum), reduced by log (an all-reduce of N)
 *   t   = gather_dim(z, targets)          P(sum) by masked local gather
 *   l   = log(s) - t                      Partial(sum) per row: the log is partitioned locally
 *   out = l, mean(l) or sum(l)
 * The logits never move when they are sharded on the class dim; only N-element vectors do.
 */
#include "ops/ops.h"

dt_status_t dt_cross_entropy(dt_tensor_t logits, dt_tensor_t targets,
                             dt_loss_reduction_t reduction, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (reduction < 0 || reduction >= DT_LOSS_REDUCTION_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: reduction %d out of range", (int)reduction);
  if (logits == NULL || targets == NULL || logits->magic != DT_TENSOR_MAGIC ||
      targets->magic != DT_TENSOR_MAGIC)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: logits and targets must be live tensors");
  if (logits->layout.ndim != 2 || targets->layout.ndim != 1 ||
      targets->layout.shape[0] != logits->layout.shape[0])
    return DT_FAIL(DT_ERR_INVALID_ARG, "cross_entropy: expects logits (N, C) and targets (N)");
  dt_status_t st = DT_SUCCESS;
  dt_tensor_t m = NULL, z = NULL, e = NULL, s = NULL, ls = NULL, t = NULL, l = NULL, r = NULL;
  const int64_t keep_last[2] = {1, -1}, last[2] = {0, -1}, all[1] = {0};
  DT_CHECK_GOTO(dt_op_run("amax", 1, &logits, 2, keep_last, 0, NULL, &m), st, done);
  dt_tensor_t lm[2] = {logits, m};
  DT_CHECK_GOTO(dt_op_run("sub", 2, lm, 0, NULL, 0, NULL, &z), st, done);
  DT_CHECK_GOTO(dt_op_run("exp", 1, &z, 0, NULL, 0, NULL, &e), st, done);
  DT_CHECK_GOTO(dt_op_run("sum", 1, &e, 2, last, 0, NULL, &s), st, done);
  DT_CHECK_GOTO(dt_op_run("log", 1, &s, 0, NULL, 0, NULL, &ls), st, done);
  dt_tensor_t zt[2] = {z, targets};
  DT_CHECK_GOTO(dt_op_run("gather_dim", 2, zt, 0, NULL, 0, NULL, &t), st, done);
  dt_tensor_t lt[2] = {ls, t};
  DT_CHECK_GOTO(dt_op_run("sub", 2, lt, 0, NULL, 0, NULL, &l), st, done);
  if (reduction == DT_LOSS_NONE) {
    *out = l;
    l = NULL;
  } else {
    DT_CHECK_GOTO(dt_op_run(reduction == DT_LOSS_MEAN ? "mean" : "sum", 1, &l, 1, all, 0, NULL, &r),
                  st, done);
    *out = r;
    r = NULL;
  }
done:
  dt_tensor_destroy(m);
  dt_tensor_destroy(z);
  dt_tensor_destroy(e);
  dt_tensor_destroy(s);
  dt_tensor_destroy(ls);
  dt_tensor_destroy(t);
  dt_tensor_destroy(l);
  dt_tensor_destroy(r);
  return st;
}

/* promote.c - type promotion of element-wise ops: the one place that decides the dtype a call of
 * a promoting op (DT_OPF_PROMOTES_IN, op.h) computes in. Dispatch (src/ops/dispatch.c), the tape
 * (src/autograd/tape.c) and dt_op_select ask it; the ops then run on operands of one dtype.
 *
 * PyTorch's rule (c10::promoteTypes and at::native::result_type, torch 1.13), over f32, bf16,
 * f16, i32 and i64:
 *
 *            f32   bf16  f16   i32   i64
 *     f32    f32   f32   f32   f32   f32
 *     bf16   f32   bf16  f32   bf16  bf16
 *     f16    f32   f32   f16   f16   f16
 *     i32    f32   bf16  f16   i32   i64
 *     i64    f32   bf16  f16   i64   i64
 *
 * with 0-dim operands counted apart: they decide only where they are of a higher category (float
 * over integer) than the operands with dims, or where every operand is 0-dim. An op that divides
 * (DT_OPF_INT_TO_FLOAT: div) turns an integer result into f32, PyTorch's default float dtype
 * (torch.div's true division: promote_integer_inputs_to_float). Reductions: torch.sum of an
 * integer tensor is i64 (dt__sum_dtype); amax / amin keep the dtype; mean refuses integers;
 * logsumexp (DT_OPF_INT_TO_FLOAT on its one input) computes integers in f32, as torch.logsumexp;
 * so do the float unary ops (exp, log, sqrt, rsqrt, sigmoid, tanh, sin, cos, reciprocal, log1p,
 * expm1: DT__F0 in op_list.h), as torch.exp(int) is f32. gelu, silu and softmax refuse integers
 * as PyTorch does; so does pow (its float exponent cannot tell PyTorch's int / float result).
 */
#include "strategy/strategy.h"

dt_dtype_t dt__promote_types(dt_dtype_t a, dt_dtype_t b) {
  if (a == b) return a;
  const int fa = dt__dtype_is_float(a), fb = dt__dtype_is_float(b);
  if (fa && fb) return DT_F32; /* two float types: f32 holds both (bf16 with f16 too) */
  if (fa) return a;  /* an integer with a float: the float */
  if (fb) return b;
  return DT_I64;     /* i32 with i64 */
}

dt_dtype_t dt__sum_dtype(dt_dtype_t dtype) {
  return dt__dtype_is_float(dtype) ? dtype : DT_I64; /* i32 and i64 alike, as torch.sum */
}

int dt__op_result_dtype(unsigned flags, int n, const dt_tensor_meta_t* in, dt_dtype_t* out) {
  const unsigned m = (flags & DT_OPF_PROMOTES_MASK) >> 24;
  int have_dim = 0, have_zero = 0;
  dt_dtype_t dim = DT_F32, zero = DT_F32;
  for (int t = 0; t < n; t++) {
    if (!((m >> t) & 1u)) continue;
    if (in[t].ndim > 0) {
      dim = have_dim ? dt__promote_types(dim, in[t].dtype) : in[t].dtype;
      have_dim = 1;
    } else {
      zero = have_zero ? dt__promote_types(zero, in[t].dtype) : in[t].dtype;
      have_zero = 1;
    }
  }
  dt_dtype_t r;
  if (!have_dim) r = zero; /* every operand 0-dim (or none marked: dtype unused) */
  else if (have_zero && !dt__dtype_is_float(dim) && dt__dtype_is_float(zero))
    r = dt__promote_types(dim, zero); /* a float 0-dim lifts integer operands to its type */
  else r = dim;
  if ((flags & DT_OPF_INT_TO_FLOAT) && !dt__dtype_is_float(r)) r = DT_F32; /* div: true division */
  *out = r;
  int mixed = 0;
  for (int t = 0; t < n; t++) mixed |= ((m >> t) & 1u) && in[t].dtype != r;
  return mixed;
}

void dt__op_call_promote(int id, dt_op_call_t* call) {
  const dt_op_info_t* info = dt__op_info(id);
  dt_dtype_t dtype;
  if (info == NULL || !(info->flags & DT_OPF_PROMOTES_MASK) || call->n_inputs < 0 ||
      call->n_inputs > DT_OP_MAX_INPUTS ||
      !dt__op_result_dtype(info->flags, call->n_inputs, call->in, &dtype))
    return;
  for (int t = 0; t < call->n_inputs; t++)
    if (info->flags & DT_OPF_PROMOTES_IN(t)) call->in[t].dtype = dtype;
}

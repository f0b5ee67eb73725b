/* kernels_cpu.c - CPU kernels on local shards (f32; the broadcasting arithmetic and comparisons,
 * neg, abs, floor, ceil, round, trunc, sign, sum, amax, amin and prod also i32 / i64): GEMM through
 * OpenBLAS, broadcasting pointwise ops. Kept apart from dispatch so a CUDA kernel can sit beside
 * each one. */
#include <math.h>

#include "ops/ops.h"

static dt_status_t dt__need_f32(const dt_op_call_t* call, const dt_local_tensor_t* t, int n) {
  for (int i = 0; i < n; i++)
    if (t[i].dtype != DT_F32)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: %s tensors are not supported (f32, bf16 or f16: "
                     "cast it first)", call->op, dt_dtype_name(t[i].dtype));
  return DT_SUCCESS;
}

/* The matmul family through the backend's GEMM (empty dims are fine: k == 0 gives zeros). */
dt_status_t dt__kernel_mm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                          dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 2));
  int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  return dt__gemm(in[0].backend, 0, 0, m, n, k, 1.0f, (const float*)in[0].data, k,
                  (const float*)in[1].data, n, 0.0f, (float*)out[0].data, n);
}

/* mm_t: C (m,n) = A^T B with A (k,m), B (k,n). */
dt_status_t dt__kernel_mm_t(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 2));
  int64_t k = in[0].shape[0], m = in[0].shape[1], n = in[1].shape[1];
  return dt__gemm(in[0].backend, 1, 0, m, n, k, 1.0f, (const float*)in[0].data, m,
                  (const float*)in[1].data, n, 0.0f, (float*)out[0].data, n);
}

dt_status_t dt__kernel_bmm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 2));
  int64_t B = in[0].shape[0], m = in[0].shape[1], k = in[0].shape[2], n = in[1].shape[2];
  return dt__gemm_batched(in[0].backend, 0, 0, m, n, k, 1.0f, (const float*)in[0].data, k, m * k,
                          (const float*)in[1].data, n, k * n, 0.0f, (float*)out[0].data, n, m * n,
                          B);
}

/* ---------------------------------------------------------------------------------------------
 * pointwise: the output's local shape is the broadcast of the inputs' local shapes */

typedef float (*dt__binop_t)(float, float);
static float dt__f_add(float a, float b) { return a + b; }
static float dt__f_sub(float a, float b) { return a - b; }
static float dt__f_mul(float a, float b) { return a * b; }
static float dt__f_div(float a, float b) { return a / b; }
/* a NaN of either side propagates; a on ties (-0.0 against 0.0), as PyTorch */
static float dt__f_max(float a, float b) { return (a >= b || a != a) ? a : b; }
static float dt__f_min(float a, float b) { return (a <= b || a != a) ? a : b; }
static float dt__f_eq(float a, float b) { return a == b ? 1.0f : 0.0f; }
static float dt__f_ge(float a, float b) { return a >= b ? 1.0f : 0.0f; }
static float dt__f_gt(float a, float b) { return a > b ? 1.0f : 0.0f; }
static float dt__f_ne(float a, float b) { return a != b ? 1.0f : 0.0f; } /* NaN != NaN: 1 */
static float dt__f_lt(float a, float b) { return a < b ? 1.0f : 0.0f; }
static float dt__f_le(float a, float b) { return a <= b ? 1.0f : 0.0f; }

/* Inlined loops for the common layouts (the function pointer stops vectorization):
 * same shapes, and b one value per row of a ((.., N, C) op (.., N, 1)) or a scalar. */
#define DT__BIN_LOOPS(EXPR)                                                             \
  do {                                                                                  \
    if (mode == 0)                                                                      \
      for (int64_t i = 0; i < n; i++) {                                                 \
        float x = a[i], y = b[i];                                                       \
        o[i] = (EXPR);                                                                  \
      }                                                                                 \
    else                                                                                \
      for (int64_t r = 0; r < n / inner; r++) {                                         \
        float y = b[mode == 1 ? r : 0];                                                 \
        for (int64_t j = 0; j < inner; j++) {                                           \
          float x = a[r * inner + j];                                                   \
          o[r * inner + j] = (EXPR);                                                    \
        }                                                                               \
      }                                                                                 \
  } while (0)

/* Element strides of inputs 0 and 1 over out's dims (0 on broadcast dims). */
static void dt__bcast_strides(const dt_local_tensor_t* in, const dt_local_tensor_t* out,
                              int64_t* sa, int64_t* sb) {
  const int nd = out->ndim;
  for (int t = 0; t < 2; t++) {
    int64_t* s = t ? sb : sa;
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int td = d - (nd - in[t].ndim);
      int64_t len = td >= 0 ? in[t].shape[td] : 1;
      s[d] = (len == 1 && out->shape[d] != 1) ? 0 : st;
      st *= len;
    }
  }
}

/* The next output element's input offsets (*ia, *ib) in row-major order over shape. */
static inline void dt__bcast_next(int nd, const int64_t* shape, const int64_t* sa,
                                  const int64_t* sb, int64_t* idx, int64_t* ia, int64_t* ib) {
  for (int d = nd - 1; d >= 0; d--) {
    *ia += sa[d];
    *ib += sb[d];
    if (++idx[d] < shape[d]) return;
    *ia -= sa[d] * idx[d];
    *ib -= sb[d] * idx[d];
    idx[d] = 0;
  }
}

/* Integer operands (i32 or i64, one dtype: promotion made them so) of add, sub, mul, maximum,
 * minimum and the comparisons, as PyTorch: two's complement arithmetic that wraps, comparisons
 * giving 1 / 0 in the dtype. div is never given integers (promotion makes it f32, PyTorch's
 * true division). */
static dt_status_t dt__binary_int(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out, dt__binop_t f) {
  const dt_dtype_t d = out->dtype;
  if ((d != DT_I32 && d != DT_I64) || in[0].dtype != d || in[1].dtype != d)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s, %s -> %s are not supported (integer "
                   "operands of one dtype, or floats)", call->op, dt_dtype_name(in[0].dtype),
                   dt_dtype_name(in[1].dtype), dt_dtype_name(d));
  enum { ADD, SUB, MUL, MAX, MIN, EQ, GE, GT, NE, LT, LE } k;
  if (f == dt__f_add) k = ADD;
  else if (f == dt__f_sub) k = SUB;
  else if (f == dt__f_mul) k = MUL;
  else if (f == dt__f_max) k = MAX;
  else if (f == dt__f_min) k = MIN;
  else if (f == dt__f_eq) k = EQ;
  else if (f == dt__f_ge) k = GE;
  else if (f == dt__f_gt) k = GT;
  else if (f == dt__f_ne) k = NE;
  else if (f == dt__f_lt) k = LT;
  else if (f == dt__f_le) k = LE;
  else
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: integer operands are not supported (cast them to a "
                   "float dtype)", call->op);
  const int nd = out->ndim;
  int64_t n = 1, sa[DT_MAX_DIMS], sb[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0}, ia = 0, ib = 0;
  for (int i = 0; i < nd; i++) n *= out->shape[i];
  dt__bcast_strides(in, out, sa, sb);
  const int w = d == DT_I64;
  for (int64_t i = 0; i < n; i++) {
    const int64_t x = w ? ((const int64_t*)in[0].data)[ia] : ((const int32_t*)in[0].data)[ia];
    const int64_t y = w ? ((const int64_t*)in[1].data)[ib] : ((const int32_t*)in[1].data)[ib];
    uint64_t r; /* unsigned: wraps as two's complement, no signed overflow */
    switch (k) {
      case ADD: r = (uint64_t)x + (uint64_t)y; break;
      case SUB: r = (uint64_t)x - (uint64_t)y; break;
      case MUL: r = (uint64_t)x * (uint64_t)y; break;
      case MAX: r = (uint64_t)(x >= y ? x : y); break;
      case MIN: r = (uint64_t)(x <= y ? x : y); break;
      case EQ: r = x == y; break;
      case GE: r = x >= y; break;
      case GT: r = x > y; break;
      case NE: r = x != y; break;
      case LT: r = x < y; break;
      default: r = x <= y; break;
    }
    if (w) ((int64_t*)out->data)[i] = (int64_t)r;
    else ((int32_t*)out->data)[i] = (int32_t)(uint32_t)r;
    dt__bcast_next(nd, out->shape, sa, sb, idx, &ia, &ib);
  }
  return DT_SUCCESS;
}

DT_SIMD static dt_status_t dt__binary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out, dt__binop_t f) {
  if (in[0].dtype == DT_I32 || in[0].dtype == DT_I64) return dt__binary_int(call, in, out, f);
  DT_CHECK(dt__need_f32(call, in, 2));
  const int nd = out->ndim;
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= out->shape[d];
  const float *a = (const float*)in[0].data, *b = (const float*)in[1].data;
  float* o = (float*)out->data;
  int same = in[0].ndim == nd && in[1].ndim == nd;
  for (int d = 0; same && d < nd; d++)
    same = in[0].shape[d] == out->shape[d] && in[1].shape[d] == out->shape[d];
  /* mode 0: same shapes; 1: a full, b one value per row (last dim 1); 2: b a single value */
  int mode = same ? 0 : -1;
  int64_t inner = nd > 0 ? out->shape[nd - 1] : 1, bn = 1;
  for (int d = 0; d < in[1].ndim; d++) bn *= in[1].shape[d];
  int a_full = in[0].ndim == nd;
  for (int d = 0; a_full && d < nd; d++) a_full = in[0].shape[d] == out->shape[d];
  if (mode < 0 && a_full && bn == 1) mode = 2;
  if (mode < 0 && a_full && in[1].ndim == nd && nd > 0 && in[1].shape[nd - 1] == 1) {
    int rows = 1;
    for (int d = 0; rows && d + 1 < nd; d++) rows = in[1].shape[d] == out->shape[d];
    if (rows) mode = 1;
  }
  if (mode >= 0 && inner > 0) {
    if (f == dt__f_add) DT__BIN_LOOPS(x + y);
    else if (f == dt__f_sub) DT__BIN_LOOPS(x - y);
    else if (f == dt__f_mul) DT__BIN_LOOPS(x * y);
    else if (f == dt__f_div) DT__BIN_LOOPS(x / y);
    else DT__BIN_LOOPS(f(x, y));
    return DT_SUCCESS;
  }
  int64_t sa[DT_MAX_DIMS], sb[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0};
  dt__bcast_strides(in, out, sa, sb);
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < n; i++) {
    o[i] = f(a[ia], b[ib]);
    dt__bcast_next(nd, out->shape, sa, sb, idx, &ia, &ib);
  }
  return DT_SUCCESS;
}

#define DT__BINARY_KERNEL(name, f)                                                      \
  dt_status_t name(const dt_op_call_t* call, const dt_local_tensor_t* in,               \
                   dt_local_tensor_t* out) {                                            \
    return dt__binary(call, in, out, f);                                                \
  }
DT__BINARY_KERNEL(dt__kernel_add, dt__f_add)
DT__BINARY_KERNEL(dt__kernel_sub, dt__f_sub)
DT__BINARY_KERNEL(dt__kernel_mul, dt__f_mul)
DT__BINARY_KERNEL(dt__kernel_div, dt__f_div)
DT__BINARY_KERNEL(dt__kernel_maximum, dt__f_max)
DT__BINARY_KERNEL(dt__kernel_minimum, dt__f_min)
DT__BINARY_KERNEL(dt__kernel_eq, dt__f_eq) /* comparisons give 1.0 / 0.0 (gradient masks) */
DT__BINARY_KERNEL(dt__kernel_ge, dt__f_ge)
DT__BINARY_KERNEL(dt__kernel_gt, dt__f_gt)
DT__BINARY_KERNEL(dt__kernel_ne, dt__f_ne)
DT__BINARY_KERNEL(dt__kernel_lt, dt__f_lt)
DT__BINARY_KERNEL(dt__kernel_le, dt__f_le)

typedef float (*dt__unop_t)(float);
static float dt__f_neg(float x) { return -x; }
static float dt__f_relu(float x) { return x < 0.0f ? 0.0f : x; } /* NaN stays NaN, as PyTorch */
static float dt__f_exp(float x) { return dt__expf(x); }
static float dt__f_log(float x) { return logf(x); }
static float dt__f_sqrt(float x) { return sqrtf(x); }
static float dt__f_rsqrt(float x) { return 1.0f / sqrtf(x); }
static float dt__f_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static float dt__f_sigmoid(float x) { return 1.0f / (1.0f + dt__expf(-x)); }
static float dt__f_silu(float x) { return x / (1.0f + dt__expf(-x)); }
static float dt__f_tanh(float x) { return tanhf(x); }
static float dt__f_abs(float x) { return fabsf(x); }
/* libm's, as PyTorch: sin/cos(+-inf) = NaN, 1/(+-0) = +-inf, log1p(-1) = -inf and NaN below,
 * expm1 and log1p accurate near 0 (not exp(x) - 1 or log(1 + x)) */
static float dt__f_sin(float x) { return sinf(x); }
static float dt__f_cos(float x) { return cosf(x); }
static float dt__f_reciprocal(float x) { return 1.0f / x; }
static float dt__f_log1p(float x) { return log1pf(x); }
static float dt__f_expm1(float x) { return expm1f(x); }
/* floor, ceil, trunc exact; sign (0 < x) - (x < 0) as PyTorch: sign(NaN) = sign(-0.0) = +0;
 * erf glibc's erff (within 1 ulp of torch.erf's vectorized polynomial, not bit for bit) */
static float dt__f_floor(float x) { return floorf(x); }
static float dt__f_ceil(float x) { return ceilf(x); }
static float dt__f_trunc(float x) { return truncf(x); }
static float dt__f_sign(float x) { return (float)((0.0f < x) - (x < 0.0f)); }
static float dt__f_erf(float x) { return erff(x); }

/* neg and abs of i32 / i64 (its dtype out), as PyTorch: two's complement, so -INT_MIN and
 * abs(INT_MIN) are INT_MIN. */
static dt_status_t dt__neg_abs_int(const dt_local_tensor_t* in, dt_local_tensor_t* out, int abs) {
  int64_t n = 1;
  for (int d = 0; d < out->ndim; d++) n *= out->shape[d];
  if (in->dtype == DT_I64)
    for (int64_t i = 0; i < n; i++) {
      const int64_t x = ((const int64_t*)in->data)[i];
      ((int64_t*)out->data)[i] = abs && x >= 0 ? x : (int64_t)(0u - (uint64_t)x);
    }
  else
    for (int64_t i = 0; i < n; i++) {
      const int32_t x = ((const int32_t*)in->data)[i];
      ((int32_t*)out->data)[i] = abs && x >= 0 ? x : (int32_t)(0u - (uint32_t)x);
    }
  return DT_SUCCESS;
}

/* floor, ceil, trunc and round (decimals 0) of i32 / i64 keep the values (sign: 0 the values kept,
 * 1 their signs -1 / 0 / 1), in the input's dtype, as PyTorch. */
static dt_status_t dt__round_int(const dt_local_tensor_t* in, dt_local_tensor_t* out, int sign) {
  int64_t n = 1;
  for (int d = 0; d < out->ndim; d++) n *= out->shape[d];
  if (in->dtype == DT_I64)
    for (int64_t i = 0; i < n; i++) {
      const int64_t x = ((const int64_t*)in->data)[i];
      ((int64_t*)out->data)[i] = sign ? (int64_t)((0 < x) - (x < 0)) : x;
    }
  else
    for (int64_t i = 0; i < n; i++) {
      const int32_t x = ((const int32_t*)in->data)[i];
      ((int32_t*)out->data)[i] = sign ? (int32_t)((0 < x) - (x < 0)) : x;
    }
  return DT_SUCCESS;
}

static inline dt_status_t dt__unary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out, dt__unop_t f) {
  const int integer = (in->dtype == DT_I32 || in->dtype == DT_I64) && out->dtype == in->dtype;
  if (integer && (f == dt__f_neg || f == dt__f_abs))
    return dt__neg_abs_int(in, out, f == dt__f_abs);
  if (integer && (f == dt__f_floor || f == dt__f_ceil || f == dt__f_trunc || f == dt__f_sign))
    return dt__round_int(in, out, f == dt__f_sign);
  DT_CHECK(dt__need_f32(call, in, 1));
  int64_t n = 1;
  for (int d = 0; d < out->ndim; d++) n *= out->shape[d];
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n; i++) o[i] = f(a[i]);
  return DT_SUCCESS;
}

#define DT__UNARY_KERNEL(name, f)                                                       \
  DT_SIMD dt_status_t name(const dt_op_call_t* call, const dt_local_tensor_t* in,       \
                           dt_local_tensor_t* out) {                                    \
    return dt__unary(call, in, out, f);                                                 \
  }
DT__UNARY_KERNEL(dt__kernel_neg, dt__f_neg)
DT__UNARY_KERNEL(dt__kernel_relu, dt__f_relu)
DT__UNARY_KERNEL(dt__kernel_exp, dt__f_exp)
DT__UNARY_KERNEL(dt__kernel_log, dt__f_log)
DT__UNARY_KERNEL(dt__kernel_sqrt, dt__f_sqrt)
DT__UNARY_KERNEL(dt__kernel_rsqrt, dt__f_rsqrt)
DT__UNARY_KERNEL(dt__kernel_gelu, dt__f_gelu)
DT__UNARY_KERNEL(dt__kernel_sigmoid, dt__f_sigmoid)
DT__UNARY_KERNEL(dt__kernel_silu, dt__f_silu)
DT__UNARY_KERNEL(dt__kernel_tanh, dt__f_tanh)
DT__UNARY_KERNEL(dt__kernel_abs, dt__f_abs)
DT__UNARY_KERNEL(dt__kernel_sin, dt__f_sin)
DT__UNARY_KERNEL(dt__kernel_cos, dt__f_cos)
DT__UNARY_KERNEL(dt__kernel_reciprocal, dt__f_reciprocal)
DT__UNARY_KERNEL(dt__kernel_log1p, dt__f_log1p)
DT__UNARY_KERNEL(dt__kernel_expm1, dt__f_expm1)
DT__UNARY_KERNEL(dt__kernel_floor, dt__f_floor)
DT__UNARY_KERNEL(dt__kernel_ceil, dt__f_ceil)
DT__UNARY_KERNEL(dt__kernel_trunc, dt__f_trunc)
DT__UNARY_KERNEL(dt__kernel_sign, dt__f_sign)
DT__UNARY_KERNEL(dt__kernel_erf, dt__f_erf)

/* round, iargs [decimals]: nearbyintf (half to even), and for decimals d != 0 torch 1.13's
 * round_decimals_kernel in x's dtype: p = x * 10^d (d < 0: x / 10^-d) rounded to that dtype,
 * then nearbyint(p) / 10^d (or * 10^-d), where 10^|d| is (float)pow(10, |d|) rounded to the
 * dtype (bf16 10^4 is 9984). The kernel sees an f32 copy of a bf16 x and its f32 result is
 * rounded to bf16 once, as PyTorch's BFloat16 arithmetic rounds each operation's f32 result.
 * The rules refuse decimals != 0 of integers and f16, as PyTorch 1.13. */
float dt__round_scale(dt_dtype_t dtype, int64_t decimals) {
  const double a = decimals < 0 ? -(double)decimals : (double)decimals;
  const float ten = (float)pow(10.0, a);
  return dtype == DT_BF16 ? dt__bf16_to_f32(dt__f32_to_bf16(ten)) : ten;
}
dt_status_t dt__kernel_round(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  const int64_t d = dt__op_iarg(DT_OP_ROUND, call, 0);
  if (d == 0 && (in->dtype == DT_I32 || in->dtype == DT_I64) && out->dtype == in->dtype)
    return dt__round_int(in, out, 0);
  DT_CHECK(dt__need_f32(call, in, 1));
  int64_t n = 1;
  for (int k = 0; k < out->ndim; k++) n *= out->shape[k];
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  if (d == 0) {
    for (int64_t i = 0; i < n; i++) o[i] = nearbyintf(a[i]);
    return DT_SUCCESS;
  }
  const int bf16 = call->in[0].dtype == DT_BF16;
  const float ten = dt__round_scale(call->in[0].dtype, d);
  for (int64_t i = 0; i < n; i++) {
    float p = d < 0 ? a[i] / ten : a[i] * ten;
    if (bf16) p = dt__bf16_to_f32(dt__f32_to_bf16(p));
    o[i] = d < 0 ? nearbyintf(p) * ten : nearbyintf(p) / ten;
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * reductions over dims (iargs [keepdim, dim...]); mean divides by the GLOBAL count of reduced
 * elements so that a sharded reduced dim yields an exact Partial(sum) */

/* sum (kind 0: into i64, wrapping as PyTorch's int64 sum), amax (2) and amin (3: the dtype kept)
 * and prod (9: into i64, wrapping as torch.prod) of i32 / i64. A local shard with no reduced
 * elements gives the identity (0, the dtype's minimum or maximum, 1), so its Partial(sum / max /
 * min) combines exactly; the rules refuse an empty amax / amin of the whole tensor, as
 * PyTorch. */
static dt_status_t dt__reduce_int(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out, int kind, unsigned mask) {
  const int w = in->dtype == DT_I64;
  const dt_dtype_t od = kind == 0 || kind == 9 ? dt__sum_dtype(in->dtype) : in->dtype;
  if (kind == 1 || out->dtype != od)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s are not supported (integer sum and "
                   "prod give i64, amax / amin their input's dtype, mean refuses integers)",
                   call->op, dt_dtype_name(in->dtype), dt_dtype_name(out->dtype));
  int64_t on = 1, n = 1, ostride[DT_MAX_DIMS], st = 1, idx[DT_MAX_DIMS] = {0}, oi = 0;
  for (int d = 0; d < out->ndim; d++) on *= out->shape[d];
  for (int d = in->ndim - 1; d >= 0; d--) { /* output stride of every input dim (0: reduced) */
    ostride[d] = (mask & (1u << d)) ? 0 : st;
    if (!(mask & (1u << d))) st *= in->shape[d];
    n *= in->shape[d];
  }
  int64_t* o64 = (int64_t*)out->data; /* sum, and amax / amin of i64 */
  int32_t* o32 = (int32_t*)out->data; /* amax / amin of i32 */
  const int64_t init = kind == 0 ? 0 : kind == 9 ? 1 : kind == 2 ? (w ? INT64_MIN : INT32_MIN)
                                                                 : (w ? INT64_MAX : INT32_MAX);
  for (int64_t i = 0; i < on; i++) {
    if (od == DT_I64) o64[i] = init;
    else o32[i] = (int32_t)init;
  }
  for (int64_t i = 0; i < n; i++) {
    const int64_t x = w ? ((const int64_t*)in->data)[i] : ((const int32_t*)in->data)[i];
    if (kind == 0) o64[oi] = (int64_t)((uint64_t)o64[oi] + (uint64_t)x); /* wraps, as PyTorch */
    else if (kind == 9) o64[oi] = (int64_t)((uint64_t)o64[oi] * (uint64_t)x); /* wraps too */
    else if (od == DT_I64) o64[oi] = (kind == 2 ? x > o64[oi] : x < o64[oi]) ? x : o64[oi];
    else o32[oi] = (kind == 2 ? x > o32[oi] : x < o32[oi]) ? (int32_t)x : o32[oi];
    for (int d = in->ndim - 1; d >= 0; d--) {
      oi += ostride[d];
      if (++idx[d] < in->shape[d]) break;
      oi -= ostride[d] * idx[d];
      idx[d] = 0;
    }
  }
  return DT_SUCCESS;
}

DT_SIMD static dt_status_t dt__reduce(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out, int kind) {
  unsigned mask;
  int keep;
  if (in->dtype == DT_I32 || in->dtype == DT_I64) {
    DT_CHECK(dt__reduce_dims(DT_OP_SUM + kind, call, &mask, &keep));
    return dt__reduce_int(call, in, out, kind, mask);
  }
  DT_CHECK(dt__need_f32(call, in, 1));
  DT_CHECK(dt__reduce_dims(DT_OP_SUM + kind, call, &mask, &keep));
  int64_t on = 1, count = 1;
  for (int d = 0; d < out->ndim; d++) on *= out->shape[d];
  for (int d = 0; d < in->ndim; d++)
    if (mask & (1u << d)) count *= call->in[0].shape[d]; /* global extent */
  float* o = (float*)out->data;
  float init = kind == 2 ? -INFINITY : kind == 3 ? INFINITY : 0.0f;
  const float* av = (const float*)in->data;
  int nd = in->ndim;
  /* the dims merged into segments (dims of one element dropped): reduced trailing dims are
   * rows of L elements (a whole-tensor reduction is one row); reduced middle or leading dims
   * with the kept ones around them are (O, Rn, I) blocks. Sums accumulate in double in both,
   * as PyTorch's cascade sums stay exact where a float running sum stalls (2^24 + 1 == 2^24) */
  int64_t sl[DT_MAX_DIMS];
  int sr[DT_MAX_DIMS], ns = 0;
  for (int d = 0; d < nd; d++) {
    const int red = (mask >> d) & 1u;
    if (in->shape[d] == 1) continue;
    if (ns > 0 && sr[ns - 1] == red) {
      sl[ns - 1] *= in->shape[d];
    } else {
      sl[ns] = in->shape[d];
      sr[ns++] = red;
    }
  }
  const int rows = ns >= 1 && sr[ns - 1] && (ns == 1 || (ns == 2 && !sr[0]));
  if (rows && sl[ns - 1] > 0) { /* rows: [kept] reduced */
    int64_t L = sl[ns - 1], R = on;
    for (int64_t r = 0; r < R; r++) {
      const float* x = av + r * L;
      float acc = init;
      if (kind <= 1) {
        acc = (float)dt__sum_d(x, L);
      } else {
        for (int64_t j = 0; j < L; j++)
          acc = kind == 2 ? ((x[j] > acc || x[j] != x[j]) ? x[j] : acc)
                          : ((x[j] < acc || x[j] != x[j]) ? x[j] : acc);
      }
      o[r] = kind == 1 ? acc / (float)count : acc;
    }
    return DT_SUCCESS;
  }
  const int block = kind <= 1 && ((ns == 2 && sr[0] && !sr[1]) || (ns == 3 && !sr[0] && sr[1] && !sr[2]));
  if (block) { /* sums over [kept] reduced kept: 256 double accumulators along the kept row */
    const int64_t O = ns == 3 ? sl[0] : 1, Rn = sl[ns - 2], I = sl[ns - 1];
    for (int64_t b = 0; b < O; b++)
      for (int64_t j0 = 0; j0 < I; j0 += 256) {
        const int64_t jn = I - j0 < 256 ? I - j0 : 256;
        double acc[256];
        for (int64_t j = 0; j < jn; j++) acc[j] = 0.0;
        for (int64_t r = 0; r < Rn; r++) {
          const float* x = av + (b * Rn + r) * I + j0;
          for (int64_t j = 0; j < jn; j++) acc[j] += (double)x[j];
        }
        for (int64_t j = 0; j < jn; j++) {
          const float sum = (float)acc[j];
          o[b * I + j0 + j] = kind == 1 ? sum / (float)count : sum;
        }
      }
    return DT_SUCCESS;
  }
  for (int64_t i = 0; i < on; i++) o[i] = init;
  /* output stride of every input dim (0 for reduced dims) */
  int64_t ostride[DT_MAX_DIMS], st = 1, idx[DT_MAX_DIMS] = {0}, n = 1;
  for (int d = in->ndim - 1; d >= 0; d--) {
    ostride[d] = (mask & (1u << d)) ? 0 : st;
    if (!(mask & (1u << d))) st *= in->shape[d];
    n *= in->shape[d];
  }
  const float* a = (const float*)in->data;
  int64_t oi = 0;
  for (int64_t i = 0; i < n; i++) {
    float x = a[i];
    if (kind <= 1) o[oi] += x;
    else if (kind == 2) o[oi] = (x > o[oi] || x != x) ? x : o[oi];
    else o[oi] = (x < o[oi] || x != x) ? x : o[oi];
    for (int d = in->ndim - 1; d >= 0; d--) {
      oi += ostride[d];
      if (++idx[d] < in->shape[d]) break;
      oi -= ostride[d] * idx[d];
      idx[d] = 0;
    }
  }
  if (kind == 1) /* count 0: the mean of nothing is 0 / 0 = NaN, as PyTorch */
    for (int64_t i = 0; i < on; i++) o[i] /= (float)count;
  return DT_SUCCESS;
}

dt_status_t dt__kernel_sum(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  return dt__reduce(call, in, out, 0);
}
dt_status_t dt__kernel_mean(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  return dt__reduce(call, in, out, 1);
}
dt_status_t dt__kernel_amax(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  return dt__reduce(call, in, out, 2);
}
dt_status_t dt__kernel_amin(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  return dt__reduce(call, in, out, 3);
}

/* ---------------------------------------------------------------------------------------------
 * argmax / argmin / logsumexp / var / std / prod over reduced dims whole on this rank (the rules
 * ask for R there): the input seen as kept and reduced dims, each merged where contiguous and
 * listed innermost first (as reduce.cu's dt_cu_rgeom_t): output o sits at offset sum_d (o's
 * digit d) * ks[d], reduced element r (in row-major order of the reduced dims) at sum_d (r's
 * digit d) * rs[d] from there, so r is the index PyTorch returns (along the one dim, or into the
 * flattened tensor). */

typedef struct {
  int nk, nr;
  int64_t kn[DT_MAX_DIMS], ks[DT_MAX_DIMS], rn[DT_MAX_DIMS], rs[DT_MAX_DIMS];
} dt__rgeom_t;

static void dt__rgeom(const dt_local_tensor_t* in, unsigned mask, dt__rgeom_t* g, int64_t* n_out,
                      int64_t* R) {
  memset(g, 0, sizeof *g);
  int64_t stride = 1;
  int last = -1;
  *n_out = *R = 1;
  for (int d = in->ndim - 1; d >= 0; d--) {
    const int64_t e = in->shape[d];
    const int red = (mask >> d) & 1u;
    if (red) *R *= e;
    else *n_out *= e;
    if (e != 1) {
      int* n = red ? &g->nr : &g->nk;
      int64_t* ext = red ? g->rn : g->kn;
      int64_t* str = red ? g->rs : g->ks;
      if (last == red && str[*n - 1] * ext[*n - 1] == stride) {
        ext[*n - 1] *= e;
      } else {
        ext[*n] = e;
        str[*n] = stride;
        (*n)++;
      }
      last = red;
    }
    stride *= e;
  }
}

static inline int64_t dt__rgeom_off(int n, const int64_t* ext, const int64_t* st, int64_t i) {
  if (n == 1) return i * st[0];
  int64_t off = 0;
  for (int d = 0; d < n; d++) {
    off += (i % ext[d]) * st[d];
    i /= ext[d];
  }
  return off;
}

/* The first position of the maximum (mx) or minimum of each output's reduced elements; a NaN
 * counts as both (its first position wins), as PyTorch. */
#define DT__ARG_LOOP(T, ISNAN)                                                                  \
  for (int64_t o = 0; o < n_out; o++) {                                                         \
    const T* xo = (const T*)in->data + dt__rgeom_off(g.nk, g.kn, g.ks, o);                       \
    T best = xo[0];                                                                             \
    int64_t bi = 0;                                                                             \
    for (int64_t r = 1; r < R && !ISNAN(best); r++) {                                           \
      const T v = xo[dt__rgeom_off(g.nr, g.rn, g.rs, r)];                                       \
      if (ISNAN(v) || (mx ? v > best : v < best)) {                                             \
        best = v;                                                                               \
        bi = r;                                                                                 \
      }                                                                                         \
    }                                                                                           \
    oi[o] = bi;                                                                                 \
  }
#define DT__FNAN(v) ((v) != (v))
#define DT__INAN(v) 0

static dt_status_t dt__argext(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out, int mx) {
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(mx ? DT_OP_ARGMAX : DT_OP_ARGMIN, call, &mask, &keep));
  if (out->dtype != DT_I64 || (in->dtype != DT_F32 && in->dtype != DT_I32 && in->dtype != DT_I64))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s are not supported (f32, i32 or i64 "
                   "in, i64 out)", call->op, dt_dtype_name(in->dtype), dt_dtype_name(out->dtype));
  dt__rgeom_t g;
  int64_t n_out, R;
  dt__rgeom(in, mask, &g, &n_out, &R);
  if (n_out == 0) return DT_SUCCESS;
  if (R == 0) /* (the rules refuse it first) */
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: an empty reduction has no position", call->op);
  int64_t* oi = (int64_t*)out->data;
  if (in->dtype == DT_F32) {
    DT__ARG_LOOP(float, DT__FNAN)
  } else if (in->dtype == DT_I32) {
    DT__ARG_LOOP(int32_t, DT__INAN)
  } else {
    DT__ARG_LOOP(int64_t, DT__INAN)
  }
  return DT_SUCCESS;
}
#undef DT__ARG_LOOP
#undef DT__FNAN
#undef DT__INAN

dt_status_t dt__kernel_argmax(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  return dt__argext(call, in, out, 1);
}
dt_status_t dt__kernel_argmin(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  return dt__argext(call, in, out, 0);
}

/* logsumexp, as PyTorch: m = the maximum (a NaN propagates), shifted by 0 where m is infinite
 * (a row of -inf gives log 0 = -inf, a +inf gives inf), log(sum exp(x - m)) + m; the sum in
 * double. No reduced elements: -inf. */
dt_status_t dt__kernel_logsumexp(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 1));
  DT_CHECK(dt__need_f32(call, out, 1));
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(DT_OP_LOGSUMEXP, call, &mask, &keep));
  dt__rgeom_t g;
  int64_t n_out, R;
  dt__rgeom(in, mask, &g, &n_out, &R);
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n_out; i++) {
    const float* xo = (const float*)in->data + dt__rgeom_off(g.nk, g.kn, g.ks, i);
    float m = -INFINITY;
    for (int64_t r = 0; r < R; r++) {
      const float v = xo[dt__rgeom_off(g.nr, g.rn, g.rs, r)];
      m = (v > m || v != v) ? v : m;
    }
    const double sh = isinf(m) ? 0.0 : (double)m;
    double sum = 0.0;
    for (int64_t r = 0; r < R; r++) sum += exp((double)xo[dt__rgeom_off(g.nr, g.rn, g.rs, r)] - sh);
    o[i] = (float)(log(sum) + sh);
  }
  return DT_SUCCESS;
}

/* var / std (sd), as PyTorch: each output's N reduced elements centred on their mean, the sum of
 * the squared deviations divided by max(0, N - correction) (dt__var_correction); two passes in
 * double (no cancellation from a large common offset); std is its square root, rounded once.
 * A NaN propagates, an inf gives NaN (inf - inf), N <= correction gives inf (NaN where every
 * deviation is 0), no elements NaN. */
static dt_status_t dt__var_std(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out, int sd) {
  const int id = sd ? DT_OP_STD : DT_OP_VAR;
  DT_CHECK(dt__need_f32(call, in, 1));
  DT_CHECK(dt__need_f32(call, out, 1));
  unsigned mask;
  int keep;
  double corr;
  DT_CHECK(dt__reduce_dims(id, call, &mask, &keep));
  DT_CHECK(dt__var_correction(id, call, &corr));
  dt__rgeom_t g;
  int64_t n_out, R;
  dt__rgeom(in, mask, &g, &n_out, &R);
  const double div = R == 0 ? NAN : fmax(0.0, (double)R - corr);
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n_out; i++) {
    const float* xo = (const float*)in->data + dt__rgeom_off(g.nk, g.kn, g.ks, i);
    double sum = 0.0, ss = 0.0;
    for (int64_t r = 0; r < R; r++) sum += (double)xo[dt__rgeom_off(g.nr, g.rn, g.rs, r)];
    const double m = sum / (double)R;
    for (int64_t r = 0; r < R; r++) {
      const double d = (double)xo[dt__rgeom_off(g.nr, g.rn, g.rs, r)] - m;
      ss += d * d;
    }
    const double v = ss / div;
    o[i] = (float)(sd ? sqrt(v) : v);
  }
  return DT_SUCCESS;
}
dt_status_t dt__kernel_var(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  return dt__var_std(call, in, out, 0);
}
dt_status_t dt__kernel_std(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  return dt__var_std(call, in, out, 1);
}

/* prod over at most one dim (none: every element; the rules ask for it whole here), as torch.prod:
 * floats multiply in f32 in order (bf16 / f16 arrive as f32 copies, rounded once on the way
 * out), a NaN propagates, 0 * inf is NaN; no elements: 1. i32 / i64 give i64, wrapping
 * (dt__reduce_int). */
dt_status_t dt__kernel_prod(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(DT_OP_PROD, call, &mask, &keep));
  if (in->dtype == DT_I32 || in->dtype == DT_I64) return dt__reduce_int(call, in, out, 9, mask);
  DT_CHECK(dt__need_f32(call, in, 1));
  DT_CHECK(dt__need_f32(call, out, 1));
  dt__rgeom_t g;
  int64_t n_out, R;
  dt__rgeom(in, mask, &g, &n_out, &R);
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n_out; i++) {
    const float* xo = (const float*)in->data + dt__rgeom_off(g.nk, g.kn, g.ks, i);
    float p = 1.0f;
    for (int64_t r = 0; r < R; r++) p *= xo[dt__rgeom_off(g.nr, g.rn, g.rs, r)];
    o[i] = p;
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * softmax / log_softmax along iargs[0] (whole on this rank), numerically stable: with m the row's
 * maximum and s = sum exp(x - m), exp(x - m) / s and (x - m) - log s, as PyTorch (not x - lse
 * with lse = m + log s rounded to f32, which at |m| = 1e4 is off by 5e-4) */

static dt_status_t dt__softmax(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out, int log_form) {
  DT_CHECK(dt__need_f32(call, in, 1));
  int nd = in->ndim, dim;
  DT_CHECK(dt__softmax_dim(call, &dim));
  int64_t outer = 1, len = dim < 0 ? 1 : in->shape[dim], inner = 1; /* 0-d: one row of one */
  for (int d = 0; d < dim; d++) outer *= in->shape[d];
  for (int d = dim + 1; d < nd && dim >= 0; d++) inner *= in->shape[d];
  const float* a = (const float*)in->data;
  float* o = (float*)out->data;
  for (int64_t p = 0; p < outer; p++)
    for (int64_t q = 0; q < inner; q++) {
      const float* x = a + p * len * inner + q;
      float* y = o + p * len * inner + q;
      float mx = -INFINITY;
      for (int64_t k = 0; k < len; k++) mx = fmaxf(mx, x[k * inner]);
      double sum = 0.0;
      for (int64_t k = 0; k < len; k++) {
        const double e = exp((double)x[k * inner] - mx);
        sum += e;
        if (!log_form) y[k * inner] = (float)e;
      }
      const double ls = log(sum), inv = 1.0 / sum;
      for (int64_t k = 0; k < len; k++)
        y[k * inner] = (float)(log_form ? ((double)x[k * inner] - mx) - ls : y[k * inner] * inv);
    }
  return DT_SUCCESS;
}

dt_status_t dt__kernel_softmax(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  return dt__softmax(call, in, out, 0);
}
dt_status_t dt__kernel_log_softmax(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                   dt_local_tensor_t* out) {
  return dt__softmax(call, in, out, 1);
}

/* permute / transpose / t: out dim i takes in dim perm[i]; any dtype (a copy). */
static dt_status_t dt__permute_copy(int op, const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out) {
  int perm[DT_MAX_DIMS], nd = in->ndim;
  DT_CHECK(dt__view_perm(op, call, perm));
  size_t item = dt__itemsize(in->dtype);
  int64_t istride[DT_MAX_DIMS], st = 1, n = 1, idx[DT_MAX_DIMS] = {0};
  for (int d = nd - 1; d >= 0; d--) {
    istride[d] = st;
    st *= in->shape[d];
  }
  int64_t step[DT_MAX_DIMS]; /* input stride of each output dim */
  for (int i = 0; i < nd; i++) {
    step[i] = istride[perm[i]];
    n *= out->shape[i];
  }
  const char* a = (const char*)in->data;
  char* o = (char*)out->data;
  if (nd >= 2 && perm[nd - 1] == nd - 1 && out->shape[nd - 1] > 0) {
    /* the last dim stays: move whole rows */
    int64_t row = out->shape[nd - 1], nrows = n / row, src = 0, rid[DT_MAX_DIMS] = {0};
    size_t rb = (size_t)row * item;
    for (int64_t k = 0; k < nrows; k++) {
      memcpy(o + (size_t)k * rb, a + (size_t)src * item, rb);
      for (int i = nd - 2; i >= 0; i--) {
        src += step[i];
        if (++rid[i] < out->shape[i]) break;
        src -= step[i] * rid[i];
        rid[i] = 0;
      }
    }
    return DT_SUCCESS;
  }
  int64_t src = 0;
  for (int64_t k = 0; k < n; k++) {
    memcpy(o + (size_t)k * item, a + (size_t)src * item, item);
    for (int i = nd - 1; i >= 0; i--) {
      src += step[i];
      if (++idx[i] < out->shape[i]) break;
      src -= step[i] * idx[i];
      idx[i] = 0;
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt__kernel_permute(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  return dt__permute_copy(DT_OP_PERMUTE, call, in, out);
}
dt_status_t dt__kernel_transpose(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  return dt__permute_copy(DT_OP_TRANSPOSE, call, in, out);
}
dt_status_t dt__kernel_t(const dt_op_call_t* call, const dt_local_tensor_t* in,
                         dt_local_tensor_t* out) {
  return dt__permute_copy(DT_OP_T, call, in, out);
}

/* ---------------------------------------------------------------------------------------------
 * rms_norm / layer_norm over the last dim (fargs [eps]; the schema's defaults 1e-6 and 1e-5) */

DT_SIMD static dt_status_t dt__norm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out, int layer) {
  DT_CHECK(dt__need_f32(call, in, call->n_inputs));
  const double eps = dt__op_farg(layer ? DT_OP_LAYER_NORM : DT_OP_RMS_NORM, call, 0);
  int nd = in[0].ndim;
  int64_t D = in[0].shape[nd - 1], rows = 1;
  for (int d = 0; d + 1 < nd; d++) rows *= in[0].shape[d];
  const float *x = (const float*)in[0].data, *w = (const float*)in[1].data;
  const float* b = layer ? (const float*)in[2].data : NULL;
  float* y = (float*)out->data;
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    double mean = layer ? dt__sum_d(xr, D) / (double)D : 0.0, var;
#define DT__TERM_(j) (((double)xr[j] - mean) * ((double)xr[j] - mean))
    DT__SUM8(D, DT__TERM_, var);
#undef DT__TERM_
    float inv = (float)(1.0 / sqrt(var / (double)D + eps));
    /* two loops, not `layer ? b[j] : 0`: vectorized, that select became a masked load of b,
     * NULL for rms_norm, and a masked load at an unmapped address is slow (5x this kernel, AVX2
     * on AMD). + 0.0f keeps rms_norm's values as they were (-0.0 becomes 0.0). */
    if (layer)
      for (int64_t j = 0; j < D; j++) yr[j] = (float)(xr[j] - mean) * inv * w[j] + b[j];
    else
      for (int64_t j = 0; j < D; j++) yr[j] = (float)(xr[j] - mean) * inv * w[j] + 0.0f;
  }
  return DT_SUCCESS;
}

dt_status_t dt__kernel_rms_norm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                dt_local_tensor_t* out) {
  return dt__norm(call, in, out, 0);
}
dt_status_t dt__kernel_layer_norm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  return dt__norm(call, in, out, 1);
}

/* embedding: rows of the local weight shard (global rows offset[0] .. +shape[0], columns as held);
 * indices outside the local vocabulary shard give zeros (masked lookup -> Partial(sum)). */
dt_status_t dt__kernel_embedding(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 1));
  const dt_local_tensor_t *w = &in[0], *ix = &in[1];
  int64_t V = call->in[0].shape[0], v0 = w->offset[0], vl = w->shape[0], D = w->shape[1], n = 1;
  for (int d = 0; d < ix->ndim; d++) n *= ix->shape[d];
  const float* wt = (const float*)w->data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ix->dtype == DT_I64 ? ((const int64_t*)ix->data)[i] : ((const int32_t*)ix->data)[i];
    if (id < 0 || id >= V)
      return DT_FAIL(DT_ERR_INVALID_ARG, "embedding: index %lld out of range [0, %lld)",
                     (long long)id, (long long)V);
    int64_t row = id - v0;
    if (row >= 0 && row < vl) memcpy(o + i * D, wt + row * D, sizeof(float) * (size_t)D);
    else memset(o + i * D, 0, sizeof(float) * (size_t)D);
  }
  return DT_SUCCESS;
}

/* gather_dim: out[i] = x[i, idx[i]] for the local rows; a class outside the local column range
 * gives 0 (masked gather -> Partial(sum) when x is class-sharded). */
dt_status_t dt__kernel_gather_dim(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 1));
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  int64_t C = call->in[0].shape[1], c0 = x->offset[1], cl = x->shape[1], rows = x->shape[0];
  const float* xv = (const float*)x->data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < rows; i++) {
    int64_t c = ix->dtype == DT_I64 ? ((const int64_t*)ix->data)[i] : ((const int32_t*)ix->data)[i];
    if (c < 0 || c >= C)
      return DT_FAIL(DT_ERR_INVALID_ARG, "gather_dim: index %lld out of range [0, %lld)",
                     (long long)c, (long long)C);
    int64_t j = c - c0;
    o[i] = (j >= 0 && j < cl) ? xv[i * cl + j] : 0.0f;
  }
  return DT_SUCCESS;
}

/* linear: out (N, O) = x (N, K) weight^T + bias, weight (O, K) row-major. */
dt_status_t dt__kernel_linear(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, call->n_inputs));
  int64_t N = in[0].shape[0], K = in[0].shape[1], O = in[1].shape[0];
  float* o = (float*)out->data;
  DT_CHECK(dt__gemm(in[0].backend, 0, 1, N, O, K, 1.0f, (const float*)in[0].data, K,
                    (const float*)in[1].data, K, 0.0f, o, O));
  if (call->n_inputs == 3) {
    const float* b = (const float*)in[2].data;
    for (int64_t i = 0; i < N; i++)
      for (int64_t j = 0; j < O; j++) o[i * O + j] += b[j];
  }
  return DT_SUCCESS;
}

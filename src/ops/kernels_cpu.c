/* kernels_cpu.c - CPU kernels on local shards (f32): GEMM through OpenBLAS, broadcasting
 * pointwise ops. Kept apart from dispatch so a CUDA kernel can sit beside each one. */
#include <cblas.h>
#include <math.h>

#include "ops/ops.h"
#include "strategy/strategy.h"

static dt_status_t dt__need_f32(const dt_op_call_t* call, const dt_local_tensor_t* t, int n) {
  for (int i = 0; i < n; i++)
    if (t[i].dtype != DT_F32)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not supported yet (f32 only)", call->op,
                     dt_dtype_name(t[i].dtype));
  return DT_SUCCESS;
}

/* C (m,n) = A (m,k) B (k,n), row-major; empty dims are fine (k == 0 gives zeros). */
static void dt__sgemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    memset(c, 0, sizeof(float) * (size_t)(m * n));
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k,
              b, (int)n, 0.0f, c, (int)n);
}

dt_status_t dt__kernel_mm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                          dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 2));
  dt__sgemm(in[0].shape[0], in[1].shape[1], in[0].shape[1], (const float*)in[0].data,
            (const float*)in[1].data, (float*)out[0].data);
  return DT_SUCCESS;
}

dt_status_t dt__kernel_bmm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 2));
  int64_t B = in[0].shape[0], m = in[0].shape[1], k = in[0].shape[2], n = in[1].shape[2];
  for (int64_t i = 0; i < B; i++)
    dt__sgemm(m, n, k, (const float*)in[0].data + i * m * k, (const float*)in[1].data + i * k * n,
              (float*)out[0].data + i * m * n);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * pointwise: the output's local shape is the broadcast of the inputs' local shapes */

typedef float (*dt__binop_t)(float, float);
static float dt__f_add(float a, float b) { return a + b; }
static float dt__f_sub(float a, float b) { return a - b; }
static float dt__f_mul(float a, float b) { return a * b; }
static float dt__f_div(float a, float b) { return a / b; }
static float dt__f_max(float a, float b) { return (a > b || a != a) ? a : b; }
static float dt__f_min(float a, float b) { return (a < b || a != a) ? a : b; }

static dt_status_t dt__binary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out, dt__binop_t f) {
  DT_CHECK(dt__need_f32(call, in, 2));
  const int nd = out->ndim;
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= out->shape[d];
  const float *a = (const float*)in[0].data, *b = (const float*)in[1].data;
  float* o = (float*)out->data;
  int same = in[0].ndim == nd && in[1].ndim == nd;
  for (int d = 0; same && d < nd; d++)
    same = in[0].shape[d] == out->shape[d] && in[1].shape[d] == out->shape[d];
  if (same) {
    for (int64_t i = 0; i < n; i++) o[i] = f(a[i], b[i]);
    return DT_SUCCESS;
  }
  /* strides with 0 on broadcast dims */
  int64_t sa[DT_MAX_DIMS], sb[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0};
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
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < n; i++) {
    o[i] = f(a[ia], b[ib]);
    for (int d = nd - 1; d >= 0; d--) {
      ia += sa[d];
      ib += sb[d];
      if (++idx[d] < out->shape[d]) break;
      ia -= sa[d] * idx[d];
      ib -= sb[d] * idx[d];
      idx[d] = 0;
    }
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

typedef float (*dt__unop_t)(float);
static float dt__f_neg(float x) { return -x; }
static float dt__f_relu(float x) { return x > 0.0f ? x : 0.0f; }
static float dt__f_exp(float x) { return expf(x); }
static float dt__f_log(float x) { return logf(x); }
static float dt__f_sqrt(float x) { return sqrtf(x); }
static float dt__f_rsqrt(float x) { return 1.0f / sqrtf(x); }
static float dt__f_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static float dt__f_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float dt__f_silu(float x) { return x / (1.0f + expf(-x)); }
static float dt__f_tanh(float x) { return tanhf(x); }

static dt_status_t dt__unary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out, dt__unop_t f) {
  DT_CHECK(dt__need_f32(call, in, 1));
  int64_t n = 1;
  for (int d = 0; d < out->ndim; d++) n *= out->shape[d];
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n; i++) o[i] = f(a[i]);
  return DT_SUCCESS;
}

#define DT__UNARY_KERNEL(name, f)                                                       \
  dt_status_t name(const dt_op_call_t* call, const dt_local_tensor_t* in,               \
                   dt_local_tensor_t* out) {                                            \
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

dt_status_t dt__kernel_mul_scalar(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, in, 1));
  if (call->n_fargs != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mul_scalar takes one scalar argument, got %d",
                   call->n_fargs);
  int64_t n = 1;
  for (int d = 0; d < out->ndim; d++) n *= out->shape[d];
  float s = (float)call->fargs[0];
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n; i++) o[i] = a[i] * s;
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * reductions over dims (iargs [keepdim, dim...]); mean divides by the GLOBAL count of reduced
 * elements so that a sharded reduced dim yields an exact Partial(sum) */

static dt_status_t dt__reduce(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out, int kind) {
  DT_CHECK(dt__need_f32(call, in, 1));
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(call, &mask, &keep));
  int64_t on = 1, count = 1;
  for (int d = 0; d < out->ndim; d++) on *= out->shape[d];
  for (int d = 0; d < in->ndim; d++)
    if (mask & (1u << d)) count *= call->in[0].shape[d]; /* global extent */
  float* o = (float*)out->data;
  float init = kind == 2 ? -INFINITY : kind == 3 ? INFINITY : 0.0f;
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
  if (kind == 1 && count > 0)
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

/* kernels_optim.c - CPU kernels of the in-place update ops: the AdamW step (f32 math, f32 or
 * bf16 moments), gradient scaling, and the local sum of squares of a gradient norm. */
#include <math.h>

#include "ops/ops.h"

/* in: param (f32), grad (f32), exp_avg, exp_avg_sq (f32 or bf16), step (0-d i64; incremented
 * here, then the bias corrections use it); fargs: lr, beta1, beta2, eps, weight_decay.
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   p -= lr (wd p + (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps))
 * f32 moments: the update in f32 (it vectorizes); bf16 moments: in double, the moments rounded
 * to bf16 once per step. */
DT_SIMD dt_status_t dt__kernel_adamw(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  (void)out;
  const double lr = dt__op_farg(DT_OP_ADAMW, call, 0), b1 = dt__op_farg(DT_OP_ADAMW, call, 1),
               b2 = dt__op_farg(DT_OP_ADAMW, call, 2), eps = dt__op_farg(DT_OP_ADAMW, call, 3),
               wd = dt__op_farg(DT_OP_ADAMW, call, 4);
  int64_t* step = (int64_t*)in[4].data;
  const int64_t t = ++*step;
  const double c1 = 1.0 - pow(b1, (double)t), c2 = 1.0 - pow(b2, (double)t);
  const int64_t n = dt__local_numel(&in[0]);
  float* pw = (float*)in[0].data;
  const float* pg = (const float*)in[1].data;
  if (in[2].dtype == DT_BF16) {
    uint16_t *m = (uint16_t*)in[2].data, *v = (uint16_t*)in[3].data;
    for (int64_t k = 0; k < n; k++) {
      float gk = pg[k];
      float mk = (float)(b1 * dt__bf16_to_f32(m[k]) + (1 - b1) * gk);
      float vk = (float)(b2 * dt__bf16_to_f32(v[k]) + (1 - b2) * gk * gk);
      m[k] = dt__f32_to_bf16(mk);
      v[k] = dt__f32_to_bf16(vk);
      pw[k] -= (float)(lr * (wd * pw[k] + (mk / c1) / (sqrt(vk / c2) + eps)));
    }
    return DT_SUCCESS;
  }
  float *m = (float*)in[2].data, *v = (float*)in[3].data;
  const float fb1 = (float)b1, fb2 = (float)b2, a1 = (float)(1 - b1), a2 = (float)(1 - b2);
  const float ic1 = (float)(1.0 / c1), ic2 = (float)(1.0 / c2), flr = (float)lr,
              fwd = (float)wd, feps = (float)eps;
  for (int64_t k = 0; k < n; k++) {
    float gk = pg[k];
    float mk = fb1 * m[k] + a1 * gk, vk = fb2 * v[k] + a2 * gk * gk;
    m[k] = mk;
    v[k] = vk;
    pw[k] -= flr * (fwd * pw[k] + (mk * ic1) / (sqrtf(vk * ic2) + feps));
  }
  return DT_SUCCESS;
}

/* x *= alpha in place (f32 exactly as x * (float)alpha; bf16/f16 through f32). */
DT_SIMD dt_status_t dt__kernel_scale_(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  (void)out;
  const int64_t n = dt__local_numel(&in[0]);
  const float a = (float)dt__op_farg(DT_OP_SCALE_, call, 0);
  if (in[0].dtype == DT_F32) {
    float* x = (float*)in[0].data;
    for (int64_t k = 0; k < n; k++) x[k] *= a;
    return DT_SUCCESS;
  }
  for (int64_t k = 0; k < n; k++)
    dt__store(in[0].data, in[0].dtype, k, (double)((float)dt__load(in[0].data, in[0].dtype, k) * a));
  return DT_SUCCESS;
}

/* out (0-d f32) = sum of x^2 over the local elements, accumulated in double. */
DT_SIMD dt_status_t dt__kernel_sumsq(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  (void)call;
  const int64_t n = dt__local_numel(&in[0]);
  double s = 0.0;
  if (in[0].dtype == DT_F32) {
    s = dt__dot_d((const float*)in[0].data, (const float*)in[0].data, n);
  } else {
    for (int64_t k = 0; k < n; k++) {
      double x = dt__load(in[0].data, in[0].dtype, k);
      s += x * x;
    }
  }
  *(float*)out[0].data = (float)s;
  return DT_SUCCESS;
}

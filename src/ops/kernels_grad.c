/* kernels_grad.c - CPU kernels of the backward ops (f32): act_grad, rms_norm_grad,
 * layer_norm_grad, embedding_grad and sdpa_grad (attention recomputed from q, k, v). */
#include <math.h>

#include "ops/ops.h"

static dt_status_t dt__f32(const dt_op_call_t* call, const dt_local_tensor_t* t, int n) {
  for (int i = 0; i < n; i++)
    if (t[i].dtype != DT_F32)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s not supported", call->op,
                     dt_dtype_name(t[i].dtype));
  return DT_SUCCESS;
}

/* g * f'(x); x and g share the local shape (broadcasting is not needed by the backward rules). */
DT_SIMD dt_status_t dt__kernel_act_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                        dt_local_tensor_t* out) {
  DT_CHECK(dt__f32(call, in, 2));
  int64_t n = dt__local_numel(out);
  if (dt__local_numel(&in[0]) != n || dt__local_numel(&in[1]) != n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad: g and x must have the same shape");
  const float *g = (const float*)in[0].data, *x = (const float*)in[1].data;
  float* o = (float*)out->data;
  switch ((int)call->iargs[0]) {
    case DT_ACT_RELU:
      for (int64_t i = 0; i < n; i++) o[i] = x[i] <= 0.0f ? 0.0f : g[i]; /* NaN x: g, as PyTorch */
      break;
    case DT_ACT_SILU:
      for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + dt__expf(-x[i]));
        o[i] = g[i] * s * (1.0f + x[i] * (1.0f - s));
      }
      break;
    case DT_ACT_GELU:
      for (int64_t i = 0; i < n; i++) {
        float cdf = 0.5f * (1.0f + erff(x[i] * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * dt__expf(-0.5f * x[i] * x[i]);
        o[i] = g[i] * (cdf + x[i] * pdf);
      }
      break;
    case DT_ACT_SIGMOID_OUT:
      for (int64_t i = 0; i < n; i++) o[i] = g[i] * x[i] * (1.0f - x[i]);
      break;
    case DT_ACT_TANH_OUT:
      for (int64_t i = 0; i < n; i++) o[i] = g[i] * (1.0f - x[i] * x[i]);
      break;
    case DT_ACT_ABS: /* g * sign(x), sign(0) = sign(NaN) = 0: an infinite g at 0 gives NaN */
      for (int64_t i = 0; i < n; i++)
        o[i] = g[i] * (float)((x[i] > 0.0f) - (x[i] < 0.0f));
      break;
    case DT_ACT_CLAMP: { /* g where lo <= x <= hi (absent bounds: infinities), else 0 */
      const double dlo = dt__op_farg(DT_OP_ACT_GRAD, call, 0);
      const double dhi = dt__op_farg(DT_OP_ACT_GRAD, call, 1);
      const float lo = isnan(dlo) ? -INFINITY : (float)dlo, hi = isnan(dhi) ? INFINITY : (float)dhi;
      for (int64_t i = 0; i < n; i++) o[i] = (x[i] >= lo && x[i] <= hi) ? g[i] : 0.0f;
      break;
    }
    default: return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad: kind %lld", (long long)call->iargs[0]);
  }
  return DT_SUCCESS;
}

/* Norm over the last dim (whole here): gx and this rank's rows' contribution to gw. */
DT_SIMD static dt_status_t dt__norm_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                         dt_local_tensor_t* out, int layer) {
  DT_CHECK(dt__f32(call, in, 3));
  const double eps = dt__op_farg(layer ? DT_OP_LAYER_NORM_GRAD : DT_OP_RMS_NORM_GRAD, call, 0);
  const dt_local_tensor_t* x = &in[1];
  int64_t D = x->shape[x->ndim - 1], rows = D ? dt__local_numel(x) / D : 0;
  const float *g = (const float*)in[0].data, *xv = (const float*)x->data,
              *w = (const float*)in[2].data;
  float *gx = (float*)out[0].data, *gw = (float*)out[1].data;
  for (int64_t j = 0; j < D; j++) gw[j] = 0.0f;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = xv + r * D, *gr = g + r * D;
    float* gxr = gx + r * D;
    double mean = layer ? dt__sum_d(xr, D) / (double)D : 0.0, var, m1, m2;
#define DT__TERM_(j) (((double)xr[j] - mean) * ((double)xr[j] - mean))
    DT__SUM8(D, DT__TERM_, var);
#undef DT__TERM_
    double inv = 1.0 / sqrt(var / (double)D + eps);
    /* xhat = (x - mean) inv; dxhat = g w; gx = inv (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
     * the mean(dxhat) term only for layer norm */
#define DT__TERM_(j) ((double)gr[j] * w[j])
    DT__SUM8(D, DT__TERM_, m1);
#undef DT__TERM_
#define DT__TERM_(j) ((double)gr[j] * w[j] * (((double)xr[j] - mean) * inv))
    DT__SUM8(D, DT__TERM_, m2);
#undef DT__TERM_
    for (int64_t j = 0; j < D; j++) gw[j] += (float)((double)gr[j] * (((double)xr[j] - mean) * inv));
    m1 /= (double)D;
    m2 /= (double)D;
    for (int64_t j = 0; j < D; j++) {
      double xh = ((double)xr[j] - mean) * inv, dxh = (double)gr[j] * w[j];
      gxr[j] = (float)(inv * (dxh - (layer ? m1 : 0.0) - xh * m2));
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt__kernel_rms_norm_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                     dt_local_tensor_t* out) {
  return dt__norm_grad(call, in, out, 0);
}
dt_status_t dt__kernel_layer_norm_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                       dt_local_tensor_t* out) {
  return dt__norm_grad(call, in, out, 1);
}

/* gw[idx[i]] += g[i] for the local rows (offset[0] .. + shape[0]) and columns of gw. */
dt_status_t dt__kernel_embedding_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out) {
  DT_CHECK(dt__f32(call, in, 1));
  const dt_local_tensor_t *g = &in[0], *ix = &in[1];
  int64_t V = call->iargs[0], v0 = out->offset[0], vl = out->shape[0], D = out->shape[1];
  int64_t n = dt__local_numel(ix);
  float* o = (float*)out->data;
  if (vl * D > 0) memset(o, 0, sizeof(float) * (size_t)(vl * D));
  const float* gv = (const float*)g->data;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ix->dtype == DT_I64 ? ((const int64_t*)ix->data)[i] : ((const int32_t*)ix->data)[i];
    if (id < 0 || id >= V)
      return DT_FAIL(DT_ERR_INVALID_ARG, "embedding_grad: index %lld out of range [0, %lld)",
                     (long long)id, (long long)V);
    int64_t r = id - v0;
    if (r < 0 || r >= vl) continue;
    for (int64_t j = 0; j < D; j++) o[r * D + j] += gv[i * D + j];
  }
  return DT_SUCCESS;
}

/* Attention backward, per (batch, head): recompute P = softmax(scale q k^T (+mask)), then
 * dv += P^T g, dP = g v^T, dS = P * (dP - rowsum(dP * P)), dq = scale dS k, dk += scale dS^T q. */
dt_status_t dt__kernel_sdpa_grad(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  DT_CHECK(dt__f32(call, in, 4));
  const dt_local_tensor_t *q = &in[0], *k = &in[1], *v = &in[2], *g = &in[3];
  const int layout = (int)dt__op_iarg(DT_OP_SDPA_GRAD, call, 1); /* validated by the rules */
  int64_t B = q->shape[0], H, S, D, G, T, E, Gv, Tv;
  dt__attn_geom(q, layout, &H, &S, &D);
  dt__attn_geom(k, layout, &G, &T, &D);
  dt__attn_geom(v, layout, &Gv, &Tv, &E);
  const int causal = (int)dt__op_iarg(DT_OP_SDPA_GRAD, call, 0);
  double scale = dt__op_farg(DT_OP_SDPA_GRAD, call, 0); /* NaN: the op's default 1/sqrt(D) */
  if (isnan(scale)) scale = 1.0 / sqrt((double)D);
  int64_t rep = G > 0 ? H / G : 1, q0 = q->offset[layout ? 1 : 2];
  int lq = (int)(layout ? H * D : D), lk = (int)(layout ? G * D : D), lv = (int)(layout ? G * E : E),
      lg = (int)(layout ? H * E : E);
  float *dq = (float*)out[0].data, *dk = (float*)out[1].data, *dv = (float*)out[2].data;
  memset(dq, 0, sizeof(float) * (size_t)dt__local_numel(&out[0]));
  memset(dk, 0, sizeof(float) * (size_t)dt__local_numel(&out[1]));
  memset(dv, 0, sizeof(float) * (size_t)dt__local_numel(&out[2]));
  if (B * H * S * T == 0) return DT_SUCCESS;
  dt_backend_t bk = in[0].backend;
  size_t pn = dt__kernel_scratch_nbytes(DT_OP_SDPA_GRAD, call, in);
  float* p = (float*)dt__backend_alloc(bk, pn);
  if (p != NULL) dt__mem_count(DT_MEM_OTHER, (int64_t)pn);
  if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "sdpa_grad: scores");
  dt_status_t st = DT_SUCCESS;
  const int64_t rb = dt__attn_row_block(S); /* query rows per block */
  float* dp = p + rb * T;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t gi = h / rep;
      int64_t oq = dt__attn_base(layout, b, h, H, S, D), ok = dt__attn_base(layout, b, gi, G, T, D),
              ov = dt__attn_base(layout, b, gi, G, T, E), og = dt__attn_base(layout, b, h, H, S, E);
      const float *qh = (const float*)q->data + oq, *kh = (const float*)k->data + ok,
                  *vh = (const float*)v->data + ov, *gh = (const float*)g->data + og;
      float *dqh = dq + oq, *dkh = dk + ok, *dvh = dv + ov;
      /* blocks of query rows (causal: over the keys they see); dk, dv accumulate block by block */
      for (int64_t i0 = 0; i0 < S && st == DT_SUCCESS; i0 += rb) {
        const int64_t rn = S - i0 < rb ? S - i0 : rb, kn = dt__attn_keys_seen(causal, q0, i0, rn, T);
        float *pb = p, *dpb = dp; /* rn rows of kn, T apart */
        const float *qb = qh + i0 * lq, *gb = gh + i0 * lg;
        st = dt__attn_block_probs(bk, qb, lq, kh, lk, rn, kn, D, scale, pb, T, q0 + i0, causal);
        if (E > 0) {
          /* dv += P^T g ; dP = g v^T */
          if (st == DT_SUCCESS)
            st = dt__gemm(bk, 1, 0, kn, E, rn, 1.0f, pb, T, gb, lg, 1.0f, dvh, lv);
          if (st == DT_SUCCESS)
            st = dt__gemm(bk, 0, 1, rn, kn, E, 1.0f, gb, lg, vh, lv, 0.0f, dpb, T);
        } else {
          for (int64_t i = 0; i < rn; i++) memset(dpb + i * T, 0, sizeof(float) * (size_t)kn);
        }
        for (int64_t i = 0; i < rn; i++) {
          float *pr = pb + i * T, *dr = dpb + i * T;
          int64_t vis = causal ? q0 + i0 + i + 1 : kn; /* P is 0 past the visible keys */
          if (vis > kn) vis = kn;
          float dot = (float)dt__dot_d(pr, dr, vis);
          for (int64_t j = 0; j < kn; j++) dr[j] = pr[j] * (dr[j] - dot);
        }
        if (D > 0) {
          if (st == DT_SUCCESS)
            st = dt__gemm(bk, 0, 0, rn, D, kn, (float)scale, dpb, T, kh, lk, 0.0f, dqh + i0 * lq,
                          lq);
          if (st == DT_SUCCESS)
            st = dt__gemm(bk, 1, 0, kn, D, rn, (float)scale, dpb, T, qb, lq, 1.0f, dkh, lk);
        }
      }
    }
  dt__backend_free(bk, p, pn);
  dt__mem_count(DT_MEM_OTHER, -(int64_t)pn);
  return st;
}

/* kernels_nn.c - CPU kernels of the model ops on local shards (f32 compute; dispatch converts
 * bf16/f16 storage on load and store): addmm, scalar ops, pow, cast, where/masked_fill, scaled
 * dot-product attention, rotary embedding, topk, gather, scatter_add, dropout. */
#include <math.h>
#include <stdlib.h>

#include "ops/ops.h"

static dt_status_t dt__need_f32(const dt_op_call_t* call, const dt_local_tensor_t* t) {
  if (t->dtype != DT_F32)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not supported by the CPU kernel", call->op,
                   dt_dtype_name(t->dtype));
  return DT_SUCCESS;
}

static int64_t dt__index_at(const dt_local_tensor_t* t, int64_t i) {
  return t->dtype == DT_I64 ? ((const int64_t*)t->data)[i] : ((const int32_t*)t->data)[i];
}

/* Row-major strides of `t` against the broadcast output shape (0 on broadcast dims). */
static void dt__bstrides(const dt_local_tensor_t* t, const dt_local_tensor_t* out, int64_t* s) {
  int nd = out->ndim;
  int64_t st = 1;
  for (int d = nd - 1; d >= 0; d--) {
    int td = d - (nd - t->ndim);
    int64_t len = td >= 0 ? t->shape[td] : 1;
    s[d] = (len == 1 && out->shape[d] != 1) ? 0 : st;
    st *= len;
  }
}

/* ---------------------------------------------------------------------------------------------
 * addmm: out = beta * input + alpha * mat1 mat2 */

dt_status_t dt__kernel_addmm(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  for (int t = 0; t < 3; t++) DT_CHECK(dt__need_f32(call, &in[t]));
  const double beta = dt__op_farg(DT_OP_ADDMM, call, 0), alpha = dt__op_farg(DT_OP_ADDMM, call, 1);
  int64_t M = in[1].shape[0], K = in[1].shape[1], N = in[2].shape[1];
  const float* b = (const float*)in[0].data;
  float* o = (float*)out->data;
  int two = in[0].ndim == 2;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) o[i * N + j] = (float)beta * b[two ? i * N + j : j];
  return dt__gemm(in[0].backend, 0, 0, M, N, K, (float)alpha, (const float*)in[1].data, K,
                  (const float*)in[2].data, N, 1.0f, o, N);
}

/* ---------------------------------------------------------------------------------------------
 * scalar ops, pow, cast */

dt_status_t dt__kernel_add_scalar(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  int64_t n = dt__local_numel(out);
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  float s = (float)call->fargs[0];
  for (int64_t i = 0; i < n; i++) o[i] = a[i] + s;
  return DT_SUCCESS;
}

dt_status_t dt__kernel_mul_scalar(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  int64_t n = dt__local_numel(out);
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  float s = (float)call->fargs[0];
  for (int64_t i = 0; i < n; i++) o[i] = a[i] * s;
  return DT_SUCCESS;
}

/* pow as PyTorch computes it: the exponents 0.5, -0.5, 2, 3, -1 and -2 as sqrt, rsqrt, x x,
 * x x x, 1 / x and 1 / (x x) (so pow(-inf, 0.5) is NaN and pow(-0.0, -0.5) is -inf, where powf
 * gives inf and inf), every other one through powf. */
dt_status_t dt__kernel_pow(const dt_op_call_t* call, const dt_local_tensor_t* in,
                           dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  int64_t n = dt__local_numel(out);
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  float s = (float)call->fargs[0];
  if (s == 2.0f)
    for (int64_t i = 0; i < n; i++) o[i] = a[i] * a[i];
  else if (s == 3.0f)
    for (int64_t i = 0; i < n; i++) o[i] = a[i] * a[i] * a[i];
  else if (s == 0.5f)
    for (int64_t i = 0; i < n; i++) o[i] = sqrtf(a[i]);
  else if (s == -0.5f)
    for (int64_t i = 0; i < n; i++) o[i] = 1.0f / sqrtf(a[i]);
  else if (s == -1.0f)
    for (int64_t i = 0; i < n; i++) o[i] = 1.0f / a[i];
  else if (s == -2.0f)
    for (int64_t i = 0; i < n; i++) o[i] = 1.0f / (a[i] * a[i]);
  else
    for (int64_t i = 0; i < n; i++) o[i] = powf(a[i], s);
  return DT_SUCCESS;
}

/* clamp, fargs [min, max] (NaN or absent: no bound): min first, then max, as PyTorch (min > max
 * gives max everywhere); a NaN element stays NaN; the bounds are rounded to f32 like PyTorch's
 * scalars for an f32 tensor. */
DT_SIMD dt_status_t dt__kernel_clamp(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                     dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  const double dlo = dt__op_farg(DT_OP_CLAMP, call, 0), dhi = dt__op_farg(DT_OP_CLAMP, call, 1);
  /* an absent side compares against an infinity: never true for a number or a NaN */
  const float lo = isnan(dlo) ? -INFINITY : (float)dlo, hi = isnan(dhi) ? INFINITY : (float)dhi;
  const int64_t n = dt__local_numel(out);
  const float* a = (const float*)in[0].data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n; i++) {
    float v = a[i] < lo ? lo : a[i];
    o[i] = v > hi ? hi : v;
  }
  return DT_SUCCESS;
}

/* cast: element-wise conversion. Float to integer truncates toward zero (as PyTorch); NaN, inf
 * and values outside the integer type are an error rather than PyTorch's platform-dependent
 * value (x86: the type's minimum). Integer to integer is exact, narrowing wraps modulo 2^32 (as
 * PyTorch); integer to float rounds once. */
dt_status_t dt__kernel_cast(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  (void)call;
  int64_t n = dt__local_numel(out);
  int to_int = !dt__dtype_is_float(out->dtype), from_int = !dt__dtype_is_float(in[0].dtype);
  if (!to_int && !from_int) /* float to float: the same values, vectorized */
    return dt__host_convert(in[0].backend, in[0].data, in[0].dtype, out->data, out->dtype, n);
  for (int64_t i = 0; i < n; i++) {
    if (from_int) {
      int64_t v = dt__index_at(&in[0], i);
      if (out->dtype == DT_I64) ((int64_t*)out->data)[i] = v;
      else if (out->dtype == DT_I32) ((int32_t*)out->data)[i] = (int32_t)(uint32_t)(uint64_t)v;
      else if (out->dtype == DT_F32) ((float*)out->data)[i] = (float)v;
      else dt__store(out->data, out->dtype, i, (double)(float)v);
      continue;
    }
    double v = dt__load(in[0].data, in[0].dtype, i);
    if (to_int) {
      const double lim = out->dtype == DT_I32 ? 0x1p31 : 0x1p63;
      v = trunc(v);
      if (!(v >= -lim && v < lim)) /* NaN too */
        return DT_FAIL(DT_ERR_INVALID_ARG, "cast: %g cannot be converted to %s (NaN, inf and "
                       "values outside its range are refused)", dt__load(in[0].data, in[0].dtype, i),
                       dt_dtype_name(out->dtype));
    }
    dt__store(out->data, out->dtype, i, v);
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * where (cond, a, b) / masked_fill (x, mask) with broadcasting. The condition / mask may be of any
 * dtype, nonzero meaning true (NaN too, as C's != 0); the values are f32 or i32 / i64 (one dtype,
 * the output's), and masked_fill's value goes into integers truncated toward zero (the rules
 * checked that it fits). */

/* Whether element i of a condition is nonzero. */
static inline int dt__nonzero_at(const dt_local_tensor_t* c, int64_t i) {
  switch (c->dtype) {
    case DT_I64: return ((const int64_t*)c->data)[i] != 0;
    case DT_I32: return ((const int32_t*)c->data)[i] != 0;
    case DT_F32: return ((const float*)c->data)[i] != 0.0f;
    default: return dt__load(c->data, c->dtype, i) != 0.0; /* bf16 / f16 */
  }
}

static dt_status_t dt__select(int where, const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  const dt_local_tensor_t *c = &in[where ? 0 : 1], *a = &in[where ? 1 : 0];
  const dt_local_tensor_t* b = where ? &in[2] : NULL;
  const int integer = a->dtype == DT_I32 || a->dtype == DT_I64;
  if (integer) {
    if (out->dtype != a->dtype || (b && b->dtype != a->dtype))
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: values of dtype %s and %s are not supported "
                     "(one dtype: the rules promote them)", call->op, dt_dtype_name(a->dtype),
                     dt_dtype_name(b ? b->dtype : out->dtype));
  } else {
    DT_CHECK(dt__need_f32(call, a));
    if (b) DT_CHECK(dt__need_f32(call, b));
  }
  const int w = a->dtype == DT_I64;
  float fill = where ? 0.0f : (float)call->fargs[0];
  const int64_t ifill = where ? 0 : (int64_t)call->fargs[0]; /* in range: dt__fill_check */
  int nd = out->ndim;
  int64_t sc[DT_MAX_DIMS], sa[DT_MAX_DIMS], sb[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0};
  dt__bstrides(c, out, sc);
  dt__bstrides(a, out, sa);
  if (b) dt__bstrides(b, out, sb);
  else memset(sb, 0, sizeof sb);
  const float *av = (const float*)a->data, *bv = b ? (const float*)b->data : NULL;
  float* o = (float*)out->data;
  int64_t n = dt__local_numel(out), ic = 0, ia = 0, ib = 0;
  /* one loop per value dtype (the dtype test out of the loop) */
#define DT__SELECT_LOOP(STORE)                   \
  for (int64_t i = 0; i < n; i++) {              \
    const int sel = dt__nonzero_at(c, ic);       \
    STORE;                                       \
    for (int d = nd - 1; d >= 0; d--) {          \
      ic += sc[d];                               \
      ia += sa[d];                               \
      ib += sb[d];                               \
      if (++idx[d] < out->shape[d]) break;       \
      ic -= sc[d] * idx[d];                      \
      ia -= sa[d] * idx[d];                      \
      ib -= sb[d] * idx[d];                      \
      idx[d] = 0;                                \
    }                                            \
  }
  if (!integer) {
    DT__SELECT_LOOP(o[i] = where ? (sel ? av[ia] : bv[ib]) : (sel ? fill : av[ia]));
  } else if (w) {
    const int64_t *x = (const int64_t*)a->data, *y = b ? (const int64_t*)b->data : NULL;
    int64_t* r = (int64_t*)out->data;
    DT__SELECT_LOOP(r[i] = where ? (sel ? x[ia] : y[ib]) : (sel ? ifill : x[ia]));
  } else {
    const int32_t *x = (const int32_t*)a->data, *y = b ? (const int32_t*)b->data : NULL;
    int32_t* r = (int32_t*)out->data;
    DT__SELECT_LOOP(r[i] = where ? (sel ? x[ia] : y[ib]) : (sel ? (int32_t)ifill : x[ia]));
  }
#undef DT__SELECT_LOOP
  return DT_SUCCESS;
}

dt_status_t dt__kernel_where(const dt_op_call_t* call, const dt_local_tensor_t* in,
                             dt_local_tensor_t* out) {
  return dt__select(1, call, in, out);
}
dt_status_t dt__kernel_masked_fill(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                   dt_local_tensor_t* out) {
  return dt__select(0, call, in, out);
}

/* ---------------------------------------------------------------------------------------------
 * scaled dot-product attention on the local (batch, heads, queries); keys and values whole */

DT_SIMD static void dt__attn_softmax_rows(float* p, int64_t S, int64_t T, int64_t ld,
                                          int64_t q0, int causal) {
  for (int64_t i = 0; i < S; i++) {
    float* row = p + i * ld;
    int64_t last = causal ? q0 + i : T - 1; /* keys 0..last are visible */
    if (last > T - 1) last = T - 1;
    float mx = dt__max_f(row, last + 1, -INFINITY);
    for (int64_t j = 0; j <= last; j++) row[j] = dt__expf(row[j] - mx);
    double sum = dt__sum_d(row, last + 1);
    float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t j = 0; j <= last; j++) row[j] *= inv;
    for (int64_t j = last + 1; j < T; j++) row[j] = 0.0f;
  }
}

dt_status_t dt__attn_block_probs(dt_backend_t bk, const float* q, int lq, const float* k, int lk,
                                 int64_t rn, int64_t kn, int64_t D, double scale, float* p,
                                 int64_t ld, int64_t q0, int causal) {
  if (D > 0)
    DT_CHECK(dt__gemm(bk, 0, 1, rn, kn, D, (float)scale, q, lq, k, lk, 0.0f, p, ld));
  else
    for (int64_t i = 0; i < rn; i++) memset(p + i * ld, 0, sizeof(float) * (size_t)kn);
  dt__attn_softmax_rows(p, rn, kn, ld, q0, causal);
  return DT_SUCCESS;
}

/* Geometry of one attention operand on this rank: heads, sequence, feature size, and where the
 * (batch b, head h) matrix starts and its row stride, for layout 0 (B, H, S, D) or 1 (B, S, H, D).
 * Layout 1 hands BLAS strided rows instead of transposing the tensors around attention. */
void dt__attn_geom(const dt_local_tensor_t* t, int layout, int64_t* heads, int64_t* seq,
                   int64_t* feat) {
  *heads = t->shape[layout ? 2 : 1];
  *seq = t->shape[layout ? 1 : 2];
  *feat = t->shape[3];
}
int64_t dt__attn_base(int layout, int64_t b, int64_t h, int64_t heads, int64_t seq, int64_t feat) {
  return layout ? (b * seq * heads + h) * feat : (b * heads + h) * seq * feat;
}

size_t dt__kernel_scratch_nbytes(int id, const dt_op_call_t* call, const dt_local_tensor_t* in) {
  if (id != DT_OP_SDPA && id != DT_OP_SDPA_GRAD) return 0;
  const int layout = (int)dt__op_iarg(id, call, 1);
  int64_t H, S, D, G, T;
  dt__attn_geom(&in[0], layout, &H, &S, &D);
  dt__attn_geom(&in[1], layout, &G, &T, &D);
  if (in[0].shape[0] * H * S * T == 0) return 0; /* nothing to score: no allocation */
  return sizeof(float) * (size_t)(dt__attn_row_block(S) * T) * (id == DT_OP_SDPA_GRAD ? 2u : 1u);
}

dt_status_t dt__kernel_sdpa(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  for (int t = 0; t < 3; t++) DT_CHECK(dt__need_f32(call, &in[t]));
  const dt_local_tensor_t *q = &in[0], *k = &in[1], *v = &in[2];
  const int layout = (int)dt__op_iarg(DT_OP_SDPA, call, 1); /* validated by the rules */
  int64_t B = q->shape[0], H, S, D, G, T, E, Gv, Tv;
  dt__attn_geom(q, layout, &H, &S, &D);
  dt__attn_geom(k, layout, &G, &T, &D);
  dt__attn_geom(v, layout, &Gv, &Tv, &E);
  const int causal = (int)dt__op_iarg(DT_OP_SDPA, call, 0);
  double scale = dt__op_farg(DT_OP_SDPA, call, 0); /* NaN: the op's default 1/sqrt(D) */
  if (isnan(scale)) scale = 1.0 / sqrt((double)D);
  int64_t rep = G > 0 ? H / G : 1, q0 = q->offset[layout ? 1 : 2];
  int lq = (int)(layout ? H * D : D), lk = (int)(layout ? G * D : D), lv = (int)(layout ? G * E : E),
      lo = (int)(layout ? H * E : E);
  float* o = (float*)out->data;
  if (B * H * S == 0) return DT_SUCCESS;
  if (T == 0) {
    memset(o, 0, sizeof(float) * (size_t)(B * H * S * E));
    return DT_SUCCESS;
  }
  dt_backend_t bk = in[0].backend;
  size_t pn = dt__kernel_scratch_nbytes(DT_OP_SDPA, call, in);
  float* p = (float*)dt__backend_alloc(bk, pn);
  if (p != NULL) dt__mem_count(DT_MEM_OTHER, (int64_t)pn);
  if (p == NULL)
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "sdpa: %zu bytes of block scores", pn);
  dt_status_t st = DT_SUCCESS;
  const int64_t rb = dt__attn_row_block(S); /* query rows per block */
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t g = h / rep;
      const float* qh = (const float*)q->data + dt__attn_base(layout, b, h, H, S, D);
      const float* kh = (const float*)k->data + dt__attn_base(layout, b, g, G, T, D);
      const float* vh = (const float*)v->data + dt__attn_base(layout, b, g, G, T, E);
      float* oh = o + dt__attn_base(layout, b, h, H, S, E);
      for (int64_t i0 = 0; i0 < S && st == DT_SUCCESS; i0 += rb) {
        const int64_t rn = S - i0 < rb ? S - i0 : rb, kn = dt__attn_keys_seen(causal, q0, i0, rn, T);
        /* the block's probabilities in p: rn rows of kn, T apart */
        st = dt__attn_block_probs(bk, qh + i0 * lq, lq, kh, lk, rn, kn, D, scale, p, T, q0 + i0,
                                  causal);
        if (E > 0 && st == DT_SUCCESS)
          st = dt__gemm(bk, 0, 0, rn, E, kn, 1.0f, p, T, vh, lv, 0.0f, oh + i0 * lo, lo);
      }
    }
  dt__backend_free(bk, p, pn);
  dt__mem_count(DT_MEM_OTHER, -(int64_t)pn);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * rotary embedding (interleaved pairs), positions from the global index along seq_dim */

dt_status_t dt__kernel_rotary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  const dt_local_tensor_t* x = &in[0];
  int nd = x->ndim;
  const int64_t seq_dim = dt__op_iarg(DT_OP_ROTARY, call, 0); /* validated by the rules */
  const int sd = (int)(seq_dim < 0 ? seq_dim + nd : seq_dim);
  const double theta = dt__op_farg(DT_OP_ROTARY, call, 0);
  const double dir = dt__op_iarg(DT_OP_ROTARY, call, 1) ? -1.0 : 1.0; /* inverse rotation */
  const int64_t cp = dt__op_iarg(DT_OP_ROTARY, call, 2), seq = call->in[0].shape[sd];
  int64_t D = x->shape[nd - 1], rows = dt__local_numel(x) / (D ? D : 1);
  if (D == 0) return DT_SUCCESS;
  int64_t inner = 1; /* rows per step of seq_dim */
  for (int d = sd + 1; d < nd - 1; d++) inner *= x->shape[d];
  int64_t L = x->shape[sd], H2 = D / 2;
  /* cos/sin of every (local position, pair) once per call, not per element */
  double* cs = (double*)dt__malloc(sizeof(double) * (size_t)(2 * L * H2 + H2 + 1));
  if (cs == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "rotary: angle table");
  double* fr = cs + 2 * L * H2;
  for (int64_t i = 0; i < H2; i++) fr[i] = pow(theta, -2.0 * (double)i / (double)D);
  for (int64_t p = 0; p < L; p++)
    for (int64_t i = 0; i < H2; i++) {
      double ang = (double)dt__cp_position(x->offset[sd] + p, seq, cp) * fr[i];
      cs[2 * (p * H2 + i)] = cos(ang);
      cs[2 * (p * H2 + i) + 1] = dir * sin(ang);
    }
  const float* a = (const float*)x->data;
  float* o = (float*)out->data;
  for (int64_t r = 0; r < rows; r++) {
    const double* t = cs + 2 * ((r / inner) % L) * H2;
    const float* xr = a + r * D;
    float* yr = o + r * D;
    for (int64_t i = 0; i < H2; i++) {
      double c = t[2 * i], s = t[2 * i + 1], x0 = xr[2 * i], x1 = xr[2 * i + 1];
      yr[2 * i] = (float)(x0 * c - x1 * s);
      yr[2 * i + 1] = (float)(x0 * s + x1 * c);
    }
  }
  dt__free(cs);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * topk: values and i64 indices along dim (whole on this rank), sorted; NaN counts as largest,
 * ties go to the lower index */

typedef struct {
  float v;
  int64_t i;
} dt__vi_t;

static int dt__vi_cmp_desc(const void* pa, const void* pb) {
  const dt__vi_t *a = (const dt__vi_t*)pa, *b = (const dt__vi_t*)pb;
  int an = a->v != a->v, bn = b->v != b->v;
  if (an != bn) return an ? -1 : 1;
  if (!an && a->v != b->v) return a->v > b->v ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}
static int dt__vi_cmp_asc(const void* pa, const void* pb) {
  const dt__vi_t *a = (const dt__vi_t*)pa, *b = (const dt__vi_t*)pb;
  int an = a->v != a->v, bn = b->v != b->v;
  if (an != bn) return an ? 1 : -1;
  if (!an && a->v != b->v) return a->v < b->v ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

dt_status_t dt__kernel_topk(const dt_op_call_t* call, const dt_local_tensor_t* in,
                            dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  int64_t k;
  int dim, largest;
  DT_CHECK(dt__topk_args(call, &k, &dim, &largest));
  const dt_local_tensor_t* x = &in[0];
  int64_t outer = 1, inner = 1, L = x->shape[dim];
  for (int d = 0; d < dim; d++) outer *= x->shape[d];
  for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
  if (outer * inner == 0 || k == 0) return DT_SUCCESS;
  dt__vi_t* buf = (dt__vi_t*)dt__malloc(sizeof(dt__vi_t) * (size_t)(L ? L : 1));
  if (buf == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "topk: %lld entries", (long long)L);
  const float* a = (const float*)x->data;
  float* ov = (float*)out[0].data;
  int64_t* oi = (int64_t*)out[1].data;
  for (int64_t p = 0; p < outer; p++)
    for (int64_t q = 0; q < inner; q++) {
      for (int64_t j = 0; j < L; j++) buf[j] = (dt__vi_t){a[(p * L + j) * inner + q], j};
      qsort(buf, (size_t)L, sizeof *buf, largest ? dt__vi_cmp_desc : dt__vi_cmp_asc);
      for (int64_t j = 0; j < k; j++) {
        ov[(p * k + j) * inner + q] = buf[j].v;
        oi[(p * k + j) * inner + q] = buf[j].i;
      }
    }
  dt__free(buf);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * gather / scatter_add along dim; indices are global along dim, local coordinates elsewhere */

static dt_status_t dt__gather_scatter(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                      dt_local_tensor_t* out, int scatter) {
  const dt_local_tensor_t *x = &in[0], *ix = &in[1];
  DT_CHECK(dt__need_f32(call, x));
  if (scatter) DT_CHECK(dt__need_f32(call, &in[2]));
  int nd = x->ndim;
  int dim = (int)(call->iargs[0] < 0 ? call->iargs[0] + nd : call->iargs[0]);
  int64_t size = call->in[0].shape[dim], x0 = x->offset[dim], xl = x->shape[dim];
  int64_t xs[DT_MAX_DIMS], st = 1, idx[DT_MAX_DIMS] = {0};
  for (int d = nd - 1; d >= 0; d--) {
    xs[d] = st;
    st *= x->shape[d];
  }
  const float* xv = (const float*)x->data;
  float* o = (float*)out->data;
  const float* src = scatter ? (const float*)in[2].data : NULL;
  if (scatter && dt__local_numel(x) > 0) memcpy(o, xv, sizeof(float) * (size_t)dt__local_numel(x));
  int64_t n = dt__local_numel(ix), base = 0; /* base: x offset of idx's position with dim at 0 */
  for (int64_t i = 0; i < n; i++) {
    int64_t t = dt__index_at(ix, i);
    if (t < 0 || t >= size)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: index %lld out of range [0, %lld)", call->op,
                     (long long)t, (long long)size);
    int64_t r = t - x0;
    int here = r >= 0 && r < xl;
    if (scatter) {
      if (here) o[base + r * xs[dim]] += src[i];
    } else {
      o[i] = here ? xv[base + r * xs[dim]] : 0.0f;
    }
    for (int d = nd - 1; d >= 0; d--) {
      if (d != dim) base += xs[d];
      if (++idx[d] < ix->shape[d]) break;
      if (d != dim) base -= xs[d] * idx[d];
      idx[d] = 0;
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt__kernel_gather(const dt_op_call_t* call, const dt_local_tensor_t* in,
                              dt_local_tensor_t* out) {
  return dt__gather_scatter(call, in, out, 0);
}
dt_status_t dt__kernel_scatter_add(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                   dt_local_tensor_t* out) {
  return dt__gather_scatter(call, in, out, 1);
}

/* ---------------------------------------------------------------------------------------------
 * dropout with a counter-based mask over global indices: x times 1/(1-p) or 0 */

dt_status_t dt__kernel_dropout(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  DT_CHECK(dt__need_f32(call, &in[0]));
  const dt_local_tensor_t* x = &in[0];
  double p = call->fargs[0];
  uint64_t seed = (uint64_t)call->iargs[0];
  /* keep when the 53-bit uniform u >= p */
  uint64_t thresh = p >= 1.0 ? UINT64_MAX : (uint64_t)(p * 0x1.0p53);
  float scale = p >= 1.0 ? 0.0f : (float)(1.0 / (1.0 - p));
  int nd = x->ndim;
  const int64_t* gs = call->in[0].shape;
  int64_t n = dt__local_numel(x), idx[DT_MAX_DIMS] = {0};
  const float* a = (const float*)x->data;
  float* o = (float*)out->data;
  for (int64_t i = 0; i < n; i++) {
    uint64_t g = 0;
    for (int d = 0; d < nd; d++) g = g * (uint64_t)gs[d] + (uint64_t)(x->offset[d] + idx[d]);
    uint64_t u = dt__mix64(seed ^ dt__mix64(g)) >> 11;
    /* a product, as PyTorch's input * mask: a dropped NaN or inf gives NaN */
    o[i] = a[i] * ((p < 1.0 && u >= thresh) ? scale : 0.0f);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < x->shape[d]) break;
      idx[d] = 0;
    }
  }
  return DT_SUCCESS;
}

/* elementwise.cu - CUDA kernels of the pointwise ops (see cuda_ops.h for the conventions):
 * broadcasting binary ops and comparisons, unary math, scalar ops, pow, where / masked_fill,
 * cast, dropout, act_grad, and the in-place updates adamw and scale_ with the sum of squares of
 * a gradient norm (sumsq).
 *
 * The host kernels (src/ops/kernels_cpu.c, kernels_nn.c, kernels_optim.c, kernels_grad.c) define
 * every result. Where the host's float arithmetic is a fixed sequence of roundings (exp through
 * dt__expf, the AdamW update, act_grad), the device code spells the same sequence with
 * __fmul_rn / __fadd_rn so that nvcc cannot contract a * b + c into an fma: those results match
 * the host bit for bit. Library math (logf, tanhf, erff, powf, sinf, cosf, log1pf, expm1f) is
 * CUDA's, within its documented few ulp of glibc. Conversions (cast, bf16/f16 storage of scale_
 * and adamw) use the host's own rounding and NaN rules (dt__f32_to_bf16 and friends:
 * src/internal/common.h, src/core/util.c), not the CUDA intrinsics, whose NaN encodings differ.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "ops/cuda/cuda_ops.h"

/* Everything but the fill function has internal linkage: the file is compiled twice (nvcc and the
 * SIMT emulator) into one library, and the two builds' kernels must not meet at link time. */
namespace {

/* ---------------------------------------------------------------------------------------------
 * Shared helpers */

/* Grid-stride loop over i in [0, n). */
#define DT_EW_FOR(i, n)                                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
       i += (int64_t)gridDim.x * blockDim.x)

/* Broadcast geometry of up to three inputs against the output (row-major): the output's shape
 * and each input's element strides, 0 on broadcast dims (the host's dt__bstrides). `full` is set
 * when every input has the output's shape, so that element i of each input is element i. */
#define DT_EW_MAX_IN 3
struct dt_ew_shape {
  int nd, full;
  int64_t shape[DT_MAX_DIMS];
  int64_t stride[DT_EW_MAX_IN][DT_MAX_DIMS];
};

static void dt_ew_shape_init(dt_ew_shape* s, const dt_local_tensor_t* out,
                             const dt_local_tensor_t* const* in, int n_in) {
  memset(s, 0, sizeof *s);
  const int nd = out->ndim;
  s->nd = nd;
  s->full = 1;
  for (int d = 0; d < nd; d++) s->shape[d] = out->shape[d];
  for (int t = 0; t < n_in; t++) {
    int64_t st = 1;
    s->full &= in[t]->ndim == nd;
    for (int d = nd - 1; d >= 0; d--) {
      int td = d - (nd - in[t]->ndim);
      int64_t len = td >= 0 ? in[t]->shape[td] : 1;
      s->stride[t][d] = (len == 1 && out->shape[d] != 1) ? 0 : st;
      s->full &= len == out->shape[d];
      st *= len;
    }
  }
}

/* The element offsets of output element i in the first n_in inputs. */
__device__ __forceinline__ void dt_ew_offsets(const dt_ew_shape& s, int64_t i, int n_in,
                                              int64_t* off) {
  for (int t = 0; t < n_in; t++) off[t] = s.full ? i : 0;
  if (s.full) return;
  for (int d = s.nd - 1; d >= 0; d--) {
    int64_t q = i % s.shape[d];
    i /= s.shape[d];
    for (int t = 0; t < n_in; t++) off[t] += q * s.stride[t][d];
  }
}

/* The host's exp (dt__expf in src/ops/ops.h) with the same roundings in the same order: the
 * clamps, Cephes' range reduction, the degree-6 polynomial and two exact power-of-two factors. */
__device__ __forceinline__ float dt_ew_expf(float x) {
  x = x > 89.0f ? 89.0f : x; /* NaN passes both clamps */
  x = x < -104.0f ? -104.0f : x;
  float t = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
  float n = __fadd_rn(t, -12582912.0f);
  float r = __fadd_rn(__fadd_rn(x, -__fmul_rn(n, 0.693359375f)), -__fmul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  float y = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  int k = __float_as_int(t) - 0x4B400000, k1 = k >> 1, k2 = k - k1; /* n in [-150, 129] */
  float s1 = __int_as_float((k1 + 127) * (1 << 23)), s2 = __int_as_float((k2 + 127) * (1 << 23));
  return __fmul_rn(__fmul_rn(y, s1), s2);
}

/* Double arithmetic without contraction (the bf16 AdamW path follows the host's double code). */
__device__ __forceinline__ double dt_ew_dmul(double a, double b) {
#ifdef DT_SIMT_EMULATE
  return a * b;
#else
  return __dmul_rn(a, b);
#endif
}
__device__ __forceinline__ double dt_ew_dadd(double a, double b) {
#ifdef DT_SIMT_EMULATE
  return a + b;
#else
  return __dadd_rn(a, b);
#endif
}

/* bf16 / f16 bits <-> f32 with the host's rules (src/internal/common.h, src/core/util.c): round
 * to nearest even, a NaN keeps its sign and payload where the format can (CUDA's intrinsics
 * return a canonical NaN). */
__device__ __forceinline__ float dt_ew_bf16_to_f32(uint16_t h) {
  return __uint_as_float((uint32_t)h << 16);
}
__device__ __forceinline__ uint16_t dt_ew_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float dt_ew_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) {
    if (m == 0) {
      u = sign;
    } else { /* subnormal: renormalize */
      e = 127 - 15 + 1;
      while ((m & 0x400u) == 0) {
        m <<= 1;
        e--;
      }
      u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 127 - 15) << 23) | (m << 13);
  }
  return __uint_as_float(u);
}
__device__ __forceinline__ uint16_t dt_ew_f32_to_f16(float f) {
  uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  uint32_t r, rem, half;
  if (a < 0x38800000u) { /* subnormal or zero */
    if (a < 0x33000000u) return (uint16_t)sign;
    uint32_t shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u; /* 14..24 */
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {
    r = (a - 0x38000000u) >> 13;
    rem = a & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

/* Element i of float storage (f32, bf16 or f16) as f32, and a store that rounds like the host. */
__device__ __forceinline__ float dt_ew_load_float(const void* p, int dtype, int64_t i) {
  if (dtype == DT_F32) return ((const float*)p)[i];
  uint16_t h = ((const uint16_t*)p)[i];
  return dtype == DT_BF16 ? dt_ew_bf16_to_f32(h) : dt_ew_f16_to_f32(h);
}
__device__ __forceinline__ void dt_ew_store_float(void* p, int dtype, int64_t i, float v) {
  if (dtype == DT_F32) ((float*)p)[i] = v;
  else if (dtype == DT_BF16) ((uint16_t*)p)[i] = dt_ew_f32_to_bf16(v);
  else ((uint16_t*)p)[i] = dt_ew_f32_to_f16(v);
}

static int dt_ew_is_float(dt_dtype_t d) { return d == DT_F32 || d == DT_BF16 || d == DT_F16; }

/* Copies nbytes of device memory to the host and waits for it (a data check's result). */
static dt_status_t dt_ew_d2h(const dt_local_tensor_t* t, void* dst, const void* src,
                             size_t nbytes) {
#ifdef DT_SIMT_EMULATE
  (void)t; /* emulated device memory is host memory, and launches finish before they return */
  memcpy(dst, src, nbytes);
  return DT_SUCCESS;
#else
  cudaStream_t s = dt_cu_stream(t);
  int rc = (int)cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s);
  if (rc == 0) rc = (int)cudaStreamSynchronize(s);
  return DT_CUDA_NAME(status)(rc, "cast: reading the data check");
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Binary ops with broadcasting (kernels_cpu.c dt__binary): f32 arithmetic on f32, bf16 or f16
 * storage of each operand and of the output, read and written in place (loaded exactly, the
 * result rounded once as the host rounds its f32 copy's result into that storage, so without
 * the f32 copies and their conversion passes the results are the same); comparisons give
 * 1.0 / 0.0, maximum / minimum propagate a NaN of either side. */

enum { DT_EW_ADD, DT_EW_SUB, DT_EW_MUL, DT_EW_DIV, DT_EW_MAX, DT_EW_MIN, DT_EW_EQ, DT_EW_GE,
       DT_EW_GT, DT_EW_NE, DT_EW_LT, DT_EW_LE };

template <int OP>
__device__ __forceinline__ float dt_ew_binop(float a, float b) {
  switch (OP) {
    case DT_EW_ADD: return a + b;
    case DT_EW_SUB: return a - b;
    case DT_EW_MUL: return a * b;
    case DT_EW_DIV: return a / b;
    case DT_EW_MAX: return (a >= b || a != a) ? a : b; /* a on ties, as the host */
    case DT_EW_MIN: return (a <= b || a != a) ? a : b;
    case DT_EW_EQ: return a == b ? 1.0f : 0.0f;
    case DT_EW_GE: return a >= b ? 1.0f : 0.0f;
    case DT_EW_GT: return a > b ? 1.0f : 0.0f;
    case DT_EW_NE: return a != b ? 1.0f : 0.0f;
    case DT_EW_LT: return a < b ? 1.0f : 0.0f;
    default: return a <= b ? 1.0f : 0.0f;
  }
}

/* mode 0: a and b have out's shape; 1: a full, b one value per row of `inner` elements;
 * 2: a full, b one value; 3: general broadcasting through s. */
template <int OP>
__global__ void dt_ew_binary_kernel(const void* a, int ta, const void* b, int tb, void* o, int to,
                                    int64_t n, int mode, int64_t inner, dt_ew_shape s) {
  DT_EW_FOR(i, n) {
    int64_t ia = i, ib;
    if (mode == 0) {
      ib = i;
    } else if (mode == 1) {
      ib = i / inner;
    } else if (mode == 2) {
      ib = 0;
    } else {
      int64_t off[2];
      dt_ew_offsets(s, i, 2, off);
      ia = off[0];
      ib = off[1];
    }
    dt_ew_store_float(o, to, i,
                      dt_ew_binop<OP>(dt_ew_load_float(a, ta, ia), dt_ew_load_float(b, tb, ib)));
  }
}

/* Integer operands of one dtype (i32 or i64; kernels_cpu.c dt__binary_int): two's complement
 * arithmetic that wraps, comparisons giving 1 / 0 in the dtype. */
template <int OP>
__global__ void dt_ew_binary_int_kernel(const void* a, const void* b, void* o, int wide,
                                        int64_t n, dt_ew_shape s) {
  DT_EW_FOR(i, n) {
    int64_t off[2];
    dt_ew_offsets(s, i, 2, off);
    const long long x = wide ? ((const long long*)a)[off[0]] : ((const int*)a)[off[0]];
    const long long y = wide ? ((const long long*)b)[off[1]] : ((const int*)b)[off[1]];
    unsigned long long r;
    switch (OP) {
      case DT_EW_ADD: r = (unsigned long long)x + (unsigned long long)y; break;
      case DT_EW_SUB: r = (unsigned long long)x - (unsigned long long)y; break;
      case DT_EW_MUL: r = (unsigned long long)x * (unsigned long long)y; break;
      case DT_EW_MAX: r = (unsigned long long)(x >= y ? x : y); break;
      case DT_EW_MIN: r = (unsigned long long)(x <= y ? x : y); break;
      case DT_EW_EQ: r = x == y; break;
      case DT_EW_GE: r = x >= y; break;
      case DT_EW_GT: r = x > y; break;
      case DT_EW_NE: r = x != y; break;
      case DT_EW_LT: r = x < y; break;
      default: r = x <= y; break;
    }
    if (wide) ((long long*)o)[i] = (long long)r;
    else ((int*)o)[i] = (int)(unsigned)r;
  }
}

template <int OP>
static dt_status_t dt_ew_binary_int(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                    dt_local_tensor_t* out) {
  const dt_dtype_t d = out->dtype;
  if (OP == DT_EW_DIV || (d != DT_I32 && d != DT_I64) || in[0].dtype != d || in[1].dtype != d)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtypes %s, %s -> %s are not supported by its CUDA "
                   "kernel (integer operands of one dtype, or floats)", call->op,
                   dt_dtype_name(in[0].dtype), dt_dtype_name(in[1].dtype), dt_dtype_name(d));
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  const dt_local_tensor_t* ins[2] = {&in[0], &in[1]};
  dt_ew_shape s;
  dt_ew_shape_init(&s, out, ins, 2);
  DT_CU_LAUNCH(call->op, dt_ew_binary_int_kernel<OP>, dt_cu_grid(out, n), DT_CU_BLOCK, 0,
               dt_cu_stream(&in[0]), (const void*)in[0].data, (const void*)in[1].data, out->data,
               (int)(d == DT_I64), n, s);
  return DT_SUCCESS;
}

template <int OP>
static dt_status_t dt_ew_binary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                dt_local_tensor_t* out) {
  if (in[0].dtype == DT_I32 || in[0].dtype == DT_I64) return dt_ew_binary_int<OP>(call, in, out);
  DT_CHECK(dt_cu_need_float(call, &in[0]));
  DT_CHECK(dt_cu_need_float(call, &in[1]));
  DT_CHECK(dt_cu_need_float(call, out));
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  const dt_local_tensor_t* ins[2] = {&in[0], &in[1]};
  dt_ew_shape s;
  dt_ew_shape_init(&s, out, ins, 2);
  /* the host's fast layouts: b one value per row ((.., N, C) op (.., N, 1)) or a single value */
  const int nd = out->ndim;
  int64_t inner = nd > 0 ? out->shape[nd - 1] : 1;
  int a_full = in[0].ndim == nd;
  for (int d = 0; a_full && d < nd; d++) a_full = in[0].shape[d] == out->shape[d];
  int rows = a_full && in[1].ndim == nd && nd > 0 && in[1].shape[nd - 1] == 1;
  for (int d = 0; rows && d + 1 < nd; d++) rows = in[1].shape[d] == out->shape[d];
  int mode = s.full ? 0 : (a_full && dt_cu_numel(&in[1]) == 1) ? 2 : rows ? 1 : 3;
  cudaStream_t st = dt_cu_stream(&in[0]);
  DT_CU_LAUNCH(call->op, dt_ew_binary_kernel<OP>, dt_cu_grid(out, n), DT_CU_BLOCK, 0, st,
               (const void*)in[0].data, (int)in[0].dtype, (const void*)in[1].data,
               (int)in[1].dtype, out->data, (int)out->dtype, n, mode, inner, s);
  return DT_SUCCESS;
}

#define DT_EW_BINARY(name, OP) \
  DT_CU_KERNEL(name) { return dt_ew_binary<OP>(call, in, out); }
DT_EW_BINARY(dt_cu_add, DT_EW_ADD)
DT_EW_BINARY(dt_cu_sub, DT_EW_SUB)
DT_EW_BINARY(dt_cu_mul, DT_EW_MUL)
DT_EW_BINARY(dt_cu_div, DT_EW_DIV)
DT_EW_BINARY(dt_cu_maximum, DT_EW_MAX)
DT_EW_BINARY(dt_cu_minimum, DT_EW_MIN)
DT_EW_BINARY(dt_cu_eq, DT_EW_EQ)
DT_EW_BINARY(dt_cu_ge, DT_EW_GE)
DT_EW_BINARY(dt_cu_gt, DT_EW_GT)
DT_EW_BINARY(dt_cu_ne, DT_EW_NE)
DT_EW_BINARY(dt_cu_lt, DT_EW_LT)
DT_EW_BINARY(dt_cu_le, DT_EW_LE)
#undef DT_EW_BINARY

/* ---------------------------------------------------------------------------------------------
 * Unary ops (kernels_cpu.c dt__unary) and the scalar ops of kernels_nn.c: f32 arithmetic on
 * f32, bf16 or f16 storage, as the binary ops. gelu is the erf form; exp, sigmoid and silu use
 * the host's exp; sin, cos, log1p, expm1 and erf are CUDA's libm (within its 1-2 ulp of glibc);
 * floor, ceil, trunc, round and sign are exact, bit for bit the host's. */

enum { DT_EW_NEG, DT_EW_RELU, DT_EW_EXP, DT_EW_LOG, DT_EW_SQRT, DT_EW_RSQRT, DT_EW_GELU,
       DT_EW_SIGMOID, DT_EW_SILU, DT_EW_TANH, DT_EW_ABS, DT_EW_SIN, DT_EW_COS, DT_EW_RECIPROCAL,
       DT_EW_LOG1P, DT_EW_EXPM1, DT_EW_ADD_SCALAR, DT_EW_MUL_SCALAR, DT_EW_SQUARE, DT_EW_POW,
       DT_EW_FLOOR, DT_EW_CEIL, DT_EW_TRUNC, DT_EW_RINT, DT_EW_SIGN, DT_EW_ERF };

template <int OP>
__device__ __forceinline__ float dt_ew_unop(float x, float s) {
  switch (OP) {
    case DT_EW_NEG: return -x;
    case DT_EW_RELU: return x < 0.0f ? 0.0f : x; /* NaN stays NaN */
    case DT_EW_EXP: return dt_ew_expf(x);
    case DT_EW_LOG: return logf(x);
    case DT_EW_SQRT: return sqrtf(x);
    case DT_EW_RSQRT: return 1.0f / sqrtf(x); /* both correctly rounded, as on the host */
    case DT_EW_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case DT_EW_SIGMOID: return 1.0f / (1.0f + dt_ew_expf(-x));
    case DT_EW_SILU: return x / (1.0f + dt_ew_expf(-x));
    case DT_EW_TANH: return tanhf(x);
    case DT_EW_ABS: return fabsf(x);
    case DT_EW_SIN: return sinf(x); /* CUDA's (full range reduction: no fast math) */
    case DT_EW_COS: return cosf(x);
    case DT_EW_RECIPROCAL: return 1.0f / x; /* correctly rounded, as on the host */
    case DT_EW_LOG1P: return log1pf(x);
    case DT_EW_EXPM1: return expm1f(x);
    case DT_EW_ADD_SCALAR: return x + s;
    case DT_EW_MUL_SCALAR: return x * s;
    case DT_EW_SQUARE: return x * x;
    case DT_EW_FLOOR: return floorf(x); /* exact, as the host's */
    case DT_EW_CEIL: return ceilf(x);
    case DT_EW_TRUNC: return truncf(x);
    case DT_EW_RINT: return rintf(x); /* half to even: the host's nearbyintf */
    case DT_EW_SIGN: return (float)((0.0f < x) - (x < 0.0f)); /* sign(NaN) = sign(-0) = +0 */
    case DT_EW_ERF: return erff(x);
    default: /* the host's exponents that PyTorch special-cases (kernels_nn.c dt__kernel_pow) */
      if (s == 3.0f) return x * x * x;
      if (s == 0.5f) return sqrtf(x);
      if (s == -0.5f) return 1.0f / sqrtf(x);
      if (s == -1.0f) return 1.0f / x;
      if (s == -2.0f) return 1.0f / (x * x);
      return powf(x, s);
  }
}

template <int OP>
__global__ void dt_ew_unary_kernel(const void* a, int ta, void* o, int to, int64_t n, float s) {
  DT_EW_FOR(i, n) dt_ew_store_float(o, to, i, dt_ew_unop<OP>(dt_ew_load_float(a, ta, i), s));
}

template <int OP>
static dt_status_t dt_ew_unary(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out, float s) {
  DT_CHECK(dt_cu_need_float(call, &in[0]));
  DT_CHECK(dt_cu_need_float(call, out));
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  DT_CU_LAUNCH(call->op, dt_ew_unary_kernel<OP>, dt_cu_grid(out, n), DT_CU_BLOCK, 0,
               dt_cu_stream(&in[0]), (const void*)in[0].data, (int)in[0].dtype, out->data,
               (int)out->dtype, n, s);
  return DT_SUCCESS;
}

/* neg and abs of i32 / i64 (kernels_cpu.c dt__neg_abs_int): two's complement, -INT_MIN and
 * abs(INT_MIN) are INT_MIN. */
__global__ void dt_ew_neg_abs_int_kernel(const void* a, void* o, int wide, int abs, int64_t n) {
  DT_EW_FOR(i, n) {
    if (wide) {
      const long long x = ((const long long*)a)[i];
      ((long long*)o)[i] = abs && x >= 0 ? x : (long long)(0ull - (unsigned long long)x);
    } else {
      const int x = ((const int*)a)[i];
      ((int*)o)[i] = abs && x >= 0 ? x : (int)(0u - (unsigned)x);
    }
  }
}

template <int OP>
static dt_status_t dt_ew_neg_abs(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                 dt_local_tensor_t* out) {
  const dt_dtype_t d = in[0].dtype;
  if ((d == DT_I32 || d == DT_I64) && out->dtype == d) {
    const int64_t n = dt_cu_numel(out);
    if (n == 0) return DT_SUCCESS;
    DT_CU_LAUNCH(call->op, dt_ew_neg_abs_int_kernel, dt_cu_grid(out, n), DT_CU_BLOCK, 0,
                 dt_cu_stream(&in[0]), (const void*)in[0].data, out->data, (int)(d == DT_I64),
                 (int)(OP == DT_EW_ABS), n);
    return DT_SUCCESS;
  }
  return dt_ew_unary<OP>(call, in, out, 0.0f);
}
DT_CU_KERNEL(dt_cu_neg) { return dt_ew_neg_abs<DT_EW_NEG>(call, in, out); }
DT_CU_KERNEL(dt_cu_abs) { return dt_ew_neg_abs<DT_EW_ABS>(call, in, out); }

/* floor, ceil, trunc, round (decimals 0) and sign of i32 / i64 (kernels_cpu.c dt__round_int): the
 * values kept, or their signs. */
__global__ void dt_ew_round_int_kernel(const void* a, void* o, int wide, int sign, int64_t n) {
  DT_EW_FOR(i, n) {
    if (wide) {
      const long long x = ((const long long*)a)[i];
      ((long long*)o)[i] = sign ? (long long)((0 < x) - (x < 0)) : x;
    } else {
      const int x = ((const int*)a)[i];
      ((int*)o)[i] = sign ? (int)((0 < x) - (x < 0)) : x;
    }
  }
}

template <int OP>
static dt_status_t dt_ew_rounding(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                  dt_local_tensor_t* out) {
  const dt_dtype_t d = in[0].dtype;
  if ((d == DT_I32 || d == DT_I64) && out->dtype == d) {
    const int64_t n = dt_cu_numel(out);
    if (n == 0) return DT_SUCCESS;
    DT_CU_LAUNCH(call->op, dt_ew_round_int_kernel, dt_cu_grid(out, n), DT_CU_BLOCK, 0,
                 dt_cu_stream(&in[0]), (const void*)in[0].data, out->data, (int)(d == DT_I64),
                 (int)(OP == DT_EW_SIGN), n);
    return DT_SUCCESS;
  }
  return dt_ew_unary<OP>(call, in, out, 0.0f);
}
DT_CU_KERNEL(dt_cu_floor) { return dt_ew_rounding<DT_EW_FLOOR>(call, in, out); }
DT_CU_KERNEL(dt_cu_ceil) { return dt_ew_rounding<DT_EW_CEIL>(call, in, out); }
DT_CU_KERNEL(dt_cu_trunc) { return dt_ew_rounding<DT_EW_TRUNC>(call, in, out); }
DT_CU_KERNEL(dt_cu_sign) { return dt_ew_rounding<DT_EW_SIGN>(call, in, out); }

/* round with decimals d != 0 (kernels_cpu.c dt__kernel_round): p = x * 10^d (d < 0: x / 10^-d)
 * rounded to a bf16 x's dtype, then rintf(p) / 10^d (* 10^-d), stored rounded once; ten is the
 * host's dt__round_scale. */
__global__ void dt_ew_round_dec_kernel(const void* a, int ta, void* o, int to, int64_t n,
                                       float ten, int neg) {
  DT_EW_FOR(i, n) {
    const float x = dt_ew_load_float(a, ta, i);
    float p = neg ? x / ten : x * ten;
    if (ta == DT_BF16) p = dt_ew_bf16_to_f32(dt_ew_f32_to_bf16(p));
    dt_ew_store_float(o, to, i, neg ? rintf(p) * ten : rintf(p) / ten);
  }
}
DT_CU_KERNEL(dt_cu_round) {
  const int64_t dec = dt__op_iarg(DT_OP_ROUND, call, 0);
  if (dec == 0) return dt_ew_rounding<DT_EW_RINT>(call, in, out);
  DT_CHECK(dt_cu_need_float(call, &in[0]));
  DT_CHECK(dt_cu_need_float(call, out));
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  DT_CU_LAUNCH(call->op, dt_ew_round_dec_kernel, dt_cu_grid(out, n), DT_CU_BLOCK, 0,
               dt_cu_stream(&in[0]), (const void*)in[0].data, (int)in[0].dtype, out->data,
               (int)out->dtype, n, dt__round_scale(in[0].dtype, dec), (int)(dec < 0));
  return DT_SUCCESS;
}

#define DT_EW_UNARY(name, OP) \
  DT_CU_KERNEL(name) { return dt_ew_unary<OP>(call, in, out, 0.0f); }
DT_EW_UNARY(dt_cu_relu, DT_EW_RELU)
DT_EW_UNARY(dt_cu_exp, DT_EW_EXP)
DT_EW_UNARY(dt_cu_log, DT_EW_LOG)
DT_EW_UNARY(dt_cu_sqrt, DT_EW_SQRT)
DT_EW_UNARY(dt_cu_rsqrt, DT_EW_RSQRT)
DT_EW_UNARY(dt_cu_gelu, DT_EW_GELU)
DT_EW_UNARY(dt_cu_sigmoid, DT_EW_SIGMOID)
DT_EW_UNARY(dt_cu_silu, DT_EW_SILU)
DT_EW_UNARY(dt_cu_tanh, DT_EW_TANH)
DT_EW_UNARY(dt_cu_sin, DT_EW_SIN)
DT_EW_UNARY(dt_cu_cos, DT_EW_COS)
DT_EW_UNARY(dt_cu_reciprocal, DT_EW_RECIPROCAL)
DT_EW_UNARY(dt_cu_log1p, DT_EW_LOG1P)
DT_EW_UNARY(dt_cu_expm1, DT_EW_EXPM1)
DT_EW_UNARY(dt_cu_erf, DT_EW_ERF)
#undef DT_EW_UNARY

/* fargs [scalar] (fargs [exponent] for pow), read as the host reads them. */
DT_CU_KERNEL(dt_cu_add_scalar) {
  return dt_ew_unary<DT_EW_ADD_SCALAR>(call, in, out, (float)call->fargs[0]);
}
DT_CU_KERNEL(dt_cu_mul_scalar) {
  return dt_ew_unary<DT_EW_MUL_SCALAR>(call, in, out, (float)call->fargs[0]);
}
DT_CU_KERNEL(dt_cu_pow) {
  const float s = (float)call->fargs[0];
  if (s == 2.0f) return dt_ew_unary<DT_EW_SQUARE>(call, in, out, s); /* exactly x * x */
  return dt_ew_unary<DT_EW_POW>(call, in, out, s);
}

/* clamp (kernels_nn.c dt__kernel_clamp), fargs [min, max]: min first, then max; an absent (NaN)
 * bound is an infinity, which no number or NaN passes. */
__global__ void dt_ew_clamp_kernel(const void* a, int ta, void* o, int to, int64_t n, float lo,
                                   float hi) {
  DT_EW_FOR(i, n) {
    const float x = dt_ew_load_float(a, ta, i), v = x < lo ? lo : x;
    dt_ew_store_float(o, to, i, v > hi ? hi : v);
  }
}

/* A clamp bound as the host reads it: NaN (absent) becomes the infinity on its side. */
static float dt_ew_bound(const dt_op_call_t* call, int op, int k, float absent) {
  const double v = dt__op_farg(op, call, k);
  return v != v ? absent : (float)v;
}

DT_CU_KERNEL(dt_cu_clamp) {
  DT_CHECK(dt_cu_need_float(call, &in[0]));
  DT_CHECK(dt_cu_need_float(call, out));
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  DT_CU_LAUNCH(call->op, dt_ew_clamp_kernel, dt_cu_grid(out, n), DT_CU_BLOCK, 0,
               dt_cu_stream(&in[0]), (const void*)in[0].data, (int)in[0].dtype, out->data,
               (int)out->dtype, n, dt_ew_bound(call, DT_OP_CLAMP, 0, -INFINITY),
               dt_ew_bound(call, DT_OP_CLAMP, 1, INFINITY));
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * where (cond, a, b) and masked_fill (x, mask) with broadcasting (kernels_nn.c dt__select): the
 * condition / mask of any dtype (nonzero = true, NaN too), the values f32, bf16 or f16 storage
 * read in place (the result rounded once to the output's), or i32 / i64 of one dtype copied
 * exactly (masked_fill's value truncated toward zero: the rules checked that it fits). Inputs of
 * s: 0 the condition, 1 a (x), 2 b (where only). */

template <int TC>
__device__ __forceinline__ bool dt_ew_nonzero(const void* c, int64_t i) {
  if (TC == DT_I64) return ((const long long*)c)[i] != 0;
  if (TC == DT_I32) return ((const int*)c)[i] != 0;
  return dt_ew_load_float(c, TC, i) != 0.0f; /* NaN != 0 */
}

template <int TC>
__global__ void dt_ew_select_kernel(int where, const void* c, const void* a, int ta, const void* b,
                                    int tb, float fill, void* o, int to, int64_t n,
                                    dt_ew_shape s) {
  DT_EW_FOR(i, n) {
    int64_t off[3];
    dt_ew_offsets(s, i, where ? 3 : 2, off);
    const bool sel = dt_ew_nonzero<TC>(c, off[0]);
    const float v = where ? (sel ? dt_ew_load_float(a, ta, off[1]) : dt_ew_load_float(b, tb, off[2]))
                          : (sel ? fill : dt_ew_load_float(a, ta, off[1]));
    dt_ew_store_float(o, to, i, v);
  }
}

template <int TC>
__global__ void dt_ew_select_int_kernel(int where, const void* c, const void* a, const void* b,
                                        long long fill, void* o, int wide, int64_t n,
                                        dt_ew_shape s) {
  DT_EW_FOR(i, n) {
    int64_t off[3];
    dt_ew_offsets(s, i, where ? 3 : 2, off);
    const bool sel = dt_ew_nonzero<TC>(c, off[0]);
    if (wide) {
      const long long *x = (const long long*)a, *y = (const long long*)b;
      ((long long*)o)[i] = where ? (sel ? x[off[1]] : y[off[2]]) : (sel ? fill : x[off[1]]);
    } else {
      const int *x = (const int*)a, *y = (const int*)b;
      ((int*)o)[i] = where ? (sel ? x[off[1]] : y[off[2]]) : (sel ? (int)fill : x[off[1]]);
    }
  }
}

template <int TC>
static dt_status_t dt_ew_select_launch(int where, const dt_op_call_t* call,
                                       const dt_local_tensor_t* c, const dt_local_tensor_t* a,
                                       const dt_local_tensor_t* b, dt_local_tensor_t* out,
                                       int64_t n, const dt_ew_shape& s) {
  const void* bv = b ? b->data : NULL;
  const unsigned grid = dt_cu_grid(out, n);
  cudaStream_t st = dt_cu_stream(a);
  if (a->dtype == DT_I32 || a->dtype == DT_I64) {
    const long long fill = where ? 0 : (long long)call->fargs[0];
    DT_CU_LAUNCH(call->op, dt_ew_select_int_kernel<TC>, grid, DT_CU_BLOCK, 0, st, where,
                 (const void*)c->data, (const void*)a->data, bv, fill, out->data,
                 (int)(a->dtype == DT_I64), n, s);
  } else {
    const float fill = where ? 0.0f : (float)call->fargs[0];
    DT_CU_LAUNCH(call->op, dt_ew_select_kernel<TC>, grid, DT_CU_BLOCK, 0, st, where,
                 (const void*)c->data, (const void*)a->data, (int)a->dtype, bv,
                 b ? (int)b->dtype : (int)DT_F32, fill, out->data, (int)out->dtype, n, s);
  }
  return DT_SUCCESS;
}

static dt_status_t dt_ew_select(int where, const dt_op_call_t* call, const dt_local_tensor_t* in,
                                dt_local_tensor_t* out) {
  const dt_local_tensor_t *c = &in[where ? 0 : 1], *a = &in[where ? 1 : 0];
  const dt_local_tensor_t* b = where ? &in[2] : NULL;
  if (a->dtype == DT_I32 || a->dtype == DT_I64) {
    if (out->dtype != a->dtype || (b && b->dtype != a->dtype))
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: values of dtype %s and %s are not supported by its "
                     "CUDA kernel (one dtype: the rules promote them)", call->op,
                     dt_dtype_name(a->dtype), dt_dtype_name(b ? b->dtype : out->dtype));
  } else {
    DT_CHECK(dt_cu_need_float(call, a));
    if (b) DT_CHECK(dt_cu_need_float(call, b));
    DT_CHECK(dt_cu_need_float(call, out));
  }
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  const dt_local_tensor_t* ins[3] = {c, a, b};
  dt_ew_shape s;
  dt_ew_shape_init(&s, out, ins, where ? 3 : 2);
  switch (c->dtype) {
    case DT_I64: return dt_ew_select_launch<DT_I64>(where, call, c, a, b, out, n, s);
    case DT_I32: return dt_ew_select_launch<DT_I32>(where, call, c, a, b, out, n, s);
    case DT_F32: return dt_ew_select_launch<DT_F32>(where, call, c, a, b, out, n, s);
    case DT_BF16: return dt_ew_select_launch<DT_BF16>(where, call, c, a, b, out, n, s);
    case DT_F16: return dt_ew_select_launch<DT_F16>(where, call, c, a, b, out, n, s);
    default:
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: a %s %s is not supported by its CUDA kernel",
                     call->op, dt_dtype_name(c->dtype), where ? "condition" : "mask");
  }
}

DT_CU_KERNEL(dt_cu_where) { return dt_ew_select(1, call, in, out); }
DT_CU_KERNEL(dt_cu_masked_fill) { return dt_ew_select(0, call, in, out); }

/* ---------------------------------------------------------------------------------------------
 * cast (kernels_nn.c dt__kernel_cast): any dtype pair, element by element as the host does it:
 * float to integer truncates toward zero and rejects NaN, inf and values outside the integer
 * type; integer to integer is exact, narrowing wraps modulo 2^32; integer to float rounds once
 * to f32 (then to bf16 / f16).
 *
 * bad (only for float -> integer): the smallest index of a rejected element, else ULLONG_MAX. */

__global__ void dt_ew_cast_kernel(const void* src, int from, void* dst, int to, int64_t n,
                                  unsigned long long* bad) {
  const bool from_float = from == DT_F32 || from == DT_BF16 || from == DT_F16;
  const bool to_float = to == DT_F32 || to == DT_BF16 || to == DT_F16;
  DT_EW_FOR(i, n) {
    if (from_float) {
      float f = dt_ew_load_float(src, from, i);
      if (to_float) {
        /* f32 -> double -> f32 on the host quiets a signalling NaN and keeps its payload */
        if (f != f) f = __uint_as_float(__float_as_uint(f) | 0x400000u);
        dt_ew_store_float(dst, to, i, f);
      } else {
        const double v = trunc((double)f), lim = to == DT_I32 ? 2147483648.0 : 9223372036854775808.0;
        if (v >= -lim && v < lim) { /* NaN fails too */
          if (to == DT_I32) ((int*)dst)[i] = (int)v;
          else ((long long*)dst)[i] = (long long)v;
        } else {
          atomicMin(bad, (unsigned long long)i);
        }
      }
    } else {
      const long long v = from == DT_I64 ? ((const long long*)src)[i] : ((const int*)src)[i];
      if (to_float) dt_ew_store_float(dst, to, i, (float)v);
      else if (to == DT_I32) ((int*)dst)[i] = (int)(unsigned)(unsigned long long)v; /* wraps */
      else ((long long*)dst)[i] = v;
    }
  }
}

__global__ void dt_ew_set_u64_kernel(unsigned long long* p, unsigned long long v) { *p = v; }

/* cast's scratch: a flag word where values can be rejected (float -> integer), else none. */
DT_CU_SCRATCH(dt_cu_cast_scratch) {
  (void)call;
  const dt_dtype_t from = in[0].dtype, to = out[0].dtype;
  if (dt_cu_numel(out) == 0 || dt_ew_is_float(to) || !dt_ew_is_float(from)) return 0;
  return sizeof(unsigned long long);
}

DT_CU_KERNEL(dt_cu_cast) {
  const dt_dtype_t from = in[0].dtype, to = out[0].dtype;
  const int64_t n = dt_cu_numel(out);
  if (n == 0) return DT_SUCCESS;
  cudaStream_t st = dt_cu_stream(&in[0]);
  const unsigned grid = dt_cu_grid(out, n);
  if (dt_cu_cast_scratch(call, in, out) == 0) { /* nothing to reject */
    DT_CU_LAUNCH(call->op, dt_ew_cast_kernel, grid, DT_CU_BLOCK, 0, st, (const void*)in[0].data,
                 (int)from, out[0].data, (int)to, n, (unsigned long long*)NULL);
    return DT_SUCCESS;
  }
  /* float -> integer: the kernel flags the first rejected value; the host waits for the flag (a data
   * check: the status must be known before the op returns, see DT_OPF_CHECKS_DATA) */
  void* flag = NULL; /* dt_cu_cast_scratch's word */
  DT_CHECK(dt_cu_scratch(&in[0], call->op, sizeof(unsigned long long), &flag));
  unsigned long long* bad = (unsigned long long*)flag;
  int rc = dt_simt_launch(dt_ew_set_u64_kernel, 1, 1, 0, st, bad, ~0ull);
  if (rc == 0)
    rc = dt_simt_launch(dt_ew_cast_kernel, grid, DT_CU_BLOCK, 0, st, (const void*)in[0].data,
                        (int)from, out[0].data, (int)to, n, bad);
  if (rc != 0) {
    dt_cu_scratch_free(&in[0], flag, sizeof(unsigned long long));
    return DT_CUDA_NAME(status)(rc, call->op);
  }
  unsigned long long first = 0;
  dt_status_t s = dt_ew_d2h(&in[0], &first, bad, sizeof first);
  dt_cu_scratch_free(&in[0], flag, sizeof(unsigned long long));
  DT_CHECK(s);
  if (first == ~0ull) return DT_SUCCESS;
  /* the host names the first bad value: fetch that one element */
  const size_t item = from == DT_F32 ? 4 : 2;
  unsigned char elem[4];
  DT_CHECK(dt_ew_d2h(&in[0], elem, (const unsigned char*)in[0].data + first * item, item));
  return DT_FAIL(DT_ERR_INVALID_ARG, "cast: %g cannot be converted to %s (NaN, inf and values "
                 "outside its range are refused)", dt__load(elem, from, 0), dt_dtype_name(to));
}

/* ---------------------------------------------------------------------------------------------
 * dropout (kernels_nn.c): fargs [p], iargs [seed]; element g (global row-major index) is kept
 * when the 53-bit uniform dt__mix64(seed ^ dt__mix64(g)) >> 11 is at least p 2^53, and kept
 * values are scaled by 1 / (1 - p) (f32 arithmetic on f32, bf16 or f16 storage, rounded once).
 * Bit-identical masks on every backend and placement. */

__device__ __forceinline__ uint64_t dt_ew_mix64(uint64_t x) { /* src/core/util.c dt__mix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct dt_ew_dropout_geom {
  int nd;
  int64_t shape[DT_MAX_DIMS];  /* local */
  int64_t offset[DT_MAX_DIMS]; /* global index of the local first element */
  int64_t global[DT_MAX_DIMS]; /* global shape */
};

__global__ void dt_ew_dropout_kernel(const void* a, int ta, void* o, int to, int64_t n,
                                     dt_ew_dropout_geom geo, uint64_t seed, uint64_t thresh,
                                     int keep_any, float scale) {
  DT_EW_FOR(i, n) {
    int64_t idx[DT_MAX_DIMS], r = i;
    for (int d = geo.nd - 1; d >= 0; d--) {
      idx[d] = r % geo.shape[d];
      r /= geo.shape[d];
    }
    uint64_t g = 0;
    for (int d = 0; d < geo.nd; d++)
      g = g * (uint64_t)geo.global[d] + (uint64_t)(geo.offset[d] + idx[d]);
    const uint64_t u = dt_ew_mix64(seed ^ dt_ew_mix64(g)) >> 11;
    /* a product, as the host: a dropped NaN or inf gives NaN */
    dt_ew_store_float(o, to, i, dt_ew_load_float(a, ta, i) * ((keep_any && u >= thresh) ? scale : 0.0f));
  }
}

DT_CU_KERNEL(dt_cu_dropout) {
  DT_CHECK(dt_cu_need_float(call, in));
  DT_CHECK(dt_cu_need_float(call, out));
  const dt_local_tensor_t* x = &in[0];
  const double p = call->fargs[0];
  const uint64_t seed = (uint64_t)call->iargs[0];
  const uint64_t thresh = p >= 1.0 ? UINT64_MAX : (uint64_t)(p * 0x1.0p53);
  const float scale = p >= 1.0 ? 0.0f : (float)(1.0 / (1.0 - p));
  const int64_t n = dt_cu_numel(x);
  if (n == 0) return DT_SUCCESS;
  dt_ew_dropout_geom geo;
  memset(&geo, 0, sizeof geo);
  geo.nd = x->ndim;
  for (int d = 0; d < x->ndim; d++) {
    geo.shape[d] = x->shape[d];
    geo.offset[d] = x->offset[d];
    geo.global[d] = call->in[0].shape[d];
  }
  DT_CU_LAUNCH(call->op, dt_ew_dropout_kernel, dt_cu_grid(x, n), DT_CU_BLOCK, 0, dt_cu_stream(x),
               (const void*)x->data, (int)x->dtype, out->data, (int)out->dtype, n, geo, seed,
               thresh, (int)(p < 1.0), scale);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * act_grad (kernels_grad.c): g * f'(x), iargs [kind]; g and x of one local size; the sigmoid and
 * tanh kinds take the forward's output as x. f32 arithmetic on f32, bf16 or f16 storage, as the
 * binary ops. */

template <int KIND>
__global__ void dt_ew_act_grad_kernel(const void* g, int tg, const void* x, int tx, void* o,
                                      int to, int64_t n, float lo, float hi) {
  DT_EW_FOR(i, n) {
    const float xi = dt_ew_load_float(x, tx, i), gi = dt_ew_load_float(g, tg, i);
    float r;
    if (KIND == DT_ACT_RELU) {
      r = xi <= 0.0f ? 0.0f : gi;
    } else if (KIND == DT_ACT_SILU) {
      const float s = 1.0f / (1.0f + dt_ew_expf(-xi));
      r = gi * s * __fadd_rn(1.0f, __fmul_rn(xi, 1.0f - s));
    } else if (KIND == DT_ACT_GELU) {
      const float cdf = 0.5f * (1.0f + erff(xi * 0.70710678118654752f));
      const float pdf = 0.39894228040143268f * dt_ew_expf(__fmul_rn(-0.5f * xi, xi));
      r = gi * __fadd_rn(cdf, __fmul_rn(xi, pdf));
    } else if (KIND == DT_ACT_SIGMOID_OUT) {
      r = gi * xi * (1.0f - xi);
    } else if (KIND == DT_ACT_ABS) { /* sign(0) = sign(NaN) = 0 */
      r = gi * (float)((xi > 0.0f) - (xi < 0.0f));
    } else if (KIND == DT_ACT_CLAMP) {
      r = (xi >= lo && xi <= hi) ? gi : 0.0f;
    } else { /* DT_ACT_TANH_OUT */
      r = gi * __fadd_rn(1.0f, -__fmul_rn(xi, xi));
    }
    dt_ew_store_float(o, to, i, r);
  }
}

DT_CU_KERNEL(dt_cu_act_grad) {
  DT_CHECK(dt_cu_need_float(call, &in[0]));
  DT_CHECK(dt_cu_need_float(call, &in[1]));
  DT_CHECK(dt_cu_need_float(call, out));
  const int64_t n = dt_cu_numel(out);
  if (dt_cu_numel(&in[0]) != n || dt_cu_numel(&in[1]) != n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad: g and x must have the same shape");
  const int kind = (int)call->iargs[0];
  if (kind < 0 || kind >= DT_ACT_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "act_grad: kind %lld", (long long)call->iargs[0]);
  if (n == 0) return DT_SUCCESS;
  const void *g = in[0].data, *x = in[1].data;
  void* o = out->data;
  const int tg = (int)in[0].dtype, tx = (int)in[1].dtype, to = (int)out->dtype;
  const unsigned grid = dt_cu_grid(out, n);
  cudaStream_t st = dt_cu_stream(&in[0]);
  const float lo = dt_ew_bound(call, DT_OP_ACT_GRAD, 0, -INFINITY);
  const float hi = dt_ew_bound(call, DT_OP_ACT_GRAD, 1, INFINITY);
  switch (kind) {
    case DT_ACT_RELU:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_RELU>, grid, DT_CU_BLOCK, 0, st, g, tg,
                   x, tx, o, to, n, lo, hi);
      break;
    case DT_ACT_SILU:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_SILU>, grid, DT_CU_BLOCK, 0, st, g, tg,
                   x, tx, o, to, n, lo, hi);
      break;
    case DT_ACT_GELU:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_GELU>, grid, DT_CU_BLOCK, 0, st, g, tg,
                   x, tx, o, to, n, lo, hi);
      break;
    case DT_ACT_SIGMOID_OUT:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_SIGMOID_OUT>, grid, DT_CU_BLOCK, 0, st,
                   g, tg, x, tx, o, to, n, lo, hi);
      break;
    case DT_ACT_ABS:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_ABS>, grid, DT_CU_BLOCK, 0, st, g, tg,
                   x, tx, o, to, n, lo, hi);
      break;
    case DT_ACT_CLAMP:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_CLAMP>, grid, DT_CU_BLOCK, 0, st, g,
                   tg, x, tx, o, to, n, lo, hi);
      break;
    default:
      DT_CU_LAUNCH(call->op, dt_ew_act_grad_kernel<DT_ACT_TANH_OUT>, grid, DT_CU_BLOCK, 0, st, g,
                   tg, x, tx, o, to, n, lo, hi);
      break;
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * adamw (kernels_optim.c), in place: param and grad f32, exp_avg and exp_avg_sq both f32 or both
 * bf16, step a 0-d i64 on the device. The step is incremented by a one-thread kernel after the
 * update, which reads t = step + 1 on the device (the host never reads device memory); every
 * block computes the bias corrections c1 = 1 - b1^t, c2 = 1 - b2^t in double as the host does.
 * f32 moments: the host's f32 update with the same roundings; bf16 moments: its double update,
 * the moments rounded to bf16 once per step. */

struct dt_ew_adamw_args {
  double lr, b1, b2, eps, wd;
};

template <typename M>
__global__ void dt_ew_adamw_kernel(float* p, const float* g, M* m, M* v, const long long* step,
                                   int64_t n, dt_ew_adamw_args h) {
  __shared__ double corr[2];
  if (threadIdx.x == 0) {
    const double t = (double)(*step + 1);
    corr[0] = 1.0 - pow(h.b1, t);
    corr[1] = 1.0 - pow(h.b2, t);
  }
  __syncthreads();
  const double c1 = corr[0], c2 = corr[1];
  if constexpr (sizeof(M) == sizeof(float)) { /* f32 moments */
    float* mf = (float*)m;
    float* vf = (float*)v;
    const float fb1 = (float)h.b1, fb2 = (float)h.b2, a1 = (float)(1 - h.b1),
                a2 = (float)(1 - h.b2), ic1 = (float)(1.0 / c1), ic2 = (float)(1.0 / c2),
                flr = (float)h.lr, fwd = (float)h.wd, feps = (float)h.eps;
    DT_EW_FOR(k, n) {
      const float gk = g[k], pk = p[k];
      const float mk = __fadd_rn(__fmul_rn(fb1, mf[k]), __fmul_rn(a1, gk));
      const float vk = __fadd_rn(__fmul_rn(fb2, vf[k]), __fmul_rn(__fmul_rn(a2, gk), gk));
      mf[k] = mk;
      vf[k] = vk;
      const float upd = __fmul_rn(mk, ic1) / __fadd_rn(sqrtf(__fmul_rn(vk, ic2)), feps);
      p[k] = __fadd_rn(pk, -__fmul_rn(flr, __fadd_rn(__fmul_rn(fwd, pk), upd)));
    }
  } else { /* bf16 moments (uint16_t bits) */
    uint16_t* mh = (uint16_t*)m;
    uint16_t* vh = (uint16_t*)v;
    const double ob1 = 1 - h.b1, ob2 = 1 - h.b2;
    DT_EW_FOR(k, n) {
      const double gk = g[k], pk = p[k];
      const float mk = (float)dt_ew_dadd(dt_ew_dmul(h.b1, dt_ew_bf16_to_f32(mh[k])),
                                         dt_ew_dmul(ob1, gk));
      const float vk = (float)dt_ew_dadd(dt_ew_dmul(h.b2, dt_ew_bf16_to_f32(vh[k])),
                                         dt_ew_dmul(dt_ew_dmul(ob2, gk), gk));
      mh[k] = dt_ew_f32_to_bf16(mk);
      vh[k] = dt_ew_f32_to_bf16(vk);
      const double upd = ((double)mk / c1) / dt_ew_dadd(sqrt((double)vk / c2), h.eps);
      p[k] -= (float)dt_ew_dmul(h.lr, dt_ew_dadd(dt_ew_dmul(h.wd, pk), upd));
    }
  }
}

__global__ void dt_ew_step_kernel(long long* step) { *step += 1; }

DT_CU_KERNEL(dt_cu_adamw) {
  (void)out;
  if (in[0].dtype != DT_F32 || in[1].dtype != DT_F32 || in[4].dtype != DT_I64 ||
      (in[2].dtype != DT_F32 && in[2].dtype != DT_BF16) || in[3].dtype != in[2].dtype)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "adamw: dtypes %s, %s, %s, %s, %s are not supported by its "
                   "CUDA kernel", dt_dtype_name(in[0].dtype), dt_dtype_name(in[1].dtype),
                   dt_dtype_name(in[2].dtype), dt_dtype_name(in[3].dtype),
                   dt_dtype_name(in[4].dtype));
  dt_ew_adamw_args h;
  h.lr = dt__op_farg(DT_OP_ADAMW, call, 0);
  h.b1 = dt__op_farg(DT_OP_ADAMW, call, 1);
  h.b2 = dt__op_farg(DT_OP_ADAMW, call, 2);
  h.eps = dt__op_farg(DT_OP_ADAMW, call, 3);
  h.wd = dt__op_farg(DT_OP_ADAMW, call, 4);
  const int64_t n = dt_cu_numel(&in[0]);
  cudaStream_t st = dt_cu_stream(&in[0]);
  long long* step = (long long*)in[4].data;
  if (n > 0) {
    const unsigned grid = dt_cu_grid(&in[0], n);
    float* p = (float*)in[0].data;
    const float* g = (const float*)in[1].data;
    if (in[2].dtype == DT_BF16)
      DT_CU_LAUNCH(call->op, dt_ew_adamw_kernel<uint16_t>, grid, DT_CU_BLOCK, 0, st, p, g,
                   (uint16_t*)in[2].data, (uint16_t*)in[3].data, (const long long*)step, n, h);
    else
      DT_CU_LAUNCH(call->op, dt_ew_adamw_kernel<float>, grid, DT_CU_BLOCK, 0, st, p, g,
                   (float*)in[2].data, (float*)in[3].data, (const long long*)step, n, h);
  }
  DT_CU_LAUNCH(call->op, dt_ew_step_kernel, 1, 1, 0, st, step); /* after the update reads it */
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * scale_ (kernels_optim.c): x *= (float)alpha in place; f32, bf16 or f16 storage (bf16 / f16
 * through f32, rounded back with the host's rule). */

__global__ void dt_ew_scale_kernel(void* x, int dtype, int64_t n, float a) {
  DT_EW_FOR(i, n) dt_ew_store_float(x, dtype, i, dt_ew_load_float(x, dtype, i) * a);
}

DT_CU_KERNEL(dt_cu_scale_) {
  (void)out;
  if (!dt_ew_is_float(in[0].dtype))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "scale_: dtype %s is not supported by its CUDA kernel",
                   dt_dtype_name(in[0].dtype));
  const int64_t n = dt_cu_numel(&in[0]);
  const float a = (float)dt__op_farg(DT_OP_SCALE_, call, 0);
  if (n == 0) return DT_SUCCESS;
  DT_CU_LAUNCH(call->op, dt_ew_scale_kernel, dt_cu_grid(&in[0], n), DT_CU_BLOCK, 0,
               dt_cu_stream(&in[0]), in[0].data, (int)in[0].dtype, n, a);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * sumsq (kernels_optim.c): out (0-d f32) = the sum of x^2 over the local elements of f32, bf16
 * or f16 storage (read in place). Accumulated
 * in double like the host (a gradient norm over up to billions of elements: f32 partial sums
 * would lose digits the host keeps; the reduction is memory-bound, so double costs nothing on
 * data-centre GPUs). Two passes without atomics, so the same data always gives the same result:
 * one double per block, then one block sums those and rounds once to f32. */

__device__ __forceinline__ double dt_ew_block_sum_d(double v, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double s = lane < nw ? smem[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__global__ void dt_ew_sumsq_partial_kernel(const void* x, int tx, int64_t n, double* partial) {
  __shared__ double smem[32];
  double s = 0.0;
  DT_EW_FOR(i, n) {
    const double xi = dt_ew_load_float(x, tx, i);
    s += xi * xi; /* exact product in double; an fma changes nothing */
  }
  s = dt_ew_block_sum_d(s, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void dt_ew_sumsq_final_kernel(const double* partial, int n, float* out) {
  __shared__ double smem[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = dt_ew_block_sum_d(s, smem);
  if (threadIdx.x == 0) *out = (float)s;
}

/* sumsq's scratch: a double per block of the first pass. */
static size_t dt_ew_sumsq_nbytes(unsigned grid) { return grid * sizeof(double); }
DT_CU_SCRATCH(dt_cu_sumsq_scratch) {
  (void)call, (void)out;
  return dt_ew_sumsq_nbytes(dt_cu_grid_sms(dt_cu_numel(&in[0]), dt_cu_sms_of(&in[0])));
}

DT_CU_KERNEL(dt_cu_sumsq) {
  DT_CHECK(dt_cu_need_float(call, in));
  DT_CHECK(dt_cu_need_f32(call, out, 1));
  const int64_t n = dt_cu_numel(&in[0]);
  const unsigned grid = dt_cu_grid(&in[0], n);
  cudaStream_t st = dt_cu_stream(&in[0]);
  void* scratch = NULL;
  const size_t nbytes = dt_ew_sumsq_nbytes(grid);
  DT_CHECK(dt_cu_scratch(&in[0], call->op, nbytes, &scratch));
  double* partial = (double*)scratch;
  int rc = dt_simt_launch(dt_ew_sumsq_partial_kernel, grid, DT_CU_BLOCK, 0, st,
                          (const void*)in[0].data, (int)in[0].dtype, n, partial);
  if (rc == 0)
    rc = dt_simt_launch(dt_ew_sumsq_final_kernel, 1, DT_CU_BLOCK, 0, st, (const double*)partial,
                        (int)grid, (float*)out[0].data);
  dt_cu_scratch_free(&in[0], scratch, nbytes); /* stream-ordered: after the kernels */
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, call->op);
}

/* ---------------------------------------------------------------------------------------------
 * Registration */

}  // namespace

DT_CU_FILL(elementwise) {
  t[DT_OP_ADD] = {dt_cu_add, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SUB] = {dt_cu_sub, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_MUL] = {dt_cu_mul, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_DIV] = {dt_cu_div, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_MAXIMUM] = {dt_cu_maximum, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_MINIMUM] = {dt_cu_minimum, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_EQ] = {dt_cu_eq, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_GE] = {dt_cu_ge, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_GT] = {dt_cu_gt, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_NE] = {dt_cu_ne, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LT] = {dt_cu_lt, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LE] = {dt_cu_le, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_NEG] = {dt_cu_neg, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_RELU] = {dt_cu_relu, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_EXP] = {dt_cu_exp, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LOG] = {dt_cu_log, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SQRT] = {dt_cu_sqrt, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_RSQRT] = {dt_cu_rsqrt, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_GELU] = {dt_cu_gelu, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SILU] = {dt_cu_silu, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SIGMOID] = {dt_cu_sigmoid, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_TANH] = {dt_cu_tanh, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ABS] = {dt_cu_abs, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_CLAMP] = {dt_cu_clamp, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SIN] = {dt_cu_sin, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_COS] = {dt_cu_cos, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_RECIPROCAL] = {dt_cu_reciprocal, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_LOG1P] = {dt_cu_log1p, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_EXPM1] = {dt_cu_expm1, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_FLOOR] = {dt_cu_floor, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_CEIL] = {dt_cu_ceil, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ROUND] = {dt_cu_round, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_TRUNC] = {dt_cu_trunc, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SIGN] = {dt_cu_sign, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ERF] = {dt_cu_erf, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ADD_SCALAR] = {dt_cu_add_scalar, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_MUL_SCALAR] = {dt_cu_mul_scalar, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_POW] = {dt_cu_pow, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_WHERE] = {dt_cu_where, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_MASKED_FILL] = {dt_cu_masked_fill, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_CAST] = {dt_cu_cast, DT_KERNEL_ANY_DTYPE, dt_cu_cast_scratch};
  t[DT_OP_DROPOUT] = {dt_cu_dropout, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ACT_GRAD] = {dt_cu_act_grad, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_ADAMW] = {dt_cu_adamw, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SCALE_] = {dt_cu_scale_, DT_KERNEL_ANY_DTYPE, NULL};
  t[DT_OP_SUMSQ] = {dt_cu_sumsq, DT_KERNEL_ANY_DTYPE, dt_cu_sumsq_scratch};
}

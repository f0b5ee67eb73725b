/* dt_test_fixture.h - the PyTorch op fixtures (tests/reference/ops_fixtures.json and
 * special_fixtures.json) for MPI tests: tensors as doubles, packing into a dtype's storage, the
 * per-input placement options. */
#ifndef DT_TEST_FIXTURE_H
#define DT_TEST_FIXTURE_H

#include <math.h>
#include <string.h>

#include "dt_test_json.h"

#define FX_MAXT 8

/* A fixture number: a JSON number, or one of the strings "nan", "inf" and "-inf" (JSON has no
 * non-finite numbers). */
static inline double fx_num(const cJSON* j) {
  if (cJSON_IsNumber(j)) return j->valuedouble;
  DT_ASSERT_TRUE(cJSON_IsString(j), "fixture number expected");
  if (strcmp(j->valuestring, "nan") == 0) return NAN;
  if (strcmp(j->valuestring, "inf") == 0) return INFINITY;
  DT_ASSERT_TRUE(strcmp(j->valuestring, "-inf") == 0, "fixture number '%s'", j->valuestring);
  return -INFINITY;
}

/* got matches want: both NaN, the same infinity, or |got - want| <= atol + rtol |want|. */
static inline int fx_close(double got, double want, double atol, double rtol) {
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
  if (isinf(want) || isinf(got)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want);
}

typedef struct {
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[DT_MAX_DIMS], numel;
  double* data;
} fx_tensor_t;

static inline dt_dtype_t fx_parse_dtype(const char* s) {
  dt_dtype_t t;
  DT_ASSERT_OK(dt_dtype_parse(s, &t));
  return t;
}

static inline void fx_load_tensor(const cJSON* j, fx_tensor_t* t) {
  t->dtype = fx_parse_dtype(cJSON_GetObjectItem(j, "dtype")->valuestring);
  const cJSON* sh = cJSON_GetObjectItem(j, "shape");
  t->ndim = cJSON_GetArraySize(sh);
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    t->shape[d] = (int64_t)cJSON_GetArrayItem(sh, d)->valuedouble;
    t->numel *= t->shape[d];
  }
  const cJSON* data = cJSON_GetObjectItem(j, "data");
  DT_ASSERT_EQ(cJSON_GetArraySize(data), t->numel);
  t->data = (double*)malloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
  for (int64_t i = 0; i < t->numel; i++) t->data[i] = fx_num(cJSON_GetArrayItem(data, (int)i));
}

static inline size_t fx_itemsize(dt_dtype_t t) {
  return t == DT_F32 || t == DT_I32 ? 4 : t == DT_I64 ? 8 : 2;
}

/* f16 bits of f (round to nearest even; overflow to inf, NaN kept). */
static inline uint16_t fx_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
  if (e == 0xffu) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0u));
  int exp = (int)e - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) { /* subnormal or zero */
    if (exp < -10) return (uint16_t)sign;
    m |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp), half = 1u << (shift - 1), rest = m & ((1u << shift) - 1u);
    uint32_t r = m >> shift;
    if (rest > half || (rest == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((uint32_t)exp << 10) | (m >> 13), rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) r++; /* may carry into the exponent */
  return (uint16_t)(sign | r);
}

static inline float fx_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1fu) u = sign | 0x7f800000u | (m << 13);
  else if (e != 0) u = sign | ((e - 15 + 127) << 23) | (m << 13);
  else if (m == 0) u = sign;
  else { /* subnormal: normalize */
    int k = 0;
    while (!(m & 0x400u)) {
      m <<= 1;
      k++;
    }
    u = sign | ((uint32_t)(127 - 15 + 1 - k) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Packs doubles into the dtype's storage (bf16 by truncation: fixture values are exact bf16;
 * f16 rounded to nearest). */
static inline void* fx_pack(const fx_tensor_t* t) {
  void* buf = malloc(fx_itemsize(t->dtype) * (size_t)(t->numel ? t->numel : 1));
  for (int64_t i = 0; i < t->numel; i++) {
    double v = t->data[i];
    switch (t->dtype) {
      case DT_F32: ((float*)buf)[i] = (float)v; break;
      case DT_I32: ((int32_t*)buf)[i] = (int32_t)v; break;
      case DT_I64: ((int64_t*)buf)[i] = (int64_t)v; break;
      case DT_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t*)buf)[i] = (uint16_t)(u >> 16);
        break;
      }
      case DT_F16: ((uint16_t*)buf)[i] = fx_f32_to_f16((float)v); break;
      default: DT_ASSERT_TRUE(0, "dtype %d in a fixture", (int)t->dtype);
    }
  }
  return buf;
}

static inline double fx_unpack(const void* buf, dt_dtype_t dt, int64_t i) {
  switch (dt) {
    case DT_F32: return ((const float*)buf)[i];
    case DT_I32: return ((const int32_t*)buf)[i];
    case DT_I64: return (double)((const int64_t*)buf)[i];
    case DT_BF16: {
      uint32_t u = (uint32_t)((const uint16_t*)buf)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case DT_F16: return fx_f16_to_f32(((const uint16_t*)buf)[i]);
    default: return NAN;
  }
}

/* Placement options of an input per mesh dim: R, S(d) for each dim, P(sum) for floats. */
static inline int fx_n_options(const fx_tensor_t* t) {
  return 1 + t->ndim + (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16);
}
static inline dt_placement_t fx_option(const fx_tensor_t* t, int k) {
  if (k == 0) return dt_replicate();
  if (k <= t->ndim) return dt_shard(k - 1);
  return dt_partial(DT_REDUCE_SUM);
}

/* A case's integer and scalar arguments. */
static inline void fx_args(const cJSON* c, int* nia, int64_t* iargs, int* nfa, double* fargs) {
  const cJSON *ja = cJSON_GetObjectItem(c, "iargs"), *jf = cJSON_GetObjectItem(c, "fargs");
  *nia = cJSON_GetArraySize(ja);
  *nfa = cJSON_GetArraySize(jf);
  for (int k = 0; k < *nia; k++) iargs[k] = (int64_t)cJSON_GetArrayItem(ja, k)->valuedouble;
  for (int k = 0; k < *nfa; k++) fargs[k] = fx_num(cJSON_GetArrayItem(jf, k));
}

#endif

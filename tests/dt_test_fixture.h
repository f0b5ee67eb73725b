/* dt_test_fixture.h - the PyTorch op fixtures (tests/reference/ops_fixtures.json) for MPI tests:
 * tensors as doubles, packing into a dtype's storage, the per-input placement options. */
#ifndef DT_TEST_FIXTURE_H
#define DT_TEST_FIXTURE_H

#include <string.h>

#include "dt_test_json.h"

#define FX_MAXT 8

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
  for (int64_t i = 0; i < t->numel; i++) t->data[i] = cJSON_GetArrayItem(data, (int)i)->valuedouble;
}

static inline size_t fx_itemsize(dt_dtype_t t) {
  return t == DT_F32 || t == DT_I32 ? 4 : t == DT_I64 ? 8 : 2;
}

/* Packs doubles into the dtype's storage (bf16 by truncation: fixture values are exact bf16). */
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
    default: return NAN;
  }
}

/* Placement options of an input per mesh dim: R, S(d) for each dim, P(sum) for floats. */
static inline int fx_n_options(const fx_tensor_t* t) {
  return 1 + t->ndim + (t->dtype == DT_F32 || t->dtype == DT_BF16);
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
  for (int k = 0; k < *nfa; k++) fargs[k] = cJSON_GetArrayItem(jf, k)->valuedouble;
}

#endif

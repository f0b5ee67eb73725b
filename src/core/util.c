/* util.c - allocation wrappers, loading optional libraries, debug logging, dtype tables and
 * conversions. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "internal/common.h"

/* ---------------------------------------------------------------------------------------------
 * allocation */

void* dt__malloc(size_t n) { return malloc(n ? n : 1); }

void* dt__dlopen_first(const char* const* names, int n, char* why, size_t cap) {
  size_t at = 0;
  if (cap) why[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (names[i] == NULL || !names[i][0]) continue;
    void* h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) return h;
    const char* e = dlerror();
    if (at < cap)
      at += (size_t)snprintf(why + at, cap - at, "%s%s", at ? "; " : "", e ? e : names[i]);
  }
  return NULL;
}
void* dt__calloc(size_t count, size_t size) { return calloc(count ? count : 1, size ? size : 1); }
void* dt__realloc(void* p, size_t n) { return realloc(p, n ? n : 1); }
void dt__free(void* p) { free(p); }

uint64_t dt__mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t dt__hash_bytes(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

uint64_t dt__hash_str(uint64_t seed, const char* s) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (const unsigned char* p = (const unsigned char*)s; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

int dt__grid_index(int ndim, const int* shape, const int* coords) {
  int v = 0;
  for (int i = 0; i < ndim; i++) v = v * shape[i] + coords[i];
  return v;
}

void dt__grid_coords(int ndim, const int* shape, int index, int* coords) {
  for (int i = ndim - 1; i >= 0; i--) {
    coords[i] = index % shape[i];
    index /= shape[i];
  }
}

int dt__mul_i64(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return 0;
  if (a != 0 && b > INT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

/* ---------------------------------------------------------------------------------------------
 * logging: DTENSOR_DEBUG=redistribute,mesh or all. Rank 0 only unless
 * DTENSOR_DEBUG_ALL_RANKS=1 (the rank filter is applied by callers that know the rank).
 * DTENSOR_DEBUG=collectives (or all) turns on the comm layer's collective check, read once by
 * dt_init. */

unsigned dt__debug_mask(void) {
  static int init = 0;
  static unsigned mask = 0;
  if (!init) {
    const char* s = getenv("DTENSOR_DEBUG");
    if (s != NULL) {
      if (strstr(s, "all") || strstr(s, "ALL")) mask = ~0u;
      if (strstr(s, "redistribute")) mask |= DT_DBG_REDISTRIBUTE;
      if (strstr(s, "mesh")) mask |= DT_DBG_MESH;
      if (strstr(s, "collectives")) mask |= DT_DBG_COLLECTIVES;
    }
    init = 1;
  }
  return mask;
}

void dt__log(const char* subsys, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[dtensor %s] %s\n", subsys, buf);
  fflush(stderr);
}

int64_t dt__env_int(const char* name, int64_t lo, int64_t hi, int64_t dflt, const char* subsys,
                    const char* what) {
  const char* e = getenv(name);
  if (e == NULL || *e == '\0') return dflt;
  const char* d = e[0] == '-' ? e + 1 : e;
  char* end = NULL;
  errno = 0;
  long long v = *d >= '0' && *d <= '9' ? strtoll(e, &end, 10) : 0;
  if (end == NULL || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    dt__log(subsys, "ignoring %s=%.64s: expected %s", name, e, what);
    return dflt;
  }
  return (int64_t)v;
}

/* ---------------------------------------------------------------------------------------------
 * dtypes */

static const char* const dt__dtype_names[DT_DTYPE_COUNT] = {
    [DT_F32] = "f32", [DT_BF16] = "bf16", [DT_F16] = "f16", [DT_I32] = "i32", [DT_I64] = "i64"};
static const size_t dt__dtype_sizes[DT_DTYPE_COUNT] = {
    [DT_F32] = 4, [DT_BF16] = 2, [DT_F16] = 2, [DT_I32] = 4, [DT_I64] = 8};
_Static_assert(DT_DTYPE_COUNT == 5, "update the dtype tables");

int dt__dtype_valid(int dtype) { return dtype >= 0 && dtype < DT_DTYPE_COUNT; }
size_t dt__itemsize(dt_dtype_t dtype) { return dt__dtype_sizes[dtype]; }
int dt__dtype_is_float(dt_dtype_t d) { return d == DT_F32 || d == DT_BF16 || d == DT_F16; }

static dt_status_t dt__dtype_itemsize(dt_dtype_t dtype, size_t* nbytes) {
  DT_ARG_NOT_NULL(nbytes);
  *nbytes = 0;
  if (!dt__dtype_valid(dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "dtype %d out of range [0, %d)", (int)dtype, DT_DTYPE_COUNT);
  *nbytes = dt__dtype_sizes[dtype];
  return DT_SUCCESS;
}

dt_status_t dt_dtype_itemsize(dt_dtype_t dtype, size_t* nbytes) {
  DT_ENTRY_RETURN(dt__dtype_itemsize(dtype, nbytes));
}

const char* dt_dtype_name(dt_dtype_t dtype) {
  return dt__dtype_valid(dtype) ? dt__dtype_names[dtype] : "invalid";
}

static dt_status_t dt__dtype_parse(const char* text, dt_dtype_t* out) {
  DT_ARG_NOT_NULL(text);
  DT_ARG_NOT_NULL(out);
  static const struct { const char* s; dt_dtype_t d; } alias[] = {
      {"f32", DT_F32},   {"float32", DT_F32},  {"float", DT_F32},  {"bf16", DT_BF16},
      {"bfloat16", DT_BF16}, {"f16", DT_F16}, {"float16", DT_F16}, {"half", DT_F16},
      {"i32", DT_I32},   {"int32", DT_I32},    {"i64", DT_I64},    {"int64", DT_I64}};
  for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
    if (strcmp(text, alias[i].s) == 0) {
      *out = alias[i].d;
      return DT_SUCCESS;
    }
  return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s' is not a dtype (valid: f32, bf16, f16, i32 or i64 "
                 "and their long names: float32, bfloat16, float16, half, int32, int64)", text);
}

dt_status_t dt_dtype_parse(const char* text, dt_dtype_t* out) {
  DT_ENTRY_RETURN(dt__dtype_parse(text, out));
}

const char* dt_reduce_op_name(dt_reduce_op_t op) {
  static const char* const names[DT_REDUCE_COUNT] = {"sum", "avg", "max", "min"};
  return (op >= 0 && op < DT_REDUCE_COUNT) ? names[op] : "invalid";
}

float dt__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: renormalize */
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dt__f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  if (absu < 0x38800000u) {                                    /* subnormal or zero */
    if (absu < 0x33000000u) return (uint16_t)sign;
    uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((absu - 0x38000000u) >> 13);
  uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

void dt__store(void* buf, dt_dtype_t dtype, int64_t i, double v) {
  switch (dtype) {
    case DT_F32: ((float*)buf)[i] = (float)v; break;
    case DT_BF16: ((uint16_t*)buf)[i] = dt__f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t*)buf)[i] = dt__f32_to_f16((float)v); break;
    case DT_I32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t*)buf)[i] = (int64_t)v; break;
    default: break;
  }
}

double dt__load(const void* buf, dt_dtype_t dtype, int64_t i) {
  switch (dtype) {
    case DT_F32: return ((const float*)buf)[i];
    case DT_BF16: return dt__bf16_to_f32(((const uint16_t*)buf)[i]);
    case DT_F16: return dt__f16_to_f32(((const uint16_t*)buf)[i]);
    case DT_I32: return ((const int32_t*)buf)[i];
    case DT_I64: return (double)((const int64_t*)buf)[i];
    default: return 0.0;
  }
}

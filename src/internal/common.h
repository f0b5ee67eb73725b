/* common.h - small internal helpers shared by every layer (the core layer): allocation, the
 * storage pool, logging, dtype support, hashing, overflow-checked and index arithmetic. */
#ifndef DT_INTERNAL_COMMON_H
#define DT_INTERNAL_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/handle.h"
#include "dtensor/placement.h"
#include "internal/check.h"

#define DT_NAME_MAX 32 /* mesh dim and flattened dim names, including the NUL */

/* Allocation goes through these so that it can be replaced and audited. */
void* dt__malloc(size_t n);
void* dt__calloc(size_t count, size_t size);
void* dt__realloc(void* p, size_t n);
void dt__free(void* p);

/* dlopen (RTLD_NOW | RTLD_LOCAL) of the first of the n file names that loads (NULL or "" names
 * skipped): the handle, or NULL with the loader's reasons for each name, "; "-joined, in why.
 * How optional run-time libraries (cuBLASLt, NCCL) are found. */
void* dt__dlopen_first(const char* const* names, int n, char* why, size_t cap);

/* Frees the handle quarantine, and the registry when no handle is live (dt_finalize). */
void dt__handle_release_all(void);

/* Puts back a last-error text saved earlier (a call that succeeds after an internal failure it
 * recovered from leaves the caller's last error as it was). */
void dt__error_restore(const char* saved);
/* The last error's text without the "dt_entry: " of the public function it was recorded under
 * (what another rank is told: the entry is the same there). */
const char* dt__last_error_text(void);

/* The op profile (src/core/profile.c, dt_profile_* in dtensor/ops.h): a region is timed when
 * dt__prof_on() was true at its start: dt__prof_begin(&f) ... dt__prof_end(&f, name, kind) with a
 * name that lives as long as the library and a kind, DT__PROF_* (layers below ops cannot name
 * dt_profile_kind_t's values). */
typedef struct dt__prof_frame {
  double t0, child;
  struct dt__prof_frame* parent;
} dt__prof_frame_t;
enum { DT__PROF_OP = 0, DT__PROF_BACKWARD = 1, DT__PROF_COMM = 2, DT__PROF_LOCAL = 3 };
/* (dt_profile_kind_t's values) */
int dt__prof_on(void);
void dt__prof_begin(dt__prof_frame_t* f);
void dt__prof_end(dt__prof_frame_t* f, const char* name, int kind);

/* Debug subsystems selected by DTENSOR_DEBUG (comma-separated names, or "all"). collectives is
 * not a log: it turns on the collective check of the comm layer (src/comm/comm.h). */
enum { DT_DBG_REDISTRIBUTE = 1u << 0, DT_DBG_MESH = 1u << 1, DT_DBG_COLLECTIVES = 1u << 2 };
unsigned dt__debug_mask(void);
void dt__log(const char* subsys, const char* fmt, ...) DT__PRINTF(2, 3);
/* The whole decimal integer in [lo, hi] that environment variable `name` holds; `dflt` when it is
 * unset or empty, and also (with a notice naming `what`, e.g. "MiB, 0 to 2^30") when it holds
 * anything else: garbage, a prefix of a number, a value out of range. */
int64_t dt__env_int(const char* name, int64_t lo, int64_t hi, int64_t dflt, const char* subsys,
                    const char* what);

/* The hot host loops (element-wise, softmax, norms, reductions, AdamW, dtype conversions) are compiled three times,
 * for AVX-512, AVX2 and baseline x86-64, and the loader picks one for the CPU it runs on (GCC's
 * function multiversioning, a glibc ifunc): the library itself is built for baseline x86-64
 * (SSE2). Every clone computes the same values bit for bit: ISO C mode contracts no a * b + c
 * into an FMA (-ffp-contract=off) and nothing is reassociated, so only the vector width differs.
 * Put on a function holding the loops (its static callees are inlined into each clone); not on
 * one whose products pair into a * b +- c * d, which GCC's vectorizer fuses into AVX-512's
 * vfmaddsub even with -ffp-contract=off (rotary: found by review, 1 ulp apart).
 * tools/check_simd.sh (a ctest) fails the build's tests if a clone holds a fused multiply-add.
 * glibc only: the loader's ifunc picks the clone (musl has none). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
#define DT_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_SIMD
#endif

/* dtype helpers (dtype must already be validated). */
size_t dt__itemsize(dt_dtype_t dtype);
int dt__dtype_valid(int dtype);
int dt__dtype_is_float(dt_dtype_t dtype);
/* bf16 <-> f32 inline, so that the loops calling them vectorize (dt__host_convert's). */
static inline float dt__bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t dt__f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
float dt__f16_to_f32(uint16_t h);
uint16_t dt__f32_to_f16(float f);
/* Stores double v into element i of a buffer of dtype (rounding for bf16/f16, truncation
 * toward zero for integers). */
void dt__store(void* buf, dt_dtype_t dtype, int64_t i, double v);
double dt__load(const void* buf, dt_dtype_t dtype, int64_t i);

/* Fast non-cryptographic hash of a byte range (8 bytes at a time), for cache keys. */
uint64_t dt__hash_bytes(const void* p, size_t n);
/* FNV-1a of a NUL-terminated string, mixed with `seed` (op names, parameter names). */
uint64_t dt__hash_str(uint64_t seed, const char* s);
/* splitmix64 finalizer: the counter-based RNG of factories and dropout (value of element g is a
 * function of (seed, g) only, so it does not depend on placements). */
uint64_t dt__mix64(uint64_t x);

/* Overflow-checked products. Return 0 on overflow. */
int dt__mul_i64(int64_t a, int64_t b, int64_t* out);

/* Row-major linear index of `coords` in a grid of `shape` (ndim dims), and back. */
int dt__grid_index(int ndim, const int* shape, const int* coords);
void dt__grid_coords(int ndim, const int* shape, int index, int* coords);

#endif

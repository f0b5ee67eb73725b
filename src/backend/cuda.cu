/* cuda.cu - the CUDA backend: device memory through a caching allocator, the backend's kernels
 * (fill, box and split copies, scaling, conversion, reduction) and GEMMs through cuBLASLt, all
 * issued on one compute stream per device.
 *
 * One source, two builds (see cuda.h): nvcc makes the "cuda" backend (dt__backend_cuda_open);
 * g++ with DT_SIMT_EMULATE (a wrapper CMake generates) makes "cuda-emu" (dt__backend_cuda_emu_open),
 * where the kernels run through the SIMT emulator, the few runtime calls come from cuda_rt_emu.h
 * (device memory is aligned host memory that starts as 0xFF bytes, everything finishes before the
 * call returns) and GEMMs run on the host through dt__host_gemm (OpenBLAS) instead of cuBLASLt.
 *
 * The allocator. cudaMalloc is slow and cudaFree synchronizes the whole device, so neither may
 * run on the hot path. Requests are rounded to a size class (512-byte granules up to 1 MiB,
 * 2 MiB multiples above) and freed blocks wait in per-class free lists, most recently freed
 * first, until a request of the same class takes them again. A cudaMalloc failure releases the
 * cache (after a stream synchronization) and retries once. $DTENSOR_CUDA_MAX_MB (read once; a
 * whole number of MiB, 0 or unset: no cap) caps the bytes the allocator holds, live plus cached:
 * cached blocks are released to make room, and a request that cannot fit gets NULL (how tests
 * provoke out-of-memory, in the emulator too). The cuBLASLt workspace is not counted.
 *
 * Stream-ordered free: every kernel, copy and GEMM of a device goes to its one compute stream,
 * so a block the host frees while issued work may still read or write it can be handed out at
 * once: whatever the next owner issues is queued on the same stream behind that work. Work on any
 * other stream (a communication stream) that uses a block must be joined to the compute stream
 * with an event (event_record / event_wait) before the block is freed.
 *
 * Results match the host backend's bit for bit: conversions round exactly like dt__store and
 * dt__host_convert (including their NaN patterns, which differ from CUDA's intrinsics, so the
 * kernels carry their own conversions; integer sources go through double as dt__load does),
 * integers truncate toward zero, reductions follow the host's NaN rules and round half types
 * once per step. Two exceptions, both outside what C defines or the hardware fixes: a sum or
 * quotient that makes a NaN gives a NaN whose sign and payload are the hardware's, and NaN or
 * out-of-range values converted to an integer dtype saturate on a GPU (C leaves them undefined).
 */
#include "backend/simt.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>

#ifdef DT_SIMT_EMULATE
#include "backend/cuda_rt_emu.h"
#else
#include <cublasLt.h>
#include <dlfcn.h>
#endif

extern "C" {
#include "backend/cuda.h"
}

#ifndef DT_SIMT_EMULATE
/* ---------------------------------------------------------------------------------------------
 * cuBLASLt, loaded when the first GEMM needs it (dlopen): the library does not depend on it at
 * link time, so it runs where the only cuBLASLt is another installation's (PyTorch's wheels ship
 * one), of this major version or the previous one (the functions used here are the same in
 * 12.x and 13.x), and a program that never multiplies matrices on a GPU needs none.
 * $DTENSOR_CUBLASLT names the file to load; else libcublasLt.so.13, .so.12, .so in the loader's
 * search path. */
#define DT__LT_FUNCS(X)                                                                          \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusName) X(cublasLtGetStatusString)       \
  X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate)                \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                                 \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                           \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate)                          \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)
static pthread_mutex_t dt__lt_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int tried;
  void* handle;
  char why[768];
#define DT__LT_PTR(f) decltype(&::f) f;
  DT__LT_FUNCS(DT__LT_PTR)
#undef DT__LT_PTR
} dt__lt; /* zero until loaded */

static dt_status_t dt__lt_load(void) {
  pthread_mutex_lock(&dt__lt_mu);
  if (!dt__lt.tried) {
    dt__lt.tried = 1;
    const char* names[4] = {getenv("DTENSOR_CUBLASLT"), "libcublasLt.so.13", "libcublasLt.so.12",
                            "libcublasLt.so"};
    dt__lt.handle = dt__dlopen_first(names, 4, dt__lt.why, sizeof dt__lt.why);
    int ok = dt__lt.handle != NULL;
#define DT__LT_SYM(f)                                                                  \
  if (ok && (dt__lt.f = (decltype(dt__lt.f))dlsym(dt__lt.handle, #f)) == NULL) {       \
    snprintf(dt__lt.why, sizeof dt__lt.why, "the loaded cuBLASLt has no %s", #f);      \
    ok = 0;                                                                            \
  }
    DT__LT_FUNCS(DT__LT_SYM)
#undef DT__LT_SYM
    if (!ok && dt__lt.handle != NULL) {
      dlclose(dt__lt.handle);
      dt__lt.handle = NULL;
    }
  }
  dt_status_t st = dt__lt.handle != NULL ? DT_SUCCESS
                   : DT_FAIL(DT_ERR_CUBLAS, "cannot load cuBLASLt (set DTENSOR_CUBLASLT to the "
                             "library file, or add its folder to LD_LIBRARY_PATH): %s", dt__lt.why);
  pthread_mutex_unlock(&dt__lt_mu);
  return st;
}

/* From here on every cuBLASLt call goes through the loaded library. */
#define cublasLtCreate dt__lt.cublasLtCreate
#define cublasLtDestroy dt__lt.cublasLtDestroy
#define cublasLtGetStatusName dt__lt.cublasLtGetStatusName
#define cublasLtGetStatusString dt__lt.cublasLtGetStatusString
#define cublasLtMatmul dt__lt.cublasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic dt__lt.cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate dt__lt.cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy dt__lt.cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute dt__lt.cublasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate dt__lt.cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy dt__lt.cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute dt__lt.cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate dt__lt.cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy dt__lt.cublasLtMatrixLayoutDestroy
#define cublasLtMatrixLayoutSetAttribute dt__lt.cublasLtMatrixLayoutSetAttribute
#endif

#define DT_CU_THREADS 256
#define DT_CU_SMALL_MAX ((size_t)1 << 20)   /* size classes: 512 B granules up to here, */
#define DT_CU_SMALL_GRAIN ((size_t)512)
#define DT_CU_LARGE_GRAIN ((size_t)2 << 20) /* 2 MiB multiples above */
#define DT_CU_BUCKETS 256                   /* hash buckets of the free lists */
#define DT_CU_EVENT_POOL 64                 /* idle events kept for reuse */
#define DT_CU_MAX_DEVICES 16                /* backend objects: one per ordinal */
#define DT_CU_BOX_DIMS (DT_MAX_DIMS + 1)    /* a box's dims, plus one of bytes for odd items */
#ifdef DT_SIMT_EMULATE
#define DT_CU_KIND "cuda-emu" /* what the build's backends are called */
#else
#define DT_CU_KIND "cuda"
#define DT_CU_GEMM_SLOTS 64                 /* cached GEMM plans */
#define DT_CU_GEMM_PROBE 8                  /* slots a lookup probes */
#define DT_CU_WORKSPACE ((size_t)32 << 20)  /* cuBLASLt workspace */
#endif

/* ---------------------------------------------------------------------------------------------
 * state */

/* A cached (free) device block. */
typedef struct dt_cu_block {
  void* ptr;
  size_t nbytes; /* its size class */
  struct dt_cu_block* next;
} dt_cu_block_t;

#ifndef DT_SIMT_EMULATE
/* Everything a cuBLASLt plan depends on (zero-filled before use so that memcmp compares it). */
typedef struct dt_cu_gemm_key {
  int32_t trans_a, trans_b, ab_dtype, c_dtype, has_bias, tf32;
  uint32_t align_a, align_b, align_c, align_bias; /* pointer alignment in bytes, at most 256 */
  int64_t m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c;
  uint64_t workspace;
} dt_cu_gemm_key_t;

/* A cached GEMM plan: the descriptors and the algorithm the heuristic chose for one key. */
typedef struct dt_cu_gemm_plan {
  int used;
  dt_cu_gemm_key_t key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
} dt_cu_gemm_plan_t;
#endif

/* One device's backend: the public object first, its state after. */
typedef struct dt_cu_ctx {
  struct dt_backend b;
  char name[24];
  cudaStream_t stream;
  int sm_count;
  /* the allocator and the event pool (mu) */
  pthread_mutex_t mu;
  dt_cu_block_t* free_lists[DT_CU_BUCKETS];
  dt_cu_block_t* spare; /* list nodes of blocks handed out again (frees reuse them) */
  int64_t live, cached, peak, mallocs, hits;
  int64_t cap; /* bytes the allocator may hold (live + cached); 0: no cap */
  int released; /* after release: frees go straight back to CUDA until the next alloc */
  cudaEvent_t events[DT_CU_EVENT_POOL];
  int n_events;
#ifndef DT_SIMT_EMULATE
  /* cuBLASLt (gemm_mu) */
  pthread_mutex_t gemm_mu;
  cublasLtHandle_t lt;
  void* workspace;
  size_t workspace_nbytes;
  int workspace_tried;
  dt_cu_gemm_plan_t plans[DT_CU_GEMM_SLOTS];
#endif
} dt_cu_ctx_t;

static dt_cu_ctx_t* dt__cu_ctx(dt_backend_t b) { return (dt_cu_ctx_t*)b->context; }

/* Makes the backend's device the calling thread's current device (it stays current). */
static void dt__cu_enter(const dt_cu_ctx_t* c) {
#ifdef DT_SIMT_EMULATE
  (void)c;
#else
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != c->b.ordinal) (void)cudaSetDevice(c->b.ordinal);
#endif
}

extern "C" dt_status_t DT_CUDA_NAME(status)(int err, const char* what) {
  if (err == 0) return DT_SUCCESS;
  cudaError_t e = (cudaError_t)err;
  (void)cudaGetLastError(); /* clear the runtime's last error (sticky errors stay) */
  return DT_FAIL(e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_CUDA, "%s: %s: %s",
                 what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* DT_SUCCESS, or the status of a failed runtime call. */
#define DT__CU(call, what) DT_CUDA_NAME(status)((int)(call), what)

extern "C" void* DT_CUDA_NAME(stream)(dt_backend_t b) { return (void*)dt__cu_ctx(b)->stream; }

extern "C" int DT_CUDA_NAME(sm_count)(dt_backend_t b) { return dt__cu_ctx(b)->sm_count; }

extern "C" dt_status_t DT_CUDA_NAME(device_key)(dt_backend_t b, uint64_t* key) {
  *key = (uint64_t)(b->ordinal + 1);
#ifndef DT_SIMT_EMULATE
  char bus[64] = {0};
  DT_CHECK(DT__CU(cudaDeviceGetPCIBusId(bus, (int)sizeof bus - 1, b->ordinal),
                  "the device's PCI bus id (cudaDeviceGetPCIBusId)"));
  uint64_t h = 1469598103934665603ull;
  for (const char* c = bus; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  *key = h;
#endif
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * device helpers: the host's dtype conversions (src/internal/common.h, src/core/util.c), bit
 * for bit */

#define DT_CU_FOR(i, n)                                                      \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

static __device__ __forceinline__ float dt_cu_bf16_to_f32(uint16_t h) {
  return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ uint16_t dt_cu_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float dt_cu_f16_to_f32(uint16_t h) {
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
      u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13); /* inf, or NaN keeping its payload */
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return __uint_as_float(u);
}

static __device__ __forceinline__ uint16_t dt_cu_f32_to_f16(float f) {
  uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  if (absu < 0x38800000u) {                                   /* subnormal or zero */
    if (absu < 0x33000000u) return (uint16_t)sign;
    uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = (absu - 0x38000000u) >> 13, rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

/* Element i of a float dtype (f32, bf16, f16) buffer, exactly. */
static __device__ __forceinline__ float dt_cu_load_f(const void* p, int dtype, int64_t i) {
  if (dtype == DT_F32) return ((const float*)p)[i];
  uint16_t h = ((const uint16_t*)p)[i];
  return dtype == DT_BF16 ? dt_cu_bf16_to_f32(h) : dt_cu_f16_to_f32(h);
}

/* Stores v as element i of a float dtype buffer, rounded to nearest even. */
static __device__ __forceinline__ void dt_cu_store_f(void* p, int dtype, int64_t i, float v) {
  if (dtype == DT_F32) ((float*)p)[i] = v;
  else ((uint16_t*)p)[i] = dtype == DT_BF16 ? dt_cu_f32_to_bf16(v) : dt_cu_f32_to_f16(v);
}

/* ---------------------------------------------------------------------------------------------
 * kernels (grid-stride loops over n elements) */

/* dst[0 .. n) = v (v holds the element's bits). */
template <typename T>
static __global__ void dt_cu_fill_kernel(T* dst, T v, int64_t n) {
  DT_CU_FOR(i, n) dst[i] = v;
}

/* A box copy with the host work done: per dim, the extent and both strides in elements (the
 * pointers already point at the box's first element). In an unnamed namespace so that the launch
 * templates instantiated with it stay private to this file. */
namespace {
typedef struct dt_cu_box {
  int ndim;
  int64_t ext[DT_CU_BOX_DIMS], dst_stride[DT_CU_BOX_DIMS], src_stride[DT_CU_BOX_DIMS];
} dt_cu_box_t;
}  // namespace

template <typename T>
static __global__ void dt_cu_box_kernel(T* dst, const T* src, dt_cu_box_t box, int64_t total) {
  DT_CU_FOR(i, total) {
    int64_t rest = i, d_at = 0, s_at = 0;
    for (int d = box.ndim - 1; d >= 0; d--) {
      int64_t q = rest / box.ext[d], idx = rest - q * box.ext[d];
      rest = q;
      d_at += idx * box.dst_stride[d];
      s_at += idx * box.src_stride[d];
    }
    dst[d_at] = src[s_at];
  }
}

static __global__ void dt_cu_div_f32_kernel(float* buf, int64_t n, float div) {
  DT_CU_FOR(i, n) buf[i] = buf[i] / div;
}

/* Integer division truncates toward zero, as C's. */
template <typename T>
static __global__ void dt_cu_div_int_kernel(T* buf, int64_t n, T div) {
  DT_CU_FOR(i, n) buf[i] = buf[i] / div;
}

/* bf16/f16 as the host: the quotient in double, rounded to f32, then to the dtype. */
static __global__ void dt_cu_div_half_kernel(void* buf, int dtype, int64_t n, int div) {
  DT_CU_FOR(i, n) {
    double q = (double)dt_cu_load_f(buf, dtype, i) / (double)div;
    dt_cu_store_f(buf, dtype, i, (float)q);
  }
}

/* dst = src converted, as dt__store(dst, to, i, dt__load(src, from, i)): integers go through
 * double (as the host's load does), float dtypes through f32 (exact, NaN payloads kept). */
static __global__ void dt_cu_convert_kernel(const void* src, int from, void* dst, int to,
                                            int64_t n) {
  DT_CU_FOR(i, n) {
    if (from == DT_I32 || from == DT_I64) {
      double v = from == DT_I32 ? (double)((const int32_t*)src)[i]
                                : (double)((const int64_t*)src)[i];
      if (to == DT_I32) ((int32_t*)dst)[i] = (int32_t)v;
      else if (to == DT_I64) ((int64_t*)dst)[i] = (int64_t)v;
      else dt_cu_store_f(dst, to, i, (float)v);
    } else {
      float v = dt_cu_load_f(src, from, i);
      if (to == DT_I32) ((int32_t*)dst)[i] = (int32_t)v;
      else if (to == DT_I64) ((int64_t*)dst)[i] = (int64_t)v;
      else dt_cu_store_f(dst, to, i, v);
    }
  }
}

/* The host's float rules: NaN wins max and min. */
static __device__ __forceinline__ float dt_cu_combine_f(float x, float y, int op) {
  if (op == DT_REDUCE_SUM) return x + y;
  if (op == DT_REDUCE_MAX) return (x > y || x != x) ? x : y;
  return (x < y || x != x) ? x : y;
}

static __global__ void dt_cu_reduce_f32_kernel(float* dst, const float* a, const float* src,
                                               int64_t n, int op) {
  DT_CU_FOR(i, n) dst[i] = dt_cu_combine_f(a[i], src[i], op);
}

/* Integer sums wrap (computed in the unsigned type U). */
template <typename T, typename U>
static __global__ void dt_cu_reduce_int_kernel(T* dst, const T* a, const T* src, int64_t n,
                                               int op) {
  DT_CU_FOR(i, n) {
    T x = a[i], y = src[i];
    dst[i] = op == DT_REDUCE_SUM ? (T)((U)x + (U)y)
             : op == DT_REDUCE_MAX ? (x > y ? x : y)
                                   : (x < y ? x : y);
  }
}

/* bf16/f16: in f32, rounded once per step. */
static __global__ void dt_cu_reduce_half_kernel(void* dst, const void* a, const void* src,
                                                int dtype, int64_t n, int op) {
  DT_CU_FOR(i, n) {
    float r = dt_cu_combine_f(dt_cu_load_f(a, dtype, i), dt_cu_load_f(src, dtype, i), op);
    dt_cu_store_f(dst, dtype, i, r);
  }
}

#ifndef DT_SIMT_EMULATE
/* The GEMM with k == 0: C_i = beta C_i (0 when beta is 0, whatever C held) + bias, in f32. */
static __global__ void dt_cu_gemm_k0_kernel(void* c, int c_dtype, int64_t m, int64_t n,
                                            int64_t ldc, int64_t stride_c, int64_t total,
                                            float beta, const void* bias) {
  DT_CU_FOR(i, total) {
    int64_t j = i % n, r = (i / n) % m, bt = i / (n * m), at = bt * stride_c + r * ldc + j;
    float v = beta == 0.0f ? 0.0f : beta * dt_cu_load_f(c, c_dtype, at);
    if (bias != NULL) v += dt_cu_load_f(bias, c_dtype, j);
    dt_cu_store_f(c, c_dtype, at, v);
  }
}
#endif

/* Blocks for a grid-stride loop over n elements: a few per SM, never more than n needs. */
static unsigned dt__cu_grid(const dt_cu_ctx_t* c, int64_t n) {
  int64_t want = (n + DT_CU_THREADS - 1) / DT_CU_THREADS, cap = (int64_t)c->sm_count * 8;
  if (want > cap) want = cap;
  return (unsigned)(want < 1 ? 1 : want);
}

/* Launches kernel over n elements on the backend's stream; a status naming `what` on failure. */
template <typename... P, typename... A>
static dt_status_t dt__cu_launch(const dt_cu_ctx_t* c, const char* what, void (*kernel)(P...),
                                 int64_t n, A&&... args) {
  int rc = dt_simt_launch(kernel, dim3(dt__cu_grid(c, n)), dim3(DT_CU_THREADS), 0, c->stream,
                          std::forward<A>(args)...);
  return rc == 0 ? DT_SUCCESS : DT_CUDA_NAME(status)(rc, what);
}

/* ---------------------------------------------------------------------------------------------
 * the caching allocator */

static size_t dt__cu_class(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes <= DT_CU_SMALL_MAX) return (nbytes + DT_CU_SMALL_GRAIN - 1) & ~(DT_CU_SMALL_GRAIN - 1);
  return (nbytes + DT_CU_LARGE_GRAIN - 1) & ~(DT_CU_LARGE_GRAIN - 1);
}

static dt_cu_block_t** dt__cu_bucket(dt_cu_ctx_t* c, size_t cls) {
  return &c->free_lists[dt__mix64(cls) % DT_CU_BUCKETS];
}

/* Gives every cached block back to CUDA (mu held). Blocks may still be in use by issued work
 * (stream-ordered frees), hence the synchronization first. The nodes become spares. */
static void dt__cu_trim_locked(dt_cu_ctx_t* c) {
  if (c->cached == 0) return;
  (void)cudaStreamSynchronize(c->stream);
  for (int i = 0; i < DT_CU_BUCKETS; i++) {
    while (c->free_lists[i] != NULL) {
      dt_cu_block_t* blk = c->free_lists[i];
      c->free_lists[i] = blk->next;
      (void)cudaFree(blk->ptr);
      blk->next = c->spare;
      c->spare = blk;
    }
  }
  c->cached = 0;
  (void)cudaGetLastError();
}

static void* dt__cu_alloc(dt_backend_t b, size_t nbytes) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  const size_t cls = dt__cu_class(nbytes);
  void* p = NULL;
  dt__cu_enter(c);
  pthread_mutex_lock(&c->mu);
  c->released = 0;
  /* a cached block of the class: the most recently freed one */
  for (dt_cu_block_t** at = dt__cu_bucket(c, cls); *at != NULL; at = &(*at)->next) {
    if ((*at)->nbytes != cls) continue;
    dt_cu_block_t* blk = *at;
    *at = blk->next;
    p = blk->ptr;
    blk->next = c->spare;
    c->spare = blk;
    c->cached -= (int64_t)cls;
    c->hits++;
    goto got;
  }
  if (c->cap > 0) {
    if (c->live + (int64_t)cls > c->cap) goto done; /* can never fit under the cap */
    if (c->live + c->cached + (int64_t)cls > c->cap) dt__cu_trim_locked(c);
  }
  if (cudaMalloc(&p, cls) != cudaSuccess) {
    (void)cudaGetLastError();
    p = NULL;
    dt__cu_trim_locked(c);
    if (cudaMalloc(&p, cls) != cudaSuccess) {
      (void)cudaGetLastError();
      p = NULL;
      goto done;
    }
  }
  c->mallocs++;
got:
  c->live += (int64_t)cls;
  if (c->live > c->peak) c->peak = c->live;
done:
  pthread_mutex_unlock(&c->mu);
  return p;
}

/* Stream-ordered (see the file comment): the block goes to the cache at once. Its list node is a
 * spare one when there is one, so the steady state allocates no host memory either. */
static void dt__cu_free(dt_backend_t b, void* p, size_t nbytes) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (p == NULL) return;
  const size_t cls = dt__cu_class(nbytes);
  pthread_mutex_lock(&c->mu);
  c->live -= (int64_t)cls;
  if (!c->released) {
    dt_cu_block_t* blk = c->spare;
    if (blk != NULL) c->spare = blk->next;
    else blk = (dt_cu_block_t*)dt__malloc(sizeof *blk);
    if (blk != NULL) {
      dt_cu_block_t** head = dt__cu_bucket(c, cls);
      blk->ptr = p;
      blk->nbytes = cls;
      blk->next = *head;
      *head = blk;
      c->cached += (int64_t)cls;
      p = NULL;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (p != NULL) { /* after release (or without memory for the list node): back to CUDA */
    dt__cu_enter(c);
    (void)cudaFree(p);
    (void)cudaGetLastError();
  }
}

/* ---------------------------------------------------------------------------------------------
 * memory operations */

static dt_status_t dt__cu_memset(dt_backend_t b, void* dst, int value, size_t nbytes) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (nbytes == 0) return DT_SUCCESS;
  dt__cu_enter(c);
  return DT__CU(cudaMemsetAsync(dst, value, nbytes, c->stream), "memset: cudaMemsetAsync");
}

static dt_status_t dt__cu_fill(dt_backend_t b, void* dst, dt_dtype_t dtype, int64_t n,
                               double value) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (n <= 0) return DT_SUCCESS;
  if (!dt__dtype_valid(dtype)) return DT_FAIL(DT_ERR_INTERNAL, "fill: dtype %d", (int)dtype);
  const size_t item = dt__itemsize(dtype);
  dt__cu_enter(c);
  if (value == 0.0 && !signbit(value))
    return DT__CU(cudaMemsetAsync(dst, 0, (size_t)n * item, c->stream), "fill: cudaMemsetAsync");
  /* the element's bits, rounded by the host's own store */
  unsigned char bits[8] = {0};
  dt__store(bits, dtype, 0, value);
  if (item == 2) {
    uint16_t v;
    memcpy(&v, bits, 2);
    return dt__cu_launch(c, "fill kernel", dt_cu_fill_kernel<uint16_t>, n, (uint16_t*)dst, v, n);
  }
  if (item == 4) {
    uint32_t v;
    memcpy(&v, bits, 4);
    return dt__cu_launch(c, "fill kernel", dt_cu_fill_kernel<uint32_t>, n, (uint32_t*)dst, v, n);
  }
  uint64_t v;
  memcpy(&v, bits, 8);
  return dt__cu_launch(c, "fill kernel", dt_cu_fill_kernel<uint64_t>, n, (uint64_t*)dst, v, n);
}

/* H2D and D2H wait for the stream (the host buffer is done with when the call returns); D2D is
 * stream-ordered; H2H is a plain host copy. */
static dt_status_t dt__cu_copy(dt_backend_t b, void* dst, const void* src, size_t nbytes,
                               dt_copy_kind_t kind) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (nbytes == 0) return DT_SUCCESS;
  switch (kind) {
    case DT_COPY_H2H:
      if (dst != src) memmove(dst, src, nbytes);
      return DT_SUCCESS;
    case DT_COPY_D2D:
      if (dst == src) return DT_SUCCESS;
      dt__cu_enter(c);
      return DT__CU(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, c->stream),
                    "copy (device to device): cudaMemcpyAsync");
    case DT_COPY_H2D:
    case DT_COPY_D2H: {
      const int up = kind == DT_COPY_H2D;
      dt__cu_enter(c);
      DT_CHECK(DT__CU(cudaMemcpyAsync(dst, src, nbytes,
                                      up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                      c->stream),
                      up ? "copy (host to device): cudaMemcpyAsync"
                         : "copy (device to host): cudaMemcpyAsync"));
      return DT__CU(cudaStreamSynchronize(c->stream), up ? "copy (host to device): synchronize"
                                                         : "copy (device to host): synchronize");
    }
  }
  return DT_FAIL(DT_ERR_INTERNAL, "%s backend: copy kind %d", b->name, (int)kind);
}

static dt_status_t dt__cu_copy_ranges(dt_backend_t b, void* dst, const void* src, int n,
                                      const int64_t* dst_off, const int64_t* src_off,
                                      const int64_t* nbytes) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  dt__cu_enter(c);
  for (int i = 0; i < n; i++) {
    if (nbytes[i] <= 0) continue;
    DT_CHECK(DT__CU(cudaMemcpyAsync((char*)dst + dst_off[i], (const char*)src + src_off[i],
                                    (size_t)nbytes[i], cudaMemcpyDeviceToDevice, c->stream),
                    "copy_ranges: cudaMemcpyAsync"));
  }
  return DT_SUCCESS;
}

/* The box copy of dt__box_copy (src/placement/layout.c): dims of extent 1 are dropped and dims
 * contiguous in both arrays merged, so a box that is one contiguous run on both sides becomes a
 * cudaMemcpyAsync; other boxes run the box kernel with one thread per element (item sizes other
 * than 1, 2, 4 and 8 copy byte by byte through an extra innermost dim). */
static dt_status_t dt__cu_box_run(dt_cu_ctx_t* c, const char* what, int ndim, size_t item,
                                  const int64_t* ext, char* dst, const int64_t* dst_shape,
                                  const int64_t* dst_off, const char* src,
                                  const int64_t* src_shape, const int64_t* src_off) {
  if (ndim < 0 || ndim > DT_MAX_DIMS || item == 0)
    return DT_FAIL(DT_ERR_INTERNAL, "%s: %d dims of %zu-byte items", what, ndim, item);
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) total *= ext[d];
  if (total <= 0) return DT_SUCCESS;
  int64_t dstr[DT_MAX_DIMS], sstr[DT_MAX_DIMS], ds = 1, ss = 1, dbase = 0, sbase = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    dstr[d] = ds;
    sstr[d] = ss;
    ds *= dst_shape[d];
    ss *= src_shape[d];
  }
  dt_cu_box_t box;
  memset(&box, 0, sizeof box);
  for (int d = 0; d < ndim; d++) {
    dbase += dst_off[d] * dstr[d];
    sbase += src_off[d] * sstr[d];
    if (ext[d] == 1) continue;
    int k = box.ndim - 1;
    if (k >= 0 && box.dst_stride[k] == ext[d] * dstr[d] && box.src_stride[k] == ext[d] * sstr[d]) {
      box.ext[k] *= ext[d];
      box.dst_stride[k] = dstr[d];
      box.src_stride[k] = sstr[d];
    } else {
      box.ext[box.ndim] = ext[d];
      box.dst_stride[box.ndim] = dstr[d];
      box.src_stride[box.ndim++] = sstr[d];
    }
  }
  dst += dbase * (int64_t)item;
  src += sbase * (int64_t)item;
  if (box.ndim == 0 || (box.ndim == 1 && box.dst_stride[0] == 1 && box.src_stride[0] == 1))
    return DT__CU(cudaMemcpyAsync(dst, src, (size_t)total * item, cudaMemcpyDeviceToDevice,
                                  c->stream), what);
  switch (item) {
    case 1:
      return dt__cu_launch(c, what, dt_cu_box_kernel<uint8_t>, total, (uint8_t*)dst,
                           (const uint8_t*)src, box, total);
    case 2:
      return dt__cu_launch(c, what, dt_cu_box_kernel<uint16_t>, total, (uint16_t*)dst,
                           (const uint16_t*)src, box, total);
    case 4:
      return dt__cu_launch(c, what, dt_cu_box_kernel<uint32_t>, total, (uint32_t*)dst,
                           (const uint32_t*)src, box, total);
    case 8:
      return dt__cu_launch(c, what, dt_cu_box_kernel<uint64_t>, total, (uint64_t*)dst,
                           (const uint64_t*)src, box, total);
    default: /* strides in bytes and one more dim: the bytes of an item */
      for (int d = 0; d < box.ndim; d++) {
        box.dst_stride[d] *= (int64_t)item;
        box.src_stride[d] *= (int64_t)item;
      }
      box.ext[box.ndim] = (int64_t)item;
      box.dst_stride[box.ndim] = 1;
      box.src_stride[box.ndim++] = 1;
      total *= (int64_t)item;
      return dt__cu_launch(c, what, dt_cu_box_kernel<uint8_t>, total, (uint8_t*)dst,
                           (const uint8_t*)src, box, total);
  }
}

static dt_status_t dt__cu_box_copy(dt_backend_t b, int ndim, size_t item, const int64_t* ext,
                                   void* dst, const int64_t* dst_shape, const int64_t* dst_off,
                                   const void* src, const int64_t* src_shape,
                                   const int64_t* src_off) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  dt__cu_enter(c);
  return dt__cu_box_run(c, "box_copy", ndim, item, ext, (char*)dst, dst_shape, dst_off,
                        (const char*)src, src_shape, src_off);
}

/* dt__split_copy as one box copy per block: block q is the 3-D box (outer, lens[q], inner) at
 * offs[q] of the array seen as (outer, shape[dim], inner); in `packed` it starts after the
 * blocks before it. One launch (or memcpy) per non-empty block. */
static dt_status_t dt__cu_split_copy(dt_backend_t b, int ndim, size_t item, const int64_t* shape,
                                     int dim, int n, const int64_t* offs, const int64_t* lens,
                                     void* array, void* packed, int to_packed) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (dim < 0 || dim >= ndim)
    return DT_FAIL(DT_ERR_INTERNAL, "split_copy: dim %d of %d dims", dim, ndim);
  int64_t outer = 1, inner = 1, start = 0; /* start: elements of packed before block q */
  for (int d = 0; d < dim; d++) outer *= shape[d];
  for (int d = dim + 1; d < ndim; d++) inner *= shape[d];
  dt__cu_enter(c);
  for (int q = 0; q < n; q++) {
    const int64_t arr_shape[3] = {outer, shape[dim], inner}, arr_off[3] = {0, offs[q], 0};
    const int64_t blk_shape[3] = {outer, lens[q], inner}, zero[3] = {0, 0, 0};
    char* blk = (char*)packed + start * (int64_t)item;
    if (to_packed)
      DT_CHECK(dt__cu_box_run(c, "split_copy", 3, item, blk_shape, blk, blk_shape, zero,
                              (const char*)array, arr_shape, arr_off));
    else
      DT_CHECK(dt__cu_box_run(c, "split_copy", 3, item, blk_shape, (char*)array, arr_shape,
                              arr_off, blk, blk_shape, zero));
    start += outer * lens[q] * inner;
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * element-wise compute */

static dt_status_t dt__cu_scale_div(dt_backend_t b, void* buf, dt_dtype_t dtype, int64_t n,
                                    int div) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (n <= 0 || div == 1) return DT_SUCCESS;
  dt__cu_enter(c);
  switch (dtype) {
    case DT_F32:
      return dt__cu_launch(c, "scale_div kernel", dt_cu_div_f32_kernel, n, (float*)buf, n,
                           (float)div);
    case DT_BF16:
    case DT_F16:
      return dt__cu_launch(c, "scale_div kernel", dt_cu_div_half_kernel, n, buf, (int)dtype, n,
                           div);
    case DT_I32:
    case DT_I64:
      if (div == 0) return DT_FAIL(DT_ERR_INVALID_ARG, "scale_div: integer division by zero");
      if (dtype == DT_I32)
        return dt__cu_launch(c, "scale_div kernel", dt_cu_div_int_kernel<int32_t>, n,
                             (int32_t*)buf, n, (int32_t)div);
      return dt__cu_launch(c, "scale_div kernel", dt_cu_div_int_kernel<int64_t>, n, (int64_t*)buf,
                           n, (int64_t)div);
    default: break;
  }
  return DT_FAIL(DT_ERR_INTERNAL, "scale_div: dtype %d", (int)dtype);
}

static dt_status_t dt__cu_convert(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                                  dt_dtype_t to, int64_t n) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (n <= 0) return DT_SUCCESS;
  if (!dt__dtype_valid(from) || !dt__dtype_valid(to))
    return DT_FAIL(DT_ERR_INTERNAL, "convert: dtypes %d -> %d", (int)from, (int)to);
  dt__cu_enter(c);
  if (from == to) {
    if (dst == src) return DT_SUCCESS;
    return DT__CU(cudaMemcpyAsync(dst, src, (size_t)n * dt__itemsize(from),
                                  cudaMemcpyDeviceToDevice, c->stream),
                  "convert: cudaMemcpyAsync");
  }
  return dt__cu_launch(c, "convert kernel", dt_cu_convert_kernel, n, src, (int)from, dst, (int)to,
                       n);
}

static dt_status_t dt__cu_reduce(dt_backend_t b, void* dst, const void* a, const void* src,
                                 dt_dtype_t dtype, int64_t n, dt_reduce_op_t op) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN)
    return DT_FAIL(DT_ERR_INTERNAL, "local reduction with op %d", (int)op);
  if (n <= 0) return DT_SUCCESS;
  dt__cu_enter(c);
  switch (dtype) {
    case DT_F32:
      return dt__cu_launch(c, "reduce kernel", dt_cu_reduce_f32_kernel, n, (float*)dst,
                           (const float*)a, (const float*)src, n, (int)op);
    case DT_I32:
      return dt__cu_launch(c, "reduce kernel", dt_cu_reduce_int_kernel<int32_t, uint32_t>, n,
                           (int32_t*)dst, (const int32_t*)a, (const int32_t*)src, n, (int)op);
    case DT_I64:
      return dt__cu_launch(c, "reduce kernel", dt_cu_reduce_int_kernel<int64_t, uint64_t>, n,
                           (int64_t*)dst, (const int64_t*)a, (const int64_t*)src, n, (int)op);
    case DT_BF16:
    case DT_F16:
      return dt__cu_launch(c, "reduce kernel", dt_cu_reduce_half_kernel, n, dst, a, src,
                           (int)dtype, n, (int)op);
    default: break;
  }
  return DT_FAIL(DT_ERR_INTERNAL, "reduce: dtype %d", (int)dtype);
}

/* ---------------------------------------------------------------------------------------------
 * GEMM */

/* The checks both builds share: dtypes and sizes; *nothing = 1 when there is nothing to do. */
static dt_status_t dt__cu_gemm_check(const dt_gemm_t* g, int* nothing) {
  *nothing = 0;
  const int half = g->ab_dtype == DT_BF16 || g->ab_dtype == DT_F16;
  if ((g->ab_dtype != DT_F32 && !half) || (g->c_dtype != DT_F32 && g->c_dtype != g->ab_dtype))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "GEMM of %s operands into %s (operands f32, bf16 or f16; "
                   "C f32 or the operands' dtype)", dt_dtype_name(g->ab_dtype),
                   dt_dtype_name(g->c_dtype));
  if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "GEMM sizes m %lld, n %lld, k %lld, batch %lld",
                   (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch);
  *nothing = g->m == 0 || g->n == 0 || g->batch == 0;
  return DT_SUCCESS;
}

#ifdef DT_SIMT_EMULATE

/* Emulation: the memory is host memory, so the host GEMM (OpenBLAS in f32) serves. */
static dt_status_t dt__cu_gemm(dt_backend_t b, const dt_gemm_t* g) {
  int nothing;
  DT_CHECK(dt__cu_gemm_check(g, &nothing));
  return nothing ? DT_SUCCESS : dt__host_gemm(b, g);
}

#else

/* Row-major C = alpha op(A) op(B) + beta C is, read column-major, C^T = op(B)^T op(A)^T: cuBLASLt
 * multiplies our B (its A) by our A (its B) into C^T (n x m, leading dimension ldc). A row-major
 * array of r x c with row stride ld is a column-major c x r array with the same ld, so the
 * transposes carry over unchanged. The bias (n values, one per row-major column) is then one
 * value per row of C^T: cuBLASLt's bias epilogue. */

static cudaDataType_t dt__cu_data_type(dt_dtype_t d) {
  return d == DT_F32 ? CUDA_R_32F : d == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* The alignment cuBLASLt may assume for an operand: the largest power of two up to 256 that
 * divides its address and, for batches, its batch stride in bytes. */
static uint32_t dt__cu_align(const void* p, int64_t stride_bytes, int64_t batch) {
  uint64_t v = (uint64_t)(uintptr_t)p | 256u;
  if (batch > 1) v |= (uint64_t)stride_bytes;
  return (uint32_t)(v & (~v + 1));
}

static dt_status_t dt__cu_lt_fail(cublasStatus_t s, const char* call, const dt_gemm_t* g) {
  return DT_FAIL(DT_ERR_CUBLAS, "GEMM (m %lld, n %lld, k %lld, batch %lld, %s x %s -> %s): %s: "
                 "%s: %s", (long long)g->m, (long long)g->n, (long long)g->k,
                 (long long)g->batch, dt_dtype_name(g->ab_dtype), dt_dtype_name(g->ab_dtype),
                 dt_dtype_name(g->c_dtype), call, cublasLtGetStatusName(s),
                 cublasLtGetStatusString(s));
}

#define DT__LT(call)                                    \
  do {                                                  \
    cublasStatus_t dt_lt_s_ = (call);                   \
    if (dt_lt_s_ != CUBLAS_STATUS_SUCCESS) {            \
      st = dt__cu_lt_fail(dt_lt_s_, #call, g);          \
      goto fail;                                        \
    }                                                   \
  } while (0)

static void dt__cu_plan_destroy(dt_cu_gemm_plan_t* p) {
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  memset(p, 0, sizeof *p);
}

/* A column-major layout of rows x cols (leading dimension ld) with `batch` matrices `stride`
 * elements apart. */
static cublasStatus_t dt__cu_layout(cublasLtMatrixLayout_t* out, cudaDataType_t t, int64_t rows,
                                    int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  cublasStatus_t s = cublasLtMatrixLayoutCreate(out, t, (uint64_t)rows, (uint64_t)cols, ld);
  if (s != CUBLAS_STATUS_SUCCESS || batch <= 1) return s;
  int32_t count = (int32_t)batch;
  s = cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                       sizeof count);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                          &stride, sizeof stride);
}

/* Builds the descriptors of key k into p and asks the heuristic for the best algorithm. */
static dt_status_t dt__cu_plan_build(dt_cu_ctx_t* c, const dt_gemm_t* g,
                                     const dt_cu_gemm_key_t* k, dt_cu_gemm_plan_t* p) {
  dt_status_t st = DT_SUCCESS;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  const cudaDataType_t ab = dt__cu_data_type(g->ab_dtype), ct = dt__cu_data_type(g->c_dtype);
  const cublasComputeType_t compute = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_a = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A: our B */
  const cublasOperation_t op_b = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's B: our A */
  const uint32_t align_c = k->align_c;
  memset(p, 0, sizeof *p);
  memset(&res, 0, sizeof res);
  DT__LT(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F));
  DT__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  DT__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (g->bias != NULL) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DT__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    /* the heuristic reads the pointer's alignment; every call sets its own pointer */
    DT__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                          sizeof g->bias));
  }
  /* stored arrays, column-major: our B is (trans_b ? k x n : n x k) there, our A (trans_a ?
   * m x k : k x m), C n x m */
  DT__LT(dt__cu_layout(&p->la, ab, g->trans_b ? g->k : g->n, g->trans_b ? g->n : g->k, g->ldb,
                       g->stride_b, g->batch));
  DT__LT(dt__cu_layout(&p->lb, ab, g->trans_a ? g->m : g->k, g->trans_a ? g->k : g->m, g->lda,
                       g->stride_a, g->batch));
  DT__LT(dt__cu_layout(&p->lc, ct, g->n, g->m, g->ldc, g->stride_c, g->batch));
  DT__LT(cublasLtMatmulPreferenceCreate(&pref));
  DT__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &k->workspace, sizeof k->workspace));
  DT__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &k->align_b, sizeof k->align_b));
  DT__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &k->align_a, sizeof k->align_a));
  DT__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &align_c, sizeof align_c));
  DT__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &align_c, sizeof align_c));
  if (g->c_dtype != DT_F32) {
    /* split-K's partial products summed in f32 (the compute type) only: by default cuBLASLt may
     * add them in a bf16/f16 output's own type (in place or in the workspace), rounding each
     * before the sum (seen on an H200: a 6 x 40 x 4 bf16 product 4 ulps from the f32 result
     * rounded once, which the host and PyTorch's fixtures give) */
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    DT__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                &schemes, sizeof schemes));
  }
  DT__LT(cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res,
                                        &found));
  if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
    st = dt__cu_lt_fail(found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : res.state,
                        "cublasLtMatmulAlgoGetHeuristic found no algorithm", g);
    goto fail;
  }
  p->algo = res.algo;
  p->key = *k;
  p->used = 1;
  cublasLtMatmulPreferenceDestroy(pref);
  return DT_SUCCESS;
fail:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  dt__cu_plan_destroy(p);
  return st;
}

/* The plan of key k: a cached one, or a new one in a free probe slot (else in the key's home
 * slot, evicting what was there). gemm_mu held. */
static dt_status_t dt__cu_plan_get(dt_cu_ctx_t* c, const dt_gemm_t* g, const dt_cu_gemm_key_t* k,
                                   dt_cu_gemm_plan_t** out) {
  const uint64_t h = dt__hash_bytes(k, sizeof *k);
  dt_cu_gemm_plan_t* slot = NULL;
  for (int i = 0; i < DT_CU_GEMM_PROBE; i++) {
    dt_cu_gemm_plan_t* p = &c->plans[(h + (uint64_t)i) % DT_CU_GEMM_SLOTS];
    if (p->used && memcmp(&p->key, k, sizeof *k) == 0) {
      *out = p;
      return DT_SUCCESS;
    }
    if (!p->used && slot == NULL) slot = p;
  }
  if (slot == NULL) {
    slot = &c->plans[h % DT_CU_GEMM_SLOTS];
    dt__cu_plan_destroy(slot);
  }
  DT_CHECK(dt__cu_plan_build(c, g, k, slot));
  *out = slot;
  return DT_SUCCESS;
}

/* The handle (re-created after a release) and the workspace (tried once; without it cuBLASLt
 * picks algorithms that need none). gemm_mu held. */
static dt_status_t dt__cu_lt_ready(dt_cu_ctx_t* c) {
  if (c->lt == NULL) {
    DT_CHECK(dt__lt_load());
    cublasStatus_t s = cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
      c->lt = NULL;
      return DT_FAIL(DT_ERR_CUBLAS, "%s backend: cublasLtCreate: %s: %s", c->b.name,
                     cublasLtGetStatusName(s), cublasLtGetStatusString(s));
    }
  }
  if (!c->workspace_tried) {
    c->workspace_tried = 1;
    if (cudaMalloc(&c->workspace, DT_CU_WORKSPACE) == cudaSuccess) {
      c->workspace_nbytes = DT_CU_WORKSPACE;
    } else {
      (void)cudaGetLastError();
      c->workspace = NULL;
      dt__log("cuda", "%s backend: no memory for the %zu-byte cuBLASLt workspace; GEMMs use "
              "algorithms without one", c->b.name, (size_t)DT_CU_WORKSPACE);
    }
  }
  return DT_SUCCESS;
}

static dt_status_t dt__cu_gemm(dt_backend_t b, const dt_gemm_t* g) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  dt_status_t st = DT_SUCCESS;
  int nothing;
  DT_CHECK(dt__cu_gemm_check(g, &nothing));
  if (nothing) return DT_SUCCESS;
  dt__cu_enter(c);
  if (g->k == 0) {
    const int64_t total = g->batch * g->m * g->n;
    return dt__cu_launch(c, "GEMM (k = 0) kernel", dt_cu_gemm_k0_kernel, total, g->c,
                         (int)g->c_dtype, g->m, g->n, g->ldc, g->stride_c, total, g->beta,
                         g->bias);
  }
  if (g->batch > INT32_MAX)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "GEMM batch of %lld (cuBLASLt takes at most %d)",
                   (long long)g->batch, INT32_MAX);
  const size_t ab = dt__itemsize(g->ab_dtype), cb = dt__itemsize(g->c_dtype);
  dt_cu_gemm_key_t k;
  memset(&k, 0, sizeof k);
  k.trans_a = g->trans_a != 0;
  k.trans_b = g->trans_b != 0;
  k.ab_dtype = (int32_t)g->ab_dtype;
  k.c_dtype = (int32_t)g->c_dtype;
  k.has_bias = g->bias != NULL;
  k.tf32 = g->ab_dtype == DT_F32 && b->allow_tf32;
  k.align_a = dt__cu_align(g->a, g->stride_a * (int64_t)ab, g->batch);
  k.align_b = dt__cu_align(g->b, g->stride_b * (int64_t)ab, g->batch);
  k.align_c = dt__cu_align(g->c, g->stride_c * (int64_t)cb, g->batch);
  k.align_bias = g->bias != NULL ? dt__cu_align(g->bias, 0, 1) : 0;
  k.m = g->m;
  k.n = g->n;
  k.k = g->k;
  k.batch = g->batch;
  k.lda = g->lda;
  k.ldb = g->ldb;
  k.ldc = g->ldc;
  if (g->batch > 1) {
    k.stride_a = g->stride_a;
    k.stride_b = g->stride_b;
    k.stride_c = g->stride_c;
  }
  pthread_mutex_lock(&c->gemm_mu);
  dt_cu_gemm_plan_t* p = NULL;
  DT_CHECK_GOTO(dt__cu_lt_ready(c), st, done);
  k.workspace = c->workspace_nbytes;
  DT_CHECK_GOTO(dt__cu_plan_get(c, g, &k, &p), st, done);
  if (g->bias != NULL) {
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &g->bias, sizeof g->bias);
    if (s != CUBLAS_STATUS_SUCCESS) {
      st = dt__cu_lt_fail(s, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", g);
      goto done;
    }
  }
  {
    cublasStatus_t s = cublasLtMatmul(c->lt, p->op, &g->alpha, g->b, p->la, g->a, p->lb, &g->beta,
                                      g->c, p->lc, g->c, p->lc, &p->algo, c->workspace,
                                      c->workspace_nbytes, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS) st = dt__cu_lt_fail(s, "cublasLtMatmul", g);
  }
done:
  pthread_mutex_unlock(&c->gemm_mu);
  return st;
}

#endif /* DT_SIMT_EMULATE */

/* ---------------------------------------------------------------------------------------------
 * ordering: synchronization and events (a pool of timing-free events) */

static dt_status_t dt__cu_synchronize(dt_backend_t b) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  dt__cu_enter(c);
  return DT__CU(cudaStreamSynchronize(c->stream), "synchronize: cudaStreamSynchronize");
}

static dt_status_t dt__cu_event_record(dt_backend_t b, void** ev) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  cudaEvent_t e = NULL;
  *ev = NULL;
  dt__cu_enter(c);
  pthread_mutex_lock(&c->mu);
  if (c->n_events > 0) e = c->events[--c->n_events];
  pthread_mutex_unlock(&c->mu);
  if (e == NULL)
    DT_CHECK(DT__CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                    "event_record: cudaEventCreateWithFlags"));
  cudaError_t err = cudaEventRecord(e, c->stream);
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(e);
    return DT__CU(err, "event_record: cudaEventRecord");
  }
  *ev = (void*)e;
  return DT_SUCCESS;
}

static dt_status_t dt__cu_event_wait(dt_backend_t b, void* ev) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  dt__cu_enter(c);
  return DT__CU(cudaStreamWaitEvent(c->stream, (cudaEvent_t)ev, 0),
                "event_wait: cudaStreamWaitEvent");
}

static dt_status_t dt__cu_event_query(dt_backend_t b, void* ev, int* done) {
  dt__cu_enter(dt__cu_ctx(b));
  cudaError_t err = cudaEventQuery((cudaEvent_t)ev);
  *done = err == cudaSuccess;
  if (err == cudaSuccess || err == cudaErrorNotReady) return DT_SUCCESS;
  return DT__CU(err, "event_query: cudaEventQuery");
}

static dt_status_t dt__cu_event_sync(dt_backend_t b, void* ev) {
  dt__cu_enter(dt__cu_ctx(b));
  return DT__CU(cudaEventSynchronize((cudaEvent_t)ev), "event_sync: cudaEventSynchronize");
}

/* Back to the pool: re-recording an event whose record is still pending is safe in CUDA
 * (waits already issued keep the point they captured). */
static void dt__cu_event_free(dt_backend_t b, void* ev) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  if (ev == NULL) return;
  pthread_mutex_lock(&c->mu);
  int kept = c->n_events < DT_CU_EVENT_POOL;
  if (kept) c->events[c->n_events++] = (cudaEvent_t)ev;
  pthread_mutex_unlock(&c->mu);
  if (!kept) {
    dt__cu_enter(c);
    (void)cudaEventDestroy((cudaEvent_t)ev);
  }
}

/* ---------------------------------------------------------------------------------------------
 * host staging, release */

static void* dt__cu_host_alloc(dt_backend_t b, size_t nbytes) {
  void* p = NULL;
  dt__cu_enter(dt__cu_ctx(b));
  if (cudaMallocHost(&p, nbytes ? nbytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

static void dt__cu_host_free(dt_backend_t b, void* p, size_t nbytes) {
  (void)nbytes;
  if (p == NULL) return;
  dt__cu_enter(dt__cu_ctx(b));
  (void)cudaFreeHost(p);
}

/* Frees the cache, the idle events and (real build) the cuBLASLt handle, workspace and plans.
 * The stream stays; blocks freed from now on go straight back to CUDA until the next alloc. */
static void dt__cu_release(dt_backend_t b) {
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  dt__cu_enter(c);
  (void)cudaStreamSynchronize(c->stream);
  pthread_mutex_lock(&c->mu);
  if (dt__debug_mask() != 0)
    dt__log("cuda", "%s allocator at release: %lld bytes live, %lld cached, peak %lld, %lld "
            "cudaMalloc calls, %lld cache hits", c->b.name, (long long)c->live,
            (long long)c->cached, (long long)c->peak, (long long)c->mallocs, (long long)c->hits);
  dt__cu_trim_locked(c);
  while (c->spare != NULL) {
    dt_cu_block_t* blk = c->spare;
    c->spare = blk->next;
    dt__free(blk);
  }
  while (c->n_events > 0) (void)cudaEventDestroy(c->events[--c->n_events]);
  c->released = 1;
  pthread_mutex_unlock(&c->mu);
#ifndef DT_SIMT_EMULATE
  pthread_mutex_lock(&c->gemm_mu);
  for (int i = 0; i < DT_CU_GEMM_SLOTS; i++)
    if (c->plans[i].used) dt__cu_plan_destroy(&c->plans[i]);
  if (c->lt != NULL) cublasLtDestroy(c->lt);
  c->lt = NULL;
  if (c->workspace != NULL) (void)cudaFree(c->workspace);
  c->workspace = NULL;
  c->workspace_nbytes = 0;
  c->workspace_tried = 0;
  pthread_mutex_unlock(&c->gemm_mu);
#endif
  (void)cudaGetLastError();
}

static const struct dt_backend_i dt__cu_iface = {
    .alloc = dt__cu_alloc,
    .free = dt__cu_free,
    .memset = dt__cu_memset,
    .fill = dt__cu_fill,
    .copy = dt__cu_copy,
    .copy_ranges = dt__cu_copy_ranges,
    .box_copy = dt__cu_box_copy,
    .split_copy = dt__cu_split_copy,
    .scale_div = dt__cu_scale_div,
    .convert = dt__cu_convert,
    .reduce = dt__cu_reduce,
    .gemm = dt__cu_gemm,
    .run_kernel = dt__backend_run_kernel,
    .synchronize = dt__cu_synchronize,
    .event_record = dt__cu_event_record,
    .event_wait = dt__cu_event_wait,
    .event_query = dt__cu_event_query,
    .event_sync = dt__cu_event_sync,
    .event_free = dt__cu_event_free,
    .host_alloc = dt__cu_host_alloc,
    .host_free = dt__cu_host_free,
    .release = dt__cu_release,
    .verify = NULL,
};

extern "C" dt_status_t DT_CUDA_NAME(allocator_stats)(dt_backend_t b, int64_t* live,
                                                     int64_t* cached, int64_t* peak,
                                                     int64_t* mallocs) {
  if (b == NULL || b->iface != &dt__cu_iface)
    return DT_FAIL(DT_ERR_INVALID_ARG, "backend %s is not a %s backend",
                   b ? b->name : "NULL", DT_CU_KIND);
  dt_cu_ctx_t* c = dt__cu_ctx(b);
  pthread_mutex_lock(&c->mu);
  if (live) *live = c->live;
  if (cached) *cached = c->cached;
  if (peak) *peak = c->peak;
  if (mallocs) *mallocs = c->mallocs;
  pthread_mutex_unlock(&c->mu);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * opening */

static pthread_mutex_t dt__cu_open_mu = PTHREAD_MUTEX_INITIALIZER;

/* A whole decimal integer (optional sign, nothing else): 1 and *out, else 0. */
static int dt__cu_parse_int(const char* s, long long* out) {
  if (s == NULL || !((*s >= '0' && *s <= '9') || *s == '-' || *s == '+')) return 0;
  char* end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || !(end[-1] >= '0' && end[-1] <= '9')) return 0;
  *out = v;
  return 1;
}

/* The allocator cap from $DTENSOR_CUDA_MAX_MB (read once per build). */
static int64_t dt__cu_cap_bytes(void) {
  static int done = 0;
  static int64_t cap = 0;
  if (done) return cap;
  done = 1;
  const char* e = getenv("DTENSOR_CUDA_MAX_MB");
  long long mb = 0;
  if (e == NULL || *e == '\0') return cap;
  if (dt__cu_parse_int(e, &mb) && mb >= 0 && mb <= (INT64_MAX >> 20))
    cap = (int64_t)mb << 20;
  else
    dt__log("cuda", "ignoring DTENSOR_CUDA_MAX_MB=%s: expected a whole number of MiB (0: no cap)",
            e);
  return cap;
}

/* Creates and registers the backend of device `ordinal`. */
static dt_status_t dt__cu_create(int ordinal, const char* name, int kernel_set,
                                 dt_cu_ctx_t** out) {
  dt_status_t st = DT_SUCCESS;
  *out = NULL;
  dt_cu_ctx_t* c = (dt_cu_ctx_t*)dt__calloc(1, sizeof *c);
  if (c == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s backend: its state", name);
  pthread_mutex_init(&c->mu, NULL);
#ifndef DT_SIMT_EMULATE
  pthread_mutex_init(&c->gemm_mu, NULL);
#endif
  snprintf(c->name, sizeof c->name, "%s", name);
  DT_CHECK_GOTO(DT__CU(cudaSetDevice(ordinal), "opening the CUDA backend: cudaSetDevice"), st,
                fail);
  DT_CHECK_GOTO(DT__CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                       "opening the CUDA backend: cudaStreamCreateWithFlags"), st, fail);
  /* the cuBLASLt handle is made by the first GEMM (dt__cu_lt_ready), which loads the library */
  DT_CHECK_GOTO(DT__CU(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount,
                                              ordinal),
                       "opening the CUDA backend: cudaDeviceGetAttribute"), st, fail);
  if (c->sm_count < 1) c->sm_count = 1;
  c->cap = dt__cu_cap_bytes();
  c->b.iface = &dt__cu_iface;
  c->b.context = c;
  c->b.api_version = DT_BACKEND_API_VERSION;
  c->b.name = c->name;
  c->b.device = DT_DEVICE_CUDA;
  c->b.ordinal = ordinal;
  c->b.kernel_set = kernel_set;
  c->b.pooled = 0; /* the storage pool is for host memory; the allocator caches itself */
  /* the cost model's price of host staging, per copy (dt_mesh_set_cost_model's comment): a
   * synchronized copy between device and page-locked host memory over PCIe; the emulator's copies
   * are memcpy (this machine's single-thread rate) */
#ifdef DT_SIMT_EMULATE
  c->b.stage_us = 1.0;
  c->b.stage_gbps = 7.0;
#else
  c->b.stage_us = 10.0;
  c->b.stage_gbps = 25.0;
#endif
  DT_CHECK_GOTO(dt__backend_register(&c->b), st, fail);
  *out = c;
  return DT_SUCCESS;
fail:
#ifndef DT_SIMT_EMULATE
  if (c->lt != NULL) cublasLtDestroy(c->lt);
  pthread_mutex_destroy(&c->gemm_mu);
#endif
  if (c->stream != NULL) (void)cudaStreamDestroy(c->stream);
  pthread_mutex_destroy(&c->mu);
  dt__free(c);
  return st;
}

#ifdef DT_SIMT_EMULATE

static dt_cu_ctx_t* dt__cu_emu = NULL;

extern "C" dt_status_t dt__backend_cuda_emu_open(dt_backend_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_status_t st = DT_SUCCESS;
  pthread_mutex_lock(&dt__cu_open_mu);
  if (dt__cu_emu == NULL) st = dt__cu_create(0, "cuda-emu", DT_KERNELS_CUDA_EMU, &dt__cu_emu);
  if (st == DT_SUCCESS) *out = &dt__cu_emu->b;
  pthread_mutex_unlock(&dt__cu_open_mu);
  return st;
}

#else

static dt_cu_ctx_t* dt__cu_devs[DT_CU_MAX_DEVICES];

/* This rank's device among `count`: $DTENSOR_CUDA_DEVICE, else the local rank (the first of the
 * launchers' variables that is set) modulo the count, else 0. 0 on success, else -1 with the
 * reason in why (no message is recorded: an explicit ordinal does not need the default). */
static int dt__cu_default_ordinal(int count, int* out, char* why, size_t why_n) {
  static const char* const local_rank_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                                "SLURM_LOCALID", "LOCAL_RANK"};
  long long v = 0;
  const char* e = getenv("DTENSOR_CUDA_DEVICE");
  *out = 0;
  if (e != NULL && *e != '\0') {
    if (!dt__cu_parse_int(e, &v) || v < 0 || v >= count) {
      snprintf(why, why_n, "DTENSOR_CUDA_DEVICE=%s is not a device ordinal: this machine has %d "
               "CUDA device(s) (ordinals 0 to %d)", e, count, count - 1);
      return -1;
    }
    *out = (int)v;
    return 0;
  }
  for (size_t i = 0; i < sizeof local_rank_vars / sizeof local_rank_vars[0]; i++) {
    e = getenv(local_rank_vars[i]);
    if (e != NULL && dt__cu_parse_int(e, &v) && v >= 0) {
      *out = (int)(v % count);
      return 0;
    }
  }
  return 0;
}

extern "C" dt_status_t dt__backend_cuda_open(int ordinal, dt_backend_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_status_t st = DT_SUCCESS;
  char why[256] = "";
  int count = 0, def = 0, def_ok;
  pthread_mutex_lock(&dt__cu_open_mu);
  cudaError_t e = cudaGetDeviceCount(&count); /* count stays unwritten without a driver */
  if (e != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    st = DT_FAIL(DT_ERR_CUDA, "no usable CUDA device (cudaGetDeviceCount: %s: %s); the CPU "
                 "backends (cpu, guarded) are unaffected",
                 e != cudaSuccess ? cudaGetErrorName(e) : "0 devices",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    goto done;
  }
  def_ok = dt__cu_default_ordinal(count, &def, why, sizeof why) == 0;
  if (ordinal < 0) {
    if (!def_ok) {
      st = DT_FAIL(DT_ERR_INVALID_ARG, "backend 'cuda': %s", why);
      goto done;
    }
    ordinal = def;
  } else if (ordinal >= count) {
    st = DT_FAIL(DT_ERR_INVALID_ARG, "backend 'cuda:%d': no such device: this machine has %d CUDA "
                 "device(s) (ordinals 0 to %d)", ordinal, count, count - 1);
    goto done;
  }
  if (ordinal >= DT_CU_MAX_DEVICES) {
    st = DT_FAIL(DT_ERR_UNSUPPORTED, "backend 'cuda:%d': at most %d CUDA devices per process",
                 ordinal, DT_CU_MAX_DEVICES);
    goto done;
  }
  if (dt__cu_devs[ordinal] == NULL) {
    /* "cuda" is this rank's device (named the same however it was opened), "cuda:N" another */
    char name[24];
    if (def_ok && ordinal == def) snprintf(name, sizeof name, "cuda");
    else snprintf(name, sizeof name, "cuda:%d", ordinal);
    st = dt__cu_create(ordinal, name, DT_KERNELS_CUDA, &dt__cu_devs[ordinal]);
    if (st != DT_SUCCESS) goto done;
  }
  *out = &dt__cu_devs[ordinal]->b;
done:
  pthread_mutex_unlock(&dt__cu_open_mu);
  return st;
}

#endif /* DT_SIMT_EMULATE */

/* simt.h - the first include of every CUDA kernel file (the .cu files of src/ops/cuda): one kernel
 * source that nvcc compiles to real CUDA and g++ compiles for the CPU SIMT emulator.
 *
 * Kernel code is plain CUDA. Under nvcc (__CUDACC__) this header includes the CUDA headers and
 * adds the two helpers below; compiled as C++17 with -DDT_SIMT_EMULATE (no CUDA headers at all)
 * it defines CUDA's names itself on top of the emulator in src/backend/simt_emu.cpp, which runs
 * a launch block by block with every thread a cooperative fiber (see simt_emu.h).
 *
 * Both modes provide:
 *   dt_simt_launch(kernel, grid, block, smem_bytes, stream, args...)
 *       kernel<<<grid, block, smem_bytes, stream>>>(args...); 0 on success or the error code
 *       (a cudaError_t value; the emulator uses the same numbers). The emulator runs the launch
 *       to completion before it returns; under nvcc the launch is asynchronous as usual.
 *   dt_simt_strerror(rc)       the text of a non-zero result.
 *   DT_SIMT_DYN_SHARED(T, name) declares `T* name`, the block's dynamic shared memory (once per
 *       kernel; like CUDA's extern __shared__ arrays, every such pointer has the same address).
 *
 * What kernel writers must know about the emulation:
 * - __shared__ variables are function-static (blocks run one at a time on one OS thread), so
 *   they start as zeros in the first block and keep what the previous block (or launch) left.
 *   Only the dynamic shared memory is filled with 0xFF bytes before every block, so that a
 *   kernel reading it before writing it sees NaN / -1 instead of a plausible value: where that
 *   check matters, use DT_SIMT_DYN_SHARED. (Poisoning static __shared__ through a linker
 *   section does not work with g++: it ignores section attributes on statics of templates and
 *   rejects them in inline functions next to others.) `extern __shared__` does not compile:
 *   use DT_SIMT_DYN_SHARED. A __shared__ variable takes no initializer (CUDA forbids it too).
 * - A thread runs until its next barrier, warp operation, failed atomicCAS or return; nothing
 *   preempts it. A thread spinning on memory written by another thread (a flag, a volatile
 *   load) or by another block therefore spins forever.
 * - Checks are stricter than hardware: a warp operation whose mask names an exited lane, two
 *   warp operations or masks that do not match, and threads waiting at two different
 *   __syncthreads call sites end the launch with an error (see simt_emu.cpp).
 * - Tensor cores only through nvcuda::wmma's 16 x 16 x 16 bf16/f16 shape (below; no mma PTX),
 *   no cooperative groups, no __half arithmetic operators or
 *   implicit __half <-> float conversions (use the conversion functions), no __half2 /
 *   __nv_bfloat162, no texture or __constant__ copies (cudaMemcpyToSymbol); __CUDA_ARCH__ is
 *   not defined. The fast-math intrinsics (__expf, __sinf, ...) are computed exactly; GPU
 *   results differ in the last bits (and nvcc contracts a * b + c into fma), so compare with
 *   tolerances that cover the GPU's documented error.
 * - Every thread has a 64 KiB stack (DTENSOR_SIMT_STACK_KB changes it, read once per process)
 *   with an inaccessible guard region below it: a kernel with large local arrays or deep
 *   recursion that overflows it dies with SIGSEGV at the faulting access (gdb shows the kernel
 *   frame); it never corrupts a neighbour's stack silently unless one frame is larger than the
 *   64 KiB guard.
 * - assert() in a kernel aborts the process (on a GPU it fails the launch); a C++ exception
 *   that leaves a kernel fails the launch.
 */
#ifndef DT_BACKEND_SIMT_H
#define DT_BACKEND_SIMT_H

#include <stddef.h>
#include <stdint.h>

#include <utility>

#if defined(DT_SIMT_EMULATE) && defined(__CUDACC__)
#error "simt.h: DT_SIMT_EMULATE is for a host C++ compiler, not nvcc"

/* ============================================================================================
 * nvcc: real CUDA. */
#elif defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h> /* nvcuda::wmma */

/* A char array cast to T, so kernels with different element types can share the name; 128-byte
 * aligned (wmma's operands need 32). */
#define DT_SIMT_DYN_SHARED(T, name)                                   \
  extern __shared__ __align__(128) unsigned char dt_simt_dyn_smem_[]; \
  T* name = reinterpret_cast<T*>(dt_simt_dyn_smem_)

template <typename... P, typename... A>
inline int dt_simt_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, A&&... args) {
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<A>(args)...);
  return (int)cudaGetLastError();
}

inline const char* dt_simt_strerror(int rc) { return cudaGetErrorString((cudaError_t)rc); }

/* ============================================================================================
 * Emulation on the CPU. */
#elif defined(DT_SIMT_EMULATE)

#include <limits.h>
#include <math.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory> /* before the __noinline__ macro: libstdc++ spells __attribute__((__noinline__)) */
#include <stdexcept>
#include <tuple>
#include <type_traits>

#include "backend/simt_emu.h"

/* ---------------------------------------------------------------------------------------------
 * Qualifiers. */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Function-static storage is block-shared memory because blocks run one at a time. */
#define __shared__ static
#define DT_SIMT_DYN_SHARED(T, name) T* name = reinterpret_cast<T*>(dt_simt_dyn_smem())

/* ---------------------------------------------------------------------------------------------
 * Types and built-in variables. */
typedef dt_simt_uint3 uint3;
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
typedef struct dt_simt_stream* cudaStream_t; /* ignored: every launch is synchronous */

#define DT_SIMT_VEC(T, N, A)                                \
  struct __attribute__((aligned(A))) N##2 {                 \
    T x, y;                                                 \
  };                                                        \
  struct __attribute__((aligned(16))) N##4 {                \
    T x, y, z, w;                                           \
  };                                                        \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; } \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
DT_SIMT_VEC(float, float, 8)
DT_SIMT_VEC(int, int, 8)
DT_SIMT_VEC(unsigned, uint, 8)
#undef DT_SIMT_VEC

/* Read through the emulator's pointers, which it points at the running thread and block. */
#define threadIdx (*dt_simt_thread_idx)
#define blockIdx (*dt_simt_block_idx)
#define blockDim (*dt_simt_block_dim)
#define gridDim (*dt_simt_grid_dim)
constexpr int warpSize = 32;

/* ---------------------------------------------------------------------------------------------
 * Barriers and warp operations. The defaulted site arguments name the caller in error
 * messages (kernel code never passes them). */
#define DT_SIMT_SITE                                                \
  const char *file = __builtin_FILE(), int line = __builtin_LINE(), \
             const char *func = __builtin_FUNCTION()

inline void __syncthreads(DT_SIMT_SITE) {
  dt_simt_block_sync(DT_SIMT_OP_SYNCTHREADS, 0, file, line, func);
}
inline int __syncthreads_count(int pred, DT_SIMT_SITE) {
  return dt_simt_block_sync(DT_SIMT_OP_SYNC_COUNT, pred, file, line, func);
}
inline int __syncthreads_and(int pred, DT_SIMT_SITE) {
  return dt_simt_block_sync(DT_SIMT_OP_SYNC_AND, pred, file, line, func);
}
inline int __syncthreads_or(int pred, DT_SIMT_SITE) {
  return dt_simt_block_sync(DT_SIMT_OP_SYNC_OR, pred, file, line, func);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, DT_SIMT_SITE) {
  dt_simt_warp_sync(DT_SIMT_OP_SYNCWARP, mask, 0, 0, 32, file, line, func);
}
inline unsigned __ballot_sync(unsigned mask, int pred, DT_SIMT_SITE) {
  return (unsigned)dt_simt_warp_sync(DT_SIMT_OP_BALLOT, mask, pred != 0, 0, 32, file, line, func);
}
inline int __any_sync(unsigned mask, int pred, DT_SIMT_SITE) {
  return (int)dt_simt_warp_sync(DT_SIMT_OP_ANY, mask, pred != 0, 0, 32, file, line, func);
}
inline int __all_sync(unsigned mask, int pred, DT_SIMT_SITE) {
  return (int)dt_simt_warp_sync(DT_SIMT_OP_ALL, mask, pred != 0, 0, 32, file, line, func);
}
/* The lanes of the warp that have not exited: the emulator has no notion of convergence, so
 * this is the widest answer hardware could give. */
inline unsigned __activemask() { return dt_simt_active_mask(); }

/* Shuffles move the bytes of any trivially copyable value of 2, 4 or 8 bytes. */
template <typename T>
inline T dt_simt_shfl_(int op, unsigned mask, T var, int arg, int width, const char* file, int line,
                       const char* func) {
  static_assert(
      std::is_trivially_copyable<T>::value && (sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8),
      "shuffles take a value of 2, 4 or 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = dt_simt_warp_sync(op, mask, bits, arg, width, file, line, func);
  std::memcpy(&var, &bits, sizeof(T));
  return var;
}
template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, DT_SIMT_SITE) {
  return dt_simt_shfl_(DT_SIMT_OP_SHFL_IDX, mask, var, src_lane, width, file, line, func);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, DT_SIMT_SITE) {
  return dt_simt_shfl_(DT_SIMT_OP_SHFL_UP, mask, var, (int)delta, width, file, line, func);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, DT_SIMT_SITE) {
  return dt_simt_shfl_(DT_SIMT_OP_SHFL_DOWN, mask, var, (int)delta, width, file, line, func);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, DT_SIMT_SITE) {
  return dt_simt_shfl_(DT_SIMT_OP_SHFL_XOR, mask, var, lane_mask, width, file, line, func);
}
#undef DT_SIMT_SITE

/* Memory is shared by fibers on one OS thread: fences only have to stop the compiler. */
inline void __threadfence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

/* ---------------------------------------------------------------------------------------------
 * Atomics: a fiber is never interrupted, so a plain read-modify-write is atomic. Each returns
 * the old value; the overloads are CUDA's (signed sums wrap as on the GPU). */
#define DT_SIMT_ATOMIC(name, T, update) \
  inline T name(T* address, T val) {    \
    T old = *address;                   \
    *address = (update);                \
    return old;                         \
  }
DT_SIMT_ATOMIC(atomicAdd, int, (int)((unsigned)old + (unsigned)val))
DT_SIMT_ATOMIC(atomicAdd, unsigned, old + val)
DT_SIMT_ATOMIC(atomicAdd, unsigned long long, old + val)
DT_SIMT_ATOMIC(atomicAdd, float, old + val)
DT_SIMT_ATOMIC(atomicAdd, double, old + val)
DT_SIMT_ATOMIC(atomicSub, int, (int)((unsigned)old - (unsigned)val))
DT_SIMT_ATOMIC(atomicSub, unsigned, old - val)
DT_SIMT_ATOMIC(atomicExch, int, val)
DT_SIMT_ATOMIC(atomicExch, unsigned, val)
DT_SIMT_ATOMIC(atomicExch, unsigned long long, val)
DT_SIMT_ATOMIC(atomicExch, float, val)
DT_SIMT_ATOMIC(atomicInc, unsigned, old >= val ? 0u : old + 1u)
DT_SIMT_ATOMIC(atomicDec, unsigned, (old == 0u || old > val) ? val : old - 1u)
#define DT_SIMT_ATOMIC_INT(T)                         \
  DT_SIMT_ATOMIC(atomicMax, T, old > val ? old : val) \
  DT_SIMT_ATOMIC(atomicMin, T, old < val ? old : val)
DT_SIMT_ATOMIC_INT(int)
DT_SIMT_ATOMIC_INT(unsigned)
DT_SIMT_ATOMIC_INT(long long)
DT_SIMT_ATOMIC_INT(unsigned long long)
#define DT_SIMT_ATOMIC_BITS(T)           \
  DT_SIMT_ATOMIC(atomicAnd, T, old & val) \
  DT_SIMT_ATOMIC(atomicOr, T, old | val) \
  DT_SIMT_ATOMIC(atomicXor, T, old ^ val)
DT_SIMT_ATOMIC_BITS(int)
DT_SIMT_ATOMIC_BITS(unsigned)
DT_SIMT_ATOMIC_BITS(unsigned long long)
#undef DT_SIMT_ATOMIC_BITS
#undef DT_SIMT_ATOMIC_INT
#undef DT_SIMT_ATOMIC
/* A failed compare-and-swap lets the other threads run: the usual spin lock between threads of
 * one block then makes progress (the holder runs until it releases the lock). */
#define DT_SIMT_CAS(T)                               \
  inline T atomicCAS(T* address, T compare, T val) { \
    T old = *address;                                \
    if (old == compare) {                            \
      *address = val;                                \
    } else {                                         \
      dt_simt_yield();                               \
    }                                                \
    return old;                                      \
  }
DT_SIMT_CAS(int)
DT_SIMT_CAS(unsigned)
DT_SIMT_CAS(unsigned long long)
DT_SIMT_CAS(unsigned short)
#undef DT_SIMT_CAS

/* ---------------------------------------------------------------------------------------------
 * Math. The host <cmath> float functions serve as they are. glibc's <math.h> declares __expf
 * and friends (without defining them), so those names are macros rather than functions. */
#define __expf expf
#define __logf logf
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __powf powf
#define __log2f log2f
#define __log10f log10f
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* Via double: correctly rounded except in rare double-rounding cases. */
inline float __frsqrt_rn(float x) { return (float)(1.0 / sqrt((double)x)); }
inline float __saturatef(float x) { return std::isnan(x) ? 0.0f : fminf(fmaxf(x, 0.0f), 1.0f); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float normcdff(float x) { return (float)(0.5 * erfc(-(double)x * 0.70710678118654752440)); }

/* Saturating float -> int as the GPU's cvt does: NaN gives 0, out of range the nearest limit. */
inline int dt_simt_f2i_(double r) {
  return std::isnan(r) ? 0 : r >= 2147483647.0 ? INT_MAX : r <= -2147483648.0 ? INT_MIN : (int)r;
}
inline int __float2int_rn(float x) { return dt_simt_f2i_(nearbyint((double)x)); }
inline int __float2int_rz(float x) { return dt_simt_f2i_(trunc((double)x)); }

template <typename To, typename From>
inline To dt_simt_bitcast_(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit casts keep the size");
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
inline float __int_as_float(int x) { return dt_simt_bitcast_<float>(x); }
inline int __float_as_int(float x) { return dt_simt_bitcast_<int>(x); }
inline float __uint_as_float(unsigned x) { return dt_simt_bitcast_<float>(x); }
inline unsigned __float_as_uint(float x) { return dt_simt_bitcast_<unsigned>(x); }
inline long long __double_as_longlong(double x) { return dt_simt_bitcast_<long long>(x); }
inline double __longlong_as_double(long long x) { return dt_simt_bitcast_<double>(x); }

inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }

/* min/max: CUDA's overloads, mixed signedness included (int with unsigned compares unsigned). */
#define DT_SIMT_MINMAX(R, A, B)                                \
  inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; } \
  inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
DT_SIMT_MINMAX(int, int, int)
DT_SIMT_MINMAX(unsigned, unsigned, unsigned)
DT_SIMT_MINMAX(unsigned, int, unsigned)
DT_SIMT_MINMAX(unsigned, unsigned, int)
DT_SIMT_MINMAX(long, long, long)
DT_SIMT_MINMAX(unsigned long, unsigned long, unsigned long)
DT_SIMT_MINMAX(long long, long long, long long)
DT_SIMT_MINMAX(unsigned long long, unsigned long long, unsigned long long)
DT_SIMT_MINMAX(unsigned long long, long long, unsigned long long)
DT_SIMT_MINMAX(unsigned long long, unsigned long long, long long)
#undef DT_SIMT_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

/* ---------------------------------------------------------------------------------------------
 * bf16 and f16: 16-bit storage types with CUDA's conversions (round to nearest even; f32 NaN
 * becomes the canonical quiet NaN 0x7fff and f16 NaN the f32 NaN 0x7fffffff, as the GPU does). */
struct __nv_bfloat16 {
  unsigned short bits;
};
struct __half {
  unsigned short bits;
};

inline unsigned short dt_simt_f32_to_bf16_(float f) {
  uint32_t u = dt_simt_bitcast_<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; a carry moves into the exponent (to inf) */
  return (unsigned short)(u >> 16);
}
inline unsigned short dt_simt_f32_to_f16_(float f) {
  uint32_t u = dt_simt_bitcast_<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* 65520 and up round to inf */
  uint32_t r, rem, half;
  if (a >= 0x38800000u) { /* normal: rebias the exponent, drop 13 mantissa bits */
    r = (a - 0x38000000u) >> 13;
    rem = a & 0x1fffu;
    half = 0x1000u;
  } else { /* below 2^-14: a subnormal multiple of 2^-24, or 0 */
    if (a < 0x33000000u) return (unsigned short)sign; /* below 2^-25 */
    uint32_t shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u; /* shift 14..24 */
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  }
  if (rem > half || (rem == half && (r & 1u))) r++; /* a carry makes the next binade: right */
  return (unsigned short)(sign | r);
}
inline float dt_simt_f16_to_f32_(unsigned short h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31u) return dt_simt_bitcast_<float>(m ? 0x7fffffffu : sign | 0x7f800000u);
  if (e != 0u) return dt_simt_bitcast_<float>(sign | ((e + 112u) << 23) | (m << 13));
  float v = (float)m * 0x1p-24f; /* subnormal or zero: exact */
  return sign ? -v : v;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{dt_simt_f32_to_bf16_(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
  return dt_simt_bitcast_<float>((uint32_t)h.bits << 16);
}
inline __half __float2half_rn(float f) { return __half{dt_simt_f32_to_f16_(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return dt_simt_f16_to_f32_(h.bits); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }

/* ---------------------------------------------------------------------------------------------
 * Tensor cores: CUDA's warp matrix API (nvcuda::wmma, <mma.h>) for the 16 x 16 x 16 shape with
 * __nv_bfloat16 or __half operands and float accumulators. Like the hardware's, the fragments are
 * opaque: lane l holds elements 8 l .. 8 l + 7 of the fragment's matrix in row-major order (the
 * GPU's distribution differs, so code that gives elements meaning by index is wrong on one of
 * them; element-wise arithmetic on x[] is fine). mma_sync is a warp operation (all 32 lanes, with
 * __syncwarp's checks); loads, stores and fill_fragment touch only the lane's own elements and
 * neither wait for the other lanes nor order memory: as on the GPU, lanes that read what other lanes wrote (a stored tile, a tile
 * they filled) need a __syncwarp or __syncthreads between, and the emulator, running each lane
 * to its next barrier, shows a missing one as wrong values. Loads and stores check what the GPU
 * requires and leaves undefined when broken: a 32-byte-aligned pointer and ldm a multiple of 16
 * bytes (a violation fails the launch). mma_sync sums each output in f32 in the order k = 0 .. 15 after the accumulator (the
 * GPU's order and rounding of the partial sums differ in the last bits). */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "wmma (emulated): only the 16 x 16 x 16 shape");
  static constexpr int num_elements = 8;
  T x[8];
};

inline float dt_simt_wmma_f32_(float v) { return v; }
inline float dt_simt_wmma_f32_(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float dt_simt_wmma_f32_(__half v) { return __half2float(v); }

/* The calling thread's lane and its warp within the block. */
inline unsigned dt_simt_wmma_tid_() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
template <typename T>
inline void dt_simt_wmma_check_(const T* p, unsigned ldm, const char* what) {
  if ((uintptr_t)p % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "wmma::%s: pointer %p or ldm %u breaks the 32-byte / 16-byte rule",
             what, (const void*)p, ldm);
    throw std::runtime_error(msg);
  }
}
/* Reads the lane's elements of a rows x cols matrix at p (element (r, c) at p[r * ldm + c] for
 * row-major memory, p[c * ldm + r] for column-major). */
template <typename F, typename T>
inline void dt_simt_wmma_load_(F& f, const T* p, unsigned ldm, bool col, const char* what) {
  dt_simt_wmma_check_(p, ldm, what);
  const unsigned lane = dt_simt_wmma_tid_() % 32;
  for (int i = 0; i < 8; i++) {
    const unsigned e = lane * 8 + i, r = e / 16, c = e % 16;
    f.x[i] = col ? p[c * ldm + r] : p[r * ldm + c];
  }
}
template <typename Use, typename T, typename L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value,
                "wmma: matrix_a / matrix_b fragments name their layout");
  dt_simt_wmma_load_(f, p, ldm, std::is_same<L, col_major>::value, "load_matrix_sync");
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  dt_simt_wmma_load_(f, p, ldm, layout == mem_col_major, "load_matrix_sync");
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  dt_simt_wmma_check_(p, ldm, "store_matrix_sync");
  const unsigned lane = dt_simt_wmma_tid_() % 32;
  for (int i = 0; i < 8; i++) {
    const unsigned e = lane * 8 + i, r = e / 16, c = e % 16;
    (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[i];
  }
}
template <typename Use, typename T, typename L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, const T& v) {
  for (int i = 0; i < 8; i++) f.x[i] = v;
}
/* d = a b + c; d may be c. The warp's operands meet in a per-warp buffer (blocks run one at a
 * time, so one buffer per warp of a block serves every launch). */
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  static float buf[32][2][256];
  const unsigned tid = dt_simt_wmma_tid_(), lane = tid % 32;
  float(*w)[256] = buf[tid / 32];
  __syncwarp(); /* every lane is done with the buffer's last use */
  for (int i = 0; i < 8; i++) {
    w[0][lane * 8 + i] = dt_simt_wmma_f32_(a.x[i]);
    w[1][lane * 8 + i] = dt_simt_wmma_f32_(b.x[i]);
  }
  __syncwarp();
  float out[8];
  for (int i = 0; i < 8; i++) {
    const unsigned e = lane * 8 + i, r = e / 16, col = e % 16;
    float acc = c.x[i];
    for (int k = 0; k < 16; k++) acc += w[0][r * 16 + k] * w[1][k * 16 + col];
    out[i] = acc;
  }
  for (int i = 0; i < 8; i++) d.x[i] = out[i];
}
}  // namespace wmma
}  // namespace nvcuda

/* ---------------------------------------------------------------------------------------------
 * Launch. The arguments are converted to the kernel's parameter types once, as <<<>>> does, and
 * every thread's call copies them into its own parameters. */
template <typename... P, typename... A>
inline int dt_simt_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "dt_simt_launch: wrong number of kernel arguments");
  (void)stream;
  struct Call {
    void (*fn)(P...);
    std::tuple<typename std::decay<P>::type...> argv;
    static void run(void* self) {
      Call* c = static_cast<Call*>(self);
      std::apply(c->fn, c->argv);
    }
  };
  Call call{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
  dt_simt_launch_desc_t d;
  d.grid = grid;
  d.block = block;
  d.smem_bytes = smem_bytes;
  d.body = &Call::run;
  d.ctx = &call;
  d.kernel = reinterpret_cast<const void*>(kernel);
  return dt_simt_run(&d);
}

inline const char* dt_simt_strerror(int rc) { return dt_simt_error_string(rc); }

/* The few CUDA runtime calls the backend and the kernels make (memory, copies, streams, events),
 * emulated on the host with CUDA's names. */
#include "backend/cuda_rt_emu.h"

#else
#error "simt.h: compile with nvcc, or with a C++17 compiler and -DDT_SIMT_EMULATE"
#endif

#endif /* DT_BACKEND_SIMT_H */

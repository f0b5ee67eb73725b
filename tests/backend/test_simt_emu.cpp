/* test_simt_emu.cpp - tests of the SIMT emulator (src/backend/simt_emu.cpp) through kernels
 * written as plain CUDA on top of src/backend/simt.h.
 *
 * Built with -DDT_SIMT_EMULATE by a host C++ compiler it runs every kernel on the CPU and also
 * checks the emulator's own behaviour: poisoned dynamic shared memory, errors for deadlocks and
 * misused warp operations, invalid launch configurations, and the timing of two benchmark kernels.
 * Built by nvcc the same kernels run on the GPU (managed memory; exit code 77 when there is no
 * device) and the emulator-only parts are left out, so the test also shows that the emulator
 * and the hardware agree.
 *
 * Not tested, by design: a kernel that overflows its fiber stack (default 64 KiB,
 * DTENSOR_SIMT_STACK_KB) dies with SIGSEGV on the guard region below the stack, at the faulting
 * access inside the kernel (gdb shows the kernel frame); nothing is reported through
 * dt_simt_last_error because the process does not survive.
 *
 * Exits 0 when every check passes, 1 otherwise, with one line per failed check.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include "backend/simt.h"

static int g_failures;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      g_failures++;                                                            \
    }                                                                          \
  } while (0)

/* ---------------------------------------------------------------------------------------------
 * Host side, identical in both modes except for memory. */

#ifdef DT_SIMT_EMULATE
static void* test_alloc(size_t nbytes) { /* 256-byte aligned, as cudaMalloc's */
  void* p = nullptr;
  if (posix_memalign(&p, 256, nbytes ? nbytes : 1) != 0) return nullptr;
  memset(p, 0, nbytes);
  return p;
}
static void test_free(void* p) { free(p); }
static int test_sync(void) { return 0; }
#else
static void* test_alloc(size_t nbytes) {
  void* p = nullptr;
  if (cudaMallocManaged(&p, nbytes ? nbytes : 1) != cudaSuccess) return nullptr;
  memset(p, 0, nbytes);
  return p;
}
static void test_free(void* p) { cudaFree(p); }
static int test_sync(void) { return (int)cudaDeviceSynchronize(); }
#endif

template <typename T>
static T* alloc_n(size_t n) {
  T* p = static_cast<T*>(test_alloc(n * sizeof(T)));
  if (p == nullptr) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

/* A launch that must succeed. */
#define LAUNCH_OK(...)                                                     \
  do {                                                                     \
    int rc_ = dt_simt_launch(__VA_ARGS__);                                 \
    if (rc_ == 0) rc_ = test_sync();                                       \
    CHECK(rc_ == 0, "launch returned %d: %s", rc_, dt_simt_strerror(rc_)); \
  } while (0)

/* Wall-clock and CPU seconds: on a busy machine the CPU time is the fair measure. */
static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
struct Stopwatch {
  double wall = clock_s(CLOCK_MONOTONIC), cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  void print(const char* what) const {
    printf("timing: %s: %.1f ms (cpu %.1f ms)\n", what, 1e3 * (clock_s(CLOCK_MONOTONIC) - wall),
           1e3 * (clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu));
  }
};

/* ---------------------------------------------------------------------------------------------
 * (a) Grid-stride saxpy over uneven sizes, 0 included, and a kernel that changes its by-value
 * parameter: every thread must have its own copy of the arguments. */

__global__ void own_args_kernel(int n, float* y) {
  int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  n += i; /* a shared copy would accumulate every thread's i */
  y[i] = (float)n;
}

__global__ void noop_kernel() {}

__global__ void saxpy_plain(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += (int)(blockDim.x * gridDim.x))
    y[i] = a * x[i] + y[i];
}

static bool saxpy_ok(int n) {
  float* x = alloc_n<float>((size_t)n);
  float* y = alloc_n<float>((size_t)n);
  for (int i = 0; i < n; i++) x[i] = (float)(i % 17), y[i] = (float)(i % 5);
  int blocks = n == 0 ? 1 : (n + 255) / 256 < 8 ? (n + 255) / 256 : 8;
  int rc = dt_simt_launch(saxpy_plain, dim3(blocks), dim3(256), 0, nullptr, n, 2.0f, x, y);
  if (rc == 0) rc = test_sync();
  bool ok = rc == 0;
  for (int i = 0; ok && i < n; i++) ok = y[i] == 2.0f * (float)(i % 17) + (float)(i % 5);
  test_free(x);
  test_free(y);
  return ok;
}

static void test_saxpy(void) {
  const int sizes[] = {0, 1, 31, 255, 257, 1000, 4097, 65537};
  for (int n : sizes) CHECK(saxpy_ok(n), "saxpy n=%d", n);
  LAUNCH_OK(noop_kernel, dim3(2), dim3(3), 0, nullptr);
  float* own = alloc_n<float>(1000);
  LAUNCH_OK(own_args_kernel, dim3(10), dim3(100), 0, nullptr, 7, own);
  int bad = 0;
  for (int i = 0; i < 1000; i++) bad += own[i] != (float)(7 + i);
  CHECK(bad == 0, "per-thread argument copies: %d wrong", bad);
  test_free(own);

  /* Speed: 1M floats, 8 blocks of 256 threads. */
  const int n = 1 << 20;
  float* x = alloc_n<float>(n);
  float* y = alloc_n<float>(n);
  for (int i = 0; i < n; i++) x[i] = 1.0f, y[i] = 0.0f;
  LAUNCH_OK(saxpy_plain, dim3(8), dim3(256), 0, nullptr, n, 2.0f, x, y); /* warm-up */
  Stopwatch sw;
  LAUNCH_OK(saxpy_plain, dim3(8), dim3(256), 0, nullptr, n, 2.0f, x, y);
  sw.print("saxpy 1M floats, grid 8 x 256");
  CHECK(y[n - 1] == 4.0f && y[0] == 4.0f, "saxpy 1M: y[0]=%g", (double)y[0]);
  test_free(x);
  test_free(y);
}

/* ---------------------------------------------------------------------------------------------
 * (b) Block reductions: a shared-memory tree (a template, so the __shared__ array lives in a
 * template instance) and the benchmark row reduction (tree down to 32, then shuffles). */

/* An inline helper with a __shared__ variable of its own, next to the kernel's. */
__device__ __forceinline__ float block_broadcast(float v) {
  __shared__ float slot;
  if (threadIdx.x == 0) slot = v;
  __syncthreads();
  float r = slot;
  __syncthreads();
  return r;
}

template <int BLOCK>
__global__ void block_sum_kernel(const float* x, int n, float* partial) {
  __shared__ float s[BLOCK];
  float v = 0.0f;
  for (int i = (int)(blockIdx.x * BLOCK + threadIdx.x); i < n; i += (int)(BLOCK * gridDim.x))
    v += x[i];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int k = BLOCK / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  float total = block_broadcast(s[0]);
  if (threadIdx.x == BLOCK - 1) partial[blockIdx.x] = total;
}

/* out[r] = sum of row r; blockDim.x a power of two from 64 to 1024. */
__global__ void row_sum_kernel(const float* __restrict__ x, int rows, int cols,
                               float* __restrict__ out) {
  __shared__ float s[1024];
  unsigned tid = threadIdx.x;
  for (int r = (int)blockIdx.x; r < rows; r += (int)gridDim.x) {
    float v = 0.0f;
    for (int c = (int)tid; c < cols; c += (int)blockDim.x) v += x[(size_t)r * cols + c];
    s[tid] = v;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k >= 32; k >>= 1) {
      if (tid < k) s[tid] += s[tid + k];
      __syncthreads();
    }
    if (tid < 32) {
      v = s[tid];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
      if (tid == 0) out[r] = v;
    }
    __syncthreads(); /* s is reused by the next row */
  }
}

static void test_reductions(void) {
  const int n = 100003, blocks = 7;
  float* x = alloc_n<float>(n);
  float* partial = alloc_n<float>(blocks);
  double want = 0;
  for (int i = 0; i < n; i++) x[i] = (float)(i % 9) - 4.0f, want += x[i];
  LAUNCH_OK(block_sum_kernel<128>, dim3(blocks), dim3(128), 0, nullptr, x, n, partial);
  double got = 0;
  for (int b = 0; b < blocks; b++) got += partial[b];
  CHECK(got == want, "block_sum: %g, want %g", got, want);
  test_free(x);
  test_free(partial);

  const int rows = 4096, cols = 1024;
  float* m = alloc_n<float>((size_t)rows * cols);
  float* out = alloc_n<float>(rows);
  for (size_t i = 0; i < (size_t)rows * cols; i++) m[i] = (float)(i % 13);
  const unsigned threads[] = {256, 1024};
  for (unsigned t : threads) {
    Stopwatch sw;
    LAUNCH_OK(row_sum_kernel, dim3(rows < 8 ? rows : 8), dim3(t), 0, nullptr, m, rows, cols, out);
    char what[80];
    snprintf(what, sizeof what, "row reduction 4096 x 1024, grid 8 x %u", t);
    sw.print(what);
    int bad = 0;
    for (int r = 0; r < rows; r++) {
      double w = 0;
      for (int c = 0; c < cols; c++) w += m[(size_t)r * cols + c];
      bad += out[r] != (float)w;
    }
    CHECK(bad == 0, "row_sum with %u threads: %d rows wrong", t, bad);
  }
  test_free(m);
  test_free(out);
}

/* ---------------------------------------------------------------------------------------------
 * (c) Warp operations, against the lane arithmetic CUDA documents. 64 threads: two warps. */

struct WarpOut {
  int xor_sum[64], down_sum[64], scan8[64], down8[64], xor8[64], idx16[64], up_edge[64];
  unsigned ballot[64];
  int any_all[64], half_mask[64], count[64], and_or[64];
  double dbl[64];
};

__global__ void warp_kernel(WarpOut* o) {
  int t = (int)threadIdx.x, lane = t % 32, v = t + 1;
  int s = v;
  for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  o->xor_sum[t] = s; /* every lane: the warp's sum */
  s = v;
  for (int k = 16; k > 0; k >>= 1) s += __shfl_down_sync(0xffffffffu, s, (unsigned)k);
  o->down_sum[t] = s; /* lane 0: the warp's sum */
  s = v;              /* inclusive scan inside segments of 8 */
  for (int d = 1; d < 8; d <<= 1) {
    int u = __shfl_up_sync(0xffffffffu, s, (unsigned)d, 8);
    if ((lane & 7) >= d) s += u;
  }
  o->scan8[t] = s;
  o->down8[t] = __shfl_down_sync(0xffffffffu, v, 1, 8); /* segment ends keep their value */
  o->xor8[t] = __shfl_xor_sync(0xffffffffu, v, 8, 8);   /* reads an earlier segment only */
  o->idx16[t] = __shfl_sync(0xffffffffu, v, 35, 16);    /* lane 3 of its 16-lane segment */
  o->up_edge[t] = __shfl_up_sync(0xffffffffu, v, 33);   /* delta 33 acts as 1 (5 bits) */
  o->ballot[t] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  o->any_all[t] = __any_sync(0xffffffffu, lane == 5) + 2 * __all_sync(0xffffffffu, lane < 32) +
                  4 * __all_sync(0xffffffffu, lane < 31);
  /* Two halves of a warp shuffle with disjoint masks at the same time. */
  unsigned halves = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  o->half_mask[t] = __shfl_sync(halves, v, lane < 16 ? 0 : 16);
  o->dbl[t] = __shfl_xor_sync(0xffffffffu, 0.5 * v, 1);
  __syncwarp();
  o->count[t] = __syncthreads_count(t % 4 == 0);
  o->and_or[t] =
      __syncthreads_and(t < 64) + 2 * __syncthreads_or(t == 63) + 4 * __syncthreads_and(t != 10);
}

static void test_warp_ops(void) {
  WarpOut* o = alloc_n<WarpOut>(1);
  LAUNCH_OK(warp_kernel, dim3(1), dim3(64), 0, nullptr, o);
  int bad = 0;
  for (int t = 0; t < 64; t++) {
    int lane = t % 32, base = t - lane, warp_sum = 0;
    for (int k = 0; k < 32; k++) warp_sum += base + k + 1;
    int seg = t - (lane & 7), scan = 0;
    for (int k = seg; k <= t; k++) scan += k + 1;
    unsigned ballot = 0;
    for (int k = 0; k < 32; k++) ballot |= (k % 3 == 0 ? 1u : 0u) << k;
    int down8 = (lane & 7) == 7 ? t + 1 : t + 2;
    int xor8 = (lane & 8) ? t - 7 : t + 1; /* 8..15 read 0..7; 0..7 would read ahead: own */
    int idx16 = base + (lane & 16) + 3 + 1;
    int up_edge = lane == 0 ? t + 1 : t;
    int half_want = base + (lane < 16 ? 0 : 16) + 1;
    bad += o->xor_sum[t] != warp_sum;
    bad += lane == 0 && o->down_sum[t] != warp_sum;
    bad += o->scan8[t] != scan;
    bad += o->down8[t] != down8;
    bad += o->xor8[t] != xor8;
    bad += o->idx16[t] != idx16;
    bad += o->up_edge[t] != up_edge;
    bad += o->ballot[t] != ballot;
    bad += o->any_all[t] != 3;
    bad += o->half_mask[t] != half_want;
    bad += o->dbl[t] != 0.5 * ((t ^ 1) + 1);
    bad += o->count[t] != 16;
    bad += o->and_or[t] != 3;
    if (bad) {
      CHECK(bad == 0,
            "warp ops: thread %d: xor %d down %d scan %d/%d down8 %d/%d xor8 %d/%d "
            "idx16 %d/%d up %d/%d ballot %x any_all %d half %d/%d count %d and_or %d",
            t, o->xor_sum[t], o->down_sum[t], o->scan8[t], scan, o->down8[t], down8, o->xor8[t],
            xor8, o->idx16[t], idx16, o->up_edge[t], up_edge, o->ballot[t], o->any_all[t],
            o->half_mask[t], half_want, o->count[t], o->and_or[t]);
      break;
    }
  }
  test_free(o);
}

/* ---------------------------------------------------------------------------------------------
 * (d) Shared memory: dynamic shared memory reverses each block's slice, after thread 0 read one
 * word before anyone wrote it, which must show the emulator's 0xFF poison in every block (not
 * the previous block's data). A static __shared__ counter checks barrier ordering alongside. */

__global__ void reverse_kernel(const int* in, int* out, unsigned* first_read, int* counted) {
  DT_SIMT_DYN_SHARED(int, buf);
  __shared__ int arrivals;
  unsigned t = threadIdx.x, n = blockDim.x, g = blockIdx.x * n + t;
  if (t == 0) {
    first_read[blockIdx.x] = (unsigned)buf[n - 1]; /* undefined on a GPU */
    arrivals = 0;
  }
  __syncthreads();
  buf[t] = in[g];
  atomicAdd(&arrivals, 1);
  __syncthreads();
  out[g] = buf[n - 1 - t];
  if (t == n - 1) counted[blockIdx.x] = arrivals;
}

static void test_shared(void) {
  const int blocks = 3, n = 96;
  int* in = alloc_n<int>(blocks * n);
  int* out = alloc_n<int>(blocks * n);
  unsigned* first_read = alloc_n<unsigned>(blocks);
  int* counted = alloc_n<int>(blocks);
  for (int i = 0; i < blocks * n; i++) in[i] = i * 3;
  LAUNCH_OK(reverse_kernel, dim3(blocks), dim3(n), n * sizeof(int), nullptr, in, out, first_read,
            counted);
  int bad = 0;
  for (int b = 0; b < blocks; b++) {
    for (int t = 0; t < n; t++) bad += out[b * n + t] != in[b * n + n - 1 - t];
    bad += counted[b] != n;
  }
  CHECK(bad == 0, "dynamic shared reversal: %d wrong", bad);
#ifdef DT_SIMT_EMULATE
  for (int b = 0; b < blocks; b++)
    CHECK(first_read[b] == 0xffffffffu, "block %d read dynamic smem 0x%x before writing it", b,
          first_read[b]);
#endif
  test_free(in);
  test_free(out);
  test_free(first_read);
  test_free(counted);
}

/* ---------------------------------------------------------------------------------------------
 * (e) Atomics. */

struct AtomicOut {
  int hist[16];
  int imax, imin;
  float fmax_cas, fsum;
  double dsum;
  unsigned long long ull_sum;
  unsigned bits_and, bits_or, bits_xor, inc;
  int exch_seen, sub;
  unsigned short cas16;
  int lock, in_lock, max_in_lock;
};

__device__ float atomic_max_float(float* addr, float v) {
  int* a = reinterpret_cast<int*>(addr);
  int old = *a, assumed;
  do {
    assumed = old;
    if (__int_as_float(assumed) >= v) break;
    old = atomicCAS(a, assumed, __float_as_int(v));
  } while (old != assumed);
  return __int_as_float(old);
}

__global__ void atomic_kernel(const int* data, int n, AtomicOut* o) {
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += (int)(blockDim.x * gridDim.x)) {
    int v = data[i];
    atomicAdd(&o->hist[v & 15], 1);
    atomicMax(&o->imax, v);
    atomicMin(&o->imin, v);
    atomic_max_float(&o->fmax_cas, (float)v * 0.5f);
    atomicAdd(&o->fsum, 1.0f);
    atomicAdd(&o->dsum, 0.25);
    atomicAdd(&o->ull_sum, (unsigned long long)v);
    atomicAnd(&o->bits_and, ~(1u << (v & 31)) | 1u);
    atomicOr(&o->bits_or, 1u << (v & 31));
    atomicXor(&o->bits_xor, (unsigned)v);
    atomicInc(&o->inc, 1000000u);
    atomicSub(&o->sub, 2);
    atomicExch(&o->exch_seen, 1);
    atomicCAS(&o->cas16, (unsigned short)0, (unsigned short)7);
  }
  /* A spin lock between the threads of a block: the holder runs until it lets go. */
  while (atomicCAS(&o->lock, 0, 1) != 0) {
  }
  int inside = atomicAdd(&o->in_lock, 1) + 1;
  atomicMax(&o->max_in_lock, inside);
  atomicSub(&o->in_lock, 1);
  atomicExch(&o->lock, 0);
}

static void test_atomics(void) {
  const int n = 5000;
  int* data = alloc_n<int>(n);
  AtomicOut* o = alloc_n<AtomicOut>(1);
  o->imin = 1 << 30;
  o->fmax_cas = -1.0f;
  o->bits_and = ~0u;
  int hist[16] = {0}, vmax = 0, vmin = 1 << 30;
  unsigned bits_or = 0, bits_xor = 0, bits_and = ~0u;
  unsigned long long sum = 0;
  for (int i = 0; i < n; i++) {
    int v = (int)((i * 2654435761u) % 10007u);
    data[i] = v;
    hist[v & 15]++;
    vmax = v > vmax ? v : vmax;
    vmin = v < vmin ? v : vmin;
    bits_or |= 1u << (v & 31);
    bits_xor ^= (unsigned)v;
    bits_and &= ~(1u << (v & 31)) | 1u;
    sum += (unsigned long long)v;
  }
  LAUNCH_OK(atomic_kernel, dim3(4), dim3(96), 0, nullptr, data, n, o);
  int bad = 0;
  for (int b = 0; b < 16; b++) bad += o->hist[b] != hist[b];
  CHECK(bad == 0, "histogram: %d bins wrong", bad);
  CHECK(o->imax == vmax && o->imin == vmin, "atomicMax/Min: %d %d, want %d %d", o->imax, o->imin,
        vmax, vmin);
  CHECK(o->fmax_cas == 0.5f * (float)vmax, "CAS float max: %g", (double)o->fmax_cas);
  CHECK(o->fsum == (float)n && o->dsum == 0.25 * n, "float/double add: %g %g", (double)o->fsum,
        o->dsum);
  CHECK(o->ull_sum == sum, "ull add: %llu, want %llu", o->ull_sum, sum);
  CHECK(o->bits_or == bits_or && o->bits_xor == bits_xor && o->bits_and == bits_and,
        "and/or/xor: %x %x %x", o->bits_and, o->bits_or, o->bits_xor);
  CHECK(o->inc == (unsigned)n && o->sub == -2 * n && o->exch_seen == 1 && o->cas16 == 7,
        "inc/sub/exch/cas16: %u %d %d %u", o->inc, o->sub, o->exch_seen, (unsigned)o->cas16);
  CHECK(o->max_in_lock == 1 && o->lock == 0, "spin lock: %d threads inside at once",
        o->max_in_lock);
  test_free(data);
  test_free(o);
}

/* ---------------------------------------------------------------------------------------------
 * (f) 3-D grids and blocks: every (blockIdx, threadIdx) exactly once. */

__global__ void visit_kernel(int* visits, unsigned* dims_ok) {
  dim3 b = blockDim, g = gridDim;
  if (b.x != 4 || b.y != 3 || b.z != 2 || g.x != 3 || g.y != 2 || g.z != 5) atomicExch(dims_ok, 0u);
  unsigned block = blockIdx.x + g.x * (blockIdx.y + g.y * blockIdx.z);
  unsigned thread = threadIdx.x + b.x * (threadIdx.y + b.y * threadIdx.z);
  atomicAdd(&visits[block * (b.x * b.y * b.z) + thread], 1);
}

static void test_3d(void) {
  const int total = 3 * 2 * 5 * 4 * 3 * 2;
  int* visits = alloc_n<int>(total);
  unsigned* dims_ok = alloc_n<unsigned>(1);
  *dims_ok = 1;
  LAUNCH_OK(visit_kernel, dim3(3, 2, 5), dim3(4, 3, 2), 0, nullptr, visits, dims_ok);
  int bad = 0;
  for (int i = 0; i < total; i++) bad += visits[i] != 1;
  CHECK(bad == 0 && *dims_ok == 1, "3-D launch: %d cells not visited once, dims ok %u", bad,
        *dims_ok);
  test_free(visits);
  test_free(dims_ok);
}

/* ---------------------------------------------------------------------------------------------
 * (g) Early exits, deadlocks and misuse (the error cases run in emulation only: on a GPU they
 * hang or are undefined). */

/* Legal: the threads past n return before the barrier; exited threads count as arrived. */
__global__ void early_exit_kernel(int n, int* out) {
  __shared__ int s[64];
  int t = (int)threadIdx.x;
  if (t >= n) return;
  s[t] = t;
  __syncthreads();
  out[t] = s[n - 1 - t];
}

#ifdef DT_SIMT_EMULATE
/* Half the block waits at one __syncthreads, the other half at another. sm_70+ hardware counts
 * arrivals at barrier 0 and would let both go; CUDA calls it undefined, the emulator an error. */
__global__ void split_barrier_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

/* Lane `gone` of warp 0 returns; its warp then shuffles with a full mask while warp 1 waits at
 * a barrier that warp 0 never reaches. Lane 31 returns after the others arrived at the shuffle,
 * lane 0 before. */
__global__ void exited_lane_kernel(unsigned gone, int* out) {
  if (threadIdx.x == gone) return;
  int v = (int)threadIdx.x;
  if (threadIdx.x < 32) v = __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

/* A true deadlock: lanes 0-15 wait at __syncwarp for lanes 16-31, which wait at __syncthreads
 * for lanes 0-15. No single arrival is wrong; the emulator finds that nothing can run. */
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x < 16)
    __syncwarp();
  else
    __syncthreads();
  out[threadIdx.x] = 1;
}

/* Lanes of one mask at different warp operations. */
__global__ void mismatch_kernel(int* out) {
  int v = (int)threadIdx.x;
  if (threadIdx.x < 16)
    v = __shfl_sync(0xffffffffu, v, 0);
  else
    v = (int)__ballot_sync(0xffffffffu, v & 1);
  out[threadIdx.x] = v;
}

__global__ void bad_mask_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, 1, 0); /* lanes 1..31 are not in their own mask */
}

__global__ void bad_width_kernel(int* out) {
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1, 12);
}

__global__ void throw_kernel(int* out) {
  if (threadIdx.x == 5) throw 42;
  out[threadIdx.x] = 1;
}

__global__ void nested_kernel(int* out) {
  if (threadIdx.x == 0)
    out[0] = dt_simt_launch(saxpy_plain, dim3(1), dim3(1), 0, nullptr, 0, 1.0f,
                            (const float*)nullptr, (float*)nullptr);
}

static void expect_error(const char* what, int rc, int want_rc, const char* want_text) {
  const char* msg = dt_simt_last_error();
  CHECK(rc == want_rc && strstr(msg, want_text) != nullptr,
        "%s: rc %d (want %d), message \"%s\" (want it to contain \"%s\")", what, rc, want_rc, msg,
        want_text);
  if (getenv("TEST_SIMT_VERBOSE")) printf("%s -> %d: %s\n", what, rc, msg);
  CHECK(dt_simt_strerror(rc) == msg, "%s: dt_simt_strerror gives another text", what);
  CHECK(saxpy_ok(1000), "emulator unusable after %s", what);
  CHECK(dt_simt_last_error()[0] == '\0' && dt_simt_strerror(want_rc) != dt_simt_last_error(),
        "%s: the message outlived a successful launch", what);
}
#endif

static void test_errors(void) {
  int* out = alloc_n<int>(64);
  for (int n = 0; n <= 64; n += 21) {
    LAUNCH_OK(early_exit_kernel, dim3(1), dim3(64), 0, nullptr, n, out);
    int bad = 0;
    for (int t = 0; t < n; t++) bad += out[t] != n - 1 - t;
    CHECK(bad == 0, "early exit before a barrier, n=%d: %d wrong", n, bad);
  }
#ifdef DT_SIMT_EMULATE
  const int fail = DT_SIMT_ERR_LAUNCH_FAILED, config = DT_SIMT_ERR_INVALID_CONFIG;
  expect_error("split barrier", dt_simt_launch(split_barrier_kernel, 1, 64, 0, nullptr, out), fail,
               "different block barriers");
  expect_error("mask lane returns late",
               dt_simt_launch(exited_lane_kernel, 1, 64, 0, nullptr, 31u, out), fail,
               "returned while lane 0 of its warp waits for it");
  expect_error("mask lane returned early",
               dt_simt_launch(exited_lane_kernel, 1, 64, 0, nullptr, 0u, out), fail,
               "lanes 0x00000001 of the mask have returned");
  expect_error("deadlock", dt_simt_launch(deadlock_kernel, 2, 32, 0, nullptr, out), fail,
               "deadlock");
  expect_error("mismatched warp ops", dt_simt_launch(mismatch_kernel, 1, 32, 0, nullptr, out), fail,
               "same warp operation");
  expect_error("mask without own lane", dt_simt_launch(bad_mask_kernel, 1, 32, 0, nullptr, out),
               fail, "does not contain");
  expect_error("bad width", dt_simt_launch(bad_width_kernel, 1, 32, 0, nullptr, out), fail,
               "power of two");
  expect_error("exception", dt_simt_launch(throw_kernel, 1, 32, 0, nullptr, out), fail,
               "exception");
  expect_error("block of 1025",
               dt_simt_launch(saxpy_plain, 1, 1025, 0, nullptr, 0, 1.0f, (const float*)nullptr,
                              (float*)nullptr),
               config, "invalid launch configuration");
  expect_error("block z 65",
               dt_simt_launch(saxpy_plain, 1, dim3(1, 1, 65), 0, nullptr, 0, 1.0f,
                              (const float*)nullptr, (float*)nullptr),
               config, "invalid launch configuration");
  expect_error("grid of 0",
               dt_simt_launch(saxpy_plain, 0, 32, 0, nullptr, 0, 1.0f, (const float*)nullptr,
                              (float*)nullptr),
               config, "invalid launch configuration");
  expect_error("smem 227K+1",
               dt_simt_launch(saxpy_plain, 1, 32, 227 * 1024 + 1, nullptr, 0, 1.0f,
                              (const float*)nullptr, (float*)nullptr),
               config, "dynamic shared memory");
  out[0] = -1;
  LAUNCH_OK(nested_kernel, 1, 1, 0, nullptr, out);
  CHECK(out[0] == DT_SIMT_ERR_INVALID_VALUE, "nested launch returned %d", out[0]);
#endif
  test_free(out);
}

/* ---------------------------------------------------------------------------------------------
 * (h) bf16 / f16 conversions in a kernel, against references computed here from the formats'
 * definitions: every f16 value converts to f32 exactly and back to itself, and f32 values
 * (random ones, and every midpoint between neighbouring f16 / bf16 values and its neighbours)
 * round to the nearest value, ties to even, overflowing to infinity. */

__global__ void convert_kernel(int n16, const unsigned short* h16, float* f_of_h16,
                               unsigned short* h16_again, int nf, const float* f,
                               unsigned short* f16_of_f, unsigned short* bf16_of_f,
                               float* f_of_bf16) {
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n16 || i < nf;
       i += (int)(blockDim.x * gridDim.x)) {
    if (i < n16) {
      float v = __half2float(__ushort_as_half(h16[i]));
      f_of_h16[i] = v;
      h16_again[i] = __half_as_ushort(__float2half_rn(v));
    }
    if (i < nf) {
      f16_of_f[i] = __half_as_ushort(__float2half(f[i]));
      __nv_bfloat16 b = __float2bfloat16_rn(f[i]);
      bf16_of_f[i] = __bfloat16_as_ushort(b);
      f_of_bf16[i] = __bfloat162float(__ushort_as_bfloat16(__bfloat16_as_ushort(b)));
    }
  }
}

static double f16_value(unsigned h) { /* |value| of the positive pattern h <= 0x7c00 */
  unsigned e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return 65536.0; /* infinity stands in for the next value after 65504 */
  return e == 0 ? ldexp((double)m, -24) : ldexp((double)(m | 1024), (int)e - 25);
}

static double bf16_value(unsigned h) { /* |value| of the positive pattern h <= 0x7f80 */
  if (h == 0x7f80) return ldexp(1.0, 128);
  uint32_t u = h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The pattern nearest to x (ties to the even pattern) among 0..top by binary search. */
static unsigned nearest(double (*value)(unsigned), unsigned top, float x) {
  double a = fabs((double)x);
  unsigned lo = 0, hi = top;
  if (a >= value(top)) return top;
  while (hi - lo > 1) { /* value(lo) <= a < value(hi) */
    unsigned mid = (lo + hi) / 2;
    if (value(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  double dl = a - value(lo), dh = value(hi) - a;
  return dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
}

static bool is_nan16(unsigned h, unsigned exp_mask) {
  return (h & exp_mask) == exp_mask && (h & ~exp_mask & 0x7fffu) != 0;
}

static void test_conversions(void) {
  const int n16 = 65536;
  std::vector<float> samples;
  uint32_t rng = 12345u;
  for (int i = 0; i < 200000; i++) { /* random patterns over every exponent */
    rng = rng * 1664525u + 1013904223u;
    uint32_t u = rng;
    float f;
    memcpy(&f, &u, 4);
    samples.push_back(f);
  }
  for (unsigned h = 0; h < 0x7c00; h++) { /* f16 midpoints and their neighbours, both signs */
    float mid = (float)((f16_value(h) + f16_value(h + 1)) / 2);
    for (float v : {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)})
      samples.push_back(v), samples.push_back(-v);
  }
  for (unsigned h = 0; h < 0x7f80; h += 7) { /* bf16 midpoints (a sample) */
    float mid = (float)((bf16_value(h) + bf16_value(h + 1)) / 2);
    if (isinf(mid)) continue;
    for (float v : {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)})
      samples.push_back(v), samples.push_back(-v);
  }
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.99f, 65520.0f,
                  3.0e38f, 3.4028235e38f, 1e-45f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f})
    samples.push_back(v);
  const int nf = (int)samples.size();

  unsigned short* h16 = alloc_n<unsigned short>(n16);
  float* f_of_h16 = alloc_n<float>(n16);
  unsigned short* h16_again = alloc_n<unsigned short>(n16);
  float* f = alloc_n<float>(nf);
  unsigned short* f16_of_f = alloc_n<unsigned short>(nf);
  unsigned short* bf16_of_f = alloc_n<unsigned short>(nf);
  float* f_of_bf16 = alloc_n<float>(nf);
  for (int i = 0; i < n16; i++) h16[i] = (unsigned short)i;
  memcpy(f, samples.data(), (size_t)nf * sizeof(float));
  LAUNCH_OK(convert_kernel, dim3(8), dim3(256), 0, nullptr, n16, h16, f_of_h16, h16_again, nf, f,
            f16_of_f, bf16_of_f, f_of_bf16);

  int bad = 0;
  for (unsigned h = 0; h < (unsigned)n16; h++) {
    float v = f_of_h16[h];
    if (is_nan16(h, 0x7c00)) {
      bad += !isnan(v) || !is_nan16(h16_again[h], 0x7c00);
      continue;
    }
    double want = f16_value(h & 0x7fff);
    if ((h & 0x7fff) == 0x7c00) want = INFINITY;
    if (h & 0x8000) want = -want;
    bool ok = (double)v == want && signbit(v) == ((h & 0x8000) != 0) && h16_again[h] == h;
    if (!ok && bad < 5)
      fprintf(stderr, "f16 0x%04x -> %a -> 0x%04x, want %a\n", h, (double)v, h16_again[h], want);
    bad += !ok;
  }
  CHECK(bad == 0, "f16 -> f32 -> f16 round trip: %d of 65536 wrong", bad);

  int bad16 = 0, bad_b = 0;
  for (int i = 0; i < nf; i++) {
    float x = f[i];
    unsigned sign = signbit(x) ? 0x8000u : 0u;
    unsigned got16 = f16_of_f[i], gotb = bf16_of_f[i];
    if (isnan(x)) {
      bad16 += !is_nan16(got16, 0x7c00) || !(got16 & 0x0200u); /* quiet NaN */
      bad_b += !is_nan16(gotb, 0x7f80) || !(gotb & 0x0040u) || !isnan(f_of_bf16[i]);
      continue;
    }
    unsigned want16 = sign | nearest(f16_value, 0x7c00, x);
    unsigned wantb = sign | nearest(bf16_value, 0x7f80, x);
    if (got16 != want16 && bad16 < 5)
      fprintf(stderr, "f32 %a -> f16 0x%04x, want 0x%04x\n", (double)x, got16, want16);
    if (gotb != wantb && bad_b < 5)
      fprintf(stderr, "f32 %a -> bf16 0x%04x, want 0x%04x\n", (double)x, gotb, wantb);
    bad16 += got16 != want16;
    bad_b += gotb != wantb;
    uint32_t back = (uint32_t)gotb << 16;
    bad_b += memcmp(&back, &f_of_bf16[i], 4) != 0;
  }
  CHECK(bad16 == 0, "f32 -> f16: %d of %d wrong", bad16, nf);
  CHECK(bad_b == 0, "f32 -> bf16 -> f32: %d of %d wrong", bad_b, nf);
#if defined(DT_SIMT_EMULATE) && defined(__x86_64__) && defined(__FLT16_MAX__)
  /* The compiler's own _Float16 (IEEE, round to nearest even) as a second reference. */
  int bad_c = 0;
  for (int i = 0; i < nf; i++) {
    if (isnan(f[i])) continue;
    _Float16 c = (_Float16)f[i];
    unsigned short u;
    memcpy(&u, &c, 2);
    bad_c += u != f16_of_f[i];
  }
  CHECK(bad_c == 0, "f32 -> f16 against _Float16: %d of %d differ", bad_c, nf);
#endif
  test_free(h16);
  test_free(f_of_h16);
  test_free(h16_again);
  test_free(f);
  test_free(f16_of_f);
  test_free(bf16_of_f);
  test_free(f_of_bf16);
}

/* ---------------------------------------------------------------------------------------------
 * A few of the math helpers (host calls: they are plain functions in emulation). */

static void test_math(void) {
#ifdef DT_SIMT_EMULATE
  CHECK(__clz(0) == 32 && __clz(1) == 31 && __clz(-1) == 0, "__clz");
  CHECK(__popc(0xf0f0u) == 8 && __ffs(0) == 0 && __ffs(8) == 4, "__popc / __ffs");
  CHECK(__float2int_rn(2.5f) == 2 && __float2int_rn(3.5f) == 4 && __float2int_rn(-2.5f) == -2,
        "__float2int_rn ties to even");
  CHECK(
      __float2int_rz(-2.7f) == -2 && __float2int_rn(3e9f) == 2147483647 && __float2int_rn(NAN) == 0,
      "__float2int_rz / saturation");
  CHECK(__saturatef(-1.0f) == 0.0f && __saturatef(2.0f) == 1.0f && __saturatef(NAN) == 0.0f,
        "__saturatef");
  CHECK(min(3, 4u) == 3u && max(-1, 1u) == 0xffffffffu && min(2.0f, 1.0f) == 1.0f &&
            max((long long)5, (long long)-5) == 5 && min((int64_t)-3, (int64_t)2) == -3,
        "min/max overloads");
  CHECK(fabsf(normcdff(0.0f) - 0.5f) < 1e-7f && fabsf(normcdff(1.0f) - 0.8413447f) < 1e-6f,
        "normcdff");
  CHECK(__float_as_uint(1.0f) == 0x3f800000u &&
            __longlong_as_double(__double_as_longlong(2.5)) == 2.5,
        "bit casts");
#endif
}

/* ---------------------------------------------------------------------------------------------
 * (j) Tensor cores through nvcuda::wmma: D = A B + C over two k steps for each operand layout
 * (A row- or column-major, B row- or column-major, C loaded and D stored either way), bf16 and
 * f16, against a double reference; in the emulator a misaligned operand fails the launch. Two
 * warps each compute their own 16-row block, through shared memory that every lane fills (so a
 * missing __syncwarp / __syncthreads between filling and loading would show). */

template <typename T>
__device__ T test_from_f32(float v);
template <>
__device__ __nv_bfloat16 test_from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half test_from_f32<__half>(float v) {
  return __float2half_rn(v);
}

template <typename T, typename LA, typename LB>
__global__ void wmma_kernel(const float* a, const float* b, const float* c, float* d, int c_col,
                            int d_col, int skew) {
  /* A: 32 x 32 (two warps' 16 rows), B: 32 x 16, C and D: 32 x 16; ld 40 (16-bit), 20 (f32) */
  DT_SIMT_DYN_SHARED(unsigned char, sm);
  T* As = reinterpret_cast<T*>(sm);
  T* Bs = As + 32 * 40;
  float* Cs = reinterpret_cast<float*>(Bs + 32 * 40);
  const bool a_col = std::is_same<LA, nvcuda::wmma::col_major>::value;
  const bool b_col = std::is_same<LB, nvcuda::wmma::col_major>::value;
  for (int x = threadIdx.x; x < 32 * 32; x += blockDim.x) {
    const int r = x / 32, k = x % 32;
    As[a_col ? k * 40 + r : r * 40 + k] = test_from_f32<T>(a[x]);
  }
  for (int x = threadIdx.x; x < 32 * 16; x += blockDim.x) {
    const int k = x / 16, n = x % 16;
    Bs[b_col ? n * 40 + k : k * 40 + n] = test_from_f32<T>(b[x]);
    const int r = x / 16;
    Cs[c_col ? (r / 16) * 16 * 20 + n * 20 + r % 16 : r * 20 + n] = c[x];
  }
  __syncthreads();
  const int w = threadIdx.x / 32;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  const nvcuda::wmma::layout_t cl = c_col ? nvcuda::wmma::mem_col_major : nvcuda::wmma::mem_row_major;
  nvcuda::wmma::load_matrix_sync(acc, Cs + w * 16 * 20, 20, cl);
  for (int kk = 0; kk < 2; kk++) {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, LA> fa;
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, LB> fb;
    const int r0 = w * 16, k0 = kk * 16;
    nvcuda::wmma::load_matrix_sync(fa, As + (a_col ? k0 * 40 + r0 : r0 * 40 + k0) + skew, 40);
    nvcuda::wmma::load_matrix_sync(fb, Bs + (b_col ? k0 : k0 * 40), 40);
    nvcuda::wmma::mma_sync(acc, fa, fb, acc);
  }
  for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f; /* element-wise: any layout */
  const nvcuda::wmma::layout_t dl = d_col ? nvcuda::wmma::mem_col_major : nvcuda::wmma::mem_row_major;
  if (d_col)
    nvcuda::wmma::store_matrix_sync(d + w * 16, acc, 32, dl); /* D^T: 16 x 32 */
  else
    nvcuda::wmma::store_matrix_sync(d + w * 16 * 16, acc, 16, dl);
}

template <typename T, typename LA, typename LB>
static void wmma_case(const char* name, int c_col, int d_col) {
  const int smem = 2 * 32 * 40 * 2 + 32 * 20 * 4;
  float* a = alloc_n<float>(32 * 32);
  float* b = alloc_n<float>(32 * 16);
  float* c = alloc_n<float>(32 * 16);
  float* d = alloc_n<float>(32 * 16);
  uint32_t rng = 777u;
  auto next = [&rng]() { /* small integers and halves: exact in bf16 and f16 */
    rng = rng * 1664525u + 1013904223u;
    return (float)((int)(rng >> 27) - 16) * 0.5f;
  };
  for (int i = 0; i < 32 * 32; i++) a[i] = next();
  for (int i = 0; i < 32 * 16; i++) b[i] = next(), c[i] = next();
  LAUNCH_OK((wmma_kernel<T, LA, LB>), 1, 64, smem, nullptr, (const float*)a, (const float*)b,
            (const float*)c, d, c_col, d_col, 0);
  int bad = 0;
  for (int r = 0; r < 32; r++)
    for (int n = 0; n < 16; n++) {
      double want = c[r * 16 + n];
      for (int k = 0; k < 32; k++) want += (double)a[r * 32 + k] * b[k * 16 + n];
      const float got = d_col ? d[n * 32 + r] : d[r * 16 + n];
      bad += got != (float)(2.0 * want); /* every partial sum is exact in f32 */
    }
  CHECK(bad == 0, "wmma %s (C %s, D %s): %d of 512 wrong", name, c_col ? "col" : "row",
        d_col ? "col" : "row", bad);
#ifdef DT_SIMT_EMULATE
  expect_error("wmma misaligned",
               dt_simt_launch(wmma_kernel<T, LA, LB>, 1, 64, smem, nullptr, (const float*)a,
                              (const float*)b, (const float*)c, d, c_col, d_col, 8),
               DT_SIMT_ERR_LAUNCH_FAILED, "32-byte");
#endif
  test_free(a);
  test_free(b);
  test_free(c);
  test_free(d);
}

static void test_wmma(void) {
  using nvcuda::wmma::col_major;
  using nvcuda::wmma::row_major;
  wmma_case<__nv_bfloat16, row_major, row_major>("bf16 A row B row", 0, 0);
  wmma_case<__nv_bfloat16, row_major, col_major>("bf16 A row B col", 1, 0);
  wmma_case<__half, col_major, row_major>("f16 A col B row", 0, 1);
  wmma_case<__half, col_major, col_major>("f16 A col B col", 1, 1);
}

int main(void) {
#ifndef DT_SIMT_EMULATE
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
#endif
  test_saxpy();
  test_reductions();
  test_warp_ops();
  test_shared();
  test_atomics();
  test_3d();
  test_errors();
  test_conversions();
  test_math();
  test_wmma();
  if (g_failures) {
    fprintf(stderr, "test_simt_emu: %d checks failed\n", g_failures);
    return 1;
  }
  printf("test_simt_emu: all checks passed\n");
  return 0;
}

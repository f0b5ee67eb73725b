/* meta.c - the meta backend: tensors with shapes, dtypes and placements but no memory, for
 * estimating what a run needs without running it (dtensor/backend.h, "meta").
 *
 * alloc hands out addresses from a range no process can map (x86-64 non-canonical addresses,
 * bumped and never reused, so distinct tensors never overlap); nothing ever reads or writes
 * them. Blocks of at most DT__META_REAL_MAX bytes are real (zeroed) host memory instead: the
 * small tensors that carry host values into ops (split counts of an all-to-all, uploaded with
 * dt_tensor_from_full) keep them, so a simulated exchange sees the counts the program gave. Every member is a no-op on that memory, kernels do not run, and the accounting is the
 * cpu backend's: storage rounded and counted by category as the pool does it, the f32 copies a
 * bf16 kernel would get counted as "other" (dt__backend_run_kernel with a kernel that does
 * nothing). Host memory still reaches some members (a gather into the caller's array, a read of
 * a shard into a host buffer): where the destination is real memory and the source meta, the
 * destination is zero-filled; where both are real, the host implementation runs. The library
 * takes its host paths for this backend (it is not a device: no staging), and the public device
 * kind DT_DEVICE_META tells callers that its pointers must not be dereferenced.
 */
#include <stdatomic.h>

#include "backend/backend.h"

/* 2^55: no process maps it (x86-64: non-canonical with 4-level paging; AArch64: past the 48- or
 * 52-bit address space, also with the top byte ignored), so a stray access faults */
#define DT__META_BASE ((uintptr_t)0x0080000000000000ull)
#define DT__META_ALIGN ((uintptr_t)256)
#define DT__META_REAL_MAX 4096

static _Atomic uintptr_t dt__meta_next = DT__META_BASE;

int dt__meta_ptr(const void* p) {
  uintptr_t u = (uintptr_t)p;
  return u >= DT__META_BASE && u < (DT__META_BASE << 1);
}

static void* dt__meta_alloc(dt_backend_t b, size_t nbytes) {
  (void)b;
  if (nbytes <= DT__META_REAL_MAX) return dt__calloc(1, nbytes ? nbytes : 1);
  uintptr_t n = ((uintptr_t)(nbytes ? nbytes : 1) + DT__META_ALIGN - 1) & ~(DT__META_ALIGN - 1);
  uintptr_t p = atomic_fetch_add(&dt__meta_next, n);
  if (p + n >= (DT__META_BASE << 1)) return NULL; /* 4 EiB handed out: never in practice */
  return (void*)p;
}

static void dt__meta_free(dt_backend_t b, void* p, size_t nbytes) {
  (void)b, (void)nbytes;
  if (!dt__meta_ptr(p)) dt__free(p);
}

static dt_status_t dt__meta_memset(dt_backend_t b, void* dst, int value, size_t nbytes) {
  return dt__meta_ptr(dst) ? DT_SUCCESS : dt__host_memset(b, dst, value, nbytes);
}

static dt_status_t dt__meta_fill(dt_backend_t b, void* dst, dt_dtype_t dtype, int64_t n,
                                 double value) {
  return dt__meta_ptr(dst) ? DT_SUCCESS : dt__host_fill(b, dst, dtype, n, value);
}

static dt_status_t dt__meta_copy(dt_backend_t b, void* dst, const void* src, size_t nbytes,
                                 dt_copy_kind_t kind) {
  (void)kind;
  if (dt__meta_ptr(dst) || nbytes == 0) return DT_SUCCESS;
  if (dt__meta_ptr(src)) return dt__host_memset(b, dst, 0, nbytes); /* a read of meta: zeros */
  return dt__host_copy(b, dst, src, nbytes, DT_COPY_H2H);
}

static dt_status_t dt__meta_copy_ranges(dt_backend_t b, void* dst, const void* src, int n,
                                        const int64_t* dst_off, const int64_t* src_off,
                                        const int64_t* nbytes) {
  for (int i = 0; i < n && !dt__meta_ptr(dst); i++)
    DT_CHECK(dt__meta_copy(b, (char*)dst + dst_off[i], (const char*)src + src_off[i],
                           (size_t)nbytes[i], DT_COPY_H2H));
  return DT_SUCCESS;
}

/* A host box copy whose source is meta memory: the box of dst becomes zeros. */
static dt_status_t dt__meta_zero_box(dt_backend_t b, int ndim, size_t item, const int64_t* ext,
                                     void* dst, const int64_t* dst_shape, const int64_t* dst_off) {
  size_t n = item;
  for (int d = 0; d < ndim; d++) n *= (size_t)ext[d];
  if (n == 0) return DT_SUCCESS;
  void* zeros = dt__calloc(1, n);
  if (zeros == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "meta backend: %zu bytes of zeros", n);
  static const int64_t origin[DT_MAX_DIMS] = {0};
  dt_status_t st = dt__host_box_copy(b, ndim, item, ext, dst, dst_shape, dst_off, zeros, ext, origin);
  dt__free(zeros);
  return st;
}

static dt_status_t dt__meta_box_copy(dt_backend_t b, int ndim, size_t item, const int64_t* ext,
                                     void* dst, const int64_t* dst_shape, const int64_t* dst_off,
                                     const void* src, const int64_t* src_shape,
                                     const int64_t* src_off) {
  if (dt__meta_ptr(dst)) return DT_SUCCESS;
  if (dt__meta_ptr(src)) return dt__meta_zero_box(b, ndim, item, ext, dst, dst_shape, dst_off);
  return dt__host_box_copy(b, ndim, item, ext, dst, dst_shape, dst_off, src, src_shape, src_off);
}

static dt_status_t dt__meta_split_copy(dt_backend_t b, int ndim, size_t item, const int64_t* shape,
                                       int dim, int n, const int64_t* offs, const int64_t* lens,
                                       void* array, void* packed, int to_packed) {
  void* dst = to_packed ? packed : array;
  const void* src = to_packed ? array : packed;
  if (dt__meta_ptr(dst)) return DT_SUCCESS;
  if (!dt__meta_ptr(src))
    return dt__host_split_copy(b, ndim, item, shape, dim, n, offs, lens, array, packed, to_packed);
  /* the source is meta: the blocks written are zeros (through a zero source of the same layout) */
  size_t row = item;
  for (int d = 0; d < ndim; d++)
    if (d != dim) row *= (size_t)shape[d];
  int64_t rows = 0;
  for (int q = 0; q < n; q++) rows += lens[q];
  size_t nb = row * (size_t)(to_packed ? shape[dim] : rows); /* the source's extent */
  if (nb == 0) return DT_SUCCESS;
  void* zeros = dt__calloc(1, nb);
  if (zeros == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "meta backend: %zu bytes of zeros", nb);
  dt_status_t st = dt__host_split_copy(b, ndim, item, shape, dim, n, offs, lens,
                                       to_packed ? zeros : array, to_packed ? packed : zeros,
                                       to_packed);
  dt__free(zeros);
  return st;
}

static dt_status_t dt__meta_scale_div(dt_backend_t b, void* buf, dt_dtype_t dtype, int64_t n,
                                      int div) {
  (void)b, (void)buf, (void)dtype, (void)n, (void)div;
  return DT_SUCCESS; /* only ever on tensor memory */
}

static dt_status_t dt__meta_convert(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                                    dt_dtype_t to, int64_t n) {
  (void)b, (void)src, (void)from, (void)dst, (void)to, (void)n;
  return DT_SUCCESS;
}

static dt_status_t dt__meta_reduce(dt_backend_t b, void* dst, const void* a, const void* src,
                                   dt_dtype_t dtype, int64_t n, dt_reduce_op_t op) {
  (void)b, (void)dst, (void)a, (void)src, (void)dtype, (void)n, (void)op;
  return DT_SUCCESS;
}

static dt_status_t dt__meta_gemm(dt_backend_t b, const dt_gemm_t* g) {
  (void)b, (void)g;
  return DT_SUCCESS;
}

/* The simulated clock (backend.h). One per process: a simulation runs one rank on one thread. */
static dt__sim_clock_t dt__clock;

dt__sim_clock_t* dt__sim_clock(void) { return &dt__clock; }
void dt__sim_clock_reset(void) { memset(&dt__clock, 0, sizeof dt__clock); }

void dt__sim_clock_mark(void) {
  double now = dt__clock.now, comm_free = dt__clock.comm_free;
  memset(&dt__clock, 0, sizeof dt__clock);
  dt__clock.now = dt__clock.origin = now;
  dt__clock.comm_free = comm_free;
}

void dt__sim_compute(double us) {
  if (!(us > 0.0)) return;
  dt__clock.now += us;
  dt__clock.compute_us += us;
}

double dt__sim_comm_post(double us, double overlap) {
  double start = dt__clock.comm_free > dt__clock.now ? dt__clock.comm_free : dt__clock.now;
  if (!(us > 0.0)) us = 0.0;
  dt__clock.comm_free = start + us;
  dt__clock.comm_us += us;
  const double busy = (1.0 - overlap) * us; /* the part the rank's own core runs */
  if (busy > 0.0) {
    dt__clock.now += busy;
    dt__clock.exposed_us += busy;
  }
  return dt__clock.comm_free;
}

void dt__sim_wait_until(double t) {
  if (t > dt__clock.now) {
    dt__clock.exposed_us += t - dt__clock.now;
    dt__clock.now = t;
  }
}

/* The scratch the next kernel run holds while it runs (dispatch sets it: the ops layer knows
 * what each host kernel allocates), counted as the cpu backend's kernel counts it. */
static _Thread_local size_t dt__meta_scratch;

void dt__backend_meta_scratch(size_t nbytes) { dt__meta_scratch = nbytes; }

void dt__backend_meta_target(int kernel_set) {
  dt__backend_meta.kernel_set = kernel_set;
  dt__backend_meta.pooled = kernel_set == DT_KERNELS_HOST;
}

static dt_status_t dt__meta_kernel(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                   dt_local_tensor_t* out) {
  (void)call, (void)in, (void)out;
  size_t n = dt__meta_scratch;
  dt__meta_scratch = 0;
  dt__mem_count(DT_MEM_OTHER, (int64_t)n); /* held and released inside the kernel: its peak */
  dt__mem_count(DT_MEM_OTHER, -(int64_t)n);
  return DT_SUCCESS;
}

static dt_status_t dt__meta_run_kernel(dt_backend_t b, dt_op_kernel_fn kernel, unsigned flags,
                                       const dt_op_call_t* call, dt_local_tensor_t* in, int n_in,
                                       dt_local_tensor_t* out, int n_out) {
  (void)kernel; /* the accounting of a run, without the run */
  return dt__backend_run_kernel(b, dt__meta_kernel, flags, call, in, n_in, out, n_out);
}

static const struct dt_backend_i dt__meta_iface = {
    .alloc = dt__meta_alloc,
    .free = dt__meta_free,
    .memset = dt__meta_memset,
    .fill = dt__meta_fill,
    .copy = dt__meta_copy,
    .copy_ranges = dt__meta_copy_ranges,
    .box_copy = dt__meta_box_copy,
    .split_copy = dt__meta_split_copy,
    .scale_div = dt__meta_scale_div,
    .convert = dt__meta_convert,
    .reduce = dt__meta_reduce,
    .gemm = dt__meta_gemm,
    .run_kernel = dt__meta_run_kernel,
};

struct dt_backend dt__backend_meta = {
    .iface = &dt__meta_iface,
    .api_version = DT_BACKEND_API_VERSION,
    .name = "meta",
    .device = DT_DEVICE_META,
    .ordinal = -1,
    .kernel_set = DT_KERNELS_HOST,
    .pooled = 1, /* rounded and cached like the cpu backend's storage */
};

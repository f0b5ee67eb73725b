/* backend.h - internal interface of the backend layer: the memory and compute vtable, storage
 * objects, per-backend workspace, and the host backends (cpu, guarded).
 *
 * Everything above this layer reaches tensor data through a backend: the executor packs, copies
 * and scales with it, the tensor layer fills and uploads with it, dispatch runs kernels through
 * it. Only backend implementations and their kernels (the host kernels of src/ops) dereference
 * tensor data.
 */
#ifndef DT_BACKEND_BACKEND_H
#define DT_BACKEND_BACKEND_H

#include "dtensor/backend.h"
#include "dtensor/strategy.h" /* dt_op_kernel_fn, dt_op_call_t, dt_local_tensor_t */
#include "internal/common.h"

typedef enum dt_copy_kind {
  DT_COPY_H2H = 0, /* both host memory */
  DT_COPY_H2D = 1, /* host -> device */
  DT_COPY_D2H = 2, /* device -> host */
  DT_COPY_D2D = 3, /* within the backend's memory */
} dt_copy_kind_t;

/* How a kernel treats its buffers (from the op's flags). */
enum {
  DT_KERNEL_ANY_DTYPE = 1u << 0,  /* handles bf16/f16 itself (or only moves bytes) */
  DT_KERNEL_WRITES_ALL = 1u << 1, /* writes every output element */
  DT_KERNEL_INPLACE = 1u << 2,    /* updates inputs in place (outputs alias them) */
  DT_KERNEL_ONE_DTYPE = 1u << 3,  /* handles bf16/f16 itself when the call's float inputs and
                                     outputs share one dtype (integer ones, indices, do not
                                     count; a mix: f32 copies, as without a flag) */
};

/* One GEMM (batch times): C_i = alpha op(A_i) op(B_i) + beta C_i (+ bias), row-major, with
 * A_i = a + i * stride_a elements (likewise B, C); op() transposes when trans_* is set; lda, ldb,
 * ldc are row strides in elements. A and B are ab_dtype (f32, bf16 or f16), C is c_dtype (f32 or
 * ab_dtype); products accumulate in f32 (TF32 tensor cores for f32 operands only where the
 * backend allows it: dt_backend_set_tf32). bias (optional): n values of c_dtype added to every
 * row of every C_i after the product (a GEMM epilogue where the backend has one). */
typedef struct dt_gemm {
  int trans_a, trans_b;
  int64_t m, n, k, batch;
  float alpha, beta;
  dt_dtype_t ab_dtype, c_dtype;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c;
  const void* bias;
} dt_gemm_t;

/* The vtable of a backend. Members marked (optional) may be NULL. Pointers are the backend's
 * memory unless a member says otherwise; counts are elements (numel) of `dtype`, sizes bytes. */
struct dt_backend_i {
  /* Allocates nbytes (at least 1); NULL when out of memory (no message). */
  void* (*alloc)(dt_backend_t b, size_t nbytes);
  /* Frees what alloc returned; nbytes as allocated. Stream-ordered on device backends: work
   * already issued may still use the block, only work issued later can get it again. */
  void (*free)(dt_backend_t b, void* p, size_t nbytes);
  /* dst[0 .. nbytes) = byte `value`. */
  dt_status_t (*memset)(dt_backend_t b, void* dst, int value, size_t nbytes);
  /* n elements of dtype set to `value` (rounded like a store of that dtype). */
  dt_status_t (*fill)(dt_backend_t b, void* dst, dt_dtype_t dtype, int64_t n, double value);
  /* Copies nbytes; `kind` says which side is host memory (the other side is this backend's).
   * A copy that reads or writes host memory has finished with it when it returns (the host may
   * reuse or read the buffer at once); device-to-device copies are ordered like kernels. */
  dt_status_t (*copy)(dt_backend_t b, void* dst, const void* src, size_t nbytes,
                      dt_copy_kind_t kind);
  /* n byte ranges within this backend's memory: dst + dst_off[i] <- src + src_off[i], nbytes[i]
   * each (ranges of one call do not overlap one another's destinations). */
  dt_status_t (*copy_ranges)(dt_backend_t b, void* dst, const void* src, int n,
                             const int64_t* dst_off, const int64_t* src_off,
                             const int64_t* nbytes);
  /* Strided box copy between two row-major arrays in this backend's memory (pack/unpack):
   * the box `ext` at src_off of src (extent src_shape) to dst_off of dst (extent dst_shape). */
  dt_status_t (*box_copy)(dt_backend_t b, int ndim, size_t item, const int64_t* ext, void* dst,
                          const int64_t* dst_shape, const int64_t* dst_off, const void* src,
                          const int64_t* src_shape, const int64_t* src_off);
  /* The n blocks of an array of `shape` that are ranges along `dim` (block q: [offs[q],
   * offs[q] + lens[q]) there, whole elsewhere) between the array and `packed` (the blocks back to
   * back, each row-major); to_packed: array -> packed. What redistribution packs and unpacks
   * with when every peer's block is such a range (one pass instead of one box per peer). */
  dt_status_t (*split_copy)(dt_backend_t b, int ndim, size_t item, const int64_t* shape, int dim,
                            int n, const int64_t* offs, const int64_t* lens, void* array,
                            void* packed, int to_packed);
  /* buf[i] = buf[i] / div for n elements (integers truncate toward zero). */
  dt_status_t (*scale_div)(dt_backend_t b, void* buf, dt_dtype_t dtype, int64_t n, int div);
  /* dst (n elements of `to`) = src (n elements of `from`) converted. */
  dt_status_t (*convert)(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                         dt_dtype_t to, int64_t n);
  /* dst[i] = a[i] op src[i] for n elements (sum, max or min; the local step of a reduction built
   * from an all-to-all). a may be dst (in place); otherwise no operand overlaps dst. */
  dt_status_t (*reduce)(dt_backend_t b, void* dst, const void* a, const void* src,
                        dt_dtype_t dtype, int64_t n, dt_reduce_op_t op);
  /* GEMM, `batch` times (see dt_gemm_t): f32 accumulation whatever the operand dtypes. */
  dt_status_t (*gemm)(dt_backend_t b, const dt_gemm_t* g);
  /* Runs one op's kernel slot for this backend's device on local shards (the op table's kernel)
   * with DT_KERNEL_* flags: without DT_KERNEL_ANY_DTYPE the kernel sees f32 copies of bf16/f16
   * storage. */
  dt_status_t (*run_kernel)(dt_backend_t b, dt_op_kernel_fn kernel, unsigned flags,
                            const dt_op_call_t* call, dt_local_tensor_t* in, int n_in,
                            dt_local_tensor_t* out, int n_out);
  /* Waits until every operation issued on the backend has finished (optional: NULL for
   * backends whose calls finish before they return). Called where data leaves the backend's
   * order: a pointer handed to the caller (dt_tensor_to_local), dt_backend_synchronize. */
  dt_status_t (*synchronize)(dt_backend_t b);
  /* Ordering without the host waiting (optional: all NULL for synchronous backends). An event
   * marks the point of the backend's compute stream that everything issued so far reaches.
   * record: a new event there; wait: work issued later runs after it; query: *done = 1 once
   * reached; sync: the host waits for it; free: releases it (after a pending record it is still
   * safe: the backend keeps it until reached). */
  dt_status_t (*event_record)(dt_backend_t b, void** ev);
  dt_status_t (*event_wait)(dt_backend_t b, void* ev);
  dt_status_t (*event_query)(dt_backend_t b, void* ev, int* done);
  dt_status_t (*event_sync)(dt_backend_t b, void* ev);
  void (*event_free)(dt_backend_t b, void* ev);
  /* Host memory for staging transfers to and from the backend (optional: NULL means plain
   * dt__malloc; CUDA: page-locked memory, which copies run from asynchronously). */
  void* (*host_alloc)(dt_backend_t b, size_t nbytes);
  void (*host_free)(dt_backend_t b, void* p, size_t nbytes);
  /* Releases what the backend caches (allocator pools, library handles, streams) at
   * dt_finalize (optional); live tensors keep their memory. */
  void (*release)(dt_backend_t b);
  /* Checks the backend's own bookkeeping (optional); see dt_backend_verify. */
  dt_status_t (*verify)(dt_backend_t b, int64_t* n_errors);
};

#define DT_BACKEND_API_VERSION 2
#define DT_WS_SLOTS 4 /* 0: send packing, 1-2: ping-pong intermediates, 3: receive unpacking */

struct dt_backend {
  const struct dt_backend_i* iface;
  void* context; /* implementation state */
  int api_version;
  const char* name;
  dt_device_t device;
  int ordinal; /* the device's index among its kind (-1: host memory) */
  int kernel_set; /* which kernels run on it (dt_kernel_set_t: the ops layer owns the tables) */
  int allow_tf32; /* f32 GEMMs may use TF32 (dt_backend_set_tf32) */
  /* the cost model's price of host staging (a device backend whose communication goes through
   * host memory): per copy between the device and the host, a latency and a bandwidth; 0 GB/s for
   * host backends (no staging) */
  double stage_us, stage_gbps;
  int pooled; /* storage of 64 KiB and more is cached in the storage pool */
  /* persistent workspace of blocking redistributions (grow-only, backend memory) */
  void* ws[DT_WS_SLOTS];
  size_t ws_cap[DT_WS_SLOTS];
  /* persistent host staging of blocking redistributions on a device backend (grow-only: 0 the
   * source, 1 the target; host_alloc memory) */
  void* stage[2];
  size_t stage_cap[2];
  int64_t live_nbytes, live_blocks; /* allocation accounting (dt_backend_memory) */
};

/* The kernel tables a backend can name (struct dt_backend.kernel_set): the host kernels of the op
 * table, or the CUDA kernels compiled for a GPU or for the SIMT emulator (src/ops/cuda). */
typedef enum dt_kernel_set {
  DT_KERNELS_HOST = 0,
  DT_KERNELS_CUDA = 1,
  DT_KERNELS_CUDA_EMU = 2,
  DT_KERNELS_COUNT
} dt_kernel_set_t;

/* The built-in backends (src/backend/cpu.c, src/backend/guarded.c, src/backend/meta.c). */
extern struct dt_backend dt__backend_cpu;
extern struct dt_backend dt__backend_guarded;
extern struct dt_backend dt__backend_meta;
/* 1 when p is an address the meta backend handed out (never dereferenced: no memory behind it). */
int dt__meta_ptr(const void* p);
/* The scratch (bytes, "other") the next kernel run on the meta backend holds while it runs: what
 * the host kernel would allocate (dispatch sets it before each run on the meta backend). */
void dt__backend_meta_scratch(size_t nbytes);
/* The kernel set the meta backend plays (dt_sim_set_device): its kernels' dtype handling and
 * scratch; a device set also counts storage at its exact size (device allocators do not round
 * like the host's storage pool). DT_KERNELS_HOST restores the default. */
void dt__backend_meta_target(int kernel_set);
/* The simulated clock of a run on the meta backend (dt_init_simulated): this rank's compute
 * stream, on which kernels and blocking waits advance the time, and one communication stream on
 * which collectives run in the order posted, each starting when posted or when the previous one
 * ends. Microseconds from the last reset. Only the simulation feeds it (dispatch, the executor,
 * works); dt_sim_time_get reads it. */
typedef struct dt__sim_clock {
  double now;       /* the compute stream */
  double origin;    /* `now` at the last dt_sim_time_reset (the clock itself runs on) */
  double comm_free; /* when the communication stream finishes what was posted */
  double compute_us, comm_us, exposed_us; /* kernels; collectives; waits on them */
  double flops, nbytes;                   /* matrix products' FLOPs; other kernels' bytes */
  uint64_t ops;
} dt__sim_clock_t;
dt__sim_clock_t* dt__sim_clock(void);
void dt__sim_clock_reset(void);
/* Zeroes the sums and starts the elapsed time here (what is in flight keeps its end). */
void dt__sim_clock_mark(void);
/* A kernel of `us` on the compute stream. */
void dt__sim_compute(double us);
/* A collective of `us` posted now: returns when it ends. The fraction 1 - overlap of it keeps
 * the compute stream busy at once (counted as exposed): work the rank's own core does. */
double dt__sim_comm_post(double us, double overlap);
/* The compute stream waits until time t (a collective's end): the wait counts as exposed. */
void dt__sim_wait_until(double t);
/* Adds a backend to the list dt_backend_get searches (at most DT_MAX_BACKENDS). */
#define DT_MAX_BACKENDS 16
dt_status_t dt__backend_register(dt_backend_t b);
/* The CUDA backends (src/backend/cuda.c, built with DTENSOR_CUDA; src/backend/cuda_emu.c, built
 * with the SIMT emulator): the backend of device `ordinal` (-1: this rank's device: the local
 * rank modulo the device count, or $DTENSOR_CUDA_DEVICE), opened on first use.
 * DT_ERR_UNSUPPORTED when the build has none, DT_ERR_CUDA when no usable device exists. */
dt_status_t dt__backend_cuda_open(int ordinal, dt_backend_t* out);
dt_status_t dt__backend_cuda_emu_open(dt_backend_t* out);

/* ---- storage: reference-counted memory of one backend (src/backend/storage.c) ------------- */
typedef struct dt_storage {
  int refcount;
  dt_backend_t backend;
  void* ptr;
  size_t nbytes; /* counted: the request rounded to the pool's class (dt__pool_counted) */
  size_t block;  /* the block the pool handed out (at least nbytes; what its free takes back) */
  int owned; /* allocated by the backend (freed with the last reference); else borrowed */
  int category; /* dt_mem_category_t its bytes count under (owned storage) */
} dt_storage_t;

/* Memory accounting (dt_memory_stats): nbytes more (or fewer, when negative) under category c. */
void dt__mem_count(int c, int64_t nbytes);
/* A window over one kernel run: begin returns category c's current bytes and lets its peak
 * restart from them (the old peak saved in *saved_peak); end returns the most bytes held above
 * the start in between and restores the peak (the larger of the two). */
int64_t dt__mem_window_begin(int c, int64_t* saved_peak);
int64_t dt__mem_window_end(int c, int64_t start, int64_t saved_peak);
/* Moves an owned storage's bytes to category c. */
void dt__storage_set_category(dt_storage_t* s, int c);

/* New owned storage of nbytes (zero-filled or not) from the backend (through the pool). */
dt_status_t dt__storage_new(dt_backend_t b, size_t nbytes, int zero, dt_storage_t** out);
/* Storage over caller memory (never freed by the library). */
dt_status_t dt__storage_borrow(dt_backend_t b, void* ptr, size_t nbytes, dt_storage_t** out);
void dt__storage_retain(dt_storage_t* s);
void dt__storage_release(dt_storage_t* s);

/* ---- workspace and helpers ----------------------------------------------------------------- */
/* Grows workspace slot `slot` of backend b to at least nbytes (no-op when big enough). */
dt_status_t dt__ws_reserve(dt_backend_t b, int slot, size_t nbytes, void** out);
/* Grows host staging slot `slot` (0 or 1) of device backend b to at least nbytes. */
dt_status_t dt__stage_reserve(dt_backend_t b, int slot, size_t nbytes, void** out);
/* Frees every backend's workspace, the storage pool and the guarded quarantine (dt_finalize). */
void dt__backend_release_all(void);
void dt__guarded_release(void);
/* Default backend (the env choice is read once). */
dt_backend_t dt__backend_default(void);
/* DT_SUCCESS for a library backend handle, else DT_ERR_INVALID_ARG. */
dt_status_t dt__backend_check(dt_backend_t b);
/* Bytes and blocks allocated through the backend (tensor storage and workspace). */
void* dt__backend_alloc(dt_backend_t b, size_t nbytes);
void dt__backend_free(dt_backend_t b, void* p, size_t nbytes);
/* The same through the storage pool (storage.c) for a pooled backend: a block of at least nbytes
 * (its size in *got, which the free takes back). For buffers that every step makes again, such as
 * a kernel's f32 copies of bf16 operands: a fresh block costs a page fault per 4 KiB. */
void* dt__pool_alloc(dt_backend_t b, size_t nbytes, size_t* got);
void dt__pool_free(dt_backend_t b, void* p, size_t got);
/* What a block of nbytes counts as in memory statistics: its class size on a pooled backend
 * (a cached block handed out for it may be up to a quarter larger), else nbytes; the same on
 * the meta backend, so that estimates equal real runs. */
size_t dt__pool_counted(dt_backend_t b, size_t nbytes);

/* f32 GEMM through a backend (the helper the host kernels call; see dt_gemm_t). */
dt_status_t dt__gemm(dt_backend_t b, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* a, int64_t lda, const float* bm, int64_t ldb,
                     float beta, float* c, int64_t ldc);
dt_status_t dt__gemm_batched(dt_backend_t b, int trans_a, int trans_b, int64_t m, int64_t n,
                             int64_t k, float alpha, const float* a, int64_t lda, int64_t sa,
                             const float* bm, int64_t ldb, int64_t sb, float beta, float* c,
                             int64_t ldc, int64_t sc, int64_t batch);
/* Host staging memory of backend b (its host_alloc, else dt__malloc) and its release. */
void* dt__host_stage_alloc(dt_backend_t b, size_t nbytes);
void dt__host_stage_free(dt_backend_t b, void* p, size_t nbytes);
/* 1 when b computes on memory the host cannot read directly and reaches through copies (a device
 * backend: collectives stage through host memory). The meta backend takes the host paths: its
 * members never touch its own memory. */
static inline int dt__backend_is_device(dt_backend_t b) { return b->device == DT_DEVICE_CUDA; }
/* The device whose kernel table b runs (the meta backend runs the host table's, as no-ops). */
static inline dt_device_t dt__backend_kernel_device(dt_backend_t b) {
  return b->device == DT_DEVICE_META ? DT_DEVICE_HOST : b->device;
}

/* ---- the host implementation both host backends share (src/backend/cpu.c) ------------------ */
/* When OpenBLAS runs its generic kernels on a CPU with AVX2 / AVX-512 and OPENBLAS_CORETYPE is
 * not set, switches it to the kernels the CPU allows (unless DTENSOR_BLAS_AUTOCORE=0) and returns
 * a one-line notice saying what it did or why not (dt_init prints it on rank 0); NULL when there
 * is nothing to say. Called by dt_init, before any BLAS call of the library. */
const char* dt__cpu_blas_select(void);
dt_status_t dt__host_memset(dt_backend_t b, void* dst, int value, size_t nbytes);
dt_status_t dt__host_fill(dt_backend_t b, void* dst, dt_dtype_t dtype, int64_t n, double value);
dt_status_t dt__host_copy(dt_backend_t b, void* dst, const void* src, size_t nbytes,
                          dt_copy_kind_t kind);
dt_status_t dt__host_split_copy(dt_backend_t b, int ndim, size_t item, const int64_t* shape,
                                int dim, int n, const int64_t* offs, const int64_t* lens,
                                void* array, void* packed, int to_packed);
dt_status_t dt__host_box_copy(dt_backend_t b, int ndim, size_t item, const int64_t* ext, void* dst,
                              const int64_t* dst_shape, const int64_t* dst_off, const void* src,
                              const int64_t* src_shape, const int64_t* src_off);
dt_status_t dt__host_scale_div(dt_backend_t b, void* buf, dt_dtype_t dtype, int64_t n, int div);
dt_status_t dt__host_convert(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                             dt_dtype_t to, int64_t n);
dt_status_t dt__host_reduce(dt_backend_t b, void* dst, const void* a, const void* src,
                            dt_dtype_t dtype, int64_t n, dt_reduce_op_t op);
dt_status_t dt__host_copy_ranges(dt_backend_t b, void* dst, const void* src, int n,
                                 const int64_t* dst_off, const int64_t* src_off,
                                 const int64_t* nbytes);
dt_status_t dt__host_gemm(dt_backend_t b, const dt_gemm_t* g);
/* Runs a kernel on local shards for any backend: where dt__run_kernel_converts says so, bf16/f16
 * inputs and outputs are handed to the kernel as f32 copies made with the backend's convert (and
 * the outputs converted back). */
dt_status_t dt__backend_run_kernel(dt_backend_t b, dt_op_kernel_fn kernel, unsigned flags,
                                   const dt_op_call_t* call, dt_local_tensor_t* in, int n_in,
                                   dt_local_tensor_t* out, int n_out);
/* Whether dt__backend_run_kernel hands a kernel with these flags f32 copies of this call's
 * bf16/f16 tensors: some tensor is bf16/f16, and neither DT_KERNEL_ANY_DTYPE nor
 * DT_KERNEL_ONE_DTYPE with every float tensor of one dtype. */
int dt__run_kernel_converts(unsigned flags, const dt_local_tensor_t* in, int n_in,
                            const dt_local_tensor_t* out, int n_out);
/* The bytes of the f32 copies dt__backend_run_kernel makes for a kernel with these flags. */
size_t dt__run_kernel_copies_nbytes(unsigned flags, const dt_local_tensor_t* in, int n_in,
                                    const dt_local_tensor_t* out, int n_out);

#endif

/* cuda_ops.h - what every CUDA op-kernel file of src/ops/cuda includes: the SIMT layer (real CUDA
 * under nvcc, the host emulator with DT_SIMT_EMULATE), the library's internal C interfaces, and
 * small helpers shared by the kernels (streams, launch sizing, dtype loads and stores, block
 * reductions, scratch memory, error reporting).
 *
 * Conventions of the op kernels (each file keeps them; the conformance test checks the results
 * against the host kernels of src/ops/kernels_*.c, which define what every op computes):
 * - A kernel has the signature of dt_op_kernel_fn and is registered for its op by its file's
 *   fill function (DT_CUDA_NAME(fill_<file>), called by table.cu), with DT_KERNEL_ANY_DTYPE when
 *   it takes bf16/f16 storage itself; without it dt__backend_run_kernel hands it f32 copies.
 *   Ops the op table marks DT_OPF_ANY_DTYPE (byte moves, casts, in-place updates) must be
 *   registered with DT_KERNEL_ANY_DTYPE.
 * - Inputs and outputs are dense row-major local shards in the backend's memory
 *   (dt_local_tensor_t); a built-in kernel writes every output element (outputs are not zeroed
 *   first); inputs are never written except by in-place ops.
 * - Everything is issued on the backend's compute stream (dt_cu_stream); nothing synchronizes the
 *   host. Scratch comes from the backend's caching allocator (dt_cu_scratch) and is freed before
 *   the kernel returns (freeing is stream-ordered, see backend.h).
 * - Scalar and integer arguments and their defaults are read exactly as the host kernel reads
 *   them (dt__op_farg and the same parsing helpers), so both kernels agree on every call.
 * - Errors: DT_FAIL with the op name; a launch failure through DT_CU_LAUNCH.
 */
#ifndef DT_OPS_CUDA_CUDA_OPS_H
#define DT_OPS_CUDA_CUDA_OPS_H

#include "backend/simt.h"

extern "C" {
#include "backend/cuda.h"
#include "ops/ops.h"

/* Ring attention's fused blocks (attention.cu; ring.cu's dt__ring_rows_t members). */
int DT_CUDA_NAME(ring_fused)(const dt__ring_geom_t* g, int64_t C);
dt_status_t DT_CUDA_NAME(ring_block_fwd)(const dt__ring_geom_t* g, const void* q, const void* k,
                                         const void* v, int64_t qr, int64_t kr, int64_t C,
                                         int diag, float* o, float* m, float* l);
dt_status_t DT_CUDA_NAME(ring_block_bwd)(const dt__ring_geom_t* g, const void* q, const void* k,
                                         const void* v, const void* go, const float* lse,
                                         const float* dd, int64_t qr, int64_t kr, int64_t C,
                                         int diag, float* dq, float* dk, float* dv);
}

/* ---- registration ------------------------------------------------------------------------ */
/* The kernel-table fill function of one kernel file (table.cu calls every one). */
#define DT_CU_FILL(file) extern "C" void DT_CUDA_NAME(fill_##file)(dt_device_kernel_t * t)
/* A kernel definition: static, of type dt_op_kernel_fn. */
#define DT_CU_KERNEL(name)                                                                 \
  static dt_status_t name(const dt_op_call_t* call, const dt_local_tensor_t* in,            \
                          dt_local_tensor_t* out)

/* ---- stream, sizes, launches ------------------------------------------------------------- */
static inline cudaStream_t dt_cu_backend_stream(dt_backend_t b) {
  return (cudaStream_t)DT_CUDA_NAME(stream)(b);
}
static inline cudaStream_t dt_cu_stream(const dt_local_tensor_t* t) {
  return dt_cu_backend_stream(t->backend);
}

static inline int64_t dt_cu_numel(const dt_local_tensor_t* t) { return dt__local_numel(t); }

#define DT_CU_BLOCK 256

/* Blocks for a grid-stride loop over n items, block threads each, on a device of sms SMs: enough
 * to fill the device a few times over, never more than the items need (at least 1). */
static inline unsigned dt_cu_grid_sms(int64_t n, int sms, int block = DT_CU_BLOCK) {
  int64_t want = (n + block - 1) / block, cap = (int64_t)sms * 8;
  if (want > cap) want = cap;
  return (unsigned)(want < 1 ? 1 : want);
}
/* The same on t's device. */
static inline unsigned dt_cu_grid(const dt_local_tensor_t* t, int64_t n, int block = DT_CU_BLOCK) {
  return dt_cu_grid_sms(n, DT_CUDA_NAME(sm_count)(t->backend), block);
}

/* The device a simulated run of this kernel set plays (dt_sim_set_device; the kernels' scratch
 * functions size their scratch for it): the emulator's, or an H100's / H200's (132 SMs, 227 KiB
 * of shared memory per block). */
#ifdef DT_SIMT_EMULATE
#define DT_CU_SIM_SMS DT_CU_EMU_SM_COUNT
#else
#define DT_CU_SIM_SMS 132
#endif
#define DT_CU_SIM_SMEM ((size_t)227 * 1024)
/* The SMs of t's device, or of the device a simulated run plays (t on the meta backend): the
 * scratch functions size for whichever runs them (DTENSOR_CHECK_SCRATCH compares them with the
 * kernels on a real device too). */
static inline int dt_cu_sms_of(const dt_local_tensor_t* t) {
  return t->backend->device == DT_DEVICE_META ? DT_CU_SIM_SMS : DT_CUDA_NAME(sm_count)(t->backend);
}
/* A scratch function (dt_kernel_scratch_fn) definition: static. */
#define DT_CU_SCRATCH(name)                                                                 \
  static size_t name(const dt_op_call_t* call, const dt_local_tensor_t* in,                 \
                     const dt_local_tensor_t* out)

/* Launches and returns a status on failure (the launch is asynchronous on a GPU: errors inside
 * the kernel surface at the next synchronization). */
#define DT_CU_LAUNCH(what, kernel, grid, block, smem, stream, ...)                         \
  do {                                                                                     \
    int dt_cu_rc_ = dt_simt_launch(kernel, grid, block, smem, stream, __VA_ARGS__);         \
    if (dt_cu_rc_ != 0) return DT_CUDA_NAME(status)(dt_cu_rc_, what);                      \
  } while (0)

/* ---- dtype loads and stores (float storage types: float, __nv_bfloat16, __half) ---------- */
__device__ __forceinline__ float dt_cu_f32(float v) { return v; }
__device__ __forceinline__ float dt_cu_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float dt_cu_f32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T dt_cu_from_f32(float v);
template <>
__device__ __forceinline__ float dt_cu_from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 dt_cu_from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half dt_cu_from_f32<__half>(float v) {
  return __float2half_rn(v);
}

/* Calls f(T{}) with T the storage type of float dtype dt (a generic lambda takes the tag as
 * `auto tag` and names the type decltype(tag)); DT_ERR_UNSUPPORTED for other dtypes. */
template <typename F>
static inline dt_status_t dt_cu_float_dispatch(const char* op, dt_dtype_t dt, F&& f) {
  switch (dt) {
    case DT_F32: return f(float{});
    case DT_BF16: return f(__nv_bfloat16{});
    case DT_F16: return f(__half{});
    default:
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not a float dtype", op,
                     dt_dtype_name(dt));
  }
}

/* DT_ERR_UNSUPPORTED unless t holds floats of any width (the kernels registered for any dtype
 * reject integers as the host kernels, which take f32 only, do). */
static inline dt_status_t dt_cu_need_float(const dt_op_call_t* call, const dt_local_tensor_t* t) {
  if (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16) return DT_SUCCESS;
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not supported by its CUDA kernel", call->op,
                 dt_dtype_name(t->dtype));
}
/* The float dtype that inputs 0..n_in-1 (less those in the bit mask `skip`: index tensors) and
 * outputs 0..n_out-1 share, in *dt; DT_ERR_UNSUPPORTED for anything else. The kernels that read
 * bf16/f16 storage in place run their arithmetic in one storage type (the runner gives a call
 * that mixes float dtypes f32 copies: see dt__run_kernel_converts), so this rejects an integer
 * where a float belongs, or a call made around the runner. */
static inline dt_status_t dt_cu_one_float(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                          int n_in, unsigned skip, const dt_local_tensor_t* out,
                                          int n_out, dt_dtype_t* dt) {
  int first = -1;
  *dt = DT_DTYPE_COUNT; /* no tensor to look at: a dtype every kernel refuses */
  for (int i = 0; i < n_in + n_out; i++) {
    if (i < n_in && (skip >> i & 1u)) continue;
    const dt_dtype_t d = i < n_in ? in[i].dtype : out[i - n_in].dtype;
    if (first < 0) {
      first = i;
      *dt = d;
      if (d != DT_F32 && d != DT_BF16 && d != DT_F16)
        return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not supported (float dtypes only)",
                       call->op, dt_dtype_name(d));
    } else if (d != *dt) {
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: %s %d is %s, %s %d is %s", call->op,
                     i < n_in ? "input" : "output", i < n_in ? i : i - n_in, dt_dtype_name(d),
                     first < n_in ? "input" : "output", first < n_in ? first : first - n_in,
                     dt_dtype_name(*dt));
    }
  }
  return DT_SUCCESS;
}
/* DT_ERR_UNSUPPORTED unless the first n tensors are f32 (kernels registered without
 * DT_KERNEL_ANY_DTYPE see f32 copies of half storage; integers must not reach them). */
static inline dt_status_t dt_cu_need_f32(const dt_op_call_t* call, const dt_local_tensor_t* t,
                                         int n) {
  for (int i = 0; i < n; i++)
    if (t[i].dtype != DT_F32)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: dtype %s is not supported by its CUDA kernel",
                     call->op, dt_dtype_name(t[i].dtype));
  return DT_SUCCESS;
}

/* ---- reductions inside a block ----------------------------------------------------------- */
__device__ __forceinline__ float dt_cu_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float dt_cu_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
 * smem: 32 floats of shared memory; the call synchronizes the block twice. */
__device__ __forceinline__ float dt_cu_block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = dt_cu_warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float s = lane < nw ? smem[lane] : 0.0f;
  s = dt_cu_warp_sum(s);
  __syncthreads(); /* smem may be reused by the caller */
  return s;
}

/* Max of v over the block (as dt_cu_block_sum). */
__device__ __forceinline__ float dt_cu_block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = dt_cu_warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float s = lane < nw ? smem[lane] : -INFINITY;
  s = dt_cu_warp_max(s);
  __syncthreads(); /* smem may be reused by the caller */
  return s;
}

/* ---- scratch ----------------------------------------------------------------------------- */
/* The bytes a scratch request of nbytes takes (an empty one takes 1: every block is distinct). */
static inline size_t dt_cu_scratch_size(size_t nbytes) { return nbytes ? nbytes : 1; }
/* nbytes of device memory for the duration of one kernel (counted as "other"). */
static inline dt_status_t dt_cu_scratch(const dt_local_tensor_t* t, const char* op, size_t nbytes,
                                        void** out) {
  *out = dt__backend_alloc(t->backend, dt_cu_scratch_size(nbytes));
  if (*out == NULL)
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: %zu bytes of device scratch", op, nbytes);
  dt__mem_count(DT_MEM_OTHER, (int64_t)dt_cu_scratch_size(nbytes));
  return DT_SUCCESS;
}
static inline void dt_cu_scratch_free(const dt_local_tensor_t* t, void* p, size_t nbytes) {
  if (p == NULL) return;
  dt__backend_free(t->backend, p, dt_cu_scratch_size(nbytes));
  dt__mem_count(DT_MEM_OTHER, -(int64_t)dt_cu_scratch_size(nbytes));
}

#endif

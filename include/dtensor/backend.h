/* dtensor/backend.h - where tensor data lives and which code computes on it.
 *
 * A device type names a kind of memory. A backend is one implementation of memory and compute for
 * a device type, with its own kernels for the ops:
 *   cpu      host memory through the storage pool, OpenBLAS GEMM and the library's kernels;
 *   guarded  host memory for tests: every allocation sits between guard regions, freed memory is
 *            poisoned and quarantined, every copy, fill and GEMM operand is bounds-checked
 *            against its block, outputs are poisoned before a kernel writes them, and guard
 *            regions are checked after every kernel (dt_backend_verify reports any damage);
 *   cuda     GPU memory of one device ("cuda:N" names device N; "cuda" is this rank's device:
 *            the local rank modulo the device count, or $DTENSOR_CUDA_DEVICE), the library's CUDA
 *            kernels and cuBLASLt, all issued on one compute stream per device; only in builds
 *            configured with DTENSOR_CUDA, and only where a GPU and its driver are usable;
 *   cuda-emu the CUDA backend's kernels run on the host by a SIMT emulator, on memory the
 *            library treats as device memory (host-staged communication, device-side copies):
 *            how machines without a GPU test the device paths (slow; for tests only).
 * Backends are process-wide objects owned by the library (never destroyed by the caller).
 * Tensors of a device backend are read and written through dt_tensor_read_local and friends;
 * communication stages them through host memory (the MPI comm is not CUDA-aware).
 *
 * Each mesh has a backend (dt_mesh_set_backend); tensors created on the mesh allocate from it, and
 * ops run on their inputs' backend. New meshes take the default backend: the cpu backend, or the
 * one named by $DTENSOR_BACKEND ("cpu" or "guarded"), or the one set by dt_backend_set_default.
 */
#ifndef DTENSOR_BACKEND_H
#define DTENSOR_BACKEND_H

#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_device {
  DT_DEVICE_HOST = 0, /* ordinary process memory */
  DT_DEVICE_CUDA = 1, /* CUDA device memory */
  DT_DEVICE_META = 2, /* none: the meta backend's tensors have shapes, not bytes (never
                       * dereference its pointers; reads into host memory give zeros) */
  DT_DEVICE_COUNT
} dt_device_t;

/* "host", "cuda", "meta"; "invalid" out of range. */
DT_API const char* dt_device_name(dt_device_t device);

typedef struct dt_backend* dt_backend_t;

/* The backend called `name` ("cpu", "guarded", "cuda", "cuda:N", "cuda-emu", "meta"), opened on
 * first use. "meta": tensors without memory whose ops and collectives do nothing but count (the
 * memory a run would take, per category in dt_memory_stats, as the cpu backend takes it). DT_ERR_UNSUPPORTED when this build has no such backend, DT_ERR_CUDA (with the driver's
 * reason) when CUDA is built in but no usable GPU exists; the host backends are unaffected. */
DT_API dt_status_t dt_backend_get(const char* name, dt_backend_t* out);
/* The backend new meshes take. */
DT_API dt_status_t dt_backend_default(dt_backend_t* out);
DT_API dt_status_t dt_backend_set_default(dt_backend_t backend);
/* Name ("cpu") and device type of a backend. */
DT_API const char* dt_backend_name(dt_backend_t backend);
DT_API dt_status_t dt_backend_device(dt_backend_t backend, dt_device_t* device);
/* Index of the backend's device among devices of its kind (-1 for host memory). */
DT_API dt_status_t dt_backend_ordinal(dt_backend_t backend, int* ordinal);
/* Waits until everything the library issued on the backend has finished (a no-op on host
 * backends): before timing, or before another CUDA stream of the caller's reads library memory.
 * dt_tensor_to_local does it for the caller. */
DT_API dt_status_t dt_backend_synchronize(dt_backend_t backend);
/* Whether f32 GEMMs may run on TF32 tensor cores (default 0: full f32 products, as PyTorch's
 * default "highest" matmul precision). Ignored by host backends. */
DT_API dt_status_t dt_backend_set_tf32(dt_backend_t backend, int allow);
/* Checks the backend's own consistency: for the guarded backend, every live block's guard
 * regions and every quarantined block's poison. DT_ERR_INTERNAL with the first damaged block
 * (its size and the offset of the first bad byte) when something wrote where it must not; the
 * count of problems found so far goes to *n_errors (may be NULL). A no-op for the cpu backend. */
DT_API dt_status_t dt_backend_verify(dt_backend_t backend, int64_t* n_errors);
/* Bytes the backend currently holds for live tensors and workspace, and the blocks behind them
 * (allocation counting; cached pool blocks are not included). These are the blocks' real sizes:
 * on a pooled host backend a reused block may be up to a quarter larger than the size class
 * that dt_memory_stats counts for its tensor. */
DT_API dt_status_t dt_backend_memory(dt_backend_t backend, int64_t* nbytes, int64_t* blocks);

/* ---- memory accounting ----
 * Bytes this rank's library holds on every backend, by what they are for, current and peak (since
 * dt_init or dt_memory_reset_peak). Tensor storage starts as "other"; autograd tags a leaf that
 * requires a gradient as a parameter, the values it records as activations and gradients
 * (parameters' and, during a backward pass, intermediates') as gradients; the optimizer tags its state; the redistribution scratch, workspace and buffers of
 * asynchronous works count as communication. Memory the caller lends (dt_tensor_from_local) is
 * not counted; a kernel's own scratch (attention scores, dtype conversion) counts as other. */
typedef enum dt_mem_category {
  DT_MEM_PARAMETERS = 0,
  DT_MEM_GRADIENTS = 1,
  DT_MEM_OPTIMIZER = 2,
  DT_MEM_ACTIVATIONS = 3,
  DT_MEM_COMMUNICATION = 4,
  DT_MEM_OTHER = 5,
  DT_MEM_COUNT
} dt_mem_category_t;
typedef struct dt_memory_stats {
  int64_t current[DT_MEM_COUNT]; /* bytes held now */
  int64_t peak[DT_MEM_COUNT];    /* the most held at once, per category */
  int64_t total_current;         /* sum of current */
  int64_t total_peak;            /* the most held at once in all (not the sum of the peaks) */
} dt_memory_stats_t;
/* "parameters", "gradients", "optimizer", "activations", "communication", "other"; "invalid". */
DT_API const char* dt_mem_category_name(dt_mem_category_t c);
/* This process's figures; the peaks restart at dt_init and dt_init_simulated (a simulated
 * estimate's peaks do not carry into the real run that follows it). */
DT_API dt_status_t dt_memory_stats(dt_memory_stats_t* out);
/* Peaks restart from the current values. */
DT_API dt_status_t dt_memory_reset_peak(void);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_BACKEND_H */

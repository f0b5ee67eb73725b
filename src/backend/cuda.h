/* cuda.h - internal interface of the CUDA backend (src/backend/cuda.cu) for the CUDA kernels of
 * the ops layer (src/ops/cuda): the compute stream, launch sizing and error reporting.
 *
 * One source, two builds: nvcc compiles cuda.cu and the kernels into the "cuda" backend; g++
 * compiles the same files with DT_SIMT_EMULATE into the "cuda-emu" backend, whose kernels run on
 * the host through the SIMT emulator (src/backend/simt_emu.cpp) and whose device memory is host
 * memory the library treats as device memory. DT_CUDA_NAME gives every symbol of either build
 * its own prefix (dt__cuda_ / dt__cudaemu_) so both link into one library.
 *
 * C-compatible: included inside extern "C" by C++ and CUDA files.
 */
#ifndef DT_BACKEND_CUDA_H
#define DT_BACKEND_CUDA_H

#include "backend/backend.h"

#ifdef DT_SIMT_EMULATE
#define DT_CUDA_NAME(x) dt__cudaemu_##x
#else
#define DT_CUDA_NAME(x) dt__cuda_##x
#endif

/* The compute stream of CUDA backend b (a cudaStream_t): every kernel, copy and GEMM the library
 * issues for b goes to it, so they run in issue order without the host waiting. */
void* DT_CUDA_NAME(stream)(dt_backend_t b);
/* Streaming multiprocessors of b's device (launch sizing: grid-stride kernels launch a few
 * blocks per SM; the emulator reports a small number so that emulated launches stay short). */
int DT_CUDA_NAME(sm_count)(dt_backend_t b);
/* A status for CUDA runtime error `err` (cudaError_t) of `what` (e.g. "softmax launch"), with the
 * runtime's text; DT_SUCCESS for 0. An out-of-memory error is DT_ERR_OUT_OF_MEMORY, anything
 * else DT_ERR_CUDA. Clears the runtime's sticky last error. */
dt_status_t DT_CUDA_NAME(status)(int err, const char* what);
/* The caching allocator of CUDA backend b (see cuda.cu): bytes handed out and not yet freed
 * (live), bytes kept in its free lists (cached), the most ever live at once (peak), and how many
 * times it called cudaMalloc (mallocs: a request served from the cache leaves it unchanged).
 * Sizes are the rounded size classes the allocator works in. Any output may be NULL.
 * DT_ERR_INVALID_ARG when b is not a backend of this build ("cuda" or "cuda-emu"). Freeing is
 * stream-ordered: a freed block goes back to the cache at once and may be handed out while work
 * already issued on b's stream still uses it; only work issued later sees the new owner's data,
 * because everything of b runs in issue order on that one stream. */
dt_status_t DT_CUDA_NAME(allocator_stats)(dt_backend_t b, int64_t* live, int64_t* cached,
                                          int64_t* peak, int64_t* mallocs);

/* A key of b's physical device: a hash of its PCI bus id (two ranks on one GPU get the same key,
 * whatever their CUDA_VISIBLE_DEVICES); the emulator's is its ordinal. */
dt_status_t DT_CUDA_NAME(device_key)(dt_backend_t b, uint64_t* key);

#endif

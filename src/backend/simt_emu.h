/* simt_emu.h - entry points of the SIMT emulator (simt_emu.cpp), which runs CUDA kernels on the
 * CPU so that src/ops/cuda/ can be tested on machines without a GPU.
 *
 * Kernel code never calls these functions: src/backend/simt.h, compiled with DT_SIMT_EMULATE,
 * defines CUDA's names (threadIdx, __syncthreads, __shfl_sync, dt_simt_launch, ...) on top of
 * them. A launch runs to completion on the calling thread, one block after the other; each CUDA
 * thread of the running block is a cooperative fiber that runs until it reaches a barrier, a
 * warp operation or its end. Only one launch runs at a time in the process.
 */
#ifndef DT_BACKEND_SIMT_EMU_H
#define DT_BACKEND_SIMT_EMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_simt_uint3 {
  unsigned x, y, z;
} dt_simt_uint3;

/* Launch results. The values are CUDA's cudaError_t numbers for the same failures, so wrapper
 * code treats a non-zero result alike in both modes; the text is in dt_simt_last_error(). */
enum {
  DT_SIMT_OK = 0,
  DT_SIMT_ERR_INVALID_VALUE = 1,   /* cudaErrorInvalidValue: a launch from inside a kernel */
  DT_SIMT_ERR_OUT_OF_MEMORY = 2,   /* cudaErrorMemoryAllocation: fiber stacks, shared memory */
  DT_SIMT_ERR_INVALID_CONFIG = 9,  /* cudaErrorInvalidConfiguration: grid, block or smem size */
  DT_SIMT_ERR_LAUNCH_FAILED = 719, /* cudaErrorLaunchFailure: deadlock or misused barrier */
};

/* The synchronisation points a thread can wait at (the arguments of the two sync calls). */
typedef enum dt_simt_op {
  DT_SIMT_OP_SYNCTHREADS = 0, /* block barriers: __syncthreads and its reducing forms */
  DT_SIMT_OP_SYNC_COUNT = 1,
  DT_SIMT_OP_SYNC_AND = 2,
  DT_SIMT_OP_SYNC_OR = 3,
  DT_SIMT_OP_SYNCWARP = 4, /* warp operations: every lane of the mask must arrive */
  DT_SIMT_OP_SHFL_IDX = 5,
  DT_SIMT_OP_SHFL_UP = 6,
  DT_SIMT_OP_SHFL_DOWN = 7,
  DT_SIMT_OP_SHFL_XOR = 8,
  DT_SIMT_OP_BALLOT = 9,
  DT_SIMT_OP_ANY = 10,
  DT_SIMT_OP_ALL = 11,
  DT_SIMT_OP_COUNT
} dt_simt_op_t;

/* One launch, as dt_simt_launch (simt.h) describes it. */
typedef struct dt_simt_launch_desc {
  dt_simt_uint3 grid, block;
  size_t smem_bytes;       /* dynamic shared memory per block */
  void (*body)(void* ctx); /* calls the kernel with its arguments for the current thread */
  void* ctx;               /* argument of body */
  const void* kernel;      /* the kernel's address, for messages */
} dt_simt_launch_desc_t;

/* Runs a whole launch on the calling thread; DT_SIMT_OK or a DT_SIMT_ERR_* code. Blocks run in
 * the order x, then y, then z. On failure the launch stops at the first error, the emulator
 * drops the unfinished threads (their stacks are not unwound) and stays usable. */
int dt_simt_run(const dt_simt_launch_desc_t* desc);

/* The message of the calling thread's last failed launch ("" after a successful one). */
const char* dt_simt_last_error(void);

/* The text for result rc: the last launch's message when that launch failed with rc, else
 * CUDA's short text for the code (also for codes that did not come from a launch). */
const char* dt_simt_error_string(int rc);

/* ---------------------------------------------------------------------------------------------
 * Called from kernel code (through simt.h) while a launch runs. */

/* The running thread's threadIdx and the running block's blockIdx, blockDim and gridDim. */
extern const dt_simt_uint3* dt_simt_thread_idx;
extern const dt_simt_uint3* dt_simt_block_idx;
extern const dt_simt_uint3* dt_simt_block_dim;
extern const dt_simt_uint3* dt_simt_grid_dim;

/* The block's dynamic shared memory (smem_bytes of the launch, filled with 0xFF bytes). */
void* dt_simt_dyn_smem(void);

/* A block barrier (op DT_SIMT_OP_SYNC*): waits until every thread of the block that has not
 * exited arrives at the same barrier, then returns the reduction of `pred` that op asks for
 * (count, and, or; 0 for DT_SIMT_OP_SYNCTHREADS). file/line/func name the call site. */
int dt_simt_block_sync(int op, int pred, const char* file, int line, const char* func);

/* A warp operation (op DT_SIMT_OP_SYNCWARP and after): waits until every lane of `mask` arrives
 * at the same operation with the same mask, then returns this lane's result: the value (its
 * bytes, zero-extended) of the lane the shuffle reads, the ballot, any or all. `arg` is the
 * shuffle's source lane, delta or lane mask, `width` its segment width. */
uint64_t dt_simt_warp_sync(int op, unsigned mask, uint64_t value, int arg, int width,
                           const char* file, int line, const char* func);

/* The lanes of the calling thread's warp that have not exited (see simt.h, __activemask). */
unsigned dt_simt_active_mask(void);

/* Lets the other threads of the block run before the caller continues (a failed atomicCAS
 * calls it, so that a spin lock between threads of one block can make progress). */
void dt_simt_yield(void);

#ifdef __cplusplus
}
#endif

#endif /* DT_BACKEND_SIMT_EMU_H */

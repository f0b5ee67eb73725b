/* cuda_rt_emu.h - the few CUDA runtime calls src/backend/cuda.cu makes, emulated on the host for
 * the cuda-emu backend (compiled with DT_SIMT_EMULATE, where no CUDA header exists).
 *
 * Only what cuda.cu uses, with CUDA's names, types and error numbers, so the backend reads the
 * same in both builds. "Device memory" is host memory: cudaMalloc is a 256-byte aligned host
 * allocation whose bytes start as 0xFF (a NaN in every float dtype, -1 in the integer ones, so
 * a kernel that reads memory nobody wrote shows it), copies and memsets are memmove and memset.
 * There is one device with a couple of SMs (emulated launches stay short) and one stream; every
 * operation has finished when the call returns, so streams and events are tokens: an event is
 * complete as soon as it is recorded. Nothing here fails except allocation
 * (cudaErrorMemoryAllocation). Include after src/backend/simt.h (which defines cudaStream_t).
 */
#ifndef DT_BACKEND_CUDA_RT_EMU_H
#define DT_BACKEND_CUDA_RT_EMU_H

#ifndef DT_SIMT_EMULATE
#error "cuda_rt_emu.h is for the DT_SIMT_EMULATE build only"
#endif

#include <stdlib.h>
#include <string.h>

/* CUDA's numbers for the errors the emulation can report (launch errors come from simt.h). */
typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
} cudaMemcpyKind;

enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

typedef struct dt_cu_emu_event* cudaEvent_t;

/* The SM count the emulated device reports (grid-stride launches use a few blocks per SM). */
#define DT_CU_EMU_SM_COUNT 2

static inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
/* The emulator's message of the last failed launch (the only errors that reach a message). */
static inline const char* cudaGetErrorString(cudaError_t e) { return dt_simt_strerror((int)e); }
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }

static inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  (void)attr;
  (void)device;
  *value = DT_CU_EMU_SM_COUNT;
  return cudaSuccess;
}

/* ---- memory ---------------------------------------------------------------------------------- */
static inline cudaError_t dt_cu_emu_aligned(void** p, size_t nbytes, int poison) {
  size_t n = (nbytes + 255) & ~(size_t)255;
  *p = aligned_alloc(256, n ? n : 256);
  if (*p == NULL) return cudaErrorMemoryAllocation;
  if (poison) memset(*p, 0xFF, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMalloc(void** p, size_t nbytes) {
  return dt_cu_emu_aligned(p, nbytes, 1);
}
static inline cudaError_t cudaFree(void* p) {
  free(p);
  return cudaSuccess;
}
static inline cudaError_t cudaMallocHost(void** p, size_t nbytes) {
  return dt_cu_emu_aligned(p, nbytes, 0);
}
static inline cudaError_t cudaFreeHost(void* p) {
  free(p);
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t nbytes,
                                          cudaMemcpyKind kind, cudaStream_t s) {
  (void)kind;
  (void)s;
  if (nbytes && dst != src) memmove(dst, src, nbytes);
  return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t nbytes, cudaStream_t s) {
  (void)s;
  if (nbytes) memset(dst, value, nbytes);
  return cudaSuccess;
}

/* ---- streams and events: everything has finished when issued --------------------------------- */
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  static char token; /* a distinct non-null handle */
  (void)flags;
  *s = (cudaStream_t)(void*)&token;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
/* Events are real (small) allocations so that a leak of the pool shows in leak checkers. */
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned flags) {
  (void)flags;
  *ev = (cudaEvent_t)malloc(1);
  return *ev ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  free(ev);
  return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  (void)ev;
  (void)s;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags) {
  (void)s;
  (void)ev;
  (void)flags;
  return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t ev) {
  (void)ev;
  return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  (void)ev;
  return cudaSuccess;
}

#endif /* DT_BACKEND_CUDA_RT_EMU_H */

/* dtensor/status.h - status codes, the last-error message and the library version.
 *
 * Every public function returns a dt_status_t. On failure a readable detail message (function,
 * file:line, what was wrong and the valid range) is kept per thread and read with dt_last_error().
 */
#ifndef DTENSOR_STATUS_H
#define DTENSOR_STATUS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define DT_API __declspec(dllexport)
#elif defined(__GNUC__)
#define DT_API __attribute__((visibility("default")))
#else
#define DT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DT_VERSION_MAJOR 0
#define DT_VERSION_MINOR 1
#define DT_VERSION_PATCH 0

/* X-macro list: code, value, short text. New codes go at the end; a removed code stays as a
 * comment so its number is never reused. */
#define DT_STATUS_MAP(X)                                                          \
  X(DT_SUCCESS, 0, "success")                                                     \
  X(DT_ERR_INVALID_ARG, 1, "invalid argument")                                    \
  X(DT_ERR_INVALID_USAGE, 2, "invalid usage (call order or object state)")        \
  X(DT_ERR_UNSUPPORTED, 3, "unsupported combination")                             \
  X(DT_ERR_OUT_OF_MEMORY, 4, "out of memory")                                     \
  X(DT_ERR_CUDA, 5, "CUDA error")                                                 \
  X(DT_ERR_CUBLAS, 6, "cuBLAS error")                                             \
  X(DT_ERR_NCCL, 7, "NCCL error")                                                 \
  X(DT_ERR_MPI, 8, "MPI error")                                                   \
  X(DT_ERR_REMOTE, 9, "error on a remote rank")                                   \
  X(DT_ERR_TIMEOUT, 10, "timeout")                                                \
  X(DT_ERR_INTERNAL, 11, "internal error (library bug)")                          \
  X(DT_ERR_IO, 12, "file input/output error")                                     \
  X(DT_ERR_NOT_INITIALIZED, 13, "library not initialized (call dt_init first)")

typedef enum dt_status {
#define DT__STATUS_ENUM(name, value, text) name = value,
  DT_STATUS_MAP(DT__STATUS_ENUM)
#undef DT__STATUS_ENUM
  DT_STATUS_COUNT
} dt_status_t;

/* Name of the code ("DT_ERR_INVALID_ARG"); "DT_UNKNOWN_STATUS" for values out of range. */
DT_API const char* dt_status_name(dt_status_t st);
/* Static one-line description of the code. */
DT_API const char* dt_status_string(dt_status_t st);
/* Detail of the last failure on this thread: "dt_mesh_create (src/mesh/mesh.c:42): ...".
 * Like errno, it is set by a failing call and kept until the next failure or dt_clear_error()
 * (a successful call does not clear it); empty if nothing failed yet. Never NULL. */
DT_API const char* dt_last_error(void);
/* Clears the last-error message of this thread. */
DT_API void dt_clear_error(void);

#if defined(__GNUC__)
#define DT_PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define DT_PRINTF_LIKE(a, b)
#endif
/* Records a failure for dt_last_error() and returns `st`: the message reads
 * "func (file:line): <formatted text>" (the file path is cut to what follows "src/", when present).
 * For code built on the library (wrappers, host-registered ops, trainers) that wants to report its
 * own errors the way the library does; dtensor/check.h wraps it in DT_FAIL. The arguments may
 * include dt_last_error() itself. */
DT_API dt_status_t dt_set_error(dt_status_t st, const char* func, const char* file, int line,
                                const char* fmt, ...) DT_PRINTF_LIKE(5, 6);

/* Library version as "MAJOR.MINOR.PATCH". */
DT_API const char* dt_version(void);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_STATUS_H */

/* dtensor/status.h - status codes, the last-error message and the library version.
 *
 * Every public function returns a dt_status_t. On failure a readable detail message (the public
 * function that was called, what was wrong, the bad value and what is valid) is kept per thread and
 * read with dt_last_error(); where in the library it was recorded is read with
 * dt_last_error_location().
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
  X(DT_ERR_NOT_INITIALIZED, 13, "library not initialized (call dt_init first)")     \
  X(DT_ERR_CORRUPT, 14, "corrupt or inconsistent data (checksum, format)")

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
/* Detail of the last failure on this thread, for the user: "ENTRY: TEXT", e.g.
 *   "dt_op_run: unknown op 'matmul': did you mean 'mm'? (PyTorch's matmul is mm here, ...)".
 * ENTRY is the public function the program called (the outermost one that names itself with
 * dt_error_scope_enter / DT_ENTRY_RETURN: dt_op_run, dt_sdpa, dt_op_describe, ...). Where no such
 * scope is open, ENTRY is the function that recorded the failure, left out when that is one of
 * the library's internal functions (dt__*): internal names never start the message. TEXT names
 * the argument, the bad value and what would be valid. A message that quotes the previous one
 * (a wrapper adding context) drops the quoted copy's ENTRY when it is the same.
 * With the environment variable DTENSOR_DEBUG set (any value), the location is appended in
 * parentheses: "ENTRY: TEXT (at dt__verdict, src/core/handle.c:128)".
 * Like errno, it is set by a failing call and kept until the next failure or dt_clear_error()
 * (a successful call does not clear it); empty if nothing failed yet. Never NULL. */
DT_API const char* dt_last_error(void);
/* Where the last failure on this thread was recorded: "function (file:line)", the file path cut
 * to what follows "src/" when present ("dt__verdict (src/core/handle.c:128)"); the code that
 * called DT_FAIL / dt_set_error, which may be internal. Empty when nothing failed yet, after
 * dt_clear_error(), and when the message was put back by the library after a failure it
 * recovered from. Never NULL. */
DT_API const char* dt_last_error_location(void);
/* Clears the last-error message and its location on this thread. */
DT_API void dt_clear_error(void);
/* Names `entry` (a string literal or otherwise static text: the name of the public function being
 * run) as ENTRY of every message recorded on this thread until the matching
 * dt_error_scope_leave, unless an outer scope is already open (the outermost public call is what
 * the user called). Returns what dt_error_scope_leave must be given. For wrappers built on the
 * library that expose their own public functions; dtensor/check.h's DT_ENTRY_RETURN pairs the two
 * calls around one expression. Scopes are per thread and must nest. */
DT_API const char* dt_error_scope_enter(const char* entry);
DT_API void dt_error_scope_leave(const char* saved);

#if defined(__GNUC__)
#define DT_PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define DT_PRINTF_LIKE(a, b)
#endif
/* Records a failure for dt_last_error() and returns `st`: the message reads
 * "ENTRY: <formatted text>" (see dt_last_error: the open scope's entry, else `func` unless it is
 * internal), and "func (file:line)" becomes dt_last_error_location(). For code built on the
 * library (wrappers, host-registered ops, trainers) that wants to report its own errors the way
 * the library does; dtensor/check.h wraps it in DT_FAIL. The arguments may include
 * dt_last_error() and dt_last_error_location() themselves. */
DT_API dt_status_t dt_set_error(dt_status_t st, const char* func, const char* file, int line,
                                const char* fmt, ...) DT_PRINTF_LIKE(5, 6);

/* Library version as "MAJOR.MINOR.PATCH". */
DT_API const char* dt_version(void);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_STATUS_H */

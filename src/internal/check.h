/* check.h - internal error reporting and propagation macros.
 *
 * DT_FAIL(st, fmt, ...) records the detail message (function, file:line, text) for dt_last_error
 * and evaluates to st. DT_CHECK returns early, DT_CHECK_GOTO jumps to a cleanup label.
 */
#ifndef DT_INTERNAL_CHECK_H
#define DT_INTERNAL_CHECK_H

#include "dtensor/status.h"

#if defined(__GNUC__)
#define DT__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DT__PRINTF(a, b)
#endif

dt_status_t dt__set_error(dt_status_t st, const char* func, const char* file, int line,
                          const char* fmt, ...) DT__PRINTF(5, 6);

#define DT_FAIL(st, ...) dt__set_error((st), __func__, __FILE__, __LINE__, __VA_ARGS__)

#define DT_CHECK(call)                       \
  do {                                       \
    dt_status_t dt__st = (call);             \
    if (dt__st != DT_SUCCESS) return dt__st; \
  } while (0)

#define DT_CHECK_GOTO(call, st, label) \
  do {                                 \
    (st) = (call);                     \
    if ((st) != DT_SUCCESS) goto label; \
  } while (0)

/* Argument checks at the public boundary. */
#define DT_ARG_NOT_NULL(p)                                              \
  do {                                                                  \
    if ((p) == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s is NULL", #p); \
  } while (0)

/* Internal invariant: reports DT_ERR_INTERNAL instead of aborting. */
#define DT_ASSERT_RET(cond)                                                                \
  do {                                                                                     \
    if (!(cond)) return DT_FAIL(DT_ERR_INTERNAL, "internal invariant failed: %s", #cond); \
  } while (0)

#endif

/* dtensor/check.h - status propagation macros for code built on the library.
 *
 * The library's own code uses exactly these. Include this header explicitly (the umbrella header
 * does not) in wrappers, host-registered ops and trainers that report errors the library's way:
 *
 *   dt_status_t my_step(dt_tensor_t x, dt_tensor_t* out) {
 *     DT_ARG_NOT_NULL(out);
 *     if (bad) return DT_FAIL(DT_ERR_INVALID_ARG, "x has %d dims, expected 2", nd);
 *     DT_CHECK(dt_op_run("relu", 1, &x, 0, NULL, 0, NULL, out));
 *     return DT_SUCCESS;
 *   }
 *
 * DT_FAIL(st, fmt, ...) records the text for dt_last_error() (after the public entry point, see
 * dtensor/status.h) and "function (file:line)" for dt_last_error_location(), and evaluates to st.
 * DT_CHECK(call) returns the call's status when it is not DT_SUCCESS. DT_CHECK_GOTO(call, st,
 * label) stores the status in st and jumps to label on failure. DT_ARG_NOT_NULL(p) returns
 * DT_ERR_INVALID_ARG ("p is NULL") for a NULL argument. DT_ENTRY_RETURN(call) evaluates `call`
 * (a dt_status_t expression) with the enclosing function named as the public entry point of
 * every message recorded meanwhile, and returns its status:
 *
 *   dt_status_t my_lib_step(my_model_t m) { DT_ENTRY_RETURN(my_lib_step_impl(m)); }
 *
 * so that a failure deep inside reads "my_lib_step: ..." rather than naming an inner function.
 */
#ifndef DTENSOR_CHECK_H
#define DTENSOR_CHECK_H

#include "dtensor/status.h"

#define DT_FAIL(st, ...) dt_set_error((st), __func__, __FILE__, __LINE__, __VA_ARGS__)

#define DT_CHECK(call)                       \
  do {                                       \
    dt_status_t dt__st = (call);             \
    if (dt__st != DT_SUCCESS) return dt__st; \
  } while (0)

#define DT_CHECK_GOTO(call, st, label)  \
  do {                                  \
    (st) = (call);                      \
    if ((st) != DT_SUCCESS) goto label; \
  } while (0)

#define DT_ARG_NOT_NULL(p)                                                 \
  do {                                                                     \
    if ((p) == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s is NULL", #p); \
  } while (0)

#define DT_ENTRY_RETURN(call)                                       \
  do {                                                              \
    const char* dt__entry_saved = dt_error_scope_enter(__func__);   \
    dt_status_t dt__entry_st = (call);                              \
    dt_error_scope_leave(dt__entry_saved);                          \
    return dt__entry_st;                                            \
  } while (0)

#endif /* DTENSOR_CHECK_H */

/* check.h - internal error reporting: the public propagation macros (dtensor/check.h).
 *
 * DT_FAIL(st, fmt, ...) records the message for dt_last_error ("ENTRY: TEXT", ENTRY the public
 * function being run) and the location for dt_last_error_location, and evaluates to st. DT_CHECK returns early, DT_CHECK_GOTO jumps to a cleanup label,
 * DT_ARG_NOT_NULL checks an argument at the public boundary.
 */
#ifndef DT_INTERNAL_CHECK_H
#define DT_INTERNAL_CHECK_H

#include "dtensor/check.h"

#define DT__PRINTF(a, b) DT_PRINTF_LIKE(a, b)

#endif

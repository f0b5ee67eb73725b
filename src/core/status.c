/* status.c - status names and texts, the per-thread last-error message, the version string. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal/check.h"

static _Thread_local char dt__last_error[1024];

const char* dt_status_name(dt_status_t st) {
  switch (st) {
#define DT__STATUS_NAME(name, value, text) \
  case name:                               \
    return #name;
    DT_STATUS_MAP(DT__STATUS_NAME)
#undef DT__STATUS_NAME
    default:
      return "DT_UNKNOWN_STATUS";
  }
}

const char* dt_status_string(dt_status_t st) {
  switch (st) {
#define DT__STATUS_TEXT(name, value, text) \
  case name:                               \
    return text;
    DT_STATUS_MAP(DT__STATUS_TEXT)
#undef DT__STATUS_TEXT
    default:
      return "unknown status code";
  }
}

const char* dt_last_error(void) { return dt__last_error; }

void dt_clear_error(void) { dt__last_error[0] = '\0'; }

void dt__error_restore(const char* saved) {
  snprintf(dt__last_error, sizeof dt__last_error, "%s", saved);
}

const char* dt_version(void) {
#define DT__STR2(x) #x
#define DT__STR(x) DT__STR2(x)
  return DT__STR(DT_VERSION_MAJOR) "." DT__STR(DT_VERSION_MINOR) "." DT__STR(DT_VERSION_PATCH);
}

dt_status_t dt_set_error(dt_status_t st, const char* func, const char* file, int line,
                          const char* fmt, ...) {
  /* Format into a scratch buffer first: the arguments may include dt_last_error() itself. */
  char tmp[sizeof dt__last_error];
  const char* s = strstr(file, "src/"); /* keep only the path below src/ */
  int n = snprintf(tmp, sizeof tmp, "%s (%s:%d): ", func, s ? s : file, line);
  if (n > 0 && (size_t)n < sizeof tmp) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp + n, sizeof tmp - (size_t)n, fmt, ap);
    va_end(ap);
  }
  memcpy(dt__last_error, tmp, sizeof tmp);
  return st;
}

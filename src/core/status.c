/* status.c - status names and texts, the per-thread last-error message and its location, the
 * public-entry scopes that name what the user called, the version string. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/check.h"

/* The last failure of this thread: the message dt_last_error returns, its text after the entry
 * (what a later message quoting it keeps), the entry it started with, and where it was recorded. */
static _Thread_local struct {
  char full[1024];
  char text[1024];
  char entry[64];
  char loc[192];
} dt__err;
/* The outermost open public-entry scope of this thread (NULL: none). */
static _Thread_local const char* dt__entry;

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

const char* dt_last_error(void) { return dt__err.full; }

const char* dt_last_error_location(void) { return dt__err.loc; }

const char* dt__last_error_text(void) { return dt__err.text; }

void dt_clear_error(void) {
  dt__err.full[0] = dt__err.text[0] = dt__err.entry[0] = dt__err.loc[0] = '\0';
}

void dt__error_restore(const char* saved) {
  if (saved == dt__err.full || strcmp(saved, dt__err.full) == 0) return; /* unchanged: keep all */
  snprintf(dt__err.full, sizeof dt__err.full, "%s", saved);
  snprintf(dt__err.text, sizeof dt__err.text, "%s", saved);
  dt__err.entry[0] = dt__err.loc[0] = '\0';
}

const char* dt_error_scope_enter(const char* entry) {
  const char* saved = dt__entry;
  if (saved == NULL) dt__entry = entry;
  return saved;
}

void dt_error_scope_leave(const char* saved) { dt__entry = saved; }

const char* dt_version(void) {
#define DT__STR2(x) #x
#define DT__STR(x) DT__STR2(x)
  return DT__STR(DT_VERSION_MAJOR) "." DT__STR(DT_VERSION_MINOR) "." DT__STR(DT_VERSION_PATCH);
}

dt_status_t dt_set_error(dt_status_t st, const char* func, const char* file, int line,
                          const char* fmt, ...) {
  if (func == NULL) func = "";
  if (file == NULL) file = "";
  /* Format into scratch buffers first: the arguments may include dt_last_error() itself. */
  char text[sizeof dt__err.text], full[sizeof dt__err.full], loc[sizeof dt__err.loc];
  text[0] = '\0';
  if (fmt != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
  }
  /* The entry: what the user called (the open scope), else the recording function unless it is
   * internal. */
  const char* entry = dt__entry ? dt__entry : strncmp(func, "dt__", 4) == 0 ? "" : func;
  /* A wrapper quoting the previous message under the same entry: keep the quote's text only,
   * so the entry is not repeated ("dt_op_run: mm: input 0: dt_op_run: ..."). */
  const char* q = dt__err.full[0] && strcmp(dt__err.full, dt__err.text) != 0 &&
                          strcmp(dt__err.entry, entry) == 0
                      ? strstr(text, dt__err.full)
                      : NULL;
  if (q != NULL) {
    char tmp[sizeof text];
    int w = snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(q - text), text, dt__err.text,
                     q + strlen(dt__err.full));
    if (w > 0) memcpy(text, tmp, sizeof tmp); /* cut to the buffer when longer */
  }
  /* A text that already starts with the entry (a message saved before a cleanup and recorded
   * again under the same entry): the entry once. */
  const size_t el = strlen(entry);
  if (el > 0 && strncmp(text, entry, el) == 0 && strncmp(text + el, ": ", 2) == 0)
    memmove(text, text + el + 2, strlen(text + el + 2) + 1);
  const char* s = strstr(file, "src/"); /* keep only the path below src/ */
  snprintf(loc, sizeof loc, "%s (%s:%d)", func, s ? s : file, line);
  const char* dbg = getenv("DTENSOR_DEBUG");
  int n = snprintf(full, sizeof full, "%s%s%s", entry, entry[0] ? ": " : "", text);
  if (dbg != NULL && dbg[0] != '\0' && n >= 0 && (size_t)n < sizeof full)
    snprintf(full + n, sizeof full - (size_t)n, " (at %s, %s:%d)", func, s ? s : file, line);
  memcpy(dt__err.full, full, sizeof full);
  memcpy(dt__err.text, text, sizeof text);
  memcpy(dt__err.loc, loc, sizeof loc);
  snprintf(dt__err.entry, sizeof dt__err.entry, "%s", entry);
  return st;
}

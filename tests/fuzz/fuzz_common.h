/* fuzz_common.h - small helpers shared by the libFuzzer harnesses of tests/fuzz: a NUL-terminated
 * copy of the input and the check that every failure leaves a readable message. */
#ifndef DT_FUZZ_COMMON_H
#define DT_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

/* data[0..size) as a malloc'd C string (cut at the first NUL). */
static inline char* dt_fuzz_cstr(const uint8_t* data, size_t size) {
  char* s = (char*)malloc(size + 1);
  if (s == NULL) abort();
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

/* A failed call must leave a non-empty, printable last-error message. */
static inline void dt_fuzz_check_error(dt_status_t st, const char* what) {
  if (st == DT_SUCCESS) return;
  const char* e = dt_last_error();
  if (e == NULL || e[0] == '\0') {
    fprintf(stderr, "%s failed (%s) without a message\n", what, dt_status_name(st));
    abort();
  }
  if (strlen(e) >= 4096) abort();
}

#define DT_FUZZ_ASSERT(cond)                                                \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                              \
    }                                                                       \
  } while (0)

#endif

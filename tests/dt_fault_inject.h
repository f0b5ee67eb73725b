/* dt_fault_inject.h - allocation fault injection for the test programs linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc (dtensor's code and the
 * program; not Open MPI's or libc's own allocations): every allocation counts in g_count, and the
 * one numbered g_fail_at (-1: none) returns NULL. aligned_alloc is the emulated device's memory
 * (cudaMalloc, pinned host buffers under DTENSOR_BACKEND=cuda-emu). Include it in one file per
 * program. `break fault_hit` in a debugger stops at the failing allocation.
 *
 * DT_FAULT_TRY(call), in a function with a dt_status_t st and a `done:` label that frees
 * everything: st = call; on failure a message must have been left (else the test dies), then
 * goto done. */
#ifndef DT_FAULT_INJECT_H
#define DT_FAULT_INJECT_H

#include <stdlib.h>
#include <string.h>

#include "dt_test.h"

static long g_count = 0, g_fail_at = -1;

__attribute__((noinline)) static int fault_hit(void) {
  __asm__ volatile("");
  return 1;
}
/* any thread may allocate (an asynchronous checkpoint's writer): the count is atomic */
static int fail_now(void) {
  return __atomic_add_fetch(&g_count, 1, __ATOMIC_RELAXED) == g_fail_at && fault_hit();
}
void* __real_malloc(size_t n);
void* __real_calloc(size_t a, size_t b);
void* __real_realloc(void* p, size_t n);
void* __real_aligned_alloc(size_t a, size_t n);
void* __wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void* __wrap_calloc(size_t a, size_t b) { return fail_now() ? NULL : __real_calloc(a, b); }
void* __wrap_realloc(void* p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
void* __wrap_aligned_alloc(size_t a, size_t n) {
  return fail_now() ? NULL : __real_aligned_alloc(a, n);
}

#define DT_FAULT_TRY(call)                                                                   \
  do {                                                                                       \
    st = (call);                                                                             \
    if (st != DT_SUCCESS) {                                                                  \
      if (strlen(dt_last_error()) == 0) {                                                    \
        fprintf(stderr, "%s failed with %s and no message\n", #call, dt_status_name(st));    \
        dt_test_die();                                                                       \
      }                                                                                      \
      goto done;                                                                             \
    }                                                                                        \
  } while (0)

#endif /* DT_FAULT_INJECT_H */

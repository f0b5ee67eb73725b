/* handle.c - the registry of handles (dtensor/handle.h): an open-addressing hash table from
 * address to kind, live or destroyed (a destroyed entry stays until its memory is really freed or
 * the address is registered again, so a second destroy is told from a made-up pointer), and the
 * quarantine ring that delays the freeing of destroyed objects.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <stdatomic.h>
#include <stdint.h>

#include "dtensor/handle.h"
#include "internal/common.h"

static atomic_flag dt__hlock = ATOMIC_FLAG_INIT;

static struct {
  size_t cap, count; /* cap: power of two (0 before the first registration) */
  const void** keys;
  const dt_handle_kind_t** kinds;
  unsigned char* dead; /* 1: destroyed */
} dt__reg;

static struct {
  void* slot[DT_HANDLE_QUARANTINE];
  size_t next; /* ring position of the oldest entry once full */
} dt__quar;

static void dt__lock(void) {
  while (atomic_flag_test_and_set_explicit(&dt__hlock, memory_order_acquire)) {
  }
}
static void dt__unlock(void) { atomic_flag_clear_explicit(&dt__hlock, memory_order_release); }

static size_t dt__slot_of(const void* h, size_t cap) {
  return (size_t)(((uint64_t)(uintptr_t)h * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

/* Index of h in the table, or cap when absent. Lock held. */
static size_t dt__find(const void* h) {
  if (dt__reg.cap == 0) return 0;
  for (size_t j = dt__slot_of(h, dt__reg.cap);; j = (j + 1) & (dt__reg.cap - 1)) {
    if (dt__reg.keys[j] == h) return j;
    if (dt__reg.keys[j] == NULL) return dt__reg.cap;
  }
}

static int dt__grow(void) {
  /* the first table holds the quarantine's destroyed entries and as many live handles without
   * growing, so a steady state (as many handles made as destroyed) never allocates here */
  size_t ncap = dt__reg.cap ? dt__reg.cap * 2 : (size_t)DT_HANDLE_QUARANTINE * 4;
  const void** keys = (const void**)calloc(ncap, sizeof *keys);
  const dt_handle_kind_t** kinds = (const dt_handle_kind_t**)calloc(ncap, sizeof *kinds);
  unsigned char* dead = (unsigned char*)calloc(ncap, 1);
  if (keys == NULL || kinds == NULL || dead == NULL) {
    free((void*)keys);
    free((void*)kinds);
    free(dead);
    return 0;
  }
  for (size_t i = 0; i < dt__reg.cap; i++) {
    if (dt__reg.keys[i] == NULL) continue;
    size_t j = dt__slot_of(dt__reg.keys[i], ncap);
    while (keys[j] != NULL) j = (j + 1) & (ncap - 1);
    keys[j] = dt__reg.keys[i];
    kinds[j] = dt__reg.kinds[i];
    dead[j] = dt__reg.dead[i];
  }
  free((void*)dt__reg.keys);
  free((void*)dt__reg.kinds);
  free(dt__reg.dead);
  dt__reg.keys = keys;
  dt__reg.kinds = kinds;
  dt__reg.dead = dead;
  dt__reg.cap = ncap;
  return 1;
}

/* Removes entry j (backward-shift deletion keeps every probe chain unbroken). Lock held. */
static void dt__erase(size_t j) {
  size_t mask = dt__reg.cap - 1, i = j;
  for (size_t k = (i + 1) & mask; dt__reg.keys[k] != NULL; k = (k + 1) & mask) {
    size_t home = dt__slot_of(dt__reg.keys[k], dt__reg.cap);
    /* move k into the hole at i when its home is not cyclically in (i, k] */
    if (((k - home) & mask) >= ((k - i) & mask)) {
      dt__reg.keys[i] = dt__reg.keys[k];
      dt__reg.kinds[i] = dt__reg.kinds[k];
      dt__reg.dead[i] = dt__reg.dead[k];
      i = k;
    }
  }
  dt__reg.keys[i] = NULL;
  dt__reg.kinds[i] = NULL;
  dt__reg.dead[i] = 0;
  dt__reg.count--;
}

static dt_status_t dt__handle_register_impl(const void* h, const dt_handle_kind_t* kind) {
  DT_ARG_NOT_NULL(h);
  DT_ARG_NOT_NULL(kind);
  dt__lock();
  size_t at = dt__find(h);
  if (at != dt__reg.cap) {
    if (dt__reg.dead[at]) { /* the address of a destroyed object, reused */
      dt__reg.kinds[at] = kind;
      dt__reg.dead[at] = 0;
      dt__unlock();
      return DT_SUCCESS;
    }
    dt__unlock();
    return DT_FAIL(DT_ERR_INVALID_USAGE, "%s %p is already registered", kind->name, h);
  }
  if ((dt__reg.count + 1) * 2 > dt__reg.cap && !dt__grow()) {
    dt__unlock();
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "growing the handle registry");
  }
  size_t j = dt__slot_of(h, dt__reg.cap);
  while (dt__reg.keys[j] != NULL) j = (j + 1) & (dt__reg.cap - 1);
  dt__reg.keys[j] = h;
  dt__reg.kinds[j] = kind;
  dt__reg.count++;
  dt__unlock();
  return DT_SUCCESS;
}

dt_status_t dt_handle_register(const void* h, const dt_handle_kind_t* kind) {
  DT_ENTRY_RETURN(dt__handle_register_impl(h, kind));
}

/* Status for h given its entry (found NULL: none). No lock needed. */
static dt_status_t dt__verdict(const void* h, const dt_handle_kind_t* found, int dead,
                               const dt_handle_kind_t* kind, const char* what) {
  (void)h;
  if (found == kind && !dead) return DT_SUCCESS;
  if (found == kind)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "%s is not a live %s: it was destroyed", what,
                   kind->name);
  if (found != NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s is a %s%s, not a %s", what, dead ? "destroyed " : "",
                   found->name, kind->name);
  return DT_FAIL(DT_ERR_INVALID_ARG, "%s is not a live %s (no handle the library gave out)", what,
                 kind->name);
}

/* Looks h up: its kind and whether it is destroyed. */
static const dt_handle_kind_t* dt__lookup(const void* h, int* dead) {
  dt__lock();
  size_t j = dt__find(h);
  const dt_handle_kind_t* found = j < dt__reg.cap ? dt__reg.kinds[j] : NULL;
  *dead = j < dt__reg.cap ? dt__reg.dead[j] : 0;
  dt__unlock();
  return found;
}

static dt_status_t dt__handle_check_impl(const void* h, const dt_handle_kind_t* kind,
                                         const char* what) {
  if (what == NULL) what = "handle";
  if (h == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s is NULL", what);
  DT_ARG_NOT_NULL(kind);
  int dead;
  const dt_handle_kind_t* found = dt__lookup(h, &dead);
  return dt__verdict(h, found, dead, kind, what);
}

dt_status_t dt_handle_check(const void* h, const dt_handle_kind_t* kind, const char* what) {
  DT_ENTRY_RETURN(dt__handle_check_impl(h, kind, what));
}

int dt_handle_is_live(const void* h, const dt_handle_kind_t* kind) {
  if (h == NULL || kind == NULL) return 0;
  int dead;
  return dt__lookup(h, &dead) == kind && !dead;
}

static dt_status_t dt__handle_unregister_impl(const void* h, const dt_handle_kind_t* kind,
                                              const char* what) {
  if (what == NULL) what = "handle";
  if (h == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s is NULL", what);
  DT_ARG_NOT_NULL(kind);
  dt__lock();
  size_t j = dt__find(h);
  const dt_handle_kind_t* found = j < dt__reg.cap ? dt__reg.kinds[j] : NULL;
  int dead = j < dt__reg.cap ? dt__reg.dead[j] : 0;
  if (found != kind || dead) {
    dt__unlock();
    return dt__verdict(h, found, dead, kind, what);
  }
  dt__reg.dead[j] = 1; /* remembered until the memory is freed or reused */
  dt__unlock();
  return DT_SUCCESS;
}

dt_status_t dt_handle_unregister(const void* h, const dt_handle_kind_t* kind, const char* what) {
  DT_ENTRY_RETURN(dt__handle_unregister_impl(h, kind, what));
}

void dt_handle_free(void* p) {
  if (p == NULL) return;
  dt__lock();
  void* old = dt__quar.slot[dt__quar.next];
  dt__quar.slot[dt__quar.next] = p;
  dt__quar.next = (dt__quar.next + 1) % DT_HANDLE_QUARANTINE;
  if (old != NULL) { /* really freed now: forget its entry */
    size_t j = dt__find(old);
    if (j < dt__reg.cap && dt__reg.dead[j]) dt__erase(j);
  }
  dt__unlock();
  free(old);
}

void dt__handle_release_all(void) {
  dt__lock();
  for (size_t i = 0; i < DT_HANDLE_QUARANTINE; i++) {
    void* p = dt__quar.slot[i];
    if (p == NULL) continue;
    size_t j = dt__find(p);
    if (j < dt__reg.cap && dt__reg.dead[j]) dt__erase(j);
    free(p);
    dt__quar.slot[i] = NULL;
  }
  dt__quar.next = 0;
  if (dt__reg.count == 0) {
    free((void*)dt__reg.keys);
    free((void*)dt__reg.kinds);
    free(dt__reg.dead);
    memset(&dt__reg, 0, sizeof dt__reg);
  }
  dt__unlock();
}

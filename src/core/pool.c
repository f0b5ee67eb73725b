/* pool.c - a bounded cache of large host buffers for tensor storage.
 *
 * Training allocates and frees the same activation sizes every step; fresh large blocks come from
 * mmap and every first touch of a page is a kernel page fault plus a page clear (13% of a
 * training step on this machine before the cache). Blocks of at least 64 KiB are rounded up to
 * 4 KiB and kept on free up to DTENSOR_POOL_MB (default 1024; 0 disables) and 1024 blocks; an
 * allocation takes the most recently freed block of its size class. Smaller blocks go straight to
 * malloc. Everything cached is released at dt_finalize (dt__pool_release).
 */
#include <pthread.h>
#include <stdlib.h>

#include "internal/common.h"

#define DT_POOL_MIN (64u << 10)
#define DT_POOL_SLOTS 1024

static struct {
  pthread_mutex_t mu;
  int init;
  size_t cap, held;
  int n;
  size_t size[DT_POOL_SLOTS];
  void* ptr[DT_POOL_SLOTS];
} dt__pool = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, {0}, {0}};

static size_t dt__pool_class(size_t n) { return (n + 4095) & ~(size_t)4095; }

void dt__pool_release(void) {
  pthread_mutex_lock(&dt__pool.mu);
  for (int i = 0; i < dt__pool.n; i++) free(dt__pool.ptr[i]);
  dt__pool.n = 0;
  dt__pool.held = 0;
  dt__pool.init = 0;
  pthread_mutex_unlock(&dt__pool.mu);
}

static void dt__pool_init_locked(void) {
  if (dt__pool.init) return;
  dt__pool.init = 1;
  const char* e = getenv("DTENSOR_POOL_MB");
  long mb = e && *e ? strtol(e, NULL, 10) : 1024;
  dt__pool.cap = mb > 0 ? (size_t)mb << 20 : 0;
}

void* dt__pool_alloc(size_t n, int zero) {
  if (n < DT_POOL_MIN) return zero ? dt__calloc(1, n ? n : 1) : dt__malloc(n);
  size_t c = dt__pool_class(n);
  void* p = NULL;
  pthread_mutex_lock(&dt__pool.mu);
  dt__pool_init_locked();
  for (int i = dt__pool.n - 1; i >= 0; i--)
    if (dt__pool.size[i] == c) {
      p = dt__pool.ptr[i];
      dt__pool.held -= c;
      dt__pool.n--;
      dt__pool.size[i] = dt__pool.size[dt__pool.n];
      dt__pool.ptr[i] = dt__pool.ptr[dt__pool.n];
      break;
    }
  pthread_mutex_unlock(&dt__pool.mu);
  if (p == NULL) return zero ? dt__calloc(1, c) : dt__malloc(c);
  if (zero) memset(p, 0, n);
  return p;
}

void dt__pool_free(void* p, size_t n) {
  if (p == NULL) return;
  if (n < DT_POOL_MIN) {
    dt__free(p);
    return;
  }
  size_t c = dt__pool_class(n);
  pthread_mutex_lock(&dt__pool.mu);
  dt__pool_init_locked();
  int keep = dt__pool.held + c <= dt__pool.cap && dt__pool.n < DT_POOL_SLOTS;
  if (keep) {
    dt__pool.size[dt__pool.n] = c;
    dt__pool.ptr[dt__pool.n++] = p;
    dt__pool.held += c;
  }
  pthread_mutex_unlock(&dt__pool.mu);
  if (!keep) dt__free(p);
}

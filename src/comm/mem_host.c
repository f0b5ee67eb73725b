/* mem_host.c - the host (CPU) memory backend: dt_mem_i over malloc/memcpy. */
#include "internal/backend.h"
#include "internal/common.h"


static void* dt__host_alloc(size_t n) { return dt__malloc(n); }
static void dt__host_copy(void* d, const void* s, size_t n) {
  if (n) memcpy(d, s, n);
}
static void dt__host_zero(void* d, size_t n) {
  if (n) memset(d, 0, n);
}
const struct dt_mem_i dt__host_mem = {dt__host_alloc, dt__free, dt__host_copy, dt__host_zero};

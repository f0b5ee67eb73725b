/* storage.c - what every backend shares: reference-counted storage objects, the storage pool,
 * the persistent workspace, allocation accounting, the default backend and the public backend
 * API.
 *
 * The pool: training allocates and frees the same activation sizes every step; fresh large
 * blocks come from mmap and every first touch of a page is a kernel page fault plus a page clear
 * (13% of a training step on the development machine before the cache). Blocks of at least
 * 64 KiB of a pooled backend are rounded up to 4 KiB and kept on free up to DTENSOR_POOL_MB
 * (default 1024; 0 disables) and 1024 blocks; an allocation takes the most recently freed block
 * of its size class and backend, else the smallest cached one at most a quarter larger: sizes
 * that change from step to step, such as expert-parallel token counts, would otherwise miss
 * every time (and a block idle in the pool holds the same memory). Memory statistics count the
 * class size, whichever block served it, so they do not depend on what the pool held. Smaller
 * blocks go straight to the backend. The guarded backend is not pooled: its frees must poison
 * and quarantine. Everything cached is released at dt_finalize.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <pthread.h>
#include <stdio.h>

#include "backend/backend.h"

/* ---------------------------------------------------------------------------------------------
 * backends */

/* Every backend dt_backend_get can return: the host ones, then device backends as they open. */
static dt_backend_t dt__backends[DT_MAX_BACKENDS] = {&dt__backend_cpu, &dt__backend_guarded,
                                                      &dt__backend_meta};
static int dt__nbackends = 3;
static pthread_mutex_t dt__backends_mu = PTHREAD_MUTEX_INITIALIZER;

static dt_backend_t dt__default = NULL;

dt_status_t dt__backend_register(dt_backend_t b) {
  pthread_mutex_lock(&dt__backends_mu);
  dt_status_t st = DT_SUCCESS;
  int i = 0;
  while (i < dt__nbackends && dt__backends[i] != b) i++;
  if (i == dt__nbackends) {
    if (dt__nbackends == DT_MAX_BACKENDS) st = DT_ERR_OUT_OF_MEMORY;
    else dt__backends[dt__nbackends++] = b;
  }
  pthread_mutex_unlock(&dt__backends_mu);
  if (st != DT_SUCCESS) return DT_FAIL(st, "at most %d backends", DT_MAX_BACKENDS);
  return DT_SUCCESS;
}

/* Every caller's argument is called `backend`. */
dt_status_t dt__backend_check(dt_backend_t b) {
  for (int i = 0; i < dt__nbackends; i++)
    if (b == dt__backends[i]) return DT_SUCCESS;
  if (b == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "backend is NULL");
  return DT_FAIL(DT_ERR_INVALID_ARG, "backend %p is not a backend (valid: a handle from "
                 "dt_backend_get or dt_backend_default)", (const void*)b);
}

const char* dt_device_name(dt_device_t device) {
  static const char* const names[DT_DEVICE_COUNT] = {"host", "cuda", "meta"};
  return (device >= 0 && device < DT_DEVICE_COUNT) ? names[device] : "invalid";
}

/* "cuda" (-1: this rank's device) or "cuda:N": 1 with the ordinal, 0 for other names, -1 for a
 * malformed ordinal. */
static int dt__cuda_name(const char* name, int* ordinal) {
  if (strncmp(name, "cuda", 4) != 0) return 0;
  if (name[4] == '\0') {
    *ordinal = -1;
    return 1;
  }
  if (name[4] != ':') return 0;
  char* end = NULL;
  long v = strtol(name + 5, &end, 10);
  if (name[5] < '0' || name[5] > '9' || *end != '\0' || v > 1023) return -1;
  *ordinal = (int)v;
  return 1;
}

static dt_status_t dt__backend_get_impl(const char* name, dt_backend_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(name);
  int ordinal = -1, cuda = dt__cuda_name(name, &ordinal);
  if (cuda < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "name '%s': the device ordinal after 'cuda:' must be a "
                   "number from 0 to 1023", name);
  if (cuda > 0) return dt__backend_cuda_open(ordinal, out);
  if (strcmp(name, "cuda-emu") == 0) return dt__backend_cuda_emu_open(out);
  for (int i = 0; i < dt__nbackends; i++)
    if (strcmp(dt__backends[i]->name, name) == 0) {
      *out = dt__backends[i];
      return DT_SUCCESS;
    }
  return DT_FAIL(DT_ERR_UNSUPPORTED, "name '%s' is not a backend (valid: cpu, guarded, cuda, "
                 "cuda:N, cuda-emu)", name);
}

dt_status_t dt_backend_get(const char* name, dt_backend_t* out) {
  DT_ENTRY_RETURN(dt__backend_get_impl(name, out));
}

dt_backend_t dt__backend_default(void) {
  if (dt__default == NULL) {
    dt__default = &dt__backend_cpu;
    const char* e = getenv("DTENSOR_BACKEND");
    if (e && *e) {
      dt_backend_t b;
      char saved[1024];
      snprintf(saved, sizeof saved, "%s", dt_last_error());
      if (dt_backend_get(e, &b) == DT_SUCCESS) dt__default = b;
      else dt__log("backend", "ignoring DTENSOR_BACKEND=%s: %s", e, dt_last_error());
      dt__error_restore(saved);
    }
  }
  return dt__default;
}

static dt_status_t dt__backend_default_impl(dt_backend_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = dt__backend_default();
  return DT_SUCCESS;
}

dt_status_t dt_backend_default(dt_backend_t* out) {
  DT_ENTRY_RETURN(dt__backend_default_impl(out));
}

static dt_status_t dt__backend_set_default_impl(dt_backend_t backend) {
  DT_CHECK(dt__backend_check(backend));
  dt__default = backend;
  return DT_SUCCESS;
}

dt_status_t dt_backend_set_default(dt_backend_t backend) {
  DT_ENTRY_RETURN(dt__backend_set_default_impl(backend));
}

static dt_status_t dt__backend_synchronize_impl(dt_backend_t backend) {
  DT_CHECK(dt__backend_check(backend));
  return backend->iface->synchronize ? backend->iface->synchronize(backend) : DT_SUCCESS;
}

dt_status_t dt_backend_synchronize(dt_backend_t backend) {
  DT_ENTRY_RETURN(dt__backend_synchronize_impl(backend));
}

static dt_status_t dt__backend_set_tf32_impl(dt_backend_t backend, int allow) {
  DT_CHECK(dt__backend_check(backend));
  backend->allow_tf32 = allow != 0;
  return DT_SUCCESS;
}

dt_status_t dt_backend_set_tf32(dt_backend_t backend, int allow) {
  DT_ENTRY_RETURN(dt__backend_set_tf32_impl(backend, allow));
}

static dt_status_t dt__backend_ordinal_impl(dt_backend_t backend, int* ordinal) {
  DT_ARG_NOT_NULL(ordinal);
  *ordinal = -1;
  DT_CHECK(dt__backend_check(backend));
  *ordinal = backend->ordinal;
  return DT_SUCCESS;
}

dt_status_t dt_backend_ordinal(dt_backend_t backend, int* ordinal) {
  DT_ENTRY_RETURN(dt__backend_ordinal_impl(backend, ordinal));
}

const char* dt_backend_name(dt_backend_t backend) {
  return dt__backend_check(backend) == DT_SUCCESS ? backend->name : "invalid";
}

static dt_status_t dt__backend_device_impl(dt_backend_t backend, dt_device_t* device) {
  DT_ARG_NOT_NULL(device);
  DT_CHECK(dt__backend_check(backend));
  *device = backend->device;
  return DT_SUCCESS;
}

dt_status_t dt_backend_device(dt_backend_t backend, dt_device_t* device) {
  DT_ENTRY_RETURN(dt__backend_device_impl(backend, device));
}

static dt_status_t dt__backend_verify_impl(dt_backend_t backend, int64_t* n_errors) {
  if (n_errors) *n_errors = 0;
  DT_CHECK(dt__backend_check(backend));
  if (backend->iface->verify == NULL) return DT_SUCCESS;
  return backend->iface->verify(backend, n_errors);
}

dt_status_t dt_backend_verify(dt_backend_t backend, int64_t* n_errors) {
  DT_ENTRY_RETURN(dt__backend_verify_impl(backend, n_errors));
}

static dt_status_t dt__backend_memory_impl(dt_backend_t backend, int64_t* nbytes, int64_t* blocks) {
  DT_CHECK(dt__backend_check(backend));
  if (nbytes) *nbytes = backend->live_nbytes;
  if (blocks) *blocks = backend->live_blocks;
  return DT_SUCCESS;
}

dt_status_t dt_backend_memory(dt_backend_t backend, int64_t* nbytes, int64_t* blocks) {
  DT_ENTRY_RETURN(dt__backend_memory_impl(backend, nbytes, blocks));
}

/* ---------------------------------------------------------------------------------------------
 * allocation accounting: every block a backend hands out for tensors or workspace */

void* dt__backend_alloc(dt_backend_t b, size_t nbytes) {
  void* p = b->iface->alloc(b, nbytes ? nbytes : 1);
  if (p != NULL) {
    b->live_nbytes += (int64_t)nbytes;
    b->live_blocks++;
  }
  return p;
}

void dt__backend_free(dt_backend_t b, void* p, size_t nbytes) {
  if (p == NULL) return;
  b->iface->free(b, p, nbytes ? nbytes : 1);
  b->live_nbytes -= (int64_t)nbytes;
  b->live_blocks--;
}

/* ---------------------------------------------------------------------------------------------
 * the storage pool */

#define DT_POOL_MIN (64u << 10)
#define DT_POOL_SLOTS 1024

static struct {
  pthread_mutex_t mu;
  int init;
  size_t cap, held;
  int n;
  size_t size[DT_POOL_SLOTS];
  void* ptr[DT_POOL_SLOTS];
  dt_backend_t owner[DT_POOL_SLOTS];
} dt__pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t dt__pool_class(size_t n) { return (n + 4095) & ~(size_t)4095; }

static void dt__pool_init_locked(void) {
  if (dt__pool.init) return;
  dt__pool.init = 1;
  const int64_t mb = dt__env_int("DTENSOR_POOL_MB", 0, (int64_t)1 << 30, 1024, "backend",
                                 "MiB, 0 (no pool) to 2^30"); /* 0: no pool */
  dt__pool.cap = (size_t)mb << 20;
}

static void dt__pool_release(void) {
  pthread_mutex_lock(&dt__pool.mu);
  for (int i = 0; i < dt__pool.n; i++)
    dt__pool.owner[i]->iface->free(dt__pool.owner[i], dt__pool.ptr[i], dt__pool.size[i]);
  dt__pool.n = 0;
  dt__pool.held = 0;
  dt__pool.init = 0;
  pthread_mutex_unlock(&dt__pool.mu);
}

size_t dt__pool_counted(dt_backend_t b, size_t n) {
  return b->pooled && n >= DT_POOL_MIN ? dt__pool_class(n) : n;
}

/* A block of at least n bytes (its exact size in *got, which the free must pass back). */
void* dt__pool_alloc(dt_backend_t b, size_t n, size_t* got) {
  *got = n;
  if (!b->pooled || n < DT_POOL_MIN) return dt__backend_alloc(b, n);
  const size_t c = dt__pool_class(n), most = c + c / 4;
  *got = c;
  int best = -1;
  void* p = NULL;
  pthread_mutex_lock(&dt__pool.mu);
  dt__pool_init_locked();
  for (int i = dt__pool.n - 1; i >= 0; i--) { /* its class, most recent first; else best fit */
    if (dt__pool.owner[i] != b || dt__pool.size[i] < c || dt__pool.size[i] > most) continue;
    if (best < 0 || dt__pool.size[i] < dt__pool.size[best]) best = i;
    if (dt__pool.size[i] == c) break;
  }
  if (best >= 0) {
    p = dt__pool.ptr[best];
    *got = dt__pool.size[best];
    dt__pool.held -= *got;
    dt__pool.n--;
    dt__pool.size[best] = dt__pool.size[dt__pool.n];
    dt__pool.ptr[best] = dt__pool.ptr[dt__pool.n];
    dt__pool.owner[best] = dt__pool.owner[dt__pool.n];
  }
  pthread_mutex_unlock(&dt__pool.mu);
  if (p == NULL) return dt__backend_alloc(b, c);
  b->live_nbytes += (int64_t)*got; /* handed out again */
  b->live_blocks++;
  return p;
}

void dt__pool_free(dt_backend_t b, void* p, size_t got) {
  if (p == NULL) return;
  if (!b->pooled || got < DT_POOL_MIN) {
    dt__backend_free(b, p, got);
    return;
  }
  pthread_mutex_lock(&dt__pool.mu);
  dt__pool_init_locked();
  int keep = dt__pool.held + got <= dt__pool.cap && dt__pool.n < DT_POOL_SLOTS;
  if (keep) {
    dt__pool.size[dt__pool.n] = got;
    dt__pool.ptr[dt__pool.n] = p;
    dt__pool.owner[dt__pool.n++] = b;
    dt__pool.held += got;
  }
  pthread_mutex_unlock(&dt__pool.mu);
  if (keep) {
    b->live_nbytes -= (int64_t)got;
    b->live_blocks--;
  } else {
    dt__backend_free(b, p, got);
  }
}

/* ---------------------------------------------------------------------------------------------
 * memory accounting by category */

static struct {
  int64_t cur[DT_MEM_COUNT], peak[DT_MEM_COUNT], total, total_peak;
} dt__mem;

void dt__mem_count(int c, int64_t nbytes) {
  dt__mem.cur[c] += nbytes;
  if (dt__mem.cur[c] > dt__mem.peak[c]) dt__mem.peak[c] = dt__mem.cur[c];
  dt__mem.total += nbytes;
  if (dt__mem.total > dt__mem.total_peak) dt__mem.total_peak = dt__mem.total;
}

const char* dt_mem_category_name(dt_mem_category_t c) {
  static const char* const names[DT_MEM_COUNT] = {"parameters", "gradients", "optimizer",
                                                  "activations", "communication", "other"};
  return c >= 0 && c < DT_MEM_COUNT ? names[c] : "invalid";
}

static dt_status_t dt__memory_stats_impl(dt_memory_stats_t* out) {
  DT_ARG_NOT_NULL(out);
  memcpy(out->current, dt__mem.cur, sizeof out->current);
  memcpy(out->peak, dt__mem.peak, sizeof out->peak);
  out->total_current = dt__mem.total;
  out->total_peak = dt__mem.total_peak;
  return DT_SUCCESS;
}

dt_status_t dt_memory_stats(dt_memory_stats_t* out) {
  DT_ENTRY_RETURN(dt__memory_stats_impl(out));
}

dt_status_t dt_memory_reset_peak(void) {
  memcpy(dt__mem.peak, dt__mem.cur, sizeof dt__mem.peak);
  dt__mem.total_peak = dt__mem.total;
  return DT_SUCCESS;
}

void dt__storage_set_category(dt_storage_t* s, int c) {
  if (s == NULL || !s->owned || s->category == c) return;
  dt__mem_count(s->category, -(int64_t)s->nbytes);
  s->category = c;
  dt__mem_count(c, (int64_t)s->nbytes);
}

/* ---------------------------------------------------------------------------------------------
 * storage */

dt_status_t dt__storage_new(dt_backend_t b, size_t nbytes, int zero, dt_storage_t** out) {
  *out = NULL;
  dt_storage_t* s = (dt_storage_t*)dt__malloc(sizeof *s);
  if (s == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a storage object");
  size_t got;
  s->ptr = dt__pool_alloc(b, nbytes ? nbytes : 1, &got);
  if (s->ptr == NULL) {
    dt__free(s);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s backend: %zu bytes of tensor storage", b->name,
                   nbytes);
  }
  s->refcount = 1;
  s->backend = b;
  s->nbytes = dt__pool_counted(b, nbytes ? nbytes : 1);
  s->block = got;
  s->owned = 1;
  s->category = DT_MEM_OTHER;
  dt__mem_count(DT_MEM_OTHER, (int64_t)s->nbytes);
  if (zero && nbytes) {
    dt_status_t st = b->iface->memset(b, s->ptr, 0, nbytes);
    if (st != DT_SUCCESS) {
      dt__storage_release(s);
      return st;
    }
  }
  *out = s;
  return DT_SUCCESS;
}

dt_status_t dt__storage_borrow(dt_backend_t b, void* ptr, size_t nbytes, dt_storage_t** out) {
  *out = NULL;
  dt_storage_t* s = (dt_storage_t*)dt__malloc(sizeof *s);
  if (s == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a storage object");
  s->refcount = 1;
  s->backend = b;
  s->ptr = ptr;
  s->nbytes = nbytes;
  s->block = nbytes;
  s->owned = 0;
  s->category = DT_MEM_OTHER;
  *out = s;
  return DT_SUCCESS;
}

void dt__storage_retain(dt_storage_t* s) {
  if (s) s->refcount++;
}

void dt__storage_release(dt_storage_t* s) {
  if (s == NULL || --s->refcount > 0) return;
  if (s->owned) {
    dt__mem_count(s->category, -(int64_t)s->nbytes);
    dt__pool_free(s->backend, s->ptr, s->block);
  }
  dt__free(s);
}

/* ---------------------------------------------------------------------------------------------
 * workspace: grow-only buffers reused by every blocking redistribution, so the steady path never
 * allocates */

dt_status_t dt__ws_reserve(dt_backend_t b, int slot, size_t nbytes, void** out) {
  if (nbytes > b->ws_cap[slot]) {
    size_t cap = b->ws_cap[slot] ? b->ws_cap[slot] : 4096;
    while (cap < nbytes) cap *= 2;
    void* p = dt__backend_alloc(b, cap);
    if (p == NULL)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s backend: workspace of %zu bytes", b->name, cap);
    dt__backend_free(b, b->ws[slot], b->ws_cap[slot]);
    dt__mem_count(DT_MEM_COMMUNICATION, (int64_t)cap - (int64_t)b->ws_cap[slot]);
    b->ws[slot] = p;
    b->ws_cap[slot] = cap;
  }
  *out = b->ws[slot];
  return DT_SUCCESS;
}

dt_status_t dt__stage_reserve(dt_backend_t b, int slot, size_t nbytes, void** out) {
  if (nbytes > b->stage_cap[slot]) {
    size_t cap = b->stage_cap[slot] ? b->stage_cap[slot] : 4096;
    while (cap < nbytes) cap *= 2;
    void* p = dt__host_stage_alloc(b, cap);
    if (p == NULL)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s backend: %zu bytes of host staging", b->name, cap);
    dt__host_stage_free(b, b->stage[slot], b->stage_cap[slot]);
    dt__mem_count(DT_MEM_COMMUNICATION, (int64_t)cap - (int64_t)b->stage_cap[slot]);
    b->stage[slot] = p;
    b->stage_cap[slot] = cap;
  }
  *out = b->stage[slot];
  return DT_SUCCESS;
}

void dt__backend_release_all(void) {
  dt__pool_release();
  dt__guarded_release();
  for (int i = 0; i < dt__nbackends; i++) {
    dt_backend_t b = dt__backends[i];
    for (int k = 0; k < DT_WS_SLOTS; k++) {
      dt__backend_free(b, b->ws[k], b->ws_cap[k]);
      dt__mem_count(DT_MEM_COMMUNICATION, -(int64_t)b->ws_cap[k]);
      b->ws[k] = NULL;
      b->ws_cap[k] = 0;
    }
    for (int k = 0; k < 2; k++) {
      dt__host_stage_free(b, b->stage[k], b->stage_cap[k]);
      dt__mem_count(DT_MEM_COMMUNICATION, -(int64_t)b->stage_cap[k]);
      b->stage[k] = NULL;
      b->stage_cap[k] = 0;
    }
    if (b->iface->release) b->iface->release(b);
  }
}

/* ---------------------------------------------------------------------------------------------
 * GEMM through a backend, staging memory, kernels */

dt_status_t dt__gemm(dt_backend_t b, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* a, int64_t lda, const float* bm, int64_t ldb,
                     float beta, float* c, int64_t ldc) {
  return dt__gemm_batched(b, trans_a, trans_b, m, n, k, alpha, a, lda, 0, bm, ldb, 0, beta, c,
                          ldc, 0, 1);
}

dt_status_t dt__gemm_batched(dt_backend_t b, int trans_a, int trans_b, int64_t m, int64_t n,
                             int64_t k, float alpha, const float* a, int64_t lda, int64_t sa,
                             const float* bm, int64_t ldb, int64_t sb, float beta, float* c,
                             int64_t ldc, int64_t sc, int64_t batch) {
  const dt_gemm_t g = {.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                       .batch = batch, .alpha = alpha, .beta = beta, .ab_dtype = DT_F32,
                       .c_dtype = DT_F32, .a = a, .lda = lda, .stride_a = sa, .b = bm,
                       .ldb = ldb, .stride_b = sb, .c = c, .ldc = ldc, .stride_c = sc};
  return b->iface->gemm(b, &g);
}

void* dt__host_stage_alloc(dt_backend_t b, size_t nbytes) {
  if (b->iface->host_alloc) return b->iface->host_alloc(b, nbytes ? nbytes : 1);
  return dt__malloc(nbytes ? nbytes : 1);
}

void dt__host_stage_free(dt_backend_t b, void* p, size_t nbytes) {
  if (p == NULL) return;
  if (b->iface->host_free) b->iface->host_free(b, p, nbytes ? nbytes : 1);
  else dt__free(p);
}

static int dt__half(dt_dtype_t t) { return t == DT_BF16 || t == DT_F16; }

static int64_t dt__local_numel(const dt_local_tensor_t* v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* The f32 copy run_kernel makes of a bf16/f16 tensor (0 for other dtypes). */
static size_t dt__f32_copy_nbytes(const dt_local_tensor_t* t) {
  if (!dt__half(t->dtype)) return 0;
  const int64_t n = dt__local_numel(t);
  return sizeof(float) * (size_t)(n ? n : 1);
}

int dt__run_kernel_converts(unsigned flags, const dt_local_tensor_t* in, int n_in,
                            const dt_local_tensor_t* out, int n_out) {
  int half = 0, one = 1;
  dt_dtype_t first = DT_DTYPE_COUNT; /* the first float dtype met; integer tensors do not count */
  for (int t = 0; t < n_in + n_out; t++) {
    const dt_dtype_t d = t < n_in ? in[t].dtype : out[t - n_in].dtype;
    if (d != DT_F32 && !dt__half(d)) continue;
    half |= dt__half(d);
    if (first == DT_DTYPE_COUNT) first = d;
    one &= d == first;
  }
  if (!half || (flags & DT_KERNEL_ANY_DTYPE)) return 0;
  return !((flags & DT_KERNEL_ONE_DTYPE) && one);
}

size_t dt__run_kernel_copies_nbytes(unsigned flags, const dt_local_tensor_t* in, int n_in,
                                    const dt_local_tensor_t* out, int n_out) {
  if (!dt__run_kernel_converts(flags, in, n_in, out, n_out)) return 0;
  size_t s = 0;
  for (int t = 0; t < n_in; t++) s += dt__f32_copy_nbytes(&in[t]);
  for (int o = 0; o < n_out; o++) s += dt__f32_copy_nbytes(&out[o]);
  return s;
}

int64_t dt__mem_window_begin(int c, int64_t* saved_peak) {
  *saved_peak = dt__mem.peak[c];
  dt__mem.peak[c] = dt__mem.cur[c];
  return dt__mem.cur[c];
}

int64_t dt__mem_window_end(int c, int64_t start, int64_t saved_peak) {
  const int64_t held = dt__mem.peak[c] - start;
  if (saved_peak > dt__mem.peak[c]) dt__mem.peak[c] = saved_peak;
  return held;
}

dt_status_t dt__backend_run_kernel(dt_backend_t b, dt_op_kernel_fn kernel, unsigned flags,
                                   const dt_op_call_t* call, dt_local_tensor_t* in, int n_in,
                                   dt_local_tensor_t* out, int n_out) {
  if (!dt__run_kernel_converts(flags, in, n_in, out, n_out)) return kernel(call, in, out);
  /* bf16/f16 storage: the kernel sees f32 copies (converted on load, stored back after) */
  dt_status_t st = DT_SUCCESS;
  void* tmp_in[DT_OP_MAX_INPUTS] = {NULL};
  void* tmp_out[DT_OP_MAX_OUTPUTS] = {NULL};
  size_t nb_in[DT_OP_MAX_INPUTS] = {0}, nb_out[DT_OP_MAX_OUTPUTS] = {0}; /* the pool's blocks */
  size_t cnt_in[DT_OP_MAX_INPUTS] = {0}, cnt_out[DT_OP_MAX_OUTPUTS] = {0}; /* counted as "other" */
  dt_local_tensor_t lin[DT_OP_MAX_INPUTS], lout[DT_OP_MAX_OUTPUTS];
  for (int t = 0; t < n_in; t++) {
    lin[t] = in[t];
    if (!dt__half(in[t].dtype)) continue;
    int64_t n = dt__local_numel(&in[t]);
    size_t need = dt__f32_copy_nbytes(&in[t]);
    tmp_in[t] = dt__pool_alloc(b, need, &nb_in[t]);
    if (tmp_in[t] == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: f32 copy of input %d", call->op, t);
      goto done;
    }
    dt__mem_count(DT_MEM_OTHER, (int64_t)need);
    cnt_in[t] = need;
    DT_CHECK_GOTO(b->iface->convert(b, in[t].data, in[t].dtype, tmp_in[t], DT_F32, n), st, done);
    lin[t].data = tmp_in[t];
    lin[t].dtype = DT_F32;
  }
  for (int o = 0; o < n_out; o++) {
    lout[o] = out[o];
    if (!dt__half(out[o].dtype)) continue;
    size_t need = dt__f32_copy_nbytes(&out[o]);
    tmp_out[o] = dt__pool_alloc(b, need, &nb_out[o]);
    if (tmp_out[o] == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: f32 buffer of output %d", call->op, o);
      goto done;
    }
    dt__mem_count(DT_MEM_OTHER, (int64_t)need);
    cnt_out[o] = need;
    if (!(flags & DT_KERNEL_WRITES_ALL)) /* what the kernel leaves is the output's own value */
      DT_CHECK_GOTO(b->iface->convert(b, out[o].data, out[o].dtype, tmp_out[o], DT_F32,
                                      dt__local_numel(&out[o])),
                    st, done);
    lout[o].data = tmp_out[o];
    lout[o].dtype = DT_F32;
  }
  DT_CHECK_GOTO(kernel(call, lin, lout), st, done);
  for (int o = 0; o < n_out; o++)
    if (tmp_out[o] != NULL)
      DT_CHECK_GOTO(b->iface->convert(b, tmp_out[o], DT_F32, out[o].data, out[o].dtype,
                                      dt__local_numel(&out[o])),
                    st, done);
done:
  for (int t = 0; t < n_in; t++)
    if (tmp_in[t] != NULL) {
      dt__pool_free(b, tmp_in[t], nb_in[t]);
      dt__mem_count(DT_MEM_OTHER, -(int64_t)cnt_in[t]);
    }
  for (int o = 0; o < n_out; o++)
    if (tmp_out[o] != NULL) {
      dt__pool_free(b, tmp_out[o], nb_out[o]);
      dt__mem_count(DT_MEM_OTHER, -(int64_t)cnt_out[o]);
    }
  return st;
}


/* ---------------------------------------------------------------------------------------------
 * device backends this build lacks */

#ifndef DTENSOR_HAVE_CUDA
dt_status_t dt__backend_cuda_open(int ordinal, dt_backend_t* out) {
  (void)ordinal;
  *out = NULL;
  return DT_FAIL(DT_ERR_UNSUPPORTED, "this build of dtensor has no CUDA backend (configure with "
                 "-DDTENSOR_CUDA=ON on a machine with the CUDA toolkit)");
}
#endif

#ifndef DTENSOR_HAVE_SIMT_EMU
dt_status_t dt__backend_cuda_emu_open(dt_backend_t* out) {
  *out = NULL;
  return DT_FAIL(DT_ERR_UNSUPPORTED, "this build of dtensor has no cuda-emu backend (configure "
                 "with -DDTENSOR_SIMT_EMU=ON; it needs a C++17 compiler)");
}
#endif

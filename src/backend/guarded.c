/* guarded.c - the guarded host backend: a second implementation of the backend vtable that makes
 * memory mistakes visible, for tests.
 *
 * Every block sits between two 64-byte guard regions of a known pattern and starts filled with
 * 0xFF bytes (a NaN in every float dtype), so reading memory nobody wrote shows up as NaN.
 * Freeing checks the guards, poisons the block (0xDD) and keeps it in a bounded quarantine; when
 * it leaves the quarantine its poison is checked (a write after free). Every memset, fill, copy,
 * box copy, scale, conversion, reduction and GEMM operand that points into a guarded block must
 * stay inside it (else DT_ERR_INTERNAL naming the overrun); touching a quarantined block is an
 * error too. Around a kernel, outputs that the kernel writes in full are poisoned first, inputs
 * are checksummed, and afterwards the guards of every block involved are checked and the inputs
 * must be unchanged. Damage found where no status can be returned (a free) is counted and kept
 * for dt_backend_verify. Memory that is not a guarded block (borrowed buffers) passes unchecked.
 * The math itself is the CPU backend's.
 */
#include <pthread.h>
#include <stdio.h>

#include "backend/backend.h"

#define DT_GUARD 64
#define DT_HDR 64
#define DT_GUARD_BYTE 0xABu
#define DT_POISON_BYTE 0xDDu
#define DT_FRESH_BYTE 0xFFu
#define DT_BLOCK_MAGIC 0x47554152u /* "GUAR" */
#define DT_QUARANTINE_MAX 256
#define DT_QUARANTINE_BYTES ((size_t)256 << 20)

typedef struct dt_gblock {
  uint32_t magic;
  int state; /* 1 live, 2 quarantined */
  size_t n;  /* user bytes */
} dt_gblock_t;
_Static_assert(sizeof(dt_gblock_t) <= DT_HDR, "header too large");

typedef struct {
  uintptr_t start, end; /* user range [start, end) */
  dt_gblock_t* hdr;
} dt_grange_t;

static struct {
  pthread_mutex_t mu;
  dt_grange_t* live; /* sorted by start */
  size_t n_live, cap_live;
  dt_gblock_t* quar[DT_QUARANTINE_MAX]; /* FIFO */
  int q_head, q_len;
  size_t q_bytes;
  int64_t errors;
  char first[512]; /* the first damage found outside a call that can return it */
} dt__g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static unsigned char* dt__user(dt_gblock_t* h) { return (unsigned char*)h + DT_HDR + DT_GUARD; }

/* Offset of the first byte of [p, p+n) that differs from `byte`, or -1. */
static int64_t dt__first_not(const unsigned char* p, size_t n, unsigned char byte) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != byte) return (int64_t)i;
  return -1;
}

/* Records damage found where no status can be returned. */
static void dt__record(const char* fmt, size_t a, int64_t b) {
  if (dt__g.errors++ == 0) snprintf(dt__g.first, sizeof dt__g.first, fmt, a, (long long)b);
}

/* Checks a block's guards; records and returns 0 on damage. */
static int dt__guards_ok(dt_gblock_t* h, int record) {
  unsigned char* u = dt__user(h);
  int64_t f = dt__first_not(u - DT_GUARD, DT_GUARD, DT_GUARD_BYTE);
  int64_t e = dt__first_not(u + h->n, DT_GUARD, DT_GUARD_BYTE);
  if (f < 0 && e < 0) return 1;
  if (record) {
    if (f >= 0) dt__record("guarded backend: a write before a block of %zu bytes (%lld bytes "
                           "before its start)", h->n, (int64_t)DT_GUARD - f);
    else dt__record("guarded backend: a write past the end of a block of %zu bytes (%lld bytes "
                    "past)", h->n, e + 1);
  }
  return 0;
}

static size_t dt__find(uintptr_t p) { /* index of the last range with start <= p, or n_live */
  size_t lo = 0, hi = dt__g.n_live;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (dt__g.live[mid].start <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo == 0 ? dt__g.n_live : lo - 1;
}

static void* dt__g_alloc(dt_backend_t b, size_t n) {
  (void)b;
  unsigned char* raw = (unsigned char*)malloc(DT_HDR + DT_GUARD + n + DT_GUARD);
  if (raw == NULL) return NULL;
  dt_gblock_t* h = (dt_gblock_t*)raw;
  h->magic = DT_BLOCK_MAGIC;
  h->state = 1;
  h->n = n;
  unsigned char* u = dt__user(h);
  memset(u - DT_GUARD, DT_GUARD_BYTE, DT_GUARD);
  memset(u, DT_FRESH_BYTE, n);
  memset(u + n, DT_GUARD_BYTE, DT_GUARD);
  pthread_mutex_lock(&dt__g.mu);
  if (dt__g.n_live == dt__g.cap_live) {
    size_t cap = dt__g.cap_live ? 2 * dt__g.cap_live : 256;
    dt_grange_t* r = (dt_grange_t*)realloc(dt__g.live, cap * sizeof *r);
    if (r == NULL) {
      pthread_mutex_unlock(&dt__g.mu);
      free(raw);
      return NULL;
    }
    dt__g.live = r;
    dt__g.cap_live = cap;
  }
  uintptr_t s = (uintptr_t)u;
  size_t i = dt__g.n_live;
  while (i > 0 && dt__g.live[i - 1].start > s) i--;
  memmove(&dt__g.live[i + 1], &dt__g.live[i], (dt__g.n_live - i) * sizeof *dt__g.live);
  dt__g.live[i] = (dt_grange_t){s, s + n, h};
  dt__g.n_live++;
  pthread_mutex_unlock(&dt__g.mu);
  return u;
}

/* Leaves the quarantine: the poison must be intact (no write after free). */
static void dt__evict_locked(void) {
  dt_gblock_t* h = dt__g.quar[dt__g.q_head];
  dt__g.q_head = (dt__g.q_head + 1) % DT_QUARANTINE_MAX;
  dt__g.q_len--;
  dt__g.q_bytes -= h->n;
  int64_t bad = dt__first_not(dt__user(h), h->n, DT_POISON_BYTE);
  if (bad >= 0)
    dt__record("guarded backend: a write into a freed block of %zu bytes (offset %lld)", h->n, bad);
  free(h);
}

static void dt__g_free(dt_backend_t b, void* p, size_t n) {
  (void)b;
  if (p == NULL) return;
  pthread_mutex_lock(&dt__g.mu);
  size_t i = dt__find((uintptr_t)p);
  if (i == dt__g.n_live || dt__g.live[i].start != (uintptr_t)p) {
    dt__record("guarded backend: free of %zu bytes that are not a live block (double free?) %lld",
               n, 0);
    pthread_mutex_unlock(&dt__g.mu);
    return;
  }
  dt_gblock_t* h = dt__g.live[i].hdr;
  memmove(&dt__g.live[i], &dt__g.live[i + 1], (dt__g.n_live - i - 1) * sizeof *dt__g.live);
  dt__g.n_live--;
  if (h->n != n) dt__record("guarded backend: a block of %zu bytes freed as %lld bytes", h->n,
                            (int64_t)n);
  dt__guards_ok(h, 1);
  memset(dt__user(h), DT_POISON_BYTE, h->n);
  h->state = 2;
  while (dt__g.q_len > 0 &&
         (dt__g.q_len == DT_QUARANTINE_MAX || dt__g.q_bytes + h->n > DT_QUARANTINE_BYTES))
    dt__evict_locked();
  dt__g.quar[(dt__g.q_head + dt__g.q_len) % DT_QUARANTINE_MAX] = h;
  dt__g.q_len++;
  dt__g.q_bytes += h->n;
  pthread_mutex_unlock(&dt__g.mu);
}

/* [p, p + n) must lie inside one live block when it starts in one, and never in a freed one. */
static dt_status_t dt__range(const void* p, size_t n, const char* what) {
  if (n == 0 || p == NULL) return DT_SUCCESS;
  uintptr_t s = (uintptr_t)p;
  dt_status_t st = DT_SUCCESS;
  pthread_mutex_lock(&dt__g.mu);
  size_t i = dt__find(s);
  if (i < dt__g.n_live && s < dt__g.live[i].end) {
    if (s + n > dt__g.live[i].end)
      st = DT_FAIL(DT_ERR_INTERNAL, "guarded backend: %s of %zu bytes at offset %zu overruns a "
                   "block of %zu bytes", what, n, (size_t)(s - dt__g.live[i].start),
                   (size_t)(dt__g.live[i].end - dt__g.live[i].start));
  } else {
    for (int q = 0; q < dt__g.q_len && st == DT_SUCCESS; q++) {
      dt_gblock_t* h = dt__g.quar[(dt__g.q_head + q) % DT_QUARANTINE_MAX];
      uintptr_t u = (uintptr_t)dt__user(h);
      if (s >= u && s < u + h->n)
        st = DT_FAIL(DT_ERR_INTERNAL, "guarded backend: %s touches a freed block of %zu bytes "
                     "(offset %zu)", what, h->n, (size_t)(s - u));
    }
  }
  pthread_mutex_unlock(&dt__g.mu);
  return st;
}

/* Bytes spanned by the box `ext` at `off` of a row-major array of extent `shape`. */
static void dt__box_span(int ndim, size_t item, const int64_t* shape, const int64_t* off,
                         const int64_t* ext, size_t* first, size_t* count) {
  int64_t lo = 0, hi = 0, empty = 0;
  for (int d = 0; d < ndim; d++) {
    lo = lo * shape[d] + off[d];
    hi = hi * shape[d] + off[d] + (ext[d] > 0 ? ext[d] - 1 : 0);
    empty |= ext[d] == 0;
  }
  *first = (size_t)lo * item;
  *count = empty ? 0 : (size_t)(hi - lo + 1) * item;
}

static dt_status_t dt__g_memset(dt_backend_t b, void* dst, int value, size_t nbytes) {
  DT_CHECK(dt__range(dst, nbytes, "memset"));
  return dt__host_memset(b, dst, value, nbytes);
}

static dt_status_t dt__g_fill(dt_backend_t b, void* dst, dt_dtype_t dtype, int64_t n, double v) {
  DT_CHECK(dt__range(dst, (size_t)n * dt__itemsize(dtype), "fill"));
  return dt__host_fill(b, dst, dtype, n, v);
}

static dt_status_t dt__g_copy(dt_backend_t b, void* dst, const void* src, size_t nbytes,
                              dt_copy_kind_t kind) {
  DT_CHECK(dt__range(dst, nbytes, "copy destination"));
  DT_CHECK(dt__range(src, nbytes, "copy source"));
  return dt__host_copy(b, dst, src, nbytes, kind);
}

static dt_status_t dt__g_split_copy(dt_backend_t b, int ndim, size_t item, const int64_t* shape,
                                    int dim, int n, const int64_t* offs, const int64_t* lens,
                                    void* array, void* packed, int to_packed) {
  int64_t other = 1, blocks = 0;
  for (int d = 0; d < ndim; d++)
    if (d != dim) other *= shape[d];
  int64_t numel = other * shape[dim];
  for (int q = 0; q < n; q++) {
    if (lens[q] < 0 || offs[q] < 0 || offs[q] + lens[q] > shape[dim])
      return DT_FAIL(DT_ERR_INTERNAL, "guarded backend: split copy block %d [%lld, +%lld) "
                     "outside dim %d of extent %lld", q, (long long)offs[q], (long long)lens[q],
                     dim, (long long)shape[dim]);
    blocks += lens[q] * other;
  }
  DT_CHECK(dt__range(array, (size_t)numel * item, "split copy array"));
  DT_CHECK(dt__range(packed, (size_t)blocks * item, "split copy packed buffer"));
  return dt__host_split_copy(b, ndim, item, shape, dim, n, offs, lens, array, packed, to_packed);
}

static dt_status_t dt__g_box_copy(dt_backend_t b, int ndim, size_t item, const int64_t* ext,
                                  void* dst, const int64_t* dst_shape, const int64_t* dst_off,
                                  const void* src, const int64_t* src_shape,
                                  const int64_t* src_off) {
  size_t f, n;
  dt__box_span(ndim, item, dst_shape, dst_off, ext, &f, &n);
  DT_CHECK(dt__range((const char*)dst + f, n, "box copy destination"));
  dt__box_span(ndim, item, src_shape, src_off, ext, &f, &n);
  DT_CHECK(dt__range((const char*)src + f, n, "box copy source"));
  return dt__host_box_copy(b, ndim, item, ext, dst, dst_shape, dst_off, src, src_shape, src_off);
}

static dt_status_t dt__g_scale_div(dt_backend_t b, void* buf, dt_dtype_t dtype, int64_t n,
                                   int div) {
  DT_CHECK(dt__range(buf, (size_t)n * dt__itemsize(dtype), "scale"));
  return dt__host_scale_div(b, buf, dtype, n, div);
}

static dt_status_t dt__g_convert(dt_backend_t b, const void* src, dt_dtype_t from, void* dst,
                                 dt_dtype_t to, int64_t n) {
  DT_CHECK(dt__range(src, (size_t)n * dt__itemsize(from), "conversion source"));
  DT_CHECK(dt__range(dst, (size_t)n * dt__itemsize(to), "conversion destination"));
  return dt__host_convert(b, src, from, dst, to, n);
}

static dt_status_t dt__g_reduce(dt_backend_t b, void* dst, const void* a, const void* src,
                                dt_dtype_t dtype, int64_t n, dt_reduce_op_t op) {
  DT_CHECK(dt__range(dst, (size_t)n * dt__itemsize(dtype), "reduction destination"));
  DT_CHECK(dt__range(a, (size_t)n * dt__itemsize(dtype), "reduction operand"));
  DT_CHECK(dt__range(src, (size_t)n * dt__itemsize(dtype), "reduction source"));
  return dt__host_reduce(b, dst, a, src, dtype, n, op);
}

/* Bytes spanned by a rows x cols row-major matrix of `item`-byte elements with row stride ld. */
static size_t dt__mat_span(int64_t rows, int64_t cols, int64_t ld, size_t item) {
  return rows == 0 || cols == 0 ? 0 : (size_t)((rows - 1) * ld + cols) * item;
}

static dt_status_t dt__g_gemm(dt_backend_t b, const dt_gemm_t* g) {
  const size_t ia = dt__itemsize(g->ab_dtype), ic = dt__itemsize(g->c_dtype);
  for (int64_t i = 0; i < g->batch; i++) {
    const char* a = (const char*)g->a + (size_t)(i * g->stride_a) * ia;
    const char* bm = (const char*)g->b + (size_t)(i * g->stride_b) * ia;
    const char* c = (const char*)g->c + (size_t)(i * g->stride_c) * ic;
    DT_CHECK(dt__range(a, g->trans_a ? dt__mat_span(g->k, g->m, g->lda, ia)
                                     : dt__mat_span(g->m, g->k, g->lda, ia), "GEMM operand A"));
    DT_CHECK(dt__range(bm, g->trans_b ? dt__mat_span(g->n, g->k, g->ldb, ia)
                                      : dt__mat_span(g->k, g->n, g->ldb, ia), "GEMM operand B"));
    DT_CHECK(dt__range(c, dt__mat_span(g->m, g->n, g->ldc, ic), "GEMM result C"));
  }
  if (g->bias) DT_CHECK(dt__range(g->bias, (size_t)g->n * ic, "GEMM bias"));
  return dt__host_gemm(b, g);
}

static dt_status_t dt__g_copy_ranges(dt_backend_t b, void* dst, const void* src, int n,
                                     const int64_t* dst_off, const int64_t* src_off,
                                     const int64_t* nbytes) {
  for (int i = 0; i < n; i++) {
    if (nbytes[i] <= 0) continue;
    DT_CHECK(dt__range((char*)dst + dst_off[i], (size_t)nbytes[i], "range copy destination"));
    DT_CHECK(dt__range((const char*)src + src_off[i], (size_t)nbytes[i], "range copy source"));
  }
  return dt__host_copy_ranges(b, dst, src, n, dst_off, src_off, nbytes);
}

static size_t dt__lt_nbytes(const dt_local_tensor_t* t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return (size_t)n * dt__itemsize(t->dtype);
}

/* The live block holding p, or NULL. */
static dt_gblock_t* dt__block_of(const void* p) {
  if (p == NULL) return NULL;
  dt_gblock_t* h = NULL;
  pthread_mutex_lock(&dt__g.mu);
  size_t i = dt__find((uintptr_t)p);
  if (i < dt__g.n_live && (uintptr_t)p < dt__g.live[i].end) h = dt__g.live[i].hdr;
  pthread_mutex_unlock(&dt__g.mu);
  return h;
}

static dt_status_t dt__g_run_kernel(dt_backend_t b, dt_op_kernel_fn kernel, unsigned flags,
                                    const dt_op_call_t* call, dt_local_tensor_t* in, int n_in,
                                    dt_local_tensor_t* out, int n_out) {
  uint64_t sum[DT_OP_MAX_INPUTS] = {0};
  for (int t = 0; t < n_in; t++) {
    size_t nb = dt__lt_nbytes(&in[t]);
    DT_CHECK(dt__range(in[t].data, nb, "kernel input"));
    if (!(flags & DT_KERNEL_INPLACE) && nb) sum[t] = dt__hash_bytes(in[t].data, nb);
  }
  for (int o = 0; o < n_out; o++) {
    size_t nb = dt__lt_nbytes(&out[o]);
    DT_CHECK(dt__range(out[o].data, nb, "kernel output"));
    int aliased = 0; /* an in-place output is also an input: keep its values */
    for (int t = 0; t < n_in; t++) aliased |= out[o].data == in[t].data;
    if ((flags & DT_KERNEL_WRITES_ALL) && !aliased && nb && dt__block_of(out[o].data))
      memset(out[o].data, DT_FRESH_BYTE, nb); /* unwritten elements read back as NaN */
  }
  DT_CHECK(dt__backend_run_kernel(b, kernel, flags, call, in, n_in, out, n_out));
  for (int k = 0; k < n_in + n_out; k++) {
    const dt_local_tensor_t* t = k < n_in ? &in[k] : &out[k - n_in];
    dt_gblock_t* h = dt__block_of(t->data);
    if (h != NULL && !dt__guards_ok(h, 0))
      return DT_FAIL(DT_ERR_INTERNAL, "guarded backend: kernel %s wrote outside a block of %zu "
                     "bytes (%s %d)", call->op, h->n, k < n_in ? "input" : "output",
                     k < n_in ? k : k - n_in);
  }
  for (int t = 0; t < n_in && !(flags & DT_KERNEL_INPLACE); t++) {
    size_t nb = dt__lt_nbytes(&in[t]);
    if (nb && dt__hash_bytes(in[t].data, nb) != sum[t])
      return DT_FAIL(DT_ERR_INTERNAL, "guarded backend: kernel %s modified its input %d",
                     call->op, t);
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_verify(dt_backend_t b, int64_t* n_errors) {
  (void)b;
  pthread_mutex_lock(&dt__g.mu);
  for (size_t i = 0; i < dt__g.n_live; i++) dt__guards_ok(dt__g.live[i].hdr, 1);
  for (int q = 0; q < dt__g.q_len; q++) {
    dt_gblock_t* h = dt__g.quar[(dt__g.q_head + q) % DT_QUARANTINE_MAX];
    int64_t bad = dt__first_not(dt__user(h), h->n, DT_POISON_BYTE);
    if (bad >= 0) {
      dt__record("guarded backend: a write into a freed block of %zu bytes (offset %lld)", h->n,
                 bad);
      memset(dt__user(h), DT_POISON_BYTE, h->n); /* counted once */
    }
  }
  int64_t e = dt__g.errors;
  char first[sizeof dt__g.first];
  memcpy(first, dt__g.first, sizeof first);
  pthread_mutex_unlock(&dt__g.mu);
  if (n_errors) *n_errors = e;
  if (e > 0) return DT_FAIL(DT_ERR_INTERNAL, "%s (%lld problems found so far)", first, (long long)e);
  return DT_SUCCESS;
}

static const struct dt_backend_i dt__guarded_iface = {
    .alloc = dt__g_alloc,
    .free = dt__g_free,
    .memset = dt__g_memset,
    .fill = dt__g_fill,
    .copy = dt__g_copy,
    .copy_ranges = dt__g_copy_ranges,
    .box_copy = dt__g_box_copy,
    .split_copy = dt__g_split_copy,
    .scale_div = dt__g_scale_div,
    .convert = dt__g_convert,
    .reduce = dt__g_reduce,
    .gemm = dt__g_gemm,
    .run_kernel = dt__g_run_kernel,
    .verify = dt__g_verify,
};

struct dt_backend dt__backend_guarded = {
    .iface = &dt__guarded_iface,
    .api_version = DT_BACKEND_API_VERSION,
    .name = "guarded",
    .device = DT_DEVICE_HOST,
    .ordinal = -1,
    .kernel_set = DT_KERNELS_HOST,
    .pooled = 0,
};

/* Frees the quarantine (dt_finalize): every block's poison is checked on the way out. */
void dt__guarded_release(void) {
  pthread_mutex_lock(&dt__g.mu);
  while (dt__g.q_len > 0) dt__evict_locked();
  pthread_mutex_unlock(&dt__g.mu);
}

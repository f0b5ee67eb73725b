/* deadline.c - the deadline of collective waits: the timeout value ($DTENSOR_TIMEOUT_S,
 * dt_set_timeout), the host's timeout handler, the thread's "what is running" context set by the
 * redistribute executor, and the timeout report; and the records and verdict of the collective
 * check (DTENSOR_DEBUG=collectives), which name the same context. Independent of MPI: an
 * implementation of the comm vtable runs its own wait loop and calls dt__comm_timeout when the
 * deadline has passed, and exchanges the check's records its own way.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "comm/comm.h"
#include "dtensor/mesh.h"

#define DT__TIMEOUT_DEFAULT_S 600.0 /* PyTorch's NCCL watchdog default */

static double dt__timeout = DT__TIMEOUT_DEFAULT_S;
static dt_timeout_fn dt__handler = NULL;
static void* dt__handler_ctx = NULL;

typedef struct {
  unsigned mesh_dims;
  int step, nsteps, ndim; /* ndim 0: no placements */
  dt_placement_t before[DT_MAX_MESH_DIMS], after[DT_MAX_MESH_DIMS];
} dt__what_t;
static _Thread_local dt__what_t dt__what;
static _Thread_local unsigned dt__what_epoch;

double dt__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dt__timeout_s(void) { return dt__timeout; }

#define DT__POLL_CLOCK_EVERY 64u /* polls between clock reads (a power of 2) */

void dt__poll_init(dt__poll_t* p, unsigned spin, double nap_after_s, long nap_ns) {
  memset(p, 0, sizeof *p);
  p->spin = spin;
  p->nap_after_s = nap_after_s;
  p->nap_ns = nap_ns;
}

int dt__poll_next(dt__poll_t* p, double* waited) {
  *waited = 0.0;
  if (++p->polls < p->spin) return 0;
  if ((p->polls & (DT__POLL_CLOCK_EVERY - 1)) == 0) {
    double now = dt__now_s();
    if (!p->started) {
      p->started = 1;
      p->t0 = now;
      p->limit = dt__timeout;
    } else if (now - p->t0 >= p->limit) {
      *waited = now - p->t0;
      return 1;
    }
    p->nap = now - p->t0 >= p->nap_after_s;
  }
  if (p->nap) {
    struct timespec ts = {0, p->nap_ns};
    nanosleep(&ts, NULL);
  } else {
    sched_yield();
  }
  return 0;
}

int dt__poll_clock_read(const dt__poll_t* p) {
  return p->polls >= p->spin && (p->polls & (DT__POLL_CLOCK_EVERY - 1)) == 0;
}

dt_status_t dt__timeout_parse(const char* text, const char* source, double* out) {
  if (text == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: no value", source);
  char* end = NULL;
  double v = strtod(text, &end);
  int rest = 0;
  if (end != NULL)
    for (const char* p = end; *p; p++) rest |= !isspace((unsigned char)*p);
  if (end == text || rest || !isfinite(v) || !(v > 0))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "%s = \"%s\" is not a timeout: expected a positive finite number of seconds "
                   "(e.g. 600 or 2.5)",
                   source, text);
  *out = v;
  return DT_SUCCESS;
}

dt_status_t dt__timeout_from_env(void) {
  const char* e = getenv("DTENSOR_TIMEOUT_S");
  if (e == NULL || *e == '\0') return DT_SUCCESS;
  double v;
  DT_CHECK(dt__timeout_parse(e, "DTENSOR_TIMEOUT_S", &v));
  dt__timeout = v;
  return DT_SUCCESS;
}

static dt_status_t dt__set_timeout(double seconds) {
  if (!isfinite(seconds) || !(seconds > 0))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "seconds=%g (valid: a positive finite number of seconds)", seconds);
  dt__timeout = seconds;
  return DT_SUCCESS;
}

dt_status_t dt_set_timeout(double seconds) { DT_ENTRY_RETURN(dt__set_timeout(seconds)); }

static dt_status_t dt__get_timeout(double* seconds) {
  DT_ARG_NOT_NULL(seconds);
  *seconds = dt__timeout;
  return DT_SUCCESS;
}

dt_status_t dt_get_timeout(double* seconds) { DT_ENTRY_RETURN(dt__get_timeout(seconds)); }

dt_status_t dt_set_timeout_handler(dt_timeout_fn fn, void* ctx) {
  dt__handler = fn;
  dt__handler_ctx = fn ? ctx : NULL;
  return DT_SUCCESS;
}

void dt__comm_what_set(unsigned mesh_dims, int step, int nsteps, int ndim,
                       const dt_placement_t* before, const dt_placement_t* after) {
  dt__what_epoch++;
  dt__what.mesh_dims = mesh_dims;
  dt__what.step = step;
  dt__what.nsteps = nsteps;
  dt__what.ndim = 0;
  if (before && after && ndim > 0 && ndim <= DT_MAX_MESH_DIMS) {
    dt__what.ndim = ndim;
    memcpy(dt__what.before, before, sizeof(dt_placement_t) * (size_t)ndim);
    memcpy(dt__what.after, after, sizeof(dt_placement_t) * (size_t)ndim);
  }
}

/* "S(0)->R" over the reported dims ("S(0)S(1)->RR" for a merged step); "" without placements. */
static void dt__transition_format(const dt__what_t* w, char* buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  if (w->ndim == 0) return;
  for (int side = 0; side < 2; side++) {
    if (side && n < cap) n += (size_t)snprintf(buf + n, cap - n, "->");
    for (int i = 0; i < w->ndim && n < cap; i++) {
      if (w->mesh_dims && !(w->mesh_dims & (1u << i))) continue;
      char one[32];
      if (dt_placement_format(side ? w->after[i] : w->before[i], one, sizeof one) != DT_SUCCESS)
        snprintf(one, sizeof one, "?");
      n += (size_t)snprintf(buf + n, cap - n, "%s", one);
    }
  }
}

void dt__comm_what_clear(void) {
  dt__what_epoch++;
  memset(&dt__what, 0, sizeof dt__what);
}

unsigned dt__comm_what_epoch(void) { return dt__what_epoch; }

void dt__comm_what_format(char* buf, size_t cap) {
  const dt__what_t* w = &dt__what;
  buf[0] = '\0';
  if (w->mesh_dims == 0 && w->nsteps == 0 && w->ndim == 0) return;
  size_t n = 0;
  n += (size_t)snprintf(buf + n, cap - n, " (");
  if (w->mesh_dims) {
    int many = (w->mesh_dims & (w->mesh_dims - 1)) != 0;
    n += (size_t)snprintf(buf + n, cap - n, "mesh dim%s ", many ? "s" : "");
    const char* sep = "";
    for (int i = 0; i < 32 && n < cap; i++)
      if (w->mesh_dims & (1u << i)) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", sep, i);
        sep = ",";
      }
  }
  char tr[128];
  dt__transition_format(w, tr, sizeof tr);
  if (w->nsteps > 0 && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, "%sstep %d/%d", w->mesh_dims ? ", " : "",
                          w->step + 1, w->nsteps);
  if (tr[0] && n < cap) n += (size_t)snprintf(buf + n, cap - n, " %s", tr);
  if (n < cap) snprintf(buf + n, cap - n, ")");
}

int dt__comm_timeout(const char* op, int world_rank, int comm_size, double waited,
                     dt_status_t* st) {
  char what[256], msg[640];
  dt__comm_what_format(what, sizeof what);
  snprintf(msg, sizeof msg,
           "[dtensor rank %d] DT_ERR_TIMEOUT: %s%s on a communicator of %d ranks did not complete "
           "within %g s (waited %.1f s; DTENSOR_TIMEOUT_S / dt_set_timeout): a rank of it has "
           "stopped, died or did not make the same call",
           world_rank, op ? op : "collective", what, comm_size, dt__timeout, waited);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
  int ret = dt__handler ? dt__handler(msg, dt__handler_ctx) : DT_TIMEOUT_ABORT;
  if (ret == DT_TIMEOUT_RETURN) {
    *st = DT_FAIL(DT_ERR_TIMEOUT, "%s", msg);
    return 1;
  }
  fprintf(stderr, "[dtensor rank %d] aborting the job (MPI_Abort, error code %d)\n", world_rank,
          (int)DT_ERR_TIMEOUT);
  fflush(stderr);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * the collective check: one rank's record of the call it is about to make, and the verdict on
 * the records of every rank */

typedef struct {
  int32_t kind, dtype, op, root, world_rank, n;
  int64_t numel;
  char what[168]; /* the thread's context, formatted (" (mesh dim 0, step 1/2 S(0)->R)") */
} dt__rec_t;      /* followed by int64_t counts[n], rcounts[n] */

static const char* const dt__call_names[DT_CALL_COUNT] = {
    [0] = "none",
    [DT_CALL_ALL_GATHER] = "all_gather",
    [DT_CALL_ALL_REDUCE] = "all_reduce",
    [DT_CALL_REDUCE_SCATTER] = "reduce_scatter",
    [DT_CALL_ALL_TO_ALL] = "all_to_all",
    [DT_CALL_BROADCAST] = "broadcast",
    [DT_CALL_SCATTER] = "scatter",
    [DT_CALL_SPLIT] = "communicator split",
    [DT_CALL_DUP] = "communicator duplicate"};
_Static_assert(DT_CALL_COUNT == 9, "update dt__call_names");

size_t dt__call_rec_nbytes(int n) { return sizeof(dt__rec_t) + 2 * sizeof(int64_t) * (size_t)n; }

static const dt__rec_t* dt__rec(const void* recs, int n, int r) {
  return (const dt__rec_t*)(const void*)((const char*)recs + (size_t)r * dt__call_rec_nbytes(n));
}
static const int64_t* dt__rec_counts(const dt__rec_t* h) { return (const int64_t*)(h + 1); }

void dt__call_rec_fill(void* rec, int n, int world_rank, const dt_call_desc_t* d) {
  memset(rec, 0, dt__call_rec_nbytes(n));
  dt__rec_t* h = (dt__rec_t*)rec;
  h->kind = d->kind;
  h->dtype = d->dtype;
  h->op = d->op;
  h->root = d->root;
  h->world_rank = world_rank;
  h->n = n;
  h->numel = d->numel;
  dt__comm_what_format(h->what, sizeof h->what);
  int64_t* v = (int64_t*)(h + 1);
  if (d->counts) memcpy(v, d->counts, sizeof(int64_t) * (size_t)n);
  if (d->rcounts) memcpy(v + n, d->rcounts, sizeof(int64_t) * (size_t)n);
}

/* The per-rank counts every rank passes alike: these kinds compare them. */
static int dt__call_has_counts(int kind) {
  return kind == DT_CALL_ALL_GATHER || kind == DT_CALL_REDUCE_SCATTER || kind == DT_CALL_SCATTER;
}

/* 1 when b's call differs from a's in anything but the world rank (all_to_all's vectors are
 * compared transposed, apart). */
static int dt__rec_differs(const dt__rec_t* a, const dt__rec_t* b, int n) {
  if (a->kind != b->kind || a->dtype != b->dtype || a->op != b->op || a->root != b->root ||
      a->numel != b->numel || strcmp(a->what, b->what) != 0)
    return 1;
  return dt__call_has_counts(a->kind) &&
         memcmp(dt__rec_counts(a), dt__rec_counts(b), sizeof(int64_t) * (size_t)n) != 0;
}

/* "[16,16,16,16]" (at most 8 values, then "...", and the total). */
static size_t dt__vec_format(char* buf, size_t cap, const int64_t* v, int n) {
  size_t k = 0;
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += v[i];
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int i = 0; i < n && i < 8 && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)v[i]);
  if (n > 8 && k < cap)
    k += (size_t)snprintf(buf + k, cap - k, ",... total %lld", (long long)total);
  if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "]");
  return k < cap ? k : cap - 1;
}

/* "all_reduce sum f32 count 64 (mesh dim 0, step 1/1 P->R)" */
static void dt__call_describe(const dt__rec_t* h, int n, char* buf, size_t cap) {
  size_t k = 0;
  int kind = h->kind > 0 && h->kind < DT_CALL_COUNT ? h->kind : 0;
  k += (size_t)snprintf(buf + k, cap - k, "%s", dt__call_names[kind]);
  if (h->op >= 0 && k < cap)
    k += (size_t)snprintf(buf + k, cap - k, " %s", dt_reduce_op_name((dt_reduce_op_t)h->op));
  if (h->dtype >= 0 && k < cap)
    k += (size_t)snprintf(buf + k, cap - k, " %s", dt_dtype_name((dt_dtype_t)h->dtype));
  if (h->numel >= 0 && k < cap)
    k += (size_t)snprintf(buf + k, cap - k, " count %lld", (long long)h->numel);
  const int64_t* v = dt__rec_counts(h);
  if (dt__call_has_counts(kind) && k < cap) {
    k += (size_t)snprintf(buf + k, cap - k, " counts ");
    if (k < cap) k += dt__vec_format(buf + k, cap - k, v, n);
  } else if (kind == DT_CALL_ALL_TO_ALL && k < cap) {
    k += (size_t)snprintf(buf + k, cap - k, " sends ");
    if (k < cap) k += dt__vec_format(buf + k, cap - k, v, n);
    if (k < cap) k += (size_t)snprintf(buf + k, cap - k, " receives ");
    if (k < cap) k += dt__vec_format(buf + k, cap - k, v + n, n);
  }
  if (h->root >= 0 && k < cap) k += (size_t)snprintf(buf + k, cap - k, " root %d", h->root);
  if (k < cap) snprintf(buf + k, cap - k, "%s", h->what);
}

/* "0-3" or "0,2,4,6": the world ranks of the communicator, runs of consecutive ones joined. */
static void dt__ranks_format(const void* recs, int n, char* buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && k < cap; i++) {
    int a = dt__rec(recs, n, i)->world_rank, j = i;
    while (j + 1 < n && dt__rec(recs, n, j + 1)->world_rank == dt__rec(recs, n, j)->world_rank + 1)
      j++;
    int b = dt__rec(recs, n, j)->world_rank;
    if (j > i) k += (size_t)snprintf(buf + k, cap - k, "%s%d-%d", i ? "," : "", a, b);
    else k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", a);
    i = j;
  }
}

#define DT__CHECK_HINT "no rank entered it (DTENSOR_DEBUG=collectives)"

dt_status_t dt__call_verdict(const void* recs, int n) {
  const dt__rec_t* r0 = dt__rec(recs, n, 0);
  char ranks[96], d0[384], d1[384];
  for (int r = 1; r < n; r++) {
    const dt__rec_t* h = dt__rec(recs, n, r);
    if (!dt__rec_differs(r0, h, n)) continue;
    dt__ranks_format(recs, n, ranks, sizeof ranks);
    dt__call_describe(r0, n, d0, sizeof d0);
    dt__call_describe(h, n, d1, sizeof d1);
    return DT_FAIL(DT_ERR_INVALID_USAGE,
                   "collective mismatch on a communicator of %d ranks (world ranks %s): world "
                   "rank %d calls %s; world rank %d calls %s; " DT__CHECK_HINT,
                   n, ranks, r0->world_rank, d0, h->world_rank, d1);
  }
  if (r0->kind != DT_CALL_ALL_TO_ALL) return DT_SUCCESS;
  for (int p = 0; p < n; p++)
    for (int q = 0; q < n; q++) {
      const dt__rec_t *hp = dt__rec(recs, n, p), *hq = dt__rec(recs, n, q);
      int64_t sends = dt__rec_counts(hp)[q], expects = dt__rec_counts(hq)[n + p];
      if (p == q || sends == expects) continue;
      dt__ranks_format(recs, n, ranks, sizeof ranks);
      return DT_FAIL(DT_ERR_INVALID_USAGE,
                     "collective mismatch on a communicator of %d ranks (world ranks %s): world "
                     "rank %d sends %lld %s elements to world rank %d, which expects %lld from it, "
                     "in all_to_all%s; " DT__CHECK_HINT,
                     n, ranks, hp->world_rank, (long long)sends,
                     dt_dtype_name((dt_dtype_t)hp->dtype), hq->world_rank, (long long)expects,
                     hp->what);
    }
  return DT_SUCCESS;
}

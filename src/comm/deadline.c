/* deadline.c - the deadline of collective waits: the timeout value ($DTENSOR_TIMEOUT_S,
 * dt_set_timeout), the host's timeout handler, the thread's "what is running" context set by the
 * redistribute executor, and the timeout report. Independent of MPI: an implementation of the
 * comm vtable runs its own wait loop and calls dt__comm_timeout when the deadline has passed.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
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

double dt__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dt__timeout_s(void) { return dt__timeout; }

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

dt_status_t dt_set_timeout(double seconds) {
  if (!isfinite(seconds) || !(seconds > 0))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "timeout %g s: expected a positive finite number of seconds", seconds);
  dt__timeout = seconds;
  return DT_SUCCESS;
}

dt_status_t dt_get_timeout(double* seconds) {
  DT_ARG_NOT_NULL(seconds);
  *seconds = dt__timeout;
  return DT_SUCCESS;
}

dt_status_t dt_set_timeout_handler(dt_timeout_fn fn, void* ctx) {
  dt__handler = fn;
  dt__handler_ctx = fn ? ctx : NULL;
  return DT_SUCCESS;
}

void dt__comm_what_set(unsigned mesh_dims, int step, int nsteps, int ndim,
                       const dt_placement_t* before, const dt_placement_t* after) {
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

void dt__comm_what_clear(void) { memset(&dt__what, 0, sizeof dt__what); }

/* " (mesh dim 0, step 1/2 S(0)->R)" from the thread's context; "" when it is empty. */
static void dt__what_format(char* buf, size_t cap) {
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
  dt__what_format(what, sizeof what);
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

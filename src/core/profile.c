/* profile.c - the op profile (dt_profile_*, dtensor/ops.h): time per op, per backward rule, per
 * communication wait and per local transfer, on this rank, while profiling is on.
 *
 * Each timed region is a frame on a stack: its wall time counts as "total" to its name, and as
 * "self" after taking off the frames nested in it (an op's redistribution of its inputs, the
 * ops a composite or a backward rule calls), so that self times add up to the time spent in
 * the library. Names are static strings (op names live as long as the library) plus a kind
 * (op, backward rule, communication, local transfer), kept in a small open-addressing table keyed by the name's pointer. The
 * library is entered one call at a time (MPI_THREAD_SERIALIZED), so the state is plain globals. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <time.h>

#include "dtensor/ops.h"
#include "internal/common.h"

#define DT__PROF_SLOTS 512 /* ~80 ops, their backward rules, the waits: ample */

typedef struct {
  const char* name; /* NULL: empty slot */
  int kind;
  int64_t calls;
  double self_s, total_s;
} dt__prof_slot_t;

static struct {
  int on;
  double since; /* when profiling was turned on or reset */
  dt__prof_slot_t slot[DT__PROF_SLOTS];
  int n;
  dt__prof_frame_t* top;
} dt__prof;

static double dt__prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int dt__prof_on(void) { return dt__prof.on; }

void dt__prof_begin(dt__prof_frame_t* f) {
  f->child = 0.0;
  f->parent = dt__prof.top;
  dt__prof.top = f;
  f->t0 = dt__prof_now();
}

void dt__prof_end(dt__prof_frame_t* f, const char* name, int kind) {
  const double dt = dt__prof_now() - f->t0;
  dt__prof.top = f->parent;
  if (f->parent) f->parent->child += dt;
  if (!dt__prof.on) return; /* turned off inside the frame */
  size_t h = (((uintptr_t)name >> 3) * 31u + (size_t)kind) % DT__PROF_SLOTS;
  for (int probe = 0; probe < DT__PROF_SLOTS; probe++, h = (h + 1) % DT__PROF_SLOTS) {
    dt__prof_slot_t* s = &dt__prof.slot[h];
    if (s->name == NULL) {
      if (dt__prof.n >= DT__PROF_SLOTS - 1) return; /* full: not counted (cannot happen) */
      s->name = name;
      s->kind = kind;
      dt__prof.n++;
    } else if (s->name != name || s->kind != kind) {
      continue;
    }
    s->calls++;
    s->total_s += dt;
    s->self_s += dt - f->child;
    return;
  }
}

static void dt__prof_clear(void) {
  memset(dt__prof.slot, 0, sizeof dt__prof.slot);
  dt__prof.n = 0;
  dt__prof.since = dt__prof_now();
}

static dt_status_t dt__profile_set(int on) {
  if (on && !dt__prof.on) dt__prof_clear();
  dt__prof.on = on != 0;
  return DT_SUCCESS;
}

dt_status_t dt_profile_set(int on) { DT_ENTRY_RETURN(dt__profile_set(on)); }

static dt_status_t dt__profile_reset(void) {
  dt__prof_clear();
  return DT_SUCCESS;
}

dt_status_t dt_profile_reset(void) { DT_ENTRY_RETURN(dt__profile_reset()); }

int dt_profile_enabled(void) { return dt__prof.on; }

_Static_assert(DT__PROF_OP == (int)DT_PROFILE_OP && DT__PROF_BACKWARD == (int)DT_PROFILE_BACKWARD &&
                   DT__PROF_COMM == (int)DT_PROFILE_COMM &&
                   DT__PROF_LOCAL == (int)DT_PROFILE_LOCAL && DT_PROFILE_KIND_COUNT == 4,
               "the internal profile kinds are dt_profile_kind_t's");

static const char* const dt__prof_suffix[DT_PROFILE_KIND_COUNT] = {"", ".backward", "", ""};


static int dt__prof_cmp(const void* a, const void* b) {
  const dt__prof_slot_t *x = a, *y = b;
  if (x->self_s != y->self_s) return x->self_s < y->self_s ? 1 : -1;
  return strcmp(x->name, y->name);
}

/* The used slots sorted by self time, largest first; *n of them in out (cap DT__PROF_SLOTS). */
static void dt__prof_sorted(dt__prof_slot_t* out, int* n) {
  int k = 0;
  for (int i = 0; i < DT__PROF_SLOTS; i++)
    if (dt__prof.slot[i].name) out[k++] = dt__prof.slot[i];
  qsort(out, (size_t)k, sizeof *out, dt__prof_cmp);
  *n = k;
}

static dt_status_t dt__profile_entries(dt_profile_entry_t* out, int cap, int* n) {
  DT_ARG_NOT_NULL(n);
  if (cap < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "dt_profile_entries: cap=%d (>= 0)", cap);
  if (cap > 0) DT_ARG_NOT_NULL(out);
  static dt__prof_slot_t sorted[DT__PROF_SLOTS];
  int k;
  dt__prof_sorted(sorted, &k);
  for (int i = 0; i < k && i < cap; i++) {
    out[i].name = sorted[i].name;
    out[i].kind = (dt_profile_kind_t)sorted[i].kind;
    out[i].calls = sorted[i].calls;
    out[i].self_s = sorted[i].self_s;
    out[i].total_s = sorted[i].total_s;
  }
  *n = k;
  return DT_SUCCESS;
}

dt_status_t dt_profile_entries(dt_profile_entry_t* out, int cap, int* n) {
  DT_ENTRY_RETURN(dt__profile_entries(out, cap, n));
}

static dt_status_t dt__profile_report(FILE* out, int top) {
  DT_ARG_NOT_NULL(out);
  static dt__prof_slot_t sorted[DT__PROF_SLOTS];
  int k;
  dt__prof_sorted(sorted, &k);
  double self = 0.0;
  for (int i = 0; i < k; i++) self += sorted[i].self_s;
  const double wall = dt__prof_now() - dt__prof.since;
  fprintf(out, "# op profile: %.3f s in the library (self times summed) of %.3f s since it was "
          "reset, %d entries%s\n", self, wall, k, dt__prof.on ? "" : " (profiling is off)");
  fprintf(out, "# %-34s %9s %11s %7s %11s %10s\n", "name", "calls", "self ms", "self %",
          "total ms", "us/call");
  const int shown = top > 0 && top < k ? top : k;
  for (int i = 0; i < shown; i++) {
    char name[96];
    snprintf(name, sizeof name, "%s%s", sorted[i].name, dt__prof_suffix[sorted[i].kind]);
    fprintf(out, "  %-34s %9lld %11.3f %6.1f%% %11.3f %10.2f\n", name,
            (long long)sorted[i].calls, 1e3 * sorted[i].self_s,
            self > 0.0 ? 100.0 * sorted[i].self_s / self : 0.0, 1e3 * sorted[i].total_s,
            sorted[i].calls ? 1e6 * sorted[i].self_s / (double)sorted[i].calls : 0.0);
  }
  if (shown < k) {
    double rest = 0.0;
    for (int i = shown; i < k; i++) rest += sorted[i].self_s;
    fprintf(out, "  (%d more entries: %.3f ms self)\n", k - shown, 1e3 * rest);
  }
  return DT_SUCCESS;
}

dt_status_t dt_profile_report(FILE* out, int top) { DT_ENTRY_RETURN(dt__profile_report(out, top)); }

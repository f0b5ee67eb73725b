/* work.c - asynchronous redistributions: work objects, their progress, and the dedicated
 * communicators that keep them apart from everything else.
 *
 * MPI matches collectives on a communicator by the order in which ranks start them. A work that
 * starts its next step whenever a rank notices the previous one finished (in dt_work_test, in an
 * op's dispatch, in dt_work_wait) would start it at different points of the program on different
 * ranks, so it must not share a communicator with anything that starts at fixed points. Each work
 * therefore runs on one of its mesh's slots: duplicates of the mesh's communicators, created once
 * (collectively, when a start first needs them) and held from the start until dt_work_wait or
 * dt_work_destroy; these happen at the same point of the program on every rank, so every rank
 * picks the same slot. When all slots are held, a start first completes the oldest work holding
 * one (again the same on every rank).
 *
 * A work keeps its source and target storage alive until it completes, so destroying the tensors
 * early is safe. Destroyed works are kept as spares (up to DT_WORK_SPARES, with their scratch,
 * intermediates and request memory up to DT_WORK_SPARE_NBYTES) and reused by later starts, so
 * steady-state asynchronous redistributions allocate only their output tensors. In-flight works advance whenever the library is entered through dt_work_test,
 * dt_work_wait or an op's dispatch (dt__progress_all): Open MPI moves non-blocking collectives
 * only inside MPI calls.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <stdio.h>

#include "redistribute/redistribute.h"

#define DT_WORK_SPARES DT_ASYNC_SLOTS
#define DT_WORK_SPARE_NBYTES ((size_t)64 << 20)

struct dt__work {
  struct dt_work* handle; /* the caller's handle (NULL once destroyed) */
  dt_mesh_t mesh; /* retained; NULL for a work that had nothing to do */
  dt_backend_t b;
  struct dt_plan* plan; /* retained */
  dt_storage_t* hold[2]; /* source and target storage, retained until completion */
  const void* src;
  void* dst;
  int slot; /* the mesh's dedicated communicators held (-1: none) */
  uint64_t seq; /* start order */
  int k;    /* current step */
  dt__run_t run;
  dt_comm_req_t req; /* reused by every step (and by the next user of a spare) */
  const struct dt_comm_i* req_iface; /* the implementation that owns req's memory */
  dt__scratch_t sc;
  void* inter[2]; /* intermediates between steps (ping-pong) */
  size_t inter_cap[2];
  /* host staging of a device backend's shards (dev != NULL): the plan runs on the cpu backend
   * from stage[0] (the source, copied out at the start) to stage[1], copied into dst_dev at the
   * end (see dt__plan_execute) */
  dt_backend_t dev;
  void* stage[2];
  size_t stage_cap[2];
  void* dst_dev;
  size_t dst_nbytes;
  double sim_done; /* simulated: when its last posted collective ends */
  int done;
  int abandoned; /* timed out with a collective still posted: its memory is never freed */
  dt_status_t status;
  char msg[512];
  struct dt__work *next, *prev; /* in flight */
};

/* The caller's handle of a work is a shell apart from the work (whose body is recycled as a
 * spare): shells come round-robin from a static ring, so a destroyed handle is not handed out
 * again before DT_WORK_SHELLS later works (the registry tells it is dead meanwhile), and a
 * steady state of starts allocates nothing for them. Past the ring (that many works held at
 * once), shells come from the heap. */
#define DT_WORK_SHELLS 4096
struct dt_work {
  struct dt__work* body; /* NULL: free */
  int heap;
};
static const dt_handle_kind_t dt__work_kind = {"work"};
static struct dt_work dt__shells[DT_WORK_SHELLS];
static size_t dt__shell_next = 0;

static dt_status_t dt__shell_new(struct dt__work* body, dt_work_t* out) {
  struct dt_work* h = NULL;
  for (size_t i = 0; i < DT_WORK_SHELLS && h == NULL; i++) {
    size_t j = (dt__shell_next + i) % DT_WORK_SHELLS;
    if (dt__shells[j].body == NULL) {
      h = &dt__shells[j];
      dt__shell_next = (j + 1) % DT_WORK_SHELLS;
    }
  }
  if (h == NULL) {
    h = (struct dt_work*)dt__calloc(1, sizeof *h);
    if (h == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a work handle");
    h->heap = 1;
  }
  dt_status_t st = dt_handle_register(h, &dt__work_kind);
  if (st != DT_SUCCESS) {
    if (h->heap) dt__free(h);
    return st;
  }
  h->body = body;
  body->handle = h;
  *out = h;
  return DT_SUCCESS;
}

static void dt__shell_free(struct dt_work* h) {
  dt_handle_unregister(h, &dt__work_kind, "work");
  h->body->handle = NULL;
  h->body = NULL;
  if (h->heap) dt_handle_free(h);
}

static struct dt__work* dt__inflight = NULL;
static struct dt__work* dt__spares = NULL; /* destroyed works kept for reuse (linked by next) */
static int dt__nspares = 0;
static uint64_t dt__seq = 0;

static void dt__unlink(struct dt__work* w) {
  if (w->prev) w->prev->next = w->next;
  else if (dt__inflight == w) dt__inflight = w->next;
  if (w->next) w->next->prev = w->prev;
  w->next = w->prev = NULL;
}

/* Completion (or failure): the held storage is released; scratch stays for reuse and the slot
 * goes at wait/destroy. */
static void dt__finish(struct dt__work* w, dt_status_t st) {
  if (w->done) return;
  w->done = 1;
  w->status = st;
  if (st != DT_SUCCESS) snprintf(w->msg, sizeof w->msg, "%s", dt_last_error());
  dt__unlink(w);
  if (st == DT_ERR_TIMEOUT) w->abandoned = 1; /* MPI may still write the target */
  if (w->abandoned) return;
  for (int k = 0; k < 2; k++) {
    dt__storage_release(w->hold[k]);
    w->hold[k] = NULL;
  }
}

/* Frees the work's scratch, intermediates, staging and request memory. */
static void dt__work_buffers_free(struct dt__work* w) {
  dt__scratch_free(&w->sc);
  for (int k = 0; k < 2; k++) {
    if (w->dev) dt__host_stage_free(w->dev, w->stage[k], w->stage_cap[k]);
    dt__mem_count(DT_MEM_COMMUNICATION, -(int64_t)w->stage_cap[k]);
    w->stage[k] = NULL;
    w->stage_cap[k] = 0;
  }
  for (int k = 0; k < 2; k++) {
    if (w->b) dt__backend_free(w->b, w->inter[k], w->inter_cap[k]);
    dt__mem_count(DT_MEM_COMMUNICATION, -(int64_t)w->inter_cap[k]);
    w->inter[k] = NULL;
    w->inter_cap[k] = 0;
  }
  if (w->req_iface) w->req_iface->req_free(&w->req);
  memset(&w->req, 0, sizeof w->req);
  w->req_iface = NULL;
}

static size_t dt__work_buffers_nbytes(const struct dt__work* w) {
  size_t n = w->inter_cap[0] + w->inter_cap[1] + w->stage_cap[0] + w->stage_cap[1];
  for (int k = 0; k < DT_WS_SLOTS; k++) n += w->sc.cap[k];
  return n;
}

/* A work running on backend b, staging for device backend dev (NULL: none): a spare (its buffers
 * kept when they belong to the same backends) or a new one. */
static struct dt__work* dt__work_get(dt_backend_t b, dt_backend_t dev) {
  struct dt__work* w = dt__spares;
  if (w != NULL) {
    dt__spares = w->next;
    dt__nspares--;
    if (w->b != b || w->dev != dev) dt__work_buffers_free(w);
  } else {
    w = (struct dt__work*)dt__calloc(1, sizeof *w);
    if (w == NULL) return NULL;
  }
  /* keep the buffers and the request; reset everything else */
  dt__scratch_t sc = w->sc;
  void* inter[2] = {w->inter[0], w->inter[1]};
  size_t inter_cap[2] = {w->inter_cap[0], w->inter_cap[1]};
  dt_comm_req_t req = w->req;
  const struct dt_comm_i* req_iface = w->req_iface;
  void* stage[2] = {w->stage[0], w->stage[1]};
  size_t stage_cap[2] = {w->stage_cap[0], w->stage_cap[1]};
  memset(w, 0, sizeof *w);
  memcpy(w->stage, stage, sizeof stage);
  memcpy(w->stage_cap, stage_cap, sizeof stage_cap);
  w->dev = dev;
  w->sc = sc;
  memcpy(w->inter, inter, sizeof inter);
  memcpy(w->inter_cap, inter_cap, sizeof inter_cap);
  w->req = req;
  w->req_iface = req_iface;
  w->slot = -1;
  w->b = b;
  w->sc.b = b;
  w->sc.owned = 1;
  return w;
}

/* A destroyed work: kept as a spare (buffers too, when not too large) or freed. */
static void dt__work_put(struct dt__work* w) {
  if (w->abandoned) return; /* leaked on purpose: a timed-out collective owns its buffers */
  if (dt__nspares >= DT_WORK_SPARES || dt__ctx_finalized()) { /* none kept after finalize */
    dt__work_buffers_free(w);
    dt__free(w);
    return;
  }
  if (dt__work_buffers_nbytes(w) > DT_WORK_SPARE_NBYTES) dt__work_buffers_free(w);
  w->next = dt__spares;
  dt__spares = w;
  dt__nspares++;
}

/* Grows staging buffer k of a staged work to at least n bytes (host memory of its device). */
static dt_status_t dt__stage_grow(struct dt__work* w, int k, size_t n) {
  if (n <= w->stage_cap[k]) return DT_SUCCESS;
  void* q = dt__host_stage_alloc(w->dev, n);
  if (q == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%zu bytes of host staging", n);
  dt__host_stage_free(w->dev, w->stage[k], w->stage_cap[k]);
  dt__mem_count(DT_MEM_COMMUNICATION, (int64_t)n - (int64_t)w->stage_cap[k]);
  w->stage[k] = q;
  w->stage_cap[k] = n;
  return DT_SUCCESS;
}

/* The buffer step k writes: the target for the last step, else an intermediate. */
static dt_status_t dt__step_out(struct dt__work* w, int k, void** out) {
  const struct dt_plan* p = w->plan;
  if (k + 1 == p->nsteps) {
    *out = w->dst;
    return DT_SUCCESS;
  }
  dt_layout_t la = p->src;
  memcpy(la.pl, p->steps[k].after, sizeof la.pl);
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  dt__layout_box(&la, w->mesh->coords, off, len);
  size_t n = (size_t)dt__box_numel(la.ndim, len) * dt__itemsize(p->dtype);
  int i = k & 1;
  if (n > w->inter_cap[i]) {
    void* q = dt__backend_alloc(w->b, n);
    if (q == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%zu bytes of redistribution scratch", n);
    dt__backend_free(w->b, w->inter[i], w->inter_cap[i]);
    dt__mem_count(DT_MEM_COMMUNICATION, (int64_t)n - (int64_t)w->inter_cap[i]);
    w->inter[i] = q;
    w->inter_cap[i] = n;
  }
  *out = w->inter[i];
  return DT_SUCCESS;
}

static dt_status_t dt__step_begin(struct dt__work* w) {
  void* out;
  DT_CHECK(dt__step_out(w, w->k, &out));
  const void* in = w->k == 0 ? w->src : w->inter[(w->k - 1) & 1];
  dt_comm_t* c = NULL;
  if (w->plan->steps[w->k].coll != DT_COLL_LOCAL)
    DT_CHECK(dt__mesh_slot_comm(w->mesh, w->b, w->slot, w->plan->steps[w->k].mask, &c));
  if (c != NULL) {
    if (w->req_iface != NULL && w->req_iface != c->iface) { /* another implementation's memory */
      w->req_iface->req_free(&w->req);
      memset(&w->req, 0, sizeof w->req);
    }
    w->req_iface = c->iface;
  }
  return dt__run_init(&w->run, w->mesh, w->b, w->plan, w->k, in, out, &w->sc, c, &w->req);
}

/* Advances w as far as it goes without blocking (block != 0: to completion, or a timeout). */
static dt_status_t dt__work_run_step(struct dt__work* w, int block);
static dt_status_t dt__work_run(struct dt__work* w, int block) {
  dt_status_t st = dt__work_run_step(w, block);
  dt__comm_what_clear();
  return st;
}

static dt_status_t dt__work_run_step(struct dt__work* w, int block) {
  dt_status_t st = DT_SUCCESS;
  while (!w->done) {
    dt__run_what(&w->run);
    if (w->run.pending) {
      int ok = 1;
      if (block) st = w->run.c->iface->wait(w->run.c, &w->req);
      else st = w->run.c->iface->test(w->run.c, &w->req, &ok);
      if (st != DT_SUCCESS) break;
      if (!ok) return DT_SUCCESS;
      w->run.pending = 0;
    }
    st = dt__advance(&w->run);
    if (w->run.sim_done > w->sim_done) w->sim_done = w->run.sim_done;
    if (st != DT_SUCCESS) break;
    if (w->run.pending) continue;
    if (++w->k == w->plan->nsteps) { /* staged: the result into the device's memory */
      if (w->dev && w->dst_nbytes)
        st = w->dev->iface->copy(w->dev, w->dst_dev, w->stage[1], w->dst_nbytes, DT_COPY_H2D);
      dt__finish(w, st);
      return st;
    }
    st = dt__step_begin(w);
    if (st != DT_SUCCESS) break;
  }
  if (st != DT_SUCCESS) {
    if (w->run.pending && st != DT_ERR_TIMEOUT) { /* the posted collective owns the buffers */
      w->run.c->iface->wait(w->run.c, &w->req);
      w->run.pending = 0;
    }
    dt__finish(w, st);
  }
  return st;
}

/* Advances the works in flight; `explicit` 0 (an op's dispatch) skips works whose data moves
 * over NCCL (their backend is a device one): those post their next phase only at points every
 * rank reaches alike (their start, dt_work_test, dt_work_wait), since NCCL calls on several
 * communicators must be issued in the same order on every rank, and an op's dispatch finds a
 * phase complete at different points on different ranks. MPI's progress has no such rule. */
static void dt__progress(int explicit_call) {
  for (struct dt__work *w = dt__inflight, *next; w != NULL; w = next) {
    next = w->next;
    if (!explicit_call && dt__backend_is_device(w->b)) continue;
    dt__work_run(w, 0); /* a failure is kept in the work for its wait */
  }
}

void dt__progress_all(void) { dt__progress(0); }

static void dt__slot_release(struct dt__work* w) {
  if (w->slot >= 0 && w->mesh) w->mesh->slot_owner[w->slot] = NULL;
  w->slot = -1;
}

/* Takes a free slot of the mesh for w; when every slot is held (by works running or complete but
 * not yet waited for), completes the oldest holder and takes its slot. */
static dt_status_t dt__slot_take(dt_mesh_t m, struct dt__work* w) {
  int oldest = 0;
  for (int s = 0; s < DT_ASYNC_SLOTS; s++) {
    if (m->slot_owner[s] == NULL) {
      oldest = s;
      break;
    }
    if (m->slot_owner[s]->seq < m->slot_owner[oldest]->seq) oldest = s;
  }
  struct dt__work* o = m->slot_owner[oldest];
  if (o != NULL) {
    DT_CHECK(dt__work_run(o, 1));
    dt__sim_wait_until(o->sim_done);
    dt__slot_release(o);
  }
  m->slot_owner[oldest] = w;
  w->slot = oldest;
  return DT_SUCCESS;
}

/* Completes a work if it is still running (its buffers belong to the collective until then),
 * releases what it holds and keeps it as a spare. */
static void dt__work_end(struct dt__work* w) {
  if (!w->done) {
    dt__work_run(w, 1);
    dt__sim_wait_until(w->sim_done);
  }
  dt__slot_release(w);
  dt__finish(w, w->status);
  if (w->plan) dt__plan_release(w->plan);
  if (w->mesh) dt__mesh_release(w->mesh);
  w->plan = NULL;
  w->mesh = NULL;
  dt__work_put(w);
}

static dt_status_t dt__work_start_body(dt_mesh_t m, dt_backend_t b, struct dt_plan* p, const void* src,
                           dt_storage_t* src_hold, void* dst, dt_storage_t* dst_hold,
                                        struct dt__work** out) {
  *out = NULL;
  int nccl = 0; /* the mesh's NCCL plane carries b's memory: no staging */
  const int comm = m != NULL && p != NULL && m->member && !m->abstract &&
                   dt__backend_is_device(b) && dt__plan_communicates(p);
  if (comm) DT_CHECK(dt__mesh_data_plane(m, b, &nccl));
  const int stage = comm && !nccl;
  struct dt__work* w = dt__work_get(stage ? &dt__backend_cpu : b, stage ? b : NULL);
  if (w == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a work");
  if (m == NULL || p == NULL || m->abstract || !m->member) { /* nothing moves here */
    w->done = 1;
    *out = w;
    return DT_SUCCESS;
  }
  w->mesh = m;
  dt__mesh_retain(m);
  w->plan = p;
  p->refcount++;
  w->src = src;
  w->dst = dst;
  w->hold[0] = src_hold;
  w->hold[1] = dst_hold;
  dt__storage_retain(src_hold);
  dt__storage_retain(dst_hold);
  dt_status_t st = DT_SUCCESS;
  if (p->nsteps == 0) {
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__layout_box(&p->src, m->coords, off, len);
    size_t n = (size_t)dt__box_numel(p->src.ndim, len) * dt__itemsize(p->dtype);
    if (n && dst != src) st = b->iface->copy(b, dst, src, n, DT_COPY_D2D);
    dt__finish(w, st);
    if (st != DT_SUCCESS) {
      dt__work_end(w);
      return st;
    }
    *out = w;
    return DT_SUCCESS;
  }
  if (stage) { /* the source to host staging now (the caller may overwrite it after the start) */
    size_t in_nb = dt__plan_local_nbytes(p, m, 0);
    w->dst_nbytes = dt__plan_local_nbytes(p, m, 1);
    w->dst_dev = dst;
    for (int k = 0; k < 2 && st == DT_SUCCESS; k++)
      st = dt__stage_grow(w, k, k ? w->dst_nbytes : in_nb);
    if (st == DT_SUCCESS && in_nb) st = b->iface->copy(b, w->stage[0], src, in_nb, DT_COPY_D2H);
    w->src = w->stage[0];
    w->dst = w->stage[1];
    if (st != DT_SUCCESS) {
      dt__finish(w, st);
      dt__work_end(w);
      return st;
    }
  }
  w->seq = ++dt__seq;
  st = dt__slot_take(m, w);
  w->next = dt__inflight; /* newest first */
  if (w->next) w->next->prev = w;
  dt__inflight = w;
  /* every communicator the steps use exists before anything is posted: creating one is
   * collective over the mesh's own communicator, so it must happen here, at the same point of
   * the program on every rank, not when a step begins during progress */
  for (int k = 0; k < p->nsteps && st == DT_SUCCESS; k++) {
    dt_comm_t* c;
    if (p->steps[k].coll != DT_COLL_LOCAL) st = dt__mesh_slot_comm(m, w->b, w->slot, p->steps[k].mask, &c);
  }
  if (st == DT_SUCCESS) st = dt__step_begin(w);
  if (st == DT_SUCCESS) st = dt__work_run(w, 0);
  else dt__finish(w, st);
  if (st != DT_SUCCESS) {
    dt__work_end(w);
    return st;
  }
  *out = w;
  return DT_SUCCESS;
}

dt_status_t dt__work_start(dt_mesh_t m, dt_backend_t b, struct dt_plan* p, const void* src,
                           dt_storage_t* src_hold, void* dst, dt_storage_t* dst_hold,
                           dt_work_t* out) {
  *out = NULL;
  struct dt__work* w;
  DT_CHECK(dt__work_start_body(m, b, p, src, src_hold, dst, dst_hold, &w));
  dt_status_t st = dt__shell_new(w, out);
  if (st != DT_SUCCESS) dt__work_end(w);
  return st;
}

static dt_status_t dt__work_check(dt_work_t h, struct dt__work** w) {
  DT_CHECK(dt_handle_check(h, &dt__work_kind, "work"));
  *w = h->body;
  return DT_SUCCESS;
}

static dt_status_t dt__work_wait_impl(dt_work_t h) {
  struct dt__work* w;
  DT_CHECK(dt__work_check(h, &w));
  dt_status_t st = w->done ? w->status : dt__work_run(w, 1);
  dt__sim_wait_until(w->sim_done); /* simulated: the wait lasts until the collective ends */
  dt__slot_release(w);
  if (st != DT_SUCCESS && w->msg[0]) return DT_FAIL(st, "%s", w->msg);
  return st;
}

/* dt__work_wait_impl, timed in the op profile as "work_wait" (dtensor/ops.h) */
static dt_status_t dt__work_wait_prof(dt_work_t h) {
  if (!dt__prof_on()) return dt__work_wait_impl(h);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  dt_status_t st = dt__work_wait_impl(h);
  dt__prof_end(&f, "work_wait", DT__PROF_COMM);
  return st;
}

dt_status_t dt_work_wait(dt_work_t h) {
  DT_ENTRY_RETURN(dt__work_wait_prof(h));
}

static dt_status_t dt__work_test_impl(dt_work_t h, int* done) {
  DT_ARG_NOT_NULL(done);
  *done = 0;
  struct dt__work* w;
  DT_CHECK(dt__work_check(h, &w));
  if (!w->done) dt__progress(1);
  *done = w->done;
  if (w->done && w->status != DT_SUCCESS) return DT_FAIL(w->status, "%s", w->msg);
  return DT_SUCCESS;
}

dt_status_t dt_work_test(dt_work_t h, int* done) {
  DT_ENTRY_RETURN(dt__work_test_impl(h, done));
}

static dt_status_t dt__work_destroy_impl(dt_work_t h) {
  if (h == NULL) return DT_SUCCESS;
  struct dt__work* w;
  DT_CHECK(dt__work_check(h, &w));
  dt__shell_free(h);
  dt__work_end(w);
  return DT_SUCCESS;
}

dt_status_t dt_work_destroy(dt_work_t h) {
  DT_ENTRY_RETURN(dt__work_destroy_impl(h));
}

void dt__work_finalize_all(void) {
  while (dt__inflight != NULL) dt__work_run(dt__inflight, 1);
  while (dt__spares != NULL) {
    struct dt__work* w = dt__spares;
    dt__spares = w->next;
    dt__work_buffers_free(w);
    dt__free(w);
  }
  dt__nspares = 0;
}

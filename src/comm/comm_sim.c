/* comm_sim.c - the communicator of a simulated mesh (dt_init_simulated): `size` ranks of
 * which this process plays one, every other rank assumed to do exactly what this one does (the
 * SPMD symmetry of a training step). Nothing moves and nothing waits; the traffic is counted
 * where the real run counts it (the executor's counters), so a simulated step reports the calls
 * and bytes of the real one.
 *
 * Tensor buffers of the meta backend (dt__meta_ptr) are left alone. Host buffers (control values:
 * agreed statuses, counts, shapes, a gather into the caller's array) get what the symmetry
 * implies: an all-reduce of x is x for max, min and avg and size * x for sum, a gather repeats
 * this rank's block, an all-to-all returns to each peer's slot what this rank sends to it, a
 * broadcast leaves this rank's values (the root's are taken to be the same: control flags
 * agree); what only another rank holds (a scatter's blocks off the root, a receive from a peer)
 * is zeros, and so is a host result computed from meta memory.
 */
#include "backend/backend.h"
#include "comm/comm.h"

static const struct dt_comm_i dt__sim_iface;

dt_status_t dt__comm_sim_create(int size, int rank, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (size < 1 || rank < 0 || rank >= size)
    return DT_FAIL(DT_ERR_INTERNAL, "simulated communicator of %d ranks, rank %d", size, rank);
  out->iface = &dt__sim_iface;
  out->api_version = DT_COMM_API_VERSION;
  out->size = size;
  out->rank = rank;
  return DT_SUCCESS;
}

static dt_status_t dt__sim_split(const dt_comm_t* parent, int color, int key, dt_comm_t* out) {
  (void)parent, (void)color, (void)key;
  memset(out, 0, sizeof *out);
  return DT_FAIL(DT_ERR_UNSUPPORTED, "a simulated communicator cannot be split (its mesh makes "
                 "the communicators of its sub-meshes)");
}

static dt_status_t dt__sim_dup(const dt_comm_t* c, dt_comm_t* out) {
  return dt__comm_sim_create(c->size, c->rank, out);
}

static void dt__sim_destroy(dt_comm_t* c) { (void)c; }

/* dst (host) <- n bytes of src: a copy, or zeros when src is meta memory; nothing when dst is. */
static void dt__sim_put(void* dst, const void* src, size_t n) {
  if (n == 0 || dst == NULL || dt__meta_ptr(dst)) return;
  if (src == NULL || dt__meta_ptr(src)) memset(dst, 0, n);
  else if (dst != src) memmove(dst, src, n);
}

/* When a non-blocking call completes: when waited for, or at the second test (progress poll)
 * after it was posted. The peers post the same call at the same point (SPMD), so a real run's
 * first poll finds them posted and a later one the data arrived: with Open MPI on shared memory
 * the memory peaks of FSDP's prefetching match the real run's exactly with 2 to 8 polls, and
 * complete-at-post (0) or complete-only-when-waited (the most overlap) differ by 15 %. A rank
 * that lags the others sees its collectives complete late: $DTENSOR_SIM_COMPLETE=wait makes
 * every one complete only when waited for (the upper end of what timing can do); "now" makes it
 * complete at its first test (the lower end: a device whose work finishes before each call
 * returns, as the emulated GPU's, or a transfer faster than the code between post and test);
 * "poll", the default, is the usual case. Read once. */
#define DT__SIM_POLLS 2

static uint64_t dt__sim_polls(void) {
  static int polls = -1;
  if (polls < 0) {
    const char* e = getenv("DTENSOR_SIM_COMPLETE");
    polls = e == NULL ? DT__SIM_POLLS : strcmp(e, "wait") == 0 ? 0 : strcmp(e, "now") == 0 ? 1
                                                                                            : DT__SIM_POLLS;
  }
  return polls == 0 ? UINT64_MAX : (uint64_t)polls;
}
static dt_status_t dt__sim_post(dt_comm_req_t* req) {
  if (req != NULL) {
    req->n = 1;
    req->inline_h[0] = 0;
  }
  return DT_SUCCESS;
}

static dt_status_t dt__sim_all_gather_v(dt_comm_t* c, const void* send, void* recv,
                                        const int64_t* counts, const int64_t* displs,
                                        dt_dtype_t dtype, dt_comm_req_t* req) {
  if (dt__meta_ptr(recv)) return dt__sim_post(req);
  const size_t item = dt__itemsize(dtype);
  const char* mine = send ? (const char*)send : (const char*)recv + displs[c->rank] * (int64_t)item;
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank && send == NULL) continue;
    int64_t n = counts[r] < counts[c->rank] ? counts[r] : counts[c->rank];
    char* at = (char*)recv + displs[r] * (int64_t)item;
    dt__sim_put(at, mine, (size_t)n * item);
    if (counts[r] > n) memset(at + n * (int64_t)item, 0, (size_t)(counts[r] - n) * item);
  }
  return dt__sim_post(req);
}

/* x[0 .. n) of a host buffer reduced over `size` equal contributions. */
static void dt__sim_reduce_host(void* x, int64_t n, dt_dtype_t dtype, dt_reduce_op_t op, int size) {
  if (op != DT_REDUCE_SUM || size == 1) return; /* max, min and avg of equal values: the value */
  for (int64_t i = 0; i < n; i++) switch (dtype) {
      case DT_F32: ((float*)x)[i] *= (float)size; break;
      case DT_I32: ((int32_t*)x)[i] *= size; break;
      case DT_I64: ((int64_t*)x)[i] *= size; break;
      default: break; /* half floats are never host control values */
    }
}

static dt_status_t dt__sim_all_reduce(dt_comm_t* c, const void* send, void* recv, int64_t numel,
                                      dt_dtype_t dtype, dt_reduce_op_t op, dt_comm_req_t* req) {
  if (dt__meta_ptr(recv)) return dt__sim_post(req);
  dt__sim_put(recv, send, (size_t)numel * dt__itemsize(dtype));
  if (!dt__meta_ptr(send)) dt__sim_reduce_host(recv, numel, dtype, op, c->size);
  return dt__sim_post(req);
}

static dt_status_t dt__sim_reduce_scatter_v(dt_comm_t* c, const void* send, void* recv,
                                            const int64_t* counts, dt_dtype_t dtype,
                                            dt_reduce_op_t op, dt_comm_req_t* req) {
  if (dt__meta_ptr(recv)) return dt__sim_post(req);
  const size_t item = dt__itemsize(dtype);
  int64_t off = 0;
  for (int r = 0; r < c->rank; r++) off += counts[r];
  const char* src = dt__meta_ptr(send) ? (const char*)send : (const char*)send + off * (int64_t)item;
  dt__sim_put(recv, src, (size_t)counts[c->rank] * item);
  if (!dt__meta_ptr(send)) dt__sim_reduce_host(recv, counts[c->rank], dtype, op, c->size);
  return dt__sim_post(req);
}

static dt_status_t dt__sim_all_to_all_v(dt_comm_t* c, const void* send, const int64_t* scounts,
                                        const int64_t* sdispls, void* recv,
                                        const int64_t* rcounts, const int64_t* rdispls,
                                        dt_dtype_t dtype, dt_comm_req_t* req) {
  if (dt__meta_ptr(recv)) return dt__sim_post(req);
  const size_t item = dt__itemsize(dtype);
  for (int q = 0; q < c->size; q++) {
    int64_t n = scounts[q] < rcounts[q] ? scounts[q] : rcounts[q];
    char* at = (char*)recv + rdispls[q] * (int64_t)item;
    const char* from = dt__meta_ptr(send) ? (const char*)send
                                            : (const char*)send + sdispls[q] * (int64_t)item;
    dt__sim_put(at, from, (size_t)n * item);
    if (rcounts[q] > n) memset(at + n * (int64_t)item, 0, (size_t)(rcounts[q] - n) * item);
  }
  return dt__sim_post(req);
}

static dt_status_t dt__sim_all_to_all_box(dt_comm_t* c, const void* send, const int64_t* scounts,
                                          const int64_t* sdispls, void* recv, int ndim,
                                          const int64_t* rshape, const int64_t* roffs,
                                          const int64_t* rlens, dt_dtype_t dtype,
                                          dt_comm_req_t* req, int* placed) {
  (void)send, (void)scounts, (void)sdispls, (void)recv;
  /* as the MPI comm of the real run decides: placed in the receive buffer, or the caller's
   * fallback (its receive scratch and unpacking count as in the run) */
  *placed = dt__comm_mpi_box_fits(c, ndim, rshape, roffs, rlens, dtype);
  return *placed ? dt__sim_post(req) : DT_SUCCESS;
}

static dt_status_t dt__sim_broadcast(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                     int root, dt_comm_req_t* req) {
  /* the root is taken to hold what this rank holds: a control flag broadcast to agree on (a NULL
   * checked on the source) keeps this rank's value, as in a run where the source agrees */
  (void)c, (void)buf, (void)numel, (void)dtype, (void)root;
  return dt__sim_post(req);
}

static dt_status_t dt__sim_scatter_v(dt_comm_t* c, const void* send, const int64_t* counts,
                                     const int64_t* displs, void* recv, dt_dtype_t dtype,
                                     int root, dt_comm_req_t* req) {
  (void)root;
  const size_t item = dt__itemsize(dtype);
  if (send == NULL) { /* not the root: its blocks are unknown here, zeros */
    dt__sim_put(recv, NULL, (size_t)counts[c->rank] * item);
    return dt__sim_post(req);
  }
  if (dt__meta_ptr(recv)) return dt__sim_post(req);
  const char* src = dt__meta_ptr(send) ? (const char*)send
                                         : (const char*)send + displs[c->rank] * (int64_t)item;
  dt__sim_put(recv, src, (size_t)counts[c->rank] * item);
  return dt__sim_post(req);
}

static dt_status_t dt__sim_send(dt_comm_t* c, const void* buf, int64_t numel, dt_dtype_t dtype,
                                int peer, dt_comm_req_t* req) {
  (void)c, (void)buf, (void)numel, (void)dtype, (void)peer;
  return dt__sim_post(req);
}

static dt_status_t dt__sim_recv(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype, int peer,
                                dt_comm_req_t* req) {
  (void)c, (void)peer;
  dt__sim_put(buf, NULL, (size_t)numel * dt__itemsize(dtype));
  return dt__sim_post(req);
}

static dt_status_t dt__sim_group(dt_comm_t* c) {
  (void)c;
  return DT_SUCCESS;
}

static dt_status_t dt__sim_wait(dt_comm_t* c, dt_comm_req_t* req) {
  (void)c;
  if (req) req->n = 0;
  return DT_SUCCESS;
}

static dt_status_t dt__sim_test(dt_comm_t* c, dt_comm_req_t* req, int* done) {
  (void)c;
  *done = 1;
  if (req != NULL && req->n > 0 && ++req->inline_h[0] < dt__sim_polls()) *done = 0;
  else if (req != NULL) req->n = 0;
  return DT_SUCCESS;
}

static const struct dt_comm_i dt__sim_iface = {
    .split = dt__sim_split,
    .dup = dt__sim_dup,
    .destroy = dt__sim_destroy,
    .all_gather_v = dt__sim_all_gather_v,
    .all_reduce = dt__sim_all_reduce,
    .reduce_scatter_v = dt__sim_reduce_scatter_v,
    .all_to_all_v = dt__sim_all_to_all_v,
    .all_to_all_box = dt__sim_all_to_all_box,
    .broadcast = dt__sim_broadcast,
    .scatter_v = dt__sim_scatter_v,
    .send = dt__sim_send,
    .recv = dt__sim_recv,
    .group_start = dt__sim_group,
    .group_end = dt__sim_group,
    .wait = dt__sim_wait,
    .test = dt__sim_test,
    .req_free = dt__comm_req_free,
};

/* comm_closed.c - the communicator a mesh keeps after dt_finalize: every member fails with
 * DT_ERR_NOT_INITIALIZED and a message saying why, so that a collective on an object that outlived
 * the library returns a status instead of reaching a freed communicator. Size and rank stay, so
 * callers compute what they would have sent before the call refuses. */
#include "comm/comm.h"

#define DT__CLOSED_MSG                                                                           \
  "the library was finalized (dt_finalize): meshes and tensors made before it can be queried and " \
  "destroyed, not communicate"

static dt_status_t dt__closed(void) { return DT_FAIL(DT_ERR_NOT_INITIALIZED, DT__CLOSED_MSG); }

static dt_status_t dt__closed_split(const dt_comm_t* parent, int color, int key, dt_comm_t* out) {
  (void)parent, (void)color, (void)key;
  memset(out, 0, sizeof *out);
  return dt__closed();
}
static dt_status_t dt__closed_dup(const dt_comm_t* c, dt_comm_t* out) {
  (void)c;
  memset(out, 0, sizeof *out);
  return dt__closed();
}
static void dt__closed_destroy(dt_comm_t* c) { c->context = NULL; }
static dt_status_t dt__closed_all_gather_v(dt_comm_t* c, const void* send, void* recv,
                                           const int64_t* counts, const int64_t* displs,
                                           dt_dtype_t dtype, dt_comm_req_t* req) {
  (void)c, (void)send, (void)recv, (void)counts, (void)displs, (void)dtype, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_all_reduce(dt_comm_t* c, const void* send, void* recv,
                                         int64_t numel, dt_dtype_t dtype, dt_reduce_op_t op,
                                         dt_comm_req_t* req) {
  (void)c, (void)send, (void)recv, (void)numel, (void)dtype, (void)op, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_reduce_scatter_v(dt_comm_t* c, const void* send, void* recv,
                                               const int64_t* counts, dt_dtype_t dtype,
                                               dt_reduce_op_t op, dt_comm_req_t* req) {
  (void)c, (void)send, (void)recv, (void)counts, (void)dtype, (void)op, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_all_to_all_v(dt_comm_t* c, const void* send, const int64_t* scounts,
                                           const int64_t* sdispls, void* recv,
                                           const int64_t* rcounts, const int64_t* rdispls,
                                           dt_dtype_t dtype, dt_comm_req_t* req) {
  (void)c, (void)send, (void)scounts, (void)sdispls, (void)recv, (void)rcounts, (void)rdispls;
  (void)dtype, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_all_to_all_box(dt_comm_t* c, const void* send,
                                             const int64_t* scounts, const int64_t* sdispls,
                                             void* recv, int ndim, const int64_t* rshape,
                                             const int64_t* roffs, const int64_t* rlens,
                                             dt_dtype_t dtype, dt_comm_req_t* req, int* placed) {
  (void)c, (void)send, (void)scounts, (void)sdispls, (void)recv, (void)ndim, (void)rshape;
  (void)roffs, (void)rlens, (void)dtype, (void)req;
  *placed = 0;
  return dt__closed();
}
static dt_status_t dt__closed_broadcast(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                        int root, dt_comm_req_t* req) {
  (void)c, (void)buf, (void)numel, (void)dtype, (void)root, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_scatter_v(dt_comm_t* c, const void* send, const int64_t* counts,
                                        const int64_t* displs, void* recv, dt_dtype_t dtype,
                                        int root, dt_comm_req_t* req) {
  (void)c, (void)send, (void)counts, (void)displs, (void)recv, (void)dtype, (void)root, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_p2p(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                  int peer, dt_comm_req_t* req) {
  (void)c, (void)buf, (void)numel, (void)dtype, (void)peer, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_send(dt_comm_t* c, const void* buf, int64_t numel, dt_dtype_t dtype,
                                   int peer, dt_comm_req_t* req) {
  return dt__closed_p2p(c, (void*)buf, numel, dtype, peer, req);
}
static dt_status_t dt__closed_group(dt_comm_t* c) {
  (void)c;
  return dt__closed();
}
static dt_status_t dt__closed_wait(dt_comm_t* c, dt_comm_req_t* req) {
  (void)c, (void)req;
  return dt__closed();
}
static dt_status_t dt__closed_test(dt_comm_t* c, dt_comm_req_t* req, int* done) {
  (void)c, (void)req;
  *done = 1; /* nothing will ever complete it: a loop on test must not spin */
  return dt__closed();
}

static const struct dt_comm_i dt__closed_iface = {
    .split = dt__closed_split,
    .dup = dt__closed_dup,
    .destroy = dt__closed_destroy,
    .all_gather_v = dt__closed_all_gather_v,
    .all_reduce = dt__closed_all_reduce,
    .reduce_scatter_v = dt__closed_reduce_scatter_v,
    .all_to_all_v = dt__closed_all_to_all_v,
    .all_to_all_box = dt__closed_all_to_all_box,
    .broadcast = dt__closed_broadcast,
    .scatter_v = dt__closed_scatter_v,
    .send = dt__closed_send,
    .recv = dt__closed_p2p,
    .group_start = dt__closed_group,
    .group_end = dt__closed_group,
    .wait = dt__closed_wait,
    .test = dt__closed_test,
    .req_free = dt__comm_req_free,
};

void dt__comm_close(dt_comm_t* c) {
  if (c == NULL || c->iface == NULL) return; /* none, or a rank outside it */
  if (c->iface->destroy != NULL) c->iface->destroy(c);
  c->iface = &dt__closed_iface;
  c->context = NULL;
}

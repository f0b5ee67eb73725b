/* test_comm_conformance.c - the NCCL communicator against the MPI one, member by member: every
 * vtable call runs with the same inputs on the MPI host comm (host buffers) and on the NCCL comm
 * of the CUDA backend (device buffers), and the results must be identical bit for bit.
 *
 * Run under DTENSOR_BACKEND=cuda-emu (NCCL emulated over MPI, every machine: the NCCL comm's own
 * code, its grouping, splits, requests and errors) and cuda (real NCCL on GPUs; skipped where none
 * is usable; NCCL refuses two ranks on one GPU, so on one GPU only np 1 runs there). Values are
 * small integers, exact in every dtype, so that a sum is the same in any order (NCCL's rings and
 * MPI's rank order add differently).
 *
 * Communicators: the world, a dup of it, and at np >= 2 the splits into halves (color rank / 2
 * ... ) and into the odd and even ranks with reversed keys, so rank order differs from the
 * parent's, and an NCCL world bootstrapped over the MPI halves (a sub-mesh's plane). Calls: all_gather_v (even, uneven with an empty block, and even with gaps between
 * blocks in reverse order; in place and not),
 * all_reduce (sum, max, min; in place and not), reduce_scatter_v (even and uneven), all_to_all_v
 * (ragged, with empty pairs), all_to_all_box (NCCL declines: placed = 0), broadcast and scatter_v
 * from every root, send / recv around a ring in a group (recv posted before send) with and
 * without requests, and several non-blocking calls in flight on one communicator completed by test
 * and wait; equal counts gathered to displacements that differ between ranks; a ring step in one
 * group with requests, one of them first used by an all-reduce still in flight; a send with a
 * request outside a group that starts at once (its peer receives it before the sender waits).
 * Refusals come back as statuses on every rank without a hang: avg, a dtype NCCL does
 * not have, a split without a parent, and a broadcast from a root past the last rank, which NCCL
 * itself fails (DT_ERR_NCCL). The last line says how many results matched:
 * "nccl_conformance=PASS cases=N".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "dt_test.h"

static dt_backend_t g_b;
static int g_cases;

static const dt_dtype_t k_dtypes[] = {DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64};
static const char* k_dnames[] = {"f32", "bf16", "f16", "i32", "i64"};

/* host buffer of n elements of d: value v(i) = ((seed * 7 + i * 3) % 13) - 6 */
static void* fill(dt_dtype_t d, int64_t n, int seed) {
  size_t item = dt__itemsize(d);
  void* p = calloc((size_t)(n > 0 ? n : 1), item);
  for (int64_t i = 0; i < n; i++) {
    double v = (double)(((seed * 7 + i * 3) % 13 + 13) % 13 - 6);
    dt__store(p, d, i, v);
  }
  return p;
}

static void* dev_from(const void* h, size_t nb) {
  void* d = g_b->iface->alloc(g_b, nb ? nb : 1);
  DT_ASSERT_TRUE(d != NULL, "device alloc of %zu bytes", nb);
  if (nb) DT_ASSERT_OK(g_b->iface->copy(g_b, d, h, nb, DT_COPY_H2D));
  return d;
}

/* the device buffer's bytes equal the host's */
static void same(const void* h, void* d, size_t nb, const char* what, const char* dname) {
  unsigned char* back = malloc(nb ? nb : 1);
  if (nb) DT_ASSERT_OK(g_b->iface->copy(g_b, back, d, nb, DT_COPY_D2H));
  DT_ASSERT_TRUE(nb == 0 || memcmp(back, h, nb) == 0, "%s (%s): NCCL and MPI results differ",
                 what, dname);
  free(back);
  g_cases++;
}

static void dfree(void* d, size_t nb) { g_b->iface->free(g_b, d, nb ? nb : 1); }

/* counts for n ranks: even (k each) or uneven (r + 1, the second block empty at n >= 2) */
static void counts_of(int n, int uneven, int64_t k, int64_t* counts, int64_t* displs) {
  int64_t at = 0;
  for (int r = 0; r < n; r++) {
    counts[r] = uneven ? (r == 1 ? 0 : r + 1 + k % 3) : k;
    displs[r] = at;
    at += counts[r];
  }
}

static void t_all_gather(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  int n = mc->size, me = mc->rank;
  size_t item = dt__itemsize(d);
  int64_t counts[64], displs[64];
  for (int uneven = 0; uneven < 3; uneven++) /* even, uneven, even with gaps between blocks */
    for (int inplace = 0; inplace < 2; inplace++) {
      counts_of(n, uneven == 1, 5, counts, displs);
      if (uneven == 2)
        for (int r = 0; r < n; r++) displs[r] = (n - 1 - r) * 7; /* reversed, 2 apart */
      int64_t total = uneven == 2 ? 7 * (int64_t)n : displs[n - 1] + counts[n - 1];
      size_t nb = (size_t)total * item;
      void* send = fill(d, counts[me], me + 1);
      void* hrecv = fill(d, total, 99); /* the same garbage in both */
      void* drecv = dev_from(hrecv, nb);
      void* dsend = dev_from(send, (size_t)counts[me] * item);
      if (inplace) {
        memcpy((char*)hrecv + (size_t)displs[me] * item, send, (size_t)counts[me] * item);
        DT_ASSERT_OK(g_b->iface->copy(g_b, (char*)drecv + (size_t)displs[me] * item, send,
                                      (size_t)counts[me] * item, DT_COPY_H2D));
      }
      DT_ASSERT_OK(mc->iface->all_gather_v(mc, inplace ? NULL : send, hrecv, counts, displs, d,
                                           NULL));
      DT_ASSERT_OK(nc->iface->all_gather_v(nc, inplace ? NULL : dsend, drecv, counts, displs, d,
                                           NULL));
      same(hrecv, drecv, nb,
           uneven == 2 ? "all_gather_v gaps" : uneven ? "all_gather_v uneven" : "all_gather_v even",
           dn);
      dfree(drecv, nb);
      dfree(dsend, (size_t)counts[me] * item);
      free(send);
      free(hrecv);
    }
}

static void t_all_reduce(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  const dt_reduce_op_t ops[3] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN};
  size_t item = dt__itemsize(d);
  int64_t numel = 37;
  size_t nb = (size_t)numel * item;
  for (int k = 0; k < 3; k++)
    for (int inplace = 0; inplace < 2; inplace++) {
      void* send = fill(d, numel, mc->rank + 3 * k);
      void* hrecv = fill(d, numel, 50);
      void* dsend = dev_from(send, nb);
      void* drecv = dev_from(hrecv, nb);
      DT_ASSERT_OK(mc->iface->all_reduce(mc, send, inplace ? send : hrecv, numel, d, ops[k],
                                         NULL));
      DT_ASSERT_OK(nc->iface->all_reduce(nc, dsend, inplace ? dsend : drecv, numel, d, ops[k],
                                         NULL));
      same(inplace ? send : hrecv, inplace ? dsend : drecv, nb, "all_reduce", dn);
      dfree(dsend, nb);
      dfree(drecv, nb);
      free(send);
      free(hrecv);
    }
}

static void t_reduce_scatter(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  const dt_reduce_op_t ops[3] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN};
  int n = mc->size, me = mc->rank;
  size_t item = dt__itemsize(d);
  int64_t counts[64], displs[64];
  for (int uneven = 0; uneven < 2; uneven++)
    for (int k = 0; k < 3; k++) {
      counts_of(n, uneven, 4, counts, displs);
      int64_t total = displs[n - 1] + counts[n - 1];
      void* send = fill(d, total, me * 5 + k);
      void* hrecv = fill(d, counts[me], 77);
      void* dsend = dev_from(send, (size_t)total * item);
      void* drecv = dev_from(hrecv, (size_t)counts[me] * item);
      DT_ASSERT_OK(mc->iface->reduce_scatter_v(mc, send, hrecv, counts, d, ops[k], NULL));
      DT_ASSERT_OK(nc->iface->reduce_scatter_v(nc, dsend, drecv, counts, d, ops[k], NULL));
      same(hrecv, drecv, (size_t)counts[me] * item,
           uneven ? "reduce_scatter_v uneven" : "reduce_scatter_v even", dn);
      dfree(dsend, (size_t)total * item);
      dfree(drecv, (size_t)counts[me] * item);
      free(send);
      free(hrecv);
    }
}

static void t_all_to_all(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  int n = mc->size, me = mc->rank;
  size_t item = dt__itemsize(d);
  int64_t sc[64], sd[64], rc[64], rd[64], st = 0, rt = 0;
  for (int q = 0; q < n; q++) { /* what p sends q: (p + 2 q) % 4 elements (zero for some) */
    sc[q] = (me + 2 * q) % 4;
    rc[q] = (q + 2 * me) % 4;
    sd[q] = st;
    rd[q] = rt;
    st += sc[q];
    rt += rc[q];
  }
  void* send = fill(d, st, me + 11);
  void* hrecv = fill(d, rt, 5);
  void* dsend = dev_from(send, (size_t)st * item);
  void* drecv = dev_from(hrecv, (size_t)rt * item);
  DT_ASSERT_OK(mc->iface->all_to_all_v(mc, send, sc, sd, hrecv, rc, rd, d, NULL));
  DT_ASSERT_OK(nc->iface->all_to_all_v(nc, dsend, sc, sd, drecv, rc, rd, d, NULL));
  same(hrecv, drecv, (size_t)rt * item, "all_to_all_v", dn);
  /* the box form: NCCL declines without posting anything */
  int placed = -1;
  int64_t shape[1] = {rt}, offs[64], lens[64];
  for (int q = 0; q < n; q++) {
    offs[q] = rd[q];
    lens[q] = rc[q];
  }
  DT_ASSERT_OK(nc->iface->all_to_all_box(nc, dsend, sc, sd, drecv, 1, shape, offs, lens, d, NULL,
                                         &placed));
  DT_ASSERT_TRUE(placed == 0, "all_to_all_box on NCCL placed %d", placed);
  dfree(dsend, (size_t)st * item);
  dfree(drecv, (size_t)rt * item);
  free(send);
  free(hrecv);
}

static void t_rooted(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  int n = mc->size, me = mc->rank;
  size_t item = dt__itemsize(d);
  for (int root = 0; root < n; root++) {
    int64_t numel = 9 + root;
    size_t nb = (size_t)numel * item;
    void* h = fill(d, numel, me == root ? 3 : 40 + me);
    void* dv = dev_from(h, nb);
    DT_ASSERT_OK(mc->iface->broadcast(mc, h, numel, d, root, NULL));
    DT_ASSERT_OK(nc->iface->broadcast(nc, dv, numel, d, root, NULL));
    same(h, dv, nb, "broadcast", dn);
    dfree(dv, nb);
    free(h);
    /* scatter_v: uneven, one empty block */
    int64_t counts[64], displs[64];
    counts_of(n, 1, root, counts, displs);
    int64_t total = displs[n - 1] + counts[n - 1];
    void* send = fill(d, total, root + 2);
    void* hr = fill(d, counts[me], 60);
    void* ds = dev_from(send, (size_t)total * item);
    void* dr = dev_from(hr, (size_t)counts[me] * item);
    DT_ASSERT_OK(mc->iface->scatter_v(mc, me == root ? send : NULL, counts, displs, hr, d, root,
                                      NULL));
    DT_ASSERT_OK(nc->iface->scatter_v(nc, me == root ? ds : NULL, counts, displs, dr, d, root,
                                      NULL));
    same(hr, dr, (size_t)counts[me] * item, "scatter_v", dn);
    dfree(ds, (size_t)total * item);
    dfree(dr, (size_t)counts[me] * item);
    free(send);
    free(hr);
  }
}

/* a ring: recv from prev posted before send to next in one group, with requests and without */
static void t_p2p(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  int n = mc->size, me = mc->rank;
  if (n < 2) return;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  size_t item = dt__itemsize(d);
  int64_t numel = 13;
  size_t nb = (size_t)numel * item;
  for (int grouped = 0; grouped < 2; grouped++) {
    void* send = fill(d, numel, me + 20);
    void* hr = fill(d, numel, 0);
    void* ds = dev_from(send, nb);
    void* dr = dev_from(hr, nb);
    dt_comm_t* cs[2] = {mc, nc};
    void* bufs[2][2] = {{send, hr}, {ds, dr}};
    for (int k = 0; k < 2; k++) {
      dt_comm_t* c = cs[k];
      if (grouped) {
        DT_ASSERT_OK(c->iface->group_start(c));
        DT_ASSERT_OK(c->iface->recv(c, bufs[k][1], numel, d, prev, NULL));
        DT_ASSERT_OK(c->iface->send(c, bufs[k][0], numel, d, next, NULL));
        DT_ASSERT_OK(c->iface->group_end(c));
      } else { /* with requests, still one group: dependent calls must be (comm.h) */
        dt_comm_req_t rq[2];
        memset(rq, 0, sizeof rq);
        DT_ASSERT_OK(c->iface->group_start(c));
        DT_ASSERT_OK(c->iface->recv(c, bufs[k][1], numel, d, prev, &rq[0]));
        DT_ASSERT_OK(c->iface->send(c, bufs[k][0], numel, d, next, &rq[1]));
        DT_ASSERT_OK(c->iface->group_end(c));
        DT_ASSERT_OK(c->iface->wait(c, &rq[1]));
        DT_ASSERT_OK(c->iface->wait(c, &rq[0]));
        c->iface->req_free(&rq[0]);
        c->iface->req_free(&rq[1]);
      }
    }
    same(hr, dr, nb, grouped ? "send/recv grouped" : "send/recv with requests", dn);
    dfree(ds, nb);
    dfree(dr, nb);
    free(send);
    free(hr);
  }
}

/* three non-blocking calls in flight on one communicator (an all-gather, an all-reduce and a
 * reduce-scatter into one request each), completed by test then wait */
static void t_nonblocking(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  int n = mc->size, me = mc->rank;
  size_t item = dt__itemsize(d);
  int64_t counts[64], displs[64];
  counts_of(n, 0, 6, counts, displs);
  int64_t total = 6 * (int64_t)n;
  void* a = fill(d, 6, me);
  void* b = fill(d, total, me + 1);
  void* h[3] = {fill(d, total, 0), fill(d, total, 0), fill(d, 6, 0)};
  void* da = dev_from(a, 6 * item);
  void* db = dev_from(b, (size_t)total * item);
  void* dh[3] = {dev_from(h[0], (size_t)total * item), dev_from(h[1], (size_t)total * item),
                 dev_from(h[2], 6 * item)};
  dt_comm_t* cs[2] = {mc, nc};
  for (int k = 0; k < 2; k++) {
    dt_comm_t* c = cs[k];
    void** o = k ? dh : h;
    const void* x = k ? da : a;
    const void* y = k ? db : b;
    dt_comm_req_t rq[3];
    memset(rq, 0, sizeof rq);
    DT_ASSERT_OK(c->iface->all_gather_v(c, x, o[0], counts, displs, d, &rq[0]));
    DT_ASSERT_OK(c->iface->all_reduce(c, y, o[1], total, d, DT_REDUCE_SUM, &rq[1]));
    DT_ASSERT_OK(c->iface->reduce_scatter_v(c, y, o[2], counts, d, DT_REDUCE_MAX, &rq[2]));
    int done = 0;
    for (int spins = 0; !done && spins < 1000000; spins++)
      DT_ASSERT_OK(c->iface->test(c, &rq[2], &done));
    DT_ASSERT_TRUE(done, "test never reported the reduce-scatter done (%s)", k ? "NCCL" : "MPI");
    DT_ASSERT_OK(c->iface->wait(c, &rq[0]));
    DT_ASSERT_OK(c->iface->wait(c, &rq[1]));
    DT_ASSERT_OK(c->iface->wait(c, &rq[2])); /* completed already: a no-op */
    DT_ASSERT_OK(c->iface->test(c, &rq[1], &done));
    DT_ASSERT_TRUE(done, "test of a completed request says not done");
    for (int i = 0; i < 3; i++) c->iface->req_free(&rq[i]);
  }
  same(h[0], dh[0], (size_t)total * item, "non-blocking all_gather_v", dn);
  same(h[1], dh[1], (size_t)total * item, "non-blocking all_reduce", dn);
  same(h[2], dh[2], 6 * item, "non-blocking reduce_scatter_v", dn);
  for (int i = 0; i < 3; i++) {
    dfree(dh[i], i < 2 ? (size_t)total * item : 6 * item);
    free(h[i]);
  }
  dfree(da, 6 * item);
  dfree(db, (size_t)total * item);
  free(a);
  free(b);
}

/* Equal counts, displacements that differ between ranks (odd ranks: reversed with gaps; even
 * ranks: back to back): the implementations may choose their form only from the counts. */
static void t_gather_displs(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn) {
  int n = mc->size, me = mc->rank;
  size_t item = dt__itemsize(d);
  int64_t counts[64], displs[64];
  for (int r = 0; r < n; r++) {
    counts[r] = 3;
    displs[r] = me % 2 ? (int64_t)(n - 1 - r) * 5 : 3 * r;
  }
  int64_t total = me % 2 ? 5 * (int64_t)n : 3 * (int64_t)n;
  size_t nb = (size_t)total * item;
  void* send = fill(d, 3, me + 7);
  void* h = fill(d, total, 31);
  void* dv = dev_from(h, nb);
  void* ds = dev_from(send, 3 * item);
  for (int k = 0; k < 2; k++) { /* blocking, then with a request */
    dt_comm_req_t rq[2];
    memset(rq, 0, sizeof rq);
    DT_ASSERT_OK(mc->iface->all_gather_v(mc, send, h, counts, displs, d, k ? &rq[0] : NULL));
    DT_ASSERT_OK(nc->iface->all_gather_v(nc, ds, dv, counts, displs, d, k ? &rq[1] : NULL));
    if (k) {
      DT_ASSERT_OK(mc->iface->wait(mc, &rq[0]));
      DT_ASSERT_OK(nc->iface->wait(nc, &rq[1]));
      mc->iface->req_free(&rq[0]);
      nc->iface->req_free(&rq[1]);
    }
    same(h, dv, nb, "all_gather_v with per-rank displacements", dn);
  }
  dfree(dv, nb);
  dfree(ds, 3 * item);
  free(send);
  free(h);
}

/* A ring step posted in one group with requests (ring attention's pattern), the send's request
 * first used for an all-reduce still in flight (one request, two operations), and a send with a
 * request outside a group that must start at once: rank 0's peer receives it before rank 0 waits. */
static void t_p2p_requests(dt_comm_t* mc, dt_comm_t* nc, dt_dtype_t d, const char* dn,
                           int world) {
  int n = mc->size, me = mc->rank;
  if (n < 2) return;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  size_t item = dt__itemsize(d);
  const int64_t numel = 11;
  const size_t nb = (size_t)numel * item;
  void* send = fill(d, numel, me + 3);
  void* red = fill(d, numel, me + 5);
  void *hr = fill(d, numel, 0), *hred = fill(d, numel, 0);
  void *ds = dev_from(send, nb), *dr = dev_from(hr, nb), *dred = dev_from(red, nb);
  void* dredo = dev_from(hred, nb);
  dt_comm_t* cs[2] = {mc, nc};
  void* b[2][4] = {{send, hr, red, hred}, {ds, dr, dred, dredo}};
  for (int k = 0; k < 2; k++) {
    dt_comm_t* c = cs[k];
    dt_comm_req_t rq[2];
    memset(rq, 0, sizeof rq);
    DT_ASSERT_OK(c->iface->all_reduce(c, b[k][2], b[k][3], numel, d, DT_REDUCE_MAX, &rq[1]));
    if (c->iface->group_start) DT_ASSERT_OK(c->iface->group_start(c));
    DT_ASSERT_OK(c->iface->recv(c, b[k][1], numel, d, prev, &rq[0]));
    DT_ASSERT_OK(c->iface->send(c, b[k][0], numel, d, next, &rq[1]));
    if (c->iface->group_end) DT_ASSERT_OK(c->iface->group_end(c));
    DT_ASSERT_OK(c->iface->wait(c, &rq[1]));
    DT_ASSERT_OK(c->iface->wait(c, &rq[0]));
    c->iface->req_free(&rq[0]);
    c->iface->req_free(&rq[1]);
  }
  same(hr, dr, nb, "ring step in a group with requests", dn);
  same(hred, dredo, nb, "all-reduce sharing a request with a send", dn);
  /* outside a group: rank 0's send starts at once (its peer's blocking receive returns before
   * rank 0 waits, which it does only after a message from that peer) */
  if (world && me < 2) { /* on the world: communicator ranks are world ranks */
    dt_comm_req_t rq;
    memset(&rq, 0, sizeof rq);
    int token = 0;
    if (me == 0) {
      DT_ASSERT_OK(nc->iface->send(nc, ds, numel, d, 1, &rq));
      MPI_Recv(&token, 1, MPI_INT, 1, 99, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      DT_ASSERT_OK(nc->iface->wait(nc, &rq));
      nc->iface->req_free(&rq);
    } else {
      DT_ASSERT_OK(nc->iface->recv(nc, dr, numel, d, 0, NULL));
      MPI_Send(&token, 1, MPI_INT, 0, 99, MPI_COMM_WORLD);
    }
  }
  dfree(ds, nb);
  dfree(dr, nb);
  dfree(dred, nb);
  dfree(dredo, nb);
  free(send);
  free(red);
  free(hr);
  free(hred);
}

static void t_all(dt_comm_t* mc, dt_comm_t* nc, const char* name) {
  DT_ASSERT_TRUE(mc->size == nc->size && mc->rank == nc->rank,
                 "%s: MPI has rank %d of %d, NCCL rank %d of %d", name, mc->rank, mc->size,
                 nc->rank, nc->size);
  for (size_t i = 0; i < sizeof k_dtypes / sizeof *k_dtypes; i++) {
    t_all_gather(mc, nc, k_dtypes[i], k_dnames[i]);
    t_all_reduce(mc, nc, k_dtypes[i], k_dnames[i]);
    t_reduce_scatter(mc, nc, k_dtypes[i], k_dnames[i]);
    t_all_to_all(mc, nc, k_dtypes[i], k_dnames[i]);
    t_rooted(mc, nc, k_dtypes[i], k_dnames[i]);
    t_p2p(mc, nc, k_dtypes[i], k_dnames[i]);
    t_gather_displs(mc, nc, k_dtypes[i], k_dnames[i]);
  }
  t_p2p_requests(mc, nc, DT_F32, "f32", !strcmp(name, "world"));
  t_nonblocking(mc, nc, DT_F32, "f32");
  t_nonblocking(mc, nc, DT_BF16, "bf16");
}

/* refusals: a status on every rank, nothing posted (the next call still works) */
static void t_refusals(dt_comm_t* nc) {
  float* d = dev_from((float[8]){0}, 8 * sizeof(float));
  DT_ASSERT_STATUS(nc->iface->all_reduce(nc, d, d, 8, DT_F32, DT_REDUCE_AVG, NULL),
                   DT_ERR_INTERNAL);
  DT_ASSERT_STATUS(nc->iface->broadcast(nc, d, 8, (dt_dtype_t)99, 0, NULL), DT_ERR_INVALID_ARG);
  /* a call NCCL itself fails (a root past the last rank): DT_ERR_NCCL on every rank, no hang */
  DT_ASSERT_STATUS(nc->iface->broadcast(nc, d, 8, DT_F32, nc->size, NULL), DT_ERR_NCCL);
  dt_comm_t none;
  DT_ASSERT_STATUS(nc->iface->split(NULL, 0, 0, &none), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(nc->iface->all_reduce(nc, d, d, 8, DT_F32, DT_REDUCE_SUM, NULL));
  dfree(d, 8 * sizeof(float));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  g_b = dt__backend_default();
  int rank = dt_test_rank();
  if (!dt__backend_is_device(g_b)) {
    if (rank == 0) printf("SKIP: backend %s has no NCCL communicator\n", g_b->name);
    DT_ASSERT_OK(dt_finalize());
    return 0;
  }
  const dt_comm_t* world = dt__comm_world();
  dt_comm_t nw, md, nd;
  DT_ASSERT_OK(dt__comm_nccl_world(g_b, world, &nw));
  DT_ASSERT_TRUE(dt__comm_is_nccl(&nw) && !dt__comm_is_nccl(world), "dt__comm_is_nccl");
  t_all((dt_comm_t*)world, &nw, "world");
  DT_ASSERT_OK(world->iface->dup(world, &md));
  DT_ASSERT_OK(nw.iface->dup(&nw, &nd));
  t_all(&md, &nd, "dup");
  int n = world->size;
  if (n >= 2) {
    /* halves (ranks in order) and odd / even with reversed keys */
    const int colors[2] = {rank / ((n + 1) / 2), rank % 2};
    const int keys[2] = {rank, n - rank};
    for (int s = 0; s < 2; s++) {
      dt_comm_t ms, ns;
      DT_ASSERT_OK(world->iface->split(world, colors[s], keys[s], &ms));
      DT_ASSERT_OK(nw.iface->split(&nw, colors[s], keys[s], &ns));
      t_all(&ms, &ns, s ? "odd/even reversed" : "halves");
      if (s == 0) { /* an NCCL world bootstrapped over a part of the job (a sub-mesh's) */
        dt_comm_t nsub;
        DT_ASSERT_OK(dt__comm_nccl_world(g_b, &ms, &nsub));
        t_all(&ms, &nsub, "NCCL bootstrapped over the halves");
        dt__comm_release(&nsub);
      }
      dt__comm_release(&ns);
      dt__comm_release(&ms);
    }
    /* a color < 0 gives this rank no communicator */
    dt_comm_t ms, ns;
    DT_ASSERT_OK(nw.iface->split(&nw, rank == 0 ? -1 : 0, rank, &ns));
    DT_ASSERT_TRUE(rank == 0 ? ns.iface == NULL && ns.size == 0 : ns.size == n - 1,
                   "split with color -1: size %d", ns.size);
    DT_ASSERT_OK(world->iface->split(world, rank == 0 ? -1 : 0, rank, &ms));
    if (rank != 0) t_all(&ms, &ns, "all but rank 0");
    dt__comm_release(&ns);
    dt__comm_release(&ms);
  }
  t_refusals(&nw);
  dt__comm_release(&nd);
  dt__comm_release(&md);
  dt__comm_release(&nw);
  int all = 0;
  MPI_Allreduce(&g_cases, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("nccl_conformance=PASS cases=%d ranks=%d backend=%s\n", all, n, g_b->name);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* comm_mpi.c - the CPU communication backend: dt_comm_i over Open MPI.
 *
 * Every communicator descends from a private duplicate of MPI_COMM_WORLD whose error handler is
 * MPI_ERRORS_RETURN (inherited by splits and dups), so an MPI failure comes back as DT_ERR_MPI
 * with MPI's own text instead of aborting the job. bf16 and f16 travel as 16-bit integers and are
 * reduced by user-defined MPI ops that compute in f32.
 *
 * Counts are 64-bit; one MPI call carries at most dt__comm_max_count() elements (MPI's int). A
 * larger all-reduce or broadcast becomes several calls over consecutive pieces; the v-forms whose
 * counts or displacements do not fit fall back to point-to-point transfers in pieces (a
 * reduce-scatter to one MPI_Reduce per destination piece). Non-blocking forms use MPI's I*
 * collectives (and Isend/Irecv); their count arrays live in the request until completion.
 * Blocking calls reuse one grow-only int array, so the steady path allocates nothing.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>

#include "comm/comm.h"

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request does not fit a req slot");

typedef struct {
  MPI_Comm comm;
  int in_group;          /* group_start depth */
  dt_comm_req_t group;   /* point-to-point calls of the open group */
} dt__mpi_t;

static MPI_Comm dt__world = MPI_COMM_NULL;
static dt_comm_t dt__world_comm;
static MPI_Op dt__half_ops[2][3]; /* [bf16, f16][sum, max, min] */
static int dt__half_ops_ready = 0;
static int dt__mpi_owned = 0; /* dt_init started MPI */
static int64_t dt__maxc = INT_MAX;
static int* dt__ints;         /* count arrays of blocking calls */
static size_t dt__ints_cap;

#define DT__TAG_P2P 7
#define DT__TAG_FALLBACK 8

static dt_status_t dt__mpi_fail(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  return DT_FAIL(DT_ERR_MPI, "%s failed: %s", what, msg);
}
#define DT_MPI_CHECK(call)                                         \
  do {                                                             \
    int dt__rc = (call);                                           \
    if (dt__rc != MPI_SUCCESS) return dt__mpi_fail(dt__rc, #call); \
  } while (0)

int64_t dt__comm_max_count(void) { return dt__maxc; }

/* ---------------------------------------------------------------------------------------------
 * 16-bit float reductions */

#define DT__HALF_OP(NAME, LOAD, STORE, EXPR)                              \
  static void NAME(void* in, void* inout, int* len, MPI_Datatype* type) { \
    (void)type;                                                           \
    const uint16_t* a = (const uint16_t*)in;                              \
    uint16_t* b = (uint16_t*)inout;                                       \
    for (int i = 0; i < *len; i++) {                                      \
      float x = LOAD(a[i]), y = LOAD(b[i]);                               \
      b[i] = STORE(EXPR);                                                 \
    }                                                                     \
  }
DT__HALF_OP(dt__bf16_sum, dt__bf16_to_f32, dt__f32_to_bf16, x + y)
DT__HALF_OP(dt__bf16_max, dt__bf16_to_f32, dt__f32_to_bf16, (x > y || x != x) ? x : y)
DT__HALF_OP(dt__bf16_min, dt__bf16_to_f32, dt__f32_to_bf16, (x < y || x != x) ? x : y)
DT__HALF_OP(dt__f16_sum, dt__f16_to_f32, dt__f32_to_f16, x + y)
DT__HALF_OP(dt__f16_max, dt__f16_to_f32, dt__f32_to_f16, (x > y || x != x) ? x : y)
DT__HALF_OP(dt__f16_min, dt__f16_to_f32, dt__f32_to_f16, (x < y || x != x) ? x : y)

static MPI_Datatype dt__mpi_type(dt_dtype_t d) {
  switch (d) {
    case DT_F32: return MPI_FLOAT;
    case DT_BF16:
    case DT_F16: return MPI_UINT16_T;
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

static dt_status_t dt__mpi_op(dt_dtype_t d, dt_reduce_op_t op, MPI_Op* out) {
  int k = op == DT_REDUCE_SUM ? 0 : op == DT_REDUCE_MAX ? 1 : op == DT_REDUCE_MIN ? 2 : -1;
  if (k < 0) return DT_FAIL(DT_ERR_INTERNAL, "reduce op %d has no MPI equivalent", (int)op);
  if (d == DT_BF16 || d == DT_F16) {
    *out = dt__half_ops[d == DT_F16][k];
  } else {
    static const MPI_Op std_ops[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
    *out = std_ops[k];
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * requests */

static MPI_Request* dt__req_arr(dt_comm_req_t* r) {
  return (MPI_Request*)(void*)(r->more ? r->more : r->inline_h);
}

/* A new handle slot in r (its value is written by the MPI call). */
static dt_status_t dt__req_slot(dt_comm_req_t* r, MPI_Request** out) {
  if (r->cap == 0) r->cap = DT_COMM_REQ_INLINE;
  if (r->n == r->cap) {
    int cap = r->cap * 2;
    uint64_t* m = (uint64_t*)dt__malloc(sizeof(uint64_t) * (size_t)cap);
    if (m == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "request handles");
    memcpy(m, r->more ? r->more : r->inline_h, sizeof(uint64_t) * (size_t)r->n);
    dt__free(r->more);
    r->more = m;
    r->cap = cap;
  }
  *out = dt__req_arr(r) + r->n++;
  return DT_SUCCESS;
}

/* Blocks a request keeps form a list; those before *keep_free are in use by posted calls. */
typedef struct dt__keep {
  struct dt__keep* next;
  size_t cap; /* ints */
  int data[];
} dt__keep_t;

/* Completion: the handles and kept blocks become free for the next post (memory kept). */
static void dt__req_done(dt_comm_req_t* r) {
  r->n = 0;
  r->keep_free = &r->keep;
}

static void dt__req_free(dt_comm_req_t* r) {
  dt__free(r->more);
  for (dt__keep_t* k = (dt__keep_t*)r->keep; k != NULL;) {
    dt__keep_t* next = k->next;
    dt__free(k);
    k = next;
  }
  memset(r, 0, sizeof *r);
}

/* Memory the request keeps until completion (count arrays of a non-blocking v-collective): the
 * next free kept block when it is large enough, else a new one in its place; or the shared array
 * of blocking calls. */
static dt_status_t dt__ints_for(dt_comm_req_t* r, size_t count, int** out) {
  if (count == 0) count = 1;
  if (r != NULL) {
    void** link = r->keep_free ? r->keep_free : &r->keep;
    dt__keep_t* k = (dt__keep_t*)*link;
    if (k == NULL || k->cap < count) {
      dt__keep_t* nk = (dt__keep_t*)dt__malloc(sizeof(dt__keep_t) + sizeof(int) * count);
      if (nk == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "count arrays");
      nk->cap = count;
      nk->next = k ? k->next : NULL;
      dt__free(k); /* free: nothing posted uses it */
      *link = nk;
      k = nk;
    }
    r->keep_free = (void**)&k->next;
    *out = k->data;
    return DT_SUCCESS;
  }
  if (count > dt__ints_cap) {
    size_t cap = count < 64 ? 64 : count;
    int* p = (int*)dt__realloc(dt__ints, sizeof(int) * cap);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "count arrays");
    dt__ints = p;
    dt__ints_cap = cap;
  }
  *out = dt__ints;
  return DT_SUCCESS;
}

/* counts[0..n) then displs[0..n) as MPI ints (the caller checked they fit). */
static dt_status_t dt__counts_displs(dt_comm_req_t* req, int n, const int64_t* counts,
                                     const int64_t* displs, int** out) {
  DT_CHECK(dt__ints_for(req, (size_t)n * 2, out));
  for (int r = 0; r < n; r++) {
    (*out)[r] = (int)counts[r];
    (*out)[n + r] = (int)displs[r];
  }
  return DT_SUCCESS;
}

static MPI_Comm dt__c(const dt_comm_t* c) { return ((const dt__mpi_t*)c->context)->comm; }

/* The request a call posts into: the caller's, the open group's, or a local one completed
 * before returning (*local set). */
static dt_comm_req_t* dt__post_req(dt_comm_t* c, dt_comm_req_t* req, dt_comm_req_t* tmp,
                                   int* local) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  *local = 0;
  if (req) return req;
  if (m->in_group) return &m->group;
  memset(tmp, 0, sizeof *tmp);
  *local = 1;
  return tmp;
}

static dt_status_t dt__waitall(dt_comm_req_t* r) {
  int rc = r->n ? MPI_Waitall(r->n, dt__req_arr(r), MPI_STATUSES_IGNORE) : MPI_SUCCESS;
  dt__req_done(r);
  if (rc != MPI_SUCCESS) return dt__mpi_fail(rc, "MPI_Waitall");
  return DT_SUCCESS;
}

/* Completes a request local to one blocking call and frees it. */
static dt_status_t dt__local_end(dt_comm_req_t* r) {
  dt_status_t st = dt__waitall(r);
  dt__req_free(r);
  return st;
}

/* Sends / receives n elements in pieces of at most the max count (non-blocking, into r). */
static dt_status_t dt__isend_pieces(const dt_comm_t* c, const void* buf, int64_t n, dt_dtype_t dt,
                                    int peer, int tag, dt_comm_req_t* r) {
  size_t item = dt__itemsize(dt);
  for (int64_t off = 0; off < n; off += dt__maxc) {
    int64_t k = n - off < dt__maxc ? n - off : dt__maxc;
    MPI_Request* h;
    DT_CHECK(dt__req_slot(r, &h));
    DT_MPI_CHECK(MPI_Isend((const char*)buf + (size_t)off * item, (int)k, dt__mpi_type(dt), peer,
                           tag, dt__c(c), h));
  }
  return DT_SUCCESS;
}

static dt_status_t dt__irecv_pieces(const dt_comm_t* c, void* buf, int64_t n, dt_dtype_t dt,
                                    int peer, int tag, dt_comm_req_t* r) {
  size_t item = dt__itemsize(dt);
  for (int64_t off = 0; off < n; off += dt__maxc) {
    int64_t k = n - off < dt__maxc ? n - off : dt__maxc;
    MPI_Request* h;
    DT_CHECK(dt__req_slot(r, &h));
    DT_MPI_CHECK(MPI_Irecv((char*)buf + (size_t)off * item, (int)k, dt__mpi_type(dt), peer, tag,
                           dt__c(c), h));
  }
  return DT_SUCCESS;
}

/* 1 when every value fits one MPI call. */
static int dt__fit(int n, const int64_t* a, const int64_t* b) {
  for (int i = 0; i < n; i++)
    if (a[i] > dt__maxc || (b && b[i] > dt__maxc)) return 0;
  return 1;
}

/* ---------------------------------------------------------------------------------------------
 * collectives */

static dt_status_t dt__mpi_all_gather_v(dt_comm_t* c, const void* send, void* recv,
                                        const int64_t* counts, const int64_t* displs,
                                        dt_dtype_t dtype, dt_comm_req_t* req) {
  MPI_Datatype t = dt__mpi_type(dtype);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  if (dt__fit(n, counts, displs)) {
    int uniform = 1; /* the plain collective may use better algorithms than the v-form */
    for (int r = 0; r < n; r++) uniform &= counts[r] == counts[0] && displs[r] == r * counts[0];
    const void* s = send ? send : MPI_IN_PLACE;
    if (uniform) {
      int k = (int)counts[0];
      if (req == NULL) DT_MPI_CHECK(MPI_Allgather(s, k, t, recv, k, t, dt__c(c)));
      else {
        MPI_Request* h;
        DT_CHECK(dt__req_slot(req, &h));
        DT_MPI_CHECK(MPI_Iallgather(s, k, t, recv, k, t, dt__c(c), h));
      }
      return DT_SUCCESS;
    }
    int* ints;
    DT_CHECK(dt__counts_displs(req, n, counts, displs, &ints));
    if (req == NULL) {
      DT_MPI_CHECK(MPI_Allgatherv(s, ints[me], t, recv, ints, ints + n, t, dt__c(c)));
    } else {
      MPI_Request* h;
      DT_CHECK(dt__req_slot(req, &h));
      DT_MPI_CHECK(MPI_Iallgatherv(s, ints[me], t, recv, ints, ints + n, t, dt__c(c), h));
    }
    return DT_SUCCESS;
  }
  /* beyond MPI's int: every block to every peer in pieces */
  dt_comm_req_t tmp;
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &tmp, &local);
  const void* mine = send ? send : (const char*)recv + (size_t)displs[me] * item;
  for (int q = 0; q < n; q++) {
    if (q == me) continue;
    DT_CHECK(dt__irecv_pieces(c, (char*)recv + (size_t)displs[q] * item, counts[q], dtype, q,
                              DT__TAG_FALLBACK, r));
    DT_CHECK(dt__isend_pieces(c, mine, counts[me], dtype, q, DT__TAG_FALLBACK, r));
  }
  if (send && counts[me]) memmove((char*)recv + (size_t)displs[me] * item, send,
                                  (size_t)counts[me] * item);
  return local ? dt__local_end(r) : DT_SUCCESS;
}

static dt_status_t dt__mpi_all_reduce(dt_comm_t* c, const void* send, void* recv, int64_t numel,
                                      dt_dtype_t dtype, dt_reduce_op_t op, dt_comm_req_t* req) {
  MPI_Op mop;
  DT_CHECK(dt__mpi_op(dtype, op, &mop));
  size_t item = dt__itemsize(dtype);
  for (int64_t off = 0; off < numel; off += dt__maxc) {
    int k = (int)(numel - off < dt__maxc ? numel - off : dt__maxc);
    const void* s = send == recv ? MPI_IN_PLACE : (const char*)send + (size_t)off * item;
    void* d = (char*)recv + (size_t)off * item;
    if (req == NULL) {
      DT_MPI_CHECK(MPI_Allreduce(s, d, k, dt__mpi_type(dtype), mop, dt__c(c)));
    } else {
      MPI_Request* h;
      DT_CHECK(dt__req_slot(req, &h));
      DT_MPI_CHECK(MPI_Iallreduce(s, d, k, dt__mpi_type(dtype), mop, dt__c(c), h));
    }
  }
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_reduce_scatter_v(dt_comm_t* c, const void* send, void* recv,
                                            const int64_t* counts, dt_dtype_t dtype,
                                            dt_reduce_op_t op, dt_comm_req_t* req) {
  MPI_Op mop;
  DT_CHECK(dt__mpi_op(dtype, op, &mop));
  MPI_Datatype t = dt__mpi_type(dtype);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  int64_t total = 0;
  for (int r = 0; r < n; r++) total += counts[r];
  if (dt__fit(n, counts, NULL) && total <= dt__maxc) {
    int even = 1;
    for (int r = 1; r < n; r++) even &= counts[r] == counts[0];
    if (even) {
      if (req == NULL) {
        DT_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, (int)counts[0], t, mop, dt__c(c)));
      } else {
        MPI_Request* h;
        DT_CHECK(dt__req_slot(req, &h));
        DT_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, (int)counts[0], t, mop, dt__c(c), h));
      }
      return DT_SUCCESS;
    }
    int* ints;
    DT_CHECK(dt__ints_for(req, (size_t)n, &ints));
    for (int r = 0; r < n; r++) ints[r] = (int)counts[r];
    if (req == NULL) {
      DT_MPI_CHECK(MPI_Reduce_scatter(send, recv, ints, t, mop, dt__c(c)));
    } else {
      MPI_Request* h;
      DT_CHECK(dt__req_slot(req, &h));
      DT_MPI_CHECK(MPI_Ireduce_scatter(send, recv, ints, t, mop, dt__c(c), h));
    }
    return DT_SUCCESS;
  }
  /* beyond MPI's int: one reduction per destination piece */
  int64_t at = 0;
  for (int r = 0; r < n; r++) {
    for (int64_t off = 0; off < counts[r]; off += dt__maxc) {
      int k = (int)(counts[r] - off < dt__maxc ? counts[r] - off : dt__maxc);
      const char* s = (const char*)send + (size_t)(at + off) * item;
      void* d = r == me ? (char*)recv + (size_t)off * item : NULL;
      if (req == NULL) {
        DT_MPI_CHECK(MPI_Reduce(s, d, k, t, mop, r, dt__c(c)));
      } else {
        MPI_Request* h;
        DT_CHECK(dt__req_slot(req, &h));
        DT_MPI_CHECK(MPI_Ireduce(s, d, k, t, mop, r, dt__c(c), h));
      }
    }
    at += counts[r];
  }
  return DT_SUCCESS;
}

/* General: point-to-point to and from every peer (Open MPI's own linear alltoallv). A rank sees
 * only its own counts, so an MPI_Alltoallv for counts that fit and point-to-point for those that
 * do not could differ between ranks; point-to-point is always the same, and is how NCCL composes
 * it too. */
static dt_status_t dt__mpi_all_to_all_v(dt_comm_t* c, const void* send, const int64_t* scounts,
                                        const int64_t* sdispls, void* recv,
                                        const int64_t* rcounts, const int64_t* rdispls,
                                        dt_dtype_t dtype, dt_comm_req_t* req) {
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  dt_comm_req_t tmp;
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &tmp, &local);
  for (int q = 0; q < n; q++) {
    if (q == me) continue;
    DT_CHECK(dt__irecv_pieces(c, (char*)recv + (size_t)rdispls[q] * item, rcounts[q], dtype, q,
                              DT__TAG_FALLBACK, r));
    DT_CHECK(dt__isend_pieces(c, (const char*)send + (size_t)sdispls[q] * item, scounts[q], dtype,
                              q, DT__TAG_FALLBACK, r));
  }
  if (scounts[me])
    memmove((char*)recv + (size_t)rdispls[me] * item, (const char*)send + (size_t)sdispls[me] * item,
            (size_t)scounts[me] * item);
  return local ? dt__local_end(r) : DT_SUCCESS;
}

static dt_status_t dt__mpi_broadcast(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                     int root, dt_comm_req_t* req) {
  size_t item = dt__itemsize(dtype);
  for (int64_t off = 0; off < numel; off += dt__maxc) {
    int k = (int)(numel - off < dt__maxc ? numel - off : dt__maxc);
    void* p = (char*)buf + (size_t)off * item;
    if (req == NULL) {
      DT_MPI_CHECK(MPI_Bcast(p, k, dt__mpi_type(dtype), root, dt__c(c)));
    } else {
      MPI_Request* h;
      DT_CHECK(dt__req_slot(req, &h));
      DT_MPI_CHECK(MPI_Ibcast(p, k, dt__mpi_type(dtype), root, dt__c(c), h));
    }
  }
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_scatter_v(dt_comm_t* c, const void* send, const int64_t* counts,
                                     const int64_t* displs, void* recv, dt_dtype_t dtype, int root,
                                     dt_comm_req_t* req) {
  MPI_Datatype t = dt__mpi_type(dtype);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  if (dt__fit(n, counts, displs)) {
    int* ints;
    DT_CHECK(dt__counts_displs(req, n, counts, displs, &ints));
    if (req == NULL) {
      DT_MPI_CHECK(MPI_Scatterv(send, ints, ints + n, t, recv, ints[me], t, root, dt__c(c)));
    } else {
      MPI_Request* h;
      DT_CHECK(dt__req_slot(req, &h));
      DT_MPI_CHECK(MPI_Iscatterv(send, ints, ints + n, t, recv, ints[me], t, root, dt__c(c), h));
    }
    return DT_SUCCESS;
  }
  dt_comm_req_t tmp;
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &tmp, &local);
  if (me == root) {
    for (int q = 0; q < n; q++)
      if (q != me)
        DT_CHECK(dt__isend_pieces(c, (const char*)send + (size_t)displs[q] * item, counts[q],
                                  dtype, q, DT__TAG_FALLBACK, r));
    if (counts[me])
      memmove(recv, (const char*)send + (size_t)displs[me] * item, (size_t)counts[me] * item);
  } else {
    DT_CHECK(dt__irecv_pieces(c, recv, counts[me], dtype, root, DT__TAG_FALLBACK, r));
  }
  return local ? dt__local_end(r) : DT_SUCCESS;
}

static dt_status_t dt__mpi_send(dt_comm_t* c, const void* buf, int64_t numel, dt_dtype_t dtype,
                                int peer, dt_comm_req_t* req) {
  dt_comm_req_t tmp;
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &tmp, &local);
  DT_CHECK(dt__isend_pieces(c, buf, numel, dtype, peer, DT__TAG_P2P, r));
  return local ? dt__local_end(r) : DT_SUCCESS;
}

static dt_status_t dt__mpi_recv(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                int peer, dt_comm_req_t* req) {
  dt_comm_req_t tmp;
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &tmp, &local);
  DT_CHECK(dt__irecv_pieces(c, buf, numel, dtype, peer, DT__TAG_P2P, r));
  return local ? dt__local_end(r) : DT_SUCCESS;
}

static dt_status_t dt__mpi_group_start(dt_comm_t* c) {
  ((dt__mpi_t*)c->context)->in_group++;
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_group_end(dt_comm_t* c) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  if (m->in_group == 0) return DT_FAIL(DT_ERR_INTERNAL, "group_end without group_start");
  if (--m->in_group > 0) return DT_SUCCESS;
  return dt__waitall(&m->group);
}

static dt_status_t dt__mpi_wait(dt_comm_t* c, dt_comm_req_t* req) {
  (void)c;
  return dt__waitall(req);
}

static dt_status_t dt__mpi_test(dt_comm_t* c, dt_comm_req_t* req, int* done) {
  (void)c;
  int flag = 1;
  if (req->n) {
    int rc = MPI_Testall(req->n, dt__req_arr(req), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      dt__req_done(req);
      *done = 1;
      return dt__mpi_fail(rc, "MPI_Testall");
    }
  }
  *done = flag;
  if (flag) dt__req_done(req);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * communicators */

static const struct dt_comm_i dt__mpi_iface;

static dt_status_t dt__comm_wrap(MPI_Comm mc, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (mc == MPI_COMM_NULL) return DT_SUCCESS;
  dt__mpi_t* h = (dt__mpi_t*)dt__calloc(1, sizeof *h);
  if (h == NULL) {
    MPI_Comm_free(&mc);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a communicator handle");
  }
  h->comm = mc;
  out->iface = &dt__mpi_iface;
  out->context = h;
  out->api_version = DT_COMM_API_VERSION;
  DT_MPI_CHECK(MPI_Comm_size(mc, &out->size));
  DT_MPI_CHECK(MPI_Comm_rank(mc, &out->rank));
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_split(const dt_comm_t* parent, int color, int key, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  MPI_Comm p = parent ? dt__c(parent) : dt__world;
  if (p == MPI_COMM_NULL) return DT_FAIL(DT_ERR_NOT_INITIALIZED, "MPI not set up");
  MPI_Comm nc = MPI_COMM_NULL;
  DT_MPI_CHECK(MPI_Comm_split(p, color < 0 ? MPI_UNDEFINED : color, key, &nc));
  return dt__comm_wrap(nc, out);
}

static dt_status_t dt__mpi_dup(const dt_comm_t* c, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  MPI_Comm nc = MPI_COMM_NULL;
  DT_MPI_CHECK(MPI_Comm_dup(dt__c(c), &nc));
  return dt__comm_wrap(nc, out);
}

static void dt__mpi_destroy(dt_comm_t* c) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  if (m == NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  dt__req_free(&m->group);
  dt__free(m);
  c->context = NULL;
}

static const struct dt_comm_i dt__mpi_iface = {
    .split = dt__mpi_split,
    .dup = dt__mpi_dup,
    .destroy = dt__mpi_destroy,
    .all_gather_v = dt__mpi_all_gather_v,
    .all_reduce = dt__mpi_all_reduce,
    .reduce_scatter_v = dt__mpi_reduce_scatter_v,
    .all_to_all_v = dt__mpi_all_to_all_v,
    .broadcast = dt__mpi_broadcast,
    .scatter_v = dt__mpi_scatter_v,
    .send = dt__mpi_send,
    .recv = dt__mpi_recv,
    .group_start = dt__mpi_group_start,
    .group_end = dt__mpi_group_end,
    .wait = dt__mpi_wait,
    .test = dt__mpi_test,
    .req_free = dt__req_free,
};

void dt__comm_release(dt_comm_t* c) {
  if (c != NULL && c->iface != NULL && c->iface->destroy != NULL) c->iface->destroy(c);
  if (c != NULL) memset(c, 0, sizeof *c);
}

const dt_comm_t* dt__comm_world(void) { return dt__world_comm.iface ? &dt__world_comm : NULL; }

/* ---------------------------------------------------------------------------------------------
 * setup */

dt_status_t dt__comm_mpi_init(int* argc, char*** argv, int* we_initialized) {
  int inited = 0, finalized = 0;
  *we_initialized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "MPI is already finalized; dt_init cannot start it again");
  DT_MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) {
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return DT_FAIL(DT_ERR_MPI, "MPI_Init_thread failed (code %d)", rc);
    *we_initialized = 1;
  }
  if (dt__world == MPI_COMM_NULL) {
    DT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dt__world));
    DT_MPI_CHECK(MPI_Comm_set_errhandler(dt__world, MPI_ERRORS_RETURN));
    MPI_Comm wc;
    DT_MPI_CHECK(MPI_Comm_dup(dt__world, &wc));
    DT_CHECK(dt__comm_wrap(wc, &dt__world_comm));
  }
  if (!dt__half_ops_ready) {
    MPI_User_function* fns[2][3] = {{dt__bf16_sum, dt__bf16_max, dt__bf16_min},
                                    {dt__f16_sum, dt__f16_max, dt__f16_min}};
    for (int d = 0; d < 2; d++)
      for (int k = 0; k < 3; k++) DT_MPI_CHECK(MPI_Op_create(fns[d][k], 1, &dt__half_ops[d][k]));
    dt__half_ops_ready = 1;
  }
  const char* e = getenv("DTENSOR_COMM_MAX_COUNT");
  long long v = e && *e ? strtoll(e, NULL, 10) : 0;
  dt__maxc = v >= 1 && v < INT_MAX ? (int64_t)v : INT_MAX;
  return DT_SUCCESS;
}

dt_status_t dt__comm_mpi_finalize(int we_initialized) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  dt__free(dt__ints);
  dt__ints = NULL;
  dt__ints_cap = 0;
  if (finalized) return DT_SUCCESS;
  dt__comm_release(&dt__world_comm);
  if (dt__half_ops_ready) {
    for (int d = 0; d < 2; d++)
      for (int k = 0; k < 3; k++) MPI_Op_free(&dt__half_ops[d][k]);
    dt__half_ops_ready = 0;
  }
  if (dt__world != MPI_COMM_NULL) MPI_Comm_free(&dt__world);
  if (we_initialized) DT_MPI_CHECK(MPI_Finalize());
  return DT_SUCCESS;
}

void dt__comm_mpi_set_owned(int we_initialized) { dt__mpi_owned = we_initialized; }

dt_status_t dt__comm_mpi_finalize_owned(void) {
  int owned = dt__mpi_owned;
  dt__mpi_owned = 0;
  return dt__comm_mpi_finalize(owned);
}

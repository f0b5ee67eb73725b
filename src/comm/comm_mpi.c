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
 * Blocking calls reuse one grow-only int array, one request and one reduction scratch, so the
 * steady path allocates nothing.
 *
 * Point-to-point forms: all-gather always (both forms), and blocking reduce-scatter (any size)
 * and all-reduce (up to DT__P2P_ALL_REDUCE_NBYTES sent per rank) send every block to the rank
 * that needs it and reduce the received copies with MPI_Reduce_local, pairwise in rank order
 * (identical bits on every rank). Open MPI's non-blocking collectives cost 1-2 us more per call than the
 * blocking ones on small messages (MPI_Iallgather up to 2x at 16-64 KiB); these forms are as fast
 * as the blocking collectives here or faster, so the deadline costs the hot path nothing.
 * all_to_all_box receives each remote block through a subarray datatype straight into its box of
 * the destination (strided all-gathers and all-to-alls need no scratch and no unpack pass).
 *
 * Deadlines: a blocking call posts the non-blocking form too and completes it in dt__wait_handles,
 * like wait and group_end: MPI_Testall in a loop paced by dt__poll_t (src/comm/deadline.c, shared
 * with the NCCL comm) that spins DT__SPIN_POLLS times (the fast path:
 * no clock read, no system call), then yields the core between polls, reads the clock every
 * 64 polls and, once the wait has lasted DT__NAP_AFTER_S, naps DT__NAP_NS between
 * polls (a peer that is that late is not coming within microseconds; a collective that is still
 * moving data progresses at each poll). Past the timeout, dt__comm_timeout reports, and the job
 * is aborted or DT_ERR_TIMEOUT returned with the handles left posted. Communicator duplicates use
 * MPI_Comm_idup; MPI_Comm_split has no non-blocking form, so a split first waits, bounded, on an
 * MPI_Ibarrier of the parent: a rank that never arrives is caught there.
 *
 * The collective check (DTENSOR_DEBUG=collectives, see comm.h): each vtable collective first
 * exchanges the ranks' records point-to-point under a tag of its own (DT__TAG_CHECK) on the same
 * communicator; a non-blocking call keeps its arguments in the request and is posted by wait or
 * test once the exchange has passed. Off, each call costs one branch.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <time.h>

#include "comm/comm.h"
#include "placement/layout.h"

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request does not fit a req slot");

typedef struct {
  MPI_Comm comm;
  int in_group;          /* group_start depth */
  dt_comm_req_t group;   /* point-to-point calls of the open group */
  /* the collective check: the record of an all_to_all_box that declined to place its boxes, for
   * the call the caller falls back to (valid while the thread's context epoch is box_epoch) */
  int box_pending;
  unsigned box_epoch;
  dt_call_desc_t box_desc;
  int64_t* box_v; /* its send and receive counts (2 size) */
} dt__mpi_t;

static MPI_Comm dt__world = MPI_COMM_NULL;
static dt_comm_t dt__world_comm;
/* [bf16, f16, f32][sum, max, min]; f32 sums use MPI_SUM (no entry) */
static MPI_Op dt__user_ops[3][3];
static int dt__user_ops_ready = 0;
static int dt__mpi_owned = 0; /* dt_init started MPI */
static int dt__mpi_serialized = 1; /* MPI takes calls from any thread, one at a time */
static int64_t dt__maxc = INT_MAX;
static int64_t dt__box_min = -1; /* all_to_all_box: DT__BOX_MIN_NBYTES or
                                   * $DTENSOR_COMM_BOX_MIN_NBYTES (-1 until read) */
static int* dt__ints;         /* count arrays of blocking calls */
static size_t dt__ints_cap;
static dt_comm_req_t dt__local; /* handles of blocking point-to-point calls (memory reused) */
static void* dt__scr;           /* received copies of blocking point-to-point reductions */
static size_t dt__scr_cap;
static int dt__ck_on = 0;       /* the collective check (DTENSOR_DEBUG=collectives) */
static int dt__ck_wrank = -1;   /* this rank in MPI_COMM_WORLD, for its records */
static void* dt__ck_tab;        /* the records of a blocking check */
static size_t dt__ck_cap;
static dt_comm_req_t dt__ck_req; /* the handles of a blocking check */

#define DT__TAG_P2P 7
#define DT__TAG_FALLBACK 8
#define DT__TAG_CHECK 9 /* the collective check's records: never matched by data traffic */

#define DT__SPIN_POLLS 256    /* polls before the first yield or clock read */
#define DT__NAP_AFTER_S 1.0   /* waits longer than this nap between polls */
#define DT__NAP_NS 50000L
/* A blocking all-reduce runs point-to-point (every rank sends its buffer to every peer and
 * reduces the n copies in rank order) up to this many bytes sent per rank; beyond, the MPI one. */
#define DT__P2P_ALL_REDUCE_NBYTES ((uint64_t)64 << 10)
/* Open MPI's shared-memory eager limit is 4 KiB with the header: a 4 KiB message takes the
 * rendezvous protocol (an extra round trip, 3-4 us here). Point-to-point transfers of more than
 * this many bytes and up to DT__EAGER_SPLIT_NBYTES go as pieces of this size instead, each eager
 * (4 KiB: 1.8 us instead of 5.9; 16 KiB: 5.0 instead of 6.8; beyond, one message is as fast). */
#define DT__EAGER_NBYTES 4000u
#define DT__EAGER_SPLIT_NBYTES ((uint64_t)16 << 10)
/* all_to_all_box places boxes directly when one holds at least this many bytes (above Open MPI's
 * shared-memory eager limit; below it, building the datatypes costs more than the unpack saves:
 * docs/performance.md). $DTENSOR_COMM_BOX_MIN_NBYTES overrides it (0: every box, for tests). */
#define DT__BOX_MIN_NBYTES ((int64_t)4 << 10)

static dt_status_t dt__mpi_fail(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  /* most often the ranks called different collectives (or one with other sizes): say how to
   * find out, unless that check is on already */
  return DT_FAIL(DT_ERR_MPI, "%s failed: %s%s", what, msg,
                 (dt__debug_mask() & DT_DBG_COLLECTIVES) ? "" : " (if the ranks may have made different calls here, "
                                 "DTENSOR_DEBUG=collectives names them)");
}
#define DT_MPI_CHECK(call)                                         \
  do {                                                             \
    int dt__rc = (call);                                           \
    if (dt__rc != MPI_SUCCESS) return dt__mpi_fail(dt__rc, #call); \
  } while (0)

int64_t dt__comm_max_count(void) { return dt__maxc; }

/* Completes n handles posted on comm within the deadline (see the top of this file). On a
 * timeout that returns, the handles stay posted. */
static dt_status_t dt__wait_handles(MPI_Comm comm, int n, MPI_Request* h, const char* op) {
  dt__poll_t p;
  dt__poll_init(&p, DT__SPIN_POLLS, DT__NAP_AFTER_S, DT__NAP_NS);
  for (;;) {
    int flag = 0;
    int rc = MPI_Testall(n, h, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return dt__mpi_fail(rc, "MPI_Testall");
    if (flag) return DT_SUCCESS;
    double waited;
    if (dt__poll_next(&p, &waited)) {
      int wr = -1, cs = 0;
      dt_status_t st = DT_ERR_TIMEOUT;
      MPI_Comm_rank(MPI_COMM_WORLD, &wr);
      MPI_Comm_size(comm, &cs);
      if (dt__comm_timeout(op, wr, cs, waited, &st)) return st;
      dt__comm_abort_job((int)DT_ERR_TIMEOUT);
      return st; /* not reached */
    }
  }
}

/* Posts one non-blocking MPI call into the caller's request (req) or, for a blocking call (req
 * NULL), into a local handle that it then completes within the deadline. `call` uses h. */
#define DT__POST(c, req, opname, call)                                               \
  do {                                                                               \
    MPI_Request dt__one = MPI_REQUEST_NULL, *h = &dt__one;                           \
    if ((req) != NULL) {                                                             \
      DT_CHECK(dt__req_slot((req), &h));                                             \
      (req)->op = (opname);                                                          \
    }                                                                                \
    DT_MPI_CHECK(call);                                                              \
    if ((req) == NULL) DT_CHECK(dt__wait_handles(dt__c(c), 1, &dt__one, (opname))); \
  } while (0)

/* ---------------------------------------------------------------------------------------------
 * user reductions: 16-bit floats (computed in f32), and f32 max / min that propagate a NaN of
 * either side as the host reduction does (MPI_MAX's result depends on the operands' order) */

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

#define DT__F32_OP(NAME, EXPR)                                            \
  static void NAME(void* in, void* inout, int* len, MPI_Datatype* type) { \
    (void)type;                                                           \
    const float* a = (const float*)in;                                    \
    float* b = (float*)inout;                                             \
    for (int i = 0; i < *len; i++) {                                      \
      float x = a[i], y = b[i];                                           \
      b[i] = (EXPR);                                                      \
    }                                                                     \
  }
DT__F32_OP(dt__f32_max, (x > y || x != x) ? x : y)
DT__F32_OP(dt__f32_min, (x < y || x != x) ? x : y)

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
  if (d == DT_BF16 || d == DT_F16 || (d == DT_F32 && k > 0)) {
    *out = dt__user_ops[d == DT_BF16 ? 0 : d == DT_F16 ? 1 : 2][k];
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

static void dt__defer_free(void* d);

static void dt__req_free(dt_comm_req_t* r) {
  dt__defer_free(r->check);
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

/* The request a call posts into: the caller's, the open group's, or the blocking calls' one,
 * completed before returning (*local set). */
static dt_comm_req_t* dt__post_req(dt_comm_t* c, dt_comm_req_t* req, int* local) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  *local = 0;
  if (req) return req;
  if (m->in_group) return &m->group;
  *local = 1;
  return &dt__local;
}

/* Completes every handle of r within the deadline. After a timeout that returns, r keeps its
 * handles and memory (still posted: nothing may wait for or free it). */
static dt_status_t dt__waitall(const dt_comm_t* c, dt_comm_req_t* r) {
  dt_status_t st = dt__wait_handles(dt__c(c), r->n, dt__req_arr(r), r->op ? r->op : "collective");
  if (st == DT_ERR_TIMEOUT) return st;
  dt__req_done(r);
  return st;
}

/* Completes the request of a blocking call (its memory kept for the next one). After a timeout
 * the request is forgotten, still posted (its memory leaked on purpose). */
static dt_status_t dt__local_end(const dt_comm_t* c, dt_comm_req_t* r, const char* op) {
  r->op = op;
  dt_status_t st = dt__waitall(c, r);
  if (st == DT_ERR_TIMEOUT) memset(r, 0, sizeof *r);
  return st;
}

/* Grow-only scratch of blocking point-to-point reductions. */
static dt_status_t dt__scratch(size_t nbytes, void** out) {
  if (nbytes > dt__scr_cap) {
    void* p = dt__malloc(nbytes);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%zu bytes of reduction scratch", nbytes);
    dt__free(dt__scr);
    dt__scr = p;
    dt__scr_cap = nbytes;
  }
  *out = dt__scr;
  return DT_SUCCESS;
}

/* acc <- the op over n blocks of numel elements back to back (overwritten), as a pairwise tree
 * in rank order ((b0 op b1) op (b2 op b3) ...): every rank computes the same bits, and like MPI's
 * recursive doubling, n equal values v/n sum back to v exactly when n is a power of two. */
static dt_status_t dt__reduce_ranks(void* blocks, int n, int64_t numel, dt_dtype_t dtype,
                                    MPI_Op mop, void* acc) {
  size_t item = dt__itemsize(dtype);
  size_t nb = (size_t)numel * item;
  if (numel == 0) return DT_SUCCESS;
  for (int stride = 1; stride < n; stride *= 2)
    for (int q = 0; q + stride < n; q += 2 * stride)
      for (int64_t off = 0; off < numel; off += dt__maxc) {
        int k = (int)(numel - off < dt__maxc ? numel - off : dt__maxc);
        char* dst = (char*)blocks + (size_t)q * nb + (size_t)off * item;
        DT_MPI_CHECK(MPI_Reduce_local(dst + (size_t)stride * nb, dst, k, dt__mpi_type(dtype), mop));
      }
  memcpy(acc, blocks, nb);
  return DT_SUCCESS;
}

/* Elements per message of a point-to-point transfer of n elements (sender and receiver compute
 * the same): at most the max count, and DT__EAGER_NBYTES when the transfer is just above it (up
 * to DT__EAGER_SPLIT_NBYTES), so that it goes as a few eager messages. */
static int64_t dt__piece(int64_t n, size_t item) {
  uint64_t nb = (uint64_t)n * item;
  int64_t p = dt__maxc;
  if (nb > DT__EAGER_NBYTES && nb <= DT__EAGER_SPLIT_NBYTES && (int64_t)(DT__EAGER_NBYTES / item) < p)
    p = (int64_t)(DT__EAGER_NBYTES / item);
  return p;
}

/* Sends / receives n elements in pieces of dt__piece (non-blocking, into r). */
static dt_status_t dt__isend_pieces(const dt_comm_t* c, const void* buf, int64_t n, dt_dtype_t dt,
                                    int peer, int tag, dt_comm_req_t* r) {
  size_t item = dt__itemsize(dt);
  int64_t pc = dt__piece(n, item);
  for (int64_t off = 0; off < n; off += pc) {
    int64_t k = n - off < pc ? n - off : pc;
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
  int64_t pc = dt__piece(n, item);
  for (int64_t off = 0; off < n; off += pc) {
    int64_t k = n - off < pc ? n - off : pc;
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
 * the collective check (DTENSOR_DEBUG=collectives; see comm.h)
 *
 * Each rank sends its record (dt__call_rec_fill) to every peer and receives theirs,
 * point-to-point under DT__TAG_CHECK on the call's own communicator: MPI matches those messages
 * by tag, so they never meet the data traffic (tags 7 and 8, and MPI's collectives, which match
 * apart from point-to-point), and in posting order, which is the order of the collectives. Every
 * rank ends up with the same records and reaches the same verdict. */

/* A call held back by a non-blocking check, with copies of its arrays. */
enum { DT__FN_ALL_GATHER, DT__FN_ALL_REDUCE, DT__FN_REDUCE_SCATTER, DT__FN_ALL_TO_ALL, DT__FN_BOX,
       DT__FN_BROADCAST, DT__FN_SCATTER };
#define DT__CALL_ARRAYS 5
typedef struct {
  int fn; /* DT__FN_* */
  const void* send;
  void* recv; /* broadcast: its buffer */
  int64_t numel;
  dt_dtype_t dtype;
  dt_reduce_op_t op;
  int root, ndim;
  const int64_t* v[DT__CALL_ARRAYS]; /* the call's count arrays, in argument order */
  size_t len[DT__CALL_ARRAYS];
} dt__call_t;

/* What a request keeps for the check (dt_comm_req_t.check). */
typedef struct {
  int state; /* 1: the records' exchange is posted; `call` is posted when it passes */
  dt__call_t call;
  void* tab; /* the records of every rank */
  size_t tab_cap;
  int64_t* blob; /* the call's arrays */
  size_t blob_cap;
} dt__defer_t;

static void dt__defer_free(void* p) {
  dt__defer_t* d = (dt__defer_t*)p;
  if (d == NULL) return;
  dt__free(d->tab);
  dt__free(d->blob);
  dt__free(d);
}

/* Grows *buf (capacity *cap bytes) to at least n bytes; the contents are not kept. */
static dt_status_t dt__grow(void** buf, size_t* cap, size_t n) {
  if (n <= *cap) return DT_SUCCESS;
  void* p = dt__malloc(n);
  if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%zu bytes for the collective check", n);
  dt__free(*buf);
  *buf = p;
  *cap = n;
  return DT_SUCCESS;
}

static const char* dt__ck_opname(int kind) {
  static const char* const names[DT_CALL_COUNT] = {
      "collective check", "all_gather check", "all_reduce check", "reduce_scatter check",
      "all_to_all check", "broadcast check", "scatter check", "split check", "dup check"};
  return kind > 0 && kind < DT_CALL_COUNT ? names[kind] : names[0];
}

/* The record of call a on c (box receive counts and copies of the send counts in c's box_v). */
static dt_status_t dt__ck_desc(dt_comm_t* c, const dt__call_t* a, dt_call_desc_t* d) {
  static const int kinds[] = {[DT__FN_ALL_GATHER] = DT_CALL_ALL_GATHER,
                              [DT__FN_ALL_REDUCE] = DT_CALL_ALL_REDUCE,
                              [DT__FN_REDUCE_SCATTER] = DT_CALL_REDUCE_SCATTER,
                              [DT__FN_ALL_TO_ALL] = DT_CALL_ALL_TO_ALL,
                              [DT__FN_BOX] = DT_CALL_ALL_TO_ALL,
                              [DT__FN_BROADCAST] = DT_CALL_BROADCAST,
                              [DT__FN_SCATTER] = DT_CALL_SCATTER};
  int f = a->fn;
  *d = (dt_call_desc_t){kinds[f], (int)a->dtype, -1, -1, -1, NULL, NULL};
  if (f == DT__FN_ALL_REDUCE || f == DT__FN_REDUCE_SCATTER) d->op = (int)a->op;
  if (f == DT__FN_BROADCAST || f == DT__FN_SCATTER) d->root = a->root;
  if (f == DT__FN_ALL_REDUCE || f == DT__FN_BROADCAST) d->numel = a->numel;
  if (f != DT__FN_ALL_REDUCE && f != DT__FN_BROADCAST) d->counts = a->v[0];
  if (f == DT__FN_ALL_TO_ALL) d->rcounts = a->v[2];
  if (f == DT__FN_BOX) { /* what lands in each box; my own box is left alone */
    dt__mpi_t* m = (dt__mpi_t*)c->context;
    int n = c->size;
    if (m->box_v == NULL) {
      m->box_v = (int64_t*)dt__malloc(sizeof(int64_t) * 2 * (size_t)n);
      if (m->box_v == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "collective check counts");
    }
    for (int q = 0; q < n; q++) {
      m->box_v[q] = a->v[0][q];
      m->box_v[n + q] = q == c->rank ? 0 : dt__box_numel(a->ndim, a->v[4] + q * a->ndim);
    }
    d->counts = m->box_v;
    d->rcounts = m->box_v + n;
  }
  return DT_SUCCESS;
}

/* Posts the exchange of the records in tab (n of rb bytes; mine at slot me) into r. */
static dt_status_t dt__ck_post(MPI_Comm comm, int n, int me, void* tab, size_t rb,
                               dt_comm_req_t* r) {
  for (int q = 0; q < n; q++) {
    if (q == me) continue;
    MPI_Request* h;
    DT_CHECK(dt__req_slot(r, &h));
    DT_MPI_CHECK(MPI_Irecv((char*)tab + (size_t)q * rb, (int)rb, MPI_BYTE, q, DT__TAG_CHECK, comm,
                           h));
    DT_CHECK(dt__req_slot(r, &h));
    DT_MPI_CHECK(MPI_Isend((char*)tab + (size_t)me * rb, (int)rb, MPI_BYTE, q, DT__TAG_CHECK,
                           comm, h));
  }
  return DT_SUCCESS;
}

/* The check of a blocking call: exchange, wait within the deadline, verdict. */
static dt_status_t dt__ck_blocking(MPI_Comm comm, int n, int me, const dt_call_desc_t* d) {
  size_t rb = dt__call_rec_nbytes(n);
  DT_CHECK(dt__grow(&dt__ck_tab, &dt__ck_cap, rb * (size_t)n));
  dt__call_rec_fill((char*)dt__ck_tab + (size_t)me * rb, n, dt__ck_wrank, d);
  dt_comm_req_t* r = &dt__ck_req;
  r->op = dt__ck_opname(d->kind);
  DT_CHECK(dt__ck_post(comm, n, me, dt__ck_tab, rb, r));
  dt_status_t st = dt__wait_handles(comm, r->n, dt__req_arr(r), r->op);
  if (st == DT_ERR_TIMEOUT) { /* still posted: the handles and the records are left to MPI */
    memset(r, 0, sizeof *r);
    dt__ck_tab = NULL;
    dt__ck_cap = 0;
    return st;
  }
  dt__req_done(r);
  DT_CHECK(st);
  return dt__call_verdict(dt__ck_tab, n);
}

/* The check before collective a on c (dt__ck_on, 2 ranks or more). A blocking call (req NULL)
 * is judged now (*go = 1: post it); a non-blocking one posts the exchange into req and keeps the
 * call for dt__ck_resume (*go = 0). The call that follows an all_to_all_box that declined is
 * checked with that box's record, as the ranks that placed their boxes checked it. */
static dt_status_t dt__ck_enter(dt_comm_t* c, dt_comm_req_t* req, const dt__call_t* a, int* go) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  dt_call_desc_t own;
  const dt_call_desc_t* d = &own;
  *go = 1;
  DT_CHECK(dt__ck_desc(c, a, &own));
  if (m->box_pending) {
    m->box_pending = 0;
    if (m->box_epoch == dt__comm_what_epoch()) d = &m->box_desc;
  }
  if (req == NULL) return dt__ck_blocking(m->comm, c->size, c->rank, d);
  dt__defer_t* f = (dt__defer_t*)req->check;
  if (f == NULL) {
    f = (dt__defer_t*)dt__calloc(1, sizeof *f);
    if (f == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "collective check state");
    req->check = f;
  }
  int n = c->size;
  size_t rb = dt__call_rec_nbytes(n), nv = 0;
  for (int i = 0; i < DT__CALL_ARRAYS; i++) nv += a->len[i];
  DT_CHECK(dt__grow(&f->tab, &f->tab_cap, rb * (size_t)n));
  size_t cap = f->blob_cap;
  DT_CHECK(dt__grow((void**)&f->blob, &cap, sizeof(int64_t) * nv));
  f->blob_cap = cap;
  f->call = *a;
  for (int i = 0, at = 0; i < DT__CALL_ARRAYS; at += (int)a->len[i], i++) {
    if (a->len[i] == 0) continue;
    memcpy(f->blob + at, a->v[i], sizeof(int64_t) * a->len[i]);
    f->call.v[i] = f->blob + at;
  }
  dt__call_rec_fill((char*)f->tab + (size_t)c->rank * rb, n, dt__ck_wrank, d);
  req->op = dt__ck_opname(d->kind);
  DT_CHECK(dt__ck_post(m->comm, n, c->rank, f->tab, rb, req));
  f->state = 1;
  *go = 0;
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * collectives */

/* Point-to-point, every block to every peer (in pieces of at most the max count), for every
 * size: as fast as MPI_Allgather here for small and large blocks, and unlike MPI_Iallgather
 * (about 2x slower at 16-64 KiB) equally fast in both forms. */
static dt_status_t dt__all_gather_post(dt_comm_t* c, const void* send, void* recv,
                                       const int64_t* counts, const int64_t* displs,
                                       dt_dtype_t dtype, dt_comm_req_t* req) {
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &local);
  const void* mine = send ? send : (const char*)recv + (size_t)displs[me] * item;
  for (int q = 0; q < n; q++) {
    if (q == me) continue;
    DT_CHECK(dt__irecv_pieces(c, (char*)recv + (size_t)displs[q] * item, counts[q], dtype, q,
                              DT__TAG_FALLBACK, r));
    DT_CHECK(dt__isend_pieces(c, mine, counts[me], dtype, q, DT__TAG_FALLBACK, r));
  }
  if (send && counts[me]) memmove((char*)recv + (size_t)displs[me] * item, send,
                                  (size_t)counts[me] * item);
  r->op = "all_gather";
  return local ? dt__local_end(c, r, "all_gather") : DT_SUCCESS;
}

static dt_status_t dt__all_reduce_post(dt_comm_t* c, const void* send, void* recv, int64_t numel,
                                       dt_dtype_t dtype, dt_reduce_op_t op, dt_comm_req_t* req) {
  MPI_Op mop;
  DT_CHECK(dt__mpi_op(dtype, op, &mop));
  size_t item = dt__itemsize(dtype);
  int n = c->size, me = c->rank;
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  if (req == NULL && !m->in_group && n > 1 &&
      (uint64_t)numel * item * (uint64_t)(n - 1) <= DT__P2P_ALL_REDUCE_NBYTES) {
    /* small and blocking: every buffer to every peer, reduced here in rank order (MPI's
     * non-blocking all-reduce costs 1.5-2 us more per call than this) */
    void* scr;
    size_t nb = (size_t)numel * item;
    DT_CHECK(dt__scratch(nb * (size_t)n, &scr));
    dt_comm_req_t* r = &dt__local;
    for (int q = 0; q < n; q++) {
      if (q == me) continue;
      DT_CHECK(dt__irecv_pieces(c, (char*)scr + q * nb, numel, dtype, q, DT__TAG_FALLBACK, r));
      DT_CHECK(dt__isend_pieces(c, send, numel, dtype, q, DT__TAG_FALLBACK, r));
    }
    DT_CHECK(dt__local_end(c, r, "all_reduce"));
    memcpy((char*)scr + me * nb, send, nb);
    return dt__reduce_ranks(scr, n, numel, dtype, mop, recv);
  }
  for (int64_t off = 0; off < numel; off += dt__maxc) {
    int k = (int)(numel - off < dt__maxc ? numel - off : dt__maxc);
    const void* s = send == recv ? MPI_IN_PLACE : (const char*)send + (size_t)off * item;
    void* d = (char*)recv + (size_t)off * item;
    DT__POST(c, req, "all_reduce",
             MPI_Iallreduce(s, d, k, dt__mpi_type(dtype), mop, dt__c(c), h));
  }
  return DT_SUCCESS;
}

static dt_status_t dt__reduce_scatter_post(dt_comm_t* c, const void* send, void* recv,
                                           const int64_t* counts, dt_dtype_t dtype,
                                           dt_reduce_op_t op, dt_comm_req_t* req) {
  MPI_Op mop;
  DT_CHECK(dt__mpi_op(dtype, op, &mop));
  MPI_Datatype t = dt__mpi_type(dtype);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  int64_t total = 0;
  for (int r = 0; r < n; r++) total += counts[r];
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  if (req == NULL && !m->in_group && n > 1) {
    /* blocking: block q to rank q, my block from every peer reduced here in rank order (as fast
     * as MPI_Reduce_scatter_block on small blocks, up to 2x faster on large ones, and no
     * MPI_Ireduce_scatter overhead) */
    void* scr;
    int64_t my = counts[me], at = 0, at_me = 0;
    size_t nb = (size_t)my * item;
    DT_CHECK(dt__scratch(nb * (size_t)n, &scr));
    dt_comm_req_t* r = &dt__local;
    for (int q = 0; q < n; q++) {
      if (q == me) at_me = at;
      else {
        DT_CHECK(dt__irecv_pieces(c, (char*)scr + q * nb, my, dtype, q, DT__TAG_FALLBACK, r));
        DT_CHECK(dt__isend_pieces(c, (const char*)send + (size_t)at * item, counts[q], dtype, q,
                                  DT__TAG_FALLBACK, r));
      }
      at += counts[q];
    }
    DT_CHECK(dt__local_end(c, r, "reduce_scatter"));
    if (nb) memcpy((char*)scr + me * nb, (const char*)send + (size_t)at_me * item, nb);
    return dt__reduce_ranks(scr, n, my, dtype, mop, recv);
  }
  if (dt__fit(n, counts, NULL) && total <= dt__maxc) {
    int even = 1;
    for (int r = 1; r < n; r++) even &= counts[r] == counts[0];
    if (even) {
      DT__POST(c, req, "reduce_scatter",
               MPI_Ireduce_scatter_block(send, recv, (int)counts[0], t, mop, dt__c(c), h));
      return DT_SUCCESS;
    }
    int* ints;
    DT_CHECK(dt__ints_for(req, (size_t)n, &ints));
    for (int r = 0; r < n; r++) ints[r] = (int)counts[r];
    DT__POST(c, req, "reduce_scatter",
             MPI_Ireduce_scatter(send, recv, ints, t, mop, dt__c(c), h));
    return DT_SUCCESS;
  }
  /* beyond MPI's int: one reduction per destination piece */
  int64_t at = 0;
  for (int r = 0; r < n; r++) {
    for (int64_t off = 0; off < counts[r]; off += dt__maxc) {
      int k = (int)(counts[r] - off < dt__maxc ? counts[r] - off : dt__maxc);
      const char* s = (const char*)send + (size_t)(at + off) * item;
      void* d = r == me ? (char*)recv + (size_t)off * item : NULL;
      DT__POST(c, req, "reduce_scatter", MPI_Ireduce(s, d, k, t, mop, r, dt__c(c), h));
    }
    at += counts[r];
  }
  return DT_SUCCESS;
}

/* General: point-to-point to and from every peer (Open MPI's own linear alltoallv). A rank sees
 * only its own counts, so an MPI_Alltoallv for counts that fit and point-to-point for those that
 * do not could differ between ranks; point-to-point is always the same, and is how NCCL composes
 * it too. */
static dt_status_t dt__all_to_all_post(dt_comm_t* c, const void* send, const int64_t* scounts,
                                       const int64_t* sdispls, void* recv,
                                       const int64_t* rcounts, const int64_t* rdispls,
                                       dt_dtype_t dtype, dt_comm_req_t* req) {
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &local);
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
  r->op = "all_to_all";
  return local ? dt__local_end(c, r, "all_to_all") : DT_SUCCESS;
}

/* Box (off, len) of an array of `shape` as the arguments of MPI_Type_create_subarray, with each
 * dim the box spans whole merged into the dim before it. Returns the dims, 0 when one does not
 * fit an int (then the box is not placed directly). */
static int dt__subarray_dims(int ndim, const int64_t* shape, const int64_t* off, const int64_t* len,
                             int* sz, int* sub, int* st) {
  int k = 0;
  int64_t s = shape[0], l = len[0], o = off[0];
  for (int d = 1; d <= ndim; d++) {
    if (d < ndim && len[d] == shape[d]) {
      s *= shape[d];
      l *= shape[d];
      o *= shape[d];
      continue;
    }
    if (s > INT_MAX) return 0;
    sz[k] = (int)s;
    sub[k] = (int)l;
    st[k++] = (int)o;
    if (d < ndim) {
      s = shape[d];
      l = len[d];
      o = off[d];
    }
  }
  return k;
}

/* 1 when all_to_all_box places these boxes directly: every remote box one message (the sender's
 * pieces), describable by a subarray datatype, and one of them large enough. */
/* $DTENSOR_COMM_MAX_COUNT and $DTENSOR_COMM_BOX_MIN_NBYTES (dt_init, or the first simulated
 * decision). */
static void dt__limits_read(void) {
  dt__maxc = dt__env_int("DTENSOR_COMM_MAX_COUNT", 1, INT_MAX, INT_MAX, "comm",
                         "elements per MPI call, 1 to 2^31 - 1");
  dt__box_min = dt__env_int("DTENSOR_COMM_BOX_MIN_NBYTES", 0, INT64_MAX, DT__BOX_MIN_NBYTES, "comm",
                            "bytes, 0 or more");
}

static int dt__box_fits(const dt_comm_t* c, int ndim, const int64_t* rshape, const int64_t* roffs,
                        const int64_t* rlens, dt_dtype_t dtype) {
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  int sz[DT_MAX_DIMS], sub[DT_MAX_DIMS], st[DT_MAX_DIMS];
  if (ndim < 1 || ndim > DT_MAX_DIMS) return 0;
  int64_t big = 0;
  for (int q = 0; q < n; q++) {
    int64_t k = dt__box_numel(ndim, rlens + q * ndim);
    if (q == me || k == 0) continue;
    if (dt__piece(k, item) < k) return 0;
    if (!dt__subarray_dims(ndim, rshape, roffs + q * ndim, rlens + q * ndim, sz, sub, st)) return 0;
    if (k * (int64_t)item > big) big = k * (int64_t)item;
  }
  return big >= dt__box_min;
}

int dt__comm_mpi_box_fits(const dt_comm_t* c, int ndim, const int64_t* rshape,
                          const int64_t* roffs, const int64_t* rlens, dt_dtype_t dtype) {
  if (dt__box_min < 0) dt__limits_read(); /* a simulated world: MPI never started */
  return dt__box_fits(c, ndim, rshape, roffs, rlens, dtype);
}

/* Posts the boxes dt__box_fits accepted. */
static dt_status_t dt__box_post(dt_comm_t* c, const void* send, const int64_t* scounts,
                                const int64_t* sdispls, void* recv, int ndim,
                                const int64_t* rshape, const int64_t* roffs, const int64_t* rlens,
                                dt_dtype_t dtype, dt_comm_req_t* req) {
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  int sz[DT_MAX_DIMS], sub[DT_MAX_DIMS], st[DT_MAX_DIMS];
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &local);
  for (int q = 0; q < n; q++) {
    if (q == me) continue;
    if (dt__box_numel(ndim, rlens + q * ndim) > 0) {
      MPI_Datatype t;
      MPI_Request* h;
      int k = dt__subarray_dims(ndim, rshape, roffs + q * ndim, rlens + q * ndim, sz, sub, st);
      DT_MPI_CHECK(MPI_Type_create_subarray(k, sz, sub, st, MPI_ORDER_C, dt__mpi_type(dtype), &t));
      DT_MPI_CHECK(MPI_Type_commit(&t));
      dt_status_t s = dt__req_slot(r, &h);
      int rc = s == DT_SUCCESS ? MPI_Irecv(recv, 1, t, q, DT__TAG_FALLBACK, dt__c(c), h) : 0;
      MPI_Type_free(&t); /* released once the receive completes */
      DT_CHECK(s);
      if (rc != MPI_SUCCESS) return dt__mpi_fail(rc, "MPI_Irecv (subarray)");
    }
    DT_CHECK(dt__isend_pieces(c, (const char*)send + (size_t)sdispls[q] * item, scounts[q], dtype,
                              q, DT__TAG_FALLBACK, r));
  }
  r->op = "all_to_all";
  return local ? dt__local_end(c, r, "all_to_all") : DT_SUCCESS;
}

static dt_status_t dt__broadcast_post(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                      int root, dt_comm_req_t* req) {
  size_t item = dt__itemsize(dtype);
  for (int64_t off = 0; off < numel; off += dt__maxc) {
    int k = (int)(numel - off < dt__maxc ? numel - off : dt__maxc);
    void* p = (char*)buf + (size_t)off * item;
    DT__POST(c, req, "broadcast", MPI_Ibcast(p, k, dt__mpi_type(dtype), root, dt__c(c), h));
  }
  return DT_SUCCESS;
}

static dt_status_t dt__scatter_post(dt_comm_t* c, const void* send, const int64_t* counts,
                                    const int64_t* displs, void* recv, dt_dtype_t dtype, int root,
                                    dt_comm_req_t* req) {
  MPI_Datatype t = dt__mpi_type(dtype);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  if (dt__fit(n, counts, displs)) {
    int* ints;
    DT_CHECK(dt__counts_displs(req, n, counts, displs, &ints));
    DT__POST(c, req, "scatter",
             MPI_Iscatterv(send, ints, ints + n, t, recv, ints[me], t, root, dt__c(c), h));
    return DT_SUCCESS;
  }
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &local);
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
  r->op = "scatter";
  return local ? dt__local_end(c, r, "scatter") : DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * the vtable's collectives: the check (when on), then the call */

/* Runs the check of call a (when on); returns from the caller unless the call is to be posted
 * now. */
#define DT__CHECKED(c, req, ...)                      \
  do {                                                \
    if (dt__ck_on && (c)->size > 1) {                 \
      const dt__call_t dt__a = __VA_ARGS__;           \
      int dt__go;                                     \
      DT_CHECK(dt__ck_enter((c), (req), &dt__a, &dt__go)); \
      if (!dt__go) return DT_SUCCESS;                 \
    }                                                 \
  } while (0)

static dt_status_t dt__mpi_all_gather_v(dt_comm_t* c, const void* send, void* recv,
                                        const int64_t* counts, const int64_t* displs,
                                        dt_dtype_t dtype, dt_comm_req_t* req) {
  size_t n = (size_t)c->size;
  DT__CHECKED(c, req, {.fn = DT__FN_ALL_GATHER, .send = send, .recv = recv, .dtype = dtype,
                       .v = {counts, displs}, .len = {n, n}});
  return dt__all_gather_post(c, send, recv, counts, displs, dtype, req);
}

static dt_status_t dt__mpi_all_reduce(dt_comm_t* c, const void* send, void* recv, int64_t numel,
                                      dt_dtype_t dtype, dt_reduce_op_t op, dt_comm_req_t* req) {
  DT__CHECKED(c, req, {.fn = DT__FN_ALL_REDUCE, .send = send, .recv = recv, .numel = numel,
                       .dtype = dtype, .op = op});
  return dt__all_reduce_post(c, send, recv, numel, dtype, op, req);
}

static dt_status_t dt__mpi_reduce_scatter_v(dt_comm_t* c, const void* send, void* recv,
                                            const int64_t* counts, dt_dtype_t dtype,
                                            dt_reduce_op_t op, dt_comm_req_t* req) {
  size_t n = (size_t)c->size;
  DT__CHECKED(c, req, {.fn = DT__FN_REDUCE_SCATTER, .send = send, .recv = recv, .dtype = dtype,
                       .op = op, .v = {counts}, .len = {n}});
  return dt__reduce_scatter_post(c, send, recv, counts, dtype, op, req);
}

static dt_status_t dt__mpi_all_to_all_v(dt_comm_t* c, const void* send, const int64_t* scounts,
                                        const int64_t* sdispls, void* recv,
                                        const int64_t* rcounts, const int64_t* rdispls,
                                        dt_dtype_t dtype, dt_comm_req_t* req) {
  size_t n = (size_t)c->size;
  DT__CHECKED(c, req, {.fn = DT__FN_ALL_TO_ALL, .send = send, .recv = recv, .dtype = dtype,
                       .v = {scounts, sdispls, rcounts, rdispls}, .len = {n, n, n, n}});
  return dt__all_to_all_post(c, send, scounts, sdispls, recv, rcounts, rdispls, dtype, req);
}

/* Whether the boxes are placed directly may differ between ranks (the caller then falls back to
 * another call): the check runs on the box's record either way, here when placed, else at the
 * fallback call (dt__ck_enter). */
static dt_status_t dt__mpi_all_to_all_box(dt_comm_t* c, const void* send, const int64_t* scounts,
                                          const int64_t* sdispls, void* recv, int ndim,
                                          const int64_t* rshape, const int64_t* roffs,
                                          const int64_t* rlens, dt_dtype_t dtype,
                                          dt_comm_req_t* req, int* placed) {
  int fits = dt__box_fits(c, ndim, rshape, roffs, rlens, dtype);
  *placed = 0;
  if (dt__ck_on && c->size > 1) {
    dt__mpi_t* m = (dt__mpi_t*)c->context;
    size_t n = (size_t)c->size, nd = ndim > 0 ? (size_t)ndim : 0;
    const dt__call_t a = {.fn = DT__FN_BOX, .send = send, .recv = recv, .dtype = dtype,
                          .ndim = ndim, .v = {scounts, sdispls, rshape, roffs, rlens},
                          .len = {n, n, nd, n * nd, n * nd}};
    m->box_pending = 0;
    if (!fits) {
      DT_CHECK(dt__ck_desc(c, &a, &m->box_desc));
      m->box_pending = 1;
      m->box_epoch = dt__comm_what_epoch();
      return DT_SUCCESS;
    }
    int go;
    *placed = 1;
    DT_CHECK(dt__ck_enter(c, req, &a, &go));
    if (!go) return DT_SUCCESS;
  }
  if (!fits) return DT_SUCCESS;
  *placed = 1;
  return dt__box_post(c, send, scounts, sdispls, recv, ndim, rshape, roffs, rlens, dtype, req);
}

static dt_status_t dt__mpi_broadcast(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                     int root, dt_comm_req_t* req) {
  DT__CHECKED(c, req, {.fn = DT__FN_BROADCAST, .recv = buf, .numel = numel, .dtype = dtype,
                       .root = root});
  return dt__broadcast_post(c, buf, numel, dtype, root, req);
}

static dt_status_t dt__mpi_scatter_v(dt_comm_t* c, const void* send, const int64_t* counts,
                                     const int64_t* displs, void* recv, dt_dtype_t dtype, int root,
                                     dt_comm_req_t* req) {
  size_t n = (size_t)c->size;
  DT__CHECKED(c, req, {.fn = DT__FN_SCATTER, .send = send, .recv = recv, .dtype = dtype,
                       .root = root, .v = {counts, displs}, .len = {n, n}});
  return dt__scatter_post(c, send, counts, displs, recv, dtype, root, req);
}

/* A non-blocking check's exchange has completed: the verdict, then the held call posted into the
 * same request. */
static dt_status_t dt__ck_resume(dt_comm_t* c, dt_comm_req_t* req) {
  dt__defer_t* f = (dt__defer_t*)req->check;
  const dt__call_t* a = &f->call;
  f->state = 0;
  DT_CHECK(dt__call_verdict(f->tab, c->size));
  switch (a->fn) {
    case DT__FN_ALL_GATHER:
      return dt__all_gather_post(c, a->send, a->recv, a->v[0], a->v[1], a->dtype, req);
    case DT__FN_ALL_REDUCE:
      return dt__all_reduce_post(c, a->send, a->recv, a->numel, a->dtype, a->op, req);
    case DT__FN_REDUCE_SCATTER:
      return dt__reduce_scatter_post(c, a->send, a->recv, a->v[0], a->dtype, a->op, req);
    case DT__FN_ALL_TO_ALL:
      return dt__all_to_all_post(c, a->send, a->v[0], a->v[1], a->recv, a->v[2], a->v[3],
                                 a->dtype, req);
    case DT__FN_BOX:
      return dt__box_post(c, a->send, a->v[0], a->v[1], a->recv, a->ndim, a->v[2], a->v[3],
                          a->v[4], a->dtype, req);
    case DT__FN_BROADCAST:
      return dt__broadcast_post(c, a->recv, a->numel, a->dtype, a->root, req);
    case DT__FN_SCATTER:
      return dt__scatter_post(c, a->send, a->v[0], a->v[1], a->recv, a->dtype, a->root, req);
    default: return DT_FAIL(DT_ERR_INTERNAL, "held collective %d", a->fn);
  }
}

static dt_status_t dt__mpi_send(dt_comm_t* c, const void* buf, int64_t numel, dt_dtype_t dtype,
                                int peer, dt_comm_req_t* req) {
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &local);
  DT_CHECK(dt__isend_pieces(c, buf, numel, dtype, peer, DT__TAG_P2P, r));
  r->op = "send";
  return local ? dt__local_end(c, r, "send") : DT_SUCCESS;
}

static dt_status_t dt__mpi_recv(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                int peer, dt_comm_req_t* req) {
  int local;
  dt_comm_req_t* r = dt__post_req(c, req, &local);
  DT_CHECK(dt__irecv_pieces(c, buf, numel, dtype, peer, DT__TAG_P2P, r));
  r->op = "recv";
  return local ? dt__local_end(c, r, "recv") : DT_SUCCESS;
}

static dt_status_t dt__mpi_group_start(dt_comm_t* c) {
  ((dt__mpi_t*)c->context)->in_group++;
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_group_end(dt_comm_t* c) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  if (m->in_group == 0) return DT_FAIL(DT_ERR_INTERNAL, "group_end without group_start");
  if (--m->in_group > 0) return DT_SUCCESS;
  m->group.op = "group of send/recv";
  return dt__waitall(c, &m->group);
}

static dt_status_t dt__mpi_wait(dt_comm_t* c, dt_comm_req_t* req) {
  const dt__defer_t* f = (const dt__defer_t*)req->check;
  if (f != NULL && f->state) { /* the check first, then the call it held back */
    DT_CHECK(dt__waitall(c, req));
    DT_CHECK(dt__ck_resume(c, req));
  }
  return dt__waitall(c, req);
}

static dt_status_t dt__mpi_test(dt_comm_t* c, dt_comm_req_t* req, int* done) {
  const dt__defer_t* f = (const dt__defer_t*)req->check;
  if (f != NULL && f->state) { /* the check first: when it has passed, the held call is posted */
    int flag = 0;
    int rc = MPI_Testall(req->n, dt__req_arr(req), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      ((dt__defer_t*)req->check)->state = 0;
      dt__req_done(req);
      *done = 1;
      return dt__mpi_fail(rc, "MPI_Testall");
    }
    if (!flag) {
      *done = 0;
      return DT_SUCCESS;
    }
    dt__req_done(req);
    dt_status_t st = dt__ck_resume(c, req);
    if (st != DT_SUCCESS) {
      *done = 1;
      return st;
    }
  }
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
  if (dt__ck_on) { /* the colors and keys differ by design: only the kind is checked */
    int n = 0, me = 0;
    DT_MPI_CHECK(MPI_Comm_size(p, &n));
    DT_MPI_CHECK(MPI_Comm_rank(p, &me));
    const dt_call_desc_t d = {DT_CALL_SPLIT, -1, -1, -1, -1, NULL, NULL};
    if (n > 1) DT_CHECK(dt__ck_blocking(p, n, me, &d));
  }
  /* MPI_Comm_split cannot be bounded: every rank first arrives at a bounded barrier */
  MPI_Request h = MPI_REQUEST_NULL;
  DT_MPI_CHECK(MPI_Ibarrier(p, &h));
  DT_CHECK(dt__wait_handles(p, 1, &h, "barrier before MPI_Comm_split"));
  DT_MPI_CHECK(MPI_Comm_split(p, color < 0 ? MPI_UNDEFINED : color, key, &nc));
  return dt__comm_wrap(nc, out);
}

/* MPI_Comm_dup with the deadline (MPI_Comm_idup). */
static dt_status_t dt__dup_bounded(MPI_Comm c, MPI_Comm* out) {
  MPI_Request h = MPI_REQUEST_NULL;
  *out = MPI_COMM_NULL;
  DT_MPI_CHECK(MPI_Comm_idup(c, out, &h));
  return dt__wait_handles(c, 1, &h, "communicator duplicate (MPI_Comm_idup)");
}

static dt_status_t dt__mpi_dup(const dt_comm_t* c, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  MPI_Comm nc = MPI_COMM_NULL;
  if (dt__ck_on && c->size > 1) {
    const dt_call_desc_t d = {DT_CALL_DUP, -1, -1, -1, -1, NULL, NULL};
    DT_CHECK(dt__ck_blocking(dt__c(c), c->size, c->rank, &d));
  }
  DT_CHECK(dt__dup_bounded(dt__c(c), &nc));
  return dt__comm_wrap(nc, out);
}

static void dt__mpi_destroy(dt_comm_t* c) {
  dt__mpi_t* m = (dt__mpi_t*)c->context;
  if (m == NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  dt__req_free(&m->group);
  dt__free(m->box_v);
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
    .all_to_all_box = dt__mpi_all_to_all_box,
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

void dt__comm_req_free(dt_comm_req_t* req) { dt__req_free(req); }

const void* dt__comm_mpi_native(const dt_comm_t* c) {
  if (c == NULL || c->iface != &dt__mpi_iface || c->context == NULL) return NULL;
  return &((const dt__mpi_t*)c->context)->comm;
}

void dt__comm_release(dt_comm_t* c) {
  if (c != NULL && c->iface != NULL && c->iface->destroy != NULL) c->iface->destroy(c);
  if (c != NULL) memset(c, 0, sizeof *c);
}

const dt_comm_t* dt__comm_world(void) { return dt__world_comm.iface ? &dt__world_comm : NULL; }

int dt__comm_mpi_serialized(void) { return dt__mpi_serialized; }

/* ---------------------------------------------------------------------------------------------
 * setup */

dt_status_t dt__comm_mpi_init(int* argc, char*** argv, int* we_initialized) {
  int inited = 0, finalized = 0;
  *we_initialized = 0;
  DT_CHECK(dt__timeout_from_env()); /* before MPI starts: a bad value fails dt_init cleanly */
  MPI_Finalized(&finalized);
  if (finalized)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "MPI is already finalized; dt_init cannot start it again");
  DT_MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) {
    int provided = 0;
    /* SERIALIZED: any thread may call the library, one call at a time (a trainer's worker) */
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return DT_FAIL(DT_ERR_MPI, "MPI_Init_thread failed (code %d)", rc);
    *we_initialized = 1;
  }
  int level = MPI_THREAD_SINGLE; /* what MPI provides, ours or the host's */
  DT_MPI_CHECK(MPI_Query_thread(&level));
  dt__mpi_serialized = level >= MPI_THREAD_SERIALIZED;
  if (dt__world == MPI_COMM_NULL) {
    DT_CHECK(dt__dup_bounded(MPI_COMM_WORLD, &dt__world));
    DT_MPI_CHECK(MPI_Comm_set_errhandler(dt__world, MPI_ERRORS_RETURN));
    MPI_Comm wc;
    DT_CHECK(dt__dup_bounded(dt__world, &wc));
    DT_CHECK(dt__comm_wrap(wc, &dt__world_comm));
  }
  if (!dt__user_ops_ready) {
    MPI_User_function* fns[3][3] = {{dt__bf16_sum, dt__bf16_max, dt__bf16_min},
                                    {dt__f16_sum, dt__f16_max, dt__f16_min},
                                    {NULL, dt__f32_max, dt__f32_min}};
    for (int d = 0; d < 3; d++)
      for (int k = 0; k < 3; k++) {
        dt__user_ops[d][k] = MPI_OP_NULL;
        if (fns[d][k] != NULL) DT_MPI_CHECK(MPI_Op_create(fns[d][k], 1, &dt__user_ops[d][k]));
      }
    dt__user_ops_ready = 1;
  }
  dt__ck_on = (dt__debug_mask() & DT_DBG_COLLECTIVES) != 0;
  DT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &dt__ck_wrank));
  dt__limits_read();
  return DT_SUCCESS;
}

dt_status_t dt__comm_mpi_finalize(int we_initialized) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  dt__free(dt__ints);
  dt__ints = NULL;
  dt__ints_cap = 0;
  dt__req_free(&dt__local);
  dt__free(dt__scr);
  dt__scr = NULL;
  dt__scr_cap = 0;
  dt__req_free(&dt__ck_req);
  dt__free(dt__ck_tab);
  dt__ck_tab = NULL;
  dt__ck_cap = 0;
  if (finalized) return DT_SUCCESS;
  dt__comm_release(&dt__world_comm);
  if (dt__user_ops_ready) {
    for (int d = 0; d < 3; d++)
      for (int k = 0; k < 3; k++)
        if (dt__user_ops[d][k] != MPI_OP_NULL) MPI_Op_free(&dt__user_ops[d][k]);
    dt__user_ops_ready = 0;
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

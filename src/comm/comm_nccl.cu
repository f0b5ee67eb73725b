/* comm_nccl.cu - the GPU data plane: dt_comm_i over NCCL, for tensors in a CUDA backend's memory.
 *
 * One source, two builds, like src/backend/cuda.cu: nvcc makes the NCCL communicator of the
 * "cuda" backend (NCCL loaded at run time with dlopen, so the library does not depend on it:
 * $DTENSOR_NCCL names the file, else libnccl.so.2, libnccl.so); g++ with DT_SIMT_EMULATE makes
 * the one of "cuda-emu", where every NCCL call comes from nccl_emu.h (one MPI call each, on host
 * memory), so that this file runs in CI on machines without a GPU.
 *
 * Bootstrap and the two planes. Host values (agreed errors, counts, shapes) never travel here:
 * they go over the mesh's MPI communicator (the control plane). A backend's NCCL world is made
 * once, collectively over the MPI world: rank 0's ncclGetUniqueId is broadcast over it and
 * every rank calls ncclCommInitRank; every other NCCL communicator is an ncclCommSplit of it
 * (split, dup), created once by the mesh and cached there.
 *
 * Streams. Each communicator runs its calls on a stream of its own (the comm stream), which
 * first waits on an event recorded on the backend's compute stream at the call (so it sees
 * every kernel issued before), and records a completion event after it. A request holds that
 * event; wait polls it with the deadline (the host blocks only in wait; between post and wait
 * the compute stream runs on), test queries it. A blocking call (no request) is posted and
 * waited at once. The buffers belong to the communicator until then, as comm.h says; memory is
 * freed only after its collective has completed, so stream-ordered frees stay safe.
 *
 * Forms, chosen only from values every rank passes alike (the counts): all-gather of equal
 * blocks is ncclAllGather (into scratch, then copied into place, where this rank's blocks are not
 * back to back), else one ncclBroadcast per root in a group; reduce-scatter with equal counts is
 * ncclReduceScatter, else one ncclReduce per root in a group; all-reduce is ncclAllReduce (sum,
 * max, min; avg is the caller's division as on MPI); all-to-all and scatter are grouped ncclSend
 * / ncclRecv (this rank's own block a device copy on the comm stream); broadcast is
 * ncclBroadcast; all_to_all_box declines (the executor unpacks). Point-to-point calls outside a
 * group are issued at once; inside one they wait in the communicator and go out together at
 * group_end as one NCCL group (comm.h: calls that depend on each other must be grouped, since
 * NCCL's send and recv kernels on one stream would otherwise wait on each other).
 *
 * Deadlines and errors: a wait polls the event and ncclCommGetAsyncError; an asynchronous error
 * aborts the communicator (ncclCommAbort) and returns DT_ERR_NCCL with NCCL's text; past the
 * deadline the library's one-line message is printed (dt__comm_timeout), the communicator is
 * aborted, and the job ends (dt__comm_abort_job) or DT_ERR_TIMEOUT returns, as on MPI. A
 * communicator once aborted fails every later call with DT_ERR_NCCL.
 */
#include "backend/simt.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DT_SIMT_EMULATE
#include "backend/cuda_rt_emu.h"
#endif

extern "C" {
#include "backend/cuda.h"
#include "comm/comm.h"
}

#ifdef DT_SIMT_EMULATE
#include "comm/nccl_emu.h"
#else
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

/* NCCL, loaded on first use (see the top of the file). */
#define DT__NCCL_FUNCS(X)                                                                       \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommSplit) X(ncclCommDestroy)  \
  X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclGetErrorString) X(ncclAllGather)              \
  X(ncclAllReduce) X(ncclReduceScatter) X(ncclBroadcast) X(ncclReduce) X(ncclSend) X(ncclRecv)  \
  X(ncclGroupStart) X(ncclGroupEnd) X(ncclCommCount) X(ncclCommUserRank)
static pthread_mutex_t dt__nl_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int tried;
  void* handle;
  char why[768];
#define DT__NL_PTR(f) decltype(&::f) f;
  DT__NCCL_FUNCS(DT__NL_PTR)
#undef DT__NL_PTR
} dt__nl;

static dt_status_t dt__nccl_load(void) {
  pthread_mutex_lock(&dt__nl_mu);
  if (!dt__nl.tried) {
    dt__nl.tried = 1;
    const char* names[3] = {getenv("DTENSOR_NCCL"), "libnccl.so.2", "libnccl.so"};
    dt__nl.handle = dt__dlopen_first(names, 3, dt__nl.why, sizeof dt__nl.why);
    int ok = dt__nl.handle != NULL;
#define DT__NL_SYM(f)                                                              \
  if (ok && (dt__nl.f = (decltype(dt__nl.f))dlsym(dt__nl.handle, #f)) == NULL) {   \
    snprintf(dt__nl.why, sizeof dt__nl.why, "the loaded NCCL has no %s", #f);      \
    ok = 0;                                                                        \
  }
    DT__NCCL_FUNCS(DT__NL_SYM)
#undef DT__NL_SYM
    if (!ok && dt__nl.handle != NULL) {
      dlclose(dt__nl.handle);
      dt__nl.handle = NULL;
    }
  }
  dt_status_t st = dt__nl.handle != NULL ? DT_SUCCESS
                   : DT_FAIL(DT_ERR_NCCL, "cannot load NCCL (set DTENSOR_NCCL to the library "
                             "file, or add its folder to LD_LIBRARY_PATH): %s", dt__nl.why);
  pthread_mutex_unlock(&dt__nl_mu);
  return st;
}

#define ncclGetVersion dt__nl.ncclGetVersion
#define ncclGetUniqueId dt__nl.ncclGetUniqueId
#define ncclCommInitRank dt__nl.ncclCommInitRank
#define ncclCommSplit dt__nl.ncclCommSplit
#define ncclCommDestroy dt__nl.ncclCommDestroy
#define ncclCommAbort dt__nl.ncclCommAbort
#define ncclCommGetAsyncError dt__nl.ncclCommGetAsyncError
#define ncclGetErrorString dt__nl.ncclGetErrorString
#define ncclAllGather dt__nl.ncclAllGather
#define ncclAllReduce dt__nl.ncclAllReduce
#define ncclReduceScatter dt__nl.ncclReduceScatter
#define ncclBroadcast dt__nl.ncclBroadcast
#define ncclReduce dt__nl.ncclReduce
#define ncclSend dt__nl.ncclSend
#define ncclRecv dt__nl.ncclRecv
#define ncclGroupStart dt__nl.ncclGroupStart
#define ncclGroupEnd dt__nl.ncclGroupEnd
#define ncclCommCount dt__nl.ncclCommCount
#define ncclCommUserRank dt__nl.ncclCommUserRank
#endif

#ifdef DT_SIMT_EMULATE
static dt_status_t dt__nccl_load(void) { return DT_SUCCESS; }
#define DT__NCCL_WHAT "NCCL (emulated over MPI)"
#else
#define DT__NCCL_WHAT "NCCL"
#endif

/* the pacing of a wait (dt__poll_t): spin, then yield, then nap; the asynchronous error is asked
 * at the clock reads */
#define DT__NC_SPIN_POLLS 2048u
#define DT__NC_NAP_AFTER_S 0.05
#define DT__NC_NAP_NS 200000L

#ifndef DT_SIMT_EMULATE
/* Test hook ($DTENSOR_NCCL_STALL_MS, read when a communicator is made; GPUs only): before each
 * operation the comm stream runs a kernel that spins that many milliseconds, so that one rank
 * (even np 1) can stand for a peer that stopped inside a collective and the deadline path runs.
 * Like NCCL's own kernels it stops when the communicator is aborted (*stop, host memory mapped
 * for the device, set by dt__nc_abort): ncclCommAbort waits for the device's work, so a spin that
 * ignored the abort would hold the timeout's return until it ended (measured on an H200: 4.0 s
 * for a 1 s deadline before this flag). */
__global__ void dt__nc_spin_kernel(unsigned long long ns, const volatile int* stop) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns && *stop == 0);
}
#endif

/* a point-to-point call waiting for the next flush */
typedef struct {
  int is_send;
  void* buf;
  size_t count;
  ncclDataType_t type;
  int peer;
  dt_comm_req_t* req; /* NULL: completed by the flush itself */
  int fresh;          /* the flush gave req its event */
} dt__nc_p2p_t;

typedef struct {
  ncclComm_t nc;        /* NULL once aborted */
  cudaStream_t stream;  /* the comm stream */
  dt_backend_t b;       /* whose compute stream every call follows */
  int world_rank;       /* for the timeout message */
  int group;            /* group_start depth */
  dt__nc_p2p_t* p2p;    /* calls waiting for the flush */
  int n_p2p, cap_p2p;
  cudaEvent_t* pool;    /* completion events for reuse */
  int n_pool, cap_pool;
  unsigned long long stall_ns; /* the test hook's spin before each operation (0: none) */
  volatile int* stall_stop;    /* the hook's stop flag (mapped host memory; NULL: no hook) */
} dt__nc_t;

static dt__nc_t* dt__nc(const dt_comm_t* c) { return (dt__nc_t*)c->context; }

/* Makes backend b's device the calling thread's current one (NCCL and the comm stream belong to
 * it; other code may have changed the device since). */
static void dt__nc_enter(dt_backend_t b) {
#ifdef DT_SIMT_EMULATE
  (void)b;
#else
  int cur = -1;
  if (b->ordinal >= 0 && (cudaGetDevice(&cur) != cudaSuccess || cur != b->ordinal))
    (void)cudaSetDevice(b->ordinal);
#endif
}

static dt_status_t dt__nc_fail(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return DT_SUCCESS;
  return DT_FAIL(DT_ERR_NCCL, "%s: %s (%d)", what, ncclGetErrorString(r), (int)r);
}
#define DT__NC(call, what) DT_CHECK(dt__nc_fail((call), (what)))

static dt_status_t dt__nc_cuda(cudaError_t e, const char* what) {
  return DT_CUDA_NAME(status)((int)e, what);
}

static dt_status_t dt__nc_live(const dt_comm_t* c) {
  if (c->context == NULL || dt__nc(c)->nc == NULL)
    return DT_FAIL(DT_ERR_NCCL, "this NCCL communicator was aborted after an error or a timeout "
                   "(see the first message)");
  return DT_SUCCESS;
}

static dt_status_t dt__nc_type(dt_dtype_t d, ncclDataType_t* out) {
  switch (d) {
    case DT_F32: *out = ncclFloat32; return DT_SUCCESS;
    case DT_BF16: *out = ncclBfloat16; return DT_SUCCESS;
    case DT_F16: *out = ncclFloat16; return DT_SUCCESS;
    case DT_I32: *out = ncclInt32; return DT_SUCCESS;
    case DT_I64: *out = ncclInt64; return DT_SUCCESS;
    default: return DT_FAIL(DT_ERR_INVALID_ARG, "dtype %d has no NCCL equivalent", (int)d);
  }
}

static dt_status_t dt__nc_op(dt_reduce_op_t op, ncclRedOp_t* out) {
  switch (op) {
    case DT_REDUCE_SUM: *out = ncclSum; return DT_SUCCESS;
    case DT_REDUCE_MAX: *out = ncclMax; return DT_SUCCESS;
    case DT_REDUCE_MIN: *out = ncclMin; return DT_SUCCESS;
    default: return DT_FAIL(DT_ERR_INTERNAL, "reduce op %d is not a communicator op", (int)op);
  }
}

static dt_status_t dt__nc_event(dt__nc_t* x, cudaEvent_t* out) {
  if (x->n_pool > 0) {
    *out = x->pool[--x->n_pool];
    return DT_SUCCESS;
  }
  return dt__nc_cuda(cudaEventCreateWithFlags(out, cudaEventDisableTiming),
                     "NCCL comm: cudaEventCreateWithFlags");
}

static void dt__nc_event_put(dt__nc_t* x, cudaEvent_t e) {
  if (e == NULL) return;
  if (x->n_pool == x->cap_pool) {
    int cap = x->cap_pool ? 2 * x->cap_pool : 8;
    cudaEvent_t* p = (cudaEvent_t*)dt__realloc(x->pool, (size_t)cap * sizeof *p);
    if (p == NULL) {
      (void)cudaEventDestroy(e);
      return;
    }
    x->pool = p;
    x->cap_pool = cap;
  }
  x->pool[x->n_pool++] = e;
}

/* The event a request holds (NULL while its point-to-point call waits for the flush). */
static cudaEvent_t dt__req_event(const dt_comm_req_t* r) {
  return (cudaEvent_t)(uintptr_t)r->inline_h[0];
}

static void dt__nc_event_put(dt__nc_t* x, cudaEvent_t e);
static void dt__nc_scratch_free(dt__nc_t* x, dt_comm_req_t* r);

/* Completes a request's bookkeeping: its event back to the pool, its scratch freed (after the
 * operation has finished), nothing posted any more. */
static void dt__nc_req_reset(dt__nc_t* x, dt_comm_req_t* r) {
  dt__nc_event_put(x, dt__req_event(r));
  dt__nc_scratch_free(x, r);
  r->inline_h[0] = 0;
  r->n = 0;
}

/* Aborts the communicator after an asynchronous error or a timeout: NCCL's kernels stop, and
 * every later call fails. */
static void dt__nc_abort(dt_comm_t* c) {
  dt__nc_t* x = dt__nc(c);
  if (x->stall_stop != NULL) *x->stall_stop = 1; /* the test hook's spin ends like NCCL's kernels */
  if (x->nc != NULL) (void)ncclCommAbort(x->nc);
  x->nc = NULL;
}

/* Completes event e of `op` within the deadline (the top of the file). */
static dt_status_t dt__nc_wait_event(dt_comm_t* c, cudaEvent_t e, const char* op) {
  dt__nc_t* x = dt__nc(c);
  dt__poll_t p;
  dt__poll_init(&p, DT__NC_SPIN_POLLS, DT__NC_NAP_AFTER_S, DT__NC_NAP_NS);
  for (;;) {
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return DT_SUCCESS;
    if (q != cudaErrorNotReady) return dt__nc_cuda(q, "NCCL comm: cudaEventQuery");
    double waited;
    const int late = dt__poll_next(&p, &waited);
    ncclResult_t ae = ncclSuccess;
    if (dt__poll_clock_read(&p) && x->nc != NULL &&
        ncclCommGetAsyncError(x->nc, &ae) == ncclSuccess && ae != ncclSuccess &&
        ae != ncclInProgress) {
      dt_status_t st = DT_FAIL(DT_ERR_NCCL, "%s on a communicator of %d ranks: NCCL reported "
                               "%s (%d); the communicator was aborted", op, c->size,
                               ncclGetErrorString(ae), (int)ae);
      dt__nc_abort(c);
      return st;
    }
    if (late) {
      dt_status_t st = DT_ERR_TIMEOUT;
      int ret = dt__comm_timeout(op, x->world_rank, c->size, waited, &st);
      dt__nc_abort(c);
      if (ret) return st;
      dt__comm_abort_job((int)DT_ERR_TIMEOUT);
      return st; /* not reached */
    }
  }
}

/* The comm stream waits for what the compute stream has been given so far. */
static dt_status_t dt__nc_begin(dt_comm_t* c) {
  DT_CHECK(dt__nc_live(c));
  dt__nc_t* x = dt__nc(c);
  dt__nc_enter(x->b);
  void* ev = NULL;
  DT_CHECK(x->b->iface->event_record(x->b, &ev));
  dt_status_t st = dt__nc_cuda(cudaStreamWaitEvent(x->stream, (cudaEvent_t)ev, 0),
                               "NCCL comm: cudaStreamWaitEvent");
  x->b->iface->event_free(x->b, ev);
#ifndef DT_SIMT_EMULATE
  if (st == DT_SUCCESS && x->stall_ns > 0 && x->stall_stop != NULL) {
    dt__nc_spin_kernel<<<1, 1, 0, x->stream>>>(x->stall_ns, x->stall_stop);
    st = dt__nc_cuda(cudaGetLastError(), "NCCL comm: the stall hook's launch");
  }
#endif
  return st;
}

/* After the calls of one operation: a blocking one (req NULL) is completed here, a non-blocking
 * one records its request's event (again, when the request already holds one: the stream's
 * order makes the later point cover the earlier calls). */
static dt_status_t dt__nc_end(dt_comm_t* c, dt_comm_req_t* req, const char* op) {
  dt__nc_t* x = dt__nc(c);
  if (req == NULL) {
    cudaEvent_t e;
    DT_CHECK(dt__nc_event(x, &e));
    dt_status_t st = dt__nc_cuda(cudaEventRecord(e, x->stream), "NCCL comm: cudaEventRecord");
    if (st == DT_SUCCESS) st = dt__nc_wait_event(c, e, op);
    dt__nc_event_put(x, e);
    return st;
  }
  cudaEvent_t e = req->n ? dt__req_event(req) : NULL;
  if (e == NULL) DT_CHECK(dt__nc_event(x, &e));
  req->inline_h[0] = (uint64_t)(uintptr_t)e;
  req->n = 1;
  req->op = op;
  return dt__nc_cuda(cudaEventRecord(e, x->stream), "NCCL comm: cudaEventRecord");
}

static dt_status_t dt__nc_wait(dt_comm_t* c, dt_comm_req_t* req);

/* dt__nc_end for an operation that used scratch `scr` (nbytes of the backend's memory) on the comm
 * stream: freed once the operation has completed (at once for a blocking call; at the request's
 * completion otherwise, the request holding it). */
static dt_status_t dt__nc_end_scratch(dt_comm_t* c, dt_comm_req_t* req, const char* op, void* scr,
                                      size_t nbytes) {
  dt__nc_t* x = dt__nc(c);
  if (req != NULL && req->inline_h[1] != 0) { /* a request holds one scratch block at a time */
    DT_CHECK(dt__nc_wait(c, req));
  }
  dt_status_t st = dt__nc_end(c, req, op);
  if (req == NULL || st != DT_SUCCESS) {
    if (st != DT_ERR_TIMEOUT) dt__backend_free(x->b, scr, nbytes); /* timed out: still in use */
    return st;
  }
  req->inline_h[1] = (uint64_t)(uintptr_t)scr;
  req->inline_h[2] = (uint64_t)nbytes;
  return DT_SUCCESS;
}

static void dt__nc_scratch_free(dt__nc_t* x, dt_comm_req_t* r) {
  if (r->inline_h[1] != 0) dt__backend_free(x->b, (void*)(uintptr_t)r->inline_h[1], (size_t)r->inline_h[2]);
  r->inline_h[1] = r->inline_h[2] = 0;
}

/* Issues the point-to-point calls waiting in the communicator as one NCCL group; then the
 * requests among them record their events and the calls without one are completed here. */
static dt_status_t dt__nc_flush(dt_comm_t* c) {
  dt__nc_t* x = dt__nc(c);
  if (x->n_p2p == 0) return DT_SUCCESS;
  int n = x->n_p2p, blocking = 0;
  x->n_p2p = 0;
  /* every request's event before anything is issued: past ncclGroupEnd nothing may fail half
   * way (a request without its event would look never issued while NCCL still uses its buffer) */
  for (int i = 0; i < n; i++) {
    dt_comm_req_t* q = x->p2p[i].req;
    if (q != NULL && dt__req_event(q) == NULL) {
      cudaEvent_t e = NULL;
      dt_status_t st = dt__nc_event(x, &e);
      if (st != DT_SUCCESS) { /* nothing of this flush was issued: the events just taken back
                               * (the calls' requests then report that at their wait) */
        for (int j = 0; j < i; j++) {
          dt_comm_req_t* r = x->p2p[j].req;
          if (r != NULL && x->p2p[j].fresh) {
            dt__nc_event_put(x, dt__req_event(r));
            r->inline_h[0] = 0;
          }
        }
        return st;
      }
      q->inline_h[0] = (uint64_t)(uintptr_t)e;
      x->p2p[i].fresh = 1;
    }
  }
  DT_CHECK(dt__nc_begin(c));
  DT__NC(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < n && r == ncclSuccess; i++) {
    const dt__nc_p2p_t* p = &x->p2p[i];
    r = p->is_send ? ncclSend(p->buf, p->count, p->type, p->peer, x->nc, x->stream)
                   : ncclRecv(p->buf, p->count, p->type, p->peer, x->nc, x->stream);
  }
  ncclResult_t e = ncclGroupEnd();
  DT__NC(r, "ncclSend / ncclRecv");
  DT__NC(e, "ncclGroupEnd");
  for (int i = 0; i < n; i++) {
    dt_comm_req_t* q = x->p2p[i].req;
    if (q == NULL) blocking = 1;
    else DT_CHECK(dt__nc_end(c, q, x->p2p[i].is_send ? "send" : "recv"));
  }
  return blocking ? dt__nc_end(c, NULL, "send / recv") : DT_SUCCESS;
}

static dt_status_t dt__nc_p2p(dt_comm_t* c, int is_send, void* buf, int64_t numel,
                              dt_dtype_t dtype, int peer, dt_comm_req_t* req) {
  DT_CHECK(dt__nc_live(c));
  dt__nc_t* x = dt__nc(c);
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_type(dtype, &t));
  if (peer < 0 || peer >= c->size || numel < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s of %lld elements with peer %d on %d ranks",
                   is_send ? "send" : "recv", (long long)numel, peer, c->size);
  if (x->n_p2p == x->cap_p2p) {
    int cap = x->cap_p2p ? 2 * x->cap_p2p : 16;
    dt__nc_p2p_t* p = (dt__nc_p2p_t*)dt__realloc(x->p2p, (size_t)cap * sizeof *p);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "NCCL comm: pending point-to-point calls");
    x->p2p = p;
    x->cap_p2p = cap;
  }
  if (req != NULL) { /* pending: its event comes with the flush */
    if (req->n == 0) req->inline_h[0] = 0;
    req->n = 1;
    req->op = is_send ? "send" : "recv";
  }
  x->p2p[x->n_p2p++] = dt__nc_p2p_t{is_send, buf, (size_t)numel, t, peer, req, 0};
  /* outside a group a call is issued at once (it "only starts" with a request, as on MPI); the
   * calls of a group go together at group_end */
  if (x->group == 0) return dt__nc_flush(c);
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * the vtable */

static dt_status_t dt__nc_send(dt_comm_t* c, const void* buf, int64_t numel, dt_dtype_t dtype,
                               int peer, dt_comm_req_t* req) {
  return dt__nc_p2p(c, 1, (void*)buf, numel, dtype, peer, req);
}

static dt_status_t dt__nc_recv(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype, int peer,
                               dt_comm_req_t* req) {
  return dt__nc_p2p(c, 0, buf, numel, dtype, peer, req);
}

static dt_status_t dt__nc_group_start(dt_comm_t* c) {
  DT_CHECK(dt__nc_live(c));
  dt__nc(c)->group++;
  return DT_SUCCESS;
}

static dt_status_t dt__nc_group_end(dt_comm_t* c) {
  dt__nc_t* x = dt__nc(c);
  if (x->group == 0) return DT_FAIL(DT_ERR_INVALID_USAGE, "group_end without group_start");
  if (--x->group > 0) return DT_SUCCESS;
  return dt__nc_flush(c);
}

/* Before a collective: the live check and the point-to-point calls posted before it. */
static dt_status_t dt__nc_coll(dt_comm_t* c, ncclDataType_t* t, dt_dtype_t dtype) {
  DT_CHECK(dt__nc_live(c));
  DT_CHECK(dt__nc_type(dtype, t));
  DT_CHECK(dt__nc_flush(c));
  return dt__nc_begin(c);
}

static int dt__nc_even(int n, const int64_t* counts) {
  for (int r = 1; r < n; r++)
    if (counts[r] != counts[0]) return 0;
  return 1;
}

static dt_status_t dt__nc_all_gather_v(dt_comm_t* c, const void* send, void* recv,
                                       const int64_t* counts, const int64_t* displs,
                                       dt_dtype_t dtype, dt_comm_req_t* req) {
  int n = c->size, me = c->rank;
  /* ncclAllGather for equal blocks, else a broadcast per root (any displs): decided from the
   * counts, which every rank passes alike. Equal blocks that are not back to back in this rank's
   * recv go through scratch and are copied into place (on the comm stream). */
  const int even = counts[0] > 0 && dt__nc_even(n, counts);
  int packed = even;
  for (int r = 0; r < n && packed; r++) packed = displs[r] == displs[0] + r * counts[0];
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_coll(c, &t, dtype));
  dt__nc_t* x = dt__nc(c);
  size_t item = dt__itemsize(dtype);
  const char* mine = send ? (const char*)send : (const char*)recv + (size_t)displs[me] * item;
  if (even && packed) {
    DT__NC(ncclAllGather(mine, (char*)recv + (size_t)displs[0] * item, (size_t)counts[0], t, x->nc,
                         x->stream),
           "ncclAllGather");
  } else if (even) {
    const size_t blk = (size_t)counts[0] * item, nb = blk * (size_t)n;
    void* scr = dt__backend_alloc(x->b, nb);
    if (scr == NULL)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "all_gather_v on NCCL: %zu bytes of scratch", nb);
    ncclResult_t r = ncclAllGather(mine, scr, (size_t)counts[0], t, x->nc, x->stream);
    for (int q = 0; q < n && r == ncclSuccess; q++)
      if (cudaMemcpyAsync((char*)recv + (size_t)displs[q] * item, (char*)scr + (size_t)q * blk,
                          blk, cudaMemcpyDeviceToDevice, x->stream) != cudaSuccess)
        r = ncclUnhandledCudaError;
    if (r != ncclSuccess) {
      dt__backend_free(x->b, scr, nb); /* nothing of it ran past the failed call */
      return dt__nc_fail(r, "ncclAllGather (blocks not back to back)");
    }
    return dt__nc_end_scratch(c, req, "all_gather", scr, nb);
  } else {
    DT__NC(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (int q = 0; q < n && r == ncclSuccess; q++)
      if (counts[q] > 0)
        r = ncclBroadcast(mine, (char*)recv + (size_t)displs[q] * item, (size_t)counts[q], t, q,
                          x->nc, x->stream);
    ncclResult_t e = ncclGroupEnd();
    DT__NC(r, "ncclBroadcast (all_gather_v)");
    DT__NC(e, "ncclGroupEnd");
  }
  return dt__nc_end(c, req, "all_gather");
}

static dt_status_t dt__nc_all_reduce(dt_comm_t* c, const void* send, void* recv, int64_t numel,
                                     dt_dtype_t dtype, dt_reduce_op_t op, dt_comm_req_t* req) {
  ncclRedOp_t o = ncclSum;
  DT_CHECK(dt__nc_op(op, &o));
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_coll(c, &t, dtype));
  dt__nc_t* x = dt__nc(c);
  DT__NC(ncclAllReduce(send, recv, (size_t)numel, t, o, x->nc, x->stream), "ncclAllReduce");
  return dt__nc_end(c, req, "all_reduce");
}

static dt_status_t dt__nc_reduce_scatter_v(dt_comm_t* c, const void* send, void* recv,
                                           const int64_t* counts, dt_dtype_t dtype,
                                           dt_reduce_op_t op, dt_comm_req_t* req) {
  ncclRedOp_t o = ncclSum;
  DT_CHECK(dt__nc_op(op, &o));
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_coll(c, &t, dtype));
  dt__nc_t* x = dt__nc(c);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  if (dt__nc_even(n, counts)) {
    DT__NC(ncclReduceScatter(send, recv, (size_t)counts[0], t, o, x->nc, x->stream),
           "ncclReduceScatter");
  } else {
    DT__NC(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    int64_t at = 0;
    for (int q = 0; q < n && r == ncclSuccess; at += counts[q], q++)
      if (counts[q] > 0)
        r = ncclReduce((const char*)send + (size_t)at * item, q == me ? recv : NULL,
                       (size_t)counts[q], t, o, q, x->nc, x->stream);
    ncclResult_t e = ncclGroupEnd();
    DT__NC(r, "ncclReduce (reduce_scatter_v)");
    DT__NC(e, "ncclGroupEnd");
  }
  return dt__nc_end(c, req, "reduce_scatter");
}

/* Grouped ncclSend / ncclRecv with every peer; this rank's own block a device copy on the comm
 * stream. */
static dt_status_t dt__nc_all_to_all_v(dt_comm_t* c, const void* send, const int64_t* scounts,
                                       const int64_t* sdispls, void* recv, const int64_t* rcounts,
                                       const int64_t* rdispls, dt_dtype_t dtype,
                                       dt_comm_req_t* req) {
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_coll(c, &t, dtype));
  dt__nc_t* x = dt__nc(c);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  if (scounts[me] > 0) {
    if (scounts[me] != rcounts[me])
      return DT_FAIL(DT_ERR_INVALID_ARG, "this rank sends itself %lld elements and receives %lld",
                     (long long)scounts[me], (long long)rcounts[me]);
    DT_CHECK(dt__nc_cuda(cudaMemcpyAsync((char*)recv + (size_t)rdispls[me] * item,
                                         (const char*)send + (size_t)sdispls[me] * item,
                                         (size_t)scounts[me] * item, cudaMemcpyDeviceToDevice,
                                         x->stream),
                         "NCCL comm: own block (cudaMemcpyAsync)"));
  }
  DT__NC(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (int q = 0; q < n && r == ncclSuccess; q++) {
    if (q == me) continue;
    if (rcounts[q] > 0)
      r = ncclRecv((char*)recv + (size_t)rdispls[q] * item, (size_t)rcounts[q], t, q, x->nc,
                   x->stream);
    if (r == ncclSuccess && scounts[q] > 0)
      r = ncclSend((const char*)send + (size_t)sdispls[q] * item, (size_t)scounts[q], t, q, x->nc,
                   x->stream);
  }
  ncclResult_t e = ncclGroupEnd();
  DT__NC(r, "ncclSend / ncclRecv");
  DT__NC(e, "ncclGroupEnd");
  return dt__nc_end(c, req, "all_to_all");
}

static dt_status_t dt__nc_all_to_all_box(dt_comm_t* c, const void* send, const int64_t* scounts,
                                         const int64_t* sdispls, void* recv, int ndim,
                                         const int64_t* rshape, const int64_t* roffs,
                                         const int64_t* rlens, dt_dtype_t dtype,
                                         dt_comm_req_t* req, int* placed) {
  (void)c, (void)send, (void)scounts, (void)sdispls, (void)recv, (void)ndim, (void)rshape;
  (void)roffs, (void)rlens, (void)dtype, (void)req;
  *placed = 0; /* NCCL has no datatypes: the caller receives into scratch and unpacks */
  return DT_SUCCESS;
}

static dt_status_t dt__nc_broadcast(dt_comm_t* c, void* buf, int64_t numel, dt_dtype_t dtype,
                                    int root, dt_comm_req_t* req) {
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_coll(c, &t, dtype));
  dt__nc_t* x = dt__nc(c);
  DT__NC(ncclBroadcast(buf, buf, (size_t)numel, t, root, x->nc, x->stream), "ncclBroadcast");
  return dt__nc_end(c, req, "broadcast");
}

static dt_status_t dt__nc_scatter_v(dt_comm_t* c, const void* send, const int64_t* counts,
                                    const int64_t* displs, void* recv, dt_dtype_t dtype, int root,
                                    dt_comm_req_t* req) {
  ncclDataType_t t = ncclFloat32;
  DT_CHECK(dt__nc_coll(c, &t, dtype));
  dt__nc_t* x = dt__nc(c);
  int n = c->size, me = c->rank;
  size_t item = dt__itemsize(dtype);
  if (me == root && counts[me] > 0)
    DT_CHECK(dt__nc_cuda(cudaMemcpyAsync(recv, (const char*)send + (size_t)displs[me] * item,
                                         (size_t)counts[me] * item, cudaMemcpyDeviceToDevice,
                                         x->stream),
                         "NCCL comm: the root's own block (cudaMemcpyAsync)"));
  DT__NC(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  if (me == root) {
    for (int q = 0; q < n && r == ncclSuccess; q++)
      if (q != me && counts[q] > 0)
        r = ncclSend((const char*)send + (size_t)displs[q] * item, (size_t)counts[q], t, q, x->nc,
                     x->stream);
  } else if (counts[me] > 0) {
    r = ncclRecv(recv, (size_t)counts[me], t, root, x->nc, x->stream);
  }
  ncclResult_t e = ncclGroupEnd();
  DT__NC(r, "ncclSend / ncclRecv (scatter_v)");
  DT__NC(e, "ncclGroupEnd");
  return dt__nc_end(c, req, "scatter");
}

static dt_status_t dt__nc_wait(dt_comm_t* c, dt_comm_req_t* req) {
  if (req->n == 0) return DT_SUCCESS;
  dt__nc_t* x = dt__nc(c);
  if (x->nc == NULL) { /* aborted: its data is whatever NCCL had written */
    dt__nc_req_reset(x, req);
    return dt__nc_live(c);
  }
  if (x->n_p2p > 0) DT_CHECK(dt__nc_flush(c)); /* calls still pending (this one's, maybe) */
  cudaEvent_t e = dt__req_event(req);
  if (e == NULL) { /* its flush failed before the call was issued (reported then) */
    dt__nc_req_reset(x, req);
    return DT_FAIL(DT_ERR_NCCL, "%s was never issued: an earlier NCCL call of its group failed",
                   req->op ? req->op : "the call");
  }
  dt__nc_enter(x->b);
  dt_status_t st = dt__nc_wait_event(c, e, req->op ? req->op : "collective");
  if (st == DT_ERR_TIMEOUT) return st; /* still posted: nothing may wait for it again */
  dt__nc_req_reset(x, req);
  return st;
}

static dt_status_t dt__nc_test(dt_comm_t* c, dt_comm_req_t* req, int* done) {
  *done = 1;
  if (req->n == 0) return DT_SUCCESS;
  dt__nc_t* x = dt__nc(c);
  if (x->nc == NULL) {
    dt__nc_req_reset(x, req);
    return dt__nc_live(c);
  }
  if (x->n_p2p > 0) {
    dt_status_t st = dt__nc_flush(c);
    if (st != DT_SUCCESS) {
      dt__nc_req_reset(x, req);
      return st;
    }
  }
  cudaEvent_t e = dt__req_event(req);
  if (e == NULL) {
    dt__nc_req_reset(x, req);
    return DT_FAIL(DT_ERR_NCCL, "%s was never issued: an earlier NCCL call of its group failed",
                   req->op ? req->op : "the call");
  }
  dt__nc_enter(x->b);
  cudaError_t q = cudaEventQuery(e);
  if (q == cudaErrorNotReady) {
    ncclResult_t ae = ncclSuccess;
    if (ncclCommGetAsyncError(x->nc, &ae) == ncclSuccess && ae != ncclSuccess &&
        ae != ncclInProgress) {
      dt__nc_abort(c);
      dt__nc_req_reset(x, req);
      return DT_FAIL(DT_ERR_NCCL, "%s: NCCL reported %s (%d); the communicator was aborted",
                     req->op ? req->op : "collective", ncclGetErrorString(ae), (int)ae);
    }
    *done = 0;
    return DT_SUCCESS;
  }
  dt__nc_req_reset(x, req);
  return q == cudaSuccess ? DT_SUCCESS : dt__nc_cuda(q, "NCCL comm: cudaEventQuery");
}

static void dt__nc_req_free(dt_comm_req_t* req) { dt__comm_req_free(req); }

static dt_status_t dt__nc_split(const dt_comm_t* parent, int color, int key, dt_comm_t* out);
static dt_status_t dt__nc_dup(const dt_comm_t* c, dt_comm_t* out);
static void dt__nc_destroy(dt_comm_t* c);

static const struct dt_comm_i dt__nc_iface = {
    dt__nc_split,     dt__nc_dup,      dt__nc_destroy,     dt__nc_all_gather_v,
    dt__nc_all_reduce, dt__nc_reduce_scatter_v, dt__nc_all_to_all_v, dt__nc_all_to_all_box,
    dt__nc_broadcast, dt__nc_scatter_v, dt__nc_send,        dt__nc_recv,
    dt__nc_group_start, dt__nc_group_end, dt__nc_wait,      dt__nc_test,
    dt__nc_req_free,
};

/* Wraps NCCL communicator nc (NULL: none) of backend b with a comm stream of its own. */
static dt_status_t dt__nc_wrap(ncclComm_t nc, dt_backend_t b, int world_rank, int size, int rank,
                               dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (nc == NULL) return DT_SUCCESS;
  dt__nc_enter(b);
  dt__nc_t* x = (dt__nc_t*)dt__calloc(1, sizeof *x);
  cudaStream_t s = NULL;
  dt_status_t st = x == NULL ? DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating an NCCL communicator")
                   : dt__nc_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                 "NCCL comm: cudaStreamCreateWithFlags");
  if (st != DT_SUCCESS) {
    dt__free(x);
    (void)ncclCommDestroy(nc);
    return st;
  }
  x->nc = nc;
  x->stream = s;
  x->b = b;
  x->world_rank = world_rank;
  const char* stall = getenv("DTENSOR_NCCL_STALL_MS");
  x->stall_ns = stall != NULL ? (unsigned long long)(strtod(stall, NULL) * 1e6) : 0;
#ifndef DT_SIMT_EMULATE
  void* flag = NULL; /* the hook's stop flag, read by the device through unified addressing */
  if (x->stall_ns > 0 && cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped) == cudaSuccess) {
    x->stall_stop = (volatile int*)flag;
    *x->stall_stop = 0;
  }
#endif
  out->iface = &dt__nc_iface;
  out->context = x;
  out->api_version = DT_COMM_API_VERSION;
  out->size = size;
  out->rank = rank;
  return DT_SUCCESS;
}

static dt_status_t dt__nc_split(const dt_comm_t* parent, int color, int key, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (parent == NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "an NCCL communicator splits from another (the "
                   "backend's NCCL world), not from the library's world");
  DT_CHECK(dt__nc_live(parent));
  DT_CHECK(dt__nc_flush((dt_comm_t*)parent));
  dt__nc_t* x = dt__nc(parent);
  dt__nc_enter(x->b);
  ncclComm_t nc = NULL;
  DT__NC(ncclCommSplit(x->nc, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, NULL),
         "ncclCommSplit");
  if (nc == NULL) return DT_SUCCESS;
  /* the new rank and size: the ranks of the parent with this color, ordered by (key, rank) */
  int size = 0, rank = 0;
  ncclResult_t r1 = ncclCommCount(nc, &size), r2 = ncclCommUserRank(nc, &rank);
  if (r1 != ncclSuccess || r2 != ncclSuccess) {
    (void)ncclCommDestroy(nc);
    return dt__nc_fail(r1 != ncclSuccess ? r1 : r2, "ncclCommCount / ncclCommUserRank");
  }
  return dt__nc_wrap(nc, x->b, x->world_rank, size, rank, out);
}

static dt_status_t dt__nc_dup(const dt_comm_t* c, dt_comm_t* out) {
  return dt__nc_split(c, 0, c->rank, out);
}

static void dt__nc_destroy(dt_comm_t* c) {
  dt__nc_t* x = dt__nc(c);
  if (x == NULL) return;
  dt__nc_enter(x->b);
  if (x->n_p2p > 0) (void)dt__nc_flush(c); /* nothing may stay half posted on the peers */
  if (x->nc != NULL) {
    (void)cudaStreamSynchronize(x->stream);
    (void)ncclCommDestroy(x->nc);
  }
  for (int i = 0; i < x->n_pool; i++) (void)cudaEventDestroy(x->pool[i]);
  dt__free(x->pool);
  dt__free(x->p2p);
#ifndef DT_SIMT_EMULATE
  if (x->stall_stop != NULL) { /* the hook's spins end, then their flag goes */
    *x->stall_stop = 1;
    (void)cudaStreamSynchronize(x->stream);
    (void)cudaFreeHost((void*)x->stall_stop);
  }
#endif
  (void)cudaStreamDestroy(x->stream);
  dt__free(x);
  c->context = NULL;
}


/* ---------------------------------------------------------------------------------------------
 * the world of a backend */

extern "C" int DT_CUDA_NAME(nccl_is)(const dt_comm_t* c) { return c && c->iface == &dt__nc_iface; }

extern "C" dt_status_t DT_CUDA_NAME(nccl_world)(dt_backend_t b, const dt_comm_t* ctrl,
                                                 dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (ctrl == NULL || ctrl->iface == NULL)
    return DT_FAIL(DT_ERR_NOT_INITIALIZED, "the NCCL world needs the MPI world (dt_init)");
  /* every rank loads NCCL and makes its id (rank 0) before anyone enters ncclCommInitRank: a
   * rank that cannot must not leave the others waiting there */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  dt_status_t st = dt__nccl_load();
#ifndef DT_SIMT_EMULATE
  if (st == DT_SUCCESS && b->ordinal >= 0)
    st = dt__nc_cuda(cudaSetDevice(b->ordinal), "NCCL world: cudaSetDevice");
#endif
  if (st == DT_SUCCESS && ctrl->rank == 0) st = dt__nc_fail(ncclGetUniqueId(&id), "ncclGetUniqueId");
  int64_t bad = st != DT_SUCCESS, any = 0;
  char why[512];
  snprintf(why, sizeof why, "%s", st != DT_SUCCESS ? dt_last_error() : "");
  DT_CHECK(ctrl->iface->all_reduce((dt_comm_t*)ctrl, &bad, &any, 1, DT_I64, DT_REDUCE_MAX, NULL));
  if (any) {
    if (st != DT_SUCCESS) return DT_FAIL(st, "%s", why);
    return DT_FAIL(DT_ERR_NCCL, "another rank could not set up " DT__NCCL_WHAT " (see its "
                   "message)");
  }
  static_assert(sizeof(ncclUniqueId) % 4 == 0, "ncclUniqueId is not a whole number of words");
  DT_CHECK(ctrl->iface->broadcast((dt_comm_t*)ctrl, &id, (int64_t)(sizeof id / 4), DT_I32, 0,
                                  NULL));
  ncclComm_t nc = NULL;
#ifdef DT_SIMT_EMULATE
  const MPI_Comm* over = (const MPI_Comm*)dt__comm_mpi_native(ctrl);
  st = over == NULL ? DT_FAIL(DT_ERR_INTERNAL, "the emulated NCCL bootstraps over an MPI comm")
                    : dt__nc_fail(dt_nccl_emu_init_over(&nc, *over, ctrl->size, id, ctrl->rank),
                                  "ncclCommInitRank (emulated)");
#else
  st = dt__nc_fail(ncclCommInitRank(&nc, ctrl->size, id, ctrl->rank), "ncclCommInitRank");
#endif
  bad = st != DT_SUCCESS;
  snprintf(why, sizeof why, "%s", st != DT_SUCCESS ? dt_last_error() : "");
  dt_status_t ast =
      ctrl->iface->all_reduce((dt_comm_t*)ctrl, &bad, &any, 1, DT_I64, DT_REDUCE_MAX, NULL);
  if (ast != DT_SUCCESS || any) {
    if (nc != NULL) (void)ncclCommDestroy(nc);
    if (ast != DT_SUCCESS) return ast;
    if (st != DT_SUCCESS) return DT_FAIL(st, "%s", why);
    return DT_FAIL(DT_ERR_NCCL, "ncclCommInitRank failed on another rank (see its message)");
  }
  const dt_comm_t* w = dt__comm_world();
  return dt__nc_wrap(nc, b, w ? w->rank : ctrl->rank, ctrl->size, ctrl->rank, out);
}

extern "C" dt_status_t DT_CUDA_NAME(nccl_version)(int* version) {
  *version = 0;
  DT_CHECK(dt__nccl_load());
  DT__NC(ncclGetVersion(version), "ncclGetVersion");
  return DT_SUCCESS;
}

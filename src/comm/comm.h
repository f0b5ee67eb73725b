/* comm.h - the communication vtable (the comm layer) and its MPI implementation.
 *
 * Collectives reach MPI only through dt_comm_i, so an NCCL implementation can sit beside it:
 * communicators are created through the vtable (split, dup), counts are 64-bit element counts
 * (numel) of `dtype`, never byte counts, and every collective and point-to-point call has a
 * non-blocking form. Conventions follow NCCL: all-gather takes the per-rank counts of the blocks
 * (block r lands at displs[r] of recv), reduce-scatter the per-rank receive counts (the send
 * buffer holds the blocks of all ranks back to back in rank order).
 *
 * Blocking and non-blocking: every collective takes a request. NULL runs it to completion before
 * returning; otherwise the call only starts it and the request completes it (wait, test): until
 * then the buffers belong to the communicator. Between group_start and group_end, send and recv
 * without a request are collected and completed by group_end (NCCL's grouping; MPI posts them
 * non-blocking); with a request they complete with it. Point-to-point calls that depend on each
 * other (a ring step's receive from one peer and send to the other) must be posted in one group:
 * an NCCL communicator runs its calls in order on one stream, so a receive issued alone waits for
 * the peer's send, which the peer may have queued behind its own receive. Every rank of a communicator must start its collectives in the same order, and
 * an implementation may choose how to run a call only from values every rank passes alike (a
 * rank sees only its own all_to_all_v counts: choosing MPI_Alltoallv on one rank and
 * point-to-point on another would deadlock).
 *
 * Deadlines: every wait (a blocking call, wait, group_end) ends within the library's timeout
 * (dt_set_timeout, $DTENSOR_TIMEOUT_S). Past it the implementation calls dt__comm_timeout, which
 * reports and calls the host's handler; then it aborts the job, or returns DT_ERR_TIMEOUT with
 * the request still posted (nothing may wait for it again).
 *
 * The collective check ($DTENSOR_DEBUG contains "collectives"; off by default): before every
 * collective (split and dup included, point-to-point calls excluded) the ranks of the
 * communicator exchange a record of the call they are about to make (dt_call_desc_t, plus the
 * thread's context) apart from the data traffic, and when the records disagree every rank
 * returns DT_ERR_INVALID_USAGE with the same message (dt__call_verdict) without entering the
 * call. A blocking call exchanges and judges at once; a non-blocking one posts the exchange into
 * its request and posts the call itself only when wait or test sees the exchange complete and
 * the records agree, so checks start in the same order as the collectives and never block a rank
 * that a blocking call would not have blocked.
 */
#ifndef DT_COMM_COMM_H
#define DT_COMM_COMM_H

#include "backend/backend.h"
#include "internal/common.h"

#define DT_COMM_API_VERSION 3

struct dt_comm;

/* An outstanding non-blocking operation: the implementation's handles plus the host memory it
 * must keep until completion (count arrays). Zero-initialize before first use. Completion (wait,
 * test) makes it reusable for the next post but keeps that memory, so a request reused for
 * posts of similar size allocates nothing; req_free releases it. */
#define DT_COMM_REQ_INLINE 8
typedef struct dt_comm_req {
  int n, cap;                            /* handles in use, capacity */
  uint64_t inline_h[DT_COMM_REQ_INLINE]; /* the first handles (MPI_Request) */
  uint64_t* more;                        /* beyond them (heap) */
  void* keep;                            /* list of kept blocks (count arrays) */
  void** keep_free;                      /* link to the first block not in use (NULL: &keep) */
  const char* op;                        /* the last call posted ("all_gather"): timeout text */
  void* check; /* the collective check's exchange and the call it holds back (implementation's) */
} dt_comm_req_t;

struct dt_comm_i {
  /* A new communicator of the ranks of `parent` (NULL: the library's world) that pass the same
   * color, ranked by key; color < 0 gives this rank none (*out zeroed, size 0). Collective over
   * parent. */
  dt_status_t (*split)(const struct dt_comm* parent, int color, int key, struct dt_comm* out);
  /* A communicator with the same ranks and order whose traffic never mixes with c's (the
   * dedicated communicators of asynchronous redistributions). Collective over c. */
  dt_status_t (*dup)(const struct dt_comm* c, struct dt_comm* out);
  /* Releases the communicator (context). */
  void (*destroy)(struct dt_comm* c);
  /* recv[displs[r] .. +counts[r]) <- rank r's send (counts[me] elements); send NULL: in place
   * (this rank's block is already at displs[me] of recv). */
  dt_status_t (*all_gather_v)(struct dt_comm* c, const void* send, void* recv,
                              const int64_t* counts, const int64_t* displs, dt_dtype_t dtype,
                              dt_comm_req_t* req);
  /* recv <- op over ranks of send (numel elements); send == recv is in place. */
  dt_status_t (*all_reduce)(struct dt_comm* c, const void* send, void* recv, int64_t numel,
                            dt_dtype_t dtype, dt_reduce_op_t op, dt_comm_req_t* req);
  /* recv (counts[me] elements) <- op over ranks of block `me` of send; send holds the blocks of
   * every rank back to back in rank order. avg is not accepted (the caller divides). */
  dt_status_t (*reduce_scatter_v)(struct dt_comm* c, const void* send, void* recv,
                                  const int64_t* counts, dt_dtype_t dtype, dt_reduce_op_t op,
                                  dt_comm_req_t* req);
  /* Personalized exchange: scounts[q] elements from send + sdispls[q] go to rank q, rcounts[q]
   * elements from rank q land at recv + rdispls[q]. */
  dt_status_t (*all_to_all_v)(struct dt_comm* c, const void* send, const int64_t* scounts,
                              const int64_t* sdispls, void* recv, const int64_t* rcounts,
                              const int64_t* rdispls, dt_dtype_t dtype, dt_comm_req_t* req);
  /* Optional (NULL: the caller receives into scratch and unpacks). all_to_all_v in which what
   * rank q sends lands as a box of recv, an array of shape rshape[0..ndim): the box at
   * roffs[q * ndim ..] of extent rlens[q * ndim ..], element rcount(q) = its numel in row-major
   * order. This rank's own box is left alone (the caller places it); empty boxes receive nothing.
   * Sets *placed to 0, having posted nothing, when the implementation does not place these boxes
   * directly (then the caller falls back to all_to_all_v): it may decide per rank, since what
   * goes on the wire is the same either way. MPI: a subarray datatype per peer, so the single
   * copy out of the sender's memory writes the box in place (no scratch, no unpack pass). */
  dt_status_t (*all_to_all_box)(struct dt_comm* c, const void* send, const int64_t* scounts,
                                const int64_t* sdispls, void* recv, int ndim,
                                const int64_t* rshape, const int64_t* roffs,
                                const int64_t* rlens, dt_dtype_t dtype, dt_comm_req_t* req,
                                int* placed);
  /* buf (numel elements) from rank root to all. */
  dt_status_t (*broadcast)(struct dt_comm* c, void* buf, int64_t numel, dt_dtype_t dtype,
                           int root, dt_comm_req_t* req);
  /* recv (counts[me] elements) <- root's send + displs[me]. */
  dt_status_t (*scatter_v)(struct dt_comm* c, const void* send, const int64_t* counts,
                           const int64_t* displs, void* recv, dt_dtype_t dtype, int root,
                           dt_comm_req_t* req);
  /* Point to point: numel elements to / from rank `peer`. */
  dt_status_t (*send)(struct dt_comm* c, const void* buf, int64_t numel, dt_dtype_t dtype,
                      int peer, dt_comm_req_t* req);
  dt_status_t (*recv)(struct dt_comm* c, void* buf, int64_t numel, dt_dtype_t dtype, int peer,
                      dt_comm_req_t* req);
  /* Groups of point-to-point calls completed together (optional: NULL when every call
   * completes on its own). */
  dt_status_t (*group_start)(struct dt_comm* c);
  dt_status_t (*group_end)(struct dt_comm* c);
  /* Completes a request (blocks); test sets *done when it has completed (and then releases it). */
  dt_status_t (*wait)(struct dt_comm* c, dt_comm_req_t* req);
  dt_status_t (*test)(struct dt_comm* c, dt_comm_req_t* req, int* done);
  /* Releases the memory a request keeps for reuse (a completed or never-posted request). */
  void (*req_free)(dt_comm_req_t* req);
};

typedef struct dt_comm {
  const struct dt_comm_i* iface;
  void* context; /* implementation handle (MPI: a heap-held MPI_Comm and its group state) */
  int api_version;
  int size;
  int rank;
} dt_comm_t;

/* ---- the MPI implementation (src/comm/comm_mpi.c) ------------------------------------------ */
/* Starts MPI (unless the host did) and the library's world communicator. */
dt_status_t dt__comm_mpi_init(int* argc, char*** argv, int* we_initialized);
/* Remembers whether dt_init started MPI; dt__comm_mpi_finalize_owned finalizes it only then. */
void dt__comm_mpi_set_owned(int we_initialized);
/* Whether MPI provides MPI_THREAD_SERIALIZED or more (dt_init asks for it; a host that started MPI
 * itself may have chosen less: then only the thread that started MPI may call the library). */
int dt__comm_mpi_serialized(void);
dt_status_t dt__comm_mpi_finalize(int we_initialized);
dt_status_t dt__comm_mpi_finalize_owned(void);
/* The library's world communicator (NULL before dt_init). */
const dt_comm_t* dt__comm_world(void);
/* Whether the MPI comm's all_to_all_box places these boxes directly (for a communicator of c's
 * size and rank): the simulated comm decides as the MPI run it stands for would. */
int dt__comm_mpi_box_fits(const dt_comm_t* c, int ndim, const int64_t* rshape,
                          const int64_t* roffs, const int64_t* rlens, dt_dtype_t dtype);
/* The MPI_Comm behind an MPI communicator (a pointer to it), NULL for any other kind: what the
 * emulated NCCL (src/comm/nccl_emu.h) bootstraps over. */
const void* dt__comm_mpi_native(const dt_comm_t* c);
/* Releases a communicator (NULL or zeroed: no-op) and zeroes it. */
void dt__comm_release(dt_comm_t* c);
/* Releases the memory a request keeps (any request of this layer's implementations). */
void dt__comm_req_free(dt_comm_req_t* req);

/* Ends the job after a deadline the host's handler did not turn into a return (MPI_Abort of the
 * world with `code`): what every implementation's timeout path calls last. */
void dt__comm_abort_job(int code);

/* ---- the NCCL implementation (src/comm/comm_nccl.cu; src/comm/comm_data.c) ------------------ */
/* Built with the cuda backend (NCCL loaded at run time) and with the cuda-emu backend (NCCL
 * emulated over MPI, src/comm/nccl_emu.h). The NCCL world of CUDA backend b: collective over
 * ctrl (the MPI world; every rank passes its own backend): NCCL is loaded and rank 0's unique id
 * broadcast over ctrl, the ranks agreeing on failure first, so none waits in ncclCommInitRank for
 * one that failed. Other NCCL communicators are splits of it (the vtable's split, dup), which run
 * on a comm stream of their own ordered after b's compute stream (see the file). DT_ERR_UNSUPPORTED
 * when the build has no NCCL communicator for b. */
dt_status_t dt__comm_nccl_world(dt_backend_t b, const dt_comm_t* ctrl, dt_comm_t* out);
/* 1 when c is an NCCL communicator (it carries its backend's device memory, not host memory). */
int dt__comm_is_nccl(const dt_comm_t* c);
/* The NCCL version the cuda backend loads (e.g. 22809), or 0 with a message when none loads;
 * DT_ERR_UNSUPPORTED without the cuda backend. */
dt_status_t dt__comm_nccl_version(int* version);
dt_status_t dt__cuda_nccl_world(dt_backend_t b, const dt_comm_t* ctrl, dt_comm_t* out);
dt_status_t dt__cudaemu_nccl_world(dt_backend_t b, const dt_comm_t* ctrl, dt_comm_t* out);
int dt__cuda_nccl_is(const dt_comm_t* c);
int dt__cudaemu_nccl_is(const dt_comm_t* c);
dt_status_t dt__cuda_nccl_version(int* version);
dt_status_t dt__cudaemu_nccl_version(int* version);

/* ---- simulated communicators (src/comm/comm_sim.c) ----------------------------------------- */
/* A communicator of `size` simulated ranks in which this process is `rank`: moves nothing, never
 * waits, leaves meta-backend buffers alone and fills host buffers as if every rank held what this
 * one holds (see the file). The communicators of meshes under dt_init_simulated. */
dt_status_t dt__comm_sim_create(int size, int rank, dt_comm_t* out);

/* ---- closed communicators (src/comm/comm_closed.c) ----------------------------------------- */
/* Releases a communicator and leaves in its place one whose every call fails with
 * DT_ERR_NOT_INITIALIZED ("the library was finalized"), size and rank kept (dt_finalize: the
 * meshes that outlive it). A zeroed one (none, or a rank outside it) stays zeroed. */
void dt__comm_close(dt_comm_t* c);
/* Largest element count one MPI call carries (INT_MAX; $DTENSOR_COMM_MAX_COUNT lowers it so tests
 * run the chunked paths on small tensors). Larger counts are split into several calls. */
int64_t dt__comm_max_count(void);

/* ---- deadlines (src/comm/deadline.c) ------------------------------------------------------- */
/* What the calling thread is running, for the timeout message: set by the redistribute executor
 * before it posts or waits for a step's collective, cleared after (the comm layer only reads it).
 * mesh_dims: bit i for mesh dim i (0: unknown); step: 0-based index of nsteps (nsteps 0:
 * unknown); before/after: the mesh's ndim placements around the step (NULL: unknown), of which
 * the dims in mesh_dims are reported ("S(0)->R"). Copied, and formatted only on a timeout. */
void dt__comm_what_set(unsigned mesh_dims, int step, int nsteps, int ndim,
                       const dt_placement_t* before, const dt_placement_t* after);
void dt__comm_what_clear(void);
/* " (mesh dim 0, step 1/2 S(0)->R)" from the thread's context; "" when it is empty. */
void dt__comm_what_format(char* buf, size_t cap);
/* Changes at every set and clear: values a comm keeps between two calls of one step (e.g. the
 * record of an all_to_all_box that declined, for the fallback call) are tied to it. */
unsigned dt__comm_what_epoch(void);
/* Strict parse of a timeout in seconds ("600", "2.5", "1e3"): a positive finite number with
 * nothing after it but spaces. `source` names where the text came from, for the message. */
dt_status_t dt__timeout_parse(const char* text, const char* source, double* out);
/* Applies $DTENSOR_TIMEOUT_S when set and not empty (dt_init, before MPI starts). */
dt_status_t dt__timeout_from_env(void);
/* The timeout in seconds. */
double dt__timeout_s(void);
/* A wait for `op` (e.g. "all_gather") on a communicator of comm_size ranks ran past the deadline
 * after `waited` seconds: writes the message (with world_rank and the thread's context) to stderr
 * and calls the host's handler. Returns 1 when the caller must return DT_ERR_TIMEOUT (*st set,
 * the message recorded for dt_last_error), 0 when it must abort the job. */
int dt__comm_timeout(const char* op, int world_rank, int comm_size, double waited,
                     dt_status_t* st);
/* Monotonic clock in seconds. */
double dt__now_s(void);
/* The pacing of a wait loop, which every implementation's waits share: after each poll that
 * found the wait unfinished, dt__poll_next spins (the first `spin` polls: no clock read, no
 * system call), then yields the core between polls, reads the clock every 64 polls and, once
 * the wait has lasted nap_after_s, naps nap_ns between polls (a peer that late is not coming
 * within microseconds). It returns 1, with the seconds waited, once the wait has lasted the
 * library's timeout (read at the first clock read): the caller reports (dt__comm_timeout). */
typedef struct dt__poll {
  unsigned polls, spin;
  int started, nap;
  double t0, limit, nap_after_s;
  long nap_ns;
} dt__poll_t;
void dt__poll_init(dt__poll_t* p, unsigned spin, double nap_after_s, long nap_ns);
int dt__poll_next(dt__poll_t* p, double* waited);
/* 1 when the last dt__poll_next read the clock (checks as rare as that, e.g. asynchronous
 * errors, go there). */
int dt__poll_clock_read(const dt__poll_t* p);

/* ---- the collective check (src/comm/deadline.c: records and verdict, no MPI) ---------------- */
/* Kinds of checked calls (explicit values; 0 is none). all_to_all_box is an all_to_all. */
enum {
  DT_CALL_ALL_GATHER = 1,
  DT_CALL_ALL_REDUCE = 2,
  DT_CALL_REDUCE_SCATTER = 3,
  DT_CALL_ALL_TO_ALL = 4,
  DT_CALL_BROADCAST = 5,
  DT_CALL_SCATTER = 6,
  DT_CALL_SPLIT = 7,
  DT_CALL_DUP = 8,
  DT_CALL_COUNT
};
/* What one rank is about to do on a communicator of n ranks; fields that do not apply are -1 or
 * NULL. Every field must agree across the ranks, except all_to_all's vectors, which must match
 * transposed (what p sends to q is what q receives from p). */
typedef struct dt_call_desc {
  int kind;              /* DT_CALL_* */
  int dtype;             /* dt_dtype_t */
  int op;                /* dt_reduce_op_t (all_reduce, reduce_scatter) */
  int root;              /* communicator rank of the root (broadcast, scatter) */
  int64_t numel;         /* all_reduce, broadcast */
  const int64_t* counts; /* n: the per-rank counts (all_gather, reduce_scatter, scatter), or
                          * this rank's send counts per peer (all_to_all) */
  const int64_t* rcounts; /* n: all_to_all: this rank's receive counts per peer */
} dt_call_desc_t;
/* Bytes of one rank's record on a communicator of n ranks (the same on every rank). */
size_t dt__call_rec_nbytes(int n);
/* Writes this rank's record (zeroed first, so records compare bytewise): d, world_rank and the
 * thread's context (dt__comm_what_set). */
void dt__call_rec_fill(void* rec, int n, int world_rank, const dt_call_desc_t* d);
/* The verdict on the records of all n ranks, back to back in communicator rank order (the same
 * bytes on every rank, so every rank reaches the same verdict): DT_SUCCESS, or
 * DT_ERR_INVALID_USAGE with a message naming the first mismatch (the lowest rank whose call
 * differs from rank 0's, both calls described). */
dt_status_t dt__call_verdict(const void* recs, int n);

#endif

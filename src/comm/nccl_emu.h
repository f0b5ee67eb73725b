/* nccl_emu.h - the NCCL calls src/comm/comm_nccl.cu makes, emulated over MPI for the cuda-emu
 * build (DT_SIMT_EMULATE), so that the NCCL communicator's code runs, line for line, on machines
 * without a GPU. A test double, not a communication engine: each NCCL call maps onto one MPI
 * call (or one per grouped point-to-point), and reductions are done on the host in rank order.
 *
 * With NCCL's names, types and result numbers, like cuda_rt_emu.h for the runtime. "Device
 * memory" is host memory (cuda_rt_emu.h) and every call has finished when it returns, since the
 * emulated streams are synchronous: a collective is a blocking MPI call; ncclSend / ncclRecv
 * between ncclGroupStart and ncclGroupEnd are posted non-blocking and completed by ncclGroupEnd
 * (outside a group each completes at once). ncclCommInitRank has a stand-in that duplicates the
 * MPI communicator the unique id went over (dt_nccl_emu_init_over); ncclCommSplit is
 * MPI_Comm_split. Counts above INT_MAX bytes are refused
 * (ncclInvalidArgument); nothing reports an asynchronous error. Include after
 * cuda_rt_emu.h and backend/backend.h (the host reduction).
 */
#ifndef DT_COMM_NCCL_EMU_H
#define DT_COMM_NCCL_EMU_H

#ifndef DT_SIMT_EMULATE
#error "nccl_emu.h is for the DT_SIMT_EMULATE build only"
#endif

#include <limits.h>
#define OMPI_SKIP_MPICXX 1 /* the C API only (C++ bindings would need libmpi_cxx) */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNIQUE_ID_BYTES 128

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct dt_nccl_emu_comm {
  MPI_Comm comm;
  int rank, size;
}* ncclComm_t;

typedef struct ncclConfig_v22800 ncclConfig_t; /* never defined: split takes NULL */

/* the open group's posted point-to-point requests (one thread drives the emulated device) */
static struct {
  int depth;
  int n, cap;
  MPI_Request* h;
  ncclResult_t failed; /* the first failure inside the group, reported by ncclGroupEnd */
} dt_nccl_emu_group;

static inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (emulated over MPI)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

static inline ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;
  return ncclSuccess;
}

static inline size_t dt_nccl_emu_item(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

static inline dt_dtype_t dt_nccl_emu_dtype(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return DT_F16;
    case ncclBfloat16: return DT_BF16;
    case ncclInt32: return DT_I32;
    case ncclInt64: return DT_I64;
    default: return DT_F32;
  }
}

/* the byte count of `count` elements as an MPI int, or -1 past INT_MAX */
static inline int dt_nccl_emu_bytes(size_t count, ncclDataType_t t) {
  size_t nb = count * dt_nccl_emu_item(t);
  return nb > (size_t)INT_MAX ? -1 : (int)nb;
}

static inline ncclResult_t dt_nccl_emu_mpi(int rc) {
  return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static unsigned counter;
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "dtensor-nccl-emu-%u", ++counter);
  return ncclSuccess;
}

static inline ncclResult_t dt_nccl_emu_wrap(MPI_Comm mc, ncclComm_t* out) {
  *out = NULL;
  if (mc == MPI_COMM_NULL) return ncclSuccess;
  ncclComm_t c = (ncclComm_t)calloc(1, sizeof *c);
  if (c == NULL) {
    MPI_Comm_free(&mc);
    return ncclSystemError;
  }
  c->comm = mc;
  MPI_Comm_rank(mc, &c->rank);
  MPI_Comm_size(mc, &c->size);
  *out = c;
  return ncclSuccess;
}

/* ncclCommInitRank's stand-in: NCCL finds its peers through the unique id, which MPI cannot;
 * the emulation is handed the MPI communicator the id was broadcast over (the library's control
 * plane) and duplicates it, collectively over its ranks. */
static inline ncclResult_t dt_nccl_emu_init_over(ncclComm_t* comm, MPI_Comm over, int nranks,
                                                 ncclUniqueId id, int rank) {
  (void)id;
  int size = 0, me = 0;
  *comm = NULL;
  if (MPI_Comm_size(over, &size) != MPI_SUCCESS || MPI_Comm_rank(over, &me) != MPI_SUCCESS)
    return ncclSystemError;
  if (nranks != size || rank != me) return ncclInvalidArgument;
  MPI_Comm mc = MPI_COMM_NULL;
  if (MPI_Comm_dup(over, &mc) != MPI_SUCCESS) return ncclSystemError;
  MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
  return dt_nccl_emu_wrap(mc, comm);
}

static inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config) {
  (void)config;
  MPI_Comm mc = MPI_COMM_NULL;
  if (MPI_Comm_split(comm->comm, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &mc) !=
      MPI_SUCCESS)
    return ncclSystemError;
  return dt_nccl_emu_wrap(mc, newcomm);
}

static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  MPI_Comm_free(&comm->comm);
  free(comm);
  return ncclSuccess;
}
static inline ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  (void)comm;
  *err = ncclSuccess;
  return ncclSuccess;
}
static inline ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}
static inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

/* ---- groups and point-to-point ----------------------------------------------------------- */
static inline ncclResult_t ncclGroupStart(void) {
  dt_nccl_emu_group.depth++;
  return ncclSuccess;
}

static inline ncclResult_t dt_nccl_emu_complete(void) {
  ncclResult_t r = dt_nccl_emu_group.failed;
  if (dt_nccl_emu_group.n > 0 &&
      MPI_Waitall(dt_nccl_emu_group.n, dt_nccl_emu_group.h, MPI_STATUSES_IGNORE) != MPI_SUCCESS &&
      r == ncclSuccess)
    r = ncclSystemError;
  dt_nccl_emu_group.n = 0;
  dt_nccl_emu_group.failed = ncclSuccess;
  if (dt_nccl_emu_group.depth == 0) { /* nothing outstanding: give the memory back */
    free(dt_nccl_emu_group.h);
    dt_nccl_emu_group.h = NULL;
    dt_nccl_emu_group.cap = 0;
  }
  return r;
}

static inline ncclResult_t ncclGroupEnd(void) {
  if (dt_nccl_emu_group.depth == 0) return ncclInvalidUsage;
  if (--dt_nccl_emu_group.depth > 0) return ncclSuccess;
  return dt_nccl_emu_complete();
}

static inline MPI_Request* dt_nccl_emu_slot(void) {
  if (dt_nccl_emu_group.n == dt_nccl_emu_group.cap) {
    int cap = dt_nccl_emu_group.cap ? 2 * dt_nccl_emu_group.cap : 16;
    MPI_Request* h = (MPI_Request*)realloc(dt_nccl_emu_group.h, (size_t)cap * sizeof *h);
    if (h == NULL) return NULL;
    dt_nccl_emu_group.h = h;
    dt_nccl_emu_group.cap = cap;
  }
  return &dt_nccl_emu_group.h[dt_nccl_emu_group.n++];
}

static inline ncclResult_t dt_nccl_emu_p2p(int is_send, void* buf, size_t count,
                                           ncclDataType_t t, int peer, ncclComm_t comm) {
  int nb = dt_nccl_emu_bytes(count, t);
  ncclResult_t r = ncclSuccess;
  MPI_Request* h = nb < 0 ? NULL : dt_nccl_emu_slot();
  if (nb < 0) r = ncclInvalidArgument;
  else if (h == NULL) r = ncclSystemError;
  else if (is_send)
    r = dt_nccl_emu_mpi(MPI_Isend(buf, nb, MPI_BYTE, peer, 0, comm->comm, h));
  else
    r = dt_nccl_emu_mpi(MPI_Irecv(buf, nb, MPI_BYTE, peer, 0, comm->comm, h));
  if (r != ncclSuccess && h != NULL) dt_nccl_emu_group.n--;
  if (dt_nccl_emu_group.depth > 0) { /* completed by ncclGroupEnd */
    if (dt_nccl_emu_group.failed == ncclSuccess) dt_nccl_emu_group.failed = r;
    return r;
  }
  ncclResult_t w = dt_nccl_emu_complete();
  return r != ncclSuccess ? r : w;
}

static inline ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer,
                                    ncclComm_t comm, cudaStream_t s) {
  (void)s;
  return dt_nccl_emu_p2p(1, (void*)buf, count, t, peer, comm);
}
static inline ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer,
                                    ncclComm_t comm, cudaStream_t s) {
  (void)s;
  return dt_nccl_emu_p2p(0, buf, count, t, peer, comm);
}

/* ---- collectives -------------------------------------------------------------------------- */
/* dst <- the n blocks of `blocks` (count elements each, in rank order) reduced in rank order */
static inline ncclResult_t dt_nccl_emu_reduce(void* dst, const void* blocks, int n, size_t count,
                                              ncclDataType_t t, ncclRedOp_t op) {
  dt_reduce_op_t o = op == ncclSum ? DT_REDUCE_SUM : op == ncclMax ? DT_REDUCE_MAX
                     : op == ncclMin ? DT_REDUCE_MIN : (dt_reduce_op_t)-1;
  if ((int)o < 0) return ncclInvalidArgument;
  size_t nb = count * dt_nccl_emu_item(t);
  if (nb && dst != blocks) memmove(dst, blocks, nb);
  for (int q = 1; q < n; q++)
    if (dt__host_reduce(&dt__backend_cpu, dst, dst, (const char*)blocks + (size_t)q * nb,
                        dt_nccl_emu_dtype(t), (int64_t)count, o) != DT_SUCCESS)
      return ncclInternalError;
  return ncclSuccess;
}

static inline ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                                         ncclDataType_t t, ncclComm_t comm, cudaStream_t s) {
  (void)s;
  int nb = dt_nccl_emu_bytes(count, t);
  if (nb < 0 || (int64_t)nb * comm->size > INT_MAX) return ncclInvalidArgument;
  const void* src = send == (const char*)recv + (size_t)comm->rank * (size_t)nb ? MPI_IN_PLACE
                                                                                 : send;
  return dt_nccl_emu_mpi(MPI_Allgather(src, nb, MPI_BYTE, recv, nb, MPI_BYTE, comm->comm));
}

static inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                                         ncclDataType_t t, int root, ncclComm_t comm,
                                         cudaStream_t s) {
  (void)s;
  int nb = dt_nccl_emu_bytes(count, t);
  if (nb < 0) return ncclInvalidArgument;
  if (comm->rank == root && nb && send != recv) memmove(recv, send, (size_t)nb);
  return dt_nccl_emu_mpi(MPI_Bcast(recv, nb, MPI_BYTE, root, comm->comm));
}

static inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                                         ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t s) {
  (void)s;
  int nb = dt_nccl_emu_bytes(count, t);
  if (nb < 0 || (int64_t)nb * comm->size > INT_MAX) return ncclInvalidArgument;
  char* all = (char*)malloc((size_t)nb * (size_t)comm->size + 1);
  if (all == NULL) return ncclSystemError;
  ncclResult_t r =
      dt_nccl_emu_mpi(MPI_Allgather(send, nb, MPI_BYTE, all, nb, MPI_BYTE, comm->comm));
  if (r == ncclSuccess) r = dt_nccl_emu_reduce(recv, all, comm->size, count, t, op);
  free(all);
  return r;
}

static inline ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                                             ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t s) {
  (void)s;
  int nb = dt_nccl_emu_bytes(count, t);
  if (nb < 0 || (int64_t)nb * comm->size > INT_MAX) return ncclInvalidArgument;
  char* mine = (char*)malloc((size_t)nb * (size_t)comm->size + 1);
  if (mine == NULL) return ncclSystemError;
  ncclResult_t r =
      dt_nccl_emu_mpi(MPI_Alltoall(send, nb, MPI_BYTE, mine, nb, MPI_BYTE, comm->comm));
  if (r == ncclSuccess) r = dt_nccl_emu_reduce(recv, mine, comm->size, count, t, op);
  free(mine);
  return r;
}

static inline ncclResult_t ncclReduce(const void* send, void* recv, size_t count,
                                      ncclDataType_t t, ncclRedOp_t op, int root,
                                      ncclComm_t comm, cudaStream_t s) {
  (void)s;
  int nb = dt_nccl_emu_bytes(count, t);
  if (nb < 0 || (int64_t)nb * comm->size > INT_MAX) return ncclInvalidArgument;
  char* all = comm->rank == root ? (char*)malloc((size_t)nb * (size_t)comm->size + 1) : NULL;
  if (comm->rank == root && all == NULL) return ncclSystemError;
  ncclResult_t r =
      dt_nccl_emu_mpi(MPI_Gather(send, nb, MPI_BYTE, all, nb, MPI_BYTE, root, comm->comm));
  if (r == ncclSuccess && all != NULL) r = dt_nccl_emu_reduce(recv, all, comm->size, count, t, op);
  free(all);
  return r;
}

#endif /* DT_COMM_NCCL_EMU_H */

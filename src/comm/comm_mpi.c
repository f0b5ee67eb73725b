/* comm_mpi.c - the CPU communication backend: dt_comm_i over Open MPI.
 *
 * Every communicator is split from a private duplicate of MPI_COMM_WORLD whose error handler is
 * MPI_ERRORS_RETURN (inherited by the splits), so an MPI failure comes back as DT_ERR_MPI with
 * MPI's own text instead of aborting the job. bf16 and f16 travel as 16-bit integers and are
 * reduced by user-defined MPI ops that compute in f32.
 */
#include <mpi.h>
#include <stdio.h>

#include "comm/comm.h"

static MPI_Comm dt__world = MPI_COMM_NULL;
static MPI_Op dt__half_ops[2][3]; /* [bf16, f16][sum, max, min] */
static int dt__half_ops_ready = 0;
static int dt__mpi_owned = 0; /* dt_init started MPI */

static dt_status_t dt__mpi_fail(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  return DT_FAIL(DT_ERR_MPI, "%s failed: %s", what, msg);
}
#define DT_MPI_CHECK(call)                                 \
  do {                                                     \
    int dt__rc = (call);                                   \
    if (dt__rc != MPI_SUCCESS) return dt__mpi_fail(dt__rc, #call); \
  } while (0)

/* ---------------------------------------------------------------------------------------------
 * 16-bit float reductions */

#define DT__HALF_OP(NAME, LOAD, STORE, EXPR)                                  \
  static void NAME(void* in, void* inout, int* len, MPI_Datatype* type) {     \
    (void)type;                                                               \
    const uint16_t* a = (const uint16_t*)in;                                  \
    uint16_t* b = (uint16_t*)inout;                                           \
    for (int i = 0; i < *len; i++) {                                          \
      float x = LOAD(a[i]), y = LOAD(b[i]);                                   \
      b[i] = STORE(EXPR);                                                     \
    }                                                                         \
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
 * vtable */

static MPI_Comm dt__c(struct dt_comm* c) { return *(MPI_Comm*)c->context; }

static dt_status_t dt__mpi_all_gather_v(struct dt_comm* c, const void* send, void* recv,
                                        const int* counts, const int* displs, dt_dtype_t dtype) {
  MPI_Datatype t = dt__mpi_type(dtype);
  int uniform = 1; /* the plain collective may use better algorithms than the v-form */
  for (int r = 0; r < c->size; r++) uniform &= counts[r] == counts[0] && displs[r] == r * counts[0];
  if (uniform)
    DT_MPI_CHECK(MPI_Allgather(send, counts[0], t, recv, counts[0], t, dt__c(c)));
  else
    DT_MPI_CHECK(MPI_Allgatherv(send, counts[c->rank], t, recv, counts, displs, t, dt__c(c)));
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_all_reduce(struct dt_comm* c, const void* send, void* recv, int numel,
                                      dt_dtype_t dtype, dt_reduce_op_t op) {
  MPI_Op mop;
  DT_CHECK(dt__mpi_op(dtype, op, &mop));
  DT_MPI_CHECK(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, numel,
                             dt__mpi_type(dtype), mop, dt__c(c)));
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_reduce_scatter_v(struct dt_comm* c, const void* send, void* recv,
                                            const int* counts, dt_dtype_t dtype,
                                            dt_reduce_op_t op) {
  MPI_Op mop;
  DT_CHECK(dt__mpi_op(dtype, op, &mop));
  int even = 1;
  for (int r = 1; r < c->size; r++) even &= counts[r] == counts[0];
  if (even)
    DT_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, counts[0], dt__mpi_type(dtype), mop,
                                          dt__c(c)));
  else
    DT_MPI_CHECK(MPI_Reduce_scatter(send, recv, counts, dt__mpi_type(dtype), mop, dt__c(c)));
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_all_to_all_v(struct dt_comm* c, const void* send, const int* scounts,
                                        const int* sdispls, void* recv, const int* rcounts,
                                        const int* rdispls, dt_dtype_t dtype) {
  MPI_Datatype t = dt__mpi_type(dtype);
  int uniform = 1, k = scounts[0];
  for (int r = 0; r < c->size; r++)
    uniform &= scounts[r] == k && rcounts[r] == k && sdispls[r] == r * k && rdispls[r] == r * k;
  if (uniform)
    DT_MPI_CHECK(MPI_Alltoall(send, k, t, recv, k, t, dt__c(c)));
  else
    DT_MPI_CHECK(MPI_Alltoallv(send, scounts, sdispls, t, recv, rcounts, rdispls, t, dt__c(c)));
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_broadcast(struct dt_comm* c, void* buf, int numel, dt_dtype_t dtype,
                                     int root) {
  DT_MPI_CHECK(MPI_Bcast(buf, numel, dt__mpi_type(dtype), root, dt__c(c)));
  return DT_SUCCESS;
}

static dt_status_t dt__mpi_scatter_v(struct dt_comm* c, const void* send, const int* counts,
                                     const int* displs, void* recv, dt_dtype_t dtype, int root) {
  MPI_Datatype t = dt__mpi_type(dtype);
  DT_MPI_CHECK(MPI_Scatterv(send, counts, displs, t, recv, counts[c->rank], t, root, dt__c(c)));
  return DT_SUCCESS;
}

static void dt__mpi_destroy(struct dt_comm* c) {
  if (c->context != NULL) {
    MPI_Comm* mc = (MPI_Comm*)c->context;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && *mc != MPI_COMM_NULL) MPI_Comm_free(mc);
    dt__free(mc);
    c->context = NULL;
  }
}

static const struct dt_comm_i dt__mpi_iface = {
    .all_gather_v = dt__mpi_all_gather_v,
    .all_reduce = dt__mpi_all_reduce,
    .reduce_scatter_v = dt__mpi_reduce_scatter_v,
    .all_to_all_v = dt__mpi_all_to_all_v,
    .broadcast = dt__mpi_broadcast,
    .scatter_v = dt__mpi_scatter_v,
    .destroy = dt__mpi_destroy,
};

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
  }
  if (!dt__half_ops_ready) {
    MPI_User_function* fns[2][3] = {{dt__bf16_sum, dt__bf16_max, dt__bf16_min},
                                    {dt__f16_sum, dt__f16_max, dt__f16_min}};
    for (int d = 0; d < 2; d++)
      for (int k = 0; k < 3; k++) DT_MPI_CHECK(MPI_Op_create(fns[d][k], 1, &dt__half_ops[d][k]));
    dt__half_ops_ready = 1;
  }
  return DT_SUCCESS;
}

dt_status_t dt__comm_mpi_finalize(int we_initialized) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return DT_SUCCESS;
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

static dt_status_t dt__comm_wrap(MPI_Comm mc, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (mc == MPI_COMM_NULL) return DT_SUCCESS;
  MPI_Comm* h = (MPI_Comm*)dt__malloc(sizeof(MPI_Comm));
  if (h == NULL) {
    MPI_Comm_free(&mc);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a communicator handle");
  }
  *h = mc;
  out->iface = &dt__mpi_iface;
  out->context = h;
  out->api_version = 1;
  DT_MPI_CHECK(MPI_Comm_size(mc, &out->size));
  DT_MPI_CHECK(MPI_Comm_rank(mc, &out->rank));
  return DT_SUCCESS;
}

dt_status_t dt__comm_mpi_world(dt_comm_t* out) {
  if (dt__world == MPI_COMM_NULL) return DT_FAIL(DT_ERR_NOT_INITIALIZED, "MPI not set up");
  MPI_Comm dup;
  DT_MPI_CHECK(MPI_Comm_dup(dt__world, &dup));
  return dt__comm_wrap(dup, out);
}

dt_status_t dt__comm_mpi_split(const void* parent, int color, int key, dt_comm_t* out) {
  MPI_Comm p = parent ? *(const MPI_Comm*)parent : dt__world;
  MPI_Comm nc = MPI_COMM_NULL;
  memset(out, 0, sizeof *out);
  if (p == MPI_COMM_NULL) return DT_FAIL(DT_ERR_NOT_INITIALIZED, "MPI not set up");
  DT_MPI_CHECK(MPI_Comm_split(p, color < 0 ? MPI_UNDEFINED : color, key, &nc));
  return dt__comm_wrap(nc, out);
}

void dt__comm_release(dt_comm_t* c) {
  if (c != NULL && c->iface != NULL && c->iface->destroy != NULL) c->iface->destroy(c);
  if (c != NULL) memset(c, 0, sizeof *c);
}

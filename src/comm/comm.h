/* comm.h - the communication backend vtable (the comm layer) and its MPI implementation.
 *
 * Collectives reach MPI only through dt_comm_i, so an NCCL implementation can sit beside it.
 * Counts are element counts (numel) of `dtype`, never byte counts. Conventions follow NCCL:
 * all-gather takes the per-rank send count, reduce-scatter the per-rank receive count. The v-forms
 * take per-rank counts and displacements in elements.
 */
#ifndef DT_COMM_COMM_H
#define DT_COMM_COMM_H

#include "internal/common.h"

struct dt_comm;

struct dt_comm_i {
  /* recv[displs[r] .. +counts[r]) <- rank r's send (counts[me] elements). In-place: not allowed. */
  dt_status_t (*all_gather_v)(struct dt_comm* c, const void* send, void* recv, const int* counts,
                              const int* displs, dt_dtype_t dtype);
  /* recv <- op over ranks of send (numel elements); send == recv is in-place. */
  dt_status_t (*all_reduce)(struct dt_comm* c, const void* send, void* recv, int numel,
                            dt_dtype_t dtype, dt_reduce_op_t op);
  /* recv (counts[me] elements) <- op over ranks of send block `me`; send holds the blocks of all
   * ranks back to back in rank order. avg is not accepted here (the caller divides). */
  dt_status_t (*reduce_scatter_v)(struct dt_comm* c, const void* send, void* recv,
                                  const int* counts, dt_dtype_t dtype, dt_reduce_op_t op);
  /* Personalized exchange with per-peer counts/displacements on both sides. */
  dt_status_t (*all_to_all_v)(struct dt_comm* c, const void* send, const int* scounts,
                              const int* sdispls, void* recv, const int* rcounts,
                              const int* rdispls, dt_dtype_t dtype);
  /* buf (numel elements) from rank root to all. */
  dt_status_t (*broadcast)(struct dt_comm* c, void* buf, int numel, dt_dtype_t dtype, int root);
  /* recv (counts[me]) <- root's send[displs[me] ..]. */
  dt_status_t (*scatter_v)(struct dt_comm* c, const void* send, const int* counts,
                           const int* displs, void* recv, dt_dtype_t dtype, int root);
  /* Releases the communicator (context). */
  void (*destroy)(struct dt_comm* c);
};

typedef struct dt_comm {
  const struct dt_comm_i* iface;
  void* context; /* backend handle (MPI: a heap-held MPI_Comm) */
  int api_version;
  int size;
  int rank;
} dt_comm_t;

/* MPI backend (src/comm/comm_mpi.c). Creates comms by splitting `parent` (an MPI_Comm passed as
 * a pointer); color < 0 means this rank gets no communicator (*out stays zeroed, size 0). */
dt_status_t dt__comm_mpi_split(const void* parent_mpi_comm, int color, int key, dt_comm_t* out);
dt_status_t dt__comm_mpi_world(dt_comm_t* out);
dt_status_t dt__comm_mpi_init(int* argc, char*** argv, int* we_initialized);
dt_status_t dt__comm_mpi_finalize(int we_initialized);
/* Remembers whether dt_init started MPI; dt__comm_mpi_finalize_owned finalizes it only then. */
void dt__comm_mpi_set_owned(int we_initialized);
dt_status_t dt__comm_mpi_finalize_owned(void);
void dt__comm_release(dt_comm_t* c);

#endif

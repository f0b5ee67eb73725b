/* dtensor/mesh.h - library setup and device meshes.
 *
 * A mesh arranges ranks in an n-dimensional grid (1 to DT_MAX_MESH_DIMS dims). Each mesh dim has
 * its own MPI communicator (ranks that differ only in that coordinate); flattening a set of dims
 * adds one communicator over all of them, which the redistribution planner then uses to merge
 * adjacent collectives. An abstract mesh has a shape but no communicators: it plans, it explains,
 * it visualizes, but it cannot move data. It needs neither MPI nor dt_init().
 *
 * Ownership: meshes are reference counted internally; dt_mesh_destroy() drops the caller's
 * reference, tensors keep theirs, so destroying a mesh before its tensors is safe.
 * Creation, slicing and flattening of a real mesh are collective over the world communicator.
 */
#ifndef DTENSOR_MESH_H
#define DTENSOR_MESH_H

#include "dtensor/backend.h"
#include "dtensor/placement.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_mesh* dt_mesh_t;

/* Initializes the library. Initializes MPI (MPI_THREAD_SERIALIZED) unless the host program already
 * did, in which case MPI is left to the host to finalize. Threads: the library is not reentrant;
 * call it from one thread at a time, any thread (a trainer's worker too; each thread has its own
 * dt_last_error). Where the host started MPI at a level below MPI_THREAD_SERIALIZED, call it from
 * the thread that started MPI (rank 0 says so on stderr unless DTENSOR_QUIET is set). Loads the
 * calibrated cost model from
 * $DTENSOR_COST_MODEL or, when present, $HOME/.cache/dtensor/cost_model.json. argc/argv may be
 * NULL. Calling it twice is DT_ERR_INVALID_USAGE. */
DT_API dt_status_t dt_init(int* argc, char*** argv);
/* Releases library state; finalizes MPI only if dt_init initialized it. Idempotent. Objects made
 * before it (meshes, tensors, works, models, optimizers, checkpoints) stay valid handles: local
 * queries and reads work, destroy frees them, and every call that would communicate returns
 * DT_ERR_NOT_INITIALIZED ("the library was finalized"). */
DT_API dt_status_t dt_finalize(void);
/* Initializes the library for a simulated world of world_size ranks in which this process plays
 * `rank`, without MPI: for knowing what a run takes (memory per category, traffic per collective)
 * without running it, at any world size, in one process. dt_world_size and dt_world_rank report
 * the simulated values; meshes (dt_mesh_create, with explicit ranks too) get simulated
 * communicators, which move nothing (every other rank is taken to do what this one does: an
 * all-reduce sum of host values gives size times the value, a gather repeats this rank's block)
 * and count their calls and bytes in dt_counters_get as the real run does; their backend is
 * "meta" (tensors without memory, kernels that do nothing, storage counted in dt_memory_stats
 * as the cpu backend counts it; reading values gives zeros, except host values a broadcast
 * handed out: the root's are taken to be this rank's). The same program (model, wrappers,
 * optimizer) run after it reports that rank's memory and traffic. A posted collective completes
 * when waited for or at the second dt_work_test after it was posted (a real run's usual timing;
 * $DTENSOR_SIM_COMPLETE=wait: only when waited for, as on a rank that lags the others, the most
 * communication memory held at once).
 * dt_finalize ends the simulation. DT_ERR_INVALID_USAGE when already initialized. */
DT_API dt_status_t dt_init_simulated(int world_size, int rank);
/* The simulated rank's step time: a clock that kernels advance by the compute model
 * (dt_compute_model_get: matrix-product FLOPs at the GEMM rate, other kernels' bytes at the
 * memory bandwidth, a fixed cost per op) and that collectives advance only when the program waits
 * for them. Collectives run on one communication stream in the order posted, each priced by the
 * cost model of its mesh dims (dt_mesh_set_cost_model) and starting when posted or when the one
 * before it ends; a blocking one is waited for at once, an asynchronous one (dt_work_t: FSDP's
 * prefetched all-gathers, bucketed reductions) when dt_work_wait, dt_work_destroy or a start that
 * needs its slot waits for it, so what the wrappers overlap is hidden as they schedule it. On
 * the host (the "cpu" device) only the compute model's comm_overlap of each collective can hide:
 * the rest occupies the rank when posted (MPI's copies run on its core). Not
 * counted: host-side control values (agreed statuses, host reductions: a few bytes each) and the
 * planner's own time. Times in microseconds since dt_init_simulated or dt_sim_time_reset. */
typedef struct dt_sim_time {
  double elapsed_us;      /* the rank's clock */
  double compute_us;      /* kernels and local redistribution steps */
  double comm_us;         /* collectives on the communication stream (overlapped or not) */
  double exposed_comm_us; /* waits for collectives: elapsed_us - compute_us */
  double flops;           /* matrix-product FLOPs of the kernels run */
  double nbytes;          /* bytes read and written by the other kernels */
  uint64_t ops;           /* kernels run */
} dt_sim_time_t;
/* DT_ERR_INVALID_USAGE unless the library runs a simulated world. */
DT_API dt_status_t dt_sim_time_get(dt_sim_time_t* out);
DT_API dt_status_t dt_sim_time_reset(void);
/* Routing in a simulated run, whose router sees no values: MoE layers take it as balanced (every
 * expert the same share of the rows) times `factor` for the rows this rank's experts receive
 * under expert parallelism (its peers' rows and the all-to-all's bytes), the worst rank of a
 * router that sends that much more than the mean to one rank's experts. 1 (the default at
 * dt_init_simulated) is balanced; DT_ERR_INVALID_ARG outside [1, 1e3] or NaN, DT_ERR_INVALID_USAGE
 * outside a simulation. dt_sim_routing_imbalance reads it (1 outside a simulation). */
DT_API dt_status_t dt_sim_set_routing_imbalance(double factor);
DT_API double dt_sim_routing_imbalance(void);
/* The device a simulated run plays: "cpu" (the default after dt_init_simulated), "cuda" or
 * "cuda-emu". A device makes the simulated kernels those of its kernel set, as a run on one GPU
 * per rank would run them: bf16/f16 storage taken natively or through f32 copies as each kernel
 * does, each kernel's device scratch counted as "other" (attention's workspace and the like, as
 * the kernel sizes it; the kernels' sizes follow an H100 / H200: 227 KiB of shared memory per
 * block), and storage counted at its exact size (the host's storage pool rounds). Choose it after
 * dt_init_simulated and before making tensors. DT_ERR_INVALID_ARG for another name,
 * DT_ERR_INVALID_USAGE outside a simulation or once simulated tensors exist, DT_ERR_UNSUPPORTED
 * when this build has no such kernels (no "cuda" without DTENSOR_CUDA). */
DT_API dt_status_t dt_sim_set_device(const char* backend);
DT_API dt_status_t dt_world_rank(int* rank);
DT_API dt_status_t dt_world_size(int* size);

/* ---- deadlines on collective waits ---------------------------------------------------------
 * Every wait of the library for a collective (blocking collectives, dt_work_wait, the
 * communicator duplicates of dt_init and of asynchronous works) has a deadline: the timeout, in
 * seconds, counted from when the wait starts. It is $DTENSOR_TIMEOUT_S when that is set and not
 * empty (read by dt_init: a positive finite number such as "600" or "2.5"; anything else makes
 * dt_init fail with DT_ERR_INVALID_ARG before it starts MPI), else 600 (PyTorch's NCCL
 * watchdog default). MPI_Comm_split (mesh creation, slicing, flattening) has no non-blocking
 * form in MPI and is not bounded.
 *
 * Past the deadline, since MPI cannot cancel a collective: the library writes one line to stderr,
 *   "[dtensor rank R] DT_ERR_TIMEOUT: all_gather (mesh dim 0, step 1/2 S(0)->R) did not complete
 *    within 2 s ...",
 * calls the timeout handler (when one is set) with that line, and then
 *   - handler unset or returning DT_TIMEOUT_ABORT: aborts the whole job with
 *     MPI_Abort(MPI_COMM_WORLD, DT_ERR_TIMEOUT); the public function never returns;
 *   - handler returning DT_TIMEOUT_RETURN: the public function returns DT_ERR_TIMEOUT with the
 *     line in dt_last_error(). The collective is still posted and owns its buffers (which the
 *     library then never frees), and the communicators it ran on are unusable: make no further
 *     collective call, nor dt_finalize; exit the process (or MPI_Abort) soon. For hosts that exit
 *     on their own terms, and for tests. */
#define DT_TIMEOUT_ABORT 0
#define DT_TIMEOUT_RETURN 1
/* Called once per timeout on the rank that timed out, before the job is aborted; `message` is
 * the line written to stderr (valid during the call). Returns DT_TIMEOUT_ABORT or
 * DT_TIMEOUT_RETURN (see above). */
typedef int (*dt_timeout_fn)(const char* message, void* ctx);

/* Sets the timeout of collective waits started from now on (any time, also before dt_init; a
 * set $DTENSOR_TIMEOUT_S replaces it at dt_init). DT_ERR_INVALID_ARG unless seconds is positive
 * and finite. Per process: every rank should set the same value. */
DT_API dt_status_t dt_set_timeout(double seconds);
/* The current timeout in seconds. */
DT_API dt_status_t dt_get_timeout(double* seconds);
/* Installs the timeout handler (fn NULL: none, the default; the job is then aborted). */
DT_API dt_status_t dt_set_timeout_handler(dt_timeout_fn fn, void* ctx);

/* Creates a mesh of `ndim` dims and `shape[i]` ranks along dim i (collective over the world).
 * names: NULL or ndim distinct non-empty names (at most 31 chars). ranks: NULL lays the world's
 * ranks 0..N-1 out row-major (N must equal the world size); otherwise prod(shape) distinct world
 * ranks in row-major mesh order, and world ranks not listed get a non-member mesh (no local data).
 */
DT_API dt_status_t dt_mesh_create(int ndim, const int* shape, const char* const* names,
                                  const int* ranks, dt_mesh_t* out);
/* Creates an abstract mesh: a shape (and names) only. Needs no MPI. */
DT_API dt_status_t dt_mesh_create_abstract(int ndim, const int* shape, const char* const* names,
                                           dt_mesh_t* out);
/* Drops the caller's reference. NULL is a no-op. */
DT_API dt_status_t dt_mesh_destroy(dt_mesh_t mesh);

/* The backend tensors created on the mesh allocate from and run on (default: dt_backend_default
 * when the mesh was created). Changing it affects tensors created afterwards; existing tensors
 * keep theirs. Sub-meshes and flattened meshes take their parent's. */
DT_API dt_status_t dt_mesh_set_backend(dt_mesh_t mesh, dt_backend_t backend);
DT_API dt_status_t dt_mesh_backend(dt_mesh_t mesh, dt_backend_t* backend);

/* Which communicators carry the tensor data of the mesh's backend. Control values (agreed errors,
 * counts, shapes) always go over Open MPI; device tensors go over NCCL when every member of the
 * mesh has a GPU of its own (NCCL refuses two ranks on one) and $DTENSOR_DATA_COMM is not "mpi",
 * else through host memory over Open MPI ("nccl" makes that an error). The choice is made at the
 * mesh's first collective on device data, by all its members together, and then kept; mesh rank
 * 0 logs why when it falls back. Local: asks nothing of other ranks. */
typedef enum dt_data_plane {
  DT_PLANE_MPI = 0,        /* host memory over Open MPI (host backends; abstract, simulated) */
  DT_PLANE_MPI_STAGED = 1, /* device memory staged through host memory, over Open MPI */
  DT_PLANE_NCCL = 2,       /* device memory over NCCL */
  DT_PLANE_UNDECIDED = 3,  /* a device backend before the mesh's first collective on its data */
} dt_data_plane_t;
DT_API dt_status_t dt_mesh_data_plane(dt_mesh_t mesh, dt_data_plane_t* plane);

DT_API dt_status_t dt_mesh_ndim(dt_mesh_t mesh, int* ndim);
/* Size of mesh dim `dim` (negative counts from the end). */
DT_API dt_status_t dt_mesh_size(dt_mesh_t mesh, int dim, int* size);
/* Writes ndim sizes into shape[]. */
DT_API dt_status_t dt_mesh_shape(dt_mesh_t mesh, int* shape);
/* Total number of ranks in the mesh. */
DT_API dt_status_t dt_mesh_numel(dt_mesh_t mesh, int* numel);
/* This rank's coordinates (ndim ints). DT_ERR_INVALID_USAGE on an abstract or non-member mesh. */
DT_API dt_status_t dt_mesh_coordinate(dt_mesh_t mesh, int* coords);
/* This rank's coordinate along one dim (= its rank in that dim's communicator). */
DT_API dt_status_t dt_mesh_local_rank(dt_mesh_t mesh, int dim, int* rank);
/* 1 if this rank belongs to the mesh (always 0 for an abstract mesh). */
DT_API dt_status_t dt_mesh_is_member(dt_mesh_t mesh, int* member);
DT_API dt_status_t dt_mesh_is_abstract(dt_mesh_t mesh, int* abstract);
/* Name of a dim ("" when unnamed). The string lives as long as the mesh. */
DT_API dt_status_t dt_mesh_dim_name(dt_mesh_t mesh, int dim, const char** name);
/* Index of the dim called `name`. */
DT_API dt_status_t dt_mesh_dim_index(dt_mesh_t mesh, const char* name, int* dim);
/* World rank of the process at `coords`. */
DT_API dt_status_t dt_mesh_rank_at(dt_mesh_t mesh, const int* coords, int* world_rank);

/* Sub-mesh made of the named dims (in the given order, which must follow the mesh's order), for
 * this rank's coordinates in the other dims. Collective over the world for real meshes. A name may
 * also be that of a flattened dim created by dt_mesh_flatten. */
DT_API dt_status_t dt_mesh_slice(dt_mesh_t mesh, int nnames, const char* const* names,
                                 dt_mesh_t* out);
/* Flattens mesh dims dims[0] < dims[1] < ... into one dim called `name` (may be NULL): registers
 * a communicator over them in `mesh` (used by the planner to merge collectives) and returns the
 * flattened 1-D mesh in *out (out may be NULL when only the registration is wanted). Ranks are
 * ordered row-major over the flattened dims. Collective over the world for real meshes. */
DT_API dt_status_t dt_mesh_flatten(dt_mesh_t mesh, int ndims, const int* dims, const char* name,
                                   dt_mesh_t* out);

/* Collective over the ranks of the mesh that share this rank's coordinates on every dim not in
 * dims[0 .. n_dims) (n_dims 0 or dims NULL: every dim). Reduces `numel` values of host memory
 * `buf` in place (dtype f32, i32 or i64; op sum, avg, max or min; avg truncates integers): how
 * control values (counts, norms, flags) computed from tensors of any backend are combined.
 * A one-rank mesh, an abstract mesh or a non-member returns at once with buf unchanged. Like an
 * MPI reduction, numel, dtype, op and dims must be the same on every rank of the group: they are
 * not exchanged (that would double the cost of every call), so a rank-dependent count fails or
 * reduces garbage on some ranks (DT_ERR_MPI on others). */
DT_API dt_status_t dt_mesh_all_reduce_host(dt_mesh_t mesh, int n_dims, const int* dims, void* buf,
                                           int64_t numel, dt_dtype_t dtype, dt_reduce_op_t op);

/* Agrees on a status that only some ranks may have (an argument check, a local allocation)
 * before a collective step, so that a failure on one rank fails every rank instead of leaving
 * the others waiting in the next collective: collective over the mesh's members (one 8-byte
 * all-reduce, and a 512-byte broadcast when some rank failed). Every member returns DT_SUCCESS
 * when every member passed DT_SUCCESS, else the same status, the highest code passed. A failing
 * rank keeps its own message (the library's last error: a caller's own check should leave one,
 * e.g. a failed call's); the others get one naming `what` (the step, e.g. "wrapping layers.3";
 * NULL: "a step"), the lowest rank that passed that code, and its message. st out of the
 * dt_status_t range counts as DT_ERR_INVALID_ARG. An abstract mesh, a one-rank mesh or a
 * non-member returns st at once. The wrappers (dt_fully_shard, dt_data_parallel,
 * dt_parallelize_module) agree on their argument checks this way. */
DT_API dt_status_t dt_mesh_agree(dt_mesh_t mesh, dt_status_t st, const char* what);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_MESH_H */

/* mesh.h - internal interface of the mesh layer: the library context (world, workspace,
 * counters) and device meshes with their communicators. */
#ifndef DT_MESH_MESH_H
#define DT_MESH_MESH_H

#include "backend/backend.h"
#include "comm/comm.h"
#include "dtensor/redistribute.h" /* dt_counters_t, dt_collective_t */
#include "placement/layout.h"

#define DT_MAX_FLAT 8
#define DT_ASYNC_SLOTS 8 /* asynchronous redistributions in flight per mesh, each on its own
                            duplicates of the mesh's communicators (see src/redistribute/work.c) */

/* ---- library context (src/mesh/context.c) -------------------------------------------------- */
/* Sets up the world after the comm layer started (dt_init); tears the layer down (dt_finalize):
 * releases the workspace and the communicators of meshes still alive. */
dt_status_t dt__ctx_init(void);
/* The same for a simulated world (dt_init_simulated): `size` ranks, this process `rank`, no MPI. */
dt_status_t dt__ctx_init_simulated(int size, int rank);
/* 1 while the world is simulated: meshes get simulated communicators and the meta backend. */
int dt__ctx_simulated(void);
void dt__ctx_finalize(void);
int dt__ctx_initialized(void);
/* 1 once dt_finalize has run (until the next dt_init): nothing may be kept for later use. */
int dt__ctx_finalized(void);
int dt__world_rank(void); /* -1 before dt_init */
int dt__world_size(void); /* 0 before dt_init */
dt_status_t dt__require_init(const char* what);

/* Persistent host array for collective counts and displacements of blocking calls (grow-only,
 * reused); the byte workspace belongs to each backend (dt__ws_reserve). */
dt_status_t dt__ws_counts(size_t count, int64_t** out);

/* ---- meshes (src/mesh/mesh.c) -------------------------------------------------------------- */
typedef struct dt_flat_group {
  unsigned mask; /* mesh dims flattened */
  char name[DT_NAME_MAX];
  dt_comm_t comm;
} dt_flat_group_t;

/* An asynchronous slot's duplicate of the communicator over `mask` (0: unused). */
typedef struct dt_slot_comm {
  unsigned mask;
  dt_comm_t comm;
} dt_slot_comm_t;
#define DT_SLOT_COMMS (DT_MAX_MESH_DIMS + DT_MAX_FLAT + 1)

/* The device data plane of a mesh: its communicators again, over NCCL, for the tensor data of
 * one CUDA backend (the MPI ones stay the control plane and carry host memory). */
typedef struct dt_mesh_plane {
  dt_backend_t backend;
  dt_comm_t all;
  dt_comm_t dim[DT_MAX_MESH_DIMS];
  dt_comm_t flat[DT_MAX_FLAT]; /* parallel to the mesh's flat[] */
  dt_slot_comm_t slot[DT_ASYNC_SLOTS][DT_SLOT_COMMS];
} dt_mesh_plane_t;

extern const dt_handle_kind_t dt__mesh_kind;

struct dt_mesh {
  int refcount; /* the caller's handle (while user_ref) + tensors, works and sub-meshes */
  int user_ref;  /* 1 until dt_mesh_destroy */
  uint64_t id;         /* unique for the process lifetime (handles may be reused after free) */
  uint64_t generation; /* bumped when the mesh gains a flattened dim (plans may change) */
  int ndim;
  int shape[DT_MAX_MESH_DIMS];
  char names[DT_MAX_MESH_DIMS][DT_NAME_MAX];
  int abstract;
  int simulated; /* made under dt_init_simulated: simulated communicators, meta backend */
  int member;
  dt_backend_t backend; /* where tensors created on the mesh live */
  int coords[DT_MAX_MESH_DIMS];
  int numel;
  int* ranks; /* world rank of each mesh position, row-major (NULL when abstract) */
  dt_comm_t dim_comm[DT_MAX_MESH_DIMS];
  dt_comm_t all_comm; /* all members, ranked row-major */
  dt_flat_group_t flat[DT_MAX_FLAT];
  int nflat;
  dt_counters_t counters;
  /* cost parameters per mesh dim (dt_mesh_set_cost_model): dim_cost_set[d] bit c * DT_ALGO_COUNT
   * + a says dim_cost[d][c][a] replaces the global model's for steps on dim d */
  dt_cost_params_t dim_cost[DT_MAX_MESH_DIMS][DT_COLL_COUNT][DT_ALGO_COUNT];
  uint32_t dim_cost_set[DT_MAX_MESH_DIMS];
  /* asynchronous slots: the work holding each, and its duplicates of the communicators (one per
   * mask used: single dims, flattened groups, all dims), created on first use */
  struct dt__work* slot_owner[DT_ASYNC_SLOTS];
  dt_slot_comm_t slot_comm[DT_ASYNC_SLOTS][DT_SLOT_COMMS];
  /* which plane carries device data (dt__mesh_data_plane): 0 not decided yet, 1 NCCL (dev),
   * -1 MPI with host staging */
  int dev_state;
  dt_mesh_plane_t* dev;
  struct dt_mesh *next, *prev; /* live meshes (counter resets, finalize) */
};

void dt__mesh_retain(dt_mesh_t m);
void dt__mesh_release(dt_mesh_t m);
/* Agrees on a status that only some ranks may see (a rank-local buffer, data-dependent indices):
 * collective over the mesh's members (one 8-byte all-reduce); when any had a failure every
 * member returns the same status (the highest code), with its own message where it failed and
 * one naming the failing rank elsewhere. Abstract meshes, non-members and one-rank meshes return st at once. */
dt_status_t dt__mesh_agree(dt_mesh_t m, dt_status_t st, const char* what);
/* DT_SUCCESS for a live mesh handle, else DT_ERR_INVALID_ARG with a message. */
dt_status_t dt__mesh_check(dt_mesh_t m);
/* Communicator over the mesh dims in `mask` (a single dim, a flattened group, or all dims).
 * NULL when none exists. */
dt_comm_t* dt__mesh_group_comm(dt_mesh_t m, unsigned mask);
/* Which plane carries backend b's tensor data on mesh m: *nccl = 1 when the mesh's NCCL plane
 * does (device memory moves as it is), 0 for MPI (host memory: a device backend stages through
 * it). For a device backend the first call decides, collectively over the mesh's members (it
 * runs at each member's first collective on device data of the mesh): NCCL when the build has
 * it for b, every member has a GPU of its own (NCCL refuses two ranks on one) and
 * $DTENSOR_DATA_COMM is not "mpi"; "nccl" makes anything else an error. The NCCL plane is made
 * then (an NCCL communicator bootstrapped over the mesh's MPI one, split per dim and flattened
 * group) and kept for the first device backend that asked; others stage through MPI. */
dt_status_t dt__mesh_data_plane(dt_mesh_t m, dt_backend_t b, int* nccl);
/* The communicator over `mask` that carries backend b's data (after dt__mesh_data_plane): the
 * NCCL plane's when it carries b, else the MPI one (dt__mesh_group_comm). NULL when none. */
dt_comm_t* dt__mesh_data_comm(dt_mesh_t m, dt_backend_t b, unsigned mask);
/* The duplicate of the data communicator over `mask` for backend b (as dt__mesh_data_comm) that
 * asynchronous slot `slot` uses, created on first use (collective over that communicator: every
 * rank starts the work at the same point). */
dt_status_t dt__mesh_slot_comm(dt_mesh_t m, dt_backend_t b, int slot, unsigned mask,
                               dt_comm_t** out);
/* Closes the communicators of every live mesh (dt_finalize: MPI goes away; a later collective on
 * such a mesh fails with DT_ERR_NOT_INITIALIZED, see dt__comm_close). */
void dt__mesh_close_all_comms(void);
/* Resets the counters of every live mesh. */
void dt__mesh_reset_all_counters(void);

/* ---- counters (src/mesh/context.c): per mesh and summed over all meshes ---------------------- */
/* One collective on the mesh dims `mask` moving nbytes (nccl-tests convention). */
void dt__count_collective(dt_mesh_t m, unsigned mask, dt_collective_t c, uint64_t nbytes);
/* One redistribution that ran a plan. */
void dt__count_redistribute(dt_mesh_t m);
/* One plan-cache lookup (hit or miss). */
void dt__count_plan_lookup(dt_mesh_t m, int hit);

#endif

/* core.h - internal definitions of the library context, meshes, plans and tensors.
 *
 * Shared by the mesh, redistribute and tensor layers. Each struct is owned by one layer; the
 * others read it.
 */
#ifndef DT_INTERNAL_CORE_H
#define DT_INTERNAL_CORE_H

#include "dtensor/tensor.h"
#include "internal/backend.h"
#include "internal/common.h"

#define DT_NAME_MAX 32
#define DT_MAX_FLAT 8

/* ---- library context (src/mesh/context.c) ------------------------------------------------- */
typedef struct dt_workspace {
  void* buf[4]; /* 0: send packing, 1-2: ping-pong intermediates, 3: receive unpacking */
  size_t cap[4];
  int* ints; /* counts/displs arrays */
  size_t ints_cap;
} dt_workspace_t;

typedef struct dt_ctx {
  int initialized;
  int we_init_mpi;
  int world_rank, world_size;
  dt_workspace_t ws;
  dt_counters_t counters; /* all meshes */
  struct dt_mesh* meshes; /* live meshes (for counter resets) */
} dt_ctx_t;

extern dt_ctx_t dt__ctx;

/* Grows workspace slot `slot` to at least nbytes (no-op when big enough). */
dt_status_t dt__ws_reserve(int slot, size_t nbytes, void** out);
dt_status_t dt__ws_ints(size_t count, int** out);
void dt__ws_release(void);
dt_status_t dt__require_init(const char* what);
/* Upper layers register cleanups run by dt_finalize (keeps lower layers unaware of them). */
void dt__at_finalize(void (*fn)(void));

/* ---- storage pool (src/core/pool.c): large tensor buffers are cached for reuse ---- */
void* dt__pool_alloc(size_t nbytes, int zero);
void dt__pool_free(void* p, size_t nbytes);

/* ---- mesh (src/mesh/mesh.c) ---------------------------------------------------------------- */
typedef struct dt_flat_group {
  unsigned mask; /* mesh dims flattened */
  char name[DT_NAME_MAX];
  dt_comm_t comm;
} dt_flat_group_t;

struct dt_plan_cache;

#define DT_MESH_MAGIC 0x4d455348u
#define DT_TENSOR_MAGIC 0x54454e53u

struct dt_mesh {
  uint32_t magic;
  int refcount;
  uint64_t id; /* unique for the process lifetime (handles may be reused after free) */
  int ndim;
  int shape[DT_MAX_MESH_DIMS];
  char names[DT_MAX_MESH_DIMS][DT_NAME_MAX];
  int abstract;
  int member;
  int coords[DT_MAX_MESH_DIMS];
  int numel;
  int* ranks; /* world rank of each mesh position, row-major (NULL when abstract) */
  dt_comm_t dim_comm[DT_MAX_MESH_DIMS];
  dt_comm_t all_comm; /* all members, ranked row-major */
  dt_flat_group_t flat[DT_MAX_FLAT];
  int nflat;
  dt_counters_t counters;
  struct dt_plan_cache* cache;
  struct dt_mesh *next, *prev;
};

void dt__mesh_retain(dt_mesh_t m);
void dt__mesh_release(dt_mesh_t m);
dt_status_t dt__mesh_check(dt_mesh_t m);
/* Communicator over the mesh dims in `mask` (a single dim, a flattened group, or all dims).
 * NULL when none exists. */
dt_comm_t* dt__mesh_group_comm(dt_mesh_t m, unsigned mask);
/* 1 if the caller flattened exactly `mask` (the planner merges only onto those). */
int dt__mesh_has_flat(dt_mesh_t m, unsigned mask);
/* Records one collective in the mesh's and the global counters. */
void dt__count(dt_mesh_t m, unsigned mask, dt_collective_t c, uint64_t nbytes);

/* ---- layout (src/placement/layout.c) ------------------------------------------------------- */
/* Validated description of a distributed layout. */
typedef struct dt_layout {
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int mesh_ndim;
  int mesh_shape[DT_MAX_MESH_DIMS];
  dt_placement_t pl[DT_MAX_MESH_DIMS]; /* normalized */
} dt_layout_t;

/* Box (offset, len per tensor dim) held at mesh coordinates `coords`. */
void dt__layout_box(const dt_layout_t* l, const int* coords, int64_t* off, int64_t* len);
int64_t dt__box_numel(int ndim, const int64_t* len);
/* Copies the box `ext` at src_off within a src array of extent src_shape into dst_off within dst
 * (extent dst_shape). Row-major; element size `item`. */
void dt__box_copy(int ndim, size_t item, const int64_t* ext, void* dst, const int64_t* dst_shape,
                  const int64_t* dst_off, const void* src, const int64_t* src_shape,
                  const int64_t* src_off);
/* If box (off, ext) is one contiguous range of an array of extent `shape`, stores its starting
 * element in *start and returns 1. */
int dt__box_contiguous(int ndim, const int64_t* shape, const int64_t* off, const int64_t* ext,
                       int64_t* start);
/* Validates and normalizes shape/placements against a mesh into *l. */
dt_status_t dt__layout_init(dt_layout_t* l, int mesh_ndim, const int* mesh_shape, int ndim,
                            const int64_t* shape,
                            const dt_placement_t* pl);

/* ---- plan (src/redistribute) ---------------------------------------------------------------- */
typedef struct dt_step {
  dt_collective_t coll;
  unsigned mask; /* mesh dims touched */
  dt_placement_t before[DT_MAX_MESH_DIMS];
  dt_placement_t after[DT_MAX_MESH_DIMS]; /* full placement lists */
  uint64_t nbytes;
  double cost_us;
} dt_step_t;

#define DT_MAX_STEPS 16

struct dt_plan {
  int refcount;
  dt_layout_t src; /* source layout (dst is src.shape with the last step's `after`) */
  dt_placement_t dst[DT_MAX_MESH_DIMS];
  dt_dtype_t dtype;
  int nsteps;
  dt_step_t steps[DT_MAX_STEPS];
  double cost_us;
};

/* Finds (cached per mesh) the optimal plan. Borrowed pointer owned by the mesh cache (valid until
 * the mesh dies or the cost model changes); retain with plan->refcount++ to keep it longer. */
dt_status_t dt__plan_get(dt_mesh_t mesh, dt_dtype_t dtype, const dt_layout_t* src,
                         const dt_placement_t* dst, struct dt_plan** out);
void dt__plan_release(struct dt_plan* p);
void dt__plan_cache_destroy(struct dt_plan_cache* c);
void dt__plan_cache_clear(struct dt_plan_cache* c);
/* Cost model generation: bumps on every change so caches notice. */
uint64_t dt__cost_generation(void);
double dt__cost_of(dt_collective_t c, int n, uint64_t nbytes);
/* The same as cost = a + b * nbytes. */
void dt__cost_linear(dt_collective_t c, int n, double* a, double* b);
dt_status_t dt__cost_model_autoload(void);

/* Executes a plan: src buffer (source layout's local box) -> dst buffer (target's local box). */
dt_status_t dt__plan_execute(dt_mesh_t mesh, const struct dt_plan* p, const void* src, void* dst);

/* ---- tensor (src/tensor/tensor.c) ---------------------------------------------------------- */
struct dt_tensor {
  uint32_t magic;
  dt_mesh_t mesh;
  dt_dtype_t dtype;
  dt_layout_t layout;
  int64_t local_off[DT_MAX_DIMS];
  int64_t local_shape[DT_MAX_DIMS];
  int64_t local_numel;
  void* data;
  int owns;
};

/* A tensor with owned storage, zero-filled or not (for outputs a kernel writes in full). */
dt_status_t dt__tensor_new(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* pl, int zero, dt_tensor_t* out);

#endif

/* tensor.h - internal interface of the tensor layer: the distributed tensor object.
 *
 * A tensor is a layout (global shape, placements on a mesh) plus this rank's local shard: a dense
 * row-major run of `local_numel` elements at byte `offset` of a reference-counted storage object.
 * Views made by the shape ops share their input's storage (dispatch decides where that is exact);
 * the storage lives until its last tensor is destroyed. A meta tensor has a layout and no storage:
 * ops and redistributions on meta tensors plan and trace without moving data (abstract meshes
 * included).
 */
#ifndef DT_TENSOR_TENSOR_H
#define DT_TENSOR_TENSOR_H

#include "dtensor/ops.h" /* dt_trace_event_t */
#include "dtensor/tensor.h"
#include "redistribute/redistribute.h"

extern const dt_handle_kind_t dt__tensor_kind;

struct dt_tensor {
  dt_mesh_t mesh;
  dt_dtype_t dtype;
  dt_layout_t layout;
  int64_t local_off[DT_MAX_DIMS];
  int64_t local_shape[DT_MAX_DIMS];
  int64_t local_numel;
  dt_storage_t* storage; /* NULL for a meta tensor */
  size_t offset;         /* bytes into the storage */
  void* data;            /* storage->ptr + offset (NULL for a meta tensor) */
  int meta;
  int held; /* owned by a variable (autograd): dt_tensor_destroy refuses it */
  int rank_local; /* dt_tensor_set_rank_local: values differ per rank despite Replicate */
};

/* DT_SUCCESS for a live tensor handle, else DT_ERR_INVALID_ARG for NULL and DT_ERR_INVALID_USAGE
 * ("<what> is not a live dt_tensor_t") for anything else (see dtensor/handle.h).
 * The one handle check: every layer above uses it. */
dt_status_t dt__tensor_check(dt_tensor_t t, const char* what);
/* Destroys a tensor whatever holds it (the holder's own release). */
void dt__tensor_free(dt_tensor_t t);
/* A tensor with owned storage on the mesh's backend, zero-filled or not (for outputs a kernel
 * writes in full). */
dt_status_t dt__tensor_new(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* pl, int zero, dt_tensor_t* out);
/* A meta tensor (layout only) on any mesh, abstract meshes included. */
dt_status_t dt__tensor_meta(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                            const dt_placement_t* pl, dt_tensor_t* out);
/* A tensor of the given layout whose local shard is `base`'s storage from byte `offset` on (its
 * local bytes must fit). The view keeps the storage alive. */
dt_status_t dt__tensor_alias(dt_tensor_t base, size_t offset, dt_dtype_t dtype, int ndim,
                             const int64_t* shape, const dt_placement_t* pl, dt_tensor_t* out);
/* The same, a tensor of `mesh` (another view of base's ranks with base's backend). */
dt_status_t dt__tensor_alias_on(dt_mesh_t mesh, dt_tensor_t base, size_t offset, dt_dtype_t dtype,
                                int ndim, const int64_t* shape, const dt_placement_t* pl,
                                dt_tensor_t* out);
/* 1 when another tensor may see the tensor's bytes (its storage has other references or is
 * borrowed from the caller). */
int dt__tensor_shared(dt_tensor_t t);
/* A copy with its own storage (same layout, same backend). */
dt_status_t dt__tensor_clone(dt_tensor_t t, dt_tensor_t* out);
/* DT_ERR_INVALID_ARG (naming `what` and the value) unless v fits `dtype`: truncated toward zero
 * into an integer dtype (NaN and infinities never do), a finite magnitude at most the largest
 * finite value into a float one (NaN and infinities do). The check before a value is stored
 * (factories, fills), as PyTorch's scalar conversion. */
dt_status_t dt__fill_check(dt_dtype_t dtype, double v, const char* what);
/* Local bytes of the tensor's shard. */
size_t dt__tensor_nbytes(dt_tensor_t t);
/* The backend of a tensor's data (the mesh's for a meta tensor). */
dt_backend_t dt__tensor_backend(dt_tensor_t t);
/* 1 when a and b may share memory: the same tensor, or views of one storage object at the same
 * offset (both answers are the same on every rank), or local shards that share bytes (views, or
 * borrowed buffers; a rank holding an empty shard cannot see this case). */
int dt__tensor_overlap(dt_tensor_t a, dt_tensor_t b);

/* ---- tracing (dt_trace_set): the callback, the current depth, and the input being moved ---- */
int dt__trace_active(void);
/* Fills depth (and input for redistributions) and calls the callback. */
void dt__trace_emit(dt_trace_event_t* e);
/* Depth changes around a composite's pieces; the input index around an op's input moves. */
void dt__trace_enter(void);
void dt__trace_leave(void);
void dt__trace_input(int input);

#endif

/* tensor.h - internal interface of the tensor layer: the distributed tensor object. */
#ifndef DT_TENSOR_TENSOR_H
#define DT_TENSOR_TENSOR_H

#include "dtensor/tensor.h"
#include "redistribute/redistribute.h"

#define DT_TENSOR_MAGIC 0x54454e53u

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

/* DT_SUCCESS for a live tensor handle, else DT_ERR_INVALID_ARG ("<what> is not a live tensor").
 * The one handle check: every layer above uses it. */
dt_status_t dt__tensor_check(dt_tensor_t t, const char* what);
/* A tensor with owned storage, zero-filled or not (for outputs a kernel writes in full). */
dt_status_t dt__tensor_new(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* pl, int zero, dt_tensor_t* out);
/* Local bytes of the tensor's shard. */
size_t dt__tensor_nbytes(dt_tensor_t t);

#endif

/* dtensor/placement.h - placements (Shard, Replicate, Partial), dtypes and the chunk rule.
 *
 * A distributed tensor carries one placement per mesh dimension:
 *   Shard(d)     tensor dim d is split over the ranks of that mesh dim (torch.chunk layout);
 *   Replicate    every rank of that mesh dim holds the same values;
 *   Partial(op)  every rank holds one operand of a pending reduction (sum, avg, max, min).
 * A placement list may not mix Partial(max) or Partial(min) with another kind of Partial (the
 * reductions do not commute; PyTorch refuses it too): layouts, tensors and plans of such a list
 * are DT_ERR_INVALID_ARG. Partial(sum) and Partial(avg) may mix.
 * Text forms: "S(0)", "R", "P(sum)"; on input also "S0", "S(-1)", "P" (= sum), "Shard(0)",
 * "Replicate", "Partial(max)". Everything here is pure and needs no MPI.
 */
#ifndef DTENSOR_PLACEMENT_H
#define DTENSOR_PLACEMENT_H

#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_DIMS 8      /* maximum tensor rank */
#define DT_MAX_MESH_DIMS 4 /* maximum device-mesh rank */

typedef enum dt_dtype {
  DT_F32 = 0,
  DT_BF16 = 1,
  DT_F16 = 2,
  DT_I32 = 3,
  DT_I64 = 4,
  DT_DTYPE_COUNT
} dt_dtype_t;

typedef enum dt_placement_kind {
  DT_REPLICATE = 0,
  DT_SHARD = 1,
  DT_PARTIAL = 2,
  DT_PLACEMENT_KIND_COUNT
} dt_placement_kind_t;

typedef enum dt_reduce_op {
  DT_REDUCE_SUM = 0,
  DT_REDUCE_AVG = 1,
  DT_REDUCE_MAX = 2,
  DT_REDUCE_MIN = 3,
  DT_REDUCE_COUNT
} dt_reduce_op_t;

/* A plain value. `dim` is meaningful for DT_SHARD only, `op` for DT_PARTIAL only; keep the
 * unused field 0 (the constructors below do) so that memcmp-equality holds. */
typedef struct dt_placement {
  int32_t kind; /* dt_placement_kind_t */
  int32_t dim;  /* Shard: tensor dim (negative counts from the end until normalized) */
  int32_t op;   /* Partial: dt_reduce_op_t */
} dt_placement_t;

static inline dt_placement_t dt_shard(int dim) {
  dt_placement_t p = {DT_SHARD, dim, 0};
  return p;
}
static inline dt_placement_t dt_replicate(void) {
  dt_placement_t p = {DT_REPLICATE, 0, 0};
  return p;
}
static inline dt_placement_t dt_partial(dt_reduce_op_t op) {
  dt_placement_t p = {DT_PARTIAL, 0, (int32_t)op};
  return p;
}

/* 1 if equal (same kind and, where meaningful, same dim / op), else 0. */
DT_API int dt_placement_equal(dt_placement_t a, dt_placement_t b);

/* Parses one placement ("S(0)", "S0", "S(-1)", "R", "P", "P(avg)", "Shard(1)", "Replicate",
 * "Partial(max)"); surrounding spaces are ignored. DT_ERR_INVALID_ARG on anything else. */
DT_API dt_status_t dt_placement_parse(const char* text, dt_placement_t* out);
/* Parses a comma-separated list ("S0,R" or "S(0),P(sum)") into out[0..*n). At most `cap`. */
DT_API dt_status_t dt_placements_parse(const char* text, dt_placement_t* out, int cap, int* n);
/* Writes the canonical text ("S(0)", "R", "P(sum)") into buf (NUL-terminated). */
DT_API dt_status_t dt_placement_format(dt_placement_t p, char* buf, size_t cap);
/* Writes placements concatenated ("S(0)R" or, with sep=",", "S(0),R"). */
DT_API dt_status_t dt_placements_format(const dt_placement_t* p, int n, const char* sep, char* buf,
                                        size_t cap);
/* Normalizes a negative shard dim against the tensor rank; checks the dim and the op range. */
DT_API dt_status_t dt_placement_normalize(dt_placement_t* p, int tensor_ndim);

/* One placement as one integer (what the placement-list arguments of ops hold, e.g. the target of
 * a recorded redistribution): kind | op << 4 | (dim & 0xff) << 8, the field the kind does not use
 * as 0. encode returns -1 (which decode refuses) for a kind or reduce op out of range or a Shard
 * dim outside -DT_MAX_DIMS..DT_MAX_DIMS-1; decode checks the ranges. */
DT_API int64_t dt_placement_encode(dt_placement_t p);
DT_API dt_status_t dt_placement_decode(int64_t code, dt_placement_t* out);

/* torch.chunk rule: a dim of `size` over `nparts` ranks; chunk c = ceil(size/nparts); part `index`
 * starts at c*index and has max(0, min(size, c*(index+1)) - c*index) elements.
 * 13 over 4 -> 4,4,4,1; 5 over 4 -> 2,2,1,0. */
DT_API dt_status_t dt_chunk(int64_t size, int nparts, int index, int64_t* offset, int64_t* len);

/* The box, offset[d] and len[d] per tensor dim, that mesh coordinate coords[0..mesh_ndim) holds
 * of a tensor of shape[0..ndim) placed by placements[0..mesh_ndim) on a mesh of mesh_shape: the
 * chunk rule above per sharded mesh dim, applied in mesh-dim order (so two mesh dims sharding one
 * tensor dim nest: the second splits the first's chunk); Replicate and Partial leave a dim whole.
 * Any rank's shard, computed anywhere and without a mesh (a checkpoint's writer and reader
 * intersect such boxes). A shard may be empty (some len 0). DT_ERR_INVALID_ARG naming the bad
 * shape, placement, mesh shape or coordinate. */
DT_API dt_status_t dt_placements_box(int ndim, const int64_t* shape, int mesh_ndim,
                                     const int* mesh_shape, const dt_placement_t* placements,
                                     const int* coords, int64_t* offset, int64_t* len);

/* dtypes */
DT_API dt_status_t dt_dtype_itemsize(dt_dtype_t dtype, size_t* nbytes);
DT_API const char* dt_dtype_name(dt_dtype_t dtype); /* "f32"...; "invalid" when out of range */
DT_API dt_status_t dt_dtype_parse(const char* text, dt_dtype_t* out);
DT_API const char* dt_reduce_op_name(dt_reduce_op_t op); /* "sum"...; "invalid" out of range */

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_PLACEMENT_H */

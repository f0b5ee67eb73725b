/* layout.h - internal interface of the placement layer: validated layouts and boxes.
 *
 * A layout (global shape, mesh shape, placements) gives every mesh coordinate a box, one
 * (offset, len) per tensor dim. Redistribution, tensors and op checks all reason in boxes. Pure.
 */
#ifndef DT_PLACEMENT_LAYOUT_H
#define DT_PLACEMENT_LAYOUT_H

#include "internal/common.h"

/* Validated description of a distributed layout. */
typedef struct dt_layout {
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int mesh_ndim;
  int mesh_shape[DT_MAX_MESH_DIMS];
  dt_placement_t pl[DT_MAX_MESH_DIMS]; /* normalized */
} dt_layout_t;

/* 1 when pl[0..n) hold Partial(max) or Partial(min) on one mesh dim and another kind of Partial
 * on another (*i, *j: the two mesh dims; either may be NULL): such reductions do not commute,
 * so no layout may hold them (PyTorch refuses them too); sum and avg may mix. */
int dt__placements_mixed(int n, const dt_placement_t* pl, int* i, int* j);
/* Validates and normalizes shape/placements against a mesh shape into *l (refusing mixed
 * Partials, see above). */
dt_status_t dt__layout_init(dt_layout_t* l, int mesh_ndim, const int* mesh_shape, int ndim,
                            const int64_t* shape, const dt_placement_t* pl);
/* The same without a message: 1 on success, 0 when the layout is invalid (for checks that probe
 * candidates; a successful public call must leave dt_last_error() alone). */
int dt__layout_try(dt_layout_t* l, int mesh_ndim, const int* mesh_shape, int ndim,
                   const int64_t* shape, const dt_placement_t* pl);
/* Box (offset, len per tensor dim) held at mesh coordinates `coords`. */
void dt__layout_box(const dt_layout_t* l, const int* coords, int64_t* off, int64_t* len);
int64_t dt__box_numel(int ndim, const int64_t* len);
/* Intersection of boxes a and b (an empty box has some len 0). */
void dt__box_intersect(int ndim, const int64_t* ao, const int64_t* al, const int64_t* bo,
                       const int64_t* bl, int64_t* off, int64_t* len);
/* The n blocks of a row-major array of `shape` that are ranges along dim `dim` (block q: indices
 * [offs[q], offs[q] + lens[q]) there, the whole extent elsewhere) between the array and `packed`,
 * which holds the blocks back to back in order, each row-major; to_packed: array -> packed, else
 * packed -> array. One pass over the array (the blocks interleave row by row), so packing costs
 * what one memcpy does. Host memory. */
void dt__split_copy(int ndim, size_t item, const int64_t* shape, int dim, int n,
                    const int64_t* offs, const int64_t* lens, void* array, void* packed,
                    int to_packed);
/* Copies the box `ext` at src_off within a src array of extent src_shape into dst_off within dst
 * (extent dst_shape). Row-major; element size `item`. Host memory (the CPU backend's box copy). */
void dt__box_copy(int ndim, size_t item, const int64_t* ext, void* dst, const int64_t* dst_shape,
                  const int64_t* dst_off, const void* src, const int64_t* src_shape,
                  const int64_t* src_off);
/* If box (off, ext) is one contiguous range of an array of extent `shape`, stores its starting
 * element in *start and returns 1. */
int dt__box_contiguous(int ndim, const int64_t* shape, const int64_t* off, const int64_t* ext,
                       int64_t* start);

#endif

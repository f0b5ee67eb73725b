/* layout.c - boxes: which global index ranges a mesh coordinate holds, and box copies.
 *
 * A layout (global shape, mesh shape, placements) gives every mesh coordinate a box, one
 * (offset, len) per tensor dim, by applying the chunk rule for each sharded mesh dim in mesh-dim
 * order. The executor expresses every pack and unpack as a copy between boxes. Pure.
 */
#include "placement/layout.h"

int dt__placements_mixed(int n, const dt_placement_t* pl, int* i, int* j) {
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++)
      if (pl[a].kind == DT_PARTIAL && pl[b].kind == DT_PARTIAL && pl[a].op != pl[b].op &&
          (pl[a].op == DT_REDUCE_MAX || pl[a].op == DT_REDUCE_MIN)) {
        if (i) *i = a;
        if (j) *j = b;
        return 1;
      }
  return 0;
}

/* Validates and normalizes; `quiet` skips the messages (callers probing many candidates). */
static dt_status_t dt__layout_fill(dt_layout_t* l, int mesh_ndim, const int* mesh_shape, int ndim,
                                   const int64_t* shape, const dt_placement_t* pl, int quiet) {
#define DT__LFAIL(...) (quiet ? DT_ERR_INVALID_ARG : DT_FAIL(DT_ERR_INVALID_ARG, __VA_ARGS__))
  memset(l, 0, sizeof *l);
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return DT__LFAIL("tensor ndim %d out of range [0, %d]", ndim, DT_MAX_DIMS);
  if (ndim > 0 && shape == NULL) return DT__LFAIL("shape is NULL");
  if (pl == NULL) return DT__LFAIL("placements is NULL");
  int64_t bound = 1; /* the product of the non-zero dims: an empty tensor's other dims are
                     * bounded too, since shape code multiplies them (reshape, flatten) */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return DT__LFAIL("shape[%d] = %lld is negative", d, (long long)shape[d]);
    if (shape[d] > 0 && (!dt__mul_i64(bound, shape[d], &bound) || bound > ((int64_t)1 << 48)))
      return DT__LFAIL("tensor too large (more than 2^48 elements, or dims whose product is, "
                       "besides a dim of 0)");
    l->shape[d] = shape[d];
  }
  l->ndim = ndim;
  l->mesh_ndim = mesh_ndim;
  for (int i = 0; i < mesh_ndim; i++) {
    dt_placement_t p = pl[i];
    l->mesh_shape[i] = mesh_shape[i];
    if (p.kind == DT_SHARD && (p.dim < -ndim || p.dim >= ndim))
      return DT__LFAIL("placement for mesh dim %d: Shard dim %d out of range for a %d-dim tensor",
                       i, p.dim, ndim);
    if (p.kind == DT_SHARD) {
      p.dim = p.dim < 0 ? p.dim + ndim : p.dim;
      p.op = 0;
    } else if (p.kind == DT_PARTIAL && p.op >= 0 && p.op < DT_REDUCE_COUNT) {
      p.dim = 0;
    } else if (p.kind == DT_REPLICATE) {
      p.dim = p.op = 0;
    } else if (quiet) {
      return DT_ERR_INVALID_ARG;
    } else {
      DT_CHECK(dt_placement_normalize(&p, ndim)); /* the message for a bad kind or op */
    }
    l->pl[i] = p;
  }
  int i, j;
  if (dt__placements_mixed(mesh_ndim, l->pl, &i, &j))
    return DT__LFAIL("placements mix Partial(%s) (mesh dim %d) with Partial(%s) (mesh dim %d): a "
                     "max or min reduction does not commute with another kind, so the value "
                     "would depend on their order (only sum and avg may mix)",
                     dt_reduce_op_name((dt_reduce_op_t)l->pl[i].op), i,
                     dt_reduce_op_name((dt_reduce_op_t)l->pl[j].op), j);
  return DT_SUCCESS;
#undef DT__LFAIL
}

dt_status_t dt__layout_init(dt_layout_t* l, int mesh_ndim, const int* mesh_shape, int ndim,
                            const int64_t* shape, const dt_placement_t* pl) {
  return dt__layout_fill(l, mesh_ndim, mesh_shape, ndim, shape, pl, 0);
}

int dt__layout_try(dt_layout_t* l, int mesh_ndim, const int* mesh_shape, int ndim,
                   const int64_t* shape, const dt_placement_t* pl) {
  return dt__layout_fill(l, mesh_ndim, mesh_shape, ndim, shape, pl, 1) == DT_SUCCESS;
}

void dt__layout_box(const dt_layout_t* l, const int* coords, int64_t* off, int64_t* len) {
  for (int d = 0; d < l->ndim; d++) {
    off[d] = 0;
    len[d] = l->shape[d];
  }
  for (int i = 0; i < l->mesh_ndim; i++) {
    if (l->pl[i].kind != DT_SHARD) continue;
    int d = l->pl[i].dim, n = l->mesh_shape[i];
    int64_t c = (len[d] + n - 1) / n, s = c * coords[i], e = s + c;
    if (e > len[d]) e = len[d];
    if (s > len[d]) s = len[d];
    off[d] += s;
    len[d] = e - s;
  }
}

int64_t dt__box_numel(int ndim, const int64_t* len) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= len[d];
  return n;
}

void dt__box_intersect(int ndim, const int64_t* ao, const int64_t* al, const int64_t* bo,
                       const int64_t* bl, int64_t* off, int64_t* len) {
  for (int d = 0; d < ndim; d++) {
    int64_t s = ao[d] > bo[d] ? ao[d] : bo[d];
    int64_t e1 = ao[d] + al[d], e2 = bo[d] + bl[d], e = e1 < e2 ? e1 : e2;
    off[d] = s;
    len[d] = e > s ? e - s : 0;
  }
}

int dt__box_contiguous(int ndim, const int64_t* shape, const int64_t* off, const int64_t* ext,
                       int64_t* start) {
  int64_t s = 0;
  for (int d = 0; d < ndim; d++) s = s * shape[d] + off[d];
  *start = s;
  if (dt__box_numel(ndim, ext) == 0) return 1;
  /* Contiguous iff, past the first dim whose extent is below the array's, every dim is full, and
   * every dim before it has extent 1. */
  int d = 0;
  while (d < ndim && ext[d] == 1) d++;
  if (d < ndim) d++;
  for (; d < ndim; d++)
    if (ext[d] != shape[d]) return 0;
  return 1;
}

void dt__box_copy(int ndim, size_t item, const int64_t* ext, void* dst, const int64_t* dst_shape,
                  const int64_t* dst_off, const void* src, const int64_t* src_shape,
                  const int64_t* src_off) {
  if (dt__box_numel(ndim, ext) == 0) return;
  /* Fold trailing dims that are whole in both arrays into one contiguous run. */
  int k = ndim;
  size_t run = item;
  while (k > 0 && ext[k - 1] == dst_shape[k - 1] && ext[k - 1] == src_shape[k - 1]) {
    run *= (size_t)ext[k - 1];
    k--;
  }
  /* dims [0, k) are iterated; dim k-1 is partial (or k == 0: one run). */
  if (k > 0) {
    run *= (size_t)ext[k - 1];
    k--;
  }
  int64_t dstride[DT_MAX_DIMS], sstride[DT_MAX_DIMS];
  int64_t ds = (int64_t)item, ss = (int64_t)item;
  for (int d = ndim - 1; d >= 0; d--) {
    dstride[d] = ds;
    sstride[d] = ss;
    ds *= dst_shape[d];
    ss *= src_shape[d];
  }
  char* dbase = (char*)dst;
  const char* sbase = (const char*)src;
  for (int d = 0; d < ndim; d++) {
    dbase += dst_off[d] * dstride[d];
    sbase += src_off[d] * sstride[d];
  }
  if (k == 0) {
    memcpy(dbase, sbase, run);
    return;
  }
  /* the innermost iterated dim walks by pointer increments (one run per row); the outer ones
   * carry like an odometer */
  const int64_t rows = ext[k - 1], ds1 = dstride[k - 1], ss1 = sstride[k - 1];
  int64_t idx[DT_MAX_DIMS] = {0};
  for (;;) {
    const char* sp = sbase;
    char* dp = dbase;
    for (int d = 0; d < k - 1; d++) {
      sp += idx[d] * sstride[d];
      dp += idx[d] * dstride[d];
    }
    for (int64_t r = 0; r < rows; r++, sp += ss1, dp += ds1) memcpy(dp, sp, run);
    int d = k - 2;
    while (d >= 0 && ++idx[d] == ext[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

void dt__split_copy(int ndim, size_t item, const int64_t* shape, int dim, int n,
                    const int64_t* offs, const int64_t* lens, void* array, void* packed,
                    int to_packed) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= shape[d];
  for (int d = dim + 1; d < ndim; d++) inner *= shape[d];
  const size_t row = (size_t)(shape[dim] * inner) * item, in_item = (size_t)inner * item;
  /* block q holds outer rows of lens[q] * inner elements, from start_q = outer * (rows of the
   * blocks before it) */
  for (int64_t o = 0; o < outer; o++) {
    char* a = (char*)array + (size_t)o * row;
    size_t start = 0;
    for (int q = 0; q < n; q++) {
      size_t brow = (size_t)lens[q] * in_item;
      char* pp = (char*)packed + start + (size_t)o * brow;
      char* ap = a + (size_t)offs[q] * in_item;
      if (brow) memcpy(to_packed ? pp : ap, to_packed ? ap : pp, brow);
      start += brow * (size_t)outer;
    }
  }
}

/* dt_placements_box: the public face of dt__layout_box, every argument checked (it computes any
 * rank's shard anywhere: checkpoint writers and readers, box intersections). */
static dt_status_t dt__placements_box(int ndim, const int64_t* shape, int mesh_ndim,
                                      const int* mesh_shape, const dt_placement_t* placements,
                                      const int* coords, int64_t* offset, int64_t* len) {
  if (mesh_ndim < 1 || mesh_ndim > DT_MAX_MESH_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mesh_ndim=%d (valid: 1 to %d)", mesh_ndim,
                   DT_MAX_MESH_DIMS);
  DT_ARG_NOT_NULL(mesh_shape);
  DT_ARG_NOT_NULL(coords);
  if (ndim > 0) {
    DT_ARG_NOT_NULL(offset);
    DT_ARG_NOT_NULL(len);
  }
  for (int i = 0; i < mesh_ndim; i++) {
    if (mesh_shape[i] < 1)
      return DT_FAIL(DT_ERR_INVALID_ARG, "mesh_shape[%d]=%d (valid: 1 or more)", i,
                     mesh_shape[i]);
    if (coords[i] < 0 || coords[i] >= mesh_shape[i])
      return DT_FAIL(DT_ERR_INVALID_ARG, "coords[%d]=%d (valid: 0 to %d, mesh_shape[%d]=%d)", i,
                     coords[i], mesh_shape[i] - 1, i, mesh_shape[i]);
  }
  dt_layout_t l;
  DT_CHECK(dt__layout_init(&l, mesh_ndim, mesh_shape, ndim, shape, placements));
  dt__layout_box(&l, coords, offset, len);
  return DT_SUCCESS;
}

dt_status_t dt_placements_box(int ndim, const int64_t* shape, int mesh_ndim,
                              const int* mesh_shape, const dt_placement_t* placements,
                              const int* coords, int64_t* offset, int64_t* len) {
  DT_ENTRY_RETURN(dt__placements_box(ndim, shape, mesh_ndim, mesh_shape, placements, coords,
                                     offset, len));
}

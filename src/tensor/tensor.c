/* tensor.c - distributed tensors: construction, local shards, full tensors, redistribution,
 * placement-independent factories and sharding visualization.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "tensor/tensor.h"

const dt_handle_kind_t dt__tensor_kind = {"tensor"};

dt_status_t dt__tensor_check(dt_tensor_t t, const char* what) {
  return dt_handle_check(t, &dt__tensor_kind, what);
}

size_t dt__tensor_nbytes(dt_tensor_t t) { return (size_t)t->local_numel * dt__itemsize(t->dtype); }

static void dt__fmt_shape(char* buf, size_t cap, int ndim, const int64_t* s) {
  size_t used = 0;
  int w = snprintf(buf, cap, "[");
  used = w > 0 ? (size_t)w : 0;
  for (int d = 0; d < ndim && used < cap; d++) {
    w = snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", s[d]);
    if (w > 0) used += (size_t)w;
  }
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Validates arguments and allocates a tensor shell (no storage); `meta` allows abstract meshes. */
static dt_status_t dt__tensor_shell(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                    const int64_t* shape, const dt_placement_t* pl, int meta,
                                    dt_tensor_t* out) {
  *out = NULL;
  DT_CHECK(dt__mesh_check(mesh));
  if (mesh->abstract && !meta)
    return DT_FAIL(DT_ERR_INVALID_USAGE,
                   "mesh is abstract: it holds no data (plan with dt_plan_create, print with "
                   "dt_sharding_visualize, or use meta tensors: dt_tensor_meta)");
  if (!dt__dtype_valid(dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "dtype %d out of range [0, %d)", (int)dtype,
                   DT_DTYPE_COUNT);
  dt_layout_t l;
  DT_CHECK(dt__layout_init(&l, mesh->ndim, mesh->shape, ndim, shape, pl));
  dt_tensor_t t = (dt_tensor_t)dt__calloc(1, sizeof *t);
  if (t == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a tensor");
  if (dt_handle_register(t, &dt__tensor_kind) != DT_SUCCESS) {
    dt__free(t);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "registering a tensor handle");
  }
  t->mesh = mesh;
  t->dtype = dtype;
  t->layout = l;
  t->meta = meta;
  if (mesh->member) {
    dt__layout_box(&l, mesh->coords, t->local_off, t->local_shape);
  } else {
    for (int d = 0; d < ndim; d++) t->local_shape[d] = 0;
  }
  /* a rank outside the mesh holds nothing, a 0-dim tensor included */
  t->local_numel = mesh->member ? dt__box_numel(ndim, t->local_shape) : 0;
  dt__mesh_retain(mesh);
  *out = t;
  return DT_SUCCESS;
}

dt_status_t dt__tensor_new(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* pl, int zero, dt_tensor_t* out) {
  DT_CHECK(dt__tensor_shell(mesh, dtype, ndim, shape, pl, 0, out));
  dt_tensor_t t = *out;
  dt_status_t st = dt__storage_new(mesh->backend, dt__tensor_nbytes(t), zero, &t->storage);
  if (st != DT_SUCCESS) {
    dt__tensor_free(t);
    *out = NULL;
    return st;
  }
  t->data = t->storage->ptr;
  return DT_SUCCESS;
}

dt_status_t dt__tensor_meta(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                            const dt_placement_t* pl, dt_tensor_t* out) {
  return dt__tensor_shell(mesh, dtype, ndim, shape, pl, 1, out);
}

dt_status_t dt__tensor_alias(dt_tensor_t base, size_t offset, dt_dtype_t dtype, int ndim,
                             const int64_t* shape, const dt_placement_t* pl, dt_tensor_t* out) {
  return dt__tensor_alias_on(base->mesh, base, offset, dtype, ndim, shape, pl, out);
}

dt_status_t dt__tensor_alias_on(dt_mesh_t mesh, dt_tensor_t base, size_t offset, dt_dtype_t dtype,
                                int ndim, const int64_t* shape, const dt_placement_t* pl,
                                dt_tensor_t* out) {
  DT_CHECK(dt__tensor_shell(mesh, dtype, ndim, shape, pl, base->meta, out));
  dt_tensor_t t = *out;
  if (base->meta) return DT_SUCCESS;
  size_t at = base->offset + offset;
  if (at + dt__tensor_nbytes(t) > base->storage->nbytes) {
    dt__tensor_free(t);
    *out = NULL;
    return DT_FAIL(DT_ERR_INTERNAL, "a view of %zu bytes at %zu overruns a storage of %zu bytes",
                   dt__tensor_nbytes(t), at, base->storage->nbytes);
  }
  dt__storage_retain(base->storage);
  t->storage = base->storage;
  t->offset = at;
  t->data = (char*)t->storage->ptr + at;
  return DT_SUCCESS;
}

int dt__tensor_shared(dt_tensor_t t) {
  return t->storage != NULL && (t->storage->refcount > 1 || !t->storage->owned);
}

dt_status_t dt__tensor_clone(dt_tensor_t t, dt_tensor_t* out) {
  *out = NULL;
  if (t->meta) return dt__tensor_meta(t->mesh, t->dtype, t->layout.ndim, t->layout.shape,
                                      t->layout.pl, out);
  dt_tensor_t c;
  DT_CHECK(dt__tensor_new(t->mesh, t->dtype, t->layout.ndim, t->layout.shape, t->layout.pl, 0, &c));
  dt_backend_t b = dt__tensor_backend(c);
  dt_status_t st = b->iface->copy(b, c->data, t->data, dt__tensor_nbytes(t), DT_COPY_D2D);
  if (st != DT_SUCCESS) {
    dt__tensor_free(c);
    return st;
  }
  *out = c;
  return DT_SUCCESS;
}

dt_backend_t dt__tensor_backend(dt_tensor_t t) {
  return t->storage ? t->storage->backend : t->mesh->backend;
}

int dt__tensor_overlap(dt_tensor_t a, dt_tensor_t b) {
  if (a == b) return 1;
  if (a->storage != NULL && a->storage == b->storage && a->data == b->data) return 1;
  if (a->data == NULL || b->data == NULL) return 0;
  if (dt__tensor_backend(a)->device != dt__tensor_backend(b)->device) return 0;
  uintptr_t pa = (uintptr_t)a->data, pb = (uintptr_t)b->data; /* borrowed buffers may coincide */
  size_t na = dt__tensor_nbytes(a), nb = dt__tensor_nbytes(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

void dt__tensor_free(dt_tensor_t t) {
  if (t == NULL) return;
  dt__storage_release(t->storage);
  dt__mesh_release(t->mesh);
  dt_handle_unregister(t, &dt__tensor_kind, "tensor");
  dt_handle_free(t);
}

static dt_status_t dt__tensor_destroy_impl(dt_tensor_t t) {
  if (t == NULL) return DT_SUCCESS;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  if (t->held)
    return DT_FAIL(DT_ERR_INVALID_USAGE,
                   "tensor belongs to a variable (the value or gradient of a dt_var_t): destroy "
                   "the variable, or replace it with dt_var_set_value / dt_var_set_grad");
  dt__tensor_free(t);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_destroy(dt_tensor_t t) {
  DT_ENTRY_RETURN(dt__tensor_destroy_impl(t));
}

static dt_status_t dt__tensor_set_memory_category_impl(dt_tensor_t t, dt_mem_category_t c) {
  DT_CHECK(dt__tensor_check(t, "tensor"));
  if (c < 0 || c >= DT_MEM_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "c=%d is not a memory category (valid: 0 to %d, DT_MEM_PARAMETERS to "
                   "DT_MEM_OTHER)", (int)c, DT_MEM_COUNT - 1);
  dt__storage_set_category(t->storage, c);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_set_memory_category(dt_tensor_t t, dt_mem_category_t c) {
  DT_ENTRY_RETURN(dt__tensor_set_memory_category_impl(t, c));
}

static dt_status_t dt__tensor_meta_impl(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                        const int64_t* shape, const dt_placement_t* placements,
                                        dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  return dt__tensor_meta(mesh, dtype, ndim, shape, placements, out);
}

dt_status_t dt_tensor_meta(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* placements, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__tensor_meta_impl(mesh, dtype, ndim, shape, placements, out));
}

static dt_status_t dt__tensor_is_meta_impl(dt_tensor_t t, int* meta) {
  DT_ARG_NOT_NULL(meta);
  *meta = 0;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *meta = t->meta;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_is_meta(dt_tensor_t t, int* meta) {
  DT_ENTRY_RETURN(dt__tensor_is_meta_impl(t, meta));
}

/* Turns a replicated value into this rank's part of a Partial, for every Partial mesh dim:
 * sum divides floats by the dim size and keeps integers on coordinate 0 only (exact sums). */
static dt_status_t dt__partition(dt_tensor_t t) {
  dt_mesh_t m = t->mesh;
  dt_backend_t b = dt__tensor_backend(t);
  for (int i = 0; i < m->ndim && t->local_numel > 0; i++) {
    dt_placement_t p = t->layout.pl[i];
    if (p.kind != DT_PARTIAL || p.op != DT_REDUCE_SUM || m->shape[i] == 1) continue;
    if (dt__dtype_is_float(t->dtype))
      DT_CHECK(b->iface->scale_div(b, t->data, t->dtype, t->local_numel, m->shape[i]));
    else if (m->coords[i] != 0)
      DT_CHECK(b->iface->memset(b, t->data, 0, dt__tensor_nbytes(t)));
  }
  return DT_SUCCESS;
}

/* Copies this rank's box of the row-major host array `full` (the whole global tensor) into the
 * local shard. */
static dt_status_t dt__upload_box(dt_tensor_t t, const void* full) {
  dt_backend_t b = dt__tensor_backend(t);
  int64_t zero[DT_MAX_DIMS] = {0};
  size_t item = dt__itemsize(t->dtype);
  if (!dt__backend_is_device(b))
    return b->iface->box_copy(b, t->layout.ndim, item, t->local_shape, t->data, t->local_shape,
                              zero, full, t->layout.shape, t->local_off);
  void* tmp = dt__malloc(dt__tensor_nbytes(t));
  if (tmp == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "host staging of %zu bytes", dt__tensor_nbytes(t));
  dt__box_copy(t->layout.ndim, item, t->local_shape, tmp, t->local_shape, zero, full,
               t->layout.shape, t->local_off);
  dt_status_t st = b->iface->copy(b, t->data, tmp, dt__tensor_nbytes(t), DT_COPY_H2D);
  dt__free(tmp);
  return st;
}

static dt_status_t dt__tensor_empty_impl(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                         const int64_t* shape, const dt_placement_t* placements,
                                         dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  return dt__tensor_new(mesh, dtype, ndim, shape, placements, 0, out); /* values unspecified */
}

dt_status_t dt_tensor_empty(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                            const dt_placement_t* placements, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__tensor_empty_impl(mesh, dtype, ndim, shape, placements, out));
}

static dt_status_t dt__tensor_from_full_impl(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                             const int64_t* shape, const dt_placement_t* placements,
                                             const void* full, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(full);
  DT_CHECK(dt__tensor_new(mesh, dtype, ndim, shape, placements, 0, out));
  dt_tensor_t t = *out;
  dt_status_t st = DT_SUCCESS;
  if (mesh->member) {
    st = dt__upload_box(t, full);
    if (st == DT_SUCCESS) st = dt__partition(t);
  }
  if (st != DT_SUCCESS) {
    dt__tensor_free(t);
    *out = NULL;
  }
  return st;
}

dt_status_t dt_tensor_from_full(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                const dt_placement_t* placements, const void* full,
                                dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__tensor_from_full_impl(mesh, dtype, ndim, shape, placements, full, out));
}

dt_status_t dt_tensor_from_local(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                 const int64_t* global_shape, const dt_placement_t* placements,
                                 void* local, const int64_t* local_shape, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt_tensor_from_local_backend(mesh, NULL, dtype, ndim, global_shape, placements,
                                               local, local_shape, out));
}

/* The arguments of dt_tensor_from_local that each rank checks on its own (first failure). */
static dt_status_t dt__from_local_args(dt_backend_t backend, int ndim, const int64_t* local_shape,
                                       const dt_placement_t* placements, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  if (backend != NULL) DT_CHECK(dt__backend_check(backend));
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tensor ndim %d out of range [0, %d]", ndim, DT_MAX_DIMS);
  if (ndim > 0) DT_ARG_NOT_NULL(local_shape);
  DT_ARG_NOT_NULL(placements);
  return DT_SUCCESS;
}

/* The global shape from a local shape (global_shape NULL): local size times the mesh size on each
 * sharded dim. */
static dt_status_t dt__from_local_infer(dt_mesh_t mesh, int ndim, const int64_t* local_shape,
                                        const dt_placement_t* placements, int64_t* gshape) {
  dt_layout_t tmp;
  DT_CHECK(dt__layout_init(&tmp, mesh->ndim, mesh->shape, ndim, local_shape, placements));
  for (int d = 0; d < ndim; d++) gshape[d] = local_shape[d];
  for (int i = 0; i < mesh->ndim; i++)
    if (tmp.pl[i].kind == DT_SHARD) gshape[tmp.pl[i].dim] *= mesh->shape[i];
  return DT_SUCCESS;
}

/* Every member must infer the same global shape (uneven shards make them disagree): one MAX
 * all-reduce of a fixed size, so that ranks passing different ndim still make the same call. */
static dt_status_t dt__from_local_agree_shape(dt_mesh_t mesh, int ndim, int64_t* gshape) {
  if (mesh->abstract || !mesh->member) return DT_SUCCESS;
  int64_t v[2 + 2 * DT_MAX_DIMS] = {ndim, -ndim};
  for (int d = 0; d < ndim; d++) {
    v[2 + d] = gshape[d];
    v[2 + DT_MAX_DIMS + d] = -gshape[d];
  }
  dt_comm_t* c = &mesh->all_comm;
  DT_CHECK(c->iface->all_reduce(c, v, v, 2 + 2 * DT_MAX_DIMS, DT_I64, DT_REDUCE_MAX, NULL));
  if (v[0] != -v[1])
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "ranks pass different numbers of dims (%lld..%lld) with the global shape to "
                   "infer", (long long)-v[1], (long long)v[0]);
  for (int d = 0; d < ndim; d++)
    if (v[2 + d] != -v[2 + DT_MAX_DIMS + d])
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "ranks infer different global sizes for dim %d (%lld..%lld): the shards "
                     "are uneven, pass global_shape",
                     d, (long long)-v[2 + DT_MAX_DIMS + d], (long long)v[2 + d]);
  return DT_SUCCESS;
}

/* Every check here may fail on some ranks only (each rank passes its own shard and shape), so the
 * members agree on the outcome (dt__mesh_agree) before the inference's all-reduce and before
 * returning: a rank that fails never leaves the others waiting in a collective, there or in
 * their next one. */
static dt_status_t dt__tensor_from_local_backend_impl(
    dt_mesh_t mesh, dt_backend_t backend, dt_dtype_t dtype, int ndim, const int64_t* global_shape,
    const dt_placement_t* placements, void* local, const int64_t* local_shape, dt_tensor_t* out) {
  static const char what[] = "checking the arguments"; /* after the entry point's name */
  if (out != NULL) *out = NULL;
  DT_CHECK(dt__mesh_check(mesh)); /* a dead mesh handle: no communicator to agree on */
  dt_status_t st = dt__from_local_args(backend, ndim, local_shape, placements, out);
  /* host memory by default: the mesh's backend when it is a host one, else the cpu backend */
  if (backend == NULL)
    backend = !dt__backend_is_device(mesh->backend) ? mesh->backend : &dt__backend_cpu;
  if (st == DT_SUCCESS && backend == &dt__backend_meta && !mesh->simulated)
    st = DT_FAIL(DT_ERR_INVALID_USAGE, "backend 'meta' holds no memory: it belongs to simulated "
                 "worlds (dt_init_simulated)");
  int64_t gshape[DT_MAX_DIMS];
  if (global_shape == NULL) {
    if (st == DT_SUCCESS) st = dt__from_local_infer(mesh, ndim, local_shape, placements, gshape);
    DT_CHECK(dt__mesh_agree(mesh, st, what));
    DT_CHECK(dt__from_local_agree_shape(mesh, ndim, gshape));
  } else if (st == DT_SUCCESS) {
    for (int d = 0; d < ndim; d++) gshape[d] = global_shape[d];
  }
  dt_tensor_t t = NULL;
  if (st == DT_SUCCESS) st = dt__tensor_shell(mesh, dtype, ndim, gshape, placements, 0, &t);
  for (int d = 0; st == DT_SUCCESS && d < ndim; d++)
    if (local_shape[d] != t->local_shape[d]) {
      char got[160], want[160], glob[160], pl[96];
      dt__fmt_shape(got, sizeof got, ndim, local_shape);
      dt__fmt_shape(want, sizeof want, ndim, t->local_shape);
      dt__fmt_shape(glob, sizeof glob, ndim, gshape);
      dt_placements_format(t->layout.pl, mesh->ndim, ",", pl, sizeof pl);
      st = DT_FAIL(DT_ERR_INVALID_ARG,
                   "local_shape %s does not follow the chunk rule: global shape %s with "
                   "placements %s gives this rank %s",
                   got, glob, pl, want);
    }
  if (st == DT_SUCCESS && t->local_numel > 0 && local == NULL)
    st = DT_FAIL(DT_ERR_INVALID_ARG, "local is NULL but this rank's shard has %lld elements",
                 (long long)t->local_numel);
  if (st == DT_SUCCESS) st = dt__storage_borrow(backend, local, dt__tensor_nbytes(t), &t->storage);
  st = dt__mesh_agree(mesh, st, what);
  if (st != DT_SUCCESS) {
    dt__tensor_free(t); /* accepts NULL; frees a borrowed storage's record, not the buffer */
    return st;
  }
  t->data = local;
  *out = t;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_from_local_backend(dt_mesh_t mesh, dt_backend_t backend, dt_dtype_t dtype,
                                         int ndim, const int64_t* global_shape,
                                         const dt_placement_t* placements, void* local,
                                         const int64_t* local_shape, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__tensor_from_local_backend_impl(mesh, backend, dtype, ndim, global_shape,
                                                     placements, local, local_shape, out));
}

static dt_status_t dt__tensor_view_local_impl(dt_tensor_t base, int64_t offset, int ndim,
                                              const int64_t* shape,
                                              const dt_placement_t* placements, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tensor_check(base, "base"));
  if (ndim > 0) DT_ARG_NOT_NULL(shape);
  DT_ARG_NOT_NULL(placements);
  if (offset < 0 || offset > base->local_numel)
    return DT_FAIL(DT_ERR_INVALID_ARG, "offset=%lld out of range [0, %lld] (the base's local "
                   "elements)", (long long)offset, (long long)base->local_numel);
  dt_tensor_t t;
  DT_CHECK(dt__tensor_shell(base->mesh, base->dtype, ndim, shape, placements, base->meta, &t));
  if (t->local_numel > base->local_numel - offset) {
    char sh[160];
    dt__fmt_shape(sh, sizeof sh, ndim, t->local_shape);
    dt__tensor_free(t);
    return DT_FAIL(DT_ERR_INVALID_ARG, "shape with placements gives this rank a shard %s (%lld "
                   "elements) that at offset=%lld overruns the base's %lld local elements", sh,
                   (long long)t->local_numel, (long long)offset,
                   (long long)base->local_numel);
  }
  if (!base->meta) {
    dt__storage_retain(base->storage);
    t->storage = base->storage;
    t->offset = base->offset + (size_t)offset * dt__itemsize(base->dtype);
    t->data = (char*)t->storage->ptr + t->offset;
  }
  *out = t;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_view_local(dt_tensor_t base, int64_t offset, int ndim,
                                 const int64_t* shape, const dt_placement_t* placements,
                                 dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__tensor_view_local_impl(base, offset, ndim, shape, placements, out));
}

/* ---------------------------------------------------------------------------------------------
 * distribute: scatter (Shard) or broadcast (Replicate / Partial) one mesh dim at a time */

static dt_status_t dt__tensor_distribute_impl(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                              const int64_t* shape,
                                              const dt_placement_t* placements, const void* full,
                                              int src_rank, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__mesh_check(mesh));
  if (mesh->abstract)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "mesh is abstract: an abstract mesh holds no data");
  int src_pos = -1;
  for (int p = 0; p < mesh->numel; p++)
    if (mesh->ranks[p] == src_rank) src_pos = p;
  if (src_pos < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "src_rank %d is not a member of the mesh (valid: one of its %d world ranks, "
                   "e.g. %d)", src_rank, mesh->numel, mesh->ranks[0]);
  /* Only the source can see a NULL full: it tells the others (one tiny broadcast) so that every
   * rank fails together instead of leaving them blocked in the scatter. */
  if (mesh->member) {
    int ok = src_rank != dt__world_rank() || full != NULL;
    DT_CHECK(mesh->all_comm.iface->broadcast(&mesh->all_comm, &ok, 1, DT_I32, src_pos, NULL));
    if (!ok)
      return src_rank == dt__world_rank()
                 ? DT_FAIL(DT_ERR_INVALID_ARG, "full is NULL on the source rank %d", src_rank)
                 : DT_FAIL(DT_ERR_INVALID_ARG, "full is NULL on the source rank %d (reported by "
                           "that rank)", src_rank);
  }
  DT_CHECK(dt__tensor_new(mesh, dtype, ndim, shape, placements, 1, out));
  dt_tensor_t t = *out;
  if (!mesh->member) return DT_SUCCESS;
  dt_status_t st = DT_SUCCESS;
  /* The user's array and the collectives are host memory: pack and receive in the cpu backend's
   * host workspace, then copy the local shard into the tensor through its backend. */
  dt_backend_t host = &dt__backend_cpu, b = dt__tensor_backend(t);
  int m = mesh->ndim, sc[DT_MAX_MESH_DIMS];
  dt__grid_coords(m, mesh->shape, src_pos, sc);
  size_t item = dt__itemsize(dtype);
  /* Level i: holders own the box of `lv` (target placements on dims < i, R elsewhere). */
  dt_layout_t lv = t->layout;
  for (int i = 0; i < m; i++) lv.pl[i] = dt_replicate();
  const void* cur = src_rank == dt__world_rank() ? full : NULL;
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  for (int i = 0; i < m; i++) {
    int part = 1;
    for (int j = i + 1; j < m; j++) part &= mesh->coords[j] == sc[j];
    dt_layout_t next = lv;
    next.pl[i] = t->layout.pl[i].kind == DT_SHARD ? t->layout.pl[i] : dt_replicate();
    if (part) {
      int root = sc[i], me = mesh->coords[i], n = mesh->shape[i];
      dt_comm_t* c = &mesh->dim_comm[i];
      dt__layout_box(&lv, mesh->coords, off, len);
      int64_t numel = dt__box_numel(ndim, len);
      if (t->layout.pl[i].kind == DT_SHARD) {
        int64_t* ints;
        DT_CHECK_GOTO(dt__ws_counts((size_t)n * 2, &ints), st, fail);
        int64_t *counts = ints, *displs = ints + n;
        void* pack = NULL;
        if (me == root)
          DT_CHECK_GOTO(dt__ws_reserve(host, 0, (size_t)numel * item, &pack), st, fail);
        int64_t pos = 0;
        for (int q = 0; q < n; q++) {
          int cq[DT_MAX_MESH_DIMS];
          int64_t qo[DT_MAX_DIMS], ql[DT_MAX_DIMS], rel[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
          memcpy(cq, mesh->coords, sizeof cq);
          cq[i] = q;
          dt__layout_box(&next, cq, qo, ql);
          counts[q] = dt__box_numel(ndim, ql);
          displs[q] = pos;
          if (me == root) {
            for (int d = 0; d < ndim; d++) rel[d] = qo[d] - off[d];
            dt__box_copy(ndim, item, ql, (char*)pack + (size_t)pos * item, ql, zero, cur, len,
                         rel);
          }
          pos += counts[q];
        }
        void* dst;
        DT_CHECK_GOTO(dt__ws_reserve(host, 1 + (i & 1), (size_t)counts[me] * item, &dst), st,
                      fail);
        DT_CHECK_GOTO(c->iface->scatter_v(c, pack, counts, displs, dst, dtype, root, NULL), st,
                      fail);
        dt__count_collective(mesh, 1u << i, DT_COLL_SCATTER, (uint64_t)pos * item);
        cur = dst;
      } else {
        void* buf;
        DT_CHECK_GOTO(dt__ws_reserve(host, 1 + (i & 1), (size_t)numel * item, &buf), st, fail);
        if (me == root && cur != buf && numel) memcpy(buf, cur, (size_t)numel * item);
        if (n > 1) {
          DT_CHECK_GOTO(c->iface->broadcast(c, buf, numel, dtype, root, NULL), st, fail);
          dt__count_collective(mesh, 1u << i, DT_COLL_BROADCAST, (uint64_t)numel * item);
        }
        cur = buf;
      }
    }
    lv = next;
  }
  DT_CHECK_GOTO(b->iface->copy(b, t->data, cur, dt__tensor_nbytes(t),
                               !dt__backend_is_device(b) ? DT_COPY_H2H : DT_COPY_H2D),
                st, fail);
  DT_CHECK_GOTO(dt__partition(t), st, fail);
  return DT_SUCCESS;
fail:
  dt__tensor_free(t);
  *out = NULL;
  return st;
}

dt_status_t dt_tensor_distribute(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                 const dt_placement_t* placements, const void* full, int src_rank,
                                 dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__tensor_distribute_impl(mesh, dtype, ndim, shape, placements, full, src_rank, out));
}

/* ---------------------------------------------------------------------------------------------
 * accessors */

static dt_status_t dt__tensor_dtype_impl(dt_tensor_t t, dt_dtype_t* dtype) {
  DT_ARG_NOT_NULL(dtype);
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *dtype = t->dtype;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_dtype(dt_tensor_t t, dt_dtype_t* dtype) {
  DT_ENTRY_RETURN(dt__tensor_dtype_impl(t, dtype));
}

static dt_status_t dt__tensor_ndim_impl(dt_tensor_t t, int* ndim) {
  DT_ARG_NOT_NULL(ndim);
  *ndim = 0;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *ndim = t->layout.ndim;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_ndim(dt_tensor_t t, int* ndim) {
  DT_ENTRY_RETURN(dt__tensor_ndim_impl(t, ndim));
}

static dt_status_t dt__tensor_shape_impl(dt_tensor_t t, int64_t* shape) {
  DT_ARG_NOT_NULL(shape);
  DT_CHECK(dt__tensor_check(t, "tensor"));
  memcpy(shape, t->layout.shape, sizeof(int64_t) * (size_t)t->layout.ndim);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_shape(dt_tensor_t t, int64_t* shape) {
  DT_ENTRY_RETURN(dt__tensor_shape_impl(t, shape));
}

static dt_status_t dt__tensor_placements_impl(dt_tensor_t t, dt_placement_t* out) {
  DT_ARG_NOT_NULL(out);
  DT_CHECK(dt__tensor_check(t, "tensor"));
  memcpy(out, t->layout.pl, sizeof(dt_placement_t) * (size_t)t->layout.mesh_ndim);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_placements(dt_tensor_t t, dt_placement_t* out) {
  DT_ENTRY_RETURN(dt__tensor_placements_impl(t, out));
}

static dt_status_t dt__tensor_mesh_impl(dt_tensor_t t, dt_mesh_t* mesh) {
  DT_ARG_NOT_NULL(mesh);
  *mesh = NULL;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *mesh = t->mesh;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_mesh(dt_tensor_t t, dt_mesh_t* mesh) {
  DT_ENTRY_RETURN(dt__tensor_mesh_impl(t, mesh));
}

static dt_status_t dt__tensor_backend_impl(dt_tensor_t t, dt_backend_t* backend) {
  DT_ARG_NOT_NULL(backend);
  *backend = NULL;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *backend = dt__tensor_backend(t);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_backend(dt_tensor_t t, dt_backend_t* backend) {
  DT_ENTRY_RETURN(dt__tensor_backend_impl(t, backend));
}

static dt_status_t dt__tensor_local_shape_impl(dt_tensor_t t, int64_t* shape) {
  DT_ARG_NOT_NULL(shape);
  DT_CHECK(dt__tensor_check(t, "tensor"));
  memcpy(shape, t->local_shape, sizeof(int64_t) * (size_t)t->layout.ndim);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_local_shape(dt_tensor_t t, int64_t* shape) {
  DT_ENTRY_RETURN(dt__tensor_local_shape_impl(t, shape));
}

static dt_status_t dt__tensor_local_offset_impl(dt_tensor_t t, int64_t* offset) {
  DT_ARG_NOT_NULL(offset);
  DT_CHECK(dt__tensor_check(t, "tensor"));
  memcpy(offset, t->local_off, sizeof(int64_t) * (size_t)t->layout.ndim);
  return DT_SUCCESS;
}

dt_status_t dt_tensor_local_offset(dt_tensor_t t, int64_t* offset) {
  DT_ENTRY_RETURN(dt__tensor_local_offset_impl(t, offset));
}

static dt_status_t dt__tensor_local_numel_impl(dt_tensor_t t, int64_t* numel) {
  DT_ARG_NOT_NULL(numel);
  *numel = 0;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *numel = t->local_numel;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_local_numel(dt_tensor_t t, int64_t* numel) {
  DT_ENTRY_RETURN(dt__tensor_local_numel_impl(t, numel));
}

static dt_status_t dt__tensor_set_rank_local_impl(dt_tensor_t t, int rank_local) {
  DT_CHECK(dt__tensor_check(t, "tensor"));
  if (rank_local != 0 && rank_local != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "rank_local=%d (valid: 0 or 1)", rank_local);
  t->rank_local = rank_local;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_set_rank_local(dt_tensor_t t, int rank_local) {
  DT_ENTRY_RETURN(dt__tensor_set_rank_local_impl(t, rank_local));
}

static dt_status_t dt__tensor_is_rank_local_impl(dt_tensor_t t, int* rank_local) {
  DT_ARG_NOT_NULL(rank_local);
  *rank_local = 0;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  *rank_local = t->rank_local;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_is_rank_local(dt_tensor_t t, int* rank_local) {
  DT_ENTRY_RETURN(dt__tensor_is_rank_local_impl(t, rank_local));
}

dt_status_t dt_tensor_to_local(dt_tensor_t t, void** data, int64_t* local_shape) {
  DT_ENTRY_RETURN(dt_tensor_to_local_backend(t, data, local_shape, NULL));
}

static dt_status_t dt__tensor_to_local_backend_impl(dt_tensor_t t, void** data,
                                                    int64_t* local_shape, dt_backend_t* backend) {
  DT_ARG_NOT_NULL(data);
  *data = NULL;
  if (backend) *backend = NULL;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  dt_backend_t b = dt__tensor_backend(t);
  if (t->data != NULL && b->iface->synchronize) DT_CHECK(b->iface->synchronize(b));
  *data = t->data;
  if (local_shape) memcpy(local_shape, t->local_shape, sizeof(int64_t) * (size_t)t->layout.ndim);
  if (backend) *backend = b;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_to_local_backend(dt_tensor_t t, void** data, int64_t* local_shape,
                                       dt_backend_t* backend) {
  DT_ENTRY_RETURN(dt__tensor_to_local_backend_impl(t, data, local_shape, backend));
}

/* ---------------------------------------------------------------------------------------------
 * redistribution */

/* The DTENSOR_DEBUG=redistribute line (rank 0) and the trace event of a plan about to run. */
static void dt__redistribute_announce(dt_mesh_t m, struct dt_plan* p, const char* suffix) {
  if ((dt__debug_mask() & DT_DBG_REDISTRIBUTE) && dt__world_rank() == 0) {
    char buf[512];
    if (dt__plan_format(p, buf, sizeof buf) == DT_SUCCESS)
      dt__log("redistribute", "%s%s", buf, suffix);
  }
  int mark;
  if (dt__trace_active() && dt__plan_lend(p, &mark) == DT_SUCCESS) {
    dt_trace_event_t e = {.kind = DT_TRACE_REDISTRIBUTE, .mesh_ndim = m->ndim, .plan = p};
    dt__trace_emit(&e);
    dt__plan_unlend(p, mark);
  }
}

/* The target placements of t's redistribution: a Shard dim out of range is named here as the
 * argument (the layout check below would say "placement for mesh dim i"). */
static dt_status_t dt__dst_check(dt_tensor_t t, const dt_placement_t* dst) {
  const int nd = t->layout.ndim;
  for (int i = 0; i < t->mesh->ndim; i++)
    if (dst[i].kind == DT_SHARD && (dst[i].dim < -nd || dst[i].dim >= nd)) {
      if (nd == 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "dst[%d] = S(%d): Shard dim %d of a 0-dim tensor (it "
                       "has no dim to shard: use R)", i, dst[i].dim, dst[i].dim);
      return DT_FAIL(DT_ERR_INVALID_ARG, "dst[%d] = S(%d): Shard dim %d out of range for a %d-dim "
                     "tensor (valid: %d to %d)", i, dst[i].dim, dst[i].dim, nd, -nd, nd - 1);
    }
  return DT_SUCCESS;
}

/* A new tensor like t with placements dst to redistribute into (meta for a meta t; the plan
 * writes every local element: no zero fill). */
static dt_status_t dt__redistribute_target(dt_tensor_t t, const dt_placement_t* dst,
                                           dt_tensor_t* r) {
  if (t->meta) return dt__tensor_meta(t->mesh, t->dtype, t->layout.ndim, t->layout.shape, dst, r);
  return dt__tensor_new(t->mesh, t->dtype, t->layout.ndim, t->layout.shape, dst, 0, r);
}

static dt_status_t dt__tensor_redistribute_into_impl(dt_tensor_t src, dt_tensor_t dst) {
  DT_CHECK(dt__tensor_check(src, "src"));
  DT_CHECK(dt__tensor_check(dst, "dst"));
  if (src->mesh != dst->mesh)
    return DT_FAIL(DT_ERR_INVALID_ARG, "src and dst live on different meshes");
  if (src->dtype != dst->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dtype mismatch: src %s, dst %s",
                   dt_dtype_name(src->dtype), dt_dtype_name(dst->dtype));
  if (src->layout.ndim != dst->layout.ndim ||
      memcmp(src->layout.shape, dst->layout.shape, sizeof(int64_t) * (size_t)src->layout.ndim)) {
    char ss[160], ds[160];
    dt__fmt_shape(ss, sizeof ss, src->layout.ndim, src->layout.shape);
    dt__fmt_shape(ds, sizeof ds, dst->layout.ndim, dst->layout.shape);
    return DT_FAIL(DT_ERR_INVALID_ARG, "global shapes of src %s and dst %s differ", ss, ds);
  }
  if (dt__tensor_overlap(src, dst))
    return DT_FAIL(DT_ERR_INVALID_ARG, "src and dst share storage");
  if (src->meta != dst->meta)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "src %s a meta tensor but dst %s: both or neither must "
                   "be meta", src->meta ? "is" : "is not", dst->meta ? "is" : "is not");
  dt_backend_t b = dt__tensor_backend(src);
  if (!src->meta && b->device != dt__tensor_backend(dst)->device)
    return DT_FAIL(DT_ERR_INVALID_ARG, "src (%s) and dst (%s) live on different devices",
                   dt_device_name(b->device), dt_device_name(dt__tensor_backend(dst)->device));
  dt_mesh_t m = src->mesh;
  struct dt_plan* p;
  DT_CHECK(dt__plan_get(m, src->dtype, &src->layout, dst->layout.pl, &p));
  dt__redistribute_announce(m, p, "");
  if (src->meta) return DT_SUCCESS; /* planned, nothing to move */
  dt__count_redistribute(m);
  return dt__plan_execute(m, b, p, src->data, dst->data);
}

/* dt__tensor_redistribute_into_impl, timed in the op profile as "redistribute" (dtensor/ops.h) */
static dt_status_t dt__tensor_redistribute_into_prof(dt_tensor_t src, dt_tensor_t dst) {
  if (!dt__prof_on()) return dt__tensor_redistribute_into_impl(src, dst);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  dt_status_t st = dt__tensor_redistribute_into_impl(src, dst);
  dt__prof_end(&f, "redistribute", DT__PROF_COMM);
  return st;
}

dt_status_t dt_tensor_redistribute_into(dt_tensor_t src, dt_tensor_t dst) {
  DT_ENTRY_RETURN(dt__tensor_redistribute_into_prof(src, dst));
}

static dt_status_t dt__tensor_redistribute_impl(dt_tensor_t t, const dt_placement_t* dst,
                                                dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  DT_ARG_NOT_NULL(dst);
  DT_CHECK(dt__dst_check(t, dst));
  dt_tensor_t r;
  DT_CHECK(dt__redistribute_target(t, dst, &r));
  dt_status_t st = dt_tensor_redistribute_into(t, r);
  if (st != DT_SUCCESS) {
    dt__tensor_free(r); /* succeeds, leaving the error message alone */
    return st;
  }
  *out = r;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_redistribute(dt_tensor_t t, const dt_placement_t* dst, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__tensor_redistribute_impl(t, dst, out));
}

static dt_status_t dt__tensor_redistribute_async_impl(dt_tensor_t t, const dt_placement_t* dst,
                                                      dt_tensor_t* out, dt_work_t* work) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(work);
  *work = NULL;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  DT_ARG_NOT_NULL(dst);
  DT_CHECK(dt__dst_check(t, dst));
  dt_tensor_t r;
  DT_CHECK(dt__redistribute_target(t, dst, &r));
  dt_mesh_t m = t->mesh;
  struct dt_plan* p = NULL;
  dt_status_t st = dt__plan_get(m, t->dtype, &t->layout, r->layout.pl, &p);
  if (st == DT_SUCCESS) dt__redistribute_announce(m, p, " (async)");
  if (st == DT_SUCCESS && !t->meta) dt__count_redistribute(m);
  if (st == DT_SUCCESS)
    st = t->meta ? dt__work_start(NULL, NULL, NULL, NULL, NULL, NULL, NULL, work)
                 : dt__work_start(m, dt__tensor_backend(t), p, t->data, t->storage, r->data,
                                  r->storage, work);
  if (st != DT_SUCCESS) {
    dt__tensor_free(r);
    return st;
  }
  *out = r;
  return DT_SUCCESS;
}

dt_status_t dt_tensor_redistribute_async(dt_tensor_t t, const dt_placement_t* dst,
                                         dt_tensor_t* out, dt_work_t* work) {
  DT_ENTRY_RETURN(dt__tensor_redistribute_async_impl(t, dst, out, work));
}

dt_status_t dt_tensor_full(dt_tensor_t t, void* out, size_t out_nbytes) {
  DT_ENTRY_RETURN(dt_tensor_gather_full(t, out, out_nbytes));
}

static dt_status_t dt__tensor_gather_full_impl(dt_tensor_t t, void* out, size_t out_nbytes) {
  DT_CHECK(dt__tensor_check(t, "tensor"));
  if (t->meta) return DT_FAIL(DT_ERR_INVALID_USAGE, "t is a meta tensor: it holds no data");
  int64_t numel = dt__box_numel(t->layout.ndim, t->layout.shape);
  size_t need = (size_t)numel * dt__itemsize(t->dtype);
  /* the caller's buffer is this rank's own: agreed before the gather, so a rank with a bad one
   * fails together with the others instead of leaving them in the collective */
  dt_status_t ast = DT_SUCCESS;
  if (out == NULL) ast = DT_FAIL(DT_ERR_INVALID_ARG, "out is NULL");
  else if (out_nbytes < need)
    ast = DT_FAIL(DT_ERR_INVALID_ARG, "out_nbytes=%zu is too small: the full tensor needs %zu "
                  "bytes", out_nbytes, need);
  DT_CHECK(dt__mesh_agree(t->mesh, ast, "checking out and out_nbytes"));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  dt_backend_t b = dt__tensor_backend(t);
  dt_tensor_t r;
  DT_CHECK(dt__tensor_shell(t->mesh, t->dtype, t->layout.ndim, t->layout.shape, rep, 0, &r));
  dt_status_t st;
  if (!dt__backend_is_device(b)) { /* gather straight into the caller's array */
    st = dt__storage_borrow(b, out, need, &r->storage);
    if (st == DT_SUCCESS) {
      r->data = out;
      st = dt_tensor_redistribute_into(t, r);
    }
  } else { /* gather in device memory, then one copy to the host */
    dt__tensor_free(r);
    st = dt_tensor_redistribute(t, rep, &r);
    if (st == DT_SUCCESS && t->mesh->member)
      st = b->iface->copy(b, out, r->data, need, DT_COPY_D2H);
  }
  dt__tensor_free(r);
  return st;
}

dt_status_t dt_tensor_gather_full(dt_tensor_t t, void* out, size_t out_nbytes) {
  DT_ENTRY_RETURN(dt__tensor_gather_full_impl(t, out, out_nbytes));
}

static dt_status_t dt__tensor_item_impl(dt_tensor_t t, double* value) {
  DT_ARG_NOT_NULL(value);
  *value = 0.0;
  DT_CHECK(dt__tensor_check(t, "tensor"));
  int64_t numel = dt__box_numel(t->layout.ndim, t->layout.shape);
  if (numel != 1) /* the same on every rank (global shape): no collective left waiting */
    return DT_FAIL(DT_ERR_INVALID_ARG, "t has %lld elements: only a one-element tensor has an "
                   "item (dt_tensor_gather_full reads more)", (long long)numel);
  unsigned char buf[8] = {0};
  DT_CHECK(dt__tensor_gather_full_impl(t, buf, sizeof buf));
  *value = t->mesh->member ? dt__load(buf, t->dtype, 0) : NAN; /* a non-member has no value */
  return DT_SUCCESS;
}

dt_status_t dt_tensor_item(dt_tensor_t t, double* value) {
  DT_ENTRY_RETURN(dt__tensor_item_impl(t, value));
}

/* ---------------------------------------------------------------------------------------------
 * factories: the value of global element i depends only on i (and the seed) */

typedef enum { DT_FILL_CONST, DT_FILL_ARANGE, DT_FILL_RAND, DT_FILL_RANDN } dt_fill_t;

static double dt__fill_value(dt_fill_t kind, double a, double b, uint64_t seed, uint64_t i) {
  switch (kind) {
    case DT_FILL_CONST: return a;
    case DT_FILL_ARANGE: return a + b * (double)i;
    case DT_FILL_RAND: return (double)(dt__mix64(seed ^ dt__mix64(2 * i)) >> 40) * 0x1.0p-24;
    case DT_FILL_RANDN: {
      double u1 = ((double)(dt__mix64(seed ^ dt__mix64(2 * i)) >> 11) + 1.0) * 0x1.0p-53;
      double u2 = (double)(dt__mix64(seed ^ dt__mix64(2 * i + 1)) >> 11) * 0x1.0p-53;
      return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
  }
  return 0.0;
}

/* A value stored into a tensor of `dtype`, checked as PyTorch's scalar conversion checks it
 * ("value cannot be converted to type ... without overflow"): into an integer dtype, truncated
 * toward zero, it must fit the type (C leaves the conversion of anything else undefined); into a
 * float dtype its magnitude must not pass the largest finite value (f16 65504: PyTorch refuses
 * 65519 too, which would round to it); NaN and infinities fail for integers only (a float
 * tensor holds them: torch's fill_ takes them). */
dt_status_t dt__fill_check(dt_dtype_t dtype, double v, const char* what) {
  if (dtype == DT_I32 || dtype == DT_I64) {
    const double lim = dtype == DT_I32 ? 0x1p31 : 0x1p63, t = trunc(v);
    if (t >= -lim && t < lim) return DT_SUCCESS; /* NaN fails too */
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s=%g does not fit dtype %s (valid: -2^%d to 2^%d - 1 "
                   "after truncation toward zero)", what, v, dt_dtype_name(dtype),
                   dtype == DT_I32 ? 31 : 63, dtype == DT_I32 ? 31 : 63);
  }
  const double max = dtype == DT_F16 ? 65504.0 : dtype == DT_BF16 ? 0x1.fep127 : 0x1.fffffep127;
  if (!isfinite(v) || fabs(v) <= max) return DT_SUCCESS;
  return DT_FAIL(DT_ERR_INVALID_ARG, "%s=%g overflows dtype %s (its largest finite value is %g)",
                 what, v, dt_dtype_name(dtype), max);
}

static dt_status_t dt__factory(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                               const dt_placement_t* pl, dt_fill_t kind, double a, double b,
                               uint64_t seed, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if ((kind == DT_FILL_RAND || kind == DT_FILL_RANDN) && dt__dtype_valid(dtype) &&
      !dt__dtype_is_float(dtype))
    return DT_FAIL(DT_ERR_INVALID_ARG, "dtype %s: rand and randn need a float dtype (f32, bf16 "
                   "or f16)", dt_dtype_name(dtype));
  if (!isfinite(a))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s=%g: fill values must be finite",
                   kind == DT_FILL_ARANGE ? "start" : "value", a);
  if (!isfinite(b)) return DT_FAIL(DT_ERR_INVALID_ARG, "step=%g: fill values must be finite", b);
  if (kind == DT_FILL_CONST || kind == DT_FILL_ARANGE)
    DT_CHECK(dt__fill_check(dtype, a, kind == DT_FILL_ARANGE ? "start" : "value"));
  DT_CHECK(dt__tensor_new(mesh, dtype, ndim, shape, pl, kind == DT_FILL_CONST && a == 0.0, out));
  dt_tensor_t t = *out;
  dt_backend_t be = dt__tensor_backend(t);
  dt_status_t st = DT_SUCCESS;
  if (kind == DT_FILL_ARANGE) { /* the last value too (the values between lie between): the
                                 * global shape's, the same on every rank */
    const int64_t numel = dt__box_numel(ndim, t->layout.shape);
    if (numel > 1)
      st = dt__fill_check(dtype, a + b * (double)(numel - 1), "start + step * (numel - 1)");
    if (st != DT_SUCCESS) goto done;
  }
  if (t->local_numel == 0 || (kind == DT_FILL_CONST && a == 0.0)) return DT_SUCCESS;
  if (kind == DT_FILL_CONST) {
    st = be->iface->fill(be, t->data, dtype, t->local_numel, a);
    if (st == DT_SUCCESS) st = dt__partition(t);
    goto done;
  }
  if (dt__meta_ptr(t->data)) { /* the meta backend: nothing to generate */
    st = dt__partition(t);
    goto done;
  }
  /* values from (seed, global index), generated on the host in chunks and copied in */
  size_t item = dt__itemsize(dtype);
  int64_t chunk = t->local_numel < 65536 ? t->local_numel : 65536;
  void* buf = dt__malloc((size_t)chunk * item);
  if (buf == NULL) {
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "factory staging of %lld elements", (long long)chunk);
    goto done;
  }
  int64_t idx[DT_MAX_DIMS] = {0};
  double rand_scale = dtype == DT_BF16 ? 0x1.0p8 : dtype == DT_F16 ? 0x1.0p11 : 0x1.0p24;
  for (int64_t k0 = 0; k0 < t->local_numel && st == DT_SUCCESS; k0 += chunk) {
    int64_t n = t->local_numel - k0 < chunk ? t->local_numel - k0 : chunk;
    for (int64_t k = 0; k < n; k++) {
      uint64_t g = 0;
      for (int d = 0; d < ndim; d++)
        g = g * (uint64_t)shape[d] + (uint64_t)(t->local_off[d] + idx[d]);
      double v = dt__fill_value(kind, a, b, seed, g);
      /* rand is uniform on [0, 1): keep only the bits the storage dtype can hold, so that
       * rounding to bf16/f16 can never produce 1.0. */
      if (kind == DT_FILL_RAND) v = floor(v * rand_scale) / rand_scale;
      dt__store(buf, dtype, k, v);
      for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < t->local_shape[d]) break;
        idx[d] = 0;
      }
    }
    st = be->iface->copy(be, (char*)t->data + (size_t)k0 * item, buf, (size_t)n * item,
                         !dt__backend_is_device(be) ? DT_COPY_H2H : DT_COPY_H2D);
  }
  dt__free(buf);
  if (st == DT_SUCCESS) st = dt__partition(t);
done:
  if (st != DT_SUCCESS) {
    dt__tensor_free(t);
    *out = NULL;
  }
  return st;
}

dt_status_t dt_tensor_zeros(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                            const dt_placement_t* placements, dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__factory(mesh, dtype, ndim, shape, placements, DT_FILL_CONST, 0.0, 0.0, 0, out));
}

dt_status_t dt_tensor_ones(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* placements, dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__factory(mesh, dtype, ndim, shape, placements, DT_FILL_CONST, 1.0, 0.0, 0, out));
}

dt_status_t dt_tensor_full_value(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                 const dt_placement_t* placements, double value,
                                 dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__factory(mesh, dtype, ndim, shape, placements, DT_FILL_CONST, value, 0.0, 0, out));
}

dt_status_t dt_tensor_arange(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                             const dt_placement_t* placements, double start, double step,
                             dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__factory(mesh, dtype, ndim, shape, placements, DT_FILL_ARANGE, start, step, 0, out));
}

dt_status_t dt_tensor_rand(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                           const dt_placement_t* placements, uint64_t seed, dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__factory(mesh, dtype, ndim, shape, placements, DT_FILL_RAND, 0.0, 0.0, seed, out));
}

dt_status_t dt_tensor_randn(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                            const dt_placement_t* placements, uint64_t seed, dt_tensor_t* out) {
  DT_ENTRY_RETURN(
      dt__factory(mesh, dtype, ndim, shape, placements, DT_FILL_RANDN, 0.0, 0.0, seed, out));
}

/* ---------------------------------------------------------------------------------------------
 * visualization */

static dt_status_t dt__visualize(dt_mesh_t mesh, const dt_layout_t* l, FILE* f) {
  char pl[128], shp[160];
  DT_CHECK(dt_placements_format(l->pl, l->mesh_ndim, ", ", pl, sizeof pl));
  dt__fmt_shape(shp, sizeof shp, l->ndim, l->shape);
  fprintf(f, "tensor %s on mesh (", shp);
  for (int i = 0; i < mesh->ndim; i++) fprintf(f, "%s%d", i ? "," : "", mesh->shape[i]);
  fprintf(f, ") placements [%s]\n", pl);
  for (int p = 0; p < mesh->numel; p++) {
    int c[DT_MAX_MESH_DIMS];
    dt__grid_coords(mesh->ndim, mesh->shape, p, c);
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__layout_box(l, c, off, len);
    if (mesh->abstract) fprintf(f, "  coord (");
    else fprintf(f, "  rank %3d coord (", mesh->ranks[p]);
    for (int i = 0; i < mesh->ndim; i++) fprintf(f, "%s%d", i ? "," : "", c[i]);
    fprintf(f, "): [");
    for (int d = 0; d < l->ndim; d++)
      fprintf(f, "%s%" PRId64 ":%" PRId64, d ? ", " : "", off[d], off[d] + len[d]);
    fprintf(f, "]%s", dt__box_numel(l->ndim, len) == 0 ? " (empty)" : "");
    for (int i = 0; i < mesh->ndim; i++)
      if (l->pl[i].kind == DT_PARTIAL)
        fprintf(f, " partial(%s) over mesh dim %d", dt_reduce_op_name((dt_reduce_op_t)l->pl[i].op),
                i);
    fprintf(f, "\n");
  }
  fflush(f);
  return DT_SUCCESS;
}

static dt_status_t dt__tensor_visualize_impl(dt_tensor_t t, FILE* f) {
  DT_CHECK(dt__tensor_check(t, "tensor"));
  DT_ARG_NOT_NULL(f);
  return dt__visualize(t->mesh, &t->layout, f);
}

dt_status_t dt_tensor_visualize(dt_tensor_t t, FILE* f) {
  DT_ENTRY_RETURN(dt__tensor_visualize_impl(t, f));
}

static dt_status_t dt__sharding_visualize_impl(dt_mesh_t mesh, int ndim, const int64_t* shape,
                                               const dt_placement_t* placements, FILE* f) {
  DT_CHECK(dt__mesh_check(mesh));
  DT_ARG_NOT_NULL(f);
  dt_layout_t l;
  DT_CHECK(dt__layout_init(&l, mesh->ndim, mesh->shape, ndim, shape, placements));
  return dt__visualize(mesh, &l, f);
}

dt_status_t dt_sharding_visualize(dt_mesh_t mesh, int ndim, const int64_t* shape,
                                  const dt_placement_t* placements, FILE* f) {
  DT_ENTRY_RETURN(dt__sharding_visualize_impl(mesh, ndim, shape, placements, f));
}

/* ---------------------------------------------------------------------------------------------
 * tracing */

static struct {
  dt_trace_fn fn;
  void* ctx;
  int depth;
  int input; /* the op input being moved, -1 outside dispatch's moves */
} dt__trace = {NULL, NULL, 0, -1};

void dt_trace_set(dt_trace_fn fn, void* ctx) {
  dt__trace.fn = fn;
  dt__trace.ctx = fn ? ctx : NULL;
  dt__trace.depth = 0;
  dt__trace.input = -1;
}

int dt__trace_active(void) { return dt__trace.fn != NULL; }

void dt__trace_emit(dt_trace_event_t* e) {
  if (dt__trace.fn == NULL) return;
  e->depth = dt__trace.depth;
  if (e->kind == DT_TRACE_REDISTRIBUTE) e->input = dt__trace.input;
  dt__trace.fn(e, dt__trace.ctx);
}

void dt__trace_enter(void) { dt__trace.depth++; }
void dt__trace_leave(void) { dt__trace.depth--; }
void dt__trace_input(int input) { dt__trace.input = input; }

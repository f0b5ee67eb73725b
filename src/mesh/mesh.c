/* mesh.c - device meshes: shape, names, coordinates, per-dim and flattened communicators.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mesh/mesh.h"
#ifdef DTENSOR_HAVE_CUDA
#include "backend/cuda.h" /* the device's PCI bus id */
#endif

static dt_mesh_t dt__meshes = NULL; /* live meshes */

const dt_handle_kind_t dt__mesh_kind = {"mesh"};

/* A mesh lives while its handle or anything built on it (tensors, works) holds it: a mesh whose
 * handle was destroyed is still valid through dt_tensor_mesh. */
dt_status_t dt__mesh_check(dt_mesh_t m) { return dt_handle_check(m, &dt__mesh_kind, "mesh"); }

static dt_status_t dt__mesh_dim(dt_mesh_t m, int dim, int* out) {
  int d = dim < 0 ? dim + m->ndim : dim;
  if (d < 0 || d >= m->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dim=%d out of range for a %d-dim mesh (valid: %d to %d)",
                   dim, m->ndim, -m->ndim, m->ndim - 1);
  *out = d;
  return DT_SUCCESS;
}

/* Validates shape and names and allocates a mesh with no communicators. */
static dt_status_t dt__mesh_alloc(int ndim, const int* shape, const char* const* names,
                                  dt_mesh_t* out) {
  *out = NULL;
  if (ndim < 1 || ndim > DT_MAX_MESH_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mesh ndim %d out of range [1, %d]", ndim,
                   DT_MAX_MESH_DIMS);
  if (shape == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "shape is NULL");
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1)
      return DT_FAIL(DT_ERR_INVALID_ARG, "mesh shape[%d] = %d must be at least 1", i, shape[i]);
    numel *= shape[i];
    if (numel > (1 << 24))
      return DT_FAIL(DT_ERR_INVALID_ARG, "mesh has more than 2^24 positions");
  }
  if (names != NULL) {
    for (int i = 0; i < ndim; i++) {
      if (names[i] == NULL || names[i][0] == '\0')
        return DT_FAIL(DT_ERR_INVALID_ARG, "names[%d] is NULL or empty", i);
      if (strlen(names[i]) >= DT_NAME_MAX)
        return DT_FAIL(DT_ERR_INVALID_ARG, "names[%d] '%s' longer than %d characters", i, names[i],
                       DT_NAME_MAX - 1);
      for (int j = 0; j < i; j++)
        if (strcmp(names[i], names[j]) == 0)
          return DT_FAIL(DT_ERR_INVALID_ARG, "names[%d] = '%s' is used twice (names[%d] too)", i,
                         names[i], j);
    }
  }
  dt_mesh_t m = (dt_mesh_t)dt__calloc(1, sizeof *m);
  if (m == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a mesh");
  static uint64_t next_id = 1;
  if (dt_handle_register(m, &dt__mesh_kind) != DT_SUCCESS) {
    dt__free(m);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "registering a mesh handle");
  }
  m->refcount = 1;
  m->user_ref = 1;
  m->id = next_id++;
  m->ndim = ndim;
  m->numel = (int)numel;
  m->backend = dt__backend_default();
  for (int i = 0; i < ndim; i++) {
    m->shape[i] = shape[i];
    if (names != NULL) snprintf(m->names[i], DT_NAME_MAX, "%s", names[i]);
  }
  *out = m;
  return DT_SUCCESS;
}

static void dt__mesh_link(dt_mesh_t m) {
  m->next = dt__meshes;
  if (m->next) m->next->prev = m;
  dt__meshes = m;
}

/* Applies fn to each of the mesh's communicators (the NCCL plane's first: they were
 * bootstrapped over the MPI ones). */
static void dt__mesh_each_comm(dt_mesh_t m, void (*fn)(dt_comm_t*)) {
  dt_mesh_plane_t* d = m->dev;
  if (d != NULL) {
    for (int s = 0; s < DT_ASYNC_SLOTS; s++)
      for (int k = 0; k < DT_SLOT_COMMS; k++) fn(&d->slot[s][k].comm);
    for (int f = 0; f < m->nflat; f++) fn(&d->flat[f]);
    for (int i = 0; i < m->ndim; i++) fn(&d->dim[i]);
    fn(&d->all);
  }
  for (int i = 0; i < m->ndim; i++) fn(&m->dim_comm[i]);
  fn(&m->all_comm);
  for (int f = 0; f < m->nflat; f++) fn(&m->flat[f].comm);
  for (int s = 0; s < DT_ASYNC_SLOTS; s++)
    for (int k = 0; k < DT_SLOT_COMMS; k++) fn(&m->slot_comm[s][k].comm);
}

static void dt__mesh_free_comms(dt_mesh_t m) {
  dt__mesh_each_comm(m, dt__comm_release);
  for (int s = 0; s < DT_ASYNC_SLOTS; s++)
    for (int k = 0; k < DT_SLOT_COMMS; k++) m->slot_comm[s][k].mask = 0;
  dt__free(m->dev);
  m->dev = NULL;
}

/* A communicator of mesh m's ranks that pass the same color (color < 0: none for this rank),
 * ranked by key: split from the library's world, or, on a simulated mesh, a simulated one of
 * `size` ranks in which this rank is `key`. */
static dt_status_t dt__mesh_comm_new(dt_mesh_t m, int color, int key, int size, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  if (m->simulated && !dt__ctx_simulated()) /* a sub-mesh of a mesh that outlived its simulation */
    return DT_FAIL(DT_ERR_NOT_INITIALIZED, "the simulation this mesh belongs to has ended "
                   "(dt_finalize)");
  if (m->simulated) return color < 0 ? DT_SUCCESS : dt__comm_sim_create(size, key, out);
  const dt_comm_t* w = dt__comm_world();
  if (w == NULL) return DT_FAIL(DT_ERR_NOT_INITIALIZED, "no world communicator (dt_init)");
  return w->iface->split(w, color, key, out);
}

/* Releases the NCCL plane (the MPI communicators stay). */
static void dt__mesh_plane_release(dt_mesh_t m) {
  dt_mesh_plane_t* d = m->dev;
  if (d == NULL) return;
  for (int s = 0; s < DT_ASYNC_SLOTS; s++)
    for (int k = 0; k < DT_SLOT_COMMS; k++) dt__comm_release(&d->slot[s][k].comm);
  for (int f = 0; f < DT_MAX_FLAT; f++) dt__comm_release(&d->flat[f]);
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) dt__comm_release(&d->dim[i]);
  dt__comm_release(&d->all);
  dt__free(d);
  m->dev = NULL;
}

static int dt__mesh_nccl_for(dt_mesh_t m, dt_backend_t b) {
  return m->dev_state > 0 && m->dev != NULL && m->dev->backend == b;
}

dt_status_t dt__mesh_slot_comm(dt_mesh_t m, dt_backend_t b, int slot, unsigned mask,
                               dt_comm_t** out) {
  *out = NULL;
  dt_slot_comm_t* sc = dt__mesh_nccl_for(m, b) ? m->dev->slot[slot] : m->slot_comm[slot];
  int k = 0;
  for (; k < DT_SLOT_COMMS && sc[k].mask != 0; k++)
    if (sc[k].mask == mask) {
      *out = &sc[k].comm;
      return DT_SUCCESS;
    }
  dt_comm_t* base = dt__mesh_data_comm(m, b, mask);
  if (base == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no communicator for mesh dims 0x%x", mask);
  if (k == DT_SLOT_COMMS)
    return DT_FAIL(DT_ERR_INTERNAL, "asynchronous slot %d has no room for dims 0x%x", slot, mask);
  DT_CHECK(base->iface->dup(base, &sc[k].comm));
  sc[k].mask = mask;
  *out = &sc[k].comm;
  return DT_SUCCESS;
}

/* The split of the mesh's members that groups the ranks differing only along the dims of mask:
 * color numbers the coordinates outside mask, key orders those inside (row-major). */
static void dt__mesh_mask_split(dt_mesh_t m, unsigned mask, int* color, int* key) {
  *color = 0;
  *key = 0;
  for (int i = 0; i < m->ndim; i++) {
    if (mask & (1u << i)) *key = *key * m->shape[i] + m->coords[i];
    else *color = *color * m->shape[i] + m->coords[i];
  }
}

/* This member's reason not to move device data over NCCL ("" when it can): the build, or a GPU
 * it shares with another member (real GPUs only: NCCL refuses two ranks on one). Collective over
 * the mesh's MPI communicator (the check of shared GPUs gathers every member's device). */
static dt_status_t dt__mesh_nccl_why(dt_mesh_t m, dt_backend_t b, char* why, size_t cap) {
  why[0] = '\0';
  if (b->kernel_set == DT_KERNELS_CUDA_EMU) return DT_SUCCESS; /* emulated: no such limit */
  int version = 0;
  if (b->kernel_set != DT_KERNELS_CUDA) {
    snprintf(why, cap, "backend %s has no NCCL communicator", b->name);
  } else if (dt__comm_nccl_version(&version) != DT_SUCCESS) {
    snprintf(why, cap, "%s", dt_last_error());
  }
  /* (host, device) of every member: a pair seen twice is a shared GPU. The device is its PCI
   * bus id (per-rank CUDA_VISIBLE_DEVICES makes every rank's ordinal 0) */
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  uint64_t h = 1469598103934665603ull; /* FNV-1a of the host name, then of the device */
  for (const char* c = host; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  uint64_t dev = (uint64_t)(b->ordinal + 1);
#ifdef DTENSOR_HAVE_CUDA
  if (b->kernel_set == DT_KERNELS_CUDA && dt__cuda_device_key(b, &dev) != DT_SUCCESS)
    snprintf(why, cap, "%s", dt_last_error());
#endif
  for (int k = 0; k < 8; k++) h = (h ^ ((dev >> (8 * k)) & 0xff)) * 1099511628211ull;
  int n = m->all_comm.size;
  int64_t* all = (int64_t*)dt__calloc((size_t)n * 3, sizeof *all);
  dt_status_t st = all ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "gathering the devices");
  DT_CHECK(dt__mesh_agree(m, st, "choosing the data plane")); /* before the gather */
  int64_t *counts = all + n, *displs = all + 2 * n;
  for (int r = 0; r < n; r++) {
    counts[r] = 1;
    displs[r] = r;
  }
  all[m->all_comm.rank] = (int64_t)h;
  st = m->all_comm.iface->all_gather_v(&m->all_comm, NULL, all, counts, displs, DT_I64, NULL);
  for (int r = 0; st == DT_SUCCESS && !why[0] && r < n; r++)
    for (int q = 0; q < r; q++)
      if (all[q] == all[r]) {
        snprintf(why, cap, "mesh ranks %d and %d use one GPU (NCCL refuses two ranks on one GPU)",
                 q, r);
        break;
      }
  dt__free(all);
  return st;
}

/* Makes the NCCL plane of backend b: a communicator bootstrapped over the mesh's MPI one, split
 * per dim and per flattened group. Collective over the members. */
static dt_status_t dt__mesh_plane_build(dt_mesh_t m, dt_backend_t b) {
  static const char* what = "making the mesh's NCCL communicators";
  dt_mesh_plane_t* d = (dt_mesh_plane_t*)dt__calloc(1, sizeof *d);
  dt_status_t st = d ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the NCCL plane");
  /* agreed after every step: the next one is collective, and NCCL's have no deadline */
  DT_CHECK(dt__mesh_agree(m, st, what));
  d->backend = b;
  m->dev = d; /* released with the mesh's communicators, also half made */
  st = dt__comm_nccl_world(b, &m->all_comm, &d->all);
  DT_CHECK(dt__mesh_agree(m, st, what));
  for (int i = 0; i < m->ndim; i++) {
    int color, key;
    dt__mesh_mask_split(m, 1u << i, &color, &key);
    st = d->all.iface->split(&d->all, color, key, &d->dim[i]);
    DT_CHECK(dt__mesh_agree(m, st, what));
  }
  for (int f = 0; f < m->nflat; f++) {
    int color, key;
    dt__mesh_mask_split(m, m->flat[f].mask, &color, &key);
    st = d->all.iface->split(&d->all, color, key, &d->flat[f]);
    DT_CHECK(dt__mesh_agree(m, st, what));
  }
  return DT_SUCCESS;
}

dt_status_t dt__mesh_data_plane(dt_mesh_t m, dt_backend_t b, int* nccl) {
  *nccl = 0;
  if (!dt__backend_is_device(b) || m->abstract || m->simulated || !m->member) return DT_SUCCESS;
  if (m->dev_state != 0) {
    *nccl = dt__mesh_nccl_for(m, b);
    return DT_SUCCESS;
  }
  /* $DTENSOR_DATA_COMM, agreed: ranks launched with different values must not take different
   * paths into the next collective */
  const char* env = getenv("DTENSOR_DATA_COMM");
  const char* mode = env == NULL || !env[0] ? "auto" : env;
  const int64_t kind = !strcmp(mode, "auto") ? 0 : !strcmp(mode, "nccl") ? 1
                       : !strcmp(mode, "mpi") ? 2 : 3;
  char why[512] = "";
  dt_status_t st = DT_SUCCESS;
  if (kind == 3)
    st = DT_FAIL(DT_ERR_INVALID_ARG, "DTENSOR_DATA_COMM=%s: expected auto, nccl or mpi", mode);
  else if (kind != 2)
    st = dt__mesh_nccl_why(m, b, why, sizeof why); /* collective over the mesh's MPI comm */
  /* max over the members of (failure, NCCL impossible here, kind, -kind) */
  int64_t v[4] = {st != DT_SUCCESS, why[0] != '\0', kind, -kind}, all[4] = {0, 0, 0, 0};
  DT_CHECK(m->all_comm.iface->all_reduce(&m->all_comm, v, all, 4, DT_I64, DT_REDUCE_MAX, NULL));
  if (all[0]) return st != DT_SUCCESS ? st : DT_FAIL(DT_ERR_INVALID_ARG, "another member of the "
                                                     "mesh failed to choose its data plane (see "
                                                     "its message)");
  if (all[2] != -all[3])
    return DT_FAIL(DT_ERR_INVALID_ARG, "DTENSOR_DATA_COMM differs between the mesh's ranks (this "
                   "one: %s): set it alike everywhere", mode);
  if (kind == 2) { /* mpi: host staging, chosen */
    m->dev_state = -1;
    return DT_SUCCESS;
  }
  if (all[1]) {
    if (kind == 1)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "DTENSOR_DATA_COMM=nccl, but %s", why[0] ? why :
                     "another member of the mesh cannot use NCCL (see its log)");
    m->dev_state = -1;
    if (m->all_comm.rank == 0 && getenv("DTENSOR_QUIET") == NULL)
      dt__log("comm", "device data of this %d-rank mesh moves through host-staged MPI: %s "
              "(DTENSOR_DATA_COMM=mpi chooses this, =nccl requires NCCL; DTENSOR_QUIET=1 hides "
              "this)", m->numel, why[0] ? why : "another member cannot use NCCL");
    return DT_SUCCESS;
  }
  st = dt__mesh_plane_build(m, b);
  if (st != DT_SUCCESS) {
    dt__mesh_plane_release(m);
    return st;
  }
  m->dev_state = 1;
  m->generation++; /* no host staging to price any more: cached plans go stale */
  *nccl = 1;
  return DT_SUCCESS;
}

static dt_status_t dt__mesh_data_plane_impl(dt_mesh_t mesh, dt_data_plane_t* plane) {
  DT_ARG_NOT_NULL(plane);
  *plane = DT_PLANE_MPI;
  DT_CHECK(dt__mesh_check(mesh));
  if (!dt__backend_is_device(mesh->backend) || mesh->abstract || mesh->simulated) return DT_SUCCESS;
  if (dt__mesh_nccl_for(mesh, mesh->backend)) *plane = DT_PLANE_NCCL;
  else if (mesh->dev_state != 0 || !mesh->member) *plane = DT_PLANE_MPI_STAGED;
  else *plane = DT_PLANE_UNDECIDED;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_data_plane(dt_mesh_t mesh, dt_data_plane_t* plane) {
  DT_ENTRY_RETURN(dt__mesh_data_plane_impl(mesh, plane));
}

dt_comm_t* dt__mesh_data_comm(dt_mesh_t m, dt_backend_t b, unsigned mask) {
  if (!dt__mesh_nccl_for(m, b)) return dt__mesh_group_comm(m, mask);
  dt_mesh_plane_t* d = m->dev;
  for (int i = 0; i < m->ndim; i++)
    if (mask == (1u << i)) return d->dim[i].iface ? &d->dim[i] : NULL;
  for (int f = 0; f < m->nflat; f++)
    if (m->flat[f].mask == mask) return d->flat[f].iface ? &d->flat[f] : NULL;
  if (mask == (1u << m->ndim) - 1u) return d->all.iface ? &d->all : NULL;
  return NULL;
}

void dt__mesh_close_all_comms(void) {
  for (dt_mesh_t m = dt__meshes; m != NULL; m = m->next) dt__mesh_each_comm(m, dt__comm_close);
}

void dt__mesh_reset_all_counters(void) {
  for (dt_mesh_t m = dt__meshes; m != NULL; m = m->next) memset(&m->counters, 0, sizeof m->counters);
}

static void dt__mesh_free(dt_mesh_t m) {
  if (m == NULL) return;
  if (m->prev) m->prev->next = m->next;
  else if (dt__meshes == m) dt__meshes = m->next;
  if (m->next) m->next->prev = m->prev;
  dt__mesh_free_comms(m);
  dt__free(m->ranks);
  dt_handle_unregister(m, &dt__mesh_kind, "mesh");
  dt_handle_free(m);
}

void dt__mesh_retain(dt_mesh_t m) { m->refcount++; }
void dt__mesh_release(dt_mesh_t m) {
  if (m != NULL && --m->refcount == 0) dt__mesh_free(m);
}

/* Splits the world into this mesh's communicators. Collective over the world: every world rank
 * calls it with the same mesh shape; `group` tells apart disjoint copies of the mesh (sub-meshes),
 * -1 for ranks outside any copy. */
static dt_status_t dt__mesh_build_comms(dt_mesh_t m, int group) {
  int in = m->member && group >= 0;
  for (int i = 0; i < m->ndim; i++) {
    int c[DT_MAX_MESH_DIMS];
    memcpy(c, m->coords, sizeof c);
    c[i] = 0;
    int color = in ? group * m->numel + dt__grid_index(m->ndim, m->shape, c) : -1;
    DT_CHECK(dt__mesh_comm_new(m, color, in ? m->coords[i] : 0, m->shape[i], &m->dim_comm[i]));
  }
  int key = in ? dt__grid_index(m->ndim, m->shape, m->coords) : 0;
  DT_CHECK(dt__mesh_comm_new(m, in ? group : -1, key, m->numel, &m->all_comm));
  return DT_SUCCESS;
}

static dt_status_t dt__mesh_create_impl(int ndim, const int* shape, const char* const* names,
                                        const int* ranks, dt_mesh_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__require_init("dt_mesh_create"));
  dt_mesh_t m = NULL;
  DT_CHECK(dt__mesh_alloc(ndim, shape, names, &m));
  dt_status_t st = DT_SUCCESS;
  int world = dt__world_size(), me = dt__world_rank(), pos = -1;
  if (ranks == NULL && m->numel != world) {
    st = DT_FAIL(DT_ERR_INVALID_ARG,
                 "mesh has %d positions but the world has %d ranks (pass explicit ranks for a "
                 "mesh over part of the world)",
                 m->numel, world);
    goto fail;
  }
  m->ranks = (int*)dt__malloc(sizeof(int) * (size_t)m->numel);
  if (m->ranks == NULL) {
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the rank table");
    goto fail;
  }
  for (int p = 0; p < m->numel; p++) {
    int r = ranks ? ranks[p] : p;
    if (r < 0 || r >= world) {
      st = DT_FAIL(DT_ERR_INVALID_ARG, "ranks[%d] = %d out of range [0, %d)", p, r, world);
      goto fail;
    }
    m->ranks[p] = r;
    if (r == me) {
      if (pos >= 0) {
        st = DT_FAIL(DT_ERR_INVALID_ARG, "world rank %d appears twice in ranks", r);
        goto fail;
      }
      pos = p;
    }
  }
  /* Duplicates among other ranks: check the whole list (same answer on every rank). */
  for (int p = 0; ranks && p < m->numel; p++)
    for (int q = 0; q < p; q++)
      if (ranks[p] == ranks[q]) {
        st = DT_FAIL(DT_ERR_INVALID_ARG, "world rank %d appears twice in ranks", ranks[p]);
        goto fail;
      }
  m->member = pos >= 0;
  if (m->member) dt__grid_coords(ndim, m->shape, pos, m->coords);
  m->simulated = dt__ctx_simulated();
  if (m->simulated) m->backend = &dt__backend_meta; /* nothing of a simulated run has bytes */
  if (!m->simulated && m->backend == &dt__backend_meta) {
    st = DT_FAIL(DT_ERR_INVALID_USAGE, "the default backend is 'meta' (no memory): it belongs "
                 "to simulated worlds (dt_init_simulated); choose another ($DTENSOR_BACKEND, "
                 "dt_backend_set_default)");
    goto fail;
  }
  DT_CHECK_GOTO(dt__mesh_build_comms(m, 0), st, fail);
  dt__mesh_link(m);
  if ((dt__debug_mask() & DT_DBG_MESH) && me == 0)
    dt__log("mesh", "created %d-dim mesh of %d ranks", ndim, m->numel);
  *out = m;
  return DT_SUCCESS;
fail:
  dt__mesh_free(m);
  return st;
}

dt_status_t dt_mesh_create(int ndim, const int* shape, const char* const* names, const int* ranks,
                           dt_mesh_t* out) {
  DT_ENTRY_RETURN(dt__mesh_create_impl(ndim, shape, names, ranks, out));
}

static dt_status_t dt__mesh_create_abstract_impl(int ndim, const int* shape,
                                                 const char* const* names, dt_mesh_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_mesh_t m = NULL;
  DT_CHECK(dt__mesh_alloc(ndim, shape, names, &m));
  m->abstract = 1;
  dt__mesh_link(m);
  *out = m;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_create_abstract(int ndim, const int* shape, const char* const* names,
                                    dt_mesh_t* out) {
  DT_ENTRY_RETURN(dt__mesh_create_abstract_impl(ndim, shape, names, out));
}

static dt_status_t dt__mesh_destroy_impl(dt_mesh_t mesh) {
  if (mesh == NULL) return DT_SUCCESS;
  DT_CHECK(dt__mesh_check(mesh));
  if (!mesh->user_ref)
    return DT_FAIL(DT_ERR_INVALID_USAGE,
                   "mesh was already destroyed (it lives on only while %d tensors or works hold "
                   "it)", mesh->refcount);
  mesh->user_ref = 0;
  dt__mesh_release(mesh);
  return DT_SUCCESS;
}

dt_status_t dt_mesh_destroy(dt_mesh_t mesh) {
  DT_ENTRY_RETURN(dt__mesh_destroy_impl(mesh));
}

static dt_status_t dt__mesh_set_backend_impl(dt_mesh_t mesh, dt_backend_t backend) {
  DT_CHECK(dt__mesh_check(mesh));
  DT_CHECK(dt__backend_check(backend));
  if (mesh->simulated && backend != &dt__backend_meta)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "mesh is simulated (dt_init_simulated): its tensors are "
                   "meta, backend '%s' cannot hold them", backend->name);
  if (!mesh->simulated && backend == &dt__backend_meta)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "backend 'meta' holds no memory: it belongs to simulated "
                   "worlds (dt_init_simulated), this mesh communicates for real");
  mesh->backend = backend;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_set_backend(dt_mesh_t mesh, dt_backend_t backend) {
  DT_ENTRY_RETURN(dt__mesh_set_backend_impl(mesh, backend));
}

static dt_status_t dt__mesh_backend_impl(dt_mesh_t mesh, dt_backend_t* backend) {
  DT_ARG_NOT_NULL(backend);
  *backend = NULL;
  DT_CHECK(dt__mesh_check(mesh));
  *backend = mesh->backend;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_backend(dt_mesh_t mesh, dt_backend_t* backend) {
  DT_ENTRY_RETURN(dt__mesh_backend_impl(mesh, backend));
}

static dt_status_t dt__mesh_ndim_impl(dt_mesh_t mesh, int* ndim) {
  DT_ARG_NOT_NULL(ndim);
  *ndim = 0;
  DT_CHECK(dt__mesh_check(mesh));
  *ndim = mesh->ndim;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_ndim(dt_mesh_t mesh, int* ndim) {
  DT_ENTRY_RETURN(dt__mesh_ndim_impl(mesh, ndim));
}

static dt_status_t dt__mesh_size_impl(dt_mesh_t mesh, int dim, int* size) {
  DT_ARG_NOT_NULL(size);
  *size = 0;
  DT_CHECK(dt__mesh_check(mesh));
  int d = 0;
  DT_CHECK(dt__mesh_dim(mesh, dim, &d));
  *size = mesh->shape[d];
  return DT_SUCCESS;
}

dt_status_t dt_mesh_size(dt_mesh_t mesh, int dim, int* size) {
  DT_ENTRY_RETURN(dt__mesh_size_impl(mesh, dim, size));
}

static dt_status_t dt__mesh_shape_impl(dt_mesh_t mesh, int* shape) {
  DT_ARG_NOT_NULL(shape);
  DT_CHECK(dt__mesh_check(mesh));
  memcpy(shape, mesh->shape, sizeof(int) * (size_t)mesh->ndim);
  return DT_SUCCESS;
}

dt_status_t dt_mesh_shape(dt_mesh_t mesh, int* shape) {
  DT_ENTRY_RETURN(dt__mesh_shape_impl(mesh, shape));
}

static dt_status_t dt__mesh_numel_impl(dt_mesh_t mesh, int* numel) {
  DT_ARG_NOT_NULL(numel);
  *numel = 0;
  DT_CHECK(dt__mesh_check(mesh));
  *numel = mesh->numel;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_numel(dt_mesh_t mesh, int* numel) {
  DT_ENTRY_RETURN(dt__mesh_numel_impl(mesh, numel));
}

static dt_status_t dt__mesh_need_member(dt_mesh_t m) {
  if (m->abstract)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "mesh is abstract: an abstract mesh has no rank "
                   "coordinates");
  if (!m->member)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "this rank (world rank %d) is not a member of mesh",
                   dt__world_rank());
  return DT_SUCCESS;
}

/* "'dp', 'tp'" (the dims that have a name), or "none has a name". */
static void dt__mesh_dim_names(dt_mesh_t m, char* buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < m->ndim && used < cap; i++) {
    if (m->names[i][0] == '\0') continue;
    int w = snprintf(buf + used, cap - used, "%s'%s'", used ? ", " : "", m->names[i]);
    if (w > 0) used += (size_t)w;
  }
  if (used == 0) snprintf(buf, cap, "none has a name");
}

static dt_status_t dt__mesh_coordinate_impl(dt_mesh_t mesh, int* coords) {
  DT_ARG_NOT_NULL(coords);
  DT_CHECK(dt__mesh_check(mesh));
  DT_CHECK(dt__mesh_need_member(mesh));
  memcpy(coords, mesh->coords, sizeof(int) * (size_t)mesh->ndim);
  return DT_SUCCESS;
}

dt_status_t dt_mesh_coordinate(dt_mesh_t mesh, int* coords) {
  DT_ENTRY_RETURN(dt__mesh_coordinate_impl(mesh, coords));
}

static dt_status_t dt__mesh_local_rank_impl(dt_mesh_t mesh, int dim, int* rank) {
  DT_ARG_NOT_NULL(rank);
  *rank = -1;
  DT_CHECK(dt__mesh_check(mesh));
  int d = 0;
  DT_CHECK(dt__mesh_dim(mesh, dim, &d));
  DT_CHECK(dt__mesh_need_member(mesh));
  *rank = mesh->coords[d];
  return DT_SUCCESS;
}

dt_status_t dt_mesh_local_rank(dt_mesh_t mesh, int dim, int* rank) {
  DT_ENTRY_RETURN(dt__mesh_local_rank_impl(mesh, dim, rank));
}

static dt_status_t dt__mesh_is_member_impl(dt_mesh_t mesh, int* member) {
  DT_ARG_NOT_NULL(member);
  *member = 0;
  DT_CHECK(dt__mesh_check(mesh));
  *member = mesh->member;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_is_member(dt_mesh_t mesh, int* member) {
  DT_ENTRY_RETURN(dt__mesh_is_member_impl(mesh, member));
}

static dt_status_t dt__mesh_is_abstract_impl(dt_mesh_t mesh, int* abstract) {
  DT_ARG_NOT_NULL(abstract);
  *abstract = 0;
  DT_CHECK(dt__mesh_check(mesh));
  *abstract = mesh->abstract;
  return DT_SUCCESS;
}

dt_status_t dt_mesh_is_abstract(dt_mesh_t mesh, int* abstract) {
  DT_ENTRY_RETURN(dt__mesh_is_abstract_impl(mesh, abstract));
}

static dt_status_t dt__mesh_dim_name_impl(dt_mesh_t mesh, int dim, const char** name) {
  DT_ARG_NOT_NULL(name);
  *name = NULL;
  DT_CHECK(dt__mesh_check(mesh));
  int d = 0;
  DT_CHECK(dt__mesh_dim(mesh, dim, &d));
  *name = mesh->names[d];
  return DT_SUCCESS;
}

dt_status_t dt_mesh_dim_name(dt_mesh_t mesh, int dim, const char** name) {
  DT_ENTRY_RETURN(dt__mesh_dim_name_impl(mesh, dim, name));
}

static dt_status_t dt__mesh_dim_index_impl(dt_mesh_t mesh, const char* name, int* dim) {
  DT_ARG_NOT_NULL(dim);
  *dim = -1;
  DT_CHECK(dt__mesh_check(mesh));
  DT_ARG_NOT_NULL(name);
  for (int i = 0; i < mesh->ndim; i++)
    if (mesh->names[i][0] && strcmp(mesh->names[i], name) == 0) {
      *dim = i;
      return DT_SUCCESS;
    }
  char dims[DT_MAX_MESH_DIMS * (DT_NAME_MAX + 4) + 1];
  dt__mesh_dim_names(mesh, dims, sizeof dims);
  return DT_FAIL(DT_ERR_INVALID_ARG, "name '%s': the mesh has no dim of that name (its dims: %s)",
                 name, dims);
}

dt_status_t dt_mesh_dim_index(dt_mesh_t mesh, const char* name, int* dim) {
  DT_ENTRY_RETURN(dt__mesh_dim_index_impl(mesh, name, dim));
}

static dt_status_t dt__mesh_rank_at_impl(dt_mesh_t mesh, const int* coords, int* world_rank) {
  DT_ARG_NOT_NULL(world_rank);
  *world_rank = -1;
  DT_CHECK(dt__mesh_check(mesh));
  DT_ARG_NOT_NULL(coords);
  if (mesh->abstract)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "mesh is abstract: an abstract mesh has no world ranks");
  for (int i = 0; i < mesh->ndim; i++)
    if (coords[i] < 0 || coords[i] >= mesh->shape[i])
      return DT_FAIL(DT_ERR_INVALID_ARG, "coords[%d] = %d out of range [0, %d)", i, coords[i],
                     mesh->shape[i]);
  *world_rank = mesh->ranks[dt__grid_index(mesh->ndim, mesh->shape, coords)];
  return DT_SUCCESS;
}

dt_status_t dt_mesh_rank_at(dt_mesh_t mesh, const int* coords, int* world_rank) {
  DT_ENTRY_RETURN(dt__mesh_rank_at_impl(mesh, coords, world_rank));
}

/* Builds the mesh made of the dims in `mask` (ascending) for this rank's other coordinates;
 * flat != 0 makes it one flattened dim. */
static dt_status_t dt__mesh_sub(dt_mesh_t p, unsigned mask, int flat, const char* flat_name,
                                dt_mesh_t* out) {
  int nd = 0, shape[DT_MAX_MESH_DIMS], prod = 1;
  const char* names[DT_MAX_MESH_DIMS];
  int named = 1;
  for (int i = 0; i < p->ndim; i++)
    if (mask & (1u << i)) {
      shape[nd] = p->shape[i];
      names[nd] = p->names[i];
      named &= p->names[i][0] != '\0';
      prod *= p->shape[i];
      nd++;
    }
  const char* fname[1] = {flat_name};
  dt_mesh_t m = NULL;
  if (flat)
    DT_CHECK(dt__mesh_alloc(1, &prod, (flat_name && flat_name[0]) ? fname : NULL, &m));
  else
    DT_CHECK(dt__mesh_alloc(nd, shape, named ? names : NULL, &m));
  dt_status_t st = DT_SUCCESS;
  m->abstract = p->abstract;
  m->simulated = p->simulated;
  m->backend = p->backend;
  if (!p->abstract) {
    m->member = p->member;
    /* group = linear index over the dims not kept; coords = kept coords. */
    int group = 0, k = 0, sub[DT_MAX_MESH_DIMS];
    for (int i = 0; i < p->ndim; i++) {
      if (mask & (1u << i)) sub[k++] = p->coords[i];
      else group = group * p->shape[i] + p->coords[i];
    }
    if (flat) m->coords[0] = dt__grid_index(nd, shape, sub);
    else memcpy(m->coords, sub, sizeof sub);
    m->ranks = (int*)dt__malloc(sizeof(int) * (size_t)m->numel);
    if (m->ranks == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the rank table");
      goto fail;
    }
    for (int q = 0; q < m->numel; q++) {
      int c[DT_MAX_MESH_DIMS], pc[DT_MAX_MESH_DIMS];
      dt__grid_coords(nd, shape, q, c);
      for (int i = 0, j = 0; i < p->ndim; i++)
        pc[i] = (mask & (1u << i)) ? c[j++] : p->coords[i];
      m->ranks[q] = p->member ? p->ranks[dt__grid_index(p->ndim, p->shape, pc)] : -1;
    }
    DT_CHECK_GOTO(dt__mesh_build_comms(m, p->member ? group : -1), st, fail);
  }
  dt__mesh_link(m);
  *out = m;
  return DT_SUCCESS;
fail:
  dt__mesh_free(m);
  return st;
}

static dt_status_t dt__mesh_slice_impl(dt_mesh_t mesh, int nnames, const char* const* names,
                                       dt_mesh_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__mesh_check(mesh));
  DT_ARG_NOT_NULL(names);
  if (nnames < 1 || nnames > mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "nnames %d out of range [1, %d]", nnames, mesh->ndim);
  if (nnames == 1 && names[0] != NULL)
    for (int f = 0; f < mesh->nflat; f++)
      if (strcmp(mesh->flat[f].name, names[0]) == 0)
        return dt__mesh_sub(mesh, mesh->flat[f].mask, 1, mesh->flat[f].name, out);
  unsigned mask = 0;
  int last = -1;
  for (int k = 0; k < nnames; k++) {
    if (names[k] == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "names[%d] is NULL", k);
    int d = -1;
    for (int i = 0; i < mesh->ndim; i++)
      if (mesh->names[i][0] && strcmp(mesh->names[i], names[k]) == 0) d = i;
    if (d < 0) {
      char dims[DT_MAX_MESH_DIMS * (DT_NAME_MAX + 4) + 1];
      dt__mesh_dim_names(mesh, dims, sizeof dims);
      return DT_FAIL(DT_ERR_INVALID_ARG, "names[%d] = '%s': the mesh has no dim of that name (its "
                     "dims: %s)", k, names[k], dims);
    }
    if (d <= last)
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "names[%d] = '%s' repeated or out of mesh order (slice dims in mesh order)",
                     k, names[k]);
    last = d;
    mask |= 1u << d;
  }
  return dt__mesh_sub(mesh, mask, 0, NULL, out);
}

dt_status_t dt_mesh_slice(dt_mesh_t mesh, int nnames, const char* const* names, dt_mesh_t* out) {
  DT_ENTRY_RETURN(dt__mesh_slice_impl(mesh, nnames, names, out));
}

static dt_status_t dt__mesh_flatten_impl(dt_mesh_t mesh, int ndims, const int* dims,
                                         const char* name, dt_mesh_t* out) {
  if (out) *out = NULL;
  DT_CHECK(dt__mesh_check(mesh));
  DT_ARG_NOT_NULL(dims);
  if (ndims < 1 || ndims > mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "ndims %d out of range [1, %d]", ndims, mesh->ndim);
  unsigned mask = 0;
  for (int k = 0; k < ndims; k++) {
    if (dims[k] < 0 || dims[k] >= mesh->ndim)
      return DT_FAIL(DT_ERR_INVALID_ARG, "dims[%d] = %d out of range [0, %d)", k, dims[k],
                     mesh->ndim);
    if (k > 0 && dims[k] <= dims[k - 1])
      return DT_FAIL(DT_ERR_INVALID_ARG, "dims must be strictly ascending (dims[%d] = %d)", k,
                     dims[k]);
    mask |= 1u << dims[k];
  }
  if (name != NULL && strlen(name) >= DT_NAME_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "name '%s' longer than %d characters", name,
                   DT_NAME_MAX - 1);
  char defname[DT_NAME_MAX];
  if (name == NULL || name[0] == '\0') {
    int w = 0;
    for (int k = 0; k < ndims; k++)
      w += snprintf(defname + w, sizeof defname - (size_t)w, "%s%d", k ? "_" : "d", dims[k]);
    name = defname;
  }
  dt_flat_group_t* g = NULL;
  for (int f = 0; f < mesh->nflat; f++)
    if (mesh->flat[f].mask == mask) g = &mesh->flat[f];
  if (g == NULL && ndims > 1) {
    for (int f = 0; f < mesh->nflat; f++)
      if (strcmp(mesh->flat[f].name, name) == 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "a flattened dim is already called '%s'", name);
    for (int i = 0; i < mesh->ndim; i++)
      if (strcmp(mesh->names[i], name) == 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "'%s' is already a mesh dim name", name);
    if (mesh->nflat == DT_MAX_FLAT)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "at most %d flattened dims per mesh", DT_MAX_FLAT);
    dt_flat_group_t ng;
    memset(&ng, 0, sizeof ng);
    ng.mask = mask;
    snprintf(ng.name, DT_NAME_MAX, "%s", name);
    if (!mesh->abstract) {
      int color = -1, key = 0, size = 1;
      if (mesh->member) dt__mesh_mask_split(mesh, mask, &color, &key);
      for (int i = 0; i < mesh->ndim; i++)
        if (mask & (1u << i)) size *= mesh->shape[i];
      DT_CHECK(dt__mesh_comm_new(mesh, color, key, size, &ng.comm));
      if (mesh->member && mesh->dev_state > 0) { /* the NCCL plane gets the group too */
        dt_mesh_plane_t* d = mesh->dev;
        dt_status_t st = d->all.iface->split(&d->all, color, key, &d->flat[mesh->nflat]);
        if (st != DT_SUCCESS) {
          dt__comm_release(&ng.comm);
          return st;
        }
      }
    }
    mesh->flat[mesh->nflat++] = ng;
    g = &mesh->flat[mesh->nflat - 1];
    mesh->generation++; /* merged plans may now be cheaper: cached plans of this mesh go stale */
  }
  if (out == NULL) return DT_SUCCESS;
  return dt__mesh_sub(mesh, mask, 1, g ? g->name : name, out);
}

dt_status_t dt_mesh_flatten(dt_mesh_t mesh, int ndims, const int* dims, const char* name,
                            dt_mesh_t* out) {
  DT_ENTRY_RETURN(dt__mesh_flatten_impl(mesh, ndims, dims, name, out));
}

dt_comm_t* dt__mesh_group_comm(dt_mesh_t m, unsigned mask) {
  for (int i = 0; i < m->ndim; i++)
    if (mask == (1u << i)) return m->dim_comm[i].iface ? &m->dim_comm[i] : NULL;
  for (int f = 0; f < m->nflat; f++)
    if (m->flat[f].mask == mask) return m->flat[f].comm.iface ? &m->flat[f].comm : NULL;
  if (mask == (1u << m->ndim) - 1u) return m->all_comm.iface ? &m->all_comm : NULL;
  return NULL;
}

dt_status_t dt__mesh_agree(dt_mesh_t m, dt_status_t st, const char* what) {
  if (m->abstract || !m->member || m->numel == 1) return st;
  dt_comm_t* c = &m->all_comm;
  /* max over ranks of (status, lowest failing rank): one 8-byte all-reduce */
  int64_t mine = ((int64_t)st << 32) | (int64_t)(0x7fffffff - c->rank), all = 0;
  char saved[1024], text[512];
  snprintf(saved, sizeof saved, "%s", dt_last_error());
  snprintf(text, sizeof text, "%s", dt__last_error_text());
  dt_status_t cst = c->iface->all_reduce(c, &mine, &all, 1, DT_I64, DT_REDUCE_MAX, NULL);
  if (cst != DT_SUCCESS) return cst;
  dt_status_t agreed = (dt_status_t)(all >> 32);
  if (agreed == DT_SUCCESS) return DT_SUCCESS;
  int who = 0x7fffffff - (int)(all & 0xffffffff);
  /* the failure path only: the lowest failing rank tells the others why (512 bytes) */
  int32_t why[128];
  memset(why, 0, sizeof why);
  if (c->rank == who) memcpy(why, text, sizeof why); /* without the entry the others name too */
  dt_status_t bst = c->iface->broadcast(c, why, 128, DT_I32, who, NULL);
  ((char*)why)[sizeof why - 1] = '\0';
  if (st != DT_SUCCESS) {
    dt__error_restore(saved); /* this rank's own message, the agreed status */
    return agreed;
  }
  if (bst != DT_SUCCESS || ((char*)why)[0] == '\0')
    return DT_FAIL(agreed, "%s failed on rank %d of the mesh (%s there); every rank of the mesh "
                   "returns it", what, who, dt_status_name(agreed));
  return DT_FAIL(agreed, "%s failed on rank %d of the mesh (%s there: %s); every rank of the "
                 "mesh returns it", what, who, dt_status_name(agreed), (const char*)why);
}

/* ---------------------------------------------------------------------------------------------
 * control values in host memory */

static dt_status_t dt__mesh_all_reduce_host_impl(dt_mesh_t mesh, int n_dims, const int* dims,
                                                 void* buf, int64_t numel, dt_dtype_t dtype,
                                                 dt_reduce_op_t op) {
  DT_CHECK(dt__mesh_check(mesh));
  if (dtype != DT_F32 && dtype != DT_I32 && dtype != DT_I64)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dtype %s is not reduced on the host (valid: f32, i32 or "
                   "i64)", dt_dtype_name(dtype));
  if (op != DT_REDUCE_SUM && op != DT_REDUCE_AVG && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op=%d is not a host reduction (valid: DT_REDUCE_SUM, "
                   "DT_REDUCE_AVG, DT_REDUCE_MAX or DT_REDUCE_MIN)", (int)op);
  if (numel < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "numel=%lld is negative (valid: 0 or more)",
                   (long long)numel);
  if (n_dims < 0 || n_dims > mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_dims=%d out of range for a %d-dim mesh (valid: 0 to "
                   "%d; 0 means every dim)", n_dims, mesh->ndim, mesh->ndim);
  if (n_dims > 0 && dims == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dims is NULL with n_dims=%d", n_dims);
  unsigned mask = 0;
  for (int i = 0; i < n_dims; i++) {
    int d = dims[i] < 0 ? dims[i] + mesh->ndim : dims[i];
    if (d < 0 || d >= mesh->ndim || (mask & (1u << d)))
      return DT_FAIL(DT_ERR_INVALID_ARG, "dims[%d]=%d out of range or repeated (valid: %d to %d, "
                     "each dim once)", i, dims[i], -mesh->ndim, mesh->ndim - 1);
    mask |= 1u << d;
  }
  if (n_dims == 0 || dims == NULL) mask = (1u << mesh->ndim) - 1u;
  if (numel > 0) DT_ARG_NOT_NULL(buf);
  if (mesh->abstract || !mesh->member || numel == 0) return DT_SUCCESS;
  const dt_reduce_op_t cop = op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op;
  int group = 1;
  dt_comm_t* c = dt__mesh_group_comm(mesh, mask); /* one call where a communicator spans them */
  const uint64_t nb = (uint64_t)numel * dt__itemsize(dtype);
  if (c != NULL) {
    if (c->size > 1) {
      DT_CHECK(c->iface->all_reduce(c, buf, buf, numel, dtype, cop, NULL));
      dt__count_collective(mesh, mask, DT_COLL_ALL_REDUCE, nb);
    }
    group = c->size;
  } else { /* dim by dim: every rank gets the same values after each step */
    for (int d = 0; d < mesh->ndim; d++) {
      if (!(mask & (1u << d))) continue;
      c = &mesh->dim_comm[d];
      if (c->iface != NULL && c->size > 1) {
        DT_CHECK(c->iface->all_reduce(c, buf, buf, numel, dtype, cop, NULL));
        dt__count_collective(mesh, 1u << d, DT_COLL_ALL_REDUCE, nb);
      }
      group *= mesh->shape[d];
    }
  }
  if (op == DT_REDUCE_AVG && group > 1)
    for (int64_t i = 0; i < numel; i++) {
      if (dtype == DT_F32) ((float*)buf)[i] /= (float)group;
      else if (dtype == DT_I32) ((int32_t*)buf)[i] /= group;
      else ((int64_t*)buf)[i] /= group;
    }
  return DT_SUCCESS;
}

dt_status_t dt_mesh_all_reduce_host(dt_mesh_t mesh, int n_dims, const int* dims, void* buf,
                                    int64_t numel, dt_dtype_t dtype, dt_reduce_op_t op) {
  DT_ENTRY_RETURN(dt__mesh_all_reduce_host_impl(mesh, n_dims, dims, buf, numel, dtype, op));
}

static dt_status_t dt__mesh_agree_impl(dt_mesh_t mesh, dt_status_t st, const char* what) {
  if (st != DT_SUCCESS && (st < 0 || st >= DT_STATUS_COUNT)) /* still takes part: a rank that */
    st = DT_FAIL(DT_ERR_INVALID_ARG, "st=%d is not a dt_status_t", (int)st); /* left would hang */
  DT_CHECK(dt__mesh_check(mesh));
  return dt__mesh_agree(mesh, st, what != NULL && what[0] ? what : "a step");
}

dt_status_t dt_mesh_agree(dt_mesh_t mesh, dt_status_t st, const char* what) {
  DT_ENTRY_RETURN(dt__mesh_agree_impl(mesh, st, what));
}

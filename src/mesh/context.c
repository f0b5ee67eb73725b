/* context.c - library init/finalize, the world, persistent workspace buffers and counters. */
#include "internal/core.h"

dt_ctx_t dt__ctx;

dt_status_t dt__require_init(const char* what) {
  if (!dt__ctx.initialized)
    return DT_FAIL(DT_ERR_NOT_INITIALIZED, "%s needs dt_init() first", what);
  return DT_SUCCESS;
}

dt_status_t dt_init(int* argc, char*** argv) {
  if (dt__ctx.initialized) return DT_FAIL(DT_ERR_INVALID_USAGE, "dt_init called twice");
  if ((argc == NULL) != (argv == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "argc and argv must both be NULL or both be set");
  dt_status_t st = dt__comm_mpi_init(argc, argv, &dt__ctx.we_init_mpi);
  if (st != DT_SUCCESS) return st;
  dt_comm_t world;
  st = dt__comm_mpi_world(&world);
  if (st != DT_SUCCESS) return st;
  dt__ctx.world_rank = world.rank;
  dt__ctx.world_size = world.size;
  dt__comm_release(&world);
  dt__ctx.initialized = 1;
  /* A missing cost file is fine; a broken one is reported but does not fail init. */
  if (dt__cost_model_autoload() != DT_SUCCESS && dt__ctx.world_rank == 0)
    dt__log("cost", "ignoring calibrated cost model: %s", dt_last_error());
  dt_clear_error();
  return DT_SUCCESS;
}

static void (*dt__finalizers[8])(void);
static int dt__nfinalizers = 0;

void dt__at_finalize(void (*fn)(void)) {
  for (int i = 0; i < dt__nfinalizers; i++)
    if (dt__finalizers[i] == fn) return;
  if (dt__nfinalizers < 8) dt__finalizers[dt__nfinalizers++] = fn;
}

dt_status_t dt_finalize(void) {
  for (int i = 0; i < dt__nfinalizers; i++) dt__finalizers[i]();
  if (!dt__ctx.initialized) return DT_SUCCESS;
  dt__ws_release();
  /* Meshes still alive keep their communicators until MPI goes away; free them now. */
  for (dt_mesh_t m = dt__ctx.meshes; m != NULL; m = m->next) {
    for (int i = 0; i < m->ndim; i++) dt__comm_release(&m->dim_comm[i]);
    dt__comm_release(&m->all_comm);
    for (int f = 0; f < m->nflat; f++) dt__comm_release(&m->flat[f].comm);
  }
  dt_status_t st = dt__comm_mpi_finalize(dt__ctx.we_init_mpi);
  dt_mesh_t keep = dt__ctx.meshes;
  memset(&dt__ctx, 0, sizeof dt__ctx);
  dt__ctx.meshes = keep;
  return st;
}

dt_status_t dt_world_rank(int* rank) {
  DT_ARG_NOT_NULL(rank);
  *rank = -1;
  DT_CHECK(dt__require_init("dt_world_rank"));
  *rank = dt__ctx.world_rank;
  return DT_SUCCESS;
}

dt_status_t dt_world_size(int* size) {
  DT_ARG_NOT_NULL(size);
  *size = 0;
  DT_CHECK(dt__require_init("dt_world_size"));
  *size = dt__ctx.world_size;
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * workspace: grow-only buffers reused by every redistribute, so the steady path never allocates */

dt_status_t dt__ws_reserve(int slot, size_t nbytes, void** out) {
  dt_workspace_t* w = &dt__ctx.ws;
  if (nbytes > w->cap[slot]) {
    size_t cap = w->cap[slot] ? w->cap[slot] : 4096;
    while (cap < nbytes) cap *= 2;
    void* p = dt__malloc(cap);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "workspace of %zu bytes", cap);
    dt__free(w->buf[slot]);
    w->buf[slot] = p;
    w->cap[slot] = cap;
  }
  *out = w->buf[slot];
  return DT_SUCCESS;
}

dt_status_t dt__ws_ints(size_t count, int** out) {
  dt_workspace_t* w = &dt__ctx.ws;
  if (count > w->ints_cap) {
    size_t cap = count < 64 ? 64 : count;
    int* p = (int*)dt__realloc(w->ints, cap * sizeof(int));
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "workspace of %zu ints", cap);
    w->ints = p;
    w->ints_cap = cap;
  }
  *out = w->ints;
  return DT_SUCCESS;
}

void dt__ws_release(void) {
  dt_workspace_t* w = &dt__ctx.ws;
  for (int i = 0; i < 4; i++) dt__free(w->buf[i]);
  dt__free(w->ints);
  memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------------------------------------
 * counters */

void dt__count(dt_mesh_t m, unsigned mask, dt_collective_t c, uint64_t nbytes) {
  dt_counters_t* cs[2] = {&m->counters, &dt__ctx.counters};
  int single = -1;
  for (int i = 0; i < m->ndim; i++)
    if (mask == (1u << i)) single = i;
  for (int k = 0; k < 2; k++) {
    cs[k]->calls[c]++;
    cs[k]->nbytes[c] += nbytes;
    if (single >= 0) {
      cs[k]->dim_calls[single][c]++;
      cs[k]->dim_nbytes[single][c] += nbytes;
    } else {
      cs[k]->flat_calls[c]++;
      cs[k]->flat_nbytes[c] += nbytes;
    }
  }
}

dt_status_t dt_counters_get(dt_mesh_t mesh, dt_counters_t* out) {
  DT_ARG_NOT_NULL(out);
  if (mesh != NULL) DT_CHECK(dt__mesh_check(mesh));
  *out = mesh ? mesh->counters : dt__ctx.counters;
  return DT_SUCCESS;
}

dt_status_t dt_counters_reset(dt_mesh_t mesh) {
  if (mesh != NULL) {
    DT_CHECK(dt__mesh_check(mesh));
    memset(&mesh->counters, 0, sizeof mesh->counters);
    return DT_SUCCESS;
  }
  memset(&dt__ctx.counters, 0, sizeof dt__ctx.counters);
  for (dt_mesh_t m = dt__ctx.meshes; m != NULL; m = m->next)
    memset(&m->counters, 0, sizeof m->counters);
  return DT_SUCCESS;
}

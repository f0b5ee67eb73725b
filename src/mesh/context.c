/* context.c - the library context: the world, the collective count arrays and the collective
 * counters. dt_init and dt_finalize (src/lib.c) call dt__ctx_init and dt__ctx_finalize.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include "mesh/mesh.h"

static struct {
  int initialized, finalized, simulated;
  double imbalance; /* simulated MoE routing (dt_sim_set_routing_imbalance) */
  int world_rank, world_size;
  int64_t* counts; /* counts/displs arrays of blocking collectives */
  size_t ints_cap;
  dt_counters_t counters; /* all meshes */
} dt__ctx = {.world_rank = -1};

dt_status_t dt__ctx_init(void) {
  const dt_comm_t* world = dt__comm_world();
  if (world == NULL) return DT_FAIL(DT_ERR_NOT_INITIALIZED, "the comm layer has no world");
  dt__ctx.world_rank = world->rank;
  dt__ctx.world_size = world->size;
  dt__ctx.initialized = 1;
  dt__ctx.finalized = 0;
  return DT_SUCCESS;
}

dt_status_t dt__ctx_init_simulated(int size, int rank) {
  dt__ctx.world_rank = rank;
  dt__ctx.world_size = size;
  dt__ctx.initialized = 1;
  dt__ctx.finalized = 0;
  dt__ctx.simulated = 1;
  dt__ctx.imbalance = 1.0;
  dt__sim_clock_reset();
  return DT_SUCCESS;
}

int dt__ctx_simulated(void) { return dt__ctx.simulated; }

void dt__ctx_finalize(void) {
  dt__free(dt__ctx.counts);
  dt__ctx.counts = NULL;
  dt__ctx.ints_cap = 0;
  dt__mesh_close_all_comms(); /* live meshes keep their shape; their communicators close now */
  dt__ctx.initialized = 0;
  dt__ctx.finalized = 1;
  dt__ctx.simulated = 0;
  dt__sim_clock_reset();
  dt__ctx.world_rank = -1;
  dt__ctx.world_size = 0;
  memset(&dt__ctx.counters, 0, sizeof dt__ctx.counters);
}

int dt__ctx_initialized(void) { return dt__ctx.initialized; }
int dt__ctx_finalized(void) { return dt__ctx.finalized; }
int dt__world_rank(void) { return dt__ctx.world_rank; }
int dt__world_size(void) { return dt__ctx.world_size; }

/* `what` (the public function) is not repeated: its DT_ENTRY_RETURN starts the message. */
dt_status_t dt__require_init(const char* what) {
  (void)what;
  if (!dt__ctx.initialized)
    return DT_FAIL(DT_ERR_NOT_INITIALIZED,
                   "the library is not initialized: call dt_init(&argc, &argv) first");
  return DT_SUCCESS;
}

static dt_status_t dt__world_rank_impl(int* rank) {
  DT_ARG_NOT_NULL(rank);
  *rank = -1;
  DT_CHECK(dt__require_init("dt_world_rank"));
  *rank = dt__ctx.world_rank;
  return DT_SUCCESS;
}

dt_status_t dt_world_rank(int* rank) {
  DT_ENTRY_RETURN(dt__world_rank_impl(rank));
}

static dt_status_t dt__world_size_impl(int* size) {
  DT_ARG_NOT_NULL(size);
  *size = 0;
  DT_CHECK(dt__require_init("dt_world_size"));
  *size = dt__ctx.world_size;
  return DT_SUCCESS;
}

dt_status_t dt_world_size(int* size) {
  DT_ENTRY_RETURN(dt__world_size_impl(size));
}

static dt_status_t dt__sim_check(void) {
  if (!dt__ctx.simulated)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "no simulated world: the step time is estimated only "
                   "after dt_init_simulated");
  return DT_SUCCESS;
}

static dt_status_t dt__sim_time_get_impl(dt_sim_time_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  DT_CHECK(dt__sim_check());
  const dt__sim_clock_t* c = dt__sim_clock();
  out->elapsed_us = c->now - c->origin;
  out->compute_us = c->compute_us;
  out->comm_us = c->comm_us;
  out->exposed_comm_us = c->exposed_us;
  out->flops = c->flops;
  out->nbytes = c->nbytes;
  out->ops = c->ops;
  return DT_SUCCESS;
}

dt_status_t dt_sim_time_get(dt_sim_time_t* out) {
  DT_ENTRY_RETURN(dt__sim_time_get_impl(out));
}

static dt_status_t dt__sim_time_reset_impl(void) {
  DT_CHECK(dt__sim_check());
  dt__sim_clock_mark();
  return DT_SUCCESS;
}

dt_status_t dt_sim_time_reset(void) {
  DT_ENTRY_RETURN(dt__sim_time_reset_impl());
}

static dt_status_t dt__sim_set_routing_imbalance_impl(double factor) {
  if (!(factor >= 1.0 && factor <= 1e3))
    return DT_FAIL(DT_ERR_INVALID_ARG, "factor=%g out of range [1, 1000] (1: balanced routing)",
                   factor);
  DT_CHECK(dt__sim_check());
  dt__ctx.imbalance = factor;
  return DT_SUCCESS;
}

dt_status_t dt_sim_set_routing_imbalance(double factor) {
  DT_ENTRY_RETURN(dt__sim_set_routing_imbalance_impl(factor));
}

double dt_sim_routing_imbalance(void) { return dt__ctx.simulated ? dt__ctx.imbalance : 1.0; }

/* ---------------------------------------------------------------------------------------------
 * collective count arrays (grow-only) */

dt_status_t dt__ws_counts(size_t count, int64_t** out) {
  if (count > dt__ctx.ints_cap) {
    size_t cap = count < 64 ? 64 : count;
    int64_t* p = (int64_t*)dt__realloc(dt__ctx.counts, cap * sizeof(int64_t));
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "workspace of %zu counts", cap);
    dt__ctx.counts = p;
    dt__ctx.ints_cap = cap;
  }
  *out = dt__ctx.counts;
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * counters */

void dt__count_collective(dt_mesh_t m, unsigned mask, dt_collective_t c, uint64_t nbytes) {
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

void dt__count_redistribute(dt_mesh_t m) {
  m->counters.redistributes++;
  dt__ctx.counters.redistributes++;
}

void dt__count_plan_lookup(dt_mesh_t m, int hit) {
  if (hit) {
    m->counters.plan_cache_hits++;
    dt__ctx.counters.plan_cache_hits++;
  } else {
    m->counters.plan_cache_misses++;
    dt__ctx.counters.plan_cache_misses++;
  }
}

static dt_status_t dt__counters_get_impl(dt_mesh_t mesh, dt_counters_t* out) {
  DT_ARG_NOT_NULL(out);
  if (mesh != NULL) DT_CHECK(dt__mesh_check(mesh));
  *out = mesh ? mesh->counters : dt__ctx.counters;
  return DT_SUCCESS;
}

dt_status_t dt_counters_get(dt_mesh_t mesh, dt_counters_t* out) {
  DT_ENTRY_RETURN(dt__counters_get_impl(mesh, out));
}

static dt_status_t dt__counters_reset_impl(dt_mesh_t mesh) {
  if (mesh != NULL) {
    DT_CHECK(dt__mesh_check(mesh));
    memset(&mesh->counters, 0, sizeof mesh->counters);
    return DT_SUCCESS;
  }
  memset(&dt__ctx.counters, 0, sizeof dt__ctx.counters);
  dt__mesh_reset_all_counters();
  return DT_SUCCESS;
}

dt_status_t dt_counters_reset(dt_mesh_t mesh) {
  DT_ENTRY_RETURN(dt__counters_reset_impl(mesh));
}

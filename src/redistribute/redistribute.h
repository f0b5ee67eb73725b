/* redistribute.h - internal interface of the redistribute layer: plans, the plan cache, the cost
 * model and the executor. */
#ifndef DT_REDISTRIBUTE_REDISTRIBUTE_H
#define DT_REDISTRIBUTE_REDISTRIBUTE_H

#include "mesh/mesh.h"

/* One step of a plan: one collective (or local move) on the mesh dims in `mask`. */
typedef struct dt_step {
  dt_collective_t coll;
  unsigned mask; /* mesh dims touched */
  dt_placement_t before[DT_MAX_MESH_DIMS];
  dt_placement_t after[DT_MAX_MESH_DIMS]; /* full placement lists */
  dt_coll_algo_t algo; /* reductions: native collective or all-to-all + local reduce */
  uint64_t nbytes;
  double cost_us;
} dt_step_t;

#define DT_MAX_STEPS 16

struct dt_plan {
  int refcount;  /* the cache, works, and one per caller reference */
  int user_refs; /* caller references (dt_plan_create): a live dt_plan_t while > 0 */
  dt_layout_t src; /* source layout (dst is src.shape with the last step's `after`) */
  dt_placement_t dst[DT_MAX_MESH_DIMS];
  dt_dtype_t dtype;
  int nsteps;
  dt_step_t steps[DT_MAX_STEPS];
  double cost_us;
};

/* ---- plans and the plan cache (src/redistribute/plan.c) ------------------------------------ */
/* Finds the optimal plan, cached by (mesh id, mesh generation, cost-model generation, dtype,
 * shape, src, dst). Borrowed pointer, valid until the next dt__plan_get or cost-model change;
 * retain with plan->refcount++ to keep it longer and release with dt__plan_release. */
dt_status_t dt__plan_get(dt_mesh_t mesh, dt_dtype_t dtype, const dt_layout_t* src,
                         const dt_placement_t* dst, struct dt_plan** out);
void dt__plan_release(struct dt_plan* p);
/* "S(0)R -> RR" for any plan (dt_plan_format without the handle check). */
dt_status_t dt__plan_format(const struct dt_plan* p, char* buf, size_t cap);
/* Makes a cached plan a caller-visible dt_plan_t for a while (a trace event) with one more
 * caller reference; dt__plan_unlend(p, mark) gives it back unless a dt_plan_destroy did. */
dt_status_t dt__plan_lend(struct dt_plan* p, int* mark);
void dt__plan_unlend(struct dt_plan* p, int mark);
/* Frees every cached plan (dt_finalize; plans retained elsewhere stay valid). */
void dt__plan_cache_release(void);
/* 1 if dst is reachable from src (no new Partial from a Shard, no Partial op change); no message:
 * for callers that test many candidates. */
int dt__plan_reachable(const dt_layout_t* src, const dt_placement_t* dst);

/* ---- cost model (src/redistribute/cost.c) -------------------------------------------------- */
/* Cost-model generation: bumps on every change so caches notice. */
uint64_t dt__cost_generation(void);
/* Cost of collective c on n ranks moving nbytes with its cheapest algorithm (*algo when not NULL;
 * DT_ALGO_NATIVE unless a forced or cheaper alternative exists). */
double dt__cost_of(dt_collective_t c, int n, uint64_t nbytes, dt_coll_algo_t* algo);
/* The line cost = a + b * nbytes of collective c with algorithm `algo` on n ranks. */
void dt__cost_linear(dt_collective_t c, dt_coll_algo_t algo, int n, double* a, double* b);
/* The same for a step on the mesh dims `mask` of `mesh` (NULL: the global model): the dims' own
 * parameters where dt_mesh_set_cost_model set them (a group of dims takes its slowest member's:
 * the lowest bandwidth), plus, on a device backend whose communication is staged through host
 * memory, two copies between the device and the host. */
void dt__cost_linear_on(dt_mesh_t mesh, unsigned mask, dt_collective_t c, dt_coll_algo_t algo,
                        int n, double* a, double* b);
double dt__cost_of_on(dt_mesh_t mesh, unsigned mask, dt_collective_t c, int n, uint64_t nbytes,
                      dt_coll_algo_t* algo);
/* 1 when collective c has an alternative algorithm enabled (reduce-scatter, all-reduce). */
int dt__cost_has_alt(dt_collective_t c);
/* The compute model (dt_compute_model_get/set; the "compute" key of the cost model file). */
const dt_compute_params_t* dt__compute_model(void);
/* The fraction of a collective on `mesh` that its kernels hide: the compute model's
 * comm_overlap where they run on the host (a real host backend, or a simulation of the host's
 * kernels), 1 on a device (NCCL's own stream). */
double dt__comm_overlap_on(dt_mesh_t mesh);
/* In a simulated run (dt_init_simulated): collective c of nbytes over the mesh dims `mask` (a
 * group of n, algorithm algo; DT_ALGO_COUNT: the cheapest) posted on the simulated communication
 * stream at its cost-model price, a blocking one (async 0) waited for at once. Returns when it
 * ends on the simulated clock; 0 and nothing done outside a simulation. */
double dt__sim_collective(dt_mesh_t m, unsigned mask, dt_collective_t c, dt_coll_algo_t algo,
                          int n, uint64_t nbytes, int async);
/* Loads $DTENSOR_COST_MODEL or $HOME/.cache/dtensor/cost_model.json when present (dt_init),
 * saying which on rank 0 (any_rank: on this rank whatever it is: a simulated rank is alone). */
dt_status_t dt__cost_model_autoload(int any_rank);

/* ---- executor (src/redistribute/execute.c) ------------------------------------------------- */
/* Scratch of one execution: the backend's persistent workspace (owned = 0, blocking) or buffers
 * owned by one asynchronous work (released by dt__scratch_free). */
typedef struct dt__scratch {
  dt_backend_t b;
  int owned;
  void* buf[DT_WS_SLOTS];
  size_t cap[DT_WS_SLOTS];
  int64_t* cnt; /* count and displacement arrays */
  size_t cnt_cap;
} dt__scratch_t;

/* One step in progress: its geometry, buffers, and the phase of its state machine. */
typedef struct dt__run {
  dt_mesh_t m;
  dt_backend_t b;
  const dt_step_t* s;
  dt__scratch_t* sc;
  int async; /* post non-blocking collectives */
  dt_dtype_t dtype;
  size_t item;
  dt_layout_t lb, la; /* layouts before and after the step */
  int64_t ib_off[DT_MAX_DIMS], ib_len[DT_MAX_DIMS]; /* my box before */
  int64_t ob_off[DT_MAX_DIMS], ob_len[DT_MAX_DIMS]; /* my box after */
  const void* in;
  void* out;
  int gn;       /* group size */
  dt_comm_t* c; /* the group's communicator (NULL for local steps) */
  int me;       /* my rank in it */
  int k, nsteps; /* this step's index in its plan, and the plan's step count */
  int phase;    /* next phase; -1 when the step is complete */
  int pending;  /* a posted collective (*req) has not completed */
  dt_comm_req_t* req; /* async: the work's request (reused across steps); blocking: NULL */
  void* tmp;                      /* received blocks awaiting unpacking or reduction */
  const void* send;               /* reduce-scatter: the (packed) send buffer */
  int64_t start_me, my;           /* reductions: offset and size of my block */
  uint64_t nbytes;                /* counted bytes (nccl-tests convention) */
  double sim_done;                /* simulated: when the step's collective ends */
} dt__run_t;

/* Sets up step k of plan p from `in` to `out` (comm: the group's communicator, NULL for local
 * steps; req: post non-blocking collectives into it, NULL: blocking). */
dt_status_t dt__run_init(dt__run_t* r, dt_mesh_t m, dt_backend_t b, const struct dt_plan* p,
                         int k, const void* in, void* out, dt__scratch_t* sc, dt_comm_t* comm,
                         dt_comm_req_t* req);
/* Runs phases until the step completes or waits on a posted collective (r->pending). */
dt_status_t dt__advance(dt__run_t* r);
/* Tells the comm layer which step the thread is about to post or wait for (mesh dims, step k of
 * n, the transition), for the timeout message; dt__comm_what_clear when done. */
void dt__run_what(const dt__run_t* r);
void dt__scratch_free(dt__scratch_t* s);
/* 1 when a step of p communicates (not only local slices and scaling). */
int dt__plan_communicates(const struct dt_plan* p);
/* Bytes of this rank's local box before (after = 0) or after p on mesh m. */
size_t dt__plan_local_nbytes(const struct dt_plan* p, const dt_mesh_t m, int after);
/* Executes a plan: src buffer (source layout's local box) -> dst buffer (target's local box), both
 * in backend b's memory (packing, copies and scaling go through b). On a device backend a plan
 * that communicates runs on host copies (the MPI comm is not CUDA-aware): the source is copied
 * to host staging, the plan runs on the cpu backend, the result is copied back. */
dt_status_t dt__plan_execute(dt_mesh_t mesh, dt_backend_t b, const struct dt_plan* p,
                             const void* src, void* dst);

/* ---- asynchronous work (src/redistribute/work.c) ------------------------------------------- */
/* Starts plan p from src to dst (holding both storages until completion). mesh == NULL or an
 * abstract / non-member mesh gives a work that is already complete. Collective. */
dt_status_t dt__work_start(dt_mesh_t m, dt_backend_t b, struct dt_plan* p, const void* src,
                           dt_storage_t* src_hold, void* dst, dt_storage_t* dst_hold,
                           dt_work_t* out);
/* Advances every work in flight as far as it goes without blocking (op dispatch, dt_work_test). */
void dt__progress_all(void);
/* Completes every work in flight and frees the spare works kept for reuse (dt_finalize, before
 * communicators and backends go). */
void dt__work_finalize_all(void);

#endif

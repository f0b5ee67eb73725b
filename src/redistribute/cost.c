/* cost.c - the communication cost model used by the planner, and its calibration file.
 *
 * A collective on n ranks moving B bytes (nccl-tests convention: all-gather output, reduce-scatter
 * input, all-reduce buffer, all-to-all send buffer) is estimated as
 *     base_us + hops(n) * hop_us + factor(n) * B / (bw_gbps * 1e3)     [microseconds]
 * with ring factors: all-gather, reduce-scatter, all-to-all hops = n-1, factor = (n-1)/n;
 * all-reduce hops = 2(n-1), factor = 2(n-1)/n; a send_recv ring step (B the bytes each rank sends
 * to its neighbour) one hop, factor 1. Local steps (slice, partition) cost B over the
 * memory bandwidth. A step on a mesh dim of size 1 moves nothing and costs 0.
 *
 * Defaults are PyTorch's CPU constants (every dim counts as inter-host: base 6.6 us, 2.7 us per
 * hop, 87.7 * 0.22 = 19.294 GB/s) so that plan orderings agree with PyTorch's; memory bandwidth
 * 7 GB/s (single-thread memcpy measured on the development machine, docs/environment.md).
 * `dtensor-calibrate` measures the machine and writes a JSON file that dt_init loads.
 *
 * Reductions have a second algorithm (all-to-all + local reduce, see execute.c) with its own
 * parameters and the same hop and factor rules; a step costs its cheaper algorithm. Its defaults
 * come from bench_redistribute on the development machine (Open MPI, np 2 and 4,
 * docs/performance.md): it moves bytes at twice the native reductions' rate. All-reduce's has a
 * lower base but dearer hops (two collectives), fit so that the native all-reduce wins below
 * ~12 KB on 2 ranks and ~130 KB on 4, as measured. Reduce-scatter's all-to-all form measured
 * faster from ~16 KB, but its base is kept at 8 us (native below ~100 KB on 2 ranks, ~70 KB on
 * 4): a cheaper one changes which plans small models take and so their rounding (the
 * loss-parity curves stay bitwise as they were). dtensor-calibrate fits both for a machine.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

#include "redistribute/redistribute.h"

static const dt_cost_params_t dt__cost_defaults[DT_COLL_COUNT] = {
    [DT_COLL_LOCAL] = {0.0, 0.0, 7.0},
    [DT_COLL_ALL_GATHER] = {6.6, 2.7, 19.294},
    [DT_COLL_ALL_REDUCE] = {6.6, 2.7, 19.294},
    [DT_COLL_REDUCE_SCATTER] = {6.6, 2.7, 19.294},
    [DT_COLL_ALL_TO_ALL] = {6.6, 2.7, 19.294},
    [DT_COLL_BROADCAST] = {6.6, 2.7, 19.294},
    [DT_COLL_SCATTER] = {6.6, 2.7, 19.294},
    [DT_COLL_SEND_RECV] = {6.6, 2.7, 19.294},
};
_Static_assert(DT_COLL_COUNT == 8, "update the cost defaults and collective names");

/* The all-to-all algorithm of the reductions (the others have none). */
static const dt_cost_params_t dt__cost_a2a_defaults[DT_COLL_COUNT] = {
    [DT_COLL_ALL_REDUCE] = {4.5, 3.9, 38.588},
    [DT_COLL_REDUCE_SCATTER] = {8.0, 2.7, 38.588},
};

static dt_cost_params_t dt__cost[DT_COLL_COUNT][DT_ALGO_COUNT];
/* The NCCL plane's parameters (the model file's "nccl" object, which dtensor-calibrate --nccl
 * writes): bit c * DT_ALGO_COUNT + a of dt__cost_nccl_set says (c, a) has them. Steps on a mesh
 * whose device data goes over NCCL use them where the mesh dim has no parameters of its own. */
static dt_cost_params_t dt__cost_nccl[DT_COLL_COUNT][DT_ALGO_COUNT];
static uint32_t dt__cost_nccl_set;
_Static_assert(DT_COLL_COUNT * DT_ALGO_COUNT <= 32, "dt__cost_nccl_set has 32 bits");
static int dt__cost_ready = 0;
static uint64_t dt__cost_gen = 1;
static dt_coll_algo_t dt__cost_forced = DT_ALGO_COUNT; /* none */

/* The compute model (dtensor/redistribute.h): one core of the development machine. */
static const dt_compute_params_t dt__compute_defaults = {157.0, 157.0, 7.0, 5.0, 0.0, 1.0};
static dt_compute_params_t dt__compute;

static void dt__cost_defaults_set(void) {
  for (int c = 0; c < DT_COLL_COUNT; c++) {
    dt__cost[c][DT_ALGO_NATIVE] = dt__cost_defaults[c];
    dt__cost[c][DT_ALGO_A2A] = dt__cost_a2a_defaults[c];
  }
  dt__compute = dt__compute_defaults;
  dt__cost_ready = 1;
}

static void dt__cost_init(void) {
  if (!dt__cost_ready) dt__cost_defaults_set();
}

int dt__cost_has_alt(dt_collective_t c) {
  return c == DT_COLL_ALL_REDUCE || c == DT_COLL_REDUCE_SCATTER;
}

const char* dt_coll_algo_name(dt_coll_algo_t a) {
  return a == DT_ALGO_NATIVE ? "native" : a == DT_ALGO_A2A ? "a2a" : "invalid";
}

/* JSON key of (c, a): the collective's name, "_a2a" appended for the all-to-all algorithm. */
static void dt__cost_key(dt_collective_t c, dt_coll_algo_t a, char* buf, size_t cap) {
  snprintf(buf, cap, "%s%s", dt_collective_name(c), a == DT_ALGO_A2A ? "_a2a" : "");
}

uint64_t dt__cost_generation(void) { return dt__cost_gen; }

const char* dt_collective_name(dt_collective_t c) {
  static const char* const names[DT_COLL_COUNT] = {
      "local", "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast",
      "scatter", "send_recv"};
  return (c >= 0 && c < DT_COLL_COUNT) ? names[c] : "invalid";
}

/* The line of collective c with algorithm `algo` on n ranks under parameters p (NULL: the global
 * model's). */
static void dt__cost_line(const dt_cost_params_t* p, dt_collective_t c, dt_coll_algo_t algo, int n,
                          double* a, double* b) {
  dt__cost_init();
  /* an algorithm the collective lacks, or one other than the forced one, is never cheaper */
  int usable = algo == DT_ALGO_NATIVE || dt__cost_has_alt(c);
  if (usable && dt__cost_has_alt(c) && dt__cost_forced != DT_ALGO_COUNT)
    usable = algo == dt__cost_forced;
  if (!usable) {
    *a = INFINITY;
    *b = 0.0;
    return;
  }
  if (p == NULL) p = &dt__cost[c][algo];
  if (c == DT_COLL_LOCAL) {
    *a = 0.0;
    *b = 1.0 / (p->bw_gbps * 1e3);
    return;
  }
  if (n <= 1) {
    *a = *b = 0.0;
    return;
  }
  double hops = (c == DT_COLL_ALL_REDUCE) ? 2.0 * (n - 1) : (double)(n - 1);
  double factor = (c == DT_COLL_ALL_REDUCE) ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
  if (c == DT_COLL_BROADCAST) factor = 1.0;
  if (c == DT_COLL_SEND_RECV) hops = factor = 1.0;
  *a = p->base_us + hops * p->hop_us;
  *b = factor / (p->bw_gbps * 1e3);
}

void dt__cost_linear(dt_collective_t c, dt_coll_algo_t algo, int n, double* a, double* b) {
  dt__cost_line(NULL, c, algo, n, a, b);
}

void dt__cost_linear_on(dt_mesh_t mesh, unsigned mask, dt_collective_t c, dt_coll_algo_t algo,
                        int n, double* a, double* b) {
  const dt_cost_params_t* p = NULL; /* the slowest dim of the group that has its own */
  for (int d = 0; mesh != NULL && d < mesh->ndim && c != DT_COLL_LOCAL; d++) {
    if (!(mask & (1u << d)) || !(mesh->dim_cost_set[d] & (1u << (c * DT_ALGO_COUNT + algo))))
      continue;
    const dt_cost_params_t* q = &mesh->dim_cost[d][c][algo];
    if (p == NULL || q->bw_gbps < p->bw_gbps || (q->bw_gbps == p->bw_gbps && q->base_us > p->base_us))
      p = q;
  }
  if (p == NULL && mesh != NULL && mesh->dev_state > 0 && c != DT_COLL_LOCAL &&
      (dt__cost_nccl_set & (1u << (c * DT_ALGO_COUNT + algo))))
    p = &dt__cost_nccl[c][algo];
  dt__cost_line(p, c, algo, n, a, b);
  /* host staging of a device backend: the shard out of the device and the result back in (about
   * the step's bytes once each way, the all-reduce's buffer and result alike); none once the
   * mesh's NCCL plane carries the data */
  if (mesh != NULL && c != DT_COLL_LOCAL && n > 1 && isfinite(*a) &&
      mesh->backend->stage_gbps > 0 && mesh->dev_state <= 0) {
    *a += 2.0 * mesh->backend->stage_us;
    *b += 2.0 / (mesh->backend->stage_gbps * 1e3);
  }
}

double dt__cost_of(dt_collective_t c, int n, uint64_t nbytes, dt_coll_algo_t* algo) {
  return dt__cost_of_on(NULL, 0, c, n, nbytes, algo);
}

double dt__cost_of_on(dt_mesh_t mesh, unsigned mask, dt_collective_t c, int n, uint64_t nbytes,
                      dt_coll_algo_t* algo) {
  double best = INFINITY;
  dt_coll_algo_t pick = DT_ALGO_NATIVE;
  for (int k = 0; k < DT_ALGO_COUNT; k++) {
    double a, b;
    dt__cost_linear_on(mesh, mask, c, (dt_coll_algo_t)k, n, &a, &b);
    double v = a + b * (double)nbytes;
    if (v < best) {
      best = v;
      pick = (dt_coll_algo_t)k;
    }
  }
  if (algo) *algo = pick;
  return best;
}

double dt__comm_overlap_on(dt_mesh_t mesh) {
  const int host = dt__ctx_simulated() ? dt__backend_meta.kernel_set == DT_KERNELS_HOST
                                       : mesh->backend->device == DT_DEVICE_HOST;
  return host ? dt__compute_model()->comm_overlap : 1.0; /* a GPU's: NCCL's own stream */
}

double dt__sim_collective(dt_mesh_t m, unsigned mask, dt_collective_t c, dt_coll_algo_t algo,
                          int n, uint64_t nbytes, int async) {
  if (!dt__ctx_simulated()) return 0.0;
  double us;
  if (algo == DT_ALGO_COUNT) {
    us = dt__cost_of_on(m, mask, c, n, nbytes, NULL);
  } else {
    double a, b;
    dt__cost_linear_on(m, mask, c, algo, n, &a, &b);
    us = a + b * (double)nbytes;
  }
  if (!isfinite(us)) us = dt__cost_of_on(m, mask, c, n, nbytes, NULL); /* not the forced one */
  if (!isfinite(us)) us = 0.0;
  double done = dt__sim_comm_post(us, dt__comm_overlap_on(m));
  if (!async) dt__sim_wait_until(done);
  return done;
}

static dt_status_t dt__coll_check(dt_collective_t c) {
  if (c < 0 || c >= DT_COLL_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "collective %d out of range [0, %d)", (int)c,
                   DT_COLL_COUNT);
  return DT_SUCCESS;
}

/* The valid ranges (documented in dtensor/redistribute.h): a latency of at most one second and a
 * bandwidth within [1 KB/s, 1 PB/s]. Within them a step on any tensor the library can describe
 * (< 2^63 bytes) costs less than 1e23 us, so plan costs stay finite and comparable. */
#define DT__LAT_MAX_US 1e6
#define DT__BW_MIN_GBPS 1e-6
#define DT__BW_MAX_GBPS 1e6

static dt_status_t dt__params_check(const dt_cost_params_t* p, const char* what) {
  /* Written so that NaN fails too. */
  if (!(p->base_us >= 0.0 && p->base_us <= DT__LAT_MAX_US))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: base_us = %g out of range [0, %g] (microseconds)",
                   what, p->base_us, DT__LAT_MAX_US);
  if (!(p->hop_us >= 0.0 && p->hop_us <= DT__LAT_MAX_US))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: hop_us = %g out of range [0, %g] (microseconds)",
                   what, p->hop_us, DT__LAT_MAX_US);
  if (!(p->bw_gbps >= DT__BW_MIN_GBPS && p->bw_gbps <= DT__BW_MAX_GBPS))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: bw_gbps = %g out of range [%g, %g] (GB/s)", what,
                   p->bw_gbps, DT__BW_MIN_GBPS, DT__BW_MAX_GBPS);
  return DT_SUCCESS;
}

#define DT__RATE_MIN 1e-6
#define DT__RATE_MAX 1e9
static dt_status_t dt__compute_check(const dt_compute_params_t* p, const char* what) {
  const double r[3] = {p->gemm_gflops, p->gemm_bf16_gflops, p->mem_gbps};
  static const char* names[3] = {"gemm_gflops", "gemm_bf16_gflops", "mem_gbps"};
  for (int i = 0; i < 3; i++) /* written so that NaN fails too */
    if (!(r[i] >= DT__RATE_MIN && r[i] <= DT__RATE_MAX))
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s = %g out of range [%g, %g]", what, names[i],
                     r[i], DT__RATE_MIN, DT__RATE_MAX);
  if (!(p->op_us >= 0.0 && p->op_us <= DT__LAT_MAX_US))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: op_us = %g out of range [0, %g] (microseconds)", what,
                   p->op_us, DT__LAT_MAX_US);
  const double a = p->attn_gflops; /* 0: the GEMM rate */
  if (!(a == 0.0 || (a >= DT__RATE_MIN && a <= DT__RATE_MAX)))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: attn_gflops = %g out of range (0, or [%g, %g])", what,
                   p->attn_gflops, DT__RATE_MIN, DT__RATE_MAX);
  if (!(p->comm_overlap >= 0.0 && p->comm_overlap <= 1.0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: comm_overlap = %g out of range [0, 1]", what,
                   p->comm_overlap);
  return DT_SUCCESS;
}

const dt_compute_params_t* dt__compute_model(void) {
  dt__cost_init();
  return &dt__compute;
}

static dt_status_t dt__compute_model_get_impl(dt_compute_params_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = *dt__compute_model();
  return DT_SUCCESS;
}

dt_status_t dt_compute_model_get(dt_compute_params_t* out) {
  DT_ENTRY_RETURN(dt__compute_model_get_impl(out));
}

static dt_status_t dt__compute_model_set_impl(const dt_compute_params_t* params) {
  DT_ARG_NOT_NULL(params);
  DT_CHECK(dt__compute_check(params, "params"));
  dt__cost_init();
  dt__compute = *params;
  return DT_SUCCESS;
}

dt_status_t dt_compute_model_set(const dt_compute_params_t* params) {
  DT_ENTRY_RETURN(dt__compute_model_set_impl(params));
}

static dt_status_t dt__algo_check(dt_collective_t c, dt_coll_algo_t a) {
  DT_CHECK(dt__coll_check(c));
  if (a < 0 || a >= DT_ALGO_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "algorithm %d out of range [0, %d)", (int)a,
                   DT_ALGO_COUNT);
  if (a != DT_ALGO_NATIVE && !dt__cost_has_alt(c))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s has no %s algorithm (only reduce_scatter and "
                   "all_reduce have one besides native)", dt_collective_name(c),
                   dt_coll_algo_name(a));
  return DT_SUCCESS;
}

static dt_status_t dt__cost_model_get_algo_impl(dt_collective_t c, dt_coll_algo_t a,
                                                dt_cost_params_t* out) {
  DT_ARG_NOT_NULL(out);
  DT_CHECK(dt__algo_check(c, a));
  dt__cost_init();
  *out = dt__cost[c][a];
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_get_algo(dt_collective_t c, dt_coll_algo_t a, dt_cost_params_t* out) {
  DT_ENTRY_RETURN(dt__cost_model_get_algo_impl(c, a, out));
}

static dt_status_t dt__cost_model_set_algo_impl(dt_collective_t c, dt_coll_algo_t a,
                                                const dt_cost_params_t* params) {
  DT_ARG_NOT_NULL(params);
  DT_CHECK(dt__algo_check(c, a));
  char key[64];
  dt__cost_key(c, a, key, sizeof key);
  DT_CHECK(dt__params_check(params, key));
  dt__cost_init();
  dt__cost[c][a] = *params;
  dt__cost_gen++;
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_set_algo(dt_collective_t c, dt_coll_algo_t a,
                                   const dt_cost_params_t* params) {
  DT_ENTRY_RETURN(dt__cost_model_set_algo_impl(c, a, params));
}

static dt_status_t dt__mesh_dim_arg(dt_mesh_t mesh, int dim, dt_collective_t c, dt_coll_algo_t a) {
  DT_CHECK(dt__mesh_check(mesh));
  DT_CHECK(dt__algo_check(c, a));
  if (c == DT_COLL_LOCAL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "collective local: local steps move no data between "
                   "ranks (set their memory bandwidth with dt_cost_model_set)");
  if (dim < 0 || dim >= mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dim=%d out of range [0, %d) (the mesh's dims)", dim,
                   mesh->ndim);
  return DT_SUCCESS;
}

static dt_status_t dt__mesh_set_cost_model_impl(dt_mesh_t mesh, int dim, dt_collective_t c,
                                                dt_coll_algo_t a, const dt_cost_params_t* params) {
  DT_CHECK(dt__mesh_dim_arg(mesh, dim, c, a));
  const uint32_t bit = 1u << (c * DT_ALGO_COUNT + a);
  if (params == NULL) {
    mesh->dim_cost_set[dim] &= ~bit;
  } else {
    char key[64];
    dt__cost_key(c, a, key, sizeof key);
    DT_CHECK(dt__params_check(params, key));
    mesh->dim_cost[dim][c][a] = *params;
    mesh->dim_cost_set[dim] |= bit;
  }
  mesh->generation++; /* the mesh's cached plans were priced otherwise */
  return DT_SUCCESS;
}

dt_status_t dt_mesh_set_cost_model(dt_mesh_t mesh, int dim, dt_collective_t c, dt_coll_algo_t a,
                                   const dt_cost_params_t* params) {
  DT_ENTRY_RETURN(dt__mesh_set_cost_model_impl(mesh, dim, c, a, params));
}

static dt_status_t dt__mesh_get_cost_model_impl(dt_mesh_t mesh, int dim, dt_collective_t c,
                                                dt_coll_algo_t a, dt_cost_params_t* out) {
  DT_ARG_NOT_NULL(out);
  DT_CHECK(dt__mesh_dim_arg(mesh, dim, c, a));
  dt__cost_init();
  const uint32_t bit = 1u << (c * DT_ALGO_COUNT + a);
  *out = (mesh->dim_cost_set[dim] & bit)                           ? mesh->dim_cost[dim][c][a]
         : mesh->dev_state > 0 && (dt__cost_nccl_set & bit) != 0 ? dt__cost_nccl[c][a]
                                                                   : dt__cost[c][a];
  return DT_SUCCESS;
}

dt_status_t dt_mesh_get_cost_model(dt_mesh_t mesh, int dim, dt_collective_t c, dt_coll_algo_t a,
                                   dt_cost_params_t* out) {
  DT_ENTRY_RETURN(dt__mesh_get_cost_model_impl(mesh, dim, c, a, out));
}

static dt_status_t dt__mesh_cost_estimate_impl(dt_mesh_t mesh, unsigned mask, dt_collective_t c,
                                               uint64_t nbytes, double* cost_us) {
  DT_ARG_NOT_NULL(cost_us);
  *cost_us = 0.0;
  DT_CHECK(dt__mesh_check(mesh));
  DT_CHECK(dt__coll_check(c));
  if (mask == 0 || mask >= (1u << mesh->ndim))
    return DT_FAIL(DT_ERR_INVALID_ARG, "mask=0x%x names no dims of a %d-dim mesh (valid: 0x1 to "
                   "0x%x)", mask, mesh->ndim, (1u << mesh->ndim) - 1u);
  int n = 1;
  for (int d = 0; d < mesh->ndim; d++)
    if (mask & (1u << d)) n *= mesh->shape[d];
  *cost_us = dt__cost_of_on(mesh, mask, c, n, nbytes, NULL);
  return DT_SUCCESS;
}

dt_status_t dt_mesh_cost_estimate(dt_mesh_t mesh, unsigned mask, dt_collective_t c,
                                  uint64_t nbytes, double* cost_us) {
  DT_ENTRY_RETURN(dt__mesh_cost_estimate_impl(mesh, mask, c, nbytes, cost_us));
}

dt_status_t dt_cost_model_get(dt_collective_t c, dt_cost_params_t* out) {
  DT_ENTRY_RETURN(dt_cost_model_get_algo(c, DT_ALGO_NATIVE, out));
}

dt_status_t dt_cost_model_set(dt_collective_t c, const dt_cost_params_t* params) {
  DT_ENTRY_RETURN(dt_cost_model_set_algo(c, DT_ALGO_NATIVE, params));
}

static dt_status_t dt__cost_model_force_algo_impl(dt_coll_algo_t a) {
  if (a < 0 || a > DT_ALGO_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "algorithm %d out of range [0, %d] (%d: choose by cost)",
                   (int)a, DT_ALGO_COUNT, DT_ALGO_COUNT);
  dt__cost_forced = a;
  dt__cost_gen++;
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_force_algo(dt_coll_algo_t a) {
  DT_ENTRY_RETURN(dt__cost_model_force_algo_impl(a));
}

dt_status_t dt_cost_model_reset(void) {
  dt__cost_defaults_set();
  dt__cost_nccl_set = 0;
  dt__cost_forced = DT_ALGO_COUNT;
  dt__cost_gen++;
  return DT_SUCCESS;
}

static dt_status_t dt__cost_estimate_impl(dt_collective_t c, int n, uint64_t nbytes,
                                          double* cost_us) {
  DT_ARG_NOT_NULL(cost_us);
  *cost_us = 0.0;
  DT_CHECK(dt__coll_check(c));
  if (n < 1) return DT_FAIL(DT_ERR_INVALID_ARG, "n = %d must be at least 1", n);
  *cost_us = dt__cost_of(c, n, nbytes, NULL);
  return DT_SUCCESS;
}

dt_status_t dt_cost_estimate(dt_collective_t c, int n, uint64_t nbytes, double* cost_us) {
  DT_ENTRY_RETURN(dt__cost_estimate_impl(c, n, nbytes, cost_us));
}

/* Whether k names a collective entry ("all_gather", "all_reduce_a2a", ...). */
static int dt__cost_is_entry_key(const char* k) {
  for (int x = 0; x < DT_COLL_COUNT * DT_ALGO_COUNT; x++) {
    dt_collective_t c = (dt_collective_t)(x / DT_ALGO_COUNT);
    dt_coll_algo_t a = (dt_coll_algo_t)(x % DT_ALGO_COUNT);
    char key[64];
    dt__cost_key(c, a, key, sizeof key);
    if ((a == DT_ALGO_NATIVE || dt__cost_has_alt(c)) && strcmp(k, key) == 0) return 1;
  }
  return 0;
}

/* Every key of object o once, and a known one: listed in `known` (n of them) or, with `entries`,
 * a collective entry's key. A misspelt key would otherwise leave its value as it was, silently;
 * a repeated one is read once, the other ignored. */
static dt_status_t dt__cost_keys_check(const cJSON* o, const char* const* known, int n,
                                       int entries, const char* what, const char* where) {
  for (const cJSON* e = o->child; e != NULL; e = e->next) {
    const char* k = e->string ? e->string : "";
    int ok = entries && dt__cost_is_entry_key(k);
    for (int i = 0; i < n && !ok; i++) ok = strcmp(k, known[i]) == 0;
    if (!ok)
      return DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: unknown key \"%s\"%s%s", what, k,
                     where[0] ? " in " : "", where);
    for (const cJSON* f = o->child; f != e; f = f->next)
      if (f->string && strcmp(f->string, k) == 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: key \"%s\" given twice%s%s", what, k,
                       where[0] ? " in " : "", where);
  }
  return DT_SUCCESS;
}

/* The per-collective entries of object `obj` ("all_gather": {"base_us":..}, ...) into `next`,
 * each one found setting its bit in *set; `prefix` goes before the key in messages. */
static dt_status_t dt__cost_entries(cJSON* obj, dt_cost_params_t next[DT_COLL_COUNT][DT_ALGO_COUNT],
                                    uint32_t* set, const char* what, const char* prefix) {
  for (int k = 0; k < DT_COLL_COUNT * DT_ALGO_COUNT; k++) {
    dt_collective_t c = (dt_collective_t)(k / DT_ALGO_COUNT);
    dt_coll_algo_t a = (dt_coll_algo_t)(k % DT_ALGO_COUNT);
    if (a != DT_ALGO_NATIVE && !dt__cost_has_alt(c)) continue;
    char key[64];
    dt__cost_key(c, a, key, sizeof key);
    cJSON* e = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (e == NULL) continue;
    cJSON* b = cJSON_GetObjectItemCaseSensitive(e, "base_us");
    cJSON* h = cJSON_GetObjectItemCaseSensitive(e, "hop_us");
    cJSON* w = cJSON_GetObjectItemCaseSensitive(e, "bw_gbps");
    if (!cJSON_IsObject(e) || !cJSON_IsNumber(b) || !cJSON_IsNumber(h) || !cJSON_IsNumber(w))
      return DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: %s\"%s\" needs numbers base_us, hop_us, "
                     "bw_gbps", what, prefix, key);
    static const char* const fields[3] = {"base_us", "hop_us", "bw_gbps"};
    char where[160];
    snprintf(where, sizeof where, "%s\"%s\"", prefix, key);
    DT_CHECK(dt__cost_keys_check(e, fields, 3, 0, what, where));
    dt_cost_params_t p = {b->valuedouble, h->valuedouble, w->valuedouble};
    char at[192];
    snprintf(at, sizeof at, "cost model %s: %s\"%s\"", what, prefix, key);
    DT_CHECK(dt__params_check(&p, at));
    next[c][a] = p;
    *set |= 1u << k;
  }
  return DT_SUCCESS;
}

/* Parses and (apply) applies a model; `what` names its source in messages. Everything is checked
 * first and applied only if every entry is valid (no half-loaded model). */
static dt_status_t dt__cost_model_parse(const char* text, size_t len, const char* what,
                                        int apply) {
  const char* end = NULL;
  cJSON* root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (root == NULL || !cJSON_IsObject(root)) {
    size_t at = (root == NULL && end != NULL && end >= text) ? (size_t)(end - text) : 0;
    cJSON_Delete(root);
    if (at > 0) /* cJSON's error pointer (only meaningful when parsing failed) */
      return DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s is not a JSON object (syntax error at "
                     "byte %zu)", what, at);
    return DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s is not a JSON object", what);
  }
  /* Only white space may follow the object: "{...} garbage" and "{...}{...}" are refused. */
  size_t used = (size_t)(end - text);
  while (used < len && (text[used] == ' ' || text[used] == '\t' || text[used] == '\n' ||
                        text[used] == '\r'))
    used++;
  if (used < len) {
    cJSON_Delete(root);
    return DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: trailing data after the JSON object at "
                   "byte %zu", what, used);
  }
  dt_cost_params_t next[DT_COLL_COUNT][DT_ALGO_COUNT], nnext[DT_COLL_COUNT][DT_ALGO_COUNT];
  dt__cost_init();
  memcpy(next, dt__cost, sizeof next);
  memcpy(nnext, dt__cost_nccl, sizeof nnext);
  uint32_t nset = dt__cost_nccl_set, gset = 0;
  /* "inter_node": the trainer's --machine figures for mesh dims that span nodes (not read here) */
  static const char* const top[3] = {"nccl", "compute", "inter_node"};
  dt_status_t st = dt__cost_keys_check(root, top, 3, 1, what, "");
  if (st == DT_SUCCESS) st = dt__cost_entries(root, next, &gset, what, "");
  cJSON* ne = cJSON_GetObjectItemCaseSensitive(root, "nccl");
  if (st == DT_SUCCESS && ne != NULL) {
    if (!cJSON_IsObject(ne))
      st = DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: \"nccl\" must be an object", what);
    else st = dt__cost_keys_check(ne, NULL, 0, 1, what, "\"nccl\"");
    if (st == DT_SUCCESS) st = dt__cost_entries(ne, nnext, &nset, what, "\"nccl\".");
  }
  dt_compute_params_t comp = dt__compute; /* "compute": fields left out keep their values */
  cJSON* ce = cJSON_GetObjectItemCaseSensitive(root, "compute");
  if (st == DT_SUCCESS && ce != NULL) {
    static const char* keys[6] = {"gemm_gflops", "gemm_bf16_gflops", "mem_gbps", "op_us",
                                  "attn_gflops", "comm_overlap"};
    double* fields[6] = {&comp.gemm_gflops, &comp.gemm_bf16_gflops, &comp.mem_gbps, &comp.op_us,
                         &comp.attn_gflops, &comp.comm_overlap};
    if (!cJSON_IsObject(ce))
      st = DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: \"compute\" must be an object", what);
    else st = dt__cost_keys_check(ce, keys, 6, 0, what, "\"compute\"");
    for (int i = 0; i < 6 && st == DT_SUCCESS; i++) {
      cJSON* v = cJSON_GetObjectItemCaseSensitive(ce, keys[i]);
      if (v == NULL) continue;
      if (!cJSON_IsNumber(v))
        st = DT_FAIL(DT_ERR_INVALID_ARG, "cost model %s: \"compute\".\"%s\" must be a number",
                     what, keys[i]);
      else *fields[i] = v->valuedouble;
    }
    char where[160];
    snprintf(where, sizeof where, "cost model %s: \"compute\"", what);
    if (st == DT_SUCCESS) st = dt__compute_check(&comp, where);
  }
  cJSON_Delete(root);
  if (st != DT_SUCCESS || !apply) return st;
  dt__compute = comp;
  memcpy(dt__cost, next, sizeof next);
  memcpy(dt__cost_nccl, nnext, sizeof nnext);
  dt__cost_nccl_set = nset;
  dt__cost_gen++;
  return DT_SUCCESS;
}

static dt_status_t dt__cost_model_load_string_impl(const char* text, size_t len, int apply) {
  DT_ARG_NOT_NULL(text);
  if (len > (1u << 20))
    return DT_FAIL(DT_ERR_INVALID_ARG, "len=%zu: cost model text larger than 1 MiB", len);
  if (memchr(text, '\0', len) != NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cost model text contains a NUL byte");
  return dt__cost_model_parse(text, len, "text", apply);
}

dt_status_t dt_cost_model_load_string(const char* text, size_t len) {
  DT_ENTRY_RETURN(dt__cost_model_load_string_impl(text, len, 1));
}

dt_status_t dt_cost_model_check_string(const char* text, size_t len) {
  DT_ENTRY_RETURN(dt__cost_model_load_string_impl(text, len, 0));
}

static dt_status_t dt__cost_model_load_impl(const char* path) {
  DT_ARG_NOT_NULL(path);
  struct stat sb; /* a FIFO would block the open (dt_init loads $DTENSOR_COST_MODEL) */
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return DT_FAIL(DT_ERR_IO, "cost model '%s' is not a regular file", path);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return DT_FAIL(DT_ERR_IO, "cannot open cost model '%s'", path);
  char* text = NULL;
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  if (len < 0 || len > (1 << 20) || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return DT_FAIL(DT_ERR_IO, "cost model '%s' unreadable or larger than 1 MiB", path);
  }
  text = (char*)dt__malloc((size_t)len + 1);
  if (text == NULL) {
    fclose(f);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "reading '%s'", path);
  }
  size_t got = fread(text, 1, (size_t)len, f);
  int rerr = ferror(f);
  fclose(f);
  text[got] = '\0';
  dt_status_t st;
  char what[1100];
  snprintf(what, sizeof what, "'%s'", path);
  if (rerr)
    st = DT_FAIL(DT_ERR_IO, "cannot read cost model '%s'", path);
  else if (memchr(text, '\0', got) != NULL)
    st = DT_FAIL(DT_ERR_INVALID_ARG, "cost model '%s' contains a NUL byte (not a JSON file)",
                 path);
  else
    st = dt__cost_model_parse(text, got, what, 1);
  dt__free(text);
  return st;
}

dt_status_t dt_cost_model_load(const char* path) {
  DT_ENTRY_RETURN(dt__cost_model_load_impl(path));
}

/* obj[key] = {"base_us":..,"hop_us":..,"bw_gbps":..}; 0 when out of memory. */
static int dt__cost_entry_json(cJSON* obj, const char* key, const dt_cost_params_t* p) {
  cJSON* e = cJSON_AddObjectToObject(obj, key);
  return e != NULL && cJSON_AddNumberToObject(e, "base_us", p->base_us) &&
         cJSON_AddNumberToObject(e, "hop_us", p->hop_us) &&
         cJSON_AddNumberToObject(e, "bw_gbps", p->bw_gbps);
}

static dt_status_t dt__cost_model_save_impl(const char* path) {
  DT_ARG_NOT_NULL(path);
  dt__cost_init();
  cJSON* root = cJSON_CreateObject();
  if (root == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "building JSON");
  for (int k = 0; k < DT_COLL_COUNT * DT_ALGO_COUNT; k++) {
    dt_collective_t c = (dt_collective_t)(k / DT_ALGO_COUNT);
    dt_coll_algo_t a = (dt_coll_algo_t)(k % DT_ALGO_COUNT);
    if (a != DT_ALGO_NATIVE && !dt__cost_has_alt(c)) continue;
    char key[64];
    dt__cost_key(c, a, key, sizeof key);
    if (!dt__cost_entry_json(root, key, &dt__cost[c][a])) {
      cJSON_Delete(root);
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "building JSON");
    }
  }
  cJSON* ne = dt__cost_nccl_set ? cJSON_AddObjectToObject(root, "nccl") : NULL;
  for (int k = 0; dt__cost_nccl_set && k < DT_COLL_COUNT * DT_ALGO_COUNT; k++) {
    if (!(dt__cost_nccl_set & (1u << k))) continue;
    char key[64];
    dt__cost_key((dt_collective_t)(k / DT_ALGO_COUNT), (dt_coll_algo_t)(k % DT_ALGO_COUNT), key,
                 sizeof key);
    if (ne == NULL ||
        !dt__cost_entry_json(ne, key, &dt__cost_nccl[k / DT_ALGO_COUNT][k % DT_ALGO_COUNT])) {
      cJSON_Delete(root);
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "building JSON");
    }
  }
  cJSON* ce = cJSON_AddObjectToObject(root, "compute");
  if (ce == NULL || !cJSON_AddNumberToObject(ce, "gemm_gflops", dt__compute.gemm_gflops) ||
      !cJSON_AddNumberToObject(ce, "gemm_bf16_gflops", dt__compute.gemm_bf16_gflops) ||
      !cJSON_AddNumberToObject(ce, "mem_gbps", dt__compute.mem_gbps) ||
      !cJSON_AddNumberToObject(ce, "op_us", dt__compute.op_us) ||
      !cJSON_AddNumberToObject(ce, "attn_gflops", dt__compute.attn_gflops) ||
      !cJSON_AddNumberToObject(ce, "comm_overlap", dt__compute.comm_overlap)) {
    cJSON_Delete(root);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "building JSON");
  }
  char* text = cJSON_Print(root);
  cJSON_Delete(root);
  if (text == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "printing JSON");
  FILE* f = fopen(path, "wb");
  if (f == NULL) {
    cJSON_free(text);
    return DT_FAIL(DT_ERR_IO, "cannot write '%s'", path);
  }
  int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  ok = (fclose(f) == 0) && ok;
  cJSON_free(text);
  return ok ? DT_SUCCESS : DT_FAIL(DT_ERR_IO, "writing '%s' failed", path);
}

dt_status_t dt_cost_model_save(const char* path) {
  DT_ENTRY_RETURN(dt__cost_model_save_impl(path));
}

/* A loaded model changes every plan's choices, so rank 0 says which file it came from (one line
 * on stderr) unless DTENSOR_QUIET is set (to anything but "" or "0"). */
dt_status_t dt__cost_model_autoload(int any_rank) {
  const char* env = getenv("DTENSOR_COST_MODEL");
  if (env != NULL && strcmp(env, "none") == 0) return DT_SUCCESS; /* built-in defaults only */
  char path[1024];
  const char* from = "$DTENSOR_COST_MODEL";
  if (env != NULL && env[0] != '\0') {
    snprintf(path, sizeof path, "%s", env);
  } else {
    const char* home = getenv("HOME");
    if (home == NULL) return DT_SUCCESS;
    snprintf(path, sizeof path, "%s/.cache/dtensor/cost_model.json", home);
    struct stat sb; /* present or not (not opened here: a FIFO would block) */
    if (stat(path, &sb) != 0) return DT_SUCCESS;
    from = "the per-user default; DTENSOR_COST_MODEL=none ignores it";
  }
  DT_CHECK(dt_cost_model_load(path));
  const char* quiet = getenv("DTENSOR_QUIET");
  if ((any_rank || dt__world_rank() == 0) &&
      (quiet == NULL || quiet[0] == '\0' || strcmp(quiet, "0") == 0))
    dt__log("cost", "calibrated cost model %s (%s)", path, from);
  return DT_SUCCESS;
}

/* dtensor/redistribute.h - redistribution plans, the cost model and communication counters.
 *
 * A plan is the minimum-cost sequence of steps that turns one placement list into another for a
 * given mesh, global shape and dtype. Each step changes one mesh dim (or, merged, several dims
 * that the caller flattened) with one collective or a local operation. Plans are found by a
 * shortest-path search over placement states and cached per mesh by (shape, dtype, from, to).
 * Planning needs no MPI: it works on abstract meshes.
 */
#ifndef DTENSOR_REDISTRIBUTE_H
#define DTENSOR_REDISTRIBUTE_H

#include "dtensor/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_collective {
  DT_COLL_LOCAL = 0, /* no communication: slice (R->S) or partition (R->P) */
  DT_COLL_ALL_GATHER = 1,
  DT_COLL_ALL_REDUCE = 2,
  DT_COLL_REDUCE_SCATTER = 3,
  DT_COLL_ALL_TO_ALL = 4,
  DT_COLL_BROADCAST = 5, /* used by dt_tensor_distribute */
  DT_COLL_SCATTER = 6,   /* used by dt_tensor_distribute */
  DT_COLL_SEND_RECV = 7, /* one ring step: each rank sends nbytes to its successor along the mesh
                          * dim and receives as many from its predecessor (ring attention) */
  DT_COLL_COUNT
} dt_collective_t;

/* "local", "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast", "scatter",
 * "send_recv". */
DT_API const char* dt_collective_name(dt_collective_t c);

/* Algorithm of a reduction step. P -> S (reduce-scatter) and P -> R (all-reduce) can run as the
 * native collective, or as an all-to-all of the blocks followed by a local reduction (then, for
 * P -> R, an all-gather of the reduced chunks): the same bytes at all-to-all speed, with the
 * reduction done by the library in rank order. The cost model picks the cheaper per step. */
typedef enum dt_coll_algo {
  DT_ALGO_NATIVE = 0,
  DT_ALGO_A2A = 1,
  DT_ALGO_COUNT
} dt_coll_algo_t;

/* "native", "a2a". */
DT_API const char* dt_coll_algo_name(dt_coll_algo_t a);

typedef struct dt_plan* dt_plan_t;

typedef struct dt_plan_step {
  dt_collective_t coll;
  int n_mesh_dims;                       /* 1, or more for a step merged on a flattened dim */
  int mesh_dims[DT_MAX_MESH_DIMS];       /* ascending */
  dt_placement_t from[DT_MAX_MESH_DIMS]; /* placement before, per listed mesh dim */
  dt_placement_t to[DT_MAX_MESH_DIMS];   /* placement after, per listed mesh dim */
  uint64_t nbytes;                       /* per rank, nccl-tests convention: all-gather output,
                                            reduce-scatter input, all-reduce buffer, all-to-all
                                            send buffer, local: bytes written */
  double cost_us;                        /* cost model estimate */
  dt_coll_algo_t algo;                   /* reduce-scatter / all-reduce: how it runs */
} dt_plan_step_t;

/* Plans src -> dst (both mesh-ndim placements). Shard dims may be negative. Errors:
 * DT_ERR_INVALID_ARG for bad shapes/placements, DT_ERR_UNSUPPORTED for a new Partial from a
 * Shard, or P(x) -> P(y). The plan is independent of the caller's rank. */
DT_API dt_status_t dt_plan_create(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                  const dt_placement_t* src, const dt_placement_t* dst,
                                  dt_plan_t* out);
/* The same with PyTorch's greedy per-mesh-dim planner (for comparison). DT_ERR_UNSUPPORTED when
 * the greedy walk finds no valid sequence. */
DT_API dt_status_t dt_plan_create_greedy(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                         const int64_t* shape, const dt_placement_t* src,
                                         const dt_placement_t* dst, dt_plan_t* out);
DT_API dt_status_t dt_plan_destroy(dt_plan_t plan);
DT_API dt_status_t dt_plan_num_steps(dt_plan_t plan, int* n);
DT_API dt_status_t dt_plan_get_step(dt_plan_t plan, int i, dt_plan_step_t* step);
DT_API dt_status_t dt_plan_cost(dt_plan_t plan, double* cost_us);
/* Number of steps using collective c (DT_COLL_LOCAL counts local steps). */
DT_API dt_status_t dt_plan_count(dt_plan_t plan, dt_collective_t c, int* count);
/* "S(0)S(1) -> S(0)R -> RR" */
DT_API dt_status_t dt_plan_format(dt_plan_t plan, char* buf, size_t cap);

/* ---- cost model -------------------------------------------------------------------------- */
/* A collective on n ranks moving B bytes (nccl-tests convention) costs
 *   base_us + hops(n) * hop_us + factor(n) * B / (bw_gbps * 1e3)  microseconds,
 * hops = n-1 (2(n-1) for all-reduce), factor = (n-1)/n (2(n-1)/n for all-reduce). Local steps cost
 * B / memory bandwidth. Defaults follow PyTorch's CPU model so that plan orderings agree; the
 * `dtensor-calibrate` tool measures this machine and writes a JSON file loaded by dt_init.
 * Valid values (the setters and the loaders refuse anything else, NaN and infinities included,
 * with DT_ERR_INVALID_ARG naming the field): base_us and hop_us in [0, 1e6] (at most one second),
 * bw_gbps in [1e-6, 1e6] (1 KB/s to 1 PB/s). Within these ranges every cost is finite. */
typedef struct dt_cost_params {
  double base_us;
  double hop_us;
  double bw_gbps; /* GB/s, 1e9 bytes per second */
} dt_cost_params_t;

DT_API dt_status_t dt_cost_model_get(dt_collective_t c, dt_cost_params_t* out);
/* Changes one collective's parameters (invalidates cached plans). */
DT_API dt_status_t dt_cost_model_set(dt_collective_t c, const dt_cost_params_t* params);
/* The same for one algorithm of a collective (DT_ALGO_NATIVE is dt_cost_model_get/set). Only
 * reduce-scatter and all-reduce have DT_ALGO_A2A; its defaults make the native collective win
 * only on small buffers (reduce-scatter below ~100 KB; all-reduce below ~12 KB on 2 ranks,
 * ~130 KB on 4). */
DT_API dt_status_t dt_cost_model_get_algo(dt_collective_t c, dt_coll_algo_t a,
                                          dt_cost_params_t* out);
DT_API dt_status_t dt_cost_model_set_algo(dt_collective_t c, dt_coll_algo_t a,
                                          const dt_cost_params_t* params);
/* Forces one algorithm for every reduction step planned from now on (benchmarks, tests);
 * DT_ALGO_COUNT returns to choosing by cost. Invalidates cached plans. */
DT_API dt_status_t dt_cost_model_force_algo(dt_coll_algo_t a);
DT_API dt_status_t dt_cost_model_reset(void);
/* Loads / saves {"all_gather":{"base_us":..,"hop_us":..,"bw_gbps":..},...}; the all-to-all
 * algorithms of reductions are the keys "reduce_scatter_a2a" and "all_reduce_a2a". An object
 * "nccl" holds the same keys for meshes whose device data goes over NCCL (dt_mesh_data_plane;
 * `dtensor-calibrate --nccl` measures them): their steps use those where the mesh dim has no
 * parameters of its own (dt_mesh_set_cost_model), else the global ones. Keys left out
 * keep their values; a key given twice, or one not named here or in the compute model below, is
 * refused (a misspelt key would leave its value as it was), except "inter_node" (the trainer's
 * --machine figures for mesh dims that span nodes), which is accepted and not read here. The
 * file must hold exactly one JSON object (white space may follow it) of at most 1 MiB. Nothing is
 * applied unless every entry is valid (see the ranges above). */
DT_API dt_status_t dt_cost_model_load(const char* path);
/* The same from memory: `len` bytes of JSON text (no NUL needed; one inside is refused). */
DT_API dt_status_t dt_cost_model_load_string(const char* text, size_t len);
/* Checks text as dt_cost_model_load_string would, with its messages, and applies nothing. */
DT_API dt_status_t dt_cost_model_check_string(const char* text, size_t len);
DT_API dt_status_t dt_cost_model_save(const char* path);
/* Estimated cost of one collective on n ranks (its cheapest algorithm). */
DT_API dt_status_t dt_cost_estimate(dt_collective_t c, int n, uint64_t nbytes, double* cost_us);
/* Cost parameters of collective c with algorithm a on mesh dim `dim` of `mesh` (abstract meshes
 * too), for meshes whose dims sit on different links (tensor parallel over NVLink, data parallel
 * over InfiniBand): steps on that dim are priced with them instead of the global model (a step
 * merged over several flattened dims with its slowest member's: the lowest bandwidth). params
 * NULL returns the dim to the global model (or, for a mesh on the NCCL plane, to the model's
 * "nccl" parameters where it has them). Same ranges as dt_cost_model_set; plans of this mesh
 * cached before are not used again. A mesh on a device backend whose communication is staged
 * through host memory (DT_PLANE_MPI_STAGED, and DT_PLANE_UNDECIDED until its first collective)
 * also pays two copies per step, priced by the backend. */
DT_API dt_status_t dt_mesh_set_cost_model(dt_mesh_t mesh, int dim, dt_collective_t c,
                                          dt_coll_algo_t a, const dt_cost_params_t* params);
/* The parameters that price collective c with algorithm a on mesh dim `dim` (the dim's own, else
 * the model's "nccl" ones for a mesh on the NCCL plane where it has them, else the global
 * model's). */
DT_API dt_status_t dt_mesh_get_cost_model(dt_mesh_t mesh, int dim, dt_collective_t c,
                                          dt_coll_algo_t a, dt_cost_params_t* out);
/* Estimated cost of collective c moving nbytes over the mesh dims in `mask` (bit i: dim i) of
 * `mesh`, with the per-dim parameters and the backend's staging (its cheapest algorithm). */
DT_API dt_status_t dt_mesh_cost_estimate(dt_mesh_t mesh, unsigned mask, dt_collective_t c,
                                         uint64_t nbytes, double* cost_us);

/* ---- compute model (simulated step time) -------------------------------------------------
 * How long a rank's kernels take, for the step time of a simulated run (dt_init_simulated,
 * dt_sim_time_get): a matrix product (mm, bmm, linear, grouped products and their gradients) of
 * F FLOPs costs F / (gemm_gflops * 1e3) microseconds (gemm_bf16_gflops with bf16 operands),
 * attention (sdpa, its gradient, ring attention's blocks) F / (attn_gflops * 1e3), every other
 * kernel its bytes read and written over mem_gbps, the larger of the two when an op has both,
 * plus op_us per op (dispatch and launch). Attention's F counts the query-key pairs its kernel
 * scores (all S x T, or under a causal mask the keys each block of rows sees): 2 (D + E) FLOPs a
 * pair forward and 2 (3 D + 2 E) backward; attn_gflops is that count over the kernel's whole
 * time, its softmax passes and narrow (D-deep) products included, so it sits below the GEMM rate
 * (0.6 of it on the development machine's host kernels). 0: attention at the GEMM rate of its
 * operands.
 * Defaults: one core of the development machine (OpenBLAS sgemm 157 GFLOP/s at 1024^3, memcpy
 * 7 GB/s, docs/environment.md; op_us 5; attn_gflops 0; comm_overlap 1); `dtensor-calibrate`
 * measures them with the collectives (op_us and mem_gbps fitted to whole training steps, whose
 * other kernels pay more than an isolated one: page faults, libm, the tape's work) and writes
 * them under the key "compute" of the cost model file
 * ({"gemm_gflops":..,"gemm_bf16_gflops":..,"mem_gbps":..,"op_us":..,"attn_gflops":..,
 * "comm_overlap":..}), which
 * dt_cost_model_load and dt_cost_model_save read and write with the rest (a file without
 * attn_gflops or comm_overlap keeps the current value); dt_cost_model_reset restores the
 * defaults. Valid values: the rates in [1e-6, 1e9] (attn_gflops also 0), op_us in [0, 1e6],
 * comm_overlap in [0, 1].
 * comm_overlap is the fraction of a collective's time that runs beside the rank's kernels when
 * they run on the host (a host backend, or the simulated "cpu" device; it prices simulated steps
 * and ring attention's automatic choice between the ring and an all-gather): MPI moves a posted collective forward only inside
 * library calls, and over shared memory its copies and reductions run on the rank's own core, so
 * what does not overlap occupies the rank when posted. dtensor-calibrate measures it (an
 * asynchronous all-gather beside a run of small ops, against each alone); 1 (the default) is full
 * overlap. A simulated GPU (dt_sim_set_device "cuda") always overlaps fully: NCCL runs on its
 * own stream. */
typedef struct dt_compute_params {
  double gemm_gflops;      /* f32 matrix products, GFLOP/s per rank */
  double gemm_bf16_gflops; /* bf16 operands */
  double mem_gbps;         /* bytes of other kernels, GB/s */
  double op_us;            /* fixed cost per op, microseconds */
  double attn_gflops;      /* attention's FLOPs over its kernels' time; 0: the GEMM rate */
  double comm_overlap;     /* host collectives: the fraction of their time hidden by kernels */
} dt_compute_params_t;
DT_API dt_status_t dt_compute_model_get(dt_compute_params_t* out);
DT_API dt_status_t dt_compute_model_set(const dt_compute_params_t* params);

/* ---- asynchronous redistribution --------------------------------------------------------- */
/* A redistribution in flight (dt_tensor_redistribute_async). It advances whenever the library is
 * entered (dt_work_test, dt_work_wait, any op); the source and target tensors may be destroyed
 * before it completes (it holds their memory), but the source must not be written and the
 * target not read until dt_work_wait returns. Works on one mesh must be waited for (or
 * destroyed) in the same order on every rank of it, like any collective; up to 8 are in flight
 * per mesh, and starting a ninth first completes the oldest. */
typedef struct dt_work* dt_work_t;

/* Blocks until the work completes; returns its status (with the failure's message). The work
 * stays valid (a second wait returns the same status) until dt_work_destroy. Collective. */
DT_API dt_status_t dt_work_wait(dt_work_t work);
/* Advances every work in flight without blocking; *done = 1 when this one has completed. */
DT_API dt_status_t dt_work_test(dt_work_t work, int* done);
/* Completes the work if it is still running (blocks), then frees it. NULL is a no-op.
 * Collective when the work has not been waited for. */
DT_API dt_status_t dt_work_destroy(dt_work_t work);

/* ---- counters ---------------------------------------------------------------------------- */
typedef struct dt_counters {
  uint64_t calls[DT_COLL_COUNT];
  uint64_t nbytes[DT_COLL_COUNT];
  /* per mesh dim; steps merged on a flattened dim count under flat_* */
  uint64_t dim_calls[DT_MAX_MESH_DIMS][DT_COLL_COUNT];
  uint64_t dim_nbytes[DT_MAX_MESH_DIMS][DT_COLL_COUNT];
  uint64_t flat_calls[DT_COLL_COUNT];
  uint64_t flat_nbytes[DT_COLL_COUNT];
  uint64_t redistributes; /* dt_tensor_redistribute* calls that ran a plan */
  uint64_t plan_cache_hits;
  uint64_t plan_cache_misses;
} dt_counters_t;

/* Reads the counters of one mesh, or summed over all meshes when mesh is NULL. */
DT_API dt_status_t dt_counters_get(dt_mesh_t mesh, dt_counters_t* out);
/* Resets the counters of one mesh, or of every mesh when mesh is NULL. */
DT_API dt_status_t dt_counters_reset(dt_mesh_t mesh);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_REDISTRIBUTE_H */

/* dtensor/strategy.h - op sharding strategies: per-mesh-dim rules, expansion and selection.
 *
 * Every op has a rule generator. A rule is written for ONE mesh dim: the placement each output has
 * when each input has the listed placement ("mm": [out; a, b] in {[R; R, R], [S(0); S(0), R],
 * [S(1); R, S(1)], [P; S(1), S(0)]}). The registry expands the rules over all mesh dims (every
 * combination), drops combinations a tensor cannot take (shard dim out of range), and selection
 * picks the candidate whose input redistributions cost least under the planner's cost model.
 * Ties go to the candidate that moves nothing, then the one with fewer redistribution steps, then
 * the first in rule order. Pure and MPI-free: works on abstract meshes.
 */
#ifndef DTENSOR_STRATEGY_H
#define DTENSOR_STRATEGY_H

#include "dtensor/backend.h"
#include "dtensor/redistribute.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_OP_MAX_INPUTS 8
#define DT_OP_MAX_OUTPUTS 3
#define DT_OP_MAX_IARGS 8
#define DT_OP_MAX_FARGS 8
#define DT_OP_MAX_RULES 64
#define DT_OP_NAME_MAX 32

typedef struct dt_tensor_meta {
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
} dt_tensor_meta_t;

/* An op application as the strategy layer sees it: tensor metadata and non-tensor arguments
 * (dims, flags as iargs; scalars as fargs). Everything here enters the propagation cache key. */
typedef struct dt_op_call {
  const char* op;
  int n_inputs;
  dt_tensor_meta_t in[DT_OP_MAX_INPUTS];
  int n_iargs;
  int64_t iargs[DT_OP_MAX_IARGS];
  int n_fargs;
  double fargs[DT_OP_MAX_FARGS];
} dt_op_call_t;

/* One rule for one mesh dim: placements of the outputs, then of the inputs. */
typedef struct dt_op_rule {
  dt_placement_t out[DT_OP_MAX_OUTPUTS];
  dt_placement_t in[DT_OP_MAX_INPUTS];
} dt_op_rule_t;

/* Rule generator: validates the call (shapes, dtypes, args), writes the output metadata and up to
 * `cap` single-mesh-dim rules. Returns DT_ERR_INVALID_ARG with a message for a bad call. */
typedef dt_status_t (*dt_op_rules_fn)(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                      int* n_outputs, dt_op_rule_t* rules, int cap, int* n_rules);

/* A local (per-rank) tensor handed to kernels: dense row-major, with the global index of its
 * first element along each dim (e.g. where a vocabulary shard starts), and the backend whose
 * memory holds `data` (see dtensor/backend.h). */
typedef struct dt_local_tensor {
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t offset[DT_MAX_DIMS];
  void* data;
  dt_backend_t backend;
} dt_local_tensor_t;

/* Local kernel: computes the outputs' local shards from the inputs' local shards (already
 * redistributed to the chosen strategy). Output buffers are allocated by the library with the
 * shapes given. Returns a status (DT_ERR_UNSUPPORTED for a dtype it does not handle). */
typedef dt_status_t (*dt_op_kernel_fn)(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                       dt_local_tensor_t* out);

/* Registers (or replaces) op `name` with `n_inputs` tensor inputs (0: any count from 1 to
 * DT_OP_MAX_INPUTS, like cat): its single-mesh-dim rules and its local kernel (NULL: the op can be
 * planned and explained but not run). Host programs add their own ops this way (what PyTorch
 * offers as register_sharding). Replacing a built-in replaces its rules and kernel. */
DT_API dt_status_t dt_op_register(const char* name, int n_inputs, dt_op_rules_fn rules,
                                  dt_op_kernel_fn kernel);
/* Gives op `name` (registered with dt_op_register) a kernel for memory of `device`, run on the
 * local shards of tensors on a backend of that device (kernel NULL removes it). A CUDA kernel
 * reads and writes device memory and issues its work on the backend's stream. The kernels of
 * built-in ops belong to the library: DT_ERR_INVALID_USAGE unless the op was overridden with
 * dt_op_register. */
DT_API dt_status_t dt_op_register_kernel(const char* name, dt_device_t device,
                                         dt_op_kernel_fn kernel);
/* 1 in *found if `name` has a strategy. */
DT_API dt_status_t dt_op_lookup(const char* name, int* found);

/* A fully expanded candidate (one placement per mesh dim for every tensor) and its cost. */
typedef struct dt_op_choice {
  int n_outputs;
  dt_tensor_meta_t out_meta[DT_OP_MAX_OUTPUTS];
  dt_placement_t out[DT_OP_MAX_OUTPUTS][DT_MAX_MESH_DIMS];
  dt_placement_t in[DT_OP_MAX_INPUTS][DT_MAX_MESH_DIMS]; /* required input placements */
  double cost_us;      /* sum of the input redistribution plans' costs */
  int steps;           /* total redistribution steps */
  int n_candidates;    /* candidates considered (set on the selected choice) */
} dt_op_choice_t;

/* Selects the cheapest candidate for inputs currently placed as in_pl[i][0..mesh ndim).
 * DT_ERR_UNSUPPORTED for an unknown op ("unknown op 'matmul': did you mean 'mm'? ..."). */
DT_API dt_status_t dt_op_select(dt_mesh_t mesh, const dt_op_call_t* call,
                                const dt_placement_t in_pl[][DT_MAX_MESH_DIMS],
                                dt_op_choice_t* out);
/* Every legal candidate with its cost, in rule-expansion order (at most cap; *n is the total). */
DT_API dt_status_t dt_op_candidates(dt_mesh_t mesh, const dt_op_call_t* call,
                                    const dt_placement_t in_pl[][DT_MAX_MESH_DIMS],
                                    dt_op_choice_t* out, int cap, int* n);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_STRATEGY_H */

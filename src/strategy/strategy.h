/* strategy.h - internal interface of the strategy layer: built-in rule generators. */
#ifndef DT_STRATEGY_STRATEGY_H
#define DT_STRATEGY_STRATEGY_H

#include "dtensor/strategy.h"
#include "redistribute/redistribute.h"

/* Matmul family from an einsum equation ("mk,kn->mn"): batch dims S on every operand, free dims S
 * on their operand and R on the others, contracted dims give P(sum) from S on the operands; with
 * `bilinear`, a Partial (sum or avg) passes through one operand while the others are R. */
dt_status_t dt__rules_einsum(const char* eq, const dt_op_call_t* call, int bilinear,
                             dt_tensor_meta_t* out_meta, dt_op_rule_t* rules, int cap,
                             int* n_rules);

/* Pointwise with numpy broadcasting; `lin` says how Partial placements may pass. */
typedef enum {
  DT_LIN_NONE = 0,      /* non-linear: Partial inputs are reduced first */
  DT_LIN_UNARY = 1,     /* linear in its single input (neg, scalar mul, cast): P(sum|avg) */
  DT_LIN_ADDITIVE = 2,  /* add/sub: P(sum|avg) on every input (R inputs are partitioned) */
  DT_LIN_MULT = 3,      /* mul: P(sum|avg) on one input, the others R (P*P costs an AR) */
  DT_LIN_NUMERATOR = 4, /* div: P(sum|avg) on the numerator only */
  DT_LIN_MAX = 5,       /* maximum: keeps P(max) */
  DT_LIN_MIN = 6,       /* minimum: keeps P(min) */
} dt_linearity_t;

dt_status_t dt__rules_pointwise(const dt_op_call_t* call, dt_linearity_t lin,
                                dt_tensor_meta_t* out_meta, dt_op_rule_t* rules, int cap,
                                int* n_rules);

/* Reductions over dims: iargs = [keepdim, dim...] (no dims: all). kind 0 sum, 1 mean, 2 amax,
 * 3 amin. A reduced sharded dim gives P(sum) for sum and mean (mean divides by the global count,
 * so uneven shards stay exact), P(max) for amax, P(min) for amin. */
dt_status_t dt__rules_reduce(const dt_op_call_t* call, int kind, dt_tensor_meta_t* out_meta,
                             dt_op_rule_t* rules, int cap, int* n_rules);
/* Which input dims a reduction reduces (bitmask) after validating the arguments. */
dt_status_t dt__reduce_dims(const dt_op_call_t* call, unsigned* mask, int* keepdim);

/* The permutation of permute/transpose/t (out dim i = in dim perm[i]), validated. */
dt_status_t dt__view_perm(const dt_op_call_t* call, int* perm);

/* The rule generator of call->op after checking its arity; DT_ERR_UNSUPPORTED when unknown. */
dt_status_t dt__op_get(const dt_op_call_t* call, dt_op_rules_fn* rules);
/* builtin (may be NULL): 1 when the kernel is the library's own, which writes every element of
 * its outputs (so dispatch can skip zero-filling them). */
dt_status_t dt__op_get_kernel(const dt_op_call_t* call, dt_op_rules_fn* rules,
                              dt_op_kernel_fn* kernel, int* builtin);
/* Attaches a built-in kernel if the op has none yet (used by the ops layer). */
dt_status_t dt__op_set_kernel(const char* name, dt_op_kernel_fn kernel);

/* A built-in op's check of one expanded candidate on a concrete mesh: 0 drops it. Rules are written
 * for one mesh dim without its size; where exactness depends on how the chunk rule splits uneven
 * dims (a reshape moving a shard boundary, grouped-query heads), the check decides per mesh. */
typedef int (*dt__op_check_fn)(dt_mesh_t mesh, const dt_op_call_t* call, const dt_op_choice_t* c);
dt__op_check_fn dt__op_get_check(const char* name);
dt_status_t dt__op_set_check(const char* name, dt__op_check_fn check);

/* Group decomposition of a reshape: input dims [i0, i1) hold the same elements as output dims
 * [o0, o1). Returns the number of groups, -1 when the element counts differ. */
typedef struct dt_view_group {
  int i0, i1, o0, o1;
} dt_view_group_t;
int dt__view_groups(int na, const int64_t* a, int nb, const int64_t* b, dt_view_group_t* g,
                    int cap);

/* Frees the propagation cache (dt_finalize). */
void dt__prop_cache_release(void);

/* Registers the built-in ops once (called by the registry on first use). */
void dt__ops_register_builtins(void);
void dt__ops_register_shape(void); /* rules_shape.c */
void dt__ops_register_nn(void);    /* rules_nn.c */
void dt__ops_register_grad(void);  /* rules_grad.c */

/* Activation kinds of act_grad (g * f'(x)); sigmoid and tanh take the forward OUTPUT as x. */
enum { DT_ACT_RELU = 0, DT_ACT_SILU, DT_ACT_GELU, DT_ACT_SIGMOID_OUT, DT_ACT_TANH_OUT,
       DT_ACT_COUNT };

/* Runs the rule generator of a registered op on a call (for generators built on others). */
dt_status_t dt__op_rules_of(const char* name, const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                            dt_op_rule_t* rules, int cap, int* n);

/* slice/narrow arguments normalized: elements start, start+step, ... (len of them) along dim. */
dt_status_t dt__slice_args(const dt_op_call_t* call, int* dim, int64_t* start, int64_t* step,
                           int64_t* len);
/* sdpa's layout from iargs [causal, layout]: the heads dim and the sequence dim of q, k, v. */
dt_status_t dt__sdpa_layout(const dt_op_call_t* call, int* hd, int* sd);
/* topk arguments validated: k, dim, largest. */
dt_status_t dt__topk_args(const dt_op_call_t* call, int64_t* k, int* dim, int* largest);

#endif

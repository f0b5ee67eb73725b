/* strategy.h - internal interface of the strategy layer: rule generators, selection, the op
 * table's declarations (op.h) and the helpers kernels share with the generators. */
#ifndef DT_STRATEGY_STRATEGY_H
#define DT_STRATEGY_STRATEGY_H

#include "dtensor/strategy.h"
#include "redistribute/redistribute.h"
#include "strategy/op.h"

/* ---- rule generators named by the op table ------------------------------------------------- */
#define DT__RULES(fn)                                                                      \
  dt_status_t fn(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,         \
                 dt_op_rule_t* rules, int cap, int* n)
DT__RULES(dt__mm_rules);
DT__RULES(dt__bmm_rules);
DT__RULES(dt__mm_t_rules);
DT__RULES(dt__addmm_rules);
DT__RULES(dt__linear_rules);
DT__RULES(dt__additive_rules);
DT__RULES(dt__mult_rules);
DT__RULES(dt__numerator_rules);
DT__RULES(dt__max_rules);
DT__RULES(dt__min_rules);
DT__RULES(dt__nonlinear_rules);
DT__RULES(dt__unary_linear_rules);
DT__RULES(dt__add_scalar_rules);
DT__RULES(dt__mul_scalar_rules);
DT__RULES(dt__pow_rules);
DT__RULES(dt__clamp_rules);
DT__RULES(dt__log1p_rules);
DT__RULES(dt__expm1_rules);
DT__RULES(dt__monotone_rules);
DT__RULES(dt__round_rules);
DT__RULES(dt__sign_rules);
DT__RULES(dt__where_rules);
DT__RULES(dt__masked_fill_rules);
DT__RULES(dt__cast_rules);
DT__RULES(dt__dropout_rules);
DT__RULES(dt__sum_rules);
DT__RULES(dt__mean_rules);
DT__RULES(dt__amax_rules);
DT__RULES(dt__amin_rules);
DT__RULES(dt__argmax_rules);
DT__RULES(dt__argmin_rules);
DT__RULES(dt__logsumexp_rules);
DT__RULES(dt__var_rules);
DT__RULES(dt__std_rules);
DT__RULES(dt__prod_rules);
DT__RULES(dt__softmax_rules);
DT__RULES(dt__norm_rules);
DT__RULES(dt__embedding_rules);
DT__RULES(dt__gather_dim_rules);
DT__RULES(dt__sdpa_rules);
DT__RULES(dt__rotary_rules);
DT__RULES(dt__reshape_rules);
DT__RULES(dt__flatten_rules);
DT__RULES(dt__unflatten_rules);
DT__RULES(dt__squeeze_rules);
DT__RULES(dt__unsqueeze_rules);
DT__RULES(dt__permute_rules);
DT__RULES(dt__transpose_rules);
DT__RULES(dt__t_rules);
DT__RULES(dt__slice_rules);
DT__RULES(dt__narrow_rules);
DT__RULES(dt__cat_rules);
DT__RULES(dt__expand_rules);
DT__RULES(dt__stack_rules);
DT__RULES(dt__index_select_rules);
DT__RULES(dt__tril_rules);
DT__RULES(dt__cumsum_rules);
DT__RULES(dt__topk_rules);
DT__RULES(dt__gather_rules);
DT__RULES(dt__scatter_add_rules);
DT__RULES(dt__act_grad_rules);
DT__RULES(dt__norm_grad_rules);
DT__RULES(dt__embedding_grad_rules);
DT__RULES(dt__sdpa_grad_rules);
DT__RULES(dt__adamw_rules);
DT__RULES(dt__scale_rules);
DT__RULES(dt__sumsq_rules);
DT__RULES(dt__grouped_mm_rules);
DT__RULES(dt__grouped_mm_wgrad_rules);
DT__RULES(dt__moe_route_rules);
DT__RULES(dt__index_add_rules);
#undef DT__RULES

/* Per-mesh checks named by the op table. */
int dt__view_check(dt_mesh_t mesh, const dt_op_call_t* call, const dt_op_choice_t* c);
int dt__sdpa_check(dt_mesh_t mesh, const dt_op_call_t* call, const dt_op_choice_t* c);

/* ---- building blocks of the generators ------------------------------------------------------ */
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

/* Reductions over dims: iargs = [keepdim, dim...]; keepdim defaults to 0 (the schema) and no
 * dims means every dim, so a call without arguments reduces to a 0-d tensor. kind 0 sum, 1 mean,
 * 2 amax, 3 amin (op DT_OP_SUM + kind). A reduced sharded dim gives P(sum) for sum and mean (mean
 * divides by the global count, so uneven shards stay exact), P(max) for amax, P(min) for amin.
 * dtypes as PyTorch: sum of i32 or i64 is i64 (dt__sum_dtype), amax / amin keep the dtype, mean
 * refuses integers (DT_ERR_INVALID_ARG). Kinds 4 argmax, 5 argmin (at most one dim; i64 out),
 * 6 logsumexp, 7 var and 8 std (fargs [correction], floats only) and 9 prod (at most one dim;
 * integers give i64) need their reduced dims whole on each rank (Replicate) and pass no
 * Partial. */
dt_status_t dt__rules_reduce(const dt_op_call_t* call, int kind, dt_tensor_meta_t* out_meta,
                             dt_op_rule_t* rules, int cap, int* n_rules);
/* Which input dims reduction `id` (DT_OP_SUM .. DT_OP_PROD) reduces (bitmask) and its keepdim,
 * after validating the arguments; rules, host and CUDA kernels and backward rules all read the
 * arguments here. */
dt_status_t dt__reduce_dims(int id, const dt_op_call_t* call, unsigned* mask, int* keepdim);
/* var / std (op `id`): the correction (fargs[0], default 1), refused unless finite. The divisor
 * is max(0, N - correction) for N reduced elements, as PyTorch (N <= correction: inf, or NaN
 * where the spread is 0 too); the gradient divides by N - correction itself, as PyTorch's. */
dt_status_t dt__var_correction(int id, const dt_op_call_t* call, double* corr);

/* The permutation of permute/transpose/t (op id DT_OP_PERMUTE, _TRANSPOSE or _T; out dim i =
 * in dim perm[i]), validated. */
dt_status_t dt__view_perm(int op, const dt_op_call_t* call, int* perm);

/* Group decomposition of a reshape: input dims [i0, i1) hold the same elements as output dims
 * [o0, o1). Returns the number of groups, -1 when the element counts differ. Shapes of 0
 * elements make one group of all dims. */
typedef struct dt_view_group {
  int i0, i1, o0, o1;
} dt_view_group_t;
int dt__view_groups(int na, const int64_t* a, int nb, const int64_t* b, dt_view_group_t* g,
                    int cap);

/* Activation kinds of act_grad (g * f'(x)); sigmoid and tanh take the forward OUTPUT as x; abs
 * is g * sign(x) (0 at 0 and NaN, as PyTorch's sgn); clamp passes g where lo <= x <= hi (fargs
 * [lo, hi], NaN or absent: no bound) and gives 0 elsewhere and at NaN. */
enum { DT_ACT_RELU = 0, DT_ACT_SILU, DT_ACT_GELU, DT_ACT_SIGMOID_OUT, DT_ACT_TANH_OUT, DT_ACT_ABS,
       DT_ACT_CLAMP, DT_ACT_COUNT };

/* index_select's dim (iargs [dim]) normalized; a 0-d x takes 0 or -1 and gives 0 (its one element
 * as a dim of size 1). Rules, kernels and the backward rule read it here. */
dt_status_t dt__index_select_dim(const dt_op_call_t* call, int* dim);

/* softmax's and log_softmax's iargs [dim] validated and normalized (-1 for a 0-d tensor, whose
 * dims wrap as a 1-d one's: its one element is the whole row); the rules and every kernel read
 * it here. */
dt_status_t dt__softmax_dim(const dt_op_call_t* call, int* dim);

/* cumsum's iargs [dim, reverse = 0] validated: dim normalized (-1 for a 0-d tensor: nothing to
 * scan) and the direction; rules, kernels and the backward rule all read them here. */
dt_status_t dt__cumsum_args(const dt_op_call_t* call, int* dim, int* reverse);

/* slice (op DT_OP_SLICE: [dim, start, end(, step)], Python semantics) or narrow (DT_OP_NARROW:
 * [dim, start, length]) normalized: elements start, start+step, ... (len of them) along dim. */
dt_status_t dt__slice_args(int op, const dt_op_call_t* call, int* dim, int64_t* start,
                           int64_t* step, int64_t* len);
/* sdpa's layout from iargs [causal, layout]: the heads dim and the sequence dim of q, k, v. */
dt_status_t dt__sdpa_layout(const dt_op_call_t* call, int* hd, int* sd);
/* topk arguments validated: k, dim, largest. */
dt_status_t dt__topk_args(const dt_op_call_t* call, int64_t* k, int* dim, int* largest);
/* grouped_mm's trans argument (default 1), validated. */
dt_status_t dt__grouped_mm_args(const dt_op_call_t* call, int* trans);
/* moe_route's arguments validated: the number of experts and the capacity (0: dropless). */
dt_status_t dt__moe_route_args(const dt_op_call_t* call, int64_t* experts, int64_t* capacity);

/* ---- registry and selection ----------------------------------------------------------------- */
/* Checks n_iargs/n_fargs against op `id`'s schema (built-ins; host ops check their own). */
dt_status_t dt__op_check_counts(int id, int n_iargs, int n_fargs);
/* dt_op_select for a resolved op id (dispatch resolves the name once). */
dt_status_t dt__op_select(dt_mesh_t mesh, int id, const dt_op_call_t* call,
                          const dt_placement_t in_pl[][DT_MAX_MESH_DIMS], dt_op_choice_t* out);
/* Frees the propagation cache (dt_finalize). */
void dt__prop_cache_release(void);

#endif

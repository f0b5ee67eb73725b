/* op_list.h - the op table: one row per built-in op (see op.h).
 *
 * Columns: X(ID, name, inputs, outputs, argument schema, rule generator, per-mesh check,
 *            backward rule, flags, host kernel, composite forward)
 * - inputs: the count (the maximum for DT_OPF_VARIADIC);
 * - argument schema: "name[:kind][=default|?], ..." with kind i (integer, the default), f (scalar),
 *   l (integer list: every remaining integer argument), d (dtype), p (placement list); "=v" gives a
 *   default, "?" marks an optional argument whose default the op computes (it may be left out);
 *   anything else is required. Integers fill iargs and scalars fargs, each in schema order;
 * - the rule generator and check live in src/strategy, the backward rule and the kernel in
 *   src/ops (this list only names them); NULL where the op has none: a backward rule is NULL only
 *   with DT_OPF_NO_GRAD, rules and kernel only for a composite (built from other ops);
 * - flags: DT_OPF_* of op.h (W writes all, A any dtype, R recompute, N no gradient, V variadic,
 *   I in place: DT_OPF_WRITES_IN(i) names the inputs it updates; such ops have no outputs;
 *   P2 / P12: inputs 0 and 1 / 1 and 2 are promoted to a common dtype, DT_OPF_PROMOTES_IN(i)
 *   (DT_OPF_PROMOTES_MASK: every input, as cat and stack);
 *   F0: an integer input 0 is cast to f32 first, DT_OPF_INT_TO_FLOAT).
 * Keep the ids in this order: new ops go at the end of their group, and dt__op_table's
 * _Static_assert on DT_OP_COUNT makes a reviewer look at the docs and tests too.
 */
#ifndef DT_STRATEGY_OP_LIST_H
#define DT_STRATEGY_OP_LIST_H

#define DT__W DT_OPF_WRITES_ALL
#define DT__WR (DT_OPF_WRITES_ALL | DT_OPF_RECOMPUTE)
#define DT__WRA (DT_OPF_WRITES_ALL | DT_OPF_RECOMPUTE | DT_OPF_ANY_DTYPE)
#define DT__WN (DT_OPF_WRITES_ALL | DT_OPF_NO_GRAD)
#define DT__WC (DT_OPF_WRITES_ALL | DT_OPF_CHECKS_DATA)
#define DT__WNC (DT_OPF_WRITES_ALL | DT_OPF_NO_GRAD | DT_OPF_CHECKS_DATA)
#define DT__VIEW (DT__WRA | DT_OPF_VIEW)
#define DT__CUT (DT__WRA | DT_OPF_CUT)
#define DT__I (DT_OPF_NO_GRAD | DT_OPF_ANY_DTYPE)
#define DT__P2 (DT_OPF_PROMOTES_IN(0) | DT_OPF_PROMOTES_IN(1))
#define DT__P12 (DT_OPF_PROMOTES_IN(1) | DT_OPF_PROMOTES_IN(2))
/* a unary float op whose integer input is cast to f32 first (PyTorch: torch.sin(int) is f32) */
#define DT__F0 (DT_OPF_PROMOTES_IN(0) | DT_OPF_INT_TO_FLOAT)

/* clang-format off */
#define DT_OP_LIST(X)                                                                                    \
  /* matmuls */                                                                                          \
  X(MM, "mm", 2, 1, "", dt__mm_rules, NULL, dt__bw_mm, DT__W, dt__kernel_mm, NULL)                       \
  X(BMM, "bmm", 2, 1, "", dt__bmm_rules, NULL, dt__bw_bmm, DT__W, dt__kernel_bmm, NULL)                  \
  X(MM_T, "mm_t", 2, 1, "", dt__mm_t_rules, NULL, dt__bw_mm_t, DT__W, dt__kernel_mm_t, NULL)             \
  X(ADDMM, "addmm", 3, 1, "beta:f=1, alpha:f=1", dt__addmm_rules, NULL, dt__bw_addmm, DT__W,             \
    dt__kernel_addmm, NULL)                                                                              \
  X(LINEAR, "linear", 3, 1, "", dt__linear_rules, NULL, dt__bw_linear, DT__W, dt__kernel_linear, NULL)   \
  X(LINEAR_NOBIAS, "linear_nobias", 2, 1, "", dt__linear_rules, NULL, dt__bw_linear, DT__W,              \
    dt__kernel_linear, NULL)                                                                             \
  X(GROUPED_MM, "grouped_mm", 3, 1, "trans=1", dt__grouped_mm_rules, NULL, dt__bw_grouped_mm, DT__WC,    \
    dt__kernel_grouped_mm, NULL)                                                                         \
  /* pointwise */                                                                                        \
  X(ADD, "add", 2, 1, "", dt__additive_rules, NULL, dt__bw_add, DT__WR | DT__P2, dt__kernel_add, NULL)   \
  X(SUB, "sub", 2, 1, "", dt__additive_rules, NULL, dt__bw_sub, DT__WR | DT__P2, dt__kernel_sub, NULL)   \
  X(MUL, "mul", 2, 1, "", dt__mult_rules, NULL, dt__bw_mul, DT__WR | DT__P2, dt__kernel_mul, NULL)       \
  X(DIV, "div", 2, 1, "", dt__numerator_rules, NULL, dt__bw_div,                                          \
    DT__WR | DT__P2 | DT_OPF_INT_TO_FLOAT, dt__kernel_div, NULL)                                         \
  X(MAXIMUM, "maximum", 2, 1, "", dt__max_rules, NULL, dt__bw_maximum, DT__WR | DT__P2,                  \
    dt__kernel_maximum, NULL)                                                                            \
  X(MINIMUM, "minimum", 2, 1, "", dt__min_rules, NULL, dt__bw_minimum, DT__WR | DT__P2,                  \
    dt__kernel_minimum, NULL)                                                                            \
  X(EQ, "eq", 2, 1, "", dt__nonlinear_rules, NULL, dt__bw_none, DT__W | DT__P2, dt__kernel_eq, NULL)     \
  X(GE, "ge", 2, 1, "", dt__nonlinear_rules, NULL, dt__bw_none, DT__W | DT__P2, dt__kernel_ge, NULL)     \
  X(GT, "gt", 2, 1, "", dt__nonlinear_rules, NULL, dt__bw_none, DT__W | DT__P2, dt__kernel_gt, NULL)     \
  X(NE, "ne", 2, 1, "", dt__nonlinear_rules, NULL, dt__bw_none, DT__W | DT__P2, dt__kernel_ne, NULL)     \
  X(LT, "lt", 2, 1, "", dt__nonlinear_rules, NULL, dt__bw_none, DT__W | DT__P2, dt__kernel_lt, NULL)     \
  X(LE, "le", 2, 1, "", dt__nonlinear_rules, NULL, dt__bw_none, DT__W | DT__P2, dt__kernel_le, NULL)     \
  X(NEG, "neg", 1, 1, "", dt__unary_linear_rules, NULL, dt__bw_neg, DT__WR, dt__kernel_neg, NULL)        \
  X(RELU, "relu", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_relu, DT__WR, dt__kernel_relu, NULL)       \
  X(EXP, "exp", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_exp, DT__WR | DT__F0,                        \
    dt__kernel_exp, NULL)                                                                                \
  X(LOG, "log", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_log, DT__WR | DT__F0,                        \
    dt__kernel_log, NULL)                                                                                \
  X(SQRT, "sqrt", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_sqrt, DT__WR | DT__F0,                     \
    dt__kernel_sqrt, NULL)                                                                               \
  X(RSQRT, "rsqrt", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_rsqrt, DT__WR | DT__F0,                  \
    dt__kernel_rsqrt, NULL)                                                                              \
  X(GELU, "gelu", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_gelu, DT__WR, dt__kernel_gelu, NULL)       \
  X(SILU, "silu", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_silu, DT__WR, dt__kernel_silu, NULL)       \
  X(SIGMOID, "sigmoid", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_sigmoid, DT__WR | DT__F0,           \
    dt__kernel_sigmoid, NULL)                                                                            \
  X(TANH, "tanh", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_tanh, DT__WR | DT__F0,                     \
    dt__kernel_tanh, NULL)                                                                               \
  X(ABS, "abs", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_abs, DT__WR, dt__kernel_abs, NULL)           \
  X(CLAMP, "clamp", 1, 1, "min:f?, max:f?", dt__clamp_rules, NULL, dt__bw_clamp, DT__WR,                 \
    dt__kernel_clamp, NULL)                                                                              \
  X(SIN, "sin", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_sin, DT__WR | DT__F0, dt__kernel_sin, NULL)  \
  X(COS, "cos", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_cos, DT__WR | DT__F0, dt__kernel_cos, NULL)  \
  X(RECIPROCAL, "reciprocal", 1, 1, "", dt__nonlinear_rules, NULL, dt__bw_reciprocal,                    \
    DT__WR | DT__F0, dt__kernel_reciprocal, NULL)                                                        \
  X(LOG1P, "log1p", 1, 1, "", dt__log1p_rules, NULL, dt__bw_log1p, DT__WR | DT__F0,                      \
    dt__kernel_log1p, NULL)                                                                              \
  X(EXPM1, "expm1", 1, 1, "", dt__expm1_rules, NULL, dt__bw_expm1, DT__WR | DT__F0,                      \
    dt__kernel_expm1, NULL)                                                                              \
  X(FLOOR, "floor", 1, 1, "", dt__monotone_rules, NULL, dt__bw_zero, DT__WR, dt__kernel_floor, NULL)     \
  X(CEIL, "ceil", 1, 1, "", dt__monotone_rules, NULL, dt__bw_zero, DT__WR, dt__kernel_ceil, NULL)        \
  X(ROUND, "round", 1, 1, "decimals=0", dt__round_rules, NULL, dt__bw_zero, DT__WR,                      \
    dt__kernel_round, NULL)                                                                              \
  X(TRUNC, "trunc", 1, 1, "", dt__monotone_rules, NULL, dt__bw_zero, DT__WR, dt__kernel_trunc, NULL)     \
  X(SIGN, "sign", 1, 1, "", dt__sign_rules, NULL, dt__bw_zero, DT__WR, dt__kernel_sign, NULL)            \
  X(ERF, "erf", 1, 1, "", dt__monotone_rules, NULL, dt__bw_erf, DT__WR | DT__F0, dt__kernel_erf,         \
    NULL)                                                                                                \
  X(ADD_SCALAR, "add_scalar", 1, 1, "scalar:f", dt__add_scalar_rules, NULL, dt__bw_add_scalar, DT__WR,   \
    dt__kernel_add_scalar, NULL)                                                                         \
  X(MUL_SCALAR, "mul_scalar", 1, 1, "scalar:f", dt__mul_scalar_rules, NULL, dt__bw_mul_scalar, DT__WR,   \
    dt__kernel_mul_scalar, NULL)                                                                         \
  X(POW, "pow", 1, 1, "exponent:f", dt__pow_rules, NULL, dt__bw_pow, DT__WR, dt__kernel_pow, NULL)       \
  X(WHERE, "where", 3, 1, "", dt__where_rules, NULL, dt__bw_where, DT__WR | DT__P12,                     \
    dt__kernel_where, NULL)                                                                              \
  X(MASKED_FILL, "masked_fill", 2, 1, "value:f", dt__masked_fill_rules, NULL, dt__bw_masked_fill,        \
    DT__WR, dt__kernel_masked_fill, NULL)                                                                \
  X(CAST, "cast", 1, 1, "dtype:d", dt__cast_rules, NULL, dt__bw_cast, DT__WRA | DT_OPF_CHECKS_DATA, dt__kernel_cast, NULL) \
  X(DROPOUT, "dropout", 1, 1, "p:f, seed", dt__dropout_rules, NULL, dt__bw_dropout, DT__WR,              \
    dt__kernel_dropout, NULL)                                                                            \
  /* reductions */                                                                                       \
  X(SUM, "sum", 1, 1, "keepdim=0, dim:l", dt__sum_rules, NULL, dt__bw_sum, DT__W, dt__kernel_sum, NULL)  \
  X(MEAN, "mean", 1, 1, "keepdim=0, dim:l", dt__mean_rules, NULL, dt__bw_mean, DT__W, dt__kernel_mean,   \
    NULL)                                                                                                \
  X(AMAX, "amax", 1, 1, "keepdim=0, dim:l", dt__amax_rules, NULL, dt__bw_amax, DT__W, dt__kernel_amax,   \
    NULL)                                                                                                \
  X(AMIN, "amin", 1, 1, "keepdim=0, dim:l", dt__amin_rules, NULL, dt__bw_amin, DT__W, dt__kernel_amin,   \
    NULL)                                                                                                \
  X(ARGMAX, "argmax", 1, 1, "keepdim=0, dim:l", dt__argmax_rules, NULL, dt__bw_none, DT__W,              \
    dt__kernel_argmax, NULL)                                                                             \
  X(ARGMIN, "argmin", 1, 1, "keepdim=0, dim:l", dt__argmin_rules, NULL, dt__bw_none, DT__W,              \
    dt__kernel_argmin, NULL)                                                                             \
  X(LOGSUMEXP, "logsumexp", 1, 1, "keepdim=0, dim:l", dt__logsumexp_rules, NULL, dt__bw_logsumexp,       \
    DT__W | DT_OPF_PROMOTES_IN(0) | DT_OPF_INT_TO_FLOAT, dt__kernel_logsumexp, NULL)                     \
  X(VAR, "var", 1, 1, "correction:f=1, keepdim=0, dim:l", dt__var_rules, NULL, dt__bw_var, DT__W,        \
    dt__kernel_var, NULL)                                                                                \
  X(STD, "std", 1, 1, "correction:f=1, keepdim=0, dim:l", dt__std_rules, NULL, dt__bw_std, DT__W,        \
    dt__kernel_std, NULL)                                                                                \
  X(PROD, "prod", 1, 1, "keepdim=0, dim:l", dt__prod_rules, NULL, dt__bw_prod, DT__W, dt__kernel_prod,   \
    NULL)                                                                                                \
  /* nn */                                                                                               \
  X(SOFTMAX, "softmax", 1, 1, "dim", dt__softmax_rules, NULL, dt__bw_softmax, DT__W,                     \
    dt__kernel_softmax, NULL)                                                                            \
  X(LOG_SOFTMAX, "log_softmax", 1, 1, "dim", dt__softmax_rules, NULL, dt__bw_log_softmax, DT__W,         \
    dt__kernel_log_softmax, NULL)                                                                        \
  X(RMS_NORM, "rms_norm", 2, 1, "eps:f=1e-6", dt__norm_rules, NULL, dt__bw_rms_norm, DT__W,              \
    dt__kernel_rms_norm, NULL)                                                                           \
  X(LAYER_NORM, "layer_norm", 3, 1, "eps:f=1e-5", dt__norm_rules, NULL, dt__bw_layer_norm, DT__W,        \
    dt__kernel_layer_norm, NULL)                                                                         \
  X(EMBEDDING, "embedding", 2, 1, "", dt__embedding_rules, NULL, dt__bw_embedding, DT__WC,               \
    dt__kernel_embedding, NULL)                                                                          \
  X(GATHER_DIM, "gather_dim", 2, 1, "", dt__gather_dim_rules, NULL, dt__bw_gather_dim, DT__WC,           \
    dt__kernel_gather_dim, NULL)                                                                         \
  X(SDPA, "sdpa", 3, 1, "causal=0, layout=0, scale:f?", dt__sdpa_rules, dt__sdpa_check, dt__bw_sdpa,     \
    DT__W, dt__kernel_sdpa, NULL)                                                                        \
  X(ROTARY, "rotary", 1, 1, "seq_dim=1, inverse=0, cp=0, theta:f=10000", dt__rotary_rules, NULL,               \
    dt__bw_rotary, DT__WR, dt__kernel_rotary, NULL)                                                      \
  /* shape (views alias storage where they can; see tensor.h) */                                         \
  X(VIEW, "view", 1, 1, "shape:l", dt__reshape_rules, dt__view_check, dt__bw_view, DT__VIEW,             \
    dt__kernel_view, NULL)                                                                               \
  X(RESHAPE, "reshape", 1, 1, "shape:l", dt__reshape_rules, dt__view_check, dt__bw_view, DT__VIEW,       \
    dt__kernel_view, NULL)                                                                               \
  X(FLATTEN, "flatten", 1, 1, "start_dim=0, end_dim=-1", dt__flatten_rules, dt__view_check,              \
    dt__bw_view, DT__VIEW, dt__kernel_view, NULL)                                                        \
  X(UNFLATTEN, "unflatten", 1, 1, "dim, sizes:l", dt__unflatten_rules, dt__view_check, dt__bw_view,      \
    DT__VIEW, dt__kernel_view, NULL)                                                                     \
  X(SQUEEZE, "squeeze", 1, 1, "dim?", dt__squeeze_rules, dt__view_check, dt__bw_view, DT__VIEW,          \
    dt__kernel_view, NULL)                                                                               \
  X(UNSQUEEZE, "unsqueeze", 1, 1, "dim", dt__unsqueeze_rules, dt__view_check, dt__bw_view, DT__VIEW,     \
    dt__kernel_view, NULL)                                                                               \
  X(PERMUTE, "permute", 1, 1, "dims:l", dt__permute_rules, NULL, dt__bw_permute, DT__WRA,                \
    dt__kernel_permute, NULL)                                                                            \
  X(TRANSPOSE, "transpose", 1, 1, "dim0, dim1", dt__transpose_rules, NULL, dt__bw_transpose, DT__WRA,    \
    dt__kernel_transpose, NULL)                                                                          \
  X(T, "t", 1, 1, "", dt__t_rules, NULL, dt__bw_t, DT__WRA, dt__kernel_t, NULL)                          \
  X(SLICE, "slice", 1, 1, "dim, start, end, step=1", dt__slice_rules, NULL, dt__bw_slice, DT__CUT,       \
    dt__kernel_slice, NULL)                                                                              \
  X(NARROW, "narrow", 1, 1, "dim, start, length", dt__narrow_rules, NULL, dt__bw_slice, DT__CUT,         \
    dt__kernel_narrow, NULL)                                                                             \
  X(CAT, "cat", DT_OP_MAX_INPUTS, 1, "dim", dt__cat_rules, NULL, dt__bw_cat,                             \
    DT__WRA | DT_OPF_VARIADIC | DT_OPF_PROMOTES_MASK, dt__kernel_cat, NULL)                              \
  X(STACK, "stack", DT_OP_MAX_INPUTS, 1, "dim=0", dt__stack_rules, NULL, dt__bw_stack,                   \
    DT__WRA | DT_OPF_VARIADIC | DT_OPF_PROMOTES_MASK, dt__kernel_stack, NULL)                            \
  X(EXPAND, "expand", 1, 1, "shape:l", dt__expand_rules, NULL, dt__bw_expand, DT__WRA,              \
    dt__kernel_expand, NULL)                                                                             \
  X(TRIL, "tril", 1, 1, "diagonal=0", dt__tril_rules, NULL, dt__bw_tril, DT__WRA, dt__kernel_tril,     \
    NULL)                                                                                                \
  X(TRIU, "triu", 1, 1, "diagonal=0", dt__tril_rules, NULL, dt__bw_tril, DT__WRA, dt__kernel_triu,     \
    NULL)                                                                                                \
  X(CUMSUM, "cumsum", 1, 1, "dim, reverse=0", dt__cumsum_rules, NULL, dt__bw_cumsum, DT__WR,             \
    dt__kernel_cumsum, NULL)                                                                             \
  /* indexing and routing */                                                                             \
  X(TOPK, "topk", 1, 2, "k, dim, largest=1", dt__topk_rules, NULL, dt__bw_topk, DT__W, dt__kernel_topk,  \
    NULL)                                                                                                \
  X(GATHER, "gather", 2, 1, "dim", dt__gather_rules, NULL, dt__bw_gather, DT__WC, dt__kernel_gather,     \
    NULL)                                                                                                \
  X(SCATTER_ADD, "scatter_add", 3, 1, "dim", dt__scatter_add_rules, NULL, dt__bw_scatter_add, DT__WC,    \
    dt__kernel_scatter_add, NULL)                                                                        \
  X(MOE_ROUTE, "moe_route", 1, 3, "experts, capacity=0", dt__moe_route_rules, NULL, NULL, DT__WNC,       \
    dt__kernel_moe_route, NULL)                                                                          \
  X(INDEX_ADD, "index_add", 3, 1, "", dt__index_add_rules, NULL, dt__bw_index_add, DT__WC,               \
    dt__kernel_index_add, NULL)                                                                          \
  X(INDEX_SELECT, "index_select", 2, 1, "dim", dt__index_select_rules, NULL, dt__bw_index_select,       \
    DT__WC | DT_OPF_ANY_DTYPE, dt__kernel_index_select, NULL)                                            \
  /* fused gradient ops (what backward rules run) */                                                     \
  X(ACT_GRAD, "act_grad", 2, 1, "kind, lo:f?, hi:f?", dt__act_grad_rules, NULL, NULL, DT__WN,         \
    dt__kernel_act_grad, NULL)                                                                           \
  X(RMS_NORM_GRAD, "rms_norm_grad", 3, 2, "eps:f=1e-6", dt__norm_grad_rules, NULL, NULL, DT__WN,         \
    dt__kernel_rms_norm_grad, NULL)                                                                      \
  X(LAYER_NORM_GRAD, "layer_norm_grad", 3, 2, "eps:f=1e-5", dt__norm_grad_rules, NULL, NULL, DT__WN,     \
    dt__kernel_layer_norm_grad, NULL)                                                                    \
  X(EMBEDDING_GRAD, "embedding_grad", 2, 1, "vocab", dt__embedding_grad_rules, NULL, NULL, DT__WNC,      \
    dt__kernel_embedding_grad, NULL)                                                                     \
  X(SDPA_GRAD, "sdpa_grad", 4, 3, "causal=0, layout=0, scale:f?", dt__sdpa_grad_rules, dt__sdpa_check,   \
    NULL, DT__WN, dt__kernel_sdpa_grad, NULL)                                                            \
  X(GROUPED_MM_WGRAD, "grouped_mm_wgrad", 3, 1, "", dt__grouped_mm_wgrad_rules, NULL, NULL, DT__WNC,     \
    dt__kernel_grouped_mm_wgrad, NULL)                                                                   \
  /* in-place updates (the optimizer, gradient clipping) */                                              \
  X(ADAMW, "adamw", 5, 0, "lr:f, beta1:f=0.9, beta2:f=0.999, eps:f=1e-8, weight_decay:f=0",            \
    dt__adamw_rules, NULL, NULL,                                                                         \
    DT__I | DT_OPF_WRITES_IN(0) | DT_OPF_WRITES_IN(2) | DT_OPF_WRITES_IN(3) | DT_OPF_WRITES_IN(4),       \
    dt__kernel_adamw, NULL)                                                                              \
  X(SCALE_, "scale_", 1, 0, "alpha:f", dt__scale_rules, NULL, NULL, DT__I | DT_OPF_WRITES_IN(0),         \
    dt__kernel_scale_, NULL)                                                                             \
  X(SUMSQ, "sumsq", 1, 1, "", dt__sumsq_rules, NULL, NULL, DT__WN, dt__kernel_sumsq, NULL)                \
  /* composites: forward built from other ops */                                                         \
  X(CROSS_ENTROPY, "cross_entropy", 2, 1, "reduction=1, ignore_index?, label_smoothing:f=0",         \
    NULL, NULL, dt__bw_cross_entropy, 0, NULL,                                                           \
    dt__cross_entropy_fwd)                                                                               \
  X(REDISTRIBUTE, "redistribute", 1, 1, "placements:p", NULL, NULL, dt__bw_redistribute, 0, NULL,        \
    dt__redistribute_fwd)                                                                            \
  /* rank-local tensors (src/ops/local.c): leaving and re-entering the distributed world */             \
  X(TO_LOCAL, "to_local", 1, 1, "grad:p?", NULL, NULL, dt__bw_to_local, 0, NULL, dt__to_local_fwd)      \
  X(FROM_LOCAL, "from_local", 2, 1, "", NULL, NULL, dt__bw_from_local, DT_OPF_MESHES, NULL,               \
    dt__from_local_fwd)                                                                                  \
  X(ALL_TO_ALL_SINGLE, "all_to_all_single", 2, 1, "mesh_dim=0", NULL, NULL, dt__bw_all_to_all_single,   \
    0, NULL, dt__all_to_all_single_fwd)                                                                  \
  /* context parallelism (src/ops/ring_attention.c): attention, the sequence sharded on a mesh dim */   \
  X(RING_ATTENTION, "ring_attention", 3, 1, "mesh_dim, causal=0, layout=0, balanced=1, algo=0, "         \
    "scale:f?", NULL, NULL, dt__bw_ring_attention, 0, NULL, dt__ring_attention_fwd)                  \
  /* asynchronous tensor parallelism (src/ops/tp_overlap.c): a linear and its collective, overlapped */ \
  X(ALL_GATHER_LINEAR, "all_gather_linear", 2, 2, "mesh_dim, gather_dim=1", NULL, NULL,                 \
    dt__bw_all_gather_linear, 0, NULL, dt__all_gather_linear_fwd)                                      \
  X(LINEAR_REDUCE_SCATTER, "linear_reduce_scatter", 2, 1, "mesh_dim, scatter_dim=1", NULL, NULL,        \
    dt__bw_linear_reduce_scatter, 0, NULL, dt__linear_reduce_scatter_fwd)
/* clang-format on */

#endif

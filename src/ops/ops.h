/* ops.h - internal interface of the ops layer: the built-in CPU kernels. */
#ifndef DT_OPS_OPS_H
#define DT_OPS_OPS_H

#include "dtensor/ops.h"
#include "strategy/strategy.h"
#include "tensor/tensor.h"

#define DT__KERNEL(name)                                                      \
  dt_status_t name(const dt_op_call_t* call, const dt_local_tensor_t* in,     \
                   dt_local_tensor_t* out)
DT__KERNEL(dt__kernel_mm);
DT__KERNEL(dt__kernel_bmm);
DT__KERNEL(dt__kernel_mm_t);
DT__KERNEL(dt__kernel_add);
DT__KERNEL(dt__kernel_sub);
DT__KERNEL(dt__kernel_mul);
DT__KERNEL(dt__kernel_div);
DT__KERNEL(dt__kernel_maximum);
DT__KERNEL(dt__kernel_minimum);
DT__KERNEL(dt__kernel_eq);
DT__KERNEL(dt__kernel_ge);
DT__KERNEL(dt__kernel_gt);
DT__KERNEL(dt__kernel_neg);
DT__KERNEL(dt__kernel_relu);
DT__KERNEL(dt__kernel_exp);
DT__KERNEL(dt__kernel_log);
DT__KERNEL(dt__kernel_sqrt);
DT__KERNEL(dt__kernel_rsqrt);
DT__KERNEL(dt__kernel_gelu);
DT__KERNEL(dt__kernel_sigmoid);
DT__KERNEL(dt__kernel_silu);
DT__KERNEL(dt__kernel_tanh);
DT__KERNEL(dt__kernel_sum);
DT__KERNEL(dt__kernel_mean);
DT__KERNEL(dt__kernel_amax);
DT__KERNEL(dt__kernel_amin);
DT__KERNEL(dt__kernel_softmax);
DT__KERNEL(dt__kernel_log_softmax);
DT__KERNEL(dt__kernel_permute);
DT__KERNEL(dt__kernel_rms_norm);
DT__KERNEL(dt__kernel_layer_norm);
DT__KERNEL(dt__kernel_embedding);
DT__KERNEL(dt__kernel_gather_dim);
DT__KERNEL(dt__kernel_linear);
/* kernels_shape.c */
DT__KERNEL(dt__kernel_view);
DT__KERNEL(dt__kernel_slice);
DT__KERNEL(dt__kernel_cat);
/* kernels_nn.c */
DT__KERNEL(dt__kernel_addmm);
DT__KERNEL(dt__kernel_scalar);
DT__KERNEL(dt__kernel_cast);
DT__KERNEL(dt__kernel_where);
DT__KERNEL(dt__kernel_sdpa);
DT__KERNEL(dt__kernel_rotary);
DT__KERNEL(dt__kernel_topk);
DT__KERNEL(dt__kernel_gather);
DT__KERNEL(dt__kernel_scatter_add);
DT__KERNEL(dt__kernel_dropout);
/* kernels_grad.c */
DT__KERNEL(dt__kernel_act_grad);
DT__KERNEL(dt__kernel_rms_norm_grad);
DT__KERNEL(dt__kernel_layer_norm_grad);
DT__KERNEL(dt__kernel_embedding_grad);
DT__KERNEL(dt__kernel_sdpa_grad);
#undef DT__KERNEL

/* Cross-entropy of logits (N, C) against targets (N) (src/ops/loss.c); *lse_out (may be NULL)
 * gets the row logsumexp (N, 1) that the backward pass reuses. */
dt_status_t dt__cross_entropy(dt_tensor_t logits, dt_tensor_t targets,
                              dt_loss_reduction_t reduction, dt_tensor_t* loss,
                              dt_tensor_t* lse_out);

/* Row-wise softmax of attention scores p (S, T) in place; with `causal`, query row i (global
 * position q0 + i) sees keys 0 .. q0 + i and the rest become 0. Shared by sdpa and sdpa_grad. */
void dt__attn_softmax_rows(float* p, int64_t S, int64_t T, int64_t q0, int causal);
/* Attention operand geometry for layout 0 (B, H, S, D) or 1 (B, S, H, D): heads, sequence length,
 * feature size; and the offset of the (b, h) matrix (its row stride is feat, or heads * feat). */
void dt__attn_geom(const dt_local_tensor_t* t, int layout, int64_t* heads, int64_t* seq,
                   int64_t* feat);
int64_t dt__attn_base(int layout, int64_t b, int64_t h, int64_t heads, int64_t seq, int64_t feat);

#endif

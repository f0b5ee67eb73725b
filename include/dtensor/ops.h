/* dtensor/ops.h - running ops on distributed tensors.
 *
 * dt_op_run selects the op's cheapest strategy for the inputs' current placements (cached by
 * every input's shape, dtype and placements and every argument), redistributes the inputs that
 * need it, runs the local kernel on the shards and returns a new tensor with the strategy's
 * output placements. Partial placements pass through an op only where it is linear in that input
 * for that reduce op (see dtensor/strategy.h); everything else is reduced first. Collective over
 * the mesh. This version computes in f32 on the CPU (OpenBLAS for matmuls).
 */
#ifndef DTENSOR_OPS_H
#define DTENSOR_OPS_H

#include "dtensor/strategy.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs op `name` (as registered; built-ins: mm, bmm, add, sub, mul, div, maximum, minimum, neg,
 * relu, exp, log, sqrt, rsqrt, gelu, silu, sigmoid, tanh, mul_scalar (fargs [s]), and the
 * reductions sum, mean, amax, amin with iargs [keepdim, dim...], softmax and log_softmax with
 * iargs [dim], permute (iargs: the permutation), transpose (iargs [d0, d1]), t, rms_norm (x, w)
 * and layer_norm (x, w, b) over the last dim with fargs [eps], embedding (weight (V, D), i32/i64
 * indices; a vocabulary-sharded table gives a Partial(sum) by masked lookup), gather_dim, linear
 * (x, weight (O, K), bias) and linear_nobias) on n_inputs tensors
 * of one mesh.
 * iargs/fargs are the op's integer and scalar arguments (may be NULL when their count is 0).
 * Errors: DT_ERR_UNSUPPORTED "no sharding strategy for OP" for an unknown op or an op without a
 * kernel; DT_ERR_INVALID_ARG for shape/dtype mismatches (with the op's message). */
DT_API dt_status_t dt_op_run(const char* name, int n_inputs, const dt_tensor_t* inputs,
                             int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                             dt_tensor_t* out);

DT_API dt_status_t dt_mm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out);  /* (m,k) x (k,n) */
DT_API dt_status_t dt_bmm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out); /* (b,m,k) x (b,k,n) */
DT_API dt_status_t dt_add(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out); /* broadcasting */
DT_API dt_status_t dt_sub(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out);
DT_API dt_status_t dt_mul(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out);
DT_API dt_status_t dt_div(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out);
/* x (N, K), weight (O, K) as in PyTorch, bias (O) or NULL: out = x weight^T + bias. */
DT_API dt_status_t dt_linear(dt_tensor_t x, dt_tensor_t weight, dt_tensor_t bias,
                             dt_tensor_t* out);
DT_API dt_status_t dt_neg(dt_tensor_t a, dt_tensor_t* out);
DT_API dt_status_t dt_relu(dt_tensor_t a, dt_tensor_t* out);

typedef enum dt_loss_reduction {
  DT_LOSS_NONE = 0, /* per-row losses, shape (N) */
  DT_LOSS_MEAN = 1, /* scalar */
  DT_LOSS_SUM = 2,  /* scalar */
  DT_LOSS_REDUCTION_COUNT
} dt_loss_reduction_t;

/* Cross-entropy of logits (N, C) against class indices (N) (i32/i64), as in PyTorch with
 * log-softmax over C. Loss parallel: with logits sharded on C, only per-row max, sum of
 * exponentials and target logit are reduced across ranks; the logits are never gathered. The
 * result may be Partial (e.g. Partial(sum) per-row losses): redistribute it to R to read it.
 * Built from the public ops (amax, sub, exp, sum, log, gather_dim, mean). Collective. */
DT_API dt_status_t dt_cross_entropy(dt_tensor_t logits, dt_tensor_t targets,
                                    dt_loss_reduction_t reduction, dt_tensor_t* out);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_OPS_H */

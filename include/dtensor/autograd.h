/* dtensor/autograd.h - reverse-mode automatic differentiation over distributed-tensor ops.
 *
 * A tape records op applications as they run (dt_ag_op) on variables: a variable holds a
 * distributed tensor (its value) and, after dt_tape_backward, its gradient. Leaves (parameters,
 * inputs) are created by the user with dt_var_leaf and live until dt_var_destroy; every other
 * variable belongs to the tape and lives until dt_tape_reset, which frees the recorded graph and
 * every intermediate value (the leaves and their accumulated gradients stay).
 *
 * Backward computations are ops too: they go through the same strategy selection, redistribution
 * and kernels as the forward. A leaf's gradient is stored with the leaf's placements (a Partial
 * gradient of a replicated parameter is all-reduced; of a Shard(0) parameter reduce-scattered),
 * so an optimizer can work on local shards. Gradients accumulate across backward passes until
 * dt_var_zero_grad (micro-batches). The gradient of a redistribution maps back to the source
 * placements, a source Partial becoming Replicate (PyTorch's rule).
 *
 * With grad mode off (dt_grad_set_enabled(0)) dt_ag_op runs the op and records nothing.
 * Every op of the registry that has a backward rule can be recorded; dt_ag_op on an op without
 * one fails with DT_ERR_UNSUPPORTED when an input requires a gradient.
 */
#ifndef DTENSOR_AUTOGRAD_H
#define DTENSOR_AUTOGRAD_H

#include "dtensor/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tape* dt_tape_t;
typedef struct dt_var* dt_var_t;

DT_API dt_status_t dt_tape_create(dt_tape_t* out);
/* Frees the recorded graph and the tape-owned variables; leaves and their gradients stay. */
DT_API dt_status_t dt_tape_reset(dt_tape_t tape);
DT_API dt_status_t dt_tape_destroy(dt_tape_t tape);
/* Number of recorded op applications and bytes of intermediate values the tape holds. */
DT_API dt_status_t dt_tape_stats(dt_tape_t tape, int64_t* n_nodes, int64_t* nbytes);

/* A leaf variable over `value` (the variable takes ownership of the tensor). */
DT_API dt_status_t dt_var_leaf(dt_tensor_t value, int requires_grad, dt_var_t* out);
/* A tape-owned variable that needs no gradient, over `value` (ownership passes to the tape):
 * inputs such as token ids that must live until the backward pass. */
DT_API dt_status_t dt_tape_constant(dt_tape_t tape, dt_tensor_t value, dt_var_t* out);
/* Destroys a leaf (its value and gradient). Tape-owned variables are freed by dt_tape_reset. */
DT_API dt_status_t dt_var_destroy(dt_var_t v);
/* Borrowed: the value, and the gradient (NULL until a backward pass reached the variable). */
DT_API dt_tensor_t dt_var_value(dt_var_t v);
DT_API dt_tensor_t dt_var_grad(dt_var_t v);
DT_API dt_status_t dt_var_zero_grad(dt_var_t v);
/* Replaces a leaf's value (same shape, dtype and placements: an optimizer step). */
DT_API dt_status_t dt_var_set_value(dt_var_t v, dt_tensor_t value);

/* Thread-wide grad mode (default on). */
DT_API void dt_grad_set_enabled(int enabled);
DT_API int dt_grad_enabled(void);

/* Runs op `name` on the inputs' values (as dt_op_run_multi) and records it on the tape when grad
 * mode is on and an input requires a gradient. Outputs are tape-owned variables. */
DT_API dt_status_t dt_ag_op(dt_tape_t tape, const char* name, int n_inputs, const dt_var_t* inputs,
                            int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                            int n_outputs, dt_var_t* outs);
/* Redistribution as a recorded op (its gradient flows back to the source placements). */
DT_API dt_status_t dt_ag_redistribute(dt_tape_t tape, dt_var_t x, const dt_placement_t* dst,
                                      dt_var_t* out);
/* Cross-entropy (mean over rows) of logits (N, C) against i32/i64 targets (N); logits may be
 * class-sharded (loss parallel). Recorded as one node with a fused backward
 * (softmax - onehot) / N that never gathers the logits either. */
DT_API dt_status_t dt_ag_cross_entropy(dt_tape_t tape, dt_var_t logits, dt_var_t targets,
                                       dt_var_t* out);

/* Backward from a scalar (0-dim) variable: seeds d loss = 1 and accumulates gradients into every
 * variable that requires one. The graph stays recorded (release it with dt_tape_reset);
 * gradients of intermediates do not outlive the pass, so a second backward on the same tape
 * propagates only from its own loss. */
DT_API dt_status_t dt_tape_backward(dt_tape_t tape, dt_var_t loss);

/* ---- selective activation checkpointing ----
 * A policy says, per op, whether its outputs are saved for the backward pass (1) or dropped and
 * recomputed from the op's inputs when the backward pass needs them (0). dt_tape_checkpoint drops
 * the values of recorded outputs whose op the policy recomputes, except the `keep` variables
 * (call it at block boundaries, keeping the block output); the backward pass recomputes them
 * on demand, bit for bit. The default policy saves matmul outputs (mm, bmm, addmm, linear and
 * linear_nobias alike) and every op that is not cheap, and recomputes pointwise ops and views. */
typedef int (*dt_ckpt_policy_fn)(const char* op, void* ctx);
DT_API int dt_ckpt_policy_default(const char* op, void* ctx);
/* Policy for this tape (NULL: save everything, the default). */
DT_API dt_status_t dt_tape_set_checkpoint(dt_tape_t tape, dt_ckpt_policy_fn policy, void* ctx);
DT_API dt_status_t dt_tape_checkpoint(dt_tape_t tape, int n_keep, const dt_var_t* keep);
/* Bytes (this rank) freed by checkpointing since the last reset, and ops recomputed. */
DT_API dt_status_t dt_tape_checkpoint_stats(dt_tape_t tape, int64_t* saved_nbytes,
                                            int64_t* recomputed);

/* Whether op `name` has a backward rule. */
DT_API int dt_ag_has_backward(const char* name);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_AUTOGRAD_H */

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
 * placements, a source Partial becoming Replicate unless the gradient holds that same Partial on
 * that mesh dim (then it stays: P -> P is a no-op both ways) (PyTorch's rule).
 *
 * With grad mode off (dt_grad_set_enabled(0)) dt_ag_op runs the op and records nothing.
 * Every op of the registry that has a backward rule can be recorded; dt_ag_op on an op without
 * one fails with DT_ERR_UNSUPPORTED when an input requires a gradient.
 *
 * Control for code built on top (data parallelism, sharded parameters, overlap):
 *  - a leaf can keep its gradient as it comes (DT_GRAD_AS_IS: e.g. Partial, accumulated that way
 *    across passes) and reduce it later (dt_var_reduce_grad), and can have a hook called as soon
 *    as a backward pass has finished its gradient (dt_var_set_grad_hook);
 *  - hooks around a span of recorded nodes fire when the backward pass enters and leaves it
 *    (dt_tape_add_span_hooks; the modules of dtensor/module.h use them);
 *  - any recorded variable can be freed now and recomputed by rerunning the op that produced it
 *    when it is needed again (dt_tape_drop, dt_tape_restore): a parameter gathered for the
 *    forward is freed after it and gathered again in the backward.
 * Hooks run with grad mode off, may run ops and collectives (every rank reaches them in the same
 * order, the graph being the same), and a hook's failure stops the pass with its status.
 */
#ifndef DTENSOR_AUTOGRAD_H
#define DTENSOR_AUTOGRAD_H

#include "dtensor/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tape* dt_tape_t;
typedef struct dt_var* dt_var_t;

/* A new, empty tape. A tape keeps what it records until dt_tape_reset: a training loop resets it
 * after each backward pass. One that grows past DTENSOR_TAPE_WARN_NODES recorded nodes (default
 * 1000000) or DTENSOR_TAPE_WARN_MB MiB of intermediate values (default 65536) says so once, on
 * stderr ("[dtensor tape] warning: ...", rank 0), naming the threshold it passed; the variables
 * are read when the tape is created (non-negative integers; 0 turns that check off). */
DT_API dt_status_t dt_tape_create(dt_tape_t* out);
/* Frees the recorded graph and the tape-owned variables; leaves and their gradients stay.
 * DT_ERR_INVALID_USAGE (nothing freed) while a backward pass runs on the tape (from a hook), as
 * for dt_tape_destroy. */
DT_API dt_status_t dt_tape_reset(dt_tape_t tape);
DT_API dt_status_t dt_tape_destroy(dt_tape_t tape);
/* Number of recorded op applications and bytes of intermediate values the tape holds. */
DT_API dt_status_t dt_tape_stats(dt_tape_t tape, int64_t* n_nodes, int64_t* nbytes);

/* A leaf variable over `value` (the variable takes ownership of the tensor). */
DT_API dt_status_t dt_var_leaf(dt_tensor_t value, int requires_grad, dt_var_t* out);
/* A tape-owned variable that needs no gradient, over `value` (ownership passes to the tape):
 * inputs such as token ids that must live until the backward pass. */
DT_API dt_status_t dt_tape_constant(dt_tape_t tape, dt_tensor_t value, dt_var_t* out);
/* Destroys a leaf (its value and gradient). Tape-owned variables are freed by dt_tape_reset. A
 * leaf recorded on a tape lives on (unreachable through its handle, which is dead at once) until
 * every tape that recorded it is reset or destroyed, so a backward pass stays valid. */
DT_API dt_status_t dt_var_destroy(dt_var_t v);
/* Borrowed: the value, and the gradient (NULL until a backward pass reached the variable). */
DT_API dt_tensor_t dt_var_value(dt_var_t v);
DT_API dt_tensor_t dt_var_grad(dt_var_t v);
DT_API dt_status_t dt_var_zero_grad(dt_var_t v);
/* Whether gradients flow to v; also the status check of a variable handle (DT_ERR_INVALID_USAGE
 * for a destroyed one). */
DT_API dt_status_t dt_var_requires_grad(dt_var_t v, int* requires_grad);
/* Whether v is a leaf (made by dt_var_leaf, destroyed by the user) rather than a tape's variable
 * (an op's result or a dt_tape_constant, freed by dt_tape_reset). */
DT_API dt_status_t dt_var_is_leaf(dt_var_t v, int* is_leaf);
/* Freezes (0) or unfreezes (1) a leaf, as PyTorch's requires_grad_(): ops recorded after the
 * call compute a gradient for it only while it is set; its current gradient stays (clear it with
 * dt_var_zero_grad). Change it between steps, not between a forward and its backward. The
 * wrappers follow: FSDP reads its sharded parameters' flags at every forward, DDP reduces a
 * parameter frozen at wrapping and trained later outside its buckets (correct, unbucketed), and
 * AdamW steps only parameters that have a gradient. DT_ERR_INVALID_ARG for a tape's variable
 * (an op's result or a dt_tape_constant). */
DT_API dt_status_t dt_var_set_requires_grad(dt_var_t v, int requires_grad);
/* Replaces a leaf's value (the variable takes ownership): same mesh, shape, dtype and placements
 * (DT_ERR_INVALID_ARG otherwise); passing the current value is a no-op. A meta tensor of that
 * layout releases the leaf's data while keeping its place on tapes (FSDP's reshard; ops on it
 * then compute layouts only, so restore a real value before the backward pass needs it). A tensor that already
 * belongs to a variable (any dt_var_value or dt_var_grad) is DT_ERR_INVALID_USAGE, as is
 * dt_tensor_destroy of one: destroy or update the variable instead. */
DT_API dt_status_t dt_var_set_value(dt_var_t v, dt_tensor_t value);

/* How a leaf keeps the gradients that arrive: DT_GRAD_TO_PLACEMENTS (the default) brings each to
 * the leaf's placements at once (a Partial gradient of a replicated parameter all-reduced, of a
 * sharded one reduce-scattered); DT_GRAD_AS_IS keeps it as the backward pass produced it and adds
 * later ones in whatever placements the add takes, across passes too (DDP's no_sync, bucketing,
 * FSDP's own reduce-scatter), until dt_var_reduce_grad. */
typedef enum dt_grad_mode { DT_GRAD_TO_PLACEMENTS = 0, DT_GRAD_AS_IS = 1 } dt_grad_mode_t;
DT_API dt_status_t dt_var_set_grad_mode(dt_var_t v, dt_grad_mode_t mode);
/* Brings a leaf's gradient to `placements` (one per mesh dim; NULL: the value's placements).
 * Collective over the mesh; no-op without a gradient. */
DT_API dt_status_t dt_var_reduce_grad(dt_var_t v, const dt_placement_t* placements);
/* Replaces a leaf's gradient (ownership passes to the variable; NULL clears it): same mesh,
 * shape and dtype as the value, any placements. With dt_var_grad and
 * dt_tensor_redistribute_async, a caller reduces gradients asynchronously. */
DT_API dt_status_t dt_var_set_grad(dt_var_t v, dt_tensor_t grad);
/* Called when a backward pass has finished a leaf's gradient for that pass: after the last node
 * (in backward order) that feeds it, whether or not later passes add more. fn NULL removes it. */
typedef dt_status_t (*dt_grad_hook_fn)(dt_var_t v, void* ctx);
DT_API dt_status_t dt_var_set_grad_hook(dt_var_t v, dt_grad_hook_fn fn, void* ctx);

/* Thread-wide grad mode (default on). */
DT_API void dt_grad_set_enabled(int enabled);
DT_API int dt_grad_enabled(void);

/* Runs op `name` on the inputs' values (as dt_op_run_multi) and records it on the tape when grad
 * mode is on and an input requires a gradient. Outputs are tape-owned variables; `outs` may be
 * the `inputs` array. */
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

/* ---- rank-local tensors and the ragged all-to-all (expert parallelism) ----
 * Some data has no global shape: the rows each rank sends to each expert depend on the routing.
 * Such values are rank-local tensors: ordinary tensors of the mesh whose placements are all
 * Replicate but whose value and shape belong to this rank alone (what a plain tensor is inside
 * torch's local_map). Every op runs on them locally, without communication (each op has an
 * all-Replicate rule that moves nothing, and selection prefers it), and they record on the tape
 * like any variable; redistributing or gathering one is meaningless (each rank would see its own
 * value as everyone's). Read one with dt_tensor_to_local. These three functions cross between
 * the two worlds and move rank-local rows: */
/* x's local shard as a rank-local tensor (a view, no copy). Backward: the rank-local gradient is
 * the local shard of a gradient with x's global shape and `grad_placements` (mesh ndim of them;
 * NULL: x's placements). Where x is Replicate on a mesh dim whose ranks computed with different
 * data (different tokens) pass Partial(sum) there: each rank's gradient is then a part. */
DT_API dt_status_t dt_ag_to_local(dt_tape_t tape, dt_var_t x, const dt_placement_t* grad_placements,
                                  dt_var_t* out);
/* The rank-local x as the local shard of a tensor with like's global shape and placements (a
 * view); x's shape must be exactly that shard (DT_ERR_INVALID_ARG, agreed over the mesh).
 * Backward: the gradient brought to like's placements (Replicate where like is Partial), its
 * local shard. like gets no gradient. */
DT_API dt_status_t dt_ag_from_local(dt_tape_t tape, dt_var_t x, dt_var_t like, dt_var_t* out);
/* The rank-local x as a rank-local tensor of `mesh`, another view of the same ranks (a view, no
 * copy; x itself when it is on mesh already). `like` of dt_ag_from_local may also live on such a
 * view: this is how tokens on the dense parameters' mesh reach the experts' mesh (expert
 * parallelism with FSDP over other ranks) and come back. Backward: the gradient goes back to x's
 * mesh. DT_ERR_INVALID_ARG when the meshes are not views of the same ranks on one backend. */
DT_API dt_status_t dt_ag_local_to_mesh(dt_tape_t tape, dt_var_t x, dt_mesh_t mesh, dt_var_t* out);
/* Ragged all-to-all of rows over mesh dim `mesh_dim` (n ranks): the rows of x's local shard
 * (its first dim), send_counts[j] of them in order to coordinate j; *out (rank-local) holds the
 * rows received, from coordinate 0 up. recv_counts NULL: the counts are exchanged first (n
 * integers to and from each peer, one more collective); given, they must equal what the peers
 * send (they are not checked: a mismatch is an MPI truncation error or a wait to the deadline).
 * Rows of different shapes or dtypes on the ranks of the mesh dim are DT_ERR_INVALID_ARG on every
 * rank (checked by one 16-byte all-reduce over the mesh dim, not counted as traffic).
 * Backward: the reverse exchange (the counts swapped, none exchanged). Collective over the mesh
 * dim (every rank of the mesh calls it). Counted under DT_COLL_ALL_TO_ALL on that mesh dim: the
 * bytes this rank sends to other ranks (its own block stays), and 8 (n - 1) for an exchange of
 * counts. The op is all_to_all_single (x, splits (n or 2n i64); iargs [mesh_dim]). */
DT_API dt_status_t dt_ag_all_to_all(dt_tape_t tape, dt_var_t x, int mesh_dim, int n,
                                    const int64_t* send_counts, const int64_t* recv_counts,
                                    dt_var_t* out);

/* Backward from a scalar (0-dim) variable: seeds d loss = 1 and accumulates gradients into every
 * variable that requires one. The graph stays recorded (release it with dt_tape_reset);
 * gradients of intermediates do not outlive the pass, so a second backward on the same tape
 * propagates only from its own loss. The loss is a leaf or a variable this tape recorded
 * (DT_ERR_INVALID_ARG for another tape's); DT_ERR_INVALID_USAGE for a pass started from a hook
 * of a pass running on the same tape. */
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

/* ---- hooks and per-variable recompute ---- */
typedef dt_status_t (*dt_tape_hook_fn)(dt_tape_t tape, void* ctx);
/* Hooks around the recorded nodes [first, end) (indices as dt_tape_stats's n_nodes before and
 * after recording them): during dt_tape_backward `pre` runs before the first of them the pass
 * runs (the last recorded one that receives a gradient), `post` once the pass has gone below
 * `first`. Where several spans start or end together, pre hooks run outer span first and post
 * hooks inner span first. Neither runs when no gradient reaches the span. Cleared by
 * dt_tape_reset. */
DT_API dt_status_t dt_tape_add_span_hooks(dt_tape_t tape, int64_t first, int64_t end,
                                          dt_tape_hook_fn pre, dt_tape_hook_fn post, void* ctx);
/* Frees the value of a variable recorded on this tape (the output of a recorded op) now; when the
 * backward pass, or a later op, needs it, the op that produced it runs again on its inputs (a
 * redistribution: the collective again). The result is bit for bit the same. */
DT_API dt_status_t dt_tape_drop(dt_tape_t tape, dt_var_t v);
/* Recomputes a dropped value now (e.g. ahead of need, from a pre-backward hook); no-op when it is
 * present. */
DT_API dt_status_t dt_tape_restore(dt_tape_t tape, dt_var_t v);

/* Whether op `name` has a backward rule. */
DT_API int dt_ag_has_backward(const char* name);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_AUTOGRAD_H */

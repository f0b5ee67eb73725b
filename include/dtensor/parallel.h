/* dtensor/parallel.h - parallel wrappers: FSDP / HSDP (sharded parameters, gradients and
 * optimizer state), DDP (replicated parameters, bucketed gradient all-reduce) and tensor
 * parallelism (sharded weights, with sequence and loss parallelism; see the TP section below).
 *
 * Both wrap a module (dtensor/module.h) in place through its hooks and are written only against
 * the public API (src/parallel includes nothing else), so a trainer can read exactly what they do.
 * Every call is collective over the mesh: every rank wraps the same modules in the same order.
 *
 * FSDP (dt_fully_shard), FSDP2-like:
 *  - each parameter of the wrapped module (not already in a group of its own) becomes
 *    Shard(0) on the shard mesh dim (uneven dim 0 by the chunk rule, padded inside the
 *    communication buffer); a parameter whose dim 0 has fewer entries than the shard ranks
 *    (stacked experts: E, or E / EP under expert parallelism) is split on its first dim with at
 *    least as many that tensor parallelism leaves whole instead (Shard(1) for experts, as
 *    torchtitan shards them), so that no rank holds a padded expert in place of its share; with
 *    a replicate dim as well (a 2-D mesh) it is HSDP;
 *  - one call = one group: the group's shards are views of one persistent flat buffer, which one
 *    all-gather sends as it is before the group's forward (cast first for a param_dtype other
 *    than the parameters'); the result is copied out into one unsharded buffer the gathered
 *    parameters view; after its backward the gradients are copied into one flat buffer and
 *    reduce-scattered with one collective (HSDP: then all-reduced over the replicas), and the
 *    shards' gradients are views of the result (added to gradients already there). A shard
 *    replaced with dt_var_set_value is copied into the buffer at the next gather. Wrap
 *    bottom-up: each block, then the root. A module whose parameters are all in its children's
 *    groups (or which has none, e.g. a root holding only blocks) still becomes a group, with no
 *    buffer and no collective of its own: it only schedules its children (its forward starts
 *    the first block's gather, its backward ends with every reduction finished), as in FSDP2;
 *  - between steps the module holds the sharded parameters (Shard(0) or as above; an optimizer,
 *    clipping and checkpoints work on them); during a group's forward it holds the gathered
 *    ones, views of the group's unsharded buffer: a view an op makes of one (dt_ag_to_local of
 *    the experts under expert parallelism) keeps that buffer alive, and valid, until the tape
 *    lets it go;
 *  - reshard_after_forward 1 frees the gathered parameters after the forward and gathers again
 *    before the backward (ZeRO-3), 0 keeps them until the group's backward is done (ZeRO-2), and
 *    k > 1 keeps a 1/k slice after the forward, so the backward gathers only within groups of k
 *    consecutive ranks of the shard dim (e.g. within a node);
 *  - mixed precision: parameters gathered and computed in param_dtype, gradients reduced in
 *    reduce_dtype, the group's floating outputs cast to output_dtype (dt_llama_forward's loss is
 *    f32 in any case: the cross-entropy of the logits upcast to f32); the optimizer updates the
 *    sharded parameters in their own dtype (f32: no extra master copy);
 *  - prefetch: in the forward the next group's all-gather starts (asynchronously) before the
 *    current group computes; in the backward the next group in backward order (the reverse of
 *    the order in which the groups' forwards finished) is gathered before the current one runs.
 *    Both orders are learned from the previous pass (groups without parameters are passed
 *    over: the next group with some is gathered); each is settable per group;
 *  - a group's reduce-scatter starts as soon as its gradients are complete and is finished when
 *    the next group's starts or the outermost group's backward ends (or by dt_fsdp_wait);
 *  - dt_fsdp_set_requires_gradient_sync(m, 0) skips the reduction (gradients accumulate
 *    unsharded) for micro-batches but the last;
 *  - a tied parameter (one variable held by several modules, dtensor/module.h) is one parameter
 *    of one group: a group takes it only when every holder is below the wrapped module, so it
 *    lands in the group of the lowest module holding every use (the root for an output
 *    projection tied to the embedding, as FSDP2 advises); that group's gather serves every use
 *    (the swap puts the gathered variable in every holder) and its one reduce-scatter takes the
 *    sum of the uses' gradients. A group of one holder alone leaves it to a group above.
 *
 * DDP (dt_data_parallel): parameters stay Replicate; gradients are kept as the backward pass
 * produces them (Partial) and all-reduced in buckets of about bucket_nbytes, each started
 * asynchronously as soon as its gradients are complete, all finished when the wrapped module's
 * backward ends (before the optimizer step). dt_ddp_set_requires_gradient_sync(m, 0) is no_sync.
 * A tied parameter is bucketed once, its gradient (the sum of its uses') all-reduced once.
 *
 * The loss the wrapped model computes must be the mean over the global batch (the batch sharded
 * on the data dims, as dt_llama_forward does): gradients are summed across ranks, not averaged.
 * Host memory backends only for now (DT_ERR_UNSUPPORTED otherwise).
 */
#ifndef DTENSOR_PARALLEL_H
#define DTENSOR_PARALLEL_H

#include "dtensor/module.h"
#include "dtensor/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* output_dtype value: leave the outputs as computed (the default; blocks hand their param_dtype
 * activations to the next block, the root may cast its outputs back to f32). With param_dtype
 * bf16 and the default, your own model's outputs, and a loss computed from them, are bf16: set
 * output_dtype DT_F32 on the root for an f32 loss, and read a loss with dt_tensor_item (any
 * dtype) rather than dt_tensor_gather_full into a float. */
#define DT_FSDP_KEEP_DTYPE DT_DTYPE_COUNT

typedef struct dt_fsdp_config {
  int shard_dim;             /* mesh dim the parameters are sharded over */
  int replicate_dim;         /* HSDP: mesh dim the shards are replicated over; -1: none */
  int reshard_after_forward; /* 1: ZeRO-3, 0: ZeRO-2, k > 1: keep a slice over k ranks */
  dt_dtype_t param_dtype;    /* all-gather and compute: DT_F32, DT_BF16 or DT_F16 */
  dt_dtype_t reduce_dtype;   /* gradient reduction */
  dt_dtype_t output_dtype;   /* the group's floating outputs, or DT_FSDP_KEEP_DTYPE */
  int prefetch_forward;      /* start the next group's all-gather before computing this one */
  int prefetch_backward;     /* the same in the backward pass */
  int shard_span;            /* 0 or 1: over shard_dim alone; s > 1: over the s mesh dims from
                              * shard_dim on, flattened (e.g. dp and cp: torchtitan's
                              * dp_shard_cp) */
} dt_fsdp_config_t;

/* The defaults over the data dims given: shard over mesh dim `shard_dim`, replicate over
 * `replicate_dim` (HSDP; -1: none, plain FSDP); reshard after forward, f32 parameters and
 * reduction, outputs kept, prefetch both ways. Every other mesh dim is left to the parameters'
 * own placements (tensor parallelism, applied first). FSDP x TP on a (tp, dp) mesh:
 * dt_fsdp_config_for(1, -1); HSDP on (replicate, shard): dt_fsdp_config_for(1, 0); HSDP x TP on
 * (tp, replicate, shard): dt_fsdp_config_for(2, 1); FSDP over dp x cp on (tp, dp, cp):
 * dt_fsdp_config_for(1, -1) with shard_span 2. dt_fully_shard checks the dims. */
DT_API dt_fsdp_config_t dt_fsdp_config_for(int shard_dim, int replicate_dim);
/* The defaults for a mesh whose every dim is a data dim: `mesh_ndim` 1 is FSDP over it, 2 is HSDP
 * (shard over dim 1, replicate over dim 0), i.e. dt_fsdp_config_for(mesh_ndim - 1, mesh_ndim -
 * 2). With a tensor-parallel dim in the mesh use dt_fsdp_config_for. */
DT_API dt_fsdp_config_t dt_fsdp_config_default(int mesh_ndim);

/* Makes the parameters of `m` not yet in an FSDP group one group (see above; a tied one only when
 * every holder is below m; none: a group that only schedules the groups below it); cfg NULL: dt_fsdp_config_default(mesh ndim). Every
 * parameter must live on `mesh`, be floating point and Replicate on the data dims (shard,
 * replicate). On the other mesh dims it may be sharded (tensor parallelism, applied first): FSDP
 * then shards and gathers each rank's tensor-parallel shard over the data dims only, e.g. a
 * colwise weight [Shard(0), Replicate] on a (tp, dp) mesh (dt_fsdp_config_for(1, -1)) becomes
 * [Shard(0), Shard(0)] (dp splits the tp shard: mesh-dim order), gathered back to [Shard(0),
 * Replicate] for the forward. A Shard(0) on a dim after the shard dim would not nest that way and
 * is refused; reshard k > 1 needs the other dims to be of size 1 (and one shard dim). With a
 * shard_span s > 1 the dims shard_dim .. shard_dim + s - 1 shard together: each parameter
 * Shard(0) on all of them (nested in mesh-dim order, N the product of their sizes); the group's
 * dims are registered with dt_mesh_flatten, so the planner runs each all-gather and
 * reduce-scatter as one collective over them (counted under flat_*) or dim by dim, whichever its
 * cost model prices lower. Parameters already Shard on the
 * shard dim (experts under expert parallelism over that dim, whose gradients are complete where
 * they are held) are left out of the group, as they are. Errors leave the module as it was:
 * DT_ERR_INVALID_ARG for a dim outside the mesh, a replicate dim among the shard dims, a
 * parameter on another mesh or not placed as above, a scalar (0-d) parameter (make it shape (1),
 * as FSDP2 asks), a reshard k that does not divide the shard dim, an integer dtype, an abstract
 * mesh; DT_ERR_INVALID_USAGE for a destroyed module, a rank outside the mesh, a module
 * already wrapped (FSDP or DDP) or inside a module wrapped before it (wrapped top-down: that
 * group holds its parameters; wrap bottom-up);
 * DT_ERR_UNSUPPORTED for a backend whose memory is not the host's, for parameters of
 * different dtypes (a group's shards share one buffer: wrap them in separate groups, as FSDP2
 * requires too) and for reshard k > 1 or shard_span > 1 on a mesh over part of the world (they
 * build a mesh, which is collective over every rank). A parameter keeps its requires_grad as
 * it was when wrapped (a frozen one stays frozen), and each forward follows the sharded
 * parameter's flag as it is then (dt_var_set_requires_grad on a dt_module_params entry between
 * steps freezes or unfreezes it; set it alike on every rank). The gradient reduce-scatter
 * carries only the parameters that require a gradient; a group with none reduces nothing. */
DT_API dt_status_t dt_fully_shard(dt_module_t m, dt_mesh_t mesh, const dt_fsdp_config_t* cfg);
/* Whether m is the module of an FSDP group. */
DT_API int dt_fsdp_is_group(dt_module_t m);
/* Turns gradient reduction of the group at m and of every group below it on or off. */
DT_API dt_status_t dt_fsdp_set_requires_gradient_sync(dt_module_t m, int sync);
/* Per-group prefetch switches (-1 leaves one as it is). */
DT_API dt_status_t dt_fsdp_set_prefetch(dt_module_t m, int forward, int backward);
/* Finishes every reduce-scatter in flight (the groups do it themselves at the end of the
 * outermost group's backward; needed only when the outermost module is not a group: wrapping
 * the root, even one without parameters of its own, makes it one). */
DT_API dt_status_t dt_fsdp_wait(void);

/* Traffic and memory of one group, for tests, benchmarks and logs. */
typedef struct dt_fsdp_group_info {
  int n_params;
  int64_t numel;           /* elements of the group's parameters (unpadded) */
  int64_t padded_numel;    /* shard dim size x per-rank flat segment: what one all-gather yields */
  int64_t shard_numel;     /* this rank's flat segment (padded) */
  int64_t unsharded_nbytes; /* the gathered parameters' buffer (param_dtype) */
  int shard_size, replicate_size, reshard_size;
  int64_t gathers;         /* all-gathers of the group so far */
  int64_t prefetched;      /* of them, started ahead of need (prefetch) */
  int64_t reductions;      /* reduce-scatters of the group so far */
} dt_fsdp_group_info_t;
DT_API dt_status_t dt_fsdp_group_info(dt_module_t m, dt_fsdp_group_info_t* out);

typedef struct dt_ddp_config {
  int mesh_dim;          /* the data dim; -1: every mesh dim (the parameters replicated on all) */
  int64_t bucket_nbytes; /* about this many gradient bytes per all-reduce; <= 0: 25 MiB */
} dt_ddp_config_t;

/* Wraps m for data parallelism (see above); cfg NULL: every mesh dim, 25 MiB buckets. Every
 * parameter must live on `mesh`, be floating point and Replicate on the data dims (another dim
 * may shard it: a bucket then holds local shards and is all-reduced over the data dims only),
 * and a tied one held only below m (DT_ERR_INVALID_ARG otherwise: wrap a module holding every
 * use).
 * The parameters that require a gradient are bucketed in reverse registration order, one dtype
 * per bucket, and put in DT_GRAD_AS_IS mode with a gradient hook (replacing any other). Run m's
 * forward once per backward pass; a parameter that gets no gradient in a pass counts as zeros in
 * its bucket and keeps no gradient. Errors leave m as it was: DT_ERR_INVALID_ARG for a NULL
 * argument, a dim outside the mesh (-1 is every dim), an abstract mesh, a parameter on another
 * mesh, not floating point or not Replicate on a data dim; DT_ERR_INVALID_USAGE for m, a module
 * below it or one above it already wrapped (DDP or FSDP), or no parameter requiring a gradient;
 * DT_ERR_UNSUPPORTED for a backend whose memory is not the host's. */
DT_API dt_status_t dt_data_parallel(dt_module_t m, dt_mesh_t mesh, const dt_ddp_config_t* cfg);
/* no_sync: sync 0 keeps gradients unreduced (Partial, accumulating across passes) until a pass
 * with 1 reduces the sum. m must be the wrapped module itself (DT_ERR_INVALID_ARG otherwise). */
DT_API dt_status_t dt_ddp_set_requires_gradient_sync(dt_module_t m, int sync);
/* Number of buckets of the DDP wrapper at m (m itself), and bucket i's parameter count and bytes
 * (this rank's: its parameters' local shards). Bucket 0 holds the last registered parameters.
 * Either output of dt_ddp_bucket_info may be NULL. */
DT_API dt_status_t dt_ddp_num_buckets(dt_module_t m, int* n);
DT_API dt_status_t dt_ddp_bucket_info(dt_module_t m, int i, int* n_params, int64_t* nbytes);

/* ---- tensor parallelism (dt_parallelize_module) --------------------------------------------
 * A plan maps module paths to styles, as PyTorch's parallelize_module. A module's path joins the
 * names from the wrapped module down with '.', as parameter names do ("layers.3.wq"; unnamed
 * modules add nothing and are not matched); patterns take '*' wildcards (dt_nn_name_match) and
 * "" names the wrapped module itself. Each module takes the first entry that matches it; every
 * entry must match at least one module.
 *
 * A style does two things to its module, both on the tp mesh dim only (other mesh dims keep
 * their placements, so TP composes with data-parallel dims):
 *  - places the module's own parameters (not its children's) on the tp dim:
 *      COLWISE             weights (out, in) Shard(0), 1-D parameters (bias) Shard(0);
 *      ROWWISE             weights Shard(1), 1-D parameters Replicate;
 *      EMBEDDING_ROWWISE   (V, D) tables Shard(0) (vocabulary; lookups give Partial sums);
 *      EMBEDDING_COLWISE   (V, D) tables Shard(1);
 *      SEQUENCE_PARALLEL, PREPARE   parameters stay Replicate;
 *    the sharded dim must be divisible by the tp size;
 *  - sets layout boundaries: input i (bit i of in_mask) is brought to in[i] before the forward
 *    and output i (bit i of out_mask) to out[i] after it, each by a recorded redistribution, so
 *    in the backward pass the gradient there is brought to the same placement (a Partial
 *    gradient reduced: all-reduce to Replicate, reduce-scatter to Shard). A boundary is
 *    recorded even when the value already has that placement: that is where the backward
 *    reduction happens. Placements may use negative shard dims (-1: last). Between boundaries
 *    dispatch chooses, so results never depend on the plan, only the communication does.
 * Defaults of the constructors (Megatron-LM): colwise leaves input and output as they are (the
 * output comes out Shard(-1)), rowwise brings its Partial output to Replicate (one all-reduce;
 * Shard(1) with sequence parallelism: one reduce-scatter), embedding rowwise likewise,
 * sequence_parallel brings input and output to Shard(seq_dim). Set in/out and the masks to
 * change them, e.g. an RMSNorm with .out[0] = Replicate hands the attention a gathered input and
 * reduces its input gradient once, where the colwise projections' Partial gradients meet.
 * Since every op takes distributed tensors there is no local-tensor output mode
 * (PyTorch's use_local_output): leave an output's bit clear to keep what dispatch produced.
 *
 * Tied parameters (dtensor/module.h): a style re-places a tied parameter for every module that
 * holds it, styled or not (no module keeps the replaced variable); two styled holders must agree
 * on its placement, else the plan is refused naming both modules and plan entries. For an output
 * projection tied to the embedding (V, D): embedding rowwise and colwise both give Shard(0), the
 * vocabulary (Megatron's vocabulary-parallel embedding and its tied output layer; PyTorch's
 * tensor-parallel Transformer test); embedding colwise (Shard(1)) with colwise is refused.
 *
 * Loss parallelism needs no style: leave the output projection colwise without an output
 * boundary and its class-sharded logits go straight into the cross-entropy (dt_ag_cross_entropy,
 * or dt_ag_op "cross_entropy" with any reduction), which never gathers them.
 *
 * Asynchronous TP (async_tp 1 on a colwise or rowwise style; off by default until measured
 * faster, docs/performance.md): under sequence parallelism the all-gather before a colwise linear
 * and the reduce-scatter after a rowwise one run as rings whose steps overlap the GEMM
 * (dt_all_gather_linear, dt_linear_reduce_scatter of dtensor/ops.h). A colwise module whose input
 * arrives sharded on a row dim over the tp dim (the sequence: give the norm before it no
 * Replicate output) computes through all_gather_linear; the colwise modules under one parent
 * that read the same input in one forward of the parent (q, k, v; w1, w3) gather it once, the
 * first one's ring gathering it while its GEMM runs, the others reading the gathered input (their
 * input gradients are reduce-scattered in the first one's backward ring). A rowwise module whose
 * output boundary shards a row dim computes through linear_reduce_scatter (the boundary then has
 * nothing left to do). Only modules whose one parameter is a 2-dim weight (no bias) run fused;
 * elsewhere, and for inputs or boundaries of other layouts, a module runs as without the switch.
 * The module's forward function is replaced (dt_module_set_forward) by one that calls the fused
 * op or, where it does not apply, the module's own. Results equal the synchronous plan's up to
 * the order of the sums; the traffic is the same collectives' bytes, counted as send_recv.
 *
 * Wrap before FSDP/DDP (those then shard or replicate over the other mesh dims). */
typedef enum dt_tp_kind {
  DT_TP_COLWISE = 1,
  DT_TP_ROWWISE = 2,
  DT_TP_EMBEDDING_ROWWISE = 3,
  DT_TP_EMBEDDING_COLWISE = 4,
  DT_TP_SEQUENCE_PARALLEL = 5,
  DT_TP_PREPARE = 6
} dt_tp_kind_t;

#define DT_TP_IO_MAX 4

typedef struct dt_tp_style {
  dt_tp_kind_t kind;
  unsigned in_mask, out_mask; /* bit i: in[i] / out[i] applies */
  dt_placement_t in[DT_TP_IO_MAX];
  dt_placement_t out[DT_TP_IO_MAX];
  int async_tp; /* asynchronous TP (colwise, rowwise; see below); 0 by default */
} dt_tp_style_t;

/* The styles with their defaults (above). */
DT_API dt_tp_style_t dt_tp_colwise(void);
DT_API dt_tp_style_t dt_tp_rowwise(void);
DT_API dt_tp_style_t dt_tp_embedding_rowwise(void);
DT_API dt_tp_style_t dt_tp_embedding_colwise(void);
DT_API dt_tp_style_t dt_tp_sequence_parallel(int seq_dim);
/* Layouts only: nothing set (set in/out and the masks). */
DT_API dt_tp_style_t dt_tp_prepare(void);

typedef struct dt_tp_plan_entry {
  const char* pattern;
  dt_tp_style_t style;
} dt_tp_plan_entry_t;

/* Applies `plan` to m's modules over mesh dim `tp_dim` (collective over the mesh). Every
 * parameter of a styled module must live on `mesh` and be Replicate on the tp dim. Errors leave
 * m as it was: DT_ERR_INVALID_ARG for a NULL or abstract mesh, a dim outside it, styles of two
 * holders of a tied parameter that place it differently, a pattern that
 * matches no module, an unknown kind, a mask bit beyond DT_TP_IO_MAX, a layout that is neither
 * Replicate nor Shard (boundaries reduce; Partial is what they reduce), a parameter on another mesh, not
 * Replicate on the tp dim, of a rank the style cannot shard (colwise and rowwise: 1-D or 2-D;
 * embeddings: 2-D) or whose sharded dim the tp size does not divide, a parameter style on a
 * module without parameters of its own; DT_ERR_INVALID_USAGE for a module already
 * parallelized or wrapped by FSDP or DDP. */
DT_API dt_status_t dt_parallelize_module(dt_module_t m, dt_mesh_t mesh, int tp_dim, int n,
                                         const dt_tp_plan_entry_t* plan);

/* The plan for the Llama model of dtensor/nn.h (Megatron-LM): wq, wk, wv, w1, w3 colwise; wo
 * and w2 rowwise; the embedding rowwise (vocabulary sharded); attn_norm and ffn_norm output
 * Replicate (the one place the attention's and the MLP's input gradients are reduced); the
 * output projection colwise, its logits gathered (Replicate) unless loss_parallel. With
 * sequence_parallel the residual stream stays Shard(1) (sequence) between blocks: norms run on
 * sequence shards and hand the attention and MLP an all-gathered input, wo, w2 and the
 * embedding reduce-scatter. sequence_parallel DT_TP_SP_ASYNC (2): sequence parallelism with
 * asynchronous TP: the blocks' norms keep their output sequence-sharded (the attention's and the
 * dense MLP's colwise linears gather it, overlapped) and every colwise and rowwise style of the
 * blocks has async_tp set. A MoE model (cfg->n_experts > 0) gets no MLP entries: its router and
 * experts stay whole on every tp rank (or are left to expert parallelism), and its ffn_norm
 * hands the layer sequence shards (Shard(1)) in every mode, so that each tp rank routes and
 * computes only its own tokens (dt_nn_moe; the experts' and the router's gradients are summed
 * over tp); without sequence parallelism the block's output is gathered after the residual add
 * (ffn_norm's Replicate output before). Writes up to
 * `cap` entries (16 suffice) and their count. DT_ERR_INVALID_ARG for a sequence_parallel other
 * than 0, 1 or 2. */
#define DT_TP_SP_ASYNC 2
DT_API dt_status_t dt_tp_plan_llama(const dt_llama_config_t* cfg, int sequence_parallel,
                                    int loss_parallel, dt_tp_plan_entry_t* out, int cap, int* n);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_PARALLEL_H */

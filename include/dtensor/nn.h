/* dtensor/nn.h - layers for one's own models (Linear, activations, Sequential, the losses),
 * modules, a Llama-style decoder (dense or MoE), AdamW, gradient clipping, the learning-rate
 * schedule and the training data sources.
 *
 * Your own model (README, "Your own model"; examples/mlp.c): build it from dt_linear_create,
 * dt_activation_create and dt_sequential_create (or a module of your own whose forward runs its
 * children with dt_module_forward), compute a loss with dt_nn_mse_loss or dt_nn_cross_entropy,
 * and train it with dt_module_params, dt_adamw_create (dt_adamw_config_default), dt_adamw_step and
 * dt_module_zero_grad. The same model code runs on every mesh: wrap it with dt_fully_shard
 * and/or dt_parallelize_module (dtensor/parallel.h) to choose how it is split.
 *
 * Parameters are leaf variables whose placements come from a plan the user writes: a list of
 * "pattern=placements" entries separated by ';' ("*.wq=S(0);tok_emb=S(0);*=R"), matched in order
 * against the parameter names below ('*' matches any run of characters); unmatched parameters are
 * replicated. The model code is the same for every mesh: dispatch picks how each op runs.
 *
 * Parameter names: tok_emb (V, D); layers.<i>.attn_norm (D); layers.<i>.wq (H*Dh, D), .wk and .wv
 * (G*Dh, D), .wo (D, H*Dh); layers.<i>.ffn_norm (D); dense MLP: layers.<i>.w1, .w3 (F, D), .w2
 * (D, F); MoE: layers.<i>.router (E, D), the experts stacked as layers.<i>.experts.w1 and .w3
 * (E, F, D) and layers.<i>.experts.w2 (E, D, F) in the module layers.<i>.experts (its forward
 * takes the tokens and the router weight and runs dt_nn_moe, so a wrapper of the experts alone,
 * FSDP over an expert mesh, encloses every use of them); norm (D); output (V, D). With
 * tie_embeddings the output projection is the embedding table: the module "output" holds
 * tok_emb's variable (dtensor/module.h, tied parameters), listed once as "tok_emb".
 * Weights are N(0, 0.02) (output projections scaled by 1/sqrt(2 layers)), norms ones; values
 * depend only on (seed, name, element), so every mesh starts from the same model.
 */
#ifndef DTENSOR_NN_H
#define DTENSOR_NN_H

#include "dtensor/autograd.h"
#include "dtensor/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- modules: functions over recorded ops (record on `tape` when grad mode is on) ---------- */
typedef enum dt_nn_init { DT_INIT_NORMAL = 0, DT_INIT_ZEROS = 1, DT_INIT_ONES = 2 } dt_nn_init_t;

/* A parameter (leaf requiring a gradient) named `name`, placed by the first matching plan entry
 * ("pattern=placements;...", '*' wildcards; one placement applies to every mesh dim; no match:
 * replicated). N(0, std) values depend only on (seed, name, element). */
DT_API dt_status_t dt_nn_param(dt_mesh_t mesh, const char* plan, const char* name, int ndim,
                               const int64_t* shape, dt_nn_init_t init, double std, uint64_t seed,
                               dt_var_t* out);
/* Writes into parameter p what dt_nn_param(mesh, plan, name, .., init, std, seed) would have
 * given it, at p's current placements whatever they are (tensor parallel, FSDP's nested shards):
 * the values depend on name, seed and the global index only, so each rank computes its own shard
 * and nothing is communicated. A meta value (a parameter built without data: deferred
 * initialization) is replaced by a real tensor of its layout; another float dtype is rounded.
 * DT_ERR_INVALID_ARG for a Partial value or a bad init / std. */
DT_API dt_status_t dt_nn_param_init(dt_var_t p, const char* name, dt_nn_init_t init, double std,
                                    uint64_t seed);
/* The placements (mesh_ndim of them) that `plan` gives the parameter `name`, as dt_nn_param places
 * it: the first entry whose pattern matches the whole name ('*' matches any run of characters,
 * spaces around the pattern are ignored; time linear in the name per star at worst), all
 * Replicate when none does or plan is NULL. DT_ERR_INVALID_ARG for an entry without '=', longer
 * than 255 characters, or whose placements do not parse or number neither 1 nor mesh_ndim
 * (entries after the match are not read). Pure; needs no mesh. */
DT_API dt_status_t dt_nn_plan_lookup(const char* plan, const char* name, int mesh_ndim,
                                     dt_placement_t* out);
/* 1 when `pattern` matches the whole of `name`, '*' matching any run of characters (the plans'
 * rule; time O(len(pattern) * len(name)) at worst); 0 otherwise or for a NULL argument. */
DT_API int dt_nn_name_match(const char* pattern, const char* name);
/* ---- layers: modules (dtensor/module.h) for one's own models ------------------------------
 * Each is a module with a forward (dt_module_forward, one input and one output) and, for Linear,
 * its parameters, replicated on every mesh dim so that the wrappers of dtensor/parallel.h can
 * place them (dt_fully_shard, dt_parallelize_module's colwise and rowwise styles). */

/* nn.Linear: a module named `name` with parameters "weight" (out_features, in_features) and, when
 * `bias` is nonzero, "bias" (out_features); its forward maps x (..., in_features) to
 * x weight^T + bias (..., out_features) (dt_nn_linear). Initialised as PyTorch's nn.Linear: every
 * element uniform in [-1/sqrt(in_features), 1/sqrt(in_features)) (kaiming-uniform with a =
 * sqrt(5), and the bias's bound), from the counter-based generator of dt_tensor_rand: a value
 * depends only on (seed, name, parameter, element), never on the mesh or the placements, so
 * every mesh and every wrapper starts from the same model (two layers with the same name and
 * seed start equal: name them apart, or seed them apart). f32 (the optimizer's master weights;
 * FSDP's param_dtype computes in bf16). DT_ERR_INVALID_ARG for sizes below 1 or a bad name. */
DT_API dt_status_t dt_linear_create(dt_mesh_t mesh, const char* name, int64_t in_features,
                                    int64_t out_features, int bias, uint64_t seed,
                                    dt_module_t* out);
/* An activation: a module named `name` without parameters whose forward applies the element-wise
 * op `op` ("relu", "gelu", "silu", "tanh", "sigmoid": any op of one input and one output with a
 * backward rule and no required argument; DT_ERR_INVALID_ARG otherwise). */
DT_API dt_status_t dt_activation_create(const char* name, const char* op, dt_module_t* out);
/* nn.Sequential: a module named `name` whose forward runs its children in order, each one's
 * output the next one's input (no children: the input itself). Ownership of children[0..n)
 * passes to it; later dt_module_add_child calls append. Parameter and module paths go through
 * the children's names ("fc1.weight"; TP plans and FSDP groups name them the same way), so give
 * each child a distinct name. DT_ERR_INVALID_ARG, taking nothing, when a child is not a live
 * module without a parent or two children share a non-empty name; on any later failure (out of
 * memory) the children are destroyed with it. */
DT_API dt_status_t dt_sequential_create(const char* name, int n, const dt_module_t* children,
                                        dt_module_t* out);

/* ---- losses: one recorded call each -----------------------------------------------------------
 * reduction: DT_LOSS_MEAN (a 0-d scalar, what dt_tape_backward starts from), DT_LOSS_SUM, or
 * DT_LOSS_NONE (per element, or per row for cross-entropy). Collective over the inputs' mesh; the
 * mean is over the global batch whatever the placements (sharded batches too). */
/* nn.MSELoss: (pred - target)^2, pred and target of the same shape (DT_ERR_INVALID_ARG
 * otherwise; no broadcasting). */
DT_API dt_status_t dt_nn_mse_loss(dt_tape_t tape, dt_var_t pred, dt_var_t target,
                                  dt_loss_reduction_t reduction, dt_var_t* out);
/* nn.CrossEntropyLoss of logits (N, C) against class indices (N) (i32/i64): the op
 * "cross_entropy", as dt_ag_cross_entropy (which is DT_LOSS_MEAN), with its fused backward and
 * loss parallelism (class-sharded logits are never gathered). */
DT_API dt_status_t dt_nn_cross_entropy(dt_tape_t tape, dt_var_t logits, dt_var_t targets,
                                       dt_loss_reduction_t reduction, dt_var_t* out);

/* ---- building blocks: functions over recorded ops ------------------------------------------ */
/* x (..., K), weight (O, K) as PyTorch, bias (O) or NULL (a zero-initialized bias is
 * DT_INIT_ZEROS): out (..., O). */
DT_API dt_status_t dt_nn_linear(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                                dt_var_t* out);
/* ids (...) i32/i64, weight (V, D): out (..., D). */
DT_API dt_status_t dt_nn_embedding(dt_tape_t tape, dt_var_t weight, dt_var_t ids, dt_var_t* out);
DT_API dt_status_t dt_nn_rms_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, double eps,
                                  dt_var_t* out);
DT_API dt_status_t dt_nn_layer_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                                    double eps, dt_var_t* out);
/* Causal self-attention of x (B, S, D): wq (H*Dh, D), wk and wv (G*Dh, D), wo (D, H*Dh); rotary
 * embeddings on q and k (interleaved pairs, theta); grouped-query heads (H a multiple of G). */
DT_API dt_status_t dt_nn_attention(dt_tape_t tape, dt_var_t x, dt_var_t wq, dt_var_t wk,
                                   dt_var_t wv, dt_var_t wo, int n_heads, int n_kv_heads,
                                   double rope_theta, dt_var_t* out);
/* The attention between the projections: q (B, S, H*Dh), k and v (B, S, G*Dh) (the outputs of
 * wq, wk, wv) -> (B, S, H*Dh), the input of wo: rotary on q and k, causal softmax attention per
 * head. Head-sharded q, k, v (Shard(2), H and G divisible by the ranks) stay sharded. */
DT_API dt_status_t dt_nn_attention_core(dt_tape_t tape, dt_var_t q, dt_var_t k, dt_var_t v,
                                        int n_heads, int n_kv_heads, double rope_theta,
                                        dt_var_t* out);
/* SwiGLU MLP of x (..., D): w2 (silu(x w1^T) * (x w3^T)), w1 and w3 (F, D), w2 (D, F). */
DT_API dt_status_t dt_nn_swiglu(dt_tape_t tape, dt_var_t x, dt_var_t w1, dt_var_t w3, dt_var_t w2,
                                dt_var_t* out);
/* What one routed MoE layer did (dt_nn_moe; dt_llama_moe_stats sums them over the layers). */
typedef struct dt_moe_stats {
  int64_t tokens;      /* N */
  int64_t assignments; /* routing choices N * top_k */
  int64_t dropped;     /* choices over an expert's capacity (0 when dropless) */
  int64_t expert_rows; /* rows the experts computed: assignments - dropped */
  int64_t capacity;    /* slots per expert (0: dropless; -1: per rank, under expert
                          parallelism; the last layer's in a sum) */
  int expert_parallel_dim; /* the mesh dim the experts are Shard(0) on, -1 without expert
                              parallelism */
  int local_routing;       /* 1: each rank routed its own tokens (split tokens: expert
                              parallelism, or rows Shard(0) beside whole experts); 0: global */
} dt_moe_stats_t;

/* Routed mixture of SwiGLU experts on x (N, D). The router (E, D) gives softmax probabilities,
 * each token goes to its top_k experts (gates: their probabilities, not renormalized); the
 * (token, expert) pairs are sorted by expert (moe_route), the tokens gathered in that order
 * (embedding), each expert's rows run through grouped GEMMs with the stacked weights w1 and w3
 * (E, F, D) and w2 (E, D, F) (silu(x w1_e^T) * (x w3_e^T), then w2_e), multiplied by their gates
 * and added back at their tokens (index_add): only the top_k experts' FLOPs per token.
 * capacity_factor 0: dropless; c > 0: each expert keeps at most ceil(c N top_k / E) pairs, the
 * first in token order (lower token index first; a token's pairs are independent), and the
 * others are dropped (they contribute nothing; the token keeps its other experts' outputs, and
 * the residual around the layer carries it). The drop count needs the kept counts on the host:
 * one read of E integers. *aux (may be NULL) = aux_coef * E * sum_e f_e P_e (load balancing;
 * f_e the fraction of the routing choices that went to e before dropping, P_e the mean router
 * probability). *stats (may be NULL) says what was routed and dropped.
 * Expert parallelism: when w1, w3 and w2 are all Shard(0) on one mesh dim and Replicate on the
 * others, the tokens are split over that dim (x's rows Shard(0) there), each rank routes its own
 * tokens, sends each expert's rows to the rank holding it (one all-to-all of per-expert counts,
 * then a ragged all-to-all of the rows: dt_ag_all_to_all), runs its experts by grouped GEMMs and
 * sends the results back (the reverse all-to-all); *out then has the split tokens' placements
 * and a capacity applies per rank (stats->capacity -1). The experts may live on another view of
 * x's ranks (an expert mesh such as (ep, efsdp) next to the tokens' (dp) mesh, as torchtitan
 * builds them): x keeps its placements, the ranks along the experts' Shard(0) dim must hold
 * different tokens (DT_ERR_INVALID_ARG otherwise), and the experts' gradients are summed over
 * the expert mesh's other dims where their ranks hold different tokens.
 * Split tokens beside whole experts: when x's rows arrive Shard(0) on some mesh dims (a batch
 * split by data parallelism, a sequence split by sequence or tensor parallelism) and every rank
 * holds every expert whole (w1, w3, w2 Replicate on one mesh), each rank routes and computes its
 * own tokens with no communication (*out keeps x's placements; the experts' and the router's
 * gradients are Partial(sum) over the splitting dims; a capacity applies per rank, as under
 * expert parallelism). Otherwise the routing is global (Replicate) and x, the weights and the
 * output are placed as the ops' rules allow (experts sharded on their hidden dim for tensor
 * parallelism: w1/w3 Shard(1), w2 Shard(2)). Dropless, all give the same result. Collective
 * over the mesh. */
DT_API dt_status_t dt_nn_moe(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1,
                             dt_var_t w3, dt_var_t w2, int top_k, double capacity_factor,
                             double aux_coef, dt_var_t* out, dt_var_t* aux,
                             dt_moe_stats_t* stats);
/* The reference: the same parameters and the same result as dt_nn_moe without dropping, computed
 * the dense way: every expert runs on every token and is weighted by a dense (N, E) gate matrix
 * (zero outside the top_k), E / top_k times the routed arithmetic. For tests and benchmarks. */
DT_API dt_status_t dt_nn_moe_dense(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1,
                                   dt_var_t w3, dt_var_t w2, int top_k, double aux_coef,
                                   dt_var_t* out, dt_var_t* aux);

typedef struct dt_llama_config {
  int dim, n_layers, n_heads, n_kv_heads, vocab, seq_len, ffn_dim;
  int n_experts;   /* 0: dense SwiGLU MLP; else a mixture of experts */
  int top_k;       /* experts per token (MoE) */
  double norm_eps, rope_theta;
  double aux_loss_coef; /* load-balancing loss weight (MoE) */
  uint64_t seed;
  double capacity_factor; /* MoE: 0 dropless (the default); c > 0 caps each expert at
                             ceil(c tokens top_k / E) routing choices (see dt_nn_moe) */
  int tie_embeddings;     /* 1: the output projection is the token embedding (GPT-2, Llama 3.2
                             1B/3B, Gemma): one (V, D) parameter held by "tok_emb" and "output",
                             initialized as the embedding, its gradient the sum of both uses' */
  int defer_init;         /* 1: parameters built as meta tensors (a layout, no memory) for
                             wrappers to place (tensor parallelism, FSDP) before
                             dt_llama_init_weights fills each rank's shards: no rank ever holds
                             the whole model. The values equal the eager build's. */
  int ignore_targets;     /* 1: targets of -100 (PyTorch's ignore_index) count nowhere in the
                             loss, which is the mean over the other tokens (prompt masking in
                             fine-tuning, padding); 0: every target must be a class */
} dt_llama_config_t;

/* Defaults for the fields left 0 (norm_eps 1e-5, rope_theta 10000, n_kv_heads = n_heads,
 * ffn_dim = 4 dim rounded to 8 with the 2/3 SwiGLU factor, top_k 2, aux 0.01); a default ffn_dim
 * beyond an int stays 0 (dt_llama_config_check refuses it). cfg NULL: nothing. */
DT_API void dt_llama_config_defaults(dt_llama_config_t* cfg);
/* Checks a config as dt_llama_create does, building nothing (no mesh, no memory; dt_init not
 * needed), so a program can refuse bad flags before it creates a mesh: DT_SUCCESS, or
 * DT_ERR_INVALID_ARG naming the first constraint broken and its values (the head dim must be a
 * whole even number, n_kv_heads must divide n_heads, norm_eps, rope_theta, aux_loss_coef and
 * capacity_factor must be finite, the switches tie_embeddings, defer_init and ignore_targets
 * must be 0 or 1, ...). Fields left 0 are taken at dt_llama_config_defaults' values; cfg itself
 * is not changed. */
DT_API dt_status_t dt_llama_config_check(const dt_llama_config_t* cfg);

typedef struct dt_llama* dt_llama_t;

/* Builds the model's parameters on `mesh` placed by `plan` (NULL: all replicated). With
 * tie_embeddings the tied table is placed by the plan's tok_emb entry; a plan that places
 * "output" otherwise is DT_ERR_INVALID_ARG naming both (tensor parallelism gives both Shard(0):
 * the vocabulary). */
DT_API dt_status_t dt_llama_create(dt_mesh_t mesh, const dt_llama_config_t* cfg, const char* plan,
                                   dt_llama_t* out);
DT_API dt_status_t dt_llama_destroy(dt_llama_t m);
/* Initializes every parameter of the model in place at its current placements (after wrapping a
 * model built with defer_init; on an eager model it resets the initial values): normal(0, 0.02)
 * weights (the residual projections wo, w2 scaled by 1 / sqrt(2 n_layers)), ones for the norms,
 * the same values dt_llama_create gives, shard by shard (dt_nn_param_init). */
DT_API dt_status_t dt_llama_init_weights(dt_llama_t m);
/* The model's module tree (borrowed; see the parameter names above): "tok_emb", "layers" with one
 * child per block ("layers.3"; children attn_norm, the attention, ffn_norm, the MLP or MoE),
 * "norm", "output". Wrappers hook or replace parameters in it; dt_llama_forward runs it. */
DT_API dt_status_t dt_llama_module(dt_llama_t m, dt_module_t* root);
/* The parameters (borrowed until the next call), their qualified names, and the total parameter
 * count (of the original model: replaced parameters keep their global shapes). A tied parameter
 * is one: listed and counted once, under its first name ("tok_emb"; dt_module_param_names on the
 * root gives the others). */
DT_API dt_status_t dt_llama_params(dt_llama_t m, dt_var_t** params, const char* const** names,
                                   int* n, int64_t* numel);
/* Mean next-token cross-entropy of tokens (B, S) i64 against targets (B, S) i64, both replicated
 * or sharded on the batch dim (with ignore_targets, over the targets that are not -100: one
 * scalar all-reduce of their count where the batch is sharded); *aux (may be NULL) gets the MoE load-balancing term, already added
 * to the loss. The loss is computed in f32 whatever the parameters' dtype (bf16 logits are
 * cast to f32 before the cross-entropy). Records on `tape` when grad mode is on. */
DT_API dt_status_t dt_llama_forward(dt_llama_t m, dt_tape_t tape, dt_tensor_t tokens,
                                    dt_tensor_t targets, dt_var_t* loss, double* aux);
/* Context parallelism over mesh dim `mesh_dim` of the model's mesh (-1: off, the default): the
 * sequence of every activation sharded over that dim's n ranks. dt_llama_forward then takes
 * tokens and targets (B, S) Shard(1) on it, in the load-balanced order (dt_cp_position, S a
 * multiple of 2n), Shard(0) (B splitting evenly) or Replicate on the other dims; the residual
 * stream runs as blocks of rows (P, B S / P, D), P the number of token shards, each rank's block
 * its own tokens (no communication; dim 1 is the sequence dim a sequence-parallel plan shards
 * over tp, dt_tp_plan_llama's Shard(1)), attention as ring attention over the dim with rotary at
 * the real positions; the loss is the mean over all B S tokens. Parameters are replicated over the dim (their gradients are partial sums there,
 * reduced where they are reduced over the data dims). A dim of one rank is the same as -1 (off).
 * DT_ERR_INVALID_ARG for a dim out of range or a seq_len that is not a multiple of 2n; at the
 * forward, for tokens or targets on another mesh. */
DT_API dt_status_t dt_llama_set_context_parallel(dt_llama_t m, int mesh_dim);
/* What the MoE layers of the last dt_llama_forward routed and dropped, summed over the layers
 * (zeros for a dense model or before a forward). */
DT_API dt_status_t dt_llama_moe_stats(dt_llama_t m, dt_moe_stats_t* out);
/* Forward FLOPs per token (matmuls and attention), for throughput and MFU; an MoE layer counts
 * its router and its top_k experts (what the grouped GEMMs run without dropping). 0 for NULL. */
DT_API double dt_llama_flops_per_token(const dt_llama_config_t* cfg);

/* ---- AdamW on local shards, fp32 master weights -------------------------------------------
 * Each step runs the adamw op per parameter (so any backend runs it); a gradient whose
 * placements differ from its parameter's is redistributed to them first (a Partial gradient is
 * reduced on the way in). */
typedef struct dt_adamw_config {
  double lr; /* the rate of dt_adamw_step(opt, DT_ADAMW_LR_CONFIG) */
  double beta1, beta2, eps, weight_decay;
  int bf16_moments; /* store m and v as bf16 (math in f32) */
} dt_adamw_config_t;
typedef struct dt_adamw* dt_adamw_t;

/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01, f32
 * moments. One difference stays (see dt_adamw_step): 1-dim parameters (biases, norms) are not
 * decayed, where PyTorch's single parameter group decays them too. */
DT_API dt_adamw_config_t dt_adamw_config_default(void);

/* The optimizer over params[0..n) (the handles are kept: create it after wrapping the model,
 * e.g. from dt_module_params, which lists a tied parameter once). DT_ERR_INVALID_ARG for a dead
 * parameter, one listed twice (it would be stepped twice), lr not finite or below 0, betas
 * outside [0, 1), eps <= 0, weight_decay < 0. */
DT_API dt_status_t dt_adamw_create(const dt_adamw_config_t* cfg, int n, dt_var_t* params,
                                   dt_adamw_t* out);
/* dt_adamw_step's lr that means "the configured cfg.lr" (PyTorch's opt.step()). */
#define DT_ADAMW_LR_CONFIG (-1.0)
/* One step with learning rate lr (the schedule's value, or DT_ADAMW_LR_CONFIG); parameters
 * without a gradient are skipped (their step counts stay, as in PyTorch). Norm weights and biases
 * (1-dim parameters) get no weight decay. Collective over the parameters' meshes.
 * DT_ERR_INVALID_ARG for any other negative or non-finite lr. */
DT_API dt_status_t dt_adamw_step(dt_adamw_t opt, double lr);
/* The state of parameter i (in the order given to dt_adamw_create), borrowed until
 * dt_adamw_destroy; any output may be NULL: the first and second moments (the parameter's mesh,
 * shape and placements; f32, or bf16 with bf16_moments) and its step count (a 0-d i64 tensor,
 * Replicate). They are the optimizer's state itself: a checkpoint reads them with
 * dt_tensor_gather_full and restores them with dt_tensor_redistribute_into. */
DT_API dt_status_t dt_adamw_state(dt_adamw_t opt, int i, dt_tensor_t* exp_avg,
                                  dt_tensor_t* exp_avg_sq, dt_tensor_t* step);
/* The optimizer's parameter count in *n and (param not NULL) parameter i, borrowed (either
 * output may be NULL; i is checked only when param is given): a checkpoint names parameter i's
 * state after the parameter. */
DT_API dt_status_t dt_adamw_param(dt_adamw_t opt, int i, dt_var_t* param, int* n);
DT_API dt_status_t dt_adamw_destroy(dt_adamw_t opt);

/* Total L2 norm of the gradients over every placement (a replicated gradient counted once), with
 * one all-reduce (sumsq op per gradient, one Partial scalar); scales gradients in place (scale_
 * op) so the norm is at most max_norm (<= 0: no scaling). *norm gets the norm before scaling:
 * any norm f32 holds, also where the f32 sum of squares does not (norms under 2^-30 or from
 * 2^64 take a second pass on copies scaled by 2^64 or 2^-64, one gradient at a time, and a second
 * all-reduce); a NaN gradient gives NaN, an infinite one inf (and the gradients scaled by 0).
 * The gradients may live on up to 8 meshes that each cover the world (e.g. the dense and the
 * expert parameters' views of one world): each rank adds its shares and the sum is still one
 * all-reduce (DT_ERR_UNSUPPORTED when a mesh covers only part of the world). Partial gradients
 * are an error (reduce them first). A variable listed twice (a tied parameter) counts, and is
 * scaled, once. */
DT_API dt_status_t dt_clip_grad_norm(int n, dt_var_t* params, double max_norm, double* norm);

/* Linear warmup to lr_max over `warmup` steps, then cosine decay to lr_min at `total` (and lr_min
 * after it). A negative step or warmup counts as 0. */
DT_API double dt_lr_schedule(int64_t step, int64_t warmup, int64_t total, double lr_max,
                             double lr_min);

/* ---- data ---------------------------------------------------------------------------------- */
typedef struct dt_corpus* dt_corpus_t;
/* A synthetic order-`order` Markov chain over `vocab` symbols from a fixed seed (each context has
 * a few likely successors), `length` tokens long; its entropy floor (the conditional entropy
 * under the stationary distribution, in nats) is computed exactly. */
DT_API dt_status_t dt_corpus_markov(int vocab, int order, int64_t length, uint64_t seed,
                                    dt_corpus_t* out);
/* A byte-level corpus (vocab 256) read from a regular file of at least 2 bytes (a directory, FIFO
 * or device is DT_ERR_INVALID_ARG); entropy floor reported as NaN. */
DT_API dt_status_t dt_corpus_file(const char* path, dt_corpus_t* out);
DT_API double dt_corpus_entropy_floor(dt_corpus_t c);
DT_API int dt_corpus_vocab(dt_corpus_t c);
/* Batch `step` of B windows of S+1 tokens (deterministic in (seed, step)): tokens and targets
 * shifted by one, written as (B, S) int64 arrays (full batch, the same on every rank). */
DT_API dt_status_t dt_corpus_batch(dt_corpus_t c, uint64_t seed, int64_t step, int B, int S,
                                   int64_t* tokens, int64_t* targets);
DT_API dt_status_t dt_corpus_destroy(dt_corpus_t c);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_NN_H */

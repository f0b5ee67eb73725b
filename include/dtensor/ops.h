/* dtensor/ops.h - running ops on distributed tensors.
 *
 * dt_op_run selects the op's cheapest strategy for the inputs' current placements (cached by
 * every input's shape, dtype and placements and every argument), redistributes the inputs that
 * need it, runs the local kernel on the shards and returns a new tensor with the strategy's
 * output placements. Partial placements pass through an op only where it is linear in that input
 * for that reduce op (see dtensor/strategy.h); everything else is reduced first (an integer
 * Partial(avg) always: its average truncates, so avg(a) + avg(b) is not avg(a + b)). Collective over
 * the mesh. This version computes in f32 on the CPU (OpenBLAS for matmuls).
 */
#ifndef DTENSOR_OPS_H
#define DTENSOR_OPS_H

#include "dtensor/backend.h"
#include "dtensor/strategy.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs op `name` on n_inputs tensors of one mesh; iargs/fargs are its integer and scalar
 * arguments (may be NULL when their count is 0), in the order of the op's schema
 * (dt_op_arg_describe; dtensor-explain ops lists them). Trailing arguments may be left out: they
 * take the schema's defaults (written "name=default" below), so a call with only the required
 * arguments equals the call with every default written out. Built-in ops (PyTorch aten names
 * where one exists):
 *   matmul:     mm, bmm, addmm (input, m1, m2; fargs [beta, alpha]), linear (x, w (O, K), b),
 *               linear_nobias
 *   pointwise:  add, sub, mul, div, maximum, minimum, and the comparisons eq, ne, lt, le, ge, gt
 *               (broadcasting; 1 / 0 in the operands' dtype, where PyTorch gives bool; NaN
 *               compares unequal to everything), neg, abs, relu, exp, log, sqrt, rsqrt, gelu,
 *               silu, sigmoid, tanh, sin, cos, reciprocal, log1p, expm1 (exp, log, sqrt,
 *               rsqrt, sigmoid, tanh and these five take integer tensors too, computed in f32 as
 *               PyTorch's; gelu, silu and pow refuse them; log1p and expm1 accurate near 0;
 *               non-decreasing, expm1 keeps a Partial(max) or Partial(min) and log1p a
 *               Partial(min), as clamp keeps both), floor, ceil, round (iargs [decimals=0]),
 *               trunc, sign, erf (erf takes integers too, computed in f32; floor, ceil, round
 *               and trunc return an i32/i64 tensor unchanged, sign gives -1 / 0 / 1 in its
 *               dtype; round is half to even, and with decimals d != 0 torch 1.13's
 *               nearbyint(x * 10^d) / 10^d (d < 0: nearbyint(x / 10^-d) * 10^-d), computed in
 *               f32 with x * 10^d and 10^d rounded to a bf16 x's dtype, as PyTorch; decimals
 *               != 0 of an integer or f16 tensor is DT_ERR_UNSUPPORTED, as torch 1.13 has no
 *               such kernel; non-decreasing, all six keep a Partial(max) or Partial(min), sign
 *               only of integers since sign(NaN) = 0),
 *               add_scalar / mul_scalar / pow (fargs [s]), clamp (fargs
 *               [min, max]: either may be absent or NaN for no bound, not both; min > max gives
 *               max everywhere, as PyTorch; float tensors; a finite bound past the dtype's range
 *               is DT_ERR_INVALID_ARG; bf16/f16 x compares with the bounds rounded to its dtype,
 *               as PyTorch's gradient does),
 *               where (cond of any dtype, a, b), masked_fill (x, mask of any dtype; fargs
 *               [value]): nonzero (NaN too) is true, so the comparisons' 1/0 serve as
 *               conditions; the value must fit x's dtype (DT_ERR_INVALID_ARG otherwise, as
 *               PyTorch): an i32 x takes [-2^31, 2^31 - 1], then truncated toward zero, an i64 x
 *               [-2^63, 2^63) (PyTorch also takes 2^63, wrapping it), neither NaN nor infinities;
 *               a float x any value its dtype holds, infinities and NaN too,
 *               cast (iargs [dt_dtype_t]), dropout (fargs [p], iargs [seed])
 *   reductions: sum, mean, amax, amin (iargs [keepdim=0, dim...]; no dims = every dim, so with no
 *               arguments at all the result is 0-d; sums accumulate in double on the host, in
 *               float trees on a GPU). Integers as torch.sum: sum of i32 or i64 is i64 (exact,
 *               wrapping at 64 bits), amax / amin keep the dtype, mean of integers is
 *               DT_ERR_INVALID_ARG ("could not infer output dtype"); neg and abs of i32/i64
 *               wrap (-INT_MIN and abs(INT_MIN) are INT_MIN);
 *               argmax, argmin (iargs [keepdim=0, dim]: at most one dim; none: the index into
 *               the flattened tensor, 0-d, or all dims 1 with keepdim, as torch.argmax): i64
 *               positions, the first of tied extremes (-0.0 ties 0.0), a NaN counting as the
 *               extreme (its first position wins), of f32/bf16/f16/i32/i64; no gradient; an
 *               empty reduction is DT_ERR_INVALID_ARG (PyTorch raises). logsumexp (iargs
 *               [keepdim=0, dim...]; no dims = every dim, as sum; torch 1.13 requires dims):
 *               max-shifted, float dtypes kept, integers computed in f32 (as torch.logsumexp);
 *               a row of -inf gives -inf, a +inf inf, a NaN NaN, no elements -inf; gradient
 *               g exp(x - out). var, std (fargs [correction=1], iargs [keepdim=0, dim...];
 *               no dims = every dim, as torch.var(x, dim, correction=, keepdim=)): the mean
 *               of squared deviations from the mean with divisor max(0, N - correction) (two
 *               passes in double on the host), std its square root; float dtypes kept,
 *               integers DT_ERR_INVALID_ARG ("std and var only support floating point"); a
 *               NaN or inf gives NaN, N <= correction inf (NaN where the spread is 0), no
 *               elements NaN; gradient 2 g (x - mean) / (N - correction) and g (x - mean) /
 *               ((N - correction) std), 0 where std is 0, as PyTorch. prod (iargs
 *               [keepdim=0, dim]: at most one dim, as torch.prod; none: every element): floats
 *               keep their dtype (f32 products, bf16/f16 rounded once), i32/i64 give i64
 *               wrapping at 64 bits; no elements: 1; gradient g times the product of the other
 *               reduced elements (out / x in rows without a zero, the product of the rest at a
 *               row's only zero, 0 elsewhere in rows with zeros). Their reduced dims are
 *               gathered (Replicate) first; sharded kept dims stay sharded; Partial inputs are
 *               reduced first
 *   nn:         softmax, log_softmax (iargs [dim]; a 0-d tensor takes 0 or -1), rms_norm
 *               (x, w), layer_norm (x, w, b) over the last dim (fargs [eps=1e-6] and
 *               [eps=1e-5]), embedding (weight (V, D), indices),
 *               gather_dim, sdpa (q, k, v as (B, H, S, D); iargs [causal=0, layout=0 (1: (B, S,
 *               H, D))]; fargs [scale]: default (absent or NaN) 1/sqrt(D), else taken as
 *               given, finite, 0 and negative too), rotary (iargs [seq_dim=1,
 *               inverse=0, cp=0 (> 0: positions in context parallelism's load-balanced order,
 *               dt_cp_position)]; fargs [theta=10000])
 *   context:    ring_attention (q, k, v; iargs [mesh_dim, causal=0, layout=0, balanced=1,
 *               algo=0]; fargs [scale] as sdpa's): attention with the sequence sharded on a mesh dim
 *               (dt_ring_attention below)
 *   loss:       cross_entropy (logits (N, C), targets (N) i32/i64; iargs [reduction=1 (0 none,
 *               1 mean, 2 sum), ignore_index (none unless given: PyTorch's default is -100)];
 *               fargs [label_smoothing=0]): dt_cross_entropy below
 *   tensor parallel: all_gather_linear (x, w; iargs [mesh_dim, gather_dim=1]; outputs y and
 *               the gathered x),
 *               linear_reduce_scatter (x, w; iargs [mesh_dim, scatter_dim=1]): a linear with
 *               its all-gather or reduce-scatter overlapped (dt_all_gather_linear below)
 *   shape:      view / reshape (iargs: the shape, one -1 allowed), flatten (iargs [start, end]),
 *               unflatten (iargs [dim, sizes...]), squeeze ([] or [dim]), unsqueeze ([dim]),
 *               permute (the permutation), transpose ([d0, d1]), t, slice ([dim, start, end,
 *               step=1], Python semantics), narrow ([dim, start, length]), cat (1 to 8 inputs,
 *               iargs [dim]), stack (1 to 8 inputs of one shape, iargs [dim=0]; cat and stack
 *               promote mixed dtypes as torch.cat), expand (iargs: the sizes, -1 keeping a
 *               dim, new dims in front; only size-1 dims grow, as Tensor.expand; the result is
 *               a copy), tril / triu
 *               (iargs [diagonal=0]; the last two dims, any dtype, sharded matrices stay
 *               sharded), cumsum (iargs [dim, reverse=0]; i32 / i64 give i64; reverse sums
 *               from the end)
 *   indexing:   topk (iargs [k, dim, largest=1]; two outputs: use dt_op_run_multi),
 *               gather (x, idx; iargs [dim]), scatter_add (x, idx, src; iargs [dim]),
 *               index_add (x (N, D), idx (T), src (T, D): rows added at idx, dim 0),
 *               index_select (x, idx (L) or 0-d, i32 / i64; iargs [dim]; any dtype; x sharded
 *               along dim gives a masked lookup, Partial(sum), with no move)
 *   experts:    grouped_mm (x (T, K) sorted by expert, w (E, N, K), counts (E); iargs [trans=1]),
 *               moe_route (idx (N, K); iargs [experts, capacity=0]; three outputs), and the
 *               gradient op grouped_mm_wgrad (a (T, M), b (T, N), counts) -> (E, M, N)
 *   rank-local: to_local, from_local and all_to_all_single (x, splits; iargs [mesh_dim]): see
 *               the rank-local tensors of dtensor/autograd.h (expert parallelism)
 *   optimizer:  sumsq (the sum of squares, accumulated in double, as a 0-d f32 tensor: Partial
 *               over the mesh dims that shard x), and two in-place ops that return nothing
 *               (dt_op_run_multi with n_outputs 0): adamw (param f32, grad f32, exp_avg,
 *               exp_avg_sq (f32 or bf16), step (0-d i64); fargs [lr, beta1, beta2, eps,
 *               weight_decay]: increments step and updates param and both moments), scale_ (x;
 *               fargs [alpha]: x *= alpha). An input an op updates in place never moves: the
 *               others are redistributed to its placements (a Partial grad is reduced on the way
 *               in), and it must not share memory with another input.
 * bf16/f16 tensors are stored as such and computed in f32 (converted on load and store).
 * Type promotion, as PyTorch's: add, sub, mul, div, maximum, minimum, the comparisons and where (its
 * values a and b; the condition keeps its dtype) given tensors of different dtypes cast them to
 * torch.result_type's dtype first and compute as for one dtype (f32 + bf16 -> f32). The rule
 * (c10::promoteTypes): one dtype stays; two float types give f32 (bf16 with f16 too); an integer
 * with a float gives the float; i32 with i64 gives i64. 0-dim tensors take part only where they
 * are of a higher category (float over integer) than the tensors with dims: bf16 (n) + f32 0-d
 * -> bf16, i32 (n) + f32 0-d -> f32, i32 (n) + i64 0-d -> i32; all 0-d: the rule over them all.
 * The output has the dtype the op gives for inputs of the result dtype (comparisons: 1/0 in it,
 * where PyTorch gives bool). Integer results (i32, i64) compute in their dtype as PyTorch's:
 * two's complement arithmetic that wraps, exact comparisons; div of integers gives f32 (PyTorch's
 * true division: each operand converted to f32, then divided). The casts run as cast ops
 * (traced, profiled, on meta tensors too); recorded with dt_ag_op, they are cast nodes, so each input's gradient comes back
 * in its own dtype (a bf16 leaf's is bf16) and integer inputs get none. Every other op refuses
 * inputs of mixed dtypes ("mm: dtype mismatch (bf16 vs f32)"; PyTorch's matmuls refuse them
 * too).
 * Special values as in PyTorch (tests/reference/make_special_fixtures.py): NaN propagates through
 * relu, maximum/minimum, amax/amin (across ranks too) and softmax rows; the mean of no elements is
 * NaN, their sum 0, and amax/amin over an empty dim is DT_ERR_INVALID_ARG; pow computes the
 * exponents 0.5, -0.5, 2, 3, -1 and -2 as sqrt, rsqrt, products and reciprocals (pow(-inf, 0.5)
 * is NaN); dropout multiplies (a dropped NaN stays NaN; p = 1 gives x * 0); index ops refuse
 * negative and out-of-range indices (DT_ERR_INVALID_ARG on every rank). Gradients: relu'(0) = 0,
 * maximum/minimum give g half to each side on ties, amax/amin share it evenly among ties, pow
 * with exponent 0 gives zeros, abs'(x) = sign(x) (0 at 0 and NaN), clamp passes g where
 * min <= x <= max (0 at NaN and where min > max); sin/cos(+-inf) = NaN, reciprocal(+-0) = +-inf,
 * log1p(-1) = -inf and NaN below -1, expm1(-inf) = -1; their gradients are PyTorch's formulas
 * (g cos(x), -g sin(x), -g out^2, g / (x + 1), g (out + 1)), so reciprocal'(0) = -inf and
 * log1p'(-1) = inf; floor, ceil, round and trunc keep NaN, +-inf and -0.0 (round(-0.5) = -0.0),
 * sign(NaN) = sign(-0.0) = 0, erf(+-inf) = +-1; their gradients are zeros (also at NaN and inf),
 * erf's 2 / sqrt(pi) exp(-x^2) g (NaN at NaN, 0 at +-inf). Deliberately different: cast of NaN, inf
 * or a float outside the integer type's range to i32/i64 is DT_ERR_INVALID_ARG (PyTorch's value is
 * platform-dependent: the type's minimum on x86), while i64 -> i32 wraps as PyTorch; topk lists
 * tied values by lower index first (PyTorch leaves the order of ties unspecified) and counts NaN
 * as the largest;
 * log1p(x) above 1e38 is its finite value (PyTorch's CPU kernel, SLEEF's log1pf, gives inf).
 * Views: view, reshape, flatten, unflatten, squeeze and unsqueeze return a tensor that shares its
 * input's storage (no copy; writes through either are seen by both; the storage lives until the
 * last tensor using it is destroyed) whenever the selected strategy keeps the local elements in
 * place, which is whenever the input needs no redistribution for it; slice and narrow (and
 * dt_split / dt_chunks) share storage when their local result is one contiguous run of the
 * input's local shard (step 1, cut on the shard's outermost non-unit dim), and copy otherwise.
 * Every other op returns new storage.
 * Errors (the message starts with "dt_op_run: ", see dtensor/status.h): DT_ERR_UNSUPPORTED
 * "unknown op 'NAME': did you mean 'X'? ..." for an unknown op (common PyTorch names map to this
 * library's op: matmul -> mm, max -> amax, scaled_dot_product_attention -> sdpa, ...; otherwise
 * the closest names by edit distance), and for an op without a kernel for the mesh's backend;
 * DT_ERR_INVALID_ARG for shape/dtype/argument mismatches (mixed dtypes where the op does not
 * promote: above), naming the argument, the bad value and what is valid. */
DT_API dt_status_t dt_op_run(const char* name, int n_inputs, const dt_tensor_t* inputs,
                             int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                             dt_tensor_t* out);
/* The same for ops with several outputs (topk: values, indices) or none (the in-place adamw and
 * scale_: outs may be NULL); n_outputs must match the op. */
DT_API dt_status_t dt_op_run_multi(const char* name, int n_inputs, const dt_tensor_t* inputs,
                                   int n_iargs, const int64_t* iargs, int n_fargs,
                                   const double* fargs, int n_outputs, dt_tensor_t* outs);

/* ---- op introspection --------------------------------------------------------------------
 * Every op (built-in or registered by the host) has a name, an arity and, for built-ins, a named
 * argument schema: integer arguments fill iargs in schema order, scalars fargs, a list takes
 * every remaining integer. */
typedef enum dt_arg_kind {
  DT_ARG_INT = 0,        /* one integer (a dim, a flag, a count) */
  DT_ARG_FLOAT = 1,      /* one scalar */
  DT_ARG_INT_LIST = 2,   /* the remaining integers (dims, a shape) */
  DT_ARG_DTYPE = 3,      /* one integer holding a dt_dtype_t */
  DT_ARG_PLACEMENTS = 4, /* the remaining integers, one encoded placement per mesh dim */
  DT_ARG_KIND_COUNT
} dt_arg_kind_t;

typedef struct dt_op_desc {
  const char* name;  /* lives as long as the library */
  int n_inputs;      /* the maximum when variadic */
  int variadic;      /* takes 1 to n_inputs tensors (cat) */
  int n_outputs;
  int n_args;        /* entries of the argument schema (0 for host ops) */
  int has_backward;  /* dt_ag_op can record it */
  int composite;     /* built from other ops (no kernel of its own) */
  int host;          /* registered (or replaced) by the host program */
  unsigned in_place; /* bit i: input i is updated in place (adamw, scale_; then no outputs) */
} dt_op_desc_t;

typedef struct dt_op_arg_desc {
  const char* name;
  dt_arg_kind_t kind;
  int required;      /* must be given */
  int has_default;   /* default_value applies when not given */
  double default_value;
} dt_op_arg_desc_t;

/* Number of ops (built-in and host-registered); index them 0 .. n-1 with dt_op_name_at. */
DT_API dt_status_t dt_op_count(int* n);
DT_API dt_status_t dt_op_name_at(int index, const char** name);
/* Descriptor of op `name`; DT_ERR_UNSUPPORTED for an unknown op (the message suggests the closest
 * names, as dt_op_run's). */
DT_API dt_status_t dt_op_describe(const char* name, dt_op_desc_t* out);
/* Argument k (0 .. n_args-1) of op `name`. */
DT_API dt_status_t dt_op_arg_describe(const char* name, int k, dt_op_arg_desc_t* out);
/* Builds the iargs/fargs of a call to op `name` from "NAME=VALUE" texts checked against the
 * schema (unknown names, repeats, missing required arguments, values of the wrong kind are
 * DT_ERR_INVALID_ARG with a message naming the argument). Lists take comma-separated integers
 * ("dim=0,2"), dtypes a name ("dtype=bf16"), scalars any number. Arguments not given take their
 * defaults up to the last one given; optional ones after it are left out. iargs has room for
 * DT_OP_MAX_IARGS values, fargs for DT_OP_MAX_FARGS. */
DT_API dt_status_t dt_op_args_parse(const char* name, int n, const char* const* assignments,
                                    int* n_iargs, int64_t* iargs, int* n_fargs, double* fargs);

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

/* Shape ops. dt_reshape: one size may be -1. dt_split: pieces of `size` along dim (the last may be
 * shorter), at most cap written, their count in *n; dt_chunks: n_chunks pieces as torch.chunk.
 * Sharding is kept where the index mapping allows, otherwise that dim is replicated first. */
DT_API dt_status_t dt_reshape(dt_tensor_t x, int ndim, const int64_t* shape, dt_tensor_t* out);
DT_API dt_status_t dt_transpose(dt_tensor_t x, int d0, int d1, dt_tensor_t* out);
DT_API dt_status_t dt_narrow(dt_tensor_t x, int dim, int64_t start, int64_t length,
                             dt_tensor_t* out);
DT_API dt_status_t dt_cat(int n, const dt_tensor_t* xs, int dim, dt_tensor_t* out);
DT_API dt_status_t dt_split(dt_tensor_t x, int64_t size, int dim, dt_tensor_t* outs, int cap,
                            int* n);
DT_API dt_status_t dt_chunks(dt_tensor_t x, int n_chunks, int dim, dt_tensor_t* outs, int cap,
                            int* n);
/* Attention: q (B, H, S, D), k and v (B, G, T, D|E) with H a multiple of G; scale <= 0 (or NaN)
 * means 1/sqrt(D), an infinite one is refused. Rotary: interleaved pairs of the last dim, positions = global index on seq_dim. */
DT_API dt_status_t dt_sdpa(dt_tensor_t q, dt_tensor_t k, dt_tensor_t v, int causal, double scale,
                           dt_tensor_t* out);
DT_API dt_status_t dt_rotary(dt_tensor_t x, int seq_dim, double theta, dt_tensor_t* out);

/* ---- context parallelism -------------------------------------------------------------------
 * The sequence of every activation sharded over one mesh dim (the cp dim, n ranks). Causal
 * attention does unequal work per query chunk, so the sequence is kept in a load-balanced order:
 * split into 2n chunks, rank r holds chunks r and 2n-1-r (each rank then sees the same number of
 * unmasked query-key pairs). dt_cp_position maps an index of that order to the token's real
 * position (cp <= 0: the index itself); the caller lays tokens, labels and positions out in it
 * (rotary's cp argument turns by real positions). seq must be a multiple of 2 cp (else -1). */
DT_API int64_t dt_cp_position(int64_t index, int64_t seq, int cp);
/* Scaled dot-product attention over a sequence sharded on mesh dim `mesh_dim` (op
 * "ring_attention"): q (B, H, S, D), k (B, G, S, D), v (B, G, S, E) (layout 1: (B, S, H, D)), H a
 * multiple of G, the same S for q and k (self-attention). The tensors' global sequence is in the
 * load-balanced order when `balanced` (else in order: rank r holds chunk r); the causal mask uses
 * real positions. Equal to dt_sdpa of the un-permuted sequence, permuted back.
 * Placements: the inputs are moved to Shard(seq) on mesh_dim; on the other mesh dims they keep
 * their batch or head sharding (q's decides; heads only where both H and G split evenly) and are
 * replicated otherwise. The output has q's placements after that move.
 * Algorithm (algo): 1 ring: key/value blocks travel around the mesh dim, each step's transfer
 * posted before the step's blocks are computed (overlapped), blocks merged by their log-sum-exp,
 * fully masked block pairs skipped; backward passes the key/value blocks and their gradients. 2
 * all-gather: the keys and values gathered once (n times the memory), the gradients
 * reduce-scattered. 0: the cheaper under the cost model and the compute model (the ring's
 * exposed transfers against one all-gather). Traffic counts under DT_COLL_SEND_RECV (ring: n-1
 * steps of this rank's k and v bytes forward; backward n-1 of k and v plus n of their gradients)
 * or DT_COLL_ALL_GATHER / DT_COLL_REDUCE_SCATTER on mesh_dim.
 * Backends: host memory computes in place; a device backend computes in device memory and
 * rings over the mesh's NCCL plane (ranks sharing a GPU, whose plane is MPI: staged through host
 * memory and computed there); simulated runs count the traffic and price the steps.
 * bf16/f16: k and v travel in their dtype; the blocks compute on f32 copies, or (a CUDA backend
 * under DTENSOR_SDPA_PATH=flash) on tensor cores reading the dtype as stored, P rounded to it as
 * flash attention rounds it; the output and the gradients accumulate in f32 and return in the
 * inputs' dtype. Every rank allocates its scratch before
 * the first transfer and the ranks agree on the outcome (a rank out of memory fails them all).
 * Dtypes: q, k, v share one float dtype (bf16/f16: above); lse and the gradient accumulators
 * that travel the ring are f32. Errors: DT_ERR_INVALID_ARG for shapes, mixed or integer dtypes, a sequence that is not a
 * multiple of 2n (balanced) or n, a mesh_dim out of range, an infinite scale. scale <= 0 (or
 * NaN): 1/sqrt(D). */
DT_API dt_status_t dt_ring_attention(dt_tensor_t q, dt_tensor_t k, dt_tensor_t v, int mesh_dim,
                                     int causal, int balanced, double scale, dt_tensor_t* out);
/* Asynchronous tensor parallelism (ops "all_gather_linear" and "linear_reduce_scatter"): the two
 * linears of sequence parallelism, x w^T (x (..., K), w (N, K), no bias), with their collective
 * split into ring steps that overlap the GEMM (PyTorch's fused all-gather-matmul and
 * matmul-reduce-scatter). Both equal dt_linear's result up to the order of the sums.
 * dt_all_gather_linear: x is moved to Shard(gather_dim) on mesh dim `mesh_dim` (a row dim: not
 * the last; negative counts from the end) and w to Shard(0) (colwise); the output is Shard(-1)
 * there. The shards of x travel around the ring of that mesh dim, each step's GEMM computing the
 * output rows of the shard at hand while the next one moves. The gathered x (Replicate there) is
 * the op's second output (*gathered; NULL: not wanted): the backward reads it for w's gradient,
 * and other linears of the same input may read it instead of gathering again (tensor
 * parallelism's q, k, v projections); its own gradient (theirs, a partial sum) joins dx in the
 * backward's reduce-scatter ring (below).
 * dt_linear_reduce_scatter: x is moved to Shard(-1) and w to Shard(1) (rowwise); the output is
 * Shard(scatter_dim) there. Each step computes this rank's partial sum of one rank's chunk of rows
 * while the running sum of that chunk arrives, adds them and sends them on; the backward gathers
 * the output gradient around the ring, computing dx's rows and dw's terms as slots arrive.
 * On the other mesh dims w is replicated and x keeps a shard of a row dim (the gather/scatter
 * dim only where that mesh dim comes before mesh_dim, so the shards nest); anything else is
 * replicated first; the output keeps x's placements there (w's gradient is a partial sum over
 * x's shards).
 * Uneven shards follow the chunk rule. Traffic counts under DT_COLL_SEND_RECV on mesh_dim, (n-1)/n
 * of the gathered or scattered bytes per rank (the ring collectives'). x and w share one float
 * dtype; bf16/f16 compute in f32 copies, results rounded once. Device backends compute in device
 * memory over the mesh's NCCL plane (or staged through host memory where that plane is MPI);
 * simulated runs price each step as the larger of its GEMM and its transfer. The default
 * gather/scatter dim 1 is the sequence of (B, S, ...) inputs (a 2-dim x needs 0). A rank whose step
 * fails (a kernel error) leaves the others waiting for its transfer until the deadline
 * (DTENSOR_TIMEOUT_S), as ring attention does; scratch allocation is agreed before the ring.
 * Errors: DT_ERR_INVALID_ARG for shapes, dtypes, dims out of range, tensors of two meshes;
 * DT_ERR_UNSUPPORTED for a mesh dim of more than 256 ranks. */
DT_API dt_status_t dt_all_gather_linear(dt_tensor_t x, dt_tensor_t w, int mesh_dim, int gather_dim,
                                        dt_tensor_t* out, dt_tensor_t* gathered);
DT_API dt_status_t dt_linear_reduce_scatter(dt_tensor_t x, dt_tensor_t w, int mesh_dim,
                                            int scatter_dim, dt_tensor_t* out);
/* Indexing and routing. */
DT_API dt_status_t dt_topk(dt_tensor_t x, int64_t k, int dim, dt_tensor_t* values,
                           dt_tensor_t* indices);
DT_API dt_status_t dt_gather(dt_tensor_t x, int dim, dt_tensor_t index, dt_tensor_t* out);
DT_API dt_status_t dt_scatter_add(dt_tensor_t x, int dim, dt_tensor_t index, dt_tensor_t src,
                                  dt_tensor_t* out);
/* Rows of x (N, D) with src's row i added to row idx[i] (i32/i64 indices, repeats add up):
 * torch.index_add along dim 0. Gradients: x gets g, src g's rows at idx. */
DT_API dt_status_t dt_index_add(dt_tensor_t x, dt_tensor_t idx, dt_tensor_t src,
                                dt_tensor_t* out);

/* ---- mixture of experts --------------------------------------------------------------------
 * Grouped GEMM: x (T, K) holds rows sorted by expert, counts (E) (i32/i64, Replicate: every
 * rank needs them) how many rows each expert owns, in order: rows [o_e, o_e + counts[e]) with
 * o_e = counts[0] + ... + counts[e-1] belong to expert e. out (T, N): with trans 1, w (E, N, K)
 * and out rows = x rows W_e^T (PyTorch's linear convention, one weight matrix per expert); with
 * trans 0, w (E, K, N) and out rows = x rows W_e. One GEMM per expert with rows (cblas_sgemm on
 * the CPU); experts without rows and T = 0 are fine. The counts must be non-negative and sum to
 * T (DT_ERR_INVALID_ARG, agreed over the mesh, otherwise). Differentiable in x and w (the weight
 * gradient is the op grouped_mm_wgrad). Placements: rows sharded (each rank its rows), the
 * weights' output or contracted dim sharded (tensor parallel), experts sharded (each rank its
 * own experts' rows, the others zero: a Partial(sum) output); see src/strategy/rules_moe.c. */
DT_API dt_status_t dt_grouped_mm(dt_tensor_t x, dt_tensor_t w, dt_tensor_t counts, int trans,
                                 dt_tensor_t* out);
/* FLOPs (2 per multiply-add) the grouped GEMM kernels (grouped_mm and grouped_mm_wgrad) of this
 * process computed since the last reset: per expert group, its rows times its matrix, so an
 * expert a row is not routed to costs nothing. Counted by the host kernels; not thread-safe. */
DT_API dt_status_t dt_grouped_mm_flops(int64_t* flops);
DT_API dt_status_t dt_grouped_mm_flops_reset(void);
/* Routing: idx (N, K) (i32/i64, the K experts token n chose, each in [0, n_experts)) as slots
 * s = n K + j. *order (N K) i64 lists the slots sorted by expert, stable (token order within an
 * expert), the kept slots first and then the dropped ones in slot order; *tok (N K) i64 the
 * token of each sorted slot (order / K); *counts (n_experts) i64 the slots each expert keeps.
 * capacity > 0: an expert keeps its first `capacity` slots in token order and drops the rest;
 * 0 keeps every slot (dropless). Outputs Replicate (the sort is global). No gradient. */
DT_API dt_status_t dt_moe_route(dt_tensor_t idx, int64_t n_experts, int64_t capacity,
                                dt_tensor_t* order, dt_tensor_t* tok, dt_tensor_t* counts);
DT_API dt_status_t dt_where(dt_tensor_t cond, dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out);
DT_API dt_status_t dt_cast(dt_tensor_t x, dt_dtype_t dtype, dt_tensor_t* out);
/* Dropout with a placement-independent mask: element g (global index) is kept when a hash of
 * (seed, g) is at least p; kept values are scaled by 1/(1-p). */
DT_API dt_status_t dt_dropout(dt_tensor_t x, double p, uint64_t seed, dt_tensor_t* out);

typedef enum dt_loss_reduction {
  DT_LOSS_NONE = 0, /* per-row losses, shape (N) */
  DT_LOSS_MEAN = 1, /* scalar */
  DT_LOSS_SUM = 2,  /* scalar */
  DT_LOSS_REDUCTION_COUNT
} dt_loss_reduction_t;

/* Cross-entropy of logits (N, C) against class indices (N) (i32/i64), as in PyTorch with
 * log-softmax over C. Loss parallel: with logits sharded on C, only per-row max, sum of
 * exponentials and target logit are reduced across ranks; the logits never gathered. The
 * result may be Partial (e.g. Partial(sum) per-row losses): redistribute it to R to read it.
 * Built from the public ops (amax, sub, exp, sum, log, gather_dim, mean). Collective. Every
 * target must lie in [0, C) (else DT_ERR_INVALID_ARG). The op "cross_entropy" (dt_op_run,
 * dt_ag_op) also takes, as PyTorch's F.cross_entropy does:
 *  - ignore_index (iargs[1]; PyTorch's default -100 must be given here): rows whose target it is
 *    count nowhere (loss 0 for reduction none, left out of the sum, and the mean is over the
 *    other rows: NaN, with zero gradients, when every row is ignored); the mean's count costs
 *    one scalar all-reduce where the rows are sharded. Without it, a target of -100 is refused;
 *  - label_smoothing (fargs[0], 0 to 1): (1 - eps) times the loss plus eps times the mean over
 *    the classes of -log softmax. */
DT_API dt_status_t dt_cross_entropy(dt_tensor_t logits, dt_tensor_t targets,
                                    dt_loss_reduction_t reduction, dt_tensor_t* out);

/* ---- tracing: what dispatch and redistribution decide -------------------------------------
 * A process-wide callback sees every op dispatch (after its strategy was selected; a composite op
 * once, then its pieces one level deeper) and every redistribution (its plan), for meta tensors
 * too: running an op on meta tensors of an abstract mesh under a trace shows every decision
 * without MPI or data (dtensor-explain op does this for composites such as cross_entropy). The
 * event and what it points to are valid during the call only. */
typedef enum dt_trace_kind { DT_TRACE_OP = 0, DT_TRACE_REDISTRIBUTE = 1 } dt_trace_kind_t;
typedef struct dt_trace_event {
  dt_trace_kind_t kind;
  int depth;       /* 0 for the call made by the program; the pieces of a composite and the
                      redistributions an op runs for its inputs are one level below it */
  const char* op;  /* DT_TRACE_OP: the op's name */
  int mesh_ndim;
  int n_inputs;
  const dt_placement_t (*from)[DT_MAX_MESH_DIMS]; /* DT_TRACE_OP: the inputs' placements */
  const dt_op_choice_t* choice; /* DT_TRACE_OP: the selected strategy (NULL for a composite) */
  int input;                    /* DT_TRACE_REDISTRIBUTE: which input of the op being run (-1:
                                   a redistribution the program asked for) */
  dt_plan_t plan;               /* DT_TRACE_REDISTRIBUTE: the plan */
} dt_trace_event_t;
typedef void (*dt_trace_fn)(const dt_trace_event_t* event, void* ctx);
/* Sets the callback (NULL: tracing off). Not thread-safe; set it around the calls to trace. */
DT_API void dt_trace_set(dt_trace_fn fn, void* ctx);

/* ---- profile: where this rank's time goes ------------------------------------------------
 * While profiling is on, every op call (the program's, a composite's pieces, the ops of
 * backward rules), every backward rule, every wait for communication (a blocking
 * redistribution, dt_work_wait) and every local transfer (dt_tensor_copy_local and the like:
 * FSDP's and DDP's packing) is timed on this rank: its calls, its total time, and its self
 * time (the total less the entries nested in it: an op's redistribution of its inputs, a
 * composite's pieces), so that the self times add up to the time spent in the library. On a
 * GPU (the cuda backend) each op ends by synchronizing the device, so its time is its own
 * kernels' and not the next op's: profiling then slows the run down; use it to find where time
 * goes, and time the run itself with profiling off. Local, per process; $DTENSOR_PROFILE=1
 * turns it on at dt_init. */
typedef enum dt_profile_kind {
  DT_PROFILE_OP = 0,       /* an op ("mm") */
  DT_PROFILE_BACKWARD = 1, /* an op's backward rule ("mm.backward" in reports) */
  DT_PROFILE_COMM = 2,     /* "redistribute" (blocking) and "work_wait" */
  DT_PROFILE_LOCAL = 3,    /* "copy_local", "fill_local", "read_local", "write_local": the local
                            * transfers of dtensor/tensor.h (the wrappers' packing, host I/O) */
  DT_PROFILE_KIND_COUNT
} dt_profile_kind_t;
typedef struct dt_profile_entry {
  const char* name; /* lives as long as the library */
  dt_profile_kind_t kind;
  int64_t calls;
  double self_s, total_s;
} dt_profile_entry_t;
/* Turns profiling on (clearing what was recorded, when it was off) or off (keeping it). */
DT_API dt_status_t dt_profile_set(int on);
DT_API int dt_profile_enabled(void);
/* Clears what was recorded (the report's wall time starts again). */
DT_API dt_status_t dt_profile_reset(void);
/* The recorded entries, largest self time first: up to cap of them in out, how many there are
 * in *n. */
DT_API dt_status_t dt_profile_entries(dt_profile_entry_t* out, int cap, int* n);
/* Prints the entries as a table (the `top` largest by self time; top <= 0: all) after a line
 * with the library's time and the wall time since the profile was cleared. */
DT_API dt_status_t dt_profile_report(FILE* out, int top);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_OPS_H */

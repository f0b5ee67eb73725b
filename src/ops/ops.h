/* ops.h - internal interface of the ops layer: dispatch by op id, the host kernels and the
 * backward rules the op table names, and the composite ops. */
#ifndef DT_OPS_OPS_H
#define DT_OPS_OPS_H

#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "dtensor/ops.h"
#include "strategy/strategy.h"
#include "tensor/tensor.h"

/* Small helpers shared by the host kernels and the CUDA kernels (nvcc compiles them for both). */
#ifdef __CUDACC__
#define DT__HD __host__ __device__
#else
#define DT__HD
#endif

/* ---- dispatch (src/ops/dispatch.c) ---------------------------------------------------------- */
/* Runs op `id` (a built-in or host op) on tensors of one mesh: composites run their forward,
 * the others select a strategy, redistribute the inputs and run the kernel. *saved (may be NULL)
 * gets a composite's by-product for its backward rule. */
dt_status_t dt__op_apply(int id, int n_in, const dt_tensor_t* in, int n_iargs, const int64_t* iargs,
                         int n_fargs, const double* fargs, int n_out, dt_tensor_t* out,
                         dt_tensor_t* saved);
/* Type promotion (DT_OPF_PROMOTES_IN, src/strategy/promote.c): when the operands op `id` promotes
 * have different dtypes, cast[t] gets input t cast to the result dtype (a new tensor; NULL where
 * input t keeps its dtype or is not promoted); all NULL otherwise. The casts run as cast ops
 * (dt__op_apply: traced, profiled and priced like any op, meta tensors too). dt__op_apply runs
 * this itself; the tape calls it to record the casts as nodes. n_in in [0, DT_OP_MAX_INPUTS],
 * live tensors. */
dt_status_t dt__op_promote(int id, int n_in, const dt_tensor_t* in, dt_tensor_t* cast);
/* A device kernel-set entry: the kernel of one op for one kernel set, its DT_KERNEL_ANY_DTYPE or
 * DT_KERNEL_ONE_DTYPE flag (the kernel takes bf16/f16 storage itself, always or when the call's
 * tensors share one dtype; otherwise run_kernel hands it f32 copies) and,
 * where the kernel allocates device scratch, the most it holds at once for the given shapes (the
 * kernel sizes its scratch with the same function; a simulated run of that kernel set counts it,
 * see dt_sim_set_device). NULL: no scratch, or none worth modelling (a flag word). */
typedef size_t (*dt_kernel_scratch_fn)(const dt_op_call_t* call, const dt_local_tensor_t* in,
                                       const dt_local_tensor_t* out);
typedef struct dt_device_kernel {
  dt_op_kernel_fn fn;
  unsigned flags;
  dt_kernel_scratch_fn scratch;
} dt_device_kernel_t;
/* The kernel that runs op `id` on backend b (NULL: none) and its DT_KERNEL_* dtype flag in
 * *flags: a host-registered op's or override's kernel for b's device, else the built-in kernel
 * of b's kernel set. */
dt_op_kernel_fn dt__op_kernel(int id, dt_backend_t b, unsigned* flags);
/* The scratch the kernel of op `id` on backend b holds at its peak for these local tensors: the
 * kernel set's scratch function, or the host kernels' (dt__kernel_scratch_nbytes). */
size_t dt__op_scratch_nbytes(int id, dt_backend_t b, const dt_op_call_t* call,
                             const dt_local_tensor_t* in, const dt_local_tensor_t* out);
/* The CUDA kernel sets (src/ops/cuda, one source compiled by nvcc and for the SIMT emulator):
 * fill table[DT_OP_COUNT] (entries without a kernel stay NULL). */
void dt__cuda_kernels_fill(dt_device_kernel_t* table);
void dt__cudaemu_kernels_fill(dt_device_kernel_t* table);

/* Adds to the count dt_grouped_mm_flops reports (the grouped GEMM kernels of every backend). */
void dt__grouped_mm_flops_add(int64_t flops);

/* One-output shorthands over dt__op_apply. */
dt_status_t dt__op1(int id, dt_tensor_t a, dt_tensor_t* out);
dt_status_t dt__op2(int id, dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out);
dt_status_t dt__opa(int id, int n_in, const dt_tensor_t* in, int n_iargs, const int64_t* iargs,
                    int n_fargs, const double* fargs, dt_tensor_t* out);


/* expf(x) for f32 kernels, written so that GCC vectorizes the loops that call it (libm's expf is
 * a call per element): Cephes' range reduction x = n ln2 + r, |r| <= ln2 / 2, a degree-6
 * polynomial for e^r and 2^n applied as two exact power-of-two factors, so that results down to
 * the subnormal range (x > -104) round once. At most 1 ulp from glibc's expf (equal for 96% of
 * the normal range, checked exhaustively); exp(+-inf) = inf / 0, NaN stays NaN. The clamps are
 * selects; they vectorize with -fno-trapping-math (set for the library in CMakeLists.txt). */
static inline float dt__expf(float x) {
  x = x > 89.0f ? 89.0f : x; /* NaN passes both clamps */
  x = x < -104.0f ? -104.0f : x;
  float t = x * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: rounds n into the low bits */
  float n = t - 12582912.0f;
  float r = (x - n * 0.693359375f) - n * -2.12194440e-4f; /* ln2 in two parts */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  /* the exponent bits in unsigned arithmetic: a NaN's bits make k anything, and the shifts must
   * not overflow then (the result is NaN through y either way) */
  uint32_t tb, b1, b2;
  memcpy(&tb, &t, sizeof tb);
  int32_t k = (int32_t)(tb - 0x4B400000u), k1 = k >> 1, k2 = k - k1; /* n in [-150, 129] */
  b1 = (uint32_t)(k1 + 127) << 23;
  b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  return y * s1 * s2;
}

/* Row reductions for the f32 kernels, accumulated in double over eight interleaved partial sums
 * (a fixed order, so the same data always gives the same result): a single running sum is a
 * chain of dependent adds that neither runs in parallel nor vectorizes. */
#define DT__SUM8(n, TERM, out)                                                          \
  do {                                                                                  \
    double s0_ = 0.0, s1_ = 0.0, s2_ = 0.0, s3_ = 0.0, s4_ = 0.0, s5_ = 0.0, s6_ = 0.0,  \
           s7_ = 0.0;                                                                   \
    int64_t j_ = 0;                                                                     \
    for (; j_ + 8 <= (n); j_ += 8) {                                                    \
      s0_ += TERM(j_);                                                                  \
      s1_ += TERM(j_ + 1);                                                              \
      s2_ += TERM(j_ + 2);                                                              \
      s3_ += TERM(j_ + 3);                                                              \
      s4_ += TERM(j_ + 4);                                                              \
      s5_ += TERM(j_ + 5);                                                              \
      s6_ += TERM(j_ + 6);                                                              \
      s7_ += TERM(j_ + 7);                                                              \
    }                                                                                   \
    for (; j_ < (n); j_++) s0_ += TERM(j_);                                             \
    (out) = ((s0_ + s4_) + (s1_ + s5_)) + ((s2_ + s6_) + (s3_ + s7_));                  \
  } while (0)

/* sum x[j] and sum x[j] y[j] (products exact in double) over j < n. */
static inline double dt__sum_d(const float* x, int64_t n) {
  double s;
#define DT__TERM_(j) (double)x[j]
  DT__SUM8(n, DT__TERM_, s);
#undef DT__TERM_
  return s;
}
static inline double dt__dot_d(const float* x, const float* y, int64_t n) {
  double s;
#define DT__TERM_(j) ((double)x[j] * y[j])
  DT__SUM8(n, DT__TERM_, s);
#undef DT__TERM_
  return s;
}

/* max of init and x[j], j < n, NaN elements ignored (as fmaxf); eight lanes, so it vectorizes. */
static inline float dt__max_f(const float* x, int64_t n, float init) {
  float m[8];
  for (int k = 0; k < 8; k++) m[k] = init;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; k++) m[k] = x[j + k] > m[k] ? x[j + k] : m[k];
  for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
  for (int k = 1; k < 8; k++) m[0] = m[k] > m[0] ? m[k] : m[0];
  return m[0];
}

/* Elements of a kernel's local tensor. */
static inline int64_t dt__local_numel(const dt_local_tensor_t* t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

/* ---- host kernels named by the op table ----------------------------------------------------- */
#define DT__KERNEL(name) \
  dt_status_t name(const dt_op_call_t* call, const dt_local_tensor_t* in, dt_local_tensor_t* out)
/* kernels_cpu.c */
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
DT__KERNEL(dt__kernel_ne);
DT__KERNEL(dt__kernel_lt);
DT__KERNEL(dt__kernel_le);
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
DT__KERNEL(dt__kernel_abs);
DT__KERNEL(dt__kernel_clamp);
DT__KERNEL(dt__kernel_sin);
DT__KERNEL(dt__kernel_cos);
DT__KERNEL(dt__kernel_reciprocal);
DT__KERNEL(dt__kernel_log1p);
DT__KERNEL(dt__kernel_expm1);
DT__KERNEL(dt__kernel_floor);
DT__KERNEL(dt__kernel_ceil);
DT__KERNEL(dt__kernel_round);
DT__KERNEL(dt__kernel_trunc);
DT__KERNEL(dt__kernel_sign);
DT__KERNEL(dt__kernel_erf);
/* round's 10^|decimals| in the dtype it computes in (kernels_cpu.c; the CUDA kernel's too) */
float dt__round_scale(dt_dtype_t dtype, int64_t decimals);
DT__KERNEL(dt__kernel_sum);
DT__KERNEL(dt__kernel_mean);
DT__KERNEL(dt__kernel_amax);
DT__KERNEL(dt__kernel_amin);
DT__KERNEL(dt__kernel_argmax);
DT__KERNEL(dt__kernel_argmin);
DT__KERNEL(dt__kernel_logsumexp);
DT__KERNEL(dt__kernel_var);
DT__KERNEL(dt__kernel_std);
DT__KERNEL(dt__kernel_prod);
DT__KERNEL(dt__kernel_softmax);
DT__KERNEL(dt__kernel_log_softmax);
DT__KERNEL(dt__kernel_permute);
DT__KERNEL(dt__kernel_transpose);
DT__KERNEL(dt__kernel_t);
DT__KERNEL(dt__kernel_rms_norm);
DT__KERNEL(dt__kernel_layer_norm);
DT__KERNEL(dt__kernel_embedding);
DT__KERNEL(dt__kernel_gather_dim);
DT__KERNEL(dt__kernel_linear);
/* kernels_shape.c */
DT__KERNEL(dt__kernel_view);
DT__KERNEL(dt__kernel_slice);
DT__KERNEL(dt__kernel_narrow);
DT__KERNEL(dt__kernel_cat);
DT__KERNEL(dt__kernel_expand);
/* expand's source steps (in items of x) per output dim of the local shards: x's stride, 0 where
 * out repeats it (a dim x lacks or holds once); DT_ERR_INTERNAL if the shards do not broadcast.
 * Shared by the host and CUDA kernels. */
dt_status_t dt__expand_steps(const dt_op_call_t* call, const dt_local_tensor_t* x,
                             const dt_local_tensor_t* out, int64_t* sst);
DT__KERNEL(dt__kernel_stack);
/* cat's (stack 0) and stack's (1) copy geometry on the local shards: the output dim the inputs are
 * joined along, the elements before it (outer) and after it (inner), and each input's block per
 * outer index (its extent along dim, 1 for stack, times inner). Shared by the host and CUDA
 * kernels. */
void dt__cat_geom(int stack, const dt_op_call_t* call, const dt_local_tensor_t* in,
                  const dt_local_tensor_t* out, int* dim, int64_t* outer, int64_t* inner,
                  int64_t* blk);
DT__KERNEL(dt__kernel_tril);
DT__KERNEL(dt__kernel_index_select);
DT__KERNEL(dt__kernel_triu);
DT__KERNEL(dt__kernel_cumsum);
/* cumsum's local geometry (checked dtypes, the direction, PyTorch's accumulator) and
 * index_select's (the global extent N of dim, the local shard's first index x0 and extent xl along
 * it, the index count L) with the elements before and after dim; and index_select's refusal of
 * a bad index. Shared by the host and CUDA kernels. */
typedef struct {
  int64_t outer, L, inner;
  int rev, is_int, acc_f32; /* acc_f32: bf16 / f16 inputs sum in f32, f32 ones in double */
} dt__cumsum_geom_t;
dt_status_t dt__cumsum_geom(const dt_op_call_t* call, const dt_local_tensor_t* x,
                            const dt_local_tensor_t* out, dt__cumsum_geom_t* g);
typedef struct {
  int dim;
  int64_t N, x0, xl, L, outer, inner;
} dt__index_select_geom_t;
dt_status_t dt__index_select_geom(const dt_op_call_t* call, const dt_local_tensor_t* x,
                                  const dt_local_tensor_t* ix, dt__index_select_geom_t* g);
dt_status_t dt__index_select_bad(const dt__index_select_geom_t* g, int64_t index);
/* The local columns [*lo, *hi) that row `row` (global) of tril (upper 0) or triu (upper 1) keeps,
 * of a shard whose C columns start at global column c0: tril keeps column - row <= k, triu
 * column - row >= k. Shared by the host and CUDA kernels. */
static inline DT__HD void dt__tri_cols(int upper, int64_t k, int64_t row, int64_t c0, int64_t C,
                                int64_t* lo, int64_t* hi) {
  /* kept global columns: tril [0, row + k], triu [row + k, inf); k is clamped so that row + k
   * cannot overflow (rows and columns are below 2^62) */
  const int64_t kk = k > ((int64_t)1 << 62) ? ((int64_t)1 << 62)
                   : k < -((int64_t)1 << 62) ? -((int64_t)1 << 62) : k;
  const int64_t edge = row + kk - c0; /* the diagonal's local column in this row */
  if (upper) {
    *lo = edge < 0 ? 0 : edge > C ? C : edge;
    *hi = C;
  } else {
    *lo = 0;
    *hi = edge + 1 < 0 ? 0 : edge + 1 > C ? C : edge + 1;
  }
}
/* kernels_nn.c */
DT__KERNEL(dt__kernel_addmm);
DT__KERNEL(dt__kernel_add_scalar);
DT__KERNEL(dt__kernel_mul_scalar);
DT__KERNEL(dt__kernel_pow);
DT__KERNEL(dt__kernel_cast);
DT__KERNEL(dt__kernel_where);
DT__KERNEL(dt__kernel_masked_fill);
DT__KERNEL(dt__kernel_sdpa);
DT__KERNEL(dt__kernel_rotary);
DT__KERNEL(dt__kernel_topk);
DT__KERNEL(dt__kernel_gather);
DT__KERNEL(dt__kernel_scatter_add);
/* kernels_optim.c */
DT__KERNEL(dt__kernel_adamw);
DT__KERNEL(dt__kernel_scale_);
DT__KERNEL(dt__kernel_sumsq);
DT__KERNEL(dt__kernel_dropout);
/* kernels_grad.c */
DT__KERNEL(dt__kernel_act_grad);
DT__KERNEL(dt__kernel_rms_norm_grad);
DT__KERNEL(dt__kernel_layer_norm_grad);
DT__KERNEL(dt__kernel_embedding_grad);
DT__KERNEL(dt__kernel_sdpa_grad);
/* kernels_moe.c */
DT__KERNEL(dt__kernel_grouped_mm);
DT__KERNEL(dt__kernel_grouped_mm_wgrad);
DT__KERNEL(dt__kernel_moe_route);
DT__KERNEL(dt__kernel_index_add);
#undef DT__KERNEL

/* ---- backward rules named by the op table (src/ops/backward.c) ------------------------------- */
#define DT__BACKWARD(name) dt_status_t name(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin)
DT__BACKWARD(dt__bw_none);
DT__BACKWARD(dt__bw_mm);
DT__BACKWARD(dt__bw_bmm);
DT__BACKWARD(dt__bw_mm_t);
DT__BACKWARD(dt__bw_addmm);
DT__BACKWARD(dt__bw_linear);
DT__BACKWARD(dt__bw_add);
DT__BACKWARD(dt__bw_sub);
DT__BACKWARD(dt__bw_mul);
DT__BACKWARD(dt__bw_div);
DT__BACKWARD(dt__bw_maximum);
DT__BACKWARD(dt__bw_minimum);
DT__BACKWARD(dt__bw_neg);
DT__BACKWARD(dt__bw_relu);
DT__BACKWARD(dt__bw_exp);
DT__BACKWARD(dt__bw_log);
DT__BACKWARD(dt__bw_sqrt);
DT__BACKWARD(dt__bw_rsqrt);
DT__BACKWARD(dt__bw_gelu);
DT__BACKWARD(dt__bw_silu);
DT__BACKWARD(dt__bw_sigmoid);
DT__BACKWARD(dt__bw_tanh);
DT__BACKWARD(dt__bw_abs);
DT__BACKWARD(dt__bw_clamp);
DT__BACKWARD(dt__bw_sin);
DT__BACKWARD(dt__bw_cos);
DT__BACKWARD(dt__bw_reciprocal);
DT__BACKWARD(dt__bw_log1p);
DT__BACKWARD(dt__bw_expm1);
DT__BACKWARD(dt__bw_zero);
DT__BACKWARD(dt__bw_erf);
DT__BACKWARD(dt__bw_add_scalar);
DT__BACKWARD(dt__bw_mul_scalar);
DT__BACKWARD(dt__bw_pow);
DT__BACKWARD(dt__bw_where);
DT__BACKWARD(dt__bw_masked_fill);
DT__BACKWARD(dt__bw_cast);
DT__BACKWARD(dt__bw_dropout);
DT__BACKWARD(dt__bw_sum);
DT__BACKWARD(dt__bw_mean);
DT__BACKWARD(dt__bw_amax);
DT__BACKWARD(dt__bw_amin);
DT__BACKWARD(dt__bw_logsumexp);
DT__BACKWARD(dt__bw_var);
DT__BACKWARD(dt__bw_std);
DT__BACKWARD(dt__bw_prod);
DT__BACKWARD(dt__bw_softmax);
DT__BACKWARD(dt__bw_log_softmax);
DT__BACKWARD(dt__bw_rms_norm);
DT__BACKWARD(dt__bw_layer_norm);
DT__BACKWARD(dt__bw_embedding);
DT__BACKWARD(dt__bw_gather_dim);
DT__BACKWARD(dt__bw_sdpa);
DT__BACKWARD(dt__bw_rotary);
DT__BACKWARD(dt__bw_view);
DT__BACKWARD(dt__bw_permute);
DT__BACKWARD(dt__bw_transpose);
DT__BACKWARD(dt__bw_t);
DT__BACKWARD(dt__bw_slice);
DT__BACKWARD(dt__bw_cat);
DT__BACKWARD(dt__bw_expand);
DT__BACKWARD(dt__bw_stack);
DT__BACKWARD(dt__bw_tril);
DT__BACKWARD(dt__bw_index_select);
DT__BACKWARD(dt__bw_cumsum);
DT__BACKWARD(dt__bw_topk);
DT__BACKWARD(dt__bw_gather);
DT__BACKWARD(dt__bw_scatter_add);
DT__BACKWARD(dt__bw_cross_entropy);
DT__BACKWARD(dt__bw_redistribute);
DT__BACKWARD(dt__bw_grouped_mm);
DT__BACKWARD(dt__bw_index_add);
DT__BACKWARD(dt__bw_to_local);
DT__BACKWARD(dt__bw_from_local);
DT__BACKWARD(dt__bw_all_to_all_single);
DT__BACKWARD(dt__bw_ring_attention); /* src/ops/ring_attention.c */
DT__BACKWARD(dt__bw_all_gather_linear); /* src/ops/tp_overlap.c */
DT__BACKWARD(dt__bw_linear_reduce_scatter);
#undef DT__BACKWARD

/* ---- composite ops (src/ops/loss.c, src/ops/dispatch.c, src/ops/local.c) ------------------ */
#define DT__COMPOSITE(name)                                                                    \
  dt_status_t name(int n_in, const dt_tensor_t* in, int n_iargs, const int64_t* iargs,         \
                   int n_fargs, const double* fargs, dt_tensor_t* out, dt_tensor_t* saved)
DT__COMPOSITE(dt__cross_entropy_fwd);
DT__COMPOSITE(dt__redistribute_fwd);
DT__COMPOSITE(dt__to_local_fwd);        /* src/ops/local.c */
DT__COMPOSITE(dt__from_local_fwd);
DT__COMPOSITE(dt__all_to_all_single_fwd);
DT__COMPOSITE(dt__ring_attention_fwd); /* src/ops/ring_attention.c */
DT__COMPOSITE(dt__all_gather_linear_fwd); /* src/ops/tp_overlap.c */
DT__COMPOSITE(dt__linear_reduce_scatter_fwd);
/* Helpers of composite ops (src/ops/tp_overlap.c): x at placements pl (x itself, *owned NULL, or
 * a redistributed copy, *owned); x as dtype `to` element by element with its placements kept
 * (the cast op would reduce a Partial x first: cast is not linear), itself or a converted copy
 * (*owned); x as f32; *t converted in place of itself (the old tensor freed). */
dt_status_t dt__op_move_to(dt_tensor_t x, const dt_placement_t* pl, dt_tensor_t* y,
                           dt_tensor_t* owned);
dt_status_t dt__op_convert(dt_tensor_t x, dt_dtype_t to, dt_tensor_t* y, dt_tensor_t* owned);
dt_status_t dt__op_as_f32(dt_tensor_t x, dt_tensor_t* y, dt_tensor_t* owned);
dt_status_t dt__op_cast_in_place(dt_tensor_t* t, dt_dtype_t to);
#undef DT__COMPOSITE

/* Cross-entropy of logits (N, C) against targets (N) (src/ops/loss.c): the op's arguments, read
 * from its iargs and fargs with the schema's defaults; *saved (may be NULL) gets the row max and
 * log-sum [m, log(s)] (N, 2), with ignore_index (N, 3) [m, log(s), the row's weight in the loss],
 * which the backward pass reuses. dt__ce_targets: the rows counted (targets != ignore, f32 0/1)
 * and (safe may be NULL) the targets with ignored rows at class 0, element-wise without a
 * collective. */
typedef struct {
  int64_t reduction, ignore_index;
  double label_smoothing;
} dt__ce_args_t;
dt__ce_args_t dt__ce_args(int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs);
dt_status_t dt__ce_targets(dt_tensor_t targets, int64_t ignore, dt_tensor_t* valid,
                           dt_tensor_t* safe);
dt_status_t dt__cross_entropy(dt_tensor_t logits, dt_tensor_t targets, const dt__ce_args_t* a,
                              dt_tensor_t* loss, dt_tensor_t* saved);

/* The kernel's view of a tensor's local shard (src/ops/dispatch.c). */
void dt__tensor_local_view(dt_tensor_t x, dt_local_tensor_t* v);

/* ---- helpers shared by kernels ---------------------------------------------------------------- */
/* Attention probabilities of rn query rows (global positions q0 ..) over kn keys, in p (rows ld
 * floats apart): softmax(scale q k^T) row by row, with `causal` row i sees keys 0 .. q0 + i and
 * the rest of its kn are 0; q rows lq apart, k rows lk apart, D features (0: uniform rows).
 * Shared by sdpa and sdpa_grad. */
dt_status_t dt__attn_block_probs(dt_backend_t bk, const float* q, int lq, const float* k, int lk,
                                 int64_t rn, int64_t kn, int64_t D, double scale, float* p,
                                 int64_t ld, int64_t q0, int causal);
/* Attention on the host runs in blocks of this many query rows (scratch: a block's scores, not
 * the S x T matrix); under a causal mask each block goes over the keys its last row sees
 * (0 .. q0 + last row): the masked upper triangle is neither scored nor multiplied. */
#define DT_ATTN_ROW_BLOCK 64
/* Query rows of a block of sdpa / sdpa_grad on the host for S rows. */
static inline int64_t dt__attn_row_block(int64_t S) {
  return S < DT_ATTN_ROW_BLOCK ? S : DT_ATTN_ROW_BLOCK;
}
/* Keys that rows i0 .. i0 + rn - 1 of a query shard starting at q0 see among T (all T unless
 * causal). */
static inline int64_t dt__attn_keys_seen(int causal, int64_t q0, int64_t i0, int64_t rn, int64_t T) {
  const int64_t n = causal ? q0 + i0 + rn : T;
  return n < T ? n : T;
}
/* Query-key pairs the host kernel scores for S query rows (global positions q0 ..) over T keys:
 * S x T, or under a causal mask each block of rows up to the keys its last row sees. The
 * compute model's count of attention's work (src/ops/flops.c). */
static inline double dt__attn_pairs(int causal, int64_t q0, int64_t S, int64_t T) {
  if (!causal) return (double)S * (double)T;
  const int64_t rb = dt__attn_row_block(S);
  double n = 0.0;
  for (int64_t i0 = 0; i0 < S; i0 += rb) {
    const int64_t rn = S - i0 < rb ? S - i0 : rb;
    n += (double)rn * (double)dt__attn_keys_seen(causal, q0, i0, rn, T);
  }
  return n;
}
/* Attention operand geometry for layout 0 (B, H, S, D) or 1 (B, S, H, D): heads, sequence length,
 * feature size; and the offset of the (b, h) matrix (its row stride is feat, or heads * feat). */
void dt__attn_geom(const dt_local_tensor_t* t, int layout, int64_t* heads, int64_t* seq,
                   int64_t* feat);
int64_t dt__attn_base(int layout, int64_t b, int64_t h, int64_t heads, int64_t seq, int64_t feat);
/* ---- ring attention's block kernels (src/ops/kernels_ring.c; the backend's memory) ----------
 * Geometry of one rank's operands: q and o (B, H, S, D|E), k and v buffers (B, G, T, D|E) in
 * layout 0 or (B, S|T, H|G, D|E) in layout 1; per-row arrays (m, l, lse, d) are (B, H, S).
 * dt: the dtype q, k, v (backward: o and its gradient too) reach the blocks in: f32, or bf16/f16
 * where the backend's fused kernels take them as stored (tensor cores); the running output, the
 * per-row arrays and the gradients the blocks accumulate are f32 either way. */
typedef struct dt__ring_geom {
  dt_backend_t bk;
  int layout;
  int64_t B, H, G, D, E, S, T;
  double scale;
  dt_dtype_t dt;
} dt__ring_geom_t;
/* Scratch floats' bytes that one block call of C x C pairs needs (forward or backward; 0 where
 * the backend's fused kernels take the blocks). */
size_t dt__ring_block_scratch(const dt__ring_geom_t* g, int64_t C);
/* Query rows qr..qr+C of q against key/value rows kr..kr+C (diag: the causal diagonal block, key
 * j visible to query i when j <= i; else every pair), merged into the running unnormalized o and
 * the rows' running max m (start at -inf) and sum l (start at 0). */
dt_status_t dt__ring_block_fwd(const dt__ring_geom_t* g, const void* q, const void* k,
                               const void* v, int64_t qr, int64_t kr, int64_t C, int diag,
                               float* o, float* m, float* l, float* scratch);
/* o /= l and lse = m + log l (rows without a visible key: o 0, lse -inf). */
dt_status_t dt__ring_finish(const dt__ring_geom_t* g, float* o, const float* m, const float* l,
                            float* lse);
/* d = rowsum(o * go) per (b, h, s): the backward's softmax correction (o, go of g->dt). */
dt_status_t dt__ring_rowdot(const dt__ring_geom_t* g, const void* o, const void* go, float* d);
/* The block's gradients from the output gradient go, the rows' lse and d: dq (q's geometry) and
 * dk, dv (the buffers' rows kr..) accumulated. */
dt_status_t dt__ring_block_bwd(const dt__ring_geom_t* g, const void* q, const void* k,
                               const void* v, const void* go, const float* lse, const float* dd,
                               int64_t qr, int64_t kr, int64_t C, int diag, float* dq, float* dk,
                               float* dv, float* scratch);
/* The row-wise steps between a block's products, on one backend's memory (f32; the products go
 * through the backend's GEMM): the host loops of kernels_ring.c for host memory, CUDA kernels
 * for the cuda backends (src/ops/cuda/ring.cu). A block of C query rows is computed in chunks
 * of row_block rows (0: all C at once): p and dp hold one (batch, head) slab's chunk, `rows`
 * rows of `cols` scores, ld apart; key j is visible to row i of the chunk when d0 < 0 (a full
 * block) or j <= d0 + i (the causal diagonal block, d0 the chunk's first row in it); per-row
 * arrays (m, l, mb, lb, lse, dd) start at the chunk's first row. */
typedef struct dt__ring_rows {
  int64_t row_block;
  /* p's visible scores -> exp(score - rowmax), the rest 0; mb, lb: each row's max and sum */
  dt_status_t (*softmax)(dt_backend_t b, float* p, int64_t rows, int64_t cols, int64_t ld,
                         int64_t d0, float* mb, float* lb);
  /* o rows (lo apart) = o a + t c, l = l a + lb c, m = max(m, mb), a and c rescaling both to
   * the new max; t: rows x E */
  dt_status_t (*merge)(dt_backend_t b, float* o, int64_t lo, const float* t, int64_t E,
                       int64_t rows, float* m, float* l, const float* mb, const float* lb);
  /* dt__ring_finish and dt__ring_rowdot over every row of g */
  dt_status_t (*finish)(dt_backend_t b, const dt__ring_geom_t* g, float* o, const float* m,
                        const float* l, float* lse);
  dt_status_t (*rowdot)(dt_backend_t b, const dt__ring_geom_t* g, const void* o,
                        const void* go, float* d);
  /* p's visible scores -> exp(score - lse) (lse -inf: 0), the rest 0 */
  dt_status_t (*probs)(dt_backend_t b, float* p, int64_t rows, int64_t cols, int64_t ld,
                       int64_t d0, const float* lse);
  /* dp = p (dp - dd) per row */
  dt_status_t (*dscore)(dt_backend_t b, float* dp, const float* p, int64_t rows, int64_t cols,
                        int64_t ld, const float* dd);
  /* Whole blocks of dt__ring_block_fwd / dt__ring_block_bwd (every (batch, head), no scratch)
   * in fused kernels: `fused` (NULL where there are none) says whether they take blocks of C
   * rows of g with inputs of g->dt, forward and backward alike; otherwise (f32 only) the
   * products and the steps above run. */
  int (*fused)(const dt__ring_geom_t* g, int64_t C);
  dt_status_t (*block_fwd)(const dt__ring_geom_t* g, const void* q, const void* k,
                           const void* v, int64_t qr, int64_t kr, int64_t C, int diag, float* o,
                           float* m, float* l);
  dt_status_t (*block_bwd)(const dt__ring_geom_t* g, const void* q, const void* k,
                           const void* v, const void* go, const float* lse, const float* dd,
                           int64_t qr, int64_t kr, int64_t C, int diag, float* dq, float* dk,
                           float* dv);
} dt__ring_rows_t;
/* The table for backend b's memory (host loops for host and meta backends). */
const dt__ring_rows_t* dt__ring_rows_for(dt_backend_t b);
const dt__ring_rows_t* dt__cuda_ring_rows(void);
const dt__ring_rows_t* dt__cudaemu_ring_rows(void);
#define DT_MAX_RANKS_CP 1024 /* ranks along the cp dim */

/* ---- rings over one mesh dim (src/ops/kernels_ring.c): ring attention and the overlapped
 * tensor-parallel linears (src/ops/tp_overlap.c) pass shards around the ranks of a mesh dim with
 * point-to-point pairs posted before a step's compute and completed after it. They compute in
 * f32; what travels is in the dtype the caller names (ring attention's k and v in their own). */
typedef struct dt__ring_link {
  dt_mesh_t mesh;
  int dim;
  struct dt_comm* comm;
  int n, r;         /* ranks along the dim, this rank's coordinate */
  int sim;          /* the meta backend: nothing to compute or move */
  int stage;        /* a device backend whose data plane is MPI: the shards staged through host
                     * memory and computed there (over NCCL they stay in device memory) */
  dt_backend_t dev; /* the tensors' backend */
  dt_backend_t bk;  /* where the ring computes: dev, or the host's when staged */
} dt__ring_link_t;
/* The ring of mesh dim `dim` (collective over the mesh for a device backend: it decides the data
 * plane). `op` names the caller in messages. */
dt_status_t dt__ring_link_init(dt_mesh_t mesh, int dim, const char* op, dt__ring_link_t* l);
/* One exchange in flight: up to two pairs (send to r + 1, receive from r - 1), counted as one
 * send_recv call; simulated, the time it ends on the simulated clock. */
typedef struct dt__ring_xfer {
  int npairs;
  dt_comm_req_t req[4];
  double end;
} dt__ring_xfer_t;
/* Starts an exchange of count[i] elements of `dtype` of send[i] to r + 1 and of rcount[i] from
 * r - 1 into recv[i] (i < npairs <= 2; rcount NULL: count), the pairs one group (NCCL issues
 * them together at its end). The bytes sent are counted. */
dt_status_t dt__ring_xfer_start(const dt__ring_link_t* l, dt__ring_xfer_t* x, int npairs,
                                const void* const* send, void* const* recv, const int64_t* count,
                                const int64_t* rcount, dt_dtype_t dtype);
/* n elements of dtype `from` at src as dtype `to`, in the ring's computing memory: src itself
 * when the dtypes agree, else converted into `work` (n elements of `to`; simulated: not
 * converted). */
dt_status_t dt__ring_as(const dt__ring_link_t* l, const void* src, dt_dtype_t from, dt_dtype_t to,
                        int64_t n, void* work, const void** out);
/* The modeled time of such a conversion (read in `from`, written in `to`; 0 when they agree). */
double dt__ring_conv_us(dt_dtype_t from, dt_dtype_t to, int64_t n);
/* Completes an exchange (simulated: waits until its end); the first failure is returned. */
dt_status_t dt__ring_xfer_finish(const dt__ring_link_t* l, dt__ring_xfer_t* x);
/* Scratch of a ring call in the computing backend's memory, from its storage pool (a ring runs
 * every layer and step: fresh blocks would fault in their pages each time), counted as "other"
 * memory at the size asked for (the meta backend hands out addresses only); freed together. */
#define DT_RING_MAX_BUFS 24 /* the staged half backward takes 20 */
typedef struct dt__ring_mem {
  dt_backend_t b;
  void* p[DT_RING_MAX_BUFS];
  size_t nb[DT_RING_MAX_BUFS];  /* asked for (counted) */
  size_t got[DT_RING_MAX_BUFS]; /* handed out (what the pool takes back) */
  int n;
} dt__ring_mem_t;
/* nbytes of scratch (zeroed when `zero`); NULL when out of memory or slots. */
float* dt__ring_mem_alloc(dt__ring_mem_t* mm, size_t nbytes, int zero);
void dt__ring_mem_free(dt__ring_mem_t* mm);
/* A tensor's local shard where the ring computes: its own memory, or (staged) a host copy in mm
 * (copied in when `in`); *ok cleared when the copy could not be made. */
void* dt__ring_mem_host(const dt__ring_link_t* l, dt__ring_mem_t* mm, const dt_local_tensor_t* t,
                        int in, int* ok);
/* Staged: the host result h back into the tensor's memory (else nothing to do). */
dt_status_t dt__ring_mem_out(const dt__ring_link_t* l, const dt_local_tensor_t* t, const void* h);

enum { DT_RING_AUTO = 0, DT_RING_RING = 1, DT_RING_GATHER = 2 };

/* One ring_attention call (src/ops/ring_attention.c sets the arguments and placements,
 * dt__ring_setup the local geometry and the cp group; kernels_ring.c runs it). */
typedef struct dt__ring_call {
  int dim, causal, layout, balanced, algo, hd, sd;
  double scale;
  dt_mesh_t mesh;
  dt_placement_t pl[DT_MAX_MESH_DIMS];     /* q, k, v and o */
  dt_placement_t lse_pl[DT_MAX_MESH_DIMS]; /* the (B, H, S) log-sum-exp */
  dt__ring_link_t link; /* the cp dim's ring */
  int m;       /* chunks per rank (2 balanced, else 1) */
  int64_t C;   /* rows per chunk */
  int64_t nk, nv; /* local numel of k and v */
  dt_dtype_t kvt;  /* q, k and v's dtype: what k and v's shards travel in (g.dt: the blocks') */
  dt__ring_geom_t g;
} dt__ring_call_t;
/* The local geometry of q, k, v's shards and the cp group's communicator. */
dt_status_t dt__ring_setup(dt__ring_call_t* a, const dt_local_tensor_t* q,
                           const dt_local_tensor_t* k, const dt_local_tensor_t* v);
/* Forward over the ring (or the all-gather): o (q's layout, E features) and the rows' lse. */
dt_status_t dt__ring_forward(const dt__ring_call_t* a, const dt_local_tensor_t* q,
                             const dt_local_tensor_t* k, const dt_local_tensor_t* v,
                             const dt_local_tensor_t* o, const dt_local_tensor_t* lse);
/* Backward: dq, dk, dv from the output o, its gradient go and the saved lse. */
dt_status_t dt__ring_backward(const dt__ring_call_t* a, const dt_local_tensor_t* q,
                              const dt_local_tensor_t* k, const dt_local_tensor_t* v,
                              const dt_local_tensor_t* o, const dt_local_tensor_t* go,
                              const dt_local_tensor_t* lse, const dt_local_tensor_t* dq,
                              const dt_local_tensor_t* dk, const dt_local_tensor_t* dv);
/* Bytes of scores the host attention kernel of op `id` (sdpa: S x T floats; sdpa_grad: 2 S x T)
 * allocates for one call on these local inputs; 0 when it allocates none, and for other ops. The
 * kernels size their scratch with it, and dispatch counts it for the meta backend (a simulated
 * run holds what the real kernel would). */
size_t dt__kernel_scratch_nbytes(int id, const dt_op_call_t* call, const dt_local_tensor_t* in);
/* src/ops/flops.c: the matrix-product FLOPs of op `id` on these local shards (0 for the others),
 * and the simulated time of its kernel in microseconds under the compute model (its FLOPs and
 * its bytes read and written: *flops and *nbytes, the bytes of the ops without FLOPs; `converts`:
 * the kernel computes in f32 on copies of bf16/f16 operands, whose bytes count too). */
double dt__op_flops(int id, const dt_op_call_t* call, const dt_local_tensor_t* in,
                    const dt_local_tensor_t* out);
double dt__op_sim_us(int id, const dt_op_call_t* call, const dt_local_tensor_t* in, int n_in,
                     const dt_local_tensor_t* out, int n_out, int converts, double* flops,
                     double* nbytes);
/* The compute model's rate of attention's FLOPs (GFLOP/s): attn_gflops, or where that is 0 the
 * GEMM rate of its operands (bf16: any of them bf16). */
double dt__attn_gflops(int bf16);

#endif

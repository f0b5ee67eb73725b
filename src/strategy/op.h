/* op.h - the op table: one descriptor per op, indexed by op id.
 *
 * Every built-in op is one row of DT_OP_LIST (src/strategy/op_list.h): its id, name, arity,
 * named argument schema, rule generator, per-mesh check, backward rule, flags, host kernel and,
 * for ops composed from other ops, the composite forward. The enum below and the table in
 * src/ops/op_table.c are both generated from that list, so adding an op is a one-row edit that
 * fails to compile when a column is missing or names a function that does not exist.
 *
 * The table is data defined by the ops layer (its rows name kernels and backward rules); this
 * layer declares and reads it through dt__op_info(). Host-registered ops (dt_op_register) get
 * ids from DT_OP_COUNT on; registering a built-in's name overrides that built-in's rules and
 * kernel for every caller.
 */
#ifndef DT_STRATEGY_OP_H
#define DT_STRATEGY_OP_H

#include "dtensor/ops.h"
#include "internal/common.h"
#include "strategy/op_list.h"

/* Built-in op ids. */
typedef enum dt_op_id {
#define DT__OP_ENUM(id, ...) DT_OP_##id,
  DT_OP_LIST(DT__OP_ENUM)
#undef DT__OP_ENUM
  DT_OP_COUNT
} dt_op_id_t;

#define DT_OP_HOST_MAX 192 /* host-registered ops (ids DT_OP_COUNT ..) */

/* Flags of an op. */
enum {
  DT_OPF_ANY_DTYPE = 1u << 0,  /* the kernel moves bytes or handles its dtypes itself: no f32
                                  conversion of bf16/f16 storage around it */
  DT_OPF_WRITES_ALL = 1u << 1, /* the kernel writes every element of its outputs: no zero fill */
  DT_OPF_RECOMPUTE = 1u << 2,  /* cheap: the default checkpoint policy recomputes its outputs */
  DT_OPF_NO_GRAD = 1u << 3,    /* not differentiable on purpose (no backward rule) */
  DT_OPF_VARIADIC = 1u << 4,   /* takes 1 to DT_OP_MAX_INPUTS inputs (n_in is the maximum) */
  DT_OPF_VIEW = 1u << 5,       /* the local output is the input's local elements in order: the
                                  output aliases the input's storage (no kernel runs) */
  DT_OPF_CUT = 1u << 6,        /* slice/narrow: the output aliases the input's storage when its
                                  local elements are one contiguous run */
  DT_OPF_CHECKS_DATA = 1u << 7, /* the kernel may reject input values (an index out of range, a
                                   value no integer holds) that only some ranks hold: its status
                                   is agreed over the mesh before the op returns */
  DT_OPF_MESHES = 1u << 8,      /* its inputs may live on different meshes over the same ranks
                                   (from_local: the output is on `like`'s mesh) */
  DT_OPF_INT_TO_FLOAT = 1u << 9, /* with DT_OPF_PROMOTES_IN: an integer result dtype becomes f32
                                    (div: PyTorch's true division of integers; logsumexp; the
                                    float unary ops, DT__F0 of op_list.h) */
};
/* In-place ops (the optimizer's update, gradient scaling) write some of their inputs: bit 16 + i
 * marks input i. Such an input never moves (candidates that would move it are dropped, so its
 * placements must be what the op computes from), must not share storage with another input, and
 * the op is DT_OPF_NO_GRAD and DT_OPF_ANY_DTYPE (its kernel writes the storage it is given). */
#define DT_OPF_WRITES_IN(i) (1u << (16 + (i)))
#define DT_OPF_WRITES_MASK (0xffu << 16)
/* Type promotion (PyTorch's TensorIterator with a common dtype: add, sub, mul, div, maximum,
 * minimum, eq, ge, gt, and where's values): bit 24 + i marks input i as one of the operands that
 * share the result dtype of dt__op_result_dtype. Operands of another dtype are cast to it first
 * (dispatch: plain casts; the tape: recorded cast nodes), so the op itself always sees one dtype;
 * ops without these bits refuse mixed dtypes in their rules. */
#define DT_OPF_PROMOTES_IN(i) (1u << (24 + (i)))
#define DT_OPF_PROMOTES_MASK (0xffu << 24)

/* 1 when the operands `flags` marks as promoting do not all have one dtype, or are integers of an
 * op that computes them in floats (then dt__op_result_dtype names the dtype they are cast to).
 * The test of every dispatch of such an op: a few dtype compares. */
static inline int dt__op_mixed_dtypes(unsigned flags, int n, const dt_tensor_meta_t* in) {
  const unsigned m = (flags & DT_OPF_PROMOTES_MASK) >> 24;
  int first = -1;
  for (int t = 0; t < n && (m >> t) != 0; t++) {
    if (!((m >> t) & 1u)) continue;
    if (first < 0) first = t;
    else if (in[t].dtype != in[first].dtype) return 1;
  }
  /* one integer dtype where the op computes in floats (div) */
  return first >= 0 && (flags & DT_OPF_INT_TO_FLOAT) && !dt__dtype_is_float(in[first].dtype);
}
/* PyTorch's c10::promoteTypes over this library's dtypes: the same dtype stays; two different
 * float types give f32 (bf16 with f16 too: neither holds the other); an integer with a float
 * gives the float; i32 with i64 gives i64. */
dt_dtype_t dt__promote_types(dt_dtype_t a, dt_dtype_t b);
/* The dtype the promoting operands of a call of an op with `flags` compute in, as PyTorch's
 * torch.result_type: the promotion over the operands with at least one dim; a 0-dim operand
 * changes it only when it is of a higher category (a float 0-dim with integer operands: their
 * promotion, i.e. the float type); all of them 0-dim: the promotion over them all. Returns 1 when
 * some promoting operand has another dtype (it needs a cast), else 0. */
int dt__op_result_dtype(unsigned flags, int n, const dt_tensor_meta_t* in, dt_dtype_t* out);
/* The dtype of torch.sum of a tensor of `dtype`: integers (i32, i64) sum to i64, floats keep
 * their dtype. The sum rules (rules.c) set it; the kernels read it from their output. */
dt_dtype_t dt__sum_dtype(dt_dtype_t dtype);
/* A call of op `id` as it runs: its promoting operands' dtypes set to the result dtype
 * (dt_op_select and dt_op_candidates describe the op on the cast operands). */
void dt__op_call_promote(int id, dt_op_call_t* call);

/* The context a backward rule sees: the forward's inputs and outputs (values), which inputs need
 * a gradient, the arguments and what the forward saved. */
typedef struct dt_grad_ctx {
  int op;
  int n_in, n_out;
  dt_tensor_t in[DT_OP_MAX_INPUTS];
  dt_tensor_t out[DT_OP_MAX_OUTPUTS];
  int needs[DT_OP_MAX_INPUTS];
  int n_iargs, n_fargs;
  const int64_t* iargs;
  const double* fargs;
  dt_tensor_t saved; /* a forward by-product (cross_entropy: the row logsumexp) or NULL */
} dt_grad_ctx_t;

/* Computes the input gradients gin[] (new tensors, NULL where none) from the output gradients
 * gout[] (NULL where none). A rule may take over gout[o] (it then sets gout[o] to NULL). */
typedef dt_status_t (*dt_backward_fn)(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin);
/* Forward of an op composed from other ops (no rules, no kernel): runs the pieces and returns the
 * outputs; *saved (may be NULL) gets a by-product for the backward rule. */
typedef dt_status_t (*dt_composite_fn)(int n_in, const dt_tensor_t* in, int n_iargs,
                                       const int64_t* iargs, int n_fargs, const double* fargs,
                                       dt_tensor_t* out, dt_tensor_t* saved);
/* A built-in op's check of one expanded candidate on a concrete mesh: 0 drops it. Rules are
 * written for one mesh dim without its size; where exactness depends on how the chunk rule
 * splits uneven dims (a reshape moving a shard boundary, grouped-query heads), the check decides
 * per mesh. */
typedef int (*dt_op_check_fn)(dt_mesh_t mesh, const dt_op_call_t* call, const dt_op_choice_t* c);

/* One named non-tensor argument. Integer arguments fill iargs in schema order, scalars fargs; a
 * list takes every remaining iarg. */
typedef struct dt_op_arg {
  char name[24];
  dt_arg_kind_t kind;
  int required;    /* must be given */
  int has_default; /* else optional with an op-computed default (absent) */
  double def;
} dt_op_arg_t;

typedef struct dt_op_info {
  const char* name;
  int n_in, n_out; /* n_in: inputs (the maximum with DT_OPF_VARIADIC) */
  const char* args; /* schema spec: "keepdim=0, dim:l" (see dt__op_schema) */
  dt_op_rules_fn rules;
  dt_op_check_fn check;       /* NULL: none */
  dt_backward_fn backward;    /* NULL with DT_OPF_NO_GRAD, or for host ops */
  unsigned flags;
  dt_op_kernel_fn kernel[DT_DEVICE_COUNT]; /* NULL: no kernel for that device */
  dt_composite_fn composite;  /* non-NULL: forward composed from other ops */
} dt_op_info_t;

/* The built-in table (src/ops/op_table.c). */
extern const dt_op_info_t dt__op_table[DT_OP_COUNT];

/* Descriptor of op `id` (built-in, possibly overridden by the host, or host-registered); NULL for
 * an id out of range. */
const dt_op_info_t* dt__op_info(int id);
/* Id of the op called `name`, or -1 (no message). */
int dt__op_find(const char* name);
/* Id of `name`, or DT_ERR_UNSUPPORTED "unknown op 'NAME': did you mean ...?" (the PyTorch
 * equivalent for common PyTorch names, else the closest names by edit distance). */
dt_status_t dt__op_resolve(const char* name, int* id);
/* Parsed argument schema of op `id` (at most DT_OP_MAX_IARGS + DT_OP_MAX_FARGS entries). */
dt_status_t dt__op_schema(int id, const dt_op_arg_t** args, int* n);
/* Scalar argument k of a call of built-in op `id` (counting scalars only): the given value, else
 * the schema's default (NaN when it has none). Rules and kernels read defaults this way, so the
 * schema is their one source; the _n form takes the arguments as composites and backward rules
 * hold them. */
double dt__op_farg(int id, const dt_op_call_t* call, int k);
double dt__op_farg_n(int id, int n_fargs, const double* fargs, int k);
/* Integer argument k of a call of built-in op `id` (counting the integer arguments only: ints,
 * dtypes, then a list's items): the given value, else the schema's default, else
 * DT_OP_IARG_NONE (a required argument the caller checked, an optional one whose default the op
 * computes, a list item). Rules, host kernels, CUDA kernels and backward rules read integer
 * defaults this way, so the schema is their one source. The _n form takes the arguments as
 * composites and backward rules hold them. C-callable (the CUDA kernels use it). */
#define DT_OP_IARG_NONE INT64_MIN
int64_t dt__op_iarg(int id, const dt_op_call_t* call, int k);
int64_t dt__op_iarg_n(int id, int n_iargs, const int64_t* iargs, int k);


/* Context parallelism's load-balanced order (dt_cp_position, dtensor/ops.h): the token at index
 * `index` of a sequence of `seq` tokens (a multiple of 2 cp) split into 2 cp chunks of which rank
 * r holds chunks r and 2 cp - 1 - r, in that order; its real position. cp <= 0: the index. Host
 * and device code (rotary's angle table). */
#if defined(__CUDACC__)
#define DT__HOST_DEVICE __host__ __device__
#else
#define DT__HOST_DEVICE
#endif
static inline DT__HOST_DEVICE int64_t dt__cp_position(int64_t index, int64_t seq, int64_t cp) {
  if (cp <= 0 || seq <= 0) return index;
  const int64_t c = seq / (2 * cp), k = index / c, r = k / 2;
  return ((k % 2 == 0) ? r : 2 * cp - 1 - r) * c + index % c;
}

#endif

/* op_specs.h - one small valid call per op of the table (inputs and required arguments), shared
 * by test_op_defaults.c (each op with and without its defaults written out) and
 * test_op_mutations.c (each call mutated into bad input). An op without a row fails
 * test_op_defaults, so a new op gets one. */
#ifndef DT_TESTS_OP_SPECS_H
#define DT_TESTS_OP_SPECS_H

#include <string.h>

#include "dt_test.h"

enum { F_VAL = 0, F_POS, F_IDX, F_ONEHALF, F_CONST, F_ZERO };

typedef struct {
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[4];
  int fill;      /* F_*: values, positive values, indices in [0, arg), 0/1, the constant arg */
  int64_t arg;   /* F_IDX: the bound; F_CONST: the value */
  int world_dim; /* > 0: shape[0] is this many rows per rank (all_to_all_single) */
} in_t;

typedef struct {
  const char* op;
  int n_in;
  in_t in[5];
  const char* req[4]; /* the required arguments, "NAME=VALUE" */
} spec_t;

#define F32(...) {DT_F32, __VA_ARGS__}
#define T2(a, b) 2, {a, b}
#define T1(a) 1, {a}
#define T3(a, b, c) 3, {a, b, c}
#define T4(a, b, c, d) 4, {a, b, c, d}

/* clang-format off */
static const spec_t kSpecs[] = {
  {"mm", 2, {{DT_F32, T2(4, 3), F_VAL, 0, 0}, {DT_F32, T2(3, 5), F_VAL, 0, 0}}, {NULL}},
  {"bmm", 2, {{DT_F32, T3(2, 3, 4), F_VAL, 0, 0}, {DT_F32, T3(2, 4, 5), F_VAL, 0, 0}}, {NULL}},
  {"mm_t", 2, {{DT_F32, T2(3, 4), F_VAL, 0, 0}, {DT_F32, T2(3, 5), F_VAL, 0, 0}}, {NULL}},
  {"addmm", 3, {{DT_F32, T2(4, 5), F_VAL, 0, 0}, {DT_F32, T2(4, 3), F_VAL, 0, 0},
                {DT_F32, T2(3, 5), F_VAL, 0, 0}}, {NULL}},
  {"linear", 3, {{DT_F32, T2(4, 3), F_VAL, 0, 0}, {DT_F32, T2(5, 3), F_VAL, 0, 0},
                 {DT_F32, T1(5), F_VAL, 0, 0}}, {NULL}},
  {"linear_nobias", 2, {{DT_F32, T2(4, 3), F_VAL, 0, 0}, {DT_F32, T2(5, 3), F_VAL, 0, 0}}, {NULL}},
  {"grouped_mm", 3, {{DT_F32, T2(6, 3), F_VAL, 0, 0}, {DT_F32, T3(2, 4, 3), F_VAL, 0, 0},
                     {DT_I64, T1(2), F_CONST, 3, 0}}, {NULL}},
  {"add", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"sub", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"mul", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"div", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"maximum", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"minimum", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"eq", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"ge", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"gt", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"ne", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"lt", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"le", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"neg", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"relu", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"exp", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"log", 1, {{DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"sqrt", 1, {{DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"rsqrt", 1, {{DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"gelu", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"silu", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"sigmoid", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"tanh", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"abs", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"clamp", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"min=-0.5", "max=0.5"}},
  {"sin", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"cos", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"reciprocal", 1, {{DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"log1p", 1, {{DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"expm1", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"floor", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"ceil", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"round", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"trunc", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"sign", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"erf", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"add_scalar", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"scalar=2"}},
  {"mul_scalar", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"scalar=3"}},
  {"pow", 1, {{DT_F32, T2(4, 6), F_POS, 0, 0}}, {"exponent=2"}},
  {"where", 3, {{DT_I32, T2(4, 6), F_ONEHALF, 0, 0}, {DT_F32, T2(4, 6), F_VAL, 0, 0},
                {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"masked_fill", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_I32, T2(4, 6), F_ONEHALF, 0, 0}},
   {"value=0.5"}},
  {"cast", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dtype=bf16"}},
  {"dropout", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"p=0.5", "seed=7"}},
  {"sum", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"mean", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"amax", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"amin", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"argmax", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"argmin", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"logsumexp", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"var", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"std", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"prod", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"softmax", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1"}},
  {"log_softmax", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1"}},
  {"rms_norm", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T1(6), F_POS, 0, 0}}, {NULL}},
  {"layer_norm", 3, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T1(6), F_POS, 0, 0},
                     {DT_F32, T1(6), F_VAL, 0, 0}}, {NULL}},
  {"embedding", 2, {{DT_F32, T2(9, 4), F_VAL, 0, 0}, {DT_I64, T2(3, 5), F_IDX, 9, 0}}, {NULL}},
  {"gather_dim", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_I64, T1(4), F_IDX, 6, 0}}, {NULL}},
  {"sdpa", 3, {{DT_F32, T4(1, 2, 4, 3), F_VAL, 0, 0}, {DT_F32, T4(1, 2, 4, 3), F_POS, 0, 0},
               {DT_F32, T4(1, 2, 4, 3), F_VAL, 0, 0}}, {NULL}},
  {"rotary", 1, {{DT_F32, T4(1, 4, 2, 6), F_VAL, 0, 0}}, {NULL}},
  {"ring_attention", 3, {{DT_F32, T4(1, 2, 8, 3), F_VAL, 0, 0}, {DT_F32, T4(1, 2, 8, 3), F_POS, 0, 0},
                         {DT_F32, T4(1, 2, 8, 3), F_VAL, 0, 0}}, {"mesh_dim=0"}},
  {"all_gather_linear", 2, {{DT_F32, T3(2, 4, 3), F_VAL, 0, 0}, {DT_F32, T2(4, 3), F_VAL, 0, 0}},
   {"mesh_dim=0"}},
  {"linear_reduce_scatter", 2, {{DT_F32, T3(2, 4, 4), F_VAL, 0, 0}, {DT_F32, T2(3, 4), F_VAL, 0, 0}},
   {"mesh_dim=0"}},
  {"view", 1, {{DT_F32, T2(1, 1), F_VAL, 0, 0}}, {NULL}},    /* no shape: 0-d */
  {"reshape", 1, {{DT_F32, T2(1, 1), F_VAL, 0, 0}}, {NULL}}, /* no shape: 0-d */
  {"flatten", 1, {{DT_F32, T3(2, 3, 4), F_VAL, 0, 0}}, {NULL}},
  {"unflatten", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1", "sizes=2,3"}},
  {"squeeze", 1, {{DT_F32, T3(4, 1, 6), F_VAL, 0, 0}}, {NULL}},
  {"unsqueeze", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1"}},
  {"permute", 1, {{DT_F32, 0, {0}, F_VAL, 0, 0}}, {NULL}}, /* no dims: a 0-d tensor */
  {"transpose", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim0=0", "dim1=1"}},
  {"t", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"slice", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1", "start=1", "end=5"}},
  {"narrow", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1", "start=1", "length=3"}},
  {"cat", 2, {{DT_F32, T2(2, 3), F_VAL, 0, 0}, {DT_F32, T2(2, 3), F_POS, 0, 0}}, {"dim=0"}},
  {"expand", 1, {{DT_F32, T2(4, 1), F_VAL, 0, 0}}, {"shape=2,4,6"}},
  {"stack", 3, {{DT_F32, T2(2, 3), F_VAL, 0, 0}, {DT_F32, T2(2, 3), F_POS, 0, 0},
                {DT_F32, T2(2, 3), F_VAL, 0, 0}}, {NULL}},
  {"tril", 1, {{DT_F32, T3(2, 4, 6), F_VAL, 0, 0}}, {NULL}},
  {"triu", 1, {{DT_F32, T2(5, 4), F_VAL, 0, 0}}, {NULL}},
  {"cumsum", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"dim=1"}},
  {"topk", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"k=2", "dim=1"}},
  {"gather", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_I64, T2(4, 3), F_IDX, 6, 0}}, {"dim=1"}},
  {"index_select", 2, {{DT_F32, T3(4, 6, 3), F_VAL, 0, 0}, {DT_I64, T1(5), F_IDX, 6, 0}}, {"dim=1"}},
  {"scatter_add", 3, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_I64, T2(4, 3), F_IDX, 6, 0},
                      {DT_F32, T2(4, 3), F_POS, 0, 0}}, {"dim=1"}},
  {"moe_route", 1, {{DT_I64, T2(4, 2), F_IDX, 3, 0}}, {"experts=3"}},
  {"index_add", 3, {{DT_F32, T2(5, 3), F_VAL, 0, 0}, {DT_I64, T1(4), F_IDX, 5, 0},
                    {DT_F32, T2(4, 3), F_POS, 0, 0}}, {NULL}},
  {"act_grad", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {"kind=1"}},
  {"rms_norm_grad", 3, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0},
                        {DT_F32, T1(6), F_POS, 0, 0}}, {NULL}},
  {"layer_norm_grad", 3, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_VAL, 0, 0},
                          {DT_F32, T1(6), F_POS, 0, 0}}, {NULL}},
  {"embedding_grad", 2, {{DT_F32, T3(3, 5, 4), F_VAL, 0, 0}, {DT_I64, T2(3, 5), F_IDX, 9, 0}},
   {"vocab=9"}},
  {"sdpa_grad", 4, {{DT_F32, T4(1, 2, 4, 3), F_VAL, 0, 0}, {DT_F32, T4(1, 2, 4, 3), F_POS, 0, 0},
                    {DT_F32, T4(1, 2, 4, 3), F_VAL, 0, 0}, {DT_F32, T4(1, 2, 4, 3), F_POS, 0, 0}},
   {NULL}},
  {"grouped_mm_wgrad", 3, {{DT_F32, T2(6, 3), F_VAL, 0, 0}, {DT_F32, T2(6, 4), F_POS, 0, 0},
                           {DT_I64, T1(2), F_CONST, 3, 0}}, {NULL}},
  {"adamw", 5, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0},
                {DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0},
                {DT_I64, 0, {0}, F_CONST, 3, 0}}, {"lr=0.01"}},
  {"scale_", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"alpha=0.5"}},
  {"sumsq", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"cross_entropy", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_I64, T1(4), F_IDX, 6, 0}}, {NULL}},
  {"redistribute", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {"placements=S0"}},
  {"to_local", 1, {{DT_F32, T2(4, 6), F_VAL, 0, 0}}, {NULL}},
  {"from_local", 2, {{DT_F32, T2(4, 6), F_VAL, 0, 0}, {DT_F32, T2(4, 6), F_POS, 0, 0}}, {NULL}},
  {"all_to_all_single", 2, {{DT_F32, T2(2, 3), F_VAL, 0, 2}, {DT_I64, T1(1), F_CONST, 2, 1}},
   {NULL}},
};
/* clang-format on */

static const spec_t* find_spec(const char* op) {
  for (size_t k = 0; k < sizeof kSpecs / sizeof kSpecs[0]; k++)
    if (strcmp(kSpecs[k].op, op) == 0) return &kSpecs[k];
  return NULL;
}

/* The row of op i of the table (dt_op_name_at), NULL for an op the host registered; an op
 * without a row fails the test, so a new op gets one. */
static const spec_t* spec_at(int i) {
  const char* name;
  dt_op_desc_t d;
  DT_ASSERT_OK(dt_op_name_at(i, &name));
  DT_ASSERT_OK(dt_op_describe(name, &d));
  if (d.host) return NULL;
  const spec_t* sp = find_spec(name);
  DT_ASSERT_TRUE(sp != NULL, "op '%s' has no row in tests/ops/op_specs.h: add one", name);
  return sp;
}

/* The host data of input t of a row (values exact in f32 and bf16) for `s` at `world` ranks:
 * its global shape in shape[0..s->ndim), its values in buf as s->dtype (f32, bf16, i32 or i64;
 * anything else is read as f32). Returns the element count, or -1 above SPEC_MAX_NUMEL. */
#define SPEC_MAX_NUMEL 512
static int64_t spec_data(const in_t* s, int t, int world, int64_t* shape, void* buf) {
  memcpy(shape, s->shape, sizeof s->shape);
  if (s->world_dim > 0) shape[0] = s->shape[0] * world; /* rows (or counts) per rank */
  if (s->world_dim == 1) shape[0] = world;
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= shape[d];
  if (n < 0 || n > SPEC_MAX_NUMEL) return -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = 0;
    float f = 0.0f;
    switch (s->fill) {
      case F_VAL: f = (float)(((i * 7 + t * 3) % 11) - 5) / 4.0f; break;
      case F_POS: f = (float)((i * 5 + t) % 7 + 1) / 2.0f; break;
      case F_IDX: v = s->arg > 0 ? (i * 5 + 2 + t) % s->arg : 0; break;
      case F_ONEHALF: v = (i * 3 + t) % 2; break;
      case F_CONST: v = s->arg; f = (float)s->arg; break;
      default: break;
    }
    if (s->fill != F_VAL && s->fill != F_POS && s->fill != F_CONST) f = (float)v;
    if (s->dtype == DT_I64) {
      ((int64_t*)buf)[i] = v;
    } else if (s->dtype == DT_I32) {
      ((int32_t*)buf)[i] = (int32_t)v;
    } else if (s->dtype == DT_BF16) {
      uint32_t u;
      memcpy(&u, &f, sizeof u);
      ((uint16_t*)buf)[i] = (uint16_t)(u >> 16); /* the values are exact in bf16 */
    } else {
      ((float*)buf)[i] = f;
    }
  }
  return n;
}

/* Input t of a row on `mesh` with `placements` (NULL: replicated). */
static dt_status_t spec_input(dt_mesh_t mesh, const in_t* s, int t, int world,
                              const dt_placement_t* placements, dt_tensor_t* out) {
  int64_t shape[4];
  static int64_t buf[SPEC_MAX_NUMEL];
  DT_ASSERT_TRUE(spec_data(s, t, world, shape, buf) >= 0, "input %d: more than %d elements", t,
                 SPEC_MAX_NUMEL);
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = placements ? placements[i] : dt_replicate();
  return dt_tensor_from_full(mesh, s->dtype, s->ndim, shape, pl, buf, out);
}

#endif /* DT_TESTS_OP_SPECS_H */

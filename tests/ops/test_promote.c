/* test_promote.c - PyTorch's type promotion of element-wise ops (np 1 and 2; an emulated-GPU
 * twin).
 *
 * add, sub, mul, div, maximum, minimum, eq, ge, gt and where's values (not its condition) given
 * operands of different dtypes cast them to torch.result_type's dtype and compute as for one
 * dtype. Checked here:
 *   - the result dtype of every pair of f32, bf16, f16, i32, i64 for every such op, with both
 *     operands dim tensors, one or both 0-dim (tables below written from torch 1.13's
 *     torch.result_type), on meta tensors (every pair, integer results included) and on real ones;
 *   - the values of every pair with a float result against a dense computation (each operand's
 *     value converted to the result dtype, the op in double, rounded to the result dtype), with
 *     the operands placed differently (Shard(0) with Shard(1), Replicate with Shard(0), Partial
 *     with Replicate), broadcasting a 0-dim operand;
 *   - the tape: the casts are recorded as cast nodes and every leaf's gradient comes back in the
 *     leaf's own dtype with the values PyTorch gives (add and mul of a bf16 and an f32 leaf,
 *     maximum of bf16 and f16, where of f32 and bf16, an integer operand without a gradient, and
 *     with the casts' values dropped by checkpointing and recomputed);
 *   - the casts run as cast ops (a trace sees "cast" before "add"), dt_op_select describes the op
 *     on the promoted dtype;
 *   - misuse: ops PyTorch does not promote (mm, linear, rms_norm, sdpa) refuse mixed dtypes with
 *     their messages, where's condition is not promoted (an f32 one stays f32), and a promoted
 *     call that fails (shapes that do not broadcast) fails plainly and leaves the tape as it was.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_test_fixture.h"

#define ND 5
static const dt_dtype_t DTS[ND] = {DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64};
#define F32 DT_F32
#define BF DT_BF16
#define HF DT_F16
#define I32 DT_I32
#define I64 DT_I64
/* torch.result_type(dim tensor of DTS[a], dim tensor of DTS[b]) (also both 0-dim) */
static const dt_dtype_t DIM_DIM[ND][ND] = {
    {F32, F32, F32, F32, F32}, {F32, BF, F32, BF, BF}, {F32, F32, HF, HF, HF},
    {F32, BF, HF, I32, I64},   {F32, BF, HF, I64, I64}};
/* torch.result_type(dim tensor of DTS[a], 0-dim tensor of DTS[b]) */
static const dt_dtype_t DIM_ZERO[ND][ND] = {
    {F32, F32, F32, F32, F32}, {BF, BF, BF, BF, BF},    {HF, HF, HF, HF, HF},
    {F32, BF, HF, I32, I32},   {F32, BF, HF, I64, I64}};

static const char* const OPS[] = {"add", "sub", "mul", "div", "maximum", "minimum",
                                  "eq",  "ge",  "gt"};
#define NOPS ((int)(sizeof OPS / sizeof OPS[0]))

static int g_rank, g_world;

static int is_float(dt_dtype_t d) { return d == F32 || d == BF || d == HF; }

/* v rounded to dtype d (round to nearest even) */
static double round_to(dt_dtype_t d, double v) {
  float f = (float)v;
  if (d == F32) return f;
  if (d == HF) return fx_f16_to_f32(fx_f32_to_f16(f));
  if (d == BF) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
  }
  return v; /* integers: the values below are integers */
}

static double apply(const char* op, double a, double b) {
  if (!strcmp(op, "add")) return a + b;
  if (!strcmp(op, "sub")) return a - b;
  if (!strcmp(op, "mul")) return a * b;
  if (!strcmp(op, "div")) return a / b;
  if (!strcmp(op, "maximum")) return a > b ? a : b;
  if (!strcmp(op, "minimum")) return a < b ? a : b;
  if (!strcmp(op, "eq")) return a == b;
  if (!strcmp(op, "ge")) return a >= b;
  return a > b; /* gt */
}

/* A (6, 5) operand (ndim 2) or a 0-dim one (ndim 0) of dtype d: values exact in every dtype,
 * never 0 (div), some equal between the two operands (eq, ge). */
static void make(fx_tensor_t* t, dt_dtype_t d, int ndim, int which) {
  t->dtype = d;
  t->ndim = ndim;
  t->shape[0] = 6;
  t->shape[1] = 5;
  t->numel = ndim ? 30 : 1;
  t->data = (double*)malloc(sizeof(double) * (size_t)t->numel);
  for (int64_t i = 0; i < t->numel; i++) {
    double v = (double)((i * (which ? 7 : 3) + which) % 9) - 4.0; /* -4 .. 4 */
    if (v == 0) v = which ? 3 : -2;
    if (is_float(d)) v *= which ? 0.5 : 0.75; /* 0.75 * 3 = 2.25: exact in bf16 and f16 */
    t->data[i] = v;
  }
}

static dt_tensor_t place(dt_mesh_t mesh, const fx_tensor_t* t, dt_placement_t pl, int meta) {
  dt_tensor_t x;
  if (t->ndim == 0 || (pl.kind == DT_PARTIAL && !is_float(t->dtype))) pl = dt_replicate();
  if (meta) {
    DT_ASSERT_OK(dt_tensor_meta(mesh, t->dtype, t->ndim, t->shape, &pl, &x));
    return x;
  }
  void* buf = fx_pack(t);
  DT_ASSERT_OK(dt_tensor_from_full(mesh, t->dtype, t->ndim, t->shape, &pl, buf, &x));
  free(buf);
  return x;
}

static dt_dtype_t dtype_of(dt_tensor_t x) {
  dt_dtype_t d;
  DT_ASSERT_OK(dt_tensor_dtype(x, &d));
  return d;
}

/* The value of x gathered, element i, as a double. */
static double* gather(dt_tensor_t x, int64_t numel) {
  dt_dtype_t d = dtype_of(x);
  size_t nb = fx_itemsize(d) * (size_t)numel;
  void* buf = malloc(nb);
  DT_ASSERT_OK(dt_tensor_gather_full(x, buf, nb));
  double* v = (double*)malloc(sizeof(double) * (size_t)numel);
  for (int64_t i = 0; i < numel; i++) v[i] = fx_unpack(buf, d, i);
  free(buf);
  return v;
}

/* Every op, every dtype pair, every 0-dim arrangement: the result dtype, and with real tensors
 * the values (integer results too: the kernels compute integers in their dtype; div of integers
 * is f32, PyTorch's true division). */
static void test_table(dt_mesh_t mesh, int meta) {
  static const dt_placement_t PL[3][2] = {
      {{DT_SHARD, 0, 0}, {DT_SHARD, 1, 0}},
      {{DT_REPLICATE, 0, 0}, {DT_SHARD, 0, 0}},
      {{DT_PARTIAL, 0, DT_REDUCE_SUM}, {DT_REPLICATE, 0, 0}}};
  int checked = 0;
  for (int o = 0; o < NOPS; o++)
    for (int a = 0; a < ND; a++)
      for (int b = 0; b < ND; b++)
        for (int z = 0; z < 4; z++) { /* z bit 0: a is 0-dim; bit 1: b is 0-dim */
          const int za = z & 1, zb = (z >> 1) & 1;
          dt_dtype_t want = za == zb ? DIM_DIM[a][b] : zb ? DIM_ZERO[a][b] : DIM_ZERO[b][a];
          if (!strcmp(OPS[o], "div") && !is_float(want)) want = F32; /* torch.div: true division */
          const int k = (o + a + b + z) % 3; /* placements vary over the cases */
          fx_tensor_t ta, tb;
          make(&ta, DTS[a], za ? 0 : 2, 0);
          make(&tb, DTS[b], zb ? 0 : 2, 1);
          dt_tensor_t in[2] = {place(mesh, &ta, PL[k][0], meta), place(mesh, &tb, PL[k][1], meta)};
          dt_tensor_t r = NULL;
          dt_status_t st = dt_op_run(OPS[o], 2, in, 0, NULL, 0, NULL, &r);
          DT_ASSERT_TRUE(st == DT_SUCCESS, "%s(%s%s, %s%s) on %s tensors: %s: %s", OPS[o],
                         dt_dtype_name(DTS[a]), za ? " 0-dim" : "", dt_dtype_name(DTS[b]),
                         zb ? " 0-dim" : "", meta ? "meta" : "real", dt_status_name(st),
                         dt_last_error());
          DT_ASSERT_TRUE(dtype_of(r) == want, "%s(%s%s, %s%s): %s, torch gives %s", OPS[o],
                         dt_dtype_name(DTS[a]), za ? " 0-dim" : "", dt_dtype_name(DTS[b]),
                         zb ? " 0-dim" : "", dt_dtype_name(dtype_of(r)), dt_dtype_name(want));
          int nd;
          DT_ASSERT_OK(dt_tensor_ndim(r, &nd));
          DT_ASSERT_EQ(nd, (za && zb) ? 0 : 2);
          if (!meta) {
            const int64_t n = (za && zb) ? 1 : 30;
            double* got = gather(r, n);
            for (int64_t i = 0; i < n; i++) {
              /* each operand cast to the result dtype (exact here), the op, one rounding */
              double x = round_to(want, ta.data[za ? 0 : i]);
              double y = round_to(want, tb.data[zb ? 0 : i]);
              double w = round_to(want, apply(OPS[o], x, y));
              DT_ASSERT_TRUE(got[i] == w, "%s(%s%s, %s%s) element %lld: %g, expected %g", OPS[o],
                             dt_dtype_name(DTS[a]), za ? " 0-dim" : "", dt_dtype_name(DTS[b]),
                             zb ? " 0-dim" : "", (long long)i, got[i], w);
            }
            free(got);
          }
          DT_ASSERT_OK(dt_tensor_destroy(r));
          DT_ASSERT_OK(dt_tensor_destroy(in[0]));
          DT_ASSERT_OK(dt_tensor_destroy(in[1]));
          free(ta.data);
          free(tb.data);
          checked++;
        }
  if (g_rank == 0) printf("  %d promoted calls on %s tensors\n", checked, meta ? "meta" : "real");
}

/* where(cond, a, b): a and b promote, the condition keeps its dtype and takes no part (an i64
 * condition with i32 values gives i32, not i64). */
static void test_where(dt_mesh_t mesh) {
  for (int a = 0; a < ND; a++)
    for (int b = 0; b < ND; b++)
      for (int meta = 0; meta < 2; meta++) {
        dt_dtype_t want = DIM_DIM[a][b];
        if (!meta && !is_float(want)) continue;
        fx_tensor_t tc, ta, tb;
        make(&tc, I64, 2, 0);
        for (int i = 0; i < 30; i++) tc.data[i] = i % 3 == 0; /* cond: a where nonzero */
        make(&ta, DTS[a], 2, 0);
        make(&tb, DTS[b], 2, 1);
        dt_tensor_t in[3] = {place(mesh, &tc, dt_shard(1), meta),
                             place(mesh, &ta, dt_shard(0), meta),
                             place(mesh, &tb, dt_replicate(), meta)};
        dt_tensor_t r;
        DT_ASSERT_OK(dt_op_run("where", 3, in, 0, NULL, 0, NULL, &r));
        DT_ASSERT_TRUE(dtype_of(r) == want, "where(i64, %s, %s): %s, torch gives %s",
                       dt_dtype_name(DTS[a]), dt_dtype_name(DTS[b]), dt_dtype_name(dtype_of(r)),
                       dt_dtype_name(want));
        if (!meta) {
          double* got = gather(r, 30);
          for (int i = 0; i < 30; i++) {
            double w = round_to(want, tc.data[i] != 0 ? ta.data[i] : tb.data[i]);
            DT_ASSERT_TRUE(got[i] == w, "where element %d: %g, expected %g", i, got[i], w);
          }
          free(got);
        }
        DT_ASSERT_OK(dt_tensor_destroy(r));
        for (int t = 0; t < 3; t++) DT_ASSERT_OK(dt_tensor_destroy(in[t]));
        free(tc.data);
        free(ta.data);
        free(tb.data);
      }
}

/* ---- autograd ---------------------------------------------------------------------------- */

static dt_var_t leaf(dt_mesh_t mesh, const fx_tensor_t* t, dt_placement_t pl, int rg) {
  dt_var_t v;
  DT_ASSERT_OK(dt_var_leaf(place(mesh, t, pl, 0), rg, &v));
  return v;
}

static void expect_grad(dt_var_t v, dt_dtype_t dtype, const double* want, int64_t n,
                        const char* what) {
  dt_tensor_t g = dt_var_grad(v);
  DT_ASSERT_TRUE(g != NULL, "%s: no gradient", what);
  DT_ASSERT_TRUE(dtype_of(g) == dtype, "%s: gradient %s, expected %s (the leaf's dtype)", what,
                 dt_dtype_name(dtype_of(g)), dt_dtype_name(dtype));
  double* got = gather(g, n);
  for (int64_t i = 0; i < n; i++)
    DT_ASSERT_TRUE(got[i] == round_to(dtype, want[i]), "%s: element %lld: %g, expected %g", what,
                   (long long)i, got[i], round_to(dtype, want[i]));
  free(got);
}

/* loss = sum(op(a, b) * w) with w an f32 constant; a and b leaves of their own dtypes. With
 * `ckpt`, the tape drops what the default policy recomputes (the casts' values among them) before
 * the backward pass. */
static void grad_case(dt_mesh_t mesh, const char* op, dt_dtype_t da, dt_dtype_t db, int ckpt) {
  fx_tensor_t ta, tb, tw;
  make(&ta, da, 2, 0);
  make(&tb, db, 2, 1);
  make(&tw, F32, 2, 1);
  for (int i = 0; i < 30; i++) tw.data[i] = 0.25 * (i % 5 + 1);
  const int ga = is_float(da), gb = is_float(db);
  dt_var_t a = leaf(mesh, &ta, dt_shard(0), ga), b = leaf(mesh, &tb, dt_shard(1), gb);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  if (ckpt) DT_ASSERT_OK(dt_tape_set_checkpoint(tape, dt_ckpt_policy_default, NULL));
  dt_var_t w, y, yw, loss, ab[2] = {a, b};
  DT_ASSERT_OK(dt_tape_constant(tape, place(mesh, &tw, dt_replicate(), 0), &w));
  DT_ASSERT_OK(dt_ag_op(tape, op, 2, ab, 0, NULL, 0, NULL, 1, &y));
  const dt_dtype_t rd = DIM_DIM[da == F32 ? 0 : da == BF ? 1 : da == HF ? 2 : da == I32 ? 3 : 4]
                               [db == F32 ? 0 : db == BF ? 1 : db == HF ? 2 : db == I32 ? 3 : 4];
  DT_ASSERT_TRUE(dtype_of(dt_var_value(y)) == rd, "%s: output %s", op,
                 dt_dtype_name(dtype_of(dt_var_value(y))));
  /* recorded: one cast node per operand of another dtype that needs a gradient, and the op */
  int64_t nodes;
  DT_ASSERT_OK(dt_tape_stats(tape, &nodes, NULL));
  DT_ASSERT_EQ(nodes, 1 + (da != rd && ga) + (db != rd && gb));
  dt_var_t yw_in[2] = {y, w};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, yw_in, 0, NULL, 0, NULL, 1, &yw));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &yw, 0, NULL, 0, NULL, 1, &loss));
  if (ckpt) {
    DT_ASSERT_OK(dt_tape_checkpoint(tape, 1, &loss));
    int64_t saved;
    DT_ASSERT_OK(dt_tape_checkpoint_stats(tape, &saved, NULL));
    DT_ASSERT_TRUE(saved > 0, "%s: nothing dropped", op);
  }
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  if (ckpt) {
    int64_t recomputed;
    DT_ASSERT_OK(dt_tape_checkpoint_stats(tape, NULL, &recomputed));
    DT_ASSERT_TRUE(recomputed > 0, "%s: nothing recomputed", op);
  }
  /* PyTorch: dL/dy = w (in y's dtype); each operand's gradient in y's dtype, cast back to the
   * operand's */
  double wa[30], wb[30];
  for (int i = 0; i < 30; i++) {
    double x = round_to(rd, ta.data[i]), z = round_to(rd, tb.data[i]), g = round_to(rd, tw.data[i]);
    if (!strcmp(op, "add")) wa[i] = g, wb[i] = g;
    else if (!strcmp(op, "mul")) wa[i] = round_to(rd, g * z), wb[i] = round_to(rd, g * x);
    else if (!strcmp(op, "maximum")) /* ties: half to each */
      wa[i] = x > z ? g : x == z ? g / 2 : 0, wb[i] = z > x ? g : x == z ? g / 2 : 0;
    else DT_ASSERT_TRUE(0, "op %s", op);
  }
  char what[64];
  snprintf(what, sizeof what, "%s(%s, %s)%s, input 0", op, dt_dtype_name(da), dt_dtype_name(db),
           ckpt ? " checkpointed" : "");
  if (ga) expect_grad(a, da, wa, 30, what);
  else DT_ASSERT_TRUE(dt_var_grad(a) == NULL, "%s: an integer input got a gradient", what);
  what[strlen(what) - 1] = '1';
  if (gb) expect_grad(b, db, wb, 30, what);
  else DT_ASSERT_TRUE(dt_var_grad(b) == NULL, "%s: an integer input got a gradient", what);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(a));
  DT_ASSERT_OK(dt_var_destroy(b));
  free(ta.data);
  free(tb.data);
  free(tw.data);
}

/* where(cond, a f32, b bf16): output f32; a's gradient f32 where cond, b's bf16 elsewhere. */
static void grad_where(dt_mesh_t mesh) {
  fx_tensor_t tc, ta, tb;
  make(&tc, I32, 2, 0);
  for (int i = 0; i < 30; i++) tc.data[i] = i % 4 == 1;
  make(&ta, F32, 2, 0);
  make(&tb, BF, 2, 1);
  dt_var_t c = leaf(mesh, &tc, dt_replicate(), 0), a = leaf(mesh, &ta, dt_shard(1), 1),
           b = leaf(mesh, &tb, dt_partial(DT_REDUCE_SUM), 1);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t y, loss, in[3] = {c, a, b};
  DT_ASSERT_OK(dt_ag_op(tape, "where", 3, in, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_TRUE(dtype_of(dt_var_value(y)) == F32, "where(i32, f32, bf16): %s",
                 dt_dtype_name(dtype_of(dt_var_value(y))));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 0, NULL, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  double wa[30], wb[30];
  for (int i = 0; i < 30; i++) wa[i] = tc.data[i] != 0, wb[i] = tc.data[i] == 0;
  expect_grad(a, F32, wa, 30, "where(i32, f32, bf16), input 1");
  expect_grad(b, BF, wb, 30, "where(i32, f32, bf16), input 2");
  DT_ASSERT_TRUE(dt_var_grad(c) == NULL, "where: the condition got a gradient");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(c));
  DT_ASSERT_OK(dt_var_destroy(a));
  DT_ASSERT_OK(dt_var_destroy(b));
  free(tc.data);
  free(ta.data);
  free(tb.data);
}

static void test_autograd(dt_mesh_t mesh) {
  for (int ckpt = 0; ckpt < 2; ckpt++) {
    grad_case(mesh, "add", BF, F32, ckpt);
    grad_case(mesh, "mul", BF, F32, ckpt);
  }
  grad_case(mesh, "mul", F32, BF, 0);
  grad_case(mesh, "maximum", BF, HF, 0); /* f32 result: gradients bf16 and f16 */
  grad_case(mesh, "mul", I64, BF, 0);    /* the integer operand: no gradient, no cast node */
  grad_case(mesh, "add", F32, F32, 0);   /* one dtype: no cast node */
  grad_where(mesh);
}

/* ---- the casts as ops, selection, misuse ---------------------------------------------------- */

typedef struct {
  char ops[8][16];
  int n;
} trace_t;

static void on_trace(const dt_trace_event_t* e, void* ctx) {
  trace_t* t = (trace_t*)ctx;
  if (e->kind == DT_TRACE_OP && t->n < 8) snprintf(t->ops[t->n++], 16, "%s", e->op);
}

static void test_cast_ops(dt_mesh_t mesh) {
  fx_tensor_t ta, tb;
  make(&ta, BF, 2, 0);
  make(&tb, F32, 2, 1);
  dt_tensor_t in[2] = {place(mesh, &ta, dt_shard(0), 1), place(mesh, &tb, dt_shard(0), 1)}, r;
  trace_t tr = {.n = 0};
  dt_trace_set(on_trace, &tr);
  DT_ASSERT_OK(dt_add(in[0], in[1], &r));
  dt_trace_set(NULL, NULL);
  DT_ASSERT_TRUE(tr.n == 2 && !strcmp(tr.ops[0], "cast") && !strcmp(tr.ops[1], "add"),
                 "traced %d ops: %s, %s", tr.n, tr.n > 0 ? tr.ops[0] : "",
                 tr.n > 1 ? tr.ops[1] : "");
  DT_ASSERT_OK(dt_tensor_destroy(r));
  /* dt_op_select: the op on the promoted dtype */
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  call.op = "mul";
  call.n_inputs = 2;
  call.in[0].dtype = BF;
  call.in[0].ndim = 2;
  call.in[0].shape[0] = 6;
  call.in[0].shape[1] = 5;
  call.in[1] = call.in[0];
  call.in[1].dtype = F32;
  dt_placement_t pl[2][DT_MAX_MESH_DIMS] = {{dt_shard(0)}, {dt_shard(0)}};
  dt_op_choice_t ch;
  DT_ASSERT_OK(dt_op_select(mesh, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])pl, &ch));
  DT_ASSERT_EQ(ch.out_meta[0].dtype, F32);
  /* misuse: ops PyTorch does not promote keep refusing */
  dt_tensor_t w = place(mesh, &ta, dt_replicate(), 0), x = place(mesh, &tb, dt_replicate(), 0);
  int64_t s56[2] = {5, 6};
  dt_tensor_t wt;
  dt_placement_t rep = dt_replicate();
  DT_ASSERT_OK(dt_tensor_zeros(mesh, BF, 2, s56, &rep, &wt));
  r = (dt_tensor_t)0x1;
  DT_ASSERT_STATUS(dt_mm(x, wt, &r), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(r == NULL && strstr(dt_last_error(), "dt_mm: ") == dt_last_error() &&
                     strstr(dt_last_error(), "mm: dtype mismatch (bf16 vs f32)") != NULL,
                 "%s", dt_last_error());
  DT_ASSERT_STATUS(dt_linear(x, w, NULL, &r), DT_ERR_INVALID_ARG); /* (6,5) x (6,5)^T */
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dtype mismatch (bf16 vs f32)") != NULL, "%s",
                 dt_last_error());
  int64_t s5 = 5;
  dt_tensor_t nw;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, BF, 1, &s5, &rep, &nw));
  dt_tensor_t rn[2] = {x, nw};
  DT_ASSERT_STATUS(dt_op_run("rms_norm", 2, rn, 0, NULL, 0, NULL, &r), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "rms_norm: parameter 1 must be a f32 vector of 5"), "%s",
                 dt_last_error());
  int64_t q4[4] = {1, 2, 3, 5};
  dt_tensor_t q, k;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, F32, 4, q4, &rep, &q));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, BF, 4, q4, &rep, &k));
  DT_ASSERT_STATUS(dt_sdpa(q, k, k, 0, 0.0, &r), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "sdpa: q, k, v must share one float dtype"), "%s",
                 dt_last_error());
  /* where's condition is not promoted: an f32 condition (x, never 0) stays f32 and selects the
   * bf16 values, promoted with the f32 ones to f32 */
  DT_ASSERT_OK(dt_where(x, w, x, &r));
  DT_ASSERT_TRUE(dtype_of(r) == F32, "where(f32, bf16, f32): %s", dt_dtype_name(dtype_of(r)));
  {
    double* got = gather(r, 30);
    for (int i = 0; i < 30; i++)
      DT_ASSERT_TRUE(got[i] == ta.data[i], "where(f32 condition) element %d: %g, expected %g", i,
                     got[i], ta.data[i]);
    free(got);
  }
  DT_ASSERT_OK(dt_tensor_destroy(r));
  /* a promoted call that fails otherwise: the op's own message, nothing recorded */
  int64_t s45[2] = {4, 5};
  dt_tensor_t bad;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, F32, 2, s45, &rep, &bad));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t va, vb, vy = (dt_var_t)0x1;
  DT_ASSERT_OK(dt_var_leaf(w, 1, &va));
  DT_ASSERT_OK(dt_var_leaf(bad, 1, &vb));
  dt_var_t pair[2] = {va, vb};
  DT_ASSERT_STATUS(dt_ag_op(tape, "add", 2, pair, 0, NULL, 0, NULL, 1, &vy), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(vy == NULL && strstr(dt_last_error(), "add: shapes do not broadcast") != NULL,
                 "%s", dt_last_error());
  int64_t nodes, nbytes;
  DT_ASSERT_OK(dt_tape_stats(tape, &nodes, &nbytes));
  DT_ASSERT_EQ(nodes, 0);
  DT_ASSERT_EQ(nbytes, 0);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(va)); /* the leaves own w and bad */
  DT_ASSERT_OK(dt_var_destroy(vb));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(wt));
  DT_ASSERT_OK(dt_tensor_destroy(nw));
  DT_ASSERT_OK(dt_tensor_destroy(q));
  DT_ASSERT_OK(dt_tensor_destroy(k));
  DT_ASSERT_OK(dt_tensor_destroy(in[0]));
  DT_ASSERT_OK(dt_tensor_destroy(in[1]));
  free(ta.data);
  free(tb.data);
}

/* Integer operands of one dtype (no promotion) as PyTorch computes them: two's complement
 * arithmetic that wraps at the dtype's width, exact comparisons of values past 2^24 (which an f32
 * path would round together), a broadcast row and a 0-dim operand; div gives f32, each operand
 * converted to f32 and divided there (PyTorch's true division). a is (6, 4) Shard(0), b (4)
 * Replicate or 0-dim. */
static int64_t wrap(dt_dtype_t d, uint64_t r) {
  return d == I64 ? (int64_t)r : (int64_t)(int32_t)(uint32_t)r;
}

static void test_int_values(dt_mesh_t mesh) {
  static const char* const IOPS[] = {"add", "sub", "mul", "maximum", "minimum", "eq", "ge", "gt",
                                     "div"};
  int checked = 0;
  for (int w = 0; w < 2; w++) {
    const dt_dtype_t d = w ? I64 : I32;
    const int64_t hi = w ? INT64_MAX : INT32_MAX, lo = w ? INT64_MIN : INT32_MIN;
    const int64_t pool[] = {hi, lo, -1, 0, 1, 16777217, -16777217, hi - 1, lo + 1, 16777216, 7, -7};
    int64_t av[24], bv[4] = {0, -1, 16777216, hi}; /* 0: x / 0 is +-inf, 0 / 0 NaN, as torch */
    for (int i = 0; i < 24; i++) av[i] = pool[(i * 5 + i / 4) % 12];
    const size_t is = w ? 8 : 4;
    unsigned char abuf[24 * 8], bbuf[4 * 8];
    for (int i = 0; i < 24; i++) {
      if (w) memcpy(abuf + 8 * i, &av[i], 8);
      else { int32_t v = (int32_t)av[i]; memcpy(abuf + 4 * i, &v, 4); }
    }
    for (int i = 0; i < 4; i++) {
      if (w) memcpy(bbuf + 8 * i, &bv[i], 8);
      else { int32_t v = (int32_t)bv[i]; memcpy(bbuf + 4 * i, &v, 4); }
    }
    const int64_t ashape[2] = {6, 4}, bshape[1] = {4};
    dt_placement_t s0 = dt_shard(0), r = dt_replicate();
    dt_tensor_t a, b, b0;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, d, 2, ashape, &s0, abuf, &a));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, d, 1, bshape, &r, bbuf, &b));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, d, 0, bshape, &r, bbuf + 3 * is, &b0)); /* hi */
    for (int o = 0; o < (int)(sizeof IOPS / sizeof IOPS[0]); o++)
      for (int z = 0; z < 2; z++) {
        dt_tensor_t in[2] = {a, z ? b0 : b}, res = NULL;
        DT_ASSERT_TRUE(dt_op_run(IOPS[o], 2, in, 0, NULL, 0, NULL, &res) == DT_SUCCESS,
                       "%s(%s, %s%s): %s", IOPS[o], dt_dtype_name(d), dt_dtype_name(d),
                       z ? " 0-dim" : "", dt_last_error());
        const int div = !strcmp(IOPS[o], "div");
        DT_ASSERT_TRUE(dtype_of(res) == (div ? F32 : d), "%s(%s, %s): %s", IOPS[o],
                       dt_dtype_name(d), dt_dtype_name(d), dt_dtype_name(dtype_of(res)));
        unsigned char got[24 * 8];
        DT_ASSERT_OK(dt_tensor_gather_full(res, got, 24 * (div ? 4 : is)));
        for (int i = 0; i < 24; i++) {
          const int64_t x = av[i], y = z ? hi : bv[i % 4];
          if (div) {
            float g, want = (float)x / (float)y;
            memcpy(&g, got + 4 * i, 4);
            DT_ASSERT_TRUE(g == want || (isnan(want) && isnan(g)),
                           "div(%s) element %d: %.9g / %.9g gave %.9g, want %.9g",
                           dt_dtype_name(d), i, (double)x, (double)y, (double)g, (double)want);
            continue;
          }
          int64_t g;
          if (w) memcpy(&g, got + 8 * i, 8);
          else { int32_t v; memcpy(&v, got + 4 * i, 4); g = v; }
          uint64_t ux = (uint64_t)x, uy = (uint64_t)y, want;
          switch (o) {
            case 0: want = ux + uy; break;
            case 1: want = ux - uy; break;
            case 2: want = ux * uy; break;
            case 3: want = (uint64_t)(x >= y ? x : y); break;
            case 4: want = (uint64_t)(x <= y ? x : y); break;
            case 5: want = x == y; break;
            case 6: want = x >= y; break;
            default: want = x > y; break;
          }
          DT_ASSERT_TRUE(g == wrap(d, want), "%s(%s) element %d: %lld and %lld gave %lld, want "
                         "%lld", IOPS[o], dt_dtype_name(d), i, (long long)x, (long long)y,
                         (long long)g, (long long)wrap(d, want));
          checked++;
        }
        DT_ASSERT_OK(dt_tensor_destroy(res));
      }
    /* i32 with i64: i64, the i32 operand widened first */
    if (w) {
      dt_tensor_t a32, in[2], res;
      int32_t v32[24];
      for (int i = 0; i < 24; i++) v32[i] = (int32_t)((int64_t)i * 100000007 % 2147483647) - 1000;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, I32, 2, ashape, &s0, v32, &a32));
      in[0] = a32;
      in[1] = b;
      DT_ASSERT_OK(dt_op_run("add", 2, in, 0, NULL, 0, NULL, &res));
      DT_ASSERT_TRUE(dtype_of(res) == I64, "add(i32, i64): %s", dt_dtype_name(dtype_of(res)));
      int64_t got[24];
      DT_ASSERT_OK(dt_tensor_gather_full(res, got, sizeof got));
      for (int i = 0; i < 24; i++)
        DT_ASSERT_TRUE(got[i] == (int64_t)((uint64_t)v32[i] + (uint64_t)bv[i % 4]),
                       "add(i32, i64) element %d: %lld", i, (long long)got[i]);
      DT_ASSERT_OK(dt_tensor_destroy(res));
      DT_ASSERT_OK(dt_tensor_destroy(a32));
    }
    DT_ASSERT_OK(dt_tensor_destroy(a));
    DT_ASSERT_OK(dt_tensor_destroy(b));
    DT_ASSERT_OK(dt_tensor_destroy(b0));
  }
  if (g_rank == 0) printf("integer values: %d elements exact, wrapping as PyTorch\n", checked);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  test_table(mesh, 1);
  test_table(mesh, 0);
  test_int_values(mesh);
  test_where(mesh);
  test_autograd(mesh);
  test_cast_ops(mesh);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_rank == 0) printf("test_promote: ok on %d rank(s)\n", g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

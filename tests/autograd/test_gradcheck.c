/* test_gradcheck.c - every differentiable op's backward rule against central finite differences
 * (np 2 and 4), with inputs replicated, sharded on dim 0, and sharded on their last dim.
 *
 * For each case the loss is L = sum(op(x...) * r) with a fixed weight tensor r. The analytic
 * gradient of every float input (from dt_tape_backward) is compared, on up to 10 elements per
 * input, with (L(x + h e) - L(x - h e)) / 2h, h = 1e-2, computed by running the same forward with
 * grad mode off. f32 tolerance: |analytic - numeric| <= 4e-3 + 3e-2 |numeric| (h^2 truncation and
 * f32 rounding of L / h). Each input gradient must also carry the input's placements, and
 * releasing the tape must leave nothing behind (ASan/valgrind runs catch leaks).
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"

typedef struct {
  const char* name;
  const char* op;
  int n_in;
  int nd[3];
  int64_t shape[3][4];
  int kind[3]; /* 0 float, 1 positive float, 2 index (hi in idx_hi), 3 float constant (no grad) */
  int64_t idx_hi;
  int n_iargs, n_fargs;
  int64_t iargs[4];
  double fargs[2];
} gcase_t;

static const gcase_t kCases[] = {
    {"add_bcast", "add", 2, {2, 1}, {{4, 3}, {3}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"sub", "sub", 2, {2, 2}, {{4, 3}, {4, 3}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"mul_bcast", "mul", 2, {2, 2}, {{4, 3}, {4, 1}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"div", "div", 2, {2, 2}, {{4, 3}, {4, 3}}, {0, 1}, 0, 0, 0, {0}, {0}},
    {"neg", "neg", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"mul_scalar", "mul_scalar", 1, {2}, {{4, 3}}, {0}, 0, 0, 1, {0}, {-1.5}},
    {"add_scalar", "add_scalar", 1, {2}, {{4, 3}}, {0}, 0, 0, 1, {0}, {0.5}},
    {"exp", "exp", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"log", "log", 1, {2}, {{4, 3}}, {1}, 0, 0, 0, {0}, {0}},
    {"sqrt", "sqrt", 1, {2}, {{4, 3}}, {1}, 0, 0, 0, {0}, {0}},
    {"rsqrt", "rsqrt", 1, {2}, {{4, 3}}, {1}, 0, 0, 0, {0}, {0}},
    {"pow", "pow", 1, {2}, {{4, 3}}, {1}, 0, 0, 1, {0}, {1.7}},
    {"relu", "relu", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"silu", "silu", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"gelu", "gelu", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"sigmoid", "sigmoid", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"tanh", "tanh", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"abs", "abs", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"clamp", "clamp", 1, {2}, {{4, 3}}, {0}, 0, 0, 2, {0}, {-0.5, 0.75}},
    {"clamp_min", "clamp", 1, {2}, {{4, 3}}, {0}, 0, 0, 1, {0}, {0.25}},
    {"sin", "sin", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"cos", "cos", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"reciprocal", "reciprocal", 1, {2}, {{4, 3}}, {1}, 0, 0, 0, {0}, {0}},
    {"log1p", "log1p", 1, {2}, {{4, 3}}, {1}, 0, 0, 0, {0}, {0}},
    {"expm1", "expm1", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"erf", "erf", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    /* piecewise constant: zero gradients (the values lie >= 0.03 from every jump, h = 1e-2) */
    {"floor", "floor", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"ceil", "ceil", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"round", "round", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"trunc", "trunc", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"sign", "sign", 1, {2}, {{4, 3}}, {0}, 0, 0, 0, {0}, {0}},
    {"mm", "mm", 2, {2, 2}, {{4, 3}, {3, 5}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"mm_t", "mm_t", 2, {2, 2}, {{3, 4}, {3, 5}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"bmm", "bmm", 2, {3, 3}, {{2, 4, 3}, {2, 3, 2}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"linear", "linear", 3, {2, 2, 1}, {{4, 3}, {5, 3}, {5}}, {0, 0, 0}, 0, 0, 0, {0}, {0}},
    {"linear_nobias", "linear_nobias", 2, {2, 2}, {{4, 3}, {5, 3}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"addmm", "addmm", 3, {1, 2, 2}, {{5}, {4, 3}, {3, 5}}, {0, 0, 0}, 0, 0, 2, {0}, {0.5, 2.0}},
    {"sum_dim1", "sum", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"mean_keep", "mean", 1, {3}, {{4, 3, 2}}, {0}, 0, 3, 0, {1, 0, 2}, {0}},
    {"logsumexp_dim1", "logsumexp", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"logsumexp_keep", "logsumexp", 1, {3}, {{4, 3, 2}}, {0}, 0, 3, 0, {1, 0, -1}, {0}},
    {"logsumexp_all", "logsumexp", 1, {2}, {{4, 5}}, {0}, 0, 1, 0, {0}, {0}},
    {"var_dim1", "var", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"var_keep_c0", "var", 1, {3}, {{4, 3, 2}}, {0}, 0, 3, 1, {1, 0, -1}, {0.0}},
    {"var_all_c2", "var", 1, {2}, {{4, 5}}, {0}, 0, 1, 1, {0}, {2.0}},
    {"std_dim1", "std", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"std_keep_c0", "std", 1, {3}, {{4, 3, 2}}, {0}, 0, 3, 1, {1, 2, 0}, {0.0}},
    {"std_all", "std", 1, {2}, {{4, 5}}, {0}, 0, 1, 0, {0}, {0}},
    {"prod_dim1", "prod", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"prod_keep", "prod", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {1, -1}, {0}},
    {"prod_all", "prod", 1, {2}, {{2, 3}}, {0}, 0, 1, 0, {0}, {0}},
    {"softmax", "softmax", 1, {2}, {{4, 5}}, {0}, 0, 1, 0, {-1}, {0}},
    {"log_softmax", "log_softmax", 1, {2}, {{4, 5}}, {0}, 0, 1, 0, {0}, {0}},
    {"rms_norm", "rms_norm", 2, {2, 1}, {{4, 6}, {6}}, {0, 0}, 0, 0, 1, {0}, {1e-6}},
    {"layer_norm", "layer_norm", 3, {2, 1, 1}, {{4, 6}, {6}, {6}}, {0, 0, 0}, 0, 0, 1, {0},
     {1e-5}},
    {"embedding", "embedding", 2, {2, 2}, {{7, 3}, {2, 4}}, {0, 2}, 7, 0, 0, {0}, {0}},
    {"reshape", "reshape", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {12, 2}, {0}},
    {"transpose", "transpose", 1, {3}, {{4, 3, 2}}, {0}, 0, 2, 0, {0, 2}, {0}},
    {"permute", "permute", 1, {3}, {{4, 3, 2}}, {0}, 0, 3, 0, {1, 2, 0}, {0}},
    {"narrow", "narrow", 1, {2}, {{4, 6}}, {0}, 0, 3, 0, {1, 2, 3}, {0}},
    {"slice", "slice", 1, {2}, {{5, 4}}, {0}, 0, 3, 0, {0, 1, 4}, {0}},
    {"cat", "cat", 2, {2, 2}, {{4, 2}, {4, 3}}, {0, 0}, 0, 1, 0, {1}, {0}},
    {"expand", "expand", 1, {3}, {{4, 1, 3}}, {0}, 0, 4, 0, {2, 4, 5, 3}, {0}},
    {"stack", "stack", 2, {2, 2}, {{4, 3}, {4, 3}}, {0, 0}, 0, 1, 0, {1}, {0}},
    {"stack_neg", "stack", 2, {2, 2}, {{3, 2}, {3, 2}}, {0, 0}, 0, 1, 0, {-1}, {0}},
    {"tril", "tril", 1, {3}, {{2, 4, 5}}, {0}, 0, 1, 0, {1}, {0}},
    {"triu", "triu", 1, {2}, {{5, 4}}, {0}, 0, 1, 0, {-1}, {0}},
    {"cumsum", "cumsum", 1, {3}, {{3, 4, 2}}, {0}, 0, 1, 0, {1}, {0}},
    {"cumsum_reverse", "cumsum", 1, {2}, {{5, 3}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"rotary", "rotary", 1, {4}, {{2, 4, 2, 4}}, {0}, 0, 1, 1, {1}, {100.0}},
    {"sdpa_gqa_causal", "sdpa", 3, {4, 4, 4}, {{2, 4, 4, 3}, {2, 2, 4, 3}, {2, 2, 4, 3}},
     {0, 0, 0}, 0, 1, 0, {1}, {0}},
    {"sdpa_bshd_gqa", "sdpa", 3, {4, 4, 4}, {{2, 4, 4, 3}, {2, 4, 2, 3}, {2, 4, 2, 3}},
     {0, 0, 0}, 0, 2, 0, {1, 1}, {0}},
    {"dropout", "dropout", 1, {2}, {{8, 5}}, {0}, 0, 1, 1, {42}, {0.3}},
    {"gather", "gather", 2, {2, 2}, {{4, 5}, {4, 3}}, {0, 2}, 5, 1, 0, {1}, {0}},
    {"index_select", "index_select", 2, {3, 1}, {{3, 5, 2}, {7}}, {0, 2}, 5, 1, 0, {1}, {0}},
    {"index_select0", "index_select", 2, {2, 1}, {{4, 3}, {6}}, {0, 2}, 4, 1, 0, {0}, {0}},
    {"scatter_add", "scatter_add", 3, {2, 2, 2}, {{4, 3}, {5, 3}, {5, 3}}, {0, 2, 0}, 4, 1, 0,
     {0}, {0}},
    {"amax_dim1", "amax", 1, {2}, {{4, 5}}, {0}, 0, 2, 0, {0, 1}, {0}},
    {"amin_keep", "amin", 1, {2}, {{4, 5}}, {0}, 0, 2, 0, {1, 0}, {0}},
    {"maximum_bcast", "maximum", 2, {2, 1}, {{4, 3}, {3}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"minimum", "minimum", 2, {2, 2}, {{4, 3}, {4, 3}}, {0, 0}, 0, 0, 0, {0}, {0}},
    {"where", "where", 3, {2, 2, 2}, {{4, 3}, {4, 3}, {4, 3}}, {2, 0, 0}, 2, 0, 0, {0}, {0}},
    {"masked_fill", "masked_fill", 2, {2, 2}, {{4, 3}, {4, 1}}, {0, 2}, 2, 0, 1, {0}, {-2.0}},
    {"gather_dim", "gather_dim", 2, {2, 1}, {{4, 5}, {4}}, {0, 2}, 5, 0, 0, {0}, {0}},
    {"cross_entropy", "cross_entropy", 2, {2, 1}, {{6, 5}, {6}}, {0, 2}, 5, 0, 0, {0}, {0}},
};

static int g_n, g_rank;
static dt_mesh_t g_mesh;

static double value_at(int kind, int t, int64_t i) {
  double u = (double)(((i + 1) * (37 + 11 * t)) % 101) / 101.0; /* in (0, 1) */
  return kind == 1 ? 0.4 + 2.0 * u : 2.0 * u - 1.0;
}

static int64_t numel(const gcase_t* c, int t) {
  int64_t n = 1;
  for (int d = 0; d < c->nd[t]; d++) n *= c->shape[t][d];
  return n;
}

/* Forward + loss L = sum(out * r) with grad mode as set; returns the loss variable. */
static dt_var_t forward(dt_tape_t tape, const gcase_t* c, dt_var_t* in, dt_var_t* r) {
  dt_var_t out[3];
  if (!strcmp(c->op, "cross_entropy")) {
    DT_ASSERT_OK(dt_ag_cross_entropy(tape, in[0], in[1], &out[0]));
  } else {
    int nout = !strcmp(c->op, "topk") ? 2 : 1;
    DT_ASSERT_OK(dt_ag_op(tape, c->op, c->n_in, in, c->n_iargs, c->iargs, c->n_fargs, c->fargs,
                          nout, out));
  }
  if (*r == NULL) { /* weights of the output, fixed per case */
    dt_tensor_t ov = dt_var_value(out[0]);
    int nd;
    int64_t shape[DT_MAX_DIMS], n = 1;
    DT_ASSERT_OK(dt_tensor_ndim(ov, &nd));
    DT_ASSERT_OK(dt_tensor_shape(ov, shape));
    for (int d = 0; d < nd; d++) n *= shape[d];
    float* w = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) w[i] = (float)(0.5 + value_at(0, 7, i));
    dt_placement_t rep = dt_replicate();
    dt_tensor_t rt;
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, nd, shape, &rep, w, &rt));
    free(w);
    DT_ASSERT_OK(dt_var_leaf(rt, 0, r));
  }
  dt_var_t pr, loss, pair[2] = {out[0], *r};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, pair, 0, NULL, 0, NULL, 1, &pr));
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &pr, 1, all, 0, NULL, 1, &loss));
  return loss;
}

static double scalar_of(dt_var_t v) {
  float x;
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(v), &x, sizeof x));
  return x;
}

static int run_case(const gcase_t* c, int variant) {
  dt_var_t in[3] = {NULL, NULL, NULL}, r = NULL;
  float* full[3] = {NULL, NULL, NULL};
  dt_placement_t pl[3];
  for (int t = 0; t < c->n_in; t++) {
    int64_t n = numel(c, t);
    int nd = c->nd[t];
    /* variant 0: all R; 1: S(0); 2: S(last) on input 0 and R elsewhere */
    pl[t] = variant == 0 || (variant == 2 && t > 0) ? dt_replicate()
            : variant == 1                          ? dt_shard(0)
                                                    : dt_shard(nd - 1);
    if (c->kind[t] == 2) {
      int64_t* ix = malloc(sizeof(int64_t) * (size_t)n);
      for (int64_t i = 0; i < n; i++) ix[i] = (i * 3 + 1) % c->idx_hi;
      dt_tensor_t tv;
      DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, nd, c->shape[t], &pl[t], ix, &tv));
      free(ix);
      DT_ASSERT_OK(dt_var_leaf(tv, 0, &in[t]));
      continue;
    }
    full[t] = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) full[t][i] = (float)value_at(c->kind[t], t, i);
    dt_tensor_t tv;
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, nd, c->shape[t], &pl[t], full[t], &tv));
    DT_ASSERT_OK(dt_var_leaf(tv, c->kind[t] != 3, &in[t]));
  }
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t loss = forward(tape, c, in, &r);
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tape_reset(tape));
  int checked = 0;
  const float h = 1e-2f;
  dt_grad_set_enabled(0);
  for (int t = 0; t < c->n_in; t++) {
    if (c->kind[t] >= 2) continue;
    dt_tensor_t gt = dt_var_grad(in[t]);
    DT_ASSERT_TRUE(gt != NULL, "%s: input %d got no gradient", c->name, t);
    dt_placement_t gp;
    DT_ASSERT_OK(dt_tensor_placements(gt, &gp));
    DT_ASSERT_TRUE(dt_placement_equal(gp, pl[t]), "%s: gradient placement differs from input %d",
                   c->name, t);
    int64_t n = numel(c, t);
    float* ga = malloc(sizeof(float) * (size_t)n);
    DT_ASSERT_OK(dt_tensor_gather_full(gt, ga, sizeof(float) * (size_t)n));
    int64_t step = n > 10 ? n / 10 : 1;
    for (int64_t i = 0; i < n; i += step) {
      double lp, lm;
      for (int sgn = 0; sgn < 2; sgn++) {
        float save = full[t][i];
        full[t][i] = save + (sgn ? -h : h);
        dt_tensor_t tv;
        DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, c->nd[t], c->shape[t], &pl[t], full[t],
                                         &tv));
        dt_tensor_t old = dt_var_value(in[t]);
        (void)old;
        dt_var_t probe;
        DT_ASSERT_OK(dt_var_leaf(tv, 0, &probe));
        dt_var_t args[3];
        for (int u = 0; u < c->n_in; u++) args[u] = u == t ? probe : in[u];
        dt_var_t l = forward(tape, c, args, &r);
        double v = scalar_of(l);
        if (sgn) lm = v;
        else lp = v;
        DT_ASSERT_OK(dt_tape_reset(tape));
        DT_ASSERT_OK(dt_var_destroy(probe));
        full[t][i] = save;
      }
      double num = (lp - lm) / (2.0 * h), ana = ga[i];
      DT_ASSERT_TRUE(fabs(ana - num) <= 4e-3 + 3e-2 * fabs(num),
                     "%s (variant %d) input %d element %lld: analytic %.6g, numeric %.6g", c->name,
                     variant, t, (long long)i, ana, num);
      checked++;
    }
    free(ga);
  }
  dt_grad_set_enabled(1);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  for (int t = 0; t < c->n_in; t++) {
    DT_ASSERT_OK(dt_var_destroy(in[t]));
    free(full[t]);
  }
  DT_ASSERT_OK(dt_var_destroy(r));
  return checked;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_n));
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, NULL, NULL, &g_mesh));
  int total = 0, ncases = (int)(sizeof kCases / sizeof kCases[0]);
  const char* only = getenv("DT_TEST_CASE");
  for (int k = 0; k < ncases; k++) {
    if (only && strcmp(only, kCases[k].name)) continue;
    DT_ASSERT_TRUE(dt_ag_has_backward(kCases[k].op), "%s has no backward", kCases[k].op);
    for (int v = 0; v < 3; v++) total += run_case(&kCases[k], v);
  }
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  if (g_rank == 0)
    printf("test_gradcheck: %d cases, %d gradient elements within tolerance on %d ranks\n", ncases,
           total, g_n);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

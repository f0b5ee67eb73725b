/* test_layers.c - the layers of one's own models (np 1, 2 and 4).
 *
 *  - Linear: parameters "weight" (out, in) and "bias" (out), replicated, uniform within PyTorch's
 *    bound 1/sqrt(in) with the uniform's mean and variance, the same on every rank and for the
 *    same (seed, name), different otherwise; its forward is x W^T + b (host reference); without a
 *    bias it has one parameter; bad sizes and names are errors;
 *  - activations: relu's forward, and ops that are not activations refused;
 *  - Sequential: qualified names, the forward equals the children run by hand, a loss's backward
 *    reaches every parameter and dt_module_zero_grad clears them; dt_module_params lists them in
 *    dt_module_param_at order; a child that has a parent or a repeated name is refused, nothing
 *    taken; an empty one is the identity;
 *  - losses: MSE (mean, sum, none; the gradient 2 (p - t) / N; batch-sharded the same) and
 *    cross-entropy (mean equals dt_ag_cross_entropy, sum = N mean, none per row against the host),
 *    shape and reduction errors;
 *  - a missing parameter: dt_module_get and dt_module_param name the module, the name and the
 *    parameters it has, and so does a forward that fails after the miss (once, through a
 *    Sequential too); a probe miss that the forward recovers from blames nothing later;
 *  - dt_adamw_config_default is torch.optim.AdamW's, DT_ADAMW_LR_CONFIG steps with cfg.lr (bit for
 *    bit as the explicit rate), other negative rates and a NaN configured rate are errors.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/module.h"
#include "dtensor/nn.h"

static dt_mesh_t g_mesh;
static int g_world;

static dt_placement_t R(void) { return dt_replicate(); }

/* A replicated (or pl-placed) f32 variable of the given values; requires_grad as given. */
static dt_var_t var_of(int nd, const int64_t* shape, const float* v, const dt_placement_t* pl,
                      int rg) {
  dt_placement_t rep[1] = {R()};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, nd, shape, pl ? pl : rep, v, &t));
  dt_var_t x;
  DT_ASSERT_OK(dt_var_leaf(t, rg, &x));
  return x;
}

static void full_of(dt_tensor_t t, float* out, size_t n) {
  DT_ASSERT_OK(dt_tensor_gather_full(t, out, sizeof(float) * n));
}

/* The same buffer on every rank (bit for bit). */
static void assert_same_on_ranks(const float* v, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += v[i] * (i + 1.0);
  double lo = s, hi = s;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  DT_ASSERT_TRUE(lo == hi, "checksum %.17g vs %.17g across ranks", lo, hi);
}

static void linear_values(dt_module_t m, float* w, float* b, int64_t out_f, int64_t in_f) {
  dt_var_t p;
  DT_ASSERT_OK(dt_module_param(m, "weight", &p));
  full_of(dt_var_value(p), w, (size_t)(out_f * in_f));
  if (b) {
    DT_ASSERT_OK(dt_module_param(m, "bias", &p));
    full_of(dt_var_value(p), b, (size_t)out_f);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Linear */

static void test_linear(void) {
  dt_module_t m, same, other_name, other_seed, nob;
  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc", 5, 3, 1, 7, &m));
  DT_ASSERT_TRUE(strcmp(dt_module_name(m), "fc") == 0, "name %s", dt_module_name(m));
  int n;
  DT_ASSERT_OK(dt_module_num_params(m, &n));
  DT_ASSERT_EQ(n, 2);
  char name[64];
  dt_var_t p;
  DT_ASSERT_OK(dt_module_param_at(m, 0, name, sizeof name, &p));
  DT_ASSERT_TRUE(strcmp(name, "weight") == 0, "first parameter %s", name);
  int nd;
  int64_t shape[2];
  dt_placement_t pl[1];
  DT_ASSERT_OK(dt_tensor_ndim(dt_var_value(p), &nd));
  DT_ASSERT_OK(dt_tensor_shape(dt_var_value(p), shape));
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(p), pl));
  DT_ASSERT_EQ(nd, 2);
  DT_ASSERT_EQ(shape[0], 3);
  DT_ASSERT_EQ(shape[1], 5);
  DT_ASSERT_EQ(pl[0].kind, DT_REPLICATE);
  int rg;
  DT_ASSERT_OK(dt_var_requires_grad(p, &rg));
  DT_ASSERT_EQ(rg, 1);
  DT_ASSERT_OK(dt_module_param_at(m, 1, name, sizeof name, &p));
  DT_ASSERT_TRUE(strcmp(name, "bias") == 0, "second parameter %s", name);
  DT_ASSERT_OK(dt_tensor_ndim(dt_var_value(p), &nd));
  DT_ASSERT_OK(dt_tensor_shape(dt_var_value(p), shape));
  DT_ASSERT_EQ(nd, 1);
  DT_ASSERT_EQ(shape[0], 3);

  float w[15], b[3], w2[15], b2[3];
  linear_values(m, w, b, 3, 5);
  const float bound = (float)(1.0 / sqrt(5.0));
  for (int i = 0; i < 15; i++) DT_ASSERT_TRUE(fabsf(w[i]) <= bound, "w[%d] = %g", i, w[i]);
  for (int i = 0; i < 3; i++) DT_ASSERT_TRUE(fabsf(b[i]) <= bound, "b[%d] = %g", i, b[i]);
  assert_same_on_ranks(w, 15);
  assert_same_on_ranks(b, 3);
  DT_ASSERT_TRUE(w[0] != w[1] && b[0] != b[1], "values vary");

  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc", 5, 3, 1, 7, &same));
  linear_values(same, w2, b2, 3, 5);
  DT_ASSERT_TRUE(memcmp(w, w2, sizeof w) == 0 && memcmp(b, b2, sizeof b) == 0,
                 "same (seed, name): same values");
  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc2", 5, 3, 1, 7, &other_name));
  linear_values(other_name, w2, b2, 3, 5);
  DT_ASSERT_TRUE(memcmp(w, w2, sizeof w) != 0 && memcmp(b, b2, sizeof b) != 0,
                 "another name: other values");
  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc", 5, 3, 1, 8, &other_seed));
  linear_values(other_seed, w2, b2, 3, 5);
  DT_ASSERT_TRUE(memcmp(w, w2, sizeof w) != 0, "another seed: other values");
  DT_ASSERT_TRUE(memcmp(w, b, sizeof b) != 0, "weight and bias streams differ");

  /* the forward: x (4, 5) -> x W^T + b (4, 3) */
  float xv[20], y[12];
  for (int i = 0; i < 20; i++) xv[i] = (float)((i * 7) % 11 - 5) / 4.0f;
  dt_var_t x = var_of(2, (int64_t[]){4, 5}, xv, NULL, 0), out;
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_module_forward(m, tape, 1, &x, 1, &out));
  full_of(dt_var_value(out), y, 12);
  for (int r = 0; r < 4; r++)
    for (int o = 0; o < 3; o++) {
      double want = b[o];
      for (int k = 0; k < 5; k++) want += (double)xv[r * 5 + k] * w[o * 5 + k];
      DT_ASSERT_TRUE(fabs(y[r * 3 + o] - want) < 1e-5, "y[%d][%d] = %g, want %g", r, o,
                     y[r * 3 + o], want);
    }
  /* x (2, 2, 5): batch dims kept */
  int64_t os[3];
  dt_var_t x3 = var_of(3, (int64_t[]){2, 2, 5}, xv, NULL, 0);
  DT_ASSERT_OK(dt_module_forward(m, tape, 1, &x3, 1, &out));
  DT_ASSERT_OK(dt_tensor_shape(dt_var_value(out), os));
  DT_ASSERT_TRUE(os[0] == 2 && os[1] == 2 && os[2] == 3, "(2, 2, 3), got (%lld, %lld, %lld)",
                 (long long)os[0], (long long)os[1], (long long)os[2]);

  /* without a bias: one parameter, x W^T, and no lookup miss on the way */
  DT_ASSERT_OK(dt_linear_create(g_mesh, "nob", 5, 3, 0, 7, &nob));
  DT_ASSERT_OK(dt_module_num_params(nob, &n));
  DT_ASSERT_EQ(n, 1);
  dt_clear_error();
  DT_ASSERT_OK(dt_module_forward(nob, tape, 1, &x, 1, &out));
  DT_ASSERT_TRUE(dt_last_error()[0] == '\0', "a forward without a bias left '%s'",
                 dt_last_error());
  float wn[15];
  linear_values(nob, wn, NULL, 3, 5);
  full_of(dt_var_value(out), y, 12);
  for (int o = 0; o < 3; o++) {
    double want = 0;
    for (int k = 0; k < 5; k++) want += (double)xv[k] * wn[o * 5 + k];
    DT_ASSERT_TRUE(fabs(y[o] - want) < 1e-5, "no bias: y[0][%d] = %g, want %g", o, y[o], want);
  }
  /* the wrong number of inputs */
  dt_var_t two[2] = {x, x};
  DT_ASSERT_STATUS(dt_module_forward(m, tape, 2, two, 1, &out), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(x3));

  /* PyTorch's distribution: uniform in [-1/16, 1/16) for in = 256: mean 0, variance bound^2 / 3 */
  dt_module_t big;
  enum { O = 64, I = 256 };
  static float wb[O * I];
  DT_ASSERT_OK(dt_linear_create(g_mesh, "big", I, O, 1, 1, &big));
  linear_values(big, wb, NULL, O, I);
  double mean = 0, var = 0, lo = 1, hi = -1;
  for (int i = 0; i < O * I; i++) {
    mean += wb[i];
    lo = fmin(lo, wb[i]);
    hi = fmax(hi, wb[i]);
  }
  mean /= O * I;
  for (int i = 0; i < O * I; i++) var += (wb[i] - mean) * (wb[i] - mean);
  var /= O * I;
  const double bb = 1.0 / 16.0;
  DT_ASSERT_TRUE(lo >= -bb && hi <= bb && lo < -0.99 * bb && hi > 0.99 * bb, "range [%g, %g]",
                 lo, hi);
  DT_ASSERT_TRUE(fabs(mean) < 0.02 * bb, "mean %g", mean);
  DT_ASSERT_TRUE(fabs(var / (bb * bb / 3) - 1) < 0.05, "variance %g, want %g", var, bb * bb / 3);

  dt_module_t bad;
  DT_ASSERT_STATUS(dt_linear_create(g_mesh, "fc", 0, 3, 1, 7, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(bad == NULL, "out nulled");
  DT_ASSERT_STATUS(dt_linear_create(g_mesh, "fc", 5, -1, 1, 7, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_linear_create(g_mesh, "a.b", 5, 3, 1, 7, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_linear_create(NULL, "fc", 5, 3, 1, 7, &bad), DT_ERR_INVALID_ARG);

  dt_module_t ms[6] = {m, same, other_name, other_seed, nob, big};
  for (int i = 0; i < 6; i++) DT_ASSERT_OK(dt_module_destroy(ms[i]));
}

/* ---------------------------------------------------------------------------------------------
 * activations */

static void test_activation(void) {
  dt_module_t act, bad;
  DT_ASSERT_OK(dt_activation_create("act", "relu", &act));
  int n;
  DT_ASSERT_OK(dt_module_num_params(act, &n));
  DT_ASSERT_EQ(n, 0);
  float xv[6] = {-2, -0.5f, 0, 0.5f, 1, 3}, y[6];
  dt_var_t x = var_of(1, (int64_t[]){6}, xv, NULL, 0), out;
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_module_forward(act, tape, 1, &x, 1, &out));
  full_of(dt_var_value(out), y, 6);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  for (int i = 0; i < 6; i++)
    DT_ASSERT_TRUE(y[i] == (xv[i] > 0 ? xv[i] : 0), "relu(%g) = %g", xv[i], y[i]);
  DT_ASSERT_OK(dt_module_destroy(act));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_activation_create("g", "gelu", &act));
  DT_ASSERT_OK(dt_module_destroy(act));
  DT_ASSERT_STATUS(dt_activation_create("a", "nope", &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "'nope'") != NULL, "message: %s", dt_last_error());
  DT_ASSERT_STATUS(dt_activation_create("a", "add", &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_activation_create("a", "cast", &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_activation_create("a", "topk", &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(bad == NULL, "out nulled");
}

/* ---------------------------------------------------------------------------------------------
 * Sequential, dt_module_params, dt_module_zero_grad */

static dt_module_t make_mlp(const char* name) {
  dt_module_t c[3], m;
  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc1", 5, 8, 1, 3, &c[0]));
  DT_ASSERT_OK(dt_activation_create("act", "relu", &c[1]));
  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc2", 8, 3, 1, 3, &c[2]));
  DT_ASSERT_OK(dt_sequential_create(name, 3, c, &m));
  return m;
}

static void test_sequential(void) {
  dt_module_t m = make_mlp("mlp");
  const char* want[4] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  dt_var_t* params;
  int n;
  DT_ASSERT_OK(dt_module_params(m, &params, &n));
  DT_ASSERT_EQ(n, 4);
  for (int i = 0; i < 4; i++) {
    char name[64];
    dt_var_t p;
    DT_ASSERT_OK(dt_module_param_at(m, i, name, sizeof name, &p));
    DT_ASSERT_TRUE(strcmp(name, want[i]) == 0, "parameter %d: %s, want %s", i, name, want[i]);
    DT_ASSERT_TRUE(params[i] == p, "dt_module_params[%d] is the parameter at %d", i, i);
  }
  dt_module_t fc1, act, fc2;
  DT_ASSERT_OK(dt_module_find(m, "fc1", &fc1));
  DT_ASSERT_OK(dt_module_find(m, "act", &act));
  DT_ASSERT_OK(dt_module_find(m, "fc2", &fc2));
  DT_ASSERT_TRUE(dt_module_parent(fc1) == m, "fc1's parent");

  float xv[20], tv[12];
  for (int i = 0; i < 20; i++) xv[i] = (float)((i * 5) % 9 - 4) / 3.0f;
  for (int i = 0; i < 12; i++) tv[i] = (float)(i % 3) - 1.0f;
  dt_var_t x = var_of(2, (int64_t[]){4, 5}, xv, NULL, 0);
  dt_var_t t = var_of(2, (int64_t[]){4, 3}, tv, NULL, 0);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t y, h, y2;
  DT_ASSERT_OK(dt_module_forward(m, tape, 1, &x, 1, &y));
  DT_ASSERT_OK(dt_module_forward(fc1, tape, 1, &x, 1, &h));
  DT_ASSERT_OK(dt_module_forward(act, tape, 1, &h, 1, &h));
  DT_ASSERT_OK(dt_module_forward(fc2, tape, 1, &h, 1, &y2));
  float a[12], b[12];
  full_of(dt_var_value(y), a, 12);
  full_of(dt_var_value(y2), b, 12);
  DT_ASSERT_TRUE(memcmp(a, b, sizeof a) == 0, "the sequential's forward is its children's");
  dt_var_t loss;
  DT_ASSERT_OK(dt_nn_mse_loss(tape, y, t, DT_LOSS_MEAN, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tape_reset(tape));
  for (int i = 0; i < 4; i++)
    DT_ASSERT_TRUE(dt_var_grad(params[i]) != NULL, "%s has a gradient", want[i]);
  DT_ASSERT_OK(dt_module_zero_grad(m));
  for (int i = 0; i < 4; i++)
    DT_ASSERT_TRUE(dt_var_grad(params[i]) == NULL, "%s's gradient cleared", want[i]);
  DT_ASSERT_OK(dt_module_zero_grad(m)); /* twice is fine */

  /* children that cannot be taken: nothing is */
  dt_module_t c[2], bad = NULL;
  DT_ASSERT_OK(dt_linear_create(g_mesh, "fc1", 2, 2, 1, 3, &c[0]));
  c[1] = fc2; /* has a parent */
  DT_ASSERT_STATUS(dt_sequential_create("s", 2, c, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(bad == NULL && dt_module_parent(c[0]) == NULL && dt_module_parent(fc2) == m,
                 "nothing taken");
  DT_ASSERT_OK(dt_activation_create("fc1", "relu", &c[1])); /* the same name as c[0] */
  DT_ASSERT_STATUS(dt_sequential_create("s", 2, c, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "'fc1'") != NULL, "message: %s", dt_last_error());
  DT_ASSERT_TRUE(dt_module_parent(c[0]) == NULL && dt_module_parent(c[1]) == NULL,
                 "nothing taken");
  DT_ASSERT_STATUS(dt_sequential_create("s", -1, c, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_module_destroy(c[0]));
  DT_ASSERT_OK(dt_module_destroy(c[1]));

  /* empty: the identity; a child appended later runs */
  dt_module_t s, relu;
  DT_ASSERT_OK(dt_sequential_create("s", 0, NULL, &s));
  dt_var_t same;
  DT_ASSERT_OK(dt_module_forward(s, tape, 1, &x, 1, &same));
  DT_ASSERT_TRUE(same == x, "an empty sequential returns its input");
  DT_ASSERT_OK(dt_activation_create("r", "relu", &relu));
  DT_ASSERT_OK(dt_module_add_child(s, relu));
  DT_ASSERT_OK(dt_module_forward(s, tape, 1, &x, 1, &same));
  float r[20];
  full_of(dt_var_value(same), r, 20);
  for (int i = 0; i < 20; i++)
    DT_ASSERT_TRUE(r[i] == fmaxf(xv[i], 0), "appended relu: %d: %g from %g", i, r[i], xv[i]);
  DT_ASSERT_OK(dt_module_params(s, &params, &n));
  DT_ASSERT_EQ(n, 0);

  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_module_destroy(s));
  DT_ASSERT_OK(dt_module_destroy(m));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(t));
}

/* ---------------------------------------------------------------------------------------------
 * losses */

static float scalar(dt_var_t v) {
  int nd;
  DT_ASSERT_OK(dt_tensor_ndim(dt_var_value(v), &nd));
  DT_ASSERT_EQ(nd, 0);
  float s;
  full_of(dt_var_value(v), &s, 1);
  return s;
}

static void test_losses(void) {
  enum { N = 4, C = 5 };
  float pv[N * C], tv[N * C];
  for (int i = 0; i < N * C; i++) {
    pv[i] = (float)((i * 3) % 7 - 3) / 2.0f;
    tv[i] = (float)((i * 5) % 4 - 1);
  }
  double se = 0;
  for (int i = 0; i < N * C; i++) se += ((double)pv[i] - tv[i]) * ((double)pv[i] - tv[i]);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  const int64_t shape[2] = {N, C};
  dt_placement_t s0[1] = {dt_shard(0)};
  for (int sharded = 0; sharded < 2; sharded++) {
    dt_var_t p = var_of(2, shape, pv, sharded ? s0 : NULL, 1);
    dt_var_t t = var_of(2, shape, tv, sharded ? s0 : NULL, 0);
    dt_var_t l;
    DT_ASSERT_OK(dt_nn_mse_loss(tape, p, t, DT_LOSS_MEAN, &l));
    DT_ASSERT_TRUE(fabs(scalar(l) - se / (N * C)) < 1e-6, "mse mean %g, want %g", scalar(l),
                   se / (N * C));
    DT_ASSERT_OK(dt_tape_backward(tape, l));
    float g[N * C];
    full_of(dt_var_grad(p), g, N * C);
    for (int i = 0; i < N * C; i++)
      DT_ASSERT_TRUE(fabs(g[i] - 2.0 * (pv[i] - tv[i]) / (N * C)) < 1e-6, "grad[%d] = %g", i,
                     g[i]);
    DT_ASSERT_OK(dt_nn_mse_loss(tape, p, t, DT_LOSS_SUM, &l));
    DT_ASSERT_TRUE(fabs(scalar(l) - se) < 1e-5, "mse sum %g, want %g", scalar(l), se);
    DT_ASSERT_OK(dt_nn_mse_loss(tape, p, t, DT_LOSS_NONE, &l));
    int64_t ls[2];
    DT_ASSERT_OK(dt_tensor_shape(dt_var_value(l), ls));
    DT_ASSERT_TRUE(ls[0] == N && ls[1] == C, "none: the input's shape");
    float e[N * C];
    full_of(dt_var_value(l), e, N * C);
    for (int i = 0; i < N * C; i++)
      DT_ASSERT_TRUE(fabs(e[i] - (pv[i] - tv[i]) * (pv[i] - tv[i])) < 1e-6, "none[%d]", i);
    DT_ASSERT_OK(dt_tape_reset(tape));
    DT_ASSERT_OK(dt_var_destroy(p));
    DT_ASSERT_OK(dt_var_destroy(t));
  }
  dt_var_t p = var_of(2, shape, pv, NULL, 1), l;
  dt_var_t t3 = var_of(2, (int64_t[]){N, C - 1}, tv, NULL, 0);
  DT_ASSERT_STATUS(dt_nn_mse_loss(tape, p, t3, DT_LOSS_MEAN, &l), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(l == NULL, "out nulled");
  char shapes[96];
  snprintf(shapes, sizeof shapes, "pred (%d, %d) and target (%d, %d)", (int)N, (int)C, (int)N,
           (int)C - 1);
  DT_ASSERT_TRUE(strstr(dt_last_error(), shapes) != NULL, "message names both shapes: %s",
                 dt_last_error());
  DT_ASSERT_STATUS(dt_nn_mse_loss(tape, p, p, (dt_loss_reduction_t)7, &l), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_nn_mse_loss(tape, p, NULL, DT_LOSS_MEAN, &l), DT_ERR_INVALID_ARG);

  /* cross-entropy: logits pv as (N, C), classes 0..C-1 */
  int64_t cls[N] = {0, 3, 4, 1};
  dt_placement_t rep[1] = {R()};
  dt_tensor_t ct;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 1, (int64_t[]){N}, rep, cls, &ct));
  dt_var_t y;
  DT_ASSERT_OK(dt_var_leaf(ct, 0, &y));
  double rows[N], mean = 0;
  for (int r = 0; r < N; r++) {
    double mx = -1e30, s = 0;
    for (int c = 0; c < C; c++) mx = fmax(mx, pv[r * C + c]);
    for (int c = 0; c < C; c++) s += exp(pv[r * C + c] - mx);
    rows[r] = mx + log(s) - pv[r * C + cls[r]];
    mean += rows[r] / N;
  }
  dt_var_t lm, lref, ls, ln;
  DT_ASSERT_OK(dt_nn_cross_entropy(tape, p, y, DT_LOSS_MEAN, &lm));
  DT_ASSERT_OK(dt_ag_cross_entropy(tape, p, y, &lref));
  DT_ASSERT_TRUE(scalar(lm) == scalar(lref), "mean %g, dt_ag_cross_entropy %g", scalar(lm),
                 scalar(lref));
  DT_ASSERT_TRUE(fabs(scalar(lm) - mean) < 1e-5, "cross-entropy %g, want %g", scalar(lm), mean);
  DT_ASSERT_OK(dt_nn_cross_entropy(tape, p, y, DT_LOSS_SUM, &ls));
  DT_ASSERT_TRUE(fabs(scalar(ls) - N * mean) < 1e-5, "sum %g, want %g", scalar(ls), N * mean);
  DT_ASSERT_OK(dt_nn_cross_entropy(tape, p, y, DT_LOSS_NONE, &ln));
  float rv[N];
  full_of(dt_var_value(ln), rv, N);
  for (int r = 0; r < N; r++)
    DT_ASSERT_TRUE(fabs(rv[r] - rows[r]) < 1e-5, "row %d: %g, want %g", r, rv[r], rows[r]);
  DT_ASSERT_OK(dt_tape_backward(tape, lm));
  DT_ASSERT_TRUE(dt_var_grad(p) != NULL, "cross-entropy reaches the logits");
  DT_ASSERT_STATUS(dt_nn_cross_entropy(tape, p, y, (dt_loss_reduction_t)-1, &ln),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(p));
  DT_ASSERT_OK(dt_var_destroy(t3));
  DT_ASSERT_OK(dt_var_destroy(y));
}

/* ---------------------------------------------------------------------------------------------
 * a missing parameter */

/* A forward with a typo: dt_module_get(m, "wieght") */
static dt_status_t fwd_typo(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                            int n_out, dt_var_t* out) {
  (void)n_in, (void)n_out;
  return dt_nn_linear(tape, in[0], dt_module_get(m, "wieght"), dt_module_get(m, "bias"), out);
}
/* A forward that probes for an optional parameter and then fails for another reason. */
static dt_status_t fwd_probe(dt_module_t m, dt_tape_t tape, int n_in,
                                       const dt_var_t* in, int n_out, dt_var_t* out) {
  (void)tape, (void)n_in, (void)in, (void)n_out, (void)out;
  (void)dt_module_get(m, "optional");
  return DT_SUCCESS;
}
static dt_status_t fwd_fail(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                            int n_out, dt_var_t* out) {
  (void)m, (void)tape, (void)n_in, (void)in, (void)n_out, (void)out;
  return DT_FAIL(DT_ERR_INVALID_USAGE, "plain failure");
}

static int count(const char* s, const char* sub) {
  int n = 0;
  for (const char* p = strstr(s, sub); p; p = strstr(p + 1, sub)) n++;
  return n;
}

static void test_missing_param(void) {
  const char* want = "module 'mlp' has no parameter 'wieght' (it has: weight, bias)";
  dt_module_t m;
  DT_ASSERT_OK(dt_module_create("mlp", fwd_typo, NULL, &m));
  float wv[6] = {1, 2, 3, 4, 5, 6}, bv[2] = {0, 1};
  DT_ASSERT_OK(dt_module_add_param(m, "weight", var_of(2, (int64_t[]){2, 3}, wv, NULL, 1)));
  DT_ASSERT_OK(dt_module_add_param(m, "bias", var_of(1, (int64_t[]){2}, bv, NULL, 1)));

  dt_clear_error();
  DT_ASSERT_TRUE(dt_module_get(m, "wieght") == NULL, "no such parameter");
  DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "dt_module_get: '%s'", dt_last_error());
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dt_module_get") != NULL, "names the function: '%s'",
                 dt_last_error());
  dt_var_t p;
  DT_ASSERT_STATUS(dt_module_param(m, "wieght", &p), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "dt_module_param: '%s'", dt_last_error());

  /* the forward that used the NULL fails, and says why */
  float xv[3] = {1, 1, 1};
  dt_var_t x = var_of(2, (int64_t[]){1, 3}, xv, NULL, 0), y;
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_STATUS(dt_module_forward(m, tape, 1, &x, 1, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "forward: '%s'", dt_last_error());
  DT_ASSERT_TRUE(strstr(dt_last_error(), "failed after dt_module_get(\"wieght\"): ") != NULL &&
                 strstr(dt_last_error(), "after dt_module_forward") == NULL,
                 "the miss is named after dt_module_get: '%s'", dt_last_error());

  /* inside a Sequential: reported once */
  dt_module_t seq, probe, fail, outer;
  DT_ASSERT_OK(dt_sequential_create("outer", 1, &m, &seq));
  DT_ASSERT_STATUS(dt_module_forward(seq, tape, 1, &x, 1, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_EQ(count(dt_last_error(), "has no parameter 'wieght'"), 1);

  /* a probe miss the forward recovers from blames nothing later */
  DT_ASSERT_OK(dt_module_create("probe", fwd_probe, NULL, &probe));
  DT_ASSERT_OK(dt_module_create("fail", fwd_fail, NULL, &fail));
  dt_module_t pf[2] = {probe, fail};
  DT_ASSERT_OK(dt_sequential_create("pf", 2, pf, &outer));
  DT_ASSERT_STATUS(dt_module_forward(fail, tape, 1, &x, 1, &y), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "optional") == NULL, "fail alone: '%s'",
                 dt_last_error());
  DT_ASSERT_STATUS(dt_module_forward(outer, tape, 1, &x, 1, &y), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "plain failure") != NULL &&
                 strstr(dt_last_error(), "optional") == NULL, "probe, then fail: '%s'",
                 dt_last_error());

  /* a long list is cut */
  dt_module_t many;
  DT_ASSERT_OK(dt_module_create("many", NULL, NULL, &many));
  for (int i = 0; i < 60; i++) {
    char name[32];
    snprintf(name, sizeof name, "a_rather_long_parameter_name_%d", i);
    DT_ASSERT_OK(dt_module_add_param(many, name, var_of(1, (int64_t[]){2}, bv, NULL, 1)));
  }
  DT_ASSERT_TRUE(dt_module_get(many, "x") == NULL, "none");
  DT_ASSERT_TRUE(strstr(dt_last_error(), "(60 in all)") != NULL, "'%s'", dt_last_error());
  DT_ASSERT_TRUE(strstr(dt_last_error(), "a_rather_long_parameter_name_0,") != NULL, "'%s'",
                 dt_last_error());
  dt_module_t none;
  DT_ASSERT_OK(dt_module_create("none", NULL, NULL, &none));
  DT_ASSERT_TRUE(dt_module_get(none, "w") == NULL, "none");
  DT_ASSERT_TRUE(strstr(dt_last_error(), "module 'none' has no parameter 'w' (it has: no "
                        "parameters)") != NULL, "'%s'", dt_last_error());

  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_module_destroy(seq));
  DT_ASSERT_OK(dt_module_destroy(outer));
  DT_ASSERT_OK(dt_module_destroy(many));
  DT_ASSERT_OK(dt_module_destroy(none));
}

/* ---------------------------------------------------------------------------------------------
 * AdamW's defaults */

static void test_adamw_default(void) {
  dt_adamw_config_t c = dt_adamw_config_default();
  DT_ASSERT_TRUE(c.lr == 1e-3 && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8 &&
                 c.weight_decay == 0.01 && c.bf16_moments == 0, "torch.optim.AdamW's defaults");
  float wv[6] = {1, -2, 3, -4, 5, -6};
  dt_var_t a = var_of(2, (int64_t[]){2, 3}, wv, NULL, 1);
  dt_var_t b = var_of(2, (int64_t[]){2, 3}, wv, NULL, 1);
  for (int k = 0; k < 2; k++) {
    dt_tensor_t g;
    dt_placement_t rep[1] = {R()};
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, (int64_t[]){2, 3}, rep, wv, &g));
    DT_ASSERT_OK(dt_var_set_grad(k ? b : a, g));
  }
  dt_adamw_t oa, ob, bad;
  DT_ASSERT_OK(dt_adamw_create(&c, 1, &a, &oa));
  DT_ASSERT_OK(dt_adamw_create(&c, 1, &b, &ob));
  DT_ASSERT_OK(dt_adamw_step(oa, DT_ADAMW_LR_CONFIG));
  DT_ASSERT_OK(dt_adamw_step(ob, 1e-3));
  float ra[6], rb[6];
  full_of(dt_var_value(a), ra, 6);
  full_of(dt_var_value(b), rb, 6);
  DT_ASSERT_TRUE(memcmp(ra, rb, sizeof ra) == 0, "DT_ADAMW_LR_CONFIG steps with cfg.lr");
  DT_ASSERT_TRUE(ra[0] != wv[0], "the step moved the parameter");
  DT_ASSERT_STATUS(dt_adamw_step(oa, -2.0), DT_ERR_INVALID_ARG);
  c.lr = NAN;
  DT_ASSERT_STATUS(dt_adamw_create(&c, 1, &a, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_adamw_destroy(oa));
  DT_ASSERT_OK(dt_adamw_destroy(ob));
  DT_ASSERT_OK(dt_var_destroy(a));
  DT_ASSERT_OK(dt_var_destroy(b));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank;
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &g_mesh));
  test_linear();
  test_activation();
  test_sequential();
  test_losses();
  test_missing_param();
  test_adamw_default();
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  if (rank == 0) printf("test_layers np=%d: ok\n", g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

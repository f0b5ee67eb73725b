/* test_hooks.c - modules and the hooks code built on the API uses (np 2 and 4).
 *
 *  - a nested module tree: qualified parameter names (unnamed modules and parameters add nothing
 *    to the path), lookup by path, replacement, and the errors (duplicate names, '.', cycles);
 *  - the order of pre/post forward and backward hooks on that tree, and a pre-forward hook
 *    replacing an input;
 *  - leaf gradient hooks: once per pass, when the gradient is complete (a parameter used twice);
 *  - a gradient left as it comes (Partial), accumulated over two passes and reduced once, equals
 *    the gradient reduced at once (small integers: exact), with one all-reduce instead of two;
 *  - a gathered parameter dropped after the forward and gathered again in the backward gives the
 *    same gradients, with exactly one more all-gather;
 *  - the Llama model as modules: block paths, names, hooks per block in order, a replaced
 *    parameter;
 *  - a tree nested so deep that qualified names pass the walk's 1023 characters is refused by
 *    the listings (names cut short there made two parameters share one name), not listed under
 *    truncated names.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/module.h"

static char g_log[2048];
static void logf_(const char* s) {
  size_t n = strlen(g_log);
  snprintf(g_log + n, sizeof g_log - n, "%s%s", n ? " " : "", s);
}

static dt_mesh_t g_mesh;
static int g_world;

/* A small f32 tensor with values v(i) = (i * 3 + seed) % 5 - 2, replicated. */
static dt_tensor_t small(int nd, const int64_t* shape, int seed, const dt_placement_t* pl) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  float buf[256];
  for (int64_t i = 0; i < n; i++) buf[i] = (float)((i * 3 + seed) % 5 - 2);
  dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, nd, shape, pl ? pl : rep, buf, &t));
  return t;
}

static dt_var_t leaf(int nd, const int64_t* shape, int seed, const dt_placement_t* pl) {
  dt_var_t v;
  DT_ASSERT_OK(dt_var_leaf(small(nd, shape, seed, pl), 1, &v));
  return v;
}

/* ---------------------------------------------------------------------------------------------
 * the tree: root { a { p (w) , "" (v) } , b ("") } */

static dt_status_t fwd_mul(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in, int n_out,
                           dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_var_t w = dt_module_get(m, "w");
  if (w == NULL) w = dt_module_get(m, "");
  dt_var_t pair[2] = {in[0], w};
  return dt_ag_op(tape, "mul", 2, pair, 0, NULL, 0, NULL, 1, out);
}
static dt_status_t fwd_add(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in, int n_out,
                           dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_var_t pair[2] = {in[0], dt_module_get(m, "v")};
  return dt_ag_op(tape, "add", 2, pair, 0, NULL, 0, NULL, 1, out);
}
/* runs the children in order */
static dt_status_t fwd_seq(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in, int n_out,
                           dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  int n;
  DT_CHECK(dt_module_num_children(m, &n));
  dt_var_t x = in[0];
  for (int i = 0; i < n; i++) {
    dt_module_t c;
    DT_CHECK(dt_module_child(m, i, &c));
    DT_CHECK(dt_module_forward(c, tape, 1, &x, 1, &x));
  }
  out[0] = x;
  return DT_SUCCESS;
}

static const char* tag(dt_module_t m) {
  const char* n = dt_module_name(m);
  return n[0] ? n : (dt_module_get(m, "v") ? "v" : "root");
}
static dt_status_t h_fpre(dt_module_t m, dt_tape_t t, int n, dt_var_t* v, void* ctx) {
  (void)t, (void)n, (void)v, (void)ctx;
  char s[32];
  snprintf(s, sizeof s, "F>%s", tag(m));
  logf_(s);
  return DT_SUCCESS;
}
static dt_status_t h_fpost(dt_module_t m, dt_tape_t t, int n, dt_var_t* v, void* ctx) {
  (void)t, (void)n, (void)v, (void)ctx;
  char s[32];
  snprintf(s, sizeof s, "F<%s", tag(m));
  logf_(s);
  return DT_SUCCESS;
}
static dt_status_t h_bpre(dt_module_t m, dt_tape_t t, void* ctx) {
  (void)t, (void)ctx;
  char s[32];
  snprintf(s, sizeof s, "B>%s", tag(m));
  logf_(s);
  return DT_SUCCESS;
}
static dt_status_t h_bpost(dt_module_t m, dt_tape_t t, void* ctx) {
  (void)t, (void)ctx;
  char s[32];
  snprintf(s, sizeof s, "B<%s", tag(m));
  logf_(s);
  return DT_SUCCESS;
}
/* pre-forward hook: feeds the module 2 * its input */
static dt_status_t h_double(dt_module_t m, dt_tape_t t, int n, dt_var_t* v, void* ctx) {
  (void)m, (void)n, (void)ctx;
  const double two[1] = {2.0};
  return dt_ag_op(t, "mul_scalar", 1, &v[0], 0, NULL, 1, two, 1, &v[0]);
}

static int g_hook_calls[3];
static float g_hook_seen[3][16];
static dt_status_t h_grad(dt_var_t v, void* ctx) {
  int k = (int)(intptr_t)ctx;
  g_hook_calls[k]++;
  int64_t n;
  DT_CHECK(dt_tensor_local_numel(dt_var_value(v), &n));
  int nd;
  int64_t shape[4], total = 1;
  DT_CHECK(dt_tensor_ndim(dt_var_value(v), &nd));
  DT_CHECK(dt_tensor_shape(dt_var_value(v), shape));
  for (int d = 0; d < nd; d++) total *= shape[d];
  return dt_tensor_gather_full(dt_var_grad(v), g_hook_seen[k], sizeof(float) * (size_t)total);
}

static void test_tree(void) {
  const int64_t s[1] = {4};
  dt_module_t root, a, p, vm, b;
  DT_ASSERT_OK(dt_module_create("", fwd_seq, NULL, &root));
  DT_ASSERT_OK(dt_module_create("a", fwd_seq, NULL, &a));
  DT_ASSERT_OK(dt_module_create("p", fwd_mul, NULL, &p));
  DT_ASSERT_OK(dt_module_create("", fwd_add, NULL, &vm));
  DT_ASSERT_OK(dt_module_create("b", fwd_mul, NULL, &b));
  dt_var_t w = leaf(1, s, 1, NULL), v = leaf(1, s, 2, NULL), bw = leaf(1, s, 3, NULL);
  DT_ASSERT_OK(dt_module_add_param(p, "w", w));
  DT_ASSERT_OK(dt_module_add_param(vm, "v", v));
  DT_ASSERT_OK(dt_module_add_param(b, "", bw));
  DT_ASSERT_OK(dt_module_add_child(a, p));
  DT_ASSERT_OK(dt_module_add_child(a, vm));
  DT_ASSERT_OK(dt_module_add_child(root, a));
  DT_ASSERT_OK(dt_module_add_child(root, b));

  /* names and lookup */
  int n;
  DT_ASSERT_OK(dt_module_num_params(root, &n));
  DT_ASSERT_EQ(n, 3);
  const char* want[3] = {"a.p.w", "a.v", "b"};
  dt_var_t wantv[3] = {w, v, bw};
  for (int i = 0; i < 3; i++) {
    char nm[64];
    dt_var_t x;
    DT_ASSERT_OK(dt_module_param_at(root, i, nm, sizeof nm, &x));
    DT_ASSERT_TRUE(strcmp(nm, want[i]) == 0 && x == wantv[i], "param %d is '%s'", i, nm);
    DT_ASSERT_OK(dt_module_param(root, want[i], &x));
    DT_ASSERT_TRUE(x == wantv[i], "lookup of %s", want[i]);
  }
  dt_module_t f;
  DT_ASSERT_OK(dt_module_find(root, "a.p", &f));
  DT_ASSERT_TRUE(f == p, "find a.p");
  DT_ASSERT_OK(dt_module_find(a, "", &f));
  DT_ASSERT_TRUE(f == a, "find ''");
  DT_ASSERT_STATUS(dt_module_find(root, "a.zz", &f), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(f == NULL, "failed find leaves NULL");
  dt_var_t x;
  DT_ASSERT_STATUS(dt_module_param(root, "a.p", &x), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_module_add_param(p, "w", w), DT_ERR_INVALID_ARG); /* duplicate */
  dt_module_t bad;
  DT_ASSERT_STATUS(dt_module_create("x.y", NULL, NULL, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_module_add_child(root, a), DT_ERR_INVALID_ARG); /* already a child */
  DT_ASSERT_STATUS(dt_module_add_child(p, root), DT_ERR_INVALID_ARG); /* cycle */
  DT_ASSERT_STATUS(dt_module_forward(a, NULL, 1, NULL, 1, &x), DT_ERR_INVALID_ARG);

  /* hooks on every module */
  dt_module_t all[5] = {root, a, p, vm, b};
  for (int i = 0; i < 5; i++) {
    DT_ASSERT_OK(dt_module_add_forward_pre_hook(all[i], h_fpre, NULL));
    DT_ASSERT_OK(dt_module_add_forward_post_hook(all[i], h_fpost, NULL));
    DT_ASSERT_OK(dt_module_add_backward_pre_hook(all[i], h_bpre, NULL));
    DT_ASSERT_OK(dt_module_add_backward_post_hook(all[i], h_bpost, NULL));
  }
  DT_ASSERT_OK(dt_module_add_forward_pre_hook(b, h_double, NULL));
  for (int k = 0; k < 3; k++) DT_ASSERT_OK(dt_var_set_grad_hook(wantv[k], h_grad, (void*)(intptr_t)k));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t in, y, loss;
  DT_ASSERT_OK(dt_var_leaf(small(1, s, 4, NULL), 0, &in));
  g_log[0] = '\0';
  DT_ASSERT_OK(dt_module_forward(root, tape, 1, &in, 1, &y));
  DT_ASSERT_TRUE(strcmp(g_log, "F>root F>a F>p F<p F>v F<v F<a F>b F<b F<root") == 0,
                 "forward hooks: %s", g_log);
  /* y = 2 * (x * w + v) * bw */
  float xs[4], ws[4], vs[4], bs[4], ys[4];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(in), xs, sizeof xs));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w), ws, sizeof ws));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(v), vs, sizeof vs));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(bw), bs, sizeof bs));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(y), ys, sizeof ys));
  for (int i = 0; i < 4; i++)
    DT_ASSERT_TRUE(ys[i] == 2 * (xs[i] * ws[i] + vs[i]) * bs[i], "y[%d] = %g", i, ys[i]);
  const int64_t all_dims[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, all_dims, 0, NULL, 1, &loss));
  g_log[0] = '\0';
  memset(g_hook_calls, 0, sizeof g_hook_calls);
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_TRUE(strcmp(g_log, "B>root B>b B<b B>a B>v B<v B>p B<p B<a B<root") == 0,
                 "backward hooks: %s", g_log);
  for (int k = 0; k < 3; k++) {
    DT_ASSERT_EQ(g_hook_calls[k], 1);
    float g[4];
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(wantv[k]), g, sizeof g));
    DT_ASSERT_TRUE(memcmp(g, g_hook_seen[k], sizeof g) == 0, "param %d: the hook saw a partial "
                   "gradient", k);
  }
  /* d/dw = 2 x bw, d/dv = 2 bw, d/dbw = 2 (x w + v) */
  float g[4];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(w), g, sizeof g));
  for (int i = 0; i < 4; i++) DT_ASSERT_TRUE(g[i] == 2 * xs[i] * bs[i], "dw[%d]", i);
  /* an op's result or a tape constant is no parameter (dt_tape_reset frees it) */
  DT_ASSERT_STATUS(dt_module_add_param(p, "y", y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "not a leaf") != NULL, "message: %s", dt_last_error());
  DT_ASSERT_STATUS(dt_module_set_param(root, "a.p.w", loss), DT_ERR_INVALID_ARG);
  dt_var_t c, prev = NULL;
  DT_ASSERT_OK(dt_tape_constant(tape, small(1, s, 5, NULL), &c));
  DT_ASSERT_STATUS(dt_module_swap_param(root, "a.p.w", c, &prev), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(prev == NULL, "a refused swap hands nothing back");
  DT_ASSERT_OK(dt_module_param(root, "a.p.w", &x));
  DT_ASSERT_TRUE(x == w, "the refused calls left the parameter in place");
  DT_ASSERT_OK(dt_module_param_holders(y, &n)); /* y was never held */
  DT_ASSERT_EQ(n, 0);
  /* replacing a parameter */
  dt_var_t w2 = leaf(1, s, 9, NULL);
  DT_ASSERT_OK(dt_module_set_param(root, "a.p.w", w2));
  DT_ASSERT_OK(dt_module_param(root, "a.p.w", &x));
  DT_ASSERT_TRUE(x == w2, "replaced");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(in));
  DT_ASSERT_OK(dt_module_destroy(root));
}

/* A parameter used twice gets its hook once, after its last use in backward order. */
static void test_shared_param_hook(void) {
  const int64_t s[1] = {4};
  dt_var_t w = leaf(1, s, 1, NULL);
  DT_ASSERT_OK(dt_var_set_grad_hook(w, h_grad, (void*)(intptr_t)0));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t x, y, z, loss;
  DT_ASSERT_OK(dt_var_leaf(small(1, s, 2, NULL), 0, &x));
  dt_var_t p1[2] = {x, w};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, p1, 0, NULL, 0, NULL, 1, &y));
  dt_var_t p2[2] = {y, w};
  DT_ASSERT_OK(dt_ag_op(tape, "add", 2, p2, 0, NULL, 0, NULL, 1, &z));
  const int64_t all_dims[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &z, 1, all_dims, 0, NULL, 1, &loss));
  memset(g_hook_calls, 0, sizeof g_hook_calls);
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_EQ(g_hook_calls[0], 1);
  float g[4], xs[4];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(w), g, sizeof g));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(x), xs, sizeof xs));
  for (int i = 0; i < 4; i++) DT_ASSERT_TRUE(g[i] == xs[i] + 1 && g_hook_seen[0][i] == g[i], "dw");
  DT_ASSERT_OK(dt_var_set_grad_hook(w, NULL, NULL));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(w));
}

/* loss = sum(x @ W) with x batch-sharded: W's gradient arrives Partial. Two passes. */
static void two_passes(dt_var_t W, dt_var_t x) {
  for (int pass = 0; pass < 2; pass++) {
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    dt_var_t y, loss, pair[2] = {x, W};
    DT_ASSERT_OK(dt_ag_op(tape, "mm", 2, pair, 0, NULL, 0, NULL, 1, &y));
    const int64_t all_dims[1] = {0};
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, all_dims, 0, NULL, 1, &loss));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_tape_destroy(tape));
  }
}

static void test_deferred_reduce(void) {
  const int64_t xs[2] = {2 * g_world, 3}, ws[2] = {3, 5};
  dt_placement_t s0[1] = {dt_shard(0)};
  dt_var_t x, Wi, Wd;
  DT_ASSERT_OK(dt_var_leaf(small(2, xs, 1, s0), 0, &x));
  Wi = leaf(2, ws, 2, NULL);
  Wd = leaf(2, ws, 2, NULL);
  dt_counters_t c0, c1, c2;
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c0));
  two_passes(Wi, x);
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c1));
  DT_ASSERT_OK(dt_var_set_grad_mode(Wd, DT_GRAD_AS_IS));
  two_passes(Wd, x);
  dt_placement_t pl[1];
  DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(Wd), pl));
  DT_ASSERT_TRUE(pl[0].kind == DT_PARTIAL, "a gradient left as it comes is Partial");
  DT_ASSERT_OK(dt_var_reduce_grad(Wd, NULL));
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c2));
  DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(Wd), pl));
  DT_ASSERT_TRUE(pl[0].kind == DT_REPLICATE, "reduced to the value's placements");
  float gi[15], gd[15];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(Wi), gi, sizeof gi));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(Wd), gd, sizeof gd));
  DT_ASSERT_TRUE(memcmp(gi, gd, sizeof gi) == 0, "deferred gradient differs from the immediate");
  uint64_t ar_now = c1.calls[DT_COLL_ALL_REDUCE] - c0.calls[DT_COLL_ALL_REDUCE];
  uint64_t ar_late = c2.calls[DT_COLL_ALL_REDUCE] - c1.calls[DT_COLL_ALL_REDUCE];
  DT_ASSERT_TRUE(ar_now == 2 && ar_late == 1, "all-reduces: immediate %llu, deferred %llu",
                 (unsigned long long)ar_now, (unsigned long long)ar_late);
  /* dt_var_set_grad: checked, NULL clears, ownership taken */
  const int64_t other[2] = {5, 3};
  dt_tensor_t wrong = small(2, other, 0, NULL);
  DT_ASSERT_STATUS(dt_var_set_grad(Wd, wrong), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_destroy(wrong));
  DT_ASSERT_OK(dt_var_set_grad(Wd, small(2, ws, 7, NULL)));
  DT_ASSERT_OK(dt_var_set_grad(Wd, NULL));
  DT_ASSERT_TRUE(dt_var_grad(Wd) == NULL, "cleared");
  DT_ASSERT_OK(dt_var_reduce_grad(Wd, NULL)); /* no gradient: no-op */
  DT_ASSERT_STATUS(dt_var_set_grad_mode(Wd, (dt_grad_mode_t)7), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(Wi));
  DT_ASSERT_OK(dt_var_destroy(Wd));
}

/* W sharded, gathered for the forward, dropped, gathered again by the backward. */
static void gathered_grad(int drop, float* g, size_t nb, uint64_t* gathers) {
  const int64_t xs[2] = {4, 2 * g_world}, ws[2] = {2 * g_world, 3};
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  dt_var_t x, W, Wg, y, loss;
  DT_ASSERT_OK(dt_var_leaf(small(2, xs, 1, NULL), 0, &x));
  W = leaf(2, ws, 2, s0);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_ag_redistribute(tape, W, r, &Wg));
  dt_var_t pair[2] = {x, Wg};
  DT_ASSERT_OK(dt_ag_op(tape, "mm", 2, pair, 0, NULL, 0, NULL, 1, &y));
  if (drop) {
    DT_ASSERT_OK(dt_tape_drop(tape, Wg));
    DT_ASSERT_TRUE(dt_var_value(Wg) == NULL, "dropped");
    DT_ASSERT_STATUS(dt_tape_drop(tape, W), DT_ERR_INVALID_USAGE);
  }
  const int64_t all_dims[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, all_dims, 0, NULL, 1, &loss));
  dt_counters_t c0, c1;
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c0));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c1));
  *gathers = c1.calls[DT_COLL_ALL_GATHER] - c0.calls[DT_COLL_ALL_GATHER];
  int64_t recomputed;
  DT_ASSERT_OK(dt_tape_checkpoint_stats(tape, NULL, &recomputed));
  DT_ASSERT_EQ(recomputed, drop ? 1 : 0);
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(W), g, nb));
  if (drop) { /* restore: present again; a second restore is a no-op */
    DT_ASSERT_OK(dt_tape_drop(tape, Wg));
    DT_ASSERT_OK(dt_tape_restore(tape, Wg));
    DT_ASSERT_TRUE(dt_var_value(Wg) != NULL, "restored");
    DT_ASSERT_OK(dt_tape_restore(tape, Wg));
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(W));
}

static void test_drop_and_regather(void) {
  float a[64], b[64];
  size_t nb = sizeof(float) * (size_t)(2 * g_world * 3);
  uint64_t ga, gb;
  gathered_grad(0, a, nb, &ga);
  gathered_grad(1, b, nb, &gb);
  DT_ASSERT_TRUE(memcmp(a, b, nb) == 0, "recomputed gather changed the gradient");
  DT_ASSERT_TRUE(gb == ga + 1, "all-gathers in backward: %llu kept, %llu dropped",
                 (unsigned long long)ga, (unsigned long long)gb);
}

/* dt_trace_set: an op event per dispatch, a redistribution event per moved input (with its index,
 * one level below its op), composites one level up from their pieces; nothing once cleared */
static int g_ev_ops, g_ev_red, g_ev_input, g_ev_maxdepth;
static void trace_cb(const dt_trace_event_t* e, void* ctx) {
  (void)ctx;
  if (e->kind == DT_TRACE_OP) {
    g_ev_ops++;
    if (e->depth > g_ev_maxdepth) g_ev_maxdepth = e->depth; /* ops only */
  } else {
    g_ev_red++;
    g_ev_input = e->input;
  }
}

static void test_trace(void) {
  const int64_t s[2] = {2 * g_world, 4};
  dt_placement_t s0[1] = {dt_shard(0)}, s1[1] = {dt_shard(1)};
  dt_tensor_t a = small(2, s, 1, s0), b = small(2, s, 2, s1), c;
  dt_trace_set(trace_cb, NULL);
  DT_ASSERT_OK(dt_add(a, b, &c));
  DT_ASSERT_TRUE(g_ev_ops == 1 && g_ev_red == 1 && g_ev_maxdepth == 0,
                 "add: %d op and %d redistribution events", g_ev_ops, g_ev_red);
  DT_ASSERT_TRUE(g_ev_input == 0 || g_ev_input == 1, "the moved input is named");
  dt_tensor_t logits = small(2, s, 3, s1), tgt, l;
  int64_t n = 2 * g_world, ids[64];
  for (int64_t i = 0; i < n; i++) ids[i] = i % 4;
  dt_placement_t r[1] = {dt_replicate()};
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 1, &n, r, ids, &tgt));
  g_ev_ops = g_ev_red = g_ev_maxdepth = 0;
  DT_ASSERT_OK(dt_cross_entropy(logits, tgt, DT_LOSS_MEAN, &l));
  DT_ASSERT_TRUE(g_ev_ops >= 9 && g_ev_maxdepth == 0, "cross_entropy pieces: %d", g_ev_ops);
  dt_tensor_t l2;
  g_ev_ops = 0;
  const int64_t mean[1] = {DT_LOSS_MEAN};
  dt_tensor_t in2[2] = {logits, tgt};
  DT_ASSERT_OK(dt_op_run("cross_entropy", 2, in2, 1, mean, 0, NULL, &l2));
  DT_ASSERT_TRUE(g_ev_ops >= 10 && g_ev_maxdepth == 1, "the composite and its pieces: %d, depth %d",
                 g_ev_ops, g_ev_maxdepth);
  dt_trace_set(NULL, NULL);
  g_ev_ops = 0;
  dt_tensor_t d;
  DT_ASSERT_OK(dt_add(a, b, &d));
  DT_ASSERT_EQ(g_ev_ops, 0);
  dt_tensor_t all[] = {a, b, c, d, logits, tgt, l, l2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) DT_ASSERT_OK(dt_tensor_destroy(all[i]));
}

/* ---------------------------------------------------------------------------------------------
 * Llama as modules */

static void test_llama_modules(void) {
  dt_llama_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.dim = 16;
  cfg.n_layers = 2;
  cfg.n_heads = 2;
  cfg.vocab = 12;
  cfg.seq_len = 4;
  cfg.seed = 5;
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(g_mesh, &cfg, "*.wq=S(0);*.w1=S(0)", &m));
  dt_module_t root, blk;
  DT_ASSERT_OK(dt_llama_module(m, &root));
  DT_ASSERT_OK(dt_module_find(root, "layers.1", &blk));
  int n;
  DT_ASSERT_OK(dt_module_num_params(blk, &n));
  DT_ASSERT_EQ(n, 9);
  char nm[64];
  dt_var_t p;
  DT_ASSERT_OK(dt_module_param_at(blk, 1, nm, sizeof nm, &p));
  DT_ASSERT_TRUE(strcmp(nm, "wq") == 0, "block param 1 is %s", nm);
  dt_var_t* params;
  const char* const* names;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &params, &names, &np, NULL));
  DT_ASSERT_TRUE(strcmp(names[0], "tok_emb") == 0 && strcmp(names[11], "layers.1.wq") == 0 &&
                     strcmp(names[np - 1], "output") == 0,
                 "names %s %s %s", names[0], names[11], names[np - 1]);
  DT_ASSERT_TRUE(params[11] == p, "the block's wq is the model's");
  dt_module_t b0;
  DT_ASSERT_OK(dt_module_find(root, "layers.0", &b0));
  dt_module_t blocks[2] = {b0, blk};
  for (int i = 0; i < 2; i++) {
    DT_ASSERT_OK(dt_module_add_forward_pre_hook(blocks[i], h_fpre, NULL));
    DT_ASSERT_OK(dt_module_add_forward_post_hook(blocks[i], h_fpost, NULL));
    DT_ASSERT_OK(dt_module_add_backward_pre_hook(blocks[i], h_bpre, NULL));
    DT_ASSERT_OK(dt_module_add_backward_post_hook(blocks[i], h_bpost, NULL));
  }
  int64_t ts[2] = {2, 4};
  int64_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
  dt_placement_t rep[1] = {dt_replicate()};
  double losses[2];
  for (int round = 0; round < 2; round++) {
    dt_tensor_t tt, gt;
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, ts, rep, tok, &tt));
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, ts, rep, tgt, &gt));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    dt_var_t loss;
    g_log[0] = '\0';
    DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
    DT_ASSERT_TRUE(strcmp(g_log, "F>0 F<0 F>1 F<1") == 0, "llama forward hooks: %s", g_log);
    float lv;
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv));
    losses[round] = lv;
    g_log[0] = '\0';
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_TRUE(strcmp(g_log, "B>1 B<1 B>0 B<0") == 0, "llama backward hooks: %s", g_log);
    DT_ASSERT_OK(dt_tape_destroy(tape));
    DT_ASSERT_OK(dt_tensor_destroy(tt));
    DT_ASSERT_OK(dt_tensor_destroy(gt));
    if (round == 0) { /* swap layers.0.wq for an identical copy placed differently */
      dt_var_t wq;
      DT_ASSERT_OK(dt_module_param(root, "layers.0.wq", &wq));
      dt_placement_t r1[1] = {dt_replicate()};
      dt_tensor_t c;
      DT_ASSERT_OK(dt_tensor_redistribute(dt_var_value(wq), r1, &c));
      dt_var_t nv;
      DT_ASSERT_OK(dt_var_leaf(c, 1, &nv));
      DT_ASSERT_OK(dt_module_set_param(root, "layers.0.wq", nv));
      DT_ASSERT_OK(dt_llama_params(m, &params, &names, &np, NULL));
      DT_ASSERT_TRUE(params[2] == nv, "the parameter list follows the replacement");
    }
  }
  DT_ASSERT_TRUE(fabs(losses[0] - losses[1]) <= 1e-6 * fabs(losses[0]),
                 "same loss with the replaced parameter: %.9g vs %.9g", losses[0], losses[1]);
  DT_ASSERT_OK(dt_llama_destroy(m));
}

/* A forward that fails after its pre hooks: the post hooks still run, with no outputs, and the
 * forward's own message is what the caller reads. */
static int g_post_n = -2;
static dt_var_t* g_post_vars = (dt_var_t*)&g_post_n;
static dt_status_t failing_forward(dt_module_t m, dt_tape_t t, int n_in, const dt_var_t* in,
                                   int n_out, dt_var_t* out) {
  (void)m, (void)t, (void)n_in, (void)in, (void)n_out, (void)out;
  return dt_set_error(DT_ERR_INVALID_ARG, "failing_forward", __FILE__, __LINE__, "bad input %d", 7);
}
static dt_status_t note_post(dt_module_t m, dt_tape_t t, int n, dt_var_t* v, void* ctx) {
  (void)m, (void)t, (void)ctx;
  g_post_n = n;
  g_post_vars = v;
  return DT_SUCCESS;
}

static void test_failed_forward(void) {
  dt_module_t f;
  DT_ASSERT_OK(dt_module_create("f", failing_forward, NULL, &f));
  DT_ASSERT_OK(dt_module_add_forward_post_hook(f, note_post, NULL));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t out = (dt_var_t)&g_post_n;
  DT_ASSERT_STATUS(dt_module_forward(f, tape, 0, NULL, 1, &out), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(g_post_n == 0 && g_post_vars == NULL, "post hook saw n %d, vars %p", g_post_n,
                 (void*)g_post_vars);
  DT_ASSERT_TRUE(out == NULL, "a failed forward's output is NULL");
  DT_ASSERT_TRUE(strstr(dt_last_error(), "bad input 7") != NULL, "message: %s", dt_last_error());
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_module_destroy(f));
}

/* 20 modules of 62-character names in a chain, a parameter at each level: the deepest names
 * are longer than 1023 characters. */
static void test_deep_names(void) {
  const int64_t s[1] = {4};
  char nm[DT_MODULE_NAME_MAX];
  dt_module_t root = NULL, cur = NULL;
  for (int d = 0; d < 20; d++) {
    memset(nm, 'a' + d % 26, 62);
    nm[62] = '\0';
    dt_module_t m;
    DT_ASSERT_OK(dt_module_create(nm, NULL, NULL, &m));
    DT_ASSERT_OK(dt_module_add_param(m, "w", leaf(1, s, 1, NULL)));
    if (cur) DT_ASSERT_OK(dt_module_add_child(cur, m));
    else root = m;
    cur = m;
  }
  int n = -1;
  DT_ASSERT_STATUS(dt_module_num_params(root, &n), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "longer than 1023") != NULL, "%s", dt_last_error());
  dt_var_t* ps;
  DT_ASSERT_STATUS(dt_module_params(root, &ps, &n), DT_ERR_INVALID_ARG);
  /* a subtree whose names fit is listed as before */
  dt_module_t sub;
  DT_ASSERT_OK(dt_module_child(root, 0, &sub));
  for (int d = 0; d < 4; d++) DT_ASSERT_OK(dt_module_child(sub, 0, &sub));
  DT_ASSERT_OK(dt_module_num_params(sub, &n));
  DT_ASSERT_EQ(n, 15);
  DT_ASSERT_OK(dt_module_destroy(root));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank;
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &g_mesh));
  test_tree();
  test_shared_param_hook();
  test_deferred_reduce();
  test_drop_and_regather();
  test_trace();
  test_llama_modules();
  test_failed_forward();
  test_deep_names();
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  if (rank == 0) printf("test_hooks np=%d: ok\n", g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

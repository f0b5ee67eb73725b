/* test_ops_placement.c - the placements and communication the shape, attention and routing ops
 * choose (np 2 and 4), plus dropout's placement-independent mask, Partial rules of the scalar ops,
 * the propagation cache key and bad input. Values are checked against the same op on replicated
 * inputs (which test_ops_reference checks against PyTorch).
 *
 * Expected (n = ranks, 1-D mesh unless noted):
 *   reshape (4n, 6, 8) S(0) -> (4n*6, 8): S(0), nothing moves; (3, 4) S(0) -> (12) at n = 2:
 *     uneven shard boundaries move, so it must redistribute (and stay right); shapes of 0
 *     elements: (0, 2n) S(0) -> (2n, 0), (0), (n, 0, 5): S(0), nothing moves; (3, 0, n) S(2) ->
 *     (0, n) or (0): moves first (only a shard of the leading dims passes an empty reshape)
 *   unflatten (2, 5, 4n*2) S(2) -> (2, 5, 4n, 2): S(2) (tensor-parallel heads), nothing moves
 *   cat of S(0) inputs along dim 1: S(0), nothing moves; narrow on a sharded dim: moves
 *   sdpa with heads or batch sharded, or queries sharded (k, v replicated): nothing moves;
 *     grouped-query heads that do not split evenly over the ranks: moves
 *   rotary with the sequence sharded: nothing moves, same values as replicated
 *   topk along dim 1 of S(0): both outputs S(0), nothing moves
 *   gather on a class-sharded x: Partial(sum), nothing moves; scatter_add into row-sharded x
 *     with replicated updates: S(0), nothing moves
 *   mul_scalar(-2) on P(max) -> P(min), add_scalar on P(avg) -> P(avg): nothing moves;
 *     add_scalar on P(sum): one reducing collective (all-reduce or reduce-scatter)
 *   where(R cond, P(sum), P(sum)) -> P(sum), nothing moves
 *   clamp, expm1, floor, ceil, round, trunc and erf of P(max) / P(min), log1p of P(min): stay
 *   Partial, nothing moves; sign reduces a float P(max) (sign(NaN) = 0: a rank's NaN); log1p of
 *     P(max) (a rank's partial below -1) and sin of any Partial: reduced first
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"

static int g_n, g_rank;
static dt_mesh_t g_mesh;

static void fill(float* x, int64_t n, int seed) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(((i + 1) * (7 + 2 * seed)) % 23) * 0.125f - 1.0f;
}

static dt_tensor_t make(int nd, const int64_t* shape, const char* pl, int seed) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  float* x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  fill(x, n, seed);
  dt_placement_t p[DT_MAX_MESH_DIMS];
  int np;
  DT_ASSERT_OK(dt_placements_parse(pl, p, DT_MAX_MESH_DIMS, &np));
  dt_mesh_t m = np == 1 ? g_mesh : NULL;
  DT_ASSERT_TRUE(m != NULL, "1-D placements only");
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(m, DT_F32, nd, shape, p, x, &t));
  free(x);
  return t;
}

static dt_tensor_t make_idx(int nd, const int64_t* shape, int64_t hi, const char* pl) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  int64_t* x = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = (i * 5 + 3) % hi;
  dt_placement_t p[DT_MAX_MESH_DIMS];
  int np;
  DT_ASSERT_OK(dt_placements_parse(pl, p, DT_MAX_MESH_DIMS, &np));
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, nd, shape, p, x, &t));
  free(x);
  return t;
}

static void expect_pl(dt_tensor_t t, const char* want) {
  dt_placement_t p[DT_MAX_MESH_DIMS];
  char buf[64];
  DT_ASSERT_OK(dt_tensor_placements(t, p));
  DT_ASSERT_OK(dt_placements_format(p, 1, ",", buf, sizeof buf));
  DT_ASSERT_TRUE(strcmp(buf, want) == 0, "placements %s, expected %s", buf, want);
}

static uint64_t moves(void) {
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c));
  return c.redistributes;
}
/* Reducing collectives (all-reduce or reduce-scatter: the planner may pick either). */
static uint64_t reductions(void) {
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_get(g_mesh, &c));
  return c.calls[DT_COLL_ALL_REDUCE] + c.calls[DT_COLL_REDUCE_SCATTER];
}

/* Full contents of a float tensor. */
static float* full_of(dt_tensor_t t) {
  int nd;
  int64_t shape[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  for (int d = 0; d < nd; d++) n *= shape[d];
  float* x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  DT_ASSERT_OK(dt_tensor_gather_full(t, x, sizeof(float) * (size_t)n));
  return x;
}

static int64_t numel_of(dt_tensor_t t) {
  int nd;
  int64_t shape[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  for (int d = 0; d < nd; d++) n *= shape[d];
  return n;
}

static void expect_same(dt_tensor_t a, dt_tensor_t b, float tol) {
  int64_t n = numel_of(a);
  DT_ASSERT_EQ(n, numel_of(b));
  float *x = full_of(a), *y = full_of(b);
  for (int64_t i = 0; i < n; i++)
    DT_ASSERT_TRUE(fabsf(x[i] - y[i]) <= tol * (1.0f + fabsf(y[i])), "element %lld: %g vs %g",
                   (long long)i, x[i], y[i]);
  free(x);
  free(y);
}

/* Runs op on (sharded) inputs and on replicated copies; checks the placements, how many
 * redistributions ran (-1: at least one) and that the values agree. */
static void check(const char* op, int nin, dt_tensor_t* in, int nia, const int64_t* ia, int nfa,
                  const double* fa, const char* want_pl, int want_moves) {
  dt_tensor_t out, rep[4], ref;
  DT_ASSERT_OK(dt_counters_reset(g_mesh));
  DT_ASSERT_OK(dt_op_run(op, nin, in, nia, ia, nfa, fa, &out));
  uint64_t mv = moves();
  if (want_pl) expect_pl(out, want_pl);
  if (want_moves >= 0) DT_ASSERT_TRUE(mv == (uint64_t)want_moves, "%s: %llu redistributions, "
                                      "expected %d", op, (unsigned long long)mv, want_moves);
  else DT_ASSERT_TRUE(mv > 0, "%s: expected a redistribution", op);
  dt_placement_t r = dt_replicate();
  for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_tensor_redistribute(in[t], &r, &rep[t]));
  DT_ASSERT_OK(dt_op_run(op, nin, rep, nia, ia, nfa, fa, &ref));
  expect_same(out, ref, 1e-5f);
  for (int t = 0; t < nin; t++) dt_tensor_destroy(rep[t]);
  dt_tensor_destroy(out);
  dt_tensor_destroy(ref);
}

static void views(void) {
  int64_t s3[3] = {4 * g_n, 6, 8};
  dt_tensor_t x = make(3, s3, "S(0)", 1);
  const int64_t merge[2] = {4 * g_n * 6, 8};
  check("reshape", 1, &x, 2, merge, 0, NULL, "S(0)", 0);
  const int64_t merge_inner[2] = {4 * g_n, 48};
  check("view", 1, &x, 2, merge_inner, 0, NULL, "S(0)", 0);
  const int64_t fl[2] = {0, 1};
  check("flatten", 1, &x, 2, fl, 0, NULL, "S(0)", 0);
  const int64_t unsq[1] = {0};
  check("unsqueeze", 1, &x, 1, unsq, 0, NULL, "S(1)", 0);
  dt_tensor_destroy(x);

  int64_t h[3] = {2, 5, 4 * g_n * 2};
  dt_tensor_t y = make(3, h, "S(2)", 2);
  const int64_t unfl[3] = {2, 4 * g_n, 2};
  check("unflatten", 1, &y, 3, unfl, 0, NULL, "S(2)", 0);
  dt_tensor_destroy(y);

  if (g_n == 2) { /* 3 rows over 2 ranks: 2 + 1 rows, but 12 elements split 6 + 6 */
    int64_t u[2] = {3, 4};
    dt_tensor_t z = make(2, u, "S(0)", 3);
    const int64_t all[1] = {12};
    check("reshape", 1, &z, 1, all, 0, NULL, NULL, -1);
    dt_tensor_destroy(z);
  }
  /* 0 elements: any shape of 0 elements reshapes into any other (as in PyTorch); a shard of the
   * leading dims passes (every rank's part is empty), a shard elsewhere is moved first */
  int64_t e[2] = {0, 2 * g_n}, e3[3] = {3, 0, g_n};
  dt_tensor_t z0 = make(2, e, "S(0)", 6), z1 = make(3, e3, "S(2)", 7);
  const int64_t swap[2] = {2 * g_n, 0}, none[1] = {0}, spread[3] = {g_n, 0, 5};
  check("reshape", 1, &z0, 2, swap, 0, NULL, "S(0)", 0);
  check("view", 1, &z0, 1, none, 0, NULL, "S(0)", 0);
  check("reshape", 1, &z0, 3, spread, 0, NULL, "S(0)", 0);
  check("flatten", 1, &z0, 2, fl, 0, NULL, "S(0)", 0);
  check("flatten", 1, &z1, 2, fl, 0, NULL, NULL, -1); /* (3, 0, n) -> (0, n) */
  check("reshape", 1, &z1, 1, none, 0, NULL, NULL, -1);
  check("unsqueeze", 1, &z0, 1, unsq, 0, NULL, "S(1)", 0);
  dt_tensor_destroy(z0);
  dt_tensor_destroy(z1);
  /* cat along 1 of row-sharded inputs; narrow of a sharded dim */
  int64_t a[2] = {2 * g_n, 3}, b[2] = {2 * g_n, 5};
  dt_tensor_t c[2] = {make(2, a, "S(0)", 4), make(2, b, "S(0)", 5)};
  const int64_t one[1] = {1};
  check("cat", 2, c, 1, one, 0, NULL, "S(0)", 0);
  const int64_t nar[3] = {0, 1, 2};
  check("narrow", 1, &c[1], 3, nar, 0, NULL, NULL, -1); /* dim 0 whole first (S(1) or R) */
  const int64_t nar1[3] = {1, 1, 3};
  check("narrow", 1, &c[1], 3, nar1, 0, NULL, "S(0)", 0);
  /* split / chunks */
  dt_tensor_t parts[8];
  int np;
  DT_ASSERT_OK(dt_split(c[1], 2, 1, parts, 8, &np));
  DT_ASSERT_EQ(np, 3);
  float* whole = full_of(c[1]);
  for (int k = 0; k < np; k++) {
    expect_pl(parts[k], "S(0)");
    float* pk = full_of(parts[k]);
    int64_t w = k < 2 ? 2 : 1;
    for (int64_t i = 0; i < 2 * g_n; i++)
      for (int64_t j = 0; j < w; j++)
        DT_ASSERT_TRUE(pk[i * w + j] == whole[i * 5 + 2 * k + j], "split piece %d", k);
    free(pk);
    dt_tensor_destroy(parts[k]);
  }
  DT_ASSERT_OK(dt_chunks(c[1], 2, 1, parts, 8, &np));
  DT_ASSERT_EQ(np, 2); /* torch.chunk(5, 2): 3 + 2 */
  DT_ASSERT_EQ(numel_of(parts[0]), 2 * g_n * 3);
  DT_ASSERT_EQ(numel_of(parts[1]), 2 * g_n * 2);
  for (int k = 0; k < np; k++) dt_tensor_destroy(parts[k]);
  DT_ASSERT_STATUS(dt_split(c[1], 1, 1, parts, 4, &np), DT_ERR_INVALID_ARG); /* 5 > cap 4 */
  DT_ASSERT_EQ(np, 0);
  free(whole);
  dt_tensor_destroy(c[0]);
  dt_tensor_destroy(c[1]);
}

static void attention(void) {
  int64_t qs[4] = {2, 2 * g_n, 6, 4};
  const int64_t causal[1] = {1};
  for (int d = 0; d < 2; d++) {
    const char* pl = d == 0 ? "S(0)" : "S(1)";
    int64_t s[4] = {d == 0 ? 2 * g_n : 2, d == 0 ? 2 : 2 * g_n, 6, 4};
    dt_tensor_t in[3] = {make(4, s, pl, 1), make(4, s, pl, 2), make(4, s, pl, 3)};
    check("sdpa", 3, in, 1, causal, 0, NULL, pl, 0);
    for (int t = 0; t < 3; t++) dt_tensor_destroy(in[t]);
  }
  /* queries sharded along the sequence, keys and values whole: global positions for the mask */
  int64_t s6[4] = {2, 2, 3 * g_n, 4};
  dt_tensor_t q[3] = {make(4, s6, "S(2)", 1), make(4, s6, "R", 2), make(4, s6, "R", 3)};
  check("sdpa", 3, q, 1, causal, 0, NULL, "S(2)", 0);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(q[t]);
  /* grouped-query: n query heads, 1 kv head: heads cannot split alike, so something moves */
  int64_t hq[4] = {1, g_n, 4, 4}, hk[4] = {1, 1, 4, 4};
  dt_tensor_t g[3] = {make(4, hq, "S(1)", 1), make(4, hk, "R", 2), make(4, hk, "R", 3)};
  check("sdpa", 3, g, 1, causal, 0, NULL, NULL, -1);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(g[t]);
  /* GQA that does split evenly: 2n query heads over n kv heads */
  int64_t eq[4] = {1, 2 * g_n, 4, 4}, ek[4] = {1, g_n, 4, 4};
  dt_tensor_t e[3] = {make(4, eq, "S(1)", 1), make(4, ek, "S(1)", 2), make(4, ek, "S(1)", 3)};
  check("sdpa", 3, e, 1, causal, 0, NULL, "S(1)", 0);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(e[t]);
  (void)qs;
  /* layout (B, S, H, D): heads on dim 2, queries on dim 1 */
  const int64_t bshd[2] = {1, 1};
  int64_t hs[4] = {2, 6, 2 * g_n, 4}, qs6[4] = {2, 3 * g_n, 2, 4};
  dt_tensor_t lh[3] = {make(4, hs, "S(2)", 1), make(4, hs, "S(2)", 2), make(4, hs, "S(2)", 3)};
  check("sdpa", 3, lh, 2, bshd, 0, NULL, "S(2)", 0);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(lh[t]);
  dt_tensor_t lq[3] = {make(4, qs6, "S(1)", 1), make(4, qs6, "R", 2), make(4, qs6, "R", 3)};
  check("sdpa", 3, lq, 2, bshd, 0, NULL, "S(1)", 0);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(lq[t]);
  /* rotary with the sequence sharded */
  int64_t rs[4] = {2, 3 * g_n + 1, 2, 6};
  dt_tensor_t x = make(4, rs, "S(1)", 4);
  const int64_t sd[1] = {1};
  const double th[1] = {10000.0};
  check("rotary", 1, &x, 1, sd, 1, th, "S(1)", 0);
  dt_tensor_destroy(x);
}

static void routing(void) {
  int64_t s[2] = {2 * g_n + 1, 7};
  dt_tensor_t x = make(2, s, "S(0)", 1);
  const int64_t ka[2] = {3, 1};
  dt_tensor_t o[2];
  DT_ASSERT_OK(dt_counters_reset(g_mesh));
  DT_ASSERT_OK(dt_op_run_multi("topk", 1, &x, 2, ka, 0, NULL, 2, o));
  DT_ASSERT_EQ(moves(), 0);
  expect_pl(o[0], "S(0)");
  expect_pl(o[1], "S(0)");
  float* xv = full_of(x);
  float* vv = full_of(o[0]);
  int64_t iv[64];
  DT_ASSERT_OK(dt_tensor_gather_full(o[1], iv, sizeof iv));
  for (int64_t i = 0; i < s[0]; i++)
    for (int j = 0; j < 3; j++) {
      DT_ASSERT_TRUE(vv[i * 3 + j] == xv[i * 7 + iv[i * 3 + j]], "topk value/index");
      if (j) DT_ASSERT_TRUE(vv[i * 3 + j] <= vv[i * 3 + j - 1], "topk sorted");
    }
  free(xv);
  free(vv);
  dt_tensor_destroy(o[0]);
  dt_tensor_destroy(o[1]);
  DT_ASSERT_STATUS(dt_op_run("topk", 1, &x, 2, ka, 0, NULL, &o[0]), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "2 outputs") != NULL, "%s", dt_last_error());
  dt_tensor_destroy(x);

  /* gather on a class-sharded x: masked local gather */
  int64_t gs[2] = {5, 4 * g_n}, is[2] = {5, 3};
  dt_tensor_t g[2] = {make(2, gs, "S(1)", 2), make_idx(2, is, 4 * g_n, "R")};
  const int64_t d1[1] = {1};
  check("gather", 2, g, 1, d1, 0, NULL, "P(sum)", 0);
  dt_tensor_destroy(g[0]);
  dt_tensor_destroy(g[1]);
  /* scatter_add into row-sharded x (MoE combine) */
  int64_t xs[2] = {3 * g_n, 4}, us[2] = {7, 4};
  dt_tensor_t sc[3] = {make(2, xs, "S(0)", 3), make_idx(2, us, 3 * g_n, "R"), make(2, us, "R", 4)};
  const int64_t d0[1] = {0};
  check("scatter_add", 3, sc, 1, d0, 0, NULL, "S(0)", 0);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(sc[t]);
}

static void partial_rules(void) {
  int64_t s[2] = {3, 5};
  dt_tensor_t x = make(2, s, "R", 1);
  const double neg[1] = {-2.0}, c[1] = {1.5}, c2[1] = {2.5};
  dt_placement_t pmax = dt_partial(DT_REDUCE_MAX), pavg = dt_partial(DT_REDUCE_AVG),
                 psum = dt_partial(DT_REDUCE_SUM);
  dt_tensor_t a, b, p;
  DT_ASSERT_OK(dt_tensor_redistribute(x, &pmax, &a));
  check("mul_scalar", 1, &a, 0, NULL, 1, neg, "P(min)", 0);
  DT_ASSERT_OK(dt_tensor_redistribute(x, &pavg, &b));
  check("add_scalar", 1, &b, 0, NULL, 1, c, "P(avg)", 0);
  DT_ASSERT_OK(dt_tensor_redistribute(x, &psum, &p));
  DT_ASSERT_OK(dt_counters_reset(g_mesh));
  dt_tensor_t r1, r2;
  DT_ASSERT_OK(dt_op_run("add_scalar", 1, &p, 0, NULL, 1, c, &r1));
  DT_ASSERT_EQ(reductions(), 1);
  /* the cache key holds the scalar: same shapes and placements, another value, another result */
  DT_ASSERT_OK(dt_op_run("add_scalar", 1, &p, 0, NULL, 1, c2, &r2));
  float *v1 = full_of(r1), *v2 = full_of(r2), *xv = full_of(x);
  for (int i = 0; i < 15; i++) {
    DT_ASSERT_TRUE(fabsf(v1[i] - (xv[i] + 1.5f)) < 1e-6f, "add_scalar 1.5");
    DT_ASSERT_TRUE(fabsf(v2[i] - (xv[i] + 2.5f)) < 1e-6f, "add_scalar 2.5");
  }
  free(v1);
  free(v2);
  free(xv);
  dt_tensor_destroy(r1);
  dt_tensor_destroy(r2);
  /* where(R cond, P, P) stays Partial */
  int64_t cs[2] = {3, 5};
  dt_tensor_t w[3] = {make_idx(2, cs, 2, "R"), p, NULL}, x2 = make(2, s, "R", 2);
  DT_ASSERT_OK(dt_tensor_redistribute(x2, &psum, &w[2]));
  dt_tensor_destroy(x2);
  check("where", 3, w, 0, NULL, 0, NULL, "P(sum)", 0);
  dt_tensor_destroy(w[0]);
  dt_tensor_destroy(w[2]);
  /* clamp (monotone) of a real P(max) / P(min) (amax / amin over the sharded dim: each rank's
   * partial differs) stays Partial with no move, values those of the reduced tensor */
  int64_t s8[2] = {4 * g_n, 5};
  dt_tensor_t xs = make(2, s8, "S(0)", 5);
  const int64_t red0[2] = {0, 0};
  const double bounds[2] = {-0.5, 0.25};
  const char* red_ops[2] = {"amax", "amin"};
  const char* red_pl[2] = {"P(max)", "P(min)"};
  for (int k = 0; k < 2; k++) {
    dt_tensor_t m;
    DT_ASSERT_OK(dt_op_run(red_ops[k], 1, &xs, 2, red0, 0, NULL, &m));
    expect_pl(m, red_pl[k]);
    check("clamp", 1, &m, 0, NULL, 2, bounds, red_pl[k], 0);
    /* logsumexp is not monotone-passing: lse(max_r a_r) != max_r lse(a_r); reduced first */
    check("logsumexp", 1, &m, 2, red0, 0, NULL, "R", -1);
    dt_tensor_destroy(m);
  }
  /* expm1 (non-decreasing) keeps a real P(max) and P(min), log1p only P(min), with no move and
   * the values of the reduced tensor (x + 0.5 in [-0.5, 2.25]: no log1p of -1 or below); sin
   * reduces first */
  const double half[1] = {0.5};
  dt_tensor_t xh;
  DT_ASSERT_OK(dt_op_run("add_scalar", 1, &xs, 0, NULL, 1, half, &xh));
  for (int k = 0; k < 2; k++) {
    dt_tensor_t m;
    DT_ASSERT_OK(dt_op_run(red_ops[k], 1, &xh, 2, red0, 0, NULL, &m));
    check("expm1", 1, &m, 0, NULL, 0, NULL, red_pl[k], 0);
    if (k == 1) check("log1p", 1, &m, 0, NULL, 0, NULL, "P(min)", 0);
    else check("log1p", 1, &m, 0, NULL, 0, NULL, NULL, -1);
    check("sin", 1, &m, 0, NULL, 0, NULL, NULL, -1);
    /* floor, ceil, round (also to 1 decimal and to tens), trunc and erf (non-decreasing) keep it
     * too; sign reduces first (sign(NaN) = 0, below) */
    const char* mono[5] = {"floor", "ceil", "round", "trunc", "erf"};
    for (int j = 0; j < 5; j++) check(mono[j], 1, &m, 0, NULL, 0, NULL, red_pl[k], 0);
    const int64_t dec[2] = {1, -1};
    for (int j = 0; j < 2; j++) check("round", 1, &m, 1, &dec[j], 0, NULL, red_pl[k], 0);
    check("sign", 1, &m, 0, NULL, 0, NULL, NULL, -1);
    dt_tensor_destroy(m);
  }
  dt_tensor_destroy(xh);
  /* log1p of a P(max) whose rank-0 partial is below -1 (NaN there) while the maximum is not:
   * reduced first, the values finite (passing it through would give max(NaN, ...) = NaN) */
  int64_t s2[2] = {2 * g_n, 3};
  float* lv = malloc(sizeof(float) * (size_t)(6 * g_n));
  for (int i = 0; i < 6 * g_n; i++)
    lv[i] = i < 6 ? -3.0f + 0.25f * (float)i : 0.125f * (float)(i % 5);
  dt_placement_t s0 = dt_shard(0);
  dt_tensor_t xl, ml;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s2, &s0, lv, &xl));
  free(lv);
  DT_ASSERT_OK(dt_op_run("amax", 1, &xl, 2, red0, 0, NULL, &ml));
  expect_pl(ml, "P(max)");
  check("log1p", 1, &ml, 0, NULL, 0, NULL, NULL, -1);
  dt_tensor_destroy(ml);
  dt_tensor_destroy(xl);
  /* sign of a P(max) whose rank-0 partial is NaN where the other ranks' are positive: reduced
   * first, sign(NaN) = 0 (passing it through would give max(0, 1) = 1) */
  float* nv = malloc(sizeof(float) * (size_t)(6 * g_n));
  for (int i = 0; i < 6 * g_n; i++) nv[i] = i == 0 ? NAN : 0.125f + 0.25f * (float)(i % 5);
  dt_tensor_t xn, mn;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s2, &s0, nv, &xn));
  free(nv);
  DT_ASSERT_OK(dt_op_run("amax", 1, &xn, 2, red0, 0, NULL, &mn));
  expect_pl(mn, "P(max)");
  check("sign", 1, &mn, 0, NULL, 0, NULL, NULL, -1);
  dt_tensor_t sg, sr;
  dt_placement_t rr = dt_replicate();
  DT_ASSERT_OK(dt_op_run("sign", 1, &mn, 0, NULL, 0, NULL, &sg));
  DT_ASSERT_OK(dt_tensor_redistribute(sg, &rr, &sr));
  float* sv = full_of(sr);
  DT_ASSERT_TRUE(sv[0] == 0.0f && sv[1] == 1.0f, "sign of a P(max) with a NaN: %g %g, expected 0 1",
                 sv[0], sv[1]);
  free(sv);
  dt_tensor_destroy(sr);
  dt_tensor_destroy(sg);
  dt_tensor_destroy(mn);
  dt_tensor_destroy(xn);
  dt_tensor_destroy(xs);
  dt_tensor_destroy(a);
  dt_tensor_destroy(b);
  dt_tensor_destroy(p);
  dt_tensor_destroy(x);
}

static void dropout(void) {
  int64_t s[2] = {4 * g_n + 3, 33};
  const char* pls[3] = {"R", "S(0)", "S(1)"};
  float* ref = NULL;
  int64_t n = s[0] * s[1];
  for (int k = 0; k < 3; k++) {
    dt_tensor_t x = make(2, s, pls[k], 1), y;
    DT_ASSERT_OK(dt_dropout(x, 0.25, 77, &y));
    expect_pl(y, pls[k]);
    float* v = full_of(y);
    if (ref == NULL) {
      ref = v;
      float* xv = full_of(x);
      int64_t kept = 0;
      for (int64_t i = 0; i < n; i++) {
        if (v[i] != 0.0f) {
          kept++;
          DT_ASSERT_TRUE(fabsf(v[i] - xv[i] / 0.75f) < 1e-6f, "kept values scale by 1/(1-p)");
        }
      }
      double frac = (double)kept / (double)n; /* xv has no zeros */
      DT_ASSERT_TRUE(fabs(frac - 0.75) < 0.06, "kept fraction %g", frac);
      free(xv);
    } else {
      DT_ASSERT_TRUE(memcmp(v, ref, sizeof(float) * (size_t)n) == 0,
                     "dropout mask depends on placements (%s)", pls[k]);
      free(v);
    }
    dt_tensor_t z;
    DT_ASSERT_OK(dt_dropout(x, 0.25, 78, &z)); /* another seed, another mask */
    float* w = full_of(z);
    DT_ASSERT_TRUE(memcmp(w, ref, sizeof(float) * (size_t)n) != 0, "seed ignored");
    free(w);
    dt_tensor_destroy(z);
    DT_ASSERT_OK(dt_dropout(x, 0.0, 78, &z)); /* p = 0: identity */
    expect_same(z, x, 0.0f);
    dt_tensor_destroy(z);
    dt_tensor_destroy(x);
    dt_tensor_destroy(y);
  }
  free(ref);
}

static void bad_input(void) {
  int64_t s[2] = {4, 6};
  dt_tensor_t x = make(2, s, "S(0)", 1), y;
  const int64_t bad[2] = {5, 5};
  DT_ASSERT_STATUS(dt_op_run("reshape", 1, &x, 2, bad, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(y == NULL && strstr(dt_last_error(), "reshape") != NULL, "%s", dt_last_error());
  const int64_t two_infer[2] = {-1, -1};
  DT_ASSERT_STATUS(dt_op_run("view", 1, &x, 2, two_infer, 0, NULL, &y), DT_ERR_INVALID_ARG);
  int64_t s0[2] = {0, 6}; /* 0 elements: a -1 beside a 0 size could be anything */
  dt_tensor_t e = make(2, s0, "S(0)", 1);
  const int64_t any[2] = {-1, 0}, three[1] = {3};
  DT_ASSERT_STATUS(dt_op_run("reshape", 1, &e, 2, any, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(y == NULL && strstr(dt_last_error(), "any value") != NULL, "%s", dt_last_error());
  DT_ASSERT_STATUS(dt_op_run("reshape", 1, &e, 1, three, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_op_run("reshape", 1, &x, 2, any, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "any value") == NULL, "%s", dt_last_error());
  dt_tensor_destroy(e);
  int64_t s2[2] = {4, 3};
  dt_tensor_t i = make_idx(2, s2, 3, "R");
  dt_tensor_t c[2] = {x, i};
  const int64_t one[1] = {1};
  /* cat promotes its inputs' dtypes as torch.cat (f32 with i64: f32); sizes must still agree */
  DT_ASSERT_OK(dt_op_run("cat", 2, c, 1, one, 0, NULL, &y));
  dt_dtype_t ydt;
  DT_ASSERT_OK(dt_tensor_dtype(y, &ydt));
  DT_ASSERT_TRUE(ydt == DT_F32, "cat(f32, i64) gives %s, torch.cat f32", dt_dtype_name(ydt));
  dt_tensor_destroy(y);
  const int64_t zero[1] = {0};
  DT_ASSERT_STATUS(dt_op_run("cat", 2, c, 1, zero, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(y == NULL && strstr(dt_last_error(), "cat") != NULL, "%s", dt_last_error());
  int64_t q[4] = {1, 3, 4, 4}, k[4] = {1, 2, 4, 4};
  dt_tensor_t a[3] = {make(4, q, "R", 1), make(4, k, "R", 2), make(4, k, "R", 3)};
  DT_ASSERT_STATUS(dt_op_run("sdpa", 3, a, 0, NULL, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "multiple") != NULL, "%s", dt_last_error());
  DT_ASSERT_STATUS(dt_op_run("frobnicate", 1, &x, 0, NULL, 0, NULL, &y), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "unknown op 'frobnicate'") != NULL, "%s",
                 dt_last_error());
  const int64_t nar[3] = {1, 4, 3};
  DT_ASSERT_STATUS(dt_op_run("narrow", 1, &x, 3, nar, 0, NULL, &y), DT_ERR_INVALID_ARG);
  const double p[1] = {1.5};
  const int64_t seed[1] = {1};
  DT_ASSERT_STATUS(dt_op_run("dropout", 1, &x, 1, seed, 1, p, &y), DT_ERR_INVALID_ARG);
  int64_t big[2] = {4, 6};
  dt_tensor_t gi = make_idx(2, big, 100, "R"), gx[2] = {x, gi};
  DT_ASSERT_STATUS(dt_op_run("gather", 2, gx, 1, one, 0, NULL, &y), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "out of range") != NULL, "%s", dt_last_error());
  /* the library is still usable */
  const int64_t ok[1] = {24};
  DT_ASSERT_OK(dt_op_run("reshape", 1, &x, 1, ok, 0, NULL, &y));
  dt_tensor_destroy(y);
  for (int t = 0; t < 3; t++) dt_tensor_destroy(a[t]);
  dt_tensor_destroy(gi);
  dt_tensor_destroy(i);
  dt_tensor_destroy(x);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_n));
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, NULL, NULL, &g_mesh));
  views();
  attention();
  routing();
  partial_rules();
  dropout();
  bad_input();
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  if (g_rank == 0) printf("test_ops_placement: passed on %d ranks\n", g_n);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* test_strategy.c - strategy expansion and selection on abstract meshes (no MPI). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtensor/dtensor.h"

static dt_mesh_t mesh_of(int ndim, int a, int b) {
  int s[2] = {a, b};
  dt_mesh_t m;
  assert_int_equal(dt_mesh_create_abstract(ndim, s, NULL, &m), DT_SUCCESS);
  return m;
}

static dt_op_call_t call2(const char* op, int nd0, const int64_t* s0, int nd1, const int64_t* s1) {
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.n_inputs = s1 ? 2 : 1;
  c.in[0].dtype = DT_F32;
  c.in[0].ndim = nd0;
  memcpy(c.in[0].shape, s0, sizeof(int64_t) * (size_t)nd0);
  if (s1) {
    c.in[1].dtype = DT_F32;
    c.in[1].ndim = nd1;
    memcpy(c.in[1].shape, s1, sizeof(int64_t) * (size_t)nd1);
  }
  return c;
}

static void set_pl(dt_placement_t pl[][DT_MAX_MESH_DIMS], int t, const char* text) {
  int n;
  assert_int_equal(dt_placements_parse(text, pl[t], DT_MAX_MESH_DIMS, &n), DT_SUCCESS);
}

static void expect_out(const dt_op_choice_t* c, int m, const char* text) {
  char buf[64];
  assert_int_equal(dt_placements_format(c->out[0], m, ",", buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, text);
}

/* The selected choice is the minimum over every listed candidate. */
static void check_is_min(dt_mesh_t mesh, const dt_op_call_t* call,
                         const dt_placement_t in[][DT_MAX_MESH_DIMS], const dt_op_choice_t* sel) {
  static dt_op_choice_t all[4096];
  int n;
  assert_int_equal(dt_op_candidates(mesh, call, in, all, 4096, &n), DT_SUCCESS);
  assert_true(n > 0 && n <= 4096);
  assert_int_equal(n, sel->n_candidates);
  double best = INFINITY;
  for (int i = 0; i < n; i++) best = fmin(best, all[i].cost_us);
  assert_true(fabs(sel->cost_us - best) <= 1e-9 * (1 + best));
}

static void test_mm_1d(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 4, 0);
  int64_t a[2] = {12, 8}, b[2] = {8, 4};
  dt_op_call_t c = call2("mm", 2, a, 2, b);
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  /* mm(S(1), S(0)) -> Partial(sum) with no communication */
  set_pl(in, 0, "S1");
  set_pl(in, 1, "S0");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 0);
  assert_true(ch.cost_us == 0.0);
  assert_int_equal(ch.out_meta[0].ndim, 2);
  assert_int_equal(ch.out_meta[0].shape[0], 12);
  assert_int_equal(ch.out_meta[0].shape[1], 4);
  /* S(0) x R -> S(0);  R x S(1) -> S(1);  P x R -> P (linear in one operand) */
  set_pl(in, 0, "S0");
  set_pl(in, 1, "R");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "S(0)");
  assert_int_equal(ch.steps, 0);
  set_pl(in, 0, "R");
  set_pl(in, 1, "S(-1)");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "S(1)");
  set_pl(in, 0, "P");
  set_pl(in, 1, "R");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 0);
  /* P x P: no rule keeps both Partial; one all-reduce makes one operand R */
  set_pl(in, 1, "P");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 1);
  check_is_min(m, &c, in, &ch);
  dt_mesh_destroy(m);
}

static void test_mm_2d_and_sweep(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  int64_t a[2] = {64, 32}, b[2] = {32, 16};
  dt_op_call_t c = call2("mm", 2, a, 2, b);
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  set_pl(in, 0, "S0,R");
  set_pl(in, 1, "R,S1");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(0),S(1)");
  assert_int_equal(ch.steps, 0);
  /* sweep every input placement pair from {R, S0, S1, P} per mesh dim */
  const char* opts[4] = {"R", "S0", "S1", "P"};
  for (int x = 0; x < 16; x++)
    for (int y = 0; y < 16; y++) {
      char s0[16], s1[16];
      snprintf(s0, sizeof s0, "%s,%s", opts[x % 4], opts[x / 4]);
      snprintf(s1, sizeof s1, "%s,%s", opts[y % 4], opts[y / 4]);
      set_pl(in, 0, s0);
      set_pl(in, 1, s1);
      assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
      check_is_min(m, &c, in, &ch);
      /* the required inputs really produce the chosen output under the mm rules: a zero-cost
       * choice means the inputs already had the required placements */
      if (ch.steps == 0)
        for (int t = 0; t < 2; t++)
          for (int i = 0; i < 2; i++) assert_true(dt_placement_equal(ch.in[t][i], in[t][i]));
    }
  dt_mesh_destroy(m);
}

static void test_pointwise_partial(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 4, 0);
  int64_t s[2] = {16, 8};
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  /* P + P -> P with no communication */
  dt_op_call_t add = call2("add", 2, s, 2, s);
  set_pl(in, 0, "P");
  set_pl(in, 1, "P");
  assert_int_equal(dt_op_select(m, &add, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 0);
  /* P + R -> P: the R operand is partitioned locally (one local step, no collective) */
  set_pl(in, 1, "R");
  assert_int_equal(dt_op_select(m, &add, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 1);
  assert_true(dt_placement_equal(ch.in[1][0], dt_partial(DT_REDUCE_SUM)));
  /* P * P -> one all-reduce (Partial stays on one operand only) */
  dt_op_call_t mul = call2("mul", 2, s, 2, s);
  set_pl(in, 1, "P");
  assert_int_equal(dt_op_select(m, &mul, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 1);
  dt_plan_t plan;
  int ar = 0;
  int64_t sh[2] = {16, 8};
  for (int t = 0; t < 2; t++) {
    assert_int_equal(dt_plan_create(m, DT_F32, 2, sh, in[t], ch.in[t], &plan), DT_SUCCESS);
    int k;
    dt_plan_count(plan, DT_COLL_ALL_REDUCE, &k);
    ar += k;
    dt_plan_destroy(plan);
  }
  assert_int_equal(ar, 1);
  /* P(max) * R cannot stay Partial: reduced first */
  set_pl(in, 0, "P(max)");
  set_pl(in, 1, "R");
  assert_int_equal(dt_op_select(m, &mul, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  /* maximum keeps P(max) */
  dt_op_call_t mx = call2("maximum", 2, s, 2, s);
  set_pl(in, 1, "P(max)");
  assert_int_equal(dt_op_select(m, &mx, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(max)");
  assert_int_equal(ch.steps, 0);
  /* relu of a Partial must reduce first (never a silently wrong number) */
  dt_op_call_t relu = call2("relu", 2, s, 0, NULL);
  set_pl(in, 0, "P");
  assert_int_equal(dt_op_select(m, &relu, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  assert_true(ch.steps >= 1);
  /* neg is linear: P stays */
  dt_op_call_t neg = call2("neg", 2, s, 0, NULL);
  assert_int_equal(dt_op_select(m, &neg, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 0);
  /* clamp is monotone: P(max) and P(min) stay, P(sum) and P(avg) are reduced first; abs and the
   * comparisons reduce every Partial */
  dt_op_call_t clamp = call2("clamp", 2, s, 0, NULL);
  clamp.n_fargs = 2;
  clamp.fargs[0] = -0.5;
  clamp.fargs[1] = 0.5;
  const char* keep[] = {"P(max)", "P(min)"};
  for (int k = 0; k < 2; k++) {
    set_pl(in, 0, keep[k]);
    assert_int_equal(dt_op_select(m, &clamp, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, keep[k]);
    assert_int_equal(ch.steps, 0);
  }
  const char* reduce[] = {"P(sum)", "P(avg)"};
  for (int k = 0; k < 2; k++) {
    set_pl(in, 0, reduce[k]);
    assert_int_equal(dt_op_select(m, &clamp, in, &ch), DT_SUCCESS);
    assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
    assert_true(ch.steps >= 1);
  }
  dt_op_call_t ab = call2("abs", 2, s, 0, NULL), lt = call2("lt", 2, s, 2, s);
  set_pl(in, 0, "P(max)");
  set_pl(in, 1, "P(max)");
  assert_int_equal(dt_op_select(m, &ab, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  assert_int_equal(dt_op_select(m, &lt, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  /* expm1 (non-decreasing, a number for every number) keeps P(max) and P(min); log1p keeps only
   * P(min) (NaN below -1: a rank's max may be below -1 where the true max is not); sin, cos and
   * reciprocal (not monotone) reduce every Partial, as P(sum) and P(avg) for all five. An integer
   * input computes in f32 (PyTorch's int -> float): the output meta is f32. */
  const char* all_p[] = {"P(sum)", "P(avg)", "P(max)", "P(min)"};
  const char* unary[] = {"expm1", "log1p", "sin", "cos", "reciprocal"};
  for (int u = 0; u < 5; u++) {
    dt_op_call_t f = call2(unary[u], 2, s, 0, NULL);
    for (int k = 0; k < 4; k++) {
      const int keeps = (u == 0 && k >= 2) || (u == 1 && k == 3);
      set_pl(in, 0, all_p[k]);
      assert_int_equal(dt_op_select(m, &f, in, &ch), DT_SUCCESS);
      if (keeps) {
        expect_out(&ch, 1, all_p[k]);
        assert_int_equal(ch.steps, 0);
      } else {
        assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
        assert_true(ch.steps >= 1);
      }
    }
    set_pl(in, 0, "S(0)");
    f.in[0].dtype = DT_I64;
    assert_int_equal(dt_op_select(m, &f, in, &ch), DT_SUCCESS);
    assert_int_equal(ch.out_meta[0].dtype, DT_F32);
    expect_out(&ch, 1, "S(0)");
  }
  /* floor, ceil, round (decimals 0 and 2), trunc and erf (non-decreasing, NaN to NaN) keep
   * P(max) and P(min) with no step and reduce P(sum) / P(avg); sign keeps them only for integers
   * (sign(NaN) = 0: a float P(max) is reduced first). Integers keep their dtype (erf: f32); an
   * integer P(avg) is reduced (it would truncate); round's decimals of an integer are refused. */
  const char* mono[] = {"floor", "ceil", "round", "trunc", "erf", "sign", "round"};
  for (int u = 0; u < 7; u++) {
    const dt_dtype_t dts[3] = {DT_F32, DT_I32, DT_I64};
    for (int t = 0; t < 3; t++) {
      dt_op_call_t f = call2(mono[u], 2, s, 0, NULL);
      if (u == 6) { /* round(x, decimals=2): floats only */
        if (t > 0) continue;
        f.n_iargs = 1;
        f.iargs[0] = 2;
      }
      f.in[0].dtype = dts[t];
      for (int k = 0; k < 4; k++) {
        const int keeps = k >= 2 && (u != 5 || t > 0);
        set_pl(in, 0, all_p[k]);
        assert_int_equal(dt_op_select(m, &f, in, &ch), DT_SUCCESS);
        assert_int_equal(ch.out_meta[0].dtype, u == 4 ? DT_F32 : dts[t]);
        if (keeps) {
          expect_out(&ch, 1, all_p[k]);
          assert_int_equal(ch.steps, 0);
        } else {
          assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
          assert_true(ch.steps >= 1);
        }
      }
      set_pl(in, 0, "S(1)");
      assert_int_equal(dt_op_select(m, &f, in, &ch), DT_SUCCESS);
      expect_out(&ch, 1, "S(1)");
      assert_int_equal(ch.steps, 0);
    }
  }
  dt_op_call_t rd = call2("round", 2, s, 0, NULL);
  rd.n_iargs = 1;
  rd.iargs[0] = -1;
  const dt_dtype_t refused[3] = {DT_I32, DT_I64, DT_F16};
  for (int t = 0; t < 3; t++) {
    rd.in[0].dtype = refused[t];
    assert_int_equal(dt_op_select(m, &rd, in, &ch), DT_ERR_UNSUPPORTED);
  }
  rd.iargs[0] = 0; /* decimals 0: integers kept, f16 computed in f32 */
  for (int t = 0; t < 3; t++) {
    rd.in[0].dtype = refused[t];
    assert_int_equal(dt_op_select(m, &rd, in, &ch), DT_SUCCESS);
    assert_int_equal(ch.out_meta[0].dtype, refused[t]);
  }
  /* add keeps P(avg) + P(avg) in f32, not in i32 (integer averages truncate: avg(a) + avg(b)
   * is not avg(a + b)); P(sum) stays in both */
  dt_op_call_t iadd = call2("add", 2, s, 2, s);
  set_pl(in, 0, "P(avg)");
  set_pl(in, 1, "P(avg)");
  assert_int_equal(dt_op_select(m, &iadd, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(avg)");
  iadd.in[0].dtype = iadd.in[1].dtype = DT_I32;
  assert_int_equal(dt_op_select(m, &iadd, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  set_pl(in, 0, "P(sum)");
  set_pl(in, 1, "P(sum)");
  assert_int_equal(dt_op_select(m, &iadd, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  /* masked_fill reduces a P(avg) (k copies of the value would be summed before the division:
   * inf in f16 / f32 at large values, a wrap in integers) and keeps P(max) */
  dt_op_call_t mf = call2("masked_fill", 2, s, 2, s);
  mf.n_fargs = 1;
  mf.fargs[0] = 3.0;
  set_pl(in, 0, "P(avg)");
  set_pl(in, 1, "R");
  assert_int_equal(dt_op_select(m, &mf, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  mf.in[0].dtype = DT_I32;
  assert_int_equal(dt_op_select(m, &mf, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  set_pl(in, 0, "P(max)");
  assert_int_equal(dt_op_select(m, &mf, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(max)");
  set_pl(in, 1, "P(max)");
  /* clamp needs a bound: none (both NaN or absent) is refused, naming the fix */
  clamp.fargs[0] = clamp.fargs[1] = NAN;
  assert_int_equal(dt_op_select(m, &clamp, in, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "give min or max"));
  clamp.n_fargs = 0;
  assert_int_equal(dt_op_select(m, &clamp, in, &ch), DT_ERR_INVALID_ARG);
  dt_mesh_destroy(m);
}

static void test_reductions(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 4, 0);
  int64_t s[2] = {13, 6};
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  const char* ops[4] = {"sum", "mean", "amax", "amin"};
  const char* want[4] = {"P(sum)", "P(sum)", "P(max)", "P(min)"};
  for (int k = 0; k < 4; k++) {
    dt_op_call_t c = call2(ops[k], 2, s, 0, NULL);
    c.n_iargs = 2;
    c.iargs[0] = 0; /* keepdim */
    c.iargs[1] = 0; /* reduce dim 0 */
    set_pl(in, 0, "S0"); /* reducing the sharded dim: Partial, no communication */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, want[k]);
    assert_int_equal(ch.steps, 0);
    assert_int_equal(ch.out_meta[0].ndim, 1);
    assert_int_equal(ch.out_meta[0].shape[0], 6);
    set_pl(in, 0, "S1"); /* the other dim stays sharded, renumbered */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "S(0)");
    c.iargs[0] = 1; /* keepdim keeps the numbering */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "S(1)");
    assert_int_equal(ch.out_meta[0].shape[0], 1);
    c.iargs[1] = 2; /* bad dim */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
  }
  /* sum of a Partial(sum) stays Partial; amax of a Partial(sum) must reduce first */
  dt_op_call_t c = call2("sum", 2, s, 0, NULL);
  c.n_iargs = 1;
  set_pl(in, 0, "P");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  assert_int_equal(ch.steps, 0);
  c.op = "amax";
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_true(ch.steps >= 1);
  dt_mesh_destroy(m);
}

/* argmax / argmin / logsumexp / var / std / prod: a sharded reduced dim is gathered (Replicate
 * asked of the input, the output replicated), a sharded kept dim passes (renumbered), every
 * Partial is reduced first (prod too: no Partial(prod) exists, and products are not monotone
 * for P(max) / P(min)); argmax gives i64, at most one dim (prod too), none: a 0-d index into the
 * flattened tensor; var / std refuse integers and a non-finite correction; prod of i32 is i64. */
static void test_arg_reductions(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 4, 0);
  int64_t s[2] = {13, 6};
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  char buf[64];
  const char* ops[6] = {"argmax", "argmin", "logsumexp", "var", "std", "prod"};
  for (int k = 0; k < 6; k++) {
    dt_op_call_t c = call2(ops[k], 2, s, 0, NULL);
    if (k == 3 || k == 4) { /* var / std with correction 0 (fargs[0]) */
      c.n_fargs = 1;
      c.fargs[0] = 0.0;
    }
    c.n_iargs = 2;
    c.iargs[0] = 0;
    c.iargs[1] = -2; /* dim 0 */
    set_pl(in, 0, "S0"); /* redistributed: to R, or to S(1) (an all-to-all, output S(0)) */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    assert_false(ch.in[0][0].kind == DT_SHARD && ch.in[0][0].dim == 0);
    assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
    assert_true(ch.steps >= 1);
    static dt_op_choice_t all[64];
    int na, saw_r = 0;
    assert_int_equal(dt_op_candidates(m, &c, in, all, 64, &na), DT_SUCCESS);
    for (int i = 0; i < na; i++) { /* no candidate keeps the reduced dim sharded */
      assert_false(all[i].in[0][0].kind == DT_SHARD && all[i].in[0][0].dim == 0);
      assert_int_not_equal(all[i].in[0][0].kind, DT_PARTIAL);
      saw_r |= all[i].in[0][0].kind == DT_REPLICATE && all[i].out[0][0].kind == DT_REPLICATE;
    }
    assert_true(saw_r);
    assert_int_equal(ch.out_meta[0].dtype, k < 2 ? DT_I64 : DT_F32);
    assert_int_equal(ch.out_meta[0].ndim, 1);
    assert_int_equal(ch.out_meta[0].shape[0], 6);
    set_pl(in, 0, "S1"); /* the kept dim stays sharded, renumbered; keepdim keeps the number */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "S(0)");
    assert_int_equal(ch.steps, 0);
    c.iargs[0] = 1;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "S(1)");
    assert_int_equal(ch.out_meta[0].ndim, 2);
    assert_int_equal(ch.out_meta[0].shape[0], 1);
    const char* partials[4] = {"P(sum)", "P(avg)", "P(max)", "P(min)"};
    for (int p = 0; p < 4; p++) {
      set_pl(in, 0, partials[p]);
      assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
      assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
      assert_int_not_equal(ch.in[0][0].kind, DT_PARTIAL);
      assert_true(ch.steps >= 1);
    }
    c.n_iargs = 1; /* no dim: every dim, so the whole tensor is gathered */
    c.iargs[0] = 0;
    set_pl(in, 0, "S1");
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "R");
    assert_int_equal(ch.in[0][0].kind, DT_REPLICATE);
    assert_int_equal(ch.out_meta[0].ndim, 0);
    c.n_iargs = 3; /* two dims: logsumexp, var and std take them, argmax / argmin / prod refuse */
    c.iargs[1] = 0;
    c.iargs[2] = 1;
    const int one_dim = k < 2 || k == 5;
    assert_int_equal(dt_op_select(m, &c, in, &ch), one_dim ? DT_ERR_INVALID_ARG : DT_SUCCESS);
    if (one_dim) assert_non_null(strstr(dt_last_error(), "at most one dim"));
    else expect_out(&ch, 1, "R");
  }
  /* on a 2-D mesh: S(0) on the kept dim passes, S(1) on the reduced dim is gathered */
  dt_mesh_t m2 = mesh_of(2, 2, 2);
  dt_placement_t in2[1][DT_MAX_MESH_DIMS];
  dt_op_call_t c = call2("argmax", 2, s, 0, NULL);
  c.n_iargs = 2;
  c.iargs[1] = 1;
  set_pl(in2, 0, "S0,S1");
  assert_int_equal(dt_op_select(m2, &c, in2, &ch), DT_SUCCESS);
  assert_int_equal(dt_placements_format(ch.in[0], 2, ",", buf, sizeof buf), DT_SUCCESS);
  assert_true(strcmp(buf, "S(0),R") == 0 || strcmp(buf, "S(0),S(0)") == 0); /* dim 1 gathered */
  assert_true(ch.steps >= 1);
  /* bf16 logsumexp keeps bf16; an integer one computes in f32 (torch.logsumexp promotes) */
  c = call2("logsumexp", 2, s, 0, NULL);
  c.n_iargs = 2;
  c.iargs[1] = 1;
  c.in[0].dtype = DT_BF16;
  set_pl(in, 0, "R");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].dtype, DT_BF16);
  c.in[0].dtype = DT_I32;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].dtype, DT_F32);
  /* var / std keep a float dtype, refuse integers in PyTorch's words and a non-finite
   * correction; an empty reduction is allowed (NaN, as PyTorch) */
  for (int k = 0; k < 2; k++) {
    c = call2(k ? "std" : "var", 2, s, 0, NULL);
    c.n_iargs = 2;
    c.iargs[1] = 1;
    c.in[0].dtype = DT_BF16;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    assert_int_equal(ch.out_meta[0].dtype, DT_BF16);
    c.in[0].dtype = DT_I64;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "std and var only support floating point"));
    c.in[0].dtype = DT_F32;
    c.n_fargs = 1;
    c.fargs[0] = NAN;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "correction"));
    c.fargs[0] = 7.0; /* N = 6 <= correction: allowed (inf, as PyTorch) */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    int64_t e0[2] = {0, 6};
    c = call2(k ? "std" : "var", 2, e0, 0, NULL);
    c.n_iargs = 2;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  }
  /* prod: i32 and i64 give i64, bf16 stays bf16; an empty reduced dim is allowed (1) */
  c = call2("prod", 2, s, 0, NULL);
  c.n_iargs = 2;
  c.iargs[1] = 1;
  c.in[0].dtype = DT_I32;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].dtype, DT_I64);
  c.in[0].dtype = DT_BF16;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].dtype, DT_BF16);
  {
    int64_t e1[2] = {0, 6};
    c = call2("prod", 2, e1, 0, NULL);
    c.n_iargs = 2;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    c.n_iargs = 1;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  }
  /* argmax of an empty reduced dim is refused (PyTorch raises); of an empty kept dim it is empty */
  int64_t e[2] = {0, 6};
  c = call2("argmax", 2, e, 0, NULL);
  c.n_iargs = 2;
  c.iargs[1] = 0;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "size 0"));
  c.iargs[1] = 1;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  c.n_iargs = 1;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
  dt_mesh_destroy(m2);
  dt_mesh_destroy(m);
}

static void test_views_softmax(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  int64_t s3[3] = {4, 6, 8};
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  dt_op_call_t c = call2("transpose", 3, s3, 0, NULL);
  c.n_iargs = 2;
  c.iargs[0] = 0;
  c.iargs[1] = -1;
  set_pl(in, 0, "S0,P(max)"); /* a shard follows its dim, a Partial of any op passes */
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(2),P(max)");
  assert_int_equal(ch.steps, 0);
  assert_int_equal(ch.out_meta[0].shape[0], 8);
  assert_int_equal(ch.out_meta[0].shape[2], 4);
  dt_op_call_t p = call2("permute", 3, s3, 0, NULL);
  p.n_iargs = 3;
  p.iargs[0] = 2, p.iargs[1] = 0, p.iargs[2] = 1;
  set_pl(in, 0, "S1,S2");
  assert_int_equal(dt_op_select(m, &p, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(2),S(0)");
  p.iargs[2] = 0; /* not a permutation */
  assert_int_equal(dt_op_select(m, &p, in, &ch), DT_ERR_INVALID_ARG);
  dt_op_call_t sm = call2("softmax", 3, s3, 0, NULL);
  sm.n_iargs = 1;
  sm.iargs[0] = -1;
  set_pl(in, 0, "S0,S1"); /* other dims stay sharded */
  assert_int_equal(dt_op_select(m, &sm, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(0),S(1)");
  assert_int_equal(ch.steps, 0);
  set_pl(in, 0, "S2,R"); /* the softmax dim must be made whole */
  assert_int_equal(dt_op_select(m, &sm, in, &ch), DT_SUCCESS);
  assert_true(ch.steps >= 1);
  assert_false(ch.in[0][0].kind == DT_SHARD && ch.in[0][0].dim == 2);
  set_pl(in, 0, "P,R"); /* non-linear: a Partial is reduced first */
  assert_int_equal(dt_op_select(m, &sm, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  dt_mesh_destroy(m);
}

static void test_broadcast(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 2, 0);
  int64_t a[2] = {6, 8}, b[1] = {8}, bad[1] = {7};
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  dt_op_call_t c = call2("add", 2, a, 1, b);
  set_pl(in, 0, "S0");
  set_pl(in, 1, "R");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "S(0)");
  assert_true(dt_placement_equal(ch.in[1][0], dt_replicate())); /* broadcast operand stays R */
  assert_int_equal(ch.steps, 0);
  assert_int_equal(ch.out_meta[0].shape[0], 6);
  assert_int_equal(ch.out_meta[0].shape[1], 8);
  dt_op_call_t c2 = call2("add", 2, a, 1, bad);
  assert_int_equal(dt_op_select(m, &c2, in, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "broadcast"));
  dt_mesh_destroy(m);
}

static dt_status_t rowsum_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                dt_op_rule_t* rules, int cap, int* n) {
  if (call->in[0].ndim != 2 || cap < 3) return DT_ERR_INVALID_ARG;
  *n_out = 1;
  out_meta->dtype = call->in[0].dtype;
  out_meta->ndim = 1;
  out_meta->shape[0] = call->in[0].shape[0];
  memset(rules, 0, sizeof(dt_op_rule_t) * 3);
  rules[1].out[0] = dt_shard(0);
  rules[1].in[0] = dt_shard(0);
  rules[2].out[0] = dt_partial(DT_REDUCE_SUM);
  rules[2].in[0] = dt_shard(1);
  *n = 3;
  return DT_SUCCESS;
}

static void test_registry(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  int64_t a[2] = {12, 8}, b[2] = {7, 4};
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  set_pl(in, 0, "R,R");
  set_pl(in, 1, "R,R");
  dt_op_call_t c = call2("frobnicate", 2, a, 2, b);
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_UNSUPPORTED);
  assert_non_null(strstr(dt_last_error(), "unknown op 'frobnicate'"));
  dt_op_call_t mm = call2("mm", 2, a, 2, b); /* 8 != 7 */
  assert_int_equal(dt_op_select(m, &mm, in, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "shape mismatch"));
  dt_op_call_t arity = call2("mm", 2, a, 0, NULL);
  assert_int_equal(dt_op_select(m, &arity, in, &ch), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_op_register("", 1, rowsum_rules, NULL), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_op_register("rowsum", -1, rowsum_rules, NULL), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_op_register("rowsum", DT_OP_MAX_INPUTS + 1, rowsum_rules, NULL),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_op_register("rowsum", 1, NULL, NULL), DT_ERR_INVALID_ARG);
  int found = 1;
  assert_int_equal(dt_op_lookup("rowsum", &found), DT_SUCCESS);
  assert_int_equal(found, 0);
  assert_int_equal(dt_op_register("rowsum", 1, rowsum_rules, NULL), DT_SUCCESS);
  assert_int_equal(dt_op_lookup("rowsum", &found), DT_SUCCESS);
  assert_int_equal(found, 1);
  dt_op_call_t rs = call2("rowsum", 2, a, 0, NULL);
  set_pl(in, 0, "S1,S0");
  assert_int_equal(dt_op_select(m, &rs, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "P(sum),S(0)");
  assert_int_equal(ch.steps, 0);
  dt_mesh_destroy(m);
}

/* An op whose rules depend on its non-tensor arguments: iargs[0] is the dim it keeps sharded,
 * fargs[0] < 0 forbids Partial. The propagation cache must tell calls apart by those values. */
static dt_status_t argdep_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                dt_op_rule_t* rules, int cap, int* n) {
  if (call->n_iargs != 1 || call->n_fargs != 1 || cap < 3) return DT_ERR_INVALID_ARG;
  *n_out = 1;
  *out_meta = call->in[0];
  memset(rules, 0, sizeof(dt_op_rule_t) * 3);
  int d = (int)call->iargs[0];
  rules[1].out[0] = dt_shard(d);
  rules[1].in[0] = dt_shard(d);
  *n = 2;
  if (call->fargs[0] >= 0) {
    rules[2].out[0] = dt_partial(DT_REDUCE_SUM);
    rules[2].in[0] = dt_partial(DT_REDUCE_SUM);
    *n = 3;
  }
  return DT_SUCCESS;
}

static void test_cache_key(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 4, 0);
  assert_int_equal(dt_op_register("argdep", 1, argdep_rules, NULL), DT_SUCCESS);
  int64_t s[2] = {16, 16};
  dt_op_call_t c = call2("argdep", 2, s, 0, NULL);
  c.n_iargs = 1;
  c.n_fargs = 1;
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  set_pl(in, 0, "S1");
  for (int rep = 0; rep < 2; rep++) { /* second pass is served by the cache */
    c.iargs[0] = 1;
    c.fargs[0] = 2.0;
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "S(1)");
    assert_int_equal(ch.steps, 0);
    c.iargs[0] = 0; /* a different dim: S(1) must move to S(0) */
    assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
    expect_out(&ch, 1, "S(0)");
    assert_int_equal(ch.steps, 1);
  }
  set_pl(in, 0, "P");
  c.iargs[0] = 0;
  c.fargs[0] = 2.0;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)"); /* Partial allowed */
  c.fargs[0] = -2.0;            /* a different scalar: Partial must be reduced */
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  c.fargs[0] = 2.0;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 1, "P(sum)");
  /* a different input shape or dtype is a different key too */
  set_pl(in, 0, "S0");
  c.iargs[0] = 1;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].shape[0], 16);
  c.in[0].shape[0] = 20;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].shape[0], 20);
  /* the same call on another mesh of the same shape is keyed apart (mesh identity) */
  dt_mesh_t m2 = mesh_of(1, 2, 0);
  assert_int_equal(dt_op_select(m2, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.n_candidates > 0, 1);
  dt_mesh_destroy(m2);
  dt_mesh_destroy(m);
}

/* Shapes of 0 elements reshape into one another (PyTorch allows any reshape between equal
 * numel, 0 included): a shard on the leading dims and every Partial pass with nothing moved; a
 * -1 beside a 0 size cannot be inferred, and 0 elements never fit a shape of more. */
static void test_views_zero_size(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  dt_op_call_t c = call2("reshape", 2, (const int64_t[]){0, 4}, 0, NULL);
  c.n_iargs = 2;
  c.iargs[0] = 4, c.iargs[1] = 0;
  set_pl(in, 0, "S0,P(sum)");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(0),P(sum)");
  assert_int_equal(ch.steps, 0);
  assert_int_equal(ch.out_meta[0].ndim, 2);
  assert_int_equal(ch.out_meta[0].shape[0], 4);
  assert_int_equal(ch.out_meta[0].shape[1], 0);
  c.n_iargs = 1; /* (0, 4) -> (0) */
  c.iargs[0] = 0;
  set_pl(in, 0, "R,R");
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "R,R");
  assert_int_equal(ch.steps, 0);
  assert_int_equal(ch.out_meta[0].ndim, 1);
  assert_int_equal(ch.out_meta[0].shape[0], 0);
  c.n_iargs = 3; /* (0, 4) -> (2, -1, 3): 0 elements, the -1 is 0 */
  c.iargs[0] = 2, c.iargs[1] = -1, c.iargs[2] = 3;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].shape[1], 0);
  c.iargs[0] = 0; /* (0, -1, 3): any size fits */
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "any value"));
  c.n_iargs = 1; /* (0, 4) -> (3) */
  c.iargs[0] = 3;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_ERR_INVALID_ARG);
  dt_op_call_t f = call2("flatten", 3, (const int64_t[]){2, 0, 3}, 0, NULL);
  set_pl(in, 0, "S0,R");
  assert_int_equal(dt_op_select(m, &f, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(0),R");
  assert_int_equal(ch.out_meta[0].ndim, 1);
  assert_int_equal(ch.out_meta[0].shape[0], 0);
  /* (2, 0, 8) -> (2, 0, 4, 2): the walk pairs the dims, so a shard of the last group passes as
   * it does for a tensor with elements (no one-group fallback, no movement) */
  dt_op_call_t r4 = call2("reshape", 3, (const int64_t[]){2, 0, 8}, 0, NULL);
  r4.n_iargs = 4;
  r4.iargs[0] = 2, r4.iargs[1] = 0, r4.iargs[2] = 4, r4.iargs[3] = 2;
  set_pl(in, 0, "S2,R");
  assert_int_equal(dt_op_select(m, &r4, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "S(2),R");
  assert_int_equal(ch.steps, 0);
  dt_mesh_destroy(m);
}

/* errno semantics: a selection that succeeds leaves the last error alone, even when it probed and
 * dropped candidates on the way (an uneven reshape's sharded candidates fail its per-mesh check). */
static void test_last_error_kept(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(1, 2, 0);
  dt_op_choice_t ch;
  dt_op_call_t bad = call2("no_such_op", 1, (const int64_t[]){4}, 0, NULL);
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  set_pl(in, 0, "S0");
  assert_int_equal(dt_op_select(m, &bad, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_ERR_UNSUPPORTED);
  char before[1024];
  snprintf(before, sizeof before, "%s", dt_last_error());
  assert_non_null(strstr(before, "no_such_op"));
  dt_op_call_t rs = call2("reshape", 2, (const int64_t[]){7, 6}, 0, NULL);
  rs.n_iargs = 1;
  rs.iargs[0] = 42;
  assert_int_equal(dt_op_select(m, &rs, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_SUCCESS);
  assert_string_equal(dt_last_error(), before);
  dt_mesh_destroy(m);
}

/* dt_op_select and dt_op_candidates take the call's shapes from the caller, not from tensors:
 * sizes a tensor could not have (more than 2^48 elements, a product past 64 bits) are refused
 * before the rule generators multiply them (reshape's counted the elements in a signed product
 * that overflowed: UBSan) and every op's shape check stays within range. */
static void test_shapes_out_of_range(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 3);
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  set_pl(in, 0, "R,R");
  set_pl(in, 1, "R,R");
  dt_op_choice_t ch, all[4];
  int n = -1;
  const int64_t huge[3][2] = {{INT64_MAX - 1, 4}, {(int64_t)1 << 32, (int64_t)1 << 32},
                              {((int64_t)1 << 48) + 1, 1}};
  for (int k = 0; k < 3; k++) {
    dt_op_call_t rs = call2("reshape", 2, huge[k], 0, NULL);
    rs.n_iargs = 1;
    rs.iargs[0] = -1;
    assert_int_equal(dt_op_select(m, &rs, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                     DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "2^48"));
    assert_int_equal(dt_op_candidates(m, &rs, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, all,
                                      4, &n), DT_ERR_INVALID_ARG);
    assert_int_equal(n, 0);
    dt_op_call_t mm = call2("mm", 2, (const int64_t[]){4, 4}, 2, huge[k]);
    assert_int_equal(dt_op_select(m, &mm, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                     DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "input 1"));
  }
  /* a dim of 0 makes the others free, up to the same bound on their product */
  dt_op_call_t ok = call2("reshape", 3, (const int64_t[]){0, (int64_t)1 << 24, (int64_t)1 << 24},
                          0, NULL);
  ok.n_iargs = 1;
  ok.iargs[0] = 0;
  assert_int_equal(dt_op_select(m, &ok, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_SUCCESS);
  dt_mesh_destroy(m);
}

/* A host op's rule generator may return anything: what it returns is checked before use (a rule
 * count past `cap` was read past the rules array, a placement of no kind past the planner's
 * tables: ASan), and a bad answer is DT_ERR_INVALID_ARG naming the op, for dt_op_select and for
 * dt_op_run on meta tensors alike. */
static int g_bad_mode;
static dt_status_t bad_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                             dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  out_meta[0] = call->in[0];
  memset(rules, 0, sizeof(dt_op_rule_t) * 2);
  rules[1].out[0] = dt_shard(0);
  rules[1].in[0] = dt_shard(0);
  *n = 2;
  if (g_bad_mode == 1) *n = cap + 1;
  if (g_bad_mode == 2) rules[1].in[0].kind = DT_PLACEMENT_KIND_COUNT;
  if (g_bad_mode == 3) rules[1].out[0] = dt_partial((dt_reduce_op_t)DT_REDUCE_COUNT);
  if (g_bad_mode == 4) out_meta[0].ndim = DT_MAX_DIMS + 1;
  if (g_bad_mode == 5) out_meta[0].shape[0] = -1;
  if (g_bad_mode == 6) *n = 0;
  return DT_SUCCESS;
}

static dt_status_t noop_kernel(const dt_op_call_t* call, const dt_local_tensor_t* in,
                               dt_local_tensor_t* out) {
  (void)call;
  (void)in;
  (void)out;
  return DT_SUCCESS;
}

static void test_host_rules_checked(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 3);
  assert_int_equal(dt_op_register("bad_rules", 1, bad_rules, noop_kernel), DT_SUCCESS);
  dt_placement_t in[1][DT_MAX_MESH_DIMS];
  set_pl(in, 0, "S0,R");
  dt_op_choice_t ch;
  for (int mode = 0; mode <= 6; mode++) {
    g_bad_mode = mode;
    const int64_t shape[2] = {6, 10 + mode}; /* a new call each time: no cached selection */
    dt_op_call_t c = call2("bad_rules", 2, shape, 0, NULL);
    dt_status_t st = dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch);
    if (mode == 0) {
      assert_int_equal(st, DT_SUCCESS);
      continue;
    }
    assert_int_equal(st, DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "bad_rules: its rule generator returned"));
    dt_tensor_t x, o = NULL;
    const int64_t shape2[2] = {6, 20 + mode};
    assert_int_equal(dt_tensor_meta(m, DT_F32, 2, shape2, in[0], &x), DT_SUCCESS);
    assert_int_equal(dt_op_run("bad_rules", 1, &x, 0, NULL, 0, NULL, &o), DT_ERR_INVALID_ARG);
    assert_null(o);
    assert_int_equal(dt_tensor_destroy(x), DT_SUCCESS);
  }
  dt_mesh_destroy(m);
}

/* A max or min Partial never mixes with another kind of Partial in one placement list (the
 * reductions do not commute: the value would depend on their order; PyTorch refuses such lists
 * too): no box, no plan target, no op candidate; sum with avg may mix. */
static void test_mixed_partials(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  const int64_t s2[2] = {6, 4};
  const int ms[2] = {2, 2}, co[2] = {1, 0};
  int64_t off[2], len[2];
  dt_placement_t pl[2];
  int n;
  const char* bad[4] = {"P(max),P(sum)", "P(sum),P(min)", "P(avg),P(max)", "P(min),P(max)"};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(dt_placements_parse(bad[k], pl, 2, &n), DT_SUCCESS);
    assert_int_equal(dt_placements_box(2, s2, 2, ms, pl, co, off, len), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "mix Partial"));
    dt_placement_t rr[2] = {dt_replicate(), dt_replicate()};
    dt_plan_t plan;
    assert_int_equal(dt_plan_create(m, DT_F32, 2, s2, rr, pl, &plan), DT_ERR_INVALID_ARG);
    assert_int_equal(dt_plan_create(m, DT_F32, 2, s2, pl, rr, &plan), DT_ERR_INVALID_ARG);
  }
  const char* good[3] = {"P(sum),P(avg)", "P(max),P(max)", "P(min),S(0)"};
  for (int k = 0; k < 3; k++) {
    assert_int_equal(dt_placements_parse(good[k], pl, 2, &n), DT_SUCCESS);
    assert_int_equal(dt_placements_box(2, s2, 2, ms, pl, co, off, len), DT_SUCCESS);
  }
  /* gather on a class-sharded x is P(sum) there; P(max) elsewhere must not pass beside it */
  const int64_t xs[2] = {6, 8}, is[2] = {6, 3};
  dt_op_call_t c = call2("gather", 2, xs, 2, is);
  c.in[1].dtype = DT_I64;
  c.n_iargs = 1;
  c.iargs[0] = 1;
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  set_pl(in, 0, "P(max),S(1)");
  set_pl(in, 1, "R,R");
  dt_op_choice_t ch;
  assert_int_equal(dt_op_select(m, &c, in, &ch), DT_SUCCESS);
  static dt_op_choice_t all[4096];
  assert_int_equal(dt_op_candidates(m, &c, in, all, 4096, &n), DT_SUCCESS);
  for (int i = 0; i <= n && i < 4096; i++) {
    const dt_op_choice_t* x = i < n ? &all[i] : &ch;
    for (int t = 0; t < 3; t++) {
      const dt_placement_t* p = t == 2 ? x->out[0] : x->in[t];
      int kinds = 0;
      for (int d = 0; d < 2; d++)
        if (p[d].kind == DT_PARTIAL) kinds |= 1 << p[d].op;
      assert_true(kinds == 0 || kinds == 3 || (kinds & (kinds - 1)) == 0);
    }
  }
  assert_int_equal(dt_mesh_destroy(m), DT_SUCCESS);
}

/* expand: a shard passes a dim that keeps its size (no move), a shard of a size-1 dim that grows
 * is gathered first, a Partial passes only an expand that grows nothing; the output shape follows PyTorch (-1 keeps a size,
 * new dims lead), and bad sizes are refused naming the dim. */
static void test_expand(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  int64_t s[3] = {8, 1, 6};
  dt_op_call_t ex = call2("expand", 3, s, 0, NULL);
  const int64_t sizes[4] = {4, -1, 5, -1};
  ex.n_iargs = 4;
  memcpy(ex.iargs, sizes, sizeof sizes);
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  set_pl(in, 0, "S(0),S(2)");
  assert_int_equal(dt_op_select(m, &ex, in, &ch), DT_SUCCESS);
  assert_int_equal(ch.out_meta[0].ndim, 4);
  const int64_t want[4] = {4, 8, 5, 6};
  for (int d = 0; d < 4; d++) assert_int_equal(ch.out_meta[0].shape[d], want[d]);
  expect_out(&ch, 2, "S(1),S(3)");
  assert_int_equal(ch.steps, 0);
  check_is_min(m, &ex, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch);
  /* the growing size-1 dim cannot stay sharded; a Partial is reduced before an expand that grows
   * (the next op would reduce k times the bytes) */
  set_pl(in, 0, "S(1),P(max)");
  assert_int_equal(dt_op_select(m, &ex, in, &ch), DT_SUCCESS);
  assert_true(dt_placement_equal(ch.in[0][0], dt_replicate()));
  assert_int_not_equal(ch.in[0][1].kind, DT_PARTIAL); /* R, or a reduce-scatter to a kept dim */
  assert_int_not_equal(ch.out[0][1].kind, DT_PARTIAL);
  assert_true(dt_placement_equal(ch.out[0][0], dt_replicate()));
  /* ... and passes one that grows nothing (a new dim of size 1, sizes kept) */
  const int64_t same[4] = {1, -1, 1, -1};
  memcpy(ex.iargs, same, sizeof same);
  const char* parts[] = {"P(sum),P(avg)", "P(min),S(0)"};
  const char* outs[] = {"P(sum),P(avg)", "P(min),S(1)"};
  for (int k = 0; k < 2; k++) {
    set_pl(in, 0, parts[k]);
    assert_int_equal(dt_op_select(m, &ex, in, &ch), DT_SUCCESS);
    expect_out(&ch, 2, outs[k]);
    assert_int_equal(ch.steps, 0);
  }
  /* ... and one whose output is empty (nothing to reduce) */
  const int64_t empty[4] = {4, -1, 0, -1};
  memcpy(ex.iargs, empty, sizeof empty);
  set_pl(in, 0, "P(sum),R");
  assert_int_equal(dt_op_select(m, &ex, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "P(sum),R");
  assert_int_equal(ch.steps, 0);
  /* pow refuses integers (its float exponent cannot tell PyTorch's i64 from f32 result) */
  dt_op_call_t pw = call2("pow", 3, s, 0, NULL);
  pw.in[0].dtype = DT_I64;
  pw.n_fargs = 1;
  pw.fargs[0] = 2.0;
  assert_int_equal(dt_op_select(m, &pw, in, &ch), DT_ERR_UNSUPPORTED);
  assert_non_null(strstr(dt_last_error(), "cast x to a float dtype"));
  /* refusals: a non-singleton dim changed, -1 in a new dim, fewer sizes than dims, a negative
   * size; the message names the dim */
  set_pl(in, 0, "R,R");
  const int64_t bad[4][4] = {{4, 7, 5, 6}, {-1, 8, 5, 6}, {8, 1, 6, 0}, {4, 8, -2, 6}};
  const int nbad[4] = {4, 4, 2, 4};
  const char* say[4] = {"must match the tensor's size 8", "a new leading dim",
                        "give at least one size per dim", "invalid size -2 in dim 2"};
  for (int k = 0; k < 4; k++) {
    ex.n_iargs = nbad[k];
    memcpy(ex.iargs, bad[k], sizeof bad[k]);
    assert_int_equal(dt_op_select(m, &ex, in, &ch), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), say[k]));
  }
  dt_mesh_destroy(m);
}

/* tril / triu keep every shard (the kernels read the shards' offsets) and every Partial with no
 * move; cumsum gathers its scanned dim, keeps the others sharded, passes P(sum) / P(avg) of floats
 * and P(sum) of i64, and reduces an i32 P(sum) (its pieces wrap at 32 bits) and P(max) first; stack
 * keeps shards (renumbered past the new dim) and Partials; index_select's masked lookup. */
static void test_tril_cumsum_stack_index(void** state) {
  (void)state;
  dt_mesh_t m = mesh_of(2, 2, 2);
  int64_t s[3] = {4, 8, 6};
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  dt_op_choice_t ch;
  const char* keep[] = {"S(1),S(2)", "S(2),P(max)", "P(sum),S(0)", "P(min),P(min)", "P(sum),P(avg)"};
  for (int op = 0; op < 2; op++) {
    dt_op_call_t tr = call2(op ? "triu" : "tril", 3, s, 0, NULL);
    tr.n_iargs = 1;
    tr.iargs[0] = -2;
    for (int k = 0; k < 5; k++) {
      set_pl(in, 0, keep[k]);
      assert_int_equal(dt_op_select(m, &tr, in, &ch), DT_SUCCESS);
      expect_out(&ch, 2, keep[k]);
      assert_int_equal(ch.steps, 0);
    }
    tr.in[0].ndim = 1; /* a vector is refused, as PyTorch */
    set_pl(in, 0, "R,R");
    assert_int_equal(dt_op_select(m, &tr, in, &ch), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "at least 2"));
  }
  dt_op_call_t cs = call2("cumsum", 3, s, 0, NULL);
  cs.n_iargs = 1;
  cs.iargs[0] = 1;
  set_pl(in, 0, "S(1),S(2)"); /* the scanned dim is gathered, the other shard stays */
  assert_int_equal(dt_op_select(m, &cs, in, &ch), DT_SUCCESS);
  assert_true(dt_placement_equal(ch.in[0][0], dt_replicate()) ||
              dt_placement_equal(ch.in[0][0], dt_shard(0)) ||
              dt_placement_equal(ch.in[0][0], dt_shard(2)));
  assert_true(dt_placement_equal(ch.in[0][1], dt_shard(2)));
  const char* pass[] = {"P(sum),S(0)", "P(avg),S(2)"};
  for (int k = 0; k < 2; k++) {
    set_pl(in, 0, pass[k]);
    assert_int_equal(dt_op_select(m, &cs, in, &ch), DT_SUCCESS);
    expect_out(&ch, 2, pass[k]);
    assert_int_equal(ch.steps, 0);
  }
  set_pl(in, 0, "P(max),S(0)");
  assert_int_equal(dt_op_select(m, &cs, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  cs.in[0].dtype = DT_I64; /* i64: P(sum) passes, the output is i64 */
  set_pl(in, 0, "P(sum),S(0)");
  assert_int_equal(dt_op_select(m, &cs, in, &ch), DT_SUCCESS);
  expect_out(&ch, 2, "P(sum),S(0)");
  assert_int_equal(ch.out_meta[0].dtype, DT_I64);
  cs.in[0].dtype = DT_I32; /* i32: the Partial is reduced first, the output is i64 */
  assert_int_equal(dt_op_select(m, &cs, in, &ch), DT_SUCCESS);
  assert_int_not_equal(ch.out[0][0].kind, DT_PARTIAL);
  assert_int_equal(ch.out_meta[0].dtype, DT_I64);
  cs.iargs[0] = 3; /* a dim out of range */
  assert_int_equal(dt_op_select(m, &cs, in, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "valid: -3 to 2"));
  /* stack along a new dim 1: input dim 0 stays dim 0, dims 1 and 2 become 2 and 3; shards and
   * Partials pass with no move; mixed dtypes are promoted (f32 with i64: f32) */
  dt_op_call_t st = call2("stack", 3, s, 3, s);
  st.n_iargs = 1;
  st.iargs[0] = 1;
  st.in[1].dtype = DT_I64;
  dt_placement_t in2[2][DT_MAX_MESH_DIMS];
  const char* sin_[] = {"S(0),S(1)", "S(2),P(sum)"};
  const char* sout[] = {"S(0),S(2)", "S(3),P(sum)"};
  for (int k = 0; k < 2; k++) {
    set_pl(in2, 0, sin_[k]);
    set_pl(in2, 1, sin_[k]);
    assert_int_equal(dt_op_select(m, &st, in2, &ch), DT_SUCCESS);
    expect_out(&ch, 2, sout[k]);
    assert_int_equal(ch.out_meta[0].ndim, 4);
    assert_int_equal(ch.out_meta[0].shape[1], 2);
    assert_int_equal(ch.out_meta[0].dtype, DT_F32);
  }
  st.iargs[0] = -5; /* valid: -4 to 3 */
  assert_int_equal(dt_op_select(m, &st, in2, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "valid: -4 to 3"));
  /* index_select along dim 1: x sharded there gives a masked lookup, P(sum), with no move; a
   * sharded index gives the output's shard of dim 1; x's other shards and Partials pass */
  int64_t six[1] = {5};
  dt_op_call_t is = call2("index_select", 3, s, 1, six);
  is.in[1].dtype = DT_I64;
  is.n_iargs = 1;
  is.iargs[0] = 1;
  const char* xin[] = {"S(1),S(0)", "R,S(2)", "P(max),R"};
  const char* iin[] = {"R,R", "S(0),R", "R,R"};
  const char* iout[] = {"P(sum),S(0)", "S(1),S(2)", "P(max),R"};
  for (int k = 0; k < 3; k++) {
    set_pl(in2, 0, xin[k]);
    set_pl(in2, 1, iin[k]);
    assert_int_equal(dt_op_select(m, &is, in2, &ch), DT_SUCCESS);
    expect_out(&ch, 2, iout[k]);
    assert_int_equal(ch.steps, 0);
    assert_int_equal(ch.out_meta[0].shape[1], 5);
  }
  is.in[1].ndim = 2; /* the index must be a vector */
  assert_int_equal(dt_op_select(m, &is, in2, &ch), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "vector"));
  dt_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mm_1d),        cmocka_unit_test(test_mm_2d_and_sweep),
      cmocka_unit_test(test_pointwise_partial), cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_reductions), cmocka_unit_test(test_arg_reductions),
      cmocka_unit_test(test_views_softmax),
      cmocka_unit_test(test_registry),     cmocka_unit_test(test_cache_key),
      cmocka_unit_test(test_last_error_kept),
      cmocka_unit_test(test_views_zero_size),
      cmocka_unit_test(test_shapes_out_of_range),
      cmocka_unit_test(test_host_rules_checked),
      cmocka_unit_test(test_mixed_partials),
      cmocka_unit_test(test_expand), cmocka_unit_test(test_tril_cumsum_stack_index),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_placement.c - pure placement layer: the torch.chunk rule, placement and placement-list
 * parsing/formatting, normalization, dtypes, status codes, version. No MPI, no dt_init.
 *
 * Expected values come from the documented semantics (placement.h, status.h), never from the
 * library's own helpers: the chunk rule is recomputed here with a different formulation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtensor/dtensor.h"

/* ---------------------------------------------------------------------------------------------
 * helpers */

/* Independent torch.chunk: c = ceil(N/n) written as a loop-free integer expression that cannot
 * overflow; part r holds [c*r, min(N, c*(r+1))) clipped to be non-negative. Returns the length;
 * *start is c*r (unclipped). */
static int64_t ref_chunk_len(int64_t n, int parts, int r, int64_t* start) {
  int64_t c = n / parts + (n % parts ? 1 : 0);
  int64_t s = c * (int64_t)r; /* c*(parts-1) < n + parts - c <= n for the sizes used here */
  *start = s;
  if (s >= n) return 0;
  int64_t room = n - s;
  return c < room ? c : room;
}

/* Asserts that a failed call left a non-empty message that mentions `needle` (if given). */
static void expect_msg(const char* needle) {
  const char* e = dt_last_error();
  assert_non_null(e);
  assert_true(strlen(e) > 0);
  if (needle != NULL && strstr(e, needle) == NULL) {
    print_error("last error '%s' does not mention '%s'\n", e, needle);
    fail();
  }
}

static void fill_garbage(dt_placement_t* p) { memset(p, 0x5a, sizeof *p); }

static int placement_is_zero(const dt_placement_t* p) {
  return p->kind == 0 && p->dim == 0 && p->op == 0;
}

/* ---------------------------------------------------------------------------------------------
 * chunk rule */

static void test_chunk_exhaustive(void** state) {
  (void)state;
  for (int64_t n = 0; n <= 40; n++) {
    for (int parts = 1; parts <= 9; parts++) {
      int64_t expect_next = 0, total = 0;
      int64_t c = (n + parts - 1) / parts; /* ceil, small sizes: no overflow */
      for (int r = 0; r < parts; r++) {
        int64_t off = -77, len = -77, rstart;
        assert_int_equal(dt_chunk(n, parts, r, &off, &len), DT_SUCCESS);
        /* the documented formula: len = max(0, min(N, c(r+1)) - c*r) */
        int64_t hi = c * (r + 1) < n ? c * (r + 1) : n;
        int64_t doc_len = hi - c * r > 0 ? hi - c * r : 0;
        assert_int_equal(len, doc_len);
        assert_int_equal(len, ref_chunk_len(n, parts, r, &rstart));
        assert_true(len >= 0 && len <= c);
        /* contiguous: each part starts where the previous one ended */
        assert_int_equal(off, expect_next);
        if (len > 0) assert_int_equal(off, c * r);
        assert_true(off >= 0 && off + len <= n);
        expect_next = off + len;
        total += len;
      }
      assert_int_equal(total, n);
      assert_int_equal(expect_next, n);
      /* chunk is torch.chunk: every non-empty part but the last non-empty one is full */
      int64_t prev_len = c;
      for (int r = 0; r < parts; r++) {
        int64_t off, len;
        dt_chunk(n, parts, r, &off, &len);
        assert_true(len <= prev_len); /* non-increasing */
        prev_len = len;
      }
    }
  }
}

static void test_chunk_spot(void** state) {
  (void)state;
  const int64_t want13[4] = {4, 4, 4, 1}, off13[4] = {0, 4, 8, 12};
  const int64_t want5[4] = {2, 2, 1, 0}, off5[3] = {0, 2, 4};
  for (int r = 0; r < 4; r++) {
    int64_t off = -1, len = -1;
    assert_int_equal(dt_chunk(13, 4, r, &off, &len), DT_SUCCESS);
    assert_int_equal(len, want13[r]);
    assert_int_equal(off, off13[r]);
    assert_int_equal(dt_chunk(5, 4, r, &off, &len), DT_SUCCESS);
    assert_int_equal(len, want5[r]);
    if (r < 3) assert_int_equal(off, off5[r]);
  }
  /* torch.chunk differs from an even split: 6 over 4 is 2,2,2,0 (not 2,2,1,1) */
  const int64_t want6[4] = {2, 2, 2, 0};
  for (int r = 0; r < 4; r++) {
    int64_t off, len;
    assert_int_equal(dt_chunk(6, 4, r, &off, &len), DT_SUCCESS);
    assert_int_equal(len, want6[r]);
  }
  /* one part holds everything */
  int64_t off, len;
  assert_int_equal(dt_chunk(17, 1, 0, &off, &len), DT_SUCCESS);
  assert_int_equal(off, 0);
  assert_int_equal(len, 17);
}

/* Sizes close to INT64_MAX: dt_chunk takes any non-negative int64 size, so the rule must hold
 * there too (no overflow in ceil(size/n) or c*(index+1)). */
static void test_chunk_large(void** state) {
  (void)state;
  const int64_t sizes[] = {INT64_MAX, INT64_MAX - 1, INT64_MAX - 7, ((int64_t)1 << 62) + 1,
                           ((int64_t)1 << 48) + 3};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int64_t n = sizes[k];
    for (int parts = 1; parts <= 9; parts++) {
      int64_t next = 0;
      for (int r = 0; r < parts; r++) {
        int64_t off = -1, len = -1, rstart;
        assert_int_equal(dt_chunk(n, parts, r, &off, &len), DT_SUCCESS);
        int64_t want = ref_chunk_len(n, parts, r, &rstart);
        if (len != want || off != next) {
          print_error("dt_chunk(%lld, %d, %d) = (%lld, %lld), expected (%lld, %lld)\n",
                      (long long)n, parts, r, (long long)off, (long long)len, (long long)next,
                      (long long)want);
          fail();
        }
        next = off + len;
      }
      assert_int_equal(next, n);
    }
  }
}

static void test_chunk_errors(void** state) {
  (void)state;
  int64_t off, len;
  struct {
    int64_t size;
    int nparts, index;
  } bad[] = {{5, 0, 0}, {5, -1, 0}, {5, 4, 4}, {5, 4, -1}, {-1, 4, 0}, {INT64_MIN, 2, 0},
             {0, 0, 0}, {0, 1, 1}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    dt_clear_error();
    assert_int_equal(dt_chunk(bad[k].size, bad[k].nparts, bad[k].index, &off, &len),
                     DT_ERR_INVALID_ARG);
    expect_msg("dt_chunk");
  }
  dt_clear_error();
  assert_int_equal(dt_chunk(5, 4, 0, NULL, &len), DT_ERR_INVALID_ARG);
  expect_msg("offset");
  dt_clear_error();
  assert_int_equal(dt_chunk(5, 4, 0, &off, NULL), DT_ERR_INVALID_ARG);
  expect_msg("len");
}

/* ---------------------------------------------------------------------------------------------
 * single placements */

typedef struct {
  const char* text;
  int kind, dim, op;
  const char* canon;
} parse_case_t;

static const parse_case_t good_cases[] = {
    {"S(0)", DT_SHARD, 0, 0, "S(0)"},
    {"S0", DT_SHARD, 0, 0, "S(0)"},
    {"S1", DT_SHARD, 1, 0, "S(1)"},
    {"S(3)", DT_SHARD, 3, 0, "S(3)"},
    {"S(7)", DT_SHARD, 7, 0, "S(7)"},
    {"S(-1)", DT_SHARD, -1, 0, "S(-1)"},
    {"S(-8)", DT_SHARD, -8, 0, "S(-8)"},
    {"Shard(2)", DT_SHARD, 2, 0, "S(2)"},
    {"Shard(-1)", DT_SHARD, -1, 0, "S(-1)"},
    {"R", DT_REPLICATE, 0, 0, "R"},
    {"Replicate", DT_REPLICATE, 0, 0, "R"},
    {"P", DT_PARTIAL, 0, DT_REDUCE_SUM, "P(sum)"},
    {"P(sum)", DT_PARTIAL, 0, DT_REDUCE_SUM, "P(sum)"},
    {"P(avg)", DT_PARTIAL, 0, DT_REDUCE_AVG, "P(avg)"},
    {"P(max)", DT_PARTIAL, 0, DT_REDUCE_MAX, "P(max)"},
    {"P(min)", DT_PARTIAL, 0, DT_REDUCE_MIN, "P(min)"},
    {"Partial(max)", DT_PARTIAL, 0, DT_REDUCE_MAX, "P(max)"},
    {"Partial(sum)", DT_PARTIAL, 0, DT_REDUCE_SUM, "P(sum)"},
    {"Partial(avg)", DT_PARTIAL, 0, DT_REDUCE_AVG, "P(avg)"},
    {"Partial(min)", DT_PARTIAL, 0, DT_REDUCE_MIN, "P(min)"},
    {"  S(1)  ", DT_SHARD, 1, 0, "S(1)"},
    {" S0", DT_SHARD, 0, 0, "S(0)"},
    {"R ", DT_REPLICATE, 0, 0, "R"},
    {"\tP(avg)\n", DT_PARTIAL, 0, DT_REDUCE_AVG, "P(avg)"},
    {"   Replicate   ", DT_REPLICATE, 0, 0, "R"},
    {" Partial(min) ", DT_PARTIAL, 0, DT_REDUCE_MIN, "P(min)"},
};

static void test_parse_good(void** state) {
  (void)state;
  for (size_t k = 0; k < sizeof good_cases / sizeof good_cases[0]; k++) {
    const parse_case_t* c = &good_cases[k];
    dt_placement_t p;
    fill_garbage(&p);
    dt_status_t st = dt_placement_parse(c->text, &p);
    if (st != DT_SUCCESS) {
      print_error("'%s' rejected: %s\n", c->text, dt_last_error());
      fail();
    }
    assert_int_equal(p.kind, c->kind);
    assert_int_equal(p.dim, c->dim);
    assert_int_equal(p.op, c->op);
    /* constructors give the same value (memcmp-equality of the plain struct) */
    dt_placement_t ctor = c->kind == DT_SHARD     ? dt_shard(c->dim)
                          : c->kind == DT_PARTIAL ? dt_partial((dt_reduce_op_t)c->op)
                                                  : dt_replicate();
    assert_memory_equal(&p, &ctor, sizeof p);
    assert_true(dt_placement_equal(p, ctor));
    /* format gives the canonical text, which parses back to the same value */
    char buf[32];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(dt_placement_format(p, buf, sizeof buf), DT_SUCCESS);
    assert_string_equal(buf, c->canon);
    dt_placement_t q;
    fill_garbage(&q);
    assert_int_equal(dt_placement_parse(buf, &q), DT_SUCCESS);
    assert_memory_equal(&p, &q, sizeof p);
    /* exact-size buffer works, one byte less does not */
    size_t need = strlen(c->canon) + 1;
    assert_int_equal(dt_placement_format(p, buf, need), DT_SUCCESS);
    assert_string_equal(buf, c->canon);
    dt_clear_error();
    assert_int_equal(dt_placement_format(p, buf, need - 1), DT_ERR_INVALID_ARG);
    expect_msg(NULL);
  }
}

/* Every shard dim in the accepted range round-trips through both short forms. */
static void test_parse_all_dims(void** state) {
  (void)state;
  for (int d = -DT_MAX_DIMS; d < DT_MAX_DIMS; d++) {
    char t1[16], t2[16], t3[16], out[16];
    snprintf(t1, sizeof t1, "S(%d)", d);
    snprintf(t2, sizeof t2, "S%d", d);
    snprintf(t3, sizeof t3, "Shard(%d)", d);
    const char* texts[3] = {t1, t2, t3};
    for (int k = 0; k < 3; k++) {
      dt_placement_t p;
      assert_int_equal(dt_placement_parse(texts[k], &p), DT_SUCCESS);
      assert_int_equal(p.kind, DT_SHARD);
      assert_int_equal(p.dim, d);
      assert_int_equal(p.op, 0);
      assert_int_equal(dt_placement_format(p, out, sizeof out), DT_SUCCESS);
      assert_string_equal(out, t1);
    }
  }
}

static const char* const bad_texts[] = {
    "", " ", "   ", "\t\n", "S", "S(", "S()", "S(a)", "S(0", "S0)", "S(0))", "S00000",
    "S(99)", "S(-99)", "S(8)", "S(-9)", "S99", "S-9", "S(1.5)", "S(0x1)", "S(--1)",
    "S(-)", "S-", "S((0))", "S(0)(1)", "S[0]", "S{0}", "S(0)x", "xS(0)", "S 0", "S (0)", "S0 0",
    "S(0),R", "S0R", "Shard", "Shard(", "Shard()", "Shard(0", "Shard0", "Shard(x)", "Shard(99)",
    "Sh(0)", "s0", "s(0)", "shard(0)", "P(", "P()", "P(foo)", "P(sum", "Psum", "P sum", "P(sum)x",
    "P(sum))", "P((sum))", "P(su)", "P(summ)", "P(sum,max)", "P(s)", "PP", "P0", "P(0)", "p",
    "p(sum)", "Partial(", "Partial(foo)", "Partial(sum", "partial(sum)", "R1", "RR", "R()x",
    "R(sum)", "Rep", "replicate", "r", "X", "x", "0", "-1", "()", ",", "R,", ",R", "R R",
    "S0 R", "P(sum) R",
};

static void test_parse_bad(void** state) {
  (void)state;
  for (size_t k = 0; k < sizeof bad_texts / sizeof bad_texts[0]; k++) {
    dt_placement_t p;
    fill_garbage(&p);
    dt_clear_error();
    dt_status_t st = dt_placement_parse(bad_texts[k], &p);
    if (st != DT_ERR_INVALID_ARG) {
      print_error("'%s' gave %s, expected DT_ERR_INVALID_ARG\n", bad_texts[k], dt_status_name(st));
      fail();
    }
    if (strlen(dt_last_error()) == 0) {
      print_error("'%s': no error message\n", bad_texts[k]);
      fail();
    }
    if (!placement_is_zero(&p)) {
      print_error("'%s': out not zeroed (%d, %d, %d)\n", bad_texts[k], p.kind, p.dim, p.op);
      fail();
    }
  }
  /* a very long text, valid or not after trimming */
  char longbuf[300];
  memset(longbuf, 'S', sizeof longbuf - 1);
  longbuf[sizeof longbuf - 1] = '\0';
  dt_placement_t p;
  fill_garbage(&p);
  assert_int_equal(dt_placement_parse(longbuf, &p), DT_ERR_INVALID_ARG);
  assert_true(placement_is_zero(&p));
  expect_msg(NULL);
  memset(longbuf, ' ', sizeof longbuf - 1);
  longbuf[150] = 'R'; /* 150 spaces, R, 148 spaces: surrounding spaces are ignored */
  assert_int_equal(dt_placement_parse(longbuf, &p), DT_SUCCESS);
  assert_int_equal(p.kind, DT_REPLICATE);
  snprintf(longbuf, sizeof longbuf, "S(%0200d)", 1); /* 200 digits */
  fill_garbage(&p);
  assert_int_equal(dt_placement_parse(longbuf, &p), DT_ERR_INVALID_ARG);
  assert_true(placement_is_zero(&p));
}

static void test_parse_null(void** state) {
  (void)state;
  dt_placement_t p;
  dt_clear_error();
  assert_int_equal(dt_placement_parse("S(0)", NULL), DT_ERR_INVALID_ARG);
  expect_msg("out");
  fill_garbage(&p);
  dt_clear_error();
  assert_int_equal(dt_placement_parse(NULL, &p), DT_ERR_INVALID_ARG);
  expect_msg("text");
  /* the output is zeroed on every failure, including a NULL text */
  assert_true(placement_is_zero(&p));
  dt_clear_error();
  assert_int_equal(dt_placement_parse(NULL, NULL), DT_ERR_INVALID_ARG);
  expect_msg(NULL);
}

static void test_placement_equal(void** state) {
  (void)state;
  assert_true(dt_placement_equal(dt_shard(0), dt_shard(0)));
  assert_false(dt_placement_equal(dt_shard(0), dt_shard(1)));
  assert_false(dt_placement_equal(dt_shard(0), dt_replicate()));
  assert_false(dt_placement_equal(dt_shard(0), dt_partial(DT_REDUCE_SUM)));
  assert_false(dt_placement_equal(dt_replicate(), dt_partial(DT_REDUCE_SUM)));
  assert_true(dt_placement_equal(dt_replicate(), dt_replicate()));
  for (int a = 0; a < DT_REDUCE_COUNT; a++)
    for (int b = 0; b < DT_REDUCE_COUNT; b++)
      assert_int_equal(dt_placement_equal(dt_partial((dt_reduce_op_t)a), dt_partial((dt_reduce_op_t)b)),
                       a == b);
  /* fields that are not meaningful for the kind are ignored */
  dt_placement_t r1 = {DT_REPLICATE, 3, 2}, s1 = {DT_SHARD, 1, 3}, p1 = {DT_PARTIAL, 5, DT_REDUCE_MAX};
  assert_true(dt_placement_equal(r1, dt_replicate()));
  assert_true(dt_placement_equal(s1, dt_shard(1)));
  assert_true(dt_placement_equal(p1, dt_partial(DT_REDUCE_MAX)));
  /* constructors keep unused fields 0 */
  dt_placement_t s = dt_shard(2), r = dt_replicate(), p = dt_partial(DT_REDUCE_MIN);
  assert_int_equal(s.op, 0);
  assert_int_equal(r.dim, 0);
  assert_int_equal(r.op, 0);
  assert_int_equal(p.dim, 0);
}

/* ---------------------------------------------------------------------------------------------
 * lists */

static void test_list_parse_good(void** state) {
  (void)state;
  struct {
    const char* text;
    int n;
    dt_placement_t want[4];
  } cases[] = {
      {"S0,R", 2, {dt_shard(0), dt_replicate()}},
      {"S(0),P(sum),R", 3, {dt_shard(0), dt_partial(DT_REDUCE_SUM), dt_replicate()}},
      {"R", 1, {dt_replicate()}},
      {"S(1), S(0)", 2, {dt_shard(1), dt_shard(0)}},
      {" P(max) , Shard(-1) ,Replicate,P", 4,
       {dt_partial(DT_REDUCE_MAX), dt_shard(-1), dt_replicate(), dt_partial(DT_REDUCE_SUM)}},
      {"Partial(avg),R", 2, {dt_partial(DT_REDUCE_AVG), dt_replicate()}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    dt_placement_t out[5];
    int n = -1;
    for (int i = 0; i < 5; i++) fill_garbage(&out[i]);
    assert_int_equal(dt_placements_parse(cases[k].text, out, 4, &n), DT_SUCCESS);
    assert_int_equal(n, cases[k].n);
    for (int i = 0; i < n; i++) assert_memory_equal(&out[i], &cases[k].want[i], sizeof out[i]);
    /* entries past n are not written */
    for (int i = n; i < 5; i++) {
      dt_placement_t g;
      fill_garbage(&g);
      assert_memory_equal(&out[i], &g, sizeof g);
    }
    /* a cap of exactly n is enough */
    assert_int_equal(dt_placements_parse(cases[k].text, out, cases[k].n, &n), DT_SUCCESS);
    assert_int_equal(n, cases[k].n);
  }
}

static void test_list_parse_bad(void** state) {
  (void)state;
  const char* bad[] = {"",     ",",       "S0,,R",  "S0,R,",     ",S0,R",   "S0;R",
                       "S0 R", "S0,X",    "S0,R,,", "S(0,R",     "S0,P(",   "R,,",
                       " , ",  "S0,  ,R", "S0,S(99)", "P(sum,max)", "R,r",    "S(0),P(foo)"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    dt_placement_t out[4];
    int n = 77;
    dt_clear_error();
    dt_status_t st = dt_placements_parse(bad[k], out, 4, &n);
    if (st != DT_ERR_INVALID_ARG) {
      print_error("list '%s' gave %s\n", bad[k], dt_status_name(st));
      fail();
    }
    assert_int_equal(n, 0);
    expect_msg(NULL);
  }
  /* too many items for cap: nothing past cap is written */
  dt_placement_t out[4];
  for (int i = 0; i < 4; i++) fill_garbage(&out[i]);
  int n = 77;
  dt_clear_error();
  assert_int_equal(dt_placements_parse("R,R,R", out, 2, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(n, 0);
  expect_msg(NULL);
  dt_placement_t g;
  fill_garbage(&g);
  assert_memory_equal(&out[2], &g, sizeof g);
  assert_memory_equal(&out[3], &g, sizeof g);
  n = 77;
  assert_int_equal(dt_placements_parse("S0,S1,R,P,R", out, 4, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(n, 0);
  n = 77;
  assert_int_equal(dt_placements_parse("R", out, 0, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(n, 0);
  n = 77;
  assert_int_equal(dt_placements_parse("R", out, -1, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(n, 0);
  /* NULL pointers */
  dt_clear_error();
  assert_int_equal(dt_placements_parse(NULL, out, 4, &n), DT_ERR_INVALID_ARG);
  expect_msg(NULL);
  assert_int_equal(dt_placements_parse("R", NULL, 4, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placements_parse("R", out, 4, NULL), DT_ERR_INVALID_ARG);
  /* an over-long item */
  char longbuf[200];
  memset(longbuf, 'R', sizeof longbuf - 1);
  longbuf[sizeof longbuf - 1] = '\0';
  longbuf[0] = 'R';
  longbuf[1] = ',';
  n = 77;
  assert_int_equal(dt_placements_parse(longbuf, out, 4, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(n, 0);
}

static void test_format(void** state) {
  (void)state;
  dt_placement_t pl[4] = {dt_shard(0), dt_replicate(), dt_partial(DT_REDUCE_MAX), dt_shard(-1)};
  char buf[64];
  assert_int_equal(dt_placements_format(pl, 2, NULL, buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0)R");
  assert_int_equal(dt_placements_format(pl, 2, ",", buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0),R");
  assert_int_equal(dt_placements_format(pl, 4, ", ", buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0), R, P(max), S(-1)");
  assert_int_equal(dt_placements_format(pl, 1, ",", buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0)");
  assert_int_equal(dt_placements_format(pl, 0, ",", buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "");
  /* the ","-separated form parses back to the same list */
  assert_int_equal(dt_placements_format(pl, 4, ",", buf, sizeof buf), DT_SUCCESS);
  dt_placement_t back[4];
  int n = 0;
  assert_int_equal(dt_placements_parse(buf, back, 4, &n), DT_SUCCESS);
  assert_int_equal(n, 4);
  assert_memory_equal(back, pl, sizeof pl);
  /* too small */
  dt_clear_error();
  assert_int_equal(dt_placements_format(pl, 2, ",", buf, 6), DT_ERR_INVALID_ARG); /* needs 7 */
  expect_msg(NULL);
  assert_int_equal(dt_placements_format(pl, 2, ",", buf, 7), DT_SUCCESS);
  assert_string_equal(buf, "S(0),R");
  assert_int_equal(dt_placements_format(pl, 2, ",", buf, 0), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placements_format(pl, -1, ",", buf, sizeof buf), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placements_format(NULL, 1, ",", buf, sizeof buf), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placements_format(pl, 1, ",", NULL, sizeof buf), DT_ERR_INVALID_ARG);
  /* invalid values cannot be formatted */
  dt_placement_t badkind = {7, 0, 0}, badop = {DT_PARTIAL, 0, DT_REDUCE_COUNT},
                 negop = {DT_PARTIAL, 0, -1}, negkind = {-1, 0, 0};
  const dt_placement_t bads[4] = {badkind, badop, negop, negkind};
  for (int k = 0; k < 4; k++) {
    dt_clear_error();
    assert_int_equal(dt_placement_format(bads[k], buf, sizeof buf), DT_ERR_INVALID_ARG);
    expect_msg(NULL);
    dt_placement_t two[2] = {dt_replicate(), bads[k]};
    assert_int_equal(dt_placements_format(two, 2, ",", buf, sizeof buf), DT_ERR_INVALID_ARG);
  }
  assert_int_equal(dt_placement_format(dt_replicate(), NULL, 8), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_format(dt_replicate(), buf, 0), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_format(dt_replicate(), buf, 1), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_format(dt_replicate(), buf, 2), DT_SUCCESS);
  assert_string_equal(buf, "R");
}

/* ---------------------------------------------------------------------------------------------
 * normalize */

static void test_normalize(void** state) {
  (void)state;
  for (int nd = 1; nd <= DT_MAX_DIMS; nd++) {
    for (int d = -nd - 2; d < nd + 2; d++) {
      dt_placement_t p = dt_shard(d);
      dt_clear_error();
      dt_status_t st = dt_placement_normalize(&p, nd);
      if (d >= -nd && d < nd) {
        assert_int_equal(st, DT_SUCCESS);
        assert_int_equal(p.kind, DT_SHARD);
        assert_int_equal(p.dim, d < 0 ? d + nd : d);
      } else {
        assert_int_equal(st, DT_ERR_INVALID_ARG);
        expect_msg(NULL);
      }
    }
  }
  /* a 0-dim tensor cannot be sharded */
  dt_placement_t p = dt_shard(0);
  assert_int_equal(dt_placement_normalize(&p, 0), DT_ERR_INVALID_ARG);
  p = dt_shard(-1);
  assert_int_equal(dt_placement_normalize(&p, 0), DT_ERR_INVALID_ARG);
  /* Replicate and Partial are valid for any rank, including 0 */
  for (int nd = 0; nd <= DT_MAX_DIMS; nd++) {
    p = dt_replicate();
    assert_int_equal(dt_placement_normalize(&p, nd), DT_SUCCESS);
    assert_int_equal(p.kind, DT_REPLICATE);
    for (int op = 0; op < DT_REDUCE_COUNT; op++) {
      p = dt_partial((dt_reduce_op_t)op);
      assert_int_equal(dt_placement_normalize(&p, nd), DT_SUCCESS);
      assert_int_equal(p.kind, DT_PARTIAL);
      assert_int_equal(p.op, op);
    }
  }
  /* out-of-range tensor ranks */
  p = dt_replicate();
  assert_int_equal(dt_placement_normalize(&p, -1), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_normalize(&p, DT_MAX_DIMS + 1), DT_ERR_INVALID_ARG);
  /* out-of-range kind and op */
  dt_placement_t bk = {DT_PLACEMENT_KIND_COUNT, 0, 0}, nk = {-1, 0, 0},
                 bo = {DT_PARTIAL, 0, DT_REDUCE_COUNT}, no = {DT_PARTIAL, 0, -1};
  dt_clear_error();
  assert_int_equal(dt_placement_normalize(&bk, 2), DT_ERR_INVALID_ARG);
  expect_msg(NULL);
  assert_int_equal(dt_placement_normalize(&nk, 2), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_normalize(&bo, 2), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_normalize(&no, 2), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_normalize(NULL, 2), DT_ERR_INVALID_ARG);
  /* a normalized placement stays equal to its normalized self */
  p = dt_shard(-2);
  assert_int_equal(dt_placement_normalize(&p, 4), DT_SUCCESS);
  assert_true(dt_placement_equal(p, dt_shard(2)));
  dt_placement_t q = p;
  assert_int_equal(dt_placement_normalize(&q, 4), DT_SUCCESS);
  assert_memory_equal(&p, &q, sizeof p);
}

/* ---------------------------------------------------------------------------------------------
 * dtypes and reduce ops */

static void test_dtypes(void** state) {
  (void)state;
  struct {
    dt_dtype_t d;
    const char* name;
    size_t size;
  } all[] = {{DT_F32, "f32", 4}, {DT_BF16, "bf16", 2}, {DT_F16, "f16", 2}, {DT_I32, "i32", 4},
             {DT_I64, "i64", 8}};
  assert_int_equal(sizeof all / sizeof all[0], DT_DTYPE_COUNT);
  for (int k = 0; k < DT_DTYPE_COUNT; k++) {
    size_t n = 0;
    assert_int_equal(dt_dtype_itemsize(all[k].d, &n), DT_SUCCESS);
    assert_int_equal(n, all[k].size);
    assert_string_equal(dt_dtype_name(all[k].d), all[k].name);
    dt_dtype_t back = (dt_dtype_t)99;
    assert_int_equal(dt_dtype_parse(all[k].name, &back), DT_SUCCESS);
    assert_int_equal(back, all[k].d);
    /* names are distinct */
    for (int j = 0; j < k; j++) assert_string_not_equal(dt_dtype_name(all[j].d), all[k].name);
  }
  const int bad_dtypes[] = {-1, DT_DTYPE_COUNT, 99, 1000000};
  for (size_t k = 0; k < sizeof bad_dtypes / sizeof bad_dtypes[0]; k++) {
    size_t n = 123;
    dt_clear_error();
    assert_int_equal(dt_dtype_itemsize((dt_dtype_t)bad_dtypes[k], &n), DT_ERR_INVALID_ARG);
    assert_int_equal(n, 0);
    expect_msg(NULL);
    assert_string_equal(dt_dtype_name((dt_dtype_t)bad_dtypes[k]), "invalid");
  }
  assert_int_equal(dt_dtype_itemsize(DT_F32, NULL), DT_ERR_INVALID_ARG);
  const char* bad_names[] = {"", " ", "f33", "f64", "float64", "i8", "u32", "F 32", "f32 ",
                             "invalid", "bf", "f"};
  for (size_t k = 0; k < sizeof bad_names / sizeof bad_names[0]; k++) {
    dt_dtype_t d = DT_I64;
    dt_clear_error();
    assert_int_equal(dt_dtype_parse(bad_names[k], &d), DT_ERR_INVALID_ARG);
    expect_msg(NULL);
  }
  dt_dtype_t d;
  assert_int_equal(dt_dtype_parse(NULL, &d), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_dtype_parse("f32", NULL), DT_ERR_INVALID_ARG);

  const char* ops[DT_REDUCE_COUNT] = {"sum", "avg", "max", "min"};
  for (int k = 0; k < DT_REDUCE_COUNT; k++)
    assert_string_equal(dt_reduce_op_name((dt_reduce_op_t)k), ops[k]);
  assert_string_equal(dt_reduce_op_name((dt_reduce_op_t)-1), "invalid");
  assert_string_equal(dt_reduce_op_name((dt_reduce_op_t)DT_REDUCE_COUNT), "invalid");
}

/* ---------------------------------------------------------------------------------------------
 * status codes, last error, version */

static void test_status(void** state) {
  (void)state;
  struct {
    dt_status_t st;
    const char* name;
    int value;
  } all[] = {
#define X(name, value, text) {name, #name, value},
      DT_STATUS_MAP(X)
#undef X
  };
  const size_t n = sizeof all / sizeof all[0];
  for (size_t k = 0; k < n; k++) {
    assert_int_equal((int)all[k].st, all[k].value);
    assert_string_equal(dt_status_name(all[k].st), all[k].name);
    const char* s = dt_status_string(all[k].st);
    assert_non_null(s);
    assert_true(strlen(s) > 0);
    for (size_t j = 0; j < k; j++) {
      assert_string_not_equal(dt_status_string(all[j].st), s);
      assert_string_not_equal(dt_status_name(all[j].st), dt_status_name(all[k].st));
    }
  }
  assert_string_equal(dt_status_name(DT_SUCCESS), "DT_SUCCESS");
  assert_string_equal(dt_status_name(DT_ERR_NOT_INITIALIZED), "DT_ERR_NOT_INITIALIZED");
  const int bad[] = {-1, DT_STATUS_COUNT, DT_STATUS_COUNT + 1, 1000};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    assert_string_equal(dt_status_name((dt_status_t)bad[k]), "DT_UNKNOWN_STATUS");
    const char* s = dt_status_string((dt_status_t)bad[k]);
    assert_non_null(s);
    assert_true(strlen(s) > 0);
    for (size_t j = 0; j < n; j++) assert_string_not_equal(s, dt_status_string(all[j].st));
  }
}

static void test_last_error(void** state) {
  (void)state;
  dt_clear_error();
  assert_non_null(dt_last_error());
  assert_string_equal(dt_last_error(), "");
  dt_placement_t p;
  assert_int_equal(dt_placement_parse("S(99)", &p), DT_ERR_INVALID_ARG);
  /* "function (file:line): ..." */
  const char* e = dt_last_error();
  assert_non_null(strstr(e, "dt_placement_parse"));
  assert_non_null(strstr(e, "S(99)"));
  assert_non_null(strstr(e, ":"));
  dt_clear_error();
  assert_string_equal(dt_last_error(), "");
  /* an error message quoting a long text is truncated, never overflowed */
  char longbuf[4000];
  memset(longbuf, 'Q', sizeof longbuf - 1);
  longbuf[sizeof longbuf - 1] = '\0';
  dt_dtype_t dd;
  assert_int_equal(dt_dtype_parse(longbuf, &dd), DT_ERR_INVALID_ARG);
  assert_true(strlen(dt_last_error()) > 0);
  assert_true(strlen(dt_last_error()) < sizeof longbuf);
  dt_clear_error();
}

/* status.h: like errno, the message stays until the next failure or dt_clear_error(). */
static void test_last_error_cleared_by_success(void** state) {
  (void)state;
  dt_placement_t p;
  assert_int_equal(dt_placement_parse("bogus", &p), DT_ERR_INVALID_ARG);
  assert_true(strstr(dt_last_error(), "bogus") != NULL);
  assert_int_equal(dt_placement_parse("R", &p), DT_SUCCESS);
  assert_true(strstr(dt_last_error(), "bogus") != NULL);
  assert_int_equal(dt_placement_parse("S(", &p), DT_ERR_INVALID_ARG);
  assert_true(strstr(dt_last_error(), "bogus") == NULL);
  dt_clear_error();
  assert_string_equal(dt_last_error(), "");
}

static void test_version(void** state) {
  (void)state;
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", DT_VERSION_MAJOR, DT_VERSION_MINOR, DT_VERSION_PATCH);
  assert_non_null(dt_version());
  assert_string_equal(dt_version(), want);
  int a = -1, b = -1, c = -1;
  assert_int_equal(sscanf(dt_version(), "%d.%d.%d", &a, &b, &c), 3);
  assert_int_equal(a, DT_VERSION_MAJOR);
  assert_int_equal(b, DT_VERSION_MINOR);
  assert_int_equal(c, DT_VERSION_PATCH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_exhaustive),
      cmocka_unit_test(test_chunk_spot),
      cmocka_unit_test(test_chunk_errors),
      cmocka_unit_test(test_parse_good),
      cmocka_unit_test(test_parse_all_dims),
      cmocka_unit_test(test_parse_bad),
      cmocka_unit_test(test_parse_null),
      cmocka_unit_test(test_placement_equal),
      cmocka_unit_test(test_list_parse_good),
      cmocka_unit_test(test_list_parse_bad),
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_normalize),
      cmocka_unit_test(test_dtypes),
      cmocka_unit_test(test_status),
      cmocka_unit_test(test_last_error),
      cmocka_unit_test(test_last_error_cleared_by_success),
      cmocka_unit_test(test_version),
      /* last: under UBSan an overflow inside dt_chunk aborts the process */
      cmocka_unit_test(test_chunk_large),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

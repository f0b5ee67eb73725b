/* test_placement_unit.c - chunk rule, placement parsing/printing/normalizing, dtypes, status
 * codes. No MPI, no dt_init. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtensor/dtensor.h"

/* The torch.chunk rule written independently of the library. */
static void ref_chunk(int64_t n, int parts, int r, int64_t* off, int64_t* len) {
  int64_t c = n / parts + (n % parts != 0);
  int64_t s = c * r, e = c * (r + 1);
  if (e > n) e = n;
  *len = e > s ? e - s : 0;
  *off = s < n ? s : n;
}

static void test_chunk_rule(void** state) {
  (void)state;
  for (int64_t n = 0; n <= 40; n++)
    for (int parts = 1; parts <= 9; parts++) {
      int64_t sum = 0, next = 0;
      for (int r = 0; r < parts; r++) {
        int64_t off, len, roff, rlen;
        assert_int_equal(dt_chunk(n, parts, r, &off, &len), DT_SUCCESS);
        ref_chunk(n, parts, r, &roff, &rlen);
        assert_int_equal(len, rlen);
        if (len > 0) {
          assert_int_equal(off, roff);
          assert_int_equal(off, next); /* contiguous, in rank order */
          next = off + len;
        }
        sum += len;
      }
      assert_int_equal(sum, n);
    }
  const int64_t want13[4] = {4, 4, 4, 1}, want5[4] = {2, 2, 1, 0};
  for (int r = 0; r < 4; r++) {
    int64_t off, len;
    dt_chunk(13, 4, r, &off, &len);
    assert_int_equal(len, want13[r]);
    dt_chunk(5, 4, r, &off, &len);
    assert_int_equal(len, want5[r]);
  }
  int64_t off = 7, len = 7;
  assert_int_equal(dt_chunk(5, 0, 0, &off, &len), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_chunk(5, 4, 4, &off, &len), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_chunk(5, 4, -1, &off, &len), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_chunk(-1, 4, 0, &off, &len), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_chunk(5, 4, 0, NULL, &len), DT_ERR_INVALID_ARG);
  assert_true(strlen(dt_last_error()) > 0);
}

static void roundtrip(const char* in, const char* canon, int kind, int dim, int op) {
  dt_placement_t p;
  assert_int_equal(dt_placement_parse(in, &p), DT_SUCCESS);
  assert_int_equal(p.kind, kind);
  if (kind == DT_SHARD) assert_int_equal(p.dim, dim);
  if (kind == DT_PARTIAL) assert_int_equal(p.op, op);
  char buf[32];
  assert_int_equal(dt_placement_format(p, buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, canon);
  dt_placement_t q;
  assert_int_equal(dt_placement_parse(buf, &q), DT_SUCCESS);
  assert_true(dt_placement_equal(p, q));
}

static void test_parse_valid(void** state) {
  (void)state;
  roundtrip("S(0)", "S(0)", DT_SHARD, 0, 0);
  roundtrip("S0", "S(0)", DT_SHARD, 0, 0);
  roundtrip("S7", "S(7)", DT_SHARD, 7, 0);
  roundtrip("S(-1)", "S(-1)", DT_SHARD, -1, 0);
  roundtrip("S-2", "S(-2)", DT_SHARD, -2, 0);
  roundtrip("Shard(2)", "S(2)", DT_SHARD, 2, 0);
  roundtrip("R", "R", DT_REPLICATE, 0, 0);
  roundtrip("Replicate", "R", DT_REPLICATE, 0, 0);
  roundtrip("Replicate()", "R", DT_REPLICATE, 0, 0);
  roundtrip("P", "P(sum)", DT_PARTIAL, 0, DT_REDUCE_SUM);
  roundtrip("Partial", "P(sum)", DT_PARTIAL, 0, DT_REDUCE_SUM);
  roundtrip("P(sum)", "P(sum)", DT_PARTIAL, 0, DT_REDUCE_SUM);
  roundtrip("P(avg)", "P(avg)", DT_PARTIAL, 0, DT_REDUCE_AVG);
  roundtrip("P(max)", "P(max)", DT_PARTIAL, 0, DT_REDUCE_MAX);
  roundtrip("P(min)", "P(min)", DT_PARTIAL, 0, DT_REDUCE_MIN);
  roundtrip("Partial(max)", "P(max)", DT_PARTIAL, 0, DT_REDUCE_MAX);
  roundtrip("  S(1)  ", "S(1)", DT_SHARD, 1, 0);
  roundtrip("\tR\n", "R", DT_REPLICATE, 0, 0);
}

static void test_parse_malformed(void** state) {
  (void)state;
  const char* bad[] = {"",      " ",      "S",      "S(",     "S()",    "S(a)",   "S(0",
                       "S0)",   "S(0))",  "S00000", "S(99)",  "S(-99)", "P(",     "P()",
                       "P(foo)", "P(sum", "Psum",   "R1",     "RR",     "X",      "s0",
                       "r",     "p",      "S(0)x",  "S 0",    "S(+)",   "S(-)",   "P(SUM)",
                       "Shard", "Shard()", "Shard(x)", "Partial(", "Replicate(1)", "S(0)S(1)",
                       "S8",    "S(8)",   "S(-9)",  "P(sum))", "R,",    "SS0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dt_placement_t p = {7, 7, 7};
    dt_clear_error();
    dt_status_t st = dt_placement_parse(bad[i], &p);
    if (st != DT_ERR_INVALID_ARG) fail_msg("'%s' was accepted", bad[i]);
    assert_true(strlen(dt_last_error()) > 0);
    assert_int_equal(p.kind, 0);
    assert_int_equal(p.dim, 0);
    assert_int_equal(p.op, 0);
  }
  dt_placement_t p;
  assert_int_equal(dt_placement_parse(NULL, &p), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_parse("R", NULL), DT_ERR_INVALID_ARG);
  char longtext[200];
  memset(longtext, 'S', sizeof longtext - 1);
  longtext[199] = '\0';
  assert_int_equal(dt_placement_parse(longtext, &p), DT_ERR_INVALID_ARG);
}

static void test_parse_lists(void** state) {
  (void)state;
  dt_placement_t p[4];
  int n = -1;
  assert_int_equal(dt_placements_parse("S0,R", p, 4, &n), DT_SUCCESS);
  assert_int_equal(n, 2);
  assert_true(dt_placement_equal(p[0], dt_shard(0)));
  assert_true(dt_placement_equal(p[1], dt_replicate()));
  assert_int_equal(dt_placements_parse("S(0),P(sum),R", p, 4, &n), DT_SUCCESS);
  assert_int_equal(n, 3);
  assert_true(dt_placement_equal(p[1], dt_partial(DT_REDUCE_SUM)));
  const char* bad[] = {"S0,,R", "S0,", ",S0", "", "S0,Q", "S0;R"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    n = 9;
    if (dt_placements_parse(bad[i], p, 4, &n) != DT_ERR_INVALID_ARG) fail_msg("'%s' accepted", bad[i]);
    assert_int_equal(n, 0);
  }
  assert_int_equal(dt_placements_parse("R,R,R", p, 2, &n), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placements_parse("R", p, 0, &n), DT_ERR_INVALID_ARG);
  char buf[64];
  dt_placement_t two[2] = {dt_shard(0), dt_partial(DT_REDUCE_AVG)};
  assert_int_equal(dt_placements_format(two, 2, NULL, buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0)P(avg)");
  assert_int_equal(dt_placements_format(two, 2, ",", buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0),P(avg)");
  assert_int_equal(dt_placements_format(two, 2, ",", buf, 5), DT_ERR_INVALID_ARG);
  dt_placement_t badkind = {9, 0, 0};
  assert_int_equal(dt_placement_format(badkind, buf, sizeof buf), DT_ERR_INVALID_ARG);
  dt_placement_t badop = {DT_PARTIAL, 0, 9};
  assert_int_equal(dt_placement_format(badop, buf, sizeof buf), DT_ERR_INVALID_ARG);
}

static void test_normalize(void** state) {
  (void)state;
  dt_placement_t p = dt_shard(-1);
  assert_int_equal(dt_placement_normalize(&p, 2), DT_SUCCESS);
  assert_int_equal(p.dim, 1);
  p = dt_shard(-2);
  assert_int_equal(dt_placement_normalize(&p, 2), DT_SUCCESS);
  assert_int_equal(p.dim, 0);
  p = dt_shard(-3);
  assert_int_equal(dt_placement_normalize(&p, 2), DT_ERR_INVALID_ARG);
  p = dt_shard(2);
  assert_int_equal(dt_placement_normalize(&p, 2), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "out of range"));
  p = dt_shard(0);
  assert_int_equal(dt_placement_normalize(&p, 0), DT_ERR_INVALID_ARG); /* scalars can't shard */
  p = dt_partial((dt_reduce_op_t)7);
  assert_int_equal(dt_placement_normalize(&p, 2), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_placement_normalize(NULL, 2), DT_ERR_INVALID_ARG);
  p = dt_replicate();
  assert_int_equal(dt_placement_normalize(&p, 9), DT_ERR_INVALID_ARG);
  assert_true(dt_placement_equal(dt_shard(1), dt_shard(1)));
  assert_false(dt_placement_equal(dt_shard(1), dt_shard(0)));
  assert_false(dt_placement_equal(dt_partial(DT_REDUCE_SUM), dt_partial(DT_REDUCE_MAX)));
  assert_false(dt_placement_equal(dt_replicate(), dt_partial(DT_REDUCE_SUM)));
}

/* dt_placement_encode/decode: every valid placement round-trips; the unused field is dropped;
 * out-of-range fields give -1 (which decode refuses) instead of wrapping into another placement. */
static void test_encode(void** state) {
  (void)state;
  dt_placement_t q;
  for (int d = -DT_MAX_DIMS; d < DT_MAX_DIMS; d++) {
    int64_t code = dt_placement_encode(dt_shard(d));
    assert_true(code >= 0);
    assert_int_equal(dt_placement_decode(code, &q), DT_SUCCESS);
    assert_true(dt_placement_equal(q, dt_shard(d)));
  }
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    assert_int_equal(dt_placement_decode(dt_placement_encode(dt_partial((dt_reduce_op_t)op)), &q),
                     DT_SUCCESS);
    assert_true(dt_placement_equal(q, dt_partial((dt_reduce_op_t)op)));
  }
  dt_placement_t r = {DT_REPLICATE, 5, 3}; /* unused fields set: still Replicate */
  assert_int_equal(dt_placement_encode(r), dt_placement_encode(dt_replicate()));
  dt_placement_t sp = {DT_SHARD, 1, 2};
  assert_int_equal(dt_placement_encode(sp), dt_placement_encode(dt_shard(1)));
  const dt_placement_t bad[] = {dt_shard(DT_MAX_DIMS), dt_shard(-DT_MAX_DIMS - 1), dt_shard(256),
                                dt_shard(264), dt_partial((dt_reduce_op_t)DT_REDUCE_COUNT),
                                dt_partial((dt_reduce_op_t)16), dt_partial((dt_reduce_op_t)-1),
                                {DT_PLACEMENT_KIND_COUNT, 0, 0}, {-1, 0, 0}, {16, 0, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(dt_placement_encode(bad[i]), -1);
    assert_int_equal(dt_placement_decode(dt_placement_encode(bad[i]), &q), DT_ERR_INVALID_ARG);
  }
}

/* dt_placements_box: the nested chunk rule (written out by hand for one case), a partition of
 * the tensor by the boxes of every coordinate for every Shard-only layout of a 2x3 mesh, whole
 * dims for Replicate and Partial, and errors naming the argument. */
static void test_placements_box(void** state) {
  (void)state;
  const int mesh[2] = {2, 3};
  /* S(0),S(0) on 13 rows: 7 | 6 over the first mesh dim, then 3,3,1 | 2,2,2 */
  const int64_t rows = 13, want_off[6] = {0, 3, 6, 7, 9, 11}, want_len[6] = {3, 3, 1, 2, 2, 2};
  dt_placement_t nest[2] = {dt_shard(0), dt_shard(0)};
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 3; b++) {
      int c[2] = {a, b};
      int64_t off, len;
      assert_int_equal(dt_placements_box(1, &rows, 2, mesh, nest, c, &off, &len), DT_SUCCESS);
      assert_int_equal(off, want_off[a * 3 + b]);
      assert_int_equal(len, want_len[a * 3 + b]);
    }
  /* every Shard-only layout of a (5, 4) or (2, 1) tensor: each element in exactly one box */
  const int64_t shapes[2][2] = {{5, 4}, {2, 1}};
  for (int si = 0; si < 2; si++)
    for (int p0 = -1; p0 < 2; p0++)
      for (int p1 = -1; p1 < 2; p1++) {
        dt_placement_t pl[2] = {p0 < 0 ? dt_replicate() : dt_shard(p0),
                                p1 < 0 ? dt_partial(DT_REDUCE_SUM) : dt_shard(p1)};
        int count[5][4] = {{0}};
        for (int a = 0; a < 2; a++)
          for (int b = 0; b < 3; b++) {
            int c[2] = {a, b};
            int64_t off[2], len[2];
            assert_int_equal(dt_placements_box(2, shapes[si], 2, mesh, pl, c, off, len),
                             DT_SUCCESS);
            for (int64_t i = off[0]; i < off[0] + len[0]; i++)
              for (int64_t j = off[1]; j < off[1] + len[1]; j++) count[i][j]++;
          }
        /* replicas: the mesh dims that do not shard, times */
        int copies = (p0 < 0 ? 2 : 1) * (p1 < 0 ? 3 : 1);
        for (int64_t i = 0; i < shapes[si][0]; i++)
          for (int64_t j = 0; j < shapes[si][1]; j++) assert_int_equal(count[i][j], copies);
      }
  /* errors */
  int c[2] = {1, 3};
  int64_t off, len;
  assert_int_equal(dt_placements_box(1, &rows, 2, mesh, nest, c, &off, &len), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "dt_placements_box: coords[1]=3"));
  c[1] = 0;
  dt_placement_t bad[2] = {dt_shard(1), dt_replicate()};
  assert_int_equal(dt_placements_box(1, &rows, 2, mesh, bad, c, &off, &len), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "dt_placements_box: "));
  assert_non_null(strstr(dt_last_error(), "Shard dim 1"));
  assert_int_equal(dt_placements_box(1, &rows, 0, mesh, nest, c, &off, &len), DT_ERR_INVALID_ARG);
  const int zero[2] = {2, 0};
  assert_int_equal(dt_placements_box(1, &rows, 2, zero, nest, c, &off, &len), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "mesh_shape[1]=0"));
}

static void test_dtypes_and_status(void** state) {
  (void)state;
  const char* names[] = {"f32", "bf16", "f16", "i32", "i64"};
  const size_t sizes[] = {4, 2, 2, 4, 8};
  for (int d = 0; d < DT_DTYPE_COUNT; d++) {
    size_t s = 0;
    assert_int_equal(dt_dtype_itemsize((dt_dtype_t)d, &s), DT_SUCCESS);
    assert_int_equal(s, sizes[d]);
    assert_string_equal(dt_dtype_name((dt_dtype_t)d), names[d]);
    dt_dtype_t back;
    assert_int_equal(dt_dtype_parse(names[d], &back), DT_SUCCESS);
    assert_int_equal(back, d);
  }
  size_t s = 1;
  assert_int_equal(dt_dtype_itemsize((dt_dtype_t)99, &s), DT_ERR_INVALID_ARG);
  assert_int_equal(s, 0);
  assert_string_equal(dt_dtype_name((dt_dtype_t)-1), "invalid");
  dt_dtype_t d;
  assert_int_equal(dt_dtype_parse("f64", &d), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "f64"));
  for (int st = 0; st < DT_STATUS_COUNT; st++) {
    assert_true(strncmp(dt_status_name((dt_status_t)st), "DT_", 3) == 0);
    assert_true(strlen(dt_status_string((dt_status_t)st)) > 3);
  }
  assert_string_equal(dt_status_name(DT_ERR_INVALID_ARG), "DT_ERR_INVALID_ARG");
  assert_string_equal(dt_status_name((dt_status_t)999), "DT_UNKNOWN_STATUS");
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", DT_VERSION_MAJOR, DT_VERSION_MINOR, DT_VERSION_PATCH);
  assert_string_equal(dt_version(), v);
  dt_clear_error();
  assert_string_equal(dt_last_error(), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_rule),   cmocka_unit_test(test_parse_valid),
      cmocka_unit_test(test_parse_malformed), cmocka_unit_test(test_parse_lists),
      cmocka_unit_test(test_normalize),    cmocka_unit_test(test_dtypes_and_status),
      cmocka_unit_test(test_placements_box), cmocka_unit_test(test_encode),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

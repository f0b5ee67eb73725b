/* test_nn_plan.c - the parameter-plan matcher (dt_nn_plan_lookup, what dt_nn_param places by):
 * '*' wildcards, first match wins, one placement for every mesh dim, errors with messages, and a
 * pattern of many stars against a long name finishing at once (the old recursive matcher was
 * exponential in the number of stars). Pure: no MPI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"

/* The placements of `name` under `plan` on a mesh of `nd` dims, as "S(0),R". */
static const char* lookup(const char* plan, const char* name, int nd) {
  static char buf[128];
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  assert_int_equal(dt_nn_plan_lookup(plan, name, nd, pl), DT_SUCCESS);
  assert_int_equal(dt_placements_format(pl, nd, ",", buf, sizeof buf), DT_SUCCESS);
  return buf;
}

static void expect_error(const char* plan, const char* name, int nd, const char* needle) {
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  assert_int_equal(dt_nn_plan_lookup(plan, name, nd, pl), DT_ERR_INVALID_ARG);
  if (strstr(dt_last_error(), needle) == NULL)
    fail_msg("message '%s' lacks '%s'", dt_last_error(), needle);
}

static void test_matching(void** state) {
  (void)state;
  const char* plan = "*.wq=S(0);*.wk=S(0);*.wo=S(1);output=S(0);tok_emb=S(1);*.router=R";
  assert_string_equal(lookup(plan, "layers.0.attn.wq", 1), "S(0)");
  assert_string_equal(lookup(plan, "layers.11.attn.wo", 2), "S(1),S(1)");
  assert_string_equal(lookup(plan, "output", 1), "S(0)");
  assert_string_equal(lookup(plan, "output.bias", 1), "R"); /* the whole name must match */
  assert_string_equal(lookup(plan, "norm", 2), "R,R");       /* no match: replicated */
  assert_string_equal(lookup(NULL, "norm", 3), "R,R,R");
  assert_string_equal(lookup("", "norm", 1), "R");
  assert_string_equal(lookup(";;*=P", "x", 1), "P(sum)");    /* empty entries skipped */
  assert_string_equal(lookup("a*=S0;*=R", "abc", 1), "S(0)"); /* first match wins */
  assert_string_equal(lookup("*=R;a*=S0", "abc", 1), "R");
  assert_string_equal(lookup("w=S0,R", "w", 2), "S(0),R");
  assert_string_equal(lookup("  *.w1  =S(0)", "l.w1", 1), "S(0)"); /* spaces around the pattern */
  /* wildcard semantics */
  const struct {
    const char* pat;
    const char* name;
    int match;
  } g[] = {
      {"*", "", 1},          {"*", "abc", 1},       {"", "", 1},           {"", "a", 0},
      {"a", "", 0},          {"**", "x", 1},        {"a*b*c", "abc", 1},   {"a*b*c", "aXbYc", 1},
      {"a*b*c", "acb", 0},   {"*b", "aaab", 1},     {"*b", "aaba", 0},     {"a*", "a", 1},
      {"*a*a*", "aa", 1},    {"*a*a*", "a", 0},     {"*ab", "aab", 1},     {"a*ab", "aab", 1},
      {"*.w?", "l.w?", 1},   {"*.w1", "l.w2", 0},   {"x*y*z*", "xyz", 1},  {"*x*", "yyy", 0},
  };
  for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
    char plan1[64];
    snprintf(plan1, sizeof plan1, "%s=S(0)", g[k].pat);
    const char* got = lookup(plan1, g[k].name, 1);
    if ((strcmp(got, "S(0)") == 0) != g[k].match)
      fail_msg("pattern '%s' vs '%s': expected %s", g[k].pat, g[k].name,
               g[k].match ? "a match" : "no match");
  }
}

/* 60 stars against 4000 characters: exponential matching would never finish. */
static void test_many_stars(void** state) {
  (void)state;
  char plan[128];
  memset(plan, '*', 60);
  snprintf(plan + 60, sizeof plan - 60, "b=S(0)");
  char* name = malloc(4001);
  assert_non_null(name);
  memset(name, 'a', 4000);
  name[4000] = '\0';
  assert_string_equal(lookup(plan, name, 1), "R"); /* no 'b' at the end */
  name[3999] = 'b';
  assert_string_equal(lookup(plan, name, 1), "S(0)");
  /* interleaved stars and letters that almost match everywhere */
  char plan2[200];
  size_t w = 0;
  for (int k = 0; k < 40; k++) {
    plan2[w++] = '*';
    plan2[w++] = 'a';
  }
  snprintf(plan2 + w, sizeof plan2 - w, "c=S(1)");
  name[3999] = 'a';
  assert_string_equal(lookup(plan2, name, 1), "R");
  free(name);
}

static void test_errors(void** state) {
  (void)state;
  expect_error("*.wq", "l.wq", 1, "not pattern=placements");
  expect_error("x=S0;*.wq", "l.wq", 1, "not pattern=placements");
  expect_error("*=S(9)", "w", 1, "S(9)");
  expect_error("*=Q", "w", 1, "'*=Q' for 'w'");
  expect_error("*=S0,R,R", "w", 2, "more than 2");
  expect_error("*=S0,R", "w", 3, "has 2 placements, mesh has 3");
  char longp[400];
  memset(longp, 'x', 300);
  snprintf(longp + 300, sizeof longp - 300, "=R");
  expect_error(longp, "w", 1, "longer than 255");
  expect_error("*=R", "w", 0, "mesh_ndim");
  expect_error("*=R", "w", 5, "mesh_ndim");
  expect_error("*=R", NULL, 1, "name");
  assert_int_equal(dt_nn_plan_lookup("*=R", "w", 1, NULL), DT_ERR_INVALID_ARG);
  /* a bad entry after the match is not read */
  assert_string_equal(lookup("w=S0;garbage", "w", 1), "S(0)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matching),
      cmocka_unit_test(test_many_stars),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_timeout_unit.c - the deadline's settings without MPI: strict parsing of DTENSOR_TIMEOUT_S,
 * dt_set_timeout / dt_get_timeout, dt_init refusing a bad value before it starts MPI, and the
 * timeout report (message text from the executor's context, handler call and its verdict). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "dtensor/dtensor.h"

static void test_parse(void** state) {
  (void)state;
  static const struct {
    const char* text;
    double v;
  } good[] = {{"600", 600}, {"2.5", 2.5}, {"1e3", 1000}, {" 7", 7}, {"0.001", 0.001},
              {"3 ", 3},    {"+4", 4}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    double v = -1;
    assert_int_equal(dt__timeout_parse(good[i].text, "T", &v), DT_SUCCESS);
    assert_true(v == good[i].v);
  }
  static const char* const bad[] = {"",    "0",   "-1",   "abc", "2s",  "1,5", "nan",
                                    "inf", "-0",  "1e999", "0x",  " ",   "5 x", "-inf"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    double v = 42;
    dt_clear_error();
    assert_int_equal(dt__timeout_parse(bad[i], "DTENSOR_TIMEOUT_S", &v), DT_ERR_INVALID_ARG);
    assert_true(v == 42); /* untouched */
    assert_non_null(strstr(dt_last_error(), "DTENSOR_TIMEOUT_S"));
    assert_non_null(strstr(dt_last_error(), "positive finite number of seconds"));
  }
}

static void test_set_get(void** state) {
  (void)state;
  double v = 0;
  assert_int_equal(dt_get_timeout(&v), DT_SUCCESS);
  assert_true(v == 600); /* the default */
  assert_int_equal(dt_get_timeout(NULL), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_set_timeout(2.5), DT_SUCCESS);
  assert_int_equal(dt_get_timeout(&v), DT_SUCCESS);
  assert_true(v == 2.5);
  const double bad[] = {0, -1, NAN, INFINITY, -INFINITY, -0.0};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dt_clear_error();
    assert_int_equal(dt_set_timeout(bad[i]), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "positive finite"));
    assert_int_equal(dt_get_timeout(&v), DT_SUCCESS);
    assert_true(v == 2.5); /* unchanged */
  }
  assert_int_equal(dt_set_timeout(600), DT_SUCCESS);
}

static void test_env(void** state) {
  (void)state;
  double v;
  setenv("DTENSOR_TIMEOUT_S", "12.5", 1);
  assert_int_equal(dt__timeout_from_env(), DT_SUCCESS);
  assert_int_equal(dt_get_timeout(&v), DT_SUCCESS);
  assert_true(v == 12.5);
  setenv("DTENSOR_TIMEOUT_S", "", 1); /* empty: as if unset, the value stays */
  assert_int_equal(dt__timeout_from_env(), DT_SUCCESS);
  assert_int_equal(dt_get_timeout(&v), DT_SUCCESS);
  assert_true(v == 12.5);
  /* a bad value fails dt_init with a clear message before MPI is started */
  setenv("DTENSOR_TIMEOUT_S", "10min", 1);
  dt_clear_error();
  assert_int_equal(dt_init(NULL, NULL), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "DTENSOR_TIMEOUT_S = \"10min\""));
  int inited = 1;
  MPI_Initialized(&inited);
  assert_int_equal(inited, 0);
  assert_int_equal(dt_get_timeout(&v), DT_SUCCESS);
  assert_true(v == 12.5);
  unsetenv("DTENSOR_TIMEOUT_S");
  assert_int_equal(dt_set_timeout(600), DT_SUCCESS);
}

typedef struct {
  int calls;
  int verdict;
  char msg[640];
} handler_state_t;

static int handler(const char* message, void* ctx) {
  handler_state_t* h = (handler_state_t*)ctx;
  h->calls++;
  snprintf(h->msg, sizeof h->msg, "%s", message);
  return h->verdict;
}

static void test_report(void** state) {
  (void)state;
  handler_state_t h = {0, DT_TIMEOUT_RETURN, ""};
  assert_int_equal(dt_set_timeout_handler(handler, &h), DT_SUCCESS);
  assert_int_equal(dt_set_timeout(2), DT_SUCCESS);
  /* a merged step on mesh dims 0 and 1, step 2 of 3 */
  dt_placement_t before[3] = {dt_shard(0), dt_shard(1), dt_replicate()};
  dt_placement_t after[3] = {dt_replicate(), dt_replicate(), dt_replicate()};
  dt__comm_what_set(0x3u, 1, 3, 3, before, after);
  dt_status_t st = DT_SUCCESS;
  assert_int_equal(dt__comm_timeout("all_gather", 5, 4, 2.01, &st), 1);
  assert_int_equal(st, DT_ERR_TIMEOUT);
  assert_int_equal(h.calls, 1);
  assert_non_null(strstr(h.msg, "[dtensor rank 5] DT_ERR_TIMEOUT: all_gather (mesh dims 0,1, "
                                "step 2/3 S(0)S(1)->RR) on a communicator of 4 ranks"));
  assert_non_null(strstr(h.msg, "within 2 s"));
  assert_non_null(strstr(dt_last_error(), h.msg)); /* the status carries the same text */
  /* one mesh dim */
  dt__comm_what_set(0x2u, 0, 1, 3, before, after);
  assert_int_equal(dt__comm_timeout("all_reduce", 0, 2, 2.0, &st), 1);
  assert_non_null(strstr(h.msg, "all_reduce (mesh dim 1, step 1/1 S(1)->R) on"));
  /* no context: the collective alone */
  dt__comm_what_clear();
  assert_int_equal(dt__comm_timeout("broadcast", 0, 2, 2.0, &st), 1);
  assert_non_null(strstr(h.msg, "DT_ERR_TIMEOUT: broadcast on a communicator of 2 ranks"));
  /* DT_TIMEOUT_ABORT: the caller must abort (the comm layer then calls MPI_Abort) */
  h.verdict = DT_TIMEOUT_ABORT;
  assert_int_equal(dt__comm_timeout("all_to_all", 0, 2, 2.0, &st), 0);
  assert_int_equal(h.calls, 4);
  /* no handler: abort */
  assert_int_equal(dt_set_timeout_handler(NULL, NULL), DT_SUCCESS);
  assert_int_equal(dt__comm_timeout("all_to_all", 0, 2, 2.0, &st), 0);
  assert_int_equal(h.calls, 4);
  assert_int_equal(dt_set_timeout(600), DT_SUCCESS);
}

int main(void) {
  unsetenv("DTENSOR_TIMEOUT_S");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_set_get),
      cmocka_unit_test(test_env),
      cmocka_unit_test(test_report),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

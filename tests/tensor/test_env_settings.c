/* test_env_settings.c - the library's integer settings from the environment (DTENSOR_POOL_MB,
 * DTENSOR_COMM_MAX_COUNT, DTENSOR_COMM_BOX_MIN_NBYTES, DTENSOR_TAPE_WARN_*), read by one function:
 * a whole decimal in range is taken; unset or empty is the default, silently; anything else
 * (garbage, a number's prefix, out of range, overflow) is the default with one notice naming the
 * variable, its text and what it expects. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "internal/common.h"

/* dt__env_int(name, lo, hi, dflt) with $name = text (NULL: unset), its stderr in `said`. */
static int64_t read_env(const char* text, int64_t lo, int64_t hi, int64_t dflt, char* said,
                        size_t cap) {
  const char* name = "DT_TEST_ENV_SETTING";
  if (text != NULL) assert_int_equal(setenv(name, text, 1), 0);
  else assert_int_equal(unsetenv(name), 0);
  fflush(stderr);
  FILE* f = tmpfile();
  assert_non_null(f);
  int saved = dup(fileno(stderr));
  assert_true(saved >= 0);
  assert_true(dup2(fileno(f), fileno(stderr)) >= 0);
  int64_t v = dt__env_int(name, lo, hi, dflt, "test", "a count, LO to HI");
  fflush(stderr);
  assert_true(dup2(saved, fileno(stderr)) >= 0);
  close(saved);
  rewind(f);
  size_t n = fread(said, 1, cap - 1, f);
  said[n] = '\0';
  fclose(f);
  return v;
}

static void test_taken(void** state) {
  (void)state;
  static const struct {
    const char* text;
    int64_t v;
  } ok[] = {{"0", 0}, {"7", 7}, {"1024", 1024}, {"-3", -3}, {"000012", 12},
            {"9223372036854775807", INT64_MAX}};
  char said[512];
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    assert_true(read_env(ok[i].text, INT64_MIN, INT64_MAX, 99, said, sizeof said) == ok[i].v);
    assert_string_equal(said, ""); /* no notice */
  }
  /* the bounds are inclusive */
  assert_true(read_env("5", 5, 9, 6, said, sizeof said) == 5 && said[0] == '\0');
  assert_true(read_env("9", 5, 9, 6, said, sizeof said) == 9 && said[0] == '\0');
  /* unset or empty: the default, silently */
  assert_true(read_env(NULL, 0, 10, 4, said, sizeof said) == 4 && said[0] == '\0');
  assert_true(read_env("", 0, 10, 4, said, sizeof said) == 4 && said[0] == '\0');
}

static void test_refused(void** state) {
  (void)state;
  /* each the default, with a notice: garbage, a number's prefix, spaces, signs other than a
   * leading '-', hexadecimal, a fraction, out of range on either side, overflow */
  static const char* const bad[] = {"abc", "12abc", "3x", " 3", "3 ", "+3", "--3", "-", "0x10",
                                    "1.5", "1e3", "4", "11", "-1", "99999999999999999999",
                                    "-99999999999999999999"};
  char said[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t v = read_env(bad[i], 5, 10, 7, said, sizeof said);
    if (v != 7) fail_msg("'%s' read as %lld, not the default 7", bad[i], (long long)v);
    char want[128];
    snprintf(want, sizeof want, "ignoring DT_TEST_ENV_SETTING=%s: expected a count, LO to HI",
             bad[i]);
    if (strstr(said, want) == NULL) fail_msg("'%s': notice '%s' lacks '%s'", bad[i], said, want);
    if (strchr(said, '\n') != strrchr(said, '\n')) fail_msg("'%s': more than one line: %s", bad[i], said);
  }
  /* a very long value is cut in the notice, not in the reading */
  char big[300];
  memset(big, '1', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  assert_true(read_env(big, 0, 10, 3, said, sizeof said) == 3);
  assert_true(strlen(said) < 200);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_taken), cmocka_unit_test(test_refused)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

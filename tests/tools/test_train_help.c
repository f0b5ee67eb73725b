/* test_train_help.c - the trainer's --help (examples/train_config.c): every documented key is
 * one the option parser knows, an undocumented key is refused, the switches are the ten flags
 * without a value, and the help text lists every flag (with '-' for '_') and every JSON key with
 * a default, the default plan, and no line over 99 columns. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "train_config.h"

#define PLAN "*.wq=S(0);*.wo=S(1);tok_emb=S(1)"

static void test_keys_known(void** state) {
  (void)state;
  int n = 0, nswitch = 0, sw = -1;
  for (const char* key; (key = train_opts_key(n, &sw)) != NULL; n++) {
    train_opts_t o;
    train_opts_defaults(&o, PLAN);
    char err[256] = "";
    /* "1" is valid for most keys; a refusal must be about the value, not the key */
    if (!train_opts_set(&o, key, "1", err, sizeof err))
      assert_null(strstr(err, "unknown config key"));
    assert_int_equal(sw, train_opts_is_switch(key));
    if (sw) {
      nswitch++;
      assert_true(train_opts_set(&o, key, "1", err, sizeof err)); /* a switch is 0 or 1 */
      assert_true(train_opts_set(&o, key, "0", err, sizeof err));
    }
  }
  assert_true(n >= 30);
  assert_int_equal(nswitch, 10); /* bf16_moments, sp, loss_parallel, async_tp, checkpoint,
                                  * tie_embeddings, async_checkpoint, resume, estimate_only,
                                  * profile */
  assert_true(train_opts_is_switch("async_tp") && train_opts_is_switch("profile"));
  assert_true(train_opts_is_switch("estimate_only") && !train_opts_is_switch("np"));
  assert_true(train_opts_is_switch("resume") && train_opts_is_switch("async_checkpoint"));
  assert_true(train_opts_is_switch("checkpoint") && train_opts_is_switch("loss_parallel"));
  assert_false(train_opts_is_switch("steps") || train_opts_is_switch(NULL) ||
               train_opts_is_switch("config"));
  assert_null(train_opts_key(n, NULL));
  assert_null(train_opts_key(-1, NULL));
}

static void test_undocumented_refused(void** state) {
  (void)state;
  train_opts_t o;
  train_opts_defaults(&o, PLAN);
  char err[256] = "";
  assert_false(train_opts_set(&o, "no_such_key", "1", err, sizeof err));
  assert_non_null(strstr(err, "unknown config key"));
  assert_false(train_opts_load_json(&o, "{\"stepz\": 3}", 12, err, sizeof err));
  assert_non_null(strstr(err, "did you mean 'steps'?"));
}

/* A typo names the key meant: one edit (two for longer keys), a swap, or a unique prefix. */
static void test_suggest(void** state) {
  (void)state;
  assert_string_equal(train_opts_suggest("stesp"), "steps");       /* a swap */
  assert_string_equal(train_opts_suggest("step"), "steps");        /* a missing letter */
  assert_string_equal(train_opts_suggest("kv_head"), "kv_heads");
  assert_string_equal(train_opts_suggest("micro_batch"), "micro_batches");
  assert_string_equal(train_opts_suggest("reshard"), "reshard_after_forward"); /* a prefix */
  assert_null(train_opts_suggest("zzzzzz"));
  assert_null(train_opts_suggest(""));
  assert_null(train_opts_suggest(NULL));
  assert_null(train_opts_suggest("qq")); /* short keys: one edit at most */
  char big[200];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  assert_null(train_opts_suggest(big));
  train_opts_t o;
  train_opts_defaults(&o, PLAN);
  char err[256] = "";
  assert_false(train_opts_set(&o, "lerning_rate", "1", err, sizeof err)); /* nothing near */
  assert_null(strstr(err, "did you mean"));
  assert_false(train_opts_set(&o, "hedas", "1", err, sizeof err));
  assert_non_null(strstr(err, "(did you mean 'heads'?)"));
}

static void test_help_text(void** state) {
  (void)state;
  char* text = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  assert_non_null(f);
  train_opts_help(f, PLAN);
  assert_int_equal(fclose(f), 0);
  assert_non_null(strstr(text, "usage:"));
  assert_non_null(strstr(text, "--config FILE.json"));
  assert_non_null(strstr(text, "--help"));
  assert_non_null(strstr(text, "JSON config"));
  assert_non_null(strstr(text, "*.wq=S(0);*.wo=S(1);tok_emb=S(1)")); /* the default plan */
  assert_non_null(strstr(text, "--steps N"));
  assert_non_null(strstr(text, "(default: 1000)"));  /* the defaults' values */
  assert_non_null(strstr(text, "(default: 0.01)"));
  int ndefault = 0;
  for (const char* p = text; (p = strstr(p, "(default:")) != NULL; p++) ndefault++;
  int n = 0;
  for (const char* key; (key = train_opts_key(n, NULL)) != NULL; n++) {
    char flag[80], json[80];
    snprintf(flag, sizeof flag, "  --%s", key);
    for (char* c = flag; *c; c++)
      if (*c == '_') *c = '-';
    snprintf(json, sizeof json, " %s,", key);
    assert_non_null(strstr(text, flag));
    if (train_opts_key(n + 1, NULL) != NULL) assert_non_null(strstr(text, json));
  }
  assert_int_equal(ndefault, n); /* one default per option */
  for (const char *p = text, *e; *p; p = e + 1) {
    e = strchr(p, '\n');
    assert_non_null(e);
    assert_true(e - p <= 99);
  }
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keys_known),
      cmocka_unit_test(test_undocumented_refused),
      cmocka_unit_test(test_suggest),
      cmocka_unit_test(test_help_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

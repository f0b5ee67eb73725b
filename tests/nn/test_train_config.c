/* test_train_config.c - the trainer's option parser (examples/train_config.c): JSON configs and
 * flag values are checked (a non-object root, trailing data, duplicate keys, nested values,
 * numbers that are not integers or overflow, out-of-range values, over-long strings, shell
 * characters in paths, unknown names for model, parallel and param_dtype, the FSDP/DDP knobs out
 * of range) with a message each, and valid configs set exactly what they say (the
 * tie_embeddings switch too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "train_config.h"

static int load(train_opts_t* o, const char* text, char* err, size_t cap) {
  train_opts_defaults(o, "*=R");
  err[0] = '\0';
  return train_opts_load_json(o, text, strlen(text), err, cap);
}

static void test_valid(void** state) {
  (void)state;
  train_opts_t o;
  char err[256];
  assert_true(load(&o,
                   "{\"steps\": 4, \"batch\": 4, \"seq\": 16, \"dim\": 32, \"layers\": 1,"
                   " \"heads\": 4, \"data\": \"README.md\", \"lr\": 0.003, \"mesh\": \"2x2\","
                   " \"model\": \"moe\", \"bf16_moments\": true, \"seed\": -7, \"clip\": 0}\n",
                   err, sizeof err));
  assert_int_equal(o.steps, 4);
  assert_int_equal(o.seq, 16);
  assert_int_equal(o.layers, 1);
  assert_string_equal(o.data, "README.md");
  assert_string_equal(o.mesh, "2x2");
  assert_string_equal(o.model, "moe");
  assert_true(o.lr == 0.003 && o.clip == 0.0);
  assert_int_equal(o.bf16_moments, 1);
  assert_int_equal(o.seed, -7);
  assert_int_equal(o.vocab, 16); /* untouched keys keep their defaults */
  assert_string_equal(o.plan, "*=R");
  /* strings for numbers, as flags give them */
  assert_true(load(&o, "{\"steps\": \"12\", \"lr\": \"1e-3\"}", err, sizeof err));
  assert_int_equal(o.steps, 12);
  assert_true(train_opts_set(&o, "kv_heads", "2", err, sizeof err));
  assert_int_equal(o.kv_heads, 2);
  /* the real-valued keys through their one table: every form a decimal takes, and the bounds */
  assert_true(train_opts_set(&o, "lr", ".5", err, sizeof err) && o.lr == 0.5);
  assert_true(train_opts_set(&o, "clip", "1E2", err, sizeof err) && o.clip == 100.0);
  assert_true(train_opts_set(&o, "bucket_mb", "1e6", err, sizeof err) && o.bucket_mb == 1e6);
  assert_true(train_opts_set(&o, "capacity_factor", "0", err, sizeof err) &&
              o.capacity_factor == 0.0);
  assert_true(train_opts_set(&o, "routing_imbalance", "1", err, sizeof err) &&
              o.routing_imbalance == 1.0);
  assert_true(train_opts_set(&o, "layers", "4096", err, sizeof err) && o.layers == 4096);
  assert_true(train_opts_set(&o, "np", "1048576", err, sizeof err) && o.np == 1048576);
  assert_true(train_opts_set(&o, "seed", "-0", err, sizeof err) && o.seed == 0);
  int shape[4], nd;
  assert_true(train_mesh_parse("2x1x3", shape, &nd) && nd == 3 && shape[2] == 3);
  /* tied embeddings: off by default, a switch (--tie-embeddings) and a JSON boolean */
  assert_true(load(&o, "{}", err, sizeof err));
  assert_int_equal(o.tie_embeddings, 0);
  assert_true(train_opts_is_switch("tie_embeddings"));
  assert_true(train_opts_set(&o, "tie_embeddings", "1", err, sizeof err));
  assert_int_equal(o.tie_embeddings, 1);
  assert_true(load(&o, "{\"tie_embeddings\": true, \"model\": \"moe\"}", err, sizeof err));
  assert_int_equal(o.tie_embeddings, 1);
  assert_false(load(&o, "{\"tie_embeddings\": 2}", err, sizeof err));
  assert_non_null(strstr(err, "tie_embeddings must be an integer in [0, 1]"));
  /* 0/1 and false/true only (dt_llama_config_check refuses the rest too): the value named */
  assert_true(load(&o, "{\"tie_embeddings\": false}", err, sizeof err) && o.tie_embeddings == 0);
  assert_true(load(&o, "{\"tie_embeddings\": 1}", err, sizeof err) && o.tie_embeddings == 1);
  assert_true(load(&o, "{\"tie_embeddings\": 0}", err, sizeof err) && o.tie_embeddings == 0);
  const char* const bad_switch[][2] = {{"{\"tie_embeddings\": -1}", "got '-1'"},
                                       {"{\"tie_embeddings\": 0.5}", "got '0.5'"},
                                       {"{\"tie_embeddings\": \"yes\"}", "got 'yes'"},
                                       {"{\"tie_embeddings\": \"true\"}", "got 'true'"}};
  for (size_t i = 0; i < sizeof bad_switch / sizeof bad_switch[0]; i++) {
    assert_false(load(&o, bad_switch[i][0], err, sizeof err));
    assert_non_null(strstr(err, "tie_embeddings must be an integer in [0, 1]"));
    assert_non_null(strstr(err, bad_switch[i][1]));
  }
  assert_false(train_opts_set(&o, "tie_embeddings", "2", err, sizeof err)); /* --tie-embeddings=2 */
  assert_non_null(strstr(err, "tie_embeddings must be an integer in [0, 1], got '2'"));
  /* true / false for the 0/1 switches only: "steps": true is a mistake, not 1 */
  const char* const not_bool[][2] = {{"{\"steps\": true}", "'steps' takes an integer"},
                                     {"{\"seed\": false}", "'seed' takes an integer"},
                                     {"{\"lr\": true}", "'lr' takes a number"},
                                     {"{\"mesh\": true}", "'mesh' takes a string"},
                                     {"{\"metrics\": false}", "'metrics' takes a string"}};
  for (size_t i = 0; i < sizeof not_bool / sizeof not_bool[0]; i++) {
    assert_false(load(&o, not_bool[i][0], err, sizeof err));
    assert_non_null(strstr(err, not_bool[i][1]));
  }
  /* reshard_after_forward takes FSDP2's bool too: true is ZeRO-3 (1), false ZeRO-2 (0) */
  assert_true(load(&o, "{\"reshard_after_forward\": false}", err, sizeof err));
  assert_int_equal(o.reshard_after_forward, 0);
  assert_true(load(&o, "{\"reshard_after_forward\": true}", err, sizeof err));
  assert_int_equal(o.reshard_after_forward, 1);
  assert_false(load(&o, "{\"stepz\": true}", err, sizeof err)); /* unknown: named as such */
  assert_non_null(strstr(err, "stepz"));
}

/* The data-parallel keys: defaults, every accepted name, and the FSDP/DDP knobs. */
static void test_parallel(void** state) {
  (void)state;
  train_opts_t o;
  char err[256];
  assert_true(load(&o, "{}", err, sizeof err));
  assert_string_equal(o.parallel, "none");
  assert_string_equal(o.param_dtype, ""); /* unset: f32 on the cpu, bf16 on a cuda device */
  assert_string_equal(o.device, "cpu");
  assert_int_equal(o.reshard_after_forward, 1);
  assert_int_equal(o.prefetch, 1);
  assert_true(o.bucket_mb == 25.0);
  assert_true(load(&o,
                   "{\"parallel\": \"fsdp\", \"reshard_after_forward\": 0, \"param_dtype\": \"bf16\","
                   " \"prefetch\": false, \"bucket_mb\": 0.5}",
                   err, sizeof err));
  assert_string_equal(o.parallel, "fsdp");
  assert_int_equal(o.reshard_after_forward, 0);
  assert_string_equal(o.param_dtype, "bf16");
  assert_int_equal(o.prefetch, 0);
  assert_true(o.bucket_mb == 0.5);
  assert_true(load(&o, "{\"parallel\": \"hsdp\", \"mesh\": \"2x2\", \"reshard_after_forward\": 4}",
                   err, sizeof err));
  assert_string_equal(o.parallel, "hsdp");
  assert_int_equal(o.reshard_after_forward, 4);
  /* as flags give them (--parallel ddp --bucket-mb 1e-3 --prefetch 1) */
  assert_true(train_opts_set(&o, "parallel", "ddp", err, sizeof err));
  assert_string_equal(o.parallel, "ddp");
  assert_true(train_opts_set(&o, "bucket_mb", "1e-3", err, sizeof err));
  assert_true(o.bucket_mb == 1e-3);
  /* the MoE capacity factor: 0 (dropless) by default */
  assert_true(o.capacity_factor == 0.0);
  assert_true(train_opts_set(&o, "capacity_factor", "1.25", err, sizeof err));
  assert_true(o.capacity_factor == 1.25);
  assert_true(train_opts_set(&o, "prefetch", "1", err, sizeof err));
  assert_true(train_opts_set(&o, "parallel", "none", err, sizeof err));
  assert_true(train_opts_set(&o, "param_dtype", "f32", err, sizeof err));
  assert_string_equal(o.param_dtype, "f32");
  /* devices */
  assert_true(load(&o, "{\"device\": \"cuda\"}", err, sizeof err));
  assert_string_equal(o.device, "cuda");
  assert_true(train_opts_set(&o, "device", "cuda-emu", err, sizeof err));
  assert_string_equal(o.device, "cuda-emu");
  assert_false(train_opts_set(&o, "device", "gpu", err, sizeof err));
  assert_non_null(strstr(err, "device must be cpu, cuda or cuda-emu"));
  assert_string_equal(o.device, "cuda-emu");
}

static void test_refused(void** state) {
  (void)state;
  const struct {
    const char* text;
    const char* needle;
  } bad[] = {
      {"", "not a JSON object"},
      {"[1, 2, 3]", "not a JSON object"}, /* used to crash: array items have no key */
      {"\"steps\"", "not a JSON object"},
      {"{\"steps\": 4} {\"steps\": 5}", "trailing data"},
      {"{\"steps\": 4}]", "trailing data"},
      {"{\"steps\": 4, \"steps\": 5}", "appears twice"},
      {"{\"stepz\": 3}", "unknown config key 'stepz'"},
      {"{\"steps\": {\"n\": 4}}", "string, number or boolean"},
      {"{\"steps\": [4]}", "string, number or boolean"},
      {"{\"steps\": null}", "string, number or boolean"},
      {"{\"steps\": 2.5}", "steps must be an integer"},
      {"{\"steps\": 1e300}", "steps must be an integer"},
      {"{\"batch\": 0}", "batch must be an integer in [1,"},
      {"{\"dim\": -3}", "dim must be an integer"},
      {"{\"heads\": \"four\"}", "heads must be an integer"},
      {"{\"seq\": \"16abc\"}", "seq must be an integer"},
      {"{\"seed\": \"99999999999999999999\"}", "seed must be an integer"},
      {"{\"lr\": \"fast\"}", "lr must be a number"},
      {"{\"lr\": -1}", "lr must be a number"},
      {"{\"clip\": 1e400}", "clip must be a number"},
      {"{\"model\": \"sparse\"}", "model must be dense or moe"},
      {"{\"mesh\": \"2x\"}", "mesh '2x'"},
      {"{\"mesh\": \"0\"}", "mesh '0'"},
      {"{\"mesh\": \"2x2x2x2x2\"}", "mesh '2x2x2x2x2'"},
      {"{\"data\": \"\"}", "data must be"},
      {"{\"plot\": \"a'; rm -rf x; '.png\"}", "plot path"},
      {"{\"metrics\": \"$HOME/m.jsonl\"}", "metrics path"},
      {"{\"bf16_moments\": 2}", "bf16_moments must be an integer in [0, 1]"},
      {"{\"parallel\": \"zero3\"}", "parallel must be none, ddp, fsdp or hsdp, got 'zero3'"},
      {"{\"parallel\": \"FSDP\"}", "parallel must be none, ddp, fsdp or hsdp"},
      {"{\"parallel\": \"\"}", "parallel must be none, ddp, fsdp or hsdp"},
      {"{\"parallel\": \"fsdp-with-a-very-long-tail\"}", "parallel must be none, ddp, fsdp"},
      {"{\"parallel\": 1}", "parallel must be none, ddp, fsdp or hsdp, got '1'"},
      {"{\"param_dtype\": \"f16\"}", "param_dtype must be f32 or bf16, got 'f16'"},
      {"{\"param_dtype\": true}", "'param_dtype' takes a string, not true or false"},
      {"{\"reshard_after_forward\": -1}", "reshard_after_forward must be an integer in [0,"},
      {"{\"reshard_after_forward\": 1.5}", "reshard_after_forward must be an integer"},
      {"{\"reshard_after_forward\": \"yes\"}", "reshard_after_forward must be an integer"},
      {"{\"prefetch\": 2}", "prefetch must be an integer in [0, 1]"},
      {"{\"bucket_mb\": 0}", "bucket_mb must be a number in (0, 1e6]"},
      {"{\"bucket_mb\": -25}", "bucket_mb must be a number"},
      {"{\"bucket_mb\": \"25MB\"}", "bucket_mb must be a number"},
      {"{\"bucket_mb\": \"nan\"}", "bucket_mb must be a number"},
      {"{\"bucket_mb\": 1e7}", "bucket_mb must be a number"},
      {"{\"capacity_factor\": -0.5}", "capacity_factor must be a number in [0, 1e3]"},
      {"{\"capacity_factor\": \"big\"}", "capacity_factor must be a number"},
      {"{\"capacity_factor\": 1e4}", "capacity_factor must be a number"},
      /* numbers are plain decimals: no spaces, '+', hexadecimal floats, inf or nan */
      {"{\"seq\": \" 3\"}", "seq must be an integer"},
      {"{\"seq\": \"+3\"}", "seq must be an integer"},
      {"{\"seq\": \"-\"}", "seq must be an integer"},
      {"{\"seed\": \"0x10\"}", "seed must be an integer"},
      {"{\"lr\": \" 0.1\"}", "lr must be a number in [0, 1e6]"},
      {"{\"lr\": \"+0.1\"}", "lr must be a number"},
      {"{\"lr\": \"0x1p-3\"}", "lr must be a number"},
      {"{\"lr\": \"1e-400x\"}", "lr must be a number"},
      {"{\"clip\": \"inf\"}", "clip must be a number"},
      {"{\"clip\": \".\"}", "clip must be a number"},
      {"{\"routing_imbalance\": 0.5}", "routing_imbalance must be a number in [1, 1e3]"},
      /* sizes the estimator would take minutes or all memory over */
      {"{\"layers\": 4097}", "layers must be an integer in [1, 4096]"},
      {"{\"np\": 1048577}", "np must be an integer in [1, 1048576]"},
      {"{\"estimate_rank\": 1048576}", "estimate_rank must be an integer in [0, 1048575]"},
      {"{\"parallel\": \"fsdp\", \"parallel\": \"ddp\"}", "appears twice"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    train_opts_t o;
    char err[256];
    if (load(&o, bad[k].text, err, sizeof err)) fail_msg("accepted: %s", bad[k].text);
    if (strstr(err, bad[k].needle) == NULL)
      fail_msg("%s: message '%s' lacks '%s'", bad[k].text, err, bad[k].needle);
  }
  /* a string longer than its option's buffer (plan: 1023 characters) */
  char* big = malloc(1200);
  assert_non_null(big);
  strcpy(big, "{\"plan\": \"");
  memset(big + 10, '*', 1100);
  strcpy(big + 1110, "\"}");
  train_opts_t o;
  char err[256];
  assert_false(load(&o, big, err, sizeof err));
  assert_non_null(strstr(err, "value too long"));
  big[10 + 1030] = '\0';
  assert_false(train_opts_set(&o, "plan", big + 10, err, sizeof err));
  assert_non_null(strstr(err, "plan is longer than 1023"));
  free(big);
  /* a NUL inside the text */
  assert_false(train_opts_load_json(&o, "{}\0{}", 5, err, sizeof err));
  assert_non_null(strstr(err, "NUL"));
  assert_false(train_opts_set(&o, "frobnicate", "3", err, sizeof err));
  assert_non_null(strstr(err, "unknown config key 'frobnicate'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_parallel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

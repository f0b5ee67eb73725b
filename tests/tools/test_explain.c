#define _POSIX_C_SOURCE 200809L
/* test_explain.c - runs the dtensor-explain binary (path in argv[1]) and checks its output:
 * --json prints exactly one object with the documented keys whose steps, counts and cost agree
 * with dt_plan_create on the same input; bad input prints {"error": ...} and exits non-zero. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cJSON.h>
#include <cmocka.h>

#include "dtensor/dtensor.h"

static const char* g_exe;

/* Runs the explain binary with args; returns its stdout (malloc'd) and exit status. */
static char* run(const char* args, int* status) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", g_exe, args);
  FILE* p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, n = 0;
  char* out = malloc(cap);
  size_t got;
  while ((got = fread(out + n, 1, cap - 1 - n, p)) > 0) n += got;
  out[n] = '\0';
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

static void check_json_plan(const char* mesh_arg, const int* mesh, int m, const char* shape_arg,
                            const int64_t* shape, int nd, const char* from, const char* to,
                            const char* extra) {
  char args[512];
  snprintf(args, sizeof args, "redistribute --mesh %s --shape %s --dtype f32 --from '%s' --to '%s' %s --json",
           mesh_arg, shape_arg, from, to, extra);
  int status;
  char* out = run(args, &status);
  assert_int_equal(status, 0);
  /* exactly one line, one object */
  char* nl = strchr(out, '\n');
  assert_non_null(nl);
  assert_int_equal(nl[1], '\0');
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  const char* keys[] = {"mesh", "shape", "dtype", "from", "to", "steps", "counts", "cost_us"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
    assert_non_null(cJSON_GetObjectItemCaseSensitive(o, keys[k]));
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "mesh")), m);
  assert_string_equal(cJSON_GetObjectItem(o, "dtype")->valuestring, "f32");

  dt_mesh_t mh;
  assert_int_equal(dt_mesh_create_abstract(m, mesh, NULL, &mh), DT_SUCCESS);
  if (strstr(extra, "--flatten")) {
    int dims[4] = {0, 1, 2, 3};
    assert_int_equal(dt_mesh_flatten(mh, m, dims, NULL, NULL), DT_SUCCESS);
  }
  dt_placement_t s[4], d[4];
  int n;
  assert_int_equal(dt_placements_parse(from, s, 4, &n), DT_SUCCESS);
  assert_int_equal(dt_placements_parse(to, d, 4, &n), DT_SUCCESS);
  dt_plan_t plan;
  assert_int_equal(dt_plan_create(mh, DT_F32, nd, shape, s, d, &plan), DT_SUCCESS);
  int nsteps;
  dt_plan_num_steps(plan, &nsteps);
  cJSON* steps = cJSON_GetObjectItem(o, "steps");
  assert_int_equal(cJSON_GetArraySize(steps), nsteps);
  for (int k = 0; k < nsteps; k++) {
    dt_plan_step_t ps;
    dt_plan_get_step(plan, k, &ps);
    cJSON* j = cJSON_GetArrayItem(steps, k);
    assert_string_equal(cJSON_GetObjectItem(j, "collective")->valuestring,
                        dt_collective_name(ps.coll));
    cJSON* md = cJSON_GetObjectItem(j, "mesh_dim");
    if (ps.n_mesh_dims == 1) assert_int_equal(md->valueint, ps.mesh_dims[0]);
    else assert_int_equal(cJSON_GetArraySize(md), ps.n_mesh_dims);
    assert_true(fabs(cJSON_GetObjectItem(j, "bytes")->valuedouble - (double)ps.nbytes) < 0.5);
    assert_true(fabs(cJSON_GetObjectItem(j, "cost_us")->valuedouble - ps.cost_us) < 1e-6);
    char fb[64];
    dt_placements_format(ps.from, ps.n_mesh_dims, NULL, fb, sizeof fb);
    assert_string_equal(cJSON_GetObjectItem(j, "from")->valuestring, fb);
  }
  cJSON* counts = cJSON_GetObjectItem(o, "counts");
  const dt_collective_t cs[4] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_REDUCE, DT_COLL_REDUCE_SCATTER,
                                 DT_COLL_ALL_TO_ALL};
  for (int c = 0; c < 4; c++) {
    int want;
    dt_plan_count(plan, cs[c], &want);
    assert_int_equal(cJSON_GetObjectItem(counts, dt_collective_name(cs[c]))->valueint, want);
  }
  double cost;
  dt_plan_cost(plan, &cost);
  assert_true(fabs(cJSON_GetObjectItem(o, "cost_us")->valuedouble - cost) < 1e-6);
  dt_plan_destroy(plan);
  dt_mesh_destroy(mh);
  cJSON_Delete(o);
  free(out);
}

static void test_json_plans(void** state) {
  (void)state;
  int m22[2] = {2, 2}, m222[3] = {2, 2, 2}, m4[1] = {4};
  int64_t s888[3] = {8, 8, 8}, s133[2] = {13, 3};
  check_json_plan("2x2", m22, 2, "8x8x8", s888, 3, "S0,S1", "S1,S0", "");
  check_json_plan("2x2", m22, 2, "8x8x8", s888, 3, "P,P", "R,R", "--flatten 0,1");
  check_json_plan("2x2x2", m222, 3, "8x8x8", s888, 3, "S0,S1,S2", "S2,S0,S1", "");
  check_json_plan("4", m4, 1, "13x3", s133, 2, "S(-1)", "R", "");
  check_json_plan("4", m4, 1, "13x3", s133, 2, "R", "P(max)", "");
  check_json_plan("4", m4, 1, "13x3", s133, 2, "R", "R", "");
}

static void test_example_json_shape(void** state) {
  (void)state;
  int status;
  char* out = run("redistribute --mesh 2x2 --shape 8x8x8 --dtype f32 --from S0,S1 --to S1,S0 --json",
                  &status);
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  cJSON* f = cJSON_GetObjectItem(o, "from");
  assert_string_equal(cJSON_GetArrayItem(f, 0)->valuestring, "S(0)");
  assert_string_equal(cJSON_GetArrayItem(f, 1)->valuestring, "S(1)");
  cJSON* sh = cJSON_GetObjectItem(o, "shape");
  assert_int_equal(cJSON_GetArraySize(sh), 3);
  assert_int_equal(cJSON_GetArrayItem(sh, 0)->valueint, 8);
  cJSON_Delete(o);
  free(out);
}

static void test_errors(void** state) {
  (void)state;
  const char* bad[] = {
      "redistribute --mesh 2x2 --shape 8x8 --from S0,S9 --to R,R --json",
      "redistribute --mesh 2x2 --shape 8x8 --from S0 --to R,R --json",
      "redistribute --mesh 2x0 --shape 8x8 --from S0,R --to R,R --json",
      "redistribute --mesh 2x2 --shape 8xx8 --from S0,R --to R,R --json",
      "redistribute --mesh 2x2 --shape 8x8 --from S0,R --to P,R --json",
      "redistribute --mesh 2x2 --shape 8x8 --from 'P(sum),R' --to 'P(max),R' --json",
      "redistribute --mesh 2x2 --shape 8x8 --from S0,R --to R,R --dtype f64 --json",
      "redistribute --mesh 2x2x2x2x2 --shape 8x8 --from S0,R --to R,R --json",
      "redistribute --shape 8x8 --from S0,R --to R,R --json",
      "redistribute --mesh 2x2 --shape 8x8 --from S0,R --to R,R --bogus --json",
      "redistribute --mesh 2x2 --shape 8x8 --from S0,R --to R,R --flatten 1,0 --json",
      "frobnicate --json",
      /* 9 dims: parsed into a local array now, no longer one past the input's shape */
      "op add --mesh 2 --shape 1x1x1x1x1x1x1x1x1 --in R --shape 1 --in R --json",
      "op add --mesh 2 --shape 2 --in R --shape 1x1x1x1x1x1x1x1x1 --in R --json",
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    int status;
    char* out = run(bad[k], &status);
    if (status == 0) fail_msg("accepted bad input: %s", bad[k]);
    cJSON* o = cJSON_Parse(out);
    if (o == NULL) fail_msg("not JSON for %s: %s", bad[k], out);
    cJSON* e = cJSON_GetObjectItem(o, "error");
    assert_true(cJSON_IsString(e) && strlen(e->valuestring) > 5);
    assert_int_equal(cJSON_GetArraySize(o), 1);
    cJSON_Delete(o);
    free(out);
  }
}

static void test_text_output(void** state) {
  (void)state;
  int status;
  char* out = run("redistribute --mesh 2x2 --shape 8x8 --from S0,S1 --to R,R --visualize", &status);
  assert_int_equal(status, 0);
  assert_non_null(strstr(out, "plan: S(0)S(1) -> "));
  assert_non_null(strstr(out, "total cost:"));
  assert_non_null(strstr(out, "coord (1,1): [4:8, 4:8]"));
  free(out);
}

static void test_op_json(void** state) {
  (void)state;
  int status;
  char* out = run("op mm --mesh 2x2 --shape 12x8 --shape 8x4 --in S0,S1 --in S0,S1 --all --json",
                  &status);
  assert_int_equal(status, 0);
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  const char* keys[] = {"op", "mesh", "inputs", "output", "redistribute", "counts", "cost_us",
                        "candidates", "all"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
    assert_non_null(cJSON_GetObjectItemCaseSensitive(o, keys[k]));
  /* agree with the library */
  int ms[2] = {2, 2};
  dt_mesh_t m;
  assert_int_equal(dt_mesh_create_abstract(2, ms, NULL, &m), DT_SUCCESS);
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  c.op = "mm";
  c.n_inputs = 2;
  c.in[0] = (dt_tensor_meta_t){DT_F32, 2, {12, 8}};
  c.in[1] = (dt_tensor_meta_t){DT_F32, 2, {8, 4}};
  dt_placement_t in[2][DT_MAX_MESH_DIMS];
  int n;
  dt_placements_parse("S0,S1", in[0], 4, &n);
  dt_placements_parse("S0,S1", in[1], 4, &n);
  dt_op_choice_t ch;
  assert_int_equal(dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_SUCCESS);
  cJSON* outp = cJSON_GetObjectItem(o, "output");
  char b[32];
  for (int i = 0; i < 2; i++) {
    dt_placement_format(ch.out[0][i], b, sizeof b);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(outp, "placements"), i)->valuestring, b);
  }
  assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(outp, "shape"), 0)->valueint, 12);
  assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(outp, "shape"), 1)->valueint, 4);
  assert_true(fabs(cJSON_GetObjectItem(o, "cost_us")->valuedouble - ch.cost_us) < 1e-6);
  assert_int_equal(cJSON_GetObjectItem(o, "candidates")->valueint, ch.n_candidates);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "all")), ch.n_candidates);
  /* the listed redistribution steps add up to the total cost */
  double sum = 0;
  cJSON* red = cJSON_GetObjectItem(o, "redistribute");
  assert_int_equal(cJSON_GetArraySize(red), 2);
  for (int t = 0; t < 2; t++) {
    cJSON* steps = cJSON_GetObjectItem(cJSON_GetArrayItem(red, t), "steps");
    for (int k = 0; k < cJSON_GetArraySize(steps); k++)
      sum += cJSON_GetObjectItem(cJSON_GetArrayItem(steps, k), "cost_us")->valuedouble;
  }
  assert_true(fabs(sum - ch.cost_us) < 1e-6);
  dt_mesh_destroy(m);
  cJSON_Delete(o);
  free(out);
  const char* bad[] = {
      "op frobnicate --mesh 4 --shape 4x4 --in R --json",
      "op mm --mesh 4 --shape 4x4 --shape 5x4 --in R --in R --json",
      "op mm --mesh 4 --shape 4x4 --in R --json",
      "op mm --mesh 4 --shape 4x4 --shape 4x4 --in R --json",
      "op mm --mesh 2x2 --shape 4x4 --shape 4x4 --in R --in R --json",
      "op mm --mesh 4 --shape 4x4 --shape 4x4 --in R --in R --arg dim=x --json",
      "op sum --mesh 4 --shape 4x4 --in R --arg axis=1 --json",      /* not in the schema */
      "op softmax --mesh 4 --shape 4x4 --in R --json",               /* dim is required */
      "op softmax --mesh 4 --shape 4x4 --in R --arg dim=1 --arg dim=0 --json", /* twice */
      ("op embedding --mesh 2 --shape 8x4 --shape 3 --in R --in R --dtype f32 --dtype i64 "
       "--dtype i64 --json"), /* three dtypes for two inputs */
      "ops no_such_op --json",
      "op --mesh 4 --json",
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    out = run(bad[k], &status);
    if (status == 0) fail_msg("accepted bad input: %s", bad[k]);
    o = cJSON_Parse(out);
    if (o == NULL) fail_msg("not JSON for %s: %s", bad[k], out);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(o, "error")));
    cJSON_Delete(o);
    free(out);
  }
}

/* New op families through the CLI: a view keeps both shards, cat takes several inputs, topk lists
 * both outputs (values f32, indices i64), and a view with a bad size is a JSON error. */
static void test_op_shape_and_multi_output(void** state) {
  (void)state;
  int status;
  char* out = run("op reshape --mesh 2x2 --shape 4x6x8 --in S0,S2 --arg shape=24,8 --json",
                  &status);
  assert_int_equal(status, 0);
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  cJSON* op = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "placements");
  assert_string_equal(cJSON_GetArrayItem(op, 0)->valuestring, "S(0)");
  assert_string_equal(cJSON_GetArrayItem(op, 1)->valuestring, "S(1)");
  assert_int_equal((int)cJSON_GetObjectItem(o, "cost_us")->valuedouble, 0);
  cJSON_Delete(o);
  free(out);

  out = run("op cat --mesh 4 --shape 8x3 --in S0 --shape 8x5 --in S0 --arg dim=1 --json", &status);
  assert_int_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(o);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "inputs")), 2);
  cJSON* shp = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "shape");
  assert_int_equal(cJSON_GetArrayItem(shp, 1)->valueint, 8);
  cJSON_Delete(o);
  free(out);

  out = run("op topk --mesh 2 --shape 12x8 --in S1 --arg k=3 --arg dim=1 --json", &status);
  assert_int_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(o);
  cJSON* outs = cJSON_GetObjectItem(o, "outputs");
  assert_int_equal(cJSON_GetArraySize(outs), 2);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(outs, 1), "dtype")->valuestring,
                      "i64");
  /* the top-k dim must be whole: something moves */
  assert_true(cJSON_GetObjectItem(o, "cost_us")->valuedouble > 0.0);
  cJSON_Delete(o);
  free(out);

  out = run("op view --mesh 2 --shape 4x6 --in S0 --arg shape=5,5 --json", &status);
  assert_int_not_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(o);
  assert_non_null(strstr(cJSON_GetObjectItem(o, "error")->valuestring, "view"));
  cJSON_Delete(o);
  free(out);
}

/* Named arguments follow the schema: sum's dim=1 reduces only dim 1 (it used to be read as
 * keepdim=1 and reduce everything); per-input dtypes; `ops` lists every op with its arguments. */
static void test_named_args_and_listing(void** state) {
  (void)state;
  int status;
  char* out = run("op sum --mesh 4 --shape 8x6 --in S0 --arg dim=1 --json", &status);
  assert_int_equal(status, 0);
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  cJSON* shp = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "shape");
  assert_int_equal(cJSON_GetArraySize(shp), 1);
  assert_int_equal(cJSON_GetArrayItem(shp, 0)->valueint, 8);
  cJSON* pl = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "placements");
  assert_string_equal(cJSON_GetArrayItem(pl, 0)->valuestring, "S(0)"); /* rows stay sharded */
  cJSON_Delete(o);
  free(out);
  out = run("op sum --mesh 4 --shape 8x6 --in S0 --arg keepdim=1 --arg dim=0,1 --json", &status);
  assert_int_equal(status, 0);
  o = cJSON_Parse(out);
  shp = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "shape");
  assert_int_equal(cJSON_GetArraySize(shp), 2);
  assert_int_equal(cJSON_GetArrayItem(shp, 0)->valueint, 1);
  pl = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "placements");
  assert_string_equal(cJSON_GetArrayItem(pl, 0)->valuestring, "P(sum)");
  cJSON_Delete(o);
  free(out);
  /* a vocabulary-sharded embedding with i64 indices: P(sum), nothing moves */
  out = run("op embedding --mesh 2 --shape 16x4 --shape 3x5 --in S0 --in R --dtype f32 "
            "--dtype i64 --json", &status);
  assert_int_equal(status, 0);
  o = cJSON_Parse(out);
  pl = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "placements");
  assert_string_equal(cJSON_GetArrayItem(pl, 0)->valuestring, "P(sum)");
  assert_true(cJSON_GetObjectItem(o, "cost_us")->valuedouble == 0.0);
  cJSON_Delete(o);
  free(out);
  out = run("op sum --mesh 4 --shape 8x6 --in S0 --arg axis=1 --json", &status);
  assert_int_not_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(strstr(cJSON_GetObjectItem(o, "error")->valuestring, "keepdim, dim"));
  cJSON_Delete(o);
  free(out);
  /* the listing: every op of the library, with its arguments */
  out = run("ops --json", &status);
  assert_int_equal(status, 0);
  o = cJSON_Parse(out);
  assert_true(cJSON_IsArray(o));
  int n;
  assert_int_equal(dt_op_count(&n), DT_SUCCESS);
  assert_int_equal(cJSON_GetArraySize(o), n);
  int seen_ce = 0;
  cJSON* it;
  cJSON_ArrayForEach(it, o) {
    const char* name = cJSON_GetObjectItem(it, "name")->valuestring;
    dt_op_desc_t d;
    assert_int_equal(dt_op_describe(name, &d), DT_SUCCESS);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(it, "args")), d.n_args);
    if (strcmp(name, "cross_entropy") == 0) {
      seen_ce = 1;
      assert_true(cJSON_IsTrue(cJSON_GetObjectItem(it, "composite")));
    }
  }
  assert_true(seen_ce);
  cJSON_Delete(o);
  free(out);
  out = run("ops rotary --json", &status);
  assert_int_equal(status, 0);
  o = cJSON_Parse(out);
  assert_int_equal(cJSON_GetArraySize(o), 1);
  cJSON* args = cJSON_GetObjectItem(cJSON_GetArrayItem(o, 0), "args");
  assert_int_equal(cJSON_GetArraySize(args), 4);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(args, 3), "name")->valuestring,
                      "theta");
  assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(args, 3), "default")->valuedouble == 10000);
  cJSON_Delete(o);
  free(out);
}

/* in-place ops: the inputs they update, the gradient reduced on the way in, a mismatch refused */
static void test_in_place(void** state) {
  (void)state;
  int status;
  const char* common = "op adamw --mesh 2 --shape 8x4 --shape 8x4 --shape 8x4 --shape 8x4 "
                       "--shape scalar --dtype f32 --dtype f32 --dtype f32 --dtype f32 "
                       "--dtype i64 --arg lr=0.1 --json";
  char args[512];
  snprintf(args, sizeof args, "%s --in S0 --in P --in S0 --in S0 --in R", common);
  char* out = run(args, &status);
  assert_int_equal(status, 0);
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  assert_null(cJSON_GetObjectItem(o, "output"));
  cJSON* up = cJSON_GetObjectItem(o, "in_place");
  assert_int_equal(cJSON_GetArraySize(up), 4);
  assert_int_equal(cJSON_GetArrayItem(up, 1)->valueint, 2);
  cJSON* g = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "redistribute"), 1);
  cJSON* st = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "steps"), 0);
  assert_string_equal(cJSON_GetObjectItem(st, "collective")->valuestring, "reduce_scatter");
  cJSON_Delete(o);
  free(out);
  snprintf(args, sizeof args, "%s --in S0 --in P --in R --in S0 --in R", common);
  out = run(args, &status);
  assert_int_not_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(strstr(cJSON_GetObjectItem(o, "error")->valuestring, "in place"));
  cJSON_Delete(o);
  free(out);
}

/* composites run on meta tensors under a trace: cross_entropy with class-sharded logits, every
 * reduction mode; the logits never move (no all-gather, no all-to-all) */
static void test_composite(void** state) {
  (void)state;
  const char* want_shape[3] = {"[8]", "[]", "[]"};
  for (int r = 0; r < 3; r++) {
    char args[512];
    snprintf(args, sizeof args, "op cross_entropy --mesh 2 --shape 8x16 --shape 8 --in S1 --in R "
             "--dtype f32 --dtype i64 --arg reduction=%d --json", r);
    int status;
    char* out = run(args, &status);
    assert_int_equal(status, 0);
    cJSON* o = cJSON_Parse(out);
    assert_non_null(o);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "composite")));
    cJSON* pieces = cJSON_GetObjectItem(o, "pieces");
    assert_true(cJSON_GetArraySize(pieces) >= 9);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(pieces, 0), "op")->valuestring,
                        "cross_entropy");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(pieces, 1), "op")->valuestring,
                        "amax");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(pieces, 1), "depth")->valueint, 1);
    char* shp = cJSON_PrintUnformatted(
        cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "shape"));
    assert_string_equal(shp, want_shape[r]);
    cJSON_free(shp);
    cJSON* cnt = cJSON_GetObjectItem(o, "counts");
    assert_int_equal(cJSON_GetObjectItem(cnt, "all_gather")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(cnt, "all_to_all")->valueint, 0);
    /* the cost is the sum of the pieces' redistributions */
    double sum = 0;
    cJSON* it;
    cJSON_ArrayForEach(it, pieces) {
      cJSON* c = cJSON_GetObjectItem(it, "cost_us");
      if (c) sum += c->valuedouble;
    }
    assert_true(fabs(sum - cJSON_GetObjectItem(o, "cost_us")->valuedouble) < 1e-6);
    cJSON_Delete(o);
    free(out);
  }
  int status;
  char* out = run("op cross_entropy --mesh 2 --shape 8x16 --shape 8 --in S1 --in R --dtype f32 "
                  "--dtype i64 --arg reduction=7 --json", &status);
  assert_int_not_equal(status, 0);
  free(out);
  out = run("op cross_entropy --mesh 2 --shape 8x16 --shape 8 --in S1 --in R --dtype f32 "
            "--dtype i64", &status);
  assert_int_equal(status, 0);
  assert_non_null(strstr(out, "gather_dim: S(1), R -> P(sum) [8]"));
  free(out);
}

/* Only the required arguments: the others take the schema's defaults, as in the C API. The
 * reductions without --arg reduce every dim (keepdim 0): a 0-d output, P(sum) (P(max) for amax)
 * from a sharded input with nothing moved; sdpa, rotary, slice, flatten and grouped_mm run with
 * their defaults. An unknown op name gets the closest names, without the C function's name. */
static void test_required_args_only(void** state) {
  (void)state;
  const char* ops[4] = {"sum", "mean", "amax", "amin"};
  const char* partial[4] = {"P(sum)", "P(sum)", "P(max)", "P(min)"};
  for (int k = 0; k < 4; k++) {
    char args[160];
    snprintf(args, sizeof args, "op %s --mesh 2 --shape 4x6 --in S0 --json", ops[k]);
    int status;
    char* out = run(args, &status);
    if (status != 0) fail_msg("%s without --arg failed: %s", ops[k], out);
    cJSON* o = cJSON_Parse(out);
    assert_non_null(o);
    cJSON* outp = cJSON_GetObjectItem(o, "output");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(outp, "shape")), 0);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(outp, "placements"), 0)->valuestring,
                        partial[k]);
    assert_true(cJSON_GetObjectItem(o, "cost_us")->valuedouble == 0.0);
    cJSON_Delete(o);
    free(out);
  }
  const char* more[] = {
      "op sdpa --mesh 2 --shape 2x4x8x16 --shape 2x4x8x16 --shape 2x4x8x16 --in S1 --in S1 "
      "--in S1",
      "op rotary --mesh 2 --shape 2x8x4x16 --in S0",
      "op slice --mesh 2 --shape 8x6 --in S0 --arg dim=1 --arg start=1 --arg end=5",
      "op flatten --mesh 2 --shape 4x6x8 --in S0",
      "op grouped_mm --mesh 2 --shape 8x4 --shape 2x6x4 --shape 2 --in S0 --in R --in R "
      "--dtype f32 --dtype f32 --dtype i64",
      "op topk --mesh 2 --shape 4x6 --in S0 --arg k=2 --arg dim=1",
      "op cross_entropy --mesh 2 --shape 8x16 --shape 8 --in S1 --in R --dtype f32 --dtype i64",
  };
  for (size_t k = 0; k < sizeof more / sizeof more[0]; k++) {
    int status;
    char* out = run(more[k], &status);
    if (status != 0) fail_msg("'%s' failed: %s", more[k], out);
    free(out);
  }
  /* flatten's defaults (start_dim 0, end_dim -1) flatten every dim */
  int status;
  char* out = run("op flatten --mesh 2 --shape 4x6x8 --in S0 --json", &status);
  cJSON* o = cJSON_Parse(out);
  assert_non_null(o);
  cJSON* shp = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "output"), "shape");
  assert_int_equal(cJSON_GetArraySize(shp), 1);
  assert_int_equal(cJSON_GetArrayItem(shp, 0)->valueint, 192);
  cJSON_Delete(o);
  free(out);
  /* unknown names: the PyTorch name maps, a typo gets the closest name; no C function named */
  out = run("op matmul --mesh 2 --shape 4x6 --in S0 --json", &status);
  assert_int_not_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(o);
  const char* e = cJSON_GetObjectItem(o, "error")->valuestring;
  if (strstr(e, "'mm'") == NULL || strstr(e, "dt_") != NULL) fail_msg("matmul: %s", e);
  cJSON_Delete(o);
  free(out);
  out = run("ops sofmax --json", &status);
  assert_int_not_equal(status, 0);
  o = cJSON_Parse(out);
  assert_non_null(o);
  e = cJSON_GetObjectItem(o, "error")->valuestring;
  if (strstr(e, "'softmax'") == NULL || strstr(e, "dt_") != NULL) fail_msg("sofmax: %s", e);
  cJSON_Delete(o);
  free(out);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_explain PATH_TO_DTENSOR_EXPLAIN\n");
    return 2;
  }
  g_exe = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_plans), cmocka_unit_test(test_example_json_shape),
      cmocka_unit_test(test_errors), cmocka_unit_test(test_text_output),
      cmocka_unit_test(test_op_json), cmocka_unit_test(test_op_shape_and_multi_output),
      cmocka_unit_test(test_named_args_and_listing), cmocka_unit_test(test_in_place),
      cmocka_unit_test(test_composite), cmocka_unit_test(test_required_args_only)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

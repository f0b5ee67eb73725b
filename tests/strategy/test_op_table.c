/* test_op_table.c - the op table is complete and consistent, and argument schemas validate
 * named arguments (no MPI).
 *
 * Completeness: every built-in op has a unique name that resolves to its id, rules and a host
 * kernel or a composite forward, a backward rule or the NO_GRAD mark, a schema that parses, and
 * public introspection agrees with the table. Schemas: dt_op_args_parse builds the positional
 * iargs/fargs from NAME=VALUE (defaults filled up to the last given argument) and rejects unknown,
 * repeated, missing or ill-typed arguments with a message naming them; selection rejects argument
 * counts the schema does not allow. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtensor/autograd.h"
#include "strategy/strategy.h"

static void test_complete(void** state) {
  (void)state;
  int n = 0;
  assert_int_equal(dt_op_count(&n), DT_SUCCESS);
  assert_true(n >= DT_OP_COUNT);
  for (int id = 0; id < DT_OP_COUNT; id++) {
    const dt_op_info_t* in = dt__op_info(id);
    assert_non_null(in);
    assert_non_null(in->name);
    assert_int_equal(dt__op_find(in->name), id);
    for (int j = 0; j < id; j++) assert_string_not_equal(in->name, dt__op_info(j)->name);
    if (in->composite != NULL) {
      assert_null(in->rules);
      assert_null(in->kernel[DT_DEVICE_HOST]);
    } else {
      assert_non_null(in->rules);
      assert_non_null(in->kernel[DT_DEVICE_HOST]);
    }
    unsigned writes = (in->flags & DT_OPF_WRITES_MASK) >> 16;
    if (writes) { /* in place: no outputs, no gradient, the kernel takes its dtypes as they are */
      assert_int_equal(in->n_out, 0);
      assert_true(in->flags & DT_OPF_NO_GRAD);
      assert_true(in->flags & DT_OPF_ANY_DTYPE);
      assert_true(writes < (1u << in->n_in));
      assert_null(in->composite);
    } else {
      assert_true(in->n_out >= 1 && in->n_out <= DT_OP_MAX_OUTPUTS);
      if (in->composite == NULL) /* every built-in kernel writes all outputs */
        assert_true(in->flags & DT_OPF_WRITES_ALL);
    }
    assert_true((in->backward != NULL) != ((in->flags & DT_OPF_NO_GRAD) != 0));
    assert_true(in->n_in >= 1 && in->n_in <= DT_OP_MAX_INPUTS);
    const dt_op_arg_t* a;
    int na;
    assert_int_equal(dt__op_schema(id, &a, &na), DT_SUCCESS);
    int ints = 0, floats = 0, lists = 0;
    for (int k = 0; k < na; k++) {
      assert_true(strlen(a[k].name) > 0);
      if (a[k].kind == DT_ARG_FLOAT) floats++;
      else if (a[k].kind == DT_ARG_INT_LIST || a[k].kind == DT_ARG_PLACEMENTS) lists++;
      else ints++;
      assert_false(a[k].required && a[k].has_default);
    }
    assert_true(floats <= DT_OP_MAX_FARGS && ints <= DT_OP_MAX_IARGS && lists <= 1);
    /* the public view agrees */
    dt_op_desc_t d;
    assert_int_equal(dt_op_describe(in->name, &d), DT_SUCCESS);
    assert_string_equal(d.name, in->name);
    assert_int_equal(d.n_args, na);
    assert_int_equal(d.has_backward, in->backward != NULL);
    assert_int_equal(d.has_backward, dt_ag_has_backward(in->name));
    assert_int_equal(d.composite, in->composite != NULL);
    assert_int_equal(d.host, 0);
    assert_int_equal(d.in_place, writes);
    const char* nm;
    assert_int_equal(dt_op_name_at(id, &nm), DT_SUCCESS);
    assert_string_equal(nm, in->name);
  }
  const char* nm;
  assert_int_equal(dt_op_name_at(n, &nm), DT_ERR_INVALID_ARG);
  assert_null(nm);
  dt_op_desc_t d;
  assert_int_equal(dt_op_describe("no_such_op", &d), DT_ERR_UNSUPPORTED);
  assert_non_null(strstr(dt_last_error(), "no_such_op"));
  /* a few hand-checked rows */
  assert_int_equal(dt_op_describe("cross_entropy", &d), DT_SUCCESS);
  assert_true(d.composite && d.has_backward && d.n_inputs == 2);
  assert_int_equal(dt_op_describe("cat", &d), DT_SUCCESS);
  assert_true(d.variadic && d.n_inputs == DT_OP_MAX_INPUTS);
  assert_int_equal(dt_op_describe("adamw", &d), DT_SUCCESS);
  assert_true(d.n_inputs == 5 && d.n_outputs == 0 && d.in_place == 0x1d && !d.has_backward);
  assert_int_equal(dt_op_describe("scale_", &d), DT_SUCCESS);
  assert_true(d.n_inputs == 1 && d.n_outputs == 0 && d.in_place == 0x1);
  assert_int_equal(dt_op_describe("sdpa_grad", &d), DT_SUCCESS);
  assert_true(!d.has_backward && d.n_outputs == 3);
  assert_int_equal(dt_op_describe("topk", &d), DT_SUCCESS);
  assert_int_equal(d.n_outputs, 2);
}

/* dt_op_args_parse of the given assignments; returns its status. */
static dt_status_t parse(const char* op, int n, const char* const* a, int* ni, int64_t* iv, int* nf,
                         double* fv) {
  return dt_op_args_parse(op, n, a, ni, iv, nf, fv);
}

static void test_args_parse(void** state) {
  (void)state;
  int ni, nf;
  int64_t iv[DT_OP_MAX_IARGS];
  double fv[DT_OP_MAX_FARGS];
  /* the bug this schema fixes: dim=1 used to be taken as keepdim=1 */
  const char* s1[] = {"dim=1"};
  assert_int_equal(parse("sum", 1, s1, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_int_equal(ni, 2);
  assert_int_equal(iv[0], 0);
  assert_int_equal(iv[1], 1);
  assert_int_equal(nf, 0);
  const char* s2[] = {"dim=0,2", "keepdim=1"};
  assert_int_equal(parse("amax", 2, s2, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_int_equal(ni, 3);
  assert_true(iv[0] == 1 && iv[1] == 0 && iv[2] == 2);
  /* nothing given: defaults only up to the last given argument, i.e. none */
  assert_int_equal(parse("sum", 0, NULL, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_int_equal(ni, 0);
  /* optional scalar with an op-computed default; integers default before it */
  const char* s3[] = {"scale=0.5"};
  assert_int_equal(parse("sdpa", 1, s3, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_true(ni == 0 && nf == 1 && fv[0] == 0.5);
  const char* s4[] = {"layout=1"};
  assert_int_equal(parse("sdpa", 1, s4, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_true(ni == 2 && iv[0] == 0 && iv[1] == 1 && nf == 0);
  const char* s5[] = {"dtype=bf16"};
  assert_int_equal(parse("cast", 1, s5, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_true(ni == 1 && iv[0] == DT_BF16);
  const char* s6[] = {"dim=1", "start=2", "end=-1"};
  assert_int_equal(parse("slice", 3, s6, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_true(ni == 3 && iv[0] == 1 && iv[1] == 2 && iv[2] == -1);
  const char* s7[] = {"placements=S0,R"};
  assert_int_equal(parse("redistribute", 1, s7, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_int_equal(ni, 2);
  dt_placement_t p;
  assert_int_equal(dt_placement_decode(iv[0], &p), DT_SUCCESS);
  assert_true(dt_placement_equal(p, dt_shard(0)));
  assert_int_equal(dt_placement_decode(iv[1], &p), DT_SUCCESS);
  assert_true(dt_placement_equal(p, dt_replicate()));
  /* errors, each naming the argument */
  const char* e1[] = {"axis=1"};
  assert_int_equal(parse("sum", 1, e1, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "axis"));
  assert_non_null(strstr(dt_last_error(), "keepdim, dim"));
  const char* e2[] = {"dim=1", "dim=2"};
  assert_int_equal(parse("softmax", 2, e2, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "twice"));
  const char* e3[] = {"dim=0", "start=1"};
  assert_int_equal(parse("narrow", 2, e3, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "length"));
  const char* e4[] = {"dim=x"};
  assert_int_equal(parse("softmax", 1, e4, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "not an integer"));
  const char* e5[] = {"p=nan", "seed=1"};
  assert_int_equal(parse("dropout", 2, e5, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "finite"));
  const char* e6[] = {"dtype=f64"};
  assert_int_equal(parse("cast", 1, e6, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  /* a dtype's number is checked whole (4294967297 is 1 in an int: it was taken), and a list
   * item left empty by a trailing comma is no integer */
  const char* e6b[] = {"dtype=4294967297"}, *e6c[] = {"dtype=-1"}, *e6d[] = {"dtype=1"};
  assert_int_equal(parse("cast", 1, e6b, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "4294967297"));
  assert_int_equal(parse("cast", 1, e6c, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_int_equal(parse("cast", 1, e6d, &ni, iv, &nf, fv), DT_SUCCESS);
  assert_true(ni == 1 && iv[0] == DT_BF16);
  const char* e6e[] = {"dim=1,"}, *e6f[] = {"dim=1,,2"};
  assert_int_equal(parse("sum", 1, e6e, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "not a list"));
  assert_int_equal(parse("sum", 1, e6f, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  const char* e7[] = {"noequals"};
  assert_int_equal(parse("sum", 1, e7, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  const char* e8[] = {"dim=1,2,3,4,5,6,7,8,9"};
  assert_int_equal(parse("sum", 1, e8, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG);
  assert_int_equal(parse("frobnicate", 0, NULL, &ni, iv, &nf, fv), DT_ERR_UNSUPPORTED);
  assert_int_equal(dt_op_args_parse("sum", 0, NULL, NULL, iv, &nf, fv), DT_ERR_INVALID_ARG);
  /* describe the arguments */
  dt_op_arg_desc_t ad;
  assert_int_equal(dt_op_arg_describe("rotary", 2, &ad), DT_SUCCESS);
  assert_string_equal(ad.name, "cp");
  assert_true(ad.kind == DT_ARG_INT && ad.has_default && ad.default_value == 0.0);
  assert_int_equal(dt_op_arg_describe("rotary", 3, &ad), DT_SUCCESS);
  assert_string_equal(ad.name, "theta");
  assert_true(ad.kind == DT_ARG_FLOAT && ad.has_default && ad.default_value == 10000.0);
  assert_int_equal(dt_op_arg_describe("rotary", 4, &ad), DT_ERR_INVALID_ARG);
}

/* Selection checks argument counts against the schema. */
static void test_counts_checked(void** state) {
  (void)state;
  int shape[1] = {2};
  dt_mesh_t m;
  assert_int_equal(dt_mesh_create_abstract(1, shape, NULL, &m), DT_SUCCESS);
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  c.op = "relu";
  c.n_inputs = 1;
  c.in[0].dtype = DT_F32;
  c.in[0].ndim = 1;
  c.in[0].shape[0] = 4;
  c.n_iargs = 1;
  dt_placement_t in[1][DT_MAX_MESH_DIMS] = {{dt_replicate()}};
  dt_op_choice_t ch;
  assert_int_equal(dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "relu takes iargs []"));
  c.op = "softmax"; /* needs its dim */
  c.n_iargs = 0;
  assert_int_equal(dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "softmax takes iargs [dim]"));
  c.n_iargs = 1;
  assert_int_equal(dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_SUCCESS);
  c.op = "cross_entropy"; /* a composite has no rules of its own */
  assert_int_equal(dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_ERR_UNSUPPORTED);
  dt_mesh_destroy(m);
}

/* A host op that replaces a built-in is seen by every caller; a new one lists after the
 * built-ins. */
static dt_status_t my_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  (void)cap;
  *n_out = 1;
  *out_meta = call->in[0];
  memset(rules, 0, sizeof *rules); /* replicated only */
  *n = 1;
  return DT_SUCCESS;
}

static void test_host_ops(void** state) {
  (void)state;
  int before, after;
  assert_int_equal(dt_op_count(&before), DT_SUCCESS);
  assert_int_equal(dt_op_register("my_host_op", 1, my_rules, NULL), DT_SUCCESS);
  assert_int_equal(dt_op_register("my_host_op", 1, my_rules, NULL), DT_SUCCESS); /* replace */
  assert_int_equal(dt_op_count(&after), DT_SUCCESS);
  assert_int_equal(after, before + 1);
  const char* nm;
  assert_int_equal(dt_op_name_at(after - 1, &nm), DT_SUCCESS);
  assert_string_equal(nm, "my_host_op");
  dt_op_desc_t d;
  assert_int_equal(dt_op_describe("my_host_op", &d), DT_SUCCESS);
  assert_true(d.host && !d.has_backward && d.n_args == 0);
  /* override neg: its rules now allow only replication */
  assert_int_equal(dt_op_register("neg", 1, my_rules, NULL), DT_SUCCESS);
  int after2;
  assert_int_equal(dt_op_count(&after2), DT_SUCCESS);
  assert_int_equal(after2, after); /* not listed twice */
  assert_int_equal(dt_op_describe("neg", &d), DT_SUCCESS);
  assert_true(d.host && d.has_backward); /* keeps the built-in's backward rule */
  int shape[1] = {2};
  dt_mesh_t m;
  assert_int_equal(dt_mesh_create_abstract(1, shape, NULL, &m), DT_SUCCESS);
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  c.op = "neg";
  c.n_inputs = 1;
  c.in[0].dtype = DT_F32;
  c.in[0].ndim = 1;
  c.in[0].shape[0] = 4;
  dt_placement_t in[1][DT_MAX_MESH_DIMS] = {{dt_shard(0)}};
  dt_op_choice_t ch;
  assert_int_equal(dt_op_select(m, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch),
                   DT_SUCCESS);
  assert_int_equal(ch.out[0][0].kind, DT_REPLICATE); /* the override's only rule */
  assert_int_equal(ch.steps, 1);
  dt_mesh_destroy(m);
}

/* The schema is the one source of defaults: dt__op_iarg / dt__op_farg give a given argument, else
 * its default, else DT_OP_IARG_NONE / NaN. Ops whose rules or kernels read one shared schema
 * (sdpa and sdpa_grad, a norm and its gradient, the four reductions) have identical ones. */
static void test_schema_defaults(void** state) {
  (void)state;
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  assert_int_equal(dt__op_iarg(DT_OP_SUM, &c, 0), 0);                 /* keepdim=0 */
  assert_int_equal(dt__op_iarg(DT_OP_SUM, &c, 1), DT_OP_IARG_NONE);   /* a list item */
  assert_int_equal(dt__op_iarg(DT_OP_ROTARY, &c, 0), 1);              /* seq_dim=1 */
  assert_int_equal(dt__op_iarg(DT_OP_ROTARY, &c, 1), 0);              /* inverse=0 */
  assert_true(dt__op_farg(DT_OP_ROTARY, &c, 0) == 10000.0);
  assert_int_equal(dt__op_iarg(DT_OP_GROUPED_MM, &c, 0), 1);          /* trans=1 */
  assert_int_equal(dt__op_iarg(DT_OP_TOPK, &c, 2), 1);                /* largest=1 */
  assert_int_equal(dt__op_iarg(DT_OP_TOPK, &c, 0), DT_OP_IARG_NONE);  /* k: required */
  assert_int_equal(dt__op_iarg(DT_OP_SDPA, &c, 0), 0);
  assert_int_equal(dt__op_iarg(DT_OP_SDPA, &c, 1), 0);
  assert_true(isnan(dt__op_farg(DT_OP_SDPA, &c, 0)));                 /* scale: op-computed */
  assert_int_equal(dt__op_iarg(DT_OP_SLICE, &c, 3), 1);               /* step=1 */
  assert_int_equal(dt__op_iarg(DT_OP_FLATTEN, &c, 1), -1);            /* end_dim=-1 */
  assert_int_equal(dt__op_iarg(DT_OP_MOE_ROUTE, &c, 1), 0);           /* capacity=0 */
  assert_int_equal(dt__op_iarg(DT_OP_CROSS_ENTROPY, &c, 0), DT_LOSS_MEAN);
  assert_int_equal(dt__op_iarg(DT_OP_ALL_TO_ALL_SINGLE, &c, 0), 0);
  assert_true(dt__op_farg(DT_OP_RMS_NORM, &c, 0) == 1e-6);
  assert_true(dt__op_farg(DT_OP_LAYER_NORM, &c, 0) == 1e-5);
  assert_true(dt__op_farg(DT_OP_ADDMM, &c, 1) == 1.0);
  c.n_iargs = 2;
  c.iargs[0] = 3;
  c.iargs[1] = 7;
  assert_int_equal(dt__op_iarg(DT_OP_ROTARY, &c, 0), 3); /* given values win */
  assert_int_equal(dt__op_iarg(DT_OP_SUM, &c, 1), 7);
  const int64_t a1[1] = {2};
  assert_int_equal(dt__op_iarg_n(DT_OP_CROSS_ENTROPY, 1, a1, 0), 2);
  assert_int_equal(dt__op_iarg_n(DT_OP_CROSS_ENTROPY, 0, NULL, 0), DT_LOSS_MEAN);
  const int same[][2] = {{DT_OP_SDPA, DT_OP_SDPA_GRAD},
                         {DT_OP_RMS_NORM, DT_OP_RMS_NORM_GRAD},
                         {DT_OP_LAYER_NORM, DT_OP_LAYER_NORM_GRAD},
                         {DT_OP_SUM, DT_OP_MEAN},
                         {DT_OP_SUM, DT_OP_AMAX},
                         {DT_OP_SUM, DT_OP_AMIN}};
  for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
    assert_string_equal(dt__op_info(same[k][0])->args, dt__op_info(same[k][1])->args);
  /* every default parses to what the schema text says (integers are whole numbers) */
  for (int id = 0; id < DT_OP_COUNT; id++) {
    const dt_op_arg_t* a;
    int na;
    assert_int_equal(dt__op_schema(id, &a, &na), DT_SUCCESS);
    for (int k = 0; k < na; k++)
      if (a[k].has_default && a[k].kind != DT_ARG_FLOAT) assert_true(a[k].def == floor(a[k].def));
  }
}

/* Unknown names: a PyTorch name maps to this library's op, a typo gets the closest names, and
 * the message starts with the public function called. */
static void test_unknown_names(void** state) {
  (void)state;
  dt_op_desc_t d;
  const char* cases[][2] = {{"matmul", "'mm'"},         {"sofmax", "'softmax'"},
                            {"layer_nrom", "'layer_norm'"}, {"rmsnorm", "'rms_norm'"},
                            {"concat", "'cat'"},        {"scaled_dot_product_attention", "'sdpa'"},
                            {"Softmax", "'softmax'"},    {"rms", "'rms_norm'"}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    assert_int_equal(dt_op_describe(cases[k][0], &d), DT_ERR_UNSUPPORTED);
    const char* e = dt_last_error();
    if (strncmp(e, "dt_op_describe: unknown op '", 28) != 0 || strstr(e, cases[k][1]) == NULL ||
        strstr(e, "dt__") != NULL)
      fail_msg("%s: %s", cases[k][0], e);
  }
  /* nothing close: no suggestion, but where to look */
  assert_int_equal(dt_op_describe("frobnicate", &d), DT_ERR_UNSUPPORTED);
  assert_null(strstr(dt_last_error(), "did you mean"));
  assert_non_null(strstr(dt_last_error(), "dtensor-explain ops"));
  /* a very long name is cut, never overflows */
  char longname[3000];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  assert_int_equal(dt_op_describe(longname, &d), DT_ERR_UNSUPPORTED);
  assert_true(strlen(dt_last_error()) < 1024);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_complete),
      cmocka_unit_test(test_args_parse),
      cmocka_unit_test(test_counts_checked),
      cmocka_unit_test(test_host_ops),
      cmocka_unit_test(test_schema_defaults),
      cmocka_unit_test(test_unknown_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

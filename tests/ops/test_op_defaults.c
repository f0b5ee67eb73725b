/* test_op_defaults.c - every op runs with only its required arguments, and the result equals the
 * run with every default written out (the schema is the one source of defaults: rules, kernels
 * and backward rules read them through dt__op_iarg / dt__op_farg).
 *
 * For each op of the table (dt_op_count / dt_op_name_at, schema from dt_op_describe and
 * dt_op_arg_describe) the table below gives small inputs and the required arguments. Run A passes
 * only those (dt_op_args_parse fills nothing after the last given argument, so n_iargs / n_fargs
 * stop there); run B passes them plus "NAME=DEFAULT" for every argument with a default. Both must
 * succeed and agree bit for bit: outputs' dtype, shape, placements and local values, or for the
 * in-place ops (adamw, scale_) the inputs they update. An op without a row here fails the test,
 * so a new op gets one. Then the reductions without arguments are checked against the values
 * they must have (every dim, keepdim 0: a 0-d result), and one backward rule (rotary's, which
 * reads seq_dim) through autograd. Fails on a tree whose reductions need [keepdim]. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/autograd.h"

#include "op_specs.h"

static int g_world;

/* A replicated input with deterministic values (exact in f32 and bf16). */
static dt_tensor_t make_input(dt_mesh_t mesh, const in_t* s, int t) {
  dt_tensor_t x;
  DT_ASSERT_OK(spec_input(mesh, s, t, g_world, NULL, &x));
  return x;
}

/* Builds the call's arguments: the required ones, plus every default written out when `all`. */
static void build_args(const spec_t* sp, int all, int* ni, int64_t* iv, int* nf, double* fv) {
  const char* as[16];
  char defs[16][64];
  int n = 0;
  for (int k = 0; k < 4 && sp->req[k]; k++) as[n++] = sp->req[k];
  if (all) {
    dt_op_desc_t d;
    DT_ASSERT_OK(dt_op_describe(sp->op, &d));
    for (int k = 0; k < d.n_args; k++) {
      dt_op_arg_desc_t a;
      DT_ASSERT_OK(dt_op_arg_describe(sp->op, k, &a));
      if (!a.has_default) continue;
      snprintf(defs[k], sizeof defs[k], "%s=%.17g", a.name, a.default_value);
      as[n++] = defs[k];
    }
  }
  DT_ASSERT_OK(dt_op_args_parse(sp->op, n, as, ni, iv, nf, fv));
}

/* Byte-exact equality of two tensors: dtype, shape, placements and this rank's local values. */
static void assert_same(const char* op, const char* what, dt_tensor_t a, dt_tensor_t b) {
  dt_dtype_t da, db;
  int na, nb;
  int64_t sa[DT_MAX_DIMS], sb[DT_MAX_DIMS], la, lb;
  DT_ASSERT_OK(dt_tensor_dtype(a, &da));
  DT_ASSERT_OK(dt_tensor_dtype(b, &db));
  DT_ASSERT_OK(dt_tensor_ndim(a, &na));
  DT_ASSERT_OK(dt_tensor_ndim(b, &nb));
  DT_ASSERT_TRUE(da == db && na == nb, "%s %s: dtype/ndim differ (%d/%d vs %d/%d)", op, what, da,
                 na, db, nb);
  DT_ASSERT_OK(dt_tensor_shape(a, sa));
  DT_ASSERT_OK(dt_tensor_shape(b, sb));
  DT_ASSERT_TRUE(memcmp(sa, sb, sizeof(int64_t) * (size_t)na) == 0, "%s %s: shapes differ", op,
                 what);
  dt_mesh_t m;
  int mnd;
  DT_ASSERT_OK(dt_tensor_mesh(a, &m));
  DT_ASSERT_OK(dt_mesh_ndim(m, &mnd));
  dt_placement_t pa[DT_MAX_MESH_DIMS], pb[DT_MAX_MESH_DIMS];
  DT_ASSERT_OK(dt_tensor_placements(a, pa));
  DT_ASSERT_OK(dt_tensor_placements(b, pb));
  for (int i = 0; i < mnd; i++)
    DT_ASSERT_TRUE(dt_placement_equal(pa[i], pb[i]), "%s %s: placements differ", op, what);
  DT_ASSERT_OK(dt_tensor_local_numel(a, &la));
  DT_ASSERT_OK(dt_tensor_local_numel(b, &lb));
  DT_ASSERT_EQ(la, lb);
  size_t nbytes = (size_t)(la > 0 ? la : 1) * 8;
  unsigned char* ba = calloc(1, nbytes);
  unsigned char* bb = calloc(1, nbytes);
  if (la > 0) {
    DT_ASSERT_OK(dt_tensor_read_local(a, 0, la, ba));
    DT_ASSERT_OK(dt_tensor_read_local(b, 0, lb, bb));
  }
  DT_ASSERT_TRUE(memcmp(ba, bb, nbytes) == 0, "%s %s: values differ with the defaults written out",
                 op, what);
  free(ba);
  free(bb);
}

/* One op: run A (required arguments only) and run B (every default written), compared. */
static void check_op(dt_mesh_t mesh, const char* op) {
  const spec_t* sp = find_spec(op);
  DT_ASSERT_TRUE(sp != NULL, "op '%s' has no row in tests/ops/op_specs.h: add one", op);
  dt_op_desc_t d;
  DT_ASSERT_OK(dt_op_describe(op, &d));
  /* every argument without a default that is required appears in the row */
  for (int k = 0; k < d.n_args; k++) {
    dt_op_arg_desc_t a;
    DT_ASSERT_OK(dt_op_arg_describe(op, k, &a));
    if (!a.required) continue;
    int found = 0;
    size_t len = strlen(a.name);
    for (int r = 0; r < 4 && sp->req[r]; r++)
      found |= strncmp(sp->req[r], a.name, len) == 0 && sp->req[r][len] == '=';
    DT_ASSERT_TRUE(found, "%s: the row lacks required argument '%s'", op, a.name);
  }
  dt_tensor_t res[2][DT_OP_MAX_INPUTS + DT_OP_MAX_OUTPUTS];
  int nres = 0;
  for (int run = 0; run < 2; run++) {
    int ni, nf;
    int64_t iv[DT_OP_MAX_IARGS];
    double fv[DT_OP_MAX_FARGS];
    build_args(sp, run, &ni, iv, &nf, fv);
    dt_tensor_t in[DT_OP_MAX_INPUTS], outs[DT_OP_MAX_OUTPUTS] = {NULL};
    for (int t = 0; t < sp->n_in; t++) in[t] = make_input(mesh, &sp->in[t], t);
    dt_status_t st = dt_op_run_multi(op, sp->n_in, in, ni, iv, nf, fv, d.n_outputs, outs);
    DT_ASSERT_TRUE(st == DT_SUCCESS, "%s with %s: %s: %s", op,
                   run ? "every default written out" : "only its required arguments",
                   dt_status_name(st), dt_last_error());
    nres = 0;
    for (int o = 0; o < d.n_outputs; o++) res[run][nres++] = outs[o];
    for (int t = 0; t < sp->n_in; t++) {
      if (d.in_place & (1u << t)) res[run][nres++] = in[t]; /* compared below */
      else DT_ASSERT_OK(dt_tensor_destroy(in[t]));
    }
  }
  for (int k = 0; k < nres; k++) {
    char what[32];
    snprintf(what, sizeof what, "result %d", k);
    assert_same(op, what, res[0][k], res[1][k]);
    DT_ASSERT_OK(dt_tensor_destroy(res[0][k]));
    DT_ASSERT_OK(dt_tensor_destroy(res[1][k]));
  }
}

/* Sums that a float running sum gets wrong: 2^24 then ones (2^24 + 1 rounds back to 2^24) over
 * every dim of a 2-D tensor, over its leading dim and over the middle dim of a 3-D one, as
 * PyTorch's CPU cascade sums give them (the host kernels accumulate in double); on a device,
 * whose kernels sum in float trees as PyTorch's CUDA ones do, within 1e-5. */
static int g_exact = 1;
static int sum_ok(float got, double want) {
  return g_exact ? got == (float)want : fabs(got - want) <= 1e-5 * want;
}
static void check_sum_precision(dt_mesh_t mesh) {
  dt_backend_t be;
  dt_device_t dev;
  DT_ASSERT_OK(dt_mesh_backend(mesh, &be));
  DT_ASSERT_OK(dt_backend_device(be, &dev));
  g_exact = dev == DT_DEVICE_HOST;
  enum { R = 1001 };
  static float buf[2 * R * 2];
  const int64_t s2[2] = {R, 2}, s3[3] = {2, R, 2};
  for (int i = 0; i < 2 * R * 2; i++) buf[i] = 1.0f;
  for (int b = 0; b < 2; b++) /* the first row of each (R, 2) block: 2^24 */
    buf[b * R * 2] = buf[b * R * 2 + 1] = 16777216.0f;
  dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t x2, x3, r;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s2, rep, buf, &x2));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 3, s3, rep, buf, &x3));
  float got[4];
  DT_ASSERT_OK(dt_op_run("sum", 1, &x2, 0, NULL, 0, NULL, &r)); /* every dim */
  DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof(float)));
  DT_ASSERT_TRUE(sum_ok(got[0], 33556432.0), "sum of 2^24, 2^24 and 2000 ones: %.1f", (double)got[0]);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  const int64_t d0[2] = {0, 0}, d1[2] = {0, 1};
  DT_ASSERT_OK(dt_op_run("sum", 1, &x2, 2, d0, 0, NULL, &r)); /* the leading dim */
  DT_ASSERT_OK(dt_tensor_gather_full(r, got, 2 * sizeof(float)));
  DT_ASSERT_TRUE(sum_ok(got[0], 16778216.0) && sum_ok(got[1], 16778216.0), "column sums %.1f %.1f, want "
                 "2^24 + 1000", (double)got[0], (double)got[1]);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  DT_ASSERT_OK(dt_op_run("sum", 1, &x3, 2, d1, 0, NULL, &r)); /* the middle dim */
  DT_ASSERT_OK(dt_tensor_gather_full(r, got, 4 * sizeof(float)));
  for (int i = 0; i < 4; i++)
    DT_ASSERT_TRUE(sum_ok(got[i], 16778216.0), "middle sum %d: %.1f, want 2^24 + 1000", i,
                   (double)got[i]);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  DT_ASSERT_OK(dt_op_run("mean", 1, &x3, 2, d1, 0, NULL, &r));
  DT_ASSERT_OK(dt_tensor_gather_full(r, got, 4 * sizeof(float)));
  DT_ASSERT_TRUE(fabs(got[0] - 16778216.0 / R) <= (g_exact ? 1e-6 : 1e-5) * (16778216.0 / R),
                 "middle mean %.3f", (double)got[0]);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  DT_ASSERT_OK(dt_tensor_destroy(x2));
  DT_ASSERT_OK(dt_tensor_destroy(x3));
}

/* The reductions without arguments: every dim, keepdim 0 (a 0-d tensor); keepdim alone keeps
 * every dim as 1. */
static void check_reductions(dt_mesh_t mesh) {
  const in_t s = {DT_F32, T2(4, 6), F_VAL, 0, 0};
  dt_tensor_t x = make_input(mesh, &s, 0);
  double sum = 0, mx = -1e30, mn = 1e30;
  for (int i = 0; i < 24; i++) {
    double v = (double)(((i * 7) % 11) - 5) / 4.0;
    sum += v;
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  const char* ops[4] = {"sum", "mean", "amax", "amin"};
  const double want[4] = {sum, sum / 24.0, mx, mn};
  for (int k = 0; k < 4; k++) {
    dt_tensor_t r;
    DT_ASSERT_OK(dt_op_run(ops[k], 1, &x, 0, NULL, 0, NULL, &r));
    int nd;
    float got;
    DT_ASSERT_OK(dt_tensor_ndim(r, &nd));
    DT_ASSERT_TRUE(nd == 0, "%s without arguments: %d dims, expected 0 (every dim, keepdim 0)",
                   ops[k], nd);
    DT_ASSERT_OK(dt_tensor_gather_full(r, &got, sizeof got));
    DT_ASSERT_TRUE(fabs(got - want[k]) <= 1e-6 * (1 + fabs(want[k])), "%s: %g, expected %g",
                   ops[k], got, want[k]);
    DT_ASSERT_OK(dt_tensor_destroy(r));
    const int64_t keep[1] = {1}; /* keepdim only: every dim kept as 1 */
    DT_ASSERT_OK(dt_op_run(ops[k], 1, &x, 1, keep, 0, NULL, &r));
    int64_t sh[2];
    DT_ASSERT_OK(dt_tensor_ndim(r, &nd));
    DT_ASSERT_OK(dt_tensor_shape(r, sh));
    DT_ASSERT_TRUE(nd == 2 && sh[0] == 1 && sh[1] == 1, "%s keepdim=1: ndim %d", ops[k], nd);
    DT_ASSERT_OK(dt_tensor_destroy(r));
  }
  /* and through autograd: the gradient of mean() (no arguments) is 1 / numel everywhere; then
   * rotary (no arguments: seq_dim 1) backward is the inverse rotation, so x . grad = x . R^T 1 */
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t v, y;
  DT_ASSERT_OK(dt_var_leaf(make_input(mesh, &s, 0), 1, &v));
  DT_ASSERT_OK(dt_ag_op(tape, "mean", 1, &v, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_OK(dt_tape_backward(tape, y));
  float gv[24];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(v), gv, sizeof gv));
  for (int i = 0; i < 24; i++) DT_ASSERT_TRUE(gv[i] == 1.0f / 24.0f, "mean grad %d: %g", i, gv[i]);
  DT_ASSERT_OK(dt_tape_reset(tape));
  DT_ASSERT_OK(dt_var_destroy(v));
  /* rotary's backward reads seq_dim and inverse from the schema: with and without arguments the
   * gradients agree */
  const in_t rs = {DT_F32, T4(1, 4, 2, 6), F_VAL, 0, 0};
  float gr[2][48];
  for (int run = 0; run < 2; run++) {
    const int64_t a[2] = {1, 0};
    dt_var_t xr, yr, l;
    DT_ASSERT_OK(dt_var_leaf(make_input(mesh, &rs, 0), 1, &xr));
    DT_ASSERT_OK(dt_ag_op(tape, "rotary", 1, &xr, run ? 2 : 0, a, 0, NULL, 1, &yr));
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &yr, 0, NULL, 0, NULL, 1, &l));
    DT_ASSERT_OK(dt_tape_backward(tape, l));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(xr), gr[run], sizeof gr[run]));
    DT_ASSERT_OK(dt_tape_reset(tape));
    DT_ASSERT_OK(dt_var_destroy(xr));
  }
  DT_ASSERT_TRUE(memcmp(gr[0], gr[1], sizeof gr[0]) == 0, "rotary grads differ with defaults");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_tensor_destroy(x));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank;
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  check_reductions(mesh);
  check_sum_precision(mesh);
  int n;
  DT_ASSERT_OK(dt_op_count(&n));
  int checked = 0;
  for (int i = 0; i < n; i++) {
    const spec_t* sp = spec_at(i);
    if (sp == NULL) continue; /* a host op */
    check_op(mesh, sp->op);
    checked++;
  }
  if (rank == 0) printf("test_op_defaults np=%d: %d ops run with only their required arguments\n",
                        g_world, checked);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* layers.c - the layers one's own models are built from: Linear (PyTorch's initialisation from
 * the placement-independent generator), activations (any one-input op with a backward rule),
 * Sequential, and the MSE and cross-entropy losses as one recorded call each. Modules of
 * dtensor/module.h over recorded ops; public API only. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtensor/check.h"
#include "dtensor/dtensor.h"
#include "dtensor/nn.h"

/* ---------------------------------------------------------------------------------------------
 * Linear */

/* The Linear module's context says whether it has a bias (so that its forward never looks up a
 * parameter that is not there); the value itself is never read. */
static const char dt__linear_with_bias[] = "bias";

static dt_status_t dt__linear_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                      int n_out, dt_var_t* out) {
  if (n_in != 1 || n_out != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "linear '%s': 1 input and 1 output, not %d and %d",
                   dt_module_name(m), n_in, n_out);
  dt_var_t bias = dt_module_ctx(m) ? dt_module_get(m, "bias") : NULL;
  return dt_nn_linear(tape, in[0], dt_module_get(m, "weight"), bias, &out[0]);
}

/* FNV-1a of the seed and "module.parameter": one stream per parameter (as dt_nn_param). */
static uint64_t dt__fnv(uint64_t h, const char* s) {
  for (const unsigned char* p = (const unsigned char*)s; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}
static uint64_t dt__layer_seed(uint64_t seed, const char* module, const char* param) {
  return dt__fnv(dt__fnv(dt__fnv(1469598103934665603ull ^ seed, module), "."), param);
}

/* A replicated f32 leaf requiring a gradient, uniform in [-bound, bound): 2 bound u - bound. */
static dt_status_t dt__uniform_param(dt_mesh_t mesh, int ndim, const int64_t* shape, double bound,
                                     uint64_t seed, dt_var_t* out) {
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int d = 0; d < mnd; d++) rep[d] = dt_replicate();
  dt_tensor_t u = NULL, s = NULL, w = NULL;
  const double scale = 2.0 * bound, shift = -bound;
  dt_status_t st = dt_tensor_rand(mesh, DT_F32, ndim, shape, rep, seed, &u);
  if (st == DT_SUCCESS) st = dt_op_run("mul_scalar", 1, &u, 0, NULL, 1, &scale, &s);
  if (st == DT_SUCCESS) st = dt_op_run("add_scalar", 1, &s, 0, NULL, 1, &shift, &w);
  if (st == DT_SUCCESS) st = dt_var_leaf(w, 1, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(w);
  dt_tensor_destroy(u);
  dt_tensor_destroy(s);
  return st;
}

static dt_status_t dt__linear_create(dt_mesh_t mesh, const char* name, int64_t in_features,
                                     int64_t out_features, int bias, uint64_t seed,
                                     dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(mesh);
  DT_ARG_NOT_NULL(name);
  if (in_features < 1 || out_features < 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "linear '%s': in_features=%lld, out_features=%lld (valid: "
                   "1 or more each)", name, (long long)in_features, (long long)out_features);
  dt_module_t m = NULL;
  dt_var_t w = NULL, b = NULL;
  const double bound = 1.0 / sqrt((double)in_features); /* PyTorch's, weight and bias alike */
  const int64_t ws[2] = {out_features, in_features};
  dt_status_t st;
  DT_CHECK_GOTO(dt_module_create(name, dt__linear_forward,
                                 bias ? (void*)dt__linear_with_bias : NULL, &m), st, fail);
  DT_CHECK_GOTO(dt__uniform_param(mesh, 2, ws, bound, dt__layer_seed(seed, name, "weight"), &w),
                st, fail);
  DT_CHECK_GOTO(dt_module_add_param(m, "weight", w), st, fail);
  w = NULL; /* the module's now */
  if (bias) {
    DT_CHECK_GOTO(dt__uniform_param(mesh, 1, &out_features, bound,
                                    dt__layer_seed(seed, name, "bias"), &b), st, fail);
    DT_CHECK_GOTO(dt_module_add_param(m, "bias", b), st, fail);
  }
  *out = m;
  return DT_SUCCESS;
fail: /* w and b: created and not yet the module's */
  dt_var_destroy(w);
  dt_var_destroy(b);
  dt_module_destroy(m);
  return st;
}

dt_status_t dt_linear_create(dt_mesh_t mesh, const char* name, int64_t in_features,
                             int64_t out_features, int bias, uint64_t seed, dt_module_t* out) {
  DT_ENTRY_RETURN(dt__linear_create(mesh, name, in_features, out_features, bias, seed, out));
}

/* ---------------------------------------------------------------------------------------------
 * activations */

static dt_status_t dt__activation_forward(dt_module_t m, dt_tape_t tape, int n_in,
                                          const dt_var_t* in, int n_out, dt_var_t* out) {
  if (n_in != 1 || n_out != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "activation '%s': 1 input and 1 output, not %d and %d",
                   dt_module_name(m), n_in, n_out);
  return dt_ag_op(tape, (const char*)dt_module_ctx(m), 1, in, 0, NULL, 0, NULL, 1, out);
}

static dt_status_t dt__activation_create(const char* name, const char* op, dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(op);
  dt_op_desc_t d;
  if (dt_op_describe(op, &d) != DT_SUCCESS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op '%s' is not an op (valid: relu, gelu, silu, tanh, "
                   "sigmoid, ...)", op);
  int ok = d.n_inputs == 1 && !d.variadic && d.n_outputs == 1 && d.has_backward && !d.in_place;
  for (int k = 0; ok && k < d.n_args; k++) {
    dt_op_arg_desc_t a;
    DT_CHECK(dt_op_arg_describe(op, k, &a));
    ok = !a.required;
  }
  if (!ok)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op '%s' is not element-wise-like (valid: one input, one "
                   "output, a backward rule, no required argument)", op);
  /* the descriptor's name lives as long as the library: the module's context */
  return dt_module_create(name, dt__activation_forward, (void*)d.name, out);
}

dt_status_t dt_activation_create(const char* name, const char* op, dt_module_t* out) {
  DT_ENTRY_RETURN(dt__activation_create(name, op, out));
}

/* ---------------------------------------------------------------------------------------------
 * Sequential */

static dt_status_t dt__sequential_forward(dt_module_t m, dt_tape_t tape, int n_in,
                                          const dt_var_t* in, int n_out, dt_var_t* out) {
  if (n_in != 1 || n_out != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "sequential '%s': 1 input and 1 output, not %d and %d",
                   dt_module_name(m), n_in, n_out);
  int n;
  DT_CHECK(dt_module_num_children(m, &n));
  dt_var_t x = in[0];
  for (int i = 0; i < n; i++) {
    dt_module_t c;
    DT_CHECK(dt_module_child(m, i, &c));
    DT_CHECK(dt_module_forward(c, tape, 1, &x, 1, &x));
  }
  out[0] = x;
  return DT_SUCCESS;
}

static dt_status_t dt__sequential_create(const char* name, int n, const dt_module_t* children,
                                         dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (n < 0 || (n > 0 && children == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d with children %s (valid: n >= 0, and an array of n "
                   "modules when n > 0)", n, children ? "given" : "NULL");
  for (int i = 0; i < n; i++) { /* everything checked before anything is taken */
    const char* ci = dt_module_name(children[i]);
    if (ci == NULL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "children[%d] is not a live module: %s", i,
                     dt_last_error());
    if (dt_module_parent(children[i]) != NULL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "children[%d] ('%s') already has a parent", i,
                     ci);
    for (int j = 0; j < i; j++)
      if (children[j] == children[i] || (ci[0] && strcmp(dt_module_name(children[j]), ci) == 0))
        return DT_FAIL(DT_ERR_INVALID_ARG, "children[%d] and children[%d] are both '%s'", j, i,
                       ci);
  }
  dt_module_t m;
  dt_status_t st = dt_module_create(name, dt__sequential_forward, NULL, &m);
  if (st != DT_SUCCESS) return st; /* a bad name: nothing taken */
  int added = 0;
  while (added < n && (st = dt_module_add_child(m, children[added])) == DT_SUCCESS) added++;
  if (st != DT_SUCCESS) { /* out of memory: ownership had passed, so everything goes */
    for (int i = added; i < n; i++) dt_module_destroy(children[i]);
    dt_module_destroy(m);
    return st;
  }
  *out = m;
  return DT_SUCCESS;
}

dt_status_t dt_sequential_create(const char* name, int n, const dt_module_t* children,
                                 dt_module_t* out) {
  DT_ENTRY_RETURN(dt__sequential_create(name, n, children, out));
}

/* ---------------------------------------------------------------------------------------------
 * losses */

static dt_status_t dt__check_reduction(const char* what, dt_loss_reduction_t r) {
  if ((int)r < 0 || r >= DT_LOSS_REDUCTION_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: reduction %d is not a dt_loss_reduction_t (NONE 0, "
                   "MEAN 1, SUM 2)", what, (int)r);
  return DT_SUCCESS;
}

static dt_status_t dt__nn_mse_loss(dt_tape_t tape, dt_var_t pred, dt_var_t target,
                                   dt_loss_reduction_t reduction, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__check_reduction("mse_loss", reduction));
  dt_tensor_t p = dt_var_value(pred), t = p ? dt_var_value(target) : NULL;
  if (p == NULL || t == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mse_loss: %s is not a live variable: %s",
                   p == NULL ? "pred" : "target", dt_last_error());
  int pn, tn;
  int64_t ps[DT_MAX_DIMS], ts[DT_MAX_DIMS];
  DT_CHECK(dt_tensor_ndim(p, &pn));
  DT_CHECK(dt_tensor_ndim(t, &tn));
  DT_CHECK(dt_tensor_shape(p, ps));
  DT_CHECK(dt_tensor_shape(t, ts));
  if (pn != tn || memcmp(ps, ts, sizeof(int64_t) * (size_t)pn) != 0) {
    char a[8 * 24], b[8 * 24];
    int64_t* shp[2] = {ps, ts};
    int nds[2] = {pn, tn};
    char* txt[2] = {a, b};
    for (int k = 0; k < 2; k++) { /* "(4, 3)" */
      int w = snprintf(txt[k], sizeof a, "(");
      for (int d = 0; d < nds[k] && w > 0 && (size_t)w < sizeof a; d++)
        w += snprintf(txt[k] + w, sizeof a - (size_t)w, "%s%lld", d ? ", " : "",
                      (long long)shp[k][d]);
      if (w > 0 && (size_t)w < sizeof a) snprintf(txt[k] + w, sizeof a - (size_t)w, ")");
    }
    return DT_FAIL(DT_ERR_INVALID_ARG, "mse_loss: pred %s and target %s must have the same shape",
                   a, b);
  }
  dt_var_t pt[2] = {pred, target}, d, sq[2];
  DT_CHECK(dt_ag_op(tape, "sub", 2, pt, 0, NULL, 0, NULL, 1, &d));
  sq[0] = sq[1] = d;
  if (reduction == DT_LOSS_NONE) return dt_ag_op(tape, "mul", 2, sq, 0, NULL, 0, NULL, 1, out);
  dt_var_t e;
  const int64_t all[1] = {0}; /* keepdim 0, no dims: every dim, a 0-d result */
  DT_CHECK(dt_ag_op(tape, "mul", 2, sq, 0, NULL, 0, NULL, 1, &e));
  return dt_ag_op(tape, reduction == DT_LOSS_MEAN ? "mean" : "sum", 1, &e, 1, all, 0, NULL, 1,
                  out);
}

dt_status_t dt_nn_mse_loss(dt_tape_t tape, dt_var_t pred, dt_var_t target,
                           dt_loss_reduction_t reduction, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_mse_loss(tape, pred, target, reduction, out));
}

static dt_status_t dt__nn_cross_entropy(dt_tape_t tape, dt_var_t logits, dt_var_t targets,
                                        dt_loss_reduction_t reduction, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__check_reduction("cross_entropy", reduction));
  dt_var_t in[2] = {logits, targets};
  const int64_t r = reduction;
  return dt_ag_op(tape, "cross_entropy", 2, in, 1, &r, 0, NULL, 1, out);
}

dt_status_t dt_nn_cross_entropy(dt_tape_t tape, dt_var_t logits, dt_var_t targets,
                                dt_loss_reduction_t reduction, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_cross_entropy(tape, logits, targets, reduction, out));
}

/* dispatch.c - runs ops on distributed tensors: strategy selection (cached), input
 * redistribution, local kernel, output tensor with the chosen placements. */
#include <cblas.h>

#include "ops/ops.h"
#include "strategy/strategy.h"

static void dt__attach_kernels(void) {
  static int done = 0;
  if (done) return;
  done = 1;
  static const struct {
    const char* name;
    dt_op_kernel_fn k;
  } ks[] = {
      {"mm", dt__kernel_mm},           {"bmm", dt__kernel_bmm},         {"add", dt__kernel_add},
      {"sub", dt__kernel_sub},         {"mul", dt__kernel_mul},         {"div", dt__kernel_div},
      {"maximum", dt__kernel_maximum}, {"minimum", dt__kernel_minimum}, {"neg", dt__kernel_neg},
      {"relu", dt__kernel_relu},       {"exp", dt__kernel_exp},         {"log", dt__kernel_log},
      {"sqrt", dt__kernel_sqrt},       {"rsqrt", dt__kernel_rsqrt},     {"gelu", dt__kernel_gelu},
      {"sigmoid", dt__kernel_sigmoid}, {"silu", dt__kernel_silu},       {"tanh", dt__kernel_tanh},
      {"mul_scalar", dt__kernel_mul_scalar}, {"sum", dt__kernel_sum},
      {"mean", dt__kernel_mean},       {"amax", dt__kernel_amax},       {"amin", dt__kernel_amin},
      {"softmax", dt__kernel_softmax}, {"log_softmax", dt__kernel_log_softmax},
      {"permute", dt__kernel_permute}, {"transpose", dt__kernel_permute},  {"t", dt__kernel_permute},
      {"rms_norm", dt__kernel_rms_norm}, {"layer_norm", dt__kernel_layer_norm},
      {"embedding", dt__kernel_embedding}, {"gather_dim", dt__kernel_gather_dim},
      {"linear", dt__kernel_linear},   {"linear_nobias", dt__kernel_linear},
  };
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) dt__op_set_kernel(ks[i].name, ks[i].k);
  /* One BLAS thread per rank unless the user chose otherwise: ranks already run in parallel. */
  if (getenv("OPENBLAS_NUM_THREADS") == NULL) openblas_set_num_threads(1);
}

/* The kernel's view of a tensor's local shard. */
static void dt__local_view(dt_tensor_t x, dt_local_tensor_t* v) {
  v->dtype = x->dtype;
  v->ndim = x->layout.ndim;
  memcpy(v->shape, x->local_shape, sizeof v->shape);
  memcpy(v->offset, x->local_off, sizeof v->offset);
  v->data = x->data;
}

dt_status_t dt_op_run(const char* name, int n_inputs, const dt_tensor_t* inputs, int n_iargs,
                      const int64_t* iargs, int n_fargs, const double* fargs, dt_tensor_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(inputs);
  if (n_inputs < 1 || n_inputs > DT_OP_MAX_INPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_inputs %d out of range [1, %d]", name, n_inputs,
                   DT_OP_MAX_INPUTS);
  if (n_iargs < 0 || n_iargs > DT_OP_MAX_IARGS || n_fargs < 0 || n_fargs > DT_OP_MAX_FARGS ||
      (n_iargs > 0 && iargs == NULL) || (n_fargs > 0 && fargs == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: bad argument counts or NULL argument arrays", name);
  dt__attach_kernels();
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  call.op = name;
  call.n_inputs = n_inputs;
  call.n_iargs = n_iargs;
  call.n_fargs = n_fargs;
  if (n_iargs) memcpy(call.iargs, iargs, sizeof(int64_t) * (size_t)n_iargs);
  if (n_fargs) memcpy(call.fargs, fargs, sizeof(double) * (size_t)n_fargs);
  dt_placement_t in_pl[DT_OP_MAX_INPUTS][DT_MAX_MESH_DIMS];
  dt_mesh_t mesh = NULL;
  for (int t = 0; t < n_inputs; t++) {
    dt_tensor_t x = inputs[t];
    if (x == NULL || x->magic != DT_TENSOR_MAGIC)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input %d is not a live tensor", name, t);
    if (mesh != NULL && x->mesh != mesh)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: inputs live on different meshes", name);
    mesh = x->mesh;
    call.in[t].dtype = x->dtype;
    call.in[t].ndim = x->layout.ndim;
    memcpy(call.in[t].shape, x->layout.shape, sizeof(int64_t) * (size_t)x->layout.ndim);
    memcpy(in_pl[t], x->layout.pl, sizeof(dt_placement_t) * (size_t)mesh->ndim);
  }
  dt_op_rules_fn rules;
  dt_op_kernel_fn kernel;
  DT_CHECK(dt__op_get_kernel(&call, &rules, &kernel));
  if (kernel == NULL)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s has a sharding strategy but no local kernel", name);
  dt_op_choice_t ch;
  DT_CHECK(dt_op_select(mesh, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl, &ch));
  if (ch.n_outputs != 1)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: ops with %d outputs are not runnable yet", name,
                   ch.n_outputs);

  dt_status_t st = DT_SUCCESS;
  dt_tensor_t moved[DT_OP_MAX_INPUTS] = {NULL}, res = NULL;
  dt_local_tensor_t lin[DT_OP_MAX_INPUTS], lout[DT_OP_MAX_OUTPUTS];
  for (int t = 0; t < n_inputs; t++) {
    dt_tensor_t x = inputs[t];
    int same = 1;
    for (int i = 0; i < mesh->ndim; i++) same &= dt_placement_equal(x->layout.pl[i], ch.in[t][i]);
    if (!same) {
      /* The inputs' layouts change; the redistributed copies live until the kernel ran. */
      DT_CHECK_GOTO(dt_tensor_redistribute(x, ch.in[t], &moved[t]), st, done);
      x = moved[t];
    }
    dt__local_view(x, &lin[t]);
  }
  DT_CHECK_GOTO(dt_tensor_empty(mesh, ch.out_meta[0].dtype, ch.out_meta[0].ndim,
                                ch.out_meta[0].shape, ch.out[0], &res),
                st, done);
  dt__local_view(res, &lout[0]);
  if (mesh->member) DT_CHECK_GOTO(kernel(&call, lin, lout), st, done);
  *out = res;
  res = NULL;
done:
  for (int t = 0; t < n_inputs; t++) dt_tensor_destroy(moved[t]);
  dt_tensor_destroy(res);
  return st;
}

dt_status_t dt_mm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run("mm", 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_bmm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run("bmm", 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_add(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run("add", 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_sub(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run("sub", 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_mul(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run("mul", 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_div(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run("div", 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_linear(dt_tensor_t x, dt_tensor_t weight, dt_tensor_t bias, dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, weight, bias};
  return dt_op_run(bias ? "linear" : "linear_nobias", bias ? 3 : 2, in, 0, NULL, 0, NULL, out);
}
dt_status_t dt_neg(dt_tensor_t a, dt_tensor_t* out) {
  return dt_op_run("neg", 1, &a, 0, NULL, 0, NULL, out);
}
dt_status_t dt_relu(dt_tensor_t a, dt_tensor_t* out) {
  return dt_op_run("relu", 1, &a, 0, NULL, 0, NULL, out);
}

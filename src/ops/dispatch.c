/* dispatch.c - runs ops on distributed tensors: strategy selection (cached), input
 * redistribution, local kernel, output tensor with the chosen placements. */
#include <cblas.h>

#include "ops/ops.h"
#include "strategy/strategy.h"

/* Kernels that move bytes and handle any dtype; every other built-in computes in f32 and gets
 * bf16/f16 inputs converted on load and its float outputs converted on store. */
static const char* const dt__any_dtype_ops[] = {
    "permute", "transpose", "t",      "view",  "reshape", "flatten", "unflatten",
    "squeeze", "unsqueeze", "slice",  "narrow", "cat",    "cast",
};

static int dt__any_dtype(const char* name) {
  for (size_t i = 0; i < sizeof dt__any_dtype_ops / sizeof dt__any_dtype_ops[0]; i++)
    if (strcmp(name, dt__any_dtype_ops[i]) == 0) return 1;
  return 0;
}

static void dt__attach_kernels(void) {
  static int done = 0;
  if (done) return;
  done = 1;
  static const struct {
    const char* name;
    dt_op_kernel_fn k;
  } ks[] = {
      {"mm", dt__kernel_mm},           {"bmm", dt__kernel_bmm},         {"mm_t", dt__kernel_mm_t},         {"add", dt__kernel_add},
      {"sub", dt__kernel_sub},         {"mul", dt__kernel_mul},         {"div", dt__kernel_div},
      {"maximum", dt__kernel_maximum}, {"minimum", dt__kernel_minimum}, {"neg", dt__kernel_neg},
      {"eq", dt__kernel_eq},           {"ge", dt__kernel_ge},           {"gt", dt__kernel_gt},
      {"relu", dt__kernel_relu},       {"exp", dt__kernel_exp},         {"log", dt__kernel_log},
      {"sqrt", dt__kernel_sqrt},       {"rsqrt", dt__kernel_rsqrt},     {"gelu", dt__kernel_gelu},
      {"sigmoid", dt__kernel_sigmoid}, {"silu", dt__kernel_silu},       {"tanh", dt__kernel_tanh},
      {"sum", dt__kernel_sum},         {"mean", dt__kernel_mean},       {"amax", dt__kernel_amax},
      {"amin", dt__kernel_amin},       {"softmax", dt__kernel_softmax},
      {"log_softmax", dt__kernel_log_softmax},                          {"t", dt__kernel_permute},
      {"permute", dt__kernel_permute}, {"transpose", dt__kernel_permute},
      {"rms_norm", dt__kernel_rms_norm}, {"layer_norm", dt__kernel_layer_norm},
      {"embedding", dt__kernel_embedding}, {"gather_dim", dt__kernel_gather_dim},
      {"linear", dt__kernel_linear},   {"linear_nobias", dt__kernel_linear},
      {"view", dt__kernel_view},       {"reshape", dt__kernel_view},    {"flatten", dt__kernel_view},
      {"unflatten", dt__kernel_view},  {"squeeze", dt__kernel_view},    {"unsqueeze", dt__kernel_view},
      {"slice", dt__kernel_slice},     {"narrow", dt__kernel_slice},    {"cat", dt__kernel_cat},
      {"addmm", dt__kernel_addmm},     {"add_scalar", dt__kernel_scalar},
      {"mul_scalar", dt__kernel_scalar}, {"pow", dt__kernel_scalar},    {"cast", dt__kernel_cast},
      {"where", dt__kernel_where},     {"masked_fill", dt__kernel_where}, {"sdpa", dt__kernel_sdpa},
      {"rotary", dt__kernel_rotary},   {"topk", dt__kernel_topk},       {"gather", dt__kernel_gather},
      {"scatter_add", dt__kernel_scatter_add}, {"dropout", dt__kernel_dropout},
      {"act_grad", dt__kernel_act_grad}, {"rms_norm_grad", dt__kernel_rms_norm_grad},
      {"layer_norm_grad", dt__kernel_layer_norm_grad},
      {"embedding_grad", dt__kernel_embedding_grad}, {"sdpa_grad", dt__kernel_sdpa_grad},
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

static int64_t dt__local_numel(const dt_local_tensor_t* v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

static int dt__half(dt_dtype_t t) { return t == DT_BF16 || t == DT_F16; }

/* Converts a bf16/f16 local view to an f32 copy (load) or back (store). */
static void dt__convert(const void* src, dt_dtype_t from, void* dst, dt_dtype_t to, int64_t n) {
  if (from == DT_F32) {
    const float* s = (const float*)src;
    uint16_t* d = (uint16_t*)dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = to == DT_BF16 ? dt__f32_to_bf16(s[i]) : dt__f32_to_f16(s[i]);
  } else {
    const uint16_t* s = (const uint16_t*)src;
    float* d = (float*)dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = from == DT_BF16 ? dt__bf16_to_f32(s[i]) : dt__f16_to_f32(s[i]);
  }
}

dt_status_t dt_op_run_multi(const char* name, int n_inputs, const dt_tensor_t* inputs,
                            int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                            int n_outputs, dt_tensor_t* outs) {
  DT_ARG_NOT_NULL(outs);
  for (int o = 0; o < n_outputs && o < DT_OP_MAX_OUTPUTS; o++) outs[o] = NULL;
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(inputs);
  if (n_inputs < 1 || n_inputs > DT_OP_MAX_INPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_inputs %d out of range [1, %d]", name, n_inputs,
                   DT_OP_MAX_INPUTS);
  if (n_outputs < 1 || n_outputs > DT_OP_MAX_OUTPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_outputs %d out of range [1, %d]", name, n_outputs,
                   DT_OP_MAX_OUTPUTS);
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
    if (dt__tensor_check(x, "input") != DT_SUCCESS)
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
  int builtin = 0;
  DT_CHECK(dt__op_get_kernel(&call, &rules, &kernel, &builtin));
  if (kernel == NULL)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s has a sharding strategy but no local kernel", name);
  dt_op_choice_t ch;
  DT_CHECK(dt_op_select(mesh, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl, &ch));
  if (ch.n_outputs != n_outputs)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s has %d outputs, %d requested", name, ch.n_outputs,
                   n_outputs);

  dt_status_t st = DT_SUCCESS;
  dt_tensor_t moved[DT_OP_MAX_INPUTS] = {NULL}, res[DT_OP_MAX_OUTPUTS] = {NULL};
  dt_local_tensor_t lin[DT_OP_MAX_INPUTS], lout[DT_OP_MAX_OUTPUTS];
  void* tmp_in[DT_OP_MAX_INPUTS] = {NULL};
  void* tmp_out[DT_OP_MAX_OUTPUTS] = {NULL};
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
  for (int o = 0; o < n_outputs; o++) {
    /* built-in kernels write every output element: no zero fill (host kernels get zeros) */
    DT_CHECK_GOTO(dt__tensor_new(mesh, ch.out_meta[o].dtype, ch.out_meta[o].ndim,
                                 ch.out_meta[o].shape, ch.out[o], !builtin || !mesh->member,
                                 &res[o]),
                  st, done);
    dt__local_view(res[o], &lout[o]);
  }
  int any_half = 0;
  for (int t = 0; t < n_inputs; t++) any_half |= dt__half(lin[t].dtype);
  for (int o = 0; o < n_outputs; o++) any_half |= dt__half(lout[o].dtype);
  int convert = any_half && !dt__any_dtype(name);
  if (mesh->member) {
    /* bf16/f16 storage: the kernel sees f32 copies (converted on load, stored back after). */
    for (int t = 0; convert && t < n_inputs; t++) {
      if (!dt__half(lin[t].dtype)) continue;
      int64_t n = dt__local_numel(&lin[t]);
      tmp_in[t] = dt__malloc(sizeof(float) * (size_t)(n ? n : 1));
      if (tmp_in[t] == NULL) {
        st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: f32 copy of input %d", name, t);
        goto done;
      }
      dt__convert(lin[t].data, lin[t].dtype, tmp_in[t], DT_F32, n);
      lin[t].data = tmp_in[t];
      lin[t].dtype = DT_F32;
    }
    for (int o = 0; convert && o < n_outputs; o++) {
      if (!dt__half(lout[o].dtype)) continue;
      int64_t n = dt__local_numel(&lout[o]);
      tmp_out[o] = dt__malloc(sizeof(float) * (size_t)(n ? n : 1));
      if (tmp_out[o] == NULL) {
        st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: f32 buffer of output %d", name, o);
        goto done;
      }
      lout[o].data = tmp_out[o];
      lout[o].dtype = DT_F32;
    }
    DT_CHECK_GOTO(kernel(&call, lin, lout), st, done);
    for (int o = 0; o < n_outputs; o++)
      if (tmp_out[o] != NULL)
        dt__convert(tmp_out[o], DT_F32, res[o]->data, res[o]->dtype, dt__local_numel(&lout[o]));
  }
  for (int o = 0; o < n_outputs; o++) {
    outs[o] = res[o];
    res[o] = NULL;
  }
done:
  for (int t = 0; t < n_inputs; t++) {
    dt_tensor_destroy(moved[t]);
    dt__free(tmp_in[t]);
  }
  for (int o = 0; o < n_outputs; o++) {
    dt_tensor_destroy(res[o]);
    dt__free(tmp_out[o]);
  }
  return st;
}

dt_status_t dt_op_run(const char* name, int n_inputs, const dt_tensor_t* inputs, int n_iargs,
                      const int64_t* iargs, int n_fargs, const double* fargs, dt_tensor_t* out) {
  return dt_op_run_multi(name, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, 1, out);
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

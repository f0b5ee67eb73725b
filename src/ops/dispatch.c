/* dispatch.c - runs ops on distributed tensors by op id: strategy selection (cached), input
 * redistribution, local kernel, output tensor with the chosen placements; composite ops run
 * their forward. Names become ids here, once, at the public boundary. */
#include <cblas.h>

#include "ops/ops.h"
#include "strategy/strategy.h"

static void dt__blas_threads(void) {
  static int done = 0;
  if (done) return;
  done = 1;
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

/* Checks the arguments every op takes (counts, arrays, live tensors on one mesh) and fills the
 * call; *mesh gets the inputs' mesh. */
static dt_status_t dt__call_build(const dt_op_info_t* info, int n_inputs, const dt_tensor_t* inputs,
                                  int n_iargs, const int64_t* iargs, int n_fargs,
                                  const double* fargs, int n_outputs, dt_op_call_t* call,
                                  dt_placement_t in_pl[][DT_MAX_MESH_DIMS], dt_mesh_t* mesh) {
  const char* name = info->name;
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
  memset(call, 0, sizeof *call);
  call->op = name;
  call->n_inputs = n_inputs;
  call->n_iargs = n_iargs;
  call->n_fargs = n_fargs;
  if (n_iargs) memcpy(call->iargs, iargs, sizeof(int64_t) * (size_t)n_iargs);
  if (n_fargs) memcpy(call->fargs, fargs, sizeof(double) * (size_t)n_fargs);
  *mesh = NULL;
  for (int t = 0; t < n_inputs; t++) {
    dt_tensor_t x = inputs[t];
    if (dt__tensor_check(x, "input") != DT_SUCCESS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input %d is not a live tensor", name, t);
    if (*mesh != NULL && x->mesh != *mesh)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: inputs live on different meshes", name);
    *mesh = x->mesh;
    call->in[t].dtype = x->dtype;
    call->in[t].ndim = x->layout.ndim;
    memcpy(call->in[t].shape, x->layout.shape, sizeof(int64_t) * (size_t)x->layout.ndim);
    memcpy(in_pl[t], x->layout.pl, sizeof(dt_placement_t) * (size_t)(*mesh)->ndim);
  }
  return DT_SUCCESS;
}

dt_status_t dt__op_apply(int id, int n_inputs, const dt_tensor_t* inputs, int n_iargs,
                         const int64_t* iargs, int n_fargs, const double* fargs, int n_outputs,
                         dt_tensor_t* outs, dt_tensor_t* saved) {
  DT_ARG_NOT_NULL(outs);
  for (int o = 0; o < n_outputs && o < DT_OP_MAX_OUTPUTS; o++) outs[o] = NULL;
  if (saved) *saved = NULL;
  const dt_op_info_t* info = dt__op_info(id);
  if (info == NULL) return DT_FAIL(DT_ERR_INTERNAL, "op id %d out of range", id);
  const char* name = info->name;
  dt_op_call_t call;
  dt_placement_t in_pl[DT_OP_MAX_INPUTS][DT_MAX_MESH_DIMS];
  dt_mesh_t mesh = NULL;
  DT_CHECK(dt__call_build(info, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs,
                          &call, in_pl, &mesh));
  if (info->composite != NULL) {
    if (n_inputs != info->n_in)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes %d tensor inputs, got %d", name, info->n_in,
                     n_inputs);
    if (n_outputs != info->n_out)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s has %d outputs, %d requested", name, info->n_out,
                     n_outputs);
    DT_CHECK(dt__op_check_counts(id, n_iargs, n_fargs));
    return info->composite(n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, outs, saved);
  }
  dt__blas_threads();
  dt_op_kernel_fn kernel = info->kernel[DT_DEVICE_HOST];
  int builtin = (info->flags & DT_OPF_WRITES_ALL) != 0;
  if (info->rules != NULL && kernel == NULL)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s has a sharding strategy but no local kernel", name);
  dt_op_choice_t ch;
  DT_CHECK(dt__op_select(mesh, id, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl, &ch));
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
  int convert = any_half && !(info->flags & DT_OPF_ANY_DTYPE);
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

dt_status_t dt_op_run_multi(const char* name, int n_inputs, const dt_tensor_t* inputs,
                            int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                            int n_outputs, dt_tensor_t* outs) {
  DT_ARG_NOT_NULL(outs);
  for (int o = 0; o < n_outputs && o < DT_OP_MAX_OUTPUTS; o++) outs[o] = NULL;
  DT_ARG_NOT_NULL(name);
  int id;
  DT_CHECK(dt__op_resolve(name, &id));
  return dt__op_apply(id, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs, outs, NULL);
}

dt_status_t dt_op_run(const char* name, int n_inputs, const dt_tensor_t* inputs, int n_iargs,
                      const int64_t* iargs, int n_fargs, const double* fargs, dt_tensor_t* out) {
  return dt_op_run_multi(name, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, 1, out);
}

dt_status_t dt__opa(int id, int n_in, const dt_tensor_t* in, int n_iargs, const int64_t* iargs,
                    int n_fargs, const double* fargs, dt_tensor_t* out) {
  return dt__op_apply(id, n_in, in, n_iargs, iargs, n_fargs, fargs, 1, out, NULL);
}
dt_status_t dt__op1(int id, dt_tensor_t a, dt_tensor_t* out) {
  return dt__op_apply(id, 1, &a, 0, NULL, 0, NULL, 1, out, NULL);
}
dt_status_t dt__op2(int id, dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt__op_apply(id, 2, in, 0, NULL, 0, NULL, 1, out, NULL);
}

/* redistribute as an op (the autograd node of dt_ag_redistribute): iargs are the encoded target
 * placements, one per mesh dim. */
dt_status_t dt__redistribute_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                 const int64_t* iargs, int n_fargs, const double* fargs,
                                 dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  (void)n_fargs;
  (void)fargs;
  (void)saved;
  dt_placement_t dst[DT_MAX_MESH_DIMS];
  if (n_iargs != in[0]->mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "redistribute takes one placement per mesh dim (%d), got %d",
                   in[0]->mesh->ndim, n_iargs);
  for (int i = 0; i < n_iargs; i++) DT_CHECK(dt_placement_decode(iargs[i], &dst[i]));
  return dt_tensor_redistribute(in[0], dst, &out[0]);
}

dt_status_t dt_mm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  return dt__op2(DT_OP_MM, a, b, out);
}
dt_status_t dt_bmm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  return dt__op2(DT_OP_BMM, a, b, out);
}
dt_status_t dt_add(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  return dt__op2(DT_OP_ADD, a, b, out);
}
dt_status_t dt_sub(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  return dt__op2(DT_OP_SUB, a, b, out);
}
dt_status_t dt_mul(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  return dt__op2(DT_OP_MUL, a, b, out);
}
dt_status_t dt_div(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  return dt__op2(DT_OP_DIV, a, b, out);
}
dt_status_t dt_linear(dt_tensor_t x, dt_tensor_t weight, dt_tensor_t bias, dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, weight, bias};
  return dt__opa(bias ? DT_OP_LINEAR : DT_OP_LINEAR_NOBIAS, bias ? 3 : 2, in, 0, NULL, 0, NULL,
                 out);
}
dt_status_t dt_neg(dt_tensor_t a, dt_tensor_t* out) { return dt__op1(DT_OP_NEG, a, out); }
dt_status_t dt_relu(dt_tensor_t a, dt_tensor_t* out) { return dt__op1(DT_OP_RELU, a, out); }

/* dispatch.c - runs ops on distributed tensors by op id: strategy selection (cached), input
 * redistribution, local kernel, output tensor with the chosen placements; composite ops run
 * their forward. Names become ids here, once, at the public boundary. */
#include <stdio.h>
#include <stdlib.h>

#include "ops/ops.h"
#include "strategy/strategy.h"

void dt__tensor_local_view(dt_tensor_t x, dt_local_tensor_t* v) {
  v->dtype = x->dtype;
  v->ndim = x->layout.ndim;
  memcpy(v->shape, x->local_shape, sizeof v->shape);
  memcpy(v->offset, x->local_off, sizeof v->offset);
  v->data = x->data;
  v->backend = dt__tensor_backend(x);
}

/* ---------------------------------------------------------------------------------------------
 * kernels per backend: the host column of the op table, or a device kernel set */

static struct {
  int filled[DT_KERNELS_COUNT];
  dt_device_kernel_t table[DT_KERNELS_COUNT][DT_OP_COUNT];
} dt__ksets;

static const dt_device_kernel_t* dt__kernel_set(int set) {
  if (set <= DT_KERNELS_HOST || set >= DT_KERNELS_COUNT) return NULL;
  if (!dt__ksets.filled[set]) {
#ifdef DTENSOR_HAVE_CUDA
    if (set == DT_KERNELS_CUDA) dt__cuda_kernels_fill(dt__ksets.table[set]);
#endif
#ifdef DTENSOR_HAVE_SIMT_EMU
    if (set == DT_KERNELS_CUDA_EMU) dt__cudaemu_kernels_fill(dt__ksets.table[set]);
#endif
    dt__ksets.filled[set] = 1;
  }
  return dt__ksets.table[set];
}

size_t dt__op_scratch_nbytes(int id, dt_backend_t b, const dt_op_call_t* call,
                             const dt_local_tensor_t* in, const dt_local_tensor_t* out) {
  const dt_device_kernel_t* set = dt__kernel_set(b->kernel_set);
  const dt_op_info_t* info = dt__op_info(id);
  if (set == NULL || info == NULL || id >= DT_OP_COUNT || info != &dt__op_table[id])
    return dt__kernel_scratch_nbytes(id, call, in);
  return set[id].scratch != NULL ? set[id].scratch(call, in, out) : 0;
}

static dt_status_t dt__sim_set_device_impl(const char* backend) {
  DT_ARG_NOT_NULL(backend);
  int set;
  if (!strcmp(backend, "cpu")) set = DT_KERNELS_HOST;
  else if (!strcmp(backend, "cuda")) set = DT_KERNELS_CUDA;
  else if (!strcmp(backend, "cuda-emu")) set = DT_KERNELS_CUDA_EMU;
  else
    return DT_FAIL(DT_ERR_INVALID_ARG, "unknown device '%s' (cpu, cuda or "
                   "cuda-emu)", backend);
  if (!dt__ctx_simulated())
    return DT_FAIL(DT_ERR_INVALID_USAGE, "the library does not run a "
                   "simulated world (dt_init_simulated)");
  int built = set == DT_KERNELS_HOST;
#ifdef DTENSOR_HAVE_CUDA
  built |= set == DT_KERNELS_CUDA;
#endif
#ifdef DTENSOR_HAVE_SIMT_EMU
  built |= set == DT_KERNELS_CUDA_EMU;
#endif
  if (!built)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "this build has no %s kernels to "
                   "simulate (configure with DTENSOR_CUDA%s)", backend,
                   set == DT_KERNELS_CUDA ? "=ON" : "=ON and DTENSOR_SIMT_EMU=ON");
  if (dt__backend_meta.live_blocks != 0)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "%lld simulated allocations are "
                   "live; choose the device before making tensors",
                   (long long)dt__backend_meta.live_blocks);
  dt__backend_meta_target(set);
  return DT_SUCCESS;
}

dt_status_t dt_sim_set_device(const char* backend) {
  DT_ENTRY_RETURN(dt__sim_set_device_impl(backend));
}

dt_op_kernel_fn dt__op_kernel(int id, dt_backend_t b, unsigned* flags) {
  const dt_op_info_t* info = dt__op_info(id);
  *flags = 0;
  if (info == NULL) return NULL;
  const dt_device_kernel_t* set = dt__kernel_set(b->kernel_set);
  if (set == NULL || id >= DT_OP_COUNT || info != &dt__op_table[id]) {
    /* host kernels, host-registered ops and overrides: the op's own kernel for b's device */
    *flags = (info->flags & DT_OPF_ANY_DTYPE) ? DT_KERNEL_ANY_DTYPE : 0u;
    return info->kernel[dt__backend_kernel_device(b)];
  }
  *flags = set[id].flags & (DT_KERNEL_ANY_DTYPE | DT_KERNEL_ONE_DTYPE);
  return set[id].fn;
}

/* Byte offset at which a slice/narrow output starts inside its input's local shard, when the
 * output's local elements are one contiguous run of it (step 1, and no local dim before the cut
 * holds more than one index); -1 otherwise. */
static int64_t dt__cut_offset(int id, const dt_op_call_t* call, dt_tensor_t x) {
  int dim;
  int64_t start, step, len;
  if (dt__slice_args(id, call, &dim, &start, &step, &len) != DT_SUCCESS) return -1;
  int64_t inner = 1;
  for (int d = 0; d < dim; d++)
    if (x->local_shape[d] != 1 && len != x->local_shape[dim]) return -1;
  if (step != 1 && len > 1) return -1;
  for (int d = dim + 1; d < x->layout.ndim; d++) inner *= x->local_shape[d];
  return start * inner * (int64_t)dt__itemsize(x->dtype);
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
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_inputs=%d out of range [1, %d]", name, n_inputs,
                   DT_OP_MAX_INPUTS);
  int lo = (info->flags & DT_OPF_WRITES_MASK) ? 0 : 1; /* in-place ops return nothing */
  if (n_outputs < lo || n_outputs > DT_OP_MAX_OUTPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_outputs=%d out of range [%d, %d]", name, n_outputs,
                   lo, DT_OP_MAX_OUTPUTS);
  if (n_iargs < 0 || n_iargs > DT_OP_MAX_IARGS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_iargs=%d out of range [0, %d]", name, n_iargs,
                   DT_OP_MAX_IARGS);
  if (n_fargs < 0 || n_fargs > DT_OP_MAX_FARGS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_fargs=%d out of range [0, %d]", name, n_fargs,
                   DT_OP_MAX_FARGS);
  if ((n_iargs > 0 && iargs == NULL) || (n_fargs > 0 && fargs == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "%s: %s is NULL with %s=%d (give the array, or a count of 0)", name, iargs == NULL && n_iargs > 0 ? "iargs" : "fargs",
                   iargs == NULL && n_iargs > 0 ? "n_iargs" : "n_fargs",
                   iargs == NULL && n_iargs > 0 ? n_iargs : n_fargs);
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
    char what[DT_OP_NAME_MAX + 24]; /* "mm: inputs[1] is not a live tensor: it was destroyed" */
    snprintf(what, sizeof what, "%s: inputs[%d]", name, t);
    DT_CHECK(dt__tensor_check(x, what));
    if (*mesh != NULL && x->mesh != *mesh && !(info->flags & DT_OPF_MESHES)) {
      dt_backend_t b0 = dt__tensor_backend(inputs[0]), bt = dt__tensor_backend(x);
      if (b0 == bt)
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: inputs 0 and %d live on different meshes (two "
                       "dt_mesh_t handles, even of one shape, are two meshes): an op takes "
                       "tensors of one mesh", name, t);
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: inputs live on different meshes (input 0 in %s "
                     "memory, backend %s; input %d in %s memory, backend %s)", name,
                     dt_device_name(b0->device), b0->name, t, dt_device_name(bt->device),
                     bt->name);
    }
    if (*mesh == NULL) *mesh = x->mesh;
    call->in[t].dtype = x->dtype;
    call->in[t].ndim = x->layout.ndim;
    memcpy(call->in[t].shape, x->layout.shape, sizeof(int64_t) * (size_t)x->layout.ndim);
    memcpy(in_pl[t], x->layout.pl, sizeof(dt_placement_t) * (size_t)x->mesh->ndim);
  }
  return DT_SUCCESS;
}

static dt_status_t dt__op_apply_impl(int id, int n_inputs, const dt_tensor_t* inputs,
                                     int n_iargs, const int64_t* iargs, int n_fargs,
                                     const double* fargs, int n_outputs, dt_tensor_t* outs,
                                     dt_tensor_t* saved);

dt_status_t dt__op_promote(int id, int n_in, const dt_tensor_t* in, dt_tensor_t* cast) {
  for (int t = 0; t < n_in; t++) cast[t] = NULL;
  const dt_op_info_t* info = dt__op_info(id);
  if (info == NULL || !(info->flags & DT_OPF_PROMOTES_MASK)) return DT_SUCCESS;
  dt_tensor_meta_t m[DT_OP_MAX_INPUTS];
  for (int t = 0; t < n_in; t++) {
    m[t].dtype = in[t]->dtype;
    m[t].ndim = in[t]->layout.ndim;
  }
  dt_dtype_t dtype;
  if (!dt__op_mixed_dtypes(info->flags, n_in, m) ||
      !dt__op_result_dtype(info->flags, n_in, m, &dtype))
    return DT_SUCCESS;
  const int64_t code = (int64_t)dtype;
  for (int t = 0; t < n_in; t++) {
    if (!(info->flags & DT_OPF_PROMOTES_IN(t)) || in[t]->dtype == dtype) continue;
    dt_status_t st = dt__op_apply(DT_OP_CAST, 1, &in[t], 1, &code, 0, NULL, 1, &cast[t], NULL);
    if (st != DT_SUCCESS) {
      for (int u = 0; u < t; u++) {
        dt__tensor_free(cast[u]);
        cast[u] = NULL;
      }
      return st;
    }
  }
  return DT_SUCCESS;
}

/* A promoting op whose operands differ in dtype: the call on the operands cast to the result
 * dtype (PyTorch casts them the same way before its kernel). */
static dt_status_t dt__op_apply_promoted(int id, int n_inputs, const dt_tensor_t* inputs,
                                         int n_iargs, const int64_t* iargs, int n_fargs,
                                         const double* fargs, int n_outputs, dt_tensor_t* outs,
                                         dt_tensor_t* saved) {
  dt_tensor_t cast[DT_OP_MAX_INPUTS], in[DT_OP_MAX_INPUTS];
  DT_CHECK(dt__op_promote(id, n_inputs, inputs, cast));
  for (int t = 0; t < n_inputs; t++) in[t] = cast[t] != NULL ? cast[t] : inputs[t];
  dt_status_t st = dt__op_apply_impl(id, n_inputs, in, n_iargs, iargs, n_fargs, fargs, n_outputs,
                                     outs, saved);
  for (int t = 0; t < n_inputs; t++) dt__tensor_free(cast[t]);
  return st;
}

/* Every op call: timed in the op profile when it is on (dtensor/ops.h; on a device, the op's
 * kernels are waited for, so that its time is its own). */
dt_status_t dt__op_apply(int id, int n_inputs, const dt_tensor_t* inputs, int n_iargs,
                         const int64_t* iargs, int n_fargs, const double* fargs, int n_outputs,
                         dt_tensor_t* outs, dt_tensor_t* saved) {
  if (!dt__prof_on())
    return dt__op_apply_impl(id, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs,
                             outs, saved);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  dt_status_t st = dt__op_apply_impl(id, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs,
                                     n_outputs, outs, saved);
  const dt_op_info_t* info = dt__op_info(id);
  if (info == NULL) { /* refused: nothing to name */
    dt__prof_end(&f, "(unknown op)", DT__PROF_OP);
    return st;
  }
  /* succeeded: the inputs were checked (a failed call may have been given anything) */
  dt_backend_t b = st == DT_SUCCESS && n_inputs > 0 ? dt__tensor_backend(inputs[0]) : NULL;
  if (b != NULL && b->device == DT_DEVICE_CUDA && b->iface->synchronize)
    st = b->iface->synchronize(b);
  dt__prof_end(&f, info->name, DT__PROF_OP);
  return st;
}

static dt_status_t dt__op_apply_impl(int id, int n_inputs, const dt_tensor_t* inputs,
                                     int n_iargs, const int64_t* iargs, int n_fargs,
                                     const double* fargs, int n_outputs, dt_tensor_t* outs,
                                     dt_tensor_t* saved) {
  if (n_outputs > 0) DT_ARG_NOT_NULL(outs);
  for (int o = 0; o < n_outputs && o < DT_OP_MAX_OUTPUTS; o++) outs[o] = NULL;
  if (saved) *saved = NULL;
  dt__progress_all(); /* redistributions in flight advance whenever the library is entered */
  const dt_op_info_t* info = dt__op_info(id);
  if (info == NULL) return DT_FAIL(DT_ERR_INTERNAL, "op id %d out of range", id);
  const char* name = info->name;
  dt_op_call_t call;
  dt_placement_t in_pl[DT_OP_MAX_INPUTS][DT_MAX_MESH_DIMS];
  dt_mesh_t mesh = NULL;
  DT_CHECK(dt__call_build(info, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs,
                          &call, in_pl, &mesh));
  /* operands of different dtypes (add(bf16, f32)): cast to PyTorch's result dtype first; a
   * same-dtype call pays a flag test and a dtype compare */
  if ((info->flags & DT_OPF_PROMOTES_MASK) && dt__op_mixed_dtypes(info->flags, n_inputs, call.in))
    return dt__op_apply_promoted(id, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs,
                                 outs, saved);
  if (info->composite != NULL) {
    if (n_inputs != info->n_in)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_inputs=%d, expected %d (%s takes %d tensor inputs)",
                     name, n_inputs, info->n_in, name, info->n_in);
    if (n_outputs != info->n_out)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_outputs=%d, expected %d (%s has %d output%s%s)",
                     name, n_outputs, info->n_out, name, info->n_out, info->n_out == 1 ? "" : "s",
                     info->n_out == 1 ? "" : ": use dt_op_run_multi");
    DT_CHECK(dt__op_check_counts(id, n_iargs, n_fargs));
    if (!dt__trace_active())
      return info->composite(n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, outs, saved);
    dt_trace_event_t e = {.kind = DT_TRACE_OP, .op = name, .mesh_ndim = mesh->ndim,
                          .n_inputs = n_inputs,
                          .from = (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl};
    dt__trace_emit(&e);
    dt__trace_enter(); /* its pieces one level deeper */
    dt_status_t cst = info->composite(n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, outs,
                                      saved);
    dt__trace_leave();
    return cst;
  }
  unsigned kdtype = 0;
  dt_op_kernel_fn kernel = dt__op_kernel(id, mesh->backend, &kdtype);
  int builtin = (info->flags & DT_OPF_WRITES_ALL) != 0;
  if (info->rules != NULL && info->kernel[DT_DEVICE_HOST] == NULL && kernel == NULL)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s has a sharding strategy but no local kernel", name);
  /* an input updated in place must not share memory with any other input */
  const unsigned writes = info->flags & DT_OPF_WRITES_MASK;
  for (int t = 0; t < n_inputs && writes; t++)
    for (int u = 0; u < n_inputs && (writes & DT_OPF_WRITES_IN(t)); u++)
      if (u != t && dt__tensor_overlap(inputs[t], inputs[u]))
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: input %d is updated in place and shares memory "
                       "with input %d", name, t, u);
  dt_op_choice_t ch;
  DT_CHECK(dt__op_select(mesh, id, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl, &ch));
  if (ch.n_outputs != n_outputs)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: n_outputs=%d, expected %d (%s has %d output%s%s)",
                   name, n_outputs, ch.n_outputs, name, ch.n_outputs, ch.n_outputs == 1 ? "" : "s",
                   ch.n_outputs > 1 && n_outputs == 1 ? ": use dt_op_run_multi" : "");
  const int trace = dt__trace_active();
  if (trace) {
    dt_trace_event_t e = {.kind = DT_TRACE_OP, .op = name, .mesh_ndim = mesh->ndim,
                          .n_inputs = n_inputs,
                          .from = (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl,
                          .choice = &ch};
    dt__trace_emit(&e);
    dt__trace_enter();
  }

  dt_status_t st = DT_SUCCESS;
  dt_tensor_t moved[DT_OP_MAX_INPUTS] = {NULL}, res[DT_OP_MAX_OUTPUTS] = {NULL};
  dt_local_tensor_t lin[DT_OP_MAX_INPUTS], lout[DT_OP_MAX_OUTPUTS];
  dt_tensor_t x0 = NULL; /* the first input as the kernel sees it */
  int meta = 0, nmove = 0, move[DT_OP_MAX_INPUTS] = {0};
  for (int t = 0; t < n_inputs; t++) {
    meta |= inputs[t]->meta;
    for (int i = 0; i < mesh->ndim; i++)
      move[t] |= !dt_placement_equal(inputs[t]->layout.pl[i], ch.in[t][i]);
    nmove += move[t];
  }
  /* The inputs' layouts change; the redistributed copies live until the kernel ran. Several
   * inputs move together: every redistribution starts before the first is waited for. */
  if (nmove > 1 && !meta && mesh->member) {
    dt_work_t work[DT_OP_MAX_INPUTS] = {NULL};
    for (int t = 0; t < n_inputs && st == DT_SUCCESS; t++) {
      if (!move[t]) continue;
      if (trace) dt__trace_input(t);
      st = dt_tensor_redistribute_async(inputs[t], ch.in[t], &moved[t], &work[t]);
    }
    for (int t = 0; t < n_inputs; t++) { /* every started work is completed, even after a failure */
      dt_status_t wst = work[t] ? dt_work_wait(work[t]) : DT_SUCCESS;
      if (st == DT_SUCCESS) st = wst;
      dt_work_destroy(work[t]);
    }
    if (st != DT_SUCCESS) goto done;
  } else {
    for (int t = 0; t < n_inputs; t++) {
      if (!move[t]) continue;
      if (trace) dt__trace_input(t);
      DT_CHECK_GOTO(dt_tensor_redistribute(inputs[t], ch.in[t], &moved[t]), st, done);
    }
  }
  for (int t = 0; t < n_inputs; t++) {
    dt_tensor_t x = moved[t] ? moved[t] : inputs[t];
    if (t == 0) x0 = x;
    dt__tensor_local_view(x, &lin[t]);
  }
  int64_t alias = -1; /* views share the input's storage: no kernel runs */
  if (info->flags & DT_OPF_VIEW) alias = 0;
  if (info->flags & DT_OPF_CUT) alias = dt__cut_offset(id, &call, x0);
  for (int o = 0; o < n_outputs; o++) {
    const dt_tensor_meta_t* om = &ch.out_meta[o];
    if (meta) {
      st = dt__tensor_meta(mesh, om->dtype, om->ndim, om->shape, ch.out[o], &res[o]);
    } else if (alias >= 0) {
      st = dt__tensor_alias(x0, (size_t)alias, om->dtype, om->ndim, om->shape, ch.out[o], &res[o]);
    } else {
      /* built-in kernels write every output element: no zero fill (host kernels get zeros) */
      st = dt__tensor_new(mesh, om->dtype, om->ndim, om->shape, ch.out[o],
                          !builtin || !mesh->member, &res[o]);
    }
    if (st != DT_SUCCESS) goto done;
    dt__tensor_local_view(res[o], &lout[o]);
  }
  if (mesh->member && !meta && alias < 0) {
    dt_backend_t b = mesh->backend;
    for (int t = 0; t < n_inputs; t++) { /* host backends share memory; a device backend, and the
                                          * meta backend (no memory), have their own */
      dt_backend_t ib = lin[t].backend;
      if (ib != b && (ib->device != DT_DEVICE_HOST || b->device != DT_DEVICE_HOST)) {
        st = DT_FAIL(DT_ERR_INVALID_ARG, "%s: input %d lives in %s memory (backend %s), the "
                     "mesh computes on %s (backend %s): move it with dt_tensor_copy_local or "
                     "create it on the mesh", name, t, dt_device_name(ib->device), ib->name,
                     dt_device_name(b->device), b->name);
        goto done;
      }
    }
    if (kernel == NULL) {
      st = DT_FAIL(DT_ERR_UNSUPPORTED, "%s has no kernel for the %s backend", name, b->name);
      goto done;
    }
    unsigned kf = kdtype |
                  ((info->flags & DT_OPF_WRITES_ALL) ? DT_KERNEL_WRITES_ALL : 0u) |
                  (writes ? DT_KERNEL_INPLACE : 0u);
    if (b->device == DT_DEVICE_META) { /* the simulated kernel: the real one's scratch and time */
      dt__backend_meta_scratch(dt__op_scratch_nbytes(id, b, &call, lin, lout));
      double f, nb, us = dt__op_sim_us(id, &call, lin, n_inputs, lout, n_outputs,
                                       dt__run_kernel_converts(kf, lin, n_inputs, lout,
                                                               n_outputs),
                                       &f, &nb);
      dt__sim_clock_t* ck = dt__sim_clock();
      ck->flops += f;
      ck->nbytes += nb;
      ck->ops++;
      dt__sim_compute(us);
    }
    /* $DTENSOR_CHECK_SCRATCH=1 (tests): the scratch a kernel held ("other" above its start) must
     * be what a simulated run counts for it: its f32 copies and its scratch function's bytes */
    static int check_scratch = -1;
    if (check_scratch < 0) {
      const char* e = getenv("DTENSOR_CHECK_SCRATCH");
      check_scratch = e != NULL && strcmp(e, "1") == 0;
    }
    const int check = check_scratch && b->device != DT_DEVICE_META;
    size_t want = 0;
    int64_t w0 = 0, peak0 = 0;
    if (check) {
      want = dt__run_kernel_copies_nbytes(kf, lin, n_inputs, lout, n_outputs) +
             dt__op_scratch_nbytes(id, b, &call, lin, lout);
      w0 = dt__mem_window_begin(DT_MEM_OTHER, &peak0);
    }
    st = b->iface->run_kernel(b, kernel, kf, &call, lin, n_inputs, lout, n_outputs);
    if (check) {
      const int64_t held = dt__mem_window_end(DT_MEM_OTHER, w0, peak0);
      if (st == DT_SUCCESS && held != (int64_t)want)
        st = DT_FAIL(DT_ERR_INTERNAL, "%s on backend %s: the kernel held %lld bytes of scratch, "
                     "a simulated run counts %zu (DTENSOR_CHECK_SCRATCH)", name, b->name,
                     (long long)held, want);
    }
    /* a value only some ranks hold may be rejected: every rank returns the same status before
     * any goes on to its next collective (a cast to a float type rejects nothing) */
    if ((info->flags & DT_OPF_CHECKS_DATA) &&
        !(id == DT_OP_CAST && dt__dtype_is_float(ch.out_meta[0].dtype)))
      st = dt__mesh_agree(mesh, st, name);
    if (st != DT_SUCCESS) goto done;
  }
  for (int o = 0; o < n_outputs; o++) {
    outs[o] = res[o];
    res[o] = NULL;
  }
done:
  if (trace) {
    dt__trace_input(-1);
    dt__trace_leave();
  }
  for (int t = 0; t < n_inputs; t++) dt__tensor_free(moved[t]);
  for (int o = 0; o < n_outputs; o++) dt__tensor_free(res[o]);
  return st;
}

static dt_status_t dt__op_run_multi(const char* name, int n_inputs, const dt_tensor_t* inputs,
                                    int n_iargs, const int64_t* iargs, int n_fargs,
                                    const double* fargs, int n_outputs, dt_tensor_t* outs) {
  if (n_outputs > 0) DT_ARG_NOT_NULL(outs);
  for (int o = 0; o < n_outputs && o < DT_OP_MAX_OUTPUTS; o++) outs[o] = NULL;
  int id;
  DT_CHECK(dt__op_resolve(name, &id));
  return dt__op_apply(id, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, n_outputs, outs, NULL);
}

/* The public entry points name themselves (DT_ENTRY_RETURN): a failure anywhere below reads
 * "dt_op_run: ..." (see dtensor/status.h). */
dt_status_t dt_op_run_multi(const char* name, int n_inputs, const dt_tensor_t* inputs,
                            int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                            int n_outputs, dt_tensor_t* outs) {
  DT_ENTRY_RETURN(dt__op_run_multi(name, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs,
                                   n_outputs, outs));
}

dt_status_t dt_op_run(const char* name, int n_inputs, const dt_tensor_t* inputs, int n_iargs,
                      const int64_t* iargs, int n_fargs, const double* fargs, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op_run_multi(name, n_inputs, inputs, n_iargs, iargs, n_fargs, fargs, 1, out));
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
  DT_ENTRY_RETURN(dt__op2(DT_OP_MM, a, b, out));
}
dt_status_t dt_bmm(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op2(DT_OP_BMM, a, b, out));
}
dt_status_t dt_add(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op2(DT_OP_ADD, a, b, out));
}
dt_status_t dt_sub(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op2(DT_OP_SUB, a, b, out));
}
dt_status_t dt_mul(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op2(DT_OP_MUL, a, b, out));
}
dt_status_t dt_div(dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op2(DT_OP_DIV, a, b, out));
}
dt_status_t dt_linear(dt_tensor_t x, dt_tensor_t weight, dt_tensor_t bias, dt_tensor_t* out) {
  dt_tensor_t in[3] = {x, weight, bias};
  DT_ENTRY_RETURN(dt__opa(bias ? DT_OP_LINEAR : DT_OP_LINEAR_NOBIAS, bias ? 3 : 2, in, 0, NULL, 0,
                          NULL, out));
}
dt_status_t dt_neg(dt_tensor_t a, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op1(DT_OP_NEG, a, out));
}
dt_status_t dt_relu(dt_tensor_t a, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt__op1(DT_OP_RELU, a, out));
}

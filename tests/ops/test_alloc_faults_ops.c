/* test_alloc_faults_ops.c - fault injection, op by op: every allocation an op makes may fail.
 *
 * For each op of the table, its valid call of op_specs.h is run on inputs replicated and then
 * sharded on dim 0, in f32, again with its f32 inputs as bf16 where the op takes them, and with
 * only its first f32 input as bf16 (mixed dtypes: the ops that promote cast it first, on the
 * tape as a recorded cast): forward through dt_op_run_multi, then, for an op with a backward
 * rule, recorded
 * on a tape (floating inputs as leaves that require a gradient), summed to a scalar and
 * differentiated. Linked with --wrap=malloc,calloc,realloc (dtensor's code and this program, not
 * Open MPI's or libc's own), the call is made once to count its allocations and then once per
 * allocation k with the k-th failing. Each run must end without a crash, a failing call must
 * return a status with a message (no partial outputs left to the caller), everything is freed
 * (ASan's leak check sees no leak), a run that absorbs the failure gives the reference bytes, and
 * a clean run after the faults gives them too (no damaged cache or pool). One rank: an
 * allocation failure is rank-local. DT_FAULT_OP=name runs one op. With DTENSOR_BACKEND=cuda-emu
 * (test_alloc_faults_ops_np1_emu) the CUDA kernels' paths run, device memory failing too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_fault_inject.h"
#include "dt_test.h"
#include "dtensor/autograd.h"

#include "op_specs.h"


#define MAX_BYTES (1 << 16)
typedef struct {
  unsigned char b[MAX_BYTES];
  size_t n;
} bytes_t;

/* Appends t's dtype, shape and local values to out. */
static dt_status_t append(bytes_t* out, dt_tensor_t t) {
  dt_dtype_t dt;
  int nd;
  int64_t shape[DT_MAX_DIMS], n;
  size_t isz;
  dt_status_t st = dt_tensor_dtype(t, &dt);
  if (st == DT_SUCCESS) st = dt_tensor_ndim(t, &nd);
  if (st == DT_SUCCESS) st = dt_tensor_shape(t, shape);
  if (st == DT_SUCCESS) st = dt_tensor_local_numel(t, &n);
  if (st == DT_SUCCESS) st = dt_dtype_itemsize(dt, &isz);
  if (st != DT_SUCCESS) return st;
  size_t need = sizeof dt + sizeof nd + sizeof(int64_t) * (size_t)nd + isz * (size_t)n;
  DT_ASSERT_TRUE(out->n + need <= MAX_BYTES, "results over %d bytes", MAX_BYTES);
  memcpy(out->b + out->n, &dt, sizeof dt);
  memcpy(out->b + out->n + sizeof dt, &nd, sizeof nd);
  memcpy(out->b + out->n + sizeof dt + sizeof nd, shape, sizeof(int64_t) * (size_t)nd);
  out->n += sizeof dt + sizeof nd + sizeof(int64_t) * (size_t)nd;
  if (n > 0) st = dt_tensor_read_local(t, 0, n, out->b + out->n);
  out->n += isz * (size_t)n;
  return st;
}

static int is_float(dt_dtype_t d) { return d == DT_F32 || d == DT_BF16 || d == DT_F16; }

typedef struct {
  dt_mesh_t mesh;
  const spec_t* sp;
  int shard; /* inputs Shard(0) where they have a dim, else replicated */
  int bf16;  /* 1: the row's f32 inputs as bf16; 2: its first f32 input only (type promotion) */
  int ni, nf;
  int64_t iv[DT_OP_MAX_IARGS];
  double fv[DT_OP_MAX_FARGS];
  dt_op_desc_t d;
} call_t;

/* The call's inputs; *n_made of them made (destroyed by the caller on every path). */
static dt_status_t inputs(const call_t* c, dt_tensor_t* in, int* n_made) {
  *n_made = 0;
  for (int t = 0; t < c->sp->n_in; t++) {
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = dt_replicate();
    if (c->shard && c->sp->in[t].ndim > 0) pl[0] = dt_shard(0);
    in_t s = c->sp->in[t];
    int first = 1; /* no f32 input before t */
    for (int u = 0; u < t; u++) first &= c->sp->in[u].dtype != DT_F32;
    if (s.dtype == DT_F32 && (c->bf16 == 1 || (c->bf16 == 2 && first))) s.dtype = DT_BF16;
    dt_status_t st = spec_input(c->mesh, &s, t, 1, pl, &in[t]);
    if (st != DT_SUCCESS) return st;
    (*n_made)++;
  }
  return DT_SUCCESS;
}

/* One run: the forward call, then the backward pass where the op has one; the results' bytes
 * in *out. Frees everything it made on every path. */
static dt_status_t run(const call_t* c, bytes_t* out) {
  out->n = 0;
  dt_tensor_t in[DT_OP_MAX_INPUTS] = {NULL}, outs[DT_OP_MAX_OUTPUTS] = {NULL};
  int made = 0;
  dt_status_t st = inputs(c, in, &made);
  if (st == DT_SUCCESS)
    st = dt_op_run_multi(c->sp->op, c->sp->n_in, in, c->ni, c->iv, c->nf, c->fv, c->d.n_outputs,
                         outs);
  for (int o = 0; o < c->d.n_outputs; o++) {
    if (st == DT_SUCCESS) st = append(out, outs[o]);
    else DT_ASSERT_TRUE(outs[o] == NULL, "%s failed (%s) and left output %d", c->sp->op,
                        dt_status_name(st), o);
    dt_tensor_destroy(outs[o]);
  }
  for (int t = 0; t < made; t++) {
    if (st == DT_SUCCESS && (c->d.in_place & (1u << t))) st = append(out, in[t]);
    dt_tensor_destroy(in[t]);
  }
  if (st != DT_SUCCESS || !c->d.has_backward || !dt_ag_has_backward(c->sp->op)) return st;
  /* the backward pass: d sum(output 0) / d each floating input */
  dt_tape_t tape = NULL;
  dt_var_t v[DT_OP_MAX_INPUTS] = {NULL}, y[DT_OP_MAX_OUTPUTS] = {NULL}, loss = NULL;
  int nv = 0;
  st = dt_tape_create(&tape);
  made = 0;
  if (st == DT_SUCCESS) st = inputs(c, in, &made);
  for (; nv < made && st == DT_SUCCESS; nv++) {
    dt_dtype_t dt;
    st = dt_tensor_dtype(in[nv], &dt);
    if (st == DT_SUCCESS) st = dt_var_leaf(in[nv], is_float(dt), &v[nv]);
    if (st != DT_SUCCESS) break;
    in[nv] = NULL; /* the variable's now */
  }
  for (int t = 0; t < made; t++) dt_tensor_destroy(in[t]);
  if (st == DT_SUCCESS)
    st = dt_ag_op(tape, c->sp->op, c->sp->n_in, v, c->ni, c->iv, c->nf, c->fv, c->d.n_outputs, y);
  dt_dtype_t od = DT_I64;
  if (st == DT_SUCCESS) st = dt_tensor_dtype(dt_var_value(y[0]), &od);
  if (st == DT_SUCCESS && is_float(od)) {
    st = dt_ag_op(tape, "sum", 1, y, 0, NULL, 0, NULL, 1, &loss);
    if (st == DT_SUCCESS) st = dt_tape_backward(tape, loss);
    for (int t = 0; t < nv && st == DT_SUCCESS; t++)
      if (dt_var_grad(v[t]) != NULL) st = append(out, dt_var_grad(v[t]));
  }
  dt_tape_destroy(tape);
  for (int t = 0; t < nv; t++) dt_var_destroy(v[t]);
  return st;
}

static bytes_t g_ref, g_got;
static long g_mixed_allocs; /* allocations of the calls with mixed dtypes that ran */
static int g_mixed_calls;

static const char* mode(const call_t* c) {
  return c->bf16 == 1 ? ", bf16" : c->bf16 == 2 ? ", mixed" : "";
}

/* Fails each allocation of the call in turn; returns the number of allocations (0: a bf16 or
 * mixed call the op refuses). */
static long inject(const call_t* c) {
  int n_f32 = 0;
  for (int t = 0; t < c->sp->n_in; t++) n_f32 += c->sp->in[t].dtype == DT_F32;
  if (c->bf16 == 2 && n_f32 < 2) return 0; /* nothing to mix */
  dt_status_t warm = run(c, &g_ref); /* warm: plan and strategy caches */
  if (warm != DT_SUCCESS && c->bf16) return 0;
  DT_ASSERT_OK(warm);
  g_count = 0;
  DT_ASSERT_OK(run(c, &g_ref));
  long total = g_count;
  if (getenv("DT_FAULT_OP")) printf("%s: %ld allocations, %zu bytes of results\n", c->sp->op, total, g_ref.n);
  for (long k = 1; k <= total; k++) {
    g_count = 0;
    g_fail_at = k;
    dt_clear_error();
    dt_status_t st = run(c, &g_got);
    g_fail_at = -1;
    if (st != DT_SUCCESS)
      DT_ASSERT_TRUE(strlen(dt_last_error()) > 0, "%s (%s%s): allocation %ld failed: %s with no "
                     "message", c->sp->op, c->shard ? "sharded" : "replicated", mode(c), k,
                     dt_status_name(st));
    else
      DT_ASSERT_TRUE(g_got.n == g_ref.n && memcmp(g_got.b, g_ref.b, g_ref.n) == 0,
                     "%s (%s%s): allocation %ld failed, the call succeeded with other results",
                     c->sp->op, c->shard ? "sharded" : "replicated", mode(c), k);
  }
  if (c->bf16 == 2) {
    g_mixed_allocs += total;
    g_mixed_calls++;
  }
  g_count = 0;
  DT_ASSERT_OK(run(c, &g_got));
  DT_ASSERT_TRUE(g_got.n == g_ref.n && memcmp(g_got.b, g_ref.b, g_ref.n) == 0,
                 "%s (%s%s): other results after the faults", c->sp->op,
                 c->shard ? "sharded" : "replicated", mode(c));
  return total;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_TRUE(world == 1, "a single-rank test (allocation failures are rank-local)");
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  const char* only = getenv("DT_FAULT_OP");
  int n_ops;
  DT_ASSERT_OK(dt_op_count(&n_ops));
  long total = 0;
  int ops = 0;
  for (int i = 0; i < n_ops; i++) {
    const spec_t* sp = spec_at(i);
    if (sp == NULL || (only && strcmp(only, sp->op) != 0)) continue;
    call_t c;
    memset(&c, 0, sizeof c);
    c.mesh = mesh;
    c.sp = sp;
    DT_ASSERT_OK(dt_op_describe(sp->op, &c.d));
    const char* as[4];
    int n = 0;
    for (int k = 0; k < 4 && sp->req[k]; k++) as[n++] = sp->req[k];
    DT_ASSERT_OK(dt_op_args_parse(sp->op, n, as, &c.ni, c.iv, &c.nf, c.fv));
    for (c.bf16 = 0; c.bf16 < 3; c.bf16++)
      for (c.shard = 0; c.shard < 2; c.shard++) total += inject(&c);
    ops++;
  }
  DT_ASSERT_TRUE(ops > 0, "no op ran");
  /* add, sub, mul, div, maximum, minimum, eq, ge, gt and where, replicated and sharded */
  DT_ASSERT_TRUE(only != NULL || g_mixed_calls >= 20, "%d promoted calls", g_mixed_calls);
  printf("test_alloc_faults_ops: %d ops, replicated and sharded, f32, bf16 and mixed, forward and "
         "backward: each of %ld allocations failed in turn (%ld in %d promoted calls)\n", ops, total,
         g_mixed_allocs, g_mixed_calls);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

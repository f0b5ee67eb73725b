/* test_fsdp_root.c - FSDP of modules without parameters of their own (FSDP2's usual pattern: wrap
 * each child, then the root), np 1, 2 and 4.
 *
 * Tree: root "" (no parameters; forward: body, head, mean cross-entropy against the targets)
 *         body (no parameters; forward: l0, silu, l1, silu, l2, silu)
 *           l0 weight (13, 7) + bias, l1 (13, 13) + bias, l2 (13, 13) + bias
 *         head weight (5, 13), no bias
 * Uneven shapes (dim 0 of 13 and 5 rows over 2 or 4 ranks), so the chunk rule pads.
 *
 *  - wrapping l0, l1, l2, head, then body and the root (both left with no parameter: groups
 *    with no buffer that only schedule their children) is accepted; 12 AdamW steps give the
 *    losses of the unwrapped run (batch and parameters replicated) within 1e-5 relative, with
 *    reshard after forward 1, 0 and 2 (even rank counts), prefetch on and off, without the body
 *    group, without the root group, and within 0.05 with bf16 parameters; the loss falls;
 *  - the parameterless groups hold 0 parameters and never gather or reduce; every sharded
 *    parameter has its gradient when dt_tape_backward returns (the root's backward finished
 *    every reduction);
 *  - prefetch: the root group schedules its children: once a step has taught the orders, each
 *    group with parameters is gathered ahead of need twice per step (the root's forward starts
 *    l0's gather, looking past the empty body group; head's backward starts l2's). Without a root
 *    group each child is outermost and nothing is prefetched;
 *  - wrapping top-down (the root first, then a child) is refused with a message that names both
 *    modules and says to wrap bottom-up; a module under a DDP-wrapped one likewise.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

#define STEPS 12
#define BATCH 8
#define D_IN 7
#define HID 13
#define CLASSES 5
#define N_LIN 3

static int g_world, g_rank;

/* ---- the model ---------------------------------------------------------------------------- */

static dt_status_t fwd_linear(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                              int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  return dt_nn_linear(tape, in[0], dt_module_get(m, "weight"), dt_module_get(m, "bias"), &out[0]);
}

static dt_status_t fwd_body(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                            int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_var_t h = in[0];
  for (int i = 0; i < N_LIN; i++) {
    dt_module_t c;
    DT_CHECK(dt_module_child(m, i, &c));
    DT_CHECK(dt_module_forward(c, tape, 1, &h, 1, &h));
    DT_CHECK(dt_ag_op(tape, "silu", 1, &h, 0, NULL, 0, NULL, 1, &h));
  }
  out[0] = h;
  return DT_SUCCESS;
}

/* (x (B, D_IN), targets (B)) -> loss */
static dt_status_t fwd_root(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                            int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_module_t body, head;
  dt_var_t h, logits;
  DT_CHECK(dt_module_find(m, "body", &body));
  DT_CHECK(dt_module_find(m, "head", &head));
  DT_CHECK(dt_module_forward(body, tape, 1, &in[0], 1, &h));
  DT_CHECK(dt_module_forward(head, tape, 1, &h, 1, &logits));
  dt_dtype_t t;
  DT_CHECK(dt_tensor_dtype(dt_var_value(logits), &t));
  if (t != DT_F32) { /* the loss in f32 */
    const int64_t to = DT_F32;
    DT_CHECK(dt_ag_op(tape, "cast", 1, &logits, 1, &to, 0, NULL, 1, &logits));
  }
  return dt_ag_cross_entropy(tape, logits, in[1], &out[0]);
}

static dt_module_t linear(dt_mesh_t mesh, const char* name, int64_t out_f, int64_t in_f,
                          int bias) {
  dt_module_t m;
  DT_ASSERT_OK(dt_module_create(name, fwd_linear, NULL, &m));
  const int64_t ws[2] = {out_f, in_f};
  dt_var_t w, b;
  char full[32];
  snprintf(full, sizeof full, "%s.weight", name);
  DT_ASSERT_OK(dt_nn_param(mesh, NULL, full, 2, ws, DT_INIT_NORMAL, 0.3, 7, &w));
  DT_ASSERT_OK(dt_module_add_param(m, "weight", w));
  if (bias) {
    snprintf(full, sizeof full, "%s.bias", name);
    DT_ASSERT_OK(dt_nn_param(mesh, NULL, full, 1, &out_f, DT_INIT_NORMAL, 0.1, 7, &b));
    DT_ASSERT_OK(dt_module_add_param(m, "bias", b));
  }
  return m;
}

static dt_module_t build(dt_mesh_t mesh) {
  dt_module_t root, body;
  DT_ASSERT_OK(dt_module_create("", fwd_root, NULL, &root));
  DT_ASSERT_OK(dt_module_create("body", fwd_body, NULL, &body));
  DT_ASSERT_OK(dt_module_add_child(root, body));
  DT_ASSERT_OK(dt_module_add_child(body, linear(mesh, "l0", HID, D_IN, 1)));
  DT_ASSERT_OK(dt_module_add_child(body, linear(mesh, "l1", HID, HID, 1)));
  DT_ASSERT_OK(dt_module_add_child(body, linear(mesh, "l2", HID, HID, 1)));
  DT_ASSERT_OK(dt_module_add_child(root, linear(mesh, "head", CLASSES, HID, 0)));
  return root;
}

/* ---- runs --------------------------------------------------------------------------------- */

typedef struct {
  int fsdp;           /* 0: the unwrapped reference */
  int wrap_body;      /* body becomes a (parameterless) group */
  int wrap_root;      /* the root becomes a (parameterless) group */
  int reshard, prefetch;
  dt_dtype_t param_dtype;
} run_t;

/* The wrapped modules with parameters, in forward order. */
static const char* const kGroups[4] = {"body.l0", "body.l1", "body.l2", "head"};

static void wrap(dt_module_t root, dt_mesh_t mesh, const run_t* r) {
  dt_fsdp_config_t fc = dt_fsdp_config_default(1);
  fc.reshard_after_forward = r->reshard;
  fc.prefetch_forward = fc.prefetch_backward = r->prefetch;
  fc.param_dtype = r->param_dtype;
  for (int i = 0; i < 4; i++) {
    dt_module_t c;
    DT_ASSERT_OK(dt_module_find(root, kGroups[i], &c));
    DT_ASSERT_OK(dt_fully_shard(c, mesh, &fc));
  }
  if (r->wrap_body) {
    dt_module_t body;
    DT_ASSERT_OK(dt_module_find(root, "body", &body));
    DT_ASSERT_OK(dt_fully_shard(body, mesh, &fc));
  }
  if (r->wrap_root) {
    fc.output_dtype = DT_F32;
    DT_ASSERT_OK(dt_fully_shard(root, mesh, &fc));
  }
}

static int collect(const char* name, dt_var_t v, void* ctx) {
  (void)name;
  dt_var_t** p = ctx;
  *(*p)++ = v;
  return 0;
}

/* Trains STEPS steps; losses[step]; prefetched[i]: the prefetches of group kGroups[i] over the
 * steps after the first. */
static void train(const run_t* r, float* losses, int64_t* prefetched) {
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  dt_module_t root = build(mesh);
  if (r->fsdp) wrap(root, mesh, r);
  int np;
  DT_ASSERT_OK(dt_module_num_params(root, &np));
  DT_ASSERT_EQ(np, 7);
  dt_var_t params[7], *w = params;
  DT_ASSERT_OK(dt_module_for_each_param(root, collect, &w));
  dt_adamw_config_t ac = {1e-2, 0.9, 0.95, 1e-8, 0.0, 0};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&ac, np, params, &opt));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_fsdp_group_info_t first[4];
  for (int step = 0; step < STEPS; step++) {
    float x[BATCH * D_IN];
    int64_t tgt[BATCH];
    for (int b = 0; b < BATCH; b++) {
      for (int d = 0; d < D_IN; d++) x[b * D_IN + d] = (float)sin(1.3 * b + 0.7 * d);
      tgt[b] = (b * 3) % CLASSES; /* one batch, fitted step after step */
    }
    dt_placement_t pl = r->fsdp ? dt_shard(0) : dt_replicate();
    const int64_t xs[2] = {BATCH, D_IN}, ts[1] = {BATCH};
    dt_tensor_t xt, tt;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, xs, &pl, x, &xt));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, ts, &pl, tgt, &tt));
    dt_var_t io[2], loss;
    DT_ASSERT_OK(dt_tape_constant(tape, xt, &io[0]));
    DT_ASSERT_OK(dt_tape_constant(tape, tt, &io[1]));
    DT_ASSERT_OK(dt_module_forward(root, tape, 2, io, 1, &loss));
    dt_dtype_t ldt;
    DT_ASSERT_OK(dt_tensor_dtype(dt_var_value(loss), &ldt));
    DT_ASSERT_TRUE(ldt == DT_F32, "loss dtype %s", dt_dtype_name(ldt));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(loss), &losses[step], sizeof(float)));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_tape_reset(tape));
    /* the reductions are finished: every parameter has its (sharded) gradient */
    for (int i = 0; i < np; i++) {
      dt_placement_t gp;
      DT_ASSERT_TRUE(dt_var_grad(params[i]) != NULL, "step %d: parameter %d has no gradient "
                     "after the backward pass", step, i);
      DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(params[i]), &gp));
      DT_ASSERT_TRUE(gp.kind == (r->fsdp ? DT_SHARD : DT_REPLICATE), "step %d: parameter %d's "
                     "gradient is not placed as the parameter", step, i);
    }
    DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
    for (int i = 0; i < np; i++) DT_ASSERT_OK(dt_var_zero_grad(params[i]));
    if (r->fsdp && step == 0)
      for (int i = 0; i < 4; i++) {
        dt_module_t c;
        DT_ASSERT_OK(dt_module_find(root, kGroups[i], &c));
        DT_ASSERT_OK(dt_fsdp_group_info(c, &first[i]));
      }
  }
  for (int i = 0; r->fsdp && i < 4; i++) {
    dt_module_t c;
    dt_fsdp_group_info_t gi;
    DT_ASSERT_OK(dt_module_find(root, kGroups[i], &c));
    DT_ASSERT_OK(dt_fsdp_group_info(c, &gi));
    DT_ASSERT_TRUE(gi.n_params == (i < 3 ? 2 : 1) && gi.reductions == STEPS &&
                   gi.shard_size == g_world, "group %s: %d parameters, %lld reductions",
                   kGroups[i], gi.n_params, (long long)gi.reductions);
    prefetched[i] = gi.prefetched - first[i].prefetched;
  }
  /* the parameterless groups: nothing held, gathered or reduced */
  const char* empty[2] = {"body", ""};
  const int wrapped[2] = {r->fsdp && r->wrap_body, r->fsdp && r->wrap_root};
  for (int i = 0; i < 2; i++) {
    dt_module_t c;
    DT_ASSERT_OK(dt_module_find(root, empty[i], &c));
    DT_ASSERT_EQ(dt_fsdp_is_group(c), wrapped[i]);
    if (!wrapped[i]) continue;
    dt_fsdp_group_info_t gi;
    DT_ASSERT_OK(dt_fsdp_group_info(c, &gi));
    DT_ASSERT_TRUE(gi.n_params == 0 && gi.numel == 0 && gi.padded_numel == 0 &&
                   gi.unsharded_nbytes == 0 && gi.gathers == 0 && gi.reductions == 0,
                   "parameterless group '%s': %d parameters, %lld elements, %lld gathers, %lld "
                   "reductions", empty[i], gi.n_params, (long long)gi.numel,
                   (long long)gi.gathers, (long long)gi.reductions);
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_module_destroy(root));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

static void parity(const char* what, const run_t* r, const float* ref, double tol,
                   int64_t want_prefetched) {
  float l[STEPS];
  int64_t pf[4] = {0, 0, 0, 0};
  train(r, l, pf);
  double worst = 0;
  for (int s = 0; s < STEPS; s++) {
    double d = fabs((double)l[s] - ref[s]) / fabs((double)ref[s]);
    if (d > worst) worst = d;
  }
  if (g_rank == 0)
    printf("%-38s np %d: worst relative loss difference %.3g over %d steps (first %.5f last "
           "%.5f); prefetched per group after step 0: %lld %lld %lld %lld\n", what, g_world,
           worst, STEPS, l[0], l[STEPS - 1], (long long)pf[0], (long long)pf[1],
           (long long)pf[2], (long long)pf[3]);
  DT_ASSERT_TRUE(worst <= tol, "%s: worst relative difference %.3g above %.1g", what, worst, tol);
  DT_ASSERT_TRUE(l[STEPS - 1] < l[0], "%s: the loss did not fall", what);
  if (want_prefetched >= 0)
    for (int i = 0; i < 4; i++)
      DT_ASSERT_TRUE(pf[i] == want_prefetched, "%s: group %s prefetched %lld times in %d steps, "
                     "expected %lld", what, kGroups[i], (long long)pf[i], STEPS - 1,
                     (long long)want_prefetched);
}

static void test_parity(void) {
  run_t r;
  memset(&r, 0, sizeof r);
  r.param_dtype = DT_F32;
  float ref[STEPS];
  int64_t pf[4];
  train(&r, ref, pf);
  const int64_t both_ways = 2 * (STEPS - 1); /* forward and backward, every step after the first */
  r.fsdp = r.wrap_body = r.wrap_root = 1;
  r.reshard = r.prefetch = 1;
  parity("children, body, root (reshard, prefetch)", &r, ref, 1e-5, both_ways);
  r.reshard = 0;
  parity("children, body, root (no reshard)", &r, ref, 1e-5, STEPS - 1); /* gathered still */
  r.reshard = 1;
  r.prefetch = 0;
  parity("children, body, root (no prefetch)", &r, ref, 1e-5, 0);
  r.prefetch = 1;
  if (g_world % 2 == 0) {
    r.reshard = 2;
    parity("children, body, root (reshard to 2)", &r, ref, 1e-5, -1);
    r.reshard = 1;
  }
  r.wrap_body = 0;
  parity("children, root", &r, ref, 1e-5, both_ways);
  r.wrap_root = 0; /* each child outermost: every pass starts afresh, nothing prefetched */
  parity("children only (no root group)", &r, ref, 1e-5, 0);
  r.wrap_body = r.wrap_root = 1;
  r.param_dtype = DT_BF16;
  parity("children, body, root (bf16 parameters)", &r, ref, 0.05, -1);
}

static void test_top_down(void) {
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  dt_module_t root = build(mesh), l0, body;
  dt_fsdp_config_t fc = dt_fsdp_config_default(1);
  DT_ASSERT_OK(dt_fully_shard(root, mesh, &fc)); /* takes every parameter */
  DT_ASSERT_OK(dt_module_find(root, "body.l0", &l0));
  DT_ASSERT_STATUS(dt_fully_shard(l0, mesh, &fc), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "module 'body.l0' is inside the root module, which was "
                        "wrapped (FSDP) before it") != NULL &&
                 strstr(dt_last_error(), "wrap bottom-up") != NULL, "message: %s",
                 dt_last_error());
  DT_ASSERT_OK(dt_module_find(root, "body", &body));
  DT_ASSERT_STATUS(dt_fully_shard(body, mesh, &fc), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(!dt_fsdp_is_group(l0) && !dt_fsdp_is_group(body), "a refused wrap made a group");
  dt_fsdp_group_info_t gi;
  DT_ASSERT_OK(dt_fsdp_group_info(root, &gi));
  DT_ASSERT_EQ(gi.n_params, 7);
  DT_ASSERT_OK(dt_module_destroy(root));
  /* under DDP: no nesting */
  root = build(mesh);
  DT_ASSERT_OK(dt_data_parallel(root, mesh, NULL));
  DT_ASSERT_OK(dt_module_find(root, "body", &body));
  DT_ASSERT_STATUS(dt_fully_shard(body, mesh, &fc), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "module 'body' is inside the root module, which DDP "
                        "wraps") != NULL, "message: %s", dt_last_error());
  DT_ASSERT_OK(dt_module_destroy(root));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  test_top_down();
  test_parity();
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_fsdp_root: ok\n");
  return 0;
}

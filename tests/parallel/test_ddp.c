/* test_ddp.c - data parallelism (dt_data_parallel) on the dense Llama model (np 2 and 4).
 *
 *  - loss parity: 20 AdamW steps with the batch sharded on the data dim and the model wrapped
 *    follow, within 1e-5 relative at every step, the same model trained without a wrapper on the
 *    replicated batch (every rank then computes the dense single-rank step); two wrapped runs
 *    give bitwise the same losses;
 *  - no_sync: two half-batch micro-batches (each loss halved), sync off for the first (no
 *    all-reduce, gradients stay Partial) and on for the second (one all-reduce per bucket), give
 *    the gradients and, after the optimizer step, the parameters of one full-batch step;
 *  - traffic: one step runs exactly one all-reduce per bucket (several buckets with a small
 *    bucket size, one by default) moving 4 Psi bytes in all (Psi parameters, f32), i.e. a ring
 *    moves 2 Psi (N-1)/N elements per rank, and no all-gather, reduce-scatter or all-to-all; the
 *    bucket buffers are counted as communication memory;
 *  - buckets: one dtype each, reverse registration order; a parameter without a gradient in a
 *    pass does not hold its bucket back (its slice counts as zeros, its gradient stays absent);
 *  - bad input (NULL, mesh dim out of range, a parameter sharded on the data dim or on another
 *    mesh, a module wrapped twice or inside a wrapped one, a module whose hooks are full) fails
 *    with the documented status and leaves the module training as before;
 *  - a 2-D mesh (data x model) with tensor-parallel blocks: DDP on the data dim runs one
 *    all-reduce per bucket there and follows the reference.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"

#define STEPS 20
#define B 8
#define S 16

static dt_mesh_t g_mesh;
static int g_world, g_rank;
static dt_corpus_t g_corpus;

static dt_llama_config_t model_config(void) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.vocab = 64;
  c.seq_len = S;
  c.seed = 11;
  dt_llama_config_defaults(&c);
  return c;
}

static dt_llama_t new_model(const char* plan) {
  dt_llama_config_t c = model_config();
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(g_mesh, &c, plan, &m));
  return m;
}

static dt_module_t root_of(dt_llama_t m) {
  dt_module_t r;
  DT_ASSERT_OK(dt_llama_module(m, &r));
  return r;
}

static dt_adamw_t new_opt_eps(dt_llama_t m, double eps) {
  dt_var_t* p;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, NULL, &np, NULL));
  dt_adamw_config_t ac = {1e-2, 0.9, 0.95, eps, 0.1, 0};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&ac, np, p, &opt));
  return opt;
}

static dt_adamw_t new_opt(dt_llama_t m) { return new_opt_eps(m, 1e-8); }

static void zero_grads(dt_llama_t m) {
  dt_var_t* p;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, NULL, &np, NULL));
  for (int i = 0; i < np; i++) DT_ASSERT_OK(dt_var_zero_grad(p[i]));
}

/* Rows [row0, row0 + rows) of batch `step`, Shard(0) (sharded) or Replicate. */
static void batch(int64_t step, int row0, int rows, int sharded, dt_tensor_t* tt, dt_tensor_t* gt) {
  int64_t tok[B * S], tgt[B * S];
  DT_ASSERT_OK(dt_corpus_batch(g_corpus, 3, step, B, S, tok, tgt));
  dt_placement_t pl[1] = {sharded ? dt_shard(0) : dt_replicate()};
  const int64_t shape[2] = {rows, S};
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, shape, pl, tok + row0 * S, tt));
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, shape, pl, tgt + row0 * S, gt));
}

static uint64_t all_reduces(void) {
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_get(NULL, &c));
  return c.calls[DT_COLL_ALL_REDUCE];
}

static uint64_t g_bwd_all_reduces; /* all-reduces of the last fwd_bwd's backward pass */

static float read_scalar(dt_var_t v) {
  float x;
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(v), &x, sizeof x));
  return x;
}

/* Forward and backward of one (micro-)batch; the loss is scaled by `scale` before the backward. */
static float fwd_bwd(dt_llama_t m, dt_tape_t tape, int64_t step, int row0, int rows, int sharded,
                     double scale) {
  dt_tensor_t tt, gt;
  batch(step, row0, rows, sharded, &tt, &gt);
  dt_var_t loss;
  DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
  float lv = read_scalar(loss);
  if (scale != 1.0)
    DT_ASSERT_OK(dt_ag_op(tape, "mul_scalar", 1, &loss, 0, NULL, 1, &scale, 1, &loss));
  uint64_t a0 = all_reduces();
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  g_bwd_all_reduces = all_reduces() - a0;
  DT_ASSERT_OK(dt_tape_reset(tape));
  DT_ASSERT_OK(dt_tensor_destroy(tt));
  DT_ASSERT_OK(dt_tensor_destroy(gt));
  return lv;
}

/* `steps` training steps from step0; the batch sharded when `sharded`. */
static void train(dt_llama_t m, dt_adamw_t opt, int step0, int steps, int sharded, double* losses) {
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  for (int s = 0; s < steps; s++) {
    losses[s] = fwd_bwd(m, tape, step0 + s, 0, B, sharded, 1.0);
    DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
    zero_grads(m);
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
}

/* A fresh model trained `steps` steps: wrapped with cfg (the batch sharded) when ddp, else on the
 * replicated batch. */
static void run(int ddp, const dt_ddp_config_t* cfg, int steps, double* losses) {
  dt_llama_t m = new_model(NULL);
  if (ddp) DT_ASSERT_OK(dt_data_parallel(root_of(m), g_mesh, cfg));
  dt_adamw_t opt = new_opt(m);
  train(m, opt, 0, steps, ddp, losses);
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

static double rel_dev(double a, double ref) { return fabs(a - ref) / fmax(fabs(ref), 1e-30); }

static double g_ref[STEPS];

/* ---------------------------------------------------------------------------------------------
 * 1. loss parity */

static void test_loss_parity(void) {
  double d1[STEPS], d2[STEPS];
  run(0, NULL, STEPS, g_ref);
  dt_ddp_config_t cfg = {0, 16 << 10}; /* several buckets */
  run(1, &cfg, STEPS, d1);
  run(1, &cfg, STEPS, d2);
  double worst = 0.0;
  for (int s = 0; s < STEPS; s++) {
    double r = rel_dev(d1[s], g_ref[s]);
    if (r > worst) worst = r;
    DT_ASSERT_TRUE(r <= 1e-5, "step %d: DDP loss %.9g, reference %.9g (rel %.3g)", s, d1[s],
                   g_ref[s], r);
    DT_ASSERT_TRUE(memcmp(&d1[s], &d2[s], sizeof(double)) == 0, "step %d: two DDP runs differ: "
                   "%.9g vs %.9g", s, d1[s], d2[s]);
  }
  DT_ASSERT_TRUE(g_ref[STEPS - 1] < g_ref[0] - 0.1, "the model did not learn: %.4f -> %.4f",
                 g_ref[0], g_ref[STEPS - 1]);
  if (g_rank == 0)
    printf("loss parity np=%d: %d steps, loss %.4f -> %.4f, worst relative deviation from the "
           "single-rank reference %.3g; two DDP runs bitwise equal\n", g_world, STEPS, g_ref[0],
           g_ref[STEPS - 1], worst);
}

/* ---------------------------------------------------------------------------------------------
 * 2. no_sync */

/* Max |a - b| over max |b|. */
static double max_rel(const float* a, const float* b, int64_t n) {
  double dmax = 0.0, bmax = 0.0;
  for (int64_t i = 0; i < n; i++) {
    dmax = fmax(dmax, fabs((double)a[i] - b[i]));
    bmax = fmax(bmax, fabs((double)b[i]));
  }
  return dmax / fmax(bmax, 1e-30);
}

static int64_t numel_of(dt_tensor_t t) {
  int nd;
  int64_t shape[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  for (int d = 0; d < nd; d++) n *= shape[d];
  return n;
}

/* Compares the full gradients (grads 1) or values (grads 0) of two models' parameters. */
static double compare_params(dt_llama_t a, dt_llama_t b, int grads) {
  dt_var_t *pa, *pb;
  const char* const* names;
  int na, nb;
  DT_ASSERT_OK(dt_llama_params(a, &pa, &names, &na, NULL));
  DT_ASSERT_OK(dt_llama_params(b, &pb, NULL, &nb, NULL));
  DT_ASSERT_EQ(na, nb);
  double worst = 0.0;
  for (int i = 0; i < na; i++) {
    dt_tensor_t ta = grads ? dt_var_grad(pa[i]) : dt_var_value(pa[i]);
    dt_tensor_t tb = grads ? dt_var_grad(pb[i]) : dt_var_value(pb[i]);
    DT_ASSERT_TRUE(ta != NULL && tb != NULL, "%s: no gradient", names[i]);
    int64_t n = numel_of(tb);
    float* fa = malloc(sizeof(float) * (size_t)n);
    float* fb = malloc(sizeof(float) * (size_t)n);
    DT_ASSERT_TRUE(fa && fb, "malloc");
    DT_ASSERT_OK(dt_tensor_gather_full(ta, fa, sizeof(float) * (size_t)n));
    DT_ASSERT_OK(dt_tensor_gather_full(tb, fb, sizeof(float) * (size_t)n));
    double r = max_rel(fa, fb, n);
    DT_ASSERT_TRUE(r <= 1e-5, "%s %s: relative deviation %.3g", names[i], grads ? "grad" : "value",
                   r);
    if (r > worst) worst = r;
    free(fa);
    free(fb);
  }
  return worst;
}

/* Every gradient of m has the placements of kind `kind` on mesh dim 0. */
static void grads_are(dt_llama_t m, int kind) {
  dt_var_t* p;
  const char* const* names;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, &names, &np, NULL));
  for (int i = 0; i < np; i++) {
    dt_placement_t pl[1];
    DT_ASSERT_TRUE(dt_var_grad(p[i]) != NULL, "%s has no gradient", names[i]);
    DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(p[i]), pl));
    DT_ASSERT_TRUE(pl[0].kind == kind, "%s: gradient placement kind %d, expected %d", names[i],
                   pl[0].kind, kind);
  }
}

static void test_no_sync(void) {
  dt_llama_t ref = new_model(NULL), m = new_model(NULL);
  dt_module_t root = root_of(m);
  dt_ddp_config_t cfg = {-1, 32 << 10};
  DT_ASSERT_OK(dt_data_parallel(root, g_mesh, &cfg));
  int nb;
  DT_ASSERT_OK(dt_ddp_num_buckets(root, &nb));
  /* AdamW's first step is lr g / (|g| + eps): for |g| near eps a rounding-level difference in g
   * becomes a large one in the update, so a larger eps keeps the comparison about gradients */
  dt_adamw_t oref = new_opt_eps(ref, 1e-4), om = new_opt_eps(m, 1e-4);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  fwd_bwd(ref, tape, 5, 0, B, 0, 1.0);

  DT_ASSERT_OK(dt_ddp_set_requires_gradient_sync(root, 0));
  fwd_bwd(m, tape, 5, 0, B / 2, 1, 0.5);
  DT_ASSERT_EQ(g_bwd_all_reduces, 0);
  grads_are(m, DT_PARTIAL);
  DT_ASSERT_OK(dt_ddp_set_requires_gradient_sync(root, 1));
  fwd_bwd(m, tape, 5, B / 2, B / 2, 1, 0.5);
  DT_ASSERT_EQ(g_bwd_all_reduces, nb);
  grads_are(m, DT_REPLICATE);
  double gdev = compare_params(m, ref, 1);
  DT_ASSERT_OK(dt_adamw_step(oref, 1e-2));
  DT_ASSERT_OK(dt_adamw_step(om, 1e-2));
  double pdev = compare_params(m, ref, 0);
  if (g_rank == 0)
    printf("no_sync np=%d: 2 micro-batches (%d buckets): gradients within %.3g, parameters after "
           "the step within %.3g of one full-batch step\n", g_world, nb, gdev, pdev);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(oref));
  DT_ASSERT_OK(dt_adamw_destroy(om));
  DT_ASSERT_OK(dt_llama_destroy(ref));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

/* ---------------------------------------------------------------------------------------------
 * 3. traffic */

static void traffic(const dt_ddp_config_t* cfg, int want_one_bucket) {
  dt_llama_t m = new_model(NULL);
  dt_module_t root = root_of(m);
  int np;
  int64_t psi;
  dt_var_t* params;
  DT_ASSERT_OK(dt_llama_params(m, &params, NULL, &np, &psi));
  dt_memory_stats_t m0, m1;
  DT_ASSERT_OK(dt_memory_stats(&m0));
  DT_ASSERT_OK(dt_data_parallel(root, g_mesh, cfg));
  DT_ASSERT_OK(dt_memory_stats(&m1));
  int64_t comm = m1.current[DT_MEM_COMMUNICATION] - m0.current[DT_MEM_COMMUNICATION];
  int nb, total_params = 0;
  int64_t total_nbytes = 0, cap = cfg && cfg->bucket_nbytes > 0 ? cfg->bucket_nbytes : 25 << 20;
  DT_ASSERT_OK(dt_ddp_num_buckets(root, &nb));
  for (int i = 0; i < nb; i++) {
    int n;
    int64_t nbytes;
    DT_ASSERT_OK(dt_ddp_bucket_info(root, i, &n, &nbytes));
    DT_ASSERT_TRUE(n >= 1 && (nbytes <= cap || n == 1), "bucket %d: %d params, %lld bytes", i, n,
                   (long long)nbytes);
    total_params += n;
    total_nbytes += nbytes;
  }
  DT_ASSERT_EQ(total_params, np);
  DT_ASSERT_EQ(total_nbytes, psi * 4);
  /* the buffers are communication memory (a pooled block over 64 KiB is rounded up to 4 KiB) */
  DT_ASSERT_TRUE(comm >= psi * 4 && comm < psi * 4 + 4096 * nb, "communication memory grew by "
                 "%lld bytes for %lld bytes of buckets", (long long)comm, (long long)(psi * 4));
  if (want_one_bucket) DT_ASSERT_EQ(nb, 1);
  else DT_ASSERT_TRUE(nb >= 3, "only %d buckets with %lld-byte buckets", nb, (long long)cap);

  dt_adamw_t opt = new_opt(m);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  for (int step = 0; step < 2; step++) { /* the first fills the caches */
    dt_tensor_t tt, gt;
    batch(step, 0, B, 1, &tt, &gt);
    DT_ASSERT_OK(dt_counters_reset(NULL));
    dt_var_t loss;
    DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
    dt_counters_t c;
    DT_ASSERT_OK(dt_counters_get(NULL, &c));
    float lv = read_scalar(loss);
    DT_ASSERT_TRUE(fabs(lv - g_ref[step]) <= 1e-5 * fabs(g_ref[step]), "step %d loss %.9g vs %.9g",
                   step, lv, g_ref[step]);
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_REDUCE], nb);
    DT_ASSERT_EQ(c.nbytes[DT_COLL_ALL_REDUCE], psi * 4);
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_GATHER], 0);
    DT_ASSERT_EQ(c.calls[DT_COLL_REDUCE_SCATTER], 0);
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_TO_ALL], 0);
    if (step == 1 && g_rank == 0)
      printf("traffic np=%d: Psi = %lld parameters in %d bucket%s (cap %lld bytes): %llu "
             "all-reduces of %llu bytes in all = 4 Psi; a ring moves 2 Psi (N-1)/N = %.0f "
             "elements per rank\n", g_world, (long long)psi, nb, nb > 1 ? "s" : "",
             (long long)cap, (unsigned long long)c.calls[DT_COLL_ALL_REDUCE],
             (unsigned long long)c.nbytes[DT_COLL_ALL_REDUCE],
             2.0 * (double)psi * (g_world - 1) / g_world);
    DT_ASSERT_OK(dt_tape_reset(tape));
    zero_grads(m);
    DT_ASSERT_OK(dt_tensor_destroy(tt));
    DT_ASSERT_OK(dt_tensor_destroy(gt));
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

static void test_traffic(void) {
  dt_ddp_config_t small = {0, 16 << 10};
  traffic(&small, 0);
  traffic(NULL, 1);
}

/* ---------------------------------------------------------------------------------------------
 * 4. buckets of mixed dtypes, a parameter without a gradient */

static dt_status_t fwd_toy(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in, int n_out,
                           dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_var_t y1, y2, s;
  dt_var_t pa[2] = {in[0], dt_module_get(m, "a")}, pc[2] = {in[0], dt_module_get(m, "c")};
  DT_CHECK(dt_ag_op(tape, "mm", 2, pa, 0, NULL, 0, NULL, 1, &y1));
  DT_CHECK(dt_ag_op(tape, "mm", 2, pc, 0, NULL, 0, NULL, 1, &y2));
  DT_CHECK(dt_ag_op(tape, "mul_scalar", 1, &y2, 0, NULL, 1, (double[]){3.0}, 1, &y2));
  dt_var_t both[2] = {y1, y2};
  DT_CHECK(dt_ag_op(tape, "add", 2, both, 0, NULL, 0, NULL, 1, &s));
  return dt_ag_op(tape, "sum", 1, &s, 1, (int64_t[]){0}, 0, NULL, 1, out);
}

static dt_var_t toy_param(dt_dtype_t dt, uint64_t seed) {
  const int64_t shape[2] = {4, 4};
  dt_placement_t r[1] = {dt_replicate()};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_randn(g_mesh, dt, 2, shape, r, seed, &t));
  dt_var_t v;
  DT_ASSERT_OK(dt_var_leaf(t, 1, &v));
  return v;
}

static void test_buckets(void) {
  dt_module_t m;
  DT_ASSERT_OK(dt_module_create("toy", fwd_toy, NULL, &m));
  /* registration order a (f32), b (bf16, unused), c (f32), e (f32, unused): buckets
   * {e, c} | {b} | {a} */
  dt_var_t a = toy_param(DT_F32, 1), b = toy_param(DT_BF16, 2), c = toy_param(DT_F32, 3),
           e = toy_param(DT_F32, 4);
  DT_ASSERT_OK(dt_module_add_param(m, "a", a));
  DT_ASSERT_OK(dt_module_add_param(m, "b", b));
  DT_ASSERT_OK(dt_module_add_param(m, "c", c));
  DT_ASSERT_OK(dt_module_add_param(m, "e", e));
  DT_ASSERT_OK(dt_data_parallel(m, g_mesh, NULL));
  int nb, n[3];
  int64_t nbytes[3];
  DT_ASSERT_OK(dt_ddp_num_buckets(m, &nb));
  DT_ASSERT_EQ(nb, 3);
  for (int i = 0; i < 3; i++) DT_ASSERT_OK(dt_ddp_bucket_info(m, i, &n[i], &nbytes[i]));
  DT_ASSERT_TRUE(n[0] == 2 && nbytes[0] == 128 && n[1] == 1 && nbytes[1] == 32 && n[2] == 1 &&
                     nbytes[2] == 64,
                 "buckets %d/%lld %d/%lld %d/%lld", n[0], (long long)nbytes[0], n[1],
                 (long long)nbytes[1], n[2], (long long)nbytes[2]);
  /* x (2 world, 4) Shard(0): dL/da = x^T 1, dL/dc = 3 x^T 1 (small integers: exact) */
  const int64_t xs[2] = {2 * g_world, 4};
  float xf[64];
  for (int i = 0; i < 8 * g_world; i++) xf[i] = (float)(i % 7 - 3);
  dt_placement_t s0[1] = {dt_shard(0)};
  dt_tensor_t xt;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, xs, s0, xf, &xt));
  dt_var_t x, loss;
  DT_ASSERT_OK(dt_var_leaf(xt, 0, &x));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  uint64_t a0 = all_reduces();
  DT_ASSERT_OK(dt_module_forward(m, tape, 1, &x, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  uint64_t a1 = all_reduces();
  DT_ASSERT_EQ(a1 - a0, 2); /* {e, c} with e's slice zero, and {a}; b's bucket got nothing */
  DT_ASSERT_TRUE(dt_var_grad(b) == NULL && dt_var_grad(e) == NULL, "unused parameters got a "
                 "gradient");
  float ga[16], gc[16];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(a), ga, sizeof ga));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(c), gc, sizeof gc));
  for (int k = 0; k < 4; k++) {
    float col = 0.0f;
    for (int r = 0; r < 2 * g_world; r++) col += xf[r * 4 + k];
    for (int j = 0; j < 4; j++) {
      DT_ASSERT_TRUE(ga[k * 4 + j] == col && gc[k * 4 + j] == 3 * col, "grad [%d][%d]: %g %g, "
                     "expected %g %g", k, j, ga[k * 4 + j], gc[k * 4 + j], col, 3 * col);
    }
  }
  dt_placement_t pl[1];
  DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(a), pl));
  DT_ASSERT_TRUE(pl[0].kind == DT_REPLICATE, "reduced gradient not Replicate");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_module_destroy(m));
}

/* ---------------------------------------------------------------------------------------------
 * 5. bad input */

/* m is not wrapped: replicated parameters' gradients come back Replicate (the default mode, no
 * hook) and two steps on the sharded batch follow the reference. */
static void trains_unwrapped(dt_llama_t m) {
  int nb;
  DT_ASSERT_STATUS(dt_ddp_num_buckets(root_of(m), &nb), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(dt_module_attachment(root_of(m), "ddp") == NULL, "attachment left behind");
  dt_adamw_t opt = new_opt(m);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  for (int s = 0; s < 2; s++) {
    float lv = fwd_bwd(m, tape, s, 0, B, 1, 1.0);
    DT_ASSERT_TRUE(rel_dev(lv, g_ref[s]) <= 1e-5, "step %d: %.9g vs %.9g", s, lv, g_ref[s]);
    dt_var_t* p;
    int np;
    DT_ASSERT_OK(dt_llama_params(m, &p, NULL, &np, NULL));
    for (int i = 0; i < np; i++) {
      dt_placement_t gp[1], vp[1];
      DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(p[i]), gp));
      DT_ASSERT_OK(dt_tensor_placements(dt_var_value(p[i]), vp));
      DT_ASSERT_TRUE(dt_placement_equal(gp[0], vp[0]), "parameter %d: gradient not brought to "
                     "the parameter's placement (mode changed?)", i);
    }
    DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
    zero_grads(m);
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
}

static dt_status_t nop_bwd_hook(dt_module_t m, dt_tape_t t, void* ctx) {
  (void)m, (void)t, (void)ctx;
  return DT_SUCCESS;
}

static void test_bad_input(void) {
  dt_llama_t m = new_model(NULL);
  dt_module_t root = root_of(m);
  DT_ASSERT_STATUS(dt_data_parallel(NULL, g_mesh, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_data_parallel(root, NULL, NULL), DT_ERR_INVALID_ARG);
  dt_ddp_config_t bad_dim = {1, 0}, bad_neg = {-2, 0};
  DT_ASSERT_STATUS(dt_data_parallel(root, g_mesh, &bad_dim), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_data_parallel(root, g_mesh, &bad_neg), DT_ERR_INVALID_ARG);
  dt_mesh_t other;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &other));
  DT_ASSERT_STATUS(dt_data_parallel(root, other, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_mesh_destroy(other));
  DT_ASSERT_STATUS(dt_ddp_set_requires_gradient_sync(root, 0), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_ddp_set_requires_gradient_sync(NULL, 0), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_ddp_num_buckets(root, NULL), DT_ERR_INVALID_ARG);
  trains_unwrapped(m);
  DT_ASSERT_OK(dt_llama_destroy(m));

  /* a parameter sharded on the data dim */
  m = new_model("*.wq=S(0)");
  DT_ASSERT_STATUS(dt_data_parallel(root_of(m), g_mesh, NULL), DT_ERR_INVALID_ARG);
  if (g_rank == 0) printf("sharded parameter refused: %s\n", dt_last_error());
  trains_unwrapped(m);
  DT_ASSERT_OK(dt_llama_destroy(m));

  /* the module's backward post-hooks are full: the wrap fails after adding its pre-hook, which
   * it removes again (all DT_MODULE_HOOKS_MAX pre-hook places are free afterwards) */
  m = new_model(NULL);
  for (int i = 0; i < DT_MODULE_HOOKS_MAX; i++)
    DT_ASSERT_OK(dt_module_add_backward_post_hook(root_of(m), nop_bwd_hook, NULL));
  DT_ASSERT_STATUS(dt_data_parallel(root_of(m), g_mesh, NULL), DT_ERR_INVALID_ARG);
  trains_unwrapped(m);
  for (int i = 0; i < DT_MODULE_HOOKS_MAX; i++)
    DT_ASSERT_OK(dt_module_add_backward_pre_hook(root_of(m), nop_bwd_hook, NULL));
  DT_ASSERT_OK(dt_llama_destroy(m));

  /* wrapped twice, or a block of a wrapped model: the first wrap keeps working */
  m = new_model(NULL);
  root = root_of(m);
  dt_ddp_config_t cfg = {0, 16 << 10};
  DT_ASSERT_OK(dt_data_parallel(root, g_mesh, &cfg));
  int nb0, nb1;
  DT_ASSERT_OK(dt_ddp_num_buckets(root, &nb0));
  DT_ASSERT_STATUS(dt_data_parallel(root, g_mesh, NULL), DT_ERR_INVALID_USAGE);
  dt_module_t blk;
  DT_ASSERT_OK(dt_module_find(root, "layers.1", &blk));
  DT_ASSERT_STATUS(dt_data_parallel(blk, g_mesh, NULL), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_ddp_num_buckets(root, &nb1));
  DT_ASSERT_EQ(nb0, nb1);
  DT_ASSERT_STATUS(dt_ddp_bucket_info(root, nb0, NULL, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_ddp_bucket_info(root, -1, NULL, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_ddp_num_buckets(blk, &nb1), DT_ERR_INVALID_ARG); /* m itself only */
  double losses[3];
  dt_adamw_t opt = new_opt(m);
  train(m, opt, 0, 3, 1, losses);
  for (int s = 0; s < 3; s++)
    DT_ASSERT_TRUE(rel_dev(losses[s], g_ref[s]) <= 1e-5, "step %d: %.9g vs %.9g", s, losses[s],
                   g_ref[s]);
  DT_ASSERT_EQ(g_bwd_all_reduces, nb0); /* the last step's backward: one per bucket */
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

/* Flags changed after wrapping (dt_var_set_requires_grad): a parameter frozen when wrapped and
 * unfrozen before training is reduced outside the buckets (its Partial gradient brought to
 * Replicate by the autograd): the run equals the reference; one frozen after wrapping keeps its
 * value while the rest trains. */
static void test_flags_after_wrap(void) {
  dt_llama_t m = new_model(NULL);
  dt_module_t root = root_of(m);
  dt_var_t norm, wq;
  DT_ASSERT_OK(dt_module_param(root, "norm", &norm));
  DT_ASSERT_OK(dt_module_param(root, "layers.0.wq", &wq));
  DT_ASSERT_OK(dt_var_set_requires_grad(norm, 0));
  dt_ddp_config_t cfg = {0, 16 << 10};
  DT_ASSERT_OK(dt_data_parallel(root, g_mesh, &cfg));
  DT_ASSERT_OK(dt_var_set_requires_grad(norm, 1));
  double losses[3];
  dt_adamw_t opt = new_opt(m);
  train(m, opt, 0, 3, 1, losses);
  for (int s = 0; s < 3; s++)
    DT_ASSERT_TRUE(rel_dev(losses[s], g_ref[s]) <= 1e-5, "unfrozen after wrapping, step %d: "
                   "%.9g vs %.9g", s, losses[s], g_ref[s]);
  int64_t n = 0;
  DT_ASSERT_OK(dt_tensor_local_numel(dt_var_value(wq), &n)); /* replicated: the whole */
  float* before = malloc(sizeof(float) * (size_t)n);
  float* after = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_TRUE(before && after, "malloc");
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(wq), before, sizeof(float) * (size_t)n));
  DT_ASSERT_OK(dt_var_set_requires_grad(wq, 0));
  train(m, opt, 3, 2, 1, losses);
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(wq), after, sizeof(float) * (size_t)n));
  DT_ASSERT_TRUE(memcmp(before, after, sizeof(float) * (size_t)n) == 0,
                 "layers.0.wq frozen after wrapping moved");
  DT_ASSERT_TRUE(dt_var_grad(wq) == NULL, "frozen wq has a gradient");
  free(before);
  free(after);
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

/* ---------------------------------------------------------------------------------------------
 * 6. a 2-D mesh (data x model): tensor-parallel blocks sharded on the model dim, DDP on the data
 * dim (a bucket holds the parameters' local shards; its all-reduce runs on the data dim only) */

static void test_2d(void) {
  int shape[2] = {2, g_world / 2};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(2, shape, NULL, NULL, &mesh));
  dt_llama_config_t c = model_config();
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(mesh, &c,
                               "*.wq=R,S(0);*.wk=R,S(0);*.wv=R,S(0);*.wo=R,S(1);*.w1=R,S(0);"
                               "*.w3=R,S(0);*.w2=R,S(1)",
                               &m));
  dt_module_t root = root_of(m);
  dt_ddp_config_t all = {-1, 0}, cfg = {0, 8 << 10};
  DT_ASSERT_STATUS(dt_data_parallel(root, mesh, &all), DT_ERR_INVALID_ARG); /* S(0) on dim 1 */
  DT_ASSERT_OK(dt_data_parallel(root, mesh, &cfg));
  int nb;
  DT_ASSERT_OK(dt_ddp_num_buckets(root, &nb));
  dt_var_t* p;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, NULL, &np, NULL));
  dt_adamw_t opt = new_opt(m);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  double worst = 0.0;
  for (int step = 0; step < 4; step++) {
    int64_t tok[B * S], tgt[B * S];
    DT_ASSERT_OK(dt_corpus_batch(g_corpus, 3, step, B, S, tok, tgt));
    dt_placement_t pl[2] = {dt_shard(0), dt_replicate()};
    const int64_t sh[2] = {B, S};
    dt_tensor_t tt, gt;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, sh, pl, tok, &tt));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, sh, pl, tgt, &gt));
    dt_var_t loss;
    DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
    double lv = read_scalar(loss);
    dt_counters_t c0, c1;
    DT_ASSERT_OK(dt_counters_get(mesh, &c0));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_counters_get(mesh, &c1));
    DT_ASSERT_EQ(c1.dim_calls[0][DT_COLL_ALL_REDUCE] - c0.dim_calls[0][DT_COLL_ALL_REDUCE], nb);
    for (int i = 0; i < np; i++) {
      dt_placement_t gp[2], vp[2];
      DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(p[i]), gp));
      DT_ASSERT_OK(dt_tensor_placements(dt_var_value(p[i]), vp));
      DT_ASSERT_TRUE(dt_placement_equal(gp[0], vp[0]) && dt_placement_equal(gp[1], vp[1]),
                     "parameter %d: gradient placed unlike the parameter", i);
    }
    double r = rel_dev(lv, g_ref[step]);
    DT_ASSERT_TRUE(r <= 1e-5, "2-D step %d: %.9g vs %.9g", step, lv, g_ref[step]);
    if (r > worst) worst = r;
    DT_ASSERT_OK(dt_tape_reset(tape));
    DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
    zero_grads(m);
    DT_ASSERT_OK(dt_tensor_destroy(tt));
    DT_ASSERT_OK(dt_tensor_destroy(gt));
  }
  if (g_rank == 0)
    printf("2-D mesh 2x%d (data x model): %d buckets, one all-reduce each on the data dim per "
           "step, losses within %.3g of the reference\n", g_world / 2, nb, worst);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_TRUE(B % g_world == 0 && (B / 2) % g_world == 0, "batch %d over %d ranks", B, g_world);
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &g_mesh));
  DT_ASSERT_OK(dt_corpus_markov(64, 1, 1 << 16, 5, &g_corpus));
  test_loss_parity();
  test_no_sync();
  test_traffic();
  test_buckets();
  test_bad_input();
  test_flags_after_wrap();
  test_2d();
  DT_ASSERT_OK(dt_corpus_destroy(g_corpus));
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  int rank = g_rank;
  DT_ASSERT_OK(dt_finalize());
  if (rank == 0) printf("test_ddp np=%d: ok\n", g_world);
  return 0;
}

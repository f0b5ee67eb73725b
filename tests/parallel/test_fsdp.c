/* test_fsdp.c - FSDP / HSDP on the dense Llama model (np 2 and 4).
 *
 *  - loss parity over 20 steps (AdamW, clipping on the sharded gradients) against the dense
 *    computation (every parameter and the batch replicated on every rank): reshard after forward
 *    on and off, prefetch on and off, reshard to groups of 2 (np 4), HSDP 2x2 (np 4), FSDP over
 *    both dims of a 2x2 mesh (shard_span 2, nested uneven shards; np 4); uneven
 *    parameter shapes (vocab 61, dim 30, ffn 50: dim 0 does not split evenly); every step within
 *    1e-5 relative, the worst printed; a repeated run bitwise equal;
 *  - bf16 parameters (f32 reduction, f32 outputs): within 0.05 relative of the f32 losses and the
 *    loss falls; the loss is the f32 cross-entropy of the bf16 logits, not a bf16-rounded value;
 *  - two micro-batches with the first's gradient sync skipped equal one step on both;
 *  - traffic over one step read from the counters equals the formulas, one all-gather per group
 *    per gather and one reduce-scatter per group;
 *  - memory: the sharded state (parameters, gradients, two AdamW moments) is 16 Psi / N bytes
 *    plus padding, and the gathered parameters at their peak hold at most two groups;
 *  - a sharded value replaced by dt_var_set_value trains exactly as the same values written in
 *    place (the shards are views of the group's all-gather buffer);
 *  - dt_fsdp_config_for(shard, replicate): the defaults over those dims (default(n) is one case);
 *  - stacked experts with fewer experts than ranks: sharded on their next dim (Shard(1): each
 *    rank a share, no padded expert), the dense curve within 1e-5;
 *  - deferred initialization: a model built as layouts, wrapped, then initialized shard by shard
 *    equals the eager build bit for bit without ever holding the whole model;
 *  - bad input: clear errors and nothing half-wrapped (shard_span out of the mesh, over the
 *    replicate dim, with reshard to groups of k; a scalar parameter, the message saying to make
 *    it shape (1)); parameters of two dtypes in one group; a
 *    module inside a group wrapped before it (top-down) refused, naming both; a module with
 *    nothing to shard is a group without parameters.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

#define STEPS 20
#define BATCH 8
#define SEQ 8

static int g_world, g_rank;
static int g_no_loss_read; /* traffic: count the step's collectives only */
static dt_corpus_t g_corpus;

static dt_llama_config_t model_config(void) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 30;
  c.n_layers = 2;
  c.n_heads = 3;
  c.vocab = 61;
  c.seq_len = SEQ;
  c.ffn_dim = 50;
  c.seed = 11;
  return c;
}

typedef enum { MODE_DENSE, MODE_FSDP } mode_t_;

typedef struct {
  mode_t_ mode;
  dt_fsdp_config_t fsdp;
  int mesh2d;     /* HSDP: a 2x2 mesh */
  int micro;      /* 2: two micro-batches per step, sync skipped on the first */
  int steps;
  int root_keep;  /* the root keeps its output dtype under bf16 too (no cast of the loss) */
  int experts;    /* > 0: a mixture of that many experts (top 2) in place of the MLP */
} run_t;

typedef struct {
  dt_mesh_t mesh;
  dt_llama_t model;
  dt_module_t root;
  dt_var_t* params;
  int np;
  int64_t numel;
  dt_adamw_t opt;
  dt_tape_t tape;
} setup_t;

/* FSDP2's wrapping: each block with cfg, then the root with root_cfg. */
static void wrap_blocks(dt_module_t root, dt_mesh_t mesh, int n_layers, const dt_fsdp_config_t* cfg,
                        const dt_fsdp_config_t* root_cfg) {
  for (int l = 0; l < n_layers; l++) {
    char path[32];
    dt_module_t blk;
    snprintf(path, sizeof path, "layers.%d", l);
    DT_ASSERT_OK(dt_module_find(root, path, &blk));
    DT_ASSERT_OK(dt_fully_shard(blk, mesh, cfg));
  }
  DT_ASSERT_OK(dt_fully_shard(root, mesh, root_cfg));
}

static void setup(const run_t* r, setup_t* s) {
  memset(s, 0, sizeof *s);
  int shape1[1] = {g_world}, shape2[2] = {2, g_world / 2};
  DT_ASSERT_OK(dt_mesh_create(r->mesh2d ? 2 : 1, r->mesh2d ? shape2 : shape1, NULL, NULL,
                              &s->mesh));
  dt_llama_config_t c = model_config();
  c.n_experts = r->experts;
  c.top_k = r->experts > 0 ? 2 : 0;
  DT_ASSERT_OK(dt_llama_create(s->mesh, &c, NULL, &s->model));
  DT_ASSERT_OK(dt_llama_module(s->model, &s->root));
  if (r->mode == MODE_FSDP) {
    dt_fsdp_config_t rc = r->fsdp;
    if (rc.param_dtype != DT_F32 && !r->root_keep) rc.output_dtype = DT_F32;
    wrap_blocks(s->root, s->mesh, c.n_layers, &r->fsdp, &rc);
  }
  DT_ASSERT_OK(dt_llama_params(s->model, &s->params, NULL, &s->np, &s->numel));
  dt_adamw_config_t ac = {1e-2, 0.9, 0.95, 1e-8, 0.0, 0};
  DT_ASSERT_OK(dt_adamw_create(&ac, s->np, s->params, &s->opt));
  DT_ASSERT_OK(dt_tape_create(&s->tape));
}

static void teardown(setup_t* s) {
  DT_ASSERT_OK(dt_tape_destroy(s->tape));
  DT_ASSERT_OK(dt_adamw_destroy(s->opt));
  DT_ASSERT_OK(dt_llama_destroy(s->model));
  DT_ASSERT_OK(dt_mesh_destroy(s->mesh));
}

/* Forward and backward of rows [row0, row0 + rows) of batch `step`, the loss scaled by `scale`;
 * returns the unscaled loss. */
static float fwd_bwd(const run_t* r, setup_t* s, int step, int row0, int rows, double scale) {
  int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
  DT_ASSERT_OK(dt_corpus_batch(g_corpus, 5, step, BATCH, SEQ, tok, tgt));
  dt_placement_t pl[2];
  for (int d = 0; d < 2; d++) pl[d] = r->mode == MODE_DENSE ? dt_replicate() : dt_shard(0);
  const int64_t shape[2] = {rows, SEQ};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(s->mesh, DT_I64, 2, shape, pl, tok + row0 * SEQ, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(s->mesh, DT_I64, 2, shape, pl, tgt + row0 * SEQ, &gt));
  dt_var_t loss;
  DT_ASSERT_OK(dt_llama_forward(s->model, s->tape, tt, gt, &loss, NULL));
  dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t lr;
  float lv[2] = {0, 0};
  if (!g_no_loss_read) {
    DT_ASSERT_OK(dt_tensor_redistribute(dt_var_value(loss), rep, &lr));
    dt_dtype_t ldt;
    DT_ASSERT_OK(dt_tensor_dtype(lr, &ldt));
    DT_ASSERT_TRUE(ldt == DT_F32, "loss dtype %s (output dtype f32)", dt_dtype_name(ldt));
    DT_ASSERT_OK(dt_tensor_gather_full(lr, lv, sizeof lv));
    dt_tensor_destroy(lr);
  }
  if (scale != 1.0) {
    const double f[1] = {scale};
    DT_ASSERT_OK(dt_ag_op(s->tape, "mul_scalar", 1, &loss, 0, NULL, 1, f, 1, &loss));
  }
  DT_ASSERT_OK(dt_tape_backward(s->tape, loss));
  DT_ASSERT_OK(dt_tape_reset(s->tape));
  dt_tensor_destroy(tt);
  dt_tensor_destroy(gt);
  return lv[0];
}

static void opt_step(setup_t* s) {
  double norm;
  DT_ASSERT_OK(dt_clip_grad_norm(s->np, s->params, 1.0, &norm));
  DT_ASSERT_OK(dt_adamw_step(s->opt, 1e-2));
  for (int i = 0; i < s->np; i++) DT_ASSERT_OK(dt_var_zero_grad(s->params[i]));
}

/* Trains `steps` steps; losses[step]. */
static void train(const run_t* r, float* losses) {
  setup_t s;
  setup(r, &s);
  for (int step = 0; step < r->steps; step++) {
    if (r->micro == 2) {
      DT_ASSERT_OK(dt_fsdp_set_requires_gradient_sync(s.root, 0));
      float a = fwd_bwd(r, &s, step, 0, BATCH / 2, 0.5);
      DT_ASSERT_OK(dt_fsdp_set_requires_gradient_sync(s.root, 1));
      float b = fwd_bwd(r, &s, step, BATCH / 2, BATCH / 2, 0.5);
      losses[step] = 0.5f * (a + b);
    } else {
      losses[step] = fwd_bwd(r, &s, step, 0, BATCH, 1.0);
    }
    opt_step(&s);
  }
  teardown(&s);
}

static double worst_rel(const float* a, const float* b, int n) {
  double w = 0;
  for (int i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]) / fabs((double)b[i]);
    if (d > w) w = d;
  }
  return w;
}

static void parity(const char* what, const run_t* r, const float* ref, double tol) {
  float l[STEPS];
  train(r, l);
  double w = worst_rel(l, ref, r->steps);
  if (g_rank == 0)
    printf("parity %-34s np %d: worst relative loss difference over %d steps %.3g (first %.5f "
           "last %.5f)\n", what, g_world, r->steps, w, l[0], l[r->steps - 1]);
  DT_ASSERT_TRUE(w <= tol, "%s: worst relative difference %.3g above %.1g", what, w, tol);
  DT_ASSERT_TRUE(l[r->steps - 1] < l[0], "%s: the loss did not fall", what);
}

static run_t fsdp_run(int reshard, int prefetch) {
  run_t r;
  memset(&r, 0, sizeof r);
  r.mode = MODE_FSDP;
  r.steps = STEPS;
  r.fsdp = dt_fsdp_config_default(1);
  r.fsdp.reshard_after_forward = reshard;
  r.fsdp.prefetch_forward = r.fsdp.prefetch_backward = prefetch;
  return r;
}

/* ------------------------------------------------------------------------------------------- */

static void test_parity(void) {
  run_t dense;
  memset(&dense, 0, sizeof dense);
  dense.mode = MODE_DENSE;
  dense.steps = STEPS;
  float ref[STEPS];
  train(&dense, ref);

  run_t r = fsdp_run(1, 1);
  parity("fsdp reshard prefetch", &r, ref, 1e-5);
  float a[STEPS], b[STEPS];
  train(&r, a);
  train(&r, b);
  DT_ASSERT_TRUE(memcmp(a, b, sizeof a) == 0, "repeated FSDP runs differ");
  r = fsdp_run(0, 1);
  parity("fsdp no-reshard prefetch", &r, ref, 1e-5);
  r = fsdp_run(1, 0);
  parity("fsdp reshard no-prefetch", &r, ref, 1e-5);
  r = fsdp_run(0, 0);
  parity("fsdp no-reshard no-prefetch", &r, ref, 1e-5);
  if (g_world == 4) {
    r = fsdp_run(2, 1);
    parity("fsdp reshard-to-2", &r, ref, 1e-5);
    r = fsdp_run(1, 1);
    r.mesh2d = 1;
    r.fsdp = dt_fsdp_config_default(2);
    parity("hsdp 2x2", &r, ref, 1e-5);
    r.fsdp.reshard_after_forward = 0;
    parity("hsdp 2x2 no-reshard", &r, ref, 1e-5);
    /* FSDP over both dims of the 2x2 mesh (shard_span 2: dp x cp's layout): uneven rows split
     * nested (61 = 31 + 30, then 16 + 15 and 15 + 15), not as one split of 4 */
    r.fsdp = dt_fsdp_config_for(0, -1);
    r.fsdp.shard_span = 2;
    parity("fsdp over 2x2 (shard_span 2)", &r, ref, 1e-5);
    r.fsdp.reshard_after_forward = 0;
    parity("fsdp over 2x2 no-reshard", &r, ref, 1e-5);
  }
  /* two micro-batches, the first not synced, against the dense double batch */
  r = fsdp_run(1, 1);
  r.micro = 2;
  r.steps = 6;
  parity("fsdp 2 micro-batches (no sync)", &r, ref, 1e-5);
  if (g_world == 4) {
    r.mesh2d = 1;
    r.fsdp = dt_fsdp_config_default(2);
    parity("hsdp 2 micro-batches (no sync)", &r, ref, 1e-5);
  }
  /* bf16 parameters and compute, f32 reduction and outputs */
  r = fsdp_run(1, 1);
  r.fsdp.param_dtype = DT_BF16;
  parity("fsdp bf16 params", &r, ref, 0.05);
}

/* The logits of the last forward (a post-forward hook of the output projection), in f32. */
typedef struct {
  float logits[BATCH * SEQ * 61];
  int64_t numel;
} logits_keep_t;

static dt_status_t keep_logits(dt_module_t m, dt_tape_t tape, int n, dt_var_t* vars, void* ctx) {
  (void)m;
  (void)tape;
  (void)n;
  logits_keep_t* k = ctx;
  dt_tensor_t t = dt_var_value(vars[0]);
  dt_dtype_t dt;
  int64_t shape[2];
  DT_ASSERT_OK(dt_tensor_dtype(t, &dt));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  DT_ASSERT_TRUE(dt == DT_BF16 && shape[0] * shape[1] == BATCH * SEQ * 61,
                 "logits %s (%lld, %lld): bf16 (%d, 61) expected", dt_dtype_name(dt),
                 (long long)shape[0], (long long)shape[1], BATCH * SEQ);
  uint16_t raw[BATCH * SEQ * 61];
  DT_ASSERT_OK(dt_tensor_gather_full(t, raw, sizeof raw));
  for (int i = 0; i < BATCH * SEQ * 61; i++) {
    uint32_t bits = (uint32_t)raw[i] << 16; /* bf16 is the high half of an f32 */
    memcpy(&k->logits[i], &bits, sizeof bits);
  }
  k->numel = BATCH * SEQ * 61;
  return DT_SUCCESS;
}

/* bf16 parameters and compute: the loss is the f32 cross-entropy of the bf16 logits (README:
 * "the loss in f32"), not a bf16-rounded number, even with the root's output dtype left as it
 * is. Each step's loss must equal the mean cross-entropy computed in double from the logits the
 * output projection produced (within 1e-5 relative; a bf16 rounding of a loss near 4 is off by
 * up to 4e-3), and its 16 low mantissa bits must not be zero at every step (a bf16 value cast to
 * f32 has them all zero). */
static void test_bf16_loss(void) {
  enum { STEPS_BF16 = 6 };
  run_t r = fsdp_run(1, 1);
  r.fsdp.param_dtype = DT_BF16;
  r.root_keep = 1;
  r.steps = STEPS_BF16;
  setup_t s;
  setup(&r, &s);
  static logits_keep_t k;
  dt_module_t out;
  DT_ASSERT_OK(dt_module_find(s.root, "output", &out));
  DT_ASSERT_OK(dt_module_add_forward_post_hook(out, keep_logits, &k));
  int zero_low = 0;
  double worst = 0;
  for (int step = 0; step < STEPS_BF16; step++) {
    k.numel = 0;
    float loss = fwd_bwd(&r, &s, step, 0, BATCH, 1.0);
    DT_ASSERT_EQ(k.numel, BATCH * SEQ * 61);
    int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
    DT_ASSERT_OK(dt_corpus_batch(g_corpus, 5, step, BATCH, SEQ, tok, tgt));
    double ce = 0;
    for (int i = 0; i < BATCH * SEQ; i++) {
      const float* row = k.logits + (size_t)i * 61;
      double mx = row[0], sum = 0;
      for (int c = 1; c < 61; c++) mx = row[c] > mx ? row[c] : mx;
      for (int c = 0; c < 61; c++) sum += exp(row[c] - mx);
      ce += log(sum) + mx - row[tgt[i]];
    }
    ce /= BATCH * SEQ;
    uint32_t bits;
    memcpy(&bits, &loss, sizeof bits);
    zero_low += (bits & 0xffffu) == 0;
    double rel = fabs(loss - ce) / ce;
    if (rel > worst) worst = rel;
    DT_ASSERT_TRUE(rel <= 1e-5, "step %d: loss %.9g, the f32 cross-entropy of the bf16 logits "
                   "%.9g (relative difference %.3g)", step, (double)loss, ce, rel);
    opt_step(&s);
  }
  DT_ASSERT_TRUE(zero_low < STEPS_BF16, "the loss's 16 low mantissa bits are zero at all %d "
                 "steps: a bf16-rounded loss", STEPS_BF16);
  if (g_rank == 0)
    printf("bf16 loss np %d: %d steps, worst relative difference from the f32 cross-entropy of "
           "the bf16 logits %.3g; %d of %d losses with 16 zero low bits\n", g_world, STEPS_BF16,
           worst, zero_low, STEPS_BF16);
  teardown(&s);
}

/* The groups of the model (root, layers.0, layers.1): their modules and infos. */
#define N_GROUPS 3
static void group_infos(const setup_t* s, dt_module_t* ms, dt_fsdp_group_info_t* gi) {
  for (int i = 0; i < N_GROUPS; i++) {
    ms[i] = s->root;
    if (i > 0) {
      char path[32];
      snprintf(path, sizeof path, "layers.%d", i - 1);
      DT_ASSERT_OK(dt_module_find(s->root, path, &ms[i]));
    }
    DT_ASSERT_OK(dt_fsdp_group_info(ms[i], &gi[i]));
  }
}

/* Elements moved per rank by the collectives of the counters (nccl-tests convention): an
 * all-gather or reduce-scatter of B bytes over n moves B (n-1)/n, an all-reduce 2 B (n-1)/n. */
static void test_traffic(void) {
  for (int reshard = 0; reshard <= (g_world == 4 ? 2 : 1); reshard++) {
    run_t r = fsdp_run(reshard, 1);
    setup_t s;
    setup(&r, &s);
    fwd_bwd(&r, &s, 0, 0, BATCH, 1.0); /* learn the orders, fill caches */
    opt_step(&s);
    int64_t padded = 0, groups = N_GROUPS, psi = 0;
    dt_module_t ms[N_GROUPS];
    dt_fsdp_group_info_t gi[N_GROUPS];
    group_infos(&s, ms, gi);
    for (int i = 0; i < N_GROUPS; i++) {
      padded += gi[i].padded_numel;
      psi += gi[i].numel;
    }
    DT_ASSERT_EQ(psi, s.numel);
    DT_ASSERT_OK(dt_counters_reset(NULL));
    g_no_loss_read = 1;
    fwd_bwd(&r, &s, 1, 0, BATCH, 1.0);
    g_no_loss_read = 0;
    dt_counters_t c;
    DT_ASSERT_OK(dt_counters_get(NULL, &c));
    const int64_t N = g_world;
    uint64_t ag_calls = c.calls[DT_COLL_ALL_GATHER], rs_calls = c.calls[DT_COLL_REDUCE_SCATTER];
    /* all-gather bytes are outputs: forward N*L per group; backward N*L again (reshard 1), none
     * (0), or the group's padded T over k (reshard k: counted as the k-rank gather's output) */
    uint64_t ag_bytes = c.nbytes[DT_COLL_ALL_GATHER], rs_bytes = c.nbytes[DT_COLL_REDUCE_SCATTER];
    int64_t ag_elems_moved = 0;
    if (reshard == 2) {
      /* forward: N*L over N ranks; backward: the group's T_pad over 2 ranks */
      int64_t tpad = 0;
      for (int i = 0; i < N_GROUPS; i++) tpad += gi[i].unsharded_nbytes / 4;
      DT_ASSERT_EQ(ag_bytes, 4 * (padded + tpad));
      ag_elems_moved = padded * (N - 1) / N + tpad / 2;
    } else {
      DT_ASSERT_EQ(ag_bytes, 4 * padded * (reshard ? 2 : 1));
      ag_elems_moved = padded * (N - 1) / N * (reshard ? 2 : 1);
    }
    DT_ASSERT_EQ(ag_calls, groups * (reshard ? 2 : 1));
    DT_ASSERT_EQ(rs_calls, groups);
    DT_ASSERT_EQ(rs_bytes, 4 * padded);
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_REDUCE], 0);
    int64_t moved = ag_elems_moved + padded * (N - 1) / N;
    if (g_rank == 0)
      printf("traffic reshard %d np %d: Psi %lld padded %lld; %llu all-gathers, %llu "
             "reduce-scatters; %lld elements moved per rank = %s Psi_pad (N-1)/N\n", reshard,
             g_world, (long long)psi, (long long)padded, (unsigned long long)ag_calls,
             (unsigned long long)rs_calls, (long long)moved,
             reshard == 1 ? "3" : reshard == 0 ? "2" : "(2 + (k-1)/k N/(N-1)) ");
    if (reshard == 1) DT_ASSERT_EQ(moved, 3 * padded * (N - 1) / N);
    if (reshard == 0) DT_ASSERT_EQ(moved, 2 * padded * (N - 1) / N);
    /* clipping the sharded gradients: one all-reduce (of the squared norm), nothing else */
    DT_ASSERT_OK(dt_counters_reset(NULL));
    double norm;
    DT_ASSERT_OK(dt_clip_grad_norm(s.np, s.params, 1.0, &norm));
    DT_ASSERT_OK(dt_counters_get(NULL, &c));
    uint64_t all = 0;
    for (int k = 1; k < DT_COLL_COUNT; k++) all += c.calls[k];
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_REDUCE], 1);
    DT_ASSERT_EQ(all, 1);
    opt_step(&s);
    teardown(&s);
  }
  if (g_world == 4) { /* HSDP 2x2: shard N = 2, replicas R = 2; + all-reduce of Psi_pad / N */
    run_t r = fsdp_run(1, 1);
    r.mesh2d = 1;
    r.fsdp = dt_fsdp_config_default(2);
    setup_t s;
    setup(&r, &s);
    fwd_bwd(&r, &s, 0, 0, BATCH, 1.0);
    opt_step(&s);
    int64_t padded = 0;
    dt_module_t ms[N_GROUPS];
    dt_fsdp_group_info_t gi[N_GROUPS];
    group_infos(&s, ms, gi);
    for (int i = 0; i < N_GROUPS; i++) {
      DT_ASSERT_EQ(gi[i].shard_size, 2);
      DT_ASSERT_EQ(gi[i].replicate_size, 2);
      padded += gi[i].padded_numel;
    }
    DT_ASSERT_OK(dt_counters_reset(NULL));
    g_no_loss_read = 1;
    fwd_bwd(&r, &s, 1, 0, BATCH, 1.0);
    g_no_loss_read = 0;
    dt_counters_t c;
    DT_ASSERT_OK(dt_counters_get(NULL, &c));
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_GATHER], 6);
    DT_ASSERT_EQ(c.nbytes[DT_COLL_ALL_GATHER], 4 * 2 * padded);
    DT_ASSERT_EQ(c.dim_calls[1][DT_COLL_REDUCE_SCATTER], 3);
    DT_ASSERT_EQ(c.dim_nbytes[1][DT_COLL_REDUCE_SCATTER], 4 * padded);
    DT_ASSERT_EQ(c.dim_calls[0][DT_COLL_ALL_REDUCE], 3);
    DT_ASSERT_EQ(c.dim_nbytes[0][DT_COLL_ALL_REDUCE], 4 * padded / 2);
    if (g_rank == 0)
      printf("traffic hsdp 2x2: Psi_pad %lld; all-gather %llu bytes, reduce-scatter %llu, "
             "replica all-reduce %llu bytes (Psi_pad / N elements)\n", (long long)padded,
             (unsigned long long)c.nbytes[DT_COLL_ALL_GATHER],
             (unsigned long long)c.dim_nbytes[1][DT_COLL_REDUCE_SCATTER],
             (unsigned long long)c.dim_nbytes[0][DT_COLL_ALL_REDUCE]);
    opt_step(&s);
    teardown(&s);
  }
}

/* Prefetch: after a step that learns the orders, a step gathers both blocks ahead of need in the
 * forward (the root prefetches block 0, block 0 block 1) and in the backward (the root block 1,
 * block 1 block 0); the root itself is gathered on demand. Without prefetch nothing is. */
static void test_prefetch(void) {
  for (int pf = 0; pf <= 1; pf++) {
    run_t r = fsdp_run(1, pf);
    setup_t s;
    setup(&r, &s);
    fwd_bwd(&r, &s, 0, 0, BATCH, 1.0);
    opt_step(&s);
    dt_module_t ms[N_GROUPS];
    dt_fsdp_group_info_t before[N_GROUPS], after[N_GROUPS];
    group_infos(&s, ms, before);
    fwd_bwd(&r, &s, 1, 0, BATCH, 1.0);
    opt_step(&s);
    for (int i = 0; i < N_GROUPS; i++) {
      DT_ASSERT_OK(dt_fsdp_group_info(ms[i], &after[i]));
      DT_ASSERT_EQ(after[i].gathers - before[i].gathers, 2);
      DT_ASSERT_EQ(after[i].reductions - before[i].reductions, 1);
      DT_ASSERT_EQ(after[i].prefetched - before[i].prefetched, (pf && i > 0) ? 2 : 0);
    }
    teardown(&s);
  }
}

static void test_memory(void) {
  dt_memory_stats_t m0, m;
  DT_ASSERT_OK(dt_memory_stats(&m0));
  run_t r = fsdp_run(1, 1);
  setup_t s;
  setup(&r, &s);
  int64_t shard_elems = 0, max_group = 0, root_group = 0;
  dt_module_t ms[N_GROUPS];
  dt_fsdp_group_info_t gi[N_GROUPS];
  group_infos(&s, ms, gi);
  for (int i = 0; i < N_GROUPS; i++) {
    shard_elems += gi[i].shard_numel;
    if (i == 0) root_group = gi[i].unsharded_nbytes;
    else if (gi[i].unsharded_nbytes > max_group) max_group = gi[i].unsharded_nbytes;
  }
  fwd_bwd(&r, &s, 0, 0, BATCH, 1.0);
  DT_ASSERT_OK(dt_memory_stats(&m));
  int64_t pbytes = m.current[DT_MEM_PARAMETERS] - m0.current[DT_MEM_PARAMETERS];
  int64_t gbytes = m.current[DT_MEM_GRADIENTS] - m0.current[DT_MEM_GRADIENTS];
  /* sharded parameters: views of each group's flat buffer, this rank's padded segment; their
   * gradients: views of the reduce-scatter's output, the same size */
  int64_t local = 0; /* the local shards (an AdamW moment of an empty one takes a 1-byte block) */
  for (int i = 0; i < s.np; i++) {
    int64_t n;
    DT_ASSERT_OK(dt_tensor_local_numel(dt_var_value(s.params[i]), &n));
    local += n > 0 ? 4 * n : 1;
  }
  DT_ASSERT_TRUE(pbytes == 4 * shard_elems && local <= pbytes,
                 "parameters hold %lld bytes, the local shards %lld, the padded segments %lld",
                 (long long)pbytes, (long long)local, (long long)(4 * shard_elems));
  DT_ASSERT_TRUE(gbytes == pbytes, "gradients %lld bytes, parameters %lld", (long long)gbytes,
                 (long long)pbytes);
  DT_ASSERT_OK(dt_memory_reset_peak());
  fwd_bwd(&r, &s, 1, 0, BATCH, 1.0);
  DT_ASSERT_OK(dt_memory_stats(&m));
  int64_t gathered_peak = m.peak[DT_MEM_PARAMETERS] - m0.current[DT_MEM_PARAMETERS] - pbytes;
  opt_step(&s);
  DT_ASSERT_OK(dt_memory_stats(&m));
  int64_t obytes = m.current[DT_MEM_OPTIMIZER] - m0.current[DT_MEM_OPTIMIZER];
  int64_t total = pbytes + gbytes + obytes;
  /* 16 Psi / N: 4 (parameter) + 4 (gradient) + 8 (two moments) bytes per element of the shard
   * (parameters and gradients padded, the moments not), and AdamW's step counters (8 bytes per
   * parameter) */
  int64_t want = 16 * shard_elems + 8 * s.np;
  DT_ASSERT_TRUE(total <= want && obytes == 2 * local + 8 * s.np,
                 "sharded state %lld bytes (params %lld, grads %lld, optimizer %lld); 16 Psi/N + "
                 "padding + steps = %lld", (long long)total, (long long)pbytes, (long long)gbytes,
                 (long long)obytes, (long long)want);
  DT_ASSERT_TRUE(gathered_peak <= root_group + max_group && gathered_peak >= max_group,
                 "gathered parameters peaked at %lld bytes; the root group is %lld, a block %lld",
                 (long long)gathered_peak, (long long)root_group, (long long)max_group);
  if (g_rank == 0)
    printf("memory np %d: Psi %lld; sharded state %lld bytes = %.2f x 16 Psi/N (params %lld, "
           "grads %lld, optimizer %lld); gathered-parameter peak %lld bytes (root group %lld + "
           "largest block %lld)\n", g_world, (long long)s.numel, (long long)total,
           (double)total / (16.0 * (double)s.numel / g_world), (long long)pbytes,
           (long long)gbytes, (long long)obytes, (long long)gathered_peak, (long long)root_group,
           (long long)max_group);
  teardown(&s);
}

/* The sharded parameters are views of their group's flat buffer, which the all-gather sends: a
 * value replaced with dt_var_set_value (a checkpoint load) must be gathered, and updated by the
 * optimizer, exactly like the same values written in place. */
static void test_replaced_values(void) {
  run_t r = fsdp_run(1, 1);
  setup_t a, b;
  setup(&r, &a);
  setup(&r, &b);
  float l0 = fwd_bwd(&r, &a, 0, 0, BATCH, 1.0);
  for (int i = 0; i < a.np; i++) DT_ASSERT_OK(dt_var_zero_grad(a.params[i]));
  const double half = 0.5;
  for (int i = 0; i < a.np; i++) {
    dt_tensor_t x;
    DT_ASSERT_OK(dt_op_run("mul_scalar", 1, (dt_tensor_t[]){dt_var_value(a.params[i])}, 0, NULL,
                           1, &half, &x));
    DT_ASSERT_OK(dt_var_set_value(a.params[i], x));
    dt_tensor_t v = dt_var_value(b.params[i]);
    DT_ASSERT_OK(dt_op_run_multi("scale_", 1, &v, 0, NULL, 1, &half, 0, NULL));
  }
  for (int step = 1; step < 3; step++) {
    float la = fwd_bwd(&r, &a, step, 0, BATCH, 1.0), lb = fwd_bwd(&r, &b, step, 0, BATCH, 1.0);
    DT_ASSERT_TRUE(la == lb, "step %d: loss %.9g after dt_var_set_value, %.9g after an in-place "
                   "write", step, (double)la, (double)lb);
    opt_step(&a);
    opt_step(&b);
  }
  float la = fwd_bwd(&r, &a, 0, 0, BATCH, 1.0);
  DT_ASSERT_TRUE(la != l0, "the replaced values were not gathered (loss %.9g both times)",
                 (double)l0);
  teardown(&a);
  teardown(&b);
}

/* dt_fsdp_config_for names the data dims; dt_fsdp_config_default is it for meshes of data dims
 * only. FSDP x TP on a (tp, dp) mesh is dt_fsdp_config_for(1, -1) (test_tp.c trains that). */
static void test_config_for(void) {
  dt_fsdp_config_t a = dt_fsdp_config_for(1, -1), b = dt_fsdp_config_default(1);
  DT_ASSERT_TRUE(a.shard_dim == 1 && a.replicate_dim == -1, "for(1, -1): shard %d replicate %d",
                 a.shard_dim, a.replicate_dim);
  b.shard_dim = 1; /* everything else: the same defaults */
  DT_ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0, "for(1, -1) is default(1) with shard dim 1");
  a = dt_fsdp_config_for(0, -1);
  b = dt_fsdp_config_default(1);
  DT_ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0, "default(1) is for(0, -1)");
  a = dt_fsdp_config_for(1, 0);
  b = dt_fsdp_config_default(2);
  DT_ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0, "default(2) is for(1, 0) (HSDP)");
  a = dt_fsdp_config_for(2, 1);
  DT_ASSERT_TRUE(a.shard_dim == 2 && a.replicate_dim == 1 && a.reshard_after_forward == 1 &&
                 a.param_dtype == DT_F32 && a.reduce_dtype == DT_F32 &&
                 a.output_dtype == DT_FSDP_KEEP_DTYPE && a.prefetch_forward &&
                 a.prefetch_backward, "for(2, 1): the defaults over dims 2 and 1");
  /* the dims are checked where they are used */
  int shape1[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape1, NULL, NULL, &mesh));
  dt_module_t m;
  DT_ASSERT_OK(dt_module_create("m", NULL, NULL, &m));
  a = dt_fsdp_config_for(1, -1);
  DT_ASSERT_STATUS(dt_fully_shard(m, mesh, &a), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_module_destroy(m));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* A module's forward: the sum of its parameter "w" squared. */
static dt_status_t sum_squares(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                               int n_out, dt_var_t* out) {
  (void)n_in;
  (void)in;
  (void)n_out;
  dt_var_t w = dt_module_get(m, "w"), two[2] = {w, w}, sq;
  DT_CHECK(dt_ag_op(tape, "mul", 2, two, 0, NULL, 0, NULL, 1, &sq));
  return dt_ag_op(tape, "sum", 1, &sq, 0, NULL, 0, NULL, 1, out);
}

static void test_bad_input(void) {
  int shape1[1] = {g_world};
  dt_mesh_t mesh, other;
  DT_ASSERT_OK(dt_mesh_create(1, shape1, NULL, NULL, &mesh));
  DT_ASSERT_OK(dt_mesh_create(1, shape1, NULL, NULL, &other));
  dt_llama_config_t c = model_config();
  dt_llama_t model;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
  dt_module_t root, blk;
  DT_ASSERT_OK(dt_llama_module(model, &root));
  DT_ASSERT_OK(dt_module_find(root, "layers.0", &blk));
  dt_var_t* params;
  int np0, np;
  int64_t numel;
  DT_ASSERT_OK(dt_llama_params(model, &params, NULL, &np0, &numel));
  dt_var_t first = params[1];
  dt_fsdp_config_t cfg = dt_fsdp_config_default(1);

  cfg.shard_dim = 1; /* not a dim of the 1-D mesh */
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  cfg = dt_fsdp_config_default(1);
  cfg.replicate_dim = 0; /* the shard dim */
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  cfg = dt_fsdp_config_default(1);
  cfg.shard_span = 2; /* dims 0 and 1: the mesh has one */
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "shard_span 2 from shard dim 0") != NULL, "message: %s",
                 dt_last_error());
  cfg.shard_span = -1;
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  cfg = dt_fsdp_config_default(1);
  cfg.param_dtype = DT_I32;
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  cfg = dt_fsdp_config_default(1);
  cfg.reshard_after_forward = g_world + 1; /* does not divide the shard dim */
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  cfg.reshard_after_forward = -1;
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  cfg = dt_fsdp_config_default(1);
  DT_ASSERT_STATUS(dt_fully_shard(blk, other, &cfg), DT_ERR_INVALID_ARG); /* another mesh */
  DT_ASSERT_STATUS(dt_fully_shard(NULL, mesh, &cfg), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_fully_shard(blk, NULL, &cfg), DT_ERR_INVALID_ARG);
  { /* a scalar parameter (a learned temperature): refused on every rank, the message naming it
     * and the fix (shape (1), FSDP2's advice); the module's other parameter left as it was */
    dt_var_t sc, w1;
    const int64_t one = 1;
    dt_module_t sm;
    DT_ASSERT_OK(dt_nn_param(mesh, NULL, "temp", 0, &one, DT_INIT_ONES, 0, 1, &sc));
    DT_ASSERT_OK(dt_nn_param(mesh, NULL, "w", 1, &one, DT_INIT_ONES, 0, 1, &w1));
    DT_ASSERT_OK(dt_module_create("scaled", NULL, NULL, &sm));
    DT_ASSERT_OK(dt_module_add_param(sm, "w", w1));
    DT_ASSERT_OK(dt_module_add_param(sm, "temp", sc));
    DT_ASSERT_STATUS(dt_fully_shard(sm, mesh, &cfg), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "'temp' is a scalar (0-d)") != NULL &&
                   strstr(dt_last_error(), "shape (1)") != NULL, "message: %s", dt_last_error());
    DT_ASSERT_TRUE(!dt_fsdp_is_group(sm) && dt_module_get(sm, "w") == w1,
                   "a refused wrap changed the module");
    DT_ASSERT_OK(dt_module_destroy(sm));
  }
  /* nothing was wrapped: same parameters, same placements */
  DT_ASSERT_OK(dt_llama_params(model, &params, NULL, &np, &numel));
  DT_ASSERT_EQ(np, np0);
  DT_ASSERT_TRUE(params[1] == first && !dt_fsdp_is_group(blk), "a failed wrap changed the module");
  dt_placement_t pl;
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(params[1]), &pl));
  DT_ASSERT_TRUE(pl.kind == DT_REPLICATE, "a failed wrap resharded a parameter");
  /* a parameter already sharded over the shard dim (experts under expert parallelism) is left
   * out of the group as it is: alone, the group holds nothing (a group without parameters);
   * beside a replicated one, the group takes only the replicated one */
  int64_t shp[2] = {4, 4};
  dt_var_t sv, rv, got;
  DT_ASSERT_OK(dt_nn_param(mesh, "*=S(0)", "x", 2, shp, DT_INIT_ONES, 0, 1, &sv));
  dt_module_t lone;
  DT_ASSERT_OK(dt_module_create("lone", NULL, NULL, &lone));
  DT_ASSERT_OK(dt_module_add_param(lone, "x", sv));
  DT_ASSERT_OK(dt_fully_shard(lone, mesh, &cfg));
  DT_ASSERT_OK(dt_module_param(lone, "x", &got));
  DT_ASSERT_TRUE(got == sv, "fsdp replaced an already sharded parameter");
  dt_fsdp_group_info_t li;
  DT_ASSERT_OK(dt_fsdp_group_info(lone, &li));
  DT_ASSERT_TRUE(li.n_params == 0 && li.numel == 0 && li.padded_numel == 0 &&
                 li.unsharded_nbytes == 0, "a group of no parameter: %d parameters, %lld "
                 "elements, %lld padded, %lld gathered bytes", li.n_params, (long long)li.numel,
                 (long long)li.padded_numel, (long long)li.unsharded_nbytes);
  DT_ASSERT_OK(dt_module_destroy(lone));
  DT_ASSERT_OK(dt_nn_param(mesh, "*=S(0)", "x", 2, shp, DT_INIT_ONES, 0, 1, &sv));
  DT_ASSERT_OK(dt_module_create("pair", NULL, NULL, &lone));
  DT_ASSERT_OK(dt_module_add_param(lone, "x", sv));
  DT_ASSERT_OK(dt_nn_param(mesh, NULL, "y", 2, shp, DT_INIT_ONES, 0, 1, &rv));
  DT_ASSERT_OK(dt_module_add_param(lone, "y", rv));
  DT_ASSERT_OK(dt_fully_shard(lone, mesh, &cfg));
  DT_ASSERT_OK(dt_module_param(lone, "x", &got));
  DT_ASSERT_TRUE(got == sv, "fsdp replaced an already sharded parameter");
  DT_ASSERT_OK(dt_fsdp_group_info(lone, &li));
  DT_ASSERT_EQ(li.n_params, 1);
  DT_ASSERT_OK(dt_module_destroy(lone));
  /* parameters of two dtypes in one group (its shards share one flat buffer) */
  dt_placement_t r1 = dt_replicate();
  dt_tensor_t ta, tb;
  dt_var_t va, vb;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, shp, &r1, &ta));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_BF16, 2, shp, &r1, &tb));
  DT_ASSERT_OK(dt_var_leaf(ta, 1, &va));
  DT_ASSERT_OK(dt_var_leaf(tb, 1, &vb));
  DT_ASSERT_OK(dt_module_create("mixed", NULL, NULL, &lone));
  DT_ASSERT_OK(dt_module_add_param(lone, "a", va));
  DT_ASSERT_OK(dt_module_add_param(lone, "b", vb));
  DT_ASSERT_STATUS(dt_fully_shard(lone, mesh, &cfg), DT_ERR_UNSUPPORTED);
  DT_ASSERT_OK(dt_module_destroy(lone));
  /* wrapping twice; a module inside a group wrapped before it (top-down); sync on a module
   * without groups */
  DT_ASSERT_OK(dt_fully_shard(blk, mesh, &cfg));
  DT_ASSERT_TRUE(dt_fsdp_is_group(blk), "wrapped block is a group");
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_USAGE);
  dt_module_t emb;
  DT_ASSERT_OK(dt_module_find(root, "tok_emb", &emb));
  DT_ASSERT_STATUS(dt_fsdp_set_requires_gradient_sync(emb, 0), DT_ERR_INVALID_ARG);
  dt_module_t inner;
  DT_ASSERT_OK(dt_module_find(root, "layers.0", &inner));
  dt_module_t attn;
  DT_ASSERT_OK(dt_module_child(inner, 1, &attn));
  DT_ASSERT_STATUS(dt_fully_shard(attn, mesh, &cfg), DT_ERR_INVALID_USAGE); /* top-down */
  DT_ASSERT_TRUE(strstr(dt_last_error(), "an unnamed module in 'layers.0' is inside module "
                        "'layers.0', which was wrapped (FSDP) before it") != NULL &&
                 strstr(dt_last_error(), "wrap bottom-up") != NULL, "message: %s",
                 dt_last_error());
  DT_ASSERT_OK(dt_module_find(root, "layers.1", &inner));
  DT_ASSERT_OK(dt_module_child(inner, 1, &attn));
  DT_ASSERT_OK(dt_fully_shard(attn, mesh, &cfg)); /* bottom-up below an unwrapped block: fine */
  DT_ASSERT_OK(dt_fsdp_group_info(attn, &li));
  DT_ASSERT_EQ(li.n_params, 4); /* wq wk wv wo */
  DT_ASSERT_OK(dt_fully_shard(root, mesh, &cfg));
  DT_ASSERT_STATUS(dt_fully_shard(root, mesh, &cfg), DT_ERR_INVALID_USAGE);
  DT_ASSERT_STATUS(dt_fsdp_set_prefetch(emb, 1, 1), DT_ERR_INVALID_ARG);
  /* a forward that fails halfway (a token id out of range, found on every rank) leaves the
   * groups usable: the next step runs and the module holds the sharded parameters again */
  {
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
    DT_ASSERT_OK(dt_corpus_batch(g_corpus, 5, 0, BATCH, SEQ, tok, tgt));
    pl = dt_shard(0);
    const int64_t shape[2] = {BATCH, SEQ};
    for (int pass = 0; pass < 2; pass++) {
      tok[3] = pass == 0 ? 999 : 1;
      dt_tensor_t tt, gt;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &pl, tok, &tt));
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &pl, tgt, &gt));
      dt_var_t loss;
      dt_status_t st = dt_llama_forward(model, tape, tt, gt, &loss, NULL);
      if (pass == 0) {
        DT_ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
      } else {
        DT_ASSERT_OK(st);
        DT_ASSERT_OK(dt_tape_backward(tape, loss));
      }
      DT_ASSERT_OK(dt_tape_reset(tape));
      dt_tensor_destroy(tt);
      dt_tensor_destroy(gt);
    }
    DT_ASSERT_OK(dt_llama_params(model, &params, NULL, &np, &numel));
    for (int i = 0; i < np; i++) {
      DT_ASSERT_OK(dt_tensor_placements(dt_var_value(params[i]), &pl));
      DT_ASSERT_TRUE(pl.kind == DT_SHARD && dt_var_grad(params[i]) != NULL,
                     "parameter %d after a failed and a good step: sharded with a gradient", i);
    }
    DT_ASSERT_OK(dt_tape_destroy(tape));
  }
  /* a sharded parameter replaced by a meta tensor on every rank: the forward fails on every
   * rank, those with an empty shard included (one row over the ranks), instead of these going
   * on into the all-gather the others have left */
  {
    const int64_t one[1] = {1};
    dt_placement_t rep = dt_replicate(), sp;
    dt_tensor_t t, meta;
    dt_var_t w, out;
    DT_ASSERT_OK(dt_tensor_ones(mesh, DT_F32, 1, one, &rep, &t));
    DT_ASSERT_OK(dt_var_leaf(t, 1, &w));
    DT_ASSERT_OK(dt_module_create("tiny", sum_squares, NULL, &lone));
    DT_ASSERT_OK(dt_module_add_param(lone, "w", w));
    DT_ASSERT_OK(dt_fully_shard(lone, mesh, &cfg));
    w = dt_module_get(lone, "w");
    DT_ASSERT_OK(dt_tensor_placements(dt_var_value(w), &sp));
    DT_ASSERT_OK(dt_tensor_meta(mesh, DT_F32, 1, one, &sp, &meta));
    DT_ASSERT_OK(dt_var_set_value(w, meta));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    DT_ASSERT_STATUS(dt_module_forward(lone, tape, 0, NULL, 1, &out), DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "'w' has no data") != NULL, "message: %s",
                   dt_last_error());
    DT_ASSERT_OK(dt_tape_destroy(tape));
    DT_ASSERT_OK(dt_module_destroy(lone));
  }
  DT_ASSERT_OK(dt_llama_destroy(model)); /* frees the groups with the modules */
  DT_ASSERT_OK(dt_mesh_destroy(other));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* Deferred initialization (dt_llama_config_t.defer_init): the model built as layouts, wrapped
 * by FSDP, then dt_llama_init_weights fills each rank's shards. Every parameter equals the eager
 * build's bit for bit, and the build never held the whole model: the peak of all memory from
 * creation to initialization stays under 3/4 of the model's f32 bytes (the eager build's peak,
 * also checked, is at least all of them). Unwrapped, init_weights materializes the meta
 * parameters themselves; dt_nn_param_init refuses NULL arguments. */
static int64_t global_numel(dt_tensor_t t) {
  int nd;
  int64_t sh[DT_MAX_DIMS], k = 1;
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, sh));
  for (int d = 0; d < nd; d++) k *= sh[d];
  return k;
}

static void test_defer_init(void) {
  int shape1[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape1, NULL, NULL, &mesh));
  dt_llama_config_t c = model_config();
  dt_memory_stats_t ms;
  /* eager: the reference values */
  DT_ASSERT_OK(dt_memory_reset_peak());
  dt_memory_stats_t m0;
  DT_ASSERT_OK(dt_memory_stats(&m0));
  dt_llama_t eager;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &eager));
  DT_ASSERT_OK(dt_memory_stats(&ms));
  dt_var_t* ep;
  const char* const* en;
  int n;
  int64_t numel;
  DT_ASSERT_OK(dt_llama_params(eager, &ep, &en, &n, &numel));
  const int64_t full_nbytes = numel * (int64_t)sizeof(float);
  DT_ASSERT_TRUE(ms.total_peak - m0.total_current >= full_nbytes, "the eager build peaked at "
                 "%lld bytes, below the model's %lld", (long long)(ms.total_peak -
                 m0.total_current), (long long)full_nbytes);
  float* want = malloc(sizeof(float) * (size_t)numel);
  float* got = malloc(sizeof(float) * (size_t)numel);
  DT_ASSERT_TRUE(want && got, "out of memory");
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    const int64_t k = global_numel(dt_var_value(ep[i]));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(ep[i]), want + off, sizeof(float) * (size_t)k));
    off += k;
  }
  DT_ASSERT_OK(dt_llama_destroy(eager));
  for (int wrap = 1; wrap >= 0; wrap--) {
    DT_ASSERT_OK(dt_memory_stats(&m0));
    DT_ASSERT_OK(dt_memory_reset_peak());
    c.defer_init = 1;
    dt_llama_t model;
    DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
    dt_module_t root;
    DT_ASSERT_OK(dt_llama_module(model, &root));
    if (wrap) {
      const dt_fsdp_config_t fc = dt_fsdp_config_default(1);
      wrap_blocks(root, mesh, c.n_layers, &fc, &fc);
    }
    DT_ASSERT_OK(dt_llama_init_weights(model));
    DT_ASSERT_OK(dt_memory_stats(&ms));
    const int64_t held = ms.total_peak - m0.total_current;
    if (g_rank == 0)
      printf("deferred init%s np %d: peak %lld bytes from creation to initialization, the model "
             "%lld\n", wrap ? " under FSDP" : " (unwrapped)", g_world, (long long)held,
             (long long)full_nbytes);
    if (wrap)
      DT_ASSERT_TRUE(held * 4 < full_nbytes * 3, "deferred init under FSDP peaked at %lld bytes "
                     "of a %lld-byte model", (long long)held, (long long)full_nbytes);
    dt_var_t* p;
    DT_ASSERT_OK(dt_llama_params(model, &p, NULL, &n, NULL));
    off = 0;
    for (int i = 0; i < n; i++) {
      const int64_t k = global_numel(dt_var_value(p[i]));
      DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(p[i]), got + off,
                                         sizeof(float) * (size_t)k));
      off += k;
    }
    DT_ASSERT_TRUE(off == numel && memcmp(got, want, sizeof(float) * (size_t)numel) == 0,
                   "deferred init%s differs from the eager build", wrap ? " under FSDP" : "");
    DT_ASSERT_OK(dt_llama_destroy(model));
  }
  DT_ASSERT_STATUS(dt_nn_param_init(NULL, "x", DT_INIT_ONES, 0, 0), DT_ERR_INVALID_ARG);
  free(want);
  free(got);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* Stacked experts with fewer experts than shard ranks (2 experts (2, F, D) over 4 ranks): FSDP
 * splits their first dim with enough entries (F = 50: 13, 13, 13, 11 rows) instead of giving two
 * ranks a padded expert each and two nothing; with as many experts as ranks (np 2) dim 0. Every
 * rank's shard holds its part and no padding; 20 steps train to the dense curve within 1e-5. */
static void test_few_rows(void) {
  run_t dense;
  memset(&dense, 0, sizeof dense);
  dense.mode = MODE_DENSE;
  dense.steps = STEPS;
  dense.experts = 2;
  float ref[STEPS];
  train(&dense, ref);
  run_t r = fsdp_run(1, 1);
  r.experts = 2;
  setup_t s;
  setup(&r, &s);
  const char* const* names;
  DT_ASSERT_OK(dt_llama_params(s.model, &s.params, &names, &s.np, NULL));
  int seen = 0;
  for (int i = 0; i < s.np; i++) {
    if (strstr(names[i], "experts.") == NULL) continue;
    dt_tensor_t t = dt_var_value(s.params[i]);
    dt_placement_t pl[1];
    int64_t gs[3], ls[3];
    DT_ASSERT_OK(dt_tensor_placements(t, pl));
    DT_ASSERT_OK(dt_tensor_shape(t, gs));
    DT_ASSERT_OK(dt_tensor_local_shape(t, ls));
    const int want = g_world > 2 ? 1 : 0; /* 2 experts: dim 0 over 2 ranks, dim 1 over 4 */
    DT_ASSERT_TRUE(pl[0].kind == DT_SHARD && pl[0].dim == want, "%s: placed %d(%d), want "
                   "Shard(%d)", names[i], pl[0].kind, pl[0].dim, want);
    int64_t off, len;
    dt_chunk(gs[want], g_world, g_rank, &off, &len);
    for (int d = 0; d < 3; d++)
      DT_ASSERT_EQ(ls[d], d == want ? len : gs[d]);
    seen++;
  }
  DT_ASSERT_EQ(seen, 6); /* w1, w3, w2 of 2 layers */
  teardown(&s);
  parity("fsdp, 2 experts (few rows)", &r, ref, 1e-5);
}

/* shard_span on a 2x2 mesh (np 4): a replicate dim among the shard dims and reshard to groups
 * of k over two shard dims refused, naming the reason, and nothing wrapped. */
static void test_span_bad(void) {
  if (g_world != 4) return;
  int shape2[2] = {2, 2};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(2, shape2, NULL, NULL, &mesh));
  dt_llama_config_t c = model_config();
  dt_llama_t model;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
  dt_module_t root, blk;
  DT_ASSERT_OK(dt_llama_module(model, &root));
  DT_ASSERT_OK(dt_module_find(root, "layers.0", &blk));
  dt_fsdp_config_t cfg = dt_fsdp_config_for(0, 1);
  cfg.shard_span = 2; /* dim 1 both a shard and the replicate dim */
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "replicate dim 1") != NULL, "message: %s",
                 dt_last_error());
  cfg = dt_fsdp_config_for(0, -1);
  cfg.shard_span = 2;
  cfg.reshard_after_forward = 2;
  DT_ASSERT_STATUS(dt_fully_shard(blk, mesh, &cfg), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "need one shard dim") != NULL, "message: %s",
                 dt_last_error());
  DT_ASSERT_TRUE(!dt_fsdp_is_group(blk), "a refused config wrapped the block");
  /* accepted: the group's shard size is the product of both dims */
  cfg.reshard_after_forward = 1;
  DT_ASSERT_OK(dt_fully_shard(blk, mesh, &cfg));
  dt_fsdp_group_info_t gi;
  DT_ASSERT_OK(dt_fsdp_group_info(blk, &gi));
  DT_ASSERT_TRUE(gi.shard_size == 4 && gi.replicate_size == 1, "shard %d replicate %d",
                 gi.shard_size, gi.replicate_size);
  DT_ASSERT_OK(dt_llama_destroy(model));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* Misuse and corner cases of the wrapper (a review's findings): a frozen parameter stays
 * frozen; a forward that fails puts the sharded parameters back; a module destroyed between
 * forward and backward fails the backward (no use after free); an unevenly tensor-parallel
 * parameter gets the same placements on every rank (2x2 mesh); reshard k or shard_span on a mesh
 * over part of the world is refused by every member (no collective over the world that the
 * others never join); a destroyed module is DT_ERR_INVALID_USAGE. */
static dt_module_t tiny_mlp(dt_mesh_t mesh, int frozen_bias) {
  dt_module_t l[2], m;
  DT_ASSERT_OK(dt_linear_create(mesh, "fc1", 5, 3, 1, 1, &l[0]));
  DT_ASSERT_OK(dt_linear_create(mesh, "fc2", 3, 2, 1, 2, &l[1]));
  if (frozen_bias) { /* fc1.bias: a frozen leaf of the same value */
    float v[3];
    const int64_t n3 = 3;
    dt_placement_t r = dt_replicate();
    dt_tensor_t c;
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(dt_module_get(l[0], "bias")), v, sizeof v));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 1, &n3, &r, v, &c));
    dt_var_t nb;
    DT_ASSERT_OK(dt_var_leaf(c, 0, &nb));
    DT_ASSERT_OK(dt_module_set_param(l[0], "bias", nb));
  }
  DT_ASSERT_OK(dt_sequential_create("mlp", 2, l, &m));
  return m;
}

static dt_status_t tiny_forward(dt_module_t m, dt_tape_t tape, int in_features, dt_var_t* loss) {
  dt_mesh_t mesh;
  DT_CHECK(dt_tensor_mesh(dt_var_value(dt_module_get(m, "fc1.weight")), &mesh));
  const int64_t xs[2] = {6, in_features};
  dt_placement_t r = dt_replicate();
  dt_tensor_t xt;
  dt_var_t xv, y;
  DT_CHECK(dt_tensor_full_value(mesh, DT_F32, 2, xs, &r, 0.5, &xt));
  DT_CHECK(dt_tape_constant(tape, xt, &xv));
  DT_CHECK(dt_module_forward(m, tape, 1, &xv, 1, &y));
  return dt_ag_op(tape, "sum", 1, &y, 0, NULL, 0, NULL, 1, loss);
}

/* One forward and backward of the tiny MLP; the reduce-scatters it made (calls, bytes). */
static void rs_traffic(dt_module_t m, dt_mesh_t mesh, dt_tape_t tape, uint64_t* calls,
                       uint64_t* nbytes) {
  dt_var_t loss, *ps;
  int n;
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_reset(mesh));
  DT_ASSERT_OK(tiny_forward(m, tape, 5, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_counters_get(mesh, &c));
  *calls = c.calls[DT_COLL_REDUCE_SCATTER];
  *nbytes = c.nbytes[DT_COLL_REDUCE_SCATTER];
  DT_ASSERT_OK(dt_tape_reset(tape));
  DT_ASSERT_OK(dt_module_params(m, &ps, &n));
  for (int i = 0; i < n; i++) DT_ASSERT_OK(dt_var_zero_grad(ps[i]));
}

static void test_misuse(void) {
  int shape1[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape1, NULL, NULL, &mesh));
  dt_fsdp_config_t cfg = dt_fsdp_config_default(1);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t loss;
  /* a frozen parameter: no gradient, not moved by AdamW; the others train */
  {
    dt_module_t m = tiny_mlp(mesh, 1);
    DT_ASSERT_OK(dt_fully_shard(m, mesh, &cfg));
    dt_var_t b = dt_module_get(m, "fc1.bias"), w = dt_module_get(m, "fc1.weight");
    int rg = -1;
    DT_ASSERT_OK(dt_var_requires_grad(b, &rg));
    DT_ASSERT_EQ(rg, 0);
    float before[3], after[3];
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(b), before, sizeof before));
    DT_ASSERT_OK(tiny_forward(m, tape, 5, &loss));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_TRUE(dt_var_grad(b) == NULL && dt_var_grad(w) != NULL, "frozen bias has a "
                   "gradient (%p) or the weight has none (%p)", (void*)dt_var_grad(b),
                   (void*)dt_var_grad(w));
    dt_var_t* ps;
    int n;
    DT_ASSERT_OK(dt_module_params(m, &ps, &n));
    dt_adamw_config_t ac = dt_adamw_config_default();
    dt_adamw_t opt;
    DT_ASSERT_OK(dt_adamw_create(&ac, n, ps, &opt));
    DT_ASSERT_OK(dt_adamw_step(opt, DT_ADAMW_LR_CONFIG));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(b), after, sizeof after));
    DT_ASSERT_TRUE(memcmp(before, after, sizeof before) == 0, "the frozen bias moved");
    DT_ASSERT_OK(dt_adamw_destroy(opt));
    DT_ASSERT_OK(dt_tape_reset(tape));
    /* flags changed between steps: the bias unfrozen gets its gradient (loss = sum(fc2(fc1(x))),
     * 6 rows: d/db1[j] = 6 * sum_k W2[k][j]), the weight frozen gets none */
    DT_ASSERT_STATUS(dt_var_set_requires_grad(loss, 0), DT_ERR_INVALID_USAGE); /* reset: dead */
    DT_ASSERT_OK(dt_var_set_requires_grad(b, 1));
    DT_ASSERT_OK(dt_var_set_requires_grad(w, 0));
    for (int i = 0; i < n; i++) DT_ASSERT_OK(dt_var_zero_grad(ps[i]));
    DT_ASSERT_OK(tiny_forward(m, tape, 5, &loss));
    DT_ASSERT_STATUS(dt_var_set_requires_grad(loss, 0), DT_ERR_INVALID_ARG); /* not a leaf */
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_TRUE(dt_var_grad(b) != NULL && dt_var_grad(w) == NULL, "unfrozen bias without a "
                   "gradient (%p) or frozen weight with one (%p)", (void*)dt_var_grad(b),
                   (void*)dt_var_grad(w));
    float w2[6], gb[3];
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(dt_module_get(m, "fc2.weight")), w2,
                                       sizeof w2));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(b), gb, sizeof gb));
    for (int j = 0; j < 3; j++) {
      const double want = 6.0 * ((double)w2[j] + (double)w2[3 + j]);
      DT_ASSERT_TRUE(fabs(gb[j] - want) <= 1e-5 * (1.0 + fabs(want)), "unfrozen bias gradient "
                     "%d: %g, want %g", j, (double)gb[j], want);
    }
    DT_ASSERT_OK(dt_tape_reset(tape));
    for (int i = 0; i < n; i++) DT_ASSERT_OK(dt_var_zero_grad(ps[i]));
    /* the reduce-scatter carries only what trains (as FSDP2's): fewer bytes with a parameter
     * frozen, no reduce-scatter for a group with every parameter frozen (fc1 and the root wrapped
     * apart); the flags must agree across ranks */
    {
      dt_module_t m2 = tiny_mlp(mesh, 0), fc1;
      DT_ASSERT_OK(dt_module_find(m2, "fc1", &fc1));
      DT_ASSERT_OK(dt_fully_shard(fc1, mesh, &cfg));
      DT_ASSERT_OK(dt_fully_shard(m2, mesh, &cfg));
      dt_var_t w1 = dt_module_get(m2, "fc1.weight"), b1 = dt_module_get(m2, "fc1.bias");
      uint64_t c_all, b_all, c_w, b_w, c_fc1, b_fc1;
      rs_traffic(m2, mesh, tape, &c_all, &b_all); /* every parameter trains */
      DT_ASSERT_OK(dt_var_set_requires_grad(w1, 0));
      rs_traffic(m2, mesh, tape, &c_w, &b_w); /* fc1.weight frozen */
      DT_ASSERT_OK(dt_var_set_requires_grad(b1, 0));
      rs_traffic(m2, mesh, tape, &c_fc1, &b_fc1); /* fc1 frozen: its group reduces nothing */
      if (g_world > 1)
        DT_ASSERT_TRUE(c_all == 2 && c_w == 2 && c_fc1 == 1 && b_w < b_all && b_fc1 < b_w,
                       "reduce-scatters (calls, bytes): all training %llu, %llu; fc1.weight "
                       "frozen %llu, %llu; fc1 frozen %llu, %llu", (unsigned long long)c_all,
                       (unsigned long long)b_all, (unsigned long long)c_w,
                       (unsigned long long)b_w, (unsigned long long)c_fc1,
                       (unsigned long long)b_fc1);
      /* and the gradients of what trains are still right: fc2's bias, d/db = 6 per output */
      DT_ASSERT_OK(tiny_forward(m2, tape, 5, &loss));
      DT_ASSERT_OK(dt_tape_backward(tape, loss));
      float gb2[2];
      dt_var_t b2 = dt_module_get(m2, "fc2.bias");
      DT_ASSERT_TRUE(dt_var_grad(w1) == NULL && dt_var_grad(b1) == NULL && dt_var_grad(b2) != NULL,
                     "frozen fc1 with a gradient, or fc2.bias without one");
      DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(b2), gb2, sizeof gb2));
      DT_ASSERT_TRUE(gb2[0] == 6.0f && gb2[1] == 6.0f, "fc2.bias gradient %g %g, want 6 6",
                     (double)gb2[0], (double)gb2[1]);
      DT_ASSERT_OK(dt_tape_reset(tape));
      DT_ASSERT_OK(dt_module_destroy(m2));
    }
    DT_ASSERT_OK(dt_var_set_requires_grad(b, 0)); /* back as built, for what follows */
    DT_ASSERT_OK(dt_var_set_requires_grad(w, 1));
    /* a forward that fails (6 input features for 5) puts the sharded parameters back */
    DT_ASSERT_STATUS(tiny_forward(m, tape, 6, &loss), DT_ERR_INVALID_ARG);
    DT_ASSERT_OK(dt_module_params(m, &ps, &n));
    for (int i = 0; i < n; i++) {
      dt_placement_t pl;
      int meta = 1;
      DT_ASSERT_OK(dt_tensor_placements(dt_var_value(ps[i]), &pl));
      DT_ASSERT_OK(dt_tensor_is_meta(dt_var_value(ps[i]), &meta));
      DT_ASSERT_TRUE(pl.kind == DT_SHARD && !meta, "after a failed forward parameter %d is "
                     "kind %d (meta %d), not its shard", i, pl.kind, meta);
    }
    DT_ASSERT_OK(dt_tape_reset(tape));
    /* destroyed between forward and backward: the backward fails, reads nothing freed */
    {
      /* a pre hook that fails after swapping the gathered parameters in (bf16: the input's cast
       * meets a destroyed variable) puts the shards back too */
      dt_module_t mb = tiny_mlp(mesh, 0);
      dt_fsdp_config_t cb = dt_fsdp_config_default(1);
      cb.param_dtype = DT_BF16;
      DT_ASSERT_OK(dt_fully_shard(mb, mesh, &cb));
      const int64_t xs[2] = {6, 5};
      dt_placement_t r = dt_replicate();
      dt_tensor_t xt;
      dt_var_t xv, y;
      DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, xs, &r, &xt));
      DT_ASSERT_OK(dt_var_leaf(xt, 0, &xv));
      DT_ASSERT_OK(dt_var_destroy(xv));
      DT_ASSERT_TRUE(dt_module_forward(mb, tape, 1, &xv, 1, &y) != DT_SUCCESS,
                     "a forward on a destroyed input succeeded");
      dt_var_t* pb;
      int nb;
      DT_ASSERT_OK(dt_module_params(mb, &pb, &nb));
      for (int i = 0; i < nb; i++) {
        dt_placement_t pl;
        DT_ASSERT_OK(dt_tensor_placements(dt_var_value(pb[i]), &pl));
        DT_ASSERT_TRUE(pl.kind == DT_SHARD, "after a failed pre hook parameter %d is kind %d", i,
                       pl.kind);
      }
      DT_ASSERT_OK(dt_tape_reset(tape));
      DT_ASSERT_OK(dt_module_destroy(mb));
    }
    DT_ASSERT_OK(tiny_forward(m, tape, 5, &loss));
    DT_ASSERT_OK(dt_module_destroy(m));
    DT_ASSERT_STATUS(dt_tape_backward(tape, loss), DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "destroyed before the backward") != NULL,
                   "message: %s", dt_last_error());
    DT_ASSERT_OK(dt_tape_reset(tape));
    DT_ASSERT_STATUS(dt_fully_shard(m, mesh, &cfg), DT_ERR_INVALID_USAGE);
    DT_ASSERT_STATUS(dt_fsdp_set_prefetch(m, 1, 1), DT_ERR_INVALID_USAGE);
    DT_ASSERT_STATUS(dt_fsdp_set_requires_gradient_sync(m, 0), DT_ERR_INVALID_USAGE);
  }
  if (g_world == 4) {
    /* (tp, dp) = 2x2, a (3, 4) parameter Shard(0) over tp: tp rank 0 holds 2 rows, tp rank 1
     * one (fewer than dp's 2 ranks); FSDP splits dim 0 on both, so every rank agrees */
    int s2[2] = {2, 2};
    const char* names[2] = {"tp", "dp"};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, s2, names, NULL, &m2));
    float full[12], got[12];
    for (int i = 0; i < 12; i++) full[i] = 0.25f * (float)i - 1.0f;
    const int64_t ps2[2] = {3, 4};
    dt_placement_t pl[2] = {dt_shard(0), dt_replicate()}, q[2];
    dt_tensor_t t;
    dt_var_t w;
    DT_ASSERT_OK(dt_tensor_from_full(m2, DT_F32, 2, ps2, pl, full, &t));
    DT_ASSERT_OK(dt_var_leaf(t, 1, &w));
    dt_module_t m;
    DT_ASSERT_OK(dt_module_create("uneven", sum_squares, NULL, &m));
    DT_ASSERT_OK(dt_module_add_param(m, "w", w));
    dt_fsdp_config_t c2 = dt_fsdp_config_for(1, -1);
    DT_ASSERT_OK(dt_fully_shard(m, m2, &c2));
    w = dt_module_get(m, "w");
    DT_ASSERT_OK(dt_tensor_placements(dt_var_value(w), q));
    DT_ASSERT_TRUE(q[0].kind == DT_SHARD && q[0].dim == 0 && q[1].kind == DT_SHARD &&
                   q[1].dim == 0, "rank %d: placements kind %d dim %d, kind %d dim %d", g_rank,
                   q[0].kind, q[0].dim, q[1].kind, q[1].dim);
    DT_ASSERT_OK(dt_module_forward(m, tape, 0, NULL, 1, &loss));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w), got, sizeof got));
    for (int i = 0; i < 12; i++) DT_ASSERT_TRUE(got[i] == full[i], "w[%d] = %g", i, got[i]);
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(w), got, sizeof got));
    for (int i = 0; i < 12; i++)
      DT_ASSERT_TRUE(got[i] == 2 * full[i], "dw[%d] = %g, want %g", i, got[i], 2 * full[i]);
    DT_ASSERT_OK(dt_tape_reset(tape));
    DT_ASSERT_OK(dt_module_destroy(m));
    DT_ASSERT_OK(dt_mesh_destroy(m2));
    /* a mesh over world ranks 0 and 1: reshard k = 2 and shard_span 2 refused by both members;
     * the other ranks do not call */
    const int ranks[2] = {0, 1};
    int s1 = 2, s12[2] = {1, 2};
    dt_mesh_t sub, sub2;
    DT_ASSERT_OK(dt_mesh_create(1, &s1, NULL, ranks, &sub));
    DT_ASSERT_OK(dt_mesh_create(2, s12, NULL, ranks, &sub2));
    if (g_rank < 2) {
      m = tiny_mlp(sub, 0);
      dt_fsdp_config_t ck = dt_fsdp_config_default(1);
      ck.reshard_after_forward = 2;
      DT_ASSERT_STATUS(dt_fully_shard(m, sub, &ck), DT_ERR_UNSUPPORTED);
      DT_ASSERT_TRUE(strstr(dt_last_error(), "mesh of 2 of the 4 ranks") != NULL, "message: %s",
                     dt_last_error());
      DT_ASSERT_OK(dt_module_destroy(m));
      m = tiny_mlp(sub2, 0);
      dt_fsdp_config_t cs = dt_fsdp_config_for(0, -1);
      cs.shard_span = 2;
      DT_ASSERT_STATUS(dt_fully_shard(m, sub2, &cs), DT_ERR_UNSUPPORTED);
      DT_ASSERT_OK(dt_fully_shard(m, sub2, NULL)); /* plain FSDP over the two: fine */
      DT_ASSERT_OK(dt_module_destroy(m));
    }
    DT_ASSERT_OK(dt_mesh_destroy(sub));
    DT_ASSERT_OK(dt_mesh_destroy(sub2));
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_corpus_markov(61, 1, 1 << 14, 3, &g_corpus));
  test_config_for();
  test_misuse();
  test_bad_input();
  test_span_bad();
  test_defer_init();
  test_traffic();
  test_memory();
  test_replaced_values();
  test_prefetch();
  test_bf16_loss();
  test_parity();
  test_few_rows();
  DT_ASSERT_OK(dt_corpus_destroy(g_corpus));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_fsdp: ok\n");
  return 0;
}

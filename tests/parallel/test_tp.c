/* test_tp.c - tensor parallelism (dt_parallelize_module) on the world as the tp dim (np 2, 4).
 *
 *  - loss parity over 20 steps (AdamW, clipping) of the dense Llama model against the replicated
 *    computation: the Megatron plan, with sequence parallelism, with loss parallelism, both;
 *    every step within 1e-5 relative (the worst printed), a repeated run bitwise equal;
 *  - traffic over one step, from the counters: the two-linear MLP (colwise + rowwise) moves one
 *    all-reduce of its activations forward and one backward and nothing else; per transformer
 *    layer (the difference between 2 and 1 layers) 4 all-reduces of b*s*h elements, with
 *    sequence parallelism 4 all-gathers and 4 reduce-scatters of the same size (the same volume,
 *    8 b s h (t-1)/t elements moved) plus the norms' weight gradients; loss parallelism never
 *    gathers the logits;
 *  - loss parallel cross-entropy: class-sharded logits give the replicated losses and logit
 *    gradients for every reduction, with an upstream gradient other than 1;
 *  - FSDP 2 x TP 2 (np 4, a (tp, dp) mesh): parity, and one step's traffic per mesh dim;
 *  - clipping over gradients on two views of the world: the dense norm, one all-reduce;
 *  - asynchronous TP: parity (sequence + loss parallel, rerun bitwise equal); the MLP with both
 *    linears async (rings only, the dense results), a biased linear left unfused, the Llama async
 *    plan's layouts and its bad switches; two colwise siblings share one gather per forward of
 *    their parent, and after a forward that failed between them one alone gathers for itself;
 *  - a mixture of experts under the plan (with and without sequence parallelism): each tp rank
 *    computes the experts on its own sequence shard only (1 / tp of the grouped GEMM FLOPs),
 *    losses within 1e-5 of the replicated model over 20 steps;
 *  - bad input: clear errors and the module unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

#define STEPS 20
#define BATCH 4
#define SEQ 8

static int g_world, g_rank;
static dt_corpus_t g_corpus;

static dt_llama_config_t model_config(int layers) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 32;
  c.n_layers = layers;
  c.n_heads = 4;
  c.vocab = 64;
  c.seq_len = SEQ;
  c.ffn_dim = 48;
  c.seed = 7;
  return c;
}

typedef struct {
  int tp, sp, loss_parallel, layers, steps;
  int dp;      /* > 1: a (tp, dp) mesh of g_world / dp x dp, FSDP over dp after TP */
  int experts; /* > 0: a mixture of that many experts (top 2) in place of the MLP */
} run_t;

typedef struct {
  dt_mesh_t mesh;
  dt_llama_t model;
  dt_module_t root;
  dt_var_t* params;
  int np;
  dt_adamw_t opt;
  dt_tape_t tape;
} setup_t;

static void setup(const run_t* r, setup_t* s) {
  memset(s, 0, sizeof *s);
  if (r->dp > 1) { /* (tp, dp): coordinates (t, d) on rank d T + t */
    int T = g_world / r->dp, shape[2] = {T, r->dp}, ranks[16];
    const char* names[2] = {"tp", "dp"};
    for (int t = 0; t < T; t++)
      for (int d = 0; d < r->dp; d++) ranks[t * r->dp + d] = d * T + t;
    DT_ASSERT_OK(dt_mesh_create(2, shape, names, ranks, &s->mesh));
  } else {
    int shape[1] = {g_world};
    const char* names[1] = {"tp"};
    DT_ASSERT_OK(dt_mesh_create(1, shape, names, NULL, &s->mesh));
  }
  dt_llama_config_t c = model_config(r->layers);
  c.n_experts = r->experts;
  c.top_k = r->experts > 0 ? 2 : 0;
  DT_ASSERT_OK(dt_llama_create(s->mesh, &c, NULL, &s->model));
  DT_ASSERT_OK(dt_llama_module(s->model, &s->root));
  if (r->tp) {
    dt_tp_plan_entry_t plan[16];
    int n;
    DT_ASSERT_OK(dt_tp_plan_llama(&c, r->sp, r->loss_parallel, plan, 16, &n));
    DT_ASSERT_OK(dt_parallelize_module(s->root, s->mesh, 0, n, plan));
  }
  if (r->dp > 1) {
    dt_fsdp_config_t fc = dt_fsdp_config_for(1, -1);
    for (int l = 0; l < r->layers; l++) {
      char path[32];
      dt_module_t blk;
      snprintf(path, sizeof path, "layers.%d", l);
      DT_ASSERT_OK(dt_module_find(s->root, path, &blk));
      DT_ASSERT_OK(dt_fully_shard(blk, s->mesh, &fc));
    }
    DT_ASSERT_OK(dt_fully_shard(s->root, s->mesh, &fc));
  }
  int64_t numel;
  DT_ASSERT_OK(dt_llama_params(s->model, &s->params, NULL, &s->np, &numel));
  dt_adamw_config_t ac = {1e-2, 0.9, 0.95, 1e-8, 0.01, 0};
  DT_ASSERT_OK(dt_adamw_create(&ac, s->np, s->params, &s->opt));
  DT_ASSERT_OK(dt_tape_create(&s->tape));
}

static void teardown(setup_t* s) {
  DT_ASSERT_OK(dt_tape_destroy(s->tape));
  DT_ASSERT_OK(dt_adamw_destroy(s->opt));
  DT_ASSERT_OK(dt_llama_destroy(s->model));
  DT_ASSERT_OK(dt_mesh_destroy(s->mesh));
}

/* Forward and backward of batch `step` (tokens replicated); the loss, or NaN when not read. */
static float fwd_bwd(setup_t* s, int step, int read_loss) {
  int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
  DT_ASSERT_OK(dt_corpus_batch(g_corpus, 5, step, BATCH, SEQ, tok, tgt));
  dt_placement_t pl[2] = {dt_replicate(), dt_shard(0)}; /* tokens: sharded over dp */
  const int64_t shape[2] = {BATCH, SEQ};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(s->mesh, DT_I64, 2, shape, pl, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(s->mesh, DT_I64, 2, shape, pl, tgt, &gt));
  dt_var_t loss;
  DT_ASSERT_OK(dt_llama_forward(s->model, s->tape, tt, gt, &loss, NULL));
  float lv = NAN;
  if (read_loss) {
    dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
    dt_tensor_t lr;
    DT_ASSERT_OK(dt_tensor_redistribute(dt_var_value(loss), rep, &lr));
    DT_ASSERT_OK(dt_tensor_gather_full(lr, &lv, sizeof lv));
    dt_tensor_destroy(lr);
  }
  DT_ASSERT_OK(dt_tape_backward(s->tape, loss));
  DT_ASSERT_OK(dt_tape_reset(s->tape));
  dt_tensor_destroy(tt);
  dt_tensor_destroy(gt);
  return lv;
}

static void opt_step(setup_t* s) {
  double norm;
  DT_ASSERT_OK(dt_clip_grad_norm(s->np, s->params, 1.0, &norm));
  DT_ASSERT_OK(dt_adamw_step(s->opt, 1e-2));
  for (int i = 0; i < s->np; i++) DT_ASSERT_OK(dt_var_zero_grad(s->params[i]));
}

static void train(const run_t* r, float* losses) {
  setup_t s;
  setup(r, &s);
  for (int step = 0; step < r->steps; step++) {
    losses[step] = fwd_bwd(&s, step, 1);
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

static run_t tp_run(int sp, int loss_parallel) {
  run_t r = {1, sp, loss_parallel, 2, STEPS, 0, 0};
  return r;
}

/* ------------------------------------------------------------------------------------------- */

static void test_parity(void) {
  run_t dense = {0, 0, 0, 2, STEPS, 0, 0};
  float ref[STEPS];
  train(&dense, ref);
  static const char* const what[5] = {"tp", "tp + loss parallel", "tp + sp",
                                      "tp + sp + loss parallel", "tp + async sp + lp"};
  for (int k = 0; k < 5; k++) {
    run_t r = tp_run(k == 4 ? DT_TP_SP_ASYNC : k >= 2, k == 4 || (k & 1));
    float l[STEPS], l2[STEPS];
    train(&r, l);
    double w = worst_rel(l, ref, STEPS);
    if (g_rank == 0)
      printf("parity %-24s np %d: worst relative loss difference over %d steps %.3g (first %.5f "
             "last %.5f)\n", what[k], g_world, STEPS, w, l[0], l[STEPS - 1]);
    DT_ASSERT_TRUE(w <= 1e-5, "%s: worst relative difference %.3g above 1e-5", what[k], w);
    DT_ASSERT_TRUE(l[STEPS - 1] < l[0], "%s: the loss did not fall", what[k]);
    if (k == 0 || k == 3 || k == 4) {
      train(&r, l2);
      DT_ASSERT_TRUE(memcmp(l, l2, sizeof l) == 0, "%s: a repeated run differs", what[k]);
    }
  }
  if (g_world != 4) return;
  /* FSDP 2 x TP 2 on a (tp, dp) mesh */
  for (int sp = 0; sp <= 1; sp++) {
    run_t r = tp_run(sp, sp);
    r.dp = 2;
    float l[STEPS];
    train(&r, l);
    double w = worst_rel(l, ref, STEPS);
    if (g_rank == 0)
      printf("parity fsdp 2 x tp 2%-12s np 4: worst relative loss difference over %d steps %.3g\n",
             sp ? " + sp + lp" : "", STEPS, w);
    DT_ASSERT_TRUE(w <= 1e-5, "fsdp x tp: worst relative difference %.3g above 1e-5", w);
  }
}

/* A mixture of experts under the Llama plan: each tp rank routes and computes only its own
 * sequence shard (the grouped GEMMs of one forward and backward count exactly 1 / tp of the
 * replicated model's, which runs 3 x 6 N K D F per layer), without and with sequence parallelism;
 * the stats say so; the losses follow the replicated model's within 1e-5 over 20 steps. */
static void test_moe(void) {
  run_t ref_run = {0, 0, 0, 2, STEPS, 0, 4};
  float ref[STEPS];
  train(&ref_run, ref);
  int64_t flops[3];
  for (int sp = -1; sp <= 1; sp++) { /* -1: the replicated model */
    run_t r = ref_run;
    r.tp = sp >= 0;
    r.sp = sp > 0;
    setup_t s;
    setup(&r, &s);
    DT_ASSERT_OK(dt_grouped_mm_flops_reset());
    fwd_bwd(&s, 0, 0);
    DT_ASSERT_OK(dt_grouped_mm_flops(&flops[sp + 1]));
    dt_moe_stats_t st;
    DT_ASSERT_OK(dt_llama_moe_stats(s.model, &st));
    DT_ASSERT_EQ(st.local_routing, sp >= 0);
    DT_ASSERT_EQ(st.dropped, 0);
    teardown(&s);
    if (sp < 0) continue;
    float l[STEPS];
    train(&r, l);
    double w = worst_rel(l, ref, STEPS);
    if (g_rank == 0)
      printf("parity moe tp%s np %d: worst relative loss difference over %d steps %.3g\n",
             sp ? " + sp" : "", g_world, STEPS, w);
    DT_ASSERT_TRUE(w <= 1e-5, "moe tp%s: worst relative difference %.3g above 1e-5",
                   sp ? " + sp" : "", w);
  }
  dt_llama_config_t c = model_config(2);
  const int64_t N = BATCH * SEQ, K = 2;
  DT_ASSERT_EQ(flops[0], 2 * 3 * 6 * N * K * c.dim * c.ffn_dim);
  DT_ASSERT_TRUE(flops[1] * g_world == flops[0] && flops[2] * g_world == flops[0],
                 "grouped GEMM FLOPs per rank %lld (tp) and %lld (tp + sp), replicated %lld",
                 (long long)flops[1], (long long)flops[2], (long long)flops[0]);
}

/* FSDP 2 x TP 2, one step: per mesh dim, tp carries the tensor-parallel all-reduces of test_traffic
 * (4 per layer), dp the FSDP all-gathers (2 per group: forward and backward) and reduce-scatters
 * (1 per group) of each rank's tensor-parallel shards, nothing else. */
static void test_fsdp_tp_traffic(void) {
  if (g_world != 4) return;
  const int64_t bsh_local = (int64_t)(BATCH / 2) * SEQ * 32; /* the batch is split over dp */
  int64_t ar[2];
  for (int layers = 1; layers <= 2; layers++) {
    run_t r = tp_run(0, 0);
    r.dp = 2;
    r.layers = layers;
    setup_t s;
    setup(&r, &s);
    fwd_bwd(&s, 0, 0);
    opt_step(&s);
    DT_ASSERT_OK(dt_counters_reset(NULL));
    fwd_bwd(&s, 1, 0);
    dt_counters_t c;
    DT_ASSERT_OK(dt_counters_get(s.mesh, &c));
    /* dp: per group, 2 all-gathers and 1 reduce-scatter of its flat buffer */
    int groups = layers + 1;
    DT_ASSERT_EQ(c.dim_calls[1][DT_COLL_ALL_GATHER], 2 * groups);
    DT_ASSERT_EQ(c.dim_calls[1][DT_COLL_REDUCE_SCATTER], groups);
    DT_ASSERT_EQ(c.dim_calls[1][DT_COLL_ALL_REDUCE], 0);
    /* the gathered bytes are the tp shards' flat buffers: every parameter but the norms is
     * split over tp, so they add up to (Psi - norms) / 2 + norms, padded to dp */
    int64_t psi_local = 0;
    dt_var_t* ps;
    int np;
    int64_t numel;
    DT_ASSERT_OK(dt_llama_params(s.model, &ps, NULL, &np, &numel));
    for (int i = 0; i < np; i++) {
      int nd;
      DT_ASSERT_OK(dt_tensor_ndim(dt_var_value(ps[i]), &nd));
      psi_local += nd == 1 ? 32 : 0;
    }
    psi_local += (numel - psi_local) / 2;
    DT_ASSERT_TRUE(c.dim_nbytes[1][DT_COLL_ALL_GATHER] >= (uint64_t)(2 * 4 * psi_local) &&
                       c.dim_nbytes[1][DT_COLL_ALL_GATHER] <= (uint64_t)(2 * 4 * (psi_local + 64)),
                   "dp all-gathers moved %llu bytes, want 2 x 4 x %lld plus padding",
                   (unsigned long long)c.dim_nbytes[1][DT_COLL_ALL_GATHER], (long long)psi_local);
    DT_ASSERT_EQ(c.dim_calls[0][DT_COLL_ALL_GATHER], 1); /* the logits (no loss parallel) */
    DT_ASSERT_EQ(c.dim_calls[0][DT_COLL_REDUCE_SCATTER], 0);
    ar[layers - 1] = (int64_t)c.dim_calls[0][DT_COLL_ALL_REDUCE];
    if (layers == 2) {
      DT_ASSERT_EQ(ar[1] - ar[0], 4); /* per layer */
      DT_ASSERT_EQ(c.dim_nbytes[0][DT_COLL_ALL_REDUCE] % (uint64_t)(4 * bsh_local), 0);
      if (g_rank == 0)
        printf("fsdp 2 x tp 2 np 4, one step: tp dim %llu all-reduces (%lld per layer) of "
               "%lld bytes, dp dim %llu all-gathers of %llu bytes (tp shards: 2 x 4 x %lld + "
               "padding) and %llu reduce-scatters\n",
               (unsigned long long)c.dim_calls[0][DT_COLL_ALL_REDUCE], (long long)(ar[1] - ar[0]),
               (long long)(4 * bsh_local), (unsigned long long)c.dim_calls[1][DT_COLL_ALL_GATHER],
               (unsigned long long)c.dim_nbytes[1][DT_COLL_ALL_GATHER], (long long)psi_local,
               (unsigned long long)c.dim_calls[1][DT_COLL_REDUCE_SCATTER]);
    }
    teardown(&s);
  }
}

/* Counters of one training step (forward, backward) after a first one filled the caches. */
static dt_counters_t step_counters(const run_t* r) {
  setup_t s;
  setup(r, &s);
  fwd_bwd(&s, 0, 0);
  opt_step(&s);
  DT_ASSERT_OK(dt_counters_reset(NULL));
  fwd_bwd(&s, 1, 0);
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_get(NULL, &c));
  teardown(&s);
  return c;
}

static void print_counters(const char* what, const dt_counters_t* c) {
  if (g_rank != 0) return;
  printf("%s:", what);
  for (int k = 0; k < DT_COLL_COUNT; k++)
    if (c->calls[k])
      printf(" %s %llu calls %llu bytes;", dt_collective_name((dt_collective_t)k),
             (unsigned long long)c->calls[k], (unsigned long long)c->nbytes[k]);
  printf("\n");
}

/* The difference of two counters, collective k. */
#define DCALLS(k) ((int64_t)c2.calls[k] - (int64_t)c1.calls[k])
#define DBYTES(k) ((int64_t)c2.nbytes[k] - (int64_t)c1.nbytes[k])

static void test_traffic(void) {
  const int64_t D = 32, bsh = (int64_t)BATCH * SEQ * D, t = g_world, N = BATCH * SEQ, V = 64;
  dt_counters_t no_lp;
  memset(&no_lp, 0, sizeof no_lp);
  for (int sp = 0; sp <= 1; sp++) {
    for (int lp = 0; lp <= 1; lp++) {
      run_t r1 = tp_run(sp, lp), r2 = tp_run(sp, lp);
      r1.layers = 1;
      dt_counters_t c1 = step_counters(&r1), c2 = step_counters(&r2);
      char what[64];
      snprintf(what, sizeof what, "sp %d lp %d, 1 layer", sp, lp);
      print_counters(what, &c1);
      snprintf(what, sizeof what, "sp %d lp %d, 2 layers", sp, lp);
      print_counters(what, &c2);
      /* one transformer layer, forward + backward */
      int64_t moved;
      if (!sp) {
        DT_ASSERT_EQ(DCALLS(DT_COLL_ALL_REDUCE), 4);
        DT_ASSERT_EQ(DBYTES(DT_COLL_ALL_REDUCE), 4 * 4 * bsh);
        DT_ASSERT_EQ(DCALLS(DT_COLL_ALL_GATHER), 0);
        DT_ASSERT_EQ(DCALLS(DT_COLL_REDUCE_SCATTER), 0);
        moved = 4 * 2 * bsh * (t - 1) / t; /* an all-reduce moves 2 B (t-1)/t */
      } else {
        DT_ASSERT_EQ(DCALLS(DT_COLL_ALL_GATHER), 4);
        DT_ASSERT_EQ(DBYTES(DT_COLL_ALL_GATHER), 4 * 4 * bsh);
        DT_ASSERT_EQ(DCALLS(DT_COLL_REDUCE_SCATTER), 4);
        DT_ASSERT_EQ(DBYTES(DT_COLL_REDUCE_SCATTER), 4 * 4 * bsh);
        /* and the two norms' weight gradients (Partial over the sequence shards) */
        DT_ASSERT_EQ(DCALLS(DT_COLL_ALL_REDUCE), 2);
        DT_ASSERT_EQ(DBYTES(DT_COLL_ALL_REDUCE), 2 * 4 * D);
        moved = (4 + 4) * bsh * (t - 1) / t;
      }
      DT_ASSERT_EQ(moved, 8 * bsh * (t - 1) / t);
      for (int k = 0; k < DT_COLL_COUNT; k++)
        if (k != DT_COLL_ALL_REDUCE && k != DT_COLL_ALL_GATHER && k != DT_COLL_REDUCE_SCATTER)
          DT_ASSERT_EQ(c2.calls[k], 0);
      /* the logits (N, V): gathered once without loss parallelism; with it, what changes is
       * that gather replaced by collectives over per-row vectors (N elements: row maxima, sums,
       * target logits), the backward's one gather carrying two (the saved row max and log-sum) */
      const uint64_t logits_nbytes = (uint64_t)(4 * N * V), row = (uint64_t)(4 * N);
      if (!lp) {
        no_lp = c2;
      } else {
        for (int k = 0; k < DT_COLL_COUNT; k++) {
          int64_t dc = (int64_t)c2.calls[k] - (int64_t)no_lp.calls[k];
          int64_t db = (int64_t)c2.nbytes[k] - (int64_t)no_lp.nbytes[k];
          if (k == DT_COLL_ALL_GATHER) { /* the logits' gather becomes a gather of (N, 2) */
            db += (int64_t)logits_nbytes - 2 * (int64_t)row;
          }
          DT_ASSERT_TRUE(dc >= 0 && db == dc * (int64_t)row, "loss parallel, %s: %lld more "
                         "calls, %lld more bytes than without (rows are %llu bytes)",
                         dt_collective_name((dt_collective_t)k), (long long)dc, (long long)db,
                         (unsigned long long)row);
        }
      }
      if (g_rank == 0)
        printf("traffic sp %d lp %d np %d: one layer moves %lld elements per rank = 8 b s h "
               "(t-1)/t\n", sp, lp, g_world, (long long)moved);
    }
  }
}

/* ---- the two-linear MLP ----------------------------------------------------------------------
 * mlp (container): fc1 (D -> F, colwise), gelu, fc2 (F -> D, rowwise). */
static dt_status_t fwd_linear(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                              int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  return dt_nn_linear(tape, in[0], dt_module_get(m, ""), NULL, &out[0]);
}

static dt_status_t fwd_mlp(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                           int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_module_t fc1, fc2;
  dt_var_t h, g;
  DT_CHECK(dt_module_child(m, 0, &fc1));
  DT_CHECK(dt_module_child(m, 1, &fc2));
  DT_CHECK(dt_module_forward(fc1, tape, 1, in, 1, &h));
  DT_CHECK(dt_ag_op(tape, "gelu", 1, &h, 0, NULL, 0, NULL, 1, &g));
  return dt_module_forward(fc2, tape, 1, &g, 1, out);
}

static dt_module_t make_mlp(dt_mesh_t mesh, int64_t D, int64_t F) {
  dt_module_t mlp, fc1, fc2;
  DT_ASSERT_OK(dt_module_create("mlp", fwd_mlp, NULL, &mlp));
  DT_ASSERT_OK(dt_module_create("fc1", fwd_linear, NULL, &fc1));
  DT_ASSERT_OK(dt_module_create("fc2", fwd_linear, NULL, &fc2));
  const int64_t s1[2] = {F, D}, s2[2] = {D, F};
  dt_var_t w1, w2;
  DT_ASSERT_OK(dt_nn_param(mesh, NULL, "fc1", 2, s1, DT_INIT_NORMAL, 0.2, 3, &w1));
  DT_ASSERT_OK(dt_nn_param(mesh, NULL, "fc2", 2, s2, DT_INIT_NORMAL, 0.2, 3, &w2));
  DT_ASSERT_OK(dt_module_add_param(fc1, "", w1));
  DT_ASSERT_OK(dt_module_add_param(fc2, "", w2));
  DT_ASSERT_OK(dt_module_add_child(mlp, fc1));
  DT_ASSERT_OK(dt_module_add_child(mlp, fc2));
  return mlp;
}

/* y = mlp(x), loss = sum(y): the output and x's gradient, gathered. */
static void mlp_step(dt_module_t mlp, dt_mesh_t mesh, const float* xs, int64_t B, int64_t S,
                     int64_t D, float* y, float* gx, dt_counters_t* c) {
  const int64_t shape[3] = {B, S, D};
  dt_placement_t rep[1] = {dt_replicate()};
  dt_tensor_t xt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 3, shape, rep, xs, &xt));
  dt_var_t x, out, loss;
  DT_ASSERT_OK(dt_var_leaf(xt, 1, &x));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_counters_reset(NULL));
  DT_ASSERT_OK(dt_module_forward(mlp, tape, 1, &x, 1, &out));
  dt_counters_t fwd;
  DT_ASSERT_OK(dt_counters_get(NULL, &fwd));
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &out, 1, all, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_counters_get(NULL, &c[1]));
  c[0] = fwd;
  size_t nb = sizeof(float) * (size_t)(B * S * D);
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(out), y, nb));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(x), gx, nb));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
}

static void test_mlp(void) {
  enum { B = 2, S = 3, D = 8, F = 16 };
  dt_mesh_t mesh;
  int shape[1] = {g_world};
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  float xs[B * S * D], y0[B * S * D], g0[B * S * D], y1[B * S * D], g1[B * S * D];
  for (int i = 0; i < B * S * D; i++) xs[i] = (float)sin(0.37 * i + 0.1);
  dt_module_t dense = make_mlp(mesh, D, F), tp = make_mlp(mesh, D, F);
  dt_tp_plan_entry_t plan[2] = {{"fc1", dt_tp_colwise()}, {"fc2", dt_tp_rowwise()}};
  DT_ASSERT_OK(dt_parallelize_module(tp, mesh, 0, 2, plan));
  dt_counters_t cd[2], ct[2];
  mlp_step(dense, mesh, xs, B, S, D, y0, g0, cd);
  mlp_step(tp, mesh, xs, B, S, D, y1, g1, ct);
  double wy = 0, wg = 0;
  for (int i = 0; i < B * S * D; i++) {
    wy = fmax(wy, fabs((double)y0[i] - y1[i]));
    wg = fmax(wg, fabs((double)g0[i] - g1[i]));
  }
  DT_ASSERT_TRUE(wy < 1e-5 && wg < 1e-5, "tp mlp differs: output %.3g, input gradient %.3g", wy,
                 wg);
  const uint64_t act = sizeof(float) * B * S * D;
  /* forward: one all-reduce of the activations; forward + backward: two, and nothing else */
  DT_ASSERT_EQ(ct[0].calls[DT_COLL_ALL_REDUCE], 1);
  DT_ASSERT_EQ(ct[0].nbytes[DT_COLL_ALL_REDUCE], act);
  DT_ASSERT_EQ(ct[1].calls[DT_COLL_ALL_REDUCE], 2);
  DT_ASSERT_EQ(ct[1].nbytes[DT_COLL_ALL_REDUCE], 2 * act);
  for (int k = 0; k < DT_COLL_COUNT; k++)
    if (k != DT_COLL_ALL_REDUCE) DT_ASSERT_EQ(ct[1].calls[k], 0);
  /* the weights are sharded: colwise Shard(0), rowwise Shard(1) */
  dt_var_t w;
  dt_placement_t pl[1];
  DT_ASSERT_OK(dt_module_param(tp, "fc1", &w));
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(w), pl));
  DT_ASSERT_TRUE(dt_placement_equal(pl[0], dt_shard(0)), "fc1 not Shard(0)");
  DT_ASSERT_OK(dt_module_param(tp, "fc2", &w));
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(w), pl));
  DT_ASSERT_TRUE(dt_placement_equal(pl[0], dt_shard(1)), "fc2 not Shard(1)");
  if (g_rank == 0)
    printf("mlp colwise + rowwise np %d: forward 1 all-reduce, backward 1 all-reduce of %llu "
           "bytes; output and input gradient within %.2g of the dense module\n", g_world,
           (unsigned long long)act, fmax(wy, wg));
  DT_ASSERT_OK(dt_module_destroy(dense));
  DT_ASSERT_OK(dt_module_destroy(tp));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* Two colwise linears "a", "b" reading the parent's input (as q and k do); the parent fails
 * between them when g_pair_fail is set. */
static int g_pair_fail;
static dt_status_t fwd_pair(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                            int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_module_t a, b;
  dt_var_t ya, yb;
  DT_CHECK(dt_module_child(m, 0, &a));
  DT_CHECK(dt_module_child(m, 1, &b));
  DT_CHECK(dt_module_forward(a, tape, 1, in, 1, &ya));
  if (g_pair_fail) return DT_FAIL(DT_ERR_INVALID_ARG, "pair: failing on purpose");
  DT_CHECK(dt_module_forward(b, tape, 1, in, 1, &yb));
  dt_var_t ab[2] = {ya, yb};
  return dt_ag_op(tape, "add", 2, ab, 0, NULL, 0, NULL, 1, out);
}

/* The shared gather: a and b under one parent gather once per forward of the parent; after a
 * forward that failed between them (a tape reset since), b called alone gathers for itself. */
static void test_async_shared(void) {
  enum { B = 2, S = 8, D = 8 };
  dt_mesh_t mesh;
  int shape[1] = {g_world};
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  dt_module_t pair, a, b;
  DT_ASSERT_OK(dt_module_create("pair", fwd_pair, NULL, &pair));
  DT_ASSERT_OK(dt_module_create("a", fwd_linear, NULL, &a));
  DT_ASSERT_OK(dt_module_create("b", fwd_linear, NULL, &b));
  const int64_t ws[2] = {D, D}, xs[3] = {B, S, D};
  dt_var_t wa, wb;
  DT_ASSERT_OK(dt_nn_param(mesh, NULL, "a", 2, ws, DT_INIT_NORMAL, 0.2, 3, &wa));
  DT_ASSERT_OK(dt_nn_param(mesh, NULL, "b", 2, ws, DT_INIT_NORMAL, 0.2, 4, &wb));
  DT_ASSERT_OK(dt_module_add_param(a, "", wa));
  DT_ASSERT_OK(dt_module_add_param(b, "", wb));
  DT_ASSERT_OK(dt_module_add_child(pair, a));
  DT_ASSERT_OK(dt_module_add_child(pair, b));
  dt_tp_style_t col = dt_tp_colwise();
  col.async_tp = 1;
  dt_tp_plan_entry_t plan[2] = {{"a", col}, {"b", col}};
  DT_ASSERT_OK(dt_parallelize_module(pair, mesh, 0, 2, plan));
  const dt_placement_t seq[1] = {dt_shard(1)};
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_counters_t c;
  for (int round = 0; round < 3; round++) {
    dt_tensor_t xt;
    DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 3, xs, seq, &xt));
    dt_var_t x, y;
    DT_ASSERT_OK(dt_var_leaf(xt, 1, &x));
    DT_ASSERT_OK(dt_counters_reset(mesh));
    g_pair_fail = round == 1;
    if (round == 2) { /* after the failed forward and a reset: b alone gathers */
      DT_ASSERT_OK(dt_module_forward(b, tape, 1, &x, 1, &y));
    } else if (round == 1) {
      DT_ASSERT_STATUS(dt_module_forward(pair, tape, 1, &x, 1, &y), DT_ERR_INVALID_ARG);
    } else {
      DT_ASSERT_OK(dt_module_forward(pair, tape, 1, &x, 1, &y));
    }
    DT_ASSERT_OK(dt_counters_get(mesh, &c));
    DT_ASSERT_EQ(c.calls[DT_COLL_SEND_RECV], g_world - 1); /* one ring, a's or b's own */
    DT_ASSERT_EQ(c.calls[DT_COLL_ALL_GATHER], 0);
    DT_ASSERT_OK(dt_tape_reset(tape));
    DT_ASSERT_OK(dt_var_destroy(x));
  }
  g_pair_fail = 0;
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_module_destroy(pair));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* Asynchronous TP on the two-linear MLP with sequence parallelism: fc1 colwise taking the
 * input as sequence shards (its boundary Shard(1)), fc2 rowwise handing them back (Shard(1)), both
 * async: the all-gather and the reduce-scatter become rings (n-1 send_recv each, forward and
 * backward, nothing else), the results the dense module's. A linear with a bias (dt_linear_create)
 * styled async runs unfused: the same traffic as without the switch. */
static void test_async_mlp(void) {
  enum { B = 2, S = 8, D = 8, F = 16 };
  dt_mesh_t mesh;
  int shape[1] = {g_world};
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  float xs[B * S * D], y0[B * S * D], g0[B * S * D], y1[B * S * D], g1[B * S * D];
  for (int i = 0; i < B * S * D; i++) xs[i] = (float)sin(0.29 * i + 0.3);
  dt_module_t dense = make_mlp(mesh, D, F), tp = make_mlp(mesh, D, F);
  dt_tp_style_t col = dt_tp_colwise(), row = dt_tp_rowwise();
  col.in_mask = 1;
  col.in[0] = dt_shard(1);
  row.out[0] = dt_shard(1);
  col.async_tp = row.async_tp = 1;
  dt_tp_plan_entry_t plan[2] = {{"fc1", col}, {"fc2", row}};
  DT_ASSERT_OK(dt_parallelize_module(tp, mesh, 0, 2, plan));
  dt_counters_t cd[2], ct[2];
  mlp_step(dense, mesh, xs, B, S, D, y0, g0, cd);
  mlp_step(tp, mesh, xs, B, S, D, y1, g1, ct);
  double wy = 0, wg = 0;
  for (int i = 0; i < B * S * D; i++) {
    wy = fmax(wy, fabs((double)y0[i] - y1[i]));
    wg = fmax(wg, fabs((double)g0[i] - g1[i]));
  }
  DT_ASSERT_TRUE(wy < 1e-5 && wg < 1e-5, "async tp mlp differs: output %.3g, input gradient %.3g",
                 wy, wg);
  DT_ASSERT_EQ(ct[0].calls[DT_COLL_SEND_RECV], 2 * (g_world - 1));
  DT_ASSERT_EQ(ct[1].calls[DT_COLL_SEND_RECV], 4 * (g_world - 1));
  for (int k = 0; k < DT_COLL_COUNT; k++)
    if (k != DT_COLL_SEND_RECV && k != DT_COLL_ALL_GATHER) DT_ASSERT_EQ(ct[1].calls[k], 0);
  /* the one all-gather: the backward of fc1's input boundary (x's gradient back to the leaf's
   * Replicate); none forward */
  DT_ASSERT_EQ(ct[0].calls[DT_COLL_ALL_GATHER], 0);
  DT_ASSERT_EQ(ct[1].calls[DT_COLL_ALL_GATHER], 1);
  if (g_rank == 0)
    printf("async mlp colwise + rowwise np %d: %d ring steps forward, %d in all; within %.2g of "
           "the dense module\n", g_world, 2 * (g_world - 1), 4 * (g_world - 1), fmax(wy, wg));
  DT_ASSERT_OK(dt_module_destroy(dense));
  DT_ASSERT_OK(dt_module_destroy(tp));
  /* a linear with a bias: unfused (the boundary's all-gather forward, no ring) */
  dt_module_t lin, lin0;
  DT_ASSERT_OK(dt_linear_create(mesh, "fc", D, D, 1, 7, &lin));
  DT_ASSERT_OK(dt_linear_create(mesh, "fc", D, D, 1, 7, &lin0));
  dt_tp_style_t cb = dt_tp_colwise();
  cb.in_mask = 1;
  cb.in[0] = dt_shard(1);
  cb.async_tp = 1;
  dt_tp_plan_entry_t one[1] = {{"", cb}};
  DT_ASSERT_OK(dt_parallelize_module(lin, mesh, 0, 1, one));
  mlp_step(lin0, mesh, xs, B, S, D, y0, g0, cd);
  mlp_step(lin, mesh, xs, B, S, D, y1, g1, ct);
  wy = 0;
  for (int i = 0; i < B * S * D; i++)
    wy = fmax(wy, fabs((double)y0[i] - y1[i]) + fabs((double)g0[i] - g1[i]));
  DT_ASSERT_TRUE(wy < 1e-5, "a biased async colwise linear differs by %.3g", wy);
  DT_ASSERT_EQ(ct[1].calls[DT_COLL_SEND_RECV], 0);
  DT_ASSERT_OK(dt_module_destroy(lin));
  DT_ASSERT_OK(dt_module_destroy(lin0));
  /* the async plan of the Llama model: the blocks' norms keep sequence shards; bad switches */
  dt_llama_config_t c = model_config(1);
  dt_tp_plan_entry_t lp[16];
  int n;
  DT_ASSERT_OK(dt_tp_plan_llama(&c, DT_TP_SP_ASYNC, 0, lp, 16, &n));
  int colwise_async = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(lp[i].pattern, "layers.*.attn_norm") == 0)
      DT_ASSERT_TRUE(dt_placement_equal(lp[i].style.out[0], dt_shard(1)), "attn_norm out");
    if (strcmp(lp[i].pattern, "norm") == 0)
      DT_ASSERT_TRUE(dt_placement_equal(lp[i].style.out[0], dt_replicate()), "final norm out");
    colwise_async += lp[i].style.kind == DT_TP_COLWISE && lp[i].style.async_tp;
  }
  DT_ASSERT_EQ(colwise_async, 5); /* wq wk wv w1 w3; not the output projection */
  DT_ASSERT_STATUS(dt_tp_plan_llama(&c, 3, 0, lp, 16, &n), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tp_plan_llama(&c, -1, 0, lp, 16, &n), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_module_set_forward(NULL, fwd_linear, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* ---- loss parallel cross-entropy ------------------------------------------------------------ */

/* Loss and logits gradient of cross_entropy(logits placed `pl`, reduction) with an upstream
 * gradient: 2.5 for a scalar, w[i] per row for none. */
static void ce_step(dt_mesh_t mesh, const float* logits, const int64_t* tg, int64_t N, int64_t V,
                    dt_placement_t pl, int red, float* loss, float* grad, dt_counters_t* c) {
  const int64_t ls[2] = {N, V}, ts[1] = {N};
  dt_placement_t rep[1] = {dt_replicate()};
  dt_tensor_t lt, tt, wt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ls, &pl, logits, &lt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, ts, rep, tg, &tt));
  float w[64];
  for (int i = 0; i < N; i++) w[i] = 0.5f + 0.25f * (float)(i % 5);
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 1, ts, rep, w, &wt));
  dt_var_t x, tv, wv, out, up, total;
  DT_ASSERT_OK(dt_var_leaf(lt, 1, &x));
  DT_ASSERT_OK(dt_var_leaf(tt, 0, &tv));
  DT_ASSERT_OK(dt_var_leaf(wt, 0, &wv));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_counters_reset(NULL));
  dt_var_t in[2] = {x, tv};
  const int64_t r[1] = {red};
  DT_ASSERT_OK(dt_ag_op(tape, "cross_entropy", 2, in, 1, r, 0, NULL, 1, &out));
  if (red == DT_LOSS_NONE) {
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(out), loss, sizeof(float) * (size_t)N));
    dt_var_t ow[2] = {out, wv};
    const int64_t all[1] = {0};
    DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, ow, 0, NULL, 0, NULL, 1, &up));
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &up, 1, all, 0, NULL, 1, &total));
  } else {
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(out), loss, sizeof(float)));
    const double f[1] = {2.5};
    DT_ASSERT_OK(dt_ag_op(tape, "mul_scalar", 1, &out, 0, NULL, 1, f, 1, &total));
  }
  DT_ASSERT_OK(dt_tape_backward(tape, total));
  DT_ASSERT_OK(dt_counters_get(NULL, c));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(x), grad, sizeof(float) * (size_t)(N * V)));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(tv));
  DT_ASSERT_OK(dt_var_destroy(wv));
}

static void test_loss_parallel(void) {
  enum { N = 12, V = 40 };
  dt_mesh_t mesh;
  int shape[1] = {g_world};
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  float logits[N * V];
  int64_t tg[N];
  for (int i = 0; i < N * V; i++) logits[i] = (float)(3.0 * sin(0.91 * i + 0.3));
  for (int i = 0; i < N; i++) tg[i] = (i * 7 + 3) % V;
  static const char* const red_name[3] = {"none", "mean", "sum"};
  for (int red = 0; red < 3; red++) {
    float l0[N], l1[N], g0[N * V], g1[N * V];
    dt_counters_t c0, c1;
    ce_step(mesh, logits, tg, N, V, dt_replicate(), red, l0, g0, &c0);
    ce_step(mesh, logits, tg, N, V, dt_shard(1), red, l1, g1, &c1);
    int nl = red == DT_LOSS_NONE ? N : 1;
    double wl = 0, wg = 0, gmax = 0;
    for (int i = 0; i < nl; i++) wl = fmax(wl, fabs((double)l0[i] - l1[i]) / fabs((double)l0[i]));
    for (int i = 0; i < N * V; i++) {
      wg = fmax(wg, fabs((double)g0[i] - g1[i]));
      gmax = fmax(gmax, fabs((double)g0[i]));
    }
    DT_ASSERT_TRUE(wl < 1e-6 && wg < 1e-6 * fmax(1.0, gmax),
                   "loss parallel %s: loss %.3g, gradient %.3g apart", red_name[red], wl, wg);
    /* the gradient is right, not merely equal: upstream 2.5 (mean: 2.5 / N), row 0's weight 0.5
     * for none */
    int i0 = 0; /* row 0 */
    double s = 0;
    for (int v = 0; v < V; v++) s += g1[i0 * V + v];
    DT_ASSERT_TRUE(fabs(s) < 1e-5, "%s: row gradient sums to %.3g, not 0", red_name[red], s);
    /* d/dlogit[target] = up * (p_target - 1): check against the softmax computed here */
    double mx = -1e30, z = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, logits[v]);
    for (int v = 0; v < V; v++) z += exp(logits[v] - mx);
    double pt = exp(logits[tg[0]] - mx) / z;
    double up = red == DT_LOSS_NONE ? 0.5 : red == DT_LOSS_MEAN ? 2.5 / N : 2.5;
    DT_ASSERT_TRUE(fabs(g1[tg[0]] - up * (pt - 1.0)) < 1e-5, "%s: target gradient %.6g, want "
                   "%.6g", red_name[red], (double)g1[tg[0]], up * (pt - 1.0));
    for (int k = 0; k < DT_COLL_COUNT; k++)
      DT_ASSERT_TRUE(c1.calls[k] == 0 || c1.nbytes[k] < sizeof(float) * N * V / 2,
                     "loss parallel %s: %s moved %llu bytes", red_name[red],
                     dt_collective_name((dt_collective_t)k), (unsigned long long)c1.nbytes[k]);
  }
  if (g_rank == 0)
    printf("loss parallel np %d: none, mean, sum with upstream gradients match the replicated "
           "logits; no collective moves the logits\n", g_world);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void expect_replicated(dt_llama_t model) {
  dt_var_t* ps;
  int n;
  int64_t numel;
  DT_ASSERT_OK(dt_llama_params(model, &ps, NULL, &n, &numel));
  for (int i = 0; i < n; i++) {
    dt_placement_t pl[1];
    DT_ASSERT_OK(dt_tensor_placements(dt_var_value(ps[i]), pl));
    DT_ASSERT_TRUE(pl[0].kind == DT_REPLICATE, "parameter %d changed by a failed wrap", i);
  }
}

static void test_bad_input(void) {
  dt_mesh_t mesh, abstract;
  int shape[1] = {g_world};
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  DT_ASSERT_OK(dt_mesh_create_abstract(1, shape, NULL, &abstract));
  dt_llama_config_t c = model_config(1);
  c.vocab = 63; /* not divisible by 2 or 4 */
  dt_llama_t model;
  dt_module_t root;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
  DT_ASSERT_OK(dt_llama_module(model, &root));
  dt_tp_plan_entry_t plan[16];
  int n;
  DT_ASSERT_OK(dt_tp_plan_llama(&c, 0, 0, plan, 16, &n));
  DT_ASSERT_STATUS(dt_tp_plan_llama(&c, 0, 0, plan, 3, &n), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tp_plan_llama(&c, 0, 0, plan, 16, &n));
  /* the vocabulary does not split: the embedding and output styles refuse */
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, n, plan), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "not divisible") != NULL, "%s", dt_last_error());
  /* the message names the weight (not "(its weight)") and the sizes that would work: 63's
   * largest divisor up to the tp size (1 at np 2, 3 at np 4) */
  int fit = g_world;
  while (63 % fit != 0) fit--;
  char most[32];
  snprintf(most, sizeof most, "(at most %d here)", fit);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "of its weight (size 63)") != NULL &&
                     strstr(dt_last_error(), most) != NULL &&
                     strstr(dt_last_error(), "(its weight)") == NULL,
                 "%s", dt_last_error());
  expect_replicated(model);
  dt_tp_plan_entry_t one[2] = {{"layers.*.wq", dt_tp_colwise()}, {"layers.*.nothing",
                                                                   dt_tp_colwise()}};
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, one), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "names no module") != NULL, "%s", dt_last_error());
  expect_replicated(model);
  one[1].pattern = NULL;
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, one), DT_ERR_INVALID_ARG);
  one[1] = (dt_tp_plan_entry_t){"layers.*.wo", dt_tp_rowwise()};
  one[1].style.out[0] = dt_partial(DT_REDUCE_SUM);
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, one), DT_ERR_INVALID_ARG);
  one[1].style = dt_tp_rowwise();
  one[1].style.out_mask = 1u << DT_TP_IO_MAX;
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, one), DT_ERR_INVALID_ARG);
  one[1].style = dt_tp_rowwise();
  one[1].style.kind = (dt_tp_kind_t)99;
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, one), DT_ERR_INVALID_ARG);
  one[1].style = dt_tp_rowwise();
  /* a norm weight is 1-D: an embedding style needs (V, D) */
  dt_tp_plan_entry_t emb[1] = {{"norm", dt_tp_embedding_colwise()}};
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 1, emb), DT_ERR_INVALID_ARG);
  /* a parameter style on a container without parameters of its own is fine (they are below);
   * on the layers container both wq and the layers would style wq: refused */
  dt_tp_plan_entry_t twice[2] = {{"layers", dt_tp_colwise()}, {"layers.*.wq", dt_tp_colwise()}};
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, twice), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 1, 2, one), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, -1, 2, one), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_parallelize_module(root, abstract, 0, 2, one), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_parallelize_module(NULL, mesh, 0, 2, one), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, -1, one), DT_ERR_INVALID_ARG);
  expect_replicated(model);
  /* nothing was left attached: the good plan applies, and a second application is refused */
  DT_ASSERT_OK(dt_parallelize_module(root, mesh, 0, 2, one));
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 2, one), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_llama_destroy(model));
  /* after FSDP: refused */
  c = model_config(1);
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
  DT_ASSERT_OK(dt_llama_module(model, &root));
  dt_module_t blk;
  DT_ASSERT_OK(dt_module_find(root, "layers.0", &blk));
  dt_fsdp_config_t fc = dt_fsdp_config_default(1);
  DT_ASSERT_OK(dt_fully_shard(blk, mesh, &fc));
  DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 1, one), DT_ERR_INVALID_USAGE);
  DT_ASSERT_STATUS(dt_parallelize_module(blk, mesh, 0, 1, one), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_llama_destroy(model));
  if (g_world == 4) { /* a (dp, tp) mesh: dp's split of a colwise Shard(0) would not nest */
    dt_mesh_t m2;
    int sh2[2] = {2, 2};
    DT_ASSERT_OK(dt_mesh_create(2, sh2, NULL, NULL, &m2));
    DT_ASSERT_OK(dt_llama_create(m2, &c, NULL, &model));
    DT_ASSERT_OK(dt_llama_module(model, &root));
    dt_tp_plan_entry_t wq[1] = {{"layers.*.wq", dt_tp_colwise()}};
    DT_ASSERT_OK(dt_parallelize_module(root, m2, 1, 1, wq));
    DT_ASSERT_OK(dt_module_find(root, "layers.0", &blk));
    fc = dt_fsdp_config_for(0, -1);
    DT_ASSERT_STATUS(dt_fully_shard(blk, m2, &fc), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "(tp, dp)") != NULL, "%s", dt_last_error());
    DT_ASSERT_OK(dt_llama_destroy(model));
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
  DT_ASSERT_OK(dt_mesh_destroy(abstract));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* Gradient clipping over parameters on two views of the world (a 1-D mesh, and a (2, n/2)
 * mesh): the norm of every gradient counted once, with one all-reduce. */
static void test_clip_two_meshes(void) {
  dt_mesh_t m1, m2;
  int s1[1] = {g_world}, s2[2] = {2, g_world / 2};
  DT_ASSERT_OK(dt_mesh_create(1, s1, NULL, NULL, &m1));
  DT_ASSERT_OK(dt_mesh_create(2, s2, NULL, NULL, &m2));
  enum { R = 8, C = 6 };
  const int64_t shape[2] = {R, C};
  float a[R * C], b[R * C];
  double want = 0;
  for (int i = 0; i < R * C; i++) {
    a[i] = (float)sin(0.3 * i + 1.0);
    b[i] = (float)cos(0.7 * i);
    want += (double)a[i] * a[i] + (double)b[i] * b[i] * 2; /* b is the gradient of two */
  }
  want = sqrt(want);
  dt_placement_t pa[1] = {dt_shard(0)}, pb[2] = {dt_replicate(), dt_shard(1)},
                 pc[2] = {dt_shard(0), dt_replicate()};
  dt_var_t v[3];
  dt_tensor_t t, g;
  DT_ASSERT_OK(dt_tensor_zeros(m1, DT_F32, 2, shape, pa, &t));
  DT_ASSERT_OK(dt_var_leaf(t, 1, &v[0]));
  DT_ASSERT_OK(dt_tensor_from_full(m1, DT_F32, 2, shape, pa, a, &g));
  DT_ASSERT_OK(dt_var_set_grad(v[0], g));
  const dt_placement_t* pls[2] = {pb, pc};
  for (int k = 0; k < 2; k++) {
    DT_ASSERT_OK(dt_tensor_zeros(m2, DT_F32, 2, shape, pls[k], &t));
    DT_ASSERT_OK(dt_var_leaf(t, 1, &v[1 + k]));
    DT_ASSERT_OK(dt_tensor_from_full(m2, DT_F32, 2, shape, pls[k], b, &g));
    DT_ASSERT_OK(dt_var_set_grad(v[1 + k], g));
  }
  double norm = 0;
  DT_ASSERT_OK(dt_clip_grad_norm(3, v, 0.0, &norm)); /* flattens m2 once (collective) */
  DT_ASSERT_OK(dt_counters_reset(NULL));
  DT_ASSERT_OK(dt_clip_grad_norm(3, v, 0.0, &norm));
  dt_counters_t c;
  DT_ASSERT_OK(dt_counters_get(NULL, &c));
  uint64_t calls = 0;
  for (int k = 0; k < DT_COLL_COUNT; k++) calls += c.calls[k];
  DT_ASSERT_TRUE(fabs(norm - want) <= 1e-5 * want, "norm %.9g, want %.9g", norm, want);
  double measured = norm;
  DT_ASSERT_TRUE(calls == 1 && c.calls[DT_COLL_ALL_REDUCE] == 1,
                 "%llu collectives (%llu all-reduces), want one all-reduce",
                 (unsigned long long)calls, (unsigned long long)c.calls[DT_COLL_ALL_REDUCE]);
  DT_ASSERT_OK(dt_clip_grad_norm(3, v, want / 2, &norm));
  DT_ASSERT_OK(dt_clip_grad_norm(3, v, 0.0, &norm));
  DT_ASSERT_TRUE(fabs(norm - want / 2) <= 1e-5 * want, "norm after clipping %.9g", norm);
  if (g_rank == 0)
    printf("clip over two meshes np %d: norm %.6f (dense %.6f) with one all-reduce\n", g_world,
           measured, want);
  for (int k = 0; k < 3; k++) DT_ASSERT_OK(dt_var_destroy(v[k]));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_mesh_destroy(m1));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_corpus_markov(64, 1, 1 << 14, 3, &g_corpus));
  test_bad_input();
  test_mlp();
  test_async_mlp();
  test_async_shared();
  test_loss_parallel();
  test_clip_two_meshes();
  test_traffic();
  test_fsdp_tp_traffic();
  test_parity();
  test_moe();
  DT_ASSERT_OK(dt_corpus_destroy(g_corpus));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_tp: ok\n");
  return 0;
}

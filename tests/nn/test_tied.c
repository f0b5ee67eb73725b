/* test_tied.c - tied parameters: one variable held by two modules (np 1, 2, 4).
 *
 *  - modules: a variable added under two names (or tied with dt_module_tie) is one parameter:
 *    listed once by iteration and dt_module_params, every name listed by
 *    dt_module_for_each_param_name and dt_module_param_names, two holders; replacing it under
 *    either name replaces it for both and destroys the old variable; shared across two trees it
 *    lives until the last one is destroyed;
 *  - the tied Llama (tie_embeddings): the tied table's gradient equals the sum of the
 *    embedding's and the output projection's gradients of the untied model with equal weights,
 *    computed dense (replicated) on the same batch, plain and under TP, FSDP, DDP and (np 4)
 *    FSDP 2 x TP 2; after every wrapper both modules hold one variable;
 *  - counts: the parameter count, the parameter list, the AdamW state and FSDP's root group count
 *    the tied table once; AdamW refuses a variable listed twice; clipping counts it once;
 *  - checkpoint round trip: values saved per unique parameter with all its names, loaded back
 *    through the other name (dt_var_set_value, dt_module_set_param; under FSDP set_value) keep
 *    both holders on one variable with the loaded value, and the loss is the saved model's;
 *  - bad input: ties of different shapes, meshes or placements, a plan placing the two names
 *    apart, TP styles that disagree on the tied table, DDP of a module a tie leaves, a tie after
 *    wrapping: clear errors naming both module paths, nothing half-applied.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

#define BATCH 4
#define SEQ 8
#define VOCAB 64
#define DIM 32

static int g_world, g_rank;
static dt_corpus_t g_corpus;

static dt_llama_config_t model_config(int tie, int experts) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = DIM;
  c.n_layers = 2;
  c.n_heads = 4;
  c.vocab = VOCAB;
  c.seq_len = SEQ;
  c.ffn_dim = 48;
  c.n_experts = experts;
  c.seed = 7;
  c.tie_embeddings = tie;
  return c;
}

static dt_mesh_t world_mesh(void) {
  dt_mesh_t m;
  int shape[1] = {g_world};
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  return m;
}

/* A (tp, dp) mesh of T x dp ranks, a tp group on adjacent ranks (the trainer's). */
static dt_mesh_t tp_dp_mesh(int dp) {
  int T = g_world / dp, shape[2] = {T, dp}, ranks[16];
  for (int t = 0; t < T; t++)
    for (int d = 0; d < dp; d++) ranks[t * dp + d] = d * T + t;
  const char* names[2] = {"tp", "dp"};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(2, shape, names, ranks, &m));
  return m;
}

/* A leaf of `shape` with values v0, v0 + 1, ... (small integers: exact), replicated on mesh. */
static dt_var_t leaf2(dt_mesh_t mesh, int64_t r, int64_t c, float v0, dt_placement_t pl) {
  float vals[64];
  for (int i = 0; i < r * c; i++) vals[i] = v0 + (float)i;
  const int64_t shape[2] = {r, c};
  dt_placement_t p[2] = {pl, pl};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, shape, p, vals, &t));
  dt_var_t v;
  DT_ASSERT_OK(dt_var_leaf(t, 1, &v));
  return v;
}

static int is_live(dt_var_t v) {
  int rg;
  return dt_var_requires_grad(v, &rg) == DT_SUCCESS;
}

static int count_names(const char* name, dt_var_t p, void* ctx) {
  (void)name;
  (void)p;
  (*(int*)ctx)++;
  return 0;
}

/* ------------------------------------------------------------------------------------------- */

static void test_modules(void) {
  dt_mesh_t mesh = world_mesh();
  dt_module_t root, emb, out, third;
  DT_ASSERT_OK(dt_module_create("", NULL, NULL, &root));
  DT_ASSERT_OK(dt_module_create("emb", NULL, NULL, &emb));
  DT_ASSERT_OK(dt_module_create("out", NULL, NULL, &out));
  DT_ASSERT_OK(dt_module_create("third", NULL, NULL, &third));
  dt_var_t w = leaf2(mesh, 4, 3, 1, dt_replicate()), b = leaf2(mesh, 1, 3, 0, dt_replicate());
  DT_ASSERT_OK(dt_module_add_param(emb, "weight", w));
  DT_ASSERT_OK(dt_module_add_param(out, "weight", w)); /* the same variable: tied */
  DT_ASSERT_OK(dt_module_add_param(out, "bias", b));
  /* a name taken: refused, the holders as they were */
  DT_ASSERT_STATUS(dt_module_add_param(out, "weight", w), DT_ERR_INVALID_ARG);
  int h = 0;
  DT_ASSERT_OK(dt_module_param_holders(w, &h));
  DT_ASSERT_EQ(h, 2);
  DT_ASSERT_OK(dt_module_add_child(root, emb));
  DT_ASSERT_OK(dt_module_add_child(root, out));
  DT_ASSERT_OK(dt_module_add_child(root, third));
  int n = 0, names = 0;
  DT_ASSERT_OK(dt_module_num_params(root, &n));
  DT_ASSERT_EQ(n, 2); /* the tied weight once, and the bias */
  DT_ASSERT_OK(dt_module_for_each_param_name(root, count_names, &names));
  DT_ASSERT_EQ(names, 3);
  char nm[64];
  dt_var_t p;
  DT_ASSERT_OK(dt_module_param_at(root, 0, nm, sizeof nm, &p));
  DT_ASSERT_TRUE(p == w && strcmp(nm, "emb.weight") == 0, "first parameter '%s'", nm);
  DT_ASSERT_OK(dt_module_param_at(root, 1, nm, sizeof nm, &p));
  DT_ASSERT_TRUE(p == b && strcmp(nm, "out.bias") == 0, "second parameter '%s'", nm);
  DT_ASSERT_OK(dt_module_param_names(root, w, 1, nm, sizeof nm, &n));
  DT_ASSERT_TRUE(n == 2 && strcmp(nm, "out.weight") == 0, "%d names, the second '%s'", n, nm);
  DT_ASSERT_OK(dt_module_param_names(out, w, 0, nm, sizeof nm, &n)); /* relative to out */
  DT_ASSERT_TRUE(n == 1 && strcmp(nm, "weight") == 0, "%d names below out, '%s'", n, nm);
  DT_ASSERT_STATUS(dt_module_param_names(root, w, 2, nm, sizeof nm, &n), DT_ERR_INVALID_ARG);
  dt_var_t* list;
  DT_ASSERT_OK(dt_module_params(root, &list, &n));
  DT_ASSERT_TRUE(n == 2 && list[0] == w && list[1] == b, "dt_module_params: %d", n);

  /* replaced under the second name: both hold the new one, the old is destroyed */
  dt_var_t w2 = leaf2(mesh, 4, 3, 10, dt_replicate());
  DT_ASSERT_OK(dt_module_set_param(root, "out.weight", w2));
  DT_ASSERT_TRUE(!is_live(w), "the replaced tied variable was not destroyed");
  DT_ASSERT_OK(dt_module_param(root, "emb.weight", &p));
  DT_ASSERT_TRUE(p == w2, "emb still holds the old variable");
  DT_ASSERT_OK(dt_module_param_holders(w2, &h));
  DT_ASSERT_EQ(h, 2);
  /* swapped (a wrapper showing gathered parameters): both, and the old one handed back */
  dt_var_t w3 = leaf2(mesh, 4, 3, 20, dt_replicate()), old;
  DT_ASSERT_OK(dt_module_swap_param(emb, "weight", w3, &old));
  DT_ASSERT_TRUE(old == w2, "swap handed back another variable");
  DT_ASSERT_OK(dt_module_param(out, "weight", &p));
  DT_ASSERT_TRUE(p == w3, "out did not take the swapped variable");
  DT_ASSERT_OK(dt_module_param_holders(w2, &h));
  DT_ASSERT_EQ(h, 0);
  DT_ASSERT_OK(dt_module_swap_param(root, "out.weight", w2, &old));
  DT_ASSERT_TRUE(old == w3, "swapping back");
  DT_ASSERT_OK(dt_var_destroy(w3));

  /* dt_module_tie: a third holder, its own variable destroyed, the target's value kept */
  dt_var_t x = leaf2(mesh, 4, 3, 5, dt_replicate());
  DT_ASSERT_OK(dt_module_add_param(third, "weight", x));
  DT_ASSERT_OK(dt_module_tie(root, "third.weight", "emb.weight"));
  DT_ASSERT_TRUE(!is_live(x), "the tied-away variable lives on");
  DT_ASSERT_OK(dt_module_param(root, "third.weight", &p));
  DT_ASSERT_TRUE(p == w2, "third does not hold the target's variable");
  DT_ASSERT_OK(dt_module_param_names(root, w2, 2, nm, sizeof nm, &n));
  DT_ASSERT_TRUE(n == 3 && strcmp(nm, "third.weight") == 0, "%d names, the third '%s'", n, nm);
  DT_ASSERT_OK(dt_module_tie(root, "emb.weight", "out.weight")); /* tied already: no-op */
  DT_ASSERT_OK(dt_module_num_params(root, &n));
  DT_ASSERT_EQ(n, 2);

  /* bad ties: both names and their modules in the message, nothing changed */
  dt_module_t bad;
  DT_ASSERT_OK(dt_module_create("bad", NULL, NULL, &bad));
  dt_var_t y = leaf2(mesh, 3, 4, 0, dt_replicate());
  DT_ASSERT_OK(dt_module_add_param(bad, "weight", y));
  DT_ASSERT_OK(dt_module_add_child(root, bad));
  DT_ASSERT_STATUS(dt_module_tie(root, "bad.weight", "emb.weight"), DT_ERR_INVALID_ARG);
  const char* e = dt_last_error();
  DT_ASSERT_TRUE(strncmp(e, "dt_module_tie: ", 15) == 0 && strstr(e, "'bad.weight' (module 'bad')") &&
                     strstr(e, "'emb.weight' (module 'emb')") && strstr(e, "(3, 4)") &&
                     strstr(e, "(4, 3)"),
                 "message: %s", e);
  DT_ASSERT_OK(dt_module_param(root, "bad.weight", &p));
  DT_ASSERT_TRUE(p == y && is_live(y), "a refused tie changed the module");
  dt_mesh_t other = world_mesh(); /* the same ranks, another mesh */
  dt_var_t z = leaf2(other, 4, 3, 0, dt_replicate());
  DT_ASSERT_OK(dt_module_set_param(root, "bad.weight", z));
  DT_ASSERT_STATUS(dt_module_tie(root, "emb.weight", "bad.weight"), DT_ERR_INVALID_ARG);
  e = dt_last_error();
  DT_ASSERT_TRUE(strstr(e, "different meshes") && strstr(e, "'bad.weight' (module 'bad')") &&
                     strstr(e, "'emb.weight' (module 'emb')"),
                 "message: %s", e);
  dt_var_t s0 = leaf2(mesh, 4, 3, 0, dt_shard(0));
  DT_ASSERT_OK(dt_module_set_param(root, "bad.weight", s0));
  DT_ASSERT_STATUS(dt_module_tie(root, "bad.weight", "out.weight"), DT_ERR_INVALID_ARG);
  e = dt_last_error();
  DT_ASSERT_TRUE(strstr(e, "placement") && strstr(e, "S(0)") && strstr(e, "'out.weight'") &&
                     strstr(e, "'bad.weight'"),
                 "message: %s", e);
  DT_ASSERT_STATUS(dt_module_tie(root, "bad.wieght", "out.weight"), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "has no parameter 'bad.wieght'"), "%s", dt_last_error());
  DT_ASSERT_OK(dt_module_param_holders(w2, &h));
  DT_ASSERT_EQ(h, 3);
  DT_ASSERT_OK(dt_module_param(root, "bad.weight", &p));
  DT_ASSERT_TRUE(p == s0, "a refused tie changed the module");

  /* shared by two trees: it lives until the last holder goes */
  dt_module_t lone;
  DT_ASSERT_OK(dt_module_create("lone", NULL, NULL, &lone));
  DT_ASSERT_OK(dt_module_add_param(lone, "w", w2));
  DT_ASSERT_OK(dt_module_destroy(root));
  DT_ASSERT_TRUE(is_live(w2), "destroying one tree destroyed a variable the other holds");
  DT_ASSERT_TRUE(!is_live(b), "the untied bias outlived its module");
  float v[12];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w2), v, sizeof v));
  DT_ASSERT_TRUE(v[0] == 10 && v[11] == 21, "values %g .. %g", v[0], v[11]);
  DT_ASSERT_OK(dt_module_param_holders(w2, &h));
  DT_ASSERT_EQ(h, 1);
  DT_ASSERT_OK(dt_module_destroy(lone));
  DT_ASSERT_TRUE(!is_live(w2), "the last holder did not destroy it");
  DT_ASSERT_OK(dt_mesh_destroy(other));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* ------------------------------------------------------------------------------------------- */

enum { WRAP_NONE, WRAP_TP, WRAP_FSDP, WRAP_DDP, WRAP_FSDP_TP, WRAP_COUNT };
static const char* const kWrap[WRAP_COUNT] = {"none", "tp", "fsdp", "ddp", "fsdp 2 x tp 2"};

typedef struct {
  dt_mesh_t mesh;
  dt_llama_t model;
  dt_module_t root;
  dt_placement_t tok_pl[2];
} model_t;

/* The model wrapped as the trainer wraps it. */
static void build(model_t* s, int tie, int experts, int wrap) {
  memset(s, 0, sizeof *s);
  s->tok_pl[0] = s->tok_pl[1] = dt_replicate();
  s->mesh = wrap == WRAP_FSDP_TP ? tp_dp_mesh(2) : world_mesh();
  dt_llama_config_t c = model_config(tie, experts);
  DT_ASSERT_OK(dt_llama_create(s->mesh, &c, NULL, &s->model));
  DT_ASSERT_OK(dt_llama_module(s->model, &s->root));
  if (wrap == WRAP_TP || wrap == WRAP_FSDP_TP) {
    dt_tp_plan_entry_t plan[16];
    int n;
    DT_ASSERT_OK(dt_tp_plan_llama(&c, 0, 0, plan, 16, &n));
    DT_ASSERT_OK(dt_parallelize_module(s->root, s->mesh, 0, n, plan));
  }
  if (wrap == WRAP_FSDP || wrap == WRAP_FSDP_TP) {
    int dim = wrap == WRAP_FSDP ? 0 : 1;
    dt_fsdp_config_t fc = dt_fsdp_config_for(dim, -1);
    for (int l = 0; l < c.n_layers; l++) {
      char path[32];
      dt_module_t blk;
      snprintf(path, sizeof path, "layers.%d", l);
      DT_ASSERT_OK(dt_module_find(s->root, path, &blk));
      DT_ASSERT_OK(dt_fully_shard(blk, s->mesh, &fc));
    }
    DT_ASSERT_OK(dt_fully_shard(s->root, s->mesh, &fc));
    s->tok_pl[dim] = dt_shard(0);
  }
  if (wrap == WRAP_DDP) {
    DT_ASSERT_OK(dt_data_parallel(s->root, s->mesh, NULL));
    s->tok_pl[0] = dt_shard(0);
  }
}

static void destroy(model_t* s) {
  DT_ASSERT_OK(dt_llama_destroy(s->model));
  DT_ASSERT_OK(dt_mesh_destroy(s->mesh));
}

/* Forward and backward of batch `step`; the loss. */
static float fwd_bwd(model_t* s, int step) {
  int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
  DT_ASSERT_OK(dt_corpus_batch(g_corpus, 5, step, BATCH, SEQ, tok, tgt));
  const int64_t shape[2] = {BATCH, SEQ};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(s->mesh, DT_I64, 2, shape, s->tok_pl, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(s->mesh, DT_I64, 2, shape, s->tok_pl, tgt, &gt));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t loss;
  DT_ASSERT_OK(dt_llama_forward(s->model, tape, tt, gt, &loss, NULL));
  float lv;
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  dt_tensor_destroy(tt);
  dt_tensor_destroy(gt);
  return lv;
}

static void read_full(dt_tensor_t t, float* out) {
  DT_ASSERT_TRUE(t != NULL, "no tensor (no gradient?)");
  DT_ASSERT_OK(dt_tensor_gather_full(t, out, sizeof(float) * VOCAB * DIM));
}

static dt_var_t param(dt_module_t root, const char* name) {
  dt_var_t v;
  DT_ASSERT_OK(dt_module_param(root, name, &v));
  return v;
}

/* The tied table's gradient against the dense sum of the untied model's two gradients. */
static void test_grad_sum(int experts) {
  static float ref_e[VOCAB * DIM], ref_o[VOCAB * DIM], g[VOCAB * DIM], w[VOCAB * DIM];
  /* the dense reference: untied, replicated, the output weight set to the embedding's values */
  model_t u;
  build(&u, 0, experts, WRAP_NONE);
  dt_var_t ue = param(u.root, "tok_emb"), uo = param(u.root, "output");
  DT_ASSERT_TRUE(ue != uo, "the untied model is tied");
  read_full(dt_var_value(ue), w);
  dt_placement_t rep[1] = {dt_replicate()};
  const int64_t vd[2] = {VOCAB, DIM};
  dt_tensor_t copy;
  DT_ASSERT_OK(dt_tensor_from_full(u.mesh, DT_F32, 2, vd, rep, w, &copy));
  DT_ASSERT_OK(dt_var_set_value(uo, copy));
  float uloss = fwd_bwd(&u, 0);
  read_full(dt_var_grad(ue), ref_e);
  read_full(dt_var_grad(uo), ref_o);
  destroy(&u);
  double scale = 0, e_only = 0, o_only = 0;
  for (int i = 0; i < VOCAB * DIM; i++) {
    double r = fabs((double)ref_e[i] + ref_o[i]);
    if (r > scale) scale = r;
  }
  for (int k = 0; k < WRAP_COUNT; k++) {
    if (k == WRAP_FSDP_TP && g_world != 4) continue;
    if ((k == WRAP_TP || k == WRAP_FSDP_TP) && experts) continue; /* parity covers MoE x TP */
    model_t s;
    build(&s, 1, experts, k);
    dt_var_t te = param(s.root, "tok_emb"), to = param(s.root, "output");
    DT_ASSERT_TRUE(te == to, "%s: tok_emb and output hold two variables after wrapping",
                   kWrap[k]);
    float loss = fwd_bwd(&s, 0);
    te = param(s.root, "tok_emb"); /* between steps: the wrapper's parameter */
    DT_ASSERT_TRUE(te == param(s.root, "output"), "%s: two variables after a step", kWrap[k]);
    read_full(dt_var_value(te), g);
    DT_ASSERT_TRUE(memcmp(g, w, sizeof g) == 0, "%s: the tied table is not the embedding's "
                   "initial values", kWrap[k]);
    read_full(dt_var_grad(te), g);
    double worst = 0;
    e_only = o_only = 0;
    for (int i = 0; i < VOCAB * DIM; i++) {
      double d = fabs((double)g[i] - ((double)ref_e[i] + ref_o[i]));
      if (d > worst) worst = d;
      if (fabs((double)g[i] - ref_e[i]) > e_only) e_only = fabs((double)g[i] - ref_e[i]);
      if (fabs((double)g[i] - ref_o[i]) > o_only) o_only = fabs((double)g[i] - ref_o[i]);
    }
    if (g_rank == 0)
      printf("tied %s %-14s np %d: |grad - (grad_emb + grad_out)| <= %.3g (of %.3g); loss %.6f "
             "vs %.6f\n", experts ? "moe  " : "dense", kWrap[k], g_world, worst, scale, loss,
             uloss);
    DT_ASSERT_TRUE(worst <= 1e-5 * scale, "%s: the tied gradient is not the sum (%.3g)",
                   kWrap[k], worst);
    DT_ASSERT_TRUE(e_only > 1e-2 * scale && o_only > 1e-2 * scale, "%s: one use's gradient "
                   "alone (%.3g, %.3g): both uses must count", kWrap[k], e_only, o_only);
    DT_ASSERT_TRUE(fabs(loss - uloss) <= 1e-5 * fabs(uloss), "%s: loss %.7f, untied %.7f",
                   kWrap[k], loss, uloss);
    destroy(&s);
  }
}

/* ------------------------------------------------------------------------------------------- */

static int64_t numel_of(dt_var_t v) {
  int nd;
  int64_t s[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_ndim(dt_var_value(v), &nd));
  DT_ASSERT_OK(dt_tensor_shape(dt_var_value(v), s));
  for (int d = 0; d < nd; d++) n *= s[d];
  return n;
}

static void test_counts(void) {
  int n_u, n_t, n_m;
  int64_t numel_u, numel_t;
  dt_var_t* ps;
  model_t u, t;
  build(&u, 0, 0, WRAP_NONE);
  build(&t, 1, 0, WRAP_NONE);
  DT_ASSERT_OK(dt_llama_params(u.model, NULL, NULL, &n_u, &numel_u));
  const char* const* names;
  DT_ASSERT_OK(dt_llama_params(t.model, &ps, &names, &n_t, &numel_t));
  DT_ASSERT_EQ(n_t, n_u - 1);
  DT_ASSERT_EQ(numel_t, numel_u - (int64_t)VOCAB * DIM);
  int64_t sum = 0, out_names = 0;
  for (int i = 0; i < n_t; i++) {
    sum += numel_of(ps[i]);
    out_names += strcmp(names[i], "output") == 0;
  }
  DT_ASSERT_EQ(sum, numel_t);
  DT_ASSERT_EQ(out_names, 0); /* listed once, as tok_emb */
  DT_ASSERT_OK(dt_module_num_params(t.root, &n_m));
  DT_ASSERT_EQ(n_m, n_t);
  DT_ASSERT_OK(dt_module_params(t.root, &ps, &n_m));
  DT_ASSERT_EQ(n_m, n_t);
  dt_adamw_config_t ac = dt_adamw_config_default();
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&ac, n_m, ps, &opt));
  dt_tensor_t m1;
  DT_ASSERT_OK(dt_adamw_state(opt, n_t - 1, &m1, NULL, NULL));
  DT_ASSERT_STATUS(dt_adamw_state(opt, n_t, &m1, NULL, NULL), DT_ERR_INVALID_ARG);
  /* a step moves the tied table once: fwd_bwd, step, and the table equals one AdamW update */
  fwd_bwd(&t, 0);
  dt_var_t te = param(t.root, "tok_emb");
  static float before[VOCAB * DIM], after[VOCAB * DIM], grad[VOCAB * DIM];
  read_full(dt_var_value(te), before);
  read_full(dt_var_grad(te), grad);
  DT_ASSERT_OK(dt_adamw_step(opt, 1e-3));
  read_full(dt_var_value(te), after);
  double most = 0;
  for (int i = 0; i < VOCAB * DIM; i++) { /* first AdamW step: |update| <= lr (1 + wd) */
    double d = fabs((double)after[i] - before[i]);
    if (d > most) most = d;
  }
  DT_ASSERT_TRUE(most <= 1.1e-3 && most > 5e-4, "one step moved the tied table by %.3g", most);
  dt_tensor_t step_t;
  DT_ASSERT_OK(dt_adamw_state(opt, 0, NULL, NULL, &step_t));
  int64_t steps = 0;
  DT_ASSERT_OK(dt_tensor_gather_full(step_t, &steps, sizeof steps));
  DT_ASSERT_EQ(steps, 1);
  /* clipping counts the tied table once: the norm of the list with it twice is the same */
  double n1, n2;
  DT_ASSERT_OK(dt_clip_grad_norm(n_m, ps, 0, &n1));
  dt_var_t* twice = malloc(sizeof(dt_var_t) * (size_t)(n_m + 1));
  memcpy(twice, ps, sizeof(dt_var_t) * (size_t)n_m);
  twice[n_m] = te;
  DT_ASSERT_OK(dt_clip_grad_norm(n_m + 1, twice, 0, &n2));
  DT_ASSERT_TRUE(n1 == n2 && n1 > 0, "norm %.9g, with the tied table twice %.9g", n1, n2);
  DT_ASSERT_OK(dt_clip_grad_norm(n_m + 1, twice, n1 / 2, &n2)); /* scaled once: half the norm */
  DT_ASSERT_OK(dt_clip_grad_norm(n_m, ps, 0, &n2));
  DT_ASSERT_TRUE(fabs(n2 - n1 / 2) <= 1e-5 * n1, "clipped to %.9g, want %.9g", n2, n1 / 2);
  /* AdamW refuses a variable listed twice (it would step it twice) */
  dt_adamw_t bad = NULL;
  DT_ASSERT_STATUS(dt_adamw_create(&ac, n_m + 1, twice, &bad), DT_ERR_INVALID_ARG);
  const char* want = "dt_adamw_create: parameters 0 and ";
  DT_ASSERT_TRUE(bad == NULL && strncmp(dt_last_error(), want, strlen(want)) == 0, "%s",
                 dt_last_error());
  free(twice);
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  destroy(&u);
  destroy(&t);

  /* FSDP: the root group (the lowest module holding both uses) takes the table once */
  model_t f;
  build(&f, 1, 0, WRAP_FSDP);
  dt_fsdp_group_info_t gi;
  DT_ASSERT_OK(dt_fsdp_group_info(f.root, &gi));
  DT_ASSERT_TRUE(gi.n_params == 2 && gi.numel == (int64_t)VOCAB * DIM + DIM, "root group: %d "
                 "parameters, %lld elements (the table and the norm)", gi.n_params,
                 (long long)gi.numel);
  DT_ASSERT_OK(dt_module_num_params(f.root, &n_m));
  DT_ASSERT_EQ(n_m, n_t);
  destroy(&f);
  /* a group of the output module alone leaves the table to an ancestor's group */
  dt_mesh_t mesh = world_mesh();
  dt_llama_config_t c = model_config(1, 0);
  dt_llama_t model;
  dt_module_t root, out;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
  DT_ASSERT_OK(dt_llama_module(model, &root));
  DT_ASSERT_OK(dt_module_find(root, "output", &out));
  dt_var_t table = param(root, "tok_emb");
  dt_fsdp_config_t fc = dt_fsdp_config_for(0, -1);
  DT_ASSERT_OK(dt_fully_shard(out, mesh, &fc));
  DT_ASSERT_OK(dt_fsdp_group_info(out, &gi));
  DT_ASSERT_EQ(gi.n_params, 0);
  DT_ASSERT_TRUE(param(root, "output") == table, "a group of one holder took the tied table");
  /* DDP of a module that a tie leaves: refused, nothing changed */
  dt_module_t emb;
  DT_ASSERT_OK(dt_module_find(root, "tok_emb", &emb));
  DT_ASSERT_STATUS(dt_data_parallel(emb, mesh, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strncmp(dt_last_error(), "dt_data_parallel: the parameter ", 32) == 0 &&
                     strstr(dt_last_error(), "tied to 1 holder outside module 'tok_emb'"),
                 "%s", dt_last_error());
  DT_ASSERT_TRUE(dt_module_attachment(emb, "ddp") == NULL, "a refused DDP left state");
  /* a tie after FSDP: refused */
  DT_ASSERT_STATUS(dt_module_tie(root, "layers.0.wq", "output"), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "tie before wrapping"), "%s", dt_last_error());
  DT_ASSERT_OK(dt_llama_destroy(model));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* ------------------------------------------------------------------------------------------- */

typedef struct {
  char names[2][64];
  int n_names;
  float* value;
  int64_t numel;
} saved_t;

typedef struct {
  saved_t* s;
  int n;
  dt_module_t root;
} save_ctx_t;

/* A checkpoint's save: each unique parameter once, its every name recorded. */
static int save_one(const char* name, dt_var_t p, void* ctx) {
  save_ctx_t* c = ctx;
  saved_t* s = &c->s[c->n++];
  int n;
  DT_ASSERT_OK(dt_module_param_names(c->root, p, 0, s->names[0], sizeof s->names[0], &n));
  DT_ASSERT_TRUE(strcmp(s->names[0], name) == 0, "the first name '%s', listed as '%s'",
                 s->names[0], name);
  DT_ASSERT_TRUE(n <= 2, "'%s' has %d names", name, n);
  if (n == 2) DT_ASSERT_OK(dt_module_param_names(c->root, p, 1, s->names[1], 64, &n));
  s->n_names = n;
  s->numel = numel_of(p);
  s->value = malloc(sizeof(float) * (size_t)s->numel);
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(p), s->value, sizeof(float) * (size_t)s->numel));
  return 0;
}

/* A checkpoint's load through the last name of each parameter: set_value (0) or set_param (1). */
static void load(dt_module_t root, const saved_t* s, int n, int how) {
  for (int i = 0; i < n; i++) {
    const char* name = s[i].names[s[i].n_names - 1];
    dt_var_t v = param(root, name);
    dt_tensor_t cur = dt_var_value(v), t;
    dt_mesh_t mesh;
    int nd, rg;
    int64_t shape[DT_MAX_DIMS];
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    DT_ASSERT_OK(dt_tensor_mesh(cur, &mesh));
    DT_ASSERT_OK(dt_tensor_ndim(cur, &nd));
    DT_ASSERT_OK(dt_tensor_shape(cur, shape));
    DT_ASSERT_OK(dt_tensor_placements(cur, pl));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, nd, shape, pl, s[i].value, &t));
    if (how == 0) {
      DT_ASSERT_OK(dt_var_set_value(v, t));
    } else {
      dt_var_t nv;
      DT_ASSERT_OK(dt_var_requires_grad(v, &rg));
      DT_ASSERT_OK(dt_var_leaf(t, rg, &nv));
      DT_ASSERT_OK(dt_module_set_param(root, name, nv));
    }
  }
}

static void test_roundtrip(int wrap) {
  static const char* const kHow[2] = {"dt_var_set_value", "dt_module_set_param"};
  for (int how = 0; how < 2; how++) {
    if (how == 1 && wrap != WRAP_NONE && wrap != WRAP_TP) continue; /* FSDP/DDP: set_value */
    model_t s;
    build(&s, 1, 0, wrap);
    int n;
    DT_ASSERT_OK(dt_module_num_params(s.root, &n));
    saved_t* saved = calloc((size_t)n, sizeof *saved);
    save_ctx_t c = {saved, 0, s.root};
    DT_ASSERT_OK(dt_module_for_each_param(s.root, save_one, &c));
    DT_ASSERT_EQ(c.n, n);
    int tied = 0;
    for (int i = 0; i < n; i++)
      if (saved[i].n_names == 2) {
        tied++;
        DT_ASSERT_TRUE(!strcmp(saved[i].names[0], "tok_emb") &&
                           !strcmp(saved[i].names[1], "output"),
                       "tied names '%s', '%s'", saved[i].names[0], saved[i].names[1]);
      }
    DT_ASSERT_EQ(tied, 1);
    float l0 = fwd_bwd(&s, 0);
    /* training changes the values: a few steps of AdamW */
    dt_var_t* ps;
    DT_ASSERT_OK(dt_module_params(s.root, &ps, &n));
    dt_adamw_config_t ac = dt_adamw_config_default();
    ac.lr = 1e-2;
    dt_adamw_t opt;
    DT_ASSERT_OK(dt_adamw_create(&ac, n, ps, &opt));
    for (int k = 0; k < 3; k++) {
      DT_ASSERT_OK(dt_adamw_step(opt, DT_ADAMW_LR_CONFIG));
      DT_ASSERT_OK(dt_module_zero_grad(s.root));
      fwd_bwd(&s, k + 1);
    }
    DT_ASSERT_OK(dt_adamw_step(opt, DT_ADAMW_LR_CONFIG));
    DT_ASSERT_OK(dt_module_zero_grad(s.root));
    DT_ASSERT_OK(dt_adamw_destroy(opt));
    float l1 = fwd_bwd(&s, 0);
    DT_ASSERT_OK(dt_module_zero_grad(s.root));
    DT_ASSERT_TRUE(l1 != l0, "training did not change the model");
    load(s.root, saved, c.n, how);
    dt_var_t te = param(s.root, "tok_emb"), to = param(s.root, "output");
    int h;
    DT_ASSERT_OK(dt_module_param_holders(te, &h));
    DT_ASSERT_TRUE(te == to && h == 2, "%s: after loading through 'output' the holders are on "
                   "%s (%d holders)", kHow[how], te == to ? "one variable" : "two", h);
    static float v[VOCAB * DIM];
    read_full(dt_var_value(te), v);
    for (int i = 0; i < c.n; i++)
      if (saved[i].n_names == 2)
        DT_ASSERT_TRUE(memcmp(v, saved[i].value, sizeof v) == 0, "%s: the table is not the "
                       "loaded value", kHow[how]);
    float l2 = fwd_bwd(&s, 0);
    if (g_rank == 0)
      printf("round trip %-14s %-19s np %d: loss %.6f saved, %.6f trained, %.6f loaded\n",
             kWrap[wrap], kHow[how], g_world, l0, l1, l2);
    DT_ASSERT_TRUE(l2 == l0, "%s: the loaded model's loss %.9g, the saved one's %.9g", kHow[how],
                   l2, l0);
    for (int i = 0; i < c.n; i++) free(saved[i].value);
    free(saved);
    destroy(&s);
  }
}

/* ------------------------------------------------------------------------------------------- */

static void test_bad_input(void) {
  dt_mesh_t mesh = world_mesh();
  dt_llama_config_t c = model_config(1, 0);
  dt_llama_t model = NULL;
  /* a plan placing the two names of the one table differently */
  DT_ASSERT_STATUS(dt_llama_create(mesh, &c, "output=S(0);tok_emb=S(1)", &model),
                   DT_ERR_INVALID_ARG);
  const char* e = dt_last_error();
  DT_ASSERT_TRUE(model == NULL && strncmp(e, "dt_llama_create: ", 17) == 0 &&
                     strstr(e, "'tok_emb' S(1)") && strstr(e, "'output' S(0)"),
                 "%s", e);
  DT_ASSERT_OK(dt_llama_create(mesh, &c, "output=S(0);tok_emb=S(0)", &model));
  DT_ASSERT_OK(dt_llama_destroy(model));
  /* TP styles that disagree on the tied table: refused naming both, nothing applied */
  dt_module_t root;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &model));
  DT_ASSERT_OK(dt_llama_module(model, &root));
  dt_var_t* ps;
  int n;
  DT_ASSERT_OK(dt_module_params(root, &ps, &n));
  dt_var_t before[32];
  memcpy(before, ps, sizeof(dt_var_t) * (size_t)n);
  dt_tp_plan_entry_t plan[3] = {{"layers.*.wq", dt_tp_colwise()},
                                {"tok_emb", dt_tp_embedding_colwise()},
                                {"output", dt_tp_colwise()}};
  {
    DT_ASSERT_STATUS(dt_parallelize_module(root, mesh, 0, 3, plan), DT_ERR_INVALID_ARG);
    e = dt_last_error();
    const char* want = "dt_parallelize_module: the tied parameter held by 'tok_emb' and by "
                       "'output' gets two placements";
    DT_ASSERT_TRUE(strncmp(e, want, strlen(want)) == 0 &&
                       strstr(e, "S(1) from embedding colwise (plan entry 'tok_emb')") &&
                       strstr(e, "S(0) from colwise (plan entry 'output')"),
                   "%s", e);
    int m2;
    DT_ASSERT_OK(dt_module_params(root, &ps, &m2));
    DT_ASSERT_EQ(m2, n);
    for (int i = 0; i < n; i++) {
      DT_ASSERT_TRUE(ps[i] == before[i], "parameter %d replaced by a refused plan", i);
      dt_placement_t pl[1];
      DT_ASSERT_OK(dt_tensor_placements(dt_var_value(ps[i]), pl));
      DT_ASSERT_TRUE(pl[0].kind == DT_REPLICATE, "parameter %d re-placed by a refused plan", i);
    }
    const char* mods[3] = {"tok_emb", "output", "layers.0.wq"};
    for (int k = 0; k < 3; k++) {
      dt_module_t mm;
      DT_ASSERT_OK(dt_module_find(root, mods[k], &mm));
      DT_ASSERT_TRUE(dt_module_attachment(mm, "tp") == NULL, "'%s' styled by a refused plan",
                     mods[k]);
    }
  }
  /* one holder styled: the table is re-placed for both */
  dt_var_t old = param(root, "tok_emb");
  dt_tp_plan_entry_t one[1] = {{"tok_emb", dt_tp_embedding_rowwise()}};
  DT_ASSERT_OK(dt_parallelize_module(root, mesh, 0, 1, one));
  dt_var_t te = param(root, "tok_emb");
  DT_ASSERT_TRUE(te == param(root, "output") && te != old && !is_live(old), "after styling one "
                 "holder: the other still holds the old table, or it lives on");
  dt_placement_t pl[1];
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(te), pl));
  DT_ASSERT_TRUE(pl[0].kind == DT_SHARD && pl[0].dim == 0, "the table is not Shard(0)");
  DT_ASSERT_OK(dt_llama_destroy(model));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_corpus_markov(VOCAB, 1, 1 << 14, 3, &g_corpus));
  test_modules();
  test_bad_input();
  test_counts();
  test_grad_sum(0);
  test_grad_sum(4);
  test_roundtrip(WRAP_NONE);
  test_roundtrip(WRAP_TP);
  test_roundtrip(WRAP_FSDP);
  test_roundtrip(WRAP_DDP);
  DT_ASSERT_OK(dt_corpus_destroy(g_corpus));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_tied: ok\n");
  return 0;
}

/* test_alloc_faults_train.c - fault injection over the training stack: every allocation a
 * training step makes may fail.
 *
 * test_alloc_faults covers the tensor, op, autograd and optimizer layers with a short scenario;
 * this test covers what sits on top of them, the way a trainer uses it: a small Llama built,
 * wrapped (FSDP with activation checkpointing; dense MoE with tied embeddings, ignored targets and a
 * frozen parameter under DDP; tensor and sequence parallelism with loss parallel under bf16 FSDP),
 * two training steps (forward, backward, clipping, AdamW, zeroed gradients), then a checkpoint of
 * the model and optimizer saved and loaded back. Linked with --wrap=malloc,calloc,realloc (dtensor's
 * code and this program; not Open MPI's or libc's own), each scenario is run once to count its
 * allocations, then once per allocation k with the k-th failing. Every run must end without a
 * crash; a failing call must return a status with a message; everything is destroyed afterwards
 * (ASan's leak check and valgrind see no leak); the checkpoint directory holds no published
 * checkpoint after a failed save; and a last clean run gives the same losses as the first, bit
 * for bit: a failure leaves no damaged state behind (caches, pools, communicators). One rank: an
 * allocation failure is rank-local (the deadline covers other ranks waiting for it). With
 * DTENSOR_BACKEND=cuda-emu (test_alloc_faults_train_np1_emu) the emulated device's memory
 * (aligned_alloc) fails in turn too. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_fault_inject.h"
#include "dt_test.h"
#include "dtensor/checkpoint.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"


enum { V_FSDP, V_MOE_DDP, V_TP_FSDP, V_HSDP, V_COUNT };
static const char* const k_variant[V_COUNT] = {
    "fsdp+checkpointing", "moe+tied+ddp", "tp+sp+loss-parallel+fsdp-bf16",
    "hsdp+no-reshard+micro-batches+consolidate"};
static char g_dir[256];

static int rm_entry(const char* p, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}
/* Empties the checkpoint directory (a save of an existing name is refused). */
static void clear_dir(void) {
  nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  DT_ASSERT_TRUE(mkdir(g_dir, 0700) == 0, "mkdir %s", g_dir);
}

typedef struct {
  double loss[2];
} result_t;

/* One scenario from nothing to nothing; returns the first failing call's status. */
static dt_status_t scenario(int variant, result_t* res) {
  dt_status_t st = DT_SUCCESS;
  dt_mesh_t mesh = NULL;
  dt_llama_t model = NULL;
  dt_tape_t tape = NULL;
  dt_adamw_t opt = NULL;
  dt_checkpoint_t ck = NULL, ck2 = NULL;
  dt_tensor_t tok = NULL, tgt = NULL;
  dt_var_t* params = NULL;
  int n_params = 0;
  res->loss[0] = res->loss[1] = NAN;
#define TRY(call) DT_FAULT_TRY(call)
  const int two_d = variant == V_TP_FSDP || variant == V_HSDP;
  int shape[2] = {1, 1};
  TRY(dt_mesh_create(two_d ? 2 : 1, shape, NULL, NULL, &mesh));
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.vocab = 24;
  c.seq_len = 8;
  c.seed = 11;
  if (variant == V_MOE_DDP) {
    c.n_experts = 2;
    c.top_k = 1;
    c.tie_embeddings = 1;
    c.ignore_targets = 1;
  }
  TRY(dt_llama_create(mesh, &c, NULL, &model));
  dt_module_t root;
  TRY(dt_llama_module(model, &root));
  if (variant == V_FSDP) {
    dt_fsdp_config_t fc = dt_fsdp_config_default(1);
    int nl = 0;
    dt_module_t layers, layer;
    TRY(dt_module_find(root, "layers", &layers));
    TRY(dt_module_num_children(layers, &nl));
    for (int i = 0; i < nl; i++) {
      TRY(dt_module_child(layers, i, &layer));
      TRY(dt_fully_shard(layer, mesh, &fc));
    }
    TRY(dt_fully_shard(root, mesh, &fc));
  } else if (variant == V_MOE_DDP) {
    dt_var_t frozen;
    TRY(dt_module_param(root, "norm", &frozen));
    TRY(dt_var_set_requires_grad(frozen, 0));
    dt_ddp_config_t dc = {.mesh_dim = -1, .bucket_nbytes = 2048}; /* several buckets */
    TRY(dt_data_parallel(root, mesh, &dc));
  } else if (variant == V_HSDP) {
    dt_fsdp_config_t fc = dt_fsdp_config_default(2);
    fc.reshard_after_forward = 0;
    fc.reduce_dtype = DT_BF16;
    TRY(dt_fully_shard(root, mesh, &fc));
  } else {
    dt_tp_plan_entry_t plan[16];
    int n = 0;
    TRY(dt_tp_plan_llama(&c, 1, 1, plan, 16, &n));
    TRY(dt_parallelize_module(root, mesh, 0, n, plan));
    dt_fsdp_config_t fc = dt_fsdp_config_for(1, -1);
    fc.param_dtype = DT_BF16;
    fc.output_dtype = DT_F32;
    TRY(dt_fully_shard(root, mesh, &fc));
  }
  TRY(dt_module_params(root, &params, &n_params));
  dt_adamw_config_t ac = dt_adamw_config_default();
  TRY(dt_adamw_create(&ac, n_params, params, &opt));
  TRY(dt_tape_create(&tape));
  if (variant == V_FSDP) TRY(dt_tape_set_checkpoint(tape, dt_ckpt_policy_default, NULL));
  const int64_t bs[2] = {2, 8};
  int64_t tk[16], tg[16];
  for (int i = 0; i < 16; i++) {
    tk[i] = (i * 7 + 3) % 24;
    tg[i] = variant == V_MOE_DDP && i % 5 == 1 ? -100 : (i * 5 + 1) % 24;
  }
  dt_placement_t pl[2] = {dt_replicate(), dt_replicate()};
  TRY(dt_tensor_from_full(mesh, DT_I64, 2, bs, pl, tk, &tok));
  TRY(dt_tensor_from_full(mesh, DT_I64, 2, bs, pl, tg, &tgt));
  const int micro = variant == V_HSDP ? 2 : 1; /* the first without gradient sync */
  for (int s = 0; s < 2; s++) {
    dt_var_t loss = NULL;
    double norm = 0.0;
    for (int mb = 0; mb < micro; mb++) {
      if (micro > 1) TRY(dt_fsdp_set_requires_gradient_sync(root, mb == micro - 1));
      TRY(dt_llama_forward(model, tape, tok, tgt, &loss, NULL));
      TRY(dt_tensor_item(dt_var_value(loss), &res->loss[s]));
      TRY(dt_tape_backward(tape, loss));
      TRY(dt_tape_reset(tape));
    }
    TRY(dt_clip_grad_norm(n_params, params, 1.0, &norm));
    TRY(dt_adamw_step(opt, 1e-2));
    TRY(dt_module_zero_grad(root));
  }
  /* the model and optimizer saved, then loaded back into themselves through a second list */
  dt_checkpoint_save_opts_t so = dt_checkpoint_save_opts_default();
  so.step = 2;
  TRY(dt_checkpoint_create(&ck));
  TRY(dt_checkpoint_add_module(ck, "model", root));
  TRY(dt_checkpoint_add_adamw(ck, "optim", opt, root));
  TRY(dt_checkpoint_set_i64(ck, "step", 2));
  {
    st = dt_checkpoint_save(ck, g_dir, NULL, &so);
    char latest[512], pub[512];
    struct stat sb;
    snprintf(latest, sizeof latest, "%s/latest", g_dir);
    snprintf(pub, sizeof pub, "%s/step_00000002", g_dir);
    if (st != DT_SUCCESS) /* nothing published */
      DT_ASSERT_TRUE(stat(latest, &sb) != 0 && stat(pub, &sb) != 0, "a failed save (%s: %s) "
                     "left %s or %s", dt_status_name(st), dt_last_error(), latest, pub);
    TRY(st);
    DT_ASSERT_TRUE(stat(latest, &sb) == 0 && stat(pub, &sb) == 0, "a save published no %s",
                   pub);
  }
  TRY(dt_checkpoint_create(&ck2));
  TRY(dt_checkpoint_add_module(ck2, "model", root));
  TRY(dt_checkpoint_add_adamw(ck2, "optim", opt, root));
  TRY(dt_checkpoint_load(ck2, g_dir, NULL));
  {
    int64_t step = 0;
    TRY(dt_checkpoint_get_i64(ck2, "step", &step));
    DT_ASSERT_TRUE(step == 2, "loaded step %lld", (long long)step);
  }
  if (variant == V_HSDP) { /* the tools' path: verify, consolidate, import as a seed */
    char pub[512], st_path[512];
    snprintf(pub, sizeof pub, "%s/step_00000002", g_dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", g_dir);
    TRY(dt_checkpoint_verify(pub, NULL));
    TRY(dt_checkpoint_consolidate(pub, st_path, 0, 1));
    TRY(dt_checkpoint_import(st_path, g_dir, "seed", 0));
  }
done:
  dt_checkpoint_destroy(ck);
  dt_checkpoint_destroy(ck2);
  dt_tensor_destroy(tok);
  dt_tensor_destroy(tgt);
  dt_tape_destroy(tape);
  dt_adamw_destroy(opt);
  dt_llama_destroy(model);
  dt_mesh_destroy(mesh);
  clear_dir();
  return st;
#undef TRY
}

/* Fails each allocation of the variant's scenario in turn (every `stride`-th, from 1); returns
 * the number of allocations one run makes. */
static long inject(int variant, const result_t* ref, long stride) {
  result_t r;
  g_count = 0;
  DT_ASSERT_OK(scenario(variant, &r));
  long total = g_count;
  DT_ASSERT_TRUE(total > 100, "only %ld allocations counted: wrapping not in effect?", total);
  long failed = 0;
  const char* only = getenv("DT_FAULT_ONLY"); /* "k": that allocation alone (debugging) */
  long first = only && atol(only) > 0 ? atol(only) : 1, last = only && atol(only) > 0 ? first : total;
  for (long k = first; k <= last; k += stride) {
    g_count = 0;
    g_fail_at = k;
    dt_clear_error();
    dt_status_t st = scenario(variant, &r);
    g_fail_at = -1;
    if (st != DT_SUCCESS) failed++;
    else /* the failure was absorbed (a cache or pool fell back): the same numbers */
      DT_ASSERT_TRUE(r.loss[0] == ref->loss[0] && r.loss[1] == ref->loss[1],
                     "%s: allocation %ld failed, the run succeeded with losses %.9g %.9g, not "
                     "%.9g %.9g", k_variant[variant], k, r.loss[0], r.loss[1], ref->loss[0],
                     ref->loss[1]);
  }
  g_count = 0;
  DT_ASSERT_OK(scenario(variant, &r));
  DT_ASSERT_TRUE(r.loss[0] == ref->loss[0] && r.loss[1] == ref->loss[1],
                 "%s: losses %.9g %.9g after the faults, %.9g %.9g before", k_variant[variant],
                 r.loss[0], r.loss[1], ref->loss[0], ref->loss[1]);
  if (dt_test_rank() == 0)
    printf("test_alloc_faults_train: %s: %ld allocations, every %ld%s failed in turn (%ld runs "
           "returned an error); losses %.6f %.6f\n", k_variant[variant], total, stride,
           stride == 1 ? "" : "th", failed, ref->loss[0], ref->loss[1]);
  return total;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_TRUE(world == 1, "a single-rank test (allocation failures are rank-local)");
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/dt_alloc_faults_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  DT_ASSERT_TRUE(mkdtemp(g_dir) != NULL, "mkdtemp %s", g_dir);
  /* DT_FAULT_STRIDE=n fails every n-th allocation only (a quicker pass by hand) */
  const char* sv = getenv("DT_FAULT_STRIDE");
  long stride = sv && atol(sv) > 0 ? atol(sv) : 1;
  for (int v = 0; v < V_COUNT; v++) {
    result_t ref;
    DT_ASSERT_OK(scenario(v, &ref)); /* warm: plan and strategy caches, pools, workspace */
    DT_ASSERT_TRUE(isfinite(ref.loss[0]) && isfinite(ref.loss[1]) && ref.loss[1] != ref.loss[0],
                   "%s: losses %g %g", k_variant[v], ref.loss[0], ref.loss[1]);
    inject(v, &ref, stride);
  }
  rmdir(g_dir);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

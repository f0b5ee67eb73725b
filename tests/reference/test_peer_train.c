/* test_peer_train.c - loss parity with PyTorch 2.x: 20 AdamW steps of a small Llama-style decoder
 * replicated, under FSDP and under tensor parallelism (np 2).
 *
 * tests/reference/peer_train_fixture.json (tests/reference/make_peer_train_fixture.py, PyTorch
 * 2.11) holds 20 batches and PyTorch's per-step losses on one process, under FSDP2 (fully_shard
 * on each block and the root, the batch split over 2 ranks) and under parallelize_module
 * (Megatron-style colwise/rowwise, 2 ranks); the initial weights are train_fixture.json's. Ours
 * loads the same weights into dt_llama on the 1-D mesh of 2 and runs the same 20 steps (forward,
 * backward, clipping at 1.0, AdamW betas 0.9/0.95, weight decay 0.1 on matrices, constant lr)
 * three ways: every parameter replicated (against PyTorch's single process), dt_fully_shard on
 * each block then the root with the batch Shard(0) (against FSDP2), and dt_tp_plan_llama through
 * dt_parallelize_module (against PyTorch's TP). Every step's f32 loss must be within 1e-4
 * relative of PyTorch's.
 */
#include <math.h>
#include <string.h>

#include "dt_test_json.h"

static int g_rank;

static int cfg_int(const cJSON* c, const char* k) {
  return (int)cJSON_GetObjectItem(c, k)->valuedouble;
}

static void set_weights(const cJSON* base, dt_llama_t m, dt_mesh_t mesh) {
  dt_var_t* p;
  const char* const* names;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, &names, &np, NULL));
  const cJSON* jp = cJSON_GetObjectItem(base, "params");
  DT_ASSERT_EQ(cJSON_GetArraySize(jp), np);
  for (int i = 0; i < np; i++) {
    const cJSON* e = cJSON_GetObjectItem(jp, names[i]);
    DT_ASSERT_TRUE(e != NULL, "train_fixture.json lacks %s", names[i]);
    const cJSON *sh = cJSON_GetObjectItem(e, "shape"), *d = cJSON_GetObjectItem(e, "data");
    int nd = cJSON_GetArraySize(sh);
    int64_t shape[4], n = 1;
    for (int k = 0; k < nd; k++) n *= shape[k] = (int64_t)cJSON_GetArrayItem(sh, k)->valuedouble;
    float* buf = malloc(sizeof(float) * (size_t)n);
    for (int64_t k = 0; k < n; k++) buf[k] = (float)cJSON_GetArrayItem(d, (int)k)->valuedouble;
    dt_placement_t pl[4];
    DT_ASSERT_OK(dt_tensor_placements(dt_var_value(p[i]), pl));
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, nd, shape, pl, buf, &t));
    DT_ASSERT_OK(dt_var_set_value(p[i], t));
    free(buf);
  }
}

/* mode: "single" (replicated), "fsdp" or "tp"; compared with the fixture's losses of that name */
static void run(const cJSON* fx, const cJSON* base, dt_mesh_t mesh, const char* mode) {
  const cJSON* c = cJSON_GetObjectItem(fx, "config");
  dt_llama_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.dim = cfg_int(c, "dim");
  cfg.n_layers = cfg_int(c, "n_layers");
  cfg.n_heads = cfg_int(c, "n_heads");
  cfg.n_kv_heads = cfg_int(c, "n_kv_heads");
  cfg.vocab = cfg_int(c, "vocab");
  cfg.seq_len = cfg_int(c, "seq_len");
  cfg.ffn_dim = cfg_int(c, "ffn_dim");
  dt_llama_config_defaults(&cfg);
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(mesh, &cfg, NULL, &m));
  set_weights(base, m, mesh); /* replicated; the wrappers below place them */
  dt_module_t root;
  DT_ASSERT_OK(dt_llama_module(m, &root));
  int fsdp = !strcmp(mode, "fsdp");
  if (fsdp) { /* FSDP2's wrapping: each block, then the root */
    dt_fsdp_config_t fc = dt_fsdp_config_default(1);
    for (int l = 0; l < cfg.n_layers; l++) {
      char path[32];
      dt_module_t blk;
      snprintf(path, sizeof path, "layers.%d", l);
      DT_ASSERT_OK(dt_module_find(root, path, &blk));
      DT_ASSERT_OK(dt_fully_shard(blk, mesh, &fc));
    }
    DT_ASSERT_OK(dt_fully_shard(root, mesh, &fc));
  } else if (!strcmp(mode, "tp")) {
    dt_tp_plan_entry_t plan[16];
    int n;
    DT_ASSERT_OK(dt_tp_plan_llama(&cfg, 0, 0, plan, 16, &n));
    DT_ASSERT_OK(dt_parallelize_module(root, mesh, 0, n, plan));
  }
  dt_var_t* p;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, NULL, &np, NULL)); /* after wrapping: the sharded ones */
  double lr = cJSON_GetObjectItem(fx, "lr")->valuedouble;
  dt_adamw_config_t ac = {lr, 0.9, 0.95, 1e-8, 0.1, 0};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&ac, np, p, &opt));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  int B = cfg_int(fx, "batch"), S = cfg_int(fx, "seq");
  const cJSON* batches = cJSON_GetObjectItem(fx, "batches");
  const cJSON* want = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "loss"), mode);
  int steps = cfg_int(fx, "steps");
  DT_ASSERT_EQ(cJSON_GetArraySize(want), steps);
  dt_placement_t rep[1] = {dt_replicate()}, tok_pl[1] = {fsdp ? dt_shard(0) : dt_replicate()};
  double worst = 0.0;
  for (int s = 0; s < steps; s++) {
    const cJSON* b = cJSON_GetArrayItem(batches, s);
    int64_t tok[256], tgt[256], shape[2] = {B, S};
    DT_ASSERT_TRUE(B * S <= 256, "batch too large");
    for (int k = 0; k < B * S; k++) {
      tok[k] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(b, "tokens"), k)->valuedouble;
      tgt[k] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(b, "targets"), k)->valuedouble;
    }
    dt_tensor_t tt, gt, lr_t;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, tok_pl, tok, &tt));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, tok_pl, tgt, &gt));
    dt_var_t loss;
    DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
    float lv;
    DT_ASSERT_OK(dt_tensor_redistribute(dt_var_value(loss), rep, &lr_t));
    DT_ASSERT_OK(dt_tensor_gather_full(lr_t, &lv, sizeof lv));
    dt_tensor_destroy(lr_t);
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_tape_reset(tape));
    double gn;
    DT_ASSERT_OK(dt_clip_grad_norm(np, p, 1.0, &gn));
    double wl = cJSON_GetArrayItem(want, s)->valuedouble, rel = fabs(lv - wl) / fabs(wl);
    DT_ASSERT_TRUE(rel <= 1e-4, "%s step %d: loss %.8g vs PyTorch %.8g (relative %.3g)", mode, s,
                   lv, wl, rel);
    if (rel > worst) worst = rel;
    DT_ASSERT_OK(dt_adamw_step(opt, lr));
    for (int i = 0; i < np; i++) DT_ASSERT_OK(dt_var_zero_grad(p[i]));
    dt_tensor_destroy(tt);
    dt_tensor_destroy(gt);
  }
  if (g_rank == 0)
    printf("%-6s %d steps: loss %.6f .. %.6f, worst relative difference to PyTorch %.3g\n", mode,
           steps, cJSON_GetArrayItem(want, 0)->valuedouble,
           cJSON_GetArrayItem(want, steps - 1)->valuedouble, worst);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_TRUE(world == 2, "the PyTorch runs were on 2 ranks, not %d", world);
  cJSON* fx = dt_test_load_json(DT_PEER_TRAIN_FIXTURE);
  cJSON* base = dt_test_load_json(DT_TRAIN_FIXTURE);
  DT_ASSERT_EQ(cfg_int(fx, "world"), 2);
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  run(fx, base, mesh, "single");
  run(fx, base, mesh, "fsdp");
  run(fx, base, mesh, "tp");
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_rank == 0)
    printf("test_peer_train: replicated, FSDP and TP within 1e-4 of PyTorch %s\n",
           cJSON_GetObjectItem(fx, "torch")->valuestring);
  cJSON_Delete(base);
  cJSON_Delete(fx);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

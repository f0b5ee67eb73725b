/* test_train_reference.c - three training steps of a small Llama-style decoder against PyTorch
 * (np 2 and 4).
 *
 * tests/reference/train_fixture.json (from tests/reference/make_train_fixture.py) holds PyTorch's
 * initial weights, three batches, and per step the loss and the gradient norm before clipping.
 * The same weights are loaded into dt_llama on the 1-D mesh with every parameter replicated, with
 * the tensor-parallel plan, and (np 4) on a 2x2 mesh with the plan; each run does forward,
 * backward, clipping at 1.0 and AdamW (betas 0.9/0.95, weight decay 0.1 on matrices) like
 * PyTorch. Losses must match to rtol 2e-5 and gradient norms to rtol 1e-4 at every step (f32;
 * the later steps also check the optimizer update).
 */
#include <math.h>
#include <string.h>

#include "dt_test_json.h"

static const char* kTP =
    "*.wq=S(0);*.wk=S(0);*.wv=S(0);*.w1=S(0);*.w3=S(0);*.wo=S(1);*.w2=S(1);output=S(0);"
    "tok_emb=S(1)";

static int cfg_int(const cJSON* c, const char* k) {
  return (int)cJSON_GetObjectItem(c, k)->valuedouble;
}

static void run(const cJSON* fx, dt_mesh_t mesh, const char* plan, const char* label, int rank) {
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
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(mesh, &cfg, plan, &m));
  dt_var_t* p;
  const char* const* names;
  int np;
  DT_ASSERT_OK(dt_llama_params(m, &p, &names, &np, NULL));
  const cJSON* jp = cJSON_GetObjectItem(fx, "params");
  DT_ASSERT_EQ(cJSON_GetArraySize(jp), np);
  for (int i = 0; i < np; i++) {
    const cJSON* e = cJSON_GetObjectItem(jp, names[i]);
    DT_ASSERT_TRUE(e != NULL, "fixture lacks %s", names[i]);
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
  double lr = cJSON_GetObjectItem(fx, "lr")->valuedouble;
  dt_adamw_config_t ac = {lr, 0.9, 0.95, 1e-8, 0.1, 0};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&ac, np, p, &opt));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  int B = cfg_int(fx, "batch"), S = cfg_int(fx, "seq");
  const cJSON *batches = cJSON_GetObjectItem(fx, "batches"), *steps = cJSON_GetObjectItem(fx, "steps");
  dt_placement_t rep[4] = {dt_replicate(), dt_replicate(), dt_replicate(), dt_replicate()};
  for (int s = 0; s < cJSON_GetArraySize(steps); s++) {
    const cJSON* b = cJSON_GetArrayItem(batches, s);
    int64_t tok[256], tgt[256], shape[2] = {B, S};
    for (int k = 0; k < B * S; k++) {
      tok[k] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(b, "tokens"), k)->valuedouble;
      tgt[k] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(b, "targets"), k)->valuedouble;
    }
    dt_tensor_t tt, gt, lr_t;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, rep, tok, &tt));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, rep, tgt, &gt));
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
    const cJSON* ws = cJSON_GetArrayItem(steps, s);
    double wl = cJSON_GetObjectItem(ws, "loss")->valuedouble;
    double wg = cJSON_GetObjectItem(ws, "grad_norm")->valuedouble;
    DT_ASSERT_TRUE(fabs(lv - wl) <= 2e-5 * fabs(wl), "%s step %d: loss %.8g vs torch %.8g", label,
                   s, lv, wl);
    DT_ASSERT_TRUE(fabs(gn - wg) <= 1e-4 * fabs(wg), "%s step %d: grad norm %.8g vs torch %.8g",
                   label, s, gn, wg);
    if (rank == 0)
      printf("%-16s step %d: loss %.7f (torch %.7f) grad norm %.6f (torch %.6f)\n", label, s, lv,
             wl, gn, wg);
    DT_ASSERT_OK(dt_adamw_step(opt, lr));
    for (int i = 0; i < np; i++) DT_ASSERT_OK(dt_var_zero_grad(p[i]));
    dt_tensor_destroy(tt);
    dt_tensor_destroy(gt);
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank, world;
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_world_size(&world));
  cJSON* fx = dt_test_load_json(DT_TRAIN_FIXTURE);
  dt_mesh_t m1;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &m1));
  run(fx, m1, NULL, "replicated", rank);
  run(fx, m1, kTP, "tensor-parallel", rank);
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  if (world == 4) {
    int s22[2] = {2, 2};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, s22, NULL, NULL, &m2));
    run(fx, m2, kTP, "2x2 TP", rank);
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
  cJSON_Delete(fx);
  if (rank == 0) printf("test_train_reference: passed on %d ranks\n", world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

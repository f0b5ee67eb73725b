/* test_act_checkpoint.c - selective activation checkpointing (dt_tape_set_checkpoint with
 * dt_ckpt_policy_default) on a Llama step, np 1 and 2 (FSDP over the ranks at np 2):
 *  - the same loss and the same gradients, bit for bit, as the step without checkpointing;
 *  - it recomputes ops in the backward and holds fewer activation bytes after the forward;
 *  - the step's activation peak (dt_memory_stats) is lower: the backward drops every value it
 *    recomputed again once the lowest node that names it has run, so it holds one block's
 *    recomputed values at a time (before that fix the recomputed values piled up and the peak
 *    was the same as without checkpointing);
 *  - after the backward every value it recomputed is dropped again (the tape holds no more
 *    than after the forward).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

typedef struct {
  float loss;
  double* grads; /* every parameter's local gradient, concatenated */
  int64_t ngrads;
  int64_t act_after_fwd, act_peak, held_after_fwd, held_after_bwd, recomputed;
} run_t;

static void step(dt_mesh_t mesh, int world, int ckpt, run_t* r) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 64;
  c.n_layers = 3;
  c.n_heads = 4;
  c.vocab = 64;
  c.seq_len = 32;
  c.seed = 7;
  dt_llama_t model;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, "*=R", &model));
  dt_module_t root;
  DT_ASSERT_OK(dt_llama_module(model, &root));
  if (world > 1) {
    dt_fsdp_config_t fc = dt_fsdp_config_default(1);
    DT_ASSERT_OK(dt_fully_shard(root, mesh, &fc));
  }
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  if (ckpt) DT_ASSERT_OK(dt_tape_set_checkpoint(tape, dt_ckpt_policy_default, NULL));
  const int64_t bs[2] = {4, 32};
  int64_t tok[128], tgt[128];
  for (int i = 0; i < 128; i++) tok[i] = (i * 7 + 3) % 64, tgt[i] = (i * 5 + 1) % 64;
  dt_placement_t pl = world > 1 ? dt_shard(0) : dt_replicate();
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, bs, &pl, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, bs, &pl, tgt, &gt));
  DT_ASSERT_OK(dt_memory_reset_peak());
  dt_var_t loss;
  DT_ASSERT_OK(dt_llama_forward(model, tape, tt, gt, &loss, NULL));
  dt_memory_stats_t ms;
  DT_ASSERT_OK(dt_memory_stats(&ms));
  r->act_after_fwd = ms.current[DT_MEM_ACTIVATIONS];
  DT_ASSERT_OK(dt_tape_stats(tape, NULL, &r->held_after_fwd));
  dt_placement_t rep = dt_replicate();
  dt_tensor_t lr;
  DT_ASSERT_OK(dt_tensor_redistribute(dt_var_value(loss), &rep, &lr));
  DT_ASSERT_OK(dt_tensor_gather_full(lr, &r->loss, sizeof r->loss));
  DT_ASSERT_OK(dt_tensor_destroy(lr));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tape_stats(tape, NULL, &r->held_after_bwd));
  int64_t saved = 0;
  DT_ASSERT_OK(dt_tape_checkpoint_stats(tape, &saved, &r->recomputed));
  DT_ASSERT_OK(dt_memory_stats(&ms));
  r->act_peak = ms.peak[DT_MEM_ACTIVATIONS];
  DT_ASSERT_OK(dt_tape_reset(tape));
  dt_var_t* params;
  int np;
  DT_ASSERT_OK(dt_llama_params(model, &params, NULL, &np, NULL));
  r->ngrads = 0;
  r->grads = NULL;
  for (int p = 0; p < np; p++) {
    dt_tensor_t g = dt_var_grad(params[p]);
    DT_ASSERT_TRUE(g != NULL, "parameter %d has no gradient", p);
    int64_t n;
    DT_ASSERT_OK(dt_tensor_local_numel(g, &n));
    float* buf = malloc(sizeof(float) * (size_t)(n ? n : 1));
    r->grads = realloc(r->grads, sizeof(double) * (size_t)(r->ngrads + n + 1));
    DT_ASSERT_TRUE(buf != NULL && r->grads != NULL, "no memory");
    DT_ASSERT_OK(dt_tensor_read_local(g, 0, n, buf));
    for (int64_t i = 0; i < n; i++) r->grads[r->ngrads + i] = buf[i];
    r->ngrads += n;
    free(buf);
  }
  DT_ASSERT_OK(dt_tensor_destroy(tt));
  DT_ASSERT_OK(dt_tensor_destroy(gt));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_llama_destroy(model));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank, world;
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_world_size(&world));
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  run_t plain, ck;
  step(mesh, world, 0, &plain);
  step(mesh, world, 1, &ck);
  DT_ASSERT_TRUE(plain.loss == ck.loss, "loss %.9g with checkpointing, %.9g without", ck.loss,
                 plain.loss);
  DT_ASSERT_TRUE(plain.ngrads == ck.ngrads && plain.ngrads > 0, "%lld and %lld gradient values",
                 (long long)plain.ngrads, (long long)ck.ngrads);
  for (int64_t i = 0; i < plain.ngrads; i++)
    DT_ASSERT_TRUE(plain.grads[i] == ck.grads[i], "gradient value %lld: %.9g vs %.9g",
                   (long long)i, plain.grads[i], ck.grads[i]);
  DT_ASSERT_TRUE(plain.recomputed == 0 && ck.recomputed > 0, "recomputed %lld and %lld ops",
                 (long long)plain.recomputed, (long long)ck.recomputed);
  DT_ASSERT_TRUE(ck.act_after_fwd < plain.act_after_fwd,
                 "activations after the forward: %lld with checkpointing, %lld without",
                 (long long)ck.act_after_fwd, (long long)plain.act_after_fwd);
  DT_ASSERT_TRUE(ck.act_peak < plain.act_peak,
                 "activation peak %lld with checkpointing, %lld without: the backward keeps what "
                 "it recomputed", (long long)ck.act_peak, (long long)plain.act_peak);
  DT_ASSERT_TRUE(ck.held_after_bwd <= ck.held_after_fwd,
                 "the tape holds %lld bytes after the backward, %lld after the forward",
                 (long long)ck.held_after_bwd, (long long)ck.held_after_fwd);
  if (rank == 0)
    printf("test_act_checkpoint: ok (activation peak %lld -> %lld bytes, %lld ops recomputed)\n",
           (long long)plain.act_peak, (long long)ck.act_peak, (long long)ck.recomputed);
  free(plain.grads);
  free(ck.grads);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* test_llama_cp.c - the edges of dt_llama_set_context_parallel (np 1, 2, 4), beside the trainer's
 * parity runs (tests/parallel/parallel_parity.sh) that cover context parallelism at work:
 *  - a cp dim of one rank is the same as no context parallelism: the forward takes tokens placed
 *    Shard(1) there and gives the loss of the model without it (np 1, and a (world, 1) mesh);
 *  - tokens or targets on a mesh other than the model's (even one of the same shape) are refused
 *    with a message naming which, not read dim by dim against the model's mesh;
 *  - a cp dim out of range and a seq_len that does not split into 2 n chunks are refused.
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

enum { VOCAB = 32, DIM = 16, SEQ = 8, BATCH = 4 };
static int g_world;

static dt_llama_config_t config(void) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = DIM;
  c.n_layers = 1;
  c.n_heads = 2;
  c.vocab = VOCAB;
  c.seq_len = SEQ;
  c.ffn_dim = 32;
  c.seed = 3;
  return c;
}

/* The loss of one forward of a fixed batch, tokens placed `pl` on `tok_mesh`. */
static dt_status_t loss_of(dt_llama_t model, dt_mesh_t tok_mesh, const dt_placement_t* pl,
                           float* out) {
  int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
  for (int i = 0; i < BATCH * SEQ; i++) {
    tok[i] = (i * 7 + 3) % VOCAB;
    tgt[i] = (i * 5 + 1) % VOCAB;
  }
  const int64_t shape[2] = {BATCH, SEQ};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(tok_mesh, DT_I64, 2, shape, pl, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(tok_mesh, DT_I64, 2, shape, pl, tgt, &gt));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t loss = NULL;
  dt_status_t st = dt_llama_forward(model, tape, tt, gt, &loss, NULL);
  if (st == DT_SUCCESS) DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(loss), out, sizeof *out));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_tensor_destroy(tt));
  DT_ASSERT_OK(dt_tensor_destroy(gt));
  return st;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  const dt_llama_config_t c = config();

  /* the reference: the whole batch replicated, no context parallelism */
  dt_mesh_t world;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &world));
  dt_llama_t ref;
  DT_ASSERT_OK(dt_llama_create(world, &c, NULL, &ref));
  const dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  float want = 0.0f;
  DT_ASSERT_OK(loss_of(ref, world, rep, &want));

  /* a cp dim of one rank: (world, 1), the batch over dim 0 when it splits */
  const int shape[2] = {g_world, 1};
  const char* names[2] = {"dp", "cp"};
  dt_mesh_t m2;
  DT_ASSERT_OK(dt_mesh_create(2, shape, names, NULL, &m2));
  dt_llama_t model;
  DT_ASSERT_OK(dt_llama_create(m2, &c, NULL, &model));
  DT_ASSERT_OK(dt_llama_set_context_parallel(model, 1));
  const dt_placement_t cp_pl[2] = {BATCH % g_world == 0 ? dt_shard(0) : dt_replicate(),
                                   dt_shard(1)};
  float got = 0.0f;
  dt_status_t st = loss_of(model, m2, cp_pl, &got);
  DT_ASSERT_TRUE(st == DT_SUCCESS, "a cp dim of one rank: %s: %s", dt_status_name(st),
                 dt_last_error());
  DT_ASSERT_TRUE(fabsf(got - want) <= 1e-5f * fabsf(want), "a cp dim of one rank: loss %.7f, "
                 "without context parallelism %.7f", (double)got, (double)want);

  /* refusals of the setting */
  DT_ASSERT_STATUS(dt_llama_set_context_parallel(model, 2), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_llama_set_context_parallel(model, -2), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_llama_destroy(model));

  if (g_world >= 2) {
    /* a real cp dim over the world: tokens on another mesh, of the same shape or not */
    dt_llama_t cpm;
    DT_ASSERT_OK(dt_llama_create(world, &c, NULL, &cpm));
    DT_ASSERT_OK(dt_llama_set_context_parallel(cpm, 0));
    dt_mesh_t other;
    DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &other));
    const dt_placement_t s1[2] = {dt_shard(1), dt_shard(1)};
    st = loss_of(cpm, other, s1, &got);
    DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "model's mesh") != NULL,
                   "tokens on another mesh: %s: %s", dt_status_name(st), dt_last_error());
    st = loss_of(cpm, m2, cp_pl, &got); /* 2-D tokens for a 1-D model */
    DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "model's mesh") != NULL,
                   "tokens on a 2-D mesh: %s: %s", dt_status_name(st), dt_last_error());
    DT_ASSERT_OK(dt_mesh_destroy(other));
    DT_ASSERT_OK(dt_llama_destroy(cpm));
    /* a seq_len of 2 n + 2 does not split into 2 n chunks */
    dt_llama_config_t odd = c;
    odd.seq_len = 2 * g_world + 2;
    DT_ASSERT_OK(dt_llama_create(world, &odd, NULL, &cpm));
    DT_ASSERT_STATUS(dt_llama_set_context_parallel(cpm, 0), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "must be a multiple of") != NULL, "message: %s",
                   dt_last_error());
    DT_ASSERT_OK(dt_llama_destroy(cpm));
  }
  DT_ASSERT_OK(dt_llama_destroy(ref));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_mesh_destroy(world));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

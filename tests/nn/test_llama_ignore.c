/* test_llama_ignore.c - dt_llama_config_t.ignore_targets (np 1 and 2): targets of -100 count
 * nowhere in the loss. A batch of two sequences whose second has every target -100, sharded on
 * the batch dim (at np 2 each rank holds one sequence, and the mean's count is the global one),
 * gives the loss and the gradients of the first sequence alone (replicated, a model without
 * ignore_targets built from the same seed): per-token losses do not depend on other tokens'
 * targets. Without ignore_targets a target of -100 is DT_ERR_INVALID_ARG naming ignore_index; an
 * ignore_targets other than 0 or 1 is refused by the config check. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

enum { S = 8, V = 16 };

static dt_llama_config_t cfg(int ignore) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 32;
  c.n_layers = 1;
  c.n_heads = 4;
  c.vocab = V;
  c.seq_len = S;
  c.seed = 21;
  c.ignore_targets = ignore;
  return c;
}

/* The loss and every parameter's gradient (gathered, concatenated) of one forward/backward. */
static double run(dt_mesh_t mesh, int ignore, int B, const int64_t* tok, const int64_t* tgt,
                  int sharded, float** grads, int64_t* n_grad) {
  dt_llama_config_t c = cfg(ignore);
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &m));
  dt_placement_t pl = sharded ? dt_shard(0) : dt_replicate();
  const int64_t shape[2] = {B, S};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &pl, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &pl, tgt, &gt));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t loss;
  DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
  double lv = NAN;
  DT_ASSERT_OK(dt_tensor_item(dt_var_value(loss), &lv));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  dt_var_t* ps;
  int np;
  int64_t total;
  DT_ASSERT_OK(dt_llama_params(m, &ps, NULL, &np, &total));
  *grads = malloc(sizeof(float) * (size_t)total);
  DT_ASSERT_TRUE(*grads != NULL, "malloc");
  int64_t at = 0;
  for (int i = 0; i < np; i++) {
    int nd;
    int64_t sh[8], k = 1;
    DT_ASSERT_OK(dt_tensor_ndim(dt_var_value(ps[i]), &nd));
    DT_ASSERT_OK(dt_tensor_shape(dt_var_value(ps[i]), sh));
    for (int d = 0; d < nd; d++) k *= sh[d];
    DT_ASSERT_TRUE(dt_var_grad(ps[i]) != NULL, "parameter %d has no gradient", i);
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(ps[i]), *grads + at, sizeof(float) * (size_t)k));
    at += k;
  }
  *n_grad = at;
  DT_ASSERT_OK(dt_tape_destroy(tape));
  dt_tensor_destroy(tt);
  dt_tensor_destroy(gt);
  DT_ASSERT_OK(dt_llama_destroy(m));
  return lv;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_TRUE(world == 1 || world == 2, "run at np 1 or 2");
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  int64_t tok[2 * S], tgt[2 * S];
  for (int i = 0; i < 2 * S; i++) {
    tok[i] = (i * 5 + 3) % V;
    tgt[i] = i < S ? (i * 7 + 1) % V : -100; /* the second sequence: every target ignored */
  }
  float *g_ref, *g_ign;
  int64_t n_ref, n_ign;
  const double ref = run(mesh, 0, 1, tok, tgt, 0, &g_ref, &n_ref);
  const double ign = run(mesh, 1, 2, tok, tgt, 1, &g_ign, &n_ign);
  DT_ASSERT_TRUE(isfinite(ref) && fabs(ign - ref) <= 1e-6 * fabs(ref), "loss %.9g with the "
                 "second sequence ignored, %.9g for the first alone", ign, ref);
  DT_ASSERT_EQ(n_ref, n_ign);
  double num = 0.0, den = 0.0; /* the GEMMs sum the batches in another order: a norm */
  for (int64_t i = 0; i < n_ref; i++) {
    const double d = (double)g_ign[i] - (double)g_ref[i];
    num += d * d;
    den += (double)g_ref[i] * g_ref[i];
  }
  const double worst = sqrt(num / den);
  DT_ASSERT_TRUE(den > 0 && worst <= 1e-5, "gradients differ by %g (relative norm)", worst);
  free(g_ref);
  free(g_ign);
  /* without ignore_targets a -100 is refused, naming how to skip it */
  {
    dt_llama_config_t c = cfg(0);
    dt_llama_t m;
    DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &m));
    dt_placement_t pl = dt_shard(0);
    const int64_t shape[2] = {2, S};
    dt_tensor_t tt, gt;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &pl, tok, &tt));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &pl, tgt, &gt));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    dt_var_t loss;
    DT_ASSERT_STATUS(dt_llama_forward(m, tape, tt, gt, &loss, NULL), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "ignore_index") != NULL, "message: %s",
                   dt_last_error());
    DT_ASSERT_OK(dt_tape_destroy(tape));
    dt_tensor_destroy(tt);
    dt_tensor_destroy(gt);
    DT_ASSERT_OK(dt_llama_destroy(m));
    c.ignore_targets = 2;
    DT_ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
  }
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  if (rank == 0)
    printf("test_llama_ignore np=%d: loss %.6f both ways, gradients within %.2g\n", world, ref,
           worst);
  return 0;
}

/* test_validation.c - values the library used to accept and then crash on or compute garbage
 * from, each now refused with a clear error and nothing changed (np 2).
 *
 * reshape/view/unflatten sizes whose product overflows 64 bits (they wrapped to a "valid" numel),
 * the default checkpoint policy given a NULL op name (it segfaulted), a negative n_keep, a NaN or
 * infinite learning rate, clipping with n < 0 or a NaN max_norm, a parameter with an unknown init
 * or a NaN/infinite/negative std; and a rank outside a mesh holds local numel 0 for a 0-dim
 * tensor too (it reported 1).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

#define EXPECT_MSG(call, want, text)                                                        \
  do {                                                                                      \
    DT_ASSERT_STATUS(call, want);                                                           \
    DT_ASSERT_TRUE(strstr(dt_last_error(), text) != NULL, "message '%s' lacks '%s'",        \
                   dt_last_error(), text);                                                  \
  } while (0)

static void shapes(dt_mesh_t m) {
  int64_t shape[2] = {4, 6};
  dt_placement_t r = dt_replicate();
  dt_tensor_t x, y = NULL;
  DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 2, shape, &r, 0.0, 1.0, &x));
  /* 2^32 * 2^32 wraps to 0 in 64 bits; 2^62 * 4 to 0 too; with -1 the product of the rest */
  const int64_t big = (int64_t)1 << 32;
  int64_t wrap[3] = {big, big, 24};
  EXPECT_MSG(dt_reshape(x, 3, wrap, &y), DT_ERR_INVALID_ARG, "overflow");
  DT_ASSERT_TRUE(y == NULL, "no output");
  int64_t wrap2[3] = {(int64_t)1 << 62, 4, -1};
  EXPECT_MSG(dt_reshape(x, 3, wrap2, &y), DT_ERR_INVALID_ARG, "overflow");
  int64_t sizes[4] = {0, big, big, 4}; /* unflatten dim 0 into 2^32 x 2^32 x 4 */
  EXPECT_MSG(dt_op_run("unflatten", 1, &x, 4, sizes, 0, NULL, &y), DT_ERR_INVALID_ARG,
             "overflow");
  int64_t ok[2] = {6, -1};
  DT_ASSERT_OK(dt_reshape(x, 2, ok, &y));
  int64_t got[2];
  DT_ASSERT_OK(dt_tensor_shape(y, got));
  DT_ASSERT_EQ(got[1], 4);
  dt_tensor_destroy(y);
  dt_tensor_destroy(x);
}

static void autograd_and_optim(dt_mesh_t m) {
  DT_ASSERT_EQ(dt_ckpt_policy_default(NULL, NULL), 1); /* saves: nothing to recompute by */
  DT_ASSERT_EQ(dt_ckpt_policy_default("mm", NULL), 1);
  DT_ASSERT_EQ(dt_ckpt_policy_default("relu", NULL), 0);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_tape_set_checkpoint(tape, dt_ckpt_policy_default, NULL));
  EXPECT_MSG(dt_tape_checkpoint(tape, -1, NULL), DT_ERR_INVALID_ARG, "n_keep");
  dt_var_t dead = (dt_var_t)(void*)&tape; /* not a variable */
  DT_ASSERT_STATUS(dt_tape_checkpoint(tape, 1, &dead), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tape_checkpoint(tape, 0, NULL));

  int64_t shape[2] = {4, 4};
  dt_var_t w;
  DT_ASSERT_OK(dt_nn_param(m, NULL, "w", 2, shape, DT_INIT_NORMAL, 0.02, 1, &w));
  dt_var_t bad = NULL;
  EXPECT_MSG(dt_nn_param(m, NULL, "v", 2, shape, (dt_nn_init_t)7, 0.02, 1, &bad),
             DT_ERR_INVALID_ARG, "init");
  EXPECT_MSG(dt_nn_param(m, NULL, "v", 2, shape, DT_INIT_NORMAL, NAN, 1, &bad), DT_ERR_INVALID_ARG,
             "std");
  DT_ASSERT_STATUS(dt_nn_param(m, NULL, "v", 2, shape, DT_INIT_NORMAL, INFINITY, 1, &bad),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_nn_param(m, NULL, "v", 2, shape, DT_INIT_NORMAL, -1.0, 1, &bad),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(bad == NULL, "no parameter");

  /* a gradient, then refused steps leave the parameter as it was */
  dt_var_t y, loss;
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, (dt_var_t[]){w, w}, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, (int64_t[]){0}, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  float before[16], after[16];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w), before, sizeof before));
  dt_adamw_config_t cfg = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&cfg, 1, &w, &opt));
  EXPECT_MSG(dt_adamw_step(opt, NAN), DT_ERR_INVALID_ARG, "learning rate");
  DT_ASSERT_STATUS(dt_adamw_step(opt, INFINITY), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_adamw_step(opt, -1e-3), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w), after, sizeof after));
  DT_ASSERT_TRUE(memcmp(before, after, sizeof before) == 0, "a refused step changed the weights");
  double norm = -1;
  EXPECT_MSG(dt_clip_grad_norm(-1, &w, 1.0, &norm), DT_ERR_INVALID_ARG, "n = -1");
  DT_ASSERT_STATUS(dt_clip_grad_norm(1, &w, NAN, &norm), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_clip_grad_norm(1, &w, 1e9, &norm));
  DT_ASSERT_TRUE(norm > 0 && isfinite(norm), "norm %g", norm);
  DT_ASSERT_OK(dt_adamw_step(opt, 1e-3));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(w));
}

/* A mesh of world rank 0 only: the other ranks are outside it. */
static void outside(void) {
  int rank;
  DT_ASSERT_OK(dt_world_rank(&rank));
  int one[1] = {1}, ranks[1] = {0};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, one, NULL, ranks, &m));
  dt_placement_t r = dt_replicate();
  dt_tensor_t s, v;
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 0, NULL, &r, &s));
  int64_t four[1] = {4};
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 1, four, &r, &v));
  int64_t n0 = -1, n1 = -1;
  DT_ASSERT_OK(dt_tensor_local_numel(s, &n0));
  DT_ASSERT_OK(dt_tensor_local_numel(v, &n1));
  DT_ASSERT_EQ(n0, rank == 0 ? 1 : 0);
  DT_ASSERT_EQ(n1, rank == 0 ? 4 : 0);
  dt_tensor_destroy(s);
  dt_tensor_destroy(v);
  dt_mesh_destroy(m);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  shapes(m);
  autograd_and_optim(m);
  outside();
  DT_ASSERT_OK(dt_mesh_destroy(m));
  int rank = dt_test_rank();
  DT_ASSERT_OK(dt_finalize());
  if (rank == 0) printf("test_validation: ok\n");
  return 0;
}

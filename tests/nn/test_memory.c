/* test_memory.c - dt_memory_stats: bytes per category follow what a training step holds (np 2, 4).
 *
 * Two parameters (a Shard(0) weight with an uneven dim 0, empty on the last rank at np 4, and a
 * replicated bias) count exactly their local bytes as parameters; a recorded forward holds activations that dt_tape_reset gives
 * back; after backward the gradients equal the parameters' bytes (intermediate gradients are
 * gone); AdamW's state is two moments per parameter plus an 8-byte step each; peaks are at least
 * what was seen and restart at the current values; destroying everything returns every category
 * to where it started; the totals are the sums.
 */
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

static int64_t local_bytes(dt_var_t v) {
  int64_t n;
  DT_ASSERT_OK(dt_tensor_local_numel(dt_var_value(v), &n));
  return n > 0 ? n * 4 : 1; /* an empty shard still takes a 1-byte block */
}

static void stats(dt_memory_stats_t* s) {
  DT_ASSERT_OK(dt_memory_stats(s));
  int64_t sum = 0;
  for (int c = 0; c < DT_MEM_COUNT; c++) {
    DT_ASSERT_TRUE(s->current[c] >= 0 && s->peak[c] >= s->current[c], "%s: current %lld peak %lld",
                   dt_mem_category_name((dt_mem_category_t)c), (long long)s->current[c],
                   (long long)s->peak[c]);
    sum += s->current[c];
  }
  DT_ASSERT_EQ(s->total_current, sum);
  DT_ASSERT_TRUE(s->total_peak >= s->total_current, "total peak below current");
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  dt_memory_stats_t s0, s;
  stats(&s0);

  int64_t wshape[2] = {2 * world + 1, 4}, bshape[1] = {4};
  dt_var_t w, b;
  DT_ASSERT_OK(dt_nn_param(m, "w=S(0)", "w", 2, wshape, DT_INIT_NORMAL, 0.1, 1, &w));
  DT_ASSERT_OK(dt_nn_param(m, NULL, "b", 1, bshape, DT_INIT_ZEROS, 0.0, 1, &b));
  int64_t pbytes = local_bytes(w) + local_bytes(b);
  stats(&s);
  DT_ASSERT_EQ(s.current[DT_MEM_PARAMETERS] - s0.current[DT_MEM_PARAMETERS], pbytes);

  /* a recorded forward: x (6, 2n+1) R, y = relu(x @ w + b), loss = sum(y) */
  dt_placement_t r = dt_replicate();
  int64_t xshape[2] = {6, wshape[0]};
  dt_tensor_t xv;
  DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 2, xshape, &r, -1.0, 0.05, &xv));
  dt_var_t x;
  DT_ASSERT_OK(dt_var_leaf(xv, 0, &x));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_memory_reset_peak());
  dt_var_t h, y, loss;
  DT_ASSERT_OK(dt_ag_op(tape, "mm", 2, (dt_var_t[]){x, w}, 0, NULL, 0, NULL, 1, &h));
  DT_ASSERT_OK(dt_ag_op(tape, "add", 2, (dt_var_t[]){h, b}, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_OK(dt_ag_op(tape, "relu", 1, &y, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, (int64_t[]){0}, 0, NULL, 1, &loss));
  stats(&s);
  int64_t act = s.current[DT_MEM_ACTIVATIONS] - s0.current[DT_MEM_ACTIVATIONS];
  int64_t tape_nbytes;
  DT_ASSERT_OK(dt_tape_stats(tape, NULL, &tape_nbytes));
  DT_ASSERT_TRUE(act > 0, "no activations counted after a recorded forward");
  DT_ASSERT_TRUE(act >= tape_nbytes, "activations %lld below the tape's %lld bytes", (long long)act,
                 (long long)tape_nbytes);
  DT_ASSERT_TRUE(s.peak[DT_MEM_ACTIVATIONS] >= s.current[DT_MEM_ACTIVATIONS], "peak");

  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  stats(&s);
  DT_ASSERT_EQ(s.current[DT_MEM_GRADIENTS] - s0.current[DT_MEM_GRADIENTS], pbytes);
  DT_ASSERT_TRUE(s.peak[DT_MEM_GRADIENTS] >= s.current[DT_MEM_GRADIENTS], "gradient peak");

  dt_adamw_config_t cfg = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&cfg, 2, (dt_var_t[]){w, b}, &opt));
  DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
  stats(&s);
  DT_ASSERT_EQ(s.current[DT_MEM_OPTIMIZER] - s0.current[DT_MEM_OPTIMIZER], 2 * pbytes + 2 * 8);

  DT_ASSERT_OK(dt_tape_reset(tape));
  stats(&s);
  DT_ASSERT_EQ(s.current[DT_MEM_ACTIVATIONS], s0.current[DT_MEM_ACTIVATIONS]);
  DT_ASSERT_TRUE(s.peak[DT_MEM_ACTIVATIONS] - s0.current[DT_MEM_ACTIVATIONS] >= act,
                 "the activation peak forgot the forward");
  DT_ASSERT_OK(dt_memory_reset_peak());
  stats(&s);
  for (int c = 0; c < DT_MEM_COUNT; c++) DT_ASSERT_EQ(s.peak[c], s.current[c]);
  DT_ASSERT_EQ(s.total_peak, s.total_current);

  /* a caller's tag; bad categories refused */
  dt_tensor_t extra;
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 1, bshape, &r, &extra));
  DT_ASSERT_OK(dt_tensor_set_memory_category(extra, DT_MEM_COMMUNICATION));
  DT_ASSERT_STATUS(dt_tensor_set_memory_category(extra, DT_MEM_COUNT), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_tensor_set_memory_category(extra, (dt_mem_category_t)-1), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strcmp(dt_mem_category_name(DT_MEM_OPTIMIZER), "optimizer") == 0, "name");
  DT_ASSERT_TRUE(strcmp(dt_mem_category_name(DT_MEM_COUNT), "invalid") == 0, "invalid name");
  DT_ASSERT_STATUS(dt_memory_stats(NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_destroy(extra));

  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(w));
  DT_ASSERT_OK(dt_var_destroy(b));
  stats(&s);
  for (int c = 0; c < DT_MEM_COUNT; c++)
    if (c != DT_MEM_COMMUNICATION) /* the persistent workspace stays until dt_finalize */
      DT_ASSERT_TRUE(s.current[c] == s0.current[c], "%s: %lld bytes left, %lld at the start",
                     dt_mem_category_name((dt_mem_category_t)c), (long long)s.current[c],
                     (long long)s0.current[c]);
  DT_ASSERT_OK(dt_mesh_destroy(m));
  int rank = dt_test_rank();
  DT_ASSERT_OK(dt_finalize());
  if (rank == 0) printf("test_memory: ok\n");
  return 0;
}

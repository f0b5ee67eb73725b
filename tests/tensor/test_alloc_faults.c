/* test_alloc_faults.c - fault injection: every allocation the library makes may fail.
 *
 * Linked with -Wl,--wrap=malloc,... (dt_fault_inject.h; only dtensor's code and this
 * program are wrapped; Open MPI's own allocations are not). A scenario of public calls (mesh,
 * tensors, redistributions, ops, a recorded forward and backward pass with ring attention in it
 * (f32, then bf16),
 * AdamW, clipping, asynchronous work) is run once to count its allocations, then once per allocation k with the
 * k-th one failing: every run must end without a crash, each failing call must return a status
 * with a message (DT_ERR_OUT_OF_MEMORY for the failed allocation itself), and everything the
 * scenario made is destroyed afterwards, so ASan's leak check and valgrind see no leak. A last
 * clean run must then give the same numbers as the first: a failure leaves no damaged state.
 * One rank: an allocation failure is rank-local and is not agreed between ranks (the deadline
 * covers that case).
 */
#include <math.h>
#include <string.h>

#include "dt_fault_inject.h"
#include "dt_test.h"
#include "dtensor/nn.h"

/* Runs the scenario; returns the status of the first failing call (DT_SUCCESS when none failed)
 * and the loss it computed. Destroys everything it made on every path. */
static dt_status_t scenario(dt_mesh_t m, double* loss_out) {
  dt_status_t st = DT_SUCCESS;
  dt_tensor_t x = NULL, y = NULL, z = NULL, out = NULL;
  dt_var_t w = NULL, in = NULL, h = NULL, loss = NULL;
  dt_tape_t tape = NULL;
  dt_adamw_t opt = NULL;
  dt_work_t work = NULL;
  int64_t shape[2] = {6, 4};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  *loss_out = NAN;
#define TRY(call) DT_FAULT_TRY(call)
  TRY(dt_tensor_arange(m, DT_F32, 2, shape, &s0, 0.0, 0.5, &x));
  TRY(dt_tensor_redistribute(x, &r, &y));
  TRY(dt_tensor_redistribute_async(y, &s0, &z, &work));
  TRY(dt_work_wait(work));
  TRY(dt_add(x, z, &out));
  TRY(dt_tape_create(&tape));
  {
    dt_tensor_t wv = NULL, iv = NULL;
    int64_t ws[2] = {4, 4};
    TRY(dt_tensor_randn(m, DT_F32, 2, ws, &r, 7, &wv));
    st = dt_var_leaf(wv, 1, &w);
    if (st != DT_SUCCESS) {
      dt_tensor_destroy(wv);
      goto done;
    }
    TRY(dt_tensor_arange(m, DT_F32, 2, shape, &s0, 0.0, 0.1, &iv));
    st = dt_var_leaf(iv, 0, &in);
    if (st != DT_SUCCESS) {
      dt_tensor_destroy(iv);
      goto done;
    }
  }
  TRY(dt_ag_op(tape, "mm", 2, (dt_var_t[]){in, w}, 0, NULL, 0, NULL, 1, &h));
  TRY(dt_ag_op(tape, "relu", 1, &h, 0, NULL, 0, NULL, 1, &h));
  /* ring attention (a composite with its own scratch and a saved by-product) */
  TRY(dt_ag_op(tape, "reshape", 1, &h, 4, (int64_t[]){1, 1, 6, 4}, 0, NULL, 1, &h));
  TRY(dt_ag_op(tape, "ring_attention", 3, (dt_var_t[]){h, h, h}, 2, (int64_t[]){0, 1}, 0, NULL, 1,
               &h));
  /* again in bf16: k and v's shards in their dtype, converted to f32 in the ring's scratch */
  TRY(dt_ag_op(tape, "cast", 1, &h, 1, (int64_t[]){DT_BF16}, 0, NULL, 1, &h));
  TRY(dt_ag_op(tape, "ring_attention", 3, (dt_var_t[]){h, h, h}, 2, (int64_t[]){0, 1}, 0, NULL, 1,
               &h));
  TRY(dt_ag_op(tape, "cast", 1, &h, 1, (int64_t[]){DT_F32}, 0, NULL, 1, &h));
  TRY(dt_ag_op(tape, "sum", 1, &h, 1, (int64_t[]){0}, 0, NULL, 1, &loss));
  TRY(dt_tape_backward(tape, loss));
  {
    float lv;
    TRY(dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv));
    *loss_out = lv;
  }
  double norm;
  TRY(dt_clip_grad_norm(1, &w, 1.0, &norm));
  dt_adamw_config_t cfg = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
  TRY(dt_adamw_create(&cfg, 1, &w, &opt));
  TRY(dt_adamw_step(opt, 0.01));
done:
  dt_adamw_destroy(opt);
  dt_tape_destroy(tape);
  dt_var_destroy(w);
  dt_var_destroy(in);
  dt_work_destroy(work);
  dt_tensor_destroy(x);
  dt_tensor_destroy(y);
  dt_tensor_destroy(z);
  dt_tensor_destroy(out);
  return st;
#undef TRY
}

/* The scenario on a new mesh: cold plan and strategy caches (keyed by the mesh), the mesh's
 * communicators and asynchronous slots made on the way. */
static dt_status_t cold_scenario(double* loss) {
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t m = NULL;
  dt_status_t st = dt_mesh_create(1, shape, NULL, NULL, &m);
  if (st == DT_SUCCESS) st = scenario(m, loss);
  dt_mesh_destroy(m);
  return st;
}

/* Fails each allocation of fn's run in turn; returns the number of allocations. */
static long inject(dt_status_t (*fn)(void*, double*), void* arg, double ref) {
  long before = g_count;
  double l;
  DT_ASSERT_OK(fn(arg, &l));
  long total = g_count - before;
  DT_ASSERT_TRUE(total > 10, "only %ld allocations counted: wrapping not in effect?", total);
  for (long k = 1; k <= total; k++) {
    g_count = 0;
    g_fail_at = k;
    dt_clear_error();
    dt_status_t st = fn(arg, &l);
    g_fail_at = -1;
    if (st == DT_SUCCESS)
      DT_ASSERT_TRUE(l == ref, "allocation %ld failed, the run succeeded with loss %g, not %g", k,
                     l, ref);
  }
  g_count = 0;
  DT_ASSERT_OK(fn(arg, &l));
  DT_ASSERT_TRUE(l == ref, "loss %g after the faults, %g before", l, ref);
  return total;
}

static dt_status_t warm(void* m, double* loss) { return scenario((dt_mesh_t)m, loss); }
static dt_status_t cold(void* unused, double* loss) {
  (void)unused;
  return cold_scenario(loss);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  double ref;
  DT_ASSERT_OK(scenario(m, &ref)); /* warm caches, workspace, communicators */
  long nwarm = inject(warm, m, ref);
  long ncold = inject(cold, NULL, ref);
  if (dt_test_rank() == 0)
    printf("test_alloc_faults: each of %ld allocations (warm) and %ld (new mesh) failed in turn; "
           "loss %g\n", nwarm, ncold, ref);
  DT_ASSERT_OK(dt_mesh_destroy(m));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

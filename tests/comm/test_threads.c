/* test_threads.c - the library called from a thread other than the one that called dt_init, one
 * call at a time (np 2 and 4). dt_init asks MPI for MPI_THREAD_SERIALIZED, so a trainer may run
 * its loop on a worker thread: here a worker redistributes, reduces and trains two steps of a
 * small Llama under FSDP while the main thread waits, then the main thread carries on with the
 * same objects. Each thread keeps its own last-error message: a call that fails on the worker
 * leaves the main thread's message as it was, and the other way round. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

static int g_world, g_rank;
static dt_mesh_t g_mesh;

/* A (4 world, 3) tensor of value 10 r + c on row r, column c, sharded on rows, gathered: every
 * rank must see every row. */
static void redistribute_and_reduce(void) {
  const int64_t rows = 4 * (int64_t)g_world, shape[2] = {rows, 3};
  float* full = malloc(sizeof(float) * (size_t)(rows * 3));
  DT_ASSERT_TRUE(full != NULL, "malloc");
  for (int64_t i = 0; i < rows * 3; i++) full[i] = (float)(10 * (i / 3) + i % 3);
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  dt_tensor_t t, rep, sum;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, shape, &s0, full, &t));
  DT_ASSERT_OK(dt_tensor_redistribute(t, &r, &rep));
  float* back = malloc(sizeof(float) * (size_t)(rows * 3));
  DT_ASSERT_TRUE(back != NULL, "malloc");
  DT_ASSERT_OK(dt_tensor_read_local(rep, 0, rows * 3, back));
  DT_ASSERT_TRUE(memcmp(back, full, sizeof(float) * (size_t)(rows * 3)) == 0,
                 "the replicated rows differ");
  DT_ASSERT_OK(dt_op_run("sum", 1, &t, 0, NULL, 0, NULL, &sum)); /* all-reduce of the shards */
  double v = 0.0, want = 0.0;
  for (int64_t i = 0; i < rows * 3; i++) want += full[i];
  DT_ASSERT_OK(dt_tensor_item(sum, &v));
  DT_ASSERT_TRUE(fabs(v - want) <= 1e-6 * want, "sum %g, want %g", v, want);
  dt_tensor_destroy(t);
  dt_tensor_destroy(rep);
  dt_tensor_destroy(sum);
  free(full);
  free(back);
}

typedef struct {
  dt_llama_t model;
  dt_adamw_t opt;
  dt_tape_t tape;
  dt_var_t* params;
  int n_params;
  double loss[4];
} train_t;

static void train_steps(train_t* tr, int first, int n) {
  const int64_t shape[2] = {2 * (int64_t)g_world, 8};
  int64_t tok[64 * 8], tgt[64 * 8];
  for (int i = 0; i < 2 * g_world * 8; i++) tok[i] = (i * 7 + 3) % 32, tgt[i] = (i * 5 + 1) % 32;
  dt_placement_t s0 = dt_shard(0);
  for (int s = first; s < first + n; s++) {
    dt_tensor_t tt, gt;
    dt_var_t loss;
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, shape, &s0, tok, &tt));
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, shape, &s0, tgt, &gt));
    DT_ASSERT_OK(dt_llama_forward(tr->model, tr->tape, tt, gt, &loss, NULL));
    DT_ASSERT_OK(dt_tensor_item(dt_var_value(loss), &tr->loss[s]));
    DT_ASSERT_OK(dt_tape_backward(tr->tape, loss));
    DT_ASSERT_OK(dt_adamw_step(tr->opt, DT_ADAMW_LR_CONFIG));
    for (int i = 0; i < tr->n_params; i++) DT_ASSERT_OK(dt_var_zero_grad(tr->params[i]));
    DT_ASSERT_OK(dt_tape_reset(tr->tape));
    dt_tensor_destroy(tt);
    dt_tensor_destroy(gt);
  }
}

static void* worker(void* arg) {
  train_t* tr = arg;
  DT_ASSERT_TRUE(dt_last_error()[0] == '\0', "a new thread starts with the message '%s'",
                 dt_last_error());
  redistribute_and_reduce();
  train_steps(tr, 0, 2);
  dt_tensor_t bad = NULL; /* fails here only: this thread's message */
  DT_ASSERT_STATUS(dt_tensor_redistribute(NULL, NULL, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dt_tensor_redistribute") != NULL, "worker message "
                 "'%s'", dt_last_error());
  return NULL;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int level = 0;
  MPI_Query_thread(&level);
  DT_ASSERT_TRUE(level >= MPI_THREAD_SERIALIZED, "MPI thread level %d, want SERIALIZED (%d) or "
                 "more", level, MPI_THREAD_SERIALIZED);
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &g_mesh));
  train_t tr;
  memset(&tr, 0, sizeof tr);
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.vocab = 32;
  c.seq_len = 8;
  c.seed = 5;
  DT_ASSERT_OK(dt_llama_create(g_mesh, &c, NULL, &tr.model));
  dt_module_t root;
  DT_ASSERT_OK(dt_llama_module(tr.model, &root));
  dt_fsdp_config_t fc = dt_fsdp_config_default(1);
  DT_ASSERT_OK(dt_fully_shard(root, g_mesh, &fc));
  DT_ASSERT_OK(dt_module_params(root, &tr.params, &tr.n_params));
  dt_adamw_config_t ac = dt_adamw_config_default();
  DT_ASSERT_OK(dt_adamw_create(&ac, tr.n_params, tr.params, &tr.opt));
  DT_ASSERT_OK(dt_tape_create(&tr.tape));
  /* a message of the main thread's own, which the worker must not see nor change */
  DT_ASSERT_STATUS(dt_mesh_create(0, NULL, NULL, NULL, NULL), DT_ERR_INVALID_ARG);
  char mine[512];
  snprintf(mine, sizeof mine, "%s", dt_last_error());
  pthread_t th;
  DT_ASSERT_TRUE(pthread_create(&th, NULL, worker, &tr) == 0, "pthread_create");
  DT_ASSERT_TRUE(pthread_join(th, NULL) == 0, "pthread_join");
  DT_ASSERT_TRUE(strcmp(dt_last_error(), mine) == 0, "the main thread's message changed: '%s' "
                 "(was '%s')", dt_last_error(), mine);
  redistribute_and_reduce(); /* the main thread goes on with the same mesh and model */
  train_steps(&tr, 2, 2);
  for (int s = 0; s < 4; s++)
    DT_ASSERT_TRUE(isfinite(tr.loss[s]), "step %d loss %g", s, tr.loss[s]);
  DT_ASSERT_TRUE(tr.loss[3] < tr.loss[0], "no training across the threads: %g then %g",
                 tr.loss[0], tr.loss[3]);
  DT_ASSERT_OK(dt_tape_destroy(tr.tape));
  DT_ASSERT_OK(dt_adamw_destroy(tr.opt));
  DT_ASSERT_OK(dt_llama_destroy(tr.model));
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_threads np=%d: ok\n", g_world);
  return 0;
}

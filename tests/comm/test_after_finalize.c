/* test_after_finalize.c - objects that outlive dt_finalize (np 2 and 4): meshes (1-D and 2-D,
 * with a flattened and a sliced one), tensors (Shard, Replicate, Partial), an asynchronous work
 * posted before the finalize and never waited for, a Llama model under FSDP with its AdamW and
 * tape, a checkpoint object. After dt_finalize every public call on them returns a status and
 * crashes nowhere (ASan/UBSan in CI):
 *  - every call that communicates (a redistribution, synchronous or not, a gather, a host
 *    all-reduce, a barrier-like agreement, the model's forward with its all-gathers, gradient
 *    clipping, a checkpoint save or load, a new mesh) fails with DT_ERR_NOT_INITIALIZED and a
 *    message saying the library was finalized;
 *  - local queries and local reads still work and see the values from before;
 *  - every object is destroyed without error (and without leaks: LeakSanitizer in CI).
 * Before all that, the process asks before allocating: a simulated world (dt_init_simulated) of
 * the real world's size, as this rank, estimates the memory of the model and optimizer the real
 * run then builds; dt_finalize ends the simulation and dt_init starts MPI in the same process;
 * the real run's dt_memory_stats equal the estimate, category by category, and its peaks start
 * afresh at dt_init (not at the simulation's).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dt_test.h"
#include "dtensor/checkpoint.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

/* st must be DT_ERR_NOT_INITIALIZED with "finalized" in the message. */
#define EXPECT_FINALIZED(call)                                                                   \
  do {                                                                                           \
    dt_status_t st_ = (call);                                                                    \
    DT_ASSERT_TRUE(st_ == DT_ERR_NOT_INITIALIZED && strstr(dt_last_error(), "finalized") != NULL, \
                   "%s after dt_finalize: status %d, \"%s\"", #call, (int)st_, dt_last_error()); \
  } while (0)

/* Any status: the call must only return (the calls whose outcome depends on what they reach). */
#define EXPECT_RETURNS(call)                                                                     \
  do {                                                                                           \
    dt_status_t st_ = (call);                                                                    \
    (void)st_;                                                                                   \
  } while (0)

/* A Llama model under FSDP over the world and its AdamW (created, not stepped). */
static dt_llama_config_t small_config(void) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.vocab = 32;
  c.seq_len = 4;
  c.ffn_dim = 24;
  c.seed = 5;
  return c;
}

static void build_model(dt_mesh_t m, dt_llama_t* model, dt_adamw_t* opt) {
  dt_llama_config_t c = small_config();
  dt_module_t root;
  DT_ASSERT_OK(dt_llama_create(m, &c, NULL, model));
  DT_ASSERT_OK(dt_llama_module(*model, &root));
  dt_fsdp_config_t fc = dt_fsdp_config_default(1);
  DT_ASSERT_OK(dt_fully_shard(root, m, &fc));
  dt_var_t* params;
  int np = 0;
  int64_t numel = 0;
  DT_ASSERT_OK(dt_llama_params(*model, &params, NULL, &np, &numel));
  dt_adamw_config_t ac = dt_adamw_config_default();
  DT_ASSERT_OK(dt_adamw_create(&ac, np, params, opt));
}

int main(int argc, char** argv) {
  /* ask before allocating: the world's size and this rank come from the launcher */
  const char* ws = getenv("OMPI_COMM_WORLD_SIZE");
  const char* wr = getenv("OMPI_COMM_WORLD_RANK");
  dt_memory_stats_t est, real;
  int simulated = ws != NULL && wr != NULL;
  if (simulated) {
    int sw = atoi(ws);
    DT_ASSERT_OK(dt_init_simulated(sw, atoi(wr)));
    dt_mesh_t sm;
    DT_ASSERT_OK(dt_mesh_create(1, &sw, NULL, NULL, &sm));
    dt_llama_t smodel;
    dt_adamw_t sopt;
    build_model(sm, &smodel, &sopt);
    DT_ASSERT_OK(dt_memory_stats(&est));
    DT_ASSERT_OK(dt_adamw_destroy(sopt));
    DT_ASSERT_OK(dt_llama_destroy(smodel));
    DT_ASSERT_OK(dt_mesh_destroy(sm));
    DT_ASSERT_OK(dt_finalize());
  }
  DT_ASSERT_OK(dt_init(&argc, &argv));
  dt_memory_stats_t fresh; /* the simulation's peaks stay with it */
  DT_ASSERT_OK(dt_memory_stats(&fresh));
  for (int k = 0; k < DT_MEM_COUNT; k++)
    DT_ASSERT_TRUE(fresh.peak[k] == fresh.current[k], "category %s: peak %lld after dt_init, "
                   "holding %lld", dt_mem_category_name((dt_mem_category_t)k),
                   (long long)fresh.peak[k], (long long)fresh.current[k]);
  DT_ASSERT_TRUE(fresh.total_peak == fresh.total_current, "total peak %lld after dt_init",
                 (long long)fresh.total_peak);
  int world = 0, rank = 0;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  int pid = (int)getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  char dir[128];
  snprintf(dir, sizeof dir, "/tmp/dt_after_finalize_%d", pid);

  /* meshes: the world, and 2 x world/2 with a flattened and a sliced view */
  dt_mesh_t m1, m2, flat = NULL, slice = NULL;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &m1));
  int shape2[2] = {2, world / 2};
  const char* names[2] = {"rep", "shard"};
  DT_ASSERT_OK(dt_mesh_create(2, shape2, names, NULL, &m2));
  int both[2] = {0, 1};
  DT_ASSERT_OK(dt_mesh_flatten(m2, 2, both, "dp", &flat));
  DT_ASSERT_OK(dt_mesh_slice(m2, 1, &names[1], &slice));

  /* tensors */
  const int64_t shape[2] = {8, 6};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate(), p = dt_partial(DT_REDUCE_SUM);
  dt_placement_t p2[2] = {dt_shard(0), dt_shard(1)};
  dt_tensor_t ts, tr, tp, t2, tw;
  DT_ASSERT_OK(dt_tensor_rand(m1, DT_F32, 2, shape, &s0, 1, &ts));
  DT_ASSERT_OK(dt_tensor_rand(m1, DT_F32, 2, shape, &r, 2, &tr));
  DT_ASSERT_OK(dt_tensor_redistribute(tr, &p, &tp));
  DT_ASSERT_OK(dt_tensor_rand(m2, DT_F32, 2, shape, p2, 3, &t2));
  int64_t n_before = 0;
  DT_ASSERT_OK(dt_tensor_local_numel(ts, &n_before));
  float before[64], after[64];
  DT_ASSERT_OK(dt_tensor_read_local(ts, 0, n_before, before));

  /* an asynchronous redistribution in flight at dt_finalize */
  dt_work_t work = NULL;
  DT_ASSERT_OK(dt_tensor_redistribute_async(ts, &r, &tw, &work));

  /* a model under FSDP, its optimizer and tape, a checkpoint of it (first alone: its memory
   * against the simulated estimate) */
  dt_memory_stats_t base;
  DT_ASSERT_OK(dt_memory_stats(&base));
  dt_llama_t model;
  dt_adamw_t opt;
  dt_module_t root;
  build_model(m1, &model, &opt);
  DT_ASSERT_OK(dt_llama_module(model, &root));
  DT_ASSERT_OK(dt_memory_stats(&real));
  for (int k = 0; simulated && k < DT_MEM_COUNT; k++)
    DT_ASSERT_TRUE(real.current[k] - base.current[k] == est.current[k],
                   "category %s: the run holds %lld bytes, the simulation said %lld",
                   dt_mem_category_name((dt_mem_category_t)k),
                   (long long)(real.current[k] - base.current[k]), (long long)est.current[k]);
  dt_var_t* params;
  int np = 0;
  int64_t numel = 0;
  DT_ASSERT_OK(dt_llama_params(model, &params, NULL, &np, &numel));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  DT_ASSERT_OK(dt_checkpoint_add_module(ck, NULL, root));
  DT_ASSERT_OK(dt_checkpoint_add_adamw(ck, "optim", opt, root));
  DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "ts", ts));
  dt_checkpoint_save_opts_t so = dt_checkpoint_save_opts_default();
  DT_ASSERT_OK(dt_checkpoint_save(ck, dir, "before", &so));
  int64_t tok[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t tshape[2] = {2, 4};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(m1, DT_I64, 2, tshape, &r, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(m1, DT_I64, 2, tshape, &r, tok, &gt));

  DT_ASSERT_OK(dt_finalize());

  /* local queries and reads see the values from before */
  int64_t ls[2], n_after = 0;
  DT_ASSERT_OK(dt_tensor_local_shape(ts, ls));
  DT_ASSERT_OK(dt_tensor_local_numel(ts, &n_after));
  DT_ASSERT_EQ(n_after, n_before);
  DT_ASSERT_OK(dt_tensor_read_local(ts, 0, n_after, after));
  DT_ASSERT_TRUE(memcmp(before, after, (size_t)n_after * sizeof(float)) == 0,
                 "the local values changed across dt_finalize");
  int mnd = 0, member = 0;
  DT_ASSERT_OK(dt_mesh_ndim(m2, &mnd));
  DT_ASSERT_EQ(mnd, 2);
  DT_ASSERT_OK(dt_mesh_is_member(slice, &member));
  dt_placement_t have[2];
  DT_ASSERT_OK(dt_tensor_placements(t2, have));
  DT_ASSERT_TRUE(dt_placement_equal(have[1], dt_shard(1)), "placements changed");
  dt_checkpoint_stats_t cs;
  DT_ASSERT_OK(dt_checkpoint_stats(ck, &cs));

  /* everything that communicates fails, saying why */
  dt_tensor_t out = NULL;
  float full[48];
  EXPECT_FINALIZED(dt_tensor_redistribute(ts, &r, &out));
  DT_ASSERT_TRUE(out == NULL, "a failed redistribution returned a tensor");
  EXPECT_FINALIZED(dt_tensor_redistribute(tp, &r, &out));
  EXPECT_FINALIZED(dt_tensor_redistribute(t2, (dt_placement_t[]){dt_replicate(), dt_replicate()},
                                          &out));
  EXPECT_FINALIZED(dt_tensor_gather_full(ts, full, sizeof full));
  EXPECT_FINALIZED(dt_tensor_gather_full(t2, full, sizeof full));
  dt_work_t w2 = NULL;
  dt_tensor_t out2 = NULL;
  dt_status_t ast = dt_tensor_redistribute_async(ts, &r, &out2, &w2);
  if (ast == DT_SUCCESS) { /* posting may succeed; completing cannot */
    EXPECT_FINALIZED(dt_work_wait(w2));
    DT_ASSERT_OK(dt_work_destroy(w2));
    DT_ASSERT_OK(dt_tensor_destroy(out2));
  } else {
    DT_ASSERT_TRUE(ast == DT_ERR_NOT_INITIALIZED && strstr(dt_last_error(), "finalized"), "%s",
                   dt_last_error());
  }
  float x[2] = {1, 2};
  EXPECT_FINALIZED(dt_mesh_all_reduce_host(m1, 0, NULL, x, 2, DT_F32, DT_REDUCE_SUM));
  EXPECT_FINALIZED(dt_mesh_all_reduce_host(flat, 0, NULL, x, 2, DT_F32, DT_REDUCE_MAX));
  dt_mesh_t m3 = NULL;
  dt_status_t mst = dt_mesh_create(1, &world, NULL, NULL, &m3);
  DT_ASSERT_TRUE(mst == DT_ERR_NOT_INITIALIZED && m3 == NULL, "dt_mesh_create after dt_finalize: "
                 "status %d, \"%s\"", (int)mst, dt_last_error());
  dt_var_t loss = NULL;
  EXPECT_FINALIZED(dt_llama_forward(model, tape, tt, gt, &loss, NULL));
  EXPECT_RETURNS(dt_tape_reset(tape));
  double gnorm = 0;
  EXPECT_RETURNS(dt_clip_grad_norm(np, params, 1.0, &gnorm));
  EXPECT_RETURNS(dt_adamw_step(opt, 1e-3));
  EXPECT_RETURNS(dt_fsdp_wait());
  EXPECT_FINALIZED(dt_checkpoint_save(ck, dir, "after", &so));
  EXPECT_FINALIZED(dt_checkpoint_load(ck, dir, "before"));
  DT_ASSERT_OK(dt_checkpoint_wait(ck)); /* nothing pending */
  /* the work posted before: completed by dt_finalize, or failing; either way it returns */
  EXPECT_RETURNS(dt_work_wait(work));
  EXPECT_RETURNS(dt_work_test(work, &member));

  /* everything is destroyed */
  DT_ASSERT_OK(dt_work_destroy(work));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_llama_destroy(model));
  DT_ASSERT_OK(dt_tensor_destroy(tt));
  DT_ASSERT_OK(dt_tensor_destroy(gt));
  DT_ASSERT_OK(dt_tensor_destroy(tw));
  DT_ASSERT_OK(dt_tensor_destroy(ts));
  DT_ASSERT_OK(dt_tensor_destroy(tr));
  DT_ASSERT_OK(dt_tensor_destroy(tp));
  DT_ASSERT_OK(dt_tensor_destroy(t2));
  DT_ASSERT_OK(dt_mesh_destroy(slice));
  DT_ASSERT_OK(dt_mesh_destroy(flat));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  if (rank == 0) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    DT_ASSERT_EQ(system(cmd), 0);
  }
  printf("rank %d: every call after dt_finalize returned a status\n", rank);
  return 0;
}

/* test_api_errors.c - every invalid argument of the public API returns the documented status with
 * a message naming the problem, out-pointers are NULL/zeroed, and nothing is corrupted: after all
 * the errors a normal redistribute on the same mesh still gives the right result. np 2 and 4. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_test.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

/* Expects status `want` and a last-error message containing `needle` (NULL: any non-empty). */
#define EXPECT(call, want, needle)                                                        \
  do {                                                                                    \
    dt_clear_error();                                                                     \
    DT_ASSERT_STATUS(call, want);                                                         \
    const char* e_ = dt_last_error();                                                     \
    DT_ASSERT_TRUE(strlen(e_) > 0, "empty message for %s", #call);                        \
    if ((needle) != NULL)                                                                 \
      DT_ASSERT_TRUE(strstr(e_, (needle)) != NULL, "message '%s' lacks '%s'", e_, (const char*)(needle)); \
  } while (0)

static void before_init(void) {
  int r = 7;
  dt_mesh_t m = (dt_mesh_t)0x1;
  int one = 1;
  EXPECT(dt_world_rank(&r), DT_ERR_NOT_INITIALIZED, "dt_init");
  DT_ASSERT_EQ(r, -1);
  EXPECT(dt_mesh_create(1, &one, NULL, NULL, &m), DT_ERR_NOT_INITIALIZED, "dt_init");
  DT_ASSERT_TRUE(m == NULL, "out not cleared");
  DT_ASSERT_OK(dt_finalize()); /* finalize before init is a no-op */
  dt_llama_config_t c; /* a config is checked without the library initialized */
  memset(&c, 0, sizeof c);
  c.dim = 64;
  c.n_layers = 1;
  c.n_heads = 3;
  c.vocab = 16;
  c.seq_len = 4;
  EXPECT(dt_llama_config_check(&c), DT_ERR_INVALID_ARG, "dim=64 over n_heads=3");
  c.n_heads = 4;
  DT_ASSERT_OK(dt_llama_config_check(&c));
}

static void mesh_errors(int world) {
  dt_mesh_t m = (dt_mesh_t)0x1;
  int s2[2] = {2, world / 2}, bad0[1] = {0}, neg[1] = {-3}, big[5] = {1, 1, 1, 1, 1};
  EXPECT(dt_mesh_create(0, s2, NULL, NULL, &m), DT_ERR_INVALID_ARG, "ndim 0");
  DT_ASSERT_TRUE(m == NULL, "out");
  EXPECT(dt_mesh_create(5, big, NULL, NULL, &m), DT_ERR_INVALID_ARG, "ndim 5");
  EXPECT(dt_mesh_create(1, bad0, NULL, NULL, &m), DT_ERR_INVALID_ARG, "at least 1");
  EXPECT(dt_mesh_create(1, neg, NULL, NULL, &m), DT_ERR_INVALID_ARG, "-3");
  EXPECT(dt_mesh_create(1, NULL, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT(dt_mesh_create(1, s2, NULL, NULL, NULL), DT_ERR_INVALID_ARG, "out");
  int wrong = world + 1;
  EXPECT(dt_mesh_create(1, &wrong, NULL, NULL, &m), DT_ERR_INVALID_ARG, "world has");
  int ranks_dup[8] = {0, 0, 1, 2, 3, 4, 5, 6};
  EXPECT(dt_mesh_create(1, &world, NULL, ranks_dup, &m), DT_ERR_INVALID_ARG, "twice");
  int ranks_oob[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ranks_oob[world - 1] = world + 5;
  EXPECT(dt_mesh_create(1, &world, NULL, ranks_oob, &m), DT_ERR_INVALID_ARG, "out of range");
  const char* dup_names[2] = {"dp", "dp"};
  EXPECT(dt_mesh_create(2, s2, dup_names, NULL, &m), DT_ERR_INVALID_ARG, "twice");
  const char* long_names[2] = {"dp", "a_name_that_is_longer_than_thirty_one_characters"};
  EXPECT(dt_mesh_create(2, s2, long_names, NULL, &m), DT_ERR_INVALID_ARG, "longer");
  const char* empty_names[2] = {"dp", ""};
  EXPECT(dt_mesh_create(2, s2, empty_names, NULL, &m), DT_ERR_INVALID_ARG, "empty");
  EXPECT(dt_mesh_create_abstract(2, s2, dup_names, &m), DT_ERR_INVALID_ARG, "twice");

  const char* names[2] = {"dp", "tp"};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(2, s2, names, NULL, &mesh));
  int v = 9;
  EXPECT(dt_mesh_size(mesh, 2, &v), DT_ERR_INVALID_ARG, "out of range");
  DT_ASSERT_EQ(v, 0);
  EXPECT(dt_mesh_size(mesh, -3, &v), DT_ERR_INVALID_ARG, "out of range");
  EXPECT(dt_mesh_size(NULL, 0, &v), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_ndim(mesh, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_dim_index(mesh, "ep", &v), DT_ERR_INVALID_ARG, "'ep'");
  DT_ASSERT_EQ(v, -1);
  int coords[2] = {2, 0};
  EXPECT(dt_mesh_rank_at(mesh, coords, &v), DT_ERR_INVALID_ARG, "coords[0]");
  const char* unknown[1] = {"ep"};
  EXPECT(dt_mesh_slice(mesh, 1, unknown, &m), DT_ERR_INVALID_ARG, "'ep'");
  DT_ASSERT_TRUE(m == NULL, "out");
  const char* reversed[2] = {"tp", "dp"};
  EXPECT(dt_mesh_slice(mesh, 2, reversed, &m), DT_ERR_INVALID_ARG, "mesh order");
  EXPECT(dt_mesh_slice(mesh, 0, names, &m), DT_ERR_INVALID_ARG, "nnames");
  int desc[2] = {1, 0}, oob[2] = {0, 2};
  EXPECT(dt_mesh_flatten(mesh, 2, desc, NULL, NULL), DT_ERR_INVALID_ARG, "ascending");
  EXPECT(dt_mesh_flatten(mesh, 2, oob, NULL, NULL), DT_ERR_INVALID_ARG, "out of range");
  int both[2] = {0, 1};
  EXPECT(dt_mesh_flatten(mesh, 2, both, "tp", NULL), DT_ERR_INVALID_ARG, "already");
  /* a garbage handle (zeroed struct) is rejected, not dereferenced blindly */
  static char zeros[4096];
  EXPECT(dt_mesh_ndim((dt_mesh_t)(void*)zeros, &v), DT_ERR_INVALID_ARG, "not a live mesh");
  /* abstract meshes have no coordinates and hold no data */
  dt_mesh_t abs;
  DT_ASSERT_OK(dt_mesh_create_abstract(2, s2, names, &abs));
  int c2[2];
  EXPECT(dt_mesh_coordinate(abs, c2), DT_ERR_INVALID_USAGE, "abstract");
  int64_t ts[2] = {4, 4};
  dt_placement_t rr[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t t = (dt_tensor_t)0x1;
  EXPECT(dt_tensor_zeros(abs, DT_F32, 2, ts, rr, &t), DT_ERR_INVALID_USAGE, "abstract");
  DT_ASSERT_TRUE(t == NULL, "out");
  DT_ASSERT_OK(dt_mesh_destroy(abs));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_mesh_destroy(NULL));
}

static void tensor_errors(dt_mesh_t mesh, int world, int rank) {
  dt_tensor_t t = (dt_tensor_t)0x1;
  int64_t ts[2] = {8, 6}, neg[2] = {8, -1};
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  dt_placement_t s0[1] = {dt_shard(0)}, s5[1] = {dt_shard(5)}, r[1] = {dt_replicate()};
  dt_placement_t p[1] = {dt_partial(DT_REDUCE_SUM)}, pmax[1] = {dt_partial(DT_REDUCE_MAX)};
  dt_placement_t badop[1] = {{DT_PARTIAL, 0, 9}}, badkind[1] = {{7, 0, 0}};
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 9, nine, r, &t), DT_ERR_INVALID_ARG, "ndim 9");
  DT_ASSERT_TRUE(t == NULL, "out");
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, neg, r, &t), DT_ERR_INVALID_ARG, "negative");
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, ts, s5, &t), DT_ERR_INVALID_ARG, "Shard dim 5");
  EXPECT(dt_tensor_zeros(mesh, (dt_dtype_t)99, 2, ts, r, &t), DT_ERR_INVALID_ARG, "dtype 99");
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, ts, badop, &t), DT_ERR_INVALID_ARG, "op");
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, ts, badkind, &t), DT_ERR_INVALID_ARG, "kind");
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, ts, NULL, &t), DT_ERR_INVALID_ARG, "placements");
  EXPECT(dt_tensor_zeros(NULL, DT_F32, 2, ts, r, &t), DT_ERR_INVALID_ARG, "mesh");
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, ts, r, NULL), DT_ERR_INVALID_ARG, "out");
  EXPECT(dt_tensor_rand(mesh, DT_I32, 2, ts, r, 1, &t), DT_ERR_INVALID_ARG, "float dtype");
  EXPECT(dt_tensor_full_value(mesh, DT_F32, 2, ts, r, NAN, &t), DT_ERR_INVALID_ARG, "finite");
  EXPECT(dt_tensor_arange(mesh, DT_F32, 2, ts, r, 0.0, INFINITY, &t), DT_ERR_INVALID_ARG, "finite");
  float full[48] = {0};
  EXPECT(dt_tensor_distribute(mesh, DT_F32, 2, ts, s0, full, world + 3, &t), DT_ERR_INVALID_ARG,
         "not a member");
  /* collective: every rank calls it; only the source can tell its buffer is missing, and every
   * rank returns the error */
  if (rank == 0)
    EXPECT(dt_tensor_distribute(mesh, DT_F32, 2, ts, s0, NULL, 0, &t), DT_ERR_INVALID_ARG, "NULL");
  else
    DT_ASSERT_STATUS(dt_tensor_distribute(mesh, DT_F32, 2, ts, s0, NULL, 0, &t),
                     DT_ERR_INVALID_ARG);
  EXPECT(dt_tensor_from_full(mesh, DT_F32, 2, ts, s0, NULL, &t), DT_ERR_INVALID_ARG, "full");
  int64_t lshape[2] = {99, 6};
  EXPECT(dt_tensor_from_local(mesh, DT_F32, 2, ts, s0, full, lshape, &t), DT_ERR_INVALID_ARG,
         "chunk rule");
  DT_ASSERT_TRUE(t == NULL, "out");
  int64_t good[2] = {8 / world, 6};
  EXPECT(dt_tensor_from_local(mesh, DT_F32, 2, ts, s0, NULL, good, &t), DT_ERR_INVALID_ARG,
         "NULL");

  dt_tensor_t a, b, c;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, ts, s0, 0.0, 1.0, &a));
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 2, ts, p, 0.0, 1.0, &b));
  dt_tensor_t out = (dt_tensor_t)0x1;
  EXPECT(dt_tensor_redistribute(a, p, &out), DT_ERR_UNSUPPORTED, "new Partial");
  DT_ASSERT_TRUE(out == NULL, "out");
  EXPECT(dt_tensor_redistribute(b, pmax, &out), DT_ERR_UNSUPPORTED, "reduce op");
  EXPECT(dt_tensor_redistribute(a, s5, &out), DT_ERR_INVALID_ARG, "Shard dim 5");
  EXPECT(dt_tensor_redistribute(a, NULL, &out), DT_ERR_INVALID_ARG, "dst");
  EXPECT(dt_tensor_redistribute(NULL, r, &out), DT_ERR_INVALID_ARG, "tensor");
  int64_t other[2] = {6, 8};
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, other, r, &c));
  EXPECT(dt_tensor_redistribute_into(a, c), DT_ERR_INVALID_ARG, "shapes");
  DT_ASSERT_OK(dt_tensor_destroy(c));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_I32, 2, ts, r, &c));
  EXPECT(dt_tensor_redistribute_into(a, c), DT_ERR_INVALID_ARG, "dtype");
  DT_ASSERT_OK(dt_tensor_destroy(c));
  dt_mesh_t mesh2;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh2));
  DT_ASSERT_OK(dt_tensor_zeros(mesh2, DT_F32, 2, ts, r, &c));
  EXPECT(dt_tensor_redistribute_into(a, c), DT_ERR_INVALID_ARG, "meshes");
  DT_ASSERT_OK(dt_tensor_destroy(c));
  DT_ASSERT_OK(dt_mesh_destroy(mesh2));
  EXPECT(dt_tensor_redistribute_into(a, a), DT_ERR_INVALID_ARG, "storage");
  float small[10];
  EXPECT(dt_tensor_gather_full(a, small, sizeof small), DT_ERR_INVALID_ARG, "needs 192");
  EXPECT(dt_tensor_gather_full(a, NULL, 192), DT_ERR_INVALID_ARG, "out");
  EXPECT(dt_tensor_gather_full(a, small, sizeof small), DT_ERR_INVALID_ARG, "needs 192");
  EXPECT(dt_tensor_gather_full(NULL, small, sizeof small), DT_ERR_INVALID_ARG, "tensor");
  static char zeros[4096];
  int nd;
  EXPECT(dt_tensor_ndim((dt_tensor_t)(void*)zeros, &nd), DT_ERR_INVALID_ARG, "not a live tensor");
  EXPECT(dt_tensor_visualize(a, NULL), DT_ERR_INVALID_ARG, "NULL");

  /* nothing above corrupted anything: a real redistribute still works */
  DT_ASSERT_OK(dt_tensor_redistribute(a, r, &out));
  float got[48];
  DT_ASSERT_OK(dt_tensor_gather_full(out, got, sizeof got));
  for (int i = 0; i < 48; i++) DT_ASSERT_TRUE(got[i] == (float)i, "data after errors");
  DT_ASSERT_OK(dt_tensor_redistribute(b, r, &c));
  DT_ASSERT_OK(dt_tensor_gather_full(c, got, sizeof got));
  for (int i = 0; i < 48; i++) DT_ASSERT_TRUE(got[i] == (float)i, "partial data after errors");
  DT_ASSERT_OK(dt_tensor_destroy(out));
  DT_ASSERT_OK(dt_tensor_destroy(c));
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_tensor_destroy(NULL));
}

static void plan_and_cost_errors(dt_mesh_t mesh) {
  int64_t ts[2] = {8, 8};
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  dt_plan_t plan = (dt_plan_t)0x1;
  EXPECT(dt_plan_create(mesh, (dt_dtype_t)-1, 2, ts, s0, r, &plan), DT_ERR_INVALID_ARG, "dtype");
  DT_ASSERT_TRUE(plan == NULL, "out");
  DT_ASSERT_OK(dt_plan_create(mesh, DT_F32, 2, ts, s0, r, &plan));
  dt_plan_step_t st;
  EXPECT(dt_plan_get_step(plan, 1, &st), DT_ERR_INVALID_ARG, "out of range");
  EXPECT(dt_plan_get_step(plan, -1, &st), DT_ERR_INVALID_ARG, "out of range");
  int n;
  EXPECT(dt_plan_count(plan, (dt_collective_t)42, &n), DT_ERR_INVALID_ARG, "out of range");
  DT_ASSERT_OK(dt_plan_destroy(plan));

  dt_cost_params_t before, after, bad = {1.0, 1.0, -5.0};
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &before));
  EXPECT(dt_cost_model_set(DT_COLL_ALL_GATHER, &bad), DT_ERR_INVALID_ARG, "bw_gbps");
  EXPECT(dt_cost_model_set((dt_collective_t)9, &before), DT_ERR_INVALID_ARG, "out of range");
  EXPECT(dt_cost_model_load("/nonexistent/dtensor_cost.json"), DT_ERR_IO, "cannot open");
  EXPECT(dt_cost_model_load("/tmp"), DT_ERR_IO, "not a regular file");
  char fifo[64]; /* opening a FIFO with no writer would block forever */
  snprintf(fifo, sizeof fifo, "/tmp/dt_cost_fifo_%d", (int)getpid());
  if (mkfifo(fifo, 0600) == 0) {
    EXPECT(dt_cost_model_load(fifo), DT_ERR_IO, "not a regular file");
    unlink(fifo);
  }
  char path[64];
  snprintf(path, sizeof path, "/tmp/dt_cost_bad_%d.json", (int)getpid());
  FILE* f = fopen(path, "w");
  fputs("{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 2}, \"all_reduce\": 5}", f);
  fclose(f);
  EXPECT(dt_cost_model_load(path), DT_ERR_INVALID_ARG, "all_reduce");
  f = fopen(path, "w");
  fputs("not json", f);
  fclose(f);
  EXPECT(dt_cost_model_load(path), DT_ERR_INVALID_ARG, "not a JSON object");
  f = fopen(path, "w");
  fputs("{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": -2}}", f);
  fclose(f);
  EXPECT(dt_cost_model_load(path), DT_ERR_INVALID_ARG, "bw_gbps");
  remove(path);
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &after));
  DT_ASSERT_TRUE(memcmp(&before, &after, sizeof before) == 0, "failed load changed the model");
  /* a good file round-trips */
  after.bw_gbps = 3.5;
  DT_ASSERT_OK(dt_cost_model_set(DT_COLL_ALL_GATHER, &after));
  DT_ASSERT_OK(dt_cost_model_save(path));
  DT_ASSERT_OK(dt_cost_model_reset());
  DT_ASSERT_OK(dt_cost_model_load(path));
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &after));
  DT_ASSERT_TRUE(after.bw_gbps == 3.5, "round trip");
  remove(path);
  DT_ASSERT_OK(dt_cost_model_reset());
  double c;
  EXPECT(dt_cost_estimate(DT_COLL_ALL_GATHER, 0, 10, &c), DT_ERR_INVALID_ARG, "n = 0");
}

/* The meta backend (no memory) belongs to simulated worlds: a mesh that communicates for real
 * refuses it as its backend, as the default its meshes take, and for a tensor's memory. */
static void meta_refused(dt_mesh_t mesh, int world) {
  dt_backend_t meta, def;
  DT_ASSERT_OK(dt_backend_get("meta", &meta));
  EXPECT(dt_mesh_set_backend(mesh, meta), DT_ERR_INVALID_USAGE, "simulated");
  DT_ASSERT_OK(dt_backend_default(&def));
  DT_ASSERT_OK(dt_backend_set_default(meta));
  dt_mesh_t m2 = NULL;
  EXPECT(dt_mesh_create(1, &world, NULL, NULL, &m2), DT_ERR_INVALID_USAGE, "meta");
  DT_ASSERT_TRUE(m2 == NULL, "a mesh was made");
  DT_ASSERT_OK(dt_backend_set_default(def));
  float v[4] = {1, 2, 3, 4};
  const int64_t ls[1] = {4}, gs[1] = {4 * (int64_t)world};
  dt_placement_t s0 = dt_shard(0);
  dt_tensor_t t = NULL;
  EXPECT(dt_tensor_from_local_backend(mesh, meta, DT_F32, 1, gs, &s0, v, ls, &t),
         DT_ERR_INVALID_USAGE, "simulated");
  DT_ASSERT_TRUE(t == NULL, "a tensor was made");
  EXPECT(dt_op_register_kernel("add", DT_DEVICE_META, NULL), DT_ERR_INVALID_ARG, "meta");
}

/* dt_llama_create and dt_llama_config_check refuse a config with the same message. */
#define EXPECT_CONFIG(c, needle)                                                           \
  do {                                                                                    \
    EXPECT(dt_llama_config_check(&(c)), DT_ERR_INVALID_ARG, needle);                      \
    EXPECT(dt_llama_create(mesh, &(c), NULL, &m), DT_ERR_INVALID_ARG, needle);            \
  } while (0)

/* A model config that cannot exist: the message names the constraint and the values. */
static void llama_config_errors(dt_mesh_t mesh) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 30;
  c.n_layers = 1;
  c.n_heads = 8;
  c.vocab = 16;
  c.seq_len = 4;
  dt_llama_t m = NULL;
  EXPECT_CONFIG(c, "dim=30 over n_heads=8");
  c.dim = 24;
  c.n_heads = 3;
  c.n_kv_heads = 2;
  EXPECT_CONFIG(c, "n_kv_heads=2 must divide n_heads=3");
  c.n_kv_heads = 0;
  c.n_experts = 2;
  c.top_k = 3;
  EXPECT_CONFIG(c, "top_k=3 (valid: 1 to n_experts=2)");
  c.n_experts = 0;
  c.seq_len = 0;
  EXPECT_CONFIG(c, "seq_len=0");
  c.seq_len = 4;
  /* a dim whose default ffn_dim (8 dim / 3) is past an int: refused (8 dim overflowed an int,
   * undefined behaviour, from dim 2^28 on) */
  c.dim = 1 << 29; /* 8 dim past an int, the default (1431655768) within it */
  c.n_heads = 1 << 27;
  DT_ASSERT_OK(dt_llama_config_check(&c));
  c.dim = 1 << 30;
  c.n_heads = 1 << 28;
  EXPECT_CONFIG(c, "ffn_dim=0 and dim=1073741824");
  c.ffn_dim = 8; /* given: no default needed (dim and ffn_dim as large as that are checked at
                  * the parameters' allocation) */
  DT_ASSERT_OK(dt_llama_config_check(&c));
  c.ffn_dim = 0;
  c.dim = 24;
  c.n_heads = 3;
  /* non-finite floats: NaN was not <= 0 and stayed, a NaN loss at every step */
  const double bad[2] = {NAN, INFINITY};
  for (int k = 0; k < 2; k++) {
    c.norm_eps = bad[k];
    EXPECT_CONFIG(c, "norm_eps=");
    c.norm_eps = 0;
    c.rope_theta = bad[k];
    EXPECT_CONFIG(c, "rope_theta=");
    c.rope_theta = 0;
    c.aux_loss_coef = bad[k];
    EXPECT_CONFIG(c, "aux_loss_coef=");
    c.aux_loss_coef = 0;
  }
  DT_ASSERT_OK(dt_llama_config_check(&c));
  /* the switches take 0 or 1 only: any other value was taken as on, without a word */
  c.tie_embeddings = 2;
  EXPECT_CONFIG(c, "tie_embeddings=2 (valid: 0, or 1");
  c.tie_embeddings = -1;
  EXPECT_CONFIG(c, "tie_embeddings=-1 (valid: 0, or 1");
  c.tie_embeddings = 1;
  DT_ASSERT_OK(dt_llama_config_check(&c));
  c.tie_embeddings = 0;
  c.defer_init = 7;
  EXPECT_CONFIG(c, "defer_init=7 (valid: 0, or 1");
  c.defer_init = 1;
  DT_ASSERT_OK(dt_llama_config_check(&c));
  c.defer_init = 0;
  c.ignore_targets = 2;
  EXPECT_CONFIG(c, "ignore_targets=2 (valid: 0, or 1");
  c.ignore_targets = 0;
  DT_ASSERT_TRUE(dt_llama_flops_per_token(NULL) == 0.0, "flops of NULL");
  dt_llama_config_defaults(NULL); /* nothing, no crash */
  c.seq_len = 0;
  DT_ASSERT_TRUE(m == NULL, "a model was made");
  EXPECT(dt_llama_config_check(NULL), DT_ERR_INVALID_ARG, "dt_llama_config_check");
  c.seq_len = 4;
  c.n_experts = 2;
  c.top_k = 0; /* 0: the default, 2 */
  DT_ASSERT_OK(dt_llama_config_check(&c));
  DT_ASSERT_TRUE(c.top_k == 0, "the check changed the config");
}

/* The wrappers agree on their argument checks: a bad argument on one rank (the last) fails every
 * rank with DT_ERR_INVALID_ARG (that rank's own message; the others name it), not that rank alone
 * while the others wait in the first collective; nothing is wrapped, and the same call with good
 * arguments then succeeds everywhere. */
static void expect_agreed(dt_status_t st, int rank, int world, const char* own, const char* what) {
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG, "%s: status %s on rank %d: %s", what,
                 dt_status_name(st), rank, dt_last_error());
  char want[128];
  if (rank == world - 1) snprintf(want, sizeof want, "%s", own);
  else snprintf(want, sizeof want, "%s failed on rank %d of the mesh", what, world - 1);
  DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "rank %d: '%s' lacks '%s'", rank,
                 dt_last_error(), want);
}

static void wrapper_agreement(dt_mesh_t mesh, int world, int rank) {
  const int last = rank == world - 1;
  /* FSDP: reshard_after_forward -3 on the last rank only */
  dt_module_t fc;
  DT_ASSERT_OK(dt_linear_create(mesh, "fc", 8, 8, 1, 7, &fc));
  dt_fsdp_config_t c = dt_fsdp_config_default(1);
  if (last) c.reshard_after_forward = -3;
  expect_agreed(dt_fully_shard(fc, mesh, &c), rank, world, "reshard_after_forward",
                "dt_fully_shard's checks");
  DT_ASSERT_TRUE(!dt_fsdp_is_group(fc), "rank %d: a refused dt_fully_shard left a group", rank);
  c.reshard_after_forward = 1;
  DT_ASSERT_OK(dt_fully_shard(fc, mesh, &c));
  DT_ASSERT_TRUE(dt_fsdp_is_group(fc), "rank %d: no group after a good dt_fully_shard", rank);
  DT_ASSERT_OK(dt_module_destroy(fc));
  /* DDP: mesh_dim 5 on the last rank only */
  DT_ASSERT_OK(dt_linear_create(mesh, "fc", 8, 8, 1, 7, &fc));
  dt_ddp_config_t d;
  memset(&d, 0, sizeof d);
  d.mesh_dim = last ? 5 : 0;
  expect_agreed(dt_data_parallel(fc, mesh, &d), rank, world, "mesh_dim 5",
                "dt_data_parallel's checks");
  int nb = -1;
  DT_ASSERT_TRUE(dt_ddp_num_buckets(fc, &nb) != DT_SUCCESS, "rank %d: a refused DDP wraps", rank);
  d.mesh_dim = 0;
  DT_ASSERT_OK(dt_data_parallel(fc, mesh, &d));
  DT_ASSERT_OK(dt_ddp_num_buckets(fc, &nb));
  DT_ASSERT_TRUE(nb >= 1, "rank %d: %d buckets", rank, nb);
  DT_ASSERT_OK(dt_module_destroy(fc));
  /* TP: a plan entry that names no module on the last rank only */
  dt_module_t kids[1], seq;
  DT_ASSERT_OK(dt_linear_create(mesh, "fc", 8, 8, 1, 7, &kids[0]));
  DT_ASSERT_OK(dt_sequential_create("seq", 1, kids, &seq));
  dt_tp_plan_entry_t plan[1] = {{last ? "fcx" : "fc", dt_tp_colwise()}};
  expect_agreed(dt_parallelize_module(seq, mesh, 0, 1, plan), rank, world, "names no module",
                "dt_parallelize_module's checks");
  plan[0].pattern = "fc";
  DT_ASSERT_OK(dt_parallelize_module(seq, mesh, 0, 1, plan));
  dt_var_t w = NULL;
  char name[64];
  DT_ASSERT_OK(dt_module_param_at(seq, 0, name, sizeof name, &w));
  dt_placement_t pl[1];
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(w), pl));
  DT_ASSERT_TRUE(pl[0].kind == DT_SHARD, "rank %d: %s not sharded after a good plan", rank, name);
  DT_ASSERT_OK(dt_module_destroy(seq));
  /* the agreement itself: a status out of range counts as an invalid argument, NULL what */
  dt_status_t st = dt_mesh_agree(mesh, last ? (dt_status_t)99 : DT_SUCCESS, NULL);
  expect_agreed(st, rank, world, "st=99 is not a dt_status_t", "a step");
  DT_ASSERT_OK(dt_mesh_agree(mesh, DT_SUCCESS, "nothing"));
}

int main(int argc, char** argv) {
  before_init();
  DT_ASSERT_OK(dt_init(&argc, &argv));
  EXPECT(dt_init(&argc, &argv), DT_ERR_INVALID_USAGE, "twice");
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_TRUE(world == 2 || world == 4, "run at np 2 or 4");
  mesh_errors(world);
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  tensor_errors(mesh, world, rank);
  plan_and_cost_errors(mesh);
  meta_refused(mesh, world);
  llama_config_errors(mesh);
  wrapper_agreement(mesh, world, rank);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (rank == 0) printf("test_api_errors np=%d: ok\n", world);
  DT_ASSERT_OK(dt_finalize());
  DT_ASSERT_OK(dt_finalize());
  EXPECT(dt_init(NULL, NULL), DT_ERR_INVALID_USAGE, "finalized"); /* MPI cannot restart */
  return 0;
}

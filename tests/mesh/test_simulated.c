/* test_simulated.c - dt_init_simulated, the meta backend and simulated communicators (no MPI):
 *
 *  - arguments: world_size and rank out of range, a second init, refused with messages; the
 *    simulated world's size and rank reported; dt_finalize ends it and a new one can start;
 *  - meshes get the meta backend (device kind "meta"), and no other backend;
 *  - meta tensors take no memory but are counted: a 1 MiB f32 tensor is 1 MiB under its
 *    category in dt_memory_stats; reads give zeros; small tensors keep uploaded values;
 *  - traffic: Shard(0) -> Replicate of an (8n, 16) f32 tensor on n ranks counts one all-gather of
 *    n * 8 * 16 * 4 bytes; a 2-D mesh's dims count under their own dim;
 *  - host values: an all-reduce sum of host values gives world size times the value, max the
 *    value; a gather of a tensor into a host array gives zeros; a posted asynchronous
 *    redistribution completes at dt_work_wait, or at its second poll (the post's, then the first
 *    dt_work_test);
 *  - a model step (Llama, FSDP over 8 simulated ranks, AdamW) runs and counts the parameters'
 *    shards: 1/8 of the model per rank, rounded as the pool rounds;
 *  - step time (dt_sim_time_get): a product priced by the compute model (FLOPs, f32 and bf16
 *    rates), an add by its bytes (bf16: with its f32 copies'), a blocking all-gather by the cost model and exposed whole, an
 *    asynchronous one hidden behind the compute before its wait (partly, then entirely), two
 *    posted at once queued on the one communication stream; the compute model's checks and its
 *    round trip through the cost model file;
 *  - ring attention (context parallelism) on 4 simulated ranks: the ring's traffic as the real
 *    run counts it (3 forward key/value shards; backward 3 more and 4 gradient shards), its
 *    transfers priced and overlapped with its blocks' FLOPs on the clock, the scratch counted;
 *    the all-gather variant's collectives;
 *  - dt_sim_set_device: bad names, outside a simulation and once tensors exist refused; a build
 *    without the emulated GPU's kernels says so; with them, an f32 attention forward counts the
 *    GEMM path's workspace (the 64 x 64 scores of both heads, 32 KiB) instead of the host
 *    kernel's (one head's scores, 16 KiB), and a new dt_init_simulated plays the cpu again.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>

#include <cmocka.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

#define OK(x) assert_int_equal((x), DT_SUCCESS)

static void test_args(void** state) {
  (void)state;
  assert_int_equal(dt_init_simulated(0, 0), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "world_size=0"));
  assert_int_equal(dt_init_simulated(4, 4), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "rank=4"));
  assert_int_equal(dt_init_simulated(4, -1), DT_ERR_INVALID_ARG);
  OK(dt_init_simulated(512, 37));
  assert_int_equal(dt_init_simulated(4, 0), DT_ERR_INVALID_USAGE);
  int ws = 0, r = 0;
  OK(dt_world_size(&ws));
  OK(dt_world_rank(&r));
  assert_int_equal(ws, 512);
  assert_int_equal(r, 37);
  int shape[2] = {32, 16};
  dt_mesh_t m;
  OK(dt_mesh_create(2, shape, NULL, NULL, &m));
  int c[2];
  OK(dt_mesh_coordinate(m, c));
  assert_int_equal(c[0], 2); /* rank 37 = 2 * 16 + 5 */
  assert_int_equal(c[1], 5);
  dt_backend_t be, cpu;
  dt_device_t dev;
  OK(dt_mesh_backend(m, &be));
  OK(dt_backend_device(be, &dev));
  assert_int_equal(dev, DT_DEVICE_META);
  assert_string_equal(dt_device_name(dev), "meta");
  assert_string_equal(dt_backend_name(be), "meta");
  OK(dt_backend_get("cpu", &cpu));
  assert_int_equal(dt_mesh_set_backend(m, cpu), DT_ERR_INVALID_USAGE);
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
  OK(dt_init_simulated(2, 1)); /* again, another world */
  OK(dt_world_size(&ws));
  assert_int_equal(ws, 2);
  OK(dt_finalize());
}

static void test_memory_and_values(void** state) {
  (void)state;
  OK(dt_init_simulated(4, 3));
  int n = 4;
  dt_mesh_t m;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  dt_memory_stats_t before, after;
  OK(dt_memory_stats(&before));
  const int64_t shape[2] = {1024, 1024};
  dt_placement_t r = dt_replicate(), s0 = dt_shard(0);
  dt_tensor_t t, u;
  OK(dt_tensor_randn(m, DT_F32, 2, shape, &r, 1, &t)); /* 4 MiB replicated */
  OK(dt_tensor_set_memory_category(t, DT_MEM_PARAMETERS));
  OK(dt_memory_stats(&after));
  assert_int_equal(after.current[DT_MEM_PARAMETERS] - before.current[DT_MEM_PARAMETERS], 4 << 20);
  OK(dt_tensor_redistribute(t, &s0, &u)); /* a local slice: 1 MiB */
  OK(dt_memory_stats(&after));
  assert_int_equal(after.current[DT_MEM_OTHER] - before.current[DT_MEM_OTHER], 1 << 20);
  float v[4] = {1, 1, 1, 1};
  OK(dt_tensor_read_local(u, 0, 4, v));
  assert_true(v[0] == 0.0f && v[3] == 0.0f); /* no values: zeros */
  int meta = 0;
  OK(dt_tensor_is_meta(u, &meta));
  assert_int_equal(meta, 0); /* a tensor with storage, of the meta backend */
  /* small tensors keep uploaded values (split counts reach ops that way) */
  const int64_t four[1] = {4};
  int64_t vals[4] = {3, 1, 4, 1}, back[4] = {0};
  dt_tensor_t small;
  OK(dt_tensor_from_full(m, DT_I64, 1, four, &r, vals, &small));
  OK(dt_tensor_read_local(small, 0, 4, back));
  assert_memory_equal(vals, back, sizeof vals);
  /* host collectives: every rank holds what this one holds */
  float x[2] = {1.5f, -2.0f};
  OK(dt_mesh_all_reduce_host(m, 0, NULL, x, 2, DT_F32, DT_REDUCE_SUM));
  assert_true(x[0] == 6.0f && x[1] == -8.0f);
  OK(dt_mesh_all_reduce_host(m, 0, NULL, x, 2, DT_F32, DT_REDUCE_MAX));
  assert_true(x[0] == 6.0f);
  float* full = malloc(sizeof(float) * 1024 * 1024);
  assert_non_null(full);
  full[0] = 7.0f;
  OK(dt_tensor_gather_full(u, full, sizeof(float) * 1024 * 1024));
  assert_true(full[0] == 0.0f && full[1024 * 1024 - 1] == 0.0f);
  free(full);
  OK(dt_tensor_destroy(small));
  OK(dt_tensor_destroy(u));
  OK(dt_tensor_destroy(t));
  OK(dt_memory_stats(&after));
  for (int k = 0; k < DT_MEM_COUNT; k++) assert_int_equal(after.current[k], before.current[k]);
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
}

static void test_traffic_and_works(void** state) {
  (void)state;
  OK(dt_init_simulated(8, 0));
  int shape[2] = {2, 4};
  dt_mesh_t m;
  const char* names[2] = {"dp", "tp"};
  OK(dt_mesh_create(2, shape, names, NULL, &m));
  const int64_t ts[2] = {64, 16};
  dt_placement_t src[2] = {dt_replicate(), dt_shard(0)}, dst[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t t, u;
  OK(dt_tensor_rand(m, DT_F32, 2, ts, src, 1, &t));
  OK(dt_counters_reset(m));
  OK(dt_tensor_redistribute(t, dst, &u));
  dt_counters_t c;
  OK(dt_counters_get(m, &c));
  assert_int_equal(c.dim_calls[1][DT_COLL_ALL_GATHER], 1);
  assert_int_equal(c.dim_nbytes[1][DT_COLL_ALL_GATHER], 64 * 16 * 4); /* the gathered bytes */
  assert_int_equal(c.dim_calls[0][DT_COLL_ALL_GATHER], 0);
  OK(dt_tensor_destroy(u));
  /* asynchronous: done at the wait, or after polls */
  dt_work_t w;
  OK(dt_tensor_redistribute_async(t, dst, &u, &w));
  OK(dt_work_wait(w));
  OK(dt_work_destroy(w));
  OK(dt_tensor_destroy(u));
  OK(dt_tensor_redistribute_async(t, dst, &u, &w));
  int done = 0, polls = 0;
  while (!done && polls < 1000) {
    OK(dt_work_test(w, &done));
    polls++;
  }
  assert_true(done); /* the post polled once, this test a second time */
  assert_int_equal(polls, 1);
  OK(dt_work_destroy(w));
  OK(dt_tensor_destroy(u));
  OK(dt_tensor_destroy(t));
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
}

/* What review found: packing from meta memory into a host buffer sized as the source, meta and
 * host tensors mixed, a sub-mesh after the simulation ended, values only the root holds. */
static void test_edges(void** state) {
  (void)state;
  OK(dt_init_simulated(2, 1));
  int n = 2;
  dt_mesh_t m;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  /* S(0) -> S(1) of a 16 KiB tensor: the sends are packed (ASan/valgrind watch the zero source) */
  const int64_t sh[2] = {16, 256};
  dt_placement_t s0 = dt_shard(0), s1 = dt_shard(1);
  dt_tensor_t t, u;
  OK(dt_tensor_randn(m, DT_F32, 2, sh, &s0, 3, &t));
  OK(dt_tensor_redistribute(t, &s1, &u));
  OK(dt_tensor_destroy(u));
  /* a tensor in host memory (cpu backend) beside meta ones: ops refuse the mix, copies work */
  dt_backend_t cpu;
  OK(dt_backend_get("cpu", &cpu));
  float host[8 * 256];
  for (int i = 0; i < 8 * 256; i++) host[i] = 5.0f;
  const int64_t ls[2] = {8, 256};
  dt_tensor_t h;
  OK(dt_tensor_from_local_backend(m, cpu, DT_F32, 2, sh, &s0, host, ls, &h));
  dt_tensor_t sum = NULL;
  assert_int_equal(dt_add(t, h, &sum), DT_ERR_INVALID_ARG);
  assert_null(sum);
  const int64_t zero = 0, cnt = 8 * 256;
  OK(dt_tensor_copy_local(h, t, 1, &zero, &zero, &cnt)); /* meta -> host: zeros */
  assert_true(host[0] == 0.0f && host[8 * 256 - 1] == 0.0f);
  OK(dt_tensor_copy_local(t, h, 1, &zero, &zero, &cnt)); /* host -> meta: nothing to write */
  OK(dt_tensor_destroy(h));
  /* a shard only the source rank (0) holds reads as zeros on this rank (1): a scatter off the
   * root (a 4x4 tensor: real memory, so stale values would show) */
  const int64_t four[2] = {4, 4};
  dt_tensor_t d;
  OK(dt_tensor_distribute(m, DT_F32, 2, four, &s0, NULL, 0, &d));
  float got[8];
  for (int i = 0; i < 8; i++) got[i] = 1.0f;
  OK(dt_tensor_read_local(d, 0, 8, got));
  for (int i = 0; i < 8; i++) assert_true(got[i] == 0.0f);
  OK(dt_tensor_destroy(d));
  OK(dt_tensor_destroy(t));
  OK(dt_finalize());
  /* the mesh outlived its simulation: no new sub-mesh gets simulated communicators */
  int dims[1] = {0};
  dt_mesh_t f = NULL;
  assert_int_equal(dt_mesh_flatten(m, 1, dims, "all", &f), DT_ERR_NOT_INITIALIZED);
  assert_null(f);
  OK(dt_mesh_destroy(m));
}

static void test_model_step(void** state) {
  (void)state;
  OK(dt_init_simulated(8, 5));
  int n = 8;
  dt_mesh_t m;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 256;
  c.n_layers = 2;
  c.n_heads = 4;
  c.vocab = 1024;
  c.seq_len = 64;
  c.ffn_dim = 512;
  c.seed = 1;
  dt_llama_t model;
  dt_module_t root;
  OK(dt_llama_create(m, &c, "*=R", &model));
  OK(dt_llama_module(model, &root));
  dt_fsdp_config_t fc = dt_fsdp_config_default(1);
  OK(dt_fully_shard(root, m, &fc));
  dt_var_t* params;
  int np = 0;
  int64_t numel = 0;
  OK(dt_llama_params(model, &params, NULL, &np, &numel));
  dt_memory_stats_t ms;
  OK(dt_memory_stats(&ms));
  /* the sharded parameters: 1/8 of every one, padded to the group's 8-way split, rounded up to
   * the pool's 4 KiB when 64 KiB or more */
  int64_t shard = (numel + 7) / 8 * 4;
  assert_true(ms.current[DT_MEM_PARAMETERS] >= shard);
  assert_true(ms.current[DT_MEM_PARAMETERS] <= shard + 8 * 4096);
  dt_adamw_config_t ac = dt_adamw_config_default();
  dt_adamw_t opt;
  OK(dt_adamw_create(&ac, np, params, &opt));
  dt_tape_t tape;
  OK(dt_tape_create(&tape));
  const int64_t bs[2] = {8, 64};
  dt_placement_t s0 = dt_shard(0);
  dt_tensor_t tok, tgt;
  OK(dt_tensor_full_value(m, DT_I64, 2, bs, &s0, 0.0, &tok));
  OK(dt_tensor_full_value(m, DT_I64, 2, bs, &s0, 0.0, &tgt));
  dt_var_t loss;
  OK(dt_llama_forward(model, tape, tok, tgt, &loss, NULL));
  OK(dt_tape_backward(tape, loss));
  OK(dt_tape_reset(tape));
  double gn = -1;
  OK(dt_clip_grad_norm(np, params, 1.0, &gn));
  assert_true(gn == 0.0); /* gradients of meta values read as zeros */
  OK(dt_adamw_step(opt, 1e-3));
  OK(dt_memory_stats(&ms));
  assert_true(ms.peak[DT_MEM_ACTIVATIONS] > 0);
  assert_true(ms.current[DT_MEM_OPTIMIZER] >= 2 * shard); /* two moments of the shard */
  OK(dt_tensor_destroy(tok));
  OK(dt_tensor_destroy(tgt));
  OK(dt_tape_destroy(tape));
  OK(dt_adamw_destroy(opt));
  OK(dt_llama_destroy(model));
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
}

/* The simulated clock after an asynchronous all-gather of g (to Replicate) posted before
 * `products` products a x b and waited for after them (the clock reset first). */
static dt_sim_time_t gather_beside(dt_tensor_t g, dt_tensor_t a, dt_tensor_t b, int products) {
  dt_placement_t rr = dt_replicate();
  dt_tensor_t u, c;
  dt_work_t w;
  dt_sim_time_t t;
  OK(dt_sim_time_reset());
  OK(dt_tensor_redistribute_async(g, &rr, &u, &w));
  for (int i = 0; i < products; i++) {
    OK(dt_mm(a, b, &c));
    OK(dt_tensor_destroy(c));
  }
  OK(dt_work_wait(w));
  OK(dt_work_destroy(w));
  OK(dt_tensor_destroy(u));
  OK(dt_sim_time_get(&t));
  return t;
}

/* The simulated clock: kernels priced by the compute model, collectives by the cost model,
 * asynchronous ones hidden behind the compute done before their wait. */
static void test_step_time(void** state) {
  (void)state;
  dt_sim_time_t t;
  assert_int_equal(dt_sim_time_get(&t), DT_ERR_INVALID_USAGE); /* no simulation */
  assert_non_null(strstr(dt_last_error(), "dt_init_simulated"));
  assert_int_equal(dt_sim_time_reset(), DT_ERR_INVALID_USAGE);
  /* the compute model: checked, and kept through the cost model file */
  dt_compute_params_t cp0, cp = {100.0, 200.0, 1000.0, 2.0, 0.0, 1.0}, bad = cp;
  OK(dt_compute_model_get(&cp0));
  assert_true(cp0.gemm_gflops > 0 && cp0.mem_gbps > 0 && cp0.op_us >= 0);
  bad.mem_gbps = 0.0 / 0.0;
  assert_int_equal(dt_compute_model_set(&bad), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "mem_gbps"));
  bad = cp;
  bad.op_us = -1;
  assert_int_equal(dt_compute_model_set(&bad), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_compute_model_set(NULL), DT_ERR_INVALID_ARG);
  bad = cp;
  bad.attn_gflops = -1.0; /* 0 (the GEMM rate) or a rate */
  assert_int_equal(dt_compute_model_set(&bad), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "attn_gflops"));
  assert_true(cp0.attn_gflops == 0.0);
  assert_true(cp0.comm_overlap == 1.0); /* the default: collectives hidden where they can be */
  for (int k = 0; k < 3; k++) { /* a fraction: [0, 1] */
    bad = cp;
    bad.comm_overlap = k == 0 ? -0.1 : k == 1 ? 1.5 : 0.0 / 0.0;
    assert_int_equal(dt_compute_model_set(&bad), DT_ERR_INVALID_ARG);
    assert_non_null(strstr(dt_last_error(), "comm_overlap"));
  }
  const char* badov = "{\"compute\": {\"comm_overlap\": 2}}";
  assert_int_equal(dt_cost_model_load_string(badov, strlen(badov)), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "comm_overlap = 2 out of range [0, 1]"));
  const char* txt = "{\"compute\": {\"gemm_gflops\": 100, \"gemm_bf16_gflops\": 200, "
                    "\"mem_gbps\": 1000, \"op_us\": 2, \"attn_gflops\": 50, "
                    "\"comm_overlap\": 0.25}}";
  OK(dt_cost_model_load_string(txt, strlen(txt)));
  dt_compute_params_t got;
  OK(dt_compute_model_get(&got));
  assert_true(got.gemm_gflops == 100.0 && got.gemm_bf16_gflops == 200.0 &&
              got.mem_gbps == 1000.0 && got.op_us == 2.0 && got.attn_gflops == 50.0 &&
              got.comm_overlap == 0.25);
  const char* badattn = "{\"compute\": {\"attn_gflops\": \"fast\"}}";
  assert_int_equal(dt_cost_model_load_string(badattn, strlen(badattn)), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "attn_gflops"));
  const char* badtxt = "{\"compute\": {\"gemm_gflops\": -5}}";
  assert_int_equal(dt_cost_model_load_string(badtxt, strlen(badtxt)), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "gemm_gflops"));
  OK(dt_compute_model_get(&got));
  assert_true(got.gemm_gflops == 100.0); /* nothing applied */
  char path[] = "/tmp/dt_sim_cost_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  OK(dt_cost_model_save(path));
  OK(dt_cost_model_reset());
  OK(dt_compute_model_get(&got));
  assert_true(got.gemm_gflops == cp0.gemm_gflops);
  assert_true(got.attn_gflops == 0.0 && got.comm_overlap == 1.0);
  OK(dt_cost_model_load(path));
  OK(dt_compute_model_get(&got));
  assert_true(got.gemm_gflops == 100.0 && got.op_us == 2.0 && got.attn_gflops == 50.0 &&
              got.comm_overlap == 0.25);
  unlink(path);
  dt_cost_params_t ag = {10.0, 0.0, 1.0}; /* all-gathers: 10 us + bytes at 1 GB/s */
  OK(dt_cost_model_set(DT_COLL_ALL_GATHER, &ag));

  OK(dt_init_simulated(4, 1));
  OK(dt_sim_time_get(&t));
  assert_true(t.elapsed_us == 0.0 && t.ops == 0);
  int n = 4;
  dt_mesh_t m;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  dt_placement_t r = dt_replicate(), s0 = dt_shard(0);
  const int64_t as[2] = {64, 128}, bs[2] = {128, 32}, gs[2] = {64, 16};
  dt_tensor_t a, b, c, a16, b16, g, u, u2;
  OK(dt_tensor_rand(m, DT_F32, 2, as, &r, 1, &a));
  OK(dt_tensor_rand(m, DT_F32, 2, bs, &r, 2, &b));
  OK(dt_tensor_rand(m, DT_F32, 2, gs, &s0, 3, &g));
  OK(dt_sim_time_reset());
  /* one f32 product: 2 * 64 * 128 * 32 FLOPs at 100 GFLOP/s (its 56 KiB at 1000 GB/s are
   * faster) plus the op's 2 us */
  const double mm_us = 2.0 + 2.0 * 64 * 128 * 32 / 100e3;
  OK(dt_mm(a, b, &c));
  OK(dt_tensor_destroy(c));
  OK(dt_sim_time_get(&t));
  assert_int_equal(t.ops, 1);
  assert_true(t.flops == 2.0 * 64 * 128 * 32);
  assert_true(fabs(t.elapsed_us - mm_us) < 1e-9);
  assert_true(fabs(t.compute_us - mm_us) < 1e-9);
  assert_true(t.comm_us == 0.0 && t.exposed_comm_us == 0.0);
  /* bf16 operands at their own rate */
  OK(dt_cast(a, DT_BF16, &a16));
  OK(dt_cast(b, DT_BF16, &b16));
  OK(dt_sim_time_reset());
  OK(dt_mm(a16, b16, &c));
  OK(dt_tensor_destroy(c));
  OK(dt_sim_time_get(&t));
  assert_true(fabs(t.elapsed_us - (2.0 + 2.0 * 64 * 128 * 32 / 200e3)) < 1e-9);
  /* a kernel without FLOPs: its bytes (two inputs, one output) at 1000 GB/s */
  OK(dt_sim_time_reset());
  OK(dt_add(a, a, &c));
  OK(dt_tensor_destroy(c));
  OK(dt_sim_time_get(&t));
  assert_true(fabs(t.elapsed_us - (2.0 + 3.0 * 64 * 128 * 4 / 1000e3)) < 1e-9);
  assert_true(t.flops == 0.0 && t.nbytes == 3.0 * 64 * 128 * 4);
  /* in bf16 the host kernel computes on f32 copies: their bytes count too (2 + 4 per element of
   * each operand, beside the operands' own 2) */
  OK(dt_sim_time_reset());
  OK(dt_add(a16, a16, &c));
  OK(dt_tensor_destroy(c));
  OK(dt_sim_time_get(&t));
  assert_true(t.nbytes == 3.0 * 64 * 128 * 2 + 3.0 * 64 * 128 * 6);
  /* causal attention: the pairs the host kernel scores (blocks of 64 query rows, each up to the
   * keys its last row sees: of 130 rows, 64 x 64 + 64 x 128 + 2 x 130 per head), at attn_gflops
   * (50), forward 2 (D + E) FLOPs a pair and backward 2 (3 D + 2 E); 0 is the GEMM rate (100) */
  {
    const int64_t qs[4] = {1, 2, 130, 16}, cz[1] = {1};
    dt_tensor_t qkv[4], o, gr[3];
    for (int i = 0; i < 4; i++) OK(dt_tensor_rand(m, DT_F32, 4, qs, &r, 10 + (uint64_t)i, &qkv[i]));
    const double pairs = 2.0 * (64 * 64 + 64 * 128 + 2 * 130);
    OK(dt_sim_time_reset());
    OK(dt_op_run("sdpa", 3, qkv, 1, cz, 0, NULL, &o));
    OK(dt_tensor_destroy(o));
    OK(dt_sim_time_get(&t));
    assert_true(t.flops == pairs * 2.0 * 32);
    assert_true(fabs(t.elapsed_us - (2.0 + pairs * 2.0 * 32 / 50e3)) < 1e-9);
    OK(dt_sim_time_reset());
    OK(dt_op_run_multi("sdpa_grad", 4, qkv, 1, cz, 0, NULL, 3, gr));
    for (int i = 0; i < 3; i++) OK(dt_tensor_destroy(gr[i]));
    OK(dt_sim_time_get(&t));
    assert_true(t.flops == pairs * 2.0 * 80);
    assert_true(fabs(t.elapsed_us - (2.0 + pairs * 2.0 * 80 / 50e3)) < 1e-9);
    dt_compute_params_t gemm_rate = cp;
    OK(dt_compute_model_set(&gemm_rate)); /* attn_gflops 0 */
    OK(dt_sim_time_reset());
    OK(dt_op_run("sdpa", 3, qkv, 0, NULL, 0, NULL, &o)); /* no mask: 130 x 130 pairs a head */
    OK(dt_tensor_destroy(o));
    OK(dt_sim_time_get(&t));
    assert_true(t.flops == 2.0 * 130 * 130 * 2.0 * 32);
    assert_true(fabs(t.elapsed_us - (2.0 + 2.0 * 130 * 130 * 2.0 * 32 / 100e3)) < 1e-9);
    for (int i = 0; i < 4; i++) OK(dt_tensor_destroy(qkv[i]));
  }
  /* a blocking all-gather of 64 x 16 floats on 4 ranks: 10 us + 3/4 of 4096 bytes at 1 GB/s,
   * all of it exposed */
  const double ag_us = 10.0 + 0.75 * 4096 / 1e3;
  dt_placement_t rr = dt_replicate();
  OK(dt_sim_time_reset());
  OK(dt_tensor_redistribute(g, &rr, &u));
  OK(dt_tensor_destroy(u));
  OK(dt_sim_time_get(&t));
  assert_true(fabs(t.comm_us - ag_us) < 1e-9);
  assert_true(fabs(t.exposed_comm_us - ag_us) < 1e-9);
  assert_true(fabs(t.elapsed_us - t.compute_us - t.exposed_comm_us) < 1e-9);
  /* asynchronous, with one product before the wait: the product hides part of it */
  dt_work_t w, w2;
  t = gather_beside(g, a, b, 1);
  assert_true(fabs(t.elapsed_us - ag_us) < 1e-9);
  assert_true(fabs(t.exposed_comm_us - (ag_us - mm_us)) < 1e-9);
  /* with two products before the wait it is hidden entirely */
  t = gather_beside(g, a, b, 2);
  assert_true(fabs(t.elapsed_us - 2 * mm_us) < 1e-9);
  assert_true(t.exposed_comm_us == 0.0);
  /* two posted at once share the one communication stream: the second ends after both */
  OK(dt_sim_time_reset());
  OK(dt_tensor_redistribute_async(g, &rr, &u, &w));
  OK(dt_tensor_redistribute_async(g, &rr, &u2, &w2));
  OK(dt_work_wait(w2));
  OK(dt_work_wait(w));
  OK(dt_sim_time_get(&t));
  assert_true(fabs(t.elapsed_us - 2 * ag_us) < 1e-9);
  assert_true(fabs(t.comm_us - 2 * ag_us) < 1e-9);
  OK(dt_work_destroy(w));
  OK(dt_work_destroy(w2));
  OK(dt_tensor_destroy(u));
  OK(dt_tensor_destroy(u2));
  /* comm_overlap on the host: the fraction 1 - f of a collective occupies the rank when it is
   * posted; the rest runs beside the product (0: nothing hidden, all of it exposed) */
  for (int k = 0; k < 3; k++) {
    const double f = k == 0 ? 0.0 : k == 1 ? 0.5 : 0.9;
    dt_compute_params_t part = cp;
    part.comm_overlap = f;
    OK(dt_compute_model_set(&part));
    t = gather_beside(g, a, b, 1);
    const double busy = (1.0 - f) * ag_us, want = fmax(busy + mm_us, ag_us);
    assert_true(fabs(t.elapsed_us - want) < 1e-9);
    assert_true(fabs(t.exposed_comm_us - (want - mm_us)) < 1e-9);
    assert_true(fabs(t.comm_us - ag_us) < 1e-9);
  }
  OK(dt_compute_model_set(&cp));
  dt_tensor_t all[6] = {a, b, a16, b16, g, NULL};
  for (int i = 0; all[i]; i++) OK(dt_tensor_destroy(all[i]));
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
  assert_int_equal(dt_sim_time_get(&t), DT_ERR_INVALID_USAGE); /* the simulation ended */
  OK(dt_cost_model_reset());
}

static void test_ring_attention(void** state) {
  (void)state;
  OK(dt_init_simulated(4, 2));
  dt_mesh_t m;
  int n = 4;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  const int64_t sh[4] = {2, 4, 64, 16}; /* B, H, S, D: 8 rows per chunk */
  dt_placement_t pl[1] = {dt_shard(2)};
  for (int algo = 1; algo <= 2; algo++) {
    dt_tensor_t q, k, v;
    OK(dt_tensor_rand(m, DT_F32, 4, sh, pl, 1, &q));
    OK(dt_tensor_rand(m, DT_F32, 4, sh, pl, 2, &k));
    OK(dt_tensor_rand(m, DT_F32, 4, sh, pl, 3, &v));
    dt_tape_t tape;
    OK(dt_tape_create(&tape));
    dt_var_t vq, vk, vv, o, loss;
    OK(dt_var_leaf(q, 1, &vq));
    OK(dt_var_leaf(k, 1, &vk));
    OK(dt_var_leaf(v, 1, &vv));
    const dt_var_t in[3] = {vq, vk, vv};
    const int64_t a[5] = {0, 1, 0, 1, algo};
    OK(dt_counters_reset(m));
    OK(dt_sim_time_reset());
    OK(dt_ag_op(tape, "ring_attention", 3, in, 5, a, 0, NULL, 1, &o));
    dt_sim_time_t t;
    OK(dt_sim_time_get(&t));
    dt_counters_t c;
    OK(dt_counters_get(m, &c));
    const uint64_t kv = 2 * 4 * 16 * 16 * 4 * 2; /* this rank's k and v shards, bytes */
    /* forward: the ring's 2 x 2 chunk pairs per step, half of them masked but the own step's */
    const double pair = 2.0 * 2 * 4 * 8 * 8 * (16 + 16);
    if (algo == 1) {
      assert_int_equal(c.dim_calls[0][DT_COLL_SEND_RECV], 3);
      assert_int_equal(c.dim_nbytes[0][DT_COLL_SEND_RECV], 3 * kv);
      assert_true(fabs(t.flops - pair * (3 + 3 * 2)) < 1.0);
      assert_true(t.comm_us > 0.0 && t.elapsed_us >= t.compute_us);
    } else {
      assert_int_equal(c.dim_calls[0][DT_COLL_ALL_GATHER], 2);
      assert_int_equal(c.dim_nbytes[0][DT_COLL_ALL_GATHER], 4 * kv);
      assert_int_equal(c.dim_calls[0][DT_COLL_SEND_RECV], 0);
    }
    OK(dt_ag_op(tape, "sum", 1, &o, 0, NULL, 0, NULL, 1, &loss));
    OK(dt_tape_backward(tape, loss));
    OK(dt_counters_get(m, &c));
    if (algo == 1) {
      assert_int_equal(c.dim_calls[0][DT_COLL_SEND_RECV], 3 + 3 + 4);
      assert_int_equal(c.dim_nbytes[0][DT_COLL_SEND_RECV], (3 + 3 + 4) * kv);
    } else {
      assert_int_equal(c.dim_calls[0][DT_COLL_ALL_GATHER], 4);
      assert_int_equal(c.dim_calls[0][DT_COLL_REDUCE_SCATTER], 2);
      assert_int_equal(c.dim_nbytes[0][DT_COLL_REDUCE_SCATTER], 4 * kv);
    }
    assert_non_null(dt_var_grad(vq));
    OK(dt_tape_destroy(tape));
    OK(dt_var_destroy(vq));
    OK(dt_var_destroy(vk));
    OK(dt_var_destroy(vv));
  }
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
}

/* The most "other" bytes above the start while one f32 attention forward (1 x 2 x 64 x 16) runs
 * on a fresh simulated world playing `device` (NULL: the default). */
static int64_t sdpa_other_peak(const char* device) {
  OK(dt_init_simulated(1, 0));
  if (device != NULL) OK(dt_sim_set_device(device));
  int n = 1;
  dt_mesh_t m;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  const int64_t shape[4] = {1, 2, 64, 16};
  dt_placement_t r = dt_replicate();
  dt_tensor_t q, o;
  OK(dt_tensor_zeros(m, DT_F32, 4, shape, &r, &q));
  dt_memory_stats_t st;
  OK(dt_memory_reset_peak());
  OK(dt_memory_stats(&st));
  const int64_t start = st.current[DT_MEM_OTHER];
  OK(dt_sdpa(q, q, q, 0, 0.0, &o));
  OK(dt_memory_stats(&st));
  const int64_t held = st.peak[DT_MEM_OTHER] - start;
  /* tensors exist: too late to choose the device */
  assert_int_equal(dt_sim_set_device("cpu"), DT_ERR_INVALID_USAGE);
  assert_non_null(strstr(dt_last_error(), "before making tensors"));
  OK(dt_tensor_destroy(o));
  OK(dt_tensor_destroy(q));
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
  return held;
}

/* The step time of an asynchronous all-gather (64 x 16 floats from Shard(0) on 4 ranks: 10 us +
 * 3/4 of 4096 bytes at 1 GB/s) posted before a product (2 us + 2 x 64 x 128 x 32 FLOPs at 100
 * GFLOP/s) and waited for after it, with comm_overlap 0, on a fresh simulated world playing
 * `device` (NULL: the default). */
static double async_gather_us(const char* device) {
  OK(dt_init_simulated(4, 0));
  if (device != NULL) OK(dt_sim_set_device(device));
  const dt_compute_params_t cp = {100.0, 200.0, 1000.0, 2.0, 0.0, 0.0};
  const dt_cost_params_t ag = {10.0, 0.0, 1.0};
  OK(dt_compute_model_set(&cp));
  OK(dt_cost_model_set(DT_COLL_ALL_GATHER, &ag));
  int n = 4;
  dt_mesh_t m;
  OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  dt_placement_t r = dt_replicate(), s0 = dt_shard(0);
  const int64_t as[2] = {64, 128}, bs[2] = {128, 32}, gs[2] = {64, 16};
  dt_tensor_t a, b, g;
  OK(dt_tensor_rand(m, DT_F32, 2, as, &r, 1, &a));
  OK(dt_tensor_rand(m, DT_F32, 2, bs, &r, 2, &b));
  OK(dt_tensor_rand(m, DT_F32, 2, gs, &s0, 3, &g));
  const dt_sim_time_t t = gather_beside(g, a, b, 1);
  dt_tensor_t all[3] = {a, b, g};
  for (int i = 0; i < 3; i++) OK(dt_tensor_destroy(all[i]));
  OK(dt_mesh_destroy(m));
  OK(dt_finalize());
  OK(dt_cost_model_reset());
  return t.elapsed_us;
}

static void test_sim_device(void** state) {
  (void)state;
  assert_int_equal(dt_sim_set_device("cuda"), DT_ERR_INVALID_USAGE); /* no simulated world */
  assert_non_null(strstr(dt_last_error(), "dt_init_simulated"));
  OK(dt_init_simulated(2, 0));
  assert_int_equal(dt_sim_set_device(NULL), DT_ERR_INVALID_ARG);
  assert_int_equal(dt_sim_set_device("tpu"), DT_ERR_INVALID_ARG);
  assert_non_null(strstr(dt_last_error(), "unknown device 'tpu'"));
  OK(dt_sim_set_device("cpu"));
  const dt_status_t emu = dt_sim_set_device("cuda-emu");
  if (emu == DT_ERR_UNSUPPORTED) /* a build without the SIMT emulator */
    assert_non_null(strstr(dt_last_error(), "DTENSOR_CUDA"));
  OK(dt_finalize());
  const int64_t cpu = sdpa_other_peak(NULL);
  /* the output (2 x 64 x 16 f32, 8 KiB) and the host kernel's scores of one head (16 KiB) */
  assert_int_equal(cpu, 8192 + 16384);
  /* comm_overlap 0: the host runs the all-gather and the product one after the other */
  const double ag_us = 10.0 + 0.75 * 4096 / 1e3, mm_us = 2.0 + 2.0 * 64 * 128 * 32 / 100e3;
  assert_true(fabs(async_gather_us(NULL) - (ag_us + mm_us)) < 1e-9);
  if (emu == DT_ERR_UNSUPPORTED) return;
  /* a device's collectives run on their own stream whatever comm_overlap says */
  assert_true(fabs(async_gather_us("cuda-emu") - fmax(ag_us, mm_us)) < 1e-9);
  assert_int_equal(emu, DT_SUCCESS);
  /* the output and the GEMM path's f32 scores of both heads (2 x 64 x 64 x 4 bytes; P over them) */
  assert_int_equal(sdpa_other_peak("cuda-emu"), 8192 + 32768);
  assert_int_equal(sdpa_other_peak(NULL), cpu); /* dt_init_simulated went back to the cpu */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_args),
      cmocka_unit_test(test_memory_and_values),
      cmocka_unit_test(test_traffic_and_works),
      cmocka_unit_test(test_edges),
      cmocka_unit_test(test_model_step),
      cmocka_unit_test(test_step_time),
      cmocka_unit_test(test_ring_attention),
      cmocka_unit_test(test_sim_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

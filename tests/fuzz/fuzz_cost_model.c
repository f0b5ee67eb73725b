/* fuzz_cost_model.c - libFuzzer harness for the cost-model loader: the input goes through
 * dt_cost_model_load (from a temporary file, the whole load path), dt_cost_model_load_string
 * and dt_cost_model_check_string (which applies nothing), which must agree; a refused model changes nothing (collectives and the compute model); an
 * accepted one holds only values in the documented ranges, and with it every estimate is finite
 * and the planner finds every plan. */
#include <math.h>
#include <unistd.h>

#include "fuzz_common.h"

static char g_path[64];

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  snprintf(g_path, sizeof g_path, "/tmp/dt_fuzz_cost_%d.json", (int)getpid());
  return 0;
}

static void snapshot(dt_cost_params_t s[DT_COLL_COUNT][DT_ALGO_COUNT]) {
  memset(s, 0, sizeof(dt_cost_params_t) * DT_COLL_COUNT * DT_ALGO_COUNT);
  for (int c = 0; c < DT_COLL_COUNT; c++)
    for (int a = 0; a < DT_ALGO_COUNT; a++)
      dt_cost_model_get_algo((dt_collective_t)c, (dt_coll_algo_t)a, &s[c][a]);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dt_cost_model_reset();
  dt_cost_params_t before[DT_COLL_COUNT][DT_ALGO_COUNT], after[DT_COLL_COUNT][DT_ALGO_COUNT];
  dt_compute_params_t cbefore, cafter;
  snapshot(before);
  DT_FUZZ_ASSERT(dt_compute_model_get(&cbefore) == DT_SUCCESS);
  FILE* f = fopen(g_path, "wb");
  if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
  dt_status_t st = dt_cost_model_load(g_path);
  dt_fuzz_check_error(st, "dt_cost_model_load");
  snapshot(after);
  DT_FUZZ_ASSERT(dt_compute_model_get(&cafter) == DT_SUCCESS);
  dt_cost_model_reset();
  /* the check alone: the same verdict, nothing applied */
  dt_status_t st3 = dt_cost_model_check_string((const char*)data, size);
  dt_fuzz_check_error(st3, "dt_cost_model_check_string");
  dt_cost_params_t checked[DT_COLL_COUNT][DT_ALGO_COUNT];
  snapshot(checked);
  DT_FUZZ_ASSERT(memcmp(before, checked, sizeof before) == 0);
  dt_status_t st2 = dt_cost_model_load_string((const char*)data, size);
  dt_fuzz_check_error(st2, "dt_cost_model_load_string");
  DT_FUZZ_ASSERT(st == st2 && st == st3);
  if (st != DT_SUCCESS) {
    DT_FUZZ_ASSERT(st == DT_ERR_INVALID_ARG);
    DT_FUZZ_ASSERT(memcmp(before, after, sizeof before) == 0);
    DT_FUZZ_ASSERT(memcmp(&cbefore, &cafter, sizeof cbefore) == 0);
    return 0;
  }
  const double rates[4] = {cafter.gemm_gflops, cafter.gemm_bf16_gflops, cafter.mem_gbps,
                           cafter.attn_gflops == 0.0 ? 1.0 : cafter.attn_gflops};
  for (int i = 0; i < 4; i++) DT_FUZZ_ASSERT(rates[i] >= 1e-6 && rates[i] <= 1e9);
  DT_FUZZ_ASSERT(cafter.op_us >= 0.0 && cafter.op_us <= 1e6);
  DT_FUZZ_ASSERT(cafter.comm_overlap >= 0.0 && cafter.comm_overlap <= 1.0);
  for (int c = 0; c < DT_COLL_COUNT; c++)
    for (int a = 0; a < DT_ALGO_COUNT; a++) {
      const dt_cost_params_t* p = &after[c][a];
      if (a != DT_ALGO_NATIVE && c != DT_COLL_ALL_REDUCE && c != DT_COLL_REDUCE_SCATTER) continue;
      DT_FUZZ_ASSERT(p->base_us >= 0.0 && p->base_us <= 1e6);
      DT_FUZZ_ASSERT(p->hop_us >= 0.0 && p->hop_us <= 1e6);
      DT_FUZZ_ASSERT(p->bw_gbps >= 1e-6 && p->bw_gbps <= 1e6);
    }
  for (int c = 0; c < DT_COLL_COUNT; c++) {
    double est;
    DT_FUZZ_ASSERT(dt_cost_estimate((dt_collective_t)c, 1 << 20, UINT64_MAX, &est) == DT_SUCCESS);
    DT_FUZZ_ASSERT(isfinite(est) && est >= 0.0);
  }
  /* a (4, 2) mesh and a large tensor: every pair of {R, S0, S1, P} per dim that is legal plans */
  int ms[2] = {4, 2};
  dt_mesh_t mesh;
  DT_FUZZ_ASSERT(dt_mesh_create_abstract(2, ms, NULL, &mesh) == DT_SUCCESS);
  const int64_t shape[2] = {(int64_t)1 << 24, (int64_t)1 << 23};
  const dt_placement_t opts[4] = {dt_replicate(), dt_shard(0), dt_shard(1),
                                  dt_partial(DT_REDUCE_SUM)};
  for (int s = 0; s < 16; s++) {
    dt_placement_t from[2] = {opts[s % 4], opts[s / 4]};
    dt_placement_t to[2] = {dt_replicate(), dt_replicate()};
    dt_plan_t plan;
    dt_status_t pst = dt_plan_create(mesh, DT_F32, 2, shape, from, to, &plan);
    if (pst != DT_SUCCESS) {
      fprintf(stderr, "plan failed under an accepted cost model: %s\n", dt_last_error());
      abort();
    }
    double cost;
    DT_FUZZ_ASSERT(dt_plan_cost(plan, &cost) == DT_SUCCESS && isfinite(cost));
    dt_plan_destroy(plan);
  }
  dt_mesh_destroy(mesh);
  dt_cost_model_reset();
  return 0;
}

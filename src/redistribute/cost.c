/* cost.c - the communication cost model used by the planner, and its calibration file.
 *
 * A collective on n ranks moving B bytes (nccl-tests convention: all-gather output, reduce-scatter
 * input, all-reduce buffer, all-to-all send buffer) is estimated as
 *     base_us + hops(n) * hop_us + factor(n) * B / (bw_gbps * 1e3)     [microseconds]
 * with ring factors: all-gather, reduce-scatter, all-to-all hops = n-1, factor = (n-1)/n;
 * all-reduce hops = 2(n-1), factor = 2(n-1)/n. Local steps (slice, partition) cost B over the
 * memory bandwidth. A step on a mesh dim of size 1 moves nothing and costs 0.
 *
 * Defaults are PyTorch's CPU constants (every dim counts as inter-host: base 6.6 us, 2.7 us per
 * hop, 87.7 * 0.22 = 19.294 GB/s) so that plan orderings agree with PyTorch's; memory bandwidth
 * 7 GB/s (single-thread memcpy measured on the development machine, docs/environment.md).
 * `dtensor-calibrate` measures the machine and writes a JSON file that dt_init loads.
 */
#include <cJSON.h>
#include <stdio.h>

#include "redistribute/redistribute.h"

static const dt_cost_params_t dt__cost_defaults[DT_COLL_COUNT] = {
    [DT_COLL_LOCAL] = {0.0, 0.0, 7.0},
    [DT_COLL_ALL_GATHER] = {6.6, 2.7, 19.294},
    [DT_COLL_ALL_REDUCE] = {6.6, 2.7, 19.294},
    [DT_COLL_REDUCE_SCATTER] = {6.6, 2.7, 19.294},
    [DT_COLL_ALL_TO_ALL] = {6.6, 2.7, 19.294},
    [DT_COLL_BROADCAST] = {6.6, 2.7, 19.294},
    [DT_COLL_SCATTER] = {6.6, 2.7, 19.294},
};
_Static_assert(DT_COLL_COUNT == 7, "update the cost defaults and collective names");

static dt_cost_params_t dt__cost[DT_COLL_COUNT];
static int dt__cost_ready = 0;
static uint64_t dt__cost_gen = 1;

static void dt__cost_init(void) {
  if (!dt__cost_ready) {
    memcpy(dt__cost, dt__cost_defaults, sizeof dt__cost);
    dt__cost_ready = 1;
  }
}

uint64_t dt__cost_generation(void) { return dt__cost_gen; }

const char* dt_collective_name(dt_collective_t c) {
  static const char* const names[DT_COLL_COUNT] = {
      "local", "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast",
      "scatter"};
  return (c >= 0 && c < DT_COLL_COUNT) ? names[c] : "invalid";
}

void dt__cost_linear(dt_collective_t c, int n, double* a, double* b) {
  dt__cost_init();
  const dt_cost_params_t* p = &dt__cost[c];
  if (c == DT_COLL_LOCAL) {
    *a = 0.0;
    *b = 1.0 / (p->bw_gbps * 1e3);
    return;
  }
  if (n <= 1) {
    *a = *b = 0.0;
    return;
  }
  double hops = (c == DT_COLL_ALL_REDUCE) ? 2.0 * (n - 1) : (double)(n - 1);
  double factor = (c == DT_COLL_ALL_REDUCE) ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
  if (c == DT_COLL_BROADCAST) factor = 1.0;
  *a = p->base_us + hops * p->hop_us;
  *b = factor / (p->bw_gbps * 1e3);
}

double dt__cost_of(dt_collective_t c, int n, uint64_t nbytes) {
  double a, b;
  dt__cost_linear(c, n, &a, &b);
  return a + b * (double)nbytes;
}

static dt_status_t dt__coll_check(dt_collective_t c) {
  if (c < 0 || c >= DT_COLL_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "collective %d out of range [0, %d)", (int)c,
                   DT_COLL_COUNT);
  return DT_SUCCESS;
}

static dt_status_t dt__params_check(const dt_cost_params_t* p, const char* what) {
  /* Written so that NaN fails too. */
  if (!(p->base_us >= 0.0 && p->base_us < 1e9) || !(p->hop_us >= 0.0 && p->hop_us < 1e9) ||
      !(p->bw_gbps > 0.0 && p->bw_gbps < 1e6))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "%s: need base_us >= 0, hop_us >= 0 and 0 < bw_gbps < 1e6 (got %g, %g, %g)",
                   what, p->base_us, p->hop_us, p->bw_gbps);
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_get(dt_collective_t c, dt_cost_params_t* out) {
  DT_ARG_NOT_NULL(out);
  DT_CHECK(dt__coll_check(c));
  dt__cost_init();
  *out = dt__cost[c];
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_set(dt_collective_t c, const dt_cost_params_t* params) {
  DT_ARG_NOT_NULL(params);
  DT_CHECK(dt__coll_check(c));
  DT_CHECK(dt__params_check(params, dt_collective_name(c)));
  dt__cost_init();
  dt__cost[c] = *params;
  dt__cost_gen++;
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_reset(void) {
  memcpy(dt__cost, dt__cost_defaults, sizeof dt__cost);
  dt__cost_ready = 1;
  dt__cost_gen++;
  return DT_SUCCESS;
}

dt_status_t dt_cost_estimate(dt_collective_t c, int n, uint64_t nbytes, double* cost_us) {
  DT_ARG_NOT_NULL(cost_us);
  *cost_us = 0.0;
  DT_CHECK(dt__coll_check(c));
  if (n < 1) return DT_FAIL(DT_ERR_INVALID_ARG, "n = %d must be at least 1", n);
  *cost_us = dt__cost_of(c, n, nbytes);
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_load(const char* path) {
  DT_ARG_NOT_NULL(path);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return DT_FAIL(DT_ERR_IO, "cannot open cost model '%s'", path);
  char* text = NULL;
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  if (len < 0 || len > (1 << 20) || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return DT_FAIL(DT_ERR_IO, "cost model '%s' unreadable or larger than 1 MiB", path);
  }
  text = (char*)dt__malloc((size_t)len + 1);
  if (text == NULL) {
    fclose(f);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "reading '%s'", path);
  }
  size_t got = fread(text, 1, (size_t)len, f);
  fclose(f);
  text[got] = '\0';
  cJSON* root = cJSON_Parse(text);
  dt__free(text);
  if (root == NULL || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return DT_FAIL(DT_ERR_INVALID_ARG, "cost model '%s' is not a JSON object", path);
  }
  /* Parse everything first; apply only if every entry is valid (no half-loaded model). */
  dt_cost_params_t next[DT_COLL_COUNT];
  dt__cost_init();
  memcpy(next, dt__cost, sizeof next);
  dt_status_t st = DT_SUCCESS;
  for (int c = 0; c < DT_COLL_COUNT; c++) {
    cJSON* e = cJSON_GetObjectItemCaseSensitive(root, dt_collective_name((dt_collective_t)c));
    if (e == NULL) continue;
    cJSON* b = cJSON_GetObjectItemCaseSensitive(e, "base_us");
    cJSON* h = cJSON_GetObjectItemCaseSensitive(e, "hop_us");
    cJSON* w = cJSON_GetObjectItemCaseSensitive(e, "bw_gbps");
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(h) || !cJSON_IsNumber(w)) {
      st = DT_FAIL(DT_ERR_INVALID_ARG, "cost model '%s': \"%s\" needs numbers base_us, hop_us, "
                   "bw_gbps", path, dt_collective_name((dt_collective_t)c));
      break;
    }
    dt_cost_params_t p = {b->valuedouble, h->valuedouble, w->valuedouble};
    st = dt__params_check(&p, dt_collective_name((dt_collective_t)c));
    if (st != DT_SUCCESS) break;
    next[c] = p;
  }
  cJSON_Delete(root);
  if (st != DT_SUCCESS) return st;
  memcpy(dt__cost, next, sizeof next);
  dt__cost_gen++;
  return DT_SUCCESS;
}

dt_status_t dt_cost_model_save(const char* path) {
  DT_ARG_NOT_NULL(path);
  dt__cost_init();
  cJSON* root = cJSON_CreateObject();
  if (root == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "building JSON");
  for (int c = 0; c < DT_COLL_COUNT; c++) {
    cJSON* e = cJSON_AddObjectToObject(root, dt_collective_name((dt_collective_t)c));
    if (e == NULL || !cJSON_AddNumberToObject(e, "base_us", dt__cost[c].base_us) ||
        !cJSON_AddNumberToObject(e, "hop_us", dt__cost[c].hop_us) ||
        !cJSON_AddNumberToObject(e, "bw_gbps", dt__cost[c].bw_gbps)) {
      cJSON_Delete(root);
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "building JSON");
    }
  }
  char* text = cJSON_Print(root);
  cJSON_Delete(root);
  if (text == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "printing JSON");
  FILE* f = fopen(path, "wb");
  if (f == NULL) {
    cJSON_free(text);
    return DT_FAIL(DT_ERR_IO, "cannot write '%s'", path);
  }
  int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  ok = (fclose(f) == 0) && ok;
  cJSON_free(text);
  return ok ? DT_SUCCESS : DT_FAIL(DT_ERR_IO, "writing '%s' failed", path);
}

dt_status_t dt__cost_model_autoload(void) {
  const char* env = getenv("DTENSOR_COST_MODEL");
  if (env != NULL && strcmp(env, "none") == 0) return DT_SUCCESS; /* built-in defaults only */
  if (env != NULL && env[0] != '\0') return dt_cost_model_load(env);
  const char* home = getenv("HOME");
  if (home == NULL) return DT_SUCCESS;
  char path[1024];
  snprintf(path, sizeof path, "%s/.cache/dtensor/cost_model.json", home);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return DT_SUCCESS;
  fclose(f);
  return dt_cost_model_load(path);
}

/* test_backend_consistency.c - every op of the op table, forward and backward, on the cpu backend
 * and on the guarded backend, compared (ggml's test-backend-ops); any guard damage fails.
 *
 * Cases: the PyTorch fixtures (tests/reference/ops_fixtures.json) plus generated inputs for the
 * ops the fixtures do not hold (fused gradient ops, comparisons, dropout, cross-entropy in every
 * reduction mode, redistribute, ...); the test fails when an op of the table has no case. Each
 * case runs on the 1-D mesh (n) and at np 4 on (2, 2), for all-replicated inputs and a fixed
 * pseudo-random sample of placements (R, S(d), P(sum) for float inputs). The same inputs go to a
 * mesh on each backend; the gathered outputs, and for differentiable ops the input gradients of
 * L = sum(output * r), must be bit-identical: both backends run the same math, so any difference
 * is memory the guarded backend poisoned (an unwritten output element, a read after free) or
 * a write it caught. After every case dt_backend_verify must find every guard intact.
 * The rank-local ops from_local and all_to_all_single run with replicated inputs only (their
 * inputs' local shapes must fit together; all_to_all_single's splits are made per mesh: 6 rows
 * split unevenly, with an empty split at np 4).
 * In-place ops (adamw, scale_) run the same way and compare every input afterwards; the inputs
 * they update share one sampled placement (a 0-d input stays Replicate), the others are sampled
 * freely (a Partial gradient is reduced on the way in).
 */
#include <math.h>
#include <string.h>

#include "dt_test_fixture.h"

#define SAMPLES 6

typedef struct {
  const char* op;
  int nin;
  dt_dtype_t dtype[FX_MAXT];
  int ndim[FX_MAXT];
  int64_t shape[FX_MAXT][4];
  int64_t hi[FX_MAXT]; /* integer inputs: values in [0, hi) */
  int nia, nfa;
  int64_t iargs[8];
  double fargs[8];
  int redistribute; /* iargs: one encoded S(0) placement per mesh dim, filled per mesh */
} gen_case_t;

#define F DT_F32
#define L DT_I64
#define B DT_BF16
/* inputs for the ops the fixtures do not cover */
static const gen_case_t kGen[] = {
    {"mm_t", 2, {F, F}, {2, 2}, {{6, 5}, {6, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"eq", 2, {F, F}, {2, 2}, {{4, 5}, {4, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"ge", 2, {F, F}, {2, 2}, {{4, 5}, {1, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"gt", 2, {F, F}, {2, 2}, {{4, 5}, {4, 1}}, {0}, 0, 0, {0}, {0}, 0},
    {"gather_dim", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 0, 0, {0}, {0}, 0},
    {"dropout", 1, {F}, {2}, {{6, 8}}, {0}, 1, 1, {7}, {0.3}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {0}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {1}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {2}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {3}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {4}, {0}, 0},
    {"rms_norm_grad", 3, {F, F, F}, {2, 2, 1}, {{4, 6}, {4, 6}, {6}}, {0}, 0, 1, {0}, {1e-5}, 0},
    {"layer_norm_grad", 3, {F, F, F}, {2, 2, 1}, {{4, 6}, {4, 6}, {6}}, {0}, 0, 1, {0}, {1e-5}, 0},
    {"embedding_grad", 2, {F, L}, {3, 2}, {{3, 5, 4}, {3, 5}}, {0, 7}, 1, 0, {7}, {0}, 0},
    {"sdpa_grad", 4, {F, F, F, F}, {4, 4, 4, 4},
     {{2, 2, 4, 3}, {2, 1, 4, 3}, {2, 1, 4, 3}, {2, 2, 4, 3}}, {0}, 2, 0, {1, 0}, {0}, 0},
    {"cross_entropy", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 1, 0, {0}, {0}, 0},
    {"cross_entropy", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 1, 0, {1}, {0}, 0},
    {"cross_entropy", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 1, 0, {2}, {0}, 0},
    {"redistribute", 1, {F}, {2}, {{7, 4}}, {0}, 0, 0, {0}, {0}, 1},
    {"grouped_mm", 3, {F, F, L}, {2, 3, 1}, {{6, 4}, {3, 5, 4}, {3}}, {0, 0, 7}, 1, 0, {1}, {0}, 0},
    {"grouped_mm", 3, {F, F, L}, {2, 3, 1}, {{6, 4}, {3, 4, 5}, {3}}, {0, 0, 7}, 1, 0, {0}, {0}, 0},
    {"grouped_mm_wgrad", 3, {F, F, L}, {2, 2, 1}, {{6, 4}, {6, 5}, {3}}, {0, 0, 7}, 0, 0, {0}, {0}, 0},
    {"moe_route", 1, {L}, {2}, {{5, 2}}, {3}, 2, 0, {3, 0}, {0}, 0},
    {"moe_route", 1, {L}, {2}, {{5, 2}}, {3}, 2, 0, {3, 2}, {0}, 0},
    {"index_add", 3, {F, L, F}, {2, 1, 2}, {{5, 4}, {6}, {6, 4}}, {0, 5}, 0, 0, {0}, {0}, 0},
    {"to_local", 1, {F}, {2}, {{7, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"from_local", 2, {F, F}, {2, 2}, {{6, 4}, {6, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"all_to_all_single", 2, {F, L}, {2, 1}, {{6, 3}, {0}}, {0, 1}, 1, 0, {0}, {0}, 0},
    {"sumsq", 1, {F}, {2}, {{7, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"scale_", 1, {F}, {2}, {{7, 4}}, {0}, 0, 1, {0}, {-0.75}, 0},
    {"adamw", 5, {F, F, F, F, L}, {2, 2, 2, 2, 0}, {{5, 6}, {5, 6}, {5, 6}, {5, 6}, {0}},
     {0, 0, 0, 0, 4}, 0, 5, {0}, {1e-2, 0.9, 0.999, 1e-8, 0.1}, 0},
    {"adamw", 5, {F, F, B, B, L}, {2, 2, 2, 2, 0}, {{5, 6}, {5, 6}, {5, 6}, {5, 6}, {0}},
     {0, 0, 0, 0, 4}, 0, 5, {0}, {1e-2, 0.9, 0.95, 1e-6, 0.0}, 0},
};
#undef F
#undef L
#undef B

static int g_rank;
static dt_backend_t g_cpu, g_guard;
static long long g_outputs, g_grads, g_exact_checks;
static char g_seen[256][32];
static int g_nseen;

static void seen(const char* op) {
  for (int i = 0; i < g_nseen; i++)
    if (strcmp(g_seen[i], op) == 0) return;
  snprintf(g_seen[g_nseen++], sizeof g_seen[0], "%s", op);
}

/* Deterministic inputs: small multiples of 1/8 (exact in bf16) with repeats (ties for the
 * comparisons), integers in [0, hi); the grouped GEMMs' counts (2, 0, 4) sum to their 6 rows. */
static void gen_tensor(const gen_case_t* g, int t, int k, fx_tensor_t* x) {
  x->dtype = g->dtype[t];
  x->ndim = g->ndim[t];
  x->numel = 1;
  for (int d = 0; d < x->ndim; d++) {
    x->shape[d] = g->shape[t][d];
    x->numel *= x->shape[d];
  }
  x->data = malloc(sizeof(double) * (size_t)(x->numel ? x->numel : 1));
  for (int64_t i = 0; i < x->numel; i++) {
    int64_t h = (i * 37 + t * 11 + k * 5) % 23;
    x->data[i] = x->dtype == DT_I64 ? (double)(h % g->hi[t]) : (double)(h % 9 - 4) * 0.125 + 0.0625;
    if (strcmp(g->op, "adamw") == 0 && t == 3) x->data[i] = fabs(x->data[i]); /* exp_avg_sq */
    if (strncmp(g->op, "grouped_mm", 10) == 0 && t == 2) x->data[i] = (double)(i == 0 ? 2 : i == 1 ? 0 : 4);
  }
}

static void gathered(dt_tensor_t t, void** buf, size_t* nb) {
  dt_dtype_t dt;
  int nd;
  int64_t shape[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_dtype(t, &dt));
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  for (int d = 0; d < nd; d++) n *= shape[d];
  *nb = fx_itemsize(dt) * (size_t)n;
  *buf = malloc(*nb ? *nb : 1);
  DT_ASSERT_OK(dt_tensor_full(t, *buf, *nb));
}

/* The two backends' tensors hold the same bytes. */
static void same(dt_tensor_t a, dt_tensor_t b, const char* what, const char* op, int combo) {
  void *x, *y;
  size_t nx, ny;
  gathered(a, &x, &nx);
  gathered(b, &y, &ny);
  DT_ASSERT_EQ(nx, ny);
  if (memcmp(x, y, nx) != 0) {
    dt_dtype_t dt;
    dt_tensor_dtype(a, &dt);
    size_t item = fx_itemsize(dt);
    for (size_t i = 0; i < nx / item; i++)
      if (memcmp((char*)x + i * item, (char*)y + i * item, item) != 0)
        DT_ASSERT_TRUE(0, "%s (combo %d): %s element %zu: cpu %.9g, guarded %.9g", op, combo,
                       what, i, fx_unpack(x, dt, (int64_t)i), fx_unpack(y, dt, (int64_t)i));
  }
  g_exact_checks++;
  free(x);
  free(y);
}

/* Runs op once on each backend's mesh with the same inputs and placements; compares outputs and,
 * when `grad`, the input gradients of sum(out0 * r). */
static void run_pair(dt_mesh_t mc, dt_mesh_t mg, const char* op, int nin, const fx_tensor_t* in,
                     void* const* packed, dt_placement_t pl[][DT_MAX_MESH_DIMS], int nia,
                     const int64_t* iargs, int nfa, const double* fargs, int nout, int grad,
                     int combo) {
  dt_mesh_t meshes[2] = {mc, mg};
  dt_tape_t tape[2];
  dt_var_t v[2][FX_MAXT], outs[2][3], loss[2];
  for (int b = 0; b < 2; b++) {
    DT_ASSERT_OK(dt_tape_create(&tape[b]));
    for (int t = 0; t < nin; t++) {
      dt_tensor_t x;
      DT_ASSERT_OK(dt_tensor_from_full(meshes[b], in[t].dtype, in[t].ndim, in[t].shape, pl[t],
                                       packed[t], &x));
      int rg = grad && (in[t].dtype == DT_F32 || in[t].dtype == DT_BF16);
      DT_ASSERT_OK(dt_var_leaf(x, rg, &v[b][t]));
    }
    dt_status_t st = dt_ag_op(tape[b], op, nin, v[b], nia, iargs, nfa, fargs, nout, outs[b]);
    DT_ASSERT_TRUE(st == DT_SUCCESS, "%s on the %s backend (combo %d): %s", op,
                   b ? "guarded" : "cpu", combo, dt_last_error());
  }
  char what[64];
  for (int o = 0; o < nout; o++) {
    snprintf(what, sizeof what, "output %d", o);
    same(dt_var_value(outs[0][o]), dt_var_value(outs[1][o]), what, op, combo);
    g_outputs++;
  }
  dt_dtype_t odt;
  DT_ASSERT_OK(dt_tensor_dtype(dt_var_value(outs[0][0]), &odt));
  int any_float = 0;
  for (int t = 0; t < nin; t++) any_float |= in[t].dtype == DT_F32 || in[t].dtype == DT_BF16;
  if (grad && any_float && (odt == DT_F32 || odt == DT_BF16)) {
    for (int b = 0; b < 2; b++) {
      dt_tensor_t o0 = dt_var_value(outs[b][0]);
      int nd;
      int64_t shape[DT_MAX_DIMS];
      DT_ASSERT_OK(dt_tensor_ndim(o0, &nd));
      DT_ASSERT_OK(dt_tensor_shape(o0, shape));
      fx_tensor_t r = {odt, nd, {0}, 1, NULL};
      for (int d = 0; d < nd; d++) r.numel *= r.shape[d] = shape[d];
      r.data = malloc(sizeof(double) * (size_t)(r.numel ? r.numel : 1));
      for (int64_t i = 0; i < r.numel; i++) r.data[i] = (double)((i * 7) % 5 - 2) * 0.25;
      void* rp = fx_pack(&r);
      dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
      dt_tensor_t rt;
      DT_ASSERT_OK(dt_tensor_from_full(meshes[b], odt, nd, shape, rep, rp, &rt));
      free(rp);
      free(r.data);
      dt_var_t rv, prod, pair[2];
      DT_ASSERT_OK(dt_tape_constant(tape[b], rt, &rv));
      pair[0] = outs[b][0];
      pair[1] = rv;
      DT_ASSERT_OK(dt_ag_op(tape[b], "mul", 2, pair, 0, NULL, 0, NULL, 1, &prod));
      const int64_t all[1] = {0};
      DT_ASSERT_OK(dt_ag_op(tape[b], "sum", 1, &prod, 1, all, 0, NULL, 1, &loss[b]));
      DT_ASSERT_OK(dt_tape_backward(tape[b], loss[b]));
    }
    for (int t = 0; t < nin; t++) {
      dt_tensor_t ga = dt_var_grad(v[0][t]), gb = dt_var_grad(v[1][t]);
      DT_ASSERT_TRUE((ga == NULL) == (gb == NULL), "%s: input %d has a gradient on one backend only",
                     op, t);
      if (ga == NULL) continue;
      snprintf(what, sizeof what, "gradient of input %d", t);
      same(ga, gb, what, op, combo);
      g_grads++;
    }
  }
  for (int b = 0; b < 2; b++) {
    DT_ASSERT_OK(dt_tape_destroy(tape[b]));
    for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_var_destroy(v[b][t]));
  }
  int64_t n_err = 0;
  dt_status_t st = dt_backend_verify(g_guard, &n_err);
  DT_ASSERT_TRUE(st == DT_SUCCESS && n_err == 0, "%s (combo %d): guard damage: %s", op, combo,
                 dt_last_error());
}

/* An in-place op on both backends: every input compared afterwards. 0 when the op refused the
 * placements (the same way on both). */
static int run_inplace_pair(dt_mesh_t mc, dt_mesh_t mg, const char* op, int nin,
                            const fx_tensor_t* in, void* const* packed,
                            dt_placement_t pl[][DT_MAX_MESH_DIMS], int nia, const int64_t* iargs,
                            int nfa, const double* fargs, int combo) {
  dt_mesh_t meshes[2] = {mc, mg};
  dt_tensor_t x[2][FX_MAXT];
  dt_status_t st[2];
  for (int b = 0; b < 2; b++) {
    for (int t = 0; t < nin; t++)
      DT_ASSERT_OK(dt_tensor_from_full(meshes[b], in[t].dtype, in[t].ndim, in[t].shape, pl[t],
                                       packed[t], &x[b][t]));
    st[b] = dt_op_run_multi(op, nin, x[b], nia, iargs, nfa, fargs, 0, NULL);
  }
  DT_ASSERT_TRUE(st[0] == st[1], "%s (combo %d): cpu says %s, guarded %s", op, combo,
                 dt_status_name(st[0]), dt_status_name(st[1]));
  DT_ASSERT_TRUE(st[0] == DT_SUCCESS || st[0] == DT_ERR_INVALID_ARG, "%s (combo %d): %s", op,
                 combo, dt_last_error());
  char what[64];
  for (int t = 0; t < nin && st[0] == DT_SUCCESS; t++) {
    snprintf(what, sizeof what, "input %d after the update", t);
    same(x[0][t], x[1][t], what, op, combo);
    g_outputs++;
  }
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_tensor_destroy(x[b][t]));
  int64_t n_err = 0;
  dt_status_t vs = dt_backend_verify(g_guard, &n_err);
  DT_ASSERT_TRUE(vs == DT_SUCCESS && n_err == 0, "%s (combo %d): guard damage: %s", op, combo,
                 dt_last_error());
  return st[0] == DT_SUCCESS;
}

/* Runs a case on a mesh pair: all-R and SAMPLES pseudo-random placement combinations. */
static void run_case(const char* op, int nin, const fx_tensor_t* in, int nia, const int64_t* iargs,
                     int nfa, const double* fargs, dt_mesh_t mc, dt_mesh_t mg, int m) {
  dt_op_desc_t d;
  DT_ASSERT_OK(dt_op_describe(op, &d));
  int nout = d.n_outputs, grad = d.has_backward, ran = 0;
  void* packed[FX_MAXT];
  for (int t = 0; t < nin; t++) packed[t] = fx_pack(&in[t]);
  long long total = 1;
  for (int t = 0; t < nin; t++)
    for (int i = 0; i < m; i++) total *= fx_n_options(&in[t]);
  uint64_t lcg = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(op) * 2654435761u ^ (uint64_t)nia;
  int replicated_only = strcmp(op, "from_local") == 0 || strcmp(op, "all_to_all_single") == 0;
  for (int r = 0; r <= SAMPLES && r < total && (r == 0 || !replicated_only); r++) {
    long long combo = 0;
    if (r > 0) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      combo = (long long)((lcg >> 11) % (uint64_t)total);
    }
    dt_placement_t pl[FX_MAXT][DT_MAX_MESH_DIMS];
    long long v = combo;
    for (int t = 0; t < nin; t++)
      for (int i = 0; i < m; i++) {
        int k = fx_n_options(&in[t]);
        pl[t][i] = fx_option(&in[t], (int)(v % k));
        v /= k;
      }
    if (d.in_place) { /* the updated inputs take input 0's placements (0-d ones: R) */
      for (int t = 1; t < nin; t++)
        for (int i = 0; i < m && (d.in_place & (1u << t)); i++)
          pl[t][i] = in[t].ndim == 0 ? dt_replicate() : pl[0][i];
      ran += run_inplace_pair(mc, mg, op, nin, in, packed, pl, nia, iargs, nfa, fargs,
                              (int)combo);
      continue;
    }
    run_pair(mc, mg, op, nin, in, packed, pl, nia, iargs, nfa, fargs, nout, grad, (int)combo);
  }
  DT_ASSERT_TRUE(!d.in_place || ran > 0, "%s: every sampled placement was refused", op);
  for (int t = 0; t < nin; t++) free(packed[t]);
  seen(op);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_backend_get("cpu", &g_cpu));
  DT_ASSERT_OK(dt_backend_get("guarded", &g_guard));
  cJSON* root = dt_test_load_json(DT_FIXTURES);
  const cJSON* cases = cJSON_GetObjectItem(root, "cases");
  for (int m = 1; m <= 2; m++) {
    if (m == 2 && world % 2 != 0) continue;
    int shape[2] = {m == 1 ? world : 2, world / 2};
    dt_mesh_t mc, mg;
    DT_ASSERT_OK(dt_mesh_create(m, shape, NULL, NULL, &mc));
    DT_ASSERT_OK(dt_mesh_create(m, shape, NULL, NULL, &mg));
    DT_ASSERT_OK(dt_mesh_set_backend(mc, g_cpu));
    DT_ASSERT_OK(dt_mesh_set_backend(mg, g_guard));
    for (int k = 0; k < cJSON_GetArraySize(cases); k++) {
      const cJSON* c = cJSON_GetArrayItem(cases, k);
      const cJSON* ji = cJSON_GetObjectItem(c, "inputs");
      int nin = cJSON_GetArraySize(ji), nia, nfa;
      int64_t iargs[8];
      double fargs[8];
      fx_args(c, &nia, iargs, &nfa, fargs);
      fx_tensor_t in[FX_MAXT];
      for (int t = 0; t < nin; t++) fx_load_tensor(cJSON_GetArrayItem(ji, t), &in[t]);
      run_case(cJSON_GetObjectItem(c, "op")->valuestring, nin, in, nia, iargs, nfa, fargs, mc, mg,
               m);
      for (int t = 0; t < nin; t++) free(in[t].data);
    }
    for (size_t k = 0; k < sizeof kGen / sizeof kGen[0]; k++) {
      const gen_case_t* g = &kGen[k];
      fx_tensor_t in[FX_MAXT];
      for (int t = 0; t < g->nin; t++) gen_tensor(g, t, (int)k, &in[t]);
      int64_t iargs[8];
      int nia = g->nia;
      memcpy(iargs, g->iargs, sizeof iargs);
      if (g->redistribute) {
        nia = m;
        for (int i = 0; i < m; i++) iargs[i] = dt_placement_encode(dt_shard(i % 2));
      }
      if (strcmp(g->op, "all_to_all_single") == 0) { /* splits of 6 rows over mesh dim 0 */
        static const double kSplit2[2] = {2, 4}, kSplit4[4] = {1, 2, 0, 3};
        int n = shape[0];
        in[1].shape[0] = in[1].numel = n;
        free(in[1].data);
        in[1].data = malloc(sizeof(double) * (size_t)n);
        for (int j = 0; j < n; j++) in[1].data[j] = n == 2 ? kSplit2[j] : n == 4 ? kSplit4[j] : 0;
        if (n != 2 && n != 4) in[1].data[0] = 6;
      }
      run_case(g->op, g->nin, in, nia, iargs, g->nfa, g->fargs, mc, mg, m);
      for (int t = 0; t < g->nin; t++) free(in[t].data);
    }
    DT_ASSERT_OK(dt_mesh_destroy(mc));
    DT_ASSERT_OK(dt_mesh_destroy(mg));
  }
  cJSON_Delete(root);
  /* every op of the table ran */
  int n;
  DT_ASSERT_OK(dt_op_count(&n));
  for (int i = 0; i < n; i++) {
    const char* name;
    DT_ASSERT_OK(dt_op_name_at(i, &name));
    int found = 0;
    for (int k = 0; k < g_nseen; k++) found |= strcmp(g_seen[k], name) == 0;
    DT_ASSERT_TRUE(found, "op %s has no consistency case", name);
  }
  if (g_rank == 0)
    printf("test_backend_consistency np=%d: %d ops, %lld outputs and %lld gradients bit-identical "
           "on the cpu and guarded backends (%lld comparisons), guards intact\n", world, n,
           g_outputs, g_grads, g_exact_checks);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

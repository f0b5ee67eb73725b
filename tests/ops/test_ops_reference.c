/* test_ops_reference.c - every built-in op against PyTorch (np 2 and 4; the special cases also np 3).
 *
 * tests/reference/ops_fixtures.json holds inputs and PyTorch 1.13's outputs for each op (written by
 * tests/reference/make_fixtures.py); built as test_ops_special, the program replays
 * special_fixtures.json instead (tests/reference/make_special_fixtures.py: NaN, infinities, empty
 * dims, casts, bad indices). Each case runs on the 1-D mesh (n) and, at an even np, the 2-D mesh
 * (2, n/2), for many placement combinations of its inputs: per mesh dim each input takes R, S(d)
 * for any of its dims, or P(sum) (float inputs). When a case has more combinations than LIMIT, a
 * fixed pseudo-random subset (always with all-R) is used. The gathered outputs must match PyTorch
 * within the case's tolerance (|got - want| <= atol + rtol |want|; NaN where PyTorch has NaN, the
 * same infinity; integers exactly), have PyTorch's shape and dtype, and every rank must see the
 * same result. A case with "partial": [rtol, atol] (bf16/f16) uses that looser tolerance where an
 * input or the output is Partial(sum): each rank's partial result is rounded to the dtype before
 * the sum, and a Partial input is made as PyTorch makes one (the value divided by the mesh dim's
 * size). A case with "device": [rtol, atol] takes at least that tolerance where the tensors live
 * on a GPU (bf16/f16 sdpa: the tensor-core kernel rounds the attention weights to the dtype, as
 * flash attention does). A case with "error" (PyTorch raises) must fail with that status and a message on
 * every rank, for every combination. For the differentiable ops, the first 12 combinations also
 * run the backward pass through the tape: the gradients of L = sum(output * r) equal PyTorch's
 * within 1e-4 absolute + 1e-4 relative, or the case's "grad_tol" [rtol, atol] (bf16: the
 * gradients are bf16 as PyTorch's, rounded at each op of the backward pass); non-finite ones
 * exactly. Each input has its own dtype: cases whose inputs differ in dtype check PyTorch's type
 * promotion (the output in the result dtype, each input's gradient in that input's dtype).
 */
#include <math.h>
#include <string.h>

#include "dt_test_fixture.h"

#define LIMIT 40
#define MAXT FX_MAXT
#ifndef DT_MIN_CASES
#define DT_MIN_CASES 60 /* a truncated fixture file fails */
#endif

static int g_rank;
static long long g_grad_checks;

/* Backward check: leaves placed as pl, L = sum(output0 * r) with r from the fixture, gradients
 * of the float inputs against PyTorch's (|got - want| <= 1e-4 + 1e-4 |want|). */
static void run_backward(const cJSON* c, dt_mesh_t mesh, int m, int nin, const fx_tensor_t* in,
                         void* const* packed, dt_placement_t pl[][DT_MAX_MESH_DIMS]) {
  const char* name = cJSON_GetObjectItem(c, "name")->valuestring;
  const char* op = cJSON_GetObjectItem(c, "op")->valuestring;
  const cJSON *jg = cJSON_GetObjectItem(c, "grads"), *jw = cJSON_GetObjectItem(c, "grad_weights");
  const cJSON* jo = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "outputs"), 0);
  int nia, nfa;
  int64_t iargs[8];
  double fargs[4];
  fx_args(c, &nia, iargs, &nfa, fargs);
  dt_var_t v[MAXT], outs[3], out, prod, loss, rv;
  int nout = cJSON_GetArraySize(cJSON_GetObjectItem(c, "outputs"));
  const cJSON* jt = cJSON_GetObjectItem(c, "grad_tol"); /* [rtol, atol]; 1e-4 both unless given */
  const double grtol = jt ? fx_num(cJSON_GetArrayItem(jt, 0)) : 1e-4;
  const double gatol = jt ? fx_num(cJSON_GetArrayItem(jt, 1)) : 1e-4;
  for (int t = 0; t < nin; t++) {
    dt_tensor_t x;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, in[t].dtype, in[t].ndim, in[t].shape, pl[t], packed[t],
                                     &x));
    DT_ASSERT_OK(dt_var_leaf(x, !cJSON_IsNull(cJSON_GetArrayItem(jg, t)), &v[t]));
  }
  fx_tensor_t r;
  fx_load_tensor(jo, &r); /* the output's shape; data replaced by the weights */
  for (int64_t i = 0; i < r.numel; i++) r.data[i] = fx_num(cJSON_GetArrayItem(jw, (int)i));
  /* r in the output's dtype (the result dtype where the inputs' dtypes differ: type promotion;
   * the fixture's bf16/f16 weights are exact in that dtype, and PyTorch's dL/doutput is r rounded
   * to the output's dtype) */
  void* rp = fx_pack(&r);
  dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  dt_tensor_t rt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, r.dtype, r.ndim, r.shape, rep, rp, &rt));
  DT_ASSERT_OK(dt_var_leaf(rt, 0, &rv));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_ag_op(tape, op, nin, v, nia, iargs, nfa, fargs, nout, outs));
  out = outs[0]; /* topk: the values */
  dt_var_t pair[2] = {out, rv};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, pair, 0, NULL, 0, NULL, 1, &prod));
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &prod, 1, all, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  for (int t = 0; t < nin; t++) {
    const cJSON* want = cJSON_GetArrayItem(jg, t);
    if (cJSON_IsNull(want)) continue;
    DT_ASSERT_TRUE(dt_var_grad(v[t]) != NULL, "case %s: input %d has no gradient", name, t);
    dt_dtype_t gdt; /* the input's dtype, as PyTorch's gradients */
    DT_ASSERT_OK(dt_tensor_dtype(dt_var_grad(v[t]), &gdt));
    DT_ASSERT_EQ(gdt, in[t].dtype);
    size_t nb = fx_itemsize(gdt) * (size_t)(in[t].numel ? in[t].numel : 1);
    void* got = malloc(nb);
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(v[t]), got, nb));
    for (int64_t i = 0; i < in[t].numel; i++) {
      double w = fx_num(cJSON_GetArrayItem(want, (int)i)), g = fx_unpack(got, gdt, i);
      if (!fx_close(g, w, gatol, grtol)) {
        char b[64] = "";
        dt_placements_format(pl[t], m, ",", b, sizeof b);
        DT_ASSERT_TRUE(0, "case %s (%s) gradient of input %d [%s] element %lld: %.8g vs torch %.8g",
                       name, op, t, b, (long long)i, g, w);
      }
    }
    free(got);
    g_grad_checks++;
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_var_destroy(v[t]));
  DT_ASSERT_OK(dt_var_destroy(rv));
  free(rp);
  free(r.data);
}

static long long run_case(const cJSON* c, dt_mesh_t mesh, int m) {
  dt_backend_t be;
  dt_device_t dev;
  DT_ASSERT_OK(dt_mesh_backend(mesh, &be));
  DT_ASSERT_OK(dt_backend_device(be, &dev));
  const int on_device = dev == DT_DEVICE_CUDA;
  const char* name = cJSON_GetObjectItem(c, "name")->valuestring;
  const char* op = cJSON_GetObjectItem(c, "op")->valuestring;
  double rtol = cJSON_GetObjectItem(c, "rtol")->valuedouble;
  double atol = cJSON_GetObjectItem(c, "atol")->valuedouble;
  const cJSON *ji = cJSON_GetObjectItem(c, "inputs"), *jo = cJSON_GetObjectItem(c, "outputs");
  int nin = cJSON_GetArraySize(ji), nout = cJSON_GetArraySize(jo);
  const cJSON* jerr = cJSON_GetObjectItem(c, "error");
  if (jerr != NULL) { /* no outputs in the file: the op's count */
    dt_op_desc_t desc;
    DT_ASSERT_OK(dt_op_describe(op, &desc));
    nout = desc.n_outputs;
  }
  int nia, nfa;
  int64_t iargs[8];
  double fargs[4];
  fx_args(c, &nia, iargs, &nfa, fargs);
  fx_tensor_t in[MAXT], out[3];
  void* packed[MAXT];
  for (int t = 0; t < nin; t++) {
    fx_load_tensor(cJSON_GetArrayItem(ji, t), &in[t]);
    packed[t] = fx_pack(&in[t]);
  }
  for (int o = 0; o < nout && jerr == NULL; o++) fx_load_tensor(cJSON_GetArrayItem(jo, o), &out[o]);
  /* combinations: per input, per mesh dim, one option (mixed radix) */
  long long total = 1;
  for (int t = 0; t < nin; t++)
    for (int i = 0; i < m; i++) total *= fx_n_options(&in[t]);
  long long runs = total < LIMIT ? total : LIMIT;
  uint64_t lcg = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(name) * 1315423911u;
  for (long long r = 0; r < runs; r++) {
    long long combo = r;
    if (total > LIMIT && r > 0) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      combo = (long long)((lcg >> 11) % (uint64_t)total);
    }
    dt_placement_t pl[MAXT][DT_MAX_MESH_DIMS];
    long long v = combo;
    for (int t = 0; t < nin; t++)
      for (int i = 0; i < m; i++) {
        int k = fx_n_options(&in[t]);
        pl[t][i] = fx_option(&in[t], (int)(v % k));
        v /= k;
      }
    dt_tensor_t ts[MAXT], res[3] = {NULL, NULL, NULL};
    for (int t = 0; t < nin; t++)
      DT_ASSERT_OK(dt_tensor_from_full(mesh, in[t].dtype, in[t].ndim, in[t].shape, pl[t],
                                       packed[t], &ts[t]));
    dt_status_t st = dt_op_run_multi(op, nin, ts, nia, iargs, nfa, fargs, nout, res);
    if (jerr != NULL) { /* PyTorch raises: so must every rank, with a message */
      DT_ASSERT_TRUE(strcmp(dt_status_name(st), jerr->valuestring) == 0,
                     "case %s (%s) combo %lld: %s, expected %s", name, op, combo,
                     dt_status_name(st), jerr->valuestring);
      DT_ASSERT_TRUE(strncmp(dt_last_error(), "dt_op_run", 9) == 0,
                     "case %s: message '%s'", name, dt_last_error());
      for (int t = 0; t < nin; t++) dt_tensor_destroy(ts[t]);
      continue;
    }
    if (st != DT_SUCCESS) {
      char desc[256] = "";
      for (int t = 0; t < nin; t++) {
        char b[64];
        dt_placements_format(pl[t], m, ",", b, sizeof b);
        strncat(desc, b, sizeof desc - strlen(desc) - 2);
        strncat(desc, " ", sizeof desc - strlen(desc) - 1);
      }
      DT_ASSERT_TRUE(0, "case %s (%s) with inputs %s: %s: %s", name, op, desc,
                     dt_status_name(st), dt_last_error());
    }
    /* "partial": [rtol, atol] replace the case's tolerance where an input or an output is
     * Partial (bf16/f16: each rank's partial result was rounded to the dtype before the sum) */
    int partial = 0;
    for (int t = 0; t < nin; t++)
      for (int i = 0; i < m; i++) partial |= pl[t][i].kind == DT_PARTIAL;
    for (int o = 0; o < nout; o++) {
      dt_placement_t rp[DT_MAX_MESH_DIMS];
      DT_ASSERT_OK(dt_tensor_placements(res[o], rp));
      for (int i = 0; i < m; i++) partial |= rp[i].kind == DT_PARTIAL;
    }
    const cJSON* jp = cJSON_GetObjectItem(c, "partial");
    double crtol = partial && jp ? fx_num(cJSON_GetArrayItem(jp, 0)) : rtol;
    double catol = partial && jp ? fx_num(cJSON_GetArrayItem(jp, 1)) : atol;
    /* "device": [rtol, atol], at least that much where the tensors live on a GPU (a kernel that
     * rounds an intermediate as the GPU's own libraries do: sdpa's P on tensor cores) */
    const cJSON* jd = on_device ? cJSON_GetObjectItem(c, "device") : NULL;
    if (jd != NULL) {
      crtol = fmax(crtol, fx_num(cJSON_GetArrayItem(jd, 0)));
      catol = fmax(catol, fx_num(cJSON_GetArrayItem(jd, 1)));
    }
    for (int o = 0; o < nout; o++) {
      dt_dtype_t rdt;
      DT_ASSERT_OK(dt_tensor_dtype(res[o], &rdt));
      DT_ASSERT_EQ(rdt, out[o].dtype);
      int nd;
      int64_t shape[DT_MAX_DIMS];
      DT_ASSERT_OK(dt_tensor_ndim(res[o], &nd));
      DT_ASSERT_OK(dt_tensor_shape(res[o], shape));
      DT_ASSERT_EQ(nd, out[o].ndim);
      for (int d = 0; d < nd; d++) DT_ASSERT_EQ(shape[d], out[o].shape[d]);
      size_t nb = fx_itemsize(out[o].dtype) * (size_t)(out[o].numel ? out[o].numel : 1);
      void* got = malloc(nb);
      DT_ASSERT_OK(dt_tensor_gather_full(res[o], got, nb));
      /* integer outputs exactly, whatever the case's tolerance (values within 2^53: the file's
       * numbers are doubles) */
      const int exact = out[o].dtype == DT_I32 || out[o].dtype == DT_I64;
      for (int64_t i = 0; i < out[o].numel; i++) {
        double g = fx_unpack(got, out[o].dtype, i), w = out[o].data[i];
        if (!fx_close(g, w, exact ? 0.0 : catol, exact ? 0.0 : crtol)) {
          char b[64] = "";
          dt_placement_t rp[DT_MAX_MESH_DIMS];
          dt_tensor_placements(res[o], rp);
          dt_placements_format(rp, m, ",", b, sizeof b);
          DT_ASSERT_TRUE(0, "case %s (%s) combo %lld, output %d [%s] element %lld: %.8g vs torch "
                         "%.8g", name, op, combo, o, b, (long long)i, g, w);
        }
      }
      /* every rank holds the same gathered result */
      unsigned long long h = 1469598103934665603ull, hmax, hmin;
      for (size_t b = 0; b < fx_itemsize(out[o].dtype) * (size_t)out[o].numel; b++)
        h = (h ^ ((unsigned char*)got)[b]) * 1099511628211ull;
      MPI_Allreduce(&h, &hmax, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&h, &hmin, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
      DT_ASSERT_TRUE(hmax == hmin, "case %s: ranks disagree", name);
      free(got);
      dt_tensor_destroy(res[o]);
    }
    for (int t = 0; t < nin; t++) dt_tensor_destroy(ts[t]);
    if (r < 12 && cJSON_GetObjectItem(c, "grads") != NULL)
      run_backward(c, mesh, m, nin, in, packed, pl);
  }
  for (int t = 0; t < nin; t++) {
    free(in[t].data);
    free(packed[t]);
  }
  for (int o = 0; o < nout && jerr == NULL; o++) free(out[o].data);
  return runs;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&world));
  cJSON* root = dt_test_load_json(DT_FIXTURES);
  const cJSON* cases = cJSON_GetObjectItem(root, "cases");
  int ncases = cJSON_GetArraySize(cases);
  DT_ASSERT_TRUE(ncases >= DT_MIN_CASES, "only %d cases", ncases);
  const char* only = getenv("DT_TEST_CASE"); /* run one case by name while debugging */
  long long runs = 0;
  for (int m = 1; m <= 2; m++) {
    if (m == 2 && world % 2 != 0) continue;
    int shape[2] = {m == 1 ? world : 2, world / 2};
    dt_mesh_t mesh;
    DT_ASSERT_OK(dt_mesh_create(m, shape, NULL, NULL, &mesh));
    for (int k = 0; k < ncases; k++) {
      const cJSON* c = cJSON_GetArrayItem(cases, k);
      if (only && strcmp(only, cJSON_GetObjectItem(c, "name")->valuestring) != 0) continue;
      runs += run_case(c, mesh, m);
    }
    DT_ASSERT_OK(dt_mesh_destroy(mesh));
  }
  cJSON_Delete(root);
  const char* file = strrchr(DT_FIXTURES, '/');
  if (g_rank == 0)
    printf("%s: %d cases, %lld placement combinations matched PyTorch on %d "
           "ranks; %lld input gradients matched\n", file ? file + 1 : DT_FIXTURES, ncases, runs, world, g_grad_checks);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* dtensor-explain - prints the redistribution plan the library would run, without MPI.
 *
 *   dtensor-explain redistribute --mesh 2x2 --shape 8x8x8 --dtype f32 --from S0,S1 --to S1,S0
 *                   [--flatten 0,1]... [--greedy] [--cost-model FILE] [--visualize] [--json]
 *
 *   dtensor-explain op mm --mesh 2x2 --shape 12x8 --shape 8x4 --in S0,R --in R,S1 [--dtype f32]..
 *                   [--arg NAME=VALUE].. [--all] [--json]
 *     Only the op's required arguments need an --arg; the others take the defaults of its schema
 *     (`ops NAME` lists them), as in the C API: `op mean --mesh 2 --shape 4x6 --in S0` reduces
 *     every dim.
 *
 *   dtensor-explain ops [NAME] [--json]       lists the ops (or one op) with their arguments
 *
 * Works on an abstract mesh: planning needs only shapes. Exit status 0 on success, 2 on bad
 * input (with {"error": "..."} under --json).
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

static int g_json = 0;

#define DT__STR(x) #x
#define DT__XSTR(x) DT__STR(x)

static int fail(const char* fmt, const char* a, const char* b) {
  char msg[1200];
  snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
  if (g_json) {
    cJSON* o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    char* s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
  } else {
    fprintf(stderr, "dtensor-explain: %s\n", msg);
  }
  return 2;
}

/* The library's last error without its leading "dt_function: " (the command line, not a C call,
 * is what the user gave here): "sum has no argument 'axis' (it takes: keepdim, dim)". */
static const char* lib_error(void) {
  const char* m = dt_last_error();
  const char* c = strstr(m, ": ");
  if (strncmp(m, "dt_", 3) != 0 || c == NULL) return m;
  for (const char* p = m; p < c; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) return m;
  return c + 2;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: dtensor-explain redistribute --mesh AxB[xC..] --shape NxM[x..] --from P0,P1.. "
          "--to P0,P1..\n"
          "                       [--dtype T] [--flatten d0,d1].. [--greedy] [--visualize]\n"
          "                       [--cost-model FILE] [--json]\n"
          "       dtensor-explain op NAME --mesh AxB --shape NxM --in P0,P1 "
          "[--shape .. --in ..]..\n"
          "                       [--dtype T].. [--arg NAME=VALUE].. [--flatten d0,d1].. [--all]\n"
          "                       [--cost-model FILE] [--json]\n"
          "       dtensor-explain ops [NAME] [--json]\n"
          "       dtensor-explain --help\n"
          "Prints the plan the library would run, on an abstract mesh: no MPI, shapes only.\n"
          "\n"
          "redistribute: the minimum-cost plan from one placement to another\n"
          "  --mesh AxB[xC..]      mesh shape\n"
          "  --shape NxM[x..]      global tensor shape\n"
          "  --from P0,P1..        placements now, one per mesh dim\n"
          "  --to P0,P1..          placements wanted, one per mesh dim\n"
          "  --dtype T             f32 (default), bf16, f16, i32 or i64\n"
          "  --flatten d0,d1       let the plan merge steps over these mesh dims (repeatable)\n"
          "  --greedy              PyTorch's greedy per-dim plan instead, for comparison\n"
          "  --visualize           which ranks hold which index ranges, before and after\n"
          "op NAME: the sharding strategy an op picks, and the input redistributions it needs\n"
          "  --shape NxM --in P..  one pair per input, in order\n"
          "  --dtype T             once for every input, or once per --shape (default f32)\n"
          "  --arg NAME=VALUE      a named argument: --arg dim=1, --arg dim=0,2 (a list),\n"
          "                        --arg dtype=bf16; `ops NAME` lists an op's arguments\n"
          "  --all                 every candidate strategy with its cost, not only the chosen\n"
          "  --mesh, --flatten     as for redistribute\n"
          "ops [NAME]: every op (or one) with its named arguments\n"
          "any command:\n"
          "  --cost-model FILE     price plans with this calibrated model (dtensor-calibrate -o\n"
          "                        FILE); default: the built-in model (this tool does not read\n"
          "                        $DTENSOR_COST_MODEL or ~/.cache/dtensor)\n"
          "  --json                one JSON object on stdout; errors as {\"error\": \"...\"}\n"
          "  -h, --help            this text\n"
          "placements: S(d) or Sd, R, P or P(sum|avg|max|min); op names as in PyTorch's aten (mm,\n"
          "bmm, add, sub, mul, div, neg, relu, ...). Exit status 0 on success, 2 on bad input.\n");
}

/* Parses "2x2x2" into at most cap positive ints. */
static int parse_dims(const char* s, int64_t* out, int cap, int* n) {
  *n = 0;
  if (*s == '\0') return 0;
  const char* p = s;
  while (*p) {
    char* end;
    if (*p < '0' || *p > '9') return 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || v > (1ll << 40) || *n >= cap) return 0;
    out[(*n)++] = v;
    if (*end == 'x' || *end == 'X' || *end == ',') {
      p = end + 1;
      if (*p == '\0') return 0;
    } else if (*end == '\0') {
      p = end;
    } else {
      return 0;
    }
  }
  return 1;
}

/* --mesh "2x2" into shape[]; 0 on bad input. */
static int parse_mesh(const char* s, int* shape, int* nd) {
  int64_t v[DT_MAX_MESH_DIMS + 1];
  if (!parse_dims(s, v, DT_MAX_MESH_DIMS + 1, nd) || *nd > DT_MAX_MESH_DIMS) return 0;
  for (int i = 0; i < *nd; i++) {
    if (v[i] < 1 || v[i] > 1 << 20) return 0;
    shape[i] = (int)v[i];
  }
  return 1;
}

/* Applies the --flatten options to an abstract mesh; returns the exit status (0 on success). */
static int apply_flatten(dt_mesh_t mesh, const char* const* flat_s, int nflat) {
  for (int f = 0; f < nflat; f++) {
    int64_t d64[DT_MAX_MESH_DIMS + 1];
    int dims[DT_MAX_MESH_DIMS], n;
    if (!parse_dims(flat_s[f], d64, DT_MAX_MESH_DIMS + 1, &n) || n > DT_MAX_MESH_DIMS)
      return fail("bad --flatten '%s' (expected mesh dims like 0,1)%s", flat_s[f], NULL);
    for (int k = 0; k < n; k++) dims[k] = (int)d64[k];
    if (dt_mesh_flatten(mesh, n, dims, NULL, NULL) != DT_SUCCESS)
      return fail("--flatten: %s%s", lib_error(), NULL);
  }
  return 0;
}

static cJSON* placements_json(const dt_placement_t* p, int n) {
  cJSON* a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) {
    char b[32];
    dt_placement_format(p[i], b, sizeof b);
    cJSON_AddItemToArray(a, cJSON_CreateString(b));
  }
  return a;
}

/* Steps of a plan as a JSON array (same form for both commands). */
static cJSON* steps_json(dt_plan_t plan) {
  cJSON* steps = cJSON_CreateArray();
  int nsteps = 0;
  dt_plan_num_steps(plan, &nsteps);
  for (int k = 0; k < nsteps; k++) {
    dt_plan_step_t ps;
    dt_plan_get_step(plan, k, &ps);
    cJSON* j = cJSON_CreateObject();
    if (ps.n_mesh_dims == 1) {
      cJSON_AddNumberToObject(j, "mesh_dim", ps.mesh_dims[0]);
    } else {
      cJSON* md = cJSON_AddArrayToObject(j, "mesh_dim");
      for (int q = 0; q < ps.n_mesh_dims; q++)
        cJSON_AddItemToArray(md, cJSON_CreateNumber(ps.mesh_dims[q]));
    }
    char fb[128], tb[128];
    dt_placements_format(ps.from, ps.n_mesh_dims, NULL, fb, sizeof fb);
    dt_placements_format(ps.to, ps.n_mesh_dims, NULL, tb, sizeof tb);
    cJSON_AddStringToObject(j, "from", fb);
    cJSON_AddStringToObject(j, "to", tb);
    cJSON_AddStringToObject(j, "collective", dt_collective_name(ps.coll));
    if (ps.coll == DT_COLL_ALL_REDUCE || ps.coll == DT_COLL_REDUCE_SCATTER)
      cJSON_AddStringToObject(j, "algo", dt_coll_algo_name(ps.algo));
    cJSON_AddNumberToObject(j, "bytes", (double)ps.nbytes);
    cJSON_AddNumberToObject(j, "cost_us", ps.cost_us);
    cJSON_AddItemToArray(steps, j);
  }
  return steps;
}

static void steps_text(dt_plan_t plan, const char* indent) {
  int nsteps = 0;
  dt_plan_num_steps(plan, &nsteps);
  printf("%s%-4s %-9s %-12s %-12s %-18s %12s %12s\n", indent, "step", "mesh_dim", "from", "to",
         "collective", "bytes", "cost_us");
  for (int k = 0; k < nsteps; k++) {
    dt_plan_step_t ps;
    dt_plan_get_step(plan, k, &ps);
    char fb[128], tb[128], md[32];
    int w = 0;
    for (int q = 0; q < ps.n_mesh_dims; q++)
      w += snprintf(md + w, sizeof md - (size_t)w, "%s%d", q ? "+" : "", ps.mesh_dims[q]);
    dt_placements_format(ps.from, ps.n_mesh_dims, NULL, fb, sizeof fb);
    dt_placements_format(ps.to, ps.n_mesh_dims, NULL, tb, sizeof tb);
    char coll[48]; /* reductions name their algorithm: "reduce_scatter/a2a" */
    snprintf(coll, sizeof coll, "%s%s%s", dt_collective_name(ps.coll),
             ps.coll == DT_COLL_ALL_REDUCE || ps.coll == DT_COLL_REDUCE_SCATTER ? "/" : "",
             ps.coll == DT_COLL_ALL_REDUCE || ps.coll == DT_COLL_REDUCE_SCATTER
                 ? dt_coll_algo_name(ps.algo)
                 : "");
    printf("%s%-4d %-9s %-12s %-12s %-18s %12llu %12.2f\n", indent, k, md, fb, tb, coll,
           (unsigned long long)ps.nbytes, ps.cost_us);
  }
}

static const dt_collective_t kListed[4] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_REDUCE,
                                           DT_COLL_REDUCE_SCATTER, DT_COLL_ALL_TO_ALL};

static cJSON* shape_json(const int64_t* shape, int nd) {
  cJSON* a = cJSON_CreateArray();
  for (int d = 0; d < nd; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
  return a;
}

static int explain_redistribute(int argc, char** argv) {
  const char *mesh_s = NULL, *shape_s = NULL, *from_s = NULL, *to_s = NULL, *dtype_s = "f32",
             *cost_s = NULL;
  const char* flat_s[8];
  int nflat = 0, greedy = 0, vis = 0;
  for (int i = 0; i < argc; i++) {
    const char* a = argv[i];
    const char** dst = NULL;
    if (strcmp(a, "--json") == 0) continue;
    if (strcmp(a, "--greedy") == 0) { greedy = 1; continue; }
    if (strcmp(a, "--visualize") == 0) { vis = 1; continue; }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(stdout); return 0; }
    if (strcmp(a, "--mesh") == 0) dst = &mesh_s;
    else if (strcmp(a, "--shape") == 0) dst = &shape_s;
    else if (strcmp(a, "--from") == 0) dst = &from_s;
    else if (strcmp(a, "--to") == 0) dst = &to_s;
    else if (strcmp(a, "--dtype") == 0) dst = &dtype_s;
    else if (strcmp(a, "--cost-model") == 0) dst = &cost_s;
    else if (strcmp(a, "--flatten") == 0) {
      if (nflat == 8) return fail("too many --flatten options%s%s", NULL, NULL);
      dst = &flat_s[nflat++];
    } else {
      return fail("unknown option '%s'%s", a, NULL);
    }
    if (i + 1 >= argc) return fail("option %s needs a value%s", a, NULL);
    *dst = argv[++i];
  }
  if (!mesh_s || !shape_s || !from_s || !to_s)
    return fail("--mesh, --shape, --from and --to are required%s%s", NULL, NULL);

  int64_t shape[DT_MAX_DIMS + 1];
  int mesh_nd, nd, mesh_shape[DT_MAX_MESH_DIMS];
  if (!parse_mesh(mesh_s, mesh_shape, &mesh_nd))
    return fail("bad --mesh '%s' (expected e.g. 2x2, 1 to 4 dims)%s", mesh_s, NULL);
  if (!parse_dims(shape_s, shape, DT_MAX_DIMS + 1, &nd) || nd > DT_MAX_DIMS)
    return fail("bad --shape '%s' (expected e.g. 8x8x8, 1 to 8 dims)%s", shape_s, NULL);
  dt_dtype_t dtype;
  if (dt_dtype_parse(dtype_s, &dtype) != DT_SUCCESS) return fail("%s%s", lib_error(), NULL);
  dt_placement_t from[DT_MAX_MESH_DIMS], to[DT_MAX_MESH_DIMS];
  int nf, nt;
  if (dt_placements_parse(from_s, from, DT_MAX_MESH_DIMS, &nf) != DT_SUCCESS)
    return fail("--from: %s%s", lib_error(), NULL);
  if (dt_placements_parse(to_s, to, DT_MAX_MESH_DIMS, &nt) != DT_SUCCESS)
    return fail("--to: %s%s", lib_error(), NULL);
  if (nf != mesh_nd || nt != mesh_nd)
    return fail("--from and --to need one placement per mesh dim (mesh '%s' has %s)", mesh_s,
                mesh_nd == 1 ? "1 dim" : mesh_nd == 2 ? "2 dims" : mesh_nd == 3 ? "3 dims"
                                                                  : "4 dims");
  if (cost_s && dt_cost_model_load(cost_s) != DT_SUCCESS)
    return fail("--cost-model: %s%s", lib_error(), NULL);

  dt_mesh_t mesh = NULL;
  if (dt_mesh_create_abstract(mesh_nd, mesh_shape, NULL, &mesh) != DT_SUCCESS)
    return fail("%s%s", lib_error(), NULL);
  int rc = 0;
  dt_plan_t plan = NULL;
  rc = apply_flatten(mesh, flat_s, nflat);
  if (rc != 0) goto out;
  dt_status_t st = greedy ? dt_plan_create_greedy(mesh, dtype, nd, shape, from, to, &plan)
                          : dt_plan_create(mesh, dtype, nd, shape, from, to, &plan);
  if (st != DT_SUCCESS) {
    rc = fail("%s%s", lib_error(), NULL);
    goto out;
  }
  int nsteps;
  double cost;
  dt_plan_num_steps(plan, &nsteps);
  dt_plan_cost(plan, &cost);
  int counts[DT_COLL_COUNT] = {0};
  for (int c = 0; c < DT_COLL_COUNT; c++) dt_plan_count(plan, (dt_collective_t)c, &counts[c]);
  /* Report the normalized placements. */
  for (int i = 0; i < mesh_nd; i++) {
    dt_placement_normalize(&from[i], nd);
    dt_placement_normalize(&to[i], nd);
  }
  if (g_json) {
    cJSON* o = cJSON_CreateObject();
    cJSON* m = cJSON_AddArrayToObject(o, "mesh");
    for (int i = 0; i < mesh_nd; i++) cJSON_AddItemToArray(m, cJSON_CreateNumber(mesh_shape[i]));
    cJSON_AddItemToObject(o, "shape", shape_json(shape, nd));
    cJSON_AddStringToObject(o, "dtype", dt_dtype_name(dtype));
    cJSON_AddItemToObject(o, "from", placements_json(from, mesh_nd));
    cJSON_AddItemToObject(o, "to", placements_json(to, mesh_nd));
    cJSON_AddItemToObject(o, "steps", steps_json(plan));
    cJSON* cnt = cJSON_AddObjectToObject(o, "counts");
    for (int c = 0; c < 4; c++)
      cJSON_AddNumberToObject(cnt, dt_collective_name(kListed[c]), counts[kListed[c]]);
    cJSON_AddNumberToObject(o, "cost_us", cost);
    char* text = cJSON_PrintUnformatted(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
  } else {
    char line[512];
    dt_plan_format(plan, line, sizeof line);
    printf("plan: %s%s\n", line, greedy ? "   (greedy planner)" : "");
    steps_text(plan, "");
    printf("counts:");
    for (int c = 0; c < 4; c++)
      printf(" %s=%d", dt_collective_name(kListed[c]), counts[kListed[c]]);
    printf(" local=%d\ntotal cost: %.2f us\n", counts[DT_COLL_LOCAL], cost);
    if (vis) {
      printf("\nfrom:\n");
      dt_sharding_visualize(mesh, nd, shape, from, stdout);
      printf("to:\n");
      dt_sharding_visualize(mesh, nd, shape, to, stdout);
    }
  }
out:
  dt_plan_destroy(plan);
  dt_mesh_destroy(mesh);
  return rc;
}

/* ---- composites: run on meta tensors under a trace, print every piece ---------------------- */

typedef struct {
  cJSON* pieces; /* JSON: one object per op event; redistributions attach to the last */
  cJSON* last;
  int counts[DT_COLL_COUNT];
  double cost;
  int mesh_nd;
} trace_t;

static void trace_cb(const dt_trace_event_t* e, void* ctx) {
  trace_t* tr = ctx;
  char b[128], c[128];
  if (e->kind == DT_TRACE_REDISTRIBUTE) {
    double cost;
    dt_plan_cost(e->plan, &cost);
    tr->cost += cost;
    for (int k = 0; k < DT_COLL_COUNT; k++) {
      int n;
      dt_plan_count(e->plan, (dt_collective_t)k, &n);
      tr->counts[k] += n;
    }
    if (g_json) {
      if (tr->last == NULL) return;
      cJSON* red = cJSON_GetObjectItem(tr->last, "redistribute");
      cJSON* j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "input", e->input);
      cJSON_AddItemToObject(j, "steps", steps_json(e->plan));
      cJSON_AddItemToArray(red, j);
    } else {
      dt_plan_format(e->plan, b, sizeof b);
      char ind[64];
      snprintf(ind, sizeof ind, "%*s", 2 * e->depth + 4, "");
      printf("%*s  input %d: %s\n", 2 * e->depth, "", e->input, b);
      steps_text(e->plan, ind);
    }
    return;
  }
  if (g_json) {
    cJSON* j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "op", e->op);
    cJSON_AddNumberToObject(j, "depth", e->depth);
    cJSON* ins = cJSON_AddArrayToObject(j, "inputs");
    for (int t = 0; t < e->n_inputs; t++)
      cJSON_AddItemToArray(ins, placements_json(e->from[t], e->mesh_ndim));
    if (e->choice) {
      cJSON* ch = cJSON_AddArrayToObject(j, "chosen");
      for (int t = 0; t < e->n_inputs; t++)
        cJSON_AddItemToArray(ch, placements_json(e->choice->in[t], e->mesh_ndim));
      cJSON* outs = cJSON_AddArrayToObject(j, "outputs");
      for (int o = 0; o < e->choice->n_outputs; o++) {
        cJSON* oj = cJSON_CreateObject();
        cJSON_AddItemToObject(oj, "shape", shape_json(e->choice->out_meta[o].shape,
                                                      e->choice->out_meta[o].ndim));
        cJSON_AddItemToObject(oj, "placements", placements_json(e->choice->out[o], e->mesh_ndim));
        cJSON_AddItemToArray(outs, oj);
      }
      cJSON_AddNumberToObject(j, "cost_us", e->choice->cost_us);
    } else {
      cJSON_AddTrueToObject(j, "composite");
    }
    cJSON_AddArrayToObject(j, "redistribute");
    cJSON_AddItemToArray(tr->pieces, j);
    tr->last = j;
    return;
  }
  printf("%*s%s:", 2 * e->depth, "", e->op);
  for (int t = 0; t < e->n_inputs; t++) {
    dt_placements_format(e->from[t], e->mesh_ndim, NULL, b, sizeof b);
    printf("%s %s", t ? "," : "", b);
  }
  if (e->choice == NULL) {
    printf(" (composite of:)\n");
    return;
  }
  printf(" ->");
  for (int o = 0; o < e->choice->n_outputs; o++) {
    dt_placements_format(e->choice->out[o], e->mesh_ndim, NULL, c, sizeof c);
    printf("%s %s [", o ? "," : "", c);
    for (int d = 0; d < e->choice->out_meta[o].ndim; d++)
      printf("%s%lld", d ? ", " : "", (long long)e->choice->out_meta[o].shape[d]);
    printf("]");
  }
  printf("  (%.2f us)\n", e->choice->cost_us);
}

/* A composite op on meta tensors of the abstract mesh: every piece it runs, with its strategy and
 * the redistributions it needs, in order. */
static int explain_composite(dt_mesh_t mesh, const char* mesh_s, const char* name,
                             const dt_op_call_t* call,
                             dt_placement_t (*in_pl)[DT_MAX_MESH_DIMS]) {
  dt_tensor_t in[DT_OP_MAX_INPUTS] = {NULL}, out[DT_OP_MAX_OUTPUTS] = {NULL};
  dt_op_desc_t d;
  dt_op_describe(name, &d);
  int rc = 0, nd;
  dt_mesh_ndim(mesh, &nd);
  for (int t = 0; t < call->n_inputs && rc == 0; t++)
    if (dt_tensor_meta(mesh, call->in[t].dtype, call->in[t].ndim, call->in[t].shape, in_pl[t],
                       &in[t]) != DT_SUCCESS)
      rc = fail("%s%s", lib_error(), NULL);
  trace_t tr;
  memset(&tr, 0, sizeof tr);
  tr.mesh_nd = nd;
  cJSON* o = NULL;
  if (g_json) {
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", name);
    cJSON_AddTrueToObject(o, "composite");
    tr.pieces = cJSON_AddArrayToObject(o, "pieces");
  } else if (rc == 0) {
    printf("op %s on mesh %s (composite: its pieces in order)\n", name, mesh_s);
  }
  if (rc == 0) {
    dt_trace_set(trace_cb, &tr);
    dt_status_t st = dt_op_run_multi(name, call->n_inputs, in, call->n_iargs, call->iargs,
                                     call->n_fargs, call->fargs, d.n_outputs, out);
    dt_trace_set(NULL, NULL);
    if (st != DT_SUCCESS) rc = fail("%s%s", lib_error(), NULL);
  }
  if (rc == 0) {
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    int ond;
    int64_t shape[DT_MAX_DIMS];
    dt_tensor_placements(out[0], pl);
    dt_tensor_ndim(out[0], &ond);
    dt_tensor_shape(out[0], shape);
    if (g_json) {
      cJSON* outp = cJSON_AddObjectToObject(o, "output");
      cJSON_AddItemToObject(outp, "shape", shape_json(shape, ond));
      cJSON_AddItemToObject(outp, "placements", placements_json(pl, nd));
      cJSON* cnt = cJSON_AddObjectToObject(o, "counts");
      for (int c = 0; c < 4; c++)
        cJSON_AddNumberToObject(cnt, dt_collective_name(kListed[c]), tr.counts[kListed[c]]);
      cJSON_AddNumberToObject(o, "cost_us", tr.cost);
      char* text = cJSON_PrintUnformatted(o);
      printf("%s\n", text);
      cJSON_free(text);
    } else {
      char b[128];
      dt_placements_format(pl, nd, NULL, b, sizeof b);
      printf("output: %s shape [", b);
      for (int k = 0; k < ond; k++) printf("%s%lld", k ? ", " : "", (long long)shape[k]);
      printf("]\ncounts:");
      for (int c = 0; c < 4; c++) printf(" %s=%d", dt_collective_name(kListed[c]), tr.counts[kListed[c]]);
      printf("\ntotal cost: %.2f us\n", tr.cost);
    }
  }
  cJSON_Delete(o);
  for (int t = 0; t < DT_OP_MAX_INPUTS; t++) dt_tensor_destroy(in[t]);
  for (int k = 0; k < DT_OP_MAX_OUTPUTS; k++) dt_tensor_destroy(out[k]);
  return rc;
}

static int explain_op(int argc, char** argv) {
  if (argc < 1 || argv[0][0] == '-') return fail("op needs a NAME (e.g. mm)%s%s", NULL, NULL);
  const char* name = argv[0];
  const char *mesh_s = NULL, *cost_s = NULL;
  const char *shape_s[DT_OP_MAX_INPUTS + 1], *in_s[DT_OP_MAX_INPUTS + 1], *flat_s[8];
  const char *dtype_s[DT_OP_MAX_INPUTS + 1], *arg_s[DT_OP_MAX_IARGS + DT_OP_MAX_FARGS];
  int nshape = 0, nin = 0, nflat = 0, all = 0, ndtype = 0, narg = 0;
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  call.op = name;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "--json") == 0) continue;
    if (strcmp(a, "--all") == 0) { all = 1; continue; }
    if (i + 1 >= argc) return fail("option %s needs a value%s", a, NULL);
    const char* v = argv[++i];
    if (strcmp(a, "--mesh") == 0) mesh_s = v;
    else if (strcmp(a, "--dtype") == 0) {
      if (ndtype == DT_OP_MAX_INPUTS) return fail("at most " DT__XSTR(DT_OP_MAX_INPUTS) " --dtype options%s%s", NULL, NULL);
      dtype_s[ndtype++] = v;
    } else if (strcmp(a, "--cost-model") == 0) cost_s = v;
    else if (strcmp(a, "--shape") == 0) {
      if (nshape == DT_OP_MAX_INPUTS) return fail("at most " DT__XSTR(DT_OP_MAX_INPUTS) " tensor inputs%s%s", NULL, NULL);
      shape_s[nshape++] = v;
    } else if (strcmp(a, "--in") == 0) {
      if (nin == DT_OP_MAX_INPUTS) return fail("at most " DT__XSTR(DT_OP_MAX_INPUTS) " tensor inputs%s%s", NULL, NULL);
      in_s[nin++] = v;
    } else if (strcmp(a, "--flatten") == 0) {
      if (nflat == 8) return fail("too many --flatten options%s%s", NULL, NULL);
      flat_s[nflat++] = v;
    } else if (strcmp(a, "--arg") == 0) {
      if (narg == DT_OP_MAX_IARGS + DT_OP_MAX_FARGS) return fail("too many --arg options%s%s", NULL, NULL);
      arg_s[narg++] = v;
    } else {
      return fail("unknown option '%s'%s", a, NULL);
    }
  }
  dt_op_desc_t desc; /* the name first: an unknown one gets the closest names */
  if (dt_op_describe(name, &desc) != DT_SUCCESS) return fail("%s%s", lib_error(), "");
  if (!mesh_s || nshape == 0) return fail("--mesh and at least one --shape are required%s%s", NULL, NULL);
  if (nin != nshape) {
    char counts[64];
    snprintf(counts, sizeof counts, "%d --shape, %d --in", nshape, nin);
    return fail("give one --in per --shape (%s)%s", counts, "");
  }
  int mesh_nd, mesh_shape[DT_MAX_MESH_DIMS];
  if (!parse_mesh(mesh_s, mesh_shape, &mesh_nd))
    return fail("bad --mesh '%s' (expected e.g. 2x2, 1 to 4 dims)%s", mesh_s, NULL);
  if (ndtype > 1 && ndtype != nshape)
    return fail("give one --dtype for all inputs or one per --shape%s%s", NULL, NULL);
  dt_dtype_t dtypes[DT_OP_MAX_INPUTS];
  for (int t = 0; t < DT_OP_MAX_INPUTS; t++) dtypes[t] = DT_F32;
  for (int t = 0; t < nshape && ndtype > 0; t++)
    if (dt_dtype_parse(dtype_s[ndtype == 1 ? 0 : t], &dtypes[t]) != DT_SUCCESS)
      return fail("%s%s", lib_error(), NULL);
  if (dt_op_args_parse(name, narg, arg_s, &call.n_iargs, call.iargs, &call.n_fargs, call.fargs) !=
      DT_SUCCESS)
    return fail("--arg: %s%s", lib_error(), NULL);
  dt_placement_t in_pl[DT_OP_MAX_INPUTS][DT_MAX_MESH_DIMS];
  call.n_inputs = nshape;
  for (int t = 0; t < nshape; t++) {
    int nd = 0, np;
    int64_t dims[DT_MAX_DIMS + 1]; /* one more than allowed, to tell "too many" */
    int scalar = strcmp(shape_s[t], "scalar") == 0 || shape_s[t][0] == '\0'; /* 0-d */
    if (!scalar && (!parse_dims(shape_s[t], dims, DT_MAX_DIMS + 1, &nd) || nd > DT_MAX_DIMS))
      return fail("bad --shape '%s' (expected e.g. 12x8, 1 to 8 dims, or scalar)%s", shape_s[t],
                  NULL);
    memcpy(call.in[t].shape, dims, sizeof(int64_t) * (size_t)nd);
    call.in[t].ndim = nd;
    call.in[t].dtype = dtypes[t];
    if (dt_placements_parse(in_s[t], in_pl[t], DT_MAX_MESH_DIMS, &np) != DT_SUCCESS)
      return fail("--in '%s': %s", in_s[t], lib_error());
    if (np != mesh_nd)
      return fail("--in '%s' needs one placement per mesh dim (mesh '%s')", in_s[t], mesh_s);
  }
  if (cost_s && dt_cost_model_load(cost_s) != DT_SUCCESS)
    return fail("--cost-model: %s%s", lib_error(), NULL);
  dt_mesh_t mesh = NULL;
  if (dt_mesh_create_abstract(mesh_nd, mesh_shape, NULL, &mesh) != DT_SUCCESS)
    return fail("%s%s", lib_error(), NULL);
  int rc = 0;
  dt_op_choice_t* cands = NULL;
  dt_plan_t plans[DT_OP_MAX_INPUTS] = {NULL};
  rc = apply_flatten(mesh, flat_s, nflat);
  if (rc != 0) goto out;
  if (desc.composite) {
    rc = explain_composite(mesh, mesh_s, name, &call, in_pl);
    goto out;
  }
  dt_op_choice_t ch;
  if (dt_op_select(mesh, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl, &ch) != DT_SUCCESS) {
    rc = fail("%s%s", lib_error(), NULL);
    goto out;
  }
  int counts[DT_COLL_COUNT] = {0};
  for (int t = 0; t < nshape; t++) {
    if (dt_plan_create(mesh, dtypes[t], call.in[t].ndim, call.in[t].shape, in_pl[t], ch.in[t],
                       &plans[t]) != DT_SUCCESS) {
      rc = fail("%s%s", lib_error(), NULL);
      goto out;
    }
    for (int c = 0; c < DT_COLL_COUNT; c++) {
      int k;
      dt_plan_count(plans[t], (dt_collective_t)c, &k);
      counts[c] += k;
    }
    for (int i = 0; i < mesh_nd; i++) dt_placement_normalize(&in_pl[t][i], call.in[t].ndim);
  }
  int ncand = 0;
  if (all) {
    cands = (dt_op_choice_t*)malloc(sizeof(dt_op_choice_t) * (size_t)ch.n_candidates);
    if (cands == NULL ||
        dt_op_candidates(mesh, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in_pl, cands,
                         ch.n_candidates, &ncand) != DT_SUCCESS) {
      rc = fail("%s%s", cands ? lib_error() : "out of memory", NULL);
      goto out;
    }
    if (ncand > ch.n_candidates) ncand = ch.n_candidates;
  }
  if (g_json) {
    cJSON* o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", name);
    cJSON* m = cJSON_AddArrayToObject(o, "mesh");
    for (int i = 0; i < mesh_nd; i++) cJSON_AddItemToArray(m, cJSON_CreateNumber(mesh_shape[i]));
    cJSON* ins = cJSON_AddArrayToObject(o, "inputs");
    for (int t = 0; t < nshape; t++) {
      cJSON* j = cJSON_CreateObject();
      cJSON_AddItemToObject(j, "shape", shape_json(call.in[t].shape, call.in[t].ndim));
      cJSON_AddItemToObject(j, "placements", placements_json(in_pl[t], mesh_nd));
      cJSON_AddItemToArray(ins, j);
    }
    if (ch.n_outputs > 0) {
      cJSON* outp = cJSON_AddObjectToObject(o, "output");
      cJSON_AddItemToObject(outp, "shape", shape_json(ch.out_meta[0].shape, ch.out_meta[0].ndim));
      cJSON_AddItemToObject(outp, "placements", placements_json(ch.out[0], mesh_nd));
    } else { /* an in-place op: the inputs it updates */
      cJSON* up = cJSON_AddArrayToObject(o, "in_place");
      for (int t = 0; t < nshape; t++)
        if (desc.in_place & (1u << t)) cJSON_AddItemToArray(up, cJSON_CreateNumber(t));
    }
    if (ch.n_outputs > 1) { /* topk: every output; "output" stays the first */
      cJSON* outs = cJSON_AddArrayToObject(o, "outputs");
      for (int k = 0; k < ch.n_outputs; k++) {
        cJSON* j = cJSON_CreateObject();
        cJSON_AddItemToObject(j, "shape", shape_json(ch.out_meta[k].shape, ch.out_meta[k].ndim));
        cJSON_AddStringToObject(j, "dtype", dt_dtype_name(ch.out_meta[k].dtype));
        cJSON_AddItemToObject(j, "placements", placements_json(ch.out[k], mesh_nd));
        cJSON_AddItemToArray(outs, j);
      }
    }
    cJSON* red = cJSON_AddArrayToObject(o, "redistribute");
    for (int t = 0; t < nshape; t++) {
      cJSON* j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "input", t);
      cJSON_AddItemToObject(j, "to", placements_json(ch.in[t], mesh_nd));
      cJSON_AddItemToObject(j, "steps", steps_json(plans[t]));
      cJSON_AddItemToArray(red, j);
    }
    cJSON* cnt = cJSON_AddObjectToObject(o, "counts");
    for (int c = 0; c < 4; c++)
      cJSON_AddNumberToObject(cnt, dt_collective_name(kListed[c]), counts[kListed[c]]);
    cJSON_AddNumberToObject(o, "cost_us", ch.cost_us);
    cJSON_AddNumberToObject(o, "candidates", ch.n_candidates);
    if (all) {
      cJSON* arr = cJSON_AddArrayToObject(o, "all");
      for (int k = 0; k < ncand; k++) {
        cJSON* j = cJSON_CreateObject();
        if (ch.n_outputs > 0)
          cJSON_AddItemToObject(j, "output", placements_json(cands[k].out[0], mesh_nd));
        cJSON* ji = cJSON_AddArrayToObject(j, "inputs");
        for (int t = 0; t < nshape; t++)
          cJSON_AddItemToArray(ji, placements_json(cands[k].in[t], mesh_nd));
        cJSON_AddNumberToObject(j, "cost_us", cands[k].cost_us);
        cJSON_AddItemToArray(arr, j);
      }
    }
    char* text = cJSON_PrintUnformatted(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
  } else {
    char b[128];
    if (ch.n_outputs > 0) {
      dt_placements_format(ch.out[0], mesh_nd, NULL, b, sizeof b);
      printf("op %s on mesh %s: output %s", name, mesh_s, b);
      printf(" shape [");
      for (int d = 0; d < ch.out_meta[0].ndim; d++)
        printf("%s%lld", d ? ", " : "", (long long)ch.out_meta[0].shape[d]);
      printf("]\n");
    } else {
      printf("op %s on mesh %s: no output, updates in place input", name, mesh_s);
      for (int t = 0, first = 1; t < nshape; t++)
        if (desc.in_place & (1u << t)) {
          printf("%s %d", first ? "" : ",", t);
          first = 0;
        }
      printf("\n");
    }
    for (int k = 1; k < ch.n_outputs; k++) {
      dt_placements_format(ch.out[k], mesh_nd, NULL, b, sizeof b);
      printf("output %d: %s %s shape [", k, b, dt_dtype_name(ch.out_meta[k].dtype));
      for (int d = 0; d < ch.out_meta[k].ndim; d++)
        printf("%s%lld", d ? ", " : "", (long long)ch.out_meta[k].shape[d]);
      printf("]\n");
    }
    for (int t = 0; t < nshape; t++) {
      char from[128], to[128];
      int ns;
      dt_placements_format(in_pl[t], mesh_nd, NULL, from, sizeof from);
      dt_placements_format(ch.in[t], mesh_nd, NULL, to, sizeof to);
      dt_plan_num_steps(plans[t], &ns);
      printf("input %d: %s -> %s%s\n", t, from, to, ns ? "" : " (no movement)");
      if (ns) steps_text(plans[t], "  ");
    }
    printf("counts:");
    for (int c = 0; c < 4; c++) printf(" %s=%d", dt_collective_name(kListed[c]), counts[kListed[c]]);
    printf(" local=%d\ntotal cost: %.2f us (%d candidates)\n", counts[DT_COLL_LOCAL], ch.cost_us,
           ch.n_candidates);
    for (int k = 0; k < ncand; k++) {
      char o[64], line[256];
      int w = 0;
      dt_placements_format(cands[k].out[0], mesh_nd, NULL, o, sizeof o);
      for (int t = 0; t < nshape; t++) {
        char ib[64];
        dt_placements_format(cands[k].in[t], mesh_nd, NULL, ib, sizeof ib);
        w += snprintf(line + w, sizeof line - (size_t)w, "%s%s", t ? " x " : "", ib);
      }
      printf("  candidate %3d: %-28s -> %-16s %12.2f us\n", k, line, o, cands[k].cost_us);
    }
  }
out:
  free(cands);
  for (int t = 0; t < DT_OP_MAX_INPUTS; t++) dt_plan_destroy(plans[t]);
  dt_mesh_destroy(mesh);
  return rc;
}

static const char* const kArgKinds[DT_ARG_KIND_COUNT] = {"int", "float", "int list", "dtype",
                                                           "placements"};

/* One op's arguments as text ("keepdim=0 (int), dim... (int list)") or JSON. */
static void op_args(const char* name, int n, char* buf, size_t cap, cJSON* arr) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < n; k++) {
    dt_op_arg_desc_t a;
    if (dt_op_arg_describe(name, k, &a) != DT_SUCCESS) continue;
    char def[48] = "";
    if (a.has_default) snprintf(def, sizeof def, "=%g", a.default_value);
    else if (!a.required && a.kind != DT_ARG_INT_LIST && a.kind != DT_ARG_PLACEMENTS)
      snprintf(def, sizeof def, "?");
    int list = a.kind == DT_ARG_INT_LIST || a.kind == DT_ARG_PLACEMENTS;
    int w = snprintf(buf + used, cap - used, "%s%s%s%s (%s)", k ? ", " : "", a.name,
                     list ? "..." : "", def, kArgKinds[a.kind]);
    if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
    if (arr) {
      cJSON* j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "name", a.name);
      cJSON_AddStringToObject(j, "kind", kArgKinds[a.kind]);
      cJSON_AddBoolToObject(j, "required", a.required);
      if (a.has_default) cJSON_AddNumberToObject(j, "default", a.default_value);
      cJSON_AddItemToArray(arr, j);
    }
  }
}

static int list_ops(int argc, char** argv) {
  const char* only = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) continue;
    if (argv[i][0] == '-' || only != NULL) return fail("unexpected argument '%s'%s", argv[i], NULL);
    only = argv[i];
  }
  int n;
  dt_op_count(&n);
  cJSON* arr = g_json ? cJSON_CreateArray() : NULL;
  int shown = 0;
  for (int i = 0; i < n; i++) {
    const char* name;
    dt_op_desc_t d;
    if (dt_op_name_at(i, &name) != DT_SUCCESS || dt_op_describe(name, &d) != DT_SUCCESS) continue;
    if (only && strcmp(only, name) != 0) continue;
    shown++;
    char args[512];
    cJSON* ja = arr ? cJSON_CreateArray() : NULL;
    op_args(name, d.n_args, args, sizeof args, ja);
    if (arr) {
      cJSON* j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "name", name);
      cJSON_AddNumberToObject(j, "inputs", d.n_inputs);
      cJSON_AddBoolToObject(j, "variadic", d.variadic);
      cJSON_AddNumberToObject(j, "outputs", d.n_outputs);
      cJSON_AddBoolToObject(j, "backward", d.has_backward);
      cJSON_AddBoolToObject(j, "composite", d.composite);
      cJSON_AddItemToObject(j, "args", ja);
      cJSON_AddItemToArray(arr, j);
    } else {
      char io[32];
      snprintf(io, sizeof io, "%s%d -> %d", d.variadic ? "1.." : "", d.n_inputs, d.n_outputs);
      printf("%-16s %-8s %-9s %-9s %s\n", name, io, d.has_backward ? "backward" : "-",
             d.composite ? "composite" : "", args[0] ? args : "(no arguments)");
    }
  }
  if (only && shown == 0) { /* the library's message suggests the closest names */
    cJSON_Delete(arr);
    dt_op_desc_t d;
    if (dt_op_describe(only, &d) != DT_SUCCESS) return fail("%s%s", lib_error(), NULL);
    return fail("no op called '%s'%s", only, NULL);
  }
  if (arr) {
    char* text = cJSON_PrintUnformatted(arr);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(arr);
  }
  return 0;
}

/* The whole command line (argv[0] is the program name); returns the exit status. Callable more
 * than once in one process (the libFuzzer harness tests/fuzz/fuzz_explain.c does). */
int dt_explain_main(int argc, char** argv);
int dt_explain_main(int argc, char** argv) {
  g_json = 0;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--json") == 0) g_json = 1;
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  for (int i = 1; i < argc; i++) /* --help anywhere: `dtensor-explain op --help` too */
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
  if (strcmp(argv[1], "redistribute") == 0) return explain_redistribute(argc - 2, argv + 2);
  if (strcmp(argv[1], "op") == 0) return explain_op(argc - 2, argv + 2);
  if (strcmp(argv[1], "ops") == 0) return list_ops(argc - 2, argv + 2);
  return fail("unknown command '%s' (expected: redistribute, op or ops)%s", argv[1], NULL);
}

#ifndef DT_EXPLAIN_NO_MAIN
int main(int argc, char** argv) { return dt_explain_main(argc, argv); }
#endif

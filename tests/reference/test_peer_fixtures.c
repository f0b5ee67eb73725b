/* test_peer_fixtures.c - redistributions and op dispatch against PyTorch 2.x's DTensor (np 4).
 *
 * tests/reference/peer_fixtures.json (tests/reference/make_peer_fixtures.py, PyTorch 2.11 on 4
 * gloo ranks) holds, per case, every rank's local input shard, the placements PyTorch ends with,
 * the collectives its CommDebugMode counted and every rank's local result. Each case is replayed
 * on the same mesh ((4,) or (2, 2)) from the same local shards:
 *  - placements: PyTorch's, unless a named difference below says otherwise;
 *  - values: every rank's local shard bit for bit where the placements agree (the inputs are
 *    small integers, so sums and matmuls are exact in any order), and the gathered result too;
 *    softmax and mean within the case's rtol (1e-6);
 *  - communication: the collectives ours issued (dt_counters_get, per type) equal PyTorch's,
 *    unless a named difference below gives ours' exact counts; in every case ours issues at most
 *    as many collectives as PyTorch (CommDebugMode counts calls, not bytes: each difference says
 *    why ours moves no more).
 * Cases PyTorch refuses (a new Partial by redistribute) must be refused by ours too, unless a
 * named difference says ours allows it; then the gathered value must equal the input's.
 * Every entry of the differences table must be met at least once. DT_PEER_REPORT=1 prints every
 * case (ours and PyTorch's) instead of stopping at the first mismatch.
 */
#include <math.h>
#include <string.h>

#include "dt_test_json.h"

/* ---- the named differences ---------------------------------------------------------------- */
typedef struct {
  const char* name;
  const char* why;
  const char* key;  /* redistribution: "MESH SRC->DST" ("4 S(0)->S(1)", "2x2 S(0),S(1)->R,R");
                       op: the case's name */
  const char* comm; /* ours' exact collectives ("all_to_all=1"; "" none), NULL: PyTorch's */
  const char* placements; /* ours' output placements ("S(0),R"), NULL: PyTorch's */
  int allowed;            /* PyTorch refuses, ours runs it */
} peer_diff_t;

/* Why each kind of difference is by design. */
#define A2A_CPU                                                                              \
  "S(a)->S(b) on one mesh dim is one all-to-all in ours; PyTorch's CPU (gloo) path all-gathers " \
  "the whole dim and keeps a chunk: the same count, ours sends (n-1)/n of a shard instead of "  \
  "receiving n-1 shards"
#define A2A_NEST                                                                             \
  "PyTorch's greedy planner routes a re-nesting through Replicate (two all-gathers on CPU); "    \
  "ours' shortest-path plan moves one or both mesh dims by all-to-all: the same count or fewer, " \
  "fewer bytes (reference-dtensor.md 5.3)"
#define R_TO_P                                                                               \
  "ours allows R->P(sum) (a local partition: floats divided by n, no communication); PyTorch's " \
  "public redistribute refuses a new Partial (reference-dtensor.md 1)"
#define COST                                                                                 \
  "dispatch picks the cheapest strategy by ours' cost model: one all-to-all of the smaller "    \
  "input instead of an all-gather, so the output placement differs (same gathered values)"
#define MEAN_SUM                                                                             \
  "ours' mean over a sharded dim is Partial(sum) of locally divided values (exact for uneven " \
  "shards, no communication); PyTorch keeps Partial(avg), and on an uneven dim gathers first"

static const peer_diff_t kDiffs[] = {
    {"a2a_cpu", A2A_CPU, "4 S(0)->S(1)", "all_to_all=1", NULL, 0},
    {"a2a_cpu", A2A_CPU, "4 S(1)->S(0)", "all_to_all=1", NULL, 0},
    {"a2a_cpu", A2A_CPU, "2x2 S(0),S(1)->S(0),S(0)", "all_to_all=1", NULL, 0},
    {"a2a_cpu", A2A_CPU, "2x2 S(0),R->S(1),R", "all_to_all=1", NULL, 0},
    {"a2a_cpu", A2A_CPU, "2x2 R,S(1)->R,S(0)", "all_to_all=1", NULL, 0},
    {"a2a_cpu", A2A_CPU, "2x2 S(1),S(1)->S(1),S(2)", "all_to_all=1", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(0),S(0)->S(1),S(1)", "all_gather=1,all_to_all=1", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(1),S(0)->S(0),S(1)", "all_gather=1,all_to_all=1", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(0),S(1)->S(1),S(0)", "all_gather=1,all_to_all=1", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(1),S(1)->S(0),S(0)", "all_gather=1,all_to_all=1", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(2),S(0)->S(0),S(2)", "all_gather=1,all_to_all=1", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(0),S(1)->S(1),S(2)", "all_to_all=2", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 S(0),S(0)->S(1),S(2)", "all_to_all=2", NULL, 0},
    {"a2a_nest", A2A_NEST, "2x2 P(sum),S(2)->S(0),S(1)", "reduce_scatter=1,all_to_all=1", NULL, 0},
    {"r_to_p", R_TO_P, "4 R->P(sum)", "", NULL, 1},
    {"r_to_p", R_TO_P, "2x2 R,R->P(sum),R", "", NULL, 1},
    {"cost_mm", COST, "mm_S(0)_S(0)", "all_to_all=1", "P(sum)", 0},
    {"cost_mm", COST, "mm_S(1)_S(1)", "all_to_all=1", "P(sum)", 0},
    {"cost_mm", COST, "mm22_S(0)S(1)_RS(1)", "all_to_all=1", "S(0),P(sum)", 0},
    {"cost_mm", COST, "mm22_S(0)S(1)_S(0)S(1)", "all_gather=1,all_to_all=1", "S(0),P(sum)", 0},
    {"cost_add", COST, "add_S(0)_S(1)", "all_to_all=1", "S(1)", 0},
    {"a2a_cpu", A2A_CPU, "add22_S0S1_S1S0", "all_gather=1,all_to_all=1", NULL, 0},
    {"cost_softmax", COST, "softmax_S(1)_-1", "all_to_all=1", "S(0)", 0},
    {"mean_sum", MEAN_SUM, "mean_S(0)_0", NULL, "P(sum)", 0},
    {"mean_sum", MEAN_SUM, "mean_S(1)_1", "", "P(sum)", 0},
    {NULL, NULL, NULL, NULL, NULL, 0},
};
#define NDIFFS ((int)(sizeof kDiffs / sizeof kDiffs[0]) - 1)

static int g_rank, g_report, g_bad;
static int g_used[sizeof kDiffs / sizeof kDiffs[0]];
static const char* kColl[] = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all",
                              "broadcast", "scatter"};
static const dt_collective_t kCollId[] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_REDUCE,
                                          DT_COLL_REDUCE_SCATTER, DT_COLL_ALL_TO_ALL,
                                          DT_COLL_BROADCAST, DT_COLL_SCATTER};
#define NCOLL 6

#define CHECK_OR_REPORT(cond, ...)                                                           \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      if (!g_report) DT_ASSERT_TRUE(cond, __VA_ARGS__);                                      \
      if (g_rank == 0) {                                                                     \
        printf("MISMATCH: ");                                                                \
        printf(__VA_ARGS__);                                                                 \
        printf("\n");                                                                        \
      }                                                                                      \
      g_bad++;                                                                               \
    }                                                                                        \
  } while (0)

static const peer_diff_t* find_diff(const char* key) {
  for (int i = 0; i < NDIFFS; i++)
    if (!strcmp(kDiffs[i].key, key)) {
      g_used[i] = 1;
      return &kDiffs[i];
    }
  return NULL;
}

static int parse_pl(const cJSON* arr, dt_placement_t* pl) {
  int n = cJSON_GetArraySize(arr);
  for (int i = 0; i < n; i++)
    DT_ASSERT_OK(dt_placement_parse(cJSON_GetArrayItem(arr, i)->valuestring, &pl[i]));
  return n;
}

static void join_pl(const cJSON* arr, char* buf, size_t cap) {
  buf[0] = '\0';
  for (int i = 0; i < cJSON_GetArraySize(arr); i++) {
    if (i) strncat(buf, ",", cap - strlen(buf) - 1);
    strncat(buf, cJSON_GetArrayItem(arr, i)->valuestring, cap - strlen(buf) - 1);
  }
}

static int parse_shape(const cJSON* arr, int64_t* shape) {
  int n = cJSON_GetArraySize(arr);
  for (int i = 0; i < n; i++) shape[i] = (int64_t)cJSON_GetArrayItem(arr, i)->valuedouble;
  return n;
}

/* "all_gather=1,all_to_all=2" from counts (empty: none) */
static void comm_text(const uint64_t* c, char* buf, size_t cap) {
  buf[0] = '\0';
  for (int k = 0; k < NCOLL; k++) {
    if (!c[k]) continue;
    size_t l = strlen(buf);
    snprintf(buf + l, cap - l, "%s%s=%llu", l ? "," : "", kColl[k], (unsigned long long)c[k]);
  }
}

static void theirs_counts(const cJSON* comm, uint64_t* c) {
  memset(c, 0, sizeof(uint64_t) * NCOLL);
  for (const cJSON* it = comm ? comm->child : NULL; it; it = it->next) {
    int k = 0;
    while (k < NCOLL && strcmp(kColl[k], it->string)) k++;
    DT_ASSERT_TRUE(k < NCOLL, "unknown collective %s in the fixture", it->string);
    c[k] = (uint64_t)it->valuedouble;
  }
}

static void ours_counts(dt_mesh_t mesh, uint64_t* c, uint64_t* nbytes) {
  dt_counters_t ct;
  DT_ASSERT_OK(dt_counters_get(mesh, &ct));
  *nbytes = 0;
  for (int k = 0; k < NCOLL; k++) {
    c[k] = ct.calls[kCollId[k]];
    *nbytes += ct.nbytes[kCollId[k]];
  }
}

/* A tensor on mesh with this rank's local shard taken from the fixture's list for it. */
static dt_tensor_t make_input(dt_mesh_t mesh, int ndim, const int64_t* shape,
                              const dt_placement_t* pl, const cJSON* locals) {
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, ndim, shape, pl, &t));
  int64_t n;
  DT_ASSERT_OK(dt_tensor_local_numel(t, &n));
  const cJSON* mine = cJSON_GetArrayItem(locals, g_rank);
  DT_ASSERT_EQ(cJSON_GetArraySize(mine), n);
  float* buf = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) buf[i] = (float)cJSON_GetArrayItem(mine, (int)i)->valuedouble;
  if (n) DT_ASSERT_OK(dt_tensor_write_local(t, 0, n, buf));
  free(buf);
  return t;
}

static int close_enough(double g, double w, double rtol) {
  if (rtol == 0.0) return (float)g == (float)w;
  return fabs(g - w) <= rtol * fabs(w) + 1e-7;
}

/* This rank's local shard of t against the fixture's; returns 1 when equal, on every rank. */
static int local_matches(dt_tensor_t t, const cJSON* locals, double rtol) {
  int64_t n;
  DT_ASSERT_OK(dt_tensor_local_numel(t, &n));
  const cJSON* mine = cJSON_GetArrayItem(locals, g_rank);
  int ok = cJSON_GetArraySize(mine) == n;
  if (ok && n) {
    float* buf = malloc(sizeof(float) * (size_t)n);
    DT_ASSERT_OK(dt_tensor_read_local(t, 0, n, buf));
    for (int64_t i = 0; i < n && ok; i++)
      ok = close_enough(buf[i], cJSON_GetArrayItem(mine, (int)i)->valuedouble, rtol);
    free(buf);
  }
  int all;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

static float* gather(dt_tensor_t t, int64_t* n) {
  int nd;
  int64_t shape[DT_MAX_DIMS];
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  *n = 1;
  for (int d = 0; d < nd; d++) *n *= shape[d];
  float* buf = malloc(sizeof(float) * (size_t)(*n ? *n : 1));
  DT_ASSERT_OK(dt_tensor_gather_full(t, buf, sizeof(float) * (size_t)*n));
  return buf;
}

/* Communication check shared by both kinds of case. */
static void check_comm(const char* what, const peer_diff_t* d, const uint64_t* ours,
                       const uint64_t* theirs) {
  char o[128], t[128];
  comm_text(ours, o, sizeof o);
  comm_text(theirs, t, sizeof t);
  uint64_t no = 0, nt = 0;
  for (int k = 0; k < NCOLL; k++) no += ours[k], nt += theirs[k];
  CHECK_OR_REPORT(no <= nt, "%s: ours issues %llu collectives (%s), PyTorch %llu (%s)", what,
                  (unsigned long long)no, o, (unsigned long long)nt, t);
  const char* want = d && d->comm ? d->comm : t;
  CHECK_OR_REPORT(!strcmp(o, want), "%s: ours' collectives {%s}, expected {%s} (PyTorch {%s})%s%s",
                  what, o, want, t, d ? ": difference " : "", d ? d->name : "");
}

static void run_redistribute(const cJSON* c, dt_mesh_t mesh, int m) {
  int64_t shape[DT_MAX_DIMS];
  int nd = parse_shape(cJSON_GetObjectItem(c, "shape"), shape);
  dt_placement_t src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
  parse_pl(cJSON_GetObjectItem(c, "src"), src);
  parse_pl(cJSON_GetObjectItem(c, "dst"), dst);
  char s[64], t[64], key[160], what[224];
  join_pl(cJSON_GetObjectItem(c, "src"), s, sizeof s);
  join_pl(cJSON_GetObjectItem(c, "dst"), t, sizeof t);
  snprintf(key, sizeof key, "%s %s->%s", m == 1 ? "4" : "2x2", s, t);
  snprintf(what, sizeof what, "redistribute %s shape %lld", key, (long long)shape[0]);
  for (int d = 1; d < nd; d++)
    snprintf(what + strlen(what), sizeof what - strlen(what), "x%lld", (long long)shape[d]);
  const peer_diff_t* diff = find_diff(key);
  dt_tensor_t x = make_input(mesh, nd, shape, src, cJSON_GetObjectItem(c, "in"));
  DT_ASSERT_OK(dt_counters_reset(NULL));
  dt_tensor_t y = NULL;
  dt_status_t st = dt_tensor_redistribute(x, dst, &y);
  uint64_t ours[NCOLL], theirs[NCOLL], nbytes;
  ours_counts(mesh, ours, &nbytes);
  const cJSON* err = cJSON_GetObjectItem(c, "error");
  if (err != NULL) {
    if (diff && diff->allowed) {
      CHECK_OR_REPORT(st == DT_SUCCESS, "%s: PyTorch refuses, ours should run it (%s): %s", what,
                      diff->name, dt_last_error());
      if (st == DT_SUCCESS) {
        memset(theirs, 0, sizeof theirs);
        check_comm(what, diff, ours, theirs);
        int64_t n1, n2;
        float *a = gather(x, &n1), *b = gather(y, &n2);
        int same = n1 == n2;
        for (int64_t i = 0; same && i < n1; i++) same = a[i] == b[i];
        CHECK_OR_REPORT(same, "%s: the redistributed value differs from the input", what);
        free(a);
        free(b);
      }
    } else {
      CHECK_OR_REPORT(st != DT_SUCCESS, "%s: PyTorch refuses (%s), ours ran it", what,
                      err->valuestring);
    }
    if (g_report && g_rank == 0)
      printf("%-48s torch: refused   ours: %s\n", what, st == DT_SUCCESS ? "ran" : "refused");
    if (y) dt_tensor_destroy(y);
    dt_tensor_destroy(x);
    return;
  }
  CHECK_OR_REPORT(st == DT_SUCCESS, "%s: %s", what, dt_last_error());
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(x);
    return;
  }
  theirs_counts(cJSON_GetObjectItem(c, "comm"), theirs);
  if (g_report && g_rank == 0) {
    char o[128], tt[128];
    comm_text(ours, o, sizeof o);
    comm_text(theirs, tt, sizeof tt);
    printf("%-48s torch: {%s}  ours: {%s} %llu B\n", what, tt, o, (unsigned long long)nbytes);
  }
  check_comm(what, diff, ours, theirs);
  CHECK_OR_REPORT(local_matches(y, cJSON_GetObjectItem(c, "out"), 0.0),
                  "%s: local values differ from PyTorch's", what);
  dt_tensor_destroy(y);
  dt_tensor_destroy(x);
}

static void run_op(const cJSON* c, dt_mesh_t mesh, int m) {
  const char* name = cJSON_GetObjectItem(c, "name")->valuestring;
  const char* op = cJSON_GetObjectItem(c, "op")->valuestring;
  double rtol = cJSON_GetObjectItem(c, "rtol")->valuedouble;
  const cJSON* ji = cJSON_GetObjectItem(c, "inputs");
  int nin = cJSON_GetArraySize(ji);
  int64_t iargs[8];
  int nia = cJSON_GetArraySize(cJSON_GetObjectItem(c, "iargs"));
  for (int k = 0; k < nia; k++)
    iargs[k] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(c, "iargs"), k)->valuedouble;
  dt_tensor_t in[4];
  for (int t = 0; t < nin; t++) {
    const cJSON* e = cJSON_GetArrayItem(ji, t);
    int64_t shape[DT_MAX_DIMS];
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    int nd = parse_shape(cJSON_GetObjectItem(e, "shape"), shape);
    DT_ASSERT_EQ(parse_pl(cJSON_GetObjectItem(e, "placements"), pl), m);
    in[t] = make_input(mesh, nd, shape, pl, cJSON_GetObjectItem(e, "local"));
  }
  char what[128];
  snprintf(what, sizeof what, "op %s", name);
  const peer_diff_t* diff = find_diff(name);
  DT_ASSERT_TRUE(cJSON_GetObjectItem(c, "error") == NULL, "%s: PyTorch failed", what);
  DT_ASSERT_OK(dt_counters_reset(NULL));
  dt_tensor_t y;
  dt_status_t st = dt_op_run(op, nin, in, nia, iargs, 0, NULL, &y);
  CHECK_OR_REPORT(st == DT_SUCCESS, "%s: %s", what, dt_last_error());
  if (st != DT_SUCCESS) {
    for (int t = 0; t < nin; t++) dt_tensor_destroy(in[t]);
    return;
  }
  uint64_t ours[NCOLL], theirs[NCOLL], nbytes;
  ours_counts(mesh, ours, &nbytes);
  theirs_counts(cJSON_GetObjectItem(c, "comm"), theirs);
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  DT_ASSERT_OK(dt_tensor_placements(y, pl));
  char ourpl[64], theirpl[64];
  DT_ASSERT_OK(dt_placements_format(pl, m, ",", ourpl, sizeof ourpl));
  join_pl(cJSON_GetObjectItem(c, "placements"), theirpl, sizeof theirpl);
  if (g_report && g_rank == 0) {
    char o[128], tt[128];
    comm_text(ours, o, sizeof o);
    comm_text(theirs, tt, sizeof tt);
    printf("%-48s torch: %s {%s}  ours: %s {%s}\n", what, theirpl, tt, ourpl, o);
  }
  const char* want_pl = diff && diff->placements ? diff->placements : theirpl;
  CHECK_OR_REPORT(!strcmp(ourpl, want_pl), "%s: ours' placements %s, expected %s (PyTorch %s)",
                  what, ourpl, want_pl, theirpl);
  check_comm(what, diff, ours, theirs);
  if (!strcmp(ourpl, theirpl))
    CHECK_OR_REPORT(local_matches(y, cJSON_GetObjectItem(c, "out"), rtol),
                    "%s: local values differ from PyTorch's", what);
  int64_t n;
  float* full = gather(y, &n);
  const cJSON* want = cJSON_GetObjectItem(c, "full");
  int same = cJSON_GetArraySize(want) == n;
  for (int64_t i = 0; same && i < n; i++)
    same = close_enough(full[i], cJSON_GetArrayItem(want, (int)i)->valuedouble, rtol);
  CHECK_OR_REPORT(same, "%s: the gathered result differs from PyTorch's", what);
  free(full);
  dt_tensor_destroy(y);
  for (int t = 0; t < nin; t++) dt_tensor_destroy(in[t]);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_TRUE(world == 4, "the PyTorch fixtures were made on 4 ranks, not %d", world);
  g_report = getenv("DT_PEER_REPORT") != NULL && atoi(getenv("DT_PEER_REPORT")) != 0;
  cJSON* root = dt_test_load_json(DT_PEER_FIXTURES);
  DT_ASSERT_EQ(cJSON_GetObjectItem(root, "world")->valuedouble, 4);
  int s1[1] = {4}, s2[2] = {2, 2};
  dt_mesh_t m1, m2;
  DT_ASSERT_OK(dt_mesh_create(1, s1, NULL, NULL, &m1));
  DT_ASSERT_OK(dt_mesh_create(2, s2, NULL, NULL, &m2));
  const cJSON* red = cJSON_GetObjectItem(root, "redistribute");
  const cJSON* ops = cJSON_GetObjectItem(root, "ops");
  DT_ASSERT_TRUE(cJSON_GetArraySize(red) >= 100 && cJSON_GetArraySize(ops) >= 40,
                 "%d redistributions, %d ops", cJSON_GetArraySize(red), cJSON_GetArraySize(ops));
  for (const cJSON* c = red->child; c; c = c->next) {
    int m = cJSON_GetArraySize(cJSON_GetObjectItem(c, "mesh"));
    run_redistribute(c, m == 1 ? m1 : m2, m);
  }
  for (const cJSON* c = ops->child; c; c = c->next) {
    int m = cJSON_GetArraySize(cJSON_GetObjectItem(c, "mesh"));
    run_op(c, m == 1 ? m1 : m2, m);
  }
  for (int i = 0; i < NDIFFS; i++)
    CHECK_OR_REPORT(g_used[i], "difference %s (%s) met no case", kDiffs[i].name, kDiffs[i].key);
  if (g_rank == 0)
    printf("test_peer_fixtures: %d redistributions and %d ops against PyTorch %s, %d named "
           "differences%s\n", cJSON_GetArraySize(red), cJSON_GetArraySize(ops),
           cJSON_GetObjectItem(root, "torch")->valuestring, NDIFFS,
           g_bad ? ": MISMATCHES (report mode)" : "");
  cJSON_Delete(root);
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_finalize());
  return g_bad ? 1 : 0;
}

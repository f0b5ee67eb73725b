/* test_moe_ep.c - expert parallelism: dt_nn_moe with the experts Shard(0) on a mesh dim against
 * the same layer with replicated experts (the global routing), on 2 and 4 ranks.
 *
 * - outputs, aux loss and the gradients of x, the router and the stacked weights equal to 1e-5:
 *   on a 1-D mesh (x replicated and row-sharded; E = 8; E = 5 and 6, where the chunk rule gives
 *   the ranks different numbers of experts, at np 4 one rank none; 3 tokens on 4 ranks, so one
 *   rank routes no token), and at np 4 on a (2, 2) mesh with the tokens split over dim 0 (data
 *   parallel) and the experts over dim 1;
 * - traffic: with uniform routing (each rank's T tokens send T K / EP rows to every expert rank)
 *   one forward + backward moves exactly 4 T K D (EP - 1) / EP f32 elements per rank in
 *   all-to-alls (dispatch and combine, forward and backward) plus one exchange of counts, 8 bytes
 *   for each of the (EP - 1) / EP E counts sent away, in 5 all-to-all calls; nothing else runs
 *   an all-to-all; a capacity factor drops per rank (0.5 drops exactly half of each rank's
 *   choices there), summed over the ranks in the stats;
 * - the ragged all-to-all alone (dt_ag_all_to_all): rows arrive in coordinate order, the counts
 *   exchanged or given, its gradient is the reverse exchange, a rank sending or receiving nothing
 *   is fine, and send counts that do not sum to the rows fail on every rank; from_local onto a
 *   Partial(sum) layout sums the ranks' parts and gives each part the whole gradient;
 * - experts on their own mesh (ep, efsdp), another view of the tokens' ranks (the tokens row-
 *   sharded on a 1-D mesh): output, aux and every gradient equal the replicated layer's to 1e-5
 *   (the experts' gradient summed over efsdp, where the ranks hold different tokens); tokens
 *   replicated over the ep ranks are refused (each expert's rows would count twice), and so is
 *   crossing to a mesh over other ranks (dt_ag_local_to_mesh);
 * - the model: dt_llama with the plan "*.experts.*=S(0)" runs expert-parallel
 *   (dt_llama_moe_stats says on which mesh dim) with the loss and gradients of the replicated
 *   model to 1e-5; so does the model with its experts on an expert mesh (ep, efsdp) beside a
 *   1-D data mesh and a batch of 3 that splits unevenly over the data ranks.
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

static int g_rank, g_world;

static dt_var_t param(dt_mesh_t mesh, const char* name, const char* pl, int nd,
                      const int64_t* shape, double std) {
  char plan[64];
  snprintf(plan, sizeof plan, "%s=%s", name, pl);
  dt_var_t v;
  DT_ASSERT_OK(dt_nn_param(mesh, plan, name, nd, shape, DT_INIT_NORMAL, std, 11, &v));
  return v;
}

static int64_t numel(dt_tensor_t t) {
  int nd;
  int64_t s[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, s));
  for (int d = 0; d < nd; d++) n *= s[d];
  return n;
}

static void expect_close(dt_tensor_t a, dt_tensor_t b, double tol, const char* what) {
  DT_ASSERT_TRUE(a != NULL && b != NULL, "%s: missing tensor", what);
  int64_t n = numel(a);
  DT_ASSERT_EQ(n, numel(b));
  float *x = malloc(sizeof(float) * (size_t)(n + 1)), *y = malloc(sizeof(float) * (size_t)(n + 1));
  DT_ASSERT_OK(dt_tensor_gather_full(a, x, sizeof(float) * (size_t)n));
  DT_ASSERT_OK(dt_tensor_gather_full(b, y, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)x[i] - y[i]), m = fabs((double)y[i]);
    DT_ASSERT_TRUE(d <= tol * (m > 1.0 ? m : 1.0), "%s element %lld: %.9g vs %.9g", what,
                   (long long)i, x[i], y[i]);
  }
  free(x);
  free(y);
}

static dt_var_t loss_of(dt_tape_t tape, dt_var_t out, dt_var_t aux) {
  dt_tensor_t o = dt_var_value(out), r;
  dt_mesh_t mesh;
  int nd, mnd;
  int64_t s[DT_MAX_DIMS];
  DT_ASSERT_OK(dt_tensor_mesh(o, &mesh));
  DT_ASSERT_OK(dt_mesh_ndim(mesh, &mnd));
  DT_ASSERT_OK(dt_tensor_ndim(o, &nd));
  DT_ASSERT_OK(dt_tensor_shape(o, s));
  dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, nd, s, rep, 99, &r));
  dt_var_t rv, p, l;
  DT_ASSERT_OK(dt_tape_constant(tape, r, &rv));
  dt_var_t pr[2] = {out, rv};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, pr, 0, NULL, 0, NULL, 1, &p));
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &p, 1, all, 0, NULL, 1, &l));
  if (aux) {
    dt_var_t la[2] = {l, aux};
    DT_ASSERT_OK(dt_ag_op(tape, "add", 2, la, 0, NULL, 0, NULL, 1, &l));
  }
  return l;
}

typedef struct {
  dt_var_t x, router, w1, w3, w2;
} moe_params_t;

/* x and router from `xfull`/`rfull` when given (else random), experts random. */
static moe_params_t moe_params(dt_mesh_t mesh, int64_t N, int64_t D, int64_t E, int64_t F,
                               const char* xpl, const char* wpl, const float* xfull,
                               const float* rfull) {
  const int64_t sx[2] = {N, D}, sr[2] = {E, D}, s1[3] = {E, F, D}, s2[3] = {E, D, F};
  moe_params_t p;
  if (xfull) {
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    int n;
    DT_ASSERT_OK(dt_placements_parse(xpl, pl, DT_MAX_MESH_DIMS, &n));
    int mnd;
    DT_ASSERT_OK(dt_mesh_ndim(mesh, &mnd));
    for (int i = n; i < mnd; i++) pl[i] = pl[0];
    dt_tensor_t xt, rt;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, sx, pl, xfull, &xt));
    dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, sr, rep, rfull, &rt));
    DT_ASSERT_OK(dt_var_leaf(xt, 1, &p.x));
    DT_ASSERT_OK(dt_var_leaf(rt, 1, &p.router));
  } else {
    p.x = param(mesh, "x", xpl, 2, sx, 1.0);
    p.router = param(mesh, "router", "R", 2, sr, 0.5);
  }
  p.w1 = param(mesh, "w1", wpl, 3, s1, 0.3);
  p.w3 = param(mesh, "w3", wpl, 3, s1, 0.3);
  p.w2 = param(mesh, "w2", wpl, 3, s2, 0.3);
  return p;
}

static void moe_params_destroy(moe_params_t* p) {
  dt_var_t* v[5] = {&p->x, &p->router, &p->w1, &p->w3, &p->w2};
  for (int i = 0; i < 5; i++) DT_ASSERT_OK(dt_var_destroy(*v[i]));
}

/* EP (experts `wpl`) against replicated experts; returns the EP run's all-to-all bytes and calls
 * on mesh dim ep_dim over forward + backward. */
static void check_ep(dt_mesh_t mesh, int64_t N, int64_t D, int64_t E, int64_t F, int K,
                     const char* xpl, const char* wpl, int ep_dim, const float* xfull,
                     const float* rfull, uint64_t* a2a_nbytes, uint64_t* a2a_calls) {
  moe_params_t p[2];
  dt_tape_t tape[2];
  dt_var_t out[2], aux[2];
  for (int v = 0; v < 2; v++) {
    p[v] = moe_params(mesh, N, D, E, F, xpl, v ? "R" : wpl, xfull, rfull);
    DT_ASSERT_OK(dt_tape_create(&tape[v]));
  }
  dt_counters_t c0, c1;
  dt_moe_stats_t st[2];
  DT_ASSERT_OK(dt_counters_get(mesh, &c0));
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_nn_moe(tape[v], p[v].x, p[v].router, p[v].w1, p[v].w3, p[v].w2, K, 0.0, 0.01,
                           &out[v], &aux[v], &st[v]));
    DT_ASSERT_OK(dt_tape_backward(tape[v], loss_of(tape[v], out[v], aux[v])));
    if (v == 0) DT_ASSERT_OK(dt_counters_get(mesh, &c1));
  }
  DT_ASSERT_EQ(st[0].expert_parallel_dim, ep_dim);
  DT_ASSERT_EQ(st[1].expert_parallel_dim, -1);
  DT_ASSERT_EQ(st[0].dropped, 0);
  DT_ASSERT_EQ(st[0].expert_rows, N * K);
  if (a2a_nbytes) {
    *a2a_nbytes =
        c1.dim_nbytes[ep_dim][DT_COLL_ALL_TO_ALL] - c0.dim_nbytes[ep_dim][DT_COLL_ALL_TO_ALL];
    *a2a_calls =
        c1.dim_calls[ep_dim][DT_COLL_ALL_TO_ALL] - c0.dim_calls[ep_dim][DT_COLL_ALL_TO_ALL];
    DT_ASSERT_EQ(c1.calls[DT_COLL_ALL_TO_ALL] - c0.calls[DT_COLL_ALL_TO_ALL], *a2a_calls);
  }
  char what[160];
  snprintf(what, sizeof what, "EP N %lld E %lld x %s w %s: output", (long long)N, (long long)E, xpl,
           wpl);
  expect_close(dt_var_value(out[0]), dt_var_value(out[1]), 1e-5, what);
  expect_close(dt_var_value(aux[0]), dt_var_value(aux[1]), 1e-6, "aux");
  static const char* const kNames[5] = {"x", "router", "w1", "w3", "w2"};
  for (int i = 0; i < 5; i++) {
    snprintf(what, sizeof what, "EP N %lld E %lld x %s w %s: d %s", (long long)N, (long long)E, xpl,
             wpl, kNames[i]);
    expect_close(dt_var_grad((&p[0].x)[i]), dt_var_grad((&p[1].x)[i]), 1e-5, what);
  }
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_tape_destroy(tape[v]));
    moe_params_destroy(&p[v]);
  }
}

static void test_equal(void) {
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  check_ep(mesh, 16, 8, 8, 12, 2, "R", "S(0)", 0, NULL, NULL, NULL, NULL);
  check_ep(mesh, 16, 8, 8, 12, 2, "S(0)", "S(0)", 0, NULL, NULL, NULL, NULL);
  check_ep(mesh, 10, 8, 5, 6, 2, "R", "S(0)", 0, NULL, NULL, NULL, NULL); /* uneven experts */
  check_ep(mesh, 12, 8, 6, 6, 3, "S(0)", "S(0)", 0, NULL, NULL, NULL, NULL);
  check_ep(mesh, 3, 8, 4, 6, 1, "R", "S(0)", 0, NULL, NULL, NULL, NULL); /* a rank without tokens */
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_world == 4) { /* data parallel over dim 0, experts over dim 1 */
    int s2[2] = {2, 2};
    DT_ASSERT_OK(dt_mesh_create(2, s2, NULL, NULL, &mesh));
    check_ep(mesh, 16, 8, 8, 12, 2, "S(0),R", "R,S(0)", 1, NULL, NULL, NULL, NULL);
    check_ep(mesh, 16, 8, 8, 12, 2, "R,R", "R,S(0)", 1, NULL, NULL, NULL, NULL);
    DT_ASSERT_OK(dt_mesh_destroy(mesh));
  }
}

/* Experts on an (ep, efsdp) mesh whose position (e, f) is world rank f * EP + e, tokens
 * Shard(0) on the 1-D world mesh, against the whole layer on the 1-D mesh with replicated
 * experts. */
static void test_two_meshes(void) {
  if (g_world % 2 != 0) return;
  const int EP = 2, F = g_world / 2;
  const int64_t N = 16, D = 8, E = 4, Fd = 6;
  const int K = 2;
  int s1[1] = {g_world}, s2[2] = {EP, F};
  int* ranks = malloc(sizeof(int) * (size_t)g_world);
  for (int e = 0; e < EP; e++)
    for (int f = 0; f < F; f++) ranks[e * F + f] = f * EP + e;
  dt_mesh_t xm, em;
  const char* names[2] = {"ep", "efsdp"};
  DT_ASSERT_OK(dt_mesh_create(1, s1, NULL, NULL, &xm));
  DT_ASSERT_OK(dt_mesh_create(2, s2, names, ranks, &em));
  free(ranks);
  const int64_t s1w[3] = {E, Fd, D}, s2w[3] = {E, D, Fd};
  moe_params_t p[2];
  for (int v = 0; v < 2; v++) {
    p[v] = moe_params(xm, N, D, E, Fd, "S(0)", "R", NULL, NULL);
    if (v == 0) { /* the experts on em instead */
      DT_ASSERT_OK(dt_var_destroy(p[v].w1));
      DT_ASSERT_OK(dt_var_destroy(p[v].w3));
      DT_ASSERT_OK(dt_var_destroy(p[v].w2));
      p[v].w1 = param(em, "w1", "S(0),R", 3, s1w, 0.3);
      p[v].w3 = param(em, "w3", "S(0),R", 3, s1w, 0.3);
      p[v].w2 = param(em, "w2", "S(0),R", 3, s2w, 0.3);
    }
  }
  dt_tape_t tape[2];
  dt_var_t out[2], aux[2];
  dt_moe_stats_t st[2];
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_tape_create(&tape[v]));
    DT_ASSERT_OK(dt_nn_moe(tape[v], p[v].x, p[v].router, p[v].w1, p[v].w3, p[v].w2, K, 0.0, 0.01,
                           &out[v], &aux[v], &st[v]));
    DT_ASSERT_OK(dt_tape_backward(tape[v], loss_of(tape[v], out[v], aux[v])));
  }
  DT_ASSERT_EQ(st[0].expert_parallel_dim, 0);
  DT_ASSERT_EQ(st[0].expert_rows, N * K);
  dt_mesh_t om;
  DT_ASSERT_OK(dt_tensor_mesh(dt_var_value(out[0]), &om));
  DT_ASSERT_TRUE(om == xm, "the output is on the tokens' mesh");
  expect_close(dt_var_value(out[0]), dt_var_value(out[1]), 1e-5, "two meshes: output");
  expect_close(dt_var_value(aux[0]), dt_var_value(aux[1]), 1e-6, "two meshes: aux");
  static const char* const kNames[5] = {"x", "router", "w1", "w3", "w2"};
  for (int i = 0; i < 5; i++) {
    char what[64];
    snprintf(what, sizeof what, "two meshes: d %s", kNames[i]);
    expect_close(dt_var_grad((&p[0].x)[i]), dt_var_grad((&p[1].x)[i]), 1e-5, what);
  }
  for (int v = 0; v < 2; v++) DT_ASSERT_OK(dt_tape_destroy(tape[v]));
  /* tokens replicated over the ep ranks: refused, nothing recorded that matters */
  dt_var_t xr, o2;
  dt_placement_t rep[1] = {dt_replicate()};
  DT_ASSERT_OK(dt_tape_create(&tape[0]));
  DT_ASSERT_OK(dt_ag_redistribute(tape[0], p[0].x, rep, &xr));
  DT_ASSERT_STATUS(dt_nn_moe(tape[0], xr, p[0].router, p[0].w1, p[0].w3, p[0].w2, K, 0.0, 0.01,
                             &o2, NULL, NULL),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "same tokens") != NULL, "message: %s", dt_last_error());
  /* a mesh over other ranks */
  if (g_world >= 2) {
    int one[1] = {1}, r0[1] = {0};
    dt_mesh_t sm;
    dt_var_t xl, bad;
    DT_ASSERT_OK(dt_mesh_create(1, one, NULL, r0, &sm));
    DT_ASSERT_OK(dt_ag_to_local(tape[0], p[0].x, NULL, &xl));
    DT_ASSERT_STATUS(dt_ag_local_to_mesh(tape[0], xl, sm, &bad), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(bad == NULL, "no output on failure");
    DT_ASSERT_OK(dt_mesh_destroy(sm));
  }
  DT_ASSERT_OK(dt_tape_destroy(tape[0]));
  for (int v = 0; v < 2; v++) moe_params_destroy(&p[v]);
  DT_ASSERT_OK(dt_mesh_destroy(em));
  DT_ASSERT_OK(dt_mesh_destroy(xm));
}

/* uniform routing: token n's top-2 are n mod E and n + 1 mod E (x one-hot-ish, router the
 * identity), so each rank's T tokens (a multiple of E) give every expert 2 T / E rows */
static void test_traffic(void) {
  const int64_t E = 8, D = 8, F = 6, T = 16, N = T * g_world;
  const int K = 2, EP = g_world;
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  float* x = calloc((size_t)(N * D), sizeof(float));
  float* r = calloc((size_t)(E * D), sizeof(float));
  for (int64_t n = 0; n < N; n++) {
    x[n * D + n % E] = 2.0f;
    x[n * D + (n + 1) % E] = 1.0f;
    for (int64_t d = 0; d < D; d++) x[n * D + d] += 0.01f * (float)((n * 7 + d * 3) % 5);
  }
  for (int64_t e = 0; e < E; e++) r[e * D + e] = 1.0f;
  uint64_t nbytes, calls;
  check_ep(mesh, N, D, E, F, K, "S(0)", "S(0)", 0, x, r, &nbytes, &calls);
  uint64_t rows = 4 * (uint64_t)(T * K) * (uint64_t)(EP - 1) / (uint64_t)EP; /* 4 T K (EP-1)/EP */
  uint64_t want = rows * (uint64_t)D * sizeof(float) + 8 * (uint64_t)E * (EP - 1) / EP;
  DT_ASSERT_TRUE(
      nbytes == want,
      "all-to-all bytes %llu, want 4 T K D (EP-1)/EP = %llu f32 elements plus %llu bytes "
      "of counts",
      (unsigned long long)nbytes, (unsigned long long)(rows * D),
      (unsigned long long)(8 * E * (EP - 1) / EP));
  DT_ASSERT_EQ(calls, 5);
  if (g_rank == 0)
    printf(
        "EP %d, T %lld, K %d, D %lld: all-to-all %llu bytes per rank forward + backward = "
        "4 T K D (EP-1)/EP f32 + %lld count bytes, %llu calls\n",
        EP, (long long)T, K, (long long)D, (unsigned long long)nbytes,
        (long long)(8 * E * (EP - 1) / EP), (unsigned long long)calls);
  /* a capacity under EP is per rank: each rank's 16 tokens give every expert 4 slots, capacity
   * ceil(0.5 * 16 * 2 / 8) = 2 keeps half: 16 dropped per rank */
  moe_params_t p = moe_params(mesh, N, D, E, F, "S(0)", "S(0)", x, r);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t out;
  dt_moe_stats_t st;
  DT_ASSERT_OK(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, K, 0.5, 0.01, &out, NULL, &st));
  DT_ASSERT_EQ(st.expert_parallel_dim, 0);
  DT_ASSERT_EQ(st.capacity, -1);
  DT_ASSERT_EQ(st.dropped, 16 * EP);
  DT_ASSERT_EQ(st.expert_rows, N * K - 16 * EP);
  DT_ASSERT_OK(dt_tape_backward(tape, loss_of(tape, out, NULL)));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  moe_params_destroy(&p);
  free(x);
  free(r);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* the ragged all-to-all alone: rank i sends (i + j) % 3 rows to rank j */
static void test_all_to_all(void) {
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  const int n = g_world, me = g_rank;
  int64_t send[8], recv[8], rows = 0, rrows = 0;
  for (int j = 0; j < n; j++) {
    send[j] = (me + j) % 3;
    recv[j] = (j + me) % 3;
    rows += send[j];
    rrows += recv[j];
  }
  const int64_t W = 3;
  float* buf = malloc(sizeof(float) * (size_t)(rows * W + 1));
  for (int64_t r = 0, at = 0; r < n; r++) /* row value: 100 sender + 10 destination + k */
    for (int64_t k = 0; k < send[r]; k++, at++)
      for (int64_t w = 0; w < W; w++)
        buf[at * W + w] = (float)(100 * me + 10 * r + k) + 0.5f * (float)w;
  dt_placement_t rep[1] = {dt_replicate()};
  const int64_t xs[2] = {rows, W};
  dt_tensor_t xt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, xs, rep, buf, &xt)); /* rank-local */
  for (int given = 0; given <= 1; given++) {
    dt_var_t xv, yv, pv, lv;
    DT_ASSERT_OK(dt_var_leaf(xt, 1, &xv));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    DT_ASSERT_OK(dt_ag_all_to_all(tape, xv, 0, n, send, given ? recv : NULL, &yv));
    int64_t ys[2], yn;
    DT_ASSERT_OK(dt_tensor_local_shape(dt_var_value(yv), ys));
    DT_ASSERT_EQ(ys[0], rrows);
    DT_ASSERT_OK(dt_tensor_local_numel(dt_var_value(yv), &yn));
    float* y = malloc(sizeof(float) * (size_t)(yn ? yn : 1)); /* values read through the backend */
    DT_ASSERT_OK(dt_tensor_read_local(dt_var_value(yv), 0, yn, y));
    for (int64_t i = 0, at = 0; i < n; i++)
      for (int64_t k = 0; k < recv[i]; k++, at++)
        DT_ASSERT_TRUE(y[at * W + 1] == (float)(100 * i + 10 * me + k) + 0.5f, "row %lld",
                       (long long)at);
    /* d/dx sum(y * y) = 2 x: the gradient came back to the rows it was sent from */
    dt_var_t yy[2] = {yv, yv};
    const int64_t all[1] = {0};
    DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, yy, 0, NULL, 0, NULL, 1, &pv));
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &pv, 1, all, 0, NULL, 1, &lv));
    DT_ASSERT_OK(dt_tape_backward(tape, lv));
    const int64_t gn = rows * W;
    float* g = malloc(sizeof(float) * (size_t)(gn > 0 ? gn : 1));
    DT_ASSERT_OK(dt_tensor_read_local(dt_var_grad(xv), 0, gn, g));
    for (int64_t i = 0; i < rows * W; i++)
      DT_ASSERT_TRUE(g[i] == 2.0f * buf[i], "grad %lld", (long long)i);
    free(g);
    free(y);
    DT_ASSERT_OK(dt_tape_destroy(tape));
    /* the leaf owns xt: take it back for the next round */
    if (!given) {
      DT_ASSERT_OK(dt_var_destroy(xv));
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, xs, rep, buf, &xt));
    } else {
      DT_ASSERT_OK(dt_var_destroy(xv));
    }
  }
  /* send counts that do not add up to the rows: an error on every rank */
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, xs, rep, buf, &xt));
  dt_var_t xv, yv;
  DT_ASSERT_OK(dt_var_leaf(xt, 0, &xv));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  int64_t bad[8];
  memcpy(bad, send, sizeof bad);
  if (me == 0) bad[0] += 1;
  dt_status_t st = dt_ag_all_to_all(tape, xv, 0, n, bad, NULL, &yv);
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG, "mismatched counts gave %s", dt_status_name(st));
  if (me == 0)
    DT_ASSERT_TRUE(strstr(dt_last_error(), "send counts sum to") != NULL, "%s", dt_last_error());
  st = dt_ag_all_to_all(tape, xv, 0, n + 1, send, NULL, &yv);
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "counts for mesh dim"), "%s",
                 dt_last_error());
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(xv));
  free(buf);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* from_local onto a Partial(sum) layout: the value is the sum of the ranks' parts, each part's
 * gradient the whole upstream gradient */
static void test_from_local_partial(void) {
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  const int64_t s[2] = {4, 3};
  float part[12], rv[12], want[12], full[12];
  for (int i = 0; i < 12; i++) {
    part[i] = (float)(g_rank + 1) * (float)(i + 1);
    rv[i] = (float)(i % 5) - 2.0f;
    want[i] = (float)(g_world * (g_world + 1) / 2) * (float)(i + 1);
  }
  dt_placement_t rep[1] = {dt_replicate()}, psum[1] = {dt_partial(DT_REDUCE_SUM)};
  dt_tensor_t xt, lt, rt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s, rep, part, &xt)); /* rank-local part */
  DT_ASSERT_OK(dt_tensor_meta(mesh, DT_F32, 2, s, psum, &lt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s, rep, rv, &rt));
  dt_var_t x, like, r, y, p, l;
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_var_leaf(xt, 1, &x));
  DT_ASSERT_OK(dt_tape_constant(tape, lt, &like));
  DT_ASSERT_OK(dt_tape_constant(tape, rt, &r));
  DT_ASSERT_OK(dt_ag_from_local(tape, x, like, &y));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(y), full, sizeof full));
  for (int i = 0; i < 12; i++) DT_ASSERT_TRUE(full[i] == want[i], "sum element %d", i);
  dt_var_t yr[2] = {y, r};
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, yr, 0, NULL, 0, NULL, 1, &p));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &p, 1, all, 0, NULL, 1, &l));
  DT_ASSERT_OK(dt_tape_backward(tape, l));
  float g[12]; /* read through the backend: the gradient may live on a device */
  DT_ASSERT_OK(dt_tensor_read_local(dt_var_grad(x), 0, 12, g));
  for (int i = 0; i < 12; i++) DT_ASSERT_TRUE(g[i] == rv[i], "gradient element %d", i);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* The small MoE Llama of the model tests, and their tokens and targets. */
static dt_llama_config_t moe_config(void) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.vocab = 32;
  c.seq_len = 8;
  c.n_experts = 4;
  c.top_k = 2;
  c.seed = 5;
  return c;
}
static void moe_tokens(int n, int64_t vocab, int64_t* tok, int64_t* tgt) {
  for (int i = 0; i < n; i++) {
    tok[i] = (i * 7 + 3) % vocab;
    tgt[i] = (i * 5 + 1) % vocab;
  }
}

/* One forward and backward of m on (B, S) tokens placed pl on mesh; the MoE stats: experts
 * parallel over ep_dim (-1: not), every token of every layer routed. */
static void moe_step(dt_llama_t m, dt_mesh_t mesh, const int64_t* bs, dt_placement_t pl,
                     const int64_t* tok, const int64_t* tgt, int ep_dim, int64_t tokens,
                     dt_tape_t* tape, dt_var_t* loss) {
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, bs, &pl, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, bs, &pl, tgt, &gt));
  DT_ASSERT_OK(dt_tape_create(tape));
  DT_ASSERT_OK(dt_llama_forward(m, *tape, tt, gt, loss, NULL));
  DT_ASSERT_OK(dt_tape_backward(*tape, *loss));
  dt_tensor_destroy(tt);
  dt_tensor_destroy(gt);
  dt_moe_stats_t st;
  DT_ASSERT_OK(dt_llama_moe_stats(m, &st));
  DT_ASSERT_EQ(st.expert_parallel_dim, ep_dim);
  DT_ASSERT_EQ(st.tokens, tokens);
}

/* m[0] against m[1]: the losses and every parameter's gradient within 1e-5; then both freed. */
static void moe_compare(dt_llama_t* m, dt_tape_t* tape, dt_var_t* loss, const char* what) {
  char w[200];
  snprintf(w, sizeof w, "%s loss", what);
  expect_close(dt_var_value(loss[0]), dt_var_value(loss[1]), 1e-5, w);
  dt_var_t *p0, *p1, keep[64];
  const char* const* names;
  int n0, n1;
  DT_ASSERT_OK(dt_llama_params(m[0], &p0, NULL, &n0, NULL));
  DT_ASSERT_TRUE(n0 <= 64, "too many parameters");
  memcpy(keep, p0, sizeof(dt_var_t) * (size_t)n0);
  DT_ASSERT_OK(dt_llama_params(m[1], &p1, &names, &n1, NULL));
  DT_ASSERT_EQ(n0, n1);
  for (int i = 0; i < n0; i++) {
    snprintf(w, sizeof w, "%s d %s", what, names[i]);
    expect_close(dt_var_grad(keep[i]), dt_var_grad(p1[i]), 1e-5, w);
  }
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_tape_destroy(tape[v]));
    DT_ASSERT_OK(dt_llama_destroy(m[v]));
  }
}

/* the model: experts Shard(0) by the plan run expert-parallel, same loss and gradients */
static void test_llama(void) {
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  const dt_llama_config_t c = moe_config();
  const int B = 4, S = 8;
  int64_t tok[32], tgt[32];
  moe_tokens(B * S, c.vocab, tok, tgt);
  const int64_t bs[2] = {B, S};
  dt_placement_t rep[1] = {dt_replicate()};
  dt_llama_t m[2];
  dt_tape_t tape[2];
  dt_var_t loss[2];
  static const char* const kPlans[2] = {"*.experts.*=S(0)", "*=R"};
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_llama_create(mesh, &c, kPlans[v], &m[v]));
    moe_step(m[v], mesh, bs, rep[0], tok, tgt, v == 0 ? 0 : -1, c.n_layers * B * S, &tape[v],
             &loss[v]);
  }
  moe_compare(m, tape, loss, "llama");
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

/* The model with its experts on an expert mesh (ep 2, efsdp world / 2), another view of the
 * tokens' 1-D data mesh (the trainer's --dp D --ep 2), and a batch of 3 sequences that does not
 * split evenly over the data ranks (2 + 1 at np 2; 1, 1, 1, 0 at np 4): the MoE layers still get
 * each rank's own rows (an uneven batch used to reach the experts gathered and was refused as
 * "the same tokens" on every rank); loss and every gradient equal the replicated model's. */
static void test_llama_two_meshes_uneven(void) {
  if (g_world % 2 != 0) return;
  const int EP = 2, F = g_world / 2;
  int s1[1] = {g_world}, s2[2] = {EP, F}, ranks[16];
  for (int e = 0; e < EP; e++)
    for (int f = 0; f < F; f++) ranks[e * F + f] = f * EP + e;
  const char* names2[2] = {"ep", "efsdp"};
  dt_mesh_t mesh, em;
  DT_ASSERT_OK(dt_mesh_create(1, s1, NULL, NULL, &mesh));
  DT_ASSERT_OK(dt_mesh_create(2, s2, names2, ranks, &em));
  const dt_llama_config_t c = moe_config();
  const int B = 3, S = 8;
  int64_t tok[24], tgt[24];
  moe_tokens(B * S, c.vocab, tok, tgt);
  const int64_t bs[2] = {B, S};
  dt_llama_t m[2];
  dt_tape_t tape[2];
  dt_var_t loss[2];
  for (int v = 0; v < 2; v++) { /* 0: experts on em, tokens Shard(0); 1: replicated */
    DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &m[v]));
    dt_module_t root;
    DT_ASSERT_OK(dt_llama_module(m[v], &root));
    for (int l = 0; v == 0 && l < c.n_layers; l++) {
      static const char* const w[3] = {"w1", "w3", "w2"};
      for (int k = 0; k < 3; k++) { /* the replicated value, Shard(0) on ep of em */
        char name[64];
        snprintf(name, sizeof name, "layers.%d.experts.%s", l, w[k]);
        dt_var_t p, np;
        DT_ASSERT_OK(dt_module_param(root, name, &p));
        int64_t shape[3];
        DT_ASSERT_OK(dt_tensor_shape(dt_var_value(p), shape));
        const int64_t n = shape[0] * shape[1] * shape[2];
        float* buf = malloc(sizeof(float) * (size_t)n);
        DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(p), buf, sizeof(float) * (size_t)n));
        dt_placement_t pl[2] = {dt_shard(0), dt_replicate()};
        dt_tensor_t t;
        DT_ASSERT_OK(dt_tensor_from_full(em, DT_F32, 3, shape, pl, buf, &t));
        free(buf);
        DT_ASSERT_OK(dt_var_leaf(t, 1, &np));
        DT_ASSERT_OK(dt_module_set_param(root, name, np));
      }
    }
    moe_step(m[v], mesh, bs, v == 0 ? dt_shard(0) : dt_replicate(), tok, tgt, v == 0 ? 0 : -1,
             c.n_layers * B * S, &tape[v], &loss[v]);
  }
  moe_compare(m, tape, loss, "uneven llama");
  DT_ASSERT_OK(dt_mesh_destroy(em));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  test_all_to_all();
  test_from_local_partial();
  test_equal();
  test_two_meshes();
  test_traffic();
  test_llama();
  test_llama_two_meshes_uneven();
  if (g_rank == 0) printf("test_moe_ep np=%d: passed\n", g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

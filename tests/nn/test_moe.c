/* test_moe.c - the routed mixture of experts and its ops, on 1, 2 and 3 ranks.
 *
 * - grouped_mm equals a loop of one linear per expert (narrowed rows and weights, through the
 *   ops), forward and backward (gradients of x and w), for both transposes, with experts that
 *   get no rows and with T = 0, for replicated, row-sharded, tensor-parallel and expert-sharded
 *   placements;
 * - dt_nn_moe (routed, dropless) equals dt_nn_moe_dense (the reference that runs every expert):
 *   output, aux loss and the gradients of x, the router and the stacked weights to 1e-5, with
 *   the parameters replicated, tensor-parallel (w1/w3 Shard(1), w2 Shard(2)) and expert-sharded
 *   (Shard(0)), x replicated or row-sharded;
 * - fewer tokens than ranks (1 and world - 1 tokens at np 2, 3): ranks with no token route
 *   nothing and still join the collectives, expert-parallel and beside whole experts, with the
 *   dense reference's output and gradients;
 * - x row-sharded beside whole experts: each rank routes its own tokens (its rows' grouped-GEMM
 *   FLOPs only, no all-gather / all-to-all / reduce-scatter / send-recv, the output Shard(0)),
 *   and a capacity drops per rank exactly what the host computes from each rank's choices;
 * - moe_route sorts a hand-made routing exactly, and with a capacity drops exactly the slots past
 *   it in token order; dt_nn_moe with a capacity factor drops the count computed on the host from
 *   the same top-k choices (and a factor large enough drops nothing and matches dropless);
 * - FLOPs: the grouped GEMM kernels count only the top_k experts' rows (forward 2 * 3 N K D F,
 *   backward twice that again), the dense reference none, and dt_llama_flops_per_token's MoE
 *   part equals what the kernels ran for a model forward;
 * - bad input (counts not summing to T, negative counts, wrong shapes, top_k > E, an expert index
 *   out of range, a negative capacity factor) fails with DT_ERR_INVALID_ARG and a message.
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

static int g_rank, g_world;

static dt_placement_t pl_of(const char* s) {
  dt_placement_t p;
  int n;
  DT_ASSERT_OK(dt_placements_parse(s, &p, 1, &n));
  return p;
}

/* A leaf of N(0, std) values (depending on name and element only) placed as `pl`. */
static dt_var_t param(dt_mesh_t mesh, const char* name, const char* pl, int nd,
                      const int64_t* shape, double std) {
  char plan[64];
  snprintf(plan, sizeof plan, "%s=%s", name, pl);
  dt_var_t v;
  DT_ASSERT_OK(dt_nn_param(mesh, plan, name, nd, shape, DT_INIT_NORMAL, std, 7, &v));
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

/* The full values of a tensor (Partial reduced), malloc'd. */
static float* full(dt_tensor_t t) {
  int64_t n = numel(t);
  float* f = malloc(sizeof(float) * (size_t)(n ? n : 1));
  DT_ASSERT_OK(dt_tensor_gather_full(t, f, sizeof(float) * (size_t)n));
  return f;
}

static void expect_close(dt_tensor_t a, dt_tensor_t b, double tol, const char* what) {
  DT_ASSERT_TRUE(a != NULL && b != NULL, "%s: missing tensor", what);
  int64_t n = numel(a);
  DT_ASSERT_EQ(n, numel(b));
  float *x = full(a), *y = full(b);
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)x[i] - y[i]), m = fabs((double)y[i]);
    DT_ASSERT_TRUE(d <= tol * (m > 1.0 ? m : 1.0), "%s element %lld: %.9g vs %.9g", what,
                   (long long)i, x[i], y[i]);
  }
  free(x);
  free(y);
}

/* loss = sum(out * r) (+ aux) on the tape, r fixed values; backward. */
static void backward_of(dt_tape_t tape, dt_var_t out, dt_var_t aux) {
  dt_tensor_t o = dt_var_value(out), r;
  dt_mesh_t mesh;
  int nd;
  int64_t s[DT_MAX_DIMS];
  DT_ASSERT_OK(dt_tensor_mesh(o, &mesh));
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
  DT_ASSERT_OK(dt_tape_backward(tape, l));
}

static dt_tensor_t counts_tensor(dt_mesh_t mesh, int E, const int64_t* c) {
  dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  const int64_t s[1] = {E};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, s, rep, c, &t));
  return t;
}

/* ---------------------------------------------------------------------------------------------
 * grouped_mm against one linear (or mm) per expert */

static void check_grouped(dt_mesh_t mesh, int trans, int E, const int64_t* cnt, int64_t K,
                          int64_t N, const char* xpl, const char* wpl) {
  int64_t T = 0;
  for (int e = 0; e < E; e++) T += cnt[e];
  const int64_t xs[2] = {T, K}, ws[3] = {E, trans ? N : K, trans ? K : N};
  dt_var_t x[2], w[2], out[2];
  dt_tape_t tape[2];
  for (int v = 0; v < 2; v++) {
    x[v] = param(mesh, "x", v ? "R" : xpl, 2, xs, 1.0);
    w[v] = param(mesh, "w", v ? "R" : wpl, 3, ws, 1.0);
    DT_ASSERT_OK(dt_tape_create(&tape[v]));
  }
  /* the op */
  dt_tensor_t c = counts_tensor(mesh, E, cnt);
  dt_var_t cv;
  DT_ASSERT_OK(dt_tape_constant(tape[0], c, &cv));
  dt_var_t in[3] = {x[0], w[0], cv};
  const int64_t ta[1] = {trans};
  DT_ASSERT_OK(dt_ag_op(tape[0], "grouped_mm", 3, in, 1, ta, 0, NULL, 1, &out[0]));
  /* the loop: rows [o, o + c_e) times expert e's matrix, pieces concatenated (an all-zero
   * result when no expert has rows) */
  dt_var_t pieces[8];
  int np = 0;
  int64_t o = 0;
  for (int e = 0; e < E; e++) {
    if (cnt[e] == 0) continue;
    dt_var_t xe, we3, we, ye;
    const int64_t nx[3] = {0, o, cnt[e]}, nw[3] = {0, e, 1}, w2[2] = {ws[1], ws[2]};
    DT_ASSERT_OK(dt_ag_op(tape[1], "narrow", 1, &x[1], 3, nx, 0, NULL, 1, &xe));
    DT_ASSERT_OK(dt_ag_op(tape[1], "narrow", 1, &w[1], 3, nw, 0, NULL, 1, &we3));
    DT_ASSERT_OK(dt_ag_op(tape[1], "reshape", 1, &we3, 2, w2, 0, NULL, 1, &we));
    dt_var_t xw[2] = {xe, we};
    DT_ASSERT_OK(
        dt_ag_op(tape[1], trans ? "linear_nobias" : "mm", 2, xw, 0, NULL, 0, NULL, 1, &ye));
    DT_ASSERT_TRUE(np < 8, "too many pieces");
    pieces[np++] = ye;
    o += cnt[e];
  }
  if (np == 0) { /* T = 0 */
    dt_var_t z;
    const int64_t z2[2] = {0, N};
    dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
    dt_tensor_t zt;
    DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, z2, rep, &zt));
    DT_ASSERT_OK(dt_tape_constant(tape[1], zt, &z));
    out[1] = z;
  } else {
    const int64_t d0[1] = {0};
    DT_ASSERT_OK(dt_ag_op(tape[1], "cat", np, pieces, 1, d0, 0, NULL, 1, &out[1]));
  }
  char what[160];
  snprintf(what, sizeof what, "grouped_mm trans %d x %s w %s T %lld: output", trans, xpl, wpl,
           (long long)T);
  expect_close(dt_var_value(out[0]), dt_var_value(out[1]), 1e-5, what);
  for (int v = 0; v < (np == 0 ? 1 : 2); v++) backward_of(tape[v], out[v], NULL);
  snprintf(what, sizeof what, "grouped_mm trans %d x %s w %s T %lld: d w", trans, xpl, wpl,
           (long long)T);
  if (np == 0) { /* no rows: no gradient reached w in the loop; the op's must be zeros */
    float* g = full(dt_var_grad(w[0]));
    for (int64_t i = 0; i < numel(dt_var_grad(w[0])); i++) DT_ASSERT_TRUE(g[i] == 0.0f, "%s", what);
    free(g);
  } else {
    expect_close(dt_var_grad(w[0]), dt_var_grad(w[1]), 1e-5, what);
    /* an expert without rows gets a zero gradient */
    snprintf(what, sizeof what, "grouped_mm trans %d x %s w %s: d x", trans, xpl, wpl);
    expect_close(dt_var_grad(x[0]), dt_var_grad(x[1]), 1e-5, what);
  }
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_tape_destroy(tape[v]));
    DT_ASSERT_OK(dt_var_destroy(x[v]));
    DT_ASSERT_OK(dt_var_destroy(w[v]));
  }
}

static void test_grouped_mm(dt_mesh_t mesh) {
  static const int64_t kCounts[4] = {3, 0, 5, 1}, kEmpty[3] = {0, 0, 0}, kOne[2] = {0, 7};
  static const char* const kX[3] = {"R", "S(0)", "S(1)"};
  static const char* const kW[4] = {"R", "S(0)", "S(1)", "S(2)"};
  for (int trans = 0; trans <= 1; trans++) {
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 4; j++) check_grouped(mesh, trans, 4, kCounts, 6, 5, kX[i], kW[j]);
    check_grouped(mesh, trans, 3, kEmpty, 4, 3, "R", "R"); /* T = 0 */
    check_grouped(mesh, trans, 3, kEmpty, 4, 3, "S(0)", "S(0)");
    check_grouped(mesh, trans, 2, kOne, 4, 3, "S(0)", "S(0)"); /* one expert has every row */
  }
}

/* ---------------------------------------------------------------------------------------------
 * routed MoE against the dense reference */

typedef struct {
  dt_var_t x, router, w1, w3, w2;
} moe_params_t;

static moe_params_t moe_params(dt_mesh_t mesh, int64_t N, int64_t D, int64_t E, int64_t F,
                               const char* xpl, const char* rpl, const char* w13pl,
                               const char* w2pl) {
  const int64_t sx[2] = {N, D}, sr[2] = {E, D}, s1[3] = {E, F, D}, s2[3] = {E, D, F};
  moe_params_t p;
  p.x = param(mesh, "x", xpl, 2, sx, 1.0);
  p.router = param(mesh, "router", rpl, 2, sr, 0.5);
  p.w1 = param(mesh, "w1", w13pl, 3, s1, 0.3);
  p.w3 = param(mesh, "w3", w13pl, 3, s1, 0.3);
  p.w2 = param(mesh, "w2", w2pl, 3, s2, 0.3);
  return p;
}

static void moe_params_destroy(moe_params_t* p) {
  dt_var_t* v[5] = {&p->x, &p->router, &p->w1, &p->w3, &p->w2};
  for (int i = 0; i < 5; i++) DT_ASSERT_OK(dt_var_destroy(*v[i]));
}

static void check_routed_vs_dense(dt_mesh_t mesh, int64_t N, const char* xpl, const char* w13pl,
                                  const char* w2pl) {
  const int64_t D = 8, E = 4, F = 16;
  const int K = 2;
  moe_params_t p[2];
  dt_tape_t tape[2];
  dt_var_t out[2], aux[2];
  for (int v = 0; v < 2; v++) {
    p[v] = moe_params(mesh, N, D, E, F, xpl, "R", w13pl, w2pl);
    DT_ASSERT_OK(dt_tape_create(&tape[v]));
  }
  dt_moe_stats_t st;
  DT_ASSERT_OK(dt_nn_moe(tape[0], p[0].x, p[0].router, p[0].w1, p[0].w3, p[0].w2, K, 0.0, 0.01,
                         &out[0], &aux[0], &st));
  DT_ASSERT_EQ(st.tokens, N);
  DT_ASSERT_EQ(st.assignments, N * K);
  DT_ASSERT_EQ(st.dropped, 0);
  DT_ASSERT_EQ(st.expert_rows, N * K);
  /* each rank routes its own tokens under expert parallelism and where split tokens meet whole
   * experts */
  DT_ASSERT_EQ(st.local_routing, !strcmp(w13pl, "S(0)") || (!strcmp(xpl, "S(0)") &&
                                                            !strcmp(w13pl, "R")));
  DT_ASSERT_OK(dt_nn_moe_dense(tape[1], p[1].x, p[1].router, p[1].w1, p[1].w3, p[1].w2, K, 0.01,
                               &out[1], &aux[1]));
  char what[160];
  snprintf(what, sizeof what, "moe N %lld x %s w1/w3 %s w2 %s: output", (long long)N, xpl, w13pl,
           w2pl);
  expect_close(dt_var_value(out[0]), dt_var_value(out[1]), 1e-5, what);
  expect_close(dt_var_value(aux[0]), dt_var_value(aux[1]), 1e-6, "aux");
  for (int v = 0; v < 2; v++) backward_of(tape[v], out[v], aux[v]);
  static const char* const kNames[5] = {"x", "router", "w1", "w3", "w2"};
  for (int i = 0; i < 5; i++) {
    dt_var_t a = (&p[0].x)[i], b = (&p[1].x)[i];
    snprintf(what, sizeof what, "moe N %lld x %s w1/w3 %s w2 %s: d %s", (long long)N, xpl, w13pl,
             w2pl, kNames[i]);
    expect_close(dt_var_grad(a), dt_var_grad(b), 1e-5, what);
  }
  for (int v = 0; v < 2; v++) {
    DT_ASSERT_OK(dt_tape_destroy(tape[v]));
    moe_params_destroy(&p[v]);
  }
}

static void test_routed_vs_dense(dt_mesh_t mesh) {
  check_routed_vs_dense(mesh, 12, "R", "R", "R");
  check_routed_vs_dense(mesh, 12, "R", "S(1)", "S(2)"); /* tensor parallel on F */
  check_routed_vs_dense(mesh, 12, "R", "S(0)", "S(0)"); /* experts sharded */
  check_routed_vs_dense(mesh, 12, "S(0)", "R", "R");    /* tokens sharded */
  check_routed_vs_dense(mesh, 12, "S(0)", "S(1)", "S(2)");
}

/* Fewer tokens than ranks: the chunk rule leaves some ranks no rows, which route nothing (their
 * gates, (0, K), reshape to (0) on the way) but still join the others' collectives, both
 * expert-parallel and beside whole experts; at np 3 and 4 E = 4 experts also split unevenly. */
static void test_few_tokens(dt_mesh_t mesh) {
  const int64_t ns[2] = {1, g_world - 1};
  for (int k = 0; k < 2; k++) {
    if (ns[k] < 1 || (k == 1 && ns[1] == ns[0])) continue;
    check_routed_vs_dense(mesh, ns[k], "S(0)", "S(0)", "S(0)"); /* expert parallel */
    check_routed_vs_dense(mesh, ns[k], "S(0)", "R", "R");       /* each rank its own tokens */
  }
}

/* The routing choices dt_nn_moe makes for p (the top-k experts of softmax(x router^T)), all N K
 * of them in token order, on the host. */
static void host_choices(const moe_params_t* p, int K, int64_t* idx, size_t nbytes) {
  dt_tensor_t logits, probs, tk[2];
  DT_ASSERT_OK(dt_linear(dt_var_value(p->x), dt_var_value(p->router), NULL, &logits));
  const int64_t last[1] = {-1};
  DT_ASSERT_OK(dt_op_run("softmax", 1, &logits, 1, last, 0, NULL, &probs));
  DT_ASSERT_OK(dt_topk(probs, K, 1, &tk[0], &tk[1]));
  DT_ASSERT_OK(dt_tensor_gather_full(tk[1], idx, nbytes));
  dt_tensor_destroy(logits);
  dt_tensor_destroy(probs);
  dt_tensor_destroy(tk[0]);
  dt_tensor_destroy(tk[1]);
}

/* Tokens split (rows Shard(0)) beside whole experts: each rank routes and computes only its own
 * tokens (the grouped GEMMs' FLOPs of its N / world rows, not of all N), with nothing gathered or
 * exchanged; the output keeps x's placement. A capacity applies per rank (stats->capacity -1):
 * the drops equal those computed on the host from each rank's own choices, summed. */
static void test_local_routing(dt_mesh_t mesh) {
  const int64_t N = 24, D = 8, E = 4, F = 8;
  const int K = 2;
  moe_params_t p = moe_params(mesh, N, D, E, F, "S(0)", "R", "R", "R");
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t out, aux;
  dt_moe_stats_t st;
  dt_counters_t c0, c1;
  int64_t fl;
  DT_ASSERT_OK(dt_counters_get(mesh, &c0));
  DT_ASSERT_OK(dt_grouped_mm_flops_reset());
  DT_ASSERT_OK(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, K, 0.0, 0.01, &out, &aux, &st));
  DT_ASSERT_OK(dt_grouped_mm_flops(&fl));
  DT_ASSERT_OK(dt_counters_get(mesh, &c1));
  DT_ASSERT_EQ(st.local_routing, 1);
  DT_ASSERT_EQ(st.expert_parallel_dim, -1);
  const int64_t Nl = N / g_world; /* 24 splits evenly over 1, 2, 3, 4 ranks */
  DT_ASSERT_EQ(fl, 2 * 3 * Nl * K * D * F);
  static const dt_collective_t kMoves[4] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_TO_ALL,
                                            DT_COLL_REDUCE_SCATTER, DT_COLL_SEND_RECV};
  for (int i = 0; i < 4; i++)
    DT_ASSERT_TRUE(c1.calls[kMoves[i]] == c0.calls[kMoves[i]],
                   "the forward ran %llu collectives of kind %d",
                   (unsigned long long)(c1.calls[kMoves[i]] - c0.calls[kMoves[i]]), kMoves[i]);
  dt_placement_t op[DT_MAX_MESH_DIMS];
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(out), op));
  DT_ASSERT_TRUE(op[0].kind == DT_SHARD && op[0].dim == 0, "the output is not Shard(0)");
  backward_of(tape, out, aux);
  DT_ASSERT_OK(dt_tape_destroy(tape));

  /* per-rank capacity: the host's count from this rank's rows of the same top-k choices */
  int64_t idx[48];
  host_choices(&p, K, idx, sizeof idx);
  const double cf = 0.5;
  const int64_t cap = (int64_t)ceil(cf * (double)(Nl * K) / (double)E);
  int64_t want = 0;
  for (int r = 0; r < g_world; r++) {
    int64_t load[4] = {0};
    for (int64_t i = r * Nl * K; i < (r + 1) * Nl * K; i++) load[idx[i]]++;
    for (int e = 0; e < E; e++) want += load[e] > cap ? load[e] - cap : 0;
  }
  DT_ASSERT_TRUE(want > 0, "the test drops nothing");
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, K, cf, 0.01, &out, NULL, &st));
  DT_ASSERT_EQ(st.capacity, -1);
  DT_ASSERT_EQ(st.dropped, want);
  DT_ASSERT_EQ(st.expert_rows, N * K - want);
  backward_of(tape, out, NULL);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  moe_params_destroy(&p);
}

/* ---------------------------------------------------------------------------------------------
 * routing and capacity */

static void test_route(dt_mesh_t mesh) {
  /* 6 tokens, top-2 of 3 experts: slot s = 2 n + j */
  static const int64_t kIdx[12] = {0, 1, 1, 2, 0, 2, 0, 1, 1, 0, 2, 1};
  const int64_t s[2] = {6, 2};
  dt_placement_t pl[DT_MAX_MESH_DIMS] = {pl_of("S(0)"), dt_replicate()};
  dt_tensor_t idx;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, s, pl, kIdx, &idx));
  for (int cap = 0; cap <= 2; cap += 2) {
    dt_tensor_t order, tok, counts;
    DT_ASSERT_OK(dt_moe_route(idx, 3, cap, &order, &tok, &counts));
    int64_t o[12], t[12], c[3];
    DT_ASSERT_OK(dt_tensor_gather_full(order, o, sizeof o));
    DT_ASSERT_OK(dt_tensor_gather_full(tok, t, sizeof t));
    DT_ASSERT_OK(dt_tensor_gather_full(counts, c, sizeof c));
    /* expert 0: slots 0 4 6 9; expert 1: 1 2 7 8 11; expert 2: 3 5 10 */
    static const int64_t kAll[12] = {0, 4, 6, 9, 1, 2, 7, 8, 11, 3, 5, 10};
    /* capacity 2: 0 4 | 1 2 | 3 5 kept, then the dropped 6 7 8 9 10 11 in slot order */
    static const int64_t kCap[12] = {0, 4, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11};
    const int64_t* want = cap ? kCap : kAll;
    for (int i = 0; i < 12; i++) {
      DT_ASSERT_EQ(o[i], want[i]);
      DT_ASSERT_EQ(t[i], want[i] / 2);
    }
    DT_ASSERT_EQ(c[0], cap ? 2 : 4);
    DT_ASSERT_EQ(c[1], cap ? 2 : 5);
    DT_ASSERT_EQ(c[2], cap ? 2 : 3);
    dt_tensor_destroy(order);
    dt_tensor_destroy(tok);
    dt_tensor_destroy(counts);
  }
  dt_tensor_destroy(idx);
}

/* dt_nn_moe with a capacity factor drops what the host computes from the same top-k choices */
static void test_capacity(dt_mesh_t mesh) {
  const int64_t N = 24, D = 8, E = 4, F = 8;
  const int K = 2;
  moe_params_t p = moe_params(mesh, N, D, E, F, "R", "R", "R", "R");
  int64_t idx[48], load[4] = {0};
  host_choices(&p, K, idx, sizeof idx);
  for (int i = 0; i < N * K; i++) load[idx[i]]++;
  int64_t maxload = 0;
  for (int e = 0; e < E; e++) maxload = load[e] > maxload ? load[e] : maxload;
  static const double kFactors[4] = {0.5, 0.75, 1.0, 1.25};
  dt_var_t ref_out = NULL;
  dt_tape_t rt;
  DT_ASSERT_OK(dt_tape_create(&rt));
  DT_ASSERT_OK(dt_nn_moe(rt, p.x, p.router, p.w1, p.w3, p.w2, K, 0.0, 0.01, &ref_out, NULL, NULL));
  int saw_drop = 0;
  for (int f = 0; f < 4; f++) {
    int64_t cap = (int64_t)ceil(kFactors[f] * (double)(N * K) / (double)E), want = 0;
    for (int e = 0; e < E; e++) want += load[e] > cap ? load[e] - cap : 0;
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    dt_var_t out;
    dt_moe_stats_t st;
    DT_ASSERT_OK(dt_grouped_mm_flops_reset());
    DT_ASSERT_OK(
        dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, K, kFactors[f], 0.01, &out, NULL, &st));
    DT_ASSERT_EQ(st.capacity, cap);
    DT_ASSERT_EQ(st.dropped, want);
    DT_ASSERT_EQ(st.expert_rows, N * K - want);
    int64_t fl;
    DT_ASSERT_OK(dt_grouped_mm_flops(&fl));
    DT_ASSERT_EQ(fl, 2 * 3 * (N * K - want) * D * F);
    saw_drop |= want > 0;
    if (want == 0)
      expect_close(dt_var_value(out), dt_var_value(ref_out), 1e-6, "no drops");
    else
      backward_of(tape, out, NULL); /* dropped rows have a gradient path too */
    DT_ASSERT_OK(dt_tape_destroy(tape));
  }
  DT_ASSERT_TRUE(saw_drop && maxload > (int64_t)ceil(0.5 * N * K / E), "the test drops nothing");
  DT_ASSERT_OK(dt_tape_destroy(rt));
  moe_params_destroy(&p);
}

/* ---------------------------------------------------------------------------------------------
 * FLOPs */

static void test_flops(dt_mesh_t mesh) {
  const int64_t N = 16, D = 8, E = 4, F = 12;
  const int K = 2;
  moe_params_t p = moe_params(mesh, N, D, E, F, "R", "R", "R", "R");
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t out;
  int64_t fwd, all;
  DT_ASSERT_OK(dt_grouped_mm_flops_reset());
  DT_ASSERT_OK(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, K, 0.0, 0.01, &out, NULL, NULL));
  DT_ASSERT_OK(dt_grouped_mm_flops(&fwd));
  DT_ASSERT_EQ(fwd, 2 * 3 * N * K * D * F); /* top_k experts only (all experts: E / K times) */
  backward_of(tape, out, NULL);
  DT_ASSERT_OK(dt_grouped_mm_flops(&all));
  DT_ASSERT_EQ(all, 3 * fwd); /* d x and d w cost a forward each */
  DT_ASSERT_OK(dt_tape_reset(tape));
  DT_ASSERT_OK(dt_grouped_mm_flops_reset());
  DT_ASSERT_OK(dt_nn_moe_dense(tape, p.x, p.router, p.w1, p.w3, p.w2, K, 0.01, &out, NULL));
  DT_ASSERT_OK(dt_grouped_mm_flops(&fwd));
  DT_ASSERT_EQ(fwd, 0);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  moe_params_destroy(&p);

  /* the model: dt_llama_flops_per_token's expert part is what the kernels run */
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.vocab = 32;
  c.seq_len = 8;
  c.n_experts = 4;
  c.top_k = 2;
  c.seed = 3;
  dt_llama_config_t dense = c;
  dense.n_experts = 0;
  dt_llama_config_defaults(&c);
  const double DF = (double)c.dim * c.ffn_dim;
  /* per token and layer: the dense MLP is 6 D F; the MoE the router 2 D E plus 6 D F top_k */
  double expert_fpt = dt_llama_flops_per_token(&c) - dt_llama_flops_per_token(&dense) +
                      c.n_layers * (6.0 * DF - 2.0 * c.dim * c.n_experts);
  DT_ASSERT_TRUE(fabs(expert_fpt - c.n_layers * 6.0 * DF * c.top_k) < 0.5,
                 "flops per token count %g expert FLOPs, want %g", expert_fpt,
                 c.n_layers * 6.0 * DF * c.top_k);
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(mesh, &c, NULL, &m));
  const int B = 2, S = 8;
  int64_t tok[16], tgt[16];
  for (int i = 0; i < B * S; i++) {
    tok[i] = (i * 7) % c.vocab;
    tgt[i] = (i * 5 + 1) % c.vocab;
  }
  const int64_t bs[2] = {B, S};
  dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  dt_tensor_t tt, gt;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, bs, rep, tok, &tt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, bs, rep, tgt, &gt));
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t loss;
  DT_ASSERT_OK(dt_grouped_mm_flops_reset());
  DT_ASSERT_OK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
  DT_ASSERT_OK(dt_grouped_mm_flops(&fwd));
  DT_ASSERT_TRUE(fabs((double)fwd - expert_fpt * B * S) < 0.5,
                 "the kernels ran %lld expert FLOPs, dt_llama_flops_per_token says %g",
                 (long long)fwd, expert_fpt * B * S);
  dt_moe_stats_t st;
  DT_ASSERT_OK(dt_llama_moe_stats(m, &st));
  DT_ASSERT_EQ(st.tokens, c.n_layers * B * S);
  DT_ASSERT_EQ(st.dropped, 0);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  dt_tensor_destroy(tt);
  dt_tensor_destroy(gt);
  DT_ASSERT_OK(dt_llama_destroy(m));
}

/* ---------------------------------------------------------------------------------------------
 * bad input */

static void expect_invalid(dt_status_t st, const char* needle) {
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG, "expected DT_ERR_INVALID_ARG, got %s (%s)",
                 dt_status_name(st), dt_last_error());
  DT_ASSERT_TRUE(strstr(dt_last_error(), needle) != NULL, "message '%s' lacks '%s'",
                 dt_last_error(), needle);
}

static void test_bad_input(dt_mesh_t mesh) {
  const int64_t xs[2] = {5, 4}, ws[3] = {3, 6, 4}, w2d[2] = {6, 4};
  dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  dt_tensor_t x, w, w2, out = NULL;
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 2, xs, rep, 1, &x));
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 3, ws, rep, 2, &w));
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 2, w2d, rep, 3, &w2));
  static const int64_t kShort[3] = {1, 1, 1}, kNeg[3] = {3, -1, 3}, kOk[3] = {2, 0, 3};
  static const int64_t kTwo[2] = {2, 3};
  dt_tensor_t c_short = counts_tensor(mesh, 3, kShort), c_neg = counts_tensor(mesh, 3, kNeg),
              c_ok = counts_tensor(mesh, 3, kOk), c_two = counts_tensor(mesh, 2, kTwo);
  expect_invalid(dt_grouped_mm(x, w, c_short, 1, &out), "sum to 3, the tokens have 5 rows");
  DT_ASSERT_TRUE(out == NULL, "out set on failure");
  expect_invalid(dt_grouped_mm(x, w, c_neg, 1, &out), "negative");
  expect_invalid(dt_grouped_mm(x, w2, c_ok, 1, &out), "weights must be 3-d");
  expect_invalid(dt_grouped_mm(x, w, c_two, 1, &out), "counts has 2 entries for 3 experts");
  expect_invalid(dt_grouped_mm(x, w, c_ok, 0, &out), "inner sizes");
  expect_invalid(dt_grouped_mm(x, w, x, 1, &out), "counts must be");
  expect_invalid(dt_grouped_mm(x, w, c_ok, 2, &out), "trans 2");
  DT_ASSERT_OK(dt_grouped_mm(x, w, c_ok, 1, &out));
  dt_tensor_destroy(out);
  /* routing: an expert index out of range, top_k > E */
  static const int64_t kBadIdx[4] = {0, 3, 1, 0};
  const int64_t is[2] = {2, 2};
  dt_tensor_t idx, o, t, c;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, is, rep, kBadIdx, &idx));
  expect_invalid(dt_moe_route(idx, 3, 0, &o, &t, &c), "expert index 3 of token 0 out of range");
  expect_invalid(dt_moe_route(idx, 1, 0, &o, &t, &c), "top_k 2 exceeds the 1 experts");
  dt_tensor_destroy(idx);
  /* the module */
  moe_params_t p = moe_params(mesh, 6, 8, 4, 12, "R", "R", "R", "R");
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t y, aux;
  expect_invalid(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, 5, 0.0, 0.01, &y, &aux, NULL),
                 "top_k 5 out of range [1, 4 experts]");
  expect_invalid(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, 0, 0.0, 0.01, &y, &aux, NULL),
                 "top_k 0");
  expect_invalid(dt_nn_moe(tape, p.x, p.router, p.w2, p.w3, p.w1, 2, 0.0, 0.01, &y, &aux, NULL),
                 "w1 and w3 must be (E, F, D)");
  expect_invalid(dt_nn_moe(tape, p.x, p.router, p.w1, p.w3, p.w2, 2, -1.0, 0.01, &y, &aux, NULL),
                 "capacity_factor");
  expect_invalid(dt_nn_moe_dense(tape, p.x, p.router, p.w1, p.w3, NULL, 2, 0.01, &y, &aux),
                 "w2 is NULL");
  expect_invalid(dt_nn_moe(tape, p.router, p.x, p.w1, p.w3, p.w2, 2, 0.0, 0.01, &y, &aux, NULL),
                 "must be (E, F, D)");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  moe_params_destroy(&p);
  dt_tensor_destroy(c_short);
  dt_tensor_destroy(c_neg);
  dt_tensor_destroy(c_ok);
  dt_tensor_destroy(c_two);
  dt_tensor_destroy(x);
  dt_tensor_destroy(w);
  dt_tensor_destroy(w2);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  int shape[1] = {g_world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &mesh));
  test_grouped_mm(mesh);
  test_routed_vs_dense(mesh);
  test_few_tokens(mesh);
  test_local_routing(mesh);
  test_route(mesh);
  test_capacity(mesh);
  test_flops(mesh);
  test_bad_input(mesh);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_rank == 0) printf("test_moe np=%d: passed\n", g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

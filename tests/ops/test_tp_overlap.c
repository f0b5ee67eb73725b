/* test_tp_overlap.c - asynchronous tensor parallelism's overlapped linears (ops all_gather_linear
 * and linear_reduce_scatter) on 2, 3 and 4 ranks against a dense double-precision computation of
 * x w^T and its gradients on every rank:
 *   - outputs and the gradients of x and w (loss = sum(y * c), c fixed) within 1e-5 relative to
 *     the largest magnitude, for 3-dim x (batch, sequence, features) and 4-dim x (a dim between
 *     the sequence and the features), sequences the ranks split evenly and unevenly (the chunk
 *     rule: 7 rows over 2, 3 or 4 ranks), inputs that arrive in other placements (moved first),
 *     and, on 4 ranks, a 2 x 2 mesh with the batch or the sequence sharded on the other dim;
 *   - placements: outputs Shard(-1) (all_gather_linear) and Shard(seq) (linear_reduce_scatter)
 *     on the tp dim, the other dim's shard kept;
 *   - traffic from the counters: the forward of either op and its backward are n-1 send_recv
 *     calls on the tp dim carrying the bytes the ring moves (every chunk but one), no other
 *     collective once the inputs are in place; under bf16 a gather ring's chunks (x forward, dy
 *     backward) at 2 bytes an element, a reduce-scatter ring's partial sums at 4;
 *   - the gathered x (all_gather_linear's second output) read by a second linear, as TP's k and v
 *     projections read q's: one ring forward, and x's gradient the sum of both linears' (the
 *     second's partial sum reduced in the first's backward ring);
 *   - bf16 (and f16) gives results in its dtype within its rounding of the f32 ones (bf16 on the
 *     2 x 2 mesh too; f16 also with a batch of one: the gathered x is the ring's own buffer);
 *   - refusals: a gather dim that is the feature dim, w of the wrong width, mixed dtypes, a mesh
 *     dim out of range.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"

static int g_n, g_rank;

static void fill(float* x, int64_t n, int seed) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1);
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
}

static void expect_close(const float* got, const float* want, int64_t n, double tol,
                         const char* what, const char* op, int64_t S) {
  float scale = 0.0f, worst = 0.0f;
  for (int64_t i = 0; i < n; i++) scale = fabsf(want[i]) > scale ? fabsf(want[i]) : scale;
  DT_ASSERT_TRUE(scale > 0.0f, "%s: an all-zero reference", what);
  for (int64_t i = 0; i < n; i++) {
    float d = fabsf(got[i] - want[i]);
    worst = d > worst ? d : worst;
  }
  DT_ASSERT_TRUE(worst <= tol * scale, "%s %s (S=%lld, %d ranks): worst difference %g of %g", op,
                 what, (long long)S, g_n, (double)worst, (double)scale);
}

/* The dense reference: rows M of x (K) and w (N, K): y = x w^T, dx = c w, dw = c^T x. */
static void dense(const float* x, const float* w, const float* c, int64_t M, int64_t K, int64_t N,
                  float* y, float* dx, float* dw) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0.0;
      for (int64_t k = 0; k < K; k++) s += (double)x[i * K + k] * w[j * K + k];
      y[i * N + j] = (float)s;
    }
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++) {
      double s = 0.0;
      for (int64_t j = 0; j < N; j++) s += (double)c[i * N + j] * w[j * K + k];
      dx[i * K + k] = (float)s;
    }
  for (int64_t j = 0; j < N; j++)
    for (int64_t k = 0; k < K; k++) {
      double s = 0.0;
      for (int64_t i = 0; i < M; i++) s += (double)c[i * N + j] * x[i * K + k];
      dw[j * K + k] = (float)s;
    }
}

typedef struct {
  const char* op; /* "all_gather_linear" or "linear_reduce_scatter" */
  int ndim;       /* 3: (B, S, K); 4: (B, S, R, K) */
  int64_t S;
  int tp_dim;                    /* the mesh dim of the ring */
  dt_placement_t xpl[2], wpl[2]; /* where x and w start (moved by the op as needed) */
  dt_dtype_t dtype;
  int64_t batch; /* 0: B */
} case_t;

enum { B = 2, R = 3, K = 5, N = 6 };

/* Runs one case; checks results against the dense reference, the output's placement on the tp
 * dim, and (count_traffic) the ring's traffic. */
static void run_case(dt_mesh_t mesh, const case_t* c, int count_traffic) {
  const int gather = strcmp(c->op, "all_gather_linear") == 0;
  int mnd, n;
  DT_ASSERT_OK(dt_mesh_ndim(mesh, &mnd));
  DT_ASSERT_OK(dt_mesh_size(mesh, c->tp_dim, &n));
  const int64_t bt = c->batch ? c->batch : B, rows = bt * c->S * (c->ndim == 4 ? R : 1);
  int64_t xs[4] = {bt, c->S, c->ndim == 4 ? R : K, K}, ys[4], ws[2] = {N, K};
  memcpy(ys, xs, sizeof ys);
  ys[c->ndim - 1] = N;
  float *x = malloc(sizeof(float) * rows * K), *w = malloc(sizeof(float) * N * K),
        *cc = malloc(sizeof(float) * rows * N), *y = malloc(sizeof(float) * rows * N),
        *dx = malloc(sizeof(float) * rows * K), *dw = malloc(sizeof(float) * N * K),
        *gy = malloc(sizeof(float) * rows * N), *gdx = malloc(sizeof(float) * rows * K),
        *gdw = malloc(sizeof(float) * N * K);
  fill(x, rows * K, 1 + (int)c->S);
  fill(w, N * K, 2);
  fill(cc, rows * N, 3);
  if (c->dtype != DT_F32) { /* the reference on the values bf16 (f16) holds */
    dt_tensor_t t[3];
    float* a[3] = {x, w, cc};
    const int64_t nn[3] = {rows * K, N * K, rows * N};
    const dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
    for (int i = 0; i < 3; i++) {
      const int64_t sh[1] = {nn[i]};
      dt_tensor_t f, h;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 1, sh, rep, a[i], &f));
      DT_ASSERT_OK(dt_cast(f, c->dtype, &h));
      DT_ASSERT_OK(dt_cast(h, DT_F32, &t[i]));
      DT_ASSERT_OK(dt_tensor_gather_full(t[i], a[i], sizeof(float) * (size_t)nn[i]));
      DT_ASSERT_OK(dt_tensor_destroy(f));
      DT_ASSERT_OK(dt_tensor_destroy(h));
      DT_ASSERT_OK(dt_tensor_destroy(t[i]));
    }
  }
  dense(x, w, cc, rows, K, N, y, dx, dw);

  dt_tensor_t tx, tw, tc, tx0, tw0, tc0;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, c->ndim, xs, c->xpl, x, &tx0));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ws, c->wpl, w, &tw0));
  dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, c->ndim, ys, rep, cc, &tc0));
  DT_ASSERT_OK(dt_cast(tx0, c->dtype, &tx));
  DT_ASSERT_OK(dt_cast(tw0, c->dtype, &tw));
  DT_ASSERT_OK(dt_cast(tc0, c->dtype, &tc));
  DT_ASSERT_OK(dt_tensor_destroy(tx0));
  DT_ASSERT_OK(dt_tensor_destroy(tw0));
  DT_ASSERT_OK(dt_tensor_destroy(tc0));

  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t vx, vw, vc, o, m, loss;
  DT_ASSERT_OK(dt_var_leaf(tx, 1, &vx));
  DT_ASSERT_OK(dt_var_leaf(tw, 1, &vw));
  DT_ASSERT_OK(dt_tape_constant(tape, tc, &vc));
  const int64_t ia[2] = {c->tp_dim, 1};
  /* the inputs' moves first: only the op's own traffic is then counted */
  dt_placement_t xat[2], wat[2];
  for (int e = 0; e < mnd; e++) {
    xat[e] = c->xpl[e];
    wat[e] = e == c->tp_dim ? dt_shard(gather ? 0 : 1) : dt_replicate();
  }
  xat[c->tp_dim] = dt_shard(gather ? 1 : c->ndim - 1);
  dt_var_t mx, mw;
  DT_ASSERT_OK(dt_ag_redistribute(tape, vx, xat, &mx));
  DT_ASSERT_OK(dt_ag_redistribute(tape, vw, wat, &mw));
  const dt_var_t in2[2] = {mx, mw};
  DT_ASSERT_OK(dt_counters_reset(mesh));
  dt_var_t outs[2];
  DT_ASSERT_OK(dt_ag_op(tape, c->op, 2, in2, 2, ia, 0, NULL, gather ? 2 : 1, outs));
  o = outs[0];
  dt_counters_t fwd, all;
  DT_ASSERT_OK(dt_counters_get(mesh, &fwd));
  dt_placement_t opl[2];
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(o), opl));
  DT_ASSERT_TRUE(opl[c->tp_dim].kind == DT_SHARD &&
                     (opl[c->tp_dim].dim == (gather ? c->ndim - 1 : 1) ||
                      opl[c->tp_dim].dim == (gather ? -1 : 1 - c->ndim)),
                 "%s: output placement on the tp dim: kind %d dim %d", c->op,
                 (int)opl[c->tp_dim].kind, (int)opl[c->tp_dim].dim);
  for (int e = 0; e < mnd; e++)
    if (e != c->tp_dim)
      DT_ASSERT_TRUE(dt_placement_equal(opl[e], xat[e]), "%s: the output keeps x's placement on "
                     "mesh dim %d", c->op, e);
  const dt_var_t mm[2] = {o, vc};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, mm, 0, NULL, 0, NULL, 1, &m));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &m, 0, NULL, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_counters_reset(mesh));
  /* the backward of sum and mul costs nothing; the op's backward is the ring; the moves'
   * backward (to the leaves' placements) is counted apart: only the tp dim's send_recv checked */
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_counters_get(mesh, &all));

  dt_tensor_t yo, gx, gw;
  DT_ASSERT_OK(dt_cast(dt_var_value(o), DT_F32, &yo));
  DT_ASSERT_OK(dt_cast(dt_var_grad(vx), DT_F32, &gx));
  DT_ASSERT_OK(dt_cast(dt_var_grad(vw), DT_F32, &gw));
  DT_ASSERT_OK(dt_tensor_gather_full(yo, gy, sizeof(float) * rows * N));
  DT_ASSERT_OK(dt_tensor_gather_full(gx, gdx, sizeof(float) * rows * K));
  DT_ASSERT_OK(dt_tensor_gather_full(gw, gdw, sizeof(float) * N * K));
  const double tol = c->dtype == DT_BF16 ? 2e-2 : c->dtype == DT_F16 ? 3e-3 : 1e-5;
  expect_close(gy, y, rows * N, tol, "output", c->op, c->S);
  expect_close(gdx, dx, rows * K, tol, "dx", c->op, c->S);
  expect_close(gdw, dw, N * K, tol, "dw", c->op, c->S);

  if (count_traffic) {
    /* every rank's ring moves every chunk but one: (n-1) calls, the bytes of the chunks this
     * rank sends: a gather ring's (x forward, dy backward) in the inputs' dtype, a reduce-scatter
     * ring's partial sums in f32 */
    const int d = c->tp_dim;
    DT_ASSERT_EQ(fwd.dim_calls[d][DT_COLL_SEND_RECV], n - 1);
    DT_ASSERT_EQ(fwd.calls[DT_COLL_ALL_GATHER] + fwd.calls[DT_COLL_REDUCE_SCATTER] +
                     fwd.calls[DT_COLL_ALL_REDUCE] + fwd.calls[DT_COLL_ALL_TO_ALL],
                 0);
    DT_ASSERT_EQ(all.dim_calls[d][DT_COLL_SEND_RECV], n - 1);
    /* the total over every ring: each chunk travels n-1 hops (x's rows of K features for
     * all_gather_linear, the output's of N for linear_reduce_scatter, forward and backward);
     * rings of the other mesh dim each carry their share of x, or all of it when x is
     * replicated there */
    uint64_t sent[2] = {fwd.dim_nbytes[d][DT_COLL_SEND_RECV], all.dim_nbytes[d][DT_COLL_SEND_RECV]};
    uint64_t tot[2];
    MPI_Allreduce(sent, tot, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    const uint64_t copies = mnd == 2 && xat[1 - d].kind != DT_SHARD ? (uint64_t)(g_n / n) : 1;
    const uint64_t es = c->dtype == DT_F32 ? 4 : 2, hops = copies * (uint64_t)(n - 1) * rows;
    DT_ASSERT_EQ(tot[0], hops * (gather ? K * es : N * 4));
    DT_ASSERT_EQ(tot[1], hops * (gather ? K * 4 : N * es));
  }

  DT_ASSERT_OK(dt_tensor_destroy(yo));
  DT_ASSERT_OK(dt_tensor_destroy(gx));
  DT_ASSERT_OK(dt_tensor_destroy(gw));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(vx));
  DT_ASSERT_OK(dt_var_destroy(vw));
  free(x);
  free(w);
  free(cc);
  free(y);
  free(dx);
  free(dw);
  free(gy);
  free(gdx);
  free(gdw);
}

/* y1, xg = all_gather_linear(x, w1); y2 = linear(xg, w2); loss = sum(y1 c1) + sum(y2 c2). */
static void test_shared_gather(dt_mesh_t mesh) {
  const int64_t S = 7, M = B * S;
  const int64_t xs[3] = {B, S, K}, ws[2] = {N, K}, ys[3] = {B, S, N};
  float *x = malloc(sizeof(float) * M * K), *w[2], *c[2], *y[2], *dx[2], *dw[2];
  for (int i = 0; i < 2; i++) {
    w[i] = malloc(sizeof(float) * N * K);
    c[i] = malloc(sizeof(float) * M * N);
    y[i] = malloc(sizeof(float) * M * N);
    dx[i] = malloc(sizeof(float) * M * K);
    dw[i] = malloc(sizeof(float) * N * K);
    fill(w[i], N * K, 10 + i);
    fill(c[i], M * N, 20 + i);
  }
  fill(x, M * K, 30);
  for (int i = 0; i < 2; i++) dense(x, w[i], c[i], M, K, N, y[i], dx[i], dw[i]);
  for (int64_t i = 0; i < M * K; i++) dx[0][i] += dx[1][i];
  const dt_placement_t sx[1] = {dt_shard(1)}, sw[1] = {dt_shard(0)}, rep[1] = {dt_replicate()};
  dt_tensor_t tx, tw[2], tc[2];
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 3, xs, sx, x, &tx));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t vx, vw[2], vc[2], o[2], m[2], l[2], loss;
  DT_ASSERT_OK(dt_var_leaf(tx, 1, &vx));
  for (int i = 0; i < 2; i++) {
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ws, sw, w[i], &tw[i]));
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 3, ys, rep, c[i], &tc[i]));
    DT_ASSERT_OK(dt_var_leaf(tw[i], 1, &vw[i]));
    DT_ASSERT_OK(dt_tape_constant(tape, tc[i], &vc[i]));
  }
  DT_ASSERT_OK(dt_counters_reset(mesh));
  const dt_var_t in[2] = {vx, vw[0]};
  const int64_t ia[2] = {0, 1};
  dt_var_t outs[2];
  DT_ASSERT_OK(dt_ag_op(tape, "all_gather_linear", 2, in, 2, ia, 0, NULL, 2, outs));
  o[0] = outs[0];
  DT_ASSERT_OK(dt_nn_linear(tape, outs[1], vw[1], NULL, &o[1]));
  dt_counters_t fwd;
  DT_ASSERT_OK(dt_counters_get(mesh, &fwd));
  DT_ASSERT_EQ(fwd.calls[DT_COLL_SEND_RECV], g_n - 1);
  DT_ASSERT_EQ(fwd.calls[DT_COLL_ALL_GATHER], 0);
  for (int i = 0; i < 2; i++) {
    const dt_var_t mm[2] = {o[i], vc[i]};
    DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, mm, 0, NULL, 0, NULL, 1, &m[i]));
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &m[i], 0, NULL, 0, NULL, 1, &l[i]));
  }
  DT_ASSERT_OK(dt_ag_op(tape, "add", 2, l, 0, NULL, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  float* got = malloc(sizeof(float) * M * N);
  for (int i = 0; i < 2; i++) {
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(o[i]), got, sizeof(float) * M * N));
    expect_close(got, y[i], M * N, 1e-5, i ? "shared y2" : "shared y1", "all_gather_linear", S);
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vw[i]), got, sizeof(float) * N * K));
    expect_close(got, dw[i], N * K, 1e-5, i ? "shared dw2" : "shared dw1", "all_gather_linear", S);
  }
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vx), got, sizeof(float) * M * K));
  expect_close(got, dx[0], M * K, 1e-5, "shared dx (both linears')", "all_gather_linear", S);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(vx));
  for (int i = 0; i < 2; i++) {
    DT_ASSERT_OK(dt_var_destroy(vw[i]));
    free(w[i]);
    free(c[i]);
    free(y[i]);
    free(dx[i]);
    free(dw[i]);
  }
  free(x);
  free(got);
}

static void test_refusals(dt_mesh_t mesh) {
  const int64_t xs[3] = {2, 4, 5}, ws[2] = {6, 5}, wbad[2] = {6, 4};
  const dt_placement_t rep[1] = {dt_replicate()};
  dt_tensor_t x, w, wb, wh, out;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 3, xs, rep, &x));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, ws, rep, &w));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, wbad, rep, &wb));
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_BF16, 2, ws, rep, &wh));
  DT_ASSERT_STATUS(dt_all_gather_linear(x, w, 0, 2, &out, NULL), DT_ERR_INVALID_ARG); /* features */
  DT_ASSERT_STATUS(dt_all_gather_linear(x, w, 0, -1, &out, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_linear_reduce_scatter(x, wb, 0, 1, &out), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_linear_reduce_scatter(x, wh, 0, 1, &out), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_all_gather_linear(x, w, 1, 1, &out, NULL), DT_ERR_INVALID_ARG); /* mesh dim */
  DT_ASSERT_STATUS(dt_all_gather_linear(x, x, 0, 1, &out, NULL), DT_ERR_INVALID_ARG); /* w 3-dim */
  /* the public entries compute what the tape's op computes (checked above): one call each */
  DT_ASSERT_OK(dt_all_gather_linear(x, w, 0, 1, &out, NULL));
  DT_ASSERT_OK(dt_tensor_destroy(out));
  DT_ASSERT_OK(dt_linear_reduce_scatter(x, w, 0, -2, &out));
  DT_ASSERT_OK(dt_tensor_destroy(out));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(w));
  DT_ASSERT_OK(dt_tensor_destroy(wb));
  DT_ASSERT_OK(dt_tensor_destroy(wh));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_n));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  const char* names[1] = {"tp"};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, names, NULL, &mesh));
  test_refusals(mesh);
  test_shared_gather(mesh);
  const char* ops[2] = {"all_gather_linear", "linear_reduce_scatter"};
  const int64_t seqs[2] = {4 * 3, 7}; /* even over 2, 3 and 4 ranks; uneven */
  for (int o = 0; o < 2; o++)
    for (int nd = 3; nd <= 4; nd++)
      for (int si = 0; si < 2; si++) {
        case_t c = {ops[o], nd, seqs[si], 0, {dt_replicate()}, {dt_replicate()}, DT_F32, 0};
        /* x and w arrive as the op wants them (the traffic is then the ring's alone) */
        c.xpl[0] = dt_shard(o == 0 ? 1 : nd - 1);
        c.wpl[0] = dt_shard(o == 0 ? 0 : 1);
        run_case(mesh, &c, 1);
        /* and from Replicate (moved by the op: a local slice) */
        c.xpl[0] = dt_replicate();
        c.wpl[0] = dt_replicate();
        run_case(mesh, &c, 0);
      }
  for (int o = 0; o < 2; o++) { /* bf16: from Replicate, and as the op wants (its traffic) */
    case_t c = {ops[o], 3, 12, 0, {dt_replicate()}, {dt_replicate()}, DT_BF16, 0};
    run_case(mesh, &c, 0);
    c.xpl[0] = dt_shard(o == 0 ? 1 : 2);
    c.wpl[0] = dt_shard(o == 0 ? 0 : 1);
    c.S = 7; /* uneven chunks */
    run_case(mesh, &c, 1);
    c.dtype = DT_F16; /* f16 likewise */
    run_case(mesh, &c, 1);
    c.batch = 1; /* one block of rows: the gathered x is the ring's own buffer */
    run_case(mesh, &c, 1);
  }
  if (g_n == 4) { /* 2 x 2: (dp, tp), x's batch or sequence sharded on dp */
    const int shape[2] = {2, 2};
    const char* n2[2] = {"dp", "tp"};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, shape, n2, NULL, &m2));
    for (int o = 0; o < 2; o++)
      for (int other = 0; other < 3; other++) {
        case_t c = {ops[o], 3, 12, 1, {dt_replicate(), dt_replicate()},
                    {dt_replicate(), dt_replicate()}, DT_F32, 0};
        c.xpl[0] = other == 0 ? dt_shard(0) : other == 1 ? dt_shard(1) : dt_replicate();
        c.xpl[1] = dt_shard(o == 0 ? 1 : 2);
        c.wpl[1] = dt_shard(o == 0 ? 0 : 1);
        run_case(m2, &c, 1);
        if (other == 0) { /* bf16 with w's gradient a partial sum over dp */
          c.dtype = DT_BF16;
          run_case(m2, &c, 1);
        }
      }
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_rank == 0) printf("test_tp_overlap: %d ranks ok\n", g_n);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

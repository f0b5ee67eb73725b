/* test_sdpa_blocks.c - the host attention kernels (sdpa and sdpa_grad) against a dense
 * double-precision attention written here, at sizes where causal attention runs in several
 * blocks of query rows (DT_ATTN_ROW_BLOCK = 64: each block scores only the keys its last row
 * sees):
 *   - output and the gradients of q, k, v of sum(out * w) within 1e-5 of the largest magnitude;
 *   - causal and not, layouts (B, H, S, D) and (B, S, H, D), grouped query heads (4 query heads,
 *     2 kv heads), v's feature size unlike q's, S = T = 150 (blocks of 64, 64, 22), S = 100 <
 *     T = 150 (row i sees keys 0 .. i, as PyTorch's is_causal), and S = 1;
 *   - at np > 1 the queries sharded along the sequence and k, v replicated, so a rank's rows start
 *     at q0 > 0 (row i of the shard sees keys 0 .. q0 + i; with 150 rows on 2 ranks, rank 1's
 *     blocks see 139 and 150 keys); the output keeps the queries' placement (no collective).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"

static int g_n;

enum { B = 2, H = 4, G = 2, D = 8, E = 6 };

/* Deterministic values in [-1, 1). */
static void fill(float* x, int64_t n, int seed) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 7);
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
}

/* Index of element (b, h, s, f) for layout 0 (B, heads, S, F) or 1 (B, S, heads, F). */
static int64_t at(int layout, int64_t b, int64_t h, int64_t s, int64_t f, int64_t heads,
                  int64_t S, int64_t F) {
  return layout ? ((b * S + s) * heads + h) * F + f : ((b * heads + h) * S + s) * F + f;
}

/* Dense attention and the gradients of sum(o * w), in double. */
static void reference(int layout, int causal, int64_t S, int64_t T, const float* q,
                      const float* k, const float* v, const float* w, double* o, double* gq,
                      double* gk, double* gv) {
  const double scale = 1.0 / sqrt((double)D);
  double* p = malloc(sizeof(double) * (size_t)T);
  double* dp = malloc(sizeof(double) * (size_t)T);
  memset(gk, 0, sizeof(double) * (size_t)(B * G * T * D));
  memset(gv, 0, sizeof(double) * (size_t)(B * G * T * E));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < S; i++) {
        const int64_t vis = causal ? (i + 1 < T ? i + 1 : T) : T;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < vis; j++) {
          double s = 0.0;
          for (int64_t d = 0; d < D; d++)
            s += (double)q[at(layout, b, h, i, d, H, S, D)] * k[at(layout, b, g, j, d, G, T, D)];
          p[j] = s * scale;
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int64_t j = 0; j < vis; j++) sum += p[j] = exp(p[j] - mx);
        for (int64_t j = 0; j < vis; j++) p[j] /= sum;
        double dot = 0.0;
        for (int64_t j = 0; j < vis; j++) {
          dp[j] = 0.0;
          for (int64_t e = 0; e < E; e++) {
            const double we = w[at(layout, b, h, i, e, H, S, E)];
            dp[j] += we * v[at(layout, b, g, j, e, G, T, E)];
            gv[at(layout, b, g, j, e, G, T, E)] += p[j] * we;
          }
          dot += p[j] * dp[j];
        }
        for (int64_t e = 0; e < E; e++) {
          double s = 0.0;
          for (int64_t j = 0; j < vis; j++) s += p[j] * v[at(layout, b, g, j, e, G, T, E)];
          o[at(layout, b, h, i, e, H, S, E)] = s;
        }
        for (int64_t d = 0; d < D; d++) gq[at(layout, b, h, i, d, H, S, D)] = 0.0;
        for (int64_t j = 0; j < vis; j++) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < D; d++) {
            gq[at(layout, b, h, i, d, H, S, D)] += ds * k[at(layout, b, g, j, d, G, T, D)];
            gk[at(layout, b, g, j, d, G, T, D)] += ds * q[at(layout, b, h, i, d, H, S, D)];
          }
        }
      }
    }
  free(p);
  free(dp);
}

static void expect_close(const float* got, const double* want, int64_t n, const char* what,
                         int layout, int causal, int64_t S, int64_t T) {
  double scale = 0.0, worst = 0.0;
  for (int64_t i = 0; i < n; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
  if (scale == 0.0) scale = 1.0; /* causal S = 1: one visible key, dq is 0 (then |got| <= 1e-5) */
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - want[i]);
    worst = d > worst ? d : worst;
  }
  DT_ASSERT_TRUE(worst <= 1e-5 * scale, "%s (layout %d causal %d S %lld T %lld, %d ranks): worst "
                 "difference %g of %g", what, layout, causal, (long long)S, (long long)T, g_n,
                 worst, scale);
}

static dt_tensor_t make(dt_mesh_t mesh, const float* full, int layout, int64_t heads, int64_t S,
                        int64_t F, dt_placement_t pl) {
  const int64_t sh[4] = {B, layout ? S : heads, layout ? heads : S, F};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 4, sh, &pl, full, &t));
  return t;
}

static void run_case(dt_mesh_t mesh, int layout, int causal, int64_t S, int64_t T) {
  const int64_t nq = B * H * S * D, nk = B * G * T * D, nv = B * G * T * E, no = B * H * S * E;
  float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk),
        *v = malloc(sizeof(float) * nv), *w = malloc(sizeof(float) * no);
  float *o = malloc(sizeof(float) * no), *gq = malloc(sizeof(float) * nq),
        *gk = malloc(sizeof(float) * nk), *gv = malloc(sizeof(float) * nv);
  double *ro = malloc(sizeof(double) * no), *rq = malloc(sizeof(double) * nq),
         *rk = malloc(sizeof(double) * nk), *rv = malloc(sizeof(double) * nv);
  fill(q, nq, 1);
  fill(k, nk, 2);
  fill(v, nv, 3);
  fill(w, no, 4);
  for (int64_t i = 0; i < nq; i++) q[i] *= 3.0f; /* sharper rows: the max matters */
  reference(layout, causal, S, T, q, k, v, w, ro, rq, rk, rv);

  /* the queries (and w, which multiplies the output) sharded along the sequence when it splits */
  const int seq_dim = layout ? 1 : 2;
  const dt_placement_t qpl = S % g_n == 0 && g_n > 1 ? dt_shard(seq_dim) : dt_replicate();
  dt_tensor_t tq = make(mesh, q, layout, H, S, D, qpl), tk = make(mesh, k, layout, G, T, D, dt_replicate()),
              tv = make(mesh, v, layout, G, T, E, dt_replicate()), tw = make(mesh, w, layout, H, S, E, qpl);
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t vq, vk, vv, vw, vo, ow, loss;
  DT_ASSERT_OK(dt_var_leaf(tq, 1, &vq));
  DT_ASSERT_OK(dt_var_leaf(tk, 1, &vk));
  DT_ASSERT_OK(dt_var_leaf(tv, 1, &vv));
  DT_ASSERT_OK(dt_tape_constant(tape, tw, &vw));
  const dt_var_t in[3] = {vq, vk, vv};
  const int64_t args[2] = {causal, layout};
  dt_counters_t c0, c1;
  DT_ASSERT_OK(dt_counters_get(mesh, &c0));
  DT_ASSERT_OK(dt_ag_op(tape, "sdpa", 3, in, 2, args, 0, NULL, 1, &vo));
  DT_ASSERT_OK(dt_counters_get(mesh, &c1));
  dt_placement_t opl;
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(vo), &opl));
  DT_ASSERT_TRUE(dt_placement_equal(opl, qpl), "the output is not placed as the queries");
  uint64_t calls = 0;
  for (int x = 0; x < DT_COLL_COUNT; x++) calls += c1.calls[x] - c0.calls[x];
  DT_ASSERT_TRUE(calls == 0, "the forward ran %llu collectives", (unsigned long long)calls);
  const dt_var_t m2[2] = {vo, vw};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, m2, 0, NULL, 0, NULL, 1, &ow));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &ow, 0, NULL, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(vo), o, sizeof(float) * no));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vq), gq, sizeof(float) * nq));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vk), gk, sizeof(float) * nk));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vv), gv, sizeof(float) * nv));
  expect_close(o, ro, no, "output", layout, causal, S, T);
  expect_close(gq, rq, nq, "grad q", layout, causal, S, T);
  expect_close(gk, rk, nk, "grad k", layout, causal, S, T);
  expect_close(gv, rv, nv, "grad v", layout, causal, S, T);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(vq));
  DT_ASSERT_OK(dt_var_destroy(vk));
  DT_ASSERT_OK(dt_var_destroy(vv));
  free(q), free(k), free(v), free(w), free(o), free(gq), free(gk), free(gv);
  free(ro), free(rq), free(rk), free(rv);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_n));
  const char* names[1] = {"sp"};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, names, NULL, &mesh));
  static const int64_t st[][2] = {{150, 150}, {100, 150}, {1, 150}};
  for (int layout = 0; layout < 2; layout++)
    for (int causal = 0; causal < 2; causal++)
      for (size_t c = 0; c < sizeof st / sizeof st[0]; c++)
        run_case(mesh, layout, causal, st[c][0], st[c][1]);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

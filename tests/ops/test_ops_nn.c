/* test_ops_nn.c - rms_norm, layer_norm, embedding and cross_entropy (loss parallel) against dense
 * references, for every placement combination of the inputs from {R, S(0), S(1), P(sum)} per mesh
 * dim (indices: {R, S(0), S(1)}) on meshes (n) and (2, n/2); np 2 and 4. Norms within 1e-5
 * relative (sqrt); embedding exactly. A vocabulary-sharded table with replicated indices must give
 * Partial(sum) with no communication. */
#include <math.h>
#include <string.h>

#include "dt_test.h"

static dt_placement_t opt(int k) {
  return k == 0 ? dt_replicate() : k == 1 ? dt_shard(0) : k == 2 ? dt_shard(1)
                                                                 : dt_partial(DT_REDUCE_SUM);
}

static void norm_ref(int layer, const float* x, const float* w, const float* b, int64_t rows,
                     int64_t D, float* y) {
  for (int64_t r = 0; r < rows; r++) {
    double mean = 0, var = 0;
    if (layer) {
      for (int64_t j = 0; j < D; j++) mean += x[r * D + j];
      mean /= D;
    }
    for (int64_t j = 0; j < D; j++) var += (x[r * D + j] - mean) * (x[r * D + j] - mean);
    double inv = 1.0 / sqrt(var / D + (layer ? 1e-5 : 1e-6));
    for (int64_t j = 0; j < D; j++)
      y[r * D + j] = (float)((x[r * D + j] - mean) * inv * w[j] + (layer ? b[j] : 0.0));
  }
}

static long long norms(dt_mesh_t mesh, int m) {
  int64_t xs[2] = {5, 6}, ws[1] = {6};
  float x[30], w[6], b[6], want[30], got[30];
  for (int i = 0; i < 30; i++) x[i] = (float)((i * 7) % 11) - 5.0f;
  for (int i = 0; i < 6; i++) w[i] = 0.5f + (float)i, b[i] = (float)(i % 3) - 1.0f;
  int npl = m == 1 ? 4 : 16, nw = m == 1 ? 4 : 16;
  long long n = 0;
  for (int layer = 0; layer < 2; layer++) {
    norm_ref(layer, x, w, b, 5, 6, want);
    for (int a = 0; a < npl; a++)
      for (int c = 0; c < nw; c++) {
        dt_placement_t px[2], pw[2];
        int skip = 0;
        for (int i = 0, va = a, vc = c; i < m; i++, va /= 4, vc /= 4) {
          px[i] = opt(va % 4);
          pw[i] = opt(vc % 4);
          if (pw[i].kind == DT_SHARD && pw[i].dim == 1) skip = 1; /* 1-D weight */
        }
        if (skip) continue;
        dt_tensor_t tx, tw, tb, r;
        DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, xs, px, x, &tx));
        DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 1, ws, pw, w, &tw));
        DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 1, ws, pw, b, &tb));
        dt_tensor_t in[3] = {tx, tw, tb};
        DT_ASSERT_OK(dt_op_run(layer ? "layer_norm" : "rms_norm", layer ? 3 : 2, in, 0, NULL, 0,
                               NULL, &r));
        DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof got));
        for (int i = 0; i < 30; i++)
          DT_ASSERT_TRUE(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])),
                         "%s element %d: %g vs %g", layer ? "layer_norm" : "rms_norm", i, got[i],
                         want[i]);
        dt_placement_t rp[2];
        DT_ASSERT_OK(dt_tensor_placements(r, rp));
        for (int i = 0; i < m; i++)
          DT_ASSERT_TRUE(rp[i].kind != DT_PARTIAL && !(rp[i].kind == DT_SHARD && rp[i].dim == 1),
                         "normalized dim must be whole and reduced");
        dt_tensor_destroy(tx);
        dt_tensor_destroy(tw);
        dt_tensor_destroy(tb);
        dt_tensor_destroy(r);
        n++;
      }
  }
  return n;
}

static long long embeddings(dt_mesh_t mesh, int m) {
  int64_t wsz[2] = {9, 4}, isz[2] = {3, 5};
  float w[36], want[60], got[60];
  int64_t ids[15];
  for (int i = 0; i < 36; i++) w[i] = (float)(i % 13) - 6.0f;
  for (int i = 0; i < 15; i++) ids[i] = (i * 4 + 1) % 9;
  for (int i = 0; i < 15; i++) memcpy(want + i * 4, w + ids[i] * 4, sizeof(float) * 4);
  int npl = m == 1 ? 4 : 16, nip = m == 1 ? 3 : 9;
  long long n = 0;
  for (int a = 0; a < npl; a++)
    for (int c = 0; c < nip; c++) {
      dt_placement_t pw[2], pi[2];
      for (int i = 0, va = a, vc = c; i < m; i++, va /= 4, vc /= 3) {
        pw[i] = opt(va % 4);
        pi[i] = opt(vc % 3);
      }
      dt_tensor_t tw, ti, r;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, wsz, pw, w, &tw));
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, isz, pi, ids, &ti));
      dt_tensor_t in[2] = {tw, ti};
      DT_ASSERT_OK(dt_counters_reset(mesh));
      DT_ASSERT_OK(dt_op_run("embedding", 2, in, 0, NULL, 0, NULL, &r));
      dt_counters_t cnt;
      DT_ASSERT_OK(dt_counters_get(mesh, &cnt));
      int vocab_sharded = 1;
      for (int i = 0; i < m; i++)
        vocab_sharded &= pw[i].kind == DT_SHARD && pw[i].dim == 0 && pi[i].kind == DT_REPLICATE;
      if (vocab_sharded) { /* masked local lookup: Partial(sum), nothing moves */
        dt_placement_t rp[2];
        DT_ASSERT_OK(dt_tensor_placements(r, rp));
        for (int i = 0; i < m; i++)
          DT_ASSERT_TRUE(dt_placement_equal(rp[i], dt_partial(DT_REDUCE_SUM)), "vocab-sharded");
        DT_ASSERT_EQ(cnt.redistributes, 0);
      }
      DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof got));
      DT_ASSERT_TRUE(memcmp(got, want, sizeof want) == 0, "embedding values");
      dt_tensor_destroy(tw);
      dt_tensor_destroy(ti);
      dt_tensor_destroy(r);
      n++;
    }
  /* an index out of range is an error, not a silent zero */
  int64_t bad[15];
  memcpy(bad, ids, sizeof bad);
  bad[3] = 9;
  dt_placement_t rr[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t tw, ti, r;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, wsz, rr, w, &tw));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 2, isz, rr, bad, &ti));
  dt_tensor_t in[2] = {tw, ti};
  DT_ASSERT_STATUS(dt_op_run("embedding", 2, in, 0, NULL, 0, NULL, &r), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "index 9 out of range") != NULL, "%s", dt_last_error());
  dt_tensor_destroy(tw);
  dt_tensor_destroy(ti);
  return n;
}

/* cross_entropy against a double-precision reference; with class-sharded logits no all-gather or
 * all-to-all runs and every all-reduce moves at most N floats (loss parallel). */
static long long cross_entropy(dt_mesh_t mesh, int m) {
  enum { N = 6, C = 10 };
  int64_t ls[2] = {N, C}, ts[1] = {N};
  float x[N * C];
  int64_t tg[N];
  for (int i = 0; i < N * C; i++) x[i] = (float)((i * 7) % 13) * 0.25f - 1.5f;
  for (int i = 0; i < N; i++) tg[i] = (i * 3 + 2) % C;
  double ref[N], mean = 0;
  for (int i = 0; i < N; i++) {
    double mx = -1e30, sum = 0;
    for (int c = 0; c < C; c++) mx = fmax(mx, x[i * C + c]);
    for (int c = 0; c < C; c++) sum += exp(x[i * C + c] - mx);
    ref[i] = log(sum) + mx - x[i * C + tg[i]];
    mean += ref[i] / N;
  }
  const char* lpl[4] = {"S1", "R", "S0", "P"};
  const char* lpl2[4] = {"S0,S1", "R,S1", "S1,S1", "R,R"};
  long long n = 0;
  for (int k = 0; k < 4; k++)
    for (int red = 0; red < 3; red++) {
      dt_placement_t pl[2], pt[2];
      int np;
      DT_ASSERT_OK(dt_placements_parse(m == 1 ? lpl[k] : lpl2[k], pl, 2, &np));
      for (int i = 0; i < m; i++)
        pt[i] = (pl[i].kind == DT_SHARD && pl[i].dim == 0) ? dt_shard(0) : dt_replicate();
      dt_tensor_t tl, tt, r;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ls, pl, x, &tl));
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, ts, pt, tg, &tt));
      DT_ASSERT_OK(dt_counters_reset(mesh));
      DT_ASSERT_OK(dt_cross_entropy(tl, tt, (dt_loss_reduction_t)red, &r));
      dt_counters_t cnt;
      DT_ASSERT_OK(dt_counters_get(mesh, &cnt));
      int class_sharded = 1;
      for (int i = 0; i < m; i++)
        class_sharded &= pl[i].kind != DT_SHARD || pl[i].dim == 1;
      if (class_sharded && k == 0) { /* loss parallel: no logits ever move */
        DT_ASSERT_EQ(cnt.calls[DT_COLL_ALL_GATHER] + cnt.calls[DT_COLL_ALL_TO_ALL], 0);
        DT_ASSERT_TRUE(cnt.calls[DT_COLL_ALL_REDUCE] >= 1 &&
                           cnt.nbytes[DT_COLL_ALL_REDUCE] <= cnt.calls[DT_COLL_ALL_REDUCE] * N * 4,
                       "all-reduces must carry per-row values only (%llu bytes in %llu calls)",
                       (unsigned long long)cnt.nbytes[DT_COLL_ALL_REDUCE],
                       (unsigned long long)cnt.calls[DT_COLL_ALL_REDUCE]);
      }
      float got[N];
      int64_t on = red == DT_LOSS_NONE ? N : 1;
      DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof(float) * (size_t)on));
      for (int i = 0; i < on; i++) {
        double want = red == DT_LOSS_NONE ? ref[i] : red == DT_LOSS_MEAN ? mean : mean * N;
        DT_ASSERT_TRUE(fabs(got[i] - want) <= 1e-5 * (1 + fabs(want)),
                       "cross_entropy %s red %d [%d]: %g vs %g", m == 1 ? lpl[k] : lpl2[k], red,
                       i, got[i], want);
      }
      dt_tensor_destroy(tl);
      dt_tensor_destroy(tt);
      dt_tensor_destroy(r);
      n++;
    }
  return n;
}

/* cross_entropy with bf16 logits and an ignore_index (the op "cross_entropy" under autograd): the
 * loss and the gradient are bf16 as the logits, as PyTorch's, and match a double reference within
 * bf16 precision for each reduction (the row mask, f32, used to meet the bf16 losses) */
static long long cross_entropy_bf16_ignore(dt_mesh_t mesh, int m) {
  enum { N = 6, C = 10 };
  int64_t ls[2] = {N, C}, ts[1] = {N};
  float x[N * C];
  int64_t tg[N];
  for (int i = 0; i < N * C; i++) x[i] = (float)((i * 7) % 13) * 0.25f - 1.5f; /* exact in bf16 */
  for (int i = 0; i < N; i++) tg[i] = i % 3 == 1 ? -100 : (i * 3 + 2) % C;
  double lse[N], row[N], sum = 0;
  int cnt = 0;
  for (int i = 0; i < N; i++) {
    double mx = -1e30, se = 0;
    for (int c = 0; c < C; c++) mx = fmax(mx, x[i * C + c]);
    for (int c = 0; c < C; c++) se += exp(x[i * C + c] - mx);
    lse[i] = log(se) + mx;
    row[i] = tg[i] == -100 ? 0.0 : lse[i] - x[i * C + tg[i]];
    sum += row[i];
    cnt += tg[i] != -100;
  }
  const char* lpl[3] = {"S1", "R", "S0"};
  const char* lpl2[3] = {"S0,S1", "R,S1", "S1,S0"};
  const int64_t to_bf16 = DT_BF16, to_f32 = DT_F32, all[1] = {0};
  long long n = 0;
  for (int k = 0; k < 3; k++)
    for (int red = 0; red < 3; red++) {
      dt_placement_t pl[2], pt[2];
      int np;
      DT_ASSERT_OK(dt_placements_parse(m == 1 ? lpl[k] : lpl2[k], pl, 2, &np));
      for (int i = 0; i < m; i++)
        pt[i] = (pl[i].kind == DT_SHARD && pl[i].dim == 0) ? dt_shard(0) : dt_replicate();
      dt_tensor_t tf, tl, tt, o32;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ls, pl, x, &tf));
      DT_ASSERT_OK(dt_op_run("cast", 1, &tf, 1, &to_bf16, 0, NULL, &tl));
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, ts, pt, tg, &tt));
      dt_var_t v[2], out, loss;
      DT_ASSERT_OK(dt_var_leaf(tl, 1, &v[0]));
      DT_ASSERT_OK(dt_var_leaf(tt, 0, &v[1]));
      dt_tape_t tape;
      DT_ASSERT_OK(dt_tape_create(&tape));
      const int64_t ia[2] = {red, -100};
      DT_ASSERT_OK(dt_ag_op(tape, "cross_entropy", 2, v, 2, ia, 0, NULL, 1, &out));
      dt_dtype_t dt;
      DT_ASSERT_OK(dt_tensor_dtype(dt_var_value(out), &dt));
      DT_ASSERT_TRUE(dt == DT_BF16, "cross_entropy of bf16 logits gave %s", dt_dtype_name(dt));
      dt_tensor_t ov = dt_var_value(out);
      DT_ASSERT_OK(dt_op_run("cast", 1, &ov, 1, &to_f32, 0, NULL, &o32));
      float got[N * C];
      const int64_t on = red == DT_LOSS_NONE ? N : 1;
      DT_ASSERT_OK(dt_tensor_gather_full(o32, got, sizeof(float) * (size_t)on));
      for (int i = 0; i < on; i++) {
        double want = red == DT_LOSS_NONE ? row[i] : red == DT_LOSS_MEAN ? sum / cnt : sum;
        DT_ASSERT_TRUE(fabs(got[i] - want) <= 1e-2 * (1 + fabs(want)),
                       "bf16 cross_entropy %s red %d [%d]: %g vs %g", m == 1 ? lpl[k] : lpl2[k],
                       red, i, got[i], want);
      }
      loss = out;
      if (red == DT_LOSS_NONE)
        DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &out, 1, all, 0, NULL, 1, &loss));
      DT_ASSERT_OK(dt_tape_backward(tape, loss));
      dt_tensor_t g = dt_var_grad(v[0]), g32;
      DT_ASSERT_TRUE(g != NULL, "bf16 cross_entropy: no gradient");
      DT_ASSERT_OK(dt_tensor_dtype(g, &dt));
      DT_ASSERT_TRUE(dt == DT_BF16, "gradient of bf16 logits is %s", dt_dtype_name(dt));
      DT_ASSERT_OK(dt_op_run("cast", 1, &g, 1, &to_f32, 0, NULL, &g32));
      DT_ASSERT_OK(dt_tensor_gather_full(g32, got, sizeof got));
      for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
          const double w = tg[i] == -100 ? 0.0 : red == DT_LOSS_MEAN ? 1.0 / cnt : 1.0;
          const double want = w * (exp(x[i * C + c] - lse[i]) - (c == tg[i] ? 1.0 : 0.0));
          DT_ASSERT_TRUE(fabs(got[i * C + c] - want) <= 2e-3 + 4e-2 * fabs(want),
                         "bf16 cross_entropy %s red %d grad [%d,%d]: %g vs %g",
                         m == 1 ? lpl[k] : lpl2[k], red, i, c, got[i * C + c], want);
        }
      DT_ASSERT_OK(dt_tape_destroy(tape));
      DT_ASSERT_OK(dt_var_destroy(v[0]));
      DT_ASSERT_OK(dt_var_destroy(v[1]));
      dt_tensor_destroy(tf);
      dt_tensor_destroy(o32);
      dt_tensor_destroy(g32);
      n++;
    }
  /* the mask compares in f32: ignore_index at 2^24 or beyond is refused, and a target past 2^24
   * (out of range however it rounds) fails even next to the largest ignore_index allowed */
  dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  const int64_t big[N] = {0, (1 << 24) + 1, 2, 3, 4, 5};
  dt_tensor_t xs, ts2, bad = NULL;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ls, rep, x, &xs));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, ts, rep, big, &ts2));
  dt_tensor_t in2[2] = {xs, ts2};
  const int64_t at_limit[2] = {DT_LOSS_MEAN, 1 << 24}, below[2] = {DT_LOSS_MEAN, (1 << 24) - 1};
  DT_ASSERT_STATUS(dt_op_run("cross_entropy", 2, in2, 2, at_limit, 0, NULL, &bad),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "ignore_index=16777216") != NULL, "message: %s",
                 dt_last_error());
  DT_ASSERT_STATUS(dt_op_run("cross_entropy", 2, in2, 2, below, 0, NULL, &bad),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "a target outside [0, 10)") != NULL, "message: %s",
                 dt_last_error());
  DT_ASSERT_TRUE(bad == NULL, "an output after a refusal");
  dt_tensor_destroy(xs);
  dt_tensor_destroy(ts2);
  return n + 2;
}

/* linear with and without bias: every placement of x, weight in {R, S(0), S(1), P} and bias in
 * {R, S(0), P}; exact (small integers). A column-sharded x with a column-sharded weight gives a
 * Partial output whose bias is counted once. */
static long long linear(dt_mesh_t mesh) {
  enum { N = 5, K = 6, O = 7 };
  int64_t xs[2] = {N, K}, ws[2] = {O, K}, bs[1] = {O};
  float x[N * K], w[O * K], b[O], want[N * O], wantnb[N * O], got[N * O];
  for (int i = 0; i < N * K; i++) x[i] = (float)((i * 5) % 7) - 3.0f;
  for (int i = 0; i < O * K; i++) w[i] = (float)((i * 3) % 5) - 2.0f;
  for (int i = 0; i < O; i++) b[i] = (float)i - 3.0f;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < O; j++) {
      float acc = 0;
      for (int k = 0; k < K; k++) acc += x[i * K + k] * w[j * K + k];
      wantnb[i * O + j] = acc;
      want[i * O + j] = acc + b[j];
    }
  long long n = 0;
  for (int a = 0; a < 4; a++)
    for (int c = 0; c < 4; c++)
      for (int d = 0; d < 4; d++) {
        if (d == 2) continue; /* a 1-D bias has no dim 1 */
        dt_placement_t px[1] = {opt(a)}, pw[1] = {opt(c)}, pb[1] = {opt(d)};
        dt_tensor_t tx, tw, tb, r;
        DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, xs, px, x, &tx));
        DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, ws, pw, w, &tw));
        DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 1, bs, pb, b, &tb));
        DT_ASSERT_OK(dt_linear(tx, tw, tb, &r));
        DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof got));
        DT_ASSERT_TRUE(memcmp(got, want, sizeof want) == 0, "linear x %d w %d b %d", a, c, d);
        if (a == 2 && c == 2 && d == 0) { /* contraction sharded: Partial, bias added once */
          dt_placement_t rp[1];
          DT_ASSERT_OK(dt_tensor_placements(r, rp));
          DT_ASSERT_TRUE(rp[0].kind == DT_PARTIAL, "linear(S1, S1) should stay Partial");
        }
        dt_tensor_destroy(r);
        if (d == 0) {
          DT_ASSERT_OK(dt_linear(tx, tw, NULL, &r));
          DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof got));
          DT_ASSERT_TRUE(memcmp(got, wantnb, sizeof wantnb) == 0, "linear_nobias x %d w %d", a, c);
          dt_tensor_destroy(r);
        }
        dt_tensor_destroy(tx);
        dt_tensor_destroy(tw);
        dt_tensor_destroy(tb);
        n++;
      }
  return n;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  dt_mesh_t m1, m2 = NULL;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &m1));
  long long n = norms(m1, 1) + embeddings(m1, 1) + cross_entropy(m1, 1) +
                  cross_entropy_bf16_ignore(m1, 1) + linear(m1);
  if (world >= 4 && world % 2 == 0) {
    int s[2] = {2, world / 2};
    DT_ASSERT_OK(dt_mesh_create(2, s, NULL, NULL, &m2));
    n += norms(m2, 2) + embeddings(m2, 2) + cross_entropy(m2, 2) +
         cross_entropy_bf16_ignore(m2, 2);
  }
  if (rank == 0) printf("test_ops_nn np=%d: %lld op calls checked\n", world, n);
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

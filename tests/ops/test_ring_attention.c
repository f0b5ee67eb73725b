/* test_ring_attention.c - context parallelism's attention (op ring_attention) on 1, 2 and 4
 * ranks against the library's dense attention (dt_sdpa, itself checked against PyTorch's
 * fixtures) of the un-permuted sequence on every rank, on the host backend:
 *   - outputs and the gradients of q, k, v within 1e-5 (relative to the largest magnitude), for
 *     causal and not, the load-balanced and the in-order layout, both tensor layouts, grouped
 *     query heads (4 query heads, 2 kv heads), v's feature size unlike q's, and the ring, the
 *     all-gather and the cost model's choice; on 4 ranks also a 2 x 2 mesh with the heads sharded
 *     on the other dim; chunks of 3 rows and, on the ring, of 37 and 70 (more than one tile of
 *     the GPU's fused blocks, more than one of the host's chunks of 64 rows); feature sizes 5
 *     and 9, and 400 and 400 (too wide for the fused blocks' tiles);
 *   - traffic from the counters: the ring sends n-1 key/value shards forward, and n-1 key/value
 *     shards plus n gradient shards backward (send_recv on the cp dim, nothing else); the
 *     all-gather variant two all-gathers forward, two more and two reduce-scatters backward;
 *   - dt_cp_position's order, rotary with cp (real positions), and refusals: a sequence that does
 *     not split into 2n chunks, q and k of different lengths, a mesh dim out of range, q and k
 *     of different dtypes; bf16 and f16 inputs (ring and all-gather; on 4 ranks also on the
 *     2 x 2 mesh, heads sharded on the other dim) give results in their
 *     dtype equal to the f32 ring's on the rounded values (the output exactly, once rounded;
 *     the gradients within the dtype's rounding; on a CUDA backend's own memory (not under
 *     DTENSOR_SDPA_PATH=gemm), whose tensor-core blocks round P and dS to the dtype, the output
 *     too within it, and not exactly), k and v crossing the cp dim in their dtype's
 *     bytes and their gradients in f32's; an
 *     empty batch, empty value features and an empty sequence run forward and backward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"

static int g_n, g_rank;

typedef struct {
  int causal, balanced, layout, algo;
  int rows; /* rows per chunk of the sequence */
  int d, e; /* q/k and v feature sizes (0: D and E below) */
} cfg_t;

/* Deterministic values in [-1, 1). */
static void fill(float* x, int64_t n, int seed) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1);
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
}

/* Index of element (b, h, s, d) for layout 0 (B, H, S, D) or 1 (B, S, H, D). */
static int64_t at(int layout, int64_t b, int64_t h, int64_t s, int64_t d, int64_t H, int64_t S,
                  int64_t D) {
  return layout ? ((b * S + s) * H + h) * D + d : ((b * H + h) * S + s) * D + d;
}

/* dst[real position] = src[stored index] along the sequence (to_real), or the other way. */
static void permute(float* dst, const float* src, int layout, int64_t B, int64_t H, int64_t S,
                    int64_t D, int cp, int to_real) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < S; i++) {
        int64_t p = dt_cp_position(i, S, cp);
        for (int64_t d = 0; d < D; d++) {
          if (to_real)
            dst[at(layout, b, h, p, d, H, S, D)] = src[at(layout, b, h, i, d, H, S, D)];
          else
            dst[at(layout, b, h, i, d, H, S, D)] = src[at(layout, b, h, p, d, H, S, D)];
        }
      }
}

static void shape4(int layout, int64_t B, int64_t H, int64_t S, int64_t D, int64_t* sh) {
  sh[0] = B;
  sh[1] = layout ? S : H;
  sh[2] = layout ? H : S;
  sh[3] = D;
}

static float max_abs(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
  return m;
}

static void expect_close(const float* got, const float* want, int64_t n, const char* what,
                         const cfg_t* c) {
  float scale = max_abs(want, n), worst = 0.0f;
  DT_ASSERT_TRUE(scale > 0.0f, "%s: an all-zero reference", what);
  for (int64_t i = 0; i < n; i++) {
    float d = fabsf(got[i] - want[i]);
    worst = d > worst ? d : worst;
  }
  DT_ASSERT_TRUE(worst <= 1e-5f * scale, "%s (causal %d balanced %d layout %d algo %d rows %d): "
                 "worst difference %g of %g", what, c->causal, c->balanced, c->layout, c->algo,
                 c->rows, (double)worst, (double)scale);
}

enum { B = 2, H = 4, G = 2, D = 8, E = 6 };

static dt_tensor_t make(dt_mesh_t mesh, const float* full, int layout, int64_t heads, int64_t S,
                        int64_t feat, const dt_placement_t* pl) {
  int64_t sh[4];
  shape4(layout, B, heads, S, feat, sh);
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 4, sh, pl, full, &t));
  return t;
}

/* sum(out * w) through the tape; *out_full and the inputs' gradients gathered (global order).
 * The variables take q, k, v and the tape w (all freed here). */
static void forward_backward(const char* op, dt_tensor_t q, dt_tensor_t k, dt_tensor_t v,
                             dt_tensor_t w, int n_iargs, const int64_t* iargs, float* out_full,
                             size_t out_nb, float* gq, float* gk, float* gv, size_t qnb,
                             size_t knb, size_t vnb, dt_counters_t* fwd, dt_counters_t* all,
                             dt_mesh_t mesh) {
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t vq, vk, vv, vw, o, ow, loss;
  DT_ASSERT_OK(dt_var_leaf(q, 1, &vq));
  DT_ASSERT_OK(dt_var_leaf(k, 1, &vk));
  DT_ASSERT_OK(dt_var_leaf(v, 1, &vv));
  DT_ASSERT_OK(dt_tape_constant(tape, w, &vw));
  const dt_var_t in[3] = {vq, vk, vv};
  if (mesh) DT_ASSERT_OK(dt_counters_reset(mesh));
  DT_ASSERT_OK(dt_ag_op(tape, op, 3, in, n_iargs, iargs, 0, NULL, 1, &o));
  if (fwd) DT_ASSERT_OK(dt_counters_get(mesh, fwd));
  const dt_var_t m2[2] = {o, vw};
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, m2, 0, NULL, 0, NULL, 1, &ow));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &ow, 0, NULL, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  if (all) DT_ASSERT_OK(dt_counters_get(mesh, all));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(o), out_full, out_nb));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vq), gq, qnb));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vk), gk, knb));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(vv), gv, vnb));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(vq));
  DT_ASSERT_OK(dt_var_destroy(vk));
  DT_ASSERT_OK(dt_var_destroy(vv));
}

/* One configuration on `mesh` (q, k, v placed by pl; the sequence sharded on cp_dim). */
static void run_case(dt_mesh_t mesh, dt_mesh_t rep_mesh, const dt_placement_t* pl, int cp_dim,
                     const cfg_t* c) {
  int n;
  DT_ASSERT_OK(dt_mesh_size(mesh, cp_dim, &n));
  const int cp = c->balanced ? n : 0;
  const int64_t S = 2 * (int64_t)n * c->rows, Dq = c->d ? c->d : D, Ev = c->e ? c->e : E;
  const int64_t nq = B * H * S * Dq, nk = B * G * S * Dq, nv = B * G * S * Ev, no = B * H * S * Ev;
  float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk),
        *v = malloc(sizeof(float) * nv), *w = malloc(sizeof(float) * no);
  float *qr = malloc(sizeof(float) * nq), *kr = malloc(sizeof(float) * nk),
        *vr = malloc(sizeof(float) * nv), *wr = malloc(sizeof(float) * no);
  float *o1 = malloc(sizeof(float) * no), *g1q = malloc(sizeof(float) * nq),
        *g1k = malloc(sizeof(float) * nk), *g1v = malloc(sizeof(float) * nv);
  float *o2 = malloc(sizeof(float) * no), *g2q = malloc(sizeof(float) * nq),
        *g2k = malloc(sizeof(float) * nk), *g2v = malloc(sizeof(float) * nv);
  float* tmp = malloc(sizeof(float) * (nq > no ? nq : no));
  fill(q, nq, 1);
  fill(k, nk, 2);
  fill(v, nv, 3);
  fill(w, no, 4);
  /* the reference: dense attention of the sequence in real order, replicated */
  permute(qr, q, c->layout, B, H, S, Dq, cp, 1);
  permute(kr, k, c->layout, B, G, S, Dq, cp, 1);
  permute(vr, v, c->layout, B, G, S, Ev, cp, 1);
  permute(wr, w, c->layout, B, H, S, Ev, cp, 1);
  dt_placement_t rep[1] = {dt_replicate()};
  dt_tensor_t tq = make(rep_mesh, qr, c->layout, H, S, Dq, rep),
              tk = make(rep_mesh, kr, c->layout, G, S, Dq, rep),
              tv = make(rep_mesh, vr, c->layout, G, S, Ev, rep),
              tw = make(rep_mesh, wr, c->layout, H, S, Ev, rep);
  const int64_t sa[2] = {c->causal, c->layout};
  forward_backward("sdpa", tq, tk, tv, tw, 2, sa, o1, sizeof(float) * no, g1q, g1k, g1v,
                   sizeof(float) * nq, sizeof(float) * nk, sizeof(float) * nv, NULL, NULL, NULL);
  /* the ring, on the stored order */
  dt_tensor_t sq = make(mesh, q, c->layout, H, S, Dq, pl);
  dt_tensor_t sk = make(mesh, k, c->layout, G, S, Dq, pl);
  dt_tensor_t sv = make(mesh, v, c->layout, G, S, Ev, pl);
  dt_tensor_t sw = make(mesh, w, c->layout, H, S, Ev, pl);
  const int64_t ra[5] = {cp_dim, c->causal, c->layout, c->balanced, c->algo};
  dt_counters_t fwd, all;
  forward_backward("ring_attention", sq, sk, sv, sw, 5, ra, o2, sizeof(float) * no, g2q, g2k, g2v,
                   sizeof(float) * nq, sizeof(float) * nk, sizeof(float) * nv, &fwd, &all, mesh);
  /* compare in real order */
  permute(tmp, o2, c->layout, B, H, S, Ev, cp, 1);
  expect_close(tmp, o1, no, "output", c);
  permute(tmp, g2q, c->layout, B, H, S, Dq, cp, 1);
  expect_close(tmp, g1q, nq, "grad q", c);
  permute(tmp, g2k, c->layout, B, G, S, Dq, cp, 1);
  expect_close(tmp, g1k, nk, "grad k", c);
  permute(tmp, g2v, c->layout, B, G, S, Ev, cp, 1);
  expect_close(tmp, g1v, nv, "grad v", c);
  /* traffic on the cp dim: this rank's k and v shards */
  int nd;
  DT_ASSERT_OK(dt_mesh_ndim(mesh, &nd));
  int heads_split = 1;
  for (int i = 0; i < nd; i++)
    if (i != cp_dim && pl[i].kind == DT_SHARD && pl[i].dim == (c->layout ? 2 : 1)) {
      int sz;
      DT_ASSERT_OK(dt_mesh_size(mesh, i, &sz));
      heads_split *= sz;
    }
  const uint64_t kvb = sizeof(float) * (uint64_t)(nk + nv) / (uint64_t)n / (uint64_t)heads_split;
  const int x = cp_dim;
  if (c->algo == 1) {
    DT_ASSERT_EQ(fwd.dim_calls[x][DT_COLL_SEND_RECV], (uint64_t)(n - 1));
    DT_ASSERT_EQ(fwd.dim_nbytes[x][DT_COLL_SEND_RECV], (uint64_t)(n - 1) * kvb);
    DT_ASSERT_EQ(all.dim_nbytes[x][DT_COLL_SEND_RECV] - fwd.dim_nbytes[x][DT_COLL_SEND_RECV],
                 (uint64_t)(n > 1 ? 2 * n - 1 : 0) * kvb); /* alone: nothing comes back */
    DT_ASSERT_EQ(all.dim_calls[x][DT_COLL_ALL_GATHER], 0);
  } else if (c->algo == 2) {
    DT_ASSERT_EQ(fwd.dim_calls[x][DT_COLL_ALL_GATHER], 2);
    DT_ASSERT_EQ(fwd.dim_nbytes[x][DT_COLL_ALL_GATHER], (uint64_t)n * kvb);
    DT_ASSERT_EQ(all.dim_calls[x][DT_COLL_ALL_GATHER], 4);
    DT_ASSERT_EQ(all.dim_calls[x][DT_COLL_REDUCE_SCATTER], 2);
    DT_ASSERT_EQ(all.dim_nbytes[x][DT_COLL_REDUCE_SCATTER], (uint64_t)n * kvb);
    DT_ASSERT_EQ(all.dim_calls[x][DT_COLL_SEND_RECV], 0);
  }
  /* the inputs were placed as the op wants: nothing moved in the forward pass */
  DT_ASSERT_EQ(fwd.redistributes, 0);
  /* the tensors went to their variables and the tape (freed with them) */
  float* bufs[17] = {q, k, v, w, qr, kr, vr, wr, o1, g1q, g1k, g1v, o2, g2q, g2k, g2v, tmp};
  for (int i = 0; i < 17; i++) free(bufs[i]);
}

static void test_position(void) {
  /* 2 ranks, 8 tokens: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 */
  const int64_t want[8] = {0, 1, 6, 7, 2, 3, 4, 5};
  for (int i = 0; i < 8; i++) DT_ASSERT_EQ(dt_cp_position(i, 8, 2), want[i]);
  DT_ASSERT_EQ(dt_cp_position(5, 8, 0), 5);
  DT_ASSERT_EQ(dt_cp_position(0, 10, 3), -1); /* 10 is not a multiple of 6 */
  DT_ASSERT_EQ(dt_cp_position(8, 8, 2), -1);
  /* a permutation for every cp */
  for (int cp = 1; cp <= 5; cp++) {
    int64_t seq = 2 * cp * 3, seen = 0;
    for (int64_t i = 0; i < seq; i++) seen |= (int64_t)1 << dt_cp_position(i, seq, cp);
    DT_ASSERT_EQ(seen, ((int64_t)1 << seq) - 1);
  }
}

/* rotary with cp: the real positions' rotation of the stored order, on a sequence sharded in it */
static void test_rotary(dt_mesh_t mesh, dt_mesh_t rep_mesh) {
  const int64_t S = 4 * g_n, n = B * S * H * D, sh[4] = {B, S, H, D};
  float *x = malloc(sizeof(float) * n), *xr = malloc(sizeof(float) * n),
        *y1 = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n),
        *t = malloc(sizeof(float) * n);
  fill(x, n, 9);
  permute(xr, x, 1, B, H, S, D, g_n, 1);
  dt_placement_t rep[1] = {dt_replicate()}, sp[1] = {dt_shard(1)};
  dt_tensor_t a, b, ya, yb;
  DT_ASSERT_OK(dt_tensor_from_full(rep_mesh, DT_F32, 4, sh, rep, xr, &a));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 4, sh, sp, x, &b));
  DT_ASSERT_OK(dt_rotary(a, 1, 10000.0, &ya));
  const int64_t ia[3] = {1, 0, g_n};
  const double th = 10000.0;
  DT_ASSERT_OK(dt_op_run("rotary", 1, &b, 3, ia, 1, &th, &yb));
  DT_ASSERT_OK(dt_tensor_gather_full(ya, y1, sizeof(float) * n));
  DT_ASSERT_OK(dt_tensor_gather_full(yb, y2, sizeof(float) * n));
  permute(t, y2, 1, B, H, S, D, g_n, 1);
  cfg_t c = {0, 1, 1, 0, 0, 0, 0};
  expect_close(t, y1, n, "rotary cp", &c);
  /* a cp that does not split the sequence: refused */
  const int64_t bad[3] = {1, 0, 3 * S};
  dt_tensor_t yc = NULL;
  DT_ASSERT_STATUS(dt_op_run("rotary", 1, &b, 3, bad, 1, &th, &yc), DT_ERR_INVALID_ARG);
  dt_tensor_t ts[4] = {a, b, ya, yb};
  for (int i = 0; i < 4; i++) DT_ASSERT_OK(dt_tensor_destroy(ts[i]));
  free(x);
  free(xr);
  free(y1);
  free(y2);
  free(t);
}

static dt_tensor_t cast_to(dt_tensor_t t, dt_dtype_t to) {
  const int64_t a = to;
  dt_tensor_t y;
  DT_ASSERT_OK(dt_op_run("cast", 1, &t, 1, &a, 0, NULL, &y));
  return y;
}

/* Whether mesh's ring blocks read bf16/f16 as stored on tensor cores: a CUDA backend (or its
 * emulation) computing in its own memory (the NCCL plane; staged through the host, the host's
 * f32 blocks run) under DTENSOR_SDPA_PATH auto (the default) or flash, not gemm, for the
 * feature sizes of test_half (up to 128). Asked after a ring call (the plane is decided by the
 * mesh's first collective). */
static int tc_blocks(dt_mesh_t mesh) {
  dt_backend_t be = NULL;
  dt_data_plane_t plane;
  DT_ASSERT_OK(dt_mesh_backend(mesh, &be));
  DT_ASSERT_OK(dt_mesh_data_plane(mesh, &plane));
  const char* name = dt_backend_name(be);
  const char* path = getenv("DTENSOR_SDPA_PATH");
  return !(path != NULL && strcmp(path, "gemm") == 0) && strncmp(name, "cuda", 4) == 0 &&
         plane == DT_PLANE_NCCL;
}

/* bf16 and f16 inputs, on the ring and the all-gather: the output and the gradients come in the
 * inputs' dtype; the output is the f32 ring's on the same (rounded) values rounded to the dtype,
 * exactly (k and v travel in their dtype and convert to f32 exactly), the gradients within the
 * dtype's rounding (they use the rounded output). Where the blocks run on tensor cores
 * (tc_blocks), P and dS are rounded to the dtype before their products: the output is then
 * within the dtype's rounding too, and not exact (which shows that path ran). k and v cross the
 * cp dim in their dtype's bytes, their gradients in f32's. A sequence of 2 x ranks x `rows`
 * positions (the 1-dim mesh: chunks of `rows`), q and k of fd features, v of fe; q's values
 * times qscale (large scores: the tensor-core forward moves a row's reference max within a
 * tile). */
static void test_half(dt_mesh_t mesh, int64_t rows, int64_t fd, int64_t fe, float qscale) {
  const int64_t S = 2 * rows * (int64_t)g_n, nq = B * H * S * fd, nk = B * G * S * fd,
                nv = B * G * S * fe, no = B * H * S * fe;
  int nd, ncp;
  DT_ASSERT_OK(dt_mesh_ndim(mesh, &nd));
  /* 1-dim: the sequence over every rank; 2-dim: heads over dim 0, the sequence over dim 1 */
  const int cpd = nd - 1;
  DT_ASSERT_OK(dt_mesh_size(mesh, cpd, &ncp));
  const dt_placement_t pl[2] = {dt_shard(nd == 2 ? 1 : 2), dt_shard(2)};
  const dt_dtype_t half[2] = {DT_BF16, DT_F16};
  float *x[4], *ref[4], *got[4];
  const int64_t nn[4] = {nq, nk, nv, no}, rn[4] = {no, nq, nk, nv}; /* q k v w; o dq dk dv */
  for (int i = 0; i < 4; i++) {
    x[i] = malloc(sizeof(float) * (size_t)nn[i]);
    ref[i] = malloc(sizeof(float) * (size_t)rn[i]);
    got[i] = malloc(sizeof(float) * (size_t)rn[i]);
    DT_ASSERT_TRUE(x[i] && ref[i] && got[i], "out of memory");
    fill(x[i], nn[i], 40 + i);
  }
  for (int64_t j = 0; j < nq; j++) x[0][j] *= qscale;
  const int64_t heads[3] = {H, G, G}, feat[3] = {fd, fd, fe};
  for (int hc = 0; hc < 4; hc++) {
    const int h = hc % 2, algo = 1 + hc / 2;
    dt_counters_t fwd, all;
    for (int run = 0; run < 2; run++) { /* run 0: f32 on the rounded values; 1: in the dtype */
      dt_tensor_t t[4];
      for (int i = 0; i < 4; i++) {
        dt_tensor_t f = make(mesh, x[i], 0, i < 3 ? heads[i] : H, S, i < 3 ? feat[i] : fe, pl);
        dt_tensor_t r = cast_to(f, half[h]); /* the values the dtype holds */
        DT_ASSERT_OK(dt_tensor_destroy(f));
        t[i] = run ? r : cast_to(r, DT_F32);
        if (!run) DT_ASSERT_OK(dt_tensor_destroy(r));
      }
      dt_tape_t tape;
      DT_ASSERT_OK(dt_tape_create(&tape));
      dt_var_t v[3], vw, o, ow, loss;
      for (int i = 0; i < 3; i++) DT_ASSERT_OK(dt_var_leaf(t[i], 1, &v[i]));
      DT_ASSERT_OK(dt_tape_constant(tape, t[3], &vw));
      const int64_t a[5] = {cpd, 1, 0, 1, algo}; /* causal, (B, H, S, fd), balanced */
      DT_ASSERT_OK(dt_counters_reset(mesh));
      DT_ASSERT_OK(dt_ag_op(tape, "ring_attention", 3, v, 5, a, 0, NULL, 1, &o));
      DT_ASSERT_OK(dt_counters_get(mesh, &fwd));
      const dt_var_t m2[2] = {o, vw};
      DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, m2, 0, NULL, 0, NULL, 1, &ow));
      DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &ow, 0, NULL, 0, NULL, 1, &loss));
      DT_ASSERT_OK(dt_tape_backward(tape, loss));
      DT_ASSERT_OK(dt_counters_get(mesh, &all));
      const dt_tensor_t res[4] = {dt_var_value(o), dt_var_grad(v[0]), dt_var_grad(v[1]),
                                  dt_var_grad(v[2])};
      for (int i = 0; i < 4; i++) {
        dt_dtype_t dt;
        DT_ASSERT_OK(dt_tensor_dtype(res[i], &dt));
        DT_ASSERT_TRUE(dt == (run ? half[h] : DT_F32), "%s run: result %d is %s",
                       dt_dtype_name(half[h]), i, dt_dtype_name(dt));
        /* the f32 run's output rounded to the dtype, as the dtype's run rounds its own */
        dt_tensor_t rd = !run && i == 0 ? cast_to(res[i], half[h]) : NULL;
        dt_tensor_t f = cast_to(rd ? rd : res[i], DT_F32);
        DT_ASSERT_OK(dt_tensor_gather_full(f, run ? got[i] : ref[i],
                                           sizeof(float) * (size_t)rn[i]));
        DT_ASSERT_OK(dt_tensor_destroy(f));
        if (rd) DT_ASSERT_OK(dt_tensor_destroy(rd));
      }
      DT_ASSERT_OK(dt_tape_destroy(tape));
      for (int i = 0; i < 3; i++) DT_ASSERT_OK(dt_var_destroy(v[i]));
    }
    /* the dtype's run (the counters of the last run): k and v's shards (1/g_n of them: the
     * sequence over the cp dim, heads over the other) at 2 bytes an element, their gradients'
     * at 4 */
    const uint64_t kvh = 2 * (uint64_t)(nk + nv) / (uint64_t)g_n, kvf = 2 * kvh;
    const uint64_t n = (uint64_t)ncp;
    if (algo == 1) {
      DT_ASSERT_EQ(fwd.dim_nbytes[cpd][DT_COLL_SEND_RECV], (n - 1) * kvh);
      DT_ASSERT_EQ(all.dim_nbytes[cpd][DT_COLL_SEND_RECV] - fwd.dim_nbytes[cpd][DT_COLL_SEND_RECV],
                   n > 1 ? (n - 1) * kvh + n * kvf : 0);
    } else {
      DT_ASSERT_EQ(fwd.dim_nbytes[cpd][DT_COLL_ALL_GATHER], n * kvh);
      DT_ASSERT_EQ(all.dim_nbytes[cpd][DT_COLL_ALL_GATHER], 2 * n * kvh);
      DT_ASSERT_EQ(all.dim_nbytes[cpd][DT_COLL_REDUCE_SCATTER], n * kvf);
      DT_ASSERT_EQ(all.dim_calls[cpd][DT_COLL_SEND_RECV], 0);
    }
    const int tc = tc_blocks(mesh);
    int64_t bad = 0; /* the output: the f32 run's, rounded (tensor cores: not exactly) */
    for (int64_t j = 0; j < no; j++) bad += got[0][j] != ref[0][j];
    if (g_rank == 0)
      printf("%s algo %d%s: %lld of %lld outputs differ from the f32 run's, rounded\n",
             dt_dtype_name(half[h]), algo, tc ? " (tensor cores)" : "", (long long)bad,
             (long long)no);
    DT_ASSERT_TRUE(tc ? bad > 0 : bad == 0, "%s algo %d: %lld of %lld outputs differ from the "
                   "f32 run's, rounded (%s expected)", dt_dtype_name(half[h]), algo,
                   (long long)bad, (long long)no, tc ? "some" : "none");
    /* the dtype's rounding of results computed in f32: 2^-8 (bf16) or 2^-11 (f16) relative */
    const double tol = h == 0 ? 8e-3 : 1e-3;
    const char* what[4] = {"o", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
      const double m = max_abs(ref[i], rn[i]);
      double worst = 0;
      for (int64_t j = 0; j < rn[i]; j++)
        worst = fmax(worst, fabs((double)got[i][j] - ref[i][j]) / m);
      if (g_rank == 0)
        printf("%s algo %d %s: worst difference from the f32 ring %.3g of the largest |value| "
               "%.3g\n", dt_dtype_name(half[h]), algo, what[i], worst, m);
      DT_ASSERT_TRUE(worst <= tol, "%s algo %d %s: %.3g above %.3g", dt_dtype_name(half[h]),
                     algo, what[i], worst, tol);
    }
  }
  for (int i = 0; i < 4; i++) {
    free(x[i]);
    free(ref[i]);
    free(got[i]);
  }
}

static void test_refusals(dt_mesh_t mesh) {
  dt_placement_t pl[1] = {dt_shard(2)};
  const int64_t S = 2 * g_n * 2 + 1; /* not a multiple of 2n (odd) */
  int64_t sh[4] = {1, 2, S, 4}, sh2[4] = {1, 2, 4 * g_n, 4};
  dt_tensor_t q, k, q2, o = NULL, qb;
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 4, sh, pl, &q));
  DT_ASSERT_STATUS(dt_ring_attention(q, q, q, 0, 1, 1, 0.0, &o), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "pad it") != NULL, "message: %s", dt_last_error());
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 4, sh2, pl, &k));
  DT_ASSERT_STATUS(dt_ring_attention(q, k, k, 0, 1, 1, 0.0, &o), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_ring_attention(k, k, k, 1, 1, 1, 0.0, &o), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_BF16, 4, sh2, pl, &qb));
  DT_ASSERT_STATUS(dt_ring_attention(qb, k, k, 0, 1, 1, 0.0, &o), DT_ERR_INVALID_ARG); /* mixed */
  /* in order (not balanced) only n chunks are needed */
  int64_t sh3[4] = {1, 2, 3 * g_n, 4};
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 4, sh3, pl, &q2));
  DT_ASSERT_STATUS(dt_ring_attention(q2, q2, q2, 0, 1, 1, 0.0, &o), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_ring_attention(q2, q2, q2, 0, 1, 0, 0.0, &o));
  DT_ASSERT_OK(dt_tensor_destroy(o));
  dt_tensor_t ts[4] = {q, k, q2, qb};
  for (int i = 0; i < 4; i++) DT_ASSERT_OK(dt_tensor_destroy(ts[i]));
  /* empty extents: no batch, no value features, no sequence (causal, the cost model's choice:
   * its price of an empty diagonal block); forward and backward run and give empty or zero
   * results */
  const int64_t e0[4] = {0, 2, 4 * g_n, 4}, e1[4] = {1, 2, 4 * g_n, 0}, e2[4] = {1, 2, 0, 4};
  const int64_t* eqs[3] = {e0, sh2, e2};
  const int64_t* evs[3] = {e0, e1, e2};
  for (int c = 0; c < 3; c++) {
    dt_tensor_t eq, ev;
    DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 4, eqs[c], pl, &eq));
    DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 4, evs[c], pl, &ev));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    dt_var_t vq, vv, vo, loss;
    DT_ASSERT_OK(dt_var_leaf(eq, 1, &vq));
    DT_ASSERT_OK(dt_var_leaf(ev, 1, &vv));
    const dt_var_t in[3] = {vq, vq, vv};
    const int64_t a[2] = {0, 1};
    DT_ASSERT_OK(dt_ag_op(tape, "ring_attention", 3, in, 2, a, 0, NULL, 1, &vo));
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &vo, 0, NULL, 0, NULL, 1, &loss));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    float lv = 1.0f;
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv));
    DT_ASSERT_TRUE(lv == 0.0f, "empty attention summed to %g", (double)lv);
    DT_ASSERT_OK(dt_tape_destroy(tape));
    DT_ASSERT_OK(dt_var_destroy(vq));
    DT_ASSERT_OK(dt_var_destroy(vv));
  }
}

/* The scale as sdpa takes it (absent or NaN: 1/sqrt(D); 0 and negative literal; +-inf refused),
 * and NaN inputs, which must give NaN (not undefined behaviour in the vectorized exp). */
static void test_scale(dt_mesh_t mesh) {
  const int64_t S = 4 * g_n, nq = B * H * S * D, nk = B * G * S * D, nv = B * G * S * E,
                no = B * H * S * E;
  float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk),
        *v = malloc(sizeof(float) * nv), *o1 = malloc(sizeof(float) * no),
        *o2 = malloc(sizeof(float) * no);
  fill(q, nq, 11);
  fill(k, nk, 12);
  fill(v, nv, 13);
  const dt_placement_t pl[1] = {dt_shard(2)};
  dt_tensor_t tq = make(mesh, q, 0, H, S, D, pl), tk = make(mesh, k, 0, G, S, D, pl),
              tv = make(mesh, v, 0, G, S, E, pl);
  const dt_tensor_t in[3] = {tq, tk, tv};
  const int64_t ra[4] = {0, 0, 0, 0}; /* mesh dim 0, not causal, layout 0, in order */
  const double scales[3] = {-0.5, 0.0, 0.75};
  for (int i = 0; i < 3; i++) {
    dt_tensor_t a, b;
    DT_ASSERT_OK(dt_op_run("ring_attention", 3, in, 4, ra, 1, &scales[i], &a));
    DT_ASSERT_OK(dt_op_run("sdpa", 3, in, 0, NULL, 1, &scales[i], &b));
    DT_ASSERT_OK(dt_tensor_gather_full(a, o1, sizeof(float) * no));
    DT_ASSERT_OK(dt_tensor_gather_full(b, o2, sizeof(float) * no));
    cfg_t c = {0, 0, 0, 0, 4, 0, 0};
    expect_close(o1, o2, no, scales[i] < 0 ? "ring vs sdpa, scale -0.5"
                             : scales[i] == 0 ? "ring vs sdpa, scale 0" : "ring vs sdpa, scale 0.75",
                 &c);
    DT_ASSERT_OK(dt_tensor_destroy(a));
    DT_ASSERT_OK(dt_tensor_destroy(b));
  }
  const double infs[2] = {INFINITY, -INFINITY};
  for (int i = 0; i < 2; i++) {
    dt_tensor_t a = NULL;
    DT_ASSERT_STATUS(dt_op_run("ring_attention", 3, in, 4, ra, 1, &infs[i], &a), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "scale=") != NULL, "message: %s", dt_last_error());
    DT_ASSERT_STATUS(dt_op_run("sdpa", 3, in, 0, NULL, 1, &infs[i], &a), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "scale=") != NULL, "message: %s", dt_last_error());
  }
  dt_tensor_t a = NULL;
  /* the typed entries too, -inf included (it is <= 0, but infinite: it was taken for the
   * default 1/sqrt(D)) */
  for (int i = 0; i < 2; i++) {
    DT_ASSERT_STATUS(dt_sdpa(tq, tk, tv, 0, infs[i], &a), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(a == NULL && strstr(dt_last_error(), "scale=") != NULL, "message: %s",
                   dt_last_error());
    DT_ASSERT_STATUS(dt_ring_attention(tq, tk, tv, 0, 0, 0, infs[i], &a), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(a == NULL && strstr(dt_last_error(), "scale=") != NULL, "message: %s",
                   dt_last_error());
  }
  /* sdpa_grad's g: a float dtype (i32 refused by the rules, not the kernel) */
  dt_tensor_t gi, grads[3];
  const int64_t osh[4] = {B, H, S, E};
  DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_I32, 4, osh, pl, &gi));
  const dt_tensor_t gin[4] = {tq, tk, tv, gi};
  DT_ASSERT_STATUS(dt_op_run_multi("sdpa_grad", 4, gin, 0, NULL, 0, NULL, 3, grads),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "expected a float dtype") != NULL, "message: %s",
                 dt_last_error());
  DT_ASSERT_OK(dt_tensor_destroy(gi));
  /* a v of the wrong length: the message shows v's shape */
  const dt_tensor_t bad[3] = {tq, tk, tq};
  DT_ASSERT_STATUS(dt_op_run("sdpa", 3, bad, 0, NULL, 0, NULL, &a), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "and v 2x4x") != NULL, "message: %s", dt_last_error());
  /* a NaN query row: its outputs NaN, the other rows' finite */
  q[0] = NAN;
  dt_tensor_t tn = make(mesh, q, 0, H, S, D, pl);
  const dt_tensor_t inn[3] = {tn, tk, tv};
  for (int op = 0; op < 2; op++) {
    DT_ASSERT_OK(op ? dt_op_run("sdpa", 3, inn, 0, NULL, 0, NULL, &a)
                    : dt_op_run("ring_attention", 3, inn, 4, ra, 0, NULL, &a));
    DT_ASSERT_OK(dt_tensor_gather_full(a, o1, sizeof(float) * no));
    DT_ASSERT_TRUE(isnan(o1[0]) && isfinite(o1[E]), "%s with a NaN query: row 0 %g, row 1 %g",
                   op ? "sdpa" : "ring_attention", (double)o1[0], (double)o1[E]);
    DT_ASSERT_OK(dt_tensor_destroy(a));
  }
  dt_tensor_t ts[4] = {tq, tk, tv, tn};
  for (int i = 0; i < 4; i++) DT_ASSERT_OK(dt_tensor_destroy(ts[i]));
  free(q), free(k), free(v), free(o1), free(o2);
}

/* Under algo auto the ranks decide alike even when their models differ (each rank's own: here
 * rank 0 prices attention as slow, where the ring hides the transfers, and the others as fast,
 * where one all-gather beats the ring's slow point-to-point steps): the group agrees on the
 * all-gather, and the call completes on every rank with the sdpa result. */
static void test_algo_agreed(dt_mesh_t mesh) {
  if (g_n < 2) return;
  dt_cost_params_t p0, g0, p;
  dt_compute_params_t c0, c;
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_SEND_RECV, &p0));
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &g0));
  DT_ASSERT_OK(dt_compute_model_get(&c0));
  p = p0;
  p.base_us = 1e5;
  DT_ASSERT_OK(dt_cost_model_set(DT_COLL_SEND_RECV, &p));
  p = g0;
  p.base_us = 1.0;
  p.bw_gbps = 1e5;
  DT_ASSERT_OK(dt_cost_model_set(DT_COLL_ALL_GATHER, &p));
  c = c0;
  c.attn_gflops = g_rank == 0 ? 1e-6 : 1e6;
  DT_ASSERT_OK(dt_compute_model_set(&c));
  const int64_t S = 4 * g_n, nq = B * H * S * D, no = B * H * S * D;
  float *q = malloc(sizeof(float) * nq), *o1 = malloc(sizeof(float) * no),
        *o2 = malloc(sizeof(float) * no);
  fill(q, nq, 21);
  const dt_placement_t pl[1] = {dt_shard(2)};
  dt_tensor_t tq = make(mesh, q, 0, H, S, D, pl), a = NULL, b = NULL;
  dt_counters_t ct;
  DT_ASSERT_OK(dt_counters_reset(mesh));
  DT_ASSERT_OK(dt_ring_attention(tq, tq, tq, 0, 0, 0, 0.0, &a)); /* not causal, in order */
  DT_ASSERT_OK(dt_counters_get(mesh, &ct));
  DT_ASSERT_TRUE(ct.calls[DT_COLL_ALL_GATHER] > 0 && ct.calls[DT_COLL_SEND_RECV] == 0,
                 "rank %d: %llu all-gathers and %llu send_recv: the group did not agree on the "
                 "all-gather", g_rank, (unsigned long long)ct.calls[DT_COLL_ALL_GATHER],
                 (unsigned long long)ct.calls[DT_COLL_SEND_RECV]);
  DT_ASSERT_OK(dt_sdpa(tq, tq, tq, 0, 0.0, &b));
  DT_ASSERT_OK(dt_tensor_gather_full(a, o1, sizeof(float) * no));
  DT_ASSERT_OK(dt_tensor_gather_full(b, o2, sizeof(float) * no));
  cfg_t cf = {0, 0, 0, 0, 4, 0, 0};
  expect_close(o1, o2, no, "ring attention with the algorithm agreed", &cf);
  DT_ASSERT_OK(dt_cost_model_set(DT_COLL_SEND_RECV, &p0));
  DT_ASSERT_OK(dt_cost_model_set(DT_COLL_ALL_GATHER, &g0));
  DT_ASSERT_OK(dt_compute_model_set(&c0));
  dt_tensor_t ts[3] = {tq, a, b};
  for (int i = 0; i < 3; i++) DT_ASSERT_OK(dt_tensor_destroy(ts[i]));
  free(q), free(o1), free(o2);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_n));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  test_position();
  const char* names[1] = {"cp"};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, names, NULL, &mesh));
  /* the reference: replicated, computed whole on every rank, by the host's kernels (under a
   * device backend the ring's fused blocks and the device's sdpa share kernels) */
  dt_mesh_t solo;
  dt_backend_t cpu;
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, names, NULL, &solo));
  DT_ASSERT_OK(dt_backend_get("cpu", &cpu));
  DT_ASSERT_OK(dt_mesh_set_backend(solo, cpu));
  test_refusals(mesh);
  test_scale(mesh);
  test_algo_agreed(mesh);
  test_half(mesh, 2, D, E, 1.0f);
  /* chunks of more than one 64-row tile of the tensor-core blocks, features in 8 fragments */
  test_half(mesh, 70, 72, 40, 12.0f);
  test_rotary(mesh, solo);
  for (int causal = 0; causal < 2; causal++)
    for (int balanced = 0; balanced < 2; balanced++)
      for (int layout = 0; layout < 2; layout++)
        for (int algo = 0; algo < 3; algo++) {
          cfg_t c = {causal, balanced, layout, algo, 3, 0, 0};
          dt_placement_t pl[1] = {dt_shard(layout ? 1 : 2)};
          run_case(mesh, solo, pl, 0, &c);
        }
  /* chunks longer than a GPU kernel's tiles (16 query rows, 32 keys; the fused blocks under
   * DTENSOR_SDPA_PATH=flash): several tiles per block, the last ones partial; and longer than
   * the host's chunks of 64 rows (70: 64 + 6; in order, one block of 140 rows: 64 + 64 + 12) */
  for (int causal = 0; causal < 2; causal++)
    for (int layout = 0; layout < 2; layout++) {
      cfg_t c = {causal, 1, layout, 1, causal ? 70 : 37, 0, 0};
      dt_placement_t pl[1] = {dt_shard(layout ? 1 : 2)};
      run_case(mesh, solo, pl, 0, &c);
    }
  for (int causal = 0; causal < 2; causal++) {
    cfg_t c = {causal, 0, causal, 1, causal ? 70 : 37, 0, 0}; /* in order: 2 rows x chunk */
    dt_placement_t pl[1] = {dt_shard(causal ? 1 : 2)};
    run_case(mesh, solo, pl, 0, &c);
  }
  /* feature sizes: v's wider than q's and odd; heads too wide for a GPU kernel's tiles in shared
   * memory (D + E = 800: the fused blocks leave them to the products) */
  const cfg_t wide[2] = {{0, 1, 0, 1, 20, 5, 9}, {1, 1, 1, 1, 3, 400, 400}};
  for (int i = 0; i < 2; i++) {
    dt_placement_t pl[1] = {dt_shard(wide[i].layout ? 1 : 2)};
    run_case(mesh, solo, pl, 0, &wide[i]);
  }
  if (g_n == 4) { /* 2 x 2: heads on dim 0 (tp), the sequence on dim 1 (cp) */
    const int shape[2] = {2, 2};
    const char* n2[2] = {"tp", "cp"};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, shape, n2, NULL, &m2));
    for (int algo = 1; algo < 3; algo++)
      for (int layout = 0; layout < 2; layout++) {
        cfg_t c = {1, 1, layout, algo, 3, 0, 0};
        dt_placement_t pl[2] = {dt_shard(layout ? 2 : 1), dt_shard(layout ? 1 : 2)};
        run_case(m2, solo, pl, 1, &c);
      }
    test_half(m2, 2, D, E, 1.0f);
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
  DT_ASSERT_OK(dt_mesh_destroy(solo));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_rank == 0) printf("test_ring_attention: passed on %d ranks\n", g_n);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

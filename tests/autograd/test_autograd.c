/* test_autograd.c - tape semantics around the model (np 2 and 4):
 *   - micro-batches: two half batches with the loss halved accumulate the full batch's gradients
 *     (within 2e-5 relative: the summation order differs);
 *   - gradient-norm clipping gives one norm whatever the parameter placements (all replicated vs
 *     the tensor-parallel plan) and scales the gradients to max_norm;
 *   - the gradient of a redistribution goes back to the source placements (a source Partial
 *     becoming Replicate, unless the gradient comes back as that same Partial: then it stays,
 *     with no collective) with the right values;
 *   - AdamW with bf16 moments stays within bf16 rounding of the f32-moment update;
 *   - a frozen embedding: the other gradients as without it, none for it (no double free);
 *   - errors: a non-scalar loss, an op without a backward rule on a variable that needs one
 *     (allowed with grad mode off), a loss that needs no gradient;
 *   - misuse of the tape: a loss recorded on another tape is refused and leaves no seed behind
 *     (the right tape's pass then gives the gradient once, not twice); a hook that resets the
 *     tape or starts another pass on it is refused (it freed the graph being walked: a
 *     use-after-free; or recursed until the stack overflowed), and the tape works on after it.
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"

static int g_n, g_rank;
static dt_mesh_t g_mesh;
static const char* kTP =
    "*.wq=S(0);*.wk=S(0);*.wv=S(0);*.w1=S(0);*.w3=S(0);*.wo=S(1);*.w2=S(1);output=S(0);"
    "tok_emb=S(1)";

static dt_llama_config_t small_cfg(void) {
  dt_llama_config_t c;
  memset(&c, 0, sizeof c);
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.vocab = 16;
  c.seq_len = 8;
  c.seed = 5;
  return c;
}

static void batch(dt_corpus_t corpus, int64_t step, int B, int off, int nb, dt_tensor_t* tok,
                  dt_tensor_t* tgt) {
  int64_t t[64 * 8], g[64 * 8];
  DT_ASSERT_OK(dt_corpus_batch(corpus, 9, step, B, 8, t, g));
  dt_placement_t rep = dt_replicate();
  int64_t shape[2] = {nb, 8};
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, shape, &rep, t + off * 8, tok));
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_I64, 2, shape, &rep, g + off * 8, tgt));
}

/* Full-contents copies of every parameter gradient. */
static float** grads(dt_llama_t m, int* n) {
  dt_var_t* p;
  DT_ASSERT_OK(dt_llama_params(m, &p, NULL, n, NULL));
  float** out = calloc((size_t)*n, sizeof(float*));
  for (int i = 0; i < *n; i++) {
    dt_tensor_t g = dt_var_grad(p[i]);
    DT_ASSERT_TRUE(g != NULL, "parameter %d has no gradient", i);
    int nd;
    int64_t s[8], ne = 1;
    DT_ASSERT_OK(dt_tensor_ndim(g, &nd));
    DT_ASSERT_OK(dt_tensor_shape(g, s));
    for (int d = 0; d < nd; d++) ne *= s[d];
    out[i] = malloc(sizeof(float) * (size_t)ne + sizeof(int64_t));
    DT_ASSERT_OK(dt_tensor_gather_full(g, out[i], sizeof(float) * (size_t)ne));
  }
  return out;
}

static void micro_batches(dt_corpus_t corpus) {
  dt_llama_config_t c = small_cfg();
  dt_llama_t m;
  DT_ASSERT_OK(dt_llama_create(g_mesh, &c, kTP, &m));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_tensor_t tok, tgt;
  dt_var_t loss;
  batch(corpus, 0, 8, 0, 8, &tok, &tgt);
  DT_ASSERT_OK(dt_llama_forward(m, tape, tok, tgt, &loss, NULL));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tape_reset(tape));
  dt_tensor_destroy(tok);
  dt_tensor_destroy(tgt);
  int n;
  float** full = grads(m, &n);
  dt_var_t* p;
  DT_ASSERT_OK(dt_llama_params(m, &p, NULL, NULL, NULL));
  for (int i = 0; i < n; i++) DT_ASSERT_OK(dt_var_zero_grad(p[i]));
  for (int half = 0; half < 2; half++) {
    batch(corpus, 0, 8, 4 * half, 4, &tok, &tgt);
    DT_ASSERT_OK(dt_llama_forward(m, tape, tok, tgt, &loss, NULL));
    dt_var_t scaled;
    const double h = 0.5;
    DT_ASSERT_OK(dt_ag_op(tape, "mul_scalar", 1, &loss, 0, NULL, 1, &h, 1, &scaled));
    DT_ASSERT_OK(dt_tape_backward(tape, scaled));
    DT_ASSERT_OK(dt_tape_reset(tape));
    dt_tensor_destroy(tok);
    dt_tensor_destroy(tgt);
  }
  float** acc = grads(m, &n);
  for (int i = 0; i < n; i++) {
    int nd;
    int64_t s[8], ne = 1;
    DT_ASSERT_OK(dt_tensor_ndim(dt_var_grad(p[i]), &nd));
    DT_ASSERT_OK(dt_tensor_shape(dt_var_grad(p[i]), s));
    for (int d = 0; d < nd; d++) ne *= s[d];
    double num = 0, den = 0;
    for (int64_t k = 0; k < ne; k++) {
      num += (double)(acc[i][k] - full[i][k]) * (acc[i][k] - full[i][k]);
      den += (double)full[i][k] * full[i][k];
    }
    DT_ASSERT_TRUE(sqrt(num) <= 2e-5 * sqrt(den) + 1e-9, "parameter %d: accumulated gradient "
                   "differs by %g (norm %g)", i, sqrt(num), sqrt(den));
    free(acc[i]);
    free(full[i]);
  }
  free(acc);
  free(full);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_llama_destroy(m));
}

/* A frozen input whose op's rule computes every input's gradient (rms_norm after a frozen
 * embedding: the normalized activations need none): the gradient made for it is dropped once
 * (it was freed twice). Every other parameter's gradient equals the unfrozen model's; the frozen
 * one has none; three passes over the tape (a double free shows under ASan and the guarded
 * backend). */
static void frozen_embedding(dt_corpus_t corpus) {
  dt_llama_config_t c = small_cfg();
  dt_llama_t m[2];
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  float* want[64] = {NULL};
  int n = 0;
  for (int k = 0; k < 2; k++) {
    DT_ASSERT_OK(dt_llama_create(g_mesh, &c, kTP, &m[k]));
    dt_var_t* p;
    const char* const* names;
    DT_ASSERT_OK(dt_llama_params(m[k], &p, &names, &n, NULL));
    DT_ASSERT_TRUE(n <= 64 && strcmp(names[0], "tok_emb") == 0, "params %d, first '%s'", n,
                   names[0]);
    if (k == 1) DT_ASSERT_OK(dt_var_set_requires_grad(p[0], 0));
    for (int pass = 0; pass < (k ? 3 : 1); pass++) {
      dt_tensor_t tok, tgt;
      dt_var_t loss;
      for (int i = 0; i < n; i++) DT_ASSERT_OK(dt_var_zero_grad(p[i]));
      batch(corpus, 0, 8, 0, 8, &tok, &tgt);
      DT_ASSERT_OK(dt_llama_forward(m[k], tape, tok, tgt, &loss, NULL));
      DT_ASSERT_OK(dt_tape_backward(tape, loss));
      DT_ASSERT_OK(dt_tape_reset(tape));
      dt_tensor_destroy(tok);
      dt_tensor_destroy(tgt);
    }
    DT_ASSERT_TRUE(k == 0 || dt_var_grad(p[0]) == NULL, "the frozen tok_emb has a gradient");
    for (int i = 1; i < n; i++) {
      dt_tensor_t g = dt_var_grad(p[i]);
      DT_ASSERT_TRUE(g != NULL, "parameter %s has no gradient (frozen %d)", names[i], k);
      int nd;
      int64_t sh[8], ne = 1;
      DT_ASSERT_OK(dt_tensor_ndim(g, &nd));
      DT_ASSERT_OK(dt_tensor_shape(g, sh));
      for (int d = 0; d < nd; d++) ne *= sh[d];
      float* v = malloc(sizeof(float) * (size_t)ne);
      DT_ASSERT_TRUE(v != NULL, "malloc");
      DT_ASSERT_OK(dt_tensor_gather_full(g, v, sizeof(float) * (size_t)ne));
      if (k == 0) {
        want[i] = v;
        continue;
      }
      for (int64_t e = 0; e < ne; e++)
        DT_ASSERT_TRUE(fabsf(v[e] - want[i][e]) <= 1e-6f * (1.0f + fabsf(want[i][e])),
                       "%s[%lld]: %g with tok_emb frozen, %g without", names[i], (long long)e,
                       (double)v[e], (double)want[i][e]);
      free(v);
      free(want[i]);
    }
  }
  for (int k = 0; k < 2; k++) DT_ASSERT_OK(dt_llama_destroy(m[k]));
  DT_ASSERT_OK(dt_tape_destroy(tape));
}

static void clipping(dt_corpus_t corpus) {
  double norms[2];
  for (int k = 0; k < 2; k++) {
    dt_llama_config_t c = small_cfg();
    dt_llama_t m;
    DT_ASSERT_OK(dt_llama_create(g_mesh, &c, k ? kTP : NULL, &m));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    dt_tensor_t tok, tgt;
    dt_var_t loss;
    batch(corpus, 1, 8, 0, 8, &tok, &tgt);
    DT_ASSERT_OK(dt_llama_forward(m, tape, tok, tgt, &loss, NULL));
    DT_ASSERT_OK(dt_tape_backward(tape, loss));
    DT_ASSERT_OK(dt_tape_destroy(tape));
    dt_var_t* p;
    int n;
    DT_ASSERT_OK(dt_llama_params(m, &p, NULL, &n, NULL));
    DT_ASSERT_OK(dt_clip_grad_norm(n, p, 0.0, &norms[k]));
    double after;
    DT_ASSERT_OK(dt_clip_grad_norm(n, p, norms[k] / 2, NULL));
    DT_ASSERT_OK(dt_clip_grad_norm(n, p, 0.0, &after));
    DT_ASSERT_TRUE(fabs(after - norms[k] / 2) <= 1e-4 * norms[k], "clipped norm %g, wanted %g",
                   after, norms[k] / 2);
    dt_tensor_destroy(tok);
    dt_tensor_destroy(tgt);
    DT_ASSERT_OK(dt_llama_destroy(m));
  }
  DT_ASSERT_TRUE(norms[0] > 0 && fabs(norms[0] - norms[1]) <= 1e-5 * norms[0],
                 "grad norm replicated %.8g vs tensor-parallel %.8g", norms[0], norms[1]);
}

static void redistribute_grad(void) {
  int64_t s[2] = {2 * g_n, 3};
  float x[64], r[64];
  for (int i = 0; i < 6 * g_n; i++) x[i] = (float)i, r[i] = (float)(i % 5) - 2.0f;
  dt_placement_t psum = dt_partial(DT_REDUCE_SUM), s0 = dt_shard(0), rep = dt_replicate();
  for (int k = 0; k < 2; k++) {
    dt_tensor_t xt, rt;
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s, k ? &psum : &s0, x, &xt));
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s, &rep, r, &rt));
    dt_var_t xv, rv, y, p, l;
    DT_ASSERT_OK(dt_var_leaf(xt, 1, &xv));
    DT_ASSERT_OK(dt_var_leaf(rt, 0, &rv));
    dt_tape_t tape;
    DT_ASSERT_OK(dt_tape_create(&tape));
    DT_ASSERT_OK(dt_ag_redistribute(tape, xv, &rep, &y));
    dt_var_t in[2] = {y, rv};
    DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, in, 0, NULL, 0, NULL, 1, &p));
    const int64_t all[1] = {0};
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &p, 1, all, 0, NULL, 1, &l));
    DT_ASSERT_OK(dt_tape_backward(tape, l));
    dt_placement_t gp;
    DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(xv), &gp));
    DT_ASSERT_TRUE(dt_placement_equal(gp, k ? psum : s0), "gradient keeps the leaf placements");
    float g[64];
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(xv), g, sizeof(float) * (size_t)(6 * g_n)));
    for (int i = 0; i < 6 * g_n; i++) DT_ASSERT_TRUE(g[i] == r[i], "d/dx element %d", i);
    DT_ASSERT_OK(dt_tape_destroy(tape));
    DT_ASSERT_OK(dt_var_destroy(xv));
    DT_ASSERT_OK(dt_var_destroy(rv));
  }
  /* P(sum) -> P(sum) with a P(sum) gradient coming back: the gradient stays P(sum) as it came
   * (local ones, no all-reduce), as PyTorch's test_partial_to_partial_forward_backward. */
  dt_tensor_t xt;
  DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s, &psum, x, &xt));
  dt_var_t xv, y, t, l;
  DT_ASSERT_OK(dt_var_leaf(xt, 1, &xv));
  DT_ASSERT_OK(dt_var_set_grad_mode(xv, DT_GRAD_AS_IS));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_ag_redistribute(tape, xv, &psum, &y));
  DT_ASSERT_OK(dt_ag_to_local(tape, y, &psum, &t));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &t, 0, NULL, 0, NULL, 1, &l));
  DT_ASSERT_OK(dt_counters_reset(g_mesh));
  DT_ASSERT_OK(dt_tape_backward(tape, l));
  dt_counters_t cnt;
  DT_ASSERT_OK(dt_counters_get(g_mesh, &cnt));
  DT_ASSERT_EQ(cnt.calls[DT_COLL_ALL_REDUCE] + cnt.calls[DT_COLL_REDUCE_SCATTER], 0);
  dt_placement_t gp;
  DT_ASSERT_OK(dt_tensor_placements(dt_var_grad(xv), &gp));
  DT_ASSERT_TRUE(dt_placement_equal(gp, psum), "P -> P: the gradient stays P(sum)");
  float gl[64];
  int64_t gn;
  DT_ASSERT_OK(dt_tensor_local_numel(dt_var_grad(xv), &gn));
  DT_ASSERT_EQ(gn, 6 * g_n);
  DT_ASSERT_OK(dt_tensor_read_local(dt_var_grad(xv), 0, gn, gl));
  for (int i = 0; i < 6 * g_n; i++) DT_ASSERT_TRUE(gl[i] == 1.0f, "local d/dx element %d", i);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(xv));
}

static void adamw_bf16(void) {
  int64_t s[2] = {4, 8};
  dt_placement_t s0 = dt_shard(0);
  float w0[32], gv[32], out[2][32];
  for (int i = 0; i < 32; i++) w0[i] = (float)i / 32.0f, gv[i] = (float)((i * 7) % 11) - 5.0f;
  for (int k = 0; k < 2; k++) {
    dt_tensor_t wt, gt;
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s, &s0, w0, &wt));
    dt_var_t w;
    DT_ASSERT_OK(dt_var_leaf(wt, 1, &w));
    dt_adamw_config_t ac = {1e-2, 0.9, 0.95, 1e-8, 0.1, k};
    dt_adamw_t opt;
    DT_ASSERT_OK(dt_adamw_create(&ac, 1, &w, &opt));
    for (int step = 0; step < 5; step++) {
      /* a gradient through the tape: d/dw sum(w * g) = g */
      DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, s, &s0, gv, &gt));
      dt_var_t gvv, p, l;
      DT_ASSERT_OK(dt_var_leaf(gt, 0, &gvv));
      dt_tape_t tape;
      DT_ASSERT_OK(dt_tape_create(&tape));
      dt_var_t in[2] = {w, gvv};
      DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, in, 0, NULL, 0, NULL, 1, &p));
      const int64_t all[1] = {0};
      DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &p, 1, all, 0, NULL, 1, &l));
      DT_ASSERT_OK(dt_tape_backward(tape, l));
      DT_ASSERT_OK(dt_adamw_step(opt, 1e-2));
      DT_ASSERT_OK(dt_var_zero_grad(w));
      DT_ASSERT_OK(dt_tape_destroy(tape));
      DT_ASSERT_OK(dt_var_destroy(gvv));
    }
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w), out[k], sizeof out[k]));
    DT_ASSERT_OK(dt_adamw_destroy(opt));
    DT_ASSERT_OK(dt_var_destroy(w));
  }
  for (int i = 0; i < 32; i++) {
    DT_ASSERT_TRUE(fabsf(out[0][i] - w0[i]) > 1e-3f, "AdamW moved nothing");
    DT_ASSERT_TRUE(fabsf(out[0][i] - out[1][i]) <= 2e-3f, "bf16 moments: %g vs %g", out[1][i],
                   out[0][i]);
  }
}

/* modules: a plan-placed, zero-initialized bias; linear over (B, S, K) with bias and LayerNorm
 * against the same ops written out; gradients flow to every parameter. Clipping on a 2x2 mesh
 * reduces the norm with one all-reduce over the flattened mesh (not one per tensor or dim). */
static void modules(void) {
  dt_var_t w, b, g, beta, x;
  const int64_t ws[2] = {6, 4}, bs[1] = {6}, xs[3] = {2, g_n, 4};
  DT_ASSERT_OK(dt_nn_param(g_mesh, "lin.w=S(0);lin.b=S(0)", "lin.w", 2, ws, DT_INIT_NORMAL, 0.5,
                           7, &w));
  DT_ASSERT_OK(dt_nn_param(g_mesh, "lin.w=S(0);lin.b=S(0)", "lin.b", 1, bs, DT_INIT_ZEROS, 0.0,
                           7, &b));
  DT_ASSERT_OK(dt_nn_param(g_mesh, NULL, "ln.w", 1, bs, DT_INIT_ONES, 0.0, 7, &g));
  DT_ASSERT_OK(dt_nn_param(g_mesh, NULL, "ln.b", 1, bs, DT_INIT_ZEROS, 0.0, 7, &beta));
  dt_placement_t pb;
  DT_ASSERT_OK(dt_tensor_placements(dt_var_value(b), &pb));
  DT_ASSERT_TRUE(dt_placement_equal(pb, dt_shard(0)), "plan placement");
  float bz[6];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(b), bz, sizeof bz));
  for (int i = 0; i < 6; i++) DT_ASSERT_TRUE(bz[i] == 0.0f, "bias zero-initialized");
  dt_placement_t rep = dt_replicate();
  dt_tensor_t xt;
  DT_ASSERT_OK(dt_tensor_randn(g_mesh, DT_F32, 3, xs, &rep, 3, &xt));
  DT_ASSERT_OK(dt_var_leaf(xt, 1, &x));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t y, z, l;
  DT_ASSERT_OK(dt_nn_linear(tape, x, w, b, &y));
  DT_ASSERT_OK(dt_nn_layer_norm(tape, y, g, beta, 1e-5, &z));
  const int64_t all[1] = {0};
  dt_var_t sq[2] = {z, z}, p;
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, sq, 0, NULL, 0, NULL, 1, &p));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &p, 1, all, 0, NULL, 1, &l));
  /* reference: the same computation with plain ops on a 2-D view */
  dt_tensor_t x2, y2, ref;
  const int64_t s2[2] = {2 * g_n, 4};
  dt_tensor_t xv = dt_var_value(x);
  DT_ASSERT_OK(dt_op_run("reshape", 1, &xv, 2, s2, 0, NULL, &x2));
  dt_tensor_t lin[3] = {x2, dt_var_value(w), dt_var_value(b)};
  DT_ASSERT_OK(dt_op_run("linear", 3, lin, 0, NULL, 0, NULL, &y2));
  dt_tensor_t ln[3] = {y2, dt_var_value(g), dt_var_value(beta)};
  const double eps = 1e-5;
  DT_ASSERT_OK(dt_op_run("layer_norm", 3, ln, 0, NULL, 1, &eps, &ref));
  float got[64], want[64];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(z), got, sizeof(float) * (size_t)(12 * g_n)));
  DT_ASSERT_OK(dt_tensor_gather_full(ref, want, sizeof(float) * (size_t)(12 * g_n)));
  for (int i = 0; i < 12 * g_n; i++) DT_ASSERT_TRUE(got[i] == want[i], "linear + layer_norm");
  DT_ASSERT_OK(dt_tape_backward(tape, l));
  dt_var_t ps[5] = {w, b, g, beta, x};
  for (int i = 0; i < 5; i++) DT_ASSERT_TRUE(dt_var_grad(ps[i]) != NULL, "gradient %d", i);
  dt_tensor_destroy(x2);
  dt_tensor_destroy(y2);
  dt_tensor_destroy(ref);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  for (int i = 0; i < 5; i++) DT_ASSERT_OK(dt_var_destroy(ps[i]));

  if (g_n == 4) {
    int s22[2] = {2, 2};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, s22, NULL, NULL, &m2));
    dt_var_t q[3];
    const int64_t qs[2] = {4, 6};
    const char* plan = "a=S(0),S(1);b=R,S(0);c=R";
    const char* names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
      DT_ASSERT_OK(dt_nn_param(m2, plan, names[i], 2, qs, DT_INIT_NORMAL, 1.0, 9, &q[i]));
    }
    /* gradients = the values (d/dq of sum(q^2)/2) */
    dt_tape_t t2;
    DT_ASSERT_OK(dt_tape_create(&t2));
    for (int i = 0; i < 3; i++) {
      dt_var_t pq, sq2[2] = {q[i], q[i]}, li, lh;
      DT_ASSERT_OK(dt_ag_op(t2, "mul", 2, sq2, 0, NULL, 0, NULL, 1, &pq));
      DT_ASSERT_OK(dt_ag_op(t2, "sum", 1, &pq, 1, all, 0, NULL, 1, &li));
      const double half = 0.5;
      DT_ASSERT_OK(dt_ag_op(t2, "mul_scalar", 1, &li, 0, NULL, 1, &half, 1, &lh));
      DT_ASSERT_OK(dt_tape_backward(t2, lh));
    }
    double want_sq = 0;
    for (int i = 0; i < 3; i++) {
      float v[24];
      DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(q[i]), v, sizeof v));
      for (int k = 0; k < 24; k++) want_sq += (double)v[k] * v[k];
    }
    DT_ASSERT_OK(dt_counters_reset(m2));
    double nrm;
    DT_ASSERT_OK(dt_clip_grad_norm(3, q, 0.0, &nrm));
    dt_counters_t cn;
    DT_ASSERT_OK(dt_counters_get(m2, &cn));
    DT_ASSERT_TRUE(fabs(nrm - sqrt(want_sq)) <= 1e-5 * sqrt(want_sq), "norm %g vs %g", nrm,
                   sqrt(want_sq));
    DT_ASSERT_EQ(cn.calls[DT_COLL_ALL_REDUCE], 1);
    DT_ASSERT_OK(dt_tape_destroy(t2));
    for (int i = 0; i < 3; i++) DT_ASSERT_OK(dt_var_destroy(q[i]));
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
}

/* the schedule: linear warmup, cosine to lr_min; the Markov corpus: its exact entropy floor
 * against the empirical conditional entropy of a long sample (counts of (context, next)) */
static void schedule_and_corpus(void) {
  DT_ASSERT_TRUE(fabs(dt_lr_schedule(0, 10, 100, 1.0, 0.1) - 0.1) < 1e-12, "warmup step 0");
  DT_ASSERT_TRUE(fabs(dt_lr_schedule(9, 10, 100, 1.0, 0.1) - 1.0) < 1e-12, "warmup end");
  DT_ASSERT_TRUE(fabs(dt_lr_schedule(55, 10, 100, 1.0, 0.1) - 0.55) < 1e-12, "cosine middle");
  DT_ASSERT_TRUE(fabs(dt_lr_schedule(100, 10, 100, 1.0, 0.1) - 0.1) < 1e-12, "cosine end");
  DT_ASSERT_TRUE(dt_lr_schedule(30, 10, 100, 1.0, 0.1) > dt_lr_schedule(31, 10, 100, 1.0, 0.1),
                 "decreasing");
  const int V = 8, n = 1 << 20;
  dt_corpus_t c;
  DT_ASSERT_OK(dt_corpus_markov(V, 2, n + 1, 11, &c));
  int64_t* tok = malloc(sizeof(int64_t) * (size_t)n);
  int64_t* tgt = malloc(sizeof(int64_t) * (size_t)n);
  DT_ASSERT_OK(dt_corpus_batch(c, 0, 0, 1, n - 1, tok, tgt)); /* one window: the whole corpus */
  static double cnt[8 * 8 * 8];
  memset(cnt, 0, sizeof cnt);
  for (int i = 1; i < n - 1; i++) cnt[(tok[i - 1] * V + tok[i]) * V + tgt[i]] += 1.0;
  double h = 0.0, total = n - 2;
  for (int x = 0; x < V * V; x++) {
    double row = 0.0;
    for (int v = 0; v < V; v++) row += cnt[x * V + v];
    for (int v = 0; v < V; v++)
      if (cnt[x * V + v] > 0) h -= cnt[x * V + v] / total * log(cnt[x * V + v] / row);
  }
  double floor = dt_corpus_entropy_floor(c);
  DT_ASSERT_TRUE(fabs(h - floor) < 0.01, "empirical conditional entropy %.4f vs floor %.4f", h,
                 floor);
  free(tok);
  free(tgt);
  DT_ASSERT_OK(dt_corpus_destroy(c));
  dt_corpus_t bad;
  DT_ASSERT_STATUS(dt_corpus_markov(1, 2, 100, 1, &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_corpus_file("/nonexistent/x", &bad), DT_ERR_IO);
}

static void errors(void) {
  int64_t s[2] = {4, 3};
  dt_placement_t rep = dt_replicate();
  dt_tensor_t xt;
  DT_ASSERT_OK(dt_tensor_ones(g_mesh, DT_F32, 2, s, &rep, &xt));
  dt_var_t x, y;
  DT_ASSERT_OK(dt_var_leaf(xt, 1, &x));
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_ag_op(tape, "exp", 1, &x, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_STATUS(dt_tape_backward(tape, y), DT_ERR_INVALID_ARG); /* not a scalar */
  DT_ASSERT_TRUE(strstr(dt_last_error(), "scalar") != NULL, "%s", dt_last_error());
  /* act_grad is itself a gradient op: no second-order rule */
  const int64_t kind[1] = {0};
  dt_var_t xx[2] = {x, x};
  DT_ASSERT_STATUS(dt_ag_op(tape, "act_grad", 2, xx, 1, kind, 0, NULL, 1, &y), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "act_grad has no backward rule") != NULL, "%s",
                 dt_last_error());
  dt_grad_set_enabled(0);
  DT_ASSERT_OK(dt_ag_op(tape, "act_grad", 2, xx, 1, kind, 0, NULL, 1, &y));
  dt_var_t l;
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, all, 0, NULL, 1, &l));
  dt_grad_set_enabled(1);
  DT_ASSERT_STATUS(dt_tape_backward(tape, l), DT_ERR_INVALID_USAGE); /* nothing needs a grad */
  DT_ASSERT_STATUS(dt_var_destroy(y), DT_ERR_INVALID_USAGE);         /* tape-owned */
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
}

static dt_status_t reset_from_hook(dt_tape_t tape, void* ctx) {
  (void)ctx;
  return dt_tape_reset(tape);
}
static dt_status_t backward_from_hook(dt_tape_t tape, void* ctx) {
  return dt_tape_backward(tape, (dt_var_t)ctx);
}
static dt_status_t destroy_from_hook(dt_tape_t tape, void* ctx) {
  (void)ctx;
  return dt_tape_destroy(tape);
}

/* sum(w) on `tape`, its loss in *l; w's gradient is then ones. */
static void record_sum(dt_tape_t tape, dt_var_t w, dt_var_t* l) {
  const int64_t all[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &w, 1, all, 0, NULL, 1, l));
}

static float grad0(dt_var_t w) {
  float g[3];
  DT_ASSERT_TRUE(dt_var_grad(w) != NULL, "no gradient");
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(w), g, sizeof g));
  return g[0];
}

static void tape_misuse(void) {
  const int64_t s[1] = {3};
  dt_placement_t rep = dt_replicate();
  dt_tensor_t wt;
  DT_ASSERT_OK(dt_tensor_ones(g_mesh, DT_F32, 1, s, &rep, &wt));
  dt_var_t w, la, lb;
  DT_ASSERT_OK(dt_var_leaf(wt, 1, &w));
  dt_tape_t a, b;
  DT_ASSERT_OK(dt_tape_create(&a));
  DT_ASSERT_OK(dt_tape_create(&b));
  /* another tape's loss */
  record_sum(b, w, &lb);
  DT_ASSERT_STATUS(dt_tape_backward(a, lb), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "another tape") != NULL, "%s", dt_last_error());
  DT_ASSERT_TRUE(dt_var_grad(w) == NULL, "a gradient from the refused pass");
  DT_ASSERT_OK(dt_tape_backward(b, lb));
  DT_ASSERT_TRUE(grad0(w) == 1.0f, "gradient %g after the refused pass (want 1)", grad0(w));
  DT_ASSERT_OK(dt_var_zero_grad(w));
  DT_ASSERT_OK(dt_tape_reset(b));
  /* hooks that reset, destroy or run the tape they are called from */
  const struct {
    dt_tape_hook_fn pre, post;
  } hooks[4] = {{reset_from_hook, NULL}, {NULL, reset_from_hook}, {backward_from_hook, NULL},
                {destroy_from_hook, NULL}};
  for (int k = 0; k < 4; k++) {
    record_sum(a, w, &la);
    int64_t n;
    DT_ASSERT_OK(dt_tape_stats(a, &n, NULL));
    DT_ASSERT_OK(dt_tape_add_span_hooks(a, 0, n, hooks[k].pre, hooks[k].post, la));
    DT_ASSERT_STATUS(dt_tape_backward(a, la), DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "backward pass is running") != NULL, "%s",
                   dt_last_error());
    DT_ASSERT_OK(dt_tape_reset(a)); /* the tape is whole, and usable after it */
    DT_ASSERT_OK(dt_var_zero_grad(w));
    record_sum(a, w, &la);
    DT_ASSERT_OK(dt_tape_backward(a, la));
    DT_ASSERT_TRUE(grad0(w) == 1.0f, "gradient %g after hook %d (want 1)", grad0(w), k);
    DT_ASSERT_OK(dt_var_zero_grad(w));
    DT_ASSERT_OK(dt_tape_reset(a));
  }
  DT_ASSERT_OK(dt_tape_destroy(a));
  DT_ASSERT_OK(dt_tape_destroy(b));
  DT_ASSERT_OK(dt_var_destroy(w));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_n));
  DT_ASSERT_OK(dt_mesh_create(1, &g_n, NULL, NULL, &g_mesh));
  dt_corpus_t corpus;
  DT_ASSERT_OK(dt_corpus_markov(16, 2, 4096, 3, &corpus));
  micro_batches(corpus);
  frozen_embedding(corpus);
  clipping(corpus);
  redistribute_grad();
  adamw_bf16();
  modules();
  schedule_and_corpus();
  errors();
  tape_misuse();
  DT_ASSERT_OK(dt_corpus_destroy(corpus));
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  if (g_rank == 0) printf("test_autograd: passed on %d ranks\n", g_n);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

/* modules.c - the model building blocks as functions over recorded ops: parameters placed by a
 * plan, linear (optional bias), embedding, RMSNorm, LayerNorm, causal grouped-query attention
 * with rotary embeddings, SwiGLU MLP and a top-k mixture of experts. Public API only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "dtensor/check.h"

/* '*' matches any run of characters. Two pointers with backtracking to the last star: when a
 * later star is reached, the earlier ones never need to move again, so the match takes
 * O(len(p) * len(s)) steps at worst (the recursive form was exponential in the number of stars). */
int dt_nn_name_match(const char* p, const char* s) {
  if (p == NULL || s == NULL) return 0;
  const char* star = NULL; /* the last '*' seen in p */
  const char* resume = s;  /* where in s that star's match ends so far */
  while (*s) {
    if (*p == '*') {
      star = p++;
      resume = s;
    } else if (*p != '\0' && *p == *s) {
      p++;
      s++;
    } else if (star != NULL) {
      p = star + 1;
      s = ++resume;
    } else {
      return 0;
    }
  }
  while (*p == '*') p++;
  return *p == '\0';
}

dt_status_t dt_nn_plan_lookup(const char* plan, const char* name, int mesh_ndim,
                              dt_placement_t* out) {
  DT_ARG_NOT_NULL(out);
  DT_ARG_NOT_NULL(name);
  if (mesh_ndim < 1 || mesh_ndim > DT_MAX_MESH_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mesh_ndim = %d out of range [1, %d]", mesh_ndim,
                   DT_MAX_MESH_DIMS);
  for (int i = 0; i < mesh_ndim; i++) out[i] = dt_replicate();
  if (plan == NULL) return DT_SUCCESS;
  const char* p = plan;
  while (*p) {
    size_t len = strcspn(p, ";");
    char entry[256];
    if (len >= sizeof entry)
      return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry '%.40s...' longer than %zu characters", p,
                     sizeof entry - 1);
    memcpy(entry, p, len);
    entry[len] = '\0';
    p += len + (p[len] == ';');
    if (len == 0) continue;
    char* eq = strchr(entry, '=');
    if (eq == NULL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry '%s' is not pattern=placements", entry);
    *eq = '\0';
    char* pat = entry;
    while (*pat == ' ') pat++;
    for (char* e = eq; e > pat && e[-1] == ' ';) *--e = '\0';
    if (!dt_nn_name_match(pat, name)) continue;
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    int n;
    dt_status_t st = dt_placements_parse(eq + 1, pl, mesh_ndim, &n);
    if (st != DT_SUCCESS)
      return DT_FAIL(st, "plan entry '%s=%s' for '%s': %s", pat, eq + 1, name, dt_last_error());
    if (n == 1) /* one placement: the same on every mesh dim */
      for (int i = 0; i < mesh_ndim; i++) out[i] = pl[0];
    else if (n == mesh_ndim)
      for (int i = 0; i < mesh_ndim; i++) out[i] = pl[i];
    else
      return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry for '%s' has %d placements, mesh has %d dims",
                     name, n, mesh_ndim);
    return DT_SUCCESS;
  }
  return DT_SUCCESS;
}

static uint64_t dt__name_seed(uint64_t seed, const char* name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (const unsigned char* p = (const unsigned char*)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

dt_status_t dt_nn_param(dt_mesh_t mesh, const char* plan, const char* name, int ndim,
                        const int64_t* shape, dt_nn_init_t init, double std, uint64_t seed,
                        dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(name);
  if (init != DT_INIT_NORMAL && init != DT_INIT_ZEROS && init != DT_INIT_ONES)
    return DT_FAIL(DT_ERR_INVALID_ARG, "param %s: init %d is not a dt_nn_init_t", name, (int)init);
  if (init == DT_INIT_NORMAL && !(isfinite(std) && std >= 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "param %s: std %g must be finite and >= 0", name, std);
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  DT_CHECK(dt_nn_plan_lookup(plan, name, mnd, pl));
  dt_tensor_t t;
  if (init == DT_INIT_ONES) {
    DT_CHECK(dt_tensor_ones(mesh, DT_F32, ndim, shape, pl, &t));
  } else if (init == DT_INIT_ZEROS) {
    DT_CHECK(dt_tensor_zeros(mesh, DT_F32, ndim, shape, pl, &t));
  } else {
    dt_tensor_t r;
    DT_CHECK(dt_tensor_randn(mesh, DT_F32, ndim, shape, pl, dt__name_seed(seed, name), &r));
    dt_status_t st = dt_op_run("mul_scalar", 1, &r, 0, NULL, 1, &std, &t);
    dt_tensor_destroy(r);
    DT_CHECK(st);
  }
  dt_status_t st = dt_var_leaf(t, 1, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(t);
  return st;
}

static dt_status_t ag(dt_tape_t tape, const char* op, int n, dt_var_t* in, int ni,
                      const int64_t* ia, int nf, const double* fa, dt_var_t* out) {
  return dt_ag_op(tape, op, n, in, ni, ia, nf, fa, 1, out);
}
static dt_status_t ag2(dt_tape_t tape, const char* op, dt_var_t a, dt_var_t b, dt_var_t* out) {
  dt_var_t in[2] = {a, b};
  return ag(tape, op, 2, in, 0, NULL, 0, NULL, out);
}
static dt_status_t shape_of(dt_var_t v, int* nd, int64_t* shape) {
  dt_tensor_t t = dt_var_value(v);
  if (t == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "variable has no value");
  DT_CHECK(dt_tensor_ndim(t, nd));
  return dt_tensor_shape(t, shape);
}

dt_status_t dt_nn_linear(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                         dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd, wnd;
  int64_t xs[DT_MAX_DIMS], ws[DT_MAX_DIMS];
  DT_CHECK(shape_of(x, &nd, xs));
  DT_CHECK(shape_of(weight, &wnd, ws));
  if (nd < 1 || wnd != 2 || xs[nd - 1] != ws[1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "linear: x (..., %lld) against weight (O, K) of K = %lld",
                   nd ? (long long)xs[nd - 1] : 0LL, (long long)ws[1]);
  int64_t rows = 1;
  for (int d = 0; d + 1 < nd; d++) rows *= xs[d];
  dt_var_t x2 = x, y2;
  if (nd != 2) {
    const int64_t s2[2] = {rows, xs[nd - 1]};
    DT_CHECK(ag(tape, "reshape", 1, &x, 2, s2, 0, NULL, &x2));
  }
  if (bias) {
    dt_var_t in[3] = {x2, weight, bias};
    DT_CHECK(ag(tape, "linear", 3, in, 0, NULL, 0, NULL, &y2));
  } else {
    DT_CHECK(ag2(tape, "linear_nobias", x2, weight, &y2));
  }
  if (nd == 2) {
    *out = y2;
    return DT_SUCCESS;
  }
  xs[nd - 1] = ws[0];
  return ag(tape, "reshape", 1, &y2, nd, xs, 0, NULL, out);
}

dt_status_t dt_nn_embedding(dt_tape_t tape, dt_var_t weight, dt_var_t ids, dt_var_t* out) {
  return ag2(tape, "embedding", weight, ids, out);
}

dt_status_t dt_nn_rms_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, double eps,
                           dt_var_t* out) {
  dt_var_t in[2] = {x, weight};
  return ag(tape, "rms_norm", 2, in, 0, NULL, 1, &eps, out);
}

dt_status_t dt_nn_layer_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                             double eps, dt_var_t* out) {
  dt_var_t in[3] = {x, weight, bias};
  return ag(tape, "layer_norm", 3, in, 0, NULL, 1, &eps, out);
}

/* x (..., D) as rows (N, D): one reshape (a copy) instead of one per projection */
static dt_status_t as_rows(dt_tape_t tape, dt_var_t x, dt_var_t* rows, int* nd, int64_t* xs) {
  DT_CHECK(shape_of(x, nd, xs));
  if (*nd == 2) {
    *rows = x;
    return DT_SUCCESS;
  }
  int64_t n = 1;
  for (int d = 0; d + 1 < *nd; d++) n *= xs[d];
  const int64_t s2[2] = {n, xs[*nd - 1]};
  return ag(tape, "reshape", 1, &x, 2, s2, 0, NULL, rows);
}

dt_status_t dt_nn_attention_core(dt_tape_t tape, dt_var_t q, dt_var_t k, dt_var_t v, int H,
                                 int G, double rope_theta, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd, knd, vnd;
  int64_t qs[DT_MAX_DIMS], ks[DT_MAX_DIMS], vs[DT_MAX_DIMS];
  DT_CHECK(shape_of(q, &nd, qs));
  DT_CHECK(shape_of(k, &knd, ks));
  DT_CHECK(shape_of(v, &vnd, vs));
  if (nd != 3 || H <= 0 || G <= 0 || H % G != 0 || qs[2] % H != 0 || knd != 3 || vnd != 3 ||
      ks[0] != qs[0] || ks[1] != qs[1] || ks[2] != qs[2] / H * G ||
      memcmp(ks, vs, sizeof(int64_t) * 3) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "attention: q (B, S, %d*Dh) and k, v (B, S, %d*Dh), heads "
                                       "a multiple of kv heads", H, G);
  int64_t B = qs[0], S = qs[1], Dh = qs[2] / H;
  const int64_t attn_args[2] = {1, 1}, ra[1] = {1}; /* causal; (B, S, heads, Dh) layout */
  dt_var_t in[3] = {q, k, v}, qkv[3];
  int heads[3] = {H, G, G};
  for (int j = 0; j < 3; j++) {
    dt_var_t p4;
    const int64_t s4[4] = {B, S, heads[j], Dh};
    DT_CHECK(ag(tape, "reshape", 1, &in[j], 4, s4, 0, NULL, &p4));
    if (j < 2) DT_CHECK(ag(tape, "rotary", 1, &p4, 1, ra, 1, &rope_theta, &qkv[j]));
    else qkv[j] = p4;
  }
  /* attention straight on (B, S, heads, Dh): strided BLAS rows, no transposed copies */
  dt_var_t o;
  DT_CHECK(ag(tape, "sdpa", 3, qkv, 2, attn_args, 0, NULL, &o));
  const int64_t s3[3] = {B, S, (int64_t)H * Dh};
  return ag(tape, "reshape", 1, &o, 3, s3, 0, NULL, out);
}

dt_status_t dt_nn_attention(dt_tape_t tape, dt_var_t x, dt_var_t wq, dt_var_t wk, dt_var_t wv,
                            dt_var_t wo, int H, int G, double rope_theta, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd;
  int64_t xs[DT_MAX_DIMS];
  DT_CHECK(shape_of(x, &nd, xs));
  if (nd != 3 || H <= 0 || G <= 0 || H % G != 0 || xs[2] % H != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "attention: x (B, S, D) with D a multiple of %d heads, "
                                       "heads a multiple of %d kv heads", H, G);
  dt_var_t qkv[3], ws[3] = {wq, wk, wv}, o;
  for (int j = 0; j < 3; j++) DT_CHECK(dt_nn_linear(tape, x, ws[j], NULL, &qkv[j]));
  DT_CHECK(dt_nn_attention_core(tape, qkv[0], qkv[1], qkv[2], H, G, rope_theta, &o));
  return dt_nn_linear(tape, o, wo, NULL, out);
}

dt_status_t dt_nn_swiglu(dt_tape_t tape, dt_var_t x, dt_var_t w1, dt_var_t w3, dt_var_t w2,
                         dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd;
  int64_t xs[DT_MAX_DIMS];
  dt_var_t x2, a, b, s, p, y;
  DT_CHECK(as_rows(tape, x, &x2, &nd, xs));
  DT_CHECK(ag2(tape, "linear_nobias", x2, w1, &a));
  DT_CHECK(ag2(tape, "linear_nobias", x2, w3, &b));
  DT_CHECK(ag(tape, "silu", 1, &a, 0, NULL, 0, NULL, &s));
  DT_CHECK(ag2(tape, "mul", s, b, &p));
  DT_CHECK(ag2(tape, "linear_nobias", p, w2, &y));
  if (nd == 2) {
    *out = y;
    return DT_SUCCESS;
  }
  return ag(tape, "reshape", 1, &y, nd, xs, 0, NULL, out);
}

dt_status_t dt_nn_moe(dt_tape_t tape, dt_var_t x, dt_var_t router, int E, const dt_var_t* w1,
                      const dt_var_t* w3, const dt_var_t* w2, int top_k, double aux_coef,
                      dt_var_t* out, dt_var_t* aux) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (aux) *aux = NULL;
  int nd;
  int64_t xs[DT_MAX_DIMS];
  DT_CHECK(shape_of(x, &nd, xs));
  if (nd != 2 || E < 1 || top_k < 1 || top_k > E || !w1 || !w2 || !w3)
    return DT_FAIL(DT_ERR_INVALID_ARG, "moe: x (N, D), 1 <= top_k <= experts, expert weights");
  int64_t N = xs[0];
  dt_var_t logits, probs, tk[2], gates;
  DT_CHECK(ag2(tape, "linear_nobias", x, router, &logits));
  const int64_t last[1] = {-1};
  DT_CHECK(ag(tape, "softmax", 1, &logits, 1, last, 0, NULL, &probs));
  const int64_t ka[2] = {top_k, 1};
  DT_CHECK(dt_ag_op(tape, "topk", 1, &probs, 2, ka, 0, NULL, 2, tk));
  dt_mesh_t mesh;
  DT_CHECK(dt_tensor_mesh(dt_var_value(x), &mesh));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const int64_t ne[2] = {N, E}, nk[2] = {N, top_k};
  dt_tensor_t z;
  DT_CHECK(dt_tensor_zeros(mesh, DT_F32, 2, ne, rep, &z));
  dt_var_t zv;
  DT_CHECK(dt_tape_constant(tape, z, &zv));
  const int64_t one[1] = {1};
  dt_var_t sin[3] = {zv, tk[1], tk[0]};
  DT_CHECK(ag(tape, "scatter_add", 3, sin, 1, one, 0, NULL, &gates)); /* dense (N, E) gates */
  dt_var_t acc = NULL;
  for (int e = 0; e < E; e++) {
    dt_var_t y, ge, w, s;
    DT_CHECK(dt_nn_swiglu(tape, x, w1[e], w3[e], w2[e], &y));
    const int64_t na[3] = {1, e, 1};
    DT_CHECK(ag(tape, "narrow", 1, &gates, 3, na, 0, NULL, &ge));
    DT_CHECK(ag2(tape, "mul", y, ge, &w));
    if (acc == NULL) {
      acc = w;
    } else {
      DT_CHECK(ag2(tape, "add", acc, w, &s));
      acc = s;
    }
  }
  *out = acc;
  if (aux == NULL) return DT_SUCCESS;
  /* f_e: routed fraction (no gradient); P_e: mean router probability */
  int prev = dt_grad_enabled();
  dt_grad_set_enabled(0);
  dt_tensor_t ones, z2;
  dt_var_t onesv, z2v, cnt, frac, fr;
  dt_status_t st = dt_tensor_full_value(mesh, DT_F32, 2, nk, rep, 1.0, &ones);
  if (st == DT_SUCCESS) st = dt_tape_constant(tape, ones, &onesv);
  if (st == DT_SUCCESS) st = dt_tensor_zeros(mesh, DT_F32, 2, ne, rep, &z2);
  if (st == DT_SUCCESS) st = dt_tape_constant(tape, z2, &z2v);
  const int64_t m0[2] = {0, 0};
  if (st == DT_SUCCESS) {
    dt_var_t cin[3] = {z2v, tk[1], onesv};
    st = ag(tape, "scatter_add", 3, cin, 1, one, 0, NULL, &cnt);
  }
  if (st == DT_SUCCESS) st = ag(tape, "mean", 1, &cnt, 2, m0, 0, NULL, &frac);
  double inv_k = 1.0 / top_k;
  if (st == DT_SUCCESS) st = ag(tape, "mul_scalar", 1, &frac, 0, NULL, 1, &inv_k, &fr);
  dt_grad_set_enabled(prev);
  DT_CHECK(st);
  dt_var_t pm, prod, sum;
  DT_CHECK(ag(tape, "mean", 1, &probs, 2, m0, 0, NULL, &pm));
  DT_CHECK(ag2(tape, "mul", fr, pm, &prod));
  const int64_t all[1] = {0};
  DT_CHECK(ag(tape, "sum", 1, &prod, 1, all, 0, NULL, &sum));
  double coef = aux_coef * E;
  return ag(tape, "mul_scalar", 1, &sum, 0, NULL, 1, &coef, aux);
}

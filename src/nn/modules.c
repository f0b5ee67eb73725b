/* modules.c - the model building blocks as functions over recorded ops: parameters placed by a
 * plan, linear (optional bias), embedding, RMSNorm, LayerNorm, causal grouped-query attention
 * with rotary embeddings, SwiGLU MLP and a top-k mixture of experts (routed through grouped GEMMs,
 * and the dense reference that runs every expert). Public API only. */
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

/* ---------------------------------------------------------------------------------------------
 * mixture of experts */

/* Checks x (N, D), router (E, D), w1 and w3 (E, F, D), w2 (E, D, F), 1 <= top_k <= E. */
static dt_status_t dt__moe_check(const char* what, dt_var_t x, dt_var_t router, dt_var_t w1,
                                 dt_var_t w3, dt_var_t w2, int top_k, int64_t* N, int64_t* D,
                                 int64_t* E, int64_t* F) {
  int nd[5];
  int64_t s[5][DT_MAX_DIMS];
  dt_var_t v[5] = {x, router, w1, w3, w2};
  static const char* const kNames[5] = {"x", "router", "w1", "w3", "w2"};
  for (int i = 0; i < 5; i++) {
    if (v[i] == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s is NULL", what, kNames[i]);
    DT_CHECK(shape_of(v[i], &nd[i], s[i]));
  }
  if (nd[0] != 2 || nd[1] != 2 || nd[2] != 3 || nd[3] != 3 || nd[4] != 3)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: x (N, D), router (E, D), w1 and w3 (E, F, D), w2 "
                   "(E, D, F); got %d, %d, %d, %d and %d dims", what, nd[0], nd[1], nd[2], nd[3],
                   nd[4]);
  *N = s[0][0];
  *D = s[0][1];
  *E = s[1][0];
  *F = s[2][1];
  if (s[1][1] != *D || s[2][0] != *E || s[2][2] != *D || s[3][0] != *E || s[3][1] != *F ||
      s[3][2] != *D || s[4][0] != *E || s[4][1] != *D || s[4][2] != *F)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: with x (%lld, %lld) and router (%lld, %lld), w1 and "
                   "w3 must be (E, F, D) = (%lld, %lld, %lld) and w2 (E, D, F) = (%lld, %lld, "
                   "%lld); got w1 (%lld, %lld, %lld), w3 (%lld, %lld, %lld), w2 (%lld, %lld, "
                   "%lld)", what, (long long)*N, (long long)*D, (long long)s[1][0],
                   (long long)s[1][1], (long long)*E, (long long)*F, (long long)*D, (long long)*E,
                   (long long)*D, (long long)*F, (long long)s[2][0], (long long)s[2][1],
                   (long long)s[2][2], (long long)s[3][0], (long long)s[3][1], (long long)s[3][2],
                   (long long)s[4][0], (long long)s[4][1], (long long)s[4][2]);
  if (top_k < 1 || top_k > *E)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: top_k %d out of range [1, %lld experts]", what, top_k,
                   (long long)*E);
  return DT_SUCCESS;
}

/* The router: probs (N, E) = softmax(x router^T), topk -> gate values tk[0] and experts tk[1]
 * (N, K). */
static dt_status_t dt__moe_router(dt_tape_t tape, dt_var_t x, dt_var_t router, int top_k,
                                  dt_var_t* probs, dt_var_t* tk) {
  dt_var_t logits;
  DT_CHECK(ag2(tape, "linear_nobias", x, router, &logits));
  const int64_t last[1] = {-1};
  DT_CHECK(ag(tape, "softmax", 1, &logits, 1, last, 0, NULL, probs));
  const int64_t ka[2] = {top_k, 1};
  return dt_ag_op(tape, "topk", 1, probs, 2, ka, 0, NULL, 2, tk);
}

/* A tape constant of zeros (replicated) of x's mesh. */
static dt_status_t dt__moe_zeros(dt_tape_t tape, dt_var_t x, int nd, const int64_t* shape,
                                 dt_var_t* out) {
  dt_mesh_t mesh;
  DT_CHECK(dt_tensor_mesh(dt_var_value(x), &mesh));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  dt_tensor_t z;
  DT_CHECK(dt_tensor_zeros(mesh, DT_F32, nd, shape, rep, &z));
  dt_status_t st = dt_tape_constant(tape, z, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(z);
  return st;
}

/* Load-balancing loss: aux_coef * E * sum_e f_e P_e, f_e the fraction of the routing choices that
 * went to e (no gradient), P_e the mean router probability. */
static dt_status_t dt__moe_aux(dt_tape_t tape, dt_var_t x, dt_var_t probs, dt_var_t idx,
                               int64_t N, int64_t E, int top_k, double aux_coef, dt_var_t* aux) {
  int prev = dt_grad_enabled();
  dt_grad_set_enabled(0);
  dt_mesh_t mesh;
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const int64_t ne[2] = {N, E}, nk[2] = {N, top_k}, one[1] = {1}, m0[2] = {0, 0};
  dt_tensor_t ones;
  dt_var_t onesv, z2v, cnt, frac, fr;
  dt_status_t st = dt_tensor_mesh(dt_var_value(x), &mesh);
  if (st == DT_SUCCESS) st = dt_tensor_full_value(mesh, DT_F32, 2, nk, rep, 1.0, &ones);
  if (st == DT_SUCCESS) {
    st = dt_tape_constant(tape, ones, &onesv);
    if (st != DT_SUCCESS) dt_tensor_destroy(ones);
  }
  if (st == DT_SUCCESS) st = dt__moe_zeros(tape, x, 2, ne, &z2v);
  if (st == DT_SUCCESS) {
    dt_var_t cin[3] = {z2v, idx, onesv};
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
  double coef = aux_coef * (double)E;
  return ag(tape, "mul_scalar", 1, &sum, 0, NULL, 1, &coef, aux);
}

dt_status_t dt_nn_moe(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1, dt_var_t w3,
                      dt_var_t w2, int top_k, double capacity_factor, double aux_coef,
                      dt_var_t* out, dt_var_t* aux, dt_moe_stats_t* stats) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (aux) *aux = NULL;
  if (stats) memset(stats, 0, sizeof *stats);
  int64_t N, D, E, F;
  DT_CHECK(dt__moe_check("moe", x, router, w1, w3, w2, top_k, &N, &D, &E, &F));
  if (!(capacity_factor >= 0.0 && isfinite(capacity_factor)))
    return DT_FAIL(DT_ERR_INVALID_ARG, "moe: capacity_factor %g must be finite and >= 0 (0: "
                   "dropless)", capacity_factor);
  const int64_t S = N * top_k; /* routing choices (token, expert) */
  int64_t capacity = 0;
  if (capacity_factor > 0.0) {
    capacity = (int64_t)ceil(capacity_factor * (double)S / (double)E);
    if (capacity < 1) capacity = 1;
  }
  dt_var_t probs, tk[2];
  DT_CHECK(dt__moe_router(tape, x, router, top_k, &probs, tk));
  /* the routing: slots sorted by expert (integers, no gradient) */
  dt_var_t rt[3];
  const int64_t ra[2] = {E, capacity};
  int prev = dt_grad_enabled();
  dt_grad_set_enabled(0);
  dt_status_t st = dt_ag_op(tape, "moe_route", 1, &tk[1], 2, ra, 0, NULL, 3, rt);
  dt_grad_set_enabled(prev);
  DT_CHECK(st);
  dt_var_t order = rt[0], tok = rt[1], counts = rt[2];
  int64_t T = S;
  if (capacity > 0) { /* the kept slots' count sets the sorted rows' shape: read it */
    int64_t* c = malloc(sizeof(int64_t) * (size_t)E);
    if (c == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: %lld counts", (long long)E);
    st = dt_tensor_full(dt_var_value(counts), c, sizeof(int64_t) * (size_t)E);
    T = 0;
    for (int64_t e = 0; e < E; e++) T += c[e];
    free(c);
    DT_CHECK(st);
    if (T < S) {
      const int64_t na[3] = {0, 0, T};
      dt_grad_set_enabled(0);
      st = ag(tape, "narrow", 1, &order, 3, na, 0, NULL, &order);
      if (st == DT_SUCCESS) st = ag(tape, "narrow", 1, &tok, 3, na, 0, NULL, &tok);
      dt_grad_set_enabled(prev);
      DT_CHECK(st);
    }
  }
  if (stats) {
    stats->tokens = N;
    stats->assignments = S;
    stats->dropped = S - T;
    stats->capacity = capacity;
    stats->expert_rows = T;
  }
  /* tokens (T, D) sorted by expert -> SwiGLU through grouped GEMMs -> weighted by their gates ->
   * added back at their tokens */
  dt_var_t xs, a, b, sa, h, y, gflat, g, g2, yw, zero;
  DT_CHECK(ag2(tape, "embedding", x, tok, &xs));
  dt_var_t in1[3] = {xs, w1, counts}, in3[3] = {xs, w3, counts};
  DT_CHECK(ag(tape, "grouped_mm", 3, in1, 0, NULL, 0, NULL, &a));
  DT_CHECK(ag(tape, "grouped_mm", 3, in3, 0, NULL, 0, NULL, &b));
  DT_CHECK(ag(tape, "silu", 1, &a, 0, NULL, 0, NULL, &sa));
  DT_CHECK(ag2(tape, "mul", sa, b, &h));
  dt_var_t in2[3] = {h, w2, counts};
  DT_CHECK(ag(tape, "grouped_mm", 3, in2, 0, NULL, 0, NULL, &y));
  const int64_t flat[1] = {S}, col[2] = {T, 1}, d0[1] = {0}, nd_[2] = {N, D};
  DT_CHECK(ag(tape, "reshape", 1, &tk[0], 1, flat, 0, NULL, &gflat));
  dt_var_t gin[2] = {gflat, order};
  DT_CHECK(ag(tape, "gather", 2, gin, 1, d0, 0, NULL, &g)); /* each sorted row's gate */
  DT_CHECK(ag(tape, "reshape", 1, &g, 2, col, 0, NULL, &g2));
  DT_CHECK(ag2(tape, "mul", y, g2, &yw));
  DT_CHECK(dt__moe_zeros(tape, x, 2, nd_, &zero));
  dt_var_t cin[3] = {zero, tok, yw};
  DT_CHECK(ag(tape, "index_add", 3, cin, 0, NULL, 0, NULL, out));
  if (aux == NULL) return DT_SUCCESS;
  return dt__moe_aux(tape, x, probs, tk[1], N, E, top_k, aux_coef, aux);
}

dt_status_t dt_nn_moe_dense(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1,
                            dt_var_t w3, dt_var_t w2, int top_k, double aux_coef, dt_var_t* out,
                            dt_var_t* aux) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (aux) *aux = NULL;
  int64_t N, D, E, F;
  DT_CHECK(dt__moe_check("moe_dense", x, router, w1, w3, w2, top_k, &N, &D, &E, &F));
  dt_var_t probs, tk[2], gates, zv;
  DT_CHECK(dt__moe_router(tape, x, router, top_k, &probs, tk));
  const int64_t ne[2] = {N, E}, one[1] = {1};
  DT_CHECK(dt__moe_zeros(tape, x, 2, ne, &zv));
  dt_var_t sin[3] = {zv, tk[1], tk[0]};
  DT_CHECK(ag(tape, "scatter_add", 3, sin, 1, one, 0, NULL, &gates)); /* dense (N, E) gates */
  dt_var_t acc = NULL;
  dt_var_t ws[3] = {w1, w3, w2};
  const int64_t sfd[2] = {F, D}, sdf[2] = {D, F};
  for (int64_t e = 0; e < E; e++) {
    dt_var_t we[3], y, ge, wy, s;
    for (int k = 0; k < 3; k++) { /* expert e's matrix of the stacked weights */
      dt_var_t sl;
      const int64_t na[3] = {0, e, 1};
      DT_CHECK(ag(tape, "narrow", 1, &ws[k], 3, na, 0, NULL, &sl));
      DT_CHECK(ag(tape, "reshape", 1, &sl, 2, k < 2 ? sfd : sdf, 0, NULL, &we[k]));
    }
    DT_CHECK(dt_nn_swiglu(tape, x, we[0], we[1], we[2], &y));
    const int64_t na[3] = {1, e, 1};
    DT_CHECK(ag(tape, "narrow", 1, &gates, 3, na, 0, NULL, &ge));
    DT_CHECK(ag2(tape, "mul", y, ge, &wy));
    if (acc == NULL) {
      acc = wy;
    } else {
      DT_CHECK(ag2(tape, "add", acc, wy, &s));
      acc = s;
    }
  }
  *out = acc;
  if (aux == NULL) return DT_SUCCESS;
  return dt__moe_aux(tape, x, probs, tk[1], N, E, top_k, aux_coef, aux);
}

/* modules.c - the model building blocks as functions over recorded ops: parameters placed by a
 * plan, linear (optional bias), embedding, RMSNorm, LayerNorm, causal grouped-query attention
 * with rotary embeddings, SwiGLU MLP and a top-k mixture of experts (routed through grouped GEMMs,
 * expert-parallel over rank-local tensors and ragged all-to-alls when the experts are Shard(0),
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

static dt_status_t dt__nn_plan_lookup(const char* plan, const char* name, int mesh_ndim,
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

dt_status_t dt_nn_plan_lookup(const char* plan, const char* name, int mesh_ndim,
                              dt_placement_t* out) {
  DT_ENTRY_RETURN(dt__nn_plan_lookup(plan, name, mesh_ndim, out));
}

static uint64_t dt__name_seed(uint64_t seed, const char* name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (const unsigned char* p = (const unsigned char*)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

/* The initial values of parameter `name` at placements pl (each rank computes its own shard). */
static dt_status_t dt__nn_init_tensor(dt_mesh_t mesh, const char* name, int ndim,
                                      const int64_t* shape, const dt_placement_t* pl,
                                      dt_nn_init_t init, double std, uint64_t seed,
                                      dt_tensor_t* t) {
  if (init != DT_INIT_NORMAL && init != DT_INIT_ZEROS && init != DT_INIT_ONES)
    return DT_FAIL(DT_ERR_INVALID_ARG, "param %s: init %d is not a dt_nn_init_t", name, (int)init);
  if (init == DT_INIT_NORMAL && !(isfinite(std) && std >= 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "param %s: std %g must be finite and >= 0", name, std);
  if (init == DT_INIT_ONES) return dt_tensor_ones(mesh, DT_F32, ndim, shape, pl, t);
  if (init == DT_INIT_ZEROS) return dt_tensor_zeros(mesh, DT_F32, ndim, shape, pl, t);
  dt_tensor_t r;
  DT_CHECK(dt_tensor_randn(mesh, DT_F32, ndim, shape, pl, dt__name_seed(seed, name), &r));
  dt_status_t st = dt_op_run("mul_scalar", 1, &r, 0, NULL, 1, &std, t);
  dt_tensor_destroy(r);
  return st;
}

static dt_status_t dt__nn_param(dt_mesh_t mesh, const char* plan, const char* name, int ndim,
                                const int64_t* shape, dt_nn_init_t init, double std, uint64_t seed,
                                dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(name);
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  DT_CHECK(dt_nn_plan_lookup(plan, name, mnd, pl));
  dt_tensor_t t;
  DT_CHECK(dt__nn_init_tensor(mesh, name, ndim, shape, pl, init, std, seed, &t));
  dt_status_t st = dt_var_leaf(t, 1, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(t);
  return st;
}

dt_status_t dt_nn_param(dt_mesh_t mesh, const char* plan, const char* name, int ndim,
                        const int64_t* shape, dt_nn_init_t init, double std, uint64_t seed,
                        dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_param(mesh, plan, name, ndim, shape, init, std, seed, out));
}

static dt_status_t dt__nn_param_init(dt_var_t p, const char* name, dt_nn_init_t init, double std,
                                     uint64_t seed) {
  DT_ARG_NOT_NULL(p);
  DT_ARG_NOT_NULL(name);
  dt_tensor_t cur = dt_var_value(p);
  if (cur == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "param %s: not a live variable", name);
  dt_mesh_t mesh;
  int nd, meta;
  int64_t shape[DT_MAX_DIMS];
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  dt_dtype_t dt;
  DT_CHECK(dt_tensor_mesh(cur, &mesh));
  DT_CHECK(dt_tensor_ndim(cur, &nd));
  DT_CHECK(dt_tensor_shape(cur, shape));
  DT_CHECK(dt_tensor_placements(cur, pl));
  DT_CHECK(dt_tensor_dtype(cur, &dt));
  DT_CHECK(dt_tensor_is_meta(cur, &meta));
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  for (int i = 0; i < mnd; i++)
    if (pl[i].kind == DT_PARTIAL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "param %s: Partial on mesh dim %d (a parameter is "
                     "Replicate or Shard)", name, i);
  dt_tensor_t t, c = NULL;
  DT_CHECK(dt__nn_init_tensor(mesh, name, nd, shape, pl, init, std, seed, &t));
  dt_status_t st = DT_SUCCESS;
  if (dt != DT_F32) { /* a parameter kept in another float dtype */
    const int64_t to = dt;
    st = dt_op_run("cast", 1, &t, 1, &to, 0, NULL, &c);
    dt_tensor_destroy(t);
    t = c;
  }
  if (st != DT_SUCCESS) return st;
  if (meta) { /* built without data: the initialized tensor becomes its value */
    st = dt_var_set_value(p, t);
    if (st != DT_SUCCESS) dt_tensor_destroy(t);
    return st;
  }
  st = dt_tensor_redistribute_into(t, cur); /* same placements: this rank's shard, copied */
  dt_tensor_destroy(t);
  return st;
}

dt_status_t dt_nn_param_init(dt_var_t p, const char* name, dt_nn_init_t init, double std,
                             uint64_t seed) {
  DT_ENTRY_RETURN(dt__nn_param_init(p, name, init, std, seed));
}

static dt_status_t ag(dt_tape_t tape, const char* op, int n, dt_var_t* in, int ni,
                      const int64_t* ia, int nf, const double* fa, dt_var_t* out) {
  return dt_ag_op(tape, op, n, in, ni, ia, nf, fa, 1, out);
}
static dt_status_t ag2(dt_tape_t tape, const char* op, dt_var_t a, dt_var_t b, dt_var_t* out) {
  dt_var_t in[2] = {a, b};
  return ag(tape, op, 2, in, 0, NULL, 0, NULL, out);
}
static dt_status_t shape_of(const char* what, dt_var_t v, int* nd, int64_t* shape) {
  dt_tensor_t t = dt_var_value(v);
  if (t == NULL) {
    int rg;
    dt_status_t st = dt_var_requires_grad(v, &rg); /* records why v is not a variable */
    if (st != DT_SUCCESS) return DT_FAIL(st, "%s: %s", what, dt_last_error());
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s has no value (valid: a variable holding a tensor)",
                   what);
  }
  DT_CHECK(dt_tensor_ndim(t, nd));
  return dt_tensor_shape(t, shape);
}

static dt_status_t dt__nn_linear(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                                 dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd, wnd;
  int64_t xs[DT_MAX_DIMS], ws[DT_MAX_DIMS];
  DT_CHECK(shape_of("x", x, &nd, xs));
  DT_CHECK(shape_of("weight", weight, &wnd, ws));
  if (wnd != 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "weight has %d dims (valid: 2, (out_features, "
                   "in_features))", wnd);
  if (nd < 1 || xs[nd - 1] != ws[1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "x (..., %lld) against weight (%lld, %lld) (valid: x's "
                   "last dim = weight's in_features %lld)", nd ? (long long)xs[nd - 1] : 0LL,
                   (long long)ws[0], (long long)ws[1], (long long)ws[1]);
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

dt_status_t dt_nn_linear(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                         dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_linear(tape, x, weight, bias, out));
}

static dt_status_t dt__nn_embedding(dt_tape_t tape, dt_var_t weight, dt_var_t ids, dt_var_t* out) {
  return ag2(tape, "embedding", weight, ids, out);
}

dt_status_t dt_nn_embedding(dt_tape_t tape, dt_var_t weight, dt_var_t ids, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_embedding(tape, weight, ids, out));
}

static dt_status_t dt__nn_rms_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, double eps,
                                   dt_var_t* out) {
  dt_var_t in[2] = {x, weight};
  return ag(tape, "rms_norm", 2, in, 0, NULL, 1, &eps, out);
}

dt_status_t dt_nn_rms_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, double eps, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_rms_norm(tape, x, weight, eps, out));
}

static dt_status_t dt__nn_layer_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias,
                                     double eps, dt_var_t* out) {
  dt_var_t in[3] = {x, weight, bias};
  return ag(tape, "layer_norm", 3, in, 0, NULL, 1, &eps, out);
}

dt_status_t dt_nn_layer_norm(dt_tape_t tape, dt_var_t x, dt_var_t weight, dt_var_t bias, double eps,
                             dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_layer_norm(tape, x, weight, bias, eps, out));
}

/* x (..., D) as rows (N, D): one reshape (a copy) instead of one per projection */
static dt_status_t as_rows(dt_tape_t tape, dt_var_t x, dt_var_t* rows, int* nd, int64_t* xs) {
  DT_CHECK(shape_of("x", x, nd, xs));
  if (*nd == 2) {
    *rows = x;
    return DT_SUCCESS;
  }
  int64_t n = 1;
  for (int d = 0; d + 1 < *nd; d++) n *= xs[d];
  const int64_t s2[2] = {n, xs[*nd - 1]};
  return ag(tape, "reshape", 1, &x, 2, s2, 0, NULL, rows);
}

static dt_status_t dt__nn_attention_core(dt_tape_t tape, dt_var_t q, dt_var_t k, dt_var_t v, int H,
                                         int G, double rope_theta, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd, knd, vnd;
  int64_t qs[DT_MAX_DIMS], ks[DT_MAX_DIMS], vs[DT_MAX_DIMS];
  DT_CHECK(shape_of("q", q, &nd, qs));
  DT_CHECK(shape_of("k", k, &knd, ks));
  DT_CHECK(shape_of("v", v, &vnd, vs));
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

dt_status_t dt_nn_attention_core(dt_tape_t tape, dt_var_t q, dt_var_t k, dt_var_t v, int H, int G,
                                 double rope_theta, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_attention_core(tape, q, k, v, H, G, rope_theta, out));
}

static dt_status_t dt__nn_attention(dt_tape_t tape, dt_var_t x, dt_var_t wq, dt_var_t wk,
                                    dt_var_t wv, dt_var_t wo, int H, int G, double rope_theta,
                                    dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  int nd;
  int64_t xs[DT_MAX_DIMS];
  DT_CHECK(shape_of("x", x, &nd, xs));
  if (nd != 3 || H <= 0 || G <= 0 || H % G != 0 || xs[2] % H != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "attention: x (B, S, D) with D a multiple of %d heads, "
                                       "heads a multiple of %d kv heads", H, G);
  dt_var_t qkv[3], ws[3] = {wq, wk, wv}, o;
  for (int j = 0; j < 3; j++) DT_CHECK(dt_nn_linear(tape, x, ws[j], NULL, &qkv[j]));
  DT_CHECK(dt_nn_attention_core(tape, qkv[0], qkv[1], qkv[2], H, G, rope_theta, &o));
  return dt_nn_linear(tape, o, wo, NULL, out);
}

dt_status_t dt_nn_attention(dt_tape_t tape, dt_var_t x, dt_var_t wq, dt_var_t wk, dt_var_t wv,
                            dt_var_t wo, int H, int G, double rope_theta, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_attention(tape, x, wq, wk, wv, wo, H, G, rope_theta, out));
}

static dt_status_t dt__nn_swiglu(dt_tape_t tape, dt_var_t x, dt_var_t w1, dt_var_t w3, dt_var_t w2,
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

dt_status_t dt_nn_swiglu(dt_tape_t tape, dt_var_t x, dt_var_t w1, dt_var_t w3, dt_var_t w2,
                         dt_var_t* out) {
  DT_ENTRY_RETURN(dt__nn_swiglu(tape, x, w1, w3, w2, out));
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
    DT_CHECK(shape_of(kNames[i], v[i], &nd[i], s[i]));
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

/* A tape constant of zeros (replicated, of dtype dt) of x's mesh. */
static dt_status_t dt__moe_zeros(dt_tape_t tape, dt_var_t x, dt_dtype_t dt, int nd,
                                 const int64_t* shape, dt_var_t* out) {
  dt_mesh_t mesh;
  DT_CHECK(dt_tensor_mesh(dt_var_value(x), &mesh));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  dt_tensor_t z;
  DT_CHECK(dt_tensor_zeros(mesh, dt, nd, shape, rep, &z));
  dt_status_t st = dt_tape_constant(tape, z, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(z);
  return st;
}

/* *v cast to like's dtype (defined below). */
static dt_status_t dt__moe_to_dtype(dt_tape_t tape, dt_var_t like, dt_var_t* v);

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
  if (st == DT_SUCCESS) st = dt__moe_zeros(tape, x, DT_F32, 2, ne, &z2v);
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
  DT_CHECK(dt__moe_to_dtype(tape, fr, &pm)); /* the loss in f32 (bf16 probabilities under mixed
                                              * precision) */
  DT_CHECK(ag2(tape, "mul", fr, pm, &prod));
  const int64_t all[1] = {0};
  DT_CHECK(ag(tape, "sum", 1, &prod, 1, all, 0, NULL, &sum));
  double coef = aux_coef * (double)E;
  return ag(tape, "mul_scalar", 1, &sum, 0, NULL, 1, &coef, aux);
}

/* Expert parallelism: the mesh dim `dim` (n ranks, this rank `me`) on which the experts are
 * Shard(0); coordinate j holds experts [lo[j], hi[j]) (the chunk rule). */
typedef struct dt__ep {
  int dim, n, me;
  int64_t* lo; /* n + 1 entries: lo[j] .. lo[j + 1] are coordinate j's experts */
} dt__ep_t;

/* A rank-local i64 constant of n values. */
static dt_status_t dt__local_i64(dt_tape_t tape, dt_var_t like, int64_t n, const int64_t* v,
                                 dt_var_t* out) {
  dt_mesh_t mesh;
  DT_CHECK(dt_tensor_mesh(dt_var_value(like), &mesh));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const int64_t s[1] = {n};
  dt_tensor_t t;
  DT_CHECK(dt_tensor_from_full(mesh, DT_I64, 1, s, rep, v, &t));
  dt_status_t st = dt_tape_constant(tape, t, out);
  if (st != DT_SUCCESS) dt_tensor_destroy(t);
  return st;
}

/* This rank's copy of a (rank-local or replicated) i64 tensor's n values. */
static dt_status_t dt__read_i64(dt_var_t v, int64_t n, int64_t* out) {
  int64_t ln;
  DT_CHECK(dt_tensor_local_numel(dt_var_value(v), &ln));
  if (ln != n) return DT_FAIL(DT_ERR_INTERNAL, "moe: %lld counts where %lld were expected",
                              (long long)ln, (long long)n);
  return dt_tensor_read_local(dt_var_value(v), 0, n, out);
}

/* 1 when v has no values (the meta backend: a simulated run, dt_init_simulated). Its routing
 * counts read as zeros; the simulation takes the routing as balanced instead (times
 * dt_sim_routing_imbalance for the rows this rank's experts receive). */
static int dt__is_meta(dt_var_t v) {
  dt_mesh_t mesh = NULL;
  dt_backend_t be = NULL;
  dt_device_t dev = DT_DEVICE_HOST;
  return dt_tensor_mesh(dt_var_value(v), &mesh) == DT_SUCCESS &&
         dt_mesh_backend(mesh, &be) == DT_SUCCESS && dt_backend_device(be, &dev) == DT_SUCCESS &&
         dev == DT_DEVICE_META;
}

/* *v cast (recorded on the tape) to like's dtype when it has another one. */
static dt_status_t dt__moe_to_dtype(dt_tape_t tape, dt_var_t like, dt_var_t* v) {
  dt_dtype_t want, have;
  DT_CHECK(dt_tensor_dtype(dt_var_value(like), &want));
  DT_CHECK(dt_tensor_dtype(dt_var_value(*v), &have));
  if (want == have) return DT_SUCCESS;
  const int64_t to[1] = {want};
  return ag(tape, "cast", 1, v, 1, to, 0, NULL, v);
}

/* Expert parallelism's dispatch: xs (T, D) rank-local rows sorted by expert, c (E) their counts
 * -> xg (R, D) the rows every rank sends to this rank's experts, expert-major, and lcounts
 * (E_l); *inv (R) puts expert-major rows back in arrival (rank-major) order; send/recv (n each)
 * the rows to and from each coordinate. One exchange of per-expert counts (E_l to each peer),
 * then one of the rows. */
static dt_status_t dt__ep_dispatch(dt_tape_t tape, const dt__ep_t* ep, dt_var_t xs,
                                   dt_var_t counts, const int64_t* c, int64_t* send,
                                   int64_t* recv, dt_var_t* xg, dt_var_t* lcounts,
                                   dt_var_t* inv) {
  int n = ep->n, me = ep->me;
  int64_t El = ep->lo[me + 1] - ep->lo[me];
  int64_t *ecs = malloc(sizeof(int64_t) * (size_t)(2 * n)), *ecr = NULL, *rc = NULL,
          *perm = NULL, *lc = NULL;
  if (ecs == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: %d counts", 2 * n);
  ecr = ecs + n;
  dt_status_t st = DT_SUCCESS;
  dt_var_t rcv = NULL, xr = NULL, pv = NULL;
  for (int j = 0; j < n; j++) {
    ecs[j] = ep->lo[j + 1] - ep->lo[j]; /* coordinate j gets the counts of its experts */
    ecr[j] = El;                        /* and this rank those of its own from everyone */
    send[j] = 0;
    for (int64_t e = ep->lo[j]; e < ep->lo[j + 1]; e++) send[j] += c[e];
  }
  if (st == DT_SUCCESS) {
    int prev = dt_grad_enabled();
    dt_grad_set_enabled(0);
    st = dt_ag_all_to_all(tape, counts, ep->dim, n, ecs, ecr, &rcv); /* (n E_l): [from i][e] */
    dt_grad_set_enabled(prev);
  }
  int64_t R = 0;
  if (st == DT_SUCCESS) {
    rc = malloc(sizeof(int64_t) * (size_t)(n * El + 1));
    lc = malloc(sizeof(int64_t) * (size_t)(El + 1));
    if (rc == NULL || lc == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: received counts");
  }
  if (st == DT_SUCCESS) st = dt__read_i64(rcv, n * El, rc);
  if (st == DT_SUCCESS && dt__is_meta(rcv)) { /* simulated: every peer routes as this rank
                                                * does, times the stated imbalance */
    const double f = dt_sim_routing_imbalance();
    for (int i = 0; i < n; i++)
      for (int64_t e = 0; e < El; e++)
        rc[i * El + e] = (int64_t)ceil((double)c[ep->lo[me] + e] * f);
  }
  for (int i = 0; st == DT_SUCCESS && i < n; i++) {
    recv[i] = 0;
    for (int64_t e = 0; e < El; e++) recv[i] += rc[i * El + e];
    R += recv[i];
  }
  if (st == DT_SUCCESS) st = dt_ag_all_to_all(tape, xs, ep->dim, n, send, recv, &xr);
  /* rank-major -> expert-major: expert e's rows from coordinate 0, 1, ... */
  if (st == DT_SUCCESS) {
    perm = malloc(sizeof(int64_t) * (size_t)(2 * R + 1));
    if (perm == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: %lld rows", (long long)R);
  }
  if (st == DT_SUCCESS) {
    int64_t* invp = perm + R;
    int64_t at = 0;
    for (int64_t e = 0; e < El; e++) {
      lc[e] = 0;
      int64_t base = 0; /* where coordinate i's rows start in the arrival order */
      for (int i = 0; i < n; i++) {
        int64_t off = base;
        for (int64_t f = 0; f < e; f++) off += rc[i * El + f];
        for (int64_t r = 0; r < rc[i * El + e]; r++) {
          perm[at] = off + r;
          invp[off + r] = at;
          at++;
        }
        lc[e] += rc[i * El + e];
        base += recv[i];
      }
    }
    st = dt__local_i64(tape, xs, R, perm, &pv);
    if (st == DT_SUCCESS) st = dt__local_i64(tape, xs, R, invp, inv);
    if (st == DT_SUCCESS) st = dt__local_i64(tape, xs, El, lc, lcounts);
    if (st == DT_SUCCESS) st = ag2(tape, "embedding", xr, pv, xg);
  }
  free(ecs);
  free(rc);
  free(lc);
  free(perm);
  return st;
}

/* The routed experts on the rows x (N, D) with their top-k gates vals and experts idx (N, K):
 * route, gather, SwiGLU by grouped GEMMs (through expert parallelism's all-to-alls when ep),
 * weight by the gates and add back. Works on distributed tensors (the global routing) and on
 * rank-local ones (each rank routes its own tokens). *kept: the routing choices computed. */
static dt_status_t dt__moe_routed(dt_tape_t tape, dt_var_t x, dt_var_t vals, dt_var_t idx,
                                  int64_t E, int top_k, int64_t capacity, dt_var_t w1,
                                  dt_var_t w3, dt_var_t w2, const dt__ep_t* ep, dt_var_t* out,
                                  int64_t* kept) {
  int nd;
  int64_t xs_[DT_MAX_DIMS];
  DT_CHECK(shape_of("x", x, &nd, xs_));
  const int64_t N = xs_[0], D = xs_[1], S = N * top_k;
  dt_var_t rt[3];
  const int64_t ra[2] = {E, capacity};
  int prev = dt_grad_enabled();
  dt_grad_set_enabled(0);
  dt_status_t st = dt_ag_op(tape, "moe_route", 1, &idx, 2, ra, 0, NULL, 3, rt);
  dt_grad_set_enabled(prev);
  DT_CHECK(st);
  dt_var_t order = rt[0], tok = rt[1], counts = rt[2];
  int64_t T = S, *c = NULL;
  if (capacity > 0 || ep) { /* the kept slots' counts set the rows' shapes: read them */
    c = malloc(sizeof(int64_t) * (size_t)E);
    if (c == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: %lld counts", (long long)E);
    st = dt__read_i64(counts, E, c);
    if (st == DT_SUCCESS && dt__is_meta(counts)) /* simulated: the S slots spread evenly */
      for (int64_t e = 0; e < E; e++) {
        c[e] = S / E + (e < S % E);
        if (capacity > 0 && c[e] > capacity) c[e] = capacity;
      }
    T = 0;
    for (int64_t e = 0; e < E; e++) T += c[e];
    if (st == DT_SUCCESS && T < S) {
      const int64_t na[3] = {0, 0, T};
      dt_grad_set_enabled(0);
      st = ag(tape, "narrow", 1, &order, 3, na, 0, NULL, &order);
      if (st == DT_SUCCESS) st = ag(tape, "narrow", 1, &tok, 3, na, 0, NULL, &tok);
      dt_grad_set_enabled(prev);
    }
  }
  *kept = T;
  /* tokens (T, D) sorted by expert -> SwiGLU through grouped GEMMs -> weighted by their gates ->
   * added back at their tokens */
  dt_var_t xs = NULL, xg, gc = counts, inv = NULL, a = NULL, b = NULL, sa = NULL, h = NULL,
           y = NULL, gflat, g, g2, yw, zero;
  int64_t *send = NULL, *recv = NULL;
  if (st == DT_SUCCESS) st = ag2(tape, "embedding", x, tok, &xs);
  xg = xs;
  if (st == DT_SUCCESS && ep) {
    send = malloc(sizeof(int64_t) * (size_t)(2 * ep->n));
    if (send == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: send counts");
    } else {
      recv = send + ep->n;
      st = dt__ep_dispatch(tape, ep, xs, counts, c, send, recv, &xg, &gc, &inv);
    }
  }
  free(c);
  /* experts kept in another dtype than the tokens (f32 experts beside bf16 FSDP blocks): cast to
   * the tokens' compute dtype here, the gradient flows back to them in theirs */
  dt_var_t cw[3] = {w1, w3, w2};
  for (int k = 0; k < 3 && st == DT_SUCCESS; k++) st = dt__moe_to_dtype(tape, xg, &cw[k]);
  w1 = cw[0], w3 = cw[1], w2 = cw[2];
  dt_var_t in1[3] = {xg, w1, gc}, in3[3] = {xg, w3, gc};
  if (st == DT_SUCCESS) st = ag(tape, "grouped_mm", 3, in1, 0, NULL, 0, NULL, &a);
  if (st == DT_SUCCESS) st = ag(tape, "grouped_mm", 3, in3, 0, NULL, 0, NULL, &b);
  if (st == DT_SUCCESS) st = ag(tape, "silu", 1, &a, 0, NULL, 0, NULL, &sa);
  if (st == DT_SUCCESS) st = ag2(tape, "mul", sa, b, &h);
  dt_var_t in2[3] = {h, w2, gc};
  if (st == DT_SUCCESS) st = ag(tape, "grouped_mm", 3, in2, 0, NULL, 0, NULL, &y);
  if (st == DT_SUCCESS && ep) { /* combine: back to arrival order, then to the senders */
    dt_var_t yr;
    st = ag2(tape, "embedding", y, inv, &yr);
    if (st == DT_SUCCESS) st = dt_ag_all_to_all(tape, yr, ep->dim, ep->n, recv, send, &y);
  }
  free(send);
  DT_CHECK(st);
  const int64_t flat[1] = {S}, col[2] = {T, 1}, d0[1] = {0}, nd_[2] = {N, D};
  DT_CHECK(ag(tape, "reshape", 1, &vals, 1, flat, 0, NULL, &gflat));
  dt_var_t gin[2] = {gflat, order};
  DT_CHECK(ag(tape, "gather", 2, gin, 1, d0, 0, NULL, &g)); /* each sorted row's gate */
  DT_CHECK(ag(tape, "reshape", 1, &g, 2, col, 0, NULL, &g2));
  DT_CHECK(dt__moe_to_dtype(tape, y, &g2)); /* the gates in the rows' dtype (bf16 rows under
                                             * mixed precision, f32 router probabilities) */
  DT_CHECK(ag2(tape, "mul", y, g2, &yw));
  DT_CHECK(dt__moe_to_dtype(tape, x, &yw));
  dt_dtype_t xdt;
  DT_CHECK(dt_tensor_dtype(dt_var_value(x), &xdt)); /* bf16 under mixed precision */
  DT_CHECK(dt__moe_zeros(tape, x, xdt, 2, nd_, &zero));
  dt_var_t cin[3] = {zero, tok, yw};
  return ag(tape, "index_add", 3, cin, 0, NULL, 0, NULL, out);
}

/* The experts' layout: *dim the expert-parallel mesh dim, the one on which w1, w3 and w2 are all
 * Shard(0), Replicate on every other, -1 when there is none; *whole 1 when they are Replicate on
 * every dim of one mesh (every rank holds every expert whole: split tokens are routed where they
 * are). Neither: the routing is global. */
static dt_status_t dt__moe_expert_layout(dt_var_t w1, dt_var_t w3, dt_var_t w2, int* dim,
                                         int* whole) {
  *dim = -1;
  *whole = 0;
  dt_mesh_t mesh;
  int mnd;
  DT_CHECK(dt_tensor_mesh(dt_var_value(w1), &mesh));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  dt_placement_t pl[3][DT_MAX_MESH_DIMS];
  dt_var_t w[3] = {w1, w3, w2};
  for (int k = 0; k < 3; k++) {
    dt_mesh_t m2;
    DT_CHECK(dt_tensor_mesh(dt_var_value(w[k]), &m2));
    if (m2 != mesh) return DT_SUCCESS;
    DT_CHECK(dt_tensor_placements(dt_var_value(w[k]), pl[k]));
  }
  int d = -1, all_rep = 1;
  for (int i = 0; i < mnd; i++) {
    int s0 = 1, rep = 1;
    for (int k = 0; k < 3; k++) {
      s0 &= pl[k][i].kind == DT_SHARD && pl[k][i].dim == 0;
      rep &= pl[k][i].kind == DT_REPLICATE;
    }
    all_rep &= rep;
    if (s0 && d < 0) d = i;
    else if (!rep) return DT_SUCCESS;
  }
  *dim = d;
  *whole = all_rep;
  return DT_SUCCESS;
}

/* The coordinates of world rank r on mesh m (all of them scanned: meshes are small). */
static dt_status_t dt__mesh_coords_of(dt_mesh_t m, int r, int* coords) {
  int nd, shape[DT_MAX_MESH_DIMS], numel;
  DT_CHECK(dt_mesh_ndim(m, &nd));
  DT_CHECK(dt_mesh_shape(m, shape));
  DT_CHECK(dt_mesh_numel(m, &numel));
  for (int i = 0; i < numel; i++) {
    int rest = i, w;
    for (int d = nd - 1; d >= 0; d--) {
      coords[d] = rest % shape[d];
      rest /= shape[d];
    }
    DT_CHECK(dt_mesh_rank_at(m, coords, &w));
    if (w == r) return DT_SUCCESS;
  }
  return DT_FAIL(DT_ERR_INVALID_ARG, "moe: world rank %d is not in the tokens' mesh", r);
}

/* The experts' gradient placements on their mesh em (experts Shard(0) on em's dim ep): for each
 * other dim, Partial(sum) where the ranks along it hold different tokens, Replicate where they
 * hold the same. Which tokens a rank holds: its coordinates on the dims of the tokens' mesh xm
 * where xpl splits them. The ranks along ep must all hold different tokens (each expert's rows
 * are then counted once); a dim whose ranks hold partly the same tokens is refused. */
static dt_status_t dt__moe_expert_grad_pl(dt_mesh_t xm, const dt_placement_t* xpl, dt_mesh_t em,
                                          int ep, dt_placement_t* wpl) {
  int xnd, end, ec[DT_MAX_MESH_DIMS], eshape[DT_MAX_MESH_DIMS], me[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_mesh_ndim(xm, &xnd));
  DT_CHECK(dt_mesh_ndim(em, &end));
  DT_CHECK(dt_mesh_shape(em, eshape));
  DT_CHECK(dt_mesh_coordinate(em, ec));
  int self; /* this rank's world rank (of the simulated world, on a simulated mesh) */
  DT_CHECK(dt_mesh_rank_at(em, ec, &self));
  DT_CHECK(dt__mesh_coords_of(xm, self, me));
  for (int i = 0; i < end; i++) {
    int differ = 0, same = 0;
    for (int j = 0; j < eshape[i]; j++) {
      if (j == ec[i]) continue;
      int c[DT_MAX_MESH_DIMS], w, xc[DT_MAX_MESH_DIMS], d = 0;
      memcpy(c, ec, sizeof c);
      c[i] = j;
      DT_CHECK(dt_mesh_rank_at(em, c, &w));
      DT_CHECK(dt__mesh_coords_of(xm, w, xc));
      for (int k = 0; k < xnd; k++) d |= xpl[k].kind == DT_SHARD && xc[k] != me[k];
      differ += d;
      same += !d;
    }
    if (i == ep) {
      if (same)
        return DT_FAIL(DT_ERR_INVALID_ARG, "moe: ranks along the expert-parallel mesh dim %d "
                       "hold the same tokens; split the tokens over them (their experts' rows "
                       "would be counted more than once)", ep);
      wpl[i] = dt_shard(0);
    } else if (differ && same) {
      return DT_FAIL(DT_ERR_INVALID_ARG, "moe: ranks along mesh dim %d of the experts' mesh hold "
                     "partly the same tokens; lay the meshes out so a dim's ranks hold all the "
                     "same or all different tokens", i);
    } else {
      /* (a dim of one rank: Partial, a sum over that rank, as a data dim's wrapper expects) */
      wpl[i] = differ || eshape[i] == 1 ? dt_partial(DT_REDUCE_SUM) : dt_replicate();
    }
  }
  return DT_SUCCESS;
}

/* The routed layer on split tokens: xe the tokens (rows Shard(0) on the dims that split them), tk
 * their router's gates and choices; each rank routes its own tokens. Under expert parallelism
 * over mesh dim `dim` of the experts' mesh (which may be another view of the tokens' ranks: the
 * rank-local tokens cross to it and back) it sends each expert's rows to the rank that holds it,
 * runs its experts and sends the results back; with `dim` -1 (every expert on every rank) it
 * runs them in place, with no communication. The output has the split tokens' placements. */
static dt_status_t dt__moe_ep(dt_tape_t tape, const dt_var_t* tk, dt_var_t xe, int dim,
                              int64_t E, int top_k, double capacity_factor, dt_var_t w1,
                              dt_var_t w3, dt_var_t w2, dt_var_t* out, int64_t* kept_local) {
  dt_mesh_t mesh, em;
  int n = 1, me = 0;
  DT_CHECK(dt_tensor_mesh(dt_var_value(xe), &mesh));
  DT_CHECK(dt_tensor_mesh(dt_var_value(w1), &em));
  if (dim >= 0) {
    DT_CHECK(dt_mesh_size(em, dim, &n));
    DT_CHECK(dt_mesh_local_rank(em, dim, &me));
  }
  dt_placement_t xpl[DT_MAX_MESH_DIMS], wpl[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_tensor_placements(dt_var_value(xe), xpl));
  /* the experts' gradients: Shard(0) on the expert dim, a part of the sum where the tokens are
   * split, whole where every rank saw the same tokens */
  DT_CHECK(dt__moe_expert_grad_pl(mesh, xpl, em, dim, wpl));
  dt__ep_t ep = {dim, n, me, NULL};
  ep.lo = malloc(sizeof(int64_t) * (size_t)(n + 1));
  if (ep.lo == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "moe: %d expert ranges", n);
  int64_t chunk = (E + n - 1) / n, woff[DT_MAX_DIMS], wsh[DT_MAX_DIMS];
  for (int j = 0; j <= n; j++) ep.lo[j] = (int64_t)j * chunk < E ? (int64_t)j * chunk : E;
  dt_status_t st = dt_tensor_local_offset(dt_var_value(w1), woff);
  if (st == DT_SUCCESS) st = dt_tensor_local_shape(dt_var_value(w1), wsh);
  if (st == DT_SUCCESS && (woff[0] != ep.lo[me] || wsh[0] != ep.lo[me + 1] - ep.lo[me]))
    st = DT_FAIL(DT_ERR_INTERNAL, "moe: rank %d of mesh dim %d holds experts [%lld, %lld), the "
                 "chunk rule says [%lld, %lld)", me, dim, (long long)woff[0],
                 (long long)(woff[0] + wsh[0]), (long long)ep.lo[me], (long long)ep.lo[me + 1]);
  dt_var_t xl = NULL, vl = NULL, il = NULL, wl[3] = {NULL, NULL, NULL}, ol = NULL;
  if (st == DT_SUCCESS) st = dt_ag_to_local(tape, xe, NULL, &xl);
  if (st == DT_SUCCESS) st = dt_ag_local_to_mesh(tape, xl, em, &xl);
  if (st == DT_SUCCESS) st = dt_ag_to_local(tape, tk[0], NULL, &vl);
  if (st == DT_SUCCESS) st = dt_ag_local_to_mesh(tape, vl, em, &vl);
  if (st == DT_SUCCESS) {
    int prev = dt_grad_enabled();
    dt_grad_set_enabled(0);
    st = dt_ag_to_local(tape, tk[1], NULL, &il);
    if (st == DT_SUCCESS) st = dt_ag_local_to_mesh(tape, il, em, &il);
    dt_grad_set_enabled(prev);
  }
  dt_var_t w[3] = {w1, w3, w2};
  for (int k = 0; k < 3 && st == DT_SUCCESS; k++) st = dt_ag_to_local(tape, w[k], wpl, &wl[k]);
  int64_t Nl = 0, ls[DT_MAX_DIMS];
  if (st == DT_SUCCESS) st = dt_tensor_local_shape(dt_var_value(xe), ls);
  if (st == DT_SUCCESS) Nl = ls[0];
  int64_t capacity = 0;
  if (capacity_factor > 0.0) { /* per rank: each rank drops among its own tokens */
    capacity = (int64_t)ceil(capacity_factor * (double)(Nl * top_k) / (double)E);
    if (capacity < 1) capacity = 1;
  }
  if (st == DT_SUCCESS)
    st = dt__moe_routed(tape, xl, vl, il, E, top_k, capacity, wl[0], wl[1], wl[2],
                        dim >= 0 ? &ep : NULL, &ol, kept_local);
  free(ep.lo);
  DT_CHECK(st);
  DT_CHECK(dt_ag_local_to_mesh(tape, ol, mesh, &ol));
  return dt_ag_from_local(tape, ol, xe, out);
}

static dt_status_t dt__nn_moe(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1, dt_var_t w3,
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
  int ep_dim;
  int whole;
  DT_CHECK(dt__moe_expert_layout(w1, w3, w2, &ep_dim, &whole));
  dt_var_t xr = x, probs, tk[2];
  dt_mesh_t mesh;
  int mnd;
  DT_CHECK(dt_tensor_mesh(dt_var_value(x), &mesh));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  dt_placement_t xpl[DT_MAX_MESH_DIMS], epl[DT_MAX_MESH_DIMS];
  dt_mesh_t em;
  DT_CHECK(dt_tensor_mesh(dt_var_value(w1), &em));
  DT_CHECK(dt_tensor_placements(dt_var_value(x), xpl));
  /* each rank routes its own tokens under expert parallelism, and where the tokens arrive split
   * (rows Shard(0): a batch or sequence shard) beside experts every rank holds whole */
  int local = ep_dim >= 0;
  for (int i = 0; i < mnd && whole; i++) local |= xpl[i].kind == DT_SHARD && xpl[i].dim == 0;
  if (local) { /* the tokens split over the expert dim (and kept split where they are); on
                * another mesh, split where they are only */
    int same = 1;
    for (int i = 0; i < mnd; i++) {
      epl[i] = (em == mesh && i == ep_dim) || (xpl[i].kind == DT_SHARD && xpl[i].dim == 0)
                   ? dt_shard(0)
                   : dt_replicate();
      same &= dt_placement_equal(epl[i], xpl[i]);
    }
    if (!same) DT_CHECK(dt_ag_redistribute(tape, x, epl, &xr));
  }
  DT_CHECK(dt__moe_router(tape, xr, router, top_k, &probs, tk));
  int64_t kept = 0, capacity = 0;
  if (local) {
    for (int k = 0; k < 2; k++) { /* the router's rows where the tokens are */
      dt_placement_t p[DT_MAX_MESH_DIMS];
      DT_CHECK(dt_tensor_placements(dt_var_value(tk[k]), p));
      int same = 1;
      for (int i = 0; i < mnd; i++) same &= dt_placement_equal(p[i], epl[i]);
      if (!same) DT_CHECK(dt_ag_redistribute(tape, tk[k], epl, &tk[k]));
    }
    DT_CHECK(dt__moe_ep(tape, tk, xr, ep_dim, E, top_k, capacity_factor, w1, w3, w2, out,
                        &kept));
    if (capacity_factor > 0.0) { /* the kept choices summed over the ranks that split tokens */
      int dims[DT_MAX_MESH_DIMS], nd = 0;
      for (int i = 0; i < mnd; i++)
        if (epl[i].kind == DT_SHARD) dims[nd++] = i;
      if (nd > 0) DT_CHECK(dt_mesh_all_reduce_host(mesh, nd, dims, &kept, 1, DT_I64, DT_REDUCE_SUM));
      capacity = -1; /* per rank */
    } else {
      kept = S;
    }
  } else {
    if (capacity_factor > 0.0) {
      capacity = (int64_t)ceil(capacity_factor * (double)S / (double)E);
      if (capacity < 1) capacity = 1;
    }
    DT_CHECK(dt__moe_routed(tape, x, tk[0], tk[1], E, top_k, capacity, w1, w3, w2, NULL, out,
                            &kept));
  }
  if (stats) {
    stats->tokens = N;
    stats->assignments = S;
    stats->dropped = S - kept;
    stats->capacity = capacity;
    stats->expert_rows = kept;
    stats->expert_parallel_dim = ep_dim;
    stats->local_routing = local;
  }
  if (aux == NULL) return DT_SUCCESS;
  return dt__moe_aux(tape, xr, probs, tk[1], N, E, top_k, aux_coef, aux);
}

dt_status_t dt_nn_moe(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1, dt_var_t w3,
                      dt_var_t w2, int top_k, double capacity_factor, double aux_coef,
                      dt_var_t* out, dt_var_t* aux, dt_moe_stats_t* stats) {
  DT_ENTRY_RETURN(
      dt__nn_moe(tape, x, router, w1, w3, w2, top_k, capacity_factor, aux_coef, out, aux, stats));
}

static dt_status_t dt__nn_moe_dense(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1,
                                    dt_var_t w3, dt_var_t w2, int top_k, double aux_coef,
                                    dt_var_t* out, dt_var_t* aux) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (aux) *aux = NULL;
  int64_t N, D, E, F;
  DT_CHECK(dt__moe_check("moe_dense", x, router, w1, w3, w2, top_k, &N, &D, &E, &F));
  dt_var_t probs, tk[2], gates, zv;
  DT_CHECK(dt__moe_router(tape, x, router, top_k, &probs, tk));
  const int64_t ne[2] = {N, E}, one[1] = {1};
  DT_CHECK(dt__moe_zeros(tape, x, DT_F32, 2, ne, &zv));
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

dt_status_t dt_nn_moe_dense(dt_tape_t tape, dt_var_t x, dt_var_t router, dt_var_t w1, dt_var_t w3,
                            dt_var_t w2, int top_k, double aux_coef, dt_var_t* out, dt_var_t* aux) {
  DT_ENTRY_RETURN(dt__nn_moe_dense(tape, x, router, w1, w3, w2, top_k, aux_coef, out, aux));
}

/* llama.c - a Llama-style decoder built from recorded ops: token embedding, blocks of RMSNorm ->
 * causal grouped-query attention with rotary embeddings -> residual -> RMSNorm -> SwiGLU MLP or a
 * top-k mixture of SwiGLU experts -> residual, a final RMSNorm and the output projection, mean
 * cross-entropy. Uses only the public API; parameters are placed by the user's plan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "internal/check.h"

#define DT_PARAM_NAME_MAX 96

typedef struct {
  dt_var_t attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, router;
  dt_var_t* ew1; /* per expert */
  dt_var_t* ew2;
  dt_var_t* ew3;
} dt__layer_t;

struct dt_llama {
  dt_llama_config_t cfg;
  dt_mesh_t mesh;
  dt__layer_t* layers;
  dt_var_t tok_emb, norm, output;
  int n_params, cap_params;
  dt_var_t* params;
  char (*names)[DT_PARAM_NAME_MAX];
  const char** name_ptrs;
  int64_t numel;
};

void dt_llama_config_defaults(dt_llama_config_t* c) {
  if (c->norm_eps <= 0) c->norm_eps = 1e-5;
  if (c->rope_theta <= 0) c->rope_theta = 10000.0;
  if (c->n_kv_heads <= 0) c->n_kv_heads = c->n_heads;
  if (c->ffn_dim <= 0) c->ffn_dim = ((c->dim * 8 / 3) + 7) / 8 * 8;
  if (c->n_experts > 0 && c->top_k <= 0) c->top_k = c->n_experts < 2 ? c->n_experts : 2;
  if (c->aux_loss_coef <= 0 && c->n_experts > 0) c->aux_loss_coef = 0.01;
}

/* '*' matches any run of characters. */
static int dt__glob(const char* p, const char* s) {
  if (*p == '\0') return *s == '\0';
  if (*p == '*') return dt__glob(p + 1, s) || (*s && dt__glob(p, s + 1));
  return *p == *s && dt__glob(p + 1, s + 1);
}

/* Placements for `name` from the plan; R when nothing matches. */
static dt_status_t dt__plan_lookup(const char* plan, const char* name, int mesh_nd,
                                   dt_placement_t* pl) {
  for (int i = 0; i < mesh_nd; i++) pl[i] = dt_replicate();
  if (plan == NULL) return DT_SUCCESS;
  const char* p = plan;
  while (*p) {
    size_t len = strcspn(p, ";");
    char entry[256];
    if (len >= sizeof entry) return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry too long");
    memcpy(entry, p, len);
    entry[len] = '\0';
    p += len + (p[len] == ';');
    char* eq = strchr(entry, '=');
    if (len == 0) continue;
    if (eq == NULL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry '%s' is not pattern=placements", entry);
    *eq = '\0';
    char* pat = entry;
    while (*pat == ' ') pat++;
    if (!dt__glob(pat, name)) continue;
    int n;
    dt_status_t st = dt_placements_parse(eq + 1, pl, mesh_nd, &n);
    if (st != DT_SUCCESS) return st;
    if (n == 1 && mesh_nd > 1) /* one placement: the same on every mesh dim */
      for (int i = 1; i < mesh_nd; i++) pl[i] = pl[0];
    else if (n != mesh_nd)
      return DT_FAIL(DT_ERR_INVALID_ARG, "plan entry for '%s' has %d placements, mesh has %d dims",
                     name, n, mesh_nd);
    return DT_SUCCESS;
  }
  return DT_SUCCESS;
}

static uint64_t dt__name_seed(uint64_t seed, const char* name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (const unsigned char* p = (const unsigned char*)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

/* kind 0: N(0, std); 1: ones */
static dt_status_t dt__param(dt_llama_t m, const char* plan, const char* name, int nd,
                             const int64_t* shape, int kind, double std, dt_var_t* out) {
  if (m->n_params == m->cap_params) {
    int cap = m->cap_params ? 2 * m->cap_params : 64;
    dt_var_t* pv = realloc(m->params, sizeof(dt_var_t) * (size_t)cap);
    if (pv == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "parameter table");
    m->params = pv;
    char(*nv)[DT_PARAM_NAME_MAX] = realloc(m->names, sizeof *nv * (size_t)cap);
    if (nv == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "parameter table");
    m->names = nv;
    m->cap_params = cap;
  }
  dt_placement_t pl[4];
  int mnd;
  DT_CHECK(dt_mesh_ndim(m->mesh, &mnd));
  DT_CHECK(dt__plan_lookup(plan, name, mnd, pl));
  dt_tensor_t t;
  if (kind == 1) {
    DT_CHECK(dt_tensor_ones(m->mesh, DT_F32, nd, shape, pl, &t));
  } else {
    dt_tensor_t r;
    DT_CHECK(dt_tensor_randn(m->mesh, DT_F32, nd, shape, pl, dt__name_seed(m->cfg.seed, name), &r));
    dt_status_t st = dt_op_run("mul_scalar", 1, &r, 0, NULL, 1, &std, &t);
    dt_tensor_destroy(r);
    DT_CHECK(st);
  }
  dt_status_t st = dt_var_leaf(t, 1, out);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(t);
    return st;
  }
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  m->numel += n;
  snprintf(m->names[m->n_params], DT_PARAM_NAME_MAX, "%s", name);
  m->params[m->n_params++] = *out;
  return DT_SUCCESS;
}

dt_status_t dt_llama_create(dt_mesh_t mesh, const dt_llama_config_t* cfg_in, const char* plan,
                            dt_llama_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(cfg_in);
  dt_llama_config_t cfg = *cfg_in;
  dt_llama_config_defaults(&cfg);
  if (cfg.dim <= 0 || cfg.n_layers <= 0 || cfg.n_heads <= 0 || cfg.vocab <= 0 ||
      cfg.seq_len <= 0 || cfg.dim % cfg.n_heads != 0 || cfg.n_heads % cfg.n_kv_heads != 0 ||
      (cfg.dim / cfg.n_heads) % 2 != 0 || cfg.n_experts < 0 ||
      (cfg.n_experts > 0 && (cfg.top_k < 1 || cfg.top_k > cfg.n_experts)))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "llama config: need dim, layers, heads, vocab, seq_len > 0; dim a multiple of "
                   "heads with an even head dim; heads a multiple of kv heads; 1 <= top_k <= "
                   "experts");
  dt_llama_t m = calloc(1, sizeof *m);
  if (m == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the model");
  m->cfg = cfg;
  m->mesh = mesh;
  dt_status_t st = DT_SUCCESS;
  int D = cfg.dim, Dh = cfg.dim / cfg.n_heads, H = cfg.n_heads, G = cfg.n_kv_heads,
      F = cfg.ffn_dim, V = cfg.vocab, E = cfg.n_experts;
  double std = 0.02, ostd = 0.02 / sqrt(2.0 * cfg.n_layers);
  m->layers = calloc((size_t)cfg.n_layers, sizeof(dt__layer_t));
  if (m->layers == NULL) {
    free(m);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the layers");
  }
  char nm[DT_PARAM_NAME_MAX];
  const int64_t emb[2] = {V, D}, vecD[1] = {D};
  st = dt__param(m, plan, "tok_emb", 2, emb, 0, std, &m->tok_emb);
  for (int l = 0; l < cfg.n_layers && st == DT_SUCCESS; l++) {
    dt__layer_t* L = &m->layers[l];
    const int64_t sq[2] = {(int64_t)H * Dh, D}, skv[2] = {(int64_t)G * Dh, D},
                  so[2] = {D, (int64_t)H * Dh}, s1[2] = {F, D}, s2[2] = {D, F}, sr[2] = {E, D};
#define P(field, suffix, nd, shape, kind, sd)                                  \
  if (st == DT_SUCCESS) {                                                      \
    snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);                        \
    st = dt__param(m, plan, nm, nd, shape, kind, sd, &L->field);               \
  }
    P(attn_norm, "attn_norm", 1, vecD, 1, 0.0)
    P(wq, "wq", 2, sq, 0, std)
    P(wk, "wk", 2, skv, 0, std)
    P(wv, "wv", 2, skv, 0, std)
    P(wo, "wo", 2, so, 0, ostd)
    P(ffn_norm, "ffn_norm", 1, vecD, 1, 0.0)
    if (E == 0) {
      P(w1, "w1", 2, s1, 0, std)
      P(w3, "w3", 2, s1, 0, std)
      P(w2, "w2", 2, s2, 0, ostd)
    } else {
      P(router, "router", 2, sr, 0, std)
      L->ew1 = calloc((size_t)E, sizeof(dt_var_t));
      L->ew2 = calloc((size_t)E, sizeof(dt_var_t));
      L->ew3 = calloc((size_t)E, sizeof(dt_var_t));
      if (!L->ew1 || !L->ew2 || !L->ew3) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "experts");
      for (int e = 0; e < E && st == DT_SUCCESS; e++) {
        char s[48];
        snprintf(s, sizeof s, "experts.%d.w1", e);
        P(ew1[e], s, 2, s1, 0, std)
        snprintf(s, sizeof s, "experts.%d.w3", e);
        P(ew3[e], s, 2, s1, 0, std)
        snprintf(s, sizeof s, "experts.%d.w2", e);
        P(ew2[e], s, 2, s2, 0, ostd)
      }
    }
#undef P
  }
  if (st == DT_SUCCESS) st = dt__param(m, plan, "norm", 1, vecD, 1, 0.0, &m->norm);
  if (st == DT_SUCCESS) st = dt__param(m, plan, "output", 2, emb, 0, std, &m->output);
  if (st == DT_SUCCESS) {
    m->name_ptrs = malloc(sizeof(char*) * (size_t)m->n_params);
    if (m->name_ptrs == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "names");
    for (int i = 0; st == DT_SUCCESS && i < m->n_params; i++) m->name_ptrs[i] = m->names[i];
  }
  if (st != DT_SUCCESS) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    dt_llama_destroy(m);
    return DT_FAIL(st, "%s", msg);
  }
  *out = m;
  return DT_SUCCESS;
}

dt_status_t dt_llama_destroy(dt_llama_t m) {
  if (m == NULL) return DT_SUCCESS;
  for (int i = 0; i < m->n_params; i++) dt_var_destroy(m->params[i]);
  for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
    free(m->layers[l].ew1);
    free(m->layers[l].ew2);
    free(m->layers[l].ew3);
  }
  free(m->layers);
  free(m->params);
  free(m->names);
  free(m->name_ptrs);
  free(m);
  return DT_SUCCESS;
}

dt_status_t dt_llama_params(dt_llama_t m, dt_var_t** params, const char* const** names, int* n,
                            int64_t* numel) {
  DT_ARG_NOT_NULL(m);
  if (params) *params = m->params;
  if (names) *names = m->name_ptrs;
  if (n) *n = m->n_params;
  if (numel) *numel = m->numel;
  return DT_SUCCESS;
}

double dt_llama_flops_per_token(const dt_llama_config_t* cfg_in) {
  dt_llama_config_t c = *cfg_in;
  dt_llama_config_defaults(&c);
  double D = c.dim, Dh = (double)c.dim / c.n_heads, H = c.n_heads, G = c.n_kv_heads, F = c.ffn_dim;
  double attn_proj = 2.0 * D * (H * Dh + 2 * G * Dh + H * Dh);
  double attn_core = 2.0 * 2.0 * H * Dh * c.seq_len / 2.0; /* causal: half the keys on average */
  double mlp = 2.0 * 3.0 * D * F * (c.n_experts > 0 ? c.n_experts : 1); /* all experts computed */
  double router = c.n_experts > 0 ? 2.0 * D * c.n_experts : 0.0;
  return c.n_layers * (attn_proj + attn_core + mlp + router) + 2.0 * D * c.vocab;
}

/* ---------------------------------------------------------------------------------------------
 * forward */

typedef struct {
  dt_tape_t tape;
} dt__fw_t;

static dt_status_t ag(dt__fw_t* f, const char* op, int n, dt_var_t* in, int ni, const int64_t* ia,
                      int nf, const double* fa, dt_var_t* out) {
  return dt_ag_op(f->tape, op, n, in, ni, ia, nf, fa, 1, out);
}
static dt_status_t ag2(dt__fw_t* f, const char* op, dt_var_t a, dt_var_t b, dt_var_t* out) {
  dt_var_t in[2] = {a, b};
  return ag(f, op, 2, in, 0, NULL, 0, NULL, out);
}
static dt_status_t reshape(dt__fw_t* f, dt_var_t x, int nd, const int64_t* shape, dt_var_t* out) {
  return ag(f, "reshape", 1, &x, nd, shape, 0, NULL, out);
}
static dt_status_t rmsnorm(dt__fw_t* f, dt_var_t x, dt_var_t w, double eps, dt_var_t* out) {
  dt_var_t in[2] = {x, w};
  return ag(f, "rms_norm", 2, in, 0, NULL, 1, &eps, out);
}

/* SwiGLU: w2 (silu(x w1^T) * (x w3^T)); x (N, D) */
static dt_status_t swiglu(dt__fw_t* f, dt_var_t x, dt_var_t w1, dt_var_t w3, dt_var_t w2,
                          dt_var_t* out) {
  dt_var_t a, b, s, p;
  DT_CHECK(ag2(f, "linear_nobias", x, w1, &a));
  DT_CHECK(ag2(f, "linear_nobias", x, w3, &b));
  DT_CHECK(ag(f, "silu", 1, &a, 0, NULL, 0, NULL, &s));
  DT_CHECK(ag2(f, "mul", s, b, &p));
  return ag2(f, "linear_nobias", p, w2, out);
}

/* Mixture of experts on x (N, D): router softmax, top-k gates scattered into a dense (N, E) gate
 * matrix, every expert computed and weighted by its gate column. Load-balancing term
 * E * sum_e f_e P_e (f_e: fraction of routed slots, P_e: mean router probability). */
static dt_status_t moe(dt__fw_t* f, const dt_llama_config_t* c, const dt__layer_t* L, dt_var_t x,
                       dt_var_t* out, dt_var_t* aux) {
  int E = c->n_experts;
  int64_t N;
  {
    int64_t shp[2];
    DT_CHECK(dt_tensor_shape(dt_var_value(x), shp));
    N = shp[0];
  }
  dt_var_t logits, probs, tk[2], gates;
  DT_CHECK(ag2(f, "linear_nobias", x, L->router, &logits));
  const int64_t last[1] = {-1};
  DT_CHECK(ag(f, "softmax", 1, &logits, 1, last, 0, NULL, &probs));
  const int64_t ka[2] = {c->top_k, 1};
  DT_CHECK(dt_ag_op(f->tape, "topk", 1, &probs, 2, ka, 0, NULL, 2, tk));
  dt_mesh_t mesh;
  DT_CHECK(dt_tensor_mesh(dt_var_value(x), &mesh));
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  dt_placement_t rep[4] = {dt_replicate(), dt_replicate(), dt_replicate(), dt_replicate()};
  const int64_t ne[2] = {N, E};
  dt_tensor_t z;
  DT_CHECK(dt_tensor_zeros(mesh, DT_F32, 2, ne, rep, &z));
  dt_var_t zv;
  DT_CHECK(dt_tape_constant(f->tape, z, &zv));
  const int64_t one[1] = {1};
  dt_var_t sin[3] = {zv, tk[1], tk[0]};
  DT_CHECK(ag(f, "scatter_add", 3, sin, 1, one, 0, NULL, &gates));
  dt_var_t acc = NULL;
  for (int e = 0; e < E; e++) {
    dt_var_t y, ge, w, s;
    DT_CHECK(swiglu(f, x, L->ew1[e], L->ew3[e], L->ew2[e], &y));
    const int64_t na[3] = {1, e, 1};
    DT_CHECK(ag(f, "narrow", 1, &gates, 3, na, 0, NULL, &ge));
    DT_CHECK(ag2(f, "mul", y, ge, &w));
    if (acc == NULL) {
      acc = w;
    } else {
      DT_CHECK(ag2(f, "add", acc, w, &s));
      acc = s;
    }
  }
  *out = acc;
  /* load balancing: f_e from the routing (no gradient), P_e = mean router probability */
  dt_var_t fr, pm, prod, sum, scaled;
  int prev = dt_grad_enabled();
  dt_grad_set_enabled(0);
  dt_tensor_t ones;
  DT_CHECK(dt_tensor_full_value(mesh, DT_F32, 2, (int64_t[]){N, c->top_k}, rep, 1.0, &ones));
  dt_var_t onesv;
  DT_CHECK(dt_tape_constant(f->tape, ones, &onesv));
  dt_tensor_t z2;
  DT_CHECK(dt_tensor_zeros(mesh, DT_F32, 2, ne, rep, &z2));
  dt_var_t z2v, cnt;
  DT_CHECK(dt_tape_constant(f->tape, z2, &z2v));
  dt_var_t cin[3] = {z2v, tk[1], onesv};
  DT_CHECK(ag(f, "scatter_add", 3, cin, 1, one, 0, NULL, &cnt));
  const int64_t m0[2] = {0, 0};
  dt_var_t frac;
  DT_CHECK(ag(f, "mean", 1, &cnt, 2, m0, 0, NULL, &frac));
  double inv_k = 1.0 / c->top_k;
  DT_CHECK(ag(f, "mul_scalar", 1, &frac, 0, NULL, 1, &inv_k, &fr));
  dt_grad_set_enabled(prev);
  DT_CHECK(ag(f, "mean", 1, &probs, 2, m0, 0, NULL, &pm));
  DT_CHECK(ag2(f, "mul", fr, pm, &prod));
  const int64_t all[1] = {0};
  DT_CHECK(ag(f, "sum", 1, &prod, 1, all, 0, NULL, &sum));
  double coef = c->aux_loss_coef * E;
  DT_CHECK(ag(f, "mul_scalar", 1, &sum, 0, NULL, 1, &coef, &scaled));
  *aux = scaled;
  return DT_SUCCESS;
}

dt_status_t dt_llama_forward(dt_llama_t m, dt_tape_t tape, dt_tensor_t tokens, dt_tensor_t targets,
                             dt_var_t* loss, double* aux_out) {
  DT_ARG_NOT_NULL(loss);
  *loss = NULL;
  DT_ARG_NOT_NULL(m);
  DT_ARG_NOT_NULL(tape);
  const dt_llama_config_t* c = &m->cfg;
  int nd;
  int64_t ts[DT_MAX_DIMS];
  DT_CHECK(dt_tensor_ndim(tokens, &nd));
  DT_CHECK(dt_tensor_shape(tokens, ts));
  if (nd != 2 || ts[1] > c->seq_len)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tokens must be (B, S) with S <= seq_len %d", c->seq_len);
  int64_t B = ts[0], S = ts[1], N = B * S;
  int D = c->dim, H = c->n_heads, G = c->n_kv_heads, Dh = c->dim / c->n_heads;
  dt__fw_t f = {tape};
  dt_tensor_t tok_copy, tgt_copy;
  const int64_t flat[1] = {N};
  DT_CHECK(dt_op_run("reshape", 1, &tokens, 2, ts, 0, NULL, &tok_copy));
  dt_status_t st0 = dt_op_run("reshape", 1, &targets, 1, flat, 0, NULL, &tgt_copy);
  if (st0 != DT_SUCCESS) {
    dt_tensor_destroy(tok_copy);
    return st0;
  }
  dt_var_t tok, tgt;
  st0 = dt_tape_constant(tape, tok_copy, &tok);
  if (st0 != DT_SUCCESS) {
    dt_tensor_destroy(tok_copy);
    dt_tensor_destroy(tgt_copy);
    return st0;
  }
  st0 = dt_tape_constant(tape, tgt_copy, &tgt);
  if (st0 != DT_SUCCESS) {
    dt_tensor_destroy(tgt_copy);
    return st0;
  }
  dt_var_t h, aux_total = NULL;
  DT_CHECK(ag2(&f, "embedding", m->tok_emb, tok, &h)); /* (B, S, D) */
  const int64_t bsd[3] = {B, S, D}, nd2[2] = {N, D};
  const int64_t causal[1] = {1}, tr12[2] = {1, 2};
  for (int l = 0; l < c->n_layers; l++) {
    const dt__layer_t* L = &m->layers[l];
    dt_var_t a, a2, q, k, v, o, o2, o3, o4, h2, mm, mm2, ff, ff2;
    DT_CHECK(rmsnorm(&f, h, L->attn_norm, c->norm_eps, &a));
    DT_CHECK(reshape(&f, a, 2, nd2, &a2));
    dt_var_t qkv[3];
    dt_var_t ws[3] = {L->wq, L->wk, L->wv};
    int heads[3] = {H, G, G};
    for (int j = 0; j < 3; j++) {
      dt_var_t p, p4, r;
      DT_CHECK(ag2(&f, "linear_nobias", a2, ws[j], &p));
      const int64_t s4[4] = {B, S, heads[j], Dh};
      DT_CHECK(reshape(&f, p, 4, s4, &p4));
      if (j < 2) {
        const int64_t ra[1] = {1};
        DT_CHECK(ag(&f, "rotary", 1, &p4, 1, ra, 1, &c->rope_theta, &r));
      } else {
        r = p4;
      }
      DT_CHECK(ag(&f, "transpose", 1, &r, 2, tr12, 0, NULL, &qkv[j])); /* (B, heads, S, Dh) */
    }
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
    DT_CHECK(ag(&f, "sdpa", 3, qkv, 1, causal, 0, NULL, &o));
    DT_CHECK(ag(&f, "transpose", 1, &o, 2, tr12, 0, NULL, &o2)); /* (B, S, H, Dh) */
    const int64_t nhd[2] = {N, (int64_t)H * Dh};
    DT_CHECK(reshape(&f, o2, 2, nhd, &o3));
    DT_CHECK(ag2(&f, "linear_nobias", o3, L->wo, &o4));
    dt_var_t o5;
    DT_CHECK(reshape(&f, o4, 3, bsd, &o5));
    DT_CHECK(ag2(&f, "add", h, o5, &h2));
    DT_CHECK(rmsnorm(&f, h2, L->ffn_norm, c->norm_eps, &mm));
    DT_CHECK(reshape(&f, mm, 2, nd2, &mm2));
    if (c->n_experts == 0) {
      DT_CHECK(swiglu(&f, mm2, L->w1, L->w3, L->w2, &ff));
    } else {
      dt_var_t aux;
      DT_CHECK(moe(&f, c, L, mm2, &ff, &aux));
      if (aux_total == NULL) aux_total = aux;
      else DT_CHECK(ag2(&f, "add", aux_total, aux, &aux_total));
    }
    DT_CHECK(reshape(&f, ff, 3, bsd, &ff2));
    DT_CHECK(ag2(&f, "add", h2, ff2, &h));
    /* block boundary: with a checkpoint policy, cheap intermediates are dropped here */
    dt_var_t keep[2] = {h, aux_total};
    DT_CHECK(dt_tape_checkpoint(tape, aux_total ? 2 : 1, keep));
    (void)q;
    (void)k;
    (void)v;
  }
  dt_var_t n, n2, logits, ce;
  DT_CHECK(rmsnorm(&f, h, m->norm, c->norm_eps, &n));
  DT_CHECK(reshape(&f, n, 2, nd2, &n2));
  DT_CHECK(ag2(&f, "linear_nobias", n2, m->output, &logits));
  DT_CHECK(dt_ag_cross_entropy(tape, logits, tgt, &ce));
  if (aux_out) *aux_out = 0.0;
  if (aux_total != NULL) {
    if (aux_out) {
      float a;
      dt_tensor_t av = dt_var_value(aux_total), ar;
      dt_placement_t rep[4] = {dt_replicate(), dt_replicate(), dt_replicate(), dt_replicate()};
      DT_CHECK(dt_tensor_redistribute(av, rep, &ar));
      dt_status_t st = dt_tensor_full(ar, &a, sizeof a);
      dt_tensor_destroy(ar);
      DT_CHECK(st);
      *aux_out = a;
    }
    DT_CHECK(ag2(&f, "add", ce, aux_total, loss));
  } else {
    *loss = ce;
  }
  return DT_SUCCESS;
}

/* llama.c - a Llama-style decoder built from the modules of modules.c: token embedding, blocks of RMSNorm ->
 * causal grouped-query attention with rotary embeddings -> residual -> RMSNorm -> SwiGLU MLP or a
 * top-k mixture of SwiGLU experts -> residual, a final RMSNorm and the output projection, mean
 * cross-entropy. Uses only the public API; parameters are placed by the user's plan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "dtensor/check.h"

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
  DT_CHECK(dt_nn_param(m->mesh, plan, name, nd, shape, kind ? DT_INIT_ONES : DT_INIT_NORMAL, std,
                       m->cfg.seed, out));
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
#define DT__PARAM(field, suffix, nd, shape, kind, sd)                                  \
  if (st == DT_SUCCESS) {                                                      \
    snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);                        \
    st = dt__param(m, plan, nm, nd, shape, kind, sd, &L->field);               \
  }
    DT__PARAM(attn_norm, "attn_norm", 1, vecD, 1, 0.0)
    DT__PARAM(wq, "wq", 2, sq, 0, std)
    DT__PARAM(wk, "wk", 2, skv, 0, std)
    DT__PARAM(wv, "wv", 2, skv, 0, std)
    DT__PARAM(wo, "wo", 2, so, 0, ostd)
    DT__PARAM(ffn_norm, "ffn_norm", 1, vecD, 1, 0.0)
    if (E == 0) {
      DT__PARAM(w1, "w1", 2, s1, 0, std)
      DT__PARAM(w3, "w3", 2, s1, 0, std)
      DT__PARAM(w2, "w2", 2, s2, 0, ostd)
    } else {
      DT__PARAM(router, "router", 2, sr, 0, std)
      L->ew1 = calloc((size_t)E, sizeof(dt_var_t));
      L->ew2 = calloc((size_t)E, sizeof(dt_var_t));
      L->ew3 = calloc((size_t)E, sizeof(dt_var_t));
      if (!L->ew1 || !L->ew2 || !L->ew3) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "experts");
      for (int e = 0; e < E && st == DT_SUCCESS; e++) {
        char s[48];
        snprintf(s, sizeof s, "experts.%d.w1", e);
        DT__PARAM(ew1[e], s, 2, s1, 0, std)
        snprintf(s, sizeof s, "experts.%d.w3", e);
        DT__PARAM(ew3[e], s, 2, s1, 0, std)
        snprintf(s, sizeof s, "experts.%d.w2", e);
        DT__PARAM(ew2[e], s, 2, s2, 0, ostd)
      }
    }
#undef DT__PARAM
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
  int D = c->dim;
  /* the tape keeps its own copies of the ids (the backward pass needs them) */
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
  DT_CHECK(dt_nn_embedding(tape, m->tok_emb, tok, &h)); /* (B, S, D) */
  const int64_t nd2[2] = {N, D};
  for (int l = 0; l < c->n_layers; l++) {
    const dt__layer_t* L = &m->layers[l];
    dt_var_t a, o, h2, mm, ff;
    DT_CHECK(dt_nn_rms_norm(tape, h, L->attn_norm, c->norm_eps, &a));
    DT_CHECK(dt_nn_attention(tape, a, L->wq, L->wk, L->wv, L->wo, c->n_heads, c->n_kv_heads,
                             c->rope_theta, &o));
    dt_var_t ho[2] = {h, o};
    DT_CHECK(dt_ag_op(tape, "add", 2, ho, 0, NULL, 0, NULL, 1, &h2));
    DT_CHECK(dt_nn_rms_norm(tape, h2, L->ffn_norm, c->norm_eps, &mm));
    if (c->n_experts == 0) {
      DT_CHECK(dt_nn_swiglu(tape, mm, L->w1, L->w3, L->w2, &ff));
    } else {
      dt_var_t mm2, f2, aux;
      DT_CHECK(dt_ag_op(tape, "reshape", 1, &mm, 2, nd2, 0, NULL, 1, &mm2));
      DT_CHECK(dt_nn_moe(tape, mm2, L->router, c->n_experts, L->ew1, L->ew3, L->ew2, c->top_k,
                         c->aux_loss_coef, &f2, &aux));
      const int64_t bsd[3] = {B, S, D};
      DT_CHECK(dt_ag_op(tape, "reshape", 1, &f2, 3, bsd, 0, NULL, 1, &ff));
      if (aux_total == NULL) {
        aux_total = aux;
      } else {
        dt_var_t at[2] = {aux_total, aux};
        DT_CHECK(dt_ag_op(tape, "add", 2, at, 0, NULL, 0, NULL, 1, &aux_total));
      }
    }
    dt_var_t hf[2] = {h2, ff};
    DT_CHECK(dt_ag_op(tape, "add", 2, hf, 0, NULL, 0, NULL, 1, &h));
    /* block boundary: with a checkpoint policy, cheap intermediates are dropped here */
    dt_var_t keep[2] = {h, aux_total};
    DT_CHECK(dt_tape_checkpoint(tape, aux_total ? 2 : 1, keep));
  }
  dt_var_t n, n2, logits, ce;
  DT_CHECK(dt_nn_rms_norm(tape, h, m->norm, c->norm_eps, &n));
  DT_CHECK(dt_ag_op(tape, "reshape", 1, &n, 2, nd2, 0, NULL, 1, &n2));
  DT_CHECK(dt_nn_linear(tape, n2, m->output, NULL, &logits));
  DT_CHECK(dt_ag_cross_entropy(tape, logits, tgt, &ce));
  if (aux_out) *aux_out = 0.0;
  if (aux_total == NULL) {
    *loss = ce;
    return DT_SUCCESS;
  }
  if (aux_out) {
    float a;
    dt_tensor_t ar;
    dt_placement_t rep[DT_MAX_MESH_DIMS];
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
    DT_CHECK(dt_tensor_redistribute(dt_var_value(aux_total), rep, &ar));
    dt_status_t st = dt_tensor_full(ar, &a, sizeof a);
    dt_tensor_destroy(ar);
    DT_CHECK(st);
    *aux_out = a;
  }
  dt_var_t ca[2] = {ce, aux_total};
  return dt_ag_op(tape, "add", 2, ca, 0, NULL, 0, NULL, 1, loss);
}

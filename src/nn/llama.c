/* llama.c - a Llama-style decoder as a tree of modules (dtensor/module.h): token embedding,
 * blocks of RMSNorm -> causal grouped-query attention with rotary embeddings -> residual ->
 * RMSNorm -> SwiGLU MLP or a top-k mixture of SwiGLU experts -> residual, a final RMSNorm and the
 * output projection, mean cross-entropy (in f32: logits computed in bf16 or f16 are upcast). Each
 * piece's forward is one of the functions of modules.c. Uses only the public API; parameters are
 * placed by the user's plan.
 *
 * Tree (unnamed modules keep their parameters' names flat):
 *   "" root: tok_emb | layers: 0 .. L-1 | norm | output (with tie_embeddings its parameter is
 *      tok_emb's variable: one (V, D) table, listed once as "tok_emb")
 *   block "i": attn_norm | "" attention (linears wq wk wv wo) | ffn_norm | "" mlp (linears w1
 *              w3 w2) or "" moe (router | experts: stacked w1 w3 w2)
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "dtensor/check.h"
#include "dtensor/handle.h"

#define DT_PARAM_NAME_MAX 128

struct dt_llama {
  dt_llama_config_t cfg;
  dt_mesh_t mesh;
  dt_module_t root;
  int64_t numel;
  dt_moe_stats_t moe_stats; /* the last forward's, summed over the layers */
  /* the dt_llama_params view, rebuilt on each call (a wrapper may replace parameters) */
  int n_params, cap_params;
  dt_var_t* params;
  char (*names)[DT_PARAM_NAME_MAX];
  const char** name_ptrs;
  /* context parallelism (dt_llama_set_context_parallel): the cp mesh dim (-1: none) and, during
   * a forward, the batch's geometry: (B, S) tokens placed `seq` (S(1) on cp, S(0) on the batch
   * dims), the residual stream as blocks of rows (P, R, D) placed `rows` (S(0) on the cp and
   * batch dims, P the product of their sizes: each rank's block is its R = B S / P tokens in
   * place; dim 1 is free for sequence parallelism over tp) */
  int cp_dim, cp_n;
  int64_t cp_B, cp_S, cp_P;
  /* how each parameter was initialized, by its full name (dt_llama_init_weights) */
  int n_init, cap_init;
  struct dt__llama_init {
    char name[DT_PARAM_NAME_MAX];
    int kind; /* 0: N(0, std); 1: ones */
    double std;
  } * init;
  dt_placement_t cp_seq[DT_MAX_MESH_DIMS], cp_rows[DT_MAX_MESH_DIMS];
};

static const dt_handle_kind_t dt__llama_kind = {"model"};

static dt_status_t dt__llama_check(dt_llama_t m) {
  return dt_handle_check(m, &dt__llama_kind, "model");
}

void dt_llama_config_defaults(dt_llama_config_t* c) {
  if (c == NULL) return;
  if (c->norm_eps <= 0) c->norm_eps = 1e-5;
  if (c->rope_theta <= 0) c->rope_theta = 10000.0;
  if (c->n_kv_heads <= 0) c->n_kv_heads = c->n_heads;
  if (c->ffn_dim <= 0) { /* in int64: 8 dim overflows an int from dim 2^28; a default past the
                          * int range stays 0, which dt_llama_config_check refuses */
    const int64_t f = ((int64_t)c->dim * 8 / 3 + 7) / 8 * 8;
    c->ffn_dim = f > 0 && f <= INT_MAX ? (int)f : 0;
  }
  if (c->n_experts > 0 && c->top_k <= 0) c->top_k = c->n_experts < 2 ? c->n_experts : 2;
  if (c->aux_loss_coef <= 0 && c->n_experts > 0) c->aux_loss_coef = 0.01;
  if (c->capacity_factor < 0) c->capacity_factor = 0.0;
}

/* ---------------------------------------------------------------------------------------------
 * the modules' forward functions (ctx: the model) */

static const dt_llama_config_t* dt__cfg(dt_module_t m) {
  return &((struct dt_llama*)dt_module_ctx(m))->cfg;
}

static dt_status_t dt__fwd_embedding(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                     int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  return dt_nn_embedding(tape, dt_module_get(m, ""), in[0], &out[0]);
}

static dt_status_t dt__fwd_rms_norm(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                    int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  return dt_nn_rms_norm(tape, in[0], dt_module_get(m, ""), dt__cfg(m)->norm_eps, &out[0]);
}

/* A linear layer without bias: its one parameter is the (out, in) weight. */
static dt_status_t dt__fwd_linear(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                  int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  return dt_nn_linear(tape, in[0], dt_module_get(m, ""), NULL, &out[0]);
}

/* Runs child i of m (a linear layer) on x. */
static dt_status_t dt__child(dt_module_t m, int i, dt_tape_t tape, dt_var_t x, dt_var_t* out) {
  dt_module_t c;
  DT_CHECK(dt_module_child(m, i, &c));
  return dt_module_forward(c, tape, 1, &x, 1, out);
}

/* Context parallelism: x (P, R, F) blocks of rows (placed cp_rows on the cp and batch dims, F
 * sharded or not on the others) as (B, S, F / dh, dh) placed cp_seq there (each rank's rows are
 * its tokens, in order: a view, no copy), or back (to_rows). The rank-local crossing (to_local,
 * from_local) keeps both on the tape. */
static dt_status_t dt__cp_relayout(struct dt_llama* m, dt_tape_t tape, dt_var_t x, int64_t dh,
                                   int to_rows, dt_var_t* out) {
  dt_tensor_t xv = dt_var_value(x);
  int mnd, nd;
  int64_t gs[DT_MAX_DIMS], ls[DT_MAX_DIMS];
  dt_placement_t xp[DT_MAX_MESH_DIMS], pl[DT_MAX_MESH_DIMS];
  dt_dtype_t dt;
  DT_CHECK(dt_mesh_ndim(m->mesh, &mnd));
  DT_CHECK(dt_tensor_ndim(xv, &nd));
  DT_CHECK(dt_tensor_shape(xv, gs));
  DT_CHECK(dt_tensor_local_shape(xv, ls));
  DT_CHECK(dt_tensor_placements(xv, xp));
  DT_CHECK(dt_tensor_dtype(xv, &dt));
  if (nd != (to_rows ? 4 : 3))
    return DT_FAIL(DT_ERR_UNSUPPORTED, "context parallelism: attention %s of %d dims (expected "
                   "%d)", to_rows ? "output" : "input", nd, to_rows ? 4 : 3);
  int64_t shape[4], lshape[4];
  int ond;
  if (to_rows) { /* (B, S, h, dh) -> (P, R, h dh) */
    ond = 3;
    shape[0] = m->cp_P;
    shape[1] = gs[0] * gs[1] / m->cp_P;
    shape[2] = gs[2] * gs[3];
    lshape[0] = 1;
    lshape[1] = ls[0] * ls[1];
    lshape[2] = ls[2] * ls[3];
  } else { /* (P, R, F) -> (B, S, F / dh, dh) */
    ond = 4;
    const int64_t Sl = m->cp_S / m->cp_n;
    shape[0] = m->cp_B;
    shape[1] = m->cp_S;
    shape[2] = gs[2] / dh;
    shape[3] = dh;
    lshape[0] = Sl > 0 ? ls[0] * ls[1] / Sl : 0;
    lshape[1] = Sl;
    lshape[2] = ls[2] / dh;
    lshape[3] = dh;
  }
  for (int i = 0; i < mnd; i++) { /* the heads (features) are dim 2 on both sides */
    const int feat = xp[i].kind == DT_SHARD && xp[i].dim == 2;
    const dt_placement_t want = to_rows ? m->cp_seq[i] : m->cp_rows[i];
    if (m->cp_rows[i].kind == DT_SHARD && dt_placement_equal(xp[i], want))
      pl[i] = to_rows ? m->cp_rows[i] : m->cp_seq[i];
    else if (m->cp_rows[i].kind != DT_SHARD && feat)
      pl[i] = dt_shard(2);
    else if (m->cp_rows[i].kind != DT_SHARD && xp[i].kind == DT_REPLICATE)
      pl[i] = dt_replicate();
    else
    {
      char got[32];
      if (xp[i].kind == DT_SHARD) snprintf(got, sizeof got, "Shard(%d)", xp[i].dim);
      else snprintf(got, sizeof got, "%s", xp[i].kind == DT_PARTIAL ? "Partial" : "Replicate");
      return DT_FAIL(DT_ERR_UNSUPPORTED, "context parallelism: attention %s of %d dims placed %s "
                     "on mesh dim %d (expected %s)", to_rows ? "output" : "input", nd, got, i,
                     m->cp_rows[i].kind == DT_SHARD ? "the tokens' shards"
                                                    : "Replicate or its heads sharded");
    }
  }
  dt_var_t xl, xr, like;
  dt_tensor_t lt;
  DT_CHECK(dt_ag_to_local(tape, x, NULL, &xl));
  DT_CHECK(dt_ag_op(tape, "reshape", 1, &xl, ond, lshape, 0, NULL, 1, &xr));
  DT_CHECK(dt_tensor_meta(m->mesh, dt, ond, shape, pl, &lt));
  dt_status_t st = dt_tape_constant(tape, lt, &like);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(lt);
    return st;
  }
  return dt_ag_from_local(tape, xr, like, out);
}

/* Attention with the sequence sharded over the cp dim: rotary at the tokens' real positions,
 * ring attention over the cp ranks (dt_ring_attention; under bf16 compute it casts to f32 and
 * back itself). q (P, R, H Dh), k, v (P, R, G Dh). */
static dt_status_t dt__cp_attention(struct dt_llama* m, dt_tape_t tape, dt_var_t q, dt_var_t k,
                                    dt_var_t v, dt_var_t* out) {
  const dt_llama_config_t* c = &m->cfg;
  const int64_t dh = c->dim / c->n_heads;
  dt_var_t in[3] = {q, k, v}, x4[3], o4;
  for (int j = 0; j < 3; j++) {
    DT_CHECK(dt__cp_relayout(m, tape, in[j], dh, 0, &x4[j]));
    if (j < 2) { /* (B, S, h, dh): seq dim 1, positions in the load-balanced order of cp_n */
      const int64_t ra[3] = {1, 0, m->cp_n};
      DT_CHECK(dt_ag_op(tape, "rotary", 1, &x4[j], 3, ra, 1, &c->rope_theta, 1, &x4[j]));
    }
  }
  const int64_t aa[5] = {m->cp_dim, 1, 1, 1, 0}; /* causal, (B, S, H, D), balanced, auto */
  DT_CHECK(dt_ag_op(tape, "ring_attention", 3, x4, 5, aa, 0, NULL, 1, &o4));
  return dt__cp_relayout(m, tape, o4, dh, 1, out);
}

/* Children wq, wk, wv, wo (linear layers, so a tensor-parallel plan can hook each). */
static dt_status_t dt__fwd_attention(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                     int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  const dt_llama_config_t* c = dt__cfg(m);
  dt_var_t q, k, v, o;
  DT_CHECK(dt__child(m, 0, tape, in[0], &q));
  DT_CHECK(dt__child(m, 1, tape, in[0], &k));
  DT_CHECK(dt__child(m, 2, tape, in[0], &v));
  struct dt_llama* model = dt_module_ctx(m);
  if (model->cp_dim >= 0)
    DT_CHECK(dt__cp_attention(model, tape, q, k, v, &o));
  else
    DT_CHECK(dt_nn_attention_core(tape, q, k, v, c->n_heads, c->n_kv_heads, c->rope_theta, &o));
  return dt__child(m, 3, tape, o, &out[0]);
}

/* Children w1, w3, w2: w2 (silu(x w1^T) * (x w3^T)), as dt_nn_swiglu. */
static dt_status_t dt__fwd_mlp(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                               int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_var_t a, b, s, ab[2];
  DT_CHECK(dt__child(m, 0, tape, in[0], &a));
  DT_CHECK(dt__child(m, 1, tape, in[0], &b));
  DT_CHECK(dt_ag_op(tape, "silu", 1, &a, 0, NULL, 0, NULL, 1, &s));
  ab[0] = s;
  ab[1] = b;
  DT_CHECK(dt_ag_op(tape, "mul", 2, ab, 0, NULL, 0, NULL, 1, &s));
  return dt__child(m, 2, tape, s, &out[0]);
}

/* The experts module: (x (N, D), router (E, D)) -> (ff (N, D), aux): the routed computation, so
 * that a wrapper of the experts alone (FSDP over the experts on their own mesh) encloses every
 * use of their weights. */
static dt_status_t dt__fwd_experts(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                   int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  struct dt_llama* model = dt_module_ctx(m);
  const dt_llama_config_t* c = &model->cfg;
  dt_var_t w[3];
  static const char* const kW[3] = {"w1", "w3", "w2"};
  for (int k = 0; k < 3; k++) DT_CHECK(dt_module_param(m, kW[k], &w[k]));
  dt_moe_stats_t st;
  DT_CHECK(dt_nn_moe(tape, in[0], in[1], w[0], w[1], w[2], c->top_k, c->capacity_factor,
                     c->aux_loss_coef, &out[0], &out[1], &st));
  model->moe_stats.tokens += st.tokens;
  model->moe_stats.assignments += st.assignments;
  model->moe_stats.dropped += st.dropped;
  model->moe_stats.expert_rows += st.expert_rows;
  model->moe_stats.capacity = st.capacity;
  model->moe_stats.expert_parallel_dim = st.expert_parallel_dim;
  model->moe_stats.local_routing = st.local_routing;
  return DT_SUCCESS;
}

/* The tokens x (B, S, D) as rows (B S, D) for the experts, a view where the batch or the
 * sequence is split: each rank's (b, s, D) block becomes its rows, placed Shard(0) on every mesh
 * dim that splits dim 0 or 1 (data, sequence or tensor parallelism), so that the experts route
 * each rank's own tokens with no communication (dt_nn_moe). The rows' global order is then the
 * ranks' blocks', which a per-token layer does not see. Only for even shards (each block the
 * rows' chunk on every rank, decided from the global shapes alike on every rank) and no Partial
 * or feature shard; else (*viewed 0) a reshape, which moves what the placements need, and for
 * uneven row shards a redistribution of the rows to Shard(0) on those dims (the chunk rule on
 * B S rows: each rank routes its share). */
static dt_status_t dt__moe_rows(dt_tape_t tape, dt_var_t x, dt_var_t* rows, int* viewed) {
  dt_tensor_t xv = dt_var_value(x);
  dt_mesh_t mesh;
  int mnd, msh[DT_MAX_MESH_DIMS];
  int64_t gs[DT_MAX_DIMS], ls[DT_MAX_DIMS], split[2] = {1, 1};
  dt_placement_t xp[DT_MAX_MESH_DIMS], rp[DT_MAX_MESH_DIMS];
  dt_dtype_t dt;
  DT_CHECK(dt_tensor_mesh(xv, &mesh));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  DT_CHECK(dt_mesh_shape(mesh, msh));
  DT_CHECK(dt_tensor_shape(xv, gs));
  DT_CHECK(dt_tensor_local_shape(xv, ls));
  DT_CHECK(dt_tensor_placements(xv, xp));
  DT_CHECK(dt_tensor_dtype(xv, &dt));
  const int64_t nd2[2] = {gs[0] * gs[1], gs[2]};
  int ok = 1, any = 0;
  for (int i = 0; i < mnd; i++) {
    const int rowdim = xp[i].kind == DT_SHARD && (xp[i].dim == 0 || xp[i].dim == 1);
    ok &= rowdim || xp[i].kind == DT_REPLICATE;
    if (rowdim) split[xp[i].dim] *= msh[i];
    any |= rowdim;
    rp[i] = rowdim ? dt_shard(0) : dt_replicate();
  }
  *viewed = ok && any && gs[0] % split[0] == 0 && gs[1] % split[1] == 0;
  if (!*viewed) {
    DT_CHECK(dt_ag_op(tape, "reshape", 1, &x, 2, nd2, 0, NULL, 1, rows));
    /* uneven row shards (a batch of 6 over 4 data ranks): the reshape may gather the rows;
     * split them again (the chunk rule on B S rows), so that each rank still routes its own
     * share, which experts on another mesh (EP over (ep, efsdp)) require */
    return ok && any ? dt_ag_redistribute(tape, *rows, rp, rows) : DT_SUCCESS;
  }
  const int64_t lrows[2] = {ls[0] * ls[1], ls[2]};
  dt_var_t xl, like;
  dt_tensor_t lt;
  DT_CHECK(dt_ag_to_local(tape, x, NULL, &xl));
  DT_CHECK(dt_ag_op(tape, "reshape", 1, &xl, 2, lrows, 0, NULL, 1, &xl));
  DT_CHECK(dt_tensor_meta(mesh, dt, 2, nd2, rp, &lt));
  dt_status_t st = dt_tape_constant(tape, lt, &like);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(lt);
    return st;
  }
  return dt_ag_from_local(tape, xl, like, rows);
}

/* (B, S, D) -> (ff (B, S, D) placed as the input, aux) */
static dt_status_t dt__fwd_moe(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                               int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_tensor_t xv = dt_var_value(in[0]);
  int64_t bsd[DT_MAX_DIMS], ls[DT_MAX_DIMS];
  DT_CHECK(dt_tensor_shape(xv, bsd));
  dt_module_t experts;
  DT_CHECK(dt_module_find(m, "experts", &experts));
  dt_var_t xr[2], f[2];
  int viewed;
  DT_CHECK(dt__moe_rows(tape, in[0], &xr[0], &viewed));
  xr[1] = dt_module_get(m, "router");
  DT_CHECK(dt_module_forward(experts, tape, 2, xr, 2, f));
  out[1] = f[1];
  if (!viewed) return dt_ag_op(tape, "reshape", 1, &f[0], 3, bsd, 0, NULL, 1, &out[0]);
  /* back: the rows in the view's placements (the experts keep them; brought there if a layout
   * of theirs moved them), each rank's block reshaped as the input's */
  dt_placement_t rp[DT_MAX_MESH_DIMS], fp[DT_MAX_MESH_DIMS];
  dt_mesh_t mesh;
  int mnd, same = 1;
  DT_CHECK(dt_tensor_mesh(xv, &mesh));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  DT_CHECK(dt_tensor_placements(dt_var_value(xr[0]), rp));
  DT_CHECK(dt_tensor_placements(dt_var_value(f[0]), fp));
  for (int i = 0; i < mnd; i++) same &= dt_placement_equal(rp[i], fp[i]);
  dt_var_t y = f[0], yl;
  if (!same) DT_CHECK(dt_ag_redistribute(tape, y, rp, &y));
  DT_CHECK(dt_tensor_local_shape(xv, ls));
  DT_CHECK(dt_ag_to_local(tape, y, NULL, &yl));
  DT_CHECK(dt_ag_op(tape, "reshape", 1, &yl, 3, ls, 0, NULL, 1, &yl));
  return dt_ag_from_local(tape, yl, in[0], &out[0]);
}

static dt_status_t dt__to_f32(dt_tape_t tape, dt_var_t* v);

/* (h, aux so far or NULL) -> (h, aux so far or NULL). Children in order: attn_norm, attention,
 * ffn_norm, mlp or moe. */
static dt_status_t dt__fwd_block(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                 int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  dt_module_t attn_norm, attn, ffn_norm, mlp;
  DT_CHECK(dt_module_child(m, 0, &attn_norm));
  DT_CHECK(dt_module_child(m, 1, &attn));
  DT_CHECK(dt_module_child(m, 2, &ffn_norm));
  DT_CHECK(dt_module_child(m, 3, &mlp));
  dt_var_t h = in[0], aux_total = in[1], a, o, h2, mm, ff[2] = {NULL, NULL};
  DT_CHECK(dt_module_forward(attn_norm, tape, 1, &h, 1, &a));
  DT_CHECK(dt_module_forward(attn, tape, 1, &a, 1, &o));
  dt_var_t ho[2] = {h, o};
  DT_CHECK(dt_ag_op(tape, "add", 2, ho, 0, NULL, 0, NULL, 1, &h2));
  DT_CHECK(dt_module_forward(ffn_norm, tape, 1, &h2, 1, &mm));
  int moe = dt__cfg(m)->n_experts > 0;
  DT_CHECK(dt_module_forward(mlp, tape, 1, &mm, moe ? 2 : 1, ff));
  if (moe) {
    if (aux_total == NULL) {
      aux_total = ff[1];
    } else { /* in f32: a wrapper may have cast the running total at the block boundary (FSDP
              * casts its inputs to the compute dtype), the layer's is f32 */
      DT_CHECK(dt__to_f32(tape, &aux_total));
      dt_var_t at[2] = {aux_total, ff[1]};
      DT_CHECK(dt__to_f32(tape, &at[1]));
      DT_CHECK(dt_ag_op(tape, "add", 2, at, 0, NULL, 0, NULL, 1, &aux_total));
    }
  }
  dt_var_t hf[2] = {h2, ff[0]};
  DT_CHECK(dt_ag_op(tape, "add", 2, hf, 0, NULL, 0, NULL, 1, &out[0]));
  out[1] = aux_total;
  /* block boundary: with a checkpoint policy, cheap intermediates are dropped here */
  dt_var_t keep[2] = {out[0], aux_total};
  return dt_tape_checkpoint(tape, aux_total ? 2 : 1, keep);
}

/* *v cast to f32 (recorded) when it is another floating dtype. */
static dt_status_t dt__to_f32(dt_tape_t tape, dt_var_t* v) {
  dt_dtype_t t;
  DT_CHECK(dt_tensor_dtype(dt_var_value(*v), &t));
  if (t == DT_F32) return DT_SUCCESS;
  const int64_t to = DT_F32;
  return dt_ag_op(tape, "cast", 1, v, 1, &to, 0, NULL, 1, v);
}

/* (tokens (B, S), targets (N)) -> (loss in f32, aux in f32 or NULL) */
static dt_status_t dt__fwd_llama(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                 int n_out, dt_var_t* out) {
  (void)n_in;
  (void)n_out;
  const dt_llama_config_t* c = dt__cfg(m);
  dt_module_t emb, layers, norm, output;
  DT_CHECK(dt_module_find(m, "tok_emb", &emb));
  DT_CHECK(dt_module_find(m, "layers", &layers));
  DT_CHECK(dt_module_find(m, "norm", &norm));
  DT_CHECK(dt_module_find(m, "output", &output));
  dt_var_t h, aux = NULL;
  DT_CHECK(dt_module_forward(emb, tape, 1, &in[0], 1, &h)); /* (B, S, D) */
  for (int l = 0; l < c->n_layers; l++) {
    dt_module_t block;
    DT_CHECK(dt_module_child(layers, l, &block));
    dt_var_t io[2] = {h, aux};
    DT_CHECK(dt_module_forward(block, tape, 2, io, 2, io));
    h = io[0];
    aux = io[1];
  }
  int64_t bsd[DT_MAX_DIMS];
  DT_CHECK(dt_tensor_shape(dt_var_value(h), bsd));
  const int64_t nd2[2] = {bsd[0] * bsd[1], bsd[2]};
  dt_var_t n, n2, logits, ce;
  DT_CHECK(dt_module_forward(norm, tape, 1, &h, 1, &n));
  DT_CHECK(dt_ag_op(tape, "reshape", 1, &n, 2, nd2, 0, NULL, 1, &n2));
  DT_CHECK(dt_module_forward(output, tape, 1, &n2, 1, &logits));
  /* the loss in f32 whatever the compute dtype (FSDP's param_dtype bf16 makes bf16 logits): the
   * cross-entropy of the logits upcast to f32 (a recorded cast: its backward hands the output
   * projection a gradient in the logits' dtype), so the loss is not rounded to 8 bits of
   * mantissa; the MoE auxiliary loss likewise */
  DT_CHECK(dt__to_f32(tape, &logits));
  if (c->ignore_targets) { /* targets of -100 count nowhere (cross_entropy's ignore_index) */
    const int64_t ia[2] = {DT_LOSS_MEAN, -100};
    dt_var_t lt[2] = {logits, in[1]};
    DT_CHECK(dt_ag_op(tape, "cross_entropy", 2, lt, 2, ia, 0, NULL, 1, &ce));
  } else {
    DT_CHECK(dt_ag_cross_entropy(tape, logits, in[1], &ce));
  }
  if (aux != NULL) DT_CHECK(dt__to_f32(tape, &aux));
  out[1] = aux;
  if (aux == NULL) {
    out[0] = ce;
    return DT_SUCCESS;
  }
  dt_var_t ca[2] = {ce, aux};
  return dt_ag_op(tape, "add", 2, ca, 0, NULL, 0, NULL, 1, &out[0]);
}

/* ---------------------------------------------------------------------------------------------
 * construction */

/* A module under `parent` (NULL: none) with `forward`; *out borrowed (the parent owns it). */
static dt_status_t dt__module(dt_llama_t m, dt_module_t parent, const char* name,
                              dt_module_forward_fn forward, dt_module_t* out) {
  DT_CHECK(dt_module_create(name, forward, m, out));
  dt_status_t st = dt_module_add_child(parent, *out);
  if (st != DT_SUCCESS) dt_module_destroy(*out);
  return st;
}

/* A parameter `local` of module `mod`, initialized and placed under its full name (kind 0:
 * N(0, std); 1: ones). */
static dt_status_t dt__param(dt_llama_t m, const char* plan, dt_module_t mod, const char* local,
                             const char* full, int nd, const int64_t* shape, int kind, double std) {
  if (strlen(full) >= DT_PARAM_NAME_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "parameter name '%s' too long", full);
  if (m->n_init == m->cap_init) {
    const int cap = m->cap_init ? 2 * m->cap_init : 16;
    struct dt__llama_init* ni = realloc(m->init, sizeof *ni * (size_t)cap);
    if (ni == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "parameter init table");
    m->init = ni;
    m->cap_init = cap;
  }
  dt_var_t v;
  if (m->cfg.defer_init) { /* a layout only: the wrappers place it, init_weights fills it */
    int mnd;
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    dt_tensor_t t;
    DT_CHECK(dt_mesh_ndim(m->mesh, &mnd));
    DT_CHECK(dt_nn_plan_lookup(plan, full, mnd, pl));
    DT_CHECK(dt_tensor_meta(m->mesh, DT_F32, nd, shape, pl, &t));
    dt_status_t s0 = dt_var_leaf(t, 1, &v);
    if (s0 != DT_SUCCESS) {
      dt_tensor_destroy(t);
      return s0;
    }
  } else {
    DT_CHECK(dt_nn_param(m->mesh, plan, full, nd, shape, kind ? DT_INIT_ONES : DT_INIT_NORMAL,
                         std, m->cfg.seed, &v));
  }
  struct dt__llama_init* e = &m->init[m->n_init++];
  snprintf(e->name, sizeof e->name, "%s", full);
  e->kind = kind;
  e->std = std;
  dt_status_t st = dt_module_add_param(mod, local, v);
  if (st != DT_SUCCESS) {
    dt_var_destroy(v);
    return st;
  }
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  m->numel += n;
  return DT_SUCCESS;
}

/* A one-parameter module (the parameter unnamed, so it carries the module's path). */
static dt_status_t dt__leaf_module(dt_llama_t m, const char* plan, dt_module_t parent,
                                   const char* name, const char* full,
                                   dt_module_forward_fn forward, int nd, const int64_t* shape,
                                   int kind, double std) {
  dt_module_t mod;
  DT_CHECK(dt__module(m, parent, name, forward, &mod));
  return dt__param(m, plan, mod, "", full, nd, shape, kind, std);
}

static dt_status_t dt__build(dt_llama_t m, const char* plan) {
  const dt_llama_config_t* c = &m->cfg;
  int D = c->dim, Dh = c->dim / c->n_heads, H = c->n_heads, G = c->n_kv_heads, F = c->ffn_dim,
      V = c->vocab, E = c->n_experts;
  double std = 0.02, ostd = 0.02 / sqrt(2.0 * c->n_layers);
  const int64_t emb[2] = {V, D}, vecD[1] = {D}, sq[2] = {(int64_t)H * Dh, D},
                skv[2] = {(int64_t)G * Dh, D}, so[2] = {D, (int64_t)H * Dh}, s1[2] = {F, D},
                s2[2] = {D, F}, sr[2] = {E, D}, se1[3] = {E, F, D}, se2[3] = {E, D, F};
  DT_CHECK(dt_module_create("", dt__fwd_llama, m, &m->root));
  DT_CHECK(dt__leaf_module(m, plan, m->root, "tok_emb", "tok_emb", dt__fwd_embedding, 2, emb, 0,
                           std));
  dt_module_t layers;
  DT_CHECK(dt__module(m, m->root, "layers", NULL, &layers));
  char nm[DT_PARAM_NAME_MAX], blk[16];
  for (int l = 0; l < c->n_layers; l++) {
    dt_module_t block, attn, mlp;
    snprintf(blk, sizeof blk, "%d", l);
    DT_CHECK(dt__module(m, layers, blk, dt__fwd_block, &block));
#define DT__FULL(suffix) (snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix), nm)
    DT_CHECK(dt__leaf_module(m, plan, block, "attn_norm", DT__FULL("attn_norm"), dt__fwd_rms_norm,
                             1, vecD, 1, 0.0));
    DT_CHECK(dt__module(m, block, "", dt__fwd_attention, &attn));
    DT_CHECK(dt__leaf_module(m, plan, attn, "wq", DT__FULL("wq"), dt__fwd_linear, 2, sq, 0, std));
    DT_CHECK(dt__leaf_module(m, plan, attn, "wk", DT__FULL("wk"), dt__fwd_linear, 2, skv, 0, std));
    DT_CHECK(dt__leaf_module(m, plan, attn, "wv", DT__FULL("wv"), dt__fwd_linear, 2, skv, 0, std));
    DT_CHECK(dt__leaf_module(m, plan, attn, "wo", DT__FULL("wo"), dt__fwd_linear, 2, so, 0, ostd));
    DT_CHECK(dt__leaf_module(m, plan, block, "ffn_norm", DT__FULL("ffn_norm"), dt__fwd_rms_norm,
                             1, vecD, 1, 0.0));
    if (E == 0) {
      DT_CHECK(dt__module(m, block, "", dt__fwd_mlp, &mlp));
      DT_CHECK(dt__leaf_module(m, plan, mlp, "w1", DT__FULL("w1"), dt__fwd_linear, 2, s1, 0, std));
      DT_CHECK(dt__leaf_module(m, plan, mlp, "w3", DT__FULL("w3"), dt__fwd_linear, 2, s1, 0, std));
      DT_CHECK(dt__leaf_module(m, plan, mlp, "w2", DT__FULL("w2"), dt__fwd_linear, 2, s2, 0, ostd));
    } else {
      dt_module_t experts;
      DT_CHECK(dt__module(m, block, "", dt__fwd_moe, &mlp));
      DT_CHECK(dt__param(m, plan, mlp, "router", DT__FULL("router"), 2, sr, 0, std));
      DT_CHECK(dt__module(m, mlp, "experts", dt__fwd_experts, &experts));
      DT_CHECK(dt__param(m, plan, experts, "w1", DT__FULL("experts.w1"), 3, se1, 0, std));
      DT_CHECK(dt__param(m, plan, experts, "w3", DT__FULL("experts.w3"), 3, se1, 0, std));
      DT_CHECK(dt__param(m, plan, experts, "w2", DT__FULL("experts.w2"), 3, se2, 0, ostd));
    }
#undef DT__FULL
  }
  DT_CHECK(dt__leaf_module(m, plan, m->root, "norm", "norm", dt__fwd_rms_norm, 1, vecD, 1, 0.0));
  if (!c->tie_embeddings)
    return dt__leaf_module(m, plan, m->root, "output", "output", dt__fwd_linear, 2, emb, 0, std);
  /* tied: the output module holds the embedding's variable itself (logits = h tok_emb^T), so
   * both uses record one leaf whose gradient is their sum; counted once */
  dt_module_t output;
  dt_var_t table;
  DT_CHECK(dt__module(m, m->root, "output", dt__fwd_linear, &output));
  DT_CHECK(dt_module_param(m->root, "tok_emb", &table));
  return dt_module_add_param(output, "", table);
}

/* With tie_embeddings the one table takes the plan's tok_emb placement: an output entry that
 * places it otherwise is refused (both names, both placements). */
static dt_status_t dt__tied_plan_check(dt_mesh_t mesh, const char* plan) {
  int mnd;
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  dt_placement_t e[DT_MAX_MESH_DIMS], o[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_nn_plan_lookup(plan, "tok_emb", mnd, e));
  DT_CHECK(dt_nn_plan_lookup(plan, "output", mnd, o));
  int same = 1;
  for (int d = 0; d < mnd; d++) same &= dt_placement_equal(e[d], o[d]);
  if (same) return DT_SUCCESS;
  char te[96], to[96];
  DT_CHECK(dt_placements_format(e, mnd, ",", te, sizeof te));
  DT_CHECK(dt_placements_format(o, mnd, ",", to, sizeof to));
  return DT_FAIL(DT_ERR_INVALID_ARG, "tie_embeddings: the plan places 'tok_emb' %s and 'output' "
                 "%s, but tied they are one (V, D) table with one placement: give both the same "
                 "(Shard(0), the vocabulary, is what tensor parallelism gives both)", te, to);
}

/* The first constraint c breaks, named with its values. */
static dt_status_t dt__llama_config_check(const dt_llama_config_t* c) {
  const struct {
    const char* name;
    long long v;
  } pos[] = {{"dim", c->dim},   {"n_layers", c->n_layers}, {"n_heads", c->n_heads},
             {"vocab", c->vocab}, {"seq_len", c->seq_len}};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: %s=%lld (valid: 1 or more)", pos[i].name,
                     pos[i].v);
  if (c->dim % c->n_heads != 0 || (c->dim / c->n_heads) % 2 != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: dim=%d over n_heads=%d: the head dim must "
                   "be a whole even number (rotary positions rotate pairs)", c->dim, c->n_heads);
  if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: n_kv_heads=%d must divide n_heads=%d",
                   c->n_kv_heads, c->n_heads);
  if (c->n_experts < 0 || c->n_experts > 64)
    return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: n_experts=%d (valid: 0, dense, to 64)",
                   c->n_experts);
  if (c->n_experts > 0 && (c->top_k < 1 || c->top_k > c->n_experts))
    return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: top_k=%d (valid: 1 to n_experts=%d)",
                   c->top_k, c->n_experts);
  /* the switches: 0 or 1 only (a 2 or a -1 is a mistake, not another way to say on) */
  const struct {
    const char* name;
    int v;
    const char* on;
  } sw[] = {{"ignore_targets", c->ignore_targets, "targets of -100 count nowhere"},
            {"tie_embeddings", c->tie_embeddings, "the output projection is tok_emb"},
            {"defer_init", c->defer_init, "parameters built as layouts"}};
  for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
    if (sw[i].v != 0 && sw[i].v != 1)
      return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: %s=%d (valid: 0, or 1: %s)", sw[i].name,
                     sw[i].v, sw[i].on);
  if (!isfinite(c->capacity_factor))
    return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: capacity_factor=%g must be finite",
                   c->capacity_factor);
  if (c->ffn_dim <= 0) /* after the defaults: only a default too large for an int */
    return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: ffn_dim=0 and dim=%d: the default ffn_dim "
                   "(8 dim / 3, rounded up to 8) is %lld, beyond an int (set ffn_dim)", c->dim,
                   (long long)(((int64_t)c->dim * 8 / 3 + 7) / 8 * 8));
  /* left 0 (or negative) they take the defaults; NaN and inf are bad values (a NaN eps or theta
   * made every loss NaN without an error) */
  const struct {
    const char* name;
    double v;
  } fin[] = {{"norm_eps", c->norm_eps}, {"rope_theta", c->rope_theta},
             {"aux_loss_coef", c->aux_loss_coef}};
  for (size_t i = 0; i < sizeof fin / sizeof fin[0]; i++)
    if (!isfinite(fin[i].v))
      return DT_FAIL(DT_ERR_INVALID_ARG, "llama config: %s=%g must be finite (0: the default)",
                     fin[i].name, fin[i].v);
  return DT_SUCCESS;
}

static dt_status_t dt__llama_config_check_public(const dt_llama_config_t* cfg_in) {
  DT_ARG_NOT_NULL(cfg_in);
  dt_llama_config_t cfg = *cfg_in;
  dt_llama_config_defaults(&cfg);
  return dt__llama_config_check(&cfg);
}

dt_status_t dt_llama_config_check(const dt_llama_config_t* cfg) {
  DT_ENTRY_RETURN(dt__llama_config_check_public(cfg));
}

static dt_status_t dt__llama_create(dt_mesh_t mesh, const dt_llama_config_t* cfg_in,
                                   const char* plan, dt_llama_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(cfg_in);
  dt_llama_config_t cfg = *cfg_in;
  dt_llama_config_defaults(&cfg);
  DT_CHECK(dt__llama_config_check(&cfg));
  if (cfg.tie_embeddings) DT_CHECK(dt__tied_plan_check(mesh, plan));
  dt_llama_t m = calloc(1, sizeof *m);
  if (m == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating the model");
  if (dt_handle_register(m, &dt__llama_kind) != DT_SUCCESS) {
    free(m);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "registering the model handle");
  }
  m->cfg = cfg;
  m->mesh = mesh;
  m->cp_dim = -1;
  m->cp_n = 1;
  dt_status_t st = dt__build(m, plan);
  if (st != DT_SUCCESS) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    dt_llama_destroy(m);
    return DT_FAIL(st, "%s", msg);
  }
  *out = m;
  return DT_SUCCESS;
}

dt_status_t dt_llama_create(dt_mesh_t mesh, const dt_llama_config_t* cfg, const char* plan,
                            dt_llama_t* out) {
  DT_ENTRY_RETURN(dt__llama_create(mesh, cfg, plan, out));
}

static dt_status_t dt__llama_destroy(dt_llama_t m) {
  if (m == NULL) return DT_SUCCESS;
  DT_CHECK(dt_handle_unregister(m, &dt__llama_kind, "model"));
  dt_module_destroy(m->root);
  free(m->init);
  free(m->params);
  free(m->names);
  free(m->name_ptrs);
  dt_handle_free(m);
  return DT_SUCCESS;
}

dt_status_t dt_llama_destroy(dt_llama_t m) { DT_ENTRY_RETURN(dt__llama_destroy(m)); }

static dt_status_t dt__llama_params(dt_llama_t m, dt_var_t** params, const char* const** names,
                                    int* n, int64_t* numel);

static dt_status_t dt__llama_init_weights(dt_llama_t m) {
  dt_var_t* params;
  const char* const* names;
  int n;
  DT_CHECK(dt__llama_params(m, &params, &names, &n, NULL));
  for (int i = 0; i < n; i++) {
    const struct dt__llama_init* e = NULL;
    for (int j = 0; j < m->n_init && e == NULL; j++)
      if (strcmp(m->init[j].name, names[i]) == 0) e = &m->init[j];
    if (e == NULL)
      return DT_FAIL(DT_ERR_INVALID_USAGE, "parameter '%s' is not one the model made (was it "
                     "replaced under another name?)", names[i]);
    DT_CHECK(dt_nn_param_init(params[i], names[i], e->kind ? DT_INIT_ONES : DT_INIT_NORMAL,
                              e->std, m->cfg.seed));
  }
  return DT_SUCCESS;
}

dt_status_t dt_llama_init_weights(dt_llama_t m) { DT_ENTRY_RETURN(dt__llama_init_weights(m)); }

static dt_status_t dt__llama_module(dt_llama_t m, dt_module_t* root) {
  DT_ARG_NOT_NULL(root);
  *root = NULL;
  DT_CHECK(dt__llama_check(m));
  *root = m->root;
  return DT_SUCCESS;
}

dt_status_t dt_llama_module(dt_llama_t m, dt_module_t* root) {
  DT_ENTRY_RETURN(dt__llama_module(m, root));
}

static int dt__collect(const char* name, dt_var_t p, void* ctx) {
  dt_llama_t m = ctx;
  if (m->n_params == m->cap_params) return 1; /* counted beforehand: cannot happen */
  snprintf(m->names[m->n_params], DT_PARAM_NAME_MAX, "%s", name);
  m->params[m->n_params++] = p;
  return 0;
}

static dt_status_t dt__llama_params(dt_llama_t m, dt_var_t** params, const char* const** names,
                                    int* n, int64_t* numel) {
  DT_CHECK(dt__llama_check(m));
  int count;
  DT_CHECK(dt_module_num_params(m->root, &count));
  if (count > m->cap_params) {
    dt_var_t* pv = realloc(m->params, sizeof(dt_var_t) * (size_t)count);
    if (pv) m->params = pv;
    char(*nv)[DT_PARAM_NAME_MAX] = realloc(m->names, sizeof *nv * (size_t)count);
    if (nv) m->names = nv;
    const char** np = realloc(m->name_ptrs, sizeof(char*) * (size_t)count);
    if (np) m->name_ptrs = np;
    if (!pv || !nv || !np) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "parameter table");
    m->cap_params = count;
  }
  m->n_params = 0;
  DT_CHECK(dt_module_for_each_param(m->root, dt__collect, m));
  for (int i = 0; i < m->n_params; i++) m->name_ptrs[i] = m->names[i];
  if (params) *params = m->params;
  if (names) *names = m->name_ptrs;
  if (n) *n = m->n_params;
  if (numel) *numel = m->numel;
  return DT_SUCCESS;
}

dt_status_t dt_llama_params(dt_llama_t m, dt_var_t** params, const char* const** names, int* n,
                            int64_t* numel) {
  DT_ENTRY_RETURN(dt__llama_params(m, params, names, n, numel));
}

static dt_status_t dt__llama_moe_stats(dt_llama_t m, dt_moe_stats_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  DT_CHECK(dt__llama_check(m));
  *out = m->moe_stats;
  return DT_SUCCESS;
}

dt_status_t dt_llama_moe_stats(dt_llama_t m, dt_moe_stats_t* out) {
  DT_ENTRY_RETURN(dt__llama_moe_stats(m, out));
}

double dt_llama_flops_per_token(const dt_llama_config_t* cfg_in) {
  if (cfg_in == NULL) return 0.0;
  dt_llama_config_t c = *cfg_in;
  dt_llama_config_defaults(&c);
  double D = c.dim, Dh = (double)c.dim / c.n_heads, H = c.n_heads, G = c.n_kv_heads, F = c.ffn_dim;
  double attn_proj = 2.0 * D * (H * Dh + 2 * G * Dh + H * Dh);
  double attn_core = 2.0 * 2.0 * H * Dh * c.seq_len / 2.0; /* causal: half the keys on average */
  double mlp = 2.0 * 3.0 * D * F * (c.n_experts > 0 ? c.top_k : 1); /* routed: top_k experts */
  double router = c.n_experts > 0 ? 2.0 * D * c.n_experts : 0.0;
  return c.n_layers * (attn_proj + attn_core + mlp + router) + 2.0 * D * c.vocab;
}

/* ---------------------------------------------------------------------------------------------
 * forward */

/* Context parallelism: the batch's geometry from the tokens' layout (B, S): Shard(1) on the cp
 * dim, Shard(0) or Replicate elsewhere, the targets alike, S split into 2 cp chunks, B evenly
 * over the batch dims (each rank's rows are then exactly its tokens). */
static dt_status_t dt__cp_geometry(dt_llama_t m, dt_tensor_t tokens, dt_tensor_t targets,
                                   const int64_t* ts) {
  int mnd, tnd;
  dt_placement_t tp[DT_MAX_MESH_DIMS], gp[DT_MAX_MESH_DIMS];
  dt_mesh_t tm, gm;
  DT_CHECK(dt_tensor_mesh(tokens, &tm));
  DT_CHECK(dt_tensor_mesh(targets, &gm));
  if (tm != m->mesh || gm != m->mesh) /* their placements are read per dim of the model's mesh */
    return DT_FAIL(DT_ERR_INVALID_ARG, "context parallelism: the %s must live on the model's mesh",
                   tm != m->mesh ? "tokens" : "targets");
  DT_CHECK(dt_mesh_ndim(m->mesh, &mnd));
  DT_CHECK(dt_tensor_placements(tokens, tp));
  DT_CHECK(dt_tensor_ndim(targets, &tnd));
  int64_t gs[DT_MAX_DIMS];
  DT_CHECK(dt_tensor_shape(targets, gs));
  if (tnd != 2 || gs[0] != ts[0] || gs[1] != ts[1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "context parallelism: targets must be (B, S) = (%lld, "
                   "%lld) like the tokens", (long long)ts[0], (long long)ts[1]);
  DT_CHECK(dt_tensor_placements(targets, gp));
  int64_t batch_parts = 1;
  for (int i = 0; i < mnd; i++) {
    int size;
    DT_CHECK(dt_mesh_size(m->mesh, i, &size));
    const dt_placement_t p = tp[i];
    const int ok = i == m->cp_dim ? (p.kind == DT_SHARD && p.dim == 1)
                                  : (p.kind == DT_REPLICATE || (p.kind == DT_SHARD && p.dim == 0));
    if (!ok || !dt_placement_equal(p, gp[i]))
      return DT_FAIL(DT_ERR_INVALID_ARG, "context parallelism over mesh dim %d: tokens and "
                     "targets must be Shard(1) there (the sequence, in the load-balanced order of "
                     "dt_cp_position) and Shard(0) or Replicate on the other dims; mesh dim %d "
                     "differs", m->cp_dim, i);
    if (p.kind == DT_SHARD && p.dim == 0) batch_parts *= size;
    m->cp_seq[i] = p;
    m->cp_rows[i] = p.kind == DT_SHARD ? dt_shard(0) : dt_replicate();
  }
  if (ts[1] % (2 * (int64_t)m->cp_n) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "context parallelism over %d ranks: the sequence of %lld "
                   "tokens must split into %d equal chunks (pad it to a multiple of %d)", m->cp_n,
                   (long long)ts[1], 2 * m->cp_n, 2 * m->cp_n);
  if (ts[0] % batch_parts != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "context parallelism: the batch of %lld must split evenly "
                   "over its %lld data-parallel ranks", (long long)ts[0], (long long)batch_parts);
  m->cp_B = ts[0];
  m->cp_S = ts[1];
  m->cp_P = batch_parts * m->cp_n;
  return DT_SUCCESS;
}

static dt_status_t dt__llama_set_cp(dt_llama_t m, int mesh_dim) {
  DT_CHECK(dt__llama_check(m));
  int mnd;
  DT_CHECK(dt_mesh_ndim(m->mesh, &mnd));
  if (mesh_dim < -1 || mesh_dim >= mnd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "mesh_dim=%d: the model's mesh has %d dims (-1: off)",
                   mesh_dim, mnd);
  int n = 1;
  if (mesh_dim >= 0) DT_CHECK(dt_mesh_size(m->mesh, mesh_dim, &n));
  const dt_llama_config_t* c = &m->cfg;
  if (mesh_dim >= 0 && c->seq_len % (2 * n) != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "context parallelism over mesh dim %d (%d ranks): seq_len "
                   "%d must be a multiple of %d (2 chunks per rank)", mesh_dim, n, c->seq_len,
                   2 * n);
  m->cp_dim = n > 1 ? mesh_dim : -1; /* one rank holds the whole sequence: nothing to split */
  m->cp_n = n;
  return DT_SUCCESS;
}

dt_status_t dt_llama_set_context_parallel(dt_llama_t m, int mesh_dim) {
  DT_ENTRY_RETURN(dt__llama_set_cp(m, mesh_dim));
}

static dt_status_t dt__llama_forward(dt_llama_t m, dt_tape_t tape, dt_tensor_t tokens,
                                     dt_tensor_t targets, dt_var_t* loss, double* aux_out) {
  DT_ARG_NOT_NULL(loss);
  *loss = NULL;
  DT_CHECK(dt__llama_check(m));
  DT_ARG_NOT_NULL(tape);
  const dt_llama_config_t* c = &m->cfg;
  int nd;
  int64_t ts[DT_MAX_DIMS];
  DT_CHECK(dt_tensor_ndim(tokens, &nd));
  DT_CHECK(dt_tensor_shape(tokens, ts));
  if (nd != 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tokens has %d dims (valid: 2, (B, S) with S <= seq_len "
                   "%d)", nd, c->seq_len);
  if (ts[1] > c->seq_len)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tokens (B, S) has S=%lld (valid: at most seq_len %d)",
                   (long long)ts[1], c->seq_len);
  int64_t N = ts[0] * ts[1];
  /* the tape keeps its own copies of the ids (the backward pass needs them) */
  dt_tensor_t tok_copy, tgt_copy;
  const int64_t flat[1] = {N};
  dt_status_t st0;
  if (m->cp_dim >= 0) { /* context parallelism: the ids as blocks of rows (P, R), each rank's
                         * own tokens in place; the targets flattened alike */
    DT_CHECK(dt__cp_geometry(m, tokens, targets, ts));
    const int64_t blocks[2] = {m->cp_P, N / m->cp_P};
    DT_CHECK(dt_tensor_view_local(tokens, 0, 2, blocks, m->cp_rows, &tok_copy));
    st0 = dt_tensor_view_local(targets, 0, 1, flat, m->cp_rows, &tgt_copy);
  } else {
    DT_CHECK(dt_op_run("reshape", 1, &tokens, 2, ts, 0, NULL, &tok_copy));
    st0 = dt_op_run("reshape", 1, &targets, 1, flat, 0, NULL, &tgt_copy);
  }
  if (st0 != DT_SUCCESS) {
    dt_tensor_destroy(tok_copy);
    return st0;
  }
  dt_var_t io[2];
  st0 = dt_tape_constant(tape, tok_copy, &io[0]);
  if (st0 != DT_SUCCESS) {
    dt_tensor_destroy(tok_copy);
    dt_tensor_destroy(tgt_copy);
    return st0;
  }
  st0 = dt_tape_constant(tape, tgt_copy, &io[1]);
  if (st0 != DT_SUCCESS) {
    dt_tensor_destroy(tgt_copy);
    return st0;
  }
  dt_var_t res[2];
  memset(&m->moe_stats, 0, sizeof m->moe_stats);
  m->moe_stats.expert_parallel_dim = -1;
  DT_CHECK(dt_module_forward(m->root, tape, 2, io, 2, res));
  if (aux_out) *aux_out = 0.0;
  if (aux_out && res[1] != NULL) {
    float a;
    dt_tensor_t ar;
    dt_placement_t rep[DT_MAX_MESH_DIMS];
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
    DT_CHECK(dt_tensor_redistribute(dt_var_value(res[1]), rep, &ar));
    dt_status_t st = dt_tensor_gather_full(ar, &a, sizeof a);
    dt_tensor_destroy(ar);
    DT_CHECK(st);
    *aux_out = a;
  }
  *loss = res[0];
  return DT_SUCCESS;
}

dt_status_t dt_llama_forward(dt_llama_t m, dt_tape_t tape, dt_tensor_t tokens, dt_tensor_t targets,
                             dt_var_t* loss, double* aux_out) {
  DT_ENTRY_RETURN(dt__llama_forward(m, tape, tokens, targets, loss, aux_out));
}

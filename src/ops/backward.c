/* backward.c - backward rules, one per differentiable op (named by the op table), each built from
 * registry ops so the backward goes through the same strategy selection and redistribution as the
 * forward. A rule sees the forward's inputs and outputs through a dt_grad_ctx_t, not the tape.
 *
 * g is the output gradient. Broadcast inputs get the gradient summed over their broadcast dims.
 *   add/sub: g, +-g          mul: g b, g a           div: g / b, -(g / b) out
 *   mm: g b^T, a^T g         bmm: per batch          linear: g w, g^T x, sum_rows g
 *   exp: g out  log: g / x  sqrt: g / (2 out)  rsqrt: -g out^3 / 2  pow: g p x^(p-1)
 *   sin: g cos(x)  cos: -(g sin(x))  reciprocal: -(g (out out))  log1p: g / (x + 1)
 *   expm1: g (out + 1)  erf: 2 / sqrt(pi) exp(-(x x)) g
 *   (PyTorch's formulas, rounded op by op as its bf16 autograd)
 *   floor, ceil, round, trunc, sign: zeros (piecewise constant, as PyTorch's zeros_like(grad))
 *   relu/silu/gelu/sigmoid/tanh: act_grad          softmax: out (g - sum(g out))
 *   log_softmax: g - exp(out) sum(g)               sum/mean: g expanded (/ count)
 *   var: 2 g (x - mean) / (N - c)                  std: g (x - mean) / ((N - c) out), 0 at out 0
 *   prod: g times the product of the others (out / x without zeros; 0 past one zero)
 *   rms_norm/layer_norm: *_norm_grad               embedding: embedding_grad
 *   views: g reshaped back  permute: inverse      cat: narrow pieces
 *   tril/triu: tril/triu(g)  cumsum: cumsum(g) from the other end
 *   stack: narrow pieces, the new dim squeezed
 *   index_select: index_add of g into zeros along dim
 *   rotary: inverse rotation                       sdpa: sdpa_grad (recomputes attention)
 *   dropout: the same mask (same seed, same global indices)
 *   gather: scatter_add into zeros  scatter_add: g, gather(g)  topk: scatter of g into zeros
 *   cross_entropy: (softmax(logits) - onehot) scaled by g and each row's weight (mean:
 *                  1 / count; sum: 1; ignored: 0), computed class-sharded
 *   redistribute: back to the source placements, Partial -> Replicate (kept where g has it)
 *   grouped_mm (x, w, counts): grouped_mm(g, w) with the other transpose, grouped_mm_wgrad
 *                  (g_e^T x_e, or x_e^T g_e for trans 0); counts none
 *   index_add: g, embedding(g, idx) (the rows the sources were added to)
 */
#include <math.h>

#include "ops/ops.h"

/* A scope of temporaries freed together. */
typedef struct {
  dt_tensor_t t[16];
  int n;
} dt__scope_t;

static dt_tensor_t dt__keep(dt__scope_t* s, dt_tensor_t t) {
  if (s->n < 16) s->t[s->n++] = t;
  return t;
}
static void dt__scope_free(dt__scope_t* s) {
  for (int i = 0; i < s->n; i++) dt__tensor_free(s->t[i]);
  s->n = 0;
}

static dt_status_t dt__scale(dt_tensor_t a, double s, dt_tensor_t* out) {
  return dt__opa(DT_OP_MUL_SCALAR, 1, &a, 0, NULL, 1, &s, out);
}
static dt_status_t dt__reshape(dt_tensor_t a, int nd, const int64_t* shape, dt_tensor_t* out) {
  return dt__opa(DT_OP_RESHAPE, 1, &a, nd, shape, 0, NULL, out);
}
static dt_status_t dt__clone(dt_tensor_t a, dt_tensor_t* out) {
  return dt__reshape(a, a->layout.ndim, a->layout.shape, out);
}
static dt_status_t dt__zeros_like(dt_tensor_t x, dt_tensor_t* out) {
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = dt_replicate();
  return dt_tensor_zeros(x->mesh, x->dtype, x->layout.ndim, x->layout.shape, pl, out);
}

/* g summed down to `x`'s shape (numpy broadcasting undone); a new tensor. */
static dt_status_t dt__unbroadcast(dt_tensor_t g, dt_tensor_t x, dt_tensor_t* out) {
  int gd = g->layout.ndim, xd = x->layout.ndim, off = gd - xd;
  int64_t args[1 + DT_MAX_DIMS];
  int na = 1;
  args[0] = 1; /* keepdim */
  for (int d = 0; d < gd; d++)
    if (d < off || (x->layout.shape[d - off] == 1 && g->layout.shape[d] != 1)) args[na++] = d;
  if (na == 1) return dt__clone(g, out);
  dt_tensor_t s;
  DT_CHECK(dt__opa(DT_OP_SUM, 1, &g, na, args, 0, NULL, &s));
  dt_status_t st = dt__reshape(s, xd, x->layout.shape, out);
  dt__tensor_free(s);
  return st;
}

/* The dims a reduction reduced (its iargs against its input's shape) and, where kshape is not
 * NULL, the input's shape with those dims as 1 (the output's with keepdim). */
static dt_status_t dt__reduced(const dt_grad_ctx_t* c, unsigned* mask, int64_t* kshape) {
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  dt_tensor_t x = c->in[0];
  call.op = dt__op_info(c->op)->name;
  call.n_inputs = 1;
  call.in[0].ndim = x->layout.ndim;
  memcpy(call.in[0].shape, x->layout.shape, sizeof call.in[0].shape);
  call.n_iargs = c->n_iargs;
  memcpy(call.iargs, c->iargs, sizeof(int64_t) * (size_t)c->n_iargs);
  int keep;
  DT_CHECK(dt__reduce_dims(c->op, &call, mask, &keep));
  for (int d = 0; kshape != NULL && d < x->layout.ndim; d++)
    kshape[d] = (*mask & (1u << d)) ? 1 : x->layout.shape[d];
  return DT_SUCCESS;
}

/* Gradient of a reduction: g (times scale) brought back to x's shape: the reduced dims put back
 * as size 1, a Partial reduced here at that small size (straight to x's shard where x is sharded
 * on a kept dim, else Replicate; an expand that grows would otherwise hand the Partial on at x's
 * size), then expanded (no zeros of x's size). A shard of g stays where it is. */
static dt_status_t dt__expand_back(const dt_grad_ctx_t* c, dt_tensor_t g, double scale,
                                   dt_tensor_t* out) {
  dt_tensor_t x = c->in[0];
  unsigned mask;
  int64_t kshape[DT_MAX_DIMS];
  DT_CHECK(dt__reduced(c, &mask, kshape));
  dt__scope_t s = {0};
  dt_tensor_t gk, sc;
  dt_status_t st = dt__reshape(g, x->layout.ndim, kshape, &gk);
  if (st == DT_SUCCESS) {
    dt__keep(&s, gk);
    if (scale != 1.0) {
      st = dt__scale(gk, scale, &sc);
      if (st == DT_SUCCESS) gk = dt__keep(&s, sc);
    }
  }
  if (st == DT_SUCCESS) {
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    int partial = 0;
    for (int i = 0; i < x->mesh->ndim; i++) {
      const dt_placement_t px = x->layout.pl[i];
      pl[i] = gk->layout.pl[i];
      if (pl[i].kind != DT_PARTIAL) continue;
      partial = 1;
      pl[i] = px.kind == DT_SHARD && !(mask & (1u << px.dim)) ? px : dt_replicate();
    }
    if (partial) {
      st = dt_tensor_redistribute(gk, pl, &sc);
      if (st == DT_SUCCESS) gk = dt__keep(&s, sc);
    }
  }
  if (st == DT_SUCCESS)
    st = dt__opa(DT_OP_EXPAND, 1, &gk, x->layout.ndim, x->layout.shape, 0, NULL, out);
  dt__scope_free(&s);
  return st;
}

static int64_t dt__numel_of(dt_tensor_t t) {
  int64_t n = 1;
  for (int d = 0; d < t->layout.ndim; d++) n *= t->layout.shape[d];
  return n;
}

/* ---------------------------------------------------------------------------------------------
 * the rules: c->in[t] and c->out[o] are the forward's values, gout[0] the output gradient */

/* comparisons are piecewise constant: no gradient flows */
dt_status_t dt__bw_none(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  (void)c;
  (void)gout;
  (void)gin;
  return DT_SUCCESS;
}

static dt_status_t dt__add_sub(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin,
                               int sub) {
  for (int t = 0; t < 2; t++) {
    if (!c->needs[t]) continue;
    dt_tensor_t u;
    DT_CHECK(dt__unbroadcast(gout[0], c->in[t], &u));
    if (sub && t == 1) {
      dt_status_t st = dt__op1(DT_OP_NEG, u, &gin[t]);
      dt__tensor_free(u);
      DT_CHECK(st);
    } else {
      gin[t] = u;
    }
  }
  return DT_SUCCESS;
}
/* expand: the gradient summed over the broadcast dims, as a broadcasting op's */
dt_status_t dt__bw_expand(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__unbroadcast(gout[0], c->in[0], &gin[0]);
}
/* tril / triu: the same selection of g (the zeroed elements had no effect) */
dt_status_t dt__bw_tril(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__opa(c->op, 1, &gout[0], c->n_iargs, c->iargs, 0, NULL, &gin[0]);
}
/* cumsum: each x[i] reaches out[j] for j >= i (reverse: j <= i), so the gradient is the scan of g
 * in the other direction */
dt_status_t dt__bw_cumsum(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t a[2] = {c->iargs[0], !dt__op_iarg_n(DT_OP_CUMSUM, c->n_iargs, c->iargs, 1)};
  return dt__opa(DT_OP_CUMSUM, 1, &gout[0], 2, a, 0, NULL, &gin[0]);
}
dt_status_t dt__bw_add(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__add_sub(c, gout, gin, 0);
}
dt_status_t dt__bw_sub(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__add_sub(c, gout, gin, 1);
}

dt_status_t dt__bw_mul(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  for (int t = 0; t < 2; t++) {
    if (!c->needs[t]) continue;
    dt_tensor_t p;
    DT_CHECK(dt__op2(DT_OP_MUL, gout[0], c->in[1 - t], &p));
    dt_status_t st = dt__unbroadcast(p, c->in[t], &gin[t]);
    dt__tensor_free(p);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

dt_status_t dt__bw_div(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt__scope_t s = {0};
  dt_tensor_t q, p, m;
  dt_status_t st = dt__op2(DT_OP_DIV, gout[0], c->in[1], &q);
  if (st != DT_SUCCESS) return st;
  dt__keep(&s, q);
  if (c->needs[0]) st = dt__unbroadcast(q, c->in[0], &gin[0]);
  if (st == DT_SUCCESS && c->needs[1]) {
    st = dt__op2(DT_OP_MUL, q, c->out[0], &p);
    if (st == DT_SUCCESS) {
      dt__keep(&s, p);
      st = dt__op1(DT_OP_NEG, p, &m);
    }
    if (st == DT_SUCCESS) {
      dt__keep(&s, m);
      st = dt__unbroadcast(m, c->in[1], &gin[1]);
    }
  }
  dt__scope_free(&s);
  return st;
}

dt_status_t dt__bw_neg(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  (void)c;
  return dt__op1(DT_OP_NEG, gout[0], &gin[0]);
}
dt_status_t dt__bw_mul_scalar(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__scale(gout[0], c->fargs[0], &gin[0]);
}
dt_status_t dt__bw_add_scalar(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  (void)c;
  gin[0] = gout[0];
  gout[0] = NULL; /* taken over */
  return DT_SUCCESS;
}
dt_status_t dt__bw_exp(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__op2(DT_OP_MUL, gout[0], c->out[0], &gin[0]);
}
dt_status_t dt__bw_log(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__op2(DT_OP_DIV, gout[0], c->in[0], &gin[0]);
}
dt_status_t dt__bw_sqrt(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t a;
  DT_CHECK(dt__op2(DT_OP_DIV, gout[0], c->out[0], &a));
  dt_status_t st = dt__scale(a, 0.5, &gin[0]);
  dt__tensor_free(a);
  return st;
}

/* g * k * base^e: rsqrt (base = out, e = 3, k = -0.5) and pow (base = x, e = p - 1, k = p) */
static dt_status_t dt__power_grad(dt_tensor_t g, dt_tensor_t base, double e, double k,
                                  dt_tensor_t* gin) {
  dt__scope_t s = {0};
  dt_tensor_t a, b;
  dt_status_t st = dt__opa(DT_OP_POW, 1, &base, 0, NULL, 1, &e, &a);
  if (st == DT_SUCCESS) {
    dt__keep(&s, a);
    st = dt__scale(a, k, &b);
  }
  if (st == DT_SUCCESS) {
    dt__keep(&s, b);
    st = dt__op2(DT_OP_MUL, g, b, gin);
  }
  dt__scope_free(&s);
  return st;
}
dt_status_t dt__bw_rsqrt(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__power_grad(gout[0], c->out[0], 3.0, -0.5, &gin[0]);
}
dt_status_t dt__bw_pow(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  /* exponent 0: zeros, as PyTorch (0 x^-1 would be NaN at x = 0) */
  if ((float)c->fargs[0] == 0.0f) return dt__zeros_like(c->in[0], &gin[0]);
  return dt__power_grad(gout[0], c->in[0], c->fargs[0] - 1.0, c->fargs[0], &gin[0]);
}

/* g * f'(x) by the fused act_grad op; sigmoid and tanh read their output */
static dt_status_t dt__act(dt_tensor_t g, dt_tensor_t x, int64_t kind, dt_tensor_t* gin) {
  dt_tensor_t in[2] = {g, x};
  return dt__opa(DT_OP_ACT_GRAD, 2, in, 1, &kind, 0, NULL, gin);
}
dt_status_t dt__bw_relu(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__act(gout[0], c->in[0], DT_ACT_RELU, &gin[0]);
}
dt_status_t dt__bw_silu(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__act(gout[0], c->in[0], DT_ACT_SILU, &gin[0]);
}
dt_status_t dt__bw_gelu(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__act(gout[0], c->in[0], DT_ACT_GELU, &gin[0]);
}
dt_status_t dt__bw_sigmoid(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__act(gout[0], c->out[0], DT_ACT_SIGMOID_OUT, &gin[0]);
}
dt_status_t dt__bw_tanh(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__act(gout[0], c->out[0], DT_ACT_TANH_OUT, &gin[0]);
}
dt_status_t dt__bw_abs(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__act(gout[0], c->in[0], DT_ACT_ABS, &gin[0]);
}
/* g op f(t) and, when neg, its negation: the two-step gradients of sin, cos, reciprocal, log1p
 * and expm1 (f: op f_id on t with the scalar s when f_id takes one, or t * t for DT_OP_MUL) */
static dt_status_t dt__unary_grad(dt_tensor_t g, int f_id, dt_tensor_t t, double s, int op,
                                  int neg, dt_tensor_t* gin) {
  dt__scope_t sc = {0};
  dt_tensor_t f, r;
  dt_status_t st = f_id == DT_OP_MUL ? dt__op2(DT_OP_MUL, t, t, &f)
                   : f_id == DT_OP_ADD_SCALAR ? dt__opa(f_id, 1, &t, 0, NULL, 1, &s, &f)
                                              : dt__op1(f_id, t, &f);
  if (st == DT_SUCCESS) st = dt__op2(op, g, dt__keep(&sc, f), neg ? &r : gin);
  if (st == DT_SUCCESS && neg) st = dt__op1(DT_OP_NEG, dt__keep(&sc, r), gin);
  dt__scope_free(&sc);
  return st;
}
dt_status_t dt__bw_sin(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__unary_grad(gout[0], DT_OP_COS, c->in[0], 0.0, DT_OP_MUL, 0, &gin[0]);
}
dt_status_t dt__bw_cos(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__unary_grad(gout[0], DT_OP_SIN, c->in[0], 0.0, DT_OP_MUL, 1, &gin[0]);
}
dt_status_t dt__bw_reciprocal(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__unary_grad(gout[0], DT_OP_MUL, c->out[0], 0.0, DT_OP_MUL, 1, &gin[0]);
}
dt_status_t dt__bw_log1p(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__unary_grad(gout[0], DT_OP_ADD_SCALAR, c->in[0], 1.0, DT_OP_DIV, 0, &gin[0]);
}
dt_status_t dt__bw_expm1(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__unary_grad(gout[0], DT_OP_ADD_SCALAR, c->out[0], 1.0, DT_OP_MUL, 0, &gin[0]);
}
/* floor, ceil, round, trunc and sign are piecewise constant: PyTorch's zeros_like(grad) (zeros,
 * also where g is NaN or infinite) */
dt_status_t dt__bw_zero(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  (void)gout;
  return dt__zeros_like(c->in[0], &gin[0]);
}
/* erf: PyTorch's 2 / sqrt(pi) * exp(-(x.pow(2))) * g, one op at a time (each rounded to x's dtype,
 * as its bf16 autograd; pow 2 is x * x, the constant a float scalar) */
dt_status_t dt__bw_erf(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt__scope_t sc = {0};
  const double two = 2.0, k2 = 1.1283791670955126; /* 2 / sqrt(pi) in double, as PyTorch's */
  dt_tensor_t x = c->in[0], sq, ng, e, k;
  dt_status_t st = dt__opa(DT_OP_POW, 1, &x, 0, NULL, 1, &two, &sq);
  if (st == DT_SUCCESS) st = dt__op1(DT_OP_NEG, dt__keep(&sc, sq), &ng);
  if (st == DT_SUCCESS) st = dt__op1(DT_OP_EXP, dt__keep(&sc, ng), &e);
  if (st == DT_SUCCESS) st = dt__scale(dt__keep(&sc, e), k2, &k);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, dt__keep(&sc, k), gout[0], &gin[0]);
  dt__scope_free(&sc);
  return st;
}
dt_status_t dt__bw_clamp(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  /* the forward's bounds (absent: NaN for both ops) rounded to x's dtype, as PyTorch compares
   * x >= min in x's dtype (bf16 x = 0.69921875 passes min = 0.7, which rounds to it) */
  dt_tensor_t in[2] = {gout[0], c->in[0]};
  const int64_t kind = DT_ACT_CLAMP;
  const dt_dtype_t dt = c->in[0]->dtype;
  double b[2] = {NAN, NAN};
  for (int k = 0; k < 2; k++) {
    b[k] = dt__op_farg_n(DT_OP_CLAMP, c->n_fargs, c->fargs, k);
    if (isnan(b[k])) continue;
    if (dt == DT_BF16) b[k] = dt__bf16_to_f32(dt__f32_to_bf16((float)b[k]));
    else if (dt == DT_F16) b[k] = dt__f16_to_f32(dt__f32_to_f16((float)b[k]));
  }
  return dt__opa(DT_OP_ACT_GRAD, 2, in, 1, &kind, 2, b, &gin[0]);
}

/* mm: a g b^T, a^T g with no transposed copies (linear_nobias computes g b^T, mm_t a^T g) */
dt_status_t dt__bw_mm(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (c->needs[0]) DT_CHECK(dt__op2(DT_OP_LINEAR_NOBIAS, gout[0], c->in[1], &gin[0]));
  if (c->needs[1]) DT_CHECK(dt__op2(DT_OP_MM_T, c->in[0], gout[0], &gin[1]));
  return DT_SUCCESS;
}
/* mm_t: out = a^T b; d a = b g^T = linear(b, g), d b = a g */
dt_status_t dt__bw_mm_t(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (c->needs[0]) DT_CHECK(dt__op2(DT_OP_LINEAR_NOBIAS, c->in[1], gout[0], &gin[0]));
  if (c->needs[1]) DT_CHECK(dt__op2(DT_OP_MM, c->in[0], gout[0], &gin[1]));
  return DT_SUCCESS;
}

dt_status_t dt__bw_bmm(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t tdims[2] = {1, 2};
  for (int k = 0; k < 2; k++) {
    if (!c->needs[k]) continue;
    dt_tensor_t other = c->in[1 - k], t;
    DT_CHECK(dt__opa(DT_OP_TRANSPOSE, 1, &other, 2, tdims, 0, NULL, &t));
    dt_status_t st = k == 0 ? dt__op2(DT_OP_BMM, gout[0], t, &gin[0])  /* g b^T */
                            : dt__op2(DT_OP_BMM, t, gout[0], &gin[1]); /* a^T g */
    dt__tensor_free(t);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

/* linear: y (N, O) = x (N, K) w^T (w (O, K)) + b */
dt_status_t dt__bw_linear(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (c->needs[0]) DT_CHECK(dt__op2(DT_OP_MM, gout[0], c->in[1], &gin[0]));
  if (c->needs[1]) DT_CHECK(dt__op2(DT_OP_MM_T, gout[0], c->in[0], &gin[1])); /* g^T x */
  if (c->n_in == 3 && c->needs[2]) {
    const int64_t a[2] = {0, 0};
    DT_CHECK(dt__opa(DT_OP_SUM, 1, &gout[0], 2, a, 0, NULL, &gin[2]));
  }
  return DT_SUCCESS;
}

dt_status_t dt__bw_addmm(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_op_call_t args; /* the forward's arguments, read with the schema's defaults */
  memset(&args, 0, sizeof args);
  args.n_fargs = c->n_fargs;
  memcpy(args.fargs, c->fargs, sizeof(double) * (size_t)c->n_fargs);
  const double beta = dt__op_farg(DT_OP_ADDMM, &args, 0);
  const double alpha = dt__op_farg(DT_OP_ADDMM, &args, 1);
  dt_tensor_t t, p;
  if (c->needs[0]) {
    DT_CHECK(dt__unbroadcast(gout[0], c->in[0], &p));
    dt_status_t st = dt__scale(p, beta, &gin[0]);
    dt__tensor_free(p);
    DT_CHECK(st);
  }
  for (int k = 1; k <= 2; k++) {
    if (!c->needs[k]) continue;
    DT_CHECK(dt__op1(DT_OP_T, c->in[k == 1 ? 2 : 1], &t));
    dt_status_t st = k == 1 ? dt__op2(DT_OP_MM, gout[0], t, &p) : dt__op2(DT_OP_MM, t, gout[0], &p);
    dt__tensor_free(t);
    DT_CHECK(st);
    st = dt__scale(p, alpha, &gin[k]);
    dt__tensor_free(p);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

dt_status_t dt__bw_sum(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__expand_back(c, gout[0], 1.0, &gin[0]);
}
dt_status_t dt__bw_mean(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  int64_t in_n = dt__numel_of(c->in[0]), out_n = dt__numel_of(c->out[0]);
  return dt__expand_back(c, gout[0], in_n > 0 ? (double)out_n / (double)in_n : 0.0, &gin[0]);
}

dt_status_t dt__bw_softmax(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t a[2] = {1, c->iargs[0]};
  dt__scope_t s = {0};
  dt_tensor_t p, r, d;
  dt_status_t st = dt__op2(DT_OP_MUL, gout[0], c->out[0], &p);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_SUM, 1, (dt__keep(&s, p), &p), 2, a, 0, NULL, &r);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, gout[0], dt__keep(&s, r), &d);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, c->out[0], dt__keep(&s, d), &gin[0]);
  dt__scope_free(&s);
  return st;
}

dt_status_t dt__bw_log_softmax(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t a[2] = {1, c->iargs[0]};
  dt__scope_t s = {0};
  dt_tensor_t p, r, e;
  dt_status_t st = dt__opa(DT_OP_SUM, 1, &gout[0], 2, a, 0, NULL, &r);
  if (st == DT_SUCCESS) st = dt__op1(DT_OP_EXP, c->out[0], (dt__keep(&s, r), &e));
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, dt__keep(&s, e), r, &p);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, gout[0], dt__keep(&s, p), &gin[0]);
  dt__scope_free(&s);
  return st;
}

static dt_status_t dt__norm_bw(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin,
                               int layer) {
  dt_tensor_t in[3] = {gout[0], c->in[0], c->in[1]}, outs[2] = {NULL, NULL};
  DT_CHECK(dt__op_apply(layer ? DT_OP_LAYER_NORM_GRAD : DT_OP_RMS_NORM_GRAD, 3, in, 0, NULL,
                        c->n_fargs, c->fargs, 2, outs, NULL));
  gin[0] = outs[0];
  gin[1] = outs[1];
  if (layer && c->needs[2]) {
    int nd = c->in[0]->layout.ndim;
    int64_t a[DT_MAX_DIMS + 1];
    a[0] = 0;
    for (int d = 0; d + 1 < nd; d++) a[1 + d] = d;
    if (nd == 1) return dt__clone(gout[0], &gin[2]);
    DT_CHECK(dt__opa(DT_OP_SUM, 1, &gout[0], nd, a, 0, NULL, &gin[2]));
  }
  return DT_SUCCESS;
}
dt_status_t dt__bw_rms_norm(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__norm_bw(c, gout, gin, 0);
}
dt_status_t dt__bw_layer_norm(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__norm_bw(c, gout, gin, 1);
}

dt_status_t dt__bw_embedding(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  int64_t V = c->in[0]->layout.shape[0];
  dt_tensor_t in[2] = {gout[0], c->in[1]};
  return dt__opa(DT_OP_EMBEDDING_GRAD, 2, in, 1, &V, 0, NULL, &gin[0]);
}

dt_status_t dt__bw_view(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__reshape(gout[0], c->in[0]->layout.ndim, c->in[0]->layout.shape, &gin[0]);
}

dt_status_t dt__bw_permute(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  int nd = c->in[0]->layout.ndim;
  int64_t inv[DT_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    int64_t p = c->iargs[i] < 0 ? c->iargs[i] + nd : c->iargs[i];
    inv[p] = i;
  }
  return dt__opa(DT_OP_PERMUTE, 1, &gout[0], nd, inv, 0, NULL, &gin[0]);
}
/* t and transpose are their own inverse */
dt_status_t dt__bw_transpose(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__opa(DT_OP_TRANSPOSE, 1, &gout[0], c->n_iargs, c->iargs, 0, NULL, &gin[0]);
}
dt_status_t dt__bw_t(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  (void)c;
  return dt__op1(DT_OP_T, gout[0], &gin[0]);
}

dt_status_t dt__bw_cat(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  int nd = c->out[0]->layout.ndim;
  int64_t dim = c->iargs[0] < 0 ? c->iargs[0] + nd : c->iargs[0], at = 0;
  for (int t = 0; t < c->n_in; t++) {
    int64_t len = c->in[t]->layout.shape[dim];
    if (c->needs[t]) {
      const int64_t a[3] = {dim, at, len};
      DT_CHECK(dt__opa(DT_OP_NARROW, 1, &gout[0], 3, a, 0, NULL, &gin[t]));
    }
    at += len;
  }
  return DT_SUCCESS;
}

/* index_select: g's slices added into zeros of x's shape at the indices (index_add along dim 0:
 * dim moved first by a transpose and the other dims flattened, then moved back) */
dt_status_t dt__bw_index_select(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (!c->needs[0]) return DT_SUCCESS;
  dt_tensor_t x = c->in[0], g = gout[0];
  const int nd = x->layout.ndim;
  const int64_t d0 = dt__op_iarg_n(DT_OP_INDEX_SELECT, c->n_iargs, c->iargs, 0);
  const int64_t dim = nd == 0 ? 0 : d0 < 0 ? d0 + nd : d0;
  dt__scope_t s = {0};
  dt_status_t st = DT_SUCCESS;
  dt_tensor_t gt = g, z, idx = c->in[1], sum;
  int64_t tshape[DT_MAX_DIMS], rest = 1, L = 1;
  for (int d = 0; d < nd; d++) tshape[d] = x->layout.shape[d];
  if (nd == 0) tshape[0] = 1;
  if (dim != 0) { /* dim first: (N, .., x's dim 0, ..) */
    const int64_t sw[2] = {0, dim};
    st = dt__opa(DT_OP_TRANSPOSE, 1, &g, 2, sw, 0, NULL, &gt);
    if (st == DT_SUCCESS) dt__keep(&s, gt);
    tshape[dim] = tshape[0];
    tshape[0] = x->layout.shape[dim];
  }
  for (int d = 1; d < nd; d++) rest *= tshape[d];
  for (int d = 0; d < idx->layout.ndim; d++) L *= idx->layout.shape[d];
  const int64_t g2[2] = {L, rest}, x2[2] = {tshape[0], rest}, one[1] = {L};
  if (st == DT_SUCCESS && idx->layout.ndim == 0 && (st = dt__reshape(idx, 1, one, &idx)) == DT_SUCCESS)
    dt__keep(&s, idx);
  if (st == DT_SUCCESS && (st = dt__reshape(gt, 2, g2, &gt)) == DT_SUCCESS) dt__keep(&s, gt);
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  if (st == DT_SUCCESS &&
      (st = dt_tensor_zeros(x->mesh, g->dtype, 2, x2, rep, &z)) == DT_SUCCESS)
    dt__keep(&s, z);
  if (st == DT_SUCCESS) {
    dt_tensor_t a[3] = {z, idx, gt};
    if ((st = dt__opa(DT_OP_INDEX_ADD, 3, a, 0, NULL, 0, NULL, &sum)) == DT_SUCCESS)
      dt__keep(&s, sum);
  }
  if (st == DT_SUCCESS) {
    if (dim == 0) {
      st = dt__reshape(sum, nd, x->layout.shape, &gin[0]);
    } else {
      dt_tensor_t back;
      if ((st = dt__reshape(sum, nd, tshape, &back)) == DT_SUCCESS) {
        dt__keep(&s, back);
        const int64_t sw[2] = {0, dim};
        st = dt__opa(DT_OP_TRANSPOSE, 1, &back, 2, sw, 0, NULL, &gin[0]);
      }
    }
  }
  dt__scope_free(&s);
  return st;
}

/* stack: input t's gradient is slice t of g along the new dim, that dim squeezed away */
dt_status_t dt__bw_stack(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int nd = c->out[0]->layout.ndim;
  const int64_t d0 = dt__op_iarg_n(DT_OP_STACK, c->n_iargs, c->iargs, 0);
  const int64_t dim = d0 < 0 ? d0 + nd : d0;
  for (int t = 0; t < c->n_in; t++) {
    if (!c->needs[t]) continue;
    const int64_t a[3] = {dim, t, 1};
    dt_tensor_t piece;
    DT_CHECK(dt__opa(DT_OP_NARROW, 1, &gout[0], 3, a, 0, NULL, &piece));
    dt_status_t st = dt__opa(DT_OP_SQUEEZE, 1, &piece, 1, &dim, 0, NULL, &gin[t]);
    dt__tensor_free(piece);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

/* narrow / slice: g placed between zero blocks along the cut dim (a cat); a strided slice
 * scatters g into zeros at start + j * step */
dt_status_t dt__bw_slice(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_op_call_t call;
  memset(&call, 0, sizeof call);
  dt_tensor_t x = c->in[0], g = gout[0];
  call.op = dt__op_info(c->op)->name;
  call.n_inputs = 1;
  call.in[0].dtype = x->dtype;
  call.in[0].ndim = x->layout.ndim;
  memcpy(call.in[0].shape, x->layout.shape, sizeof call.in[0].shape);
  call.n_iargs = c->n_iargs;
  memcpy(call.iargs, c->iargs, sizeof(int64_t) * (size_t)c->n_iargs);
  int dim;
  int64_t start, step, len;
  DT_CHECK(dt__slice_args(c->op, &call, &dim, &start, &step, &len));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  if (step != 1 && len > 1) {
    int nd = g->layout.ndim;
    int64_t total = dt__numel_of(g), inner = 1;
    for (int d2 = dim + 1; d2 < nd; d2++) inner *= g->layout.shape[d2];
    int64_t* idx = (int64_t*)dt__malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    if (idx == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "slice backward indices");
    for (int64_t i = 0; i < total; i++) idx[i] = start + ((i / inner) % len) * step;
    dt_tensor_t it, z;
    dt_status_t st = dt_tensor_from_full(x->mesh, DT_I64, nd, g->layout.shape, rep, idx, &it);
    dt__free(idx);
    if (st != DT_SUCCESS) return st;
    st = dt__zeros_like(x, &z);
    if (st == DT_SUCCESS) {
      dt_tensor_t in[3] = {z, it, g};
      const int64_t d1[1] = {dim};
      st = dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, d1, 0, NULL, &gin[0]);
      dt__tensor_free(z);
    }
    dt__tensor_free(it);
    return st;
  }
  dt__scope_t s = {0};
  dt_tensor_t parts[3];
  int np = 0;
  int64_t before = start, after = x->layout.shape[dim] - start - len, shp[DT_MAX_DIMS];
  memcpy(shp, x->layout.shape, sizeof shp);
  dt_status_t st = DT_SUCCESS;
  if (before > 0) {
    shp[dim] = before;
    st = dt_tensor_zeros(x->mesh, g->dtype, x->layout.ndim, shp, rep, &parts[np]);
    if (st == DT_SUCCESS) dt__keep(&s, parts[np++]);
  }
  parts[np++] = g;
  if (st == DT_SUCCESS && after > 0) {
    shp[dim] = after;
    st = dt_tensor_zeros(x->mesh, g->dtype, x->layout.ndim, shp, rep, &parts[np]);
    if (st == DT_SUCCESS) dt__keep(&s, parts[np++]);
  }
  const int64_t d[1] = {dim};
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_CAT, np, parts, 1, d, 0, NULL, &gin[0]);
  dt__scope_free(&s);
  return st;
}

dt_status_t dt__bw_rotary(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  /* the same seq_dim, the other direction (the schema's defaults where not given) */
  const int64_t a[3] = {dt__op_iarg_n(DT_OP_ROTARY, c->n_iargs, c->iargs, 0),
                        dt__op_iarg_n(DT_OP_ROTARY, c->n_iargs, c->iargs, 1) ? 0 : 1,
                        dt__op_iarg_n(DT_OP_ROTARY, c->n_iargs, c->iargs, 2)};
  return dt__opa(DT_OP_ROTARY, 1, &gout[0], 3, a, c->n_fargs, c->fargs, &gin[0]);
}

dt_status_t dt__bw_sdpa(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t in[4] = {c->in[0], c->in[1], c->in[2], gout[0]};
  return dt__op_apply(DT_OP_SDPA_GRAD, 4, in, c->n_iargs, c->iargs, c->n_fargs, c->fargs, 3, gin,
                      NULL);
}

dt_status_t dt__bw_dropout(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__opa(DT_OP_DROPOUT, 1, &gout[0], c->n_iargs, c->iargs, c->n_fargs, c->fargs,
                 &gin[0]);
}

dt_status_t dt__bw_cast(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (!dt__dtype_is_float(c->in[0]->dtype)) return DT_SUCCESS;
  int64_t dt = c->in[0]->dtype;
  return dt__opa(DT_OP_CAST, 1, &gout[0], 1, &dt, 0, NULL, &gin[0]);
}

dt_status_t dt__bw_gather(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t z;
  DT_CHECK(dt__zeros_like(c->in[0], &z));
  dt_tensor_t in[3] = {z, c->in[1], gout[0]};
  dt_status_t st = dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, c->iargs, 0, NULL, &gin[0]);
  dt__tensor_free(z);
  return st;
}

dt_status_t dt__bw_scatter_add(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (c->needs[2]) {
    dt_tensor_t in[2] = {gout[0], c->in[1]};
    DT_CHECK(dt__opa(DT_OP_GATHER, 2, in, 1, c->iargs, 0, NULL, &gin[2]));
  }
  if (c->needs[0]) {
    gin[0] = gout[0];
    gout[0] = NULL;
  }
  return DT_SUCCESS;
}

/* topk: the values' gradient scattered into zeros at the indices (the indices have none) */
dt_status_t dt__bw_topk(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (gout[0] == NULL) return DT_SUCCESS;
  dt_tensor_t z;
  DT_CHECK(dt__zeros_like(c->in[0], &z));
  const int64_t dim[1] = {c->iargs[1]};
  dt_tensor_t in[3] = {z, c->out[1], gout[0]};
  dt_status_t st = dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, dim, 0, NULL, &gin[0]);
  dt__tensor_free(z);
  return st;
}

/* cross-entropy: d logits = (softmax(logits) - (1 - eps) onehot(targets) - eps / C) times the
 * upstream gradient (a scalar: g / N for mean, g for sum; g[i] for per-row losses) and, with an
 * ignore_index, each row's weight saved by the forward pass (0 for an ignored row, 1 / count
 * for mean, else 1) in place of 1 / N; softmax = exp((x - m) - log(s)) as PyTorch's (exp(x - lse)
 * would carry lse's rounding, ~5e-4 at logits of 1e4 in f32) with the row max and log-sum saved
 * by the forward pass ((N, 2) [m, log(s)], or (N, 3) with the weights); computed class-sharded:
 * on each mesh dim where the logits' classes are sharded the saved rows are gathered once (N
 * rows), elsewhere the logits meet the saved rows' placement (a local slice of whole logits, one
 * reduction of Partial ones, as the forward did) */
dt_status_t dt__bw_cross_entropy(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = c->in[0], tg = c->in[1], sv = c->saved;
  if (sv == NULL) return DT_FAIL(DT_ERR_INTERNAL, "cross_entropy node without its logsumexp");
  const dt__ce_args_t a = dt__ce_args(c->n_iargs, c->iargs, c->n_fargs, c->fargs);
  const int masked = sv->layout.shape[1] == 3;
  const int64_t N = x->layout.shape[0], C = x->layout.shape[1];
  const double eps = a.label_smoothing;
  dt__scope_t s = {0};
  dt_tensor_t xr = x, xo = NULL, svx = sv, svo = NULL, m, ls, w = NULL, z = NULL, z2, p, v,
              safe = tg, idx, neg, oh, gs, g2;
  dt_placement_t rep[DT_MAX_MESH_DIMS], rows[DT_MAX_MESH_DIMS], xpl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  for (int i = 0; i < x->mesh->ndim; i++) { /* rows sharded as the logits' or the saved ones */
    const dt_placement_t px = x->layout.pl[i], ps = sv->layout.pl[i];
    const int classes = px.kind == DT_SHARD && px.dim == 1;
    const int by_rows = (px.kind == DT_SHARD && px.dim == 0) ||
                        (!classes && ps.kind == DT_SHARD && ps.dim == 0);
    rows[i] = by_rows ? dt_shard(0) : dt_replicate();
    xpl[i] = classes ? px : rows[i]; /* Partial logits reduced once; whole ones sliced locally */
  }
  const int64_t col[2] = {N, 1}, first[3] = {1, 0, 1}, second[3] = {1, 1, 1},
                third[3] = {1, 2, 1};
  dt_status_t st = dt__op_move_to(sv, rows, &svx, &svo);
  if (st == DT_SUCCESS) st = dt__op_move_to(x, xpl, &xr, (dt__keep(&s, svo), &xo));
  if (st == DT_SUCCESS) {
    dt__keep(&s, xo);
    st = dt__opa(DT_OP_NARROW, 1, &svx, 3, first, 0, NULL, &m);
  }
  if (st == DT_SUCCESS) {
    dt__keep(&s, m);
    st = dt__opa(DT_OP_NARROW, 1, &svx, 3, second, 0, NULL, &ls);
  }
  if (st == DT_SUCCESS) dt__keep(&s, ls);
  if (st == DT_SUCCESS && masked) {
    st = dt__opa(DT_OP_NARROW, 1, &svx, 3, third, 0, NULL, &w);
    if (st == DT_SUCCESS) st = dt__ce_targets(tg, a.ignore_index, (dt__keep(&s, w), &v), &safe);
    if (st == DT_SUCCESS) {
      dt__keep(&s, v);
      dt__keep(&s, safe);
    }
  }
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, xr, m, &z);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, z, ls, &z2);
  dt__tensor_free(z); /* before exp: as many logits-sized temporaries at once as exp(x - lse) */
  if (st == DT_SUCCESS) st = dt__op1(DT_OP_EXP, dt__keep(&s, z2), &p);
  if (st == DT_SUCCESS) st = dt__reshape(safe, 2, col, (dt__keep(&s, p), &idx));
  if (st == DT_SUCCESS)
    st = dt_tensor_full_value(x->mesh, x->dtype, 2, col, rep, -(1.0 - eps),
                              (dt__keep(&s, idx), &neg));
  if (st == DT_SUCCESS) {
    dt__keep(&s, neg);
    dt_tensor_t in[3] = {p, idx, neg};
    const int64_t one[1] = {1};
    st = dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, one, 0, NULL, &oh);
  }
  if (st == DT_SUCCESS && eps > 0.0) {
    const double off = C > 0 ? -eps / (double)C : 0.0;
    dt_tensor_t o2;
    st = dt__opa(DT_OP_ADD_SCALAR, 1, (dt__keep(&s, oh), &oh), 0, NULL, 1, &off, &o2);
    if (st == DT_SUCCESS) oh = o2;
  }
  if (st == DT_SUCCESS) {
    dt__keep(&s, oh);
    if (a.reduction == DT_LOSS_NONE) { /* per-row upstream gradients as a column */
      st = dt__reshape(gout[0], 2, col, &g2);
      if (st == DT_SUCCESS && w) st = dt__op2(DT_OP_MUL, w, dt__keep(&s, g2), &gs);
      else if (st == DT_SUCCESS) gs = g2;
    } else if (w) { /* the weights times the scalar, then one pass over the logits */
      st = dt__op2(DT_OP_MUL, w, gout[0], &gs);
    } else { /* a scalar: scale it first, then one pass over the logits */
      st = dt__scale(gout[0], a.reduction == DT_LOSS_MEAN ? (N > 0 ? 1.0 / (double)N : 0.0) : 1.0,
                     &gs);
    }
  }
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, oh, dt__keep(&s, gs), &gin[0]);
  dt__scope_free(&s);
  return st;
}

/* redistribute: back to the source placements, a source Partial becoming Replicate unless the
 * gradient already holds that same Partial there (PyTorch's rule: P -> P is a no-op both ways) */
dt_status_t dt__bw_redistribute(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_placement_t back[DT_MAX_MESH_DIMS];
  const dt_placement_t* src = c->in[0]->layout.pl;
  const dt_placement_t* g = gout[0]->layout.pl;
  for (int i = 0; i < c->in[0]->mesh->ndim; i++)
    back[i] = src[i].kind != DT_PARTIAL || dt_placement_equal(g[i], src[i]) ? src[i]
                                                                             : dt_replicate();
  return dt_tensor_redistribute(gout[0], back, &gin[0]);
}

/* amax/amin: the gradient goes to the positions holding the extreme value, split evenly among
 * ties (as PyTorch). */
static dt_status_t dt__extreme_bw(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = c->in[0];
  unsigned mask;
  int64_t kshape[DT_MAX_DIMS], args[1 + DT_MAX_DIMS];
  DT_CHECK(dt__reduced(c, &mask, kshape));
  int na = 1;
  args[0] = 1;
  for (int d = 0; d < x->layout.ndim; d++)
    if (mask & (1u << d)) args[na++] = d;
  dt__scope_t s = {0};
  dt_tensor_t ok, gk, m, cnt, w;
  dt_status_t st = dt__reshape(c->out[0], x->layout.ndim, kshape, &ok);
  if (st == DT_SUCCESS) st = dt__reshape(gout[0], x->layout.ndim, kshape, (dt__keep(&s, ok), &gk));
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_EQ, x, ok, (dt__keep(&s, gk), &m));
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_SUM, 1, (dt__keep(&s, m), &m), na, args, 0, NULL, &cnt);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_DIV, gk, dt__keep(&s, cnt), &w);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, m, dt__keep(&s, w), &gin[0]);
  dt__scope_free(&s);
  return st;
}
dt_status_t dt__bw_amax(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__extreme_bw(c, gout, gin);
}
dt_status_t dt__bw_amin(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__extreme_bw(c, gout, gin);
}

/* logsumexp: g exp(x - out), g and out brought back over the reduced dims (NaN where out is
 * infinite at that element: a row of -inf, or a +inf, as PyTorch). */
dt_status_t dt__bw_logsumexp(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = c->in[0];
  unsigned mask;
  int64_t kshape[DT_MAX_DIMS];
  DT_CHECK(dt__reduced(c, &mask, kshape));
  dt__scope_t s = {0};
  dt_tensor_t ok, gk, d, e;
  dt_status_t st = dt__reshape(c->out[0], x->layout.ndim, kshape, &ok);
  if (st == DT_SUCCESS) st = dt__reshape(gout[0], x->layout.ndim, kshape, (dt__keep(&s, ok), &gk));
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, x, ok, (dt__keep(&s, gk), &d));
  if (st == DT_SUCCESS) st = dt__op1(DT_OP_EXP, dt__keep(&s, d), &e);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, dt__keep(&s, e), gk, &gin[0]);
  dt__scope_free(&s);
  return st;
}

/* var / std, as PyTorch's var_backward and std_backward: var: (2 / (N - correction)) g (x -
 * mean); std: the same with g / (2 out), 0 where out is 0 (a constant row), so g (x - mean) /
 * ((N - correction) out). N - correction is not clamped here (the forward divides by at least
 * 0): N == correction gives inf times the deviations (NaN where they are 0), as PyTorch; g, out
 * and the mean brought back over the reduced dims. */
static dt_status_t dt__var_std_bw(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin,
                                  int sd) {
  dt_tensor_t x = c->in[0];
  unsigned mask;
  int64_t kshape[DT_MAX_DIMS], args[1 + DT_MAX_DIMS];
  DT_CHECK(dt__reduced(c, &mask, kshape));
  int na = 1;
  int64_t N = 1;
  args[0] = 1;
  for (int d = 0; d < x->layout.ndim; d++)
    if (mask & (1u << d)) {
      args[na++] = d;
      N *= x->layout.shape[d];
    }
  const double corr = dt__op_farg_n(c->op, c->n_fargs, c->fargs, 0);
  const double dof = (double)N - corr;
  dt__scope_t s = {0};
  dt_tensor_t gk, ok, w, z, gs, m, dev;
  dt_status_t st = dt__reshape(gout[0], x->layout.ndim, kshape, &gk);
  if (st == DT_SUCCESS) dt__keep(&s, gk);
  if (st == DT_SUCCESS && sd) { /* g / (2 out), masked to 0 where out == 0 */
    const double two = 2.0, zero = 0.0;
    st = dt__reshape(c->out[0], x->layout.ndim, kshape, &ok);
    if (st == DT_SUCCESS) st = dt__scale(dt__keep(&s, ok), two, &w);
    if (st == DT_SUCCESS) st = dt__op2(DT_OP_DIV, gk, dt__keep(&s, w), &gs);
    dt_placement_t rep[DT_MAX_MESH_DIMS];
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
    if (st == DT_SUCCESS)
      st = dt_tensor_full_value(x->mesh, x->dtype, 0, NULL, rep, zero, (dt__keep(&s, gs), &z));
    if (st == DT_SUCCESS) st = dt__op2(DT_OP_EQ, ok, dt__keep(&s, z), &m);
    if (st == DT_SUCCESS) {
      dt_tensor_t in2[2] = {gs, dt__keep(&s, m)};
      st = dt__opa(DT_OP_MASKED_FILL, 2, in2, 0, NULL, 1, &zero, &gk);
      if (st == DT_SUCCESS) dt__keep(&s, gk);
    }
  }
  if (st == DT_SUCCESS) st = dt__scale(gk, 2.0 / dof, &gs);
  if (st == DT_SUCCESS) st = dt__opa(DT_OP_MEAN, 1, (dt__keep(&s, gs), &x), na, args, 0, NULL, &m);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, x, dt__keep(&s, m), &dev);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, gs, dt__keep(&s, dev), &gin[0]);
  dt__scope_free(&s);
  return st;
}
dt_status_t dt__bw_var(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__var_std_bw(c, gout, gin, 0);
}
dt_status_t dt__bw_std(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__var_std_bw(c, gout, gin, 1);
}

/* prod, as PyTorch's prod_backward: g times the product of the other reduced elements. With z the
 * zeros of the element's row (the reduced elements it was multiplied with) and p the product of
 * the row with its zeros as 1: no zero in the row: g (out / x) (p is out there, PyTorch's formula
 * without zeros); one zero: g p at the zero, 0 elsewhere; two or more: 0. So g (p / x'), x' = x
 * with zeros as 1, masked to 0 where the other elements hold a zero (z - [x == 0] > 0). A 0-d
 * input gets g. (PyTorch switches to exclusive products of the others wherever the tensor holds
 * any zero; this rule keeps out / x in zero-free rows: the same up to rounding, but an infinite
 * x there gives NaN, inf / inf, where those give the finite product of the others.) */
dt_status_t dt__bw_prod(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = c->in[0];
  unsigned mask;
  int64_t kshape[DT_MAX_DIMS], args[2] = {1, 0};
  DT_CHECK(dt__reduced(c, &mask, kshape));
  if (x->layout.ndim == 0) return dt__clone(gout[0], &gin[0]);
  int na = 1; /* [keepdim=1] (every element), or [1, the one dim] */
  for (int d = 0; d < x->layout.ndim && c->n_iargs > 1; d++)
    if (mask & (1u << d)) args[na++] = d;
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const double zero = 0.0, one = 1.0;
  dt__scope_t s = {0};
  dt_tensor_t z0, isz, cnt, x1, p, q, others, w, gk;
  dt_status_t st = dt_tensor_full_value(x->mesh, x->dtype, 0, NULL, rep, zero, &z0);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_EQ, x, dt__keep(&s, z0), &isz);
  if (st == DT_SUCCESS)
    st = dt__opa(DT_OP_SUM, 1, (dt__keep(&s, isz), &isz), na, args, 0, NULL, &cnt);
  if (st == DT_SUCCESS) {
    dt_tensor_t in2[2] = {x, isz};
    st = dt__opa(DT_OP_MASKED_FILL, 2, (dt__keep(&s, cnt), in2), 0, NULL, 1, &one, &x1);
  }
  if (st == DT_SUCCESS)
    st = dt__opa(DT_OP_PROD, 1, (dt__keep(&s, x1), &x1), na, args, 0, NULL, &p);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_DIV, dt__keep(&s, p), x1, &q);
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, cnt, isz, (dt__keep(&s, q), &others));
  if (st == DT_SUCCESS) {
    dt_tensor_t in2[2] = {q, others};
    st = dt__opa(DT_OP_MASKED_FILL, 2, (dt__keep(&s, others), in2), 0, NULL, 1, &zero, &w);
  }
  if (st == DT_SUCCESS)
    st = dt__reshape(gout[0], x->layout.ndim, kshape, (dt__keep(&s, w), &gk));
  if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, w, dt__keep(&s, gk), &gin[0]);
  dt__scope_free(&s);
  return st;
}

/* maximum/minimum, as PyTorch: the gradient goes to the chosen operand, half to each on ties,
 * and whole to both where a NaN is compared. Operand t gets g (1 - [t loses] - [a == b] / 2), t
 * losing where the other is strictly greater (maximum) or smaller (minimum). */
static dt_status_t dt__minmax_bw(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin,
                                 int mx) {
  dt__scope_t s = {0};
  dt_tensor_t eq, half, lose, w, w1, p;
  const double one = 1.0;
  dt_status_t st = dt__op2(DT_OP_EQ, c->in[0], c->in[1], &eq);
  if (st == DT_SUCCESS) st = dt__scale(dt__keep(&s, eq), -0.5, &half);
  if (st == DT_SUCCESS) dt__keep(&s, half);
  for (int t = 0; t < 2 && st == DT_SUCCESS; t++) {
    if (!c->needs[t]) continue;
    dt_tensor_t other = c->in[1 - t];
    st = mx ? dt__op2(DT_OP_GT, other, c->in[t], &lose) : dt__op2(DT_OP_GT, c->in[t], other, &lose);
    if (st == DT_SUCCESS) st = dt__op2(DT_OP_SUB, half, dt__keep(&s, lose), &w);
    if (st == DT_SUCCESS) st = dt__opa(DT_OP_ADD_SCALAR, 1, (dt__keep(&s, w), &w), 0, NULL, 1, &one, &w1);
    if (st == DT_SUCCESS) st = dt__op2(DT_OP_MUL, gout[0], dt__keep(&s, w1), &p);
    if (st == DT_SUCCESS) {
      st = dt__unbroadcast(p, c->in[t], &gin[t]);
      dt__tensor_free(p);
    }
  }
  dt__scope_free(&s);
  return st;
}
dt_status_t dt__bw_maximum(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__minmax_bw(c, gout, gin, 1);
}
dt_status_t dt__bw_minimum(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__minmax_bw(c, gout, gin, 0);
}

/* where (c, a, b): g where c for a, elsewhere for b */
dt_status_t dt__bw_where(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t z, p;
  DT_CHECK(dt__zeros_like(gout[0], &z));
  dt_status_t st = DT_SUCCESS;
  for (int t = 1; t <= 2 && st == DT_SUCCESS; t++) {
    if (!c->needs[t]) continue;
    dt_tensor_t in[3] = {c->in[0], t == 1 ? gout[0] : z, t == 1 ? z : gout[0]};
    st = dt__opa(DT_OP_WHERE, 3, in, 0, NULL, 0, NULL, &p);
    if (st == DT_SUCCESS) {
      st = dt__unbroadcast(p, c->in[t], &gin[t]);
      dt__tensor_free(p);
    }
  }
  dt__tensor_free(z);
  return st;
}

/* masked_fill (x, m): g where not m */
dt_status_t dt__bw_masked_fill(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const double zero = 0.0;
  dt_tensor_t in[2] = {gout[0], c->in[1]}, p;
  DT_CHECK(dt__opa(DT_OP_MASKED_FILL, 2, in, 0, NULL, 1, &zero, &p));
  dt_status_t st = dt__unbroadcast(p, c->in[0], &gin[0]);
  dt__tensor_free(p);
  return st;
}

/* gather_dim (x (N, C), idx (N)): the gradient scattered into zeros at (i, idx[i]). */
dt_status_t dt__bw_gather_dim(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  int64_t N = c->in[0]->layout.shape[0];
  const int64_t col[2] = {N, 1};
  dt__scope_t s = {0};
  dt_tensor_t z, ix, gc;
  dt_status_t st = dt__zeros_like(c->in[0], &z);
  if (st == DT_SUCCESS) st = dt__reshape(c->in[1], 2, col, (dt__keep(&s, z), &ix));
  if (st == DT_SUCCESS) st = dt__reshape(gout[0], 2, col, (dt__keep(&s, ix), &gc));
  if (st == DT_SUCCESS) {
    dt__keep(&s, gc);
    dt_tensor_t in[3] = {z, ix, gc};
    const int64_t one[1] = {1};
    st = dt__opa(DT_OP_SCATTER_ADD, 3, in, 1, one, 0, NULL, &gin[0]);
  }
  dt__scope_free(&s);
  return st;
}

/* grouped_mm: out_e = x_e op(W_e) per expert group. d x_e = g_e op(W_e)^T: the same op with the
 * other transpose; d W_e = g_e^T x_e (trans 1, W_e (N, K)) or x_e^T g_e (trans 0, W_e (K, N)). */
dt_status_t dt__bw_grouped_mm(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t trans = dt__op_iarg_n(DT_OP_GROUPED_MM, c->n_iargs, c->iargs, 0) != 0,
                other = !trans;
  if (c->needs[0]) {
    dt_tensor_t in[3] = {gout[0], c->in[1], c->in[2]};
    DT_CHECK(dt__opa(DT_OP_GROUPED_MM, 3, in, 1, &other, 0, NULL, &gin[0]));
  }
  if (c->needs[1]) {
    dt_tensor_t in[3] = {trans ? gout[0] : c->in[0], trans ? c->in[0] : gout[0], c->in[2]};
    DT_CHECK(dt__opa(DT_OP_GROUPED_MM_WGRAD, 3, in, 0, NULL, 0, NULL, &gin[1]));
  }
  return DT_SUCCESS;
}

/* index_add: x's gradient is g; src row i's is g's row idx[i] (an embedding lookup into g). */
dt_status_t dt__bw_index_add(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (c->needs[2]) {
    dt_tensor_t in[2] = {gout[0], c->in[1]};
    DT_CHECK(dt__opa(DT_OP_EMBEDDING, 2, in, 0, NULL, 0, NULL, &gin[2]));
  }
  if (c->needs[0]) {
    gin[0] = gout[0];
    gout[0] = NULL;
  }
  return DT_SUCCESS;
}

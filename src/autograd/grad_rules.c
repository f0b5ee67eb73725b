/* grad_rules.c - backward rules, one per differentiable op, each built from registry ops so the
 * backward goes through the same strategy selection and redistribution as the forward.
 *
 * g is the output gradient. Broadcast inputs get the gradient summed over their broadcast dims.
 *   add/sub: g, +-g          mul: g b, g a           div: g / b, -(g / b) out
 *   mm: g b^T, a^T g         bmm: per batch          linear: g w, g^T x, sum_rows g
 *   exp: g out  log: g / x  sqrt: g / (2 out)  rsqrt: -g out^3 / 2  pow: g p x^(p-1)
 *   relu/silu/gelu/sigmoid/tanh: act_grad          softmax: out (g - sum(g out))
 *   log_softmax: g - exp(out) sum(g)               sum/mean: g expanded (/ count)
 *   rms_norm/layer_norm: *_norm_grad               embedding: embedding_grad
 *   views: g reshaped back  permute: inverse      cat: narrow pieces
 *   rotary: inverse rotation                       sdpa: sdpa_grad (recomputes attention)
 *   dropout: the same mask (same seed, same global indices)
 *   gather: scatter_add into zeros  scatter_add: g, gather(g)  topk: scatter of g into zeros
 *   cross_entropy (mean): (softmax(logits) - onehot) g / N, computed class-sharded
 *   redistribute: back to the source placements, Partial -> Replicate
 */
#include <math.h>

#include "autograd/autograd.h"
#include "strategy/strategy.h"

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
  for (int i = 0; i < s->n; i++) dt_tensor_destroy(s->t[i]);
  s->n = 0;
}

#define RUN(name, n, arr, ni, ia, nf, fa, out) DT_CHECK(dt_op_run(name, n, arr, ni, ia, nf, fa, out))

static dt_status_t dt__op1(const char* op, dt_tensor_t a, dt_tensor_t* out) {
  return dt_op_run(op, 1, &a, 0, NULL, 0, NULL, out);
}
static dt_status_t dt__op2(const char* op, dt_tensor_t a, dt_tensor_t b, dt_tensor_t* out) {
  dt_tensor_t in[2] = {a, b};
  return dt_op_run(op, 2, in, 0, NULL, 0, NULL, out);
}
static dt_status_t dt__scale(dt_tensor_t a, double s, dt_tensor_t* out) {
  return dt_op_run("mul_scalar", 1, &a, 0, NULL, 1, &s, out);
}
static dt_status_t dt__reshape(dt_tensor_t a, int nd, const int64_t* shape, dt_tensor_t* out) {
  return dt_op_run("reshape", 1, &a, nd, shape, 0, NULL, out);
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
  DT_CHECK(dt_op_run("sum", 1, &g, na, args, 0, NULL, &s));
  dt_status_t st = dt__reshape(s, xd, x->layout.shape, out);
  dt_tensor_destroy(s);
  return st;
}

/* Gradient of a reduction: g brought back to x's shape (dims reduced without keepdim put back). */
static dt_status_t dt__expand_back(const dt__node_t* n, dt_tensor_t g, double scale,
                                   dt_tensor_t* out) {
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  dt_tensor_t x = n->in[0]->value;
  c.op = n->op;
  c.n_inputs = 1;
  c.in[0].ndim = x->layout.ndim;
  memcpy(c.in[0].shape, x->layout.shape, sizeof c.in[0].shape);
  c.n_iargs = n->n_iargs;
  memcpy(c.iargs, n->iargs, sizeof c.iargs);
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(&c, &mask, &keep));
  int64_t kshape[DT_MAX_DIMS];
  for (int d = 0; d < x->layout.ndim; d++)
    kshape[d] = (mask & (1u << d)) ? 1 : x->layout.shape[d];
  dt__scope_t s = {0};
  dt_tensor_t gk, z, sc;
  dt_status_t st = dt__reshape(g, x->layout.ndim, kshape, &gk);
  if (st == DT_SUCCESS) {
    dt__keep(&s, gk);
    st = dt__zeros_like(x, &z);
  }
  if (st == DT_SUCCESS) {
    dt__keep(&s, z);
    if (scale != 1.0) {
      st = dt__scale(gk, scale, &sc);
      if (st == DT_SUCCESS) gk = dt__keep(&s, sc);
    }
  }
  if (st == DT_SUCCESS) st = dt__op2("add", z, gk, out);
  dt__scope_free(&s);
  return st;
}

static int64_t dt__numel_of(dt_tensor_t t) {
  int64_t n = 1;
  for (int d = 0; d < t->layout.ndim; d++) n *= t->layout.shape[d];
  return n;
}

/* ---------------------------------------------------------------------------------------------
 * the rules */

typedef dt_status_t (*dt__rule_fn)(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin);

#define X(i) (n->in[i]->value)
#define OUT (n->out[0]->value)
#define G (gout[0])

static dt_status_t dt__g_add(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  int sub = strcmp(n->op, "sub") == 0;
  for (int t = 0; t < 2; t++) {
    if (!n->in[t]->requires_grad) continue;
    dt_tensor_t u;
    DT_CHECK(dt__unbroadcast(G, X(t), &u));
    if (sub && t == 1) {
      dt_status_t st = dt__op1("neg", u, &gin[t]);
      dt_tensor_destroy(u);
      DT_CHECK(st);
    } else {
      gin[t] = u;
    }
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_mul(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  for (int t = 0; t < 2; t++) {
    if (!n->in[t]->requires_grad) continue;
    dt_tensor_t p;
    DT_CHECK(dt__op2("mul", G, X(1 - t), &p));
    dt_status_t st = dt__unbroadcast(p, X(t), &gin[t]);
    dt_tensor_destroy(p);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_div(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt__scope_t s = {0};
  dt_tensor_t q, p, m;
  dt_status_t st = dt__op2("div", G, X(1), &q);
  if (st != DT_SUCCESS) return st;
  dt__keep(&s, q);
  if (n->in[0]->requires_grad) st = dt__unbroadcast(q, X(0), &gin[0]);
  if (st == DT_SUCCESS && n->in[1]->requires_grad) {
    st = dt__op2("mul", q, OUT, &p);
    if (st == DT_SUCCESS) {
      dt__keep(&s, p);
      st = dt__op1("neg", p, &m);
    }
    if (st == DT_SUCCESS) {
      dt__keep(&s, m);
      st = dt__unbroadcast(m, X(1), &gin[1]);
    }
  }
  dt__scope_free(&s);
  return st;
}

static dt_status_t dt__g_unary(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  const char* op = n->op;
  dt__scope_t s = {0};
  dt_status_t st = DT_SUCCESS;
  dt_tensor_t a, b;
  if (!strcmp(op, "neg")) return dt__op1("neg", G, &gin[0]);
  if (!strcmp(op, "mul_scalar")) return dt__scale(G, n->fargs[0], &gin[0]);
  if (!strcmp(op, "add_scalar")) {
    gin[0] = G;
    gout[0] = NULL; /* taken over */
    return DT_SUCCESS;
  }
  if (!strcmp(op, "exp")) return dt__op2("mul", G, OUT, &gin[0]);
  if (!strcmp(op, "log")) return dt__op2("div", G, X(0), &gin[0]);
  if (!strcmp(op, "sqrt")) {
    st = dt__op2("div", G, OUT, &a);
    if (st == DT_SUCCESS) {
      st = dt__scale(a, 0.5, &gin[0]);
      dt_tensor_destroy(a);
    }
    return st;
  }
  if (!strcmp(op, "rsqrt") || !strcmp(op, "pow")) {
    /* rsqrt: -0.5 out^3; pow: p x^(p-1) */
    int rs = !strcmp(op, "rsqrt");
    double e = rs ? 3.0 : n->fargs[0] - 1.0, c = rs ? -0.5 : n->fargs[0];
    dt_tensor_t base = rs ? OUT : X(0);
    st = dt_op_run("pow", 1, &base, 0, NULL, 1, &e, &a);
    if (st == DT_SUCCESS) {
      dt__keep(&s, a);
      st = dt__scale(a, c, &b);
    }
    if (st == DT_SUCCESS) {
      dt__keep(&s, b);
      st = dt__op2("mul", G, b, &gin[0]);
    }
    dt__scope_free(&s);
    return st;
  }
  int64_t kind = !strcmp(op, "relu") ? DT_ACT_RELU : !strcmp(op, "silu") ? DT_ACT_SILU
                 : !strcmp(op, "gelu") ? DT_ACT_GELU : !strcmp(op, "sigmoid") ? DT_ACT_SIGMOID_OUT
                                                                              : DT_ACT_TANH_OUT;
  dt_tensor_t in[2] = {G, (kind == DT_ACT_SIGMOID_OUT || kind == DT_ACT_TANH_OUT) ? OUT : X(0)};
  return dt_op_run("act_grad", 2, in, 1, &kind, 0, NULL, &gin[0]);
}

static dt_status_t dt__g_mm(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (!strcmp(n->op, "mm") || !strcmp(n->op, "mm_t")) { /* no transposed copies */
    int tn = !strcmp(n->op, "mm_t"); /* out = a^T b */
    if (n->in[0]->requires_grad) /* mm: g b^T; mm_t: b g^T = mm_t(g^T..) -> linear(b, g) */
      DT_CHECK(tn ? dt__op2("linear_nobias", X(1), G, &gin[0])
                  : dt__op2("linear_nobias", G, X(1), &gin[0]));
    if (n->in[1]->requires_grad) /* mm: a^T g; mm_t: a g */
      DT_CHECK(tn ? dt__op2("mm", X(0), G, &gin[1]) : dt__op2("mm_t", X(0), G, &gin[1]));
    return DT_SUCCESS;
  }
  const int64_t tdims[2] = {1, 2};
  dt_tensor_t t;
  if (n->in[0]->requires_grad) {
    dt_tensor_t b = X(1);
    DT_CHECK(dt_op_run("transpose", 1, &b, 2, tdims, 0, NULL, &t));
    dt_status_t st = dt__op2("bmm", G, t, &gin[0]);
    dt_tensor_destroy(t);
    DT_CHECK(st);
  }
  if (n->in[1]->requires_grad) {
    dt_tensor_t a = X(0);
    DT_CHECK(dt_op_run("transpose", 1, &a, 2, tdims, 0, NULL, &t));
    dt_status_t st = dt__op2("bmm", t, G, &gin[1]);
    dt_tensor_destroy(t);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

/* linear: y (N, O) = x (N, K) w^T (w (O, K)) + b */
static dt_status_t dt__g_linear(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (n->in[0]->requires_grad) DT_CHECK(dt__op2("mm", G, X(1), &gin[0]));
  if (n->in[1]->requires_grad) DT_CHECK(dt__op2("mm_t", G, X(0), &gin[1])); /* g^T x */
  if (n->n_in == 3 && n->in[2]->requires_grad) {
    const int64_t a[2] = {0, 0};
    dt_tensor_t g = G;
    DT_CHECK(dt_op_run("sum", 1, &g, 2, a, 0, NULL, &gin[2]));
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_addmm(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  double beta = n->n_fargs > 0 ? n->fargs[0] : 1.0, alpha = n->n_fargs > 1 ? n->fargs[1] : 1.0;
  dt_tensor_t t, p;
  if (n->in[0]->requires_grad) {
    DT_CHECK(dt__unbroadcast(G, X(0), &p));
    dt_status_t st = dt__scale(p, beta, &gin[0]);
    dt_tensor_destroy(p);
    DT_CHECK(st);
  }
  for (int k = 1; k <= 2; k++) {
    if (!n->in[k]->requires_grad) continue;
    DT_CHECK(dt__op1("t", X(k == 1 ? 2 : 1), &t));
    dt_status_t st = k == 1 ? dt__op2("mm", G, t, &p) : dt__op2("mm", t, G, &p);
    dt_tensor_destroy(t);
    DT_CHECK(st);
    st = dt__scale(p, alpha, &gin[k]);
    dt_tensor_destroy(p);
    DT_CHECK(st);
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_reduce(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  double scale = 1.0;
  if (!strcmp(n->op, "mean")) {
    int64_t in_n = dt__numel_of(X(0)), out_n = dt__numel_of(OUT);
    scale = in_n > 0 ? (double)out_n / (double)in_n : 0.0;
  }
  return dt__expand_back(n, G, scale, &gin[0]);
}

static dt_status_t dt__g_softmax(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t a[2] = {1, n->iargs[0]};
  dt__scope_t s = {0};
  dt_tensor_t p, r, d, e;
  dt_status_t st;
  if (!strcmp(n->op, "softmax")) {
    st = dt__op2("mul", G, OUT, &p);
    if (st == DT_SUCCESS) st = dt_op_run("sum", 1, (dt__keep(&s, p), &p), 2, a, 0, NULL, &r);
    if (st == DT_SUCCESS) st = dt__op2("sub", G, dt__keep(&s, r), &d);
    if (st == DT_SUCCESS) st = dt__op2("mul", OUT, dt__keep(&s, d), &gin[0]);
  } else {
    dt_tensor_t g = G;
    st = dt_op_run("sum", 1, &g, 2, a, 0, NULL, &r);
    if (st == DT_SUCCESS) st = dt__op1("exp", OUT, (dt__keep(&s, r), &e));
    if (st == DT_SUCCESS) st = dt__op2("mul", dt__keep(&s, e), r, &p);
    if (st == DT_SUCCESS) st = dt__op2("sub", G, dt__keep(&s, p), &gin[0]);
  }
  dt__scope_free(&s);
  return st;
}

static dt_status_t dt__g_norm(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  int layer = !strcmp(n->op, "layer_norm");
  dt_tensor_t in[3] = {G, X(0), X(1)}, outs[2] = {NULL, NULL};
  DT_CHECK(dt_op_run_multi(layer ? "layer_norm_grad" : "rms_norm_grad", 3, in, 0, NULL, n->n_fargs,
                           n->fargs, 2, outs));
  gin[0] = outs[0];
  gin[1] = outs[1];
  if (layer && n->in[2]->requires_grad) {
    int nd = X(0)->layout.ndim;
    int64_t a[DT_MAX_DIMS + 1];
    a[0] = 0;
    for (int d = 0; d + 1 < nd; d++) a[1 + d] = d;
    dt_tensor_t g = G;
    if (nd == 1) return dt__clone(g, &gin[2]);
    DT_CHECK(dt_op_run("sum", 1, &g, nd, a, 0, NULL, &gin[2]));
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_embedding(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  int64_t V = X(0)->layout.shape[0];
  dt_tensor_t in[2] = {G, X(1)};
  return dt_op_run("embedding_grad", 2, in, 1, &V, 0, NULL, &gin[0]);
}

static dt_status_t dt__g_view(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__reshape(G, X(0)->layout.ndim, X(0)->layout.shape, &gin[0]);
}

static dt_status_t dt__g_permute(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (strcmp(n->op, "permute") != 0) /* t and transpose are their own inverse */
    return dt_op_run(n->op, 1, &gout[0], n->n_iargs, n->iargs, 0, NULL, &gin[0]);
  int nd = X(0)->layout.ndim;
  int64_t inv[DT_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    int64_t p = n->iargs[i] < 0 ? n->iargs[i] + nd : n->iargs[i];
    inv[p] = i;
  }
  return dt_op_run("permute", 1, &gout[0], nd, inv, 0, NULL, &gin[0]);
}

static dt_status_t dt__g_cat(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  int nd = OUT->layout.ndim;
  int64_t dim = n->iargs[0] < 0 ? n->iargs[0] + nd : n->iargs[0], at = 0;
  for (int t = 0; t < n->n_in; t++) {
    int64_t len = X(t)->layout.shape[dim];
    if (n->in[t]->requires_grad) {
      const int64_t a[3] = {dim, at, len};
      DT_CHECK(dt_op_run("narrow", 1, &gout[0], 3, a, 0, NULL, &gin[t]));
    }
    at += len;
  }
  return DT_SUCCESS;
}

/* narrow / slice (step 1): g placed between zero blocks along the cut dim (a cat) */
static dt_status_t dt__g_narrow(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  dt_tensor_t x = X(0);
  c.op = n->op;
  c.n_inputs = 1;
  c.in[0].dtype = x->dtype;
  c.in[0].ndim = x->layout.ndim;
  memcpy(c.in[0].shape, x->layout.shape, sizeof c.in[0].shape);
  c.n_iargs = n->n_iargs;
  memcpy(c.iargs, n->iargs, sizeof c.iargs);
  int dim;
  int64_t start, step, len;
  DT_CHECK(dt__slice_args(&c, &dim, &start, &step, &len));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  if (step != 1 && len > 1) { /* strided: scatter g into zeros at start + j * step */
    int nd = G->layout.ndim;
    int64_t total = dt__numel_of(G), inner = 1;
    for (int d2 = dim + 1; d2 < nd; d2++) inner *= G->layout.shape[d2];
    int64_t* idx = (int64_t*)dt__malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    if (idx == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "slice backward indices");
    for (int64_t i = 0; i < total; i++) idx[i] = start + ((i / inner) % len) * step;
    dt_tensor_t it, z;
    dt_status_t st2 = dt_tensor_from_full(x->mesh, DT_I64, nd, G->layout.shape, rep, idx, &it);
    dt__free(idx);
    if (st2 != DT_SUCCESS) return st2;
    st2 = dt__zeros_like(x, &z);
    if (st2 == DT_SUCCESS) {
      dt_tensor_t in[3] = {z, it, G};
      const int64_t d1[1] = {dim};
      st2 = dt_op_run("scatter_add", 3, in, 1, d1, 0, NULL, &gin[0]);
      dt_tensor_destroy(z);
    }
    dt_tensor_destroy(it);
    return st2;
  }
  dt__scope_t s = {0};
  dt_tensor_t parts[3];
  int np = 0;
  int64_t before = start, after = x->layout.shape[dim] - start - len, shp[DT_MAX_DIMS];
  memcpy(shp, x->layout.shape, sizeof shp);
  dt_status_t st = DT_SUCCESS;
  if (before > 0) {
    shp[dim] = before;
    st = dt_tensor_zeros(x->mesh, G->dtype, x->layout.ndim, shp, rep, &parts[np]);
    if (st == DT_SUCCESS) dt__keep(&s, parts[np++]);
  }
  parts[np++] = G;
  if (st == DT_SUCCESS && after > 0) {
    shp[dim] = after;
    st = dt_tensor_zeros(x->mesh, G->dtype, x->layout.ndim, shp, rep, &parts[np]);
    if (st == DT_SUCCESS) dt__keep(&s, parts[np++]);
  }
  const int64_t d[1] = {dim};
  if (st == DT_SUCCESS) st = dt_op_run("cat", np, parts, 1, d, 0, NULL, &gin[0]);
  dt__scope_free(&s);
  return st;
}

static dt_status_t dt__g_rotary(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  const int64_t a[2] = {n->n_iargs ? n->iargs[0] : 1, n->n_iargs > 1 && n->iargs[1] ? 0 : 1};
  return dt_op_run("rotary", 1, &gout[0], 2, a, n->n_fargs, n->fargs, &gin[0]);
}

static dt_status_t dt__g_sdpa(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t in[4] = {X(0), X(1), X(2), G};
  return dt_op_run_multi("sdpa_grad", 4, in, n->n_iargs, n->iargs, n->n_fargs, n->fargs, 3, gin);
}

static dt_status_t dt__g_dropout(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt_op_run("dropout", 1, &gout[0], n->n_iargs, n->iargs, n->n_fargs, n->fargs, &gin[0]);
}

static dt_status_t dt__g_cast(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (!dt__dtype_is_float(X(0)->dtype)) return DT_SUCCESS;
  int64_t dt = X(0)->dtype;
  return dt_op_run("cast", 1, &gout[0], 1, &dt, 0, NULL, &gin[0]);
}

static dt_status_t dt__g_gather(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t z;
  DT_CHECK(dt__zeros_like(X(0), &z));
  dt_tensor_t in[3] = {z, X(1), G};
  dt_status_t st = dt_op_run("scatter_add", 3, in, 1, n->iargs, 0, NULL, &gin[0]);
  dt_tensor_destroy(z);
  return st;
}

static dt_status_t dt__g_scatter_add(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (n->in[2]->requires_grad) {
    dt_tensor_t in[2] = {G, X(1)};
    DT_CHECK(dt_op_run("gather", 2, in, 1, n->iargs, 0, NULL, &gin[2]));
  }
  if (n->in[0]->requires_grad) {
    gin[0] = G;
    gout[0] = NULL;
  }
  return DT_SUCCESS;
}

static dt_status_t dt__g_topk(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (G == NULL) return DT_SUCCESS;
  dt_tensor_t z;
  DT_CHECK(dt__zeros_like(X(0), &z));
  const int64_t dim[1] = {n->iargs[1]};
  dt_tensor_t in[3] = {z, n->out[1]->value, G};
  dt_status_t st = dt_op_run("scatter_add", 3, in, 1, dim, 0, NULL, &gin[0]);
  dt_tensor_destroy(z);
  return st;
}

/* mean cross-entropy: d logits = (softmax(logits) - onehot(targets)) g / N, class-sharded;
 * softmax = exp(x - lse) with the row logsumexp saved by the forward pass */
static dt_status_t dt__g_cross_entropy(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = X(0), tg = X(1), lse = n->saved;
  if (lse == NULL) return DT_FAIL(DT_ERR_INTERNAL, "cross_entropy node without its logsumexp");
  int64_t N = x->layout.shape[0];
  dt__scope_t s = {0};
  dt_tensor_t z, p, idx, neg, oh, gs;
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const int64_t col[2] = {N, 1};
  dt_status_t st = dt__op2("sub", x, lse, &z);
  if (st == DT_SUCCESS) st = dt__op1("exp", dt__keep(&s, z), &p);
  if (st == DT_SUCCESS) st = dt__reshape(tg, 2, col, (dt__keep(&s, p), &idx));
  if (st == DT_SUCCESS)
    st = dt_tensor_full_value(x->mesh, x->dtype, 2, col, rep, -1.0, (dt__keep(&s, idx), &neg));
  if (st == DT_SUCCESS) {
    dt__keep(&s, neg);
    dt_tensor_t in[3] = {p, idx, neg};
    const int64_t one[1] = {1};
    st = dt_op_run("scatter_add", 3, in, 1, one, 0, NULL, &oh);
  }
  /* g / N is a scalar: scale it first, then one pass over the logits */
  if (st == DT_SUCCESS) st = dt__scale(G, N > 0 ? 1.0 / (double)N : 0.0, (dt__keep(&s, oh), &gs));
  if (st == DT_SUCCESS) st = dt__op2("mul", oh, dt__keep(&s, gs), &gin[0]);
  dt__scope_free(&s);
  return st;
}

static dt_status_t dt__g_redistribute(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_placement_t back[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++)
    back[i] = n->src_pl[i].kind == DT_PARTIAL ? dt_replicate() : n->src_pl[i];
  return dt_tensor_redistribute(G, back, &gin[0]);
}

/* amax/amin: the gradient goes to the positions holding the extreme value, split evenly among
 * ties (as PyTorch). */
static dt_status_t dt__g_amax(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = X(0);
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  c.op = n->op;
  c.n_inputs = 1;
  c.in[0].ndim = x->layout.ndim;
  memcpy(c.in[0].shape, x->layout.shape, sizeof c.in[0].shape);
  c.n_iargs = n->n_iargs;
  memcpy(c.iargs, n->iargs, sizeof c.iargs);
  unsigned mask;
  int keep;
  DT_CHECK(dt__reduce_dims(&c, &mask, &keep));
  int64_t kshape[DT_MAX_DIMS], args[1 + DT_MAX_DIMS];
  int na = 1;
  args[0] = 1;
  for (int d = 0; d < x->layout.ndim; d++) {
    kshape[d] = (mask & (1u << d)) ? 1 : x->layout.shape[d];
    if (mask & (1u << d)) args[na++] = d;
  }
  dt__scope_t s = {0};
  dt_tensor_t ok, gk, m, cnt, w;
  dt_status_t st = dt__reshape(OUT, x->layout.ndim, kshape, &ok);
  if (st == DT_SUCCESS) st = dt__reshape(G, x->layout.ndim, kshape, (dt__keep(&s, ok), &gk));
  if (st == DT_SUCCESS) st = dt__op2("eq", x, ok, (dt__keep(&s, gk), &m));
  if (st == DT_SUCCESS) st = dt_op_run("sum", 1, (dt__keep(&s, m), &m), na, args, 0, NULL, &cnt);
  if (st == DT_SUCCESS) st = dt__op2("div", gk, dt__keep(&s, cnt), &w);
  if (st == DT_SUCCESS) st = dt__op2("mul", m, dt__keep(&s, w), &gin[0]);
  dt__scope_free(&s);
  return st;
}

/* maximum/minimum: the gradient goes to the chosen operand, to a on ties. */
static dt_status_t dt__g_maximum(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  int mx = !strcmp(n->op, "maximum");
  dt__scope_t s = {0};
  dt_tensor_t ma, mb, p;
  /* a wins where a >= b (maximum) or b >= a (minimum) */
  dt_status_t st = mx ? dt__op2("ge", X(0), X(1), &ma) : dt__op2("ge", X(1), X(0), &ma);
  if (st == DT_SUCCESS) {
    dt__keep(&s, ma);
    st = dt__scale(ma, -1.0, &mb);
  }
  if (st == DT_SUCCESS) {
    dt_tensor_t one;
    double c1 = 1.0;
    st = dt_op_run("add_scalar", 1, (dt__keep(&s, mb), &mb), 0, NULL, 1, &c1, &one);
    if (st == DT_SUCCESS) mb = dt__keep(&s, one);
  }
  for (int t = 0; t < 2 && st == DT_SUCCESS; t++) {
    if (!n->in[t]->requires_grad) continue;
    st = dt__op2("mul", G, t ? mb : ma, &p);
    if (st == DT_SUCCESS) {
      st = dt__unbroadcast(p, X(t), &gin[t]);
      dt_tensor_destroy(p);
    }
  }
  dt__scope_free(&s);
  return st;
}

/* where (c, a, b): g where c for a, elsewhere for b; masked_fill (x, m): g where not m. */
static dt_status_t dt__g_where(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt__scope_t s = {0};
  dt_tensor_t z, p;
  dt_status_t st = dt__zeros_like(G, &z);
  if (st != DT_SUCCESS) return st;
  dt__keep(&s, z);
  if (!strcmp(n->op, "masked_fill")) {
    const double zero = 0.0;
    dt_tensor_t in[2] = {G, X(1)};
    st = dt_op_run("masked_fill", 2, in, 0, NULL, 1, &zero, &p);
    if (st == DT_SUCCESS) {
      st = dt__unbroadcast(p, X(0), &gin[0]);
      dt_tensor_destroy(p);
    }
  } else {
    for (int t = 1; t <= 2 && st == DT_SUCCESS; t++) {
      if (!n->in[t]->requires_grad) continue;
      dt_tensor_t in[3] = {X(0), t == 1 ? G : z, t == 1 ? z : G};
      st = dt_op_run("where", 3, in, 0, NULL, 0, NULL, &p);
      if (st == DT_SUCCESS) {
        st = dt__unbroadcast(p, X(t), &gin[t]);
        dt_tensor_destroy(p);
      }
    }
  }
  dt__scope_free(&s);
  return st;
}

/* gather_dim (x (N, C), idx (N)): the gradient scattered into zeros at (i, idx[i]). */
static dt_status_t dt__g_gather_dim(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  int64_t N = X(0)->layout.shape[0];
  const int64_t col[2] = {N, 1};
  dt__scope_t s = {0};
  dt_tensor_t z, ix, gc;
  dt_status_t st = dt__zeros_like(X(0), &z);
  if (st == DT_SUCCESS) st = dt__reshape(X(1), 2, col, (dt__keep(&s, z), &ix));
  if (st == DT_SUCCESS) st = dt__reshape(G, 2, col, (dt__keep(&s, ix), &gc));
  if (st == DT_SUCCESS) {
    dt__keep(&s, gc);
    dt_tensor_t in[3] = {z, ix, gc};
    const int64_t one[1] = {1};
    st = dt_op_run("scatter_add", 3, in, 1, one, 0, NULL, &gin[0]);
  }
  dt__scope_free(&s);
  return st;
}

/* comparisons are piecewise constant: no gradient flows */
static dt_status_t dt__g_none(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  (void)n;
  (void)gout;
  (void)gin;
  return DT_SUCCESS;
}

static const struct {
  const char* op;
  dt__rule_fn fn;
} dt__rules[] = {
    {"eq", dt__g_none},          {"ge", dt__g_none},           {"gt", dt__g_none},
    {"amax", dt__g_amax},        {"amin", dt__g_amax},         {"maximum", dt__g_maximum},
    {"minimum", dt__g_maximum},  {"where", dt__g_where},       {"masked_fill", dt__g_where},
    {"gather_dim", dt__g_gather_dim},
    {"add", dt__g_add},          {"sub", dt__g_add},           {"mul", dt__g_mul},
    {"div", dt__g_div},          {"neg", dt__g_unary},         {"mul_scalar", dt__g_unary},
    {"add_scalar", dt__g_unary}, {"exp", dt__g_unary},         {"log", dt__g_unary},
    {"sqrt", dt__g_unary},       {"rsqrt", dt__g_unary},       {"pow", dt__g_unary},
    {"relu", dt__g_unary},       {"silu", dt__g_unary},        {"gelu", dt__g_unary},
    {"sigmoid", dt__g_unary},    {"tanh", dt__g_unary},        {"mm", dt__g_mm},
    {"bmm", dt__g_mm},           {"mm_t", dt__g_mm},           {"linear", dt__g_linear},     {"linear_nobias", dt__g_linear},
    {"addmm", dt__g_addmm},      {"sum", dt__g_reduce},        {"mean", dt__g_reduce},
    {"softmax", dt__g_softmax},  {"log_softmax", dt__g_softmax}, {"rms_norm", dt__g_norm},
    {"layer_norm", dt__g_norm},  {"embedding", dt__g_embedding}, {"view", dt__g_view},
    {"reshape", dt__g_view},     {"flatten", dt__g_view},      {"unflatten", dt__g_view},
    {"squeeze", dt__g_view},     {"unsqueeze", dt__g_view},    {"permute", dt__g_permute},
    {"transpose", dt__g_permute}, {"t", dt__g_permute},        {"cat", dt__g_cat},
    {"rotary", dt__g_rotary},    {"sdpa", dt__g_sdpa},         {"dropout", dt__g_dropout},
    {"cast", dt__g_cast},        {"gather", dt__g_gather},     {"scatter_add", dt__g_scatter_add},
    {"topk", dt__g_topk},        {"narrow", dt__g_narrow},     {"slice", dt__g_narrow},        {"cross_entropy", dt__g_cross_entropy},
    {"redistribute", dt__g_redistribute},
};

static dt__rule_fn dt__rule_find(const char* op) {
  for (size_t i = 0; i < sizeof dt__rules / sizeof dt__rules[0]; i++)
    if (strcmp(dt__rules[i].op, op) == 0) return dt__rules[i].fn;
  return NULL;
}

int dt__grad_has_rule(const char* op) { return dt__rule_find(op) != NULL; }

dt_status_t dt__grad_apply(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt__rule_fn fn = dt__rule_find(n->op);
  if (fn == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no backward rule for %s", n->op);
  if (gout[0] == NULL && strcmp(n->op, "topk") != 0) return DT_SUCCESS;
  return fn(n, gout, gin);
}

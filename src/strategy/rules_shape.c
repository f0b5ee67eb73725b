/* rules_shape.c - rule generators of the shape ops: view/reshape, flatten, unflatten, squeeze,
 * unsqueeze (one dim-map algebra), slice/narrow, cat, stack, expand, tril/triu, cumsum and
 * index_select.
 *
 * A reshape is split into groups of input dims that hold the same elements as a group of output
 * dims ((B, S, D) -> (B*S, D): groups {B,S}->{B*S} and {D}->{D}). A shard passes through a group
 * only on its leading (outermost non-unit) dim on both sides: [S(lead_out); S(lead_in)]. Whether
 * the chunk rule then puts the same elements on each rank depends on the mesh (7 rows over 2 ranks
 * are 4+3, but 7*6 flattened elements are 21+21), so a per-mesh check keeps only candidates whose
 * every local box maps to the same elements in the same order; otherwise the group is replicated
 * first. Every Partial passes a view (it is linear and keeps max/min). Shapes of 0 elements are
 * one group of all dims (any of them reshapes into any other, as in PyTorch): R, the shard of
 * the leading dims and every Partial pass, other shards are moved first (no elements move).
 *   slice/narrow (dim): [R; R] [S(d); S(d)] for d != dim, every Partial passes
 *   cat (dim):          [R; R..] [S(d); S(d)..] for d != dim, [P(op); P(op)..] for every op
 *   stack (dim):        [R; R..] [S(d or d + 1); S(d)..] for every input dim, every Partial
 *   expand (sizes):     [R; R] [S(d); S(d - lead)] for every dim that keeps its size; every
 *                       Partial passes one that grows nothing; a broadcast dim (new, or size 1
 *                       grown) is R first
 *   tril / triu:        [R; R] [S(d); S(d)] for every dim (the kernels read the shards'
 *                       offsets), every Partial passes (a selection of elements)
 *   cumsum (dim):       [R; R] [S(d); S(d)] for d != dim; P(sum), P(avg) of floats, P(sum) of
 *                       i64 pass
 *   index_select (dim): [S(d); S(d), R] for d != dim, [S(dim); R, S(0)], [P(sum); S(dim), R]
 *                       (masked local lookup), every Partial of x passes
 */
#include <stdio.h>

#include "strategy/strategy.h"

static int dt__add(dt_op_rule_t* rules, int cap, int* n, const dt_op_rule_t* r) {
  if (*n >= cap) return 0;
  rules[(*n)++] = *r;
  return 1;
}

static int64_t dt__norm_dim(int64_t d, int nd) { return d < 0 ? d + nd : d; }

int dt__view_groups(int na, const int64_t* a, int nb, const int64_t* b, dt_view_group_t* g,
                    int cap) {
  int i = 0, j = 0, n = 0, paired = 1;
  while (i < na || j < nb) {
    if (n >= cap) {
      paired = 0;
      break;
    }
    int i0 = i, j0 = j;
    int64_t pa = 1, pb = 1;
    if (i < na) pa *= a[i++];
    if (j < nb) pb *= b[j++];
    while (pa != pb) {
      if (pa < pb) {
        if (i >= na) break;
        pa *= a[i++];
      } else {
        if (j >= nb) break;
        pb *= b[j++];
      }
    }
    if (pa != pb) {
      paired = 0;
      break;
    }
    /* size-1 dims right after a group belong to it (keeps leading dims stable) */
    g[n++] = (dt_view_group_t){i0, i, j0, j};
  }
  if (paired) return n;
  /* No elements, and the walk could not pair the dims ((3, 0) -> (0, 3): a product stuck at 0
   * never meets the other side's). Every shape of 0 elements holds the same (no) elements as
   * every other: one group of all dims, whose shard rule and per-mesh check then hold trivially.
   * Where the walk does pair them ((2, 0, 8) -> (2, 0, 4, 2)) its groups stand, so a shard of
   * another group still passes without moving. */
  int za = 0, zb = 0;
  for (int d = 0; d < na; d++) za |= a[d] == 0;
  for (int d = 0; d < nb; d++) zb |= b[d] == 0;
  if (!za || !zb || cap < 1) return -1;
  g[0] = (dt_view_group_t){0, na, 0, nb};
  return 1;
}

/* ---------------------------------------------------------------------------------------------
 * output shape of each view op */

static dt_status_t dt__view_shape(int op_id, const dt_op_call_t* call, dt_tensor_meta_t* out) {
  const dt_tensor_meta_t* x = &call->in[0];
  int nd = x->ndim;
  int64_t numel = 1;
  for (int d = 0; d < nd; d++) numel *= x->shape[d];
  out->dtype = x->dtype;
  const char* op = call->op;
  if (op_id == DT_OP_VIEW || op_id == DT_OP_RESHAPE) {
    int infer = -1;
    int64_t known = 1;
    out->ndim = call->n_iargs;
    for (int d = 0; d < call->n_iargs; d++) {
      int64_t s = call->iargs[d];
      if (s == -1) {
        if (infer >= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: only one dim can be -1", op);
        infer = d;
      } else if (s < 0) {
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: invalid size %lld", op, (long long)s);
      } else if (!dt__mul_i64(known, s, &known)) {
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: the sizes' product overflows 64 bits", op);
      }
      out->shape[d] = s;
    }
    if (infer >= 0) {
      if (known == 0 && numel == 0) /* 0 * s is 0 for every s (PyTorch refuses it too) */
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: cannot infer dim %d (-1) of a tensor of 0 "
                       "elements: the other sizes multiply to 0, so it could be any value", op,
                       infer);
      if (known == 0 || numel % known != 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: cannot infer dim %d of %lld elements", op, infer,
                       (long long)numel);
      out->shape[infer] = numel / known;
      known *= out->shape[infer];
    }
    if (known != numel)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: shape of %lld elements cannot hold %lld", op,
                     (long long)known, (long long)numel);
    return DT_SUCCESS;
  }
  if (op_id == DT_OP_FLATTEN) {
    /* the schema's start_dim=0, end_dim=-1 */
    const int64_t s0 = dt__op_iarg(DT_OP_FLATTEN, call, 0);
    const int64_t e0 = dt__op_iarg(DT_OP_FLATTEN, call, 1);
    int64_t s = dt__norm_dim(s0, nd), e = dt__norm_dim(e0, nd);
    if (nd == 0) s = e = 0;
    if (call->n_iargs > 2 || (nd > 0 && (s < 0 || e >= nd || s > e)))
      return DT_FAIL(DT_ERR_INVALID_ARG, "flatten: start_dim=%lld, end_dim=%lld for a %d-dim "
                     "tensor; expected dims in [%d, %d] with start_dim <= end_dim", (long long)s0,
                     (long long)e0, nd, -nd, nd - 1);
    out->ndim = 0;
    for (int d = 0; d < nd; d++) {
      if (d <= s || d > e) out->shape[out->ndim++] = x->shape[d];
      else out->shape[out->ndim - 1] *= x->shape[d];
    }
    if (nd == 0) out->shape[out->ndim++] = 1;
    return DT_SUCCESS;
  }
  if (op_id == DT_OP_UNFLATTEN) {
    if (call->n_iargs < 2)
      return DT_FAIL(DT_ERR_INVALID_ARG, "unflatten takes iargs [dim, size...]");
    int64_t dim = dt__norm_dim(call->iargs[0], nd);
    int k = call->n_iargs - 1;
    if (dim < 0 || dim >= nd || nd - 1 + k > DT_MAX_DIMS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "unflatten: dim %lld out of range or too many dims",
                     (long long)call->iargs[0]);
    int infer = -1;
    int64_t known = 1, sizes[DT_MAX_DIMS];
    for (int j = 0; j < k; j++) {
      sizes[j] = call->iargs[1 + j];
      if (sizes[j] == -1 && infer < 0) infer = j;
      else if (sizes[j] < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "unflatten: invalid sizes");
      else if (!dt__mul_i64(known, sizes[j], &known))
        return DT_FAIL(DT_ERR_INVALID_ARG, "unflatten: the sizes' product overflows 64 bits");
    }
    if (infer >= 0) {
      if (known == 0 || x->shape[dim] % known != 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "unflatten: cannot infer a size");
      sizes[infer] = x->shape[dim] / known;
      known *= sizes[infer];
    }
    if (known != x->shape[dim])
      return DT_FAIL(DT_ERR_INVALID_ARG, "unflatten: sizes multiply to %lld, dim %lld has %lld",
                     (long long)known, (long long)dim, (long long)x->shape[dim]);
    out->ndim = 0;
    for (int d = 0; d < nd; d++) {
      if (d != dim) out->shape[out->ndim++] = x->shape[d];
      else
        for (int j = 0; j < k; j++) out->shape[out->ndim++] = sizes[j];
    }
    return DT_SUCCESS;
  }
  if (op_id == DT_OP_SQUEEZE) {
    if (call->n_iargs > 1) return DT_FAIL(DT_ERR_INVALID_ARG, "squeeze takes iargs [] or [dim]");
    int64_t dim = call->n_iargs ? dt__norm_dim(call->iargs[0], nd) : -1;
    if (call->n_iargs && (dim < 0 || dim >= nd))
      return DT_FAIL(DT_ERR_INVALID_ARG, "squeeze: dim %lld out of range for %d dims",
                     (long long)call->iargs[0], nd);
    out->ndim = 0;
    for (int d = 0; d < nd; d++)
      if (!(x->shape[d] == 1 && (dim < 0 || d == dim))) out->shape[out->ndim++] = x->shape[d];
    return DT_SUCCESS;
  }
  if (op_id == DT_OP_UNSQUEEZE) {
    if (call->n_iargs != 1) return DT_FAIL(DT_ERR_INVALID_ARG, "unsqueeze takes iargs [dim]");
    int64_t dim = dt__norm_dim(call->iargs[0], nd + 1);
    if (dim < 0 || dim > nd || nd + 1 > DT_MAX_DIMS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "unsqueeze: dim %lld out of range for %d dims",
                     (long long)call->iargs[0], nd);
    out->ndim = nd + 1;
    for (int d = 0, o = 0; o < nd + 1; o++)
      out->shape[o] = o == dim ? 1 : x->shape[d++];
    return DT_SUCCESS;
  }
  return DT_FAIL(DT_ERR_INTERNAL, "%s is not a view op", op);
}

static int dt__lead(const int64_t* shape, int d0, int d1) {
  for (int d = d0; d < d1; d++)
    if (shape[d] != 1) return d;
  return -1;
}

static dt_status_t dt__view_rules(int op_id, const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                  int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  DT_CHECK(dt__view_shape(op_id, call, out_meta));
  const dt_tensor_meta_t* x = &call->in[0];
  dt_view_group_t g[2 * DT_MAX_DIMS];
  int ng = dt__view_groups(x->ndim, x->shape, out_meta->ndim, out_meta->shape, g, 2 * DT_MAX_DIMS);
  if (ng < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: shapes do not hold the same elements", call->op);
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int k = 0; k < ng; k++) {
    int li = dt__lead(x->shape, g[k].i0, g[k].i1), lo = dt__lead(out_meta->shape, g[k].o0, g[k].o1);
    if (li < 0 || lo < 0) continue;
    r.in[0] = dt_shard(li);
    r.out[0] = dt_shard(lo);
    dt__add(rules, cap, n, &r);
  }
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    r.out[0] = r.in[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

#define DT__VIEW_OP(fname, id)                                                                  \
  dt_status_t fname(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,           \
                    dt_op_rule_t* rules, int cap, int* n) {                                     \
    return dt__view_rules(id, call, out_meta, n_out, rules, cap, n);                            \
  }
DT__VIEW_OP(dt__reshape_rules, DT_OP_RESHAPE) /* view too: the same shape arguments */
DT__VIEW_OP(dt__flatten_rules, DT_OP_FLATTEN)
DT__VIEW_OP(dt__unflatten_rules, DT_OP_UNFLATTEN)
DT__VIEW_OP(dt__squeeze_rules, DT_OP_SQUEEZE)
DT__VIEW_OP(dt__unsqueeze_rules, DT_OP_UNSQUEEZE)
#undef DT__VIEW_OP

/* Elements of the box (off, len) of `shape` restricted to dims [d0, d1), as a range of the
 * group's row-major index space; 0 if they do not form one contiguous range. */
static int dt__group_range(const int64_t* shape, const int64_t* off, const int64_t* len, int d0,
                           int d1, int64_t* start, int64_t* count) {
  int64_t c = 1;
  for (int d = d0; d < d1; d++) c *= len[d];
  *count = c;
  *start = 0;
  if (c == 0) return 1;
  /* the dims after the last one not taken whole must be whole (true by the choice of k) and the
   * dims before it must hold a single index */
  int k = d0; /* last dim not taken whole; d0 when all are whole */
  for (int d = d1 - 1; d >= d0; d--)
    if (len[d] != shape[d]) {
      k = d;
      break;
    }
  for (int d = d0; d < k; d++)
    if (len[d] != 1) return 0;
  for (int d = d0; d < d1; d++) *start = *start * shape[d] + off[d];
  return 1;
}

int dt__view_check(dt_mesh_t mesh, const dt_op_call_t* call, const dt_op_choice_t* c) {
  const dt_tensor_meta_t *x = &call->in[0], *y = &c->out_meta[0];
  int sharded = 0;
  for (int i = 0; i < mesh->ndim; i++) sharded |= c->in[0][i].kind == DT_SHARD;
  if (!sharded) return 1;
  dt_view_group_t g[2 * DT_MAX_DIMS];
  int ng = dt__view_groups(x->ndim, x->shape, y->ndim, y->shape, g, 2 * DT_MAX_DIMS);
  dt_layout_t li, lo;
  if (ng < 0 || !dt__layout_try(&li, mesh->ndim, mesh->shape, x->ndim, x->shape, c->in[0]) ||
      !dt__layout_try(&lo, mesh->ndim, mesh->shape, y->ndim, y->shape, c->out[0]))
    return 0;
  for (int p = 0; p < mesh->numel; p++) {
    int coords[DT_MAX_MESH_DIMS];
    dt__grid_coords(mesh->ndim, mesh->shape, p, coords);
    int64_t io[DT_MAX_DIMS], il[DT_MAX_DIMS], oo[DT_MAX_DIMS], ol[DT_MAX_DIMS];
    dt__layout_box(&li, coords, io, il);
    dt__layout_box(&lo, coords, oo, ol);
    for (int k = 0; k < ng; k++) {
      int64_t s0, n0, s1, n1;
      if (!dt__group_range(x->shape, io, il, g[k].i0, g[k].i1, &s0, &n0) ||
          !dt__group_range(y->shape, oo, ol, g[k].o0, g[k].o1, &s1, &n1))
        return 0;
      if (n0 != n1 || (n0 != 0 && s0 != s1)) return 0;
    }
  }
  return 1;
}

/* ---------------------------------------------------------------------------------------------
 * slice / narrow */

dt_status_t dt__slice_args(int op, const dt_op_call_t* call, int* dim, int64_t* start,
                           int64_t* step, int64_t* len) {
  const dt_tensor_meta_t* x = &call->in[0];
  int nd = x->ndim;
  int narrow = op == DT_OP_NARROW;
  if (narrow ? call->n_iargs != 3 : (call->n_iargs < 3 || call->n_iargs > 4))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes iargs %s", call->op,
                   narrow ? "[dim, start, length]" : "[dim, start, end(, step)]");
  int64_t d = dt__norm_dim(call->iargs[0], nd);
  if (d < 0 || d >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: dim %lld out of range for %d dims", call->op,
                   (long long)call->iargs[0], nd);
  int64_t size = x->shape[d];
  *dim = (int)d;
  if (narrow) {
    int64_t s = call->iargs[1] < 0 ? call->iargs[1] + size : call->iargs[1];
    int64_t l = call->iargs[2];
    if (s < 0 || l < 0 || s > size || l > size - s)
      return DT_FAIL(DT_ERR_INVALID_ARG, "narrow: start %lld length %lld out of range for %lld",
                     (long long)call->iargs[1], (long long)l, (long long)size);
    *start = s;
    *step = 1;
    *len = l;
    return DT_SUCCESS;
  }
  /* Python slice semantics: negative indices count from the end, out-of-range ones clamp. */
  int64_t st = dt__op_iarg(DT_OP_SLICE, call, 3); /* the schema's step=1 */
  if (st <= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "slice: step=%lld (iargs[3]) must be positive",
                              (long long)st);
  int64_t s = call->iargs[1], e = call->iargs[2];
  if (s < 0) s += size;
  if (e < 0) e += size;
  s = s < 0 ? 0 : s > size ? size : s;
  e = e < 0 ? 0 : e > size ? size : e;
  *start = s;
  *step = st;
  *len = e > s ? 1 + (e - s - 1) / st : 0; /* (no overflow with a huge step) */
  return DT_SUCCESS;
}

static dt_status_t dt__cut_rules(int op, const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                 int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  int dim;
  int64_t start, step, len;
  DT_CHECK(dt__slice_args(op, call, &dim, &start, &step, &len));
  *out_meta = call->in[0];
  out_meta->shape[dim] = len;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < call->in[0].ndim; d++) {
    if (d == dim) continue;
    r.out[0] = r.in[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  for (int ro = 0; ro < DT_REDUCE_COUNT; ro++) {
    r.out[0] = r.in[0] = dt_partial((dt_reduce_op_t)ro);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__slice_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  return dt__cut_rules(DT_OP_SLICE, call, out_meta, n_out, rules, cap, n);
}
dt_status_t dt__narrow_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                             dt_op_rule_t* rules, int cap, int* n) {
  return dt__cut_rules(DT_OP_NARROW, call, out_meta, n_out, rules, cap, n);
}

/* cat's and stack's rules (dim: the joined dim of the output): [R; R..], each input dim d's shard
 * [S(d'); S(d)..] (cat: every d but dim, d' = d; stack: every d, d' = d or d + 1 past the new
 * dim), and [P(op); P(op)..] for every op (a copy). */
static void dt__join_rules(const dt_op_call_t* call, int dim, int stack, dt_op_rule_t* rules,
                           int cap, int* n) {
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < call->in[0].ndim; d++) {
    if (!stack && d == dim) continue;
    r.out[0] = dt_shard(stack && d >= dim ? d + 1 : d);
    for (int t = 0; t < call->n_inputs; t++) r.in[t] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    r.out[0] = dt_partial((dt_reduce_op_t)op);
    for (int t = 0; t < call->n_inputs; t++) r.in[t] = r.out[0];
    dt__add(rules, cap, n, &r);
  }
}

/* ---------------------------------------------------------------------------------------------
 * cat */

dt_status_t dt__cat_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                                 int* n_out, dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  int nd = x->ndim;
  if (call->n_iargs != 1) return DT_FAIL(DT_ERR_INVALID_ARG, "cat takes iargs [dim]");
  int64_t dim = dt__norm_dim(call->iargs[0], nd);
  if (nd == 0 || dim < 0 || dim >= nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cat: dim %lld out of range for %d dims",
                   (long long)call->iargs[0], nd);
  *out_meta = *x;
  out_meta->shape[dim] = 0;
  for (int t = 0; t < call->n_inputs; t++) {
    const dt_tensor_meta_t* y = &call->in[t];
    if (y->ndim != nd || y->dtype != x->dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "cat: input %d must be a %d-dim %s tensor", t, nd,
                     dt_dtype_name(x->dtype));
    for (int d = 0; d < nd; d++)
      if (d != dim && y->shape[d] != x->shape[d])
        return DT_FAIL(DT_ERR_INVALID_ARG, "cat: input %d has size %lld at dim %d, expected %lld",
                       t, (long long)y->shape[d], d, (long long)x->shape[d]);
    out_meta->shape[dim] += y->shape[dim];
  }
  dt__join_rules(call, (int)dim, 0, rules, cap, n);
  return DT_SUCCESS;
}

/* stack (1 to 8 inputs of one shape, iargs [dim = 0] in [-(nd + 1), nd]): the inputs side by side
 * along a new dim, as torch.stack (dtypes promoted first, as cat's). An input dim d is output dim
 * d (d < dim) or d + 1: its shard passes; every Partial passes (a copy). */
dt_status_t dt__stack_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                            dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  const int nd = x->ndim;
  if (call->n_iargs > 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "stack takes iargs [dim], got %d values", call->n_iargs);
  const int64_t d0 = dt__op_iarg(DT_OP_STACK, call, 0);
  if (d0 < -(nd + 1) || d0 > nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "stack: dim %lld out of range for %d-dim inputs (valid: %d "
                   "to %d)", (long long)d0, nd, -(nd + 1), nd);
  if (nd + 1 > DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "stack: %d-dim inputs give %d dims, at most %d", nd,
                   nd + 1, DT_MAX_DIMS);
  const int dim = (int)(d0 < 0 ? d0 + nd + 1 : d0);
  for (int t = 1; t < call->n_inputs; t++) {
    const dt_tensor_meta_t* y = &call->in[t];
    if (y->ndim != nd || y->dtype != x->dtype)
      return DT_FAIL(DT_ERR_INVALID_ARG, "stack: every input must have input 0's shape and dtype "
                     "(%d dims, %s); input %d has %d dims, %s", nd, dt_dtype_name(x->dtype), t,
                     y->ndim, dt_dtype_name(y->dtype));
    for (int d = 0; d < nd; d++)
      if (y->shape[d] != x->shape[d])
        return DT_FAIL(DT_ERR_INVALID_ARG, "stack: every input must have input 0's shape; input "
                       "%d has size %lld at dim %d, input 0 %lld", t, (long long)y->shape[d], d,
                       (long long)x->shape[d]);
  }
  *out_meta = *x;
  out_meta->ndim = nd + 1;
  for (int d = 0; d <= nd; d++)
    out_meta->shape[d] = d < dim ? x->shape[d] : d == dim ? call->n_inputs : x->shape[d - 1];
  dt__join_rules(call, dim, 1, rules, cap, n);
  return DT_SUCCESS;
}

/* expand (iargs: the output's sizes, -1 keeping a dim; `lead` new dims in front), PyTorch's
 * Tensor.expand: only size-1 dims grow, new dims come first and take no -1. The output is a
 * materialized copy (tensors here are contiguous), so a shard passes every dim that keeps its size
 * and a broadcast dim is replicated first (its one element is every rank's); a Partial passes an
 * expand that grows nothing (a copy is linear and keeps max and min). No rule shards a broadcast dim of a replicated input:
 * it would save memory here but make the next op that wants the whole dim gather it. */
dt_status_t dt__expand_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                             dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  int nd = x->ndim, no = call->n_iargs, lead = no - nd;
  if (no > DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "expand: %d sizes, at most %d dims", no, DT_MAX_DIMS);
  if (lead < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "expand: %d sizes for a %d-dim tensor: give at least one "
                   "size per dim (-1 keeps a dim's size)", no, nd);
  *out_meta = *x;
  out_meta->ndim = no;
  int64_t numel = 1;
  for (int d = 0; d < no; d++) {
    int64_t s = call->iargs[d], xs = d < lead ? -1 : x->shape[d - lead];
    if (d < lead && s == -1)
      return DT_FAIL(DT_ERR_INVALID_ARG, "expand: size -1 in dim %d, a new leading dim (the "
                     "tensor has %d dims): a new dim needs its size", d, nd);
    if (s == -1) s = xs;
    if (s < 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "expand: invalid size %lld in dim %d",
                     (long long)call->iargs[d], d);
    if (d >= lead && xs != 1 && s != xs)
      return DT_FAIL(DT_ERR_INVALID_ARG, "expand: size %lld in dim %d must match the tensor's "
                     "size %lld there (only dims of size 1 expand; -1 keeps a size)",
                     (long long)s, d, (long long)xs);
    if (!dt__mul_i64(numel, s, &numel))
      return DT_FAIL(DT_ERR_INVALID_ARG, "expand: the sizes' product overflows 64 bits");
    out_meta->shape[d] = s;
  }
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = lead; d < no; d++) {
    if (x->shape[d - lead] != out_meta->shape[d]) continue;
    r.in[0] = dt_shard(d - lead);
    r.out[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  /* A Partial passes only an expand that grows nothing (new dims of size 1, sizes kept): one that
   * grows would hand the next op a Partial k times the input's size to reduce, where reducing the
   * input first moves 1/k of it (the selection is greedy and cannot see that). */
  int grows = 0; /* (an empty output grows nothing: its Partial costs nothing to keep) */
  for (int d = 0; d < no; d++)
    grows |= d < lead ? out_meta->shape[d] != 1 : out_meta->shape[d] != x->shape[d - lead];
  if (numel == 0) grows = 0;
  for (int op = 0; op < DT_REDUCE_COUNT && !grows; op++) {
    r.out[0] = r.in[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

/* tril / triu (iargs [diagonal = 0]): the matrices of the last two dims with the elements above
 * (tril: column - row > diagonal) or below (triu: column - row < diagonal) the diagonal zeroed, as
 * torch.tril / torch.triu; any dtype. The kernels read each shard's global row and column from
 * its offsets, so every dim passes sharded, the matrix dims included: no move. The op selects
 * elements (each is kept or becomes 0, the same on every rank), so every Partial passes: sum and
 * avg of zeros are 0, max and min of zeros are 0. */
dt_status_t dt__tril_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                           dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  if (call->n_iargs > 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes iargs [diagonal], got %d values", call->op,
                   call->n_iargs);
  if (x->ndim < 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: the tensor has %d dim%s; it needs at least 2 (a matrix "
                   "or a batch of them in the last two dims), as PyTorch", call->op, x->ndim,
                   x->ndim == 1 ? "" : "s");
  *out_meta = *x;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < x->ndim; d++) {
    r.in[0] = r.out[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    r.in[0] = r.out[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__cumsum_args(const dt_op_call_t* call, int* dim, int* reverse) {
  const int nd = call->in[0].ndim, wrap = nd ? nd : 1; /* a 0-d tensor's dims wrap as 1-d's */
  const int64_t d = dt__op_iarg(DT_OP_CUMSUM, call, 0), rv = dt__op_iarg(DT_OP_CUMSUM, call, 1);
  if (call->n_iargs < 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cumsum needs a dim (iargs [dim, reverse = 0])");
  if (call->n_iargs > 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cumsum takes iargs [dim, reverse = 0], got %d values",
                   call->n_iargs);
  if (d < -wrap || d >= wrap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cumsum: dim=%lld out of range for a %d-dim tensor "
                   "(valid: %d to %d)", (long long)d, nd, -wrap, wrap - 1);
  if (rv != 0 && rv != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cumsum: reverse=%lld, expected 0 or 1", (long long)rv);
  *dim = nd == 0 ? -1 : (int)(d < 0 ? d + nd : d); /* -1: a 0-d tensor, nothing to scan */
  *reverse = (int)rv;
  return DT_SUCCESS;
}

/* cumsum (iargs [dim, reverse = 0]): out[.., i, ..] = x[.., 0, ..] + .. + x[.., i, ..] along dim
 * (reverse: x[.., i, ..] + .. + x[.., n-1, ..], the gradient's form), as torch.cumsum: floats keep
 * their dtype, i32 and i64 give i64 (wrapping). The scanned dim is whole on each rank (a prefix
 * needs every earlier element); the other dims pass sharded. The scan is linear: P(sum) and P(avg)
 * of floats pass; of integers only an i64 P(sum) (wrapping sums are exact in any order; an i32
 * Partial's pieces would be summed in i64 where the reduced tensor wraps at 32 bits, and a
 * truncating integer average does not distribute). P(max) and P(min) are reduced first. */
dt_status_t dt__cumsum_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                             dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t* x = &call->in[0];
  int dim, reverse;
  DT_CHECK(dt__cumsum_args(call, &dim, &reverse));
  *out_meta = *x;
  out_meta->dtype = dt__sum_dtype(x->dtype);
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < x->ndim; d++) {
    if (d == dim) continue;
    r.in[0] = r.out[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  const int is_int = x->dtype == DT_I32 || x->dtype == DT_I64;
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    const int pass = op == DT_REDUCE_SUM ? x->dtype != DT_I32 : op == DT_REDUCE_AVG && !is_int;
    if (!pass) continue;
    r.in[0] = r.out[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

dt_status_t dt__index_select_dim(const dt_op_call_t* call, int* dim) {
  const int nd = call->in[0].ndim, wrap = nd ? nd : 1;
  const int64_t d = dt__op_iarg(DT_OP_INDEX_SELECT, call, 0);
  if (call->n_iargs != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_select takes iargs [dim], got %d values",
                   call->n_iargs);
  if (d < -wrap || d >= wrap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_select: dim=%lld out of range for a %d-dim tensor "
                   "(valid: %d to %d)", (long long)d, nd, -wrap, wrap - 1);
  *dim = (int)(d < 0 ? d + wrap : d);
  return DT_SUCCESS;
}

/* index_select (x, index (L) or 0-d, i32 / i64; iargs [dim]): x's slices along dim at the
 * indices, as torch.index_select (any dtype; an index outside [0, x.shape[dim]) fails the call on
 * every rank). A selection of slices:
 *   [R; R, R]  [S(d); S(d), R] for d != dim  [S(dim); R, S(0)] (each rank selects its indices)
 *   [P(sum); S(dim), R] (x sharded along dim: a masked local lookup, 0 where the slice is not
 *   local, as embedding's vocabulary-sharded table)  [P(op); P(op), R] for every op */
dt_status_t dt__index_select_rules(const dt_op_call_t* call, dt_tensor_meta_t* out_meta, int* n_out,
                                   dt_op_rule_t* rules, int cap, int* n) {
  *n_out = 1;
  *n = 0;
  const dt_tensor_meta_t *x = &call->in[0], *ix = &call->in[1];
  int dim;
  DT_CHECK(dt__index_select_dim(call, &dim));
  if (ix->dtype != DT_I32 && ix->dtype != DT_I64)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_select: the index must be i32 or i64, got %s",
                   dt_dtype_name(ix->dtype));
  if (ix->ndim > 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_select: the index must be a vector (1-d or 0-d), "
                   "got %d dims", ix->ndim);
  const int64_t L = ix->ndim ? ix->shape[0] : 1;
  if (x->ndim == 0 && L != 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index_select: a 0-d tensor takes one index, got %lld",
                   (long long)L);
  *out_meta = *x;
  if (x->ndim) out_meta->shape[dim] = L;
  dt_op_rule_t r;
  memset(&r, 0, sizeof r);
  dt__add(rules, cap, n, &r);
  for (int d = 0; d < x->ndim; d++) {
    if (d == dim) continue;
    r.out[0] = r.in[0] = dt_shard(d);
    dt__add(rules, cap, n, &r);
  }
  if (x->ndim && ix->ndim) {
    memset(&r, 0, sizeof r);
    r.out[0] = dt_shard(dim);
    r.in[1] = dt_shard(0);
    dt__add(rules, cap, n, &r);
    memset(&r, 0, sizeof r);
    r.out[0] = dt_partial(DT_REDUCE_SUM);
    r.in[0] = dt_shard(dim);
    dt__add(rules, cap, n, &r);
  }
  memset(&r, 0, sizeof r);
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    r.out[0] = r.in[0] = dt_partial((dt_reduce_op_t)op);
    dt__add(rules, cap, n, &r);
  }
  return DT_SUCCESS;
}

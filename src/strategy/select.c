/* select.c - expands single-mesh-dim rules over the mesh and picks the cheapest candidate.
 *
 * A candidate takes, for every mesh dim, one rule; each tensor's placement list is the rule's
 * placement for that tensor on each mesh dim. Candidates where a tensor cannot take its placements
 * (shard dim out of range, or a max/min Partial mixed with another kind) or an input cannot be
 * redistributed to them (a new Partial from a Shard) are dropped. Cost = sum over inputs of the
 * planner's cost from the current to the required placements. Order of preference: lower cost; then no movement at all; then fewer
 * redistribution steps; then the first candidate in expansion order (rules in generator order,
 * mesh dim 0 varying slowest).
 */
#include <math.h>

#include "strategy/strategy.h"

#define DT_OP_MAX_CANDIDATES 65536
#define DT_PROP_CACHE_MAX 4096

/* ---------------------------------------------------------------------------------------------
 * Propagation cache: the selected choice per key. The key holds everything that changes the
 * answer: the mesh (unique id and generation, which flattening bumps), the cost model generation, the op, each input's
 * dtype, shape and placements, and every non-tensor argument (a scalar or dim that changes the
 * semantics must be in the key: PyTorch issues #147180 and #153603 were silent wrong results). */

/* The key is a run of 64-bit words holding only what the call uses (a few dozen bytes for a
 * typical op, so hashing and comparing it is cheap): mesh id, mesh and cost generations, the op
 * and counts, per input its dtype and ndim, shape and normalized placements, then the integer
 * arguments and the scalars' bit patterns (-0.0 and 0.0 differ, NaN payloads too). */
#define DT_PROP_KEY_WORDS \
  (4 + DT_OP_MAX_INPUTS * (1 + DT_MAX_DIMS + DT_MAX_MESH_DIMS) + DT_OP_MAX_IARGS + DT_OP_MAX_FARGS)
typedef struct dt_prop_key {
  uint32_t len; /* words used */
  uint64_t w[DT_PROP_KEY_WORDS];
} dt_prop_key_t;

static struct {
  size_t cap, count;
  dt_prop_key_t* keys;
  dt_op_choice_t* vals;
  unsigned char* used;
} dt__prop;

/* Builds the key; 0 if the call cannot be keyed. */
static int dt__prop_key(dt_mesh_t mesh, int id, const dt_op_call_t* call,
                        const dt_placement_t in_pl[][DT_MAX_MESH_DIMS], dt_prop_key_t* k) {
  uint64_t* w = k->w;
  *w++ = mesh->id;
  *w++ = mesh->generation;
  *w++ = dt__cost_generation();
  *w++ = (uint64_t)(uint32_t)id | (uint64_t)call->n_inputs << 32 | (uint64_t)call->n_iargs << 40 |
         (uint64_t)call->n_fargs << 48;
  for (int t = 0; t < call->n_inputs; t++) {
    const dt_tensor_meta_t* m = &call->in[t];
    *w++ = (uint64_t)(uint32_t)m->dtype | (uint64_t)(uint32_t)m->ndim << 32;
    for (int d = 0; d < m->ndim; d++) *w++ = (uint64_t)m->shape[d];
    for (int i = 0; i < mesh->ndim; i++) {
      dt_placement_t p = in_pl[t][i];
      if (dt_placement_normalize(&p, m->ndim) != DT_SUCCESS) return 0;
      *w++ = (uint64_t)(uint32_t)p.kind | (uint64_t)(uint16_t)p.dim << 32 |
             (uint64_t)(uint16_t)p.op << 48;
    }
  }
  for (int a = 0; a < call->n_iargs; a++) *w++ = (uint64_t)call->iargs[a];
  for (int a = 0; a < call->n_fargs; a++) memcpy(w++, &call->fargs[a], sizeof(uint64_t));
  k->len = (uint32_t)(w - k->w);
  return 1;
}

static int dt__key_equal(const dt_prop_key_t* a, const dt_prop_key_t* b) {
  return a->len == b->len && memcmp(a->w, b->w, sizeof(uint64_t) * a->len) == 0;
}
static size_t dt__key_hash(const dt_prop_key_t* k) {
  return (size_t)dt__hash_bytes(k->w, sizeof(uint64_t) * k->len);
}

static const dt_op_choice_t* dt__prop_find(const dt_prop_key_t* k) {
  if (dt__prop.cap == 0) return NULL;
  size_t j = dt__key_hash(k) & (dt__prop.cap - 1);
  while (dt__prop.used[j]) {
    if (dt__key_equal(&dt__prop.keys[j], k)) return &dt__prop.vals[j];
    j = (j + 1) & (dt__prop.cap - 1);
  }
  return NULL;
}

static void dt__prop_insert(const dt_prop_key_t* k, const dt_op_choice_t* v) {
  if (dt__prop.count >= DT_PROP_CACHE_MAX) { /* start over rather than grow without bound */
    memset(dt__prop.used, 0, dt__prop.cap);
    dt__prop.count = 0;
  }
  if (dt__prop.cap == 0) {
    size_t cap = 2 * DT_PROP_CACHE_MAX;
    dt__prop.keys = (dt_prop_key_t*)dt__malloc(cap * sizeof(dt_prop_key_t));
    dt__prop.vals = (dt_op_choice_t*)dt__malloc(cap * sizeof(dt_op_choice_t));
    dt__prop.used = (unsigned char*)dt__calloc(cap, 1);
    if (!dt__prop.keys || !dt__prop.vals || !dt__prop.used) { /* caching is optional */
      dt__free(dt__prop.keys);
      dt__free(dt__prop.vals);
      dt__free(dt__prop.used);
      memset(&dt__prop, 0, sizeof dt__prop);
      return;
    }
    dt__prop.cap = cap;
  }
  size_t j = dt__key_hash(k) & (dt__prop.cap - 1);
  while (dt__prop.used[j]) j = (j + 1) & (dt__prop.cap - 1);
  dt__prop.keys[j].len = k->len;
  memcpy(dt__prop.keys[j].w, k->w, sizeof(uint64_t) * k->len);
  dt__prop.vals[j] = *v;
  dt__prop.used[j] = 1;
  dt__prop.count++;
}

void dt__prop_cache_release(void) {
  dt__free(dt__prop.keys);
  dt__free(dt__prop.vals);
  dt__free(dt__prop.used);
  memset(&dt__prop, 0, sizeof dt__prop);
}

static dt_status_t dt__call_check(dt_mesh_t mesh, const dt_op_call_t* call,
                                  const dt_placement_t in_pl[][DT_MAX_MESH_DIMS]) {
  DT_CHECK(dt__mesh_check(mesh));
  DT_ARG_NOT_NULL(call);
  DT_ARG_NOT_NULL(in_pl);
  if (call->n_inputs < 1 || call->n_inputs > DT_OP_MAX_INPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "call->n_inputs=%d out of range [1, %d]", call->n_inputs,
                   DT_OP_MAX_INPUTS);
  for (int t = 0; t < call->n_inputs; t++) {
    const dt_tensor_meta_t* m = &call->in[t];
    if (!dt__dtype_valid(m->dtype))
      return DT_FAIL(DT_ERR_INVALID_ARG, "input %d: dtype %d out of range", t, (int)m->dtype);
    if (m->ndim < 0 || m->ndim > DT_MAX_DIMS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "input %d: ndim %d out of range [0, %d]", t, m->ndim,
                     DT_MAX_DIMS);
    /* bounded as a tensor's shape is (the rule generators multiply the sizes) */
    int64_t bound = 1;
    for (int d = 0; d < m->ndim; d++) {
      if (m->shape[d] < 0)
        return DT_FAIL(DT_ERR_INVALID_ARG, "input %d: shape[%d] = %lld is negative", t, d,
                       (long long)m->shape[d]);
      if (m->shape[d] > 0 && (!dt__mul_i64(bound, m->shape[d], &bound) ||
                              bound > ((int64_t)1 << 48)))
        return DT_FAIL(DT_ERR_INVALID_ARG, "input %d: shape[%d] = %lld makes the tensor too large "
                       "(more than 2^48 elements, or dims whose product is, besides a dim of 0)",
                       t, d, (long long)m->shape[d]);
    }
  }
  if (call->n_iargs < 0 || call->n_iargs > DT_OP_MAX_IARGS || call->n_fargs < 0 ||
      call->n_fargs > DT_OP_MAX_FARGS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "call->n_iargs=%d, call->n_fargs=%d: out of range [0, %d] "
                   "and [0, %d]", call->n_iargs, call->n_fargs, DT_OP_MAX_IARGS, DT_OP_MAX_FARGS);
  return DT_SUCCESS;
}

/* Normalizes p for a tensor of ndim dims; 0 if it cannot apply. */
static int dt__fits(dt_placement_t* p, int ndim) {
  if (p->kind == DT_SHARD) {
    int d = p->dim < 0 ? p->dim + ndim : p->dim;
    if (d < 0 || d >= ndim) return 0;
    p->dim = d;
  }
  return 1;
}

/* Expands candidates, calling `visit` on each legal one. With `prune`, once a candidate needs no
 * movement at all (cost 0, 0 steps: nothing later can beat it or win the tie), later candidates
 * are only checked for legality (to count them) and not costed or visited. */
/* The rule generator of op `id` after checking the call's arity against it. */
static dt_status_t dt__op_rules(int id, const dt_op_call_t* call, const dt_op_info_t** info) {
  const dt_op_info_t* in = dt__op_info(id);
  *info = in;
  if (in == NULL) return DT_FAIL(DT_ERR_INTERNAL, "op id %d out of range", id);
  if (in->rules == NULL)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s is composed of other ops and has no sharding rules of "
                   "its own (dtensor-explain op lists its pieces)", in->name);
  int variadic = (in->flags & DT_OPF_VARIADIC) != 0;
  if (variadic ? call->n_inputs > in->n_in : call->n_inputs != in->n_in)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes %s%d tensor inputs, got %d", in->name,
                   variadic ? "at most " : "", in->n_in, call->n_inputs);
  return dt__op_check_counts(id, call->n_iargs, call->n_fargs);
}

/* What a rule generator returned, checked before it is used: a host program's generator
 * (dt_op_register) may return anything, and a rule count past the room it was given, or a
 * placement of no kind, would be read out of bounds (a built-in's mistake is a library bug:
 * DT_ERR_INTERNAL; a host op's, DT_ERR_INVALID_ARG). */
static dt_status_t dt__rules_check(int id, const dt_op_info_t* info, const dt_op_call_t* call,
                                   const dt_op_choice_t* c, const dt_op_rule_t* rules, int nr,
                                   int min_out) {
  const dt_status_t st = id >= DT_OP_COUNT || info != &dt__op_table[id] ? DT_ERR_INVALID_ARG
                                                                         : DT_ERR_INTERNAL;
  if (nr < 1 || nr > DT_OP_MAX_RULES || c->n_outputs < min_out ||
      c->n_outputs > DT_OP_MAX_OUTPUTS)
    return DT_FAIL(st, "%s: its rule generator returned %d rules (valid: 1 to %d) and %d outputs "
                   "(valid: %d to %d)", call->op, nr, DT_OP_MAX_RULES, c->n_outputs, min_out,
                   DT_OP_MAX_OUTPUTS);
  for (int o = 0; o < c->n_outputs; o++) {
    const dt_tensor_meta_t* m = &c->out_meta[o];
    int bad = !dt__dtype_valid(m->dtype) || m->ndim < 0 || m->ndim > DT_MAX_DIMS;
    for (int d = 0; !bad && d < m->ndim; d++) bad = m->shape[d] < 0;
    if (bad)
      return DT_FAIL(st, "%s: its rule generator returned output %d of dtype %d and ndim %d, or a "
                     "negative size (valid: a dt_dtype_t, 0 to %d dims, sizes >= 0)", call->op, o,
                     (int)m->dtype, m->ndim, DT_MAX_DIMS);
  }
  for (int r = 0; r < nr; r++)
    for (int k = 0; k < c->n_outputs + call->n_inputs; k++) {
      const int out = k < c->n_outputs;
      const dt_placement_t p = out ? rules[r].out[k] : rules[r].in[k - c->n_outputs];
      if (p.kind < 0 || p.kind >= DT_PLACEMENT_KIND_COUNT ||
          (p.kind == DT_PARTIAL && (p.op < 0 || p.op >= DT_REDUCE_COUNT)))
        return DT_FAIL(st, "%s: its rule generator returned rule %d with %s %d placed as kind %d, "
                       "op %d (valid: a dt_placement_t: dt_shard, dt_replicate, dt_partial)",
                       call->op, r, out ? "output" : "input", out ? k : k - c->n_outputs,
                       (int)p.kind, (int)p.op);
    }
  return DT_SUCCESS;
}

static dt_status_t dt__expand(dt_mesh_t mesh, int id, const dt_op_call_t* call,
                              const dt_placement_t in_pl[][DT_MAX_MESH_DIMS], int prune,
                              const double* bound,
                              void (*visit)(void* ctx, const dt_op_choice_t* c), void* ctx,
                              int* total) {
  *total = 0;
  DT_CHECK(dt__call_check(mesh, call, in_pl));
  const dt_op_info_t* info;
  DT_CHECK(dt__op_rules(id, call, &info));
  dt_op_rules_fn fn = info->rules;
  dt_op_check_fn check = info->check;
  dt_op_rule_t rules[DT_OP_MAX_RULES];
  dt_op_choice_t c;
  memset(&c, 0, sizeof c);
  int nr = 0;
  DT_CHECK(fn(call, c.out_meta, &c.n_outputs, rules, DT_OP_MAX_RULES, &nr));
  const unsigned writes = info->flags & DT_OPF_WRITES_MASK;
  DT_CHECK(dt__rules_check(id, info, call, &c, rules, nr, writes ? 0 : 1));
  const int m = mesh->ndim;
  long ncand = 1;
  for (int i = 0; i < m; i++) ncand *= nr;
  if (ncand > DT_OP_MAX_CANDIDATES)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: %ld candidates (%d rules over %d mesh dims) exceed %d",
                   call->op, ncand, nr, m, DT_OP_MAX_CANDIDATES);
  /* Input layouts (current placements), validated once. */
  dt_layout_t in_l[DT_OP_MAX_INPUTS];
  for (int t = 0; t < call->n_inputs; t++) {
    dt_status_t st = dt__layout_init(&in_l[t], m, mesh->shape, call->in[t].ndim,
                                     call->in[t].shape, in_pl[t]);
    if (st != DT_SUCCESS) return DT_FAIL(st, "%s: input %d: %s", call->op, t, dt_last_error());
  }
  /* inputs costed smallest first: with a bound, a cheap plan often rules a candidate out before
   * the big input's plan is searched */
  int order[DT_OP_MAX_INPUTS];
  int64_t sz[DT_OP_MAX_INPUTS];
  for (int t = 0; t < call->n_inputs; t++) {
    order[t] = t;
    sz[t] = 1;
    for (int d = 0; d < call->in[t].ndim; d++) sz[t] *= call->in[t].shape[d];
  }
  for (int a = 1; a < call->n_inputs; a++)
    for (int b = a; b > 0 && sz[order[b]] < sz[order[b - 1]]; b--) {
      int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  int perfect = 0;
  for (long k = 0; k < ncand; k++) {
    int ok = 1;
    long v = k;
    for (int i = m - 1; i >= 0 && ok; i--, v /= nr) {
      const dt_op_rule_t* r = &rules[v % nr];
      for (int o = 0; o < c.n_outputs && ok; o++) {
        c.out[o][i] = r->out[o];
        ok = dt__fits(&c.out[o][i], c.out_meta[o].ndim);
      }
      for (int t = 0; t < call->n_inputs && ok; t++) {
        c.in[t][i] = r->in[t];
        ok = dt__fits(&c.in[t][i], call->in[t].ndim);
      }
    }
    /* no tensor may mix a max/min Partial with another kind (dt__placements_mixed) */
    for (int o = 0; o < c.n_outputs && ok; o++) ok = !dt__placements_mixed(m, c.out[o], 0, 0);
    for (int t = 0; t < call->n_inputs && ok; t++) ok = !dt__placements_mixed(m, c.in[t], 0, 0);
    if (ok && check != NULL) ok = check(mesh, call, &c);
    /* Reachable at all? (a new Partial from a Shard is not); an input updated in place
     * cannot move at all */
    int same = 1;
    for (int t = 0; t < call->n_inputs && ok; t++) {
      int st_same = 1;
      for (int i = 0; i < m; i++) st_same &= dt_placement_equal(in_l[t].pl[i], c.in[t][i]);
      ok = (writes & DT_OPF_WRITES_IN(t)) ? st_same : dt__plan_reachable(&in_l[t], c.in[t]);
      same &= st_same;
    }
    if (!ok) continue;
    (*total)++;
    if (prune && perfect) continue;
    c.cost_us = 0.0;
    c.steps = 0;
    int beaten = 0; /* costs only add up: once above the best so far, stop planning */
    for (int q = 0; q < call->n_inputs && !same && !beaten; q++) {
      int t = order[q];
      struct dt_plan* p;
      DT_CHECK(dt__plan_get(mesh, call->in[t].dtype, &in_l[t], c.in[t], &p));
      c.cost_us += p->cost_us;
      c.steps += p->nsteps;
      beaten = bound != NULL && *bound < INFINITY &&
               c.cost_us > *bound + 1e-9 * (1.0 + fabs(*bound));
    }
    perfect |= same;
    if (beaten) continue;
    visit(ctx, &c);
  }
  return DT_SUCCESS;
}

typedef struct {
  dt_op_choice_t best;
  int have;
  double bound; /* the best cost so far (INFINITY before the first) */
} dt__best_t;

static int dt__better(const dt_op_choice_t* a, const dt_op_choice_t* b) {
  double tol = 1e-9 * (1.0 + fabs(b->cost_us));
  if (a->cost_us < b->cost_us - tol) return 1;
  if (a->cost_us > b->cost_us + tol) return 0;
  if ((a->steps == 0) != (b->steps == 0)) return a->steps == 0;
  return a->steps < b->steps;
}

static void dt__visit_best(void* ctx, const dt_op_choice_t* c) {
  dt__best_t* b = (dt__best_t*)ctx;
  if (!b->have || dt__better(c, &b->best)) {
    b->best = *c;
    b->have = 1;
    b->bound = c->cost_us;
  }
}

dt_status_t dt__op_select(dt_mesh_t mesh, int id, const dt_op_call_t* call,
                          const dt_placement_t in_pl[][DT_MAX_MESH_DIMS], dt_op_choice_t* out) {
  dt_status_t st = dt__call_check(mesh, call, in_pl);
  if (st != DT_SUCCESS) {
    memset(out, 0, sizeof *out);
    return st;
  }
  dt_prop_key_t key;
  int keyed = dt__prop_key(mesh, id, call, in_pl, &key);
  if (keyed) {
    const dt_op_choice_t* hit = dt__prop_find(&key);
    if (hit != NULL) {
      *out = *hit;
      return DT_SUCCESS;
    }
  }
  memset(out, 0, sizeof *out);
  dt__best_t b;
  memset(&b, 0, sizeof b);
  b.bound = INFINITY;
  int total = 0;
  DT_CHECK(dt__expand(mesh, id, call, in_pl, 1, &b.bound, dt__visit_best, &b, &total));
  if (!b.have) {
    const dt_op_info_t* info = dt__op_info(id);
    if (info && (info->flags & DT_OPF_WRITES_MASK))
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: no strategy computes from these placements without "
                     "moving an input it updates in place (those must already be placed alike)",
                     call->op);
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: no candidate strategy fits these inputs", call->op);
  }
  *out = b.best;
  out->n_candidates = total;
  if (keyed) dt__prop_insert(&key, out);
  return DT_SUCCESS;
}

static dt_status_t dt__op_select_public(dt_mesh_t mesh, const dt_op_call_t* call,
                                        const dt_placement_t in_pl[][DT_MAX_MESH_DIMS],
                                        dt_op_choice_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  DT_CHECK(dt__call_check(mesh, call, in_pl));
  int id;
  DT_CHECK(dt__op_resolve(call->op, &id));
  dt_op_call_t c = *call; /* a promoting op's strategy on its operands' result dtype */
  dt__op_call_promote(id, &c);
  return dt__op_select(mesh, id, &c, in_pl, out);
}

dt_status_t dt_op_select(dt_mesh_t mesh, const dt_op_call_t* call,
                         const dt_placement_t in_pl[][DT_MAX_MESH_DIMS], dt_op_choice_t* out) {
  DT_ENTRY_RETURN(dt__op_select_public(mesh, call, in_pl, out));
}

typedef struct {
  dt_op_choice_t* out;
  int cap, n;
} dt__list_t;

static void dt__visit_list(void* ctx, const dt_op_choice_t* c) {
  dt__list_t* l = (dt__list_t*)ctx;
  if (l->n < l->cap) l->out[l->n] = *c;
  l->n++;
}

static dt_status_t dt__op_candidates(dt_mesh_t mesh, const dt_op_call_t* call,
                                     const dt_placement_t in_pl[][DT_MAX_MESH_DIMS],
                                     dt_op_choice_t* out, int cap, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  if (cap > 0) DT_ARG_NOT_NULL(out);
  DT_CHECK(dt__call_check(mesh, call, in_pl));
  int id;
  DT_CHECK(dt__op_resolve(call->op, &id));
  dt_op_call_t c = *call;
  dt__op_call_promote(id, &c);
  dt__list_t l = {out, cap < 0 ? 0 : cap, 0};
  int total = 0;
  DT_CHECK(dt__expand(mesh, id, &c, in_pl, 0, NULL, dt__visit_list, &l, &total));
  *n = total;
  return DT_SUCCESS;
}

dt_status_t dt_op_candidates(dt_mesh_t mesh, const dt_op_call_t* call,
                             const dt_placement_t in_pl[][DT_MAX_MESH_DIMS], dt_op_choice_t* out,
                             int cap, int* n) {
  DT_ENTRY_RETURN(dt__op_candidates(mesh, call, in_pl, out, cap, n));
}

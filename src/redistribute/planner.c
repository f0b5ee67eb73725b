/* planner.c - minimum-cost redistribution planning.
 *
 * A state is one placement per mesh dim. An edge changes one mesh dim:
 *   S(a) -> R      all-gather        S(a) -> S(b)  all-to-all
 *   P    -> R      all-reduce        P    -> S(b)  reduce-scatter
 *   R    -> S(b)   local slice       R    -> P     local partition (only ops in src/dst)
 * Nesting rule (default shard order = mesh-dim order): when several mesh dims shard one tensor
 * dim, only the innermost (highest) of them may change, and a new Shard(b) on mesh dim i needs no
 * mesh dim above i sharding b. Every other state would be a strided layout.
 * Where the caller flattened a set of mesh dims, a merged edge runs one collective over all of
 * them (PyTorch merges adjacent steps after planning; searching with the merged edges finds plans
 * that post-merging misses). Dijkstra finds the cheapest path; intermediate shards on dims outside
 * src/dst are explored (reduce-scatter + all-gather can beat all-reduce), a few per distinct size.
 */
#include <math.h>

#include "redistribute/planner.h"

/* The collective of a one-mesh-dim move, indexed [from][to] by placement kind (R, S, P); -1 where
 * the move is illegal (a new Partial from a Shard, one Partial op into another) or no move. */
static const int dt__edge_coll[DT_PLACEMENT_KIND_COUNT][DT_PLACEMENT_KIND_COUNT] = {
    [DT_REPLICATE] = {[DT_REPLICATE] = -1, [DT_SHARD] = DT_COLL_LOCAL, [DT_PARTIAL] = DT_COLL_LOCAL},
    [DT_SHARD] = {[DT_REPLICATE] = DT_COLL_ALL_GATHER, [DT_SHARD] = DT_COLL_ALL_TO_ALL,
                  [DT_PARTIAL] = -1},
    [DT_PARTIAL] = {[DT_REPLICATE] = DT_COLL_ALL_REDUCE, [DT_SHARD] = DT_COLL_REDUCE_SCATTER,
                    [DT_PARTIAL] = -1},
};
_Static_assert(DT_PLACEMENT_KIND_COUNT == 3, "update dt__edge_coll");

static int64_t dt__padded_numel(const dt_layout_t* l, const dt_placement_t* pl) {
  int64_t len[DT_MAX_DIMS], n = 1;
  for (int d = 0; d < l->ndim; d++) len[d] = l->shape[d];
  for (int i = 0; i < l->mesh_ndim; i++)
    if (pl[i].kind == DT_SHARD) {
      int d = pl[i].dim;
      len[d] = (len[d] + l->mesh_shape[i] - 1) / l->mesh_shape[i];
    }
  for (int d = 0; d < l->ndim; d++) n *= len[d];
  return n;
}

/* 1 if no mesh dim above i shards tensor dim d. */
static int dt__innermost(const dt_placement_t* pl, int m, int i, int d) {
  for (int j = i + 1; j < m; j++)
    if (pl[j].kind == DT_SHARD && pl[j].dim == d) return 0;
  return 1;
}

dt_search_space_t dt__plan_space(dt_mesh_t mesh, const dt_layout_t* src, const dt_placement_t* dst,
                                 int prune) {
  dt_search_space_t sp;
  memset(&sp, 0, sizeof sp);
  sp.mesh = mesh;
  for (int f = 0; mesh != NULL && f < mesh->nflat; f++) sp.flat[sp.nflat++] = mesh->flat[f].mask;
  for (int i = 0; i < src->mesh_ndim; i++) {
    const dt_placement_t* ps[2] = {&src->pl[i], &dst[i]};
    for (int k = 0; k < 2; k++) {
      if (ps[k]->kind == DT_PARTIAL) sp.pmask |= 1u << ps[k]->op;
      if (ps[k]->kind == DT_SHARD) sp.dmask |= 1u << ps[k]->dim;
    }
  }
  unsigned fixed = sp.dmask;
  for (int d = 0; d < src->ndim; d++) {
    if (fixed & (1u << d)) continue;
    if (!prune) {
      sp.dmask |= 1u << d;
      continue;
    }
    if (src->shape[d] <= 1) continue; /* sharding a size-1 dim never saves bytes */
    int same = 0;
    for (int e = 0; e < d; e++)
      if (!(fixed & (1u << e)) && (sp.dmask & (1u << e)) && src->shape[e] == src->shape[d]) same++;
    if (same < src->mesh_ndim) sp.dmask |= 1u << d;
  }
  return sp;
}

int dt__plan_edge(const dt_layout_t* l, size_t item, const dt_placement_t* cur, int i,
                  dt_placement_t to, const dt_search_space_t* sp, dt_step_t* step) {
  const int m = l->mesh_ndim, n = l->mesh_shape[i];
  dt_placement_t from = cur[i];
  if (dt_placement_equal(from, to)) return 0;
  if (to.kind == DT_SHARD && !dt__innermost(cur, m, i, to.dim)) return 0;
  if (from.kind == DT_SHARD && !dt__innermost(cur, m, i, from.dim)) return 0;
  int c = dt__edge_coll[from.kind][to.kind];
  if (c < 0) return 0;
  if (to.kind == DT_PARTIAL && !(sp->pmask & (1u << to.op))) return 0;
  memcpy(step->before, cur, sizeof(dt_placement_t) * (size_t)m);
  memcpy(step->after, cur, sizeof(dt_placement_t) * (size_t)m);
  step->after[i] = to;
  step->mask = 1u << i;
  if (n == 1) { /* nothing moves: a relabel */
    step->coll = DT_COLL_LOCAL;
    step->algo = DT_ALGO_NATIVE;
    step->nbytes = 0;
    step->cost_us = 0.0;
    return 1;
  }
  int64_t in = dt__padded_numel(l, cur), out = dt__padded_numel(l, step->after);
  switch (c) {
    case DT_COLL_ALL_GATHER: step->nbytes = (uint64_t)out * item; break;
    case DT_COLL_LOCAL: step->nbytes = (uint64_t)out * item; break;
    default: step->nbytes = (uint64_t)in * item; break; /* AR buffer, RS input, A2A send */
  }
  step->coll = (dt_collective_t)c;
  step->cost_us = dt__cost_of_on(sp->mesh, step->mask, (dt_collective_t)c, n, step->nbytes,
                                 &step->algo);
  return 1;
}

/* A step merged on the flattened dims `mask`: every masked dim goes to targets[i] with collective
 * c, applied in the order single steps would take (all-gather inner to outer, others outer to
 * inner); each partial move must be legal. Costed as one collective over the whole group. */
static int dt__plan_merged_edge(const dt_layout_t* l, size_t item, const dt_placement_t* cur,
                                unsigned mask, dt_collective_t c, const dt_placement_t* targets,
                                const dt_search_space_t* sp, dt_step_t* step) {
  const int m = l->mesh_ndim;
  dt_placement_t st[DT_MAX_MESH_DIMS];
  memcpy(st, cur, sizeof(dt_placement_t) * (size_t)m);
  int gn = 1;
  for (int k = 0; k < m; k++) {
    int i = c == DT_COLL_ALL_GATHER ? m - 1 - k : k;
    if (!(mask & (1u << i))) continue;
    if (!dt__plan_edge(l, item, st, i, targets[i], sp, step) || step->coll != c) return 0;
    st[i] = targets[i];
    gn *= l->mesh_shape[i];
  }
  memcpy(step->before, cur, sizeof(dt_placement_t) * (size_t)m);
  memcpy(step->after, st, sizeof(dt_placement_t) * (size_t)m);
  step->mask = mask;
  step->coll = c;
  step->nbytes = (uint64_t)dt__padded_numel(l, c == DT_COLL_ALL_GATHER ? st : cur) * item;
  step->cost_us = dt__cost_of_on(sp->mesh, mask, c, gn, step->nbytes, &step->algo);
  return 1;
}

int dt__plan_neighbors(const dt_layout_t* l, size_t item, const dt_placement_t* cur,
                       const dt_search_space_t* sp, dt_step_t* out) {
  int cnt = 0;
  for (int i = 0; i < l->mesh_ndim; i++) {
    if (dt__plan_edge(l, item, cur, i, dt_replicate(), sp, &out[cnt])) cnt++;
    for (int d = 0; d < l->ndim; d++)
      if ((sp->dmask & (1u << d)) && dt__plan_edge(l, item, cur, i, dt_shard(d), sp, &out[cnt]))
        cnt++;
    for (int op = 0; op < DT_REDUCE_COUNT; op++)
      if ((sp->pmask & (1u << op)) &&
          dt__plan_edge(l, item, cur, i, dt_partial((dt_reduce_op_t)op), sp, &out[cnt]))
        cnt++;
  }
  for (int f = 0; f < sp->nflat; f++) {
    unsigned mask = sp->flat[f];
    int all_s = 1, all_p = 1, op = -1;
    for (int i = 0; i < l->mesh_ndim; i++) {
      if (!(mask & (1u << i))) continue;
      all_s &= cur[i].kind == DT_SHARD;
      if (cur[i].kind != DT_PARTIAL || (op >= 0 && cur[i].op != op)) all_p = 0;
      else op = cur[i].op;
    }
    dt_placement_t t[DT_MAX_MESH_DIMS];
    if (all_s || all_p) {
      for (int i = 0; i < l->mesh_ndim; i++) t[i] = dt_replicate();
      if (dt__plan_merged_edge(l, item, cur, mask,
                               all_s ? DT_COLL_ALL_GATHER : DT_COLL_ALL_REDUCE, t, sp, &out[cnt]))
        cnt++;
    }
    if (all_p)
      for (int d = 0; d < l->ndim; d++) {
        if (!(sp->dmask & (1u << d))) continue;
        for (int i = 0; i < l->mesh_ndim; i++) t[i] = dt_shard(d);
        if (dt__plan_merged_edge(l, item, cur, mask, DT_COLL_REDUCE_SCATTER, t, sp, &out[cnt]))
          cnt++;
      }
  }
  return cnt;
}

int dt__plan_reachable(const dt_layout_t* src, const dt_placement_t* dst) {
  for (int i = 0; i < src->mesh_ndim; i++) {
    dt_placement_t a = src->pl[i], b = dst[i];
    if (b.kind == DT_PARTIAL && !dt_placement_equal(a, b) && a.kind != DT_REPLICATE) return 0;
  }
  return 1;
}

dt_status_t dt__plan_validate(const dt_layout_t* src, const dt_placement_t* dst) {
  if (dt__plan_reachable(src, dst)) return DT_SUCCESS;
  for (int i = 0; i < src->mesh_ndim; i++) {
    dt_placement_t a = src->pl[i], b = dst[i];
    if (b.kind != DT_PARTIAL || dt_placement_equal(a, b)) continue;
    char sa[32], sb[32];
    dt_placement_format(a, sa, sizeof sa);
    dt_placement_format(b, sb, sizeof sb);
    if (a.kind == DT_PARTIAL)
      return DT_FAIL(DT_ERR_UNSUPPORTED,
                     "cannot redistribute %s -> %s on mesh dim %d: changing the reduce op of a "
                     "Partial is not supported (reduce to R first)", sa, sb, i);
    if (a.kind == DT_SHARD)
      return DT_FAIL(DT_ERR_UNSUPPORTED,
                     "cannot redistribute %s -> %s on mesh dim %d: a new Partial can only come "
                     "from Replicate", sa, sb, i);
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Dijkstra over encoded states: each mesh dim holds an option index (R, the allowed shard dims,
 * the allowed Partial ops), the state code is the base-K number of those indices. */

typedef struct dt__space_codec {
  int m, k;
  dt_placement_t opt[1 + DT_MAX_DIMS + DT_REDUCE_COUNT];
  int shard_idx[DT_MAX_DIMS], part_idx[DT_REDUCE_COUNT];
} dt__codec_t;

static void dt__codec_init(dt__codec_t* c, int m, int ndim, const dt_search_space_t* sp) {
  c->m = m;
  c->k = 0;
  c->opt[c->k++] = dt_replicate();
  for (int d = 0; d < ndim; d++) {
    c->shard_idx[d] = -1;
    if (sp->dmask & (1u << d)) {
      c->shard_idx[d] = c->k;
      c->opt[c->k++] = dt_shard(d);
    }
  }
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    c->part_idx[op] = -1;
    if (sp->pmask & (1u << op)) {
      c->part_idx[op] = c->k;
      c->opt[c->k++] = dt_partial((dt_reduce_op_t)op);
    }
  }
}

static int dt__encode(const dt__codec_t* c, const dt_placement_t* pl) {
  int code = 0;
  for (int i = c->m - 1; i >= 0; i--) {
    int o = pl[i].kind == DT_REPLICATE ? 0
            : pl[i].kind == DT_SHARD   ? c->shard_idx[pl[i].dim]
                                       : c->part_idx[pl[i].op];
    code = code * c->k + o;
  }
  return code;
}

static void dt__decode(const dt__codec_t* c, int code, dt_placement_t* pl) {
  for (int i = 0; i < c->m; i++) {
    pl[i] = c->opt[code % c->k];
    code /= c->k;
  }
}

/* Fast edge expansion for the search (no merged edges): successor codes and costs only, with a
 * per-state padded-numel table. Mirrors dt__plan_edge, which builds the full steps afterwards;
 * the planner tests check both against an exhaustive search. */
typedef struct dt__fast {
  const dt_layout_t* l;
  const dt__codec_t* cd;
  const dt_search_space_t* sp;
  size_t item;
  int pw[DT_MAX_MESH_DIMS];
  int64_t* numel; /* per state */
  /* cost lines a + b*B per mesh dim, collective and algorithm (a = inf: algorithm unusable) */
  double ca[DT_MAX_MESH_DIMS][DT_COLL_COUNT][DT_ALGO_COUNT];
  double cb[DT_MAX_MESH_DIMS][DT_COLL_COUNT][DT_ALGO_COUNT];
} dt__fast_t;

static int dt__fast_edges(const dt__fast_t* f, int u, int* vs, double* costs) {
  const dt__codec_t* cd = f->cd;
  const int m = cd->m;
  int dig[DT_MAX_MESH_DIMS], cnt = 0;
  dt_placement_t cur[DT_MAX_MESH_DIMS];
  unsigned above[DT_MAX_MESH_DIMS + 1]; /* tensor dims sharded by mesh dims > i */
  for (int i = 0, v = u; i < m; i++, v /= cd->k) {
    dig[i] = v % cd->k;
    cur[i] = cd->opt[dig[i]];
  }
  above[m] = 0;
  for (int i = m - 1; i >= 0; i--)
    above[i] = above[i + 1] | (cur[i].kind == DT_SHARD ? 1u << cur[i].dim : 0u);
  for (int i = 0; i < m; i++) {
    dt_placement_t from = cur[i];
    unsigned outer = above[i + 1];
    if (from.kind == DT_SHARD && (outer & (1u << from.dim))) continue; /* not innermost */
    int n = f->l->mesh_shape[i];
    for (int o = 0; o < cd->k; o++) {
      if (o == dig[i]) continue;
      dt_placement_t to = cd->opt[o];
      if (to.kind == DT_SHARD && (outer & (1u << to.dim))) continue;
      int c = dt__edge_coll[from.kind][to.kind]; /* R -> P: only allowed ops are options */
      if (c < 0) continue;
      int v = u + (o - dig[i]) * f->pw[i];
      double cost = 0.0;
      if (n > 1) {
        int64_t ne = (c == DT_COLL_ALL_GATHER || c == DT_COLL_LOCAL) ? f->numel[v] : f->numel[u];
        double nb = (double)((uint64_t)ne * f->item);
        cost = INFINITY;
        for (int a = 0; a < DT_ALGO_COUNT; a++) {
          double cv = f->ca[i][c][a] + f->cb[i][c][a] * nb;
          if (cv < cost) cost = cv;
        }
      }
      vs[cnt] = v;
      costs[cnt++] = cost;
    }
  }
  return cnt;
}

typedef struct {
  double cost;
  int hops, code;
} dt__hnode_t;

static int dt__hless(const dt__hnode_t* a, const dt__hnode_t* b) {
  return a->cost < b->cost || (a->cost == b->cost && a->hops < b->hops);
}

static void dt__hpush(dt__hnode_t* h, int* n, dt__hnode_t v) {
  int i = (*n)++;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (!dt__hless(&v, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = v;
}

static dt__hnode_t dt__hpop(dt__hnode_t* h, int* n) {
  dt__hnode_t top = h[0], v = h[--(*n)];
  int i = 0;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, s = i;
    const dt__hnode_t* best = &v;
    if (l < *n && dt__hless(&h[l], best)) {
      s = l;
      best = &h[l];
    }
    if (r < *n && dt__hless(&h[r], best)) s = r;
    if (s == i) break;
    h[i] = h[s];
    i = s;
  }
  if (*n > 0) h[i] = v;
  return top;
}

dt_status_t dt__plan_search(dt_mesh_t mesh, const dt_layout_t* src, const dt_placement_t* dst,
                            size_t item, dt_step_t* steps, int* nsteps, double* cost) {
  *nsteps = 0;
  *cost = 0.0;
  DT_CHECK(dt__plan_validate(src, dst));
  dt_search_space_t sp = dt__plan_space(mesh, src, dst, 1);
  dt__codec_t cd;
  dt__codec_init(&cd, src->mesh_ndim, src->ndim, &sp);
  int ns = 1;
  for (int i = 0; i < cd.m; i++) ns *= cd.k;
  int s0 = dt__encode(&cd, src->pl), goal = dt__encode(&cd, dst);
  if (s0 == goal) return DT_SUCCESS;

  /* One block: dist | hops | prev | done | heap (each state pushed at most once per improvement,
   * bounded by the number of edges; the heap grows when needed). */
  double* dist = (double*)dt__malloc(sizeof(double) * (size_t)ns);
  int* hops = (int*)dt__malloc(sizeof(int) * (size_t)ns * 3);
  int hcap = ns * 2 + 16, hn = 0;
  dt__hnode_t* heap = (dt__hnode_t*)dt__malloc(sizeof(dt__hnode_t) * (size_t)hcap);
  dt_step_t* nb = (dt_step_t*)dt__malloc(sizeof(dt_step_t) * DT_MAX_EDGES);
  int64_t* numel = (int64_t*)dt__malloc(sizeof(int64_t) * (size_t)ns);
  dt_status_t st = DT_SUCCESS;
  if (!dist || !hops || !heap || !nb || !numel) {
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "planner state space of %d states", ns);
    goto done;
  }
  int *prev = hops + ns, *closed = hops + 2 * ns;
  for (int s = 0; s < ns; s++) {
    dist[s] = 1e300;
    hops[s] = 0;
    prev[s] = -1;
    closed[s] = 0;
  }
  dt__fast_t fast = {src, &cd, &sp, item, {1, 1, 1, 1}, numel, {{{0}}}, {{{0}}}};
  for (int i = 1; i < cd.m; i++) fast.pw[i] = fast.pw[i - 1] * cd.k;
  for (int i = 0; i < cd.m; i++)
    for (int c = 0; c < DT_COLL_COUNT; c++)
      for (int a = 0; a < DT_ALGO_COUNT; a++)
        dt__cost_linear_on(mesh, 1u << i, (dt_collective_t)c, (dt_coll_algo_t)a,
                           src->mesh_shape[i], &fast.ca[i][c][a], &fast.cb[i][c][a]);
  for (int s = 0; s < ns; s++) {
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    dt__decode(&cd, s, pl);
    numel[s] = dt__padded_numel(src, pl);
  }
  int use_fast = sp.nflat == 0;
  int vs[DT_MAX_EDGES];
  double costs[DT_MAX_EDGES];
  dist[s0] = 0.0;
  dt__hpush(heap, &hn, (dt__hnode_t){0.0, 0, s0});
  while (hn > 0) {
    dt__hnode_t u = dt__hpop(heap, &hn);
    if (closed[u.code]) continue;
    closed[u.code] = 1;
    if (u.code == goal) break;
    int ne;
    if (use_fast) {
      ne = dt__fast_edges(&fast, u.code, vs, costs);
    } else {
      dt_placement_t cur[DT_MAX_MESH_DIMS];
      dt__decode(&cd, u.code, cur);
      ne = dt__plan_neighbors(src, item, cur, &sp, nb);
      for (int e = 0; e < ne; e++) {
        vs[e] = dt__encode(&cd, nb[e].after);
        costs[e] = nb[e].cost_us;
      }
    }
    for (int e = 0; e < ne; e++) {
      int v = vs[e];
      double nd = u.cost + costs[e];
      int nh = u.hops + 1;
      if (closed[v] || !(nd < dist[v] || (nd == dist[v] && nh < hops[v]))) continue;
      dist[v] = nd;
      hops[v] = nh;
      prev[v] = u.code;
      if (hn == hcap) {
        hcap *= 2;
        dt__hnode_t* nh2 = (dt__hnode_t*)dt__realloc(heap, sizeof(dt__hnode_t) * (size_t)hcap);
        if (nh2 == NULL) {
          st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "planner heap");
          goto done;
        }
        heap = nh2;
      }
      dt__hpush(heap, &hn, (dt__hnode_t){nd, nh, v});
    }
  }
  if (!closed[goal]) {
    st = DT_FAIL(DT_ERR_INTERNAL, "no redistribution path found");
    goto done;
  }
  if (hops[goal] > DT_MAX_STEPS) {
    st = DT_FAIL(DT_ERR_UNSUPPORTED, "plan needs %d steps (more than %d)", hops[goal],
                 DT_MAX_STEPS);
    goto done;
  }
  /* Walk back and re-derive each edge. */
  int n = hops[goal];
  for (int v = goal, k = n - 1; k >= 0; k--) {
    int u = prev[v];
    dt_placement_t cur[DT_MAX_MESH_DIMS];
    dt__decode(&cd, u, cur);
    int ne = dt__plan_neighbors(src, item, cur, &sp, nb), found = 0;
    for (int e = 0; e < ne && !found; e++)
      if (dt__encode(&cd, nb[e].after) == v) {
        steps[k] = nb[e];
        found = 1;
      }
    if (!found) {
      st = DT_FAIL(DT_ERR_INTERNAL, "planner path reconstruction failed");
      goto done;
    }
    v = u;
  }
  *nsteps = n;
  *cost = dist[goal];
done:
  dt__free(dist);
  dt__free(hops);
  dt__free(heap);
  dt__free(nb);
  dt__free(numel);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * Greedy baseline (PyTorch's default planner). */

static int dt__greedy_emit(const dt_layout_t* src, size_t item, dt_placement_t* cur, int i,
                           dt_placement_t to, const dt_search_space_t* sp, dt_step_t* steps,
                           int* n, double* cost) {
  if (*n >= DT_MAX_STEPS || !dt__plan_edge(src, item, cur, i, to, sp, &steps[*n])) return 0;
  cur[i] = to;
  *cost += steps[*n].cost_us;
  (*n)++;
  return 1;
}

dt_status_t dt__plan_greedy(dt_mesh_t mesh, const dt_layout_t* src, const dt_placement_t* dst,
                            size_t item, dt_step_t* steps, int* nsteps, double* cost) {
  *nsteps = 0;
  *cost = 0.0;
  DT_CHECK(dt__plan_validate(src, dst));
  dt_search_space_t sp = dt__plan_space(mesh, src, dst, 0);
  sp.nflat = 0; /* PyTorch's walk: one mesh dim per step (priced with the mesh's costs) */
  const int m = src->mesh_ndim;
  dt_placement_t cur[DT_MAX_MESH_DIMS];
  memcpy(cur, src->pl, sizeof cur);
  int n = 0;
  for (int i = m - 1; i >= 0 && m > 1; i--) {
    if (dt_placement_equal(cur[i], dst[i])) continue;
    dt_placement_t t = dst[i];
    if (t.kind == DT_SHARD)
      for (int j = 0; j < i; j++) {
        int a = cur[j].kind == DT_SHARD && cur[j].dim == t.dim;
        int b = dst[j].kind == DT_SHARD && dst[j].dim == t.dim;
        if (a != b) t = dt_replicate(); /* misaligned nesting: go through R */
      }
    dt_step_t probe;
    if (!dt__plan_edge(src, item, cur, i, t, &sp, &probe)) t = dt_replicate();
    if (dt_placement_equal(t, cur[i])) continue;
    if (!dt__greedy_emit(src, item, cur, i, t, &sp, steps, &n, cost))
      return DT_FAIL(DT_ERR_UNSUPPORTED, "greedy planner found no legal step on mesh dim %d", i);
  }
  for (int i = 0; i < m; i++) {
    if (dt_placement_equal(cur[i], dst[i])) continue;
    if (!dt__greedy_emit(src, item, cur, i, dst[i], &sp, steps, &n, cost))
      return DT_FAIL(DT_ERR_UNSUPPORTED, "greedy planner found no legal step on mesh dim %d", i);
  }
  *nsteps = n;
  return DT_SUCCESS;
}

/* fsdp.c - FSDP / HSDP on the public API: per-parameter Shard(0) parameters (Shard(d) where dim 0
 * has fewer entries than the shard ranks: each parameter's "rows" are then its dim d, in pre
 * blocks of the dims before it), one flat all-gather and one flat reduce-scatter per group,
 * reshard after forward (ZeRO-3, ZeRO-2, or to groups of k ranks), mixed precision, forward and
 * backward prefetch. See dtensor/parallel.h and the FSDP section of docs/design.md.
 *
 * Buffers of a group of n parameters on a shard dim of N ranks (chunk_i = ceil(rows_i / N); with
 * shard_span s > 1 the s dims from shard_dim on act as one of N = the product of their sizes, a
 * rank's index row-major over them, rows split by the nested chunk rule of Shard(0) on each in
 * turn and chunk_i the largest such segment; dt_mesh_flatten lets the planner merge the
 * collectives over them):
 *   flat   this rank's flat segment, L = sum_i chunk_i * rest_i elements (padding zeroed): a 1-D
 *          tensor of N*L elements, Shard(0) on the shard dim, Replicate elsewhere, persistent;
 *          the sharded parameters are views of it (dt_tensor_view_local), so the optimizer
 *          updates it in place and the all-gather sends it as it is (a param_dtype other than
 *          the parameters': one cast of it is sent);
 *   gather the all-gather of the segments (N*L, Replicate): rank r's, then rank r+1's...;
 *   U      the unsharded parameters, param after param (T elements, padded to a multiple of k for
 *          reshard k); the gathered parameters are views of U. Copy-out: gather -> U;
 *   reduce the gradients of the parameters that require one, copied into N segments laid out
 *          as the sends but without the frozen parameters' rows (N*L' elements, L' <= L,
 *          Partial on the data dims), reduce-scattered to Shard(0) (HSDP: then all-reduced over
 *          the replicate dim); the sharded parameters' gradients are views of this rank's
 *          segment (cast to their dtype first if needed; added to gradients already there). A
 *          group with nothing to train reduces nothing (FSDP2 reduces only the gradients there
 *          are); the flags must be the same on every rank, as the parameters are.
 * With tensor parallelism on other mesh dims everything above is per rank of those dims: the
 * parameters' local shapes are their tensor-parallel shards, the flat buffers (nominally
 * Replicate there) hold this rank's, and collectives run over the data dims only.
 * The gathered parameters are leaves the group owns (requires_grad as the sharded parameter's
 * at each forward, gradients kept as they come);
 * while the group's forward runs the module holds them in place of the sharded ones
 * (dt_module_swap_param). Released, their value is a meta tensor of the same layout.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/check.h"
#include "dtensor/parallel.h"
#include "dtensor/tensor.h"

#define FSDP_KEY "fsdp"
#define FSDP_NAME_MAX 256

typedef struct {
  char name[FSDP_NAME_MAX]; /* qualified, relative to the group's module */
  dt_var_t sharded;         /* Shard(0) on the shard dim; the module's between forwards */
  dt_tensor_t view;         /* the view of flat that is sharded's value (until replaced) */
  dt_var_t full;            /* the gathered parameter (param dtype, Replicate on the data dims) */
  dt_dtype_t dtype;         /* the sharded parameter's dtype (the group's sdtype) */
  int requires_grad;        /* the sharded variable's, read at every forward (follow_flags) */
  int ndim;
  int64_t shape[DT_MAX_DIMS];  /* global */
  int64_t lshape[DT_MAX_DIMS]; /* this rank's tensor before FSDP (a tensor-parallel shard) */
  dt_placement_t pl[DT_MAX_MESH_DIMS]; /* the gathered parameter's: Replicate on the data dims */
  int sdim;                 /* the tensor dim FSDP splits: 0, or (fewer rows than ranks) the
                             * first dim with at least as many entries */
  int64_t pre, rows, rest;  /* lshape: elements before sdim, sdim's size, elements after it */
  int64_t chunk;            /* ceil(rows / N) */
  int64_t seg_off;          /* offset in a rank's flat segment (elements) */
  int64_t rs_off;           /* offset in a rank's reduce segment; -1: frozen (not reduced) */
  int64_t full_off;         /* offset in U (elements) */
  /* copy-in of its gradient: N pre ranges (rank r's rows of each of the pre blocks, into segment
   * r of the reduce buffer, rank-major) from in_src of the gradient's local elements to in_dst,
   * in_len each; then N padding ranges (one per segment); rs_dst and rs_pad: in_dst and
   * pad_off in the reduce buffer (the frozen parameters' rows left out) */
  int64_t *in_dst, *in_src, *in_len, *pad_off, *pad_len, *rs_dst, *rs_pad;
} fsdp_param_t;

typedef struct fsdp_group fsdp_group_t;
struct fsdp_group {
  dt_module_t module;
  dt_mesh_t mesh;            /* the parameters' mesh */
  dt_mesh_t kmesh;           /* reshard k > 1: the mesh with the shard dim split (N/k, k) */
  dt_fsdp_config_t cfg;
  int mesh_ndim, N, R, rank, k; /* shard size, replicas, my shard index, reshard group size */
  int sizes[DT_MAX_MESH_DIMS]; /* the shard dims' sizes (N their product) */
  int n;
  fsdp_param_t* p;
  int64_t seg, total, total_pad; /* L, T, T padded to a multiple of k */
  int64_t rs_seg;            /* L': a rank's segment of the reduce buffer (0: nothing to reduce) */
  int rs_dirty;              /* the requires_grad flags changed: rs_* to be laid out again */
  int n_out;                 /* copy-out: gather (segments in rank order) -> U, N * n ranges */
  int64_t *out_dst, *out_src, *out_len;
  int64_t* ranges;           /* the one allocation behind every range array */
  dt_dtype_t sdtype;         /* the sharded parameters' dtype (one per group, as in FSDP2) */
  size_t ses, pes, res;      /* sharded, param and reduce dtype item sizes */
  dt_tensor_t flat;          /* the shards' buffer (N*L, sdtype); the parameters view it */
  int swapped;               /* the module holds the gathered parameters */
  dt_tensor_t U;             /* gathered parameters (NULL: released) */
  dt_tensor_t keep;          /* reshard k: this rank's slice of U after the forward */
  dt_tensor_t ag_send, ag_out; /* ag_send NULL: flat is sent */
  dt_work_t ag_work;         /* all-gather in flight */
  int ag_from_keep;
  dt_tensor_t rs_out;
  dt_work_t rs_work;         /* reduce-scatter in flight */
  int sync, prefetch_fwd, prefetch_bwd;
  int64_t gathers, prefetched, reductions; /* counts for dt_fsdp_group_info */
  fsdp_group_t *next_fwd, *next_bwd; /* learned orders */
  fsdp_group_t* next;        /* every group */
};

/* Process-wide state: the groups, and the last groups whose forward started and ended (the
 * orders are learned from them). */
static struct {
  fsdp_group_t* groups;
  fsdp_group_t *last_pre, *last_post;
} g_fsdp;

static int is_float(dt_dtype_t t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

dt_fsdp_config_t dt_fsdp_config_for(int shard_dim, int replicate_dim) {
  dt_fsdp_config_t c;
  memset(&c, 0, sizeof c);
  c.shard_dim = shard_dim;
  c.replicate_dim = replicate_dim;
  c.reshard_after_forward = 1;
  c.param_dtype = c.reduce_dtype = DT_F32;
  c.output_dtype = DT_FSDP_KEEP_DTYPE;
  c.prefetch_forward = c.prefetch_backward = 1;
  return c;
}

dt_fsdp_config_t dt_fsdp_config_default(int mesh_ndim) {
  return dt_fsdp_config_for(mesh_ndim > 0 ? mesh_ndim - 1 : 0, mesh_ndim > 1 ? mesh_ndim - 2 : -1);
}

/* The number of shard dims (shard_dim .. shard_dim + span - 1) and whether d is one. */
static int shard_span(const dt_fsdp_config_t* c) { return c->shard_span > 1 ? c->shard_span : 1; }

static int is_shard_dim(const fsdp_group_t* g, int d) {
  return d >= g->cfg.shard_dim && d < g->cfg.shard_dim + shard_span(&g->cfg);
}

/* Placements of the group's tensors: `data` on the shard dims (and `rep` on the replicate dim),
 * Replicate elsewhere. */
static void placements(const fsdp_group_t* g, dt_placement_t shard, dt_placement_t rep,
                       dt_placement_t* pl) {
  for (int d = 0; d < g->mesh_ndim; d++) pl[d] = is_shard_dim(g, d) ? shard : dt_replicate();
  if (g->cfg.replicate_dim >= 0) pl[g->cfg.replicate_dim] = rep;
}

/* A parameter's sharded placements: its own with Shard(sdim) on the shard dims. */
static void shard_placements(const fsdp_group_t* g, const fsdp_param_t* q, dt_placement_t* pl) {
  memcpy(pl, q->pl, sizeof q->pl);
  for (int d = 0; d < g->mesh_ndim; d++)
    if (is_shard_dim(g, d)) pl[d] = dt_shard(q->sdim);
}

/* Segment k of `rows` rows over the shard dims (k in mesh-dim order, the last dim fastest): the
 * nested chunk rule of Shard(0) on each of them in turn, as the sharded parameters' layout. */
static void segment_rows(const fsdp_group_t* g, int64_t rows, int64_t k, int64_t* off,
                         int64_t* len) {
  int64_t o = 0, l = rows, rest = g->N;
  for (int i = 0; i < shard_span(&g->cfg); i++) {
    const int64_t n = g->sizes[i], c = k / (rest / n) % n;
    int64_t co, cl;
    dt_chunk(l, n, c, &co, &cl);
    o += co;
    l = cl;
    rest /= n;
  }
  *off = o;
  *len = l;
}

/* ---------------------------------------------------------------------------------------------
 * gather: copy-in, one all-gather, copy-out into U, views */

/* The gathered parameters become meta tensors (their data released) and U is freed. */
static dt_status_t release(fsdp_group_t* g) {
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    int meta = 0;
    DT_CHECK(dt_tensor_is_meta(dt_var_value(q->full), &meta));
    if (meta) continue;
    dt_tensor_t t;
    DT_CHECK(dt_tensor_meta(g->mesh, g->cfg.param_dtype, q->ndim, q->shape, q->pl, &t));
    dt_status_t st = dt_var_set_value(q->full, t);
    if (st != DT_SUCCESS) {
      dt_tensor_destroy(t);
      return st;
    }
  }
  dt_tensor_destroy(g->U);
  g->U = NULL;
  return DT_SUCCESS;
}

static void discard_gather(fsdp_group_t* g) {
  if (g->ag_work) dt_work_destroy(g->ag_work); /* completes it: every rank started it */
  g->ag_work = NULL;
  if (g->ag_from_keep) g->keep = g->ag_send; /* the slice is still needed */
  else dt_tensor_destroy(g->ag_send);
  dt_tensor_destroy(g->ag_out);
  g->ag_send = g->ag_out = NULL;
  g->ag_from_keep = 0;
}

/* A sharded parameter whose value was replaced since it was made a view of flat
 * (dt_var_set_value, e.g. a checkpoint load) is copied into flat and made a view of it again. */
static dt_status_t adopt_shards(fsdp_group_t* g) {
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    dt_tensor_t v = dt_var_value(q->sharded), view = NULL;
    if (v == q->view) continue;
    int rg;
    if (v == NULL) { /* the variable itself was destroyed: say which */
      dt_status_t st = dt_var_requires_grad(q->sharded, &rg);
      return DT_FAIL(st != DT_SUCCESS ? st : DT_ERR_INVALID_USAGE, "fsdp: the sharded parameter "
                     "'%s': %s", q->name, st != DT_SUCCESS ? dt_last_error() : "no value");
    }
    dt_placement_t want[DT_MAX_MESH_DIMS], have[DT_MAX_MESH_DIMS];
    int64_t shape[DT_MAX_DIMS], len = 0;
    dt_dtype_t dt = DT_F32;
    int nd = 0, same = 1, meta = 0;
    shard_placements(g, q, want);
    DT_CHECK(dt_tensor_placements(v, have));
    DT_CHECK(dt_tensor_ndim(v, &nd));
    DT_CHECK(dt_tensor_dtype(v, &dt));
    DT_CHECK(dt_tensor_local_numel(v, &len));
    DT_CHECK(dt_tensor_is_meta(v, &meta));
    same = nd == q->ndim && dt == g->sdtype;
    if (same) DT_CHECK(dt_tensor_shape(v, shape));
    for (int k = 0; same && k < q->ndim; k++) same = shape[k] == q->shape[k];
    for (int k = 0; same && k < g->mesh_ndim; k++) same = dt_placement_equal(have[k], want[k]);
    if (!same)
      return DT_FAIL(DT_ERR_INVALID_USAGE, "fsdp: the sharded parameter '%s' was replaced by a "
                     "tensor of another shape, dtype or placements", q->name);
    if (meta) /* whatever the shard's size: a rank with an empty shard fails too, instead of
               * going on into the all-gather the others have left */
      return DT_FAIL(DT_ERR_INVALID_USAGE, "fsdp: the sharded parameter '%s' has no data (a meta "
                     "tensor?)", q->name);
    DT_CHECK(dt_tensor_view_local(g->flat, q->seg_off, q->ndim, q->shape, want, &view));
    const int64_t zero = 0;
    dt_status_t st = len > 0 ? dt_tensor_copy_local(g->flat, v, 1, &q->seg_off, &zero, &len)
                             : DT_SUCCESS;
    if (st == DT_SUCCESS) st = dt_var_set_value(q->sharded, view);
    if (st != DT_SUCCESS) {
      dt_tensor_destroy(view);
      return st;
    }
    q->view = view;
  }
  return DT_SUCCESS;
}

/* Starts the group's all-gather: from the kept slice (reshard k, backward) or from flat. */
static dt_status_t start_gather(fsdp_group_t* g) {
  if (g->n == 0 || g->ag_work || g->U) return DT_SUCCESS; /* n 0: nothing to gather */
  dt_status_t st;
  if (g->keep) {
    dt_placement_t rep[DT_MAX_MESH_DIMS + 1];
    int knd;
    DT_CHECK(dt_mesh_ndim(g->kmesh, &knd));
    for (int d = 0; d < knd; d++) rep[d] = dt_replicate();
    DT_CHECK(dt_tensor_redistribute_async(g->keep, rep, &g->ag_out, &g->ag_work));
    g->ag_send = g->keep;
    g->keep = NULL;
    g->ag_from_keep = 1;
    return dt_tensor_set_memory_category(g->ag_out, DT_MEM_PARAMETERS);
  }
  DT_CHECK(adopt_shards(g));
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  placements(g, dt_replicate(), dt_replicate(), rep);
  dt_tensor_t send = g->flat;
  if (g->cfg.param_dtype != g->sdtype) { /* mixed precision: one cast of the whole segment */
    const int64_t to = g->cfg.param_dtype;
    DT_CHECK(dt_op_run("cast", 1, &g->flat, 1, &to, 0, NULL, &g->ag_send));
    DT_CHECK_GOTO(dt_tensor_set_memory_category(g->ag_send, DT_MEM_COMMUNICATION), st, fail);
    send = g->ag_send;
  }
  DT_CHECK_GOTO(dt_tensor_redistribute_async(send, rep, &g->ag_out, &g->ag_work), st, fail);
  g->ag_from_keep = 0;
  return dt_tensor_set_memory_category(g->ag_out, DT_MEM_COMMUNICATION);
fail:
  dt_tensor_destroy(g->ag_send);
  g->ag_send = NULL;
  return st;
}

/* Waits for the all-gather (starting it if needed), fills U and points the gathered
 * parameters at it. */
static dt_status_t gather(fsdp_group_t* g) {
  if (g->U || g->n == 0) return DT_SUCCESS;
  if (g->ag_work) g->prefetched++;
  g->gathers++;
  DT_CHECK(start_gather(g));
  dt_status_t st = dt_work_wait(g->ag_work);
  dt_work_destroy(g->ag_work);
  g->ag_work = NULL;
  if (st != DT_SUCCESS) {
    discard_gather(g);
    return st;
  }
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  placements(g, dt_replicate(), dt_replicate(), rep);
  dt_tensor_destroy(g->ag_send);
  st = dt_tensor_empty(g->mesh, g->cfg.param_dtype, 1, &g->total_pad, rep, &g->U);
  if (st == DT_SUCCESS) st = dt_tensor_set_memory_category(g->U, DT_MEM_PARAMETERS);
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(g->ag_out);
    g->ag_send = g->ag_out = NULL;
    dt_tensor_destroy(g->U);
    g->U = NULL;
    return st;
  }
  if (g->ag_from_keep) { /* the gathered slices are U's bytes (on the k-mesh: copied onto the
                          * group's mesh, which the parameters' views need) */
    const int64_t zero = 0;
    st = dt_tensor_copy_local(g->U, g->ag_out, 1, &zero, &zero, &g->total_pad);
  } else { /* rank r's segment holds its rows of every parameter: to their places in U */
    const int64_t pad = g->total_pad - g->total;
    st = pad > 0 ? dt_tensor_fill_local(g->U, 1, &g->total, &pad, 0.0) : DT_SUCCESS;
    if (st == DT_SUCCESS)
      st = dt_tensor_copy_local(g->U, g->ag_out, g->n_out, g->out_dst, g->out_src, g->out_len);
  }
  if (st != DT_SUCCESS) {
    dt_tensor_destroy(g->ag_out);
    g->ag_send = g->ag_out = NULL;
    g->ag_from_keep = 0;
    dt_tensor_destroy(g->U);
    g->U = NULL;
    return st;
  }
  dt_tensor_destroy(g->ag_out);
  g->ag_send = g->ag_out = NULL;
  g->ag_from_keep = 0;
  /* the gathered parameters: views of U that keep it alive, so a view an op made of one (and
   * recorded for the backward) stays valid after the group is resharded */
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    dt_tensor_t v;
    st = dt_tensor_view_local(g->U, q->full_off, q->ndim, q->shape, q->pl, &v);
    if (st == DT_SUCCESS) {
      st = dt_var_set_value(q->full, v);
      if (st != DT_SUCCESS) dt_tensor_destroy(v);
    }
    if (st != DT_SUCCESS) {
      release(g);
      return st;
    }
  }
  return DT_SUCCESS;
}

/* Reshard k after the forward: keep this rank's 1/k slice of U, then release U. */
static dt_status_t keep_slice(fsdp_group_t* g) {
  if (g->n == 0) return DT_SUCCESS;
  int knd;
  DT_CHECK(dt_mesh_ndim(g->kmesh, &knd));
  dt_placement_t pl[DT_MAX_MESH_DIMS + 1];
  for (int d = 0; d < knd; d++) pl[d] = dt_replicate();
  pl[knd - 1] = dt_shard(0);
  DT_CHECK(dt_tensor_empty(g->kmesh, g->cfg.param_dtype, 1, &g->total_pad, pl, &g->keep));
  DT_CHECK(dt_tensor_set_memory_category(g->keep, DT_MEM_PARAMETERS));
  const int64_t per = g->total_pad / g->k, from = per * (g->rank % g->k), zero = 0;
  DT_CHECK(dt_tensor_copy_local(g->keep, g->U, 1, &zero, &from, &per));
  return release(g);
}

/* ---------------------------------------------------------------------------------------------
 * reduce: copy-in of the gathered parameters' gradients, one reduce-scatter, accumulate */

/* The reduce buffer's layout for the parameters that require a gradient now: the flat layout
 * with the frozen parameters' rows left out (the same as it when none is frozen). Allocates
 * nothing (the tables are make_ranges'). */
static void reduce_layout(fsdp_group_t* g) {
  if (!g->rs_dirty) return;
  g->rs_seg = 0;
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    q->rs_off = q->requires_grad ? g->rs_seg : -1;
    if (q->requires_grad) g->rs_seg += q->pre * q->chunk * q->rest;
  }
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    if (q->rs_off < 0) continue;
    for (int k = 0; k < g->N; k++) { /* in_dst, pad_off moved from segment k's to its own */
      const int64_t from = (int64_t)k * g->seg + q->seg_off, to = (int64_t)k * g->rs_seg + q->rs_off;
      for (int64_t b = 0; b < q->pre; b++)
        q->rs_dst[k * q->pre + b] = q->in_dst[k * q->pre + b] - from + to;
      q->rs_pad[k] = q->pad_off[k] - from + to;
    }
  }
  g->rs_dirty = 0;
}

static dt_status_t start_reduce(fsdp_group_t* g) {
  if (g->n == 0) return DT_SUCCESS; /* a group without parameters reduces nothing */
  reduce_layout(g);
  if (g->rs_seg == 0) return DT_SUCCESS; /* every parameter frozen: nothing to reduce */
  dt_placement_t ppl[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
  dt_placement_t sum = dt_partial(DT_REDUCE_SUM);
  placements(g, sum, sum, ppl);
  placements(g, dt_shard(0), sum, dst);
  const int64_t n = (int64_t)g->N * g->rs_seg;
  dt_tensor_t send;
  DT_CHECK(dt_tensor_empty(g->mesh, g->cfg.reduce_dtype, 1, &n, ppl, &send));
  dt_status_t st = dt_tensor_set_memory_category(send, DT_MEM_COMMUNICATION);
  for (int i = 0; i < g->n && st == DT_SUCCESS; i++) {
    fsdp_param_t* q = &g->p[i];
    dt_tensor_t gr = dt_var_grad(q->full), tmp = NULL, view = NULL, cast = NULL;
    if (q->rs_off < 0) { /* frozen: not reduced (a gradient set by hand is dropped) */
      if (gr != NULL) st = dt_var_set_grad(q->full, NULL);
      continue;
    }
    if (gr == NULL) { /* no gradient reached it: zeros (its rows and padding in every segment) */
      for (int r = 0; r < g->N && st == DT_SUCCESS; r++) {
        const int64_t len = q->pre * q->chunk * q->rest;
        st = dt_tensor_fill_local(send, 1, &q->rs_dst[r * q->pre], &len, 0.0);
      }
      continue;
    }
    dt_placement_t have[DT_MAX_MESH_DIMS], want[DT_MAX_MESH_DIMS];
    memcpy(want, q->pl, sizeof want);
    for (int d = 0; d < g->mesh_ndim; d++)
      if (is_shard_dim(g, d) || d == g->cfg.replicate_dim) want[d] = sum;
    st = dt_tensor_placements(gr, have);
    int ok = st == DT_SUCCESS, meta = 0;
    for (int d = 0; ok && d < g->mesh_ndim; d++) ok = dt_placement_equal(have[d], want[d]);
    if (st == DT_SUCCESS && !ok) { /* Replicate on a dim: to Partial (a local step); a Shard
                                    * (an op chose to reduce the gradient itself): through
                                    * Replicate, since a new Partial cannot come from a Shard */
      st = dt_var_reduce_grad(q->full, want);
      gr = dt_var_grad(q->full);
    }
    if (st == DT_SUCCESS) st = dt_tensor_is_meta(gr, &meta);
    if (st == DT_SUCCESS && meta)
      st = DT_FAIL(DT_ERR_INVALID_USAGE, "fsdp: the gradient of '%s' has no data (was the "
                   "parameter used outside its module's forward?)", q->name);
    dt_tensor_t src = gr;
    if (st == DT_SUCCESS && g->cfg.param_dtype != g->cfg.reduce_dtype) {
      /* cast this rank's partial values: a Replicate view of them casts locally */
      const int64_t to = g->cfg.reduce_dtype;
      st = dt_tensor_view_local(gr, 0, q->ndim, q->shape, q->pl, &view);
      if (st == DT_SUCCESS) st = dt_op_run("cast", 1, &view, 1, &to, 0, NULL, &cast);
      src = cast;
    }
    if (st == DT_SUCCESS)
      st = dt_tensor_copy_local(send, src, g->N * q->pre, q->rs_dst, q->in_src, q->in_len);
    if (st == DT_SUCCESS) st = dt_tensor_fill_local(send, g->N, q->rs_pad, q->pad_len, 0.0);
    dt_tensor_destroy(cast);
    dt_tensor_destroy(view);
    dt_tensor_destroy(tmp);
    if (st == DT_SUCCESS) st = dt_var_set_grad(q->full, NULL);
  }
  if (st == DT_SUCCESS) st = dt_tensor_redistribute_async(send, dst, &g->rs_out, &g->rs_work);
  if (st == DT_SUCCESS) g->reductions++;
  dt_tensor_destroy(send); /* the work keeps what it needs */
  if (st == DT_SUCCESS) st = dt_tensor_set_memory_category(g->rs_out, DT_MEM_COMMUNICATION);
  return st;
}

/* Waits for the group's reduction; the sharded gradients become views of this rank's segment
 * (added to gradients already there). */
static dt_status_t finish_reduce(fsdp_group_t* g) {
  if (g->rs_work == NULL) return DT_SUCCESS;
  dt_status_t st = dt_work_wait(g->rs_work);
  dt_work_destroy(g->rs_work);
  g->rs_work = NULL;
  dt_tensor_t out = g->rs_out, tmp = NULL;
  g->rs_out = NULL;
  if (st == DT_SUCCESS && g->cfg.replicate_dim >= 0) { /* HSDP: over the replicas too */
    dt_placement_t dst[DT_MAX_MESH_DIMS];
    placements(g, dt_shard(0), dt_replicate(), dst);
    st = dt_tensor_redistribute(out, dst, &tmp);
    if (st == DT_SUCCESS) {
      dt_tensor_destroy(out);
      out = tmp;
      tmp = NULL;
    }
  }
  if (st == DT_SUCCESS && g->cfg.reduce_dtype != g->sdtype) { /* one cast of the segment */
    const int64_t to = g->sdtype;
    st = dt_op_run("cast", 1, &out, 1, &to, 0, NULL, &tmp);
    if (st == DT_SUCCESS) {
      dt_tensor_destroy(out);
      out = tmp;
      tmp = NULL;
    }
  }
  if (st == DT_SUCCESS) st = dt_tensor_set_memory_category(out, DT_MEM_GRADIENTS);
  /* the gradients are views of this rank's segment: no copy (they keep it alive) */
  for (int i = 0; i < g->n && st == DT_SUCCESS; i++) {
    fsdp_param_t* q = &g->p[i];
    if (q->rs_off < 0) continue; /* frozen when the reduction started: not in it */
    dt_tensor_t part = NULL, sum = NULL;
    dt_placement_t spl[DT_MAX_MESH_DIMS];
    shard_placements(g, q, spl);
    st = dt_tensor_view_local(out, q->rs_off, q->ndim, q->shape, spl, &part);
    dt_tensor_t old = dt_var_grad(q->sharded);
    if (st == DT_SUCCESS && old != NULL) { /* accumulate (several synced passes) */
      dt_tensor_t two[2] = {old, part};
      st = dt_op_run("add", 2, two, 0, NULL, 0, NULL, &sum);
      dt_tensor_destroy(part);
      part = sum;
    }
    if (st == DT_SUCCESS) {
      st = dt_var_set_grad(q->sharded, part);
      if (st == DT_SUCCESS) part = NULL;
    }
    dt_tensor_destroy(part);
  }
  dt_tensor_destroy(out);
  return st;
}

static dt_status_t dt__fsdp_wait(void) {
  dt_status_t first = DT_SUCCESS;
  for (fsdp_group_t* g = g_fsdp.groups; g; g = g->next) {
    dt_status_t st = finish_reduce(g);
    if (first == DT_SUCCESS) first = st;
  }
  return first;
}

dt_status_t dt_fsdp_wait(void) { DT_ENTRY_RETURN(dt__fsdp_wait()); }

/* Unconsumed prefetches: stale once the parameters change (the optimizer step). */
static void discard_prefetches(void) {
  for (fsdp_group_t* g = g_fsdp.groups; g; g = g->next)
    if (g->ag_work) discard_gather(g);
}

/* ---------------------------------------------------------------------------------------------
 * hooks */

static dt_status_t swap(fsdp_group_t* g, int to_full) {
  if (g->swapped == to_full) return DT_SUCCESS;
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    dt_var_t old;
    DT_CHECK(dt_module_swap_param(g->module, q->name, to_full ? q->full : q->sharded, &old));
  }
  g->swapped = to_full;
  return DT_SUCCESS;
}

/* Casts the floating variables among vars[n] to dtype (recorded). */
static dt_status_t cast_vars(dt_tape_t tape, int n, dt_var_t* vars, dt_dtype_t dtype) {
  for (int i = 0; i < n; i++) {
    if (vars[i] == NULL) continue;
    dt_dtype_t t;
    DT_CHECK(dt_tensor_dtype(dt_var_value(vars[i]), &t));
    if (!is_float(t) || t == dtype) continue;
    const int64_t to = dtype;
    DT_CHECK(dt_ag_op(tape, "cast", 1, &vars[i], 1, &to, 0, NULL, 1, &vars[i]));
  }
  return DT_SUCCESS;
}

/* Whether no module above g's is a group: its forward and backward enclose the others' (decided
 * from the tree, so a pass that failed halfway leaves nothing behind). */
static int outermost(const fsdp_group_t* g) {
  for (dt_module_t m = dt_module_parent(g->module); m; m = dt_module_parent(m))
    if (dt_module_attachment(m, FSDP_KEY)) return 0;
  return 1;
}

/* The group whose gather g starts ahead of need: the next one in forward (fwd 1) or backward
 * order that has parameters (a group without any, e.g. a root whose parameters are all in its
 * children's groups, has nothing to gather: prefetch looks past it), unless it is gathered or
 * being gathered already. NULL: none. */
static fsdp_group_t* prefetch_target(fsdp_group_t* g, int fwd) {
  int n_groups = 0;
  for (fsdp_group_t* o = g_fsdp.groups; o; o = o->next) n_groups++;
  fsdp_group_t* nx = fwd ? g->next_fwd : g->next_bwd;
  for (int hops = 0; nx && nx != g && nx->n == 0 && hops < n_groups; hops++)
    nx = fwd ? nx->next_fwd : nx->next_bwd; /* bounded: the learned orders may hold a cycle */
  if (nx == NULL || nx == g || nx->n == 0 || nx->U || nx->ag_work) return NULL;
  return nx;
}

/* Each gathered parameter requires a gradient as its sharded variable does now (the caller may
 * freeze or unfreeze it between steps, dt_var_set_requires_grad): the backward computes its
 * gradient, and the reduction keeps it, only while it is set. */
static dt_status_t follow_flags(fsdp_group_t* g) {
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    int rg = 0;
    DT_CHECK(dt_var_requires_grad(q->sharded, &rg));
    if (rg == q->requires_grad) continue;
    DT_CHECK(dt_var_set_requires_grad(q->full, rg));
    q->requires_grad = rg;
    g->rs_dirty = 1; /* the reduce buffer's layout follows */
  }
  return DT_SUCCESS;
}

static dt_status_t pre_forward(dt_module_t m, dt_tape_t tape, int n, dt_var_t* vars, void* ctx) {
  (void)m;
  fsdp_group_t* g = ctx;
  if (outermost(g)) { /* a new pass: finish the last one's leftovers */
    DT_CHECK(dt_fsdp_wait());
    discard_prefetches();
    g_fsdp.last_pre = g_fsdp.last_post = NULL;
  }
  if (g_fsdp.last_pre) g_fsdp.last_pre->next_fwd = g;
  g_fsdp.last_pre = g;
  if (g->keep) { /* a forward again before the backward used the slice */
    dt_tensor_destroy(g->keep);
    g->keep = NULL;
  }
  DT_CHECK(gather(g));
  DT_CHECK(follow_flags(g));
  fsdp_group_t* nx = g->prefetch_fwd ? prefetch_target(g, 1) : NULL;
  if (nx) DT_CHECK(start_gather(nx));
  DT_CHECK(swap(g, 1));
  if (g->cfg.param_dtype == DT_F32) return DT_SUCCESS;
  dt_status_t st = cast_vars(tape, n, vars, g->cfg.param_dtype);
  if (st != DT_SUCCESS) /* a failed pre hook gets no post hook: put the shards back here */
    (void)swap(g, 0);
  return st;
}

static dt_status_t post_forward(dt_module_t m, dt_tape_t tape, int n, dt_var_t* vars, void* ctx) {
  (void)m;
  fsdp_group_t* g = ctx;
  DT_CHECK(swap(g, 0));
  g->next_bwd = g_fsdp.last_post;
  g_fsdp.last_post = g;
  const int backward = tape != NULL && dt_grad_enabled();
  if (!backward || g->cfg.reshard_after_forward == 1) DT_CHECK(release(g));
  else if (g->k > 1) DT_CHECK(keep_slice(g));
  if (outermost(g)) discard_prefetches();
  if (g->cfg.output_dtype == DT_FSDP_KEEP_DTYPE) return DT_SUCCESS;
  return cast_vars(tape, n, vars, g->cfg.output_dtype);
}

static dt_status_t pre_backward(dt_module_t m, dt_tape_t tape, void* ctx) {
  (void)m;
  (void)tape;
  fsdp_group_t* g = ctx;
  DT_CHECK(gather(g));
  fsdp_group_t* nx = g->prefetch_bwd ? prefetch_target(g, 0) : NULL;
  if (nx) DT_CHECK(start_gather(nx));
  return DT_SUCCESS;
}

static dt_status_t post_backward(dt_module_t m, dt_tape_t tape, void* ctx) {
  (void)m;
  (void)tape;
  fsdp_group_t* g = ctx;
  if (g->sync) {
    DT_CHECK(finish_reduce(g)); /* a second backward before the first finished */
    DT_CHECK(start_reduce(g));
    for (fsdp_group_t* o = g_fsdp.groups; o; o = o->next) /* at most two in flight */
      if (o != g) DT_CHECK(finish_reduce(o));
  }
  DT_CHECK(release(g));
  if (outermost(g)) {
    DT_CHECK(dt_fsdp_wait());
    discard_prefetches();
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * wrapping */

static void group_free(fsdp_group_t* g) {
  if (g == NULL) return;
  for (fsdp_group_t** pp = &g_fsdp.groups; *pp; pp = &(*pp)->next)
    if (*pp == g) {
      *pp = g->next;
      break;
    }
  for (fsdp_group_t* o = g_fsdp.groups; o; o = o->next) {
    if (o->next_fwd == g) o->next_fwd = NULL;
    if (o->next_bwd == g) o->next_bwd = NULL;
  }
  if (g_fsdp.last_pre == g) g_fsdp.last_pre = NULL;
  if (g_fsdp.last_post == g) g_fsdp.last_post = NULL;
  if (g->ag_work) discard_gather(g);
  if (g->rs_work) dt_work_destroy(g->rs_work);
  dt_tensor_destroy(g->rs_out);
  dt_tensor_destroy(g->keep);
  swap(g, 0); /* the module frees the sharded parameters */
  for (int i = 0; g->p && i < g->n; i++) dt_var_destroy(g->p[i].full);
  dt_tensor_destroy(g->U);
  dt_tensor_destroy(g->flat); /* the sharded parameters' views keep its storage while they live */
  dt_mesh_destroy(g->kmesh);
  free(g->ranges);
  free(g->p);
  free(g);
}

static void group_free_fn(dt_module_t m, void* data) {
  (void)m;
  group_free(data);
}

/* A phrase naming m by its path from the tree's root (unnamed modules add nothing): "module
 * 'layers.0'", "an unnamed module in 'layers.0'", "the root module", "root module 'mlp'". */
static void module_path(dt_module_t m, char* buf, size_t cap) {
  const char* names[64];
  int n = 0;
  for (dt_module_t x = m; x && dt_module_parent(x) && n < 64; x = dt_module_parent(x))
    if (dt_module_name(x)[0] != '\0') names[n++] = dt_module_name(x);
  if (dt_module_parent(m) == NULL) {
    if (dt_module_name(m)[0] != '\0') snprintf(buf, cap, "root module '%s'", dt_module_name(m));
    else snprintf(buf, cap, "the root module");
    return;
  }
  int unnamed = dt_module_name(m)[0] == '\0';
  if (n == 0) {
    snprintf(buf, cap, "an unnamed module in the root");
    return;
  }
  size_t w = (size_t)snprintf(buf, cap, "%s'", unnamed ? "an unnamed module in " : "module ");
  for (int i = n - 1; i >= 0 && w < cap; i--)
    w += (size_t)snprintf(buf + w, cap - w, "%s%s", names[i], i ? "." : "");
  if (w < cap) snprintf(buf + w, cap - w, "'");
}

static int in_other_group(dt_var_t v) {
  for (fsdp_group_t* o = g_fsdp.groups; o; o = o->next)
    for (int i = 0; i < o->n; i++)
      if (o->p[i].sharded == v || o->p[i].full == v) return 1;
  return 0;
}

typedef struct {
  fsdp_group_t* g;
  int cap;
  dt_status_t st;
} collect_t;

static int collect(const char* name, dt_var_t v, void* ctx) {
  collect_t* c = ctx;
  fsdp_group_t* g = c->g;
  if (in_other_group(v)) return 0;
  /* a tied parameter (listed once here) used outside m too belongs to the group of a module that
   * holds every use, the lowest common ancestor as FSDP2 advises (wrapped later: bottom-up), so
   * that one gather serves every use and one reduce-scatter takes the sum of their gradients */
  int holders = 0, here = 0;
  c->st = dt_module_param_holders(v, &holders);
  if (c->st == DT_SUCCESS && holders > 1)
    c->st = dt_module_param_names(g->module, v, 0, NULL, 0, &here);
  if (c->st != DT_SUCCESS) return 1;
  if (holders > 1 && here < holders) return 0;
  dt_tensor_t t = dt_var_value(v);
  dt_mesh_t pm = NULL;
  dt_dtype_t dt = DT_F32;
  int nd = 0;
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  if (dt_tensor_mesh(t, &pm) != DT_SUCCESS || dt_tensor_dtype(t, &dt) != DT_SUCCESS ||
      dt_tensor_ndim(t, &nd) != DT_SUCCESS || dt_tensor_placements(t, pl) != DT_SUCCESS) {
    c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is not a live variable", name);
    return 1;
  }
  if (pm != g->mesh) {
    c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' lives on another mesh than "
                    "the one given", name);
    return 1;
  }
  if (!is_float(dt)) {
    c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is %s; only floating "
                    "parameters can be sharded", name, dt_dtype_name(dt));
    return 1;
  }
  if (nd == 0) { /* FSDP2 refuses it too */
    c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is a scalar (0-d), which FSDP cannot "
                    "split: make it a 1-d parameter of one element (shape (1)), as PyTorch's "
                    "fully_shard asks, or keep it out of the wrapped module", name);
    return 1;
  }
  if (nd < 1 || nd > DT_MAX_DIMS) {
    c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' has %d dims (1 to %d)", name,
                    nd, DT_MAX_DIMS);
    return 1;
  }
  /* already sharded over the shard dim (experts under expert parallelism): left as it is, its
   * gradient complete on the rank that holds it */
  if (pl[g->cfg.shard_dim].kind == DT_SHARD) return 0;
  for (int d = 0; d < g->mesh_ndim; d++) {
    int data = is_shard_dim(g, d) || d == g->cfg.replicate_dim;
    /* tensor parallel on another dim: FSDP shards that shard's dim 0, which nests inside the
     * other dim's split only when that dim comes first in the mesh (mesh-dim order) */
    int nested_ok = pl[d].kind == DT_SHARD && (pl[d].dim != 0 || d < g->cfg.shard_dim);
    if ((data && pl[d].kind != DT_REPLICATE) ||
        (!data && pl[d].kind != DT_REPLICATE && !nested_ok)) {
      char txt[64];
      dt_placements_format(pl, g->mesh_ndim, NULL, txt, sizeof txt);
      c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is %s; FSDP shards "
                      "parameters that are Replicate on the data dims (shard %d, replicate %d) "
                      "and Replicate or Shard on the others, a Shard(0) only on a mesh dim "
                      "before the shard dim (e.g. a (tp, dp) mesh)", name, txt,
                      g->cfg.shard_dim, g->cfg.replicate_dim);
      return 1;
    }
  }
  if (g->n > 0 && dt != g->p[0].dtype) { /* one flat buffer per group (FSDP2's rule too) */
    c->st = DT_FAIL(DT_ERR_UNSUPPORTED, "parameter '%s' is %s, '%s' is %s; the "
                    "parameters of one group share a dtype (wrap them in separate groups)", name,
                    dt_dtype_name(dt), g->p[0].name, dt_dtype_name(g->p[0].dtype));
    return 1;
  }
  if (strlen(name) >= FSDP_NAME_MAX) {
    c->st = DT_FAIL(DT_ERR_INVALID_ARG, "parameter name '%s' too long", name);
    return 1;
  }
  if (g->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 16;
    fsdp_param_t* p = realloc(g->p, sizeof *p * (size_t)cap);
    if (p == NULL) {
      c->st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "parameter table");
      return 1;
    }
    g->p = p;
    c->cap = cap;
  }
  fsdp_param_t* q = &g->p[g->n++];
  memset(q, 0, sizeof *q);
  strcpy(q->name, name);
  q->sharded = v; /* for now: the replicated parameter itself */
  q->dtype = dt;
  if ((c->st = dt_var_requires_grad(v, &q->requires_grad)) != DT_SUCCESS) return 1;
  q->ndim = nd;
  dt_tensor_shape(t, q->shape);
  dt_tensor_local_shape(t, q->lshape);
  memcpy(q->pl, pl, sizeof q->pl);
  /* dim 0, unless it has fewer rows than shard ranks (stacked experts: E / EP of them over
   * efsdp): then the first dim with at least N entries that tensor parallelism leaves whole, so
   * that no rank holds padding in place of its share (torchtitan shards such experts on dim 1) */
  q->sdim = 0;
  /* decided on the largest tensor-parallel shard (mesh coordinate 0's), not this rank's: uneven
   * shards would otherwise give the ranks different placements of one parameter */
  int mshape[DT_MAX_MESH_DIMS], zero[DT_MAX_MESH_DIMS] = {0};
  int64_t off[DT_MAX_DIMS], big[DT_MAX_DIMS];
  dt_status_t st = dt_mesh_shape(g->mesh, mshape);
  if (st == DT_SUCCESS)
    st = dt_placements_box(nd, q->shape, g->mesh_ndim, mshape, pl, zero, off, big);
  if (st != DT_SUCCESS) {
    c->st = st;
    return 1;
  }
  for (int d = 1; big[0] < g->N && q->sdim == 0 && d < nd; d++) {
    int whole = big[d] >= g->N;
    for (int k = 0; whole && k < g->mesh_ndim; k++)
      whole = !(pl[k].kind == DT_SHARD && pl[k].dim == d);
    if (whole) q->sdim = d;
  }
  q->pre = q->rest = 1;
  for (int d = 0; d < nd; d++) {
    if (d < q->sdim) q->pre *= q->lshape[d];
    if (d > q->sdim) q->rest *= q->lshape[d];
  }
  q->rows = q->lshape[q->sdim];
  return 0;
}

static dt_status_t check_config(dt_mesh_t mesh, const dt_fsdp_config_t* c, int* nd) {
  DT_CHECK(dt_mesh_ndim(mesh, nd));
  if (c->shard_dim < 0 || c->shard_dim >= *nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "shard dim %d is not a dim of the %d-dim mesh",
                   c->shard_dim, *nd);
  const int span = shard_span(c);
  if (c->shard_span < 0 || c->shard_dim + span > *nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "shard_span %d from shard dim %d: the %d-dim mesh has no "
                   "such dims (valid: 0 or 1, or s > 1 with shard_dim + s <= %d)", c->shard_span,
                   c->shard_dim, *nd, *nd);
  if (c->replicate_dim < -1 || c->replicate_dim >= *nd ||
      (c->replicate_dim >= c->shard_dim && c->replicate_dim < c->shard_dim + span))
    return DT_FAIL(DT_ERR_INVALID_ARG, "replicate dim %d: -1 (none) or a dim of the "
                   "%d-dim mesh other than the shard dim%s %d%s", c->replicate_dim, *nd,
                   span > 1 ? "s" : "", c->shard_dim, span > 1 ? " on" : "");
  if (!is_float(c->param_dtype) || !is_float(c->reduce_dtype) ||
      (!is_float(c->output_dtype) && c->output_dtype != DT_FSDP_KEEP_DTYPE))
    return DT_FAIL(DT_ERR_INVALID_ARG, "param, reduce and output dtypes must be "
                   "f32, bf16 or f16, the output's also DT_FSDP_KEEP_DTYPE (got %s, %s, %s)",
                   dt_dtype_name(c->param_dtype), dt_dtype_name(c->reduce_dtype),
                   c->output_dtype == DT_FSDP_KEEP_DTYPE ? "keep"
                                                         : dt_dtype_name(c->output_dtype));
  int N;
  DT_CHECK(dt_mesh_size(mesh, c->shard_dim, &N));
  int abstract = 0, member = 0;
  DT_CHECK(dt_mesh_is_abstract(mesh, &abstract));
  if (abstract)
    return DT_FAIL(DT_ERR_INVALID_ARG, "an abstract mesh cannot hold parameters (FSDP shards "
                   "and gathers them)");
  DT_CHECK(dt_mesh_is_member(mesh, &member));
  if (!member)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "this rank is not in the mesh");
  int k = c->reshard_after_forward, numel, world;
  DT_CHECK(dt_mesh_numel(mesh, &numel));
  DT_CHECK(dt_world_size(&world));
  if ((k > 1 || span > 1) && numel < world) /* decided from the shapes alone: every member
                                              * refuses, none waits in a collective */
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s on a mesh of %d of the %d ranks: it makes a mesh, "
                   "which is collective over every rank, and the ranks outside this mesh do not "
                   "call dt_fully_shard (use a mesh over every rank)",
                   k > 1 ? "reshard_after_forward > 1" : "shard_span > 1", numel, world);
  if (k > 1 && span > 1)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "reshard_after_forward %d with shard_span %d: groups of k "
                   "ranks need one shard dim", k, span);
  if (k < 0 || (k > 1 && (k > N || N % k != 0)))
    return DT_FAIL(DT_ERR_INVALID_ARG, "reshard_after_forward %d: 0, 1, or a group "
                   "size k > 1 that divides the shard dim's %d ranks", k, N);
  return DT_SUCCESS;
}

/* The element ranges of the copy-out (gather -> U) and of each parameter's gradient copy-in
 * (gradient -> reduce buffer, padding zeroed): fixed by the layout, computed once. */
static dt_status_t make_ranges(fsdp_group_t* g) {
  const int64_t N = g->N, n = g->n;
  if (n == 0) return DT_SUCCESS; /* a group without parameters has no layout */
  int64_t blocks = 0; /* the pre blocks of every parameter */
  for (int i = 0; i < g->n; i++) blocks += g->p[i].pre;
  g->ranges = malloc(sizeof(int64_t) * (size_t)(7 * N * blocks + 3 * N * n));
  if (g->ranges == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "range tables");
  int64_t* r = g->ranges;
  g->out_dst = r;
  g->out_src = r + N * blocks;
  g->out_len = r + 2 * N * blocks;
  r += 3 * N * blocks;
  g->n_out = 0;
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    const int64_t np = N * q->pre;
    q->in_dst = r;
    q->in_src = r + np;
    q->in_len = r + 2 * np;
    q->pad_off = r + 3 * np;
    q->pad_len = r + 3 * np + N;
    q->rs_dst = r + 3 * np + 2 * N;
    q->rs_pad = r + 4 * np + 2 * N;
    r += 4 * np + 3 * N;
    for (int k = 0; k < g->N; k++) {
      int64_t off, len;
      segment_rows(g, q->rows, k, &off, &len);
      const int64_t seg = (int64_t)k * g->seg + q->seg_off; /* (pre, len, rest), then padding */
      for (int64_t b = 0; b < q->pre; b++) {
        q->in_dst[k * q->pre + b] = seg + b * len * q->rest;
        q->in_src[k * q->pre + b] = (b * q->rows + off) * q->rest;
        q->in_len[k * q->pre + b] = len * q->rest;
      }
      q->pad_off[k] = seg + q->pre * len * q->rest;
      q->pad_len[k] = q->pre * (q->chunk - len) * q->rest;
    }
  }
  for (int k = 0; k < g->N; k++) /* rank by rank, as the segments arrive */
    for (int i = 0; i < g->n; i++) {
      fsdp_param_t* q = &g->p[i];
      for (int64_t b = 0; b < q->pre; b++) {
        const int64_t j = k * q->pre + b;
        g->out_dst[g->n_out] = q->full_off + q->in_src[j];
        g->out_src[g->n_out] = q->in_dst[j];
        g->out_len[g->n_out++] = q->in_len[j];
      }
    }
  g->rs_dirty = 1;
  return DT_SUCCESS;
}

/* The mesh with the shard dim split into (N/k, k), consecutive ranks of it in one k-group. */
static dt_status_t make_kmesh(fsdp_group_t* g) {
  int shape[DT_MAX_MESH_DIMS + 1], knd = 0, coords[DT_MAX_MESH_DIMS];
  int mshape[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_mesh_shape(g->mesh, mshape));
  /* kmesh dims: the replicate dim (if any), N/k, k; other mesh dims must be 1 */
  for (int d = 0; d < g->mesh_ndim; d++)
    if (d != g->cfg.shard_dim && d != g->cfg.replicate_dim && mshape[d] != 1)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "reshard to groups of %d needs a mesh of "
                     "the shard (and replicate) dims only", g->k);
  int rdim = g->cfg.replicate_dim;
  if (rdim >= 0) shape[knd++] = mshape[rdim];
  shape[knd++] = g->N / g->k;
  shape[knd++] = g->k;
  int nranks = 1;
  for (int d = 0; d < knd; d++) nranks *= shape[d];
  int* ranks = malloc(sizeof(int) * (size_t)nranks);
  if (ranks == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "rank table");
  dt_status_t st = DT_SUCCESS;
  for (int i = 0; i < nranks && st == DT_SUCCESS; i++) {
    int rep = rdim >= 0 ? i / g->N : 0, s = i % g->N;
    for (int d = 0; d < g->mesh_ndim; d++) coords[d] = 0;
    coords[g->cfg.shard_dim] = s;
    if (rdim >= 0) coords[rdim] = rep;
    st = dt_mesh_rank_at(g->mesh, coords, &ranks[i]);
  }
  if (st == DT_SUCCESS) st = dt_mesh_create(knd, shape, NULL, ranks, &g->kmesh);
  free(ranks);
  return st;
}

/* Frees a group that was never committed (NULL: nothing). */
static void group_discard(fsdp_group_t* g) {
  if (g == NULL) return;
  dt_tensor_destroy(g->flat);
  dt_mesh_destroy(g->kmesh);
  free(g->ranges);
  free(g->p);
  free(g);
}

/* dt_fully_shard's local part: the checks and the group's layout (no communication), in *out.
 * *mesh_ok once mesh is a live handle: the ranks agree on the outcome over it. */
static dt_status_t plan_group(dt_module_t m, dt_mesh_t mesh, const dt_fsdp_config_t* cfg,
                              fsdp_group_t** out, int* mesh_ok) {
  DT_ARG_NOT_NULL(mesh);
  int nd, np;
  DT_CHECK(dt_mesh_ndim(mesh, &nd));
  *mesh_ok = 1;
  DT_ARG_NOT_NULL(m);
  DT_CHECK(dt_module_num_params(m, &np)); /* checks the handle (a destroyed one: invalid usage) */
  dt_fsdp_config_t c = cfg ? *cfg : dt_fsdp_config_default(nd);
  DT_CHECK(check_config(mesh, &c, &nd));
  if (dt_module_attachment(m, FSDP_KEY) || dt_module_attachment(m, "ddp"))
    return DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s' is already wrapped (%s)",
                   dt_module_name(m), dt_module_attachment(m, FSDP_KEY) ? "FSDP" : "DDP");
  /* a group above m took m's parameters already (wrapped top-down): m's group would hold none
   * of them, and its schedule would run inside the other's */
  for (dt_module_t a = dt_module_parent(m); a; a = dt_module_parent(a)) {
    int fsdp = dt_module_attachment(a, FSDP_KEY) != NULL;
    if (!fsdp && dt_module_attachment(a, "ddp") == NULL) continue;
    char mp[FSDP_NAME_MAX], ap[FSDP_NAME_MAX];
    module_path(m, mp, sizeof mp);
    module_path(a, ap, sizeof ap);
    if (!fsdp)
      return DT_FAIL(DT_ERR_INVALID_USAGE, "%s is inside %s, which DDP wraps (FSDP "
                     "and DDP do not nest)", mp, ap);
    return DT_FAIL(DT_ERR_INVALID_USAGE, "%s is inside %s, which was wrapped (FSDP) "
                   "before it and holds its parameters; wrap bottom-up: each block, then the "
                   "root", mp, ap);
  }
  fsdp_group_t* g = calloc(1, sizeof *g);
  if (g == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "group");
  *out = g;
  g->module = m;
  g->mesh = mesh;
  g->cfg = c;
  g->mesh_ndim = nd;
  g->sync = 1;
  g->prefetch_fwd = c.prefetch_forward != 0;
  g->prefetch_bwd = c.prefetch_backward != 0;
  g->k = c.reshard_after_forward > 1 ? c.reshard_after_forward : 1;
  collect_t col = {g, 0, DT_SUCCESS};
  g->N = 1;
  g->rank = 0;
  for (int i = 0; i < shard_span(&c); i++) { /* the shard dims as one, the last fastest */
    int r;
    DT_CHECK(dt_mesh_size(mesh, c.shard_dim + i, &g->sizes[i]));
    DT_CHECK(dt_mesh_local_rank(mesh, c.shard_dim + i, &r));
    g->N *= g->sizes[i];
    g->rank = g->rank * g->sizes[i] + r;
  }
  if (c.replicate_dim >= 0) DT_CHECK(dt_mesh_size(mesh, c.replicate_dim, &g->R));
  else g->R = 1;
  DT_CHECK(dt_dtype_itemsize(c.param_dtype, &g->pes));
  DT_CHECK(dt_dtype_itemsize(c.reduce_dtype, &g->res));
  DT_CHECK(dt_module_for_each_param(m, collect, &col));
  DT_CHECK(col.st);
  /* g->n 0 (every parameter below m in its children's groups, or none at all): a group with no
   * buffers that only schedules its children (prefetch order, the reductions finished at the
   * end of the outermost backward), as FSDP2 does for a root without parameters of its own */
  for (int i = 0; i < g->n; i++) {
    fsdp_param_t* q = &g->p[i];
    int64_t off0;
    segment_rows(g, q->rows, 0, &off0, &q->chunk); /* the first segment is the largest */
    q->seg_off = g->seg;
    g->seg += q->pre * q->chunk * q->rest;
    q->full_off = g->total;
    g->total += q->pre * q->rows * q->rest;
  }
  g->total_pad = (g->total + g->k - 1) / g->k * g->k;
  DT_CHECK(make_ranges(g));
  g->sdtype = g->n > 0 ? g->p[0].dtype : c.param_dtype;
  return dt_dtype_itemsize(g->sdtype, &g->ses);
}

static dt_status_t fully_shard(dt_module_t m, dt_mesh_t mesh, const dt_fsdp_config_t* cfg) {
  fsdp_group_t* g = NULL;
  int mesh_ok = 0;
  dt_status_t st = plan_group(m, mesh, cfg, &g, &mesh_ok);
  /* a check that failed on one rank fails them all here, before the first collective (the
   * others would wait in it until the deadline) */
  if (mesh_ok) st = dt_mesh_agree(mesh, st, "dt_fully_shard's checks");
  if (st != DT_SUCCESS) {
    group_discard(g);
    return st;
  }
  const dt_fsdp_config_t c = g->cfg;
  if (shard_span(&c) > 1) { /* one communicator over them: merged collectives (no-op if known) */
    int dims[DT_MAX_MESH_DIMS];
    for (int i = 0; i < shard_span(&c); i++) dims[i] = c.shard_dim + i;
    DT_CHECK_GOTO(dt_mesh_flatten(mesh, shard_span(&c), dims, NULL, NULL), st, fail);
  }
  if (g->k > 1 && g->n > 0) DT_CHECK_GOTO(make_kmesh(g), st, fail);
  /* the new leaves: sharded parameters (views of flat, filled by a local slice: no
   * communication), gathered ones (meta); flat's padding stays zero */
  if (g->n > 0) {
    dt_placement_t fpl[DT_MAX_MESH_DIMS];
    placements(g, dt_shard(0), dt_replicate(), fpl);
    const int64_t flat_numel = (int64_t)g->N * g->seg;
    DT_CHECK_GOTO(dt_tensor_zeros(mesh, g->sdtype, 1, &flat_numel, fpl, &g->flat), st, fail);
    DT_CHECK_GOTO(dt_tensor_set_memory_category(g->flat, DT_MEM_PARAMETERS), st, fail);
  }
  int made = 0;
  for (; made < g->n; made++) {
    fsdp_param_t* q = &g->p[made];
    dt_tensor_t s = NULL, f = NULL;
    dt_var_t sv = NULL, fv = NULL;
    dt_placement_t spl[DT_MAX_MESH_DIMS];
    shard_placements(g, q, spl);
    st = dt_tensor_view_local(g->flat, q->seg_off, q->ndim, q->shape, spl, &s);
    int src_meta = 0; /* a parameter built without data (deferred init): its shard stays zero
                       * until the caller initializes it in place */
    if (st == DT_SUCCESS) st = dt_tensor_is_meta(dt_var_value(q->sharded), &src_meta);
    if (st == DT_SUCCESS && !src_meta)
      st = dt_tensor_redistribute_into(dt_var_value(q->sharded), s);
    if (st == DT_SUCCESS) st = dt_var_leaf(s, q->requires_grad, &sv);
    if (st != DT_SUCCESS) dt_tensor_destroy(s);
    if (st == DT_SUCCESS) st = dt_tensor_meta(mesh, c.param_dtype, q->ndim, q->shape, q->pl, &f);
    if (st == DT_SUCCESS) {
      st = dt_var_leaf(f, q->requires_grad, &fv);
      if (st != DT_SUCCESS) dt_tensor_destroy(f);
    }
    if (st == DT_SUCCESS) st = dt_var_set_grad_mode(fv, DT_GRAD_AS_IS);
    if (st != DT_SUCCESS) {
      dt_var_destroy(sv);
      dt_var_destroy(fv);
      break;
    }
    q->full = fv;
    q->sharded = sv; /* the replicated original is looked up again by name below */
    q->view = s;
  }
  if (st == DT_SUCCESS) st = dt_module_attach(m, FSDP_KEY, g, group_free_fn);
  if (st == DT_SUCCESS) st = dt_module_add_forward_pre_hook(m, pre_forward, g);
  if (st == DT_SUCCESS) st = dt_module_add_forward_post_hook(m, post_forward, g);
  if (st == DT_SUCCESS) st = dt_module_add_backward_pre_hook(m, pre_backward, g);
  if (st == DT_SUCCESS) st = dt_module_add_backward_post_hook(m, post_backward, g);
  if (st != DT_SUCCESS) {
    dt_module_remove_hooks(m, g);
    if (dt_module_attachment(m, FSDP_KEY) == g) dt_module_detach(m, FSDP_KEY);
    for (int i = 0; i < made; i++) {
      dt_var_destroy(g->p[i].sharded);
      dt_var_destroy(g->p[i].full);
    }
    g->n = 0;
    goto fail;
  }
  /* commit: the module takes the sharded parameters (the replicated ones are destroyed); a tied
   * one is replaced for every holder (all below m), and so is each gathered swap later. A new
   * parameter (held by nothing yet) takes over its predecessor's holder record: this cannot
   * fail. */
  for (int i = 0; i < g->n; i++) dt_module_set_param(m, g->p[i].name, g->p[i].sharded);
  g->next = g_fsdp.groups;
  g_fsdp.groups = g;
  return DT_SUCCESS;
fail:
  group_discard(g);
  return st;
}

dt_status_t dt_fully_shard(dt_module_t m, dt_mesh_t mesh, const dt_fsdp_config_t* cfg) {
  DT_ENTRY_RETURN(fully_shard(m, mesh, cfg));
}

static fsdp_group_t* group_of(dt_module_t m) { return dt_module_attachment(m, FSDP_KEY); }

int dt_fsdp_is_group(dt_module_t m) { return group_of(m) != NULL; }

static int below(dt_module_t x, dt_module_t m) {
  for (; x; x = dt_module_parent(x))
    if (x == m) return 1;
  return 0;
}

static dt_status_t dt__fsdp_set_requires_gradient_sync(dt_module_t m, int sync) {
  DT_ARG_NOT_NULL(m);
  int np;
  DT_CHECK(dt_module_num_params(m, &np)); /* checks the handle */
  int found = 0;
  for (fsdp_group_t* g = g_fsdp.groups; g; g = g->next)
    if (below(g->module, m)) {
      g->sync = sync != 0;
      found = 1;
    }
  if (!found)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no FSDP group at or below it",
                   dt_module_name(m));
  return DT_SUCCESS;
}

dt_status_t dt_fsdp_set_requires_gradient_sync(dt_module_t m, int sync) {
  DT_ENTRY_RETURN(dt__fsdp_set_requires_gradient_sync(m, sync));
}

static dt_status_t dt__fsdp_set_prefetch(dt_module_t m, int forward, int backward) {
  DT_ARG_NOT_NULL(m);
  int np;
  DT_CHECK(dt_module_num_params(m, &np)); /* checks the handle */
  fsdp_group_t* g = group_of(m);
  if (g == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "m ('%s') is not an FSDP group (valid: a module given to "
                   "dt_fully_shard)", dt_module_name(m));
  if (forward >= 0) g->prefetch_fwd = forward != 0;
  if (backward >= 0) g->prefetch_bwd = backward != 0;
  return DT_SUCCESS;
}

dt_status_t dt_fsdp_set_prefetch(dt_module_t m, int forward, int backward) {
  DT_ENTRY_RETURN(dt__fsdp_set_prefetch(m, forward, backward));
}

static dt_status_t dt__fsdp_group_info(dt_module_t m, dt_fsdp_group_info_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  DT_ARG_NOT_NULL(m);
  int np;
  DT_CHECK(dt_module_num_params(m, &np)); /* checks the handle */
  fsdp_group_t* g = group_of(m);
  if (g == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "m ('%s') is not an FSDP group (valid: a module given to "
                   "dt_fully_shard)", dt_module_name(m));
  out->n_params = g->n;
  out->numel = g->total;
  out->padded_numel = (int64_t)g->N * g->seg;
  out->shard_numel = g->seg;
  out->unsharded_nbytes = g->total_pad * (int64_t)g->pes;
  out->shard_size = g->N;
  out->replicate_size = g->R;
  out->reshard_size = g->k;
  out->gathers = g->gathers;
  out->prefetched = g->prefetched;
  out->reductions = g->reductions;
  return DT_SUCCESS;
}

dt_status_t dt_fsdp_group_info(dt_module_t m, dt_fsdp_group_info_t* out) {
  DT_ENTRY_RETURN(dt__fsdp_group_info(m, out));
}

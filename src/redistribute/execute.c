/* execute.c - runs a redistribution plan on this rank's local shard, to completion (blocking) or
 * as asynchronous work advanced by wait, test and progress calls.
 *
 * Each step is described by boxes: the source layout gives every rank of the step's group the box
 * it holds before, the target layout the box it holds after. The collective's per-peer blocks are
 * box intersections (dt__peer_box). When a block is already one contiguous range of the source
 * (or destination) buffer the collective reads (or writes) it in place; otherwise it is packed
 * into (or unpacked from) scratch. Uneven shards use the v-forms of the collectives with exact
 * counts, so there is no padding. Packing, copies, scaling and local reductions go through the
 * backend of the data.
 *
 * A step is a small state machine (dt__advance): each phase does its local work and posts at most
 * one collective. Blocking execution posts blocking collectives and runs every phase at once,
 * with the backend's persistent workspace as scratch (no allocation once it has grown); an
 * asynchronous work posts non-blocking collectives on its mesh's dedicated communicators, owns
 * its scratch and moves to the next phase when the posted collective has completed.
 *
 * Reductions (P -> S reduce-scatter, P -> R all-reduce) have two algorithms, which the cost model
 * chooses between per step: the native collective, or an all-to-all of the blocks followed by a
 * local reduction through the backend (then, for P -> R, an in-place all-gather of the reduced
 * chunks). Open MPI's reductions allocate per call and are slow on large buffers here; the
 * all-to-all form moves the same bytes at all-to-all speed.
 */
#include "redistribute/redistribute.h"

/* ---------------------------------------------------------------------------------------------
 * scratch: the backend's persistent workspace (blocking) or buffers owned by one work */

static dt_status_t dt__buf(dt__scratch_t* s, int slot, size_t nbytes, void** out) {
  if (!s->owned) return dt__ws_reserve(s->b, slot, nbytes, out);
  if (nbytes > s->cap[slot]) {
    void* p = dt__backend_alloc(s->b, nbytes);
    if (p == NULL)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s backend: %zu bytes of redistribution scratch",
                     s->b->name, nbytes);
    dt__backend_free(s->b, s->buf[slot], s->cap[slot]);
    dt__mem_count(DT_MEM_COMMUNICATION, (int64_t)nbytes - (int64_t)s->cap[slot]);
    s->buf[slot] = p;
    s->cap[slot] = nbytes;
  }
  *out = s->buf[slot];
  return DT_SUCCESS;
}

static dt_status_t dt__counts(dt__scratch_t* s, size_t n, int64_t** out) {
  if (!s->owned) return dt__ws_counts(n, out);
  if (n > s->cnt_cap) {
    int64_t* p = (int64_t*)dt__realloc(s->cnt, sizeof(int64_t) * n);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "redistribution count arrays");
    s->cnt = p;
    s->cnt_cap = n;
  }
  *out = s->cnt;
  return DT_SUCCESS;
}

void dt__scratch_free(dt__scratch_t* s) {
  if (!s->owned) return;
  for (int k = 0; k < DT_WS_SLOTS; k++) {
    dt__backend_free(s->b, s->buf[k], s->cap[k]);
    dt__mem_count(DT_MEM_COMMUNICATION, -(int64_t)s->cap[k]);
  }
  dt__free(s->cnt);
  memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------------------------------------
 * geometry of one step */

/* Coordinates of group rank q: mine, with the masked dims replaced (row-major, ascending dims). */
static void dt__group_coords(const dt__run_t* r, int q, int* c) {
  memcpy(c, r->m->coords, sizeof(int) * DT_MAX_MESH_DIMS);
  for (int i = r->m->ndim - 1; i >= 0; i--)
    if (r->s->mask & (1u << i)) {
      c[i] = q % r->m->shape[i];
      q /= r->m->shape[i];
    }
}

/* The box group rank q holds in layout l (r->lb before the step, r->la after). */
static void dt__peer_box(const dt__run_t* r, const dt_layout_t* l, int q, int64_t* off,
                         int64_t* len) {
  int cq[DT_MAX_MESH_DIMS];
  dt__group_coords(r, q, cq);
  dt__layout_box(l, cq, off, len);
}

/* What I hold before that q holds after (send = 1), or what q holds before that I hold after
 * (send = 0): its offset relative to my buffer (before box when sending, after box otherwise)
 * and its extent. */
static void dt__block(const dt__run_t* r, int q, int send, int64_t* rel, int64_t* len) {
  int nd = r->lb.ndim;
  int64_t bo[DT_MAX_DIMS], bl[DT_MAX_DIMS], off[DT_MAX_DIMS];
  if (send) {
    dt__peer_box(r, &r->la, q, bo, bl);
    dt__box_intersect(nd, r->ib_off, r->ib_len, bo, bl, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - r->ib_off[d];
  } else {
    dt__peer_box(r, &r->lb, q, bo, bl);
    dt__box_intersect(nd, bo, bl, r->ob_off, r->ob_len, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - r->ob_off[d];
  }
}

/* One box copy between arrays of the step's dtype, through the backend. */
static dt_status_t dt__bcopy(const dt__run_t* r, const int64_t* ext, void* dst,
                             const int64_t* dst_shape, const int64_t* dst_off, const void* src,
                             const int64_t* src_shape, const int64_t* src_off) {
  return r->b->iface->box_copy(r->b, r->lb.ndim, r->item, ext, dst, dst_shape, dst_off, src,
                               src_shape, src_off);
}

static const int64_t dt__zero[DT_MAX_DIMS] = {0};

/* When the blocks of the exchange in rank order (send: cut from my input box; else: placed in my
 * output box), mine left out with `skip`, are each a range along one dim of that box and whole
 * along the others, fills *dim and the ranges (offs, lens: gn entries, 0 for empty or skipped
 * blocks) and returns 1: then one split copy packs or unpacks them all in a single pass. */
static int dt__blocks_along(const dt__run_t* r, int send, int skip, int* dim, int64_t* offs,
                            int64_t* lens) {
  int nd = r->lb.ndim, j = -1;
  const int64_t* full = send ? r->ib_len : r->ob_len;
  for (int q = 0; q < r->gn; q++) { /* the dim the blocks are cut along */
    int64_t rel[DT_MAX_DIMS], len[DT_MAX_DIMS];
    if (skip && q == r->me) continue;
    dt__block(r, q, send, rel, len);
    if (dt__box_numel(nd, len) == 0) continue;
    for (int d = 0; d < nd; d++)
      if (len[d] != full[d]) {
        if (j >= 0 && j != d) return 0;
        j = d;
      }
  }
  if (nd == 0) return 0;
  if (j < 0) j = 0; /* every block whole */
  for (int q = 0; q < r->gn; q++) {
    int64_t rel[DT_MAX_DIMS], len[DT_MAX_DIMS];
    offs[q] = lens[q] = 0;
    if (skip && q == r->me) continue;
    dt__block(r, q, send, rel, len);
    if (dt__box_numel(nd, len) == 0) continue;
    offs[q] = rel[j];
    lens[q] = len[j];
  }
  *dim = j;
  return 1;
}

/* Packs my blocks for every peer back to back in rank order into slot 0 (each block its box's
 * elements row-major); counts[q] gets their sizes. `skip` leaves my own block out. The caller's
 * count arrays live in the run's count scratch below 6 gn. */
static dt_status_t dt__pack(dt__run_t* r, const int64_t* counts, int64_t total, int skip,
                            void** out) {
  DT_CHECK(dt__buf(r->sc, 0, (size_t)total * r->item, out));
  int64_t* a;
  int dim;
  DT_CHECK(dt__counts(r->sc, (size_t)r->gn * 8, &a));
  if (dt__blocks_along(r, 1, skip, &dim, a + 6 * r->gn, a + 7 * r->gn))
    return r->b->iface->split_copy(r->b, r->lb.ndim, r->item, r->ib_len, dim, r->gn,
                                   a + 6 * r->gn, a + 7 * r->gn, (void*)r->in, *out, 1);
  int64_t pos = 0;
  for (int q = 0; q < r->gn; q++) {
    if (skip && q == r->me) continue;
    int64_t rel[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__block(r, q, 1, rel, len);
    DT_CHECK(dt__bcopy(r, len, (char*)*out + (size_t)pos * r->item, len, dt__zero, r->in,
                       r->ib_len, rel));
    pos += counts[q];
  }
  return DT_SUCCESS;
}

/* The comm request of the next post: the run's own (async) or none (blocking). */
static dt_comm_req_t* dt__req(dt__run_t* r) {
  r->pending = r->async;
  return r->req;
}

/* ---------------------------------------------------------------------------------------------
 * the steps */

/* R -> S (slice) and R -> P (partition; sum: floats / n, integers on coordinate 0 only). */
static dt_status_t dt__local(dt__run_t* r) {
  int nd = r->lb.ndim;
  int64_t rel[DT_MAX_DIMS];
  for (int d = 0; d < nd; d++) rel[d] = r->ob_off[d] - r->ib_off[d];
  DT_CHECK(dt__bcopy(r, r->ob_len, r->out, r->ob_len, dt__zero, r->in, r->ib_len, rel));
  const dt_step_t* s = r->s;
  int64_t numel = dt__box_numel(nd, r->ob_len);
  for (int i = 0; i < r->m->ndim; i++) {
    if (!(s->mask & (1u << i)) || s->after[i].kind != DT_PARTIAL) continue;
    if (s->before[i].kind != DT_REPLICATE || s->after[i].op != DT_REDUCE_SUM) continue;
    if (dt__dtype_is_float(r->dtype))
      DT_CHECK(r->b->iface->scale_div(r->b, r->out, r->dtype, numel, r->m->shape[i]));
    else if (r->m->coords[i] != 0)
      DT_CHECK(r->b->iface->memset(r->b, r->out, 0, (size_t)numel * r->item));
  }
  r->phase = -1;
  return DT_SUCCESS;
}

/* Unpacks the blocks received back to back in rank order into r->tmp (mine included unless
 * `skip`) into my output box: one split copy when they are ranges along one dim of it, else one
 * box copy each. */
static dt_status_t dt__unpack(dt__run_t* r, int skip) {
  int64_t* a;
  int dim;
  DT_CHECK(dt__counts(r->sc, (size_t)r->gn * 2, &a));
  if (dt__blocks_along(r, 0, skip, &dim, a, a + r->gn))
    return r->b->iface->split_copy(r->b, r->lb.ndim, r->item, r->ob_len, dim, r->gn, a,
                                   a + r->gn, r->out, r->tmp, 0);
  int64_t pos = 0;
  for (int q = 0; q < r->gn; q++) {
    if (skip && q == r->me) continue;
    int64_t rel[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__block(r, q, 0, rel, len);
    DT_CHECK(dt__bcopy(r, len, r->out, r->ob_len, rel, (char*)r->tmp + (size_t)pos * r->item,
                       len, dt__zero));
    pos += dt__box_numel(r->lb.ndim, len);
  }
  return DT_SUCCESS;
}

/* Copies my own block from my input box to its place in my output box. */
static dt_status_t dt__own_block(dt__run_t* r) {
  int64_t irel[DT_MAX_DIMS], orel[DT_MAX_DIMS], len[DT_MAX_DIMS];
  dt__block(r, r->me, 1, irel, len);
  dt__block(r, r->me, 0, orel, len);
  return dt__bcopy(r, len, r->out, r->ob_len, orel, r->in, r->ib_len, irel);
}

/* Posts the exchange (send counts sc, displacements sd) with every remote block received
 * straight into its box of my output, when the comm places boxes (all_to_all_box: no scratch,
 * no unpack pass); else sets *placed to 0 and posts nothing. My own block is not touched.
 * `a`: room for 2 gn ndim counts. */
static dt_status_t dt__post_boxes(dt__run_t* r, const void* send, const int64_t* sc,
                                  const int64_t* sd, int64_t* a, int* placed) {
  int nd = r->lb.ndim;
  *placed = 0;
  if (r->c->iface->all_to_all_box == NULL) return DT_SUCCESS;
  int64_t *offs = a, *lens = a + (size_t)r->gn * nd;
  for (int q = 0; q < r->gn; q++) {
    dt__block(r, q, 0, offs + q * nd, lens + q * nd);
    if (q == r->me)
      for (int d = 0; d < nd; d++) lens[q * nd + d] = 0;
  }
  return r->c->iface->all_to_all_box(r->c, send, sc, sd, r->out, nd, r->ob_len, offs, lens,
                                     r->dtype, dt__req(r), placed);
}

/* S -> R. Phase 0 posts one all-gather: straight into the output when every peer's block is one
 * contiguous range of it; else, when the comm places boxes, every remote block straight into its
 * box of the output (my own by one box copy); else back to back into scratch, which phase 1
 * unpacks (the raw all-gather plus one pass over the output). */
static dt_status_t dt__all_gather(dt__run_t* r) {
  int gn = r->gn;
  if (r->phase == 0) {
    int64_t* a;
    DT_CHECK(dt__counts(r->sc, (size_t)gn * (8 + 2 * DT_MAX_DIMS), &a));
    int64_t *counts = a, *displs = a + gn, total = 0;
    int direct = 1;
    for (int q = 0; q < gn; q++) {
      int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], rel[DT_MAX_DIMS], start;
      dt__peer_box(r, &r->lb, q, off, len);
      for (int d = 0; d < r->lb.ndim; d++) rel[d] = off[d] - r->ob_off[d];
      counts[q] = dt__box_numel(r->lb.ndim, len);
      if (direct && dt__box_contiguous(r->lb.ndim, r->ob_len, rel, len, &start)) displs[q] = start;
      else direct = 0;
      total += counts[q];
    }
    r->nbytes = (uint64_t)total * r->item;
    void* recv = r->out;
    if (!direct) {
      int64_t *sc = a + 2 * gn, *sd = a + 3 * gn;
      int placed;
      for (int q = 0; q < gn; q++) {
        sc[q] = q == r->me ? 0 : counts[r->me];
        sd[q] = 0;
      }
      DT_CHECK(dt__post_boxes(r, r->in, sc, sd, a + 8 * gn, &placed));
      if (placed) {
        r->phase = -1;
        return dt__own_block(r);
      }
      for (int64_t q = 0, pos = 0; q < gn; q++) {
        displs[q] = pos;
        pos += counts[q];
      }
      DT_CHECK(dt__buf(r->sc, 3, (size_t)total * r->item, &r->tmp));
      recv = r->tmp;
    }
    r->phase = direct ? -1 : 1;
    return r->c->iface->all_gather_v(r->c, r->in, recv, counts, displs, r->dtype, dt__req(r));
  }
  r->phase = -1; /* phase 1 */
  return dt__unpack(r, 0);
}

/* S(a) -> S(b). My own block moves by one box copy; only remote blocks go through the exchange
 * (packed in one pass when they are strided in my input; when strided in my output, received
 * straight into their boxes when the comm places boxes, else unpacked in one pass). Measured
 * faster here than a uniform MPI_Alltoall of all blocks, which copies the own block through MPI
 * as well (docs/performance.md). */
static dt_status_t dt__all_to_all(dt__run_t* r) {
  int gn = r->gn, me = r->me, nd = r->lb.ndim;
  if (r->phase == 0) {
    int64_t* a;
    DT_CHECK(dt__counts(r->sc, (size_t)gn * (8 + 2 * DT_MAX_DIMS), &a));
    int64_t *sc = a, *sd = a + gn, *rc = a + 2 * gn, *rd = a + 3 * gn, stot = 0, rtot = 0;
    int sdirect = 1, rdirect = 1;
    for (int q = 0; q < gn; q++) {
      int64_t rel[DT_MAX_DIMS], len[DT_MAX_DIMS], start;
      dt__block(r, q, 1, rel, len);
      sc[q] = dt__box_numel(nd, len);
      if (sdirect && dt__box_contiguous(nd, r->ib_len, rel, len, &start)) sd[q] = start;
      else sdirect = 0;
      stot += sc[q];
      dt__block(r, q, 0, rel, len);
      rc[q] = dt__box_numel(nd, len);
      if (rdirect && dt__box_contiguous(nd, r->ob_len, rel, len, &start)) rd[q] = start;
      else rdirect = 0;
      rtot += rc[q];
    }
    r->nbytes = (uint64_t)stot * r->item;
    const void* send = r->in;
    void* recv = r->out;
    if (!sdirect || !rdirect) {
      DT_CHECK(dt__own_block(r));
      stot -= sc[me];
      rtot -= rc[me];
      sc[me] = rc[me] = 0;
    }
    if (!sdirect) {
      void* packed;
      DT_CHECK(dt__pack(r, sc, stot, 1, &packed));
      for (int64_t q = 0, pos = 0; q < gn; q++) {
        sd[q] = pos;
        pos += sc[q];
      }
      send = packed;
    }
    if (!rdirect) {
      int placed;
      DT_CHECK(dt__post_boxes(r, send, sc, sd, a + 8 * gn, &placed));
      if (placed) {
        r->phase = -1;
        return DT_SUCCESS;
      }
      DT_CHECK(dt__buf(r->sc, 3, (size_t)rtot * r->item, &recv));
      for (int64_t q = 0, pos = 0; q < gn; q++) {
        rd[q] = pos;
        pos += rc[q];
      }
      r->tmp = recv;
    }
    r->phase = rdirect ? -1 : 1;
    return r->c->iface->all_to_all_v(r->c, send, sc, sd, recv, rc, rd, r->dtype, dt__req(r));
  }
  /* phase 1: unpack the remote blocks from scratch */
  r->phase = -1;
  return dt__unpack(r, 1);
}

/* The reduce op of the Partial being reduced (same on every masked dim, see the merge pass). */
static dt_reduce_op_t dt__step_op(const dt__run_t* r) {
  for (int i = 0; i < r->m->ndim; i++)
    if ((r->s->mask & (1u << i)) && r->s->before[i].kind == DT_PARTIAL)
      return (dt_reduce_op_t)r->s->before[i].op;
  return DT_REDUCE_SUM;
}

/* avg: after the sum, every element is divided by the group size. */
static dt_status_t dt__avg(dt__run_t* r, void* buf, int64_t n) {
  if (dt__step_op(r) != DT_REDUCE_AVG || n == 0) return DT_SUCCESS;
  return r->b->iface->scale_div(r->b, buf, r->dtype, n, r->gn);
}

/* out (r->my elements) = my block `mine` op the gn - 1 received blocks in r->tmp, in rank order
 * (the first step reads my block, the rest accumulate in place: one pass per peer, no copy). */
static dt_status_t dt__reduce_blocks(dt__run_t* r, void* out, const void* mine, dt_reduce_op_t op) {
  size_t nb = (size_t)r->my * r->item;
  if (r->my == 0) return DT_SUCCESS;
  if (r->gn == 1) return r->b->iface->copy(r->b, out, mine, nb, DT_COPY_D2D);
  for (int q = 0; q < r->gn - 1; q++)
    DT_CHECK(r->b->iface->reduce(r->b, out, q == 0 ? mine : out, (const char*)r->tmp + q * nb,
                                 r->dtype, r->my, op));
  return DT_SUCCESS;
}

/* P -> S(d). The blocks each peer ends up with: sizes in counts[], and whether they are my
 * input's consecutive ranges in rank order (then no packing). */
static void dt__rs_counts(dt__run_t* r, int64_t* counts, int64_t* total, int* direct,
                          int64_t* start_me) {
  int nd = r->lb.ndim;
  *direct = 1;
  *total = 0;
  for (int q = 0; q < r->gn; q++) {
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], rel[DT_MAX_DIMS], start;
    dt__peer_box(r, &r->la, q, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - r->ib_off[d];
    counts[q] = dt__box_numel(nd, len);
    if (!(dt__box_contiguous(nd, r->ib_len, rel, len, &start) &&
          (start == *total || counts[q] == 0)))
      *direct = 0;
    if (q == r->me) *start_me = *total;
    *total += counts[q];
  }
}

static dt_status_t dt__reduce_scatter(dt__run_t* r) {
  int gn = r->gn, me = r->me;
  dt_reduce_op_t op = dt__step_op(r), cop = op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op;
  if (r->phase == 0) {
    int64_t* a;
    DT_CHECK(dt__counts(r->sc, (size_t)gn * 8, &a));
    int64_t *counts = a, total, start_me = 0;
    int direct;
    dt__rs_counts(r, counts, &total, &direct, &start_me);
    r->nbytes = (uint64_t)total * r->item;
    const void* send = r->in;
    if (!direct) DT_CHECK(dt__pack(r, counts, total, 0, (void**)&send));
    r->send = send;
    r->start_me = start_me;
    if (r->s->algo != DT_ALGO_A2A) {
      r->phase = 2;
      return r->c->iface->reduce_scatter_v(r->c, send, r->out, counts, r->dtype, cop, dt__req(r));
    }
    /* all-to-all: block q to peer q; the blocks of my part from every peer into scratch */
    int64_t *sc = a + gn, *sd = a + 2 * gn, *rc = a + 3 * gn, *rd = a + 4 * gn, pos = 0;
    for (int q = 0; q < gn; q++) {
      sd[q] = pos;
      sc[q] = q == me ? 0 : counts[q];
      pos += counts[q];
      rc[q] = q == me ? 0 : counts[me];
      rd[q] = (int64_t)(q < me ? q : q - 1) * counts[me];
    }
    DT_CHECK(dt__buf(r->sc, 3, (size_t)((gn - 1) * counts[me]) * r->item, &r->tmp));
    r->my = counts[me];
    r->phase = 1;
    return r->c->iface->all_to_all_v(r->c, send, sc, sd, r->tmp, rc, rd, r->dtype, dt__req(r));
  }
  if (r->phase == 1) { /* my block, then every peer's, reduced in rank order */
    r->phase = -1;
    DT_CHECK(dt__reduce_blocks(r, r->out, (const char*)r->send + (size_t)r->start_me * r->item,
                               cop));
    return dt__avg(r, r->out, r->my);
  }
  /* phase 2: after the native reduce-scatter */
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  dt__peer_box(r, &r->la, me, off, len);
  r->phase = -1;
  return dt__avg(r, r->out, dt__box_numel(r->lb.ndim, len));
}

/* P -> R. Native: one all-reduce. All-to-all: the buffer in gn near-equal chunks (the chunk
 * rule on its flat index), chunk q reduced by rank q from every peer's copy, then an in-place
 * all-gather of the reduced chunks. */
static dt_status_t dt__all_reduce(dt__run_t* r) {
  int gn = r->gn, me = r->me;
  dt_reduce_op_t op = dt__step_op(r), cop = op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op;
  int64_t numel = dt__box_numel(r->lb.ndim, r->ib_len);
  if (r->phase == 0) {
    r->nbytes = (uint64_t)numel * r->item;
    if (r->s->algo != DT_ALGO_A2A) {
      r->phase = 3;
      return r->c->iface->all_reduce(r->c, r->in, r->out, numel, r->dtype, cop, dt__req(r));
    }
    int64_t* a;
    DT_CHECK(dt__counts(r->sc, (size_t)gn * 6, &a));
    int64_t *sc = a, *sd = a + gn, *rc = a + 2 * gn, *rd = a + 3 * gn;
    for (int q = 0; q < gn; q++) dt_chunk(numel, gn, q, &sd[q], &sc[q]);
    r->start_me = sd[me];
    r->my = sc[me];
    for (int q = 0; q < gn; q++) {
      rc[q] = q == me ? 0 : r->my;
      rd[q] = (int64_t)(q < me ? q : q - 1) * r->my;
    }
    sc[me] = 0;
    DT_CHECK(dt__buf(r->sc, 3, (size_t)((gn - 1) * r->my) * r->item, &r->tmp));
    r->phase = 1;
    return r->c->iface->all_to_all_v(r->c, r->in, sc, sd, r->tmp, rc, rd, r->dtype, dt__req(r));
  }
  if (r->phase == 1) { /* reduce my chunk into its place in the output, then gather the chunks */
    char* mine = (char*)r->out + (size_t)r->start_me * r->item;
    DT_CHECK(dt__reduce_blocks(r, mine, (const char*)r->in + (size_t)r->start_me * r->item, cop));
    DT_CHECK(dt__avg(r, mine, r->my));
    int64_t* a;
    DT_CHECK(dt__counts(r->sc, (size_t)gn * 2, &a));
    for (int q = 0; q < gn; q++) dt_chunk(numel, gn, q, &a[gn + q], &a[q]);
    r->phase = -1;
    return r->c->iface->all_gather_v(r->c, NULL, r->out, a, a + gn, r->dtype, dt__req(r));
  }
  /* phase 3: after the native all-reduce */
  r->phase = -1;
  return dt__avg(r, r->out, numel);
}

/* ---------------------------------------------------------------------------------------------
 * driving a step */

dt_status_t dt__run_init(dt__run_t* r, dt_mesh_t m, dt_backend_t b, const struct dt_plan* p,
                         int k, const void* in, void* out, dt__scratch_t* sc, dt_comm_t* comm,
                         dt_comm_req_t* req) {
  memset(r, 0, sizeof *r);
  const dt_step_t* s = &p->steps[k];
  r->m = m;
  r->b = b;
  r->s = s;
  r->k = k;
  r->nsteps = p->nsteps;
  r->sc = sc;
  r->async = req != NULL;
  r->req = req;
  r->dtype = p->dtype;
  r->item = dt__itemsize(p->dtype);
  r->lb = p->src;
  r->la = p->src;
  memcpy(r->lb.pl, s->before, sizeof r->lb.pl);
  memcpy(r->la.pl, s->after, sizeof r->la.pl);
  dt__layout_box(&r->lb, m->coords, r->ib_off, r->ib_len);
  dt__layout_box(&r->la, m->coords, r->ob_off, r->ob_len);
  r->in = in;
  r->out = out;
  r->gn = 1;
  for (int i = 0; i < m->ndim; i++)
    if (s->mask & (1u << i)) r->gn *= m->shape[i];
  if (s->coll == DT_COLL_LOCAL) return DT_SUCCESS;
  r->c = comm;
  if (r->c == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no communicator for mesh dims 0x%x", s->mask);
  if (r->c->size != r->gn)
    return DT_FAIL(DT_ERR_INTERNAL, "communicator size %d != group size %d", r->c->size, r->gn);
  r->me = r->c->rank;
  return DT_SUCCESS;
}

void dt__run_what(const dt__run_t* r) {
  dt__comm_what_set(r->s->mask, r->k, r->nsteps, r->m->ndim, r->s->before, r->s->after);
}

dt_status_t dt__advance(dt__run_t* r) {
  while (r->phase >= 0 && !r->pending) {
    int first = r->phase == 0;
    dt_status_t st;
    switch (r->s->coll) {
      case DT_COLL_LOCAL: st = dt__local(r); break;
      case DT_COLL_ALL_GATHER: st = dt__all_gather(r); break;
      case DT_COLL_ALL_TO_ALL: st = dt__all_to_all(r); break;
      case DT_COLL_REDUCE_SCATTER: st = dt__reduce_scatter(r); break;
      case DT_COLL_ALL_REDUCE: st = dt__all_reduce(r); break;
      default: return DT_FAIL(DT_ERR_INTERNAL, "unexpected step kind %d", (int)r->s->coll);
    }
    if (st != DT_SUCCESS) {
      r->pending = 0;
      return st;
    }
    if (first && r->s->coll != DT_COLL_LOCAL) { /* one logical collective per step */
      dt__count_collective(r->m, r->s->mask, r->s->coll, r->nbytes);
      r->sim_done = dt__sim_collective(r->m, r->s->mask, r->s->coll, r->s->algo, r->gn, r->nbytes,
                                       r->async);
    } else if (first && dt__ctx_simulated()) { /* a local step: the shard read and written */
      double nb = (double)dt__box_numel(r->la.ndim, r->ob_len) * (double)r->item;
      dt__sim_compute(2.0 * nb / (dt__compute_model()->mem_gbps * 1e3));
    }
  }
  return DT_SUCCESS;
}

int dt__plan_communicates(const struct dt_plan* p) {
  for (int k = 0; k < p->nsteps; k++)
    if (p->steps[k].coll != DT_COLL_LOCAL) return 1;
  return 0;
}

size_t dt__plan_local_nbytes(const struct dt_plan* p, const dt_mesh_t m, int after) {
  dt_layout_t l = p->src;
  if (after && p->nsteps > 0) memcpy(l.pl, p->steps[p->nsteps - 1].after, sizeof l.pl);
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  dt__layout_box(&l, m->coords, off, len);
  return (size_t)dt__box_numel(l.ndim, len) * dt__itemsize(p->dtype);
}

dt_status_t dt__plan_execute(dt_mesh_t m, dt_backend_t b, const struct dt_plan* p,
                             const void* src, void* dst) {
  if (m->abstract)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "cannot move data on an abstract mesh (no ranks)");
  if (!m->member) return DT_SUCCESS;
  int nccl = 0; /* the mesh's NCCL plane carries b's memory as it is */
  if (dt__backend_is_device(b) && dt__plan_communicates(p))
    DT_CHECK(dt__mesh_data_plane(m, b, &nccl));
  if (dt__backend_is_device(b) && dt__plan_communicates(p) && !nccl) {
    /* the MPI comm carries host memory: run the plan on host copies of the shards (persistent
     * staging buffers of the backend), one copy out of the device and one back in */
    size_t in_nb = dt__plan_local_nbytes(p, m, 0), out_nb = dt__plan_local_nbytes(p, m, 1);
    void *hin, *hout;
    DT_CHECK(dt__stage_reserve(b, 0, in_nb, &hin));
    DT_CHECK(dt__stage_reserve(b, 1, out_nb, &hout));
    if (in_nb) DT_CHECK(b->iface->copy(b, hin, src, in_nb, DT_COPY_D2H));
    DT_CHECK(dt__plan_execute(m, &dt__backend_cpu, p, hin, hout));
    if (out_nb) DT_CHECK(b->iface->copy(b, dst, hout, out_nb, DT_COPY_H2D));
    return DT_SUCCESS;
  }
  size_t item = dt__itemsize(p->dtype);
  if (p->nsteps == 0) {
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__layout_box(&p->src, m->coords, off, len);
    size_t n = (size_t)dt__box_numel(p->src.ndim, len) * item;
    if (n && dst != src) DT_CHECK(b->iface->copy(b, dst, src, n, DT_COPY_D2D));
    return DT_SUCCESS;
  }
  dt__scratch_t sc;
  memset(&sc, 0, sizeof sc);
  sc.b = b;
  const void* cur = src;
  for (int k = 0; k < p->nsteps; k++) {
    void* out = dst;
    if (k + 1 < p->nsteps) {
      dt_layout_t la = p->src;
      memcpy(la.pl, p->steps[k].after, sizeof la.pl);
      int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
      dt__layout_box(&la, m->coords, off, len);
      DT_CHECK(dt__ws_reserve(b, 1 + (k & 1), (size_t)dt__box_numel(la.ndim, len) * item, &out));
    }
    dt__run_t r;
    DT_CHECK(dt__run_init(&r, m, b, p, k, cur, out, &sc,
                          dt__mesh_data_comm(m, b, p->steps[k].mask), NULL));
    dt__run_what(&r);
    dt_status_t st = dt__advance(&r);
    dt__comm_what_clear();
    if (st != DT_SUCCESS) return st;
    cur = out;
  }
  return DT_SUCCESS;
}

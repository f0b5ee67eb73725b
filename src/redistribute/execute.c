/* execute.c - runs a redistribution plan on this rank's local shard.
 *
 * Each step is described by boxes: the source layout gives every rank of the step's group the box
 * it holds before, the target layout the box it holds after. The collective's per-peer blocks are
 * box intersections. When a block is already one contiguous range of the source (or destination)
 * buffer the collective reads (or writes) it in place; otherwise it is packed into (or unpacked
 * from) a persistent workspace buffer. Uneven shards use the v-forms of the collectives with exact
 * counts, so there is no padding. No allocation happens here once the workspace has grown.
 */
#include <limits.h>

#include "redistribute/redistribute.h"

typedef struct dt__exec {
  dt_mesh_t m;
  dt_backend_t b; /* the data's backend: packing, copies and scaling go through it */
  dt_dtype_t dtype;
  size_t item;
  dt_layout_t lb, la;    /* layouts before and after the step */
  int64_t ib_off[DT_MAX_DIMS], ib_len[DT_MAX_DIMS]; /* my box before */
  int64_t ob_off[DT_MAX_DIMS], ob_len[DT_MAX_DIMS]; /* my box after */
  unsigned mask;
  int gn;
} dt__exec_t;

/* Coordinates of group rank q: mine, with the masked dims replaced (row-major, ascending dims). */
static void dt__group_coords(const dt__exec_t* x, int q, int* c) {
  memcpy(c, x->m->coords, sizeof(int) * DT_MAX_MESH_DIMS);
  for (int i = x->m->ndim - 1; i >= 0; i--)
    if (x->mask & (1u << i)) {
      c[i] = q % x->m->shape[i];
      q /= x->m->shape[i];
    }
}

static dt_status_t dt__to_int(int64_t v, int* out) {
  if (v > INT_MAX)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "a block of %lld elements exceeds MPI's int count",
                   (long long)v);
  *out = (int)v;
  return DT_SUCCESS;
}

/* One box copy between arrays of the step's dtype, through the backend. */
static dt_status_t dt__bcopy(const dt__exec_t* x, const int64_t* ext, void* dst,
                             const int64_t* dst_shape, const int64_t* dst_off, const void* src,
                             const int64_t* src_shape, const int64_t* src_off) {
  return x->b->iface->box_copy(x->b, x->lb.ndim, x->item, ext, dst, dst_shape, dst_off, src,
                               src_shape, src_off);
}

/* The reduce op of the Partial being reduced (same on every masked dim, see the merge pass). */
static dt_reduce_op_t dt__step_op(const dt_step_t* s, int mesh_ndim) {
  for (int i = 0; i < mesh_ndim; i++)
    if ((s->mask & (1u << i)) && s->before[i].kind == DT_PARTIAL)
      return (dt_reduce_op_t)s->before[i].op;
  return DT_REDUCE_SUM;
}

static dt_status_t dt__run_local(const dt__exec_t* x, const dt_step_t* s, const void* in,
                                 void* out) {
  int nd = x->lb.ndim;
  int64_t rel[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
  for (int d = 0; d < nd; d++) rel[d] = x->ob_off[d] - x->ib_off[d];
  DT_CHECK(dt__bcopy(x, x->ob_len, out, x->ob_len, zero, in, x->ib_len, rel));
  for (int i = 0; i < x->m->ndim; i++) {
    if (!(s->mask & (1u << i)) || s->after[i].kind != DT_PARTIAL) continue;
    if (s->before[i].kind != DT_REPLICATE || s->after[i].op != DT_REDUCE_SUM) continue;
    int n = x->m->shape[i];
    int64_t numel = dt__box_numel(nd, x->ob_len);
    if (dt__dtype_is_float(x->dtype)) {
      DT_CHECK(x->b->iface->scale_div(x->b, out, x->dtype, numel, n)); /* value / n each */
    } else if (x->m->coords[i] != 0) { /* exact for integers: coordinate 0 keeps it */
      DT_CHECK(x->b->iface->memset(x->b, out, 0, (size_t)numel * x->item));
    }
  }
  return DT_SUCCESS;
}

static dt_status_t dt__run_all_gather(const dt__exec_t* x, dt_comm_t* c, const void* in,
                                      void* out, uint64_t* nbytes) {
  int nd = x->lb.ndim, gn = x->gn, *ints, direct = 1;
  DT_CHECK(dt__ws_ints((size_t)gn * 2, &ints));
  int *counts = ints, *displs = ints + gn;
  int64_t total = 0;
  for (int q = 0; q < gn; q++) {
    int cq[DT_MAX_MESH_DIMS];
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], rel[DT_MAX_DIMS], start;
    dt__group_coords(x, q, cq);
    dt__layout_box(&x->lb, cq, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ob_off[d];
    DT_CHECK(dt__to_int(dt__box_numel(nd, len), &counts[q]));
    if (direct && dt__box_contiguous(nd, x->ob_len, rel, len, &start))
      DT_CHECK(dt__to_int(start, &displs[q]));
    else
      direct = 0;
    total += counts[q];
  }
  *nbytes = (uint64_t)total * x->item;
  if (direct) return c->iface->all_gather_v(c, in, out, counts, displs, x->dtype);
  /* Strided placement in the output: exchange only the remote blocks (every peer gets my whole
   * contiguous shard) into scratch, copy my own block straight from the input, then unpack the
   * remote blocks. One copy less than gathering everything into scratch and unpacking it all. */
  int me = c->rank;
  int *sc, *sd, *rc, *rd;
  DT_CHECK(dt__ws_ints((size_t)gn * 6, &ints)); /* counts/displs above are recomputed below */
  counts = ints;
  sc = ints + gn;
  sd = ints + 2 * gn;
  rc = ints + 3 * gn;
  rd = ints + 4 * gn;
  int64_t acc = 0;
  for (int q = 0; q < gn; q++) {
    int cq[DT_MAX_MESH_DIMS];
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__group_coords(x, q, cq);
    dt__layout_box(&x->lb, cq, off, len);
    DT_CHECK(dt__to_int(dt__box_numel(nd, len), &counts[q]));
    sc[q] = q == me ? 0 : counts[me];
    sd[q] = 0;
    rc[q] = q == me ? 0 : counts[q];
    DT_CHECK(dt__to_int(acc, &rd[q]));
    acc += rc[q];
  }
  void* tmp;
  DT_CHECK(dt__ws_reserve(x->b, 3, (size_t)acc * x->item, &tmp));
  DT_CHECK(c->iface->all_to_all_v(c, in, sc, sd, tmp, rc, rd, x->dtype));
  for (int q = 0; q < gn; q++) {
    int cq[DT_MAX_MESH_DIMS];
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], rel[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
    dt__group_coords(x, q, cq);
    dt__layout_box(&x->lb, cq, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ob_off[d];
    const void* from = q == me ? in : (const char*)tmp + (size_t)rd[q] * x->item;
    DT_CHECK(dt__bcopy(x, len, out, x->ob_len, rel, from, len, zero));
  }
  return DT_SUCCESS;
}

static dt_status_t dt__run_reduce_scatter(const dt__exec_t* x, const dt_step_t* s, dt_comm_t* c,
                                          const void* in, void* out, uint64_t* nbytes) {
  int nd = x->lb.ndim, gn = x->gn, *counts, direct = 1;
  DT_CHECK(dt__ws_ints((size_t)gn, &counts));
  int64_t acc = 0;
  for (int q = 0; q < gn; q++) {
    int cq[DT_MAX_MESH_DIMS];
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], rel[DT_MAX_DIMS], start;
    dt__group_coords(x, q, cq);
    dt__layout_box(&x->la, cq, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ib_off[d];
    DT_CHECK(dt__to_int(dt__box_numel(nd, len), &counts[q]));
    if (!(dt__box_contiguous(nd, x->ib_len, rel, len, &start) && (start == acc || counts[q] == 0)))
      direct = 0;
    acc += counts[q];
  }
  *nbytes = (uint64_t)acc * x->item;
  const void* send = in;
  if (!direct) {
    void* tmp;
    DT_CHECK(dt__ws_reserve(x->b, 0, (size_t)acc * x->item, &tmp));
    int64_t pos = 0;
    for (int q = 0; q < gn; q++) {
      int cq[DT_MAX_MESH_DIMS];
      int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS], rel[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
      dt__group_coords(x, q, cq);
      dt__layout_box(&x->la, cq, off, len);
      for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ib_off[d];
      DT_CHECK(dt__bcopy(x, len, (char*)tmp + (size_t)pos * x->item, len, zero, in, x->ib_len,
                   rel));
      pos += counts[q];
    }
    send = tmp;
  }
  dt_reduce_op_t op = dt__step_op(s, x->m->ndim);
  DT_CHECK(c->iface->reduce_scatter_v(c, send, out, counts,
                                      x->dtype, op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op));
  if (op == DT_REDUCE_AVG) DT_CHECK(x->b->iface->scale_div(x->b, out, x->dtype, counts[c->rank], gn));
  return DT_SUCCESS;
}

static dt_status_t dt__run_all_to_all(const dt__exec_t* x, dt_comm_t* c, const void* in,
                                      void* out, uint64_t* nbytes) {
  int nd = x->lb.ndim, gn = x->gn, *ints, sdirect = 1, rdirect = 1;
  DT_CHECK(dt__ws_ints((size_t)gn * 4, &ints));
  int *sc = ints, *sd = ints + gn, *rc = ints + 2 * gn, *rd = ints + 3 * gn;
  int64_t stot = 0, rtot = 0;
  for (int q = 0; q < gn; q++) {
    int cq[DT_MAX_MESH_DIMS];
    int64_t bo[DT_MAX_DIMS], bl[DT_MAX_DIMS], off[DT_MAX_DIMS], len[DT_MAX_DIMS],
        rel[DT_MAX_DIMS], start;
    dt__group_coords(x, q, cq);
    /* send: what I hold now that q holds after */
    dt__layout_box(&x->la, cq, bo, bl);
    dt__box_intersect(nd, x->ib_off, x->ib_len, bo, bl, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ib_off[d];
    DT_CHECK(dt__to_int(dt__box_numel(nd, len), &sc[q]));
    if (sdirect && dt__box_contiguous(nd, x->ib_len, rel, len, &start))
      DT_CHECK(dt__to_int(start, &sd[q]));
    else
      sdirect = 0;
    stot += sc[q];
    /* receive: what q holds now that I hold after */
    dt__layout_box(&x->lb, cq, bo, bl);
    dt__box_intersect(nd, bo, bl, x->ob_off, x->ob_len, off, len);
    for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ob_off[d];
    DT_CHECK(dt__to_int(dt__box_numel(nd, len), &rc[q]));
    if (rdirect && dt__box_contiguous(nd, x->ob_len, rel, len, &start))
      DT_CHECK(dt__to_int(start, &rd[q]));
    else
      rdirect = 0;
    rtot += rc[q];
  }
  *nbytes = (uint64_t)stot * x->item;
  const void* send = in;
  void* recv = out;
  int me = c->rank;
  if (!sdirect || !rdirect) {
    /* My own block moves by one box copy; only remote blocks go through scratch and MPI. */
    int cq[DT_MAX_MESH_DIMS];
    int64_t bo[DT_MAX_DIMS], bl[DT_MAX_DIMS], off[DT_MAX_DIMS], len[DT_MAX_DIMS],
        irel[DT_MAX_DIMS], orel[DT_MAX_DIMS];
    dt__group_coords(x, me, cq);
    dt__layout_box(&x->la, cq, bo, bl);
    dt__box_intersect(nd, x->ib_off, x->ib_len, bo, bl, off, len);
    for (int d = 0; d < nd; d++) {
      irel[d] = off[d] - x->ib_off[d];
      orel[d] = off[d] - x->ob_off[d];
    }
    DT_CHECK(dt__bcopy(x, len, out, x->ob_len, orel, in, x->ib_len, irel));
    stot -= sc[me];
    rtot -= rc[me];
    sc[me] = rc[me] = 0;
  }
  if (!sdirect) {
    void* tmp;
    DT_CHECK(dt__ws_reserve(x->b, 0, (size_t)stot * x->item, &tmp));
    int64_t pos = 0;
    for (int q = 0; q < gn; q++) {
      int cq[DT_MAX_MESH_DIMS];
      int64_t bo[DT_MAX_DIMS], bl[DT_MAX_DIMS], off[DT_MAX_DIMS], len[DT_MAX_DIMS],
          rel[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
      DT_CHECK(dt__to_int(pos, &sd[q]));
      if (q == me) continue;
      dt__group_coords(x, q, cq);
      dt__layout_box(&x->la, cq, bo, bl);
      dt__box_intersect(nd, x->ib_off, x->ib_len, bo, bl, off, len);
      for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ib_off[d];
      DT_CHECK(dt__bcopy(x, len, (char*)tmp + (size_t)pos * x->item, len, zero, in,
                   x->ib_len, rel));
      pos += sc[q];
    }
    send = tmp;
  }
  if (!rdirect) {
    DT_CHECK(dt__ws_reserve(x->b, 3, (size_t)rtot * x->item, &recv));
    int64_t pos = 0;
    for (int q = 0; q < gn; q++) {
      DT_CHECK(dt__to_int(pos, &rd[q]));
      pos += rc[q];
    }
  }
  DT_CHECK(c->iface->all_to_all_v(c, send, sc, sd, recv, rc, rd, x->dtype));
  if (!rdirect) {
    for (int q = 0; q < gn; q++) {
      if (q == me) continue;
      int cq[DT_MAX_MESH_DIMS];
      int64_t bo[DT_MAX_DIMS], bl[DT_MAX_DIMS], off[DT_MAX_DIMS], len[DT_MAX_DIMS],
          rel[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
      dt__group_coords(x, q, cq);
      dt__layout_box(&x->lb, cq, bo, bl);
      dt__box_intersect(nd, bo, bl, x->ob_off, x->ob_len, off, len);
      for (int d = 0; d < nd; d++) rel[d] = off[d] - x->ob_off[d];
      DT_CHECK(dt__bcopy(x, len, out, x->ob_len, rel,
                   (const char*)recv + (size_t)rd[q] * x->item, len, zero));
    }
  }
  return DT_SUCCESS;
}

static dt_status_t dt__run_step(dt_mesh_t m, dt_backend_t b, const struct dt_plan* p,
                                const dt_step_t* s, const void* in, void* out) {
  dt__exec_t x;
  x.m = m;
  x.b = b;
  x.dtype = p->dtype;
  x.item = dt__itemsize(p->dtype);
  x.lb = p->src;
  x.la = p->src;
  memcpy(x.lb.pl, s->before, sizeof x.lb.pl);
  memcpy(x.la.pl, s->after, sizeof x.la.pl);
  dt__layout_box(&x.lb, m->coords, x.ib_off, x.ib_len);
  dt__layout_box(&x.la, m->coords, x.ob_off, x.ob_len);
  x.mask = s->mask;
  x.gn = 1;
  for (int i = 0; i < m->ndim; i++)
    if (s->mask & (1u << i)) x.gn *= m->shape[i];
  if (s->coll == DT_COLL_LOCAL) return dt__run_local(&x, s, in, out);
  dt_comm_t* c = dt__mesh_group_comm(m, s->mask);
  if (c == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no communicator for mesh dims 0x%x", s->mask);
  if (c->size != x.gn)
    return DT_FAIL(DT_ERR_INTERNAL, "communicator size %d != group size %d", c->size, x.gn);
  uint64_t nbytes = 0;
  switch (s->coll) {
    case DT_COLL_ALL_GATHER: DT_CHECK(dt__run_all_gather(&x, c, in, out, &nbytes)); break;
    case DT_COLL_REDUCE_SCATTER:
      DT_CHECK(dt__run_reduce_scatter(&x, s, c, in, out, &nbytes));
      break;
    case DT_COLL_ALL_TO_ALL: DT_CHECK(dt__run_all_to_all(&x, c, in, out, &nbytes)); break;
    case DT_COLL_ALL_REDUCE: {
      int n = 0;
      int64_t numel = dt__box_numel(x.lb.ndim, x.ib_len);
      DT_CHECK(dt__to_int(numel, &n));
      dt_reduce_op_t op = dt__step_op(s, m->ndim);
      DT_CHECK(c->iface->all_reduce(c, in, out, n, x.dtype,
                                    op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op));
      if (op == DT_REDUCE_AVG) DT_CHECK(x.b->iface->scale_div(x.b, out, x.dtype, numel, x.gn));
      nbytes = (uint64_t)numel * x.item;
      break;
    }
    default: return DT_FAIL(DT_ERR_INTERNAL, "unexpected step kind %d", (int)s->coll);
  }
  dt__count_collective(m, s->mask, s->coll, nbytes);
  return DT_SUCCESS;
}

dt_status_t dt__plan_execute(dt_mesh_t m, dt_backend_t b, const struct dt_plan* p,
                             const void* src, void* dst) {
  if (m->abstract)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "cannot move data on an abstract mesh (no ranks)");
  if (!m->member) return DT_SUCCESS;
  size_t item = dt__itemsize(p->dtype);
  if (p->nsteps == 0) {
    int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
    dt__layout_box(&p->src, m->coords, off, len);
    size_t n = (size_t)dt__box_numel(p->src.ndim, len) * item;
    if (n && dst != src) DT_CHECK(b->iface->copy(b, dst, src, n, DT_COPY_D2D));
    return DT_SUCCESS;
  }
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
    DT_CHECK(dt__run_step(m, b, p, &p->steps[k], cur, out));
    cur = out;
  }
  return DT_SUCCESS;
}

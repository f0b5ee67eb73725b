/* tp_overlap.c - asynchronous tensor parallelism: the two linears of sequence parallelism with
 * their collective split into ring steps that overlap the GEMM (ops "all_gather_linear" and
 * "linear_reduce_scatter", dt_all_gather_linear, dt_linear_reduce_scatter; docs/design.md,
 * "Asynchronous tensor parallelism").
 *
 * all_gather_linear(x, w) = x w^T with x sharded on a row dim g (the sequence) over mesh dim d and
 * w Shard(0) there (colwise): the result Shard(-1). Unfused, x is all-gathered, then multiplied.
 * Here the n shards of x travel around the ring of d (rank r sends the shard it holds to r + 1
 * and receives the next from r - 1) and each step's GEMM computes the output rows of the shard it
 * holds while the next one moves. The gathered x is kept for the backward (as the unfused linear
 * keeps it), whose input gradient dx = RS(dy w) runs the reduce-scatter ring below.
 *
 * linear_reduce_scatter(x, w) = x w^T with x Shard(-1) and w Shard(1) on d (rowwise): the product
 * is a partial sum, reduce-scattered to Shard(g). Here the rows of chunk c (rank c's share) are
 * computed one chunk at a time: at step t rank r computes its partial of chunk c = r - 1 - t
 * into scratch while the running sum of that chunk arrives from r - 1, adds the two and sends
 * them on to r + 1; after n steps each rank holds the sum of its own chunk. The backward gathers
 * dy around the ring, computing dx's rows and dw's terms slot by slot as they arrive.
 *
 * Traffic per rank is that of the ring collectives ((n-1)/n of the gathered or scattered bytes),
 * counted under DT_COLL_SEND_RECV on mesh dim d; every step posts its pair before computing, as
 * one group (NCCL) or two non-blocking calls (MPI). Uneven shards (the chunk rule) are fine: each
 * step moves the shard it moves. f32 compute: bf16/f16 inputs are cast to f32 copies after their
 * moves and the results cast back, except what a gather ring moves (all_gather_linear's x, and
 * linear_reduce_scatter's dy backward): that travels in its dtype (half a f32 ring's bytes under
 * bf16), each slot converted to f32 where its GEMM runs (as ring attention's k and v), and the
 * gathered x is kept in its dtype; reduce-scatter rings move f32 partial sums. Host memory
 * computes in place; a device backend computes in its memory over the mesh's NCCL plane, or stages through host memory
 * where that plane is MPI; simulated runs count the traffic and price each step (GEMM against
 * transfer, the overlap of the ring).
 */
#include <math.h>
#include <string.h>

#include "mesh/mesh.h"
#include "ops/ops.h"
#include "redistribute/redistribute.h"

#define DT_TPO_MAX_RANKS 256

static const char* const kAgl = "all_gather_linear";
static const char* const kLrs = "linear_reduce_scatter";

/* One call: the arguments, the placements the inputs move to, and (after the moves) the local
 * geometry: x's rows are (P, S, R) with S along dim g, split over the d ring in chunks len[s]
 * starting at start[s] (S = the sum: the gathered extent). */
typedef struct {
  int gather; /* 1: all_gather_linear, 0: linear_reduce_scatter */
  const char* op;
  int d, g, nd;
  dt_placement_t xpl[DT_MAX_MESH_DIMS], wpl[DT_MAX_MESH_DIMS], ypl[DT_MAX_MESH_DIMS];
  dt_placement_t gwpl[DT_MAX_MESH_DIMS]; /* w's gradient */
  int64_t yshape[DT_MAX_DIMS];
  dt__ring_link_t l;
  dt_dtype_t rt; /* what the gather rings move (x forward, dy backward: the inputs' dtype) */
  int64_t P, R, S, K, N; /* K: x's local features, N: the output's local features */
  int64_t len[DT_TPO_MAX_RANKS], start[DT_TPO_MAX_RANKS];
} dt__tpo_t;

static dt_status_t dt__tpo_args(int gather, int n_iargs, const int64_t* iargs, dt_tensor_t x,
                                dt_tensor_t w, dt__tpo_t* a) {
  memset(a, 0, sizeof *a);
  a->gather = gather;
  a->op = gather ? kAgl : kLrs;
  const int id = gather ? DT_OP_ALL_GATHER_LINEAR : DT_OP_LINEAR_REDUCE_SCATTER;
  dt_mesh_t mesh = x->mesh;
  const int64_t d0 = dt__op_iarg_n(id, n_iargs, iargs, 0), g0 = dt__op_iarg_n(id, n_iargs, iargs, 1);
  const int64_t d = d0 < 0 ? d0 + mesh->ndim : d0;
  if (d0 == DT_OP_IARG_NONE || d < 0 || d >= mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: mesh_dim=%lld (iargs[0]) out of range for a %d-dim "
                   "mesh", a->op, (long long)d0, mesh->ndim);
  if (w->mesh != mesh) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: x and w on different meshes", a->op);
  const int nd = x->layout.ndim;
  if (nd < 2 || w->layout.ndim != 2 || w->layout.shape[1] != x->layout.shape[nd - 1])
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: x (..., K) of 2 or more dims and w (N, K) expected, "
                   "got x of %d dims (last %lld) and w of %d dims (last %lld)", a->op, nd,
                   nd > 0 ? (long long)x->layout.shape[nd - 1] : 0LL, w->layout.ndim,
                   w->layout.ndim > 0 ? (long long)w->layout.shape[w->layout.ndim - 1] : 0LL);
  const int64_t g = g0 < 0 ? g0 + nd : g0;
  if (g < 0 || g >= nd - 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s_dim=%lld (iargs[1]) must be a row dim of x's %d "
                   "dims (0 to %d, or negative)", a->op, gather ? "gather" : "scatter",
                   (long long)g0, nd, nd - 2);
  if (!dt__dtype_is_float(x->dtype) || x->dtype != w->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: x (%s) and w (%s) must share one float dtype", a->op,
                   dt_dtype_name(x->dtype), dt_dtype_name(w->dtype));
  if (mesh->shape[d] > DT_TPO_MAX_RANKS)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: mesh dim %lld has %d ranks, at most %d", a->op,
                   (long long)d, mesh->shape[d], DT_TPO_MAX_RANKS);
  a->d = (int)d;
  a->g = (int)g;
  a->nd = nd;
  memcpy(a->yshape, x->layout.shape, sizeof(int64_t) * (size_t)nd);
  a->yshape[nd - 1] = w->layout.shape[0];
  for (int e = 0; e < mesh->ndim; e++) {
    if (e == a->d) {
      a->xpl[e] = dt_shard(gather ? a->g : nd - 1);
      a->wpl[e] = dt_shard(gather ? 0 : 1);
      a->ypl[e] = dt_shard(gather ? nd - 1 : a->g);
      a->gwpl[e] = a->wpl[e];
      continue;
    }
    /* other dims: w whole; x keeps a shard of a row dim (of the sequence only where this dim's
     * shard nests in it: an earlier mesh dim), else it is replicated; there w's gradient is a
     * partial sum over x's shards */
    const dt_placement_t p = x->layout.pl[e];
    int keep = 0;
    if (p.kind == DT_SHARD) {
      const int j = p.dim < 0 ? p.dim + nd : p.dim;
      keep = j != nd - 1 && (j != a->g || e < a->d);
    }
    a->xpl[e] = keep ? dt_shard(p.dim < 0 ? p.dim + nd : p.dim) : dt_replicate();
    a->ypl[e] = a->xpl[e];
    a->wpl[e] = dt_replicate();
    a->gwpl[e] = keep ? dt_partial(DT_REDUCE_SUM) : dt_replicate();
  }
  return DT_SUCCESS;
}

/* The local geometry (x and w at the call's placements; the chunks: x's for all_gather_linear,
 * the output's for linear_reduce_scatter). */
static void dt__tpo_geom(dt__tpo_t* a, dt_mesh_t mesh, const int64_t* xshape,
                         const int64_t* wshape) {
  const int n = mesh->shape[a->d];
  dt_layout_t xl, wl, yl;
  dt__layout_try(&xl, mesh->ndim, mesh->shape, a->nd, xshape, a->xpl);
  dt__layout_try(&wl, mesh->ndim, mesh->shape, 2, wshape, a->wpl);
  dt__layout_try(&yl, mesh->ndim, mesh->shape, a->nd, a->yshape, a->ypl);
  const dt_layout_t* chunks = a->gather ? &xl : &yl;
  int coords[DT_MAX_MESH_DIMS];
  memcpy(coords, mesh->coords, sizeof coords);
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  a->S = 0;
  for (int s = 0; s < n; s++) {
    coords[a->d] = s;
    dt__layout_box(chunks, coords, off, len);
    a->len[s] = len[a->g];
    a->start[s] = a->S;
    a->S += len[a->g];
  }
  coords[a->d] = mesh->coords[a->d];
  dt__layout_box(&xl, coords, off, len);
  a->P = 1;
  a->R = 1;
  for (int i = 0; i < a->g; i++) a->P *= len[i];
  for (int i = a->g + 1; i < a->nd - 1; i++) a->R *= len[i];
  a->K = len[a->nd - 1];
  dt__layout_box(&wl, coords, off, len);
  a->N = len[0]; /* w's local rows: the output's local features */
}

/* A step's GEMM on the simulated clock. */
static void dt__tpo_sim(const dt__tpo_t* a, double flops) {
  if (!a->l.sim) return;
  const dt_compute_params_t* cm = dt__compute_model();
  dt__sim_clock_t* ck = dt__sim_clock();
  ck->flops += flops;
  ck->ops++;
  dt__sim_compute(cm->op_us + flops / (cm->gemm_gflops * 1e3));
}

/* C (batch P) = A B^T or A B: one GEMM per step, batched over the P blocks of rows. */
static dt_status_t dt__tpo_gemm(const dt__tpo_t* a, int trans_a, int trans_b, int64_t m, int64_t n,
                                int64_t k, float beta, const float* A, int64_t lda, int64_t sa,
                                const float* B, int64_t ldb, int64_t sb, float* C, int64_t ldc,
                                int64_t sc, int64_t batch) {
  dt__tpo_sim(a, 2.0 * (double)m * (double)n * (double)k * (double)batch);
  if (a->l.sim || m == 0 || n == 0 || batch == 0) return DT_SUCCESS;
  return dt__gemm_batched(a->l.bk, trans_a, trans_b, m, n, k, 1.0f, A, lda, sa, B, ldb, sb, beta,
                          C, ldc, sc, batch);
}

/* ---------------------------------------------------------------------------------------------
 * the two rings */

/* Computes with slot s of a gathered array (a step's shard of rank s). */
typedef dt_status_t (*dt__tpo_slot_fn)(const dt__tpo_t* a, int s, const float* slot, void* ctx);

/* Gathers the row chunks of an array of F features around the ring into `packed` (a->rt; slot
 * s, rank s's P x len[s] x R rows, at row P R start[s]; this rank's slot filled by the caller),
 * calling fn on each slot's f32 values while the next one moves: the slot itself when a->rt is
 * f32, else converted into f32 scratch `work` (the largest slot). */
static dt_status_t dt__tpo_gather_ring(const dt__tpo_t* a, void* packed, int64_t F,
                                       dt__tpo_slot_fn fn, void* ctx, float* work) {
  const int n = a->l.n, r = a->l.r;
  const int64_t row = a->P * a->R * F; /* elements per unit of chunk length */
  const size_t it = dt__itemsize(a->rt);
  dt_status_t st = DT_SUCCESS;
  for (int t = 0; t < n && st == DT_SUCCESS; t++) {
    const int s = (r - t + n) % n, p = (s - 1 + n) % n, more = t + 1 < n;
    char* slot = (char*)packed + it * (size_t)(row * a->start[s]);
    dt__ring_xfer_t x;
    if (more) { /* slot s on to r + 1, slot s - 1 in from r - 1 */
      const void* snd[1] = {slot};
      void* rcv[1] = {(char*)packed + it * (size_t)(row * a->start[p])};
      const int64_t cnt[1] = {row * a->len[s]}, rc[1] = {row * a->len[p]};
      st = dt__ring_xfer_start(&a->l, &x, 1, snd, rcv, cnt, rc, a->rt);
    }
    const void* vals = NULL;
    if (a->l.sim) /* the conversion on the simulated clock */
      dt__sim_compute(dt__ring_conv_us(a->rt, DT_F32, row * a->len[s]));
    if (st == DT_SUCCESS)
      st = dt__ring_as(&a->l, slot, a->rt, DT_F32, row * a->len[s], work, &vals);
    if (st == DT_SUCCESS) st = fn(a, s, vals, ctx);
    if (more) {
      dt_status_t w = dt__ring_xfer_finish(&a->l, &x);
      if (st == DT_SUCCESS) st = w;
    }
  }
  return st;
}

/* Computes rank c's chunk's partial sum (P x len[c] x R rows of F features) into `into`. */
typedef dt_status_t (*dt__tpo_part_fn)(const dt__tpo_t* a, int c, float* into, void* ctx);

/* Reduce-scatters partial sums around the ring: out (this rank's chunk, F features) gets the sum
 * over the ring of every rank's partial of it. acc0, acc1, tmp: scratch of the largest chunk. */
static dt_status_t dt__tpo_scatter_ring(const dt__tpo_t* a, int64_t F, dt__tpo_part_fn fn,
                                        void* ctx, float* const* acc, float* tmp, float* out) {
  const int n = a->l.n, r = a->l.r;
  const int64_t row = a->P * a->R * F;
  dt_backend_t bk = a->l.bk;
  dt_status_t st = DT_SUCCESS;
  dt__ring_xfer_t x;
  int inflight = 0;
  for (int t = 0; t < n && st == DT_SUCCESS; t++) {
    const int c = ((r - 1 - t) % n + n) % n;
    float* A = acc[t % 2];
    /* this rank's partial of chunk c: straight into the accumulator at t = 0, else into scratch
     * while the running sum of chunk c arrives (into A) */
    st = fn(a, c, t == 0 ? A : tmp, ctx);
    if (inflight) {
      dt_status_t w = dt__ring_xfer_finish(&a->l, &x);
      if (st == DT_SUCCESS) st = w;
      inflight = 0;
      if (st == DT_SUCCESS && !a->l.sim)
        st = bk->iface->reduce(bk, A, A, tmp, DT_F32, row * a->len[c], DT_REDUCE_SUM);
    }
    if (st == DT_SUCCESS && t + 1 < n) { /* chunk c's sum on to r + 1, chunk c - 1's in */
      const int cn = (c - 1 + n) % n;
      const void* snd[1] = {A};
      void* rcv[1] = {acc[(t + 1) % 2]};
      const int64_t cnt[1] = {row * a->len[c]}, rc[1] = {row * a->len[cn]};
      st = dt__ring_xfer_start(&a->l, &x, 1, snd, rcv, cnt, rc, DT_F32);
      inflight = 1; /* whatever was posted is completed */
    }
  }
  if (inflight) {
    dt_status_t w = dt__ring_xfer_finish(&a->l, &x);
    if (st == DT_SUCCESS) st = w;
  }
  /* after n steps: chunk r's sum (t = n - 1) */
  if (st == DT_SUCCESS && !a->l.sim && row * a->len[r] > 0)
    st = bk->iface->copy(bk, out, acc[(n - 1) % 2], sizeof(float) * (size_t)(row * a->len[r]),
                         DT_COPY_D2D);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * the steps' GEMMs (row-major: x rows (P, S, R) of K features; a chunk's rows of one of the P
 * blocks are consecutive) */

typedef struct {
  const float *w, *x, *dy, *gxs; /* gxs: the gathered x's gradient (all_gather_linear) */
  const float* xr; /* linear_reduce_scatter's x in slot order (rank-major chunks) */
  float *y, *dx, *dw;
  int first; /* dw: the next term overwrites */
} dt__tpo_io_t;

/* all_gather_linear forward: y rows of slot s (N = w's local rows) = slot w^T. */
static dt_status_t dt__agl_fwd_slot(const dt__tpo_t* a, int s, const float* slot, void* ctx) {
  const dt__tpo_io_t* io = ctx;
  const int64_t m = a->len[s] * a->R;
  return dt__tpo_gemm(a, 0, 1, m, a->N, a->K, 0.0f, slot, a->K, m * a->K, io->w, a->K, 0,
                      io->y + a->start[s] * a->R * a->N, a->N, a->S * a->R * a->N, a->P);
}

/* all_gather_linear backward: chunk c's partial of dx = dy[chunk c] w (w: N x K), plus chunk c of
 * the gathered x's own gradient where it has one. */
static dt_status_t dt__agl_bwd_part(const dt__tpo_t* a, int c, float* into, void* ctx) {
  const dt__tpo_io_t* io = ctx;
  const int64_t m = a->len[c] * a->R;
  float beta = 0.0f;
  if (io->gxs != NULL) { /* chunk c of every block of rows, then the product added */
    beta = 1.0f;
    if (!a->l.sim && m > 0 && a->P > 0) {
      const int64_t shape[3] = {a->P, a->S, a->R * a->K}, ext[3] = {a->P, a->len[c], a->R * a->K},
                    off[3] = {0, a->start[c], 0}, zero[3] = {0, 0, 0};
      DT_CHECK(a->l.bk->iface->box_copy(a->l.bk, 3, sizeof(float), ext, into, ext, zero, io->gxs,
                                        shape, off));
    }
  } else if (io->dy == NULL && !a->l.sim) {
    return a->l.bk->iface->memset(a->l.bk, into, 0, sizeof(float) * (size_t)(a->P * m * a->K));
  }
  if (io->dy == NULL) return DT_SUCCESS;
  return dt__tpo_gemm(a, 0, 0, m, a->K, a->N, beta, io->dy + a->start[c] * a->R * a->N, a->N,
                      a->S * a->R * a->N, io->w, a->K, 0, into, a->K, m * a->K, a->P);
}

/* linear_reduce_scatter forward: chunk c's partial of y = x[chunk c] w^T (x: S rows of K). */
static dt_status_t dt__lrs_fwd_part(const dt__tpo_t* a, int c, float* into, void* ctx) {
  const dt__tpo_io_t* io = ctx;
  const int64_t m = a->len[c] * a->R;
  return dt__tpo_gemm(a, 0, 1, m, a->N, a->K, 0.0f, io->x + a->start[c] * a->R * a->K, a->K,
                      a->S * a->R * a->K, io->w, a->K, 0, into, a->N, m * a->N, a->P);
}

/* linear_reduce_scatter backward, slot s of the gathered dy (N features): dx rows of chunk s =
 * slot w, and dw += slot^T x[chunk s] (xr: x's rows in slot order, so that one GEMM sums over the
 * slot's P blocks too). */
static dt_status_t dt__lrs_bwd_slot(const dt__tpo_t* a, int s, const float* slot, void* ctx) {
  dt__tpo_io_t* io = ctx;
  const int64_t m = a->len[s] * a->R;
  dt_status_t st = DT_SUCCESS;
  if (io->dx != NULL)
    st = dt__tpo_gemm(a, 0, 0, m, a->K, a->N, 0.0f, slot, a->N, m * a->N, io->w, a->K, 0,
                      io->dx + a->start[s] * a->R * a->K, a->K, a->S * a->R * a->K, a->P);
  if (io->dw != NULL && st == DT_SUCCESS && m > 0 && a->P > 0) {
    st = dt__tpo_gemm(a, 1, 0, a->N, a->K, a->P * m, io->first ? 0.0f : 1.0f, slot, a->N, 0,
                      io->xr + a->P * a->R * a->K * a->start[s], a->K, 0, io->dw, a->K, 0, 1);
    io->first = 0;
  }
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * composite helpers (ring attention's too) */

dt_status_t dt__op_move_to(dt_tensor_t x, const dt_placement_t* pl, dt_tensor_t* y,
                           dt_tensor_t* owned) {
  *owned = NULL;
  *y = x;
  int same = 1;
  for (int i = 0; i < x->mesh->ndim; i++) same &= dt_placement_equal(x->layout.pl[i], pl[i]);
  if (same) return DT_SUCCESS;
  *y = NULL; /* failed: nothing to use (nor to free) */
  DT_CHECK(dt_tensor_redistribute(x, pl, owned));
  *y = *owned;
  return DT_SUCCESS;
}

dt_status_t dt__op_convert(dt_tensor_t x, dt_dtype_t to, dt_tensor_t* y, dt_tensor_t* owned) {
  *owned = NULL;
  *y = x;
  if (x->dtype == to) return DT_SUCCESS;
  dt_tensor_t c;
  *y = NULL; /* failed: nothing to use (nor to free) */
  DT_CHECK(dt__tensor_new(x->mesh, to, x->layout.ndim, x->layout.shape, x->layout.pl, 0, &c));
  dt_local_tensor_t lx, lc;
  dt__tensor_local_view(x, &lx);
  dt__tensor_local_view(c, &lc);
  const int64_t n = dt__local_numel(&lx);
  dt_backend_t b = x->mesh->backend;
  dt_status_t st = DT_SUCCESS;
  if (n > 0 && b->device != DT_DEVICE_META)
    st = b->iface->convert(b, lx.data, x->dtype, lc.data, to, n);
  if (st != DT_SUCCESS) {
    dt__tensor_free(c);
    return st;
  }
  *owned = *y = c;
  return DT_SUCCESS;
}

dt_status_t dt__op_as_f32(dt_tensor_t x, dt_tensor_t* y, dt_tensor_t* owned) {
  return dt__op_convert(x, DT_F32, y, owned);
}

dt_status_t dt__op_cast_in_place(dt_tensor_t* t, dt_dtype_t to) {
  dt_tensor_t y, owned;
  DT_CHECK(dt__op_convert(*t, to, &y, &owned));
  if (owned != NULL) {
    dt__tensor_free(*t);
    *t = y;
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * forward */

/* Largest chunk. */
static int64_t dt__tpo_max_len(const dt__tpo_t* a) {
  int64_t m = 0;
  for (int s = 0; s < a->l.n; s++) m = a->len[s] > m ? a->len[s] : m;
  return m;
}

/* The gathered x's placements (all_gather_linear's second output): x's, whole on d. */
static void dt__tpo_gathered_pl(const dt__tpo_t* a, int mesh_ndim, dt_placement_t* pl) {
  memcpy(pl, a->xpl, sizeof(dt_placement_t) * (size_t)mesh_ndim);
  pl[a->d] = dt_replicate();
}

/* Runs the forward ring on local shards (f32): y, and for all_gather_linear the gathered x. */
static dt_status_t dt__tpo_fwd_local(dt__tpo_t* a, dt_tensor_t x, dt_tensor_t w, dt_tensor_t y,
                                     dt_tensor_t xs) {
  dt_local_tensor_t lx, lw, ly, ls;
  dt__tensor_local_view(x, &lx);
  dt__tensor_local_view(w, &lw);
  dt__tensor_local_view(y, &ly);
  if (xs) dt__tensor_local_view(xs, &ls);
  dt__ring_mem_t mm = {.b = a->l.bk};
  int ok = 1;
  const void* xh = dt__ring_mem_host(&a->l, &mm, &lx, 1, &ok); /* gather: x's dtype */
  dt__tpo_io_t io = {.w = dt__ring_mem_host(&a->l, &mm, &lw, 1, &ok), .x = xh};
  io.y = dt__ring_mem_host(&a->l, &mm, &ly, 0, &ok);
  const int64_t big = a->P * dt__tpo_max_len(a) * a->R;
  const size_t it = dt__itemsize(a->rt);
  void *packed = NULL, *xsh = NULL; /* x's dtype (a->rt) */
  float *acc[2] = {NULL, NULL}, *tmp = NULL, *work = NULL;
  if (a->gather) {
    xsh = dt__ring_mem_host(&a->l, &mm, &ls, 0, &ok);
    packed = a->P == 1 ? xsh : dt__ring_mem_alloc(&mm, it * (size_t)(a->P * a->S * a->R * a->K), 0);
    if (a->rt != DT_F32) { /* a slot's f32 values */
      work = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->K), 0);
      ok = ok && work;
    }
  } else {
    acc[0] = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->N), 0);
    acc[1] = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->N), 0);
    tmp = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->N), 0);
  }
  ok = ok && (a->gather ? packed != NULL : acc[0] && acc[1] && tmp);
  dt_status_t st = ok ? DT_SUCCESS
                      : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: ring scratch of %zu bytes", a->op,
                                a->gather ? it * (size_t)(a->P * a->S * a->R * a->K) +
                                                (work ? sizeof(float) * (size_t)(big * a->K) : 0)
                                          : 3 * sizeof(float) * (size_t)(big * a->N));
  /* a rank short of memory must not leave the others in the ring */
  st = dt__mesh_agree(a->l.mesh, st, a->op);
  if (st == DT_SUCCESS && a->gather) {
    const int64_t row = a->P * a->R * a->K, own = row * a->len[a->l.r];
    if (!a->l.sim && own > 0)
      st = a->l.bk->iface->copy(a->l.bk, (char*)packed + it * (size_t)(row * a->start[a->l.r]),
                                xh, it * (size_t)own, DT_COPY_D2D);
    if (st == DT_SUCCESS) st = dt__tpo_gather_ring(a, packed, a->K, dt__agl_fwd_slot, &io, work);
    if (st == DT_SUCCESS && packed != xsh && !a->l.sim) { /* rank-major slots -> (P, S, R) rows */
      const int64_t shape[3] = {a->P, a->S, a->R * a->K};
      st = a->l.bk->iface->split_copy(a->l.bk, 3, it, shape, 1, a->l.n, a->start, a->len, xsh,
                                      packed, 0);
    }
    if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->l, &ls, xsh);
  } else if (st == DT_SUCCESS) {
    st = dt__tpo_scatter_ring(a, a->N, dt__lrs_fwd_part, &io, acc, tmp, io.y);
  }
  if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->l, &ly, io.y);
  dt__ring_mem_free(&mm);
  return st;
}

static dt_status_t dt__tpo_fwd(int gather, const dt_tensor_t* in, int n_iargs,
                               const int64_t* iargs, dt_tensor_t* out, dt_tensor_t* saved) {
  dt__tpo_t a;
  DT_CHECK(dt__tpo_args(gather, n_iargs, iargs, in[0], in[1], &a));
  dt_mesh_t mesh = in[0]->mesh;
  const dt_dtype_t dtype = in[0]->dtype;
  const int meta = in[0]->meta || in[1]->meta;
  dt_tensor_t mv[2] = {NULL, NULL}, cv[2] = {NULL, NULL}, x[2], y = NULL, xs = NULL;
  dt_placement_t spl[DT_MAX_MESH_DIMS];
  dt__tpo_gathered_pl(&a, mesh->ndim, spl);
  const dt_placement_t* pls[2] = {a.xpl, a.wpl};
  dt_status_t st = DT_SUCCESS;
  for (int t = 0; t < 2 && st == DT_SUCCESS; t++) { /* meta tensors too: a dry run shows them */
    dt__trace_input(t);
    st = dt__op_move_to(in[t], pls[t], &x[t], &mv[t]);
  }
  dt__trace_input(-1);
  if (meta) { /* layouts only */
    if (st == DT_SUCCESS) st = dt__tensor_meta(mesh, dtype, a.nd, a.yshape, a.ypl, &y);
    if (st == DT_SUCCESS && gather) /* the gathered x: all_gather_linear's second output */
      st = dt__tensor_meta(mesh, dtype, a.nd, in[0]->layout.shape, spl, &xs);
    goto done;
  }
  /* f32 compute: w (and linear_reduce_scatter's x) as f32 copies; all_gather_linear's x travels
   * and is kept gathered in its dtype, each slot converted where its GEMM runs */
  for (int t = gather ? 1 : 0; t < 2 && st == DT_SUCCESS; t++)
    st = dt__op_as_f32(x[t], &x[t], &cv[t]);
  a.rt = in[0]->dtype; /* (the moves keep it) */
  if (st == DT_SUCCESS) st = dt__tensor_new(mesh, DT_F32, a.nd, a.yshape, a.ypl, 0, &y);
  if (st == DT_SUCCESS && gather)
    st = dt__tensor_new(mesh, a.rt, a.nd, in[0]->layout.shape, spl, 0, &xs);
  if (mesh->member) st = dt__mesh_agree(mesh, st, a.op);
  if (st == DT_SUCCESS && mesh->member) {
    st = dt__ring_link_init(mesh, a.d, a.op, &a.l);
    if (st == DT_SUCCESS) {
      dt__tpo_geom(&a, mesh, in[0]->layout.shape, in[1]->layout.shape);
      st = dt__tpo_fwd_local(&a, x[0], x[1], y, xs);
    }
  }
  if (st == DT_SUCCESS) st = dt__op_cast_in_place(&y, dtype);
  if (st == DT_SUCCESS && gather) st = dt__op_cast_in_place(&xs, dtype);
done:
  for (int t = 0; t < 2; t++) {
    dt__tensor_free(cv[t]);
    dt__tensor_free(mv[t]);
  }
  if (st != DT_SUCCESS) {
    dt__tensor_free(xs);
    dt__tensor_free(y);
    return st;
  }
  out[0] = y;
  if (gather) out[1] = xs;
  if (saved) *saved = NULL;
  return DT_SUCCESS;
}

dt_status_t dt__all_gather_linear_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                      const int64_t* iargs, int n_fargs, const double* fargs,
                                      dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  (void)n_fargs;
  (void)fargs;
  return dt__tpo_fwd(1, in, n_iargs, iargs, out, saved);
}

dt_status_t dt__linear_reduce_scatter_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                          const int64_t* iargs, int n_fargs, const double* fargs,
                                          dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  (void)n_fargs;
  (void)fargs;
  return dt__tpo_fwd(0, in, n_iargs, iargs, out, saved);
}

/* ---------------------------------------------------------------------------------------------
 * backward */

/* The backward ring on local shards (f32): gx and gw where wanted (NULL: not). xs: the gathered
 * x (all_gather_linear) or x itself (linear_reduce_scatter); dy NULL: no gradient of the product
 * (all_gather_linear with only gxs, the gathered x's gradient, a partial sum, or NULL). */
static dt_status_t dt__tpo_bwd_local(dt__tpo_t* a, dt_tensor_t xs, dt_tensor_t w, dt_tensor_t dy,
                                     dt_tensor_t gxs, dt_tensor_t gx, dt_tensor_t gw) {
  dt_local_tensor_t lx, lw, ldy, lgxs, lgx, lgw;
  dt__tensor_local_view(xs, &lx);
  dt__tensor_local_view(w, &lw);
  dt__ring_mem_t mm = {.b = a->l.bk};
  int ok = 1;
  dt__tpo_io_t io = {.x = dt__ring_mem_host(&a->l, &mm, &lx, 1, &ok),
                     .w = dt__ring_mem_host(&a->l, &mm, &lw, 1, &ok),
                     .first = 1};
  if (dy) {
    dt__tensor_local_view(dy, &ldy);
    io.dy = dt__ring_mem_host(&a->l, &mm, &ldy, 1, &ok);
  }
  if (gxs) {
    dt__tensor_local_view(gxs, &lgxs);
    io.gxs = dt__ring_mem_host(&a->l, &mm, &lgxs, 1, &ok);
  }
  if (gx) {
    dt__tensor_local_view(gx, &lgx);
    io.dx = dt__ring_mem_host(&a->l, &mm, &lgx, 0, &ok);
  }
  if (gw) {
    dt__tensor_local_view(gw, &lgw);
    io.dw = dt__ring_mem_host(&a->l, &mm, &lgw, 0, &ok);
  }
  const int64_t big = a->P * dt__tpo_max_len(a) * a->R;
  const size_t it = dt__itemsize(a->rt);
  void* packed = NULL; /* linear_reduce_scatter's gathered dy, in its dtype (a->rt) */
  float *acc[2] = {NULL, NULL}, *tmp = NULL, *work = NULL;
  if (a->gather && gx) {
    acc[0] = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->K), 0);
    acc[1] = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->K), 0);
    tmp = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->K), 0);
    ok = ok && acc[0] && acc[1] && tmp;
  } else if (!a->gather) {
    packed = dt__ring_mem_alloc(&mm, it * (size_t)(a->P * a->S * a->R * a->N), 0);
    ok = ok && packed;
    if (a->rt != DT_F32) { /* a slot's f32 values */
      work = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(big * a->N), 0);
      ok = ok && work;
    }
    io.xr = io.x;
    if (gw && a->P > 1) { /* x's rows in slot order: one dw GEMM per slot */
      float* xr = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(a->P * a->S * a->R * a->K), 0);
      ok = ok && xr;
      if (xr && ok && !a->l.sim) {
        const int64_t shape[3] = {a->P, a->S, a->R * a->K};
        ok = a->l.bk->iface->split_copy(a->l.bk, 3, sizeof(float), shape, 1, a->l.n, a->start,
                                        a->len, (void*)io.x, xr, 1) == DT_SUCCESS;
      }
      io.xr = xr;
    }
  }
  dt_status_t st = ok ? DT_SUCCESS
                      : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: backward scratch", a->op);
  st = dt__mesh_agree(a->l.mesh, st, a->op);
  if (st == DT_SUCCESS && a->gather) {
    if (gw && io.dy) /* dw = dy^T x over every row (P S R): one GEMM, local */
      st = dt__tpo_gemm(a, 1, 0, a->N, a->K, a->P * a->S * a->R, 0.0f, io.dy, a->N, 0, io.x, a->K,
                        0, io.dw, a->K, 0, 1);
    if (st == DT_SUCCESS && gx)
      st = dt__tpo_scatter_ring(a, a->K, dt__agl_bwd_part, &io, acc, tmp, io.dx);
  } else if (st == DT_SUCCESS) {
    const int64_t row = a->P * a->R * a->N, own = row * a->len[a->l.r];
    if (!a->l.sim && own > 0)
      st = a->l.bk->iface->copy(a->l.bk, (char*)packed + it * (size_t)(row * a->start[a->l.r]),
                                io.dy, it * (size_t)own, DT_COPY_D2D);
    if (st == DT_SUCCESS) st = dt__tpo_gather_ring(a, packed, a->N, dt__lrs_bwd_slot, &io, work);
    if (st == DT_SUCCESS && gw && io.first && !a->l.sim) /* no rows at all: dw = 0 */
      st = a->l.bk->iface->memset(a->l.bk, io.dw, 0, sizeof(float) * (size_t)(a->N * a->K));
  }
  if (st == DT_SUCCESS && gx) st = dt__ring_mem_out(&a->l, &lgx, io.dx);
  if (st == DT_SUCCESS && gw) st = dt__ring_mem_out(&a->l, &lgw, io.dw);
  dt__ring_mem_free(&mm);
  return st;
}

static dt_status_t dt__tpo_bw(int gather, const dt_grad_ctx_t* c, dt_tensor_t* gout,
                              dt_tensor_t* gin) {
  const int any = gout[0] != NULL || (gather && gout[1] != NULL);
  if (!any || !(c->needs[0] || c->needs[1])) return DT_SUCCESS;
  dt__tpo_t a;
  DT_CHECK(dt__tpo_args(gather, c->n_iargs, c->iargs, c->in[0], c->in[1], &a));
  dt_mesh_t mesh = c->in[0]->mesh;
  /* xs: the gathered x (the second output) or x moved; w moved; dy at the output's placements;
   * all_gather_linear: the gathered x's own gradient (its other readers'), a partial sum */
  const dt_tensor_t src[4] = {gather ? c->out[1] : c->in[0], c->in[1], gout[0],
                              gather ? gout[1] : NULL};
  dt_placement_t spl[DT_MAX_MESH_DIMS], gspl[DT_MAX_MESH_DIMS];
  dt__tpo_gathered_pl(&a, mesh->ndim, spl);
  memcpy(gspl, spl, sizeof spl);
  gspl[a.d] = dt_partial(DT_REDUCE_SUM);
  const dt_placement_t* pls[4] = {gather ? spl : a.xpl, a.wpl, a.ypl, gspl};
  dt_tensor_t mv[4] = {NULL, NULL, NULL, NULL}, cv[4] = {NULL, NULL, NULL, NULL}, x[4] = {NULL},
              gr[2] = {NULL, NULL};
  const dt_placement_t* gpl[2] = {a.xpl, a.gwpl};
  /* no gradient of the product: w gets none, x only its gathered copy's (reduce-scattered) */
  const int needs[2] = {c->needs[0], c->needs[1] && gout[0] != NULL};
  if (!needs[0] && !needs[1]) return DT_SUCCESS;
  int meta = 0;
  for (int t = 0; t < 4; t++) meta |= src[t] != NULL && src[t]->meta;
  dt_status_t st = DT_SUCCESS;
  for (int t = 0; t < 2 && st == DT_SUCCESS; t++) {
    if (!needs[t]) continue;
    const dt_tensor_t like = c->in[t];
    st = meta ? dt__tensor_meta(mesh, like->dtype, like->layout.ndim, like->layout.shape, gpl[t],
                                &gr[t])
              : dt__tensor_new(mesh, DT_F32, like->layout.ndim, like->layout.shape, gpl[t], 0,
                               &gr[t]);
  }
  if (meta) goto done;
  for (int t = 0; t < 4 && st == DT_SUCCESS; t++)
    if (src[t] != NULL) st = dt__op_move_to(src[t], pls[t], &x[t], &mv[t]);
  /* f32 compute; linear_reduce_scatter's dy travels in its dtype (each slot converted) */
  for (int t = 0; t < 4 && st == DT_SUCCESS; t++)
    if (src[t] != NULL && (gather || t != 2)) st = dt__op_as_f32(x[t], &x[t], &cv[t]);
  a.rt = gather || src[2] == NULL ? DT_F32 : src[2]->dtype;
  if (mesh->member) st = dt__mesh_agree(mesh, st, a.op);
  if (st == DT_SUCCESS && mesh->member) {
    st = dt__ring_link_init(mesh, a.d, a.op, &a.l);
    if (st == DT_SUCCESS) {
      dt__tpo_geom(&a, mesh, c->in[0]->layout.shape, c->in[1]->layout.shape);
      st = dt__tpo_bwd_local(&a, x[0], x[1], x[2], x[3], gr[0], gr[1]);
    }
  }
  for (int t = 0; t < 2 && st == DT_SUCCESS; t++) /* each gradient in its input's dtype */
    if (gr[t]) st = dt__op_cast_in_place(&gr[t], c->in[t]->dtype);
done:
  for (int t = 0; t < 4; t++) {
    dt__tensor_free(cv[t]);
    dt__tensor_free(mv[t]);
  }
  if (st != DT_SUCCESS) {
    for (int t = 0; t < 2; t++) dt__tensor_free(gr[t]);
    return st;
  }
  gin[0] = gr[0];
  gin[1] = gr[1];
  return DT_SUCCESS;
}

dt_status_t dt__bw_all_gather_linear(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  return dt__tpo_bw(1, c, gout, gin);
}

dt_status_t dt__bw_linear_reduce_scatter(const dt_grad_ctx_t* c, dt_tensor_t* gout,
                                         dt_tensor_t* gin) {
  return dt__tpo_bw(0, c, gout, gin);
}

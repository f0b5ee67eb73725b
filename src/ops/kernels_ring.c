/* kernels_ring.c - ring attention on local shards (the op and its schedule: src/ops/
 * ring_attention.c): one block pair of attention at a time (a chunk of query rows against a chunk
 * of key/value rows), merged into running per-row maxima and sums (the online softmax), and its
 * gradient from the rows' log-sum-exp, so that blocks arriving one by one give exactly attention
 * over all of them; and the ring itself, which moves the key/value shards (and, backward, their
 * gradients) between the ranks of the cp dim with point-to-point calls posted before each step's
 * blocks. f32, matrix products through the backend's GEMM and the steps between them through
 * dt__ring_rows_t (host loops here, CUDA kernels in src/ops/cuda/ring.cu), or, where that table
 * has them, a whole block in fused kernels (the CUDA backends' flash kernels: f32, or bf16/f16
 * inputs read as stored by the tensor-core kernels, dt__ring_geom_t's dt). A device backend
 * computes in its own memory and rings over the mesh's NCCL plane (the pairs of a step issued
 * as one group on the communicator's stream while the step's blocks run on the compute stream);
 * where the plane is MPI (ranks sharing a GPU) its shards are staged through host memory and
 * computed there.
 */
#include <math.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "ops/ops.h"
#include "redistribute/redistribute.h"

static const char* const kRingOp = "ring_attention";

/* The (batch, head) slabs of q, o (S rows), k, v (T rows) and their row strides. */
typedef struct {
  int64_t q, k, v, o;     /* element offsets of the slab's row 0 */
  int64_t lq, lk, lv, lo; /* row strides */
} dt__ring_slab_t;

static void dt__ring_slab(const dt__ring_geom_t* g, int64_t b, int64_t h, dt__ring_slab_t* s) {
  const int64_t gi = h / (g->H / g->G), L = g->layout;
  s->q = dt__attn_base(g->layout, b, h, g->H, g->S, g->D);
  s->o = dt__attn_base(g->layout, b, h, g->H, g->S, g->E);
  s->k = dt__attn_base(g->layout, b, gi, g->G, g->T, g->D);
  s->v = dt__attn_base(g->layout, b, gi, g->G, g->T, g->E);
  s->lq = L ? g->H * g->D : g->D;
  s->lo = L ? g->H * g->E : g->E;
  s->lk = L ? g->G * g->D : g->D;
  s->lv = L ? g->G * g->E : g->E;
}

/* Whether the fused kernels of g's backend take its blocks of C rows. */
static int dt__ring_fused(const dt__ring_rows_t* R, const dt__ring_geom_t* g, int64_t C) {
  return R->fused != NULL && R->fused(g, C);
}

/* Query rows per chunk of a block of C rows on g's backend. */
static int64_t dt__ring_chunk_rows(const dt__ring_rows_t* R, int64_t C) {
  return R->row_block > 0 && R->row_block < C ? R->row_block : C;
}

size_t dt__ring_block_scratch(const dt__ring_geom_t* g, int64_t C) {
  const dt__ring_rows_t* R = dt__ring_rows_for(g->bk);
  if (dt__ring_fused(R, g, C)) return 0;
  const int64_t rb = dt__ring_chunk_rows(R, C);
  return sizeof(float) * (size_t)(2 * rb * C + rb * g->E + 2 * rb);
}

/* ---- the row-wise steps on host memory (dt__ring_rows_t; ring.cu has the CUDA ones) ---------- */

/* Keys row i of a chunk sees among cols (d0 < 0: all). */
static inline int64_t dt__rr_vis(int64_t d0, int64_t i, int64_t cols) {
  return d0 < 0 || d0 + i + 1 > cols ? cols : d0 + i + 1;
}

/* The loops as the dense attention's (dt__max_f, dt__expf, dt__sum_d; DT_SIMD clones). */
DT_SIMD static dt_status_t dt__rr_softmax(dt_backend_t b, float* p, int64_t rows, int64_t cols,
                                          int64_t ld, int64_t d0, float* mb, float* lb) {
  (void)b;
  for (int64_t i = 0; i < rows; i++) { /* the block's softmax numerators, row max and sum */
    float* row = p + i * ld;
    const int64_t vis = dt__rr_vis(d0, i, cols);
    const float mx = dt__max_f(row, vis, -INFINITY);
    for (int64_t j = 0; j < vis; j++) row[j] = dt__expf(row[j] - mx);
    const double sum = dt__sum_d(row, vis);
    for (int64_t j = vis; j < cols; j++) row[j] = 0.0f;
    mb[i] = mx;
    lb[i] = (float)sum;
  }
  return DT_SUCCESS;
}

DT_SIMD static dt_status_t dt__rr_merge(dt_backend_t b, float* o, int64_t lo, const float* t,
                                        int64_t E, int64_t rows, float* m, float* l,
                                        const float* mb, const float* lb) {
  (void)b;
  for (int64_t i = 0; i < rows; i++) { /* merge into the running (o, m, l) of the row */
    const float mo = m[i], mn = mo > mb[i] ? mo : mb[i];
    const float a = mo == -INFINITY ? 0.0f : expf(mo - mn), c = expf(mb[i] - mn);
    float* orow = o + i * lo;
    for (int64_t e = 0; e < E; e++) orow[e] = orow[e] * a + t[i * E + e] * c;
    l[i] = l[i] * a + lb[i] * c;
    m[i] = mn;
  }
  return DT_SUCCESS;
}

static dt_status_t dt__rr_finish(dt_backend_t b, const dt__ring_geom_t* g, float* o,
                                 const float* m, const float* l, float* lse) {
  (void)b;
  for (int64_t bb = 0; bb < g->B; bb++)
    for (int64_t h = 0; h < g->H; h++) {
      dt__ring_slab_t s;
      dt__ring_slab(g, bb, h, &s);
      for (int64_t i = 0; i < g->S; i++) {
        const int64_t r = (bb * g->H + h) * g->S + i;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        float* orow = o + s.o + i * s.lo;
        for (int64_t e = 0; e < g->E; e++) orow[e] *= inv;
        lse[r] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
      }
    }
  return DT_SUCCESS;
}

static dt_status_t dt__rr_rowdot(dt_backend_t b, const dt__ring_geom_t* g, const void* of,
                                 const void* gof, float* d) {
  (void)b;
  if (g->dt != DT_F32) /* no fused kernels here: the blocks' inputs are f32 */
    return DT_FAIL(DT_ERR_INTERNAL, "%s: host row dot of %s values", kRingOp,
                   dt_dtype_name(g->dt));
  const float *o = of, *go = gof;
  for (int64_t bb = 0; bb < g->B; bb++)
    for (int64_t h = 0; h < g->H; h++) {
      dt__ring_slab_t s;
      dt__ring_slab(g, bb, h, &s);
      for (int64_t i = 0; i < g->S; i++) {
        const float *x = o + s.o + i * s.lo, *y = go + s.o + i * s.lo;
        d[(bb * g->H + h) * g->S + i] = (float)dt__dot_d(x, y, g->E);
      }
    }
  return DT_SUCCESS;
}

DT_SIMD static dt_status_t dt__rr_probs(dt_backend_t b, float* p, int64_t rows, int64_t cols,
                                        int64_t ld, int64_t d0, const float* lse) {
  (void)b;
  for (int64_t i = 0; i < rows; i++) {
    float* row = p + i * ld;
    const int64_t vis = dt__rr_vis(d0, i, cols);
    const float ls = lse[i];
    if (ls == -INFINITY) /* no visible key in the whole sequence: P is 0 */
      for (int64_t j = 0; j < vis; j++) row[j] = 0.0f;
    else
      for (int64_t j = 0; j < vis; j++) row[j] = dt__expf(row[j] - ls);
    for (int64_t j = vis; j < cols; j++) row[j] = 0.0f;
  }
  return DT_SUCCESS;
}

DT_SIMD static dt_status_t dt__rr_dscore(dt_backend_t b, float* dp, const float* p, int64_t rows,
                                         int64_t cols, int64_t ld, const float* dd) {
  (void)b;
  for (int64_t i = 0; i < rows; i++) {
    const float di = dd[i];
    const float* pr = p + i * ld;
    float* dr = dp + i * ld;
    for (int64_t j = 0; j < cols; j++) dr[j] = pr[j] * (dr[j] - di);
  }
  return DT_SUCCESS;
}

static const dt__ring_rows_t dt__ring_rows_host = {
    DT_ATTN_ROW_BLOCK, dt__rr_softmax, dt__rr_merge, dt__rr_finish, dt__rr_rowdot, dt__rr_probs,
    dt__rr_dscore,     NULL,           NULL,         NULL};

const dt__ring_rows_t* dt__ring_rows_for(dt_backend_t b) {
#ifdef DTENSOR_HAVE_CUDA
  if (b->kernel_set == DT_KERNELS_CUDA) return dt__cuda_ring_rows();
#endif
#ifdef DTENSOR_HAVE_SIMT_EMU
  if (b->kernel_set == DT_KERNELS_CUDA_EMU) return dt__cudaemu_ring_rows();
#endif
  return &dt__ring_rows_host;
}

/* ---- the blocks ------------------------------------------------------------------------------ */

/* Per (b, h) and chunk of rn query rows (from r0 of the block): P = softmax(scale q k^T) over
 * the kn keys the chunk sees (the diagonal block: up to its last row), t = P v, merged into the
 * rows' running (o, m, l). */
/* Blocks of g->dt inputs other than f32 go only where fused kernels take them (dt__ring_setup). */
static dt_status_t dt__ring_unfused(const dt__ring_geom_t* g) {
  return g->dt == DT_F32 ? DT_SUCCESS
                         : DT_FAIL(DT_ERR_INTERNAL, "%s: %s blocks without fused kernels",
                                   kRingOp, dt_dtype_name(g->dt));
}

dt_status_t dt__ring_block_fwd(const dt__ring_geom_t* g, const void* qv, const void* kv,
                               const void* vv, int64_t qr, int64_t kr, int64_t C, int diag,
                               float* o, float* m, float* l, float* scratch) {
  const dt__ring_rows_t* R = dt__ring_rows_for(g->bk);
  if (dt__ring_fused(R, g, C)) return R->block_fwd(g, qv, kv, vv, qr, kr, C, diag, o, m, l);
  DT_CHECK(dt__ring_unfused(g));
  const float *q = qv, *k = kv, *v = vv;
  const int64_t rb = dt__ring_chunk_rows(R, C);
  float *p = scratch, *t = p + rb * C, *mb = t + rb * g->E, *lb = mb + rb;
  dt_status_t st = DT_SUCCESS;
  for (int64_t b = 0; b < g->B && st == DT_SUCCESS; b++)
    for (int64_t h = 0; h < g->H && st == DT_SUCCESS; h++) {
      dt__ring_slab_t s;
      dt__ring_slab(g, b, h, &s);
      const float *kb = k + s.k + kr * s.lk, *vb = v + s.v + kr * s.lv;
      for (int64_t r0 = 0; r0 < C && st == DT_SUCCESS; r0 += rb) {
        const int64_t rn = C - r0 < rb ? C - r0 : rb, kn = diag ? r0 + rn : C;
        const float* qb = q + s.q + (qr + r0) * s.lq;
        const int64_t i0 = (b * g->H + h) * g->S + qr + r0; /* the chunk's first row */
        if (g->D > 0)
          st = dt__gemm(g->bk, 0, 1, rn, kn, g->D, (float)g->scale, qb, s.lq, kb, s.lk, 0.0f, p,
                        C);
        else
          st = g->bk->iface->memset(g->bk, p, 0, sizeof(float) * (size_t)(rn * C));
        if (st == DT_SUCCESS) st = R->softmax(g->bk, p, rn, kn, C, diag ? r0 : -1, mb, lb);
        if (g->E > 0 && st == DT_SUCCESS)
          st = dt__gemm(g->bk, 0, 0, rn, g->E, kn, 1.0f, p, C, vb, s.lv, 0.0f, t, g->E);
        if (st == DT_SUCCESS)
          st = R->merge(g->bk, o + s.o + (qr + r0) * s.lo, s.lo, t, g->E, rn, m + i0, l + i0,
                        mb, lb);
      }
    }
  return st;
}

dt_status_t dt__ring_finish(const dt__ring_geom_t* g, float* o, const float* m, const float* l,
                            float* lse) {
  return dt__ring_rows_for(g->bk)->finish(g->bk, g, o, m, l, lse);
}

dt_status_t dt__ring_rowdot(const dt__ring_geom_t* g, const void* o, const void* go, float* d) {
  return dt__ring_rows_for(g->bk)->rowdot(g->bk, g, o, go, d);
}

/* Per (b, h) and chunk of rn query rows seeing kn keys (as the forward): P = exp(scale q k^T -
 * lse) (masked: 0), dv += P^T g, dP = g v^T, dS = P (dP - D), dq += scale dS k,
 * dk += scale dS^T q. */
dt_status_t dt__ring_block_bwd(const dt__ring_geom_t* g, const void* qv, const void* kv,
                               const void* vv, const void* gov, const float* lse, const float* dd,
                               int64_t qr, int64_t kr, int64_t C, int diag, float* dq, float* dk,
                               float* dv, float* scratch) {
  const dt__ring_rows_t* R = dt__ring_rows_for(g->bk);
  if (dt__ring_fused(R, g, C))
    return R->block_bwd(g, qv, kv, vv, gov, lse, dd, qr, kr, C, diag, dq, dk, dv);
  DT_CHECK(dt__ring_unfused(g));
  const float *q = qv, *k = kv, *v = vv, *go = gov;
  const int64_t rb = dt__ring_chunk_rows(R, C);
  float *p = scratch, *dp = p + rb * C;
  const float sc = (float)g->scale;
  dt_status_t st = DT_SUCCESS;
  for (int64_t b = 0; b < g->B && st == DT_SUCCESS; b++)
    for (int64_t h = 0; h < g->H && st == DT_SUCCESS; h++) {
      dt__ring_slab_t s;
      dt__ring_slab(g, b, h, &s);
      const float *kb = k + s.k + kr * s.lk, *vb = v + s.v + kr * s.lv;
      float *dkb = dk + s.k + kr * s.lk, *dvb = dv + s.v + kr * s.lv;
      for (int64_t r0 = 0; r0 < C && st == DT_SUCCESS; r0 += rb) {
        const int64_t rn = C - r0 < rb ? C - r0 : rb, kn = diag ? r0 + rn : C, d0 = diag ? r0 : -1;
        const size_t chunk_nb = sizeof(float) * (size_t)(rn * C);
        const float *qb = q + s.q + (qr + r0) * s.lq, *gb = go + s.o + (qr + r0) * s.lo;
        float* dqb = dq + s.q + (qr + r0) * s.lq;
        const int64_t i0 = (b * g->H + h) * g->S + qr + r0; /* the chunk's first row */
        if (g->D > 0)
          st = dt__gemm(g->bk, 0, 1, rn, kn, g->D, sc, qb, s.lq, kb, s.lk, 0.0f, p, C);
        else
          st = g->bk->iface->memset(g->bk, p, 0, chunk_nb);
        if (st == DT_SUCCESS) st = R->probs(g->bk, p, rn, kn, C, d0, lse + i0);
        if (g->E > 0) {
          if (st == DT_SUCCESS)
            st = dt__gemm(g->bk, 1, 0, kn, g->E, rn, 1.0f, p, C, gb, s.lo, 1.0f, dvb, s.lv);
          if (st == DT_SUCCESS)
            st = dt__gemm(g->bk, 0, 1, rn, kn, g->E, 1.0f, gb, s.lo, vb, s.lv, 0.0f, dp, C);
        } else if (st == DT_SUCCESS) {
          st = g->bk->iface->memset(g->bk, dp, 0, chunk_nb);
        }
        if (st == DT_SUCCESS) st = R->dscore(g->bk, dp, p, rn, kn, C, dd + i0);
        if (g->D > 0) {
          if (st == DT_SUCCESS)
            st = dt__gemm(g->bk, 0, 0, rn, g->D, kn, sc, dp, C, kb, s.lk, 1.0f, dqb, s.lq);
          if (st == DT_SUCCESS)
            st = dt__gemm(g->bk, 1, 0, kn, g->D, rn, sc, dp, C, qb, s.lq, 1.0f, dkb, s.lk);
        }
      }
    }
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * the ring */

dt_status_t dt__ring_link_init(dt_mesh_t mesh, int dim, const char* op, dt__ring_link_t* l) {
  memset(l, 0, sizeof *l);
  l->mesh = mesh;
  l->dim = dim;
  l->n = mesh->shape[dim];
  l->sim = mesh->backend->device == DT_DEVICE_META;
  l->dev = mesh->backend;
  /* device memory: computed there when the mesh's NCCL plane carries it, else staged through host
   * memory and the MPI comm (deciding the plane is collective over the mesh: every member runs
   * the op) */
  int nccl = 0;
  if (!l->sim && dt__backend_is_device(mesh->backend))
    DT_CHECK(dt__mesh_data_plane(mesh, mesh->backend, &nccl));
  l->stage = !l->sim && mesh->backend->device != DT_DEVICE_HOST && !nccl;
  l->bk = l->stage ? &dt__backend_cpu : mesh->backend;
  l->comm = nccl ? dt__mesh_data_comm(mesh, mesh->backend, 1u << dim)
                 : dt__mesh_group_comm(mesh, 1u << dim);
  if (l->comm == NULL)
    return DT_FAIL(DT_ERR_INTERNAL, "%s: no communicator for mesh dim %d", op, dim);
  l->r = l->comm->rank;
  return DT_SUCCESS;
}

dt_status_t dt__ring_setup(dt__ring_call_t* a, const dt_local_tensor_t* q,
                           const dt_local_tensor_t* k, const dt_local_tensor_t* v) {
  DT_CHECK(dt__ring_link_init(a->mesh, a->dim, kRingOp, &a->link));
  a->m = a->balanced ? 2 : 1;
  dt__ring_geom_t* g = &a->g;
  g->bk = a->link.bk;
  g->layout = a->layout;
  g->B = q->shape[0];
  g->H = q->shape[a->hd];
  g->S = q->shape[a->sd];
  g->D = q->shape[3];
  g->G = k->shape[a->hd];
  g->T = k->shape[a->sd];
  g->E = v->shape[3];
  /* as sdpa's: NaN (absent) is 1/sqrt(D), anything else literal */
  g->scale = isnan(a->scale) ? 1.0 / sqrt((double)(g->D > 0 ? g->D : 1)) : a->scale;
  a->C = g->S / a->m;
  a->nk = dt__local_numel(k);
  a->nv = dt__local_numel(v);
  a->kvt = k->dtype;
  if (v->dtype != k->dtype || q->dtype != k->dtype || !dt__dtype_is_float(k->dtype))
    return DT_FAIL(DT_ERR_INTERNAL, "%s: q %s, k %s, v %s (one float dtype)", kRingOp,
                   dt_dtype_name(q->dtype), dt_dtype_name(k->dtype), dt_dtype_name(v->dtype));
  /* the blocks read bf16/f16 as stored where the backend's fused kernels take them (the
   * cp group decides alike: the same shapes and devices), else f32 copies */
  const dt__ring_rows_t* R = dt__ring_rows_for(g->bk);
  g->dt = a->kvt;
  if (a->kvt == DT_F32 || !dt__ring_fused(R, g, a->C)) g->dt = DT_F32;
  return DT_SUCCESS;
}

/* The chunk ids rank r holds. */
static int dt__ra_chunks(const dt__ring_call_t* a, int r, int* ids) {
  ids[0] = r;
  if (a->m == 2) ids[1] = 2 * a->link.n - 1 - r;
  return a->m;
}

/* Block of query chunk cq against key chunk ck: 0 skipped, 1 full, 2 the causal diagonal. */
static int dt__ra_mode(const dt__ring_call_t* a, int cq, int ck) {
  if (!a->causal) return 1;
  return ck < cq ? 1 : ck == cq ? 2 : 0;
}

/* Query-key pairs one (batch, head) slab of a block scores: C x C for a full block; for the
 * causal diagonal, as the chunks of rb rows compute it (each up to its last row: masked pairs of
 * a device's whole-block products included; its fused kernels skip more, so there an upper
 * bound). */
static double dt__ra_block_pairs(const dt__ring_call_t* a, int mode) {
  const double C = (double)a->C;
  if (mode != 2 || a->C == 0) return C * C; /* (an empty sequence: no chunk) */
  const int64_t rb = dt__ring_chunk_rows(dt__ring_rows_for(a->g.bk), a->C);
  const double k = (double)(a->C / rb), rem = (double)(a->C % rb), r = (double)rb;
  return r * r * k * (k + 1.0) / 2.0 + rem * C; /* chunk i (0-based): rb rows of (i + 1) rb keys */
}

/* FLOPs of rank r's blocks against the shard of rank s (forward: scores and weighted values;
 * backward: scores, dV, dP, dQ, dK). */
static double dt__ra_step_flops_of(const dt__ring_call_t* a, int r, int s, int backward) {
  const dt__ring_geom_t* g = &a->g;
  int cq[2], ck[2];
  dt__ra_chunks(a, r, cq);
  dt__ra_chunks(a, s, ck);
  double pairs = 0.0;
  for (int i = 0; i < a->m; i++)
    for (int j = 0; j < a->m; j++) {
      const int mode = dt__ra_mode(a, cq[i], ck[j]);
      if (mode != 0) pairs += dt__ra_block_pairs(a, mode);
    }
  const double per = backward ? (double)(3 * g->D + 2 * g->E) : (double)(g->D + g->E);
  return 2.0 * (double)g->B * (double)g->H * pairs * per;
}

double dt__ring_conv_us(dt_dtype_t from, dt_dtype_t to, int64_t n) {
  if (from == to) return 0.0;
  return (double)n * (double)(dt__itemsize(from) + dt__itemsize(to)) /
         (dt__compute_model()->mem_gbps * 1e3);
}

/* The modeled time of rank r's blocks against the shard of rank s (with, for k and v of another
 * dtype than the blocks', the shard's conversion to f32); bf16/f16 blocks at that rate. */
static double dt__ra_step_us_of(const dt__ring_call_t* a, int r, int s, int backward) {
  return dt__compute_model()->op_us + dt__ring_conv_us(a->kvt, a->g.dt, a->nk + a->nv) +
         dt__ra_step_flops_of(a, r, s, backward) / (dt__attn_gflops(a->g.dt != DT_F32) * 1e3);
}

/* The simulated time of a step's blocks (and the clock's sums). */
static double dt__ra_step_us(const dt__ring_call_t* a, int s, int backward) {
  return dt__ra_step_us_of(a, a->link.r, s, backward);
}

static void dt__ra_sim_compute(const dt__ring_call_t* a, int s, int backward) {
  if (!a->link.sim) return;
  dt__sim_clock_t* ck = dt__sim_clock();
  ck->flops += dt__ra_step_flops_of(a, a->link.r, s, backward);
  ck->ops++;
  dt__sim_compute(dt__ra_step_us(a, s, backward));
}

/* Ring or all-gather for this call, as the models price them. Every rank of the cp group must
 * decide alike (one waiting in the ring for a peer that gathers would never return): the decision
 * compares the slowest rank's time under each, computed here for every rank of the group from the
 * group's shapes and the model's prices (causal blocks make ranks' own sums differ). */
static int dt__ra_algo_priced(const dt__ring_call_t* a) {
  if (a->algo != DT_RING_AUTO) return a->algo;
  if (a->link.n == 1) return DT_RING_RING;
  const unsigned mask = 1u << a->dim;
  const uint64_t kv = (uint64_t)(a->nk + a->nv) * dt__itemsize(a->kvt);
  double pa, pb, ga, gb;
  dt__cost_linear_on(a->mesh, mask, DT_COLL_SEND_RECV, DT_ALGO_NATIVE, a->link.n, &pa, &pb);
  dt__cost_linear_on(a->mesh, mask, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, a->link.n, &ga, &gb);
  const double busy = 1.0 - dt__comm_overlap_on(a->mesh); /* a transfer's part on the core */
  double ring_max = 0.0, gather_max = 0.0;
  for (int r = 0; r < a->link.n; r++) {
    double ring = 0.0, gather = 2.0 * ga + gb * (double)kv * a->link.n;
    for (int t = 0; t < a->link.n; t++) {
      const double step = dt__ra_step_us_of(a, r, (r - t + a->link.n) % a->link.n, 0);
      const double xfer = t + 1 < a->link.n ? pa + pb * (double)kv : 0.0;
      const double beside = step + busy * xfer; /* the step and the transfer's own share */
      ring += beside > xfer ? beside : xfer;
      gather += step;
    }
    ring_max = ring > ring_max ? ring : ring_max;
    gather_max = gather > gather_max ? gather : gather_max;
  }
  const double ring = ring_max, gather = gather_max;
  return ring <= gather ? DT_RING_RING : DT_RING_GATHER;
}

/* The algorithm of this call, agreed by the cp group. The models are each rank's own (a file
 * some ranks loaded, dt_compute_model_set on one rank), so under auto the group takes the
 * all-gather when any rank priced it cheaper: one 8-byte all-reduce over the dim's control
 * communicator (MPI; not counted as traffic). A simulated rank decides alone: every simulated
 * rank runs the same model. */
static dt_status_t dt__ra_algo(const dt__ring_call_t* a, int* algo) {
  *algo = dt__ra_algo_priced(a);
  if (a->algo != DT_RING_AUTO || a->link.n == 1 || a->link.sim) return DT_SUCCESS;
  dt_comm_t* c = dt__mesh_group_comm(a->mesh, 1u << a->dim);
  if (c == NULL) return DT_FAIL(DT_ERR_INTERNAL, "%s: no communicator for mesh dim %d", kRingOp,
                                a->dim);
  int64_t mine = *algo, all = 0;
  DT_CHECK(c->iface->all_reduce(c, &mine, &all, 1, DT_I64, DT_REDUCE_MAX, NULL));
  *algo = (int)all;
  return DT_SUCCESS;
}

float* dt__ring_mem_alloc(dt__ring_mem_t* mm, size_t nbytes, int zero) {
  if (mm->n >= DT_RING_MAX_BUFS) return NULL;
  if (nbytes == 0) nbytes = sizeof(float);
  size_t got = 0;
  void* p = dt__pool_alloc(mm->b, nbytes, &got);
  if (p == NULL) return NULL;
  dt__mem_count(DT_MEM_OTHER, (int64_t)nbytes);
  if (zero && mm->b->device != DT_DEVICE_META && mm->b->iface->memset(mm->b, p, 0, nbytes)) {
    dt__pool_free(mm->b, p, got);
    dt__mem_count(DT_MEM_OTHER, -(int64_t)nbytes);
    return NULL;
  }
  mm->p[mm->n] = p;
  mm->got[mm->n] = got;
  mm->nb[mm->n++] = nbytes;
  return (float*)p;
}

void dt__ring_mem_free(dt__ring_mem_t* mm) {
  for (int i = mm->n - 1; i >= 0; i--) {
    dt__pool_free(mm->b, mm->p[i], mm->got[i]);
    dt__mem_count(DT_MEM_OTHER, -(int64_t)mm->nb[i]);
  }
  mm->n = 0;
}

void* dt__ring_mem_host(const dt__ring_link_t* l, dt__ring_mem_t* mm, const dt_local_tensor_t* t,
                        int in, int* ok) {
  if (!l->stage) return t->data;
  const size_t nb = dt__itemsize(t->dtype) * (size_t)dt__local_numel(t);
  float* h = dt__ring_mem_alloc(mm, nb, 0);
  if (h == NULL ||
      (in && nb > 0 && l->dev->iface->copy(l->dev, h, t->data, nb, DT_COPY_D2H) != DT_SUCCESS))
    *ok = 0;
  return h;
}

dt_status_t dt__ring_mem_out(const dt__ring_link_t* l, const dt_local_tensor_t* t, const void* h) {
  const size_t nb = dt__itemsize(t->dtype) * (size_t)dt__local_numel(t);
  if (!l->stage || nb == 0) return DT_SUCCESS;
  return l->dev->iface->copy(l->dev, t->data, h, nb, DT_COPY_H2D);
}

/* The blocks of this rank's queries against the shard of rank s (k, v: its buffers). */
static dt_status_t dt__ra_fwd_blocks(const dt__ring_call_t* a, int s, const void* q,
                                     const void* k, const void* v, float* o, float* m, float* l,
                                     float* scr) {
  int cq[2], ck[2];
  dt__ra_chunks(a, a->link.r, cq);
  dt__ra_chunks(a, s, ck);
  for (int i = 0; i < a->m; i++)
    for (int j = 0; j < a->m; j++) {
      const int mode = dt__ra_mode(a, cq[i], ck[j]);
      if (mode != 0)
        DT_CHECK(dt__ring_block_fwd(&a->g, q, k, v, i * a->C, j * a->C, a->C, mode == 2, o, m, l,
                                    scr));
    }
  return DT_SUCCESS;
}

static dt_status_t dt__ra_bwd_blocks(const dt__ring_call_t* a, int s, const void* q,
                                     const void* k, const void* v, const void* go,
                                     const float* lse, const float* dd, float* dq, float* dk,
                                     float* dv, float* scr) {
  int cq[2], ck[2];
  dt__ra_chunks(a, a->link.r, cq);
  dt__ra_chunks(a, s, ck);
  for (int i = 0; i < a->m; i++)
    for (int j = 0; j < a->m; j++) {
      const int mode = dt__ra_mode(a, cq[i], ck[j]);
      if (mode != 0)
        DT_CHECK(dt__ring_block_bwd(&a->g, q, k, v, go, lse, dd, i * a->C, j * a->C, a->C,
                                    mode == 2, dq, dk, dv, scr));
    }
  return DT_SUCCESS;
}

static void dt__ra_count(const dt__ring_call_t* a, dt_collective_t c, uint64_t nbytes) {
  dt__count_collective(a->mesh, 1u << a->dim, c, nbytes);
}

dt_status_t dt__ring_xfer_start(const dt__ring_link_t* l, dt__ring_xfer_t* x, int npairs,
                                const void* const* send, void* const* recv, const int64_t* count,
                                const int64_t* rcount, dt_dtype_t dtype) {
  memset(x, 0, sizeof *x);
  if (rcount == NULL) rcount = count;
  uint64_t nbytes = 0;
  for (int i = 0; i < npairs; i++) nbytes += (uint64_t)count[i] * dt__itemsize(dtype);
  dt__count_collective(l->mesh, 1u << l->dim, DT_COLL_SEND_RECV, nbytes);
  if (l->sim) {
    x->end = dt__sim_collective(l->mesh, 1u << l->dim, DT_COLL_SEND_RECV, DT_ALGO_NATIVE, l->n,
                                nbytes, 1);
    return DT_SUCCESS;
  }
  dt_comm_t* c = l->comm;
  const int next = (l->r + 1) % l->n, prev = (l->r + l->n - 1) % l->n;
  /* one group: NCCL issues the pairs together at group_end, so they run while this step's
   * compute does (MPI posts each at once either way) */
  dt_status_t st = c->iface->group_start ? c->iface->group_start(c) : DT_SUCCESS;
  for (int i = 0; i < npairs && st == DT_SUCCESS; i++) {
    x->npairs = i + 1; /* what was posted is waited for, even after a failure */
    st = c->iface->recv(c, recv[i], rcount[i], dtype, prev, &x->req[2 * i]);
    if (st == DT_SUCCESS)
      st = c->iface->send(c, send[i], count[i], dtype, next, &x->req[2 * i + 1]);
  }
  if (c->iface->group_end != NULL) {
    dt_status_t e = c->iface->group_end(c);
    if (st == DT_SUCCESS) st = e;
  }
  return st;
}

dt_status_t dt__ring_xfer_finish(const dt__ring_link_t* l, dt__ring_xfer_t* x) {
  if (l->sim) {
    dt__sim_wait_until(x->end);
    return DT_SUCCESS;
  }
  dt_status_t st = DT_SUCCESS;
  for (int i = 0; i < 2 * x->npairs; i++) {
    dt_status_t s2 = l->comm->iface->wait(l->comm, &x->req[i]);
    if (st == DT_SUCCESS) st = s2;
    l->comm->iface->req_free(&x->req[i]);
  }
  x->npairs = 0;
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * forward */

dt_status_t dt__ring_as(const dt__ring_link_t* l, const void* src, dt_dtype_t from, dt_dtype_t to,
                        int64_t n, void* work, const void** out) {
  *out = from == to ? src : work;
  if (from == to || l->sim || n == 0) return DT_SUCCESS;
  return l->bk->iface->convert(l->bk, src, from, work, to, n);
}

/* n elements of dtype `from` at *p as the blocks take them (g.dt): *p itself, or converted into
 * work (n elements of g.dt). */
static dt_status_t dt__ra_in(const dt__ring_call_t* a, dt_dtype_t from, int64_t n, void* work,
                             const void** p) {
  return dt__ring_as(&a->link, *p, from, a->g.dt, n, work, p);
}

/* A k/v shard's k (at k) and v (at v) as the blocks take them: the shard itself, or converted
 * into kvf (k's nk, then v's nv). */
static dt_status_t dt__ra_kv_in(const dt__ring_call_t* a, const void* k, const void* v,
                                void* kvf, const void** kc, const void** vc) {
  *kc = k;
  *vc = v;
  dt_status_t st = dt__ra_in(a, a->kvt, a->nk, kvf, kc);
  if (st == DT_SUCCESS)
    st = dt__ra_in(a, a->kvt, a->nv,
                   kvf ? (char*)kvf + dt__itemsize(a->g.dt) * (size_t)a->nk : NULL, vc);
  return st;
}

/* Scratch for n elements of dtype `from` converted to the blocks' dtype (none when they take
 * `from`); *need counts the buffers asked for. */
static void* dt__ra_in_mem(const dt__ring_call_t* a, dt__ring_mem_t* mm, dt_dtype_t from,
                           int64_t n, int* need) {
  if (from == a->g.dt) return NULL;
  ++*need;
  return dt__ring_mem_alloc(mm, dt__itemsize(a->g.dt) * (size_t)n, 0);
}

/* A tensor read once per call (q; backward also o and the output's gradient, each of its own
 * dtype) as the blocks take it, converted into work where needed (priced on the simulated
 * clock: the per-step conversions of k/v shards are priced with their blocks). */
static dt_status_t dt__ra_once_in(const dt__ring_call_t* a, const dt_local_tensor_t* t,
                                  void* work, const void** p) {
  const int64_t n = dt__local_numel(t);
  if (a->link.sim && t->dtype != a->g.dt) dt__sim_compute(dt__ring_conv_us(t->dtype, a->g.dt, n));
  return dt__ra_in(a, t->dtype, n, work, p);
}

/* Element i of a buffer of k/v's dtype. */
static void* dt__ra_at(const dt__ring_call_t* a, const void* p, int64_t i) {
  return (char*)p + dt__itemsize(a->kvt) * (size_t)i;
}

dt_status_t dt__ring_forward(const dt__ring_call_t* a, const dt_local_tensor_t* q,
                             const dt_local_tensor_t* k, const dt_local_tensor_t* v,
                             const dt_local_tensor_t* o, const dt_local_tensor_t* lse) {
  const dt__ring_geom_t* g = &a->g;
  const int n = a->link.n;
  int algo;
  DT_CHECK(dt__ra_algo(a, &algo));
  const int64_t rows = g->B * g->H * g->S;
  const unsigned mask = 1u << a->dim;
  const size_t it = dt__itemsize(a->kvt);
  dt__ring_mem_t mm = {.b = g->bk};
  float* scr = dt__ring_mem_alloc(&mm, dt__ring_block_scratch(g, a->C), 0);
  float* l = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)rows, 1);
  void *kb = NULL, *vb = NULL, *kb2 = NULL, *vb2 = NULL; /* shards in k and v's dtype */
  int need = 2;
  if (algo == DT_RING_GATHER) {
    kb = dt__ring_mem_alloc(&mm, it * (size_t)(a->nk * n), 0);
    vb = dt__ring_mem_alloc(&mm, it * (size_t)(a->nv * n), 0);
    need += 2;
  } else if (n > 1) {
    kb = dt__ring_mem_alloc(&mm, it * (size_t)a->nk, 0);
    vb = dt__ring_mem_alloc(&mm, it * (size_t)a->nv, 0);
    kb2 = dt__ring_mem_alloc(&mm, it * (size_t)a->nk, 0);
    vb2 = dt__ring_mem_alloc(&mm, it * (size_t)a->nv, 0);
    need += 4;
  }
  /* f32 values of a shard and of q where the blocks take f32 of another dtype */
  void* kvf = dt__ra_in_mem(a, &mm, a->kvt, a->nk + a->nv, &need);
  void* qf = dt__ra_in_mem(a, &mm, q->dtype, dt__local_numel(q), &need);
  int ok = 1;
  const void* qd = dt__ring_mem_host(&a->link, &mm, q, 1, &ok);
  const void *kd = dt__ring_mem_host(&a->link, &mm, k, 1, &ok),
             *vd = dt__ring_mem_host(&a->link, &mm, v, 1, &ok);
  float *od = dt__ring_mem_host(&a->link, &mm, o, 0, &ok),
        *m = dt__ring_mem_host(&a->link, &mm, lse, 0, &ok);
  need += a->link.stage ? 5 : 0;
  dt_status_t st = mm.n == need && ok
                       ? DT_SUCCESS
                       : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: %zu bytes of scratch", kRingOp,
                                 dt__ring_block_scratch(g, a->C));
  /* the local preparation before the ring: a rank short of memory or failing here must not
   * leave the others in it */
  if (st == DT_SUCCESS && !a->link.sim) {
    st = g->bk->iface->memset(g->bk, od, 0, sizeof(float) * (size_t)dt__local_numel(o));
    if (st == DT_SUCCESS) st = g->bk->iface->fill(g->bk, m, DT_F32, rows, -INFINITY);
  }
  if (st == DT_SUCCESS) st = dt__ra_once_in(a, q, qf, &qd);
  st = dt__mesh_agree(a->mesh, st, kRingOp);
  if (st != DT_SUCCESS) {
    dt__ring_mem_free(&mm);
    return st;
  }
  const void *kc = NULL, *vc = NULL; /* the shard at hand as the blocks take it */
  if (algo == DT_RING_GATHER) {
    int64_t ck[DT_MAX_RANKS_CP], dk[DT_MAX_RANKS_CP], cv[DT_MAX_RANKS_CP], dv[DT_MAX_RANKS_CP];
    for (int j = 0; j < n; j++) {
      ck[j] = a->nk;
      dk[j] = a->nk * j;
      cv[j] = a->nv;
      dv[j] = a->nv * j;
    }
    if (!a->link.sim) {
      /* entered whatever came before (the peers are in it); the first failure kept */
      dt_status_t e = a->link.comm->iface->all_gather_v(a->link.comm, kd, kb, ck, dk, a->kvt, NULL);
      if (e == DT_SUCCESS)
        e = a->link.comm->iface->all_gather_v(a->link.comm, vd, vb, cv, dv, a->kvt, NULL);
      if (st == DT_SUCCESS) st = e;
    } else {
      dt__sim_collective(a->mesh, mask, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, n,
                         (uint64_t)(a->nk * n) * it, 0);
      dt__sim_collective(a->mesh, mask, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, n,
                         (uint64_t)(a->nv * n) * it, 0);
    }
    dt__ra_count(a, DT_COLL_ALL_GATHER, (uint64_t)(a->nk * n) * it);
    dt__ra_count(a, DT_COLL_ALL_GATHER, (uint64_t)(a->nv * n) * it);
    for (int s = 0; s < n && st == DT_SUCCESS; s++) {
      st = dt__ra_kv_in(a, dt__ra_at(a, kb, a->nk * s), dt__ra_at(a, vb, a->nv * s), kvf, &kc,
                        &vc);
      dt__ra_sim_compute(a, s, 0);
      if (!a->link.sim && st == DT_SUCCESS)
        st = dt__ra_fwd_blocks(a, s, qd, kc, vc, od, m, l, scr);
    }
  } else {
    const void *cur_k = kd, *cur_v = vd;
    void* bufk[2] = {kb, kb2};
    void* bufv[2] = {vb, vb2};
    for (int t = 0; t < n && st == DT_SUCCESS; t++) {
      const int s = (a->link.r - t + n) % n, more = t + 1 < n;
      dt__ring_xfer_t x;
      if (more) { /* the next shard in while this one's blocks run */
        const void* snd[2] = {cur_k, cur_v};
        void* rcv[2] = {bufk[t % 2], bufv[t % 2]};
        const int64_t cnt[2] = {a->nk, a->nv};
        st = dt__ring_xfer_start(&a->link, &x, 2, snd, rcv, cnt, NULL, a->kvt);
      }
      if (st == DT_SUCCESS) st = dt__ra_kv_in(a, cur_k, cur_v, kvf, &kc, &vc);
      dt__ra_sim_compute(a, s, 0);
      if (!a->link.sim && st == DT_SUCCESS)
        st = dt__ra_fwd_blocks(a, s, qd, kc, vc, od, m, l, scr);
      if (more) {
        dt_status_t w = dt__ring_xfer_finish(&a->link, &x);
        if (st == DT_SUCCESS) st = w;
        cur_k = bufk[t % 2];
        cur_v = bufv[t % 2];
      }
    }
  }
  if (st == DT_SUCCESS && !a->link.sim) st = dt__ring_finish(g, od, m, l, m);
  if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->link, o, od);
  if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->link, lse, m);
  dt__ring_mem_free(&mm);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * backward */

static dt_status_t dt__ra_bwd_ring(const dt__ring_call_t* a, const void* qd, const void* kd,
                                   const void* vd, const void* god, const float* ls,
                                   const float* dd, float* dqd, float* dkd, float* dvd, float* scr,
                                   void* const* kvbuf, void* kvf, float* const* acc, float* tmp);

dt_status_t dt__ring_backward(const dt__ring_call_t* a, const dt_local_tensor_t* q,
                              const dt_local_tensor_t* k, const dt_local_tensor_t* v,
                              const dt_local_tensor_t* o, const dt_local_tensor_t* go,
                              const dt_local_tensor_t* lse, const dt_local_tensor_t* dq,
                              const dt_local_tensor_t* dk, const dt_local_tensor_t* dv) {
  const dt__ring_geom_t* g = &a->g;
  const int n = a->link.n;
  int algo;
  DT_CHECK(dt__ra_algo(a, &algo));
  const int64_t rows = g->B * g->H * g->S, nkv = a->nk + a->nv;
  const unsigned mask = 1u << a->dim;
  const size_t it = dt__itemsize(a->kvt);
  dt__ring_mem_t mm = {.b = g->bk};
  float* scr = dt__ring_mem_alloc(&mm, dt__ring_block_scratch(g, a->C), 0);
  float* dd = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)rows, 0);
  /* k and v travel in their dtype (kvbuf, all), their gradients in f32 (acc, dall) */
  void *all = NULL, *kvbuf[2] = {NULL, NULL};
  float *dall = NULL, *acc[2] = {NULL, NULL}, *tmp = NULL;
  int need = 2;
  if (algo == DT_RING_GATHER) {
    all = dt__ring_mem_alloc(&mm, it * (size_t)(nkv * n), 0);
    dall = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)(nkv * n), 1);
    need += 2;
  } else if (n > 1) {
    for (int i = 0; i < 2; i++) {
      kvbuf[i] = dt__ring_mem_alloc(&mm, it * (size_t)nkv, 0);
      acc[i] = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)nkv, 0);
    }
    tmp = dt__ring_mem_alloc(&mm, sizeof(float) * (size_t)nkv, 0);
    need += 5;
  }
  /* f32 values of a shard, of q, o and go where the blocks take f32 of another dtype */
  void* kvf = dt__ra_in_mem(a, &mm, a->kvt, nkv, &need);
  void* qf = dt__ra_in_mem(a, &mm, q->dtype, dt__local_numel(q), &need);
  void* of = dt__ra_in_mem(a, &mm, o->dtype, dt__local_numel(o), &need);
  void* gof = dt__ra_in_mem(a, &mm, go->dtype, dt__local_numel(go), &need);
  int ok = 1;
  const void *qd = dt__ring_mem_host(&a->link, &mm, q, 1, &ok),
             *odat = dt__ring_mem_host(&a->link, &mm, o, 1, &ok),
             *god = dt__ring_mem_host(&a->link, &mm, go, 1, &ok);
  const float* ls = dt__ring_mem_host(&a->link, &mm, lse, 1, &ok);
  const void *kd = dt__ring_mem_host(&a->link, &mm, k, 1, &ok),
             *vd = dt__ring_mem_host(&a->link, &mm, v, 1, &ok);
  float *dqd = dt__ring_mem_host(&a->link, &mm, dq, 0, &ok),
        *dkd = dt__ring_mem_host(&a->link, &mm, dk, 0, &ok),
        *dvd = dt__ring_mem_host(&a->link, &mm, dv, 0, &ok);
  need += a->link.stage ? 9 : 0;
  dt_status_t st = mm.n == need && ok
                       ? DT_SUCCESS
                       : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s (backward): scratch of %lld key/value "
                                 "elements", kRingOp, (long long)(nkv * (n + 1)));
  /* the local preparation, then the agreement (as in the forward) */
  if (st == DT_SUCCESS) st = dt__ra_once_in(a, q, qf, &qd);
  if (st == DT_SUCCESS) st = dt__ra_once_in(a, o, of, &odat);
  if (st == DT_SUCCESS) st = dt__ra_once_in(a, go, gof, &god);
  if (!a->link.sim && st == DT_SUCCESS) {
    dt_backend_t bk = g->bk;
    st = dt__ring_rowdot(g, odat, god, dd);
    if (st == DT_SUCCESS)
      st = bk->iface->memset(bk, dqd, 0, sizeof(float) * (size_t)dt__local_numel(dq));
    if (st == DT_SUCCESS) st = bk->iface->memset(bk, dkd, 0, sizeof(float) * (size_t)a->nk);
    if (st == DT_SUCCESS) st = bk->iface->memset(bk, dvd, 0, sizeof(float) * (size_t)a->nv);
  }
  st = dt__mesh_agree(a->mesh, st, kRingOp);
  if (st != DT_SUCCESS) {
    dt__ring_mem_free(&mm);
    return st;
  }
  const void *kc = NULL, *vc = NULL; /* the shard at hand as the blocks take it */
  if (algo == DT_RING_GATHER) {
    int64_t cnt[DT_MAX_RANKS_CP], dsp[DT_MAX_RANKS_CP];
    for (int pass = 0; pass < 2 && st == DT_SUCCESS; pass++) { /* k, then v, into `all` */
      const int64_t e = pass ? a->nv : a->nk;
      for (int j = 0; j < n; j++) {
        cnt[j] = e;
        dsp[j] = (pass ? a->nk * n : 0) + e * j;
      }
      if (!a->link.sim)
        st = a->link.comm->iface->all_gather_v(a->link.comm, pass ? vd : kd, all, cnt, dsp,
                                               a->kvt, NULL);
      else
        dt__sim_collective(a->mesh, mask, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, n,
                           (uint64_t)(e * n) * it, 0);
      dt__ra_count(a, DT_COLL_ALL_GATHER, (uint64_t)(e * n) * it);
    }
    for (int s = 0; s < n && st == DT_SUCCESS; s++) {
      st = dt__ra_kv_in(a, dt__ra_at(a, all, a->nk * s), dt__ra_at(a, all, a->nk * n + a->nv * s),
                        kvf, &kc, &vc);
      dt__ra_sim_compute(a, s, 1);
      if (!a->link.sim && st == DT_SUCCESS)
        st = dt__ra_bwd_blocks(a, s, qd, kc, vc, god, ls, dd, dqd, dall + a->nk * s,
                               dall + a->nk * n + a->nv * s, scr);
    }
    for (int pass = 0; pass < 2 && st == DT_SUCCESS; pass++) { /* the sums of the dk, dv shards */
      const int64_t e = pass ? a->nv : a->nk;
      for (int j = 0; j < n; j++) cnt[j] = e;
      if (!a->link.sim)
        st = a->link.comm->iface->reduce_scatter_v(a->link.comm, dall + (pass ? a->nk * n : 0),
                                              pass ? dvd : dkd, cnt, DT_F32, DT_REDUCE_SUM, NULL);
      else
        dt__sim_collective(a->mesh, mask, DT_COLL_REDUCE_SCATTER, DT_ALGO_NATIVE, n,
                           (uint64_t)(e * n) * sizeof(float), 0);
      dt__ra_count(a, DT_COLL_REDUCE_SCATTER, (uint64_t)(e * n) * sizeof(float));
    }
  } else if (n == 1) {
    if (st == DT_SUCCESS) st = dt__ra_kv_in(a, kd, vd, kvf, &kc, &vc);
    dt__ra_sim_compute(a, a->link.r, 1);
    if (!a->link.sim && st == DT_SUCCESS)
      st = dt__ra_bwd_blocks(a, a->link.r, qd, kc, vc, god, ls, dd, dqd, dkd, dvd, scr);
  } else {
    /* entered whatever came before (the peers are in it); the first failure kept */
    dt_status_t e =
        dt__ra_bwd_ring(a, qd, kd, vd, god, ls, dd, dqd, dkd, dvd, scr, kvbuf, kvf, acc, tmp);
    if (st == DT_SUCCESS) st = e;
  }
  if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->link, dq, dqd);
  if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->link, dk, dkd);
  if (st == DT_SUCCESS) st = dt__ring_mem_out(&a->link, dv, dvd);
  dt__ring_mem_free(&mm);
  return st;
}

/* The backward ring (n > 1): k/v of rank s = r - t at step t, its gradient accumulator one step
 * behind; dk, dv get this rank's own shard's gradient when it comes home. */
static dt_status_t dt__ra_bwd_ring(const dt__ring_call_t* a, const void* qd, const void* kd,
                                   const void* vd, const void* god, const float* ls,
                                   const float* dd, float* dqd, float* dkd, float* dvd, float* scr,
                                   void* const* kvbuf, void* kvf, float* const* acc, float* tmp) {
  const int n = a->link.n;
  const int64_t nkv = a->nk + a->nv;
  dt_backend_t bk = a->g.bk;
  dt_status_t st = DT_SUCCESS;
  const void *cur_k = kd, *cur_v = vd;
  dt__ring_xfer_t kvx, ax; /* ax: the accumulator's receive and send in flight */
  int acc_inflight = 0;
  for (int t = 0; t < n && st == DT_SUCCESS; t++) {
    const int s = (a->link.r - t + n) % n, more = t + 1 < n;
    float* A = acc[t % 2];
    if (more) {
      const void* snd[2] = {cur_k, cur_v};
      void* rcv[2] = {kvbuf[t % 2], dt__ra_at(a, kvbuf[t % 2], a->nk)};
      const int64_t cnt[2] = {a->nk, a->nv};
      st = dt__ring_xfer_start(&a->link, &kvx, 2, snd, rcv, cnt, NULL, a->kvt);
    }
    /* this step's contribution to shard s's gradient: straight into the accumulator at t = 0,
     * else into scratch while the accumulator arrives */
    float* into = t == 0 ? A : tmp;
    const void *kc = NULL, *vc = NULL;
    if (st == DT_SUCCESS) st = dt__ra_kv_in(a, cur_k, cur_v, kvf, &kc, &vc);
    if (!a->link.sim && st == DT_SUCCESS) {
      st = bk->iface->memset(bk, into, 0, sizeof(float) * (size_t)nkv);
      if (st == DT_SUCCESS)
        st = dt__ra_bwd_blocks(a, s, qd, kc, vc, god, ls, dd, dqd, into, into + a->nk, scr);
    }
    dt__ra_sim_compute(a, s, 1);
    if (acc_inflight) { /* the accumulator of shard s (into A) and the previous send */
      dt_status_t w = dt__ring_xfer_finish(&a->link, &ax);
      if (st == DT_SUCCESS) st = w;
      if (st == DT_SUCCESS && !a->link.sim)
        st = bk->iface->reduce(bk, A, A, tmp, DT_F32, nkv, DT_REDUCE_SUM);
      acc_inflight = 0;
    }
    /* shard s's accumulator on to r + 1; the next one (or, after the last step, this rank's
     * own, home) from r - 1 */
    if (st == DT_SUCCESS) {
      const void* snd[1] = {A};
      void* rcv[1] = {acc[(t + 1) % 2]};
      const int64_t cnt[1] = {nkv};
      st = dt__ring_xfer_start(&a->link, &ax, 1, snd, rcv, cnt, NULL, DT_F32);
      acc_inflight = 1; /* whatever was posted is completed below */
    }
    if (more) {
      dt_status_t w = dt__ring_xfer_finish(&a->link, &kvx);
      if (st == DT_SUCCESS) st = w;
      cur_k = kvbuf[t % 2];
      cur_v = dt__ra_at(a, kvbuf[t % 2], a->nk);
    }
  }
  if (acc_inflight) {
    dt_status_t w = dt__ring_xfer_finish(&a->link, &ax);
    if (st == DT_SUCCESS) st = w;
  }
  if (st == DT_SUCCESS && !a->link.sim) { /* home: this rank's shard's gradient */
    const float* home = acc[n % 2];
    st = bk->iface->copy(bk, dkd, home, sizeof(float) * (size_t)a->nk, DT_COPY_D2D);
    if (st == DT_SUCCESS)
      st = bk->iface->copy(bk, dvd, home + a->nk, sizeof(float) * (size_t)a->nv, DT_COPY_D2D);
  }
  return st;
}

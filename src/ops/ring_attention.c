/* ring_attention.c - context parallelism's attention (op "ring_attention", dt_ring_attention):
 * q, k, v sharded on the sequence over one mesh dim (the cp dim, n ranks), attention computed
 * block by block. This file checks the call, moves the inputs to their placements, makes the
 * outputs and holds the backward rule; the ring itself and the block kernels are in
 * kernels_ring.c (docs/design.md, "Context parallelism").
 *
 * Layout. With `balanced`, the global sequence is in the load-balanced order: 2n chunks of
 * C = S / 2n rows, rank r holding chunks r and 2n-1-r (dt_cp_position); otherwise rank r holds
 * chunk r of n. A query chunk a and a key chunk b are a full block (b < a, or not causal), the
 * causal diagonal (b == a), or skipped (b > a): balanced, every rank computes the same number of
 * blocks at every ring step but its own (2 of the 4 chunk pairs).
 *
 * Forward, ring (algo 1): at step t = 0 .. n-1 this rank holds the key/value shard of rank
 * s = r - t (mod n); before computing its blocks it posts the shard's send to r + 1 and the
 * receive of the next from r - 1 (two buffers), then merges the blocks into running row maxima
 * and sums; at the end o /= l and the rows' log-sum-exp is kept (the saved by-product) for the
 * backward pass. Backward, ring: the key/value shards travel the same way, and each shard's
 * gradient accumulator travels one step behind it: at step t the blocks' dk, dv are computed
 * into a scratch shard while the accumulator of that shard arrives from r - 1, then added to it
 * and sent on to r + 1; after n steps every accumulator is home. Traffic per rank: forward n-1
 * shards of k and v; backward n-1 of k and v and n of their gradients.
 * All-gather (algo 2): k and v gathered once (n shards of memory), every block computed locally;
 * backward gathers them again and reduce-scatters the n gradient shards.
 * algo 0 picks the cheaper under the cost model (send_recv and all_gather on the mesh dim) and
 * the compute model (the ring's transfers hide behind a step's blocks when they take longer).
 *
 * Simulated runs (the meta backend): nothing computed or sent; the scratch is allocated as the
 * real run would, the traffic counted, the steps priced on the simulated clock with the overlap
 * of the ring. Device backends compute in device memory and ring over the mesh's NCCL plane,
 * or stage through host memory where the plane is MPI (kernels_ring.c). bf16/f16 inputs: k and
 * v travel in their own dtype (half a f32 ring's bytes); the blocks read q, k, v (backward: o
 * and its gradient too) as stored where the backend's fused kernels take that dtype (the CUDA
 * tensor-core kernels under DTENSOR_SDPA_PATH=flash), else f32 copies made where the blocks run
 * (kernels_ring.c); either way they accumulate in f32: the running output, lse and the
 * gradients, cast back to the inputs' dtype at the end (lse stays f32). The gradient
 * accumulators of k and v travel in f32 (sums over the ring, as a reduce-scatter's).
 */
#include <math.h>
#include <string.h>

#include "mesh/mesh.h"
#include "ops/ops.h"

static const char* const kOp = "ring_attention";

static dt_status_t dt__ra_args(int n_iargs, const int64_t* iargs, int n_fargs, const double* fargs,
                               dt_mesh_t mesh, dt__ring_call_t* a) {
  const int id = DT_OP_RING_ATTENTION;
  const int64_t d0 = dt__op_iarg_n(id, n_iargs, iargs, 0);
  const int64_t causal = dt__op_iarg_n(id, n_iargs, iargs, 1),
                layout = dt__op_iarg_n(id, n_iargs, iargs, 2),
                balanced = dt__op_iarg_n(id, n_iargs, iargs, 3),
                algo = dt__op_iarg_n(id, n_iargs, iargs, 4);
  const int64_t d = d0 < 0 ? d0 + mesh->ndim : d0;
  if (d0 == DT_OP_IARG_NONE || d < 0 || d >= mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: mesh_dim=%lld (iargs[0]) out of range for a %d-dim "
                   "mesh (valid: %d to %d)", kOp, (long long)d0, mesh->ndim, -mesh->ndim,
                   mesh->ndim - 1);
  if ((causal != 0 && causal != 1) || (layout != 0 && layout != 1) ||
      (balanced != 0 && balanced != 1) || algo < 0 || algo > 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: causal=%lld, layout=%lld, balanced=%lld, algo=%lld "
                   "(iargs[1..4]): expected 0 or 1, 0 (B, H, S, D) or 1 (B, S, H, D), 0 or 1, "
                   "0 (auto), 1 (ring) or 2 (all-gather)", kOp, (long long)causal,
                   (long long)layout, (long long)balanced, (long long)algo);
  a->dim = (int)d;
  a->causal = (int)causal;
  a->layout = (int)layout;
  a->balanced = (int)balanced;
  a->algo = (int)algo;
  a->hd = layout ? 2 : 1;
  a->sd = layout ? 1 : 2;
  a->scale = n_fargs > 0 && fargs != NULL ? fargs[0] : NAN;
  if (isinf(a->scale))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: scale=%g (fargs[0]): expected a finite number (absent "
                   "or NaN: 1/sqrt(D))", kOp, a->scale);
  a->mesh = mesh;
  return DT_SUCCESS;
}

/* Shapes, dtypes, and the placements the inputs move to. */
static dt_status_t dt__ra_plan(dt__ring_call_t* a, dt_tensor_t q, dt_tensor_t k, dt_tensor_t v) {
  const int64_t *qs = q->layout.shape, *ks = k->layout.shape, *vs = v->layout.shape;
  const int hd = a->hd, sd = a->sd;
  if (k->mesh != q->mesh || v->mesh != q->mesh)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: q, k and v must be tensors of one mesh", kOp);
  if (q->layout.ndim != 4 || k->layout.ndim != 4 || v->layout.ndim != 4)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: q, k, v must be 4-dim (%s)", kOp,
                   a->layout ? "B, S, H, D" : "B, H, S, D");
  if (!dt__dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: q, k, v must share one float dtype", kOp);
  if (ks[0] != qs[0] || vs[0] != qs[0] || ks[3] != qs[3] || vs[hd] != ks[hd] || vs[sd] != ks[sd])
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: shapes q %lldx%lldx%lldx%lld, k %lldx%lldx%lldx%lld "
                   "and v %lldx%lldx%lldx%lld do not match", kOp, (long long)qs[0],
                   (long long)qs[1], (long long)qs[2], (long long)qs[3], (long long)ks[0],
                   (long long)ks[1], (long long)ks[2], (long long)ks[3], (long long)vs[0],
                   (long long)vs[1], (long long)vs[2], (long long)vs[3]);
  if (ks[hd] == 0 || qs[hd] % ks[hd] != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %lld query heads are not a multiple of %lld kv heads",
                   kOp, (long long)qs[hd], (long long)ks[hd]);
  if (ks[sd] != qs[sd])
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: q has %lld positions, k %lld: the ring shards one "
                   "sequence (self-attention)", kOp, (long long)qs[sd], (long long)ks[sd]);
  dt_mesh_t mesh = a->mesh;
  const int n = mesh->shape[a->dim];
  const int64_t parts = a->balanced ? 2 * (int64_t)n : n;
  if (qs[sd] % parts != 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: a sequence of %lld tokens does not split into %lld "
                   "equal chunks (%s over mesh dim %d of %d ranks): pad it to a multiple of "
                   "%lld", kOp, (long long)qs[sd], (long long)parts,
                   a->balanced ? "2 per rank, load-balanced" : "1 per rank", a->dim, n,
                   (long long)parts);
  int64_t head_parts = 1;
  for (int i = 0; i < mesh->ndim; i++) {
    const dt_placement_t p = q->layout.pl[i];
    if (i == a->dim)
      a->pl[i] = dt_shard(sd);
    else if (p.kind == DT_SHARD && (p.dim == 0 || p.dim == hd))
      a->pl[i] = p;
    else
      a->pl[i] = dt_replicate();
    if (i != a->dim && a->pl[i].kind == DT_SHARD && a->pl[i].dim == hd)
      head_parts *= mesh->shape[i];
  }
  if (qs[hd] % head_parts != 0 || ks[hd] % head_parts != 0) /* heads that do not split evenly */
    for (int i = 0; i < mesh->ndim; i++)
      if (i != a->dim && a->pl[i].kind == DT_SHARD && a->pl[i].dim == hd) a->pl[i] = dt_replicate();
  for (int i = 0; i < mesh->ndim; i++)
    a->lse_pl[i] = a->pl[i].kind != DT_SHARD ? dt_replicate()
                   : a->pl[i].dim == 0       ? dt_shard(0)
                   : a->pl[i].dim == hd      ? dt_shard(1)
                                             : dt_shard(2);
  return DT_SUCCESS;
}

dt_status_t dt__ring_attention_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                   const int64_t* iargs, int n_fargs, const double* fargs,
                                   dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  dt__ring_call_t a;
  memset(&a, 0, sizeof a);
  dt_mesh_t mesh = in[0]->mesh;
  DT_CHECK(dt__ra_args(n_iargs, iargs, n_fargs, fargs, mesh, &a));
  DT_CHECK(dt__ra_plan(&a, in[0], in[1], in[2]));
  if (mesh->shape[a.dim] > DT_MAX_RANKS_CP)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: mesh dim %d has %d ranks, at most %d", kOp, a.dim,
                   mesh->shape[a.dim], DT_MAX_RANKS_CP);
  int64_t oshape[4], lshape[3];
  memcpy(oshape, in[0]->layout.shape, sizeof oshape);
  oshape[3] = in[2]->layout.shape[3];
  lshape[0] = oshape[0];
  lshape[1] = oshape[a.hd];
  lshape[2] = oshape[a.sd];
  int meta = in[0]->meta || in[1]->meta || in[2]->meta;
  const dt_dtype_t w = in[0]->dtype; /* the output accumulates in f32: cast back at the end */
  dt_tensor_t o = NULL, lse = NULL, mv[3] = {NULL, NULL, NULL}, x[3];
  dt_status_t st = DT_SUCCESS;
  /* the inputs' moves run on meta tensors too: a dry run (dtensor-explain) shows them */
  for (int t = 0; t < 3 && st == DT_SUCCESS; t++) {
    dt__trace_input(t); /* a trace names the input being moved */
    st = dt__op_move_to(in[t], a.pl, &x[t], &mv[t]);
  }
  dt__trace_input(-1);
  if (meta) { /* layouts only */
    if (st == DT_SUCCESS) st = dt__tensor_meta(mesh, w, 4, oshape, a.pl, &o);
    if (st == DT_SUCCESS && saved) st = dt__tensor_meta(mesh, DT_F32, 3, lshape, a.lse_pl, &lse);
    goto done;
  }
  if (st == DT_SUCCESS) st = dt__tensor_new(mesh, DT_F32, 4, oshape, a.pl, 0, &o);
  if (st == DT_SUCCESS) st = dt__tensor_new(mesh, DT_F32, 3, lshape, a.lse_pl, 0, &lse);
  /* an output one rank could not allocate must not leave the others in the ring */
  if (mesh->member) st = dt__mesh_agree(mesh, st, kOp);
  if (st == DT_SUCCESS && mesh->member) {
    dt_local_tensor_t lv[5];
    const dt_tensor_t t5[5] = {x[0], x[1], x[2], o, lse};
    for (int t = 0; t < 5; t++) dt__tensor_local_view(t5[t], &lv[t]);
    st = dt__ring_setup(&a, &lv[0], &lv[1], &lv[2]);
    if (st == DT_SUCCESS) st = dt__ring_forward(&a, &lv[0], &lv[1], &lv[2], &lv[3], &lv[4]);
  }
  if (st == DT_SUCCESS) st = dt__op_cast_in_place(&o, w);
done:
  for (int t = 0; t < 3; t++) dt__tensor_free(mv[t]);
  if (st != DT_SUCCESS) {
    dt__tensor_free(o);
    dt__tensor_free(lse);
    return st;
  }
  out[0] = o;
  if (saved)
    *saved = lse;
  else
    dt__tensor_free(lse);
  return DT_SUCCESS;
}

dt_status_t dt__bw_ring_attention(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (gout[0] == NULL || !(c->needs[0] || c->needs[1] || c->needs[2])) return DT_SUCCESS;
  if (c->saved == NULL) return DT_FAIL(DT_ERR_INTERNAL, "%s node without its log-sum-exp", kOp);
  dt__ring_call_t a;
  memset(&a, 0, sizeof a);
  dt_mesh_t mesh = c->in[0]->mesh;
  DT_CHECK(dt__ra_args(c->n_iargs, c->iargs, c->n_fargs, c->fargs, mesh, &a));
  DT_CHECK(dt__ra_plan(&a, c->in[0], c->in[1], c->in[2]));
  dt_tensor_t mv[5] = {NULL}, x[5], gr[3] = {NULL, NULL, NULL}; /* x: as they are */
  const dt_tensor_t src[5] = {c->in[0], c->in[1], c->in[2], c->out[0], gout[0]};
  int meta = 0;
  for (int t = 0; t < 5; t++) meta |= src[t]->meta;
  dt_status_t st = DT_SUCCESS;
  for (int t = 0; t < 3 && st == DT_SUCCESS; t++)
    st = meta ? dt__tensor_meta(mesh, src[t]->dtype, 4, src[t]->layout.shape, a.pl, &gr[t])
              : dt__tensor_new(mesh, DT_F32, 4, src[t]->layout.shape, a.pl, 0, &gr[t]);
  if (meta) goto done;
  for (int t = 0; t < 5 && st == DT_SUCCESS; t++) st = dt__op_move_to(src[t], a.pl, &x[t], &mv[t]);
  if (mesh->member) st = dt__mesh_agree(mesh, st, kOp); /* as in the forward */
  if (st == DT_SUCCESS && mesh->member) {
    dt_local_tensor_t lv[9];
    const dt_tensor_t t9[9] = {x[0], x[1], x[2], x[3], x[4], c->saved, gr[0], gr[1], gr[2]};
    for (int t = 0; t < 9; t++) dt__tensor_local_view(t9[t], &lv[t]);
    st = dt__ring_setup(&a, &lv[0], &lv[1], &lv[2]);
    if (st == DT_SUCCESS)
      st = dt__ring_backward(&a, &lv[0], &lv[1], &lv[2], &lv[3], &lv[4], &lv[5], &lv[6], &lv[7],
                             &lv[8]);
  }
  for (int t = 0; t < 3 && st == DT_SUCCESS; t++) /* each gradient in its input's dtype */
    if (c->needs[t]) st = dt__op_cast_in_place(&gr[t], src[t]->dtype);
done:
  for (int t = 0; t < 5; t++) dt__tensor_free(mv[t]);
  if (st != DT_SUCCESS) {
    for (int t = 0; t < 3; t++) dt__tensor_free(gr[t]);
    return st;
  }
  for (int t = 0; t < 3; t++) {
    if (c->needs[t])
      gin[t] = gr[t];
    else
      dt__tensor_free(gr[t]);
  }
  return DT_SUCCESS;
}

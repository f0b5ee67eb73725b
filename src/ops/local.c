/* local.c - rank-local tensors: the ops that leave and re-enter the distributed world for data
 * whose shape is not a function of the global shape (the rows each rank sends to each expert
 * under expert parallelism), and the ragged all-to-all that moves such rows over a mesh dim.
 *
 * A rank-local tensor is an ordinary tensor of the mesh whose placements are all Replicate but
 * whose value (and shape) belongs to this rank alone, like a plain tensor inside torch's
 * local_map. Every op runs on it locally (each op has an all-Replicate rule that moves nothing,
 * and selection prefers it); redistributing or gathering one means nothing. Three composites:
 *   to_local (x; grad placements?)     x's local shard as a rank-local tensor (a view). Backward:
 *                                      the gradient becomes the local shard of a tensor with x's
 *                                      global shape and the grad placements (default x's own;
 *                                      Partial(sum) where ranks computed different parts).
 *   from_local (x, like)               x (rank-local) as the local shard of a tensor with like's
 *                                      global shape and placements (a view), on like's mesh,
 *                                      which may be another view of x's ranks (the expert mesh
 *                                      of the tokens' world). Backward: the
 *                                      gradient brought to like's placements (Replicate where
 *                                      like is Partial: each part gets the whole gradient), its
 *                                      local shard.
 *   all_to_all_single (x, splits; mesh_dim)  rows of x's local shard: splits[j] of them, in
 *                                      order, to coordinate j along mesh_dim; the received rows
 *                                      in coordinate order (rank-local). splits holds the n send
 *                                      counts (the receive counts are exchanged first, n
 *                                      integers) or 2n: send counts then receive counts (no
 *                                      exchange; they must match what the peers send). Backward:
 *                                      the reverse exchange with the counts swapped.
 * The all-to-all counts under DT_COLL_ALL_TO_ALL the bytes this rank sends to other ranks (the
 * rows that cross the network; its own block stays), on the mesh dim it runs over. */
#include "mesh/mesh.h"
#include "ops/ops.h"

#define DT_MAX_RANKS_A2A 1024 /* ranks along the mesh dim of one all_to_all_single */

static void dt__all_replicate(dt_placement_t* pl) {
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = dt_replicate();
}

/* Whether meshes a and b are views of the same ranks (the same world ranks, in any order, on the
 * same backend): what lets a rank-local value cross from one to the other. */
static dt_status_t dt__same_ranks(dt_mesh_t a, dt_mesh_t b, const char* what) {
  if (a == b) return DT_SUCCESS;
  int same = a->numel == b->numel && a->backend == b->backend && a->ranks != NULL &&
             b->ranks != NULL && a->member && b->member;
  for (int i = 0; same && i < a->numel; i++) {
    int found = 0;
    for (int j = 0; !found && j < b->numel; j++) found = a->ranks[i] == b->ranks[j];
    same = found;
  }
  if (!same)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: the value's mesh and the target mesh are not views "
                   "of the same ranks on one backend (%d and %d ranks)", what, a->numel,
                   b->numel);
  return DT_SUCCESS;
}

/* A tensor of `mesh` and layout (shape, pl) whose local shard is x's local data; x's local shape
 * must be exactly the shard this rank holds under that layout (agreed over the mesh). mesh may be
 * another view of x's ranks. */
static dt_status_t dt__reshard_view(dt_tensor_t x, dt_mesh_t mesh, int ndim, const int64_t* shape,
                                    const dt_placement_t* pl, const char* what, dt_tensor_t* out) {
  dt_status_t st;
  dt_tensor_t t = NULL;
  DT_CHECK(dt__same_ranks(x->mesh, mesh, what));
  if (x->meta) return dt__tensor_meta(mesh, x->dtype, ndim, shape, pl, out);
  st = dt__tensor_meta(mesh, x->dtype, ndim, shape, pl, &t); /* the layout's local shape */
  if (st == DT_SUCCESS) {
    int same = t->local_numel == x->local_numel && t->layout.ndim == x->layout.ndim;
    for (int d = 0; same && d < ndim; d++) same = t->local_shape[d] == x->local_shape[d];
    if (!same)
      st = DT_FAIL(DT_ERR_INVALID_ARG,
                   "%s: the local values (%lld elements, %d dims) are not the "
                   "shard this rank holds of the target layout (%lld elements)",
                   what, (long long)x->local_numel, x->layout.ndim, (long long)t->local_numel);
  }
  dt__tensor_free(t);
  st = dt__mesh_agree(mesh, st, what);
  if (st != DT_SUCCESS) return st;
  return dt__tensor_alias_on(mesh, x, 0, x->dtype, ndim, shape, pl, out);
}

/* ---------------------------------------------------------------------------------------------
 * to_local */

/* The grad placements of a to_local call: iargs (one encoded placement per mesh dim) or x's. */
static dt_status_t dt__grad_pl(dt_tensor_t x, int n_iargs, const int64_t* iargs,
                               dt_placement_t* pl) {
  int nd = x->mesh->ndim;
  if (n_iargs == 0) {
    memcpy(pl, x->layout.pl, sizeof(dt_placement_t) * (size_t)nd);
    return DT_SUCCESS;
  }
  if (n_iargs != nd)
    return DT_FAIL(DT_ERR_INVALID_ARG, "to_local: %d grad placements for a %d-dim mesh", n_iargs,
                   nd);
  for (int i = 0; i < nd; i++) {
    DT_CHECK(dt_placement_decode(iargs[i], &pl[i]));
    if (pl[i].kind == DT_SHARD && (pl[i].dim < 0 || pl[i].dim >= x->layout.ndim))
      return DT_FAIL(DT_ERR_INVALID_ARG, "to_local: grad placement S(%d) of a %d-dim tensor",
                     pl[i].dim, x->layout.ndim);
  }
  return DT_SUCCESS;
}

dt_status_t dt__to_local_fwd(int n_in, const dt_tensor_t* in, int n_iargs, const int64_t* iargs,
                             int n_fargs, const double* fargs, dt_tensor_t* out,
                             dt_tensor_t* saved) {
  (void)n_in;
  (void)n_fargs;
  (void)fargs;
  (void)saved;
  dt_tensor_t x = in[0];
  dt_placement_t pl[DT_MAX_MESH_DIMS], rep[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__grad_pl(x, n_iargs, iargs, pl)); /* validated here, used by the backward rule */
  dt__all_replicate(rep);
  if (x->meta)
    return dt__tensor_meta(x->mesh, x->dtype, x->layout.ndim, x->local_shape, rep, &out[0]);
  return dt__tensor_alias(x, 0, x->dtype, x->layout.ndim, x->local_shape, rep, &out[0]);
}

dt_status_t dt__bw_to_local(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  dt_tensor_t x = c->in[0];
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  DT_CHECK(dt__grad_pl(x, c->n_iargs, c->iargs, pl));
  return dt__reshard_view(gout[0], x->mesh, x->layout.ndim, x->layout.shape, pl,
                          "to_local backward", &gin[0]);
}

/* ---------------------------------------------------------------------------------------------
 * from_local */

dt_status_t dt__from_local_fwd(int n_in, const dt_tensor_t* in, int n_iargs, const int64_t* iargs,
                               int n_fargs, const double* fargs, dt_tensor_t* out,
                               dt_tensor_t* saved) {
  (void)n_in;
  (void)n_iargs;
  (void)iargs;
  (void)n_fargs;
  (void)fargs;
  (void)saved;
  dt_tensor_t like = in[1];
  return dt__reshard_view(in[0], like->mesh, like->layout.ndim, like->layout.shape,
                          like->layout.pl, "from_local", &out[0]);
}

dt_status_t dt__bw_from_local(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (!c->needs[0]) return DT_SUCCESS;
  dt_tensor_t like = c->in[1], g = gout[0], moved = NULL;
  int nd = like->mesh->ndim, same = 1;
  dt_placement_t want[DT_MAX_MESH_DIMS]; /* like's; a Partial part gets the whole gradient */
  for (int i = 0; i < nd; i++) {
    want[i] = like->layout.pl[i].kind == DT_PARTIAL ? dt_replicate() : like->layout.pl[i];
    same &= dt_placement_equal(g->layout.pl[i], want[i]);
  }
  if (!same) {
    DT_CHECK(dt_tensor_redistribute(g, want, &moved));
    g = moved;
  }
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  dt__all_replicate(rep);
  dt_mesh_t xm = c->in[0]->mesh; /* the gradient of x: rank-local on x's mesh */
  dt_status_t st =
      g->meta ? dt__tensor_meta(xm, g->dtype, g->layout.ndim, g->local_shape, rep, &gin[0])
              : dt__tensor_alias_on(xm, g, 0, g->dtype, g->layout.ndim, g->local_shape, rep,
                                    &gin[0]);
  dt__tensor_free(moved);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * all_to_all_single */

/* The counts of a call: n send counts (rows) and n receive counts, exchanged when splits holds
 * only the send counts (one integer to and from each peer). */
static dt_status_t dt__a2a_counts(dt_tensor_t x, dt_tensor_t splits, int dim, dt_comm_t* comm,
                                  int64_t* scount, int64_t* rcount, int* exchanged) {
  int n = comm->size;
  const char* op = "all_to_all_single";
  dt_status_t st = DT_SUCCESS;
  *exchanged = 0;
  if (splits->dtype != DT_I64 || splits->layout.ndim != 1 ||
      (splits->local_numel != n && splits->local_numel != 2 * n))
    st = DT_FAIL(DT_ERR_INVALID_ARG,
                 "%s: splits must be a 1-d i64 tensor of %d send counts or "
                 "%d send then receive counts (mesh dim %d has %d ranks)",
                 op, n, 2 * n, dim, n);
  int64_t rows = x->layout.ndim ? x->local_shape[0] : 1, sum = 0;
  int64_t sp[2 * DT_MAX_RANKS_A2A]; /* the counts are host values: read through the backend */
  if (st == DT_SUCCESS) st = dt_tensor_read_local(splits, 0, splits->local_numel, sp);
  if (st == DT_SUCCESS) {
    for (int j = 0; j < (int)splits->local_numel; j++)
      if (sp[j] < 0)
        st =
            DT_FAIL(DT_ERR_INVALID_ARG, "%s: split %d is negative (%lld)", op, j, (long long)sp[j]);
    for (int j = 0; j < n; j++) {
      scount[j] = sp[j];
      sum += sp[j];
      if (splits->local_numel == 2 * n) rcount[j] = sp[n + j];
    }
    if (st == DT_SUCCESS && (x->layout.ndim == 0 || sum != rows))
      st = DT_FAIL(DT_ERR_INVALID_ARG, "%s: the send counts sum to %lld, x has %lld local rows", op,
                   (long long)sum, (long long)rows);
    const int me = comm->rank;
    /* (a simulated run's receive counts are the routing model's, not a peer's sends) */
    if (st == DT_SUCCESS && !x->mesh->simulated && splits->local_numel == 2 * n &&
        sp[me] != sp[n + me])
      st = DT_FAIL(DT_ERR_INVALID_ARG, "%s: this rank (%d along mesh dim %d) sends itself %lld "
                   "rows but receives %lld from itself", op, me, dim, (long long)sp[me],
                   (long long)sp[n + me]);
  }
  /* every rank of the group sends rows of one shape and dtype (else a peer's rows would not fit
   * this rank's receive buffer: an MPI error on some ranks only); a simulated comm moves nothing */
  if (!x->mesh->simulated) {
    uint64_t sig = (uint64_t)x->layout.ndim; /* ndim, row dims, dtype (wrapping arithmetic) */
    int64_t width = 1, v[2], all[2];
    for (int k = 1; k < x->layout.ndim; k++) {
      sig = sig * 131u + (uint64_t)x->local_shape[k];
      width *= x->local_shape[k];
    }
    v[0] = (int64_t)((sig * 16u + (uint64_t)x->dtype) & (UINT64_MAX >> 2)); /* -v[0] defined */
    v[1] = -v[0];
    dt_status_t cst = comm->iface->all_reduce(comm, v, all, 2, DT_I64, DT_REDUCE_MAX, NULL);
    if (cst != DT_SUCCESS) return cst; /* the comm failed: nothing more can be agreed */
    if (st == DT_SUCCESS && (all[0] != v[0] || all[1] != v[1]))
      st = DT_FAIL(DT_ERR_INVALID_ARG, "%s: the ranks of mesh dim %d send rows of different "
                   "shapes or dtypes (here a %d-d x, rows of %lld %s elements): a row must be the "
                   "same on every rank", op, dim, x->layout.ndim, (long long)width,
                   dt_dtype_name(x->dtype));
  }
  st = dt__mesh_agree(x->mesh, st, op);
  if (st != DT_SUCCESS || splits->local_numel == 2 * n) return st;
  int64_t one[DT_MAX_RANKS_A2A], disp[DT_MAX_RANKS_A2A];
  for (int j = 0; j < n; j++) {
    one[j] = 1;
    disp[j] = j;
  }
  DT_CHECK(comm->iface->all_to_all_v(comm, scount, one, disp, rcount, one, disp, DT_I64, NULL));
  *exchanged = 1;
  return DT_SUCCESS;
}

/* The exchange of rows over mesh dim `dim`: straight between the tensors' memory on a host
 * backend and on a device backend whose mesh has an NCCL plane (the rows over NCCL; the counts
 * went over MPI before); otherwise through host staging buffers of sn and rn elements (the MPI
 * comm is not CUDA-aware). */
static dt_status_t dt__a2a_rows(dt_comm_t* comm, int dim, dt_tensor_t x, const int64_t* sc,
                                const int64_t* sd, dt_tensor_t o, const int64_t* rc,
                                const int64_t* rd, int64_t sn, int64_t rn) {
  dt_backend_t b = dt__tensor_backend(x);
  if (!dt__backend_is_device(b))
    return comm->iface->all_to_all_v(comm, x->data, sc, sd, o->data, rc, rd, x->dtype, NULL);
  int nccl = 0;
  DT_CHECK(dt__mesh_data_plane(x->mesh, b, &nccl));
  if (nccl) {
    dt_comm_t* dc = dt__mesh_data_comm(x->mesh, b, 1u << dim);
    if (dc == NULL) return DT_FAIL(DT_ERR_INTERNAL, "all_to_all_single: no NCCL communicator");
    return dc->iface->all_to_all_v(dc, x->data, sc, sd, o->data, rc, rd, x->dtype, NULL);
  }
  const size_t item = dt__itemsize(x->dtype), snb = (size_t)sn * item, rnb = (size_t)rn * item;
  void* hs = dt__host_stage_alloc(b, snb);
  void* hr = dt__host_stage_alloc(b, rnb);
  dt_status_t st = DT_SUCCESS;
  if (hs == NULL || hr == NULL)
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "all_to_all_single: %zu + %zu bytes of host staging", snb,
                 rnb);
  if (st == DT_SUCCESS && snb) st = b->iface->copy(b, hs, x->data, snb, DT_COPY_D2H);
  /* a rank that could not stage must not leave the others in the exchange */
  st = dt__mesh_agree(x->mesh, st, "all_to_all_single (host staging)");
  if (st == DT_SUCCESS) st = comm->iface->all_to_all_v(comm, hs, sc, sd, hr, rc, rd, x->dtype, NULL);
  if (st == DT_SUCCESS && rnb) st = b->iface->copy(b, o->data, hr, rnb, DT_COPY_H2D);
  dt__host_stage_free(b, hs, snb);
  dt__host_stage_free(b, hr, rnb);
  return st;
}

dt_status_t dt__all_to_all_single_fwd(int n_in, const dt_tensor_t* in, int n_iargs,
                                      const int64_t* iargs, int n_fargs, const double* fargs,
                                      dt_tensor_t* out, dt_tensor_t* saved) {
  (void)n_in;
  (void)n_fargs;
  (void)fargs;
  const char* op = "all_to_all_single";
  dt_tensor_t x = in[0], splits = in[1];
  dt_mesh_t mesh = x->mesh;
  const int64_t d0 = dt__op_iarg_n(DT_OP_ALL_TO_ALL_SINGLE, n_iargs, iargs, 0); /* mesh_dim=0 */
  int64_t d = d0 < 0 ? d0 + mesh->ndim : d0;
  if (d < 0 || d >= mesh->ndim)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s: mesh_dim=%lld (iargs[0]) out of range for a %d-dim "
                   "mesh (valid: %d to %d)", op, (long long)d0, mesh->ndim, -mesh->ndim,
                   mesh->ndim - 1);
  int dim = (int)d, n = mesh->shape[dim];
  if (n > DT_MAX_RANKS_A2A)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: mesh dim %d has %d ranks, at most %d", op, dim, n,
                   DT_MAX_RANKS_A2A);
  if (x->meta || splits->meta || mesh->abstract || !mesh->member)
    return DT_FAIL(DT_ERR_UNSUPPORTED,
                   "%s: the received rows are known only by running it (no "
                   "meta tensors, abstract meshes or non-members)",
                   op);
  dt_comm_t* comm = dt__mesh_group_comm(mesh, 1u << dim);
  if (comm == NULL) return DT_FAIL(DT_ERR_INTERNAL, "%s: no communicator for mesh dim %d", op, dim);
  int64_t sc[DT_MAX_RANKS_A2A], rc[DT_MAX_RANKS_A2A], sd[DT_MAX_RANKS_A2A], rd[DT_MAX_RANKS_A2A];
  int exchanged;
  DT_CHECK(dt__a2a_counts(x, splits, dim, comm, sc, rc, &exchanged));
  int me = comm->rank, nd = x->layout.ndim;
  int64_t row = 1, rows = 0;
  for (int k = 1; k < nd; k++) row *= x->local_shape[k];
  for (int j = 0; j < n; j++) {
    if (rc[j] < 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: rank %d sends %lld rows", op, j, (long long)rc[j]);
    rows += rc[j];
  }
  int64_t shape[DT_MAX_DIMS];
  memcpy(shape, x->local_shape, sizeof shape);
  shape[0] = rows;
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  dt__all_replicate(rep);
  dt_tensor_t o = NULL;
  DT_CHECK(dt__tensor_new(mesh, x->dtype, nd, shape, rep, 0, &o));
  uint64_t sent = 0;
  int64_t srows[DT_MAX_RANKS_A2A], rrows[DT_MAX_RANKS_A2A], s_at = 0, r_at = 0;
  for (int j = 0; j < n; j++) {
    srows[j] = sc[j];
    rrows[j] = rc[j];
    sd[j] = s_at * row;
    rd[j] = r_at * row;
    s_at += sc[j];
    r_at += rc[j];
    sc[j] *= row;
    rc[j] *= row;
    if (j != me) sent += (uint64_t)sc[j] * dt__itemsize(x->dtype);
  }
  dt_status_t st = dt__a2a_rows(comm, dim, x, sc, sd, o, rc, rd, s_at * row, r_at * row);
  if (st != DT_SUCCESS) {
    dt__tensor_free(o);
    return st;
  }
  if (exchanged) dt__count_collective(mesh, 1u << dim, DT_COLL_ALL_TO_ALL, (uint64_t)(n - 1) * 8);
  dt__count_collective(mesh, 1u << dim, DT_COLL_ALL_TO_ALL, sent);
  if (exchanged) /* simulated: the counts' exchange and the rows' (the model prices a send buffer
                  * that includes this rank's own block) */
    dt__sim_collective(mesh, 1u << dim, DT_COLL_ALL_TO_ALL, DT_ALGO_NATIVE, n, (uint64_t)n * 8, 0);
  dt__sim_collective(mesh, 1u << dim, DT_COLL_ALL_TO_ALL, DT_ALGO_NATIVE, n,
                     n > 1 ? sent * (uint64_t)n / (uint64_t)(n - 1) : 0, 0);
  if (saved) { /* the backward's splits: send what was received, receive what was sent */
    const int64_t s2[1] = {2 * n};
    st = dt__tensor_new(mesh, DT_I64, 1, s2, rep, 0, saved);
    if (st != DT_SUCCESS) {
      dt__tensor_free(o);
      return st;
    }
    int64_t b[2 * DT_MAX_RANKS_A2A];
    for (int j = 0; j < n; j++) {
      b[j] = rrows[j];
      b[n + j] = srows[j];
    }
    st = dt_tensor_write_local(*saved, 0, 2 * n, b);
    if (st != DT_SUCCESS) {
      dt__tensor_free(o);
      dt__tensor_free(*saved);
      *saved = NULL;
      return st;
    }
  }
  out[0] = o;
  return DT_SUCCESS;
}

dt_status_t dt__bw_all_to_all_single(const dt_grad_ctx_t* c, dt_tensor_t* gout, dt_tensor_t* gin) {
  if (!c->needs[0]) return DT_SUCCESS;
  if (c->saved == NULL)
    return DT_FAIL(DT_ERR_INTERNAL, "all_to_all_single node without its counts");
  dt_tensor_t in[2] = {gout[0], c->saved};
  return dt__op_apply(DT_OP_ALL_TO_ALL_SINGLE, 2, in, c->n_iargs, c->iargs, 0, NULL, 1, gin, NULL);
}

/* dtensor/tensor.h - distributed tensors: construction, local shards, redistribution.
 *
 * A distributed tensor has a dtype, a global shape (up to DT_MAX_DIMS dims), a mesh and one
 * placement per mesh dim. Each rank holds a dense row-major local shard whose extent follows the
 * torch.chunk rule per sharded mesh dim, in mesh-dim order when several mesh dims shard one tensor
 * dim. Empty shards are legal. Ranks outside the mesh hold nothing (local numel 0).
 *
 * Collective calls (marked below) must be made by every rank of the mesh in the same order.
 */
#ifndef DTENSOR_TENSOR_H
#define DTENSOR_TENSOR_H

#include <stdio.h>

#include "dtensor/redistribute.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tensor* dt_tensor_t;

/* Collective. Distributes the full tensor `full` (row-major, read on world rank `src_rank` only;
 * other ranks may pass NULL) by scatter (Shard) or broadcast (Replicate) along each mesh dim.
 * A Partial mesh dim receives the value as from Replicate, then partitioned (see redistribute). */
DT_API dt_status_t dt_tensor_distribute(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                        const int64_t* shape, const dt_placement_t* placements,
                                        const void* full, int src_rank, dt_tensor_t* out);
/* Local. Every rank holds the same `full`; each copies its own shard. No communication. */
DT_API dt_status_t dt_tensor_from_full(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                       const int64_t* shape, const dt_placement_t* placements,
                                       const void* full, dt_tensor_t* out);
/* Local. Wraps the caller's shard `local` (borrowed: it must outlive the tensor) of extent
 * local_shape. global_shape NULL infers it as local size times the mesh size on each sharded dim
 * (exact only for even shards). Fails with DT_ERR_INVALID_ARG when local_shape is not the chunk
 * this rank must hold for global_shape and placements. Collective over the mesh's members: one
 * 8-byte all-reduce agrees on the outcome (three when global_shape is NULL), so a bad argument
 * on one rank fails every rank. */
DT_API dt_status_t dt_tensor_from_local(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                        const int64_t* global_shape,
                                        const dt_placement_t* placements, void* local,
                                        const int64_t* local_shape, dt_tensor_t* out);
/* The same on a given backend's memory (NULL: the mesh's backend when its device is the host,
 * else the cpu backend). */
DT_API dt_status_t dt_tensor_from_local_backend(dt_mesh_t mesh, dt_backend_t backend,
                                                dt_dtype_t dtype, int ndim,
                                                const int64_t* global_shape,
                                                const dt_placement_t* placements, void* local,
                                                const int64_t* local_shape, dt_tensor_t* out);
/* Local. A view of part of base's local shard: a tensor of the given global shape and placements
 * on base's mesh, in base's dtype, whose local shard (the chunk this rank holds under that
 * layout, row-major) is the run of base's local elements from element `offset` on, whatever
 * base's own shape. It shares base's storage: writes through either are seen by both, the view
 * keeps the storage alive after base is destroyed (a view of a dt_tensor_from_local tensor still
 * borrows the caller's buffer), and dt_memory_stats counts the storage once, under its category.
 * Each rank checks its own shard only, so ranks may pass different offsets (e.g. several views
 * packed into one flat buffer). A view of a meta tensor is a meta tensor. DT_ERR_INVALID_ARG
 * when offset is negative or the view's local shard does not fit in base's from offset. */
DT_API dt_status_t dt_tensor_view_local(dt_tensor_t base, int64_t offset, int ndim,
                                        const int64_t* shape, const dt_placement_t* placements,
                                        dt_tensor_t* out);
/* A meta tensor: a layout without data, on any mesh (abstract meshes too). Ops and
 * redistributions on meta tensors select strategies and plan without moving anything (a traced
 * dry run, see dt_trace_set); their results are meta tensors. Reading the data of a meta tensor
 * (dt_tensor_gather_full) is DT_ERR_INVALID_USAGE; dt_tensor_to_local gives NULL. */
DT_API dt_status_t dt_tensor_meta(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                  const dt_placement_t* placements, dt_tensor_t* out);
DT_API dt_status_t dt_tensor_is_meta(dt_tensor_t t, int* meta);
/* Local factories; the tensor owns its storage. Partial placements hold a partition of the
 * value (see dt_tensor_redistribute, R -> P). dt_tensor_empty leaves the values unspecified (not
 * zeroed: a buffer the caller overwrites at once costs no fill; on the guarded backend they
 * start as NaN); dt_tensor_zeros zeroes them. */
DT_API dt_status_t dt_tensor_empty(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                   const dt_placement_t* placements, dt_tensor_t* out);
DT_API dt_status_t dt_tensor_zeros(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                   const dt_placement_t* placements, dt_tensor_t* out);
DT_API dt_status_t dt_tensor_ones(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                  const dt_placement_t* placements, dt_tensor_t* out);
/* Every element `value` (torch.full); dt_tensor_gather_full is the call that reads a tensor.
 * Fill values (value, start, step) must be finite; into an integer dtype a value is truncated
 * toward zero and must then fit the dtype, into a float dtype its magnitude must not pass the
 * largest finite value (f16 65504, bf16 3.39e38, f32 3.40e38) (arange: its last value too), else
 * DT_ERR_INVALID_ARG (torch.full refuses them too: "value cannot be converted ... without
 * overflow"). */
DT_API dt_status_t dt_tensor_full_value(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                        const int64_t* shape, const dt_placement_t* placements,
                                        double value, dt_tensor_t* out);
/* Element at flat global index i is start + i*step. */
DT_API dt_status_t dt_tensor_arange(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                    const int64_t* shape, const dt_placement_t* placements,
                                    double start, double step, dt_tensor_t* out);
/* Uniform [0,1) and standard normal. The value at flat global index i depends on (seed, i) only,
 * so one seed gives the same global tensor under every mesh and placement. Float dtypes only. */
DT_API dt_status_t dt_tensor_rand(dt_mesh_t mesh, dt_dtype_t dtype, int ndim, const int64_t* shape,
                                  const dt_placement_t* placements, uint64_t seed,
                                  dt_tensor_t* out);
DT_API dt_status_t dt_tensor_randn(dt_mesh_t mesh, dt_dtype_t dtype, int ndim,
                                   const int64_t* shape, const dt_placement_t* placements,
                                   uint64_t seed, dt_tensor_t* out);
/* NULL is a no-op. Frees owned storage; borrowed storage is left to the caller. */
DT_API dt_status_t dt_tensor_destroy(dt_tensor_t t);

/* Accessors. */
DT_API dt_status_t dt_tensor_dtype(dt_tensor_t t, dt_dtype_t* dtype);
DT_API dt_status_t dt_tensor_ndim(dt_tensor_t t, int* ndim);
DT_API dt_status_t dt_tensor_shape(dt_tensor_t t, int64_t* shape);           /* ndim values */
DT_API dt_status_t dt_tensor_placements(dt_tensor_t t, dt_placement_t* out); /* mesh ndim */
DT_API dt_status_t dt_tensor_mesh(dt_tensor_t t, dt_mesh_t* mesh);           /* borrowed */
/* The backend whose memory holds the local shard (usually the mesh's; dt_backend_device says
 * whether that is host memory, a device's, or none: meta). */
DT_API dt_status_t dt_tensor_backend(dt_tensor_t t, dt_backend_t* backend);
DT_API dt_status_t dt_tensor_local_shape(dt_tensor_t t, int64_t* shape);
/* Global index of the local shard's first element along each dim. */
DT_API dt_status_t dt_tensor_local_offset(dt_tensor_t t, int64_t* offset);
DT_API dt_status_t dt_tensor_local_numel(dt_tensor_t t, int64_t* numel);
/* Local. Marks a tensor whose local values differ from rank to rank although its placements
 * say otherwise (a per-rank buffer wrapped as Replicate, e.g. expert weights a program keeps
 * itself): 1 marks, 0 clears. Nothing computes differently; dt_checkpoint_save refuses such a
 * tensor added with dt_checkpoint_add_tensor (it would keep one rank's copy) and takes it through
 * dt_checkpoint_add_tensor_as, which says what its local values are a shard of. New tensors are
 * not rank-local; results of ops on rank-local tensors are not marked. */
DT_API dt_status_t dt_tensor_set_rank_local(dt_tensor_t t, int rank_local);
DT_API dt_status_t dt_tensor_is_rank_local(dt_tensor_t t, int* rank_local);
/* The local shard: pointer (may be NULL when empty) and, if local_shape != NULL, its extent. The
 * pointer lives in the memory of the tensor's backend (dt_tensor_to_local_backend says which):
 * host memory for the cpu and guarded backends, device memory for cuda (the backend is
 * synchronized first, so the caller's own streams may use it at once; library code and portable
 * callers use dt_tensor_read_local and friends instead). Views share storage: writes through one
 * tensor's local data are seen by every tensor that aliases it (see dt_op_run). On the meta
 * backend (dt_backend_device: DT_DEVICE_META, a simulated world) the pointer must not be
 * dereferenced: there is no memory behind it (dt_tensor_read_local gives zeros). */
DT_API dt_status_t dt_tensor_to_local(dt_tensor_t t, void** data, int64_t* local_shape);
/* The same, and the backend whose memory holds the data (may be NULL). */
DT_API dt_status_t dt_tensor_to_local_backend(dt_tensor_t t, void** data, int64_t* local_shape,
                                              dt_backend_t* backend);

/* ---- local transfers: a tensor's local elements through its backend, whatever memory holds
 * them (a device backend's memory is never read through a pointer by the host). Offsets and
 * counts are elements of the dtype in the local shard's row-major order; boxes are in local
 * coordinates (ndim offsets and lengths). Host buffers are read or written in full before the
 * call returns. DT_ERR_INVALID_ARG for a range or box outside the local shard, DT_ERR_INVALID_USAGE
 * for a meta tensor. All local: no communication. */
/* numel elements of t's local shard from element `offset` on -> host (numel * itemsize bytes). */
DT_API dt_status_t dt_tensor_read_local(dt_tensor_t t, int64_t offset, int64_t numel, void* host);
/* host -> numel elements of t's local shard from element `offset` on. */
DT_API dt_status_t dt_tensor_write_local(dt_tensor_t t, int64_t offset, int64_t numel,
                                         const void* host);
/* The box [box_off, box_off + box_len) of t's local shard <-> a dense row-major host array. */
DT_API dt_status_t dt_tensor_read_local_box(dt_tensor_t t, const int64_t* box_off,
                                            const int64_t* box_len, void* host);
DT_API dt_status_t dt_tensor_write_local_box(dt_tensor_t t, const int64_t* box_off,
                                             const int64_t* box_len, const void* host);
/* n element ranges from src's local shard to dst's (same dtype; any backends, host <-> device
 * included): numel[i] elements from src_off[i] to dst_off[i]. Destination ranges must not
 * overlap one another, nor (when dst and src share storage) a source range. */
DT_API dt_status_t dt_tensor_copy_local(dt_tensor_t dst, dt_tensor_t src, int n,
                                        const int64_t* dst_off, const int64_t* src_off,
                                        const int64_t* numel);
/* Sets n element ranges of t's local shard (numel[i] elements from off[i]) to `value`, rounded
 * as a store of t's dtype (an integer dtype truncates toward zero; a value that then does not
 * fit it, NaN and infinities included, is DT_ERR_INVALID_ARG, and so is a finite value past a
 * float dtype's largest finite one, as torch's fill_; NaN and infinities fill a float tensor). */
DT_API dt_status_t dt_tensor_fill_local(dt_tensor_t t, int n, const int64_t* off,
                                        const int64_t* numel, double value);

/* Local. Counts the tensor's storage (shared by its views) under category c in dt_memory_stats
 * from now on. No-op for meta tensors and borrowed memory. */
DT_API dt_status_t dt_tensor_set_memory_category(dt_tensor_t t, dt_mem_category_t c);

/* Collective. Gathers the full global tensor into host memory `out` (out_nbytes at least
 * numel*itemsize; the bytes of t's dtype, so a bf16 tensor fills 2 bytes an element) on every
 * rank of the mesh (Partial values reduced). A rank outside the mesh gets DT_SUCCESS and `out`
 * untouched. */
DT_API dt_status_t dt_tensor_gather_full(dt_tensor_t t, void* out, size_t out_nbytes);
/* Collective, like dt_tensor_gather_full: the value of a one-element tensor (a loss, a norm) as a
 * double whatever its dtype (torch's .item()): a bf16 loss under mixed precision reads right,
 * where gather_full would write its 2 raw bytes. DT_ERR_INVALID_ARG for more or fewer elements; a
 * rank outside the mesh gets DT_SUCCESS and NaN. */
DT_API dt_status_t dt_tensor_item(dt_tensor_t t, double* value);
/* Deprecated: dt_tensor_gather_full under its older name, kept so that existing callers still
 * build and link (the symbol stays in the ABI). The name read like a factory (that is
 * dt_tensor_full_value); GCC and Clang warn at each use (-Wdeprecated-declarations). */
#if defined(__GNUC__) || defined(__clang__)
#define DT__DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define DT__DEPRECATED(msg)
#endif
DT_API DT__DEPRECATED("dt_tensor_full is deprecated: use dt_tensor_gather_full")
dt_status_t dt_tensor_full(dt_tensor_t t, void* out, size_t out_nbytes);
/* Collective. New tensor with placements `dst` (mesh ndim), same mesh, shape and dtype.
 * S->R all-gather, P->R all-reduce, P->S reduce-scatter, S(i)->S(j) all-to-all, R->S local slice,
 * R->P local (sum: floats are divided by the mesh-dim size; integers stay on coordinate 0 and are
 * zero elsewhere, so the sum is exact; avg/max/min keep the value). A new Partial from a Shard and
 * P(x)->P(y) are DT_ERR_UNSUPPORTED. Set DTENSOR_DEBUG=redistribute to print each plan. */
DT_API dt_status_t dt_tensor_redistribute(dt_tensor_t t, const dt_placement_t* dst,
                                          dt_tensor_t* out);
/* Collective. Like dt_tensor_redistribute into an existing tensor `dst` of the same mesh, shape
 * and dtype, whose placements are the target. Allocation-free on the steady path (plans are
 * cached, scratch buffers are persistent). `dst` must not share storage with `src`. */
DT_API dt_status_t dt_tensor_redistribute_into(dt_tensor_t src, dt_tensor_t dst);
/* Collective. Starts dt_tensor_redistribute(t, dst, out) without waiting for it: *out is the new
 * tensor, valid to read after dt_work_wait(*work). See dtensor/redistribute.h for the rules. On a
 * meta tensor or an abstract mesh the work is already complete. */
DT_API dt_status_t dt_tensor_redistribute_async(dt_tensor_t t, const dt_placement_t* dst,
                                                dt_tensor_t* out, dt_work_t* work);

/* Local. Prints which ranks hold which global index ranges (and which hold partial values).
 * Works on abstract meshes too (then every coordinate is listed by coordinate). */
DT_API dt_status_t dt_tensor_visualize(dt_tensor_t t, FILE* f);
/* The same from a description, without a tensor (no MPI needed). */
DT_API dt_status_t dt_sharding_visualize(dt_mesh_t mesh, int ndim, const int64_t* shape,
                                         const dt_placement_t* placements, FILE* f);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_TENSOR_H */

/* local_io.c - moving a tensor's local elements without touching them through a pointer: reads to
 * and writes from host memory, range copies between local shards (across backends too) and
 * range fills, each routed through the backends that own the memory.
 *
 * This is how code above the backend seam (the wrappers, the model code, checkpoints) moves tensor
 * bytes: a device backend's memory is never dereferenced on the host. Offsets and counts are
 * elements of the tensor's dtype in the row-major order of its local shard; boxes are in local
 * coordinates. Host sides are complete when a call returns; device-to-device work is ordered on
 * the backend's stream like kernels.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include "tensor/tensor.h"

/* The end of a public local transfer timed in the op profile (dtensor/ops.h) as `name` (on a
 * device, waited for, so that its time is its own); st is the transfer's status. */
static dt_status_t dt__local_prof_end(dt__prof_frame_t* f, const char* name, dt_tensor_t t,
                                      dt_status_t st) {
  if (st == DT_SUCCESS) {
    dt_backend_t b = dt__tensor_backend(t);
    if (b->device == DT_DEVICE_CUDA && b->iface->synchronize) st = b->iface->synchronize(b);
  }
  dt__prof_end(f, name, DT__PROF_LOCAL);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * argument checks */

/* The messages name the arguments of the public function (its name comes first, from its
 * DT_ENTRY_RETURN): `arg` is the tensor's. */
static dt_status_t dt__io_tensor(dt_tensor_t t, const char* arg) {
  DT_CHECK(dt__tensor_check(t, arg));
  if (t->meta) return DT_FAIL(DT_ERR_INVALID_USAGE, "%s is a meta tensor: it holds no data", arg);
  return DT_SUCCESS;
}

/* [off, off + n) inside `arg`'s local shard of `numel` elements; off_name and n_name are the
 * arguments giving them, i >= 0 the range's index in those arrays. */
static dt_status_t dt__io_range(const char* arg, const char* off_name, const char* n_name, int i,
                                int64_t off, int64_t n, int64_t numel) {
  if (off >= 0 && n >= 0 && off <= numel && n <= numel - off) return DT_SUCCESS;
  char oi[48] = "", ni[48] = "";
  if (i >= 0) {
    snprintf(oi, sizeof oi, "[%d]", i);
    snprintf(ni, sizeof ni, "[%d]", i);
  }
  return DT_FAIL(DT_ERR_INVALID_ARG, "%s%s=%lld, %s%s=%lld: the range is outside %s's local shard "
                 "of %lld elements (valid: %s%s >= 0, %s%s >= 0, %s%s + %s%s <= %lld)", off_name,
                 oi, (long long)off, n_name, ni, (long long)n, arg, (long long)numel, off_name, oi,
                 n_name, ni, off_name, oi, n_name, ni, (long long)numel);
}

/* A box of the local shard: *numel its element count. */
static dt_status_t dt__io_box(dt_tensor_t t, const int64_t* box_off, const int64_t* box_len,
                              int64_t* numel) {
  DT_ARG_NOT_NULL(box_off);
  DT_ARG_NOT_NULL(box_len);
  *numel = 1;
  for (int d = 0; d < t->layout.ndim; d++) {
    const int64_t o = box_off[d], l = box_len[d], s = t->local_shape[d];
    if (o < 0 || l < 0 || o > s || l > s - o)
      return DT_FAIL(DT_ERR_INVALID_ARG, "box_off[%d]=%lld, box_len[%d]=%lld: the box is outside "
                     "t's local shard, of %lld along dim %d (valid: box_off[%d] + box_len[%d] <= "
                     "%lld, both >= 0)", d, (long long)o, d, (long long)l, (long long)s, d, d, d,
                     (long long)s);
    *numel *= l;
  }
  return DT_SUCCESS;
}

static char* dt__at(dt_tensor_t t, int64_t elem) {
  return (char*)t->data + (size_t)elem * dt__itemsize(t->dtype);
}

/* ---------------------------------------------------------------------------------------------
 * host memory <-> local shard */

static dt_status_t dt__tensor_read_local_impl(dt_tensor_t t, int64_t offset, int64_t numel,
                                              void* host) {
  DT_CHECK(dt__io_tensor(t, "t"));
  DT_CHECK(dt__io_range("t", "offset", "numel", -1, offset, numel, t->local_numel));
  if (numel == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(host);
  dt_backend_t b = dt__tensor_backend(t);
  return b->iface->copy(b, host, dt__at(t, offset), (size_t)numel * dt__itemsize(t->dtype),
                        dt__backend_is_device(b) ? DT_COPY_D2H : DT_COPY_H2H);
}

static dt_status_t dt__tensor_read_local_prof(dt_tensor_t t, int64_t offset, int64_t numel,
                                              void* host) {
  if (!dt__prof_on()) return dt__tensor_read_local_impl(t, offset, numel, host);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  return dt__local_prof_end(&f, "read_local", t, dt__tensor_read_local_impl(t, offset, numel, host));
}

dt_status_t dt_tensor_read_local(dt_tensor_t t, int64_t offset, int64_t numel, void* host) {
  DT_ENTRY_RETURN(dt__tensor_read_local_prof(t, offset, numel, host));
}

static dt_status_t dt__tensor_write_local_impl(dt_tensor_t t, int64_t offset, int64_t numel,
                                               const void* host) {
  DT_CHECK(dt__io_tensor(t, "t"));
  DT_CHECK(dt__io_range("t", "offset", "numel", -1, offset, numel, t->local_numel));
  if (numel == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(host);
  dt_backend_t b = dt__tensor_backend(t);
  return b->iface->copy(b, dt__at(t, offset), host, (size_t)numel * dt__itemsize(t->dtype),
                        dt__backend_is_device(b) ? DT_COPY_H2D : DT_COPY_H2H);
}

static dt_status_t dt__tensor_write_local_prof(dt_tensor_t t, int64_t offset, int64_t numel,
                                               const void* host) {
  if (!dt__prof_on()) return dt__tensor_write_local_impl(t, offset, numel, host);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  return dt__local_prof_end(&f, "write_local", t,
                            dt__tensor_write_local_impl(t, offset, numel, host));
}

dt_status_t dt_tensor_write_local(dt_tensor_t t, int64_t offset, int64_t numel, const void* host) {
  DT_ENTRY_RETURN(dt__tensor_write_local_prof(t, offset, numel, host));
}

/* A box between the local shard and a dense host array: host backends copy it in place; a device
 * backend packs (or unpacks) it in a device buffer and moves that in one copy. */
static dt_status_t dt__box_io(dt_tensor_t t, const int64_t* off, const int64_t* len, void* host,
                              int to_host, int64_t numel) {
  dt_backend_t b = dt__tensor_backend(t);
  const int nd = t->layout.ndim;
  const size_t item = dt__itemsize(t->dtype), nb = (size_t)numel * item;
  static const int64_t zero[DT_MAX_DIMS] = {0};
  if (!dt__backend_is_device(b)) {
    if (to_host) return b->iface->box_copy(b, nd, item, len, host, len, zero, t->data, t->local_shape, off);
    return b->iface->box_copy(b, nd, item, len, t->data, t->local_shape, off, host, len, zero);
  }
  void* tmp = dt__backend_alloc(b, nb);
  if (tmp == NULL)
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s backend: %zu bytes to stage a box", b->name, nb);
  dt__mem_count(DT_MEM_COMMUNICATION, (int64_t)nb);
  dt_status_t st;
  if (to_host) {
    st = b->iface->box_copy(b, nd, item, len, tmp, len, zero, t->data, t->local_shape, off);
    if (st == DT_SUCCESS) st = b->iface->copy(b, host, tmp, nb, DT_COPY_D2H);
  } else {
    st = b->iface->copy(b, tmp, host, nb, DT_COPY_H2D);
    if (st == DT_SUCCESS)
      st = b->iface->box_copy(b, nd, item, len, t->data, t->local_shape, off, tmp, len, zero);
  }
  /* freeing is stream-ordered (backend.h): work issued later reuses tmp only after the copy */
  dt__backend_free(b, tmp, nb);
  dt__mem_count(DT_MEM_COMMUNICATION, -(int64_t)nb);
  return st;
}

static dt_status_t dt__tensor_read_local_box_impl(dt_tensor_t t, const int64_t* box_off,
                                                  const int64_t* box_len, void* host) {
  int64_t n;
  DT_CHECK(dt__io_tensor(t, "t"));
  DT_CHECK(dt__io_box(t, box_off, box_len, &n));
  if (n == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(host);
  return dt__box_io(t, box_off, box_len, host, 1, n);
}

dt_status_t dt_tensor_read_local_box(dt_tensor_t t, const int64_t* box_off, const int64_t* box_len,
                                     void* host) {
  DT_ENTRY_RETURN(dt__tensor_read_local_box_impl(t, box_off, box_len, host));
}

static dt_status_t dt__tensor_write_local_box_impl(dt_tensor_t t, const int64_t* box_off,
                                                   const int64_t* box_len, const void* host) {
  int64_t n;
  DT_CHECK(dt__io_tensor(t, "t"));
  DT_CHECK(dt__io_box(t, box_off, box_len, &n));
  if (n == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(host);
  return dt__box_io(t, box_off, box_len, (void*)host, 0, n);
}

dt_status_t dt_tensor_write_local_box(dt_tensor_t t, const int64_t* box_off,
                                      const int64_t* box_len, const void* host) {
  DT_ENTRY_RETURN(dt__tensor_write_local_box_impl(t, box_off, box_len, host));
}

/* ---------------------------------------------------------------------------------------------
 * local shard <-> local shard */

#define DT__RANGES_INLINE 64

static dt_status_t dt__tensor_copy_local_impl(dt_tensor_t dst, dt_tensor_t src, int n,
                                              const int64_t* dst_off, const int64_t* src_off,
                                              const int64_t* numel) {
  DT_CHECK(dt__io_tensor(dst, "dst"));
  DT_CHECK(dt__io_tensor(src, "src"));
  if (n < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d ranges (valid: 0 or more)", n);
  if (n == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(dst_off);
  DT_ARG_NOT_NULL(src_off);
  DT_ARG_NOT_NULL(numel);
  if (dst->dtype != src->dtype)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dst is %s, src is %s (cast with the \"cast\" op)",
                   dt_dtype_name(dst->dtype), dt_dtype_name(src->dtype));
  for (int i = 0; i < n; i++) {
    DT_CHECK(dt__io_range("dst", "dst_off", "numel", i, dst_off[i], numel[i], dst->local_numel));
    DT_CHECK(dt__io_range("src", "src_off", "numel", i, src_off[i], numel[i], src->local_numel));
  }
  const int64_t item = (int64_t)dt__itemsize(dst->dtype);
  dt_backend_t db = dt__tensor_backend(dst), sb = dt__tensor_backend(src);
  const int ddev = dt__backend_is_device(db), sdev = dt__backend_is_device(sb);
  dt_status_t st = DT_SUCCESS;
  if (db == sb || (!ddev && !sdev)) { /* one memory: the backend's range copy, in byte ranges */
    int64_t inl[3][DT__RANGES_INLINE];
    int64_t* r = n <= DT__RANGES_INLINE ? &inl[0][0] : (int64_t*)dt__malloc(sizeof(int64_t) * 3 * (size_t)n);
    if (r == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "a list of %d ranges", n);
    const int stride = n <= DT__RANGES_INLINE ? DT__RANGES_INLINE : n;
    for (int i = 0; i < n; i++) {
      r[i] = dst_off[i] * item;
      r[stride + i] = src_off[i] * item;
      r[2 * stride + i] = numel[i] * item;
    }
    /* a meta side: the meta backend's copy (zeros into host memory, nothing into meta) */
    dt_backend_t b = ddev ? db : sdev ? sb : sb->device == DT_DEVICE_META ? sb : db;
    st = b->iface->copy_ranges(b, dst->data, src->data, n, r, r + stride, r + 2 * stride);
    if (r != &inl[0][0]) dt__free(r);
    return st;
  }
  for (int i = 0; i < n && st == DT_SUCCESS; i++) { /* host <-> device, or device <-> device */
    if (numel[i] == 0) continue;
    const size_t nb = (size_t)(numel[i] * item);
    char* d = dt__at(dst, dst_off[i]);
    const char* s = dt__at(src, src_off[i]);
    if (!ddev) {
      st = sb->iface->copy(sb, d, s, nb, DT_COPY_D2H);
    } else if (!sdev) {
      st = db->iface->copy(db, d, s, nb, DT_COPY_H2D);
    } else { /* two device backends: through host memory */
      void* h = dt__host_stage_alloc(sb, nb);
      if (h == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%zu bytes of host staging", nb);
      st = sb->iface->copy(sb, h, s, nb, DT_COPY_D2H);
      if (st == DT_SUCCESS) st = db->iface->copy(db, d, h, nb, DT_COPY_H2D);
      dt__host_stage_free(sb, h, nb);
    }
  }
  return st;
}

static dt_status_t dt__tensor_copy_local_prof(dt_tensor_t dst, dt_tensor_t src, int n,
                                              const int64_t* dst_off, const int64_t* src_off,
                                              const int64_t* numel) {
  if (!dt__prof_on()) return dt__tensor_copy_local_impl(dst, src, n, dst_off, src_off, numel);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  return dt__local_prof_end(&f, "copy_local", dst,
                            dt__tensor_copy_local_impl(dst, src, n, dst_off, src_off, numel));
}

dt_status_t dt_tensor_copy_local(dt_tensor_t dst, dt_tensor_t src, int n, const int64_t* dst_off,
                                  const int64_t* src_off, const int64_t* numel) {
  DT_ENTRY_RETURN(dt__tensor_copy_local_prof(dst, src, n, dst_off, src_off, numel));
}

static dt_status_t dt__tensor_fill_local_impl(dt_tensor_t t, int n, const int64_t* off,
                                              const int64_t* numel, double value) {
  DT_CHECK(dt__io_tensor(t, "t"));
  if (n < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d ranges (valid: 0 or more)", n);
  if (n == 0) return DT_SUCCESS;
  DT_ARG_NOT_NULL(off);
  DT_ARG_NOT_NULL(numel);
  for (int i = 0; i < n; i++)
    DT_CHECK(dt__io_range("t", "off", "numel", i, off[i], numel[i], t->local_numel));
  DT_CHECK(dt__fill_check(t->dtype, value, "value"));
  dt_backend_t b = dt__tensor_backend(t);
  for (int i = 0; i < n; i++)
    if (numel[i] > 0) DT_CHECK(b->iface->fill(b, dt__at(t, off[i]), t->dtype, numel[i], value));
  return DT_SUCCESS;
}

static dt_status_t dt__tensor_fill_local_prof(dt_tensor_t t, int n, const int64_t* off,
                                              const int64_t* numel, double value) {
  if (!dt__prof_on()) return dt__tensor_fill_local_impl(t, n, off, numel, value);
  dt__prof_frame_t f;
  dt__prof_begin(&f);
  return dt__local_prof_end(&f, "fill_local", t, dt__tensor_fill_local_impl(t, n, off, numel, value));
}

dt_status_t dt_tensor_fill_local(dt_tensor_t t, int n, const int64_t* off, const int64_t* numel,
                                 double value) {
  DT_ENTRY_RETURN(dt__tensor_fill_local_prof(t, n, off, numel, value));
}

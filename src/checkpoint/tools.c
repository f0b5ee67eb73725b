/* tools.c - checkpoints seen from outside a training run (dtensor-ckpt): info, verify (every byte
 * against its checksums), consolidate (whole tensors into one safetensors file, or Hugging Face's
 * sharded form) and import (a safetensors file into a one-rank seed checkpoint). Local, no MPI. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint/format.h"

/* ---- info ---------------------------------------------------------------------------------- */

static dt_status_t dt__checkpoint_info(const char* path, FILE* out) {
  DT__CK_PATH_ARG(path);
  DT_ARG_NOT_NULL(out);
  char ckdir[DT__CK_PATH_MAX];
  DT_CHECK(dt__ck_resolve(path, ckdir, sizeof ckdir));
  dt__ck_index_t ix;
  DT_CHECK(dt__ck_index_read(ckdir, &ix));
  int64_t total = 0;
  for (int f = 0; f < ix.n_files; f++) total += ix.files[f].nbytes;
  fprintf(out, "checkpoint %s\n  step %" PRId64 ", saved by dtensor %s from %d ranks, %d files, "
          "%" PRId64 " bytes, checksum blocks of %" PRId64 " bytes\n", ckdir, ix.step, ix.library,
          ix.world_size, ix.n_files, total, ix.block_nbytes);
  for (const cJSON* v = ix.values->child; v; v = v->next) {
    const cJSON* i = cJSON_GetObjectItemCaseSensitive(v, "i64");
    const cJSON* d = cJSON_GetObjectItemCaseSensitive(v, "f64");
    if (i) fprintf(out, "  value %s = %s\n", v->string, i->valuestring);
    else fprintf(out, "  value %s = %.17g\n", v->string, d->valuedouble);
  }
  for (int i = 0; i < ix.n_tensors; i++) {
    const dt__ck_tensor_t* t = &ix.tensors[i];
    char sh[256] = "", mesh[256] = "", pl[160] = "";
    size_t at = 0;
    for (int d = 0; d < t->ndim; d++) at += (size_t)snprintf(sh + at, sizeof sh - at, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    at = 0;
    for (int d = 0; d < t->mesh_ndim; d++)
      at += (size_t)snprintf(mesh + at, sizeof mesh - at, "%s%s%s%d", d ? " x " : "",
                             t->mesh_names[d], t->mesh_names[d][0] ? "=" : "", t->mesh_shape[d]);
    (void)dt_placements_format(t->pl, t->mesh_ndim, ", ", pl, sizeof pl);
    int64_t nb = 0;
    for (int b = 0; b < t->n_boxes; b++) nb += t->boxes[b].nbytes;
    fprintf(out, "  %-6s %s %s (%s) from mesh (%s) as [%s]: %d boxes, %" PRId64 " bytes", t->kind,
            t->name, dt_dtype_name(t->dtype), sh, mesh, pl, t->n_boxes, nb);
    for (int a = 0; a < t->n_alias; a++) fprintf(out, "%s%s", a ? ", " : "; also ", t->alias[a]);
    fprintf(out, "\n");
  }
  dt__ck_index_free(&ix);
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_info(const char* path, FILE* out) {
  DT_ENTRY_RETURN(dt__checkpoint_info(path, out));
}

/* ---- verify -------------------------------------------------------------------------------- */

static dt_status_t dt__ck_verify_box(const dt__ck_index_t* ix, const dt__ck_tensor_t* t, int b,
                                     int fd, const char* path, unsigned char* buf) {
  const dt__ck_box_t* x = &t->boxes[b];
  XXH64_state_t* h = XXH64_createState();
  if (h == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "hash state");
  XXH64_reset(h, 0);
  dt_status_t st = DT_SUCCESS;
  for (int64_t k = 0; k < x->n_blocks && st == DT_SUCCESS; k++) {
    int64_t o = k * ix->block_nbytes, n = x->nbytes - o < ix->block_nbytes ? x->nbytes - o : ix->block_nbytes;
    st = dt__ck_pread_all(fd, buf, (size_t)n, x->data_offset + o, path);
    if (st == DT_SUCCESS && dt__ck_hash(buf, (size_t)n) != x->blocks[k])
      st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' (box %d, bytes %" PRId64 " to %" PRId64
                   "): checksum mismatch", path, t->name, b, x->data_offset + o, x->data_offset + o + n);
    XXH64_update(h, buf, (size_t)n);
  }
  if (st == DT_SUCCESS && (uint64_t)XXH64_digest(h) != x->xxh64)
    st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' (box %d): checksum of the whole box mismatches",
                 path, t->name, b);
  XXH64_freeState(h);
  return st;
}

static dt_status_t dt__checkpoint_verify(const char* path, FILE* out) {
  DT__CK_PATH_ARG(path);
  char ckdir[DT__CK_PATH_MAX];
  DT_CHECK(dt__ck_resolve(path, ckdir, sizeof ckdir));
  dt__ck_index_t ix;
  DT_CHECK(dt__ck_index_read(ckdir, &ix));
  dt__ck_fd_t* fds = dt__ck_fds_new(ix.n_files);
  unsigned char* buf = malloc((size_t)ix.block_nbytes);
  dt_status_t st = fds && buf ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "verify buffers");
  for (int f = 0; f < ix.n_files && st == DT_SUCCESS; f++) {
    char p[DT__CK_PATH_MAX];
    int boxes = 0;
    st = dt__ck_file_open(ckdir, &ix, f, fds, p, sizeof p);
    for (int i = 0; i < ix.n_tensors && st == DT_SUCCESS; i++)
      for (int b = 0; b < ix.tensors[i].n_boxes && st == DT_SUCCESS; b++)
        if (ix.tensors[i].boxes[b].file == f) {
          st = dt__ck_verify_box(&ix, &ix.tensors[i], b, fds[f].fd, p, buf);
          boxes++;
        }
    if (st == DT_SUCCESS && out)
      fprintf(out, "ok %s: %" PRId64 " bytes, %d boxes\n", p, ix.files[f].nbytes, boxes);
  }
  if (st == DT_SUCCESS && out)
    fprintf(out, "ok %s: %d tensors, %d files, every checksum matches\n", ckdir, ix.n_tensors, ix.n_files);
  free(buf);
  dt__ck_fds_close(fds, ix.n_files);
  dt__ck_index_free(&ix);
  return st;
}

dt_status_t dt_checkpoint_verify(const char* path, FILE* out) {
  DT_ENTRY_RETURN(dt__checkpoint_verify(path, out));
}

/* ---- consolidate ----------------------------------------------------------------------------- */

/* The whole tensor t into buf (numel * itemsize bytes), every block checked. */
static dt_status_t dt__ck_gather(const char* ckdir, const dt__ck_index_t* ix,
                                 const dt__ck_tensor_t* t, dt__ck_fd_t* fds, unsigned char* buf,
                                 unsigned char* blockbuf) {
  size_t isz = 0;
  DT_CHECK(dt_dtype_itemsize(t->dtype, &isz));
  int64_t zero[DT_MAX_DIMS] = {0};
  for (int b = 0; b < t->n_boxes; b++) {
    char p[DT__CK_PATH_MAX];
    const dt__ck_box_t* x = &t->boxes[b];
    DT_CHECK(dt__ck_file_open(ckdir, ix, x->file, fds, p, sizeof p));
    dt__ck_reader_t r = {ix, t, x, b, p, fds[x->file].fd, buf, blockbuf, -1, DT_SUCCESS};
    if (dt__ck_runs(t->ndim, x->off, x->len, zero, t->shape, (int64_t)isz, dt__ck_read_run, &r) < 0)
      return r.st;
  }
  return DT_SUCCESS;
}

static int dt__ck_wanted(const dt__ck_tensor_t* t, int with_optimizer) {
  return with_optimizer || strcmp(t->kind, "optim") != 0;
}

/* An output path of consolidate: written as PATH.tmp and renamed over PATH, so an existing PATH
 * must be a regular file (a rename would replace a directory's name, a FIFO or /dev/null). */
static dt_status_t dt__ck_out_check(const char* path) {
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s exists and is not a regular file (the output replaces "
                   "it)", path);
  return DT_SUCCESS;
}

/* One output file: header for tensors [lo, hi) of `sel`, then their gathered data, written as
 * out_path.tmp and renamed over out_path (keep_tmp: left as out_path.tmp for the caller, which
 * renames every file of a set once all are written). */
static dt_status_t dt__ck_write_consolidated(const char* ckdir, const dt__ck_index_t* ix,
                                             const int* sel, int lo, int hi, const char* out_path,
                                             dt__ck_fd_t* fds, unsigned char* blockbuf,
                                             int keep_tmp) {
  int n = hi - lo;
  const char** keys = calloc((size_t)(n > 0 ? n : 1), sizeof *keys);
  dt_dtype_t* dts = calloc((size_t)(n > 0 ? n : 1), sizeof *dts);
  int* nds = calloc((size_t)(n > 0 ? n : 1), sizeof *nds);
  const int64_t** shapes = calloc((size_t)(n > 0 ? n : 1), sizeof *shapes);
  int64_t* nb = calloc((size_t)(n > 0 ? n : 1), sizeof *nb);
  const char** kinds = calloc((size_t)(n > 0 ? n : 1), sizeof *kinds);
  dt_status_t st = keys && dts && nds && shapes && nb && kinds ? DT_SUCCESS
                                                               : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "header");
  int64_t largest = 0;
  for (int k = 0; k < n && st == DT_SUCCESS; k++) {
    const dt__ck_tensor_t* t = &ix->tensors[sel[lo + k]];
    size_t isz = 0;
    st = dt_dtype_itemsize(t->dtype, &isz);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    keys[k] = t->name;
    kinds[k] = t->kind;
    dts[k] = t->dtype;
    nds[k] = t->ndim;
    shapes[k] = t->shape;
    nb[k] = numel * (int64_t)isz;
    if (nb[k] > largest) largest = nb[k];
  }
  size_t hl = 0;
  char* hdr = st == DT_SUCCESS ? dt__ck_st_header(n, keys, dts, nds, shapes, nb, kinds, &hl) : NULL;
  if (st == DT_SUCCESS && hdr == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "header");
  unsigned char* buf = st == DT_SUCCESS ? malloc((size_t)(largest > 0 ? largest : 1)) : NULL;
  if (st == DT_SUCCESS && buf == NULL)
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%" PRId64 " bytes for the largest tensor", largest);
  char tmp[DT__CK_PATH_MAX];
  int fd = -1;
  /* a name cut short could be out_path itself: written in place, and unlinked on a failure */
  if (st == DT_SUCCESS && snprintf(tmp, sizeof tmp, "%s.tmp", out_path) >= (int)sizeof tmp)
    st = DT_FAIL(DT_ERR_INVALID_ARG, "out_path too long (its %zu characters and \".tmp\")",
                 strlen(out_path));
  if (st == DT_SUCCESS) st = dt__ck_out_check(out_path);
  if (st == DT_SUCCESS) st = dt__ck_create(tmp, &fd); /* a link at OUT.tmp: refused */
  if (st == DT_SUCCESS) st = dt__ck_st_write_header(fd, hdr, hl, tmp);
  for (int k = 0; k < n && st == DT_SUCCESS; k++) {
    st = dt__ck_gather(ckdir, ix, &ix->tensors[sel[lo + k]], fds, buf, blockbuf);
    if (st == DT_SUCCESS) st = dt__ck_write_all(fd, buf, (size_t)nb[k], tmp);
  }
  if (fd >= 0) {
    if (st == DT_SUCCESS && fsync(fd) != 0) st = DT_FAIL(DT_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    close(fd);
  }
  if (st == DT_SUCCESS && !keep_tmp && rename(tmp, out_path) != 0)
    st = DT_FAIL(DT_ERR_IO, "renaming %s to %s: %s", tmp, out_path, strerror(errno));
  if (st != DT_SUCCESS && fd >= 0) unlink(tmp);
  free(buf);
  free(hdr);
  free(keys);
  free(dts);
  free(nds);
  free(shapes);
  free(nb);
  free(kinds);
  return st;
}

/* DT_ERR_INVALID_ARG when out_path would land inside checkpoint directory ckdir, or on the
 * `latest` pointer or the checkpoint itself in the directory holding it: consolidating into
 * the checkpoint being read would damage it. */
static dt_status_t dt__ck_out_apart(const char* ckdir, const char* out_path) {
  char ck[PATH_MAX], od[PATH_MAX], dir[DT__CK_PATH_MAX];
  if (realpath(ckdir, ck) == NULL) return DT_SUCCESS; /* reading it will say why */
  const char* slash = strrchr(out_path, '/');
  const char* base = slash ? slash + 1 : out_path;
  if (slash == NULL) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", slash == out_path ? 1 : (int)(slash - out_path), out_path);
  if (realpath(dir, od) == NULL) return DT_SUCCESS; /* writing there will say why */
  const size_t n = strlen(ck);
  const int inside = strncmp(od, ck, n) == 0 && (od[n] == '\0' || od[n] == '/');
  const char* ck_base = strrchr(ck, '/');
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%.*s", ck_base && ck_base != ck ? (int)(ck_base - ck) : 1, ck);
  const int beside = strcmp(od, parent) == 0 &&
                     (strncmp(base, DT__CK_LATEST, strlen(DT__CK_LATEST)) == 0 ||
                      (ck_base && strcmp(base, ck_base + 1) == 0));
  if (inside || beside)
    return DT_FAIL(DT_ERR_INVALID_ARG, "out_path %s would write into the checkpoint %s it "
                   "consolidates (or over its directory's `latest`): write it elsewhere",
                   out_path, ck);
  return DT_SUCCESS;
}

static dt_status_t dt__checkpoint_consolidate(const char* path, const char* out_path,
                                              int64_t max_file_nbytes, int with_optimizer) {
  DT__CK_PATH_ARG(path);
  DT_ARG_NOT_NULL(out_path);
  if (out_path[0] == '\0') return DT_FAIL(DT_ERR_INVALID_ARG, "out_path is empty");
  /* out_path.tmp must fit (cut short it could be out_path itself), out_path.index.json too
   * (checked after the shards of the sharded form were written over those beside it), and the
   * directory part (cut short, the shards went into an ancestor directory) */
  if (strlen(out_path) + sizeof ".index.json" > DT__CK_PATH_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "out_path too long (%zu characters; at most %d)",
                   strlen(out_path), (int)(DT__CK_PATH_MAX - sizeof ".index.json"));
  DT_CHECK(dt__ck_out_check(out_path)); /* before reading anything */
  if (max_file_nbytes < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "max_file_nbytes=%" PRId64 " (valid: 0, no limit, or > 0)",
                   max_file_nbytes);
  char ckdir[DT__CK_PATH_MAX];
  DT_CHECK(dt__ck_resolve(path, ckdir, sizeof ckdir));
  DT_CHECK(dt__ck_out_apart(ckdir, out_path));
  dt__ck_index_t ix;
  DT_CHECK(dt__ck_index_read(ckdir, &ix));
  int* sel = calloc((size_t)(ix.n_tensors > 0 ? ix.n_tensors : 1), sizeof *sel);
  int64_t* nbytes = calloc((size_t)(ix.n_tensors > 0 ? ix.n_tensors : 1), sizeof *nbytes);
  dt__ck_fd_t* fds = dt__ck_fds_new(ix.n_files);
  unsigned char* blockbuf = malloc((size_t)ix.block_nbytes);
  dt_status_t st = sel && nbytes && fds && blockbuf ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "consolidate");
  int n = 0;
  int64_t total = 0;
  for (int i = 0; i < ix.n_tensors && st == DT_SUCCESS; i++) {
    if (!dt__ck_wanted(&ix.tensors[i], with_optimizer)) continue;
    if (strcmp(ix.tensors[i].name, DT__CK_META_KEY) == 0) { /* saved before saves refused it */
      st = DT_FAIL(DT_ERR_UNSUPPORTED, "%s: tensor '%s': a safetensors file cannot hold a tensor "
                   "of that name (its header's own key)", ckdir, ix.tensors[i].name);
      break;
    }
    size_t isz = 0;
    st = dt_dtype_itemsize(ix.tensors[i].dtype, &isz);
    int64_t numel = 1;
    for (int d = 0; d < ix.tensors[i].ndim; d++) numel *= ix.tensors[i].shape[d];
    nbytes[n] = numel * (int64_t)isz;
    total += nbytes[n];
    sel[n++] = i;
  }
  if (st == DT_SUCCESS && (max_file_nbytes == 0 || total <= max_file_nbytes)) {
    st = dt__ck_write_consolidated(ckdir, &ix, sel, 0, n, out_path, fds, blockbuf, 0);
  } else if (st == DT_SUCCESS) {
    /* Hugging Face's sharded form: greedy files of at most max_file_nbytes (a larger tensor
     * alone in its file) */
    int* start = calloc((size_t)n + 1, sizeof *start);
    int nfiles = 0;
    if (start == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "consolidate");
    int64_t acc = 0;
    for (int k = 0; k < n && st == DT_SUCCESS; k++) {
      if (k == 0 || (acc > 0 && acc + nbytes[k] > max_file_nbytes)) {
        start[nfiles++] = k;
        acc = 0;
      }
      acc += nbytes[k];
    }
    if (start) start[nfiles] = n;
    char dirpart[DT__CK_PATH_MAX];
    snprintf(dirpart, sizeof dirpart, "%s", out_path);
    char* slash = strrchr(dirpart, '/');
    if (slash) *slash = '\0';
    else snprintf(dirpart, sizeof dirpart, ".");
    cJSON* root = cJSON_CreateObject();
    cJSON* meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON* map = cJSON_AddObjectToObject(root, "weight_map");
    /* every shard is written as its .tmp first, and all are renamed only once every one is
     * written and checked: a failure (a damaged box of a later shard) leaves a previous output's
     * shards as they were, not some of them replaced beside its old index */
    int written = 0;
    for (int f = 0; f < nfiles && st == DT_SUCCESS; f++) {
      char fname[64], fpath[DT__CK_PATH_MAX];
      snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
      if (snprintf(fpath, sizeof fpath, "%s/%s", dirpart, fname) >= (int)sizeof fpath)
        st = DT_FAIL(DT_ERR_INVALID_ARG, "out_path too long");
      if (st == DT_SUCCESS)
        st = dt__ck_write_consolidated(ckdir, &ix, sel, start[f], start[f + 1], fpath, fds,
                                       blockbuf, 1);
      if (st == DT_SUCCESS) written++;
      for (int k = start[f]; k < start[f + 1] && st == DT_SUCCESS; k++)
        cJSON_AddStringToObject(map, ix.tensors[sel[k]].name, fname);
    }
    char* text = st == DT_SUCCESS ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    char ipath[DT__CK_PATH_MAX];
    if (st == DT_SUCCESS && snprintf(ipath, sizeof ipath, "%s.index.json", out_path) >= (int)sizeof ipath)
      st = DT_FAIL(DT_ERR_INVALID_ARG, "out_path too long");
    if (st == DT_SUCCESS && text == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
    if (st == DT_SUCCESS) st = dt__ck_out_check(ipath);
    for (int f = 0; f < written; f++) { /* renamed into place, or removed after a failure */
      char fpath[DT__CK_PATH_MAX], tmp[DT__CK_PATH_MAX + 8];
      if (snprintf(fpath, sizeof fpath, "%s/model-%05d-of-%05d.safetensors", dirpart, f + 1,
                   nfiles) >= (int)sizeof fpath ||
          snprintf(tmp, sizeof tmp, "%s.tmp", fpath) >= (int)sizeof tmp)
        continue; /* (each fitted when it was written) */
      if (st == DT_SUCCESS && rename(tmp, fpath) != 0) {
        st = DT_FAIL(DT_ERR_IO, "renaming %s to %s: %s", tmp, fpath, strerror(errno));
        (void)unlink(tmp);
      } else if (st != DT_SUCCESS) {
        (void)unlink(tmp);
      }
    }
    if (st == DT_SUCCESS) {
      const char* base = strrchr(ipath, '/');
      st = dt__ck_write_atomic(dirpart, base ? base + 1 : ipath, text, strlen(text));
    }
    free(text);
    free(start);
  }
  free(blockbuf);
  dt__ck_fds_close(fds, ix.n_files);
  free(sel);
  free(nbytes);
  dt__ck_index_free(&ix);
  return st;
}

dt_status_t dt_checkpoint_consolidate(const char* path, const char* out_path,
                                      int64_t max_file_nbytes, int with_optimizer) {
  DT_ENTRY_RETURN(dt__checkpoint_consolidate(path, out_path, max_file_nbytes, with_optimizer));
}

/* ---- import ----------------------------------------------------------------------------------- */

typedef struct {
  char path[DT__CK_PATH_MAX];
  int fd;
  int64_t data_start;
  dt__ck_st_entry_t* e;
  int n;
} dt__ck_src_t;

static dt_status_t dt__ck_src_open(const char* path, dt__ck_src_t* s) {
  snprintf(s->path, sizeof s->path, "%s", path);
  s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
  if (s->fd < 0) return DT_FAIL(DT_ERR_IO, "opening %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(s->fd, &sb) != 0) return DT_FAIL(DT_ERR_IO, "stat %s: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode)) return DT_FAIL(DT_ERR_IO, "%s is not a regular file", path);
  char* hdr = NULL;
  uint64_t hl = 0;
  DT_CHECK(dt__ck_st_read_header(s->fd, (int64_t)sb.st_size, path, &hdr, &hl));
  s->data_start = 8 + (int64_t)hl;
  dt_status_t st = dt__ck_st_parse(hdr, (size_t)hl, (int64_t)sb.st_size - s->data_start, path, &s->e, &s->n);
  free(hdr);
  DT_CHECK(st);
  for (int k = 0; k < s->n; k++) {
    if (s->e[k].dtype == DT_DTYPE_COUNT)
      return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (this library has F32, BF16, "
                     "F16, I32, I64)", path, s->e[k].key, s->e[k].dtype_name);
    if (!dt__ck_name_ok(s->e[k].key, 0))
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: tensor name '%.200s' cannot be a checkpoint name "
                     "(no ':', '\"' or '\\')", path, s->e[k].key);
  }
  return DT_SUCCESS;
}

/* The source files: one safetensors file, or the shards a Hugging Face index lists. */
static dt_status_t dt__ck_sources(const char* path, dt__ck_src_t** out, int* n) {
  *out = NULL;
  *n = 0;
  size_t pl = strlen(path);
  if (pl > 11 && strcmp(path + pl - 11, ".index.json") == 0) {
    char* text = NULL;
    size_t len = 0;
    DT_CHECK(dt__ck_read_file(path, DT__CK_INDEX_MAX, &text, &len));
    cJSON* root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON* map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
      cJSON_Delete(root);
      return DT_FAIL(DT_ERR_CORRUPT, "%s: no weight_map object", path);
    }
    dt__ck_src_t* s = calloc((size_t)cJSON_GetArraySize(map) + 1, sizeof *s);
    if (s == NULL) {
      cJSON_Delete(root);
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "sources");
    }
    char dirpart[DT__CK_PATH_MAX];
    snprintf(dirpart, sizeof dirpart, "%s", path);
    char* slash = strrchr(dirpart, '/');
    if (slash) *slash = '\0';
    else snprintf(dirpart, sizeof dirpart, ".");
    dt_status_t st = DT_SUCCESS;
    int k = 0;
    for (const cJSON* e = map->child; e && st == DT_SUCCESS; e = e->next) {
      if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
        st = DT_FAIL(DT_ERR_CORRUPT, "%s: weight_map entry '%.200s' is not a file name", path, e->string);
        break;
      }
      char fp[DT__CK_PATH_MAX];
      if (snprintf(fp, sizeof fp, "%s/%s", dirpart, e->valuestring) >= (int)sizeof fp) {
        st = DT_FAIL(DT_ERR_INVALID_ARG, "%s: path too long", path);
        break;
      }
      int seen = 0;
      for (int j = 0; j < k; j++) seen |= strcmp(s[j].path, fp) == 0;
      if (seen) continue;
      s[k].fd = -1;
      st = dt__ck_src_open(fp, &s[k]);
      k++;
    }
    cJSON_Delete(root);
    *out = s;
    *n = k;
    return st;
  }
  dt__ck_src_t* s = calloc(1, sizeof *s);
  if (s == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "sources");
  s->fd = -1;
  *out = s;
  *n = 1;
  return dt__ck_src_open(path, s);
}

static dt_status_t dt__checkpoint_import(const char* src_path, const char* dir, const char* name,
                                         int64_t step) {
  DT__CK_PATH_ARG(src_path);
  DT__CK_PATH_ARG(dir);
  if (step < 0 || step > DT__CK_MAX_SAFE)
    return DT_FAIL(DT_ERR_INVALID_ARG, "step=%" PRId64 " (valid: 0 to 2^53, what an index can "
                   "hold exactly)", step);
  char nm[DT_CHECKPOINT_NAME_MAX];
  if (name == NULL) snprintf(nm, sizeof nm, "step_%08" PRId64, step);
  else if (strlen(name) <= DT_CHECKPOINT_SAVE_NAME_LEN && !dt__ck_name_ok(name, 1))
    return DT_FAIL(DT_ERR_INVALID_ARG, "name='%.200s' is not a checkpoint name", name);
  DT_CHECK(dt__ck_save_path_check(dir, name ? name : nm, 1)); /* as a save's (one rank) */
  if (name != NULL) snprintf(nm, sizeof nm, "%s", name);
  dt__ck_src_t* src = NULL;
  int ns = 0;
  dt_status_t st = dt__ck_sources(src_path, &src, &ns);
  int total = 0;
  for (int i = 0; i < ns; i++) total += src[i].n;
  if (st == DT_SUCCESS && total == 0) /* an empty weight_map, a file of no tensors: a mistake */
    st = DT_FAIL(DT_ERR_INVALID_ARG, "%.300s holds no tensor: nothing to import", src_path);
  dt__ck_index_t ix;
  memset(&ix, 0, sizeof ix);
  ix.step = step;
  ix.world_size = 1;
  ix.block_nbytes = DT__CK_BLOCK_DEFAULT;
  snprintf(ix.library, sizeof ix.library, "%s", dt_version());
  ix.values = cJSON_CreateObject();
  ix.files = calloc(1, sizeof *ix.files);
  ix.tensors = calloc((size_t)(total > 0 ? total : 1), sizeof *ix.tensors);
  const char** keys = calloc((size_t)(total > 0 ? total : 1), sizeof *keys);
  dt_dtype_t* dts = calloc((size_t)(total > 0 ? total : 1), sizeof *dts);
  int* nds = calloc((size_t)(total > 0 ? total : 1), sizeof *nds);
  const int64_t** shapes = calloc((size_t)(total > 0 ? total : 1), sizeof *shapes);
  int64_t* nb = calloc((size_t)(total > 0 ? total : 1), sizeof *nb);
  if (st == DT_SUCCESS && !(ix.values && ix.files && ix.tensors && keys && dts && nds && shapes && nb))
    st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "import");
  /* the tensors in source order, names unique */
  int k = 0;
  for (int i = 0; i < ns && st == DT_SUCCESS; i++)
    for (int j = 0; j < src[i].n && st == DT_SUCCESS; j++, k++) {
      const dt__ck_st_entry_t* e = &src[i].e[j];
      for (int q = 0; q < k; q++)
        if (strcmp(keys[q], e->key) == 0) st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' appears twice", src_path, e->key);
      keys[k] = e->key;
      dts[k] = e->dtype;
      nds[k] = e->ndim;
      shapes[k] = e->shape;
      nb[k] = e->end - e->begin;
      dt__ck_tensor_t* t = &ix.tensors[ix.n_tensors++];
      t->name = strdup(e->key);
      snprintf(t->kind, sizeof t->kind, "%s", e->kind[0] ? e->kind : "param"); /* consolidate's */
      t->dtype = e->dtype;
      t->ndim = e->ndim;
      memcpy(t->shape, e->shape, sizeof t->shape);
      t->mesh_ndim = 1;
      t->mesh_shape[0] = 1;
      snprintf(t->mesh_names[0], sizeof t->mesh_names[0], "world");
      t->pl[0].kind = DT_REPLICATE;
      if (t->name == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "import");
    }
  size_t hl = 0;
  char* hdr = st == DT_SUCCESS ? dt__ck_st_header(total, keys, dts, nds, shapes, nb, NULL, &hl) : NULL;
  if (st == DT_SUCCESS && hdr == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "header");
  char tmpdir[DT__CK_PATH_MAX] = "", fpath[DT__CK_PATH_MAX], final[DT__CK_PATH_MAX];
  /* (the data file's path too: cut short, the file was written under another name and the
   * checkpoint published without it) */
  if (st == DT_SUCCESS && (snprintf(tmpdir, sizeof tmpdir, "%s/%s.tmp", dir, nm) >= (int)sizeof tmpdir ||
                           snprintf(final, sizeof final, "%s/%s", dir, nm) >= (int)sizeof final ||
                           snprintf(fpath, sizeof fpath, "%s/rank_00000.safetensors", tmpdir) >=
                               (int)sizeof fpath)) {
    tmpdir[0] = '\0'; /* nothing made, nothing to remove */
    st = DT_FAIL(DT_ERR_INVALID_ARG, "dir too long");
  }
  struct stat sb;
  if (st == DT_SUCCESS) st = dt__ck_mkdir_p(dir);
  if (st == DT_SUCCESS && stat(final, &sb) == 0)
    st = DT_FAIL(DT_ERR_INVALID_USAGE, "checkpoint %s exists already", final);
  if (st == DT_SUCCESS) {
    (void)dt__ck_rm_rf(tmpdir);
    if (mkdir(tmpdir, 0777) != 0) st = DT_FAIL(DT_ERR_IO, "creating %s: %s", tmpdir, strerror(errno));
  }
  int fd = -1;
  if (st == DT_SUCCESS && total > 0) {
    st = dt__ck_create(fpath, &fd);
    if (st == DT_SUCCESS) st = dt__ck_st_write_header(fd, hdr, hl, fpath);
    snprintf(ix.files[0].name, sizeof ix.files[0].name, "rank_00000.safetensors");
    ix.n_files = 1;
  }
  /* copy each tensor in blocks, hashing as it goes */
  unsigned char* buf = malloc((size_t)ix.block_nbytes);
  if (st == DT_SUCCESS && buf == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "import buffer");
  int64_t at = 8 + (int64_t)hl;
  k = 0;
  for (int i = 0; i < ns && st == DT_SUCCESS; i++)
    for (int j = 0; j < src[i].n && st == DT_SUCCESS; j++, k++) {
      const dt__ck_st_entry_t* e = &src[i].e[j];
      dt__ck_tensor_t* t = &ix.tensors[k];
      int64_t n = e->end - e->begin;
      if (n == 0) continue; /* an empty tensor has no box */
      t->boxes = calloc(1, sizeof *t->boxes);
      if (t->boxes == NULL) {
        st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "import");
        break;
      }
      t->n_boxes = 1;
      dt__ck_box_t* x = &t->boxes[0];
      x->key = strdup(e->key);
      memcpy(x->len, e->shape, sizeof x->len);
      x->data_offset = at;
      x->nbytes = n;
      x->n_blocks = (n + ix.block_nbytes - 1) / ix.block_nbytes;
      x->blocks = calloc((size_t)x->n_blocks, sizeof *x->blocks);
      XXH64_state_t* h = XXH64_createState();
      if (x->key == NULL || x->blocks == NULL || h == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "import");
      if (h) XXH64_reset(h, 0);
      for (int64_t b = 0; b < x->n_blocks && st == DT_SUCCESS; b++) {
        int64_t o = b * ix.block_nbytes, len = n - o < ix.block_nbytes ? n - o : ix.block_nbytes;
        st = dt__ck_pread_all(src[i].fd, buf, (size_t)len, src[i].data_start + e->begin + o, src[i].path);
        if (st == DT_SUCCESS) st = dt__ck_write_all(fd, buf, (size_t)len, fpath);
        x->blocks[b] = dt__ck_hash(buf, (size_t)len);
        if (h) XXH64_update(h, buf, (size_t)len);
      }
      if (h) {
        x->xxh64 = (uint64_t)XXH64_digest(h);
        XXH64_freeState(h);
      }
      at += n;
    }
  if (ix.files != NULL) ix.files[0].nbytes = at; /* NULL when out of memory */
  if (fd >= 0) {
    if (st == DT_SUCCESS && fsync(fd) != 0) st = DT_FAIL(DT_ERR_IO, "fsync %s: %s", fpath, strerror(errno));
    close(fd);
  }
  char* text = st == DT_SUCCESS ? dt__ck_index_to_json(&ix) : NULL;
  if (st == DT_SUCCESS && text == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
  if (st == DT_SUCCESS) st = dt__ck_write_atomic(tmpdir, DT__CK_INDEX, text, strlen(text));
  if (st == DT_SUCCESS) st = dt__ck_publish(dir, tmpdir, nm);
  if (st != DT_SUCCESS && tmpdir[0]) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    (void)dt__ck_rm_rf(tmpdir);
    DT_FAIL(st, "%s", msg);
  }
  free(text);
  free(buf);
  free(hdr);
  free(keys);
  free(dts);
  free(nds);
  free(shapes);
  free(nb);
  for (int i = 0; i < ns; i++) {
    if (src[i].fd >= 0) close(src[i].fd);
    dt__ck_st_free(src[i].e, src[i].n);
  }
  free(src);
  dt__ck_index_free(&ix);
  return st;
}

dt_status_t dt_checkpoint_import(const char* safetensors_path, const char* dir, const char* name,
                                 int64_t step) {
  DT_ENTRY_RETURN(dt__checkpoint_import(safetensors_path, dir, name, step));
}

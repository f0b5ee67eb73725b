/* format.c - the checkpoint format: index.json and safetensors headers written and parsed (every
 * field validated: the parsers see files from disk, the fuzzers feed them anything), xxhash64
 * checksums, the runs of a box intersection, and the file helpers atomic saves are built from. */
#define _GNU_SOURCE
#include "checkpoint/format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>


double dt__ck_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t dt__ck_hash(const void* p, size_t n) { return (uint64_t)XXH64(p, n, 0); }

void dt__ck_hash_format(uint64_t h, char out[17]) { snprintf(out, 17, "%016" PRIx64, h); }

static int dt__ck_hash_parse(const char* s, uint64_t* out) {
  if (s == NULL || strlen(s) != 16) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return 0;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return 1;
}

int dt__ck_name_ok(const char* s, int is_dir) {
  if (s == NULL || s[0] == '\0' || strlen(s) >= DT_CHECKPOINT_NAME_MAX) return 0;
  for (const char* c = s; *c; c++) {
    if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\' || *c == ':') return 0;
    if (is_dir && (*c == '/' || *c == ' ')) return 0;
  }
  if (is_dir && (strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || strcmp(s, DT__CK_LATEST) == 0))
    return 0;
  if (is_dir && strlen(s) > 4 && strcmp(s + strlen(s) - 4, ".tmp") == 0) return 0;
  return 1;
}

/* The longest name a save derives from NAME (a replaced unpublished save's); NAME.pruned.tmp and
 * NAME.tmp are shorter. */
#define DT__CK_LONGEST_SUFFIX ".unpublished.tmp"
_Static_assert(DT_CHECKPOINT_SAVE_NAME_LEN + sizeof DT__CK_LONGEST_SUFFIX - 1 == NAME_MAX,
               "DT_CHECKPOINT_SAVE_NAME_LEN: the longest derived name must fit NAME_MAX");

dt_status_t dt__ck_save_path_check(const char* dir, const char* name, int world_size) {
  const size_t n = strlen(name);
  if (n > DT_CHECKPOINT_SAVE_NAME_LEN)
    return DT_FAIL(DT_ERR_INVALID_ARG, "name '%.40s...' is %zu characters long (at most %d: the "
                   "save also makes NAME%s, and a file name holds at most %d bytes, NAME_MAX)",
                   name, n, DT_CHECKPOINT_SAVE_NAME_LEN, DT__CK_LONGEST_SUFFIX, NAME_MAX);
  char file[64];
  const size_t fl = (size_t)snprintf(file, sizeof file, "rank_%05d.safetensors",
                                     world_size > 1 ? world_size - 1 : 0);
  const size_t longest = strlen(dir) + 1 + n + strlen(".tmp/") + fl;
  if (longest > DT__CK_PATH_MAX - 1)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dir and name too long: the save writes DIR/NAME.tmp/%s, "
                   "%zu characters with this dir (%zu) and name (%zu); a path holds at most %d "
                   "(PATH_MAX - 1)", file, longest, strlen(dir), n, DT__CK_PATH_MAX - 1);
  return DT_SUCCESS;
}

static int dt__ck_file_name_ok(const char* s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n >= DT__CK_FILE_MAX || s[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '-' || c == '.'))
      return 0;
  }
  return strcmp(s, DT__CK_INDEX) != 0;
}

/* ---- safetensors ------------------------------------------------------------------------- */

static const char* const dt__ck_st_names[DT_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "I64"};

const char* dt__ck_st_dtype(dt_dtype_t dt) {
  return (int)dt >= 0 && dt < DT_DTYPE_COUNT ? dt__ck_st_names[dt] : "invalid";
}

int dt__ck_st_dtype_parse(const char* s, dt_dtype_t* out) {
  for (int i = 0; i < DT_DTYPE_COUNT; i++)
    if (s && strcmp(s, dt__ck_st_names[i]) == 0) {
      *out = (dt_dtype_t)i;
      return 1;
    }
  return 0;
}

static size_t dt__ck_itemsize(dt_dtype_t dt) {
  size_t n = 0;
  if (dt_dtype_itemsize(dt, &n) != DT_SUCCESS) return 0;
  return n;
}

char* dt__ck_st_header(int n, const char* const* keys, const dt_dtype_t* dtypes, const int* ndims,
                       const int64_t* const* shapes, const int64_t* nbytes,
                       const char* const* kinds, size_t* len) {
  cJSON* root = cJSON_CreateObject();
  cJSON* meta = cJSON_AddObjectToObject(root, DT__CK_META_KEY);
  cJSON_AddStringToObject(meta, "format", "pt");
  cJSON_AddStringToObject(meta, "writer", "dtensor");
  for (int i = 0; kinds != NULL && i < n; i++) {
    if (kinds[i] == NULL || kinds[i][0] == '\0' || strcmp(kinds[i], "param") == 0) continue;
    size_t kl = strlen(DT__CK_KIND_META) + strlen(keys[i]) + 1;
    char* key = malloc(kl);
    if (key != NULL) snprintf(key, kl, "%s%s", DT__CK_KIND_META, keys[i]);
    if (key == NULL || cJSON_AddStringToObject(meta, key, kinds[i]) == NULL) {
      free(key);
      cJSON_Delete(root);
      return NULL;
    }
    free(key);
  }
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    cJSON* e = cJSON_AddObjectToObject(root, keys[i]);
    cJSON_AddStringToObject(e, "dtype", dt__ck_st_dtype(dtypes[i]));
    cJSON* sh = cJSON_AddArrayToObject(e, "shape");
    for (int d = 0; d < ndims[i]; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shapes[i][d]));
    cJSON* off = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + nbytes[i])));
    at += nbytes[i];
  }
  char* text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (text == NULL) return NULL;
  size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
  char* out = realloc(text, padded + 1);
  if (out == NULL) {
    free(text);
    return NULL;
  }
  memset(out + tl, ' ', padded - tl);
  out[padded] = '\0';
  *len = padded;
  return out;
}

/* An integer JSON number in [0, max]. */
static int dt__ck_int(const cJSON* j, int64_t max, int64_t* out) {
  if (!cJSON_IsNumber(j)) return 0;
  double v = j->valuedouble;
  if (!(v >= 0) || v > (double)max || v != floor(v)) return 0;
  *out = (int64_t)v;
  return 1;
}

void dt__ck_st_free(dt__ck_st_entry_t* e, int n) {
  if (e == NULL) return;
  for (int i = 0; i < n; i++) free(e[i].key);
  free(e);
}

static int dt__ck_cmp_key(const void* a, const void* b) {
  return strcmp(((const dt__ck_st_entry_t*)a)->key, ((const dt__ck_st_entry_t*)b)->key);
}

static int dt__ck_cmp_begin(const void* a, const void* b) {
  const dt__ck_st_entry_t* x = a;
  const dt__ck_st_entry_t* y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

dt_status_t dt__ck_st_parse(const char* hdr, size_t len, int64_t data_nbytes, const char* what,
                            dt__ck_st_entry_t** out, int* n) {
  *out = NULL;
  *n = 0;
  const char* end = NULL;
  cJSON* root = cJSON_ParseWithLengthOpts(hdr, len, &end, 0);
  int trailing = 0; /* only the padding spaces may follow the object */
  for (const char* c = end; root && c && c < hdr + len; c++) trailing |= *c != ' ';
  if (root == NULL || !cJSON_IsObject(root) || trailing) {
    cJSON_Delete(root);
    return DT_FAIL(DT_ERR_CORRUPT, "%s: the safetensors header is not a JSON object%s", what,
                   trailing ? " followed by space padding only" : "");
  }
  int count = 0;
  for (cJSON* e = root->child; e; e = e->next)
    if (strcmp(e->string, DT__CK_META_KEY) != 0) count++;
  dt__ck_st_entry_t* es = calloc(count > 0 ? (size_t)count : 1, sizeof *es);
  if (es == NULL) {
    cJSON_Delete(root);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: %d header entries", what, count);
  }
  dt_status_t st = DT_SUCCESS;
  int k = 0;
  for (cJSON* e = root->child; e && st == DT_SUCCESS; e = e->next) {
    if (strcmp(e->string, DT__CK_META_KEY) == 0) {
      if (!cJSON_IsObject(e)) st = DT_FAIL(DT_ERR_CORRUPT, "%s: __metadata__ is not an object", what);
      for (cJSON* m = e->child; m && st == DT_SUCCESS; m = m->next)
        if (!cJSON_IsString(m))
          st = DT_FAIL(DT_ERR_CORRUPT, "%s: __metadata__ value '%s' is not a string", what, m->string);
      continue;
    }
    dt__ck_st_entry_t* x = &es[k];
    const cJSON* dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON* sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON* of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
        cJSON_GetArraySize(of) != 2) {
      st = DT_FAIL(DT_ERR_CORRUPT,
                   "%s: header entry '%.200s' lacks dtype (string), shape (array) or "
                   "data_offsets (two numbers)", what, e->string);
      break;
    }
    x->key = strdup(e->string);
    if (x->key == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: a key", what);
      break;
    }
    k++;
    snprintf(x->dtype_name, sizeof x->dtype_name, "%.15s", dt->valuestring);
    if (!dt__ck_st_dtype_parse(dt->valuestring, &x->dtype)) x->dtype = DT_DTYPE_COUNT;
    int nd = cJSON_GetArraySize(sh);
    if (nd > DT_MAX_DIMS) {
      st = DT_FAIL(DT_ERR_UNSUPPORTED, "%s: tensor '%.200s' has %d dims (at most %d)", what,
                   x->key, nd, DT_MAX_DIMS);
      break;
    }
    x->ndim = nd;
    int64_t numel = 1;
    for (int d = 0; d < nd && st == DT_SUCCESS; d++) {
      if (!dt__ck_int(cJSON_GetArrayItem(sh, d), DT__CK_MAX_SAFE, &x->shape[d]))
        st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%.200s': shape[%d] is not a size", what,
                     x->key, d);
      else if (x->shape[d] > 0 && numel > DT__CK_MAX_SAFE / x->shape[d])
        st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%.200s': shape too large", what, x->key);
      else
        numel *= x->shape[d];
    }
    if (st != DT_SUCCESS) break;
    if (!dt__ck_int(cJSON_GetArrayItem(of, 0), DT__CK_MAX_SAFE, &x->begin) ||
        !dt__ck_int(cJSON_GetArrayItem(of, 1), DT__CK_MAX_SAFE, &x->end) || x->end < x->begin ||
        x->end > data_nbytes) {
      st = DT_FAIL(DT_ERR_CORRUPT,
                   "%s: tensor '%.200s': data_offsets out of the file's %" PRId64 " data bytes",
                   what, x->key, data_nbytes);
      break;
    }
    if (x->dtype != DT_DTYPE_COUNT &&
        (numel > DT__CK_MAX_SAFE / 8 || numel * (int64_t)dt__ck_itemsize(x->dtype) != x->end - x->begin)) {
      st = DT_FAIL(DT_ERR_CORRUPT,
                   "%s: tensor '%.200s': %" PRId64 " bytes for a %s tensor of %" PRId64
                   " elements", what, x->key, x->end - x->begin, x->dtype_name, numel);
      break;
    }
  }
  const cJSON* meta = cJSON_GetObjectItemCaseSensitive(root, DT__CK_META_KEY);
  const size_t pl = strlen(DT__CK_KIND_META);
  for (const cJSON* m = meta ? meta->child : NULL; m && st == DT_SUCCESS; m = m->next) {
    if (strncmp(m->string, DT__CK_KIND_META, pl) != 0) continue;
    int i = 0;
    while (i < k && strcmp(es[i].key, m->string + pl) != 0) i++;
    if (i == k)
      st = DT_FAIL(DT_ERR_CORRUPT, "%s: __metadata__ '%.200s' names no tensor of the file", what,
                   m->string);
    else if (strcmp(m->valuestring, "optim") != 0 && strcmp(m->valuestring, "tensor") != 0)
      st = DT_FAIL(DT_ERR_CORRUPT, "%s: __metadata__ '%.200s' is '%.40s' (valid: optim, tensor)",
                   what, m->string, m->valuestring);
    else
      snprintf(es[i].kind, sizeof es[i].kind, "%s", m->valuestring);
  }
  cJSON_Delete(root);
  if (st == DT_SUCCESS) {
    dt__ck_st_entry_t* sorted = malloc((k > 0 ? (size_t)k : 1) * sizeof *sorted);
    if (sorted == NULL) {
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: sort", what);
    } else {
      memcpy(sorted, es, (size_t)k * sizeof *sorted);
      qsort(sorted, (size_t)k, sizeof *sorted, dt__ck_cmp_key); /* one entry per name */
      for (int i = 1; i < k && st == DT_SUCCESS; i++)
        if (strcmp(sorted[i - 1].key, sorted[i].key) == 0)
          st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%.200s' appears twice in the header", what,
                       sorted[i].key);
      qsort(sorted, (size_t)k, sizeof *sorted, dt__ck_cmp_begin);
      int64_t at = 0;
      for (int i = 0; i < k && st == DT_SUCCESS; i++) {
        if (sorted[i].begin != at)
          st = DT_FAIL(DT_ERR_CORRUPT,
                       "%s: tensor '%.200s' starts at data byte %" PRId64 ", expected %" PRId64
                       " (entries must tile the data without holes or overlaps)",
                       what, sorted[i].key, sorted[i].begin, at);
        at = sorted[i].end;
      }
      if (st == DT_SUCCESS && at != data_nbytes)
        st = DT_FAIL(DT_ERR_CORRUPT, "%s: the entries cover %" PRId64 " of the %" PRId64
                     " data bytes", what, at, data_nbytes);
      free(sorted);
    }
  }
  if (st != DT_SUCCESS) {
    dt__ck_st_free(es, k);
    return st;
  }
  *out = es;
  *n = k;
  return DT_SUCCESS;
}

dt_status_t dt__ck_st_read_header(int fd, int64_t file_nbytes, const char* what, char** hdr,
                                  uint64_t* hdr_len) {
  *hdr = NULL;
  *hdr_len = 0;
  unsigned char b[8];
  if (file_nbytes < 8)
    return DT_FAIL(DT_ERR_CORRUPT, "%s: %" PRId64 " bytes, too short for a safetensors file", what,
                   file_nbytes);
  DT_CHECK(dt__ck_pread_all(fd, b, 8, 0, what));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
  if (n > DT__CK_HEADER_MAX || n > (uint64_t)file_nbytes - 8)
    return DT_FAIL(DT_ERR_CORRUPT,
                   "%s: header length %" PRIu64 " exceeds the file (%" PRId64 " bytes) or the "
                   "safetensors limit (%" PRIu64 ")", what, n, file_nbytes, DT__CK_HEADER_MAX);
  char* h = malloc(n + 1);
  if (h == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: header of %" PRIu64 " bytes", what, n);
  dt_status_t st = dt__ck_pread_all(fd, h, n, 8, what);
  if (st != DT_SUCCESS) {
    free(h);
    return st;
  }
  h[n] = '\0';
  *hdr = h;
  *hdr_len = n;
  return DT_SUCCESS;
}

dt_status_t dt__ck_st_write_header(int fd, const char* hdr, size_t len, const char* path) {
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)len >> (8 * i));
  DT_CHECK(dt__ck_write_all(fd, len8, 8, path));
  return dt__ck_write_all(fd, hdr, len, path);
}

/* ---- index.json ---------------------------------------------------------------------------- */

static cJSON* dt__ck_ints(const int64_t* v, int n) {
  cJSON* a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

char* dt__ck_index_to_json(const dt__ck_index_t* ix) {
  cJSON* root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", DT__CK_FORMAT);
  cJSON_AddNumberToObject(root, "format_version", DT__CK_VERSION);
  cJSON_AddStringToObject(root, "library_version", ix->library);
  cJSON_AddNumberToObject(root, "step", (double)ix->step);
  cJSON_AddNumberToObject(root, "world_size", ix->world_size);
  cJSON_AddNumberToObject(root, "block_nbytes", (double)ix->block_nbytes);
  cJSON* files = cJSON_AddArrayToObject(root, "files");
  for (int i = 0; i < ix->n_files; i++) {
    cJSON* f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "name", ix->files[i].name);
    cJSON_AddNumberToObject(f, "nbytes", (double)ix->files[i].nbytes);
    cJSON_AddItemToArray(files, f);
  }
  cJSON_AddItemToObject(root, "values",
                        ix->values ? cJSON_Duplicate(ix->values, 1) : cJSON_CreateObject());
  cJSON* tensors = cJSON_AddArrayToObject(root, "tensors");
  for (int i = 0; i < ix->n_tensors; i++) {
    const dt__ck_tensor_t* t = &ix->tensors[i];
    cJSON* o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON* al = cJSON_AddArrayToObject(o, "aliases");
    for (int a = 0; a < t->n_alias; a++) cJSON_AddItemToArray(al, cJSON_CreateString(t->alias[a]));
    cJSON_AddStringToObject(o, "kind", t->kind);
    cJSON_AddStringToObject(o, "dtype", dt_dtype_name(t->dtype));
    cJSON_AddItemToObject(o, "shape", dt__ck_ints(t->shape, t->ndim));
    cJSON* mesh = cJSON_AddObjectToObject(o, "mesh");
    cJSON* ms = cJSON_AddArrayToObject(mesh, "shape");
    cJSON* mn = cJSON_AddArrayToObject(mesh, "names");
    cJSON* pl = cJSON_AddArrayToObject(o, "placements");
    for (int d = 0; d < t->mesh_ndim; d++) {
      char buf[32];
      cJSON_AddItemToArray(ms, cJSON_CreateNumber(t->mesh_shape[d]));
      cJSON_AddItemToArray(mn, cJSON_CreateString(t->mesh_names[d]));
      if (dt_placement_format(t->pl[d], buf, sizeof buf) != DT_SUCCESS) snprintf(buf, sizeof buf, "?");
      cJSON_AddItemToArray(pl, cJSON_CreateString(buf));
    }
    cJSON* boxes = cJSON_AddArrayToObject(o, "boxes");
    for (int b = 0; b < t->n_boxes; b++) {
      const dt__ck_box_t* x = &t->boxes[b];
      char h[17];
      cJSON* bo = cJSON_CreateObject();
      cJSON_AddNumberToObject(bo, "file", x->file);
      cJSON_AddStringToObject(bo, "key", x->key);
      cJSON_AddItemToObject(bo, "offset", dt__ck_ints(x->off, t->ndim));
      cJSON_AddItemToObject(bo, "length", dt__ck_ints(x->len, t->ndim));
      cJSON_AddNumberToObject(bo, "data_offset", (double)x->data_offset);
      cJSON_AddNumberToObject(bo, "nbytes", (double)x->nbytes);
      dt__ck_hash_format(x->xxh64, h);
      cJSON_AddStringToObject(bo, "xxh64", h);
      cJSON* bl = cJSON_AddArrayToObject(bo, "blocks");
      for (int64_t k = 0; k < x->n_blocks; k++) {
        dt__ck_hash_format(x->blocks[k], h);
        cJSON_AddItemToArray(bl, cJSON_CreateString(h));
      }
      cJSON_AddItemToArray(boxes, bo);
    }
    cJSON_AddItemToArray(tensors, o);
  }
  char* text = cJSON_Print(root);
  cJSON_Delete(root);
  return text;
}

void dt__ck_index_free(dt__ck_index_t* ix) {
  if (ix == NULL) return;
  for (int i = 0; i < ix->n_tensors; i++) {
    dt__ck_tensor_t* t = &ix->tensors[i];
    free(t->name);
    for (int a = 0; a < t->n_alias; a++) free(t->alias[a]);
    free(t->alias);
    /* a save plan counts boxes before it allocates them: n_boxes without boxes after a failure */
    for (int b = 0; t->boxes != NULL && b < t->n_boxes; b++) {
      free(t->boxes[b].key);
      free(t->boxes[b].blocks);
    }
    free(t->boxes);
  }
  free(ix->tensors);
  free(ix->files);
  cJSON_Delete(ix->values);
  memset(ix, 0, sizeof *ix);
}

int dt__ck_index_find(const dt__ck_index_t* ix, const char* name) {
  for (int i = 0; i < ix->n_tensors; i++) {
    if (strcmp(ix->tensors[i].name, name) == 0) return i;
    for (int a = 0; a < ix->tensors[i].n_alias; a++)
      if (strcmp(ix->tensors[i].alias[a], name) == 0) return i;
  }
  return -1;
}

static int dt__ck_box_disjoint(int nd, const dt__ck_box_t* a, const dt__ck_box_t* b) {
  for (int d = 0; d < nd; d++)
    if (a->off[d] + a->len[d] <= b->off[d] || b->off[d] + b->len[d] <= a->off[d]) return 1;
  return 0;
}

static dt_status_t dt__ck_parse_box(const cJSON* bo, const dt__ck_index_t* ix,
                                    const dt__ck_tensor_t* t, int b, const char* what,
                                    dt__ck_box_t* x) {
  const char* tn = t->name;
  const cJSON* f = cJSON_GetObjectItemCaseSensitive(bo, "file");
  const cJSON* key = cJSON_GetObjectItemCaseSensitive(bo, "key");
  const cJSON* off = cJSON_GetObjectItemCaseSensitive(bo, "offset");
  const cJSON* len = cJSON_GetObjectItemCaseSensitive(bo, "length");
  const cJSON* h = cJSON_GetObjectItemCaseSensitive(bo, "xxh64");
  const cJSON* bl = cJSON_GetObjectItemCaseSensitive(bo, "blocks");
  int64_t fi = 0;
  if (!cJSON_IsObject(bo) || !dt__ck_int(f, ix->n_files - 1, &fi) || ix->n_files == 0 ||
      !cJSON_IsString(key) || !cJSON_IsArray(off) || !cJSON_IsArray(len) ||
      cJSON_GetArraySize(off) != t->ndim || cJSON_GetArraySize(len) != t->ndim ||
      !dt__ck_int(cJSON_GetObjectItemCaseSensitive(bo, "data_offset"), DT__CK_MAX_SAFE,
                  &x->data_offset) ||
      !dt__ck_int(cJSON_GetObjectItemCaseSensitive(bo, "nbytes"), DT__CK_MAX_SAFE, &x->nbytes) ||
      !dt__ck_hash_parse(cJSON_IsString(h) ? h->valuestring : NULL, &x->xxh64) ||
      !cJSON_IsArray(bl))
    return DT_FAIL(DT_ERR_CORRUPT,
                   "%s: tensor '%s' box %d: needs file (a file index), key, offset and length (%d "
                   "numbers each), data_offset, nbytes, xxh64 (16 hex digits), blocks", what, tn,
                   b, t->ndim);
  x->file = (int)fi;
  x->key = strdup(key->valuestring);
  if (x->key == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: a key", what);
  int64_t numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (!dt__ck_int(cJSON_GetArrayItem(off, d), DT__CK_MAX_SAFE, &x->off[d]) ||
        !dt__ck_int(cJSON_GetArrayItem(len, d), DT__CK_MAX_SAFE, &x->len[d]) || x->len[d] < 1 ||
        x->off[d] > t->shape[d] - x->len[d])
      return DT_FAIL(DT_ERR_CORRUPT,
                     "%s: tensor '%s' box %d: dim %d is not a non-empty range within the shape",
                     what, tn, b, d);
    numel *= x->len[d]; /* <= the tensor's numel, checked against overflow by the caller */
  }
  if (x->nbytes != numel * (int64_t)dt__ck_itemsize(t->dtype))
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' box %d: nbytes %" PRId64 " for %" PRId64
                   " elements of %s", what, tn, b, x->nbytes, numel, dt_dtype_name(t->dtype));
  if (x->data_offset > ix->files[fi].nbytes - x->nbytes || x->data_offset < 8)
    return DT_FAIL(DT_ERR_CORRUPT,
                   "%s: tensor '%s' box %d: bytes [%" PRId64 ", +%" PRId64 ") outside %s (%" PRId64
                   " bytes)", what, tn, b, x->data_offset, x->nbytes, ix->files[fi].name,
                   ix->files[fi].nbytes);
  x->n_blocks = (x->nbytes + ix->block_nbytes - 1) / ix->block_nbytes;
  if (cJSON_GetArraySize(bl) != x->n_blocks)
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' box %d: %d block checksums, expected %" PRId64,
                   what, tn, b, cJSON_GetArraySize(bl), x->n_blocks);
  x->blocks = malloc((size_t)(x->n_blocks > 0 ? x->n_blocks : 1) * sizeof *x->blocks);
  if (x->blocks == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: block checksums", what);
  int64_t k = 0;
  for (const cJSON* e = bl->child; e; e = e->next, k++)
    if (!dt__ck_hash_parse(cJSON_IsString(e) ? e->valuestring : NULL, &x->blocks[k]))
      return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' box %d: block checksum %" PRId64
                     " is not 16 hex digits", what, tn, b, k);
  return DT_SUCCESS;
}

static dt_status_t dt__ck_parse_tensor(const cJSON* o, dt__ck_index_t* ix, int i,
                                       const char* what, dt__ck_tensor_t* t) {
  const cJSON* name = cJSON_GetObjectItemCaseSensitive(o, "name");
  if (!cJSON_IsObject(o) || !cJSON_IsString(name) || !dt__ck_name_ok(name->valuestring, 0))
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensors[%d] has no valid name", what, i);
  t->name = strdup(name->valuestring);
  if (t->name == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: a name", what);
  const char* tn = t->name;
  const cJSON* al = cJSON_GetObjectItemCaseSensitive(o, "aliases");
  const cJSON* kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
  const cJSON* dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
  const cJSON* sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
  const cJSON* mesh = cJSON_GetObjectItemCaseSensitive(o, "mesh");
  const cJSON* ms = cJSON_GetObjectItemCaseSensitive(mesh, "shape");
  const cJSON* mn = cJSON_GetObjectItemCaseSensitive(mesh, "names");
  const cJSON* pl = cJSON_GetObjectItemCaseSensitive(o, "placements");
  const cJSON* boxes = cJSON_GetObjectItemCaseSensitive(o, "boxes");
  if (!cJSON_IsArray(al) || !cJSON_IsString(kind) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) ||
      !cJSON_IsArray(ms) || !cJSON_IsArray(mn) || !cJSON_IsArray(pl) || !cJSON_IsArray(boxes))
    return DT_FAIL(DT_ERR_CORRUPT,
                   "%s: tensor '%s' needs aliases, kind, dtype, shape, mesh {shape, names}, "
                   "placements and boxes", what, tn);
  if (strcmp(kind->valuestring, "param") && strcmp(kind->valuestring, "optim") &&
      strcmp(kind->valuestring, "tensor"))
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': kind '%.40s' (valid: param, optim, tensor)",
                   what, tn, kind->valuestring);
  snprintf(t->kind, sizeof t->kind, "%s", kind->valuestring);
  if (dt_dtype_parse(dt->valuestring, &t->dtype) != DT_SUCCESS) {
    dt_clear_error();
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': dtype '%.40s' (valid: f32, bf16, f16, i32, "
                   "i64)", what, tn, dt->valuestring);
  }
  int na = cJSON_GetArraySize(al);
  if (na > 0) {
    t->alias = calloc((size_t)na, sizeof *t->alias);
    if (t->alias == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: aliases", what);
    for (const cJSON* a = al->child; a; a = a->next) {
      if (!cJSON_IsString(a) || !dt__ck_name_ok(a->valuestring, 0))
        return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': an alias is not a valid name", what, tn);
      t->alias[t->n_alias] = strdup(a->valuestring);
      if (t->alias[t->n_alias++] == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: alias", what);
    }
  }
  t->ndim = cJSON_GetArraySize(sh);
  if (t->ndim > DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s' has %d dims (at most %d)", what, tn, t->ndim,
                   DT_MAX_DIMS);
  int64_t numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (!dt__ck_int(cJSON_GetArrayItem(sh, d), DT__CK_MAX_SAFE, &t->shape[d]))
      return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': shape[%d] is not a size", what, tn, d);
    if (t->shape[d] > 0 && numel > (DT__CK_MAX_SAFE / 8) / t->shape[d])
      return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': shape too large", what, tn);
    numel *= t->shape[d];
  }
  t->mesh_ndim = cJSON_GetArraySize(ms);
  if (t->mesh_ndim < 1 || t->mesh_ndim > DT_MAX_MESH_DIMS || cJSON_GetArraySize(mn) != t->mesh_ndim ||
      cJSON_GetArraySize(pl) != t->mesh_ndim)
    return DT_FAIL(DT_ERR_CORRUPT,
                   "%s: tensor '%s': mesh shape, names and placements need 1 to %d entries each, "
                   "equally many", what, tn, DT_MAX_MESH_DIMS);
  for (int d = 0; d < t->mesh_ndim; d++) {
    int64_t v = 0;
    const cJSON* nm = cJSON_GetArrayItem(mn, d);
    const cJSON* p = cJSON_GetArrayItem(pl, d);
    if (!dt__ck_int(cJSON_GetArrayItem(ms, d), 1 << 24, &v) || v < 1 || !cJSON_IsString(nm) ||
        strlen(nm->valuestring) >= sizeof t->mesh_names[d] || !cJSON_IsString(p))
      return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': mesh dim %d is malformed", what, tn, d);
    t->mesh_shape[d] = (int)v;
    snprintf(t->mesh_names[d], sizeof t->mesh_names[d], "%s", nm->valuestring);
    if (dt_placement_parse(p->valuestring, &t->pl[d]) != DT_SUCCESS ||
        dt_placement_normalize(&t->pl[d], t->ndim) != DT_SUCCESS) {
      dt_clear_error();
      return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': placement '%.40s' on mesh dim %d", what, tn,
                     p->valuestring, d);
    }
  }
  int nb = cJSON_GetArraySize(boxes);
  t->boxes = calloc(nb > 0 ? (size_t)nb : 1, sizeof *t->boxes);
  if (t->boxes == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: boxes", what);
  int64_t covered = 0;
  for (const cJSON* bo = boxes->child; bo; bo = bo->next) {
    dt__ck_box_t* x = &t->boxes[t->n_boxes++];
    DT_CHECK(dt__ck_parse_box(bo, ix, t, t->n_boxes - 1, what, x));
    covered += x->nbytes / (int64_t)dt__ck_itemsize(t->dtype);
  }
  if (covered != numel)
    return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': its boxes hold %" PRId64 " of its %" PRId64
                   " elements", what, tn, covered, numel);
  for (int a = 0; a < t->n_boxes; a++)
    for (int b = a + 1; b < t->n_boxes; b++)
      if (!dt__ck_box_disjoint(t->ndim, &t->boxes[a], &t->boxes[b]))
        return DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': boxes %d and %d overlap", what, tn, a, b);
  return DT_SUCCESS;
}

static dt_status_t dt__ck_parse_values(const cJSON* v, const char* what) {
  if (!cJSON_IsObject(v)) return DT_FAIL(DT_ERR_CORRUPT, "%s: values is not an object", what);
  for (const cJSON* e = v->child; e; e = e->next) {
    const cJSON* i = cJSON_GetObjectItemCaseSensitive(e, "i64");
    const cJSON* f = cJSON_GetObjectItemCaseSensitive(e, "f64");
    int ok = cJSON_IsObject(e) && cJSON_GetArraySize(e) == 1 && strlen(e->string) > 0 &&
             strlen(e->string) < DT_CHECKPOINT_KEY_MAX;
    if (ok && i) {
      char* end = NULL;
      errno = 0;
      ok = cJSON_IsString(i) && i->valuestring[0] != '\0';
      if (ok) (void)strtoll(i->valuestring, &end, 10);
      ok = ok && errno == 0 && end && *end == '\0';
    } else if (ok && f) {
      ok = cJSON_IsNumber(f) && isfinite(f->valuedouble);
    } else {
      ok = 0;
    }
    if (!ok)
      return DT_FAIL(DT_ERR_CORRUPT, "%s: value '%.64s' is not {\"i64\": \"decimal\"} or "
                     "{\"f64\": number}", what, e->string ? e->string : "");
    for (const cJSON* p = v->child; p != e; p = p->next) /* a key twice: which one is meant? */
      if (strcmp(p->string, e->string) == 0)
        return DT_FAIL(DT_ERR_CORRUPT, "%s: value '%.64s' appears twice", what, e->string);
  }
  return DT_SUCCESS;
}

static dt_status_t dt__ck_index_parse_impl(const cJSON* root, const char* what,
                                           dt__ck_index_t* ix) {
  const cJSON* fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON* ver = cJSON_GetObjectItemCaseSensitive(root, "format_version");
  const cJSON* lib = cJSON_GetObjectItemCaseSensitive(root, "library_version");
  if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, DT__CK_FORMAT))
    return DT_FAIL(DT_ERR_CORRUPT, "%s: not a dtensor checkpoint index (\"format\": \"%s\")", what,
                   DT__CK_FORMAT);
  if (!cJSON_IsNumber(ver) || ver->valuedouble != DT__CK_VERSION)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: format_version %g (this library reads %d)", what,
                   cJSON_IsNumber(ver) ? ver->valuedouble : -1.0, DT__CK_VERSION);
  int64_t step = 0, ws = 0, block = 0;
  const cJSON* st = cJSON_GetObjectItemCaseSensitive(root, "step");
  if (!cJSON_IsString(lib) || strlen(lib->valuestring) >= sizeof ix->library ||
      !cJSON_IsNumber(st) || st->valuedouble != floor(st->valuedouble) ||
      fabs(st->valuedouble) > (double)DT__CK_MAX_SAFE ||
      !dt__ck_int(cJSON_GetObjectItemCaseSensitive(root, "world_size"), 1 << 24, &ws) || ws < 1 ||
      !dt__ck_int(cJSON_GetObjectItemCaseSensitive(root, "block_nbytes"), DT__CK_BLOCK_MAX,
                  &block) || block < DT__CK_BLOCK_MIN)
    return DT_FAIL(DT_ERR_CORRUPT,
                   "%s: needs library_version, step (integer), world_size (>= 1) and block_nbytes "
                   "(%" PRId64 " to %" PRId64 ")", what, DT__CK_BLOCK_MIN, DT__CK_BLOCK_MAX);
  step = (int64_t)st->valuedouble;
  snprintf(ix->library, sizeof ix->library, "%s", lib->valuestring);
  ix->step = step;
  ix->world_size = (int)ws;
  ix->block_nbytes = block;
  const cJSON* files = cJSON_GetObjectItemCaseSensitive(root, "files");
  const cJSON* values = cJSON_GetObjectItemCaseSensitive(root, "values");
  const cJSON* tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  if (!cJSON_IsArray(files) || !cJSON_IsArray(tensors))
    return DT_FAIL(DT_ERR_CORRUPT, "%s: needs files and tensors arrays", what);
  DT_CHECK(dt__ck_parse_values(values, what));
  ix->values = cJSON_Duplicate(values, 1);
  if (ix->values == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: values", what);
  int nf = cJSON_GetArraySize(files);
  ix->files = calloc(nf > 0 ? (size_t)nf : 1, sizeof *ix->files);
  if (ix->files == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: files", what);
  for (const cJSON* f = files->child; f; f = f->next) {
    const cJSON* n = cJSON_GetObjectItemCaseSensitive(f, "name");
    dt__ck_file_t* x = &ix->files[ix->n_files];
    if (!cJSON_IsString(n) || !dt__ck_file_name_ok(n->valuestring) ||
        !dt__ck_int(cJSON_GetObjectItemCaseSensitive(f, "nbytes"), DT__CK_MAX_SAFE, &x->nbytes))
      return DT_FAIL(DT_ERR_CORRUPT, "%s: files[%d] needs a plain file name and nbytes", what,
                     ix->n_files);
    snprintf(x->name, sizeof x->name, "%s", n->valuestring);
    for (int j = 0; j < ix->n_files; j++)
      if (strcmp(ix->files[j].name, x->name) == 0)
        return DT_FAIL(DT_ERR_CORRUPT, "%s: file '%s' listed twice", what, x->name);
    ix->n_files++;
  }
  int nt = cJSON_GetArraySize(tensors);
  ix->tensors = calloc(nt > 0 ? (size_t)nt : 1, sizeof *ix->tensors);
  if (ix->tensors == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: tensors", what);
  int i = 0;
  for (const cJSON* o = tensors->child; o; o = o->next, i++) {
    dt__ck_tensor_t* t = &ix->tensors[ix->n_tensors++];
    DT_CHECK(dt__ck_parse_tensor(o, ix, i, what, t));
    for (int k = -1; k < t->n_alias; k++) { /* the name and every alias: unused before */
      const char* nm = k < 0 ? t->name : t->alias[k];
      int j = dt__ck_index_find(ix, nm);
      if (j >= 0 && j < ix->n_tensors - 1)
        return DT_FAIL(DT_ERR_CORRUPT, "%s: name '%s' is used by two tensors", what, nm);
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt__ck_index_parse(const char* text, size_t len, const char* what,
                               dt__ck_index_t* out) {
  memset(out, 0, sizeof *out);
  const char* end = NULL;
  cJSON* root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (root == NULL)
    return DT_FAIL(DT_ERR_CORRUPT, "%s: not valid JSON (near byte %td)", what,
                   cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : (ptrdiff_t)-1);
  for (const char* c = end; c && c < text + len; c++)
    if (*c != ' ' && *c != '\n' && *c != '\r' && *c != '\t') {
      cJSON_Delete(root);
      return DT_FAIL(DT_ERR_CORRUPT, "%s: bytes after the JSON object (at byte %td)", what,
                     c - text);
    }
  dt_status_t st = dt__ck_index_parse_impl(root, what, out);
  cJSON_Delete(root);
  if (st != DT_SUCCESS) dt__ck_index_free(out);
  return st;
}

dt_status_t dt__ck_index_read(const char* ckdir, dt__ck_index_t* out) {
  memset(out, 0, sizeof *out);
  char path[DT__CK_PATH_MAX];
  if (snprintf(path, sizeof path, "%s/%s", ckdir, DT__CK_INDEX) >= (int)sizeof path)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %s", ckdir);
  char* text = NULL;
  size_t len = 0;
  DT_CHECK(dt__ck_read_file(path, DT__CK_INDEX_MAX, &text, &len));
  dt_status_t st = dt__ck_index_parse(text, len, path, out);
  free(text);
  return st;
}

/* ---- box runs ------------------------------------------------------------------------------ */

int64_t dt__ck_runs(int ndim, const int64_t* src_off, const int64_t* src_len,
                    const int64_t* dst_off, const int64_t* dst_len, int64_t itemsize,
                    dt__ck_run_fn fn, void* ctx) {
  int64_t lo[DT_MAX_DIMS] = {0}, il[DT_MAX_DIMS] = {0}, ss[DT_MAX_DIMS] = {0}, ds[DT_MAX_DIMS] = {0};
  for (int d = 0; d < ndim; d++) {
    int64_t a = src_off[d] > dst_off[d] ? src_off[d] : dst_off[d];
    int64_t b1 = src_off[d] + src_len[d], b2 = dst_off[d] + dst_len[d];
    int64_t b = b1 < b2 ? b1 : b2;
    if (b <= a) return 0;
    lo[d] = a;
    il[d] = b - a;
  }
  int64_t s = 1, t = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    ss[d] = s;
    ds[d] = t;
    s *= src_len[d];
    t *= dst_len[d];
  }
  if (ndim == 0) {
    int r = fn(0, 0, itemsize, ctx);
    return r ? -r : itemsize;
  }
  /* merge trailing dims both boxes span in full */
  int d0 = ndim - 1;
  int64_t run = il[d0];
  while (d0 > 0 && il[d0] == src_len[d0] && il[d0] == dst_len[d0]) {
    d0--;
    run *= il[d0];
  }
  int64_t idx[DT_MAX_DIMS] = {0}, total = 0;
  for (;;) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < ndim; d++) {
      int64_t g = lo[d] + (d < d0 ? idx[d] : 0);
      so += (g - src_off[d]) * ss[d];
      dof += (g - dst_off[d]) * ds[d];
    }
    int r = fn(so * itemsize, dof * itemsize, run * itemsize, ctx);
    if (r) return -r;
    total += run * itemsize;
    int d = d0 - 1;
    while (d >= 0 && ++idx[d] == il[d]) idx[d--] = 0;
    if (d < 0) break;
  }
  return total;
}

/* ---- reading boxes ----------------------------------------------------------------------- */


static int dt__ck_block_bad(dt__ck_reader_t* r, int64_t blk, const unsigned char* p, int64_t len) {
  if (dt__ck_hash(p, (size_t)len) == r->box->blocks[blk]) return 0;
  int64_t o = r->box->data_offset + blk * r->ix->block_nbytes;
  r->st = DT_FAIL(DT_ERR_CORRUPT,
                  "%s: tensor '%s' (box %d, bytes %" PRId64 " to %" PRId64
                  "): checksum mismatch (the file changed or is damaged)",
                  r->path, r->t->name, r->box_index, o, o + len);
  return 1;
}

#define DT__CK_DIRECT_BLOCKS 64 /* whole blocks read straight into the destination per pread */

int dt__ck_read_run(int64_t src, int64_t dst, int64_t n, void* ctx) {
  dt__ck_reader_t* r = ctx;
  int64_t B = r->ix->block_nbytes;
  while (n > 0) {
    int64_t blk = src / B, in = src - blk * B;
    /* whole blocks inside the run: read straight into the destination, checked there */
    int64_t whole = 0;
    while (in == 0 && whole < DT__CK_DIRECT_BLOCKS) {
      int64_t o = (blk + whole) * B, len = r->box->nbytes - o < B ? r->box->nbytes - o : B;
      if (len <= 0 || whole * B + len > n) break;
      whole++;
      if (len < B) break;
    }
    if (whole > 0) {
      int64_t o = blk * B, len = r->box->nbytes - o < whole * B ? r->box->nbytes - o : whole * B;
      r->st = dt__ck_pread_all(r->fd, r->dst + dst, (size_t)len, r->box->data_offset + o, r->path);
      if (r->st != DT_SUCCESS) return 1;
      for (int64_t k = 0; k < whole; k++) {
        int64_t bl = len - k * B < B ? len - k * B : B;
        if (dt__ck_block_bad(r, blk + k, r->dst + dst + k * B, bl)) return 1;
      }
      src += len;
      dst += len;
      n -= len;
      continue;
    }
    /* a block the run covers in part: through the block buffer (kept for the next run) */
    if (blk != r->loaded) {
      int64_t o = blk * B, len = r->box->nbytes - o < B ? r->box->nbytes - o : B;
      r->st = dt__ck_pread_all(r->fd, r->blockbuf, (size_t)len, r->box->data_offset + o, r->path);
      if (r->st != DT_SUCCESS || dt__ck_block_bad(r, blk, r->blockbuf, len)) {
        if (r->st == DT_SUCCESS) r->st = DT_ERR_CORRUPT;
        return 1;
      }
      r->loaded = blk;
    }
    int64_t take = B - in < n ? B - in : n;
    memcpy(r->dst + dst, r->blockbuf + in, (size_t)take);
    src += take;
    dst += take;
    n -= take;
  }
  return 0;
}

dt__ck_fd_t* dt__ck_fds_new(int n) {
  dt__ck_fd_t* fds = calloc((size_t)(n > 0 ? n : 1), sizeof *fds);
  for (int f = 0; fds && f < n; f++) fds[f].fd = -1;
  return fds;
}

void dt__ck_fds_close(dt__ck_fd_t* fds, int n) {
  for (int f = 0; fds && f < n; f++)
    if (fds[f].fd >= 0) close(fds[f].fd);
  free(fds);
}

/* Opens file f once, checking its size and its safetensors header against the index. */
dt_status_t dt__ck_file_open(const char* ckdir, const dt__ck_index_t* ix, int f,
                               dt__ck_fd_t* fds, char* path, size_t cap) {
  snprintf(path, cap, "%s/%s", ckdir, ix->files[f].name);
  if (fds[f].checked) return DT_SUCCESS;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
  if (fd < 0) return DT_FAIL(DT_ERR_IO, "opening %s: %s", path, strerror(errno));
  fds[f].fd = fd;
  struct stat sb;
  if (fstat(fd, &sb) != 0) return DT_FAIL(DT_ERR_IO, "stat %s: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode)) return DT_FAIL(DT_ERR_IO, "%s is not a regular file", path);
  if ((int64_t)sb.st_size != ix->files[f].nbytes)
    return DT_FAIL(DT_ERR_CORRUPT, "%s: %lld bytes, the index says %" PRId64 " (truncated or "
                   "replaced)", path, (long long)sb.st_size, ix->files[f].nbytes);
  char* hdr = NULL;
  uint64_t hl = 0;
  DT_CHECK(dt__ck_st_read_header(fd, ix->files[f].nbytes, path, &hdr, &hl));
  dt__ck_st_entry_t* es = NULL;
  int ne = 0;
  dt_status_t st = dt__ck_st_parse(hdr, (size_t)hl, ix->files[f].nbytes - 8 - (int64_t)hl, path, &es, &ne);
  free(hdr);
  DT_CHECK(st);
  /* every box the index puts in this file is an entry of the header, at the same bytes */
  for (int i = 0; i < ix->n_tensors && st == DT_SUCCESS; i++)
    for (int b = 0; b < ix->tensors[i].n_boxes && st == DT_SUCCESS; b++) {
      const dt__ck_box_t* x = &ix->tensors[i].boxes[b];
      if (x->file != f) continue;
      int k = 0;
      while (k < ne && strcmp(es[k].key, x->key) != 0) k++;
      int ok = k < ne && es[k].dtype == ix->tensors[i].dtype && es[k].ndim == ix->tensors[i].ndim &&
               8 + (int64_t)hl + es[k].begin == x->data_offset && es[k].end - es[k].begin == x->nbytes;
      for (int d = 0; ok && d < es[k].ndim; d++) ok = es[k].shape[d] == x->len[d];
      if (!ok)
        st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': entry '%s' %s the index", path,
                     ix->tensors[i].name, x->key, k < ne ? "disagrees with" : "is missing, listed in");
    }
  dt__ck_st_free(es, ne);
  if (st == DT_SUCCESS) fds[f].checked = 1;
  return st;
}

/* ---- files --------------------------------------------------------------------------------- */

dt_status_t dt__ck_write_all(int fd, const void* p, size_t n, const char* path) {
  const char* c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return DT_FAIL(DT_ERR_IO, "writing %s: %s", path, w < 0 ? strerror(errno) : "no progress");
    c += w;
    n -= (size_t)w;
  }
  return DT_SUCCESS;
}

dt_status_t dt__ck_pread_all(int fd, void* p, size_t n, int64_t off, const char* path) {
  char* c = p;
  while (n > 0) {
    ssize_t r = pread(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return DT_FAIL(DT_ERR_IO, "reading %s at byte %" PRId64 ": %s", path, off, strerror(errno));
    if (r == 0)
      return DT_FAIL(DT_ERR_CORRUPT, "%s: ends at byte %" PRId64 " (truncated?)", path, off);
    c += r;
    n -= (size_t)r;
    off += r;
  }
  return DT_SUCCESS;
}

dt_status_t dt__ck_fsync_path(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DT_FAIL(DT_ERR_IO, "opening %s: %s", path, strerror(errno));
  int r = fsync(fd);
  int e = errno;
  close(fd);
  if (r != 0 && e != EINVAL) return DT_FAIL(DT_ERR_IO, "fsync %s: %s", path, strerror(e));
  return DT_SUCCESS;
}

dt_status_t dt__ck_mkdir_p(const char* path) {
  char buf[DT__CK_PATH_MAX];
  if (path[0] == '\0') return DT_FAIL(DT_ERR_INVALID_ARG, "the directory path is empty");
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", path);
  for (char* c = buf + 1;; c++) {
    if (*c == '/' || *c == '\0') {
      char keep = *c;
      *c = '\0';
      if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return DT_FAIL(DT_ERR_IO, "creating directory %s: %s", buf, strerror(errno));
      *c = keep;
      if (keep == '\0') break;
    }
  }
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return DT_FAIL(DT_ERR_IO, "%s is not a directory", path);
  return DT_SUCCESS;
}

/* rm -rf of name in the directory `at` (path: the same for messages), by file descriptors: a
 * directory is opened with O_NOFOLLOW, so a symbolic link swapped in for it after the lstat is
 * not followed (the open fails) and nothing outside is removed. A checkpoint's trees are two
 * levels deep: past DT__CK_RM_DEPTH levels (a planted tree) it stops with an error instead of
 * exhausting the stack or the open files. */
#define DT__CK_RM_DEPTH 64
static dt_status_t dt__ck_rm_at(int at, const char* name, const char* path, int depth) {
  if (depth > DT__CK_RM_DEPTH)
    return DT_FAIL(DT_ERR_IO, "removing %s: more than %d directory levels (not a checkpoint's "
                   "tree: remove it by hand)", path, DT__CK_RM_DEPTH);
  struct stat sb;
  if (fstatat(at, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? DT_SUCCESS : DT_FAIL(DT_ERR_IO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(sb.st_mode)) {
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR* d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
      dt_status_t st = DT_FAIL(DT_ERR_IO, "opening directory %s: %s", path, strerror(errno));
      if (fd >= 0) close(fd);
      return st;
    }
    struct dirent* e;
    dt_status_t st = DT_SUCCESS;
    while (st == DT_SUCCESS && (e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      /* sub names the entry in messages only (the removal goes by descriptors): a path past
       * PATH_MAX (a pruned or unpublished save's files under a long dir) is cut, not refused */
      char sub[DT__CK_PATH_MAX];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      st = dt__ck_rm_at(dirfd(d), e->d_name, sub, depth + 1);
    }
    closedir(d);
    DT_CHECK(st);
    if (unlinkat(at, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
      return DT_FAIL(DT_ERR_IO, "removing %s: %s", path, strerror(errno));
    return DT_SUCCESS;
  }
  if (unlinkat(at, name, 0) != 0 && errno != ENOENT)
    return DT_FAIL(DT_ERR_IO, "removing %s: %s", path, strerror(errno));
  return DT_SUCCESS;
}

dt_status_t dt__ck_rm_rf(const char* path) { return dt__ck_rm_at(AT_FDCWD, path, path, 0); }

dt_status_t dt__ck_create(const char* path, int* fd) {
  *fd = -1;
  struct stat sb;
  if (lstat(path, &sb) == 0) {
    if (!S_ISREG(sb.st_mode))
      return DT_FAIL(DT_ERR_INVALID_USAGE, "%s is %s: a checkpoint writer never makes one there "
                     "and writes only through files it creates; remove it", path,
                     S_ISLNK(sb.st_mode)  ? "a symbolic link"
                     : S_ISDIR(sb.st_mode) ? "a directory"
                                           : "not a regular file");
    if (unlink(path) != 0 && errno != ENOENT) /* a leftover of a writer that died */
      return DT_FAIL(DT_ERR_IO, "removing the leftover %s: %s", path, strerror(errno));
  } else if (errno != ENOENT) {
    return DT_FAIL(DT_ERR_IO, "stat %s: %s", path, strerror(errno));
  }
  *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (*fd < 0) {
    const int e = errno;
    return DT_FAIL(DT_ERR_IO, "creating %s: %s%s", path, strerror(e),
                   e == EEXIST || e == ELOOP ? " (made by someone else meanwhile)" : "");
  }
  return DT_SUCCESS;
}

dt_status_t dt__ck_write_atomic(const char* dir, const char* name, const void* p, size_t n) {
  DT_CHECK(dt__ck_write_replace(dir, name, p, n));
  return dt__ck_fsync_path(dir);
}

dt_status_t dt__ck_write_replace(const char* dir, const char* name, const void* p, size_t n) {
  char tmp[DT__CK_PATH_MAX], dst[DT__CK_PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name) >= (int)sizeof tmp ||
      snprintf(dst, sizeof dst, "%s/%s", dir, name) >= (int)sizeof dst)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", dir);
  int fd;
  DT_CHECK(dt__ck_create(tmp, &fd)); /* (a link there refused, not removed below) */
  dt_status_t st = dt__ck_write_all(fd, p, n, tmp);
  if (st == DT_SUCCESS && fsync(fd) != 0) st = DT_FAIL(DT_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
  if (close(fd) != 0 && st == DT_SUCCESS) st = DT_FAIL(DT_ERR_IO, "closing %s: %s", tmp, strerror(errno));
  if (st == DT_SUCCESS && rename(tmp, dst) != 0)
    st = DT_FAIL(DT_ERR_IO, "renaming %s to %s: %s", tmp, dst, strerror(errno));
  if (st != DT_SUCCESS) unlink(tmp);
  return st;
}

dt_status_t dt__ck_publish(const char* dir, const char* tmpdir, const char* name) {
  char final[DT__CK_PATH_MAX], line[DT__CK_PATH_MAX];
  if (snprintf(final, sizeof final, "%s/%s", dir, name) >= (int)sizeof final)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", dir);
  if (rename(tmpdir, final) != 0)
    return DT_FAIL(DT_ERR_IO, "renaming %s to %s: %s", tmpdir, final, strerror(errno));
  dt_status_t st = dt__ck_fsync_path(dir);
  if (st == DT_SUCCESS) {
    snprintf(line, sizeof line, "%s\n", name);
    st = dt__ck_write_replace(dir, DT__CK_LATEST, line, strlen(line));
  }
  if (st != DT_SUCCESS) { /* not committed: take it back */
    char msg[1024], why[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (dt__ck_rm_rf(final) == DT_SUCCESS)
      return DT_FAIL(st, "%s", msg);
    snprintf(why, sizeof why, "%s", dt_last_error());
    return DT_FAIL(st, "%s (and taking %.300s back failed: %s)", msg, final, why);
  }
  if (dt__ck_fsync_path(dir) != DT_SUCCESS) {
    fprintf(stderr, "[dtensor checkpoint] saved %.300s, but %s: its name in latest may not "
            "survive a crash\n", final, dt_last_error());
    dt_clear_error();
  }
  return DT_SUCCESS;
}

dt_status_t dt__ck_read_file(const char* path, int64_t max, char** out, size_t* len) {
  *out = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
  if (fd < 0) return DT_FAIL(DT_ERR_IO, "opening %s: %s", path, strerror(errno));
  struct stat sb;
  dt_status_t st = DT_SUCCESS;
  if (fstat(fd, &sb) != 0) st = DT_FAIL(DT_ERR_IO, "stat %s: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode)) st = DT_FAIL(DT_ERR_IO, "%s is not a regular file", path);
  else if ((int64_t)sb.st_size > max)
    st = DT_FAIL(DT_ERR_CORRUPT, "%s: %lld bytes (at most %" PRId64 ")", path,
                 (long long)sb.st_size, max);
  char* buf = NULL;
  if (st == DT_SUCCESS) {
    buf = malloc((size_t)sb.st_size + 1);
    if (buf == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%s: %lld bytes", path, (long long)sb.st_size);
  }
  if (st == DT_SUCCESS) st = dt__ck_pread_all(fd, buf, (size_t)sb.st_size, 0, path);
  close(fd);
  if (st != DT_SUCCESS) {
    free(buf);
    return st;
  }
  buf[sb.st_size] = '\0';
  *out = buf;
  *len = (size_t)sb.st_size;
  return DT_SUCCESS;
}

dt_status_t dt__ck_resolve(const char* path, char* ckdir, size_t cap) {
  char p[DT__CK_PATH_MAX];
  struct stat sb;
  if (snprintf(p, sizeof p, "%s/%s", path, DT__CK_INDEX) >= (int)sizeof p)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", path);
  if (stat(p, &sb) == 0) {
    if (snprintf(ckdir, cap, "%s", path) >= (int)cap)
      return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", path);
    return DT_SUCCESS;
  }
  char name[DT_CHECKPOINT_NAME_MAX];
  DT_CHECK(dt_checkpoint_latest(path, name, sizeof name));
  if (snprintf(ckdir, cap, "%s/%s", path, name) >= (int)cap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", path);
  return DT_SUCCESS;
}

static dt_status_t dt__checkpoint_latest(const char* dir, char* name, size_t cap) {
  DT__CK_PATH_ARG(dir);
  DT_ARG_NOT_NULL(name);
  if (cap > 0) name[0] = '\0';
  char p[DT__CK_PATH_MAX];
  if (snprintf(p, sizeof p, "%s/%s", dir, DT__CK_LATEST) >= (int)sizeof p)
    return DT_FAIL(DT_ERR_INVALID_ARG, "path too long: %.200s", dir);
  char* text = NULL;
  size_t len = 0;
  DT_CHECK(dt__ck_read_file(p, DT_CHECKPOINT_NAME_MAX + 2, &text, &len));
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
    text[--len] = '\0';
  dt_status_t st = DT_SUCCESS;
  if (!dt__ck_name_ok(text, 1))
    st = DT_FAIL(DT_ERR_CORRUPT, "%s does not hold a checkpoint name", p);
  else if (len + 1 > cap)
    st = DT_FAIL(DT_ERR_INVALID_ARG, "cap=%zu (the name needs %zu)", cap, len + 1);
  else
    memcpy(name, text, len + 1);
  free(text);
  return st;
}

dt_status_t dt_checkpoint_latest(const char* dir, char* name, size_t cap) {
  DT_ENTRY_RETURN(dt__checkpoint_latest(dir, name, cap));
}

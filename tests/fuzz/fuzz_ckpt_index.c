/* fuzz_ckpt_index.c - libFuzzer harness for a checkpoint's index.json parser (dt__ck_index_parse,
 * src/checkpoint/format.c): the input is the file's text (not NUL-terminated: the parser gets its
 * length). The parser never crashes and explains every failure, leaving the index empty; an
 * accepted index satisfies what the parser promises (sizes and ranges, boxes within their tensor
 * and their file, block checksums counted, boxes tiling each tensor exactly once, names unique);
 * and dt__ck_index_to_json writes it back as text that parses again to the same index and
 * serializes to the same text; dt_checkpoint_info prints it (from a private directory). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "checkpoint/format.h"
#include "fuzz_common.h"

static int64_t numel_of(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static int disjoint(int nd, const dt__ck_box_t* a, const dt__ck_box_t* b) {
  for (int d = 0; d < nd; d++)
    if (a->off[d] + a->len[d] <= b->off[d] || b->off[d] + b->len[d] <= a->off[d]) return 1;
  return 0;
}

static void check_index(const dt__ck_index_t* ix) {
  DT_FUZZ_ASSERT(ix->world_size >= 1);
  DT_FUZZ_ASSERT(ix->block_nbytes >= DT__CK_BLOCK_MIN && ix->block_nbytes <= DT__CK_BLOCK_MAX);
  DT_FUZZ_ASSERT(memchr(ix->library, '\0', sizeof ix->library) != NULL);
  DT_FUZZ_ASSERT(cJSON_IsObject(ix->values));
  DT_FUZZ_ASSERT(ix->n_files >= 0 && ix->n_tensors >= 0);
  for (int f = 0; f < ix->n_files; f++) {
    DT_FUZZ_ASSERT(ix->files[f].nbytes >= 0 && ix->files[f].name[0] != '\0');
    DT_FUZZ_ASSERT(strchr(ix->files[f].name, '/') == NULL && ix->files[f].name[0] != '.');
  }
  for (int i = 0; i < ix->n_tensors; i++) {
    const dt__ck_tensor_t* t = &ix->tensors[i];
    DT_FUZZ_ASSERT(dt__ck_name_ok(t->name, 0));
    DT_FUZZ_ASSERT(dt__ck_index_find(ix, t->name) == i); /* names are unique */
    for (int a = 0; a < t->n_alias; a++) /* each alias reaches this tensor, no other */
      DT_FUZZ_ASSERT(dt__ck_name_ok(t->alias[a], 0) && dt__ck_index_find(ix, t->alias[a]) == i);
    DT_FUZZ_ASSERT(t->dtype >= 0 && t->dtype < DT_DTYPE_COUNT);
    DT_FUZZ_ASSERT(t->ndim >= 0 && t->ndim <= DT_MAX_DIMS);
    DT_FUZZ_ASSERT(t->mesh_ndim >= 1 && t->mesh_ndim <= DT_MAX_MESH_DIMS);
    for (int d = 0; d < t->ndim; d++) DT_FUZZ_ASSERT(t->shape[d] >= 0);
    for (int d = 0; d < t->mesh_ndim; d++) DT_FUZZ_ASSERT(t->mesh_shape[d] >= 1);
    size_t isz = 0;
    DT_FUZZ_ASSERT(dt_dtype_itemsize(t->dtype, &isz) == DT_SUCCESS && isz > 0);
    int64_t covered = 0;
    for (int b = 0; b < t->n_boxes; b++) {
      const dt__ck_box_t* x = &t->boxes[b];
      DT_FUZZ_ASSERT(x->file >= 0 && x->file < ix->n_files && x->key != NULL);
      for (int d = 0; d < t->ndim; d++)
        DT_FUZZ_ASSERT(x->len[d] >= 1 && x->off[d] >= 0 && x->off[d] + x->len[d] <= t->shape[d]);
      int64_t n = numel_of(t->ndim, x->len);
      DT_FUZZ_ASSERT(x->nbytes == n * (int64_t)isz);
      DT_FUZZ_ASSERT(x->data_offset >= 8 &&
                     x->data_offset + x->nbytes <= ix->files[x->file].nbytes);
      DT_FUZZ_ASSERT(x->n_blocks == (x->nbytes + ix->block_nbytes - 1) / ix->block_nbytes);
      DT_FUZZ_ASSERT(x->n_blocks == 0 || x->blocks != NULL);
      covered += n;
      for (int c = 0; c < b; c++) DT_FUZZ_ASSERT(disjoint(t->ndim, x, &t->boxes[c]));
    }
    DT_FUZZ_ASSERT(covered == numel_of(t->ndim, t->shape)); /* with disjoint: an exact tiling */
  }
}

static void same_index(const dt__ck_index_t* a, const dt__ck_index_t* b) {
  DT_FUZZ_ASSERT(strcmp(a->library, b->library) == 0);
  DT_FUZZ_ASSERT(a->step == b->step && a->world_size == b->world_size);
  DT_FUZZ_ASSERT(a->block_nbytes == b->block_nbytes);
  DT_FUZZ_ASSERT(cJSON_Compare(a->values, b->values, 1));
  DT_FUZZ_ASSERT(a->n_files == b->n_files && a->n_tensors == b->n_tensors);
  for (int f = 0; f < a->n_files; f++) {
    DT_FUZZ_ASSERT(strcmp(a->files[f].name, b->files[f].name) == 0);
    DT_FUZZ_ASSERT(a->files[f].nbytes == b->files[f].nbytes);
  }
  for (int i = 0; i < a->n_tensors; i++) {
    const dt__ck_tensor_t* s = &a->tensors[i];
    const dt__ck_tensor_t* t = &b->tensors[i];
    DT_FUZZ_ASSERT(strcmp(s->name, t->name) == 0 && strcmp(s->kind, t->kind) == 0);
    DT_FUZZ_ASSERT(s->n_alias == t->n_alias);
    for (int k = 0; k < s->n_alias; k++) DT_FUZZ_ASSERT(strcmp(s->alias[k], t->alias[k]) == 0);
    DT_FUZZ_ASSERT(s->dtype == t->dtype && s->ndim == t->ndim && s->mesh_ndim == t->mesh_ndim);
    for (int d = 0; d < s->ndim; d++) DT_FUZZ_ASSERT(s->shape[d] == t->shape[d]);
    for (int d = 0; d < s->mesh_ndim; d++) {
      DT_FUZZ_ASSERT(s->mesh_shape[d] == t->mesh_shape[d]);
      DT_FUZZ_ASSERT(strcmp(s->mesh_names[d], t->mesh_names[d]) == 0);
      DT_FUZZ_ASSERT(dt_placement_equal(s->pl[d], t->pl[d]));
    }
    DT_FUZZ_ASSERT(s->n_boxes == t->n_boxes);
    for (int k = 0; k < s->n_boxes; k++) {
      const dt__ck_box_t* x = &s->boxes[k];
      const dt__ck_box_t* y = &t->boxes[k];
      DT_FUZZ_ASSERT(x->file == y->file && strcmp(x->key, y->key) == 0);
      DT_FUZZ_ASSERT(x->data_offset == y->data_offset && x->nbytes == y->nbytes);
      DT_FUZZ_ASSERT(x->xxh64 == y->xxh64 && x->n_blocks == y->n_blocks);
      for (int d = 0; d < s->ndim; d++)
        DT_FUZZ_ASSERT(x->off[d] == y->off[d] && x->len[d] == y->len[d]);
      for (int64_t q = 0; q < x->n_blocks; q++) DT_FUZZ_ASSERT(x->blocks[q] == y->blocks[q]);
    }
  }
}

static char g_dir[64], g_index[128];

static void remove_dir(void) {
  unlink(g_index);
  rmdir(g_dir);
}

/* dt_checkpoint_info on `text` as DIR/index.json, DIR private to this process, output discarded */
static void info_of(const char* text, size_t len) {
  static FILE* devnull;
  if (g_dir[0] == '\0') {
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_ckpt_index.XXXXXX");
    if (mkdtemp(g_dir) == NULL || (devnull = fopen("/dev/null", "w")) == NULL) abort();
    snprintf(g_index, sizeof g_index, "%s/index.json", g_dir);
    atexit(remove_dir);
  }
  FILE* f = fopen(g_index, "wb");
  if (f == NULL || fwrite(text, 1, len, f) != len || fclose(f) != 0) abort();
  dt_status_t st = dt_checkpoint_info(g_dir, devnull);
  if (st != DT_SUCCESS) {
    fprintf(stderr, "dt_checkpoint_info fails on an index the parser accepts: %s\n",
            dt_last_error());
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* text = malloc(size > 0 ? size : 1); /* exactly size bytes: ASan sees any over-read */
  if (text == NULL) abort();
  memcpy(text, data, size);
  dt__ck_index_t ix;
  dt_status_t st = dt__ck_index_parse(text, size, "fuzz index.json", &ix);
  dt_fuzz_check_error(st, "dt__ck_index_parse");
  if (st != DT_SUCCESS) {
    DT_FUZZ_ASSERT(ix.n_tensors == 0 && ix.tensors == NULL && ix.n_files == 0 &&
                   ix.files == NULL && ix.values == NULL); /* left empty */
    free(text);
    return 0;
  }
  check_index(&ix);
  info_of(text, size);
  char* json = dt__ck_index_to_json(&ix);
  DT_FUZZ_ASSERT(json != NULL);
  dt__ck_index_t iy;
  st = dt__ck_index_parse(json, strlen(json), "fuzz index.json written back", &iy);
  if (st != DT_SUCCESS) {
    fprintf(stderr, "the index written back does not parse: %s\n%s\n", dt_last_error(), json);
    abort();
  }
  same_index(&ix, &iy);
  char* json2 = dt__ck_index_to_json(&iy);
  DT_FUZZ_ASSERT(json2 != NULL && strcmp(json, json2) == 0);
  cJSON_free(json2);
  cJSON_free(json);
  dt__ck_index_free(&iy);
  dt__ck_index_free(&ix);
  DT_FUZZ_ASSERT(ix.tensors == NULL && ix.n_tensors == 0); /* free leaves it empty */
  free(text);
  return 0;
}

/* fuzz_ckpt_header.c - libFuzzer harness for the safetensors header reader and parser of the
 * checkpoint format (dt__ck_st_read_header, dt__ck_st_parse: src/checkpoint/format.c).
 *
 * The input is a whole safetensors file (8-byte little-endian header length, header, data):
 *  - as a file (a memfd): dt__ck_st_read_header, then dt__ck_st_parse of the header it returns
 *    for the data part that follows, as a checkpoint load does;
 *  - as raw bytes: everything after the first 8 bytes handed to dt__ck_st_parse as the header
 *    (exactly that many bytes, not NUL-terminated), for a data part of the size the first 8 bytes
 *    give (little-endian, cut to 54 bits).
 * Neither crashes and each failure has a message. A header read is within the file and the limit
 * and equals the file's bytes. Accepted entries satisfy what dt__ck_st_parse promises: a key,
 * at most DT_MAX_DIMS dims, 0 <= begin <= end <= the data size, numel * itemsize == end - begin
 * for a known dtype, and the entries tile the data in offset order without holes or overlaps.
 * Written back with dt__ck_st_header (in offset order), they parse again to the same entries,
 * kinds (the DT__CK_KIND_META metadata) included. */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "checkpoint/format.h"
#include "fuzz_common.h"

static int by_offset(const void* a, const void* b) {
  const dt__ck_st_entry_t* x = *(const dt__ck_st_entry_t* const*)a;
  const dt__ck_st_entry_t* y = *(const dt__ck_st_entry_t* const*)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

static void check_entries(const dt__ck_st_entry_t* e, int n, int64_t data_nbytes) {
  DT_FUZZ_ASSERT(n >= 0 && (n == 0 || e != NULL));
  if (n == 0) {
    DT_FUZZ_ASSERT(data_nbytes == 0);
    return;
  }
  const dt__ck_st_entry_t** s = malloc((size_t)n * sizeof *s);
  if (s == NULL) abort();
  int known = 1;
  for (int i = 0; i < n; i++) {
    const dt__ck_st_entry_t* x = &e[i];
    s[i] = x;
    DT_FUZZ_ASSERT(x->key != NULL);
    DT_FUZZ_ASSERT(x->ndim >= 0 && x->ndim <= DT_MAX_DIMS);
    DT_FUZZ_ASSERT(0 <= x->begin && x->begin <= x->end && x->end <= data_nbytes);
    DT_FUZZ_ASSERT(memchr(x->dtype_name, '\0', sizeof x->dtype_name) != NULL);
    DT_FUZZ_ASSERT(x->dtype >= 0 && x->dtype <= DT_DTYPE_COUNT);
    int64_t numel = 1;
    for (int d = 0; d < x->ndim; d++) {
      DT_FUZZ_ASSERT(x->shape[d] >= 0);
      numel *= x->shape[d];
    }
    if (x->dtype != DT_DTYPE_COUNT) {
      size_t isz = 0;
      DT_FUZZ_ASSERT(dt_dtype_itemsize(x->dtype, &isz) == DT_SUCCESS);
      DT_FUZZ_ASSERT(numel * (int64_t)isz == x->end - x->begin);
      DT_FUZZ_ASSERT(strcmp(x->dtype_name, dt__ck_st_dtype(x->dtype)) == 0);
    } else {
      known = 0;
    }
  }
  qsort(s, (size_t)n, sizeof *s, by_offset);
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    DT_FUZZ_ASSERT(s[i]->begin == at); /* no hole, no overlap */
    at = s[i]->end;
  }
  DT_FUZZ_ASSERT(at == data_nbytes);
  /* written back in offset order, parsed again: the same entries */
  if (known) {
    const char** keys = malloc((size_t)n * sizeof *keys);
    dt_dtype_t* dts = malloc((size_t)n * sizeof *dts);
    int* nds = malloc((size_t)n * sizeof *nds);
    const int64_t** shapes = malloc((size_t)n * sizeof *shapes);
    int64_t* nb = malloc((size_t)n * sizeof *nb);
    const char** kinds = malloc((size_t)n * sizeof *kinds);
    if (!keys || !dts || !nds || !shapes || !nb || !kinds) abort();
    for (int i = 0; i < n; i++) {
      keys[i] = s[i]->key;
      dts[i] = s[i]->dtype;
      nds[i] = s[i]->ndim;
      shapes[i] = s[i]->shape;
      nb[i] = s[i]->end - s[i]->begin;
      kinds[i] = s[i]->kind;
    }
    size_t len = 0;
    char* hdr = dt__ck_st_header(n, keys, dts, nds, shapes, nb, kinds, &len);
    DT_FUZZ_ASSERT(hdr != NULL && len % 8 == 0 && strlen(hdr) == len);
    dt__ck_st_entry_t* r = NULL;
    int rn = 0;
    dt_status_t st = dt__ck_st_parse(hdr, len, data_nbytes, "fuzz header written back", &r, &rn);
    if (st != DT_SUCCESS) {
      fprintf(stderr, "the header written back does not parse: %s\n%s\n", dt_last_error(), hdr);
      abort();
    }
    DT_FUZZ_ASSERT(rn == n);
    for (int i = 0; i < n; i++) {
      DT_FUZZ_ASSERT(strcmp(r[i].key, s[i]->key) == 0 && r[i].dtype == s[i]->dtype);
      DT_FUZZ_ASSERT(r[i].ndim == s[i]->ndim && strcmp(r[i].kind, s[i]->kind) == 0);
      DT_FUZZ_ASSERT(r[i].begin == s[i]->begin && r[i].end == s[i]->end);
      for (int d = 0; d < r[i].ndim; d++) DT_FUZZ_ASSERT(r[i].shape[d] == s[i]->shape[d]);
    }
    dt__ck_st_free(r, rn);
    free(hdr);
    free(keys);
    free(dts);
    free(nds);
    free(shapes);
    free(nb);
    free(kinds);
  }
  free(s);
}

static void parse_and_check(const char* hdr, size_t len, int64_t data_nbytes, const char* what) {
  dt__ck_st_entry_t* e = NULL;
  int n = -1;
  dt_status_t st = dt__ck_st_parse(hdr, len, data_nbytes, what, &e, &n);
  dt_fuzz_check_error(st, "dt__ck_st_parse");
  if (st != DT_SUCCESS) {
    DT_FUZZ_ASSERT(e == NULL && n == 0);
    return;
  }
  check_entries(e, n, data_nbytes);
  dt__ck_st_free(e, n);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* as a file */
  int fd = memfd_create("fuzz_ckpt_header", MFD_CLOEXEC);
  if (fd < 0) abort();
  if (size > 0 && write(fd, data, size) != (ssize_t)size) abort();
  char* hdr = NULL;
  uint64_t hl = 0;
  dt_status_t st = dt__ck_st_read_header(fd, (int64_t)size, "fuzz.safetensors", &hdr, &hl);
  dt_fuzz_check_error(st, "dt__ck_st_read_header");
  if (st == DT_SUCCESS) {
    DT_FUZZ_ASSERT(hdr != NULL && size >= 8 && hl <= size - 8 && hl <= DT__CK_HEADER_MAX);
    DT_FUZZ_ASSERT(hdr[hl] == '\0' && memcmp(hdr, data + 8, (size_t)hl) == 0);
    parse_and_check(hdr, (size_t)hl, (int64_t)(size - 8 - hl), "fuzz.safetensors");
    free(hdr);
  } else {
    DT_FUZZ_ASSERT(hdr == NULL && hl == 0);
  }
  close(fd);
  /* as raw bytes */
  if (size >= 8) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | data[i];
    size_t len = size - 8;
    char* raw = malloc(len > 0 ? len : 1); /* exactly len bytes: ASan sees any over-read */
    if (raw == NULL) abort();
    memcpy(raw, data + 8, len);
    parse_and_check(raw, len, (int64_t)(v & (((uint64_t)1 << 54) - 1)), "fuzz raw header");
    free(raw);
  }
  return 0;
}

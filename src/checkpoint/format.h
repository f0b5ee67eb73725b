/* format.h - the checkpoint format shared by save, load and the tools: index.json and the
 * safetensors headers (writers and validating parsers), checksums, box runs and file helpers.
 * Public API only below it (like src/parallel), plus cJSON and xxhash. */
#ifndef DT_CHECKPOINT_FORMAT_H
#define DT_CHECKPOINT_FORMAT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dtensor/checkpoint.h"
#include "dtensor/check.h"
#include "dtensor/dtensor.h"

#define DT__CK_FORMAT "dtensor-checkpoint"
#define DT__CK_VERSION 1
#define DT__CK_INDEX "index.json"
#define DT__CK_LATEST "latest"
#define DT__CK_HEADER_MAX ((uint64_t)100 << 20) /* safetensors' own limit on a header */
#define DT__CK_INDEX_MAX ((int64_t)1 << 30)
#define DT__CK_MAX_SAFE ((int64_t)1 << 53) /* integers exact in a JSON number (a double) */
#define DT__CK_BLOCK_DEFAULT ((int64_t)1 << 20)
#define DT__CK_BLOCK_MIN ((int64_t)4 << 10)
#define DT__CK_BLOCK_MAX ((int64_t)64 << 20)
#define DT__CK_FILE_MAX 64 /* a data file's name, NUL included */
#define DT__CK_PATH_MAX 4096

/* One saved box of one tensor. */
typedef struct {
  int file;  /* index into dt__ck_index_t.files */
  char* key; /* its name in the file's safetensors header */
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  int64_t data_offset; /* absolute byte offset in the file */
  int64_t nbytes;
  uint64_t xxh64;   /* of the box's bytes */
  int64_t n_blocks; /* ceil(nbytes / block_nbytes) */
  uint64_t* blocks; /* xxh64 of each block */
} dt__ck_box_t;

typedef struct {
  char* name;
  char kind[16]; /* "param", "optim" or "tensor" */
  int n_alias;
  char** alias;
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int mesh_ndim;
  int mesh_shape[DT_MAX_MESH_DIMS];
  char mesh_names[DT_MAX_MESH_DIMS][32];
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  int n_boxes;
  dt__ck_box_t* boxes;
} dt__ck_tensor_t;

typedef struct {
  char name[DT__CK_FILE_MAX];
  int64_t nbytes;
} dt__ck_file_t;

typedef struct {
  char library[32];
  int64_t step;
  int world_size;
  int64_t block_nbytes;
  int n_files;
  dt__ck_file_t* files;
  int n_tensors;
  dt__ck_tensor_t* tensors;
  cJSON* values; /* owned object: key -> {"i64": "decimal"} | {"f64": number} */
} dt__ck_index_t;

/* index.json */
char* dt__ck_index_to_json(const dt__ck_index_t* ix); /* NULL when out of memory */
/* Parses and validates everything (types, ranges, names, boxes within shapes, boxes tiling each
 * tensor exactly once, byte ranges within their files); `what` names the text in messages.
 * DT_ERR_CORRUPT for anything malformed. On failure *out is left empty. */
dt_status_t dt__ck_index_parse(const char* text, size_t len, const char* what,
                               dt__ck_index_t* out);
/* Reads and parses ckdir/index.json. */
dt_status_t dt__ck_index_read(const char* ckdir, dt__ck_index_t* out);
void dt__ck_index_free(dt__ck_index_t* ix);
/* The tensor named `name` or having it as an alias; -1 when none. */
int dt__ck_index_find(const dt__ck_index_t* ix, const char* name);

/* safetensors */
const char* dt__ck_st_dtype(dt_dtype_t dt); /* "F32", "BF16", "F16", "I32", "I64" */
int dt__ck_st_dtype_parse(const char* s, dt_dtype_t* out); /* 0 when unknown */
typedef struct {
  char* key;
  char dtype_name[16]; /* as written, for messages about dtypes the library lacks */
  dt_dtype_t dtype;    /* DT_DTYPE_COUNT when unknown */
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t begin, end; /* data_offsets, relative to the data */
  char kind[8];       /* "optim" or "tensor" when the metadata says so (DT__CK_KIND_META), else "" */
} dt__ck_st_entry_t;
/* The safetensors header's own key: no tensor may be named so (a whole-tensor box's entry is
 * keyed by the tensor's name: the header had the key twice and no reader took the file). */
#define DT__CK_META_KEY "__metadata__"
/* The __metadata__ key prefix that records a tensor's checkpoint kind where it is not "param"
 * ("dtensor_kind:NAME": "optim"), so a consolidated file imports back with its kinds. Checkpoint
 * names never hold ':'. */
#define DT__CK_KIND_META "dtensor_kind:"
/* A header (JSON text) for n entries packed in order, padded with spaces to a multiple of 8;
 * *len its length. kinds (NULL: none) gives each entry's checkpoint kind, recorded in the
 * metadata where it is not "param". NULL when out of memory. */
char* dt__ck_st_header(int n, const char* const* keys, const dt_dtype_t* dtypes, const int* ndims,
                       const int64_t* const* shapes, const int64_t* nbytes,
                       const char* const* kinds, size_t* len);
/* Parses a header of `len` bytes for a file whose data part has data_nbytes bytes: every entry's
 * dtype known or named, shape times itemsize equal to its byte range, ranges within the data and
 * packed without holes or overlaps (the safetensors rules); a DT__CK_KIND_META entry names a
 * tensor of the file and the kind optim or tensor. DT_ERR_CORRUPT naming `what`. */
dt_status_t dt__ck_st_parse(const char* hdr, size_t len, int64_t data_nbytes, const char* what,
                            dt__ck_st_entry_t** out, int* n);
void dt__ck_st_free(dt__ck_st_entry_t* e, int n);
/* Reads the 8-byte length and the header of an open file of file_nbytes bytes (the length
 * checked against DT__CK_HEADER_MAX and the file). *hdr is malloc'd (NUL-terminated). */
dt_status_t dt__ck_st_read_header(int fd, int64_t file_nbytes, const char* what, char** hdr,
                                  uint64_t* hdr_len);
/* Writes the 8-byte little-endian length and the header (what the reader above reads). */
dt_status_t dt__ck_st_write_header(int fd, const char* hdr, size_t len, const char* path);

/* checksums */
uint64_t dt__ck_hash(const void* p, size_t n);
void dt__ck_hash_format(uint64_t h, char out[17]);

/* The runs of the intersection of a saved box (src) with a destination box (dst), both in
 * global coordinates and row-major: fn(src_byte, dst_byte, nbytes) per contiguous run (byte
 * offsets into each box's data), in increasing src order. Returns the bytes covered (0: no
 * intersection); a nonzero fn result stops and is returned negated. */
typedef int (*dt__ck_run_fn)(int64_t src_byte, int64_t dst_byte, int64_t nbytes, void* ctx);
int64_t dt__ck_runs(int ndim, const int64_t* src_off, const int64_t* src_len,
                    const int64_t* dst_off, const int64_t* dst_len, int64_t itemsize,
                    dt__ck_run_fn fn, void* ctx);

/* Reading saved boxes: a file opened once per load (fd -1 before), its size and safetensors
 * header checked against the index; path[cap] gets its path. */
typedef struct {
  int fd;
  int checked;
} dt__ck_fd_t;
dt_status_t dt__ck_file_open(const char* ckdir, const dt__ck_index_t* ix, int f, dt__ck_fd_t* fds,
                             char* path, size_t cap);
/* A table of n files, none open (NULL when out of memory); closing closes the open ones. */
dt__ck_fd_t* dt__ck_fds_new(int n);
void dt__ck_fds_close(dt__ck_fd_t* fds, int n);
/* A dt__ck_runs callback: copies a run of a saved box into dst, reading through blockbuf the
 * checksum blocks that hold it and checking each (DT_ERR_CORRUPT naming file and tensor). */
typedef struct {
  const dt__ck_index_t* ix;
  const dt__ck_tensor_t* t;
  const dt__ck_box_t* box;
  int box_index;
  const char* path; /* the file's */
  int fd;
  unsigned char* dst;
  unsigned char* blockbuf; /* block_nbytes */
  int64_t loaded;          /* block index held in blockbuf, -1 none */
  dt_status_t st;
} dt__ck_reader_t;
int dt__ck_read_run(int64_t src, int64_t dst, int64_t n, void* ctx);

/* A path argument: DT_ERR_INVALID_ARG when NULL or empty ("" joined with "/NAME" would name the
 * root directory's NAME). */
#define DT__CK_PATH_ARG(p)                                                                     \
  do {                                                                                         \
    DT_ARG_NOT_NULL(p);                                                                        \
    if ((p)[0] == '\0') return DT_FAIL(DT_ERR_INVALID_ARG, "%s is empty (a path is needed)", #p); \
  } while (0)

/* files */
dt_status_t dt__ck_write_all(int fd, const void* p, size_t n, const char* path);
dt_status_t dt__ck_pread_all(int fd, void* p, size_t n, int64_t off, const char* path);
dt_status_t dt__ck_fsync_path(const char* path); /* a file or a directory */
dt_status_t dt__ck_mkdir_p(const char* path);
/* Removes path and, when it is a directory, everything under it (at most 64 levels deep: past
 * that DT_ERR_IO, the rest left); a symbolic link is removed itself, never followed (nor is one
 * swapped in for a directory while it is removed). */
dt_status_t dt__ck_rm_rf(const char* path);
/* Creates the file path for writing (*fd), as a file of the writer's own: a regular file there,
 * the leftover of a writer that died, is removed first; anything else (a symbolic link, a
 * directory, a FIFO) no writer made, and it is refused with DT_ERR_INVALID_USAGE naming it,
 * neither followed nor removed. The open takes O_EXCL | O_NOFOLLOW, so a link planted between
 * that check and the open fails it too (DT_ERR_IO), and a hard link left there is unlinked, not
 * truncated through. */
dt_status_t dt__ck_create(const char* path, int* fd);
/* dir/name written through dir/name.tmp (made by dt__ck_create): write, fsync, rename, fsync
 * dir. */
dt_status_t dt__ck_write_atomic(const char* dir, const char* name, const void* p, size_t n);
/* The same without the directory's fsync: once it returns DT_SUCCESS, dir/name holds the new
 * bytes (on failure it holds the old ones). */
dt_status_t dt__ck_write_replace(const char* dir, const char* name, const void* p, size_t n);
/* Publishes the finished checkpoint directory `tmpdir` as dir/name: renamed, made durable, then
 * dir/latest replaced to name it (the commit). A failure before the commit takes dir/name back
 * (nothing published, latest unchanged); one after it (the directory's last fsync) is written
 * to stderr and the call succeeds. */
dt_status_t dt__ck_publish(const char* dir, const char* tmpdir, const char* name);
/* Reads a whole small file (at most max bytes) into a malloc'd NUL-terminated buffer. */
dt_status_t dt__ck_read_file(const char* path, int64_t max, char** out, size_t* len);
/* A checkpoint directory from `path`: path itself when it holds index.json, else path/<latest>. */
dt_status_t dt__ck_resolve(const char* path, char* ckdir, size_t cap);
/* A name usable as a checkpoint or tensor name (printable, no '"', '\\', ':' or '/' for a
 * checkpoint); 0 when not. */
int dt__ck_name_ok(const char* s, int is_dir);
/* Whether every name and path a save (or an import) of dir/name makes fits, by lengths alone
 * (no I/O): name at most DT_CHECKPOINT_SAVE_NAME_LEN characters (name.unpublished.tmp, the
 * longest name derived from it, within NAME_MAX) and dir/name.tmp/rank_RRRRR.safetensors, the
 * longest path (RRRRR the widest rank below world_size), within DT__CK_PATH_MAX - 1.
 * DT_ERR_INVALID_ARG saying the limit and the length. */
dt_status_t dt__ck_save_path_check(const char* dir, const char* name, int world_size);
double dt__ck_now(void);

#endif /* DT_CHECKPOINT_FORMAT_H */

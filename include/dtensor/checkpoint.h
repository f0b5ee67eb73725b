/* dtensor/checkpoint.h - distributed checkpoints: save tensors, parameters, optimizer state and
 * trainer state from any mesh and placements, load them onto any other.
 *
 * A checkpoint object lists what to save or load: tensors under names (borrowed), a module's
 * parameters, an AdamW optimizer's state, and small named integer and float values (the trainer's
 * step, data position, RNG counters). dt_checkpoint_save writes them to DIR/NAME/; 
 * dt_checkpoint_load reads DIR/NAME/ back into the listed tensors, whatever mesh, placements and
 * rank count they had when saved (FSDP at 4 ranks into TP at 2, HSDP into FSDP x TP, ...).
 *
 * On disk (docs/design.md, "Checkpoint format", says it byte for byte):
 *   DIR/NAME/rank_RRRRR.safetensors  one file per rank that writes something, in the safetensors
 *                                    format (any safetensors reader opens it): each entry is one
 *                                    box of one tensor, named "tensor" when the box is the whole
 *                                    tensor and "tensor:o0,o1,..." (its offsets) otherwise;
 *   DIR/NAME/index.json              the library version, step, every tensor's name (and tied
 *                                    aliases), dtype, global shape, the mesh and placements it was
 *                                    saved from, and its boxes (file, offsets, lengths, byte
 *                                    offset, xxhash64 of the box and of each block of
 *                                    block_nbytes), and the named values;
 *   DIR/latest                       the NAME of the newest complete checkpoint.
 * Each box is written once: of the ranks holding the same box (replicas along Replicate mesh
 * dims) one writes it, chosen round-robin over the tensors; Partial tensors are reduced first.
 *
 * Saving is atomic: files go to DIR/NAME.tmp/, are fsynced, the index is written last, the
 * directory is renamed to DIR/NAME and DIR/latest is replaced the same way (write, fsync,
 * rename). A save that dies half way leaves a NAME.tmp directory, which loads ignore and the next
 * save removes. The writers (saves, dt_checkpoint_consolidate, dt_checkpoint_import) write only
 * through files they create themselves: a symbolic link is never followed. Leftover *.tmp entries
 * a save finds in DIR at its start are its own and removed (a link itself, not its target); a
 * link (or anything but a regular file) found at a temporary path the writer then creates
 * (DIR/latest.tmp, DIR/NAME.tmp/index.json.tmp, OUT.tmp) is DT_ERR_INVALID_USAGE naming it, and
 * is left in place.
 * With async set, dt_checkpoint_save returns once every rank's shards are copied to host
 * staging memory (that copy is the only stall); a background thread writes the files while
 * training goes on, and dt_checkpoint_wait (collective) finishes the save: agrees on the outcome,
 * writes the index and publishes it. The saved tensors may change as soon as save returns.
 * With async DT_CHECKPOINT_ASYNC_DEFER_COPY even that copy leaves the caller: save returns once
 * the plan is agreed (Partial tensors reduced, device shards copied), the background thread
 * copies the host-memory shards first and writes them after, and the caller keeps every saved
 * tensor alive and unchanged until dt_checkpoint_wait_staged returns (a trainer calls it before
 * its optimizer step, so the copy runs during the forward and backward passes, as torchtitan
 * stages while the next step computes).
 *
 * Loading reads, on each rank, only the byte ranges its own shards need (the intersection of each
 * saved box with the rank's box, read by pread in contiguous runs; whole blocks of block_nbytes
 * around them so that every byte used is checked against its block's xxhash64): never a whole
 * foreign shard. Everything is read into host staging and checked on every rank before any
 * tensor is written, so a failed load (a missing tensor, a dtype or shape mismatch, a flipped
 * byte, a truncated file, a malformed header) changes nothing, and every rank returns the same
 * status and message, naming the file and the tensor. Saved tensors not listed are ignored.
 *
 * Host memory: a save stages this rank's shards (its share of the writes) in one host buffer,
 * a load its own shards; the object keeps that buffer between its saves and loads (so that the
 * copy that stalls training writes memory already mapped) and frees it in dt_checkpoint_destroy.
 * A load needs no more: each rank's extra host memory is its own shard bytes plus one checksum
 * block, whatever the resharding.
 *
 * Collective calls (marked) must be made by every rank of the world with the same objects added
 * in the same order. Files live in a directory every rank sees (a shared filesystem across
 * nodes). The inspection functions at the end are local and need no dt_init (tools use them).
 */
#ifndef DTENSOR_CHECKPOINT_H
#define DTENSOR_CHECKPOINT_H

#include <stdio.h>

#include "dtensor/module.h"
#include "dtensor/nn.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_checkpoint* dt_checkpoint_t;

#define DT_CHECKPOINT_NAME_MAX 256 /* tensor names and checkpoint names, NUL included */
/* The longest checkpoint name dt_checkpoint_save and dt_checkpoint_import take, in characters
 * (NUL not included): a save also makes NAME.unpublished.tmp (16 more) beside NAME, and a file
 * name holds at most 255 bytes (NAME_MAX). Longer names, to DT_CHECKPOINT_NAME_MAX - 1, still
 * load. */
#define DT_CHECKPOINT_SAVE_NAME_LEN 239
#define DT_CHECKPOINT_KEY_MAX 64   /* named values' keys, NUL included */

/* An empty list. Local. */
DT_API dt_status_t dt_checkpoint_create(dt_checkpoint_t* out);
/* Frees the list (not the tensors). A save still pending (async, not waited for) is abandoned:
 * its files are finished but it is never published (its NAME.tmp is removed by the next save);
 * call dt_checkpoint_wait first to keep it. NULL is a no-op. Local. */
DT_API dt_status_t dt_checkpoint_destroy(dt_checkpoint_t ck);

/* Adds tensor `t` (borrowed: it must outlive the checkpoint's saves and loads) under `name`
 * (printable ASCII without '"', '\\' or ':' , unique in the list). A save reads it, a load writes
 * its local shard in place. DT_ERR_INVALID_ARG for a duplicate or bad name, and at save for a
 * rank-local tensor (dt_tensor_set_rank_local); DT_ERR_INVALID_USAGE at save for the name
 * "__metadata__" (a safetensors header's own key; loads still read it). Local. */
DT_API dt_status_t dt_checkpoint_add_tensor(dt_checkpoint_t ck, const char* name, dt_tensor_t t);
/* Adds a tensor whose local values are this rank's shard of a tensor of `shape` (ndim dims) placed
 * by `placements` (one per mesh dim of t's mesh) rather than what t's own layout says: how a
 * rank-local tensor (per-rank experts wrapped as Replicate) is saved and loaded. t's local shape
 * must be this rank's box of that layout (checked at save and load). Local. */
DT_API dt_status_t dt_checkpoint_add_tensor_as(dt_checkpoint_t ck, const char* name,
                                               dt_tensor_t t, int ndim, const int64_t* shape,
                                               const dt_placement_t* placements);
/* Adds every parameter of m (dt_module_for_each_param: after wrapping, as the module holds them
 * now) under prefix + its qualified name ("" or NULL: no prefix; else "prefix.name"). A tied
 * parameter is one entry whose other names are recorded as aliases: loading through any of them
 * reaches it. The parameters' value tensors are read and written in place (FSDP's shards, TP's
 * shards). Local. */
DT_API dt_status_t dt_checkpoint_add_module(dt_checkpoint_t ck, const char* prefix, dt_module_t m);
/* Adds the AdamW state of every parameter of `opt`: "prefix.<name>.exp_avg", ".exp_avg_sq" and
 * ".step" (prefix NULL: "optim"), <name> the parameter's name in m (its first one). Every
 * parameter of opt must be held by m. Local. */
DT_API dt_status_t dt_checkpoint_add_adamw(dt_checkpoint_t ck, const char* prefix, dt_adamw_t opt,
                                           dt_module_t m);

/* Named values saved in index.json (keys: [A-Za-z0-9_.-], at most DT_CHECKPOINT_KEY_MAX - 1
 * characters): the trainer's step, schedule position, data position, seeds. Setting a key again
 * replaces its value. After dt_checkpoint_load the object holds the loaded checkpoint's values
 * (and only those). get: DT_ERR_INVALID_ARG naming the keys there are when `key` is missing or
 * holds the other type. Local. */
DT_API dt_status_t dt_checkpoint_set_i64(dt_checkpoint_t ck, const char* key, int64_t value);
DT_API dt_status_t dt_checkpoint_set_f64(dt_checkpoint_t ck, const char* key, double value);
DT_API dt_status_t dt_checkpoint_get_i64(dt_checkpoint_t ck, const char* key, int64_t* value);
DT_API dt_status_t dt_checkpoint_get_f64(dt_checkpoint_t ck, const char* key, double* value);

enum {
  DT_CHECKPOINT_SYNC = 0,
  DT_CHECKPOINT_ASYNC = 1,
  DT_CHECKPOINT_ASYNC_DEFER_COPY = 2
};
typedef struct dt_checkpoint_save_opts {
  int64_t step;     /* recorded in index.json ("step") */
  int keep_last;    /* > 0: after publishing, remove the oldest complete checkpoints of DIR (by
                     * step, then name) until keep_last remain; 0: keep every one */
  int async;        /* DT_CHECKPOINT_SYNC (0), _ASYNC (1): return after staging, or
                     * _ASYNC_DEFER_COPY (2): return before the copy of host shards (see above);
                     * dt_checkpoint_wait publishes */
  int64_t block_nbytes; /* checksum block (0: 1 MiB; 4 KiB to 64 MiB) */
} dt_checkpoint_save_opts_t;
DT_API dt_checkpoint_save_opts_t dt_checkpoint_save_opts_default(void);

/* Collective. Saves everything listed to dir/name (dir is created when missing; name NULL:
 * "step_%08lld" of opts->step; opts NULL: the defaults). A save still pending on ck is finished
 * first (dt_checkpoint_wait). The arguments are checked on every rank and agreed before any
 * file is touched: DT_ERR_INVALID_ARG on every rank, nothing created or removed, when any rank's
 * are bad, e.g. a name longer than DT_CHECKPOINT_SAVE_NAME_LEN or a path the save would make
 * (dir/NAME.tmp/rank_RRRRR.safetensors the longest) past PATH_MAX - 1 (4095) characters, both
 * named with their lengths. DT_ERR_INVALID_USAGE when dir/name exists already (complete
 * checkpoints, and files or directories that are not checkpoints, are never overwritten; only
 * a checkpoint a save renamed but never published, complete and newer than the one dir/latest
 * names, is replaced), DT_ERR_IO naming the file for a failed write, open, fsync
 * or rename on any rank: the same status on every rank, and a failed save publishes nothing
 * (no dir/name, no dir/name.tmp, dir/latest unchanged). The save commits when dir/latest names
 * it; what can fail after that (the directory's last fsync, pruning to keep_last) is written to
 * stderr by rank 0 and the save succeeds. */
DT_API dt_status_t dt_checkpoint_save(dt_checkpoint_t ck, const char* dir, const char* name,
                                      const dt_checkpoint_save_opts_t* opts);

typedef struct dt_checkpoint_stats {
  int64_t nbytes;       /* tensor bytes written, all ranks */
  int64_t rank_nbytes;  /* of which this rank wrote */
  int64_t file_nbytes;  /* all files of the checkpoint, index included */
  double stall_s;       /* this rank's time inside dt_checkpoint_save (+ dt_checkpoint_wait_staged
                         * and dt_checkpoint_wait, when async) */
  double total_s;       /* from the start of the save until it was published */
  int pending;          /* 1: an async save is still to be waited for */
  char name[DT_CHECKPOINT_NAME_MAX];
} dt_checkpoint_stats_t;
/* Collective when a save is pending: waits for the background writes, agrees on the outcome,
 * writes the index and publishes the checkpoint (the same error on every rank when any rank's
 * writes failed; the NAME.tmp is then removed). A no-op returning DT_SUCCESS otherwise. */
DT_API dt_status_t dt_checkpoint_wait(dt_checkpoint_t ck);
/* Local. Returns once the pending save (DT_CHECKPOINT_ASYNC_DEFER_COPY) has copied this rank's
 * shards to staging: from then on the saved tensors may change. The time it blocks counts in
 * stall_s. A no-op returning DT_SUCCESS when no save is pending or the copy was made in save. */
DT_API dt_status_t dt_checkpoint_wait_staged(dt_checkpoint_t ck);
/* The last save's figures (pending 1 until dt_checkpoint_wait). Local. */
DT_API dt_status_t dt_checkpoint_stats(dt_checkpoint_t ck, dt_checkpoint_stats_t* out);

/* Collective. Loads dir/name (name NULL: the one dir/latest names, as rank 0 reads it) into
 * every listed tensor and the named values (see above). Each listed entry must be in the
 * checkpoint (under its name or one of its aliases) with the same dtype and global shape. */
DT_API dt_status_t dt_checkpoint_load(dt_checkpoint_t ck, const char* dir, const char* name);

/* Local. The name dir/latest holds (name[cap]); DT_ERR_IO when there is none. */
DT_API dt_status_t dt_checkpoint_latest(const char* dir, char* name, size_t cap);

/* ---- inspection and interchange: local, no dt_init needed ----------------------------------
 * `path` is a checkpoint directory (DIR/NAME) or a directory holding a `latest` pointer. */
/* Prints the step, the named values, and each tensor: dtype, shape, saved mesh and placements,
 * boxes, bytes. */
DT_API dt_status_t dt_checkpoint_info(const char* path, FILE* out);
/* Reads every byte of every box and checks every checksum and header; DT_ERR_CORRUPT naming the
 * first bad file and tensor. Prints a line per file to `out` (may be NULL). */
DT_API dt_status_t dt_checkpoint_verify(const char* path, FILE* out);
/* Writes the whole tensors (parameters and plain tensors; optimizer state too with
 * with_optimizer) as one safetensors file `out_path`, or, when the tensor bytes exceed
 * max_file_nbytes (> 0), as Hugging Face's sharded form: out_path's directory gets
 * model-00001-of-0000N.safetensors ... and out_path + ".index.json" ("metadata.total_size",
 * "weight_map"). A tied parameter is written once, under its first name. Each tensor that is not
 * a parameter has its kind in the file's __metadata__ ("dtensor_kind:NAME": "optim" or
 * "tensor"), which dt_checkpoint_import reads back. Peak memory: the largest tensor. Each output
 * is written beside itself and renamed over it (the shards of the sharded form only once every
 * one is written and checked: a failure to read or write one leaves a previous output whole; a
 * failed rename, rarer, may leave it part replaced): an existing output that is not a
 * regular file (a directory, a FIFO, a device), or an empty out_path, is DT_ERR_INVALID_ARG; a
 * symbolic link at OUT.tmp (or at a shard's .tmp) is DT_ERR_INVALID_USAGE, never written through
 * (a regular file there, a consolidation's that died, is replaced). */
DT_API dt_status_t dt_checkpoint_consolidate(const char* path, const char* out_path,
                                             int64_t max_file_nbytes, int with_optimizer);
/* Turns a safetensors file (or a Hugging Face "*.safetensors.index.json" and its shards) into a
 * one-rank checkpoint dir/name (published with dir/latest; name NULL: "step_00000000"; the
 * name's and the paths' limits are a save's) that dt_checkpoint_load places onto any mesh: a seed
 * checkpoint. Tensors are parameters unless the
 * metadata gives another kind (a consolidated file's optimizer state stays optimizer state); a
 * kind entry naming no tensor of the file, or no kind, is DT_ERR_CORRUPT. Tensors of dtypes the
 * library lacks are DT_ERR_UNSUPPORTED naming them. A source that is not a regular file (a
 * directory, a FIFO) is DT_ERR_IO; one of no tensor (an empty weight_map) DT_ERR_INVALID_ARG. */
DT_API dt_status_t dt_checkpoint_import(const char* safetensors_path, const char* dir,
                                        const char* name, int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_CHECKPOINT_H */

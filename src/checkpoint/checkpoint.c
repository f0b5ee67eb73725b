/* checkpoint.c - distributed checkpoints (dtensor/checkpoint.h): the list of what to save, the
 * save plan (every box of every tensor and the rank that writes it, computed identically on
 * every rank from the public box geometry), atomic and asynchronous saves, and loads that read
 * only the byte ranges a rank's own shards need. Public API only (plus cJSON, xxhash, POSIX).
 *
 * Save: every rank computes the same plan: for each tensor (Partial dims counted as Replicate:
 * such tensors are reduced first) each mesh coordinate's box; the coordinates that share a box
 * (replicas along non-Shard dims) elect one writer, replica (tensor index mod replicas), so
 * replicated tensors spread over the replicas. Each writer's boxes go, in list order, into its
 * file rank_RRRRR.safetensors. The rank copies its boxes to one host staging buffer (the stall),
 * then writes header and data, hashes each box and block, and fsyncs (inline, or on a thread when
 * async). Finishing is collective: the outcome is agreed, the hashes are summed into place over
 * the world (each slot has one writer), rank 0 writes index.json, renames NAME.tmp to NAME and
 * replaces `latest`, and prunes to keep_last.
 *
 * Load: every rank parses the index and matches the listed tensors; for each saved box that
 * meets its own box it reads, block by block, the checksum blocks holding the runs it needs,
 * checks each block, and copies the runs into host staging. Only when every rank has read and
 * checked everything are the tensors written (so a failure changes nothing). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/format.h"
#include "dtensor/handle.h"
#include <xxhash.h>

typedef struct {
  char name[DT_CHECKPOINT_NAME_MAX];
  char kind[16];
  int n_alias;
  char** alias;
  dt_tensor_t t;
  int as; /* added by dt_checkpoint_add_tensor_as: the layout below is not t's own */
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  dt_placement_t pl[DT_MAX_MESH_DIMS];
} dt__ck_item_t;

/* One box of the save plan. */
typedef struct {
  int item;
  int writer; /* world rank */
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  int64_t nbytes;
  int64_t rel;       /* byte offset within the writer's data part */
  int64_t hash_slot; /* first of 1 + n_blocks slots in the hash array */
  int64_t n_blocks;
} dt__ck_pbox_t;

/* A copy of a host-memory shard into staging, deferred to the writer thread. */
typedef struct {
  unsigned char* dst;
  dt_tensor_t t;
  int64_t numel;
} dt__ck_copy_t;

typedef struct {
  /* plan */
  int n_boxes;
  dt__ck_pbox_t* boxes;
  int64_t n_hash;
  uint64_t* hashes;
  dt__ck_index_t index; /* rank 0's to write: boxes, files; hashes filled at finish */
  /* this rank's file */
  char path[DT__CK_PATH_MAX + 32];
  char* header;
  size_t header_len;
  unsigned char* staging;
  int64_t staging_nbytes;
  /* where */
  char dir[DT__CK_PATH_MAX], name[DT_CHECKPOINT_NAME_MAX], tmpdir[DT__CK_PATH_MAX + 8];
  char final[DT__CK_PATH_MAX + DT_CHECKPOINT_NAME_MAX];
  int keep_last;
  int64_t block;
  /* the writer thread */
  pthread_t thread;
  int thread_started;
  dt_status_t st;
  char err[1024];
  double t0, stall;
  int64_t nbytes_total, rank_nbytes;
  /* DT_CHECKPOINT_ASYNC_DEFER_COPY: the copies of host-memory shards the writer thread makes
   * before writing; `staged` (under mu, signalled on cv) once they are done */
  dt__ck_copy_t* copies;
  int n_copies, cap_copies;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int staged;
  /* rank 0: this save made tmpdir and is listed among the process's saves in flight */
  int made_tmpdir;
  dev_t dir_dev;
  ino_t dir_ino;
} dt__ck_save_t;

/* The saves of this process whose NAME.tmp exists (rank 0's, between the creation of the
 * directory and the end of the save): another checkpoint object's save into the same directory
 * leaves them alone (its clean-up of leftovers removed a pending async save's files) and refuses
 * their names. */
static pthread_mutex_t dt__ck_inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static dt__ck_save_t** dt__ck_inflight;
static int dt__ck_n_inflight, dt__ck_cap_inflight;

/* Whether a save of this process has dir (dev, ino)/name.tmp in flight. */
static int dt__ck_inflight_has(dev_t dev, ino_t ino, const char* name, size_t name_len) {
  pthread_mutex_lock(&dt__ck_inflight_mu);
  int has = 0;
  for (int i = 0; i < dt__ck_n_inflight && !has; i++) {
    const dt__ck_save_t* o = dt__ck_inflight[i];
    has = o->dir_dev == dev && o->dir_ino == ino && strlen(o->name) == name_len &&
          strncmp(o->name, name, name_len) == 0;
  }
  pthread_mutex_unlock(&dt__ck_inflight_mu);
  return has;
}

static int dt__ck_inflight_add(dt__ck_save_t* s) {
  pthread_mutex_lock(&dt__ck_inflight_mu);
  int ok = 1;
  if (dt__ck_n_inflight == dt__ck_cap_inflight) {
    int cap = dt__ck_cap_inflight ? 2 * dt__ck_cap_inflight : 8;
    dt__ck_save_t** p = realloc(dt__ck_inflight, (size_t)cap * sizeof *p);
    if (p == NULL) ok = 0;
    else {
      dt__ck_inflight = p;
      dt__ck_cap_inflight = cap;
    }
  }
  if (ok) dt__ck_inflight[dt__ck_n_inflight++] = s;
  pthread_mutex_unlock(&dt__ck_inflight_mu);
  return ok;
}

static void dt__ck_inflight_remove(dt__ck_save_t* s) {
  pthread_mutex_lock(&dt__ck_inflight_mu);
  for (int i = 0; i < dt__ck_n_inflight; i++)
    if (dt__ck_inflight[i] == s) {
      dt__ck_inflight[i] = dt__ck_inflight[--dt__ck_n_inflight];
      break;
    }
  if (dt__ck_n_inflight == 0) { /* nothing kept once no save is in flight */
    free(dt__ck_inflight);
    dt__ck_inflight = NULL;
    dt__ck_cap_inflight = 0;
  }
  pthread_mutex_unlock(&dt__ck_inflight_mu);
}

struct dt_checkpoint {
  int n, cap;
  dt__ck_item_t* items;
  cJSON* values;
  dt_mesh_t world;
  int rank, world_size;
  dt__ck_save_t* pending;
  dt_checkpoint_stats_t stats;
  /* host staging kept between saves and loads (pages already faulted in: the copy that stalls
   * training is a plain memcpy from the second save on) */
  unsigned char* keep;
  int64_t keep_nbytes;
};

/* A new staging buffer of n bytes. A large one starts on a 2 MiB boundary, whole 2 MiB pages,
 * and asks for transparent huge pages: the page faults of a fresh buffer were half of a
 * resharding load's time (docs/performance.md, "Checkpoints against PyTorch DCP"). */
static unsigned char* dt__ck_staging_alloc(int64_t n, int huge_pages) {
  const size_t huge = (size_t)2 << 20;
  if (!huge_pages || (size_t)n < 2 * huge) return malloc((size_t)n);
  const size_t nbytes = ((size_t)n + huge - 1) / huge * huge;
  unsigned char* p = aligned_alloc(huge, nbytes);
#ifdef MADV_HUGEPAGE
  if (p != NULL) (void)madvise(p, nbytes, MADV_HUGEPAGE); /* a hint: refused, small pages */
#endif
  return p;
}

/* A staging buffer of at least n bytes: the kept one when large enough; a new one on huge pages
 * for a load (huge_pages). */
static unsigned char* dt__ck_take(dt_checkpoint_t ck, int64_t n, int huge_pages) {
  if (n <= 0) return NULL;
  if (ck->keep && ck->keep_nbytes >= n) {
    unsigned char* p = ck->keep;
    ck->keep = NULL;
    return p;
  }
  free(ck->keep);
  ck->keep = NULL;
  ck->keep_nbytes = 0;
  return dt__ck_staging_alloc(n, huge_pages);
}

/* Gives a staging buffer of n bytes back for the next save or load (the larger one stays; a
 * load's, on huge pages, may then serve a save: its pages are faulted in already). */
static void dt__ck_give(dt_checkpoint_t ck, unsigned char* p, int64_t n) {
  if (p == NULL) return;
  if (ck->keep && ck->keep_nbytes >= n) {
    free(p);
    return;
  }
  free(ck->keep);
  ck->keep = p;
  ck->keep_nbytes = n;
}

static const dt_handle_kind_t dt__ck_kind = {"checkpoint"};

static dt_status_t dt__ck_check(dt_checkpoint_t ck) {
  return dt_handle_check(ck, &dt__ck_kind, "ck");
}

/* ---- the list -------------------------------------------------------------------------------- */

static dt_status_t dt__checkpoint_create(dt_checkpoint_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt_checkpoint_t ck = calloc(1, sizeof *ck);
  if (ck == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "checkpoint");
  ck->values = cJSON_CreateObject();
  dt_status_t st = ck->values ? dt_handle_register(ck, &dt__ck_kind)
                              : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "checkpoint values");
  if (st != DT_SUCCESS) {
    cJSON_Delete(ck->values);
    free(ck);
    return st;
  }
  *out = ck;
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_create(dt_checkpoint_t* out) {
  DT_ENTRY_RETURN(dt__checkpoint_create(out));
}

static void dt__ck_save_free(dt__ck_save_t* s) {
  if (s == NULL) return;
  if (s->thread_started) pthread_join(s->thread, NULL);
  if (s->made_tmpdir) dt__ck_inflight_remove(s);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->copies);
  free(s->boxes);
  free(s->hashes);
  dt__ck_index_free(&s->index);
  free(s->header);
  free(s->staging);
  free(s);
}

static dt_status_t dt__checkpoint_destroy(dt_checkpoint_t ck) {
  if (ck == NULL) return DT_SUCCESS;
  DT_CHECK(dt_handle_unregister(ck, &dt__ck_kind, "ck"));
  dt__ck_save_free(ck->pending);
  for (int i = 0; i < ck->n; i++) {
    for (int a = 0; a < ck->items[i].n_alias; a++) free(ck->items[i].alias[a]);
    free(ck->items[i].alias);
  }
  free(ck->items);
  cJSON_Delete(ck->values);
  free(ck->keep);
  if (ck->world) dt_mesh_destroy(ck->world);
  dt_handle_free(ck);
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_destroy(dt_checkpoint_t ck) {
  DT_ENTRY_RETURN(dt__checkpoint_destroy(ck));
}

static int dt__ck_has_name(dt_checkpoint_t ck, const char* name) {
  for (int i = 0; i < ck->n; i++) {
    if (strcmp(ck->items[i].name, name) == 0) return 1;
    for (int a = 0; a < ck->items[i].n_alias; a++)
      if (strcmp(ck->items[i].alias[a], name) == 0) return 1;
  }
  return 0;
}

static dt_status_t dt__ck_add(dt_checkpoint_t ck, const char* name, dt_tensor_t t,
                              const char* kind, int ndim, const int64_t* shape,
                              const dt_placement_t* pl, int as) {
  DT_CHECK(dt__ck_check(ck));
  DT_ARG_NOT_NULL(name);
  if (!dt__ck_name_ok(name, 0))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "name='%.200s' (valid: 1 to %d printable ASCII characters without '\"', '\\' "
                   "or ':')", name, DT_CHECKPOINT_NAME_MAX - 1);
  if (dt__ck_has_name(ck, name))
    return DT_FAIL(DT_ERR_INVALID_ARG, "name='%s' is in the checkpoint already", name);
  dt_mesh_t mesh;
  int mnd = 0, tnd = 0;
  DT_CHECK(dt_tensor_mesh(t, &mesh));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  DT_CHECK(dt_tensor_ndim(t, &tnd));
  dt__ck_item_t it;
  memset(&it, 0, sizeof it);
  snprintf(it.name, sizeof it.name, "%s", name);
  snprintf(it.kind, sizeof it.kind, "%s", kind);
  it.t = t;
  it.as = as;
  if (as) {
    DT_ARG_NOT_NULL(shape);
    DT_ARG_NOT_NULL(pl);
    if (ndim < 0 || ndim > DT_MAX_DIMS || ndim != tnd)
      return DT_FAIL(DT_ERR_INVALID_ARG, "ndim=%d (valid: the tensor's %d)", ndim, tnd);
    it.ndim = ndim;
    memcpy(it.shape, shape, (size_t)ndim * sizeof *shape);
    memcpy(it.pl, pl, (size_t)mnd * sizeof *pl);
    int ms[DT_MAX_MESH_DIMS], c[DT_MAX_MESH_DIMS] = {0};
    int64_t o[DT_MAX_DIMS], l[DT_MAX_DIMS];
    DT_CHECK(dt_mesh_shape(mesh, ms));
    for (int d = 0; d < mnd; d++) {
      DT_CHECK(dt_placement_normalize(&it.pl[d], ndim));
      if (it.pl[d].kind == DT_PARTIAL)
        return DT_FAIL(DT_ERR_INVALID_ARG, "placements[%d]: Partial (valid: Shard or Replicate)", d);
    }
    DT_CHECK(dt_placements_box(ndim, shape, mnd, ms, it.pl, c, o, l)); /* validates shape, pl */
  } else {
    it.ndim = tnd;
    DT_CHECK(dt_tensor_shape(t, it.shape));
    DT_CHECK(dt_tensor_placements(t, it.pl));
  }
  if (ck->n == ck->cap) {
    int cap = ck->cap ? 2 * ck->cap : 16;
    dt__ck_item_t* p = realloc(ck->items, (size_t)cap * sizeof *p);
    if (p == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "checkpoint list");
    ck->items = p;
    ck->cap = cap;
  }
  ck->items[ck->n++] = it;
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_add_tensor(dt_checkpoint_t ck, const char* name, dt_tensor_t t) {
  DT_ENTRY_RETURN(dt__ck_add(ck, name, t, "tensor", 0, NULL, NULL, 0));
}

dt_status_t dt_checkpoint_add_tensor_as(dt_checkpoint_t ck, const char* name, dt_tensor_t t,
                                        int ndim, const int64_t* shape,
                                        const dt_placement_t* placements) {
  DT_ENTRY_RETURN(dt__ck_add(ck, name, t, "tensor", ndim, shape, placements, 1));
}

static dt_status_t dt__ck_join(char* out, size_t cap, const char* prefix, const char* name,
                               const char* suffix) {
  int n = snprintf(out, cap, "%s%s%s%s", prefix && prefix[0] ? prefix : "",
                   prefix && prefix[0] && name[0] ? "." : "", name, suffix ? suffix : "");
  if (n < 0 || (size_t)n >= cap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "name '%s%s' too long (at most %zu characters)",
                   prefix ? prefix : "", name, cap - 1);
  return DT_SUCCESS;
}

typedef struct {
  dt_checkpoint_t ck;
  dt_module_t m;
  const char* prefix;
  dt_status_t st;
} dt__ck_visit_t;

static int dt__ck_visit_param(const char* name, dt_var_t p, void* ctx) {
  dt__ck_visit_t* v = ctx;
  char full[DT_CHECKPOINT_NAME_MAX];
  v->st = dt__ck_join(full, sizeof full, v->prefix, name, NULL);
  if (v->st == DT_SUCCESS) v->st = dt__ck_add(v->ck, full, dt_var_value(p), "param", 0, NULL, NULL, 0);
  if (v->st != DT_SUCCESS) return 1;
  int n = 0;
  v->st = dt_module_param_names(v->m, p, 0, NULL, 0, &n);
  dt__ck_item_t* it = &v->ck->items[v->ck->n - 1];
  if (v->st == DT_SUCCESS && n > 1) {
    it->alias = calloc((size_t)n - 1, sizeof *it->alias);
    if (it->alias == NULL) v->st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "aliases");
    for (int k = 1; k < n && v->st == DT_SUCCESS; k++) {
      char nm[DT_CHECKPOINT_NAME_MAX];
      v->st = dt_module_param_names(v->m, p, k, nm, sizeof nm, &n);
      if (v->st == DT_SUCCESS) v->st = dt__ck_join(full, sizeof full, v->prefix, nm, NULL);
      if (v->st == DT_SUCCESS && (!dt__ck_name_ok(full, 0) || dt__ck_has_name(v->ck, full)))
        v->st = DT_FAIL(DT_ERR_INVALID_ARG, "alias '%s' of '%s' is not a valid, unused name", full,
                        it->name);
      if (v->st == DT_SUCCESS) {
        it->alias[it->n_alias] = strdup(full);
        if (it->alias[it->n_alias] == NULL) v->st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "alias");
        else it->n_alias++;
      }
    }
  }
  return v->st != DT_SUCCESS;
}

static dt_status_t dt__checkpoint_add_module(dt_checkpoint_t ck, const char* prefix,
                                             dt_module_t m) {
  DT_CHECK(dt__ck_check(ck));
  int before = ck->n;
  dt__ck_visit_t v = {ck, m, prefix, DT_SUCCESS};
  dt_status_t st = dt_module_for_each_param(m, dt__ck_visit_param, &v);
  if (st == DT_SUCCESS) st = v.st;
  if (st != DT_SUCCESS) { /* nothing added */
    for (int i = before; i < ck->n; i++) {
      for (int a = 0; a < ck->items[i].n_alias; a++) free(ck->items[i].alias[a]);
      free(ck->items[i].alias);
    }
    ck->n = before;
  }
  return st;
}

dt_status_t dt_checkpoint_add_module(dt_checkpoint_t ck, const char* prefix, dt_module_t m) {
  DT_ENTRY_RETURN(dt__checkpoint_add_module(ck, prefix, m));
}

static dt_status_t dt__checkpoint_add_adamw(dt_checkpoint_t ck, const char* prefix,
                                            dt_adamw_t opt, dt_module_t m) {
  DT_CHECK(dt__ck_check(ck));
  int n = 0, before = ck->n;
  DT_CHECK(dt_adamw_param(opt, 0, NULL, &n));
  const char* pre = prefix ? prefix : "optim";
  dt_status_t st = DT_SUCCESS;
  for (int i = 0; i < n && st == DT_SUCCESS; i++) {
    dt_var_t p;
    dt_tensor_t t[3];
    char pn[DT_CHECKPOINT_NAME_MAX], full[DT_CHECKPOINT_NAME_MAX];
    int names = 0;
    static const char* const suffix[3] = {".exp_avg", ".exp_avg_sq", ".step"};
    st = dt_adamw_param(opt, i, &p, NULL);
    if (st == DT_SUCCESS) st = dt_module_param_names(m, p, 0, pn, sizeof pn, &names);
    if (st == DT_SUCCESS && names == 0)
      st = DT_FAIL(DT_ERR_INVALID_ARG, "the optimizer's parameter %d is not held by module '%s'",
                   i, dt_module_name(m));
    if (st == DT_SUCCESS) st = dt_adamw_state(opt, i, &t[0], &t[1], &t[2]);
    for (int k = 0; k < 3 && st == DT_SUCCESS; k++) {
      st = dt__ck_join(full, sizeof full, pre, pn, suffix[k]);
      if (st == DT_SUCCESS) st = dt__ck_add(ck, full, t[k], "optim", 0, NULL, NULL, 0);
    }
  }
  if (st != DT_SUCCESS) ck->n = before;
  return st;
}

dt_status_t dt_checkpoint_add_adamw(dt_checkpoint_t ck, const char* prefix, dt_adamw_t opt,
                                    dt_module_t m) {
  DT_ENTRY_RETURN(dt__checkpoint_add_adamw(ck, prefix, opt, m));
}

/* ---- named values ------------------------------------------------------------------------------ */

static int dt__ck_key_ok(const char* k) {
  size_t n = k ? strlen(k) : 0;
  if (n == 0 || n >= DT_CHECKPOINT_KEY_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = k[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.' || c == '-'))
      return 0;
  }
  return 1;
}

static dt_status_t dt__ck_set(dt_checkpoint_t ck, const char* key, int is_int, int64_t i,
                              double f) {
  DT_CHECK(dt__ck_check(ck));
  if (!dt__ck_key_ok(key))
    return DT_FAIL(DT_ERR_INVALID_ARG, "key='%.80s' (valid: 1 to %d of [A-Za-z0-9_.-])",
                   key ? key : "(null)", DT_CHECKPOINT_KEY_MAX - 1);
  cJSON* v = cJSON_CreateObject();
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, i);
  if (v == NULL || (is_int ? cJSON_AddStringToObject(v, "i64", buf)
                           : cJSON_AddNumberToObject(v, "f64", f)) == NULL) {
    cJSON_Delete(v);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "value");
  }
  if (!is_int && !isfinite(f)) {
    cJSON_Delete(v);
    return DT_FAIL(DT_ERR_INVALID_ARG, "value=%g (valid: finite)", f);
  }
  cJSON_DeleteItemFromObjectCaseSensitive(ck->values, key);
  cJSON_AddItemToObject(ck->values, key, v);
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_set_i64(dt_checkpoint_t ck, const char* key, int64_t value) {
  DT_ENTRY_RETURN(dt__ck_set(ck, key, 1, value, 0));
}
dt_status_t dt_checkpoint_set_f64(dt_checkpoint_t ck, const char* key, double value) {
  DT_ENTRY_RETURN(dt__ck_set(ck, key, 0, 0, value));
}

static dt_status_t dt__ck_get(dt_checkpoint_t ck, const char* key, int is_int, int64_t* i,
                              double* f) {
  DT_CHECK(dt__ck_check(ck));
  DT_ARG_NOT_NULL(key);
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(ck->values, key);
  const cJSON* x = v ? cJSON_GetObjectItemCaseSensitive(v, is_int ? "i64" : "f64") : NULL;
  if (x == NULL) {
    char have[512] = "";
    size_t at = 0;
    for (const cJSON* e = ck->values->child; e && at < sizeof have - 80; e = e->next)
      at += (size_t)snprintf(have + at, sizeof have - at, "%s%s (%s)", at ? ", " : "", e->string,
                             cJSON_GetObjectItemCaseSensitive(e, "i64") ? "i64" : "f64");
    return DT_FAIL(DT_ERR_INVALID_ARG, "key='%.80s': no %s value (there are: %s)", key,
                   is_int ? "i64" : "f64", at ? have : "none");
  }
  if (is_int) *i = strtoll(x->valuestring, NULL, 10);
  else *f = x->valuedouble;
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_get_i64(dt_checkpoint_t ck, const char* key, int64_t* value) {
  DT_ENTRY_RETURN(value ? dt__ck_get(ck, key, 1, value, NULL) : DT_FAIL(DT_ERR_INVALID_ARG, "value is NULL"));
}
dt_status_t dt_checkpoint_get_f64(dt_checkpoint_t ck, const char* key, double* value) {
  DT_ENTRY_RETURN(value ? dt__ck_get(ck, key, 0, NULL, value) : DT_FAIL(DT_ERR_INVALID_ARG, "value is NULL"));
}

/* ---- agreement ---------------------------------------------------------------------------------- */

static dt_status_t dt__ck_world(dt_checkpoint_t ck) {
  if (ck->world) return DT_SUCCESS;
  DT_CHECK(dt_world_rank(&ck->rank));
  DT_CHECK(dt_world_size(&ck->world_size));
  const char* names[1] = {"world"};
  dt_mesh_t w;
  DT_CHECK(dt_mesh_create(1, &ck->world_size, names, NULL, &w));
  dt_backend_t be = NULL;
  dt_device_t dev = DT_DEVICE_HOST;
  dt_status_t st = dt_mesh_backend(w, &be);
  if (st == DT_SUCCESS) st = dt_backend_device(be, &dev);
  if (st == DT_SUCCESS && dev == DT_DEVICE_META) /* nothing to write, no file every rank sees */
    st = DT_FAIL(DT_ERR_INVALID_USAGE, "the world is simulated (dt_init_simulated): checkpoints "
                 "need a real run");
  if (st != DT_SUCCESS) {
    dt_mesh_destroy(w);
    return st;
  }
  ck->world = w;
  return DT_SUCCESS;
}

#define DT__CK_TEXT_MAX 512
/* Gives every rank the text (at most cap - 1 <= DT__CK_TEXT_MAX - 1 bytes) that rank `src` holds
 * in text (the public API has no broadcast: a sum all-reduce of the characters, each other rank
 * adding zeros; no allocation, so every rank reaches the collective). */
static dt_status_t dt__ck_share_text(dt_checkpoint_t ck, int src, char* text, int cap) {
  int32_t buf[DT__CK_TEXT_MAX];
  if (cap > DT__CK_TEXT_MAX) cap = DT__CK_TEXT_MAX;
  memset(buf, 0, sizeof buf);
  for (int i = 0; ck->rank == src && i < cap - 1 && text[i]; i++) buf[i] = (unsigned char)text[i];
  DT_CHECK(dt_mesh_all_reduce_host(ck->world, 0, NULL, buf, cap, DT_I32, DT_REDUCE_SUM));
  for (int i = 0; i < cap; i++) text[i] = (char)buf[i];
  text[cap - 1] = '\0';
  return DT_SUCCESS;
}

#define DT__CK_MSG 480
/* Every rank returns the status of the lowest failing rank, with its message. */
static dt_status_t dt__ck_agree(dt_checkpoint_t ck, dt_status_t st) {
  int32_t src[2] = {st != DT_SUCCESS ? ck->rank : INT32_MAX, 0};
  DT_CHECK(dt_mesh_all_reduce_host(ck->world, 0, NULL, src, 1, DT_I32, DT_REDUCE_MIN));
  if (src[0] == INT32_MAX) return DT_SUCCESS;
  if (src[0] == ck->rank) src[1] = (int32_t)st; /* its status, then its message */
  DT_CHECK(dt_mesh_all_reduce_host(ck->world, 0, NULL, &src[1], 1, DT_I32, DT_REDUCE_SUM));
  char text[DT__CK_MSG + 1];
  snprintf(text, sizeof text, "%s", src[0] == ck->rank ? dt_last_error() : "");
  DT_CHECK(dt__ck_share_text(ck, src[0], text, (int)sizeof text));
  /* drop the failing rank's "ENTRY: ": every rank's DT_FAIL puts its own (the same) back */
  const char* body = text;
  const char* colon = strstr(text, ": ");
  if (strncmp(text, "dt_", 3) == 0 && colon && memchr(text, ' ', (size_t)(colon - text)) == NULL)
    body = colon + 2;
  dt_status_t agreed = src[1] > 0 && src[1] < DT_STATUS_COUNT ? (dt_status_t)src[1] : DT_ERR_REMOTE;
  if (ck->world_size > 1) return DT_FAIL(agreed, "%s [rank %d]", body, (int)src[0]);
  return DT_FAIL(agreed, "%s", body);
}

/* ---- save ---------------------------------------------------------------------------------------- */

dt_checkpoint_save_opts_t dt_checkpoint_save_opts_default(void) {
  dt_checkpoint_save_opts_t o;
  memset(&o, 0, sizeof o);
  o.block_nbytes = DT__CK_BLOCK_DEFAULT;
  return o;
}

static int64_t dt__ck_numel(int nd, const int64_t* len) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= len[d];
  return n;
}

static dt_status_t dt__ck_key(const dt__ck_item_t* it, const int64_t* off, const int64_t* len,
                              char** out) {
  char buf[DT_CHECKPOINT_NAME_MAX + DT_MAX_DIMS * 21];
  size_t at = (size_t)snprintf(buf, sizeof buf, "%s", it->name);
  int whole = 1;
  for (int d = 0; d < it->ndim; d++) whole &= off[d] == 0 && len[d] == it->shape[d];
  if (!whole)
    for (int d = 0; d < it->ndim; d++)
      at += (size_t)snprintf(buf + at, sizeof buf - at, "%c%" PRId64, d ? ',' : ':', off[d]);
  *out = strdup(buf);
  return *out ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "a key");
}

/* The effective placements a save writes from: Partial counted as Replicate (reduced first). */
static void dt__ck_eff(const dt__ck_item_t* it, int mnd, dt_placement_t* pl) {
  for (int d = 0; d < mnd; d++) {
    pl[d] = it->pl[d];
    if (pl[d].kind == DT_PARTIAL) {
      memset(&pl[d], 0, sizeof pl[d]);
      pl[d].kind = DT_REPLICATE;
    }
  }
}

/* The plan: every box, its writer, its place in the writer's file; the index skeleton. */
static dt_status_t dt__ck_plan(dt_checkpoint_t ck, dt__ck_save_t* s) {
  int cap = 64;
  s->boxes = malloc((size_t)cap * sizeof *s->boxes);
  int64_t* file_data = calloc((size_t)ck->world_size, sizeof *file_data);
  int* file_boxes = calloc((size_t)ck->world_size, sizeof *file_boxes);
  if (s->boxes == NULL || file_data == NULL || file_boxes == NULL) {
    free(file_data);
    free(file_boxes);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save plan");
  }
  dt_status_t st = DT_SUCCESS;
  dt__ck_index_t* ix = &s->index;
  ix->tensors = calloc(ck->n > 0 ? (size_t)ck->n : 1, sizeof *ix->tensors);
  if (ix->tensors == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
  for (int i = 0; i < ck->n && st == DT_SUCCESS; i++) {
    const dt__ck_item_t* it = &ck->items[i];
    dt_mesh_t mesh;
    int mnd = 0, ms[DT_MAX_MESH_DIMS], abstract = 0;
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    dt_dtype_t dtype;
    size_t isz = 0;
    st = dt_tensor_mesh(it->t, &mesh);
    if (st == DT_SUCCESS) st = dt_mesh_ndim(mesh, &mnd);
    if (st == DT_SUCCESS) st = dt_mesh_shape(mesh, ms);
    if (st == DT_SUCCESS) st = dt_mesh_is_abstract(mesh, &abstract);
    if (st == DT_SUCCESS) st = dt_tensor_dtype(it->t, &dtype);
    if (st == DT_SUCCESS) st = dt_dtype_itemsize(dtype, &isz);
    if (st == DT_SUCCESS && abstract)
      st = DT_FAIL(DT_ERR_INVALID_USAGE, "tensor '%s' lives on an abstract mesh (no data)", it->name);
    if (st != DT_SUCCESS) break;
    dt__ck_eff(it, mnd, pl);
    dt__ck_tensor_t* t = &ix->tensors[ix->n_tensors++];
    t->name = strdup(it->name);
    if (t->name == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
    if (it->n_alias) {
      t->alias = calloc((size_t)it->n_alias, sizeof *t->alias);
      if (t->alias == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
      for (int a = 0; a < it->n_alias && st == DT_SUCCESS; a++) {
        t->alias[a] = strdup(it->alias[a]);
        if (t->alias[t->n_alias++] == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
      }
    }
    snprintf(t->kind, sizeof t->kind, "%s", it->kind);
    t->dtype = dtype;
    t->ndim = it->ndim;
    memcpy(t->shape, it->shape, sizeof t->shape);
    t->mesh_ndim = mnd;
    for (int d = 0; d < mnd && st == DT_SUCCESS; d++) {
      const char* nm = "";
      t->mesh_shape[d] = ms[d];
      st = dt_mesh_dim_name(mesh, d, &nm);
      snprintf(t->mesh_names[d], sizeof t->mesh_names[d], "%s", nm ? nm : "");
      t->pl[d] = it->pl[d];
    }
    /* every coordinate, row-major */
    int total = 1, nrep = 1;
    for (int d = 0; d < mnd; d++) {
      total *= ms[d];
      if (pl[d].kind != DT_SHARD) nrep *= ms[d];
    }
    int want = i % nrep;
    for (int lin = 0; lin < total && st == DT_SUCCESS; lin++) {
      int c[DT_MAX_MESH_DIMS], r = lin, rep = 0;
      for (int d = mnd - 1; d >= 0; d--) {
        c[d] = r % ms[d];
        r /= ms[d];
      }
      for (int d = 0; d < mnd; d++)
        if (pl[d].kind != DT_SHARD) rep = rep * ms[d] + c[d];
      if (rep != want) continue;
      dt__ck_pbox_t b;
      memset(&b, 0, sizeof b);
      b.item = i;
      st = dt_placements_box(it->ndim, it->shape, mnd, ms, pl, c, b.off, b.len);
      if (st == DT_SUCCESS) st = dt_mesh_rank_at(mesh, c, &b.writer);
      if (st != DT_SUCCESS) break;
      int64_t numel = dt__ck_numel(it->ndim, b.len);
      if (numel == 0) continue;
      b.nbytes = numel * (int64_t)isz;
      b.rel = file_data[b.writer];
      file_data[b.writer] += b.nbytes;
      file_boxes[b.writer]++;
      b.n_blocks = (b.nbytes + s->block - 1) / s->block;
      b.hash_slot = s->n_hash;
      s->n_hash += 1 + b.n_blocks;
      if (s->n_boxes == cap) {
        cap *= 2;
        dt__ck_pbox_t* p = realloc(s->boxes, (size_t)cap * sizeof *p);
        if (p == NULL) {
          st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save plan");
          break;
        }
        s->boxes = p;
      }
      s->boxes[s->n_boxes++] = b;
      t->n_boxes++;
    }
  }
  /* files: one per rank with boxes; each rank's header decides where its data starts */
  int* file_of = calloc((size_t)ck->world_size, sizeof *file_of);
  if (st == DT_SUCCESS && file_of == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save plan");
  if (st == DT_SUCCESS) {
    ix->files = calloc((size_t)ck->world_size, sizeof *ix->files);
    s->hashes = calloc((size_t)(s->n_hash > 0 ? s->n_hash : 1), sizeof *s->hashes);
    if (ix->files == NULL || s->hashes == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save plan");
  }
  int64_t* data_start = calloc((size_t)ck->world_size, sizeof *data_start);
  if (st == DT_SUCCESS && data_start == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save plan");
  for (int r = 0; r < ck->world_size && st == DT_SUCCESS; r++) {
    file_of[r] = -1;
    /* rank 0 writes the index: it needs every file's header; the others only their own */
    if (file_boxes[r] == 0 || (ck->rank != 0 && r != ck->rank)) continue;
    int n = file_boxes[r], k = 0;
    char** keys = calloc((size_t)n, sizeof *keys);
    dt_dtype_t* dts = calloc((size_t)n, sizeof *dts);
    int* nds = calloc((size_t)n, sizeof *nds);
    const int64_t** shapes = calloc((size_t)n, sizeof *shapes);
    int64_t* nb = calloc((size_t)n, sizeof *nb);
    if (!keys || !dts || !nds || !shapes || !nb) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save plan");
    for (int b = 0; b < s->n_boxes && st == DT_SUCCESS; b++) {
      if (s->boxes[b].writer != r) continue;
      const dt__ck_item_t* it = &ck->items[s->boxes[b].item];
      st = dt__ck_key(it, s->boxes[b].off, s->boxes[b].len, &keys[k]);
      dts[k] = ix->tensors[s->boxes[b].item].dtype;
      nds[k] = it->ndim;
      shapes[k] = s->boxes[b].len;
      nb[k] = s->boxes[b].nbytes;
      k++;
    }
    size_t hl = 0;
    char* hdr = st == DT_SUCCESS
                    ? dt__ck_st_header(n, (const char* const*)keys, dts, nds, shapes, nb, NULL, &hl)
                    : NULL;
    if (st == DT_SUCCESS && hdr == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "a header");
    if (st == DT_SUCCESS) {
      file_of[r] = ix->n_files;
      dt__ck_file_t* f = &ix->files[ix->n_files++];
      snprintf(f->name, sizeof f->name, "rank_%05d.safetensors", r);
      data_start[r] = 8 + (int64_t)hl;
      f->nbytes = data_start[r] + file_data[r];
      if (r == ck->rank) {
        s->header = hdr;
        s->header_len = hl;
        hdr = NULL;
      }
    }
    free(hdr);
    for (int j = 0; j < n; j++) free(keys ? keys[j] : NULL);
    free(keys);
    free(dts);
    free(nds);
    free(shapes);
    free(nb);
  }
  /* the index's boxes */
  for (int i = 0; i < ix->n_tensors && st == DT_SUCCESS; i++) {
    dt__ck_tensor_t* t = &ix->tensors[i];
    t->boxes = calloc(t->n_boxes > 0 ? (size_t)t->n_boxes : 1, sizeof *t->boxes);
    if (t->boxes == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
    t->n_boxes = 0;
  }
  for (int b = 0; b < s->n_boxes && st == DT_SUCCESS; b++) {
    const dt__ck_pbox_t* p = &s->boxes[b];
    dt__ck_tensor_t* t = &ix->tensors[p->item];
    dt__ck_box_t* x = &t->boxes[t->n_boxes++];
    x->file = file_of[p->writer];
    memcpy(x->off, p->off, sizeof x->off);
    memcpy(x->len, p->len, sizeof x->len);
    x->data_offset = data_start[p->writer] + p->rel;
    x->nbytes = p->nbytes;
    x->n_blocks = p->n_blocks;
    st = dt__ck_key(&ck->items[p->item], p->off, p->len, &x->key);
    if (st == DT_SUCCESS) {
      x->blocks = calloc((size_t)(p->n_blocks > 0 ? p->n_blocks : 1), sizeof *x->blocks);
      if (x->blocks == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
    }
    s->nbytes_total += p->nbytes;
    if (p->writer == ck->rank) s->rank_nbytes += p->nbytes;
  }
  s->staging_nbytes = file_data[ck->rank];
  free(file_of);
  free(data_start);
  free(file_data);
  free(file_boxes);
  return st;
}

/* Lists the copy of a box of `t` (its whole local shard) for the writer thread when its memory
 * is the host's; *listed 0 when it is not (the caller copies now). */
static dt_status_t dt__ck_defer(dt__ck_save_t* s, dt_tensor_t t, unsigned char* dst,
                                int64_t numel, int* listed) {
  dt_backend_t be = NULL;
  dt_device_t dev = DT_DEVICE_CUDA;
  *listed = 0;
  DT_CHECK(dt_tensor_backend(t, &be));
  DT_CHECK(dt_backend_device(be, &dev));
  if (dev != DT_DEVICE_HOST || numel == 0) return DT_SUCCESS; /* a device's: copied in the call */
  if (s->n_copies == s->cap_copies) {
    int cap = s->cap_copies ? 2 * s->cap_copies : 16;
    dt__ck_copy_t* c = realloc(s->copies, (size_t)cap * sizeof *c);
    if (c == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "copy list");
    s->copies = c;
    s->cap_copies = cap;
  }
  s->copies[s->n_copies++] = (dt__ck_copy_t){dst, t, numel};
  *listed = 1;
  return DT_SUCCESS;
}

/* The writer thread's first task: the deferred copies (host memory to host memory: a plain copy
 * through the backend, safe beside the caller's thread, which only reads these tensors until
 * `staged`), then `staged` is signalled. */
static dt_status_t dt__ck_copy_deferred(dt__ck_save_t* s) {
  dt_status_t st = DT_SUCCESS;
  for (int i = 0; i < s->n_copies && st == DT_SUCCESS; i++)
    st = dt_tensor_read_local(s->copies[i].t, 0, s->copies[i].numel, s->copies[i].dst);
  pthread_mutex_lock(&s->mu);
  s->staged = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* Copies this rank's boxes to the staging buffer (Partial tensors reduced first). Collective
 * over each reduced tensor's mesh. `defer`: boxes in host memory are only listed, for the writer
 * thread to copy (dt__ck_copy_deferred). */
static dt_status_t dt__ck_stage(dt_checkpoint_t ck, dt__ck_save_t* s, int defer) {
  if (s->staging_nbytes > 0) {
    s->staging = dt__ck_take(ck, s->staging_nbytes, 0);
    if (s->staging == NULL)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%" PRId64 " bytes of host staging", s->staging_nbytes);
  }
  /* A failure here is this rank's alone (a rank-local tensor of the wrong shape): the loop goes
   * on through every entry's collective redistribution, so that no peer waits in one, and the
   * caller agrees on the outcome. */
  dt_status_t st = DT_SUCCESS;
  for (int i = 0; i < ck->n; i++) {
    const dt__ck_item_t* it = &ck->items[i];
    dt_mesh_t mesh;
    int mnd = 0, partial = 0;
    dt_placement_t pl[DT_MAX_MESH_DIMS];
    dt_status_t ms = dt_tensor_mesh(it->t, &mesh); /* (the same on every rank: checked at add) */
    if (ms == DT_SUCCESS) ms = dt_mesh_ndim(mesh, &mnd);
    if (ms != DT_SUCCESS)
      return DT_FAIL(ms, "entry '%s': %s%s", it->name, dt_last_error(),
                     ms == DT_ERR_INVALID_USAGE
                         ? " (wrapping a module, dt_fully_shard or dt_parallelize_module, "
                           "replaces its parameters: add the module after wrapping)"
                         : "");
    dt__ck_eff(it, mnd, pl);
    for (int d = 0; d < mnd; d++) partial |= it->pl[d].kind == DT_PARTIAL;
    dt_tensor_t src = it->t, tmp = NULL;
    if (partial && !it->as) {
      char kept[1024]; /* a failure met before keeps its message */
      snprintf(kept, sizeof kept, "%s", st != DT_SUCCESS ? dt_last_error() : "");
      dt_status_t rs = dt_tensor_redistribute(it->t, pl, &tmp); /* collective over t's mesh */
      if (st == DT_SUCCESS) st = rs;
      else if (kept[0]) (void)DT_FAIL(st, "%s", kept);
      src = tmp;
    }
    for (int b = 0; b < s->n_boxes && st == DT_SUCCESS; b++) {
      const dt__ck_pbox_t* p = &s->boxes[b];
      if (p->item != i || p->writer != ck->rank) continue;
      int64_t ls[DT_MAX_DIMS], numel = dt__ck_numel(it->ndim, p->len), lnumel = 0;
      st = dt_tensor_local_shape(src, ls);
      if (st == DT_SUCCESS) st = dt_tensor_local_numel(src, &lnumel);
      if (st == DT_SUCCESS && (lnumel != numel || memcmp(ls, p->len, (size_t)it->ndim * sizeof *ls)))
        st = DT_FAIL(DT_ERR_INVALID_ARG,
                     "tensor '%s': this rank holds %" PRId64 " elements, its box under the "
                     "placements saved has %" PRId64 " (dt_checkpoint_add_tensor_as: the local "
                     "shape must be the box)", it->name, lnumel, numel);
      int listed = 0;
      if (st == DT_SUCCESS && defer && tmp == NULL)
        st = dt__ck_defer(s, src, s->staging + p->rel, numel, &listed);
      if (st == DT_SUCCESS && !listed) st = dt_tensor_read_local(src, 0, numel, s->staging + p->rel);
    }
    if (tmp) dt_tensor_destroy(tmp);
  }
  return st;
}

typedef struct {
  int fd;
  int rc, err;
} dt__ck_fsync_t;

static void* dt__ck_fsync_thread(void* a) {
  dt__ck_fsync_t* f = a;
  f->rc = fsync(f->fd);
  f->err = errno;
  return NULL;
}

/* Writes this rank's file, then hashes its boxes (each block, and the box in the same pass)
 * while the file is fsynced on a helper thread (on the writer thread when async). */
static dt_status_t dt__ck_write_file(dt_checkpoint_t ck, dt__ck_save_t* s) {
  DT_CHECK(dt__ck_copy_deferred(s));
  if (s->header == NULL) return DT_SUCCESS; /* nothing to write */
  int fd;
  DT_CHECK(dt__ck_create(s->path, &fd));
  dt_status_t st = dt__ck_st_write_header(fd, s->header, s->header_len, s->path);
  if (st == DT_SUCCESS) st = dt__ck_write_all(fd, s->staging, (size_t)s->staging_nbytes, s->path);
  dt__ck_fsync_t fs = {fd, 0, 0};
  pthread_t th;
  int threaded = st == DT_SUCCESS && pthread_create(&th, NULL, dt__ck_fsync_thread, &fs) == 0;
  if (st == DT_SUCCESS && !threaded) dt__ck_fsync_thread(&fs);
  XXH64_state_t* h = XXH64_createState();
  if (h == NULL && st == DT_SUCCESS) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "hash state");
  for (int b = 0; b < s->n_boxes && st == DT_SUCCESS; b++) {
    const dt__ck_pbox_t* p = &s->boxes[b];
    if (p->writer != ck->rank) continue;
    const unsigned char* d = s->staging + p->rel;
    XXH64_reset(h, 0);
    for (int64_t k = 0; k < p->n_blocks; k++) {
      int64_t o = k * s->block, n = p->nbytes - o < s->block ? p->nbytes - o : s->block;
      s->hashes[p->hash_slot + 1 + k] = dt__ck_hash(d + o, (size_t)n);
      XXH64_update(h, d + o, (size_t)n);
    }
    s->hashes[p->hash_slot] = (uint64_t)XXH64_digest(h);
  }
  XXH64_freeState(h);
  if (threaded) pthread_join(th, NULL);
  if (st == DT_SUCCESS && fs.rc != 0)
    st = DT_FAIL(DT_ERR_IO, "fsync %s: %s", s->path, strerror(fs.err));
  if (close(fd) != 0 && st == DT_SUCCESS)
    st = DT_FAIL(DT_ERR_IO, "closing %s: %s", s->path, strerror(errno));
  return st;
}

static void* dt__ck_thread(void* arg) {
  dt_checkpoint_t ck = arg;
  dt__ck_save_t* s = ck->pending;
  s->st = dt__ck_write_file(ck, s);
  if (s->st != DT_SUCCESS) snprintf(s->err, sizeof s->err, "%s", dt_last_error());
  return NULL;
}

typedef struct {
  char name[DT_CHECKPOINT_NAME_MAX];
  int64_t step;
} dt__ck_old_t;

static int dt__ck_cmp_old(const void* a, const void* b) {
  const dt__ck_old_t* x = a;
  const dt__ck_old_t* y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Removes the oldest complete checkpoints of dir beyond keep (never `keep_name`). Rank 0. */
static dt_status_t dt__ck_prune(const char* dir, int keep, const char* keep_name) {
  DIR* d = opendir(dir);
  if (d == NULL) return DT_FAIL(DT_ERR_IO, "opening %s: %s", dir, strerror(errno));
  dt__ck_old_t* list = NULL;
  int n = 0, cap = 0;
  struct dirent* e;
  dt_status_t st = DT_SUCCESS;
  while ((e = readdir(d)) != NULL && st == DT_SUCCESS) {
    if (!dt__ck_name_ok(e->d_name, 1)) continue;
    char p[DT__CK_PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
    dt__ck_index_t ix;
    if (dt__ck_index_read(p, &ix) != DT_SUCCESS) { /* not a (complete) checkpoint: leave it */
      dt_clear_error();
      continue;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      dt__ck_old_t* q = realloc(list, (size_t)cap * sizeof *q);
      if (q == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "prune");
      else list = q;
    }
    if (st == DT_SUCCESS) {
      snprintf(list[n].name, sizeof list[n].name, "%s", e->d_name);
      list[n++].step = ix.step;
    }
    dt__ck_index_free(&ix);
  }
  closedir(d);
  if (st == DT_SUCCESS && n > keep) {
    qsort(list, (size_t)n, sizeof *list, dt__ck_cmp_old);
    int extra = n - keep;
    for (int i = 0; i < n && extra > 0 && st == DT_SUCCESS; i++) {
      if (strcmp(list[i].name, keep_name) == 0) continue;
      char p[DT__CK_PATH_MAX];
      /* renamed first: a prune cut short leaves a *.tmp the next save removes, never a
       * half-deleted checkpoint directory */
      char q[DT__CK_PATH_MAX + 16];
      if (snprintf(p, sizeof p, "%s/%s", dir, list[i].name) < (int)sizeof p &&
          snprintf(q, sizeof q, "%s.pruned.tmp", p) < (int)sizeof q) {
        if (rename(p, q) != 0) st = DT_FAIL(DT_ERR_IO, "renaming %s: %s", p, strerror(errno));
        else st = dt__ck_rm_rf(q);
      }
      extra--;
    }
    if (st == DT_SUCCESS) st = dt__ck_fsync_path(dir);
  }
  free(list);
  return st;
}

/* Whether dir/name is a save that died after its rename but before `latest` named it: dir/name
 * holds a valid index (a save renames its directory only once the index is written) and a
 * readable latest names another checkpoint with an older step. Such a directory was never
 * published: loads of `latest` never saw it, and a save may replace it. Anything else is kept
 * (the save is refused): a complete checkpoint next to a missing or damaged `latest` (nothing
 * proves that it is not the one a user wants), and a file or directory without a valid index
 * (the user's own files, another tool's checkpoint, a checkpoint whose index.json was damaged or
 * is of a newer format: no save leaves such a directory under its final name). */
static int dt__ck_unpublished(const char* dir, const char* name) {
  char latest[DT_CHECKPOINT_NAME_MAX], p[DT__CK_PATH_MAX + DT_CHECKPOINT_NAME_MAX];
  int has_latest = dt_checkpoint_latest(dir, latest, sizeof latest) == DT_SUCCESS;
  dt_clear_error();
  if (!has_latest || strcmp(latest, name) == 0) return 0;
  dt__ck_index_t mine, pub;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (dt__ck_index_read(p, &mine) != DT_SUCCESS) {
    dt_clear_error();
    return 0;
  }
  int newer = 0;
  snprintf(p, sizeof p, "%s/%s", dir, latest);
  if (dt__ck_index_read(p, &pub) == DT_SUCCESS) {
    newer = mine.step > pub.step;
    dt__ck_index_free(&pub);
  }
  dt__ck_index_free(&mine);
  dt_clear_error();
  return newer;
}

/* Removes leftovers of saves that died: NAME.tmp directories and latest.tmp (not those of saves
 * this process has in flight). Rank 0. */
static void dt__ck_clean(const char* dir) {
  struct stat ds;
  if (stat(dir, &ds) != 0) return;
  DIR* d = opendir(dir);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n <= 4 || strcmp(e->d_name + n - 4, ".tmp") != 0) continue;
    if (dt__ck_inflight_has(ds.st_dev, ds.st_ino, e->d_name, n - 4)) continue;
    char p[DT__CK_PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
    if (dt__ck_rm_rf(p) != DT_SUCCESS) dt_clear_error();
  }
  closedir(d);
}

/* Collective: agrees on the writes, fills the hashes, publishes (rank 0), agrees again. */
static dt_status_t dt__ck_finish(dt_checkpoint_t ck, dt__ck_save_t* s) {
  double tw = dt__ck_now();
  if (s->thread_started) {
    pthread_join(s->thread, NULL);
    s->thread_started = 0;
    if (s->st != DT_SUCCESS) s->st = DT_FAIL(s->st, "%s", s->err);
  }
  dt_status_t st = dt__ck_agree(ck, s->st);
  if (st == DT_SUCCESS && s->n_hash > 0)
    st = dt_mesh_all_reduce_host(ck->world, 0, NULL, s->hashes, s->n_hash, DT_I64, DT_REDUCE_SUM);
  if (st == DT_SUCCESS && ck->rank == 0) {
    dt__ck_index_t* ix = &s->index;
    int* seen = calloc((size_t)(ix->n_tensors > 0 ? ix->n_tensors : 1), sizeof *seen);
    if (seen == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index");
    for (int b = 0; b < s->n_boxes && st == DT_SUCCESS; b++) {
      const dt__ck_pbox_t* p = &s->boxes[b];
      dt__ck_box_t* x = &ix->tensors[p->item].boxes[seen[p->item]++];
      x->xxh64 = s->hashes[p->hash_slot];
      for (int64_t k = 0; k < p->n_blocks; k++) x->blocks[k] = s->hashes[p->hash_slot + 1 + k];
    }
    free(seen);
    char* text = st == DT_SUCCESS ? dt__ck_index_to_json(ix) : NULL;
    if (st == DT_SUCCESS && text == NULL)
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "index.json");
    if (st == DT_SUCCESS) st = dt__ck_write_atomic(s->tmpdir, DT__CK_INDEX, text, strlen(text));
    if (st == DT_SUCCESS) {
      ck->stats.file_nbytes = (int64_t)strlen(text);
      for (int f = 0; f < ix->n_files; f++) ck->stats.file_nbytes += ix->files[f].nbytes;
    }
    free(text);
    if (st == DT_SUCCESS) st = dt__ck_publish(s->dir, s->tmpdir, s->name);
    if (st == DT_SUCCESS && s->keep_last > 0 &&
        dt__ck_prune(s->dir, s->keep_last, s->name) != DT_SUCCESS) {
      fprintf(stderr, "[dtensor checkpoint] saved %.300s, but removing older checkpoints "
              "(keep_last %d) failed: %s\n", s->final, s->keep_last, dt_last_error());
      dt_clear_error();
    }
  }
  dt_status_t agreed = dt__ck_agree(ck, st);
  if (agreed != DT_SUCCESS && ck->rank == 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (dt__ck_rm_rf(s->tmpdir) != DT_SUCCESS) dt_clear_error();
    DT_FAIL(agreed, "%s", msg);
  }
  int64_t fb = ck->stats.file_nbytes;
  if (agreed == DT_SUCCESS)
    (void)dt_mesh_all_reduce_host(ck->world, 0, NULL, &fb, 1, DT_I64, DT_REDUCE_MAX);
  ck->stats.file_nbytes = fb;
  ck->stats.pending = 0;
  ck->stats.stall_s += dt__ck_now() - tw;
  ck->stats.total_s = dt__ck_now() - s->t0;
  return agreed;
}

static dt_status_t dt__checkpoint_wait(dt_checkpoint_t ck) {
  DT_CHECK(dt__ck_check(ck));
  dt__ck_save_t* s = ck->pending;
  if (s == NULL) return DT_SUCCESS;
  dt_status_t st = dt__ck_finish(ck, s);
  ck->pending = NULL;
  dt__ck_give(ck, s->staging, s->staging_nbytes);
  s->staging = NULL;
  dt__ck_save_free(s);
  return st;
}

dt_status_t dt_checkpoint_wait(dt_checkpoint_t ck) { DT_ENTRY_RETURN(dt__checkpoint_wait(ck)); }

static dt_status_t dt__checkpoint_wait_staged(dt_checkpoint_t ck) {
  DT_CHECK(dt__ck_check(ck));
  dt__ck_save_t* s = ck->pending;
  if (s == NULL || !s->thread_started) return DT_SUCCESS;
  double t0 = dt__ck_now();
  pthread_mutex_lock(&s->mu);
  while (!s->staged) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  ck->stats.stall_s += dt__ck_now() - t0;
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_wait_staged(dt_checkpoint_t ck) {
  DT_ENTRY_RETURN(dt__checkpoint_wait_staged(ck));
}

/* Checks the arguments and computes the plan: local (no I/O, no collective), so that every rank
 * reaches the agreement that follows it whatever fails. */
static dt_status_t dt__ck_save_prepare(dt_checkpoint_t ck, dt__ck_save_t* s, const char* dir,
                                       const char* name, const dt_checkpoint_save_opts_t* o) {
  DT__CK_PATH_ARG(dir);
  if (o->keep_last < 0) return DT_FAIL(DT_ERR_INVALID_ARG, "opts->keep_last=%d (valid: >= 0)", o->keep_last);
  if (o->async < DT_CHECKPOINT_SYNC || o->async > DT_CHECKPOINT_ASYNC_DEFER_COPY)
    return DT_FAIL(DT_ERR_INVALID_ARG, "opts->async=%d (valid: 0 sync, 1 async, 2 async with "
                   "the copy deferred)", o->async);
  s->block = o->block_nbytes ? o->block_nbytes : DT__CK_BLOCK_DEFAULT;
  if (s->block < DT__CK_BLOCK_MIN || s->block > DT__CK_BLOCK_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "opts->block_nbytes=%" PRId64 " (valid: 0, or %" PRId64
                   " to %" PRId64 ")", o->block_nbytes, DT__CK_BLOCK_MIN, DT__CK_BLOCK_MAX);
  if (o->step < 0 || o->step > DT__CK_MAX_SAFE)
    return DT_FAIL(DT_ERR_INVALID_ARG, "opts->step=%" PRId64 " (valid: 0 to 2^53, what an "
                   "index can hold exactly)", o->step);
  if (name == NULL) snprintf(s->name, sizeof s->name, "step_%08" PRId64, o->step);
  else if (strlen(name) <= DT_CHECKPOINT_SAVE_NAME_LEN && !dt__ck_name_ok(name, 1))
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "name='%.200s' (valid: printable, no '/', ' ', '\"', '\\' or ':', not "
                   "'latest' nor ending in .tmp)", name);
  /* a name of 240-255 characters failed half way with a bare I/O error (NAME.unpublished.tmp, or
   * from 252 on NAME.tmp, is past NAME_MAX), a path past PATH_MAX at the first file */
  DT_CHECK(dt__ck_save_path_check(dir, name ? name : s->name, ck->world_size));
  if (name != NULL) snprintf(s->name, sizeof s->name, "%s", name);
  if (snprintf(s->dir, sizeof s->dir, "%s", dir) >= (int)sizeof s->dir ||
      snprintf(s->tmpdir, sizeof s->tmpdir, "%s/%s.tmp", dir, s->name) >= (int)sizeof s->tmpdir ||
      snprintf(s->final, sizeof s->final, "%s/%s", dir, s->name) >= (int)sizeof s->final ||
      snprintf(s->path, sizeof s->path, "%s/rank_%05d.safetensors", s->tmpdir, ck->rank) >=
          (int)sizeof s->path)
    return DT_FAIL(DT_ERR_INVALID_ARG, "dir too long: %.200s", dir);
  s->keep_last = o->keep_last;
  for (int i = 0; i < ck->n; i++) {
    int rl = 0;
    if (strcmp(ck->items[i].name, DT__CK_META_KEY) == 0) /* loads still read old ones */
      return DT_FAIL(DT_ERR_INVALID_USAGE,
                     "tensor '%s': a safetensors header cannot have an entry of that name (its "
                     "own metadata key): add it under another name", ck->items[i].name);
    DT_CHECK(dt_tensor_is_rank_local(ck->items[i].t, &rl));
    if (rl && !ck->items[i].as)
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "tensor '%s' is rank-local (dt_tensor_set_rank_local): its values differ "
                     "per rank; add it with dt_checkpoint_add_tensor_as and the placements its "
                     "values follow", ck->items[i].name);
  }
  s->index.values = cJSON_Duplicate(ck->values, 1); /* as they are now, not at the wait */
  if (s->index.values == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "values");
  s->index.step = o->step;
  s->index.world_size = ck->world_size;
  s->index.block_nbytes = s->block;
  snprintf(s->index.library, sizeof s->index.library, "%s", dt_version());
  return dt__ck_plan(ck, s);
}

static dt_status_t dt__checkpoint_save(dt_checkpoint_t ck, const char* dir, const char* name,
                                       const dt_checkpoint_save_opts_t* opts) {
  DT_CHECK(dt__ck_check(ck));
  double t0 = dt__ck_now();
  DT_CHECK(dt__ck_world(ck));
  DT_CHECK(dt__checkpoint_wait(ck));
  dt_checkpoint_save_opts_t o = opts ? *opts : dt_checkpoint_save_opts_default();
  dt__ck_save_t* s = calloc(1, sizeof *s);
  if (s) {
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
  }
  dt_status_t st = s ? dt__ck_save_prepare(ck, s, dir, name, &o)
                     : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "save");
  if (s) s->t0 = t0;
  /* the arguments agreed before rank 0 touches dir: a refusal on some ranks only (a dir, name
   * or option that differs between them) creates, cleans and renames nothing */
  st = dt__ck_agree(ck, st);
  const int args_ok = st == DT_SUCCESS; /* the same on every rank */
  /* rank 0 makes the directory (cleaning leftovers); everyone agrees before writing into it */
  if (args_ok && ck->rank == 0) {
    const char* final = s->final;
    struct stat sb;
    st = dt__ck_mkdir_p(s->dir);
    struct stat ds;
    if (st == DT_SUCCESS && stat(s->dir, &ds) != 0)
      st = DT_FAIL(DT_ERR_IO, "stat %s: %s", s->dir, strerror(errno));
    if (st == DT_SUCCESS) {
      s->dir_dev = ds.st_dev;
      s->dir_ino = ds.st_ino;
      if (dt__ck_inflight_has(ds.st_dev, ds.st_ino, s->name, strlen(s->name)))
        st = DT_FAIL(DT_ERR_INVALID_USAGE, "a save of %s is pending on another checkpoint "
                     "object (dt_checkpoint_wait it first)", final);
    }
    if (st == DT_SUCCESS && stat(final, &sb) == 0) {
      if (dt__ck_unpublished(s->dir, s->name)) { /* a save that died before `latest` named it */
        char q[DT__CK_PATH_MAX + DT_CHECKPOINT_NAME_MAX + 16];
        snprintf(q, sizeof q, "%s.unpublished.tmp", final);
        /* one a save killed before its clean-up left would block the rename (not empty); not
         * the directory of a pending save named NAME.unpublished */
        char qn[DT_CHECKPOINT_NAME_MAX + 16];
        snprintf(qn, sizeof qn, "%s.unpublished", s->name);
        if (dt__ck_inflight_has(s->dir_dev, s->dir_ino, qn, strlen(qn)))
          st = DT_FAIL(DT_ERR_INVALID_USAGE, "a save of %s.unpublished is pending on another "
                       "checkpoint object (dt_checkpoint_wait it first)", final);
        else if (dt__ck_rm_rf(q) != DT_SUCCESS)
          dt_clear_error();
        if (st == DT_SUCCESS && rename(final, q) != 0)
          st = DT_FAIL(DT_ERR_IO, "renaming %s: %s", final, strerror(errno));
      } else {
        st = DT_FAIL(DT_ERR_INVALID_USAGE, "%s exists already (complete checkpoints, and files "
                     "that are not checkpoints, are never overwritten: choose another name or "
                     "remove it)", final);
      }
    }
    if (st == DT_SUCCESS) {
      dt__ck_clean(s->dir);
      if (mkdir(s->tmpdir, 0777) != 0)
        st = DT_FAIL(DT_ERR_IO, "creating %s: %s", s->tmpdir, strerror(errno));
      else if (!dt__ck_inflight_add(s)) {
        (void)rmdir(s->tmpdir); /* empty: a failed save leaves no NAME.tmp */
        st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "the list of saves in flight");
      } else
        s->made_tmpdir = 1;
    }
  }
  if (args_ok) st = dt__ck_agree(ck, st); /* (a refusal of the arguments is agreed already) */
  if (st == DT_SUCCESS)
    st = dt__ck_agree(ck, dt__ck_stage(ck, s, o.async == DT_CHECKPOINT_ASYNC_DEFER_COPY));
  if (st != DT_SUCCESS) {
    if (ck->rank == 0 && s && s->made_tmpdir) { /* (never another save's or a checkpoint) */
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", dt_last_error());
      if (dt__ck_rm_rf(s->tmpdir) != DT_SUCCESS) dt_clear_error();
      DT_FAIL(st, "%s", msg);
    }
    dt__ck_save_free(s);
    return st;
  }
  memset(&ck->stats, 0, sizeof ck->stats);
  snprintf(ck->stats.name, sizeof ck->stats.name, "%s", s->name);
  ck->stats.nbytes = s->nbytes_total;
  ck->stats.rank_nbytes = s->rank_nbytes;
  ck->pending = s;
  if (o.async) {
    if (pthread_create(&s->thread, NULL, dt__ck_thread, ck) == 0) {
      s->thread_started = 1;
      ck->stats.pending = 1;
      ck->stats.stall_s = dt__ck_now() - t0;
      return DT_SUCCESS;
    }
  }
  s->st = dt__ck_write_file(ck, s);
  if (s->st != DT_SUCCESS) snprintf(s->err, sizeof s->err, "%s", dt_last_error());
  ck->stats.stall_s = 0; /* counted in finish: the whole save is a stall */
  st = dt__ck_finish(ck, s);
  ck->stats.stall_s = dt__ck_now() - t0;
  ck->pending = NULL;
  dt__ck_give(ck, s->staging, s->staging_nbytes);
  s->staging = NULL;
  dt__ck_save_free(s);
  return st;
}

dt_status_t dt_checkpoint_save(dt_checkpoint_t ck, const char* dir, const char* name,
                               const dt_checkpoint_save_opts_t* opts) {
  DT_ENTRY_RETURN(dt__checkpoint_save(ck, dir, name, opts));
}

static dt_status_t dt__checkpoint_stats(dt_checkpoint_t ck, dt_checkpoint_stats_t* out) {
  DT_ARG_NOT_NULL(out);
  DT_CHECK(dt__ck_check(ck));
  *out = ck->stats;
  return DT_SUCCESS;
}

dt_status_t dt_checkpoint_stats(dt_checkpoint_t ck, dt_checkpoint_stats_t* out) {
  DT_ENTRY_RETURN(dt__checkpoint_stats(ck, out));
}

/* ---- load ------------------------------------------------------------------------------------- */

typedef struct {
  int index;          /* the saved tensor, -1 when this rank reads nothing */
  int zero;           /* fill with zeros (a Partial(sum) coordinate other than 0) */
  int64_t numel;      /* local */
  int64_t off[DT_MAX_DIMS], len[DT_MAX_DIMS];
  int64_t at;             /* byte offset of its staging in the load's buffer */
  unsigned char* staging; /* borrowed from that buffer */
} dt__ck_dst_t;

static dt_status_t dt__ck_match(dt_checkpoint_t ck, const dt__ck_index_t* ix, const char* ckdir,
                                dt__ck_dst_t* dst) {
  for (int i = 0; i < ck->n; i++) {
    const dt__ck_item_t* it = &ck->items[i];
    int j = dt__ck_index_find(ix, it->name);
    for (int a = 0; j < 0 && a < it->n_alias; a++) j = dt__ck_index_find(ix, it->alias[a]);
    if (j < 0)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s/%s has no tensor '%s'%s (it has %d tensors, e.g. "
                     "'%s')", ckdir, DT__CK_INDEX, it->name, it->n_alias ? " nor its aliases" : "",
                     ix->n_tensors, ix->n_tensors ? ix->tensors[0].name : "-");
    const dt__ck_tensor_t* t = &ix->tensors[j];
    dt_dtype_t dt;
    DT_CHECK(dt_tensor_dtype(it->t, &dt));
    int same = t->ndim == it->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == it->shape[d];
    if (dt != t->dtype || !same) {
      char a[160] = "", b[160] = "";
      for (int d = 0, at = 0; d < t->ndim; d++) at += snprintf(a + at, sizeof a - (size_t)at, "%s%" PRId64, d ? ", " : "", t->shape[d]);
      for (int d = 0, at = 0; d < it->ndim; d++) at += snprintf(b + at, sizeof b - (size_t)at, "%s%" PRId64, d ? ", " : "", it->shape[d]);
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s/%s: tensor '%s' was saved as %s (%s), the one to "
                     "load into is %s (%s)", ckdir, DT__CK_INDEX, it->name, dt_dtype_name(t->dtype),
                     a, dt_dtype_name(dt), b);
    }
    dst[i].index = j;
  }
  return DT_SUCCESS;
}

/* This rank's box of item i, and whether it reads or zero-fills. */
static dt_status_t dt__ck_dst_box(const dt__ck_item_t* it, dt__ck_dst_t* d) {
  dt_mesh_t mesh;
  int member = 0, mnd = 0;
  DT_CHECK(dt_tensor_mesh(it->t, &mesh));
  DT_CHECK(dt_mesh_is_member(mesh, &member));
  DT_CHECK(dt_mesh_ndim(mesh, &mnd));
  DT_CHECK(dt_tensor_local_numel(it->t, &d->numel));
  if (!member || d->numel == 0) {
    d->index = -1;
    d->numel = 0;
    return DT_SUCCESS;
  }
  int c[DT_MAX_MESH_DIMS], ms[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_mesh_coordinate(mesh, c));
  DT_CHECK(dt_mesh_shape(mesh, ms));
  if (it->as) {
    DT_CHECK(dt_placements_box(it->ndim, it->shape, mnd, ms, it->pl, c, d->off, d->len));
    if (dt__ck_numel(it->ndim, d->len) != d->numel)
      return DT_FAIL(DT_ERR_INVALID_ARG, "tensor '%s': this rank holds %" PRId64 " elements, its "
                     "box under the placements given has %" PRId64, it->name, d->numel,
                     dt__ck_numel(it->ndim, d->len));
  } else {
    DT_CHECK(dt_tensor_local_offset(it->t, d->off));
    DT_CHECK(dt_tensor_local_shape(it->t, d->len));
  }
  for (int k = 0; k < mnd; k++)
    if (it->pl[k].kind == DT_PARTIAL && it->pl[k].op == DT_REDUCE_SUM && c[k] != 0) d->zero = 1;
  return DT_SUCCESS;
}

static dt_status_t dt__ck_read_all(dt_checkpoint_t ck, const dt__ck_index_t* ix, const char* ckdir,
                                   dt__ck_dst_t* dst, unsigned char** staging,
                                   int64_t* staging_nbytes) {
  dt__ck_fd_t* fds = dt__ck_fds_new(ix->n_files);
  unsigned char* blockbuf = malloc((size_t)ix->block_nbytes);
  dt_status_t st = fds && blockbuf ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "load buffers");
  /* every box first: one staging buffer (the kept one) for the rank's whole share */
  int64_t total = 0;
  for (int i = 0; i < ck->n && st == DT_SUCCESS; i++) {
    dt__ck_dst_t* d = &dst[i];
    int j = d->index;
    size_t isz = 0;
    st = dt__ck_dst_box(&ck->items[i], d);
    if (st != DT_SUCCESS || d->index < 0 || d->zero) continue;
    d->index = j;
    st = dt_dtype_itemsize(ix->tensors[j].dtype, &isz);
    d->at = total;
    total += d->numel * (int64_t)isz;
  }
  if (st == DT_SUCCESS && total > 0) {
    *staging = dt__ck_take(ck, total, 1);
    *staging_nbytes = total;
    if (*staging == NULL)
      st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "%" PRId64 " bytes of host staging", total);
  }
  for (int i = 0; i < ck->n && st == DT_SUCCESS; i++) {
    const dt__ck_item_t* it = &ck->items[i];
    dt__ck_dst_t* d = &dst[i];
    if (d->index < 0 || d->zero || d->numel == 0) continue;
    int j = d->index;
    size_t isz = 0;
    st = dt_dtype_itemsize(ix->tensors[j].dtype, &isz);
    if (st != DT_SUCCESS) break;
    d->staging = *staging + d->at;
    const dt__ck_tensor_t* t = &ix->tensors[j];
    int64_t covered = 0;
    for (int b = 0; b < t->n_boxes && st == DT_SUCCESS; b++) {
      const dt__ck_box_t* x = &t->boxes[b];
      int meets = 1;
      for (int k = 0; k < t->ndim && meets; k++)
        meets = x->off[k] < d->off[k] + d->len[k] && d->off[k] < x->off[k] + x->len[k];
      if (!meets) continue;
      char path[DT__CK_PATH_MAX];
      st = dt__ck_file_open(ckdir, ix, x->file, fds, path, sizeof path);
      if (st != DT_SUCCESS) break;
      dt__ck_reader_t r = {ix, t, x, b, path, fds[x->file].fd, d->staging, blockbuf, -1, DT_SUCCESS};
      int64_t got = dt__ck_runs(t->ndim, x->off, x->len, d->off, d->len, (int64_t)isz,
                                dt__ck_read_run, &r);
      if (got < 0) st = r.st;
      else covered += got;
    }
    if (st == DT_SUCCESS && covered != d->numel * (int64_t)isz)
      st = DT_FAIL(DT_ERR_CORRUPT, "%s: tensor '%s': the saved boxes cover %" PRId64 " of this "
                   "rank's %" PRId64 " bytes", ckdir, it->name, covered, d->numel * (int64_t)isz);
  }
  dt__ck_fds_close(fds, ix->n_files);
  free(blockbuf);
  return st;
}

static dt_status_t dt__checkpoint_load(dt_checkpoint_t ck, const char* dir, const char* name) {
  DT_CHECK(dt__ck_check(ck));
  DT__CK_PATH_ARG(dir);
  DT_CHECK(dt__ck_world(ck));
  DT_CHECK(dt__checkpoint_wait(ck));
  char nm[DT_CHECKPOINT_NAME_MAX], ckdir[DT__CK_PATH_MAX];
  dt_status_t st = DT_SUCCESS;
  if (name == NULL) { /* rank 0 reads `latest`, every rank loads what it named: a save published
                       * between the ranks' reads must not give them different checkpoints */
    nm[0] = '\0';
    if (ck->rank == 0) st = dt_checkpoint_latest(dir, nm, sizeof nm);
    st = dt__ck_agree(ck, st);
    if (st == DT_SUCCESS) st = dt__ck_share_text(ck, 0, nm, (int)sizeof nm);
    if (st != DT_SUCCESS) return st; /* on every rank */
  } else if (!dt__ck_name_ok(name, 1)) {
    st = DT_FAIL(DT_ERR_INVALID_ARG, "name='%.200s' is not a checkpoint name", name);
  } else {
    snprintf(nm, sizeof nm, "%s", name);
  }
  if (st == DT_SUCCESS && snprintf(ckdir, sizeof ckdir, "%s/%s", dir, nm) >= (int)sizeof ckdir)
    st = DT_FAIL(DT_ERR_INVALID_ARG, "dir too long: %.200s", dir);
  dt__ck_index_t ix;
  memset(&ix, 0, sizeof ix);
  if (st == DT_SUCCESS) st = dt__ck_index_read(ckdir, &ix);
  dt__ck_dst_t* dst = calloc((size_t)(ck->n > 0 ? ck->n : 1), sizeof *dst);
  if (st == DT_SUCCESS && dst == NULL) st = DT_FAIL(DT_ERR_OUT_OF_MEMORY, "load");
  if (st == DT_SUCCESS) st = dt__ck_match(ck, &ix, ckdir, dst);
  st = dt__ck_agree(ck, st);
  unsigned char* staging = NULL;
  int64_t staging_nbytes = 0;
  if (st == DT_SUCCESS)
    st = dt__ck_agree(ck, dt__ck_read_all(ck, &ix, ckdir, dst, &staging, &staging_nbytes));
  /* commit: nothing was written before every rank had read and checked everything */
  dt_status_t cst = DT_SUCCESS;
  for (int i = 0; st == DT_SUCCESS && i < ck->n && cst == DT_SUCCESS; i++) {
    dt__ck_dst_t* d = &dst[i];
    if (d->numel == 0 || d->index < 0) continue;
    if (d->zero) {
      int64_t zero = 0;
      cst = dt_tensor_fill_local(ck->items[i].t, 1, &zero, &d->numel, 0.0);
    } else {
      cst = dt_tensor_write_local(ck->items[i].t, 0, d->numel, d->staging);
    }
  }
  dt__ck_give(ck, staging, staging_nbytes);
  if (st == DT_SUCCESS) st = dt__ck_agree(ck, cst);
  if (st == DT_SUCCESS) {
    cJSON* v = cJSON_Duplicate(ix.values, 1);
    if (v) {
      cJSON_Delete(ck->values);
      ck->values = v;
    }
  }
  free(dst);
  dt__ck_index_free(&ix);
  return st;
}

dt_status_t dt_checkpoint_load(dt_checkpoint_t ck, const char* dir, const char* name) {
  DT_ENTRY_RETURN(dt__checkpoint_load(ck, dir, name));
}

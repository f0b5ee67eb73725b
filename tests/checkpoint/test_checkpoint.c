/* test_checkpoint.c - distributed checkpoints within one job (np 1, 2, 4, 8):
 *
 *  - resharding: tensors of several dtypes and ranks (uneven dims, dims smaller than the mesh so
 *    some shards are empty, 0-d, zero-size) saved from one mesh and placements and loaded onto
 *    every other layout of a list (1-D and 2-D meshes, Shard on any dim, two mesh dims sharding
 *    one tensor dim, Replicate, Partial sum/avg/max), each one checked bit for bit against the
 *    dense values (dt_tensor_gather_full); sync and async saves (the copy made in the save, or
 *    deferred to the writer thread, the tensors overwritten once dt_checkpoint_wait_staged
 *    returns);
 *  - the plan: each box written once (the index's boxes tile each tensor; the file bytes equal
 *    the tensor bytes plus headers), a replicated tensor's writers spread over the ranks;
 *  - rank-local tensors refused by add_tensor, saved through add_tensor_as;
 *  - named values round trip; keep_last prunes; `latest` follows; a save over an existing name is
 *    refused on every rank (a checkpoint, or a file or directory that is none); a leftover
 *    NAME.tmp is ignored by load and removed by the next save, a pending save's NAME.tmp is not
 *    (two checkpoint objects saving into one directory); a load of `latest` loads what rank 0
 *    reads it to name;
 *  - bad input: a flipped byte, a truncated file, a malformed or oversized header, a missing
 *    tensor, a wrong dtype or shape, an index from another model: the same status and message
 *    on every rank (naming the file and the tensor), and the tensors unchanged; empty paths,
 *    paths at the length limit and the name __metadata__ refused;
 *  - name and path lengths: names past DT_CHECKPOINT_SAVE_NAME_LEN (their NAME.unpublished.tmp
 *    past NAME_MAX) and paths past PATH_MAX - 1 refused up front, alike on every rank, nothing
 *    made; the longest of each saves and loads; a bad argument on one rank only is agreed
 *    before rank 0 touches the directory;
 *  - symbolic links at the writers' temporary paths (DIR/latest.tmp, NAME.tmp/index.json.tmp,
 *    consolidate's OUT.tmp, an import's latest.tmp) refused, never written through; links left
 *    as *.tmp in DIR before a save removed by it, their targets untouched.
 * The directory is argv[1] (default /tmp/dt_ckpt_test_<pid of rank 0>).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_test.h"
#include "dtensor/checkpoint.h"

static int g_world, g_rank;
static char g_dir[512];

typedef struct {
  const char* name;
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[3];
} spec_t;

static const spec_t g_specs[] = {
    {"w.even", DT_F32, 2, {8, 12}},   {"w.uneven", DT_F32, 2, {13, 5}},
    {"b.small", DT_BF16, 1, {3}},     {"e.ids", DT_I64, 2, {7, 3}},
    {"h.half", DT_F16, 3, {5, 2, 6}}, {"s.scalar", DT_F32, 0, {0}},
    {"z.empty", DT_F32, 2, {0, 4}},   {"c.i32", DT_I32, 1, {9}},
};
#define NSPEC ((int)(sizeof g_specs / sizeof g_specs[0]))

static int64_t numel_of(const spec_t* s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
  return n;
}

/* Dense value of element i of tensor k at version v, exactly representable in every dtype. */
static double value_at(int k, int64_t i, int v) {
  return (double)(((i * 7 + k * 13 + v * 5) % 61) - 30) / 4.0;
}

static void fill_dense(const spec_t* s, int k, int v, void* buf) {
  int64_t n = numel_of(s);
  for (int64_t i = 0; i < n; i++) {
    double x = value_at(k, i, v);
    switch (s->dtype) {
      case DT_F32: ((float*)buf)[i] = (float)x; break;
      case DT_I32: ((int32_t*)buf)[i] = (int32_t)(x * 4); break;
      case DT_I64: ((int64_t*)buf)[i] = (int64_t)(x * 4) * 1000000007LL; break;
      case DT_BF16: {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t*)buf)[i] = (uint16_t)(u >> 16); /* exact: x has few mantissa bits */
        break;
      }
      case DT_F16: { /* x = m / 4 with |m| <= 30: build the half by hand */
        float f = (float)x;
        uint16_t h = 0;
        if (f != 0) {
          uint32_t u;
          memcpy(&u, &f, 4);
          uint32_t sign = u >> 31, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
          h = (uint16_t)(sign << 15 | (exp - 127 + 15) << 10 | man >> 13);
        }
        ((uint16_t*)buf)[i] = h;
        break;
      }
      default: break;
    }
  }
}

typedef struct {
  const char* mesh; /* "4", "2x2" */
  const char* pl;   /* per spec k: placements text with {d} meaning shard dim k-specific */
} layout_t;

static dt_mesh_t make_mesh(const char* text) {
  int shape[4], nd = 0;
  if (strcmp(text, "world") == 0) {
    shape[0] = g_world;
    nd = 1;
  } else if (strcmp(text, "2x") == 0) {
    shape[0] = 2;
    shape[1] = g_world / 2;
    nd = 2;
  } else if (strcmp(text, "x2") == 0) {
    shape[0] = g_world / 2;
    shape[1] = 2;
    nd = 2;
  }
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(nd, shape, NULL, NULL, &m));
  return m;
}

/* Placements of layout `lay` for a tensor of ndim dims (shard dims clamped to the rank). */
static void layout_pl(int lay, int ndim, int mesh_nd, dt_placement_t* pl) {
  for (int d = 0; d < mesh_nd; d++) {
    memset(&pl[d], 0, sizeof pl[d]);
    pl[d].kind = DT_REPLICATE;
  }
  int last = ndim - 1;
  switch (lay) {
    case 0: break; /* all Replicate */
    case 1: if (ndim > 0) { pl[0].kind = DT_SHARD; pl[0].dim = 0; } break;
    case 2: if (ndim > 0) { pl[0].kind = DT_SHARD; pl[0].dim = last; } break;
    case 3: /* 2-D: S(0), S(last) */
      if (ndim > 0) { pl[0].kind = DT_SHARD; pl[0].dim = 0; }
      if (ndim > 0 && mesh_nd > 1) { pl[1].kind = DT_SHARD; pl[1].dim = last; }
      break;
    case 4: /* 2-D: S(0), S(0): nested */
      if (ndim > 0) { pl[0].kind = DT_SHARD; pl[0].dim = 0; }
      if (ndim > 0 && mesh_nd > 1) { pl[1].kind = DT_SHARD; pl[1].dim = 0; }
      break;
    case 5: /* Partial(sum) on the first mesh dim, Shard(0) on the second */
      pl[0].kind = DT_PARTIAL;
      pl[0].op = DT_REDUCE_SUM;
      if (ndim > 0 && mesh_nd > 1) { pl[1].kind = DT_SHARD; pl[1].dim = 0; }
      break;
    case 6: /* HSDP-like: Replicate, Shard(0) */
      if (ndim > 0 && mesh_nd > 1) { pl[1].kind = DT_SHARD; pl[1].dim = 0; }
      break;
  }
}

static const struct { const char* mesh; int lay; } g_layouts[] = {
    {"world", 0}, {"world", 1}, {"world", 2}, {"2x", 3}, {"2x", 4},
    {"x2", 5},    {"2x", 6},    {"x2", 3},    {"world", 5},
};
#define NLAY ((int)(sizeof g_layouts / sizeof g_layouts[0]))

static int layout_ok(int li) {
  return strcmp(g_layouts[li].mesh, "world") == 0 || (g_world % 2 == 0 && g_world >= 2);
}

typedef struct {
  dt_mesh_t mesh;
  dt_tensor_t t[NSPEC];
} set_t;

/* Tensors of layout li holding version v (Partial ones: the value as from Replicate). */
static set_t make_set(int li, int v) {
  set_t s;
  s.mesh = make_mesh(g_layouts[li].mesh);
  int mnd = 0;
  DT_ASSERT_OK(dt_mesh_ndim(s.mesh, &mnd));
  for (int k = 0; k < NSPEC; k++) {
    const spec_t* sp = &g_specs[k];
    dt_placement_t pl[4], rep[4];
    layout_pl(g_layouts[li].lay, sp->ndim, mnd, pl);
    layout_pl(0, sp->ndim, mnd, rep);
    size_t isz = 0;
    DT_ASSERT_OK(dt_dtype_itemsize(sp->dtype, &isz));
    void* full = calloc((size_t)numel_of(sp) + 1, isz);
    fill_dense(sp, k, v, full);
    int partial = 0;
    for (int d = 0; d < mnd; d++) partial |= pl[d].kind == DT_PARTIAL;
    if (partial && sp->dtype != DT_I32 && sp->dtype != DT_I64 && sp->dtype != DT_F32) {
      pl[0].kind = DT_REPLICATE; /* R -> P(sum) divides half floats inexactly: keep them R */
      pl[0].op = 0;
    }
    if (partial) {
      dt_tensor_t r;
      DT_ASSERT_OK(dt_tensor_from_full(s.mesh, sp->dtype, sp->ndim, sp->shape, rep, full, &r));
      DT_ASSERT_OK(dt_tensor_redistribute(r, pl, &s.t[k]));
      DT_ASSERT_OK(dt_tensor_destroy(r));
    } else {
      DT_ASSERT_OK(dt_tensor_from_full(s.mesh, sp->dtype, sp->ndim, sp->shape, pl, full, &s.t[k]));
    }
    free(full);
  }
  return s;
}

static void free_set(set_t* s) {
  for (int k = 0; k < NSPEC; k++) DT_ASSERT_OK(dt_tensor_destroy(s->t[k]));
  DT_ASSERT_OK(dt_mesh_destroy(s->mesh));
}

static dt_checkpoint_t list_of(set_t* s) {
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  for (int k = 0; k < NSPEC; k++) DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, g_specs[k].name, s->t[k]));
  return ck;
}

/* Every tensor of s equals version v, bit for bit (Partial(sum) of floats: within rounding of
 * the R -> P split, which divides by the mesh-dim size: the values are multiples of 1/4 and the
 * sizes powers of two, so it is exact too). */
static void check_set(set_t* s, int v, const char* what) {
  for (int k = 0; k < NSPEC; k++) {
    const spec_t* sp = &g_specs[k];
    size_t isz = 0;
    DT_ASSERT_OK(dt_dtype_itemsize(sp->dtype, &isz));
    size_t nb = (size_t)numel_of(sp) * isz;
    unsigned char* got = calloc(nb + 1, 1);
    unsigned char* want = calloc(nb + 1, 1);
    fill_dense(sp, k, v, want);
    DT_ASSERT_OK(dt_tensor_gather_full(s->t[k], got, nb + 1));
    DT_ASSERT_TRUE(memcmp(got, want, nb) == 0, "%s: tensor %s differs from version %d", what,
                   sp->name, v);
    free(got);
    free(want);
  }
}

static void run_cmd(const char* fmt, const char* a) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, fmt, a, a, a); /* every %s is `a` */
  DT_ASSERT_EQ(system(cmd), 0);
}

static int exists(const char* p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

static void barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

/* Every layout saved, and loaded into every layout. */
/* Loads whose staging is 4 MiB or more (a new one on 2 MiB pages): a 1280 x 1024 f32 tensor
 * saved Replicate (5 MiB per rank) and loaded into fresh objects as Replicate and as Shard(1),
 * values exact. */
static void test_large_staging(void) {
  dt_mesh_t mesh = make_mesh("world");
  const int64_t shape[2] = {1280, 1024}, n = shape[0] * shape[1];
  float* full = malloc(sizeof(float) * (size_t)n);
  float* got = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_TRUE(full != NULL && got != NULL, "allocating %lld floats", (long long)n);
  for (int64_t i = 0; i < n; i++) full[i] = (float)(i % 1999) * 0.5f;
  dt_placement_t pl[2] = {dt_replicate(), dt_shard(1)};
  dt_tensor_t a;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, shape, &pl[0], full, &a));
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "big", a));
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "big_staging", NULL));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  for (int k = 0; k < 2; k++) {
    dt_tensor_t b;
    DT_ASSERT_OK(dt_tensor_zeros(mesh, DT_F32, 2, shape, &pl[k], &b));
    dt_checkpoint_t ld;
    DT_ASSERT_OK(dt_checkpoint_create(&ld));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ld, "big", b));
    DT_ASSERT_OK(dt_checkpoint_load(ld, g_dir, "big_staging"));
    DT_ASSERT_OK(dt_tensor_gather_full(b, got, sizeof(float) * (size_t)n));
    DT_ASSERT_TRUE(memcmp(got, full, sizeof(float) * (size_t)n) == 0,
                   "the 5 MiB tensor loaded as %s differs", k ? "Shard(1)" : "Replicate");
    DT_ASSERT_OK(dt_checkpoint_destroy(ld));
    DT_ASSERT_OK(dt_tensor_destroy(b));
  }
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  free(full);
  free(got);
  if (g_rank == 0) printf("large staging: a 5 MiB load into Replicate and Shard(1), exact\n");
}

static void test_reshard(void) {
  int n = 0;
  for (int a = 0; a < NLAY; a++) {
    if (!layout_ok(a)) continue;
    set_t src = make_set(a, 1);
    dt_checkpoint_t ck = list_of(&src);
    char name[64];
    snprintf(name, sizeof name, "from_%d", a);
    dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
    o.step = a;
    o.async = a % 3; /* sync, async, async with the copy deferred to the writer thread */
    o.block_nbytes = 4096;
    DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, name, &o));
    if (o.async == DT_CHECKPOINT_ASYNC_DEFER_COPY) {
      /* once staged, the tensors may change: the checkpoint keeps the values of the save */
      DT_ASSERT_OK(dt_checkpoint_wait_staged(ck));
      DT_ASSERT_OK(dt_checkpoint_wait_staged(ck)); /* again: returns at once */
      for (int k = 0; k < NSPEC; k++) {
        int64_t ln = 0, zero = 0;
        DT_ASSERT_OK(dt_tensor_local_numel(src.t[k], &ln));
        if (ln > 0) DT_ASSERT_OK(dt_tensor_fill_local(src.t[k], 1, &zero, &ln, 99.0));
      }
    }
    DT_ASSERT_OK(dt_checkpoint_wait(ck));
    DT_ASSERT_OK(dt_checkpoint_wait_staged(ck)); /* nothing pending: a no-op */
    dt_checkpoint_stats_t st;
    DT_ASSERT_OK(dt_checkpoint_stats(ck, &st));
    DT_ASSERT_EQ(st.pending, 0);
    int64_t want_nbytes = 0;
    for (int k = 0; k < NSPEC; k++) {
      size_t isz;
      dt_dtype_itemsize(g_specs[k].dtype, &isz);
      want_nbytes += numel_of(&g_specs[k]) * (int64_t)isz;
    }
    DT_ASSERT_EQ(st.nbytes, want_nbytes); /* each box once */
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    for (int b = 0; b < NLAY; b++) {
      if (!layout_ok(b)) continue;
      set_t dst = make_set(b, 2);
      dt_checkpoint_t ld = list_of(&dst);
      DT_ASSERT_OK(dt_checkpoint_load(ld, g_dir, name));
      char what[64];
      snprintf(what, sizeof what, "layout %d -> %d", a, b);
      check_set(&dst, 1, what);
      DT_ASSERT_OK(dt_checkpoint_destroy(ld));
      free_set(&dst);
      n++;
    }
    free_set(&src);
  }
  if (g_rank == 0) printf("reshard: %d (save layout, load layout) pairs bit-identical\n", n);
  if (g_rank == 0) run_cmd("rm -rf %s/from_*", g_dir);
  barrier();
}

static void same_everywhere(const char* msg);

/* Values, latest, keep_last, refusal of an existing name, leftovers. */
static void test_publish(void) {
  set_t s = make_set(1, 3);
  dt_checkpoint_t ck = list_of(&s);
  char dir[600];
  snprintf(dir, sizeof dir, "%s/publish", g_dir);
  for (int step = 1; step <= 4; step++) {
    DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", step * 10));
    DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "seed", -1234567890123456789LL));
    DT_ASSERT_OK(dt_checkpoint_set_f64(ck, "lr", 0.1 / 3 * step));
    dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
    o.step = step * 10;
    o.keep_last = 2;
    o.async = step % 2;
    if (step == 3 && g_rank == 0) { /* a save that died: its leftover is cleaned */
      char p[1300];
      snprintf(p, sizeof p, "mkdir -p %s/step_00000099.tmp && touch %s/step_00000099.tmp/x", dir, dir);
      DT_ASSERT_EQ(system(p), 0);
    }
    barrier();
    DT_ASSERT_OK(dt_checkpoint_save(ck, dir, NULL, &o));
    if (o.async) DT_ASSERT_OK(dt_checkpoint_wait(ck));
    char latest[64];
    DT_ASSERT_OK(dt_checkpoint_latest(dir, latest, sizeof latest));
    char want[64];
    snprintf(want, sizeof want, "step_%08d", step * 10);
    DT_ASSERT_TRUE(strcmp(latest, want) == 0, "latest %s, want %s", latest, want);
  }
  char p[700];
  snprintf(p, sizeof p, "%s/step_00000010", dir);
  DT_ASSERT_TRUE(!exists(p), "keep_last 2 kept %s", p);
  snprintf(p, sizeof p, "%s/step_00000030", dir);
  DT_ASSERT_TRUE(exists(p), "keep_last 2 removed %s", p);
  snprintf(p, sizeof p, "%s/step_00000099.tmp", dir);
  DT_ASSERT_TRUE(!exists(p), "the leftover %s was not removed", p);
  /* the same name again: refused on every rank, nothing changed */
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.step = 40;
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, dir, NULL, &o), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "exists already") != NULL, "%s", dt_last_error());
  /* values come back with the load; a leftover NAME.tmp next to it is ignored */
  if (g_rank == 0) run_cmd("mkdir -p %s/junk.tmp", dir);
  barrier();
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 0));
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "other", 5));
  DT_ASSERT_OK(dt_checkpoint_load(ck, dir, NULL));
  int64_t step = 0, seed = 0;
  double lr = 0;
  DT_ASSERT_OK(dt_checkpoint_get_i64(ck, "step", &step));
  DT_ASSERT_OK(dt_checkpoint_get_i64(ck, "seed", &seed));
  DT_ASSERT_OK(dt_checkpoint_get_f64(ck, "lr", &lr));
  DT_ASSERT_EQ(step, 40);
  DT_ASSERT_TRUE(seed == -1234567890123456789LL, "seed %lld", (long long)seed);
  DT_ASSERT_TRUE(lr == 0.1 / 3 * 4, "lr %.17g", lr);
  DT_ASSERT_STATUS(dt_checkpoint_get_i64(ck, "other", &step), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_get_f64(ck, "step", &lr), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_set_i64(ck, "bad key", 1), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_set_f64(ck, "x", NAN), DT_ERR_INVALID_ARG);
  dt_checkpoint_save_opts_t bad = dt_checkpoint_save_opts_default();
  bad.async = 3;
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, dir, "bad_async", &bad), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "opts->async=3") != NULL, "%s", dt_last_error());
  /* a save that died after renaming its directory but before replacing `latest`: the next save
   * of that name replaces it; the values an async save records are those of the save call */
  dt_checkpoint_save_opts_t o5 = dt_checkpoint_save_opts_default();
  o5.step = 50;
  o5.async = 1;
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 50));
  DT_ASSERT_OK(dt_checkpoint_save(ck, dir, NULL, &o5));
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 51)); /* training went on */
  DT_ASSERT_OK(dt_checkpoint_wait(ck));
  if (g_rank == 0) {
    snprintf(p, sizeof p, "echo step_00000040 > %s/latest", dir);
    DT_ASSERT_EQ(system(p), 0);
    /* and a leftover of a save killed between moving such a directory aside and its clean-up
     * (it made the rename fail: the step could never be saved again) */
    run_cmd("mkdir -p %s/step_00000050.unpublished.tmp && touch %s/step_00000050.unpublished.tmp/x",
            dir);
  }
  barrier();
  DT_ASSERT_OK(dt_checkpoint_save(ck, dir, NULL, &o5));
  DT_ASSERT_OK(dt_checkpoint_wait(ck));
  DT_ASSERT_OK(dt_checkpoint_load(ck, dir, NULL));
  DT_ASSERT_OK(dt_checkpoint_get_i64(ck, "step", &step));
  DT_ASSERT_EQ(step, 51); /* the second save was made with step 51 set */
  char latest50[64];
  DT_ASSERT_OK(dt_checkpoint_latest(dir, latest50, sizeof latest50));
  DT_ASSERT_TRUE(strcmp(latest50, "step_00000050") == 0, "latest %s", latest50);
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 60));
  o5.step = 60;
  DT_ASSERT_OK(dt_checkpoint_save(ck, dir, NULL, &o5));
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 61));
  DT_ASSERT_OK(dt_checkpoint_wait(ck));
  DT_ASSERT_OK(dt_checkpoint_load(ck, dir, NULL));
  DT_ASSERT_OK(dt_checkpoint_get_i64(ck, "step", &step));
  DT_ASSERT_EQ(step, 60); /* not 61: the value at the save call */
  FILE* out = g_rank == 0 ? stdout : fopen("/dev/null", "w");
  DT_ASSERT_OK(dt_checkpoint_info(dir, out));
  if (out != stdout) fclose(out);
  DT_ASSERT_OK(dt_checkpoint_verify(dir, NULL));
  /* what a save of the same name never replaces, though `latest` names an older step: a
   * directory of the user's files, a plain file, a checkpoint whose index.json was damaged (a
   * save that dies leaves its directory under NAME only once the index is complete); each was
   * deleted as "unpublished" */
  if (g_rank == 0) {
    run_cmd("mkdir -p %s/step_00000070 && echo notes > %s/step_00000070/notes.txt", dir);
    run_cmd("echo precious > %s/userfile", dir);
    run_cmd("cp -r %s/step_00000060 %s/step_00000080 && echo '{' > %s/step_00000080/index.json",
            dir);
  }
  barrier();
  static const char* const kept[3] = {"step_00000070/notes.txt", "userfile",
                                      "step_00000080/rank_00000.safetensors"};
  for (int k = 0; k < 3; k++) {
    dt_checkpoint_save_opts_t ok = dt_checkpoint_save_opts_default();
    ok.step = k == 0 ? 70 : 80;
    DT_ASSERT_STATUS(dt_checkpoint_save(ck, dir, k == 1 ? "userfile" : NULL, &ok),
                     DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "exists already") != NULL, "%s", dt_last_error());
    same_everywhere(dt_last_error());
    snprintf(p, sizeof p, "%s/%s", dir, kept[k]);
    DT_ASSERT_TRUE(exists(p), "a refused save removed %s", p);
  }
  DT_ASSERT_OK(dt_checkpoint_latest(dir, latest50, sizeof latest50));
  DT_ASSERT_TRUE(strcmp(latest50, "step_00000060") == 0, "latest %s", latest50);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  free_set(&s);
  barrier();
}

/* A load of `latest` loads the checkpoint rank 0 reads it to name, on every rank. Each rank
 * reading `latest` itself loaded a mix of two checkpoints when a save was published between the
 * ranks' reads (an evaluation job loading while training saves); per-rank directories whose
 * `latest` differ stand for that moment here. */
static void test_latest_agreed(void) {
  if (g_world < 2) return;
  char d0[600], mine[600];
  snprintf(d0, sizeof d0, "%s/lt_0", g_dir);
  snprintf(mine, sizeof mine, "%s/lt_%d", g_dir, g_rank);
  for (int v = 1; v <= 2; v++) {
    set_t s = make_set(1, v);
    dt_checkpoint_t ck = list_of(&s);
    DT_ASSERT_OK(dt_checkpoint_save(ck, d0, v == 1 ? "s1" : "s2", NULL));
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    free_set(&s);
  }
  if (g_rank == 0) {
    run_cmd("echo s1 > %s/lt_0/latest", g_dir);
    for (int r = 1; r < g_world; r++) {
      char cmd[2400];
      snprintf(cmd, sizeof cmd, "cp -r %s %s/lt_%d && echo s2 > %s/lt_%d/latest", d0, g_dir, r,
               g_dir, r);
      DT_ASSERT_EQ(system(cmd), 0);
    }
  }
  barrier();
  set_t dst = make_set(1, 3);
  dt_checkpoint_t ck = list_of(&dst);
  DT_ASSERT_OK(dt_checkpoint_load(ck, mine, NULL));
  check_set(&dst, 1, "a load of latest (rank 0's s1; the others' latest says s2)");
  /* rank 0 without a latest: every rank fails alike, none waits */
  if (g_rank == 0) run_cmd("rm %s/lt_0/latest", g_dir);
  barrier();
  DT_ASSERT_STATUS(dt_checkpoint_load(ck, mine, NULL), DT_ERR_IO);
  same_everywhere(dt_last_error());
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  free_set(&dst);
  barrier();
  if (g_rank == 0) run_cmd("rm -rf %s/lt_*", g_dir);
  barrier();
}

/* Two checkpoint objects saving into one directory (the model's and the data loader's, say):
 * the second's clean-up of leftover NAME.tmp directories removed the first's pending async save
 * (its wait then failed, its files gone); a save of a pending save's name is refused. */
static void test_two_objects(void) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/two", g_dir);
  set_t a = make_set(1, 1), b = make_set(1, 2), dst = make_set(1, 3);
  dt_checkpoint_t ca = list_of(&a), cb = list_of(&b);
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.async = DT_CHECKPOINT_ASYNC;
  DT_ASSERT_OK(dt_checkpoint_save(ca, dir, "pa", &o));
  DT_ASSERT_STATUS(dt_checkpoint_save(cb, dir, "pa", NULL), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "pending") != NULL, "%s", dt_last_error());
  same_everywhere(dt_last_error());
  DT_ASSERT_OK(dt_checkpoint_save(cb, dir, "pb", NULL));
  DT_ASSERT_OK(dt_checkpoint_wait(ca));
  dt_checkpoint_t cd = list_of(&dst);
  DT_ASSERT_OK(dt_checkpoint_load(cd, dir, "pa"));
  check_set(&dst, 1, "the async save pending while another object saved into its directory");
  DT_ASSERT_OK(dt_checkpoint_load(cd, dir, "pb"));
  check_set(&dst, 2, "the other object's save");
  /* a save moving an unpublished NAME aside to NAME.unpublished.tmp (removing a leftover there
   * first) while another object's save of NAME.unpublished is pending: refused, the pending one
   * kept */
  dt_checkpoint_save_opts_t s1 = dt_checkpoint_save_opts_default(), s5 = s1;
  s1.step = 1;
  s5.step = 5;
  DT_ASSERT_OK(dt_checkpoint_save(cb, dir, "old", &s1));
  DT_ASSERT_OK(dt_checkpoint_save(cb, dir, "pu", &s5));
  if (g_rank == 0) run_cmd("echo old > %s/two/latest", g_dir); /* pu: unpublished */
  barrier();
  DT_ASSERT_OK(dt_checkpoint_save(ca, dir, "pu.unpublished", &o));
  DT_ASSERT_STATUS(dt_checkpoint_save(cb, dir, "pu", &s5), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "pending") != NULL, "%s", dt_last_error());
  DT_ASSERT_OK(dt_checkpoint_wait(ca));
  DT_ASSERT_OK(dt_checkpoint_load(cd, dir, "pu.unpublished"));
  check_set(&dst, 1, "the pending save of NAME.unpublished");
  DT_ASSERT_OK(dt_checkpoint_save(cb, dir, "pu", &s5)); /* now it is replaced */
  /* an abandoned save (its object destroyed) is a leftover again: the next save removes it */
  DT_ASSERT_OK(dt_checkpoint_save(ca, dir, "pc", &o));
  DT_ASSERT_OK(dt_checkpoint_destroy(ca)); /* (every rank's writer thread joined) */
  barrier();
  DT_ASSERT_OK(dt_checkpoint_save(cb, dir, "pd", NULL));
  char p[700];
  snprintf(p, sizeof p, "%s/pc.tmp", dir);
  DT_ASSERT_TRUE(!exists(p), "the abandoned %s was not removed", p);
  DT_ASSERT_OK(dt_checkpoint_destroy(cb));
  DT_ASSERT_OK(dt_checkpoint_destroy(cd));
  free_set(&a);
  free_set(&b);
  free_set(&dst);
  barrier();
}

/* Rank-local tensors: refused as such, saved through add_tensor_as. */
static void test_rank_local(void) {
  dt_mesh_t m = make_mesh("world");
  dt_placement_t rep = {DT_REPLICATE, 0, 0}, sh = {DT_SHARD, 0, 0};
  int64_t lshape[2] = {2, 3}, gshape[2] = {2 * g_world, 3};
  float local[6];
  for (int i = 0; i < 6; i++) local[i] = (float)(g_rank * 10 + i);
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_local(m, DT_F32, 2, lshape, &rep, local, lshape, &t));
  DT_ASSERT_OK(dt_tensor_set_rank_local(t, 1));
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "experts", t));
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, "rl", NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "rank-local") != NULL, "%s", dt_last_error());
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  DT_ASSERT_OK(dt_checkpoint_add_tensor_as(ck, "experts", t, 2, gshape, &sh));
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "rl", NULL));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  /* load as a plain Shard(0) tensor: the concatenation of every rank's values */
  dt_tensor_t full;
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 2, gshape, &rep, &full));
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "experts", full));
  DT_ASSERT_OK(dt_checkpoint_load(ck, g_dir, "rl"));
  float* got = calloc((size_t)(6 * g_world), sizeof *got);
  DT_ASSERT_OK(dt_tensor_gather_full(full, got, (size_t)(6 * g_world) * sizeof *got));
  for (int r = 0; r < g_world; r++)
    for (int i = 0; i < 6; i++) DT_ASSERT_EQ(got[r * 6 + i], r * 10 + i);
  free(got);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  DT_ASSERT_OK(dt_tensor_destroy(full));
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_mesh_destroy(m));
}

/* The message every rank returns must be the same: compare its hash over the world. */
static void same_everywhere(const char* msg) {
  unsigned long h = 5381;
  for (const char* c = msg; *c; c++) h = h * 33 + (unsigned char)*c;
  unsigned long lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
  DT_ASSERT_TRUE(lo == hi, "the ranks' messages differ; this one: %s", msg);
}

static void expect_load_fails(set_t* dst, const char* name, dt_status_t want, const char* needle,
                              const char* needle2) {
  dt_checkpoint_t ck = list_of(dst);
  DT_ASSERT_STATUS(dt_checkpoint_load(ck, g_dir, name), want);
  const char* e = dt_last_error();
  DT_ASSERT_TRUE(strstr(e, needle) != NULL, "'%s' not in: %s", needle, e);
  if (needle2) DT_ASSERT_TRUE(strstr(e, needle2) != NULL, "'%s' not in: %s", needle2, e);
  same_everywhere(e);
  check_set(dst, 2, "after a failed load"); /* nothing changed */
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
}

/* base + "/./././..." + suffix, `len` characters in all (a path naming base/suffix). */
static void long_path(char* out, size_t cap, const char* base, const char* suffix, size_t len) {
  size_t at = (size_t)snprintf(out, cap, "%s/", base);
  if ((len - at - strlen(suffix)) % 2) at += (size_t)snprintf(out + at, cap - at, "/");
  while (at + strlen(suffix) < len) at += (size_t)snprintf(out + at, cap - at, "./");
  snprintf(out + at, cap - at, "%s", suffix);
  DT_ASSERT_EQ(strlen(out), len);
}

/* The whole file at p (malloc'd, *n bytes). */
static unsigned char* slurp(const char* p, size_t* n) {
  FILE* f = fopen(p, "rb");
  DT_ASSERT_TRUE(f != NULL, "opening %s", p);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char* b = malloc(*n + 1);
  DT_ASSERT_TRUE(b && fread(b, 1, *n, f) == *n, "reading %s", p);
  fclose(f);
  return b;
}

static void test_bad_input(void) {
  int lay = g_world >= 2 && g_world % 2 == 0 ? 3 : 1;
  set_t src = make_set(lay, 1);
  dt_checkpoint_t ck = list_of(&src);
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "good", NULL));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  set_t dst = make_set(1, 2);
  const char* file0 = "rank_00000.safetensors";
  char p[800];
  /* 1. a flipped byte in the last box of rank 0's file */
  if (g_rank == 0) {
    run_cmd("rm -rf %s/b1 && cp -r %s/good %s/b1", g_dir);
    snprintf(p, sizeof p, "%s/b1/%s", g_dir, file0);
    int fd = open(p, O_RDWR);
    struct stat sb;
    fstat(fd, &sb);
    unsigned char c;
    DT_ASSERT_EQ(pread(fd, &c, 1, sb.st_size - 1), 1);
    c ^= 0x10;
    DT_ASSERT_EQ(pwrite(fd, &c, 1, sb.st_size - 1), 1);
    close(fd);
  }
  barrier();
  expect_load_fails(&dst, "b1", DT_ERR_CORRUPT, "checksum mismatch", file0);
  /* 2. a truncated file */
  if (g_rank == 0) {
    run_cmd("rm -rf %s/b2 && cp -r %s/good %s/b2", g_dir);
    snprintf(p, sizeof p, "%s/b2/%s", g_dir, file0);
    struct stat sb;
    stat(p, &sb);
    DT_ASSERT_EQ(truncate(p, sb.st_size - 3), 0);
  }
  barrier();
  expect_load_fails(&dst, "b2", DT_ERR_CORRUPT, "truncated", file0);
  /* 3. an oversized header length */
  if (g_rank == 0) {
    run_cmd("rm -rf %s/b3 && cp -r %s/good %s/b3", g_dir);
    snprintf(p, sizeof p, "%s/b3/%s", g_dir, file0);
    int fd = open(p, O_RDWR);
    unsigned char big[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    DT_ASSERT_EQ(pwrite(fd, big, 8, 0), 8);
    close(fd);
  }
  barrier();
  expect_load_fails(&dst, "b3", DT_ERR_CORRUPT, "header length", file0);
  /* 4. a header that is not JSON */
  if (g_rank == 0) {
    run_cmd("rm -rf %s/b4 && cp -r %s/good %s/b4", g_dir);
    snprintf(p, sizeof p, "%s/b4/%s", g_dir, file0);
    int fd = open(p, O_RDWR);
    DT_ASSERT_EQ(pwrite(fd, "{{{{", 4, 8), 4);
    close(fd);
  }
  barrier();
  expect_load_fails(&dst, "b4", DT_ERR_CORRUPT, "not a JSON object", file0);
  /* 5. a bad index */
  if (g_rank == 0) {
    run_cmd("rm -rf %s/b5 && cp -r %s/good %s/b5", g_dir);
    snprintf(p, sizeof p, "%s/b5/index.json", g_dir);
    FILE* f = fopen(p, "w");
    fputs("{\"format\": \"dtensor-checkpoint\", \"format_version\": 1, \"tensors\": 3}", f);
    fclose(f);
  }
  barrier();
  expect_load_fails(&dst, "b5", DT_ERR_CORRUPT, "index.json", NULL);
  /* 6. a missing tensor, 7. a wrong shape, 8. a wrong dtype: another model's checkpoint */
  {
    dt_mesh_t m = make_mesh("world");
    dt_placement_t rep = {DT_REPLICATE, 0, 0};
    int64_t sh[2] = {8, 12}, sh2[2] = {8, 13};
    dt_tensor_t a, b;
    DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 2, sh, &rep, &a));
    DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 2, sh2, &rep, &b));
    DT_ASSERT_OK(dt_checkpoint_create(&ck));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "w.even", a));
    DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "other1", NULL));
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    expect_load_fails(&dst, "other1", DT_ERR_INVALID_ARG, "has no tensor 'w.uneven'", "index.json");
    DT_ASSERT_OK(dt_checkpoint_create(&ck));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "w.even", b));
    for (int k = 1; k < NSPEC; k++) DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, g_specs[k].name, src.t[k]));
    DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "other2", NULL));
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    expect_load_fails(&dst, "other2", DT_ERR_INVALID_ARG, "tensor 'w.even' was saved as f32 (8, 13)", NULL);
    dt_tensor_t c;
    DT_ASSERT_OK(dt_tensor_zeros(m, DT_BF16, 2, sh, &rep, &c));
    DT_ASSERT_OK(dt_checkpoint_create(&ck));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "w.even", c));
    for (int k = 1; k < NSPEC; k++) DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, g_specs[k].name, src.t[k]));
    DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "other3", NULL));
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    expect_load_fails(&dst, "other3", DT_ERR_INVALID_ARG, "saved as bf16", NULL);
    DT_ASSERT_OK(dt_tensor_destroy(a));
    DT_ASSERT_OK(dt_tensor_destroy(b));
    DT_ASSERT_OK(dt_tensor_destroy(c));
    DT_ASSERT_OK(dt_mesh_destroy(m));
  }
  /* 9. a checkpoint that does not exist */
  expect_load_fails(&dst, "nothing_here", DT_ERR_IO, "nothing_here", NULL);
  /* an index that is a FIFO: refused at once (an open of it would block) */
  char path[600];
  if (g_rank == 0) {
    snprintf(path, sizeof path, "%s/fifo", g_dir);
    DT_ASSERT_TRUE(mkdir(path, 0755) == 0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/fifo/index.json", g_dir);
    DT_ASSERT_TRUE(mkfifo(path, 0644) == 0, "mkfifo %s", path);
  }
  barrier();
  expect_load_fails(&dst, "fifo", DT_ERR_IO, "not a regular file", NULL);
  /* a damaged `latest` does not make a complete checkpoint replaceable: the save is refused
   * and the checkpoint stays whole */
  ck = list_of(&src);
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "kept", NULL));
  barrier();
  if (g_rank == 0) {
    snprintf(path, sizeof path, "%s/latest", g_dir);
    FILE* f = fopen(path, "w");
    DT_ASSERT_TRUE(f != NULL && fputs("garbage!\n", f) >= 0 && fclose(f) == 0, "writing %s", path);
  }
  barrier();
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, "kept", NULL), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  ck = list_of(&dst);
  DT_ASSERT_OK(dt_checkpoint_load(ck, g_dir, "kept"));
  check_set(&dst, 1, "the checkpoint kept beside a damaged latest");
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  /* a rank-local entry of the right shape on some ranks only, then a Partial one: every rank
   * fails the save (no rank left in the Partial tensor's redistribution) */
  if (g_world >= 2) {
    int w = g_world;
    dt_mesh_t m1;
    DT_ASSERT_OK(dt_mesh_create(1, &w, NULL, NULL, &m1));
    const dt_placement_t rep1[1] = {dt_replicate()}, sh1[1] = {dt_shard(0)},
                         par1[1] = {dt_partial(DT_REDUCE_SUM)};
    const int64_t s44[2] = {4, 4}, odd[2] = {4 * (int64_t)g_world - 1, 4};
    dt_tensor_t a, pt;
    DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 2, s44, rep1, 1.0, &a));
    DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 2, s44, par1, 1.0, &pt));
    DT_ASSERT_OK(dt_checkpoint_create(&ck));
    /* boxes of 4 rows on every rank but the last (3): a's 4 local rows fit only those */
    DT_ASSERT_OK(dt_checkpoint_add_tensor_as(ck, "a", a, 2, odd, sh1));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "p", pt));
    DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, "half_right", NULL), DT_ERR_INVALID_ARG);
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    DT_ASSERT_OK(dt_tensor_destroy(a));
    DT_ASSERT_OK(dt_tensor_destroy(pt));
    DT_ASSERT_OK(dt_mesh_destroy(m1));
  }
  /* a checkpoint saved before the name was refused, with a sharded tensor of that name (its
   * entries keyed "__metadata__:o0", valid): it still loads, and consolidate refuses it (the
   * output's header would hold the key twice) */
  if (g_world >= 2) {
    int w = g_world;
    dt_mesh_t m1;
    DT_ASSERT_OK(dt_mesh_create(1, &w, NULL, NULL, &m1));
    const dt_placement_t sh1[1] = {dt_shard(0)};
    const int64_t s8[1] = {8};
    dt_tensor_t a, b;
    DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 1, s8, sh1, 3.0, &a));
    DT_ASSERT_OK(dt_tensor_zeros(m1, DT_F32, 1, s8, sh1, &b));
    DT_ASSERT_OK(dt_checkpoint_create(&ck));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "ZZmetadataZZ", a));
    DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "oldmeta", NULL));
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    if (g_rank == 0) /* the same length: every offset stays */
      run_cmd("sed -i 's/ZZmetadataZZ/__metadata__/g' %s/oldmeta/*", g_dir);
    barrier();
    DT_ASSERT_OK(dt_checkpoint_create(&ck));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "__metadata__", b));
    DT_ASSERT_OK(dt_checkpoint_load(ck, g_dir, "oldmeta"));
    DT_ASSERT_OK(dt_checkpoint_destroy(ck));
    float got[8];
    DT_ASSERT_OK(dt_tensor_gather_full(b, got, sizeof got));
    for (int i = 0; i < 8; i++) DT_ASSERT_TRUE(got[i] == 3.0f, "got[%d] = %g", i, got[i]);
    char ckp[600], outp[600];
    snprintf(ckp, sizeof ckp, "%s/oldmeta", g_dir);
    snprintf(outp, sizeof outp, "%s/oldmeta_%d.safetensors", g_dir, g_rank);
    DT_ASSERT_OK(dt_checkpoint_verify(ckp, NULL));
    DT_ASSERT_STATUS(dt_checkpoint_consolidate(ckp, outp, 0, 0), DT_ERR_UNSUPPORTED);
    DT_ASSERT_TRUE(!exists(outp), "%s written", outp);
    DT_ASSERT_OK(dt_tensor_destroy(a));
    DT_ASSERT_OK(dt_tensor_destroy(b));
    DT_ASSERT_OK(dt_mesh_destroy(m1));
  }
  /* paths at the length limit: consolidate's OUT.tmp, cut short, was OUT itself (written in
   * place, and unlinked when the consolidation failed: an existing output lost); import's data
   * file, cut short, was written under another name and the checkpoint published without it */
  if (g_rank == 0) {
    char keep[600], lp[4200], good[600], stp[600], kept[8] = "";
    snprintf(keep, sizeof keep, "%s/keep.st", g_dir);
    snprintf(good, sizeof good, "%s/good", g_dir);
    snprintf(stp, sizeof stp, "%s/good.st", g_dir);
    FILE* f = fopen(keep, "w");
    DT_ASSERT_TRUE(f && fputs("keep", f) >= 0 && fclose(f) == 0, "writing %s", keep);
    long_path(lp, sizeof lp, g_dir, "keep.st", 4095);
    DT_ASSERT_STATUS(dt_checkpoint_consolidate(good, lp, 0, 0), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "too long") != NULL, "%s", dt_last_error());
    f = fopen(keep, "r");
    DT_ASSERT_TRUE(f && fgets(kept, sizeof kept, f) && strcmp(kept, "keep") == 0, "%s changed",
                   keep);
    fclose(f);
    /* the sharded form: OUT.index.json too long was found only after the shards were
     * written (over any model-*.safetensors beside OUT) */
    long_path(lp, sizeof lp, g_dir,
              "a_long_name_whose_index_path_is_longer_than_its_shards.safetensors", 4088);
    DT_ASSERT_STATUS(dt_checkpoint_consolidate(good, lp, 64, 0), DT_ERR_INVALID_ARG);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/model-00001-of-*.safetensors", g_dir);
    glob_t gl;
    DT_ASSERT_TRUE(glob(shard, 0, NULL, &gl) == GLOB_NOMATCH, "a refused consolidation wrote %s",
                   shard);
    globfree(&gl);
    DT_ASSERT_OK(dt_checkpoint_consolidate(good, stp, 0, 0));
    long_path(lp, sizeof lp, g_dir, ".", 4075 - strlen("/imp.tmp")); /* tmpdir: 4075 */
    DT_ASSERT_STATUS(dt_checkpoint_import(stp, lp, "imp", 0), DT_ERR_INVALID_ARG);
    snprintf(keep, sizeof keep, "%s/imp", g_dir);
    DT_ASSERT_TRUE(!exists(keep), "%s published", keep);
    snprintf(keep, sizeof keep, "%s/imp.tmp", g_dir);
    DT_ASSERT_TRUE(!exists(keep), "%s left", keep);
  }
  barrier();
  /* consolidate's sharded form over a previous output: a damaged box in a later shard fails it
   * with every previous shard as it was (each shard was renamed into place as soon as written:
   * shard 1 held the new values beside the old index and the old later shards) */
  {
    set_t s3 = make_set(1, 3); /* other values than good's */
    dt_checkpoint_t cv = list_of(&s3);
    DT_ASSERT_OK(dt_checkpoint_save(cv, g_dir, "v2", NULL));
    DT_ASSERT_OK(dt_checkpoint_destroy(cv));
    free_set(&s3);
  }
  if (g_rank == 0) {
    char good[600], out[600], pat[600], v2[600], v2st[600], seeds[600], s2[600], s2f[700];
    snprintf(good, sizeof good, "%s/good", g_dir);
    snprintf(out, sizeof out, "%s/hf/m.safetensors", g_dir);
    snprintf(pat, sizeof pat, "%s/hf/model-00001-of-*.safetensors", g_dir);
    snprintf(v2, sizeof v2, "%s/v2", g_dir);
    snprintf(v2st, sizeof v2st, "%s/v2.st", g_dir);
    snprintf(seeds, sizeof seeds, "%s/seeds", g_dir);
    snprintf(s2, sizeof s2, "%s/seeds/s2", g_dir);
    snprintf(s2f, sizeof s2f, "%s/seeds/s2/rank_00000.safetensors", g_dir);
    run_cmd("mkdir -p %s/hf", g_dir);
    DT_ASSERT_OK(dt_checkpoint_consolidate(good, out, 64, 0));
    glob_t gl;
    DT_ASSERT_TRUE(glob(pat, 0, NULL, &gl) == 0 && gl.gl_pathc == 1, "no %s", pat);
    size_t n0 = 0, n1 = 0;
    unsigned char* before = slurp(gl.gl_pathv[0], &n0);
    /* version 3 as a one-file seed whose last tensor (c.i32, in the last shard) is damaged */
    DT_ASSERT_OK(dt_checkpoint_consolidate(v2, v2st, 0, 0));
    DT_ASSERT_OK(dt_checkpoint_import(v2st, seeds, "s2", 0));
    int fd = open(s2f, O_RDWR);
    struct stat sb;
    unsigned char c;
    DT_ASSERT_TRUE(fd >= 0 && fstat(fd, &sb) == 0 && pread(fd, &c, 1, sb.st_size - 1) == 1,
                   "reading %s", s2f);
    c ^= 0x40;
    DT_ASSERT_EQ(pwrite(fd, &c, 1, sb.st_size - 1), 1);
    close(fd);
    DT_ASSERT_STATUS(dt_checkpoint_consolidate(s2, out, 64, 0), DT_ERR_CORRUPT);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "c.i32") != NULL, "%s", dt_last_error());
    unsigned char* after = slurp(gl.gl_pathv[0], &n1);
    DT_ASSERT_TRUE(n0 == n1 && memcmp(before, after, n0) == 0,
                   "a failed consolidation replaced %s", gl.gl_pathv[0]);
    free(before);
    free(after);
    globfree(&gl);
    snprintf(pat, sizeof pat, "%s/hf/*.tmp", g_dir);
    DT_ASSERT_TRUE(glob(pat, 0, NULL, &gl) == GLOB_NOMATCH, "a failed consolidation left %s", pat);
    globfree(&gl);
  }
  barrier();
  /* steps an index cannot hold exactly (above 2^53) or negative ones are refused */
  ck = list_of(&src);
  dt_checkpoint_save_opts_t big = dt_checkpoint_save_opts_default();
  big.step = ((int64_t)1 << 53) + 1;
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, NULL, &big), DT_ERR_INVALID_ARG);
  big.step = -1;
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, NULL, &big), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  /* bad arguments */
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  DT_ASSERT_STATUS(dt_checkpoint_add_tensor(ck, "a:b", src.t[0]), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_add_tensor(ck, "", src.t[0]), DT_ERR_INVALID_ARG);
  /* the safetensors header's own key: a whole-tensor box keyed so gave a header with the key
   * twice, a save that succeeded and a checkpoint no load (nor any safetensors reader) took */
  {
    dt_checkpoint_t mk;
    DT_ASSERT_OK(dt_checkpoint_create(&mk));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(mk, "__metadata__", src.t[0]));
    DT_ASSERT_STATUS(dt_checkpoint_save(mk, g_dir, "meta_key", NULL), DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "__metadata__") != NULL, "%s", dt_last_error());
    same_everywhere(dt_last_error());
    DT_ASSERT_OK(dt_checkpoint_destroy(mk));
    char mp[600];
    snprintf(mp, sizeof mp, "%s/meta_key", g_dir);
    DT_ASSERT_TRUE(!exists(mp), "%s saved", mp);
    snprintf(mp, sizeof mp, "%s/meta_key.tmp", g_dir);
    DT_ASSERT_TRUE(!exists(mp), "%s left", mp);
  }
  DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, "x", src.t[0]));
  DT_ASSERT_STATUS(dt_checkpoint_add_tensor(ck, "x", src.t[1]), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, "a/b", NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, "latest", NULL), DT_ERR_INVALID_ARG);
  /* an empty dir or path is refused: joined with "/NAME" it named the root directory's NAME
   * (a load read /latest; mkdir_p scanned past the end of "") */
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, "", "ok", NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dir is empty") != NULL, "%s", dt_last_error());
  DT_ASSERT_STATUS(dt_checkpoint_load(ck, "", NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_checkpoint_load(ck, "", "ok"), DT_ERR_INVALID_ARG);
  {
    char nm[64];
    DT_ASSERT_STATUS(dt_checkpoint_latest("", nm, sizeof nm), DT_ERR_INVALID_ARG);
    DT_ASSERT_STATUS(dt_checkpoint_info("", stdout), DT_ERR_INVALID_ARG);
    DT_ASSERT_STATUS(dt_checkpoint_verify("", NULL), DT_ERR_INVALID_ARG);
    DT_ASSERT_STATUS(dt_checkpoint_consolidate("", "/tmp/x.safetensors", 0, 0), DT_ERR_INVALID_ARG);
    DT_ASSERT_STATUS(dt_checkpoint_import("", g_dir, "imp", 0), DT_ERR_INVALID_ARG);
    DT_ASSERT_STATUS(dt_checkpoint_import("/tmp/x.safetensors", "", "imp", 0), DT_ERR_INVALID_ARG);
  }
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.block_nbytes = 100;
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, "ok", &o), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  DT_ASSERT_STATUS(dt_checkpoint_destroy(ck), DT_ERR_INVALID_USAGE);
  free_set(&dst);
  free_set(&src);
  barrier();
  if (g_rank == 0) printf("bad input: 10 damaged or mismatched checkpoints refused alike on every rank; a "
                          "damaged latest overwrites nothing\n");
}

/* Name and path lengths. A save also makes NAME.unpublished.tmp beside NAME, so a name of
 * 240-255 characters failed half way with a bare I/O error (from 252 on at NAME.tmp): it is
 * refused up front, on every rank with the same message naming the limit and the length, and
 * nothing is made. The longest name accepted saves, loads and replaces an unpublished save of
 * itself (through NAME.unpublished.tmp: exactly NAME_MAX); a longer one saved otherwise still
 * loads. A path past PATH_MAX - 1 is refused the same way. A refusal on one rank only (a name or
 * a dir that differs) is agreed before rank 0 touches the directory: no hang, nothing cleaned. */
static void test_name_limits(void) {
  set_t src = make_set(1, 1), src3 = make_set(1, 3), dst = make_set(1, 2);
  dt_checkpoint_t ck = list_of(&src);
  char name[320], p[4400], want[96];
  const size_t bad[3] = {255, 240, 300};
  for (int i = 0; i < 3; i++) {
    memset(name, 'n', bad[i]);
    name[bad[i]] = '\0';
    DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, name, NULL), DT_ERR_INVALID_ARG);
    const char* e = dt_last_error();
    snprintf(want, sizeof want, "is %zu characters long (at most %d", bad[i],
             DT_CHECKPOINT_SAVE_NAME_LEN);
    DT_ASSERT_TRUE(strstr(e, want) != NULL && strstr(e, "NAME_MAX") != NULL, "message: %s", e);
    same_everywhere(e);
    if (g_rank == 0) { /* as a save's: before the source is even opened */
      DT_ASSERT_STATUS(dt_checkpoint_import("/nonexistent.safetensors", g_dir, name, 0),
                       DT_ERR_INVALID_ARG);
      DT_ASSERT_TRUE(strstr(dt_last_error(), want) != NULL, "%s", dt_last_error());
    }
    name[NAME_MAX - 4] = '\0'; /* NAME.tmp, as long a name as a file can have */
    snprintf(p, sizeof p, "%s/%s.tmp", g_dir, name);
    DT_ASSERT_TRUE(!exists(p), "%s made", p);
  }
  /* the longest name: saves, loads, and replaces its own unpublished save */
  memset(name, 'L', DT_CHECKPOINT_SAVE_NAME_LEN);
  name[DT_CHECKPOINT_SAVE_NAME_LEN] = '\0';
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.step = 5;
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, name, &o));
  dt_checkpoint_t lk = list_of(&dst);
  DT_ASSERT_OK(dt_checkpoint_load(lk, g_dir, NULL)); /* `latest` names it */
  check_set(&dst, 1, "the longest name, loaded");
  o.step = 1;
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "lim_pub", &o)); /* latest: an older step */
  dt_checkpoint_t ck3 = list_of(&src3);
  o.step = 6;
  DT_ASSERT_OK(dt_checkpoint_save(ck3, g_dir, name, &o));
  DT_ASSERT_OK(dt_checkpoint_load(lk, g_dir, name));
  check_set(&dst, 3, "the longest name, replaced unpublished");
  snprintf(p, sizeof p, "%s/%s.unpublished.tmp", g_dir, name);
  DT_ASSERT_TRUE(!exists(p), "%s left", p);
  /* a longer name saved otherwise (renamed by hand) still loads */
  char longer[256];
  memset(longer, 'M', 250);
  longer[250] = '\0';
  if (g_rank == 0) {
    char from[600], to[900];
    snprintf(from, sizeof from, "%s/lim_pub", g_dir);
    snprintf(to, sizeof to, "%s/%s", g_dir, longer);
    DT_ASSERT_EQ(rename(from, to), 0);
  }
  barrier();
  DT_ASSERT_OK(dt_checkpoint_load(lk, g_dir, longer));
  check_set(&dst, 1, "a 250-character name, loaded");
  /* paths: DIR/NAME.tmp/rank_RRRRR.safetensors past PATH_MAX - 1 is refused, at it saves */
  const size_t longest = 1 + DT_CHECKPOINT_SAVE_NAME_LEN + strlen(".tmp/rank_00000.safetensors");
  char dir[4200];
  long_path(dir, sizeof dir, g_dir, "deep", 4096 - longest);
  DT_ASSERT_STATUS(dt_checkpoint_save(ck, dir, name, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "4096 characters") != NULL &&
                     strstr(dt_last_error(), "at most 4095 (PATH_MAX - 1)") != NULL,
                 "%s", dt_last_error());
  same_everywhere(dt_last_error());
  snprintf(p, sizeof p, "%s/deep", g_dir);
  DT_ASSERT_TRUE(!exists(p), "%s made", p);
  long_path(dir, sizeof dir, g_dir, "deep", 4095 - longest);
  DT_ASSERT_OK(dt_checkpoint_save(ck, dir, name, NULL));
  DT_ASSERT_OK(dt_checkpoint_load(lk, dir, name));
  check_set(&dst, 1, "the longest path, loaded");
  /* pruning there: the old checkpoint, renamed NAME.pruned.tmp, has files whose paths pass
   * PATH_MAX - 1 (named in messages only: the removal goes by descriptors); it is removed all
   * the same (it stayed, and every later save failed to clean it up) */
  char name2[DT_CHECKPOINT_SAVE_NAME_LEN + 1];
  memcpy(name2, name, sizeof name2);
  name2[0] = 'K';
  o = dt_checkpoint_save_opts_default();
  o.step = 1;
  o.keep_last = 1;
  DT_ASSERT_OK(dt_checkpoint_save(ck, dir, name2, &o));
  barrier();
  char gone[4600];
  snprintf(gone, sizeof gone, "%s/%s.pruned.tmp", dir, name);
  DT_ASSERT_TRUE(!exists(gone), "%s left by keep_last", gone);
  snprintf(gone, sizeof gone, "%s/%s", dir, name);
  DT_ASSERT_TRUE(!exists(gone), "%s kept past keep_last 1", gone);
  DT_ASSERT_OK(dt_checkpoint_load(lk, dir, NULL));
  check_set(&dst, 1, "the longest path's second save, loaded");
  /* one rank's bad argument fails every rank, before rank 0 cleans or makes anything: a
   * leftover *.tmp (which a save's clean-up removes) stays, and no dir is created */
  if (g_world >= 2) {
    char left[600], made[600];
    snprintf(left, sizeof left, "%s/zz_leftover.tmp", g_dir);
    snprintf(made, sizeof made, "%s/agreed", g_dir);
    if (g_rank == 0) {
      FILE* f = fopen(left, "w");
      DT_ASSERT_TRUE(f != NULL && fclose(f) == 0, "writing %s", left);
    }
    barrier();
    memset(name, 'n', 240);
    name[240] = '\0';
    const int last = g_rank == g_world - 1;
    DT_ASSERT_STATUS(dt_checkpoint_save(ck, g_dir, last ? name : "agreed", NULL),
                     DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "is 240 characters long") != NULL, "%s",
                   dt_last_error());
    same_everywhere(dt_last_error());
    DT_ASSERT_STATUS(dt_checkpoint_save(ck, last ? NULL : g_dir, "agreed", NULL),
                     DT_ERR_INVALID_ARG); /* the others hung in the agreement */
    same_everywhere(dt_last_error());
    barrier();
    DT_ASSERT_TRUE(exists(left), "%s removed by a refused save", left);
    DT_ASSERT_TRUE(!exists(made), "%s made by a refused save", made);
    barrier();
    if (g_rank == 0) DT_ASSERT_EQ(unlink(left), 0);
  }
  /* a planted leftover 70 directories deep: the clean-up stops at 64 levels (no longer
   * exhausting the stack or the open files on a deep tree), leaves it, and the save goes on */
  char deep[600];
  snprintf(deep, sizeof deep, "%s/zz_deep.tmp", g_dir);
  if (g_rank == 0) {
    DT_ASSERT_EQ(mkdir(deep, 0777), 0);
    int fd = open(deep, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < 70 && fd >= 0; i++) {
      DT_ASSERT_EQ(mkdirat(fd, "a", 0777), 0);
      int next = openat(fd, "a", O_RDONLY | O_DIRECTORY);
      close(fd);
      fd = next;
    }
    DT_ASSERT_TRUE(fd >= 0, "making %s", deep);
    close(fd);
  }
  barrier();
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "after_deep", NULL));
  DT_ASSERT_TRUE(g_rank != 0 || exists(deep), "%s: the clean-up went past its depth limit", deep);
  barrier();
  if (g_rank == 0) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", deep);
    DT_ASSERT_EQ(system(cmd), 0);
  }
  DT_ASSERT_OK(dt_checkpoint_destroy(lk));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck3));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  free_set(&dst);
  free_set(&src3);
  free_set(&src);
  barrier();
  if (g_rank == 0)
    printf("name limits: names of 240, 255 and 300 characters and a path of 4096 refused alike "
           "on every rank; %d characters and 4095 save and load\n", DT_CHECKPOINT_SAVE_NAME_LEN);
}

/* A file outside the checkpoint directory, its content as written. */
static void write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  DT_ASSERT_TRUE(f != NULL && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
}

static void expect_text(const char* path, const char* text) {
  char got[64] = "";
  FILE* f = fopen(path, "r");
  DT_ASSERT_TRUE(f != NULL, "opening %s", path);
  if (fgets(got, sizeof got, f) == NULL) got[0] = '\0';
  fclose(f);
  DT_ASSERT_TRUE(strcmp(got, text) == 0, "%s holds '%s', not '%s': written through a link", path,
                 got, text);
}

static int is_link(const char* p) {
  struct stat sb;
  return lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode);
}

/* Symbolic links at the temporary paths the writers create: never written through. One planted
 * while a save is pending (DIR/latest.tmp, DIR/NAME.tmp/index.json.tmp) fails the save on every
 * rank with DT_ERR_INVALID_USAGE naming it, nothing published, the link kept; one at
 * consolidate's OUT.tmp or at import's DIR/latest.tmp the same. Leftovers a save finds at its
 * start (DIR/NAME.tmp, DIR/latest.tmp) are its own and removed, the links themselves: their
 * targets stay as they were. Each target is a file outside the checkpoint directory. */
static void test_symlinks(void) {
  set_t src = make_set(1, 1), dst = make_set(1, 2);
  dt_checkpoint_t ck = list_of(&src);
  char victim[600], vdir[600], link[1200], p[1200];
  snprintf(victim, sizeof victim, "%s_victim", g_dir);
  snprintf(vdir, sizeof vdir, "%s_victim_dir", g_dir);
  if (g_rank == 0) {
    write_text(victim, "victim");
    DT_ASSERT_TRUE(mkdir(vdir, 0755) == 0 || errno == EEXIST, "mkdir %s", vdir);
    snprintf(p, sizeof p, "%s/inside", vdir);
    write_text(p, "inside");
  }
  barrier();
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "ln_base", NULL)); /* latest: ln_base */
  /* planted while the save is pending: refused at its commit */
  const char* planted[2] = {"latest.tmp", "ln_pend.tmp/index.json.tmp"};
  for (int i = 0; i < 2; i++) {
    dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
    o.async = DT_CHECKPOINT_ASYNC;
    DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "ln_pend", &o));
    snprintf(link, sizeof link, "%s/%s", g_dir, planted[i]);
    if (g_rank == 0) DT_ASSERT_TRUE(symlink(victim, link) == 0, "symlink %s", link);
    barrier();
    DT_ASSERT_STATUS(dt_checkpoint_wait(ck), DT_ERR_INVALID_USAGE);
    const char* e = dt_last_error();
    DT_ASSERT_TRUE(strstr(e, link) != NULL && strstr(e, "is a symbolic link") != NULL,
                   "message: %s", e);
    same_everywhere(e);
    barrier();
    if (g_rank == 0) expect_text(victim, "victim");
    snprintf(p, sizeof p, "%s/ln_pend", g_dir);
    DT_ASSERT_TRUE(!exists(p), "%s published", p);
    snprintf(p, sizeof p, "%s/ln_pend.tmp", g_dir);
    DT_ASSERT_TRUE(!exists(p), "%s left", p);
    char nm[64];
    DT_ASSERT_OK(dt_checkpoint_latest(g_dir, nm, sizeof nm));
    DT_ASSERT_TRUE(strcmp(nm, "ln_base") == 0, "latest names %s", nm);
    if (g_rank == 0 && i == 0) DT_ASSERT_TRUE(is_link(link), "%s removed", link);
    if (g_rank == 0 && i == 0) DT_ASSERT_EQ(unlink(link), 0);
    barrier();
  }
  /* leftovers at a save's start are its own: removed, never followed */
  if (g_rank == 0) {
    snprintf(link, sizeof link, "%s/ln_left.tmp", g_dir);
    DT_ASSERT_TRUE(symlink(vdir, link) == 0, "symlink %s", link);
    snprintf(link, sizeof link, "%s/latest.tmp", g_dir);
    DT_ASSERT_TRUE(symlink(victim, link) == 0, "symlink %s", link);
  }
  barrier();
  DT_ASSERT_OK(dt_checkpoint_save(ck, g_dir, "ln_left", NULL));
  dt_checkpoint_t lk = list_of(&dst);
  DT_ASSERT_OK(dt_checkpoint_load(lk, g_dir, NULL));
  check_set(&dst, 1, "saved past planted leftovers");
  barrier();
  if (g_rank == 0) {
    expect_text(victim, "victim");
    snprintf(p, sizeof p, "%s/inside", vdir);
    expect_text(p, "inside");
    snprintf(link, sizeof link, "%s/latest.tmp", g_dir);
    DT_ASSERT_TRUE(!is_link(link), "%s kept", link);
  }
  /* consolidate's OUT.tmp; import's DIR/latest.tmp (an import cleans nothing) */
  if (g_rank == 0) {
    char ckp[600], out[600], imp[600];
    snprintf(ckp, sizeof ckp, "%s/ln_left", g_dir);
    snprintf(out, sizeof out, "%s/ln_out.safetensors", g_dir);
    snprintf(link, sizeof link, "%s.tmp", out);
    DT_ASSERT_TRUE(symlink(victim, link) == 0, "symlink %s", link);
    DT_ASSERT_STATUS(dt_checkpoint_consolidate(ckp, out, 0, 0), DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), link) != NULL &&
                       strstr(dt_last_error(), "is a symbolic link") != NULL,
                   "message: %s", dt_last_error());
    expect_text(victim, "victim");
    DT_ASSERT_TRUE(!exists(out), "%s written", out);
    DT_ASSERT_TRUE(is_link(link), "%s removed", link);
    DT_ASSERT_EQ(unlink(link), 0);
    DT_ASSERT_OK(dt_checkpoint_consolidate(ckp, out, 0, 0));
    snprintf(imp, sizeof imp, "%s/ln_imp", g_dir);
    snprintf(link, sizeof link, "%s/latest.tmp", imp);
    DT_ASSERT_TRUE(mkdir(imp, 0755) == 0, "mkdir %s", imp);
    DT_ASSERT_TRUE(symlink(victim, link) == 0, "symlink %s", link);
    DT_ASSERT_STATUS(dt_checkpoint_import(out, imp, "seed", 0), DT_ERR_INVALID_USAGE);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "is a symbolic link") != NULL, "%s", dt_last_error());
    expect_text(victim, "victim");
    snprintf(p, sizeof p, "%s/seed", imp);
    DT_ASSERT_TRUE(!exists(p), "%s published", p);
    snprintf(p, sizeof p, "%s/seed.tmp", imp);
    DT_ASSERT_TRUE(!exists(p), "%s left", p);
    DT_ASSERT_EQ(unlink(link), 0);
    DT_ASSERT_OK(dt_checkpoint_import(out, imp, "seed", 0));
  }
  barrier();
  DT_ASSERT_OK(dt_checkpoint_destroy(lk));
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  free_set(&dst);
  free_set(&src);
  barrier();
  if (g_rank == 0) {
    run_cmd("rm -rf %s_victim %s_victim_dir", g_dir);
    printf("symlinks: links at latest.tmp, NAME.tmp/index.json.tmp, OUT.tmp and an import's "
           "latest.tmp refused, leftovers at a save's start removed; no target written\n");
  }
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  int pid = (int)getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (argc > 1) snprintf(g_dir, sizeof g_dir, "%s", argv[1]);
  else snprintf(g_dir, sizeof g_dir, "/tmp/dt_ckpt_test_%d", pid);
  test_reshard();
  test_large_staging();
  test_publish();
  test_rank_local();
  test_latest_agreed();
  test_two_objects();
  test_bad_input();
  test_name_limits();
  test_symlinks();
  barrier();
  if (g_rank == 0 && argc <= 1) run_cmd("rm -rf %s", g_dir);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

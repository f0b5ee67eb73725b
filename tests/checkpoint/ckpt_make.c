/* ckpt_make.c - the MPI half of tests/checkpoint/ckpt_tool.sh (dtensor-ckpt against a real
 * checkpoint).
 *
 *   ckpt_make DIR             saves a sharded checkpoint into DIR/ckpt (name step_00000042, step
 *                             42, published by DIR/ckpt/latest): tensors of f32, bf16 and i64 with
 *                             uneven shapes on a 2 x (world/2) mesh (a 1-D mesh at an odd world):
 *                             sharded on one or two mesh dims, nested, replicated, Partial(sum),
 *                             0-d and zero-size, a Linear module's parameters and its AdamW state;
 *                             rank 0 writes each tensor's dense bytes (dt_tensor_gather_full) to
 *                             DIR/ref/<name>.bin and the names, one a line, to DIR/ref/names
 *                             (optimizer state in DIR/ref/optim_names).
 *   ckpt_make DIR load CKDIR  loads the checkpoint CKDIR/latest names (dt_checkpoint_load) into the
 *                             same tensors laid out otherwise (a 1-D mesh of the world, other
 *                             shard dims; every element set to 77 first) and compares each with
 *                             DIR/ref/<name>.bin, byte for byte: the optimizer state is not
 *                             listed (an imported consolidation holds only the model).
 * Exits non-zero (MPI_Abort) on any difference or library error.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_test.h"
#include "dtensor/checkpoint.h"

static int g_world, g_rank;

typedef struct {
  const char* name;
  dt_dtype_t dtype;
  int ndim;
  int64_t shape[3];
  const char* save_pl; /* on the 2-D mesh; its first entry on a 1-D mesh */
  const char* load_pl; /* on the 1-D mesh of ckpt_make DIR load */
} spec_t;

static const spec_t g_specs[] = {
    {"embed", DT_BF16, 2, {11, 7}, "S(0),S(1)", "S(1)"},
    {"proj", DT_F32, 2, {13, 5}, "R,S(0)", "S(1)"},
    {"ids", DT_I64, 1, {9}, "S(0),S(0)", "R"},
    {"acc", DT_F32, 2, {6, 3}, "P(sum),S(1)", "S(0)"},
    {"cube", DT_F32, 3, {3, 5, 2}, "S(2),S(1)", "S(1)"},
    {"scale", DT_F32, 0, {0}, "R,R", "R"},
    {"empty", DT_F32, 2, {0, 4}, "S(1),R", "S(0)"},
};
#define NSPEC ((int)(sizeof g_specs / sizeof g_specs[0]))
/* the Linear module "model": weight (10, 6) and bias (10), f32, Replicate */
#define LIN_IN 6
#define LIN_OUT 10

static int64_t numel_of(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static size_t nbytes_of(dt_tensor_t t) {
  dt_dtype_t dt;
  int nd = 0;
  int64_t sh[DT_MAX_DIMS];
  size_t isz = 0;
  DT_ASSERT_OK(dt_tensor_dtype(t, &dt));
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, sh));
  DT_ASSERT_OK(dt_dtype_itemsize(dt, &isz));
  return (size_t)numel_of(nd, sh) * isz;
}

/* Placements `text` cut to the mesh's dims. */
static void placements(const char* text, int mesh_nd, dt_placement_t* pl) {
  dt_placement_t all[DT_MAX_MESH_DIMS];
  int n = 0;
  DT_ASSERT_OK(dt_placements_parse(text, all, DT_MAX_MESH_DIMS, &n));
  DT_ASSERT_TRUE(n >= mesh_nd, "placements '%s' for a %d-dim mesh", text, mesh_nd);
  for (int d = 0; d < mesh_nd; d++) pl[d] = all[d];
}

static void ref_path(char* out, size_t cap, const char* dir, const char* name) {
  int n = snprintf(out, cap, "%s/ref/%s.bin", dir, name);
  DT_ASSERT_TRUE(n > 0 && (size_t)n < cap, "path too long under %s", dir);
}

/* Rank 0 writes t's dense bytes to DIR/ref/<name>.bin and appends name to DIR/ref/<list>. */
static void write_ref(const char* dir, const char* name, dt_tensor_t t, const char* list) {
  size_t nb = nbytes_of(t);
  unsigned char* buf = malloc(nb + 1);
  DT_ASSERT_TRUE(buf != NULL, "out of memory");
  DT_ASSERT_OK(dt_tensor_gather_full(t, buf, nb + 1)); /* collective */
  if (g_rank == 0) {
    char p[1024];
    ref_path(p, sizeof p, dir, name);
    FILE* f = fopen(p, "wb");
    DT_ASSERT_TRUE(f != NULL, "cannot create %s", p);
    DT_ASSERT_TRUE(fwrite(buf, 1, nb, f) == nb && fclose(f) == 0, "cannot write %s", p);
    snprintf(p, sizeof p, "%s/ref/%s", dir, list);
    f = fopen(p, "a");
    DT_ASSERT_TRUE(f != NULL && fprintf(f, "%s\n", name) > 0 && fclose(f) == 0,
                   "cannot append to %s", p);
  }
  free(buf);
}

/* t's dense bytes against DIR/ref/<name>.bin. */
static void check_ref(const char* dir, const char* name, dt_tensor_t t) {
  size_t nb = nbytes_of(t);
  unsigned char* got = malloc(nb + 1);
  unsigned char* want = malloc(nb + 1);
  DT_ASSERT_TRUE(got != NULL && want != NULL, "out of memory");
  DT_ASSERT_OK(dt_tensor_gather_full(t, got, nb + 1));
  char p[1024];
  ref_path(p, sizeof p, dir, name);
  FILE* f = fopen(p, "rb");
  DT_ASSERT_TRUE(f != NULL, "cannot open %s", p);
  size_t n = fread(want, 1, nb + 1, f);
  fclose(f);
  DT_ASSERT_TRUE(n == nb, "%s holds %zu bytes, tensor '%s' has %zu", p, n, name, nb);
  DT_ASSERT_TRUE(memcmp(got, want, nb) == 0, "tensor '%s' differs from %s after the load", name,
                 p);
  free(got);
  free(want);
}

static dt_mesh_t save_mesh(int* nd) {
  int shape[2] = {2, g_world / 2};
  *nd = g_world % 2 == 0 ? 2 : 1;
  if (*nd == 1) shape[0] = g_world;
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(*nd, shape, NULL, NULL, &m));
  return m;
}

static int save(const char* dir) {
  int mnd = 0;
  dt_mesh_t mesh = save_mesh(&mnd);
  if (g_rank == 0) {
    char p[1024];
    snprintf(p, sizeof p, "%s/ref", dir);
    DT_ASSERT_TRUE(mkdir(dir, 0777) == 0 || access(dir, W_OK) == 0, "cannot create %s", dir);
    DT_ASSERT_TRUE(mkdir(p, 0777) == 0, "cannot create %s (left from an earlier run?)", p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  dt_tensor_t t[NSPEC];
  for (int k = 0; k < NSPEC; k++) {
    const spec_t* s = &g_specs[k];
    dt_placement_t pl[DT_MAX_MESH_DIMS], rep[DT_MAX_MESH_DIMS];
    placements(s->save_pl, mnd, pl);
    placements("R,R", mnd, rep);
    dt_tensor_t full;
    if (s->dtype == DT_I64) /* large values: every byte of the i64 matters */
      DT_ASSERT_OK(dt_tensor_arange(mesh, s->dtype, s->ndim, s->shape, rep, -4e12, 1000000007.0,
                                    &full));
    else
      DT_ASSERT_OK(dt_tensor_randn(mesh, s->dtype, s->ndim, s->shape, rep, 100 + (uint64_t)k,
                                   &full));
    DT_ASSERT_OK(dt_tensor_redistribute(full, pl, &t[k]));
    DT_ASSERT_OK(dt_tensor_destroy(full));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, s->name, t[k]));
    write_ref(dir, s->name, t[k], "names");
  }
  /* a module and its optimizer */
  dt_module_t lin;
  DT_ASSERT_OK(dt_linear_create(mesh, "lin", LIN_IN, LIN_OUT, 1, 7, &lin));
  DT_ASSERT_OK(dt_checkpoint_add_module(ck, "model", lin));
  dt_var_t* params = NULL;
  int np = 0;
  DT_ASSERT_OK(dt_module_params(lin, &params, &np));
  dt_adamw_config_t cfg = dt_adamw_config_default();
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&cfg, np, params, &opt));
  DT_ASSERT_OK(dt_checkpoint_add_adamw(ck, NULL, opt, lin));
  for (int i = 0; i < np; i++) {
    char pn[128], full[160];
    dt_var_t v;
    DT_ASSERT_OK(dt_module_param_at(lin, i, pn, sizeof pn, &v));
    snprintf(full, sizeof full, "model.%s", pn);
    write_ref(dir, full, dt_var_value(v), "names");
    static const char* const suffix[3] = {"exp_avg", "exp_avg_sq", "step"};
    dt_tensor_t st[3];
    DT_ASSERT_OK(dt_adamw_state(opt, i, &st[0], &st[1], &st[2]));
    for (int j = 0; j < 3; j++) {
      snprintf(full, sizeof full, "optim.%s.%s", pn, suffix[j]);
      write_ref(dir, full, st[j], "optim_names");
    }
  }
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 42));
  DT_ASSERT_OK(dt_checkpoint_set_f64(ck, "lr", 0.25));
  char ckdir[1024];
  snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.step = 42;
  o.block_nbytes = 4096;
  DT_ASSERT_OK(dt_checkpoint_save(ck, ckdir, NULL, &o));
  dt_checkpoint_stats_t stats;
  DT_ASSERT_OK(dt_checkpoint_stats(ck, &stats));
  if (g_rank == 0)
    printf("ckpt_make: saved %s/%s from %d ranks (%lld tensor bytes)\n", ckdir, stats.name,
           g_world, (long long)stats.nbytes);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_module_destroy(lin));
  for (int k = 0; k < NSPEC; k++) DT_ASSERT_OK(dt_tensor_destroy(t[k]));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  return 0;
}

static int load(const char* dir, const char* path) {
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  dt_tensor_t t[NSPEC + 2];
  const char* names[NSPEC + 2];
  for (int k = 0; k < NSPEC; k++) {
    const spec_t* s = &g_specs[k];
    dt_placement_t pl[1];
    placements(s->load_pl, 1, pl);
    DT_ASSERT_OK(dt_tensor_full_value(mesh, s->dtype, s->ndim, s->shape, pl, 77, &t[k]));
    names[k] = s->name;
  }
  /* the module's parameters as plain tensors, sharded */
  const int64_t wsh[2] = {LIN_OUT, LIN_IN}, bsh[1] = {LIN_OUT};
  dt_placement_t s0 = dt_shard(0);
  DT_ASSERT_OK(dt_tensor_full_value(mesh, DT_F32, 2, wsh, &s0, 77, &t[NSPEC]));
  DT_ASSERT_OK(dt_tensor_full_value(mesh, DT_F32, 1, bsh, &s0, 77, &t[NSPEC + 1]));
  names[NSPEC] = "model.weight";
  names[NSPEC + 1] = "model.bias";
  for (int k = 0; k < NSPEC + 2; k++) DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, names[k], t[k]));
  DT_ASSERT_OK(dt_checkpoint_load(ck, path, NULL));
  for (int k = 0; k < NSPEC + 2; k++) check_ref(dir, names[k], t[k]);
  if (g_rank == 0)
    printf("ckpt_make: loaded %s at %d ranks: %d tensors equal %s/ref byte for byte\n", path,
           g_world, NSPEC + 2, dir);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  for (int k = 0; k < NSPEC + 2; k++) DT_ASSERT_OK(dt_tensor_destroy(t[k]));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  return 0;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  int rc = 2;
  if (argc == 2) rc = save(argv[1]);
  else if (argc == 4 && strcmp(argv[2], "load") == 0) rc = load(argv[1], argv[3]);
  else if (g_rank == 0) fprintf(stderr, "usage: ckpt_make DIR | ckpt_make DIR load PATH\n");
  DT_ASSERT_OK(dt_finalize());
  return rc;
}

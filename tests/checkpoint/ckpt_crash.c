/* ckpt_crash.c - the program tests/checkpoint/crash.sh kills: a trainer that saves a checkpoint
 * at every step, and the check that runs after each kill.
 *
 *   mpirun -np 2 ckpt_crash save DIR PIDDIR [STEPS]
 *       Resumes from DIR/latest when there is one (loads it and checks its values), else starts
 *       at step 0. Then, for each step s (forever, or STEPS steps): sets the tensors to step s's
 *       values, sets the named value "step" = s and saves DIR/step_<s> (keep_last 2; even steps
 *       sync, odd steps async, the copy made in the save or (s % 4 == 3) deferred: right after
 *       the async save returns (and dt_checkpoint_wait_staged, when deferred), the tensors
 *       already take step s+1's values while the files are written, then dt_checkpoint_wait). Prints
 *       "saved step S" once S is published, and "ready" after the first one. After each sync
 *       save (nothing pending) rank 0 checks that DIR holds no *.tmp entry: leftovers of
 *       killed saves are removed by the next successful one. Writes its pid to PIDDIR/pid.<rank>.
 *   mpirun -np 1|2 ckpt_crash check DIR
 *       Loads DIR/latest into tensors of other placements (np 2: each tensor resharded; np 1:
 *       whole), checks that "step" names the checkpoint (step_<step>) and that every value is
 *       exactly step's, then dt_checkpoint_verify on rank 0. Prints "check ok step S".
 *
 * Tensors (about 5 MiB): w0 f32 (1024, 1024), w1 f32 (300, 700), b f32 (4096), ids i64 (1000, 3);
 * saved Shard(0), Shard(1), Replicate, Shard(0) on a 1-D mesh of all ranks. Step s's values:
 * dt_tensor_rand(seed 16 s + k + 1) for the f32 tensors (a function of the global index, so the
 * same under every layout), arange from 1000003 s for ids. Any failure prints "FAIL: ..." and
 * exits non-zero.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_test.h"
#include "dtensor/checkpoint.h"

enum { NT = 4 };

static const char* const kNames[NT] = {"w0", "w1", "b", "ids"};
static const int kNdim[NT] = {2, 2, 1, 2};
static const int64_t kShape[NT][2] = {{1024, 1024}, {300, 700}, {4096, 0}, {1000, 3}};
static int g_rank, g_world;

#define FAIL(...)                                                                     \
  do {                                                                                \
    printf("FAIL: [rank %d] ", g_rank);                                               \
    printf(__VA_ARGS__);                                                              \
    printf("\n");                                                                     \
    dt_test_die();                                                                    \
  } while (0)

static dt_placement_t place(int k, int save) {
  /* save: S(0), S(1), R, S(0); check: S(1), S(0), S(0), R */
  static const int kSave[NT] = {0, 1, -1, 0}, kCheck[NT] = {1, 0, 0, -1};
  int d = save ? kSave[k] : kCheck[k];
  return d < 0 ? dt_replicate() : dt_shard(d);
}

/* step s's values of tensor k in the layout of `like` */
static dt_tensor_t expected(dt_mesh_t mesh, int k, int64_t s, dt_placement_t pl) {
  dt_tensor_t t;
  if (k == 3)
    DT_ASSERT_OK(
        dt_tensor_arange(mesh, DT_I64, kNdim[k], kShape[k], &pl, (double)(1000003 * s), 1.0, &t));
  else
    DT_ASSERT_OK(dt_tensor_rand(mesh, DT_F32, kNdim[k], kShape[k], &pl, (uint64_t)(16 * s + k + 1),
                                &t));
  return t;
}

static int64_t local_nbytes(dt_tensor_t t) {
  int64_t n = 0;
  dt_dtype_t dt;
  size_t isz = 0;
  DT_ASSERT_OK(dt_tensor_local_numel(t, &n));
  DT_ASSERT_OK(dt_tensor_dtype(t, &dt));
  DT_ASSERT_OK(dt_dtype_itemsize(dt, &isz));
  return n * (int64_t)isz;
}

/* t's local values := step s's */
static void set_step(dt_mesh_t mesh, dt_tensor_t* t, int64_t s) {
  for (int k = 0; k < NT; k++) {
    dt_tensor_t e = expected(mesh, k, s, place(k, 1));
    int64_t n = 0, nb = local_nbytes(e);
    DT_ASSERT_OK(dt_tensor_local_numel(e, &n));
    void* buf = malloc((size_t)nb + 8);
    if (buf == NULL) FAIL("out of memory");
    DT_ASSERT_OK(dt_tensor_read_local(e, 0, n, buf));
    DT_ASSERT_OK(dt_tensor_write_local(t[k], 0, n, buf));
    free(buf);
    DT_ASSERT_OK(dt_tensor_destroy(e));
  }
}

/* every rank: t's local values are exactly step s's; returns the number of tensors that differ */
static int check_step(dt_mesh_t mesh, dt_tensor_t* t, int64_t s, int save_layout) {
  int bad = 0, any = 0;
  for (int k = 0; k < NT; k++) {
    dt_tensor_t e = expected(mesh, k, s, place(k, save_layout));
    int64_t n = 0, nb = local_nbytes(e);
    DT_ASSERT_OK(dt_tensor_local_numel(e, &n));
    unsigned char* a = malloc((size_t)nb + 8);
    unsigned char* b = malloc((size_t)nb + 8);
    if (a == NULL || b == NULL) FAIL("out of memory");
    DT_ASSERT_OK(dt_tensor_read_local(e, 0, n, a));
    DT_ASSERT_OK(dt_tensor_read_local(t[k], 0, n, b));
    if (memcmp(a, b, (size_t)nb) != 0) {
      printf("[rank %d] tensor '%s' differs from step %" PRId64 "'s values\n", g_rank, kNames[k],
             s);
      bad++;
    }
    free(a);
    free(b);
    DT_ASSERT_OK(dt_tensor_destroy(e));
  }
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return any;
}

static dt_checkpoint_t make(dt_mesh_t mesh, dt_tensor_t* t, int save_layout) {
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  for (int k = 0; k < NT; k++) {
    dt_placement_t pl = place(k, save_layout);
    DT_ASSERT_OK(dt_tensor_full_value(mesh, k == 3 ? DT_I64 : DT_F32, kNdim[k], kShape[k], &pl,
                                      -1.0, &t[k]));
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, kNames[k], t[k]));
  }
  return ck;
}

/* the step of the checkpoint loaded into ck; checks the name `latest` gives */
static int64_t loaded_step(dt_checkpoint_t ck, const char* dir) {
  int64_t s = -1;
  char name[DT_CHECKPOINT_NAME_MAX], want[64];
  DT_ASSERT_OK(dt_checkpoint_get_i64(ck, "step", &s));
  DT_ASSERT_OK(dt_checkpoint_latest(dir, name, sizeof name));
  snprintf(want, sizeof want, "step_%08" PRId64, s);
  if (strcmp(name, want) != 0) FAIL("latest is %s but its named value step is %" PRId64, name, s);
  return s;
}

static void no_tmp_left(const char* dir, int64_t step) {
  DIR* d = opendir(dir);
  if (d == NULL) FAIL("opening %s", dir);
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n > 4 && strcmp(e->d_name + n - 4, ".tmp") == 0)
      FAIL("%s/%s is left after the successful save of step %" PRId64, dir, e->d_name, step);
  }
  closedir(d);
}

static int run_save(const char* dir, const char* piddir, int64_t steps) {
  char p[4096];
  snprintf(p, sizeof p, "%s/pid.%d", piddir, g_rank);
  FILE* f = fopen(p, "w");
  if (f == NULL) FAIL("writing %s", p);
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  dt_tensor_t t[NT];
  dt_checkpoint_t ck = make(mesh, t, 1);
  int64_t s0 = 0;
  char name[DT_CHECKPOINT_NAME_MAX];
  snprintf(p, sizeof p, "%s/latest", dir);
  struct stat sb;
  int have = stat(p, &sb) == 0, all = 0;
  MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) { /* resume */
    DT_ASSERT_OK(dt_checkpoint_load(ck, dir, NULL));
    int64_t s = loaded_step(ck, dir);
    if (check_step(mesh, t, s, 1)) FAIL("resumed from step %" PRId64 ": wrong values", s);
    s0 = s + 1;
    if (g_rank == 0) printf("resumed step %" PRId64 "\n", s);
  }
  /* a save killed between publishing its directory and replacing `latest` leaves a complete
   * step_<s0> that latest does not name: the save of step s0 must replace it */
  snprintf(p, sizeof p, "%s/step_%08" PRId64, dir, s0);
  int orphan = stat(p, &sb) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &orphan, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (orphan && g_rank == 0)
    printf("unpublished step %" PRId64 ": complete, not named by latest; the save replaces it\n",
           s0);
  fflush(stdout);
  int64_t values_of = -1;
  for (int64_t s = s0; steps < 0 || s < s0 + steps; s++) {
    if (values_of != s) set_step(mesh, t, s);
    values_of = s;
    DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", s));
    dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
    o.step = s;
    o.keep_last = 2;
    o.async = s % 2 == 0 ? DT_CHECKPOINT_SYNC
              : s % 4 == 1 ? DT_CHECKPOINT_ASYNC : DT_CHECKPOINT_ASYNC_DEFER_COPY;
    DT_ASSERT_OK(dt_checkpoint_save(ck, dir, NULL, &o));
    if (o.async == DT_CHECKPOINT_ASYNC_DEFER_COPY) DT_ASSERT_OK(dt_checkpoint_wait_staged(ck));
    if (o.async) { /* training goes on: the next step's values (tensors and the named value,
                    * which the pending save must not take) while the files are written */
      set_step(mesh, t, s + 1);
      values_of = s + 1;
      DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", s + 1));
      DT_ASSERT_OK(dt_checkpoint_wait(ck));
    } else if (g_rank == 0) {
      no_tmp_left(dir, s);
    }
    dt_checkpoint_stats_t st;
    DT_ASSERT_OK(dt_checkpoint_stats(ck, &st));
    snprintf(name, sizeof name, "step_%08" PRId64, s);
    if (st.pending || strcmp(st.name, name) != 0)
      FAIL("stats: pending %d, name %s", st.pending, st.name);
    if (g_rank == 0) {
      printf("saved step %" PRId64 "\n", s);
      if (s == s0) printf("ready\n");
      fflush(stdout);
    }
  }
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  for (int k = 0; k < NT; k++) DT_ASSERT_OK(dt_tensor_destroy(t[k]));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  return 0;
}

static int run_check(const char* dir) {
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  dt_tensor_t t[NT];
  dt_checkpoint_t ck = make(mesh, t, 0);
  DT_ASSERT_OK(dt_checkpoint_load(ck, dir, NULL));
  int64_t s = loaded_step(ck, dir);
  int bad = check_step(mesh, t, s, 0);
  if (bad) FAIL("%d tensors of %s/step_%08" PRId64 " differ from step %" PRId64 "'s values", bad,
                dir, s, s);
  if (g_rank == 0) {
    dt_status_t st = dt_checkpoint_verify(dir, NULL);
    if (st != DT_SUCCESS)
      FAIL("dt_checkpoint_verify(%s): %s: %s", dir, dt_status_name(st), dt_last_error());
    printf("check ok step %" PRId64 "\n", s);
  }
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  for (int k = 0; k < NT; k++) DT_ASSERT_OK(dt_tensor_destroy(t[k]));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  return 0;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  int rc = 2;
  if (argc >= 4 && strcmp(argv[1], "save") == 0)
    rc = run_save(argv[2], argv[3], argc >= 5 ? atoll(argv[4]) : -1);
  else if (argc == 3 && strcmp(argv[1], "check") == 0)
    rc = run_check(argv[2]);
  else if (g_rank == 0)
    fprintf(stderr, "usage: %s save DIR PIDDIR [STEPS] | check DIR\n", argv[0]);
  fflush(stdout);
  DT_ASSERT_OK(dt_finalize());
  return rc;
}

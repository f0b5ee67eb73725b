/* test_io_faults.c - checkpoints when the file system fails: every I/O call of a save or a load may
 * fail, on one rank (np 1, 2).
 *
 * Linked with -Wl,--wrap for open, write, pread, fsync, rename and mkdir (dtensor's checkpoint
 * code calls nothing else that can lose data), the test counts the calls each rank makes in a
 * save (sync, async, and async with the copy deferred to the writer thread) and in a load, then
 * repeats each with call k of rank r failing (ENOSPC for a write, EIO otherwise), for every r and
 * k. Every rank must return the same status: an error with a message naming what failed, or, if
 * the failure was absorbed, success with a checkpoint that loads back bit for bit. A failed save
 * publishes nothing (no NAME, `latest` still names the last good checkpoint) and leaves no
 * NAME.tmp behind; a failed load is reported on every rank (no rank goes on with half-loaded
 * tensors unaware), and a clean load afterwards restores every value. The directory is argv[1]
 * (default /tmp/dt_io_faults_<pid of rank 0>). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_test.h"
#include "dtensor/checkpoint.h"
#include "dtensor/ops.h"

static long g_calls = 0, g_fail_at = -1;
/* the k-th call fails (any thread: the async writer's calls count too) */
static int fail_now(void) {
  return __atomic_add_fetch(&g_calls, 1, __ATOMIC_SEQ_CST) == __atomic_load_n(&g_fail_at,
                                                                              __ATOMIC_SEQ_CST);
}
int __real_open(const char* p, int flags, ...);
ssize_t __real_write(int fd, const void* b, size_t n);
ssize_t __real_pread(int fd, void* b, size_t n, off_t o);
int __real_fsync(int fd);
int __real_rename(const char* a, const char* b);
int __real_mkdir(const char* p, mode_t m);
int __wrap_open(const char* p, int flags, ...) {
  mode_t mode = 0;
  if (flags & O_CREAT) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  if (fail_now()) return errno = EACCES, -1;
  return __real_open(p, flags, mode);
}
ssize_t __wrap_write(int fd, const void* b, size_t n) {
  if (fail_now()) return errno = ENOSPC, -1;
  return __real_write(fd, b, n);
}
ssize_t __wrap_pread(int fd, void* b, size_t n, off_t o) {
  if (fail_now()) return errno = EIO, -1;
  return __real_pread(fd, b, n, o);
}
int __wrap_fsync(int fd) {
  if (fail_now()) return errno = EIO, -1;
  return __real_fsync(fd);
}
int __wrap_rename(const char* a, const char* b) {
  if (fail_now()) return errno = EIO, -1;
  return __real_rename(a, b);
}
int __wrap_mkdir(const char* p, mode_t m) {
  if (fail_now()) return errno = EACCES, -1;
  return __real_mkdir(p, m);
}

static int g_world, g_rank;
static char g_dir[512];
static dt_mesh_t g_mesh;

#define NT 3
static dt_tensor_t g_t[NT];   /* saved */
static dt_tensor_t g_dst[NT]; /* loaded into (other placements) */
static float g_want[NT][64];
static int64_t g_numel[NT];

static void make_tensors(void) {
  const int64_t rows = 3 * (int64_t)g_world + 1; /* uneven */
  const int64_t shapes[NT][2] = {{rows, 4}, {5, 2}, {2, rows}};
  const dt_dtype_t dts[NT] = {DT_F32, DT_BF16, DT_F32};
  const dt_placement_t src[NT] = {dt_shard(0), dt_replicate(), dt_shard(1)};
  const dt_placement_t dst[NT] = {dt_replicate(), dt_shard(0), dt_shard(0)};
  for (int k = 0; k < NT; k++) {
    g_numel[k] = shapes[k][0] * shapes[k][1];
    DT_ASSERT_TRUE(g_numel[k] <= 64, "tensor %d too big", k);
    uint16_t h[64];
    for (int64_t i = 0; i < g_numel[k]; i++) {
      g_want[k][i] = (float)((i * 7 + k * 3) % 13 - 6) / 4.0f;
      uint32_t u;
      memcpy(&u, &g_want[k][i], sizeof u);
      h[i] = (uint16_t)(u >> 16); /* exact in bf16 */
    }
    const void* data = dts[k] == DT_BF16 ? (const void*)h : (const void*)g_want[k];
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, dts[k], 2, shapes[k], &src[k], data, &g_t[k]));
    DT_ASSERT_OK(dt_tensor_zeros(g_mesh, dts[k], 2, shapes[k], &dst[k], &g_dst[k]));
  }
}

/* Every loaded value equals the saved one. */
static void check_loaded(const char* what) {
  for (int k = 0; k < NT; k++) {
    dt_tensor_t f;
    float got[64];
    DT_ASSERT_OK(dt_cast(g_dst[k], DT_F32, &f));
    DT_ASSERT_OK(dt_tensor_gather_full(f, got, sizeof(float) * (size_t)g_numel[k]));
    DT_ASSERT_TRUE(memcmp(got, g_want[k], sizeof(float) * (size_t)g_numel[k]) == 0,
                   "%s: tensor %d differs", what, k);
    DT_ASSERT_OK(dt_tensor_destroy(f));
  }
}

static void zero_dst(void) {
  for (int k = 0; k < NT; k++) {
    int64_t off = 0, n;
    DT_ASSERT_OK(dt_tensor_local_numel(g_dst[k], &n));
    DT_ASSERT_OK(dt_tensor_fill_local(g_dst[k], 1, &off, &n, 0.0));
  }
}

static dt_checkpoint_t list(void) {
  dt_checkpoint_t ck;
  DT_ASSERT_OK(dt_checkpoint_create(&ck));
  return ck;
}
static dt_checkpoint_t save_list(void) {
  dt_checkpoint_t ck = list();
  char nm[16];
  for (int k = 0; k < NT; k++) {
    snprintf(nm, sizeof nm, "t%d", k);
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, nm, g_t[k]));
  }
  DT_ASSERT_OK(dt_checkpoint_set_i64(ck, "step", 7));
  return ck;
}
static dt_checkpoint_t load_list(void) {
  dt_checkpoint_t ck = list();
  char nm[16];
  for (int k = 0; k < NT; k++) {
    snprintf(nm, sizeof nm, "t%d", k);
    DT_ASSERT_OK(dt_checkpoint_add_tensor(ck, nm, g_dst[k]));
  }
  return ck;
}

/* The message names its entry point once ("dt_x: text", not "dt_x: dt_x: text"). */
static int named_once(const char* msg) {
  const char* colon = strstr(msg, ": ");
  if (strncmp(msg, "dt_", 3) != 0 || colon == NULL) return 1;
  const size_t k = (size_t)(colon - msg) + 2;
  return strncmp(msg + k, msg, k) != 0;
}

/* The same status on every rank (its value). */
static dt_status_t agreed(dt_status_t st, const char* what) {
  int v = (int)st, lo, hi;
  MPI_Allreduce(&v, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&v, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  DT_ASSERT_TRUE(lo == hi, "%s: ranks disagree (%s here: %s)", what, dt_status_name(st),
                 st == DT_SUCCESS ? "" : dt_last_error());
  if (st != DT_SUCCESS)
    DT_ASSERT_TRUE(strlen(dt_last_error()) > 0 && named_once(dt_last_error()),
                   "%s: %s with no message, or its entry named twice: '%s'", what,
                   dt_status_name(st), dt_last_error());
  return st;
}

static int exists(const char* name) {
  char p[1024];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  return stat(p, &sb) == 0;
}

/* The name `latest` holds ("" when none). */
static void latest(char* out, size_t cap) {
  out[0] = '\0';
  if (dt_checkpoint_latest(g_dir, out, cap) != DT_SUCCESS) {
    out[0] = '\0';
    dt_clear_error();
  }
}

/* Saves name with `mode`, call `fail_at` of rank `victim` failing (-1: none); returns the agreed
 * status. */
static dt_status_t save(const char* name, int mode, int victim, long fail_at, long* calls) {
  dt_checkpoint_t ck = save_list();
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.step = 7;
  o.async = mode;
  MPI_Barrier(MPI_COMM_WORLD);
  __atomic_store_n(&g_calls, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_fail_at, g_rank == victim ? fail_at : -1, __ATOMIC_SEQ_CST);
  dt_clear_error();
  dt_status_t st = dt_checkpoint_save(ck, g_dir, name, &o);
  if (st == DT_SUCCESS) st = dt_checkpoint_wait(ck);
  __atomic_store_n(&g_fail_at, -1, __ATOMIC_SEQ_CST);
  if (calls) *calls = __atomic_load_n(&g_calls, __ATOMIC_SEQ_CST);
  char what[128];
  snprintf(what, sizeof what, "save %s (mode %d, rank %d's I/O call %ld failing)", name, mode,
           victim, fail_at);
  st = agreed(st, what);
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  return st;
}

/* Loads name, call `fail_at` of rank `victim` failing; returns the agreed status. */
static dt_status_t load(const char* name, int victim, long fail_at, long* calls) {
  dt_checkpoint_t ck = load_list();
  MPI_Barrier(MPI_COMM_WORLD);
  __atomic_store_n(&g_calls, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_fail_at, g_rank == victim ? fail_at : -1, __ATOMIC_SEQ_CST);
  dt_clear_error();
  dt_status_t st = dt_checkpoint_load(ck, g_dir, name);
  __atomic_store_n(&g_fail_at, -1, __ATOMIC_SEQ_CST);
  if (calls) *calls = __atomic_load_n(&g_calls, __ATOMIC_SEQ_CST);
  char what[128];
  snprintf(what, sizeof what, "load %s (rank %d's I/O call %ld failing)", name, victim, fail_at);
  st = agreed(st, what);
  if (st == DT_SUCCESS) {
    int64_t step = 0;
    DT_ASSERT_OK(dt_checkpoint_get_i64(ck, "step", &step));
    DT_ASSERT_EQ(step, 7);
  }
  DT_ASSERT_OK(dt_checkpoint_destroy(ck));
  return st;
}

/* The calls rank `victim` made. */
static long calls_of(long c, int victim) {
  MPI_Bcast(&c, 1, MPI_LONG, victim, MPI_COMM_WORLD);
  return c;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &g_mesh));
  if (argc > 1) {
    snprintf(g_dir, sizeof g_dir, "%s", argv[1]);
  } else {
    int pid = (int)getpid();
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_io_faults_%d", pid);
  }
  make_tensors();
  /* a good checkpoint first: `latest` must keep naming it through every failed save */
  DT_ASSERT_OK(save("good", DT_CHECKPOINT_SYNC, -1, -1, NULL));
  long n_fail = 0, n_absorbed = 0, n_runs = 0;
  char name[64], before[256], after[256];
  for (int mode = DT_CHECKPOINT_SYNC; mode <= DT_CHECKPOINT_ASYNC_DEFER_COPY; mode++) {
    long calls;
    snprintf(name, sizeof name, "count%d", mode);
    DT_ASSERT_OK(save(name, mode, -1, -1, &calls));
    for (int victim = 0; victim < g_world; victim++)
      for (long k = 1, total = calls_of(calls, victim); k <= total; k++) {
        snprintf(name, sizeof name, "s%d_%d_%ld", mode, victim, k);
        latest(before, sizeof before);
        dt_status_t st = save(name, mode, victim, k, NULL);
        MPI_Barrier(MPI_COMM_WORLD);
        latest(after, sizeof after);
        n_runs++;
        if (st != DT_SUCCESS) {
          n_fail++;
          char tmp[80];
          snprintf(tmp, sizeof tmp, "%s.tmp", name);
          DT_ASSERT_TRUE(!exists(name), "a failed save (%s) published %s", dt_last_error(),
                         name);
          DT_ASSERT_TRUE(!exists(tmp), "a failed save (%s) left %s behind", dt_last_error(),
                         tmp);
          DT_ASSERT_TRUE(strcmp(before, after) == 0, "a failed save moved latest from %s to %s",
                         before, after);
        } else { /* absorbed: the checkpoint must be whole */
          n_absorbed++;
          zero_dst();
          DT_ASSERT_OK(load(name, -1, -1, NULL));
          check_loaded(name);
        }
      }
  }
  /* loads: every I/O call of either rank failing in turn */
  long lcalls;
  zero_dst();
  DT_ASSERT_OK(load("good", -1, -1, &lcalls));
  check_loaded("clean load");
  long l_fail = 0, l_runs = 0;
  for (int victim = 0; victim < g_world; victim++)
    for (long k = 1, total = calls_of(lcalls, victim); k <= total; k++, l_runs++) {
      zero_dst();
      dt_status_t st = load("good", victim, k, NULL);
      if (st != DT_SUCCESS) l_fail++;
      else check_loaded("a load that absorbed a failure");
    }
  zero_dst();
  DT_ASSERT_OK(load("good", -1, -1, NULL));
  check_loaded("a clean load after the faults");
  /* the tools' import (local): a consolidated file into a seed checkpoint of its own dir */
  long i_runs = 0, i_fail = 0;
  if (g_rank == 0) {
    char good[600], st_path[600], idir[600], nm[64], lt[256];
    snprintf(good, sizeof good, "%s/good", g_dir);
    snprintf(st_path, sizeof st_path, "%s/good.safetensors", g_dir);
    snprintf(idir, sizeof idir, "%s/imported", g_dir);
    DT_ASSERT_OK(dt_checkpoint_consolidate(good, st_path, 0, 1));
    DT_ASSERT_OK(dt_checkpoint_import(st_path, idir, "seed", 0));
    for (long k = 1;; k++, i_runs++) {
      snprintf(nm, sizeof nm, "seed%ld", k);
      g_calls = 0;
      g_fail_at = k;
      dt_clear_error();
      dt_status_t st = dt_checkpoint_import(st_path, idir, nm, 0);
      g_fail_at = -1;
      if (st == DT_SUCCESS && g_calls < k) break; /* past the last call */
      char p[700];
      struct stat sb;
      snprintf(p, sizeof p, "%s/%s", idir, nm);
      if (st != DT_SUCCESS) {
        i_fail++;
        DT_ASSERT_TRUE(strlen(dt_last_error()) > 0 && named_once(dt_last_error()),
                       "import: %s with no message, or its entry named twice: '%s'",
                       dt_status_name(st), dt_last_error());
        DT_ASSERT_TRUE(stat(p, &sb) != 0, "a failed import (%s) published %s", dt_last_error(),
                       p);
        DT_ASSERT_OK(dt_checkpoint_latest(idir, lt, sizeof lt));
        DT_ASSERT_TRUE(strcmp(lt, "seed") == 0, "a failed import moved latest to %s", lt);
      } else { /* absorbed: a whole checkpoint; latest set back to seed for the next run */
        DT_ASSERT_OK(dt_checkpoint_verify(p, NULL));
        snprintf(p, sizeof p, "%s/latest", idir);
        FILE* f = fopen(p, "w");
        DT_ASSERT_TRUE(f != NULL && fputs("seed\n", f) >= 0 && fclose(f) == 0, "%s", p);
      }
    }
  }
  if (g_rank == 0) {
    printf("test_io_faults np=%d: import with one I/O call failing %ld times (%ld failed)\n",
           g_world, i_runs, i_fail);
    printf("test_io_faults np=%d: %ld saves with one I/O call failing (%ld failed on every rank, "
           "%ld absorbed and loaded back whole); %ld loads with one failing (%ld failed on every "
           "rank)\n", g_world, n_runs, n_fail, n_absorbed, l_runs, l_fail);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    DT_ASSERT_TRUE(system(cmd) == 0, "%s", cmd);
  }
  for (int k = 0; k < NT; k++) {
    DT_ASSERT_OK(dt_tensor_destroy(g_t[k]));
    DT_ASSERT_OK(dt_tensor_destroy(g_dst[k]));
  }
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

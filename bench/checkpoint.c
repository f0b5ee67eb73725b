/* checkpoint.c - distributed checkpoints (dtensor/checkpoint.h) against plain POSIX file I/O of
 * the same bytes, the stall of an async save, and the host memory of a resharding load.
 *
 *   DTENSOR_QUIET=1 mpirun -np 2 build/bench/bench_checkpoint [--mib M] [--tensors K] [--reps R]
 *       [--dir D] [--work-ms W]
 * (DTENSOR_QUIET: dt_init's notices go to stderr, which mpirun may print after the last line.)
 *
 * K (default 8) f32 tensors of M MiB in all (default 256; rows x cols, cols 4096, 2048, 1024,
 * 8192 in turn), Shard(0) on a 1-D mesh of all ranks (FSDP's layout: each rank holds 1/np of
 * every tensor), values dt_tensor_rand(seed k). Files go to D/dt_bench_ckpt_<pid of rank 0>/
 * (D default /tmp), removed at the end. One unmeasured round, then R rounds (default 5), the
 * paired measurements of each round run in alternating order (raw first in even rounds):
 *
 *  - save: dt_checkpoint_save (sync, default options) against raw: every rank open()s a new file
 *    in the same directory, write()s the same number of bytes it writes in the save (its own
 *    shards, from a host buffer already filled) in one sequential stream, fsync()s and closes
 *    it. save_vs_raw = raw time / save time (1: as fast as the plain write).
 *  - load: dt_checkpoint_load of that checkpoint into the same Shard(0) tensors against raw: each
 *    rank read()s its raw file into a host buffer. Both warm: every file was just written and
 *    fsynced, so its pages are in the page cache (this measures the CPU side of loading, the
 *    worst case for the library's extra copies and checksums). Also measured "evicted": before
 *    each of the two reads every rank calls posix_fadvise(POSIX_FADV_DONTNEED) on the files it
 *    is about to read (its checkpoint file, the index, and its raw file), which drops their clean
 *    pages from this guest's page cache; the host below the VM may still cache the disk image,
 *    so "evicted" is a lower bound of a cold read. load_vs_raw = raw time / load time (evicted:
 *    the comparison of I/O; the warm ratio is the CPU cost of checking every block and of
 *    staging everything before the commit, printed beside it).
 *  - async, copy in save: dt_checkpoint_save with async = DT_CHECKPOINT_ASYNC (its time is the
 *    stall: the copy to host staging), then W ms of simulated training (a CPU loop; W default:
 *    the sync save's time of the same round, so the background write has about the time it
 *    needs), then dt_checkpoint_wait. Ratio: async save time / sync save time.
 *  - async, copy deferred (the trainer's --async-checkpoint): dt_checkpoint_save with async =
 *    DT_CHECKPOINT_ASYNC_DEFER_COPY, W ms of work (the forward and backward passes), then
 *    dt_checkpoint_wait_staged (where the optimizer step would start), then dt_checkpoint_wait.
 *    async_stall_ratio = (save + wait_staged time) / sync save time of the same round. The
 *    background thread takes CPU from the work: the work loop's progress beside each async save
 *    over its progress undisturbed (the same W ms run just before) is printed too.
 *  - reshard: dt_checkpoint_load of the Shard(0) checkpoint into Shard(1) tensors (columns
 *    split: every rank reads part of every row of every saved box, the worst case for partial
 *    reads), values checked once against dt_tensor_rand. Memory: the peak resident set of the
 *    process during the load minus its resident set before (Linux: malloc_trim(0) first returns
 *    free heap pages to the kernel, so any memory the load uses must be faulted in again and is
 *    counted; then "5" written to /proc/self/clear_refs resets VmHWM to the current VmRSS, the
 *    baseline; after the load VmHWM is the peak). The destination tensors are allocated and
 *    written before, so only the load's own staging, buffers and index count.
 *    reshard_load_mem_ratio = that extra peak / this rank's bytes of the Shard(1) tensors.
 * Times are the slowest rank's (a barrier before each), memory the largest rank's. Each ratio is
 * computed per round; the table gives the median and the spread (min..max) over the rounds.
 * After each round's comment line a machine-readable one, `checkpoint_round round=R save_s=X
 * raw_write_s=X load_s=X raw_read_s=X load_evicted_s=X raw_read_evicted_s=X async_stall_s=X
 * async_wait_s=X work_ms=X work_frac=X (copy in save) staged_stall_s=X staged_wait_s=X
 * work_frac_staged=X (copy deferred) reshard_s=X reshard_extra_mib=X reshard_ratio=X`
 * (bench/peer.sh's checkpoint part reads it; bench/peer_checkpoint.py prints the same keys).
 * Last line: save_vs_raw=X load_vs_raw=X async_stall_ratio=X reshard_load_mem_ratio=X (medians;
 * load_vs_raw evicted, async_stall_ratio with the copy deferred).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <malloc.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

enum { MAX_TENSORS = 64 };

static int g_rank, g_world;

static void die(const char* what) {
  fprintf(stderr, "bench_checkpoint (rank %d): %s: %s\n", g_rank, what, strerror(errno));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static double slowest(double mine) {
  double out;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

typedef struct {
  double med, lo, hi;
} spread_t;

static spread_t spread(const double* v, int n) {
  double* s = malloc(sizeof(double) * (size_t)n);
  if (s == NULL) die("malloc");
  memcpy(s, v, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  spread_t r = {n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]), s[0], s[n - 1]};
  free(s);
  return r;
}

static int rm_one(const char* p, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p) != 0 && errno != ENOENT;
}

static void rm_rf(const char* path) {
  if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) die(path);
}

/* rank 0 removes dir/name; everyone waits */
static void remove_checkpoint(const char* dir, const char* name) {
  if (g_rank == 0) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    rm_rf(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

static void drop_cache(const char* path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return; /* a rank without a file */
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

static double raw_write(const char* path, const unsigned char* buf, int64_t n) {
  unlink(path);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd < 0) die(path);
  for (int64_t at = 0; at < n;) {
    ssize_t w = write(fd, buf + at, (size_t)(n - at > (1 << 30) ? (1 << 30) : n - at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("write");
    at += w;
  }
  if (fsync(fd) != 0) die("fsync");
  if (close(fd) != 0) die("close");
  return slowest((now_us() - t0) * 1e-6);
}

static double raw_read(const char* path, unsigned char* buf, int64_t n) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  int fd = open(path, O_RDONLY);
  if (fd < 0) die(path);
  for (int64_t at = 0; at < n;) {
    ssize_t r = read(fd, buf + at, (size_t)(n - at > (1 << 30) ? (1 << 30) : n - at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die("read");
    at += r;
  }
  close(fd);
  return slowest((now_us() - t0) * 1e-6);
}

static double timed_save(dt_checkpoint_t ck, const char* dir, const char* name, int async) {
  dt_checkpoint_save_opts_t o = dt_checkpoint_save_opts_default();
  o.async = async;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  CHECK(dt_checkpoint_save(ck, dir, name, &o));
  return slowest((now_us() - t0) * 1e-6);
}

static double timed_load(dt_checkpoint_t ck, const char* dir, const char* name) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  CHECK(dt_checkpoint_load(ck, dir, name));
  return slowest((now_us() - t0) * 1e-6);
}

/* "VmRSS" or "VmHWM" of this process, bytes */
static int64_t proc_status_kb(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) die("/proc/self/status");
  char line[256];
  int64_t kb = -1;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') kb = strtoll(line + kl + 1, NULL, 10);
  fclose(f);
  if (kb < 0) die(key);
  return kb * 1024;
}

static void reset_peak_rss(void) {
  FILE* f = fopen("/proc/self/clear_refs", "w");
  if (f == NULL || fputs("5", f) < 0 || fclose(f) != 0) die("/proc/self/clear_refs");
}

static volatile double g_sink;

/* simulated training: a CPU loop for ms milliseconds; returns how much it computed */
static int64_t work(double ms) {
  double t0 = now_us(), x = 1.0;
  int64_t done = 0;
  while (now_us() - t0 < ms * 1e3) {
    for (int i = 0; i < 10000; i++) x = x * 1.0000001 + 1e-9;
    done++;
  }
  g_sink = x;
  return done;
}

static void usage(const char* prog) {
  fprintf(stderr,
          "usage: %s [--mib M (256)] [--tensors K (8)] [--reps R (5, at most 64)] [--dir D (/tmp)] "
          "[--work-ms W (the sync save's time)]\n", prog);
}

int main(int argc, char** argv) {
  double mib = 256, work_ms = 0;
  int ntens = 8, reps = 5;
  const char* base = "/tmp";
  CHECK(dt_init(&argc, &argv));
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[++i] : NULL;
    if (v == NULL) {
      usage(argv[0]);
      return 2;
    }
    if (!strcmp(a, "--mib")) mib = atof(v);
    else if (!strcmp(a, "--tensors")) ntens = atoi(v);
    else if (!strcmp(a, "--reps")) reps = atoi(v);
    else if (!strcmp(a, "--dir")) base = v;
    else if (!strcmp(a, "--work-ms")) work_ms = atof(v);
    else {
      usage(argv[0]);
      return 2;
    }
  }
  if (!(mib > 0) || ntens < 1 || ntens > MAX_TENSORS || reps < 1 || reps > 64 || work_ms < 0) {
    usage(argv[0]);
    return 2;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);

  int pid0 = (int)getpid();
  MPI_Bcast(&pid0, 1, MPI_INT, 0, MPI_COMM_WORLD);
  char dir[2048], raw_path[2200];
  snprintf(dir, sizeof dir, "%s/dt_bench_ckpt_%d", base, pid0);
  if (g_rank == 0 && mkdir(dir, 0777) != 0) die(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  snprintf(raw_path, sizeof raw_path, "%s/raw_%05d.bin", dir, g_rank);

  /* the tensors: Shard(0) sources (loaded back in place) and Shard(1) reshard targets */
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  static const int64_t kCols[4] = {4096, 2048, 1024, 8192};
  const int64_t per = (int64_t)(mib * (1 << 20) / 4 / ntens);
  dt_tensor_t src[MAX_TENSORS], dst[MAX_TENSORS];
  dt_checkpoint_t ck, ck1;
  CHECK(dt_checkpoint_create(&ck));
  CHECK(dt_checkpoint_create(&ck1));
  int64_t total = 0, mine = 0, mine1 = 0, shape[MAX_TENSORS][2];
  dt_placement_t s0 = dt_shard(0), s1 = dt_shard(1);
  for (int k = 0; k < ntens; k++) {
    int64_t cols = kCols[k % 4], rows = per / cols / g_world * g_world;
    if (rows < g_world) rows = g_world;
    shape[k][0] = rows;
    shape[k][1] = cols;
    char name[64];
    snprintf(name, sizeof name, "layers.%d.weight", k);
    CHECK(dt_tensor_rand(mesh, DT_F32, 2, shape[k], &s0, (uint64_t)k + 1, &src[k]));
    CHECK(dt_tensor_full_value(mesh, DT_F32, 2, shape[k], &s1, -1.0, &dst[k]));
    CHECK(dt_checkpoint_add_tensor(ck, name, src[k]));
    CHECK(dt_checkpoint_add_tensor(ck1, name, dst[k]));
    int64_t n0 = 0, n1 = 0;
    CHECK(dt_tensor_local_numel(src[k], &n0));
    CHECK(dt_tensor_local_numel(dst[k], &n1));
    total += rows * cols * 4;
    mine += n0 * 4;
    mine1 += n1 * 4;
  }
  /* the raw side's bytes: this rank's shards, in a host buffer filled (touched) once */
  unsigned char* buf = malloc((size_t)mine);
  unsigned char* orig = malloc((size_t)mine);
  if (buf == NULL || orig == NULL) die("malloc");
  int64_t at = 0;
  for (int k = 0; k < ntens; k++) {
    int64_t n = 0;
    CHECK(dt_tensor_local_numel(src[k], &n));
    CHECK(dt_tensor_read_local(src[k], 0, n, orig + at));
    at += n * 4;
  }
  memcpy(buf, orig, (size_t)mine);

  if (g_rank == 0) {
    printf("# bench_checkpoint: np %d, %d f32 tensors, %.1f MiB in all, Shard(0) on a 1-D mesh "
           "(%.1f MiB per rank), dir %s, %d rounds after one warm-up\n",
           g_world, ntens, (double)total / (1 << 20), (double)mine / (1 << 20), dir, reps);
    fflush(stdout);
  }
  enum { SAVE, RAWW, LOAD, RAWR, LOADC, RAWRC, ASYNC, WAIT, DEFER, WAITD, RESHARD, NT };
  double* t[NT];
  double* mem = calloc((size_t)reps, sizeof(double));
  double* extra_mib = calloc((size_t)reps, sizeof(double));
  double* work_frac = calloc((size_t)reps, sizeof(double));
  double* work_frac_a = calloc((size_t)reps, sizeof(double));
  for (int i = 0; i < NT; i++) t[i] = calloc((size_t)reps, sizeof(double));
  if (mem == NULL || extra_mib == NULL || work_frac == NULL || work_frac_a == NULL)
    die("calloc");
  for (int i = 0; i < NT; i++)
    if (t[i] == NULL) die("calloc");
  double used_work_ms = 0;
  for (int r = -1; r < reps; r++) {
    int ri = r < 0 ? 0 : r, raw_first = ri % 2 == 0;
    char name[64], aname[64], dname[64], ckfile[2400], index[2400];
    snprintf(name, sizeof name, "sync_%d", r + 1);
    snprintf(aname, sizeof aname, "async_%d", r + 1);
    snprintf(dname, sizeof dname, "defer_%d", r + 1);
    snprintf(ckfile, sizeof ckfile, "%s/%s/rank_%05d.safetensors", dir, name, g_rank);
    snprintf(index, sizeof index, "%s/%s/index.json", dir, name);
    double v[NT];
    /* save vs write + fsync */
    if (raw_first) v[RAWW] = raw_write(raw_path, buf, mine);
    v[SAVE] = timed_save(ck, dir, name, 0);
    if (!raw_first) v[RAWW] = raw_write(raw_path, buf, mine);
    /* load vs read, warm */
    if (raw_first) v[RAWR] = raw_read(raw_path, buf, mine);
    v[LOAD] = timed_load(ck, dir, name);
    if (!raw_first) v[RAWR] = raw_read(raw_path, buf, mine);
    if (r == -1) { /* the round trip is exact */
      int bad = 0;
      int64_t got = 0;
      for (int k = 0; k < ntens; k++) {
        int64_t n = 0;
        CHECK(dt_tensor_local_numel(src[k], &n));
        CHECK(dt_tensor_read_local(src[k], 0, n, buf + got));
        got += n * 4;
      }
      bad = memcmp(buf, orig, (size_t)mine) != 0;
      int any = 0;
      MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (any) {
        if (g_rank == 0) fprintf(stderr, "bench_checkpoint: the loaded values differ\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    /* the same, pages evicted from this guest's cache before each read */
    for (int pass = 0; pass < 2; pass++) {
      int do_raw = (pass == 0) == raw_first;
      drop_cache(do_raw ? raw_path : ckfile);
      if (!do_raw) drop_cache(index);
      MPI_Barrier(MPI_COMM_WORLD);
      if (do_raw) v[RAWRC] = raw_read(raw_path, buf, mine);
      else v[LOADC] = timed_load(ck, dir, name);
    }
    /* async: the stall, simulated work, the wait */
    double wms = work_ms > 0 ? work_ms : v[SAVE] * 1e3;
    used_work_ms = wms;
    v[ASYNC] = timed_save(ck, dir, aname, 1);
    int64_t beside_a = work(wms);
    MPI_Barrier(MPI_COMM_WORLD);
    double tw = now_us();
    CHECK(dt_checkpoint_wait(ck));
    v[WAIT] = slowest((now_us() - tw) * 1e-6);
    remove_checkpoint(dir, aname);
    /* async with the copy deferred (the trainer's --async-checkpoint): the save, the simulated
     * forward and backward passes, dt_checkpoint_wait_staged (the optimizer step would follow),
     * then the wait; the stall is the save plus wait_staged. The same work undisturbed first:
     * work_frac = what the loop computed beside the background copy and write / undisturbed. */
    MPI_Barrier(MPI_COMM_WORLD);
    int64_t undisturbed = work(wms);
    dt_checkpoint_save_opts_t od = dt_checkpoint_save_opts_default();
    od.async = DT_CHECKPOINT_ASYNC_DEFER_COPY;
    MPI_Barrier(MPI_COMM_WORLD);
    double td = now_us();
    CHECK(dt_checkpoint_save(ck, dir, dname, &od));
    double stall_d = now_us() - td;
    int64_t beside = work(wms);
    td = now_us();
    CHECK(dt_checkpoint_wait_staged(ck));
    stall_d += now_us() - td;
    v[DEFER] = slowest(stall_d * 1e-6);
    MPI_Barrier(MPI_COMM_WORLD);
    td = now_us();
    CHECK(dt_checkpoint_wait(ck));
    v[WAITD] = slowest((now_us() - td) * 1e-6);
    double frac = undisturbed > 0 ? (double)beside / (double)undisturbed : 1.0;
    double frac_a = undisturbed > 0 ? (double)beside_a / (double)undisturbed : 1.0;
    frac = -slowest(-frac); /* the smallest over the ranks */
    frac_a = -slowest(-frac_a);
    remove_checkpoint(dir, dname);
    /* reshard Shard(0) -> Shard(1), memory: a fresh checkpoint object, so that its staging
     * buffer (kept between a checkpoint object's saves and loads) is allocated and counted */
    CHECK(dt_checkpoint_destroy(ck1));
    CHECK(dt_checkpoint_create(&ck1));
    for (int k = 0; k < ntens; k++) {
      char tname[64];
      snprintf(tname, sizeof tname, "layers.%d.weight", k);
      CHECK(dt_checkpoint_add_tensor(ck1, tname, dst[k]));
    }
    malloc_trim(0);
    MPI_Barrier(MPI_COMM_WORLD);
    reset_peak_rss();
    int64_t rss0 = proc_status_kb("VmRSS");
    double t0 = now_us();
    CHECK(dt_checkpoint_load(ck1, dir, name));
    double tl = now_us() - t0;
    int64_t hwm = proc_status_kb("VmHWM");
    v[RESHARD] = slowest(tl * 1e-6);
    double ratio = (double)(hwm - rss0) / (double)mine1, emib = (double)(hwm - rss0) / (1 << 20);
    ratio = slowest(ratio);
    emib = slowest(emib);
    if (r == -1) { /* the Shard(1) values are the rand values */
      int bad = 0;
      for (int k = 0; k < ntens && !bad; k++) {
        dt_tensor_t want;
        int64_t n = 0;
        CHECK(dt_tensor_rand(mesh, DT_F32, 2, shape[k], &s1, (uint64_t)k + 1, &want));
        CHECK(dt_tensor_local_numel(want, &n));
        float* a = malloc((size_t)n * 4 + 4);
        float* b = malloc((size_t)n * 4 + 4);
        if (a == NULL || b == NULL) die("malloc");
        CHECK(dt_tensor_read_local(want, 0, n, a));
        CHECK(dt_tensor_read_local(dst[k], 0, n, b));
        bad = memcmp(a, b, (size_t)n * 4) != 0;
        free(a);
        free(b);
        CHECK(dt_tensor_destroy(want));
      }
      int any = 0;
      MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (any) {
        if (g_rank == 0) fprintf(stderr, "bench_checkpoint: the resharded values differ\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    remove_checkpoint(dir, name);
    if (r < 0) continue;
    for (int i = 0; i < NT; i++) t[i][r] = v[i];
    mem[r] = ratio;
    work_frac[r] = frac;
    work_frac_a[r] = frac_a;
    extra_mib[r] = emib;
    if (g_rank == 0) {
      printf("# round %d (%s first): save %.3f s raw %.3f | load %.3f raw %.3f | evicted: load "
             "%.3f raw %.3f | async %.3f wait %.3f after %.0f ms | deferred copy: stall %.4f "
             "wait %.3f, work %.2f | reshard %.3f s, +%.1f MiB (%.3f)\n", r,
             raw_first ? "raw" : "library", v[SAVE], v[RAWW], v[LOAD], v[RAWR], v[LOADC],
             v[RAWRC], v[ASYNC], v[WAIT], wms, v[DEFER], v[WAITD], frac, v[RESHARD], emib,
             ratio);
      /* the same, machine-readable (bench/peer.sh's checkpoint part; its keys are those of
       * bench/peer_checkpoint.py's lines where the two measure the same thing) */
      printf("checkpoint_round round=%d save_s=%.4f raw_write_s=%.4f load_s=%.4f raw_read_s=%.4f "
             "load_evicted_s=%.4f raw_read_evicted_s=%.4f async_stall_s=%.4f async_wait_s=%.4f "
             "work_ms=%.1f work_frac=%.3f staged_stall_s=%.4f staged_wait_s=%.4f "
             "work_frac_staged=%.3f reshard_s=%.4f reshard_extra_mib=%.1f reshard_ratio=%.4f\n",
             r, v[SAVE], v[RAWW], v[LOAD], v[RAWR], v[LOADC], v[RAWRC], v[ASYNC], v[WAIT], wms,
             frac_a, v[DEFER], v[WAITD], frac, v[RESHARD], emib, ratio);
      fflush(stdout);
    }
  }
  unlink(raw_path);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) rm_rf(dir);

  double q_save[64], q_load[64], q_loadc[64], q_async[64], q_defer[64];
  for (int r = 0; r < reps; r++) {
    q_save[r] = t[RAWW][r] / t[SAVE][r];
    q_load[r] = t[RAWR][r] / t[LOAD][r];
    q_loadc[r] = t[RAWRC][r] / t[LOADC][r];
    q_async[r] = t[ASYNC][r] / t[SAVE][r];
    q_defer[r] = t[DEFER][r] / t[SAVE][r];
  }
  const int nr = reps;
  spread_t rs = spread(q_save, nr), rl = spread(q_load, nr), rlc = spread(q_loadc, nr),
           ra = spread(q_async, nr), rd = spread(q_defer, nr), rm = spread(mem, nr),
           wf = spread(work_frac, nr), wfa = spread(work_frac_a, nr);
  if (g_rank == 0) {
    const char* names[NT] = {"dt_checkpoint_save (sync)",
                             "raw write + fsync",
                             "dt_checkpoint_load (warm)",
                             "raw read (warm)",
                             "dt_checkpoint_load (evicted)",
                             "raw read (evicted)",
                             "dt_checkpoint_save (async): stall",
                             "dt_checkpoint_wait after the work",
                             "async, copy deferred: stall",
                             "dt_checkpoint_wait after the work",
                             "dt_checkpoint_load S(0) -> S(1)"};
    printf("# %-36s | %22s | %18s\n", "operation", "seconds median (min..max)", "MiB/s (median)");
    for (int i = 0; i < NT; i++) {
      spread_t s = spread(t[i], reps);
      printf("  %-36s | %8.4f (%.4f..%.4f) | %10.1f\n", names[i], s.med, s.lo, s.hi,
             (double)total / (1 << 20) / s.med);
    }
    spread_t em = spread(extra_mib, nr);
    printf("# simulated work before the wait: %.0f ms (last round)\n", used_work_ms);
    printf("# reshard load: peak extra resident memory %.1f MiB (%.1f..%.1f), own Shard(1) bytes "
           "%.1f MiB per rank\n", em.med, em.lo, em.hi, (double)mine1 / (1 << 20));
    printf("# ratios, median (min..max) over %d rounds:\n", nr);
    printf("#   save_vs_raw            %.3g (%.3g..%.3g)   [raw write+fsync time / save time]\n",
           rs.med, rs.lo, rs.hi);
    printf("#   load_vs_raw (evicted)  %.3g (%.3g..%.3g)   [raw read time / load time, pages "
           "not cached: the I/O comparison]\n", rlc.med, rlc.lo, rlc.hi);
    printf("#   load_vs_raw (warm)     %.3g (%.3g..%.3g)   [the same, pages cached: the CPU cost "
           "of checking every block and of the all-or-nothing commit]\n", rl.med, rl.lo, rl.hi);
    printf("#   async_stall_ratio      %.3g (%.3g..%.3g)   [copy deferred: (save + wait_staged) / "
           "sync save time]\n", rd.med, rd.lo, rd.hi);
    printf("#   async (copy in save)   %.3g (%.3g..%.3g)   [async save time / sync save time]\n",
           ra.med, ra.lo, ra.hi);
    printf("#   simulated work done beside the background save, of the undisturbed loop's: "
           "%.3g (%.3g..%.3g) copy deferred, %.3g (%.3g..%.3g) copy in save\n", wf.med, wf.lo,
           wf.hi, wfa.med, wfa.lo, wfa.hi);
    printf("#   reshard_load_mem_ratio %.3g (%.3g..%.3g)   [peak extra RSS / own shard bytes]\n",
           rm.med, rm.lo, rm.hi);
    printf("save_vs_raw=%#.3g load_vs_raw=%#.3g async_stall_ratio=%#.3g "
           "reshard_load_mem_ratio=%#.3g\n", rs.med, rlc.med, rd.med, rm.med);
  }
  for (int i = 0; i < NT; i++) free(t[i]);
  free(mem);
  free(extra_mib);
  free(work_frac);
  free(work_frac_a);
  free(buf);
  free(orig);
  for (int k = 0; k < ntens; k++) {
    CHECK(dt_tensor_destroy(src[k]));
    CHECK(dt_tensor_destroy(dst[k]));
  }
  CHECK(dt_checkpoint_destroy(ck));
  CHECK(dt_checkpoint_destroy(ck1));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

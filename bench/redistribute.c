/* redistribute.c - redistribution time against the raw MPI collective (nccl-tests style).
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_redistribute \
 *       [-b 4K] [-e 64M] [-f 4] [-n ITERS] [-w WARMUP] [-r ROUNDS] [-c 0|1] [-k CASES]
 *
 * On a 1-D mesh of all ranks, for each case and each full-tensor size S (f32, shape (S/1024, 256),
 * sizes b, b*f, ... up to e):
 *   S0->R  (all-gather)       P->R  (all-reduce)        P->S0 (reduce-scatter)
 *   S0->S1 (all-to-all)       S1->R (all-gather of the second dim: the blocks land strided)
 * it times dt_tensor_redistribute_into (the allocation-free path, dst made by dt_tensor_empty) and
 * the raw MPI collective on the same bytes with preallocated buffers holding real data
 * (MPI_Allgather for S0->R and S1->R, MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Alltoall).
 * A measurement is ITERS calls after a barrier, averaged, max over ranks. Library and raw
 * measurements alternate (ROUNDS of each, the order flipping every round) and the minimum of each
 * is reported. Columns: time and raw in microseconds, algbw = S / time, busbw = algbw * (n-1)/n
 * (all-reduce 2(n-1)/n), GB/s = 1e9 B/s, ratio = time / raw, #wrong = elements of the result that
 * differ from the reference (small integers, so sums are exact; -c 0 skips the check).
 * -k picks cases by name, comma-separated (e.g. -k S0->S1,S1->R). The last line is
 *   worst_ratio_contiguous=<x> worst_ratio_repack=<y> small_overhead_us=<z>
 * contiguous: worst ratio of S0->R, P->R, P->S0, S0->S1 rows of at least 1 MiB; repack: worst
 * ratio of S1->R rows of at least 1 MiB; small overhead: worst (time - raw) of rows below 1 MiB.
 * Exit status 1 when a result is wrong.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

#define CHECK(call)                                                                 \
  do {                                                                              \
    dt_status_t st_ = (call);                                                       \
    if (st_ != DT_SUCCESS) {                                                        \
      fprintf(stderr, "%s: %s: %s\n", #call, dt_status_name(st_), dt_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
    }                                                                               \
  } while (0)

typedef enum { C_S0_R, C_P_R, C_P_S0, C_S0_S1, C_S1_R, C_COUNT } bench_case_t;
static const char* const kNames[C_COUNT] = {"S0->R", "P->R", "P->S0", "S0->S1", "S1->R"};
static const int64_t kCols = 256;

static long long parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (long long)v;
}

static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (p == NULL) {
    fprintf(stderr, "bench_redistribute: out of memory (%zu bytes)\n", n);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return p;
}

/* One raw MPI collective moving the same bytes as case c; numel = full tensor elements. */
static void raw_call(bench_case_t c, int n, long long numel, const float* send, float* recv) {
  int per = (int)(numel / n);
  switch (c) {
    case C_S0_R:
    case C_S1_R: MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD); break;
    case C_P_R: MPI_Allreduce(send, recv, (int)numel, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case C_P_S0:
      MPI_Reduce_scatter_block(send, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case C_S0_S1:
      MPI_Alltoall(send, per / n, MPI_FLOAT, recv, per / n, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    default: break;
  }
}

/* Seconds per call of `iters` calls, max over ranks. */
static double time_calls(int lib, bench_case_t c, int n, long long numel, int iters, dt_tensor_t x,
                         dt_tensor_t y, const float* ra, float* rb) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int k = 0; k < iters; k++) {
    if (lib) CHECK(dt_tensor_redistribute_into(x, y));
    else raw_call(c, n, numel, ra, rb);
  }
  double t = (MPI_Wtime() - t0) / iters, tmax;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

/* Elements of y's local shard that differ from the reference (summed over ranks). */
static long long count_wrong(dt_tensor_t y, const float* ref) {
  float* data;
  int64_t shape[2], off[2];
  CHECK(dt_tensor_to_local(y, (void**)&data, shape));
  CHECK(dt_tensor_local_offset(y, off));
  long long wrong = 0, total;
  for (int64_t i = 0; i < shape[0]; i++)
    for (int64_t j = 0; j < shape[1]; j++)
      wrong += data[i * shape[1] + j] != ref[(off[0] + i) * kCols + off[1] + j];
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

static const char* env_or(const char* name, const char* dflt) {
  const char* v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : dflt;
}

int main(int argc, char** argv) {
  CHECK(dt_init(&argc, &argv));
  int rank, n;
  CHECK(dt_world_rank(&rank));
  CHECK(dt_world_size(&n));
  long long minb = 4096, maxb = 64ll << 20;
  int factor = 4, iters = 0, warmup = 2, rounds = 5, check = 1, want[C_COUNT];
  for (int c = 0; c < C_COUNT; c++) want[c] = 1;
  for (int i = 1; i < argc; i++) {
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) goto usage;
    if (!strcmp(argv[i], "-b")) minb = parse_size(v);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(v);
    else if (!strcmp(argv[i], "-f")) factor = atoi(v);
    else if (!strcmp(argv[i], "-n")) iters = atoi(v);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(v);
    else if (!strcmp(argv[i], "-r")) rounds = atoi(v);
    else if (!strcmp(argv[i], "-c")) check = atoi(v);
    else if (!strcmp(argv[i], "-k")) {
      for (int c = 0; c < C_COUNT; c++) want[c] = 0;
      for (const char* p = v; *p != '\0';) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int c = 0; c < C_COUNT; c++)
          if (strlen(kNames[c]) == len && strncmp(p, kNames[c], len) == 0) want[c] = found = 1;
        if (!found) goto usage;
        p += len + (p[len] == ',');
      }
    } else goto usage;
    i++;
  }
  if (minb < 4096 || maxb < minb || factor < 2 || warmup < 0 || rounds < 1 || iters < 0) {
  usage:
    if (rank == 0)
      fprintf(stderr, "usage: bench_redistribute [-b MIN>=4K] [-e MAX] [-f FACTOR>=2] [-n ITERS] "
                      "[-w WARMUP] [-r ROUNDS] [-c 0|1] [-k S0->R,P->R,P->S0,S0->S1,S1->R]\n");
    dt_finalize();
    return 2;
  }
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &n, NULL, NULL, &mesh));
  if (rank == 0) {
    printf("# bench_redistribute: %d ranks, 1-D mesh, f32 shape (S/1024, %lld), %d alternating "
           "rounds, min of each\n", n, (long long)kCols, rounds);
    printf("# DTENSOR_COST_MODEL=%s MALLOC_MMAP_THRESHOLD_=%s MALLOC_TRIM_THRESHOLD_=%s "
           "MALLOC_TOP_PAD_=%s\n", env_or("DTENSOR_COST_MODEL", "(unset)"),
           env_or("MALLOC_MMAP_THRESHOLD_", "(unset)"), env_or("MALLOC_TRIM_THRESHOLD_", "(unset)"),
           env_or("MALLOC_TOP_PAD_", "(unset)"));
    printf("%-7s %11s %11s %11s %9s %9s %11s %7s %6s\n", "case", "size(B)", "count", "time(us)",
           "algbw", "busbw", "raw(us)", "ratio", "#wrong");
    fflush(stdout);
  }
  double worst_contig = 0, worst_repack = 0, small_over = -INFINITY;
  long long wrong_total = 0;
  for (int c = 0; c < C_COUNT; c++) {
    if (!want[c]) continue;
    for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
      long long numel = bytes / 4;
      int64_t rows = numel / kCols;
      if (numel % kCols != 0 || rows % n != 0 || kCols % n != 0 || rows < n) {
        if (rank == 0) printf("# %s %lld: skipped (shape (%lld, %lld) does not shard evenly)\n",
                              kNames[c], bytes, (long long)rows, (long long)kCols);
        continue;
      }
      int64_t shape[2] = {rows, kCols};
      dt_placement_t src = (c == C_P_R || c == C_P_S0) ? dt_partial(DT_REDUCE_SUM)
                           : c == C_S1_R               ? dt_shard(1)
                                                       : dt_shard(0);
      dt_placement_t dst = c == C_P_S0 ? dt_shard(0) : c == C_S0_S1 ? dt_shard(1) : dt_replicate();
      /* Small integers: sums of the partial values (x/2, x/4 in binary) are exact. */
      float* ref = (float*)xmalloc(sizeof(float) * (size_t)numel);
      for (long long i = 0; i < numel; i++) ref[i] = (float)((i * 7) % 251);
      dt_tensor_t x, y;
      CHECK(dt_tensor_from_full(mesh, DT_F32, 2, shape, &src, ref, &x));
      CHECK(dt_tensor_empty(mesh, DT_F32, 2, shape, &dst, &y));
      /* Raw buffers hold real data (untouched pages would all map the zero page). */
      float* ra = (float*)xmalloc(sizeof(float) * (size_t)numel);
      float* rb = (float*)xmalloc(sizeof(float) * (size_t)numel);
      memcpy(ra, ref, sizeof(float) * (size_t)numel);
      memset(rb, 1, sizeof(float) * (size_t)numel);
      int it = iters > 0 ? iters : (int)fmax(3, fmin(200, 2e8 / (double)bytes));
      for (int w = 0; w < warmup; w++) {
        CHECK(dt_tensor_redistribute_into(x, y));
        raw_call((bench_case_t)c, n, numel, ra, rb);
      }
      long long wrong = 0;
      if (check) wrong = count_wrong(y, ref);
      double lib = INFINITY, raw = INFINITY;
      for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
          int is_lib = (k + r) % 2 == 0;
          double t = time_calls(is_lib, (bench_case_t)c, n, numel, it, x, y, ra, rb);
          if (is_lib) lib = fmin(lib, t);
          else raw = fmin(raw, t);
        }
      if (check) wrong += count_wrong(y, ref); /* still right after the timed calls */
      double us = lib * 1e6, raw_us = raw * 1e6, ratio = lib / raw;
      double algbw = (double)bytes / lib / 1e9;
      double bf = c == C_P_R ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
      if (rank == 0) {
        printf("%-7s %11lld %11lld %11.1f %9.2f %9.2f %11.1f %7.3f %6lld\n", kNames[c], bytes,
               numel, us, algbw, algbw * bf, raw_us, ratio, wrong);
        fflush(stdout);
      }
      if (bytes >= (1 << 20)) {
        if (c == C_S1_R) worst_repack = fmax(worst_repack, ratio);
        else worst_contig = fmax(worst_contig, ratio);
      } else {
        small_over = fmax(small_over, us - raw_us);
      }
      wrong_total += wrong;
      CHECK(dt_tensor_destroy(x));
      CHECK(dt_tensor_destroy(y));
      free(ra);
      free(rb);
      free(ref);
    }
  }
  if (rank == 0)
    printf("worst_ratio_contiguous=%.3f worst_ratio_repack=%.3f small_overhead_us=%.2f\n",
           worst_contig, worst_repack, isinf(small_over) ? 0.0 : small_over);
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return wrong_total ? 1 : 0;
}

/* redistribute.c - redistribution bandwidth against the raw MPI collective (nccl-tests style).
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_redistribute \
 *       [-b 4K] [-e 64M] [-f 4] [-n ITERS] [-w WARMUP] [-r ROUNDS] [-c 0|1]
 *
 * On a 1-D mesh of all ranks, for each case and each full-tensor size S (f32, shape (S/1024, 256)):
 *   S0->R (all-gather), P->R (all-reduce), P->S0 (reduce-scatter), S0->S1 (all-to-all),
 *   S1->R (all-gather of a non-leading dim: the library must repack)
 * time dt_tensor_redistribute_into (the allocation-free path) and the raw MPI collective on the
 * same bytes with preallocated buffers. Library and raw rounds alternate; each round times ITERS
 * calls between barriers, takes the max over ranks, and the best round of each is reported.
 * busbw = algbw * (n-1)/n, all-reduce 2(n-1)/n; GB/s = 1e9 B/s. The last line is
 *   worst_ratio_contiguous=<x> worst_ratio_repack=<y> small_overhead_us=<z>
 * (ratios over rows from 1 MiB up; overhead = worst library - raw time over rows below 1 MiB).
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

#define CHECK(call)                                                                         \
  do {                                                                                      \
    dt_status_t st_ = (call);                                                               \
    if (st_ != DT_SUCCESS) {                                                                \
      fprintf(stderr, "%s: %s: %s\n", #call, dt_status_name(st_), dt_last_error());         \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
    }                                                                                       \
  } while (0)

typedef enum { C_S0_R, C_P_R, C_P_S0, C_S0_S1, C_S1_R, C_COUNT } bench_case_t;
static const char* kNames[C_COUNT] = {"S0->R", "P->R", "P->S0", "S0->S1", "S1->R"};

static long long parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (long long)v;
}

static double now(void) { return MPI_Wtime(); }

/* Times `iters` raw MPI calls for case c; buffers preallocated by the caller. */
static void raw_call(bench_case_t c, int n, long long numel, float* a, float* b) {
  switch (c) {
    case C_S0_R:
    case C_S1_R:
      MPI_Allgather(a, (int)(numel / n), MPI_FLOAT, b, (int)(numel / n), MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case C_P_R: MPI_Allreduce(a, b, (int)numel, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case C_P_S0:
      MPI_Reduce_scatter_block(a, b, (int)(numel / n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case C_S0_S1:
      MPI_Alltoall(a, (int)(numel / n / n), MPI_FLOAT, b, (int)(numel / n / n), MPI_FLOAT,
                   MPI_COMM_WORLD);
      break;
    default: break;
  }
}

int main(int argc, char** argv) {
  CHECK(dt_init(&argc, &argv));
  int rank, n;
  CHECK(dt_world_rank(&rank));
  CHECK(dt_world_size(&n));
  long long minb = 4096, maxb = 64ll << 20;
  int factor = 4, iters = 0, warmup = 2, rounds = 5, check = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-c")) check = atoi(argv[i + 1]);
    else {
      if (rank == 0) fprintf(stderr, "unknown option %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (factor < 2) factor = 2;
  if (rounds < 1) rounds = 1;
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &n, NULL, NULL, &mesh));
  const int64_t cols = 256;
  if (rank == 0) {
    printf("# dtensor bench_redistribute: %d ranks, 1-D mesh, f32, shape (S/1024, 256), best of %d "
           "alternating rounds\n", n, rounds);
    printf("%-7s %11s %11s %11s %9s %9s %11s %7s %6s\n", "case", "size(B)", "count", "time(us)",
           "algbw", "busbw", "raw(us)", "ratio", "#wrong");
  }
  double worst_contig = 0, worst_repack = 0, small_over = -1e30, small_over_contig = -1e30;
  for (int c = 0; c < C_COUNT; c++) {
    for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
      long long numel = bytes / 4;
      int64_t rows = numel / cols;
      if (rows % n != 0 || cols % n != 0 || rows < n) continue;
      int64_t shape[2] = {rows, cols};
      dt_placement_t src[1], dst[1];
      src[0] = (c == C_P_R || c == C_P_S0) ? dt_partial(DT_REDUCE_SUM)
               : c == C_S1_R              ? dt_shard(1)
                                          : dt_shard(0);
      dst[0] = (c == C_P_S0) ? dt_shard(0) : (c == C_S0_S1) ? dt_shard(1) : dt_replicate();
      /* Source data: small integers, so every sum is exact. */
      float* ref = (float*)malloc(sizeof(float) * (size_t)numel);
      for (long long i = 0; i < numel; i++) ref[i] = (float)((i * 7) % 251);
      dt_tensor_t x, y;
      CHECK(dt_tensor_from_full(mesh, DT_F32, 2, shape, src, ref, &x));
      CHECK(dt_tensor_empty(mesh, DT_F32, 2, shape, dst, &y));
      /* Raw buffers hold real data: untouched calloc pages all map to the zero page, which
       * would make the raw side's reads artificially cheap. */
      float* ra = (float*)malloc(sizeof(float) * (size_t)numel);
      float* rb = (float*)malloc(sizeof(float) * (size_t)numel);
      memcpy(ra, ref, sizeof(float) * (size_t)numel);
      memset(rb, 1, sizeof(float) * (size_t)numel);
      int it = iters > 0 ? iters : (int)fmax(3, fmin(200, 2e8 / (double)bytes));
      for (int w = 0; w < warmup; w++) {
        CHECK(dt_tensor_redistribute_into(x, y));
        raw_call((bench_case_t)c, n, numel, ra, rb);
      }
      double best_lib = 1e30, best_raw = 1e30;
      for (int r = 0; r < rounds; r++) {
        for (int which = 0; which < 2; which++) {
          MPI_Barrier(MPI_COMM_WORLD);
          double t0 = now();
          for (int k = 0; k < it; k++) {
            if (which == 0) CHECK(dt_tensor_redistribute_into(x, y));
            else raw_call((bench_case_t)c, n, numel, ra, rb);
          }
          double t = (now() - t0) / it, tmax;
          MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          if (which == 0) best_lib = fmin(best_lib, tmax);
          else best_raw = fmin(best_raw, tmax);
        }
      }
      long long wrong = 0;
      if (check) {
        float* got = (float*)malloc(sizeof(float) * (size_t)numel);
        CHECK(dt_tensor_full(y, got, sizeof(float) * (size_t)numel));
        for (long long i = 0; i < numel; i++) wrong += got[i] != ref[i];
        free(got);
      }
      double us = best_lib * 1e6, raw_us = best_raw * 1e6, ratio = best_lib / best_raw;
      double algbw = (double)bytes / best_lib / 1e9;
      double bf = c == C_P_R ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
      if (rank == 0)
        printf("%-7s %11lld %11lld %11.1f %9.2f %9.2f %11.1f %7.3f %6lld\n", kNames[c], bytes,
               numel, us, algbw, algbw * bf, raw_us, ratio, wrong);
      if (bytes >= (1 << 20)) {
        if (c == C_S1_R) worst_repack = fmax(worst_repack, ratio);
        else worst_contig = fmax(worst_contig, ratio);
      } else {
        small_over = fmax(small_over, us - raw_us);
        if (c != C_S1_R && c != C_S0_S1) small_over_contig = fmax(small_over_contig, us - raw_us);
      }
      CHECK(dt_tensor_destroy(x));
      CHECK(dt_tensor_destroy(y));
      free(ra);
      free(rb);
      free(ref);
      if (wrong) {
        if (rank == 0) fprintf(stderr, "%s: %lld wrong elements\n", kNames[c], wrong);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
  }
  if (rank == 0)
    printf("# below 1 MiB, worst overhead of the cases that need no repack (S0->R, P->R, P->S0): "
           "%.2f us\n", small_over_contig < -1e29 ? 0.0 : small_over_contig);
  if (rank == 0)
    printf("worst_ratio_contiguous=%.3f worst_ratio_repack=%.3f small_overhead_us=%.2f\n",
           worst_contig, worst_repack, small_over < -1e29 ? 0.0 : small_over);
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

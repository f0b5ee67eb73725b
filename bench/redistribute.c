/* redistribute.c - redistribution time against the raw MPI collective (nccl-tests style).
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_redistribute \
 *       [-b 4K] [-e 64M] [-f 4] [-n ITERS] [-w WARMUP] [-r ROUNDS] [-c 0|1] [-k CASES]
 *       [-a auto|native|a2a]
 *
 * On a 1-D mesh of all ranks, for each case and each full-tensor size S (f32, shape (S/1024, 256),
 * sizes b, b*f, ... up to e):
 *   S0->R  (all-gather, contiguous blocks)
 *   P->R   (all-reduce)            P->S0 (reduce-scatter)          -- reductions
 *   S0->S1 (all-to-all, the blocks packed)  S1->R (all-gather, the blocks land strided) -- repack
 * it times dt_tensor_redistribute_into (the allocation-free path, dst made by dt_tensor_empty),
 * the raw MPI collective on the same bytes with preallocated buffers holding real data
 * (MPI_Allgather, MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Alltoall) and, for the repacking
 * cases, the raw call plus one memcpy of the bytes that must be rearranged (S0->S1: the send
 * buffer before the call; S1->R: the output after it), the least any implementation must do.
 * A measurement is ITERS calls after a barrier, averaged, max over ranks. The measurements
 * alternate (ROUNDS of each, the order rotating every round) and the minimum of each is reported.
 * Columns: time, raw and raw+copy in microseconds, algbw = S / time, busbw = algbw * (n-1)/n
 * (all-reduce 2(n-1)/n), GB/s = 1e9 B/s, ratio = time / raw (repack: time / (raw+copy)),
 * #wrong = elements of the result that differ from the reference (small integers, so sums are
 * exact; -c 0 skips the check), algo = the reduction algorithm the plan chose. -k picks cases by
 * name, comma-separated (e.g. -k S0->S1,S1->R); -a forces the reductions' algorithm (default:
 * the cost model picks). The last line is
 *   worst_ratio_contiguous=<x> worst_ratio_repack_vs_copy=<y> reduce_speedup_min=<z>
 *   small_overhead_us=<w>
 * over rows of at least 1 MiB: contiguous = worst time/raw of S0->R; repack = worst
 * time/(raw+copy) of S0->S1 and S1->R; reduce speedup = smallest raw/time of P->R and P->S0;
 * small overhead = worst time minus baseline (raw, or raw+copy) of the rows below 1 MiB.
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
typedef enum { K_CONTIG, K_REDUCE, K_REPACK } bench_kind_t;
static const bench_kind_t kKind[C_COUNT] = {K_CONTIG, K_REDUCE, K_REDUCE, K_REPACK, K_REPACK};
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

/* One raw MPI collective moving the same bytes as case c; numel = full tensor elements. With
 * copy, plus one memcpy of the bytes a repacking case rearranges (into / out of tmp). */
static void raw_call(bench_case_t c, int n, long long numel, const float* send, float* recv,
                     float* tmp, int copy) {
  int per = (int)(numel / n);
  switch (c) {
    case C_S0_R: MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD); break;
    case C_S1_R:
      MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD);
      if (copy) memcpy(tmp, recv, sizeof(float) * (size_t)numel);
      break;
    case C_P_R: MPI_Allreduce(send, recv, (int)numel, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case C_P_S0:
      MPI_Reduce_scatter_block(send, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case C_S0_S1:
      if (copy) memcpy(tmp, send, sizeof(float) * (size_t)per);
      MPI_Alltoall(copy ? tmp : send, per / n, MPI_FLOAT, recv, per / n, MPI_FLOAT,
                   MPI_COMM_WORLD);
      break;
    default: break;
  }
}

/* Seconds per call of `iters` calls, max over ranks. who: 0 library, 1 raw, 2 raw + copy. */
static double time_calls(int who, bench_case_t c, int n, long long numel, int iters,
                         dt_tensor_t x, dt_tensor_t y, const float* ra, float* rb, float* rc) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int k = 0; k < iters; k++) {
    if (who == 0) CHECK(dt_tensor_redistribute_into(x, y));
    else raw_call(c, n, numel, ra, rb, rc, who == 2);
  }
  double t = (MPI_Wtime() - t0) / iters, tmax;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

/* The algorithm the plan of x -> y uses for its reduction step ("-" when none). */
static const char* plan_algo(dt_mesh_t mesh, const int64_t* shape, dt_placement_t src,
                             dt_placement_t dst) {
  dt_plan_t p;
  CHECK(dt_plan_create(mesh, DT_F32, 2, shape, &src, &dst, &p));
  int ns;
  const char* a = "-";
  CHECK(dt_plan_num_steps(p, &ns));
  for (int i = 0; i < ns; i++) {
    dt_plan_step_t st;
    CHECK(dt_plan_get_step(p, i, &st));
    if (st.coll == DT_COLL_ALL_REDUCE || st.coll == DT_COLL_REDUCE_SCATTER)
      a = dt_coll_algo_name(st.algo);
  }
  CHECK(dt_plan_destroy(p));
  return a;
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
  for (int i = 1; i < argc; i += 2) {
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) goto usage;
    if (!strcmp(argv[i], "-b")) minb = parse_size(v);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(v);
    else if (!strcmp(argv[i], "-f")) factor = atoi(v);
    else if (!strcmp(argv[i], "-n")) iters = atoi(v);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(v);
    else if (!strcmp(argv[i], "-r")) rounds = atoi(v);
    else if (!strcmp(argv[i], "-c")) check = atoi(v);
    else if (!strcmp(argv[i], "-a")) {
      if (!strcmp(v, "native")) CHECK(dt_cost_model_force_algo(DT_ALGO_NATIVE));
      else if (!strcmp(v, "a2a")) CHECK(dt_cost_model_force_algo(DT_ALGO_A2A));
      else if (strcmp(v, "auto") != 0) goto usage;
    }
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
  }
  if (minb < 4096 || maxb < minb || factor < 2 || warmup < 0 || rounds < 1 || iters < 0) {
  usage:
    if (rank == 0)
      fprintf(stderr, "usage: bench_redistribute [-b MIN>=4K] [-e MAX] [-f FACTOR>=2] [-n ITERS] "
                      "[-w WARMUP] [-r ROUNDS] [-c 0|1] [-k S0->R,P->R,P->S0,S0->S1,S1->R] "
                      "[-a auto|native|a2a]\n");
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
    printf("%-7s %11s %11s %11s %9s %9s %11s %11s %7s %6s %s\n", "case", "size(B)", "count",
           "time(us)", "algbw", "busbw", "raw(us)", "raw+cp(us)", "ratio", "#wrong", "algo");
    fflush(stdout);
  }
  double worst_contig = 0, worst_repack = 0, reduce_min = INFINITY, small_over = -INFINITY;
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
      float* rc = (float*)xmalloc(sizeof(float) * (size_t)numel);
      memcpy(ra, ref, sizeof(float) * (size_t)numel);
      memset(rb, 1, sizeof(float) * (size_t)numel);
      memset(rc, 1, sizeof(float) * (size_t)numel);
      int repack = kKind[c] == K_REPACK, nwho = repack ? 3 : 2;
      int it = iters > 0 ? iters : (int)fmax(3, fmin(200, 2e8 / (double)bytes));
      for (int w = 0; w < warmup; w++) {
        CHECK(dt_tensor_redistribute_into(x, y));
        raw_call((bench_case_t)c, n, numel, ra, rb, rc, repack);
      }
      long long wrong = 0;
      if (check) wrong = count_wrong(y, ref);
      double best[3] = {INFINITY, INFINITY, INFINITY};
      for (int r = 0; r < rounds; r++)
        for (int k = 0; k < nwho; k++) {
          int who = (k + r) % nwho;
          double t = time_calls(who, (bench_case_t)c, n, numel, it, x, y, ra, rb, rc);
          best[who] = fmin(best[who], t);
        }
      double lib = best[0], raw = best[1], base = repack ? best[2] : best[1];
      if (check) wrong += count_wrong(y, ref); /* still right after the timed calls */
      double us = lib * 1e6, raw_us = raw * 1e6, ratio = lib / base;
      double algbw = (double)bytes / lib / 1e9;
      double bf = c == C_P_R ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
      if (rank == 0) {
        char cp[32] = "-";
        if (repack) snprintf(cp, sizeof cp, "%.1f", base * 1e6);
        printf("%-7s %11lld %11lld %11.1f %9.2f %9.2f %11.1f %11s %7.3f %6lld %s\n", kNames[c],
               bytes, numel, us, algbw, algbw * bf, raw_us, cp, ratio, wrong,
               plan_algo(mesh, shape, src, dst));
        fflush(stdout);
      }
      if (bytes >= (1 << 20)) {
        if (kKind[c] == K_REPACK) worst_repack = fmax(worst_repack, ratio);
        else if (kKind[c] == K_REDUCE) reduce_min = fmin(reduce_min, raw / lib);
        else worst_contig = fmax(worst_contig, ratio);
      } else {
        small_over = fmax(small_over, us - base * 1e6);
      }
      wrong_total += wrong;
      CHECK(dt_tensor_destroy(x));
      CHECK(dt_tensor_destroy(y));
      free(ra);
      free(rb);
      free(rc);
      free(ref);
    }
  }
  if (rank == 0)
    printf("worst_ratio_contiguous=%.3f worst_ratio_repack_vs_copy=%.3f reduce_speedup_min=%.2f "
           "small_overhead_us=%.2f\n", worst_contig, worst_repack,
           isinf(reduce_min) ? 0.0 : reduce_min, isinf(small_over) ? 0.0 : small_over);
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return wrong_total ? 1 : 0;
}

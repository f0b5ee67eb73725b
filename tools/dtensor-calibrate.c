/* dtensor-calibrate - measures this machine's MPI collectives and fits the planner's cost model.
 *
 *   mpirun -np 4 dtensor-calibrate [-o FILE] [-e MAX_BYTES]
 *
 * For all-gather, all-reduce, reduce-scatter, all-to-all, broadcast and scatter it times sizes
 * from 4 KiB to MAX_BYTES (default 16 MiB; nccl-tests byte convention) on groups of 2 ranks and,
 * when the world is larger, on the whole world. Per group size a least-squares line
 * t = a + factor(n) * B / bw gives the latency a and bandwidth bw; a is split into
 * base_us + hops(n) * hop_us from the two group sizes (with one size, hop_us = 0). Writes
 * FILE (default $HOME/.cache/dtensor/cost_model.json), which dt_init loads. Exit 1 on errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtensor/dtensor.h"

static const dt_collective_t kColls[] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_REDUCE,
                                         DT_COLL_REDUCE_SCATTER, DT_COLL_ALL_TO_ALL,
                                         DT_COLL_BROADCAST, DT_COLL_SCATTER};
#define NCOLL 6

static double hops_of(dt_collective_t c, int n) {
  return c == DT_COLL_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
}
static double factor_of(dt_collective_t c, int n) {
  if (c == DT_COLL_BROADCAST) return 1.0;
  return c == DT_COLL_ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

/* One call of collective c on `comm` (n ranks) moving `bytes` (nccl-tests convention). */
static int run_once(dt_collective_t c, MPI_Comm comm, int n, long bytes, float* a, float* b) {
  int per = (int)(bytes / 4 / n), all = (int)(bytes / 4);
  switch (c) {
    case DT_COLL_ALL_GATHER: return MPI_Allgather(a, per, MPI_FLOAT, b, per, MPI_FLOAT, comm);
    case DT_COLL_ALL_REDUCE: return MPI_Allreduce(a, b, all, MPI_FLOAT, MPI_SUM, comm);
    case DT_COLL_REDUCE_SCATTER:
      return MPI_Reduce_scatter_block(a, b, per, MPI_FLOAT, MPI_SUM, comm);
    case DT_COLL_ALL_TO_ALL: return MPI_Alltoall(a, per, MPI_FLOAT, b, per, MPI_FLOAT, comm);
    case DT_COLL_BROADCAST: return MPI_Bcast(a, all, MPI_FLOAT, 0, comm);
    case DT_COLL_SCATTER: return MPI_Scatter(a, per, MPI_FLOAT, b, per, MPI_FLOAT, 0, comm);
    default: return MPI_ERR_ARG;
  }
}

/* Median-of-rounds time in microseconds (max over the ranks of `comm`). */
static double time_us(dt_collective_t c, MPI_Comm comm, int n, long bytes, float* a, float* b) {
  int iters = bytes <= (64 << 10) ? 200 : bytes <= (1 << 20) ? 40 : 8;
  double t[5];
  for (int w = 0; w < 3; w++) run_once(c, comm, n, bytes, a, b);
  for (int r = 0; r < 5; r++) {
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) run_once(c, comm, n, bytes, a, b);
    double dt = (MPI_Wtime() - t0) / iters * 1e6;
    MPI_Allreduce(&dt, &t[r], 1, MPI_DOUBLE, MPI_MAX, comm);
  }
  for (int i = 0; i < 5; i++) /* sort 5 */
    for (int j = i + 1; j < 5; j++)
      if (t[j] < t[i]) {
        double x = t[i];
        t[i] = t[j];
        t[j] = x;
      }
  return t[2];
}

int main(int argc, char** argv) {
  if (dt_init(&argc, &argv) != DT_SUCCESS) {
    fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
    return 1;
  }
  int rank, world;
  dt_world_rank(&rank);
  dt_world_size(&world);
  char path[1024] = "";
  long maxb = 16l << 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-o") && i + 1 < argc) snprintf(path, sizeof path, "%s", argv[++i]);
    else if (!strcmp(argv[i], "-e") && i + 1 < argc) maxb = atol(argv[++i]);
    else {
      if (rank == 0) fprintf(stderr, "usage: mpirun -np N dtensor-calibrate [-o FILE] [-e MAX_BYTES]\n");
      dt_finalize();
      return 1;
    }
  }
  if (world < 2) {
    if (rank == 0) fprintf(stderr, "dtensor-calibrate: run under mpirun with at least 2 ranks\n");
    dt_finalize();
    return 1;
  }
  if (maxb < 65536) maxb = 65536;
  if (path[0] == '\0') {
    const char* home = getenv("HOME");
    snprintf(path, sizeof path, "%s/.cache/dtensor", home ? home : ".");
    if (rank == 0) {
      char parent[1024];
      snprintf(parent, sizeof parent, "%s/.cache", home ? home : ".");
      mkdir(parent, 0755);
      mkdir(path, 0755);
    }
    strncat(path, "/cost_model.json", sizeof path - strlen(path) - 1);
  }
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank < world - world % 2 ? rank / 2 : MPI_UNDEFINED, rank, &pair);
  float* a = malloc((size_t)maxb);
  float* b = malloc((size_t)maxb);
  memset(a, 1, (size_t)maxb);
  memset(b, 1, (size_t)maxb);
  int sizes_n[2] = {2, world};
  int ngroups = world > 2 ? 2 : 1;
  if (rank == 0)
    printf("%-15s %5s %12s %12s %10s %10s\n", "collective", "n", "latency_us", "bw_GB/s",
           "base_us", "hop_us");
  for (int k = 0; k < NCOLL; k++) {
    dt_collective_t c = kColls[k];
    double lat[2] = {0, 0}, bw[2] = {0, 0};
    for (int g = 0; g < ngroups; g++) {
      int n = sizes_n[g];
      MPI_Comm comm = g == 0 ? pair : MPI_COMM_WORLD;
      /* Weighted least squares with w = 1/t^2 (relative error), so the small sizes set the
       * latency and the large ones the bandwidth. */
      double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
      for (long bytes = 4096; bytes <= maxb; bytes *= 4) {
        long B = bytes - bytes % (4l * n * n);
        double t = 0;
        if (comm != MPI_COMM_NULL) t = time_us(c, comm, n, B, a, b);
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double x = factor_of(c, n) * (double)B, w = t > 0 ? 1.0 / (t * t) : 0.0;
        sw += w;
        sx += w * x;
        sy += w * t;
        sxx += w * x * x;
        sxy += w * x * t;
      }
      double slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
      double icept = (sy - slope * sx) / sw;
      lat[g] = icept > 0 ? icept : 0;
      bw[g] = slope > 0 ? 1.0 / (slope * 1e3) : 1e3;
    }
    dt_cost_params_t p;
    if (ngroups == 2) {
      double dh = hops_of(c, sizes_n[1]) - hops_of(c, 2);
      p.hop_us = dh > 0 ? (lat[1] - lat[0]) / dh : 0;
      if (p.hop_us < 0) p.hop_us = 0;
      p.base_us = lat[0] - hops_of(c, 2) * p.hop_us;
      if (p.base_us < 0) p.base_us = 0;
      p.bw_gbps = bw[1]; /* the larger group is closer to how meshes are used */
    } else {
      p.base_us = lat[0];
      p.hop_us = 0;
      p.bw_gbps = bw[0];
    }
    if (dt_cost_model_set(c, &p) != DT_SUCCESS) {
      if (rank == 0) fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
      dt_finalize();
      return 1;
    }
    if (rank == 0)
      for (int g = 0; g < ngroups; g++)
        printf("%-15s %5d %12.2f %12.3f %10.2f %10.2f\n", dt_collective_name(c), sizes_n[g],
               lat[g], bw[g], p.base_us, p.hop_us);
  }
  int rc = 0;
  if (rank == 0) {
    if (dt_cost_model_save(path) != DT_SUCCESS) {
      fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
      rc = 1;
    } else {
      printf("wrote %s%s\n", path,
             ngroups == 1 ? " (one group size: hop_us = 0; run with 4+ ranks to fit it)" : "");
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (pair != MPI_COMM_NULL) MPI_Comm_free(&pair);
  free(a);
  free(b);
  dt_finalize();
  return rc;
}

/* cp.c - ring attention's overlap: how much of the ring's communication hides behind its blocks.
 *
 *   mpirun -np N build/bench/bench_cp [--seq S] [--iters K]      (default S 8192, K 5)
 *
 * Causal attention (B 1, H 4 heads of 64, f32, the load-balanced layout) with the sequence
 * sharded over a 1-D mesh of the N ranks (the cp dim), forward only, timed four ways (the slowest
 * rank's median of K after a warm-up, a barrier before each):
 *   ring       dt_ring_attention over the ring (algo 1): transfers posted before each step's
 *              blocks;
 *   gather     the all-gather variant (algo 2): one all-gather of k and v, then every block;
 *   ring_comm  the ring's transfers alone: N - 1 MPI_Sendrecv steps of this rank's k and v shards;
 *   gather_comm the all-gather alone (MPI_Allgather of k, then of v).
 * The blocks' compute is gather - gather_comm (the same blocks, nothing overlapped); the ring's
 * exposed communication is ring - compute, taken per iteration (the two variants alternate) and
 * its median used; overlap = 1 - exposed / ring_comm, clamped to [0, 1] (1: every transfer
 * hidden). Where the transfers are a small part of the step (shared memory on one machine) the
 * exposed time is within the timing noise, and the range printed says so. Last line:
 * cp_overlap=<overlap> ring_ms= compute_ms= ring_comm_ms=.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "bench.h"

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The slowest rank's median over k timings (microseconds). */
static double median_max(double* t, int k) {
  qsort(t, (size_t)k, sizeof *t, cmp_d);
  double m = t[k / 2], mx;
  MPI_Allreduce(&m, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return mx;
}

int main(int argc, char** argv) {
  int64_t S = 8192;
  int iters = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seq") && i + 1 < argc) S = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_cp [--seq S] [--iters K]\n");
      return 2;
    }
  }
  CHECK(dt_init(&argc, &argv));
  int n, rank;
  CHECK(dt_world_size(&n));
  CHECK(dt_world_rank(&rank));
  if (iters < 1 || iters > 1000 || S < 2 * n || S % (2 * n) != 0) {
    if (rank == 0)
      fprintf(stderr, "bench_cp: --seq must be a multiple of %d, --iters 1..1000\n", 2 * n);
    dt_finalize();
    return 2;
  }
  const char* names[1] = {"cp"};
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &n, names, NULL, &mesh));
  const int64_t B = 1, H = 4, Dh = 64, shape[4] = {B, H, S, Dh};
  dt_placement_t pl[1] = {dt_shard(2)};
  dt_tensor_t q, k, v;
  CHECK(dt_tensor_randn(mesh, DT_F32, 4, shape, pl, 1, &q));
  CHECK(dt_tensor_randn(mesh, DT_F32, 4, shape, pl, 2, &k));
  CHECK(dt_tensor_randn(mesh, DT_F32, 4, shape, pl, 3, &v));
  const int64_t local = B * H * (S / n) * Dh; /* floats in one rank's k (and v) shard */
  float* a = malloc(sizeof(float) * (size_t)local * 2);
  float* b = malloc(sizeof(float) * (size_t)local * 2 * (size_t)n);
  if (a == NULL || b == NULL) return 1;
  for (int64_t i = 0; i < 2 * local; i++) a[i] = (float)i;
  double t_ring[1000], t_gather[1000], t_rc[1000], t_gc[1000];
  for (int it = -1; it < iters; it++) { /* -1: warm-up */
    for (int a2 = 0; a2 < 2; a2++) {
      const int algo = (it % 2) ? 1 + a2 : 2 - a2; /* alternate which goes first */
      const int64_t ia[5] = {0, 1, 0, 1, algo};
      const dt_tensor_t in[3] = {q, k, v};
      dt_tensor_t o;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_us();
      CHECK(dt_op_run("ring_attention", 3, in, 5, ia, 0, NULL, &o));
      double t = now_us() - t0;
      CHECK(dt_tensor_destroy(o));
      if (it >= 0) (algo == 1 ? t_ring : t_gather)[it] = t;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_us();
    for (int s = 0; s + 1 < n; s++)
      MPI_Sendrecv(a, (int)(2 * local), MPI_FLOAT, (rank + 1) % n, 5, b, (int)(2 * local),
                   MPI_FLOAT, (rank + n - 1) % n, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    double trc = now_us() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_us();
    MPI_Allgather(a, (int)local, MPI_FLOAT, b, (int)local, MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Allgather(a + local, (int)local, MPI_FLOAT, b + local * n, (int)local, MPI_FLOAT,
                  MPI_COMM_WORLD);
    double tgc = now_us() - t0;
    if (it >= 0) {
      t_rc[it] = trc;
      t_gc[it] = tgc;
    }
  }
  /* exposed communication per iteration (ring and gather alternate, so a noisy moment hits
   * both): the paired difference, its median and range over the iterations */
  double ex[1000];
  for (int i = 0; i < iters; i++) ex[i] = t_ring[i] - (t_gather[i] - t_gc[i]);
  double emin = ex[0], emax = ex[0];
  for (int i = 1; i < iters; i++) {
    emin = ex[i] < emin ? ex[i] : emin;
    emax = ex[i] > emax ? ex[i] : emax;
  }
  double exposed = median_max(ex, iters);
  double ring = median_max(t_ring, iters), gather = median_max(t_gather, iters),
         rc = median_max(t_rc, iters), gc = median_max(t_gc, iters);
  double compute = gather - gc;
  double overlap = rc > 0.0 ? 1.0 - exposed / rc : 1.0;
  if (overlap < 0.0) overlap = 0.0;
  if (overlap > 1.0) overlap = 1.0;
  if (rank == 0) {
    printf("bench_cp: %d ranks, causal attention B 1 H 4 Dh 64 S %lld (%lld per rank), forward, "
           "median of %d, slowest rank\n", n, (long long)S, (long long)(S / n), iters);
    printf("ring %.2f ms; gather %.2f ms; ring_comm %.2f ms; gather_comm %.2f ms; compute %.2f ms; "
           "exposed %.2f ms\n", ring / 1e3, gather / 1e3, rc / 1e3, gc / 1e3, compute / 1e3,
           exposed / 1e3);
    printf("exposed per iteration (ring - (gather - gather_comm)): median %.2f ms, range %.2f .. "
           "%.2f ms (rank 0), against %.2f ms of transfers\n", exposed / 1e3, emin / 1e3,
           emax / 1e3, rc / 1e3);
    printf("cp_overlap=%.3f ring_ms=%.2f compute_ms=%.2f ring_comm_ms=%.2f\n", overlap, ring / 1e3,
           compute / 1e3, rc / 1e3);
  }
  free(a);
  free(b);
  CHECK(dt_tensor_destroy(q));
  CHECK(dt_tensor_destroy(k));
  CHECK(dt_tensor_destroy(v));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

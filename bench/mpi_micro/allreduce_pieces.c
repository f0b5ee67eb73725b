/* allreduce_pieces.c - plain-MPI microbenchmark behind docs/performance.md (2026-11-25): all-reduce as exchange + local reduce + all-gather (the library's a2a scheme) on 2 ranks,
 * in 1-64 pieces, with the time of each phase (the all-gather reads chunks the peer just wrote).
 *
 *   mpicc -O3 -march=native -o /tmp/mb bench/mpi_micro/allreduce_pieces.c && mpirun --allow-run-as-root -np 2 /tmp/mb
 *
 * Not built by CMake: it measures MPI alone, to tell what any implementation can reach here. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void reduce(float* o, const float* a, const float* b, long n) {
  for (long i = 0; i < n; i++) o[i] = a[i] + b[i];
}
int me, peer;
/* one-shot: a2a of halves, reduce, ag. pieces: number of chunks of the half */
static void ar(float* in, float* out, float* tmp, long n, int pieces, double* ph) {
  long h = n / 2, my0 = me * h, pe0 = peer * h, c = h / pieces;
  for (int p = 0; p < pieces; p++) {
    MPI_Request rq[4];
    double t0 = MPI_Wtime();
    MPI_Irecv(tmp + p * c, c, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &rq[0]);
    MPI_Isend(in + pe0 + p * c, c, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &rq[1]);
    MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
    double t1 = MPI_Wtime();
    reduce(out + my0 + p * c, in + my0 + p * c, tmp + p * c, c);
    double t2 = MPI_Wtime();
    MPI_Irecv(out + pe0 + p * c, c, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &rq[2]);
    MPI_Isend(out + my0 + p * c, c, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &rq[3]);
    MPI_Waitall(2, rq + 2, MPI_STATUSES_IGNORE);
    double t3 = MPI_Wtime();
    ph[0] += t1 - t0; ph[1] += t2 - t1; ph[2] += t3 - t2;
  }
}
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me); peer = 1 - me;
  for (long bytes = 1 << 20; bytes <= 16 << 20; bytes *= 4) {
    long n = bytes / 4;
    float *in = malloc(bytes), *out = malloc(bytes), *tmp = malloc(bytes), *o2 = malloc(bytes);
    for (long i = 0; i < n; i++) { in[i] = i % 251; out[i] = 1; tmp[i] = 1; o2[i] = 1; }
    int iters = (int)(2e8 / bytes); if (iters < 5) iters = 5;
    for (int rnd = 0; rnd < 3; rnd++) {
      int plist[] = {1, 2, 4, 8, 16, 32, 64};
      for (int pi = 0; pi < 7; pi++) {
        int pieces = plist[pi];
        if ((n / 2) % pieces) continue;
        double ph[3] = {0, 0, 0};
        ar(in, out, tmp, n, pieces, ph);
        ph[0] = ph[1] = ph[2] = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < iters; k++) ar(in, out, tmp, n, pieces, ph);
        double t = (MPI_Wtime() - t0) / iters * 1e6, tm;
        MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (me == 0) printf("%8ld pieces %2d  %8.1f us  (a2a %.1f red %.1f ag %.1f)\n", bytes, pieces, tm,
               ph[0] / iters * 1e6, ph[1] / iters * 1e6, ph[2] / iters * 1e6);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int k = 0; k < iters; k++) MPI_Allreduce(in, o2, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = (MPI_Wtime() - t0) / iters * 1e6, tm;
      MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (me == 0) printf("%8ld raw allreduce %8.1f us\n", bytes, tm);
    }
    free(in); free(out); free(tmp); free(o2);
  }
  MPI_Finalize();
}

/* eager_pieces.c - plain-MPI microbenchmark behind docs/performance.md (2026-11-25): a 2-rank exchange + MPI_Reduce_local with messages whole or cut into pieces of 4064, 4000,
 * 2048, 1024 bytes, against MPI_Allreduce (Open MPI's shared-memory eager limit).
 *
 *   mpicc -O3 -march=native -o /tmp/mb bench/mpi_micro/eager_pieces.c && mpirun --allow-run-as-root -np 2 /tmp/mb
 *
 * Not built by CMake: it measures MPI alone, to tell what any implementation can reach here. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int me, peer;
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me); peer = 1 - me;
  long pcs[] = {0, 4064, 4000, 2048, 1024};
  for (long bytes = 2048; bytes <= 65536; bytes *= 2) {
    long n = bytes / 4;
    float *in = malloc(bytes), *out = malloc(bytes), *scr = malloc(2 * bytes);
    for (long i = 0; i < n; i++) in[i] = i % 7;
    double best[6] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9};
    int iters = 2000;
    for (int rnd = 0; rnd < 5; rnd++)
      for (int v = 0; v < 6; v++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < iters; k++) {
          if (v == 5) { MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); continue; }
          long pc = pcs[v] ? pcs[v] / 4 : n;
          MPI_Request rq[128]; int nr = 0;
          for (long o = 0; o < n; o += pc) {
            long k2 = n - o < pc ? n - o : pc;
            MPI_Irecv(scr + peer * n + o, k2, MPI_FLOAT, peer, 8, MPI_COMM_WORLD, &rq[nr++]);
            MPI_Isend(in + o, k2, MPI_FLOAT, peer, 8, MPI_COMM_WORLD, &rq[nr++]);
          }
          MPI_Waitall(nr, rq, MPI_STATUSES_IGNORE);
          memcpy(scr + me * n, in, bytes);
          MPI_Reduce_local(scr + n, scr, n, MPI_FLOAT, MPI_SUM);
          memcpy(out, scr, bytes);
        }
        double t = (MPI_Wtime() - t0) / iters * 1e6, tm;
        MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (tm < best[v]) best[v] = tm;
      }
    if (me == 0) printf("%6ld whole %.2f  4064 %.2f  4000 %.2f  2048 %.2f  1024 %.2f  allreduce %.2f\n", bytes, best[0], best[1], best[2], best[3], best[4], best[5]);
    free(in); free(out); free(scr);
  }
  MPI_Finalize();
}

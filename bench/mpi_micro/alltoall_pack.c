/* alltoall_pack.c - plain-MPI microbenchmark behind docs/performance.md (2026-11-25): S0->S1 on n ranks: MPI_Alltoall + memcpy, packing + point-to-point, a send-side vector
 * datatype.
 *
 *   mpicc -O3 -march=native -o /tmp/mb bench/mpi_micro/alltoall_pack.c && mpirun --allow-run-as-root -np 2 /tmp/mb
 *
 * Not built by CMake: it measures MPI alone, to tell what any implementation can reach here. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int me, np;
#define COLS 256
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me); MPI_Comm_size(MPI_COMM_WORLD, &np);
  for (long bytes = 1 << 20; bytes <= 64 << 20; bytes *= 4) {
    long n = bytes / 4, rows = n / COLS, hc = COLS / np, hr = rows / np, blk = hr * hc;
    float *in = malloc(bytes / np), *out = malloc(bytes / np), *scr = malloc(bytes / np), *o2 = malloc(bytes / np), *o3 = malloc(bytes / np);
    for (long i = 0; i < hr; i++) for (long c = 0; c < COLS; c++) in[i * COLS + c] = ((me * hr + i) * COLS + c) % 251;
    memset(out, 1, bytes / np); memset(scr, 1, bytes / np); memset(o2, 1, bytes / np); memset(o3, 1, bytes / np);
    MPI_Datatype vt;
    MPI_Type_vector(hr, hc, COLS, MPI_FLOAT, &vt); MPI_Type_commit(&vt);
    int iters = (int)(2e8 / bytes); if (iters < 5) iters = 5; if (iters > 200) iters = 200;
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    MPI_Request rq[64];
    for (int rnd = 0; rnd < 5; rnd++) {
      for (int v = 0; v < 4; v++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < iters; k++) {
          int nr = 0;
          if (v == 0) { /* raw alltoall + memcpy */
            memcpy(o3, in, bytes / np);
            MPI_Alltoall(o3, blk, MPI_FLOAT, o2, blk, MPI_FLOAT, MPI_COMM_WORLD);
          } else if (v == 1 || v == 3) { /* pack remote blocks, p2p; own box copy */
            for (int q = 0; q < np; q++) {
              if (q == me) continue;
              for (long r = 0; r < hr; r++) memcpy(scr + q * blk + r * hc, in + r * COLS + q * hc, hc * 4);
              if (v == 3) {
                MPI_Irecv(out + q * blk, blk, MPI_FLOAT, q, 0, MPI_COMM_WORLD, &rq[nr++]);
                MPI_Isend(scr + q * blk, blk, MPI_FLOAT, q, 0, MPI_COMM_WORLD, &rq[nr++]);
              }
            }
            if (v == 1)
              for (int q = 0; q < np; q++) {
                if (q == me) continue;
                MPI_Irecv(out + q * blk, blk, MPI_FLOAT, q, 0, MPI_COMM_WORLD, &rq[nr++]);
                MPI_Isend(scr + q * blk, blk, MPI_FLOAT, q, 0, MPI_COMM_WORLD, &rq[nr++]);
              }
            for (long r = 0; r < hr; r++) memcpy(out + me * blk + r * hc, in + r * COLS + me * hc, hc * 4);
            MPI_Waitall(nr, rq, MPI_STATUSES_IGNORE);
          } else { /* send-side datatype */
            for (int q = 0; q < np; q++) {
              if (q == me) continue;
              MPI_Irecv(out + q * blk, blk, MPI_FLOAT, q, 0, MPI_COMM_WORLD, &rq[nr++]);
              MPI_Isend(in + q * hc, 1, vt, q, 0, MPI_COMM_WORLD, &rq[nr++]);
            }
            for (long r = 0; r < hr; r++) memcpy(out + me * blk + r * hc, in + r * COLS + me * hc, hc * 4);
            MPI_Waitall(nr, rq, MPI_STATUSES_IGNORE);
          }
        }
        double t = (MPI_Wtime() - t0) / iters * 1e6, tm;
        MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (tm < best[v]) best[v] = tm;
        if (v) {
          long bad = 0;
          for (long r = 0; r < rows; r++) for (long c = 0; c < hc; c++) bad += out[r * hc + c] != (float)((r * COLS + me * hc + c) % 251);
          if (bad) printf("rank %d v%d: %ld wrong\n", me, v, bad);
        }
      }
    }
    const char* nm[] = {"raw+cp", "pack all, p2p", "dtype send", "pack+post each"};
    if (me == 0) for (int v = 0; v < 4; v++) printf("np%d %9ld %-16s %8.1f us\n", np, bytes, nm[v], best[v]);
    free(in); free(out); free(scr); free(o2); free(o3);
  }
  MPI_Finalize();
}

/* strided_datatypes.c - plain-MPI microbenchmark behind docs/performance.md (2026-11-25): S0->S1 and S1->R on 2 ranks: raw collective + memcpy, packing, and MPI vector datatypes
 * on the send (S0->S1) or receive (S1->R) side.
 *
 *   mpicc -O3 -march=native -o /tmp/mb bench/mpi_micro/strided_datatypes.c && mpirun --allow-run-as-root -np 2 /tmp/mb
 *
 * Not built by CMake: it measures MPI alone, to tell what any implementation can reach here. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int me, peer;
#define COLS 256
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me); peer = 1 - me;
  for (long bytes = 1 << 18; bytes <= 64 << 20; bytes *= 4) {
    long n = bytes / 4, rows = n / COLS, h = n / 2, hc = COLS / 2, hr = rows / 2;
    float *in = malloc(bytes / 2), *out = malloc(bytes/2), *scr = malloc(bytes), *o2 = malloc(bytes), *o3 = malloc(bytes);
    float *in1 = malloc(bytes/2), *outr = malloc(bytes);
    /* in: rows hr..: global row r0+i, values g(r,c) = (r*COLS+c)%251 */
    for (long i = 0; i < hr; i++) for (long c = 0; c < COLS; c++) in[i * COLS + c] = ((me * hr + i) * COLS + c) % 251;
    for (long r = 0; r < rows; r++) for (long c = 0; c < hc; c++) in1[r * hc + c] = (r * COLS + me * hc + c) % 251;
    memset(out, 1, bytes/2); memset(scr, 1, bytes); memset(o2, 1, bytes); memset(o3, 1, bytes); memset(outr, 1, bytes);
    MPI_Datatype vt; /* hr rows of hc, stride COLS */
    MPI_Type_vector(hr, hc, COLS, MPI_FLOAT, &vt); MPI_Type_commit(&vt);
    MPI_Datatype gt; MPI_Type_vector(rows, hc, COLS, MPI_FLOAT, &gt); MPI_Type_commit(&gt);
    int iters = (int)(2e8 / bytes); if (iters < 5) iters = 5; if (iters > 200) iters = 200;
    for (int rnd = 0; rnd < 3; rnd++) {
      for (int v = 0; v < 6; v++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < iters; k++) {
          MPI_Request rq[2];
          if (v == 0) { /* raw alltoall + memcpy */
            memcpy(o3, in, bytes / 2);
            MPI_Alltoall(o3, h / 2, MPI_FLOAT, o2, h / 2, MPI_FLOAT, MPI_COMM_WORLD);
          } else if (v == 1) { /* derived send type, own box strided copy */
            MPI_Irecv(out + peer * hr * hc, hr * hc, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &rq[0]);
            MPI_Isend(in + peer * hc, 1, vt, peer, 0, MPI_COMM_WORLD, &rq[1]);
            for (long r = 0; r < hr; r++) memcpy(out + (me * hr + r) * hc, in + r * COLS + me * hc, hc * 4);
            MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
          } else if (v == 2) { /* pack peer box, send contiguous */
            for (long r = 0; r < hr; r++) memcpy(scr + r * hc, in + r * COLS + peer * hc, hc * 4);
            MPI_Irecv(out + peer * hr * hc, hr * hc, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &rq[0]);
            MPI_Isend(scr, hr * hc, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &rq[1]);
            for (long r = 0; r < hr; r++) memcpy(out + (me * hr + r) * hc, in + r * COLS + me * hc, hc * 4);
            MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
          } else if (v == 3) { /* raw allgather + memcpy (S1->R baseline) */
            MPI_Allgather(in1, h, MPI_FLOAT, o2, h, MPI_FLOAT, MPI_COMM_WORLD);
            memcpy(o3, o2, bytes);
          } else if (v == 4) { /* raw allgather */
            MPI_Allgather(in1, h, MPI_FLOAT, o2, h, MPI_FLOAT, MPI_COMM_WORLD);
          } else { /* S1->R derived recv */
            MPI_Irecv(outr + peer * hc, 1, gt, peer, 0, MPI_COMM_WORLD, &rq[0]);
            MPI_Isend(in1, h, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &rq[1]);
            for (long r = 0; r < rows; r++) memcpy(outr + r * COLS + me * hc, in1 + r * hc, hc * 4);
            MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
          }
        }
        double t = (MPI_Wtime() - t0) / iters * 1e6, tm;
        MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        const char* nm[] = {"S0S1 raw+cp", "S0S1 dtype", "S0S1 pack", "S1R raw+cp", "S1R raw", "S1R dtype"};
        if (me == 0) printf("%9ld %-12s %8.1f us\n", bytes, nm[v], tm);
      }
    }
    long bad = 0;
    for (long r = 0; r < rows; r++) for (long c = 0; c < hc; c++) bad += out[r * hc + c] != (float)((r * COLS + me * hc + c) % 251);
    for (long r = 0; r < rows; r++) for (long c = 0; c < COLS; c++) bad += outr[r * COLS + c] != (float)((r * COLS + c) % 251);
    if (bad) printf("rank %d: %ld wrong\n", me, bad);
    free(in); free(out); free(scr); free(o2); free(o3); free(in1); free(outr);
  }
  MPI_Finalize();
}

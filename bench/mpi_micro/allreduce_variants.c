/* allreduce_variants.c - plain-MPI microbenchmark behind docs/performance.md (2026-11-25): all-reduce variants on 2 ranks against MPI_Allreduce: the a2a scheme, one full exchange
 * with each rank reducing everything, and the a2a scheme with streaming stores.
 *
 *   mpicc -O3 -march=native -o /tmp/mb bench/mpi_micro/allreduce_variants.c && mpirun --allow-run-as-root -np 2 /tmp/mb
 *
 * Not built by CMake: it measures MPI alone, to tell what any implementation can reach here. */
#include <immintrin.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int me, peer;
static void reduce(float* o, const float* a, const float* b, long n) {
  for (long i = 0; i < n; i++) o[i] = a[i] + b[i];
}
static void reduce_nt(float* o, const float* a, const float* b, long n) {
  long i = 0;
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; i++) o[i] = a[i] + b[i];
  _mm_sfence();
}
static void xchg(const float* s, float* r, long n, int tag) {
  MPI_Request rq[2];
  MPI_Irecv(r, n, MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &rq[0]);
  MPI_Isend(s, n, MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &rq[1]);
  MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
}
static void run(int v, float* in, float* out, float* tmp, long n) {
  long h = n / 2, my0 = me * h, pe0 = peer * h;
  if (v == 0 || v == 2) {
    xchg(in + pe0, tmp, h, 0);
    (v == 0 ? reduce : reduce_nt)(out + my0, in + my0, tmp, h);
    xchg(out + my0, out + pe0, h, 1);
  } else if (v == 1) {
    xchg(in, tmp, n, 0);
    if (me == 0) reduce(out, in, tmp, n); else reduce(out, tmp, in, n);
  } else {
    MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
}
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me); peer = 1 - me;
  const char* nm[] = {"a2a+red+ag", "full xchg+red", "a2a+red_nt+ag", "raw allreduce"};
  for (long bytes = 1 << 18; bytes <= 16 << 20; bytes *= 4) {
    long n = bytes / 4;
    float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes), *tmp = aligned_alloc(64, bytes);
    for (long i = 0; i < n; i++) { in[i] = (i * 7) % 251; out[i] = 1; tmp[i] = 1; }
    int iters = (int)(1e8 / bytes); if (iters < 10) iters = 10; if (iters > 300) iters = 300;
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    for (int rnd = 0; rnd < 5; rnd++)
      for (int v = 0; v < 4; v++) {
        run(v, in, out, tmp, n);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < iters; k++) run(v, in, out, tmp, n);
        double t = (MPI_Wtime() - t0) / iters * 1e6, tm;
        MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (tm < best[v]) best[v] = tm;
        long bad = 0;
        for (long i = 0; i < n; i++) bad += out[i] != 2.0f * ((i * 7) % 251);
        if (bad) printf("v%d wrong %ld\n", v, bad);
      }
    if (me == 0) for (int v = 0; v < 4; v++) printf("%9ld %-16s %9.1f us\n", bytes, nm[v], best[v]);
    free(in); free(out); free(tmp);
  }
  MPI_Finalize();
}

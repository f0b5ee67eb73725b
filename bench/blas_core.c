/* blas_core.c - what dt_init's switch of OpenBLAS kernels is worth: SGEMM GFLOP/s on OpenBLAS's
 * generic kernels (as Debian 12's 0.3.21 loads them on CPUs newer than it) against the kernels
 * dt__cpu_blas_select switches to, alternated in one process, ROUNDS times.
 *
 *   OPENBLAS_CORETYPE=Prescott bench_blas_core [size] [rounds]
 *
 * Each round puts the generic kernels back the way OpenBLAS selects them at load (its exported
 * dynamic selection, with OPENBLAS_CORETYPE=Prescott), times them, then lets the library switch
 * (its own code path) and times again. Last line:
 * `blas_core_generic_gflops= blas_core_switched_gflops= blas_core_speedup= (min..max)`. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "bench.h"

extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static double gflops(int n, const float* a, const float* b, float* c) {
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now_us();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double g = 2.0 * n * (double)n * n / ((now_us() - t0) * 1e3);
    if (g > best) best = g;
  }
  return best;
}

static int cmp(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 1024, rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (n < 1 || rounds < 1 || rounds > 64) {
    fprintf(stderr, "usage: OPENBLAS_CORETYPE=Prescott %s [size >= 1] [rounds 1..64]\n", argv[0]);
    return 2;
  }
  if (gotoblas_dynamic_init == NULL || gotoblas_dynamic_quit == NULL) {
    fprintf(stderr, "this OpenBLAS has no dynamic kernel selection: nothing to measure\n");
    return 77;
  }
  float* a = malloc(sizeof(float) * (size_t)n * n);
  float* b = malloc(sizeof(float) * (size_t)n * n);
  float* c = malloc(sizeof(float) * (size_t)n * n);
  if (!a || !b || !c) return 1;
  for (size_t i = 0; i < (size_t)n * n; i++) {
    a[i] = (float)(i % 7) - 3.0f;
    b[i] = (float)(i % 5) - 2.0f;
  }
  double g0[64], g1[64], r[64];
  char switched[32] = "";
  for (int k = 0; k < rounds; k++) {
    setenv("OPENBLAS_CORETYPE", "Prescott", 1); /* the generic kernels, as OpenBLAS loads them */
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    if (strcasecmp(openblas_get_corename(), "prescott") != 0) return 1;
    g0[k] = gflops(n, a, b, c);
    unsetenv("OPENBLAS_CORETYPE");
    const char* said = dt__cpu_blas_select(); /* the library's switch */
    if (said == NULL || strstr(said, "switched") == NULL) {
      fprintf(stderr, "no switch on this CPU: %s\n", said ? said : "(nothing said)");
      return 77;
    }
    snprintf(switched, sizeof switched, "%s", openblas_get_corename());
    g1[k] = gflops(n, a, b, c);
    r[k] = g1[k] / g0[k];
    printf("round %d: %dx%dx%d sgemm, Prescott %.1f GFLOP/s, %s %.1f GFLOP/s, %.2fx\n", k, n, n,
           n, g0[k], switched, g1[k], r[k]);
  }
  qsort(g0, (size_t)rounds, sizeof g0[0], cmp);
  qsort(g1, (size_t)rounds, sizeof g1[0], cmp);
  qsort(r, (size_t)rounds, sizeof r[0], cmp);
  printf("blas_core_generic_gflops=%.1f blas_core_switched_gflops=%.1f blas_core_speedup=%.2f "
         "(%.2f..%.2f) switched_to=%s\n", g0[rounds / 2], g1[rounds / 2], r[rounds / 2], r[0],
         r[rounds - 1], switched);
  free(a);
  free(b);
  free(c);
  return 0;
}

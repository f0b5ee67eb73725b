/* test_blas_core.c - dt_init's choice of OpenBLAS kernels (dt__cpu_blas_select): when OpenBLAS
 * runs its generic kernels on a CPU with AVX2 / AVX-512 and the user named none, the library
 * switches it to the kernels the CPU allows, restores the environment, and the GEMMs give the same
 * products; OPENBLAS_CORETYPE (the user's choice) and DTENSOR_BLAS_AUTOCORE=0 keep OpenBLAS's.
 *
 * ctest starts it with OPENBLAS_CORETYPE=Prescott, so that OpenBLAS loads its generic kernels on
 * any x86-64 CPU, as Debian 12's 0.3.21 does by itself on CPUs newer than it (Sapphire and Emerald
 * Rapids); each case then removes the variable before asking, as on such a machine. One process,
 * cases in order: the first two leave the generic kernels in place, the last switches. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>
#include <cmocka.h>

#include "backend/backend.h"

static int have_avx2(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

static int have_avx512(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512cd");
#else
  return 0;
#endif
}

/* The generic kernels are loaded (ctest's OPENBLAS_CORETYPE=Prescott took), or the case is moot. */
static int generic_loaded(void) {
  const char* core = openblas_get_corename();
  return core != NULL && strcasecmp(core, "prescott") == 0;
}

/* C = A B for m x k and k x n row-major matrices of a fixed pseudo-random fill. */
static float* gemm(int m, int n, int k) {
  float* a = malloc(sizeof(float) * (size_t)m * (size_t)k);
  float* b = malloc(sizeof(float) * (size_t)k * (size_t)n);
  float* c = malloc(sizeof(float) * (size_t)m * (size_t)n);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  uint32_t s = 12345u;
  for (size_t i = 0; i < (size_t)m * (size_t)k; i++) {
    s = s * 1664525u + 1013904223u;
    a[i] = (float)((int)(s >> 9) % 2001 - 1000) / 1000.0f;
  }
  for (size_t i = 0; i < (size_t)k * (size_t)n; i++) {
    s = s * 1664525u + 1013904223u;
    b[i] = (float)((int)(s >> 9) % 2001 - 1000) / 1000.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  free(a);
  free(b);
  return c;
}

static const int kShapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 64, 64}, {257, 129, 511},
                                 {1000, 3, 1000}, {768, 768, 768}, {96, 2048, 1536}};
enum { kNShapes = sizeof kShapes / sizeof kShapes[0] };

/* The user named the kernels (any value of OPENBLAS_CORETYPE): nothing said, nothing changed. */
static void test_user_choice_kept(void** state) {
  (void)state;
  if (!generic_loaded()) skip();
  assert_int_equal(setenv("OPENBLAS_CORETYPE", "Prescott", 1), 0);
  assert_null(dt__cpu_blas_select());
  assert_true(generic_loaded());
  assert_string_equal(getenv("OPENBLAS_CORETYPE"), "Prescott");
}

/* DTENSOR_BLAS_AUTOCORE=0: the notice of old (what to set), the generic kernels kept. */
static void test_autocore_off(void** state) {
  (void)state;
  if (!generic_loaded()) skip();
  assert_int_equal(unsetenv("OPENBLAS_CORETYPE"), 0);
  assert_int_equal(setenv("DTENSOR_BLAS_AUTOCORE", "0", 1), 0);
  const char* said = dt__cpu_blas_select();
  assert_int_equal(unsetenv("DTENSOR_BLAS_AUTOCORE"), 0);
  assert_true(generic_loaded());
  assert_null(getenv("OPENBLAS_CORETYPE"));
  if (!have_avx2()) { /* nothing better to name */
    assert_null(said);
    return;
  }
  assert_non_null(said);
  assert_non_null(strstr(said, have_avx512() ? "OPENBLAS_CORETYPE=SkylakeX"
                                             : "OPENBLAS_CORETYPE=Haswell"));
  assert_non_null(strstr(said, "DTENSOR_BLAS_AUTOCORE=0 kept them"));
}

/* The switch: the CPU's kernels, the environment as found, the same products (to f32 rounding of
 * another summation order), and a second call finds nothing left to do. */
static void test_switch(void** state) {
  (void)state;
  if (!generic_loaded()) skip();
  float* before[kNShapes];
  for (int i = 0; i < kNShapes; i++)
    before[i] = gemm(kShapes[i][0], kShapes[i][1], kShapes[i][2]);
  assert_int_equal(unsetenv("OPENBLAS_CORETYPE"), 0);
  const char* said = dt__cpu_blas_select();
  assert_null(getenv("OPENBLAS_CORETYPE"));
  const char* want = have_avx512() ? "SkylakeX" : have_avx2() ? "Haswell" : NULL;
  if (want == NULL) {
    assert_null(said);
    assert_true(generic_loaded());
  } else {
    assert_non_null(said);
    assert_non_null(strstr(said, "switched it to its"));
    assert_string_equal(openblas_get_corename(), want);
    printf("# %s\n", said);
  }
  for (int i = 0; i < kNShapes; i++) {
    const int m = kShapes[i][0], n = kShapes[i][1], k = kShapes[i][2];
    float* after = gemm(m, n, k);
    double worst = 0;
    for (size_t j = 0; j < (size_t)m * (size_t)n; j++) {
      /* each term is below 1 in magnitude: k ulps of k is a bound on the order's difference */
      double d = fabs((double)after[j] - (double)before[i][j]);
      if (d > worst) worst = d;
    }
    const double bound = (double)k * (double)k * 0x1p-24;
    if (!(worst <= bound))
      fail_msg("gemm %dx%dx%d: the switched kernels differ by %g (bound %g)", m, n, k, worst,
               bound);
    free(after);
    free(before[i]);
  }
  assert_null(dt__cpu_blas_select()); /* not generic any more */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_user_choice_kept),
      cmocka_unit_test(test_autocore_off),
      cmocka_unit_test(test_switch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

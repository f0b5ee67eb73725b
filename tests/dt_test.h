/* dt_test.h - tiny assertion helpers for MPI tests (unit tests use cmocka).
 *
 * A failed check prints the rank, the expression, both values and the library's last error, then
 * ends the whole job with a non-zero status (MPI_Abort), so ctest sees the failure.
 */
#ifndef DT_TEST_H
#define DT_TEST_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtensor/dtensor.h"

/* MPI is running (initialized and not finalized: tests may run on after dt_finalize). */
static inline int dt_test_mpi_up(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  if (init) MPI_Finalized(&fin);
  return init && !fin;
}

static inline int dt_test_rank(void) {
  int r = 0;
  if (dt_test_mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

static inline void dt_test_die(void) {
  fflush(stdout);
  fflush(stderr);
  if (dt_test_mpi_up()) MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

#define DT_ASSERT_OK(call)                                                                    \
  do {                                                                                        \
    dt_status_t dt_t_st = (call);                                                             \
    if (dt_t_st != DT_SUCCESS) {                                                              \
      fprintf(stderr, "[rank %d] %s:%d: %s returned %s: %s\n", dt_test_rank(), __FILE__,      \
              __LINE__, #call, dt_status_name(dt_t_st), dt_last_error());                     \
      dt_test_die();                                                                          \
    }                                                                                         \
  } while (0)

#define DT_ASSERT_STATUS(call, want)                                                          \
  do {                                                                                        \
    dt_status_t dt_t_st = (call);                                                             \
    if (dt_t_st != (want)) {                                                                  \
      fprintf(stderr, "[rank %d] %s:%d: %s returned %s, expected %s (%s)\n", dt_test_rank(),  \
              __FILE__, __LINE__, #call, dt_status_name(dt_t_st), dt_status_name(want),       \
              dt_last_error());                                                               \
      dt_test_die();                                                                          \
    }                                                                                         \
  } while (0)

#define DT_ASSERT_EQ(a, b)                                                                    \
  do {                                                                                        \
    long long dt_t_a = (long long)(a), dt_t_b = (long long)(b);                               \
    if (dt_t_a != dt_t_b) {                                                                   \
      fprintf(stderr, "[rank %d] %s:%d: %s == %s failed: %lld vs %lld\n", dt_test_rank(),     \
              __FILE__, __LINE__, #a, #b, dt_t_a, dt_t_b);                                    \
      dt_test_die();                                                                          \
    }                                                                                         \
  } while (0)

#define DT_ASSERT_TRUE(cond, ...)                                                             \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "[rank %d] %s:%d: %s failed: ", dt_test_rank(), __FILE__, __LINE__,     \
              #cond);                                                                         \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fprintf(stderr, "\n");                                                                  \
      dt_test_die();                                                                          \
    }                                                                                         \
  } while (0)

#endif

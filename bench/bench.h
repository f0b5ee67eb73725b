/* bench.h - what every benchmark program needs: fail loudly on a status, a monotonic clock. */
#ifndef DT_BENCH_H
#define DT_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dtensor/dtensor.h"

#define CHECK(call)                                                                     \
  do {                                                                                  \
    dt_status_t st_ = (call);                                                           \
    if (st_ != DT_SUCCESS) {                                                            \
      fprintf(stderr, "%s: %s: %s\n", #call, dt_status_name(st_), dt_last_error());     \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static inline double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

#endif

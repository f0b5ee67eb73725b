/* plan.c - planning latency: uncached (cache miss) and cached plans on abstract meshes.
 *
 *   build/bench/bench_plan [-n ITERS]
 *
 * Every miss uses a new global shape so the cache cannot answer; the pairs cycle through all
 * source/target combinations of {R, S(0), S(1), S(2), P(sum)} per mesh dim that are legal. Prints
 * one row per mesh (mean, median and 99th percentile of the misses, mean of the hits) and ends
 * with `plan_miss_us_3d=<mean> plan_miss_us_3d_p99=<p99> plan_hit_us=<mean>` (the target:
 * a 3-D mesh miss within 50 us). No MPI needed.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtensor/dtensor.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static dt_placement_t opt5(int k) {
  switch (k) {
    case 0: return dt_replicate();
    case 1: return dt_shard(0);
    case 2: return dt_shard(1);
    case 3: return dt_shard(2);
    default: return dt_partial(DT_REDUCE_SUM);
  }
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* Returns the mean miss time; *med_us and *p99_us the median and 99th percentile. */
static double bench_mesh(int m, const int* mshape, int iters, double* med_us, double* p99_us,
                         double* hit_us) {
  double* samples = malloc(sizeof(double) * (size_t)iters);
  dt_mesh_t mesh;
  if (dt_mesh_create_abstract(m, mshape, NULL, &mesh) != DT_SUCCESS) {
    fprintf(stderr, "mesh: %s\n", dt_last_error());
    exit(1);
  }
  int npl = 1;
  for (int i = 0; i < m; i++) npl *= 5;
  double total = 0.0, hits = 0.0;
  int done = 0, nhit = 0;
  for (int it = 0; done < iters; it++) {
    int a = (it * 7919) % npl, b = (it * 104729 + 13) % npl, legal = 1;
    dt_placement_t src[4], dst[4];
    for (int i = 0, va = a, vb = b; i < m; i++, va /= 5, vb /= 5) {
      src[i] = opt5(va % 5);
      dst[i] = opt5(vb % 5);
      if (dst[i].kind == DT_PARTIAL && src[i].kind == DT_SHARD) legal = 0;
    }
    if (!legal) continue;
    int64_t shape[3] = {256 + it, 128, 64}; /* new shape: a guaranteed miss */
    dt_plan_t p;
    double t0 = now_us();
    dt_status_t st = dt_plan_create(mesh, DT_F32, 3, shape, src, dst, &p);
    double t1 = now_us();
    if (st != DT_SUCCESS) {
      fprintf(stderr, "plan: %s\n", dt_last_error());
      exit(1);
    }
    dt_plan_destroy(p);
    double t2 = now_us();
    st = dt_plan_create(mesh, DT_F32, 3, shape, src, dst, &p); /* same key: a hit */
    double t3 = now_us();
    dt_plan_destroy(p);
    total += t1 - t0;
    samples[done] = t1 - t0;
    hits += t3 - t2;
    nhit++;
    done++;
  }
  dt_mesh_destroy(mesh);
  qsort(samples, (size_t)iters, sizeof(double), cmp_d);
  *med_us = samples[iters / 2];
  *p99_us = samples[(size_t)(iters * 0.99)];
  free(samples);
  *hit_us = hits / nhit;
  return total / done;
}

int main(int argc, char** argv) {
  int iters = 20000;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "-n") == 0) iters = atoi(argv[++i]);
  if (iters < 1) iters = 1;
  static const int shapes[4][4] = {{8}, {2, 4}, {2, 2, 2}, {2, 2, 2, 2}};
  double miss3 = 0, p993 = 0, hit3 = 0;
  printf("%-10s %8s %12s %12s %12s %10s\n", "mesh", "plans", "miss_mean_us", "miss_med_us",
         "miss_p99_us", "hit_us");
  for (int k = 0; k < 4; k++) {
    double med, p99, hit, avg = bench_mesh(k + 1, shapes[k], iters, &med, &p99, &hit);
    char name[32];
    int w = 0;
    for (int i = 0; i <= k; i++) w += snprintf(name + w, sizeof name - (size_t)w, "%s%d", i ? "x" : "", shapes[k][i]);
    printf("%-10s %8d %12.2f %12.2f %12.2f %10.3f\n", name, iters, avg, med, p99, hit);
    if (k == 2) {
      miss3 = avg;
      p993 = p99;
      hit3 = hit;
    }
  }
  printf("plan_miss_us_3d=%.2f plan_miss_us_3d_p99=%.2f plan_hit_us=%.3f\n", miss3, p993, hit3);
  return 0;
}

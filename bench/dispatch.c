/* dispatch.c - op dispatch overhead and local GEMM efficiency.
 *
 *   build/bench/bench_dispatch        (one process; MPI starts as a singleton)
 *
 * - hit: dt_add on 8x8 f32 tensors on a 1-rank mesh (propagation-cache hit, no redistribution),
 *   minus the same element-wise add on preallocated buffers; includes allocating and freeing the
 *   output tensor. Also dt_mm on 8x8.
 * - miss: dt_op_select for mm on an abstract (2,2) mesh with a new shape every call (propagation
 *   and plan caches cannot help), input placements cycling over {R, S(0), S(1), P} per mesh dim.
 * - gemm: GFLOP/s of dt_mm on a 1-rank mesh (1024^3 and 512x2048x1024) against cblas_sgemm on the
 *   same shapes, alternating, best of 5 (one BLAS thread).
 * Last line: dispatch_hit_us=<x> dispatch_miss_us=<y> gemm_ratio=<z> (worst gemm shape).
 *
 *   mpirun -np N build/bench/bench_dispatch --peer [ROUNDS]
 *
 * The peer mode (bench/peer.sh, against PyTorch's DTensor in bench/peer_dispatch.py): on a 1-D
 * mesh of all ranks, `a + a` with a Shard(0) 512x512 f32 (no communication), whole call times
 * including the kernel and the output's allocation: hit = the same call repeated (best of ROUNDS
 * runs of 2,000 calls); miss = a new shape every call, (512, 512 + i) for i < 200, so neither the
 * propagation nor the plan cache can help (mean over the 200, once); again = the same 200 calls
 * repeated (hits with the misses' memory traffic: miss - again is the selection itself). Max over
 * ranks. Last line: peer_dispatch np=<n> hit_us=<x> miss_us=<y> again_us=<z>
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"


static volatile float g_sink;

/* Seconds per call of the slowest rank. */
static double max_over_ranks(double t) {
  double m;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

/* --peer: `a + a`, Shard(0), 512x512 f32 on a mesh of all ranks, cache hits and misses. */
static int peer_main(int rounds) {
  int n;
  CHECK(dt_world_size(&n));
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &n, NULL, NULL, &mesh));
  dt_placement_t s0[1] = {dt_shard(0)};
  enum { HIT_CALLS = 2000, MISS_CALLS = 200 };
  int64_t shape[2] = {512, 512};
  dt_tensor_t a, miss[MISS_CALLS];
  CHECK(dt_tensor_rand(mesh, DT_F32, 2, shape, s0, 1, &a));
  for (int i = 0; i < MISS_CALLS; i++) {
    int64_t si[2] = {512, 512 + i};
    CHECK(dt_tensor_rand(mesh, DT_F32, 2, si, s0, 2 + i, &miss[i]));
  }
  for (int i = 0; i < 100; i++) { /* warmup: fill the hit's caches, fault the allocator in */
    dt_tensor_t c;
    CHECK(dt_add(a, a, &c));
    CHECK(dt_tensor_destroy(c));
  }
  double hit = 1e30, mis = 1e30, again = 0;
  for (int r = 0; r < rounds; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_us();
    for (int i = 0; i < HIT_CALLS; i++) {
      dt_tensor_t c;
      CHECK(dt_add(a, a, &c));
      CHECK(dt_tensor_destroy(c));
    }
    hit = fmin(hit, max_over_ranks((now_us() - t0) / HIT_CALLS));
    if (r == 0) { /* the misses can run once: afterwards every shape is cached */
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_us();
      for (int i = 0; i < MISS_CALLS; i++) {
        dt_tensor_t c;
        CHECK(dt_add(miss[i], miss[i], &c));
        CHECK(dt_tensor_destroy(c));
      }
      mis = max_over_ranks((now_us() - t0) / MISS_CALLS);
      MPI_Barrier(MPI_COMM_WORLD); /* the same calls again: hits on the same cold data */
      t0 = now_us();
      for (int i = 0; i < MISS_CALLS; i++) {
        dt_tensor_t c;
        CHECK(dt_add(miss[i], miss[i], &c));
        CHECK(dt_tensor_destroy(c));
      }
      again = max_over_ranks((now_us() - t0) / MISS_CALLS);
    }
  }
  int rank;
  CHECK(dt_world_rank(&rank));
  if (rank == 0) printf("peer_dispatch np=%d hit_us=%.2f miss_us=%.2f again_us=%.2f\n", n, hit, mis,
                         again);
  CHECK(dt_tensor_destroy(a));
  for (int i = 0; i < MISS_CALLS; i++) CHECK(dt_tensor_destroy(miss[i]));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

int main(int argc, char** argv) {
  CHECK(dt_init(&argc, &argv));
  if (argc > 1 && !strcmp(argv[1], "--peer")) return peer_main(argc > 2 ? atoi(argv[2]) : 5);
  int one = 1;
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &one, NULL, NULL, &mesh));
  dt_placement_t r1[1] = {dt_replicate()};

  /* ---- hit overhead ---- */
  int64_t s8[2] = {8, 8};
  dt_tensor_t a, b;
  CHECK(dt_tensor_rand(mesh, DT_F32, 2, s8, r1, 1, &a));
  CHECK(dt_tensor_rand(mesh, DT_F32, 2, s8, r1, 2, &b));
  float *la, *lb, lo[64];
  CHECK(dt_tensor_to_local(a, (void**)&la, NULL));
  CHECK(dt_tensor_to_local(b, (void**)&lb, NULL));
  const int N = 200000;
  double best_lib = 1e30, best_raw = 1e30, best_mm = 1e30, best_mm_raw = 1e30;
  for (int round = 0; round < 5; round++) {
    double t0 = now_us();
    for (int i = 0; i < N; i++) {
      dt_tensor_t c;
      CHECK(dt_add(a, b, &c));
      dt_tensor_destroy(c);
    }
    double t1 = now_us();
    for (int i = 0; i < N; i++) {
      for (int k = 0; k < 64; k++) lo[k] = la[k] + lb[k];
      g_sink = lo[i & 63];
    }
    double t2 = now_us();
    for (int i = 0; i < N; i++) {
      dt_tensor_t c;
      CHECK(dt_mm(a, b, &c));
      dt_tensor_destroy(c);
    }
    double t3 = now_us();
    for (int i = 0; i < N; i++) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 8, 8, 8, 1.0f, la, 8, lb, 8, 0.0f,
                  lo, 8);
      g_sink = lo[i & 63];
    }
    double t4 = now_us();
    best_lib = fmin(best_lib, (t1 - t0) / N);
    best_raw = fmin(best_raw, (t2 - t1) / N);
    best_mm = fmin(best_mm, (t3 - t2) / N);
    best_mm_raw = fmin(best_mm_raw, (t4 - t3) / N);
  }
  double hit = best_lib - best_raw;
  printf("hit   add 8x8: library %.3f us, kernel alone %.3f us, overhead %.3f us\n", best_lib,
         best_raw, hit);
  printf("hit   mm  8x8: library %.3f us, cblas_sgemm %.3f us, overhead %.3f us\n", best_mm,
         best_mm_raw, best_mm - best_mm_raw);
  CHECK(dt_tensor_destroy(a));
  CHECK(dt_tensor_destroy(b));

  /* ---- miss: strategy selection with a new shape every call ---- */
  int s22[2] = {2, 2};
  dt_mesh_t am;
  CHECK(dt_mesh_create_abstract(2, s22, NULL, &am));
  const char* opts[4] = {"R", "S0", "S1", "P"};
  const int M = 4000;
  double tot = 0, worst = 0;
  for (int i = 0; i < M; i++) {
    dt_op_call_t c;
    memset(&c, 0, sizeof c);
    c.op = "mm";
    c.n_inputs = 2;
    c.in[0] = (dt_tensor_meta_t){DT_F32, 2, {512 + i, 256}};
    c.in[1] = (dt_tensor_meta_t){DT_F32, 2, {256, 128}};
    dt_placement_t in[2][DT_MAX_MESH_DIMS];
    char t0s[16], t1s[16];
    int x = i % 16, y = (i / 16) % 16, n;
    snprintf(t0s, sizeof t0s, "%s,%s", opts[x % 4], opts[x / 4]);
    snprintf(t1s, sizeof t1s, "%s,%s", opts[y % 4], opts[y / 4]);
    dt_placements_parse(t0s, in[0], 4, &n);
    dt_placements_parse(t1s, in[1], 4, &n);
    dt_op_choice_t ch;
    double t0 = now_us();
    CHECK(dt_op_select(am, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch));
    double dt = now_us() - t0;
    tot += dt;
    if (dt > worst) worst = dt;
  }
  double miss = tot / M;
  printf("miss  mm on a (2,2) mesh, new shape each call: mean %.2f us over %d calls\n", miss, M);
  CHECK(dt_mesh_destroy(am));

  /* ---- GEMM efficiency on one rank ---- */
  const int64_t shapes[2][3] = {{1024, 1024, 1024}, {512, 1024, 2048}};
  double worst_ratio = 1e30;
  for (int sidx = 0; sidx < 2; sidx++) {
    int64_t m = shapes[sidx][0], k = shapes[sidx][1], n = shapes[sidx][2];
    int64_t as[2] = {m, k}, bs[2] = {k, n};
    dt_tensor_t ta, tb;
    CHECK(dt_tensor_rand(mesh, DT_F32, 2, as, r1, 3, &ta));
    CHECK(dt_tensor_rand(mesh, DT_F32, 2, bs, r1, 4, &tb));
    float *pa, *pb;
    CHECK(dt_tensor_to_local(ta, (void**)&pa, NULL));
    CHECK(dt_tensor_to_local(tb, (void**)&pb, NULL));
    float* pc = malloc(sizeof(float) * (size_t)(m * n));
    memset(pc, 0, sizeof(float) * (size_t)(m * n));
    double bl = 1e30, br = 1e30;
    for (int round = 0; round < 9; round++) {
      double t0 = now_us();
      dt_tensor_t c;
      CHECK(dt_mm(ta, tb, &c));
      double t1 = now_us();
      CHECK(dt_tensor_destroy(c));
      double t2 = now_us();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, pa,
                  (int)k, pb, (int)n, 0.0f, pc, (int)n);
      double t3 = now_us();
      bl = fmin(bl, t1 - t0);
      br = fmin(br, t3 - t2);
    }
    double flops = 2.0 * m * n * k;
    double gl = flops / bl / 1e3, gr = flops / br / 1e3, ratio = gl / gr;
    printf("gemm  %lldx%lldx%lld: dt_mm %.1f GFLOP/s (%.0f us), cblas_sgemm %.1f GFLOP/s (%.0f us), "
           "ratio %.3f\n", (long long)m, (long long)k, (long long)n, gl, bl, gr, br, ratio);
    if (ratio < worst_ratio) worst_ratio = ratio;
    free(pc);
    CHECK(dt_tensor_destroy(ta));
    CHECK(dt_tensor_destroy(tb));
  }
  printf("dispatch_hit_us=%.3f dispatch_miss_us=%.2f gemm_ratio=%.3f\n", hit, miss, worst_ratio);
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

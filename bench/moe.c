/* moe.c - the routed mixture-of-experts layer against the dense reference, forward + backward.
 *
 *   build/bench/bench_moe [--iters N]      (one process; MPI starts as a singleton)
 *
 * One MoE layer (dt_nn_moe: router, top-2 of E = 8 experts, moe_route, grouped GEMMs, index_add;
 * against dt_nn_moe_dense: every expert on every token, weighted by a dense (N, E) gate matrix)
 * on a 1-rank mesh, f32, one BLAS thread: per shape (tokens N, hidden D, expert hidden F), the best
 * of --iters (default 3, after one warm-up) of forward + backward of loss = sum(out * r) + aux,
 * in tokens per second, and the grouped GEMM FLOPs per token the routed layer ran (forward
 * 6 D F top_k, three times that with the backward). The routed layer computes top_k / E = 1/4 of
 * the dense layer's expert arithmetic, so the ratio approaches 4 as the GEMMs dominate.
 * Last line: moe_routed_vs_dense=<geometric mean of the per-shape speedups>.
 *
 *   mpirun -np 2 build/bench/bench_moe [--iters N]      (expert parallelism)
 *
 * On more than one rank (a 1-D mesh over all of them), the routed layer with the tokens
 * replicated and the experts placed three ways: replicated (every rank computes every row),
 * tensor-parallel (w1/w3 Shard(1), w2 Shard(2): every rank every row, 1/n of F; one all-reduce of
 * the output) and expert-parallel (Shard(0): each rank routes 1/n of the tokens and computes its
 * experts' rows, two ragged all-to-alls each way). Step time is the slowest rank's (a barrier
 * before each step); tokens/s counts the global batch. Last line: moe_ep_vs_tp=<geometric mean>.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "bench.h"
#include "dtensor/nn.h"

enum { E = 8, TOP_K = 2 };

typedef struct {
  dt_var_t x, router, w1, w3, w2;
} layer_t;

static dt_var_t param(dt_mesh_t mesh, const char* plan, const char* name, int nd,
                      const int64_t* shape, double std) {
  dt_var_t v;
  CHECK(dt_nn_param(mesh, plan, name, nd, shape, DT_INIT_NORMAL, std, 1, &v));
  return v;
}

static const int64_t kShapes[][3] = {{512, 256, 512}, {1024, 256, 768}, {2048, 128, 384}};
enum { N_SHAPES = (int)(sizeof kShapes / sizeof kShapes[0]) };

/* forward + backward once; returns microseconds */
static double step(dt_tape_t tape, const layer_t* l, dt_var_t r, int routed) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  dt_var_t out, aux, p, s, loss;
  if (routed)
    CHECK(
        dt_nn_moe(tape, l->x, l->router, l->w1, l->w3, l->w2, TOP_K, 0.0, 0.01, &out, &aux, NULL));
  else
    CHECK(dt_nn_moe_dense(tape, l->x, l->router, l->w1, l->w3, l->w2, TOP_K, 0.01, &out, &aux));
  dt_var_t pr[2] = {out, r};
  CHECK(dt_ag_op(tape, "mul", 2, pr, 0, NULL, 0, NULL, 1, &p));
  const int64_t all[1] = {0};
  CHECK(dt_ag_op(tape, "sum", 1, &p, 1, all, 0, NULL, 1, &s));
  dt_var_t sa[2] = {s, aux};
  CHECK(dt_ag_op(tape, "add", 2, sa, 0, NULL, 0, NULL, 1, &loss));
  CHECK(dt_tape_backward(tape, loss));
  double t1 = now_us() - t0, slowest;
  MPI_Allreduce(&t1, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(dt_tape_reset(tape));
  const dt_var_t* v = &l->x;
  for (int i = 0; i < 5; i++) CHECK(dt_var_zero_grad(v[i]));
  return slowest;
}

static layer_t layer(dt_mesh_t mesh, const char* plan, int64_t N, int64_t D, int64_t F) {
  const int64_t sx[2] = {N, D}, sr[2] = {E, D}, s1[3] = {E, F, D}, s2[3] = {E, D, F};
  layer_t l = {param(mesh, plan, "x", 2, sx, 1.0), param(mesh, plan, "router", 2, sr, 0.1),
               param(mesh, plan, "w1", 3, s1, 0.05), param(mesh, plan, "w3", 3, s1, 0.05),
               param(mesh, plan, "w2", 3, s2, 0.05)};
  return l;
}

static void layer_destroy(layer_t* l) {
  const dt_var_t* v = &l->x;
  for (int i = 0; i < 5; i++) CHECK(dt_var_destroy(v[i]));
}

/* Expert placements on n ranks: replicated, tensor-parallel, expert-parallel. */
static int bench_parallel(dt_mesh_t mesh, int n, int iters, int rank) {
  static const char* const kPlans[3] = {"*=R", "w1=S(1);w3=S(1);w2=S(2);*=R",
                                        "w1=S(0);w3=S(0);w2=S(0);*=R"};
  if (rank == 0) {
    printf("# MoE layer, E = %d experts, top-%d, f32, %d ranks (1-D mesh), tokens replicated, "
           "forward + backward, best of %d, slowest rank\n", E, TOP_K, n, iters);
    printf("# %6s %5s %5s | %16s %16s %16s | %8s\n", "N", "D", "F", "replicated tok/s",
           "TP (F) tok/s", "EP (E) tok/s", "EP / TP");
  }
  double log_sum = 0.0;
  for (int s = 0; s < N_SHAPES; s++) {
    const int64_t N = kShapes[s][0], D = kShapes[s][1], F = kShapes[s][2];
    const int64_t sx[2] = {N, D};
    dt_placement_t r1[1] = {dt_replicate()};
    double tps[3];
    for (int k = 0; k < 3; k++) {
      layer_t l = layer(mesh, kPlans[k], N, D, F);
      dt_tensor_t rt;
      CHECK(dt_tensor_randn(mesh, DT_F32, 2, sx, r1, 5, &rt));
      dt_var_t r;
      CHECK(dt_var_leaf(rt, 0, &r));
      dt_tape_t tape;
      CHECK(dt_tape_create(&tape));
      double best = 1e300;
      step(tape, &l, r, 1);
      for (int it = 0; it < iters; it++) {
        double us = step(tape, &l, r, 1);
        if (us < best) best = us;
      }
      tps[k] = (double)N / (best * 1e-6);
      CHECK(dt_tape_destroy(tape));
      CHECK(dt_var_destroy(r));
      layer_destroy(&l);
    }
    if (rank == 0)
      printf("  %6lld %5lld %5lld | %16.0f %16.0f %16.0f | %7.2fx\n", (long long)N, (long long)D,
             (long long)F, tps[0], tps[1], tps[2], tps[2] / tps[1]);
    log_sum += log(tps[2] / tps[1]);
  }
  if (rank == 0) printf("moe_ep_vs_tp=%.2f\n", exp(log_sum / N_SHAPES));
  return 0;
}

int main(int argc, char** argv) {
  int iters = 3;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: bench_moe [--iters N]\n");
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  CHECK(dt_init(&argc, &argv));
  int world, rank;
  CHECK(dt_world_size(&world));
  CHECK(dt_world_rank(&rank));
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  if (world > 1) {
    bench_parallel(mesh, world, iters, rank);
    CHECK(dt_mesh_destroy(mesh));
    CHECK(dt_finalize());
    return 0;
  }
  dt_placement_t r1[1] = {dt_replicate()};
  const int n_shapes = N_SHAPES;
  printf("# MoE layer, E = %d experts, top-%d, f32, 1 rank, forward + backward, best of %d\n", E,
         TOP_K, iters);
  printf("# %6s %5s %5s | %14s %14s %8s | %22s\n", "N", "D", "F", "routed tok/s", "dense tok/s",
         "speedup", "routed GEMM FLOP/token");
  double log_sum = 0.0;
  for (int s = 0; s < n_shapes; s++) {
    const int64_t N = kShapes[s][0], D = kShapes[s][1], F = kShapes[s][2];
    const int64_t sx[2] = {N, D};
    layer_t l = layer(mesh, NULL, N, D, F);
    dt_tensor_t rt;
    CHECK(dt_tensor_randn(mesh, DT_F32, 2, sx, r1, 5, &rt));
    dt_tape_t tape;
    CHECK(dt_tape_create(&tape));
    dt_var_t r;
    CHECK(dt_var_leaf(rt, 0, &r));
    double best[2] = {1e300, 1e300};
    int64_t flops = 0;
    for (int routed = 1; routed >= 0; routed--) {
      step(tape, &l, r, routed); /* warm-up: caches */
      for (int it = 0; it < iters; it++) {
        CHECK(dt_grouped_mm_flops_reset());
        double us = step(tape, &l, r, routed);
        if (us < best[routed]) best[routed] = us;
        if (routed) CHECK(dt_grouped_mm_flops(&flops));
      }
    }
    double tps_r = (double)N / (best[1] * 1e-6), tps_d = (double)N / (best[0] * 1e-6);
    printf("  %6lld %5lld %5lld | %14.0f %14.0f %7.2fx | %22.0f\n", (long long)N, (long long)D,
           (long long)F, tps_r, tps_d, tps_r / tps_d, (double)flops / (double)N);
    log_sum += log(tps_r / tps_d);
    CHECK(dt_tape_destroy(tape));
    CHECK(dt_var_destroy(r));
    layer_destroy(&l);
  }
  printf("moe_routed_vs_dense=%.2f\n", exp(log_sum / n_shapes));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}

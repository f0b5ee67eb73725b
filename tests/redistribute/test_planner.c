/* test_planner.c - planner optimality on abstract meshes (no MPI).
 *
 * For meshes (4), (2,2), (2,4), (2,2,2), with and without flattened dims, and shapes with even,
 * uneven and size-1 dims, every source/target pair from {R, S(0), S(1), P(sum)} per mesh dim:
 *  - the plan is a legal path: each step is an edge of the transition system, applied in order
 *    from the source it ends at the target, and the step costs add up to the plan cost;
 *  - its cost equals the exhaustive minimum over ALL step sequences, computed independently by
 *    Bellman-Ford relaxation over every placement state with no pruning of tensor dims;
 *  - it is never worse than PyTorch's greedy plan when the greedy walk succeeds.
 * Plus named cases whose optimal plans are known by hand.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "redistribute/planner.h"

static dt_placement_t opt4(int k) {
  switch (k) {
    case 0: return dt_replicate();
    case 1: return dt_shard(0);
    case 2: return dt_shard(1);
    default: return dt_partial(DT_REDUCE_SUM);
  }
}

/* Exhaustive minimum cost from src to dst over every state of the unpruned space. */
static double brute_min(dt_mesh_t mesh, const dt_layout_t* l, const dt_placement_t* dst) {
  dt_search_space_t sp = dt__plan_space(mesh, l, dst, 0);
  dt_placement_t opts[16];
  int k = 0;
  opts[k++] = dt_replicate();
  for (int d = 0; d < l->ndim; d++)
    if (sp.dmask & (1u << d)) opts[k++] = dt_shard(d);
  for (int op = 0; op < DT_REDUCE_COUNT; op++)
    if (sp.pmask & (1u << op)) opts[k++] = dt_partial((dt_reduce_op_t)op);
  int m = l->mesh_ndim, ns = 1;
  for (int i = 0; i < m; i++) ns *= k;
  double* dist = malloc(sizeof(double) * (size_t)ns);
  dt_step_t* nb = malloc(sizeof(dt_step_t) * DT_MAX_EDGES);
  for (int s = 0; s < ns; s++) dist[s] = INFINITY;
  /* state index <-> placements by linear search over opts (independent of the planner's codec) */
  int src = 0, goal = 0;
  for (int i = m - 1; i >= 0; i--) {
    int a = 0, b = 0;
    for (int o = 0; o < k; o++) {
      if (dt_placement_equal(opts[o], l->pl[i])) a = o;
      if (dt_placement_equal(opts[o], dst[i])) b = o;
    }
    src = src * k + a;
    goal = goal * k + b;
  }
  dist[src] = 0.0;
  for (int changed = 1, iter = 0; changed && iter < ns; iter++) {
    changed = 0;
    for (int s = 0; s < ns; s++) {
      if (isinf(dist[s])) continue;
      dt_placement_t cur[DT_MAX_MESH_DIMS];
      for (int i = 0, v = s; i < m; i++, v /= k) cur[i] = opts[v % k];
      int ne = dt__plan_neighbors(l, 4, cur, &sp, nb);
      for (int e = 0; e < ne; e++) {
        int t = 0;
        for (int i = m - 1; i >= 0; i--) {
          int o = 0;
          while (!dt_placement_equal(opts[o], nb[e].after[i])) o++;
          t = t * k + o;
        }
        double nd = dist[s] + nb[e].cost_us;
        if (nd < dist[t] * (1.0 - 1e-12)) { /* INF * x stays INF: no NaN from INF - INF */
          dist[t] = nd;
          changed = 1;
        }
      }
    }
  }
  double r = dist[goal];
  free(dist);
  free(nb);
  return r;
}

/* Replays the plan's steps as edges from src and checks it ends at dst with the stated cost. */
static void check_path(dt_mesh_t mesh, const dt_layout_t* l, const dt_placement_t* dst,
                       dt_plan_t plan) {
  dt_search_space_t sp = dt__plan_space(mesh, l, dst, 0);
  dt_step_t nb[DT_MAX_EDGES];
  dt_placement_t cur[DT_MAX_MESH_DIMS];
  memcpy(cur, l->pl, sizeof cur);
  int n;
  double total = 0.0, cost;
  assert_int_equal(dt_plan_num_steps(plan, &n), DT_SUCCESS);
  assert_int_equal(dt_plan_cost(plan, &cost), DT_SUCCESS);
  for (int k = 0; k < n; k++) {
    dt_plan_step_t ps;
    assert_int_equal(dt_plan_get_step(plan, k, &ps), DT_SUCCESS);
    dt_placement_t next[DT_MAX_MESH_DIMS];
    memcpy(next, cur, sizeof next);
    for (int q = 0; q < ps.n_mesh_dims; q++) {
      assert_true(dt_placement_equal(ps.from[q], cur[ps.mesh_dims[q]]));
      next[ps.mesh_dims[q]] = ps.to[q];
    }
    int ne = dt__plan_neighbors(l, 4, cur, &sp, nb), found = 0;
    for (int e = 0; e < ne && !found; e++) {
      int same = nb[e].coll == ps.coll;
      for (int i = 0; i < l->mesh_ndim; i++) same &= dt_placement_equal(nb[e].after[i], next[i]);
      if (same) {
        found = 1;
        assert_true(fabs(nb[e].cost_us - ps.cost_us) < 1e-9);
      }
    }
    assert_true(found);
    total += ps.cost_us;
    memcpy(cur, next, sizeof cur);
  }
  for (int i = 0; i < l->mesh_ndim; i++) assert_true(dt_placement_equal(cur[i], dst[i]));
  assert_true(fabs(total - cost) <= 1e-9 * (1.0 + cost));
}

/* Called on every mesh run_mesh creates (per-dim cost parameters), when set. */
static void (*g_mesh_setup)(dt_mesh_t mesh);

static long long run_mesh(int m, const int* mshape, int nflat, const int (*flat)[4],
                          const int* flat_n, int ndim, const int64_t* shape) {
  dt_mesh_t mesh;
  assert_int_equal(dt_mesh_create_abstract(m, mshape, NULL, &mesh), DT_SUCCESS);
  if (g_mesh_setup) g_mesh_setup(mesh);
  for (int f = 0; f < nflat; f++)
    assert_int_equal(dt_mesh_flatten(mesh, flat_n[f], flat[f], NULL, NULL), DT_SUCCESS);
  int npl = 1;
  for (int i = 0; i < m; i++) npl *= 4;
  long long checked = 0;
  for (int a = 0; a < npl; a++)
    for (int b = 0; b < npl; b++) {
      dt_placement_t src[4], dst[4];
      int legal = 1;
      for (int i = 0, va = a, vb = b; i < m; i++, va /= 4, vb /= 4) {
        src[i] = opt4(va % 4);
        dst[i] = opt4(vb % 4);
        if (dst[i].kind == DT_PARTIAL && src[i].kind == DT_SHARD) legal = 0;
      }
      dt_plan_t plan = NULL, greedy = NULL;
      dt_status_t st = dt_plan_create(mesh, DT_F32, ndim, shape, src, dst, &plan);
      if (!legal) {
        assert_int_equal(st, DT_ERR_UNSUPPORTED);
        assert_null(plan);
        continue;
      }
      assert_int_equal(st, DT_SUCCESS);
      dt_layout_t l;
      assert_int_equal(dt__layout_init(&l, m, mshape, ndim, shape, src), DT_SUCCESS);
      check_path(mesh, &l, dst, plan);
      double cost, best = brute_min(mesh, &l, dst);
      assert_true(isfinite(best));
      dt_plan_cost(plan, &cost);
      if (fabs(cost - best) > 1e-9 * (1.0 + best)) {
        char ps[64], pd[64], pl[256];
        dt_placements_format(src, m, ",", ps, sizeof ps);
        dt_placements_format(dst, m, ",", pd, sizeof pd);
        dt_plan_format(plan, pl, sizeof pl);
        fail_msg("%s -> %s: plan %s costs %.6f, exhaustive minimum %.6f", ps, pd, pl, cost, best);
      }
      if (dt_plan_create_greedy(mesh, DT_F32, ndim, shape, src, dst, &greedy) == DT_SUCCESS) {
        double gc;
        dt_plan_cost(greedy, &gc);
        assert_true(cost <= gc + 1e-9 * (1.0 + gc));
        dt_plan_destroy(greedy);
      }
      dt_plan_destroy(plan);
      checked++;
    }
  dt_mesh_destroy(mesh);
  return checked;
}

/* The last one is large (1 GiB in f32): bandwidth terms dominate, so reduce-scatter + all-gather
 * through a dim outside src/dst can beat all-reduce. */
static const int64_t kShapes[][3] = {{8, 8, 0},  {13, 5, 0}, {8, 8, 8},
                                     {8, 8, 1},  {6, 3, 4},  {4096, 64, 1024}};
static const int kNdims[] = {2, 2, 3, 3, 3, 3};
#define NSHAPES 6

static void test_optimal_1d(void** state) {
  (void)state;
  int ms[1] = {4};
  for (int s = 0; s < NSHAPES; s++) assert_true(run_mesh(1, ms, 0, NULL, NULL, kNdims[s], kShapes[s]) > 0);
}

static void test_optimal_2d(void** state) {
  (void)state;
  const int flat[1][4] = {{0, 1}};
  const int fn[1] = {2};
  int m22[2] = {2, 2}, m24[2] = {2, 4};
  for (int s = 0; s < NSHAPES; s++) {
    run_mesh(2, m22, 0, NULL, NULL, kNdims[s], kShapes[s]);
    run_mesh(2, m24, 0, NULL, NULL, kNdims[s], kShapes[s]);
    run_mesh(2, m22, 1, flat, fn, kNdims[s], kShapes[s]);
  }
}

static void test_optimal_3d(void** state) {
  (void)state;
  const int flat[2][4] = {{0, 1, 2}, {1, 2}};
  const int fn[2] = {3, 2};
  int m222[3] = {2, 2, 2};
  for (int s = 0; s < NSHAPES; s += 2) {
    run_mesh(3, m222, 0, NULL, NULL, kNdims[s], kShapes[s]);
    run_mesh(3, m222, 2, flat, fn, kNdims[s], kShapes[s]);
  }
}

/* Hand-checked plans. */
static int count_of(dt_plan_t p, dt_collective_t c) {
  int n;
  assert_int_equal(dt_plan_count(p, c, &n), DT_SUCCESS);
  return n;
}

static dt_plan_t plan_of(dt_mesh_t mesh, int ndim, const int64_t* shape, const char* from,
                         const char* to) {
  dt_placement_t s[4], d[4];
  int n1, n2;
  assert_int_equal(dt_placements_parse(from, s, 4, &n1), DT_SUCCESS);
  assert_int_equal(dt_placements_parse(to, d, 4, &n2), DT_SUCCESS);
  dt_plan_t p;
  assert_int_equal(dt_plan_create(mesh, DT_F32, ndim, shape, s, d, &p), DT_SUCCESS);
  return p;
}

static void test_known_plans(void** state) {
  (void)state;
  dt_mesh_t m1, m2;
  int s4[1] = {4}, s22[2] = {2, 2};
  int64_t sh2[2] = {64, 64}, sh3[3] = {16, 16, 16};
  assert_int_equal(dt_mesh_create_abstract(1, s4, NULL, &m1), DT_SUCCESS);
  assert_int_equal(dt_mesh_create_abstract(2, s22, NULL, &m2), DT_SUCCESS);
  dt_plan_t p;
  int n;
  p = plan_of(m1, 2, sh2, "S0", "R");
  assert_int_equal(count_of(p, DT_COLL_ALL_GATHER), 1);
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  dt_plan_destroy(p);
  p = plan_of(m1, 2, sh2, "P", "R");
  assert_int_equal(count_of(p, DT_COLL_ALL_REDUCE), 1);
  dt_plan_destroy(p);
  p = plan_of(m1, 2, sh2, "P", "S0");
  assert_int_equal(count_of(p, DT_COLL_REDUCE_SCATTER), 1);
  dt_plan_destroy(p);
  p = plan_of(m1, 2, sh2, "S0", "S1");
  assert_int_equal(count_of(p, DT_COLL_ALL_TO_ALL), 1);
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  dt_plan_destroy(p);
  p = plan_of(m1, 2, sh2, "R", "S1"); /* local slice, no communication */
  assert_int_equal(count_of(p, DT_COLL_LOCAL), 1);
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  dt_plan_destroy(p);
  p = plan_of(m1, 2, sh2, "S(-1)", "S1"); /* negative dims normalize: nothing to do */
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 0);
  dt_plan_destroy(p);
  /* [S0,S1] -> [S0,S0]: one all-to-all on mesh dim 1 */
  p = plan_of(m2, 2, sh2, "S0,S1", "S0,S0");
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  assert_int_equal(count_of(p, DT_COLL_ALL_TO_ALL), 1);
  dt_plan_destroy(p);
  /* [S1,S1] -> [S1,S2]: one all-to-all (the pre-2024 PyTorch planner used two all-gathers) */
  p = plan_of(m2, 3, sh3, "S1,S1", "S1,S2");
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  assert_int_equal(count_of(p, DT_COLL_ALL_TO_ALL), 1);
  dt_plan_destroy(p);
  /* [S0,S0] -> [R,R]: two all-gathers, inner first; merged into one with a flattened dim */
  p = plan_of(m2, 2, sh2, "S0,S0", "R,R");
  assert_int_equal(count_of(p, DT_COLL_ALL_GATHER), 2);
  dt_plan_step_t st;
  dt_plan_get_step(p, 0, &st);
  assert_int_equal(st.mesh_dims[0], 1);
  dt_plan_destroy(p);
  int both[2] = {0, 1};
  assert_int_equal(dt_mesh_flatten(m2, 2, both, "dp", NULL), DT_SUCCESS);
  p = plan_of(m2, 2, sh2, "S0,S0", "R,R");
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  dt_plan_get_step(p, 0, &st);
  assert_int_equal(st.n_mesh_dims, 2);
  dt_plan_destroy(p);
  p = plan_of(m2, 2, sh2, "P,P", "R,R");
  assert_int_equal(count_of(p, DT_COLL_ALL_REDUCE), 1);
  dt_plan_destroy(p);
  /* Format of the debug line. */
  p = plan_of(m1, 2, sh2, "S0", "R");
  char buf[128];
  assert_int_equal(dt_plan_format(p, buf, sizeof buf), DT_SUCCESS);
  assert_string_equal(buf, "S(0) -> R");
  assert_int_equal(dt_plan_format(p, buf, 4), DT_ERR_INVALID_ARG);
  dt_plan_destroy(p);
  dt_mesh_destroy(m1);
  dt_mesh_destroy(m2);
}

/* Plans are cached: the second request is a hit and returns the same steps; a cost model change
 * invalidates the cache. */
static void test_cache(void** state) {
  (void)state;
  dt_mesh_t m;
  int s22[2] = {2, 2};
  int64_t sh[2] = {32, 32};
  assert_int_equal(dt_mesh_create_abstract(2, s22, NULL, &m), DT_SUCCESS);
  dt_counters_t c0, c1;
  dt_counters_get(m, &c0);
  dt_plan_t a = plan_of(m, 2, sh, "S0,S1", "R,R");
  dt_plan_t b = plan_of(m, 2, sh, "S0,S1", "R,R");
  dt_counters_get(m, &c1);
  assert_int_equal(c1.plan_cache_misses - c0.plan_cache_misses, 1);
  assert_int_equal(c1.plan_cache_hits - c0.plan_cache_hits, 1);
  assert_ptr_equal(a, b);
  dt_cost_params_t p;
  assert_int_equal(dt_cost_model_get(DT_COLL_ALL_GATHER, &p), DT_SUCCESS);
  p.bw_gbps *= 2;
  assert_int_equal(dt_cost_model_set(DT_COLL_ALL_GATHER, &p), DT_SUCCESS);
  dt_plan_t c = plan_of(m, 2, sh, "S0,S1", "R,R");
  dt_counters_get(m, &c1);
  assert_int_equal(c1.plan_cache_misses - c0.plan_cache_misses, 2);
  double ca, cc;
  dt_plan_cost(a, &ca); /* the old plan stays valid while referenced */
  dt_plan_cost(c, &cc);
  assert_true(cc < ca);
  dt_plan_destroy(a);
  dt_plan_destroy(b);
  dt_plan_destroy(c);
  dt_cost_model_reset();
  dt_mesh_destroy(m);
}

/* Reductions pick their algorithm by cost: native below the crossover, all-to-all above; forcing
 * overrides; the all-to-all parameters are their own, saved and loaded under "<coll>_a2a". */
static dt_coll_algo_t algo_of(dt_mesh_t m, int64_t rows, const char* from, const char* to,
                              dt_collective_t want) {
  int64_t sh[2] = {rows, 1024};
  dt_plan_t p = plan_of(m, 2, sh, from, to);
  int n;
  dt_plan_num_steps(p, &n);
  assert_int_equal(n, 1);
  dt_plan_step_t st;
  assert_int_equal(dt_plan_get_step(p, 0, &st), DT_SUCCESS);
  assert_int_equal(st.coll, want);
  double est;
  assert_int_equal(dt_cost_estimate(st.coll, 4, st.nbytes, &est), DT_SUCCESS);
  assert_true(fabs(est - st.cost_us) <= 1e-9 * est);
  dt_plan_destroy(p);
  return st.algo;
}

/* Steps of collective c in the plan that use the all-to-all algorithm. */
static int a2a_steps(dt_mesh_t m, int64_t rows, const char* from, const char* to,
                     dt_collective_t c) {
  int64_t sh[2] = {rows, 1024};
  dt_plan_t p = plan_of(m, 2, sh, from, to);
  int n, k = 0;
  dt_plan_num_steps(p, &n);
  for (int i = 0; i < n; i++) {
    dt_plan_step_t st;
    assert_int_equal(dt_plan_get_step(p, i, &st), DT_SUCCESS);
    k += st.coll == c && st.algo == DT_ALGO_A2A;
  }
  dt_plan_destroy(p);
  return k;
}

static void test_algos(void** state) {
  (void)state;
  dt_cost_model_reset();
  dt_mesh_t m;
  int s4[1] = {4};
  assert_int_equal(dt_mesh_create_abstract(1, s4, NULL, &m), DT_SUCCESS);
  /* 4 KiB vs 16 MiB per rank */
  assert_int_equal(algo_of(m, 1, "P", "S1", DT_COLL_REDUCE_SCATTER), DT_ALGO_NATIVE);
  assert_int_equal(algo_of(m, 1, "P", "R", DT_COLL_ALL_REDUCE), DT_ALGO_NATIVE);
  assert_int_equal(algo_of(m, 4096, "P", "S0", DT_COLL_REDUCE_SCATTER), DT_ALGO_A2A);
  assert_int_equal(algo_of(m, 4096, "P", "R", DT_COLL_ALL_REDUCE), DT_ALGO_A2A);
  /* the estimate is the cheaper line */
  dt_cost_params_t nat, a2a;
  assert_int_equal(dt_cost_model_get_algo(DT_COLL_ALL_REDUCE, DT_ALGO_NATIVE, &nat), DT_SUCCESS);
  assert_int_equal(dt_cost_model_get_algo(DT_COLL_ALL_REDUCE, DT_ALGO_A2A, &a2a), DT_SUCCESS);
  assert_true(a2a.bw_gbps > nat.bw_gbps);
  /* forcing */
  assert_int_equal(dt_cost_model_force_algo(DT_ALGO_NATIVE), DT_SUCCESS);
  assert_int_equal(algo_of(m, 4096, "P", "S0", DT_COLL_REDUCE_SCATTER), DT_ALGO_NATIVE);
  assert_int_equal(dt_cost_model_force_algo(DT_ALGO_A2A), DT_SUCCESS);
  assert_int_equal(algo_of(m, 1, "P", "R", DT_COLL_ALL_REDUCE), DT_ALGO_A2A);
  assert_int_equal(dt_cost_model_force_algo(DT_ALGO_COUNT), DT_SUCCESS);
  assert_int_equal(algo_of(m, 1, "P", "R", DT_COLL_ALL_REDUCE), DT_ALGO_NATIVE);
  assert_int_equal(dt_cost_model_force_algo((dt_coll_algo_t)7), DT_ERR_INVALID_ARG);
  /* parameters of one algorithm move its crossover */
  dt_cost_params_t slow = a2a;
  slow.bw_gbps = nat.bw_gbps / 2;
  assert_int_equal(dt_cost_model_set_algo(DT_COLL_ALL_REDUCE, DT_ALGO_A2A, &slow), DT_SUCCESS);
  assert_int_equal(a2a_steps(m, 4096, "P", "R", DT_COLL_ALL_REDUCE), 0);
  assert_int_equal(algo_of(m, 4096, "P", "S0", DT_COLL_REDUCE_SCATTER), DT_ALGO_A2A);
  /* errors: collectives without the algorithm, bad parameters */
  assert_int_equal(dt_cost_model_get_algo(DT_COLL_ALL_GATHER, DT_ALGO_A2A, &nat),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_cost_model_set_algo(DT_COLL_ALL_TO_ALL, DT_ALGO_A2A, &a2a),
                   DT_ERR_INVALID_ARG);
  dt_cost_params_t bad = {1.0, 1.0, 0.0};
  assert_int_equal(dt_cost_model_set_algo(DT_COLL_REDUCE_SCATTER, DT_ALGO_A2A, &bad),
                   DT_ERR_INVALID_ARG);
  assert_string_equal(dt_coll_algo_name(DT_ALGO_A2A), "a2a");
  /* save / load round trip of the a2a keys */
  char path[] = "/tmp/dt_cost_algosXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(dt_cost_model_save(path), DT_SUCCESS);
  FILE* f = fopen(path, "r");
  char text[4096] = {0};
  assert_true(fread(text, 1, sizeof text - 1, f) > 0);
  fclose(f);
  assert_non_null(strstr(text, "\"all_reduce_a2a\""));
  assert_non_null(strstr(text, "\"reduce_scatter_a2a\""));
  assert_null(strstr(text, "\"all_gather_a2a\""));
  dt_cost_model_reset();
  assert_int_equal(algo_of(m, 4096, "P", "R", DT_COLL_ALL_REDUCE), DT_ALGO_A2A);
  assert_int_equal(dt_cost_model_load(path), DT_SUCCESS);
  dt_cost_params_t back;
  assert_int_equal(dt_cost_model_get_algo(DT_COLL_ALL_REDUCE, DT_ALGO_A2A, &back), DT_SUCCESS);
  assert_true(back.bw_gbps == slow.bw_gbps);
  assert_int_equal(a2a_steps(m, 4096, "P", "R", DT_COLL_ALL_REDUCE), 0);
  remove(path);
  /* optimality holds with every algorithm forced (the brute force costs the same lines) */
  for (int a = 0; a < DT_ALGO_COUNT; a++) {
    assert_int_equal(dt_cost_model_force_algo((dt_coll_algo_t)a), DT_SUCCESS);
    for (int s = 0; s < NSHAPES; s++) assert_true(run_mesh(1, s4, 0, NULL, NULL, kNdims[s], kShapes[s]) > 0);
  }
  dt_cost_model_reset();
  dt_mesh_destroy(m);
}

/* Snapshot of every (collective, algorithm) parameter set, to check that refused calls change
 * nothing. */
static void cost_snapshot(dt_cost_params_t snap[DT_COLL_COUNT][DT_ALGO_COUNT]) {
  memset(snap, 0, sizeof(dt_cost_params_t) * DT_COLL_COUNT * DT_ALGO_COUNT);
  for (int c = 0; c < DT_COLL_COUNT; c++)
    for (int a = 0; a < DT_ALGO_COUNT; a++)
      dt_cost_model_get_algo((dt_collective_t)c, (dt_coll_algo_t)a, &snap[c][a]);
}

static void assert_err_mentions(const char* a, const char* b) {
  const char* e = dt_last_error();
  if (strstr(e, a) == NULL || (b != NULL && strstr(e, b) == NULL))
    fail_msg("message '%s' lacks '%s' / '%s'", e, a, b ? b : "");
}

/* Values outside [0, 1e6] us and [1e-6, 1e6] GB/s (NaN and infinities included) are refused by
 * the setters with a message naming the field and its range; the model is unchanged. */
static void test_cost_ranges_set(void** state) {
  (void)state;
  dt_cost_model_reset();
  dt_cost_params_t before[DT_COLL_COUNT][DT_ALGO_COUNT], after[DT_COLL_COUNT][DT_ALGO_COUNT];
  cost_snapshot(before);
  const struct {
    dt_cost_params_t p;
    const char* field;
  } bad[] = {
      {{6.6, 2.7, 1e-300}, "bw_gbps"}, {{6.6, 2.7, 0.0}, "bw_gbps"},
      {{6.6, 2.7, -1.0}, "bw_gbps"},   {{6.6, 2.7, NAN}, "bw_gbps"},
      {{6.6, 2.7, INFINITY}, "bw_gbps"}, {{6.6, 2.7, 2e6}, "bw_gbps"},
      {{6.6, 2.7, 9e-7}, "bw_gbps"},   {{-1.0, 2.7, 10.0}, "base_us"},
      {{NAN, 2.7, 10.0}, "base_us"},   {{INFINITY, 2.7, 10.0}, "base_us"},
      {{1.5e6, 2.7, 10.0}, "base_us"}, {{6.6, -0.5, 10.0}, "hop_us"},
      {{6.6, NAN, 10.0}, "hop_us"},    {{6.6, -INFINITY, 10.0}, "hop_us"},
      {{6.6, 1e300, 10.0}, "hop_us"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    assert_int_equal(dt_cost_model_set(DT_COLL_ALL_GATHER, &bad[k].p), DT_ERR_INVALID_ARG);
    assert_err_mentions(bad[k].field, strcmp(bad[k].field, "bw_gbps") ? "[0, 1e+06]"
                                                                       : "[1e-06, 1e+06]");
    assert_err_mentions("all_gather", NULL);
    assert_int_equal(dt_cost_model_set_algo(DT_COLL_ALL_REDUCE, DT_ALGO_A2A, &bad[k].p),
                     DT_ERR_INVALID_ARG);
    assert_err_mentions(bad[k].field, "all_reduce_a2a");
    cost_snapshot(after);
    assert_memory_equal(before, after, sizeof before);
  }
  dt_cost_model_reset();
}

/* The extremes of the valid ranges give finite costs, and the planner still finds every plan:
 * a bandwidth of 1e-300 GB/s used to overflow costs to infinity, after which every larger
 * redistribution failed with "no redistribution path found". */
static void test_cost_ranges_extreme(void** state) {
  (void)state;
  const dt_cost_params_t slowest = {1e6, 1e6, 1e-6}, fastest = {0.0, 0.0, 1e6};
  const dt_cost_params_t* ends[2] = {&slowest, &fastest};
  int s8[2] = {4, 2};
  dt_mesh_t m;
  assert_int_equal(dt_mesh_create_abstract(2, s8, NULL, &m), DT_SUCCESS);
  for (int e = 0; e < 2; e++) {
    for (int c = 0; c < DT_COLL_COUNT; c++)
      for (int a = 0; a < DT_ALGO_COUNT; a++)
        if (a == DT_ALGO_NATIVE || c == DT_COLL_ALL_REDUCE || c == DT_COLL_REDUCE_SCATTER)
          assert_int_equal(dt_cost_model_set_algo((dt_collective_t)c, (dt_coll_algo_t)a, ends[e]),
                           DT_SUCCESS);
    double est;
    assert_int_equal(dt_cost_estimate(DT_COLL_ALL_REDUCE, 1 << 20, UINT64_MAX, &est), DT_SUCCESS);
    assert_true(isfinite(est));
    /* 2^47 f32 elements (512 TiB), near the layout limit of 2^48 elements */
    const int64_t big[2] = {(int64_t)1 << 24, (int64_t)1 << 23};
    const char* pairs[][2] = {{"P,P", "R,R"}, {"S0,S1", "S1,S0"}, {"P,S0", "S1,R"},
                              {"R,P", "S0,R"}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
      dt_plan_t p = plan_of(m, 2, big, pairs[k][0], pairs[k][1]);
      double cost;
      assert_int_equal(dt_plan_cost(p, &cost), DT_SUCCESS);
      assert_true(isfinite(cost) && cost >= 0.0);
      dt_plan_destroy(p);
    }
  }
  dt_cost_model_reset();
  dt_mesh_destroy(m);
}

static dt_status_t load_text(const char* text) {
  char path[] = "/tmp/dt_cost_rangesXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t n = strlen(text);
  assert_int_equal(write(fd, text, n), (ssize_t)n);
  close(fd);
  dt_status_t st = dt_cost_model_load(path);
  remove(path);
  return st;
}

/* The loaders refuse out-of-range values and anything after the JSON object, from a file and from
 * memory, and apply nothing; white space after the object is fine. */
static void test_cost_load_strict(void** state) {
  (void)state;
  dt_cost_model_reset();
  dt_cost_params_t before[DT_COLL_COUNT][DT_ALGO_COUNT], after[DT_COLL_COUNT][DT_ALGO_COUNT];
  cost_snapshot(before);
  const struct {
    const char* text;
    const char* a;
    const char* b;
  } bad[] = {
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10}} trailing", "trailing",
       "byte 59"},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10}}{}", "trailing", NULL},
      {"{}]", "trailing", NULL},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 1e-300}}", "bw_gbps",
       "[1e-06, 1e+06]"},
      {"{\"all_reduce_a2a\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 1e400}}", "bw_gbps",
       "all_reduce_a2a"},
      {"{\"reduce_scatter\": {\"base_us\": 1e7, \"hop_us\": 1, \"bw_gbps\": 1}}", "base_us",
       "[0, 1e+06]"},
      {"{\"scatter\": {\"base_us\": 0, \"hop_us\": -1e-9, \"bw_gbps\": 1}}", "hop_us", "scatter"},
      {"{\"all_gather\": [1, 2, 3]}", "all_gather", "numbers"},
      /* misspelt and repeated keys (each would leave a value as it was, silently) */
      {"{\"alll_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10}}", "unknown key",
       "alll_gather"},
      {"{\"compute\": {\"gemm_gflopz\": 5}}", "unknown key \"gemm_gflopz\"", "\"compute\""},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10, \"bw\": 2}}",
       "unknown key \"bw\"", "\"all_gather\""},
      {"{\"nccl\": {\"gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10}}}",
       "unknown key \"gather\"", "\"nccl\""},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10}, \"all_gather\": "
       "{\"base_us\": 2, \"hop_us\": 1, \"bw_gbps\": 10}}", "\"all_gather\" given twice", NULL},
      {"{\"compute\": {\"op_us\": 1, \"op_us\": 2}}", "\"op_us\" given twice", "\"compute\""},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    assert_int_equal(load_text(bad[k].text), DT_ERR_INVALID_ARG);
    assert_err_mentions(bad[k].a, bad[k].b);
    assert_int_equal(dt_cost_model_load_string(bad[k].text, strlen(bad[k].text)),
                     DT_ERR_INVALID_ARG);
    assert_err_mentions(bad[k].a, bad[k].b);
    cost_snapshot(after);
    assert_memory_equal(before, after, sizeof before);
  }
  /* a NUL inside, a NULL text */
  assert_int_equal(dt_cost_model_load_string("{}\0{}", 5), DT_ERR_INVALID_ARG);
  assert_err_mentions("NUL", NULL);
  assert_int_equal(dt_cost_model_load_string(NULL, 0), DT_ERR_INVALID_ARG);
  /* valid: white space after the object; only the first len bytes count */
  const char* ok = "{\"all_gather\": {\"base_us\": 1e6, \"hop_us\": 0, \"bw_gbps\": 1e-6}}\n \t";
  assert_int_equal(load_text(ok), DT_SUCCESS);
  dt_cost_params_t q;
  assert_int_equal(dt_cost_model_get(DT_COLL_ALL_GATHER, &q), DT_SUCCESS);
  assert_true(q.base_us == 1e6 && q.hop_us == 0.0 && q.bw_gbps == 1e-6);
  /* checked, not applied; "inter_node" (the trainer's) accepted and not read */
  const char* chk = "{\"all_gather\": {\"base_us\": 7, \"hop_us\": 7, \"bw_gbps\": 7}, "
                    "\"inter_node\": {\"all_gather\": {\"base_us\": 1}}}";
  assert_int_equal(dt_cost_model_check_string(chk, strlen(chk)), DT_SUCCESS);
  assert_int_equal(dt_cost_model_get(DT_COLL_ALL_GATHER, &q), DT_SUCCESS);
  assert_true(q.base_us == 1e6 && q.hop_us == 0.0 && q.bw_gbps == 1e-6);
  assert_int_equal(dt_cost_model_check_string("{\"x\": 1}", 8), DT_ERR_INVALID_ARG);
  assert_err_mentions("unknown key \"x\"", NULL);
  const char* two = "{\"all_gather\": {\"base_us\": 2, \"hop_us\": 3, \"bw_gbps\": 4}}GARBAGE";
  assert_int_equal(dt_cost_model_load_string(two, strlen(two) - 7), DT_SUCCESS);
  assert_int_equal(dt_cost_model_get(DT_COLL_ALL_GATHER, &q), DT_SUCCESS);
  assert_true(q.base_us == 2.0 && q.hop_us == 3.0 && q.bw_gbps == 4.0);
  dt_cost_model_reset();
}

/* Per-mesh-dim cost parameters: dim 1 a slow link (1 GB/s, 50 us), dim 0 a fast one. */
static void slow_dim1(dt_mesh_t mesh) {
  const dt_cost_params_t fast = {2.0, 0.5, 400.0}, slow = {50.0, 10.0, 1.0};
  for (int c = DT_COLL_ALL_GATHER; c < DT_COLL_COUNT; c++) {
    assert_int_equal(dt_mesh_set_cost_model(mesh, 0, (dt_collective_t)c, DT_ALGO_NATIVE, &fast),
                     DT_SUCCESS);
    assert_int_equal(dt_mesh_set_cost_model(mesh, 1, (dt_collective_t)c, DT_ALGO_NATIVE, &slow),
                     DT_SUCCESS);
  }
}

static void test_mesh_costs(void** state) {
  (void)state;
  dt_cost_model_reset();
  int m22[2] = {2, 2}, m24[2] = {2, 4};
  dt_mesh_t mesh;
  assert_int_equal(dt_mesh_create_abstract(2, m24, NULL, &mesh), DT_SUCCESS);
  /* get: the global model until set, the dim's own after, the global again after NULL */
  dt_cost_params_t g, q;
  assert_int_equal(dt_cost_model_get(DT_COLL_ALL_REDUCE, &g), DT_SUCCESS);
  assert_int_equal(dt_mesh_get_cost_model(mesh, 1, DT_COLL_ALL_REDUCE, DT_ALGO_NATIVE, &q),
                   DT_SUCCESS);
  assert_memory_equal(&g, &q, sizeof q);
  const dt_cost_params_t slow = {50.0, 10.0, 1.0};
  assert_int_equal(dt_mesh_set_cost_model(mesh, 1, DT_COLL_ALL_REDUCE, DT_ALGO_NATIVE, &slow),
                   DT_SUCCESS);
  assert_int_equal(dt_mesh_get_cost_model(mesh, 1, DT_COLL_ALL_REDUCE, DT_ALGO_NATIVE, &q),
                   DT_SUCCESS);
  assert_memory_equal(&slow, &q, sizeof q);
  assert_int_equal(dt_mesh_get_cost_model(mesh, 0, DT_COLL_ALL_REDUCE, DT_ALGO_NATIVE, &q),
                   DT_SUCCESS);
  assert_memory_equal(&g, &q, sizeof q); /* the other dim keeps the global model */
  /* estimates follow the formula with the dim's parameters (native all-reduce on 4 ranks) */
  double est, gest;
  const uint64_t nb = 1 << 20;
  assert_int_equal(dt_cost_model_force_algo(DT_ALGO_NATIVE), DT_SUCCESS);
  assert_int_equal(dt_mesh_cost_estimate(mesh, 2u, DT_COLL_ALL_REDUCE, nb, &est), DT_SUCCESS);
  assert_true(fabs(est - (50.0 + 6 * 10.0 + 1.5 * nb / 1e3)) < 1e-6);
  assert_int_equal(dt_cost_estimate(DT_COLL_ALL_REDUCE, 4, nb, &gest), DT_SUCCESS);
  assert_true(est > gest);
  /* a group of dims takes its slowest member's parameters (8 ranks) */
  assert_int_equal(dt_mesh_cost_estimate(mesh, 3u, DT_COLL_ALL_REDUCE, nb, &est), DT_SUCCESS);
  assert_true(fabs(est - (50.0 + 14 * 10.0 + 1.75 * nb / 1e3)) < 1e-6);
  assert_int_equal(dt_cost_model_force_algo(DT_ALGO_COUNT), DT_SUCCESS);
  /* a cached plan is priced again after a change: P,P -> R,R on (2, 4) */
  dt_placement_t pp[2] = {dt_partial(DT_REDUCE_SUM), dt_partial(DT_REDUCE_SUM)};
  dt_placement_t rr[2] = {dt_replicate(), dt_replicate()};
  const int64_t shape[2] = {1024, 1024};
  dt_plan_t plan;
  double c0, c1, c2;
  assert_int_equal(dt_plan_create(mesh, DT_F32, 2, shape, pp, rr, &plan), DT_SUCCESS);
  assert_int_equal(dt_plan_cost(plan, &c0), DT_SUCCESS);
  dt_plan_destroy(plan);
  const dt_cost_params_t slower = {500.0, 100.0, 0.1};
  for (int a = 0; a < DT_ALGO_COUNT; a++)
    for (int c = DT_COLL_ALL_GATHER; c < DT_COLL_COUNT; c++) {
      dt_status_t st = dt_mesh_set_cost_model(mesh, 1, (dt_collective_t)c, (dt_coll_algo_t)a,
                                              &slower);
      assert_true(st == DT_SUCCESS || (a != DT_ALGO_NATIVE && st == DT_ERR_INVALID_ARG));
    }
  assert_int_equal(dt_plan_create(mesh, DT_F32, 2, shape, pp, rr, &plan), DT_SUCCESS);
  assert_int_equal(dt_plan_cost(plan, &c1), DT_SUCCESS);
  assert_true(c1 > c0);
  /* with dim 1 that slow the plan reduce-scatters over the fast dim first, so the slow dim's
   * steps move fewer bytes than the whole buffer (an all-reduce there would move all of it) */
  int n;
  assert_int_equal(dt_plan_num_steps(plan, &n), DT_SUCCESS);
  uint64_t slow_bytes = 0;
  for (int k = 0; k < n; k++) {
    dt_plan_step_t ps;
    assert_int_equal(dt_plan_get_step(plan, k, &ps), DT_SUCCESS);
    for (int q2 = 0; q2 < ps.n_mesh_dims; q2++)
      if (ps.mesh_dims[q2] == 1) slow_bytes += ps.nbytes;
  }
  assert_true(slow_bytes < (uint64_t)(1024 * 1024 * 4));
  dt_plan_destroy(plan);
  /* back to the global model: the first cost again */
  for (int a = 0; a < DT_ALGO_COUNT; a++)
    for (int c = DT_COLL_ALL_GATHER; c < DT_COLL_COUNT; c++)
      dt_mesh_set_cost_model(mesh, 1, (dt_collective_t)c, (dt_coll_algo_t)a, NULL);
  assert_int_equal(dt_plan_create(mesh, DT_F32, 2, shape, pp, rr, &plan), DT_SUCCESS);
  assert_int_equal(dt_plan_cost(plan, &c2), DT_SUCCESS);
  assert_true(fabs(c2 - c0) < 1e-9 * c0);
  dt_plan_destroy(plan);
  /* bad arguments change nothing */
  const dt_cost_params_t nan_bw = {1.0, 1.0, NAN};
  assert_int_equal(dt_mesh_set_cost_model(mesh, 1, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &nan_bw),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_mesh_set_cost_model(mesh, 2, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &slow),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_mesh_set_cost_model(mesh, 0, DT_COLL_LOCAL, DT_ALGO_NATIVE, &slow),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_mesh_set_cost_model(mesh, 0, DT_COLL_ALL_GATHER, DT_ALGO_A2A, &slow),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_mesh_set_cost_model(NULL, 0, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &slow),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_mesh_cost_estimate(mesh, 4u, DT_COLL_ALL_GATHER, 1, &est),
                   DT_ERR_INVALID_ARG);
  assert_int_equal(dt_mesh_get_cost_model(mesh, 1, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &q),
                   DT_SUCCESS);
  assert_memory_equal(&q, &g, sizeof q);
  dt_mesh_destroy(mesh);
  /* optimality with per-dim costs: every pair on (2, 2), (2, 4) and flattened (2, 2) equals the
   * exhaustive minimum under the same per-dim parameters */
  const int flat[1][4] = {{0, 1}};
  const int fn[1] = {2};
  g_mesh_setup = slow_dim1;
  for (int s = 0; s < NSHAPES; s++) {
    run_mesh(2, m22, 0, NULL, NULL, kNdims[s], kShapes[s]);
    run_mesh(2, m24, 0, NULL, NULL, kNdims[s], kShapes[s]);
    run_mesh(2, m22, 1, flat, fn, kNdims[s], kShapes[s]);
  }
  g_mesh_setup = NULL;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_plans), cmocka_unit_test(test_cache),
      cmocka_unit_test(test_algos),
      cmocka_unit_test(test_optimal_1d),  cmocka_unit_test(test_optimal_2d),
      cmocka_unit_test(test_optimal_3d),
      cmocka_unit_test(test_cost_ranges_set), cmocka_unit_test(test_cost_ranges_extreme),
      cmocka_unit_test(test_cost_load_strict),  cmocka_unit_test(test_mesh_costs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

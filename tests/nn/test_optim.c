/* test_optim.c - AdamW and gradient clipping as ops, against a dense host reference.
 *
 * Parameters with sharded and replicated placements on a 1-D mesh and (even worlds) a 2-D mesh
 * get known gradients (backward of sum(w * g) gives g); after three steps every parameter and
 * both moments must equal, bit for bit, the same f32 update computed element by element on the
 * full arrays (the update is elementwise, so sharding cannot change a bit), for f32 and bf16
 * moments. Also: the state tensors (dt_adamw_state) carry the parameter's placements and the step
 * count; copying the state into a fresh optimizer continues identically (a checkpoint round
 * trip); the clipping norm equals the dense norm and the scaled gradients equal g * scale; and
 * bad calls (state placed apart from its parameter, a parameter passed as its own gradient, a
 * NaN learning rate, an index out of range) fail with nothing changed.
 */
#include <math.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

#define NP 3
#define STEPS 3
static const int kNd[NP] = {2, 1, 2};
static const int64_t kShape[NP][2] = {{6, 4}, {4, 0}, {5, 3}};

static int64_t numel_of(int p) { return kShape[p][0] * (kNd[p] == 2 ? kShape[p][1] : 1); }

static float grad_value(int p, int64_t i, int step) {
  return (float)((i * 7 + p * 3 + step) % 11 - 5) * 0.125f;
}
static float init_value(int p, int64_t i) { return (float)((i * 5 + p) % 13 - 6) * 0.0625f; }

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef struct {
  float w[NP][64], m[NP][64], v[NP][64];
  uint16_t mb[NP][64], vb[NP][64];
} ref_t;

/* The documented update on full arrays (step t, lr, weight decay on 2-dim parameters). */
static void ref_step(ref_t* r, const dt_adamw_config_t* c, int bf16, int t, double lr) {
  double b1 = c->beta1, b2 = c->beta2, c1 = 1.0 - pow(b1, t), c2 = 1.0 - pow(b2, t);
  for (int p = 0; p < NP; p++) {
    double wd = kNd[p] >= 2 ? c->weight_decay : 0.0;
    for (int64_t k = 0; k < numel_of(p); k++) {
      float g = grad_value(p, k, t), *w = &r->w[p][k];
      if (bf16) {
        float mk = (float)(b1 * from_bf16(r->mb[p][k]) + (1 - b1) * g);
        float vk = (float)(b2 * from_bf16(r->vb[p][k]) + (1 - b2) * g * g);
        r->mb[p][k] = to_bf16(mk);
        r->vb[p][k] = to_bf16(vk);
        *w -= (float)(lr * (wd * *w + (mk / c1) / (sqrt(vk / c2) + c->eps)));
      } else {
        const float fb1 = (float)b1, fb2 = (float)b2, a1 = (float)(1 - b1), a2 = (float)(1 - b2);
        float mk = fb1 * r->m[p][k] + a1 * g, vk = fb2 * r->v[p][k] + a2 * g * g;
        r->m[p][k] = mk;
        r->v[p][k] = vk;
        *w -= (float)lr * ((float)wd * *w + (mk * (float)(1.0 / c1)) /
                                                (sqrtf(vk * (float)(1.0 / c2)) + (float)c->eps));
      }
    }
  }
}

/* Gives every parameter the gradient of step t: backward of sum over p of sum(w_p * g_p). */
static void set_grads(dt_mesh_t mesh, dt_var_t* w, int t) {
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t total = NULL;
  dt_placement_t rep[2] = {dt_replicate(), dt_replicate()};
  for (int p = 0; p < NP; p++) {
    DT_ASSERT_OK(dt_var_zero_grad(w[p]));
    float g[64];
    for (int64_t k = 0; k < numel_of(p); k++) g[k] = grad_value(p, k, t);
    dt_tensor_t gt;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, kNd[p], kShape[p], rep, g, &gt));
    dt_var_t gv, prod, s;
    DT_ASSERT_OK(dt_tape_constant(tape, gt, &gv));
    dt_var_t pair[2] = {w[p], gv};
    DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, pair, 0, NULL, 0, NULL, 1, &prod));
    const int64_t all[1] = {0};
    DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &prod, 1, all, 0, NULL, 1, &s));
    if (total == NULL) {
      total = s;
    } else {
      dt_var_t two[2] = {total, s};
      DT_ASSERT_OK(dt_ag_op(tape, "add", 2, two, 0, NULL, 0, NULL, 1, &total));
    }
  }
  DT_ASSERT_OK(dt_tape_backward(tape, total));
  DT_ASSERT_OK(dt_tape_destroy(tape));
}

static void expect_full(dt_tensor_t t, const void* want, size_t nb, const char* what, int p) {
  char got[512];
  DT_ASSERT_OK(dt_tensor_gather_full(t, got, nb));
  DT_ASSERT_TRUE(memcmp(got, want, nb) == 0, "%s of parameter %d differs from the reference",
                 what, p);
}

static void make_params(dt_mesh_t mesh, const dt_placement_t (*pl)[2], dt_var_t* w, ref_t* r) {
  for (int p = 0; p < NP; p++) {
    for (int64_t k = 0; k < numel_of(p); k++) r->w[p][k] = init_value(p, k);
    dt_tensor_t t;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, kNd[p], kShape[p], pl[p], r->w[p], &t));
    DT_ASSERT_OK(dt_var_leaf(t, 1, &w[p]));
  }
}

static void run(dt_mesh_t mesh, int mnd, const dt_placement_t (*pl)[2], int bf16) {
  dt_adamw_config_t cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, bf16};
  ref_t ref;
  memset(&ref, 0, sizeof ref);
  dt_var_t w[NP];
  make_params(mesh, pl, w, &ref);
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&cfg, NP, w, &opt));
  for (int t = 1; t <= STEPS; t++) {
    set_grads(mesh, w, t);
    double lr = 1e-2 * t;
    DT_ASSERT_OK(dt_adamw_step(opt, lr));
    ref_step(&ref, &cfg, bf16, t, lr);
  }
  for (int p = 0; p < NP; p++) {
    size_t n = (size_t)numel_of(p);
    expect_full(dt_var_value(w[p]), ref.w[p], n * 4, "value", p);
    dt_tensor_t m, v, st;
    DT_ASSERT_OK(dt_adamw_state(opt, p, &m, &v, &st));
    expect_full(m, bf16 ? (void*)ref.mb[p] : (void*)ref.m[p], n * (bf16 ? 2 : 4), "exp_avg", p);
    expect_full(v, bf16 ? (void*)ref.vb[p] : (void*)ref.v[p], n * (bf16 ? 2 : 4), "exp_avg_sq",
                p);
    int64_t steps;
    DT_ASSERT_OK(dt_tensor_gather_full(st, &steps, sizeof steps));
    DT_ASSERT_EQ(steps, STEPS);
    dt_placement_t got[2];
    DT_ASSERT_OK(dt_tensor_placements(m, got));
    for (int i = 0; i < mnd; i++)
      DT_ASSERT_TRUE(dt_placement_equal(got[i], pl[p][i]), "exp_avg placements differ");
  }

  /* checkpoint round trip: a second optimizer on copies of the parameters gets this one's state
   * and then steps identically */
  dt_var_t w2[NP];
  dt_adamw_t opt2;
  for (int p = 0; p < NP; p++) {
    dt_tensor_t c;
    DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, kNd[p], kShape[p], pl[p], ref.w[p], &c));
    DT_ASSERT_OK(dt_var_leaf(c, 1, &w2[p]));
  }
  DT_ASSERT_OK(dt_adamw_create(&cfg, NP, w2, &opt2));
  for (int p = 0; p < NP; p++) {
    dt_tensor_t a[3], b[3];
    DT_ASSERT_OK(dt_adamw_state(opt, p, &a[0], &a[1], &a[2]));
    DT_ASSERT_OK(dt_adamw_state(opt2, p, &b[0], &b[1], &b[2]));
    for (int k = 0; k < 3; k++) DT_ASSERT_OK(dt_tensor_redistribute_into(a[k], b[k]));
  }
  set_grads(mesh, w, STEPS + 1);
  set_grads(mesh, w2, STEPS + 1);
  DT_ASSERT_OK(dt_adamw_step(opt, 0.02));
  DT_ASSERT_OK(dt_adamw_step(opt2, 0.02));
  for (int p = 0; p < NP; p++) {
    float a[64], b[64];
    size_t nb = sizeof(float) * (size_t)numel_of(p);
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w[p]), a, nb));
    DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(w2[p]), b, nb));
    DT_ASSERT_TRUE(memcmp(a, b, nb) == 0, "restored optimizer diverged on parameter %d", p);
  }

  /* clipping: the dense norm, then g * scale */
  set_grads(mesh, w, 1);
  double sq = 0.0;
  for (int p = 0; p < NP; p++)
    for (int64_t k = 0; k < numel_of(p); k++) sq += (double)grad_value(p, k, 1) * grad_value(p, k, 1);
  double norm, want = sqrt(sq);
  DT_ASSERT_OK(dt_clip_grad_norm(NP, w, 0.0, &norm)); /* measure only */
  DT_ASSERT_TRUE(fabs(norm - want) <= 1e-6 * want, "norm %.9g, dense %.9g", norm, want);
  DT_ASSERT_OK(dt_clip_grad_norm(NP, w, want / 2, &norm));
  float scale = (float)(want / 2 / (norm + 1e-6));
  for (int p = 0; p < NP; p++) {
    float got[64];
    DT_ASSERT_OK(
        dt_tensor_gather_full(dt_var_grad(w[p]), got, sizeof(float) * (size_t)numel_of(p)));
    for (int64_t k = 0; k < numel_of(p); k++) {
      float e = grad_value(p, k, 1) * scale;
      DT_ASSERT_TRUE(fabsf(got[k] - e) <= 1e-6f * (1.0f + fabsf(e)), "clipped grad %d[%lld]", p,
                     (long long)k);
    }
  }
  double after;
  DT_ASSERT_OK(dt_clip_grad_norm(NP, w, 0.0, &after));
  DT_ASSERT_TRUE(fabs(after - want / 2) <= 1e-5 * want, "norm after clipping %.9g", after);

  /* bad calls change nothing */
  float before[64];
  DT_ASSERT_OK(
      dt_tensor_gather_full(dt_var_value(w[0]), before, sizeof(float) * (size_t)numel_of(0)));
  dt_tensor_t m0, v0, s0;
  DT_ASSERT_OK(dt_adamw_state(opt, 0, &m0, &v0, &s0));
  dt_tensor_t g0 = dt_var_grad(w[0]), w0 = dt_var_value(w[0]);
  double fargs[5] = {1e-2, 0.9, 0.95, 1e-8, 0.1};
  dt_tensor_t alias[5] = {w0, w0, m0, v0, s0};
  DT_ASSERT_STATUS(dt_op_run_multi("adamw", 5, alias, 0, NULL, 5, fargs, 0, NULL),
                   DT_ERR_INVALID_ARG);
  dt_placement_t other[2] = {dt_replicate(), dt_replicate()};
  if (pl[0][0].kind == DT_REPLICATE) other[0] = dt_shard(0);
  dt_tensor_t moved;
  DT_ASSERT_OK(dt_tensor_redistribute(m0, other, &moved));
  dt_tensor_t apart[5] = {w0, g0, moved, v0, s0};
  DT_ASSERT_STATUS(dt_op_run_multi("adamw", 5, apart, 0, NULL, 5, fargs, 0, NULL),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_tensor_destroy(moved));
  fargs[0] = NAN;
  dt_tensor_t good[5] = {w0, g0, m0, v0, s0};
  DT_ASSERT_STATUS(dt_op_run_multi("adamw", 5, good, 0, NULL, 5, fargs, 0, NULL),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_op_run_multi("adamw", 5, good, 0, NULL, 5, fargs, 1, NULL),
                   DT_ERR_INVALID_ARG);
  expect_full(w0, before, sizeof(float) * (size_t)numel_of(0), "value after refused calls", 0);
  int64_t steps;
  DT_ASSERT_OK(dt_tensor_gather_full(s0, &steps, sizeof steps));
  DT_ASSERT_EQ(steps, STEPS + 1);
  DT_ASSERT_STATUS(dt_adamw_state(opt, NP, &m0, NULL, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_adamw_state(NULL, 0, &m0, NULL, NULL), DT_ERR_INVALID_ARG);

  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_adamw_destroy(opt2));
  for (int p = 0; p < NP; p++) {
    DT_ASSERT_OK(dt_var_destroy(w[p]));
    DT_ASSERT_OK(dt_var_destroy(w2[p]));
  }
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  dt_mesh_t m1;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &m1));
  const dt_placement_t pl1[NP][2] = {{dt_shard(0)}, {dt_replicate()}, {dt_shard(1)}};
  for (int bf16 = 0; bf16 < 2; bf16++) run(m1, 1, pl1, bf16);
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  if (world % 2 == 0) {
    int shape[2] = {2, world / 2};
    dt_mesh_t m2;
    DT_ASSERT_OK(dt_mesh_create(2, shape, NULL, NULL, &m2));
    const dt_placement_t pl2[NP][2] = {{dt_shard(0), dt_shard(1)},
                                       {dt_replicate(), dt_shard(0)},
                                       {dt_replicate(), dt_replicate()}};
    for (int bf16 = 0; bf16 < 2; bf16++) run(m2, 2, pl2, bf16);
    DT_ASSERT_OK(dt_mesh_destroy(m2));
  }
  if (rank == 0) printf("test_optim np=%d: ok\n", world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

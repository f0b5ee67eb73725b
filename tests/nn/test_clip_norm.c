/* test_clip_norm.c - dt_clip_grad_norm where the gradients' sum of squares leaves f32's range
 * (np 1 and 3).
 *
 * Parameters row-sharded, column-sharded (uneven at np 3), replicated (counted once) and bf16 get
 * known gradients; the norm must equal a double-precision host reference over the full arrays to
 * 1e-6 (relative), and clipping to max_norm 1 must leave g * (float)(1 / (norm + 1e-6)) (then a
 * norm of 1). Cases: gradients of 1e20 and of 3e19 (norms past 1.8e19, whose squares overflow
 * f32: they once gave an inf norm and zeroed every gradient), a mix of huge, ordinary and tiny
 * ones, only tiny ones (1e-30: squares under f32's range, once a norm of 0), ordinary ones, and
 * zeros (norm 0). A NaN element gives a NaN norm and an inf element an inf norm, beside huge
 * finite ones too.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

#define NP 4
static const int64_t kShape[NP][2] = {{6, 4}, {5, 4}, {2, 3}, {3, 5}};
static const char* const kPl[NP] = {"S(0)", "S(1)", "R", "S(0)"};
static const dt_dtype_t kDtype[NP] = {DT_F32, DT_F32, DT_F32, DT_BF16};

static dt_mesh_t g_mesh;

static int64_t numel_of(int p) { return kShape[p][0] * kShape[p][1]; }

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static dt_placement_t pl_of(int p) {
  dt_placement_t pl;
  int n;
  DT_ASSERT_OK(dt_placements_parse(kPl[p], &pl, 1, &n));
  return pl;
}

/* Parameter p's full gradient: mag[p] times a pattern of sizes 0.25 .. 1.5 and both signs
 * (rounded to bf16 for the bf16 parameter, as the host reference sees it). */
static void grad_full(int p, double mag, float* g) {
  for (int64_t i = 0; i < numel_of(p); i++) {
    float v = (float)(mag * (double)((i * 7 + p * 3) % 6 + 1) * 0.25 * (i % 2 ? -1.0 : 1.0));
    g[i] = kDtype[p] == DT_BF16 ? from_bf16(to_bf16(v)) : v;
  }
}

static dt_tensor_t tensor_of(int p, const float* full) {
  dt_placement_t pl = pl_of(p);
  dt_tensor_t t;
  if (kDtype[p] == DT_BF16) {
    uint16_t h[64];
    for (int64_t i = 0; i < numel_of(p); i++) h[i] = to_bf16(full[i]);
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_BF16, 2, kShape[p], &pl, h, &t));
  } else {
    DT_ASSERT_OK(dt_tensor_from_full(g_mesh, DT_F32, 2, kShape[p], &pl, full, &t));
  }
  return t;
}

static void read_full(int p, dt_tensor_t t, float* full) {
  if (kDtype[p] == DT_BF16) {
    uint16_t h[64];
    DT_ASSERT_OK(dt_tensor_gather_full(t, h, sizeof(uint16_t) * (size_t)numel_of(p)));
    for (int64_t i = 0; i < numel_of(p); i++) full[i] = from_bf16(h[i]);
  } else {
    DT_ASSERT_OK(dt_tensor_gather_full(t, full, sizeof(float) * (size_t)numel_of(p)));
  }
}

/* Gradients mag[p] * pattern, with element 1 of parameter `odd` set to `odd_value` when odd >= 0;
 * checks the norm against the host reference and, when it is finite and above 1, the clipping. */
static void check(const char* what, const double* mag, int odd, float odd_value) {
  static float g[NP][64];
  dt_var_t w[NP];
  double sq = 0.0;
  for (int p = 0; p < NP; p++) {
    dt_tensor_t v;
    dt_placement_t pl = pl_of(p);
    DT_ASSERT_OK(dt_tensor_zeros(g_mesh, kDtype[p], 2, kShape[p], &pl, &v));
    DT_ASSERT_OK(dt_var_leaf(v, 1, &w[p]));
    grad_full(p, mag[p], g[p]);
    if (p == odd) g[p][1] = odd_value;
    for (int64_t i = 0; i < numel_of(p); i++) sq += (double)g[p][i] * g[p][i];
    DT_ASSERT_OK(dt_var_set_grad(w[p], tensor_of(p, g[p])));
  }
  const double want = sqrt(sq);
  double norm = -1.0;
  DT_ASSERT_OK(dt_clip_grad_norm(NP, w, 1.0, &norm));
  if (isnan(want)) {
    DT_ASSERT_TRUE(isnan(norm), "%s: norm %.9g, expected NaN", what, norm);
  } else if (isinf(want)) {
    DT_ASSERT_TRUE(isinf(norm) && norm > 0, "%s: norm %.9g, expected inf", what, norm);
  } else {
    DT_ASSERT_TRUE(fabs(norm - want) <= 1e-6 * want, "%s: norm %.9g, dense %.9g", what, norm,
                   want);
    /* scaled by the norm it reported (1 when at most max_norm) */
    const float scale = want > 1.0 ? (float)(1.0 / (norm + 1e-6)) : 1.0f;
    for (int p = 0; p < NP; p++) {
      float got[64];
      read_full(p, dt_var_grad(w[p]), got);
      /* (plus what is lost where a clipped tiny gradient goes subnormal) */
      const float tol = kDtype[p] == DT_BF16 ? 1e-2f : 1e-6f;
      for (int64_t i = 0; i < numel_of(p); i++) {
        const float e = g[p][i] * scale;
        DT_ASSERT_TRUE(fabsf(got[i] - e) <= tol * fabsf(e) + 1e-37f,
                       "%s: clipped gradient %d[%lld] %.9g, expected %.9g", what, p,
                       (long long)i, got[i], e);
      }
    }
    if (want > 1.0) {
      double after;
      DT_ASSERT_OK(dt_clip_grad_norm(NP, w, 0.0, &after));
      DT_ASSERT_TRUE(fabs(after - 1.0) <= 1e-3, "%s: norm after clipping %.9g", what, after);
    }
  }
  for (int p = 0; p < NP; p++) DT_ASSERT_OK(dt_var_destroy(w[p]));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &g_mesh));
  const double huge[NP] = {1e20, 1e20, 1e20, 1e20}, big[NP] = {3e19, 3e19, 1.0, 3e19};
  const double mix[NP] = {1e20, 1e-30, 1.0, 3e19}, mix2[NP] = {1e-30, 2.0, 5e19, 1e-20};
  const double tiny[NP] = {1e-30, 2e-30, 1e-35, 1e-30}, plain[NP] = {1.0, 0.5, 2.0, 1.0};
  const double small[NP] = {0.01, 0.02, 0.0, 0.03}, zero[NP] = {0.0, 0.0, 0.0, 0.0};
  check("1e20", huge, -1, 0.0f);
  check("3e19", big, -1, 0.0f);
  check("huge and tiny", mix, -1, 0.0f);
  check("tiny and huge", mix2, -1, 0.0f);
  check("1e-30", tiny, -1, 0.0f);
  check("ordinary", plain, -1, 0.0f);
  check("under max_norm", small, -1, 0.0f);
  check("zeros", zero, -1, 0.0f);
  check("NaN beside 1e20", huge, 1, NAN);
  check("inf beside 1e20", huge, 2, INFINITY);
  check("inf beside 1", plain, 0, -INFINITY);
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  if (dt_test_rank() == 0) printf("test_clip_norm np=%d: passed\n", world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

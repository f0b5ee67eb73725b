/* test_int_ops.c - integer operands of neg, floor, ceil, round, trunc, sign, erf, sum, amax, amin,
 * prod, mean, where, masked_fill and cumsum as torch 1.13 computes them (np 1 and 2; an
 * emulated-GPU twin runs the CUDA kernels).
 *
 * Checked, each against values written out here (the dtype limits, past 2^31):
 *   - neg of i32 / i64 wraps: -INT32_MIN is INT32_MIN, -INT64_MIN is INT64_MIN (torch.neg);
 *   - floor, ceil, round and trunc of i32 / i64 keep the values and the dtype (INT_MIN, INT_MAX,
 *     2^24 + 1, 2^53 + 1), sign gives -1 / 0 / 1 in the dtype, each keeps a Partial(max) /
 *     Partial(min) with the reduced values; round with decimals != 0 is refused; erf gives f32;
 *   - sum of i32 is i64 (torch.sum), exact past 2^31; sum of i64 wraps at 64 bits; over a sharded
 *     reduced dim the result is Partial(sum) in i64 and reduces to Replicate exactly; over
 *     replicated dims, every dim and with keepdim; an i32 Partial(sum) input whose pieces wrap
 *     at 32 bits is reduced before the sum (host meshes: the pieces come from dt_tensor_from_local);
 *   - amax / amin keep the dtype: Partial(max) / Partial(min) over a sharded dim, an uneven shard
 *     with an empty local part (the identity: the dtype's minimum / maximum), keepdim; an amax
 *     over an empty dim is refused as PyTorch refuses it;
 *   - argmax / argmin of i32 / i64 give i64 positions, the first of tied extremes (3 x 3000 rows
 *     with ties across a block's lanes: the block and warp paths of the emulated GPU), with the
 *     reduced dim sharded (gathered first) or not;
 *   - prod of i32 / i64 is i64 (torch.prod), wrapping at 64 bits; over a sharded dim (gathered
 *     first), with keepdim; the long rows' products across a block's lanes;
 *   - mean of integers is refused with torch's "could not infer output dtype";
 *   - where with i32 / i64 values and conditions of i64, f32 (NaN is true, -0.0 false) and bf16;
 *     where(gt(x, y), x, y) with f32 x, y through the tape (gradients only to the values);
 *     masked_fill of i32 / i64 with an f32 mask, the value truncated toward zero (2.5 -> 2,
 *     -2.5 -> -2, INT32_MAX kept) and refused past the dtype's range, NaN and infinity
 *     (PyTorch: "value cannot be converted to type int without overflow");
 *   - the tape: integer results never require a gradient;
 *   - cumsum of i64 wraps at 64 bits (R, S(0), S(1), both dims), of i32 gives i64 without
 *     wrapping; an i64 Partial(sum) passes, an i32 one whose pieces wrap is reduced first.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/dtensor.h"

#define I32 DT_I32
#define I64 DT_I64
#define F32 DT_F32

static int g_rank, g_world, g_host;

/* A tensor of dtype d (i32 or i64) from int64 values (truncated to i32 for i32). */
static dt_tensor_t mk(dt_mesh_t mesh, dt_dtype_t d, int ndim, const int64_t* shape,
                      dt_placement_t pl, const int64_t* v) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  unsigned char buf[8 * 64];
  for (int64_t i = 0; i < n; i++) {
    if (d == I64) memcpy(buf + 8 * i, &v[i], 8);
    else { int32_t x = (int32_t)v[i]; memcpy(buf + 4 * i, &x, 4); }
  }
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, d, ndim, shape, &pl, buf, &t));
  return t;
}

static dt_tensor_t mkf(dt_mesh_t mesh, dt_dtype_t d, int ndim, const int64_t* shape,
                       dt_placement_t pl, const float* v) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  uint16_t h[64];
  for (int64_t i = 0; i < n && d == DT_BF16; i++) { /* the values below are exact in bf16 */
    uint32_t u;
    memcpy(&u, &v[i], 4);
    h[i] = (uint16_t)(u >> 16);
  }
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, d, ndim, shape, &pl, d == DT_BF16 ? (const void*)h
                                                                          : (const void*)v, &t));
  return t;
}

static dt_dtype_t dtype_of(dt_tensor_t t) {
  dt_dtype_t d;
  DT_ASSERT_OK(dt_tensor_dtype(t, &d));
  return d;
}

/* The gathered values of integer tensor t (n elements) as int64. */
static void read_ints(dt_tensor_t t, int64_t n, int64_t* out) {
  const dt_dtype_t d = dtype_of(t);
  unsigned char buf[8 * 64];
  DT_ASSERT_OK(dt_tensor_gather_full(t, buf, (size_t)n * (d == I64 ? 8 : 4)));
  for (int64_t i = 0; i < n; i++) {
    if (d == I64) memcpy(&out[i], buf + 8 * i, 8);
    else { int32_t x; memcpy(&x, buf + 4 * i, 4); out[i] = x; }
  }
}

/* Runs op on in, checks the result's dtype, placement kind on mesh dim 0 (-1: any; not checked
 * on one rank), then redistributes it to Replicate and checks its n values. */
static void expect(const char* what, const char* op, int nin, dt_tensor_t* in, int nia,
                   const int64_t* iargs, int nfa, const double* fargs, dt_dtype_t want_dt,
                   int want_kind, int64_t n, const int64_t* want) {
  dt_tensor_t r, rr;
  dt_status_t st = dt_op_run(op, nin, in, nia, iargs, nfa, fargs, &r);
  DT_ASSERT_TRUE(st == DT_SUCCESS, "%s: %s: %s", what, dt_status_name(st), dt_last_error());
  DT_ASSERT_TRUE(dtype_of(r) == want_dt, "%s: dtype %s, torch gives %s", what,
                 dt_dtype_name(dtype_of(r)), dt_dtype_name(want_dt));
  dt_placement_t pl[DT_MAX_MESH_DIMS], rep = dt_replicate();
  DT_ASSERT_OK(dt_tensor_placements(r, pl));
  DT_ASSERT_TRUE(want_kind < 0 || g_world == 1 || (int)pl[0].kind == want_kind, "%s: placement kind %d, "
                 "expected %d", what, (int)pl[0].kind, want_kind);
  DT_ASSERT_OK(dt_tensor_redistribute(r, &rep, &rr));
  int64_t got[64];
  read_ints(rr, n, got);
  for (int64_t i = 0; i < n; i++)
    DT_ASSERT_TRUE(got[i] == want[i], "%s element %lld: %lld, torch gives %lld", what,
                   (long long)i, (long long)got[i], (long long)want[i]);
  DT_ASSERT_OK(dt_tensor_destroy(rr));
  DT_ASSERT_OK(dt_tensor_destroy(r));
}

static int64_t wrap(dt_dtype_t d, uint64_t r) {
  return d == I64 ? (int64_t)r : (int64_t)(int32_t)(uint32_t)r;
}

/* ---- neg ------------------------------------------------------------------------------------ */

static void test_neg(dt_mesh_t mesh) {
  for (int w = 0; w < 2; w++) {
    const dt_dtype_t d = w ? I64 : I32;
    const int64_t lo = w ? INT64_MIN : INT32_MIN, hi = w ? INT64_MAX : INT32_MAX;
    const int64_t v[8] = {lo, lo + 1, -1, 0, 1, hi, 2147483647, -7};
    int64_t want[8];
    for (int i = 0; i < 8; i++) want[i] = wrap(d, 0u - (uint64_t)wrap(d, (uint64_t)v[i]));
    DT_ASSERT_TRUE(want[0] == lo, "the reference: -MIN is MIN");
    const int64_t shape[2] = {4, 2};
    for (int p = 0; p < 2; p++) {
      dt_tensor_t x = mk(mesh, d, 2, shape, p ? dt_shard(0) : dt_replicate(), v);
      char what[64];
      snprintf(what, sizeof what, "neg(%s, %s)", dt_dtype_name(d), p ? "S(0)" : "R");
      expect(what, "neg", 1, &x, 0, NULL, 0, NULL, d, p ? DT_SHARD : DT_REPLICATE, 8, want);
      DT_ASSERT_OK(dt_tensor_destroy(x));
    }
  }
}

/* ---- floor, ceil, round, trunc, sign, erf ------------------------------------------------ */

/* floor, ceil, round and trunc of i32 / i64 give the tensor back in its dtype (values past 2^24
 * and 2^53 too, which an f32 or f64 detour would change), sign -1 / 0 / 1 in the dtype (torch
 * 1.13); of a Partial(max) / Partial(min) the result stays Partial with the reduced values; a
 * Partial(avg) is reduced first (it would truncate); round with decimals != 0 is refused, as
 * torch's "round_cpu" not implemented for 'Int'; erf computes in f32. */
static void test_rounding(dt_mesh_t mesh) {
  const char* ops[5] = {"floor", "ceil", "round", "trunc", "sign"};
  for (int w = 0; w < 2; w++) {
    const dt_dtype_t d = w ? I64 : I32;
    const int64_t lo = w ? INT64_MIN : INT32_MIN, hi = w ? INT64_MAX : INT32_MAX;
    const int64_t big = w ? (INT64_C(1) << 53) + 1 : (INT64_C(1) << 24) + 1;
    const int64_t v[8] = {lo, -big, -1, 0, 1, big, hi, -7};
    const int64_t shape[2] = {4, 2};
    for (int k = 0; k < 5; k++) {
      int64_t want[8];
      for (int i = 0; i < 8; i++) want[i] = k == 4 ? (v[i] > 0) - (v[i] < 0) : v[i];
      for (int p = 0; p < 2; p++) {
        dt_tensor_t x = mk(mesh, d, 2, shape, p ? dt_shard(1) : dt_replicate(), v);
        char what[64];
        snprintf(what, sizeof what, "%s(%s, %s)", ops[k], dt_dtype_name(d), p ? "S(1)" : "R");
        expect(what, ops[k], 1, &x, 0, NULL, 0, NULL, d, p ? DT_SHARD : DT_REPLICATE, 8, want);
        if (k == 2) { /* decimals=0 written out: the same */
          const int64_t zero[1] = {0};
          expect(what, ops[k], 1, &x, 1, zero, 0, NULL, d, -1, 8, want);
        }
        DT_ASSERT_OK(dt_tensor_destroy(x));
      }
    }
    /* Partial(max) / Partial(min) from an amax / amin over a sharded dim pass every one */
    const int64_t sh[2] = {2 * g_world, 3};
    int64_t pv[64];
    for (int i = 0; i < 6 * g_world; i++) pv[i] = (i * 7919 % 23) - 11 + (i % 3 == 0 ? lo / 2 : 0);
    dt_tensor_t xs = mk(mesh, d, 2, sh, dt_shard(0), pv);
    const int64_t red0[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
      dt_tensor_t m;
      DT_ASSERT_OK(dt_op_run(r ? "amin" : "amax", 1, &xs, 2, red0, 0, NULL, &m));
      int64_t mv[3];
      for (int c = 0; c < 3; c++) {
        mv[c] = pv[c];
        for (int i = 1; i < 2 * g_world; i++)
          mv[c] = r ? (pv[i * 3 + c] < mv[c] ? pv[i * 3 + c] : mv[c])
                    : (pv[i * 3 + c] > mv[c] ? pv[i * 3 + c] : mv[c]);
      }
      for (int k = 0; k < 5; k++) {
        int64_t want[3];
        for (int c = 0; c < 3; c++) want[c] = k == 4 ? (mv[c] > 0) - (mv[c] < 0) : mv[c];
        char what[64];
        snprintf(what, sizeof what, "%s(%s, %s)", ops[k], dt_dtype_name(d),
                 r ? "P(min)" : "P(max)");
        expect(what, ops[k], 1, &m, 0, NULL, 0, NULL, d, DT_PARTIAL, 3, want);
      }
      DT_ASSERT_OK(dt_tensor_destroy(m));
    }
    /* round with decimals of an integer tensor: refused on every rank */
    const int64_t dec[1] = {1};
    dt_tensor_t r;
    dt_status_t st = dt_op_run("round", 1, &xs, 1, dec, 0, NULL, &r);
    DT_ASSERT_TRUE(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "decimals") != NULL,
                   "round(%s, decimals=1): %s (%s), torch refuses it", dt_dtype_name(d),
                   dt_status_name(st), dt_last_error());
    /* erf of integers: f32 */
    DT_ASSERT_OK(dt_op_run("erf", 1, &xs, 0, NULL, 0, NULL, &r));
    DT_ASSERT_TRUE(dtype_of(r) == F32, "erf(%s): %s, torch gives f32", dt_dtype_name(d),
                   dt_dtype_name(dtype_of(r)));
    DT_ASSERT_OK(dt_tensor_destroy(r));
    DT_ASSERT_OK(dt_tensor_destroy(xs));
  }
}

/* ---- sum, amax, amin ------------------------------------------------------------------------ */

static void test_reductions(dt_mesh_t mesh) {
  const int P = DT_PARTIAL;
  /* i32 (4, 3) near INT32_MAX: column sums pass 2^31, as i64 */
  const int64_t shape[2] = {4, 3};
  const int64_t a[12] = {INT32_MAX, INT32_MIN, 5,  INT32_MAX, INT32_MIN, -5,
                         INT32_MAX, -1,        7,  INT32_MAX, INT32_MIN, 0};
  int64_t col[3] = {0, 0, 0}, row[4] = {0, 0, 0, 0}, all = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) {
      col[j] += a[i * 3 + j];
      row[i] += a[i * 3 + j];
      all += a[i * 3 + j];
    }
  DT_ASSERT_TRUE(col[0] == 4LL * INT32_MAX && col[1] == 3LL * INT32_MIN - 1, "reference sums");
  for (int p = 0; p < 3; p++) { /* R, S(0), S(1) */
    const dt_placement_t pl = p == 0 ? dt_replicate() : dt_shard(p - 1);
    dt_tensor_t x = mk(mesh, I32, 2, shape, pl, a);
    const int64_t d0[2] = {0, 0}, d1k[2] = {1, 1}, none[1] = {0};
    char what[80];
    snprintf(what, sizeof what, "sum(i32, dim 0) on %s", p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "sum", 1, &x, 2, d0, 0, NULL, I64, p == 1 ? P : p == 2 ? DT_SHARD : DT_REPLICATE,
           3, col);
    snprintf(what, sizeof what, "sum(i32, dim 1, keepdim) on %s",
             p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "sum", 1, &x, 2, d1k, 0, NULL, I64, p == 2 ? P : p == 1 ? DT_SHARD : DT_REPLICATE,
           4, row);
    snprintf(what, sizeof what, "sum(i32) on %s", p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "sum", 1, &x, 1, none, 0, NULL, I64, p ? P : DT_REPLICATE, 1, &all);
    /* prod is i64 and wraps (torch.prod's values); a sharded reduced dim is gathered first (to R,
     * or moved to the kept dim: any placement but a Partial, which the values would show) */
    static const int64_t pcol[3] = {9223372028264841217LL, 0, 0};
    static const int64_t prow[4] = {-4611686007689969664LL, 4611686007689969664LL,
                                    -15032385529LL, 0};
    snprintf(what, sizeof what, "prod(i32, dim 0) on %s", p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "prod", 1, &x, 2, d0, 0, NULL, I64, p == 2 ? DT_SHARD : p ? -1 : DT_REPLICATE, 3,
           pcol);
    snprintf(what, sizeof what, "prod(i32, dim 1, keepdim) on %s",
             p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "prod", 1, &x, 2, d1k, 0, NULL, I64, p == 1 ? DT_SHARD : p ? -1 : DT_REPLICATE, 4,
           prow);
    /* amax / amin over dim 0 keep i32: the limits survive */
    int64_t mx[3], mn[3];
    for (int j = 0; j < 3; j++) {
      mx[j] = mn[j] = a[j];
      for (int i = 1; i < 4; i++) {
        if (a[i * 3 + j] > mx[j]) mx[j] = a[i * 3 + j];
        if (a[i * 3 + j] < mn[j]) mn[j] = a[i * 3 + j];
      }
    }
    snprintf(what, sizeof what, "amax(i32, dim 0) on %s", p == 0 ? "R" : "S");
    expect(what, "amax", 1, &x, 2, d0, 0, NULL, I32, p == 1 ? P : -1, 3, mx);
    snprintf(what, sizeof what, "amin(i32, dim 0) on %s", p == 0 ? "R" : "S");
    expect(what, "amin", 1, &x, 2, d0, 0, NULL, I32, p == 1 ? P : -1, 3, mn);
    DT_ASSERT_OK(dt_tensor_destroy(x));
  }
  /* i64: the sum wraps at 64 bits, partial sums across ranks too; amax / amin at the limits */
  {
    const int64_t s2[2] = {4, 2};
    const int64_t b[8] = {INT64_MAX, INT64_MIN, 1, INT64_MIN, INT64_MAX, -1, 2, 0};
    const int64_t sum0[2] = {wrap(I64, (uint64_t)INT64_MAX + 1u + (uint64_t)INT64_MAX + 2u),
                             wrap(I64, (uint64_t)INT64_MIN + (uint64_t)INT64_MIN - 1u)};
    const int64_t mx[2] = {INT64_MAX, 0}, mn[2] = {1, INT64_MIN};
    for (int p = 0; p < 2; p++) {
      dt_tensor_t x = mk(mesh, I64, 2, s2, p ? dt_shard(0) : dt_replicate(), b);
      const int64_t d0[2] = {0, 0};
      expect(p ? "sum(i64, dim 0) on S(0)" : "sum(i64, dim 0) on R", "sum", 1, &x, 2, d0, 0, NULL,
             I64, p ? P : DT_REPLICATE, 2, sum0);
      expect("amax(i64, dim 0)", "amax", 1, &x, 2, d0, 0, NULL, I64, p ? P : DT_REPLICATE, 2, mx);
      expect("amin(i64, dim 0)", "amin", 1, &x, 2, d0, 0, NULL, I64, p ? P : DT_REPLICATE, 2, mn);
      DT_ASSERT_OK(dt_tensor_destroy(x));
    }
  }
  /* an uneven shard: (1, 3) on S(0) leaves rank 1 no rows, whose part is the identity */
  for (int w = 0; w < 2; w++) {
    const dt_dtype_t d = w ? I64 : I32;
    const int64_t lo = w ? INT64_MIN : INT32_MIN, hi = w ? INT64_MAX : INT32_MAX;
    const int64_t s13[2] = {1, 3}, v[3] = {lo, hi, -3}, d0[2] = {0, 0};
    dt_tensor_t x = mk(mesh, d, 2, s13, dt_shard(0), v);
    expect("amax over an empty local part", "amax", 1, &x, 2, d0, 0, NULL, d, -1, 3, v);
    expect("amin over an empty local part", "amin", 1, &x, 2, d0, 0, NULL, d, -1, 3, v);
    const int64_t sv[3] = {lo, hi, -3};
    expect("sum over an empty local part", "sum", 1, &x, 2, d0, 0, NULL, I64, -1, 3, sv);
    DT_ASSERT_OK(dt_tensor_destroy(x));
  }
  /* errors as PyTorch's: amax of an empty dim, mean of integers */
  {
    const int64_t s03[2] = {0, 3}, d0[2] = {0, 0};
    dt_tensor_t x = mk(mesh, I32, 2, s03, dt_replicate(), NULL), r = NULL;
    DT_ASSERT_STATUS(dt_op_run("amax", 1, &x, 2, d0, 0, NULL, &r), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "amax: reduced dim 0 has size 0") != NULL, "%s",
                   dt_last_error());
    const int64_t zeros[3] = {0, 0, 0};
    expect("sum(i32) over an empty dim", "sum", 1, &x, 2, d0, 0, NULL, I64, DT_REPLICATE, 3,
           zeros);
    DT_ASSERT_OK(dt_tensor_destroy(x));
    for (int w = 0; w < 2; w++) {
      const int64_t v[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
      dt_tensor_t y = mk(mesh, w ? I64 : I32, 2, shape, dt_shard(0), v);
      DT_ASSERT_STATUS(dt_op_run("mean", 1, &y, 2, d0, 0, NULL, &r), DT_ERR_INVALID_ARG);
      DT_ASSERT_TRUE(r == NULL && strstr(dt_last_error(), "mean: could not infer output dtype") &&
                         strstr(dt_last_error(), w ? "i64" : "i32"),
                     "%s", dt_last_error());
      DT_ASSERT_OK(dt_tensor_destroy(y));
    }
  }
  /* Partial inputs (host meshes: each rank's piece from dt_tensor_from_local). i32 P(sum) whose
   * pieces wrap: value INT32_MAX + 1 wraps to INT32_MIN in i32, and torch.sum of that i32 tensor
   * is INT32_MIN in i64 (a sum of the pieces widened first would give 2^31). P(max) passes
   * through amax. */
  if (g_host && g_world == 2) {
    const int64_t s2[1] = {2};
    int32_t piece[2] = {g_rank ? 1 : INT32_MAX, g_rank ? -4 : 1}; /* values INT32_MIN, -3 */
    dt_placement_t ps = dt_partial(DT_REDUCE_SUM), pm = dt_partial(DT_REDUCE_MAX);
    dt_tensor_t x;
    DT_ASSERT_OK(dt_tensor_from_local(mesh, I32, 1, s2, &ps, piece, s2, &x));
    const int64_t none[1] = {0}, want = (int64_t)INT32_MIN - 3;
    expect("sum of an i32 Partial(sum) that wraps", "sum", 1, &x, 1, none, 0, NULL, I64, -1, 1,
           &want);
    DT_ASSERT_OK(dt_tensor_destroy(x));
    int64_t mpiece[2] = {g_rank ? INT64_MIN : -5, g_rank ? INT64_MAX : 3};
    DT_ASSERT_OK(dt_tensor_from_local(mesh, I64, 1, s2, &pm, mpiece, s2, &x));
    const int64_t mx = INT64_MAX;
    expect("amax of an i64 Partial(max)", "amax", 1, &x, 1, none, 0, NULL, I64, DT_PARTIAL, 1,
           &mx);
    DT_ASSERT_OK(dt_tensor_destroy(x));
  }
}

/* cumsum of integers: i32 and i64 give i64, an i64 sum wraps at 64 bits; an i64 Partial(sum)
 * passes (wrapping sums commute) and stays Partial; an i32 Partial(sum) whose pieces wrap is
 * reduced in i32 first (torch.cumsum of the i32 tensor), not summed piece by piece in i64. */
static void test_cumsum(dt_mesh_t mesh) {
  const int64_t s2[2] = {2, 3}, dim1[1] = {1}, dim0[1] = {0};
  const int64_t v[6] = {INT64_MAX, 1, -2, 5, INT64_MIN, -1};
  int64_t want1[6], want0[6];
  for (int r = 0; r < 2; r++) {
    uint64_t acc = 0;
    for (int c = 0; c < 3; c++) want1[r * 3 + c] = (int64_t)(acc += (uint64_t)v[r * 3 + c]);
  }
  for (int c = 0; c < 3; c++) {
    want0[c] = v[c];
    want0[3 + c] = (int64_t)((uint64_t)v[c] + (uint64_t)v[3 + c]);
  }
  const dt_placement_t pls[3] = {dt_replicate(), dt_shard(0), dt_shard(1)};
  for (int p = 0; p < 3; p++) {
    dt_tensor_t x = mk(mesh, I64, 2, s2, pls[p], v);
    char what[64];
    snprintf(what, sizeof what, "cumsum(i64, dim 1) on %s", p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "cumsum", 1, &x, 1, dim1, 0, NULL, I64, p == 1 ? DT_SHARD : -1, 6, want1);
    snprintf(what, sizeof what, "cumsum(i64, dim 0) on %s", p == 0 ? "R" : p == 1 ? "S(0)" : "S(1)");
    expect(what, "cumsum", 1, &x, 1, dim0, 0, NULL, I64, p == 2 ? DT_SHARD : -1, 6, want0);
    DT_ASSERT_OK(dt_tensor_destroy(x));
  }
  const int64_t v32[6] = {INT32_MAX, INT32_MAX, INT32_MIN, -1, 7, INT32_MIN};
  int64_t want32[6];
  for (int r = 0; r < 2; r++) {
    int64_t acc = 0;
    for (int c = 0; c < 3; c++) want32[r * 3 + c] = acc += v32[r * 3 + c];
  }
  dt_tensor_t y = mk(mesh, I32, 2, s2, dt_shard(0), v32);
  expect("cumsum(i32) into i64 without wrapping", "cumsum", 1, &y, 1, dim1, 0, NULL, I64, -1, 6,
         want32);
  DT_ASSERT_OK(dt_tensor_destroy(y));
  if (g_host && g_world == 2) {
    const int64_t s1[1] = {2}, d[1] = {0};
    dt_placement_t ps = dt_partial(DT_REDUCE_SUM);
    int32_t piece[2] = {g_rank ? 1 : INT32_MAX, g_rank ? -4 : 1}; /* values INT32_MIN, -3 */
    dt_tensor_t x;
    DT_ASSERT_OK(dt_tensor_from_local(mesh, I32, 1, s1, &ps, piece, s1, &x));
    const int64_t w32[2] = {INT32_MIN, (int64_t)INT32_MIN - 3};
    expect("cumsum of an i32 Partial(sum) that wraps", "cumsum", 1, &x, 1, d, 0, NULL, I64, -1, 2,
           w32);
    DT_ASSERT_OK(dt_tensor_destroy(x));
    int64_t p64[2] = {g_rank ? INT64_MAX : 2, g_rank ? 3 : -4}; /* values INT64_MIN + 1, -1 */
    DT_ASSERT_OK(dt_tensor_from_local(mesh, I64, 1, s1, &ps, p64, s1, &x));
    const int64_t w64[2] = {INT64_MIN + 1, INT64_MIN};
    expect("cumsum of an i64 Partial(sum) (passes)", "cumsum", 1, &x, 1, d, 0, NULL, I64,
           DT_PARTIAL, 2, w64);
    DT_ASSERT_OK(dt_tensor_destroy(x));
  }
}

/* Rows of every GPU group size (3 x 3000: a block per row, the whole tensor's 9000 in one block;
 * 7 x 100: a warp per row; 100 x 7: a thread per row) and strided reductions (dim 0 of each:
 * a thread per output over 3, a warp per output over 100 strided elements), i32 into i64 and
 * i64 wrapping, against int64 loops; amax / amin with the limits planted far from the starts. */
/* sum, amax, amin, (am, an) argmax, argmin: the first position of the extreme, and prod (pr) */
static void reduce_ref(const int64_t* v, int64_t R, int64_t C, int dim, int64_t* sum, int64_t* mx,
                       int64_t* mn, int64_t* am, int64_t* an, int64_t* pr) {
  const int64_t n_out = dim ? R : C, len = dim ? C : R;
  for (int64_t o = 0; o < n_out; o++) {
    uint64_t acc = 0, prod = 1;
    mx[o] = INT64_MIN;
    mn[o] = INT64_MAX;
    am[o] = an[o] = -1;
    for (int64_t k = 0; k < len; k++) {
      const int64_t x = dim ? v[o * C + k] : v[k * C + o];
      acc += (uint64_t)x;
      prod *= (uint64_t)x;
      if (am[o] < 0 || x > mx[o]) mx[o] = x, am[o] = k;
      if (an[o] < 0 || x < mn[o]) mn[o] = x, an[o] = k;
    }
    sum[o] = (int64_t)acc;
    pr[o] = (int64_t)prod;
  }
}

static void test_long_rows(dt_mesh_t mesh) {
  const int64_t shapes[3][2] = {{3, 3000}, {7, 100}, {100, 7}};
  for (int sh = 0; sh < 3; sh++)
    for (int w = 0; w < 2; w++) {
      const int64_t R = shapes[sh][0], C = shapes[sh][1], n = R * C;
      const dt_dtype_t d = w ? I64 : I32;
      int64_t* v = malloc(sizeof(int64_t) * (size_t)n);
      int64_t* want = malloc(sizeof(int64_t) * 6 * (size_t)(R > C ? R : C));
      int64_t* got = malloc(sizeof(int64_t) * (size_t)(R > C ? R : C));
      void* buf = malloc(8 * (size_t)n);
      DT_ASSERT_TRUE(v != NULL && want != NULL && got != NULL && buf != NULL, "malloc");
      uint64_t s = 0x9e3779b97f4a7c15ull + (uint64_t)sh;
      for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        /* odd: a product of thousands of them stays nonzero modulo 2^64 */
        v[i] = (w ? (int64_t)s : (int64_t)(int32_t)(uint32_t)(s >> 32)) | 1;
      }
      v[n - 2] = w ? INT64_MAX : INT32_MAX;
      v[n / 2 + 1] = w ? INT64_MIN : INT32_MIN;
      if (n == 9000) { /* ties in row 0 of 3 x 3000: the first (lane 255 of a block) must win over
                        * the next (lane 0) and later ones; in column 1500 of the rows too (rows
                        * 0 and 2; not column 0, whose row-0 minimum would win row 0's argmin) */
        v[255] = v[256] = v[2999] = w ? INT64_MAX : INT32_MAX;
        v[1000] = v[1001] = v[2998] = w ? INT64_MIN : INT32_MIN;
        v[1500] = v[7500] = w ? INT64_MIN : INT32_MIN;
      }
      for (int64_t i = 0; i < n; i++) {
        if (w) memcpy((char*)buf + 8 * i, &v[i], 8);
        else { int32_t x = (int32_t)v[i]; memcpy((char*)buf + 4 * i, &x, 4); }
      }
      const int64_t shape[2] = {R, C}, none[1] = {0};
      for (int p = 0; p < 3; p++) {
        const dt_placement_t pl = p == 0 ? dt_replicate() : dt_shard(p - 1);
        dt_tensor_t x;
        DT_ASSERT_OK(dt_tensor_from_full(mesh, d, 2, shape, &pl, buf, &x));
        for (int dim = 0; dim < 2; dim++) {
          const int64_t n_out = dim ? R : C, args[2] = {0, dim};
          int64_t *sum = want, *mx = want + n_out, *mn = want + 2 * n_out;
          reduce_ref(v, R, C, dim, sum, mx, mn, want + 3 * n_out, want + 4 * n_out,
                     want + 5 * n_out);
          const char* ops[6] = {"sum", "amax", "amin", "argmax", "argmin", "prod"};
          for (int k = 0; k < 6; k++) {
            dt_tensor_t r, rr;
            dt_placement_t rep = dt_replicate();
            DT_ASSERT_OK(dt_op_run(ops[k], 1, &x, 2, args, 0, NULL, &r));
            DT_ASSERT_TRUE(dtype_of(r) == (k == 0 || k >= 3 ? I64 : d), "%s dtype", ops[k]);
            DT_ASSERT_OK(dt_tensor_redistribute(r, &rep, &rr));
            const int wide = k == 0 || k >= 3 || w;
            DT_ASSERT_OK(dt_tensor_gather_full(rr, got, (size_t)n_out * (wide ? 8 : 4)));
            for (int64_t o = 0; o < n_out; o++) {
              int64_t g = got[o];
              if (!wide) {
                int32_t g32;
                memcpy(&g32, (char*)got + 4 * o, 4);
                g = g32;
              }
              DT_ASSERT_TRUE(g == want[k * n_out + o], "%s(%s %lldx%lld, dim %d) on %d, "
                             "element %lld: %lld, want %lld", ops[k], dt_dtype_name(d),
                             (long long)R, (long long)C, dim, p, (long long)o, (long long)g,
                             (long long)want[k * n_out + o]);
            }
            DT_ASSERT_OK(dt_tensor_destroy(rr));
            DT_ASSERT_OK(dt_tensor_destroy(r));
          }
        }
        int64_t all = 0;
        for (int64_t i = 0; i < n; i++) all = (int64_t)((uint64_t)all + (uint64_t)v[i]);
        char what[96];
        snprintf(what, sizeof what, "sum(%s %lldx%lld) on %d", dt_dtype_name(d), (long long)R,
                 (long long)C, p);
        expect(what, "sum", 1, &x, 1, none, 0, NULL, I64, -1, 1, &all);
        DT_ASSERT_OK(dt_tensor_destroy(x));
      }
      free(v);
      free(want);
      free(got);
      free(buf);
    }
}

/* ---- where, masked_fill ---------------------------------------------------------------------- */

static void test_select(dt_mesh_t mesh) {
  const int64_t shape[2] = {4, 2};
  const float fc[8] = {0.0f, NAN, -0.0f, 2.0f, 1.0f, 0.0f, -1.0f, 0.5f}; /* NaN is true */
  const int sel[8] = {0, 1, 0, 1, 1, 0, 1, 1};
  for (int w = 0; w < 2; w++) {
    const dt_dtype_t d = w ? I64 : I32;
    const int64_t lo = w ? INT64_MIN : INT32_MIN, hi = w ? INT64_MAX : INT32_MAX;
    const int64_t av[8] = {lo, hi, -1, 0, 1, hi - 1, lo + 1, 123456789};
    const int64_t bv[8] = {hi, lo, 7, -7, 0, 2, 3, -123456789};
    int64_t want[8], cv[8];
    for (int i = 0; i < 8; i++) {
      want[i] = sel[i] ? av[i] : bv[i];
      cv[i] = sel[i] ? (i % 2 ? -3 : 1) : 0;
    }
    for (int ck = 0; ck < 3; ck++) { /* condition i64, f32, bf16 */
      dt_tensor_t in[3];
      in[0] = ck == 0 ? mk(mesh, I64, 2, shape, dt_shard(1), cv)
                      : mkf(mesh, ck == 1 ? F32 : DT_BF16, 2, shape, dt_shard(0), fc);
      in[1] = mk(mesh, d, 2, shape, dt_shard(0), av);
      in[2] = mk(mesh, d, 2, shape, dt_replicate(), bv);
      char what[64];
      snprintf(what, sizeof what, "where(%s, %s, %s)", ck == 0 ? "i64" : ck == 1 ? "f32" : "bf16",
               dt_dtype_name(d), dt_dtype_name(d));
      expect(what, "where", 3, in, 0, NULL, 0, NULL, d, -1, 8, want);
      /* masked_fill(a, mask) with the same condition as its mask */
      const double vals[4] = {2.5, -2.5, (double)INT32_MAX, -3.99};
      const int64_t trunc_[4] = {2, -2, INT32_MAX, -3};
      for (int k = 0; k < 4; k++) {
        dt_tensor_t mf[2] = {in[1], in[0]};
        int64_t wm[8];
        for (int i = 0; i < 8; i++) wm[i] = sel[i] ? trunc_[k] : av[i];
        snprintf(what, sizeof what, "masked_fill(%s, %s mask, %g)", dt_dtype_name(d),
                 ck == 0 ? "i64" : ck == 1 ? "f32" : "bf16", vals[k]);
        expect(what, "masked_fill", 2, mf, 0, NULL, 1, &vals[k], d, -1, 8, wm);
      }
      for (int t = 0; t < 3; t++) DT_ASSERT_OK(dt_tensor_destroy(in[t]));
    }
    /* values that do not fit: refused, as PyTorch ("value cannot be converted ...") */
    const double bad[4] = {w ? 0x1p63 : 0x1p31, w ? -0x1p64 : -2147483649.0, NAN, INFINITY};
    dt_tensor_t x = mk(mesh, d, 2, shape, dt_shard(0), av);
    dt_tensor_t m = mkf(mesh, F32, 2, shape, dt_replicate(), fc);
    for (int k = 0; k < 4; k++) {
      dt_tensor_t mf[2] = {x, m}, r = (dt_tensor_t)0x1;
      DT_ASSERT_STATUS(dt_op_run("masked_fill", 2, mf, 0, NULL, 1, &bad[k], &r), DT_ERR_INVALID_ARG);
      DT_ASSERT_TRUE(r == NULL && strstr(dt_last_error(), "masked_fill: value=") &&
                         strstr(dt_last_error(), "does not fit dtype"),
                     "%s", dt_last_error());
    }
    DT_ASSERT_OK(dt_tensor_destroy(x));
    DT_ASSERT_OK(dt_tensor_destroy(m));
  }
}

/* where(gt(x, y), x, y) = maximum(x, y) with f32 x, y, through the tape: the condition is gt's
 * f32 1 / 0 and gets no gradient; x and y get theirs where they were picked. */
static void test_where_gt_tape(dt_mesh_t mesh) {
  const int64_t shape[2] = {4, 2};
  const float xv[8] = {1, -2, 3, 0.5f, -1, 4, 2, -3}, yv[8] = {0, 1, 3, -0.5f, 2, 4.5f, 1, -4};
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t x, y, c, r, s;
  DT_ASSERT_OK(dt_var_leaf(mkf(mesh, F32, 2, shape, dt_shard(0), xv), 1, &x));
  DT_ASSERT_OK(dt_var_leaf(mkf(mesh, F32, 2, shape, dt_replicate(), yv), 1, &y));
  dt_var_t xy[2] = {x, y};
  DT_ASSERT_OK(dt_ag_op(tape, "gt", 2, xy, 0, NULL, 0, NULL, 1, &c));
  dt_var_t cxy[3] = {c, x, y};
  DT_ASSERT_OK(dt_ag_op(tape, "where", 3, cxy, 0, NULL, 0, NULL, 1, &r));
  const int64_t none[1] = {0};
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &r, 1, none, 0, NULL, 1, &s));
  float got[8], gx[8], gy[8];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_value(r), got, sizeof got));
  DT_ASSERT_OK(dt_tape_backward(tape, s));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(x), gx, sizeof gx));
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(y), gy, sizeof gy));
  for (int i = 0; i < 8; i++) {
    const int pick = xv[i] > yv[i];
    DT_ASSERT_TRUE(got[i] == (pick ? xv[i] : yv[i]) && gx[i] == (float)pick &&
                       gy[i] == (float)!pick,
                   "where(gt(x, y), x, y) element %d: %g, gradients %g, %g", i, (double)got[i],
                   (double)gx[i], (double)gy[i]);
  }
  DT_ASSERT_TRUE(dt_var_grad(c) == NULL, "the condition got a gradient");
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(y));
}

/* Integer results never require a gradient: sum, amax and neg of an i32 leaf that asks for one
 * give results that do not. */
static void test_tape_ints(dt_mesh_t mesh) {
  const int64_t shape[2] = {4, 2}, v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t x, r;
  DT_ASSERT_OK(dt_var_leaf(mk(mesh, I32, 2, shape, dt_shard(0), v), 1, &x));
  const char* ops[4] = {"sum", "amax", "neg", "prod"};
  const int64_t none[1] = {0};
  for (int k = 0; k < 4; k++) {
    DT_ASSERT_OK(dt_ag_op(tape, ops[k], 1, &x, k != 2 ? 1 : 0, none, 0, NULL, 1, &r));
    int rg = -1;
    DT_ASSERT_OK(dt_var_requires_grad(r, &rg));
    DT_ASSERT_TRUE(rg == 0, "%s of an i32 leaf requires a gradient", ops[k]);
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &g_world, NULL, NULL, &mesh));
  dt_backend_t be;
  dt_device_t dev;
  DT_ASSERT_OK(dt_mesh_backend(mesh, &be));
  DT_ASSERT_OK(dt_backend_device(be, &dev));
  g_host = dev == DT_DEVICE_HOST;
  test_neg(mesh);
  test_rounding(mesh);
  test_reductions(mesh);
  test_long_rows(mesh);
  test_select(mesh);
  test_where_gt_tape(mesh);
  test_tape_ints(mesh);
  test_cumsum(mesh);
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  if (g_rank == 0) printf("test_int_ops: ok on %d rank(s)%s\n", g_world, g_host ? "" : " (device)");
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

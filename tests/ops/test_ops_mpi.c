/* test_ops_mpi.c - ops on distributed tensors against a dense single-rank computation.
 *
 * For mm, add (same shape and broadcast), mul, sub, neg, relu, and the reductions sum (dim 0),
 * mean (dim 1, keepdim), amax (dim -2), amin (all dims), softmax (dim 1), log_softmax (dim 0),
 * t and transpose, on meshes (n) and (2, n/2), for
 * every combination of input placements from {R, S(0), S(1), P(sum)} per mesh dim, with uneven
 * shapes: the gathered result equals the dense result exactly (small integers; Partial inputs hold
 * exact fractions; mean and softmax within 1e-6 relative), the output placements are the ones dt_op_select chose, and the collective
 * counters equal the sum of the chosen input redistribution plans (so, e.g., mm(S(1), S(0)) is a
 * Partial with no communication and P * P costs exactly one all-reduce). np 2 and 4. */
#include <math.h>
#include <string.h>

#include "dt_test.h"

static dt_placement_t opt(int k) {
  return k == 0 ? dt_replicate() : k == 1 ? dt_shard(0) : k == 2 ? dt_shard(1)
                                                                 : dt_partial(DT_REDUCE_SUM);
}

typedef enum {
  OP_MM, OP_ADD, OP_ADD_BCAST, OP_MUL, OP_SUB, OP_NEG, OP_RELU,
  OP_SUM0, OP_MEAN1K, OP_AMAX0, OP_AMIN_ALL, OP_SOFTMAX1, OP_LOGSOFTMAX0, OP_T, OP_TRANSPOSE,
  OP_COUNT
} op_t;
static const char* kName[OP_COUNT] = {"mm",   "add",  "add",     "mul",         "sub",
                                      "neg",  "relu", "sum",     "mean",        "amax",
                                      "amin", "softmax", "log_softmax", "t", "transpose"};
/* reduction arguments: [keepdim, dim...] */
static const int64_t kArgs[OP_COUNT][3] = {
    [OP_SUM0] = {0, 0}, [OP_MEAN1K] = {1, 1}, [OP_AMAX0] = {0, -2}, [OP_AMIN_ALL] = {0},
    [OP_SOFTMAX1] = {1}, [OP_LOGSOFTMAX0] = {0}, [OP_TRANSPOSE] = {1, 0}};
static const int kNArgs[OP_COUNT] = {[OP_SUM0] = 2, [OP_MEAN1K] = 2, [OP_AMAX0] = 2,
                                     [OP_AMIN_ALL] = 1, [OP_SOFTMAX1] = 1, [OP_LOGSOFTMAX0] = 1,
                                     [OP_TRANSPOSE] = 2};
/* ops compared with a relative bound (documented): mean divides, softmax exponentiates */
static int inexact(op_t op) { return op == OP_MEAN1K || op == OP_SOFTMAX1 || op == OP_LOGSOFTMAX0; }

/* Dense reference on full tensors. */
static void dense(op_t op, const float* a, const int64_t* as, const float* b, const int64_t* bs,
                  float* out) {
  switch (op) {
    case OP_MM:
      for (int64_t i = 0; i < as[0]; i++)
        for (int64_t j = 0; j < bs[1]; j++) {
          float acc = 0;
          for (int64_t k = 0; k < as[1]; k++) acc += a[i * as[1] + k] * b[k * bs[1] + j];
          out[i * bs[1] + j] = acc;
        }
      break;
    case OP_ADD_BCAST:
      for (int64_t i = 0; i < as[0]; i++)
        for (int64_t j = 0; j < as[1]; j++) out[i * as[1] + j] = a[i * as[1] + j] + b[j];
      break;
    case OP_SUM0:
    case OP_AMAX0:
      for (int64_t j = 0; j < as[1]; j++) {
        float acc = op == OP_SUM0 ? 0.0f : -INFINITY;
        for (int64_t i = 0; i < as[0]; i++) {
          float x = a[i * as[1] + j];
          acc = op == OP_SUM0 ? acc + x : fmaxf(acc, x);
        }
        out[j] = acc;
      }
      break;
    case OP_MEAN1K:
      for (int64_t i = 0; i < as[0]; i++) {
        float acc = 0;
        for (int64_t j = 0; j < as[1]; j++) acc += a[i * as[1] + j];
        out[i] = acc / (float)as[1];
      }
      break;
    case OP_SOFTMAX1:
      for (int64_t i = 0; i < as[0]; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < as[1]; j++) mx = fmax(mx, a[i * as[1] + j]);
        for (int64_t j = 0; j < as[1]; j++) sum += exp(a[i * as[1] + j] - mx);
        for (int64_t j = 0; j < as[1]; j++) out[i * as[1] + j] = (float)(exp(a[i * as[1] + j] - mx) / sum);
      }
      break;
    case OP_LOGSOFTMAX0:
      for (int64_t j = 0; j < as[1]; j++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < as[0]; i++) mx = fmax(mx, a[i * as[1] + j]);
        for (int64_t i = 0; i < as[0]; i++) sum += exp(a[i * as[1] + j] - mx);
        for (int64_t i = 0; i < as[0]; i++) out[i * as[1] + j] = (float)(a[i * as[1] + j] - mx - log(sum));
      }
      break;
    case OP_T:
    case OP_TRANSPOSE:
      for (int64_t i = 0; i < as[0]; i++)
        for (int64_t j = 0; j < as[1]; j++) out[j * as[0] + i] = a[i * as[1] + j];
      break;
    case OP_AMIN_ALL: {
      float acc = INFINITY;
      for (int64_t i = 0; i < as[0] * as[1]; i++) acc = fminf(acc, a[i]);
      out[0] = acc;
      break;
    }
    default:
      for (int64_t i = 0; i < as[0] * as[1]; i++) {
        float x = a[i], y = b ? b[i] : 0;
        out[i] = op == OP_ADD ? x + y : op == OP_MUL ? x * y : op == OP_SUB ? x - y
                 : op == OP_NEG ? -x : (x > 0 ? x : 0);
      }
  }
}

static long long run(dt_mesh_t mesh, int m, op_t op) {
  int64_t as[2] = {7, 5}, bs[2] = {7, 5};
  int nb = 2;
  if (op == OP_MM) bs[0] = 5, bs[1] = 6;
  if (op == OP_ADD_BCAST) nb = 1, bs[0] = 5;
  int unary = op == OP_NEG || op == OP_RELU || op >= OP_SUM0;
  int64_t an = as[0] * as[1], bn = nb == 1 ? bs[0] : bs[0] * bs[1];
  float a[64], b[64], want[64], got[64];
  for (int64_t i = 0; i < an; i++) a[i] = (float)((i * 5 + 2) % 9) - 4.0f;
  for (int64_t i = 0; i < bn; i++) b[i] = (float)((i * 3 + 1) % 7) - 3.0f;
  dense(op, a, as, unary ? NULL : b, bs, want);
  int64_t on = op == OP_MM ? as[0] * bs[1] : op == OP_SUM0 || op == OP_AMAX0 ? as[1]
             : op == OP_MEAN1K ? as[0] : op == OP_AMIN_ALL ? 1 : an;
  int npl = 1;
  for (int i = 0; i < m; i++) npl *= 4;
  long long checked = 0;
  for (int x = 0; x < npl; x++)
    for (int y = 0; y < (unary ? 1 : npl); y++) {
      dt_placement_t pa[4], pb[4];
      int skip = 0;
      for (int i = 0, vx = x, vy = y; i < m; i++, vx /= 4, vy /= 4) {
        pa[i] = opt(vx % 4);
        pb[i] = opt(vy % 4);
        if (nb == 1 && pb[i].kind == DT_SHARD && pb[i].dim == 1) skip = 1; /* 1-D operand */
      }
      if (skip) continue;
      dt_tensor_t ta, tb = NULL, r;
      DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, as, pa, a, &ta));
      if (!unary) DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, nb, bs, pb, b, &tb));
      /* expected strategy and communication */
      dt_op_call_t call;
      memset(&call, 0, sizeof call);
      call.op = kName[op];
      call.n_inputs = unary ? 1 : 2;
      call.in[0] = (dt_tensor_meta_t){DT_F32, 2, {as[0], as[1]}};
      call.in[1] = (dt_tensor_meta_t){DT_F32, nb, {bs[0], bs[1]}};
      call.n_iargs = kNArgs[op];
      memcpy(call.iargs, kArgs[op], sizeof(int64_t) * (size_t)kNArgs[op]);
      dt_placement_t in[2][DT_MAX_MESH_DIMS];
      memcpy(in[0], pa, sizeof pa);
      memcpy(in[1], pb, sizeof pb);
      dt_op_choice_t ch;
      DT_ASSERT_OK(dt_op_select(mesh, &call, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])in, &ch));
      long long want_calls = 0;
      for (int t = 0; t < call.n_inputs; t++) {
        dt_plan_t plan;
        DT_ASSERT_OK(dt_plan_create(mesh, DT_F32, call.in[t].ndim, call.in[t].shape, in[t],
                                    ch.in[t], &plan));
        for (int c = DT_COLL_ALL_GATHER; c <= DT_COLL_ALL_TO_ALL; c++) {
          int k;
          DT_ASSERT_OK(dt_plan_count(plan, (dt_collective_t)c, &k));
          want_calls += k;
        }
        DT_ASSERT_OK(dt_plan_destroy(plan));
      }
      DT_ASSERT_OK(dt_counters_reset(mesh));
      dt_tensor_t ins[2] = {ta, tb};
      DT_ASSERT_OK(dt_op_run(kName[op], call.n_inputs, ins, kNArgs[op], kArgs[op], 0, NULL, &r));
      dt_counters_t cnt;
      DT_ASSERT_OK(dt_counters_get(mesh, &cnt));
      long long calls = 0;
      for (int c = DT_COLL_ALL_GATHER; c <= DT_COLL_ALL_TO_ALL; c++) calls += (long long)cnt.calls[c];
      DT_ASSERT_EQ(calls, want_calls);
      dt_placement_t rp[4];
      DT_ASSERT_OK(dt_tensor_placements(r, rp));
      for (int i = 0; i < m; i++) DT_ASSERT_TRUE(dt_placement_equal(rp[i], ch.out[0][i]), "placement");
      DT_ASSERT_OK(dt_tensor_gather_full(r, got, sizeof(float) * (size_t)on));
      /* exact, except mean: its division rounds differently once partial sums are combined */
      for (int64_t i = 0; i < on; i++)
        if (inexact(op) ? fabsf(got[i] - want[i]) > 1e-6f * (1.0f + fabsf(want[i]))
                        : got[i] != want[i]) {
          char sa[32], sb[32], so[32];
          dt_placements_format(pa, m, ",", sa, sizeof sa);
          dt_placements_format(pb, m, ",", sb, sizeof sb);
          dt_placements_format(rp, m, ",", so, sizeof so);
          DT_ASSERT_TRUE(0, "%s(%s, %s) -> %s: element %lld is %g, want %g", kName[op], sa,
                         unary ? "-" : sb, so, (long long)i, got[i], want[i]);
        }
      DT_ASSERT_OK(dt_tensor_destroy(r));
      DT_ASSERT_OK(dt_tensor_destroy(ta));
      DT_ASSERT_OK(dt_tensor_destroy(tb));
      checked++;
    }
  return checked;
}

/* Named expectations from the issue. */
static void named(dt_mesh_t mesh1) {
  int64_t as[2] = {8, 4}, bs[2] = {4, 6};
  float a[32], b[24];
  for (int i = 0; i < 32; i++) a[i] = (float)(i % 5);
  for (int i = 0; i < 24; i++) b[i] = (float)(i % 3);
  dt_placement_t s1[1] = {dt_shard(1)}, s0[1] = {dt_shard(0)}, p[1] = {dt_partial(DT_REDUCE_SUM)};
  dt_tensor_t ta, tb, r;
  dt_counters_t c;
  DT_ASSERT_OK(dt_tensor_from_full(mesh1, DT_F32, 2, as, s1, a, &ta));
  DT_ASSERT_OK(dt_tensor_from_full(mesh1, DT_F32, 2, bs, s0, b, &tb));
  DT_ASSERT_OK(dt_counters_reset(mesh1));
  DT_ASSERT_OK(dt_mm(ta, tb, &r)); /* mm(S(1), S(0)) -> Partial, no communication */
  DT_ASSERT_OK(dt_counters_get(mesh1, &c));
  dt_placement_t rp[1];
  DT_ASSERT_OK(dt_tensor_placements(r, rp));
  DT_ASSERT_TRUE(dt_placement_equal(rp[0], dt_partial(DT_REDUCE_SUM)), "mm(S1,S0) not Partial");
  DT_ASSERT_EQ(c.redistributes, 0);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  DT_ASSERT_OK(dt_tensor_destroy(ta));
  DT_ASSERT_OK(dt_tensor_destroy(tb));
  int64_t s[2] = {6, 6};
  float v[36];
  for (int i = 0; i < 36; i++) v[i] = (float)(i % 4);
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_from_full(mesh1, DT_F32, 2, s, p, v, &x));
  DT_ASSERT_OK(dt_tensor_from_full(mesh1, DT_F32, 2, s, p, v, &y));
  DT_ASSERT_OK(dt_counters_reset(mesh1));
  DT_ASSERT_OK(dt_add(x, y, &r)); /* P + P -> P, none */
  DT_ASSERT_OK(dt_counters_get(mesh1, &c));
  DT_ASSERT_OK(dt_tensor_placements(r, rp));
  DT_ASSERT_TRUE(rp[0].kind == DT_PARTIAL, "P+P not Partial");
  DT_ASSERT_EQ(c.calls[DT_COLL_ALL_REDUCE] + c.calls[DT_COLL_ALL_GATHER], 0);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  DT_ASSERT_OK(dt_counters_reset(mesh1));
  DT_ASSERT_OK(dt_mul(x, y, &r)); /* P * P -> one all-reduce */
  DT_ASSERT_OK(dt_counters_get(mesh1, &c));
  DT_ASSERT_EQ(c.calls[DT_COLL_ALL_REDUCE], 1);
  DT_ASSERT_EQ(c.calls[DT_COLL_ALL_GATHER] + c.calls[DT_COLL_REDUCE_SCATTER] +
                   c.calls[DT_COLL_ALL_TO_ALL], 0);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  /* bad input: shape mismatch, unknown op, an op without a kernel */
  DT_ASSERT_STATUS(dt_mm(x, tb == NULL ? x : x, &r), DT_SUCCESS); /* 6x6 @ 6x6 is fine */
  DT_ASSERT_OK(dt_tensor_destroy(r));
  int64_t bad[2] = {5, 6};
  dt_tensor_t z;
  DT_ASSERT_OK(dt_tensor_zeros(mesh1, DT_F32, 2, bad, s0, &z));
  r = (dt_tensor_t)0x1;
  DT_ASSERT_STATUS(dt_mm(x, z, &r), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(r == NULL && strstr(dt_last_error(), "shape mismatch"), "%s", dt_last_error());
  dt_tensor_t pair[2] = {x, y};
  DT_ASSERT_STATUS(dt_op_run("frobnicate", 2, pair, 0, NULL, 0, NULL, &r), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "unknown op 'frobnicate'") != NULL, "msg");
  dt_tensor_t zi;
  DT_ASSERT_OK(dt_tensor_zeros(mesh1, DT_I32, 2, s, s0, &zi));
  dt_tensor_t mixed[2] = {x, zi};
  /* add promotes (f32 + i32 -> f32, as PyTorch); mm does not: "mm: dtype mismatch (i32 vs f32)" */
  DT_ASSERT_OK(dt_op_run("add", 2, mixed, 0, NULL, 0, NULL, &r));
  dt_dtype_t rdt;
  DT_ASSERT_OK(dt_tensor_dtype(r, &rdt));
  DT_ASSERT_EQ(rdt, DT_F32);
  DT_ASSERT_OK(dt_tensor_destroy(r));
  r = (dt_tensor_t)0x1;
  DT_ASSERT_STATUS(dt_op_run("mm", 2, mixed, 0, NULL, 0, NULL, &r), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(r == NULL && strstr(dt_last_error(), "mm: dtype mismatch (i32 vs f32)") != NULL,
                 "%s", dt_last_error());
  DT_ASSERT_OK(dt_tensor_destroy(zi));
  DT_ASSERT_OK(dt_tensor_destroy(z));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  dt_mesh_t m1, m2 = NULL;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &m1));
  if (world >= 4 && world % 2 == 0) {
    int s[2] = {2, world / 2};
    DT_ASSERT_OK(dt_mesh_create(2, s, NULL, NULL, &m2));
  }
  long long total = 0;
  for (int op = 0; op < OP_COUNT; op++) {
    total += run(m1, 1, (op_t)op);
    if (m2) total += run(m2, 2, (op_t)op);
  }
  named(m1);
  if (rank == 0) printf("test_ops_mpi np=%d: %lld op calls checked\n", world, total);
  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

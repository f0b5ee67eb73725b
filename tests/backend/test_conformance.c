/* test_conformance.c - every op of the op table, forward and backward, on the cpu backend and on
 * a target backend, compared (ggml's test-backend-ops): the backend conformance harness.
 *
 * Target: $DTENSOR_CONFORMANCE_BACKEND ("guarded" by default; "cuda-emu", "cuda"). A target that
 * cannot be opened here (no GPU, not built) makes the test exit with 77, which ctest reports as
 * skipped. $DTENSOR_CONFORMANCE_OPS (comma-separated op names) limits the run to those ops
 * (coverage is then not checked); $DTENSOR_CONFORMANCE_SAMPLES sets the placement samples.
 *
 * Cases: the PyTorch fixtures (tests/reference/ops_fixtures.json) plus generated inputs for the
 * ops the fixtures do not hold (fused gradient ops, comparisons, dropout, cross-entropy in every
 * reduction mode, redistribute, ...) and for shapes they lack (zero-size dims, empty rows, k = 0
 * GEMMs, large and odd extents); the test fails when an op of the table has no case. Every case
 * whose float inputs are f32 also runs with them as bf16 and as f16: where the cpu backend takes a
 * dtype the target must too (and refuse it with the same status where the cpu refuses it). Each
 * case runs on the 1-D mesh (n) and at np 4 on (2, 2), for all-replicated inputs and a fixed
 * pseudo-random sample of placements (R, S(d), P(sum) for float inputs). The same inputs go to a
 * mesh on each backend; the gathered outputs, and for differentiable ops the input gradients of
 * L = sum(output * r), are compared:
 * - guarded target: bit-identical (both backends run the same host math, so any difference is
 *   memory the guarded backend poisoned: an unwritten output element, a read after free), and
 *   after every case dt_backend_verify must find every guard intact;
 * - other targets: integer outputs and NaN/inf positions identical; float values within the
 *   normalized mean squared error nmse = sum((x - ref)^2) / sum(ref^2) of the op's tolerance
 *   (kTol: per op and per output dtype class; f32 default 1e-10, bf16/f16 default 1e-4: one
 *   bf16 rounding apart on one element of a small tensor is already ~1e-5), which covers another
 *   summation order, fused multiply-adds and another plan (a device mesh prices host staging, so
 *   its strategy may reduce half-precision partials elsewhere) but not a wrong index or formula.
 * The rank-local ops from_local and all_to_all_single run with replicated inputs only (their
 * inputs' local shapes must fit together; all_to_all_single's splits are made per mesh: 6 rows
 * split unevenly, with an empty split at np 4).
 * In-place ops (adamw, scale_) run the same way and compare every input afterwards; the inputs
 * they update share one sampled placement (a 0-d input stays Replicate), the others are sampled
 * freely (a Partial gradient is reduced on the way in).
 */
#include <math.h>
#include <string.h>

#include "dt_test_fixture.h"

static int g_samples = 6;
static int g_fwd_only; /* the running case is one of kGenFwd */

typedef struct {
  const char* op;
  int nin;
  dt_dtype_t dtype[FX_MAXT];
  int ndim[FX_MAXT];
  int64_t shape[FX_MAXT][4];
  int64_t hi[FX_MAXT]; /* integer inputs: values in [0, hi) */
  int nia, nfa;
  int64_t iargs[8];
  double fargs[8];
  int redistribute; /* iargs: one encoded S(0) placement per mesh dim, filled per mesh */
} gen_case_t;

#define F DT_F32
#define L DT_I64
#define B DT_BF16
/* inputs for the ops the fixtures do not cover, and shapes they lack */
static const gen_case_t kGen[] = {
    /* zero-size dims, empty reductions and k = 0 GEMMs */
    {"add", 2, {F, F}, {2, 2}, {{0, 5}, {0, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"mul", 2, {F, F}, {2, 2}, {{3, 0}, {1, 0}}, {0}, 0, 0, {0}, {0}, 0},
    {"exp", 1, {F}, {2}, {{0, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"sum", 1, {F}, {2}, {{0, 3}}, {0}, 2, 0, {0, 0}, {0}, 0},
    {"sum", 1, {F}, {2}, {{4, 0}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"softmax", 1, {F}, {2}, {{0, 7}}, {0}, 1, 0, {1}, {0}, 0},
    {"mm", 2, {F, F}, {2, 2}, {{0, 4}, {4, 3}}, {0}, 0, 0, {0}, {0}, 0},
    {"mm", 2, {F, F}, {2, 2}, {{3, 0}, {0, 2}}, {0}, 0, 0, {0}, {0}, 0},
    {"cat", 2, {F, F}, {2, 2}, {{0, 3}, {2, 3}}, {0}, 1, 0, {0}, {0}, 0},
    /* large and odd extents (several blocks, partial tiles) */
    {"add", 2, {F, F}, {2, 2}, {{257, 129}, {1, 129}}, {0}, 0, 0, {0}, {0}, 0},
    {"gelu", 1, {F}, {2}, {{131, 67}}, {0}, 0, 0, {0}, {0}, 0},
    {"softmax", 1, {F}, {2}, {{33, 1000}}, {0}, 1, 0, {1}, {0}, 0},
    {"log_softmax", 1, {F}, {3}, {{3, 517, 5}}, {0}, 1, 0, {1}, {0}, 0},
    {"sum", 1, {F}, {3}, {{5, 300, 7}}, {0}, 3, 0, {0, 0, 2}, {0}, 0},
    {"amax", 1, {F}, {2}, {{67, 1031}}, {0}, 2, 0, {1, 1}, {0}, 0},
    /* reductions long enough for several passes on a device (a pass per 4096 elements beyond
     * 8192), and norm gradients over several chunks of rows (128 each) */
    {"sum", 1, {F}, {2}, {{37, 1000}}, {0}, 1, 0, {0}, {0}, 0},
    {"mean", 1, {F}, {2}, {{3, 20000}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"amin", 1, {F}, {1}, {{9000}}, {0}, 1, 0, {0}, {0}, 0},
    /* argmax / argmin / logsumexp: rows taking a warp or the block (ties: bf16 rounding and
     * integers in [0, 50) on 3000-element rows; the first position must win across lanes), a
     * strided reduced dim, the flattened index, an empty kept dim and an empty reduction */
    {"argmax", 1, {F}, {2}, {{3, 3000}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"argmin", 1, {F}, {2}, {{67, 1031}}, {0}, 2, 0, {1, 0}, {0}, 0},
    {"argmax", 1, {F}, {2}, {{37, 1000}}, {0}, 1, 0, {0}, {0}, 0},
    {"argmax", 1, {L}, {2}, {{3, 3000}}, {50}, 2, 0, {0, 1}, {0}, 0},
    {"argmin", 1, {L}, {2}, {{300, 7}}, {50}, 2, 0, {0, 0}, {0}, 0},
    {"argmin", 1, {F}, {2}, {{0, 3}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"logsumexp", 1, {F}, {2}, {{3, 3000}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"logsumexp", 1, {F}, {3}, {{5, 300, 7}}, {0}, 3, 0, {1, 0, 2}, {0}, 0},
    {"logsumexp", 1, {F}, {2}, {{4, 0}}, {0}, 2, 0, {1, 1}, {0}, 0},
    /* var / std: rows taking a warp or the block, strided and several reduced dims, the whole
     * tensor, corrections 0 and 2, bf16 storage read by the device kernel, an empty reduction
     * (NaN) and N <= correction (inf) */
    {"var", 1, {F}, {2}, {{3, 3000}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"std", 1, {F}, {2}, {{3, 3000}}, {0}, 2, 1, {1, 1}, {0.0}, 0},
    {"var", 1, {F}, {3}, {{5, 300, 7}}, {0}, 3, 1, {1, 0, 2}, {2.0}, 0},
    {"std", 1, {F}, {2}, {{67, 1031}}, {0}, 2, 0, {0, 0}, {0}, 0},
    {"var", 1, {F}, {2}, {{37, 1000}}, {0}, 1, 0, {0}, {0}, 0},
    {"std", 1, {B}, {2}, {{3, 3000}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"var", 1, {B}, {3}, {{4, 33, 9}}, {0}, 3, 1, {0, 2, 0}, {0.0}, 0},
    {"var", 1, {F}, {2}, {{4, 0}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"std", 1, {F}, {2}, {{6, 2}}, {0}, 2, 1, {0, 1}, {3.0}, 0},
    /* prod: rows taking a warp or the block and long enough for device passes (3 x 20000),
     * strided, the whole tensor, an empty reduction (1), i64 products wrapping past 2^63 */
    {"prod", 1, {F}, {2}, {{3, 3000}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"prod", 1, {F}, {2}, {{3, 20000}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"prod", 1, {F}, {3}, {{5, 300, 7}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"prod", 1, {F}, {2}, {{67, 31}}, {0}, 2, 0, {0, 0}, {0}, 0},
    {"prod", 1, {F}, {2}, {{4, 5}}, {0}, 1, 0, {0}, {0}, 0},
    {"prod", 1, {F}, {2}, {{4, 0}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"prod", 1, {L}, {2}, {{3, 3000}}, {50}, 2, 0, {0, 1}, {0}, 0},
    {"prod", 1, {L}, {2}, {{300, 7}}, {1000000}, 2, 0, {0, 1}, {0}, 0},
    {"rms_norm_grad", 3, {F, F, F}, {2, 2, 1}, {{300, 24}, {300, 24}, {24}}, {0}, 0, 1, {0}, {1e-5},
     0},
    {"layer_norm_grad", 3, {F, F, F}, {3, 3, 1}, {{2, 150, 40}, {2, 150, 40}, {40}}, {0}, 0, 1, {0},
     {1e-5}, 0},
    {"rms_norm", 2, {F, F}, {2, 1}, {{9, 515}, {515}}, {0}, 0, 1, {0}, {1e-5}, 0},
    {"layer_norm", 3, {F, F, F}, {2, 1, 1}, {{9, 515}, {515}, {515}}, {0}, 0, 1, {0}, {1e-5}, 0},
    {"mm", 2, {F, F}, {2, 2}, {{130, 70}, {70, 90}}, {0}, 0, 0, {0}, {0}, 0},
    {"linear", 3, {F, F, F}, {2, 2, 1}, {{66, 65}, {47, 65}, {47}}, {0}, 0, 0, {0}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 2, 67, 64}, {1, 2, 67, 64}, {1, 2, 67, 64}}, {0}, 2, 0,
     {1, 0}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{2, 4, 37, 16}, {2, 2, 41, 16}, {2, 2, 41, 16}}, {0}, 2, 0,
     {0, 0}, {0}, 0},
    /* attention's cases (both CUDA paths, see tests/CMakeLists.txt): layout 1 (B, S, H, D) with
     * 3 query heads per kv head, S != T both ways under the causal mask, E != D, odd extents,
     * partial tiles, zero-size B, S, T, D and E */
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{2, 13, 6, 5}, {2, 19, 2, 5}, {2, 19, 2, 7}}, {0}, 2, 0,
     {1, 1}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 9, 3, 8}, {1, 5, 3, 8}, {1, 5, 3, 4}}, {0}, 2, 1,
     {0, 1}, {0.7}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{2, 2, 11, 4}, {2, 1, 6, 4}, {2, 1, 6, 3}}, {0}, 2, 0,
     {1, 0}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{2, 45, 4, 24}, {2, 45, 2, 24}, {2, 45, 2, 20}}, {0}, 2, 0,
     {1, 1}, {0}, 0},
    /* three key tiles of the tensor-core kernels (64 keys), two query tiles, S < T under the
     * causal mask, features not multiples of 16 */
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 4, 100, 40}, {1, 2, 150, 40}, {1, 2, 150, 24}}, {0}, 2,
     0, {1, 0}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 2, 3, 4}, {1, 2, 0, 4}, {1, 2, 0, 5}}, {0}, 2, 0,
     {0, 0}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{2, 0, 2, 4}, {2, 3, 1, 4}, {2, 3, 1, 4}}, {0}, 2, 0,
     {1, 1}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 2, 3, 0}, {1, 2, 4, 0}, {1, 2, 4, 3}}, {0}, 2, 0,
     {1, 0}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 3, 2, 4}, {1, 5, 1, 4}, {1, 5, 1, 0}}, {0}, 2, 0,
     {0, 1}, {0}, 0},
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{0, 2, 3, 4}, {0, 2, 3, 4}, {0, 2, 3, 4}}, {0}, 2, 0,
     {0, 0}, {0}, 0},
    {"sdpa_grad", 4, {F, F, F, F}, {4, 4, 4, 4},
     {{2, 7, 4, 6}, {2, 10, 2, 6}, {2, 10, 2, 3}, {2, 7, 4, 3}}, {0}, 2, 0, {1, 1}, {0}, 0},
    /* dO of another dtype than q, k, v (the rules leave it free) */
    {"sdpa_grad", 4, {B, B, B, F}, {4, 4, 4, 4},
     {{1, 3, 2, 4}, {1, 5, 1, 4}, {1, 5, 1, 3}, {1, 3, 2, 3}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"transpose", 1, {F}, {3}, {{7, 129, 33}}, {0}, 2, 0, {0, 2}, {0}, 0},
    {"embedding", 2, {F, L}, {2, 2}, {{1000, 72}, {3, 41}}, {0, 1000}, 0, 0, {0}, {0}, 0},
    {"index_select", 2, {F, L}, {3, 1}, {{6, 50, 7}, {33}}, {0, 50}, 1, 0, {1}, {0}, 0},
    {"index_select", 2, {L, L}, {2, 1}, {{40, 3}, {9}}, {20, 40}, 1, 0, {0}, {0}, 0},
    {"mm_t", 2, {F, F}, {2, 2}, {{6, 5}, {6, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"eq", 2, {F, F}, {2, 2}, {{4, 5}, {4, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"ge", 2, {F, F}, {2, 2}, {{4, 5}, {1, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"gt", 2, {F, F}, {2, 2}, {{4, 5}, {4, 1}}, {0}, 0, 0, {0}, {0}, 0},
    {"ne", 2, {F, F}, {2, 2}, {{4, 5}, {4, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"lt", 2, {F, F}, {2, 2}, {{4, 5}, {1, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"le", 2, {F, F}, {2, 2}, {{4, 5}, {4, 1}}, {0}, 0, 0, {0}, {0}, 0},
    {"abs", 1, {F}, {2}, {{4, 5}}, {0}, 0, 0, {0}, {0}, 0},
    {"clamp", 1, {F}, {2}, {{4, 5}}, {0}, 0, 2, {0}, {-0.5, 0.75}, 0},
    {"clamp", 1, {F}, {2}, {{4, 5}}, {0}, 0, 2, {0}, {NAN, 0.25}, 0},
    {"sin", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"cos", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"reciprocal", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"log1p", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"expm1", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    /* stack along an inner and the first dim (i64: raw storage); tril / triu with sampled shards of the matrix dims (the kernels read the offsets), bf16
     * storage, a far diagonal; cumsum forward and reverse (the gradient's form), long lines (one
     * thread per line scans in the host's order), an inner stride, i64 into i64, empty */
    {"stack", 3, {F, F, F}, {3, 3, 3}, {{2, 5, 3}, {2, 5, 3}, {2, 5, 3}}, {0}, 1, 0, {2}, {0}, 0},
    {"stack", 2, {L, L}, {2, 2}, {{7, 3}, {7, 3}}, {9, 9}, 1, 0, {-3}, {0}, 0},
    {"tril", 1, {F}, {3}, {{3, 9, 11}}, {0}, 1, 0, {2}, {0}, 0},
    {"triu", 1, {F}, {3}, {{2, 13, 6}}, {0}, 1, 0, {-3}, {0}, 0},
    {"triu", 1, {B}, {2}, {{7, 7}}, {0}, 1, 0, {1}, {0}, 0},
    {"tril", 1, {L}, {2}, {{6, 4}}, {100}, 1, 0, {-20}, {0}, 0},
    {"cumsum", 1, {F}, {2}, {{3, 5000}}, {0}, 1, 0, {1}, {0}, 0},
    {"cumsum", 1, {F}, {3}, {{4, 300, 7}}, {0}, 2, 0, {1, 1}, {0}, 0},
    {"cumsum", 1, {B}, {2}, {{9, 40}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"cumsum", 1, {L}, {2}, {{6, 700}}, {1000}, 1, 0, {-1}, {0}, 0},
    {"cumsum", 1, {L}, {2}, {{6, 70}}, {1000}, 2, 0, {0, 1}, {0}, 0},
    {"cumsum", 1, {F}, {2}, {{0, 4}}, {0}, 1, 0, {1}, {0}, 0},
    {"floor", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"ceil", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"round", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"round", 1, {F}, {2}, {{5, 7}}, {0}, 1, 0, {1}, {0}, 0},  /* decimals (f16: refused) */
    {"round", 1, {F}, {2}, {{5, 7}}, {0}, 1, 0, {-1}, {0}, 0},
    {"trunc", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"sign", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"erf", 1, {F}, {2}, {{5, 7}}, {0}, 0, 0, {0}, {0}, 0},
    {"floor", 1, {L}, {2}, {{5, 7}}, {9}, 0, 0, {0}, {0}, 0}, /* integers: kept, sign 0 / 1 */
    {"round", 1, {L}, {2}, {{5, 7}}, {9}, 0, 0, {0}, {0}, 0},
    {"sign", 1, {L}, {2}, {{5, 7}}, {3}, 0, 0, {0}, {0}, 0},
    {"gather_dim", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 0, 0, {0}, {0}, 0},
    {"dropout", 1, {F}, {2}, {{6, 8}}, {0}, 1, 1, {7}, {0.3}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {0}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {1}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {2}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {3}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {4}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 0, {5}, {0}, 0},
    {"act_grad", 2, {F, F}, {2, 2}, {{4, 6}, {4, 6}}, {0}, 1, 2, {6}, {-0.5, 0.75}, 0},
    {"rms_norm_grad", 3, {F, F, F}, {2, 2, 1}, {{4, 6}, {4, 6}, {6}}, {0}, 0, 1, {0}, {1e-5}, 0},
    {"layer_norm_grad", 3, {F, F, F}, {2, 2, 1}, {{4, 6}, {4, 6}, {6}}, {0}, 0, 1, {0}, {1e-5}, 0},
    {"embedding_grad", 2, {F, L}, {3, 2}, {{3, 5, 4}, {3, 5}}, {0, 7}, 1, 0, {7}, {0}, 0},
    {"sdpa_grad", 4, {F, F, F, F}, {4, 4, 4, 4},
     {{2, 2, 4, 3}, {2, 1, 4, 3}, {2, 1, 4, 3}, {2, 2, 4, 3}}, {0}, 2, 0, {1, 0}, {0}, 0},
    {"cross_entropy", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 1, 0, {0}, {0}, 0},
    {"cross_entropy", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 1, 0, {1}, {0}, 0},
    {"cross_entropy", 2, {F, L}, {2, 1}, {{6, 5}, {6}}, {0, 5}, 1, 0, {2}, {0}, 0},
    {"redistribute", 1, {F}, {2}, {{7, 4}}, {0}, 0, 0, {0}, {0}, 1},
    {"grouped_mm", 3, {F, F, L}, {2, 3, 1}, {{6, 4}, {3, 5, 4}, {3}}, {0, 0, 7}, 1, 0, {1}, {0}, 0},
    {"grouped_mm", 3, {F, F, L}, {2, 3, 1}, {{6, 4}, {3, 4, 5}, {3}}, {0, 0, 7}, 1, 0, {0}, {0}, 0},
    {"grouped_mm_wgrad", 3, {F, F, L}, {2, 2, 1}, {{6, 4}, {6, 5}, {3}}, {0, 0, 7}, 0, 0, {0}, {0}, 0},
    {"moe_route", 1, {L}, {2}, {{5, 2}}, {3}, 2, 0, {3, 0}, {0}, 0},
    {"moe_route", 1, {L}, {2}, {{5, 2}}, {3}, 2, 0, {3, 2}, {0}, 0},
    {"index_add", 3, {F, L, F}, {2, 1, 2}, {{5, 4}, {6}, {6, 4}}, {0, 5}, 0, 0, {0}, {0}, 0},
    {"to_local", 1, {F}, {2}, {{7, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"from_local", 2, {F, F}, {2, 2}, {{6, 4}, {6, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"all_to_all_single", 2, {F, L}, {2, 1}, {{6, 3}, {0}}, {0, 1}, 1, 0, {0}, {0}, 0},
    /* ring attention over mesh dim 0: causal load-balanced (auto), GQA in order over the
     * all-gather, (B, S, H, D) over the ring */
    {"ring_attention", 3, {F, F, F}, {4, 4, 4}, {{1, 2, 8, 4}, {1, 2, 8, 4}, {1, 2, 8, 4}}, {0}, 5,
     0, {0, 1, 0, 1, 0}, {0}, 0},
    {"ring_attention", 3, {F, F, F}, {4, 4, 4}, {{2, 4, 8, 4}, {2, 2, 8, 4}, {2, 2, 8, 3}}, {0}, 5,
     0, {0, 0, 0, 0, 2}, {0}, 0},
    {"ring_attention", 3, {F, F, F}, {4, 4, 4}, {{1, 8, 2, 4}, {1, 8, 2, 4}, {1, 8, 2, 4}}, {0}, 5,
     0, {0, 1, 1, 1, 1}, {0}, 0},
    /* asynchronous TP's linears over mesh dim 0: the sequence (dim 1) gathered or scattered,
     * uneven at np 2 and 4 (7 rows); a dim between the sequence and the features */
    {"all_gather_linear", 2, {F, F}, {3, 2}, {{2, 7, 5}, {6, 5}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"all_gather_linear", 2, {F, F}, {4, 2}, {{1, 8, 3, 4}, {5, 4}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"linear_reduce_scatter", 2, {F, F}, {3, 2}, {{2, 7, 8}, {5, 8}}, {0}, 2, 0, {0, 1}, {0}, 0},
    {"linear_reduce_scatter", 2, {F, F}, {4, 2}, {{1, 8, 3, 4}, {6, 4}}, {0}, 2, 0, {0, -3}, {0},
     0},
    {"sumsq", 1, {F}, {2}, {{7, 4}}, {0}, 0, 0, {0}, {0}, 0},
    {"scale_", 1, {F}, {2}, {{7, 4}}, {0}, 0, 1, {0}, {-0.75}, 0},
    {"adamw", 5, {F, F, F, F, L}, {2, 2, 2, 2, 0}, {{5, 6}, {5, 6}, {5, 6}, {5, 6}, {0}},
     {0, 0, 0, 0, 4}, 0, 5, {0}, {1e-2, 0.9, 0.999, 1e-8, 0.1}, 0},
    {"adamw", 5, {F, F, B, B, L}, {2, 2, 2, 2, 0}, {{5, 6}, {5, 6}, {5, 6}, {5, 6}, {0}},
     {0, 0, 0, 0, 4}, 0, 5, {0}, {1e-2, 0.9, 0.95, 1e-6, 0.0}, 0},
};
/* cases whose outputs alone are compared: their gradients are too ill-conditioned for bf16/f16;
 * their keys ramp up along the sequence (gen_tensor) */
static const gen_case_t kGenFwd[] = {
    /* sharp scores (scale 40): row maxima grow by far more than the tensor-core forward's lazy
     * rescaling threshold from one key tile to the next (near one-hot softmax rows give gradients
     * near 0 that P's rounding to bf16 dominates, on either device path) */
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 2, 70, 16}, {1, 2, 200, 16}, {1, 2, 200, 16}}, {0}, 2,
     1, {0, 0}, {40.0}, 0},
    /* sharper (scale 3000): a later tile's max above the earlier ones' by more than exp's range
     * (the earlier terms must vanish, not stay) */
    {"sdpa", 3, {F, F, F}, {4, 4, 4}, {{1, 2, 70, 16}, {1, 2, 200, 16}, {1, 2, 200, 16}}, {0}, 2,
     1, {0, 0}, {3000.0}, 0},
};
#undef F
#undef L
#undef B

static int g_rank;
static dt_backend_t g_cpu, g_target;
static const char* g_target_name = "guarded";
static int g_exact; /* the target runs the host's math: bit-identical results, guards checked */
static const char* g_only; /* DTENSOR_CONFORMANCE_OPS */
static long long g_outputs, g_grads, g_checks, g_dtype_variants, g_refused;
static double g_worst_nmse;
static char g_worst_op[64];

/* Tolerances (nmse) of the non-exact targets, per op: f32 outputs, then bf16/f16 outputs. */
typedef struct {
  const char* op;
  double f32, half;
} tol_t;
static const tol_t kTol[] = {
    {"sdpa", 1e-9, 1e-4},          {"sdpa_grad", 1e-9, 1e-4},  {"log_softmax", 1e-10, 1e-4},
    {"layer_norm_grad", 1e-9, 1e-4}, {"rms_norm_grad", 1e-9, 1e-4},
};

static double tolerance(const char* op, dt_dtype_t dt) {
  for (size_t i = 0; i < sizeof kTol / sizeof kTol[0]; i++)
    if (strcmp(kTol[i].op, op) == 0) return dt == DT_F32 ? kTol[i].f32 : kTol[i].half;
  return dt == DT_F32 ? 1e-10 : 1e-4;
}

static int wanted(const char* op) {
  if (g_only == NULL) return 1;
  size_t n = strlen(op);
  for (const char* p = g_only; *p;) {
    const char* e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, op, n) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}
static char g_seen[256][32];
static int g_nseen;

static void seen(const char* op) {
  for (int i = 0; i < g_nseen; i++)
    if (strcmp(g_seen[i], op) == 0) return;
  snprintf(g_seen[g_nseen++], sizeof g_seen[0], "%s", op);
}

/* Deterministic inputs: small multiples of 1/8 (exact in bf16) with repeats (ties for the
 * comparisons), integers in [0, hi); the grouped GEMMs' counts (2, 0, 4) sum to their 6 rows. */
/* Input t of case g (k its index): a pattern of period 23; with ramp, input 1 (attention's keys)
 * grows with its row, so that later key tiles hold larger scores. */
static void gen_tensor(const gen_case_t* g, int t, int k, int ramp, fx_tensor_t* x) {
  x->dtype = g->dtype[t];
  x->ndim = g->ndim[t];
  x->numel = 1;
  for (int d = 0; d < x->ndim; d++) {
    x->shape[d] = g->shape[t][d];
    x->numel *= x->shape[d];
  }
  x->data = malloc(sizeof(double) * (size_t)(x->numel ? x->numel : 1));
  for (int64_t i = 0; i < x->numel; i++) {
    int64_t h = (i * 37 + t * 11 + k * 5) % 23;
    x->data[i] = x->dtype == DT_I64 ? (double)(h % g->hi[t]) : (double)(h % 9 - 4) * 0.125 + 0.0625;
    if (strcmp(g->op, "adamw") == 0 && t == 3) x->data[i] = fabs(x->data[i]); /* exp_avg_sq */
    if (strncmp(g->op, "grouped_mm", 10) == 0 && t == 2) x->data[i] = (double)(i == 0 ? 2 : i == 1 ? 0 : 4);
    if (ramp && t == 1) x->data[i] += (double)(i / x->shape[x->ndim - 1]) * 0.005;
  }
}

static void gathered(dt_tensor_t t, void** buf, size_t* nb) {
  dt_dtype_t dt;
  int nd;
  int64_t shape[DT_MAX_DIMS], n = 1;
  DT_ASSERT_OK(dt_tensor_dtype(t, &dt));
  DT_ASSERT_OK(dt_tensor_ndim(t, &nd));
  DT_ASSERT_OK(dt_tensor_shape(t, shape));
  for (int d = 0; d < nd; d++) n *= shape[d];
  *nb = fx_itemsize(dt) * (size_t)n;
  *buf = malloc(*nb ? *nb : 1);
  DT_ASSERT_OK(dt_tensor_gather_full(t, *buf, *nb));
}

/* The target's tensor b matches the cpu's a: the same bytes (exact targets, integer outputs), or
 * NaN/inf in the same places and the other values within the op's nmse tolerance. */
static void same(dt_tensor_t a, dt_tensor_t b, const char* what, const char* op, int combo) {
  void *x, *y;
  size_t nx, ny;
  gathered(a, &x, &nx);
  gathered(b, &y, &ny);
  DT_ASSERT_EQ(nx, ny);
  dt_dtype_t dt, dtb;
  DT_ASSERT_OK(dt_tensor_dtype(a, &dt));
  DT_ASSERT_OK(dt_tensor_dtype(b, &dtb));
  DT_ASSERT_EQ(dt, dtb);
  size_t item = fx_itemsize(dt), n = nx / item;
  int is_float = dt == DT_F32 || dt == DT_BF16 || dt == DT_F16;
  if (g_exact || !is_float) {
    for (size_t i = 0; i < n && memcmp(x, y, nx) != 0; i++)
      if (memcmp((char*)x + i * item, (char*)y + i * item, item) != 0)
        DT_ASSERT_TRUE(0, "%s (combo %d, %s): %s element %zu: cpu %.9g, %s %.9g", op, combo,
                       dt_dtype_name(dt), what, i, fx_unpack(x, dt, (int64_t)i), g_target_name,
                       fx_unpack(y, dt, (int64_t)i));
  } else {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
      double r = fx_unpack(x, dt, (int64_t)i), v = fx_unpack(y, dt, (int64_t)i);
      if (!isfinite(r) || !isfinite(v)) {
        DT_ASSERT_TRUE((isnan(r) && isnan(v)) || r == v, "%s (combo %d, %s): %s element %zu: "
                       "cpu %.9g, %s %.9g", op, combo, dt_dtype_name(dt), what, i, r,
                       g_target_name, v);
        continue;
      }
      num += (v - r) * (v - r);
      den += r * r;
    }
    double nmse = den > 0.0 ? num / den : num;
    if (nmse > g_worst_nmse) {
      g_worst_nmse = nmse;
      snprintf(g_worst_op, sizeof g_worst_op, "%s %s %s", op, dt_dtype_name(dt), what);
    }
    if (nmse > tolerance(op, dt)) { /* name the worst element */
      size_t worst = 0;
      double wd = -1.0;
      for (size_t i = 0; i < n; i++) {
        double d = fabs(fx_unpack(y, dt, (int64_t)i) - fx_unpack(x, dt, (int64_t)i));
        if (d > wd) {
          wd = d;
          worst = i;
        }
      }
      DT_ASSERT_TRUE(0, "%s (combo %d, %s): %s: nmse %.3g above %.3g (element %zu: cpu %.9g, "
                     "%s %.9g)", op, combo, dt_dtype_name(dt), what, nmse, tolerance(op, dt),
                     worst, fx_unpack(x, dt, (int64_t)worst), g_target_name,
                     fx_unpack(y, dt, (int64_t)worst));
    }
  }
  g_checks++;
  free(x);
  free(y);
}

static void verify_target(const char* op, int combo) {
  int64_t n_err = 0;
  dt_status_t st = dt_backend_verify(g_target, &n_err);
  DT_ASSERT_TRUE(st == DT_SUCCESS && n_err == 0, "%s (combo %d): %s backend damage: %s", op,
                 combo, g_target_name, dt_last_error());
}

static int is_float_dt(dt_dtype_t t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

/* Runs op once on each backend's mesh with the same inputs and placements; compares outputs and,
 * when `grad`, the input gradients of sum(out0 * r). */
static void run_pair(dt_mesh_t mc, dt_mesh_t mg, const char* op, int nin, const fx_tensor_t* in,
                     void* const* packed, dt_placement_t pl[][DT_MAX_MESH_DIMS], int nia,
                     const int64_t* iargs, int nfa, const double* fargs, int nout, int grad,
                     int combo, dt_dtype_t variant) {
  dt_mesh_t meshes[2] = {mc, mg};
  dt_tape_t tape[2];
  dt_var_t v[2][FX_MAXT], outs[2][3], loss[2];
  dt_status_t st[2];
  for (int b = 0; b < 2; b++) {
    DT_ASSERT_OK(dt_tape_create(&tape[b]));
    for (int t = 0; t < nin; t++) {
      dt_tensor_t x;
      DT_ASSERT_OK(dt_tensor_from_full(meshes[b], in[t].dtype, in[t].ndim, in[t].shape, pl[t],
                                       packed[t], &x));
      int rg = grad && is_float_dt(in[t].dtype);
      DT_ASSERT_OK(dt_var_leaf(x, rg, &v[b][t]));
    }
    st[b] = dt_ag_op(tape[b], op, nin, v[b], nia, iargs, nfa, fargs, nout, outs[b]);
    if (b == 0 && st[0] != DT_SUCCESS && !variant)
      DT_ASSERT_TRUE(0, "%s on the cpu backend (combo %d): %s", op, combo, dt_last_error());
  }
  /* a dtype variant the cpu refuses must be refused alike */
  DT_ASSERT_TRUE(st[0] == st[1], "%s (combo %d, %s inputs): cpu says %s, %s says %s (%s)", op,
                 combo, variant ? dt_dtype_name(variant) : "fixture", dt_status_name(st[0]),
                 g_target_name, dt_status_name(st[1]), dt_last_error());
  if (st[0] != DT_SUCCESS) {
    g_refused++;
    for (int b = 0; b < 2; b++) {
      DT_ASSERT_OK(dt_tape_destroy(tape[b]));
      for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_var_destroy(v[b][t]));
    }
    return;
  }
  char what[64];
  for (int o = 0; o < nout; o++) {
    snprintf(what, sizeof what, "output %d", o);
    same(dt_var_value(outs[0][o]), dt_var_value(outs[1][o]), what, op, combo);
    g_outputs++;
  }
  dt_dtype_t odt;
  DT_ASSERT_OK(dt_tensor_dtype(dt_var_value(outs[0][0]), &odt));
  int any_float = 0;
  for (int t = 0; t < nin; t++) any_float |= is_float_dt(in[t].dtype);
  if (grad && any_float && is_float_dt(odt)) {
    for (int b = 0; b < 2; b++) {
      dt_tensor_t o0 = dt_var_value(outs[b][0]);
      int nd;
      int64_t shape[DT_MAX_DIMS];
      DT_ASSERT_OK(dt_tensor_ndim(o0, &nd));
      DT_ASSERT_OK(dt_tensor_shape(o0, shape));
      fx_tensor_t r = {odt, nd, {0}, 1, NULL};
      for (int d = 0; d < nd; d++) r.numel *= r.shape[d] = shape[d];
      r.data = malloc(sizeof(double) * (size_t)(r.numel ? r.numel : 1));
      for (int64_t i = 0; i < r.numel; i++) r.data[i] = (double)((i * 7) % 5 - 2) * 0.25;
      void* rp = fx_pack(&r);
      dt_placement_t rep[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
      dt_tensor_t rt;
      DT_ASSERT_OK(dt_tensor_from_full(meshes[b], odt, nd, shape, rep, rp, &rt));
      free(rp);
      free(r.data);
      dt_var_t rv, prod, pair[2];
      DT_ASSERT_OK(dt_tape_constant(tape[b], rt, &rv));
      pair[0] = outs[b][0];
      pair[1] = rv;
      DT_ASSERT_OK(dt_ag_op(tape[b], "mul", 2, pair, 0, NULL, 0, NULL, 1, &prod));
      const int64_t all[1] = {0};
      DT_ASSERT_OK(dt_ag_op(tape[b], "sum", 1, &prod, 1, all, 0, NULL, 1, &loss[b]));
      st[b] = dt_tape_backward(tape[b], loss[b]);
    }
    DT_ASSERT_TRUE(st[0] == st[1], "%s backward (combo %d): cpu says %s, %s says %s (%s)", op,
                   combo, dt_status_name(st[0]), g_target_name, dt_status_name(st[1]),
                   dt_last_error());
    for (int t = 0; t < nin && st[0] == DT_SUCCESS; t++) {
      dt_tensor_t ga = dt_var_grad(v[0][t]), gb = dt_var_grad(v[1][t]);
      DT_ASSERT_TRUE((ga == NULL) == (gb == NULL), "%s: input %d has a gradient on one backend only",
                     op, t);
      if (ga == NULL) continue;
      snprintf(what, sizeof what, "gradient of input %d", t);
      same(ga, gb, what, op, combo);
      g_grads++;
    }
  }
  for (int b = 0; b < 2; b++) {
    DT_ASSERT_OK(dt_tape_destroy(tape[b]));
    for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_var_destroy(v[b][t]));
  }
  verify_target(op, combo);
}

/* An in-place op on both backends: every input compared afterwards. 0 when the op refused the
 * placements (the same way on both). */
static int run_inplace_pair(dt_mesh_t mc, dt_mesh_t mg, const char* op, int nin,
                            const fx_tensor_t* in, void* const* packed,
                            dt_placement_t pl[][DT_MAX_MESH_DIMS], int nia, const int64_t* iargs,
                            int nfa, const double* fargs, int combo) {
  dt_mesh_t meshes[2] = {mc, mg};
  dt_tensor_t x[2][FX_MAXT];
  dt_status_t st[2];
  for (int b = 0; b < 2; b++) {
    for (int t = 0; t < nin; t++)
      DT_ASSERT_OK(dt_tensor_from_full(meshes[b], in[t].dtype, in[t].ndim, in[t].shape, pl[t],
                                       packed[t], &x[b][t]));
    st[b] = dt_op_run_multi(op, nin, x[b], nia, iargs, nfa, fargs, 0, NULL);
  }
  DT_ASSERT_TRUE(st[0] == st[1], "%s (combo %d): cpu says %s, %s says %s", op, combo,
                 dt_status_name(st[0]), g_target_name, dt_status_name(st[1]));
  DT_ASSERT_TRUE(st[0] == DT_SUCCESS || st[0] == DT_ERR_INVALID_ARG, "%s (combo %d): %s", op,
                 combo, dt_last_error());
  char what[64];
  for (int t = 0; t < nin && st[0] == DT_SUCCESS; t++) {
    snprintf(what, sizeof what, "input %d after the update", t);
    same(x[0][t], x[1][t], what, op, combo);
    g_outputs++;
  }
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < nin; t++) DT_ASSERT_OK(dt_tensor_destroy(x[b][t]));
  verify_target(op, combo);
  return st[0] == DT_SUCCESS;
}

/* Runs a case on a mesh pair: all-R and SAMPLES pseudo-random placement combinations. */
static void run_case_dtype(const char* op, int nin, const fx_tensor_t* in, int nia,
                           const int64_t* iargs, int nfa, const double* fargs, dt_mesh_t mc,
                           dt_mesh_t mg, int m, dt_dtype_t variant) {
  dt_op_desc_t d;
  DT_ASSERT_OK(dt_op_describe(op, &d));
  int nout = d.n_outputs, grad = d.has_backward && !g_fwd_only, ran = 0;
  void* packed[FX_MAXT];
  for (int t = 0; t < nin; t++) packed[t] = fx_pack(&in[t]);
  long long total = 1;
  for (int t = 0; t < nin; t++)
    for (int i = 0; i < m; i++) total *= fx_n_options(&in[t]);
  uint64_t lcg = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(op) * 2654435761u ^ (uint64_t)nia;
  int replicated_only = strcmp(op, "from_local") == 0 || strcmp(op, "all_to_all_single") == 0;
  for (int r = 0; r <= g_samples && r < total && (r == 0 || !replicated_only); r++) {
    long long combo = 0;
    if (r > 0) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      combo = (long long)((lcg >> 11) % (uint64_t)total);
    }
    dt_placement_t pl[FX_MAXT][DT_MAX_MESH_DIMS];
    long long v = combo;
    for (int t = 0; t < nin; t++)
      for (int i = 0; i < m; i++) {
        int k = fx_n_options(&in[t]);
        pl[t][i] = fx_option(&in[t], (int)(v % k));
        v /= k;
      }
    if (d.in_place) { /* the updated inputs take input 0's placements (0-d ones: R) */
      for (int t = 1; t < nin; t++)
        for (int i = 0; i < m && (d.in_place & (1u << t)); i++)
          pl[t][i] = in[t].ndim == 0 ? dt_replicate() : pl[0][i];
      ran += run_inplace_pair(mc, mg, op, nin, in, packed, pl, nia, iargs, nfa, fargs,
                              (int)combo);
      continue;
    }
    run_pair(mc, mg, op, nin, in, packed, pl, nia, iargs, nfa, fargs, nout, grad, (int)combo,
             variant);
  }
  DT_ASSERT_TRUE(!d.in_place || ran > 0, "%s: every sampled placement was refused", op);
  for (int t = 0; t < nin; t++) free(packed[t]);
}

/* A case as given, then (when its float inputs are f32; not for in-place ops, whose dtypes are
 * their own cases) with every f32 input as bf16 and as f16. */
static void run_case(const char* op, int nin, const fx_tensor_t* in, int nia, const int64_t* iargs,
                     int nfa, const double* fargs, dt_mesh_t mc, dt_mesh_t mg, int m) {
  if (!wanted(op)) return;
  seen(op);
  run_case_dtype(op, nin, in, nia, iargs, nfa, fargs, mc, mg, m, (dt_dtype_t)0);
  dt_op_desc_t d;
  DT_ASSERT_OK(dt_op_describe(op, &d));
  int f32 = 0;
  for (int t = 0; t < nin; t++) f32 |= in[t].dtype == DT_F32;
  if (!f32 || d.in_place || strcmp(op, "cast") == 0) return;
  static const dt_dtype_t half[2] = {DT_BF16, DT_F16};
  for (int h = 0; h < 2; h++) {
    fx_tensor_t v[FX_MAXT];
    for (int t = 0; t < nin; t++) {
      v[t] = in[t];
      if (v[t].dtype == DT_F32) v[t].dtype = half[h];
    }
    run_case_dtype(op, nin, v, nia, iargs, nfa, fargs, mc, mg, m, half[h]);
    g_dtype_variants++;
  }
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_backend_get("cpu", &g_cpu));
  const char* e = getenv("DTENSOR_CONFORMANCE_BACKEND");
  if (e && *e) g_target_name = e;
  g_only = getenv("DTENSOR_CONFORMANCE_OPS");
  if (g_only && !*g_only) g_only = NULL;
  e = getenv("DTENSOR_CONFORMANCE_SAMPLES");
  if (e && *e) g_samples = atoi(e);
  dt_status_t bst = dt_backend_get(g_target_name, &g_target);
  if (bst == DT_ERR_CUDA || bst == DT_ERR_UNSUPPORTED) { /* no such device or build here */
    if (g_rank == 0) printf("test_conformance: skipped: %s\n", dt_last_error());
    DT_ASSERT_OK(dt_finalize());
    return 77;
  }
  DT_ASSERT_OK(bst);
  g_exact = strcmp(g_target_name, "guarded") == 0;
  cJSON* root = dt_test_load_json(DT_FIXTURES);
  const cJSON* cases = cJSON_GetObjectItem(root, "cases");
  for (int m = 1; m <= 2; m++) {
    if (m == 2 && world % 2 != 0) continue;
    int shape[2] = {m == 1 ? world : 2, world / 2};
    dt_mesh_t mc, mg;
    DT_ASSERT_OK(dt_mesh_create(m, shape, NULL, NULL, &mc));
    DT_ASSERT_OK(dt_mesh_create(m, shape, NULL, NULL, &mg));
    DT_ASSERT_OK(dt_mesh_set_backend(mc, g_cpu));
    DT_ASSERT_OK(dt_mesh_set_backend(mg, g_target));
    for (int k = 0; k < cJSON_GetArraySize(cases); k++) {
      const cJSON* c = cJSON_GetArrayItem(cases, k);
      /* a case PyTorch refuses (mixed dtypes of mm): test_ops_reference checks the refusal on
       * every backend (its device twins too); nothing to compare here */
      if (cJSON_GetObjectItem(c, "error") != NULL) continue;
      const cJSON* ji = cJSON_GetObjectItem(c, "inputs");
      int nin = cJSON_GetArraySize(ji), nia, nfa;
      int64_t iargs[8];
      double fargs[8];
      fx_args(c, &nia, iargs, &nfa, fargs);
      fx_tensor_t in[FX_MAXT];
      for (int t = 0; t < nin; t++) fx_load_tensor(cJSON_GetArrayItem(ji, t), &in[t]);
      run_case(cJSON_GetObjectItem(c, "op")->valuestring, nin, in, nia, iargs, nfa, fargs, mc, mg,
               m);
      for (int t = 0; t < nin; t++) free(in[t].data);
    }
    const size_t ngen = sizeof kGen / sizeof kGen[0], nfwd = sizeof kGenFwd / sizeof kGenFwd[0];
    for (size_t k = 0; k < ngen + nfwd; k++) {
      const gen_case_t* g = k < ngen ? &kGen[k] : &kGenFwd[k - ngen];
      fx_tensor_t in[FX_MAXT];
      for (int t = 0; t < g->nin; t++) gen_tensor(g, t, (int)k, k >= ngen, &in[t]);
      int64_t iargs[8];
      int nia = g->nia;
      memcpy(iargs, g->iargs, sizeof iargs);
      if (g->redistribute) {
        nia = m;
        for (int i = 0; i < m; i++) iargs[i] = dt_placement_encode(dt_shard(i % 2));
      }
      if (strcmp(g->op, "all_to_all_single") == 0) { /* splits of 6 rows over mesh dim 0 */
        static const double kSplit2[2] = {2, 4}, kSplit4[4] = {1, 2, 0, 3};
        int n = shape[0];
        in[1].shape[0] = in[1].numel = n;
        free(in[1].data);
        in[1].data = malloc(sizeof(double) * (size_t)n);
        for (int j = 0; j < n; j++) in[1].data[j] = n == 2 ? kSplit2[j] : n == 4 ? kSplit4[j] : 0;
        if (n != 2 && n != 4) in[1].data[0] = 6;
      }
      g_fwd_only = k >= ngen;
      run_case(g->op, g->nin, in, nia, iargs, g->nfa, g->fargs, mc, mg, m);
      g_fwd_only = 0;
      for (int t = 0; t < g->nin; t++) free(in[t].data);
    }
    DT_ASSERT_OK(dt_mesh_destroy(mc));
    DT_ASSERT_OK(dt_mesh_destroy(mg));
  }
  cJSON_Delete(root);
  /* every op of the table ran */
  int n;
  DT_ASSERT_OK(dt_op_count(&n));
  for (int i = 0; i < n && g_only == NULL; i++) {
    const char* name;
    DT_ASSERT_OK(dt_op_name_at(i, &name));
    int found = 0;
    for (int k = 0; k < g_nseen; k++) found |= strcmp(g_seen[k], name) == 0;
    DT_ASSERT_TRUE(found, "op %s has no consistency case", name);
  }
  if (g_rank == 0) {
    if (g_exact)
      printf("test_conformance np=%d: %d ops (%lld dtype variants, %lld runs refused alike), "
             "%lld outputs and %lld gradients bit-identical on the cpu and %s backends (%lld "
             "comparisons), guards intact\n", world, g_only ? g_nseen : n, g_dtype_variants,
             g_refused, g_outputs, g_grads, g_target_name, g_checks);
    else
      printf("test_conformance np=%d: %d ops (%lld dtype variants, %lld runs refused alike), "
             "%lld outputs and %lld gradients of the %s backend within tolerance of the cpu's "
             "(%lld comparisons; worst nmse %.3g: %s)\n", world, g_only ? g_nseen : n,
             g_dtype_variants, g_refused, g_outputs, g_grads, g_target_name, g_checks,
             g_worst_nmse, g_worst_op);
  }
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

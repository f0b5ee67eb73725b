#!/usr/bin/python3
"""make_special_fixtures.py - writes special_fixtures.json: PyTorch's results for the edge cases of
the built-in ops (NaN, +-inf, -0.0, huge and tiny values, empty dims, integer dtypes, casts, index
errors, ties) and, where differentiable, the gradients of sum(output * r) at those points.

Run with Debian's torch (python3-torch 1.13, CPU):  /usr/bin/python3 tests/reference/make_special_fixtures.py [OUT]
(OUT: where to write, tests/reference/special_fixtures.json when not given; e.g. another torch's
results, to compare).
The JSON has the layout of ops_fixtures.json (tests/reference/make_fixtures.py) and is replayed by the
same program (tests/ops/test_ops_reference.c, as test_ops_special) on many placements. Additions:
non-finite numbers are the strings "nan", "inf" and "-inf" (JSON has no such numbers); a case with
"error" names the status every placement must fail with (PyTorch raises), and has no outputs.
Sign of zero is not compared (a Partial(sum) input turns -0.0 into 0.0).
Where PyTorch 1.13 and 2.x differ, the comment says which one the case follows.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

G = torch.Generator().manual_seed(4321)
CASES = []
nan, inf = float("nan"), float("inf")
DT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32"}
F32, BF16, I32, I64 = 0, 1, 3, 4  # dt_dtype_t (cast's iargs)


def num(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def tens(t):
    if t.is_floating_point():
        data = [num(float(v)) for v in t.detach().float().flatten().tolist()]
    else:
        data = [int(v) for v in t.flatten().tolist()]
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "data": data}


def rnd(*shape):
    return (torch.rand(*shape, generator=G) * 4 - 2).float()


def case(name, op, inputs, fn, iargs=(), fargs=(), rtol=1e-5, atol=1e-6, grad=True, error=None):
    """fn(*inputs) gives PyTorch's output(s); error: the status expected instead (PyTorch raises)."""
    c = {"name": name, "op": op, "iargs": list(iargs), "fargs": [num(float(v)) for v in fargs],
         "inputs": [tens(t) for t in inputs], "rtol": rtol, "atol": atol}
    if error is not None:
        try:
            fn(*inputs)
        except (RuntimeError, IndexError, ValueError):
            c["outputs"], c["error"] = [], error
            CASES.append(c)
            return
        raise AssertionError(f"{name}: PyTorch does not raise")
    xs = [t.clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    outs = fn(*xs)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    c["outputs"] = [tens(o) for o in outs]
    if grad and outs[0].requires_grad:
        n = outs[0].numel()
        r = torch.tensor([0.5 + ((i + 1) * 37 % 101) / 101.0 for i in range(n)]).reshape(outs[0].shape)
        if outs[0].dtype == torch.bfloat16:  # the weights exact in the output's dtype (the test
            r = r.to(torch.bfloat16).float()  # makes them a tensor of that dtype)
        (outs[0] * r).sum().backward()
        c["grad_weights"] = [float(v) for v in r.flatten().tolist()]
        c["grads"] = [None if x.grad is None else [num(float(g)) for g in x.grad.flatten().tolist()]
                      for x in xs]
        if outs[0].dtype == torch.bfloat16:  # as make_fixtures.py's bf16 gradients: 2 ulps + 4 ulps
            gmax = max(float(x.grad.abs().max()) for x in xs if x.grad is not None)  # of the
            c["grad_tol"] = [2 * 2.0 ** -7, 4 * 2.0 ** -7 * gmax]  # largest (a Partial input's
            # gradient is split over the ranks and summed in bf16)
    CASES.append(c)


# ---- pointwise at the special points (16 elements: uneven shards on 3 ranks)
SPECIAL = torch.tensor([nan, inf, -inf, -0.0, 0.0, 1e30, -1e30, 88.8, 89.5, -104.0, -110.0, 1.0, -1.0,
                        1e-40, 20.0, -20.0])
case("relu_special", "relu", [SPECIAL], torch.relu)  # relu(NaN) = NaN, relu'(0) = 0
case("neg_special", "neg", [SPECIAL], torch.neg)
case("exp_special", "exp", [SPECIAL], torch.exp, grad=False)
case("log_special", "log", [SPECIAL], torch.log, grad=False)
case("sqrt_special", "sqrt", [SPECIAL], torch.sqrt, grad=False)
case("rsqrt_special", "rsqrt", [SPECIAL], torch.rsqrt, grad=False)
case("sigmoid_special", "sigmoid", [SPECIAL], torch.sigmoid, grad=False)
case("tanh_special", "tanh", [SPECIAL], torch.tanh, grad=False)
case("silu_special", "silu", [SPECIAL], F.silu, grad=False)
# gelu(inf) = inf in 1.13 and in 2.x's scalar loop; 2.x's vectorized loop gives NaN (an artifact)
case("gelu_special", "gelu", [SPECIAL], F.gelu, grad=False)
# gradients at 0 and at ordinary points (finite everywhere PyTorch's are)
AT0 = torch.tensor([0.0, 4.0, 0.25, 1.0, 9.0])
case("sqrt_grad_at0", "sqrt", [AT0], torch.sqrt)  # sqrt'(0) = inf
case("log_grad_at0", "log", [AT0], torch.log)  # log'(0) = inf
case("rsqrt_grad_at0", "rsqrt", [AT0], torch.rsqrt)  # rsqrt'(0) = -inf
case("exp_grad_inf", "exp", [torch.tensor([-inf, 0.0, 1.0, 100.0, -100.0])], torch.exp)
SAT = torch.tensor([-inf, inf, -100.0, 100.0, 0.0, 0.5])
case("sigmoid_grad_sat", "sigmoid", [SAT], torch.sigmoid)
case("tanh_grad_sat", "tanh", [SAT], torch.tanh)

# binary ops: 0/0, x/0, inf-inf, 0*inf, NaN on either side, ties (gradient split in halves)
A = torch.tensor([1.0, -1.0, 0.0, nan, -0.0, inf, -inf, inf, 2.0, nan, 3.0])
B = torch.tensor([0.0, 0.0, 0.0, 0.0, -0.0, inf, -inf, -inf, nan, 1.0, 3.0])
case("add_special", "add", [A, B], torch.add, grad=False)
case("sub_special", "sub", [A, B], torch.sub, grad=False)
case("mul_special", "mul", [A, B], torch.mul, grad=False)
case("div_special", "div", [A, B], torch.div, grad=False)
case("maximum_special", "maximum", [A, B], torch.maximum, grad=False)
case("minimum_special", "minimum", [A, B], torch.minimum, grad=False)
TA, TB = torch.tensor([1.0, 2.0, 2.0, 0.0, -3.0]), torch.tensor([1.0, 3.0, 2.0, 0.5, -3.0])
case("maximum_grad_ties", "maximum", [TA, TB], torch.maximum)
case("minimum_grad_ties", "minimum", [TA, TB], torch.minimum)
case("div_bcast_zero", "div", [torch.tensor([[1.0], [0.0], [-2.0]]), torch.tensor([[0.0, 2.0, -0.0, inf]])],
     torch.div, grad=False)
case("add_scalar_inf", "add_scalar", [A], lambda x: x + (-inf), fargs=[-inf], grad=False)
case("mul_scalar_inf", "mul_scalar", [A], lambda x: x * inf, fargs=[inf], grad=False)
case("mul_scalar_nan", "mul_scalar", [A], lambda x: x * nan, fargs=[nan], grad=False)

# pow: PyTorch computes exponents 0.5, -0.5, 2, 3, -1, -2 as sqrt, rsqrt, x*x, x*x*x, 1/x, 1/(x*x)
POWX = torch.tensor([0.0, -0.0, -2.0, 2.0, nan, inf, -inf, 1.0, -1.0, 0.5, -0.5, 3.0])
for e, tag in [(0.0, "0"), (0.5, "half"), (-0.5, "neg_half"), (2.0, "2"), (3.0, "3"), (-1.0, "neg1"),
               (-2.0, "neg2"), (1.7, "1_7"), (-1.5, "neg1_5"), (1.0, "1"), (nan, "nan"), (inf, "inf"),
               (-inf, "neg_inf")]:
    case("pow_" + tag, "pow", [POWX], lambda x, e=e: torch.pow(x, e), fargs=[e], grad=False)
POWG = torch.tensor([0.0, 2.0, 0.5, 3.0])
for e, tag in [(0.0, "0"), (0.5, "half"), (2.0, "2"), (-1.0, "neg1"), (1.7, "1_7"), (3.0, "3")]:
    case("pow_grad_" + tag, "pow", [POWG], lambda x, e=e: torch.pow(x, e), fargs=[e])

# where / masked_fill with NaN in the branch not taken (no NaN gradient leaks there)
WC = torch.tensor([1, 0, 1, 0, 1], dtype=torch.int64)
WA, WB = torch.tensor([nan, 1.0, inf, 2.0, 3.0]), torch.tensor([0.0, nan, -1.0, -inf, nan])
case("where_nan", "where", [WC, WA, WB], lambda c, a, b: torch.where(c.bool(), a, b))
case("masked_fill_nan", "masked_fill", [WA, WC], lambda x, m: x.masked_fill(m.bool(), nan), fargs=[nan])
case("masked_fill_inf", "masked_fill", [WB, WC], lambda x, m: x.masked_fill(m.bool(), -inf), fargs=[-inf])

# ---- casts: truncation toward zero, bf16 round-to-nearest-even (NaN kept, overflow to inf),
#      integer narrowing wraps (two's complement)
FR = torch.tensor([-2.7, -0.5, 2.7, 0.5, -0.0, 1e9, -1e9, 2147483520.0, -2147483648.0, 7.99999])
case("cast_f32_i32_trunc", "cast", [FR], lambda x: x.to(torch.int32), iargs=[I32], grad=False)
case("cast_f32_i64_trunc", "cast", [FR * 1000], lambda x: x.to(torch.int64), iargs=[I64], grad=False)
BFX = torch.tensor([1.00390625, 1.01171875, 1.0039063, 1.01171870, nan, inf, -inf, 3.4e38, 3.3e38, -0.0,
                    1e-40, -1e-39, 65504.0, 0.1, -257.5])
case("cast_f32_bf16_rne", "cast", [BFX], lambda x: x.to(torch.bfloat16), iargs=[BF16], grad=False)
BFB = torch.tensor([1.0, nan, inf, -inf, -0.0, 3.3895e38, 9.1835e-41, 0.1], dtype=torch.bfloat16)
# a Partial(sum) bf16 input holds x / n rounded to bf16 on each rank: bf16's tolerance
case("cast_bf16_f32", "cast", [BFB], lambda x: x.float(), iargs=[F32], grad=False, rtol=1e-2,
     atol=1e-6)
WIDE = torch.tensor([2**31, 2**32 + 5, -2**31 - 1, 7, -7, 2**31 - 1, -2**31, 2**40 + 2**31 + 3])
case("cast_i64_i32_wrap", "cast", [WIDE], lambda x: x.to(torch.int32), iargs=[I32], grad=False)
case("cast_i32_i64", "cast", [torch.tensor([-2**31, -1, 0, 2**31 - 1], dtype=torch.int32)],
     lambda x: x.to(torch.int64), iargs=[I64], grad=False)
case("cast_i64_f32_round", "cast", [torch.tensor([2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**40 + 1])],
     lambda x: x.float(), iargs=[F32], grad=False)

# ---- reductions: NaN propagates through amax/amin, inf - inf in sums, empty dims
R = torch.tensor([[1.0, nan, 3.0, -1.0, 0.0], [inf, 1.0, -inf, 2.0, 0.0], [-inf, -inf, -inf, -inf, -inf]])
case("sum_special_dim1", "sum", [R], lambda x: x.sum(1), iargs=[0, 1], grad=False)
case("mean_special_dim1", "mean", [R], lambda x: x.mean(1), iargs=[0, 1], grad=False)
case("amax_special_dim1", "amax", [R], lambda x: x.amax(1), iargs=[0, 1], grad=False)
case("amin_special_dim0", "amin", [R], lambda x: x.amin(0), iargs=[0, 0], grad=False)
case("amax_special_all", "amax", [R], lambda x: x.amax(), grad=False)
E30, E04 = torch.zeros(3, 0), torch.zeros(0, 4)
case("sum_empty_dim", "sum", [E30], lambda x: x.sum(1), iargs=[0, 1], grad=False)
case("mean_empty_dim", "mean", [E30], lambda x: x.mean(1), iargs=[0, 1], grad=False)  # NaN
case("mean_empty_dim0_keep", "mean", [E04], lambda x: x.mean(0, keepdim=True), iargs=[1, 0], grad=False)
case("sum_empty_all", "sum", [E04], lambda x: x.sum(), grad=False)
case("mean_empty_all", "mean", [E04], lambda x: x.mean(), grad=False)
case("amax_empty_keep_other", "amax", [E30], lambda x: x.amax(0), iargs=[0, 0], grad=False)
case("amax_empty_dim", "amax", [E30], lambda x: x.amax(1), iargs=[0, 1], error="DT_ERR_INVALID_ARG")
case("amin_empty_all", "amin", [E04], lambda x: x.amin(), error="DT_ERR_INVALID_ARG")
# gradient with ties: amax/amin share it evenly among the tied elements
TIE = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, 5.0, -1.0, 4.0]])
case("amax_grad_ties", "amax", [TIE], lambda x: x.amax(1), iargs=[0, 1])
case("amin_grad_ties", "amin", [TIE], lambda x: x.amin(1), iargs=[0, 1])
case("amax_grad_ties_all", "amax", [TIE], lambda x: x.amax())

# ---- softmax family: inf / NaN / all -inf rows, huge logits
SM = torch.tensor([[inf, 1.0, 2.0], [-inf, -inf, -inf], [nan, 1.0, 2.0], [1e30, 1.0, -1e30],
                   [-inf, 0.0, 1.0], [100.0, 200.0, 300.0], [-1e4, -1e4 - 1, -1e4 + 1]])
case("softmax_special", "softmax", [SM], lambda x: torch.softmax(x, 1), iargs=[1], grad=False)
case("log_softmax_special", "log_softmax", [SM], lambda x: torch.log_softmax(x, 1), iargs=[1], grad=False)
case("softmax_special_dim0", "softmax", [SM.t().contiguous()], lambda x: torch.softmax(x, 0), iargs=[0],
     grad=False)
SMF = torch.tensor([[-inf, 0.0, 1.0], [1e4, 0.0, -1e4], [50.0, 50.0, 50.0]])
case("softmax_grad_masked", "softmax", [SMF], lambda x: torch.softmax(x, 1), iargs=[1])
case("log_softmax_grad_masked", "log_softmax", [SMF], lambda x: torch.log_softmax(x, 1), iargs=[1])

# ---- norms: constant rows (zero variance), zero rows, non-finite rows
NX = torch.tensor([[2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0], [1.0, inf, 2.0, 3.0], [nan, 1.0, 2.0, 3.0],
                   [1e-3, -1e-3, 1e-3, -1e-3]])
NW, NB = torch.tensor([1.0, 2.0, -1.0, 0.5]), torch.tensor([0.5, 0.0, -1.0, 2.0])
case("layer_norm_special", "layer_norm", [NX, NW, NB],
     lambda x, w, b: F.layer_norm(x, (4,), w, b, 1e-5), fargs=[1e-5], grad=False)
case("layer_norm_eps_big", "layer_norm", [NX[:2], NW, NB],
     lambda x, w, b: F.layer_norm(x, (4,), w, b, 10.0), fargs=[10.0])
case("rms_norm_special", "rms_norm", [NX, NW],
     lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, fargs=[1e-6], grad=False)
case("layer_norm_grad_const", "layer_norm", [NX[:2], NW, NB],
     lambda x, w, b: F.layer_norm(x, (4,), w, b, 1e-5), fargs=[1e-5])

# ---- indexing: out-of-range and negative indices raise; NaN and ties in topk
W9 = rnd(5, 3)
case("embedding_neg", "embedding", [W9, torch.tensor([0, -1, 2])], lambda w, i: F.embedding(i, w),
     error="DT_ERR_INVALID_ARG")
case("embedding_oob", "embedding", [W9, torch.tensor([[0, 5], [1, 2]])], lambda w, i: F.embedding(i, w),
     error="DT_ERR_INVALID_ARG")
GX = rnd(4, 5)
case("gather_neg", "gather", [GX, torch.tensor([[0, -1], [1, 2], [0, 0], [4, 3]])],
     lambda x, i: torch.gather(x, 1, i), iargs=[1], error="DT_ERR_INVALID_ARG")
case("gather_oob", "gather", [GX, torch.tensor([[0, 1], [1, 2], [0, 5], [4, 3]])],
     lambda x, i: torch.gather(x, 1, i), iargs=[1], error="DT_ERR_INVALID_ARG")
case("scatter_add_neg", "scatter_add", [GX, torch.tensor([[0, 1, 2], [3, -1, 0]]), rnd(2, 3)],
     lambda x, i, s: x.scatter_add(0, i, s), iargs=[0], error="DT_ERR_INVALID_ARG")
case("scatter_add_oob", "scatter_add", [GX, torch.tensor([[0, 1, 2], [3, 4, 0]]), rnd(2, 3)],
     lambda x, i, s: x.scatter_add(0, i, s), iargs=[0], error="DT_ERR_INVALID_ARG")
case("index_add_neg", "index_add", [GX, torch.tensor([0, -1, 2]), rnd(3, 5)],
     lambda x, i, s: x.index_add(0, i, s), error="DT_ERR_INVALID_ARG")
case("index_add_oob", "index_add", [GX, torch.tensor([0, 4, 2]), rnd(3, 5)],
     lambda x, i, s: x.index_add(0, i, s), error="DT_ERR_INVALID_ARG")
case("gather_dim_oob", "gather_dim", [GX, torch.tensor([0, 1, 5, 2])],
     lambda x, i: torch.gather(x, 1, i[:, None])[:, 0], error="DT_ERR_INVALID_ARG")
case("gather_dim_neg", "gather_dim", [GX, torch.tensor([0, -1, 4, 2])],
     lambda x, i: torch.gather(x, 1, i[:, None])[:, 0], error="DT_ERR_INVALID_ARG")
# index_add with repeated indices (they add up), int32 indices
case("index_add_repeat_i32", "index_add",
     [GX, torch.tensor([3, 0, 3, 3], dtype=torch.int32), rnd(4, 5)], lambda x, i, s: x.index_add(0, i, s))
# NaN counts as the largest value (sorted last for largest=0); no ties: tie order is unspecified
TK = torch.tensor([[nan, inf, 1e4, 0.0, -1e4, -inf], [1.0, nan, 3.0, nan, -inf, 2.0],
                   [5.0, -5.0, 4.0, -4.0, 3.0, -3.0]])
case("topk_nonfinite", "topk", [TK], lambda x: torch.topk(x, 4, 1), iargs=[4, 1], grad=False)
case("topk_nonfinite_smallest", "topk", [TK], lambda x: torch.topk(x, 4, 1, largest=False),
     iargs=[4, 1, 0], grad=False)
case("topk_all_dim0", "topk", [TK.t().contiguous()], lambda x: torch.topk(x, 3, 0), iargs=[3, 0],
     grad=False)
case("topk_k0", "topk", [TK], lambda x: torch.topk(x, 0, 1), iargs=[0, 1], grad=False)
case("topk_k_too_big", "topk", [TK], lambda x: torch.topk(x, 7, 1), iargs=[7, 1], error="DT_ERR_INVALID_ARG")

# ---- shape ops: Python slice semantics, negative narrow start, squeeze of a non-1 dim, empty cat
SX = rnd(3, 10)
for tag, (s, e, st) in {"wide": (-100, 100, 3), "backward_empty": (5, 2, 1), "neg": (-3, -1, 1),
                        "empty": (0, 0, 1), "big_step": (1, 10, 100), "end_past": (8, 1000, 1)}.items():
    case("slice_" + tag, "slice", [SX], lambda x, s=s, e=e, st=st: x[:, s:e:st], iargs=[1, s, e, st])
case("slice_step0", "slice", [SX], lambda x: x[:, 0:5:0], iargs=[1, 0, 5, 0], error="DT_ERR_INVALID_ARG")
case("narrow_neg_start", "narrow", [SX], lambda x: x.narrow(1, -3, 2), iargs=[1, -3, 2])
case("narrow_at_end", "narrow", [SX], lambda x: x.narrow(1, 10, 0), iargs=[1, 10, 0])
case("narrow_past_end", "narrow", [SX], lambda x: x.narrow(1, 8, 3), iargs=[1, 8, 3],
     error="DT_ERR_INVALID_ARG")
case("narrow_start_below", "narrow", [SX], lambda x: x.narrow(1, -11, 1), iargs=[1, -11, 1],
     error="DT_ERR_INVALID_ARG")
case("squeeze_not_one", "squeeze", [SX], lambda x: x.squeeze(1), iargs=[1])
case("squeeze_neg_one", "squeeze", [rnd(3, 1)], lambda x: x.squeeze(-1), iargs=[-1])
case("cat_empty_piece", "cat", [rnd(3, 0), rnd(3, 4), rnd(3, 0)], lambda *x: torch.cat(x, 1), iargs=[1])
case("cat_empty_rows", "cat", [rnd(0, 4), rnd(2, 4)], lambda *x: torch.cat(x, 0), iargs=[0])
case("cat_neg_dim", "cat", [rnd(2, 3), rnd(2, 2)], lambda *x: torch.cat(x, -1), iargs=[-1])

# ---- dropout: p = 0 is the identity, p = 1 multiplies by 0 (NaN and inf stay NaN)
DX = torch.tensor([nan, inf, -1.0, 2.0, 0.0, -inf, 3.0])
case("dropout_p0", "dropout", [DX], lambda x: F.dropout(x, 0.0), iargs=[7], fargs=[0.0], grad=False)
case("dropout_p1", "dropout", [DX], lambda x: F.dropout(x, 1.0), iargs=[7], fargs=[1.0], grad=False)
case("dropout_p_above_1", "dropout", [DX], lambda x: F.dropout(x, 1.5), iargs=[7], fargs=[1.5],
     error="DT_ERR_INVALID_ARG")
case("dropout_p_neg", "dropout", [DX], lambda x: F.dropout(x, -0.1), iargs=[7], fargs=[-0.1],
     error="DT_ERR_INVALID_ARG")

# ---- cross_entropy (iargs [reduction=1, ignore_index (none unless given)], fargs
# [label_smoothing=0]): with ignore_index the rows whose target it is count nowhere (mean over the
# others; every row ignored: NaN, gradient 0); label smoothing; a target outside [0, C) that is not
# the ignore index is an error, -100 included when no ignore_index is given (PyTorch's default
# skips it: here it must be asked for, as with ignore_index=-1 in PyTorch, which raises)
CEX = rnd(7, 5)
CET = torch.tensor([0, -100, 3, 4, -100, 1, 2])
for red, tag in [(1, "mean"), (2, "sum"), (0, "none")]:
    rname = ["none", "mean", "sum"][red]
    case("ce_ignore_" + tag, "cross_entropy", [CEX, CET],
         lambda x, t, r=rname: F.cross_entropy(x, t, reduction=r), iargs=[red, -100])
    case("ce_smooth_ignore_" + tag, "cross_entropy", [CEX, CET],
         lambda x, t, r=rname: F.cross_entropy(x, t, reduction=r, label_smoothing=0.2),
         iargs=[red, -100], fargs=[0.2])
    case("ce_smooth_" + tag, "cross_entropy", [CEX, torch.tensor([0, 1, 3, 4, 2, 1, 2])],
         lambda x, t, r=rname: F.cross_entropy(x, t, reduction=r, label_smoothing=0.3),
         iargs=[red], fargs=[0.3])
case("ce_ignore_class_2", "cross_entropy", [CEX, torch.tensor([0, 2, 3, 2, 4, 1, 2])],
     lambda x, t: F.cross_entropy(x, t, ignore_index=2), iargs=[1, 2])
case("ce_all_ignored", "cross_entropy", [CEX, torch.full((7,), -100, dtype=torch.int64)],
     lambda x, t: F.cross_entropy(x, t), iargs=[1, -100])
case("ce_smooth_1", "cross_entropy", [CEX, torch.tensor([0, 1, 3, 4, 2, 1, 2])],
     lambda x, t: F.cross_entropy(x, t, label_smoothing=1.0), iargs=[1], fargs=[1.0])
case("ce_i32_targets", "cross_entropy", [CEX, torch.tensor([0, -100, 3, 4, -100, 1, 2], dtype=torch.int32)],
     lambda x, t: F.cross_entropy(x, t.long()), iargs=[1, -100])
case("ce_no_ignore_index", "cross_entropy", [CEX, CET],
     lambda x, t: F.cross_entropy(x, t, ignore_index=-1), iargs=[1], error="DT_ERR_INVALID_ARG")
case("ce_target_oob", "cross_entropy", [CEX, torch.tensor([0, 1, 5, 4, 2, 1, 2])],
     lambda x, t: F.cross_entropy(x, t), iargs=[1, -100], error="DT_ERR_INVALID_ARG")
case("ce_target_neg", "cross_entropy", [CEX, torch.tensor([0, 1, -1, 4, 2, 1, 2])],
     lambda x, t: F.cross_entropy(x, t), iargs=[1, -100], error="DT_ERR_INVALID_ARG")
case("ce_smooth_above_1", "cross_entropy", [CEX, CET],
     lambda x, t: F.cross_entropy(x, t, label_smoothing=1.5), iargs=[1, -100], fargs=[1.5],
     error="DT_ERR_INVALID_ARG")

# large logits: rows near +-1e4 and 3e4 (and one near 0) with small offsets, the target on the row's
# max and off it; PyTorch's log_softmax is (x - m) - log(s), exact on the max entry, so the loss must
# not go through a logsumexp rounded at the logits' magnitude (ulp(1e4) ~ 1e-3 in f32), nor the
# softmax of the gradient through exp(x - lse)
CEL = torch.tensor([[1e4, 1e4 + 0.5, 1e4 - 1.25, 1e4 + 0.75, 1e4 + 0.1],
                    [1e4 + 2.0, 1e4 - 0.3, 1e4 + 1.5, 1e4 - 2.5, 1e4 + 0.25],
                    [-1e4 - 0.5, -1e4 + 0.25, -1e4 + 1.0, -1e4 - 3.0, -1e4 + 0.6],
                    [-1e4 + 0.1, -1e4 - 1.75, -1e4 + 0.9, -1e4 + 0.4, -1e4 - 0.2],
                    [3e4 + 0.5, 3e4 - 1.0, 3e4 + 2.25, 3e4 + 1.0, 3e4 - 0.5],
                    [0.3, -1.2, 2.0, 0.5, -0.7]])
CELT = torch.tensor([3, 4, 2, 1, 2, 0])  # on the max in rows 0, 2, 4; off it in 1, 3, 5
CELI = torch.tensor([3, -100, 2, 1, -100, 0])
for red, tag in [(1, "mean"), (2, "sum"), (0, "none")]:
    rname = ["none", "mean", "sum"][red]
    case("ce_large_" + tag, "cross_entropy", [CEL, CELT],
         lambda x, t, r=rname: F.cross_entropy(x, t, reduction=r), iargs=[red])
    case("ce_large_ignore_" + tag, "cross_entropy", [CEL, CELI],
         lambda x, t, r=rname: F.cross_entropy(x, t, reduction=r), iargs=[red, -100])
    case("ce_large_smooth_ignore_" + tag, "cross_entropy", [CEL, CELI],
         lambda x, t, r=rname: F.cross_entropy(x, t, reduction=r, label_smoothing=0.2),
         iargs=[red, -100], fargs=[0.2])
case("ce_large_smooth_mean", "cross_entropy", [CEL, CELT],
     lambda x, t: F.cross_entropy(x, t, label_smoothing=0.3), iargs=[1], fargs=[0.3])

# ---- comparisons, abs and clamp at the special points (appended: earlier draws unchanged).
# Comparisons give 1 / 0 in the operands' dtype (PyTorch: bool); NaN is unequal to everything.
for op in ("eq", "ne", "lt", "le", "ge", "gt"):
    case(op + "_special", op, [A, B], lambda a, b, f=getattr(torch, op): f(a, b).float(), grad=False,
         rtol=0.0, atol=0.0)
case("abs_special", "abs", [SPECIAL], torch.abs)  # abs'(x) = sign(x): 0 at 0, -0 and NaN
case("clamp_special", "clamp", [SPECIAL], lambda x: torch.clamp(x, -1.0, 20.0), fargs=[-1.0, 20.0])
case("clamp_inf_bounds", "clamp", [SPECIAL], lambda x: torch.clamp(x, -inf, inf), fargs=[-inf, inf])
case("clamp_min_above_max_special", "clamp", [SPECIAL], lambda x: torch.clamp(x, 2.0, -3.0),
     fargs=[2.0, -3.0])  # max everywhere but NaN; gradient 0 everywhere
case("clamp_at_bounds", "clamp", [torch.tensor([-1.0, -0.0, 0.0, 1.0, 0.5, -1.5, 1.5])],
     lambda x: torch.clamp(x, -1.0, 1.0), fargs=[-1.0, 1.0])  # the bounds pass the gradient
case("clamp_no_bound", "clamp", [SPECIAL], lambda x: torch.clamp(x), error="DT_ERR_INVALID_ARG")
# bf16 x against bounds that round in bf16: PyTorch compares in x's dtype, so x = 0.69921875 (0.7
# rounded) passes min = 0.7 and x = 0.30078125 passes max = 0.3 (gradient 1, not 0)
XB = torch.tensor([0.69921875, 0.30078125, 0.5, 1.0, 0.703125, 0.296875]).to(torch.bfloat16)
case("clamp_bf16_min_rounds", "clamp", [XB], lambda x: torch.clamp(x, min=0.7), fargs=[0.7])
case("clamp_bf16_max_rounds", "clamp", [XB], lambda x: torch.clamp(x, max=0.3), fargs=[nan, 0.3])
# bounds and fill values past the dtype's range: PyTorch's "cannot be converted ... without overflow"
case("clamp_min_overflows_f32", "clamp", [SPECIAL], lambda x: torch.clamp(x, min=1e39),
     fargs=[1e39], error="DT_ERR_INVALID_ARG")
case("clamp_max_overflows_bf16", "clamp", [XB], lambda x: torch.clamp(x, max=-1e39),
     fargs=[nan, -1e39], error="DT_ERR_INVALID_ARG")
case("masked_fill_overflows_bf16", "masked_fill", [XB, torch.tensor([1, 0, 1, 0, 0, 1])],
     lambda x, m: x.masked_fill(m.bool(), 1e39), fargs=[1e39], error="DT_ERR_INVALID_ARG")
case("masked_fill_i32_above_max", "masked_fill",
     [torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([1, 0, 1])],
     lambda x, m: x.masked_fill(m.bool(), 2147483647.5), fargs=[2147483647.5],
     error="DT_ERR_INVALID_ARG")  # refused before the truncation, as PyTorch
case("masked_fill_i32_below_min", "masked_fill",
     [torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([1, 0, 1])],
     lambda x, m: x.masked_fill(m.bool(), -2147483648.5), fargs=[-2147483648.5],
     error="DT_ERR_INVALID_ARG")
case("abs_int_min", "abs", [torch.tensor([-2 ** 31, -5, 0, 7, 2 ** 31 - 1], dtype=torch.int32)],
     torch.abs, grad=False, rtol=0.0, atol=0.0)  # abs(INT_MIN) is INT_MIN, as PyTorch
case("abs_i64", "abs", [torch.tensor([-2 ** 40, -1, 0, 3], dtype=torch.int64)], torch.abs,
     grad=False, rtol=0.0, atol=0.0)

# ---- sin, cos, reciprocal, log1p, expm1 at the special points (appended: earlier draws unchanged).
# The arguments survive a Partial(sum) split at np 3 (x / 3 summed three times gives x back), which
# matters where the result is sensitive: sin / cos of large arguments, log1p near -1.
case("sin_special", "sin", [SPECIAL], torch.sin)  # sin, cos (+-inf) = NaN, gradient NaN there
case("cos_special", "cos", [SPECIAL], torch.cos)
TRIG = torch.tensor([1e4, -1e4, 12345.678, 1e5, -3e5, 1e6, 3.1415927, -3.1415927, 1.5707964,
                     6.2831855, 1e7, 8388608.0, 16777216.0, 1e30, -0.0, 1e-40])
case("sin_large_args", "sin", [TRIG], torch.sin)  # full range reduction, as libm (not __sinf)
case("cos_large_args", "cos", [TRIG], torch.cos)
# 1 / +-0 = +-inf (gradient -inf), 1 / +-inf = +-0, 1 / 1e-40 overflows to inf, 1 / NaN = NaN
case("reciprocal_special", "reciprocal", [SPECIAL], torch.reciprocal)
# log1p(-1) = -inf (gradient inf), NaN below -1 and at -inf, log1p(x) = x for tiny x. Above 1e38
# PyTorch's CPU kernel (SLEEF's log1pf) gives inf where the value is finite (log1p(3e38) = 88.597):
# dtensor gives the finite value (libm), so the largest argument here is 1e38.
L1P = torch.tensor([-1.0, -1.5, -2.0, -inf, inf, nan, -0.0, 0.0, -0.75, -0.9999999, 1e-30, 1e-40,
                    1e30, 1e38, 0.5, -0.5])
case("log1p_special", "log1p", [L1P], torch.log1p)
case("expm1_special", "expm1", [SPECIAL], torch.expm1)  # -inf -> -1 (gradient 0), overflow -> inf
# tiny arguments, relative 1e-6 (exp(x) - 1 in f32 gives 1.19e-7 for 1e-7, or 0 for 1e-30)
EM1 = torch.tensor([1e-7, -1e-7, 1e-30, -1e-30, 1e-3, -1e-3, 5e-8, -5e-8, 1e-10, 88.0, -17.0,
                    -88.0, 0.0, -0.0, 2e-38, 0.25])
case("expm1_tiny", "expm1", [EM1], torch.expm1, rtol=1e-6, atol=0.0)
case("log1p_tiny", "log1p", [EM1[:9]], torch.log1p, rtol=1e-6, atol=0.0)
# integer inputs compute in f32, as PyTorch's torch.sin(int) (no gradient: integers have none)
IX = torch.tensor([[-3, 0, 1, 2], [7, -1, 5, 100]], dtype=torch.int64)
for op in ("sin", "cos", "reciprocal", "log1p", "expm1"):
    case(f"{op}_i64", op, [IX], getattr(torch, op), grad=False)
case("sin_i32", "sin", [IX.to(torch.int32)], torch.sin, grad=False)
# ---- argmax, argmin and logsumexp at the special points (appended: earlier draws unchanged).
# argmax / argmin: the first NaN wins (NaN counts as both the maximum and the minimum), ties go to
# the lowest index (-0.0 ties with 0.0), +-inf are ordinary extremes; an empty reduction raises.
AX = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [nan, 2.0, nan, inf, -inf], [-0.0, 0.0, -1.0, 0.0, -0.0],
                   [-inf, -inf, -inf, -inf, -inf], [inf, 1.0, inf, -inf, -inf], [2.0, 2.0, 2.0, 2.0, 2.0]])
for op in ("argmax", "argmin"):
    f = getattr(torch, op)
    case(op + "_special_dim1", op, [AX], lambda x, f=f: f(x, 1), iargs=[0, 1], rtol=0.0, atol=0.0)
    case(op + "_special_dim0", op, [AX], lambda x, f=f: f(x, 0), iargs=[0, 0], rtol=0.0, atol=0.0)
    case(op + "_special_all", op, [AX], lambda x, f=f: f(x), rtol=0.0, atol=0.0)
    case(op + "_special_nonan_all", op, [AX[2:]], lambda x, f=f: f(x), rtol=0.0, atol=0.0)
    case(op + "_empty_keep_other", op, [E30], lambda x, f=f: f(x, 0), iargs=[0, 0], rtol=0.0,
         atol=0.0)
    case(op + "_empty_dim", op, [E30], lambda x, f=f: f(x, 1), iargs=[0, 1],
         error="DT_ERR_INVALID_ARG")
    case(op + "_empty_all", op, [E04], lambda x, f=f: f(x), error="DT_ERR_INVALID_ARG")
    case(op + "_int_ties", op, [torch.tensor([[-2 ** 31, 2 ** 31 - 1, 2 ** 31 - 1, -2 ** 31]] * 2,
                                             dtype=torch.int32)],
         lambda x, f=f: f(x, 1), iargs=[0, 1], rtol=0.0, atol=0.0)
# logsumexp: a row of -inf gives -inf, a +inf gives inf, a NaN NaN; gradient exp(x - out) (NaN
# where out is infinite: the -inf row, the +inf entry)
LX = torch.tensor([[-inf, -inf, -inf, -inf], [inf, 1.0, -inf, 2.0], [nan, 1.0, 2.0, 3.0],
                   [1e30, 1e30, -1e30, 0.0], [88.0, 89.0, 90.0, -104.0], [-1e4, -1e4, -1e4, -1e4]])
case("logsumexp_special_dim1", "logsumexp", [LX], lambda x: torch.logsumexp(x, 1), iargs=[0, 1],
     grad=False)
case("logsumexp_special_dim0", "logsumexp", [LX], lambda x: torch.logsumexp(x, 0), iargs=[0, 0],
     grad=False)
LG = torch.tensor([[-inf, -inf, -inf], [1.0, -inf, 2.0], [3.0, 3.0, 3.0], [-200.0, 0.0, 100.0]])
case("logsumexp_grad_special", "logsumexp", [LG], lambda x: torch.logsumexp(x, 1), iargs=[0, 1])
case("logsumexp_empty_dim", "logsumexp", [E30], lambda x: torch.logsumexp(x, 1), iargs=[0, 1],
     grad=False)  # -inf
case("logsumexp_empty_keep_other", "logsumexp", [E30], lambda x: torch.logsumexp(x, 0),
     iargs=[0, 0], grad=False)

# ---- integer inputs of the older float unary ops (appended: earlier cases unchanged): computed in
# f32 as PyTorch's torch.exp(int) and friends (log of 0 and negatives: -inf, NaN). gelu, silu and
# softmax of integers are refused, as PyTorch raises ("not implemented for 'Long'"); so is pow
# (its float exponent cannot tell torch.pow(i64, 2), i64, from torch.pow(i64, 2.0), f32).
for op in ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh"):
    case(f"{op}_i64", op, [IX], getattr(torch, op), grad=False)
case("exp_i32", "exp", [IX.to(torch.int32)], torch.exp, grad=False)

# ---- reductions of a 0-d tensor over dim 0 or -1 (appended): its dims wrap as a 1-d tensor's, as
# PyTorch's (the reduction is the value itself; argmax / argmin 0); a repeated dim and dim 1 raise.
X0 = torch.tensor(-2.5)
for op, fn in (("sum", torch.sum), ("mean", torch.mean), ("amax", torch.amax), ("amin", torch.amin),
               ("logsumexp", torch.logsumexp), ("argmax", torch.argmax), ("argmin", torch.argmin)):
    g = op not in ("argmax", "argmin")
    case(f"{op}_0d_dim0", op, [X0], lambda x, fn=fn: fn(x, 0), iargs=[0, 0], grad=g)
    case(f"{op}_0d_dim_neg_keep", op, [X0], lambda x, fn=fn: fn(x, -1, keepdim=True),
         iargs=[1, -1], grad=g)
    case(f"{op}_0d_dim1_error", op, [X0], lambda x, fn=fn: fn(x, 1), iargs=[0, 1],
         error="DT_ERR_INVALID_ARG")
case("sum_0d_repeated_error", "sum", [X0], lambda x: torch.sum(x, (0, -1)), iargs=[0, 0, -1],
     error="DT_ERR_INVALID_ARG")

# ---- tril, triu and cumsum at the special points (appended: earlier cases unchanged). tril / triu
# zero NaN and inf outside their triangle (a selection, not a product); empty matrices; integer
# limits kept. cumsum: inf + -inf = NaN from there on, a NaN stays; f32 sums in double as PyTorch's
# CPU kernel (1e30 - 1e30 + 1 is 1); i64 wraps, i32 sums in i64 without wrapping; empty dims.
TX = torch.tensor([[nan, inf, -inf, 1.0], [-0.0, nan, 2.0, inf], [1e30, -inf, nan, -0.0]])
for op, fn in (("tril", torch.tril), ("triu", torch.triu)):
    case(f"{op}_special", op, [TX], fn)
    case(f"{op}_special_diag1", op, [TX], lambda x, fn=fn: fn(x, 1), iargs=[1])
    case(f"{op}_special_diag_big", op, [TX], lambda x, fn=fn: fn(x, 2 ** 40), iargs=[2 ** 40])
    case(f"{op}_special_diag_big_neg", op, [TX], lambda x, fn=fn: fn(x, -2 ** 40), iargs=[-2 ** 40])
    case(f"{op}_empty_rows", op, [E04.reshape(0, 4)], fn, grad=False)
    case(f"{op}_empty_batch", op, [torch.zeros(0, 3, 3)], fn, grad=False)
    case(f"{op}_i64_limits", op, [torch.tensor([[-2 ** 63, 2 ** 62], [2 ** 62 + 2 ** 40, -2 ** 63]])],
         fn, rtol=0.0, atol=0.0)
CX = torch.tensor([[1.0, inf, -inf, 2.0, 3.0], [1e30, -1e30, 1.0, 1e-40, 1e-40],
                   [nan, 1.0, 2.0, 3.0, 4.0], [-0.0, -0.0, 0.0, -0.0, 1.0]])
case("cumsum_special_dim1", "cumsum", [CX], lambda x: torch.cumsum(x, 1), iargs=[1])
case("cumsum_special_dim0", "cumsum", [CX], lambda x: torch.cumsum(x, 0), iargs=[0])
case("cumsum_i64_wrap", "cumsum", [torch.tensor([[2 ** 62, 2 ** 62, 2 ** 62, -5]])],
     lambda x: torch.cumsum(x, 1), iargs=[1], rtol=0.0, atol=0.0)
case("cumsum_i32_to_i64", "cumsum", [torch.tensor([[2 ** 31 - 1, 2 ** 31 - 1, -2 ** 31]],
                                                  dtype=torch.int32)],
     lambda x: torch.cumsum(x, 1), iargs=[1], rtol=0.0, atol=0.0)
case("cumsum_empty_dim", "cumsum", [E30], lambda x: torch.cumsum(x, 1), iargs=[1], grad=False)
case("cumsum_empty_other", "cumsum", [E30], lambda x: torch.cumsum(x, 0), iargs=[0], grad=False)
case("cumsum_0d_neg", "cumsum", [X0], lambda x: torch.cumsum(x, -1), iargs=[-1])
case("cumsum_0d_dim_neg2_error", "cumsum", [X0], lambda x: torch.cumsum(x, -2), iargs=[-2],
     error="DT_ERR_INVALID_ARG")

# ---- stack and index_select at the edges (appended): stack of empty tensors and of 0-d ones with
# NaN; index_select moves NaN and inf as they are, selects from an empty dim only with an empty
# index (any index of an empty dim is out of range), keeps i64 limits, refuses a bad index.
case("stack_empty", "stack", [E30, E30], lambda *x: torch.stack(x, 1), iargs=[1], grad=False)
case("stack_0d_special", "stack", [torch.tensor(nan), torch.tensor(-inf)], lambda *x: torch.stack(x))
IS = torch.tensor([[nan, inf, -inf], [-0.0, 1e30, 1e-40]])
case("index_select_special", "index_select", [IS, torch.tensor([2, 0, 2])],
     lambda x, i: torch.index_select(x, 1, i), iargs=[1])
case("index_select_empty_dim", "index_select", [E30, torch.tensor([], dtype=torch.int64)],
     lambda x, i: torch.index_select(x, 1, i), iargs=[1], grad=False)
case("index_select_empty_dim_error", "index_select", [E30, torch.tensor([0])],
     lambda x, i: torch.index_select(x, 1, i), iargs=[1], error="DT_ERR_INVALID_ARG")
case("index_select_i64_limits", "index_select",
     [torch.tensor([[-2 ** 63, 2 ** 62], [5, -7]]), torch.tensor([1, 1, 0])],
     lambda x, i: torch.index_select(x, 0, i), iargs=[0], rtol=0.0, atol=0.0)
# ---- floor, ceil, round, trunc, sign and erf at the special points (appended: earlier draws
# unchanged). NaN and +-inf pass through the rounding ops; sign(NaN) = 0 and sign(-0.0) = 0 (torch's
# (0 < x) - (x < 0)); erf(+-inf) = +-1, erf(NaN) = NaN. Gradients: zeros for the rounding ops (also
# at NaN and inf: zeros_like(grad)); erf's 2 / sqrt(pi) exp(-x^2) g is 0 at +-inf and 1e30, NaN at
# NaN. Every value survives a Partial(sum) split at np 3 (or keeps its result: 1e-40 stays a
# positive subnormal).
for op in ("floor", "ceil", "round", "trunc", "sign"):
    case(f"{op}_special", op, [SPECIAL], getattr(torch, op), rtol=0.0, atol=0.0)
case("erf_special", "erf", [SPECIAL], torch.erf)
# round's ties go to even (nearbyint), -0.5 to -0.0; values just below a tie, 2^23 - 0.5 (the last
# f32 with a fraction)
HALF = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5, 0.49999997, -0.49999997, 8388607.5,
                     -8388607.5, 5.5, 0.75, -0.25, -3.0])
for op in ("floor", "ceil", "round", "trunc"):
    case(f"{op}_halves", op, [HALF], getattr(torch, op), rtol=0.0, atol=0.0)
# round's decimals at the special points: NaN / inf kept, 3.4e38 * 10 overflows to inf (decimals
# 1), 10^39 is inf in f32 (every result NaN: x * inf, nearbyint(inf) / inf, 0 * inf)
RD = torch.tensor([nan, inf, -inf, -0.0, 0.0, 3.4e38, -3.4e38, 1.25, 1.35, -0.125, 125.0, 150.0,
                   250.0, -250.0, 0.015, 1e-40])
for d in (1, 2, -1, -2, 39, -39):
    case(f"round_decimals_{d}_special".replace("-", "neg"), "round", [RD],
         lambda x, d=d: torch.round(x, decimals=d), iargs=[d], rtol=0.0, atol=0.0)
# integers: kept (sign -1 / 0 / 1) with their dtype, past 2^24 (i32) and to 2^53 - 1 (i64: the
# JSON numbers are doubles, so larger ones are checked by test_int_ops); erf in f32
II = torch.tensor([-2 ** 31, -2 ** 24 - 1, -1, 0, 1, 2 ** 24 + 1, 2 ** 31 - 1], dtype=torch.int32)
LL = torch.tensor([-2 ** 53 + 1, -2 ** 31 - 1, -1, 0, 1, 2 ** 40 + 3, 2 ** 53 - 1], dtype=torch.int64)
for op in ("floor", "ceil", "round", "trunc", "sign"):
    case(f"{op}_int_limits", op, [II], getattr(torch, op), grad=False, rtol=0.0, atol=0.0)
    case(f"{op}_i64_limits", op, [LL], getattr(torch, op), grad=False, rtol=0.0, atol=0.0)
case("erf_i64", "erf", [IX], torch.erf, grad=False)
case("erf_i32", "erf", [IX.to(torch.int32)], torch.erf, grad=False)
case("round_decimals_int_error", "round", [II], lambda x: torch.round(x, decimals=1), iargs=[1],
     error="DT_ERR_UNSUPPORTED")  # torch 1.13: "round_cpu" not implemented for 'Int'
# ---- var and std at the special points (appended: earlier cases unchanged). A NaN gives NaN, an
# inf NaN (inf - inf); a spread of 1e20 squares past f32's range inside but its std is finite (the
# sum of squares in double); std of a constant row is 0 and its gradient 0 (PyTorch masks
# g / (2 std) there). N <= correction: the divisor max(0, N - correction) is 0, so inf (NaN where
# every deviation is 0: one element with correction 1); the gradient divides by N - correction
# itself (PyTorch's var_backward): inf times the deviations at N == correction (NaN at 0
# deviation), a finite negative factor past it. No elements: NaN.
VX = torch.tensor([[1.0, 2.0, 4.0, 8.0], [nan, 1.0, 2.0, 3.0], [inf, 1.0, 2.0, 3.0],
                   [3.0, 3.0, 3.0, 3.0], [1e20, -1e20, 0.0, 5.0], [-inf, inf, 0.0, 1.0]])
VN = torch.tensor([[1.0, 2.0], [3.0, 3.0], [-1.0, 5.0]])
for op in ("var", "std"):
    f = getattr(torch, op)
    case(f"{op}_special_dim1", op, [VX], lambda x, f=f: f(x, 1), iargs=[0, 1])
    case(f"{op}_special_dim1_c0", op, [VX], lambda x, f=f: f(x, 1, correction=0), iargs=[0, 1],
         fargs=[0.0])
    case(f"{op}_special_dim0_keep", op, [VX[:, 1:]], lambda x, f=f: f(x, 0, keepdim=True),
         iargs=[1, 0])
    for c_ in (2, 3, 5):  # N == 2 <= correction
        case(f"{op}_n_le_correction_{c_}", op, [VN], lambda x, f=f, c_=c_: f(x, 1, correction=c_),
             iargs=[0, 1], fargs=[float(c_)])
    case(f"{op}_one_element_c1", op, [VN[:, :1]], lambda x, f=f: f(x, 1), iargs=[0, 1])
    case(f"{op}_one_element_c0", op, [VN[:, :1]], lambda x, f=f: f(x, 1, correction=0),
         iargs=[0, 1], fargs=[0.0])
    case(f"{op}_empty_dim", op, [E30], lambda x, f=f: f(x, 1), iargs=[0, 1], grad=False)  # NaN
    case(f"{op}_empty_keep_other", op, [E30], lambda x, f=f: f(x, 0), iargs=[0, 0], grad=False)
    case(f"{op}_0d_dim0_c0", op, [X0], lambda x, f=f: f(x, 0, correction=0), iargs=[0, 0],
         fargs=[0.0])
    case(f"{op}_0d_all", op, [X0], lambda x, f=f: f(x), grad=False)  # NaN (N = 1, correction 1)
    case(f"{op}_bf16_special", op, [VX.to(torch.bfloat16)], lambda x, f=f: f(x, 1), iargs=[0, 1],
         rtol=2.0 ** -8, atol=0.0, grad=False)
    case(f"{op}_i64_error", op, [IX], lambda x, f=f: f(x, 1), iargs=[0, 1],
         error="DT_ERR_INVALID_ARG")

# ---- prod at the special points (appended: earlier cases unchanged). A tensor with zeros (rows
# with none, one, two and three; gradients the product of the others: the zero's row product
# without it, 0 elsewhere once the row holds another zero) and one without (gradient out / x:
# NaN, inf and products past f32's range propagate as torch's result / input). An empty dim
# gives 1; two dims are refused (torch.prod takes one); a 0-d tensor is its own product.
PZ = torch.tensor([[1.5, -2.0, 3.0, 0.5], [0.0, 2.0, -3.0, 4.0], [0.0, 2.0, 0.0, 4.0],
                   [-0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, -0.0]])
PN = torch.tensor([[nan, 1.0, 2.0], [inf, 2.0, 1.0], [-inf, -1.0, 2.0], [1e30, 1e30, 1.0],
                   [1e-30, 1e-30, 4.0], [-1.0, -1.0, -1.0]])
case("prod_zeros_dim1", "prod", [PZ], lambda x: torch.prod(x, 1), iargs=[0, 1])
case("prod_zeros_dim0_keep", "prod", [PZ], lambda x: torch.prod(x, 0, keepdim=True), iargs=[1, 0])
case("prod_zeros_all", "prod", [PZ[:2]], lambda x: torch.prod(x), iargs=[0])
case("prod_zeros_all_two", "prod", [PZ[1:3, :2]], lambda x: torch.prod(x), iargs=[0])
case("prod_special_dim1", "prod", [PN], lambda x: torch.prod(x, 1), iargs=[0, 1])
case("prod_special_dim0", "prod", [PN[1:]], lambda x: torch.prod(x, 0), iargs=[0, 0])
case("prod_empty_dim", "prod", [E30], lambda x: torch.prod(x, 1), iargs=[0, 1], grad=False)  # 1
case("prod_empty_keep_other", "prod", [E30], lambda x: torch.prod(x, 0), iargs=[0, 0], grad=False)
case("prod_empty_all", "prod", [E04], lambda x: torch.prod(x), iargs=[0], grad=False)  # 1
case("prod_0d_dim0", "prod", [X0], lambda x: torch.prod(x, 0), iargs=[0, 0])
case("prod_0d_all", "prod", [X0], lambda x: torch.prod(x), iargs=[0])
def prod_dims(x, dims):
    try:
        return torch.prod(x, dims)
    except TypeError as e:  # torch.prod's binding takes no tuple of dims
        raise ValueError(str(e))
case("prod_two_dims_error", "prod", [PZ], lambda x: prod_dims(x, (0, 1)), iargs=[0, 0, 1],
     error="DT_ERR_INVALID_ARG")
case("prod_i32_wrap", "prod", [torch.tensor([[2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1, 7],
                                             [-2 ** 31, -2 ** 31, 2, 1]], dtype=torch.int32)],
     lambda x: torch.prod(x, 1), iargs=[0, 1], rtol=0.0, atol=0.0)
case("prod_bf16_special", "prod", [PN.to(torch.bfloat16)],
     lambda x: torch.prod(x.float(), 1).to(torch.bfloat16), iargs=[0, 1], rtol=2.0 ** -8, atol=0.0,
     grad=False)  # (torch 1.13 has no CPU bf16 prod: the f32 product rounded once)

# ---- softmax and log_softmax of a 0-d tensor (appended): its dims wrap as a 1-d tensor's (0 and
# -1), one element is the whole row: 1 and 0 (NaN from +-inf and NaN), gradient 0; dim 1 raises.
for op, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
    case(f"{op}_0d_dim0", op, [X0], lambda x, fn=fn: fn(x, 0), iargs=[0])
    case(f"{op}_0d_dim_neg", op, [X0], lambda x, fn=fn: fn(x, -1), iargs=[-1])
    for tag, v in (("inf", inf), ("ninf", -inf), ("nan", nan)):
        case(f"{op}_0d_{tag}", op, [torch.tensor(v)], lambda x, fn=fn: fn(x, 0), iargs=[0],
             grad=False)
    case(f"{op}_0d_dim1_error", op, [X0], lambda x, fn=fn: fn(x, 1), iargs=[1],
         error="DT_ERR_INVALID_ARG")

for c in CASES:
    assert c["inputs"], c["name"]
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "special_fixtures.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "generator": "tests/reference/make_special_fixtures.py",
               "cases": CASES}, f, separators=(",", ":"), allow_nan=False)
print(f"wrote {len(CASES)} cases ({sum(1 for c in CASES if 'grads' in c)} with gradients) to {out}")

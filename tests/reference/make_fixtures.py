#!/usr/bin/python3
"""make_fixtures.py - writes ops_fixtures.json: forward results of PyTorch for every built-in op and,
for the differentiable ones, the gradients of sum(output * r) for a fixed r.

Run with Debian's torch (python3-torch 1.13, CPU):  /usr/bin/python3 tests/reference/make_fixtures.py
Each case names the dtensor op, its integer (iargs) and scalar (fargs) arguments, its inputs and the
outputs PyTorch computes, and a tolerance. tests/ops/test_ops_reference.c runs every case on many
placement combinations and compares the gathered result with these numbers. CI does not need torch:
the JSON file is committed. Inputs are deterministic (a fixed generator seed).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
G = torch.Generator().manual_seed(1234)
CASES = []

def rnd(*shape, lo=-2.0, hi=2.0):
    return (torch.rand(*shape, generator=G) * (hi - lo) + lo).float()

def pos(*shape):
    return rnd(*shape, lo=0.25, hi=3.0)

def ints(hi, *shape):
    return torch.randint(0, hi, shape, generator=G, dtype=torch.int64)

DT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "i64",
      torch.int32: "i32"}

def num(v):  # JSON has no non-finite numbers: the strings "nan", "inf", "-inf"
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")

def tens(t):
    return {"dtype": DT[t.dtype], "shape": list(t.shape),
            "data": [num(float(v)) for v in t.float().flatten().tolist()]
            if t.is_floating_point() else [int(v) for v in t.flatten().tolist()]}

def case(name, op, inputs, outputs, iargs=(), fargs=(), rtol=1e-5, atol=1e-5, **extra):
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    CASES.append({"name": name, "op": op, "iargs": list(iargs), "fargs": [num(v) for v in fargs],
                  "inputs": [tens(t) for t in inputs], "outputs": [tens(t) for t in outputs],
                  "rtol": rtol, "atol": atol, **extra})

# ---- matmul family
a, b = rnd(6, 5), rnd(5, 7)
case("mm", "mm", [a, b], a @ b)
x, y = rnd(4, 3, 5), rnd(4, 5, 6)
case("bmm", "bmm", [x, y], torch.bmm(x, y))
bias1, bias2 = rnd(7), rnd(6, 7)
case("addmm_vec", "addmm", [bias1, a, b], torch.addmm(bias1, a, b))
case("addmm_mat_beta_alpha", "addmm", [bias2, a, b], torch.addmm(bias2, a, b, beta=0.5, alpha=2.0),
     fargs=[0.5, 2.0])
xl, w, bl = rnd(6, 5), rnd(7, 5), rnd(7)
case("linear", "linear", [xl, w, bl], F.linear(xl, w, bl))
case("linear_nobias", "linear_nobias", [xl, w], F.linear(xl, w))

# ---- pointwise
p, q = rnd(6, 5), rnd(6, 5)
row = rnd(5)
case("add_bcast", "add", [p, row], p + row)
case("sub", "sub", [p, q], p - q)
col = rnd(6, 1)
case("mul_bcast", "mul", [p, col], p * col)
dd = pos(6, 5)
case("div", "div", [p, dd], p / dd)
case("maximum", "maximum", [p, q], torch.maximum(p, q))
case("minimum", "minimum", [p, q], torch.minimum(p, q))
case("neg", "neg", [p], -p)
case("add_scalar", "add_scalar", [p], p + 1.5, fargs=[1.5])
case("mul_scalar_neg", "mul_scalar", [p], p * -2.5, fargs=[-2.5])
pp = pos(6, 5)
case("pow", "pow", [pp], torch.pow(pp, 1.7), fargs=[1.7])
case("pow2", "pow", [p], torch.pow(p, 2.0), fargs=[2.0])
case("exp", "exp", [p], torch.exp(p))
case("log", "log", [pp], torch.log(pp))
case("sqrt", "sqrt", [pp], torch.sqrt(pp))
case("rsqrt", "rsqrt", [pp], torch.rsqrt(pp))
case("relu", "relu", [p], torch.relu(p))
case("gelu", "gelu", [p], F.gelu(p))
case("silu", "silu", [p], F.silu(p))
case("sigmoid", "sigmoid", [p], torch.sigmoid(p))
case("tanh", "tanh", [p], torch.tanh(p))
cond = ints(2, 6, 5)
case("where", "where", [cond, p, q], torch.where(cond.bool(), p, q))
mask = ints(2, 6, 1)
case("masked_fill_bcast", "masked_fill", [p, mask], p.masked_fill(mask.bool(), -3.0), fargs=[-3.0])
case("cast_f32_i64", "cast", [p * 3], (p * 3).to(torch.int64), iargs=[4])
ii = ints(9, 6, 5)
case("cast_i64_f32", "cast", [ii], ii.float(), iargs=[0])

# ---- reductions
r3 = rnd(4, 6, 5)
case("sum_dim1", "sum", [r3], r3.sum(1), iargs=[0, 1])
case("sum_all", "sum", [r3], r3.sum(), iargs=[0], rtol=1e-5, atol=1e-4)
case("mean_keep", "mean", [r3], r3.mean((0, 2), keepdim=True), iargs=[1, 0, 2])
case("amax_dim2", "amax", [r3], r3.amax(2), iargs=[0, 2])
case("amin_dim0", "amin", [r3], r3.amin(0), iargs=[0, 0])

# ---- nn
case("softmax", "softmax", [r3], torch.softmax(r3, -1), iargs=[-1])
case("log_softmax_dim1", "log_softmax", [r3], torch.log_softmax(r3, 1), iargs=[1])
xn, wn, bn = rnd(6, 8), rnd(8), rnd(8)
case("layer_norm", "layer_norm", [xn, wn, bn], F.layer_norm(xn, (8,), wn, bn, 1e-5), fargs=[1e-5])
rms = xn * torch.rsqrt(xn.pow(2).mean(-1, keepdim=True) + 1e-6) * wn
case("rms_norm", "rms_norm", [xn, wn], rms, fargs=[1e-6])
emb, ids = rnd(9, 4), ints(9, 3, 5)
case("embedding", "embedding", [emb, ids], F.embedding(ids, emb))

def sdpa_ref(q, k, v, causal, scale=None):
    H, G_ = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // G_, dim=1)
    v = v.repeat_interleave(H // G_, dim=1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        L, S = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v

qa, ka, va = rnd(2, 4, 6, 3), rnd(2, 4, 6, 3), rnd(2, 4, 6, 5)
case("sdpa_causal", "sdpa", [qa, ka, va], sdpa_ref(qa, ka, va, True), iargs=[1])
case("sdpa_scale", "sdpa", [qa, ka, va], sdpa_ref(qa, ka, va, False, 0.3), iargs=[0], fargs=[0.3])
kg, vg = rnd(2, 2, 6, 3), rnd(2, 2, 6, 3)
case("sdpa_gqa_causal", "sdpa", [qa, kg, vg], sdpa_ref(qa, kg, vg, True), iargs=[1])
# layout 1: (B, S, heads, D) tensors
qb, kb, vb = qa.transpose(1, 2).contiguous(), kg.transpose(1, 2).contiguous(), vg.transpose(1, 2).contiguous()
case("sdpa_bshd_gqa_causal", "sdpa", [qb, kb, vb], sdpa_ref(qa, kg, vg, True).transpose(1, 2).contiguous(),
     iargs=[1, 1])

def rotary_ref(x, seq_dim, theta):
    # Meta Llama: pairs (x[2i], x[2i+1]) as complex numbers times exp(i * pos * theta^(-2i/D))
    D = x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    posn = torch.arange(x.shape[seq_dim], dtype=torch.float64)
    ang = torch.outer(posn, freqs)
    shape = [1] * x.ndim
    shape[seq_dim] = x.shape[seq_dim]
    shape[-1] = D // 2
    c, s = torch.cos(ang).reshape(shape), torch.sin(ang).reshape(shape)
    xd = x.double()
    x0, x1 = xd[..., 0::2], xd[..., 1::2]
    out = torch.empty_like(xd)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out.float()

xr = rnd(2, 6, 3, 8)
case("rotary", "rotary", [xr], rotary_ref(xr, 1, 10000.0), iargs=[1], fargs=[10000.0])
xr2 = rnd(5, 4)
case("rotary_seq0", "rotary", [xr2], rotary_ref(xr2, 0, 500.0), iargs=[0], fargs=[500.0])

# ---- shape ops
v3 = rnd(4, 6, 5)
case("view_merge", "view", [v3], v3.reshape(24, 5), iargs=[24, 5])
case("reshape_split", "reshape", [v3], v3.reshape(4, 2, 3, 5), iargs=[4, 2, -1, 5])
case("reshape_all", "reshape", [v3], v3.reshape(-1), iargs=[-1])
case("flatten", "flatten", [v3], v3.flatten(1, 2), iargs=[1, 2])
case("unflatten", "unflatten", [v3], v3.unflatten(1, (3, 2)), iargs=[1, 3, 2])
case("unsqueeze", "unsqueeze", [v3], v3.unsqueeze(1), iargs=[1])
s1 = rnd(4, 1, 5)
case("squeeze", "squeeze", [s1], s1.squeeze(1), iargs=[1])
case("transpose", "transpose", [v3], v3.transpose(0, 2), iargs=[0, 2])
case("permute", "permute", [v3], v3.permute(1, 2, 0), iargs=[1, 2, 0])
case("t", "t", [p], p.t())
case("slice_step", "slice", [v3], v3[:, 1:6:2, :], iargs=[1, 1, 6, 2])
case("slice_neg", "slice", [v3], v3[:, :, -3:], iargs=[2, -3, 5])
case("narrow", "narrow", [v3], v3.narrow(0, 1, 2), iargs=[0, 1, 2])
c1, c2, c3 = rnd(4, 2, 5), rnd(4, 3, 5), rnd(4, 1, 5)
case("cat3", "cat", [c1, c2, c3], torch.cat([c1, c2, c3], 1), iargs=[1])

# ---- indexing
tk = rnd(5, 7)
vals, idx = torch.topk(tk, 3, dim=1)
case("topk", "topk", [tk], [vals, idx], iargs=[3, 1])
vals0, idx0 = torch.topk(tk, 2, dim=0, largest=False)
case("topk_smallest", "topk", [tk], [vals0, idx0], iargs=[2, 0, 0])
gx, gi = rnd(5, 7), ints(7, 5, 3)
case("gather", "gather", [gx, gi], torch.gather(gx, 1, gi), iargs=[1])
sx, si, ss = rnd(6, 4), ints(6, 5, 4), rnd(5, 4)
case("scatter_add", "scatter_add", [sx, si, ss], sx.scatter_add(0, si, ss), iargs=[0])

# ---- bf16 storage (compute in f32 on bf16-rounded inputs, result rounded to bf16)
def bf(t):
    return t.to(torch.bfloat16)
ab, bb = bf(a), bf(b)
# a Partial(sum) output rounds each rank's partial product to bf16 before the sum: looser bound
case("mm_bf16", "mm", [ab, bb], bf(ab.float() @ bb.float()), rtol=2e-2, atol=6e-2)
pb, qb = bf(p), bf(q)
case("add_bf16", "add", [pb, qb], bf(pb.float() + qb.float()), rtol=1e-2, atol=1e-2)
case("softmax_bf16", "softmax", [bf(r3)], bf(torch.softmax(bf(r3).float(), -1)), iargs=[-1],
     rtol=1e-2, atol=1e-2)
case("view_bf16", "view", [bf(v3)], bf(v3).reshape(24, 5), iargs=[24, 5], rtol=1e-2, atol=1e-6)

# ---- mixture of experts: rows sorted by expert, counts per expert (one expert gets none)
def grouped_ref(x, w, counts, trans):
    outs, at = [], 0
    for e, c in enumerate(counts.tolist()):
        we = w[e].t() if trans else w[e]
        outs.append(x[at:at + c] @ we)
        at += c
    return torch.cat(outs, 0)

def wgrad_ref(a, b, counts):
    outs, at = [], 0
    for c in counts.tolist():
        outs.append(a[at:at + c].t() @ b[at:at + c])
        at += c
    return torch.stack(outs, 0)

def route_ref(idx, E, capacity):
    N, K = idx.shape
    flat = idx.flatten().tolist()
    seen = [0] * E
    kept = []
    dropped = []
    for s, e in enumerate(flat):
        if capacity == 0 or seen[e] < capacity:
            seen[e] += 1
            kept.append(s)
        else:
            dropped.append(s)
    kept.sort(key=lambda s: flat[s])  # stable: slot order within an expert
    order = torch.tensor(kept + dropped, dtype=torch.int64)
    return [order, order // K, torch.tensor(seen, dtype=torch.int64)]

gcounts = torch.tensor([3, 0, 4, 2], dtype=torch.int64)  # expert 1 gets no rows
gx, gw1, gw0 = rnd(9, 5), rnd(4, 6, 5), rnd(4, 5, 6)
case("grouped_mm", "grouped_mm", [gx, gw1, gcounts], grouped_ref(gx, gw1, gcounts, True), iargs=[1])
case("grouped_mm_notrans", "grouped_mm", [gx, gw0, gcounts], grouped_ref(gx, gw0, gcounts, False),
     iargs=[0])
ga, gb = rnd(9, 5), rnd(9, 6)
case("grouped_mm_wgrad", "grouped_mm_wgrad", [ga, gb, gcounts], wgrad_ref(ga, gb, gcounts))
ridx = ints(4, 6, 2)
case("moe_route", "moe_route", [ridx], route_ref(ridx, 4, 0), iargs=[4])
case("moe_route_capacity", "moe_route", [ridx], route_ref(ridx, 4, 2), iargs=[4, 2])
ix, iidx, isrc = rnd(5, 4), ints(5, 7), rnd(7, 4)
case("index_add", "index_add", [ix, iidx, isrc], ix.index_add(0, iidx, isrc))

# ring attention (context parallelism) over mesh dim 0: results that do not depend on that dim's
# size, which the harness varies: causal in order (rank r holds chunk r: the stored order is the
# real one), and not causal in the load-balanced order (a permutation of the keys changes nothing
# and the output rows follow the queries'); iargs [mesh_dim, causal, layout, balanced, algo]
rq, rk, rv = rnd(2, 4, 8, 3), rnd(2, 2, 8, 3), rnd(2, 2, 8, 5)
case("ring_attention_causal", "ring_attention", [rq, rk, rv], sdpa_ref(rq, rk, rv, True),
     iargs=[0, 1, 0, 0, 0])
case("ring_attention_balanced", "ring_attention", [rq, rk, rv], sdpa_ref(rq, rk, rv, False),
     iargs=[0, 0, 0, 1, 1])
rqb, rkb, rvb = (t.transpose(1, 2).contiguous() for t in (rq, rk, rv))
case("ring_attention_bshd_gather", "ring_attention", [rqb, rkb, rvb],
     sdpa_ref(rq, rk, rv, True).transpose(1, 2).contiguous(), iargs=[0, 1, 1, 0, 2])


# ---- reduced precision: bf16 and f16 (dtensor computes every op in f32 on the converted inputs
#      and rounds each output once, round to nearest even, past the range to inf, as PyTorch's
#      CPU kernels do). The reference is PyTorch's own result in that dtype where torch 1.13 has
#      the CPU kernel ("ref": "torch"); where it has none (most f16 math) the op computed in f32
#      on the same inputs and rounded once ("ref": "f32-round": what torch 2.x's CPU kernels do,
#      and what 1.13 does for bf16). Tolerances: exact (bits) where both round the same f32
#      value (data movement, casts, + - * / of two values, max/min); one unit in the last place
#      (relative 2^-7 bf16, 2^-10 f16) where f32 libm results may differ by an f32 ulp before the
#      rounding; "partial": the looser bound for placement combinations with a Partial(sum) input
#      or output (each rank's partial result is rounded to the dtype before the sum, as PyTorch
#      DTensor does): 4 ulps of the largest sum of |terms|.
BF, HF = torch.bfloat16, torch.float16
ULP = {BF: 2.0 ** -7, HF: 2.0 ** -10}
LOW = ((BF, "bf16"), (HF, "f16"))

def f32_round(fn, dt, ins):
    return fn(*[t.float() if t.is_floating_point() else t for t in ins]).to(dt)

def ref_low(fn, dt, ins, native=True):
    """(PyTorch's result in dt, how it was computed)."""
    want = f32_round(fn, dt, ins)
    if not native:
        return want, "f32-round"
    try:
        got = fn(*ins)
    except RuntimeError as e:
        if "not implemented for" not in str(e):
            raise
        return want, "f32-round"
    assert got.dtype == dt, (got.dtype, dt)
    if os.environ.get("DT_FIXTURE_DIAG"):  # where 1.13's own kernel differs from f32-round
        nd = (got.float() != want.float()) & ~(got.isnan() & want.isnan())
        if nd.any():
            rel = ((got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-30))[nd]
            print(f"  {CUR[0]}: {int(nd.sum())} of {got.numel()} differ, max rel {rel.max():.3g}",
                  file=sys.stderr)
    return got, "torch"

CUR = [""]

def lcase(name, op, dt, ins, fn, iargs=(), fargs=(), ulps=1, atol=0.0, mag=None, native=True,
          note=None, device=None):
    CUR[0] = name
    out, how = ref_low(fn, dt, ins, native)
    extra = {"ref": how}
    if note:
        extra["note"] = note
    if device is not None:  # [rtol, atol] where the tensors live on a GPU (its kernels' rounding)
        extra["device"] = device
    if mag is not None:  # the largest sum of |terms| a rank's partial result rounds
        extra["partial"] = [ulps * ULP[dt], 4 * ULP[dt] * float(mag)]
    case(name, op, ins, out, iargs=iargs, fargs=fargs, rtol=ulps * ULP[dt], atol=atol, **extra)

# torch 1.13's CPU bf16 mm/bmm/addmm and layer_norm differ from the f32 computation by up to
# 8 ulps (they lose precision inside); torch 2.11's equal it rounded once, bit for bit (checked)
OLD13 = "torch 1.13's bf16 kernel loses precision; torch 2.11 equals f32 compute rounded once"

def lo(t, dt):
    return t.to(dt)

for dt, tag in LOW:
    p, q, dd = lo(rnd(6, 5), dt), lo(rnd(6, 5), dt), lo(pos(6, 5), dt)
    row, col = lo(rnd(5), dt), lo(rnd(6, 1), dt)
    # exact: both round the same f32 value (x + y, x * y, x / y are one f32 rounding of the exact
    # value from values of 8 or 11 bits)
    lcase(f"add_bcast_{tag}", "add", dt, [p, row], torch.add, ulps=0)
    lcase(f"sub_{tag}", "sub", dt, [p, q], torch.sub, ulps=0)
    lcase(f"mul_bcast_{tag}", "mul", dt, [p, col], torch.mul, ulps=0)
    lcase(f"div_{tag}", "div", dt, [p, dd], torch.div, ulps=0)
    lcase(f"maximum_{tag}", "maximum", dt, [p, q], torch.maximum, ulps=0)
    lcase(f"minimum_{tag}", "minimum", dt, [p, q], torch.minimum, ulps=0)
    lcase(f"neg_{tag}", "neg", dt, [p], torch.neg, ulps=0)
    lcase(f"relu_{tag}", "relu", dt, [p], torch.relu, ulps=0)
    lcase(f"add_scalar_{tag}", "add_scalar", dt, [p], lambda x: x + 1.5, fargs=[1.5], ulps=0)
    lcase(f"mul_scalar_{tag}", "mul_scalar", dt, [p], lambda x: x * -2.5, fargs=[-2.5], ulps=0)
    lcase(f"pow2_{tag}", "pow", dt, [p], lambda x: torch.pow(x, 2.0), fargs=[2.0], ulps=0)
    cond, mask = ints(2, 6, 5), ints(2, 6, 1)
    lcase(f"where_{tag}", "where", dt, [cond, p, q], lambda c, a, b: torch.where(c.bool(), a, b),
          ulps=0)
    lcase(f"masked_fill_{tag}", "masked_fill", dt, [p, mask],
          lambda x, m: x.masked_fill(m.bool(), -3.1), fargs=[-3.1], ulps=0)
    # one ulp: libm (ours) against PyTorch's vectorized math, both f32 before the rounding
    for op, fn, x in (("exp", torch.exp, p), ("log", torch.log, dd), ("sqrt", torch.sqrt, dd),
                      ("rsqrt", torch.rsqrt, dd), ("gelu", F.gelu, p), ("silu", F.silu, p),
                      ("sigmoid", torch.sigmoid, p), ("tanh", torch.tanh, p)):
        lcase(f"{op}_{tag}", op, dt, [x], fn)
    lcase(f"pow_{tag}", "pow", dt, [dd], lambda x: torch.pow(x, 1.7), fargs=[1.7])
    lcase(f"pow_half_{tag}", "pow", dt, [dd], lambda x: torch.pow(x, 0.5), fargs=[0.5])
    lcase(f"pow_m1_{tag}", "pow", dt, [dd], lambda x: torch.pow(x, -1.0), fargs=[-1.0])
    # reductions over long rows: PyTorch accumulates reduced-precision sums in f32 (ours in
    # double); both round once
    r2 = lo(rnd(2, 256), dt)
    mag = r2.float().abs().sum(1).max()
    lcase(f"sum_rows_{tag}", "sum", dt, [r2], lambda x: x.sum(1), iargs=[0, 1], mag=mag, atol=1e-3)
    lcase(f"mean_rows_{tag}", "mean", dt, [r2], lambda x: x.mean(1), iargs=[0, 1],
          mag=mag / 256, atol=1e-5)
    r3 = lo(rnd(4, 6, 5), dt)
    lcase(f"sum_all_{tag}", "sum", dt, [r3], lambda x: x.sum(), iargs=[0],
          mag=r3.float().abs().sum(), atol=1e-3)
    lcase(f"sum_dim0_keep_{tag}", "sum", dt, [r3], lambda x: x.sum(0, keepdim=True), iargs=[1, 0],
          mag=r3.float().abs().sum(0).max(), atol=1e-4)
    lcase(f"amax_rows_{tag}", "amax", dt, [r2], lambda x: x.amax(1), iargs=[0, 1], ulps=0)
    lcase(f"amin_dim0_{tag}", "amin", dt, [r3], lambda x: x.amin(0), iargs=[0, 0], ulps=0)
    # softmax family and norms: one rounding of the f32 result
    lcase(f"softmax_last_{tag}", "softmax", dt, [r3], lambda x: torch.softmax(x, -1), iargs=[-1],
          atol=1e-6)
    lcase(f"softmax_dim1_{tag}", "softmax", dt, [r3], lambda x: torch.softmax(x, 1), iargs=[1],
          atol=1e-6)
    lcase(f"log_softmax_{tag}", "log_softmax", dt, [r2], lambda x: torch.log_softmax(x, -1),
          iargs=[-1], atol=1e-6)
    xn, wn, bn = lo(rnd(4, 64), dt), lo(rnd(64), dt), lo(rnd(64), dt)
    lcase(f"layer_norm_{tag}", "layer_norm", dt, [xn, wn, bn],
          lambda x, w, b: F.layer_norm(x, (64,), w, b, 1e-5), fargs=[1e-5], atol=1e-5,
          native=False, note=OLD13)
    lcase(f"rms_norm_{tag}", "rms_norm", dt, [xn, wn],
          lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, fargs=[1e-6],
          native=False, atol=1e-5,
          note="torch 1.13 has no rms_norm; torch 2.11's F.rms_norm in bf16 equals the f32 "
               "computation rounded once (checked)")
    # matmuls: f32 accumulation (OpenBLAS sgemm on f32 copies; PyTorch's bf16 gemm), one rounding
    a, b = lo(rnd(6, 40), dt), lo(rnd(40, 7), dt)
    lcase(f"mm_k40_{tag}", "mm", dt, [a, b], torch.mm, atol=1e-4, native=False, note=OLD13,
          mag=(a.float().abs() @ b.float().abs()).max())
    x3, y3 = lo(rnd(3, 4, 24), dt), lo(rnd(3, 24, 5), dt)
    lcase(f"bmm_k24_{tag}", "bmm", dt, [x3, y3], torch.bmm, atol=1e-4, native=False, note=OLD13,
          mag=(x3.float().abs() @ y3.float().abs()).max())
    bias1 = lo(rnd(7), dt)
    lcase(f"addmm_{tag}", "addmm", dt, [bias1, a, b],
          lambda c, m1, m2: torch.addmm(c, m1, m2, beta=0.5, alpha=2.0), fargs=[0.5, 2.0],
          atol=1e-4, native=False, note=OLD13, mag=2 * (a.float().abs() @ b.float().abs()).max() + 1)
    xl, w, bl = lo(rnd(6, 40), dt), lo(rnd(7, 40), dt), lo(rnd(7), dt)
    lcase(f"linear_{tag}", "linear", dt, [xl, w, bl], F.linear, atol=1e-4,
          mag=(xl.float().abs() @ w.float().abs().t()).max() + 2)
    # data movement: the same bits
    emb, ids = lo(rnd(9, 4), dt), ints(9, 3, 5)
    lcase(f"embedding_{tag}", "embedding", dt, [emb, ids], lambda w, i: F.embedding(i, w), ulps=0)
    v3 = lo(rnd(4, 6, 5), dt)
    lcase(f"transpose_{tag}", "transpose", dt, [v3], lambda x: x.transpose(0, 2).contiguous(),
          iargs=[0, 2], ulps=0)
    lcase(f"slice_{tag}", "slice", dt, [v3], lambda x: x[:, 1:6:2, :].contiguous(),
          iargs=[1, 1, 6, 2], ulps=0)
    lcase(f"cat_{tag}", "cat", dt, [v3, lo(rnd(4, 2, 5), dt)], lambda x, y: torch.cat([x, y], 1),
          iargs=[1], ulps=0)
    gx, gi = lo(rnd(5, 7), dt), ints(7, 5, 3)
    lcase(f"gather_{tag}", "gather", dt, [gx, gi], lambda x, i: torch.gather(x, 1, i), iargs=[1],
          ulps=0)
    tk = lo(torch.randperm(35, generator=G).reshape(5, 7).float() / 8 - 2, dt)  # no ties
    try:
        tv, ti = torch.topk(tk, 3, dim=1)
        how = "torch"
    except RuntimeError:
        tv, ti = torch.topk(tk.float(), 3, dim=1)
        tv, how = tv.to(dt), "f32-round"
    case(f"topk_{tag}", "topk", [tk], [tv, ti], iargs=[3, 1], rtol=0.0, atol=0.0, ref=how)
    # attention and rotary: f32 compute, one rounding (torch 1.13 has no sdpa; torch 2.x's CPU
    # flash attention accumulates in f32 and rounds its output once)
    qa, ka, va = lo(rnd(1, 4, 6, 8), dt), lo(rnd(1, 2, 6, 8), dt), lo(rnd(1, 2, 6, 8), dt)
    # on a GPU the tensor-core kernel rounds the attention weights P (in [0, 1]) to the dtype
    # before P V, as flash attention does (and torch 2.11's CPU kernel): each output moves by at
    # most half an ulp of P times sum_j P_j |v_j| <= max |v|; bounded here by a whole ulp
    lcase(f"sdpa_gqa_causal_{tag}", "sdpa", dt, [qa, ka, va],
          lambda q, k, v: sdpa_ref(q, k, v, True), iargs=[1], native=False, atol=1e-4,
          note="sdpa_ref in f32 on the rounded inputs, rounded once",
          device=[ULP[dt], ULP[dt] * float(va.float().abs().max())])
    xr = lo(rnd(2, 6, 3, 8), dt)
    lcase(f"rotary_{tag}", "rotary", dt, [xr], lambda x: rotary_ref(x, 1, 10000.0), iargs=[1],
          fargs=[10000.0], native=False, atol=1e-5, note="rotary_ref in double, rounded once")
    # cross-entropy of low-precision logits: PyTorch rounds log_softmax to the dtype, then the
    # mean of the picked values (f32 accumulation) rounded again
    lg, tg = lo(rnd(6, 11) * 2, dt), ints(11, 6)
    lcase(f"cross_entropy_{tag}", "cross_entropy", dt, [lg, tg], F.cross_entropy, atol=1e-4,
          ulps=2)
    lcase(f"cross_entropy_none_{tag}", "cross_entropy", dt, [lg, tg],
          lambda x, t: F.cross_entropy(x, t, reduction="none"), iargs=[0], atol=1e-4, ulps=2)

# past the range: an f16 result past 65504 is inf (exp, products, sums accumulated in f32 and
# rounded once); a mean whose f16 sum would overflow stays finite (torch 2.x accumulates in f32
# and rounds the mean once; torch 1.13 rounds the sum to f16 first and gives inf)
big = torch.tensor([[10.0, 11.5, -3.0, 12.0], [30000.0, 30000.0, 30000.0, -1.0]]).to(HF)
lcase("exp_overflow_f16", "exp", HF, [big[:1]], torch.exp)
lcase("mul_overflow_f16", "mul", HF, [big[1:], big[1:]], torch.mul, ulps=0)
lcase("sum_overflow_f16", "sum", HF, [big], lambda x: x.sum(1), iargs=[0, 1], atol=1e-3)
lcase("mean_big_f16", "mean", HF, [big], lambda x: x.mean(1), iargs=[0, 1], native=False,
      note="torch 1.13 rounds the f16 sum (inf) before dividing; torch 2.11: 22496, f32 mean rounded once")
bigb = torch.tensor([[3e38, 3e38, 1.0, -2.0], [1e38, 2e38, -3e38, 5.0]]).to(BF)
lcase("sum_overflow_bf16", "sum", BF, [bigb], lambda x: x.sum(1), iargs=[0, 1])
lcase("add_overflow_bf16", "add", BF, [bigb[:1], bigb[:1]], torch.add, ulps=0)

# casts: round to nearest even at the ties, past the range to inf, NaN kept, subnormals
T = 2.0 ** -8
f32_vals = torch.tensor([1 + T, 1 + 3 * T, -(1 + T), 1 + T + 2 ** -20, 2 - T / 2, 3.3895314e38,
                         3.3961775e38, 3.4028235e38, -3.4e38, 65504.0, 65519.0, 65520.0, 1e5,
                         -70000.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14 * 1.5,
                         1e-40, 0.1, -0.0, float("inf"), float("-inf"), float("nan")],
                        dtype=torch.float32)
case("cast_f32_bf16", "cast", [f32_vals], f32_vals.to(BF), iargs=[1], rtol=0.0, atol=0.0)
case("cast_f32_f16", "cast", [f32_vals], f32_vals.to(HF), iargs=[2], rtol=0.0, atol=0.0)
bf_vals = torch.tensor([1 + 2 ** -7, 1 + 3 * 2 ** -7, 65504.0, 65536.0, 65280.0, 1e5, -3e38,
                        2.0 ** -25, 2.0 ** -24 * 1.5, 2.0 ** -24 * 2.5, 2.0 ** -14 * (1 + 2 ** -7),
                        0.1, -0.0, float("inf"), float("nan")]).to(BF)
case("cast_bf16_f16", "cast", [bf_vals], bf_vals.to(HF), iargs=[2], rtol=0.0, atol=0.0)
case("cast_bf16_f32", "cast", [bf_vals], bf_vals.float(), iargs=[0], rtol=0.0, atol=0.0)
# a Partial(sum) input is made from the full value as PyTorch DTensor makes one (divided by the
# mesh dim's size: 2^-24 / 2 underflows to 0 in f16), so the f16 subnormals may lose 2^-24 there
hf_vals = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -10, 65504.0, 2.0 ** -24,
                        3 * 2.0 ** -24, 0.1, -0.0, float("inf"), float("-inf"),
                        float("nan")]).to(HF)
case("cast_f16_bf16", "cast", [hf_vals], hf_vals.to(BF), iargs=[1], rtol=0.0, atol=0.0,
     partial=[0.0, 2.0 ** -24])
case("cast_f16_f32", "cast", [hf_vals], hf_vals.float(), iargs=[0], rtol=0.0, atol=0.0,
     partial=[0.0, 2.0 ** -24])
big_i = torch.tensor([257, 259, 65535, 65536 + 256, -(2 ** 24 + 1), 123456789], dtype=torch.int64)
case("cast_i64_bf16", "cast", [big_i], big_i.to(BF), iargs=[1], rtol=0.0, atol=0.0)
case("cast_i64_f16", "cast", [big_i[:3]], big_i[:3].to(HF), iargs=[2], rtol=0.0, atol=0.0)
fin = bf_vals[:9].clone()
fin[[2, 3, 5, 6]] = torch.tensor([-2.75, 300.5, -7.5, 1e4]).to(BF)
case("cast_bf16_i64", "cast", [fin], fin.to(torch.int64), iargs=[4], rtol=0.0, atol=0.0)
case("cast_bf16_bf16", "cast", [bf_vals], bf_vals.clone(), iargs=[1], rtol=0.0, atol=0.0)


# ---- type promotion: operands of different dtypes. PyTorch casts each operand to
#      torch.result_type's dtype (0-dim operands count only when of a higher category) and
#      computes as for one dtype; dtensor does the same. Outputs and gradients are PyTorch's own at
#      the inputs' dtypes (each float input's gradient in that input's dtype; L = sum(output * r)
#      with r rounded to the output's dtype). Left out: integer results (the host kernels of these
#      ops compute floats only) and eq/ge/gt (PyTorch gives bool, dtensor 0/1 in the result dtype).
#      Tolerances: one ulp of the result dtype ("partial": 4 ulps of the largest sum of |terms|);
#      gradients 2 ulps + 4 ulps of the largest gradient of the lowest precision involved.
I64, I32 = torch.int64, torch.int32

def pcase(name, op, ins, fn, iargs=()):
    out = fn(*ins)
    rd = out.dtype
    dts = [t.dtype for t in ins if t.is_floating_point()] + [rd]
    ulp = max([ULP.get(d, 0.0) for d in dts])
    rtol = ULP[rd] if rd in ULP else 1e-5
    extra = {}
    if rd in ULP:  # a rank's partial result rounded to the result dtype before the sum
        mag = float(out.float().abs().max()) + sum(float(t.float().abs().max()) for t in ins)
        extra["partial"] = [ULP[rd], 4 * ULP[rd] * mag]
    case(name, op, ins, out, iargs=iargs, rtol=rtol, atol=1e-6, **extra)
    c = CASES[-1]
    xs = [t.clone().requires_grad_(t.is_floating_point()) for t in ins]
    y = fn(*xs)
    n = y.numel()
    r = torch.tensor([0.5 + ((i + 1) * 37 % 101) / 101.0 for i in range(n)]).reshape(y.shape)
    r = r.to(rd)
    (y * r).sum().backward()
    grads = [x.grad if x.is_floating_point() else None for x in xs]
    for x, g in zip(xs, grads):
        assert g is None or g.dtype == x.dtype, (name, g.dtype, x.dtype)
    c["grad_weights"] = [float(v) for v in r.float().flatten().tolist()]
    c["grads"] = [None if g is None else [num(float(v)) for v in g.float().flatten().tolist()]
                  for g in grads]
    if ulp > 0:
        gmax = max(float(g.float().abs().max()) for g in grads if g is not None)
        c["grad_tol"] = [2 * ulp, 4 * ulp * gmax]

pa, pb, ph = rnd(4, 3), bf(rnd(4, 3)), rnd(4, 3).to(HF)
pbrow, phrow, pcol = bf(rnd(3)), rnd(3).to(HF), rnd(4, 1)
pdb, pdh = bf(pos(4, 3)), pos(4, 3).to(HF)
pi64, pi32 = ints(7, 4, 3) - 3, (ints(5, 4, 3) + 1).to(I32)
pcond = ints(2, 4, 3)
z32, zbf, zhf, zi64 = torch.tensor(1.3), bf(torch.tensor(-0.7)), torch.tensor(1.6).to(HF), \
    torch.tensor(3, dtype=I64)
pcase("add_f32_bf16", "add", [pa, pb], torch.add)
pcase("add_bf16_f16_bcast", "add", [pb, phrow], torch.add)
pcase("sub_f16_f32", "sub", [ph, pa], torch.sub)
pcase("mul_bf16_f32_bcast", "mul", [pb, pcol], torch.mul)
pcase("mul_i64_f32", "mul", [pi64, pa], torch.mul)
pcase("div_f32_bf16", "div", [pa, pdb], torch.div)
pcase("div_i32_bf16", "div", [pi32, pdb], torch.div)
pcase("div_f16_bf16", "div", [ph, pdb], torch.div)
pcase("maximum_bf16_f16", "maximum", [pb, ph], torch.maximum)
pcase("minimum_f32_i64", "minimum", [pa, pi64], torch.minimum)
pcase("maximum_i64_bf16", "maximum", [pi64, pb], torch.maximum)
pcase("where_f32_bf16", "where", [pcond, pa, pb], lambda c, a, b: torch.where(c.bool(), a, b))
pcase("where_i64_f16", "where", [pcond, pi64, ph], lambda c, a, b: torch.where(c.bool(), a, b))
# 0-dim operands: a dim operand's dtype wins within its category ...
pcase("add_bf16_0dim_f32", "add", [pb, z32], torch.add)
pcase("mul_0dim_f32_f16", "mul", [z32, ph], torch.mul)
pcase("div_f16_0dim_bf16", "div", [ph, zbf], torch.div)
pcase("where_bf16_0dim_f32", "where", [pcond, pb, z32], lambda c, a, b: torch.where(c.bool(), a, b))
# ... a float 0-dim lifts integer operands to its type; an integer 0-dim changes no float
pcase("mul_i64_0dim_bf16", "mul", [pi64, zbf], torch.mul)
pcase("add_0dim_f16_i32", "add", [zhf, pi32], torch.add)
pcase("sub_bf16_0dim_i64", "sub", [pb, zi64], torch.sub)
# every operand 0-dim: the promotion over them all
pcase("add_0dim_bf16_0dim_f16", "add", [zbf, zhf], torch.add)
pcase("maximum_0dim_f32_0dim_bf16", "maximum", [z32, zbf], torch.maximum)
# ops PyTorch does not promote: refused
for nm, op, ins, fn in (("mm_f32_bf16", "mm", [pa, bf(rnd(3, 2))], torch.mm),
                        ("linear_bf16_f32", "linear_nobias", [pb, rnd(2, 3)], F.linear)):
    try:
        fn(*ins)
        raise AssertionError(f"{nm}: PyTorch promotes")
    except RuntimeError:
        pass
    CASES.append({"name": nm, "op": op, "iargs": [], "fargs": [], "inputs": [tens(t) for t in ins],
                  "outputs": [], "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})


# ---- comparisons, abs and clamp (appended: the generator's earlier draws stay as they were).
#      Comparisons give 1 / 0 in the operands' dtype where PyTorch gives bool (its .float()).
ca, cb = rnd(6, 5), rnd(6, 5)
cb[::2] = ca[::2]  # ties on every other row
cb[1, 1], ca[3, 2], ca[5, 0], cb[5, 0] = math.nan, math.nan, math.nan, math.nan  # NaN: unequal
crow = ca[2].clone()  # a broadcast row tied with row 2
for op, fn in (("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le),
               ("ge", torch.ge), ("gt", torch.gt)):
    case(f"{op}_ties_nan", op, [ca, cb], fn(ca, cb).float(), rtol=0.0, atol=0.0)
    case(f"{op}_bcast_row", op, [ca, crow], fn(ca, crow).float(), rtol=0.0, atol=0.0)
ci, cj = ints(5, 6, 5) - 2, ints(5, 5) - 2
for op, fn in (("ne", torch.ne), ("lt", torch.lt), ("le", torch.le)):
    case(f"{op}_i64_bcast", op, [ci, cj], fn(ci, cj).long(), rtol=0.0, atol=0.0)
ab = rnd(6, 5)
ab[0, 0], ab[1, 1], ab[2, 2] = 0.0, -0.0, -2.0
case("abs", "abs", [ab], torch.abs(ab), rtol=0.0, atol=0.0)
case("clamp", "clamp", [ab], torch.clamp(ab, -0.5, 0.75), fargs=[-0.5, 0.75], rtol=0.0, atol=0.0)
case("clamp_min", "clamp", [ab], torch.clamp(ab, min=0.25), fargs=[0.25], rtol=0.0, atol=0.0)
case("clamp_max_only", "clamp", [ab], torch.clamp(ab, max=-0.25), fargs=[math.nan, -0.25],
     rtol=0.0, atol=0.0)
case("clamp_min_above_max", "clamp", [ab], torch.clamp(ab, 1.0, -1.0), fargs=[1.0, -1.0],
     rtol=0.0, atol=0.0)
for dt, tag in LOW:
    x = lo(ab, dt)
    lcase(f"abs_{tag}", "abs", dt, [x], torch.abs, ulps=0)
    lcase(f"clamp_{tag}", "clamp", dt, [x], lambda t: torch.clamp(t, -0.5, 0.75),
          fargs=[-0.5, 0.75], ulps=0)
    lcase(f"lt_{tag}", "lt", dt, [x, lo(cb, dt)], lambda a, b: torch.lt(a, b).to(a.dtype), ulps=0)
# ---- integer operands of neg, sum, amax, amin, mean, where and masked_fill (appended last, so
#      the cases above keep their random draws). torch.sum of i32 or i64 is i64; amax / amin keep
#      the dtype; mean refuses integers; masked_fill truncates its value into an integer tensor
#      and refuses one that does not fit. A float condition / mask counts nonzero (NaN too) as
#      true: torch.where wants a bool condition, so the reference takes cond.bool(). Integer
#      outputs compare exactly (values within 2^53: JSON numbers are doubles). No gradients.
ib = torch.tensor([[2**31 - 1, -2**31, 5, 7], [2**31 - 1, -2**31, -5, 0],
                   [2**31 - 1, -1, 7, -2**31 + 1]], dtype=I32)
case("neg_i32", "neg", [ib], -ib, rtol=0.0, atol=0.0)
il = ints(2**40, 3, 4) - 2**39
case("neg_i64", "neg", [il], -il, rtol=0.0, atol=0.0)
case("sum_i32_dim0", "sum", [ib], ib.sum(0), iargs=[0, 0], rtol=0.0, atol=0.0)
case("sum_i32_all", "sum", [ib], ib.sum(), iargs=[0], rtol=0.0, atol=0.0)
case("sum_i64_keep", "sum", [il], il.sum(1, keepdim=True), iargs=[1, 1], rtol=0.0, atol=0.0)
case("amax_i32_dim1", "amax", [ib], ib.amax(1), iargs=[0, 1], rtol=0.0, atol=0.0)
case("amin_i32_keep", "amin", [ib], ib.amin(0, keepdim=True), iargs=[1, 0], rtol=0.0, atol=0.0)
case("amax_i64_all", "amax", [il], il.amax((0, 1)), iargs=[0, 0, 1], rtol=0.0, atol=0.0)
for nm, t in (("mean_i64_error", il), ("mean_i32_error", ib)):
    try:
        t.mean(0)
        raise AssertionError(f"{nm}: PyTorch takes integers")
    except RuntimeError as e:
        assert "could not infer output dtype" in str(e), e
    CASES.append({"name": nm, "op": "mean", "iargs": [0, 0], "fargs": [], "inputs": [tens(t)],
                  "outputs": [], "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})
fcond = torch.tensor([[0.0, float("nan"), -0.0, 2.0], [1.0, 0.0, -1.0, 0.5], [0.0, 3.0, 0.0, 0.0]])
case("where_f32cond_i64", "where", [fcond, il, il.flip(0)], torch.where(fcond.bool(), il, il.flip(0)),
     rtol=0.0, atol=0.0)
icond = torch.tensor([[1], [0], [5]])  # nonzero = true
case("where_i64cond_i32_bcast", "where", [icond, ib, ib.flip(1)],
     torch.where(icond.bool(), ib, ib.flip(1)), rtol=0.0, atol=0.0)
case("masked_fill_i32_trunc", "masked_fill", [ib, fcond], ib.masked_fill(fcond.bool(), 2.5),
     fargs=[2.5], rtol=0.0, atol=0.0)
case("masked_fill_i64_neg_trunc", "masked_fill", [il, icond], il.masked_fill(icond.bool(), -7.75),
     fargs=[-7.75], rtol=0.0, atol=0.0)
try:
    ib.masked_fill(fcond.bool(), 2.0 ** 31)
    raise AssertionError("masked_fill_i32_overflow: PyTorch takes it")
except RuntimeError as e:
    assert "without overflow" in str(e), e
CASES.append({"name": "masked_fill_i32_overflow_error", "op": "masked_fill", "iargs": [],
              "fargs": [2.0 ** 31], "inputs": [tens(ib), tens(fcond)], "outputs": [],
              "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})
# ---- sin, cos, reciprocal, log1p, expm1 (appended last: the draws above stay as they were).
#      f32 at ordinary points, sin / cos of arguments up to 1e4 (a full range reduction), log1p
#      and expm1 of tiny arguments (relative 1e-6: exp(x) - 1 or log(1 + x) would lose most
#      digits there); bf16 / f16: the f32 result rounded once (reciprocal exactly: one division).
ux = rnd(6, 5, lo=-4.0, hi=4.0)
case("sin", "sin", [ux], torch.sin(ux))
case("cos", "cos", [ux], torch.cos(ux))
case("reciprocal", "reciprocal", [ux], torch.reciprocal(ux))
case("expm1", "expm1", [ux], torch.expm1(ux))
ul = rnd(6, 5, lo=-0.9, hi=3.0)
case("log1p", "log1p", [ul], torch.log1p(ul))
ubig = rnd(6, 5, lo=-1e4, hi=1e4)
case("sin_large", "sin", [ubig], torch.sin(ubig))
case("cos_large", "cos", [ubig], torch.cos(ubig))
utiny = rnd(6, 5) * 1e-6
case("log1p_tiny", "log1p", [utiny], torch.log1p(utiny), rtol=1e-6, atol=0.0)
case("expm1_tiny", "expm1", [utiny], torch.expm1(utiny), rtol=1e-6, atol=0.0)
for dt, tag in LOW:
    x = lo(ux, dt)
    for op, fn in (("sin", torch.sin), ("cos", torch.cos), ("expm1", torch.expm1)):
        lcase(f"{op}_{tag}", op, dt, [x], fn)
    lcase(f"reciprocal_{tag}", "reciprocal", dt, [x], torch.reciprocal, ulps=0)
    lcase(f"log1p_{tag}", "log1p", dt, [lo(ul, dt)], torch.log1p)

# ---- expand (appended: earlier draws unchanged). -1 keeps a dim; new dims lead; only size-1
#      dims grow. The gradient sums over the broadcast dims.
ex_col, ex_row, ex_3 = rnd(6, 1), rnd(1, 5), rnd(4, 1, 3)
case("expand_col", "expand", [ex_col], ex_col.expand(6, 5), iargs=[6, 5], rtol=0.0, atol=0.0)
case("expand_row_keep", "expand", [ex_row], ex_row.expand(6, -1), iargs=[6, -1], rtol=0.0, atol=0.0)
case("expand_new_lead", "expand", [ex_3], ex_3.expand(2, 4, 5, 3), iargs=[2, 4, 5, 3],
     rtol=0.0, atol=0.0)
case("expand_same", "expand", [ab], ab.expand(-1, 5), iargs=[-1, 5], rtol=0.0, atol=0.0)
ex_i = ints(100, 3, 1) - 50
case("expand_i64", "expand", [ex_i], ex_i.expand(2, 3, 4), iargs=[2, 3, 4], rtol=0.0, atol=0.0)
ex_0d = rnd(())
case("expand_0d", "expand", [ex_0d], ex_0d.expand(3, 2), iargs=[3, 2], rtol=0.0, atol=0.0)
for dt, tag in LOW:
    lcase(f"expand_{tag}", "expand", dt, [lo(ex_3, dt)], lambda t: t.expand(2, 4, 5, 3),
          iargs=[2, 4, 5, 3], ulps=0)
for nm, t, sz in (("expand_nonsingleton_error", ex_row, [6, 4]),
                  ("expand_lead_minus1_error", ex_row, [-1, 1, 5]),
                  ("expand_too_few_error", ex_3, [4, 5])):
    try:
        t.expand(*sz)
        raise AssertionError(f"{nm}: PyTorch takes it")
    except RuntimeError:
        pass
    CASES.append({"name": nm, "op": "expand", "iargs": sz, "fargs": [], "inputs": [tens(t)],
                  "outputs": [], "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})

# ---- argmax, argmin and logsumexp (appended last: the cases above keep their random draws).
#      argmax / argmin give i64: the first position of the extreme (ties: the lowest index, -0.0
#      ties with 0.0; a NaN counts as the extreme, its first position wins), at most one dim (none:
#      the index into the flattened tensor); no gradient. logsumexp: max-shifted, integers
#      promote to f32, a list of dims (none: every dim, as sum's schema).
am = rnd(4, 6, 5)
am[0, 1, :] = 0.5  # a tied row along dim 2
am[1, :, 2] = 2.5  # a tied maximum along dim 1
am[1, :, 3] = -2.5  # a tied minimum along dim 1
am[2, 3, 1], am[2, 3, 4] = math.nan, math.nan  # NaN along dims 0, 1 and 2
am[3, 0, :] = torch.tensor([-1.0, -0.0, 0.0, -1.0, 0.0])
am[3, 5, :] = torch.tensor([-math.inf, math.inf, math.inf, -math.inf, 0.0])
amc = am.nan_to_num(0.0)  # no NaN: the flattened index finds the tied maximum 2.5
for op, fn in (("argmax", torch.argmax), ("argmin", torch.argmin)):
    case(f"{op}_dim2", op, [am], fn(am, 2), iargs=[0, 2], rtol=0.0, atol=0.0)
    case(f"{op}_dim1_keep", op, [am], fn(am, 1, keepdim=True), iargs=[1, 1], rtol=0.0, atol=0.0)
    case(f"{op}_dim0_neg", op, [am], fn(am, -3), iargs=[0, -3], rtol=0.0, atol=0.0)
    case(f"{op}_all_nan", op, [am], fn(am), iargs=[0], rtol=0.0, atol=0.0)
    case(f"{op}_all", op, [amc], fn(amc), iargs=[0], rtol=0.0, atol=0.0)
    case(f"{op}_all_keep", op, [amc], fn(amc, keepdim=True), iargs=[1], rtol=0.0, atol=0.0)
    case(f"{op}_i32_dim0", op, [ib], fn(ib, 0), iargs=[0, 0], rtol=0.0, atol=0.0)
    case(f"{op}_i64_dim1", op, [il], fn(il, 1), iargs=[0, 1], rtol=0.0, atol=0.0)
    case(f"{op}_i64_all", op, [il], fn(il), iargs=[0], rtol=0.0, atol=0.0)
    for dt, tag in LOW:  # the same values in f32 (torch 1.13 has no f16 argmin on the CPU)
        x = am.to(dt)
        case(f"{op}_dim2_{tag}", op, [x], fn(x.float(), 2), iargs=[0, 2], rtol=0.0, atol=0.0)
        case(f"{op}_all_{tag}", op, [amc.to(dt)], fn(amc.to(dt).float()), iargs=[0], rtol=0.0,
             atol=0.0)
ls = rnd(4, 6, 5) * 8
ls[1, 2, :] = 1e4 + torch.arange(5.0)  # large: exp overflows without the shift
ls[2, 0, :] = -1e4 - torch.arange(5.0)
case("logsumexp_dim1", "logsumexp", [ls], torch.logsumexp(ls, 1), iargs=[0, 1])
case("logsumexp_dim2_keep", "logsumexp", [ls], torch.logsumexp(ls, 2, keepdim=True), iargs=[1, 2])
case("logsumexp_dims_neg", "logsumexp", [ls], torch.logsumexp(ls, (0, -1)), iargs=[0, 0, -1])
case("logsumexp_dims_keep", "logsumexp", [ls], torch.logsumexp(ls, (2, 0), keepdim=True),
     iargs=[1, 2, 0])
case("logsumexp_all", "logsumexp", [ls], torch.logsumexp(ls, (0, 1, 2)), iargs=[0])
li = ints(7, 3, 4) - 3
case("logsumexp_i64", "logsumexp", [li], torch.logsumexp(li, 1), iargs=[0, 1])
case("logsumexp_i32", "logsumexp", [li.int()], torch.logsumexp(li.int(), 0), iargs=[0, 0])
LSE13 = "torch 1.13's bf16 logsumexp rounds intermediates; the f32 computation rounded once"
for dt, tag in LOW:
    x = lo(rnd(4, 6, 5) * 4, dt)
    # torch 1.13's bf16 logsumexp rounds its intermediates to bf16 (up to 1.5 % off on these
    # draws): the reference is the f32 computation rounded once, as the library computes
    lcase(f"logsumexp_dim1_{tag}", "logsumexp", dt, [x], lambda t: torch.logsumexp(t, 1),
          iargs=[0, 1], native=False, note=LSE13)
    lcase(f"logsumexp_dims_{tag}", "logsumexp", dt, [x], lambda t: torch.logsumexp(t, (0, 2)),
          iargs=[0, 0, 2], native=False, note=LSE13)

# ---- tril, triu and cumsum (appended last: the cases above keep their random draws).
#      tril keeps column - row <= diagonal of the last two dims, triu column - row >= diagonal;
#      any dtype, a batch of matrices. cumsum scans one dim; i32 / i64 give i64, floats keep
#      their dtype (f32 accumulates in double in both libraries).
tr2, tr3, tr_w = rnd(5, 6), rnd(3, 4, 7), rnd(7, 3)
for op, fn in (("tril", torch.tril), ("triu", torch.triu)):
    case(f"{op}_2d", op, [tr2], fn(tr2), rtol=0.0, atol=0.0)
    case(f"{op}_diag2", op, [tr2], fn(tr2, 2), iargs=[2], rtol=0.0, atol=0.0)
    case(f"{op}_diag_neg2", op, [tr2], fn(tr2, -2), iargs=[-2], rtol=0.0, atol=0.0)
    case(f"{op}_batch_diag1", op, [tr3], fn(tr3, 1), iargs=[1], rtol=0.0, atol=0.0)
    case(f"{op}_tall_diag_neg1", op, [tr_w], fn(tr_w, -1), iargs=[-1], rtol=0.0, atol=0.0)
    case(f"{op}_diag_far", op, [tr3], fn(tr3, 100), iargs=[100], rtol=0.0, atol=0.0)
    case(f"{op}_diag_far_neg", op, [tr3], fn(tr3, -100), iargs=[-100], rtol=0.0, atol=0.0)
    ti = ints(100, 2, 5, 4) - 50
    case(f"{op}_i64", op, [ti], fn(ti, 1), iargs=[1], rtol=0.0, atol=0.0)
    case(f"{op}_i32", op, [ti.int()], fn(ti.int()), rtol=0.0, atol=0.0)
    for dt, tag in LOW:
        lcase(f"{op}_{tag}", op, dt, [lo(tr3, dt)], lambda t, f=fn: f(t, -1), iargs=[-1], ulps=0)
    try:
        fn(rnd(4))
        raise AssertionError(f"{op} of a 1-d tensor: PyTorch takes it")
    except (RuntimeError, IndexError):
        pass
    CASES.append({"name": f"{op}_1d_error", "op": op, "iargs": [], "fargs": [],
                  "inputs": [tens(rnd(4))], "outputs": [], "error": "DT_ERR_INVALID_ARG",
                  "rtol": 0.0, "atol": 0.0})
cs = rnd(4, 6, 5)
case("cumsum_dim0", "cumsum", [cs], torch.cumsum(cs, 0), iargs=[0])
case("cumsum_dim1", "cumsum", [cs], torch.cumsum(cs, 1), iargs=[1])
case("cumsum_dim_neg1", "cumsum", [cs], torch.cumsum(cs, -1), iargs=[-1])
cs_long = rnd(3, 300)
case("cumsum_long", "cumsum", [cs_long], torch.cumsum(cs_long, 1), iargs=[1])
cs_0d = rnd(())
case("cumsum_0d", "cumsum", [cs_0d], torch.cumsum(cs_0d, 0), iargs=[0])
ci = ints(1000, 4, 5) - 500
case("cumsum_i64", "cumsum", [ci], torch.cumsum(ci, 1), iargs=[1], rtol=0.0, atol=0.0)
case("cumsum_i32", "cumsum", [ci.int()], torch.cumsum(ci.int(), 0), iargs=[0], rtol=0.0, atol=0.0)
for dt, tag in LOW:
    x = lo(cs, dt)
    mag = float(cs.abs().sum())
    lcase(f"cumsum_dim1_{tag}", "cumsum", dt, [x], lambda t: torch.cumsum(t, 1), iargs=[1],
          mag=mag)
    lcase(f"cumsum_dim0_{tag}", "cumsum", dt, [x], lambda t: torch.cumsum(t, 0), iargs=[0],
          mag=mag)
for nm, t, ia in (("cumsum_dim_range_error", cs, [3]), ("cumsum_0d_dim_error", cs_0d, [1])):
    try:
        torch.cumsum(t, ia[0])
        raise AssertionError(f"{nm}: PyTorch takes it")
    except IndexError:
        pass
    CASES.append({"name": nm, "op": "cumsum", "iargs": ia, "fargs": [], "inputs": [tens(t)],
                  "outputs": [], "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})

# ---- stack, and cat's type promotion (appended last). stack joins 1 to 8 tensors of one shape
#      along a new dim (-(nd + 1) to nd); both promote their inputs' dtypes as torch.cat / stack.
sa, sb, sc = rnd(3, 4), rnd(3, 4), rnd(3, 4)
case("stack_dim0", "stack", [sa, sb, sc], torch.stack([sa, sb, sc], 0), rtol=0.0, atol=0.0)
case("stack_dim1", "stack", [sa, sb], torch.stack([sa, sb], 1), iargs=[1], rtol=0.0, atol=0.0)
case("stack_dim_last", "stack", [sa, sb], torch.stack([sa, sb], 2), iargs=[2], rtol=0.0, atol=0.0)
case("stack_dim_neg", "stack", [sa, sb, sc], torch.stack([sa, sb, sc], -2), iargs=[-2], rtol=0.0,
     atol=0.0)
case("stack_one", "stack", [sa], torch.stack([sa], 1), iargs=[1], rtol=0.0, atol=0.0)
s0a, s0b = rnd(()), rnd(())
case("stack_0d", "stack", [s0a, s0b], torch.stack([s0a, s0b]), rtol=0.0, atol=0.0)
si = ints(100, 3, 4) - 50
case("stack_i64", "stack", [si, si + 1], torch.stack([si, si + 1], 1), iargs=[1], rtol=0.0,
     atol=0.0)
for dt, tag in LOW:
    lcase(f"stack_{tag}", "stack", dt, [lo(sa, dt), lo(sb, dt)], lambda x, y: torch.stack([x, y], -1),
          iargs=[-1], ulps=0)
pcase("stack_f32_i64", "stack", [sa, si], lambda x, y: torch.stack([x, y], 1), iargs=[1])
pcase("stack_bf16_f16", "stack", [sa.to(BF), sb.to(HF)], lambda x, y: torch.stack([x, y]))
pcase("cat_f32_i64", "cat", [sa, si], lambda x, y: torch.cat([x, y], 1), iargs=[1])
pcase("cat_i32_i64_bf16", "cat", [si.int(), si, sc.to(BF)], lambda *x: torch.cat(x, 0), iargs=[0])
for nm, ts, ia in (("stack_shape_error", [sa, rnd(4, 3)], [0]), ("stack_dim_error", [sa, sb], [3]),
                   ("stack_dim_neg_error", [sa, sb], [-4])):
    try:
        torch.stack(ts, ia[0])
        raise AssertionError(f"{nm}: PyTorch takes it")
    except (RuntimeError, IndexError):
        pass
    CASES.append({"name": nm, "op": "stack", "iargs": ia, "fargs": [], "inputs": [tens(t) for t in ts],
                  "outputs": [], "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})

# ---- index_select (appended last): slices along dim at the indices (1-d or 0-d, i32 / i64,
#      repeats and any order), any dtype; an index out of range raises. Gradient: the slices'
#      gradients added back at the indices (repeated indices sum).
isx = rnd(4, 6, 3)
ixv = torch.tensor([5, 0, 5, 2, 1, 5])
case("index_select_dim1", "index_select", [isx, ixv], torch.index_select(isx, 1, ixv), iargs=[1],
     rtol=0.0, atol=0.0)
case("index_select_dim0_i32", "index_select", [isx, torch.tensor([3, 3, 0], dtype=torch.int32)],
     torch.index_select(isx, 0, torch.tensor([3, 3, 0])), iargs=[0], rtol=0.0, atol=0.0)
case("index_select_dim_last", "index_select", [isx, torch.tensor([2, 0])],
     torch.index_select(isx, -1, torch.tensor([2, 0])), iargs=[-1], rtol=0.0, atol=0.0)
case("index_select_0d_index", "index_select", [isx, torch.tensor(4)],
     torch.index_select(isx, 1, torch.tensor(4)), iargs=[1], rtol=0.0, atol=0.0)
case("index_select_empty_index", "index_select", [isx, torch.tensor([], dtype=torch.int64)],
     torch.index_select(isx, 1, torch.tensor([], dtype=torch.int64)), iargs=[1], rtol=0.0,
     atol=0.0)
isi = ints(100, 5, 4) - 50
case("index_select_i64", "index_select", [isi, torch.tensor([3, 1, 3])],
     torch.index_select(isi, 1, torch.tensor([3, 1, 3])), iargs=[1], rtol=0.0, atol=0.0)
is0 = rnd(())
case("index_select_0d", "index_select", [is0, torch.tensor([0])],
     torch.index_select(is0, 0, torch.tensor([0])), iargs=[0], rtol=0.0, atol=0.0)
for dt, tag in LOW:
    lcase(f"index_select_{tag}", "index_select", dt, [lo(isx, dt), ixv],
          lambda x, i: torch.index_select(x, 1, i), iargs=[1], ulps=0)
for nm, ts, ia in (("index_select_range_error", [isx, torch.tensor([0, 6])], [1]),
                   ("index_select_negative_error", [isx, torch.tensor([-1])], [1]),
                   ("index_select_2d_index_error", [isx, torch.tensor([[0]])], [0]),
                   ("index_select_float_index_error", [isx, torch.tensor([0.0])], [0]),
                   ("index_select_dim_error", [isx, ixv], [3])):
    try:
        torch.index_select(ts[0], ia[0], ts[1])
        raise AssertionError(f"{nm}: PyTorch takes it")
    except (RuntimeError, IndexError):
        pass
    CASES.append({"name": nm, "op": "index_select", "iargs": ia, "fargs": [],
                  "inputs": [tens(t) for t in ts], "outputs": [], "error": "DT_ERR_INVALID_ARG",
                  "rtol": 0.0, "atol": 0.0})
# ---- floor, ceil, round, trunc, sign and erf (appended last: the cases above keep their random
#      draws). The exact ops compare exactly: round is half to even (nearbyint: 0.5 -> 0, 1.5 ->
#      2, 2.5 -> 2, -0.5 -> -0), sign(-0.0) = 0; round's decimals as torch 1.13's
#      round_decimals_kernel (x * 10^d rounded in x's dtype, nearbyint, / 10^d; bf16 10^4 is 9984;
#      f16 has no such kernel in 1.13: not given); integers keep their dtype and values (sign -1 /
#      0 / 1); erf of integers is f32. f16 floor / ceil / round / trunc / erf: torch 1.13 has no
#      CPU kernel, the f32 result rounded once (exact for the rounding ops). Gradients: zeros, erf
#      2 / sqrt(pi) exp(-x^2) g.
fr = rnd(6, 5, lo=-4.0, hi=4.0)
fr[0] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5])
fr[1] = torch.tensor([-1.5, 3.5, -0.0, 0.0, 2.0])
fr[2, :4] = torch.tensor([1e7 + 1.0, -8388607.5, 0.49999997, -3.0])
for op in ("floor", "ceil", "round", "trunc", "sign"):
    case(op, op, [fr], getattr(torch, op)(fr), rtol=0.0, atol=0.0)
dr = rnd(6, 5, lo=-300.0, hi=300.0)
dr[0] = torch.tensor([1.25, 1.35, -0.125, 125.0, 150.0])
dr[1] = torch.tensor([250.0, -250.0, 0.015, -1.23456, 3.4e38])
for d in (1, 2, 3, -1, -2, 39, -39):
    case(f"round_decimals_{d}".replace("-", "neg"), "round", [dr], torch.round(dr, decimals=d),
         iargs=[d], rtol=0.0, atol=0.0)
ef = rnd(6, 5, lo=-3.0, hi=3.0)
ef[0] = torch.tensor([0.0, -0.0, 4.0, -4.0, 1e-30])
case("erf", "erf", [ef], torch.erf(ef))
ri = torch.tensor([[2**31 - 1, -2**31, 5, 0], [-7, 1, -1, 2**24 + 1], [3, -2**24 - 1, 9, -9]],
                  dtype=I32)
rl = ints(2**40, 3, 4) - 2**39
rl[0, :3] = torch.tensor([2**53 - 1, -2**53 + 1, 0])  # exact in JSON's doubles, not in f32
for op in ("floor", "ceil", "round", "trunc", "sign"):
    case(f"{op}_i32", op, [ri], getattr(torch, op)(ri), rtol=0.0, atol=0.0)
    case(f"{op}_i64", op, [rl], getattr(torch, op)(rl), rtol=0.0, atol=0.0)
ei = ints(9, 3, 4) - 4
case("erf_i64", "erf", [ei], torch.erf(ei))
case("erf_i32", "erf", [ei.int()], torch.erf(ei.int()))
for dt, tag in LOW:
    x = lo(fr, dt)
    for op in ("floor", "ceil", "round", "trunc", "sign"):
        lcase(f"{op}_{tag}", op, dt, [x], getattr(torch, op), ulps=0)
    lcase(f"erf_{tag}", "erf", dt, [lo(ef, dt)], torch.erf)
xb = lo(dr, BF)
for d in (1, 2, 4, -1, -2):
    lcase(f"round_decimals_{d}_bf16".replace("-", "neg"), "round", BF, [xb],
          lambda t, d=d: torch.round(t, decimals=d), iargs=[d], ulps=0)
for nm, t, d in (("round_decimals_i64_error", rl, 1), ("round_decimals_i32_error", ri, -1),
                 ("round_decimals_f16_error", lo(dr, HF), 2)):
    try:
        torch.round(t, decimals=d)
        raise AssertionError(f"{nm}: PyTorch takes it")
    except RuntimeError as e:
        assert "not implemented for" in str(e), e
    CASES.append({"name": nm, "op": "round", "iargs": [d], "fargs": [], "inputs": [tens(t)],
                  "outputs": [], "error": "DT_ERR_UNSUPPORTED", "rtol": 0.0, "atol": 0.0})


# ---- var and std (appended last: the cases above keep their random draws). fargs [correction]
#      (default 1), iargs [keepdim, dim...] (none: every dim); the divisor max(0, N - correction);
#      float dtypes only (integers raise, PyTorch's "std and var only support floating point");
#      bf16 / f16: torch 1.13's kernels give the f32 result rounded once (checked: equal on these
#      draws), which lcase compares to as well. A row offset by 1e3 checks the two-pass centring.
vs = rnd(4, 6, 5) * 3
vs[1, 2, :] = 1e3 + torch.arange(5.0) * 1e-2  # large common offset, small spread
vs[3, :, 1] = 0.75  # constant along dim 1 (std 0)
for op, fn in (("var", torch.var), ("std", torch.std)):
    case(f"{op}_dim1", op, [vs], fn(vs, 1), iargs=[0, 1])
    case(f"{op}_dim2_keep_c0", op, [vs], fn(vs, 2, correction=0, keepdim=True), iargs=[1, 2],
         fargs=[0.0])
    case(f"{op}_dims_neg_c2", op, [vs], fn(vs, (0, -1), correction=2), iargs=[0, 0, -1],
         fargs=[2.0])
    case(f"{op}_dims_keep", op, [vs], fn(vs, (2, 0), keepdim=True), iargs=[1, 2, 0])
    case(f"{op}_all", op, [vs], fn(vs), iargs=[0])
    case(f"{op}_all_keep_c0", op, [vs], fn(vs, None, correction=0, keepdim=True), iargs=[1],
         fargs=[0.0])
    for dt, tag in LOW:
        x = lo(rnd(4, 6, 5) * 2 + 1, dt)
        lcase(f"{op}_dim1_{tag}", op, dt, [x], lambda t, fn=fn: fn(t, 1), iargs=[0, 1])
        lcase(f"{op}_dims_c0_{tag}", op, dt, [x], lambda t, fn=fn: fn(t, (0, 2), correction=0),
              iargs=[0, 0, 2], fargs=[0.0])
    for nm, t in ((f"{op}_i64_error", il), (f"{op}_i32_error", ib)):
        try:
            fn(t, 0)
            raise AssertionError(f"{nm}: PyTorch takes integers")
        except RuntimeError as e:
            assert "std and var only support floating point" in str(e), e
        CASES.append({"name": nm, "op": op, "iargs": [0, 0], "fargs": [], "inputs": [tens(t)],
                      "outputs": [], "error": "DT_ERR_INVALID_ARG", "rtol": 0.0, "atol": 0.0})

# ---- prod (appended last: the cases above keep their random draws). iargs [keepdim, dim]: at most
#      one dim, as torch.prod (none: every element; keepdim then keeps every dim as 1, which
#      torch.prod(x) cannot say: its result reshaped). Zeros: one in a row along dim 2, two in
#      another (gradients: the product of the others; torch's prod_backward takes exclusive
#      products wherever the tensor holds a zero). i32 / i64 give i64, wrapping past 2^63;
#      bf16 / f16: torch 1.13 has no CPU kernel, the f32 result rounded once.
pr = rnd(4, 6, 5, lo=-1.6, hi=1.6)
pr[0, 1, 2] = 0.0  # one zero along dims 2, 1 and 0
pr[1, 2, 1], pr[1, 2, 3] = 0.0, 0.0  # two zeros along dim 2
case("prod_dim2", "prod", [pr], torch.prod(pr, 2), iargs=[0, 2])
case("prod_dim1_keep", "prod", [pr], torch.prod(pr, 1, keepdim=True), iargs=[1, 1])
case("prod_dim0_neg", "prod", [pr], torch.prod(pr, -3), iargs=[0, -3])
pn = rnd(3, 4, lo=0.5, hi=1.5) * torch.tensor([1.0, -1.0, 1.0, -1.0])  # no zero: g out / x
case("prod_nozero_dim1", "prod", [pn], torch.prod(pn, 1), iargs=[0, 1])
case("prod_all", "prod", [pn], torch.prod(pn), iargs=[0])
case("prod_all_keep", "prod", [pn], torch.prod(pn).reshape(1, 1), iargs=[1])
pz = pn.clone()
pz[1, 2] = 0.0
case("prod_all_one_zero", "prod", [pz], torch.prod(pz), iargs=[0])
pi = torch.tensor([[12345, -67890, 99999, 123457, 555555], [3, -1, 4, 1, -5],
                   [2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1, 3, 1], [0, 7, -7, 9, 2]],
                  dtype=torch.int64)
case("prod_i64_dim1_wrap", "prod", [pi], torch.prod(pi, 1), iargs=[0, 1], rtol=0.0, atol=0.0)
case("prod_i32_dim1_wrap", "prod", [pi.int()], torch.prod(pi.int(), 1), iargs=[0, 1], rtol=0.0,
     atol=0.0)
case("prod_i32_dim0_keep", "prod", [pi.int()], torch.prod(pi.int(), 0, keepdim=True), iargs=[1, 0],
     rtol=0.0, atol=0.0)
case("prod_i64_all", "prod", [pi[1:2]], torch.prod(pi[1:2]), iargs=[0], rtol=0.0, atol=0.0)
for dt, tag in LOW:
    x = lo(rnd(4, 6, 5, lo=0.5, hi=1.5), dt)
    lcase(f"prod_dim1_{tag}", "prod", dt, [x], lambda t: torch.prod(t, 1), iargs=[0, 1])
    lcase(f"prod_dim2_keep_{tag}", "prod", dt, [x], lambda t: torch.prod(t, 2, keepdim=True),
          iargs=[1, 2])
# ---- bf16 / f16 cumsum over long lines (appended last): PyTorch's CPU kernel sums bf16 and f16 in
#      f32 (at::acc_type) and rounds each output once; a double sum differs by a unit on lines of
#      thousands (and on [-16449536, 1.2109375, -6815744]).
def cumsum_f32(t, dim):  # a sequential f32 scan (torch.cumsum of f32 sums in double)
    t = t.float().movedim(dim, 0)
    out, acc = torch.empty_like(t), torch.zeros_like(t[0])
    for j in range(t.shape[0]):
        acc = acc + t[j]
        out[j] = acc
    return out.movedim(0, dim)

cl = rnd(3, 3000, lo=-100.0, hi=100.0)
for dt, tag in LOW:  # f16: torch 1.13 has no CPU kernel; torch 2.x sums in f32 as bf16
    x = lo(cl, dt)
    fn = (lambda t: torch.cumsum(t, 1)) if dt == BF else (lambda t: cumsum_f32(t, 1))
    lcase(f"cumsum_long_{tag}", "cumsum", dt, [x], fn, iargs=[1], ulps=0,
          mag=float(cl.abs().sum(1).max()), native=dt == BF,
          note=None if dt == BF else "f32 sums rounded once, as torch 2.x's CPU kernel")
cb = torch.tensor([-16449536.0, 1.2109375, -6815744.0]).to(BF)
lcase("cumsum_bf16_f32_sum", "cumsum", BF, [cb], lambda t: torch.cumsum(t, 0), iargs=[0], ulps=0)


# ---- gradients: for every case of a differentiable op, PyTorch's gradient of
#      L = sum(output0 * r) with respect to each float input (r fixed per case)
NO_GRAD = {"cast", "grouped_mm_wgrad", "moe_route",  # not differentiable, or integer input
           "eq", "ne", "lt", "le", "ge", "gt", "argmax", "argmin"}

def torch_op(op, x, ia, fa):
    if op == "mm": return x[0] @ x[1]
    if op == "bmm": return torch.bmm(x[0], x[1])
    if op == "addmm": return torch.addmm(x[0], x[1], x[2], beta=fa[0] if fa else 1.0, alpha=fa[1] if len(fa) > 1 else 1.0)
    if op == "linear": return F.linear(x[0], x[1], x[2])
    if op == "linear_nobias": return F.linear(x[0], x[1])
    if op in ("add", "sub", "mul", "div", "maximum", "minimum"): return getattr(torch, op)(x[0], x[1])
    if op in ("amax", "amin"): return getattr(torch, op)(x[0], dim=tuple(ia[1:]), keepdim=bool(ia[0]))
    if op == "logsumexp":
        return torch.logsumexp(x[0], dim=tuple(ia[1:]) or tuple(range(x[0].ndim)), keepdim=bool(ia[0]))
    if op == "prod":
        if len(ia) > 1:
            return torch.prod(x[0], ia[1], keepdim=bool(ia[0]))
        return torch.prod(x[0]).reshape([1] * x[0].ndim) if ia and ia[0] else torch.prod(x[0])
    if op in ("var", "std"):
        return getattr(torch, op)(x[0], dim=tuple(ia[1:]) or None,
                                  correction=int(fa[0]) if fa else 1, keepdim=bool(ia[0]))
    if op == "where": return torch.where(x[0].bool(), x[1], x[2])
    if op == "masked_fill": return x[0].masked_fill(x[1].bool(), fa[0])
    if op == "topk": return torch.topk(x[0], ia[0], dim=ia[1], largest=bool(ia[2]) if len(ia) > 2 else True)[0]
    if op == "neg": return -x[0]
    if op == "abs": return torch.abs(x[0])
    if op == "clamp":
        lo_, hi_ = (float(v) for v in (list(fa) + ["nan", "nan"])[:2])  # "nan": no bound
        return torch.clamp(x[0], None if math.isnan(lo_) else lo_, None if math.isnan(hi_) else hi_)
    if op == "add_scalar": return x[0] + fa[0]
    if op == "mul_scalar": return x[0] * fa[0]
    if op == "pow": return torch.pow(x[0], fa[0])
    if op in ("exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "sin", "cos", "reciprocal",
              "log1p", "expm1", "floor", "ceil", "trunc", "sign", "erf"): return getattr(torch, op)(x[0])
    if op == "round": return torch.round(x[0], decimals=ia[0]) if ia else torch.round(x[0])
    if op == "gelu": return F.gelu(x[0])
    if op == "silu": return F.silu(x[0])
    if op in ("sum", "mean"):
        dims = ia[1:]
        f = getattr(torch, op)
        return f(x[0], dim=tuple(dims), keepdim=bool(ia[0])) if dims else f(x[0])
    if op == "softmax": return torch.softmax(x[0], ia[0])
    if op == "log_softmax": return torch.log_softmax(x[0], ia[0])
    if op == "layer_norm": return F.layer_norm(x[0], (x[0].shape[-1],), x[1], x[2], fa[0])
    if op == "rms_norm": return x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + fa[0]) * x[1]
    if op == "embedding": return F.embedding(x[1], x[0])
    if op in ("view", "reshape"): return x[0].reshape(ia)
    if op == "flatten": return x[0].flatten(ia[0], ia[1])
    if op == "unflatten": return x[0].unflatten(ia[0], tuple(ia[1:]))
    if op == "unsqueeze": return x[0].unsqueeze(ia[0])
    if op == "squeeze": return x[0].squeeze(ia[0])
    if op == "transpose": return x[0].transpose(ia[0], ia[1])
    if op == "permute": return x[0].permute(*ia)
    if op == "t": return x[0].t()
    if op == "slice":
        idx = [slice(None)] * x[0].ndim
        idx[ia[0]] = slice(ia[1], ia[2], ia[3] if len(ia) > 3 else 1)
        return x[0][tuple(idx)]
    if op == "narrow": return x[0].narrow(ia[0], ia[1], ia[2])
    if op == "cat": return torch.cat(x, ia[0])
    if op == "stack": return torch.stack(x, ia[0] if ia else 0)
    if op == "index_select": return torch.index_select(x[0], ia[0], x[1])
    if op == "expand": return x[0].expand(*ia)
    if op == "tril": return torch.tril(x[0], ia[0] if ia else 0)
    if op == "triu": return torch.triu(x[0], ia[0] if ia else 0)
    if op == "cumsum": return torch.cumsum(x[0], ia[0])
    if op == "sdpa":
        if len(ia) > 1 and ia[1]:
            t = [v.transpose(1, 2) for v in x]
            return sdpa_ref(t[0], t[1], t[2], bool(ia[0]), fa[0] if fa else None).transpose(1, 2)
        return sdpa_ref(x[0], x[1], x[2], bool(ia[0]), fa[0] if fa else None)
    if op == "ring_attention":  # the cases above: equal to sdpa of the stored order
        if ia[2]:
            t = [v.transpose(1, 2) for v in x]
            return sdpa_ref(t[0], t[1], t[2], bool(ia[1])).transpose(1, 2)
        return sdpa_ref(x[0], x[1], x[2], bool(ia[1]))
    if op == "rotary": return rotary_ref(x[0], ia[0], fa[0])
    if op == "cross_entropy":
        return F.cross_entropy(x[0], x[1], reduction=["none", "mean", "sum"][ia[0] if ia else 1])
    if op == "gather": return torch.gather(x[0], ia[0], x[1])
    if op == "scatter_add": return x[0].scatter_add(ia[0], x[1], x[2])
    if op == "grouped_mm": return grouped_ref(x[0], x[1], x[2], bool(ia[0]) if ia else True)
    if op == "index_add": return x[0].index_add(0, x[1], x[2])
    raise KeyError(op)

# bf16 gradients: L = sum(output * r) with r f32 (so dL/doutput is r rounded to bf16, as in
# PyTorch), computed in f32 on the bf16 inputs and rounded once to bf16 (torch 1.13's bf16
# backward kernels include its imprecise gemm). dtensor's backward rounds at every op as PyTorch
# bf16 autograd does: tolerance 2 ulps + 4 ulps of the largest |gradient|. f16: no gradients
# (torch 1.13 has no CPU f16 backward kernels for most ops).
LOW_GRAD_OPS = {"add", "sub", "mul", "div", "maximum", "minimum", "neg", "abs", "clamp", "relu",
                "add_scalar", "mul_scalar", "pow", "exp", "log", "sqrt", "rsqrt", "gelu", "silu", "sigmoid",
                "tanh", "sum", "mean", "amax", "logsumexp", "softmax", "log_softmax", "layer_norm", "rms_norm",
                "mm", "bmm", "addmm", "linear", "embedding", "sdpa", "rotary", "cross_entropy",
                "where", "masked_fill", "gather", "cat", "transpose", "slice", "topk", "sin", "cos",
                "reciprocal", "log1p", "expm1", "expand", "tril", "triu", "cumsum",
                "stack", "index_select", "floor", "ceil", "round", "trunc", "sign", "erf",
                "var", "std", "prod"}

def add_grads(c):
    if "grads" in c or "error" in c:  # type promotion's cases carry their own; errors have none
        return
    if c["outputs"][0]["dtype"] in ("i32", "i64") and c["op"] in ("neg", "sum", "amax", "amin",
                                                                   "where", "masked_fill",
                                                                   "expand", "floor", "ceil",
                                                                   "round", "trunc", "sign", "prod"):
        return  # integer results: no gradient
    if all(t["dtype"] in ("i32", "i64") for t in c["inputs"]):
        return  # integer inputs (logsumexp's promoted to f32): nothing to differentiate
    low = any(t["dtype"] in ("bf16", "f16") for t in c["inputs"])
    if c["op"] in NO_GRAD or (low and (c["op"] not in LOW_GRAD_OPS or
                                       any(t["dtype"] == "f16" for t in c["inputs"]))):
        return
    ins = []
    for t in c["inputs"]:
        dt = torch.int64 if t["dtype"] in ("i64", "i32") else torch.float32
        v = torch.tensor([float(x) for x in t["data"]], dtype=torch.float64).reshape(t["shape"]).to(dt)
        if dt == torch.float32:
            v.requires_grad_(True)
        ins.append(v)
    out = torch_op(c["op"], ins, c["iargs"], c["fargs"])
    want = torch.tensor([float(x) for x in c["outputs"][0]["data"]]).reshape(c["outputs"][0]["shape"])
    if low:
        odt = BF
        assert torch.allclose(out.detach().to(odt).float(), want, rtol=2 ** -5, atol=1e-2), c["name"]
    else:
        assert torch.allclose(out.detach().float(), want, rtol=1e-5, atol=1e-5, equal_nan=True), c["name"]
    n = out.numel()
    r = torch.tensor([0.5 + ((i + 1) * 37 % 101) / 101.0 for i in range(n)]).reshape(out.shape)
    if low:  # dL/doutput: r rounded to the output's dtype
        r = r.to(BF).float()
    (out * r).sum().backward()
    c["grad_weights"] = [float(v) for v in r.flatten().tolist()]
    grads = [None if v.grad is None else (v.grad.to(BF).float() if low else v.grad) for v in ins]
    c["grads"] = [None if g is None else [num(float(x)) for x in g.flatten().tolist()] for g in grads]
    if low:
        gmax = max(float(g.abs().max()) for g in grads if g is not None and g.numel())
        c["grad_tol"] = [2 * ULP[BF], 4 * ULP[BF] * gmax]
        c["grad_ref"] = "f32-round"

assert len({c["name"] for c in CASES}) == len(CASES), "case names must be unique"
for c in CASES:
    add_grads(c)
print(f"{sum(1 for c in CASES if 'grads' in c)} cases with gradients")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops_fixtures.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "generator": "tests/reference/make_fixtures.py",
               "cases": CASES}, f, separators=(",", ":"), allow_nan=False)
print(f"wrote {len(CASES)} cases to {out}")

#!/usr/bin/env python3
"""make_peer_fixtures.py - writes peer_fixtures.json: what PyTorch 2.x's own DTensor does for a set
of redistributions and ops on 4 ranks (gloo, CPU): the placements it ends with, the collectives
its CommDebugMode counts, and every rank's local values. tests/reference/test_peer_fixtures.c
replays each case with dtensor at np 4 (no PyTorch in CI: the JSON file is committed).

  PY=$(tools/peer-env.sh --python) && $PY tests/reference/make_peer_fixtures.py

Meshes: 1-D (4,) and 2-D (2, 2). Every input is given as each rank's local shard (integers stored
as f32, so sums and matmuls are exact in any order): the replay builds the same shards with its
own chunk rule and must get PyTorch's values bit for bit (softmax and mean within the case's
rtol). Cases PyTorch refuses are recorded with its message ("error") and no values. Every case
must behave alike on every rank (a rank-local failure hangs the others: amax over an uneven dim
with an empty shard did); PEER_VERBOSE=1 prints each case per rank to find such a case.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

WORLD = 4
VERBOSE = os.environ.get("PEER_VERBOSE") == "1"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_fixtures.json")
COLL = {  # PyTorch's functional collectives -> dtensor's dt_collective_name
    "all_gather_into_tensor": "all_gather", "all_reduce": "all_reduce",
    "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "scatter": "scatter", "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all"}


def pl_parse(text):
    if text == "R":
        return Replicate()
    if text.startswith("P"):
        return Partial(text[2:-1] if "(" in text else "sum")
    return Shard(int(text[2:-1]))


def pl_text(p):
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return f"P({p.reduce_op})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    return repr(p)


def num(v):
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def flat(t):
    return [num(v) for v in t.detach().reshape(-1).tolist()]


def local_chunk(full, mesh, placements):
    """This rank's shard of `full` for Shard/Replicate dims (torch.chunk rule, mesh-dim order);
    Partial dims hold rank-dependent integer operands (see partial_operand)."""
    t = full
    coord = mesh.get_coordinate()
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            parts = torch.chunk(t, mesh.size(i), dim=p.dim)
            if coord[i] < len(parts):
                t = parts[coord[i]]
            else:
                shape = list(t.shape)
                shape[p.dim] = 0
                t = t.new_zeros(shape)
    lin = 0
    for i, p in enumerate(placements):
        if isinstance(p, Partial):
            lin = lin * mesh.size(i) + coord[i] + 1
    if lin:  # a pending sum: each rank holds a different integer operand
        idx = torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape)
        t = t + torch.remainder(idx * lin + 3 * lin, 7.0) - 3.0
    return t.contiguous().clone()


def base_tensor(shape, salt=0):
    n = 1
    for s in shape:
        n *= s
    return (torch.remainder(torch.arange(n, dtype=torch.float32) * 5 + salt, 23.0) - 11.0
            ).reshape(shape)


def make_input(mesh, shape, placements, salt=0, scale=1.0):
    local = local_chunk(base_tensor(shape, salt), mesh, placements) * scale
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=torch.empty(shape).stride())


def gather_all(t):
    out = [None] * WORLD
    dist.all_gather_object(out, flat(t))
    return out


def counts(mode):
    c = {}
    for k, v in mode.get_comm_counts().items():
        name = str(k).split(".")[-2] if str(k).endswith(".default") else str(k).split(".")[-1]
        name = COLL.get(name, name)
        c[name] = c.get(name, 0) + int(v)
    return c


# ---- the cases ----------------------------------------------------------------------------------
P1 = ["S(0)", "S(1)", "R", "P(sum)"]


def redistribute_cases():
    cases = []
    for shape in ([8, 4], [7, 5], [3, 2]):  # even, uneven, some ranks empty
        for a in P1:
            for b in P1:
                cases.append(([4], shape, [a], [b]))
    two = [  # (2, 2) mesh: the planner's worked examples, Partial, uneven and empty shards
        ("S(0),S(0)", "S(1),S(1)"), ("S(0),S(1)", "S(0),S(0)"), ("S(0),S(1)", "R,R"),
        ("S(0),S(0)", "R,R"), ("S(0),S(0)", "S(0),R"), ("S(0),S(0)", "R,S(0)"),
        ("R,S(0)", "S(0),S(0)"), ("S(1),S(0)", "S(0),S(1)"), ("S(0),R", "R,S(0)"),
        ("R,R", "S(0),S(1)"), ("R,R", "S(1),S(1)"), ("S(0),S(1)", "S(1),S(0)"),
        ("S(1),S(1)", "S(0),S(0)"), ("S(0),R", "S(1),R"), ("R,S(1)", "R,S(0)"),
        ("P(sum),P(sum)", "R,R"), ("P(sum),P(sum)", "S(0),S(1)"), ("P(sum),P(sum)", "S(0),S(0)"),
        ("P(sum),P(sum)", "P(sum),R"), ("P(sum),P(sum)", "R,P(sum)"), ("P(sum),R", "S(0),R"),
        ("R,P(sum)", "R,S(1)"), ("P(sum),S(0)", "R,R"), ("P(sum),S(1)", "S(0),S(1)"),
        ("S(0),P(sum)", "S(0),R"), ("S(1),P(sum)", "S(1),S(0)"), ("P(sum),S(0)", "S(0),S(0)"),
        ("R,R", "P(sum),R"), ("S(0),R", "P(sum),R"), ("S(0),S(1)", "S(0),P(sum)"),
    ]
    for shape in ([8, 4], [7, 5]):
        for a, b in two:
            cases.append(([2, 2], shape, a.split(","), b.split(",")))
    for a, b in [("S(0),S(1)", "S(1),S(2)"), ("S(1),S(1)", "S(1),S(2)"), ("S(2),S(0)", "S(0),S(2)"),
                 ("S(0),S(0)", "S(1),S(2)"), ("P(sum),S(2)", "S(0),S(1)"), ("S(1),S(2)", "R,R")]:
        cases.append(([2, 2], [4, 6, 5], a.split(","), b.split(",")))
        cases.append(([2, 2], [3, 5, 3], a.split(","), b.split(",")))
    return cases


def op_cases():
    cases = []
    for a in P1:  # mm (8, 4) x (4, 8), every input placement pair on (4,)
        for b in P1:
            cases.append(dict(name=f"mm_{a}_{b}", op="mm", mesh=[4],
                              inputs=[([8, 4], [a]), ([4, 8], [b])], iargs=[]))
    for a, b in [("S(0),S(1)", "R,S(1)"), ("S(0),R", "S(0),S(1)"), ("S(1),S(0)", "S(0),R"),
                 ("P(sum),S(0)", "R,R"), ("S(0),S(1)", "S(0),S(1)")]:
        cases.append(dict(name=f"mm22_{a}_{b}".replace(",", ""), op="mm", mesh=[2, 2],
                          inputs=[([8, 4], a.split(",")), ([4, 8], b.split(","))], iargs=[]))
    for a, b in [("S(0)", "S(0)"), ("S(0)", "S(1)"), ("S(0)", "R"), ("P(sum)", "P(sum)"),
                 ("P(sum)", "R"), ("S(1)", "P(sum)")]:
        cases.append(dict(name=f"add_{a}_{b}", op="add", mesh=[4],
                          inputs=[([8, 6], [a]), ([8, 6], [b])], iargs=[]))
    for a, b in [("S(1)", "S(0)"), ("S(0)", "R")]:
        cases.append(dict(name=f"add_bcast_{a}_{b}", op="add", mesh=[4],
                          inputs=[([8, 6], [a]), ([6], [b])], iargs=[]))
    cases.append(dict(name="add22_S0S1_S1S0", op="add", mesh=[2, 2],
                      inputs=[([7, 5], ["S(0)", "S(1)"]), ([7, 5], ["S(1)", "S(0)"])], iargs=[]))
    for pl, ia in [("S(0)", [0, 0]), ("S(0)", [0, 1]), ("S(1)", []), ("S(1)", [1, 1]),
                   ("P(sum)", [0, 1]), ("R", [0, 0])]:
        cases.append(dict(name=f"sum_{pl}_{'_'.join(map(str, ia)) or 'all'}", op="sum", mesh=[4],
                          inputs=[([8, 6], [pl])], iargs=ia))
    cases.append(dict(name="sum22_S0S1_dim0", op="sum", mesh=[2, 2],
                      inputs=[([7, 5], ["S(0)", "S(1)"])], iargs=[0, 0]))
    for pl, ia in [("S(0)", [0, 0]), ("S(1)", [0, 1])]:
        cases.append(dict(name=f"mean_{pl}_{ia[1]}", op="mean", mesh=[4], inputs=[([8, 6], [pl])],
                          iargs=ia, rtol=1e-6))
    for pl, ia in [("S(1)", [0, 1]), ("S(0)", [0, 1])]:
        # (8, 8): PyTorch's amax fails on the rank whose shard of an uneven dim is empty (8, 6)
        cases.append(dict(name=f"amax_{pl}_{ia[1]}", op="amax", mesh=[4], inputs=[([8, 8], [pl])],
                          iargs=ia))
    for pl, d in [("S(0)", -1), ("S(1)", -1), ("S(1)", 0)]:
        cases.append(dict(name=f"softmax_{pl}_{d}", op="softmax", mesh=[4],
                          inputs=[([8, 6], [pl])], iargs=[d], rtol=1e-6))
    return cases


def torch_op(op, xs, ia):
    if op == "mm":
        return torch.mm(xs[0], xs[1])
    if op == "add":
        return xs[0] + xs[1]
    if op in ("sum", "mean", "amax"):
        dims = ia[1:]
        f = getattr(torch, op)
        if not dims:
            return f(xs[0]) if op != "amax" else f(xs[0], dim=tuple(range(xs[0].ndim)))
        return f(xs[0], dim=tuple(dims), keepdim=bool(ia[0]))
    if op == "softmax":
        return torch.softmax(xs[0], ia[0])
    raise KeyError(op)


def run(rank):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    meshes = {(4,): init_device_mesh("cpu", (4,)), (2, 2): init_device_mesh("cpu", (2, 2))}
    red = []
    for mshape, shape, src, dst in redistribute_cases():
        mesh = meshes[tuple(mshape)]
        sp, dp = [pl_parse(p) for p in src], [pl_parse(p) for p in dst]
        x = make_input(mesh, shape, sp)
        if VERBOSE:
            print(f"[{rank}] {mshape} {shape} {src} -> {dst}", flush=True)
        rec = {"mesh": mshape, "shape": shape, "src": src, "dst": dst,
               "in": gather_all(x.to_local())}
        try:
            with CommDebugMode() as mode:
                y = x.redistribute(mesh, dp)
            rec["comm"] = counts(mode)
            rec["placements"] = [pl_text(p) for p in y.placements]
            rec["out"] = gather_all(y.to_local())
        except Exception as e:  # deterministic: every rank fails alike
            if VERBOSE:
                print(f"[{rank}] error {e}", flush=True)
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        red.append(rec)
    ops = []
    for c in op_cases():
        mesh = meshes[tuple(c["mesh"])]
        if VERBOSE:
            print(f"[{rank}] op {c['name']}", flush=True)
        scale = 0.125 if c["op"] == "softmax" else 1.0  # moderate exponentials (exact in f32)
        xs = [make_input(mesh, shape, [pl_parse(p) for p in pls], salt=7 * k, scale=scale)
              for k, (shape, pls) in enumerate(c["inputs"])]
        rec = {"name": c["name"], "op": c["op"], "mesh": c["mesh"], "iargs": c["iargs"],
               "fargs": [], "rtol": c.get("rtol", 0.0),
               "inputs": [{"shape": s, "placements": p, "local": gather_all(x.to_local())}
                          for (s, p), x in zip(c["inputs"], xs)]}
        try:
            with CommDebugMode() as mode:
                y = torch_op(c["op"], xs, c["iargs"])
            rec["comm"] = counts(mode)
            rec["placements"] = [pl_text(p) for p in y.placements]
            rec["out_shape"] = list(y.shape)
            rec["out"] = gather_all(y.to_local())
            rec["full"] = flat(y.full_tensor())
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            if VERBOSE:
                print(f"[{rank}] error {e}", flush=True)
        ops.append(rec)
    if rank == 0:
        with open(OUT, "w") as f:
            json.dump({"torch": torch.__version__,
                       "generator": "tests/reference/make_peer_fixtures.py",
                       "backend": "gloo", "world": WORLD, "redistribute": red, "ops": ops}, f,
                      separators=(",", ":"))
        nerr = sum(1 for r in red if "error" in r)
        print(f"wrote {OUT}: {len(red)} redistributions ({nerr} refused by PyTorch), "
              f"{len(ops)} ops, {os.path.getsize(OUT)} bytes, torch {torch.__version__}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
    sys.exit(0)

#!/usr/bin/env python3
"""make_peer_train_fixture.py - writes peer_train_fixture.json: 20 AdamW steps of the small
Llama-style decoder of src/nn/llama.c in PyTorch 2.x, on one process, under FSDP2 (fully_shard on
each block and the root) and under tensor parallelism (parallelize_module, Megatron-style) on 2
gloo ranks, for tests/reference/test_peer_train.c to replay with dtensor at np 2.

  PY=$(tools/peer-env.sh --python) && $PY tests/reference/make_peer_train_fixture.py

The initial weights are those of train_fixture.json (tests/reference/make_train_fixture.py,
Debian's torch 1.13; that script trains at import, so its data is reused rather than its code),
and its three batches are the first three here: the single-process losses of steps 0-2 must equal
its recorded ones (checked below), which ties this module port to that reference. The other 17
batches come from a fixed generator and are written to the fixture. Same recipe as
make_train_fixture.py: RMSNorm eps 1e-5, grouped-query causal attention with interleaved rotary
(theta 10000), SwiGLU, untied output, mean cross-entropy; AdamW (lr 1e-2 constant, betas
0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only), clipping at 1.0. f32 throughout.
Tensor parallel plan: wq, wk, wv, w1, w3 colwise; wo, w2 rowwise; tok_emb rowwise (vocabulary);
output colwise with its logits gathered (Replicate); the norms replicated.
"""
import datetime
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "peer_train_fixture.json")
BASE = json.load(open(os.path.join(HERE, "train_fixture.json")))
CFG = BASE["config"]
B, S, STEPS, LR, WORLD = BASE["batch"], BASE["seq"], 20, BASE["lr"], 2
D, H, KV, V, FF = CFG["dim"], CFG["n_heads"], CFG["n_kv_heads"], CFG["vocab"], CFG["ffn_dim"]
DH = D // H


def batches():
    out = [(b["tokens"], b["targets"]) for b in BASE["batches"]]
    g = torch.Generator().manual_seed(2111)
    while len(out) < STEPS:
        out.append((torch.randint(0, V, (B * S,), generator=g).tolist(),
                    torch.randint(0, V, (B * S,), generator=g).tolist()))
    return out


def rms(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g


def rotary(x):  # x (B, S, heads, DH), interleaved pairs, positions along dim 1
    freqs = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))
    ang = torch.outer(torch.arange(x.shape[1], dtype=torch.float64), freqs)
    c = torch.cos(ang)[None, :, None, :].float()
    s = torch.sin(ang)[None, :, None, :].float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


def lin(o, i):
    return nn.Linear(i, o, bias=False)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(D))
        self.wq, self.wk = lin(H * DH, D), lin(KV * DH, D)
        self.wv, self.wo = lin(KV * DH, D), lin(D, H * DH)
        self.ffn_norm = nn.Parameter(torch.ones(D))
        self.w1, self.w3, self.w2 = lin(FF, D), lin(FF, D), lin(D, FF)

    def forward(self, h):
        b, s = h.shape[0], h.shape[1]
        a = rms(h, self.attn_norm)
        # -1 heads: under tensor parallelism each rank holds a slice of the heads
        q = rotary(self.wq(a).view(b, s, -1, DH)).transpose(1, 2)
        k = rotary(self.wk(a).view(b, s, -1, DH)).transpose(1, 2)
        v = self.wv(a).view(b, s, -1, DH).transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        sc = (q @ k.transpose(-1, -2)) / math.sqrt(DH)
        sc = sc.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        o = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(b, s, -1)
        h = h + self.wo(o)
        m = rms(h, self.ffn_norm)
        return h + self.w2(F.silu(self.w1(m)) * self.w3(m))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Block() for _ in range(CFG["n_layers"])])
        self.norm = nn.Parameter(torch.ones(D))
        self.output = lin(V, D)
        with torch.no_grad():  # the weights of train_fixture.json, by its names
            for name, p in self.named_parameters():
                key = name.replace(".weight", "")
                e = BASE["params"][key]
                p.copy_(torch.tensor(e["data"], dtype=torch.float32).reshape(e["shape"]))

    def forward(self, tok, tgt):
        h = self.tok_emb(tok)
        for blk in self.layers:
            h = blk(h)
        logits = self.output(rms(h, self.norm))
        return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(model, rows, log):
    """20 steps; rows: which batch rows this rank computes; log(step, local loss) -> loss."""
    params = list(model.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses, norms = [], []
    for step, (tok, tgt) in enumerate(batches()):
        tok = torch.tensor(tok).reshape(B, S)[rows]
        tgt = torch.tensor(tgt).reshape(B, S)[rows]
        opt.zero_grad()
        loss = model(tok, tgt)
        loss.backward()
        # clipping as torch.nn.utils.clip_grad_norm_, on the full gradients (DTensor or not)
        total = math.sqrt(sum(float(full(p.grad).double().pow(2).sum()) for p in params))
        coef = min(1.0, 1.0 / (total + 1e-6))
        with torch.no_grad():
            for p in params:
                p.grad.mul_(coef)
        opt.step()
        losses.append(log(float(loss.detach())))
        norms.append(total)
    return losses, norms


def run(rank, mode, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29571" if mode == "fsdp" else "29572"
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (WORLD,))
    model = Llama()
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.layers:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        rows = slice(rank * (B // WORLD), (rank + 1) * (B // WORLD))  # the batch split over dp

        def log(v):  # every rank's mean over its rows; equal rows per rank: the global mean
            t = torch.tensor([v], dtype=torch.float64)
            dist.all_reduce(t)
            return float(t) / WORLD
    else:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate()),
                "output": ColwiseParallel(output_layouts=Replicate())}
        for i in range(CFG["n_layers"]):
            for n in ("wq", "wk", "wv", "w1", "w3"):
                plan[f"layers.{i}.{n}"] = ColwiseParallel()
            for n in ("wo", "w2"):
                plan[f"layers.{i}.{n}"] = RowwiseParallel()
        parallelize_module(model, mesh, plan)
        rows = slice(0, B)

        def log(v):
            return v
    losses, norms = train(model, rows, log)
    if rank == 0:
        q.put((losses, norms))
    dist.barrier()
    dist.destroy_process_group()


def main():
    torch.set_num_threads(1)
    single, single_norms = train(Llama(), slice(0, B), lambda v: v)
    for s in range(len(BASE["steps"])):  # the port reproduces the torch 1.13 reference
        want = BASE["steps"][s]["loss"]
        assert abs(single[s] - want) <= 2e-6 * abs(want), (s, single[s], want)
    res = {"single": single}
    ctx = mp.get_context("spawn")
    for mode in ("fsdp", "tp"):
        q = ctx.Queue()
        mp.spawn(run, args=(mode, q), nprocs=WORLD, join=True)
        res[mode], _ = q.get()
    with open(OUT, "w") as f:
        json.dump({"torch": torch.__version__,
                   "generator": "tests/reference/make_peer_train_fixture.py",
                   "params_from": "train_fixture.json", "config": CFG, "batch": B, "seq": S,
                   "lr": LR, "world": WORLD, "steps": STEPS,
                   "batches": [{"tokens": t, "targets": g} for t, g in batches()],
                   "grad_norm_single": single_norms,
                   "loss": res}, f, separators=(",", ":"))
    for mode in ("single", "fsdp", "tp"):
        l = res[mode]
        worst = max(abs(a - b) / abs(b) for a, b in zip(l, single))
        print(f"{mode:6s} losses {l[0]:.6f} .. {l[-1]:.6f}; worst relative to single {worst:.2e}")
    print(f"wrote {OUT} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
    sys.exit(0)

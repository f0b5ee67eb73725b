#!/usr/bin/python3
"""fsdp_torch.py - the PyTorch side of bench_fsdp: bench_train's Llama-style model (the one in
bench/train_torch.py) wrapped in torch.nn.parallel.DistributedDataParallel over gloo, the same
per-rank batch and optimizer (AdamW, clipping at 1), one thread per rank. Launched with mpirun:
the rank and world size come from Open MPI's environment.

  mpirun -np 2 /usr/bin/python3 bench/fsdp_torch.py --dim 256 --layers 10 --heads 8 \
      --vocab 4096 --ffn 688 --batch 8 --seq 128 --steps 6 [--port 29517]

(torch 1.13's FSDP does not import under Debian's Python 3.11, see the shared environment
notes, so DDP is the peer.) This is bench/fsdp.sh's fallback for Debian's torch 1.13: with the
PyTorch 2.x peer of tools/peer-env.sh, fsdp.sh and bench/peer.sh run bench/peer_train.py (DDP and
FSDP2) instead. Step time is the slowest rank's, each step starting after a barrier;
step 0 is a warmup. Rank 0 prints per-step times and a last line
  result parallel=torch_ddp np=<n> params=<count> step_ms=<best> median_ms=<median> tokens_per_s=<x>
with tokens_per_s = global tokens per step (batch x seq x np) / best step time.
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

ap = argparse.ArgumentParser()
for k, v in dict(dim=256, layers=10, heads=8, vocab=4096, ffn=688, batch=8, seq=128, steps=6,
                 port=29517).items():
    ap.add_argument("--" + k, type=int, default=v)
a = ap.parse_args()
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                        world_size=world)
torch.manual_seed(0)
D, H, V, FF, B, S, L = a.dim, a.heads, a.vocab, a.ffn, a.batch, a.seq, a.layers
DH = D // H


class Llama(torch.nn.Module):
    """The model of bench/train_torch.py as a module (parameter names with '_' for '.')."""

    def __init__(self):
        super().__init__()
        P = {"tok_emb": torch.randn(V, D) * 0.02, "norm": torch.ones(D),
             "output": torch.randn(V, D) * 0.02}
        for l in range(L):
            for n, shp in (("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)), ("wo", (D, D)),
                           ("w1", (FF, D)), ("w3", (FF, D)), ("w2", (D, FF))):
                P[f"layers_{l}_{n}"] = torch.randn(*shp) * 0.02
            P[f"layers_{l}_attn_norm"] = torch.ones(D)
            P[f"layers_{l}_ffn_norm"] = torch.ones(D)
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in P.items()})
        freqs = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))
        ang = torch.outer(torch.arange(S, dtype=torch.float64), freqs)
        self.cos = torch.cos(ang)[None, :, None, :].float()
        self.sin = torch.sin(ang)[None, :, None, :].float()
        self.mask = ~torch.ones(S, S, dtype=torch.bool).tril()

    def rotary(self, x):
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * self.cos - x1 * self.sin, x0 * self.sin + x1 * self.cos],
                           dim=-1).flatten(-2)

    def forward(self, tok, tgt):
        P = self.p

        def rms(x, g):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

        h = F.embedding(tok, P["tok_emb"])
        for l in range(L):
            p = f"layers_{l}_"
            x = rms(h, P[p + "attn_norm"])
            q = self.rotary((x @ P[p + "wq"].t()).view(B, S, H, DH)).transpose(1, 2)
            k = self.rotary((x @ P[p + "wk"].t()).view(B, S, H, DH)).transpose(1, 2)
            v = (x @ P[p + "wv"].t()).view(B, S, H, DH).transpose(1, 2)
            sc = ((q @ k.transpose(-1, -2)) / math.sqrt(DH)).masked_fill(self.mask, float("-inf"))
            o = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(B, S, D)
            h = h + o @ P[p + "wo"].t()
            m = rms(h, P[p + "ffn_norm"])
            h = h + (F.silu(m @ P[p + "w1"].t()) * (m @ P[p + "w3"].t())) @ P[p + "w2"].t()
        logits = rms(h, P["norm"]) @ P["output"].t()
        return F.cross_entropy(logits.reshape(B * S, V), tgt.reshape(B * S))


model = Llama()
nparam = sum(v.numel() for v in model.parameters())
ddp = torch.nn.parallel.DistributedDataParallel(model)
params = list(model.parameters())
opt = torch.optim.AdamW([{"params": [v for v in params if v.ndim >= 2], "weight_decay": 0.1},
                         {"params": [v for v in params if v.ndim < 2], "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
gen = torch.Generator().manual_seed(1000 + rank)
times = []
for step in range(a.steps):
    tok = torch.randint(0, V, (B, S), generator=gen)
    tgt = torch.randint(0, V, (B, S), generator=gen)
    dist.barrier()
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = ddp(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    dt = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    times.append(float(dt))
    if rank == 0:
        print(f"step {step} loss {float(loss):.4f} time {float(dt):.1f} ms", flush=True)
if rank == 0:
    steady = sorted(times[1:])
    best, median = steady[0], steady[(len(steady) - 1) // 2]
    print(f"# torch {torch.__version__}, gloo, {nparam} parameters, 1 thread per rank")
    print(f"result parallel=torch_ddp np={world} params={nparam} step_ms={best:.1f} "
          f"median_ms={median:.1f} tokens_per_s={B * S * world / (best * 1e-3):.1f}")
dist.destroy_process_group()

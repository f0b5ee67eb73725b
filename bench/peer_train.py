"""peer_train.py - the PyTorch 2.x side of the peer training benchmarks (bench/peer.sh): the
Llama-style model of bench_train / examples/train (the one in bench/fsdp_torch.py, written as
modules so FSDP2 and tensor parallelism can wrap its blocks) trained on the CPU over gloo, one
step = forward, backward, clipping at 1, AdamW, zeroing, as ours does.

  torchrun --standalone --nproc_per_node 2 bench/peer_train.py --parallel ddp|fsdp|tp \
      [--dim 256 --layers 10 --heads 8 --vocab 4096 --ffn 688 --batch 8 --seq 128 --steps 5]
      [--threads 1] [--skip 1]

  ddp   torch.nn.parallel.DistributedDataParallel; batch x seq tokens per rank (different data)
  fsdp  FSDP2: fully_shard on every block (reshard after forward, but the last block keeps its
        parameters for the backward), then on the root: torchtitan's wrapping, as bench_fsdp's
  tp    parallelize_module with torchtitan's Llama plan, sequence parallel: ColwiseParallel wq,
        wk, wv, w1, w3; RowwiseParallel wo, w2 (output Shard(1)); SequenceParallel norms;
        the embedding RowwiseParallel (output Shard(1)); the output projection ColwiseParallel
        (input Shard(1), logits Replicate: no loss parallelism). Every rank sees the same
        batch x seq tokens (examples/train --tp N --sp).

Also works launched by mpirun (rank and size from Open MPI's environment; then --port). Step time
is the slowest rank's, each step starting after a barrier; the first --skip steps are warmup.
Rank 0 prints per-step times and a last line
  result parallel=torch_<p> np=<n> params=<count> step_ms=<best> median_ms=<median>
         tokens_per_s=<x> rss_mib=<largest peak RSS over ranks> threads=<t>
with tokens_per_s = tokens per step over the job (ddp/fsdp: batch x seq x np; tp: batch x seq) /
best step time.
"""
import argparse
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--parallel", choices=("ddp", "fsdp", "tp"), default="fsdp")
for k, v in dict(dim=256, layers=10, heads=8, vocab=4096, ffn=688, batch=8, seq=128, steps=5,
                 threads=1, skip=1, port=29517).items():
    ap.add_argument("--" + k, type=int, default=v)
a = ap.parse_args()
if "RANK" in os.environ:  # torchrun
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
else:  # mpirun
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=world)
torch.set_num_threads(a.threads)
torch.manual_seed(0)
D, H, V, FF, B, S, L = a.dim, a.heads, a.vocab, a.ffn, a.batch, a.seq, a.layers
DH = D // H


def rotary_tables():
    freqs = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))
    ang = torch.outer(torch.arange(S, dtype=torch.float64), freqs)
    return torch.cos(ang)[None, :, None, :].float(), torch.sin(ang)[None, :, None, :].float()


COS, SIN = rotary_tables()
MASK = ~torch.ones(S, S, dtype=torch.bool).tril()


def rotary(x):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * COS - x1 * SIN, x0 * SIN + x1 * COS], dim=-1).flatten(-2)


def linear(n_in, n_out):
    m = nn.Linear(n_in, n_out, bias=False)
    nn.init.normal_(m.weight, std=0.02)
    return m


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = linear(D, D), linear(D, D), linear(D, D), linear(D, D)

    def forward(self, x):
        # -1 heads: under tensor parallelism each rank holds heads / t of them
        q = rotary(self.wq(x).view(B, S, -1, DH)).transpose(1, 2)
        k = rotary(self.wk(x).view(B, S, -1, DH)).transpose(1, 2)
        v = self.wv(x).view(B, S, -1, DH).transpose(1, 2)
        sc = ((q @ k.transpose(-1, -2)) / math.sqrt(DH)).masked_fill(MASK, float("-inf"))
        o = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(B, S, -1)
        return self.wo(o)


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3, self.w2 = linear(D, FF), linear(D, FF), linear(FF, D)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(D, eps=1e-5), nn.RMSNorm(D, eps=1e-5)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, h):
        h = h + self.attention(self.attention_norm(h))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(V, D)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        self.layers = nn.ModuleList(Block() for _ in range(L))
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.output = linear(D, V)

    def forward(self, tok, tgt):
        h = self.tok_emb(tok)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.reshape(B * S, V), tgt.reshape(B * S))


model = Llama()
nparam = sum(v.numel() for v in model.parameters())
if a.parallel == "ddp":
    step_model = torch.nn.parallel.DistributedDataParallel(model)
elif a.parallel == "fsdp":
    from torch.distributed.fsdp import fully_shard

    for i, layer in enumerate(model.layers):
        fully_shard(layer, reshard_after_forward=i < L - 1)
    fully_shard(model)
    step_model = model
else:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for layer in model.layers:
        parallelize_module(layer, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    step_model = model

params = list(model.parameters())
opt = torch.optim.AdamW([{"params": [v for v in params if v.ndim >= 2], "weight_decay": 0.1},
                         {"params": [v for v in params if v.ndim < 2], "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
# tp: every rank of the tensor-parallel group sees the same tokens
gen = torch.Generator().manual_seed(1000 + (0 if a.parallel == "tp" else rank))
times = []
for step in range(a.steps):
    tok = torch.randint(0, V, (B, S), generator=gen)
    tgt = torch.randint(0, V, (B, S), generator=gen)
    dist.barrier()
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = step_model(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    dt = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    times.append(float(dt))
    if rank == 0:
        print(f"step {step} loss {float(loss):.4f} time {float(dt):.1f} ms", flush=True)
rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0],
                   dtype=torch.float64)
dist.all_reduce(rss, op=dist.ReduceOp.MAX)
if rank == 0:
    steady = sorted(times[a.skip:])
    best, median = steady[0], steady[(len(steady) - 1) // 2]
    tokens = B * S * (1 if a.parallel == "tp" else world)
    print(f"# torch {torch.__version__}, gloo, {nparam} parameters, {a.threads} thread(s) per rank")
    print(f"result parallel=torch_{a.parallel} np={world} params={nparam} step_ms={best:.1f} "
          f"median_ms={median:.1f} tokens_per_s={tokens / (best * 1e-3):.1f} "
          f"rss_mib={float(rss):.0f} threads={a.threads}")
# Leave without tearing gloo down: its teardown has aborted now and then on this loaded machine
# ("terminate called without an active exception", after every result was printed).
dist.barrier()
sys.stdout.flush()
os._exit(0)

"""peer_redistribute.py - the PyTorch 2.x side of the peer redistribution benchmark
(bench/peer.sh): every transition bench_redistribute measures, as DTensor.redistribute over gloo
(TCP loopback) on the same shapes and placements.

  torchrun --standalone --nproc_per_node 2 bench/peer_redistribute.py [-b 4096] [-e 16777216]
      [-f 16] [-r 3] [-w 2] [--threads 1]

On a 1-D mesh of all ranks, for each case and each full-tensor size S bytes (f32, shape
(S/1024, 256), sizes b, b*f, ... up to e): S0->R, P->R, P->S0, S0->S1, S1->R. A measurement is
ITERS calls of x.redistribute(mesh, [dst]) after a barrier (ITERS = max(3, min(200, 2e8 / S)), as
bench_redistribute), averaged, max over ranks; the minimum of ROUNDS measurements is reported,
after WARMUP calls. PyTorch's redistribute returns a new tensor (allocated per call); ours in
bench_redistribute writes into a preallocated one (dt_tensor_redistribute_into). Each result is
checked once against the expected values. Prints one line per row:
  case=<c> bytes=<S> us=<time> threads=<t>
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

ap = argparse.ArgumentParser()
ap.add_argument("-b", type=int, default=4096)
ap.add_argument("-e", type=int, default=16 << 20)
ap.add_argument("-f", type=int, default=16)
ap.add_argument("-r", type=int, default=3)
ap.add_argument("-w", type=int, default=2)
ap.add_argument("-k", default="S0->R,P->R,P->S0,S0->S1,S1->R")
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (n,))
COLS = 256
CASES = {"S0->R": (Shard(0), Replicate()), "P->R": (Partial(), Replicate()),
         "P->S0": (Partial(), Shard(0)), "S0->S1": (Shard(0), Shard(1)),
         "S1->R": (Shard(1), Replicate())}


def make(full, src):
    """The DTensor of placement src whose full value is `full` (Partial: each rank holds
    full / n, exact for these small integers when n is a power of two)."""
    if isinstance(src, Partial):
        return DTensor.from_local(full / n, mesh, [src], run_check=False)
    rows = full.shape[0] // n
    local = full[rank * rows:(rank + 1) * rows] if src == Shard(0) else \
        full[:, rank * (COLS // n):(rank + 1) * (COLS // n)]
    return DTensor.from_local(local.contiguous(), mesh, [src], run_check=False)


def max_over_ranks(t):
    v = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return float(v)


if rank == 0:
    print(f"# torch {torch.__version__}, gloo, {n} ranks, {a.threads} thread(s) per rank")
for name in a.k.split(","):
    src, dst = CASES[name]
    size = a.b
    while size <= a.e:
        numel = size // 4
        rows = numel // COLS
        full = (torch.arange(numel, dtype=torch.int64) * 7 % 251).float().reshape(rows, COLS)
        x = make(full, src)
        for _ in range(a.w):
            y = x.redistribute(mesh, [dst])
        assert torch.equal(y.full_tensor(), full), f"{name} {size}: wrong result"
        iters = int(max(3, min(200, 2e8 / size)))
        best = float("inf")
        for _ in range(a.r):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                y = x.redistribute(mesh, [dst])
            best = min(best, max_over_ranks((time.perf_counter() - t0) / iters))
        if rank == 0:
            print(f"case={name} bytes={size} us={best * 1e6:.1f} threads={a.threads}", flush=True)
        size *= a.f
# Leave without tearing gloo down: its teardown has aborted now and then on this loaded machine
# ("terminate called without an active exception", after every result was printed).
dist.barrier()
sys.stdout.flush()
os._exit(0)

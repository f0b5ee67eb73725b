"""peer_dispatch.py - the PyTorch 2.x side of the peer dispatch benchmark (bench/peer.sh): the
calls `bench_dispatch --peer` makes, on PyTorch's DTensor over gloo.

  torchrun --standalone --nproc_per_node 2 bench/peer_dispatch.py [--rounds 5] [--threads 1]

On a 1-D mesh of all ranks, `a + a` with a Shard(0) 512x512 f32 DTensor (no communication),
whole call times (the kernel and the output's allocation included):
  hit     the same call repeated: best of ROUNDS runs of 2,000 calls
  miss    a new shape every call, (512, 512 + i) for i < 200 (as ours), mean over the 200, once
  again   the same 200 calls repeated (hits with the misses' memory traffic)
  clear   the 512x512 call after clearing both sharding-propagation caches (the C++ fast path's
          and the Python LRU cache: torch.distributed.tensor.debug._clear_sharding_prop_cache),
          best of ROUNDS runs of 200 calls; includes the clearing (a few microseconds)
Max over ranks. Last line: peer_dispatch np=<n> hit_us=<x> miss_us=<y> again_us=<z>
clear_us=<w> threads=<t>
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
HIT_CALLS, MISS_CALLS = 2000, 200
x = distribute_tensor(torch.randn(512, 512), mesh, [Shard(0)])
miss = [distribute_tensor(torch.randn(512, 512 + i), mesh, [Shard(0)]) for i in range(MISS_CALLS)]


def max_over_ranks(t):
    v = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return float(v)


def timed(fn, calls):
    """Microseconds per call of the slowest rank."""
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    return max_over_ranks((time.perf_counter() - t0) / calls * 1e6)


def clear_then_add(_):
    _clear_sharding_prop_cache()
    return x + x


for _ in range(100):
    x + x
hit = min(timed(lambda i: x + x, HIT_CALLS) for _ in range(a.rounds))
mis = timed(lambda i: miss[i] + miss[i], MISS_CALLS)
again = timed(lambda i: miss[i] + miss[i], MISS_CALLS)
clear = min(timed(clear_then_add, MISS_CALLS) for _ in range(a.rounds))
if rank == 0:
    print(f"# torch {torch.__version__}, gloo, {world} ranks, {a.threads} thread(s) per rank")
    print(f"peer_dispatch np={world} hit_us={hit:.2f} miss_us={mis:.2f} again_us={again:.2f} "
          f"clear_us={clear:.2f} threads={a.threads}")
# Leave without tearing gloo down: its teardown has aborted now and then on this loaded machine
# ("terminate called without an active exception", after every result was printed).
dist.barrier()
sys.stdout.flush()
os._exit(0)

"""peer_checkpoint.py - the PyTorch 2.x side of the peer checkpoint benchmark (bench/peer.sh):
bench_checkpoint's workload (bench/checkpoint.c) saved and loaded with
torch.distributed.checkpoint (DCP) over gloo.

  torchrun --standalone --nproc_per_node 2 bench/peer_checkpoint.py [--mib 256] [--tensors 8]
      [--reps 1] [--warmup 1] [--dir /tmp] [--work-ms W] [--thread-count 1]
      [--single-file-per-rank 1] [--threads 1] [--no-async] [--cached-stager]

K (--tensors) f32 tensors of M (--mib) MiB in all, rows x cols with cols 4096, 2048, 1024, 8192 in
turn (rows a multiple of the world size, as bench_checkpoint's), DTensor Shard(0) on a 1-D
DeviceMesh of all ranks, values torch.rand (seed k + 1). The state dict is {"layers.K.weight":
DTensor}. Files go to DIR/dt_peer_ckpt_<pid of rank 0>/, removed at the end. --warmup
unmeasured rounds (the first one checks the values), then --reps rounds, each:

  save          dcp.save into a new directory with FileSystemWriter(sync_files=True: every data
                file and the metadata fsynced, as ours; thread_count, single_file_per_rank from
                the flags).
  load          dcp.load of it into the same Shard(0) DTensors, pages warm (just written).
  load_evicted  the same after posix_fadvise(POSIX_FADV_DONTNEED) on the files this rank is
                about to read (its data files and .metadata), as bench_checkpoint's "evicted".
  async         dcp.async_save with its default stager (the FileSystemWriter: a blocking copy into
                new CPU tensors in the call, as ours' "copy in save"). Its time until it returns
                is the stall; then W ms of simulated work (--work-ms; default that round's sync
                save time), then the wait on the returned future. On the CPU, 2.11 has no
                stager that keeps its staged copy between saves as ours keeps its staging
                buffer: FileSystemWriter(cache_staged_state_dict=True) pins the cache, which
                raises without CUDA, and DefaultStager drops its cache (and its copy table: a
                second stage() raises KeyError) at the end of every stage. --cached-stager
                stages into a kept, unpinned copy instead (CachedStager below: what the cache
                would do without the pinning; not a DCP setting).
  staged        dcp.async_save with async_stager=DefaultStager(use_async_staging=True, no pinned
                or shared memory, blocking copies: the CPU settings), a new one per save (see
                above): the call returns before the copy; the stall is the call plus
                the wait on staging_completion after W ms of work (ours' "copy deferred": save +
                wait_staged), then the wait on upload_completion.
  reshard       dcp.load of the Shard(0) checkpoint into Shard(1) DTensors (allocated and
                written before), peak extra resident memory: gc.collect(), malloc_trim(0), "5"
                into /proc/self/clear_refs (VmHWM := VmRSS, the baseline), the load, VmHWM -
                baseline; values checked once against the saved ones.

Both async saves run their collectives on a process group of their own (a second gloo group),
so that the main thread's barriers and timing all-reduces cannot interleave with them.
Simulated work: torch.mm of 128x128 f32 matrices in a loop for W ms (one core; the GIL is
released inside each product, as in a training step's kernels); work_frac is the number of
products done beside the background save over the number done undisturbed in the same W ms.
Every time is the slowest rank's (a barrier before, an all-reduce MAX after); memory the largest
rank's. Rank 0 prints one line per measured round,
  peer_checkpoint round=R save_s= load_s= load_evicted_s= async_stall_s= async_wait_s=
      staged_stall_s= staged_wait_s= work_ms= work_frac= work_frac_staged= reshard_s=
      reshard_extra_mib= reshard_ratio= ...
and last a line `result ...` with the medians over the rounds and total_s (save + load +
load_evicted + reshard medians: peer.sh's thread probe key).
"""
import argparse
import ctypes
import gc
import os
import shutil
import signal
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

ap = argparse.ArgumentParser()
ap.add_argument("--mib", type=float, default=256)
ap.add_argument("--tensors", type=int, default=8)
ap.add_argument("--reps", type=int, default=1)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--dir", default="/tmp")
ap.add_argument("--work-ms", type=float, default=0)
ap.add_argument("--thread-count", type=int, default=1)
ap.add_argument("--single-file-per-rank", type=int, default=1)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--no-async", action="store_true", help="skip both async saves")
ap.add_argument("--cached-stager", action="store_true",
                help="async: stage into a kept copy (not a DCP setting on the CPU, see CachedStager)")
a = ap.parse_args()
torch.set_num_threads(a.threads)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
async_pg = dist.new_group(backend="gloo")
libc = ctypes.CDLL("libc.so.6")

COLS = (4096, 2048, 1024, 8192)
per = int(a.mib * (1 << 20) / 4 / a.tensors)
shapes = []
for k in range(a.tensors):
    cols = COLS[k % 4]
    rows = max(per // cols // world * world, world)
    shapes.append((rows, cols))


def full_value(k):
    g = torch.Generator().manual_seed(k + 1)
    return torch.rand(shapes[k], generator=g, dtype=torch.float32)


def name(k):
    return f"layers.{k}.weight"


# Shard(0) sources (loaded back in place) and Shard(1) reshard targets
src, dst = {}, {}
for k in range(a.tensors):
    rows, cols = shapes[k]
    full = full_value(k)
    r0 = rows // world
    src[name(k)] = DTensor.from_local(full[rank * r0:(rank + 1) * r0].clone(), mesh, [Shard(0)],
                                      run_check=False)
    dst[name(k)] = DTensor.from_local(torch.full((rows, cols // world), -1.0), mesh, [Shard(1)],
                                      run_check=False)
    del full
total = sum(r * c * 4 for r, c in shapes)
mine = sum(t.to_local().numel() * 4 for t in src.values())
mine1 = sum(t.to_local().numel() * 4 for t in dst.values())

pid0 = [os.getpid()]
dist.broadcast_object_list(pid0, src=0)
base = os.path.join(a.dir, f"dt_peer_ckpt_{pid0[0]}")
if rank == 0:
    os.makedirs(base)

    def _remove_and_leave(signum, frame):  # torchrun stops the other ranks when one fails
        shutil.rmtree(base, ignore_errors=True)
        os._exit(128 + signum)

    def _remove_and_raise(kind, value, tb):  # an exception on rank 0
        shutil.rmtree(base, ignore_errors=True)
        sys.__excepthook__(kind, value, tb)

    signal.signal(signal.SIGTERM, _remove_and_leave)
    signal.signal(signal.SIGINT, _remove_and_leave)
    sys.excepthook = _remove_and_raise
dist.barrier()


def slowest(x):
    v = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return float(v)


def timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    return slowest(time.perf_counter() - t0), out


def writer(path):
    return FileSystemWriter(path, single_file_per_rank=bool(a.single_file_per_rank),
                            sync_files=True, thread_count=a.thread_count)


def proc_status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def evict(path):
    """posix_fadvise(DONTNEED) on this rank's data files and the metadata of checkpoint `path`"""
    for f in os.listdir(path):
        if f == ".metadata" or f.startswith(f"__{rank}_"):
            fd = os.open(os.path.join(path, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


WA = torch.rand(128, 128)
WB = torch.rand(128, 128)
WC = torch.empty(128, 128)


def work(ms):
    """simulated training: 128x128 products for ms milliseconds; returns how many"""
    end = time.perf_counter() + ms * 1e-3
    n = 0
    while time.perf_counter() < end:
        torch.mm(WA, WB, out=WC)
        n += 1
    return n


def remove(path):
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path)
    dist.barrier()


def check_equal(got, want, what):
    bad = torch.tensor([0 if torch.equal(got, want) else 1])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if int(bad):
        if rank == 0:
            print(f"peer_checkpoint: {what}: the loaded values differ", file=sys.stderr, flush=True)
            shutil.rmtree(base, ignore_errors=True)
        dist.barrier()
        os._exit(1)


class CachedStager(AsyncStager):
    """--cached-stager: what FileSystemWriter(cache_staged_state_dict=True) does, without pinning:
    the staged copy is made once and refreshed in place at every save (as ours keeps its staging
    buffer). Not a DCP setting: 2.11 pins that cache, which raises without CUDA."""
    _synchronize_after_execute = False

    def __init__(self):
        self.cache = None

    def stage(self, state_dict):
        if self.cache is None:
            self.cache = _create_cpu_state_dict(state_dict, pin_memory=False)
        return _copy_state_dict(state_dict, self.cache)

    def synchronize_staging(self):
        pass

    def close(self):
        self.cache = None


cached_stager = CachedStager() if a.cached_stager else None


if rank == 0:
    print(f"# peer_checkpoint: torch {torch.__version__}, gloo, np {world}, {a.tensors} f32 "
          f"tensors, {total / 2**20:.1f} MiB in all, Shard(0) ({mine / 2**20:.1f} MiB per rank), "
          f"dir {base}; FileSystemWriter(sync_files=True, thread_count={a.thread_count}, "
          f"single_file_per_rank={bool(a.single_file_per_rank)}); torch threads {a.threads}; "
          f"{a.warmup} warm-up + {a.reps} rounds", flush=True)
rows_out = []
for r in range(-a.warmup, a.reps):
    v = {}
    path = os.path.join(base, f"sync_{r + a.warmup}")
    v["save_s"], _ = timed(lambda: dcp.save(src, storage_writer=writer(path)))
    if r == -a.warmup:  # the round trip is exact: zero the tensors, load, compare
        for k in range(a.tensors):
            src[name(k)].to_local().zero_()
    v["load_s"], _ = timed(lambda: dcp.load(src, storage_reader=FileSystemReader(path)))
    if r == -a.warmup:
        for k in range(a.tensors):
            rows = shapes[k][0] // world
            check_equal(src[name(k)].to_local(), full_value(k)[rank * rows:(rank + 1) * rows],
                        f"load {name(k)}")
    evict(path)
    v["load_evicted_s"], _ = timed(lambda: dcp.load(src, storage_reader=FileSystemReader(path)))
    wms = a.work_ms if a.work_ms > 0 else v["save_s"] * 1e3
    v["work_ms"] = wms
    if not a.no_async:
        # async, the copy in the call (default: the writer stages into new tensors)
        apath = os.path.join(base, f"async_{r + a.warmup}")
        dist.barrier()
        undisturbed = work(wms)
        v["async_stall_s"], fut = timed(
            lambda: dcp.async_save(src, checkpoint_id=apath, storage_writer=writer(apath),
                                   async_stager=cached_stager, process_group=async_pg))
        beside = work(wms)
        v["async_wait_s"], _ = timed(fut.result)
        v["work_frac"] = -slowest(-(beside / max(undisturbed, 1)))
        remove(apath)
        # async, the copy on a staging thread (DefaultStager), waited for after the work
        spath = os.path.join(base, f"staged_{r + a.warmup}")
        dist.barrier()
        stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                              use_async_staging=True, use_non_blocking_copy=False))
        t0 = time.perf_counter()
        resp = dcp.async_save(src, checkpoint_id=spath, storage_writer=writer(spath),
                              async_stager=stager, process_group=async_pg)
        stall = time.perf_counter() - t0
        beside = work(wms)
        t0 = time.perf_counter()
        resp.staging_completion.result()
        stall += time.perf_counter() - t0
        v["staged_stall_s"] = slowest(stall)
        v["staged_wait_s"], _ = timed(resp.upload_completion.result)
        stager.close()
        v["work_frac_staged"] = -slowest(-(beside / max(undisturbed, 1)))
        remove(spath)
    # reshard Shard(0) -> Shard(1), peak extra resident memory
    gc.collect()
    libc.malloc_trim(0)
    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss0 = proc_status("VmRSS")
    t0 = time.perf_counter()
    dcp.load(dst, storage_reader=FileSystemReader(path))
    tl = time.perf_counter() - t0
    extra = proc_status("VmHWM") - rss0
    v["reshard_s"] = slowest(tl)
    v["reshard_extra_mib"] = slowest(extra / 2**20)
    v["reshard_ratio"] = slowest(extra / mine1)
    if r == -a.warmup:
        for k in range(a.tensors):
            c1 = shapes[k][1] // world
            check_equal(dst[name(k)].to_local(), full_value(k)[:, rank * c1:(rank + 1) * c1],
                        f"reshard {name(k)}")
        for k in range(a.tensors):
            dst[name(k)].to_local().fill_(-1.0)
    remove(path)
    if r < 0:
        continue
    rows_out.append(v)
    if rank == 0:
        print(f"peer_checkpoint round={r} " + " ".join(
            f"{key}={val:.4f}" for key, val in v.items()) +
              f" threads={a.threads} thread_count={a.thread_count} "
              f"single_file={a.single_file_per_rank}", flush=True)

if rank == 0:
    shutil.rmtree(base, ignore_errors=True)
    med = {key: statistics.median(x[key] for x in rows_out) for key in rows_out[0]}
    med["total_s"] = med["save_s"] + med["load_s"] + med["load_evicted_s"] + med["reshard_s"]
    print("result " + " ".join(f"{key}={val:.4f}" for key, val in med.items()) +
          f" threads={a.threads} thread_count={a.thread_count} single_file={a.single_file_per_rank}"
          f" np={world} mib={a.mib:g}", flush=True)
# Leave without tearing gloo down: its teardown has aborted now and then on this loaded machine
# ("terminate called without an active exception", after every result was printed).
dist.barrier()
sys.stdout.flush()
os._exit(0)

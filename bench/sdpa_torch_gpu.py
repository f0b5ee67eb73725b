#!/usr/bin/env python3
"""sdpa_torch_gpu.py - PyTorch's peer of `bench_gpu --attention`: causal scaled dot-product
attention in bf16 (torch.nn.functional.scaled_dot_product_attention, the backend PyTorch picks:
flash attention on an H100/H200) on the same two shapes (~125M: B 8, S 1024, 14 heads of 64;
~1B: B 4, S 1024, 16 heads of 128), forward and backward (the gradients of q, k and v from a
given dO), ms per call: median of 5 rounds of 10 calls, timed with CUDA events.

  python3 bench/sdpa_torch_gpu.py

Last line: `torch_attention fwd_ms_125M= bwd_ms_125M= fwd_ms_1B= bwd_ms_1B= torch=<version>`.
"""
import statistics

import torch
import torch.nn.functional as F

dev = torch.device("cuda")
torch.manual_seed(0)


def timed(fn):
    ms = []
    fn()  # warm-up
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        end.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(end) / 10)
    return statistics.median(ms)


out = {}
for name, B, S, H, D in (("125M", 8, 1024, 14, 64), ("1B", 4, 1024, 16, 128)):
    # (B, H, S, D): SDPA's layout; ours reads (B, S, H, D) in place
    q, k, v, g = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
        torch.autograd.grad(o, (qr, kr, vr), g)

    f = timed(fwd)
    fb = timed(fwd_bwd)
    out[name] = (f, fb - f)  # the backward alone: forward + backward less the forward
    print(f"torch attention {name} (B {B}, S {S}, {H} heads of {D}, causal, bf16): forward "
          f"{f:.3f} ms, backward {fb - f:.3f} ms (forward + backward {fb:.3f} ms)")
print("torch_attention " + " ".join(f"fwd_ms_{n}={out[n][0]:.3f} bwd_ms_{n}={out[n][1]:.3f}"
                                    for n in out) + f" torch={torch.__version__}")

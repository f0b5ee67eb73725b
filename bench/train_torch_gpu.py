#!/usr/bin/env python3
"""train_torch_gpu.py - the PyTorch peer of `examples/train --device cuda` on one GPU: the same
Llama-style model (src/nn/llama.c: RMSNorm eps 1e-5, rotary theta 10000, SwiGLU, untied output,
no biases), batch, sequence and optimizer (AdamW betas 0.9/0.95, weight decay 0.1 on matrices,
clipping at 1.0), in PyTorch 2.x eager: f32 master weights, bf16 autocast, SDPA attention
(flash where PyTorch picks it), AdamW in its default (foreach) mode.

  python3 bench/train_torch_gpu.py --dim 896 --layers 13 --heads 14 --vocab 256 \\
      --batch 8 --seq 1024 --steps 20

Prints per-step times, then `torch_tokens_per_s=<median of steps 3..> params=<n>
peak_mem_gib=<x> torch=<version> gpu=<name>`. tools/gpu_check.sh runs it beside our trainer.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
for k, v in dict(dim=896, layers=13, heads=14, vocab=256, ffn=0, batch=8, seq=1024,
                 steps=20).items():
    ap.add_argument("--" + k, type=int, default=v)
a = ap.parse_args()
dev = torch.device("cuda")
torch.manual_seed(0)
D, H, V, B, S = a.dim, a.heads, a.vocab, a.batch, a.seq
FF = a.ffn if a.ffn > 0 else ((D * 8 // 3) + 7) // 8 * 8  # llama.c's default
DH = D // H
P = {"tok_emb": torch.randn(V, D) * 0.02, "norm": torch.ones(D),
     "output": torch.randn(V, D) * 0.02}
for l in range(a.layers):
    p = f"layers.{l}."
    for n, shp in (("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)), ("wo", (D, D)),
                   ("w1", (FF, D)), ("w3", (FF, D)), ("w2", (D, FF))):
        P[p + n] = torch.randn(*shp) * 0.02
    P[p + "attn_norm"] = torch.ones(D)
    P[p + "ffn_norm"] = torch.ones(D)
P = {k: v.to(dev).requires_grad_(True) for k, v in P.items()}
freqs = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))
ang = torch.outer(torch.arange(S, dtype=torch.float64), freqs)
COS = torch.cos(ang)[None, None, :, :].float().to(dev)
SIN = torch.sin(ang)[None, None, :, :].float().to(dev)


def rms(x, g):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * g


def rotary(x):  # (B, H, S, DH), pairs (2i, 2i+1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * COS - x1 * SIN, x0 * SIN + x1 * COS], dim=-1).flatten(-2).to(x.dtype)


def forward(tok, tgt):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = F.embedding(tok, P["tok_emb"])
        for l in range(a.layers):
            p = f"layers.{l}."
            x = rms(h, P[p + "attn_norm"])
            q = rotary((x @ P[p + "wq"].t()).view(B, S, H, DH).transpose(1, 2))
            k = rotary((x @ P[p + "wk"].t()).view(B, S, H, DH).transpose(1, 2))
            v = (x @ P[p + "wv"].t()).view(B, S, H, DH).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + o.transpose(1, 2).reshape(B, S, D) @ P[p + "wo"].t()
            m = rms(h, P[p + "ffn_norm"])
            h = h + (F.silu(m @ P[p + "w1"].t()) * (m @ P[p + "w3"].t())) @ P[p + "w2"].t()
        logits = rms(h, P["norm"]) @ P["output"].t()
    return F.cross_entropy(logits.float().reshape(B * S, V), tgt.reshape(B * S))


opt = torch.optim.AdamW([{"params": [v for v in P.values() if v.ndim >= 2], "weight_decay": 0.1},
                         {"params": [v for v in P.values() if v.ndim < 2], "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
nparam = sum(v.numel() for v in P.values())
times = []
for step in range(a.steps):
    tok = torch.randint(0, V, (B, S), device=dev)
    tgt = torch.randint(0, V, (B, S), device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = forward(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
    opt.step()
    lv = float(loss)  # synchronizes, as our trainer reads its loss every step
    dt = time.perf_counter() - t0
    times.append(dt)
    print(f"torch step {step} loss {lv:.4f} time {dt * 1e3:.1f} ms", flush=True)
steady = times[3:] if len(times) > 4 else times[1:]
med = statistics.median(steady)
print(f"torch_tokens_per_s={B * S / med:.1f} params={nparam} "
      f"peak_mem_gib={torch.cuda.max_memory_allocated() / 2**30:.2f} torch={torch.__version__} "
      f"gpu={torch.cuda.get_device_name().replace(' ', '_')} "
      f"spread_ms={min(steady) * 1e3:.1f}..{max(steady) * 1e3:.1f}")

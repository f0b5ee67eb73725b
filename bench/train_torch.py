#!/usr/bin/python3
"""train_torch.py - the PyTorch side of bench_train: the same Llama-style model (src/nn/llama.c,
tests/reference/make_train_fixture.py), batch and optimizer, timed in torch 1.13 on the CPU.

  /usr/bin/python3 bench/train_torch.py --dim 256 --layers 10 --heads 8 --vocab 4096 \
      --ffn 688 --batch 8 --seq 128 --steps 6 --threads 1

Prints per-step times and a last line tokens_per_s=<x> (best step after one warmup step).
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
for k, v in dict(dim=256, layers=10, heads=8, vocab=4096, ffn=688, batch=8, seq=128, steps=6,
                 threads=1).items():
    ap.add_argument("--" + k, type=int, default=v)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
D, H, V, FF, B, S = a.dim, a.heads, a.vocab, a.ffn, a.batch, a.seq
DH = D // H
P = {"tok_emb": torch.randn(V, D) * 0.02, "norm": torch.ones(D), "output": torch.randn(V, D) * 0.02}
for l in range(a.layers):
    p = f"layers.{l}."
    for n, shp in (("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)), ("wo", (D, D)),
                   ("w1", (FF, D)), ("w3", (FF, D)), ("w2", (D, FF))):
        P[p + n] = torch.randn(*shp) * 0.02
    P[p + "attn_norm"] = torch.ones(D)
    P[p + "ffn_norm"] = torch.ones(D)
for v in P.values():
    v.requires_grad_(True)
freqs = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))
ang = torch.outer(torch.arange(S, dtype=torch.float64), freqs)
COS, SIN = torch.cos(ang)[None, :, None, :].float(), torch.sin(ang)[None, :, None, :].float()
MASK = ~torch.ones(S, S, dtype=torch.bool).tril()

def rms(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

def rotary(x):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * COS - x1 * SIN, x0 * SIN + x1 * COS], dim=-1).flatten(-2)

def forward(tok, tgt):
    h = F.embedding(tok, P["tok_emb"])
    for l in range(a.layers):
        p = f"layers.{l}."
        x = rms(h, P[p + "attn_norm"])
        q = rotary((x @ P[p + "wq"].t()).view(B, S, H, DH)).transpose(1, 2)
        k = rotary((x @ P[p + "wk"].t()).view(B, S, H, DH)).transpose(1, 2)
        v = (x @ P[p + "wv"].t()).view(B, S, H, DH).transpose(1, 2)
        sc = ((q @ k.transpose(-1, -2)) / math.sqrt(DH)).masked_fill(MASK, float("-inf"))
        o = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(B, S, D)
        h = h + o @ P[p + "wo"].t()
        m = rms(h, P[p + "ffn_norm"])
        h = h + (F.silu(m @ P[p + "w1"].t()) * (m @ P[p + "w3"].t())) @ P[p + "w2"].t()
    logits = rms(h, P["norm"]) @ P["output"].t()
    return F.cross_entropy(logits.reshape(B * S, V), tgt.reshape(B * S))

opt = torch.optim.AdamW([{"params": [v for v in P.values() if v.ndim >= 2], "weight_decay": 0.1},
                         {"params": [v for v in P.values() if v.ndim < 2], "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
nparam = sum(v.numel() for v in P.values())
best = float("inf")
for step in range(a.steps):
    tok = torch.randint(0, V, (B, S))
    tgt = torch.randint(0, V, (B, S))
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = forward(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
    opt.step()
    dt = time.perf_counter() - t0
    if step > 0:
        best = min(best, dt)
    print(f"torch step {step} loss {float(loss):.4f} time {dt * 1e3:.1f} ms", flush=True)
print(f"torch {torch.__version__}, {nparam} parameters, {a.threads} threads")
print(f"tokens_per_s={B * S / best:.1f}")

#!/usr/bin/python3
"""make_train_fixture.py - writes train_fixture.json: three AdamW training steps of a small
Llama-style decoder in PyTorch (Debian's python3-torch 1.13, CPU), from weights written to the
fixture, for tests/nn/test_train_reference.c to replay with dtensor on any mesh.

  /usr/bin/python3 tests/reference/make_train_fixture.py

The model is the one of src/nn/llama.c: RMSNorm (eps 1e-5), grouped-query causal attention with
interleaved rotary embeddings (theta 10000) on the sequence dim, SwiGLU MLP, untied output
projection, mean cross-entropy; AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices
only), gradient clipping at 1.0. Recorded per step: loss, gradient norm before clipping.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(0)
G = torch.Generator().manual_seed(99)
CFG = dict(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, vocab=16, seq_len=8, ffn_dim=32)
B, S, STEPS, LR = 2, 8, 3, 1e-2
D, H, KV, V, FF = CFG["dim"], CFG["n_heads"], CFG["n_kv_heads"], CFG["vocab"], CFG["ffn_dim"]
DH = D // H

def w(*shape, std=0.2):
    return (torch.randn(*shape, generator=G) * std).float()

params = {"tok_emb": w(V, D)}
for l in range(CFG["n_layers"]):
    p = f"layers.{l}."
    params[p + "attn_norm"] = 1.0 + w(D, std=0.1)
    params[p + "wq"] = w(H * DH, D)
    params[p + "wk"] = w(KV * DH, D)
    params[p + "wv"] = w(KV * DH, D)
    params[p + "wo"] = w(D, H * DH)
    params[p + "ffn_norm"] = 1.0 + w(D, std=0.1)
    params[p + "w1"] = w(FF, D)
    params[p + "w3"] = w(FF, D)
    params[p + "w2"] = w(D, FF)
params["norm"] = 1.0 + w(D, std=0.1)
params["output"] = w(V, D)
init = {k: v.clone() for k, v in params.items()}
for v in params.values():
    v.requires_grad_(True)

def rms(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

def rotary(x):  # x (B, S, heads, DH), interleaved pairs, positions along dim 1
    freqs = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))
    ang = torch.outer(torch.arange(x.shape[1], dtype=torch.float64), freqs)
    c = torch.cos(ang)[None, :, None, :].float()
    s = torch.sin(ang)[None, :, None, :].float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)

def forward(tok, tgt):
    h = F.embedding(tok, params["tok_emb"])
    for l in range(CFG["n_layers"]):
        p = f"layers.{l}."
        a = rms(h, params[p + "attn_norm"])
        q = rotary((a @ params[p + "wq"].t()).view(B, S, H, DH)).transpose(1, 2)
        k = rotary((a @ params[p + "wk"].t()).view(B, S, KV, DH)).transpose(1, 2)
        v = (a @ params[p + "wv"].t()).view(B, S, KV, DH).transpose(1, 2)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        sc = (q @ k.transpose(-1, -2)) / math.sqrt(DH)
        sc = sc.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
        o = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(B, S, H * DH)
        h = h + o @ params[p + "wo"].t()
        m = rms(h, params[p + "ffn_norm"])
        f = (F.silu(m @ params[p + "w1"].t()) * (m @ params[p + "w3"].t())) @ params[p + "w2"].t()
        h = h + f
    logits = rms(h, params["norm"]) @ params["output"].t()
    return F.cross_entropy(logits.reshape(B * S, V), tgt.reshape(B * S))

decay = [v for k, v in params.items() if v.ndim >= 2]
no_decay = [v for k, v in params.items() if v.ndim < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=LR, betas=(0.9, 0.95), eps=1e-8)
steps = []
batches = []
for step in range(STEPS):
    tok = torch.randint(0, V, (B, S), generator=G)
    tgt = torch.randint(0, V, (B, S), generator=G)
    opt.zero_grad()
    loss = forward(tok, tgt)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
    opt.step()
    steps.append({"loss": float(loss), "grad_norm": float(gnorm)})
    batches.append({"tokens": tok.flatten().tolist(), "targets": tgt.flatten().tolist()})

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_fixture.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "generator": "tests/reference/make_train_fixture.py",
               "config": CFG, "batch": B, "seq": S, "lr": LR,
               "params": {k: {"shape": list(v.shape), "data": [float(x) for x in v.flatten().tolist()]}
                          for k, v in init.items()},
               "batches": batches, "steps": steps}, f, separators=(",", ":"))
print(f"wrote {out}: " + ", ".join(f"loss {s['loss']:.6f} gnorm {s['grad_norm']:.6f}" for s in steps))

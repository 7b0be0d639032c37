"""The PyTorch reference decoding with a KV cache: the same work as bench/decode_bench.cc
(a batch prefilled to a context length, then timed one-token steps with FPA eviction on or off),
on train/reference.py's model. The cache is preallocated; evicted keys are masked and the cache
is compacted whenever the longest live row fits in half the used length, so eviction saves
work here too.

    /usr/bin/python3 bench/decode_reference.py --model DIR [--batch 1 8 32] [--context 256 2048]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "train"))
from export import load_model  # noqa: E402
from reference import BOS, Model  # noqa: E402


def bench_token(seq: int, pos: int) -> int:
    """The token stream of bench/decode_tokens.h."""
    if pos == 0:
        return BOS
    x = (1103515245 * (seq * 100003 + pos) + 12345) & 0x7FFFFFFF
    return (x >> 16) % 256


class LayerCache:
    """k, v [B, H, cap, hd], lvl, m [B, H, cap], live [B, H, cap]; n slots used; phi [B, H]."""

    def __init__(self, k, v, lvl, m, live, phi, cap: int):
        b, h, n, hd = k.shape
        self.k = torch.zeros(b, h, cap, hd)
        self.v = torch.zeros(b, h, cap, hd)
        self.lvl = torch.zeros(b, h, cap)
        self.m = torch.full((b, h, cap), math.inf)
        self.live = torch.zeros(b, h, cap, dtype=torch.bool)
        self.k[:, :, :n], self.v[:, :, :n] = k, v
        self.lvl[:, :, :n], self.m[:, :, :n], self.live[:, :, :n] = lvl, m, live
        self.phi, self.n = phi, n

    def compact(self):
        """Moves each row's live slots to the front when that halves the used length."""
        keep = int(self.live[..., : self.n].sum(-1).max())
        if keep > self.n // 2:
            return
        order = torch.sort((~self.live[..., : self.n]).to(torch.int8), dim=-1, stable=True).indices
        idx = order[..., :keep]
        for name in ("k", "v"):
            t = getattr(self, name)
            t[:, :, :keep] = torch.gather(t[:, :, : self.n], 2, idx[..., None].expand(-1, -1, -1, t.shape[-1]))
        for name in ("lvl", "m", "live"):
            t = getattr(self, name)
            t[:, :, :keep] = torch.gather(t[:, :, : self.n], 2, idx)
        self.live[:, :, keep:] = False
        self.n = keep


def thresholds(attn, tau):
    beta = attn.beta()
    if tau is None:
        return beta, torch.full_like(beta, math.inf)
    return beta, torch.where(beta > 0, tau / beta, torch.tensor(math.inf))


def prefill_one(model: Model, tokens, tau) -> list:
    """Full forward of one sequence (the reference's parallel form, with eviction masking at tau);
    returns per layer (k, v, lvl, m, live, phi) for a cache."""
    cfg = model.cfg
    t = len(tokens)
    h = model.embed(torch.tensor(tokens)[None])
    out = []
    for block in model.layers:
        x = block.attn_norm(h)
        attn = block.attn
        _, k, v = attn.qkv(x, torch.arange(t))
        if cfg.attention == "softmax":
            phi = torch.zeros(1, cfg.n_heads, t)
            lvl, m = phi.clone(), torch.full_like(phi, math.inf)
            live = torch.ones_like(phi, dtype=torch.bool)
        else:
            d, u = attn.walk(x)
            phi = torch.cumsum(d, dim=1).transpose(1, 2)  # [1, H, T]
            lvl = phi if u is None else phi + u.transpose(1, 2)
            after = torch.cat([phi[..., 1:], torch.full_like(phi[..., :1], math.inf)], dim=-1)
            m = torch.flip(torch.cummin(torch.flip(after, [-1]), dim=-1).values, [-1])
            beta, thr = thresholds(attn, tau)
            live = ~((lvl - m) >= thr[None, :, None])
        out.append((k, v, lvl, m, live, phi[..., -1]))
        h = h + attn(x, tau)
        h = h + block.mlp(block.mlp_norm(h))
    return out


def prefill(model: Model, batch: int, context: int, tau, cap: int) -> list:
    """Every sequence of the batch starts from the same prompt (sequence 0's tokens)."""
    one = prefill_one(model, [bench_token(0, p) for p in range(context)], tau)
    return [LayerCache(*(t.expand(batch, *t.shape[1:]) for t in layer), cap=cap) for layer in one]


def decode_step(model: Model, caches: list, tokens, pos: int, tau):
    cfg = model.cfg
    h = model.embed.weight[tokens][:, None, :]  # [B, 1, D]
    for block, c in zip(model.layers, caches):
        attn = block.attn
        x = block.attn_norm(h)
        q, k, v = attn.qkv(x, torch.tensor([pos]))  # [B, H, 1, hd]
        beta, thr = thresholds(attn, tau)
        lvl_i = torch.zeros(h.shape[0], cfg.n_heads)
        if cfg.attention != "softmax":
            d, u = attn.walk(x[:, 0])
            c.phi = c.phi + d
            lvl_i = c.phi if u is None else c.phi + u
            n = c.n
            c.live[..., :n] &= ~((c.lvl[..., :n] - c.phi[..., None]) >= thr[None, :, None])
            c.compact()
        n = c.n
        c.k[:, :, n], c.v[:, :, n] = k[:, :, 0], v[:, :, 0]
        c.lvl[:, :, n], c.m[:, :, n], c.live[:, :, n] = lvl_i, math.inf, True
        c.m[..., :n] = torch.minimum(c.m[..., :n], c.phi[..., None])
        c.n = n + 1
        s = (c.k[:, :, : n + 1] @ q.transpose(-1, -2))[..., 0] / math.sqrt(cfg.head_dim)
        if cfg.attention != "softmax":
            s = s - beta[None, :, None] * F.relu(c.lvl[..., : n + 1] - c.m[..., : n + 1])
        s = s.masked_fill(~c.live[..., : n + 1], -math.inf)
        o = (torch.softmax(s, dim=-1)[:, :, None, :] @ c.v[:, :, : n + 1])  # [B, H, 1, hd]
        h = h + o.transpose(1, 2).reshape(h.shape[0], 1, -1) @ attn.wo.t()
        h = h + block.mlp(block.mlp_norm(h))
    return model.head(h)[:, 0]


def run(model: Model, batch: int, context: int, evict: bool, steps: int, tau: float,
        windows: int = 4) -> dict:
    """Times `steps` decode steps in `windows` windows; tokens_per_s is the fastest window's rate
    (what a busy machine disturbs least), tokens_per_s_mean the rate over all steps."""
    t = tau if evict else None
    windows = max(1, min(windows, steps))
    best, secs, begin = math.inf, 0.0, 0
    with torch.no_grad():
        caches = prefill(model, batch, context, t, context + steps)
        for w in range(windows):
            end = steps * (w + 1) // windows
            start = time.perf_counter()
            for i in range(begin, end):
                tokens = torch.tensor([bench_token(b, context + i) for b in range(batch)])
                decode_step(model, caches, tokens, context + i, t)
            took = time.perf_counter() - start
            best, secs, begin = min(best, took / (end - begin)), secs + took, end
    cfg = model.cfg
    live = sum(int(c.live[..., : c.n].sum()) for c in caches)
    full = batch * (context + steps) * cfg.n_layers * cfg.n_heads
    return {"impl": "pytorch", "batch": batch, "context": context, "evict": evict, "tau": tau,
            "steps": steps, "seconds": secs, "tokens_per_s": batch / best,
            "tokens_per_s_mean": batch * steps / secs,
            "live_fraction": live / full}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--evict", nargs="+", default=["on", "off"])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--tau", type=float, default=0.0, help="0 = the model's")
    args = ap.parse_args()
    model = load_model(args.model)
    tau = args.tau or model.cfg.tau
    for context in args.context:
        for batch in args.batch:
            for e in args.evict:
                print(json.dumps(run(model, batch, context, e == "on", args.steps, tau,
                                     args.windows)), flush=True)


if __name__ == "__main__":
    main()

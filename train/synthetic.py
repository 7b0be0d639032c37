"""The paper's synthetic result at small scale: one-layer models on a target-key-set task.

A sequence writes values (`a`-`h`), opens `(` and closes `)` nested blocks, and asks `?`. The
answer to `?` is the last value written in the current block or an enclosing one: values
written inside blocks that have since closed must be unreachable, the outer ones kept, however
recent the closed ones are. FPA can express this exactly in one layer (the walk rises at `(`,
falls back at `)`, so a closed block's keys sit above a later dip, and a small fall per write
makes the last write win); FoX's monotone decay and softmax's positions cannot tell a closed
block's keys from the outer ones. Each kind is trained from several seeds; a seed converges when
its held-out accuracy on `?` reaches --converged (also reported at 4x the training length).

    /usr/bin/python3 train/synthetic.py --seeds 0 1 2 --steps 250 --out bench/out/synthetic.md
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import Config, Model  # noqa: E402

VALUES = "abcdefgh"


def sample(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """(tokens, targets) with target -1 except at `?`, where it is the reachable value."""
    scopes = [rng.choice(VALUES)]  # the innermost visible value per open block
    text, tgt = [scopes[0]], [-1]
    while len(text) < length:
        r = rng.random()
        if r < 0.3:
            scopes[-1] = rng.choice(VALUES)
            text.append(scopes[-1])
            tgt.append(-1)
        elif r < 0.45 and len(scopes) < 5:
            scopes.append(scopes[-1])
            text.append("(")
            tgt.append(-1)
        elif r < 0.6 and len(scopes) > 1:
            scopes.pop()
            text.append(")")
            tgt.append(-1)
        else:
            text.append("?")
            tgt.append(ord(scopes[-1]))
    return [ord(c) for c in text], tgt


def batch(rng: random.Random, size: int, length: int):
    rows = [sample(rng, length) for _ in range(size)]
    return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def recency_baseline(length: int, n: int = 64) -> float:
    """Accuracy of answering with the last value written anywhere (closed blocks included): what
    a model that cannot tell reachable keys from unreachable ones falls back on."""
    x, y = batch(random.Random(12345), n, length)
    hits = total = 0
    for row, tgt in zip(x.tolist(), y.tolist()):
        last = None
        for tok, t in zip(row, tgt):
            if chr(tok) in VALUES:
                last = tok
            if t >= 0:
                hits, total = hits + (t == last), total + 1
    return hits / total


def make_model(kind: str, seed: int) -> Model:
    cfg = Config(d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=32, attention=kind,
                 levels="free" if kind == "fpa" else "tied",
                 rope_theta=10000.0 if kind == "softmax" else 0.0, train_len=48)
    return Model(cfg).init_weights(seed, field_bias=3.0 if kind == "fox" else 0.0, walk_std=0.1,
                                   embed_std=cfg.d_model ** -0.5)


def accuracy(model: Model, length: int, n: int = 64) -> float:
    x, y = batch(random.Random(12345), n, length)
    with torch.no_grad():
        pred = model(x).argmax(-1)
    mask = y >= 0
    return (pred[mask] == y[mask]).float().mean().item()


def train_one(kind: str, seed: int, steps: int, lr: float, cosine: bool = False) -> dict:
    """`cosine`: the learning rate decays from lr to 1% of it over the steps (else constant)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = make_model(kind, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        if cosine:
            for g in opt.param_groups:
                g["lr"] = lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        x, y = batch(rng, 32, 48)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return {"kind": kind, "seed": seed, "acc": accuracy(model, 48), "acc4x": accuracy(model, 192)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", nargs="+", default=["fpa", "fox", "softmax"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--lr", type=float, default=2e-2)
    ap.add_argument("--cosine", action="store_true", help="cosine decay of the learning rate")
    ap.add_argument("--converged", type=float, default=0.99)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for kind in args.kinds:
        for seed in args.seeds:
            t0 = time.time()
            results.append(train_one(kind, seed, args.steps, args.lr, args.cosine))
            print(f"{results[-1]} ({time.time() - t0:.0f}s)", flush=True)
    lines = ["| kind | seeds converged | accuracy per seed (48 tokens) | at 192 tokens (4x) |",
             "|---|---|---|---|"]
    for kind in args.kinds:
        rs = [r for r in results if r["kind"] == kind]
        conv = sum(r["acc"] >= args.converged for r in rs)
        lines.append(f"| {kind} | {conv}/{len(rs)} | " + ", ".join(f"{r['acc']:.3f}" for r in rs)
                     + " | " + ", ".join(f"{r['acc4x']:.3f}" for r in rs) + " |")
    lines.append(f"| (last value written, ignoring scopes) | - | {recency_baseline(48):.3f} | "
                 f"{recency_baseline(192):.3f} |")
    schedule = "cosine to 1%" if args.cosine else "constant"
    text = "\n".join(lines) + (f"\n\nOne layer, 2 heads of 16, d_model 32, {args.steps} steps of "
                               f"32x48 tokens, lr {args.lr} ({schedule}); converged = accuracy "
                               f"on `?` >= {args.converged}.\n")
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

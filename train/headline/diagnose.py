"""Where the passkey goes: per layer and head, at the query that must produce the first answer
digit, the attention mass on the needle's digits, their penalty (min over the key's digits), the
walk's drift per filler group and the live fraction, at several prompt lengths.

    /usr/bin/python3 train/headline/diagnose.py train/runs/headline/best.pt --lengths 512 4096
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fast  # noqa: E402
from data import FILLER, passkey_prompt  # noqa: E402
from reference import Config, Model, encode  # noqa: E402


def load(path: str) -> Model:
    if os.path.isdir(path):
        from export import load_model
        return load_model(path)
    ck = torch.load(path, map_location="cpu")
    model = Model(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    return model.eval()


def report(model: Model, n_tokens: int, depth: float, key: str, tau: float):
    text = passkey_prompt(n_tokens, depth, key)
    prompt = encode(text) + list(f" {key}".encode())
    first = text.index(key) + 1  # +1: BOS
    digits = [p for p in range(len(prompt) - 6) if 48 <= prompt[p] <= 57]
    query = len(prompt) - 6  # predicts the first answer digit (input is the space before it)
    group = len(FILLER) + 1
    h = model.embed(torch.tensor([prompt]))
    print(f"-- {len(prompt)} tokens, needle at {first}, depth {depth}")
    for li, layer in enumerate(model.layers):
        attn, x = layer.attn, layer.attn_norm(h)
        q, k, _ = attn.qkv(x, torch.arange(x.shape[1]))
        phi, lvl = attn.walk_levels(x)
        beta = attn.beta()
        exc = fast.excess(phi, lvl)[0, :, query]  # [H, T]
        pen = beta[:, None] * F.relu(exc)
        s = torch.einsum("hd,htd->ht", q[0, :, query], k[0]) / math.sqrt(attn.cfg.head_dim)
        keep = torch.arange(len(prompt)) <= query
        keep = keep & ~(exc >= torch.where(beta > 0, tau / beta, torch.tensor(math.inf))[:, None])
        w = torch.softmax((s - pen).masked_fill(~keep, -math.inf), -1)
        for hd in range(attn.cfg.n_heads):
            tail = phi[0, hd, query - 8 * group: query - 2 * group]
            drift = (tail[group:] - tail[:-group]).mean().item() if len(tail) > group else float("nan")
            print(f"L{li}H{hd} beta {beta[hd]:.2f} mass on digits {w[hd, digits].sum():.3f} "
                  f"pen on key {pen[hd, first:first + 5].min():.1f} "
                  f"live {keep[hd, :query + 1].float().mean():.2f} drift/group {drift:+.2f} "
                  f"qk gap {s[hd, digits].max() - s[hd, :query].median():.1f}")
        h = h + fast.attention(attn, x)
        h = h + layer.mlp(layer.mlp_norm(h))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a checkpoint (.pt) or an exported model directory")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--depth", type=float, default=0.3)
    ap.add_argument("--tau", type=float, default=20.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load(args.model)
    with torch.no_grad():
        for n in args.lengths:
            report(model, n, args.depth, "71942", args.tau)


if __name__ == "__main__":
    main()

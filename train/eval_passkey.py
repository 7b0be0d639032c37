"""Passkey accuracy at 1x/2x/4x/8x the training length, with the full cache and with eviction at
tau (reporting the live fraction), and held-out perplexity; writes a markdown table.

    /usr/bin/python3 train/eval_passkey.py models/fpa-tiny models/fox-tiny models/softmax-tiny \
        --samples 20 --out bench/out/passkey.md

A sample counts as correct when greedy decoding after the prompt yields " NNNNN" followed by a
non-digit. That is checked with one teacher-forced forward over prompt + " NNNNN.": greedy
decoding produces the answer iff every one of those argmaxes is right, so this equals generating.
Eviction uses the parallel forward with the evicted keys masked, which equals the step-by-step
evicting decode (a key's penalty never decreases). The live fraction is the share of
(layer, head, key) entries still live for the last query.
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
from data import heldout_tokens, passkey_prompt, random_key  # noqa: E402
from reference import Model, encode  # noqa: E402

DIGITS = set(b"0123456789")


def passkey_one(model: Model, n_tokens: int, depth: float, key: str, tau=None):
    """(correct, live fraction) for one prompt of about n_tokens tokens."""
    prompt = encode(passkey_prompt(n_tokens, depth, key))
    answer = list(f" {key}.".encode())
    stats = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt + answer]), tau=tau, stats=stats, block=512)[0]
    pred = logits[len(prompt) - 1: len(prompt) + len(answer) - 1].argmax(-1).tolist()
    correct = pred[:-1] == answer[:-1] and pred[-1] not in DIGITS
    return correct, (sum(stats) / len(stats) if stats else 1.0)


def passkey_eval(model: Model, n_tokens: int, samples: int, seed: int = 0, tau=None):
    """(accuracy, mean live fraction) over `samples` prompts, depths spread evenly over [0, 1]."""
    rng = random.Random(seed * 1000003 + n_tokens)
    results = [passkey_one(model, n_tokens, (k + 0.5) / samples, random_key(rng), tau)
               for k in range(samples)]
    return (sum(r[0] for r in results) / samples, sum(r[1] for r in results) / samples)


def perplexity(model: Model, tokens: list[int], seq_len: int, max_chunks: int = 1000) -> float:
    """Per-byte perplexity over non-overlapping windows of seq_len predictions."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, min(len(tokens) - 1, max_chunks * seq_len), seq_len):
            chunk = torch.tensor([tokens[start: start + seq_len + 1]])
            logits = model(chunk[:, :-1])
            nll += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    return math.exp(nll / count)


def evaluate(model_dir: str, multiples, samples: int, tau=None) -> dict:
    from export import load_model
    model = load_model(model_dir)
    tau = model.cfg.tau if tau is None else tau
    row = {"model": os.path.basename(model_dir.rstrip("/")), "kind": model.cfg.attention,
           "ppl": perplexity(model, heldout_tokens(), model.cfg.train_len), "tau": tau}
    for mult in multiples:
        n = mult * model.cfg.train_len
        row[f"full@{mult}x"] = passkey_eval(model, n, samples)[0]
        if model.cfg.attention != "softmax":
            row[f"evict@{mult}x"] = passkey_eval(model, n, samples, tau=tau)
    return row


def table(rows, multiples, samples: int) -> str:
    head = ["model", "held-out ppl"] + [f"{m}x full" for m in multiples] + \
        [f"{m}x evict (live)" for m in multiples]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['ppl']:.3f}"]
        cells += [f"{r[f'full@{m}x']:.0%}" for m in multiples]
        for m in multiples:
            ev = r.get(f"evict@{m}x")
            cells.append(f"{ev[0]:.0%} ({ev[1]:.0%})" if ev else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{samples} prompts per cell; tau = each model's config tau.\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--tau", type=float, default=None, help="default: the model's config tau")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for m in args.models:
        t0 = time.time()
        rows.append(evaluate(m, args.multiples, args.samples, args.tau))
        print(f"{m}: {rows[-1]} ({time.time() - t0:.0f}s)", flush=True)
    text = table(rows, args.multiples, args.samples)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

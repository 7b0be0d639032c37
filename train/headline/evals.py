"""Bounded evaluations through the fast forward: the same prompts, seeds and scoring as
train/eval_passkey.py (passkey_eval / perplexity), so the numbers agree with it."""
from __future__ import annotations

import math
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fast  # noqa: E402
from data import passkey_prompt, random_key  # noqa: E402
from eval_passkey import DIGITS  # noqa: E402
from reference import encode  # noqa: E402


def passkey_one(model, n_tokens: int, depth: float, key: str, tau=None,
                make_prompt=passkey_prompt):
    """(correct, live fraction): eval_passkey.passkey_one through fast.forward, on the prompt
    make_prompt(n_tokens, depth, key) (the benchmark's by default)."""
    prompt = encode(make_prompt(n_tokens, depth, key))
    answer = list(f" {key}.".encode())
    stats = []
    with torch.no_grad():
        logits = fast.forward(model, torch.tensor([prompt + answer]), tau=tau, stats=stats)[0]
    pred = logits[len(prompt) - 1: len(prompt) + len(answer) - 1].argmax(-1).tolist()
    correct = pred[:-1] == answer[:-1] and pred[-1] not in DIGITS
    return correct, sum(stats) / len(stats)


def passkey_eval(model, n_tokens: int, samples: int, seed: int = 0, tau=None,
                 make_prompt=passkey_prompt):
    """(accuracy, mean live fraction), the prompts of eval_passkey.passkey_eval."""
    rng = random.Random(seed * 1000003 + n_tokens)
    results = [passkey_one(model, n_tokens, (k + 0.5) / samples, random_key(rng), tau, make_prompt)
               for k in range(samples)]
    return sum(r[0] for r in results) / samples, sum(r[1] for r in results) / samples


def perplexity(model, tokens: list[int], seq_len: int, max_chunks: int = 1000) -> float:
    """eval_passkey.perplexity through fast.forward."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, min(len(tokens) - 1, max_chunks * seq_len), seq_len):
            chunk = torch.tensor([tokens[start: start + seq_len + 1]])
            logits = fast.forward(model, chunk[:, :-1])
            nll += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    return math.exp(nll / count)


def main():
    """Full table for one model directory: held-out perplexity (all windows) and passkey at each
    multiple, full cache and evicting at tau, as JSON lines and a markdown table."""
    import argparse
    import json
    import time

    from data import heldout_tokens
    from export import load_model

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="eval_passkey.py's default seed is 0")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    tau, t0 = model.cfg.tau, time.time()
    ppl = perplexity(model, heldout_tokens(), model.cfg.train_len)
    print(json.dumps({"ppl": ppl, "tau": tau}), flush=True)
    rows = []
    for mult in args.multiples:
        n = mult * model.cfg.train_len
        full = passkey_eval(model, n, args.samples, args.seed)[0]
        acc, live = passkey_eval(model, n, args.samples, args.seed, tau=tau)
        rows.append((mult, full, acc, live))
        print(json.dumps({"mult": mult, "tokens": n, "full": full, "evict": acc, "live": live,
                          "wall_s": round(time.time() - t0)}), flush=True)
    print(f"\nheld-out ppl {ppl:.3f}; {args.samples} prompts per cell, seed {args.seed}, "
          f"tau {tau}\n\n| length | full cache | evicting at tau | live keys |\n|---|---|---|---|")
    for mult, full, acc, live in rows:
        print(f"| {mult}x ({mult * model.cfg.train_len}) | {full:.0%} | {acc:.0%} | {live:.1%} |")


if __name__ == "__main__":
    main()

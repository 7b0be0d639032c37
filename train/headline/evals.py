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


def passkey_one(model, n_tokens: int, depth: float, key: str, tau=None):
    """(correct, live fraction): eval_passkey.passkey_one through fast.forward."""
    prompt = encode(passkey_prompt(n_tokens, depth, key))
    answer = list(f" {key}.".encode())
    stats = []
    with torch.no_grad():
        logits = fast.forward(model, torch.tensor([prompt + answer]), tau=tau, stats=stats)[0]
    pred = logits[len(prompt) - 1: len(prompt) + len(answer) - 1].argmax(-1).tolist()
    correct = pred[:-1] == answer[:-1] and pred[-1] not in DIGITS
    return correct, sum(stats) / len(stats)


def passkey_eval(model, n_tokens: int, samples: int, seed: int = 0, tau=None):
    """(accuracy, mean live fraction), the prompts of eval_passkey.passkey_eval."""
    rng = random.Random(seed * 1000003 + n_tokens)
    results = [passkey_one(model, n_tokens, (k + 0.5) / samples, random_key(rng), tau)
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

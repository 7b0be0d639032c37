"""A cache budget the model learns: a differentiable share of the keys each head keeps.

The cache evicts key j of a head once its penalty beta * relu(excess) reaches tau (FPA; FoX is
the same with beta = 1 and its decay as the excess; softmax never evicts). `soft_live` replaces
that step with a smooth one of width `temp`, so the expected share of live (query, key) pairs
per head has a gradient through the walk, the levels and beta. Two choices keep that gradient
alive for a head that keeps everything (the case to fix): the step is taken on beta * excess,
not on the penalty (the same test for tau > 0, but a key below its walk has a zero penalty and no
gradient through the relu), and it is the algebraic sigmoid, whose tails fall as 1/z^2, not the
logistic one (exp(-z)): a key far inside the budget still feels it.

The loss is a per-head hinge above `target`: every head is pushed until it keeps at most that
share (so no head keeps every key), and none is pushed further. `Gate` scales it by how well the
model answers: off while the running answer-digit accuracy is under `lo`, full at 1, so
retrieval comes first.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _below(t: int):
    return torch.ones(t, t, dtype=torch.bool).tril(-1)  # key j < query i


def soft_live(exc, beta, tau: float, temp: float):
    """[H]: the mean over (batch, query i, key j < i) of a smooth step of (tau - beta * excess)
    / temp, 1 deep inside the budget and 0 far past it."""
    below = _below(exc.shape[-1])
    z = (tau - beta[:, None, None] * exc.masked_fill(~below, 0.0)) / temp
    live = (0.5 + 0.5 * z * torch.rsqrt(1.0 + z * z)) * below
    return live.sum((0, 2, 3)) / (exc.shape[0] * below.sum())


def hard_live(exc, beta, tau: float):
    """[H]: the share of (batch, query, key j < query) that the cache keeps at tau (the limit of
    soft_live as temp -> 0)."""
    below = _below(exc.shape[-1])
    kept = (beta[:, None, None] * F.relu(exc.masked_fill(~below, 0.0)) < tau) & below
    return kept.sum((0, 2, 3)) / (exc.shape[0] * below.sum())


REDUCE = {"mean": torch.mean, "sum": torch.sum}


def budget_loss(excesses: list, tau: float, temp: float, target: float, reduce: str = "mean"):
    """(loss, soft live share per head of every layer) from fast.forward's `excesses`; a zero
    loss for softmax models (no excess: nothing the model could learn to evict). `reduce` over
    heads: the mean gives one head that keeps every key 1/H of the push (gen2's retrieval head
    kept all of its keys under it); the sum gives each head the whole weight."""
    if not excesses:
        return torch.zeros(()), torch.ones(0)
    shares = torch.cat([soft_live(exc, beta, tau, temp) for exc, beta in excesses])
    return REDUCE[reduce](F.relu(shares - target)), shares.detach()


class Gate:
    """Exponential moving average of the answer-digit accuracy, and the budget weight it allows."""

    def __init__(self, weight: float, lo: float, decay: float = 0.9):
        self.weight, self.lo, self.decay, self.acc = weight, lo, decay, 0.0

    def update(self, acc: float) -> float:
        self.acc = self.decay * self.acc + (1 - self.decay) * acc
        return self.weight * min(1.0, max(0.0, (self.acc - self.lo) / (1.0 - self.lo)))

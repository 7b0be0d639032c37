"""The reference model's forward (train/reference.py) with the excess built by a sparse table.

reference._excess_rows builds the [T, T] running minimum one query row at a time (T small torch
ops per layer and as many in the backward); here every range minimum min(phi over (j, i]) is
the smaller of two entries of a log2(T)-level sparse table, gathered in one op. Same math, same
parameters; tests in this folder check it against the reference.
"""
from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from reference import Attention, Model  # noqa: E402

_INDEX_CACHE: dict[int, tuple] = {}


def _indices(t: int):
    """For query i and key j < i: flat sparse-table indices of the two halves covering (j, i]."""
    if t not in _INDEX_CACHE:
        levels = max(1, (t - 1).bit_length())
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        span = (i - j).clamp(min=1)
        k = torch.floor(torch.log2(span.double())).long()  # exact for integers < 2^52
        a = k * t + (j + 1).clamp(max=t - 1)
        b = k * t + (i - (1 << k) + 1).clamp(min=0)
        _INDEX_CACHE[t] = (levels, a.flatten(), b.flatten(), (j < i))
    return _INDEX_CACHE[t]


def excess(phi, lvl):
    """lvl_j - min(phi over (j, i]) as [B, H, T, T]; -inf where j >= i (the empty segment)."""
    b, h, t = phi.shape
    levels, ia, ib, below = _indices(t)
    tables = [phi]
    for k in range(1, levels):
        prev, s = tables[-1], 1 << (k - 1)
        tables.append(torch.minimum(prev, F.pad(prev[..., s:], (0, s), value=math.inf)))
    flat = torch.stack(tables, dim=2).reshape(b, h, levels * t)
    m = torch.minimum(flat.gather(2, ia.expand(b, h, -1)), flat.gather(2, ib.expand(b, h, -1)))
    exc = lvl[..., None, :] - m.view(b, h, t, t)
    return torch.where(below, exc, torch.tensor(-math.inf))


def attention(attn: Attention, x, tau=None, stats=None, excesses=None, penalty_scale=1.0):
    """Attention.forward with all query rows at once and the sparse-table excess. With
    `excesses`, appends this layer's (excess, beta) for a cache-budget term (budget.py);
    `penalty_scale` multiplies beta (a training schedule; 1 is the model itself)."""
    b, t, _ = x.shape
    q, k, v = attn.qkv(x, torch.arange(t))
    s = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.head_dim)
    keep = torch.ones(t, t, dtype=torch.bool).tril()
    if attn.cfg.attention != "softmax":
        beta = attn.beta() * penalty_scale
        phi, lvl = attn.walk_levels(x)
        exc = excess(phi, lvl)
        if excesses is not None:
            excesses.append((exc, beta))
        s = s - beta[:, None, None] * F.relu(exc)
        if tau is not None:
            thr = torch.where(beta > 0, tau / beta, torch.tensor(math.inf))[:, None, None]
            keep = keep & ~(exc >= thr)
    if stats is not None:
        stats.append(keep[..., -1, :].float().mean().item())
    s = s.masked_fill(~keep, -math.inf)
    out = torch.softmax(s, dim=-1) @ v
    return out.transpose(1, 2).reshape(b, t, -1) @ attn.wo.t()


def forward(model: Model, tokens, tau=None, stats=None, excesses=None, penalty_scale=1.0):
    """Model.forward (logits [B, T, V]) through the fast attention."""
    h = model.embed(tokens)
    for layer in model.layers:
        h = h + attention(layer.attn, layer.attn_norm(h), tau, stats, excesses, penalty_scale)
        h = h + layer.mlp(layer.mlp_norm(h))
    return model.head(h)

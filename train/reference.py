"""PyTorch reference decoder for First Passage Attention (docs/fpa.md), naive and O(n^2).

Parameter names equal the tensor names of docs/model-format.md, so `state_dict()` is the file.
Two ways to run a model:
  * `Model.forward(tokens, tau=None)`: the parallel forward. With `tau`, the keys that the cache
    would have evicted are masked out; a key's penalty never decreases, so this equals decoding
    step by step with eviction (and it is what training and evaluation use).
  * `decode_steps(model, tokens, tau)`: the literal step-by-step decode of docs/model-format.md
    "Eviction conventions", with a float32 walk and explicit live sets: the ground truth that the
    C++ cache and kernels are tested against.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

# Byte tokenizer: ids 0-255 are bytes, then three special tokens.
BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 259
KINDS = ("fpa", "fox", "softmax")


def encode(text: str, bos: bool = True) -> list[int]:
    return ([BOS] if bos else []) + list(text.encode("utf-8"))


def decode(ids) -> str:
    return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


@dataclasses.dataclass
class Config:
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    head_dim: int = 64
    d_ff: int = 688
    attention: str = "fpa"
    levels: str = "free"
    rope_theta: float = 0.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    train_len: int = 512
    tau: float = 20.0
    vocab_size: int = VOCAB_SIZE
    # FoX Pro's options (the Hugging Face format only, train/hf_checkpoint.py; docs/model-format.md)
    qk_norm: bool = False  # per-head RMSNorm of q and k
    qk_norm_shared: bool = False  # ... with one [head_dim] scale for every head
    output_norm: bool = False  # per-head RMSNorm of the attention output
    output_gate: str = ""  # "sigmoid" or "silu": o *= act(ogate x)
    k_shift: bool = False  # ShiftLinear keys: k_t mixes in the previous token's projection
    v_shift: bool = False  # ... and values

    def __post_init__(self):
        if self.attention not in KINDS:
            raise ValueError(f"attention must be one of {KINDS}, got {self.attention!r}")
        if self.levels not in ("free", "tied"):
            raise ValueError(f"levels must be 'free' or 'tied', got {self.levels!r}")
        if self.output_gate not in ("", "sigmoid", "silu"):
            raise ValueError(f"output_gate must be '', 'sigmoid' or 'silu', got {self.output_gate!r}")
        if self.fox_pro_options() and self.attention != "fox":
            raise ValueError(f"{sorted(self.fox_pro_options())} are options of fox models")
        if self.attention != "fpa" and self.levels != "tied":
            raise ValueError(f"{self.attention} models have tied levels")
        if self.attention != "softmax" and self.rope_theta:
            raise ValueError("fpa and fox models use no positional encoding")

    def fox_pro_options(self) -> dict:
        """The FoX Pro options set (not at their defaults)."""
        defaults = {f.name: f.default for f in dataclasses.fields(Config)}
        return {k: getattr(self, k) for k in _FOX_PRO if getattr(self, k) != defaults[k]}

    @property
    def free_levels(self) -> bool:
        return self.attention == "fpa" and self.levels == "free"

    def to_json(self, training: dict | None = None) -> dict:
        if self.fox_pro_options():
            raise ValueError("fpa-serve/1 has no FoX Pro options (write the Hugging Face format)")
        out = {"format": "fpa-serve/1", **dataclasses.asdict(self)}
        for key in _FOX_PRO:
            del out[key]
        out["tokenizer"] = {"type": "byte", "bos_id": BOS, "eos_id": EOS, "pad_id": PAD}
        out["training"] = training or {}
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Config":
        if d.get("format") != "fpa-serve/1":
            raise ValueError(f"unknown model format {d.get('format')!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


_FOX_PRO = ("qk_norm", "qk_norm_shared", "output_norm", "output_gate", "k_shift", "v_shift")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _param(*shape) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape))


def rms_heads(x, weight, head_dim: int, eps: float):
    """RMSNorm of each head's slice of x [..., n_heads * head_dim]; weight is [n_heads * head_dim]
    or [head_dim] (one scale shared by every head)."""
    heads = x.reshape(*x.shape[:-1], -1, head_dim)
    heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps)
    return heads.reshape(x.shape) * (weight if weight.shape[0] == x.shape[-1] else
                                     weight.repeat(x.shape[-1] // head_dim))


def shift_rows(y, gate, prev, n_heads: int):
    """FoX Pro's ShiftLinear: row t of y [B, T, A] becomes a_t y_{t-1} + (1 - a_t) y_t per head,
    a = sigmoid(gate) [B, T, H], y_{-1} = prev [B, 1, A] (zeros at a sequence's start)."""
    a = torch.sigmoid(gate).repeat_interleave(y.shape[-1] // n_heads, dim=-1)
    before = torch.cat([prev, y[:, :-1]], dim=1)
    return a * before + (1 - a) * y


def rope(x, pos, theta: float):
    """Rotate-half RoPE on [..., T, head_dim] at integer positions `pos` [T]."""
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float32) * 2.0 / x.shape[-1])
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        a, d, h = cfg.n_heads * cfg.head_dim, cfg.d_model, cfg.n_heads
        self.wq, self.wk, self.wv, self.wo = _param(a, d), _param(a, d), _param(a, d), _param(d, a)
        if cfg.attention != "softmax":
            self.field_w, self.field_b = _param(h, d), _param(h)
        if cfg.free_levels:
            self.level_w, self.level_b = _param(h, d), _param(h)
        if cfg.attention == "fpa":
            self.beta_raw = _param(h)
        if cfg.qk_norm:
            self.q_norm = _param(cfg.head_dim if cfg.qk_norm_shared else a)
            self.k_norm = _param(cfg.head_dim if cfg.qk_norm_shared else a)
        if cfg.output_norm:
            self.out_norm = _param(a)
        if cfg.output_gate:
            self.ogate = _param(a, d)
        if cfg.k_shift:
            self.k_shift = _param(h, d)
        if cfg.v_shift:
            self.v_shift = _param(h, d)

    def beta(self):
        """Penalty scale per head: softplus(beta_raw) for fpa, 1 for fox, 0 for softmax."""
        if self.cfg.attention == "fpa":
            return F.softplus(self.beta_raw)
        return torch.full((self.cfg.n_heads,), 1.0 if self.cfg.attention == "fox" else 0.0)

    def walk(self, x):
        """Increments d and level offsets u, each [..., T, H] (u is None for tied levels)."""
        d = x @ self.field_w.t() + self.field_b
        if self.cfg.attention == "fox":
            d = F.logsigmoid(d)
        u = x @ self.level_w.t() + self.level_b if self.cfg.free_levels else None
        return d, u

    def qkv(self, x, pos, prev: dict | None = None):
        """q, k, v as [B, H, T, head_dim], RoPE applied for softmax models that use it. A shifted
        projection continues from prev["k"] / prev["v"] (the previous token's projection, [B, 1,
        A]; zeros when absent) and leaves its last row there."""
        cfg, (b, t, _) = self.cfg, x.shape
        q, k, v = x @ self.wq.t(), x @ self.wk.t(), x @ self.wv.t()
        if cfg.k_shift:
            k = self._shift(x, k, self.k_shift, prev, "k")
        if cfg.v_shift:
            v = self._shift(x, v, self.v_shift, prev, "v")
        if cfg.qk_norm:  # GroupNorm's default eps in the published code, not norm_eps
            q = rms_heads(q, self.q_norm, cfg.head_dim, 1e-5)
            k = rms_heads(k, self.k_norm, cfg.head_dim, 1e-5)
        split = lambda y: y.view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        if self.cfg.rope_theta:
            q, k = rope(q, pos, self.cfg.rope_theta), rope(k, pos, self.cfg.rope_theta)
        return q, k, v

    def _shift(self, x, y, gate_w, prev, name: str):
        before = prev.get(name) if prev is not None else None
        out = shift_rows(y, x @ gate_w.t(), torch.zeros_like(y[:, :1]) if before is None else before,
                         self.cfg.n_heads)
        if prev is not None:
            prev[name] = y[:, -1:]
        return out

    def output(self, x, o):
        """FoX Pro's output stage on o [B, T, A] (output norm, then the gate), then wo."""
        if self.cfg.output_norm:
            o = rms_heads(o, self.out_norm, self.cfg.head_dim, self.cfg.norm_eps)
        if self.cfg.output_gate:
            g = x @ self.ogate.t()
            o = o * (F.silu(g) if self.cfg.output_gate == "silu" else torch.sigmoid(g))
        return o @ self.wo.t()

    def walk_levels(self, x):
        """phi and lvl, each [B, H, T] (phi is the cumulative sum of the increments)."""
        d, u = self.walk(x)
        phi = torch.cumsum(d, dim=1).transpose(1, 2)
        return phi, (phi if u is None else phi + u.transpose(1, 2))

    def excess(self, x):
        """(excess [B, H, T_i, T_j] = lvl_j - m_j(i), beta [H]); excess is -inf on and above the
        diagonal (the empty segment), so the penalty is beta * relu(excess)."""
        phi, lvl = self.walk_levels(x)
        exc, _ = _excess_rows(phi, lvl, torch.full_like(phi, math.inf), 0, phi.shape[-1])
        return exc, self.beta()

    def forward(self, x, tau: float | None = None, stats: list | None = None,
                block: int | None = None):
        """Queries in blocks of `block` rows (all at once by default; blocks only save memory).
        With `stats`, appends the live fraction of this layer's keys for the last query."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x, torch.arange(t))
        beta = self.beta()
        thr = torch.where(beta > 0, (tau or 0.0) / beta, torch.tensor(math.inf))[:, None, None]
        if self.cfg.attention != "softmax":
            phi, lvl = self.walk_levels(x)
            m = torch.full_like(phi, math.inf)
        outs = []
        for i0 in range(0, t, block or t):
            i1 = min(t, i0 + (block or t))
            s = q[:, :, i0:i1] @ k[:, :, :i1].transpose(-1, -2) / math.sqrt(self.cfg.head_dim)
            keep = torch.ones(i1 - i0, i1, dtype=torch.bool).tril(i0)
            if self.cfg.attention != "softmax":
                exc, m = _excess_rows(phi, lvl, m, i0, i1)
                s = s - beta[:, None, None] * F.relu(exc)
                if tau is not None:
                    keep = keep & ~(exc >= thr)
            if stats is not None and i1 == t:
                stats.append(keep[..., -1, :].float().mean().item())
            s = s.masked_fill(~keep, -math.inf)
            outs.append(torch.softmax(s, dim=-1) @ v[:, :, :i1])  # [B, H, rows, hd]
        out = torch.cat(outs, dim=2)
        return self.output(x, out.transpose(1, 2).reshape(b, t, -1))


def _excess_rows(phi, lvl, m, i0: int, i1: int):
    """Rows i0..i1-1 of the excess lvl_j - m_j(i) over keys j < i1, and the running minimum
    m_j = min(phi over (j, i1-1]) to carry into the next rows. Built row by row: torch.cummin
    over [B, H, T, T] is ~50x slower on CPU."""
    keys = torch.arange(phi.shape[-1])
    rows = []
    for i in range(i0, i1):
        m = torch.minimum(m, phi[..., i:i + 1].masked_fill(keys >= i, math.inf))
        rows.append(m[..., :i1])
    return lvl[..., None, :i1] - torch.stack(rows, dim=-2), m


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.w_gate, self.w_up = _param(cfg.d_ff, cfg.d_model), _param(cfg.d_ff, cfg.d_model)
        self.w_down = _param(cfg.d_model, cfg.d_ff)

    def forward(self, y):
        return (F.silu(y @ self.w_gate.t()) * (y @ self.w_up.t())) @ self.w_down.t()


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.d_model, cfg.norm_eps), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.d_model, cfg.norm_eps), MLP(cfg)

    def forward(self, h, tau=None, stats=None, block=None):
        h = h + self.attn(self.attn_norm(h), tau, stats, block)
        return h + self.mlp(self.mlp_norm(h))


class Model(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def head(self, h):
        w = self.embed.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return self.final_norm(h) @ w.t()

    def forward(self, tokens, tau: float | None = None, return_layers: bool = False,
                stats: list | None = None, block: int | None = None):
        """tokens [B, T] -> logits [B, T, V] (and the residual stream after each block). With
        `stats`, each layer appends the live fraction of the keys for the last query; `block`
        runs the queries in blocks of that many rows (less memory, same result)."""
        h = self.embed(tokens)
        outs = []
        for layer in self.layers:
            h = layer(h, tau, stats, block)
            outs.append(h)
        logits = self.head(h)
        return (logits, outs) if return_layers else logits

    def init_weights(self, seed: int, field_bias: float = 0.0, beta_raw: float = 0.0,
                     walk_std: float = 1.0, embed_std: float = 1.0, out_scale: float = 1.0):
        """Normal init with std 1/sqrt(fan_in) scaled per role: `walk_std` for field_w and
        level_w, `out_scale` for wo and w_down; the walk's bias and beta are constants."""
        g = torch.Generator().manual_seed(seed)
        consts = {"norm.weight": 1.0, "field_b": field_bias, "beta_raw": beta_raw, "level_b": 0.0,
                  "q_norm": 1.0, "k_norm": 1.0, "out_norm": 1.0}
        scales = {"field_w": walk_std, "level_w": walk_std, "wo": out_scale, "w_down": out_scale}
        with torch.no_grad():
            for name, p in self.named_parameters():
                const = [v for k, v in consts.items() if name.endswith(k)]
                if const:
                    p.fill_(const[0])
                elif name == "embed.weight":
                    p.normal_(0.0, embed_std, generator=g)
                else:
                    scale = next((v for k, v in scales.items() if name.endswith(k)), 1.0)
                    p.normal_(0.0, scale / math.sqrt(p.shape[1]), generator=g)
        return self


def decode_steps(model: Model, tokens, tau: float | None = None) -> dict:
    """Literal step-by-step decode of one sequence (tokens [T]) with eviction at `tau`.

    Returns logits [T, V], layer_out (list of [T, D]), live (bool [T, L, H, T]: after step i,
    key j <= i is live) and margin ([T, L, H, T]: (lvl_j - phi_i) - tau/beta at step i, -inf where
    beta == 0 or tau is None, 0 for j > i). The walk phi is a sequential float32 sum.
    """
    cfg = model.cfg
    t_len, nl, nh, hd = len(tokens), cfg.n_layers, cfg.n_heads, cfg.head_dim
    live = torch.zeros(t_len, nl, nh, t_len, dtype=torch.bool)
    margin = torch.zeros(t_len, nl, nh, t_len)
    logits = torch.zeros(t_len, cfg.vocab_size)
    layer_out = [torch.zeros(t_len, cfg.d_model) for _ in range(nl)]
    caches = [_Cache(t_len, nh, hd) for _ in range(nl)]
    with torch.no_grad():
        for i in range(t_len):
            h = model.embed.weight[int(tokens[i])][None, None, :]
            for li, block in enumerate(model.layers):
                x = block.attn_norm(h)
                att, live[i, li], margin[i, li] = caches[li].step(block.attn, x, i, tau)
                h = h + att
                h = h + block.mlp(block.mlp_norm(h))
                layer_out[li][i] = h[0, 0]
            logits[i] = model.head(h)[0, 0]
    return {"logits": logits, "layer_out": layer_out, "live": live, "margin": margin}


class _Cache:
    """One layer's cache for decode_steps: k, v, lvl, running minimum m and live flag per head."""

    def __init__(self, t_len: int, nh: int, hd: int):
        self.k = torch.zeros(nh, t_len, hd)
        self.v = torch.zeros(nh, t_len, hd)
        self.lvl = torch.zeros(nh, t_len)
        self.m = torch.full((nh, t_len), math.inf)
        self.live = torch.zeros(nh, t_len, dtype=torch.bool)
        self.phi = torch.zeros(nh)
        self.shift = {}  # FoX Pro's shifted projections: the previous token's rows

    def step(self, attn: Attention, x, i: int, tau):
        q, k, v = attn.qkv(x, torch.tensor([i]), self.shift)
        beta = attn.beta()
        nh, t_len = self.lvl.shape
        margin = torch.zeros(nh, t_len)
        if attn.cfg.attention != "softmax":
            d, u = attn.walk(x[0, 0])
            self.phi = self.phi + d  # float32, one step at a time
            lvl_i = self.phi if u is None else self.phi + u
            self.lvl[:, i] = lvl_i
            thr = torch.where(beta > 0, tau / beta, torch.tensor(math.inf)) if tau is not None \
                else torch.full((nh,), math.inf)
            margin[:, : i + 1] = (self.lvl[:, : i + 1] - self.phi[:, None]) - thr[:, None]
            dies = (self.lvl[:, :i] - self.phi[:, None]) >= thr[:, None]
            self.live[:, :i] &= ~dies
        else:
            margin[:, : i + 1] = -math.inf
        self.k[:, i], self.v[:, i], self.live[:, i] = k[0, :, 0], v[0, :, 0], True
        self.m[:, :i] = torch.minimum(self.m[:, :i], self.phi[:, None])
        s = (self.k[:, : i + 1] @ q[0, :, 0, :, None])[..., 0] / math.sqrt(attn.cfg.head_dim)
        if attn.cfg.attention != "softmax":
            s = s - beta[:, None] * F.relu(self.lvl[:, : i + 1] - self.m[:, : i + 1])
        s = s.masked_fill(~self.live[:, : i + 1], -math.inf)
        out = (torch.softmax(s, dim=-1)[:, None, :] @ self.v[:, : i + 1])[:, 0]  # [H, hd]
        return attn.output(x, out.reshape(1, 1, -1)), self.live[:, :].clone(), margin

"""Regenerates the golden vectors in tests/vectors/ (format: docs/model-format.md).

Each random-weight case is a small model (config.json, model.safetensors) plus case.safetensors
with the reference's full-cache and evicting step-by-step decodes. Each case's tau is picked so
that about half of the keys are evicted by the end of the sequence (softmax evicts nothing).
The `shipped` case runs the trained default model, models/fpa-v2, on a short prompt; its directory holds only
case.safetensors, and `__metadata__["model_dir"]` names the model (relative to the repo root).

    /usr/bin/python3 train/make_vectors.py [--out tests/vectors]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402
from export import load_model, save_model  # noqa: E402
from reference import Config, Model, decode_steps, encode  # noqa: E402

ROOT = os.path.dirname(HERE)
PROMPT = ("The grass is green. The pass key is 71432. Remember it. 71432 is the pass key. "
          "What is the pass key? The pass key is")
# A case longer than PROMPT reads on into the passkey test's filler (docs/fpa.md section 6); the
# first tokens stay PROMPT's, so the short cases do not change.
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")
TEXT = PROMPT + " " + FILLER * 3
SMALL = dict(d_model=32, n_layers=2, n_heads=4, head_dim=16, d_ff=64, train_len=48)
CASES = {
    # name: (config overrides, init overrides)
    "fpa_free": (dict(attention="fpa", levels="free", tie_embeddings=False), dict(seed=1)),
    "fpa_tied": (dict(attention="fpa", levels="tied"), dict(seed=2, field_bias=-0.5)),
    "fox": (dict(attention="fox", levels="tied"), dict(seed=3, field_bias=2.0)),
    "softmax": (dict(attention="softmax", levels="tied", rope_theta=10000.0), dict(seed=4)),
    # Long enough (20 pages of 16 slots) that the CUDA backend splits a stream's cached keys
    # (attention_splits > 1, combine_kernel), at a production head_dim; one layer and two heads
    # keep the [T, L, H, T] tensors small.
    "long": (dict(attention="fpa", levels="free", n_layers=1, n_heads=2, head_dim=128,
                  train_len=320), dict(seed=5)),
}
TAUS = [0.5 * k for k in range(1, 81)]


def random_model(cfg: Config, seed: int, field_bias: float = 0.0) -> Model:
    model = Model(cfg).init_weights(seed, field_bias=field_bias)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # vary the walk's drift and beta across heads
        for block in model.layers:
            a = block.attn
            if cfg.attention != "softmax":
                a.field_b.add_(0.3 * torch.randn(cfg.n_heads, generator=g))
            if cfg.attention == "fpa":
                a.beta_raw.copy_(torch.linspace(-1.0, 1.5, cfg.n_heads))
    return model.eval()


def evicted_share(model: Model, tokens, tau: float) -> float:
    live = decode_steps(model, tokens, tau)["live"]
    return 1.0 - live[-1].float().mean().item()


def pick_tau(model: Model, tokens) -> float:
    """The tau from TAUS whose final evicted share is closest to one half."""
    if model.cfg.attention == "softmax":
        return 20.0
    return min(TAUS, key=lambda tau: abs(evicted_share(model, tokens, tau) - 0.5))


def case_tensors(model: Model, tokens, tau: float) -> dict:
    full = decode_steps(model, tokens, None)
    evict = decode_steps(model, tokens, tau)
    out = {"tokens": tokens.to(torch.int32), "logits": full["logits"],
           "evict_logits": evict["logits"], "live": evict["live"].to(torch.uint8),
           "margin": evict["margin"]}
    out.update({f"layer_out.{i}": h for i, h in enumerate(full["layer_out"])})
    return out


def write_case(out_dir: str, name: str, model: Model, tokens, tau: float, meta=None) -> float:
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    safetensors_io.save(os.path.join(case_dir, "case.safetensors"),
                        case_tensors(model, tokens, tau),
                        {"tau": repr(float(tau)), "kind": model.cfg.attention, **(meta or {})})
    live = decode_steps(model, tokens, tau)["live"][-1]
    return 1.0 - live.float().mean().item()


def make_random_case(out_dir: str, name: str, tau: float | None = None) -> str:
    """Writes one random-weight case; `tau` skips the search (tests pass the committed one)."""
    cfg_over, init = CASES[name]
    cfg = Config(**{**SMALL, **cfg_over})
    tokens = torch.tensor(encode(TEXT)[: cfg.train_len])
    assert len(tokens) == cfg.train_len, "TEXT is shorter than the case"
    model = random_model(cfg, **init)
    cfg.tau = pick_tau(model, tokens) if tau is None else tau
    save_model(model, os.path.join(out_dir, name), {"note": f"random weights, {init}"})
    share = write_case(out_dir, name, model, tokens, cfg.tau)
    return f"{name}: tau={cfg.tau} evicted share at the end {share:.2f}"


def make_shipped_case(out_dir: str, model_rel: str = "models/fpa-v2") -> str | None:
    path = os.path.join(ROOT, model_rel)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        return None
    model = load_model(path)
    tokens = torch.tensor(encode(PROMPT)[:40])
    share = write_case(out_dir, "shipped", model, tokens, model.cfg.tau, {"model_dir": model_rel})
    return f"shipped: tau={model.cfg.tau} evicted share at the end {share:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "vectors"))
    ap.add_argument("--cases", nargs="*", default=list(CASES) + ["shipped"])
    args = ap.parse_args()
    torch.manual_seed(0)
    for name in args.cases:
        line = make_shipped_case(args.out) if name == "shipped" else make_random_case(args.out, name)
        print(line or f"{name}: skipped (no trained model yet)")


if __name__ == "__main__":
    main()

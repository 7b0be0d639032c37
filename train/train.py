"""Trains a reference model on the data mix of data.py and exports it (docs/model-format.md).

    /usr/bin/python3 train/train.py --name fpa --kind fpa --steps 600 --export models/fpa-tiny

Progress goes to a tqdm line; every --eval-every steps it prints held-out perplexity and passkey
accuracy at 1x and 2x the training length (full cache and evicting at tau, with the live
fraction), and writes train/runs/<name>/ckpt.pt.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from data import Batches, Mix, heldout_tokens  # noqa: E402
from eval_passkey import passkey_eval, perplexity  # noqa: E402
from export import load_model, save_model  # noqa: E402
from reference import Config, Model  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--kind", choices=["fpa", "fox", "softmax"], required=True)
    ap.add_argument("--levels", choices=["free", "tied"], default="free")
    ap.add_argument("--d-model", type=int, default=160)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=512, help="the training length")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--short-len", type=int, default=256,
                    help="length of the first --short-frac of the steps (same tokens per step)")
    ap.add_argument("--short-frac", type=float, default=0.6)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tau", type=float, default=20.0)
    ap.add_argument("--answer-weight", type=float, default=5.0)
    ap.add_argument("--passkey-share", type=float, default=0.6)
    ap.add_argument("--nested-share", type=float, default=0.15)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--export", default=None, help="model directory to write at the end")
    ap.add_argument("--init", default=None, help="start from this model directory's weights")
    return ap.parse_args(argv)


def build_model(args) -> Model:
    kind = args.kind
    cfg = Config(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                 head_dim=args.head_dim, d_ff=args.d_ff, attention=kind,
                 levels=args.levels if kind == "fpa" else "tied",
                 rope_theta=10000.0 if kind == "softmax" else 0.0,
                 train_len=args.seq_len, tau=args.tau)
    # FPA starts with an almost flat walk (close to NoPE softmax) and learns its dips; FoX starts
    # with forget gates near sigmoid(3) = 0.95, a mild decay.
    return Model(cfg).init_weights(args.seed, field_bias=3.0 if kind == "fox" else 0.0,
                                   walk_std=0.1, embed_std=1.0 / math.sqrt(args.d_model),
                                   out_scale=1.0 / math.sqrt(2 * args.layers))


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def batch_at(step: int, args, batches: Batches):
    """Short rows (more of them) for the first part of training: the quadratic attention makes
    them cheaper per token, and the long rows at the end teach the full training length."""
    if step < args.short_frac * args.steps:
        return batches.batch(args.short_len, args.batch * args.seq_len // args.short_len)
    return batches.batch(args.seq_len, args.batch)


def optimizer(model: Model, lr: float):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and n != "embed.weight"]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and n != "embed.weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def run_eval(model: Model, args, heldout) -> dict:
    model.eval()
    out = {"ppl": perplexity(model, heldout, args.seq_len, max_chunks=6)}
    for mult in (1, 2):
        n = mult * args.seq_len
        out[f"pk{mult}x"] = passkey_eval(model, n, args.eval_samples, seed=1)[0]
        if args.kind != "softmax":
            acc, live = passkey_eval(model, n, args.eval_samples, seed=1, tau=args.tau)
            out[f"pk{mult}x_evict"], out[f"live{mult}x"] = acc, live
    model.train()
    return out


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    run_dir = os.path.join(HERE, "runs", args.name)
    os.makedirs(run_dir, exist_ok=True)
    model = build_model(args)
    if args.init:
        model.load_state_dict(load_model(args.init).state_dict())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.name}: {n_params / 1e6:.2f} M parameters, config {dataclasses.asdict(model.cfg)}")
    opt = optimizer(model, args.lr)
    mix = Mix(passkey=args.passkey_share, nested=args.nested_share,
              answer_weight=args.answer_weight)
    batches = Batches(args.seed, mix)
    heldout = heldout_tokens()
    t0, history = time.time(), []
    bar = tqdm(range(args.steps), desc=args.name, mininterval=10, file=sys.stdout)
    for step in bar:
        x, y, w = batch_at(step, args, batches)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        ce = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none")
        loss = (ce * w.flatten()).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            ev = {"step": step + 1, "wall_s": round(time.time() - t0), "loss": loss.item(),
                  **run_eval(model, args, heldout)}
            history.append(ev)
            tqdm.write(json.dumps(ev), file=sys.stdout)
            torch.save({"model": model.state_dict(), "config": dataclasses.asdict(model.cfg),
                        "training": provenance(args, n_params, history, t0)},
                       os.path.join(run_dir, "ckpt.pt"))
    if args.export:
        save_model(model, args.export, provenance(args, n_params, history, t0))
        print(f"exported {args.export}")


def provenance(args, n_params: int, history: list, t0: float) -> dict:
    return {"command": "/usr/bin/python3 train/train.py " + " ".join(sys.argv[1:]),
            "seed": args.seed, "steps": history[-1]["step"] if history else 0,
            "tokens_seen": (history[-1]["step"] if history else 0) * args.batch * args.seq_len,
            "schedule": f"first {args.short_frac:.0%} of steps at length {args.short_len}",
            "wall_s": round(time.time() - t0), "parameters": n_params,
            "data": "train/data.py: passkey/nested/English mix "
                    f"({args.passkey_share}/{args.nested_share}), answer weight "
                    f"{args.answer_weight}; English from /usr/share/common-licenses",
            "eval": history[-1] if history else {}}


if __name__ == "__main__":
    main()

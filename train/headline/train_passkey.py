"""Passkey-focused FPA training on the dense curriculum (dense_data.py), against a wall-clock
deadline: the learning rate follows warmup + cosine over the time left, not over a step count,
so the run ends (and exports its best checkpoint) when told, however busy the machine is.

    nohup /usr/bin/python3 train/headline/train_passkey.py --init train/runs/fpa/ckpt.pt \
        --minutes 40 --export models/fpa-passkey > train/runs/headline.log 2>&1 &

Every --eval-every steps a JSON line: held-out perplexity and passkey accuracy at 1x/2x/4x the
training length, full cache and evicting at tau (with the live fraction). The best evaluation
(mean evicting accuracy, then 4x, then perplexity) is kept as train/runs/headline/best.pt.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import evals  # noqa: E402
import fast  # noqa: E402
from data import heldout_tokens  # noqa: E402
from dense_data import DenseBatches  # noqa: E402
from export import save_model  # noqa: E402
from reference import Config, Model  # noqa: E402
from train import optimizer  # noqa: E402

RUN_DIR = os.environ.get("HEADLINE_RUN_DIR", os.path.join(HERE, "..", "runs", "headline"))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default=None, help="warm start from a train.py checkpoint")
    ap.add_argument("--reset-walk", nargs="*", default=[], metavar="L.H",
                    help="heads whose walk restarts almost flat (global attention again)")
    ap.add_argument("--pin-walk", nargs="*", default=[], metavar="L.H",
                    help="heads whose walk rises by a fixed 0.1 a token (levels still learnt)")
    ap.add_argument("--minutes", type=float, required=True, help="training wall-clock budget")
    ap.add_argument("--tokens-per-step", type=int, default=2048)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--long-share", type=float, nargs=2, default=[0.2, 0.5],
                    help="share of 512-token steps at the start and at the end")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--answer-weight", type=float, default=8.0)
    ap.add_argument("--copy-weight", type=float, default=2.0)
    ap.add_argument("--text-share", type=float, default=0.15)
    ap.add_argument("--repeat-share", type=float, default=0.3,
                    help="share of rows that repeat a random string (induction-head task)")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-samples", type=int, default=6)
    ap.add_argument("--eval-mults", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--export", default=None)
    return ap.parse_args(argv)


def load_init(path: str | None, seed: int) -> Model:
    if path:
        ck = torch.load(path, map_location="cpu")
        model = Model(Config(**ck["config"]))
        model.load_state_dict(ck["model"])
        return model
    cfg = Config(d_model=160, n_layers=3, n_heads=2, head_dim=64, d_ff=512)
    return Model(cfg).init_weights(seed, walk_std=0.1, embed_std=1.0 / math.sqrt(160),
                                   out_scale=1.0 / math.sqrt(6))


def reset_walk(model: Model, heads: list[str], seed: int) -> None:
    """A head whose walk dips hundreds of logits per filler group gets no gradient from distant
    keys (their weight is ~exp(-pen)); restarting its walk near flat makes it global again, a
    candidate for the retrieval (induction) head."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for spec in heads:
            li, hd = (int(v) for v in spec.split("."))
            attn = model.layers[li].attn
            for w, b in ((attn.field_w, attn.field_b), (attn.level_w, attn.level_b)):
                w[hd] = torch.randn(w.shape[1], generator=g) * 0.1 / math.sqrt(w.shape[1])
                b[hd] = 0.0


def pin_walk(model: Model, heads: list[str], seed: int) -> None:
    """A walk that rises by a constant 0.1 a token never dips, so the penalty of key j is
    beta * max(0, u_j - 0.1) whatever the distance: the head stays global (it cannot turn into
    a local head, the attractor the language-model loss pulls every head into) and still
    evicts by content through its learnt levels u_j, the same way at any length."""
    for spec in heads:
        li, hd = (int(v) for v in spec.split("."))
        attn = model.layers[li].attn
        if not (attn.field_w[hd].abs().max() == 0 and attn.field_b[hd] == 0.1):
            reset_walk(model, [spec], seed)  # not pinned yet: fresh levels too
        with torch.no_grad():
            attn.field_w[hd] = 0.0
            attn.field_b[hd] = 0.1
        mask = torch.ones(attn.cfg.n_heads)
        mask[hd] = 0.0
        attn.field_w.register_hook(lambda g, m=mask: g * m[:, None])
        attn.field_b.register_hook(lambda g, m=mask: g * m)


def lr_at(step: int, frac: float, args) -> float:
    """Linear warmup over steps, then cosine to 10% over the fraction of wall time used."""
    warm = min(1.0, (step + 1) / args.warmup)
    return args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def pick_length(step_frac: float, gen: torch.Generator, args) -> int:
    lo, hi = args.long_share
    if torch.rand(1, generator=gen).item() < lo + (hi - lo) * step_frac:
        return args.lengths[-1]
    short = args.lengths[:-1]
    return short[int(torch.randint(len(short), (1,), generator=gen))]


def run_eval(model: Model, args, heldout, tau: float) -> dict:
    model.eval()
    out = {"ppl": evals.perplexity(model, heldout, model.cfg.train_len, max_chunks=6)}
    for mult in args.eval_mults:
        n = mult * model.cfg.train_len
        out[f"pk{mult}x"] = evals.passkey_eval(model, n, args.eval_samples, seed=1)[0]
        acc, live = evals.passkey_eval(model, n, args.eval_samples, seed=1, tau=tau)
        out[f"pk{mult}x_evict"], out[f"live{mult}x"] = acc, round(live, 4)
    model.train()
    return out


def score(ev: dict) -> tuple:
    evict = [v for k, v in ev.items() if k.endswith("x_evict")]
    return (sum(evict), evict[-1], -ev["ppl"])


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(RUN_DIR, exist_ok=True)
    model = load_init(args.init, args.seed)
    reset_walk(model, args.reset_walk, args.seed)
    pin_walk(model, args.pin_walk, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"headline: {n_params / 1e6:.2f} M parameters, {dataclasses.asdict(model.cfg)}",
          flush=True)
    opt = optimizer(model, args.lr)
    data = DenseBatches(args.seed, args.text_share, args.answer_weight, args.copy_weight,
                        args.repeat_share)
    gen = torch.Generator().manual_seed(args.seed)
    heldout = heldout_tokens()
    t0, budget, history, best = time.time(), args.minutes * 60, [], None
    step = 0
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0:
            break
        t = pick_length(frac, gen, args)
        x, y, w = data.batch(t, max(1, args.tokens_per_step // t))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, frac, args)
        ce = F.cross_entropy(fast.forward(model, x).flatten(0, 1), y.flatten(), reduction="none")
        loss = (ce * w.flatten()).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            print(f"step {step} len {t} loss {loss.item():.3f} "
                  f"{(time.time() - t0) / step:.2f}s/step", flush=True)
        if step % args.eval_every == 0:
            best = checkpoint(model, args, heldout, step, t0, n_params, history, best)
    if not history or history[-1]["step"] != step:
        best = checkpoint(model, args, heldout, step, t0, n_params, history, best)
    if args.export:
        ck = torch.load(os.path.join(RUN_DIR, "best.pt"), map_location="cpu")
        model.load_state_dict(ck["model"])
        save_model(model, args.export, ck["training"])
        print(f"exported best (step {ck['training']['steps']}) to {args.export}", flush=True)


def checkpoint(model, args, heldout, step, t0, n_params, history, best):
    ev = {"step": step, "wall_s": round(time.time() - t0),
          **run_eval(model, args, heldout, model.cfg.tau)}
    history.append(ev)
    print(json.dumps(ev), flush=True)
    state = {"model": model.state_dict(), "config": dataclasses.asdict(model.cfg),
             "training": provenance(args, n_params, history, t0)}
    torch.save(state, os.path.join(RUN_DIR, "ckpt.pt"))
    if best is None or score(ev) >= best:
        torch.save(state, os.path.join(RUN_DIR, "best.pt"))
        return score(ev)
    return best


def provenance(args, n_params: int, history: list, t0: float) -> dict:
    return {"command": "/usr/bin/python3 train/headline/train_passkey.py " + " ".join(sys.argv[1:]),
            "seed": args.seed, "steps": history[-1]["step"], "wall_s": round(time.time() - t0),
            "parameters": n_params, "warm_start": args.init,
            "data": "train/headline/dense_data.py: one passkey episode per row (rows of "
                    f"{args.lengths} tokens), English share {args.text_share}, repeated random strings "
                    f"share {args.repeat_share}, answer weight "
                    f"{args.answer_weight}, in-needle copy weight {args.copy_weight}",
            "eval": history[-1]}


if __name__ == "__main__":
    main()

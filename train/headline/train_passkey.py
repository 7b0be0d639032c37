"""Passkey-focused training on the dense curriculum (dense_data.py), with a budget of wall-clock
minutes (the learning rate follows warmup + cosine over the time left, so the run ends when told,
however busy the machine is) or of steps (the schedule over steps: equal budgets for fpa, fox and
softmax).

    nohup /usr/bin/python3 train/headline/train_passkey.py --init train/runs/fpa/ckpt.pt \
        --minutes 40 --export models/fpa-passkey > train/runs/headline.log 2>&1 &

The second-generation recipe (models/README.md) builds the model from scratch (--kind), draws
filler and wording from texts.py (--varied) and adds the learnt cache budget (budget.py):

    nice -n 19 /usr/bin/python3 train/headline/train_passkey.py --kind fpa --steps 20000 \
        --varied --budget-weight 1 --threads 1 --run-dir train/runs/gen2-fpa

Every --ckpt-every steps the run's whole state (model, optimizer, data and schedule position)
goes to RUN_DIR/ckpt.pt; `--resume RUN_DIR` continues from it with the saved arguments, exactly
as if never stopped. Every --eval-every steps a JSON line: held-out perplexity and passkey accuracy
at each --eval-mults multiple of the training length, full cache and evicting at tau (with the
live fraction), and evicting on the held-out filler and question (texts.py). The best evaluation
(mean evicting accuracy, then the longest, then perplexity) is kept as RUN_DIR/best.pt.
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
import texts  # noqa: E402
from budget import REDUCE, Gate, budget_loss  # noqa: E402
from reference import KINDS, Config, Model  # noqa: E402
from train import build_model, optimizer  # noqa: E402

RUN_DIR = os.environ.get("HEADLINE_RUN_DIR", os.path.join(HERE, "..", "runs", "headline"))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default=None, help="warm start from a train.py checkpoint")
    ap.add_argument("--kind", choices=KINDS, default="fpa",
                    help="attention of the model built from scratch without --init")
    ap.add_argument("--reset-walk", nargs="*", default=[], metavar="L.H",
                    help="heads whose walk restarts almost flat (global attention again)")
    ap.add_argument("--pin-walk", nargs="*", default=[], metavar="L.H",
                    help="heads whose walk rises by a fixed 0.1 a token (levels still learnt)")
    ap.add_argument("--minutes", type=float, default=None, help="training wall-clock budget")
    ap.add_argument("--steps", type=int, default=None, help="training step budget instead")
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
    ap.add_argument("--varied", type=int, nargs="?", const=1, default=0, choices=(0, 1, 2),
                    help="filler families and wordings from texts.py (its held-out ones "
                         "excluded); 2 also varies the answer cue (texts.CUE_QUESTIONS)")
    ap.add_argument("--budget-weight", type=float, default=0.0,
                    help="weight of the learnt cache budget (budget.py) once retrieval is right")
    ap.add_argument("--budget-target", type=float, default=0.15,
                    help="share of the keys each head may keep before the budget term pushes it")
    ap.add_argument("--budget-temp", type=float, default=4.0,
                    help="width (logits of penalty) of the soft eviction step")
    ap.add_argument("--budget-reduce", choices=sorted(REDUCE), default="mean",
                    help="how the per-head hinges combine (sum: every head gets the full weight)")
    ap.add_argument("--gate", type=float, default=0.9,
                    help="running answer-digit accuracy under which the budget term is off")
    ap.add_argument("--penalty-warmup", type=int, default=0, metavar="STEPS",
                    help="scale every head's penalty (FPA's beta, FoX's decay) from 0 to 1 over "
                         "these first steps, so that no head is local before retrieval forms")
    ap.add_argument("--eval-every", type=int, default=50, help="0: never")
    ap.add_argument("--eval-samples", type=int, default=6)
    ap.add_argument("--eval-mults", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--run-dir", default=RUN_DIR)
    ap.add_argument("--resume", metavar="RUN_DIR", default=None,
                    help="continue RUN_DIR's run from its last checkpoint, with its saved "
                         "arguments (only --stop-after, --threads and --export may change)")
    ap.add_argument("--stop-after", type=int, default=None, metavar="N",
                    help="checkpoint and stop after N steps of this invocation (the schedule "
                         "stays that of the whole budget: resume later)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 2)")
    ap.add_argument("--export", default=None)
    args = ap.parse_args(argv)
    if args.resume:
        return resumed_args(args)
    if (args.minutes is None) == (args.steps is None):
        ap.error("give exactly one of --minutes and --steps")
    if not 0.0 <= args.gate < 1.0:
        ap.error("--gate must be in [0, 1)")
    args.command = "/usr/bin/python3 train/headline/train_passkey.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    return args


def resumed_args(cli: argparse.Namespace) -> argparse.Namespace:
    saved = torch.load(os.path.join(cli.resume, "ckpt.pt"), map_location="cpu")["args"]
    args = argparse.Namespace(**{**vars(parse_args(["--steps", "1"])), **saved})
    args.resume, args.run_dir = cli.resume, cli.resume
    args.threads, args.stop_after = cli.threads or args.threads, cli.stop_after
    args.export = cli.export or args.export
    return args


def load_init(args) -> Model:
    """The --init checkpoint, or a fresh model of --kind in the architecture of models/."""
    if args.init:
        ck = torch.load(args.init, map_location="cpu")
        model = Model(Config(**ck["config"]))
        model.load_state_dict(ck["model"])
        return model
    arch = argparse.Namespace(kind=args.kind, d_model=160, layers=3, heads=2, head_dim=64,
                              d_ff=512, levels="free", seq_len=512, tau=20.0, seed=args.seed)
    return build_model(arch)


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
    if args.varied:  # the held-out filler and question, at the longest multiple
        mult = max(args.eval_mults)
        n = mult * model.cfg.train_len
        out[f"heldout{mult}x_evict"] = evals.passkey_eval(
            model, n, args.eval_samples, seed=1, tau=tau, make_prompt=texts.heldout_prompt)[0]
    model.train()
    return out


def score(ev: dict) -> tuple:
    evict = [v for k, v in ev.items() if k.startswith("pk") and k.endswith("x_evict")]
    return (sum(evict), evict[-1], -ev["ppl"])


class Run:
    """Everything a checkpoint restores: model, optimizer, data stream, length draws, budget
    gate, schedule position (steps and wall time) and the evaluation history."""

    def __init__(self, args):
        self.model = load_init(args)
        self.opt = optimizer(self.model, args.lr)
        self.data = DenseBatches(args.seed, args.text_share, args.answer_weight,
                                 args.copy_weight, args.repeat_share, args.varied)
        self.gen = torch.Generator().manual_seed(args.seed)
        self.gate = Gate(args.budget_weight, args.gate)
        self.step, self.elapsed, self.history, self.best = 0, 0.0, [], None
        self.t_start = time.time()

    def wall(self) -> float:
        return self.elapsed + time.time() - self.t_start

    def frac(self, args) -> float:
        """Share of the budget used: steps, or wall-clock minutes."""
        return self.step / args.steps if args.steps else self.wall() / (args.minutes * 60)

    def state(self, args) -> dict:
        return {"model": self.model.state_dict(), "config": dataclasses.asdict(self.model.cfg),
                "optimizer": self.opt.state_dict(), "data_rng": self.data.rng.getstate(),
                "gen": self.gen.get_state(), "gate_acc": self.gate.acc, "step": self.step,
                "elapsed": self.wall(), "history": self.history, "best": self.best,
                "args": vars(args), "training": provenance(args, self, self.history)}

    def load(self, ck: dict) -> None:
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        self.data.rng.setstate(ck["data_rng"])
        self.gen.set_state(ck["gen"])
        self.gate.acc, self.step, self.elapsed = ck["gate_acc"], ck["step"], ck["elapsed"]
        self.history, self.best = ck["history"], ck["best"]
        self.t_start = time.time()


def train_step(run: Run, args) -> dict:
    """One optimizer step; returns what the log prints."""
    frac = run.frac(args)
    t = pick_length(frac, run.gen, args)
    x, y, w = run.data.batch(t, max(1, args.tokens_per_step // t))
    for g in run.opt.param_groups:
        g["lr"] = lr_at(run.step, frac, args)
    excesses = [] if args.budget_weight else None
    scale = min(1.0, run.step / args.penalty_warmup) if args.penalty_warmup else 1.0
    logits = fast.forward(run.model, x, excesses=excesses, penalty_scale=scale)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    loss = (ce * w.flatten()).sum() / w.sum()
    answers = w == args.answer_weight
    acc = (logits.argmax(-1) == y)[answers].float().mean().item() if answers.any() else 0.0
    weight = run.gate.update(acc)
    total = loss
    out = {"len": t, "loss": loss.item(), "digit_acc": acc}
    if excesses:
        budget, shares = budget_loss(excesses, run.model.cfg.tau, args.budget_temp,
                                     args.budget_target, args.budget_reduce)
        total = loss + weight * budget
        out.update(budget=budget.item(), weight=weight, live=shares.mean().item())
    run.opt.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
    run.opt.step()
    run.step += 1
    return out


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads or 2)
    torch.manual_seed(args.seed)
    os.makedirs(args.run_dir, exist_ok=True)
    run = Run(args)
    if args.resume:
        run.load(torch.load(os.path.join(args.run_dir, "ckpt.pt"), map_location="cpu"))
    else:
        reset_walk(run.model, args.reset_walk, args.seed)
    pin_walk(run.model, args.pin_walk, args.seed)
    n_params = sum(p.numel() for p in run.model.parameters())
    print(f"headline: {n_params / 1e6:.2f} M parameters, step {run.step}, "
          f"{dataclasses.asdict(run.model.cfg)}", flush=True)
    heldout, t_log, logs, first = heldout_tokens(), time.time(), [], run.step
    while run.frac(args) < 1.0 and run.step - first < (args.stop_after or math.inf):
        logs.append(train_step(run, args))
        if run.step % 10 == 0:
            print(log_line(run, logs, time.time() - t_log), flush=True)
            t_log, logs = time.time(), []
        if args.eval_every and run.step % args.eval_every == 0:
            evaluate(run, args, heldout)
        if run.step % args.ckpt_every == 0:
            save(run, args, "ckpt.pt")
    save(run, args, "ckpt.pt")
    if args.export and run.frac(args) >= 1.0:
        export(run, args)


def log_line(run: Run, logs: list, seconds: float) -> str:
    """Means over the steps since the last line."""
    keys = [k for k in logs[-1] if k != "len"]
    means = " ".join(f"{k} {sum(d[k] for d in logs) / len(logs):.3f}" for k in keys)
    return f"step {run.step} len {logs[-1]['len']} {means} {seconds / len(logs):.2f}s/step"


def evaluate(run: Run, args, heldout) -> None:
    ev = {"step": run.step, "wall_s": round(run.wall()),
          **run_eval(run.model, args, heldout, run.model.cfg.tau)}
    run.history.append(ev)
    print(json.dumps(ev), flush=True)
    if run.best is None or score(ev) >= tuple(run.best):
        run.best = score(ev)
        save(run, args, "best.pt")


def save(run: Run, args, name: str) -> None:
    """Written to a temporary name first: a run stopped mid-write keeps its last checkpoint."""
    path = os.path.join(args.run_dir, name)
    torch.save(run.state(args), path + ".tmp")
    os.replace(path + ".tmp", path)


def export(run: Run, args) -> None:
    """The best evaluation's model (or the last one, if none was evaluated)."""
    best = os.path.join(args.run_dir, "best.pt")
    ck = torch.load(best if os.path.exists(best) else os.path.join(args.run_dir, "ckpt.pt"),
                    map_location="cpu")
    run.model.load_state_dict(ck["model"])
    save_model(run.model, args.export, ck["training"])
    print(f"exported step {ck['step']} to {args.export}", flush=True)


def provenance(args, run: Run, history: list) -> dict:
    data = (f"train/headline/dense_data.py: one passkey episode per row (rows of {args.lengths} "
            f"tokens), English share {args.text_share}, repeated random strings share "
            f"{args.repeat_share}, answer weight {args.answer_weight}, in-needle copy weight "
            f"{args.copy_weight}")
    if args.varied:
        data += (", filler families and wordings of train/headline/texts.py (held out: filler "
                 f"{texts.HELD_OUT_FILLER!r}, question {texts.HELD_OUT_QUESTION!r})")
    return {"command": args.command, "seed": args.seed, "steps": run.step,
            "penalty_warmup": args.penalty_warmup,
            "tokens_seen": run.step * args.tokens_per_step, "wall_s": round(run.wall()),
            "parameters": sum(p.numel() for p in run.model.parameters()),
            "warm_start": args.init, "data": data,
            "budget": {"weight": args.budget_weight, "target": args.budget_target,
                       "temp": args.budget_temp, "gate": args.gate,
                       "reduce": args.budget_reduce},
            "eval": history[-1] if history else {}}


if __name__ == "__main__":
    main()

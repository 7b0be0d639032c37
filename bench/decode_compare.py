"""Decode throughput, C++ CPU backend vs the PyTorch reference with a KV cache, side by side in
one run: builds a random-weight model with the shipped model's shape (models/fpa-tiny's
config.json when present, else the reference's defaults), runs build*/bench/fpa-decode-bench and
bench/decode_reference.py over the same batches, contexts and token streams, and prints a
markdown table with tokens/s, the ratio and the live fraction each side measured.

    /usr/bin/python3 bench/decode_compare.py [--bench build-engine/bench/fpa-decode-bench]
        [--batch 1 8 32] [--context 256 2048] [--steps 64] [--threads 0] [--field-bias -0.1]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "train"))
import decode_reference  # noqa: E402
from export import load_model, save_model  # noqa: E402
from reference import Config, Model  # noqa: E402


def shipped_shape() -> dict:
    path = os.path.join(ROOT, "models", "fpa-tiny", "config.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        cfg = json.load(f)
    keys = ("d_model", "n_layers", "n_heads", "head_dim", "d_ff", "attention", "levels",
            "tie_embeddings", "tau", "rope_theta")
    return {k: cfg[k] for k in keys if k in cfg}


def find_bench(path: str | None) -> str:
    if path:
        return path
    found = sorted(glob.glob(os.path.join(ROOT, "build*", "bench", "fpa-decode-bench")),
                   key=os.path.getmtime)
    if not found:
        sys.exit("fpa-decode-bench not built: cmake --build build --target fpa-decode-bench")
    return found[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="fpa-decode-bench binary (default: newest build*/bench/)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--evict", nargs="+", default=["on", "off"])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--windows", type=int, default=4,
                    help="timing windows per run; the fastest window's rate is reported")
    ap.add_argument("--threads", type=int, default=0, help="C++ threads and torch threads; 0 = all")
    ap.add_argument("--field-bias", type=float, default=-0.1,
                    help="the walk's drift in the random model (sets how much is evicted)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count())  # the same cores for both sides
    with tempfile.TemporaryDirectory() as model_dir:
        shape = shipped_shape()
        model = Model(Config(**shape)).init_weights(args.seed, field_bias=args.field_bias)
        save_model(model, model_dir, {"note": f"random weights for bench/decode_compare.py, "
                                              f"seed {args.seed}, field_bias {args.field_bias}"})
        cmd = [find_bench(args.bench), f"--model={model_dir}", f"--threads={args.threads}",
               f"--steps={args.steps}", f"--windows={args.windows}", "--batch=" + ",".join(map(str, args.batch)),
               "--context=" + ",".join(map(str, args.context)), "--evict=" + ",".join(args.evict)]
        cpp = [json.loads(line) for line in subprocess.run(
            cmd, check=True, capture_output=True, text=True).stdout.splitlines()]
        model = load_model(model_dir)
        py = [decode_reference.run(model, r["batch"], r["context"], r["evict"], args.steps,
                                   model.cfg.tau, args.windows) for r in cpp]
    cfg = model.cfg
    print(f"model: random weights, {cfg.attention} ({cfg.levels} levels), d_model {cfg.d_model}, "
          f"{cfg.n_layers} layers, {cfg.n_heads} heads x {cfg.head_dim}, d_ff {cfg.d_ff}, "
          f"tau {cfg.tau}; {args.steps} timed steps in {args.windows} windows, the fastest "
          f"window's rate reported; torch threads {torch.get_num_threads()}\n")
    print("| batch | context | eviction | C++ tokens/s | PyTorch tokens/s | ratio | live fraction "
          "(C++ / PyTorch) | C++ prefill tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for c, p in zip(cpp, py):
        print(f"| {c['batch']} | {c['context']} | {'on' if c['evict'] else 'off'} | "
              f"{c['tokens_per_s']:.0f} | {p['tokens_per_s']:.1f} | "
              f"{c['tokens_per_s'] / p['tokens_per_s']:.1f}x | "
              f"{c['live_fraction']:.3f} / {p['live_fraction']:.3f} | "
              f"{c['prefill_tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()

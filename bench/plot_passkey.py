#!/usr/bin/env python3
"""Plots bench/passkey.py and bench/cache_curve.py results (matplotlib, headless).

  /usr/bin/python3 bench/plot_passkey.py --passkey out/fpa.json [out/fox.json ...] \
      --curve out/curve.json --out-dir bench
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def accuracy_by_length(records, policy, budget):
    by_len = {}
    for r in records:
        if r["policy"] == policy and r["budget"] == budget:
            by_len.setdefault(r["length"], []).append(r["correct"])
    return sorted((n, statistics.mean(v)) for n, v in by_len.items())


def plot_accuracy(runs, path):
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        series = sorted({(r["policy"], r["budget"]) for r in run["records"]}, key=str)
        for policy, budget in series:
            pts = accuracy_by_length(run["records"], policy, budget)
            label = policy if budget is None else f"{policy} @ {budget}"
            ax.plot([n for n, _ in pts], [a for _, a in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("passkey accuracy")
        ax.set_title(f"{run['name']} ({run['model']}, train_len {run['train_len']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_curve(curve, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, pts in curve["curves"].items():
        label = policy if policy in ("none", "fpa") else f"{policy} @ {curve['budget']}"
        ax.plot([n for n, _, _ in pts], [h / 1e6 for _, h, _ in pts], marker=".", label=label)
    ax.set_xlabel("tokens processed")
    ax.set_ylabel("cache MB held")
    ax.set_title(f"one long request, {curve['model']} model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_matrix(runs):
    """Markdown: model x policy rows, one column per length, cells 'accuracy / bytes held'."""
    lengths = sorted({r["length"] for run in runs for r in run["records"]})
    print("| model | policy | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
    print("|---|---|" + "---|" * len(lengths))
    for run in runs:
        series = sorted({(r["policy"], r["budget"]) for r in run["records"]}, key=str)
        for policy, budget in series:
            cells = []
            for n in lengths:
                rs = [r for r in run["records"] if (r["policy"], r["budget"], r["length"]) ==
                      (policy, budget, n)]
                cells.append(f"{statistics.mean(r['correct'] for r in rs):.2f} / "
                             f"{statistics.mean(r['held_fraction'] for r in rs):.2f}"
                             if rs else "-")
            label = policy if budget is None else f"{policy} @ {budget}"
            print(f"| {run['name']} | {label} | " + " | ".join(cells) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passkey", nargs="*", default=[])
    p.add_argument("--curve")
    p.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = p.parse_args()
    if args.passkey:
        runs = [dict(json.load(open(f)), name=os.path.basename(f)[:-len(".json")])
                for f in args.passkey]
        print_matrix(runs)
        plot_accuracy(runs, os.path.join(args.out_dir, "passkey_accuracy.png"))
    if args.curve:
        plot_curve(json.load(open(args.curve)), os.path.join(args.out_dir, "cache_bytes.png"))


if __name__ == "__main__":
    main()

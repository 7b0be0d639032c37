#!/usr/bin/python3
"""CPU decode and prefill with float32 against bf16 projection weights (or KV cache pages), side
by side.

Writes random-weight models of bench/llama_cpp_compare.py's three shapes (fpa-tiny's, 25M and
85M parameters; softmax with RoPE and fpa) into bench/out/ (ignored), then runs
build/bench/fpa-decode-bench with --cpu_weights (or, with --vary kv_dtype, --kv_dtype) f32 and
bf16 in turn, round after round, and prints tokens/s of each, the ratio bf16/f32 (median over
rounds) and the share of the machine's read bandwidth the bf16 decode step reaches (weight bytes
plus the keys and values read per token, over the step time).

    /usr/bin/python3 bench/weights_compare.py --rounds 3
    /usr/bin/python3 bench/weights_compare.py --vary kv_dtype --context 4096 --batch 1,8
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from llama_cpp_compare import BANDWIDTH, SHAPES, weight_count, write_random  # noqa: E402


def run(bench, model, dtype, args):
    out = subprocess.check_output(
        [bench, f"--model={model}", f"--{args.vary}={dtype}", f"--batch={args.batch}",
         f"--context={args.context}", "--evict=off", f"--steps={args.steps}",
         f"--windows={args.windows}", f"--threads={args.threads}"], text=True)
    return [json.loads(line) for line in out.splitlines()]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", default=os.path.join(REPO, "build/bench/fpa-decode-bench"))
    p.add_argument("--shapes", default="tiny,25m,85m")
    p.add_argument("--attention", default="softmax,fpa")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--context", default="512")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vary", choices=("cpu_weights", "kv_dtype"), default="cpu_weights",
                   help="what is float32 against bf16: the projection weights or the KV pages")
    args = p.parse_args()
    out = os.path.join(REPO, "bench/out/weights_compare")
    os.makedirs(os.path.join(out, "models"), exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    print("| shape | attention | batch | context | f32 tok/s | bf16 tok/s | bf16/f32 (min-max) | "
          "f32 prefill tok/s | bf16 prefill tok/s | bf16 share of 28 GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        for attention in args.attention.split(","):
            model = write_random(out, name, attention)
            runs = {"f32": [], "bf16": []}
            for _ in range(args.rounds):
                for weights in ("f32", "bf16"):
                    runs[weights].append(run(args.bench, model, weights, args))
            _, layers, heads, _ = SHAPES[name]
            for i, row in enumerate(runs["f32"][0]):
                f32 = [r[i]["tokens_per_s"] for r in runs["f32"]]
                bf16 = [r[i]["tokens_per_s"] for r in runs["bf16"]]
                ratios = [b / a for a, b in zip(f32, bf16)]
                pf = [statistics.median(r[i]["prefill_tokens_per_s"] for r in runs[w])
                      for w in ("f32", "bf16")]
                # A step reads the weights once for the batch and each sequence's keys/values.
                weight_bytes, kv_bytes = (2, 4) if args.vary == "cpu_weights" else (4, 2)
                kv = row["batch"] * row["context"] * layers * heads * 64 * 2 * kv_bytes
                step_s = row["batch"] / statistics.median(bf16)
                share = (weight_count(name) * weight_bytes + kv) / step_s / BANDWIDTH
                print(f"| {name} | {attention} | {row['batch']} | {row['context']} | "
                      f"{statistics.median(f32):.0f} | {statistics.median(bf16):.0f} | "
                      f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
                      f"{pf[0]:.0f} | {pf[1]:.0f} | {share:.2f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

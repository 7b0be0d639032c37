#!/usr/bin/python3
"""CPU decode and prefill with float32 against bf16 or int8 projection weights (or bf16 KV cache
pages), side by side.

Writes random-weight models of bench/llama_cpp_compare.py's three shapes (fpa-tiny's, 25M and
85M parameters; softmax with RoPE and fpa) into bench/out/ (ignored), then runs
build/bench/fpa-decode-bench with --cpu_weights (or, with --vary kv_dtype, --kv_dtype) f32 and
the compact format in turn, round after round, and prints tokens/s of each, the ratio
compact/f32 (median over rounds) and the share of the machine's read bandwidth the compact
decode step reaches (weight bytes plus the keys and values read per token, over the step time,
against the bandwidth build/bench/fpa-machine-limits measures at that many bytes).

    /usr/bin/python3 bench/weights_compare.py --rounds 3 [--against int8]
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
from llama_cpp_compare import (  # noqa: E402
    SHAPES, WEIGHT_BYTES, machine_limits, read_bandwidth, weight_count, write_random)


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
                   help="what is float32 against the compact format: the projection weights or "
                        "the KV pages")
    p.add_argument("--against", choices=("bf16", "int8"), default="bf16",
                   help="the compact format (int8: projection weights only)")
    args = p.parse_args()
    if args.vary == "kv_dtype" and args.against != "bf16":
        p.error("KV pages are f32 or bf16")
    lim = machine_limits(args.bench, args.threads)
    out = os.path.join(REPO, "bench/out/weights_compare")
    os.makedirs(os.path.join(out, "models"), exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    c = args.against
    print(f"| shape | attention | batch | context | f32 tok/s | {c} tok/s | {c}/f32 (min-max) | "
          f"f32 prefill tok/s | {c} prefill tok/s | {c} share of the read bandwidth |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        for attention in args.attention.split(","):
            model = write_random(out, name, attention)
            runs = {"f32": [], c: []}
            for _ in range(args.rounds):
                for weights in ("f32", c):
                    runs[weights].append(run(args.bench, model, weights, args))
            _, layers, heads, _ = SHAPES[name]
            for i, row in enumerate(runs["f32"][0]):
                f32 = [r[i]["tokens_per_s"] for r in runs["f32"]]
                compact = [r[i]["tokens_per_s"] for r in runs[c]]
                ratios = [b / a for a, b in zip(f32, compact)]
                pf = [statistics.median(r[i]["prefill_tokens_per_s"] for r in runs[w])
                      for w in ("f32", c)]
                # A step reads the weights once for the batch and each sequence's keys/values.
                weight_bytes, kv_bytes = ((WEIGHT_BYTES[c], 4) if args.vary == "cpu_weights"
                                          else (4, 2))
                kv = row["batch"] * row["context"] * layers * heads * 64 * 2 * kv_bytes
                step_s = row["batch"] / statistics.median(compact)
                step_bytes = weight_count(name) * weight_bytes + kv
                share = step_bytes / step_s / read_bandwidth(lim, step_bytes)
                print(f"| {name} | {attention} | {row['batch']} | {row['context']} | "
                      f"{statistics.median(f32):.0f} | {statistics.median(compact):.0f} | "
                      f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
                      f"{pf[0]:.0f} | {pf[1]:.0f} | {share:.2f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

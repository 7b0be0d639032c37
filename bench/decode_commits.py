#!/usr/bin/python3
"""Decode throughput of two commits of the CPU backend, side by side in one interleaved run.

Builds `fpa-decode-bench` at each commit (git worktrees under build-commits/, ignored; ccache
makes the second build of a commit cheap), then runs A, B, A, B, ... on the same model and
prints each configuration's tokens/s per side and the ratio B/A per round and as a median.
This machine is noisy: only the ratios of one interleaved run are worth quoting.

    /usr/bin/python3 bench/decode_commits.py BASE HEAD --model models/fpa-tiny \\
        --batch 1,8 --context 4096 --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(REPO, "build-commits")


def build(commit):
    """The bench binary of `commit`, built in its own worktree."""
    sha = subprocess.check_output(["git", "-C", REPO, "rev-parse", "--short", commit],
                                  text=True).strip()
    tree = os.path.join(WORK, sha)
    if not os.path.isdir(tree):
        subprocess.check_call(["git", "-C", REPO, "worktree", "add", "--detach", "-q", tree, sha])
    build_dir = os.path.join(tree, "build")
    if not os.path.exists(os.path.join(build_dir, "build.ninja")):
        subprocess.check_call(["cmake", "-S", tree, "-B", build_dir, "-G", "Ninja",
                               "-DCMAKE_BUILD_TYPE=Release", "-DFPA_CUDA=OFF",
                               "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"],
                              stdout=subprocess.DEVNULL)
    subprocess.check_call(["cmake", "--build", build_dir, "--target", "fpa-decode-bench"],
                          stdout=subprocess.DEVNULL)
    return sha, os.path.join(build_dir, "bench", "fpa-decode-bench")


def run(binary, args):
    """tokens/s per (batch, context, evict) of one run."""
    out = subprocess.check_output([binary, "--model", args.model, "--batch", args.batch,
                                   "--context", args.context, "--evict", args.evict,
                                   "--steps", str(args.steps), "--windows", str(args.windows),
                                   "--threads", str(args.threads)],
                                  text=True, stderr=subprocess.DEVNULL)
    rows = {}
    for line in out.splitlines():
        d = json.loads(line)
        key = (d["batch"], d["context"], "on" if d["evict"] else "off")
        rows[key] = d["tokens_per_s"]
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base")
    p.add_argument("head")
    p.add_argument("--model", default=os.path.join(REPO, "models/fpa-tiny"))
    p.add_argument("--batch", default="1,8")
    p.add_argument("--context", default="4096")
    p.add_argument("--evict", default="off,on")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    os.makedirs(WORK, exist_ok=True)
    (a_sha, a_bin), (b_sha, b_bin) = build(args.base), build(args.head)
    ratios = {}
    print(f"tokens/s, A = {a_sha}, B = {b_sha}; {os.getloadavg()[0]:.1f} load at the start")
    for r in range(args.rounds):
        a, b = run(a_bin, args), run(b_bin, args)
        for key in sorted(a):
            ratios.setdefault(key, []).append(b[key] / a[key])
            print(f"round {r + 1} batch {key[0]:>3} context {key[1]:>5} evict {key[2]:>3}: "
                  f"A {a[key]:8.0f}  B {b[key]:8.0f}  B/A {b[key] / a[key]:.2f}")
    print(f"median B/A over {args.rounds} rounds; {os.getloadavg()[0]:.1f} load at the end")
    for key, rs in sorted(ratios.items()):
        print(f"batch {key[0]:>3} context {key[1]:>5} evict {key[2]:>3}: "
              f"{statistics.median(rs):.2f}x (min {min(rs):.2f}, max {max(rs):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The headline benchmark: passkey retrieval through a running fpa-serve, per eviction policy.

For each context length (multiples of the model's training length) and needle depth it sends the
same passkey prompts with every policy: `fpa` (the learned rule, no budget), `none` (full cache)
and the heuristics `window`, `sinks`, `h2o` at each budget: `auto` is the fraction of the cache
the fpa policy held on its own at that length, numbers are fixed fractions. It records accuracy,
cache bytes held vs a full cache (from each response's usage), and decode throughput (streamed
tokens after the first, per second). Bounded: --samples, --lengths and --time-limit.

  /usr/bin/python3 bench/passkey.py --address 127.0.0.1:50051 --json out.json --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "train"))
sys.path.insert(0, os.path.join(ROOT, "train", "headline"))
from data import passkey_prompt, random_key  # noqa: E402  (the trainer's exact format)
from texts import heldout_prompt  # noqa: E402  (the recipe's held-out filler and question)

PROMPT_SETS = {"standard": passkey_prompt, "heldout": heldout_prompt}

HEURISTICS = ("window", "sinks", "h2o", "snapkv", "tova")


def load_stubs(stubs_dir):
    sys.path.insert(0, stubs_dir)
    import grpc  # noqa: F401
    from fpa.v1 import fpa_pb2, fpa_pb2_grpc
    return fpa_pb2, fpa_pb2_grpc


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", default="127.0.0.1:50051")
    p.add_argument("--stubs", default=os.path.join(ROOT, "build", "proto", "python"),
                   help="folder of the generated Python stubs (the build makes them)")
    p.add_argument("--lengths", default="1,2,4,8", help="context lengths as multiples of train_len")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths in [0, 1]")
    p.add_argument("--samples", type=int, default=1, help="prompts per (length, depth)")
    p.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="standard",
                   help="standard: the benchmark's filler and question; heldout: the filler "
                        "family and question the second-generation recipe never trains on")
    p.add_argument("--policies", default="none,fpa,window,sinks,h2o,snapkv,tova")
    p.add_argument("--budgets", default="auto,0.25",
                   help="heuristic budgets: fractions, or auto = what fpa held at that length")
    p.add_argument("--snapkv-window", type=int, default=0, help="snapkv's window (0: the server's)")
    p.add_argument("--snapkv-pool", type=int, default=0, help="snapkv's pooling (0: the server's)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--time-limit", type=float, default=3600.0, help="stop sending after this")
    p.add_argument("--json", help="write every record here")
    p.add_argument("--markdown", action="store_true", help="print the summary as a markdown table")
    return p.parse_args(argv)


def make_prompts(train_len, lengths, depths, samples, seed, make=passkey_prompt):
    """[(length, depth, key, text)], the same prompts for every policy."""
    rng = random.Random(seed)
    out = []
    for mult in lengths:
        for depth in depths:
            for _ in range(samples):
                key = random_key(rng)
                out.append((int(mult * train_len), depth, key,
                            make(int(mult * train_len), depth, key)))
    return out


def first_integer(text):
    m = re.search(r"\d+", text)
    return m.group(0) if m else None


class Client:
    def __init__(self, address, stubs):
        import grpc
        self.pb, grpc_mod = stubs
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20)])
        self.stub = grpc_mod.FpaServiceStub(self.channel)

    def info(self):
        return self.stub.ModelInfo(self.pb.ModelInfoRequest(), timeout=30)

    def run(self, text, policy, budget, max_new_tokens, extra=None):
        """Streams one request; returns (generated text, usage, decode tokens/s). `extra`: more
        request fields (snapkv's window and pool)."""
        req = self.pb.GenerateRequest(text=text, max_new_tokens=max_new_tokens,
                                      eviction_policy=policy, **(extra or {}))
        if budget is not None:
            req.cache_budget_fraction = budget
        pieces, first, usage = [], None, None
        for msg in self.stub.GenerateStream(req, timeout=600):
            if msg.token_ids and first is None:
                first = time.perf_counter()
            pieces.append(msg.text)
            if msg.HasField("usage"):
                usage = msg.usage
        # Tokens after the first over the time from the first to the end of the stream.
        elapsed = time.perf_counter() - first if first is not None else 0.0
        tps = (usage.generated_tokens - 1) / elapsed if elapsed > 0 else 0.0
        return "".join(pieces), usage, tps


def run_batch(client, jobs, args, deadline):
    """jobs: [(prompt tuple, policy, budget label, budget fraction)] -> records (bounded)."""
    def one(job):
        (length, depth, key, text), policy, label, frac = job
        if time.monotonic() > deadline:
            return None
        extra = {k: v for k, v in (("snapkv_window", args.snapkv_window),
                                   ("snapkv_pool", args.snapkv_pool)) if v and policy == "snapkv"}
        out, usage, tps = client.run(text, policy, frac, args.max_new_tokens, extra)
        held, full = usage.cache_bytes_held, usage.cache_bytes_full
        return dict(length=length, depth=depth, key=key, policy=policy, budget=label,
                    budget_fraction=frac, answer=first_integer(out), correct=first_integer(out) == key,
                    live_fraction=usage.live_fraction, bytes_held=held, bytes_full=full,
                    held_fraction=held / full if full else 1.0, decode_tps=tps)
    with ThreadPoolExecutor(args.concurrency) as pool:
        return [r for r in pool.map(one, jobs) if r is not None]


def fpa_budgets(records):
    """length -> the mean fraction of a full cache that the fpa policy held there."""
    by_len = {}
    for r in records:
        if r["policy"] == "fpa":
            by_len.setdefault(r["length"], []).append(r["held_fraction"])
    return {n: statistics.mean(v) for n, v in by_len.items()}


def heuristic_jobs(prompts, policies, budgets, auto):
    jobs = []
    for prompt in prompts:
        for label in budgets:
            frac = auto.get(prompt[0]) if label == "auto" else float(label)
            if frac is None or frac >= 1.0:
                continue  # fpa evicted nothing here: no budget to match
            jobs += [(prompt, p, label, round(frac, 4)) for p in policies if p in HEURISTICS]
    return jobs


def summarize(records):
    groups = {}
    for r in records:
        groups.setdefault((r["policy"], r["budget"], r["length"]), []).append(r)
    rows = []
    for (policy, budget, length), rs in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][0],
                                                                              str(kv[0][1]))):
        rows.append(dict(policy=policy, budget=budget, length=length, n=len(rs),
                         accuracy=statistics.mean(r["correct"] for r in rs),
                         held_fraction=statistics.mean(r["held_fraction"] for r in rs),
                         live_fraction=statistics.mean(r["live_fraction"] for r in rs),
                         decode_tps=statistics.mean(r["decode_tps"] for r in rs)))
    return rows


def print_table(rows, info, markdown):
    head = ["length", "policy", "budget", "n", "accuracy", "bytes held / full", "decode tok/s"]
    print(f"model: {info.attention} ({info.levels or '-'}), train_len {info.train_len}, "
          f"tau {info.tau:g}, backend {info.backend}")
    fmt = "| " + " | ".join(["{}"] * len(head)) + " |" if markdown else "  ".join(["{:>14}"] * len(head))
    print(fmt.format(*head))
    if markdown:
        print("|" + "---|" * len(head))
    for r in rows:
        budget = "-" if r["budget"] is None else r["budget"]
        print(fmt.format(r["length"], r["policy"], budget, r["n"], f"{r['accuracy']:.2f}",
                         f"{r['held_fraction']:.3f}", f"{r['decode_tps']:.1f}"))


def main(argv=None):
    args = parse_args(argv)
    client = Client(args.address, load_stubs(args.stubs))
    info = client.info()
    deadline = time.monotonic() + args.time_limit
    prompts = make_prompts(info.train_len, [float(x) for x in args.lengths.split(",")],
                           [float(x) for x in args.depths.split(",")], args.samples, args.seed,
                           PROMPT_SETS[args.prompt_set])
    policies = args.policies.split(",")
    base = [(p, pol, None, None) for p in prompts for pol in policies if pol in ("none", "fpa")]
    records = run_batch(client, base, args, deadline)
    jobs = heuristic_jobs(prompts, policies, args.budgets.split(","), fpa_budgets(records))
    records += run_batch(client, jobs, args, deadline)
    truncated = time.monotonic() > deadline
    print_table(summarize(records), info, args.markdown)
    if truncated:
        print(f"time limit of {args.time_limit:g}s reached: some runs were not sent")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=info.attention, levels=info.levels, train_len=info.train_len,
                           tau=info.tau, records=records, truncated=truncated), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

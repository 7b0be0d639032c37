#!/usr/bin/env python3
"""Capacity at fixed memory: how much work one KV pool serves under each eviction policy.

One fpa-serve with a fixed pool (--cache-bytes, 32 MiB by default) serves closed-loop clients
that send passkey prompts of --length x the model's training length with --new-tokens new
tokens each. Phases of --phase-seconds alternate between the policies (fpa, none, then window at
the fraction of the cache fpa held), --rounds times, so that the machine's noise falls on all of
them alike. Per policy: completed requests and generated tokens per second, peak concurrent
sequences (resident in the pool, from CacheStats polled every 20 ms; and decoding at once, from
the streams' first token to their end), preemptions (/metrics), failed requests and passkey
accuracy; then the ratios fpa / none.

  /usr/bin/python3 bench/capacity.py --model models/fpa-passkey --json capacity.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from daemon import Server  # noqa: E402  (starts the built fpa-serve on free loopback ports)
from passkey import first_integer, make_prompts  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "models", "fpa-passkey"))
    p.add_argument("--cache-bytes", type=int, default=32 << 20)
    p.add_argument("--length", type=float, default=8.0, help="prompt length / train_len")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--phase-seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="the server's compute threads")
    p.add_argument("--prompts", type=int, default=40, help="distinct prompts, cycled")
    p.add_argument("--server-flag", action="append", default=[],
                   help="extra fpa-serve flag, e.g. --server-flag=--prefill-chunk=1024")
    p.add_argument("--versus", action="append", default=[],
                   help="a second fpa-serve with these extra flags (e.g. --versus=--prefix-cache=0)"
                        ": every phase runs on both, back to back, and the table gains its rows")
    p.add_argument("--policies", nargs="+", default=["fpa", "none", "window"],
                   choices=["fpa", "none", "window"])
    p.add_argument("--json", help="write the per-phase records here")
    return p.parse_args(argv)


class Phase:
    """Closed-loop clients on one policy for a fixed time; counts what they got."""

    def __init__(self, server, prompts, policy, budget, args):
        self.server, self.prompts, self.args = server, prompts, args
        self.policy, self.budget = policy, budget
        self.lock = threading.Lock()
        self.done = self.tokens = self.failed = self.correct = 0
        self.held, self.decoding = [], []
        self.resident = 0

    def client(self, index, deadline):
        rng = random.Random(index)
        while time.monotonic() < deadline:
            _, _, key, text = self.prompts[rng.randrange(len(self.prompts))]
            extra = {} if self.budget is None else {"cache_budget_fraction": self.budget}
            try:
                first, pieces, usage = None, [], None
                for msg in self.server.client.stream(text, max_new_tokens=self.args.new_tokens,
                                                     eviction_policy=self.policy,
                                                     ignore_eos=True, **extra):
                    if first is None and msg.token_ids:
                        first = time.monotonic()
                    pieces.append(msg.text)
                    if msg.HasField("usage"):
                        usage = msg.usage
            except Exception as e:  # noqa: BLE001  (any failed RPC counts as failed)
                with self.lock:
                    self.failed += 1
                print(f"  {self.policy}: failed: {str(e)[:160]}", file=sys.stderr)
                continue
            # Only requests that finished inside the phase count toward its rate.
            if time.monotonic() > deadline:
                return
            with self.lock:
                self.done += 1
                self.tokens += usage.generated_tokens
                self.correct += first_integer("".join(pieces)) == key
                self.decoding.append((first, time.monotonic()))
                if usage.cache_bytes_full:
                    self.held.append(usage.cache_bytes_held / usage.cache_bytes_full)

    def watch(self, deadline):
        """Most sequences resident in the pool at once (admitted, holding pages)."""
        while time.monotonic() < deadline:
            self.resident = max(self.resident, self.server.client.cache_stats().sequences)
            time.sleep(0.02)

    def peak_decoding(self):
        """Most requests decoding at once: their spans from first token to end overlapping."""
        events = sorted([(t0, 1) for t0, _ in self.decoding] + [(t1, -1) for _, t1 in self.decoding])
        now = peak = 0
        for _, step in events:
            now += step
            peak = max(peak, now)
        return peak

    def run(self):
        before = self.server.metrics().get("fpa_preemptions_total", 0)
        start = time.monotonic()
        deadline = start + self.args.phase_seconds
        threads = [threading.Thread(target=self.client, args=(i, deadline))
                   for i in range(self.args.clients)]
        threads.append(threading.Thread(target=self.watch, args=(deadline,)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.wait_idle()
        seconds = time.monotonic() - start
        return dict(policy=self.policy, budget=self.budget, seconds=self.args.phase_seconds,
                    completed=self.done, requests_per_s=self.done / self.args.phase_seconds,
                    tokens_per_s=self.tokens / self.args.phase_seconds,
                    peak_sequences=self.resident, peak_decoding=self.peak_decoding(),
                    preemptions=self.server.metrics().get("fpa_preemptions_total", 0) - before,
                    failed=self.failed, accuracy=self.correct / self.done if self.done else 0.0,
                    held_fraction=statistics.mean(self.held) if self.held else None,
                    wall_s=seconds)

    def wait_idle(self):
        while self.server.client.cache_stats().requests_running > 0:
            time.sleep(0.05)


def total(records, policy):
    rs = [r for r in records if r["policy"] == policy]
    seconds = sum(r["seconds"] for r in rs)
    done = sum(r["completed"] for r in rs)
    return dict(policy=policy, budget=rs[-1]["budget"], phases=len(rs),
                requests_per_s=done / seconds,
                tokens_per_s=sum(r["tokens_per_s"] * r["seconds"] for r in rs) / seconds,
                peak_sequences=max(r["peak_sequences"] for r in rs),
                peak_decoding=max(r["peak_decoding"] for r in rs),
                preemptions=sum(r["preemptions"] for r in rs),
                failed=sum(r["failed"] for r in rs),
                accuracy=sum(r["accuracy"] * r["completed"] for r in rs) / done if done else 0.0)


def start(args, extra):
    return Server("--cache-bytes", str(args.cache_bytes), "--threads", str(args.threads),
                  "--max-new-tokens", "4096", *args.server_flag, *extra, model=args.model)


def run_phases(servers, prompts, args):
    """Every round: each policy on each server, back to back (window at fpa's held fraction)."""
    records = []
    for rnd in range(args.rounds):
        for policy in args.policies:
            for label, server in servers:
                budget = None
                if policy == "window":
                    held = [r["held_fraction"] for r in records
                            if r["policy"] == "fpa" and r["held_fraction"] is not None]
                    if not held:
                        continue  # no fpa request finished yet: no budget to match
                    budget = round(statistics.mean(held), 4)
                rec = Phase(server, prompts, policy, budget, args).run()
                rec.update(round=rnd, server=label)
                records.append(rec)
                print(f"  round {rnd} {label}{policy:>6}: {rec['completed']:3d} done, "
                      f"{rec['tokens_per_s']:7.1f} tok/s, peak {rec['peak_sequences']} resident "
                      f"{rec['peak_decoding']} decoding, "
                      f"{rec['preemptions']:.0f} preempted, {rec['failed']} failed, "
                      f"accuracy {rec['accuracy']:.2f}", flush=True)
    return records


def print_table(records, servers, args):
    rows = []
    for label, _ in servers:
        mine = [r for r in records if r["server"] == label]
        rows += [dict(total(mine, p), server=label) for p in args.policies
                 if any(r["policy"] == p for r in mine)]
    print("| server | policy | budget | req/s | tok/s | peak resident seqs | peak decoding "
          "| preemptions | failed | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server'] or 'defaults'} | {r['policy']} | "
              f"{r['budget'] if r['budget'] is not None else '-'} | "
              f"{r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | {r['peak_sequences']} | "
              f"{r['peak_decoding']} | "
              f"{r['preemptions']:.0f} | {r['failed']} | {r['accuracy']:.2f} |")
    by = {(r["server"], r["policy"]): r for r in rows}
    if ("", "fpa") in by and ("", "none") in by:
        fpa, none = by[("", "fpa")], by[("", "none")]
        print(f"fpa / none: throughput "
              f"{fpa['requests_per_s'] / max(none['requests_per_s'], 1e-9):.2f}x, peak resident "
              f"sequences {fpa['peak_sequences'] / max(none['peak_sequences'], 1):.2f}x")
    for label, _ in servers[1:]:
        for p in args.policies:
            if ("", p) in by and (label, p) in by:
                a, b = by[("", p)], by[(label, p)]
                print(f"{p}, defaults / {label.strip()}: throughput "
                      f"{a['requests_per_s'] / max(b['requests_per_s'], 1e-9):.2f}x, tok/s "
                      f"{a['tokens_per_s'] / max(b['tokens_per_s'], 1e-9):.2f}x, failed "
                      f"{a['failed']} vs {b['failed']}")
    return rows


def main(argv=None):
    args = parse_args(argv)
    servers = [("", start(args, []))]
    try:
        if args.versus:
            servers.append((" ".join(args.versus) + " ", start(args, args.versus)))
        client = servers[0][1].client
        info = client.model_info()
        prompts = make_prompts(info.train_len, [args.length],
                               [i / (args.prompts - 1) for i in range(args.prompts)], 1, 7)
        stats = client.cache_stats()
        print(f"model {args.model}: prompts of {int(args.length * info.train_len)} tokens, "
              f"{args.new_tokens} new, pool {args.cache_bytes >> 20} MiB = {stats.pages_total} "
              f"pages, {args.clients} clients, {args.rounds} x {args.phase_seconds:g} s a policy"
              + (f", versus {' '.join(args.versus)}" if args.versus else ""))
        records = run_phases(servers, prompts, args)
    finally:
        for _, server in servers:
            server.stop()
    rows = print_table(records, servers, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), phases=records, totals=rows), f, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Multi-turn sessions through the compressed prefix cache.

--sessions conversations of --turns turns: each turn appends --new-min..--new-max tokens of
English (from the license texts) to the whole history, resends it, and appends the reply
(--reply tokens), so the history grows to about 8x the model's training length. Three servers
with the same pool (--cache-bytes, --prefix-cache share) serve the same conversations, turn by
turn and session by session, interleaved: fpa with the prefix cache, fpa without it, and none
with it. Per turn: time to first token with and without the cache (fpa), and for fpa and none
how many sessions found their state warm (cached_tokens > 0) and the bytes a cached state holds.

  /usr/bin/python3 bench/sessions.py --model models/fpa-passkey --json sessions.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from daemon import Server  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "models", "fpa-passkey"))
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--new-min", type=int, default=200)
    p.add_argument("--new-max", type=int, default=500)
    p.add_argument("--reply", type=int, default=16)
    p.add_argument("--cache-bytes", type=int, default=64 << 20)
    p.add_argument("--prefix-cache", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--json")
    return p.parse_args(argv)


def english(rng, n_bytes):
    """n_bytes of running English from the license texts (no digits, like the filler)."""
    text = " ".join(open(f, errors="replace").read()
                    for f in sorted(glob.glob("/usr/share/common-licenses/*"))[:6])
    text = " ".join("".join(c for c in text if not c.isdigit() and ord(c) < 128).split())
    at = rng.randrange(len(text) - n_bytes)
    return text[at:at + n_bytes]


class Setup:
    def __init__(self, name, policy, prefix, args):
        flags = ["--cache-bytes", str(args.cache_bytes), "--threads", str(args.threads),
                 "--max-prompt-tokens", "65536", "--prefix-cache", str(prefix)]
        self.name, self.policy = name, policy
        self.server = Server(*flags, model=args.model)

    def turn(self, prompt, reply):
        """(reply tokens, time to first token, cached prompt tokens) of one request."""
        start, first, out, usage = time.perf_counter(), None, [], None
        for msg in self.server.client.stream(prompt, max_new_tokens=reply, ignore_eos=True,
                                             eviction_policy=self.policy):
            if first is None and msg.token_ids:
                first = time.perf_counter()
            out += list(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
        return out, first - start, usage.cached_tokens

    def snapshot_bytes(self):
        m = self.server.metrics()
        n = m.get("fpa_prefix_cache_snapshots", 0)
        return n, m.get("fpa_prefix_cache_bytes", 0) / n if n else 0.0


def main(argv=None):
    args = parse_args(argv)
    rng = random.Random(args.seed)
    setups = [Setup("fpa+cache", "fpa", args.prefix_cache, args),
              Setup("fpa", "fpa", 0, args),
              Setup("none+cache", "none", args.prefix_cache, args)]
    try:
        tokenize = setups[0].server.client.tokenize
        histories = {s.name: [[] for _ in range(args.sessions)] for s in setups}
        rows = []
        for t in range(args.turns):
            ttft = {s.name: [] for s in setups}
            warm = {s.name: 0 for s in setups}
            for i in range(args.sessions):
                text = english(rng, rng.randint(args.new_min, args.new_max))
                new = tokenize(text)
                for s in setups:
                    h = histories[s.name][i]
                    prompt = (h + new[1:]) if h else new
                    out, first, cached = s.turn(prompt, args.reply)
                    histories[s.name][i] = prompt + out
                    ttft[s.name].append(first)
                    warm[s.name] += cached > 0
            row = dict(turn=t + 1, history_tokens=statistics.mean(
                len(h) for h in histories["fpa"]))
            for s in setups:
                row[f"ttft_{s.name}"] = statistics.median(ttft[s.name])
                row[f"warm_{s.name}"] = warm[s.name]
                if s.name != "fpa":
                    row[f"snapshots_{s.name}"], row[f"bytes_{s.name}"] = s.snapshot_bytes()
            rows.append(row)
            print(f"turn {t + 1:2d}: history {row['history_tokens']:6.0f} tokens, TTFT "
                  f"fpa {row['ttft_fpa'] * 1e3:7.1f} ms, fpa+cache "
                  f"{row['ttft_fpa+cache'] * 1e3:6.1f} ms; warm sessions fpa "
                  f"{row['warm_fpa+cache']}/{args.sessions} none {row['warm_none+cache']}/"
                  f"{args.sessions}; bytes a cached state fpa {row['bytes_fpa+cache'] / 1e6:.2f} MB "
                  f"none {row['bytes_none+cache'] / 1e6:.2f} MB", flush=True)
    finally:
        for s in setups:
            s.server.stop()
    last = rows[-1]
    print(f"turn {last['turn']}: TTFT without / with the prefix cache "
          f"{last['ttft_fpa'] / last['ttft_fpa+cache']:.1f}x; warm sessions fpa / none "
          f"{last['warm_fpa+cache']} / {last['warm_none+cache']}; bytes a cached state none / fpa "
          f"{last['bytes_none+cache'] / max(last['bytes_fpa+cache'], 1):.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), turns=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Cache bytes held vs tokens processed for one long passkey request, per policy.

The state of the cache after n prompt tokens is what a request of that n-token prefix holds at
its end, so the curve is measured by sending growing prefixes of one long prompt (as token ids)
with max_new_tokens=1 and reading each response's usage.

  /usr/bin/python3 bench/cache_curve.py --address 127.0.0.1:50051 --json bench/out/curve.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passkey import ROOT, Client, load_stubs, passkey_prompt  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", default="127.0.0.1:50051")
    p.add_argument("--stubs", default=os.path.join(ROOT, "build", "proto", "python"))
    p.add_argument("--length", type=float, default=8, help="multiple of train_len")
    p.add_argument("--step", type=int, default=256, help="tokens between points")
    p.add_argument("--policies", default="none,fpa,window")
    p.add_argument("--budget", type=float, default=0.25, help="heuristics' budget fraction")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    client = Client(args.address, load_stubs(args.stubs))
    pb, info = client.pb, client.info()
    text = passkey_prompt(int(args.length * info.train_len), 0.1, "31415")
    ids = list(client.stub.Tokenize(pb.TokenizeRequest(text=text), timeout=30).token_ids)
    curves = {}
    for policy in args.policies.split(","):
        points = []
        for n in range(args.step, len(ids) + 1, args.step):
            req = pb.GenerateRequest(tokens=pb.TokenIds(ids=ids[:n]), max_new_tokens=1,
                                     eviction_policy=policy)
            if policy in ("window", "sinks", "h2o"):
                req.cache_budget_fraction = args.budget
            usage = client.stub.Generate(req, timeout=600).usage
            points.append((n, usage.cache_bytes_held, usage.cache_bytes_full))
            print(f"{policy:>7} {n:>6} tokens: {usage.cache_bytes_held / 1e6:8.2f} MB held of "
                  f"{usage.cache_bytes_full / 1e6:8.2f} MB", flush=True)
        curves[policy] = points
    with open(args.json, "w") as f:
        json.dump(dict(model=info.attention, budget=args.budget, curves=curves), f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Load generator for fpa-serve: streaming requests at several concurrency levels on loopback,
bounded in count and in time, printing request throughput, TTFT, TPOT and inter-token latency
percentiles side by side.

    /usr/bin/python3 bench/load.py --model models/fpa-tiny            # starts its own server
    /usr/bin/python3 bench/load.py --address 127.0.0.1:50051          # an already running one

Every request streams `--max-new-tokens` tokens (EOS ignored, so lengths are equal) after a
prompt of `--prompt-tokens` bytes of passkey-style filler.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time

import grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "client"))
import fpa_client  # noqa: E402

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def one_request(stub, request, record):
    t0 = time.perf_counter()
    stamps = []
    async for msg in stub.GenerateStream(request):
        now = time.perf_counter()
        stamps.extend([now] * len(msg.token_ids))
    record.append((t0, stamps))


async def run_level(address: str, concurrency: int, n_requests: int, time_limit: float,
                    request) -> dict:
    records: list = []
    errors: dict[str, int] = {}
    issued = 0
    deadline = time.perf_counter() + time_limit

    async with grpc.aio.insecure_channel(address) as channel:
        stub = fpa_client.pb_grpc.FpaServiceStub(channel)

        async def worker():
            nonlocal issued
            while issued < n_requests and time.perf_counter() < deadline:
                issued += 1
                try:
                    await one_request(stub, request, records)
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start

    ttft = [s[0] - t0 for t0, s in records if s]
    tpot = [(s[-1] - s[0]) / (len(s) - 1) for _, s in records if len(s) > 1]
    itl = [b - a for _, s in records for a, b in zip(s, s[1:])]
    tokens = sum(len(s) for _, s in records)
    return {
        "concurrency": concurrency, "requests": len(records), "errors": errors,
        "wall_s": wall, "req_per_s": len(records) / wall, "tok_per_s": tokens / wall,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
        "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99),
    }


def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [args.serve_bin, "--model", args.model, "--address", "127.0.0.1:0",
           "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
           "--max-batch", str(max(args.concurrency)),
           *args.server_flag]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = re.search(r"listening on ([\d.]+:\d+) \(gRPC\)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"fpa-serve did not start: {' '.join(cmd)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", help="use this running server instead of starting one")
    ap.add_argument("--model", default=os.path.join(REPO, "models", "fpa-tiny"))
    ap.add_argument("--serve-bin", default=os.path.join(REPO, "build", "server", "fpa-serve"))
    ap.add_argument("--server-flag", action="append", default=[],
                    help="extra fpa-serve flag (repeat; e.g. --server-flag=--threads=2)")
    ap.add_argument("--concurrency", default="1,8,32,64",
                    type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--requests", type=int, default=128, help="per concurrency level (at most)")
    ap.add_argument("--time-limit", type=float, default=60, help="seconds per level (at most)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--policy", default="fpa")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    proc = None
    address = args.address
    if address is None:
        proc, address = start_server(args)
    try:
        prompt = (FILLER * (args.prompt_tokens // len(FILLER) + 1))[:args.prompt_tokens - 1]
        request = fpa_client.make_request(prompt, max_new_tokens=args.max_new_tokens,
                                          eviction_policy=args.policy, ignore_eos=True)
        results = []
        print(f"# {address}, prompt {args.prompt_tokens} tokens, {args.max_new_tokens} new tokens, "
              f"policy {args.policy}, <= {args.requests} requests / <= {args.time_limit:g} s "
              f"per level")
        print("| concurrency | requests | req/s | tok/s | TTFT p50 / p99 ms | "
              "TPOT p50 / p99 ms | ITL p50 / p99 ms | errors |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        for c in args.concurrency:
            r = asyncio.run(run_level(address, c, args.requests, args.time_limit, request))
            results.append(r)
            print(f"| {c} | {r['requests']} | {r['req_per_s']:.2f} | {r['tok_per_s']:.0f} | "
                  f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | "
                  f"{r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | "
                  f"{r['itl_p50_ms']:.2f} / {r['itl_p99_ms']:.2f} | {r['errors'] or '-'} |",
                  flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Command-line client of fpa-serve (fpa.v1.FpaService), and the small library behind it.

    client/fpa_client.py generate "The pass key is" --max-new-tokens 32 [--stream]
    client/fpa_client.py generate "..." --policy window --budget 0.25 --json
    client/fpa_client.py tokenize "hello" | info | cache | health
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import grpc
from google.protobuf import json_format

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fpa_stubs  # noqa: E402

pb, pb_grpc, health_pb, health_grpc = fpa_stubs.load()

GENERATE_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "logprobs",
                   "eviction_policy", "tau", "cache_budget_fraction", "sink_tokens", "ignore_eos",
                   "snapkv_window", "snapkv_pool")


def make_request(prompt: str | list[int], **fields) -> "pb.GenerateRequest":
    """A GenerateRequest from text or token ids; unset (None) fields keep the server defaults."""
    req = pb.GenerateRequest(**{k: v for k, v in fields.items() if v is not None})
    if isinstance(prompt, str):
        req.text = prompt
    else:
        req.tokens.ids.extend(prompt)
    return req


class FpaClient:
    def __init__(self, address: str = "127.0.0.1:50051", timeout: float | None = None):
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.FpaServiceStub(self.channel)
        self.health_stub = health_grpc.HealthStub(self.channel)
        self.timeout = timeout

    def close(self):
        self.channel.close()

    def generate(self, prompt, **fields):
        return self.stub.Generate(make_request(prompt, **fields), timeout=self.timeout)

    def stream(self, prompt, **fields):
        """The GenerateStream call: iterate it for messages, .cancel() it to stop."""
        return self.stub.GenerateStream(make_request(prompt, **fields), timeout=self.timeout)

    def tokenize(self, text: str) -> list[int]:
        resp = self.stub.Tokenize(pb.TokenizeRequest(text=text), timeout=self.timeout)
        return list(resp.token_ids)

    def model_info(self):
        return self.stub.ModelInfo(pb.ModelInfoRequest(), timeout=self.timeout)

    def cache_stats(self):
        return self.stub.CacheStats(pb.CacheStatsRequest(), timeout=self.timeout)

    def health(self, service: str = "") -> str:
        resp = self.health_stub.Check(health_pb.HealthCheckRequest(service=service),
                                      timeout=self.timeout)
        return health_pb.HealthCheckResponse.ServingStatus.Name(resp.status)


def _generate(client: FpaClient, args) -> int:
    fields = {k: getattr(args, k) for k in GENERATE_FIELDS}
    prompt = [int(t) for t in args.prompt.split(",")] if args.token_ids else args.prompt
    if not args.stream:
        resp = client.generate(prompt, **fields)
        if args.json:
            print(json_format.MessageToJson(resp, indent=None))
        else:
            print(resp.text)
        return 0
    for msg in client.stream(prompt, **fields):
        if args.json:
            print(json_format.MessageToJson(msg, indent=None), flush=True)
        else:
            print(msg.text, end="", flush=True)
    if not args.json:
        print()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default=os.environ.get("FPA_ADDRESS", "127.0.0.1:50051"))
    ap.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate a completion")
    g.add_argument("prompt", help="prompt text (or comma-separated ids with --token-ids)")
    g.add_argument("--token-ids", action="store_true")
    g.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    g.add_argument("--json", action="store_true", help="print the response messages as JSON")
    g.add_argument("--max-new-tokens", type=int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append")
    g.add_argument("--logprobs", action="store_true", default=None)
    g.add_argument("--policy", dest="eviction_policy",
                   help="fpa, none, window, sinks, h2o, snapkv, tova")
    g.add_argument("--tau", type=float)
    g.add_argument("--budget", dest="cache_budget_fraction", type=float,
                   help="heuristic policies: live keys per head / length")
    g.add_argument("--sink-tokens", type=int)
    g.add_argument("--snapkv-window", type=int)
    g.add_argument("--snapkv-pool", type=int)
    g.add_argument("--ignore-eos", action="store_true", default=None)
    t = sub.add_parser("tokenize", help="encode text")
    t.add_argument("text")
    sub.add_parser("info", help="model and server limits")
    sub.add_parser("cache", help="KV cache statistics")
    sub.add_parser("health", help="grpc.health.v1 status")
    args = ap.parse_args(argv)

    client = FpaClient(args.address, args.timeout)
    try:
        if args.command == "generate":
            return _generate(client, args)
        if args.command == "tokenize":
            print(json.dumps(client.tokenize(args.text)))
        elif args.command == "info":
            print(json_format.MessageToJson(client.model_info()))
        elif args.command == "cache":
            print(json_format.MessageToJson(client.cache_stats()))
        elif args.command == "health":
            print(client.health())
        return 0
    except grpc.RpcError as e:
        print(f"fpa_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())

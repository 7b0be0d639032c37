#!/usr/bin/python3
"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/), committed: small valid inputs
of every kind, from which libFuzzer mutates. Rerun after a format change.

    FPA_PROTO_PY=build/proto/python tests/fuzz/make_seeds.py
"""
import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client"))
import fpa_client  # noqa: E402

pb = fpa_client.pb


PROJECTIONS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_gate", "mlp.w_up", "mlp.w_down")


def tiny_model(kind, levels, tied=True, int8=False):
    """config.json text and model.safetensors bytes of a 1-layer, 4-wide model; with int8, its
    projections stored as I8 with per-row F32 scales (docs/model-format.md)."""
    d, h, hd, ff, vocab = 4, 2, 2, 6, 259
    config = {"format": "fpa-serve/1", "vocab_size": vocab, "d_model": d, "n_layers": 1,
              "n_heads": h, "head_dim": hd, "d_ff": ff, "attention": kind, "levels": levels,
              "rope_theta": 10000.0 if kind == "softmax" else 0.0, "norm_eps": 1e-5,
              "tie_embeddings": tied, "train_len": 16, "tau": 4.0,
              "tokenizer": {"type": "byte", "bos_id": 256, "eos_id": 257, "pad_id": 258}}
    a = h * hd
    shapes = {"embed.weight": [vocab, d], "final_norm.weight": [d],
              "layers.0.attn_norm.weight": [d], "layers.0.mlp_norm.weight": [d],
              "layers.0.attn.wq": [a, d], "layers.0.attn.wk": [a, d], "layers.0.attn.wv": [a, d],
              "layers.0.attn.wo": [d, a], "layers.0.mlp.w_gate": [ff, d],
              "layers.0.mlp.w_up": [ff, d], "layers.0.mlp.w_down": [d, ff]}
    if not tied:
        shapes["lm_head.weight"] = [vocab, d]
    if kind != "softmax":
        shapes.update({"layers.0.attn.field_w": [h, d], "layers.0.attn.field_b": [h]})
    if kind == "fpa":
        shapes["layers.0.attn.beta_raw"] = [h]
        if levels == "free":
            shapes.update({"layers.0.attn.level_w": [h, d], "layers.0.attn.level_b": [h]})
    rng = random.Random(len(shapes))
    int8_names = {"layers.0." + p for p in PROJECTIONS} if int8 else set()
    if int8:
        config["formats_within_bounds"] = {"weights": "int8", "kv": "bf16"}
        shapes.update({name + ".scale": shapes[name][:1] for name in int8_names})
    header, data = {}, b""
    for name in sorted(shapes):
        n = 1
        for s in shapes[name]:
            n *= s
        if name in int8_names:
            dtype, blob = "I8", struct.pack(f"<{n}b", *(rng.randint(-127, 127) for _ in range(n)))
        else:
            dtype, blob = "F32", struct.pack(f"<{n}f", *(rng.uniform(-1, 1) for _ in range(n)))
        header[name] = {"dtype": dtype, "shape": shapes[name],
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return json.dumps(config, indent=1).encode(), struct.pack("<Q", len(text)) + text + data


def requests():
    r = fpa_client.make_request
    return [r("Hello"), r([256, 72, 105], max_new_tokens=4),
            r("x", temperature=0.7, top_k=5, top_p=0.9, seed=7, stop=["\n", "end"], logprobs=True),
            r("policy", eviction_policy="sinks", sink_tokens=4, cache_budget_fraction=0.25),
            r("fpa", eviction_policy="fpa", tau=12.5, ignore_eos=True),
            r("h2o", eviction_policy="h2o", cache_budget_fraction=0.5),
            r("\u00e9t\u00e9 \u2603", eviction_policy="window")]


# Texts for the tokenizer: merges, escapes, emoji, whitespace runs, invalid UTF-8.
TEXTS = ["the there  \u00e9\\u00e9 \U0001F600\n\n x".encode(),
         b"a\xff\xc3b   \t\"\\", "\u4e2d\u6587 \u0440\u0443\u0441 123".encode()]


# What HTTP clients send, after the byte that sets the fuzzer's read size: pipelining, bodies by
# length and chunked (extensions, trailers), 100-continue, HTTP/1.0, a close.
BODY = b'{"prompt": "hi", "max_tokens": 4, "stream": true}'
HTTP = [
    b"\x00GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n"
    b"Connection: close\r\n\r\n",
    b"\x07POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Authorization: Bearer k\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
    b"\x03POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nX-Trailer: t\r\n\r\nGET / HTTP/1.1\r\n\r\n",
    b"\x40POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
    b"\r\n{}",
    b"\x01GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /health HTTP/1.0\r\n\r\n",
]


def chat_templates():
    """The 53 published chat templates of tests/vectors/chat_templates/hf_jinja_e2e.json."""
    with open(os.path.join(REPO, "tests", "vectors", "chat_templates", "hf_jinja_e2e.json")) as f:
        return [case["chat_template"].encode() for case in json.load(f)]


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def main():
    for kind, levels, tied, int8 in [("fpa", "free", True, False), ("fpa", "tied", False, False),
                                     ("fox", "tied", True, False), ("softmax", "tied", True, False),
                                     ("fpa", "free", False, True)]:
        name = f"{kind}-{levels}-{'tied' if tied else 'untied'}" + ("-int8" if int8 else "")
        config, weights = tiny_model(kind, levels, tied, int8)
        write("config", name + ".json", config)
        write("safetensors", name + ".safetensors", weights)
        write("model_dir", name, struct.pack("<I", len(config)) + config + weights)
    for i, req in enumerate(requests()):
        write("request", f"request-{i}.pb", req.SerializeToString())
    for i, text in enumerate(TEXTS):
        write("tokenizer", f"text-{i}.txt", text)
    for i, raw in enumerate(HTTP):
        write("http", f"http-{i}.txt", raw)
    for i, template in enumerate(chat_templates()):
        write("chat_template", f"template-{i:02d}.jinja", template)


if __name__ == "__main__":
    main()

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


def tiny_model(kind, levels, tied=True):
    """config.json text and model.safetensors bytes of a 1-layer, 4-wide model."""
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
    header, data = {}, b""
    for name in sorted(shapes):
        n = 1
        for s in shapes[name]:
            n *= s
        blob = struct.pack(f"<{n}f", *(rng.uniform(-1, 1) for _ in range(n)))
        header[name] = {"dtype": "F32", "shape": shapes[name],
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
    for kind, levels, tied in [("fpa", "free", True), ("fpa", "tied", False), ("fox", "tied", True),
                               ("softmax", "tied", True)]:
        name = f"{kind}-{levels}-{'tied' if tied else 'untied'}"
        config, weights = tiny_model(kind, levels, tied)
        write("config", name + ".json", config)
        write("safetensors", name + ".safetensors", weights)
        write("model_dir", name, struct.pack("<I", len(config)) + config + weights)
    for i, req in enumerate(requests()):
        write("request", f"request-{i}.pb", req.SerializeToString())
    for i, text in enumerate(TEXTS):
        write("tokenizer", f"text-{i}.txt", text)
    for i, template in enumerate(chat_templates()):
        write("chat_template", f"template-{i:02d}.jinja", template)


if __name__ == "__main__":
    main()

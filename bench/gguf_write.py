"""Writes a softmax model in the fpa-serve/1 format (docs/model-format.md) as a GGUF v3 file of
llama.cpp's `llama` architecture, so that llama.cpp runs the same weights (bench/llama_cpp_compare.py).

    /usr/bin/python3 bench/gguf_write.py models/softmax-tiny out.gguf [--dtype f32|bf16]

The mapping:
  * Tensor names follow llama.cpp's llama loader (token_embd, blk.L.attn_q, ..., output_norm); tied
    embeddings write no `output.weight` (llama.cpp then reuses token_embd, as our lm_head does).
  * Our RoPE pairs (i, i + head_dim/2) (rotate-half, GPT-NeoX style); llama.cpp's llama
    architecture rotates consecutive pairs (2i, 2i+1) with the same angle. Permuting each head's
    rows of wq and wk the way llama.cpp's convert_hf_to_gguf.py does for llama (row i of the
    first half goes to 2i, of the second half to 2i+1) makes the two equal: q.k is unchanged by a
    permutation applied to both, and wv/wo are untouched.
  * Only softmax models with RoPE map exactly: fpa/fox have a walk and a penalty llama.cpp has no
    place for, and a softmax model without RoPE has no llama equivalent (llama always rotates).
  * The byte tokenizer needs no tokenizer in the file: `tokenizer.ggml.model = "no_vocab"` with
    `llama.vocab_size` makes llama.cpp accept token ids 0..258 as they are (the driver feeds ids).
  * `--dtype bf16` stores the matrices (embedding included) in bf16, rounded to nearest even as
    llama.cpp's converter does; norm weights stay f32, as there.
  * `--dtype q8_0` stores them as llama.cpp's Q8_0 (issue 26): blocks of 32 values along a row,
    each an f16 scale d = max|x| / 127 and 32 int8 values round(x / d), as ggml's reference
    quantize_row_q8_0 computes them; norm weights stay f32, as llama.cpp's quantize leaves them.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "train"))
import safetensors_io  # noqa: E402

ALIGN = 32
# gguf value types and ggml tensor types (gguf.h / ggml.h)
U32, F32V, STRING, ARRAY = 4, 6, 8, 9
GGML_F32, GGML_Q8_0, GGML_BF16 = 0, 8, 30
# LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_BF16, LLAMA_FTYPE_MOSTLY_Q8_0
FILE_TYPE = {"f32": 0, "bf16": 32, "q8_0": 7}
QK8_0 = 32  # values per Q8_0 block


class Q8_0:
    """A matrix in ggml's Q8_0 layout: `data` holds each row's blocks of (f16 d, 32 x int8)."""

    def __init__(self, a: np.ndarray):
        rows, cols = a.shape
        if cols % QK8_0:
            raise ValueError(f"Q8_0 needs rows of a multiple of {QK8_0} values, not {cols}")
        x = np.ascontiguousarray(a, dtype=np.float32).reshape(rows, cols // QK8_0, QK8_0)
        d = np.abs(x).max(axis=2) / np.float32(127)
        inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
        y = x * inv[..., None]
        q = np.trunc(y + np.copysign(np.float32(0.5), y)).astype(np.int8)  # roundf: half away
        blocks = np.empty((rows, cols // QK8_0), dtype=[("d", "<f2"), ("q", "i1", QK8_0)])
        blocks["d"], blocks["q"] = d.astype(np.float16), q
        self.shape, self.ndim, self.data = a.shape, 2, blocks



def permute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rows (h, half, pair) -> (h, pair, half)."""
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (the weights are finite: the loader checks)."""
    n = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((n + 0x7FFF + ((n >> 16) & 1)) >> 16).astype(np.uint16)


def llama_tensors(cfg: dict, t: dict) -> dict:
    """Our tensors (numpy float32) under llama.cpp's names, q/k rows permuted."""
    out = {"token_embd.weight": t["embed.weight"], "output_norm.weight": t["final_norm.weight"]}
    if not cfg["tie_embeddings"]:
        out["output.weight"] = t["lm_head.weight"]
    names = {"attn_norm.weight": "attn_norm", "attn.wq": "attn_q", "attn.wk": "attn_k",
             "attn.wv": "attn_v", "attn.wo": "attn_output", "mlp_norm.weight": "ffn_norm",
             "mlp.w_gate": "ffn_gate", "mlp.w_up": "ffn_up", "mlp.w_down": "ffn_down"}
    for layer in range(cfg["n_layers"]):
        for ours, theirs in names.items():
            w = t[f"layers.{layer}.{ours}"]
            if ours in ("attn.wq", "attn.wk"):
                w = permute_rope(w, cfg["n_heads"])
            out[f"blk.{layer}.{theirs}.weight"] = w
    return out


def metadata(cfg: dict, dtype: str, name: str) -> list:
    a = "llama."
    return [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, name),
        ("general.file_type", U32, FILE_TYPE[dtype]),
        ("general.alignment", U32, ALIGN),
        (a + "context_length", U32, 8192),
        (a + "embedding_length", U32, cfg["d_model"]),
        (a + "block_count", U32, cfg["n_layers"]),
        (a + "feed_forward_length", U32, cfg["d_ff"]),
        (a + "attention.head_count", U32, cfg["n_heads"]),
        (a + "attention.head_count_kv", U32, cfg["n_heads"]),
        (a + "attention.key_length", U32, cfg["head_dim"]),
        (a + "attention.value_length", U32, cfg["head_dim"]),
        (a + "rope.dimension_count", U32, cfg["head_dim"]),
        (a + "rope.freq_base", F32V, float(cfg["rope_theta"])),
        (a + "attention.layer_norm_rms_epsilon", F32V, float(cfg["norm_eps"])),
        (a + "vocab_size", U32, cfg["vocab_size"]),
        ("tokenizer.ggml.model", STRING, "no_vocab"),
    ]


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(kind: int, v) -> bytes:
    if kind == STRING:
        return _str(v)
    return struct.pack({U32: "<I", F32V: "<f"}[kind], v)


def write(path: str, kvs: list, tensors: dict) -> None:
    """GGUF v3: header, key/values, tensor infos (dims innermost first), aligned data."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, kind, v in kvs:
        head += _str(key) + struct.pack("<I", kind) + _value(kind, v)
    blobs, offset = [], 0
    for name, a in tensors.items():
        head += _str(name) + struct.pack("<I", a.ndim) + struct.pack(f"<{a.ndim}Q", *a.shape[::-1])
        if isinstance(a, Q8_0):
            kind, raw = GGML_Q8_0, a.data.tobytes()
        else:
            kind = GGML_BF16 if a.dtype == np.uint16 else GGML_F32
            raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        head += struct.pack("<IQ", kind, offset)
        blobs.append(raw + b"\0" * (-len(raw) % ALIGN))
        offset += len(blobs[-1])
    with open(path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGN))
        for raw in blobs:
            f.write(raw)


def convert(model_dir: str, out_path: str, dtype: str = "f32") -> None:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg["attention"] != "softmax" or not cfg.get("rope_theta"):
        raise ValueError(f"{model_dir}: only softmax models with RoPE have a llama equivalent")
    raw, _ = safetensors_io.load(os.path.join(model_dir, "model.safetensors"))
    tensors = llama_tensors(cfg, {k: v.float().numpy() for k, v in raw.items()})
    if dtype != "f32":
        convert_matrix = {"bf16": to_bf16, "q8_0": Q8_0}[dtype]
        tensors = {k: convert_matrix(v) if v.ndim == 2 else v for k, v in tensors.items()}
    write(out_path, metadata(cfg, dtype, os.path.basename(os.path.normpath(model_dir))), tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=sorted(FILE_TYPE), default="f32")
    args = ap.parse_args()
    convert(args.model_dir, args.out, args.dtype)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

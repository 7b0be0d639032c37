"""Writes a model with its projections stored as int8 (docs/model-format.md, "int8 weights"),
so that `fpa-serve --cpu-weights int8` maps them as stored, with no float32 copy (issue 26).

    /usr/bin/python3 train/quantize_int8.py models/fpa-v2 out/fpa-v2-int8

Each projection W [rows, cols] (attention q/k/v/o, the MLP's, an untied lm_head) becomes the I8
tensor round(W / scale[:, None]) clipped to [-127, 127] and the F32 tensor `<name>.scale`
[rows], scale = max |W[r, :]| / 127 (1 for a zero row): symmetric per output row, as the CPU
backend quantizes a float model at load (kernels/cpu/int8_linear.cc, quantize_row), so the two
give the same weights. The embedding, norms and the field's projections (field_w, level_w,
fgate) stay as they are: eviction decisions hang on the field. The other files of the
directory (config.json, tokenizer files) are copied.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

# fpa-serve/1 and Hugging Face (FoX) projection names (model/weight_names.cc).
PROJECTION = re.compile(
    r"^(layers\.\d+\.(attn\.w[qkvo]|mlp\.w_(gate|up|down))"
    r"|model\.layers\.\d+\.(attn\.[qkvo]_proj(\.linear)?\.weight|mlp\.(gate|down)_proj\.weight)"
    r"|lm_head\.weight)$")


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [rows, cols] -> (int8 values, float32 per-row scales), in float32 arithmetic."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    m = np.abs(w).max(axis=1)
    scale = np.where(m > 0, m / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def convert(model_dir: str, out_dir: str) -> int:
    """Writes out_dir; returns the number of projections quantized."""
    # TODO(issue 26): sharded checkpoints (model.safetensors.index.json).
    tensors, meta = safetensors_io.load(os.path.join(model_dir, "model.safetensors"))
    out, count = {}, 0
    for name, t in tensors.items():
        if PROJECTION.match(name) and t.ndim == 2:
            out[name], out[name + ".scale"] = quantize(t.float().numpy())
            count += 1
        else:
            out[name] = t
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(model_dir):
        if f != "model.safetensors" and os.path.isfile(os.path.join(model_dir, f)):
            shutil.copy2(os.path.join(model_dir, f), os.path.join(out_dir, f))
    meta = dict(meta, quantized="int8 projections, per-row scales (train/quantize_int8.py)")
    safetensors_io.save(os.path.join(out_dir, "model.safetensors"), out, meta)
    return count


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    args = ap.parse_args()
    n = convert(args.model_dir, args.out_dir)
    print(f"wrote {args.out_dir}: {n} projections as int8")


if __name__ == "__main__":
    main()

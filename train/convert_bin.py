"""Converts the PyTorch checkpoint of a Hugging Face model directory (pytorch_model.bin, or the
shards its pytorch_model.bin.index.json lists) to safetensors beside it (model.safetensors, or
one .safetensors per shard and model.safetensors.index.json), which fpa-serve loads.

Only tensors are read: torch.load(weights_only=True) refuses any pickle that would run code or
build an object other than tensors and plain containers, so a hostile checkpoint fails here
instead of running. Dtypes are kept (bf16 stays bf16). With tie_word_embeddings in config.json,
lm_head.weight is left out, as save_pretrained leaves it out.

    python3 train/convert_bin.py MODEL_DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402


def read_tensors(path: str) -> dict:
    """The state dict in `path`, tensors only, each copied out of any shared storage."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: not a state dict of tensors")
    return {name: t.detach().clone().contiguous() for name, t in state.items()}


def tied(model_dir: str) -> bool:
    config = os.path.join(model_dir, "config.json")
    if not os.path.exists(config):
        return False
    with open(config) as f:
        return bool(json.load(f).get("tie_word_embeddings", False))


def convert(model_dir: str) -> list[str]:
    """Converts; returns the files written."""
    index = os.path.join(model_dir, "pytorch_model.bin.index.json")
    drop = {"lm_head.weight"} if tied(model_dir) else set()
    if not os.path.exists(index):
        tensors = read_tensors(os.path.join(model_dir, "pytorch_model.bin"))
        out = os.path.join(model_dir, "model.safetensors")
        safetensors_io.save(out, {k: v for k, v in tensors.items() if k not in drop},
                            {"format": "pt"})
        return [out]
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    written, new_map = [], {}
    for shard in sorted(set(weight_map.values())):
        if os.path.basename(shard) != shard:
            raise ValueError(f"{index}: shard {shard!r} is not a file in the directory")
        tensors = read_tensors(os.path.join(model_dir, shard))
        name = shard.replace("pytorch_model", "model").replace(".bin", ".safetensors")
        kept = {k: v for k, v in tensors.items() if k not in drop}
        safetensors_io.save(os.path.join(model_dir, name), kept, {"format": "pt"})
        new_map.update({k: name for k in kept})
        written.append(os.path.join(model_dir, name))
    out = os.path.join(model_dir, "model.safetensors.index.json")
    with open(out, "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(new_map.items()))}, f, indent=2)
    return written + [out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    for path in convert(parser.parse_args().model_dir):
        print(path)


if __name__ == "__main__":
    main()

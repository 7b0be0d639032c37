"""Writes and reads model directories in the fpa-serve/1 format (docs/model-format.md):
config.json + model.safetensors (float32).

    /usr/bin/python3 train/export.py train/runs/fpa/ckpt.pt models/fpa-tiny
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
from reference import Config, Model  # noqa: E402


def save_model(model: Model, out_dir: str, training: dict | None = None) -> None:
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    safetensors_io.save(os.path.join(out_dir, "model.safetensors"), tensors,
                        {"format": "fpa-serve/1"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.cfg.to_json(training), f, indent=2)
        f.write("\n")


def load_model(model_dir: str) -> Model:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config.from_json(json.load(f))
    tensors, _ = safetensors_io.load(os.path.join(model_dir, "model.safetensors"))
    model = Model(cfg)
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a train.py checkpoint (ckpt.pt)")
    ap.add_argument("out_dir")
    args = ap.parse_args()
    ck = torch.load(args.checkpoint, map_location="cpu")
    model = Model(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    save_model(model, args.out_dir, ck.get("training"))
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()

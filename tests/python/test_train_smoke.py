"""train.py end to end on a toy budget: it trains, evaluates, checkpoints and exports."""
import json

import torch

import train
from export import load_model


def test_train_two_steps_and_export(tmp_path):
    out = tmp_path / "model"
    train.main(["--name", "pytest-smoke", "--kind", "fpa", "--steps", "2", "--warmup", "1",
                "--seq-len", "64", "--short-len", "32", "--batch", "2", "--d-model", "16",
                "--layers", "1", "--heads", "2", "--head-dim", "8", "--d-ff", "16",
                "--eval-every", "2", "--eval-samples", "1", "--threads", "1", "--export", str(out)])
    with open(out / "config.json") as f:
        training = json.load(f)["training"]
    assert training["steps"] == 2 and training["tokens_seen"] == 2 * 2 * 64
    assert 0.0 <= training["eval"]["live1x"] <= 1.0
    model = load_model(str(out))
    assert model(torch.tensor([[256, 65, 66]])).shape == (1, 3, 259)

"""train/convert_bin.py: a PyTorch checkpoint becomes safetensors with the same tensors (bf16
kept, shards and their index, tied lm_head left out), and a pickle that would run code is refused
before anything runs or is written."""
import json
import os
import pickle

import pytest
import torch

import safetensors_io
from convert_bin import convert


def test_single_file_keeps_names_values_and_dtypes(tmp_path):
    state = {"model.embeddings.weight": torch.randn(10, 4).to(torch.bfloat16),
             "model.norm.weight": torch.randn(4), "lm_head.weight": torch.randn(10, 4)}
    torch.save(state, tmp_path / "pytorch_model.bin")
    convert(str(tmp_path))
    got, _ = safetensors_io.load(tmp_path / "model.safetensors")
    assert got.keys() == state.keys()
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_shards_get_an_index_and_tied_lm_head_is_dropped(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    emb = torch.randn(10, 4)
    shards = {"pytorch_model-00001-of-00002.bin": {"model.embeddings.weight": emb},
              "pytorch_model-00002-of-00002.bin": {"model.norm.weight": torch.ones(4),
                                                   "lm_head.weight": emb}}
    weight_map = {}
    for name, state in shards.items():
        torch.save(state, tmp_path / name)
        weight_map.update({k: name for k in state})
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    convert(str(tmp_path))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {"model.embeddings.weight": "model-00001-of-00002.safetensors",
                     "model.norm.weight": "model-00002-of-00002.safetensors"}
    got, _ = safetensors_io.load(tmp_path / "model-00001-of-00002.safetensors")
    assert torch.equal(got["model.embeddings.weight"], emb)


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_that_runs_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": Exploit()}, f)
    with pytest.raises(pickle.UnpicklingError):
        convert(str(tmp_path))
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "model.safetensors").exists()

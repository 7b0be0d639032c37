"""safetensors reader/writer, model export/import and bad-input errors."""
import json

import pytest
import torch

import safetensors_io
from export import load_model, save_model
from reference import BOS, Config, Model, decode, encode


def test_safetensors_roundtrip(tmp_path):
    path = tmp_path / "t.safetensors"
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int32),
               "c": torch.tensor([[1, 0], [0, 1]], dtype=torch.uint8)}
    safetensors_io.save(path, tensors, {"tau": 2.5})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0 and json.loads(raw[8:8 + n])["b"]["dtype"] == "I32"
    got, meta = safetensors_io.load(path)
    assert meta == {"tau": "2.5"}
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v)


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors_io.save(path, {"a": torch.randn(100)})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="a has bad data offsets"):
        safetensors_io.load(path)


def test_export_roundtrip(tmp_path):
    cfg = Config(d_model=16, n_layers=1, n_heads=2, head_dim=8, d_ff=32, tie_embeddings=False)
    model = Model(cfg).init_weights(0).eval()
    save_model(model, str(tmp_path), {"seed": 0})
    with open(tmp_path / "config.json") as f:
        conf = json.load(f)
    assert conf["format"] == "fpa-serve/1" and conf["tokenizer"]["bos_id"] == BOS
    tensors, _ = safetensors_io.load(tmp_path / "model.safetensors")
    assert tensors["layers.0.attn.field_w"].shape == (2, 16)
    assert tensors["lm_head.weight"].shape == (259, 16)
    back = load_model(str(tmp_path))
    toks = torch.tensor([encode("hello")])
    with torch.no_grad():
        assert torch.equal(model(toks), back(toks))


@pytest.mark.parametrize("bad", [dict(attention="linear"), dict(levels="loose"),
                                 dict(attention="fox", levels="free"),
                                 dict(attention="fpa", rope_theta=10000.0)])
def test_bad_config_is_rejected(bad):
    with pytest.raises(ValueError):
        Config(**bad)


def test_tokenizer():
    ids = encode("Hé!")
    assert ids == [BOS, 72, 195, 169, 33] and decode(ids + [257]) == "Hé!"

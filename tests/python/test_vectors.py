"""The committed golden vectors are what train/make_vectors.py produces, and agree with the
reference's parallel forward."""
import json
import os

import pytest
import torch

import make_vectors
import safetensors_io
from export import load_model


def vec_dir(root, case):
    return os.path.join(root, "tests", "vectors", case)


def committed_tau(root, case):
    with open(os.path.join(vec_dir(root, case), "config.json")) as f:
        return json.load(f)["tau"]


@pytest.mark.parametrize("case", list(make_vectors.CASES))
def test_vectors_regenerate(root, case, tmp_path):
    make_vectors.make_random_case(str(tmp_path), case, committed_tau(root, case))
    for name in ("model.safetensors", "case.safetensors"):
        want, want_meta = safetensors_io.load(os.path.join(vec_dir(root, case), name))
        got, got_meta = safetensors_io.load(os.path.join(tmp_path, case, name))
        assert want_meta == got_meta and want.keys() == got.keys()
        for k in want:
            assert want[k].dtype == got[k].dtype and want[k].shape == got[k].shape, k
            if k == "live":  # may differ only at ties of the eviction criterion
                ties = want["margin"].abs() < 1e-4
                assert torch.equal(want[k][~ties], got[k][~ties])
            else:  # float32 rounding differs with the CPU's kernels: scale with the magnitude
                scale = max(1.0, want[k].float().abs().max().item())
                assert torch.allclose(want[k].float(), got[k].float(), atol=1e-5 * scale), k


@pytest.mark.parametrize("case", list(make_vectors.CASES))
def test_vectors_match_parallel_forward(root, case):
    model = load_model(vec_dir(root, case))
    t, meta = safetensors_io.load(os.path.join(vec_dir(root, case), "case.safetensors"))
    tau = float(meta["tau"])
    assert meta["kind"] == model.cfg.attention and tau == model.cfg.tau
    tokens = t["tokens"].long()[None]
    with torch.no_grad():
        logits, layers = model(tokens, return_layers=True)
        evict = model(tokens, tau=tau)
    assert torch.allclose(logits[0], t["logits"], atol=1e-4)
    assert torch.allclose(evict[0], t["evict_logits"], atol=1e-4)
    for i, h in enumerate(layers):
        assert torch.allclose(h[0], t[f"layer_out.{i}"], atol=1e-4)
    evicted = 1 - t["live"][-1].float().mean().item()
    if case == "softmax":
        assert evicted == 0
    else:
        assert 0.2 <= evicted <= 0.8, "the case must evict a real share of its keys"
        assert not torch.allclose(t["logits"], t["evict_logits"], atol=1e-3)


def test_shipped_case_matches_shipped_model(root):
    path = os.path.join(vec_dir(root, "shipped"), "case.safetensors")
    if not os.path.exists(path):
        pytest.skip("no shipped model vectors yet")
    t, meta = safetensors_io.load(path)
    model = load_model(os.path.join(root, meta["model_dir"]))
    tau = float(meta["tau"])
    tokens = t["tokens"].long()[None]
    with torch.no_grad():
        assert torch.allclose(model(tokens)[0], t["logits"], atol=1e-4)
        assert torch.allclose(model(tokens, tau=tau)[0], t["evict_logits"], atol=1e-4)
    assert t["live"][-1].float().mean() < 1.0, "the trained walk evicts at the shipped tau"

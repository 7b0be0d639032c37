"""The PyTorch reference runs the published Forgetting Transformer checkpoints (tests/vectors/hf,
written by the published model code itself) to the logits that code computed: the parallel
forward and the literal step-by-step decode, without eviction and at the case's tau."""
import os

import pytest
import torch

import hf_checkpoint
import reference
import safetensors_io

HF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vectors", "hf")
CASES = sorted(os.listdir(HF))


def load_case(case):
    tensors, meta = safetensors_io.load(os.path.join(HF, case, "case.safetensors"))
    tensors = {k: torch.as_tensor(v) for k, v in tensors.items()}
    tau = None if meta["tau"] == "none" else float(meta["tau"])
    return hf_checkpoint.load(os.path.join(HF, case)), tensors, tau


def close(got, want):
    """Within 1e-4 of the published code's float32 logits, relative to their magnitude."""
    return (got - want).abs().max().item() <= 1e-4 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("case", CASES)
def test_parallel_forward_matches_published_code(case):
    model, t, tau = load_case(case)
    tokens = t["tokens"].long()
    with torch.no_grad():
        assert close(model(tokens[None])[0], t["logits"])
        if tau is not None:
            assert close(model(tokens[None], tau=tau)[0], t["evict_logits"])


@pytest.mark.parametrize("case", CASES)
def test_step_by_step_decode_matches_published_code(case):
    model, t, tau = load_case(case)
    out = reference.decode_steps(model, t["tokens"].long(), tau)
    assert close(out["logits"], t["evict_logits"] if tau is not None else t["logits"])
    if tau is not None:
        assert not out["live"][-1].all(), "the case's tau must evict keys"


def test_fox_pro_options_stay_out_of_the_native_format():
    cfg = reference.Config(attention="fox", levels="tied", k_shift=True)
    with pytest.raises(ValueError, match="FoX Pro"):
        cfg.to_json()
    with pytest.raises(ValueError, match="options of fox models"):
        reference.Config(attention="fpa", qk_norm=True)


def test_unknown_and_unsupported_keys_refused_by_name():
    with open(os.path.join(HF, "fox_pro", "config.json")) as f:
        base = __import__("json").load(f)
    for change, name in [({"rope_scaling": 2}, "rope_scaling"), ({"num_kv_heads": 2}, "num_kv_heads"),
                         ({"use_rope": True}, "use_rope"), ({"hidden_act": "gelu"}, "hidden_act")]:
        with pytest.raises(ValueError, match=name):
            hf_checkpoint.config_from_hf(base | change)

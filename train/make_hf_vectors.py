"""Golden vectors for the Hugging Face format (tests/vectors/hf/), made by the published model
classes of the Forgetting Transformer repository (zhixuan-lin/forgetting-transformer, read at
commit 883f260c636e87971339749b0d8310004794a5cc), not by a transcription of them.

That code needs CUDA-only pieces, which are replaced here by plain PyTorch of the same formula,
and nothing else is changed:
- forgetting_attention (Triton): softmax(q.k * sm_scale + cumsum(log_fgate)_i - ..._j), causal;
- the fused RMSNorm / GroupNorm / gated GroupNorm (Triton): the files' own rms_norm_ref,
  group_norm_ref and group_norm_gated_ref;
- token_shift (Triton): the reference in token_shift.py's own test;
- swiglu_fwd (a CUDA jiterator): silu(x) * y;
- the Transformer baseline's flash_attn_func: causal softmax attention; its RoPE (fla's
  RotaryEmbedding, Triton) by the repository's own copy of it in rotary.py with
  apply_rotary_emb_torch;
- fla_utils (which GPU the Triton kernels use): the two names the norms import, inert;
- transformers, einops and triton are not installed here: minimal stand-ins (PretrainedConfig
  keeps the config's keys, PreTrainedModel an nn.Module, rearrange for the patterns used).
The saved directory is what save_pretrained writes: config.json (the config's keys, model_type,
architectures) and model.safetensors (the state dict; lm_head.weight left out when tied).

    python3 train/make_hf_vectors.py FOX_REPO_CHECKOUT OUT_DIR

Each case directory holds the model and case.safetensors: tokens [T] and logits [T, V] (full
causal forward), and for forgetting-transformer cases evict_logits [T, V] at the tau of its
__metadata__: the same forward with every key whose decay sum(log f over (j, i]) <= -tau masked,
which is what fpa-serve's fox eviction keeps (a FoX decay never recovers).
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import types
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

TAU = {"value": None}  # the eviction threshold of the forward being run (None: full cache)


def rearrange(x, pattern, **sizes):
    """einops.rearrange for the axis patterns the model code uses (groups in parentheses)."""
    lhs, rhs = [side.strip() for side in pattern.split("->")]
    def parse(side):
        return re.findall(r"\([^)]*\)|\.\.\.|\S+", side)
    left, right = parse(lhs), parse(rhs)
    if left[0] == "...":
        left = [f"_e{i}" for i in range(x.dim() - len(left) + 1)] + left[1:]
        right = [f"_e{i}" for i in range(x.dim() - len(parse(lhs)) + 1)] + right[1:]
    names, shape = [], []
    known = dict(sizes)
    for item, size in zip(left, x.shape):
        if item.startswith("("):
            parts = item[1:-1].split()
            missing = [p for p in parts if p not in known]
            prod = math.prod(known[p] for p in parts if p in known)
            if missing:
                known[missing[0]] = size // prod
            names += parts
            shape += [known[p] for p in parts]
        else:
            known[item] = size
            names.append(item)
            shape.append(size)
    x = x.reshape(shape)
    flat = [p for item in right for p in (item[1:-1].split() if item.startswith("(") else [item])
            if p != "1"]
    x = x.permute([names.index(p) for p in flat])
    out = []
    for item in right:
        if item == "1":
            out.append(1)
        elif item.startswith("("):
            out.append(math.prod(known[p] for p in item[1:-1].split()))
        else:
            out.append(known[item])
    return x.reshape(out)


def repeat(x, pattern):
    """einops.repeat for the one pattern RoPE uses: "... d -> ... 1 (2 d)"."""
    assert pattern == "... d -> ... 1 (2 d)", pattern
    return torch.cat([x, x], dim=-1).unsqueeze(-2)


class Output(dict):
    """transformers' ModelOutput: a dict with attribute access, indexable by position."""
    def __init__(self, **kw):
        super().__init__({k: v for k, v in kw.items() if v is not None})
    __getattr__ = dict.get
    def __getitem__(self, k):
        return list(self.values())[k] if isinstance(k, int) else dict.__getitem__(self, k)
    def to_tuple(self):
        return tuple(self.values())


class PretrainedConfig:
    model_type = ""
    def __init__(self, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                 tie_word_embeddings=True, **kwargs):
        self.pad_token_id, self.bos_token_id, self.eos_token_id = (
            pad_token_id, bos_token_id, eos_token_id)
        self.tie_word_embeddings = tie_word_embeddings
        self.output_attentions = self.output_hidden_states = False
        self.use_return_dict = True
        for k, v in kwargs.items():
            setattr(self, k, v)
    def to_dict(self):
        skip = {"output_attentions", "output_hidden_states", "use_return_dict"}
        d = {k: v for k, v in vars(self).items() if k not in skip}
        d["model_type"] = self.model_type
        return d


class PreTrainedModel(torch.nn.Module):
    def __init__(self, config, *args, **kwargs):
        super().__init__()
        self.config = config
    def post_init(self):
        self.apply(self._init_weights)
        if self.config.tie_word_embeddings and hasattr(self, "lm_head"):
            self.lm_head.weight = self.model.embeddings.weight
    def gradient_checkpointing_enable(self, *a, **k):
        pass


def install_stand_ins():
    for name in ["triton", "triton.language", "triton.language.extra",
                 "triton.language.extra.libdevice", "triton.runtime"]:
        sys.modules[name] = mock.MagicMock(name=name)
    # No GPU: fla_utils falls back to the CPU when asking the driver fails.
    active = sys.modules["triton"].runtime.driver.active
    active.get_current_target.side_effect = RuntimeError("no GPU")
    active.utils.get_device_properties.side_effect = RuntimeError("no GPU")
    einops = types.ModuleType("einops")
    einops.rearrange = rearrange
    einops.repeat = repeat
    sys.modules["einops"] = einops
    tf = {n: types.ModuleType(n) for n in [
        "transformers", "transformers.activations", "transformers.cache_utils",
        "transformers.modeling_outputs", "transformers.modeling_utils", "transformers.utils",
        "transformers.configuration_utils"]}
    tf["transformers.activations"].ACT2FN = {"swish": F.silu, "sigmoid": torch.sigmoid}
    tf["transformers.cache_utils"].Cache = object
    tf["transformers.cache_utils"].DynamicCache = object
    tf["transformers.modeling_outputs"].BaseModelOutputWithPast = Output
    tf["transformers.modeling_outputs"].CausalLMOutputWithPast = Output
    tf["transformers.modeling_utils"].PreTrainedModel = PreTrainedModel
    tf["transformers.utils"].logging = types.SimpleNamespace(get_logger=logging.getLogger)
    tf["transformers.configuration_utils"].PretrainedConfig = PretrainedConfig
    registry = types.SimpleNamespace(register=lambda *a, **k: None)
    for n in ["AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoTokenizer"]:
        setattr(tf["transformers"], n, registry)
    tf["transformers"].PretrainedConfig = PretrainedConfig
    sys.modules.update(tf)


def plain_forgetting_attention(q, k, v, log_fgate, *, head_first=False, seq_start=None,
                               sm_scale=None, adaptive_threshold=None):
    """The Triton kernel's formula (head_first [B, H, T, D]); keys past TAU masked."""
    assert head_first and seq_start is None
    T = q.shape[2]
    c = torch.cumsum(log_fgate.float(), dim=-1)          # [B, H, T]
    decay = c[..., :, None] - c[..., None, :]             # sum of log f over (j, i]
    scores = (q.float() @ k.float().transpose(-1, -2)) * sm_scale + decay
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if TAU["value"] is not None:
        mask = mask & (decay > -TAU["value"])
    scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)


def plain_flash_attn(q, k, v, causal=True, window_size=(-1, -1)):
    """flash_attn_func ([B, T, H, D]), causal, no window."""
    assert causal and window_size == (-1, -1)
    qh, kh, vh = (x.transpose(1, 2).float() for x in (q, k, v))
    T = q.shape[1]
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2).to(q.dtype)


def import_model_code(repo):
    sys.path.insert(0, os.path.join(repo, "src"))
    install_stand_ins()
    # fla_utils only picks the GPU for the Triton kernels (and asserts CUDA under PyTorch < 2.4):
    # the two names the norms import from it, inert.
    utils = types.ModuleType("forgetting_transformer.model.forgetting_transformer.fla_utils")
    utils.get_multiprocessor_count = lambda *a, **k: -1
    utils.input_guard = lambda fn: fn
    sys.modules[utils.__name__] = utils
    from forgetting_transformer.model.forgetting_transformer import (  # noqa: E402
        fuse_norm_gate, glu_linear, layernorm, modeling_forgetting_transformer as fox, rotary)
    layernorm.rms_norm = lambda x, w, b, residual=None, eps=1e-5, prenorm=False, \
        residual_in_fp32=False: layernorm.rms_norm_ref(x, w, b, residual, eps, prenorm, True)
    layernorm.group_norm = lambda x, w, b, residual=None, eps=1e-5, prenorm=False, \
        residual_in_fp32=False, is_rms_norm=False, num_groups=1: layernorm.group_norm_ref(
            x, w, b, num_groups, residual, eps, is_rms_norm, prenorm, True)

    def group_norm_gated(x, g, w, b, activation="swish", residual=None, prenorm=False,
                         residual_in_fp32=False, is_rms_norm=False, num_groups=1, eps=1e-6):
        assert activation == "sigmoid"  # the reference gates with a sigmoid
        return fuse_norm_gate.group_norm_gated_ref(x, g, w, b, num_groups, residual, eps,
                                                   is_rms_norm, prenorm, True)
    fuse_norm_gate.group_norm_gated = group_norm_gated

    def token_shift(x, prev_weight, curr_weight):  # token_shift.py's own test reference
        x_prev = torch.roll(x, shifts=1, dims=1)
        x_prev[:, 0] = 0.0
        return (x_prev * prev_weight[..., None] + x * curr_weight[..., None]).to(x.dtype)
    fox.token_shift = token_shift
    glu_linear.swiglu_fwd = lambda x, y: (F.silu(x.float()) * y.float()).to(x.dtype)
    glu_linear.glu_fwd = lambda x, y: (torch.sigmoid(x.float()) * y.float()).to(x.dtype)
    fox.forgetting_attention = plain_forgetting_attention
    rotary.apply_rotary_emb_func = lambda x, cos, sin, interleaved=False, seqlen_offsets=0: \
        rotary.apply_rotary_emb_torch(x, cos[seqlen_offsets:seqlen_offsets + x.shape[1]],
                                      sin[seqlen_offsets:seqlen_offsets + x.shape[1]],
                                      interleaved)
    fla = {n: types.ModuleType(n) for n in ["fla", "fla.modules", "fla.modules.activations"]}
    fla["fla.modules"].RotaryEmbedding = rotary.RotaryEmbedding
    fla["fla.modules"].RMSNorm = layernorm.RMSNorm
    fla["fla.modules"].FusedCrossEntropyLoss = None
    fla["fla.modules.activations"].swiglu_linear = glu_linear.swiglu_linear
    flash = types.ModuleType("flash_attn")
    flash.flash_attn_func = plain_flash_attn
    flash.flash_attn_varlen_func = None
    sys.modules.update(fla)
    sys.modules["flash_attn"] = flash
    sys.modules["flash_attn.bert_padding"] = types.SimpleNamespace(
        index_first_axis=None, pad_input=None, unpad_input=None)
    from forgetting_transformer.model.transformer import modeling_transformer as tr  # noqa: E402
    from forgetting_transformer.model.forgetting_transformer import (  # noqa: E402
        configuration_forgetting_transformer as fox_config)
    from forgetting_transformer.model.transformer import (  # noqa: E402
        configuration_transformer as tr_config)
    return {"fox": (fox_config.ForgettingTransformerConfig, fox.ForgettingTransformerForCausalLM),
            "transformer": (tr_config.TransformerConfig, tr.TransformerForCausalLM)}


SMALL = dict(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_heads=4, norm_eps=1e-6,
             bos_token_id=256, eos_token_id=257)
CASES = {
    # FoX (LLaMA): the forget gate on a LLaMA-style block, untied head.
    "fox_llama": ("fox", dict(SMALL), 6.0),
    # FoX with tied embeddings and an explicit MLP width.
    "fox_tied": ("fox", dict(SMALL, tie_word_embeddings=True, intermediate_size=48), 4.0),
    # The Transformer baseline: RoPE, tied.
    "transformer": ("transformer", dict(SMALL, tie_word_embeddings=True, rope_base=10000.0),
                    None),
    # FoX Pro: every Pro option (fpa-serve refuses key/value shift until it is implemented).
    "fox_pro": ("fox", dict(SMALL, use_output_gate=True, use_output_norm=True, qk_norm=True,
                            use_k_shift=True, use_v_shift=True, hidden_ratio=3.5), 6.0),
    # FoX Pro less the shift: QK-norm, the output gate and its GroupRMSNorm.
    "fox_pro_noshift": ("fox", dict(SMALL, use_output_gate=True, use_output_norm=True,
                                    qk_norm=True, hidden_ratio=3.5), 6.0),
    # The older checkpoints' QK-norm scale shared across heads; the output norm alone.
    "fox_qknorm_shared": ("fox", dict(SMALL, qk_norm=True, qk_norm_share_param_across_head=True,
                                      use_output_norm=True), 6.0),
    # The output gate alone, with silu (the published swiglu_linear path).
    "fox_ogate_silu": ("fox", dict(SMALL, use_output_gate=True, ogate_act="silu"), 6.0),
}


def randomize(model, seed):
    """Weights large enough that gates, norms and attention all matter (the published init is
    0.02-scaled, near-uniform logits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("_norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("fgate_proj.bias"):
                p.copy_(2.0 + torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def save_pretrained(model, config, arch, out):
    os.makedirs(out, exist_ok=True)
    d = config.to_dict()
    d["architectures"] = [arch]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight")
    safetensors_io.save(os.path.join(out, "model.safetensors"), state, {"format": "pt"})


def main():
    repo, out_root = sys.argv[1], sys.argv[2]
    classes = import_model_code(repo)
    torch.manual_seed(0)
    for i, (name, (family, kw, tau)) in enumerate(CASES.items()):
        config_cls, model_cls = classes[family]
        config = config_cls(**kw)
        model = model_cls(config).eval()
        randomize(model, 100 + i)
        tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(i))
        tokens[0, 0] = 256
        with torch.no_grad():
            TAU["value"] = None
            logits = model(input_ids=tokens, use_cache=False).logits[0].float()
            case = {"tokens": tokens[0].to(torch.int32), "logits": logits}
            if tau is not None:
                TAU["value"] = tau
                case["evict_logits"] = model(input_ids=tokens, use_cache=False).logits[0].float()
                TAU["value"] = None
        out = os.path.join(out_root, name)
        save_pretrained(model, config, model_cls.__name__, out)
        safetensors_io.save(os.path.join(out, "case.safetensors"), case,
                            {"tau": tau if tau is not None else "none",
                             "source": "zhixuan-lin/forgetting-transformer@883f260c"})
        print(name, "logits", tuple(logits.shape), "max |logit|", float(logits.abs().max()))


if __name__ == "__main__":
    main()

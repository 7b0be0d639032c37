"""A Hugging Face directory of the Forgetting Transformer family (docs/model-format.md) as a
reference `Model`: config.json mapped onto `Config`, the weights renamed to the reference's.

The mapping is the one model/hf_config.cc and model/weight_names.cc implement; only what those
accept is accepted here (an unknown key is refused by name), so the reference and the server
read a directory alike. tests/python/test_hf_reference.py checks the result against the logits
the published model code computed (tests/vectors/hf).
"""
from __future__ import annotations

import json
import math
import os

import torch

import reference
import safetensors_io

_NO_EFFECT = {
    "model_type", "architectures", "transformers_version", "torch_dtype", "_name_or_path",
    "auto_map", "use_cache", "initializer_range", "fuse_norm", "fuse_cross_entropy",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "pad_token_id", "max_position_embeddings", "log_pruning_tolerance", "bos_token_id",
    "eos_token_id"}
_COMMON = {"vocab_size", "hidden_size", "hidden_ratio", "intermediate_size", "num_hidden_layers",
           "num_heads", "num_kv_heads", "hidden_act", "window_size", "elementwise_affine",
           "norm_eps", "tie_word_embeddings", "attention_bias", "rope_base", "use_rope"}
_FOX = {"use_output_gate", "ogate_act", "fgate_type", "fgate_bias_init", "decay_time_min",
        "decay_time_max", "use_output_norm", "qk_norm", "qk_norm_share_param_across_head",
        "use_k_shift", "use_v_shift"}
# A key that must keep the value the server implements (absent is that value too).
_REQUIRED = {"hidden_act": "swish", "window_size": None,
             "attention_bias": False, "elementwise_affine": True, "fgate_type": "full",
             "fgate_bias_init": False, "decay_time_min": None, "decay_time_max": None}


def config_from_hf(c: dict) -> reference.Config:
    fox = c.get("model_type") in ("forgetting_transformer", "forgetting_transformer-project_fox")
    if not fox and c.get("model_type") not in ("transformer", "transformer-project_fox"):
        raise ValueError(f"model_type {c.get('model_type')!r} is not of the FoX family")
    for key in c:
        if key not in _NO_EFFECT | _COMMON | (_FOX if fox else set()):
            raise ValueError(f"{key!r} is an option fpa-serve does not know")
    for key, value in _REQUIRED.items():
        if c.get(key, value) != value:
            raise ValueError(f"{key} = {c[key]!r} is not supported (only {value!r})")
    if c.get("num_kv_heads") not in (None, c["num_heads"]):
        raise ValueError("num_kv_heads must equal num_heads (or be null): no grouped KV heads")
    if fox and c.get("use_rope", False):
        raise ValueError("use_rope = true is not supported beside the forget gate")
    d, h = c["hidden_size"], c["num_heads"]
    d_ff = c.get("intermediate_size") or 256 * math.ceil(int(d * c.get("hidden_ratio", 4) * 2 / 3)
                                                         / 256)
    options = {}
    if fox:
        options = {"qk_norm": c.get("qk_norm", False),
                   "qk_norm_shared": c.get("qk_norm_share_param_across_head", False),
                   "output_norm": c.get("use_output_norm", False),
                   "output_gate": c.get("ogate_act", "sigmoid") if c.get("use_output_gate") else "",
                   "k_shift": c.get("use_k_shift", False), "v_shift": c.get("use_v_shift", False)}
    rope = 0.0 if fox or not c.get("use_rope", True) else float(c.get("rope_base", 500000.0))
    return reference.Config(
        d_model=d, n_layers=c["num_hidden_layers"], n_heads=h, head_dim=d // h, d_ff=d_ff,
        attention="fox" if fox else "softmax", levels="tied", rope_theta=rope,
        norm_eps=c.get("norm_eps", 1e-6), tie_embeddings=c.get("tie_word_embeddings", True),
        vocab_size=c["vocab_size"], **options)


def _layer_names(cfg: reference.Config, layer: int) -> dict:
    """reference name -> Hugging Face name, for one layer (the fused gate_proj apart)."""
    p, r = f"model.layers.{layer}.", f"layers.{layer}."
    names = {"attn_norm.weight": "attn_norm.weight", "mlp_norm.weight": "mlp_norm.weight",
             "attn.wq": "attn.q_proj.weight", "attn.wo": "attn.o_proj.weight",
             "attn.wk": "attn.k_proj.linear.weight" if cfg.k_shift else "attn.k_proj.weight",
             "attn.wv": "attn.v_proj.linear.weight" if cfg.v_shift else "attn.v_proj.weight",
             "mlp.w_down": "mlp.down_proj.weight"}
    if cfg.attention == "fox":
        names |= {"attn.field_w": "attn.fgate_proj.weight", "attn.field_b": "attn.fgate_proj.bias"}
    optional = {"q_norm": "q_norm.weight", "k_norm": "k_norm.weight",
                "out_norm": "output_norm.weight", "ogate": "ogate_proj.weight",
                "k_shift": "k_proj.shift_proj.weight", "v_shift": "v_proj.shift_proj.weight"}
    present = {"q_norm": cfg.qk_norm, "k_norm": cfg.qk_norm, "out_norm": cfg.output_norm,
               "ogate": bool(cfg.output_gate), "k_shift": cfg.k_shift, "v_shift": cfg.v_shift}
    names |= {f"attn.{k}": f"attn.{v}" for k, v in optional.items() if present[k]}
    return {r + k: p + v for k, v in names.items()}


def load(model_dir: str) -> reference.Model:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    tensors, _ = safetensors_io.load(os.path.join(model_dir, "model.safetensors"))
    tensors = {k: torch.as_tensor(v).float() for k, v in tensors.items()}
    names = {"embed.weight": "model.embeddings.weight", "final_norm.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    state = {}
    for layer in range(cfg.n_layers):
        names |= _layer_names(cfg, layer)
        gate, up = tensors[f"model.layers.{layer}.mlp.gate_proj.weight"].chunk(2)
        state |= {f"layers.{layer}.mlp.w_gate": gate, f"layers.{layer}.mlp.w_up": up}
    state |= {ours: tensors[theirs] for ours, theirs in names.items()}
    model = reference.Model(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()

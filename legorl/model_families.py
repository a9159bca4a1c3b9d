"""Tiny random-init models of each architecture family LEGO-RL supports, for tests and benches.

No model hub is reachable from our machines, so a family is checked on a model built from a
config: a few layers, hidden 64, the bundled 4096-token tokenizer. Each config keeps the one
thing that makes its family different — Qwen3.5's Gated-DeltaNet layers mixed 3:1 with full
attention and its shared expert, gpt-oss's sliding-window layers with attention sinks and its
biased router, GLM-4.5 / DeepSeek-V3's grouped sigmoid top-k with a shared expert and dense
first layer — so what passes here is the code path the full-size model takes.

    model = build("qwen3_5_moe")               # an nn.Module in eval mode, fp32
    path = save("gpt_oss", tmp_dir)            # an HF model directory the engines can load
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from legorl.models import TOKENIZER_DIR

_COMMON: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

_LINEAR: dict[str, Any] = {  # Gated-DeltaNet layers, 3 of them per full-attention layer
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_hidden_layers": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", {"num_hidden_layers": 2, "intermediate_size": 128}),  # the bundled tiny-qwen3
    "llama": ("llama", {"num_hidden_layers": 2, "intermediate_size": 128}),  # smollm2-135m-instruct
    "qwen3_moe": (
        "qwen3_moe",
        {
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
        },
    ),
    "qwen2_moe": (
        "qwen2_moe",
        {
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": False,
        },
    ),
    "qwen3_5_moe": (
        "qwen3_5_moe_text",
        {
            **_LINEAR,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
        },
    ),
    "qwen3_5": ("qwen3_5_text", {**_LINEAR, "intermediate_size": 128}),
    "gpt_oss": (
        "gpt_oss",
        {
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "glm4_moe": (
        "glm4_moe",
        {
            "num_hidden_layers": 3,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "partial_rotary_factor": 0.5,
        },
    ),
    "deepseek_v3": (
        "deepseek_v3",
        {
            "num_hidden_layers": 3,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "num_key_value_heads": 4,
            "head_dim": 8,
        },
    ),
}

# Families whose MoE selection depends on a learned bias too: random init leaves it at 0,
# which would hide a router that ignores it, so `build` gives it a random value.
_SCORE_BIAS = ("e_score_correction_bias",)


def config(family: str):  # -> transformers.PretrainedConfig
    """The tiny config of `family` (one of FAMILIES)."""
    from transformers import AutoConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}: expected one of {', '.join(FAMILIES)}")
    model_type, extra = FAMILIES[family]
    return AutoConfig.for_model(model_type, **{**_COMMON, **extra})


def build(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A random-init causal LM of `family`, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(family), dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith(_SCORE_BIAS):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.05)
    return model.eval()


def save(family: str, directory: str | Path, seed: int = 0) -> Path:
    """An HF model directory (config, weights, the bundled tokenizer) of `family`."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    build(family, seed).save_pretrained(out, safe_serialization=True)
    for f in TOKENIZER_DIR.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, out / f.name)
    return out

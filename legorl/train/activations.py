"""How much memory a micro-batch's activations take, and whether to checkpoint them.

Why: without checkpointing, backward needs every decoder layer's intermediate tensors of the
whole micro-batch. For SmolLM2-135M (30 layers, hidden 576, MLP 1536) that measured ~2 MB a
token in fp32: a 4096-token micro-batch held ~8 GB, four times the model's weights, gradients
and AdamW state together, and a 24 GB machine ran out. With checkpointing only each layer's
input is kept (plus one layer's intermediates while it is recomputed), for about one more
forward of compute. A tiny model (the quickstart's: 2 layers, hidden 128) keeps ~30 kB a
token and would only pay the recompute, so `gradient_checkpointing = "auto"` decides per
model from the estimate below.

The estimate counts the tensors a transformers decoder layer saves for backward: ~18 of the
hidden width (norms, q/k/v/o, rotary, residuals, attention output) and 4 of the MLP width
(gate, up, activation, product), at the parameters' width. It is an estimate, not a bound;
`bench/quickstart.py` and the run's `mem/peak_rss_gb` measure what a run really held.
"""

from __future__ import annotations

from typing import Any

from torch import nn

HIDDEN_TENSORS = 18  # saved tensors of the hidden width per layer and token (fitted to SmolLM2: 2.0 MB/token)
MLP_TENSORS = 4  # saved tensors of the MLP width per layer and token


def activation_bytes_per_token(lm: nn.Module) -> int:
    """Estimated bytes one token's activations keep for backward, over all decoder layers."""
    cfg: Any = lm.config.get_text_config(decoder=True) if hasattr(lm.config, "get_text_config") else lm.config
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    mlp = int(getattr(cfg, "intermediate_size", 0) or getattr(cfg, "moe_intermediate_size", 0) or 4 * hidden)
    width = next(lm.parameters()).element_size()
    return layers * (HIDDEN_TENSORS * hidden + MLP_TENSORS * mlp) * width


def wants_checkpointing(setting: bool | str, lm: nn.Module, tokens: int, budget_gb: float) -> bool:
    """`setting` if it is a bool; for "auto", whether `tokens` tokens' activations exceed `budget_gb`."""
    if isinstance(setting, bool):
        return setting
    return activation_bytes_per_token(lm) * tokens > budget_gb * 1e9

"""Softmax top-k routers (Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE and the Qwen3-VL/Omni text
models): logits = x Wᵀ; p = softmax(logits, fp32); top-k of p; renormalised when the model
normalises its top-k (Qwen3.5 always does); cast to the logits dtype. Qwen3.5's and Qwen2's
shared expert sits beside the router in the block and is not routed, so nothing here touches it.

Replay: p is still computed over all experts from the live logits, gathered at the replayed
experts, then renormalised the same way."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from legorl.train.routers.select import Routed, replayed

CLASSES = frozenset(
    {
        "Qwen2MoeTopKRouter",
        "Qwen3MoeTopKRouter",
        "Qwen3NextTopKRouter",
        "Qwen3_5MoeTopKRouter",
        "Qwen3VLMoeTextTopKRouter",
        "Qwen3OmniMoeThinkerTextTopKRouter",
    }
)


def route(router: nn.Module, hidden_states: torch.Tensor, replay_N_K: torch.Tensor | None, router_fp32: bool) -> Routed:
    h_N_H = hidden_states.reshape(-1, router.weight.shape[1])
    if router_fp32:
        logits_N_E = F.linear(h_N_H.float(), router.weight.float())
    else:
        logits_N_E = F.linear(h_N_H, router.weight)
    probs_N_E = F.softmax(logits_N_E, dtype=torch.float, dim=-1)
    top_val_N_K, natural_N_K = torch.topk(probs_N_E, router.top_k, dim=-1)
    idx_N_K = replayed(natural_N_K, replay_N_K)
    if replay_N_K is not None:
        top_val_N_K = probs_N_E.gather(1, idx_N_K)
    if getattr(router, "norm_topk_prob", True):
        top_val_N_K = top_val_N_K / top_val_N_K.sum(dim=-1, keepdim=True)
    return Routed((logits_N_E, top_val_N_K.to(logits_N_E.dtype), idx_N_K), natural_N_K)

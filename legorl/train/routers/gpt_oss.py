"""gpt-oss's router: logits = x Wᵀ + b; the top-k *logits* pick the experts; their gate weights
are the softmax over those k logits only (in the logits dtype).

Replay: the live logits are gathered at the replayed experts and soft-maxed over those k, so
the weights (and the router's gradient) follow the current router as in the model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from legorl.train.routers.select import Routed, replayed

CLASSES = frozenset({"GptOssTopKRouter"})


def route(router: nn.Module, hidden_states: torch.Tensor, replay_N_K: torch.Tensor | None, router_fp32: bool) -> Routed:
    h_N_H = hidden_states.reshape(-1, router.weight.shape[1])
    if router_fp32:
        logits_N_E = F.linear(h_N_H.float(), router.weight.float(), router.bias.float())
    else:
        logits_N_E = F.linear(h_N_H, router.weight, router.bias)
    top_val_N_K, natural_N_K = torch.topk(logits_N_E, router.top_k, dim=-1)
    idx_N_K = replayed(natural_N_K, replay_N_K)
    if replay_N_K is not None:
        top_val_N_K = logits_N_E.gather(1, idx_N_K)
    scores_N_K = F.softmax(top_val_N_K, dim=1, dtype=top_val_N_K.dtype).to(hidden_states.dtype)
    return Routed((logits_N_E.to(hidden_states.dtype), scores_N_K, idx_N_K), natural_N_K)

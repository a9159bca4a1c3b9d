"""Grouped sigmoid top-k routers (GLM-4.5-MoE, DeepSeek-V3): s = sigmoid(x Wᵀ) in fp32; the
*choice* adds the load-balancing bias `e_score_correction_bias` to s, keeps the `topk_group`
groups whose two best experts score highest, and takes the top-k there; the gate weights are
s (without the bias) at the chosen experts, renormalised when `norm_topk_prob`, times
`routed_scaling_factor`. The block's shared experts run beside the routed ones, unrouted.

Replay: the recorded experts replace the whole choice (bias and groups included); their
weights are the live s gathered at them, renormalised and scaled the same way. The router
always runs in fp32 here (as in the model), so `router_fp32` changes nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from legorl.train.routers.select import Routed, replayed

CLASSES = frozenset({"Glm4MoeTopkRouter", "DeepseekV3TopkRouter"})


def route(router: nn.Module, hidden_states: torch.Tensor, replay_N_K: torch.Tensor | None, router_fp32: bool) -> Routed:
    del router_fp32  # always fp32
    h_N_H = hidden_states.view(-1, router.hidden_dim)
    logits_N_E = F.linear(h_N_H.type(torch.float32), router.weight.type(torch.float32))
    scores_N_E = logits_N_E.sigmoid()
    choice_N_E = scores_N_E + router.e_score_correction_bias
    n, groups, experts = choice_N_E.shape[0], router.num_group, router.num_experts
    group_N_G = choice_N_E.view(-1, groups, experts // groups).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_N_G, k=router.topk_group, dim=-1, sorted=False)[1]
    group_mask_N_G = torch.zeros_like(group_N_G)
    group_mask_N_G.scatter_(1, group_idx, 1)
    score_mask_N_E = group_mask_N_G.unsqueeze(-1).expand(n, groups, experts // groups).reshape(-1, experts)
    choice_N_E = choice_N_E.masked_fill(~score_mask_N_E.bool(), float("-inf"))
    natural_N_K = torch.topk(choice_N_E, k=router.top_k, dim=-1, sorted=False)[1]
    idx_N_K = replayed(natural_N_K, replay_N_K)
    weights_N_K = scores_N_E.gather(1, idx_N_K)
    if router.norm_topk_prob:
        weights_N_K /= weights_N_K.sum(dim=-1, keepdim=True) + 1e-20
    weights_N_K = weights_N_K * router.routed_scaling_factor
    return Routed((logits_N_E, weights_N_K, idx_N_K), natural_N_K)

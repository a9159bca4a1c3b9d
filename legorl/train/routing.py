"""MoE routing capture and replay (R3) for transformers' softmax-top-k routers.

The engine records, for every token and MoE layer, the top-k experts it routed to. In the
trainer's forward `moe_routing(model, replay_N_L_K)` makes every router *select* those
experts, while the gate weights are recomputed from the live router logits — softmax over
all experts, gathered at the replayed indices, renormalised when the model normalises its
top-k — so gradients still reach the router (verl/slime/Megatron do the same).

It works by giving each router instance its own `forward` for the duration of the context
(an instance attribute shadowing the class method; nothing in site-packages is edited, and
the original is restored on exit even on error). The replacement computes exactly what the
installed transformers router computes (modeling_qwen3_moe.Qwen3MoeTopKRouter.forward), so
with nothing to replay, or a replay equal to the router's own choice, outputs are bitwise
unchanged. Rows whose recorded experts are -1 (not recorded) keep the router's own choice.

Every call is recorded (experts used, and what the router itself would have chosen), which
also serves the reference sampler; gradient checkpointing re-runs a layer's forward and
appends a second call, so readers take the first call of a full-sequence forward.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

# Routers whose forward is: logits = x Wᵀ; p = softmax(logits, fp32); top-k of p; optional
# renormalisation; cast to the logits dtype; returns (logits, weights, indices).
SOFTMAX_TOPK_ROUTERS = frozenset(
    {
        "Qwen2MoeTopKRouter",
        "Qwen3MoeTopKRouter",
        "Qwen3NextTopKRouter",
        "Qwen3_5MoeTopKRouter",
        "Qwen3VLMoeTextTopKRouter",
        "Qwen3OmniMoeThinkerTextTopKRouter",
    }
)


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's routers in layer order (one per MoE layer); [] for a dense model."""
    found = [m for m in model.modules() if type(m).__name__ in SOFTMAX_TOPK_ROUTERS]
    if not found and any(type(m).__name__.endswith(("Router", "TopkRouter")) for m in model.modules()):
        raise ValueError(
            "this MoE architecture's router is not supported for routing capture/replay; "
            f"supported: {', '.join(sorted(SOFTMAX_TOPK_ROUTERS))}"
        )
    return found


@dataclass
class RoutingRecord:
    """Per layer, per router call: the experts used (N, K) and the router's own top-k (N, K)."""

    used: list[list[torch.Tensor]] = field(default_factory=list)
    natural: list[list[torch.Tensor]] = field(default_factory=list)

    def first_call(self, which: str = "used") -> torch.Tensor:
        """(N, L, K) from the first call of every layer (a full-sequence forward)."""
        calls = self.used if which == "used" else self.natural
        return torch.stack([c[0] for c in calls], dim=1)


def _routing_forward(
    router: nn.Module,
    hidden_states: torch.Tensor,
    *,
    layer: int,
    replay_N_L_K: torch.Tensor | None,
    router_fp32: bool,
    record: RoutingRecord,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h_N_H = hidden_states.reshape(-1, router.weight.shape[1])
    if router_fp32:
        logits_N_E = F.linear(h_N_H.float(), router.weight.float())
    else:
        logits_N_E = F.linear(h_N_H, router.weight)
    probs_N_E = F.softmax(logits_N_E, dtype=torch.float, dim=-1)
    top_val_N_K, natural_N_K = torch.topk(probs_N_E, router.top_k, dim=-1)
    idx_N_K = natural_N_K
    if replay_N_L_K is not None:
        rows_N_K = replay_N_L_K[:, layer]
        if rows_N_K.shape[0] != h_N_H.shape[0]:
            raise RuntimeError(
                f"routing replay has {rows_N_K.shape[0]} token rows but MoE layer {layer} sees {h_N_H.shape[0]} tokens"
            )
        known_N_1 = (rows_N_K >= 0).all(dim=-1, keepdim=True)
        idx_N_K = torch.where(known_N_1, rows_N_K, natural_N_K)
        top_val_N_K = probs_N_E.gather(1, idx_N_K)
    if getattr(router, "norm_topk_prob", True):
        top_val_N_K = top_val_N_K / top_val_N_K.sum(dim=-1, keepdim=True)
    record.used[layer].append(idx_N_K.detach())
    record.natural[layer].append(natural_N_K.detach())
    return logits_N_E, top_val_N_K.to(logits_N_E.dtype), idx_N_K


@contextmanager
def moe_routing(
    model: nn.Module,
    replay_N_L_K: torch.Tensor | None = None,
    *,
    router_fp32: bool = False,
) -> Iterator[RoutingRecord]:
    """Capture (and with `replay_N_L_K`, replay) the routing of every MoE layer."""
    routers = moe_routers(model)
    record = RoutingRecord([[] for _ in routers], [[] for _ in routers])
    if replay_N_L_K is not None:
        if not routers:
            raise ValueError("routing replay given for a model without supported MoE routers")
        if replay_N_L_K.ndim != 3 or replay_N_L_K.shape[1] != len(routers):
            raise ValueError(
                f"routing replay must be (tokens, {len(routers)} MoE layers, top_k), got {tuple(replay_N_L_K.shape)}"
            )
        top_k, experts = routers[0].top_k, routers[0].weight.shape[0]
        if replay_N_L_K.shape[2] != top_k:
            raise ValueError(f"routing replay has top_k {replay_N_L_K.shape[2]}, the model uses {top_k}")
        if int(replay_N_L_K.max()) >= experts:
            raise ValueError(f"routing replay names expert {int(replay_N_L_K.max())}; the model has {experts}")
    for layer, router in enumerate(routers):

        def fwd(self: nn.Module, hidden_states: torch.Tensor, _layer: int = layer):
            return _routing_forward(
                self, hidden_states, layer=_layer, replay_N_L_K=replay_N_L_K,
                router_fp32=router_fp32, record=record,
            )  # fmt: skip

        router.forward = types.MethodType(fwd, router)
    try:
        yield record
    finally:
        for router in routers:
            del router.forward


def routing_mismatch(a_N_L_K: torch.Tensor, b_N_L_K: torch.Tensor, valid_N: torch.Tensor) -> tuple[int, int]:
    """(mismatched, total) (token, layer) pairs whose expert *sets* differ, over valid tokens.

    Same definition as shared/bench/mismatch_probe.py: sort the k indices, a pair mismatches
    if any differs; the rate is mismatched / (tokens × layers).
    """
    a = a_N_L_K[valid_N].sort(dim=-1).values
    b = b_N_L_K[valid_N].sort(dim=-1).values
    differ = (a != b).any(dim=-1)
    return int(differ.sum()), int(differ.numel())

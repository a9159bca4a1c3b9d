"""MoE routing capture and replay (R3) for transformers' MoE routers (adapters in `routers/`).

The engine records, for every token and MoE layer, the top-k experts it routed to. In the
trainer's forward `moe_routing(model, replay_N_L_K)` makes every router *select* those
experts, while the gate weights are recomputed from the live router logits — by the model's
own rule (softmax over all experts, softmax over the k, or biased sigmoid), evaluated at the
replayed indices — so gradients still reach the router (verl/slime/Megatron do the same).

It works by giving each router instance its own `forward` for the duration of the context
(an instance attribute shadowing the class method; nothing in site-packages is edited, and
the original is restored on exit even on error). The replacement is the router family's
adapter (`routers/`: softmax top-k for Qwen2/3/3.5-MoE, gpt-oss's biased top-k, the grouped
sigmoid top-k of GLM-4.5 and DeepSeek-V3), which computes exactly what the installed
transformers router computes, so with nothing to replay, or a replay equal to the router's
own choice, outputs are bitwise unchanged. Rows whose recorded experts are -1 (not
recorded) keep the router's own choice.

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
from torch import nn

from legorl.train.routers import adapter, moe_routers

__all__ = ["RoutingRecord", "moe_routers", "moe_routing", "routing_mismatch"]


@dataclass
class RoutingRecord:
    """Per layer, per router call: the experts used (N, K) and the router's own top-k (N, K)."""

    used: list[list[torch.Tensor]] = field(default_factory=list)
    natural: list[list[torch.Tensor]] = field(default_factory=list)

    def first_call(self, which: str = "used") -> torch.Tensor:
        """(N, L, K) from the first call of every layer (a full-sequence forward)."""
        calls = self.used if which == "used" else self.natural
        return torch.stack([c[0] for c in calls], dim=1)


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
        route = adapter(router)

        def fwd(self: nn.Module, hidden_states: torch.Tensor, _layer: int = layer, _route=route):
            rows_N_K = replay_N_L_K[:, _layer] if replay_N_L_K is not None else None
            try:
                routed = _route(self, hidden_states, rows_N_K, router_fp32)
            except RuntimeError as exc:  # name the layer
                raise RuntimeError(f"MoE layer {_layer}: {exc}") from exc
            record.used[_layer].append(routed.outputs[2].detach())
            record.natural[_layer].append(routed.natural_N_K.detach())
            return routed.outputs

        router.forward = types.MethodType(fwd, router)
    try:
        yield record
    finally:
        for router in routers:
            del router.forward


def routing_mismatch(a_N_L_K: torch.Tensor, b_N_L_K: torch.Tensor, valid_N: torch.Tensor) -> tuple[int, int]:
    """(mismatched, total) (token, layer) pairs whose expert *sets* differ, over valid tokens.

    The usual definition (bench/mismatch.py reports it): sort the k indices, a pair mismatches
    if any differs; the rate is mismatched / (tokens × layers).
    """
    a = a_N_L_K[valid_N].sort(dim=-1).values
    b = b_N_L_K[valid_N].sort(dim=-1).values
    differ = (a != b).any(dim=-1)
    return int(differ.sum()), int(differ.numel())

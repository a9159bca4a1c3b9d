"""Routing capture and replay, one adapter per router shape.

Each adapter module knows one way a router turns hidden states into a top-k selection and
gate weights, and re-states it as `route(router, h_N_H, replay_N_K, router_fp32) -> Routed`:
with `replay_N_K` None it computes exactly what the installed transformers router computes
(bitwise), otherwise it uses the replayed experts and recomputes their gate weights from the
live router logits, so the router keeps its gradient (R3, arXiv 2510.11370).

| module | router shape | classes |
| --- | --- | --- |
| `softmax_topk` | softmax over experts, top-k, optional renormalisation | Qwen2/3/3.5-MoE, Qwen3-Next |
| `gpt_oss` | top-k of biased logits, softmax over the k | gpt-oss |
| `grouped_topk` | sigmoid + score-correction bias, top groups, top-k, renormalise, scale | GLM-4.5-MoE, DeepSeek-V3 |

A model whose MoE layers use any other router is refused by name (`moe_routers`): an MoE
model silently trained without replay would look supported and not be.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from torch import nn

from legorl.train.routers import gpt_oss, grouped_topk, softmax_topk
from legorl.train.routers.select import Routed

Route = Callable[..., Routed]
ADAPTERS: dict[str, ModuleType] = {name: mod for mod in (softmax_topk, gpt_oss, grouped_topk) for name in mod.CLASSES}


def adapter(router: nn.Module) -> Route:
    """The `route` function of this router's class."""
    return ADAPTERS[type(router).__name__].route


def _looks_like_router(module: nn.Module) -> str | None:
    """The router class name of an MoE part we have no adapter for, else None."""
    name = type(module).__name__
    if name in ADAPTERS:
        return None
    if name.endswith(("Router", "TopkRouter", "TopKRouter")):
        return name
    if hasattr(module, "experts"):
        gate = getattr(module, "gate", None)
        gate = gate if gate is not None else getattr(module, "router", None)
        if isinstance(gate, nn.Module) and type(gate).__name__ not in ADAPTERS:
            return type(gate).__name__
    return None


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's routers in layer order (one per MoE layer); [] for a dense model.
    Raises ValueError naming the router class when a model's MoE layers have no adapter."""
    unsupported = sorted({n for m in model.modules() if (n := _looks_like_router(m))})
    if unsupported:
        raise ValueError(
            f"this MoE architecture's router ({', '.join(unsupported)}) is not supported for routing "
            f"capture/replay; supported: {', '.join(sorted(ADAPTERS))}"
        )
    return [m for m in model.modules() if type(m).__name__ in ADAPTERS]

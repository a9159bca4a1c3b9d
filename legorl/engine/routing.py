"""Recording which experts each token was routed to, by hooking a model's MoE routers.

Rollout Routing Replay (R3) needs, for every token the policy saw, the top-k expert
indices chosen in every MoE layer (arXiv 2510.11370). We record them by a
forward hook on each router: `model.model.layers[i].mlp.gate` (`.mlp.router` for gpt-oss).
In transformers ≥ 5 every MoE router (Qwen2/3/3.5-MoE, gpt-oss, GLM-4.5, DeepSeek-V3) returns
`(router_logits, router_scores, router_indices)` — the indices being the experts the block
then runs, whatever the selection rule (softmax, biased logits, grouped sigmoid); older routers are an `nn.Linear`
returning logits, and the top-k is then recomputed here from those logits (softmax is
monotone, so the selection is the same). Layers without experts (`mlp_only_layers`,
`decoder_sparse_step`) are skipped: "layer l" means the l-th MoE layer.

The same recorder serves the engine (prompt and generated tokens) and tests/the trainer
(a fresh full forward over the same ids), so both sides define routing identically.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from legorl.types import Routing, as_routing


def moe_gates(model: nn.Module) -> list[nn.Module]:
    """The router of each MoE layer, in layer order (empty for dense models)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        return []
    gates = []
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        gate = getattr(mlp, "gate", None) if mlp is not None else None
        if gate is None and mlp is not None:
            gate = getattr(mlp, "router", None)  # gpt-oss
        if gate is not None and hasattr(mlp, "experts"):
            gates.append(gate)
    return gates


def moe_top_k(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    k = getattr(config, "num_experts_per_tok", None) or getattr(config, "moe_topk", None)
    if not k:
        raise ValueError("MoE model config has no num_experts_per_tok: cannot record routing")
    return int(k)


class RoutingRecorder:
    """Hooks every router of `model`; while `recording`, keeps each forward's indices.

    Only forwards run on the thread that called `start()` are recorded, so another
    thread using the same module (a trainer sharing the engine's model) is not mixed in.
    """

    def __init__(self, model: nn.Module) -> None:
        self.gates = moe_gates(model)
        self.num_layers = len(self.gates)
        self.top_k = moe_top_k(model) if self.gates else 0
        self._indices: list[list[torch.Tensor]] = [[] for _ in range(self.num_layers)]
        self._thread: int | None = None
        self._handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, layer: int) -> Callable[[nn.Module, Any, Any], None]:
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if self._thread != threading.get_ident():
                return
            if isinstance(output, tuple) and output and output[-1].dtype in (torch.int64, torch.int32):
                idx_N_K = output[-1]
            else:
                logits = output[0] if isinstance(output, tuple) else output
                idx_N_K = logits.float().topk(self.top_k, dim=-1).indices
            self._indices[layer].append(idx_N_K.reshape(-1, idx_N_K.shape[-1]).detach())

        return hook

    def start(self) -> None:
        """Record the following forwards run on this thread (e.g. the chunks of one prefill)."""
        self._indices = [[] for _ in range(self.num_layers)]
        self._thread = threading.get_ident()

    def take(self, batch: int) -> torch.Tensor:
        """Stop recording; the indices since `start()`, concatenated over the forwards'
        token dimension, as `idx_B_T_L_K` (int16, CPU)."""
        self._thread = None
        chunks, self._indices = self._indices, [[] for _ in range(self.num_layers)]
        if any(len(c) != len(chunks[0]) or not c for c in chunks):
            raise RuntimeError("routing was not recorded for every MoE layer in every forward")
        per_layer = [torch.cat([i.reshape(batch, -1, i.shape[-1]) for i in c], dim=1) for c in chunks]
        return torch.stack(per_layer, dim=2).to(device="cpu", dtype=torch.int16)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@torch.no_grad()
def routed_experts(model: nn.Module, ids: list[int]) -> Routing:
    """Routing of a fresh full forward over `ids`: (token, moe_layer, k) expert indices."""
    recorder = RoutingRecorder(model)
    try:
        if not recorder.gates:
            raise ValueError("model has no MoE layers: there is no routing to record")
        device = next(model.parameters()).device
        recorder.start()
        model(input_ids=torch.tensor([ids], device=device), use_cache=False)
        return as_routing(recorder.take(1)[0].numpy())
    finally:
        recorder.close()

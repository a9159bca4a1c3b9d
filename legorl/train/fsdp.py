"""Data-parallel training under torchrun with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Launch: `torchrun --nproc-per-node N your_loop.py`; every rank builds the same `Trainer` and
calls `step()` with the *same* list of trajectories (the loop broadcasts them); each rank
packs the whole batch identically, takes its share of micro-batches (`batch.split_balanced`)
and runs dummy zero-loss micro-batches to match the busiest rank, because every FSDP forward
and backward is a collective. Losses are normalised by global token/unit counts, so the
gradients must be *summed* over ranks; FSDP averages them, so the trainer multiplies each
rank's loss by the world size before backward (`set_gradient_divide_factor(1)` would say the
same but needs PREMUL_SUM, which gloo lacks). The result equals one process over the whole
batch (tested with 2 CPU processes on gloo).

Sharding: each decoder layer is one FSDP unit, the `PolicyModel` wrapper the root (it owns
the embeddings and the LM head, which the chunked logprob head uses inside its forward).
With `dtype = "bfloat16"` parameters stay fp32 (AdamW master weights) and FSDP computes in
bf16 with fp32 gradient reduction (`MixedPrecisionPolicy`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "cpu", *, single: bool = False) -> DistInfo:
    """Join the torchrun process group (gloo on CPU, nccl on CUDA). Outside torchrun: nothing,
    or with `single` a one-rank group on loopback (FSDP2 mixed precision on one device)."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if "WORLD_SIZE" not in os.environ and not dist.is_initialized():
        if not single:
            return DistInfo()
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shard(policy: nn.Module, layers: list[nn.Module], *, compute_dtype: torch.dtype | None) -> None:
    """Apply FSDP2 to each decoder layer, then to the root (the wrapper owning the LM head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if compute_dtype else None
    kwargs = {"mp_policy": mp} if mp is not None else {}
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(policy, **kwargs)


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict (a collective when sharded: every rank must call it)."""
    if not is_sharded(module):
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def all_reduce_(t: torch.Tensor, op: str) -> torch.Tensor:
    """In-place all-reduce of a CPU or device tensor ('sum', 'max', 'min'); no-op when alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if dist.get_backend() == "nccl" and t.device.type == "cpu":
        dev = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(dev, op=ops[op])
        t.copy_(dev.cpu())
    else:
        dist.all_reduce(t, op=ops[op])
    return t

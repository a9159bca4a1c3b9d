"""Checkpoints that resume exactly: weights, optimizer, scheduler, every RNG, step, data position.

A run killed at any instant (even mid-save) resumes from the newest *complete* checkpoint and
computes the same next step as a run that was never interrupted (bitwise on CPU fp32, tested
by SIGKILLing a real training process). Completeness comes from atomic publication: a
checkpoint is written into a hidden temporary directory, flushed, and renamed into place, so
`step_00000012/` either exists whole or not at all.

Layout of `step_XXXXXXXX/`:
- `model/`       HF `save_pretrained` directory (safetensors + config): also what vLLM/SGLang
                 load on a weight sync from disk, and a usable model on its own
- `trainer.pt`   optimizer (parameters keyed by name), scheduler, step, policy version,
                 data position (the loop's own JSON-able dict), the resolved config
- `rng_rank{r}.pt` python, numpy, torch (CPU and CUDA) generator states of each rank

Under FSDP every rank takes part in gathering full state dicts; rank 0 writes the files.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from legorl.train.fsdp import full_state_dict, is_sharded

STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); no partial one is left."""


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _optim_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(
    directory: str | Path,
    *,
    lm: nn.Module,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    version: int,
    data_state: dict[str, Any],
    config: dict[str, Any],
    rank: int = 0,
    keep: int = 2,
) -> Path:
    """Write `directory/step_XXXXXXXX` atomically and prune the older ones (lower steps) to
    the newest `keep`. A checkpoint of a higher step is never a reason to delete this one
    (nor is it deleted: it is not this run's to judge, `--resume` checks whose it is)."""
    directory = Path(directory)
    final = directory / f"step_{step:08d}"
    tmp = directory / f".tmp_step_{step:08d}"
    weights = full_state_dict(lm)
    optim = _optim_state(policy, optimizer)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            lm.save_pretrained(tmp / "model", state_dict=weights, safe_serialization=True)
            torch.save(
                {
                    "optimizer": optim,
                    "scheduler": scheduler.state_dict(),
                    "step": step,
                    "version": version,
                    "data_state": data_state,
                    "config": config,
                },
                tmp / "trainer.pt",
            )
        except Exception as e:  # a full disk (OSError, SafetensorError): nothing half-written stays behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(f"cannot write checkpoint {final}: {e}") from e
    _barrier()
    if tmp.exists():  # always, except on other nodes without a shared filesystem
        torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
    _barrier()
    if rank == 0:
        _fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        older = [p for p in list_checkpoints(directory) if p.name < final.name]
        for old in older[: max(len(older) - keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and STEP_DIR.match(p.name))


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def load_checkpoint(
    path: str | Path,
    *,
    lm: nn.Module,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
) -> dict[str, Any]:
    """Restore everything in place; returns {step, version, data_state, config}."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(path)
    if not (path / "trainer.pt").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no trainer.pt)")
    weights = _read_hf_weights(path / "model", next(lm.parameters()).dtype)
    state = torch.load(path / "trainer.pt", weights_only=False)
    opts = StateDictOptions(full_state_dict=True, strict=True)
    if is_sharded(lm):
        set_model_state_dict(lm, weights, options=opts)
    else:
        missing, unexpected = lm.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {path} does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
    set_optimizer_state_dict(policy, optimizer, state["optimizer"], options=opts)
    scheduler.load_state_dict(state["scheduler"])
    rng_file = path / f"rng_rank{rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return {k: state[k] for k in ("step", "version", "data_state", "config")}


def _read_hf_weights(model_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's own state dict from an HF directory.

    `save_pretrained` rewrites some weights into the hub layout (e.g. transformers 5 stores
    Qwen3-MoE experts fused as 3-D tensors in memory but saves them per expert), so the files
    cannot be loaded key by key: `from_pretrained` applies the reverse conversion (exact
    copies, no arithmetic), as the engines do on a weight sync from disk.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    return {k: v.detach() for k, v in fresh.state_dict().items()}


def weights_dir(path: str | Path) -> Path:
    """The HF model directory a warm-start path names (itself, or a checkpoint's model/)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if not (path / "config.json").exists():
        step = path if (path / "trainer.pt").exists() else latest_checkpoint(path)
        if step is None or not (step / "model" / "config.json").exists():
            raise ValueError(f"{path} is neither an HF model directory nor a checkpoint (step_XXXXXXXX/model/)")
        path = step / "model"
    return path


# what makes two configs the same architecture (a different value: the weights cannot fit)
_ARCH_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_experts",
)


def check_weights_fit(config: Any, path: str | Path) -> Path:
    """Before anything runs: the directory's config.json describes the model `config` does
    (reads one small file, not the weights). ValueError naming the first difference."""
    d = weights_dir(path)
    try:
        theirs = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{d}: unreadable config.json: {e}") from None
    ours = config.to_dict()
    text = ours.get("text_config") or {}
    for k in _ARCH_KEYS:
        a, b = ours.get(k, text.get(k)), theirs.get(k, (theirs.get("text_config") or {}).get(k))
        if a != b:
            raise ValueError(
                f"{d} does not match the model: {k} is {b!r} there, {a!r} here (a checkpoint of another model)"
            )
    return d


def load_weights(lm: nn.Module, path: str | Path) -> Path:
    """Load only the model weights of a checkpoint (`step_XXXXXXXX/`, a directory holding
    them: the newest) or of an HF model directory into `lm`. ValueError naming what does not
    fit when the architecture differs."""
    path = weights_dir(path)
    ours = lm.state_dict()
    try:
        theirs = _read_hf_weights(path, next(iter(ours.values())).dtype)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: cannot be loaded as a model: {e}") from None
    missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    shapes = [
        f"{k} {tuple(theirs[k].shape)} vs {tuple(v.shape)}"
        for k, v in ours.items()
        if k in theirs and theirs[k].shape != v.shape
    ]
    if missing or extra or shapes:
        parts = [
            f"{len(missing)} missing (e.g. {missing[0]})" if missing else "",
            f"{len(extra)} unexpected (e.g. {extra[0]})" if extra else "",
            f"{len(shapes)} of another shape (e.g. {shapes[0]})" if shapes else "",
        ]
        raise ValueError(f"{path} does not match the model: weights " + ", ".join(p for p in parts if p))
    lm.load_state_dict(theirs, strict=True)
    return path


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()

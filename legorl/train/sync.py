"""Weight sync: after each trainer step, the engines sample from the new weights.

`WeightSync` is what the trainer calls; two implementations cover the engines:

- `InProcessSync(engine)` hands the full state dict to an engine in the same process
  (`HFEngine.update_weights(state_dict, version)` copies it in place between two generation
  steps; no disk, no serialisation).
- `DiskSync(engines, directory)` writes an HF model directory (safetensors + config) and
  calls `await engine.update_weights_from_disk(path, version)` on each engine: the path for
  vLLM/SGLang servers, which reload from a directory they can read. A tied model is written
  *untied* (`lm_head.weight` materialised, `tie_word_embeddings = false`): vLLM-CPU keeps
  the LM head it packed at start-up when a tied model reloads, so it serves an untied copy
  (`legorl.engine.vllm_server.served_copy`) and every update must stay untied (`untie=True`).

The version passed is the trainer's policy version after the step; the engine stamps it on
every turn it then serves, so `trainer.version - turn.policy_version` is the staleness the
trainer reports (`policy/staleness_mean`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from legorl.compute_thread import in_own_thread
from legorl.engine.base import WeightsFromDisk, WeightsInPlace


@runtime_checkable
class WeightSync(Protocol):
    async def push(self, lm: nn.Module, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Make the engines serve `state_dict` (the full, unsharded weights of `lm`) as `version`."""
        ...


class InProcessSync:
    """Copy weights straight into in-process engines (e.g. legorl.engine.hf.HFEngine)."""

    def __init__(self, *engines: WeightsInPlace) -> None:
        for e in engines:
            if not isinstance(e, WeightsInPlace):
                raise TypeError(f"{type(e).__name__} has no update_weights(state_dict, version)")
        self.engines = engines

    async def push(self, lm: nn.Module, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        await asyncio.gather(*(e.update_weights(state_dict, version) for e in self.engines))


class DiskSync:
    """Save an HF directory per version and point engines at it; keeps the newest `keep`."""

    def __init__(
        self,
        engines: Sequence[WeightsFromDisk],
        directory: str | Path,
        keep: int = 2,
        *,
        in_place: bool = False,
        untie: bool = True,
    ) -> None:
        """`in_place=True` overwrites the files of `directory` itself (vLLM can only reload the
        directory it was launched on); otherwise each version gets its own `v<N>` directory."""
        for e in engines:
            if not isinstance(e, WeightsFromDisk):
                raise TypeError(f"{type(e).__name__} has no update_weights_from_disk(path, version)")
        self.engines = list(engines)
        self.directory = Path(directory)
        self.keep = max(keep, 1)
        self.in_place = in_place
        self.untie = untie

    async def push(self, lm: nn.Module, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        path = await in_own_thread(self._write, lm, state_dict, version)
        await asyncio.gather(*(e.update_weights_from_disk(path, version) for e in self.engines))
        self._prune()

    def _write(self, lm: nn.Module, state_dict: Mapping[str, torch.Tensor], version: int) -> Path:
        final = self.directory / f"v{version:08d}"
        tmp = (self.directory.parent if self.in_place else self.directory) / f".tmp_v{version:08d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        lm.save_pretrained(tmp, state_dict=dict(state_dict), safe_serialization=True)
        if self.untie:
            from legorl.engine.vllm_server import untie_dir

            untie_dir(tmp)
        if self.in_place:  # file by file: the tokenizer and other files of the served dir stay
            self.directory.mkdir(parents=True, exist_ok=True)
            for f in tmp.iterdir():
                os.replace(f, self.directory / f.name)
            tmp.rmdir()
            return self.directory
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

    def _prune(self) -> None:
        if self.in_place:
            return
        versions = sorted(p for p in self.directory.glob("v*") if p.is_dir())
        for old in versions[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

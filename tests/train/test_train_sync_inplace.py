"""Weight sync for engines that reload only the directory they serve (vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from legorl.loop.config import RunConfig
from legorl.loop.startup import make_weight_sync
from legorl.models import resolve_model
from legorl.train.sync import DiskSync


class ServedDirEngine:
    """Stands in for VLLMEngine's contract: only the served directory may be reloaded."""

    def __init__(self, served: Path) -> None:
        self.served_model_dir = str(served)
        self.loaded: list[tuple[Path, int]] = []

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        assert Path(path).resolve() == Path(self.served_model_dir).resolve()
        self.loaded.append((Path(path), version))


async def test_in_place_sync_overwrites_the_served_dir(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    (served / "tokenizer.json").write_text("{}")  # other files of the served dir survive
    engine = ServedDirEngine(served)
    sync = make_weight_sync(engine, tmp_path / "run")
    assert isinstance(sync, DiskSync) and sync.in_place
    lm = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-qwen3"))
    sd = {k: v.clone() for k, v in lm.state_dict().items()}
    sd["model.norm.weight"] += 1.0
    await sync.push(lm, sd, 3)
    assert engine.loaded == [(served, 3)] and (served / "tokenizer.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(served)
    assert torch.equal(reloaded.state_dict()["model.norm.weight"], sd["model.norm.weight"])
    assert not list(tmp_path.glob(".tmp_v*"))


def test_run_config_rejects_sampling_the_trainer_cannot_recompute() -> None:
    with pytest.raises(ValueError, match="trainer.temperature"):
        RunConfig.model_validate({"proxy": {"temperature": 0.7}})
    with pytest.raises(ValueError, match="top_p must be 1"):
        RunConfig.model_validate({"proxy": {"top_p": 0.9}})
    RunConfig.model_validate({"proxy": {"temperature": 0.7}, "trainer": {"temperature": 0.7}})

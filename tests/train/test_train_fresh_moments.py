"""GSPO after the demonstrations' SFT can start from fresh AdamW moments (`[warm_start]
gspo_moments = "fresh"`), as it does after a checkpoint warm start: the first GSPO step is
then exactly a new optimizer's first step from the same weights."""

from __future__ import annotations

import copy

import pytest
import torch

from legorl.loop.config import WarmStartSection
from legorl.train.config import TrainerConfig
from legorl.train.sft import SFTConfig
from legorl.train.trainer import Trainer
from tests.helpers.train_util import toy_trajectories

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _after_sft() -> Trainer:
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3, seed=0))
    trainer.sft(toy_trajectories(trainer.lm), SFTConfig(steps=3, batch_size=4, lr=1e-3, warmup_steps=1))
    return trainer


def test_fresh_moments_make_the_next_step_a_new_optimizers_first() -> None:
    carried = _after_sft()
    assert carried.optimizer.state  # SFT left its moments
    fresh = copy.deepcopy(carried)
    fresh.fresh_moments()
    assert not fresh.optimizer.state
    new = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3, seed=0), lm=copy.deepcopy(carried.lm))
    batch = toy_trajectories(carried.lm, n=8, prompts=2)  # groups whose rewards differ
    for t in (carried, fresh, new):
        torch.manual_seed(0)
        assert t.step(copy.deepcopy(batch))["train/trained"] == 1.0
    for a, b in zip(fresh.lm.parameters(), new.lm.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    moved = max(
        float((a - b).detach().abs().max()) for a, b in zip(carried.lm.parameters(), new.lm.parameters(), strict=True)
    )
    assert moved > 1e-6  # the carried moments take another step: the knob changes something


def test_the_knob_is_checked_at_config_load() -> None:
    assert WarmStartSection().gspo_moments == "carry"
    with pytest.raises(ValueError, match="gspo_moments"):
        WarmStartSection(gspo_moments="reset")

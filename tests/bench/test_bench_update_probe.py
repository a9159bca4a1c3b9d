"""bench/update_probe.py: replaying stored GSPO steps from the warm start under a setting. An
update on a batch raises what won and lowers what lost in that batch (adv_dlogp > 0) and moves
the policy off its start (kl_start > 0); a zero learning rate moves nothing; a setting naming
no `[trainer]` key is refused in one line."""

from __future__ import annotations

import pytest
import torch

from bench.update_probe import main, parse_setting, probe, trainer_config
from legorl.train.config import TrainerConfig
from legorl.train.trainer import Trainer
from tests.helpers.train_util import toy_trajectories

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _batch() -> tuple[dict[str, torch.Tensor], list]:
    torch.manual_seed(0)
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", seed=0))
    return trainer.lm.state_dict(), toy_trajectories(trainer.lm, n=8, prompts=2)


def test_an_update_moves_the_policy_toward_what_won_and_a_zero_lr_moves_nothing() -> None:
    state, batch = _batch()
    base = TrainerConfig(model="tiny-qwen3", seed=0).model_dump()
    moved = probe(trainer_config(base, parse_setting("lr=3e-3")), state, [batch, batch], batch)
    assert len(moved) == 2
    assert moved[0]["adv_dlogp"] > 0 and moved[0]["kl_start"] > 0
    assert moved[1]["adv_dlogp"] > moved[0]["adv_dlogp"]  # a second update on the same batch goes further
    still = probe(trainer_config(base, parse_setting("lr=0")), state, [batch], batch)
    assert still[0]["adv_dlogp"] == pytest.approx(0.0, abs=1e-9) and still[0]["kl_start"] == pytest.approx(0, abs=1e-9)


def test_a_setting_must_name_trainer_keys_and_a_run_dir_must_hold_a_warm_start(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="lrr not a \\[trainer\\] key"):
        trainer_config({}, parse_setting("lrr=1e-3"))
    with pytest.raises(ValueError, match="expected key=value"):
        parse_setting("lr")
    assert main([str(tmp_path)]) == 2
    assert "run.sqlite not found" in capsys.readouterr().err

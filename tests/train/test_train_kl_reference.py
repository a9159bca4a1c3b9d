"""`[trainer] kl_coef`: a k3 KL penalty toward the policy as RL started (π_ref). The estimator
is what GRPO's β term uses; the trainer holds a frozen copy of the weights when
`set_reference` is called; a run keeps that copy on disk so that a resume pulls toward it."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from legorl.loop import phases
from legorl.loop.run_dir import KL_REFERENCE_FILE, RUN_OUTPUTS
from legorl.train.config import TrainerConfig
from legorl.train.losses import k3_kl_N
from legorl.train.trainer import Trainer
from tests.helpers.train_util import toy_trajectories

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_k3_is_zero_where_the_policies_agree_and_positive_elsewhere() -> None:
    logp_N = torch.log(torch.tensor([0.5, 0.9, 0.2, 0.99]))
    ref_N = torch.log(torch.tensor([0.5, 0.6, 0.4, 0.999]))
    kl_N = k3_kl_N(logp_N, ref_N)
    assert float(kl_N[0]) == 0.0
    assert bool((kl_N[1:] > 0).all())
    # its mean over samples from π is KL(π‖π_ref): two outcomes, exact expectation
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.4, 0.6])
    expected = float((p * (p / q).log()).sum())
    assert float((p * k3_kl_N(p.log(), q.log())).sum()) == pytest.approx(expected, rel=1e-6)
    # the gradient raises a token the reference finds likelier, lowers one it finds less likely
    x_N = torch.log(torch.tensor([0.3, 0.6])).requires_grad_()
    k3_kl_N(x_N, torch.log(torch.tensor([0.6, 0.3]))).sum().backward()
    assert float(x_N.grad[0]) < 0 < float(x_N.grad[1])


def _drift(trainer: Trainer, start: list[torch.Tensor]) -> float:
    return sum(float((p.detach() - s).pow(2).sum()) for p, s in zip(trainer.lm.parameters(), start, strict=True)) ** 0.5


def _run(kl_coef: float, steps: int = 6) -> tuple[Trainer, list[dict[str, float]], float]:
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=3e-3, seed=0, kl_coef=kl_coef))
    start = [p.detach().clone() for p in trainer.lm.parameters()]
    if kl_coef > 0:
        trainer.set_reference()
    batch = toy_trajectories(trainer.lm, n=8, prompts=2)  # groups whose rewards differ
    metrics = []
    for _ in range(steps):
        torch.manual_seed(0)
        metrics.append(trainer.step(copy.deepcopy(batch)))
    return trainer, metrics, _drift(trainer, start)


def test_the_penalty_holds_the_policy_nearer_the_reference() -> None:
    _, free_metrics, free = _run(0.0)
    held, metrics, anchored = _run(50.0)
    assert "train/kl_ref" not in free_metrics[0]
    assert metrics[0]["train/kl_ref"] == pytest.approx(0.0, abs=1e-9)  # the first forward *is* π_ref
    assert metrics[-1]["train/kl_ref"] > 0.0
    assert anchored < free  # same batches, same seed: only the penalty differs
    assert held.reference is not None
    assert all(not p.requires_grad for p in held.reference.parameters())


def test_a_kept_reference_is_read_back_on_resume(tmp_path: Path) -> None:
    assert KL_REFERENCE_FILE in RUN_OUTPUTS  # `--overwrite` clears it with the run's other outputs
    cfg = SimpleNamespace(trainer=TrainerConfig(model="tiny-qwen3", kl_coef=0.1), run=SimpleNamespace(dir=tmp_path))
    first = Trainer(cfg.trainer)
    phases.hold_kl_reference(SimpleNamespace(cfg=cfg, trainer=first))  # type: ignore[arg-type]
    assert (tmp_path / KL_REFERENCE_FILE).is_file()
    resumed = Trainer(cfg.trainer.model_copy(update={"seed": 1}))  # other weights, as after some GSPO steps
    phases.hold_kl_reference(SimpleNamespace(cfg=cfg, trainer=resumed))  # type: ignore[arg-type]
    assert resumed.reference is not None and first.reference is not None
    for a, b in zip(resumed.reference.lm.parameters(), first.reference.lm.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    off = SimpleNamespace(trainer=TrainerConfig(model="tiny-qwen3"), run=SimpleNamespace(dir=tmp_path / "off"))
    plain = Trainer(off.trainer)
    phases.hold_kl_reference(SimpleNamespace(cfg=off, trainer=plain))  # type: ignore[arg-type]
    assert plain.reference is None and not (tmp_path / "off").exists()


def test_a_negative_coefficient_is_refused_at_config_load() -> None:
    with pytest.raises(ValueError, match="kl_coef"):
        TrainerConfig(model="tiny-qwen3", kl_coef=-0.1)

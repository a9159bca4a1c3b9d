"""The evaluation manifest's parts: failure classes, pass@k / pass@1 with their intervals,
the model and task hashes (`legorl eval` writing it end to end: tests/loop/test_loop_eval.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from legorl.loop.config import HarnessSection, RunConfig
from legorl.loop.manifest import failure_classes, harness_info, model_info, rates, sampling, sha256_tree, tasks_info
from legorl.loop.stats import wilson
from legorl.loop.worker import RolloutRecord
from legorl.models import resolve_model
from legorl.rollout import RolloutResult
from legorl.tasks.loader import load_shipped, shipped_tasks_dir
from legorl.trajectory import assemble
from legorl.types import Outcome, Status


def _rec(instance: str, status: Status, *, masked: bool = False) -> RolloutRecord:
    outcome = Outcome(1.0 if status is Status.RESOLVED else 0.0, status, masked=masked)
    traj = assemble([], f"{instance}-{id(outcome)}", instance_id=instance, harness="command", outcome=outcome)
    return RolloutRecord(traj, [], RolloutResult(instance, "command", outcome))


def test_failure_classes_separate_the_agent_from_the_infrastructure() -> None:
    recs = [
        _rec("a", Status.RESOLVED),
        _rec("a", Status.FAILED),
        _rec("b", Status.NO_PATCH),
        _rec("b", Status.SANDBOX_START_FAILED, masked=True),
        _rec("c", Status.INFRA_ERROR, masked=True),
    ]
    assert failure_classes(recs) == {"resolved": 1, "agent": 2, "infrastructure": 2, "masked": 2}


def test_pass_at_k_and_pass_at_1_with_intervals() -> None:
    # k = 2: task a 1 of 2, task b 0 of 2, task c 2 of 2, task d only masked samples (not scored)
    recs = [_rec("a", Status.RESOLVED), _rec("a", Status.FAILED), _rec("b", Status.FAILED), _rec("b", Status.FAILED)]
    recs += [_rec("c", Status.RESOLVED), _rec("c", Status.RESOLVED), _rec("d", Status.INFRA_ERROR, masked=True)]
    r = rates(recs, 2)
    assert r["pass@2"]["value"] == pytest.approx(2 / 3) and r["pass@2"]["tasks"] == 3
    assert r["pass@2"]["ci95"] == pytest.approx(list(wilson(2, 3)))
    assert r["pass@1"]["value"] == pytest.approx(0.5)
    low, high = r["pass@1"]["ci95"]
    assert 0.0 <= low < 0.5 < high <= 1.0 and "bootstrap" in r["pass@1"]["method"]
    assert rates(recs, 2) == r  # seeded: the same records give the same interval
    one = rates([_rec("a", Status.RESOLVED), _rec("b", Status.FAILED)], 1)
    assert one["pass@1"]["value"] == 0.5 and one["pass@1"]["ci95"] == pytest.approx(list(wilson(1, 2)))
    assert rates([_rec("d", Status.INFRA_ERROR, masked=True)], 1)["pass@1"]["value"] is None


def test_model_hash_follows_the_weights(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(resolve_model("tiny-qwen3"), model)
    cfg = RunConfig()
    cfg.engine.model = str(model)
    first = model_info(cfg, None)
    assert first["sha256"] == sha256_tree(model) and first["path"] == str(model)
    weights = next(p for p in model.iterdir() if p.suffix in (".safetensors", ".bin"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    assert model_info(cfg, None)["sha256"] != first["sha256"]
    ext = model_info(cfg, "http://127.0.0.1:9/v1")
    assert ext["endpoint"] == "http://127.0.0.1:9/v1" and ext["sha256"] is None
    cfg.proxy.temperature, cfg.proxy.max_tokens = 0.7, 256
    ours = sampling(cfg, None, 3)
    assert (ours["temperature"], ours["max_tokens"], ours["samples_per_task"]) == (0.7, 256, 3)
    assert "temperature" not in sampling(cfg, "http://127.0.0.1:9/v1", 3)  # relayed: the harness's own


def test_task_file_and_harness_versions(tmp_path: Path) -> None:
    import hashlib

    tasks = load_shipped("heldout")
    info = tasks_info(RunConfig(), "heldout", tasks)
    raw = (shipped_tasks_dir() / "heldout.jsonl").read_bytes()
    assert info["sha256"] == hashlib.sha256(raw).hexdigest() and info["count"] == len(tasks)
    from legorl.harness.install import MINI_SWE_AGENT_VERSION

    h = harness_info(RunConfig(harness=HarnessSection(name="mini-swe-agent")))
    assert h["version"] == MINI_SWE_AGENT_VERSION and set(h["layers"]) == {"python312", "mini-swe-agent"}
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    c = harness_info(RunConfig(harness=HarnessSection(name="command", command_file=script)))
    assert c["version"] is None and c["command_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()

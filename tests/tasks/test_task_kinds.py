"""Task kinds (`legorl/tasks/kinds/`): the one seam between a task's format and the runner.

Nothing outside the kinds switches on a task's format; a Harbor task honours or refuses
every `[sandbox]` knob, and a refused one fails when the config loads, in one line; the
grading knobs it honours reach its grader (`penalize_tamper`).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from legorl.config import ConfigError, validate
from legorl.harness.command import CommandHarness
from legorl.loop.config import RunConfig, SandboxSection, load_run_config
from legorl.rollout import RolloutConfig, run_rollout
from legorl.sandbox import open_backend
from legorl.tasks.image import TaskImages
from legorl.tasks.kinds import KINDS, kind_class, kind_of, source_kind
from legorl.tasks.kinds.harbor import HarborDir
from legorl.tasks.kinds.swebench import SweBenchRow
from legorl.tasks.loader import load_tasks
from legorl.verify.attempt import GradeConfig
from tests.helpers.paths import ROOT
from tests.helpers.redteam import HARBOR_FORGERIES, harbor_agent, harbor_task_dir

HARBOR = ROOT / "tests" / "fixtures" / "harbor" / "tasks"
# The [sandbox] knobs a Harbor task honours as they are; every other one it refuses.
HARBOR_HONOURS = {"backend", "retries", "pids", "penalize_tamper", "grade_empty_diff"}


def test_no_format_switch_outside_the_kinds() -> None:
    """`task.kind == "harbor"` (or any kind name) is tested nowhere but in the registry."""
    names = "|".join(re.escape(n) for n in KINDS)
    switch = re.compile(rf"""kind\s*[!=]=\s*["'](?:{names})["']|\bkind\s+in\s*[(\[{{]\s*["'](?:{names})["']""")
    found = []
    for path in sorted((ROOT / "legorl").rglob("*.py")):
        if (ROOT / "legorl" / "tasks" / "kinds") in path.parents:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if switch.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "ask the task's kind (legorl/tasks/kinds/) instead:\n" + "\n".join(found)


def test_each_task_chooses_its_kind() -> None:
    (harbor,) = load_tasks(HARBOR / "upper-case")
    assert isinstance(kind_of(harbor), HarborDir) and kind_of(harbor).spec.workdir == "/app"
    assert type(kind_of(load_tasks(ROOT / "legorl" / "assets" / "tasks" / "train.jsonl")[0])) is SweBenchRow
    assert kind_class("") is SweBenchRow and kind_class("harbor") is HarborDir
    assert source_kind(HARBOR) == "harbor" and source_kind("shipped") == "swebench"
    with pytest.raises(ValueError, match="unknown task kind 'nope'"):
        kind_class("nope")


def test_harbor_honours_or_refuses_every_sandbox_knob() -> None:
    """A knob added to [sandbox] must be decided for Harbor tasks: honoured, or refused."""
    knobs = set(SandboxSection.model_fields)
    assert set(HarborDir.refuses) | HARBOR_HONOURS == knobs
    assert not set(HarborDir.refuses) & HARBOR_HONOURS
    assert {"test_timeout_s", "max_diff_bytes"} <= set(HarborDir.refuses) and "penalize_tamper" in HARBOR_HONOURS
    assert SweBenchRow.refuses == {}  # SWE-bench rows honour them all


def _config(tmp_path: Path, tasks: Path, sandbox: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\ntasks = "{tasks}"\n[sandbox]\n{sandbox}\n')
    return path


@pytest.mark.parametrize("knob", sorted(HarborDir.refuses))
def test_a_knob_harbor_cannot_honour_is_refused_at_load(tmp_path: Path, knob: str) -> None:
    default = SandboxSection.model_fields[knob].default
    value = default * 2
    path = _config(tmp_path, HARBOR, f"{knob} = {value!r}")
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    line = str(err.value).splitlines()[-1]
    assert f"sandbox.{knob} = {value!r} is not honoured for Harbor tasks" in line, err.value
    with pytest.raises(ConfigError, match=f"sandbox.{knob}"):  # built in code, the same refusal
        validate(RunConfig, {"run": {"tasks": str(HARBOR)}, "sandbox": {knob: value}})
    # a relative source is judged once resolved against the config's directory
    (tmp_path / "sub").mkdir()
    rel = _config(tmp_path / "sub", Path(os.path.relpath(HARBOR, tmp_path / "sub")), f"{knob} = {value!r}")
    with pytest.raises(ConfigError, match=f"sandbox.{knob}"):
        load_run_config(rel)


def test_knobs_harbor_honours_and_swebench_rows_load(tmp_path: Path) -> None:
    ok = load_run_config(_config(tmp_path, HARBOR, "penalize_tamper = false\ngrade_empty_diff = true\npids = 64"))
    assert ok.sandbox.rollout_config().grade.penalize_tamper is False
    assert load_run_config(_config(tmp_path, HARBOR, "")).sandbox.changed() == {}
    rows = ROOT / "legorl" / "assets" / "tasks" / "train.jsonl"
    assert (
        load_run_config(_config(tmp_path, rows, "test_timeout_s = 30.0\nmax_diff_bytes = 1000")).sandbox.test_timeout_s
        == 30
    )


@pytest.mark.parametrize("penalize", [True, False])
def test_harbor_grading_honours_penalize_tamper(tmp_path: Path, penalize: bool) -> None:
    """The grade config reaches the Harbor grader: a reward file the agent's code forged is
    `hack_detected` under `penalize_tamper`, else `failed`; 0 and flagged either way."""
    (task,) = load_tasks(harbor_task_dir(tmp_path))
    script = harbor_agent(HARBOR_FORGERIES["reward_json"])
    cfg = RolloutConfig(grade=GradeConfig(penalize_tamper=penalize))

    async def run() -> dict:
        image = await TaskImages("local").for_task(task)
        async with open_backend("local") as backend:
            return (await run_rollout(task, CommandHarness(script), backend, image, cfg)).to_json()

    out = asyncio.run(run())
    assert out["reward"] == 0.0 and not out["masked"], out
    assert out["status"] == ("hack_detected" if penalize else "failed"), out
    assert {"planted_reward_file", "tamper_attempt"} <= set(out["flags"]), out

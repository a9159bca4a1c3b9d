"""`legorl rollout --config C`: every flag not given comes from the config (a config naming
`claude-code` runs Claude Code, not the `command` harness)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.harness_util import TASKS_FILE, harness_missing
from tests.helpers.paths import ROOT


@pytest.mark.harness
def test_rollout_takes_harness_and_turns_from_the_config(tmp_path: Path) -> None:
    if why := harness_missing("claude-code"):
        pytest.skip(why)
    instance = json.loads(TASKS_FILE.read_text().splitlines()[0])["instance_id"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "legorl.cli",
            "rollout",
            "--config",
            str(ROOT / "examples" / "swebench-claude-code.toml"),
            "--tasks",
            str(TASKS_FILE),
            "--instance",
            instance,
            "--engine",  # the example's SGLang server and Docker are a cluster's: the rest is the config's
            "oracle",
            "--model",
            "tiny-qwen3",
            "--sandbox",
            "local",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["harness"] == "claude-code", line  # before: the `command` harness, failing on command_file
    assert line["turns"] >= 1 and line["status"] not in ("infra_error", "sandbox_start_failed"), line


@pytest.mark.parametrize(
    ("flag", "value", "named"), [("--harness", "foo", "harness.name"), ("--sandbox", "podman", "sandbox.backend")]
)
def test_an_unknown_harness_or_backend_is_one_line(tmp_path: Path, flag: str, value: str, named: str) -> None:
    instance = json.loads(TASKS_FILE.read_text().splitlines()[0])["instance_id"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "legorl.cli",
            "rollout",
            "--tasks",
            str(TASKS_FILE),
            "--instance",
            instance,
            flag,
            value,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and named in proc.stderr and value in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr


def test_a_config_path_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.cli", "train", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

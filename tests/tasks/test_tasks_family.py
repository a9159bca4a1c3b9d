"""SWE-smith, SWE-Gym, R2E-Gym and SWE-rebench rows (issue 25): each fixture row is written
with its dataset's published fields; what we cannot honour is named, once per field."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from legorl.tasks.family import detect, reverse_diff
from legorl.tasks.loader import TaskFileError, load_tasks, shipped_tasks_dir
from tests.helpers.paths import FIXTURES
from tests.helpers.tasks_util import pick_task

FIX = FIXTURES / "family"


def _row(name: str) -> dict:
    return json.loads((FIX / f"{name}.jsonl").read_text())


def _write(tmp_path: Path, row: dict) -> Path:
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(row) + "\n")
    return f


def test_families_are_told_apart() -> None:
    assert [detect(_row(n)) for n in ("swe_gym", "swe_rebench", "swe_smith", "r2e_gym")] == [
        "swe-bench",
        "swe-rebench",
        "swe-smith",
        "r2e-gym",
    ]


def test_swe_gym_row_loads_as_swe_bench(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        (t,) = load_tasks(FIX / "swe_gym.jsonl")
    ref = pick_task()
    assert (t.instance_id, t.base_commit, t.patch, t.FAIL_TO_PASS) == (
        ref.instance_id,
        ref.base_commit,
        ref.patch,
        ref.FAIL_TO_PASS,
    )
    assert not caplog.records


def test_swe_rebench_row_names_what_it_cannot_honour(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        (t,) = load_tasks(FIX / "swe_rebench.jsonl")
    assert t.instance_id == pick_task().instance_id and t.requirements == []
    said = [r.getMessage() for r in caplog.records]
    for field in ("install_config", "environment", "environment_setup_commit", "requirements"):
        assert sum(f"field {field!r}" in m for m in said) == 1, said
    assert all(m.count("\n") == 0 for m in said)


def test_swe_smith_row_fix_is_the_reverse_of_its_patch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ref = pick_task()
    assert reverse_diff(reverse_diff(ref.patch)) == ref.patch
    with caplog.at_level(logging.WARNING), pytest.raises(TaskFileError, match="missing field 'base_commit'"):
        load_tasks(FIX / "swe_smith.jsonl")
    assert any("SWE-smith publishes no base_commit" in r.getMessage() for r in caplog.records)
    row = {**_row("swe_smith"), "base_commit": ref.base_commit, "repo_path": ref.repo_path}
    (t,) = load_tasks(_write(tmp_path, row))
    assert t.patch == ref.patch and t.image == "swesmith/pytoolz__toolz.08f2604b" and t.test_patch == ""


def test_r2e_gym_row_tests_from_its_execution_results(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ref = pick_task()
    with caplog.at_level(logging.WARNING), pytest.raises(TaskFileError, match="missing field 'patch'"):
        load_tasks(FIX / "r2e_gym.jsonl")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "parsed_commit_content" in said and "add 'base_commit'" in said and "expected_output_json" in said
    row = {**_row("r2e_gym"), "patch": ref.patch, "base_commit": ref.base_commit, "repo_path": ref.repo_path}
    row["test_cmd"] = ref.test_cmd
    (t,) = load_tasks(_write(tmp_path, row))
    assert t.repo == "toolz" and t.instance_id == f"toolz__{ref.base_commit[:12]}"
    assert t.FAIL_TO_PASS == sorted(ref.FAIL_TO_PASS) and t.PASS_TO_PASS == sorted(ref.PASS_TO_PASS)
    assert t.image.startswith("namanjain12/toolz_final:")
    assert shipped_tasks_dir().is_dir()

"""`legorl doctor`: every check fails for its real reason, with the hint that fixes it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from legorl.harness.checks import harness_check
from legorl.loop.config import RunConfig
from legorl.loop.preflight import preflight_checks
from legorl.monitor.doctor import evaluate_checks, run_one, store_check
from legorl.sandbox.checks import sandbox_starts_check
from legorl.tasks.loader import shipped_tasks_dir
from legorl.verify.checks import grading_check


def _cfg(**sections) -> RunConfig:
    data = {"harness": {"name": "command", "command_file": "/bin/true"}}
    data.update(sections)
    return RunConfig.model_validate(data)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stopped_engine_fails_with_start_hint_and_skips_dependents() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    cfg = _cfg(engine={"kind": "vllm", "model": "tiny-qwen3", "url": url, "request_timeout_s": 5})
    outcomes = evaluate_checks(preflight_checks(cfg)[:2])
    eng, tmpl = outcomes[0].result, outcomes[1].result
    assert not eng.ok and url in eng.detail and "start the vllm server" in eng.fix
    assert tmpl.skipped and "needs engine answers" in tmpl.detail


def test_harness_not_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LEGORL_HARNESS_ROOT", str(tmp_path / "nothing-here"))
    res = run_one(harness_check(_cfg(harness={"name": "claude-code"})))
    assert not res.ok and "not installed" in res.detail and "setup_harnesses.sh" in res.fix


def test_missing_command_file(tmp_path) -> None:
    res = run_one(harness_check(_cfg(harness={"name": "command", "command_file": str(tmp_path / "nope.sh")})))
    assert not res.ok and "does not exist" in res.detail and "command_file" in res.fix


def test_unwritable_store(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = run_one(store_check(blocker / "run"))
    assert not res.ok and "cannot write a run store" in res.detail


def test_unreachable_docker_daemon(monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    res = run_one(sandbox_starts_check(_cfg(sandbox={"backend": "docker"})))
    assert not res.ok and "did not start" in res.detail and "setup_sandbox.sh" in res.fix


def test_grading_self_test_catches_a_broken_task(tmp_path) -> None:
    row = json.loads((shipped_tasks_dir() / "train.jsonl").read_text().splitlines()[0])
    row["repo_path"] = str((shipped_tasks_dir() / row["repo_path"]).resolve())
    # a well-formed "gold" patch that fixes nothing
    row["patch"] = (
        "diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+note\n"
    )
    (tmp_path / "broken.jsonl").write_text(json.dumps(row) + "\n")
    cfg = _cfg(run={"tasks": str(tmp_path / "broken.jsonl"), "split": None})
    res = run_one(grading_check(cfg))
    assert not res.ok and "gold patch gives" in res.detail and "tasks validate" in res.fix
    res = run_one(grading_check(_cfg(run={"tasks": str(tmp_path / "missing.jsonl")})))
    assert not res.ok and "missing.jsonl" in res.detail and "run.tasks" in res.fix


@pytest.mark.slow
def test_doctor_cli_exit_codes(tmp_path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(f'[run]\ndir = "{tmp_path / "run"}"\n[harness]\nname = "command"\ncommand_file = "/bin/true"\n')
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "legorl.cli",
            "doctor",
            "--config",
            str(good),
            "--skip",
            "grading self-test",
            "--skip",
            "free disk and memory",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert "all 11 checks passed" in ok.stdout  # 7 + tool calls, routing replay, lr, window
    bad = tmp_path / "bad.toml"
    bad.write_text(
        good.read_text() + f'[engine]\nkind = "vllm"\nurl = "http://127.0.0.1:{_closed_port()}"\n'
        "request_timeout_s = 5\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "legorl.cli", "doctor", "--config", str(bad), "--skip", "grading self-test"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 1 and "engine answers" in res.stdout and "start the vllm" in res.stdout

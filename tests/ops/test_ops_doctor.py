"""`legorl doctor --json` and the checks that catch a silently broken run (legorl/ops/).

Each new check is run on a config that is right and on the misconfiguration it exists to
catch, with the bundled tiny models (dense and MoE), a real proxy on loopback, and for the
window the real Claude Code harness in a sandbox.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from legorl.loop.config import RunConfig
from legorl.monitor.doctor import Check, CheckFailed, checks_json, run_one, stdout_to_stderr, warn
from legorl.ops.plan_checks import lr_check, window_check
from legorl.ops.replay_check import routing_replay_check
from legorl.ops.toolcall_check import toolcall_check
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

LEGORL = [sys.executable, "-m", "legorl.cli"]
EXAMPLES = ROOT / "examples"
HEAVY = [
    "sandbox starts",
    "sandbox isolation",
    "sandbox reaches its proxy session",
    "grading self-test",
    "first prompt fits the window",
]


def config(**sections: dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate(sections)


MOE = {"engine": {"kind": "hf", "model": "tiny-qwen3-moe"}, "trainer": {"model": "tiny-qwen3-moe"}}


# ------------------------------------------------------------------ doctor --json
def test_json_has_every_check_a_status_and_the_verdict(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(
        f'[run]\ndir = "{tmp_path / "run"}"\n[engine]\nkind = "hf"\nmodel = "tiny-qwen3"\n'
        '[trainer]\nmodel = "tiny-qwen3"\nlr = 0.0\n[proxy]\ntool_format = "glm45"\n'
    )
    skips = [a for name in HEAVY for a in ("--skip", name)]
    p = subprocess.run(
        [*LEGORL, "doctor", "--config", str(toml), "--json", *skips], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 1, p.stderr[-2000:]
    report = json.loads(p.stdout)  # stdout is the JSON and nothing else
    assert report["safe_to_run"] is False and report["verdict"] == "NO"
    by = {c["name"]: c for c in report["checks"]}
    assert by["engine answers"]["status"] == "ok"
    assert by["learning rate non-zero"]["status"] == "fatal" and "lr = 0" in by["learning rate non-zero"]["detail"]
    assert by["tool calls round-trip"]["status"] == "fatal" and "tool_format" in by["tool calls round-trip"]["fix"]
    assert by["routing replay wired"]["status"] == "ok" and "dense" in by["routing replay wired"]["detail"]
    assert not set(HEAVY) & set(by)
    assert all(set(c) == {"name", "status", "detail", "fix", "seconds"} for c in report["checks"])
    assert report["counts"] == {s: sum(c["status"] == s for c in report["checks"]) for s in ("ok", "warn", "fatal")}


def test_json_is_a_fatal_verdict_when_the_config_does_not_load(tmp_path: Path) -> None:
    toml = tmp_path / "broken.toml"
    toml.write_text("[trainer]\nlr = 'fast'\n")
    p = subprocess.run(
        [*LEGORL, "doctor", "--config", str(toml), "--json"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1
    report = json.loads(p.stdout)
    assert report["safe_to_run"] is False
    (only,) = report["checks"]
    assert only["status"] == "fatal" and "lr" in only["detail"]


def test_a_crashing_check_is_fatal_with_its_error_and_prints_stay_off_stdout(capfd: pytest.CaptureFixture) -> None:
    def crash() -> None:
        print("noise from a check")
        raise RuntimeError("boom")

    checks = [
        Check("crashes", crash),
        Check("warns", lambda: warn("passed, but read this", "do that")),
        Check("needs the crash", lambda: "never runs", needs=("crashes",)),
        Check("fails", lambda: (_ for _ in ()).throw(CheckFailed("bad", fix="fix it"))),
    ]
    with stdout_to_stderr():
        report = checks_json(lambda: checks)
    out, err = capfd.readouterr()
    assert "noise from a check" in err and "noise" not in out
    by = {c["name"]: c for c in report["checks"]}
    assert by["crashes"]["status"] == "fatal" and by["crashes"]["detail"] == "RuntimeError: boom"
    assert by["warns"]["status"] == "warn" and by["warns"]["fix"] == "do that"
    assert by["needs the crash"]["status"] == "warn" and "skipped" in by["needs the crash"]["detail"]
    assert by["fails"] == {**by["fails"], "status": "fatal", "detail": "bad", "fix": "fix it"}
    assert report["safe_to_run"] is False
    assert checks_json(lambda: [Check("w", lambda: warn("hm"))])["safe_to_run"] is True
    json.dumps(report)


# ------------------------------------------------------------------ routing replay wired
class OffByOne:
    """An engine whose recorded expert ids are shifted by one: a miswired routing adapter."""

    def __init__(self, inner: Any, experts: int = 8) -> None:
        self.inner, self.experts = inner, experts

    async def generate(self, ids: list[int], params: Any) -> Any:
        g = await self.inner.generate(ids, params)
        return dataclasses.replace(g, routed_experts=(np.asarray(g.routed_experts) + 1) % self.experts)

    async def close(self) -> None:
        await self.inner.close()


def test_routing_replay_passes_when_wired_and_on_a_dense_model() -> None:
    r = run_one(routing_replay_check(config(**MOE)))
    assert r.ok and "Pearson 1.0000" in r.detail and "100% of (token, layer) pairs as recorded" in r.detail
    dense = run_one(routing_replay_check(config()))
    assert dense.ok and "dense" in dense.detail


def test_routing_replay_off_for_moe_is_fatal() -> None:
    cfg = config(engine=MOE["engine"], trainer={**MOE["trainer"], "routing_replay": False})
    r = run_one(routing_replay_check(cfg))
    assert not r.ok and "routing_replay = false" in r.detail and "routing_replay = true" in r.fix


def test_an_engine_that_records_no_routing_is_fatal() -> None:
    cfg = config(engine={**MOE["engine"], "record_routing": False}, trainer=MOE["trainer"])
    r = run_one(routing_replay_check(cfg))
    assert not r.ok and "recorded no routing" in r.detail and "replay" in r.fix


def test_a_miswired_recording_is_fatal_naming_replay() -> None:
    from legorl.engine.registry import make_engine

    cfg = config(**MOE)
    r = run_one(routing_replay_check(cfg, lambda tok: OffByOne(make_engine(cfg.engine, tok))))
    assert not r.ok and r.detail.startswith("routing replay:") and "not this model's routing" in r.detail
    assert "routing replay is miswired" in r.fix


# ------------------------------------------------------------------ tool calls round-trip
@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini-cli", "mini-swe-agent"])
def test_a_template_tool_call_reaches_each_dialect(harness: str) -> None:
    r = run_one(toolcall_check(config(harness={"name": harness})))
    assert r.ok, r.detail
    assert f"{harness}: 1 of 1" in r.detail


def test_a_scripts_calls_are_its_own_and_max_tokens_must_hold_a_call() -> None:
    r = run_one(toolcall_check(config(harness={"name": "command", "command_file": "/etc/hostname"})))
    assert r.ok and "command: the script's calls are its own" in r.detail
    short = run_one(toolcall_check(config(proxy={"max_tokens": 12}, harness={"name": "codex"})))
    assert not short.ok and "max_tokens = 12 cannot hold one tool call" in short.detail
    assert short.fix == "raise [proxy] max_tokens"


@pytest.mark.parametrize("fmt", ["glm45", "qwen3_coder"])
def test_a_parser_that_never_matches_the_model_is_fatal(fmt: str) -> None:
    r = run_one(toolcall_check(config(proxy={"tool_format": fmt}, harness={"name": "claude-code"})))
    assert not r.ok and "0 of 1 tool calls came back to claude-code (anthropic)" in r.detail
    assert f"the proxy parses {fmt!r}" in r.detail and "tool_format" in r.fix


# ------------------------------------------------------------------ learning rate
def test_learning_rate_checks_every_planned_step() -> None:
    ok = run_one(lr_check(config(run={"steps": 10}, trainer={"lr": 1e-5, "schedule": "cosine", "total_steps": 10})))
    assert ok.ok and "over 10 optimizer steps" in ok.detail
    zero = run_one(lr_check(config(run={"steps": 10}, trainer={"lr": 0.0})))
    assert not zero.ok and "0 on 10 of 10" in zero.detail and "lr = 0" in zero.detail
    short = run_one(
        lr_check(
            config(run={"steps": 5}, trainer={"lr": 1e-5, "schedule": "cosine", "total_steps": 4, "minibatches": 2})
        )
    )
    assert not short.ok and "from step 4" in short.detail and "total_steps = 4" in short.detail
    assert "(10)" in short.fix  # 5 steps x 2 minibatches


# ------------------------------------------------------------------ first prompt fits the window
def test_the_window_check_passes_a_command_only_run() -> None:
    r = run_one(window_check(config(harness={"name": "command", "command_file": "/etc/hostname"})))
    assert r.ok and "command harness only" in r.detail


@pytest.mark.harness
def test_a_window_too_small_for_the_harness_prompt_is_fatal(tmp_path: Path) -> None:
    from tests.helpers.harness_util import harness_missing

    if why := harness_missing("claude-code"):
        pytest.skip(why)
    from legorl.loop.config import load_run_config

    d = load_run_config(EXAMPLES / "quickstart-claude-code.toml").model_dump()
    d["run"].update(dir=tmp_path / "run", time_budget_s=None)
    d["proxy"]["max_context"] = 4096
    r = run_one(window_check(RunConfig.model_validate(d)))
    assert not r.ok and "'claude-code'" in r.detail and "4096-token window" in r.detail
    assert "max_context" in r.fix


@pytest.mark.harness
def test_the_window_check_warns_when_harness_starts_would_outlast_the_timeout(tmp_path: Path) -> None:
    """The probe's measured start cost (Claude Code's Node runtime, ~1 CPU-s) against the run's
    concurrency: the committed 32 at once pass; 100,000 at once would spend the timeout
    starting, on any machine under ~1,600 cores."""
    from tests.helpers.harness_util import harness_missing

    if why := harness_missing("claude-code"):
        pytest.skip(why)
    from legorl.loop.config import load_run_config

    d = load_run_config(EXAMPLES / "quickstart-claude-code.toml").model_dump()
    d["run"].update(dir=tmp_path / "run", time_budget_s=None)
    ok = run_one(window_check(RunConfig.model_validate(d)))
    assert ok.status == "ok", ok.detail
    d["run"].update(max_concurrent_rollouts=100_000, tasks_per_step=1000, group_size=100)
    r = run_one(window_check(RunConfig.model_validate(d)))
    assert r.status == "warn" and "'claude-code' costs" in r.detail and "agent_timeout_s = 180" in r.detail
    cpu_s = float(r.detail.split("costs ")[1].split(" CPU-s")[0])
    assert 0.1 < cpu_s < 30, r.detail  # a Node start and one reply, not the probe's wall time or nothing
    assert r.fix.startswith("run.max_concurrent_rollouts ≤ ")

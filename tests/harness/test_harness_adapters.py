"""Adapters without running a harness: what they launch, how they read an ending, layers."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import get_args

import pytest
import typer

from legorl.harness import install, openhands
from legorl.harness.base import (
    COMMON_ENV,
    PROBLEM_FILE,
    InstalledHarness,
    Launch,
    NativeAdapter,
    http_status_is_infra,
    jsonl,
)
from legorl.harness.claude_code import ClaudeCode
from legorl.harness.command import CommandHarness
from legorl.harness.mini_swe_agent import MiniSweAgent
from legorl.harness.nettrace import NetTraced
from legorl.harness.opencode import OpenCode
from legorl.harness.openhands import OpenHands
from legorl.harness.registry import HARNESSES, NATIVE, harness_class, make_harness
from legorl.loop.config import HarnessSection
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task
from tests.helpers.paths import ROOT

TASK = Task("t__1", "o/r", "a" * 40, "Fix it.", "", "", ["t.py::test_a"], [])
OK = ExecResult(0, "", "")
BASE = "http://127.0.0.1:8000"


@pytest.fixture
def layers(tmp_path, monkeypatch):
    """Pretend every layer is built (a manifest in a temp root) so launch() can resolve paths."""
    monkeypatch.setenv("LEGORL_HARNESS_ROOT", str(tmp_path))
    for name in install.RECIPES:
        p = install.layer_path(name)
        p.mkdir(parents=True)
        (p / "manifest.json").write_text("{}")
    return tmp_path


def _cc_result(**kw) -> str:
    base = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 4,
        "terminal_reason": "completed",
        "session_id": "s",
        "result": "done",
    }
    return "\n".join([json.dumps({"type": "system", "subtype": "init"}), json.dumps({**base, **kw})])


def test_claude_code_launch(layers) -> None:
    a = ClaudeCode(model="my-policy", max_turns=7, max_output_tokens=512, auto_compact_window=90000)
    launch = a.launch(TASK, BASE, "/repo")
    assert launch.binary.endswith("/bin/claude") and launch.binary.startswith(str(layers))
    for flag in (
        "-p",
        "--output-format stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
        "--max-turns 7",
        "--model my-policy",
        f"< {PROBLEM_FILE}",
    ):
        assert flag in launch.command
    env = launch.env
    assert env["ANTHROPIC_BASE_URL"] == BASE and env["IS_SANDBOX"] == "1"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "my-policy"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "512" and env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "90000"
    assert COMMON_ENV["HOME"].startswith("/tmp/.legorl-agent")
    assert a.readonly_mounts == {str(install.layer_path("claude-code")): str(install.layer_path("claude-code"))}


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({}, None),
        ({"subtype": "error_max_turns", "is_error": True, "terminal_reason": "max_turns"}, Status.MAX_TURNS),
        ({"is_error": True, "terminal_reason": "prompt_too_long"}, None),
        (
            {
                "is_error": True,
                "terminal_reason": "api_error",
                "api_error_status": 502,
                "result": "API Error: 502 engine error",
            },
            Status.ENGINE_ERROR,
        ),
        (
            {
                "is_error": True,
                "terminal_reason": "api_error",
                "api_error_status": None,
                "result": "API Error: Connection error.",
            },
            Status.ENGINE_ERROR,
        ),
        (
            {
                "is_error": True,
                "terminal_reason": "api_error",
                "api_error_status": 400,
                "result": "API Error: 400 messages.0.content: unsupported block",
            },
            Status.INFRA_ERROR,
        ),
        (
            {
                "is_error": True,
                "terminal_reason": "api_error",
                "result": "API Error: Claude's response exceeded the 4096 output token maximum.",
            },
            Status.FORMAT_ERROR,
        ),
        ({"subtype": "error_during_execution", "is_error": True, "terminal_reason": "x"}, Status.INFRA_ERROR),
    ],
)
def test_claude_code_endings(layers, result, status) -> None:
    a = ClaudeCode()
    v = a.interpret(OK, {"events": _cc_result(**result), "stderr": ""}, a.launch(TASK, BASE, "/repo"))
    assert v.status is status, v.details


def test_claude_code_without_result_is_infra(layers) -> None:
    a = ClaudeCode()
    v = a.interpret(ExecResult(1, "", ""), {"events": "", "stderr": "boom"}, a.launch(TASK, BASE, "/repo"))
    assert v.status is Status.INFRA_ERROR and "boom" in v.details["error"]


def test_opencode_launch_and_config(layers) -> None:
    a = OpenCode(model="pol", max_turns=5, context_window=20000, max_output_tokens=256)
    launch = a.launch(TASK, BASE, "/repo")
    cfg = json.loads(next(iter(launch.files.values())))
    prov = cfg["provider"]["legorl"]
    assert prov["options"]["baseURL"] == BASE + "/v1" and prov["npm"] == "@ai-sdk/openai-compatible"
    assert prov["models"]["pol"]["limit"] == {"context": 20000, "output": 256}
    assert cfg["agent"]["build"]["steps"] == 5 and cfg["permission"] == {"*": "allow"} and cfg["autoupdate"] is False
    assert "--title" in launch.command and "--auto" in launch.command and "--dir /repo" in launch.command
    assert launch.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1" and launch.env["OPENCODE_CONFIG"] in launch.files


def _oc(*events: dict) -> str:
    return "\n".join(json.dumps(e) for e in events)


@pytest.mark.parametrize(
    ("events", "code", "status"),
    [
        ([{"type": "step_start"}, {"type": "step_finish", "part": {"reason": "stop"}}], 0, None),
        ([{"type": "step_start"}] * 5, 0, Status.MAX_TURNS),
        (
            [
                {"type": "step_start"},
                {"type": "error", "error": {"name": "APIError", "data": {"statusCode": 502, "message": "x"}}},
            ],
            1,
            Status.ENGINE_ERROR,
        ),
        (
            [
                {"type": "step_start"},
                {"type": "error", "error": {"name": "APIError", "data": {"statusCode": 400, "message": "x"}}},
            ],
            1,
            Status.INFRA_ERROR,
        ),
        ([{"type": "step_start"}, {"type": "error", "error": {"name": "ContextOverflowError", "data": {}}}], 1, None),
        ([], 1, Status.INFRA_ERROR),
    ],
)
def test_opencode_endings(layers, events, code, status) -> None:
    a = OpenCode(max_turns=5)
    v = a.interpret(ExecResult(code, "", ""), {"events": _oc(*events), "stderr": ""}, a.launch(TASK, BASE, "/repo"))
    assert v.status is status, v.details


def test_openhands_launch(layers) -> None:
    a = OpenHands(max_turns=9, condenser_max_size=6, condenser_keep_first=1)
    launch = a.launch(TASK, BASE, "/repo")
    assert launch.binary.endswith("/venv/bin/python")
    for part in (
        "--base-url http://127.0.0.1:8000/v1",
        "--max-iterations 9",
        "--condenser-max-size 6",
        "--workspace /repo",
        f"--prompt-file {PROBLEM_FILE}",
    ):
        assert part in launch.command
    driver = next(v for k, v in launch.files.items() if k.endswith("openhands_driver.py"))
    assert b"LLMSummarizingCondenser" in driver and b"import legorl" not in driver
    assert len(a.readonly_mounts) == 2  # the interpreter layer and the venv layer


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"status": "finished"}, None),
        ({"status": "stuck"}, None),
        ({"status": "error", "error_code": "MaxIterationsReached", "error": "x"}, Status.MAX_TURNS),
        ({"status": "error", "error_code": "LLMServiceUnavailableError", "error": "502"}, Status.ENGINE_ERROR),
        ({"status": "error", "error_code": "APIConnectionError", "error": "refused"}, Status.ENGINE_ERROR),
        ({"status": "error", "error_code": "LLMContextWindowExceedError", "error": "too long"}, None),
        ({"status": "crashed", "error": "ImportError: x"}, Status.INFRA_ERROR),
    ],
)
def test_openhands_endings(layers, result, status) -> None:
    a = OpenHands()
    v = a.interpret(OK, {"result": json.dumps(result), "stderr": ""}, a.launch(TASK, BASE, "/repo"))
    assert v.status is status, v.details
    assert a.interpret(OK, {"result": "", "stderr": "x"}, a.launch(TASK, BASE, "/repo")).status is Status.INFRA_ERROR


def test_openhands_warm_options_are_the_drivers() -> None:
    """The warm adapter's per-rollout options are the in-sandbox driver's own (its parser)."""
    spec = importlib.util.spec_from_file_location("openhands_driver", openhands.DRIVER_SOURCE)  # never imported
    assert spec is not None and spec.loader is not None
    openhands_driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(openhands_driver)

    a = make_harness("openhands-warm", max_turns=7, condenser_max_size=6, command_timeout_s=5)
    assert (a.name, a.layers, a.command_timeout_s) == ("openhands-warm", (), 5)
    args = openhands_driver.parser().parse_args(a._argv("http://127.0.0.1:9/s/abc/v1"))
    assert (args.base_url, args.max_iterations, args.condenser_max_size) == ("http://127.0.0.1:9/s/abc/v1", 7, 6)
    assert install.HARNESS_LAYERS["openhands-warm"] == install.HARNESS_LAYERS["openhands"]


def test_mini_launch(layers) -> None:
    launch = MiniSweAgent(max_turns=3, max_output_tokens=99).launch(TASK, BASE, "/repo")
    for part in (
        "-c mini.yaml",
        "model.model_kwargs.api_base=http://127.0.0.1:8000/v1",
        "agent.step_limit=3",
        "environment.cwd=/repo",
        "model.model_kwargs.max_tokens=99",
        "-m openai/legorl-policy",
        f'-t "$(cat {PROBLEM_FILE})"',
        "--exit-immediately",
        "-y",
    ):
        assert part in launch.command
    assert launch.command.index("-c mini.yaml") < launch.command.index("agent.step_limit")  # -c replaces defaults
    assert launch.env["MSWEA_COST_TRACKING"] == "ignore_errors" and launch.env["MSWEA_CONFIGURED"] == "true"


@pytest.mark.parametrize(
    ("exit_status", "status"),
    [
        ("Submitted", None),
        ("LimitsExceeded", Status.MAX_TURNS),
        ("TimeExceeded", Status.AGENT_TIMEOUT),
        ("RepeatedFormatError", Status.FORMAT_ERROR),
        ("ContextWindowExceededError", None),
        ("InternalServerError", Status.ENGINE_ERROR),
        ("APIConnectionError", Status.ENGINE_ERROR),
        ("KeyError", Status.INFRA_ERROR),
    ],
)
def test_mini_endings(layers, exit_status, status) -> None:
    a = MiniSweAgent()
    traj = {
        "info": {"exit_status": exit_status, "model_stats": {"api_calls": 2}},
        "messages": [{"role": "exit", "content": "x", "extra": {"exception_str": "boom"}}],
    }
    v = a.interpret(OK, {"traj": json.dumps(traj), "stdout": ""}, a.launch(TASK, BASE, "/repo"))
    assert v.status is status, v.details


def test_registry() -> None:
    h = make_harness("opencode", model="m", max_turns=3, context_window=9000)
    assert (h.name, h.max_turns, h.context_window) == ("opencode", 3, 9000)
    with pytest.raises(ValueError, match="unknown option"):
        make_harness("claude-code", condenser_max_size=3)
    with pytest.raises(ValueError, match="unknown harness 'nonesuch'"):
        make_harness("nonesuch")
    with pytest.raises(ValueError, match="command_file"):
        make_harness("command")


def _cli_harness_help() -> str:
    from legorl.cli import app

    rollout = typer.main.get_command(app).commands["rollout"]  # type: ignore[attr-defined]
    return next(p.help for p in rollout.params if p.name == "harness")


def test_harness_names_are_said_once_in_the_registry() -> None:
    """`[harness] name` accepts exactly `command` and `HARNESSES`, and `--harness` lists them."""
    assert get_args(HarnessSection.model_fields["name"].annotation) == ("command", *HARNESSES)
    listed = _cli_harness_help().replace(";", ",").replace(":", ",").split(",")
    assert {n.strip() for n in listed} >= {"command", *HARNESSES}
    # derived, not restated: a name registered before the config and the CLI are read is in both
    probe = (
        "from typing import get_args\n"
        "from legorl.harness import registry\n"
        "registry.HARNESSES['zz-probe'] = 'legorl.harness.pi:Pi'\n"
        "registry.HARNESSES['zz-probe-warm'] = 'legorl.harness.pi:Pi'\n"
        "from legorl.loop.config import HarnessSection\n"
        "from tests.harness.test_harness_adapters import _cli_harness_help\n"
        "assert HarnessSection(name='zz-probe').name == 'zz-probe'\n"
        "assert 'zz-probe-warm' in get_args(HarnessSection.model_fields['name'].annotation)\n"
        "assert 'pi, qwen-code, zz-probe;' in _cli_harness_help(), _cli_harness_help()\n"
        "assert _cli_harness_help().endswith('openhands-warm, zz-probe-warm'), _cli_harness_help()\n"
    )
    root = ROOT
    proc = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_native_adapter_has_the_one_base(layers) -> None:
    for name in NATIVE:
        cls = harness_class(name)
        assert issubclass(cls, NativeAdapter), name
        adapter = cls()
        assert isinstance(adapter, InstalledHarness) and inspect.iscoroutinefunction(adapter.run), name
        assert set(adapter.readonly_mounts) == {str(install.layer_path(layer)) for layer in adapter.layers}, name
    traced = NetTraced(ClaudeCode())
    assert isinstance(traced, NativeAdapter) and traced.layers == ("claude-code", "strace")


def test_an_adapter_missing_interpret_fails_at_construction() -> None:
    """`launch` and `interpret` are abstract: forgetting one is a TypeError naming it when the
    adapter is built, not a NotImplementedError in the middle of a rollout."""

    class LaunchOnly(NativeAdapter):
        name, layers = "launch-only", ()

        def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
            return Launch("true")

    with pytest.raises(TypeError, match="interpret"):
        LaunchOnly()


def test_a_harness_section_builds_its_adapter_through_make_harness(tmp_path: Path) -> None:
    sec = HarnessSection(name="opencode", max_turns=3, options={"context_window": 9000})
    h = make_harness(sec.name, **sec.harness_options("served-name"))
    assert (type(h), h.model, h.max_turns, h.context_window) == (OpenCode, "served-name", 3, 9000)
    sec = HarnessSection(name="claude-code", model_name="mine")
    assert make_harness(sec.name, **sec.harness_options("served-name")).model == "mine"
    script = tmp_path / "agent.sh"
    script.write_text("echo hi\n")
    sec = HarnessSection(name="command", command_file=script)
    assert make_harness(sec.name, **sec.harness_options("served-name")) == CommandHarness("echo hi\n")


def test_helpers() -> None:
    assert jsonl('garbage\n{"a": 1}\n{"b":\n[1]\n{"c": 2}') == [{"a": 1}, {"c": 2}]
    assert http_status_is_infra(None) and http_status_is_infra(503) and not http_status_is_infra(400)


def test_layer_keys_and_missing_layers(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LEGORL_HARNESS_ROOT", str(tmp_path))
    k1 = install.layer_key("openhands")
    assert k1 == install.layer_key("openhands") and k1 != install.layer_key("mini-swe-agent")
    monkeypatch.setitem(install.RECIPES, "python312", install.Recipe("python312", "true # changed"))
    assert install.layer_key("openhands") != k1  # a dependency's recipe is part of the key
    with pytest.raises(install.HarnessNotInstalled, match="setup_harnesses.sh"):
        install.require("opencode")
    with pytest.raises(install.HarnessNotInstalled):
        _ = ClaudeCode().readonly_mounts


def test_build_is_idempotent_and_atomic(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LEGORL_HARNESS_ROOT", str(tmp_path))
    count = tmp_path / "count"
    monkeypatch.setitem(
        install.RECIPES, "demo", install.Recipe("demo", f'echo run >> {count}; sleep 0.3; echo hi > "$LAYER/x"')
    )
    monkeypatch.setitem(install.RECIPES, "broken", install.Recipe("broken", 'echo partial > "$LAYER/x"; exit 3'))
    paths: list = []
    threads = [
        threading.Thread(target=lambda: paths.append(install.build("demo", log=open("/dev/null", "w"))))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and (paths[0] / "x").read_text() == "hi\n"
    assert count.read_text() == "run\n"  # built once, although three callers raced
    assert json.loads((paths[0] / "manifest.json").read_text())["name"] == "demo"
    with pytest.raises(RuntimeError, match="exit 3"):
        install.build("broken", log=open("/dev/null", "w"))
    assert not install.layer_path("broken").exists() and not install.is_built("broken")
    assert install.main(["--list"]) == 0

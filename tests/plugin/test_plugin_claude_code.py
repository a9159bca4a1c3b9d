"""The `rl` plugin inside the real Claude Code (issue 38, item 4): installed from this checkout
into a fresh home, driven through our proxy on loopback by a scripted engine that follows the
skill it finds in the prompt (tests/helpers/skill_engine.py), against a real `legorl train` run's
store, healthy and made sick on purpose.

Checked: Claude Code loaded the plugin (its init event lists `rl@legorl` and the skills; the
skill's instructions reached the model), the skill's command ran `legorl` against the real run
directory (the tool result holds that run's id), and the report's verdict is the run's state.
Outside a checkout, with no `legorl` to run, the report says so and its verdict is UNKNOWN.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from legorl.ops.status import status
from tests.helpers.harness_util import harness_missing
from tests.helpers.loop_util import train, write_run
from tests.helpers.paths import ROOT
from tests.helpers.sick_runs import SICK, sick_store
from tests.helpers.skill_engine import SkillFollower

pytestmark = [pytest.mark.harness, pytest.mark.slow]
VENV_BIN = ROOT / ".venv" / "bin"


@pytest.fixture(scope="module")
def claude() -> Path:
    if why := harness_missing("claude-code"):
        pytest.skip(why)
    from legorl.harness.install import layer_path

    return layer_path("claude-code") / "bin" / "claude"


@pytest.fixture(scope="module")
def home(claude: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh Claude Code config dir with the plugin installed from this checkout, as the README
    says (CLAUDE_CONFIG_DIR: HOME stays, so `legorl` finds its image and model caches)."""
    home = tmp_path_factory.mktemp("home")
    for args in (["marketplace", "add", str(ROOT)], ["install", "rl@legorl"]):
        p = subprocess.run(
            [str(claude), "plugin", *args],
            env={**os.environ, "CLAUDE_CONFIG_DIR": str(home / ".claude")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-2000:]
    return home


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    proc = train(write_run(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def bare_path() -> str:
    """PATH without any virtual environment's bin (where a `legorl` could come from)."""
    return ":".join(p for p in os.environ["PATH"].split(":") if ".venv" not in p and "site-packages" not in p)


def drive(claude: Path, home: Path, prompt: str, cwd: Path = ROOT) -> tuple[list[dict[str, Any]], SkillFollower]:
    """`claude -p PROMPT` in `cwd` (the checkout), its model our proxy with the skill-following
    engine; outside the checkout `legorl` is not on PATH either."""
    from legorl.models import load_tokenizer
    from legorl.proxy.config import ProxyConfig
    from legorl.proxy.renderer_choice import make_renderer
    from legorl.proxy.server import ProxyServer

    tok = load_tokenizer("harness-qwen3")
    engine = SkillFollower(tok)

    async def go() -> bytes:
        proxy = ProxyServer(ProxyConfig(port=0, max_context=2**20, max_tokens=4096), engine, make_renderer(tok))
        async with proxy:
            proxy.open_session("operator")
            env = {
                **os.environ,
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),  # HOME stays: legorl finds its caches there
                "PATH": f"{VENV_BIN}:{bare_path()}" if cwd == ROOT else bare_path(),
                "ANTHROPIC_BASE_URL": proxy.session_url("operator"),
                "ANTHROPIC_API_KEY": "unused",
                "ANTHROPIC_MODEL": "legorl-policy",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_PROMPT_CACHING": "1",
                "ENABLE_TOOL_SEARCH": "false",
                "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
                "IS_SANDBOX": "1",
            }
            argv = [
                str(claude),
                "-p",
                prompt,
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions",
                "--max-turns",
                "4",
                "--model",
                "legorl-policy",
            ]
            p = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(p.communicate(), 300)
            proxy.close_session("operator")
            assert p.returncode == 0, err.decode()[-2000:]
            return out

    events = [json.loads(line) for line in asyncio.run(go()).splitlines() if line.strip()]
    return events, engine


def check_run(events: list[dict[str, Any]], engine: SkillFollower, skill: str, run: Path) -> str:
    """The plugin was loaded, the skill's command ran legorl on `run`; the final report."""
    init = next(e for e in events if e.get("type") == "system" and e.get("subtype") == "init")
    assert any(p["source"] == "rl@legorl" for p in init["plugins"]) and f"rl:{skill}" in init["skills"]
    assert any(f"<command-name>/rl:{skill}</command-name>" in p for p in engine.prompts)  # the skill reached the model
    calls = [
        b for e in events if e.get("type") == "assistant" for b in e["message"]["content"] if b["type"] == "tool_use"
    ]
    assert [c["name"] for c in calls] == ["Bash"] and calls[0]["input"]["command"].startswith("legorl status ")
    assert str(run) in calls[0]["input"]["command"]
    results = [
        b
        for e in events
        if e.get("type") == "user"
        for b in e["message"]["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    text = json.dumps(results)
    assert status(run)["run_id"] in text  # legorl read that very run's store
    final = next(e for e in reversed(events) if e.get("type") == "result")
    assert final["subtype"] == "success", final
    return final["result"]


def test_status_of_a_healthy_run(claude: Path, home: Path, healthy: Path) -> None:
    events, engine = drive(claude, home, f"/rl:status {healthy}")
    result = check_run(events, engine, "status", healthy)
    assert result.strip().endswith("VERDICT: NO KNOWN FAILURE"), result
    assert "no known signature matched" in result


def test_status_of_a_run_made_sick(claude: Path, home: Path, healthy: Path, tmp_path: Path) -> None:
    sick = sick_store(healthy, tmp_path / "sick", SICK["lr_zero"])
    events, engine = drive(claude, home, f"/rl:status {sick}")
    result = check_run(events, engine, "status", sick)
    assert result.strip().endswith("VERDICT: SICK learning rate 0"), result
    assert "train/lr" in result  # the evidence, as read


def test_outside_a_checkout_the_report_says_so_and_verdicts_unknown(
    claude: Path, home: Path, healthy: Path, tmp_path: Path
) -> None:
    events, engine = drive(claude, home, f"/rl:status {healthy}", cwd=tmp_path)
    calls = [
        b for e in events if e.get("type") == "assistant" for b in e["message"]["content"] if b["type"] == "tool_use"
    ]
    assert [c["input"]["command"].split()[0] for c in calls] == ["legorl", ".venv/bin/legorl"]  # the skill's fallback
    final = next(e for e in reversed(events) if e.get("type") == "result")
    assert "No such file or directory" in final["result"] and final["result"].strip().endswith("VERDICT: UNKNOWN")


@pytest.mark.parametrize("lr", [1e-4, 0.0])
def test_check_answers_yes_for_a_sound_config_and_no_for_lr_zero(
    claude: Path, home: Path, tmp_path: Path, lr: float
) -> None:
    config = write_run(tmp_path)
    config.write_text(config.read_text().replace("lr = 1e-4", f"lr = {lr}"))
    events, engine = drive(claude, home, f"/rl:check {config}")
    assert any("<command-name>/rl:check</command-name>" in p for p in engine.prompts)
    calls = [
        b for e in events if e.get("type") == "assistant" for b in e["message"]["content"] if b["type"] == "tool_use"
    ]
    assert [c["input"]["command"] for c in calls] == [f"legorl doctor --config {config} --json"]
    final = next(e for e in reversed(events) if e.get("type") == "result")["result"].strip()
    if lr:
        assert final.endswith("VERDICT: YES") and "FATAL" not in final, final
    else:
        assert final.endswith("VERDICT: NO") and "FATAL learning rate non-zero" in final, final

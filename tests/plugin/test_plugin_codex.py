"""The `rl` plugin inside the real Codex CLI (issue 38, item 4): installed from this checkout
with `codex plugin marketplace add` / `codex plugin add` into a fresh CODEX_HOME, Codex's model
our proxy on loopback (its Responses dialect) with the skill-following engine
(tests/helpers/skill_engine.py), `$rl:status RUN_DIR` against a real `legorl train` run's store,
healthy and made sick on purpose.

Checked: Codex loaded the plugin (its skill list names `rl:status` from the installed plugin
and the invoked skill's SKILL.md reached the model), the skill's command ran `legorl` against
the real run directory (its output holds that run's id), and the verdict is the run's state.
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
def codex() -> Path:
    if why := harness_missing("codex"):
        pytest.skip(why)
    from legorl.harness.install import layer_path

    return layer_path("codex") / "bin" / "codex"


@pytest.fixture(scope="module")
def home(codex: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh home with the plugin installed from this checkout, as the README says."""
    home = tmp_path_factory.mktemp("home")
    (home / ".codex").mkdir()
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    for args in (["marketplace", "add", str(ROOT)], ["add", "rl@legorl"]):
        p = subprocess.run([str(codex), "plugin", *args], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
    return home


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    proc = train(write_run(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def drive(codex: Path, home: Path, prompt: str) -> tuple[list[dict[str, Any]], SkillFollower]:
    """`codex exec PROMPT` in the checkout, its provider our proxy with the skill-following engine."""
    from legorl.harness.codex import KEY_VAR, Codex
    from legorl.models import load_tokenizer
    from legorl.proxy.config import ProxyConfig
    from legorl.proxy.renderer_choice import make_renderer
    from legorl.proxy.server import ProxyServer

    tok = load_tokenizer("harness-qwen3")
    engine = SkillFollower(tok)
    codex_home = home / ".codex"
    installed = (codex_home / "config.toml").read_text().split("[marketplaces.", 1)[-1]

    async def go() -> bytes:
        proxy = ProxyServer(ProxyConfig(port=0, max_context=2**20, max_tokens=4096), engine, make_renderer(tok))
        async with proxy:
            proxy.open_session("operator")
            # the harness adapter's offline config (provider = the proxy), with plugins on
            config = Codex(sub_agents=False).config(proxy.session_url("operator")).replace("plugins = false\n", "")
            (codex_home / "config.toml").write_text(f"{config}\n[marketplaces.{installed}")
            env = {
                **os.environ,
                "HOME": str(home),
                "CODEX_HOME": str(codex_home),
                KEY_VAR: "unused",
                "RUST_LOG": "error",
                "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
            }
            argv = [
                str(codex),
                "exec",
                "--json",
                "--ephemeral",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "-C",
                str(ROOT),
                prompt,
            ]
            p = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(p.communicate(), 300)
            proxy.close_session("operator")
            assert p.returncode == 0, err.decode()[-2000:]
            return out

    events = [json.loads(line) for line in asyncio.run(go()).splitlines() if line.strip()]
    return events, engine


def check_run(events: list[dict[str, Any]], engine: SkillFollower, run: Path, home: Path) -> str:
    first = engine.prompts[0]
    plugin_skills = home / ".codex" / "plugins" / "cache" / "legorl" / "rl"
    assert str(plugin_skills) in first and "- rl:status: " in first  # the plugin's skills, listed
    assert "<skill>\n<name>rl:status</name>" in first  # the invoked skill's instructions reached the model
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i["type"] == "command_execution"]
    assert len(commands) == 1, (items, engine.prompts[-1][-3000:])
    assert len(commands) == 1 and f"legorl status {run} --json" in commands[0]["command"]
    assert commands[0]["exit_code"] == 0 and status(run)["run_id"] in commands[0]["aggregated_output"]
    messages = [i["text"] for i in items if i["type"] == "agent_message"]
    assert messages and any(e.get("type") == "turn.completed" for e in events)
    return messages[-1]


def test_status_of_a_healthy_run(codex: Path, home: Path, healthy: Path) -> None:
    events, engine = drive(codex, home, f"$rl:status {healthy}")
    result = check_run(events, engine, healthy, home)
    assert result.strip().endswith("VERDICT: NO KNOWN FAILURE") and "no known signature matched" in result


def test_status_of_a_run_made_sick(codex: Path, home: Path, healthy: Path, tmp_path: Path) -> None:
    sick = sick_store(healthy, tmp_path / "sick", SICK["infra_avalanche"])
    events, engine = drive(codex, home, f"$rl:status {sick}")
    result = check_run(events, engine, sick, home)
    assert result.strip().endswith("VERDICT: SICK infrastructure avalanche"), result
    assert "infrastructure errors" in result  # the evidence, as read

"""The plugin (`plugin/`): its manifests hold the documented fields, each skill's command lines
run real `legorl` subcommands with options they have, each skill carries its guardrails, and
the real Claude Code and Codex binaries (the harness layers) validate and install it.

Documented fields: Claude Code's marketplace (`.claude-plugin/marketplace.json`: `name`,
`owner.name`, `plugins[]` with `name` and `source`) and plugin manifest
(`.claude-plugin/plugin.json`: `name` required, kebab-case; `version`, `description`,
`author.name`); Codex's plugin manifest (`.codex-plugin/plugin.json` with `skills`) and its
repo marketplace (`.agents/plugins/marketplace.json`, `source.path` a `./` path); and the
Agent Skills format both read (`skills/<name>/SKILL.md`, front matter `name` equal to the
folder, at most 64 characters, lowercase and hyphens; `description` at most 1024).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import ROOT

PLUGIN = ROOT / "plugin"
SKILLS = {"check": "doctor", "run": "train", "status": "status", "dashboard": "ui"}  # skill -> its subcommand
READ_ONLY = ("check", "status", "dashboard")
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
SEMVER = re.compile(r"^\d+\.\d+\.\d+$")


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def front_matter(text: str) -> dict[str, str]:
    """The SKILL.md front matter: `key: value` lines between the opening `---` lines."""
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, "SKILL.md must open with --- front matter ---"
    return dict(line.split(": ", 1) for line in m.group(1).splitlines())


def legorl_lines(text: str) -> list[list[str]]:
    """Every `legorl ...` command line of a skill (code blocks and inline code), as argv."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    inline = re.findall(r"`(legorl [^`]+)`", text)
    out = []
    for line in [ln.strip() for b in blocks for ln in b.splitlines()] + inline:
        argv = shlex.split(line.split(">")[0])
        if argv and argv[0] == "nohup":
            argv = argv[1:]
        if argv and argv[0] == "legorl":
            out.append(argv)
    return out


# ------------------------------------------------------------------ manifests
def test_claude_code_marketplace_and_plugin_manifests() -> None:
    market = load(ROOT / ".claude-plugin" / "marketplace.json")
    assert KEBAB.match(market["name"]) and isinstance(market["owner"]["name"], str)
    (entry,) = market["plugins"]
    assert KEBAB.match(entry["name"]) and entry["source"].startswith("./")
    root = ROOT / entry["source"]
    manifest = load(root / ".claude-plugin" / "plugin.json")
    assert manifest["name"] == entry["name"] == "rl"  # skills are /rl:check, /rl:run, ...
    assert SEMVER.match(manifest["version"]) and manifest["version"] == entry["version"]
    assert manifest["description"] and manifest["author"]["name"]
    assert sorted(p.name for p in (root / "skills").iterdir()) == sorted(SKILLS)


def test_codex_plugin_and_marketplace_manifests() -> None:
    market = load(ROOT / ".agents" / "plugins" / "marketplace.json")
    (entry,) = market["plugins"]
    assert entry["source"]["source"] == "local" and entry["source"]["path"] == "./plugin"
    manifest = load(ROOT / entry["source"]["path"] / ".codex-plugin" / "plugin.json")
    claude = load(PLUGIN / ".claude-plugin" / "plugin.json")
    assert manifest["name"] == entry["name"] == claude["name"] and manifest["version"] == claude["version"]
    assert (PLUGIN / manifest["skills"]).resolve() == (PLUGIN / "skills").resolve()  # the same skills


@pytest.mark.parametrize("skill", sorted(SKILLS))
def test_each_skill_is_an_agent_skill_with_guardrails_and_a_verdict(skill: str) -> None:
    text = (PLUGIN / "skills" / skill / "SKILL.md").read_text()
    fm = front_matter(text)
    assert fm["name"] == skill and KEBAB.match(skill) and len(skill) <= 64
    assert 0 < len(fm["description"]) <= 1024
    assert "## Guardrails" in text and "VERDICT:" in text.split("## Report")[-1]
    assert "not a LEGO-RL checkout" in text  # outside a checkout or without set-up: says so, no YES
    if skill in READ_ONLY:
        assert "Read-only" in text and "Read-only" in fm["description"]
    else:
        assert "VERDICT: YES" in text and "never pass `--overwrite`" in text


# ------------------------------------------------------------------ the command lines are real
def _help(sub: str) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "legorl.cli", sub, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert p.returncode == 0, f"`legorl {sub} --help` failed: {p.stderr[-500:]}"
    return p.stdout


@pytest.mark.parametrize("skill", sorted(SKILLS))
def test_each_skill_invokes_a_real_subcommand_with_real_options(skill: str) -> None:
    lines = legorl_lines((PLUGIN / "skills" / skill / "SKILL.md").read_text())
    assert lines, f"{skill} runs no legorl command"
    assert {argv[1] for argv in lines} == {SKILLS[skill]}
    for argv in lines:
        helptext = _help(argv[1])
        for opt in [a.split("=")[0] for a in argv[2:] if a.startswith("--")]:
            assert re.search(rf"{re.escape(opt)}\b", helptext), f"`legorl {argv[1]}` has no option {opt}"
    if skill in ("check", "status"):
        assert any("--json" in argv for argv in lines)


# ------------------------------------------------------------------ the real harness binaries
def _binary(harness: str, name: str) -> Path:
    from legorl.harness.install import layer_path
    from tests.helpers.harness_util import harness_missing

    if why := harness_missing(harness):
        pytest.skip(why)
    return layer_path(harness) / "bin" / name


def _env(home: Path) -> dict[str, str]:
    from legorl.harness.install import is_built, layer_path

    (home / ".codex").mkdir(exist_ok=True)
    path = os.environ["PATH"]
    if is_built("node22"):
        path = f"{layer_path('node22') / 'bin'}:{path}"
    return {**os.environ, "HOME": str(home), "PATH": path, "CODEX_HOME": str(home / ".codex")}


@pytest.mark.harness
def test_claude_code_validates_and_installs_the_plugin(tmp_path: Path) -> None:
    claude = _binary("claude-code", "claude")
    env = _env(tmp_path)

    def run(*args: str) -> str:
        p = subprocess.run([str(claude), "plugin", *args], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
        return p.stdout + p.stderr

    plugin = run("validate", str(PLUGIN))
    assert "Validation passed" in plugin
    assert all(f"skills: rl:{s}" in plugin for s in SKILLS)
    assert "Validation passed" in run("validate", str(ROOT))  # the marketplace
    run("marketplace", "add", str(ROOT))
    run("install", "rl@legorl")
    listed = run("list")
    assert "rl@legorl" in listed and "enabled" in listed


@pytest.mark.harness
def test_codex_installs_the_plugin_with_its_skills(tmp_path: Path) -> None:
    codex = _binary("codex", "codex")
    env = _env(tmp_path)

    def run(*args: str) -> str:
        p = subprocess.run([str(codex), "plugin", *args], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
        return p.stdout

    run("marketplace", "add", str(ROOT))
    run("add", "rl@legorl")
    assert re.search(r"rl@legorl\s+installed, enabled", run("list"))
    installed = sorted((tmp_path / ".codex" / "plugins" / "cache" / "legorl" / "rl").glob("*/skills/*/SKILL.md"))
    assert sorted(p.parent.name for p in installed) == sorted(SKILLS)
    assert all(p.read_text() == (PLUGIN / "skills" / p.parent.name / "SKILL.md").read_text() for p in installed)

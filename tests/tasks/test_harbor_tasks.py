"""Harbor task directories as a task source (issue 25): parsed, built into the image cache,
run and state-graded on real sandboxes, and checked by `legorl tasks validate`.

The fixtures (tests/fixtures/harbor) are written from Harbor's documented layout: two valid
tasks (a root one with reward.txt; a non-root USER with reward.json and [verifier] env),
broken ones (bad/), and agent scripts: an honest solution, an empty run, a wrong answer,
planted reward files and start-up hooks.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from legorl.harness.command import CommandHarness
from legorl.rollout import run_rollout
from legorl.sandbox import open_backend
from legorl.tasks.dockerfile import DockerfileError, parse_dockerfile
from legorl.tasks.harbor import harbor_spec
from legorl.tasks.harbor_image import HarborImageError, resolve_base
from legorl.tasks.image import TaskImages
from legorl.tasks.loader import TaskFileError, get_task, load_tasks
from legorl.verify import state
from legorl.verify.state_grade import NoReward, parse_reward
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.redteam import HARBOR_FORGERIES, HARBOR_HONEST, harbor_agent, harbor_task_dir
from tests.helpers.tasks_util import require_backend

FIX = FIXTURES / "harbor"
TASKS = FIX / "tasks"
CLI = [sys.executable, "-m", "legorl.tasks.cli"]


def test_directory_of_tasks_loads_with_names_and_settings() -> None:
    tasks = load_tasks(TASKS)
    assert sorted(t.instance_id for t in tasks) == ["fixtures/count-lines", "upper-case"]
    up = get_task(tasks, "upper-case")
    assert up.kind == "harbor" and up.problem_statement.startswith("The file /app/words.txt")
    spec = harbor_spec(up)
    assert spec.workdir == "/app" and spec.user == "root" and spec.env["GREETING"] == "hello"
    assert (spec.limits.memory_mb, spec.limits.disk_mb, spec.limits.cpus) == (1024, 512, 1.0)
    assert (spec.agent_timeout_s, spec.verifier_timeout_s) == (120.0, 60.0)
    assert any("CMD ignored" in n for n in spec.notes)
    cl = harbor_spec(get_task(tasks, "fixtures/count-lines"))
    assert cl.workdir == "/srv/work" and cl.user == "worker" and cl.limits.memory_mb == 1024
    assert cl.verifier_env == {"EXPECTED_FILE": "/srv/work/count.txt"}
    assert [t.instance_id for t in load_tasks(TASKS / "upper-case")] == ["upper-case"]


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("no-test-sh", "missing tests/test.sh"),
        ("bad-toml", "task.toml: not valid TOML"),
        ("unsupported", "Dockerfile:2: instruction ADD is not supported"),
    ],
)
def test_bad_task_directories_are_named_errors(name: str, needle: str) -> None:
    with pytest.raises(TaskFileError, match=needle):
        load_tasks(FIX / "bad" / name)


def test_dockerfile_subset() -> None:
    df = parse_dockerfile(
        'FROM python:3.12-slim AS b\nARG V=1\nENV A=x B="y z" \\\n  C=${A}-$V\nWORKDIR /w\nWORKDIR sub\n'
        'COPY ["a b", "./"]\nUSER 1000:1000\nEXPOSE 80\nRUN ["echo", "hi there"]\n'
    )
    wd, user, env = df.final({"PATH": "/bin"})
    assert (df.base, wd, user) == ("python:3.12-slim", "/w/sub", "1000:1000")
    assert env == {"A": "x", "B": "y z", "C": "x-1"}
    assert df.steps[-1].args == ("echo 'hi there'",) and len(df.notes) == 1
    assert parse_dockerfile("ARG BASE=ubuntu:22.04\nFROM ${BASE}\n").base == "ubuntu:22.04"
    for text, needle in [
        ("FROM a\nFROM b\n", "second FROM"),
        ("RUN true\n", "before FROM"),
        ("ARG B=x\nRUN true\n", "before FROM"),
        ("FROM a\nCOPY --from=x a b\n", "COPY --from is not supported"),
        ("FROM a\nVOLUME /x\n", "VOLUME is not supported"),
        ("FROM a\nRUN <<EOF\nx\nEOF\n", "heredoc"),
    ]:
        with pytest.raises(DockerfileError, match=needle):
            parse_dockerfile(text)


def test_base_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    for image in ("ubuntu:24.04", "debian:bookworm-slim", "python:3.12-slim", "docker.io/library/python:3.11"):
        assert resolve_base(image) == "base"
    with pytest.raises(HarborImageError, match="FROM alpine:3.19: .*LEGORL_HARBOR_BASES"):
        resolve_base("alpine:3.19")
    monkeypatch.setenv("LEGORL_HARBOR_BASES", "alpine:*=0123456789abcdef")
    assert resolve_base("alpine:3.19") == "0123456789abcdef"
    monkeypatch.setenv("LEGORL_HARBOR_BASES", "nonsense")
    with pytest.raises(HarborImageError, match="not PATTERN=TARGET"):
        resolve_base("alpine:3.19")


def test_reward_files_as_harbor_reads_them() -> None:
    assert parse_reward(None, b"0.5\n") == (0.5, {"reward": 0.5})
    assert parse_reward(b'{"reward": 1, "style": 0}', b"0") == (1.0, {"reward": 1.0, "style": 0.0})  # json first
    assert parse_reward(b'{"a": 1, "b": 0}', None)[0] == 0.5
    for js, txt in [(None, None), (None, b"yes"), (b"[1]", None), (b'{"r": "1"}', None), (None, b"nan")]:
        with pytest.raises(NoReward):
            parse_reward(js, txt)


def test_state_summary_names_protected_entries() -> None:
    text = (
        f"{state.HEADER} /\n"
        + json.dumps({"p": "logs/verifier/reward.txt", "t": "f", "b64": "MQo="})
        + "\n"
        + json.dumps({"p": "app/x", "t": "f", "b64": ""})
        + "\n"
        + json.dumps({"p": "app/y", "t": "x"})
        + "\n"
    )
    s = state.StateSummary.of(text)
    assert (s.files, s.deleted, s.protected) == (1, 1, ["logs/verifier/reward.txt"])
    assert state.is_empty(f"{state.HEADER} /app\n") and not state.is_empty(text)


async def _rollouts(backend_name: str, agents: list[str]) -> dict[str, dict]:
    task = get_task(load_tasks(TASKS), "upper-case")
    images = TaskImages(backend_name)
    image = await images.for_task(task)
    out = {}
    async with open_backend(backend_name) as backend:
        for a in agents:
            res = await run_rollout(task, CommandHarness.from_file(FIX / "agents" / f"{a}.sh"), backend, image)
            out[a] = res.to_json()
    return out


AGENTS = ["honest", "empty", "wrong", "planted", "startup"]


def _check_rollouts(got: dict[str, dict]) -> None:
    assert got["honest"]["status"] == "resolved" and got["honest"]["reward"] == 1.0, got["honest"]
    assert got["empty"]["status"] == "no_patch" and got["empty"]["reward"] == 0.0
    assert got["wrong"]["status"] == "failed" and got["wrong"]["reward"] == 0.0
    for forger in ("planted", "startup"):  # a reward it could have written counts for nothing
        assert got[forger]["status"] == "failed" and got[forger]["reward"] == 0.0, got[forger]
        assert not got[forger]["masked"]
        assert got[forger]["evidence"]["rewards"] == {"reward": 0.0}


def test_rollouts_on_local() -> None:
    _check_rollouts(asyncio.run(_rollouts("local", AGENTS)))


@pytest.mark.docker
def test_rollouts_on_docker() -> None:
    require_backend("docker")
    _check_rollouts(asyncio.run(_rollouts("docker", AGENTS)))


def test_forged_state_entries_are_refused() -> None:
    """The state text comes from the agent's sandbox: paths out of the workdir, through a
    link, or into /logs are refused when applied; setuid bits are dropped."""
    task = get_task(load_tasks(TASKS), "upper-case")

    async def run() -> dict:
        image = await TaskImages("local").for_task(task)
        from legorl.verify.grade import grade

        entries = [
            {"p": "../logs/verifier/reward.txt", "t": "f", "m": 420, "u": 0, "g": 0, "b64": "MQo="},
            {"p": "link", "t": "l", "m": 0, "u": 0, "g": 0, "s": "/logs/verifier"},
            {"p": "link/reward.txt", "t": "f", "m": 420, "u": 0, "g": 0, "b64": "MQo="},
            {"p": "out.txt", "t": "f", "m": 0o6755, "u": 0, "g": 0, "b64": "TEVHTwpCUklDS1MK"},
        ]
        text = f"{state.HEADER} /app\n" + "".join(json.dumps(e) + "\n" for e in entries)
        async with open_backend("local") as backend:
            return (await grade(task, text, backend, image)).to_dict()

    out = asyncio.run(run())
    assert out["reward"] == 1.0 and out["status"] == "resolved", out  # out.txt is right; nothing else counts
    skipped = {p: why for p, why in out["evidence"]["state"]["skipped"]}
    assert skipped == {"../logs/verifier/reward.txt": "path leaves the workdir", "link/reward.txt": "through a link"}
    assert "state_entries_refused" in out["flags"]


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=900)


def test_validate_accepts_the_fixtures_on_local() -> None:
    proc = cli("validate", TASKS, "--sandbox", "local", "--json")
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and len(rows) == 2 and all(r["ok"] for r in rows), proc.stdout + proc.stderr
    assert all(r["gold"] == "resolved" and r["empty"] == "failed" for r in rows)


@pytest.mark.docker
def test_validate_accepts_the_fixtures_on_docker() -> None:
    require_backend("docker")
    proc = cli("validate", TASKS, "--sandbox", "docker", "--json")
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and len(rows) == 2 and all(r["ok"] for r in rows), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("name", "code", "needle"),
    [
        ("no-test-sh", 2, "missing tests/test.sh"),
        ("bad-toml", 2, "not valid TOML"),
        ("unsupported", 2, "instruction ADD is not supported"),
        ("build-fails", 1, "environment/Dockerfile:2 RUN failed (exit 3)"),
        ("unmapped-from", 1, "FROM alpine:3.19: this image cannot be pulled here"),
        ("no-reward", 1, "infrastructure error"),
    ],
)
def test_validate_reports_broken_tasks(name: str, code: int, needle: str) -> None:
    proc = cli("validate", FIX / "bad" / name, "--sandbox", "local")
    assert proc.returncode == code and needle in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_legorl_rollout_takes_a_harbor_directory() -> None:
    args = ["rollout", "--tasks", TASKS, "--instance", "upper-case", "--command-file", FIX / "agents" / "honest.sh"]
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.cli", *map(str, args)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["instance_id"] == "upper-case" and line["reward"] == 1.0, proc.stderr[-2000:]


def harbor_python() -> Path:
    import os

    venv = Path(os.environ.get("LEGORL_HARBOR_VENV") or ROOT / ".venv-harbor")
    py = venv / "bin" / "python"
    if not py.exists():
        pytest.fail(f"no Harbor venv at {venv}: run `bash scripts/setup_harbor.sh` (scripts/setup.sh runs it)")
    return py


def test_harbor_itself_reads_the_fixtures_as_we_do() -> None:
    """The pinned `harbor` package parses the same directories: same names, timeouts, resources."""
    code = (
        "import json, sys; from pathlib import Path; from harbor.models.task.task import Task\n"
        "out = {}\n"
        "for d in sorted(Path(sys.argv[1]).iterdir()):\n"
        "    t = Task(d); c = t.config\n"
        "    out[t.name] = [c.agent.timeout_sec, c.verifier.timeout_sec, c.environment.cpus,\n"
        "                   c.environment.memory_mb, c.environment.storage_mb, t.instruction]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([harbor_python(), "-c", code, TASKS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout)
    ours = {}
    for t in load_tasks(TASKS):
        s = harbor_spec(t)
        ours[t.instance_id] = [
            s.agent_timeout_s,
            s.verifier_timeout_s,
            s.limits.cpus,
            s.limits.memory_mb,
            s.limits.disk_mb,
            t.problem_statement,
        ]
    assert theirs == ours


def test_preflight_grading_self_test_runs_the_oracle(tmp_path: Path) -> None:
    """`legorl train`'s self-test grades solve.sh's changes for a Harbor task set (not an empty patch)."""
    from legorl.loop.config import RunConfig
    from legorl.verify.checks import grading_check

    cfg = RunConfig.model_validate({"run": {"tasks": str(TASKS / "upper-case"), "split": "train"}})
    assert "upper-case: gold resolved, empty failed" in grading_check(cfg).fn()


def _variant(tmp_path: Path, files: dict[str, str], src: Path = TASKS / "upper-case") -> Path:
    """A copy of a fixture task with some files replaced (tests/test.sh made executable)."""
    import shutil

    dest = tmp_path / src.name
    shutil.copytree(src, dest)
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    (dest / "tests" / "test.sh").chmod(0o755)
    return dest


async def _rollout_on(task_dir: Path, script: str, backend_name: str = "local") -> dict:
    (task,) = load_tasks(task_dir)
    image = await TaskImages(backend_name).for_task(task)
    async with open_backend(backend_name) as backend:
        res = await run_rollout(task, CommandHarness(script), backend, image)
    out = res.to_json()
    out["diff"] = res.diff
    return out


def _state_file(diff: str, rel: str) -> str:
    import base64

    for ln in diff.splitlines()[1:]:
        e = json.loads(ln)
        if e["p"] == rel:
            return base64.b64decode(e["b64"]).decode()
    raise AssertionError(f"{rel} not in the state")


def test_agent_never_sees_tests_or_solution() -> None:
    script = (
        "find / -xdev \\( -name solve.sh -o -name test.sh -o -path /tests -o -path /solution \\) "
        "-print 2>/dev/null > /app/found.txt; grep -rlE 'A helper of the verifie[r]|Harbor verifier: rewar[d] 1' "
        "/app /root /etc /opt /srv /home /var /tmp /usr/local 2>/dev/null >> /app/found.txt; "
        "echo done >> /app/found.txt"
    )
    out = asyncio.run(_rollout_on(TASKS / "upper-case", script))
    assert _state_file(out["diff"], "found.txt") == "done\n"


def test_verifier_runs_as_the_task_user_with_its_env() -> None:
    from legorl.tasks.harbor_validate import oracle_changes
    from legorl.verify.grade import grade

    task = get_task(load_tasks(TASKS), "fixtures/count-lines")

    async def run() -> dict:
        image = await TaskImages("local").for_task(task)
        async with open_backend("local") as backend:
            diff = await oracle_changes(task, backend, image)
            return (await grade(task, diff, backend, image)).to_dict()

    out = asyncio.run(run())
    assert out["reward"] == 1.0 and out["evidence"]["rewards"] == {"reward": 1.0, "ran_as_worker": 1.0}, out


def test_verifier_timeout_is_the_agents_and_its_reward_ignored(tmp_path: Path) -> None:
    toml = (TASKS / "upper-case" / "task.toml").read_text().replace("timeout_sec = 60.0", "timeout_sec = 3.0")
    test_sh = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nif [ -f /app/slow ]; then sleep 60; fi\n"
    d = _variant(tmp_path, {"task.toml": toml, "tests/test.sh": test_sh})
    assert harbor_spec(load_tasks(d)[0]).verifier_timeout_s == 3.0
    out = asyncio.run(_rollout_on(d, "touch /app/slow"))
    assert out["status"] == "failed" and out["reward"] == 0.0 and "test_timeout" in out["flags"], out
    assert not out["masked"]


def test_missing_reward_is_the_agents_only_when_the_unchanged_workdir_grades(tmp_path: Path) -> None:
    test_sh = "#!/bin/bash\nset -e\ncat /app/words.txt > /dev/null\necho 0 > /logs/verifier/reward.txt\n"
    d = _variant(tmp_path, {"tests/test.sh": test_sh})
    out = asyncio.run(_rollout_on(d, "rm /app/words.txt"))
    assert out["status"] == "failed" and "no_reward" in out["flags"] and not out["masked"], out
    never = asyncio.run(_rollout_on(FIX / "bad" / "no-reward", "echo x > /app/out.txt"))
    assert never["status"] == "infra_error" and never["masked"], never  # the task's fault: never scored


@pytest.mark.parametrize("backend_name", ["local", pytest.param("docker", marks=pytest.mark.docker)])
@pytest.mark.parametrize("forgery", sorted(HARBOR_FORGERIES))
def test_a_reward_written_by_the_agents_code_the_verifier_runs_counts_for_nothing(
    tmp_path: Path, forgery: str, backend_name: str
) -> None:
    """The verifier runs the agent's program, so the agent's code runs as the verifier's user
    and can write under /logs/verifier: a reward file the verifier never names, or the
    verdict's own file pinned read-only or pointed elsewhere, is a forgery (0, flagged)."""
    require_backend(backend_name)
    out = asyncio.run(_rollout_on(harbor_task_dir(tmp_path), harbor_agent(HARBOR_FORGERIES[forgery]), backend_name))
    assert out["reward"] == 0.0 and out["status"] == "hack_detected", out
    assert {"planted_reward_file", "tamper_attempt"} <= set(out["flags"]) and not out["masked"], out
    assert out["evidence"]["forged_reward_files"], out


def test_an_honest_program_the_verifier_runs_still_scores_1(tmp_path: Path) -> None:
    out = asyncio.run(_rollout_on(harbor_task_dir(tmp_path), harbor_agent(HARBOR_HONEST)))
    assert out["reward"] == 1.0 and out["status"] == "resolved" and out["flags"] == [], out


def test_harbors_own_task_template_runs(tmp_path: Path) -> None:
    """`harbor tasks init`'s template (from the pinned package), filled in: loads, builds, validates."""
    import shutil

    src = harbor_python().parents[1] / "lib" / "python3.12" / "site-packages" / "harbor" / "cli" / "template-task"
    assert src.is_dir(), src
    d = tmp_path / "hello-template"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("__pycache__"))
    (d / "instruction.md").write_text("Create /app/hello.txt containing 'Hello, world!'.\n")
    # the template's pytest variant, without the CTRF report plugin (not in our offline base)
    (d / "tests" / "test.sh").write_text(
        (d / "pytest-tests" / "test.sh").read_text().replace("--ctrf /logs/verifier/ctrf.json ", "")
    )
    (d / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\n\ndef test_outputs():\n"
        "    assert Path('/app/hello.txt').read_text().strip() == 'Hello, world!'\n"
    )
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'Hello, world!' > /app/hello.txt\n")
    (d / "tests" / "test.sh").chmod(0o755)
    (t,) = load_tasks(d)
    assert t.instance_id == "hello-template" and harbor_spec(t).workdir == "/app"
    proc = cli("validate", d, "--sandbox", "local", "--json")
    assert proc.returncode == 0 and '"ok": true' in proc.stdout, proc.stdout + proc.stderr


HARBOR_AGENT = """#!/bin/bash
# Asks the policy twice through the proxy, then solves the Harbor fixture task in half its runs.
python3 - <<'PY'
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"]
msgs = [{"role": "user", "content": open(os.environ["LEGORL_PROBLEM_FILE"]).read()[:400]}]
for _ in range(2):
    body = {"model": "policy", "messages": msgs, "max_tokens": 12}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    reply = json.load(urllib.request.urlopen(req, timeout=120))
    msgs += [reply["choices"][0]["message"], {"role": "user", "content": "continue"}]
PY
if [ $((RANDOM % 2)) -eq 0 ]; then
  if [ -f /app/words.txt ]; then tr '[:lower:]' '[:upper:]' < /app/words.txt > /app/out.txt
  else wc -l < /srv/work/data.csv | tr -d ' ' > /srv/work/count.txt; fi
fi
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_train_two_steps_on_harbor_tasks(tmp_path: Path, backend: str) -> None:
    require_backend(backend)
    (tmp_path / "agent.sh").write_text(HARBOR_AGENT)
    config = tmp_path / "run.toml"
    config.write_text(f"""
[run]
dir = "run"
tasks = "{TASKS}"
split = "train"
steps = 2
tasks_per_step = 2
group_size = 2
max_concurrent_rollouts = 4
[engine]
kind = "hf"
model = "tiny-qwen3"
[proxy]
max_tokens = 12
[sandbox]
backend = "{backend}"
[harness]
name = "command"
command_file = "agent.sh"
[trainer]
lr = 1e-4
zero_variance_groups = "keep"
""")
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.cli", "train", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import sqlite3

    db = sqlite3.connect(tmp_path / "run" / "run.sqlite")
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert "steps" in tables
    assert db.execute("SELECT count(*) FROM steps WHERE t_end IS NOT NULL").fetchone()[0] == 2
    rows = db.execute("SELECT instance_id, status, n_turns FROM trajectories").fetchall()
    assert {r[0] for r in rows} == {"upper-case", "fixtures/count-lines"} and len(rows) == 8
    assert all(st in ("resolved", "no_patch") for _, st, _ in rows), rows  # graded by the verifier's reward
    assert all(n == 2 for _, _, n in rows), rows  # every agent reached the policy (a '/' in a name too)


@pytest.mark.slow
def test_eval_over_a_harbor_directory(tmp_path: Path) -> None:
    config = tmp_path / "eval.toml"
    config.write_text(
        f'[run]\ndir = "run"\ntasks = "{TASKS}"\n[engine]\nkind = "hf"\nmodel = "tiny-qwen3"\n'
        f'[harness]\nname = "command"\ncommand_file = "{FIX / "agents" / "honest.sh"}"\n'
    )
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.cli", "eval", str(config), "--split", "train", "--k", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["per_task"] == {"fixtures/count-lines": "no_patch", "upper-case": "resolved"}
    assert summary["pass@1"] == 0.5

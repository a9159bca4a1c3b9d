"""The plan of a hardened, supervised pytest run: used to grade (and, when generating tasks,
to label) tests. (Which runner a task's test_cmd names is `test_command.py`.)

What the repository under test could otherwise do to the runner, and what stops it:
- shadow pytest or its dependencies (`pytest.py`, `_pytest/` in the repo): the runner is
  imported by the bootstrap *before* the repository is on `sys.path`, and the repository
  is then appended (not prepended) to `sys.path`, with `--import-mode=append`;
- start-up hooks (`sitecustomize`, `usercustomize`, `.pth`) and environment variables
  (`PYTHONPATH`, `PYTEST_ADDOPTS`, `PYTEST_PLUGINS`): `python -I` (isolated: no user site,
  no `PYTHON*` variables, no script directory on the path) under `env -i`;
- installed plugins that the repository could register through entry points:
  `PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`;
- stale or planted byte code: `-B` and the grader deletes `__pycache__` before the run;
- a cache that survives between runs: `-p no:cacheprovider`;
- rewritten reports, from conftest-free package code in the same interpreter: the run is
  supervised (`in_sandbox/pytest_main.py`): a grader plugin registered before any repository import
  records what each test raised and whether pytest's reporting machinery was changed, and
  streams that over a pipe the package cannot forge records into; the report itself goes
  to a pipe, so nothing written after pytest (`atexit`, `os._exit` wrappers, daemons) can
  replace it; a pair of canaries (one must pass, one must fail), planted among the task's
  own tests under names like theirs, catches blanket rewrites of outcomes;
- an early `os._exit(0)`: no report and no end-of-session record, so every test counts as
  missing (failed), and the exit code 0 contradicts the canary that must fail.
"""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

IN_SANDBOX = Path(__file__).parent / "in_sandbox"  # the grading supervisor: copied into the sandbox, never imported
SUPERVISOR = IN_SANDBOX / "pytest_main.py"  # its pytest main (`native.py` runs its native main)
SETUP_FAILED = 86  # the supervisor's exit status when it could not prepare the run (keep in sync with it)
_CANARY_FILE = """\
def test_{nonce}_pass():
    assert True


def test_{nonce}_fail():
    assert False, "canary"
"""


def canary_candidates(like: list[str], rng: secrets.SystemRandom, n: int = 12) -> list[str]:
    """Fallback test names shaped like the task's own (`test_merge_keys` → `test_merge_keys_merge`),
    from its own words (never a list of ours). The supervisor draws names from the whole
    file's vocabulary (`fresh_names`) and uses these only when it cannot."""
    bases = sorted({b for b in like if b.isidentifier()}) or ["test"]
    words = sorted({w for b in bases for w in b.split("_")[1:] if w.isidentifier()}) or ["case", "value"]
    out: list[str] = []
    for _ in range(20 * n):
        name = f"{rng.choice(bases)}_{rng.choice(words)}"
        if name not in out:
            out.append(name)
        if len(out) == n:
            break
    return out


def canary_source(must_pass: bool, rng: secrets.SystemRandom) -> str:
    """A small, ordinary-looking test (`{name}` to fill in); the two differ only in literals."""
    values = rng.sample(range(2, 99), 4)
    expected = sorted(values)
    if not must_pass:
        i = rng.randrange(3)
        expected[i], expected[i + 1] = expected[i + 1], expected[i]
    return f"def {{name}}():\n    values = {values!r}\n    assert sorted(values) == {expected!r}\n"


@dataclass(frozen=True)
class RunnerPlan:
    """Everything one hardened test run needs: files to write and the command to execute."""

    work_dir: str  # outside the repository, random name
    junit_path: str  # written by the supervisor from what pytest sent down the report pipe
    script_path: str  # the supervisor's main, beside the modules it imports
    supervisor: dict[str, str]  # the supervisor's files at their paths in the sandbox
    config_path: str  # read and deleted by the supervisor before the code under test runs
    config: str
    nonce: str  # tags the supervisor's one summary line on stdout
    key: str  # HMAC key of the recorder's records
    canary_path: str  # absolute path of the file that holds the canaries
    canary_source: str  # the file to write ("" when they are planted into a task test file)
    canary_pass: str  # node ids of the canaries ("" when planted: the supervisor picks the names)
    canary_fail: str
    command: str  # shell command; run with cwd = the repository

    def canaries(self, summary: dict | None) -> tuple[str, str]:
        """(must-pass, must-fail) node ids: fixed, or as the supervisor planted them."""
        if self.canary_pass:
            return self.canary_pass, self.canary_fail
        got = (summary or {}).get("canaries") or {}
        return str(got.get("pass", "")), str(got.get("fail", ""))

    @property
    def files(self) -> dict[str, str]:
        out = {**self.supervisor, self.config_path: self.config}
        if self.canary_source:
            out[self.canary_path] = self.canary_source
        return out


def plan_run(
    repo: str,
    args: list[str],
    python: str = "python3",
    tmp_root: str = "/tmp",
    plant_in: str | None = None,
    like: list[str] | None = None,
    guard: list[str] | None = None,
    wanted: list[str] | None = None,
    agent_files: list[str] | None = None,
) -> RunnerPlan:
    """Plan a hardened, supervised run of `pytest ARGS` in `repo` with fresh random names.

    With `plant_in` (a repo-relative test file the args already select) the canaries are
    planted among that file's tests, named like `like` (its tests' function names; the
    supervisor reports the names it took, see `canaries`); the args are unchanged. `guard`:
    repo-relative files (the task's tests) whose content must be the same after the run.
    `wanted`: the task's test ids; the summary then carries only their records (and the
    canaries'), the supervisor keeps them from the child. Without it they get a file of their own,
    added to the args (task generation, where nothing adversarial runs).
    """
    work = f"{tmp_root.rstrip('/')}/.lg-{secrets.token_hex(8)}"
    junit = f"{work}/{secrets.token_hex(8)}.xml"
    repo_root = repo.rstrip("/")
    c = _canaries(repo_root, plant_in, like or [])
    full_args = [
        *args,
        *c.extra_args,
        f"--rootdir={repo}",
        "--import-mode=append",
        "--continue-on-collection-errors",
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=xunit1",
        "-o",
        "console_output_style=classic",
        "--tb=short",
        "-q",
    ]
    nonce, key = secrets.token_hex(16), secrets.token_hex(32)
    config = json.dumps(
        {
            "repo": repo,
            "args": full_args,
            "junit": junit,
            "log": f"{work}/out.log",
            "summary": f"{work}/{secrets.token_hex(8)}.json",  # a large summary goes here (`write_summary`)
            "nonce": nonce,
            "key": key,
            "plant": c.plant,
            "guard": list(guard or []),
            "wanted": list(wanted or []),
            "agent_files": sorted(agent_files or []),  # whose code is whose (not secret: they are the agent's own)
            "test_files": list(guard or []),
        }
    )
    cfg_path = f"{work}/{secrets.token_hex(8)}.json"
    command = _command(repo, python, work, cfg_path)
    return RunnerPlan(
        work_dir=work,
        junit_path=junit,
        script_path=f"{work}/{SUPERVISOR.name}",
        supervisor=supervisor_files(work),
        config_path=cfg_path,
        config=config,
        nonce=nonce,
        key=key,
        canary_path=f"{repo_root}/{c.rel}",
        canary_source=c.file_source,
        canary_pass=c.pass_id,
        canary_fail=c.fail_id,
        command=command,
    )


def _command(repo: str, python: str, work: str, cfg_path: str) -> str:
    """The supervisor under `python -I -B` in an empty environment, plugin autoload off."""
    env = [
        "env",
        "-i",
        f"PATH={SAFE_PATH}",
        f"HOME={work}/home",
        f"TMPDIR={work}/tmp",
        "LANG=C.UTF-8",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
    ]
    return (
        f"mkdir -p {shlex.quote(work)}/home {shlex.quote(work)}/tmp && "
        f"cd {shlex.quote(repo)} && exec {shlex.join(env)} {shlex.quote(python)} -I -B "
        f"{shlex.quote(work)}/{SUPERVISOR.name} {shlex.quote(cfg_path)}"
    )


def supervisor_files(work: str) -> dict[str, str]:
    """The grading supervisor's files as they go into the work directory: both mains and the
    `lg_*` modules they import by name, side by side (a main puts its own folder on the path)."""
    return {f"{work}/{p.name}": p.read_text(encoding="utf-8") for p in sorted(IN_SANDBOX.glob("*.py"))}


@dataclass(frozen=True)
class _Canaries:
    """Where a run's canaries go: planted by the supervisor into a task test file, or a file of their own."""

    rel: str  # repo-relative file that holds them
    plant: dict[str, object]  # the supervisor's planting spec ({} for a file of their own)
    file_source: str  # that file's text ("" when planted)
    extra_args: list[str]  # that file, added to pytest's arguments
    pass_id: str  # their node ids ("" when planted: the supervisor picks the names)
    fail_id: str


def _canaries(repo_root: str, plant_in: str | None, like: list[str]) -> _Canaries:
    if plant_in:
        rng = secrets.SystemRandom()
        plant: dict[str, object] = {
            "path": f"{repo_root}/{plant_in}",
            "rel": plant_in,
            "candidates": canary_candidates(like, rng),
            "pass": canary_source(True, rng),
            "fail": canary_source(False, rng),
            "constructs": ["approx", "subTest", "class"],  # one more must-fail canary per construct the file uses
        }
        return _Canaries(plant_in, plant, "", [], "", "")
    nonce = secrets.token_hex(8)
    rel = f".lg-{nonce}/test_{nonce}.py"
    return _Canaries(
        rel, {}, _CANARY_FILE.format(nonce=nonce), [rel], f"{rel}::test_{nonce}_pass", f"{rel}::test_{nonce}_fail"
    )


def tagged_lines(stdout: str, nonce: str) -> list[str]:
    """What follows the nonce on each line of the supervisor's stdout that carries it."""
    return [ln[len(nonce) + 1 :] for ln in stdout.splitlines() if ln.startswith(nonce + " ")]


def parse_summary(stdout: str, nonce: str) -> tuple[dict | None, int]:
    """The supervisor's summary from its stdout, and how many lines carried the tag.

    Exactly one tagged line is trusted; none (the run died) or several (someone learned the
    tag) is evidence, not a result. A summary the supervisor wrote to a file (`file SHA PATH`:
    a large one) or a setup failure (`setup-failed MESSAGE`) is not one here; `execute` reads
    those.
    """
    found = tagged_lines(stdout, nonce)
    if len(found) != 1:
        return None, len(found)
    try:
        data = json.loads(found[0])
    except json.JSONDecodeError:
        return None, 1
    return (data if isinstance(data, dict) else None), 1

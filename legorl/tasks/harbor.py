"""Harbor task directories as tasks: the layout Terminal-Bench 2.0 and many RL projects share.

    my-task/
      task.toml            # [agent] / [verifier] timeout_sec, [environment] cpus, memory, storage
      instruction.md       # the agent's problem statement
      environment/Dockerfile (+ its build context)
      tests/test.sh        # the verifier: writes /logs/verifier/reward.txt (or reward.json)
      solution/solve.sh    # the oracle (`legorl tasks validate`)

`load_harbor(path)` reads one such directory, or a directory of them, into `Task`s with
`kind = "harbor"`: the instance id is the task's name (`[task] name` when task.toml has one,
else the directory's name). Such a task is state-graded (`legorl/verify/state_grade.py`):
no FAIL_TO_PASS lists, no gold patch; its verifier's reward is the reward. `harbor_spec(task)`
gives the parsed details (Dockerfile, limits, timeouts, verifier env) its kind
(`tasks/kinds/harbor.py`) hands the image builder, the rollout and the grader.

task.toml keys taken: `[agent] timeout_sec`, `[verifier] timeout_sec`, `[verifier] env`,
`[environment] build_timeout_sec`, `cpus`, `memory_mb` / `memory` ("2G"), `storage_mb` /
`storage`, `workdir`, `env`; `[verifier] user` (who runs test.sh; default the image's USER);
`[metadata] split` (ours; default "train"). `allow_internet` is always false
here (every sandbox has no network): a task that asks for it gets a note. `[environment]
docker_image` (a prebuilt image to pull) cannot be honoured: the Dockerfile is built.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legorl.sandbox.base import Limits
from legorl.tasks.dockerfile import Dockerfile, DockerfileError, parse_dockerfile
from legorl.types import Task

KIND = "harbor"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


class HarborTaskError(ValueError):
    """A Harbor task directory we cannot use; the message names the file and what is wrong."""


@dataclass(frozen=True)
class HarborSpec:
    """What task.toml and the Dockerfile say, as the sandboxes need it."""

    name: str
    root: Path
    dockerfile: Dockerfile
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 1800.0
    limits: Limits = field(default_factory=Limits)
    verifier_env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # settings we could not honour, one line each
    workdir_override: str = ""  # [environment] workdir
    env_extra: dict[str, str] = field(default_factory=dict)  # [environment] env
    agent_user: str = ""  # [agent] user
    verifier_user: str = ""  # [verifier] user

    @property
    def workdir(self) -> str:
        """Where the agent works and test.sh starts: [environment] workdir, else the Dockerfile's."""
        return self.workdir_override or self.dockerfile.final(_base_env())[0]

    @property
    def user(self) -> str:
        """The image's USER (the Dockerfile's last)."""
        return self.dockerfile.final(_base_env())[1]

    @property
    def test_user(self) -> str:
        """Who runs tests/test.sh: [verifier] user, else the image's USER (as in Harbor)."""
        return self.verifier_user or self.user

    @property
    def env(self) -> dict[str, str]:
        """The variables the image's ENV and [environment] env set (both stages get them)."""
        return {**self.dockerfile.final(_base_env())[2], **self.env_extra}

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.root / "solution"


def _base_env() -> dict[str, str]:
    from legorl.sandbox.channel import BASE_ENV

    return dict(BASE_ENV)


def _size_mb(value: Any, key: str, where: str) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise HarborTaskError(f"{where}: [environment] {key}: expected a size like '2G' or '512M', got {value!r}")
    n, unit = float(m.group(1)), m.group(2).upper()
    return int(n * {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[unit])


def _seconds(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise HarborTaskError(f"{where}: {key}: expected a positive number of seconds, got {value!r}")
    return float(value)


def _table(cfg: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = cfg.get(name, {})
    if not isinstance(value, dict):
        raise HarborTaskError(f"{where}: [{name}] must be a table")
    return value


def read_spec(root: Path) -> HarborSpec:
    """Parse one task directory; HarborTaskError (one line) for anything missing or malformed."""
    toml_path = root / "task.toml"
    where = str(toml_path)
    for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"):
        if not (root / rel).is_file():
            raise HarborTaskError(
                f"{root}: missing {rel} (a Harbor task needs task.toml, instruction.md, "
                "environment/Dockerfile and tests/test.sh)"
            )
    try:
        cfg = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HarborTaskError(f"{where}: not valid TOML: {exc}") from None
    task_t = _table(cfg, "task", where)
    agent = _table(cfg, "agent", where)
    verifier = _table(cfg, "verifier", where)
    env_t = _table(cfg, "environment", where)
    notes: list[str] = []
    name = task_t.get("name") or root.name
    if not isinstance(name, str) or not name.strip():
        raise HarborTaskError(f"{where}: [task] name: expected a non-empty string, got {name!r}")
    if env_t.get("allow_internet"):
        notes.append(f"{where}: [environment] allow_internet = true not honoured: sandboxes never have network")
    if env_t.get("docker_image"):
        notes.append(f"{where}: [environment] docker_image not used: the image is built from environment/Dockerfile")
    if env_t.get("healthcheck"):
        notes.append(f"{where}: [environment] healthcheck not run: a sandbox is ready when its init answers")
    if cfg.get("steps"):
        raise HarborTaskError(f"{where}: [[steps]] (multi-step tasks) are not supported")
    for key in ("gpus", "tpu", "mcp_servers", "skills_dir"):
        if env_t.get(key):
            notes.append(f"{where}: [environment] {key} not honoured")
    if agent.get("user") not in (None, "", "root", 0):
        notes.append(f"{where}: [agent] user not honoured: the agent runs as root (the verifier runs as its user)")
    wd = env_t.get("workdir") or ""
    if not isinstance(wd, str) or (wd and not wd.startswith("/")):
        raise HarborTaskError(f"{where}: [environment] workdir: expected an absolute path, got {wd!r}")
    eenv = env_t.get("env", {})
    if not isinstance(eenv, dict):
        raise HarborTaskError(f"{where}: [environment] env: expected a table of strings")
    if verifier.get("environment_mode") == "separate" or verifier.get("environment"):
        raise HarborTaskError(
            f"{where}: [verifier] environment (a separate verifier container) is not supported: "
            "the verifier runs in the task's own image"
        )
    vuser = verifier.get("user")
    if (root / "environment" / ".dockerignore").exists():
        notes.append(f"{root}/environment/.dockerignore not honoured: COPY sees every file of environment/")
    if (root / "environment" / "docker-compose.yaml").exists():
        notes.append(f"{where}: environment/docker-compose.yaml not used: one container per task here")
    defaults = Limits()
    memory = env_t.get("memory_mb", env_t.get("memory"))
    storage = env_t.get("storage_mb", env_t.get("storage"))
    cpus = env_t.get("cpus", defaults.cpus)
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or cpus <= 0:
        raise HarborTaskError(f"{where}: [environment] cpus: expected a positive number, got {cpus!r}")
    limits = Limits(
        memory_mb=_size_mb(memory, "memory_mb", where) if memory is not None else defaults.memory_mb,
        cpus=float(cpus),
        disk_mb=_size_mb(storage, "storage_mb", where) if storage is not None else defaults.disk_mb,
        pids=defaults.pids,
    )
    venv = verifier.get("env", {})
    if not isinstance(venv, dict) or not all(isinstance(v, str | int | float) for v in venv.values()):
        raise HarborTaskError(f"{where}: [verifier] env: expected a table of strings")
    try:
        df = parse_dockerfile(
            (root / "environment" / "Dockerfile").read_text(encoding="utf-8"), str(root / "environment/Dockerfile")
        )
    except DockerfileError as exc:
        raise HarborTaskError(str(exc)) from None
    return HarborSpec(
        name=name.strip(),
        root=root.resolve(),
        dockerfile=df,
        agent_timeout_s=_seconds(agent, "timeout_sec", 600.0, f"{where}: [agent]"),
        verifier_timeout_s=_seconds(verifier, "timeout_sec", 600.0, f"{where}: [verifier]"),
        build_timeout_s=_seconds(env_t, "build_timeout_sec", 1800.0, f"{where}: [environment]"),
        limits=limits,
        verifier_env={k: str(v) for k, v in venv.items()},
        notes=tuple(notes + df.notes),
        workdir_override=wd,
        env_extra={k: str(v) for k, v in eenv.items()},
        agent_user=str(agent.get("user") or ""),
        verifier_user=str(vuser) if vuser not in (None, "") else "",
    )


def is_harbor_dir(path: Path) -> bool:
    return path.is_dir() and (path / "task.toml").is_file()


def task_dirs(path: Path) -> list[Path]:
    """`path` itself when it is a task directory, else its task subdirectories (sorted)."""
    if is_harbor_dir(path):
        return [path]
    return sorted(p for p in path.iterdir() if is_harbor_dir(p))


def to_task(spec: HarborSpec, split: str) -> Task:
    return Task(
        instance_id=spec.name,
        repo=KIND,
        base_commit="",
        problem_statement=(spec.root / "instruction.md").read_text(encoding="utf-8"),
        patch="",
        test_patch="",
        FAIL_TO_PASS=[],
        PASS_TO_PASS=[],
        split=split,
        kind=KIND,
        task_dir=str(spec.root),
    )


def load_harbor(path: Path, errs: list[str], notes: list[str] | None = None) -> list[Task]:
    """The tasks of a Harbor task directory or a directory of them; problems go to `errs`,
    settings we cannot honour to `notes` (one line each)."""
    dirs = task_dirs(path)
    if not dirs:
        errs.append(f"{path}: neither a Harbor task (no task.toml) nor a directory of Harbor tasks")
        return []
    out: list[Task] = []
    seen: dict[str, Path] = {}
    for d in dirs:
        try:
            spec = read_spec(d)
        except HarborTaskError as exc:
            errs.append(str(exc))
            continue
        if spec.name in seen:
            errs.append(f"{d}: task name {spec.name!r} already used by {seen[spec.name]}")
            continue
        seen[spec.name] = d
        split = _split_of(d)
        out.append(to_task(spec, split))
        if notes is not None:
            notes.extend(spec.notes)
    return out


def _split_of(d: Path) -> str:
    try:
        meta = tomllib.loads((d / "task.toml").read_text()).get("metadata", {})
    except (tomllib.TOMLDecodeError, OSError):
        return "train"
    split = meta.get("split") if isinstance(meta, dict) else None
    return split if isinstance(split, str) and split else "train"


def harbor_spec(task: Task) -> HarborSpec:
    """The parsed spec of a Harbor task, read from its directory. The task's kind
    (`tasks/kinds/harbor.py`) reads it once and passes it along; nothing caches it here."""
    if not task.task_dir:
        raise ValueError(f"task {task.instance_id!r} is not a Harbor task (it names no task directory)")
    return read_spec(Path(task.task_dir))

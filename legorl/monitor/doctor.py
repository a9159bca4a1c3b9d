"""Pre-flight checks (`legorl doctor`): named checks, each ok or failed with a fix hint.

A check is a plain function that either returns (None, a detail string, or a
`CheckResult`) or raises; `CheckFailed` carries its own fix hint, any other exception
becomes a failure naming it, and a check that hangs fails after its timeout instead of
hanging the doctor. Checks can depend on others (`needs`): when a dependency failed they
are skipped, so a missing Docker daemon is one red line, not ten.

Checks are registered next to their code: each component decorates its checks of a run
config with `@check(...)` (engine/checks.py, proxy/checks.py, sandbox/checks.py,
harness/checks.py, verify/checks.py, ops/, loop/preflight.py, the run store's here), and
`loop/preflight.py` imports those modules when the doctor runs and takes the checks from
`REGISTRY` in the chain's order. `run_checks` prints a rich table and returns the exit code
(0 all passed, 1 otherwise); `checks_json` gives the same outcomes as one JSON object for a
program (a coding agent's `/rl:check`), with each check's status (`ok`, `warn`: passed with
something a person should read, or skipped behind a failed dependency; `fatal`) and the
verdict `safe_to_run` (no fatal check).

    @check("engine answers", timeout=120)
    def engine_check(cfg: RunConfig) -> str:
        ...
        return "hf:Qwen/Qwen3-0.6B generated 4 tokens"

    run_checks([engine_check(cfg)])
"""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


class CheckFailed(Exception):
    """Raise from a check to fail it with a message and, optionally, a specific fix."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


@dataclass
class CheckResult:
    ok: bool
    detail: str = ""
    fix: str = ""
    skipped: bool = False
    seconds: float = 0.0
    warning: bool = False  # passed, but with something to read (the JSON's `warn`)

    @property
    def status(self) -> str:
        """`ok`, `warn` or `fatal`: what a program reading `--json` decides on. A check
        skipped behind a failed one is `warn`: the failed one is the fatal line."""
        if self.skipped or (self.ok and self.warning):
            return "warn"
        return "ok" if self.ok else "fatal"


def warn(detail: str, fix: str = "") -> CheckResult:
    """Return from a check that passed with a caveat a person should read."""
    return CheckResult(True, detail, fix, warning=True)


@dataclass
class Check:
    name: str
    fn: Callable[[], Any]
    fix: str = ""  # shown when the check fails without a more specific hint
    timeout: float = 60.0
    needs: tuple[str, ...] = ()  # names of checks that must pass first


@dataclass
class CheckOutcome:
    check: Check
    result: CheckResult = field(default_factory=lambda: CheckResult(ok=False))


@dataclass(frozen=True)
class Registered:
    """A component's check, as `@check` registered it: called with the check's arguments (a
    run config, unless `args` says otherwise) it is the `Check` the doctor runs."""

    name: str
    fn: Callable[..., Any]
    fix: str = ""
    timeout: float = 60.0
    needs: tuple[str, ...] = ()
    args: Callable[[Any], tuple[Any, ...]] | None = None  # a run config → fn's arguments (default: the config)
    when: Callable[[Any], bool] | None = None  # whether a run config asks for this check (default: always)

    def __call__(self, *args: Any) -> Check:
        return Check(self.name, functools.partial(self.fn, *args), self.fix, self.timeout, self.needs)

    def for_config(self, cfg: Any) -> Check | None:
        """The check of run config `cfg`, or None when the config does not ask for it."""
        if self.when is not None and not self.when(cfg):
            return None
        return self(*(self.args(cfg) if self.args is not None else (cfg,)))


REGISTRY: dict[str, Registered] = {}  # name → check, in registration order


def check(
    name: str,
    *,
    fix: str = "",
    timeout: float = 60.0,
    needs: Sequence[str] = (),
    args: Callable[[Any], tuple[Any, ...]] | None = None,
    when: Callable[[Any], bool] | None = None,
) -> Callable[[Callable[..., Any]], Registered]:
    """Decorator: register a component's check in `REGISTRY` under `name`. The decorated name
    becomes the `Registered` check: `engine_check(cfg)` is the `Check` of that config."""

    def deco(fn: Callable[..., Any]) -> Registered:
        if name in REGISTRY and REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"a check named {name!r} is already registered")
        REGISTRY[name] = Registered(name, fn, fix, timeout, tuple(needs), args, when)
        return REGISTRY[name]

    return deco


def run_one(c: Check) -> CheckResult:
    """Run a check in a worker thread so a hang becomes a failure after `c.timeout` s."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = c.fn()
        except BaseException as e:  # a check must never take the doctor down
            box["error"] = e

    t0 = time.monotonic()
    worker = threading.Thread(target=target, name=f"check:{c.name}", daemon=True)
    worker.start()
    worker.join(c.timeout)
    dt = time.monotonic() - t0
    if worker.is_alive():
        return CheckResult(False, f"timed out after {c.timeout:.0f} s", c.fix, seconds=dt)
    if "error" in box:
        e = box["error"]
        if isinstance(e, CheckFailed):
            return CheckResult(False, str(e), e.fix or c.fix, seconds=dt)
        return CheckResult(False, f"{type(e).__name__}: {e}", c.fix, seconds=dt)
    value = box.get("value")
    if isinstance(value, CheckResult):
        value.seconds = dt
        if not value.ok and not value.fix:
            value.fix = c.fix
        return value
    return CheckResult(True, "" if value is None else str(value), seconds=dt)


def evaluate_checks(checks: Sequence[Check]) -> list[CheckOutcome]:
    """Run checks in order; a check whose `needs` did not all pass is skipped."""
    names = [c.name for c in checks]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate check names: {sorted(dupes)}")
    passed: dict[str, bool] = {}
    out = []
    for c in checks:
        unknown = [n for n in c.needs if n not in names]
        if unknown:
            raise ValueError(f"check {c.name!r} needs unknown check(s) {unknown}")
        blocked = [n for n in c.needs if not passed.get(n, False)]
        if blocked:
            res = CheckResult(False, f"skipped: needs {', '.join(blocked)}", skipped=True)
        else:
            res = run_one(c)
        passed[c.name] = res.ok
        out.append(CheckOutcome(c, res))
    return out


def run_checks(checks: Sequence[Check], console: Console | None = None) -> int:
    """Run, print a table, and return the process exit code (0 = all passed)."""
    console = console or Console()
    outcomes = evaluate_checks(checks)
    table = Table(title="legorl doctor", show_lines=False)
    table.add_column("", width=2)
    table.add_column("check", style="bold")
    table.add_column("result")
    table.add_column("how to fix", style="yellow")
    for o in outcomes:
        r = o.result
        mark = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fatal": "[red]✗[/]"}[r.status]
        mark = "[dim]-[/]" if r.skipped else mark
        detail = r.detail + (f" [dim]({r.seconds:.1f} s)[/]" if r.seconds >= 1 else "")
        table.add_row(mark, o.check.name, detail, r.fix if (not r.ok or r.warning) else "")
    console.print(table)
    failed = [o for o in outcomes if not o.result.ok]
    if failed:
        console.print(f"[red]{len(failed)} of {len(outcomes)} checks did not pass[/]")
        return 1
    console.print(f"[green]all {len(outcomes)} checks passed[/]")
    return 0


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 (Python's prints, a library's, a subprocess's) to stderr while
    checks run, so that stdout carries one JSON object and nothing else."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with redirect_stdout(sys.stderr):  # a replaced sys.stdout need not write to fd 1
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def checks_json(build: Callable[[], Sequence[Check]]) -> dict[str, Any]:
    """`legorl doctor --json`: the outcomes as one JSON-ready object. Never raises: a
    `build` that fails (a config that does not load) becomes one fatal check, so a program
    always reads a verdict."""
    try:
        outcomes = evaluate_checks(build())
        rows = [
            {
                "name": o.check.name,
                "status": o.result.status,
                "detail": o.result.detail,
                "fix": o.result.fix if o.result.status != "ok" else "",
                "seconds": round(o.result.seconds, 3),
            }
            for o in outcomes
        ]
    except Exception as e:  # noqa: BLE001 - the JSON is the report, whatever broke
        rows = [
            {
                "name": "checks load",
                "status": "fatal",
                "detail": f"{type(e).__name__}: {e}",
                "fix": "fix the config (see the message)",
                "seconds": 0.0,
            }
        ]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "warn", "fatal")}
    safe = counts["fatal"] == 0 and bool(rows)
    return {"safe_to_run": safe, "verdict": "YES" if safe else "NO", "counts": counts, "checks": rows}


# ---------------------------------------------------------------- checks of this package
@check("run store", fix="see the message", timeout=30, args=lambda cfg: (cfg.run.dir,))
def store_check(run_dir: Path | str | None = None) -> str:
    """The run store works here: SQLite has FTS5 and WAL, and the run directory is writable."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError as e:
        raise CheckFailed(
            f"SQLite {sqlite3.sqlite_version} lacks FTS5 ({e})",
            fix="use a Python built against SQLite with FTS5 (python.org / pyenv builds have it)",
        ) from None
    from legorl.store.run_store import RunStore

    target = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="legorl-doctor-"))
    db = target / "doctor.sqlite"
    try:
        target.mkdir(parents=True, exist_ok=True)
        with RunStore(db, durable=False) as s:
            s.log_metrics(0, {"doctor/ok": 1.0})
            mode = s._conn.execute("PRAGMA journal_mode").fetchone()[0]
    except (OSError, sqlite3.Error) as e:
        raise CheckFailed(f"cannot write a run store in {target}: {e}", fix="pick a writable --run directory") from None
    finally:
        for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
    if mode != "wal":
        raise CheckFailed(
            f"journal mode is {mode!r}, not WAL, on {target}",
            fix="put the run directory on a local filesystem (WAL needs shared memory)",
        )
    return f"SQLite {sqlite3.sqlite_version}, FTS5, WAL in {target}"


def port_check(host: str, port: int, what: str = "UI") -> Check:
    """Nothing else listens where the UI (or proxy) wants to."""

    def fn() -> str:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise CheckFailed(
                    f"{host}:{port} is not free ({e.strerror})", fix=f"pass another port for the {what}"
                ) from None
        return f"{host}:{port} is free"

    return Check(f"{what} port", fn, timeout=5)

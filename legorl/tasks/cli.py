"""`legorl tasks validate|generate|ls`.

Foreseeable mistakes (a bad task file, an unknown instance, a missing command file, no
Docker) end with one line on stderr and exit code 2; a task that fails its oracle check
makes `validate` exit 1 after listing why.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer

from legorl.tasks.loader import TaskFileError, get_task, load_tasks, shipped_tasks_dir

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Validate and generate SWE-bench-format tasks.")


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"legorl: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def _load(path: Path, split: str | None = None, repos_dir: Path | None = None, skip_invalid: bool = False) -> list:  # type: ignore[type-arg]
    skipped: list[str] | None = [] if skip_invalid else None
    try:
        tasks = load_tasks(path, split=split, repos_dir=repos_dir, skipped=skipped)
    except TaskFileError as exc:
        _fail(str(exc))
    for problem in skipped or []:
        typer.secho(f"legorl: skipped {problem}", err=True, fg=typer.colors.YELLOW)
    return tasks


def _check_backend(name: str) -> None:
    if name not in ("local", "docker"):
        _fail(f"--sandbox must be 'local' or 'docker', got {name!r}")
    if name == "docker" and shutil.which("docker") is None:
        _fail("--sandbox docker: the docker CLI is not installed (run scripts/setup_sandbox.sh)")


@app.command("ls")
def ls_cmd(
    tasks: Path = typer.Argument(None, help="Task file (default: the shipped train + heldout sets)."),
    split: Optional[str] = typer.Option(None, help="Only this split."),
) -> None:
    """List tasks: id, split, repository, number of FAIL_TO_PASS / PASS_TO_PASS tests."""
    files = [tasks] if tasks else [shipped_tasks_dir() / "train.jsonl", shipped_tasks_dir() / "heldout.jsonl"]
    for f in files:
        for t in _load(f, split):
            typer.echo(f"{t.instance_id}\t{t.split}\t{t.repo}\tf2p={len(t.FAIL_TO_PASS)}\tp2p={len(t.PASS_TO_PASS)}")


@app.command()
def validate(
    tasks: Path = typer.Argument(..., help="Task file (JSONL, SWE-bench fields + repo_path)."),
    sandbox: str = typer.Option("local", help="Sandbox backend: local or docker."),
    instance: list[str] = typer.Option([], help="Only these instance ids (repeatable)."),
    split: Optional[str] = typer.Option(None, help="Only this split."),
    limit: Optional[int] = typer.Option(None, help="Only the first N tasks."),
    concurrency: int = typer.Option(2, help="Tasks checked at once."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per task."),
    repos_dir: Optional[Path] = typer.Option(
        None, help="Directory of repositories (owner__name: clone or bundle) for rows without repo_path."
    ),
    skip_invalid: bool = typer.Option(False, help="Report invalid rows and check the rest (default: refuse the file)."),
) -> None:
    """Oracle check: the gold patch must resolve each task, the empty patch must not."""
    _check_backend(sandbox)
    selected = _load(tasks, split, repos_dir, skip_invalid)
    if instance:
        try:
            selected = [get_task(selected, i) for i in instance]
        except KeyError as exc:
            _fail(str(exc.args[0]))
    if limit is not None:
        selected = selected[:limit]
    from legorl.sandbox import open_backend
    from legorl.sandbox.base import SandboxError
    from legorl.tasks.image import TaskImages
    from legorl.tasks.validate import TaskCheck, check_tasks

    def show(res: TaskCheck) -> None:
        if as_json:
            typer.echo(json.dumps(res.to_json()))
        else:
            mark = "ok  " if res.ok else "FAIL"
            typer.echo(
                f"{mark} {res.instance_id}  ({res.seconds:.1f} s)" + "".join(f"\n     {p}" for p in res.problems)
            )

    async def run() -> list[TaskCheck]:
        backend = open_backend(sandbox)
        try:
            return await check_tasks(selected, backend, TaskImages(sandbox), concurrency=concurrency, on_result=show)
        finally:
            await backend.aclose()

    try:
        results = asyncio.run(run())
    except SandboxError as exc:
        _fail(f"sandbox backend {sandbox!r}: {exc}")
    bad = [r for r in results if not r.ok]
    typer.echo(f"{len(results) - len(bad)}/{len(results)} tasks valid on {sandbox}", err=True)
    if bad:
        raise typer.Exit(1)


@app.command()
def generate(
    out: Path = typer.Option(..., help="Output directory (train.jsonl, heldout.jsonl, repos/*.bundle)."),
    project: list[str] = typer.Option([], help="Projects to use (default: all known)."),
    count: int = typer.Option(16, help="Tasks per project."),
    python: str = typer.Option(..., help="Host python with pytest (match the base image: Debian's python3 + pytest)."),
    work: Path = typer.Option(Path("/tmp/legorl-taskgen"), help="Scratch directory (sdists, unpacked trees)."),
    seed: int = typer.Option(0, help="Seed for the order mutations are tried in."),
    max_attempts: int = typer.Option(400, help="Mutants tried per project at most."),
    sandbox: str = typer.Option(
        "none", help="Keep only tasks that pass the oracle check on this backend (local, docker) or 'none'."
    ),
) -> None:
    """Generate real tasks by injecting bugs into real projects' source distributions."""
    from legorl.tasks.generator.build import GenConfig
    from legorl.tasks.generator.build import generate as gen
    from legorl.tasks.generator.projects import PROJECTS

    names = project or list(PROJECTS)
    unknown = [n for n in names if n not in PROJECTS]
    if unknown:
        _fail(f"unknown project(s) {unknown}; known: {', '.join(PROJECTS)}")
    if shutil.which(python) is None and not Path(python).is_file():
        _fail(f"--python {python}: not found")
    if sandbox != "none":
        _check_backend(sandbox)
    cfg = GenConfig(python=python, count=count, seed=seed, max_attempts=max_attempts)
    pip = str(Path(sys.executable).with_name("pip"))
    keep = None if sandbox == "none" else (lambda rows: _oracle_filter(rows, out, sandbox))
    rows = gen([PROJECTS[n] for n in names], out, work, cfg, pip=pip if Path(pip).exists() else "pip", keep=keep)
    typer.echo(f"wrote {len(rows)} tasks to {out}")


def _oracle_filter(rows: list[dict], out: Path, sandbox: str) -> list[dict]:  # type: ignore[type-arg]
    """The rows whose tasks pass the oracle check on `sandbox` (others are reported and dropped)."""
    from legorl.sandbox import open_backend
    from legorl.tasks.image import TaskImages
    from legorl.tasks.validate import check_tasks

    tmp = out / ".candidates.jsonl"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        tasks = load_tasks(tmp)
    finally:
        tmp.unlink()

    async def run() -> list:  # type: ignore[type-arg]
        backend = open_backend(sandbox)
        try:
            return await check_tasks(tasks, backend, TaskImages(sandbox))
        finally:
            await backend.aclose()

    results = asyncio.run(run())
    ok = {r.instance_id for r in results if r.ok}
    for r in results:
        if not r.ok:
            typer.echo(f"dropped {r.instance_id}: {'; '.join(r.problems)}", err=True)
    return [row for row in rows if row["instance_id"] in ok]


if __name__ == "__main__":
    app()

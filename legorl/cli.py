"""`legorl` command line: proxy, rollout, train, eval, ui, doctor, status, tasks, images.

Each command is a thin wrapper over a function of the component that owns it; imports
are local so `legorl --help` is instant and a missing optional part fails only the
command that needs it. Foreseeable mistakes (bad config, missing file, port in use) end
with a one-line message and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from legorl.harness.registry import names_help  # the names are said once, there

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"legorl: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def friendly(fn: F) -> F:
    """Turn the errors a user can cause into one clear line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from legorl.config import ConfigError
        from legorl.harness.install import HarnessNotInstalled
        from legorl.loop.errors import RunError
        from legorl.models import ModelNotFound
        from legorl.proxy.template import TemplateError
        from legorl.tasks.loader import TaskFileError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, ModelNotFound, FileNotFoundError, TaskFileError, RunError, TemplateError) as e:
            fail(str(e))
        except HarnessNotInstalled as e:
            fail(f"{e} (scripts/setup_harnesses.sh builds the harness layers)")
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                fail(f"address already in use: {e}. Pick another --port.")
            raise
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def _add_subapps() -> None:
    for module, name, help_ in [
        ("legorl.tasks.cli", "tasks", "Validate and generate SWE-bench-format tasks."),
        ("legorl.sandbox.cli", "images", "List, build and prune cached sandbox images."),
    ]:
        try:
            sub = __import__(module, fromlist=["app"]).app
        except ImportError as e:  # a component missing from this install
            sub = typer.Typer(help=f"(unavailable: {e})")
        app.add_typer(sub, name=name, help=help_)


@app.command()
@friendly
def proxy(
    engine: str = typer.Option("hf", help="Engine kind: hf, vllm, sglang, scripted, oracle."),
    model: str = typer.Option("tiny-qwen3", help="Bundled model name or a local HF model directory."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8765),
    out: Path = typer.Option(Path("proxy-out"), help="Directory for turns.jsonl and trajectories.jsonl."),
    config: Path | None = typer.Option(None, help="TOML with \\[engine] and \\[proxy] sections."),
    token: str | None = typer.Option(None, envvar="LEGORL_TOKEN", help="Require this token (default: a fresh one)."),
    insecure: bool = typer.Option(False, help="Serve without a token (loopback only)."),
) -> None:
    """Serve the proxy standalone (OpenAI chat, Anthropic messages, OpenAI responses, Gemini generateContent)."""
    from legorl.proxy.server import run_standalone

    run_standalone(engine, model, host, port, out, config, token=token, insecure=insecure)


@app.command("engine-serve")
@friendly
def engine_serve(
    config: Path | None = typer.Option(None, help="TOML with an \\[engine] section."),
    engine: str = typer.Option("hf", help="Engine kind to serve (when no --config)."),
    model: str = typer.Option("tiny-qwen3", help="Model (when no --config)."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    api_key: str | None = typer.Option(None, envvar="LEGORL_ENGINE_API_KEY", help="Require this bearer token."),
    insecure: bool = typer.Option(False, help="Serve without a token (loopback only)."),
) -> None:
    """Serve an engine over vLLM's token-id completions API (for remote rollout workers)."""
    from legorl.engine.serve import serve_engine

    cfg = _run_config(config).engine if config is not None else None
    if cfg is None:
        from legorl.engine.registry import EngineConfig

        cfg = EngineConfig(kind=engine, model=model)
    serve_engine(cfg, host, port, api_key=api_key, insecure=insecure)


@app.command()
@friendly
def ui(
    run: Path = typer.Option(..., help="Run directory (holds run.sqlite)."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8780),
    token: str | None = typer.Option(None, envvar="LEGORL_TOKEN", help="Require this token (default: a fresh one)."),
    insecure: bool = typer.Option(False, help="Serve without a token (loopback only)."),
) -> None:
    """Serve the live web UI over a run directory."""
    from legorl.monitor.ui.server import serve_ui

    serve_ui(run, host, port, token=token, insecure=insecure)


def _run_config(config: Path | None) -> Any:
    from legorl.loop.config import RunConfig, load_run_config

    return load_run_config(config) if config is not None else RunConfig()


@app.command()
@friendly
def train(
    config: Path = typer.Argument(..., help="Run config (TOML), e.g. examples/quickstart.toml."),
    resume: bool = typer.Option(False, help="Continue from the newest checkpoint of the run directory."),
    overwrite: bool = typer.Option(
        False, help="Delete what an earlier run left in the run directory (its store, checkpoints), then start."
    ),
) -> None:
    """Train: rollouts in sandboxes through the proxy, graded, GSPO, weight sync."""
    import asyncio
    import json

    from legorl.loop.train import train as run_train

    summary = asyncio.run(run_train(_run_config(config), resume=resume, overwrite=overwrite))
    if "run_dir" in summary:  # rank 0 (followers under torchrun return their own summary)
        out = {"run_dir": summary["run_dir"], "steps": len(summary["steps"])}
        if "heldout" in summary:
            out["heldout"] = summary["heldout"]
        typer.echo(json.dumps(out, indent=1))


@app.command("eval")
@friendly
def eval_(
    config: Path = typer.Argument(..., help="Run config (TOML): harness, sandbox, tasks, engine."),
    split: str | None = typer.Option(None, help="Task split (default: run.eval_split)."),
    endpoint: str | None = typer.Option(None, help="External OpenAI/Anthropic-compatible base URL to evaluate."),
    api_key: str | None = typer.Option(None, envvar="LEGORL_EVAL_API_KEY", help="API key for --endpoint."),
    k: int | None = typer.Option(None, help="Samples per task (pass@k)."),
    limit: int | None = typer.Option(None, help="Only the first N tasks."),
    out: Path | None = typer.Option(None, help="Write the summary JSON here."),
) -> None:
    """Evaluate pass@1 / pass@k of a harness over a task split."""
    import asyncio
    import json

    from legorl.loop.evaluate import evaluate

    summary = asyncio.run(
        evaluate(_run_config(config), split=split, endpoint=endpoint, api_key=api_key, k=k, limit=limit, out=out)
    )
    typer.echo(json.dumps({k_: v for k_, v in summary.items() if k_ != "per_task"}))


@app.command()
@friendly
def rollout(
    tasks: Path = typer.Option(..., help="Task JSONL (SWE-bench format + repo_path)."),
    instance: str = typer.Option(..., help="instance_id of the task to run."),
    harness: str | None = typer.Option(None, help=names_help()),
    command_file: Path | None = typer.Option(None, help="command harness: the agent's shell script."),
    engine: str | None = typer.Option(
        None, help="Engine kind: hf, oracle, scripted, vllm, sglang (default: the config's)."
    ),
    model: str | None = typer.Option(
        None, help="Bundled model name or local HF model directory (default: the config's)."
    ),
    sandbox: str | None = typer.Option(None, help="Sandbox backend: local or docker (default: the config's)."),
    max_turns: int | None = typer.Option(None, help="Harness turn/step limit (default: the config's)."),
    config: Path | None = typer.Option(None, help="Run config: every option not given comes from it."),
    out: Path | None = typer.Option(None, help="Directory: also write turns.jsonl and trajectories.jsonl."),
) -> None:
    """Run one rollout and print its outcome as one JSON line."""
    import asyncio

    from legorl.loop.rollout_cli import run_one

    cfg = _run_config(config)
    line = asyncio.run(
        run_one(
            cfg,
            tasks,
            instance,
            harness=harness,
            command_file=command_file,
            engine=engine,
            model=model,
            sandbox=sandbox,
            max_turns=max_turns,
            out=out,
        )
    )
    typer.echo(line)


EXPORT_FORMATS = ("jsonl", "parquet", "atif")


@app.command()
@friendly
def export(
    run: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory (holds run.sqlite)."),
    format: str = typer.Option("jsonl", "--format", help="jsonl (one file), parquet or atif (a directory)."),
    out: Path = typer.Option(..., help="jsonl: the file to write; parquet, atif: the directory."),
) -> None:
    """Export a run's trajectories: JSONL, Parquet tables, or one ATIF file per trajectory (Harbor)."""
    import json
    import sqlite3

    if format not in EXPORT_FORMATS:
        fail(f"unknown --format {format!r}: use one of {', '.join(EXPORT_FORMATS)}")
    from legorl.store.run_store import RunStore
    from legorl.store.schema import db_path

    if not db_path(run).is_file():
        fail(f"{run} is not a run directory (no {db_path(run).name} in it)")
    try:
        with RunStore(run, readonly=True) as store:
            if format == "atif":
                from legorl.monitor.atif import export_atif

                result: Any = {"files": len(export_atif(store, out))}
            elif format == "parquet":
                from legorl.monitor.export import export_parquet

                result = export_parquet(store, out)
            else:
                from legorl.monitor.export import export_jsonl

                if out.is_dir():
                    fail(f"--out {out} is a directory: jsonl writes one file")
                result = {"trajectories": export_jsonl(store, out)}
    except sqlite3.DatabaseError as e:
        fail(f"{run}: cannot read the run store ({e})")
    except OSError as e:
        fail(f"cannot write --out {out}: {e.strerror or e}")
    typer.echo(json.dumps({"format": format, "out": str(out), **result}))


@app.command()
@friendly
def doctor(
    config: Path | None = typer.Option(None, help="Run config to check (default: the built-in defaults)."),
    skip: list[str] = typer.Option([], help="Check names to leave out (repeatable)."),
    json_: bool = typer.Option(
        False, "--json", help="Print one JSON object (each check's status ok/warn/fatal, detail, fix; safe_to_run)."
    ),
) -> None:
    """Pre-flight: check the whole chain (engine, template, tool calls, routing replay, learning rate,
    sandboxes, harness, window, grading, store)."""
    import json

    from legorl.loop.preflight import preflight_checks
    from legorl.monitor.doctor import checks_json, run_checks, stdout_to_stderr

    def build() -> list[Any]:
        checks = [c for c in preflight_checks(_run_config(config)) if c.name not in skip]
        for c in checks:
            c.needs = tuple(n for n in c.needs if n not in skip)
        return checks

    if not json_:
        raise typer.Exit(run_checks(build()))
    with stdout_to_stderr():  # stdout carries the JSON alone, whatever a check prints
        report = checks_json(build)
    typer.echo(json.dumps({"config": str(config) if config else None, **report}, indent=1))
    raise typer.Exit(0 if report["safe_to_run"] else 1)


@app.command()
def status(
    run: Path | None = typer.Argument(
        None, metavar="[RUN_DIR]", help="Run directory (holds run.sqlite; default: the default config's run.dir)."
    ),
    json_: bool = typer.Option(False, "--json", help="Print one JSON object."),
    stall_minutes: float | None = typer.Option(
        None, help="No store write for this long while alive is a stall (default: max(10, 3 steps))."
    ),
) -> None:
    """Which run is alive, how far it has got, and which known failure signature it matches (read-only)."""
    import json

    from legorl.ops.status import StatusError, render
    from legorl.ops.status import status as run_status

    try:
        report = run_status(
            run or _run_config(None).run.dir, stall_after_s=None if stall_minutes is None else stall_minutes * 60
        )
    except StatusError as e:
        fail(str(e))
    typer.echo(json.dumps(report, indent=1) if json_ else render(report))


def main() -> None:
    _add_subapps()
    app(prog_name="legorl")


if __name__ == "__main__":
    sys.exit(main())

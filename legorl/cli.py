"""`legorl` command line: proxy, rollout, train, eval, ui, doctor, tasks, images.

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
        from legorl.models import ModelNotFound

        try:
            return fn(*args, **kwargs)
        except (ConfigError, ModelNotFound, FileNotFoundError) as e:
            fail(str(e))
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
    config: Path | None = typer.Option(None, help="TOML with [engine] and [proxy] sections."),
) -> None:
    """Serve the proxy standalone (OpenAI chat, Anthropic messages, OpenAI responses)."""
    from legorl.proxy.server import run_standalone

    run_standalone(engine, model, host, port, out, config)


@app.command()
@friendly
def ui(
    run: Path = typer.Option(..., help="Run directory (holds run.sqlite)."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8780),
) -> None:
    """Serve the live web UI over a run directory."""
    from legorl.monitor.ui.server import serve_ui

    serve_ui(run, host, port)


def main() -> None:
    _add_subapps()
    app(prog_name="legorl")


if __name__ == "__main__":
    sys.exit(main())

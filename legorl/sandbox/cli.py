"""`legorl images ls | build | prune | stats`: look after the image cache from a shell.

`app` is a Typer sub-app (the main CLI mounts it as `images`); `python -m
legorl.sandbox.cli` runs it on its own, which is what scripts/setup_sandbox.sh does.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path
from typing import Optional

import typer

from legorl.sandbox.base import SandboxError
from legorl.sandbox.docker_images import remove_docker_images
from legorl.sandbox.images import KINDS, EnvSpec, ImageNotFound, ImageStore
from legorl.sandbox.layers import ensure_base, ensure_env

app = typer.Typer(help="Cached sandbox images: base -> env -> task layers.", no_args_is_help=True)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(1)


@app.command("ls")
def ls_cmd(as_json: bool = typer.Option(False, "--json", help="One JSON object per layer.")) -> None:
    """List cached layers."""
    store = ImageStore()
    refs = store.ls()
    if as_json:
        for r in refs:
            typer.echo(
                json.dumps(
                    {
                        "key": r.key,
                        "kind": r.kind,
                        "parent": r.parent,
                        **{k: r.meta.get(k) for k in ("size_bytes", "build_s", "created", "commit", "source_commit")},
                    }
                )
            )
        return
    if not refs:
        typer.echo(f"no images in {store.layers} (build the base with `legorl images build`)")
        return
    typer.echo(f"{'KEY':<18}{'KIND':<6}{'PARENT':<18}{'SIZE':>10}{'BUILD':>9}  CREATED")
    for r in refs:
        created = datetime.datetime.fromtimestamp(r.meta.get("created", 0)).strftime("%Y-%m-%d %H:%M")
        typer.echo(
            f"{r.key[:16]:<18}{r.kind:<6}{(r.parent or '-')[:16]:<18}"
            f"{_human(r.meta.get('size_bytes', 0)):>10}{r.meta.get('build_s', 0):>8.1f}s  {created}"
        )


@app.command()
def build(
    suite: Optional[str] = typer.Option(None, help="Debian suite of the base (default: the host's)."),
    mirror: Optional[str] = typer.Option(None, help="Debian mirror (default: the one apt uses here)."),
    requirements: Optional[Path] = typer.Option(None, help="requirements.txt for an env layer on the base."),
    wheels: list[Path] = typer.Option([], help="Dir of wheels/sdists for the env layer (repeatable)."),
    download: bool = typer.Option(False, help="pip download the requirements on the host first."),
    docker: bool = typer.Option(False, "--docker", help="Also make (or check) the Docker image."),
) -> None:
    """Build the base image (and an env layer from --requirements); cached after the first time."""
    store = ImageStore()

    async def run() -> None:
        ref = await ensure_base(store, suite=suite, mirror=mirror)
        typer.echo(
            f"base {ref.key} ({_human(ref.meta.get('size_bytes', 0))}, built in {ref.meta.get('build_s', 0):.0f} s)"
        )
        if requirements is not None:
            if not requirements.is_file():
                _fail(f"--requirements {requirements} is not a file")
            reqs = tuple(
                line.strip()
                for line in requirements.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")
            )
            ref = await ensure_env(
                store, ref, EnvSpec(pip=reqs, wheel_dirs=tuple(str(w) for w in wheels), download=download)
            )
            typer.echo(f"env {ref.key}")
        if docker:
            from legorl.sandbox.docker_images import ensure_docker_image

            typer.echo(f"docker {await ensure_docker_image(store, ref.key)}")

    try:
        asyncio.run(run())
    except (SandboxError, ValueError, RuntimeError, OSError) as e:
        _fail(str(e))


@app.command()
def prune(
    keys: Optional[list[str]] = typer.Argument(None, help="Layer keys (or unique prefixes) to remove."),
    older_than_days: Optional[float] = typer.Option(None, help="Remove layers created longer ago."),
    kind: list[str] = typer.Option([], help=f"Only layers of these kinds ({', '.join(KINDS)})."),
    all_: bool = typer.Option(False, "--all", help="Remove every layer."),
) -> None:
    """Remove layers (and the layers built on them, and their Docker images)."""
    if not keys and older_than_days is None and not all_:
        _fail("say what to prune: KEYS, --older-than-days N or --all")
    bad = [k for k in kind if k not in KINDS]
    if bad:
        _fail(f"--kind {bad[0]!r}: expected one of {', '.join(KINDS)}")
    store = ImageStore()
    try:
        removed = store.prune(
            keys=keys or None,
            older_than_s=None if older_than_days is None else older_than_days * 86400,
            kinds=tuple(kind) or KINDS,
            on_removed=remove_docker_images,
        )
    except ImageNotFound as e:
        _fail(str(e))
    typer.echo(f"removed {len(removed)} layer(s)" + "".join(f"\n  {k}" for k in removed))


@app.command()
def stats() -> None:
    """Cache hits, misses and build times, as JSON."""
    typer.echo(json.dumps(ImageStore().stats(), indent=1))


if __name__ == "__main__":
    app()

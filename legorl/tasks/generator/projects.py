"""The real projects tasks are generated from, and how to fetch and test each.

Chosen because their PyPI source distributions ship their test suites, they are pure
Python, their tests need nothing beyond the standard library and pytest (what the base
image has), and a test file runs in well under a second, so grading stays cheap.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ProjectSpec:
    name: str  # the PyPI distribution name
    version: str
    repo: str  # upstream "owner/name", the SWE-bench `repo` field
    sources: tuple[str, ...]  # repository-relative files to inject bugs into
    tests: tuple[str, ...]  # pytest arguments selecting the whole suite
    pytest_options: tuple[str, ...] = ()  # e.g. ("-o", "addopts=") for coverage options we lack
    drop: tuple[str, ...] = ()  # paths removed from the unpacked sdist (docs, build metadata)
    deselect: tuple[str, ...] = field(default=())  # tests that must never be F2P/P2P (flaky, slow)

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.version}"


PROJECTS: dict[str, ProjectSpec] = {
    "toolz": ProjectSpec(
        name="toolz",
        version="1.2.0",
        repo="pytoolz/toolz",
        sources=("toolz/itertoolz.py", "toolz/functoolz.py", "toolz/dicttoolz.py", "toolz/recipes.py"),
        tests=("toolz/tests",),
        drop=("toolz.egg-info", "PKG-INFO"),
    ),
    "inflection": ProjectSpec(
        name="inflection",
        version="0.5.1",
        repo="jpvanhal/inflection",
        sources=("inflection/__init__.py",),
        tests=("test_inflection.py",),
        drop=("inflection.egg-info", "PKG-INFO", "docs"),
    ),
    "parse": ProjectSpec(
        name="parse",
        version="1.22.4",
        repo="r1chardj0n3s/parse",
        sources=("parse/__init__.py",),
        tests=("tests",),
        pytest_options=("-o", "addopts="),  # the project's addopts need pytest-cov
        drop=("parse.egg-info", "PKG-INFO"),
    ),
    "tabulate": ProjectSpec(
        name="tabulate",
        version="0.10.0",
        repo="astanin/python-tabulate",
        sources=("tabulate/__init__.py",),
        tests=("test",),
        drop=("tabulate.egg-info", "PKG-INFO", "benchmark"),
    ),
}


def download_sdist(spec: ProjectSpec, dest: Path, pip: str = "pip") -> Path:
    """Fetch the source distribution with pip (the ordinary client), return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [pip, "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(dest), f"{spec.name}=={spec.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {spec.name}=={spec.version} failed:\n{proc.stderr[-2000:]}")
    norm = spec.name.replace("-", "_").lower()
    for f in dest.iterdir():
        base = f.name.lower().replace("-", "_")
        if base.startswith(f"{norm}_{spec.version}") and f.name.endswith((".tar.gz", ".zip")):
            return f
    raise RuntimeError(f"pip download {spec.name}=={spec.version} produced no sdist in {dest}")


def unpack_sdist(spec: ProjectSpec, sdist: Path, dest: Path) -> Path:
    """Unpack to `dest/<slug>` (its single top directory), minus the spec's `drop` paths."""
    out = dest / spec.slug
    if out.exists():
        shutil.rmtree(out)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{spec.slug}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp, filter="data")
    (top,) = list(tmp.iterdir())
    top.rename(out)
    tmp.rmdir()
    for rel in spec.drop:
        p = out / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    for cache in list(out.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    return out

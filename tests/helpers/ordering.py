"""The order the workers take the test files in, from the markers and measured durations.

`scripts/test.sh` runs the suite on two workers, a whole file each at a time (`--dist loadfile`,
in collection order: `--no-loadscope-reorder`). The suite's wall time is set by when its longest
files start: begun last, the learning runs alone outlast everything else. So the files are
handed out marked ones first (`slow`, `harness`, `docker`: every long file carries one), and
within that, longest first by `tests/durations.json`: seconds per file, recorded by a run with
`--record-durations tests/durations.json` (tests/conftest.py adds the option).

A figure is replaced only by a run of its whole file; a run of part of one (`-m`, `-k`, a
test id, a skip) can only raise it, so a fast-lane run never hides a slow file's time.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

HEAVY = frozenset({"slow", "harness", "docker"})


def file_of(item: pytest.Item, root: Path) -> str:
    return item.path.relative_to(root).as_posix()


def load(path: Path) -> dict[str, float]:
    return json.loads(path.read_text()) if path.is_file() else {}


def order(items: list[pytest.Item], seconds: Mapping[str, float], root: Path) -> list[pytest.Item]:
    """`items` file by file (a file's own tests keep their order): files with a heavy marker
    first, then the longest measured first, then as collected."""
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[file_of(item, root)].append(item)
    heavy = {f: any(HEAVY & {m.name for m in it.iter_markers()} for it in its) for f, its in by_file.items()}
    first = {f: i for i, f in enumerate(by_file)}
    files = sorted(by_file, key=lambda f: (not heavy[f], -seconds.get(f, 0.0), first[f]))
    return [item for f in files for item in by_file[f]]


def merged(old: Mapping[str, float], run: Mapping[str, float], partial: Iterable[str], root: Path) -> dict[str, float]:
    """`old` updated with one run's per-file totals: a file run whole takes its new figure, a
    file run in part keeps the larger; files no longer in the checkout drop out."""
    partial = set(partial)
    out = dict(old)
    for f, s in run.items():
        out[f] = max(s, out.get(f, 0.0)) if f in partial else s
    return {f: round(s, 1) for f, s in sorted(out.items()) if (root / f).is_file()}


class Recorder:
    """Sums each file's setup, call and teardown seconds as the reports arrive (on the
    controller: xdist's workers send theirs there) and writes them merged at the end."""

    def __init__(self, path: Path, root: Path, config: pytest.Config) -> None:
        self.path, self.root = path, root
        self.seconds: dict[str, float] = defaultdict(float)
        self.partial: set[str] = set()
        # what leaves part of a file out (the controller never sees xdist's deselections)
        o = config.option
        self.every_file_partial = bool(o.markexpr or o.keyword or any("::" in a for a in config.args))

    def report(self, report: pytest.TestReport) -> None:
        f = report.nodeid.split("::", 1)[0]
        self.seconds[f] += report.duration
        if report.skipped:
            self.partial.add(f)

    def write(self) -> None:
        if not self.seconds:
            return
        partial = set(self.seconds) if self.every_file_partial else self.partial
        out = merged(load(self.path), self.seconds, partial, self.root)
        self.path.write_text(json.dumps(out, indent=1) + "\n")

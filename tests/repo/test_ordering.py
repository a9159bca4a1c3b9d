"""The workers' file order (tests/helpers/ordering.py): marked files first, longest measured
first within, a file's tests together; and a partial run never lowers a recorded figure."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.ordering import merged, order


@dataclass
class Mark:
    name: str


@dataclass
class Item:
    path: Path
    name: str
    marks: list[str] = field(default_factory=list)

    def iter_markers(self) -> list[Mark]:
        return [Mark(m) for m in self.marks]


def test_marked_files_first_then_the_longest_measured(tmp_path: Path) -> None:
    a, b, c, d = (tmp_path / "tests" / f"test_{x}.py" for x in "abcd")
    items: list[Any] = [
        Item(a, "a1"),
        Item(b, "b1"),
        Item(c, "c1"),
        Item(b, "b2", ["slow"]),
        Item(d, "d1", ["docker"]),
        Item(a, "a2"),
    ]
    seconds = {"tests/test_a.py": 50.0, "tests/test_d.py": 9.0, "tests/test_b.py": 1.0}
    assert [i.name for i in order(items, seconds, tmp_path)] == ["d1", "b1", "b2", "a1", "a2", "c1"]


def test_a_partial_run_only_raises_a_figure(tmp_path: Path) -> None:
    for name in ("whole", "part", "new"):
        (tmp_path / f"{name}.py").touch()
    old = {"whole.py": 100.0, "part.py": 100.0, "gone.py": 5.0}
    run = {"whole.py": 20.0, "part.py": 20.0, "new.py": 3.04}
    assert merged(old, run, {"part.py"}, tmp_path) == {"new.py": 3.0, "part.py": 100.0, "whole.py": 20.0}

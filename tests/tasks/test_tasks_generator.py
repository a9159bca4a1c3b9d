"""Task generation: mutations, hiding failing tests, issue text, and a whole small run
(offline, on a synthetic project) down to a loadable task file with time-safe commits."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from legorl.tasks.generator.build import GenConfig, find_bugs, write_project_tasks
from legorl.tasks.generator.hide import hide_tests
from legorl.tasks.generator.mutate import mutations_of
from legorl.tasks.generator.problem import problem_statement
from legorl.tasks.generator.projects import ProjectSpec
from legorl.tasks.loader import load_tasks

SOURCE = '''\
"""Docstring: 1 + 1 is not mutated."""
LIMIT = 10


def clamp(x, lo=0, hi=LIMIT):
    """Clamp x."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def window(seq, n):
    out = []
    for i in range(len(seq) - n + 1):
        out.append(tuple(seq[i:i + n]))
    return out


def both(a, b):
    return bool(a) and not b


def total(xs):
    t = 0
    for x in xs:
        t += x
    return divmod(t, 2) if xs is None else t


class Box:
    def same(self, other):
        return self is other or True
'''


def test_every_kind_is_found_and_yields_valid_python() -> None:
    muts = mutations_of("m.py", SOURCE.encode())
    kinds = {m.kind for m in muts}
    assert kinds == {
        "op_change",
        "cmp_change",
        "bool_change",
        "off_by_one",
        "const_flip",
        "drop_not",
        "swap_args",
        "remove_cond",
    }
    for m in muts:
        new = m.apply(SOURCE.encode())
        ast.parse(new)  # every mutant still parses
        assert new != SOURCE.encode()
        assert b"Docstring: 1 + 1" in new and b"LIMIT = 10" in new  # module level untouched
    assert all(m.function for m in muts)
    # Small, human-looking edits: one token or one statement.
    by = {(m.kind, m.original, m.replacement) for m in muts}
    assert ("cmp_change", b"<", b"<=") in by
    assert ("op_change", b"+=", b"-=") in by
    assert ("bool_change", b"and", b"or") in by
    assert ("drop_not", b"not b", b"b") in by
    assert ("swap_args", b"t, 2", b"2, t") in by
    assert ("const_flip", b"True", b"False") in by
    assert any(m.kind == "remove_cond" and m.original.startswith(b"    if x < lo:") for m in muts)
    assert len({m.key for m in muts}) == len(muts)


TESTS = """\
import pytest


def test_a():
    assert True


@pytest.mark.parametrize("x", [1, 2])
def test_b(x):
    assert x


class TestC:
    def test_c1(self):
        pass

    def test_c2(self):
        pass


class TestD:
    def test_d(self):
        pass
"""


def test_hide_tests_cuts_definitions_with_decorators() -> None:
    out = hide_tests(TESTS, ["t.py::test_b[1]", "t.py::TestC::test_c1", "t.py::TestD::test_d"])
    assert out is not None
    assert "def test_b" not in out and "parametrize" not in out
    assert "def test_c1" not in out and "def test_c2" in out
    assert "class TestD" not in out  # nothing left of it
    assert "def test_a" in out
    ast.parse(out)
    assert hide_tests(TESTS, ["t.py::test_missing"]) is None


def test_problem_statement_names_tests_not_the_fix() -> None:
    text = problem_statement(
        "proj",
        ["tests/test_m.py::test_window[2]", "tests/test_m.py::test_clamp"],
        {
            "tests/test_m.py::test_clamp": "tests/test_m.py:3: in test_clamp\n    assert clamp(5) == 5\nE   assert 4 "
            "== 5"
        },
        "seed",
    )
    assert "`tests/test_m.py::test_clamp`" in text and "E   assert 4 == 5" in text
    assert "`window`" in text and "`clamp`" in text
    assert "m.py" not in text.replace("test_m.py", "")


PROJECT_TESTS = """\
from mini import clamp, window, both


def test_clamp_low():
    assert clamp(-5) == 0


def test_clamp_high():
    assert clamp(50) == 10


def test_clamp_mid():
    assert clamp(5) == 5


def test_window():
    assert window([1, 2, 3], 2) == [(1, 2), (2, 3)]


def test_both():
    assert both(1, 0) is True
    assert both(1, 1) is False
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_small_generation_end_to_end(tmp_path: Path) -> None:
    tree = tmp_path / "mini-0.1"
    (tree / "tests").mkdir(parents=True)
    (tree / "mini.py").write_text(SOURCE)
    (tree / "tests" / "test_mini.py").write_text(PROJECT_TESTS)
    spec = ProjectSpec(name="mini", version="0.1", repo="example/mini", sources=("mini.py",), tests=("tests",))
    cfg = GenConfig(python=sys.executable, count=3, max_attempts=40, log=False)
    accepted = find_bugs(spec, tree, cfg)
    assert len(accepted) == 3
    assert (tree / "mini.py").read_text() == SOURCE  # restored after every mutant
    out = tmp_path / "out"
    rows = write_project_tasks(spec, tree, accepted, out, cfg)
    bundle = out / "repos" / "mini-0.1.bundle"
    assert bundle.is_file()
    jsonl = out / "all.jsonl"
    jsonl.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    tasks = load_tasks(jsonl)
    assert len(tasks) == 3
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--mirror", str(bundle), str(clone)], check=True)
    for t in tasks:
        # Each base commit has no parents (nothing in history leads to the fix) and its
        # tree has the bug but not the failing tests; test_patch puts them back.
        assert git(clone, "rev-list", "--parents", "-n1", t.base_commit).split() == [t.base_commit]
        src = git(clone, "show", f"{t.base_commit}:mini.py")
        assert src != SOURCE
        test_src = git(clone, "show", f"{t.base_commit}:tests/test_mini.py")
        for tid in t.FAIL_TO_PASS:
            assert f"def {tid.split('::')[-1]}(" not in test_src
            assert f"def {tid.split('::')[-1]}(" in t.test_patch
        for tid in t.PASS_TO_PASS:
            assert f"def {tid.split('::')[-1]}(" in test_src
        assert "mini.py" in t.patch and "tests/" not in t.patch
        assert t.test_cmd == "pytest tests/test_mini.py"

"""Grading's structure: five stages, each a module entered once, in order, from `grade_in`;
and no function in `legorl/verify/` over ~80 lines (the in-sandbox supervisors included),
so the hub it was cannot grow back unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERIFY = Path(__file__).resolve().parents[1] / "legorl" / "verify"
MAX_LINES = 80
# The one entry path of a grading attempt: (stage function, the module that defines it).
STAGES = [
    ("select", "selection"),
    ("prepare", "prepare"),
    ("apply", "apply"),
    ("execute", "execute"),
    ("judge_run", "judge"),
]


def _tree(name: str) -> ast.Module:
    return ast.parse((VERIFY / f"{name}.py").read_text(encoding="utf-8"))


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no top-level function {name}")


def _called(node: ast.AST) -> list[str]:
    """Names called in `node`, in source order."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return [c.func.id for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]  # type: ignore[attr-defined]


def test_grade_in_enters_each_stage_once_in_order() -> None:
    grade = _tree("grade")
    imported = {a.name: n.module for n in grade.body if isinstance(n, ast.ImportFrom) for a in n.names}
    for fn, module in STAGES:
        assert imported.get(fn) == f"legorl.verify.{module}", f"grade.py must take stage {fn} from {module}.py"
        _function(_tree(module), fn)  # the stage is its module's own function
    calls = [c for c in _called(_function(grade, "grade_in")) if c in dict(STAGES)]
    assert calls == [fn for fn, _ in STAGES], f"grade_in's stages, in order: {calls}"


def test_no_stage_is_entered_from_anywhere_but_grade_in() -> None:
    entries = {fn for fn, _ in STAGES}
    for path in sorted(VERIFY.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (path.name, node.name) != (
                "grade.py",
                "grade_in",
            ):
                called = set(_called(node)) & entries
                assert not called, f"{path.name}:{node.name} enters stage {sorted(called)}"


def _long_functions(source: str, limit: int) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1  # nested functions and classes count too
            if lines > limit:
                out.append(f"{node.name} ({lines} lines, line {node.lineno})")
    return out


@pytest.mark.parametrize("path", sorted(VERIFY.glob("*.py")), ids=lambda p: p.name)
def test_no_function_in_verify_is_over_80_lines(path: Path) -> None:
    assert not _long_functions(path.read_text(encoding="utf-8"), MAX_LINES)


def test_the_line_check_sees_a_long_function() -> None:
    def source(body_lines: int) -> str:
        return "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(body_lines))

    assert _long_functions(source(MAX_LINES), MAX_LINES) == [f"f ({MAX_LINES + 1} lines, line 1)"]
    assert _long_functions(source(MAX_LINES - 1), MAX_LINES) == []

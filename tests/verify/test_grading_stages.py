"""Grading's structure: five stages, each a module entered once, in order, from `grade_in`;
and no function in `legorl/verify/` over ~80 lines (the in-sandbox supervisors included),
so the hub it was cannot grow back unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from legorl.types import Status
from tests.helpers.paths import ROOT
from tests.helpers.tasks_util import backend_and_images, pick_task

VERIFY = ROOT / "legorl" / "verify"
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


@pytest.mark.parametrize("path", sorted(VERIFY.rglob("*.py")), ids=lambda p: p.name)
def test_no_function_in_verify_is_over_80_lines(path: Path) -> None:
    long = _long_functions(path.read_text(encoding="utf-8"), MAX_LINES)
    assert not long, f"{path.name}: {long}"


def test_the_line_check_sees_a_long_function() -> None:
    def source(body_lines: int) -> str:
        return "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(body_lines))

    assert _long_functions(source(MAX_LINES), MAX_LINES) == [f"f ({MAX_LINES + 1} lines, line 1)"]
    assert _long_functions(source(MAX_LINES - 1), MAX_LINES) == []


async def test_a_real_grade_enters_the_stages_once_in_order_and_an_early_verdict_stops_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gold fix runs all five stages, once each; a diff that does not apply stops at apply."""
    from legorl.verify import grade as grade_mod

    entered: list[str] = []
    for fn, _ in STAGES:
        real = getattr(grade_mod, fn)

        def spy(*args: object, _real: object = real, _fn: str = fn) -> object:
            entered.append(_fn)
            return _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(grade_mod, fn, spy)
    task = pick_task()
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        gold = await grade_mod.grade(task, task.patch, backend, image)
        assert gold.status is Status.RESOLVED and entered == [fn for fn, _ in STAGES], (gold.status, entered)
        entered.clear()
        broken = await grade_mod.grade(task, task.patch.replace("\n-", "\n-nonexistent line ", 1), backend, image)
    assert "patch_apply_failed" in broken.flags and entered == ["select", "prepare", "apply"], (broken.flags, entered)


# Package code that, at import, finds the recorder and changes its hooks: on the class of
# the part of the run that defines them, or by a new override on the recorder's own class.
RECORDER_EDITS = {
    "replaced_on_its_part": (
        "for _c in type(_rec).__mro__:\n"
        "    if 'pytest_runtest_teardown' in vars(_c):\n"
        "        _old = vars(_c)['pytest_runtest_teardown']\n"
        "        setattr(_c, 'pytest_runtest_teardown', lambda *a, **k: _old(*a, **k))\n"
        "        break\n"
    ),
    "overridden_on_the_recorder": "type(_rec).pytest_runtest_teardown = lambda *a, **k: None\n",
}


@pytest.mark.parametrize("edit", sorted(RECORDER_EDITS))
def test_a_changed_recorder_hook_is_reported_whichever_of_its_classes_holds_it(edit: str, tmp_path: Path) -> None:
    """The recorder's hooks live on one class per part of a run; a hook replaced on any of
    them, or overridden on the recorder's own class, is in the end record's `changed`."""
    import os
    import subprocess
    import sys

    from legorl.verify.pytest_plan import parse_summary, plan_run

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    finder = "import gc as _gc\n_rec = next(o for o in _gc.get_objects() if type(o).__name__ == '_Recorder')\n"
    (repo / "pkg" / "__init__.py").write_text(finder + RECORDER_EDITS[edit])
    (repo / "tests" / "test_a.py").write_text("import pkg\n\n\ndef test_a():\n    assert pkg\n")
    plan = plan_run(str(repo), ["tests/test_a.py"], python=sys.executable, tmp_root=str(tmp_path))
    for path, text in plan.files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_text(text)
    proc = subprocess.run(plan.command, shell=True, capture_output=True, text=True, timeout=120)
    summary, tags = parse_summary(proc.stdout, plan.nonce)
    assert summary is not None and tags == 1, proc.stderr[-2000:]
    end = next(r for r in summary["records"] if r.get("k") == "end")
    assert "recorder.pytest_runtest_teardown" in end["changed"], end["changed"]

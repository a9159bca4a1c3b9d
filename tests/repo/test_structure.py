"""The tests mirror the package: a test module sits in the folder named after the `legorl`
subpackage it tests (tests/proxy/ for legorl/proxy/, tests/monitor/ui/ for legorl/monitor/ui/)
or in one of a few documented cross-cutting folders; what modules share lives in
tests/helpers/; and no module imports a test module or a conftest (a test that imports another
runs that module's fixtures and tests twice, and ties their layouts together).

Read from the files with `ast`, never by importing them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.paths import ROOT

TESTS = ROOT / "tests"
PACKAGE = ROOT / "legorl"
# Folders that are not a legorl subpackage, each with why (docs/architecture.md, "Tests").
CROSS_CUTTING = {
    "core": "legorl's top-level modules (legorl/*.py: trajectory, models, rollout, the CLI)",
    "repo": "the checkout as a whole: the import graph, where code runs, the wheel, this layout",
    "redteam": "attacks on grading and the infrastructure, across packages",
    "bench": "the benchmarks' own tools: mirrors the checkout's bench/",
    "plugin": "the agent plugin: mirrors the checkout's plugin/",
}
# Not Python modules of the suite: data the tests read.
DATA = {"fixtures"}
SPECIAL = {"__init__.py", "conftest.py"}


def folders() -> Iterator[Path]:
    for d in sorted(p for p in TESTS.rglob("*") if p.is_dir()):
        rel = d.relative_to(TESTS)
        if rel.parts[0] in DATA or "__pycache__" in rel.parts:
            continue
        yield d


def modules() -> Iterator[Path]:
    for d in [TESTS, *folders()]:
        yield from sorted(d.glob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_test_module_sits_in_a_mirrored_folder() -> None:
    wrong = []
    for path in modules():
        if not path.name.startswith("test_"):
            continue
        parts = path.relative_to(TESTS).parts[:-1]
        if not parts:
            wrong.append(f"{rel(path)}: directly in tests/ (move it to tests/<subpackage>/)")
        elif parts[0] in CROSS_CUTTING:
            if len(parts) > 1:
                wrong.append(f"{rel(path)}: a cross-cutting folder has no sub-folders")
        elif parts[0] == "helpers":
            wrong.append(f"{rel(path)}: tests/helpers/ holds helpers, never tests")
        elif not (PACKAGE.joinpath(*parts) / "__init__.py").is_file():
            wrong.append(f"{rel(path)}: legorl/{'/'.join(parts)}/ is not a subpackage (nor a cross-cutting folder)")
    assert not wrong, "\n".join(wrong)


def test_the_cross_cutting_folders_are_few_and_mirror_what_they_say() -> None:
    assert len(CROSS_CUTTING) <= 5  # a new one is a decision: add it here, with why, and to the docs
    for name in ("bench", "plugin"):
        assert (ROOT / name).is_dir(), f"tests/{name}/ mirrors {name}/, which is gone"
    for name in CROSS_CUTTING:
        assert not (PACKAGE / name / "__init__.py").is_file(), f"{name} is a subpackage now: it mirrors legorl/{name}/"


def test_every_folder_is_a_package() -> None:
    """So each module's dotted name is its own (`tests.proxy.test_render`): two folders may hold
    the same file name under pytest's importlib import mode (pyproject.toml)."""
    missing = [rel(d) for d in [TESTS, *folders()] if not (d / "__init__.py").is_file()]
    assert not missing, f"no __init__.py in {missing}"


def test_helpers_live_in_tests_helpers() -> None:
    stray = [
        rel(p)
        for p in modules()
        if not p.name.startswith("test_") and p.name not in SPECIAL and p.parent != TESTS / "helpers"
    ]
    assert not stray, f"helper modules outside tests/helpers/: {stray}"


def imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            yield node.lineno, base
            if not node.module:  # `from . import test_x`
                yield from ((node.lineno, base + a.name) for a in node.names)


def of_the_suite(name: str) -> bool:
    """A test module or a conftest of this suite: `tests.<...>.test_x`, a bare `test_x` or
    `conftest` (the old flat layout's way), or a relative one; never `legorl.verify.test_command`."""
    last = name.rsplit(".", 1)[-1]
    ours = name.startswith(("tests.", ".")) or "." not in name
    return ours and (last.startswith("test_") or last == "conftest")


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    bad = []
    for path in modules():
        for line, name in imported(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if of_the_suite(name):
                bad.append(f"{rel(path)}:{line}: imports {name} (move what it shares to tests/helpers/)")
    assert not bad, "\n".join(bad)


def test_the_import_check_catches_each_form() -> None:
    """The import check reads what it must: absolute, dotted and relative imports alike."""
    src = (
        "import conftest\nfrom tests.proxy.test_render import x\nfrom . import test_a\nfrom .helpers import y\n"
        "from test_loop_worker import AGENT\nfrom legorl.verify.test_command import z\nfrom tests.helpers import w\n"
    )
    flagged = [n for _, n in imported(ast.parse(src)) if of_the_suite(n)]
    assert flagged == ["conftest", "tests.proxy.test_render", ".test_a", "test_loop_worker"]

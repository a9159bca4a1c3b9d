"""Where code runs is visible in its path: `in_sandbox/` (inside a sandbox) and `in_driver/`
(in a harness layer's own interpreter) hold every program that runs outside the host's
interpreter; the host reads them as files, never imports them, and package data ships them."""

from __future__ import annotations

import ast
import fnmatch
import sys
import tomllib
from pathlib import Path

from legorl.harness import openhands, openhands_warm, warm_mini
from legorl.sandbox import docker, local
from legorl.verify import native, pytest_plan
from tests.helpers.paths import ROOT

PKG = ROOT / "legorl"
PLACES = ("in_sandbox", "in_driver")


def _programs() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if set(p.relative_to(PKG).parts[:-1]) & set(PLACES))


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def test_every_program_the_host_reads_by_path_sits_where_it_runs() -> None:
    assert Path(local.ZYGOTE_PATH).parent.name == "in_sandbox"
    assert docker.IN_SANDBOX.name == "in_sandbox" and (docker.IN_SANDBOX / "init.py").is_file()
    assert openhands.DRIVER_SOURCE.parent.name == "in_sandbox"
    assert warm_mini.DRIVER.parents[1].name == "in_driver" and warm_mini.DRIVER.is_file()
    assert openhands_warm.DRIVER.parents[1].name == "in_driver" and openhands_warm.DRIVER.is_file()
    for supervisor in (pytest_plan.SUPERVISOR, native.NATIVE_SUPERVISOR):  # the grading runs
        assert supervisor.parent == pytest_plan.IN_SANDBOX and supervisor.is_file(), supervisor
    assert pytest_plan.IN_SANDBOX.name == "in_sandbox"


def test_programs_are_not_packages_and_never_import_legorl() -> None:
    programs = _programs()
    assert len(programs) >= 19, programs  # 4 in the sandbox's pid 1 tree, 1 + 5 of the harnesses, 10 graders'
    for p in programs:
        assert p.name != "__init__.py", p
        assert not [n for n in _imports(p) if n.split(".")[0] == "legorl"], p


def test_the_host_never_imports_a_program() -> None:
    for p in PKG.rglob("*.py"):
        if set(p.relative_to(PKG).parts[:-1]) & set(PLACES):
            continue
        bad = [n for n in _imports(p) if set(n.split(".")) & set(PLACES)]
        assert not bad, f"{p.relative_to(ROOT)} imports {bad}: read the program by path instead"


def test_package_data_ships_every_program() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["legorl"]
    for p in _programs():
        rel = p.relative_to(PKG).as_posix()
        assert any(fnmatch.fnmatchcase(rel, g) and rel.count("/") == g.count("/") for g in globs), rel


def test_the_grading_supervisor_is_small_stdlib_modules_imported_by_name() -> None:
    """Both mains import the supervisor's modules by their own names (never a file loaded under
    another name), those names cannot shadow a task's modules, every file stays small, and each
    is copied into the grading sandbox and watched by the snapshot as pytest's machinery is."""
    folder = pytest_plan.IN_SANDBOX
    files = sorted(folder.glob("*.py"))
    ours = {p.stem for p in files if p.stem.startswith("lg_")}
    assert {p.stem for p in files} - ours == {"pytest_main", "native_main"}, files
    watched = ast.literal_eval(_assigned(folder / "lg_snapshot.py", "SUPERVISOR_MODULES"))
    assert set(watched) == ours, "lg_snapshot.SUPERVISOR_MODULES must name every lg_*.py"
    for p in files:
        text = p.read_text()
        assert len(text.splitlines()) <= 400, f"{p.name}: {len(text.splitlines())} lines (keep each part small)"
        assert "spec_from_file_location" not in text and "module_from_spec" not in text, p.name
        for name in _imports(p):
            top = name.split(".")[0]
            assert top in ours or top in sys.stdlib_module_names or top in ("pytest", "_pytest"), (p.name, name)
    sent = pytest_plan.supervisor_files("/w")
    assert sorted(sent) == [f"/w/{p.name}" for p in files]


def _assigned(path: Path, name: str) -> str:
    """The source of the value module `path` assigns to `name`."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.get_source_segment(path.read_text(), node.value) or ""
    raise AssertionError(f"{path.name} assigns no {name}")

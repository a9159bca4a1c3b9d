"""Grading building blocks without sandboxes: JUnit parsing of real pytest reports, path
protection, diff splitting/filtering, and the hardened runner run on the host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from legorl.verify.junit import ReportError, TestStatus, node_id, parse_junit
from legorl.verify.patch import filter_diff, split_diff, unquote
from legorl.verify.protect import Category, classify
from legorl.verify.pytest_plan import parse_summary, plan_run
from legorl.verify.test_command import TestCmdError, parse_test_cmd

SAMPLE_TESTS = {
    "pkg/__init__.py": "",
    "pkg/tests/__init__.py": "",
    "pkg/tests/test_mod.py": """
import pytest

def test_ok():
    assert 1 + 1 == 2

def test_bad():
    assert 1 + 1 == 3

@pytest.mark.parametrize("x", [1, 2, "a-b"])
def test_param(x):
    assert x != 2

class TestGroup:
    def test_in_class(self):
        pass

    @pytest.mark.skip(reason="no")
    def test_skipped(self):
        pass

    @pytest.mark.xfail(reason="known")
    def test_xfail(self):
        assert False

@pytest.fixture
def broken():
    raise RuntimeError("fixture")

def test_error(broken):
    pass
""",
    "tests/test_flat.py": "def test_flat():\n    pass\n",
    "tests/test_broken_import.py": "import does_not_exist\n\ndef test_never():\n    pass\n",
}


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def run_hardened(repo: Path, args: list[str]) -> tuple[int, dict[str, TestStatus], object]:
    plan = plan_run(str(repo), args, python=sys.executable, tmp_root=str(repo.parent))
    for path, text in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    proc = subprocess.run(plan.command, shell=True, capture_output=True, text=True, timeout=120)
    data = Path(plan.junit_path).read_bytes() if os.path.exists(plan.junit_path) else None
    return proc.returncode, (parse_junit(data) if data else {}), plan


def test_junit_of_a_real_pytest_run_maps_to_node_ids(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_tree(repo, SAMPLE_TESTS)
    code, res, plan = run_hardened(repo, ["pkg/tests/test_mod.py", "tests/test_flat.py", "tests/test_broken_import.py"])
    assert code == 1
    m = "pkg/tests/test_mod.py"
    assert res[f"{m}::test_ok"] is TestStatus.PASSED
    assert res[f"{m}::test_bad"] is TestStatus.FAILED
    assert res[f"{m}::test_param[1]"] is TestStatus.PASSED
    assert res[f"{m}::test_param[2]"] is TestStatus.FAILED
    assert res[f"{m}::test_param[a-b]"] is TestStatus.PASSED
    assert res[f"{m}::TestGroup::test_in_class"] is TestStatus.PASSED
    assert res[f"{m}::TestGroup::test_skipped"] is TestStatus.SKIPPED
    assert res[f"{m}::TestGroup::test_xfail"] is TestStatus.XFAILED
    assert res[f"{m}::test_error"] is TestStatus.ERROR
    assert res["tests/test_flat.py::test_flat"] is TestStatus.PASSED
    assert res[plan.canary_pass] is TestStatus.PASSED  # type: ignore[attr-defined]
    assert res[plan.canary_fail] is TestStatus.FAILED  # type: ignore[attr-defined]
    # The module that fails to import has no tests, only a collection error.
    assert "tests/test_broken_import.py::test_never" not in res
    assert any(k.startswith("<collection>") and v is TestStatus.ERROR for k, v in res.items())


def test_a_test_may_name_its_arguments_like_the_supervisor_names_its_own(tmp_path: Path) -> None:
    """The supervisor wraps every test call; a test whose fixtures or parameters are named like
    the wrapper's own arguments (item, call, x, args, kwargs) must still run, pass or fail on its
    own merits (a keyword clash once failed every parametrised test named `x`)."""
    repo = tmp_path / "repo"
    write_tree(
        repo,
        {
            "tests/test_names.py": (
                "import unittest\n"
                "import pytest\n\n"
                "@pytest.fixture\n"
                "def call():\n    return 3\n\n"
                "@pytest.fixture\n"
                "def item():\n    return 4\n\n"
                "@pytest.mark.parametrize('x,args,kwargs', [(1, 2, 3)])\n"
                "def test_clash(item, call, x, args, kwargs):\n"
                "    assert (item, call, x, args, kwargs) == (4, 3, 1, 2, 3)\n\n"
                "@pytest.mark.parametrize('x', [5])\n"
                "def test_clash_fails(x):\n    assert x == 6\n\n"
                "class TestU(unittest.TestCase):\n"
                "    def test_method(self):\n        self.assertEqual(1, 1)\n"
            ),
        },
    )
    _, res, _ = run_hardened(repo, ["tests/test_names.py"])
    assert res["tests/test_names.py::test_clash[1-2-3]"] is TestStatus.PASSED
    assert res["tests/test_names.py::test_clash_fails[5]"] is TestStatus.FAILED
    assert res["tests/test_names.py::TestU::test_method"] is TestStatus.PASSED


def test_runner_ignores_shadowing_modules_and_startup_hooks(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_tree(repo, {"tests/test_a.py": "def test_a():\n    assert True\n"})
    # A fake pytest, a sitecustomize and a .pth in the repository must all be inert.
    (repo / "pytest.py").write_text("raise SystemExit('shadow pytest imported')\n")
    (repo / "_pytest").mkdir()
    (repo / "_pytest" / "__init__.py").write_text("raise SystemExit('shadow _pytest imported')\n")
    (repo / "sitecustomize.py").write_text("import os; os._exit(0)\n")
    (repo / "usercustomize.py").write_text("import os; os._exit(0)\n")
    (repo / "evil.pth").write_text("import os; os._exit(0)\n")
    code, res, _ = run_hardened(repo, ["tests/test_a.py"])
    assert code == 1  # the canary failed, so pytest really ran and reported
    assert res["tests/test_a.py::test_a"] is TestStatus.PASSED


def test_node_id_rebuild() -> None:
    assert node_id("a/test_b.py", "a.test_b", "test_c[x.y]") == "a/test_b.py::test_c[x.y]"
    assert node_id("a/test_b.py", "a.test_b.TestK.Inner", "test_c") == "a/test_b.py::TestK::Inner::test_c"
    assert node_id("test_b.py", "test_b", "t") == "test_b.py::t"


@pytest.mark.parametrize(
    "data",
    [
        b"not xml",
        b"<html/>",
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><testsuites/>',
        b'<testsuites><testcase classname="a" file="a.py"/></testsuites>',
    ],
)
def test_untrustworthy_reports_are_rejected(data: bytes) -> None:
    with pytest.raises(ReportError):
        parse_junit(data)


@pytest.mark.parametrize(
    "path,expected",
    [
        ("toolz/itertoolz.py", None),
        ("src/pkg/core.py", None),
        ("README.rst", None),
        ("tests/test_x.py", Category.TEST),
        ("toolz/tests/helpers.py", Category.TEST),
        ("test/common.py", Category.TEST),
        ("test_inflection.py", Category.TEST),
        ("pkg/thing_test.py", Category.TEST),
        ("conftest.py", Category.TAMPER),
        ("tests/conftest.py", Category.TAMPER),
        ("sitecustomize.py", Category.TAMPER),
        ("src/usercustomize.py", Category.TAMPER),
        ("evil.pth", Category.TAMPER),
        ("pytest.py", Category.TAMPER),
        ("_pytest/__init__.py", Category.TAMPER),
        ("pluggy/hooks.py", Category.TAMPER),
        ("pkg/__pycache__/core.cpython-311.pyc", Category.TAMPER),
        ("pkg/core.cpython-311-x86_64-linux-gnu.so", Category.TAMPER),
        ("pytest.ini", Category.TEST_CONFIG),
        (".pytest.ini", Category.TEST_CONFIG),
        ("setup.cfg", Category.TEST_CONFIG),
        ("pyproject.toml", Category.TEST_CONFIG),
        ("tox.ini", Category.TEST_CONFIG),
        (".gitattributes", Category.TEST_CONFIG),
    ],
)
def test_classify(path: str, expected: Category | None) -> None:
    assert classify(path) == expected


def test_classify_extra_test_paths() -> None:
    assert classify("checks/verify_things.py") is None
    assert classify("checks/verify_things.py", ["checks/verify_things.py"]) is Category.TEST


DIFF = """\
some preamble the agent printed
--- a/tests/test_x.py
+++ b/tests/test_x.py
@@ -1 +1 @@
-x
+y
diff --git a/pkg/core.py b/pkg/core.py
index 1111111..2222222 100644
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,3 +1,3 @@
 a
-b
+c
 d
--- a/tests/test_hidden.py
+++ b/tests/test_hidden.py
@@ -1 +1 @@
-assert f() == 1
+assert True
diff --git a/conftest.py b/conftest.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1 @@
+import os
diff --git "a/pkg/caf\\303\\251.py" "b/pkg/caf\\303\\251.py"
new file mode 100644
--- /dev/null
+++ "b/pkg/caf\\303\\251.py"
@@ -0,0 +1 @@
+x = 1
diff --git a/tests/test_old.py b/pkg/moved.py
similarity index 100%
rename from tests/test_old.py
rename to pkg/moved.py
diff --git a/pkg/blob.bin b/pkg/blob.bin
new file mode 100644
GIT binary patch
literal 3
KcmZ?wWMTjS00II4

"""


def test_filter_diff_keeps_only_sections_it_understands() -> None:
    f = filter_diff(DIFF)
    assert f.kept.count("diff --git") == 2
    assert "pkg/core.py" in f.kept and "café" not in f.kept and "caf\\303\\251" in f.kept
    # Headerless hunks (before the first header, or smuggled after a section's last hunk) are gone.
    assert "tests/test_x.py" not in f.kept and "tests/test_hidden.py" not in f.kept
    assert f.dropped_lines >= 6
    stripped = {(s["path"], s["category"]) for s in f.stripped}
    assert ("conftest.py", "tamper") in stripped
    assert ("tests/test_old.py", "test") in stripped  # a rename out of tests/ is still a test change
    assert ("pkg/blob.bin", "binary") in stripped
    assert f.categories == {"tamper", "test", "binary"}


def test_split_diff_paths_and_unquote() -> None:
    sections, _ = split_diff(DIFF)
    paths = [s.paths for s in sections]
    assert ["pkg/core.py"] in paths
    assert ["pkg/café.py"] in paths
    assert unquote('"a\\tb"') == "a\tb"
    assert unquote("plain") == "plain"


def test_parse_test_cmd() -> None:
    assert parse_test_cmd("pytest -o addopts= tests/test_a.py") == ["-o", "addopts=", "tests/test_a.py"]
    assert parse_test_cmd("python3 -m pytest -x t.py") == ["-x", "t.py"]
    for bad in ("tox -e py311", "bash run.sh", "pytest 'unclosed"):
        with pytest.raises(TestCmdError):
            parse_test_cmd(bad)


def test_the_supervisor_kills_what_the_run_left_behind_and_nothing_else(tmp_path: Path) -> None:
    """A detached daemon started by the code under test is killed before the report is
    written; a process that is not the run's (started beside it on the host) lives on."""
    repo = tmp_path / "repo"
    pidfile = tmp_path / "daemon.pid"
    write_tree(
        repo,
        {
            "pkg/__init__.py": (
                "import subprocess, sys\n"
                f"p = subprocess.Popen(['sleep', '60'], start_new_session=True)\nopen({str(pidfile)!r}, "
                "'w').write(str(p.pid))\n"
            ),
            "tests/test_a.py": "import pkg\n\ndef test_a():\n    assert True\n",
        },
    )
    plan = plan_run(str(repo), ["tests/test_a.py"], python=sys.executable, tmp_root=str(repo.parent))
    for path, text in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        proc = subprocess.run(plan.command, shell=True, capture_output=True, text=True, timeout=120, check=False)
        summary, tags = parse_summary(proc.stdout, plan.nonce)
        assert tags == 1 and summary is not None and summary["stray_processes"] == 1, proc.stdout + proc.stderr
        daemon = int(pidfile.read_text())
        with pytest.raises(ProcessLookupError):
            for _ in range(50):  # it is gone (or a zombie of init's until reaped)
                os.kill(daemon, 0)
                if Path(f"/proc/{daemon}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                    raise ProcessLookupError
                time.sleep(0.02)
        assert bystander.poll() is None  # not the run's: untouched
    finally:
        bystander.kill()

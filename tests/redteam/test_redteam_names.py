"""Issue 36, class 3's last gap, in real sandboxes on both backends: a test module's name
rebound while the test runs by package code, to a value with none of the agent's code, and put
back before the comparison or after it, scores 0 with `test_globals_rebound`; the test's own
patches of its module (monkeypatch, a conftest fixture, mock.patch as decorator, context and
in setUp, `global`) stay honest, and the honest fix scores 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from legorl.types import Status
from legorl.verify.grade import grade
from tests.helpers.paths import ROOT
from tests.helpers.redteam import forgery_diff, ledger_task, package_files
from tests.helpers.redteam_names import CALC_FORGERIES, CALC_TARGET, NAMES_FORGERIES, calc_files, calc_task
from tests.helpers.tasks_util import backend_and_images

IN_SANDBOX = ROOT / "legorl" / "verify" / "in_sandbox"
BACKENDS = [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("redteam-names")


def _caught(out: object, name: str) -> None:
    o = out
    detail = (name, o.status, o.flags, {k: v for k, v in o.evidence.items() if k != "test_output"})  # type: ignore[attr-defined]
    assert o.reward == 0.0 and not o.masked, detail  # type: ignore[attr-defined]
    assert o.status is Status.HACK_DETECTED and "test_globals_rebound" in o.flags, detail  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("forgery", NAMES_FORGERIES, ids=lambda f: f.name)
async def test_a_name_rebound_while_the_test_runs_scores_zero(forgery, backend_name: str, root: Path) -> None:  # type: ignore[no-untyped-def]
    task = ledger_task(root, forgery.f2p, "python -m pytest -q")
    async with backend_and_images(backend_name) as (backend, images):
        out = await grade(task, forgery_diff(forgery, package_files(task)), backend, await images.for_task(task))
    _caught(out, forgery.name)


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_the_tests_own_patches_are_honest_and_a_laundered_one_is_not(backend_name: str, root: Path) -> None:
    task, target = calc_task(root), calc_task(root, CALC_TARGET)  # every test / the one forged
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        gold = await grade(task, task.patch, backend, image)
        empty = await grade(task, "", backend, image)
        forged = {
            f.name: await grade(target, forgery_diff(f, calc_files(task)), backend, image) for f in CALC_FORGERIES
        }
    detail = (gold.status, gold.flags, {k: v for k, v in gold.evidence.items() if k != "test_output"})
    assert gold.status is Status.RESOLVED and gold.reward == 1.0 and gold.flags == [], detail
    assert empty.reward == 0.0 and empty.status is not Status.HACK_DETECTED, (empty.status, empty.flags)
    for name, out in forged.items():
        _caught(out, name)


# ---- a write put back before any check: only the namespace's version tag shows it -----------
WRITTEN_BACK = """
import statistics, sys, time, types
sys.path.insert(0, {folder!r})
from lg_watch import Watch

repo = {repo!r}
watch = Watch(repo, [], ["tests/test_a.py"], time.time_ns(), sys._getframe)
mod = types.ModuleType("tests.test_a")
mod.__file__ = repo + "tests/test_a.py"
exec(compile(open(mod.__file__).read(), mod.__file__, "exec"), vars(mod))
sys.modules[mod.__name__] = mod
g = vars(mod)
print(watch.test_globals(mod, mod.__file__))  # before the test
real = g["mean"]
g["mean"] = statistics.mean  # package code, while the test runs
g["mean"] = real  # ... and put back before the comparison
print(watch.names.at_compare(g))
print(watch.test_globals(mod, mod.__file__, during=True))  # as it ends: clean again
g["EXPECTED"] = 2.5  # an expected value rebound to plain data
print(watch.test_globals(mod, mod.__file__, during=True))
"""


def test_a_write_put_back_is_seen_by_the_version_tag(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_a.py").write_text("from statistics import median as mean\nEXPECTED = 3\n")
    script = WRITTEN_BACK.format(folder=str(IN_SANDBOX), repo=str(repo) + "/")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["[]", "['(written and put back)']", "[]", "['EXPECTED']"], out.stdout

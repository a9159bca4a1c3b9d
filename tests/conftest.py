"""Fixtures shared by several test modules (pytest finds them here by name; a module's own
fixture of the same name, such as test_store.py's `store`, takes precedence), and the hooks
that order the files for the workers (tests/helpers/ordering.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from legorl.sandbox import ImageRef, ImageStore, open_backend
from legorl.sandbox.layers import ensure_base, ensure_task
from legorl.sandbox.testing import DemoRepo, demo_repo
from tests.helpers import ordering
from tests.helpers.backends import BACKENDS
from tests.helpers.paths import ROOT

if TYPE_CHECKING:  # the proxy's imports are paid only by the modules that use the fixture
    from legorl.proxy.server import ProxyServer
    from tests.helpers.proxy_util import ProxyScript

DURATIONS = ROOT / "tests" / "durations.json"
_recorder: list[ordering.Recorder] = []  # set by --record-durations, on the process that writes


# ---- the order the workers take the files in: tests/helpers/ordering.py says why
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="merge this run's seconds per test file into PATH (tests/durations.json orders the workers)",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # the controller (or a run without workers) writes
        _recorder.append(ordering.Recorder(Path(path).resolve(), ROOT, config))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = ordering.order(items, ordering.load(DURATIONS), ROOT)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for rec in _recorder:
        rec.report(report)


def pytest_sessionfinish() -> None:
    for rec in _recorder:
        rec.write()


@pytest.fixture(scope="module")
def one_thread_per_module() -> Iterator[None]:
    """Tiny models: one torch thread is faster than two on a busy machine. A module opts in
    with `pytestmark = pytest.mark.usefixtures("one_thread_per_module")`."""
    import torch  # here, not at the top: modules that never ask for it skip the import

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- the scripted proxy: one fixture for every module that serves a script through the proxy
@pytest.fixture
def proxy_script() -> ProxyScript:
    """What `proxy` serves; a module that uses `proxy` overrides this with its own script."""
    pytest.fail("a module that uses the `proxy` fixture defines a `proxy_script` fixture")


@pytest.fixture
async def proxy(proxy_script: ProxyScript) -> AsyncIterator[ProxyServer]:
    """A real proxy on loopback over the scripted engine replaying `proxy_script` (spied: `.spy`)."""
    from tests.helpers.proxy_util import scripted_proxy

    async with scripted_proxy(proxy_script) as srv:
        yield srv


# ---- sandboxes: one image store, the demo repository and its task image per session
@pytest.fixture(scope="session")
def store() -> ImageStore:
    return ImageStore()


@pytest.fixture(scope="session")
def base(store: ImageStore) -> ImageRef:
    return asyncio.run(ensure_base(store))


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> DemoRepo:
    return demo_repo(tmp_path_factory.mktemp("demo") / "repo")


@pytest.fixture(scope="session")
def task(store: ImageStore, base: ImageRef, repo: DemoRepo) -> ImageRef:
    """The demo repository at its base commit, its hidden paths left out (time-safe)."""
    return asyncio.run(ensure_task(store, base, repo.path, repo.base, hide_paths=list(repo.hidden)))


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, store: ImageStore):  # type: ignore[no-untyped-def]
    b = open_backend(request.param, store)
    yield b
    await b.aclose()

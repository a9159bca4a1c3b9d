"""Fixtures shared by several test modules (pytest finds them here by name; a module's own
fixture of the same name, such as test_store.py's `store`, takes precedence)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from legorl.sandbox import ImageRef, ImageStore, open_backend
from legorl.sandbox.layers import ensure_base, ensure_task
from legorl.sandbox.testing import DemoRepo, demo_repo
from tests.helpers.backends import BACKENDS

if TYPE_CHECKING:  # the proxy's imports are paid only by the modules that use the fixture
    from legorl.proxy.server import ProxyServer
    from tests.helpers.proxy_util import ProxyScript

# `scripts/test.sh` runs the suite on two workers, a file at a time each (`-n 2 --dist
# loadfile`), handing files out in collection order; the longest files (measured with
# `--durations`) are collected first, so the learning runs (one file: one after the other,
# tests/helpers/learn_util.py says why) start at the beginning while the other worker takes the rest.
LONGEST_FIRST = [
    "test_loop_learns.py",
    "test_harness_e2e.py",
    "test_loop_paper_harnesses.py",
    "test_loop_ray.py",
    "test_loop_bad_input.py",
    "test_tasks_validate.py",
    "test_harness_network.py",
    "test_redteam.py",
    "test_engine_vllm_real.py",
    "test_smollm2_vllm.py",
    "test_loop_train_harness.py",
    "test_smollm2.py",
    "test_loop_run_dir.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


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

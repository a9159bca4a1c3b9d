"""Fixtures shared by several test modules (pytest finds them here by name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_thread_per_module() -> Iterator[None]:
    """Tiny models: one torch thread is faster than two on a busy machine. A module opts in
    with `pytestmark = pytest.mark.usefixtures("one_thread_per_module")`."""
    import torch  # here, not at the top: modules that never ask for it skip the import

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

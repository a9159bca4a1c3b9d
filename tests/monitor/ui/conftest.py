"""The browser and page fixtures of the UI tests in a real headless Chromium: one browser per
module, a fresh page per test that fails it on any JavaScript error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.browser import CHROMIUM_ARGS, chromium_path


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, timeout=60_000)
        yield b
        b.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(15_000)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"

"""Debian's headless Chromium driven by Playwright (scripts/setup_ui.sh): where it is, how it is
started, and how a UI page is opened and waited for (the UI tests under tests/monitor/ui/)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def chromium_path() -> str:
    path = os.environ.get("LEGORL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian chromium is not installed: run `bash scripts/setup_ui.sh` (or set LEGORL_CHROMIUM)")
    return path


def open_page(pg: object, url: str) -> None:
    pg.goto(url)
    pg.wait_for_selector("body[data-ready='1']")

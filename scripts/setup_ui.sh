#!/usr/bin/env bash
# Set-up for the UI's real-browser tests (tests/monitor/ui/test_ui_browser.py): Debian's chromium and
# the Playwright Python package that drives it. Idempotent. Playwright's own browser
# download (`playwright install`) is never used: it fetches browsers from outside the
# package registries; the tests point Playwright at /usr/bin/chromium instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"

if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi
chromium --version

if ! "$PY" -c "import playwright" >/dev/null 2>&1; then
  "$PY" -m pip install -q "playwright>=1.45"
fi
"$PY" -c "import importlib.metadata as m; print('playwright', m.version('playwright'))"

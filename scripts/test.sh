#!/usr/bin/env bash
# The README's test command: set-up (idempotent) + the whole test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# style first (seconds): the formatter's layout and a short lint rule set (pyproject.toml [tool.ruff])
.venv/bin/ruff format --check --quiet legorl tests bench scripts
.venv/bin/ruff check --quiet legorl tests bench scripts
# two workers, one file at a time each (module fixtures stay whole), in the order
# tests/helpers/ordering.py sets: marked files (slow/harness/docker) first, longest first by
# tests/durations.json (--no-loadscope-reorder: xdist would otherwise send the files with the
# most tests first). Refresh the figures after a whole run: add --record-durations tests/durations.json
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=60 "$@"

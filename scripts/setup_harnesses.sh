#!/usr/bin/env bash
# Idempotent set-up of the harness layers (issues 4, 16): Claude Code, OpenCode, Codex CLI and Pi (npm prefixes
# holding their native binaries; Pi's with a node runtime), the OpenHands SDK and mini-swe-agent (venvs on a copy of
# pyenv's CPython 3.12). Each layer is built once into $LEGORL_HARNESS_ROOT
# (default /opt/legorl/harnesses) under a content key and mounted read-only into agent
# sandboxes; re-running this script only builds what is missing.
#
#   bash scripts/setup_harnesses.sh                 # all of them
#   bash scripts/setup_harnesses.sh opencode        # just one
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { printf '== setup_harnesses: %s\n' "$*" >&2; }

need=()
command -v patchelf >/dev/null || need+=(patchelf)
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
    log "apt packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=.venv/bin/python
[ -x "$PY" ] || { echo "setup_harnesses: run scripts/setup.sh first (no .venv)" >&2; exit 1; }
log "building harness layers (first time: ~5 min, ~2.5 GB)"
# (pip's warnings about this machine's unused local package indexes are filtered out)
"$PY" -m legorl.harness.install "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
"$PY" -m legorl.harness.install --list >&2

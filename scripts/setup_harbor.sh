#!/usr/bin/env bash
# Idempotent set-up of Harbor (issue 25): the pinned `harbor` package in a venv of its own,
# $LEGORL_HARBOR_VENV (default .venv-harbor in the checkout), on pyenv's CPython 3.12
# ($LEGORL_PYTHON312, default ~/.pyenv/versions/3.12.1) because Harbor needs Python >= 3.12
# and the project runs on 3.11. The tests use its own ATIF `TrajectoryValidator` to check
# every file `legorl export --format atif` writes. First run ~2 min, ~430 MB; re-running only checks
# the stamp, so it is offline-safe once installed.
#
#   bash scripts/setup_harbor.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LEGORL_HARBOR_VENV:-$ROOT/.venv-harbor}
VERSION=0.25.0
PY312=${LEGORL_PYTHON312:-$HOME/.pyenv/versions/3.12.1}/bin/python3.12
log() { printf '== setup_harbor: %s\n' "$*" >&2; }
check='from harbor.utils.trajectory_validator import TrajectoryValidator; import harbor.models.trajectories'

stamp="$VENV/.legorl-harbor-$VERSION"
if [ -f "$stamp" ] && "$VENV/bin/python" -c "$check" 2>/dev/null; then
    log "harbor==$VERSION already in $VENV"; exit 0
fi
[ -x "$PY312" ] || { echo "setup_harbor: no CPython 3.12 at $PY312 (set LEGORL_PYTHON312)" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || { log "creating $VENV with $PY312"; "$PY312" -m venv "$VENV"; }
log "installing harbor==$VERSION into $VENV (first time: ~2 min)"
# (pip's warnings about this machine's unused local package indexes are filtered out)
# (its dependencies at the versions it was tested with: scripts/assets/harbor-constraints.txt)
"$VENV/bin/pip" install -q -c "$ROOT/scripts/assets/harbor-constraints.txt" "harbor==$VERSION" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
"$VENV/bin/python" -c "$check"
touch "$stamp"
log "harbor==$VERSION ready: $VENV/bin/python"

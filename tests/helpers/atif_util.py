"""Harbor's own ATIF validator, run in its Python 3.12 venv (scripts/setup_harbor.sh), for
the tests that export trajectories with `legorl export --format atif`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from legorl.store.run_store import RunStore
from tests.helpers.paths import ROOT

HARBOR_PY = Path(os.environ.get("LEGORL_HARBOR_VENV", ROOT / ".venv-harbor")) / "bin" / "python"
LEGORL = [sys.executable, "-m", "legorl.cli"]

VALIDATE = """
import json, sys
from pathlib import Path
from harbor.utils.trajectory_validator import TrajectoryValidator
out = {}
for p in sorted(Path(sys.argv[1]).glob("*.json")):
    v = TrajectoryValidator()
    out[p.name] = [] if v.validate(p) else v.get_errors()
print(json.dumps(out))
"""


def harbor_errors(directory: Path) -> dict[str, list[str]]:
    """Harbor's TrajectoryValidator over every .json in `directory`: file -> its errors."""
    if not HARBOR_PY.exists():
        pytest.fail(f"no Harbor venv at {HARBOR_PY.parent.parent}: run scripts/setup_harbor.sh")
    proc = subprocess.run(
        [str(HARBOR_PY), "-c", VALIDATE, str(directory)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def export(run: Path, out: Path, fmt: str = "atif") -> subprocess.CompletedProcess[str]:
    """`legorl export RUN --format FMT --out OUT`, output captured."""
    return subprocess.run(
        [*LEGORL, "export", str(run), "--format", fmt, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def exported_and_valid(run: Path, out: Path) -> list[dict[str, Any]]:
    """Export a run as ATIF, check Harbor accepts every file; the parsed files."""
    proc = export(run, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = harbor_errors(out)
    assert errors and {k: v for k, v in errors.items() if v} == {}, errors
    return [json.loads((out / name).read_text()) for name in errors]


def store_records(run: Path, records: list[Any]) -> Path:
    """Record rollouts (`legorl.loop.worker.RolloutRecord`s) in a run store, as `legorl train` does."""
    with RunStore(run) as store:
        for rec in records:
            t = rec.trajectory
            store.start_session(t.session_id, step=t.step, instance_id=t.instance_id, harness=t.harness)
            for turn in rec.turns:
                store.add_turn(turn)
            store.add_trajectory(t)
    return run

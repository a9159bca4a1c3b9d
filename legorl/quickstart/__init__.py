"""The learning quickstart: SFT warm start, then GSPO, on a tiny model, on a CPU, in minutes.

    legorl train examples/quickstart.toml          # or: python -m legorl.quickstart CONFIG
    legorl ui --run examples/runs/quickstart

See run.py for the phases and README section "Quickstart" for what is real in the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_quickstart(config_path: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Run the quickstart of `config_path` (a TOML with a `[quickstart]` table) into
    `out_dir` (default: the config's `run_dir`); returns the results (also written to
    `out_dir/quickstart_results.json`)."""
    from legorl.quickstart.run import run_quickstart as run

    return run(Path(config_path), None if out_dir is None else Path(out_dir))


__all__ = ["run_quickstart"]

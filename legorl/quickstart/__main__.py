"""`python -m legorl.quickstart [CONFIG] [--out DIR]`: run the quickstart, print its results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from legorl.config import ConfigError

DEFAULT = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m legorl.quickstart", description=__doc__)
    ap.add_argument("config", nargs="?", type=Path, default=DEFAULT, help="TOML with a [quickstart] table")
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: the config's run_dir)")
    args = ap.parse_args(argv)
    from legorl.quickstart import run_quickstart

    try:
        results = run_quickstart(args.config, args.out)
    except ConfigError as e:
        print(f"legorl quickstart: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"table": results["table"], "gspo_gain_over_sft": results["gspo_gain_over_sft"],
                      "wall_s": results["wall_s"], "run_dir": results["run_dir"]}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

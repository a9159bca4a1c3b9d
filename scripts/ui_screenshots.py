"""The README's screenshots, taken of a real run's store: the overview and one trajectory.

Serves the UI over `--run DIR` (a `legorl train` run directory, read only) on 127.0.0.1,
opens it in headless Chromium (Debian `chromium`, driven by Playwright; `bash
scripts/setup_ui.sh` installs both) and saves `ui-overview.png` and `ui-trajectory.png`
into `--out`. The trajectory shown is a GSPO-step rollout that was trained on (it has an advantage), the
one with the most turns among those that resolved, so the page has tokens coloured by both
log-probs, segments, a diff and test results to show.

    .venv/bin/python scripts/ui_screenshots.py --run examples/runs/quickstart [--out docs/img]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def chromium() -> str:
    path = os.environ.get("LEGORL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        sys.exit("no chromium: run `bash scripts/setup_ui.sh` (or set LEGORL_CHROMIUM)")
    return path


def showcase(run_dir: Path) -> str:
    """The session to show: a trained GSPO rollout, resolved if any was, with the most turns."""
    db = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    row = db.execute(
        "SELECT session_id FROM trajectories WHERE step >= 0 AND masked = 0 "
        "ORDER BY advantage IS NOT NULL DESC, status = 'resolved' DESC, n_turns DESC, step DESC LIMIT 1"
    ).fetchone()
    db.close()
    if row is None:
        sys.exit(f"{run_dir}: no graded GSPO rollout to show")
    return str(row[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a run directory (holds run.sqlite)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args()
    if not (args.run / "run.sqlite").is_file():
        sys.exit(f"{args.run}: no run.sqlite (expected a `legorl train` run directory)")
    from playwright.sync_api import sync_playwright

    from legorl.monitor.ui.server import UIServerThread

    sid = showcase(args.run)
    args.out.mkdir(parents=True, exist_ok=True)
    with UIServerThread(args.run) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=ARGS, timeout=60_000)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(30_000)
        page.goto(srv.url)
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector(".chart path.line")
        page.screenshot(path=str(args.out / "ui-overview.png"))
        page.goto(f"{srv.url}#/t/{sid}")
        page.wait_for_selector(".tokens .tok")
        page.screenshot(path=str(args.out / "ui-trajectory.png"))
        browser.close()
    print(f"{args.out / 'ui-overview.png'}\n{args.out / 'ui-trajectory.png'}  (session {sid})")


if __name__ == "__main__":
    main()

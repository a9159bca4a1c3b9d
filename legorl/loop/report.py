"""The held-out report of a run: the before/after table, the gains, where the time went.

Written to `RUN_DIR/heldout_results.json` after every evaluation (so a crash or a resumed
run keeps the rows it had), stored in the run store as a `heldout` event at the end, and
printed. Gains: GSPO over its warm-start checkpoint (the number the quickstart is about),
over the untrained start, and the control's (more SFT instead of GSPO) over the same
warm-start checkpoint — each in points with Newcombe's 95% interval.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from legorl.loop import memory
from legorl.loop.stats import Evaluation, gain, table

RESULTS_FILE = "heldout_results.json"
T = TypeVar("T")
GAINS = (
    ("gspo_over_warm_start", "warm_start", "end"),
    ("gspo_over_start", "start", "end"),
    ("control_over_warm_start", "warm_start", "control"),
)


def is_complete(run_dir: Path) -> bool:
    """Whether `run_dir`'s report is of a run whose phases all finished. The report is
    rewritten after every evaluation, so its existence says only that one evaluation ran: a
    run killed after its start evaluation has one. A report written before `complete` was
    recorded counts as complete when it has the end-of-run wall time."""
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        return False
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return False  # a torn or foreign file: not a finished run's report
    return bool(data.get("complete", "wall_s" in data)) if isinstance(data, dict) else False


class Report:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RESULTS_FILE
        self.rows: dict[str, Evaluation] = {}
        self.steps: dict[str, int] = {}
        self.phases: dict[str, float] = {}
        self.peak_rss_gb: dict[str, float] = {}  # each phase's peak resident memory (memory.py)
        self.wall_s: float | None = None
        self.budget_s: float | None = None
        self.complete = False  # every phase ran to its end (not killed, not raised)

    @classmethod
    def load(cls, run_dir: Path) -> Report:
        """The report of an earlier (interrupted) attempt of this run, or a new one."""
        rep = cls(run_dir)
        if rep.path.exists():
            data = json.loads(rep.path.read_text())
            for label, row in data.get("evaluations", {}).items():
                rep.rows[label] = Evaluation(
                    label,
                    row["resolved"],
                    row["episodes"],
                    row.get("masked", 0),
                    row.get("wall_s", 0.0),
                    row.get("statuses", {}),
                )
                rep.steps[label] = row.get("policy_version", 0)
            rep.phases = dict(data.get("phases_s", {}))
            rep.peak_rss_gb = dict(data.get("peak_rss_gb", {}))
        return rep

    def keep_only(self, phases: set[str]) -> None:
        """Drop the rows of evaluations a resume redoes (those of phases not in `phases`;
        `end@opencode` is of phase `end`), so a redone evaluation is counted once."""
        for label in [k for k in self.rows if k.split("@")[0] not in phases]:
            del self.rows[label]
            self.steps.pop(label, None)
        self.save()

    def add(self, ev: Evaluation, *, step: int) -> None:
        self.rows[ev.label] = ev
        self.steps[ev.label] = step
        self.save()

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = round(self.phases.get(name, 0.0) + seconds, 1)

    def peak(self, name: str, gb: float) -> None:
        """Phase `name` held up to `gb` resident (the most of its parts, for a resumed phase)."""
        self.peak_rss_gb[name] = round(max(self.peak_rss_gb.get(name, 0.0), gb), 2)

    async def timed(self, name: str, work: Awaitable[T]) -> T:
        """Await `work` as phase `name`: its wall time and its peak resident memory (what the
        phase before it freed is handed back first, so each peak is the phase's own)."""
        memory.release()
        memory.reset_peak()
        t0 = time.monotonic()
        try:
            return await work
        finally:
            self.phase(name, time.monotonic() - t0)
            self.peak(name, memory.peak_rss_gb())
            if self.path.parent.is_dir():
                self.save()  # the phase's figures on disk now, not at the next evaluation's row

    def finish(self, wall_s: float, *, budget_s: float | None) -> None:
        """The table's last write; also after an error, so `wall_s` alone does not say the run
        ended: `complete` does (set by the loop when its last phase returned)."""
        self.wall_s, self.budget_s = round(wall_s, 1), budget_s
        self.save()

    def gains(self) -> dict[str, dict[str, float]]:
        """Each gain of GAINS; a mixed-harness run's rows are `label@harness`, and each harness
        gets its own gains (`gspo_over_warm_start@opencode`)."""
        out = {}
        suffixes = sorted({"@" + k.split("@", 1)[1] for k in self.rows if "@" in k}) or [""]
        for at in suffixes:
            for name, a, b in GAINS:
                a, b = a + at, b + at
                if a in self.rows and b in self.rows and self.rows[a].episodes and self.rows[b].episodes:
                    out[name + at] = gain(self.rows[a], self.rows[b])
        return out

    def as_dict(self) -> dict[str, Any]:
        evals = {k: {**v.as_dict(), "policy_version": self.steps.get(k, 0)} for k, v in self.rows.items()}
        out: dict[str, Any] = {"evaluations": evals, "gains": self.gains(), "phases_s": dict(self.phases)}
        out["peak_rss_gb"] = dict(self.peak_rss_gb)
        out["complete"] = self.complete
        if self.wall_s is not None:
            out["wall_s"] = self.wall_s
            if self.budget_s is not None:
                out["time_budget_s"] = self.budget_s
                out["within_budget"] = self.wall_s <= self.budget_s
        return out

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=1))
        tmp.replace(self.path)

    def text(self) -> str:
        lines = [table(list(self.rows.values()))]
        for name, g in self.gains().items():
            lines.append(f"{name}: {g['points']:+.1f} points [{g['ci95'][0]:+.1f}, {g['ci95'][1]:+.1f}]")
        if self.wall_s is not None:
            lines.append(f"wall {self.wall_s:.0f}s" + (f" (budget {self.budget_s:.0f}s)" if self.budget_s else ""))
        return "\n".join(lines)

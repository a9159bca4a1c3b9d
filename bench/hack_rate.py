"""Hack rate of the grader against the red team (tests/helpers/redteam.py), per class and per runner.

Every forgery is graded the real way (a fresh sandbox, the diff filtered and applied, the
supervised runner) on each backend and each test command shape; a forgery "leaks" when it
scores reward 1 or gets its failure masked (an agent's 0 read as infra). The catalogue is the
red team's (`tests/helpers/redteam.py`) and issue 36's (`tests/helpers/redteam_origin.py`: classes 1-3 on the
pytest path and native runners; `tests/helpers/redteam_grading_native.py`: class 3 and the masking
classes 4 and 6 on the native runners; `tests/helpers/redteam_names.py`: class 3's names rebound while
a test runs, to values with none of the agent's code, on the ledger and on a task whose tests
patch their own names). Prints one JSON object: per runner and class,
`leaked / graded`, and per forgery its status and flags; plus the honest fix of every task
shape (must stay 1).

    .venv/bin/python bench/hack_rate.py [--backends local,docker] [--runners pytest,django,sympy,harbor]
        [--test-cmds no-paths,paths]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `tests.helpers`

from legorl.harness.command import CommandHarness  # noqa: E402
from legorl.rollout import run_rollout  # noqa: E402
from legorl.sandbox import open_backend  # noqa: E402
from legorl.tasks.image import TaskImages  # noqa: E402
from legorl.tasks.loader import load_tasks  # noqa: E402
from legorl.types import Status  # noqa: E402
from legorl.verify.grade import grade  # noqa: E402
from tests.helpers.redteam import (  # noqa: E402
    HARBOR_FORGERIES,
    HARBOR_HONEST,
    LEDGER_F2P,
    NATIVE_FORGERIES,
    PYTEST_FORGERIES,
    forgery_diff,
    harbor_agent,
    harbor_task_dir,
    ledger_task,
    native_files,
    native_task,
    package_files,
)
from tests.helpers.redteam_grading_native import NATIVE_MASKING_FORGERIES, NATIVE_NAMES_FORGERIES  # noqa: E402
from tests.helpers.redteam_names import CALC_FORGERIES, CALC_TARGET, NAMES_FORGERIES, calc_files, calc_task  # noqa: E402
from tests.helpers.redteam_origin import NATIVE_ORIGIN_FORGERIES, PYTEST_ORIGIN_FORGERIES  # noqa: E402

TEST_CMDS = {"no-paths": "python -m pytest -q", "paths": "pytest -q tests/test_core.py"}
PYTEST_ALL = PYTEST_FORGERIES + PYTEST_ORIGIN_FORGERIES + NAMES_FORGERIES
NATIVE_ALL = NATIVE_FORGERIES + NATIVE_ORIGIN_FORGERIES + NATIVE_NAMES_FORGERIES + NATIVE_MASKING_FORGERIES


async def run_backend(name: str, runners: list[str], root: Path, cmds: list[str]) -> dict:
    backend = open_backend(name)
    images = TaskImages(name)
    rows: list[dict] = []
    honest: dict[str, str] = {}
    try:
        if "pytest" in runners:
            for shape in LEDGER_F2P:
                task = ledger_task(root, shape, TEST_CMDS["no-paths"])
                out = await grade(task, task.patch, backend, await images.for_task(task))
                honest[f"pytest:{shape}"] = out.status.value
            for f in PYTEST_ALL:
                for cmd, test_cmd in ((c, TEST_CMDS[c]) for c in cmds):
                    task = ledger_task(root, f.f2p, test_cmd)
                    t0 = time.monotonic()
                    out = await grade(task, forgery_diff(f, package_files(task)), backend, await images.for_task(task))
                    rows.append(_row(f, cmd, out, time.monotonic() - t0))
            task, target = calc_task(root), calc_task(root, CALC_TARGET)  # tests that patch their own names
            image = await images.for_task(task)
            honest["pytest:calc"] = (await grade(task, task.patch, backend, image)).status.value
            for f in CALC_FORGERIES:
                t0 = time.monotonic()
                out = await grade(target, forgery_diff(f, calc_files(task)), backend, image)
                rows.append(_row(f, "no-paths", out, time.monotonic() - t0))
        if "harbor" in runners:  # the agent's program, run by the verifier, forges the reward file
            (task,) = load_tasks(harbor_task_dir(root))
            image = await images.for_task(task)
            res = await run_rollout(task, CommandHarness(harbor_agent(HARBOR_HONEST)), backend, image)
            honest["harbor"] = res.outcome.status.value
            for name, body in sorted(HARBOR_FORGERIES.items()):
                t0 = time.monotonic()
                res = await run_rollout(task, CommandHarness(harbor_agent(body)), backend, image)
                rows.append(_row(HarborForgery(name), "harbor", res.outcome, time.monotonic() - t0))
        for runner in (r for r in runners if r not in ("pytest", "harbor")):
            task = native_task(runner)
            image = await images.for_task(task)
            out = await grade(task, task.patch, backend, image)
            honest[runner] = out.status.value
            for f in (f for f in NATIVE_ALL if f.runner == runner):
                t0 = time.monotonic()
                out = await grade(task, forgery_diff(f, native_files(task, f)), backend, image)
                rows.append(_row(f, "native", out, time.monotonic() - t0))
    finally:
        await backend.aclose()
    by: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in rows:
        cell = by[r["runner"]][r["class"]]
        cell[0] += int(r["reward"] == 1.0 or r["masked"])
        cell[1] += 1
    return {
        "hack_rate": {
            run: {c: {"leaked": v[0], "graded": v[1], "rate": round(v[0] / v[1], 3)} for c, v in sorted(cls.items())}
            for run, cls in sorted(by.items())
        },
        "leaked_total": sum(r["reward"] == 1.0 or r["masked"] for r in rows),
        "graded_total": len(rows),
        "honest_fix": honest,
        "forgeries": rows,
    }


@dataclass(frozen=True)
class HarborForgery:
    """A Harbor forgery as a row names it (the red team keeps them as name -> program)."""

    name: str
    cls: str = "harbor reward file"
    form: str = "program the verifier runs"
    runner: str = "harbor"


def _row(f, cmd: str, out, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    return {
        "forgery": f.name,
        "class": f.cls,
        "form": f.form,
        "runner": f.runner,
        "test_cmd": cmd,
        "reward": out.reward,
        "masked": out.masked,
        "status": out.status.value,
        "flags": out.flags,
        "detected": out.status is Status.HACK_DETECTED,
        "grade_s": round(seconds, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="local,docker")
    ap.add_argument("--runners", default="pytest,django,sympy,harbor")
    ap.add_argument("--test-cmds", default="no-paths,paths", help="pytest command shapes: no-paths, paths")
    args = ap.parse_args()
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    cmds = [c.strip() for c in args.test_cmds.split(",") if c.strip() in TEST_CMDS]
    root = Path(tempfile.mkdtemp(prefix="legorl-redteam-"))
    t0 = time.monotonic()
    result: dict = {"bench": "hack_rate", "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    result["command"] = " ".join(["bench/hack_rate.py", *sys.argv[1:]])
    result["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["backends"] = {
        b.strip(): asyncio.run(run_backend(b.strip(), runners, root, cmds))
        for b in args.backends.split(",")
        if b.strip()
    }
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

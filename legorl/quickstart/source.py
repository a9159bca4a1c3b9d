"""The quickstart family as a task source: SWE-bench-format tasks with a real repository.

`ensure_task_file(root, ...)` writes, once per parameter set (content-keyed, under the
image cache), what any user task set has: `tasks.jsonl` (SWE-bench instance fields plus
`repo_path`, `test_cmd`, `split`) and a git repository `calc` holding every task's
repository as its own root commit (`calc.py` + `test_calc.py`, no history, fixed author
dates so the commit ids are the same on every machine). The loop then loads it with
`legorl.tasks.loader.load_tasks` and runs it like any other task file: task images from
the layered cache, the agent in a sandbox, grading by `legorl.verify` (pytest on the
task's tests, tests restored) — no grader of its own.

All repositories go into one repository through one `git fast-import` (a few ms per
thousand tasks), so building the source costs nothing next to a run; the task images
are built lazily, per task actually used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from pydantic import Field

from legorl.config_base import Section
from legorl.quickstart import family

SOURCE_NAME = "quickstart-calc"  # `[run] tasks = "quickstart-calc"`
REPO_NAME = "calc"
TASKS_NAME = "tasks.jsonl"
_VERSION = 2  # bump when the generated files change


class CalcTasksSection(Section):
    """`[calc_tasks]`: the generated quickstart family, used when `run.tasks = "quickstart-calc"`."""

    functions_per_task: int = Field(3, ge=2, le=8)
    """Functions in each task's calc.py; one of them is broken."""
    train: int = Field(1024, ge=1)
    """Tasks of the `train` split (demonstrations and GSPO draw from them)."""
    heldout: int = Field(256, ge=1)
    """Tasks of the `heldout` split (evaluation only; disjoint from train by content)."""


def _key(functions_per_task: int, train: int, heldout: int) -> str:
    src = Path(family.__file__).read_bytes() + Path(__file__).read_bytes()
    ident = json.dumps([_VERSION, functions_per_task, train, heldout, hashlib.sha256(src).hexdigest()])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _fast_import_stream(tasks: list[family.QuickTask]) -> bytes:
    """One root commit per task (mark i+1), each on its own ref."""
    out: list[bytes] = []
    for i, t in enumerate(tasks):
        out.append(f"commit refs/tasks/{t.instance_id}\nmark :{i + 1}\n".encode())
        out.append(b"author LEGO-RL <quickstart@legorl> 1700000000 +0000\n")
        out.append(b"committer LEGO-RL <quickstart@legorl> 1700000000 +0000\n")
        msg = f"{t.instance_id}\n".encode()
        out.append(b"data %d\n%s" % (len(msg), msg))
        for name, text in sorted(t.files().items()):
            data = text.encode()
            out.append(f"M 100644 inline {name}\n".encode() + b"data %d\n%s\n" % (len(data), data))
        out.append(b"\n")
    return b"".join(out)


def _build(dest: Path, functions_per_task: int, train: int, heldout: int) -> None:
    splits = {
        "train": family.tasks("train", train, functions_per_task),
        "heldout": family.tasks("heldout", heldout, functions_per_task),
    }
    every = [t for ts in splits.values() for t in ts]
    repo = dest / REPO_NAME
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(
        ["git", "init", "-q", str(repo)], check=True, env=env, timeout=60
    )  # not bare: images check out from it
    marks = dest / "marks"
    subprocess.run(
        ["git", "-C", str(repo), "fast-import", "--quiet", f"--export-marks={marks}"],
        input=_fast_import_stream(every),
        check=True,
        env=env,
        timeout=600,
    )
    sha = {int(m[1:]): c for m, c in (line.split() for line in marks.read_text().splitlines())}
    marks.unlink()
    with open(dest / TASKS_NAME, "w") as f:
        i = 0
        for split, ts in splits.items():
            for t in ts:
                i += 1
                row = t.to_task(split)
                f.write(
                    json.dumps(
                        {
                            "instance_id": row.instance_id,
                            "repo": row.repo,
                            "base_commit": sha[i],
                            "problem_statement": row.problem_statement,
                            "patch": row.patch,
                            "test_patch": "",
                            "FAIL_TO_PASS": row.FAIL_TO_PASS,
                            "PASS_TO_PASS": row.PASS_TO_PASS,
                            "repo_path": REPO_NAME,
                            "test_cmd": family.GRADE_CMD,
                            "split": split,
                        }
                    )
                    + "\n"
                )


def ensure_task_file(root: Path, cfg: CalcTasksSection) -> Path:
    """The path of the generated `tasks.jsonl` (built if missing; safe across processes)."""
    functions_per_task, train, heldout = cfg.functions_per_task, cfg.train, cfg.heldout
    key = _key(functions_per_task, train, heldout)
    dest = root / "task-sources" / f"quickstart-calc-{key}"
    done = dest / TASKS_NAME
    if done.exists():
        return done
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return done
        tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _build(tmp, functions_per_task, train, heldout)
        except (OSError, subprocess.SubprocessError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"cannot generate the quickstart task source in {dest}: {e}") from None
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    return done

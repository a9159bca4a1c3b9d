"""Stage 2 of grading: check the diff's size, drop what it may not change, lay out the work dir.

The agent's diff is untrusted text. Before anything of it reaches the sandbox, sections
that touch a protected path (`protect.py`: the task's tests, pytest's configuration,
start-up hooks, runner-shadowing modules, byte code) or a binary file are dropped
(`patch.py`), and what was dropped becomes evidence and flags: a tamper-class path is a
`tamper_attempt`, a test edit only a note. This parse is for evidence and to keep `git apply`
from tripping over test edits; the authority is the next stage, which checks the tree.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from legorl.sandbox.base import Sandbox
from legorl.types import Status
from legorl.verify.attempt import Attempt, exec_step
from legorl.verify.patch import FilteredDiff, filter_diff
from legorl.verify.protect import Category
from legorl.verify.selection import Selection
from legorl.verify.verdict import TAMPER

# What each dropped category says about the diff (binary sections are not a category of protect.py).
_FLAGS = {
    Category.TAMPER: TAMPER,
    Category.TEST: "tests_modified",
    Category.TEST_CONFIG: "test_config_modified",
    "binary": "binary_files",
}


@dataclass(frozen=True)
class Workspace:
    """The grader's work directory in the sandbox (random name, outside the repository)."""

    dir: str  # holds agent.diff (the filtered diff) and test.diff (the task's test_patch)
    filtered: FilteredDiff
    protected: list[str]  # the selection's task test files, for the restore check


def flag_of(category: Category | str | None) -> str | None:
    """The flag a protected path of this category raises (None: an unprotected path)."""
    return _FLAGS.get(category) if category is not None else None


async def prepare(sb: Sandbox, a: Attempt, sel: Selection, diff: str) -> Workspace:
    """Stage 2: raises `Decided` for a diff over the size limit; else writes both diffs."""
    if len(diff.encode()) > a.cfg.max_diff_bytes:
        a.ev["reason"] = f"diff over {a.cfg.max_diff_bytes} bytes"
        raise a.stop(Status.FAILED, "patch_too_large")
    filtered = filter_diff(diff, sel.protected)
    a.ev["stripped"] = filtered.stripped
    a.ev["ignored_diff_lines"] = filtered.dropped_lines
    for cat in (Category.TAMPER, Category.TEST, Category.TEST_CONFIG, "binary"):
        if cat in filtered.categories:
            a.flags.append(_FLAGS[cat])
    w = f"/tmp/.lg-{secrets.token_hex(8)}"
    await exec_step(sb, "setup", f"mkdir -p {w}", a.cfg)
    await sb.write_file(f"{w}/agent.diff", filtered.kept.encode())
    await sb.write_file(f"{w}/test.diff", a.task.test_patch.encode())
    return Workspace(w, filtered, sel.protected)

"""Stage 3 of grading: apply the agent's diff, put every protected path back, apply the task's tests.

Steps, in the fresh sandbox (nothing of the agent's sandbox survives):
1. snapshot the untouched tree (`git add -A -f; write-tree`: pre), apply the filtered diff;
2. snapshot again (post) and compare to pre *by tree*, not by trusting our parse of the
   diff: every protected path that changed is put back (new ones deleted, others checked
   out from pre), byte code is deleted, and a third snapshot must show no protected change;
3. apply the task's `test_patch`; one that applies to the untouched tree but not after the
   agent's diff was broken by the agent (e.g. a file where the test patch needs a directory).

Each agent-caused failure (the diff does not apply, a path game makes the restore fail or
leaves a protected change, the test patch conflicts) raises `Decided`; a git step that fails
otherwise is a `GraderFault` which, the diff being in the tree, `grade()` confirms with an
empty-diff control before masking it: the agent writes the diff, and a diff whose hunks make
`git apply` search for minutes times out an honest step (`apply_timeout`, the agent's 0 when
the control is clean). Only a test patch that does not apply to the untouched tree either
is the task's fault outright.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from legorl.sandbox.base import Sandbox
from legorl.types import Status
from legorl.verify.attempt import Attempt, GraderFault, exec_step
from legorl.verify.prepare import Workspace, flag_of
from legorl.verify.protect import classify
from legorl.verify.verdict import TAMPER

GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor= -c core.quotepath=off -c advice.detachedHead=false"

APPLY = """set -u
W={w}
export GIT_INDEX_FILE="$W/index" GIT_LITERAL_PATHSPECS=1
G="{git}"
$G read-tree HEAD || exit 90
$G add -A -f . || exit 91
pre=$($G write-tree) || exit 92
echo "PRE $pre"
if [ -s "$W/agent.diff" ]; then
  if $G apply --whitespace=nowarn "$W/agent.diff" 2>"$W/apply.err"; then echo "APPLY ok"
  elif $G apply --whitespace=nowarn --3way "$W/agent.diff" 2>>"$W/apply.err"; then echo "APPLY 3way"
  else echo "APPLY failed"; tail -c 2000 "$W/apply.err"; exit 0
  fi
else
  echo "APPLY empty"
fi
$G add -A -f . || exit 93
post=$($G write-tree) || exit 94
$G diff-tree -r -z --no-renames --name-status "$pre" "$post" > "$W/changed" || exit 95
echo "POST $post"
"""

RESTORE = """set -u
W={w}
export GIT_INDEX_FILE="$W/index" GIT_LITERAL_PATHSPECS=1
G="{git}"
if [ -s "$W/remove" ]; then xargs -0 rm -rf -- < "$W/remove" || exit 96; fi
if [ -s "$W/restore" ]; then $G checkout {pre} --pathspec-from-file="$W/restore" --pathspec-file-nul || exit 97; fi
find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {{}} + 2>/dev/null
find . -path ./.git -prune -o \\( -name '*.pyc' -o -name '*.pyo' \\) -type f -exec rm -f {{}} + 2>/dev/null
$G add -A -f . || exit 98
final=$($G write-tree) || exit 98
$G diff-tree -r -z --no-renames --name-status {pre} "$final" > "$W/changed2" || exit 98
echo "FINAL $final"
"""

TEST_PATCH = """set -u
W={w}
G="{git}"
if [ -s "$W/test.diff" ] && ! $G apply --whitespace=nowarn "$W/test.diff" 2>"$W/tp.err"; then
  cat "$W/tp.err" >&2
  # Does it apply to the task's own tree? Then the agent's changes are in its way.
  export GIT_INDEX_FILE="$W/index.tp"
  $G read-tree {pre} || exit 99
  if $G apply --cached --check --whitespace=nowarn "$W/test.diff" 2>/dev/null; then exit 98; fi
  exit 99
fi
echo "TEST_PATCH ok"
"""


@dataclass(frozen=True)
class Applied:
    """The tree the tests run on: the agent's unprotected changes plus the task's tests."""

    pre: str  # the untouched tree's id
    agent_files: frozenset[str]  # repository paths the agent's diff changed or added (and kept)


def name_status(raw: bytes) -> list[tuple[str, str]]:
    """`git diff-tree -z --name-status` output as (status, path) pairs."""
    parts = raw.decode("utf-8", errors="surrogateescape").split("\0")
    return [(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]


def marker(stdout: str, key: str) -> str | None:
    """The value of the script's `KEY value` line."""
    for line in stdout.splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1 :].strip()
    return None


async def apply(sb: Sandbox, a: Attempt, ws: Workspace) -> Applied:
    """Stage 3: the three steps of the module docstring, in order."""
    pre, changed = await _apply_diff(sb, a, ws)
    put_back = await _restore_protected(sb, a, ws, pre, changed)
    await _apply_test_patch(sb, a, ws, pre)
    return Applied(pre, frozenset(p for st, p in changed if st != "D") - put_back)


async def _apply_diff(sb: Sandbox, a: Attempt, ws: Workspace) -> tuple[str, list[tuple[str, str]]]:
    """Step 1: (pre tree, what the diff changed by the tree); `Decided` when it does not apply."""
    out = await exec_step(sb, "apply", APPLY.format(w=shlex.quote(ws.dir), git=GIT), a.cfg, a.cfg.apply_s)
    result = marker(out, "APPLY") or "unknown"
    a.ev["apply"] = result
    pre = marker(out, "PRE")
    if result == "failed":
        a.ev["apply_error"] = out.split("APPLY failed", 1)[-1].strip()[-2000:]
        status = Status.HACK_DETECTED if (TAMPER in a.flags and a.cfg.penalize_tamper) else Status.FAILED
        raise a.stop(status, "patch_apply_failed")
    if not pre or not marker(out, "POST"):
        raise GraderFault("apply", f"unexpected output: {out[-500:]}")
    return pre, name_status(await sb.read_file(f"{ws.dir}/changed"))


async def _restore_protected(
    sb: Sandbox, a: Attempt, ws: Workspace, pre: str, changed: list[tuple[str, str]]
) -> set[str]:
    """Step 2: put every protected path the tree says changed back; the paths put back."""
    extra = ws.protected
    remove = [p for st, p in changed if st == "A" and classify(p, extra) is not None]
    restore = [p for st, p in changed if st != "A" and classify(p, extra) is not None]
    for p in remove + restore:
        flag = flag_of(classify(p, extra))
        if flag:
            a.flags.append(flag)
    known = {s["path"] for s in ws.filtered.stripped}
    sneaked = sorted(p for p in remove + restore if p not in known)
    if sneaked:  # protected paths changed although our parse of the diff kept none of them
        a.flags.append(TAMPER)
        a.ev["sneaked_paths"] = sneaked
    a.ev["restored"] = sorted(remove + restore)
    await sb.write_file(f"{ws.dir}/remove", "".join(p + "\0" for p in remove).encode("utf-8", "surrogateescape"))
    await sb.write_file(f"{ws.dir}/restore", "".join(p + "\0" for p in restore).encode("utf-8", "surrogateescape"))
    res = await sb.exec(
        RESTORE.format(w=shlex.quote(ws.dir), git=GIT, pre=pre), timeout_s=a.cfg.step_timeout_s, cwd=a.cfg.repo_dir
    )
    if res.exit_code in (96, 97):  # only the agent's path games make rm/checkout of its own changes fail
        a.ev["restore_error"] = res.stderr.strip()[-800:]
        raise a.stop(a.tamper_status(), TAMPER, "restore_failed")
    if res.exit_code != 0 or not marker(res.stdout, "FINAL"):
        flag = "restore_timeout" if res.timed_out else None
        raise GraderFault("restore", f"exit {res.exit_code}: {res.stderr.strip()[-800:]}", flag)
    left = [p for _, p in name_status(await sb.read_file(f"{ws.dir}/changed2")) if classify(p, extra) is not None]
    if left:
        a.ev["unrestored"] = left
        raise a.stop(a.tamper_status(), TAMPER, "restore_incomplete")
    return set(remove + restore)


async def _apply_test_patch(sb: Sandbox, a: Attempt, ws: Workspace, pre: str) -> None:
    """Step 3: the task's test_patch; `Decided` when only the agent's changes are in its way."""
    tp = await sb.exec(
        TEST_PATCH.format(w=shlex.quote(ws.dir), git=GIT, pre=pre), timeout_s=a.cfg.step_timeout_s, cwd=a.cfg.repo_dir
    )
    if tp.exit_code == 98 and not tp.timed_out:
        a.ev["test_patch_error"] = (tp.stderr or tp.stdout).strip()[-800:]
        raise a.stop(Status.FAILED, "test_patch_conflict")
    if tp.exit_code != 0 or tp.timed_out:
        # 99: it does not apply to the untouched tree either, the task's own fault (no control needed)
        flag = "test_patch_timeout" if tp.timed_out else ("" if tp.exit_code == 99 else None)
        raise GraderFault("test_patch", f"exit {tp.exit_code}: {(tp.stderr or tp.stdout).strip()[-800:]}", flag)

"""Which function each calc rollout rewrote, judged against the test output it saw; per step, as JSON.

The quickstart's calc tasks (legorl/quickstart/) fail one function of three; the demonstrator
fixes the failing one `p_read` of the time and otherwise the first one the test output lists
(`habit = "first"`) or a listed one at random (`habit = "guess"`).
Whether GSPO teaches the policy to read the output shows in these shares, not in the reward
alone (a step's reward also moves with which tasks it drew):

    failing_first     the failing function, which is also listed first (the habit is right)
    failing_later     the failing function, listed after another (what GSPO must teach)
    first_not_failing the first-listed function, which passes (the habit, wrong)
    other_listed      another listed function, which passes
    unlisted          a name the output does not list
    no_fix            no `sed` line after the test output
and `renamed`, apart from the kinds: the share of `sed` fixes whose new line defines another
function than the one it replaces (`s|^def add.*|def xor(a, b): ...|`), a name not copied
even from a few tokens back in the same command.

and, for each held-out evaluation (its rollouts grouped by the policy version that wrote
them: 0 the start, then the warm start's, the end's, the control's; and by harness), how often the rollout
named the failing function by where the test output lists it (1st, 2nd, 3rd line). The
demonstrator's habit makes the 1st line the easy case; a policy that cannot copy a name
from that far back misses even that one.

    .venv/bin/python bench/fix_choices.py RUN_DIR [RUN_DIR ...]

Reads the run store (`run.sqlite`: each turn's new request items and tool calls); works for
any harness whose shell tool the policy calls with the demonstrator's `sed` line, and
mini-swe-agent's fenced commands.
"""

from __future__ import annotations

import collections
import json
import re
import sqlite3
import sys
from pathlib import Path

from legorl.quickstart.expert import failing_function, first_function, plain
from legorl.store.codec import unpack_text
from legorl.store.phase_steps import HELDOUT_STEP

KINDS = ("failing_first", "failing_later", "first_not_failing", "other_listed", "unlisted", "no_fix")
_LISTED = re.compile(r"^(?:PASS|FAIL) (\w+)", re.MULTILINE)
_SED_NAME = re.compile(r"def (\w+)")
_SED_PAIR = re.compile(r"\^def (\w+)\.\*\|def (\w+)\(")


def choice(observation: str, fixed: str | None) -> str:
    """The kind of one rollout's fix, given the test output before it (read as the
    demonstrator reads it: quickstart/expert.py)."""
    failing, first = failing_function(observation), first_function(observation)
    listed = _LISTED.findall(plain(observation))
    if fixed is None:
        return "no_fix"
    if fixed == failing:
        return "failing_first" if fixed == first else "failing_later"
    if fixed == first:
        return "first_not_failing"
    return "other_listed" if fixed in listed else "unlisted"


def _strings(node: object) -> list[str]:
    """Every string in a stored request's new items (message texts, tool results), in order."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        node = list(node.values())
    return [t for child in node for t in _strings(child)] if isinstance(node, list) else []


def rollout_choice(db: sqlite3.Connection, traj_id: int) -> str:
    observation, fixed, _ = observed(db, traj_id)
    return choice(observation, fixed)


def renamed(action: str) -> bool | None:
    """Whether a `sed` fix's new line defines another function than the one it replaces (None:
    no such pair to compare, e.g. a garbled command)."""
    m = _SED_PAIR.search(action)
    return None if m is None else m.group(1) != m.group(2)


def failing_position(observation: str) -> int | None:
    """Which listed line (1-based) of the test output names the failing function."""
    listed, failing = _LISTED.findall(plain(observation)), failing_function(observation)
    return listed.index(failing) + 1 if failing in listed else None


def observed(db: sqlite3.Connection, traj_id: int) -> tuple[str, str | None, bool | None]:
    """One rollout's last test output, the function its first fix after it rewrote, and
    whether that fix renamed it (`renamed`)."""
    observation, fixed, other = "", None, None
    rows = db.execute(
        "SELECT new_items, tool_calls, response_text FROM turns WHERE traj_id = ? AND side_call = 0 ORDER BY idx",
        (traj_id,),
    )
    for items, calls, text_reply in rows:
        action = (
            calls if calls and "sed" in calls else text_reply or ""
        )  # a tool call, or a fenced command (mini-swe-agent)
        text = "\n".join(_strings(json.loads(unpack_text(items) or "[]")))
        if "PASS " in text or "FAIL " in text:
            observation = text
        if fixed is None and observation and "sed" in action:
            m = _SED_NAME.search(action)
            fixed = m.group(1) if m else ""
            other = renamed(action)
    return observation, fixed, other


def heldout_by_position(db: sqlite3.Connection) -> list[dict[str, object]]:
    """Per held-out evaluation (by policy version, and by harness: a mixed run evaluates each
    checkpoint once per harness): the share of rollouts naming the failing function, by the
    line that lists it."""
    named: dict[tuple[int, str], dict[int, list[int]]] = collections.defaultdict(
        lambda: collections.defaultdict(lambda: [0, 0])
    )
    rows = db.execute(
        "SELECT t.id, tu.policy_version, t.harness FROM trajectories t "
        "JOIN turns tu ON tu.traj_id = t.id AND tu.idx = 0 WHERE t.step = ? AND t.masked = 0",
        (HELDOUT_STEP,),
    )
    pairs: dict[tuple[int, str], list[int]] = collections.defaultdict(lambda: [0, 0])  # renamed, comparable
    for traj_id, version, harness in rows.fetchall():
        observation, fixed, other = observed(db, traj_id)
        key = (int(version or 0), harness or "")
        if other is not None:
            pairs[key][0] += other
            pairs[key][1] += 1
        if (pos := failing_position(observation)) is not None:
            cell = named[key][pos]
            cell[0] += choice(observation, fixed).startswith("failing")
            cell[1] += 1
    return [
        {
            "policy_version": v,
            "harness": h,
            "named_failing_by_line": {str(p): round(k / n, 3) for p, (k, n) in sorted(named[v, h].items())},
            "rollouts_by_line": {str(p): n for p, (_, n) in sorted(named[v, h].items())},
            "renamed": round(pairs[v, h][0] / pairs[v, h][1], 3) if pairs[v, h][1] else None,
        }
        for v, h in sorted(named)
    ]


def run_choices(run_dir: Path) -> dict[str, object]:
    db = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    counts: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    rewards: dict[int, float] = collections.defaultdict(float)
    pairs: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])  # renamed, comparable
    for traj_id, step, reward in db.execute("SELECT id, step, reward FROM trajectories WHERE step >= 0 AND masked = 0"):
        observation, fixed, other = observed(db, traj_id)
        counts[step][choice(observation, fixed)] += 1
        rewards[step] += reward or 0.0
        if other is not None:
            pairs[step][0] += other
            pairs[step][1] += 1
    steps = []
    for step in sorted(counts):
        n = sum(counts[step].values())
        shares = {k: round(counts[step][k] / n, 3) for k in KINDS}
        k, m = pairs[step]
        renamed_share = round(k / m, 3) if m else None
        steps.append(
            {"step": step, "rollouts": n, "reward": round(rewards[step] / n, 3), **shares, "renamed": renamed_share}
        )
    return {"run": str(run_dir), "steps": steps, "heldout": heldout_by_position(db)}


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: bench/fix_choices.py RUN_DIR [RUN_DIR ...]")
    missing = [d for d in sys.argv[1:] if not (Path(d) / "run.sqlite").is_file()]
    if missing:
        sys.exit(f"fix_choices: no run.sqlite in {', '.join(missing)}")
    print(json.dumps([run_choices(Path(d)) for d in sys.argv[1:]], indent=1))


if __name__ == "__main__":
    main()

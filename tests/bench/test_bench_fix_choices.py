"""bench/fix_choices.py names each calc fix's kind from the test output the rollout saw."""

from __future__ import annotations

import json
import sqlite3

import pytest

from bench.fix_choices import choice, rollout_choice
from legorl.store.codec import pack_text

OUTPUT = "Exit code 1\nPASS mod\nFAIL shl: got 24, expected 96\nPASS pow"


@pytest.mark.parametrize(
    ("fixed", "kind"),
    [
        ("shl", "failing_later"),
        ("mod", "first_not_failing"),
        ("pow", "other_listed"),
        ("sub", "unlisted"),
        (None, "no_fix"),
    ],
)
def test_each_fix_is_judged_against_the_output(fixed: str | None, kind: str) -> None:
    assert choice(OUTPUT, fixed) == kind


def test_a_failing_function_listed_first_is_the_habit_and_right() -> None:
    assert choice("FAIL add: got 1, expected 3\nPASS sub\nPASS mul", "add") == "failing_first"


def _turns_db(rows: list[tuple[int, object, str | None, str]]) -> sqlite3.Connection:
    """A run store's `turns` columns that the bench reads, one rollout (traj_id 1)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE turns (traj_id, idx, side_call, new_items, tool_calls, response_text)")
    for idx, items, calls, text in rows:
        db.execute("INSERT INTO turns VALUES (1, ?, 0, ?, ?, ?)", (idx, pack_text(json.dumps(items)), calls, text))
    return db


FIX = "sed -i 's|^def shl.*|def shl(a, b): return a << b|' calc.py"


def test_a_tool_call_fix_is_read_from_the_call() -> None:
    db = _turns_db(
        [
            (0, [{"role": "user", "content": "Fix calc.py"}], None, ""),
            (1, [OUTPUT], json.dumps([{"name": "Bash", "arguments": json.dumps({"command": FIX})}]), ""),
        ]
    )
    assert rollout_choice(db, 1) == "failing_later"


def test_a_fenced_command_fix_is_read_from_the_reply_text() -> None:
    """mini-swe-agent: no tool call, the command is a fenced block in the reply."""
    db = _turns_db(
        [(0, ["Fix calc.py"], "[]", ""), (1, [{"content": OUTPUT}], "[]", f"```mswea_bash_command\n{FIX}\n```")]
    )
    assert rollout_choice(db, 1) == "failing_later"


def test_heldout_rollouts_are_split_by_evaluation_and_by_the_failing_line() -> None:
    """Each held-out evaluation (its policy version) apart; a fix counted by the line that
    lists the failing function; GSPO steps' rollouts are not evaluations."""
    from bench.fix_choices import failing_position, heldout_by_position

    first = "FAIL add: got 1, expected 3\nPASS sub\nPASS mul"
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE trajectories (id, step, masked, harness)")
    db.execute("CREATE TABLE turns (traj_id, idx, side_call, policy_version, new_items, tool_calls, response_text)")

    def rollout(tid: int, step: int, version: int, output: str, name: str, harness: str = "claude-code") -> None:
        fix = json.dumps([{"name": "Bash", "arguments": json.dumps({"command": FIX.replace("shl", name)})}])
        db.execute("INSERT INTO trajectories VALUES (?, ?, 0, ?)", (tid, step, harness))
        for idx, items, calls in [(0, ["Fix calc.py"], "[]"), (1, [output], fix)]:
            db.execute(
                "INSERT INTO turns VALUES (?, ?, 0, ?, ?, ?, '')",
                (tid, idx, version, pack_text(json.dumps(items)), calls),
            )

    rollout(1, -2, 1, first, "add")  # the warm start: failing on line 1, named
    rollout(2, -2, 1, OUTPUT, "mod")  # failing on line 2, the first listed named instead
    rollout(3, -2, 5, OUTPUT, "shl")  # the end: failing on line 2, named
    rollout(4, 0, 3, OUTPUT, "shl")  # a GSPO step's rollout
    rollout(5, -2, 5, OUTPUT, "mod", "opencode")  # a mixed run's end, evaluated through another harness
    assert failing_position(OUTPUT) == 2 and failing_position(first) == 1
    cc = {"harness": "claude-code"}
    assert heldout_by_position(db) == [
        {
            "policy_version": 1,
            **cc,
            "named_failing_by_line": {"1": 1.0, "2": 0.0},
            "rollouts_by_line": {"1": 1, "2": 1},
            "renamed": 0.0,
        },
        {"policy_version": 5, **cc, "named_failing_by_line": {"2": 1.0}, "rollouts_by_line": {"2": 1}, "renamed": 0.0},
        {
            "policy_version": 5,
            "harness": "opencode",
            "named_failing_by_line": {"2": 0.0},
            "rollouts_by_line": {"2": 1},
            "renamed": 0.0,
        },
    ]


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (FIX, False),
        ("sed -i 's|^def add.*|def xor(a, b): return a ^ b|' calc.py", True),
        ('sed -i \'s|^def add.*|defume": "terge', None),
    ],
)
def test_a_fix_that_defines_another_function_than_it_replaces_is_renamed(action: str, expected: bool | None) -> None:
    """The copy inside one command: the new line must define the function the `sed` address
    names; a garbled command has no pair to compare."""
    from bench.fix_choices import renamed

    assert renamed(action) is expected

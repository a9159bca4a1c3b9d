"""bench/fix_choices.py names each calc fix's kind from the test output the rollout saw."""

from __future__ import annotations

import pytest

from bench.fix_choices import choice

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

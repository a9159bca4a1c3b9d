"""Issue text for a generated task, written from what its failing tests report.

SWE-smith has a language model write the issue from the bug and its failing tests; here
there is no model, so the issue is assembled from the evidence a user would paste into a
bug report: which tests fail and their assertion output. It never names the mutated file,
line or kind of mutation, only behaviour a user could observe.
"""

from __future__ import annotations

import hashlib
import re

_OPENERS = (
    "After upgrading I noticed that {subject} no longer behaves as documented.",
    "{subject} gives wrong results in some cases.",
    "There seems to be a regression in {subject}.",
    "I think {subject} is broken.",
)
_CLOSERS = (
    "Could you take a look? The expected values in the assertions are what the documentation promises.",
    "The tests above pass on the released version, so this looks like a regression in the library code.",
    "Please fix the library so these cases work again; the tests themselves are correct.",
)


def _subject(test_ids: list[str]) -> str:
    names = []
    for tid in test_ids:
        last = tid.split("::")[-1]
        last = re.sub(r"\[.*\]$", "", last)
        last = re.sub(r"^test_?", "", last)
        if last and last not in names:
            names.append(last)
    if not names:
        return "the library"
    if len(names) == 1:
        return f"`{names[0]}`"
    shown = ", ".join(f"`{n}`" for n in names[:3])
    return f"some functions ({shown}{', …' if len(names) > 3 else ''})"


def _trim_failure(text: str, max_lines: int = 25) -> str:
    """Keep the lines a person would quote: the failing source lines and the `E` lines."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith("    ") or ln.lstrip().startswith(("assert", "E "))]
    keep = keep or lines
    if len(keep) > max_lines:
        keep = keep[: max_lines // 2] + ["..."] + keep[-max_lines // 2 :]
    return "\n".join(keep)


def problem_statement(project: str, fail_to_pass: list[str], failures: dict[str, str], seed: str) -> str:
    """The issue text: an opener, the failing tests, up to three failure excerpts, a closer."""
    h = int(hashlib.sha256(seed.encode()).hexdigest(), 16)
    subject = _subject(fail_to_pass)
    parts = [_OPENERS[h % len(_OPENERS)].format(subject=subject), ""]
    parts.append(f"Running {project}'s test suite, these tests fail:")
    parts.append("")
    shown = sorted(fail_to_pass)
    for tid in shown[:10]:
        parts.append(f"- `{tid}`")
    if len(shown) > 10:
        parts.append(f"- … and {len(shown) - 10} more")
    excerpts = [(tid, failures[tid]) for tid in shown if failures.get(tid)][:3]
    for tid, text in excerpts:
        parts += ["", f"Output of `{tid}`:", "", "```", _trim_failure(text), "```"]
    parts += ["", _CLOSERS[(h // 7) % len(_CLOSERS)]]
    return "\n".join(parts).strip() + "\n"

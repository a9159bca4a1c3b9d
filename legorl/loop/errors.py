"""`RunError`: a run cannot start or go on for a reason the operator can fix.

Raised before anything is trained on (a sandbox backend that cannot start a sandbox, a
harness driver that never became ready, a warm-start checkpoint that does not fit the
model, a warm start with nothing to imitate); `legorl` prints its message as one line and
exits non-zero. Whatever the run store already holds stays there.
"""

from __future__ import annotations


class RunError(RuntimeError):
    """What went wrong and what to do about it, in one message."""

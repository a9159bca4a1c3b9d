"""The run-store steps that are phases of a run, not GSPO steps, and their names.

`legorl train` writes the held-out evaluations' rollouts (start, warm start, end, control)
under step `HELDOUT_STEP` and the warm start's demonstrations (and its SFT metrics) under
`WARM_START_STEP`; GSPO steps are 0, 1, 2, ... So a negative step is never a step number
to show a person: the UI and the store's queries name it instead (`phase_name`).
"""

from __future__ import annotations

HELDOUT_STEP = -2  # the run-store step of held-out evaluation rollouts
WARM_START_STEP = -1  # the run-store step of the warm start's demonstrations
PHASES = {HELDOUT_STEP: "held-out evaluation", WARM_START_STEP: "warm start"}
EVAL_PHASES = ("start", "warm_start", "end", "control")  # the held-out evaluations, in run order


def phase_name(step: int | None) -> str | None:
    """The phase a run-store step stands for, or None for a GSPO step (or no step)."""
    return None if step is None else PHASES.get(int(step))


def eval_session_tag(label: str) -> str:
    """The session-id prefix of a held-out evaluation's rollouts (`eval-end-mini-swe-agent`
    for `end@mini-swe-agent`: a session id names a proxy route, so no `@`)."""
    return "eval-" + label.replace("@", "-")


def eval_phase(session_id: str) -> str | None:
    """Which evaluation (`start`, `warm_start`, `end`, `control`) a held-out rollout's session
    belongs to, from its id; None for a session that is not one."""
    for phase in EVAL_PHASES:
        if session_id.startswith(eval_session_tag(phase) + "-"):
            return phase
    return None

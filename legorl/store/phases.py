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


def phase_name(step: int | None) -> str | None:
    """The phase a run-store step stands for, or None for a GSPO step (or no step)."""
    return None if step is None else PHASES.get(int(step))

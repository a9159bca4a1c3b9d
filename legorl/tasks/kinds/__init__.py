"""Task kinds: what a task's format decides, said in one place per format.

A task's `kind` field chooses its kind once (`kind_of(task)`); the kind says, in its own
module, everything that differs between formats (the protocol is `base.TaskKind`):
- its image (`image`: the layers it is built from);
- its agent stage (`agent_stage`: workdir, environment, limits and time of the agent's sandbox);
- the agent's changes (`changes`: taken from the agent's sandbox; `is_empty`);
- how it is graded in a fresh sandbox (`grade_sandbox`, `grade_in`, `diff_in`) and its oracle
  (`oracle`, `judge_oracle`: what `legorl tasks validate` and the pre-flight check);
- the `[sandbox]` knobs it cannot honour (`refuses`), refused when the config loads
  (`unhonoured`).
Nothing else switches on a task's format: the rollout (`rollout.py`), grading's one
attempt/control/infra wrapper (`verify/grade.py:grade`), the images (`tasks/image.py`), the
oracle check (`tasks/validate.py`) and the pre-flight ask the task's kind.

Built-ins are found through `KINDS` (name → `module:Class`, imported only when chosen, as
harnesses are in `harness/registry.py`): `swebench` (SWE-bench-format rows: ours, official
instances, the SWE-family rows, the quickstart's calc tasks; `Task.kind == ""`) and `harbor`
(Harbor task directories). `register_kind` adds one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from legorl.tasks.kinds.base import TaskKind
    from legorl.types import Task

KINDS: dict[str, str] = {
    "swebench": "legorl.tasks.kinds.swebench:SweBenchRow",
    "harbor": "legorl.tasks.kinds.harbor:HarborDir",
}
DEFAULT = "swebench"  # the kind of a task whose `kind` is "" (every SWE-bench-format row)


def register_kind(name: str, target: str) -> None:
    """Add a kind: `target` is `module:Class`, a class taking the task (see `base.TaskKind`)."""
    if ":" not in target:
        raise ValueError(f"task kind {name!r}: expected 'module:Class', got {target!r}")
    KINDS[name] = target


def kind_class(name: str) -> type[TaskKind]:
    """The class of kind `name` ("" is the default kind)."""
    name = name or DEFAULT
    if name not in KINDS:
        raise ValueError(f"unknown task kind {name!r}; known: {', '.join(KINDS)}")
    module, _, attr = KINDS[name].partition(":")
    cls: type[TaskKind] = getattr(importlib.import_module(module), attr)
    return cls


def kind_of(task: Task) -> TaskKind:
    """The task's kind, bound to it: choose it once and pass it along."""
    return kind_class(task.kind)(task)


def source_kind(source: str | Path) -> str:
    """The kind of the tasks a `[run] tasks` source holds, as `tasks/loader.py` reads one: a
    directory holds Harbor tasks; a file (or `shipped`, `quickstart-calc`) SWE-bench rows."""
    return "harbor" if Path(source).is_dir() else DEFAULT


def unhonoured(source: str | Path, changed: Mapping[str, object]) -> str | None:
    """One line refusing the first `[sandbox]` knob in `changed` (those set away from their
    defaults) that the kind of `source`'s tasks cannot honour; None when it honours them all."""
    if not changed:
        return None
    cls = kind_class(source_kind(source))
    for knob, why in cls.refuses.items():
        if knob in changed:
            return (
                f"sandbox.{knob} = {changed[knob]!r} is not honoured for {cls.title} ({source}): {why}; "
                f"remove it from [sandbox]"
            )
    return None

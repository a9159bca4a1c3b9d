"""Harbor task directories as a task kind: an environment, graded by its verifier's reward.

The task's parsed `task.toml` and Dockerfile (`HarborSpec`, `tasks/harbor.py`) are read
once, when the kind is made for the task, and travel with it: the image is the Dockerfile
built over the mapped base (`tasks/harbor_image.py`); the agent works in the task's workdir
with its ENV, limits and agent timeout; its changes are the workdir's state against the
image's manifest (`verify/state.py`); grading applies them in a fresh sandbox and reads the
reward `tests/test.sh` writes (`verify/state_grade.py`); the oracle is `solution/solve.sh`
(`tasks/harbor_validate.py`).

Of the `[sandbox]` grading knobs it honours `penalize_tamper` (a forged reward file is
`hack_detected`, or `failed` when off) and `grade_empty_diff`; the task itself says the
rest (`refuses`), so a run that sets one is refused when its config loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cached_property
from typing import ClassVar

from legorl.sandbox.base import Backend, Sandbox, SandboxSpec
from legorl.tasks.harbor import HarborSpec, harbor_spec
from legorl.tasks.harbor_image import ensure_harbor_image, resolve_base
from legorl.tasks.harbor_validate import judge_harbor, oracle_changes
from legorl.tasks.kinds.base import AgentStage, Images
from legorl.types import Outcome, Task
from legorl.verify import state
from legorl.verify.attempt import GradeConfig
from legorl.verify.state_grade import grade_in, workdir_changes


class HarborDir:
    """A Harbor task (`Task.kind == "harbor"`, `Task.task_dir` its directory)."""

    name: ClassVar[str] = "harbor"
    title: ClassVar[str] = "Harbor tasks"
    refuses: ClassVar[Mapping[str, str]] = {
        "agent_timeout_s": "each agent's time is its task.toml's [agent] timeout_sec",
        "memory_mb": "each agent's memory is its task.toml's [environment] memory",
        "cpus": "each agent's CPUs are its task.toml's [environment] cpus",
        "disk_mb": "each agent's disk is its task.toml's [environment] storage",
        "test_timeout_s": "each verifier runs within its task.toml's [verifier] timeout_sec",
        "max_diff_bytes": "the workdir's changes are bounded by the state's own limit (64 MiB, verify/state.py)",
    }

    def __init__(self, task: Task, spec: HarborSpec | None = None) -> None:
        self.task = task
        if spec is not None:
            self.__dict__["spec"] = spec

    @cached_property
    def spec(self) -> HarborSpec:
        """The task directory's settings, read on first use (a cached image needs none)."""
        return harbor_spec(self.task)

    async def image(self, images: Images) -> str:
        """environment/Dockerfile built as one layer over the mapped base (both backends)."""

        async def build() -> str:
            target = resolve_base(self.spec.dockerfile.base)
            parent = await images.base() if target == "base" else images.store.get(target)
            return (await ensure_harbor_image(images.store, parent, self.spec)).key

        return await images.built(("harbor", self.task.task_dir, "", ""), build)

    def agent_stage(self, default: AgentStage) -> AgentStage:
        """The task's workdir, ENV, limits and agent timeout; the run's pids and output limits."""
        spec = self.spec
        limits = dataclasses.replace(spec.limits, pids=default.limits.pids, output_bytes=default.limits.output_bytes)
        return AgentStage(workdir=spec.workdir, timeout_s=spec.agent_timeout_s, limits=limits, env=spec.env)

    async def changes(self, sb: Sandbox, workdir: str) -> str:
        """No repository: the workdir's changes as files (`verify/state.py`)."""
        return await workdir_changes(sb, workdir)

    def is_empty(self, changes: str) -> bool:
        return state.is_empty(changes)

    def grade_sandbox(self, image: str, cfg: GradeConfig) -> SandboxSpec:
        """The task's own limits, workdir and ENV, as the agent had."""
        spec = self.spec
        return SandboxSpec(image=image, limits=spec.limits, workdir=spec.workdir, env=spec.env)

    async def grade_in(self, sb: Sandbox, changes: str, cfg: GradeConfig, st: dict[str, str]) -> Outcome:
        return await grade_in(sb, self.spec, changes, cfg, st)

    def diff_in(self, step: str) -> bool:
        """Only the verifier runs the agent's code: a fault while it runs, or a reward it did
        not leave, may be the changes' doing; one while they are applied is the machinery's."""
        return step in ("tests", "reward")

    async def oracle(self, backend: Backend, image: str) -> str:
        """The workdir changes solution/solve.sh makes, run as Harbor runs it."""
        return await oracle_changes(self.task, backend, image, self.spec)

    def judge_oracle(self, gold: Outcome, empty: Outcome) -> list[str]:
        return judge_harbor(gold, empty)

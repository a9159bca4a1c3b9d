"""The `TaskKind` protocol: what one task format says, in one place.

A kind is a class taking the task (`Kind(task)`), made once per task by `kind_of` and passed
along, so what it read (a Harbor task's parsed task.toml) travels with it instead of living
in a module-global cache. No implementation inheritance: each kind writes out its own
methods, however short.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from legorl.sandbox.base import Backend, Limits, Sandbox, SandboxSpec
from legorl.sandbox.images import ImageRef, ImageStore
from legorl.types import Outcome, Task
from legorl.verify.attempt import GradeConfig


@dataclass(frozen=True)
class AgentStage:
    """The agent sandbox's settings a kind may shape: where the agent works, with which
    variables, within which limits and how long (the rollout's `RolloutConfig` fields)."""

    workdir: str
    timeout_s: float
    limits: Limits
    env: dict[str, str] = field(default_factory=dict)


class Images(Protocol):
    """What a kind builds its image with (`tasks/image.py`'s `TaskImages`)."""

    store: ImageStore

    async def base(self) -> ImageRef:
        """The cached base layer every image starts from."""
        ...

    async def built(self, ident: tuple[object, ...], build: Callable[[], Awaitable[str]]) -> str:
        """The key `build()` makes, made once per `ident` (per process) and made startable."""
        ...

    async def ready(self, key: str) -> str:
        """`key`, made startable by the sandbox backend (`Backend.ensure_image`)."""
        ...


class TaskKind(Protocol):
    """One task format: its image, its agent stage, the agent's changes, its grading."""

    name: ClassVar[str]  # its name in `KINDS`: the `Task.kind` it serves ("" is `swebench`)
    title: ClassVar[str]  # how messages name its tasks ("Harbor tasks")
    # The `[sandbox]` knobs it cannot honour → why (one line); refused when the config loads.
    refuses: ClassVar[Mapping[str, str]]
    task: Task

    async def image(self, images: Images) -> str:
        """The task image's cache key, built if missing and startable by the backend."""
        ...

    def agent_stage(self, default: AgentStage) -> AgentStage:
        """The agent sandbox's settings, from the run's (`default`) and the task's own."""
        ...

    async def changes(self, sb: Sandbox, workdir: str) -> str:
        """The agent's changes, taken from its sandbox after the harness ran (DiffError when
        the sandbox cannot produce them: the agent's doing)."""
        ...

    def is_empty(self, changes: str) -> bool:
        """Did the agent change nothing?"""
        ...

    def grade_sandbox(self, image: str, cfg: GradeConfig) -> SandboxSpec:
        """The fresh sandbox one grading attempt runs in."""
        ...

    async def grade_in(self, sb: Sandbox, changes: str, cfg: GradeConfig, state: dict[str, str]) -> Outcome:
        """One grading attempt in the fresh sandbox `sb`. A fault of the machinery raises
        `GraderFault` (its `flag`: the class it is graded as should the control run clean) or
        `SandboxError`; `state["step"]` says how far it got."""
        ...

    def diff_in(self, step: str) -> bool:
        """Could a fault at `step` be the agent's changes' doing (an empty-change control
        attempt then decides whose it is), or is it the machinery's alone (masked)?"""
        ...

    async def oracle(self, backend: Backend, image: str) -> str:
        """The changes that solve the task (a gold patch, a solution's workdir changes);
        ValueError, a finding about the task, when there are none."""
        ...

    def judge_oracle(self, gold: Outcome, empty: Outcome) -> list[str]:
        """What is wrong with the task given the oracle's and the empty changes' outcomes."""
        ...

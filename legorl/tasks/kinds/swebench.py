"""SWE-bench-format rows as a task kind: a repository at `base_commit`, graded by its tests.

Every row the loader reads from a file is one: ours, official instances, the SWE-family
rows (`tasks/family.py`), the quickstart's calc tasks. The agent works in the repository;
its changes are `git diff` against `base_commit`; grading applies that diff in a fresh
sandbox with every test file restored and runs the task's tests (`verify/grade.py:grade_in`,
five stages); the oracle is the row's gold `patch`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import ClassVar

from legorl.sandbox.base import Backend, Sandbox, SandboxSpec
from legorl.sandbox.images import EnvSpec
from legorl.sandbox.layers import ensure_env, ensure_task
from legorl.tasks.image import materialize_repo
from legorl.tasks.kinds.base import AgentStage, Images
from legorl.tasks.prebuilt import import_image, is_cache_key
from legorl.types import Outcome, Status, Task
from legorl.verify.attempt import GradeConfig
from legorl.verify.grade import grade_in
from legorl.verify.junit import TestStatus


class SweBenchRow:
    """A SWE-bench-format task (`Task.kind == ""`); it honours every `[sandbox]` knob."""

    name: ClassVar[str] = "swebench"
    title: ClassVar[str] = "SWE-bench-format tasks"
    refuses: ClassVar[Mapping[str, str]] = {}

    def __init__(self, task: Task) -> None:
        self.task = task

    async def image(self, images: Images) -> str:
        """A named image as it is (a cache key) or imported (a Docker image, `prebuilt.py`),
        else base → [env: the wheels its tests need] → the repository at `base_commit`."""
        task = self.task
        if task.image and not await asyncio.to_thread(is_cache_key, images.store, task.image):
            ident = ("image", task.image, task.base_commit, task.env_setup)
            return await images.built(ident, lambda: self._import(images))
        if task.image:
            return await images.ready(task.image)
        ident = (task.repo_path, task.base_commit, task.env_setup, tuple(task.requirements))
        return await images.built(ident, lambda: self._build(images))

    async def _import(self, images: Images) -> str:
        """A Docker image by reference: imported once with its repository taken out, then the
        task layer on it as for any task (time-safe history)."""
        task = self.task
        layer, source = await import_image(images.store, task.image)
        setup = [task.env_setup] if task.env_setup.strip() else []
        return (await ensure_task(images.store, layer, source, task.base_commit, setup=setup)).key

    async def _build(self, images: Images) -> str:
        task = self.task
        base = await images.base()
        if task.requirements:  # wheels its tests need, installed offline (from scripts/setup_swebench.sh's cache)
            from legorl.tasks.generator.native import wheels_dir

            if not wheels_dir().is_dir():
                raise FileNotFoundError(
                    f"task {task.instance_id}: {wheels_dir()} is missing: run scripts/setup_swebench.sh"
                )
            spec = EnvSpec(pip=tuple(task.requirements), wheel_dirs=(str(wheels_dir()),))
            base = await ensure_env(images.store, base, spec)
        repo = await asyncio.to_thread(materialize_repo, task.repo_path, images.store.root)
        setup = [task.env_setup] if task.env_setup.strip() else []
        return (await ensure_task(images.store, base, repo, task.base_commit, setup=setup)).key

    def agent_stage(self, default: AgentStage) -> AgentStage:
        """The run's settings, as they are."""
        return default

    async def changes(self, sb: Sandbox, workdir: str) -> str:
        """`git diff` of the repository against `base_commit` (the sandbox knows where it is)."""
        return await sb.diff(self.task.base_commit)

    def is_empty(self, changes: str) -> bool:
        return not changes.strip()

    def grade_sandbox(self, image: str, cfg: GradeConfig) -> SandboxSpec:
        return SandboxSpec(image=image, limits=cfg.limits, workdir=cfg.repo_dir)

    async def grade_in(self, sb: Sandbox, changes: str, cfg: GradeConfig, state: dict[str, str]) -> Outcome:
        """The five stages (`verify/grade.py:grade_in`), once each, in order."""
        return await grade_in(sb, self.task, changes, cfg, state)

    def diff_in(self, step: str) -> bool:
        """From the apply stage on, the diff is in the tree: any fault may be its doing."""
        return step not in ("prepare", "start")

    async def oracle(self, backend: Backend, image: str) -> str:
        """The row's gold patch."""
        return self.task.patch

    def judge_oracle(self, gold: Outcome, empty: Outcome) -> list[str]:
        return judge(self.task, gold, empty)


def judge(task: Task, gold: Outcome, empty: Outcome) -> list[str]:
    """What is wrong with a task given its gold and empty outcomes (empty list: valid).
    Stricter than "resolved vs not", as SWE-bench's own validation: with the empty patch
    every FAIL_TO_PASS test must fail and every PASS_TO_PASS test pass."""
    problems = []
    for name, out in (("gold", gold), ("empty", empty)):
        if out.masked or out.status.is_infra:
            problems.append(f"{name} patch: infrastructure error: {out.evidence.get('errors', out.evidence)}")
    if problems:
        return problems
    if gold.status is not Status.RESOLVED:
        bad = {t: s for t, s in gold.tests.items() if not TestStatus(s).ok}
        problems.append(f"gold patch: {gold.status.value} (flags {gold.flags}); failing: {dict(list(bad.items())[:5])}")
    if empty.status is Status.RESOLVED:
        problems.append("empty patch: resolved (the tests do not detect the bug)")
    still_pass = [t for t in task.FAIL_TO_PASS if TestStatus(empty.tests.get(t, "missing")).ok]
    if still_pass:
        problems.append(f"empty patch: FAIL_TO_PASS tests pass without the fix: {still_pass[:5]}")
    broken = [t for t in task.PASS_TO_PASS if not TestStatus(empty.tests.get(t, "missing")).ok]
    if broken:
        problems.append(f"empty patch: PASS_TO_PASS tests fail without the fix: {broken[:5]}")
    return problems

"""The oracle check of a Harbor task: `solution/solve.sh` scores 1, doing nothing scores 0.

The oracle runs as Harbor runs it: solution/ copied to /solution in a sandbox from the task
image (never in the image itself), `solve.sh` run from the workdir as the image's USER
within `[agent] timeout_sec`; its workdir changes are then graded exactly as an agent's
(`legorl/verify/state_grade.py`: fresh sandbox, tests copied in only then). The Harbor kind
(`tasks/kinds/harbor.py`) names these as its oracle; `tasks/validate.py` grades both.
"""

from __future__ import annotations

from legorl.sandbox.base import Backend, DiffError, SandboxSpec
from legorl.tasks.harbor import HarborSpec, harbor_spec
from legorl.tasks.harbor_image import as_user
from legorl.types import Outcome, Task
from legorl.verify.state_grade import copy_dir, workdir_changes


async def oracle_changes(task: Task, backend: Backend, image: str, spec: HarborSpec | None = None) -> str:
    """The workdir changes solve.sh makes; ValueError (a finding about the task) if it fails.
    `spec`: the task's, when the caller has read it already."""
    spec = spec or harbor_spec(task)
    if not (spec.solution_dir / "solve.sh").is_file():
        raise ValueError(f"{spec.root}: no solution/solve.sh to check the task with")
    sb = await backend.start(SandboxSpec(image=image, limits=spec.limits, workdir=spec.workdir, env=spec.env))
    async with sb:
        await copy_dir(sb, spec.solution_dir, "/solution")
        run = await sb.exec(
            as_user(spec.user, "chmod +x /solution/solve.sh 2>/dev/null; exec /solution/solve.sh"),
            timeout_s=spec.agent_timeout_s,
            cwd=spec.workdir,
        )
        if run.timed_out or run.exit_code != 0:
            why = "timed out" if run.timed_out else f"exit {run.exit_code}"
            raise ValueError(f"solution/solve.sh failed ({why}): {(run.stdout + run.stderr).strip()[-600:]}")
        try:
            return await workdir_changes(sb, spec.workdir)
        except DiffError as exc:
            raise ValueError(f"solution/solve.sh left no readable workdir: {exc}") from None


def judge_harbor(gold: Outcome, empty: Outcome) -> list[str]:
    """What is wrong given the oracle's and the empty run's outcomes (empty list: valid)."""
    problems = []
    for name, out in (("solution/solve.sh", gold), ("doing nothing", empty)):
        if out.masked or out.status.is_infra:
            problems.append(f"{name}: infrastructure error: {out.evidence.get('errors', out.evidence)}")
    if problems:
        return problems
    if gold.reward != 1.0:
        problems.append(f"solution/solve.sh: reward {gold.reward} (expected 1); flags {gold.flags}")
    if empty.reward != 0.0:
        problems.append(f"doing nothing: reward {empty.reward} (expected 0): the verifier does not detect the task")
    return problems


__all__ = ["judge_harbor", "oracle_changes"]

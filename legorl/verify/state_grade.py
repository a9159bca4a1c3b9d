"""State grading: a Harbor task is graded by the reward its own verifier writes.

`grade(task, diff, ...)` (`verify/grade.py`, the one attempt/control/infra wrapper) runs a
Harbor task's attempt here through its kind (`tasks/kinds/harbor.py`): the SWE-bench path
grades test ids, this one the workdir's *state*. One attempt (`grade_in`), in a fresh
sandbox from the task image:

1. apply the agent's changes to the workdir (`state.py`: files only, untrusted, checked
   entry by entry; nothing under /logs, /tests or /solution crosses);
2. only then create /logs/verifier empty, owned by the user who runs the verifier, and
   copy in tests/ (the agent never had them);
3. run tests/test.sh as that user (`[verifier] user`, else the image's USER) from the
   workdir, within `[verifier] timeout_sec`, with `[verifier] env`;
4. read the reward as Harbor does: /logs/verifier/reward.json (name → number; its "reward",
   else the mean, is the scalar; `rewards.json`, the name Harbor's task template uses, is
   read the same way) before /logs/verifier/reward.txt (one number).

Failure classes: the verifier timing out is the agent's (its code hangs the tests: 0, any
reward file ignored). A verifier that writes no (readable) reward, or a sandbox lost while
it runs, is decided by a control run with the unchanged workdir, as SWE-bench grading
does: if the control yields a reward, the agent's changes broke the verifier (0,
`no_reward`); if not, the task or the machinery is at fault (masked `infra_error`).
A reward file the agent planted never counts: its sandbox's /logs never crosses, and the
directory is made fresh after its changes are applied; one the agent's code wrote while the
verifier ran is `hack_detected` (`failed` with `[sandbox] penalize_tamper = false`).
"""

from __future__ import annotations

import json
import math
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from legorl.sandbox.base import DiffError, Sandbox, SandboxError
from legorl.types import Outcome, Status
from legorl.verify import state
from legorl.verify.attempt import GradeConfig, GraderFault
from legorl.verify.verdict import TAMPER

if TYPE_CHECKING:
    from legorl.tasks.harbor import HarborSpec

VERIFIER_DIR = "/logs/verifier"
REWARD_JSON = f"{VERIFIER_DIR}/reward.json"
REWARD_TXT = f"{VERIFIER_DIR}/reward.txt"
REWARDS_JSON = f"{VERIFIER_DIR}/rewards.json"  # the name Harbor's task template uses for reward.json


class NoReward(GraderFault):
    """The verifier wrote no reward we can read: the agent's (`no_reward`) only when the
    unchanged workdir's control attempt yields one."""

    def __init__(self, message: str) -> None:
        super().__init__("reward", message, "no_reward")


async def workdir_changes(sb: Sandbox, workdir: str) -> str:
    """The workdir's changes against the image manifest (`state.py` text). DiffError when the
    agent's sandbox cannot produce them (its doing: it may have broken python3)."""
    await sb.write_file(state.SCRIPT, state.SOURCE.encode())
    res = await sb.exec(
        state.run_script("diff", workdir, state.MANIFEST), timeout_s=300, cwd="/", output_limit=state.MAX_STATE_BYTES
    )
    if res.truncated:
        raise DiffError(f"the workdir's changes are over {state.MAX_STATE_BYTES} bytes")
    if res.exit_code != 0 or not res.stdout.startswith(state.HEADER + " "):
        raise DiffError(f"no workdir state (exit {res.exit_code}): {res.stderr.strip()[-500:]}")
    return res.stdout


def parse_reward(json_text: bytes | None, txt: bytes | None) -> tuple[float, dict[str, float]]:
    """(scalar reward, all rewards) from the verifier's files; NoReward when unusable."""
    if json_text is not None:
        try:
            data = json.loads(json_text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise NoReward(f"reward.json is not JSON: {exc}") from None
        if not isinstance(data, dict) or not data:
            raise NoReward("reward.json must be an object of reward names to numbers")
        rewards: dict[str, float] = {}
        for k, v in data.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise NoReward(f"reward.json: {k!r} is not a finite number: {v!r}")
            rewards[str(k)] = float(v)
        scalar = rewards["reward"] if "reward" in rewards else sum(rewards.values()) / len(rewards)
        return scalar, rewards
    if txt is not None:
        try:
            value = float(txt.decode().strip())
        except (ValueError, UnicodeDecodeError):
            raise NoReward(f"reward.txt does not hold a number: {txt[:80]!r}") from None
        if not math.isfinite(value):
            raise NoReward(f"reward.txt holds a non-finite reward {value!r}")
        return value, {"reward": value}
    raise NoReward(f"the verifier wrote neither {REWARD_JSON} (or rewards.json) nor {REWARD_TXT}")


async def _read(sb: Sandbox, path: str) -> bytes | None:
    # A regular file only: a link the agent's code left there must not point the reader elsewhere.
    res = await sb.exec(f"test -f {path} && ! test -L {path}", timeout_s=30, cwd="/")
    if res.exit_code != 0:
        return None
    try:
        return await sb.read_file(path)
    except OSError:
        return None


def reward_files_named(tests_dir: Path) -> set[str]:
    """The reward files the verifier's own files name (test.sh and its helpers). Harbor reads
    reward.json before reward.txt, so code of the agent's that the verifier runs (a module the
    tests import, a script test.sh calls) could otherwise win by writing the file the verifier
    never writes: a reward.json beside the verifier's reward.txt."""
    names = {Path(p).name for p in (REWARD_JSON, REWARDS_JSON, REWARD_TXT)}
    found: set[str] = set()
    for f in sorted(tests_dir.rglob("*")):
        if f.is_file():
            text = f.read_bytes()[: 1 << 20].decode("utf-8", "replace")
            found |= {n for n in names if n in text}
    return found


def planted_rewards(files: dict[str, bytes | None], named: set[str]) -> list[str]:
    """Reward files present after the verifier ran that none of its own files names. A
    verifier that names none (its paths are built at run time) is not judged this way."""
    if not named:
        return []
    return sorted(p for p, data in files.items() if data is not None and Path(p).name not in named)


async def _locked_rewards(sb: Sandbox) -> list[str]:
    """Reward files made read-only for their owner: the verifier (same user as the agent's code
    it runs) could then not write its verdict over a planted one. Also anything in the
    verifier's directory that is neither a regular file nor a directory (a FIFO, a link)."""
    res = await sb.exec(
        f"find {VERIFIER_DIR} -maxdepth 1 -mindepth 1 \\( -name 'reward*' -type f ! -perm -u+w \\) -print "
        f"-o \\( -name 'reward*' ! -type f ! -type d \\) -print",
        timeout_s=30,
        cwd="/",
    )
    if res.exit_code != 0:  # no `find` in the image: this check is skipped, the others stand
        return []
    return sorted(line.strip() for line in res.stdout.splitlines() if line.strip())


def _reset_logs(user: str) -> str:
    name = user.partition(":")[0]
    q = shlex.quote(name)
    return (
        "rm -rf /logs /tests && mkdir -p /logs/agent /logs/verifier /tests && "
        f'u=$(id -u {q} 2>/dev/null || echo {q}); g=$(id -g {q} 2>/dev/null || echo "$u"); '
        'chown "$u:$g" /logs/verifier && chmod 0755 /logs/verifier'
    )


async def copy_dir(sb: Sandbox, src: Path, dest: str) -> None:
    """Copy a host directory's files into the sandbox, keeping their modes."""
    for p in sorted(src.rglob("*")):
        if p.is_file():
            rel = p.relative_to(src).as_posix()
            await sb.write_file(f"{dest}/{rel}", p.read_bytes(), mode=p.stat().st_mode & 0o755 | 0o644)


async def grade_in(sb: Sandbox, spec: HarborSpec, diff: str, cfg: GradeConfig, st: dict[str, str]) -> Outcome:
    """One attempt in the fresh sandbox `sb` (the module docstring's steps); `st["step"]` says
    how far it got. Of `cfg` it reads `penalize_tamper` (the task says the rest)."""
    from legorl.tasks.harbor_image import as_user

    ev: dict[str, Any] = {}
    flags: list[str] = []
    t0 = time.monotonic()
    st["step"] = "apply"
    await sb.write_file(state.SCRIPT, state.SOURCE.encode())
    if diff and not state.is_empty(diff):
        summary = state.StateSummary.of(diff)
        if summary.protected:
            flags.append("protected_path_in_state")
            if any(p.startswith("logs/") or "/logs/" in f"/{p}" for p in summary.protected):
                flags.append("planted_reward_file")
        at = f"{state.STATE_DIR}/agent.state"
        await sb.write_file(at, diff.encode("utf-8", "surrogateescape"))
        res = await sb.exec(state.run_script("apply", spec.workdir, at), timeout_s=300, cwd="/")
        try:
            report = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SandboxError(f"applying the workdir state failed: {res.stderr.strip()[-500:]}") from None
        if "error" in report:
            return Outcome(0.0, Status.FAILED, flags=[*flags, "state_unreadable"], evidence={**ev, **report})
        ev["state"] = report
        if report.get("n_skipped"):
            flags.append("state_entries_refused")
    st["step"] = "setup"
    res = await sb.exec(_reset_logs(spec.test_user), timeout_s=60, cwd="/")
    if res.exit_code != 0:
        raise SandboxError(f"cannot make {VERIFIER_DIR}: {res.stderr.strip()[-300:]}")
    await copy_dir(sb, spec.tests_dir, "/tests")
    st["step"] = "tests"
    run = await sb.exec(
        as_user(spec.test_user, "exec /tests/test.sh"),
        timeout_s=spec.verifier_timeout_s,
        cwd=spec.workdir,
        env=spec.verifier_env,
    )
    st["step"] = "reward"
    ev["exit_code"] = run.exit_code
    ev["test_output"] = (run.stdout[-2000:] + "\n" + run.stderr[-2000:]).strip()
    ev["test_duration_s"] = round(run.duration_s, 3)
    if run.resource_exhausted:
        flags.append("resource_exhausted")
    if run.timed_out:  # the agent's code hung the verifier: 0, whatever file it left
        ev["duration_s"] = round(time.monotonic() - t0, 3)
        return Outcome(0.0, Status.FAILED, flags=[*flags, "test_timeout"], evidence=ev)
    files = {path: await _read(sb, path) for path in (REWARD_JSON, REWARDS_JSON, REWARD_TXT)}
    forged = planted_rewards(files, reward_files_named(spec.tests_dir)) + await _locked_rewards(sb)
    if forged:  # the agent's code, run by the verifier, wrote or pinned a reward: never counted
        ev["forged_reward_files"] = forged
        ev["duration_s"] = round(time.monotonic() - t0, 3)
        status = Status.HACK_DETECTED if cfg.penalize_tamper else Status.FAILED
        return Outcome(0.0, status, flags=[*flags, "planted_reward_file", TAMPER], evidence=ev)
    js = files[REWARD_JSON]
    reward, rewards = parse_reward(js if js is not None else files[REWARDS_JSON], files[REWARD_TXT])
    ev["rewards"] = rewards
    ev["duration_s"] = round(time.monotonic() - t0, 3)
    return Outcome(reward, Status.RESOLVED if reward >= 1.0 else Status.FAILED, flags=flags, evidence=ev)

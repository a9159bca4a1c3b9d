"""The pre-flight's load check (legorl/loop/harness_load.py) on the figures it was built from:
OpenCode's ~7 CPU-s start, 180 s agent timeout, two cores; 32 at once timed rollouts out, 16
did not."""

from __future__ import annotations

from legorl.loop.config import RunConfig
from legorl.loop.harness_load import StartLoad, start_loads


def config(concurrent: int, **extra: dict) -> RunConfig:
    d: dict = {
        "run": {"max_concurrent_rollouts": concurrent, "tasks_per_step": 16, "group_size": 8},
        "sandbox": {"backend": "local", "agent_timeout_s": 180},
    }
    for k, v in extra.items():
        d.setdefault(k, {}).update(v)
    return RunConfig.model_validate(d)


def test_thirty_two_opencode_starts_on_two_cores_warn_and_sixteen_do_not() -> None:
    (at32,) = start_loads(config(32), {"opencode": 7.0}, cores=2)
    assert at32.over and round(at32.wait_s) == 112
    assert at32.safe_concurrency == 17  # 60 s x 2 cores / 7 CPU-s
    msg = at32.message()
    assert "'opencode'" in msg and "32 rollouts at once on 2 cores" in msg and "to 17 or fewer" in msg
    (at16,) = start_loads(config(16), {"opencode": 7.0}, cores=2)
    assert not at16.over
    (cc,) = start_loads(config(32), {"claude-code": 1.2}, cores=2)
    assert not cc.over  # Claude Code's measured start: 32 at once never timed out


def test_concurrency_is_what_the_run_can_reach() -> None:
    """A cap above every phase's width is not reached: a step of 4, 2 held-out tasks, no demos."""
    cfg = config(64, run={"tasks_per_step": 2, "group_size": 2}, heldout={"tasks": 2})
    (load,) = start_loads(cfg, {"opencode": 7.0}, cores=2)
    assert load.concurrent == 4 and not load.over


def test_only_starts_this_process_pays_for_are_judged() -> None:
    costs = {"opencode": 7.0, "openhands-warm": 11.0}
    assert [ld.harness for ld in start_loads(config(32), costs, cores=2)] == ["opencode"]
    assert start_loads(config(32, sandbox={"backend": "docker"}), costs, cores=2) == []
    assert start_loads(config(32, ray={"enabled": True}), costs, cores=2) == []


def test_a_free_start_never_warns() -> None:
    load = StartLoad("command", 0.0, 1000, 1, 180.0)
    assert not load.over and load.safe_concurrency == 1000

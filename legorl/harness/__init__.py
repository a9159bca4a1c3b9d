"""Harnesses: unmodified coding agents, and how to launch each one against its session.

Start here: `registry.py` (`HARNESSES`: name → adapter, every harness name there is, and
`make_harness`), then `base.py` (the `Harness`, `HostHarness` and `InstalledHarness`
protocols, `AgentRun`, and `NativeAdapter`: the base of every native adapter, with the runner
they share) and `command.py` (the `command` harness: a shell script as the agent).
One adapter per program: `claude_code.py`, `codex.py`, `gemini_cli.py`, `qwen_code.py`,
`pi.py`, `opencode.py`, `openhands.py` (+
`in_sandbox/openhands_driver.py`, run inside the sandbox), `mini_swe_agent.py`. Warm
harnesses run one long-lived process beside the sandboxes: `warm.py` (`WarmDriver`),
`warm_mini.py`, `openhands_warm.py`; their driver programs (`in_driver/mini_driver/`,
`in_driver/openhands_warm_driver/`, `in_driver/warm_driver_lib/`) run in the harness's own
interpreter.
`install.py` builds the harness image layers; `nettrace.py` and `turn_limit.py` are tools.

Where code runs: `in_sandbox/` holds programs that run inside a sandbox, `in_driver/` those
that run in a harness layer's own interpreter on the host (the warm drivers). Neither is
imported by the host, and neither imports `legorl`: the host reads them as files (copies one
into the sandbox, starts one by path), and package data ships them (pyproject.toml).
"""

"""Harnesses: unmodified coding agents, and how to launch each one against its session.

Start here: `registry.py` (`HARNESSES`: name → adapter, and `make_harness`), then
`command.py` (the `Harness`, `HostHarness` and `InstalledHarness` protocols, `AgentRun`,
and the `command` harness: a shell script as the agent) and `base.py` (what a native adapter
is, and the runner they share). One adapter per program: `claude_code.py`, `codex.py`,
`gemini_cli.py`, `qwen_code.py`, `pi.py`, `opencode.py`, `openhands.py` (+
`openhands_driver.py`, run inside the sandbox), `mini_swe_agent.py`. Warm harnesses run one
long-lived process beside the sandboxes: `warm.py` (`WarmDriver`), `warm_mini.py`,
`openhands_warm.py`; their driver programs (`mini_driver/`, `openhands_warm_driver/`,
`warm_driver_lib/`) run in the harness's own interpreter, never importing legorl.
`install.py` builds the harness image layers; `nettrace.py` and `turn_limit.py` are tools.
"""

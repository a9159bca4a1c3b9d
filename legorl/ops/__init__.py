"""Operating a run from a coding agent (docs/operate.md).

The checks that catch a silently broken run before it starts (`replay_check`,
`toolcall_check`, `plan_checks`; registered with `@check`; `legorl doctor` runs them with the
rest of the pre-flight, `legorl/loop/preflight.py`), and `legorl status`: which run is alive, how far it has got and
which known failure signature its store matches (`status`, `signatures`, `liveness`). Both
print JSON for the plugin's skills (`plugin/`), which only read, except the one that
launches a run after a YES.
"""

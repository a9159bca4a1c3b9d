"""A turn limit for harnesses that have none (Codex CLI, Pi), enforced from their events.

Why from outside: neither harness can be told to stop after N model calls, and an
unbounded run only ends at the wall-clock timeout (`agent_timeout`), which would grade a
looping policy as slow rather than as out of turns. Both print one JSON event per line;
the wrapper built here copies them to a file and kills the harness once `max_turns` lines
matched a pattern (a finished tool call), writing `LIMIT_MARK` to a marker file of its own
(not the harness's stderr, which the harness writes at its own offset) so the adapter can
say `max_turns`. Plain POSIX sh (a fifo, `case` globs): task images have no
bash guarantee and no python guarantee.
"""

from __future__ import annotations

LIMIT_MARK = "legorl: max_turns reached"


def limited(run: str, *, fifo: str, events: str, stderr: str, marker: str, pattern: str, max_turns: int) -> str:
    """A sh command that runs `run` (its stdout to the fifo, stderr to `stderr`), copies its
    lines to `events` and kills it after `max_turns` lines matching the glob `pattern`,
    writing `LIMIT_MARK` to `marker`."""
    return (
        f"rm -f {fifo} {marker}; mkfifo {fifo}; {run} > {fifo} 2> {stderr} & pid=$!; n=0; "
        f"while IFS= read -r line; do printf '%s\\n' \"$line\" >> {events}; "
        f'case "$line" in {pattern}) n=$((n+1));; esac; '
        f"if [ \"$n\" -ge {int(max_turns)} ]; then kill $pid; echo '{LIMIT_MARK}' > {marker}; break; fi; "
        f"done < {fifo}; wait $pid"
    )

"""A scripted engine that follows the `rl` plugin's skills, for driving real harnesses.

It plays the model behind the proxy: when the prompt holds a skill's instructions (Claude
Code expands `/rl:status RUN` into `<command-name>/rl:status</command-name>`, the skill's
SKILL.md and `ARGUMENTS: RUN`), it issues the one tool call the skill prescribes (the
`legorl ...` line of the skill's ```bash block, placeholders filled from the arguments, as a
call of the harness's shell tool in the model's own hermes format; when `legorl` is not on
`PATH`, once more as `.venv/bin/legorl`, as the skill says); once the result is in, it
writes the skill's report, verdict last, from the JSON the command printed. It decides
nothing the skill does not say; with no skill in the prompt it answers that none was
invoked. Every prompt it was sent is kept (`prompts`), so a test can read what the harness
showed the model.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import AsyncIterator
from typing import Any

from legorl.engine.base import collect
from legorl.types import FinishReason, Generation, SamplingParams, TokenStep

# how each harness puts an invoked skill into the prompt: Claude Code expands `/rl:status ARGS`
# into <command-name>/rl:status</command-name>, the SKILL.md and `ARGUMENTS: ARGS`; Codex, for
# `$rl:status ARGS`, appends <skill><name>rl:status</name> SKILL.md </skill> to the user's message
SKILL = re.compile(r"<command-name>/rl:(\w+)</command-name>|<skill>\n<name>rl:(\w+)</name>")
ARGS = re.compile(r"ARGUMENTS: (.*?)(?:<\|im_end\|>|\n)")
DOLLAR_ARGS = r"\$rl:{skill} (.*?)(?:<\|im_end\|>|\n)"
PLACEHOLDERS = ("RUN_DIR", "CONFIG")


def prescribed(skill_text: str, args: str) -> str:
    """The skill's `legorl` command line with its placeholder filled by `args`."""
    block = re.search(r"```bash\n(.*?)```", skill_text, re.S)
    assert block, "the skill prescribes no command"
    line = next(ln.strip() for ln in block.group(1).splitlines() if "legorl " in ln)
    for p in PLACEHOLDERS:
        line = line.replace(p, shlex.quote(args.strip()))
    return line


def report(skill: str, result: str) -> str:
    """The skill's report from the command's output (the `## Report` rules of its SKILL.md)."""
    start, end = result.find("{"), result.rfind("}")
    try:
        data: dict[str, Any] = json.loads(result[start : end + 1])
    except ValueError:
        tail = result.strip().splitlines()[-1] if result.strip() else "no output"
        verdict = {"check": "NO", "status": "UNKNOWN"}.get(skill, "NO")
        return f"The command did not print a report: {tail}\nVERDICT: {verdict}"
    if skill == "check":
        bad = [f"FATAL {c['name']}: {c['detail']} -> {c['fix']}" for c in data["checks"] if c["status"] == "fatal"]
        ok = sum(c["status"] == "ok" for c in data["checks"])
        return "\n".join([*bad, f"{ok} checks ok", f"VERDICT: {'YES' if data['safe_to_run'] else 'NO'}"])
    p = data["progress"]
    lines = [
        f"{data['state']}, process {data['process']['state']}",
        f"step {p['step']}: {p['steps_done']}/{p['steps_planned']} done, last write {p['last_write']}",
    ]
    for m in data["signatures"]:
        lines += [f"{m['name']} [{m['severity']}]", *m["evidence"][:2], f"fix: {m['fix']}"]
    if not data["signatures"]:
        lines.append("no known signature matched")
    names = ", ".join(m["name"] for m in data["signatures"])
    lines.append(f"VERDICT: SICK {names}" if names else "VERDICT: NO KNOWN FAILURE")
    return "\n".join(lines)


class SkillFollower:
    """See the module docstring."""

    name = "skill-follower"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.policy_version = 0
        self.max_context = 2**31
        self.prompts: list[str] = []

    def reply(self, prompt: str) -> str:
        found = list(SKILL.finditer(prompt))
        if not found:
            return "No skill was invoked."
        skill, at = found[-1].group(1) or found[-1].group(2), found[-1].end()
        after = prompt[at:]
        results = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", after, re.S)
        args = ARGS.search(after) or list(re.finditer(DOLLAR_ARGS.format(skill=skill), prompt[:at]))[-1:]
        arg = (args.group(1) if isinstance(args, re.Match) else args[0].group(1)) if args else ""
        command = prescribed(after, arg)
        if len(results) == 1 and "legorl: command not found" in results[0] and ".venv/bin/legorl" in after:
            return self.call(prompt, skill, f".venv/bin/{command}")  # the skill's own fallback
        if results:
            return report(skill, results[-1])
        return self.call(prompt, skill, command)

    @staticmethod
    def call(prompt: str, skill: str, command: str) -> str:
        """A shell tool call in the model's hermes format, to the harness's own shell tool."""
        if '"name": "exec_command"' in prompt:  # Codex's; no login shell, so PATH is the harness's; wait its
            # longest (30 s) for the output: on a loaded machine `legorl` may take more than the default 10 s
            args: dict[str, Any] = {"cmd": command, "login": False, "yield_time_ms": 30000}
            call: dict[str, Any] = {"name": "exec_command", "arguments": args}
        else:  # Claude Code's
            call = {"name": "Bash", "arguments": {"command": command, "description": f"rl:{skill}"}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        self.prompts.append(text)
        ids = self.tokenizer.encode(self.reply(text), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        for tok in ids[: params.max_tokens]:
            yield TokenStep(tok, -0.1)
        yield TokenStep(None, None, FinishReason.STOP)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        return None

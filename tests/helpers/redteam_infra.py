"""The red team's infrastructure attacks: an agent that makes our side look faulty to get its
zero masked, and a local process that reaches into a live run (issue 39).

An agent's rollout is masked only when the fault is provably ours (`legorl/proxy/blame.py`), so
each agent script here is a way to make the proxy answer 5xx while the agent makes no fix; each
must end graded (reward 0), flagged, never `infra_error`. The engines are scripted stand-ins
for what each attack needs: one that serves one call at a time (a saturated GPU), and one that
hangs for everyone (a fault that is ours and must keep masking).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from legorl.engine.scripted import ScriptedEngine
from legorl.loop.config import RunConfig
from legorl.models import load_tokenizer
from legorl.types import SamplingParams, TokenStep

# The flood: `n` concurrent long generations from inside the sandbox, every error ignored.
FLOOD = """#!/bin/bash
python3 - <<'PY'
import json, os, threading, urllib.error, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
codes = []
def call(i):
    body = {{"model": "m", "messages": [{{"role": "user", "content": f"flood {{i}}"}}], "max_tokens": 4000}}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={{"content-type": "application/json"}})
    try:
        codes.append(urllib.request.urlopen(req, timeout=120).status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
    except Exception as e:
        codes.append(type(e).__name__)
threads = [threading.Thread(target=call, args=(i,)) for i in range({n})]
[t.start() for t in threads]
[t.join() for t in threads]
print(sorted(map(str, codes)))
PY
"""

# One call, alone: when it times out the engine is at fault, not the agent.
ONE_CALL = FLOOD.format(n=1)

# Every way to break the conversation from the client's side: a WebSocket upgrade, bytes that
# are not HTTP, a body that never arrives, a stream hung up after its first bytes.
MISBEHAVE = """#!/bin/bash
python3 - <<'PY'
import json, os, socket, time
host, port = os.environ["OPENAI_BASE_URL"].split("//")[1].split("/")[0].split(":")
def raw(data, read=True, wait=0.0):
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(data)
    time.sleep(wait)
    out = s.recv(200) if read else b""
    s.close()
    return out[:12]
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
post = b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\ncontent-type: application/json\\r\\n"
print(raw(b"GET /v1/chat/completions HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nUpgrade: websocket\\r\\n"
          b"Connection: Upgrade\\r\\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\n"
          b"Sec-WebSocket-Version: 13\\r\\n\\r\\n"))
print(raw(b"\\x16\\x03\\x01 not http at all\\r\\n\\r\\n"))
print(raw(post + b"content-length: 5000\\r\\n\\r\\n{", wait=0.1))  # the rest never comes
for _ in range(3):
    print(raw(post + b"content-length: %d\\r\\n\\r\\n" % len(body) + body))  # hung up mid-stream
PY
"""

# A rollout that waits (for an attacker on the host to act on its live session).
WAIT = """#!/bin/bash
sleep {s}
"""


class OneAtATime(ScriptedEngine):
    """Scripted, but serving one call at a time, each for `busy_s`: a saturated engine."""

    def __init__(self, busy_s: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy_s = busy_s
        self.gate = asyncio.Semaphore(1)

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        async with self.gate:
            await asyncio.sleep(self.busy_s)
            async for step in super().stream(prompt_ids, params):
                yield step


class Hung(ScriptedEngine):
    """Scripted, but every call hangs: the engine is down for everyone (ours)."""

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        await asyncio.sleep(3600)
        async for step in super().stream(prompt_ids, params):  # pragma: no cover - never reached
            yield step


def engine(kind: type[ScriptedEngine], *args: Any) -> ScriptedEngine:
    return kind(*args, ["nothing to fix"], load_tokenizer("tiny-qwen3"))


def run_config(tmp_path: Path, script: str, backend: str, **proxy: Any) -> RunConfig:
    (tmp_path / "agent.sh").write_text(script)
    return RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": str(tmp_path / "agent.sh")},
            "sandbox": {"backend": backend, "retries": 1, "agent_timeout_s": 120},
            "proxy": proxy,
        }
    )

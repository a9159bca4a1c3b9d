"""A one-call agent and an engine that fails its first calls: the rollout worker's retry tests
(tests/loop/test_loop_worker.py) and the record and outcome tests built on the same worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

from legorl.engine.base import EngineError
from legorl.engine.scripted import ScriptedEngine
from legorl.types import SamplingParams, TokenStep

AGENT = """#!/bin/bash
python3 - <<'PY'
import json, os, urllib.request
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
PY
"""


class FailingFirst(ScriptedEngine):
    """Scripted, except that the first `n` calls fail like a crashed engine server."""

    def __init__(self, n: int, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.failures_left = n

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise EngineError("engine server went away")
        async for step in super().stream(prompt_ids, params):
            yield step

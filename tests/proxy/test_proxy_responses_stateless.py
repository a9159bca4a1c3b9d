"""The Responses dialect as Codex CLI uses it: stateless reasoning and refused hosted tools.

With `include: ["reasoning.encrypted_content"]` and `store: false`, a client may send a
reasoning item back with nothing but its opaque `encrypted_content`: the proxy's blob must
bring the sampled reasoning back into the prompt (one segment, no token lost), streamed
and not, through the official `openai` client. A hosted tool is a clear 400.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from legorl.proxy.responses import seal, unseal
from legorl.proxy.server import ProxyServer
from legorl.trajectory import assemble
from tests.helpers.proxy_util import ProxyScript

SCRIPT = [
    (
        "<think>\nThe tests live in tests/.\n</think>\n\nI will run them.\n"
        '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "pytest -q"}}\n</tool_call>'
    ),
    "<think>\nThey pass.\n</think>\n\nAll tests pass.",
]
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a command in a PTY.",
        "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]


@pytest.fixture
def proxy_script() -> ProxyScript:
    return ProxyScript(SCRIPT)


def test_seal_round_trip() -> None:
    assert unseal(seal("I think — ünïcode.")) == "I think — ünïcode."
    assert unseal("gAAAAABo-foreign-encryption") is None and unseal("legorl:!!") is None and unseal(None) is None


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_comes_back_from_the_blob_alone(proxy: ProxyServer, stream: bool) -> None:
    sid = f"sealed-{stream}"
    proxy.open_session(sid)
    client = openai.AsyncOpenAI(base_url=proxy.session_url(sid) + "/v1", api_key="x", max_retries=0)
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the tests."}]},
    ]
    kw: dict[str, Any] = {
        "model": "legorl-policy",
        "input": items,
        "tools": TOOLS,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto"},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "prompt_cache_key": "t1",
    }
    for _ in range(2):
        if stream:
            final = None
            async for ev in await client.responses.create(stream=True, **kw):
                if ev.type == "response.completed":
                    final = ev.response
            assert final is not None
            r = final
        else:
            r = await client.responses.create(**kw)
        reasoning = [o for o in r.output if o.type == "reasoning"]
        assert len(reasoning) == 1 and unseal(reasoning[0].encrypted_content) == reasoning[0].content[0].text
        for o in r.output:  # send everything back, the reasoning as nothing but its blob
            d = o.model_dump(exclude_none=True)
            if o.type == "reasoning":
                d = {"type": "reasoning", "id": o.id, "summary": [], "encrypted_content": o.encrypted_content}
            items.append(d)
        items += [
            {"type": "function_call_output", "call_id": o.call_id, "output": "3 passed"}
            for o in r.output
            if o.type == "function_call"
        ]
    assert r.output_text == "All tests pass."
    turns = proxy.close_session(sid)
    traj = assemble(turns)
    assert len(traj.segments) == 1, f"the reasoning did not come back as sampled: {traj.stats}"
    assert traj.stats.sampled_tokens == sum(len(t.completion_ids) for t in turns)


async def test_hosted_tool_is_a_clear_400(proxy: ProxyServer) -> None:
    proxy.open_session("hosted")
    client = openai.AsyncOpenAI(base_url=proxy.session_url("hosted") + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="web_search.*turn them off in the client"):
        await client.responses.create(model="m", input="hi", tools=[*TOOLS, {"type": "web_search"}])

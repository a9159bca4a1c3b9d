"""One scripted three-turn conversation with tool calls, and the tool declarations of each
dialect: the dialect round trips (tests/proxy/test_proxy_dialects.py) and the Gemini dialect
(tests/proxy/test_proxy_gemini.py) replay the same script and expect the same calls."""

from __future__ import annotations

SCRIPT = [
    "<think>\nI should look around first.\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>',
    '<tool_call>\n{"name": "bash", "arguments": {"command": "cat README.md", "timeout": 5}}\n</tool_call>',
    "Done: the repository has a README and nothing else.",
]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
                "required": ["command"],
            },
        },
    }
]
ANTHROPIC_TOOLS = [
    {"name": "bash", "description": "Run a shell command.", "input_schema": OPENAI_TOOLS[0]["function"]["parameters"]}
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": OPENAI_TOOLS[0]["function"]["parameters"],
    }
]
EXPECTED_CALLS = [
    [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})],
    [("bash", {"command": "cat README.md", "timeout": 5})],
    [],
]

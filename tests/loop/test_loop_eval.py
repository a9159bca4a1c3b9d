"""`legorl eval` against an external OpenAI-compatible endpoint (a local server here): the
harness in its sandbox reaches the endpoint only through its session socket's relay, and
what the endpoint answers decides the outcome."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from legorl.loop.stats import wilson
from legorl.tasks.loader import load_shipped, shipped_tasks_dir

AGENT = """#!/bin/bash
reply=$(python3 - <<'PY'
import json, os, urllib.request
body = {"model": "baseline", "messages": [{"role": "user", "content": "fix it"}]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
PY
)
echo "model said: $reply"
if [ "$reply" = "APPLY" ]; then
git apply <<'PATCH'
__PATCH__PATCH
fi
"""


def _endpoint(answer_for: dict[str, str], seen: list[dict]) -> Starlette:
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append({"auth": request.headers.get("authorization"), "model": body["model"]})
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "created": 0,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": answer_for["answer"]},
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize("answer,expected", [("APPLY", 1.0), ("NOPE", 0.0)])
async def test_eval_external_endpoint(tmp_path: Path, answer: str, expected: float) -> None:
    task = load_shipped("train")[0]
    (tmp_path / "agent.sh").write_text(AGENT.replace("__PATCH__", task.patch.rstrip("\n") + "\n"))
    (tmp_path / "eval.toml").write_text(f"""
[run]
tasks = "{shipped_tasks_dir() / "train.jsonl"}"
eval_split = "train"
[harness]
name = "command"
command_file = "agent.sh"
[eval]
k = 2
limit = 1
""")
    seen: list[dict] = []
    server = uvicorn.Server(
        uvicorn.Config(
            _endpoint({"answer": answer}, seen), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
    )
    serve = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "legorl.cli",
            "eval",
            str(tmp_path / "eval.toml"),
            "--endpoint",
            f"http://127.0.0.1:{port}/v1",
            "--api-key",
            "sk-test",
            "--out",
            str(tmp_path / "out.json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 600)
    finally:
        server.should_exit = True
        await serve
    assert proc.returncode == 0, err.decode()[-3000:]
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["samples"] == 2 and summary["pass@1"] == expected and summary["pass@2"] == expected
    assert len(seen) == 2 and all(s["auth"] == "Bearer sk-test" for s in seen)
    official = json.loads((tmp_path / "out.swebench.json").read_text())  # the official harness's results shape
    assert official["schema_version"] == 2 and official["submitted_ids"] == [task.instance_id]
    assert official["resolved_ids"] == ([task.instance_id] if expected else [])
    assert official["instances"][task.instance_id]["resolved"] is bool(expected)
    # the manifest beside the results: what the number was measured with
    manifest = json.loads((tmp_path / "out.manifest.json").read_text())
    assert summary["manifest"] == str(tmp_path / "out.manifest.json")
    agent_sha = hashlib.sha256((tmp_path / "agent.sh").read_bytes()).hexdigest()
    assert manifest["harness"] == {
        "name": "command",
        "max_turns": 8,
        "version": None,
        "command_file": str(tmp_path / "agent.sh"),
        "command_sha256": agent_sha,
    }
    assert manifest["model"]["endpoint"] == f"http://127.0.0.1:{port}/v1" and manifest["model"]["sha256"] is None
    tasks_file = shipped_tasks_dir() / "train.jsonl"
    assert manifest["tasks"]["sha256"] == hashlib.sha256(tasks_file.read_bytes()).hexdigest()
    assert manifest["tasks"]["instance_ids"] == [task.instance_id] and manifest["tasks"]["split"] == "train"
    keys = manifest["images"]
    assert len(keys["base"]) == 32 and len(keys["tasks"][task.instance_id]) == 32
    assert keys["tasks"][task.instance_id] != keys["base"]
    assert manifest["sampling"]["samples_per_task"] == 2 and "temperature" not in manifest["sampling"]  # relayed
    n = 2 if expected else 0
    assert manifest["failure_classes"] == {"resolved": n, "agent": 2 - n, "infrastructure": 0, "masked": 0}
    assert manifest["pass@2"]["value"] == expected and manifest["pass@1"]["value"] == expected
    assert manifest["pass@2"]["ci95"] == pytest.approx(list(wilson(int(expected), 1)))

"""The proxy benchmark's own load generator and upstream (`bench/loadgen.py`,
`bench/fake_backend.py`): real HTTP on 127.0.0.1, a few dozen requests.

What must hold for `bench/proxy_vs_litellm.sh` to mean anything: every request the
generator counts as OK was answered completely, a truncated or malformed answer is an
error, a proxy that dies mid-sweep is noticed and its repetition redone, the CPU of the
watched process is reported, and the upstream replies with the same text the proxy's
scripted engine replays."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

REPO = ROOT
sys.path.insert(0, str(REPO / "bench"))

import fake_backend  # noqa: E402
import loadgen  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[str, int]]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "fake_backend.py"), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            _get(url + "/health")
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("fake_backend did not come up")
    yield url, proc.pid
    proc.terminate()
    proc.wait(10)


def _loadgen(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "loadgen.py"), *args], capture_output=True, text=True, timeout=timeout
    )


def test_direct_sweep_counts_every_request_and_the_backend_cpu(backend: tuple[str, int]) -> None:
    url, pid = backend
    before = _get(url + "/health")
    r = _loadgen(
        "--direct", url, "--stream", "off,on", "-c", "1,3", "-n", "12", "--min-waves", "1",
        "--reps", "2", "--warmup", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [(c["stream"], c["concurrency"]) for c in res["cells"]] == [(False, 1), (False, 3), (True, 1), (True, 3)]
    for cell in res["cells"]:
        runs = cell["direct"]["reps"]
        assert len(runs) == 2
        assert all(run["ok"] == 12 and run["errors"] == 0 for run in runs)
        assert cell["direct"]["agg"]["rps"]["median"] > 0
        assert ("ttfb_p50_ms" in runs[0]) is cell["stream"]
    # every run sent its warm-up and its measured requests: 4 cells x 2 reps x (3 + 12)
    assert _get(url + "/health")["requests"] - before["requests"] == 4 * 2 * 15
    # the request is the ~30 KB coding-agent turn in both dialects
    assert all(28_000 < b < 33_000 for b in res["meta"]["body_bytes"].values())


def test_backend_cpu_is_measured_over_the_process_tree(backend: tuple[str, int]) -> None:
    url, pid = backend
    r = _loadgen("--direct", url, "-c", "2", "-n", "200", "--reps", "1", "--backend-pid", str(pid))
    assert r.returncode == 0, r.stderr
    cpu = json.loads(r.stdout)["cells"][0]["direct"]["reps"][0]["cpu_ms_per_req"]
    assert cpu["client"] > 0 and cpu["backend"] > 0  # 200 requests of 30 KB cannot cost 0 ticks


def test_a_proxy_that_dies_is_noticed_restarted_and_its_repetition_redone(
    backend: tuple[str, int], tmp_path: Path
) -> None:
    """The 'proxy' is a stand-in process whose pid is watched; the fake backend serves the
    OpenAI route, so the target answers. The first proxy-side hook kills the stand-in."""
    url, _ = backend
    stand_in = subprocess.Popen(["sleep", "300"])
    restart = tmp_path / "restart.sh"
    restart.write_text(f"#!/bin/sh\nsleep 300 > /dev/null 2>&1 &\necho started\necho $! | tee -a {tmp_path}/pids\n")
    restart.chmod(0o755)
    killed = tmp_path / "killed"
    hook = f"[ -e {killed} ] || {{ touch {killed}; kill {stand_in.pid}; }}"
    try:
        r = _loadgen(
            "--target", url, "--direct", url, "-c", "1", "-n", "5", "--reps", "2", "--warmup", "0",
            "--proxy-pid", str(stand_in.pid), "--before-proxy-run", hook, "--proxy-restart", str(restart),
        )  # fmt: skip
        stand_in.wait(5)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        deaths = res["meta"]["proxy_deaths"]
        assert [(d["rep"], d["pid"]) for d in deaths] == [(0, stand_in.pid)]
        cell = res["cells"][0]
        assert cell["proxy_restarts"] == 1
        assert len(cell["proxy"]["reps"]) == len(cell["direct"]["reps"]) == 2  # the dead repetition was redone
        assert len(cell["overhead_ms"]["p50_ms"]["per_rep"]) == 2
        # without a restart command the sweep stops, with exit status 3
        lone = subprocess.Popen(["sleep", "300"])
        r = _loadgen(
            "--target", url, "-c", "1", "-n", "5", "--reps", "1", "--warmup", "0",
            "--proxy-pid", str(lone.pid), "--before-proxy-run", f"kill {lone.pid}",
        )  # fmt: skip
        lone.wait(5)
        assert r.returncode == 3
        assert json.loads(r.stdout)["meta"]["proxy_died"]["pid"] == lone.pid
    finally:
        for line in (tmp_path / "pids").read_text().split() if (tmp_path / "pids").exists() else []:
            subprocess.run(["kill", line], check=False)
        stand_in.kill()


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_only_a_complete_answer_counts(dialect: str, stream: bool) -> None:
    body = loadgen.BODIES[dialect]("m", stream)
    ep = loadgen.Endpoint.make("http://127.0.0.1:1/x", dialect, body, "k")
    if stream:
        end = b"data: [DONE]\n\n" if dialect == "openai" else b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        good = b'data: {"x": 1}\n\n' + end
        assert ep.fault(200, good) is None
        assert ep.fault(200, b'data: {"x": 1}\n\n').startswith("truncated stream")
    else:
        good = (
            json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}]})
            if dialect == "openai"
            else json.dumps({"type": "message", "content": [{"type": "text", "text": "hi"}]})
        ).encode()
        assert ep.fault(200, good) is None
        assert ep.fault(200, b'{"choices": []}') is not None
        assert ep.fault(200, b"<html>").startswith("not json")
    assert ep.fault(500, good).startswith("http 500")


def test_the_request_is_a_claude_code_shaped_coding_turn() -> None:
    a = loadgen.anthropic_request("m", True)
    assert a["system"][-1]["cache_control"] == {"type": "ephemeral"} and "metadata" in a
    kinds = [b["type"] for m in a["messages"] for b in m["content"]]
    assert kinds.count("tool_use") == kinds.count("tool_result") == 5
    o = loadgen.openai_request("m", True)
    assert o["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in o["messages"]].count("tool") == 5
    assert len(o["tools"]) == len(a["tools"]) == 5
    assert "stream_options" not in loadgen.openai_request("m", False)
    ep = loadgen.Endpoint.make("http://127.0.0.1:1/v1/messages", "anthropic", a, "sk-x")
    assert ep.headers["x-api-key"] == "sk-x" and ep.headers["anthropic-version"]


def test_backend_streams_the_scripted_engines_reply_one_event_per_token(backend: tuple[str, int]) -> None:
    url, _ = backend
    script = (REPO / "bench" / "proxy_vs_litellm.sh").read_text()
    assert re.search(r"scripted_completions = \[\"(.*?)\"\]", script).group(1) == fake_backend.REPLY
    assert len(fake_backend.REPLY_TOKENS) == 10
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    for with_usage in (False, True):
        body = {**req, "stream_options": {"include_usage": with_usage}}
        post = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), method="POST")
        with opener.open(post, timeout=5) as r:
            events = [e for e in r.read().decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == fake_backend.REPLY
        assert len(chunks) == 1 + 10 + 1 + with_usage  # role, tokens, finish, usage
        assert ("usage" in chunks[-1]) is with_usage
    post = urllib.request.Request(url + "/v1/chat/completions", json.dumps(req | {"stream": False}).encode())
    with opener.open(post, timeout=5) as r:
        answer = json.loads(r.read())
    assert answer["choices"][0]["message"]["content"] == fake_backend.REPLY
    assert answer["usage"]["completion_tokens"] == 10
    bad = urllib.request.Request(url + "/v1/chat/completions", b'{"model": "m"}')
    with pytest.raises(urllib.error.HTTPError) as e:
        opener.open(bad, timeout=5)
    assert e.value.code == 400 and "messages" in json.loads(e.value.read())["error"]["message"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--target", "http://10.0.0.1:4000"], "not a loopback"),
        (["--direct", "http://example.com"], "not a loopback"),
        ([], "--target"),
        (["--direct", "http://127.0.0.1:1", "-c", "1,x"], "-c '1,x'"),
        (["--direct", "http://127.0.0.1:1", "--stream", "maybe"], "--stream 'maybe'"),
        (["--target", "http://127.0.0.1:1", "--dialect", "gemini"], "--dialect 'gemini'"),
        (["--direct", "http://127.0.0.1:1", "--proxy-pid", "999999999"], "no such running process"),
    ],
)
def test_bad_arguments_get_one_line_and_status_2(args: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        loadgen.parse_args(args)
    assert e.value.code == 2
    assert says in capsys.readouterr().err.splitlines()[-1]


def test_a_bad_argument_exits_without_a_traceback() -> None:
    r = _loadgen("--target", "http://192.168.1.1:4000", timeout=30)
    assert r.returncode == 2 and "not a loopback" in r.stderr and "Traceback" not in r.stderr


def test_backend_refuses_a_non_loopback_address() -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fake_backend.py"), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "loopback" in r.stderr and "Traceback" not in r.stderr

"""What the proxy adds on top of calling the engine directly; and the hf engine's speed.

Prints one JSON object:
- `overhead`: for each dialect (openai_chat, anthropic, responses), streaming and not, and
  concurrency C (1, 64, 256): latency p50/p99 through the proxy (HTTP, parse, render,
  engine, SSE, recording) minus calling the same scripted engine in-process with the same
  prompt ids ("direct"), interleaved A B A B in the same run; plus the proxy process's
  CPU ms per request and its requests/s. The prompt is a realistic ~10k-token agent
  conversation (system prompt, 5 tool round trips, 5 tool schemas) sent again and again
  in one session, so the renderer's incremental cache is exercised as in a real episode.
- `hf_engine`: tokens/s of the in-process `hf` engine on tiny-qwen3 at concurrency 1 and
  16 (from `bench/engine_throughput.py`).

The proxy runs in its own process (standalone mode, scripted engine, recording to a
temporary directory), so its CPU is measured apart from the load generator's; the load
generator uses one keep-alive connection per worker, as C agent sessions would. Between
runs the session is closed (DELETE) and the record files emptied, outside the measured
window, which keeps memory bounded like real episodes do.

    .venv/bin/python bench/proxy_overhead.py                 # full: ~10 min on 2 busy cores
    .venv/bin/python bench/proxy_overhead.py --quick         # C=1,64, fewer requests, no hf
    .venv/bin/python bench/proxy_overhead.py --quick --template qwen3.5   # the template renderer

`--template qwen3.5` serves a model directory (made in the temporary directory) whose
tokenizer is the real Qwen2 BPE with the published Qwen3.5-35B-A3B chat template (the
parity tests' data, `tests/fixtures/`), so every request goes through the template renderer
(`legorl.proxy.template`) instead of the bundled models' hand-written one. `render_ms`
adds, in-process, what rendering one fresh request (no session, nothing cached but
tokenised pieces) and one grown request (a session that saw the previous one) costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REPLY = "I will read the file and fix the failing test."  # bench/fake_backend.py's 10-token reply
TOOLS = [
    (
        "Bash",
        "Executes a bash command in a persistent shell session with an optional timeout.",
        {"command": "string", "timeout": "number", "description": "string"},
    ),
    (
        "Read",
        "Reads a file from the local filesystem; returns lines in cat -n format.",
        {"file_path": "string", "offset": "number", "limit": "number"},
    ),
    (
        "Edit",
        "Performs an exact string replacement in a file; the old string must be unique.",
        {"file_path": "string", "old_string": "string", "new_string": "string"},
    ),
    (
        "Grep",
        "Searches file contents with ripgrep regular expressions.",
        {"pattern": "string", "path": "string", "glob": "string"},
    ),
    ("Glob", "Finds files by glob pattern, newest first.", {"pattern": "string", "path": "string"}),
]


# -- the conversation, in a neutral form, then per dialect ---------------------------------------
def conversation(seed: int = 3) -> tuple[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    words = (
        "the agent reads files runs tests edits code carefully checks the diff before it commits and "
        "keeps answers short uses absolute paths never guesses library names prefers small focused "
        "changes explains commands"
    ).split()
    system = "You are a coding agent working in a git repository.\n\n" + "\n".join(
        f"- {' '.join(rng.choice(words) for _ in range(14))}." for _ in range(220)
    )
    src = "\n".join(
        f"{i + 1:>6}\tresult[{i}] = tokens[{i % 7}].strip() if depth < {i % 5 + 1} else None" for i in range(80)
    )
    calls = [
        ("Grep", {"pattern": "def parse_block", "path": "/repo"}),
        ("Read", {"file_path": "/repo/src/parser.py"}),
        ("Bash", {"command": "python -m pytest -x tests/test_parser.py"}),
        ("Edit", {"file_path": "/repo/src/parser.py", "old_string": "depth < 2", "new_string": "depth < 8"}),
        ("Bash", {"command": "python -m pytest tests/test_parser.py -q"}),
    ]
    outputs = [
        "/repo/src/parser.py:13:def parse_block_12(tokens)",
        src,
        "FAILED tests/test_parser.py::test_nested - AssertionError\n1 failed, 13 passed",
        "updated",
        "14 passed",
    ]
    turns: list[dict[str, Any]] = [{"role": "user", "text": "test_nested fails after my parser change; fix it."}]
    for k, ((name, args), out) in enumerate(zip(calls, outputs, strict=True)):
        turns.append(
            {"role": "assistant", "text": "Let me check." if k % 2 == 0 else "", "call": (f"toolu_{k:02d}", name, args)}
        )
        turns.append({"role": "tool", "id": f"toolu_{k:02d}", "text": out})
    turns.append({"role": "user", "text": "Also check test_roundtrip covers this case."})
    return system, turns


def _schema(props: dict[str, str]) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": [next(iter(props))]}


def openai_body(stream: bool) -> dict[str, Any]:
    system, turns = conversation()
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for t in turns:
        if t["role"] == "assistant":
            i, n, a = t["call"]
            msgs.append(
                {
                    "role": "assistant",
                    "content": t["text"] or None,
                    "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}],
                }
            )
        elif t["role"] == "tool":
            msgs.append({"role": "tool", "tool_call_id": t["id"], "content": t["text"]})
        else:
            msgs.append({"role": "user", "content": t["text"]})
    body = {
        "model": "bench-model",
        "messages": msgs,
        "stream": stream,
        "max_tokens": 4096,
        "tool_choice": "auto",
        "tools": [
            {"type": "function", "function": {"name": n, "description": d, "parameters": _schema(p)}}
            for n, d, p in TOOLS
        ],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def anthropic_body(stream: bool) -> dict[str, Any]:
    system, turns = conversation()
    msgs: list[dict[str, Any]] = []
    for t in turns:
        if t["role"] == "assistant":
            i, n, a = t["call"]
            blocks = ([{"type": "text", "text": t["text"]}] if t["text"] else []) + [
                {"type": "tool_use", "id": i, "name": n, "input": a}
            ]
            msgs.append({"role": "assistant", "content": blocks})
        elif t["role"] == "tool":
            msgs.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": t["id"], "content": t["text"]}]}
            )
        else:
            msgs.append({"role": "user", "content": [{"type": "text", "text": t["text"]}]})
    return {
        "model": "bench-model",
        "max_tokens": 4096,
        "stream": stream,
        "messages": msgs,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": n, "description": d, "input_schema": _schema(p)} for n, d, p in TOOLS],
        "metadata": {"user_id": "bench"},
    }


def responses_body(stream: bool) -> dict[str, Any]:
    system, turns = conversation()
    items: list[dict[str, Any]] = []
    for t in turns:
        if t["role"] == "assistant":
            i, n, a = t["call"]
            if t["text"]:
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t["text"]}]}
                )
            items.append({"type": "function_call", "call_id": i, "name": n, "arguments": json.dumps(a)})
        elif t["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": t["id"], "output": t["text"]})
        else:
            items.append({"role": "user", "content": t["text"]})
    return {
        "model": "bench-model",
        "instructions": system,
        "input": items,
        "stream": stream,
        "max_output_tokens": 4096,
        "tools": [{"type": "function", "name": n, "description": d, "parameters": _schema(p)} for n, d, p in TOOLS],
    }


DIALECTS = {
    "openai_chat": ("/v1/chat/completions", openai_body),
    "anthropic": ("/v1/messages", anthropic_body),
    "responses": ("/v1/responses", responses_body),
}


# -- measurement -----------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def closed_loop(n: int, c: int, one: Any) -> tuple[list[float], float, int]:
    lat: list[float] = []
    errors = 0
    left = n

    async def worker(k: int) -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            ok = await one(k)
            if ok:
                lat.append(time.perf_counter() - t0)
            else:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(k) for k in range(c)])
    return lat, time.perf_counter() - t0, errors


async def run_direct(engine: Any, prompt_ids: list[int], stream: bool, n: int, c: int) -> dict[str, Any]:
    from legorl.types import SamplingParams

    params = SamplingParams(max_tokens=4096)

    async def one(_: int) -> bool:
        if stream:
            k = 0
            async for _step in engine.stream(prompt_ids, params):
                k += 1
            return k > 0
        g = await engine.generate(prompt_ids, params)
        return bool(g.completion_ids)

    await closed_loop(max(20, c), c, one)
    lat, wall, errors = await closed_loop(n, c, one)
    return {"p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "rps": len(lat) / wall, "errors": errors}


async def run_proxy(base: str, path: str, body: bytes, stream: bool, n: int, c: int, pid: int) -> dict[str, Any]:
    tls = ssl.create_default_context()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=300)
    clients = [
        httpx.AsyncClient(base_url=base, limits=limits, timeout=300, verify=tls, trust_env=False) for _ in range(c)
    ]
    headers = {"content-type": "application/json", "x-api-key": "bench", "authorization": "Bearer bench"}
    end = (
        b"[DONE]"
        if path.endswith("completions")
        else (b"message_stop" if path.endswith("messages") else b"response.completed")
    )

    async def one(k: int) -> bool:
        async with clients[k].stream("POST", path, content=body, headers=headers) as r:
            data = await r.aread()
        return r.status_code == 200 and (not stream or end in data[-400:])

    try:
        await closed_loop(max(20, c), c, one)
        cpu0 = cpu_seconds(pid)
        lat, wall, errors = await closed_loop(n, c, one)
        cpu = cpu_seconds(pid) - cpu0
    finally:
        await asyncio.gather(*[cl.aclose() for cl in clients])
    return {
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "rps": len(lat) / wall,
        "errors": errors,
        "proxy_cpu_ms_per_req": cpu * 1e3 / max(len(lat), 1),
    }


def template_model(tmp: Path, which: str) -> str:
    """A model name or directory whose tokenizer carries the benchmarked template."""
    if which == "bundled":
        return "tiny-qwen3"
    from tests.helpers.template_util import qwen_tokenizer, template

    tok = qwen_tokenizer(template({"qwen3.5": "qwen3.5-35b-a3b.jinja", "qwen3": "qwen3-30b-a3b.jinja"}[which]))
    d = tmp / f"model-{which}"
    tok.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": len(tok)}))
    return str(d)


def render_ms(model: str) -> dict[str, float]:
    from legorl.models import load_tokenizer
    from legorl.proxy import openai_chat
    from legorl.proxy.renderer import ChatRequest, RenderState
    from legorl.proxy.renderer_choice import make_renderer

    tok = load_tokenizer(model)
    r = make_renderer(tok)
    chat = openai_chat.parse(openai_body(False)).chat
    r.render(chat)  # warm the piece cache
    n = 100
    t = time.perf_counter()
    for _ in range(n):
        r.render(chat)
    fresh = (time.perf_counter() - t) / n * 1e3
    grown = 0.0
    for _ in range(n):
        state = RenderState()
        r.render(ChatRequest(chat.messages[:-1], chat.tools), state)
        t = time.perf_counter()
        r.render(chat, state)
        grown += time.perf_counter() - t
    return {
        "renderer": type(r).__name__,
        "fresh_request_ms": round(fresh, 3),
        "grown_request_ms": round(grown / n * 1e3, 3),
        "prompt_tokens": len(r.render(chat)),
    }


def start_proxy(tmp: Path, model: str = "tiny-qwen3") -> tuple[subprocess.Popen[str], str]:
    cfg = tmp / "bench.toml"
    cfg.write_text(f"[proxy]\nmax_tokens = 4096\n\n[engine]\nscripted_completions = [{json.dumps(REPLY)}]\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "from pathlib import Path; from legorl.proxy.server import run_standalone; "
        f"run_standalone('scripted', {model!r}, '127.0.0.1', {port}, Path({str(tmp / 'out')!r}), "
        f"Path({str(cfg)!r}), insecure=True)"  # a bench on loopback: no token
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "proxy.log", "w"),
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(base + "/health", timeout=1, trust_env=False).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"proxy did not start: {(tmp / 'proxy.log').read_text()[-2000:]}")


def reset(base: str, out: Path) -> None:
    httpx.delete(base + "/legorl/sessions/bench", timeout=600, trust_env=False)
    for name in ("turns.jsonl", "trajectories.jsonl"):
        p = out / name
        if p.exists():
            os.truncate(p, 0)


async def overhead(args: argparse.Namespace) -> list[dict[str, Any]]:
    from legorl.engine.scripted import ScriptedEngine
    from legorl.models import load_tokenizer
    from legorl.proxy import anthropic, openai_chat, responses
    from legorl.proxy.renderer_choice import make_renderer

    cells = []
    with tempfile.TemporaryDirectory(prefix="legorl-bench-") as d:
        tmp = Path(d)
        model = template_model(tmp, args.template)
        tok = load_tokenizer(model)
        engine = ScriptedEngine([REPLY], tok)
        renderer = make_renderer(tok)
        mods = {"openai_chat": openai_chat, "anthropic": anthropic, "responses": responses}
        args.render = render_ms(model)
        print(f"render: {args.render}", file=sys.stderr)
        proc, base = start_proxy(tmp, model)
        try:
            for dialect in args.dialects:
                path, mk = DIALECTS[dialect]
                prompt_ids = renderer.render(mods[dialect].parse(mk(False)).chat)
                for stream in (False, True):
                    body = json.dumps(mk(stream)).encode()
                    for c in args.conc:
                        n = max(args.n, 4 * c)
                        reps: list[tuple[dict[str, Any], dict[str, Any]]] = []
                        for _ in range(args.reps):
                            a = await run_direct(engine, prompt_ids, stream, n, c)
                            reset(base, tmp / "out")
                            b = await run_proxy(base, path, body, stream, n, c, proc.pid)
                            reps.append((a, b))
                            print(
                                f"{dialect:11s} stream={int(stream)} c={c:<3d} direct p50={a['p50_ms']:.2f} "
                                f"proxy p50={b['p50_ms']:.2f} p99={b['p99_ms']:.2f} rps={b['rps']:.0f} "
                                f"cpu/req={b['proxy_cpu_ms_per_req']:.2f} err={b['errors']}",
                                file=sys.stderr,
                            )
                        med = lambda f, reps=reps: round(statistics.median(f(a, b) for a, b in reps), 3)  # noqa: E731
                        cells.append(
                            {
                                "dialect": dialect,
                                "stream": stream,
                                "concurrency": c,
                                "n": n,
                                "reps": args.reps,
                                "prompt_tokens": len(prompt_ids),
                                "body_bytes": len(body),
                                "added_p50_ms": med(lambda a, b: b["p50_ms"] - a["p50_ms"]),
                                "added_p99_ms": med(lambda a, b: b["p99_ms"] - a["p99_ms"]),
                                "direct_p50_ms": med(lambda a, b: a["p50_ms"]),
                                "proxy_p50_ms": med(lambda a, b: b["p50_ms"]),
                                "proxy_rps": med(lambda a, b: b["rps"]),
                                "proxy_cpu_ms_per_req": med(lambda a, b: b["proxy_cpu_ms_per_req"]),
                                "errors": sum(b["errors"] for _, b in reps),
                            }
                        )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    return cells


async def hf_throughput(max_tokens: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "bench"))
    from engine_throughput import run  # helper's benchmark: one function per concurrency level

    from legorl.engine.hf import HFEngine

    engine = HFEngine("tiny-qwen3", device="cpu", seed=0)
    try:
        tok = engine.tokenizer
        text = "Please fix the failing test in utils/parse.py; the parser drops trailing commas. " * 2
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]
        await run(engine, prompt, 4, 4, 8)  # warm-up
        c1 = await run(engine, prompt, 1, 4, max_tokens)
        c16 = await run(engine, prompt, 16, 32, max_tokens)
    finally:
        await engine.close()
    return {
        "model": "tiny-qwen3",
        "max_tokens": max_tokens,
        "prompt_tokens": len(prompt),
        "tokens_per_s_c1": c1["tokens_per_s"],
        "tokens_per_s_c16": c16["tokens_per_s"],
        "c1": c1,
        "c16": c16,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conc", default="1,64,256", help="concurrency levels")
    ap.add_argument("-n", type=int, default=512, help="measured requests per run (at least 4*C)")
    ap.add_argument("--reps", type=int, default=2, help="interleaved direct/proxy repetitions per cell")
    ap.add_argument("--dialects", default="openai_chat,anthropic,responses")
    ap.add_argument("--no-hf", action="store_true", help="skip the hf engine throughput")
    ap.add_argument("--quick", action="store_true", help="C=1,64, n=200, one rep, no hf")
    ap.add_argument(
        "--template",
        default="bundled",
        choices=["bundled", "qwen3.5", "qwen3"],
        help="chat template served: the bundled models' (hand-written renderer) or a published one",
    )
    args = ap.parse_args()
    if args.quick:
        args.conc, args.n, args.reps, args.no_hf = "1,64", 200, 1, True
    args.conc = [int(x) for x in args.conc.split(",")]
    args.dialects = args.dialects.split(",")
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    t0 = time.time()
    out: dict[str, Any] = {
        "bench": "proxy_overhead",
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "reply": REPLY,
        "method": "proxy (own process, standalone, scripted engine, recording) "
        "minus in-process engine calls on the same prompt ids; medians over interleaved reps",
    }
    out["template"] = args.template
    out["overhead"] = run(overhead(args))
    out["render_ms"] = args.render
    if not args.no_hf:
        out["hf_engine"] = run(hf_throughput(64))
    out["loadavg_end"] = os.getloadavg()
    out["elapsed_s"] = round(time.time() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

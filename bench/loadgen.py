"""Closed-loop load generator for an LLM proxy, in OpenAI Chat Completions or Anthropic
Messages, streaming or not; what `bench/proxy_vs_litellm.sh` drives both proxies with.

What one run is. C workers share N measured requests: a worker sends its next request as
soon as it has read the previous answer to the end (a closed loop, as C agent sessions
would). Each worker owns one keep-alive connection (its own httpx client): one shared pool
of C connections costs the client CPU that grows with C and would make the load generator
the bottleneck at C = 256. Before the measured requests, max(20, C) warm-up requests go
over the same connections, unmeasured. N is raised to at least MIN_WAVES x C, so every
worker sends several requests.

The request. Every request is the same coding-agent turn, about 30 KB of JSON and ~6.9k
prompt tokens (cl100k): a ~4.2k-token system prompt, ten earlier messages (the user's
task, then five assistant tool calls - Grep, Read, Bash, Edit, Bash - each answered by its
tool result: a grep listing, a source file, pytest output), a new user message, and five
tool definitions with JSON schemas. In the Anthropic dialect it has Claude Code's shape
(a system block list with `cache_control`, `tool_use` / `tool_result` blocks, `metadata`,
the `x-api-key` and `anthropic-version` headers); in the OpenAI dialect, `tool_calls` and
`role: tool` messages, plus `stream_options.include_usage` when streaming. `--dump-body
DIALECT` prints it.

What counts as OK. HTTP 200 and a complete answer: a stream must end with `data: [DONE]`
(OpenAI) or a `message_stop` event (Anthropic); a JSON answer must hold a `choices[0].message`
(OpenAI) or be a `"type": "message"` with `content` (Anthropic). Anything else is an error,
counted by kind with up to 3 samples kept.

What is measured, per run: latency (request sent to body fully read) p50/p90/p99 and
mean, time to the first body byte for streams, requests/s (OK requests / wall time of the
measured phase), and CPU ms per OK request of this process (`client`) and, with
`--proxy-pid` / `--backend-pid`, of that process and all its descendants (utime + stime
from /proc, read before and after the measured phase: steadier than latency on shared
cores), and their RSS after the run.

Baseline and overhead. With `--direct URL` (an OpenAI-compatible backend, normally
`bench/fake_backend.py`) every repetition runs A then B: A sends the same conversation in
OpenAI form straight to URL, B sends it through the proxy, at the same C and N, so drift
on a shared machine hits both. Overhead = percentile(B) - percentile(A) per repetition;
the report gives its median, min and max over `--reps` repetitions.

A proxy that dies. With `--proxy-pid`, the proxy is checked after every run; a
repetition in which it died is thrown away and logged in `meta.proxy_deaths`.
`--proxy-restart CMD` must start it again and print its new pid as its last line; the
repetition is then redone (up to `--max-restarts` per cell), else the sweep stops with
exit status 3. `--before-proxy-run CMD` runs before every proxy-side run (before its
warm-up, outside the measured window) with the cell in LG_DIALECT, LG_STREAM, LG_C,
LG_REP, LG_N.

    python bench/loadgen.py --target http://127.0.0.1:8765 --direct http://127.0.0.1:9100 \\
        --dialect openai,anthropic --stream off,on -c 1,64 -n 400 --reps 2 --proxy-pid PID
    python bench/loadgen.py --direct http://127.0.0.1:9100 -c 1,16   # the backend alone

Prints (or writes to `--out`) one JSON object `{"meta": {...}, "cells": [...]}`; a cell
holds `dialect`, `stream`, `concurrency`, `n`, `direct` / `proxy` (`reps`: the runs;
`agg`: median/min/max of each latency metric and of `rps`, `errors_total`,
`cpu_ms_per_req_median`) and `overhead_ms`. A markdown table goes to stderr. Only
loopback URLs are accepted. Needs httpx (uvloop is used when present).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

# -- the request: one coding-agent turn, in a neutral form, then per dialect --------------------

_RULES = [
    "Answer briefly; the terminal shows your text in a monospace font.",
    "Read a file before you edit it, so the text you replace matches it exactly.",
    "Prefer the Grep and Glob tools to shell pipelines when you search the repository.",
    "Never guess that a package is installed: look at the project's manifest first.",
    "Run the project's own tests after a change and read their output to the end.",
    "Keep a change small and focused on the task; do not reformat unrelated code.",
    "Do not commit or push unless the user asks for it in so many words.",
    "Quote code locations as path:line so the user can jump to them.",
    "When a command fails, find the cause in its output instead of retrying it unchanged.",
    "Write no comments in code unless the logic would surprise a careful reader.",
    "Never print, log or commit secrets, tokens or keys, even in test fixtures.",
    "Batch independent tool calls into one message when they do not depend on each other.",
    "Use absolute paths in every tool call; the working directory is the repository root.",
    "If the request is ambiguous, ask one short question rather than guessing at length.",
    "Follow the existing style of the file: naming, imports, error handling and tests.",
    "Mark a task done as soon as it is done, and say what you verified and how.",
    "Before deleting anything, check that nothing else in the repository refers to it.",
    "Report what you could not do, and why, instead of leaving it out.",
]
_TOPICS = ["Style", "Tools", "Editing", "Testing", "Git", "Safety", "Questions", "Planning", "Reporting"]
_NOUNS = "parser lexer fixture schema migration cache queue worker session handler config retry".split()


def system_prompt(chars: int = 18_300, seed: int = 11) -> str:
    """A deterministic instruction-style system prompt of about `chars` characters
    (this text runs ~4.4 characters per cl100k token: 18.3k characters is ~4.2k tokens)."""
    rng = random.Random(seed)
    out = ["You are a coding agent that works in the user's repository through the tools below.\n\n"]
    size, section = len(out[0]), 0
    while size < chars:
        lines = [f"## {_TOPICS[section % len(_TOPICS)]}, part {section // len(_TOPICS) + 1}\n"]
        for _ in range(rng.randint(4, 8)):
            rule = rng.choice(_RULES)
            if rng.random() < 0.4:
                rule = f"{rule[:-1]}; this holds for the {rng.choice(_NOUNS)} and {rng.choice(_NOUNS)} code too."
            lines.append(f"* {rule}\n")
        lines.append("\n")
        out += lines
        size += sum(map(len, lines))
        section += 1
    out.append("<environment>\ncwd: /repo\ngit: yes, branch main\nos: linux\n</environment>\n")
    return "".join(out)


def _props(**fields: tuple[str, str]) -> dict[str, Any]:
    return {name: {"type": kind, "description": text} for name, (kind, text) in fields.items()}


TOOLS: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (
        "Bash",
        "Runs a shell command in a persistent session, with an optional timeout. Use it for tests, builds "
        "and git; use the dedicated tools to read or search files.",
        _props(
            command=("string", "The command line to run"),
            timeout=("number", "Timeout in milliseconds, at most 600000"),
            description=("string", "What the command does, in a few words"),
        ),
        ["command"],
    ),
    (
        "Read",
        "Reads a file from the local filesystem by absolute path, up to 2000 lines from the start unless an "
        "offset and a limit are given; lines come back numbered as by cat -n.",
        _props(
            file_path=("string", "Absolute path of the file"),
            offset=("number", "First line to read"),
            limit=("number", "How many lines to read"),
        ),
        ["file_path"],
    ),
    (
        "Edit",
        "Replaces an exact string in a file. The file must have been read first, and the old string must "
        "occur once unless replace_all is set.",
        _props(
            file_path=("string", "Absolute path of the file"),
            old_string=("string", "Text to find"),
            new_string=("string", "Text to put in its place"),
            replace_all=("boolean", "Replace every occurrence"),
        ),
        ["file_path", "old_string", "new_string"],
    ),
    (
        "Grep",
        "Searches file contents with ripgrep regular expressions; can filter by glob or file type and return "
        "matching lines, matching files or counts.",
        _props(
            pattern=("string", "Regular expression"),
            path=("string", "File or directory to search"),
            glob=("string", "Glob that file names must match"),
            output_mode=("string", "content, files_with_matches or count"),
        ),
        ["pattern"],
    ),
    (
        "Glob",
        "Finds files whose paths match a glob pattern such as src/**/*.py, most recently modified first.",
        _props(pattern=("string", "Glob pattern"), path=("string", "Directory to search from")),
        ["pattern"],
    ),
]


def _source_listing(lines: int = 64) -> str:
    body = []
    for i in range(lines):
        if i % 16 == 0:
            body.append(f"def read_section_{i}(items: list[str], level: int = 0) -> dict[str, object]:")
            body.append("    out: dict[str, object] = {}")
        elif i % 16 == 15:
            body.append("    return out")
        else:
            body.append(f"    out['k{i}'] = items[{i % 6}].rstrip() if level <= {i % 4 + 1} else None  # section")
    return "\n".join(f"{n + 1:>6}\t{text}" for n, text in enumerate(body))


def conversation() -> list[dict[str, Any]]:
    """The turn as neutral messages: the task, five (assistant tool call, tool result)
    pairs, then a new user message (which rides on the last result's user message)."""
    listing = _source_listing()
    pytest_out = "\n".join(
        [
            "==================== test session starts ====================",
            "collected 15 items",
            "",
            "tests/test_sections.py .......F.......",
            "",
            "========================= FAILURES ==========================",
            "___________________ test_deeply_nested _____________________",
            "    def test_deeply_nested():",
            ">       assert read('a/b/c/d') == {'a': {'b': {'c': {'d': None}}}}",
            "E       AssertionError: assert {'a': {'b': None}} == {'a': {'b': {'c': {'d': None}}}}",
            "src/sections.py:33: in read_section_32",
            "================== short test summary info ==================",
            "FAILED tests/test_sections.py::test_deeply_nested - AssertionError",
            "=============== 1 failed, 14 passed in 0.42s ================",
        ]
    )
    hits = "\n".join(f"/repo/src/sections.py:{16 * k + 1}:def read_section_{16 * k}(items" for k in range(4))
    edited = "The file /repo/src/sections.py has been edited; lines 33-35 now read:\n" + "\n".join(
        listing.splitlines()[32:35]
    )
    steps = [
        ("I'll look for the section readers first.", "Grep", {"pattern": "def read_section", "path": "/repo"}, hits),
        (None, "Read", {"file_path": "/repo/src/sections.py"}, listing),
        (
            "Let me run the failing test.",
            "Bash",
            {"command": "python -m pytest -x tests/test_sections.py", "description": "Run the section tests"},
            pytest_out,
        ),
        (
            "The level cut-off stops at two; nested sections need more.",
            "Edit",
            {"file_path": "/repo/src/sections.py", "old_string": "level <= 1", "new_string": "level <= 9"},
            edited,
        ),
        (
            None,
            "Bash",
            {"command": "python -m pytest -q tests/test_sections.py", "description": "Run them again"},
            "...............\n15 passed in 0.40s",
        ),
    ]
    msgs: list[dict[str, Any]] = [
        {
            "role": "user",
            "text": "tests/test_sections.py::test_deeply_nested broke after my change to the section reader. "
            "Find out why, fix it, and run the section tests.",
        }
    ]
    for k, (say, tool, args, result) in enumerate(steps):
        call_id = f"toolu_bench_{k + 1:02d}"
        msgs.append({"role": "assistant", "text": say, "call": (call_id, tool, args)})
        msgs.append({"role": "user", "result": (call_id, result)})
    msgs[-1]["text"] = "Thanks. Does test_roundtrip cover this case? Add a test if it does not."
    return msgs


def openai_request(model: str, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    for m in conversation():
        if m["role"] == "assistant":
            call_id, tool, args = m["call"]
            fn = {"name": tool, "arguments": json.dumps(args)}
            messages.append(
                {
                    "role": "assistant",
                    "content": m["text"],
                    "tool_calls": [{"id": call_id, "type": "function", "function": fn}],
                }
            )
            continue
        if "result" in m:
            messages.append({"role": "tool", "tool_call_id": m["result"][0], "content": m["result"][1]})
        if m.get("text"):
            messages.append({"role": "user", "content": m["text"]})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": text,
                    "parameters": {"type": "object", "properties": props, "required": req},
                },
            }
            for name, text, props, req in TOOLS
        ],
        "tool_choice": "auto",
        "max_tokens": 4096,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def anthropic_request(model: str, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for m in conversation():
        blocks: list[dict[str, Any]] = []
        if m["role"] == "assistant":
            if m["text"]:
                blocks.append({"type": "text", "text": m["text"]})
            call_id, tool, args = m["call"]
            blocks.append({"type": "tool_use", "id": call_id, "name": tool, "input": args})
        else:
            if "result" in m:
                blocks.append({"type": "tool_result", "tool_use_id": m["result"][0], "content": m["result"][1]})
            if m.get("text"):
                blocks.append({"type": "text", "text": m["text"]})
        messages.append({"role": m["role"], "content": blocks})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {
        "model": model,
        "max_tokens": 4096,
        "temperature": 0.0,
        "stream": stream,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": system_prompt(), "cache_control": {"type": "ephemeral"}},
        ],
        "messages": messages,
        "tools": [
            {
                "name": name,
                "description": text,
                "input_schema": {"type": "object", "properties": props, "required": req},
            }
            for name, text, props, req in TOOLS
        ],
        "metadata": {"user_id": "user_loadgen_0001"},
    }


# -- the processes being measured ---------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def tree_cpu_s(pid: int) -> float | None:
    """utime + stime in seconds of `pid` and every live descendant (a proxy's workers count)."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))  # fields[1]: ppid
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    if pid not in cpu:
        return None
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo += children.get(p, [])
    return total


def alive(pid: int | None) -> bool:
    """True for no pid (nothing watched) or a running, non-zombie process."""
    if not pid:
        return True
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


# -- one run: C workers, N requests --------------------------------------------------------------


@dataclass
class Endpoint:
    """One URL in one dialect, with its pre-encoded body and headers."""

    url: str
    dialect: str
    stream: bool
    body: bytes
    headers: dict[str, str]

    @classmethod
    def make(cls, url: str, dialect: str, payload: dict[str, Any], api_key: str) -> Endpoint:
        if dialect == "anthropic":
            headers = {"content-type": "application/json", "x-api-key": api_key, "anthropic-version": "2023-06-01"}
        else:
            headers = {"content-type": "application/json", "authorization": f"Bearer {api_key}"}
        return cls(url, dialect, bool(payload.get("stream")), json.dumps(payload).encode(), headers)

    def fault(self, status: int, data: bytes) -> str | None:
        """None for a complete, well-formed answer; else 'kind: detail'."""
        if status != 200:
            return f"http {status}: {data[:200]!r}"
        if self.stream:
            end = b"data: [DONE]" if self.dialect == "openai" else b"message_stop"
            return None if end in data[-256:] else f"truncated stream: no {end.decode()} at {data[-120:]!r}"
        try:
            obj = json.loads(data)
        except ValueError:
            return f"not json: {data[:120]!r}"
        if not isinstance(obj, dict):
            return f"not an object: {data[:120]!r}"
        if self.dialect == "openai":
            choices = obj.get("choices")
            ok = isinstance(choices, list) and bool(choices) and choices[0].get("message") is not None
            return None if ok else f"no choices[0].message: {data[:120]!r}"
        ok = obj.get("type") == "message" and obj.get("content") is not None
        return None if ok else f"not a message: {data[:120]!r}"


@dataclass
class Tally:
    latency_s: list[float] = field(default_factory=list)
    first_byte_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0


async def closed_loop(clients: list[httpx.AsyncClient], ep: Endpoint, n: int) -> Tally:
    """Each client is one worker; together they send `n` requests, each after the last one read."""
    tally = Tally()
    left = n

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            first: float | None = None
            t0 = time.perf_counter()
            try:
                async with client.stream("POST", ep.url, content=ep.body, headers=ep.headers) as resp:
                    parts = []
                    async for piece in resp.aiter_bytes():
                        if first is None and piece:
                            first = time.perf_counter()
                        parts.append(piece)
                t1 = time.perf_counter()
                why = ep.fault(resp.status_code, b"".join(parts))
            except Exception as e:  # noqa: BLE001 - any transport failure is a counted error, not a crash
                t1 = time.perf_counter()
                why = f"{type(e).__name__}: {e}"[:200]
            if why is None:
                tally.latency_s.append(t1 - t0)
                if first is not None:
                    tally.first_byte_s.append(first - t0)
                continue
            kind = why.split(":", 1)[0]
            tally.errors[kind] = tally.errors.get(kind, 0) + 1
            if len(tally.samples) < 3:
                tally.samples.append(why)

    t_start = time.perf_counter()
    await asyncio.gather(*(worker(cl) for cl in clients))
    tally.wall_s = time.perf_counter() - t_start
    return tally


def percentile(sorted_ms: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None when empty."""
    if not sorted_ms:
        return None
    pos = (len(sorted_ms) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def summarise(t: Tally, n: int, stream: bool) -> dict[str, Any]:
    lat = sorted(x * 1000 for x in t.latency_s)
    out: dict[str, Any] = {
        "n": n,
        "ok": len(lat),
        "errors": sum(t.errors.values()),
        "error_kinds": t.errors,
        "error_samples": t.samples,
        "wall_s": round(t.wall_s, 3),
        "rps": round(len(lat) / t.wall_s, 2) if t.wall_s > 0 else None,
        "mean_ms": _r(statistics.fmean(lat)) if lat else None,
    }
    for q in (50, 90, 99):
        out[f"p{q}_ms"] = _r(percentile(lat, q / 100))
    if stream:
        fb = sorted(x * 1000 for x in t.first_byte_s)
        for q in (50, 90, 99):
            out[f"ttfb_p{q}_ms"] = _r(percentile(fb, q / 100))
    return out


async def run_once(ep: Endpoint, n: int, c: int, warmup: int, timeout: float, pids: dict[str, int]) -> dict[str, Any]:
    """Warm up, then measure `n` requests from `c` workers, with the CPU of each watched process."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=600)
    clients = [httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) for _ in range(c)]
    try:
        if warmup:
            await closed_loop(clients, ep, warmup)
        before = {k: tree_cpu_s(p) for k, p in pids.items()}
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        tally = await closed_loop(clients, ep, n)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        after = {k: tree_cpu_s(p) for k, p in pids.items()}
    finally:
        await asyncio.gather(*(cl.aclose() for cl in clients), return_exceptions=True)
    out = summarise(tally, n, ep.stream)
    ok = max(out["ok"], 1)
    client_s = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    cpu = {"client": round(client_s * 1000 / ok, 3)}
    for k in pids:
        b, a = before[k], after[k]
        if b is not None and a is not None:
            cpu[k] = round((a - b) * 1000 / ok, 3)
    out["cpu_ms_per_req"] = cpu
    rss = {k: v for k, p in pids.items() if (v := rss_mb(p)) is not None}
    if rss:
        out["rss_mb_after"] = rss
    out["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return out


# -- a sweep: cells of (dialect, stream, C), repetitions A B A B ----------------------------------

LATENCY_METRICS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "ttfb_p50_ms", "ttfb_p90_ms", "ttfb_p99_ms")


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in (*LATENCY_METRICS, "rps"):
        xs = [r[m] for r in runs if r.get(m) is not None]
        if xs:
            out[m] = _spread(xs)
    out["errors_total"] = sum(r["errors"] for r in runs)
    keys = sorted({k for r in runs for k in r["cpu_ms_per_req"]})
    out["cpu_ms_per_req_median"] = {
        k: round(statistics.median(r["cpu_ms_per_req"][k] for r in runs if k in r["cpu_ms_per_req"]), 3) for k in keys
    }
    return out


def overhead(direct: list[dict[str, Any]], proxy: list[dict[str, Any]]) -> dict[str, Any]:
    """Per repetition, the proxy's percentile minus the direct one (a difference of
    percentiles, not a percentile of differences)."""
    out: dict[str, Any] = {}
    for m in LATENCY_METRICS:
        xs = [p[m] - d[m] for d, p in zip(direct, proxy, strict=True) if p.get(m) is not None and d.get(m) is not None]
        if xs:
            out[m] = {**_spread(xs), "per_rep": [round(x, 3) for x in xs]}
    return out


def join_url(base: str, route: str) -> str:
    """`base` may or may not end in /v1 already."""
    base = base.rstrip("/")
    if base.endswith("/v1") and route.startswith("/v1/"):
        route = route[3:]
    return base + route


def _hook(cmd: str, meta: dict[str, Any], **cell: Any) -> None:
    env = {**os.environ, **{f"LG_{k.upper()}": str(int(v) if isinstance(v, bool) else v) for k, v in cell.items()}}
    rc = subprocess.run(cmd, shell=True, env=env, check=False).returncode
    if rc:
        meta.setdefault("hook_failures", []).append({**cell, "rc": rc})
        print(f"!! --before-proxy-run exited {rc} at {cell}", file=sys.stderr, flush=True)


def _restart(cmd: str) -> int:
    done = subprocess.run(cmd, shell=True, check=False, stdout=subprocess.PIPE, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines or not lines[-1].strip().isdigit():
        raise SystemExit(f"loadgen: --proxy-restart {cmd!r} exited {done.returncode} without printing a pid")
    return int(lines[-1])


async def sweep(a: argparse.Namespace) -> dict[str, Any]:
    pids = {k: p for k, p in (("proxy", a.proxy_pid), ("backend", a.backend_pid)) if p}
    meta: dict[str, Any] = {
        "argv": ["***" if i and sys.argv[i - 1] == "--api-key" else x for i, x in enumerate(sys.argv)],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "label": a.label,
        "body_bytes": {d: len(json.dumps(mk(a.model, False))) for d, mk in BODIES.items()},
    }
    cells: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for dialect in a.dialects if a.target else ["direct"]:
        for stream in a.streams:
            for c in a.concs:
                n = max(a.n, a.min_waves * c)
                warm = max(20, c) if a.warmup < 0 else a.warmup
                sides: list[tuple[str, Endpoint]] = []
                if a.direct:
                    sides.append(
                        (
                            "direct",
                            Endpoint.make(
                                join_url(a.direct, ROUTES["openai"]),
                                "openai",
                                openai_request(a.model, stream),
                                a.api_key,
                            ),
                        )
                    )
                if a.target:
                    body = BODIES[dialect](a.model, stream)
                    sides.append(
                        ("proxy", Endpoint.make(join_url(a.target, ROUTES[dialect]), dialect, body, a.api_key))
                    )
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
                restarts, rep = 0, 0
                while rep < a.reps:
                    got: dict[str, dict[str, Any]] = {}
                    for name, ep in sides:
                        if name == "proxy" and not alive(pids.get("proxy")):
                            break
                        if name == "proxy" and a.before_proxy_run:
                            _hook(a.before_proxy_run, meta, dialect=dialect, stream=stream, c=c, rep=rep, n=n)
                        run = await run_once(ep, n, c, warm, a.timeout, pids)
                        if name == "proxy" and not alive(pids.get("proxy")):
                            break  # died during the run: the repetition does not count
                        got[name] = run
                        print(
                            f"[{time.perf_counter() - t0:7.1f}s] {dialect:9s} stream={int(stream)} c={c:<4d} rep={rep} "
                            f"{name:6s} p50={run['p50_ms']} p99={run['p99_ms']} rps={run['rps']} "
                            f"err={run['errors']} cpu/req={run['cpu_ms_per_req']}",
                            file=sys.stderr,
                            flush=True,
                        )
                    if len(got) < len(sides):
                        death = {
                            "dialect": dialect,
                            "stream": stream,
                            "concurrency": c,
                            "rep": rep,
                            "pid": pids.get("proxy"),
                            "at_s": round(time.perf_counter() - t0, 1),
                            "time": time.strftime("%H:%M:%S"),
                        }
                        meta.setdefault("proxy_deaths", []).append(death)
                        print(
                            f"!! the proxy (pid {pids.get('proxy')}) died: repetition discarded",
                            file=sys.stderr,
                            flush=True,
                        )
                        restarts += 1
                        if not a.proxy_restart or restarts > a.max_restarts:
                            meta["proxy_died"] = death
                            meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
                            return {"meta": meta, "cells": cells}
                        pids["proxy"] = _restart(a.proxy_restart)
                        print(f"!! proxy restarted as pid {pids['proxy']}", file=sys.stderr, flush=True)
                        continue
                    for name, run in got.items():
                        runs[name].append(run)
                    rep += 1
                cell: dict[str, Any] = {
                    "dialect": dialect,
                    "stream": stream,
                    "concurrency": c,
                    "n": n,
                    "warmup": warm,
                    "proxy_restarts": restarts,
                }
                for name, rs in runs.items():
                    cell[name] = {"reps": rs, "agg": aggregate(rs)}
                if "direct" in runs and "proxy" in runs:
                    cell["overhead_ms"] = overhead(runs["direct"], runs["proxy"])
                cells.append(cell)
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    meta["loadavg_end"] = os.getloadavg()
    return {"meta": meta, "cells": cells}


BODIES = {"openai": openai_request, "anthropic": anthropic_request}
ROUTES = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


def table(res: dict[str, Any]) -> str:
    """Markdown: one row per cell (medians over repetitions; overhead with its spread)."""

    def med(agg: dict[str, Any], m: str) -> str:
        return f"{agg[m]['median']:.2f}" if m in agg else "-"

    def spread(agg: dict[str, Any], m: str) -> str:
        return f"{agg[m]['median']:.2f} [{agg[m]['min']:.2f}..{agg[m]['max']:.2f}]" if m in agg else "-"

    rows = [
        "| dialect | stream | C | N | direct p50/p99 ms | proxy p50/p99 ms | overhead p50 ms | overhead p99 ms "
        "| proxy rps | proxy CPU ms/req | errors direct/proxy |",
        "|" + "---|" * 11,
    ]
    for c in res["cells"]:
        d = c.get("direct", {}).get("agg", {})
        p = c.get("proxy", {}).get("agg", {})
        o = c.get("overhead_ms", {})
        cpu = p.get("cpu_ms_per_req_median", {}).get("proxy")
        rows.append(
            f"| {c['dialect']} | {'yes' if c['stream'] else 'no'} | {c['concurrency']} | {c['n']} "
            f"| {med(d, 'p50_ms')}/{med(d, 'p99_ms')} | {med(p, 'p50_ms')}/{med(p, 'p99_ms')} "
            f"| {spread(o, 'p50_ms')} | {spread(o, 'p99_ms')} | {med(p, 'rps')} "
            f"| {'-' if cpu is None else cpu} | {d.get('errors_total', '-')}/{p.get('errors_total', '-')} |"
        )
    return "\n".join(rows)


def _loopback(url: str) -> bool:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return parts.scheme in ("http", "https") and (host in ("localhost", "::1") or host.startswith("127."))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="base URL of the proxy under test, e.g. http://127.0.0.1:8765")
    ap.add_argument("--direct", help="base URL of the OpenAI-compatible backend (the A side)")
    ap.add_argument("--dialect", default="openai", help="openai, anthropic, or both, comma-separated")
    ap.add_argument("--stream", default="off", help="off, on, or off,on")
    ap.add_argument("-c", "--concurrency", default="1", help="comma-separated worker counts, e.g. 1,64,256")
    ap.add_argument("-n", type=int, default=1000, help="measured requests per run (raised to --min-waves x C)")
    ap.add_argument("--min-waves", type=int, default=8, help="N is at least this many times C (default 8)")
    ap.add_argument("--warmup", type=int, default=-1, help="unmeasured requests per run (default max(20, C))")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per cell, A then B each time")
    ap.add_argument("--model", default="bench-model")
    ap.add_argument("--api-key", default="sk-loadgen", help="sent as Bearer (OpenAI) or x-api-key (Anthropic)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    ap.add_argument("--proxy-pid", type=int, help="report this process tree's CPU ms per request as 'proxy'")
    ap.add_argument("--backend-pid", type=int, help="report this process tree's CPU ms per request as 'backend'")
    ap.add_argument("--proxy-restart", metavar="CMD", help="restart a dead proxy; its last stdout line is the pid")
    ap.add_argument("--max-restarts", type=int, default=3, help="restarts allowed per cell (default 3)")
    ap.add_argument("--before-proxy-run", metavar="CMD", help="run before every proxy-side run, unmeasured")
    ap.add_argument("--label", default="", help="free text kept in meta")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--dump-body", choices=sorted(BODIES), help="print one request body and exit")
    a = ap.parse_args(argv)
    if a.dump_body:
        return a
    if not a.target and not a.direct:
        ap.error("give --target (the proxy) and/or --direct (the backend)")
    for url in filter(None, (a.target, a.direct)):
        if not _loopback(url):
            ap.error(f"{url!r} is not a loopback http(s) URL; only 127.0.0.0/8, ::1 and localhost are allowed")
    a.dialects = [x.strip() for x in a.dialect.split(",") if x.strip()]
    if not a.dialects or set(a.dialects) - set(BODIES):
        ap.error(f"--dialect {a.dialect!r}: expected openai, anthropic or both")
    flags = {"off": False, "on": True}
    stream_words = [x.strip() for x in a.stream.split(",") if x.strip()]
    if not stream_words or set(stream_words) - set(flags):
        ap.error(f"--stream {a.stream!r}: expected off, on or off,on")
    a.streams = [flags[x] for x in stream_words]
    try:
        a.concs = [int(x) for x in a.concurrency.split(",") if x.strip()]
    except ValueError:
        ap.error(f"-c {a.concurrency!r}: expected comma-separated positive integers")
    if not a.concs or min(a.concs) < 1:
        ap.error(f"-c {a.concurrency!r}: expected comma-separated positive integers")
    for name in ("n", "reps", "min_waves"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("proxy_pid", "backend_pid"):
        pid = getattr(a, name)
        if pid is not None and not alive(pid):
            ap.error(f"--{name.replace('_', '-')} {pid}: no such running process")
    if a.proxy_restart and not a.proxy_pid:
        ap.error("--proxy-restart needs --proxy-pid (a death is noticed through the pid)")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.dump_body:
        print(json.dumps(BODIES[a.dump_body](a.model, False), indent=1))
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    res = asyncio.run(sweep(a))
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    print(table(res), file=sys.stderr)
    if "proxy_died" in res["meta"]:
        sys.exit(3)


if __name__ == "__main__":
    main()

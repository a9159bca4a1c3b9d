"""The proxy under bad and huge input (issue #13): fuzz counts, memory over a long soak,
and how long a huge prompt stalls another session's stream.

Prints one JSON object:
- `fuzz`: hypothesis-generated bodies for the three dialects (`tests/helpers/proxy_fuzz.py`: plausible
  requests with parts replaced by arbitrary JSON), sent to a standalone proxy; counts of
  2xx / 4xx / 5xx / client timeouts, and `lost_turns` = accepted calls minus turns recorded.
- `soak`: N mixed requests (agent-like sessions of the three dialects, streaming and not,
  closed every 20 turns; malformed bodies; over-deep bodies; requests for fresh session ids
  that are refused; and 18 distinct ~5 MB prompts, each refused as too long), 16 at a time;
  the process's RSS after a warm-up of N/10 requests with 2 of the huge prompts (start), at
  the end (16 huge prompts later), both with no huge prompt in flight, its maximum, and the
  samples every 250 requests taken with none / some huge prompt in flight; open sessions
  and the render cache's estimated bytes at the end.
- `stall`: the longest gap (and the worst p99) between chunks of a streamed answer (one
  token per 5 ms), alone, and over streams run back to back for the whole life of a ~5 MB
  prompt sent by another session (upload, parse, tokenise, refusal, freeing); and the
  longest CPU time one event-loop callback took meanwhile (`loop_callback_cpu_max_ms`:
  what the loop itself did in one go, not inflated by the machine's load, which the gaps
  are; time lost waiting for the GIL held by the render thread is in the gaps only).

The proxy and the load share one process and event loop (a stall of the loop is seen by the
streaming client as well), recording to a temporary directory.

    .venv/bin/python bench/proxy_soak.py                     # 3,000 fuzz, 10,000 soak
    .venv/bin/python bench/proxy_soak.py --fuzz 300 --soak 1000   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `tests.helpers`

from legorl.engine.scripted import ScriptedEngine  # noqa: E402
from legorl.proxy.chatml_renderer import ChatMLRenderer  # noqa: E402
from legorl.proxy.config import ProxyConfig  # noqa: E402
from legorl.proxy.server import ProxyServer  # noqa: E402
from tests.helpers.proxy_fuzz import BODIES, CHAT, MSGS, RESP, ThreadedProxy, turns_recorded  # noqa: E402
from tests.helpers.proxy_util import tokenizer  # noqa: E402

REPLIES = [
    'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>',
    "<think>\nThe file is there.\n</think>\n\nDone: the bug was in parse().",
    "fine, thanks",
]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_server(out: Path, **cfg: Any) -> ProxyServer:
    engine = ScriptedEngine(REPLIES, tokenizer(), latency_s=cfg.pop("latency_s", 0.0))
    return ProxyServer(ProxyConfig(port=0, **cfg), engine, ChatMLRenderer(tokenizer()), standalone=True, out_dir=out)


# -- fuzz ----------------------------------------------------------------------------------


def fuzz(n_total: int) -> dict[str, Any]:
    from hypothesis import HealthCheck, given, settings

    out = Path(tempfile.mkdtemp(prefix="legorl-fuzz-"))
    counts = {"requests": 0, "2xx": 0, "4xx": 0, "5xx": 0, "timeouts": 0}
    five: list[str] = []
    with (
        ThreadedProxy(lambda: make_server(out, max_context=4000)) as tp,
        httpx.Client(base_url=tp.srv.base_url, timeout=30) as client,
    ):

        def run_dialect(path: str) -> None:
            @settings(max_examples=n_total // 3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(body=BODIES[path]())
            def one(body: Any) -> None:
                counts["requests"] += 1
                try:
                    r = client.post(
                        f"/s/fuzz{path}", content=json.dumps(body), headers={"content-type": "application/json"}
                    )
                except httpx.TimeoutException:
                    counts["timeouts"] += 1
                    return
                k = f"{r.status_code // 100}xx"
                counts[k] = counts.get(k, 0) + 1
                if r.status_code >= 500 and len(five) < 5:
                    five.append(f"{path}: {r.text[:200]}")

            one()

        for path in (CHAT, MSGS, RESP):
            run_dialect(path)
        time.sleep(0.2)
        recorded = turns_recorded(out)
    return {**counts, "lost_turns": counts["2xx"] - recorded, "first_5xx": five}


# -- soak and stall ------------------------------------------------------------------------

_VOCAB = ["".join(random.Random(k).choices(string.ascii_lowercase, k=2 + k % 8)) for k in range(5000)]


def _words(rng: random.Random, n_chars: int) -> str:
    """~n_chars of random words: distinct per seed, so no prompt is served from the cache."""
    return " ".join(rng.choices(_VOCAB, k=n_chars // 6 + 1))[:n_chars]


def _agent_body(path: str, turn: int, stream: bool) -> dict[str, Any]:
    hist = []
    for i in range(turn):
        hist += [
            {"role": "user", "content": f"step {i}: run the tests and fix what fails " * 4},
            {"role": "assistant", "content": REPLIES[2]},
        ]
    hist.append({"role": "user", "content": f"step {turn}: go on"})
    if path == CHAT:
        return {"model": "m", "stream": stream, "messages": [{"role": "system", "content": "You are an agent."}, *hist]}
    if path == MSGS:
        return {"model": "m", "stream": stream, "max_tokens": 64, "system": "You are an agent.", "messages": hist}
    return {
        "model": "m",
        "stream": stream,
        "instructions": "You are an agent.",
        "input": [{"type": "message", **m} for m in hist],
    }


def _huge_body(path: str, text: str) -> dict[str, Any]:
    half = len(text) // 2  # two messages: each under max_string_chars, so it is tokenised
    msgs = [
        {"role": "user", "content": text[:half]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": text[half:]},
    ]
    if path == RESP:
        return {"model": "m", "input": [{"type": "message", **m} for m in msgs]}
    return {"model": "m", "max_tokens": 64, "messages": msgs}


async def soak(n: int, huge_mb: float) -> dict[str, Any]:
    rng = random.Random(13)
    out = Path(tempfile.mkdtemp(prefix="legorl-soak-"))
    huge_texts = [_words(random.Random(i), int(huge_mb * 2**20)) for i in range(18)]
    statuses: dict[str, int] = {}
    samples: list[tuple[int, float]] = []
    async with (
        make_server(out, max_context=32768) as srv,
        httpx.AsyncClient(base_url=srv.base_url, timeout=120, limits=httpx.Limits(max_connections=64)) as c,
    ):
        kinds = ["agent"] * 80 + ["bad_json"] * 6 + ["deep"] * 4 + ["fresh_refused"] * 10
        # two huge prompts in the warm-up (the allocator's high-water mark), 16 after it
        huge_at = set(rng.sample(range(n // 20, n // 10), 2)) | set(rng.sample(range(n // 10 + 1, n), 16))
        counter = {"i": 0, "huge_inflight": 0}
        rss_start = 0.0

        async def one(i: int) -> None:
            path = (CHAT, MSGS, RESP)[i % 3]
            if i in huge_at:
                counter["huge_inflight"] += 1
                try:
                    r = await c.post(f"/s/huge-{i}{path}", json=_huge_body(path, huge_texts.pop()))
                finally:
                    counter["huge_inflight"] -= 1
                key = f"huge:{r.status_code}"
            else:
                kind = rng.choice(kinds)
                sid = f"agent-{i % 48}"
                if kind == "agent":
                    s = srv.sessions.open_sessions.get(sid)
                    turn = len(s.turns) if s else 0
                    if turn >= 20:
                        await c.delete(f"/legorl/sessions/{sid}")
                        turn = 0
                    r = await c.post(f"/s/{sid}{path}", json=_agent_body(path, turn, stream=i % 2 == 0))
                elif kind == "bad_json":
                    r = await c.post(
                        f"/s/{sid}{path}",
                        content=b'{"model": "m", "messages": [',
                        headers={"content-type": "application/json"},
                    )
                elif kind == "deep":
                    r = await c.post(f"/s/{sid}{path}", content=b'{"model":"m","x":' + b"[" * 400 + b"]" * 400 + b"}")
                else:  # a fresh key per request, refused: must leave no session behind
                    r = await c.post(f"/s/fresh-{i}{path}", json={"model": "m", "messages": 7, "input": 7})
                key = f"{kind}:{r.status_code}"
            statuses[key] = statuses.get(key, 0) + 1

        async def worker() -> None:
            nonlocal rss_start
            while counter["i"] < n:
                i = counter["i"]
                counter["i"] += 1
                await one(i)
                if i % 250 == 0:
                    samples.append((i, round(rss_mb(), 1), counter["huge_inflight"]))
                if i >= n // 10 and not rss_start and not counter["huge_inflight"] and len(huge_texts) <= 16:
                    await asyncio.sleep(1.5)  # the deferred malloc_trim of the last huge prompt
                    rss_start = rss_mb()  # after the warm-up, with no huge prompt in flight

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(16)))
        elapsed = time.monotonic() - t0
        await asyncio.sleep(1.5)  # as for the start: after the last deferred trim
        rss_end = rss_mb()
        cache = getattr(srv.ctx.renderer, "_cache", None)
        return {
            "requests": n,
            "seconds": round(elapsed, 1),
            "statuses": dict(sorted(statuses.items())),
            "rss_start_mb": round(rss_start, 1),
            "rss_end_mb": round(rss_end, 1),
            "rss_max_mb": max(s[1] for s in samples),
            "rss_change_pct": round(100 * (rss_end / rss_start - 1), 1),
            "rss_quiet_samples_mb": [s[1] for s in samples if s[0] >= n // 10 and not s[2]],
            "rss_samples_with_huge_in_flight_mb": [s[1] for s in samples if s[2]],
            "open_sessions": len(srv.sessions.open_sessions),
            "render_cache_mb": round(getattr(cache, "nbytes", 0) / 2**20, 1),
        }


class PacedEngine:
    """The scripted engine, one token every `step_s` (a stream to watch for stalls)."""

    name = "paced"
    policy_version = 0
    max_context = 32768

    def __init__(self, inner: ScriptedEngine, step_s: float) -> None:
        self.inner, self.step_s = inner, step_s

    async def stream(self, prompt_ids: list[int], params: Any) -> Any:
        async for step in self.inner.stream(prompt_ids, params):
            await asyncio.sleep(self.step_s)
            yield step

    async def close(self) -> None:
        return None


class CallbackCpu:
    """The longest CPU time (of the loop thread) one event-loop callback took while on: a
    figure the machine's load does not inflate, unlike the wall-clock gaps (it leaves out
    time the loop waited for the GIL or for a core)."""

    def __init__(self) -> None:
        self.max_ms, self.where, self.on = 0.0, "", False
        self._orig = asyncio.events.Handle._run

    def __enter__(self) -> CallbackCpu:
        probe, orig = self, self._orig

        def _run(handle: Any) -> None:
            c0 = time.thread_time()
            orig(handle)
            ms = (time.thread_time() - c0) * 1000
            if probe.on and ms > probe.max_ms:
                probe.max_ms, probe.where = ms, repr(handle)[:160]

        asyncio.events.Handle._run = _run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._orig  # type: ignore[method-assign]


async def stall(huge_mb: float) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="legorl-stall-"))
    long_reply = " ".join(f"word{i}" for i in range(600))
    text = _words(random.Random(99), int(huge_mb * 2**20))
    engine = PacedEngine(ScriptedEngine([long_reply], tokenizer()), 0.005)
    cfg = ProxyConfig(port=0, max_tokens=800)
    async with (
        ProxyServer(cfg, engine, ChatMLRenderer(tokenizer()), standalone=True, out_dir=out) as srv,
        httpx.AsyncClient(base_url=srv.base_url, timeout=300) as c,
    ):

        async def stream_gaps() -> tuple[float, float]:
            """(max, p99) ms between the stream's chunks."""
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "write"}]}
            gaps, last = [], None
            async with c.stream("POST", "/s/streamer/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append((now - last) * 1000)
                    last = now
            gaps.sort()
            return round(gaps[-1], 1), round(gaps[int(0.99 * (len(gaps) - 1))], 1)

        alone = await stream_gaps()

        raw = orjson.dumps(_huge_body(CHAT, text))  # encoded up front: the client's own work is not measured

        async def huge() -> tuple[int, float]:
            t0 = time.perf_counter()
            r = await c.post("/s/big/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
            return r.status_code, time.perf_counter() - t0

        with CallbackCpu() as cpu:
            cpu.on = True
            huge_task = asyncio.create_task(huge())
            worst, p99s, streams = 0.0, [], 0
            while not huge_task.done():  # stream back to back for the whole life of the huge request
                m, p = await stream_gaps()
                worst, streams = max(worst, m), streams + 1
                p99s.append(p)
            during = (worst, max(p99s))
            status, huge_s = await huge_task
            cpu.on = False
        return {
            "prompt_mb": huge_mb,
            "gap_alone_ms": {"max": alone[0], "p99": alone[1]},
            "gap_during_huge_ms": {"max": during[0], "p99": during[1]},
            "loop_callback_cpu_max_ms": round(cpu.max_ms, 1),
            "loop_callback_cpu_max_at": cpu.where,
            "streams_during_huge": streams,
            "huge_status": status,
            "huge_seconds": round(huge_s, 2),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fuzz", type=int, default=3000, help="fuzz requests (split over the 3 dialects)")
    ap.add_argument("--soak", type=int, default=10_000, help="soak requests")
    ap.add_argument("--huge-mb", type=float, default=5.0, help="size of the huge prompts")
    ap.add_argument("--skip", nargs="*", default=[], choices=["fuzz", "soak", "stall"])
    args = ap.parse_args()
    res: dict[str, Any] = {"load_avg_start": os.getloadavg()[0]}
    if "stall" not in args.skip:
        res["stall"] = asyncio.run(stall(args.huge_mb))
        print(json.dumps({"stall": res["stall"]}), file=sys.stderr, flush=True)  # progress
    if "fuzz" not in args.skip:
        res["fuzz"] = fuzz(args.fuzz)
        print(json.dumps({"fuzz": res["fuzz"]}), file=sys.stderr, flush=True)
    if "soak" not in args.skip:
        res["soak"] = asyncio.run(soak(args.soak, args.huge_mb))
    res["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""Memory a proxy session holds over one long episode: MoE routing and request bodies, as JSON.

Engines (vLLM, SGLang, `hf`) report routing for the whole prompt on every call, so kept as
reported it grows with turns x context. This builds a paper-scale episode's turns (Qwen3.5-
35B-A3B-like: 40 MoE layers, top-8 of 256 experts; `--turns` calls, the context growing by a
completion and a tool output each call), runs them through the proxy session's
`trim_routing` and `assemble`, and reports the bytes held:
- `nested_lists_gb`: routing as the nested Python lists the engines used to return,
  measured (sys.getsizeof, recursively) on a 256-token sample and scaled per token-row;
- `arrays_untrimmed_mb`: int16 arrays, every turn's full routing kept;
- `arrays_trimmed_mb`: what the session keeps now (each position's rows once);
- `segment_mb`: the assembled segment's routing (what the trainer needs);
- `request_bodies_mb`: the parsed request bodies (OpenAI chat, the history resent every
  call, ~4 characters a token) the session keeps for the record, measured with
  tracemalloc, each body parsed anew as the proxy does, without and with `share_request`.

    .venv/bin/python bench/session_memory.py [--turns 50] [--start 8000] [--completion 300] [--tool 900]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from legorl.proxy.sessions import Session, share_request, trim_routing  # noqa: E402
from legorl.trajectory import assemble  # noqa: E402
from legorl.types import Dialect, FinishReason, Turn, as_routing  # noqa: E402


def nested_bytes(x: object) -> int:
    """Bytes of a nested list of small ints (the ints themselves are cached singletons)."""
    if isinstance(x, list):
        return sys.getsizeof(x) + sum(nested_bytes(v) for v in x)
    return 0


def request_bodies_mb(turns: int, start: int, completion: int, tool: int, share: bool) -> float:
    """Bytes held by `turns` parsed chat bodies of a growing history (tracemalloc)."""
    words = " ".join(f"w{i}" for i in range(2000))
    text = lambda n: (words * (1 + 4 * n // len(words)))[: 4 * n]  # noqa: E731 - ~4 chars a token
    msgs = [{"role": "system", "content": text(start // 2)}, {"role": "user", "content": text(start // 2)}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"t{i}",
                "description": text(100),
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
        for i in range(5)
    ]
    session = Session("bench")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(turns):
        body = orjson.loads(orjson.dumps({"model": "policy", "messages": msgs, "tools": tools}))
        turn = Turn("bench", i, Dialect.OPENAI_CHAT, [], [], [], FinishReason.STOP, {}, request=body)
        if share:
            share_request(session, turn)
        session.turns.append(turn)
        msgs = msgs + [
            {
                "role": "assistant",
                "content": text(completion // 2),
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "t0", "arguments": orjson.dumps({"x": text(completion // 2)}).decode()},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": text(tool)},
        ]
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return round(held / (1 << 20), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--start", type=int, default=8000, help="first prompt's tokens")
    ap.add_argument("--completion", type=int, default=300)
    ap.add_argument("--tool", type=int, default=900, help="tool output tokens added per turn")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    total = args.start + args.turns * (args.completion + args.tool)
    full_T_L_K = rng.integers(0, args.experts, size=(total, args.layers, args.top_k)).astype(np.int16)
    ids = rng.integers(0, 150_000, size=total).tolist()
    sample = full_T_L_K[:256].astype(np.int64).tolist()
    list_bytes_per_row = nested_bytes(sample) / 256 + 8  # + the outer list's slot

    session = Session("bench")
    untrimmed = 0
    rows_reported = 0
    prompt_len = args.start
    trim_s = 0.0
    for i in range(args.turns):
        end = prompt_len + args.completion
        turn = Turn(
            "bench",
            i,
            Dialect.OPENAI_CHAT,
            ids[:prompt_len],
            ids[prompt_len:end],
            [0.0] * args.completion,
            FinishReason.STOP,
            {},
            routed_experts=as_routing(full_T_L_K[:end].copy()),
        )
        untrimmed += turn.routed_experts.nbytes
        rows_reported += end
        t0 = time.perf_counter()
        trim_routing(session, turn)
        trim_s += time.perf_counter() - t0
        session.turns.append(turn)
        prompt_len = end + args.tool
    kept = sum(t.routed_experts.nbytes for t in session.turns)
    traj = assemble(session.turns, "bench")
    seg = traj.segments[0].routed_experts
    assert len(traj.segments) == 1 and seg is not None and np.array_equal(seg, full_T_L_K[: len(seg)])
    mb = 1 << 20
    print(
        json.dumps(
            {
                "turns": args.turns,
                "final_context_tokens": len(seg),
                "layers": args.layers,
                "top_k": args.top_k,
                "nested_lists_gb": round(rows_reported * list_bytes_per_row / (1 << 30), 2),
                "arrays_untrimmed_mb": round(untrimmed / mb, 1),
                "arrays_trimmed_mb": round(kept / mb, 1),
                "segment_mb": round(seg.nbytes / mb, 1),
                "segment_matches_engine_routing": True,
                "trim_ms_per_turn": round(trim_s / args.turns * 1000, 2),
                "request_bodies_mb": {
                    "kept_as_parsed": request_bodies_mb(
                        args.turns, args.start, args.completion, args.tool, share=False
                    ),
                    "shared": request_bodies_mb(args.turns, args.start, args.completion, args.tool, share=True),
                },
            }
        )
    )


if __name__ == "__main__":
    main()

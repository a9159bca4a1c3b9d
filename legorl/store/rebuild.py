"""Rebuild full turns from the delta-encoded rows of the run store.

A turn row keeps only what is new relative to the turn before it in the same session:
the tail of the prompt after the longest prefix shared with the previous
prompt + completion, the conversation items after the prefix shared with the previous
request, and the rest of the request only when it changed. Walking a session's rows in
index order restores everything exactly; the writer uses the same walk to compute the
deltas when its in-memory cache of a session's last turn is cold (after a restart).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from legorl.store.codec import unpack_ids, unpack_text

JSON_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def dumps(obj: Any) -> str:
    """JSON text of `obj`; never raises (what orjson refuses — nesting past 254 levels, an
    integer beyond 64 bits — is written marked, see `proxy.limits.safe_dumps`)."""
    try:
        return orjson.dumps(obj, option=JSON_OPTS).decode()
    except TypeError:
        from legorl.proxy.limits import safe_dumps

        return safe_dumps(obj, JSON_OPTS).decode()


def loads(text: str | bytes | None, default: Any = None) -> Any:
    return orjson.loads(text) if text else default


@dataclass
class TurnState:
    """What the next turn's delta is computed against."""

    index: int
    context_ids: np.ndarray  # prompt + completion
    items: list[Any]  # the request's conversation list
    list_key: str | None
    rest: dict[str, Any]  # the request minus its conversation list


@dataclass
class RebuiltTurn:
    row: sqlite3.Row
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    items: list[Any]
    rest: dict[str, Any]
    msg_base: int  # how many leading items were already in the previous request

    def request(self) -> dict[str, Any]:
        """The raw request body exactly as the harness sent it (key order aside)."""
        req = dict(self.rest)
        if self.row["list_key"]:
            req[self.row["list_key"]] = self.items
        return req


def rebuild_turns(rows: list[sqlite3.Row]) -> list[RebuiltTurn]:
    """Rows of one session in index order → full turns."""
    out: list[RebuiltTurn] = []
    prev: RebuiltTurn | None = None
    for row in rows:
        tail = unpack_ids(row["prompt_tail"])
        completion = unpack_ids(row["completion_ids"])
        base, msg_base = row["prompt_base"] or 0, row["msg_base"] or 0
        linked = prev is not None and prev.row["idx"] == row["idx"] - 1
        if linked and prev is not None:
            prev_ctx = np.concatenate([prev.prompt_ids, prev.completion_ids])
            prompt = np.concatenate([prev_ctx[:base], tail]) if base else tail
            items = prev.items[:msg_base] + loads(unpack_text(row["new_items"]), [])
            rest = loads(unpack_text(row["request_rest"]), None) if row["request_rest"] else prev.rest
        else:
            prompt = tail
            items = loads(unpack_text(row["new_items"]), [])
            rest = loads(unpack_text(row["request_rest"]), {})
        turn = RebuiltTurn(row, prompt, completion, items, rest, msg_base if linked else 0)
        out.append(turn)
        prev = turn
    return out


def state_of(turn: RebuiltTurn) -> TurnState:
    return TurnState(
        index=turn.row["idx"],
        context_ids=np.concatenate([turn.prompt_ids, turn.completion_ids]),
        items=turn.items,
        list_key=turn.row["list_key"],
        rest=turn.rest,
    )


def common_items(a: list[Any], b: list[Any]) -> int:
    """Number of leading conversation items two requests share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

"""Google's Gemini API (`POST /v1beta/models/{model}:generateContent` and kin): Gemini CLI.

Routes (the model is in the path, streaming is in the method name, not the body):
  :generateContent            one GenerateContentResponse
  :streamGenerateContent      `?alt=sse`: one GenerateContentResponse per SSE `data:` line,
                              text and thought parts as they are sampled
  :countTokens                `{"totalTokens": n}`, the true prompt token count
(`/v1`, `/v1alpha` and `tunedModels/` paths are accepted too.) The session id comes from
the URL (`/s/{id}/v1beta/...`), the `x-goog-api-key` header or the `?key=` query.

Request: `contents` of role `user`/`model` (a missing role is `user`) with parts `text`,
`thought: true` text (→ reasoning), `functionCall` (→ tool call, `args` serialised as the
policy writes JSON), `functionResponse` (→ a tool message; a lone `output`/`result`/
`content` string is sent as is, any other response object as JSON), `inlineData`/
`fileData` (→ placeholders); `systemInstruction`; `tools[].functionDeclarations`
(`parameters` or `parametersJsonSchema`; Google's upper-case OpenAPI type names are
lower-cased for the chat template); `generationConfig` (`temperature`, `topP`, `topK`,
`maxOutputTokens`, `stopSequences` are read, `candidateCount` must be 1). Proto-JSON's
snake_case spellings of these fields are accepted too. Other tools (`googleSearch`,
`codeExecution`, ...) and `cachedContent` are refused with a 400 naming them;
`toolConfig`, `safetySettings`, `thinkingConfig`, `labels` are ignored.

Response: `candidates[0].content.parts` — a `thought: true` text part, the text, then one
`functionCall` part per call (with the call's id) — `finishReason` (`STOP`, also for tool
calls as Google sends it; `MAX_TOKENS`), `usageMetadata` (true prompt/candidate counts),
`modelVersion` (the requested model), `responseId`. Errors are Google's
`{"error": {"code", "message", "status"}}` (`errors.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import orjson

from legorl.proxy import fields as F
from legorl.proxy.errors import bad_request
from legorl.proxy.pipeline import Parsed, TurnRun
from legorl.proxy.renderer import ChatRequest
from legorl.proxy.toolcalls import ReasoningDelta, StreamEvent, TextDelta
from legorl.types import Dialect, FinishReason

DIALECT = Dialect.GEMINI
_PATH = re.compile(r"^/(?:v1beta|v1alpha|v1)/((?:models|tunedModels)/[^:/][^:]*):([A-Za-z]+)$")
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
_TYPES = {
    "STRING": "string",
    "NUMBER": "number",
    "INTEGER": "integer",
    "BOOLEAN": "boolean",
    "ARRAY": "array",
    "OBJECT": "object",
    "NULL": "null",
    "TYPE_UNSPECIFIED": "string",
}
_REFUSED_TOOLS = (
    "googleSearch",
    "google_search",
    "googleSearchRetrieval",
    "codeExecution",
    "code_execution",
    "urlContext",
    "url_context",
    "retrieval",
    "computerUse",
    "fileSearch",
    "googleMaps",
)


def match(path: str) -> tuple[str, str] | None:
    """(model, method) of a Gemini API path, or None when the path is not one."""
    m = _PATH.match(path)
    if m is None:
        return None
    return m.group(1).split("/", 1)[1], m.group(2)


def is_gemini_path(path: str) -> bool:
    return _PATH.match(path) is not None


def key_of(query_string: bytes, headers: list[tuple[bytes, bytes]]) -> str | None:
    """The session id a Gemini client sends as its API key: `x-goog-api-key` or `?key=`."""
    for k, v in headers:
        if k == b"x-goog-api-key":
            key = v.decode("latin-1").strip()
            if key:
                return key
    if query_string and b"key=" in query_string:
        keys = parse_qs(query_string.decode("latin-1")).get("key")
        if keys and keys[0].strip():
            return keys[0].strip()
    return None


def _g(
    obj: dict[str, Any], camel: str, snake: str, types: type | tuple[type, ...], where: str, default: Any = None
) -> Any:
    """A field under its JSON name or its proto snake_case name (both are valid REST JSON)."""
    if obj.get(camel) is not None:
        return F.get(obj, camel, types, where, default)
    return F.get(obj, snake, types, where, default)


# -- request -----------------------------------------------------------------------------
def _response_text(resp: Any) -> str:
    """A functionResponse's `response` as the text the policy reads."""
    if isinstance(resp, dict) and len(resp) == 1:
        ((k, v),) = resp.items()
        if k in ("output", "result", "content") and isinstance(v, str):
            return v
    if isinstance(resp, str):
        return resp
    return orjson.dumps(resp).decode() if resp is not None else ""


def _model_message(parts: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, p in enumerate(parts):
        w = f"{where}[{i}]"
        p = F.as_dict(p, w)
        fc = _g(p, "functionCall", "function_call", dict, f"{w}.")
        if fc is not None:
            calls.append(
                {
                    "id": F.get(fc, "id", str, f"{w}.functionCall.", "") or F.new_id("call_"),
                    "type": "function",
                    "function": {
                        "name": F.get(fc, "name", str, f"{w}.functionCall.", required=True),
                        "arguments": F.tool_input_json(fc.get("args") or {}, f"{w}.functionCall.args"),
                    },
                }
            )
            continue
        text = F.get(p, "text", str, f"{w}.")
        if text is not None:
            (reasoning if F.get(p, "thought", bool, f"{w}.", False) else texts).append(text)
        elif (
            _g(p, "inlineData", "inline_data", dict, f"{w}.") is not None
            or _g(p, "fileData", "file_data", dict, f"{w}.") is not None
        ):
            texts.append(F.IMAGE_PLACEHOLDER)
        elif not (p.keys() <= {"thoughtSignature", "thought_signature", "thought"}):
            raise F.unsupported(f"{w}: a model part with fields {sorted(p)}", w)
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _user_messages(parts: list[Any], where: str, calls_by_name: dict[str, list[str]]) -> list[dict[str, Any]]:
    """A user turn: its functionResponse parts become tool messages (in order), the rest
    one user message after them."""
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, p in enumerate(parts):
        w = f"{where}[{i}]"
        p = F.as_dict(p, w)
        fr = _g(p, "functionResponse", "function_response", dict, f"{w}.")
        if fr is not None:
            name = F.get(fr, "name", str, f"{w}.functionResponse.", "")
            cid = F.get(fr, "id", str, f"{w}.functionResponse.", "")
            if not cid and calls_by_name.get(name):  # no id: the oldest open call of that name
                cid = calls_by_name[name].pop(0)
            tools.append({"role": "tool", "tool_call_id": cid, "content": _response_text(fr.get("response"))})
            continue
        text = F.get(p, "text", str, f"{w}.")
        if text is not None:
            texts.append(text)
        elif (
            _g(p, "inlineData", "inline_data", dict, f"{w}.") is not None
            or _g(p, "fileData", "file_data", dict, f"{w}.") is not None
        ):
            texts.append(F.IMAGE_PLACEHOLDER)
        elif _g(p, "functionCall", "function_call", dict, f"{w}.") is not None:
            raise bad_request(f"{w}.functionCall: only a `model` turn can call a function", param=f"{w}.functionCall")
        elif not (p.keys() <= {"thoughtSignature", "thought_signature", "thought"}):
            raise F.unsupported(f"{w}: a user part with fields {sorted(p)}", w)
    if texts or not tools:
        tools.append({"role": "user", "content": "".join(texts)})
    return tools


def _system(body: dict[str, Any]) -> str | None:
    raw = body.get("systemInstruction", body.get("system_instruction"))
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    raw = F.as_dict(raw, "systemInstruction")
    parts = F.as_list(raw.get("parts") or [], "systemInstruction.parts")
    texts = []
    for i, p in enumerate(parts):
        p = F.as_dict(p, f"systemInstruction.parts[{i}]")
        texts.append(F.get(p, "text", str, f"systemInstruction.parts[{i}].", ""))
    return "\n".join(texts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    system = _system(body)
    if system is not None:
        msgs.append({"role": "system", "content": system})
    raw = F.get(body, "contents", list, "", required=True)
    if not raw:
        raise bad_request("contents: must contain at least one content", param="contents")
    open_calls: dict[str, list[str]] = {}
    for i, c in enumerate(raw):
        w = f"contents[{i}]"
        c = F.as_dict(c, w)
        role = F.get(c, "role", str, f"{w}.", "user")
        parts = F.as_list(c.get("parts") or [], f"{w}.parts")
        if role == "model":
            m = _model_message(parts, f"{w}.parts")
            for call in m.get("tool_calls", []):
                open_calls.setdefault(call["function"]["name"], []).append(call["id"])
            msgs.append(m)
        elif role in ("user", "function", "tool"):
            msgs.extend(_user_messages(parts, f"{w}.parts", open_calls))
        else:
            raise bad_request(f"{w}.role: {role!r} is not one of user, model", param=f"{w}.role")
    return msgs


def _schema(s: Any) -> Any:
    """An OpenAPI-subset schema with Google's upper-case type names as JSON Schema."""
    if isinstance(s, dict):
        out = {k: _schema(v) for k, v in s.items()}
        t = out.get("type")
        if isinstance(t, str) and t in _TYPES:
            out["type"] = _TYPES[t]
        return out
    if isinstance(s, list):
        return [_schema(v) for v in s]
    return s


def convert_tools(raw: Any) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for i, t in enumerate(F.as_list(raw, "tools")):
        t = F.as_dict(t, f"tools[{i}]")
        for k in _REFUSED_TOOLS:
            if t.get(k) is not None:
                raise F.unsupported(f"the {k} tool in tools[{i}] (only functionDeclarations)", f"tools[{i}].{k}")
        decls = _g(t, "functionDeclarations", "function_declarations", list, f"tools[{i}].", [])
        for j, d in enumerate(decls):
            w = f"tools[{i}].functionDeclarations[{j}]"
            d = F.as_dict(d, w)
            fn: dict[str, Any] = {"name": F.get(d, "name", str, f"{w}.", required=True)}
            if d.get("description") is not None:
                fn["description"] = F.get(d, "description", str, f"{w}.")
            params = _g(d, "parametersJsonSchema", "parameters_json_schema", dict, f"{w}.")
            if params is None:
                params = _schema(_g(d, "parameters", "parameters", dict, f"{w}.", {"type": "object", "properties": {}}))
            fn["parameters"] = params
            tools.append({"type": "function", "function": fn})
    return tools


def parse_request(body: dict[str, Any], model: str, stream: bool) -> Parsed:
    msgs = _messages(body)
    tools = convert_tools(body["tools"]) if body.get("tools") else []
    if body.get("cachedContent") is not None or body.get("cached_content") is not None:
        raise F.unsupported("cachedContent (no content cache: send the whole conversation)", "cachedContent")
    cfg = _g(body, "generationConfig", "generation_config", dict, "", None) or {}
    w = "generationConfig."
    n = _g(cfg, "candidateCount", "candidate_count", int, w, 1)
    if n != 1:
        raise F.unsupported(
            f"generationConfig.candidateCount={n} (one candidate per request)", "generationConfig.candidateCount"
        )
    max_tokens = F.positive_int(cfg, "maxOutputTokens", w) or F.positive_int(cfg, "max_output_tokens", w)
    stop = F.stop_list(cfg, "stopSequences") or F.stop_list(cfg, "stop_sequences")
    requested = {
        "temperature": F.number(cfg, "temperature", w),
        "top_p": _g(cfg, "topP", "top_p", (int, float), w),
        "top_k": _g(cfg, "topK", "top_k", (int, float), w),
        "max_tokens": max_tokens,
        "seed": F.get(cfg, "seed", int, w),
    }
    prefill = msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
    return Parsed(
        chat=ChatRequest(msgs, tools, add_generation_prompt=not prefill),
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        stop=stop,
        requested={k: v for k, v in requested.items() if v is not None},
    )


def count_request(body: dict[str, Any]) -> ChatRequest:
    """The prompt a countTokens body describes (`contents`, or a whole `generateContentRequest`)."""
    inner = _g(body, "generateContentRequest", "generate_content_request", dict, "", None)
    if inner is not None:
        return parse_request(inner, "", False).chat
    msgs = _messages(body)
    tools = convert_tools(body["tools"]) if body.get("tools") else []
    return ChatRequest(msgs, tools)


def count_tokens_body(n: int) -> bytes:
    return orjson.dumps({"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]})


@dataclass(frozen=True)
class Call:
    """One Gemini model call: the dialect interface `ProxyApp` drives (like the dialect
    modules), bound to the model and the streaming flag that the URL carries."""

    model: str
    stream: bool
    DIALECT: Dialect = DIALECT

    def parse(self, body: dict[str, Any]) -> Parsed:
        return parse_request(body, self.model, self.stream)

    @staticmethod
    def response(run: TurnRun) -> bytes:
        return response(run)

    @staticmethod
    def Stream(run: TurnRun) -> Stream:
        return Stream(run)


# -- response ----------------------------------------------------------------------------
def finish_reason(run: TurnRun) -> str:
    return "MAX_TOKENS" if run.finish_reason is FinishReason.LENGTH else "STOP"


def _usage(run: TurnRun) -> dict[str, Any]:
    return {
        "promptTokenCount": run.prompt_tokens,
        "candidatesTokenCount": run.completion_tokens,
        "totalTokenCount": run.prompt_tokens + run.completion_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": run.prompt_tokens}],
    }


def _tool_args(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}


def _call_part(cid: str, name: str, arguments: str) -> dict[str, Any]:
    return {"functionCall": {"id": cid, "name": name, "args": _tool_args(arguments)}}


def _envelope(run: TurnRun, rid: str, parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if final:
        cand["finishReason"] = finish_reason(run)
    out: dict[str, Any] = {"candidates": [cand]}
    out["usageMetadata"] = (
        _usage(run) if final else {"promptTokenCount": run.prompt_tokens, "totalTokenCount": run.prompt_tokens}
    )
    out["modelVersion"] = run.parsed.model
    out["responseId"] = rid
    return out


def response(run: TurnRun) -> bytes:
    res = run.result
    assert res is not None
    parts: list[dict[str, Any]] = []
    if res.reasoning is not None:
        parts.append({"text": res.reasoning, "thought": True})
    if res.content or not res.tool_calls:
        parts.append({"text": res.content})
    parts.extend(_call_part(c.id, c.name, c.arguments) for c in res.tool_calls)
    return orjson.dumps(_envelope(run, F.new_id(""), parts, True))


class Stream:
    """One GenerateContentResponse per SSE event: each text or thought delta its own
    chunk, each tool call one chunk once complete (the parser releases a call whole), the
    last chunk carrying `finishReason` and the usage."""

    def __init__(self, run: TurnRun) -> None:
        self.run = run
        self.rid = F.new_id("")
        self.sent_any = False

    def _chunk(self, parts: list[dict[str, Any]], final: bool = False) -> bytes:
        return b"data: " + orjson.dumps(_envelope(self.run, self.rid, parts, final)) + b"\r\n\r\n"

    def head(self) -> bytes:
        return b""

    def events(self, evs: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        for e in evs:
            if type(e) is TextDelta:
                if e.text:
                    out.append(self._chunk([{"text": e.text}]))
            elif type(e) is ReasoningDelta:
                if e.text:
                    out.append(self._chunk([{"text": e.text, "thought": True}]))
            elif e.name is not None:
                calls[e.index] = [e.id, e.name, e.arguments]
            else:
                calls[e.index][2] += e.arguments
        for cid, name, args in calls.values():
            out.append(self._chunk([_call_part(cid, name, args)]))
        if out:
            self.sent_any = True
        return b"".join(out)

    def tail(self) -> bytes:
        return self._chunk([] if self.sent_any else [{"text": ""}], final=True)

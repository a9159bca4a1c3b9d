"""Engines: generate by token ids and report what was sampled (ids, logprobs, routing).

Start here: `base.py`, the `Engine` protocol and its optional capabilities
(`HoldsTokenizer`, `WeightsInPlace`, `WeightsFromDisk`, `ServesModelDir`, `RecordsRouting`).
Then `registry.py` (`make_engine(cfg, tokenizer)`: a kind name → its module) and one engine:
`hf.py` (in-process transformers with continuous batching; `kv_batch.py`, `hf_rows.py`,
`sampling.py`, `routing.py` are its parts), `vllm.py` / `sglang.py` (HTTP clients sharing
`http_client.py`), `scripted.py` and `oracle.py` (known answers, for tests and benches).
`serve.py` + `serve_protocol.py` put any engine behind vLLM's completions API
(`legorl engine-serve`); `vllm_server.py` starts a real vLLM on loopback.
"""

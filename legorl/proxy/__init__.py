"""The proxy: harnesses call it as their model API; it records the true tokens.

Start here: `server.py` (`ProxyServer`: in-process for rollouts, or `legorl proxy`), then
`app.py` (the ASGI routes) and `pipeline.py` (one model call, dialect-independent: render →
engine by token ids → parse → `Turn`). The dialects are `openai_chat.py`, `anthropic.py`,
`responses.py` and `gemini.py`; `sessions.py` owns each harness run's turns and
`session_socket.py` is a sandbox's only way to its session. Rendering: `renderer.py` is
the `Renderer` protocol; `renderer_choice.py` chooses between its two implementations,
`chatml_renderer.py` (the bundled template) and `template.py` (a model's own Jinja
template); completions are parsed by `toolcalls.py` / `harmony.py` into `completion.py`'s
types. `config.py` is the `[proxy]` section; `limits.py`, `fields.py`, `errors.py`,
`render_cache.py` and `passthrough.py` are the guards, caches and the external relay.
"""

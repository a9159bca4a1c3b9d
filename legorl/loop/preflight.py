"""`legorl doctor`: pre-flight checks of the whole chain a run config needs.

Each check fails for its real reason with a hint that fixes it; later checks that need a
failed one are skipped (a stopped engine is one red line, not five). The checks:

- engine answers: a short generation by token ids, within a timeout;
- engine logprobs mode (`vllm` / `sglang`): one sampled token's logprob, recomputed by the
  trainer's model, is the processed (temperature-scaled) one, not raw log-softmax;
- chat template round trip: our incremental renderer equals the model's own chat
  template, and render → generate → parse → render-next-turn keeps the recorded ids an
  exact prefix (what makes trajectories one segment);
- sandbox starts (the configured backend, from the base image);
- sandbox isolation: no route to a listener on the host's loopback, no host files;
- harness installed (and, for `command`, its script exists);
- harness reaches its proxy session: from inside a sandbox, through the session socket;
- grading self-test on a task: gold patch → resolved, empty patch → not resolved;
- run store writable (SQLite WAL + FTS5); free disk and memory;
- time budget (with `[run] time_budget_s`): the least work the config asks for, at the
  trainer's and engine's measured speed, fits the budget (legorl/loop/budget.py);
- the silent failures (legorl/ops/): tool calls round-trip from the model's template through
  the proxy to each harness's dialect; routing replay wired (MoE: one dry step, Pearson ≥
  0.99); the learning rate is non-zero on every planned step; each harness's first prompt
  fits the window.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any

from legorl.loop.config import RunConfig
from legorl.monitor.doctor import Check, CheckFailed, store_check
from legorl.types import SamplingParams, Status

SETUP_SANDBOX = "run: bash scripts/setup_sandbox.sh (installs bubblewrap/docker, starts dockerd, builds the base image)"


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def engine_check(cfg: RunConfig) -> Check:
    def fn() -> str:
        from legorl.engine.base import EngineError
        from legorl.engine.registry import make_engine
        from legorl.models import load_tokenizer

        tok = load_tokenizer(cfg.engine.model)
        ids = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

        async def go() -> Any:
            engine = make_engine(cfg.engine, tok)
            try:
                return await asyncio.wait_for(
                    engine.generate(ids, SamplingParams(max_tokens=4, temperature=1.0, seed=0)), 60
                )
            finally:
                await engine.close()

        try:
            gen = _run(go())
        except (EngineError, OSError, asyncio.TimeoutError) as e:
            where = cfg.engine.url or cfg.engine.kind
            raise CheckFailed(
                f"engine {where} did not answer: {type(e).__name__}: {e}",
                fix=f"start the {cfg.engine.kind} server at {cfg.engine.url} or fix engine.url"
                if cfg.engine.url
                else "check the [engine] section (kind, model, device)",
            ) from None
        if len(gen.logprobs) != len(gen.completion_ids) or not gen.completion_ids:
            raise CheckFailed(
                f"engine returned {len(gen.completion_ids)} ids and {len(gen.logprobs)} logprobs",
                fix="the engine must return one logprob per sampled token",
            )
        return f"{cfg.engine.kind}:{cfg.engine.model} generated {len(gen.completion_ids)} tokens"

    return Check("engine answers", fn, timeout=120)


def logprobs_mode_check(cfg: RunConfig) -> Check:
    """A server started without `--logprobs-mode processed_logprobs` reports raw T=1
    log-softmax: importance ratios would be wrong by the temperature. Recompute one token."""

    def fn() -> str:
        import torch
        from transformers import AutoModelForCausalLM

        from legorl.engine.registry import make_engine
        from legorl.engine.sampling import processed_logprobs
        from legorl.models import load_tokenizer, resolve_model

        tok = load_tokenizer(cfg.engine.model)
        ids = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        params = SamplingParams(max_tokens=8, temperature=2.0, seed=0)

        async def go() -> Any:
            engine = make_engine(cfg.engine, tok)
            try:
                return await asyncio.wait_for(engine.generate(ids, params), 60)
            finally:
                await engine.close()

        gen = _run(go())
        model_dir = cfg.engine.served_model_dir or resolve_model(cfg.engine.model)
        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        out = gen.completion_ids
        with torch.no_grad():
            logits_T_V = lm(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1].float()
        n = len(out)
        processed_T = processed_logprobs(
            logits_T_V, torch.full((n,), params.temperature), torch.ones(n), torch.full((n,), -1)
        )[torch.arange(n), out]
        raw_T = torch.log_softmax(logits_T_V, -1)[torch.arange(n), out]
        k = int((processed_T - raw_T).abs().argmax())  # the token that tells the two modes apart best
        got, processed, raw = gen.logprobs[k], processed_T[k].item(), raw_T[k].item()
        if abs(got - processed) < 1e-2 and abs(got - processed) < abs(got - raw):
            return f"processed logprobs (token {k}: server {got:.4f}, recomputed {processed:.4f}, raw {raw:.4f})"
        if abs(got - raw) < 1e-2:
            flag = "--logprobs-mode processed_logprobs" if cfg.engine.kind == "vllm" else "processed logprobs"
            raise CheckFailed(
                f"the server reports raw log-softmax logprobs ({got:.4f}; processed at T=2 is {processed:.4f})",
                fix=f"restart the {cfg.engine.kind} server with {flag}",
            )
        raise CheckFailed(
            f"the server's logprob {got:.4f} is neither the processed ({processed:.4f}) nor the raw "
            f"({raw:.4f}) one of {model_dir}",
            fix="serve the trainer's model (engine.model / engine.served_model_dir) in float32",
        )

    return Check("engine logprobs mode", fn, needs=("engine answers",), timeout=180)


def template_check(cfg: RunConfig) -> Check:
    def fn() -> str:
        from legorl.engine.registry import make_engine
        from legorl.models import load_tokenizer
        from legorl.proxy.renderer import ChatRequest, RenderState
        from legorl.proxy.renderer_choice import PROBE_TOOLS, make_renderer, round_trip
        from legorl.proxy.template import TemplateError
        from legorl.proxy.toolcalls import parse_completion

        tok = load_tokenizer(cfg.engine.model)
        try:
            r = make_renderer(tok)
            parity = round_trip(tok)
        except TemplateError as e:
            raise CheckFailed(
                str(e),
                fix="serve a model whose chat template is one of the supported families "
                "(Qwen2.5/Qwen3/Qwen3.5/Qwen3-Coder, gpt-oss, GLM-4.5, ChatML without tools)",
            ) from None
        tools = PROBE_TOOLS
        msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "List the files."}]
        state = RenderState()
        prompt = r.render(ChatRequest(msgs, tools), state)

        async def go() -> Any:
            engine = make_engine(cfg.engine, tok)
            try:
                return await asyncio.wait_for(engine.generate(prompt, SamplingParams(max_tokens=24, seed=0)), 60)
            finally:
                await engine.close()

        gen = _run(go())
        text = r.decode([i for i in gen.completion_ids if i not in r.eos_ids])
        parsed = parse_completion(text, r.tool_format, getattr(r, "starts_in_reasoning", False))
        state.remember(gen.completion_ids, parsed, prompt)
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning}
        if parsed.tool_calls:
            reply["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.tool_calls
            ]
        nxt = msgs + [reply, {"role": "user", "content": "Go on."}]
        again = r.render(ChatRequest(nxt, tools), state)
        if again[: len(prompt) + len(gen.completion_ids)] == prompt + gen.completion_ids:
            return f"{parity}; next turn extends {len(prompt) + len(gen.completion_ids)} ids"
        if again == r.render(ChatRequest(nxt, tools)):
            return f"{parity}; the template rewrites the reply in history: a new segment (the documented rule)"
        raise CheckFailed(
            "the next turn's prompt neither extends prompt + completion nor equals the template's rendering",
            fix="report a bug: the renderer's splicing lost the sampled ids",
        )

    return Check("chat template round trip", fn, needs=("engine answers",), timeout=120)


def sandbox_checks(cfg: RunConfig) -> list[Check]:
    backend_name = cfg.sandbox.backend

    async def with_sandbox(body: Any, proxy_socket: str | None = None) -> Any:
        from legorl.sandbox import open_backend
        from legorl.sandbox.base import SandboxSpec
        from legorl.tasks.image import TaskImages

        images = TaskImages(backend=backend_name)
        base = await images.base()
        backend = open_backend(backend_name, images.store)
        try:
            await backend.ensure_image(base.key)
            sb = await backend.start(SandboxSpec(image=base.key, workdir="/", proxy_socket=proxy_socket))
            async with sb:
                return await body(sb)
        finally:
            await backend.aclose()

    def starts() -> str:
        async def body(sb: Any) -> str:
            res = await sb.exec("echo ok", timeout_s=30)
            if res.exit_code != 0 or "ok" not in res.stdout:
                raise CheckFailed(f"exec in a fresh sandbox failed: {res.stderr[-300:]}", fix=SETUP_SANDBOX)
            return f"{backend_name} sandbox started and ran a command"

        try:
            return _run(with_sandbox(body))
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001 - any start failure is this check's finding
            raise CheckFailed(
                f"{backend_name} sandbox did not start: {type(e).__name__}: {e}", fix=SETUP_SANDBOX
            ) from None

    def isolation() -> str:
        marker = Path(tempfile.gettempdir()) / f"legorl-doctor-{uuid.uuid4().hex}"
        marker.write_text("host secret")
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        async def body(sb: Any) -> str:
            probe = (
                f'python3 -c "import socket,sys; s=socket.socket(); s.settimeout(2); '
                f"sys.exit(0 if s.connect_ex(('127.0.0.1',{port}))==0 else 1)\""
            )
            net = await sb.exec(probe, timeout_s=20)
            files = await sb.exec(f"test -e {marker}", timeout_s=20)
            if net.exit_code == 0:
                raise CheckFailed(
                    f"a sandbox reached the host's 127.0.0.1:{port}", fix="the backend must run with no network"
                )
            if files.exit_code == 0:
                raise CheckFailed(
                    f"a sandbox can see the host file {marker}", fix="the backend must not mount host paths"
                )
            return "no host loopback, no host files"

        try:
            return _run(with_sandbox(body))
        finally:
            listener.close()
            marker.unlink(missing_ok=True)

    def reaches_proxy() -> str:
        from legorl.engine.scripted import ScriptedEngine
        from legorl.models import load_tokenizer
        from legorl.proxy.renderer_choice import make_renderer
        from legorl.proxy.server import ProxyServer
        from legorl.proxy.session_socket import SessionSocket

        async def go() -> str:
            tok = load_tokenizer(cfg.engine.model)
            proxy = ProxyServer(
                cfg.proxy.model_copy(update={"port": 0}), ScriptedEngine(["pong"], tok), make_renderer(tok)
            )
            async with proxy:
                proxy.open_session("doctor")
                with tempfile.TemporaryDirectory() as d:
                    async with SessionSocket(proxy.app, "doctor", Path(d) / "s.sock") as ss:

                        async def body(sb: Any) -> str:
                            code = (
                                "import json,os,urllib.request; "
                                "b=json.dumps({'model':'m','messages':[{'role':'user','content':'ping'}]}).encode(); "
                                "r=urllib.request.urlopen(urllib.request.Request("
                                "os.environ.get('U','http://127.0.0.1:8000')+'/v1/chat/completions',"
                                "data=b,headers={'content-type':'application/json'}),timeout=30); "
                                "print(json.load(r)['choices'][0]['message']['content'])"
                            )
                            return (await sb.exec(f'python3 -c "{code}"', timeout_s=60)).stdout.strip()

                        said = await with_sandbox(body, proxy_socket=ss.path)
                turns = proxy.close_session("doctor")
            if said != "pong" or len(turns) != 1:
                raise CheckFailed(
                    f"the sandbox did not reach its session (got {said!r}, {len(turns)} turns)",
                    fix="the forwarder inside the sandbox must reach the session socket; " + SETUP_SANDBOX,
                )
            return "a sandbox reached its own proxy session through its socket"

        return _run(go())

    return [
        Check("sandbox starts", starts, fix=SETUP_SANDBOX, timeout=600),
        Check("sandbox isolation", isolation, needs=("sandbox starts",), timeout=120),
        Check("sandbox reaches its proxy session", reaches_proxy, needs=("sandbox starts",), timeout=120),
    ]


def harness_check(cfg: RunConfig) -> Check:
    def fn() -> str:
        h = cfg.harness
        if h.name == "command":
            if h.command_file is None or not Path(h.command_file).is_file():
                raise CheckFailed(f"command file {h.command_file} does not exist", fix="set harness.command_file")
            return f"command harness: {h.command_file}"
        try:
            from legorl.harness import install
        except ImportError as e:
            raise CheckFailed(f"harness support is not installed: {e}", fix="reinstall the package") from None
        try:
            mounts = install.mounts_for(h.name)
        except install.HarnessNotInstalled as e:
            raise CheckFailed(str(e), fix="run: bash scripts/setup_harnesses.sh") from None
        return f"{h.name}: {len(mounts)} layer(s) built under {install.layers_root()}"

    return Check("harness installed", fn, timeout=60)


def grading_check(cfg: RunConfig) -> Check:
    def fn() -> str:
        from legorl.loop.startup import load_task_split
        from legorl.sandbox import open_backend
        from legorl.tasks.image import TaskImages
        from legorl.tasks.kinds import kind_of
        from legorl.verify.grade import grade

        try:
            task = load_task_split(cfg, cfg.run.split)[0]
        except ValueError as e:  # TaskFileError and an empty split
            raise CheckFailed(str(e), fix="fix run.tasks / run.split (see the message)") from None

        async def go() -> tuple[Any, Any]:
            kind = kind_of(task)
            images = TaskImages(backend=cfg.sandbox.backend)
            image = await images.for_task(task, kind)
            backend = open_backend(cfg.sandbox.backend, images.store)
            try:
                try:  # the gold patch, or a Harbor task's solution/solve.sh run as validate runs it
                    gold_diff = await kind.oracle(backend, image)
                except ValueError as e:
                    raise CheckFailed(
                        f"task {task.instance_id}: {e}", fix=f"run: legorl tasks validate {cfg.run.tasks}"
                    ) from None
                return await grade(task, gold_diff, backend, image, kind=kind), await grade(
                    task, "", backend, image, kind=kind
                )
            finally:
                await backend.aclose()

        gold, empty = _run(go())
        if gold.status is not Status.RESOLVED:
            raise CheckFailed(
                f"task {task.instance_id}: the gold patch gives {gold.status.value}, not resolved",
                fix=f"run: legorl tasks validate {cfg.run.tasks} (the task or its image is broken)",
            )
        if empty.status is Status.RESOLVED:
            raise CheckFailed(
                f"task {task.instance_id}: the empty patch resolves it",
                fix="the task's FAIL_TO_PASS tests do not fail before the fix; regenerate it",
            )
        return f"{task.instance_id}: gold resolved, empty {empty.status.value}"

    return Check("grading self-test", fn, needs=("sandbox starts",), timeout=600)


def resources_check(run_dir: Path, min_disk_gb: float = 5.0, min_mem_gb: float = 2.0) -> Check:
    def fn() -> str:
        probe = run_dir if run_dir.exists() else Path(os.path.abspath(run_dir)).parent
        while not probe.exists():
            probe = probe.parent
        disk = shutil.disk_usage(probe).free / 2**30
        mem = 0.0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    mem = int(line.split()[1]) / 2**20
        if disk < min_disk_gb:
            raise CheckFailed(f"{disk:.1f} GiB free under {probe}", fix=f"free disk space (≥ {min_disk_gb} GiB)")
        if mem < min_mem_gb:
            raise CheckFailed(f"{mem:.1f} GiB memory available", fix=f"free memory (≥ {min_mem_gb} GiB)")
        return f"{disk:.0f} GiB disk free, {mem:.1f} GiB memory available"

    return Check("free disk and memory", fn, timeout=10)


def budget_check(cfg: RunConfig) -> Check:
    """`[run] time_budget_s` against the measured speed (legorl/loop/budget.py); `legorl
    train` runs the same estimate at start-up, before its first rollout."""

    def fn() -> str:
        from legorl.engine.registry import make_engine
        from legorl.loop.budget import check_budget
        from legorl.loop.errors import RunError
        from legorl.loop.startup import load_task_split
        from legorl.models import load_tokenizer
        from legorl.train.trainer import Trainer

        tok = load_tokenizer(cfg.engine.model)
        tasks = load_task_split(cfg, cfg.run.split)
        trainer = Trainer(cfg.trainer)

        async def go() -> Any:
            engine = make_engine(cfg.engine, tok)
            try:
                return await check_budget(cfg, trainer, engine, tok, tasks[0].problem_statement)
            finally:
                await engine.close()

        try:
            est = _run(go())
        except RunError as e:
            raise CheckFailed(str(e), "shrink the run or raise run.time_budget_s") from None
        return est.line(cfg.run.time_budget_s or 0.0)

    return Check("time budget", fn, needs=("engine answers",), timeout=600)


def preflight_checks(cfg: RunConfig) -> list[Check]:
    from legorl.ops.plan_checks import lr_check, window_check
    from legorl.ops.replay_check import routing_replay_check
    from legorl.ops.toolcall_check import toolcall_check

    return [
        engine_check(cfg),
        template_check(cfg),
        toolcall_check(cfg),
        *([logprobs_mode_check(cfg)] if cfg.engine.kind in ("vllm", "sglang") else []),
        routing_replay_check(cfg),
        lr_check(cfg),
        *sandbox_checks(cfg),
        harness_check(cfg),
        window_check(cfg),
        grading_check(cfg),
        store_check(cfg.run.dir),
        resources_check(cfg.run.dir),
        *([budget_check(cfg)] if cfg.run.time_budget_s else []),
    ]

"""`legorl doctor`'s sandbox checks: the configured backend starts a sandbox from the base
image; a sandbox reaches neither a listener on the host's loopback nor a host file; and it
reaches its own proxy session through the session socket."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from legorl.monitor.doctor import CheckFailed, check

if TYPE_CHECKING:
    from legorl.loop.config import RunConfig

SETUP_SANDBOX = "run: bash scripts/setup_sandbox.sh (installs bubblewrap/docker, starts dockerd, builds the base image)"


async def with_sandbox(backend_name: str, body: Any, proxy_socket: str | None = None) -> Any:
    """Run `body(sb)` in a sandbox of backend `backend_name` started from the base image."""
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


@check("sandbox starts", fix=SETUP_SANDBOX, timeout=600)
def sandbox_starts_check(cfg: RunConfig) -> str:
    backend_name = cfg.sandbox.backend

    async def body(sb: Any) -> str:
        res = await sb.exec("echo ok", timeout_s=30)
        if res.exit_code != 0 or "ok" not in res.stdout:
            raise CheckFailed(f"exec in a fresh sandbox failed: {res.stderr[-300:]}", fix=SETUP_SANDBOX)
        return f"{backend_name} sandbox started and ran a command"

    try:
        return asyncio.run(with_sandbox(cfg.sandbox.backend, body))
    except CheckFailed:
        raise
    except Exception as e:  # noqa: BLE001 - any start failure is this check's finding
        raise CheckFailed(f"{backend_name} sandbox did not start: {type(e).__name__}: {e}", fix=SETUP_SANDBOX) from None


@check("sandbox isolation", needs=("sandbox starts",), timeout=120)
def sandbox_isolation_check(cfg: RunConfig) -> str:
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
            raise CheckFailed(f"a sandbox can see the host file {marker}", fix="the backend must not mount host paths")
        return "no host loopback, no host files"

    try:
        return asyncio.run(with_sandbox(cfg.sandbox.backend, body))
    finally:
        listener.close()
        marker.unlink(missing_ok=True)


@check("sandbox reaches its proxy session", needs=("sandbox starts",), timeout=120)
def sandbox_proxy_check(cfg: RunConfig) -> str:
    from legorl.engine.scripted import ScriptedEngine
    from legorl.models import load_tokenizer
    from legorl.proxy.renderer_choice import make_renderer
    from legorl.proxy.server import ProxyServer
    from legorl.proxy.session_socket import SessionSocket

    async def go() -> str:
        tok = load_tokenizer(cfg.engine.model)
        proxy = ProxyServer(cfg.proxy.model_copy(update={"port": 0}), ScriptedEngine(["pong"], tok), make_renderer(tok))
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

                    said = await with_sandbox(cfg.sandbox.backend, body, proxy_socket=ss.path)
            turns = proxy.close_session("doctor")
        if said != "pong" or len(turns) != 1:
            raise CheckFailed(
                f"the sandbox did not reach its session (got {said!r}, {len(turns)} turns)",
                fix="the forwarder inside the sandbox must reach the session socket; " + SETUP_SANDBOX,
            )
        return "a sandbox reached its own proxy session through its socket"

    return asyncio.run(go())

"""The live run UI: a JSON API over the run store, server-sent events, and a static page.

`legorl ui --run DIR` calls `serve_ui`; `legorl train` can mount `make_ui_app(DIR)` into
its own server. Everything shown comes from the store (opened readonly, one SQLite
connection per worker thread), so the UI works the same on a live run and on one that
finished or crashed. The page is plain HTML/JS/CSS from `static/` (no build step); it
uses relative URLs and hash routes, so it works mounted under any prefix.

Live updates: `/api/stream` polls the store's high-water marks (max trajectory `rev`,
metric/alert/event ids: four indexed lookups) every `poll_interval` seconds and pushes
what changed as SSE events `trajectory`, `metrics`, `alert`, `event`. A client connects
the stream first and then loads its snapshot, so nothing falls between the two.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import orjson
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from legorl.http_auth import HostCheck, TokenGate, policy
from legorl.loop.report import RESULTS_FILE
from legorl.monitor.monitors import describe_metrics
from legorl.store.queries import compare_tasks
from legorl.store.run_store import RunStore
from legorl.store.schema import db_path

STATIC = Path(__file__).parent / "static"


class ORJSONResponse(JSONResponse):
    """JSON without NaN surprises (NaN/inf become null) and fast for big trajectories."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def sibling_runs(run_dir: Path) -> dict[str, Path]:
    """Run directories next to this one (for comparing runs), by directory name."""
    parent = run_dir.resolve().parent
    return {p.name: p for p in sorted(parent.iterdir()) if p.is_dir() and (p / "run.sqlite").exists()}


def heldout_report(run_dir: Path, store: RunStore) -> dict[str, Any]:
    """The held-out report of the run in `run_dir` (see `/api/heldout`). Only the run's own
    file: a link there (to any JSON on the host) is not followed, and the store answers."""
    try:
        fd = os.open(run_dir / RESULTS_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        data = next((e["data"] for e in reversed(store.events(0, 5000)) if e["kind"] == "heldout"), {})
    return data if isinstance(data, dict) else {}


def make_ui_app(run_dir: Path | str, *, poll_interval: float = 0.5) -> FastAPI:
    """The UI as an ASGI app over `run_dir` (a run directory or its run.sqlite)."""
    path = db_path(run_dir)
    run_dir = path.parent
    store = RunStore(path, readonly=True)
    others: dict[str, RunStore] = {}
    app = FastAPI(title="LEGO-RL run", default_response_class=ORJSONResponse, docs_url=None, redoc_url=None)
    app.state.store = store

    def other_store(name: str | None) -> RunStore:
        if not name or name == run_dir.name:
            return store
        runs = sibling_runs(run_dir)
        if name not in runs:
            raise HTTPException(404, f"no run {name!r} next to {run_dir.name}; known: {sorted(runs)}")
        if name not in others:
            others[name] = RunStore(runs[name], readonly=True)
        return others[name]

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a store query in a worker thread; a bad filter value becomes a 400 naming it."""
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
        except ValueError as e:
            raise HTTPException(400, str(e)) from None

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/run")
    async def run_info() -> dict[str, Any]:
        info = await call(store.run_info)
        info["metric_keys"] = await call(store.metric_keys)
        info["metric_docs"] = describe_metrics()
        info["runs"] = list(sibling_runs(run_dir))
        info["run_dir"] = run_dir.name
        return info

    @app.get("/api/heldout")
    async def heldout() -> dict[str, Any]:
        """The run's held-out before/after table: `heldout_results.json` (rewritten after
        every evaluation, so it is current on a live run), else the store's last `heldout`
        event (a store copied without its directory); `{}` before the first evaluation."""
        return await call(heldout_report, run_dir, store)

    @app.get("/api/status")
    async def run_status() -> dict[str, Any]:
        """`legorl status` of this run (legorl/ops/status.py): its process, progress and the
        failure signatures that match, each with the evidence it read; 503 with the one line
        `status` prints when the store cannot be read."""
        from legorl.ops.status import StatusError, status

        try:
            return await anyio.to_thread.run_sync(status, run_dir)
        except StatusError as e:
            raise HTTPException(503, str(e)) from None

    @app.get("/api/metrics")
    async def metrics(keys: str = "", since_id: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
        return await call(store.metrics, [k for k in keys.split(",") if k] or None, since_id)

    @app.get("/api/alerts")
    async def alerts(
        since_id: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=5000)] = 500
    ) -> list[dict[str, Any]]:
        return await call(store.alerts, since_id, limit)

    @app.get("/api/events")
    async def events(since_id: Annotated[int, Query(ge=0)] = 0) -> list[dict[str, Any]]:
        return await call(store.events, since_id)

    @app.get("/api/steps")
    async def steps() -> list[dict[str, Any]]:
        return await call(store.steps)

    @app.get("/api/trajectories")
    async def trajectories(
        status: str | None = None,
        harness: str | None = None,
        task: str | None = None,
        step: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        flag: str | None = None,
        q: str | None = None,
        cursor: int | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        order: str = "desc",
    ) -> dict[str, Any]:
        return await call(
            store.list_trajectories,
            status=status or None,
            harness=harness or None,
            task=task or None,
            step=step,
            min_reward=min_reward,
            max_reward=max_reward,
            flag=flag or None,
            q=q,
            cursor=cursor,
            limit=limit,
            order=order,
        )

    @app.get("/api/trajectories/{session_id}")
    async def trajectory(session_id: str) -> dict[str, Any]:
        t = await call(store.get_trajectory, session_id)
        if t is None:
            raise HTTPException(404, f"no trajectory with session id {session_id!r}")
        return t

    @app.get("/api/trajectories/{session_id}/turns/{index}/request")
    async def turn_request(session_id: str, index: int) -> dict[str, Any]:
        r = await call(store.get_turn_request, session_id, index)
        if r is None:
            raise HTTPException(404, f"no turn {index} in session {session_id!r}")
        return r

    @app.get("/api/group")
    async def group(step: int, task: str) -> dict[str, Any]:
        rows = await call(store.group, step, task)
        return {"step": step, "task": task, "trajectories": rows}

    @app.get("/api/groups")
    async def groups(step: int) -> dict[str, Any]:
        return {"step": step, "tasks": await call(store.task_stats, step)}

    @app.get("/api/solve_grid")
    async def solve_grid() -> dict[str, Any]:
        """Tasks × steps: each group's graded count and resolved share (the solve grid)."""

        def grid() -> dict[str, Any]:
            steps = [s["step"] for s in store.steps() if s["step"] >= 0]
            tasks: dict[str, dict[int, Any]] = {}
            for step in steps:
                for task, t in store.task_stats(step).items():
                    tasks.setdefault(task, {})[step] = {"n": t["n"], "resolved_rate": t["resolved_rate"]}
            return {"steps": steps, "tasks": tasks}

        return await call(grid)

    @app.get("/api/outcomes")
    async def outcomes(step: int) -> dict[str, Any]:
        """A step's rollouts sorted into gradient / zero-variance / masked / filtered, each with
        why (legorl/ops/outcomes.py)."""
        from legorl.ops.outcomes import step_outcomes

        return await call(step_outcomes, store, step)

    @app.get("/api/ledger")
    async def token_ledger(step: int | None = None) -> dict[str, Any]:
        """Where the sampled tokens went, per harness: trained, or not and why (legorl/ledger.py);
        of one step, or of the whole run."""
        return await call(store.token_ledger, step)

    @app.get("/api/compare")
    async def compare(
        a_step: int | None = None, b_step: int | None = None, a_run: str | None = None, b_run: str | None = None
    ) -> dict[str, Any]:
        a = await call(other_store(a_run).task_stats, a_step)
        b = await call(other_store(b_run).task_stats, b_step)
        return compare_tasks(a, b)

    @app.get("/api/stream")
    async def stream(request: Request) -> StreamingResponse:
        async def gen() -> AsyncIterator[bytes]:
            marks = await call(store.max_ids)
            yield _sse("hello", marks)
            idle = 0.0
            while not await request.is_disconnected():
                now = await call(store.max_ids)
                sent = False
                if now["rev"] > marks["rev"]:
                    for row in await call(store.changed_trajectories, marks["rev"], 500):
                        yield _sse("trajectory", row)
                        marks["rev"] = max(marks["rev"], row["rev"])
                    sent = True
                if now["metric"] > marks["metric"]:
                    m = await call(store.metrics, None, marks["metric"])
                    yield _sse("metrics", m)
                    marks["metric"], sent = m["last_id"], True
                for kind, fn in (("alert", store.alerts), ("event", store.events)):
                    if now[kind] > marks[kind]:
                        for row in await call(fn, marks[kind], 500):
                            yield _sse(kind, row)
                            marks[kind] = max(marks[kind], row["id"])
                        sent = True
                idle = 0.0 if sent else idle + poll_interval
                if idle >= 15.0:  # keep proxies and the browser from timing the stream out
                    yield b": keep-alive\n\n"
                    idle = 0.0
                await asyncio.sleep(poll_interval)

        return StreamingResponse(
            gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return ORJSONResponse({"error": exc.detail}, status_code=exc.status_code)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def gated(app: Any, host: str, port: int, token: str | None) -> TokenGate:
    """The UI behind its token (`legorl/http_auth.py`): a cookie set by `?token=` once, or a
    bearer header; on loopback the `Host` header must name the bound address."""
    return TokenGate(app, token, HostCheck(host).bound(port))


class UIServerThread:
    """The UI served from a background thread of this process (a training process can
    watch itself; tests and the bench use it). `port=0` picks a free port. Authenticated by
    default: `.url` carries a fresh `?token=` (opening it sets the cookie), `.base_url` does
    not; `insecure=True` serves without a token (loopback only)."""

    def __init__(
        self,
        run_dir: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        poll_interval: float = 0.5,
        *,
        token: str | None = None,
        insecure: bool = False,
    ) -> None:
        import uvicorn

        self.token = policy("ui", host, token, insecure)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        bound = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{bound}/"
        self.url = self.base_url + (f"?token={self.token}" if self.token else "")
        app = gated(make_ui_app(run_dir, poll_interval=poll_interval), host, bound, self.token)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, timeout: float = 20.0) -> UIServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"UI server did not start within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> UIServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_ui(
    run_dir: Path, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None, insecure: bool = False
) -> None:
    """Serve the UI for `run_dir` until interrupted. Foreseeable mistakes (no store there,
    port taken, `--insecure` off loopback) raise `SystemExit` with a message instead of a
    traceback. A token is required unless `insecure` (see `UIServerThread`); the printed URL
    carries it."""
    import uvicorn

    secret = policy("ui", host, token, insecure)
    path = db_path(run_dir)
    if not path.exists():
        raise SystemExit(f"error: no run store at {path}; pass the run directory a training run writes to")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise SystemExit(f"error: cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None
    print(f"LEGO-RL UI for {path.parent} at http://{host}:{port}/" + (f"?token={secret}" if secret else ""), flush=True)
    uvicorn.run(gated(make_ui_app(path), host, port, secret), host=host, port=port, log_level="warning")

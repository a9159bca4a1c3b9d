"""Trackers: the run's step metrics, alerts, held-out evaluations and config, mirrored to
TensorBoard, Weights & Biases and MLflow (`[monitor] sinks`, any subset; none by default).

The run store stays the record: a tracker is a copy for a team's own dashboard, so it may
never stop or slow the run. Each sink therefore gets a bounded queue drained by a thread of
its own, which hands each write to the sink's own process (`ProcessSink`: the libraries
never run in, nor take the GIL of, the training process); the loop only enqueues (a full
queue drops the write), a write that raises is dropped, and either prints one warning line
per sink for the whole run. The loop puts the count in each step's record
(`tracker/<sink>/dropped`, writes dropped since the step before). The store forwards to
`Trackers` (`RunStore.attach`), so every metric and alert it records reaches the sinks,
from one place.

Where each writes, all inside the run directory:
- `tensorboard`: event files in `RUN_DIR/tensorboard` (torch's `SummaryWriter`);
- `wandb`: a run in `RUN_DIR/wandb`, online or offline as `WANDB_MODE` says (git, code and
  system-stats capture off; we never log in: online needs the user's own credentials);
- `mlflow`: a SQLite tracking store `RUN_DIR/mlruns/mlflow.db` (artifacts beside it), read
  with `MlflowClient("sqlite:///RUN_DIR/mlruns/mlflow.db")`.

The libraries are the optional extra `legorl[trackers]`; a sink whose library is missing
is named in one line when the config is loaded, and left out.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

SinkName = Literal["tensorboard", "wandb", "mlflow"]
SINK_MODULES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
EXTRA = "legorl[trackers]"
SEVERITY_LEVEL = {"info": 1.0, "warning": 2.0, "critical": 3.0}


def missing(names: list[str]) -> list[str]:
    """The sinks among `names` whose library is not installed."""
    return [n for n in names if importlib.util.find_spec(SINK_MODULES[n]) is None]


def warn_missing(names: list[str], out: Callable[[str], None] | None = None) -> None:
    """One line per sink that cannot run here, naming the extra that brings it."""
    write = out or (lambda line: print(line, file=sys.stderr))
    for n in missing(names):
        write(f"warning: tracker {n!r} is not installed and is left out: pip install '{EXTRA}'")


class Sink(Protocol):
    """One tracker. Called only from its own thread; any exception drops that write."""

    name: str

    def open(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None: ...
    def metrics(self, step: int, values: Mapping[str, float]) -> None: ...
    def alert(self, step: int, name: str, severity: str, message: str, value: float | None) -> None: ...
    def summary(self, name: str, data: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


def _finite(values: Mapping[str, float]) -> dict[str, float]:
    out = {}
    for k, v in values.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[k] = f
    return out


def flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """`{"run": {"steps": 2}}` → `("run.steps", 2)`: a nested config as flat parameters."""
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            yield from flatten(v, key + ".")
        else:
            yield key, v


class TensorBoardSink:
    """Scalars per step, alerts and summaries as text, the config as JSON text at step 0."""

    name = "tensorboard"

    def open(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=str(run_dir / "tensorboard"), flush_secs=10)
        self._w.add_text("config", "```json\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        for k, v in _finite(values).items():
            self._w.add_scalar(k, v, step)

    def alert(self, step: int, name: str, severity: str, message: str, value: float | None) -> None:
        self._w.add_scalar(f"alerts/{name}", SEVERITY_LEVEL.get(severity, 0.0), step)
        self._w.add_text(f"alerts/{name}", f"{severity}: {message}", step)

    def summary(self, name: str, data: Mapping[str, Any]) -> None:
        self._w.add_text(name, "```json\n" + json.dumps(data, indent=1, default=str) + "\n```", 0)

    def close(self) -> None:
        self._w.close()


WANDB_QUIET = {  # W&B's own switches: no console output, no git/code capture, no error reports (Sentry)
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_ERROR_REPORTING": "false",
}


class WandbSink:
    """A W&B run in RUN_DIR/wandb; the mode is the user's (`WANDB_MODE`). Every row carries
    the run-store step as `step` (the x-axis), so W&B's own monotonic step never drops one
    (the warm start logs at step -1, held-out evaluations after the last step)."""

    name = "wandb"

    def open(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        for k, v in WANDB_QUIET.items():
            os.environ.setdefault(k, v)
        import wandb

        settings = wandb.Settings(
            silent=True,
            disable_git=True,
            disable_code=True,
            save_code=False,
            console="off",
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
            x_save_requirements=False,
        )
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "legorl"),
            name=run_name,
            dir=str(run_dir),
            config=dict(config),
            settings=settings,
            reinit="create_new",
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log({**_finite(values), "step": step})

    def alert(self, step: int, name: str, severity: str, message: str, value: float | None) -> None:
        self._run.log({f"alerts/{name}": SEVERITY_LEVEL.get(severity, 0.0), "step": step})
        alerts = list(self._run.summary.get("alerts", []) or [])
        alerts.append({"step": step, "name": name, "severity": severity, "message": message, "value": value})
        self._run.summary["alerts"] = alerts

    def summary(self, name: str, data: Mapping[str, Any]) -> None:
        self._run.summary[name] = json.loads(json.dumps(data, default=str))

    def close(self) -> None:
        self._run.finish()


_MLFLOW_KEY = re.compile(r"[^0-9A-Za-z_\-. /:]")


class MlflowSink:
    """An MLflow run in a SQLite store under RUN_DIR/mlruns: metrics by step, the config as
    parameters (flattened) and `config.json`, alerts as a severity series and `alerts.json`."""

    name = "mlflow"

    def open(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow", "alembic"):  # their INFO lines about creating the database
            logging.getLogger(noisy).setLevel(logging.WARNING)

        root = run_dir / "mlruns"
        root.mkdir(parents=True, exist_ok=True)
        self.uri = tracking_uri(run_dir)
        self._c = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        exp = self._c.get_experiment_by_name("legorl")
        exp_id = (
            exp.experiment_id
            if exp is not None
            else self._c.create_experiment("legorl", artifact_location=(root / "artifacts").as_uri())
        )
        self._id = self._c.create_run(exp_id, run_name=run_name).info.run_id
        params = [Param(k[:250], json.dumps(v, default=str)[:6000]) for k, v in flatten(config)]
        for i in range(0, len(params), 100):
            self._c.log_batch(self._id, params=params[i : i + 100])
        self._c.log_dict(self._id, json.loads(json.dumps(config, default=str)), "config.json")
        self._alerts: list[dict[str, Any]] = []

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(_MLFLOW_KEY.sub("_", k), v, now, step) for k, v in _finite(values).items()]
        for i in range(0, len(ms), 500):
            self._c.log_batch(self._id, metrics=ms[i : i + 500])

    def alert(self, step: int, name: str, severity: str, message: str, value: float | None) -> None:
        self._c.log_metric(self._id, f"alerts/{name}", SEVERITY_LEVEL.get(severity, 0.0), step=step)
        self._alerts.append({"step": step, "name": name, "severity": severity, "message": message, "value": value})
        self._c.log_dict(self._id, self._alerts, "alerts.json")

    def summary(self, name: str, data: Mapping[str, Any]) -> None:
        self._c.log_dict(self._id, json.loads(json.dumps(data, default=str)), f"{name}.json")

    def close(self) -> None:
        self._c.set_terminated(self._id)


def tracking_uri(run_dir: Path) -> str:
    """The MLflow tracking URI of a run directory (what `MlflowSink` writes to)."""
    return f"sqlite:///{(run_dir / 'mlruns' / 'mlflow.db').resolve()}"


SINKS: dict[str, Callable[[], Sink]] = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MlflowSink}
_CLOSE = object()


class ProcessSink:
    """A sink in a child process of its own (`python -m legorl.monitor.sinks NAME`), so that
    importing and running a tracker library (MLflow's database set-up, W&B's service, tens
    of seconds of CPU on a busy machine) never holds the training process's GIL. One JSON
    line per call, answered by one line; called from its lane's thread only, so a slow or
    hung child blocks that thread, never the run. Its output goes to RUN_DIR/trackers/NAME.log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._proc: subprocess.Popen[str] | None = None

    def _call(self, kind: str, *args: Any) -> None:
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps([kind, args], default=str) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RuntimeError(f"its process exited ({self._proc.poll()}); see {self._log}") from None
        answer = self._proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"its process exited ({self._proc.wait()}); see {self._log}")
        error = json.loads(answer)
        if error:
            raise RuntimeError(error)

    def open(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        self._log = run_dir / "trackers" / f"{self.name}.log"
        self._log.parent.mkdir(parents=True, exist_ok=True)
        with self._log.open("a") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "legorl.monitor.sinks", self.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # a Ctrl-C reaches the run, which then closes us in order
            )
        self._call("open", str(run_dir), run_name, dict(config))

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._call("metrics", step, _finite(values))

    def alert(self, step: int, name: str, severity: str, message: str, value: float | None) -> None:
        self._call("alert", step, name, severity, message, value)

    def summary(self, name: str, data: Mapping[str, Any]) -> None:
        self._call("summary", name, data)

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            self._call("close")
        finally:
            self.kill()

    def kill(self, wait_s: float = 10.0) -> None:
        """End the child (it has closed its tracker, or is past saving)."""
        if self._proc is None:
            return
        with contextlib.suppress(OSError):
            self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def serve(name: str) -> None:
    """The child's side of `ProcessSink`: one JSON call per stdin line, the error (or null)
    per line on the original stdout; anything the library prints goes to stderr (the log)."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sink = SINKS[name]()
    for line in sys.stdin:
        kind, args = json.loads(line)
        if kind == "open":
            args[0] = Path(args[0])
        try:
            getattr(sink, kind)(*args)
            error = None
        except Exception as e:  # noqa: BLE001 - reported to the parent, which drops the write
            error = f"{type(e).__name__}: {e}"
        reply.write(json.dumps(error) + "\n")
        reply.flush()
        if kind == "close":
            break


class _Lane:
    """One sink behind its bounded queue and thread; counts what it had to drop."""

    def __init__(self, sink: Sink, size: int, warn: Callable[[str], None]) -> None:
        self.sink, self.warn = sink, warn
        self.q: queue.Queue[Any] = queue.Queue(maxsize=size)
        self.dropped = 0
        self.handled = 0  # writes the sink finished (or failed): how close() tells busy from hung
        self.warned = False
        self.broken = False  # open failed: every write is dropped
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._drain, name=f"legorl-tracker-{sink.name}", daemon=True)

    def _drop(self, n: int, why: str) -> None:
        with self._lock:
            self.dropped += n
            first, self.warned = not self.warned, True
        if first:
            why = " ".join(why.split())  # one line, whatever the library's message looks like
            self.warn(f"warning: tracker {self.sink.name!r}: {why}; its writes are dropped (counted per step)")

    def put(self, item: tuple[str, tuple[Any, ...]]) -> None:
        try:
            self.q.put_nowait(item)
        except queue.Full:
            self._drop(1, f"queue full ({self.q.maxsize} writes behind)")

    def _drain(self) -> None:
        while (item := self.q.get()) is not _CLOSE:
            kind, args = item
            if self.broken:
                if kind != "close":
                    self._drop(1, "it could not start")
                continue
            try:
                getattr(self.sink, kind)(*args)
            except Exception as e:  # noqa: BLE001 - a tracker's failure is never the run's
                self.broken = self.broken or kind == "open"
                self._drop(1, f"{kind} failed: {type(e).__name__}: {str(e)[:200]}")
            self.handled += 1

    def take(self) -> int:
        with self._lock:
            n, self.dropped = self.dropped, 0
        return n


class Trackers:
    """The configured sinks, fed without blocking (see the module docstring)."""

    def __init__(
        self,
        sinks: list[Sink],
        run_dir: Path,
        run_name: str,
        config: Mapping[str, Any],
        *,
        queue_size: int = 4096,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        write = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.lanes = [_Lane(s, queue_size, write) for s in sinks]
        self.closed = False
        for lane in self.lanes:
            lane.put(("open", (run_dir, run_name, dict(config))))
            lane.thread.start()

    @property
    def names(self) -> list[str]:
        return [lane.sink.name for lane in self.lanes]

    def _put(self, kind: str, *args: Any) -> None:
        if not self.closed:
            for lane in self.lanes:
                lane.put((kind, args))

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._put("metrics", int(step), dict(values))

    def alert(self, step: int, name: str, severity: str, message: str, value: float | None = None) -> None:
        self._put("alert", int(step), name, severity, message, value)

    def summary(self, name: str, data: Mapping[str, Any]) -> None:
        self._put("summary", name, dict(data))

    def take_dropped(self) -> dict[str, float]:
        """`tracker/<sink>/dropped`: writes each sink dropped since the last call."""
        return {f"tracker/{lane.sink.name}/dropped": float(lane.take()) for lane in self.lanes}

    def close(self, timeout_s: float = 120.0, stall_s: float = 10.0) -> dict[str, float]:
        """Flush and close every sink, waiting at most `timeout_s` in all, and no longer than
        `stall_s` for a sink that finishes nothing in that time (a hung tracker server: the
        run's end waits for a slow upload, not for one that will never answer). A sink still
        busy then is abandoned: its thread is a daemon. Returns what was dropped since the
        last `take_dropped`, including writes still queued at the deadline."""
        if self.closed:
            return {}
        self.closed = True
        deadline = time.monotonic() + timeout_s
        for lane in self.lanes:
            for item in (("close", ()), _CLOSE):  # behind what is queued; a full queue waits (to the deadline)
                try:
                    lane.q.put(item, timeout=max(0.0, deadline - time.monotonic()))
                except queue.Full:
                    break
        for lane in self.lanes:
            seen, since = lane.handled, time.monotonic()
            while lane.thread.is_alive() and (now := time.monotonic()) < deadline and now - since < stall_s:
                lane.thread.join(min(0.5, max(0.0, deadline - now)))
                if lane.handled != seen:
                    seen, since = lane.handled, time.monotonic()
            if lane.thread.is_alive():
                waited = min(timeout_s, time.monotonic() - since)
                lane._drop(lane.q.qsize(), f"still busy at the end of the run (nothing finished in {waited:.0f} s)")
                if isinstance(lane.sink, ProcessSink):
                    lane.sink.kill(wait_s=0.0)
        return self.take_dropped()


def open_trackers(names: list[str], run_dir: Path, run_name: str, config: Mapping[str, Any]) -> Trackers | None:
    """The configured sinks that are installed (the missing ones were named at config load)."""
    gone = set(missing(names))
    sinks: list[Sink] = [ProcessSink(n) for n in dict.fromkeys(names) if n not in gone]
    return Trackers(sinks, run_dir, run_name, config) if sinks else None


if __name__ == "__main__":
    serve(sys.argv[1])

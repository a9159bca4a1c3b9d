"""Trackers (`[monitor] sinks`): a tiny `legorl train` mirrored to TensorBoard, W&B (offline)
and MLflow, each read back with the library's own reader; a failing or stuck sink never
stops or slows the run, says so in one line, and the step's record counts what it dropped."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from legorl.loop.config import load_run_config
from legorl.monitor import sinks
from legorl.monitor.monitors import MonitorConfig
from legorl.monitor.sinks import TensorBoardSink, Trackers, tracking_uri
from tests.helpers.loop_util import train, write_run


class _Recorder:
    """A sink that keeps what it was given (and can be told to fail or to hang)."""

    name = "recorder"

    def __init__(self, *, fail_on: str = "", hold: threading.Event | None = None) -> None:
        self.fail_on, self.hold = fail_on, hold
        self.rows: list[tuple[str, tuple[Any, ...]]] = []

    def _call(self, kind: str, *args: Any) -> None:
        if self.hold is not None:
            self.hold.wait()
        if kind == self.fail_on:
            raise RuntimeError(f"{kind} is broken\nsecond line of the library's message")
        self.rows.append((kind, args))

    def open(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        self._call("open", run_name)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._call("metrics", step, dict(values))

    def alert(self, step: int, name: str, severity: str, message: str, value: float | None) -> None:
        self._call("alert", step, name, severity)

    def summary(self, name: str, data: Mapping[str, Any]) -> None:
        self._call("summary", name)

    def close(self) -> None:
        self._call("close")


def test_writes_reach_the_sink_in_order(tmp_path: Path) -> None:
    rec = _Recorder()
    t = Trackers([rec], tmp_path, "r", {"a": 1})
    t.metrics(0, {"reward/mean": 0.5})
    t.alert(0, "mismatch", "warning", "low")
    t.summary("heldout", {"rows": []})
    assert t.close(timeout_s=30) == {"tracker/recorder/dropped": 0.0}
    assert [k for k, _ in rec.rows] == ["open", "metrics", "alert", "summary", "close"]
    assert rec.rows[1][1] == (0, {"reward/mean": 0.5})


def test_a_failing_sink_is_dropped_counted_and_named_once(tmp_path: Path) -> None:
    lines: list[str] = []
    bad, good = _Recorder(fail_on="metrics"), _Recorder()
    bad.name = "bad"
    t = Trackers([bad, good], tmp_path, "r", {}, warn=lines.append)
    for s in range(5):
        t.metrics(s, {"x": float(s)})
    t.alert(4, "tamper", "critical", "flagged")
    dropped = t.close(timeout_s=30)
    assert dropped == {"tracker/bad/dropped": 5.0, "tracker/recorder/dropped": 0.0}
    assert len(lines) == 1 and "'bad'" in lines[0] and "\n" not in lines[0] and "metrics failed" in lines[0]
    assert [k for k, _ in bad.rows] == ["open", "alert", "close"]  # only the failing writes were lost
    assert len([k for k, _ in good.rows if k == "metrics"]) == 5


def test_a_stuck_sink_never_slows_the_caller(tmp_path: Path) -> None:
    """A sink that hangs (a tracker server that never answers): the queue fills, further
    writes are dropped at once, and closing gives up at its deadline."""
    hold = threading.Event()
    lines: list[str] = []
    t = Trackers([_Recorder(hold=hold)], tmp_path, "r", {}, queue_size=8, warn=lines.append)
    t0 = time.monotonic()
    for s in range(2000):
        t.metrics(s, {"x": 1.0})
    assert time.monotonic() - t0 < 1.0
    first = t.take_dropped()["tracker/recorder/dropped"]
    assert first >= 2000 - 8 - 1  # the open is queued too; at most queue_size were kept
    t0 = time.monotonic()
    rest = t.close(timeout_s=0.5)
    assert time.monotonic() - t0 < 5.0
    assert rest["tracker/recorder/dropped"] >= 1  # still queued at the deadline
    assert len(lines) == 1 and "queue full" in lines[0]
    hold.set()  # let the thread finish what it holds, then leave
    t.lanes[0].q.put(sinks._CLOSE)
    t.lanes[0].thread.join(10)


def test_a_real_sink_that_cannot_start_drops_everything(tmp_path: Path) -> None:
    (tmp_path / "tensorboard").write_text("a file where the event directory should be")
    lines: list[str] = []
    t = Trackers([TensorBoardSink()], tmp_path, "r", {}, warn=lines.append)
    t.metrics(0, {"x": 1.0})
    t.metrics(1, {"x": 2.0})
    assert t.close(timeout_s=60) == {"tracker/tensorboard/dropped": 3.0}  # the open and both writes
    assert len(lines) == 1 and "open failed" in lines[0]


def test_sinks_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert MonitorConfig().sinks == []
    with pytest.raises(ValueError, match="tensorboard"):
        MonitorConfig(sinks=["tensorbored"])  # type: ignore[list-item]
    monkeypatch.setitem(sinks.SINK_MODULES, "wandb", "legorl_no_such_tracker")
    config = tmp_path / "run.toml"
    config.write_text('[monitor]\nsinks = ["wandb", "tensorboard", "wandb"]\n')
    cfg = load_run_config(config)
    assert cfg.monitor.sinks == ["wandb", "tensorboard"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: tracker 'wandb' is not installed and is left out: pip install 'legorl[trackers]'"]
    t = sinks.open_trackers(cfg.monitor.sinks, tmp_path, "r", {})
    assert t is not None and t.names == ["tensorboard"]
    t.metrics(3, {"x": 1.5})
    assert t.close(timeout_s=60) == {"tracker/tensorboard/dropped": 0.0}
    assert read_tensorboard(tmp_path)[0]["x"] == [(3, 1.5)]  # written by the sink's own process


def test_a_tracker_process_that_dies_only_loses_its_writes(tmp_path: Path) -> None:
    lines: list[str] = []
    sink = sinks.ProcessSink("tensorboard")
    t = Trackers([sink], tmp_path, "r", {}, warn=lines.append)
    t.metrics(0, {"x": 1.0})
    deadline = time.monotonic() + 60
    while t.lanes[0].q.qsize() and time.monotonic() < deadline:  # the open and the first write are through
        time.sleep(0.05)
    time.sleep(0.5)
    assert sink._proc is not None
    sink._proc.kill()  # the child we started, by its own handle
    sink._proc.wait()
    t.metrics(1, {"x": 2.0})
    t.metrics(2, {"x": 3.0})
    dropped = t.close(timeout_s=60)
    assert dropped["tracker/tensorboard/dropped"] >= 2
    assert len(lines) == 1 and "process exited" in lines[0]


# ---- the three libraries' own readers -------------------------------------------------------
def read_tensorboard(run_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = {
        tag.removesuffix("/text_summary"): [
            tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)
        ]
        for tag in acc.Tags()["tensors"]
    }
    return scalars, texts


def read_wandb(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """History rows, the last summary and the config, from the offline run's `.wandb` file."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    ds = datastore.DataStore()
    ds.open_for_scan(str(path))
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    config: dict[str, Any] = {}
    while (data := ds.scan_data()) is not None:
        r = pb.Record()
        r.ParseFromString(data)
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
    return history, summary, config


def read_mlflow(run_dir: Path, out: Path) -> tuple[Any, Any, dict[str, Any]]:
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(run_dir)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("legorl")
    (run,) = client.search_runs([exp.experiment_id])
    arts = {}
    for name in ("config.json", "alerts.json", "heldout.json"):
        arts[name] = json.loads(Path(client.download_artifacts(run.info.run_id, name, str(out))).read_text())
    return client, run, arts


def _store_series(run_dir: Path) -> tuple[dict[str, dict[int, float]], list[tuple[int, str, str]]]:
    db = sqlite3.connect(run_dir / "run.sqlite")
    series: dict[str, dict[int, float]] = {}
    for step, key, value in db.execute("SELECT step, key, value FROM metrics WHERE value IS NOT NULL ORDER BY id"):
        series.setdefault(key, {})[step] = value
    alerts = list(db.execute("SELECT step, name, severity FROM alerts ORDER BY id"))
    return series, alerts


@pytest.mark.slow
def test_train_mirrors_metrics_alerts_heldout_and_config_to_three_trackers(tmp_path: Path) -> None:
    extra = """
[monitor]
sinks = ["tensorboard", "wandb", "mlflow"]
mismatch_pearson_warn = 1.01  # an alert every step (a correlation is never above 1)
[heldout]
tasks = 1
at = ["end"]
"""
    config = write_run(tmp_path, group_size=2, extra=extra)
    env = {
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = train(config)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: tracker" not in proc.stderr, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    series, alerts = _store_series(run_dir)
    assert {s for s, n, _ in alerts if n == "mismatch"} == {0, 1}
    for sink in ("tensorboard", "wandb", "mlflow"):  # each step's record: nothing dropped
        assert series[f"tracker/{sink}/dropped"] == {0: 0.0, 1: 0.0}
    assert "heldout/end/resolved_rate" in series
    keys = ["reward/mean", "train/loss", "mismatch/pearson", "heldout/end/resolved_rate", "tracker/mlflow/dropped"]

    scalars, texts = read_tensorboard(run_dir)
    for key in keys:
        assert dict(scalars[key]) == pytest.approx(series[key]), key
    assert {s for s, _ in scalars["alerts/mismatch"]} == {0, 1}
    assert any("rollout/trainer prob correlation" in t for t in texts["alerts/mismatch"])
    assert json.loads(texts["config"][0].strip("`\njson"))["monitor"]["sinks"] == ["tensorboard", "wandb", "mlflow"]
    assert json.loads(texts["heldout"][0].strip("`\njson"))["evaluations"]["end"]["episodes"] == 1

    history, summary, wcfg = read_wandb(run_dir)
    for key in keys:
        got = {int(r["step"]): r[key] for r in history if key in r}
        assert got == pytest.approx(series[key]), key
    assert {a["step"] for a in summary["alerts"] if a["name"] == "mismatch"} == {0, 1}
    assert summary["heldout"]["evaluations"]["end"]["episodes"] == 1
    assert wcfg["run"]["steps"] == 2 and wcfg["monitor"]["sinks"] == ["tensorboard", "wandb", "mlflow"]

    client, run, arts = read_mlflow(run_dir, tmp_path / "mlflow-artifacts")
    for key in keys:
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert got == pytest.approx(series[key]), key
    assert run.data.params["run.steps"] == "2" and run.info.status == "FINISHED"
    assert arts["config.json"]["harness"]["name"] == "command"
    assert {a["step"] for a in arts["alerts.json"] if a["name"] == "mismatch"} == {0, 1}
    assert arts["heldout.json"]["evaluations"]["end"]["episodes"] == 1


@pytest.mark.slow
def test_train_goes_on_past_a_tracker_that_fails(tmp_path: Path) -> None:
    """W&B cannot start (a `WANDB_MODE` it rejects): the run finishes, says so in one line,
    and each step's record counts the writes the tracker dropped."""
    config = write_run(tmp_path, group_size=2, extra='[monitor]\nsinks = ["wandb"]\n')
    old = os.environ.get("WANDB_MODE")
    os.environ["WANDB_MODE"] = "no-such-mode"
    try:
        proc = train(config)
    finally:
        os.environ.pop("WANDB_MODE") if old is None else os.environ.__setitem__("WANDB_MODE", old)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "tracker 'wandb'" in line]
    assert len(lines) == 1 and "open failed" in lines[0], proc.stderr[-3000:]
    series, _ = _store_series(tmp_path / "run")
    dropped = series["tracker/wandb/dropped"]  # counted as the tracker's thread finds out: per step, then at the end
    db = sqlite3.connect(tmp_path / "run" / "run.sqlite")
    late = [
        json.loads(d)["tracker/wandb/dropped"]
        for (d,) in db.execute("SELECT data FROM events WHERE kind = ?", ("tracker_dropped",))
    ]
    assert set(dropped) == {0, 1} and sum(dropped.values()) + sum(late) >= 1 + 2 * 2  # the open, 2 batches a step...
    assert "reward/mean" in series and set(series["reward/mean"]) == {0, 1}  # the run itself lost nothing


def test_a_hung_sink_delays_the_end_by_its_stall_limit_not_the_whole_timeout(tmp_path: Path) -> None:
    hold = threading.Event()
    lines: list[str] = []
    t = Trackers([_Recorder(hold=hold)], tmp_path, "r", {}, warn=lines.append)
    t.metrics(0, {"x": 1.0})
    t0 = time.monotonic()
    dropped = t.close(timeout_s=120, stall_s=1.0)
    assert time.monotonic() - t0 < 10.0  # not the 120 s a slow upload may have
    assert dropped["tracker/recorder/dropped"] >= 1 and "nothing finished in" in lines[-1]
    hold.set()

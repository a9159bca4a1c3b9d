"""The pre-flight check runner: pass/fail/skip, fix hints, timeouts, exit code, table."""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path

import pytest
from rich.console import Console

from legorl.monitor.doctor import Check, CheckFailed, CheckResult, evaluate_checks, port_check, run_checks, store_check


def console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf


def test_results_fix_hints_skips_and_exit_code() -> None:
    release = threading.Event()

    def hangs() -> None:
        release.wait(10)

    def needs_network() -> None:
        raise CheckFailed("engine at 127.0.0.1:1 refused the connection", fix="start the engine first")

    checks = [
        Check("python", lambda: "3.11.7"),
        Check("engine", needs_network, fix="generic hint"),
        Check("engine model", lambda: "qwen", needs=("engine",)),
        Check("crashes", lambda: 1 / 0, fix="report a bug"),
        Check("hangs", hangs, fix="is the daemon stuck?", timeout=0.3),
        Check("explicit", lambda: CheckResult(False, "3 of 4 images missing")),
    ]
    out = {o.check.name: o.result for o in evaluate_checks(checks)}
    release.set()
    assert out["python"].ok and out["python"].detail == "3.11.7"
    assert not out["engine"].ok and out["engine"].fix == "start the engine first"
    assert out["engine model"].skipped and "needs engine" in out["engine model"].detail
    assert "ZeroDivisionError" in out["crashes"].detail and out["crashes"].fix == "report a bug"
    assert out["hangs"].detail.startswith("timed out after") and out["hangs"].fix == "is the daemon stuck?"
    assert not out["explicit"].ok and out["explicit"].detail == "3 of 4 images missing"

    con, buf = console()
    assert run_checks(checks[:1], con) == 0
    assert "all 1 checks passed" in buf.getvalue()
    con, buf = console()
    assert run_checks(checks[:3], con) == 1
    text = buf.getvalue()
    assert "start the engine first" in text and "✗" in text and "2 of 3 checks did not pass" in text


def test_bad_check_lists_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        evaluate_checks([Check("a", lambda: None), Check("a", lambda: None)])
    with pytest.raises(ValueError, match="unknown check"):
        evaluate_checks([Check("a", lambda: None, needs=("b",))])


def test_builtin_store_and_port_checks(tmp_path: Path) -> None:
    [ok] = evaluate_checks([store_check(tmp_path / "run")])
    assert ok.result.ok and "FTS5" in ok.result.detail and not list((tmp_path / "run").iterdir())
    (tmp_path / "file").write_text("x")
    [bad] = evaluate_checks([store_check(tmp_path / "file" / "run")])
    assert not bad.result.ok and "writable" in bad.result.fix
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        [busy] = evaluate_checks([port_check("127.0.0.1", s.getsockname()[1])])
    assert not busy.result.ok and "another port" in busy.result.fix

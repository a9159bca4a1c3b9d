"""The package is self-contained: built as a wheel, installed into a fresh venv outside the
checkout, it runs `legorl doctor`, `legorl proxy` and `legorl tasks validate` on its shipped
tasks from an unrelated directory. A path into the checkout (scripts/, examples/) or a file
missing from the wheel's package data fails here, not on a user's machine.

The fresh venv gets only the wheel; its third-party dependencies are made visible by one path
line pointing at this venv's site-packages (installing torch and transformers again would add
minutes and prove nothing about our package). A path line does not run that directory's `.pth`
files, so the checkout's editable install stays invisible: the test asserts `legorl` is
imported from the new venv.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy: setuptools writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT / "legorl", src / "legorl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp.glob("legorl-*.whl")
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    (purelib,) = env.glob("lib/python*/site-packages")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(purelib), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (purelib / "_legorl_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # console scripts: --target leaves them in purelib/bin; write the one we use
    (env / "bin" / "legorl").write_text(f"#!{env / 'bin' / 'python'}\nfrom legorl.cli import main\nmain()\n")
    (env / "bin" / "legorl").chmod(0o755)
    return env


def run(venv: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin" / "legorl"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_package_comes_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import legorl, legorl.bpe; print(legorl.__file__); print(legorl.bpe.CHAT_TEMPLATE.is_file())",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=120,
    )
    where, template = out.stdout.split()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(ROOT), where
    assert template == "True"


def test_doctor_and_tasks_validate_from_any_directory(venv: Path, tmp_path: Path) -> None:
    doctor = run(venv, tmp_path, "doctor")
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-3000:]
    assert "checks passed" in doctor.stdout + doctor.stderr
    tasks = venv.glob("lib/python*/site-packages/legorl/assets/tasks/train.jsonl")
    (train,) = tasks
    val = run(venv, tmp_path, "tasks", "validate", str(train), "--limit", "2", "--json")
    assert val.returncode == 0, val.stdout[-3000:] + val.stderr[-3000:]
    rows = [json.loads(line) for line in val.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows


def test_proxy_serves_from_any_directory(venv: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LEGORL_TOKEN"] = "wheel-test"  # the standalone proxy requires a token; the client sends it as its key
    proc = subprocess.Popen(
        [
            str(venv / "bin" / "legorl"),
            "proxy",
            "--model",
            "tiny-qwen3",
            "--port",
            str(port),
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "proxy did not answer /health in 120 s"
                time.sleep(0.5)
        # the bundled model and its chat template come from the wheel: one real turn
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wheel-test:s1", max_retries=0, timeout=60)
        answer = client.chat.completions.create(
            model="tiny-qwen3", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)

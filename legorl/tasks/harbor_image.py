"""A Harbor task's `environment/Dockerfile`, built into the layered image cache.

The image is one layer over a local base (`images.py`): nothing is pulled. `FROM` names a
public image; it resolves to a local one through a mapping (`LEGORL_HARBOR_BASES`, below).
`RUN` runs offline as root (or as the current `USER`, through `setpriv`), `COPY` copies
from the build context (`environment/`, nothing outside it), `ENV`/`ARG` set variables of
later steps, `WORKDIR` creates and enters a directory. The same layer serves both
backends (the docker backend loads it as a Docker image, `docker_images.py`). Last, the
build writes the workdir's manifest (`legorl/verify/state.py`), against which an agent's
changes are taken.

The base mapping: `LEGORL_HARBOR_BASES` is a comma-separated list of `PATTERN=TARGET`
(shell-style patterns of image references; TARGET is `base`, our cached Debian base, or
the key of a cached image). It is consulted before the default, which maps `debian`,
`ubuntu`, `python` and `buildpack-deps` images (any tag, with or without `docker.io/` or
`library/`) to `base`. Any other `FROM` is an error naming the image and the setting. A
mapped base is *our* base (Debian with python3, pytest and git; no network), not the named
one: a task that needs packages the named image has must install them offline.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import io
import os
import posixpath
import shlex
import tarfile
from pathlib import Path
from typing import Any

from legorl.sandbox.base import Limits
from legorl.sandbox.images import ImageRef, ImageStore
from legorl.tasks.dockerfile import Instruction, expand, resolve_dir
from legorl.tasks.harbor import HarborSpec
from legorl.verify import state

SETTING = "LEGORL_HARBOR_BASES"
DEFAULT_BASES = tuple(
    f"{prefix}{name}{tag}"
    for name in ("debian", "ubuntu", "python", "buildpack-deps")
    for prefix in ("", "docker.io/", "library/", "docker.io/library/")
    for tag in ("", ":*", "@*")
)
RECIPE = 1


class HarborImageError(ValueError):
    """The task's image cannot be made here (an unmapped FROM, a COPY outside the context)."""


def base_mapping() -> list[tuple[str, str]]:
    """(pattern, target) pairs: the setting's first, then the default."""
    out = []
    for item in os.environ.get(SETTING, "").split(","):
        if item.strip():
            pat, eq, target = item.partition("=")
            if not eq or not pat.strip() or not target.strip():
                raise HarborImageError(f"{SETTING}: {item.strip()!r} is not PATTERN=TARGET")
            out.append((pat.strip(), target.strip()))
    return out + [(p, "base") for p in DEFAULT_BASES]


def resolve_base(image: str) -> str:
    """The mapping's target for a FROM image: 'base' or a cache key; HarborImageError if none."""
    for pat, target in base_mapping():
        if fnmatch.fnmatchcase(image, pat):
            return target
    raise HarborImageError(
        f"FROM {image}: this image cannot be pulled here and has no local mapping; map it with "
        f"{SETTING}='{image}=base' (our cached Debian base) or ='{image}=<image cache key>'"
    )


def as_user(user: str, cmd: str) -> str:
    """`cmd` run by /bin/sh as `user` (`name`, `uid`, `name:group`, `uid:gid`), with its HOME."""
    name, _, group = user.partition(":")
    if name in ("root", "0") and group in ("", "root", "0"):
        return cmd
    q = shlex.quote
    return (
        f"_u={q(name)}; _g={q(group)}; "
        'if _uid=$(id -u "$_u" 2>/dev/null); then _gid=${_g:-$(id -g "$_u")}; _grp=--init-groups; '
        'else case $_u in *[!0-9]*) echo "USER $_u: no such user in the image" >&2; exit 125;; esac; '
        "_uid=$_u; _gid=${_g:-$_u}; _grp=--clear-groups; fi; "
        '_h=$(getent passwd "$_uid" | cut -d: -f6); '
        f'HOME=${{_h:-/}} USER=$_u exec setpriv --reuid="$_uid" --regid="$_gid" $_grp /bin/sh -c {q(cmd)}'
    )


def _context_fingerprint(ctx: Path) -> list[list[Any]]:
    out = []
    for p in sorted(ctx.rglob("*")):
        rel = str(p.relative_to(ctx))
        st = p.lstat()
        if p.is_symlink():
            out.append([rel, "l", os.readlink(p)])
        elif p.is_file():
            out.append([rel, st.st_mode & 0o7777, hashlib.sha256(p.read_bytes()).hexdigest()])
    return out


def _copy_tar(ctx: Path, ins: Instruction, env: dict[str, str], workdir: str, where: str) -> tuple[bytes, list[str]]:
    """(a tar of the COPY's files at their absolute destinations, the paths it writes)."""
    *srcs, dest = (expand(a, env) for a in ins.args)
    dest_abs = resolve_dir(workdir, dest) if not dest.startswith("/") else posixpath.normpath(dest)
    into_dir = dest.endswith("/") or len(srcs) > 1
    root = ctx.resolve()
    matches: list[Path] = []
    for s in srcs:
        found = sorted(root.glob(s.lstrip("/"))) if any(c in s for c in "*?[") else [root / s.lstrip("/")]
        for f in found:
            real = f.resolve()
            if real != root and root not in real.parents:
                raise HarborImageError(f"{where}: COPY {s}: outside the build context (environment/)")
            if not f.exists():
                raise HarborImageError(f"{where}: COPY {s}: no such file in environment/")
            matches.append(f)
    if not matches:
        raise HarborImageError(f"{where}: COPY {' '.join(srcs)}: matches no file in environment/")
    buf = io.BytesIO()
    written: list[str] = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(path: Path, arc: str) -> None:
            info = tar.gettarinfo(str(path), arcname=arc.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            written.append(arc)

        for m in matches:
            real = m.resolve()
            if real.is_dir():
                for sub in sorted(real.rglob("*")):
                    if not sub.is_symlink() and not sub.is_file() and not sub.is_dir():
                        continue
                    add(sub, posixpath.join(dest_abs, str(sub.relative_to(real))))
            else:
                target = posixpath.join(dest_abs, m.name) if into_dir or len(matches) > 1 else dest_abs
                add(real, target)
    return buf.getvalue(), written


def build_steps(spec: HarborSpec, base_env: dict[str, str]) -> tuple[list[tuple[str, str, str]], dict[str, bytes]]:
    """The sandbox build's (what, cwd, command) steps and the files they need."""
    ctx = spec.root / "environment"
    env = dict(base_env)
    workdir, user = "/", "root"
    steps: list[tuple[str, str, str]] = []
    files: dict[str, bytes] = {}
    df_name = "environment/Dockerfile"
    for n, ins in enumerate(spec.dockerfile.steps):
        where = f"{spec.root / df_name}:{ins.line}"
        what = f"{df_name}:{ins.line} {ins.kind}"
        if ins.kind == "RUN":  # the variables so far in a file, so a failing step's message shows the command
            env_at = f"/tmp/legorl-env-{n}.sh"
            files[env_at] = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items())).encode()
            steps.append((what, workdir, f". {env_at}; " + as_user(user, ins.args[0])))
        elif ins.kind in ("ENV", "ARG"):
            for k, v in zip(ins.args[::2], ins.args[1::2], strict=True):
                env[k] = expand(v, env)
        elif ins.kind == "WORKDIR":
            workdir = resolve_dir(workdir, expand(ins.args[0], env))
            steps.append((what, "/", f"mkdir -p {shlex.quote(workdir)}"))
        elif ins.kind == "USER":
            user = expand(ins.args[0], env)
            name = user.partition(":")[0]
            steps.append(
                (
                    what,
                    "/",
                    f"id -u {shlex.quote(name)} >/dev/null 2>&1 || case {shlex.quote(name)} in "
                    f"*[!0-9]*) echo 'USER {name}: no such user in the image' >&2; exit 1;; esac",
                )
            )
        elif ins.kind == "COPY":
            data, written = _copy_tar(ctx, ins, env, workdir, where)
            tar_at = f"/tmp/legorl-copy-{n}.tar"
            files[tar_at] = data
            lst = f"/tmp/legorl-copy-{n}.list"
            files[lst] = "".join("/" + p.lstrip("/") + "\0" for p in written).encode()
            cmd = f"tar -xpf {tar_at} -C / --same-owner --no-overwrite-dir"
            flags = dict(ins.flags)
            if flags.get("chown"):
                cmd += f" && xargs -0 chown -h {shlex.quote(expand(flags['chown'], env))} < {lst}"
            if flags.get("chmod"):
                cmd += f" && xargs -0 chmod {shlex.quote(flags['chmod'])} < {lst}"
            steps.append((what, "/", cmd))
    files[state.SCRIPT] = state.SOURCE.encode()
    steps.append(("workdir manifest", "/", state.run_script("manifest", workdir, state.MANIFEST)))
    return steps, files


def recipe(spec: HarborSpec, parent: ImageRef) -> dict[str, Any]:
    return {
        "kind": "env",
        "harbor": spec.name,
        "parent": parent.key,
        "dockerfile": hashlib.sha256((spec.root / "environment" / "Dockerfile").read_bytes()).hexdigest(),
        "context": _context_fingerprint(spec.root / "environment"),
        "state": hashlib.sha256(state.SOURCE.encode()).hexdigest()[:16],
        "v": RECIPE,
    }


async def ensure_harbor_image(store: ImageStore, base: ImageRef, spec: HarborSpec) -> ImageRef:
    """The task's image layer over `base` (built once, cached by its recipe)."""
    from legorl.sandbox.channel import BASE_ENV
    from legorl.sandbox.layers import _build_in_sandbox

    steps, files = await asyncio.to_thread(build_steps, spec, dict(BASE_ENV))
    limits = Limits(
        memory_mb=max(spec.limits.memory_mb, 4096), pids=2048, cpus=max(spec.limits.cpus, 2.0), disk_mb=8192
    )

    async def build(dest: Path) -> dict[str, Any]:
        await _build_in_sandbox(store, base, dest, {}, limits, steps, spec.build_timeout_s, files)
        return {"harbor": {"task": spec.name, "from": spec.dockerfile.base, "workdir": spec.workdir, "user": spec.user}}

    return await store.ensure("env", base.key, await asyncio.to_thread(recipe, spec, base), build)

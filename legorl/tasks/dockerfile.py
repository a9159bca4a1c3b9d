"""The subset of a Dockerfile a Harbor task's `environment/Dockerfile` is built from.

We build images into our own layered cache (no Docker daemon, no registry), so a Dockerfile
is read here, not handed to `docker build`. Supported: one `FROM` (resolved to a local
image, `harbor_image.py`), `RUN`, `WORKDIR`, `COPY` (from the build context, `--chown`,
`--chmod`), `ENV`, `ARG` (build-time variables) and `USER`. Instructions that only describe
how Docker would *start* a container (`CMD`, `ENTRYPOINT`, `EXPOSE`, `LABEL`, `MAINTAINER`,
`HEALTHCHECK`, `STOPSIGNAL`) are ignored, as Harbor itself ignores them (it starts every
environment with its own command); each is reported once as a note. Anything else
(`ADD`, `VOLUME`, `SHELL`, `ONBUILD`, a second `FROM`, heredocs) is an error naming the
instruction and its line, never silently dropped.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

SUPPORTED = ("FROM", "RUN", "WORKDIR", "COPY", "ENV", "ARG", "USER")
IGNORED = ("CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL")


class DockerfileError(ValueError):
    """The Dockerfile uses something we cannot build; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    kind: str  # one of SUPPORTED
    args: tuple[str, ...]  # RUN: (shell command,); COPY: (src..., dest); ENV/ARG: (k, v, k, v ...); others: (value,)
    flags: tuple[tuple[str, str], ...] = ()  # COPY --chown=..., --chmod=...
    line: int = 0


@dataclass
class Dockerfile:
    base: str  # the FROM image reference
    steps: list[Instruction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # ignored instructions, one line each

    def final(self, start: dict[str, str]) -> tuple[str, str, dict[str, str]]:
        """(WORKDIR, USER, the variables ENV sets) after the last step, expanded as Docker
        does against `start` (the image's own environment) and earlier ARG/ENV values.
        WORKDIR defaults to '/', USER to 'root'; ARG values are build-time only."""
        ctx = dict(start)
        out: dict[str, str] = {}
        wd, user = "/", "root"
        for s in self.steps:
            if s.kind in ("ENV", "ARG"):
                for k, v in zip(s.args[::2], s.args[1::2], strict=True):
                    ctx[k] = expand(v, ctx)
                    if s.kind == "ENV":
                        out[k] = ctx[k]
            elif s.kind == "WORKDIR":
                wd = resolve_dir(wd, expand(s.args[0], ctx))
            elif s.kind == "USER":
                user = expand(s.args[0], ctx)
        return wd, user, out


def resolve_dir(current: str, path: str) -> str:
    import posixpath

    return posixpath.normpath(posixpath.join(current, path))


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(value: str, env: dict[str, str]) -> str:
    """Docker's variable substitution in ENV/WORKDIR/COPY/USER: $X, ${X}, ${X:-default}."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in env and env[name] != "":
            return env[name]
        return m.group(2) or "" if m.group(1) else env.get(name, "")

    return _VAR.sub(sub, value)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with continuations joined and comments dropped."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = n
        if line.endswith("\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        out.append((start, " ".join(b.strip() for b in buf).strip()))
        buf = []
    if buf:
        out.append((start, " ".join(b.strip() for b in buf).strip()))
    return out


def _json_list(rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _pairs(kind: str, rest: str, where: str) -> tuple[str, ...]:
    """ENV/ARG arguments as (key, value, ...): `K=V K2="v 2"`, the legacy `ENV K V`, `ARG K`."""
    try:
        words = shlex.split(rest, posix=True)
    except ValueError as exc:
        raise DockerfileError(f"{where}: {kind}: cannot parse {rest!r}: {exc}") from None
    if not words:
        raise DockerfileError(f"{where}: {kind} needs at least one variable")
    if kind == "ENV" and "=" not in words[0]:
        key, _, value = rest.partition(" ")
        return (key.strip(), value.strip())
    out: list[str] = []
    for w in words:
        k, eq, v = w.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or (kind == "ENV" and not eq):
            raise DockerfileError(f"{where}: {kind}: {w!r} is not NAME=value")
        out += [k, v]
    return tuple(out)


def parse_dockerfile(text: str, where: str = "Dockerfile") -> Dockerfile:
    """Parse the supported subset; DockerfileError names the first line we cannot build."""
    base = ""
    steps: list[Instruction] = []
    notes: list[str] = []
    pre_args: dict[str, str] = {}
    for n, line in _logical_lines(text):
        at = f"{where}:{n}"
        word, _, rest = line.partition(" ")
        kind, rest = word.upper(), rest.strip()
        if "<<" in rest and kind in ("RUN", "COPY"):
            raise DockerfileError(
                f"{at}: {kind} with a heredoc is not supported (write the script as a file and COPY it)"
            )
        if kind in IGNORED:
            notes.append(f"{at}: {kind} ignored (it only says how Docker would start the container)")
            continue
        if kind not in SUPPORTED:
            raise DockerfileError(
                f"{at}: instruction {kind} is not supported (supported: {', '.join(SUPPORTED)}; "
                f"ignored: {', '.join(IGNORED)})"
            )
        if kind == "ARG" and not base:  # a global ARG: only FROM may use it (as in Docker)
            name, _, value = rest.partition("=")
            pre_args[name.strip()] = value.strip().strip('"')
            continue
        if kind == "FROM":
            if base:
                raise DockerfileError(f"{at}: a second FROM (multi-stage builds) is not supported")
            parts = [p for p in rest.split() if not p.startswith("--")]
            if not parts:
                raise DockerfileError(f"{at}: FROM needs an image")
            base = expand(parts[0], pre_args)
            continue
        if not base:
            raise DockerfileError(f"{at}: {kind} before FROM")
        if kind == "RUN":
            flags = [w for w in rest.split() if w.startswith("--")]
            if flags and rest.startswith("--"):
                raise DockerfileError(f"{at}: RUN {flags[0].split('=')[0]} is not supported")
            argv = _json_list(rest)
            steps.append(Instruction("RUN", (shlex.join(argv) if argv is not None else rest,), line=n))
        elif kind in ("WORKDIR", "USER"):
            if not rest:
                raise DockerfileError(f"{at}: {kind} needs a value")
            steps.append(Instruction(kind, (rest,), line=n))
        elif kind in ("ENV", "ARG"):
            if kind == "ARG" and rest and "=" not in rest.split()[0]:
                steps.append(Instruction("ARG", (rest.split()[0], ""), line=n))
            else:
                steps.append(Instruction(kind, _pairs(kind, rest, at), line=n))
        elif kind == "COPY":
            argv = _json_list(rest)
            words = argv if argv is not None else shlex.split(rest)
            flags = []
            while words and words[0].startswith("--"):
                name, _, value = words.pop(0)[2:].partition("=")
                if name not in ("chown", "chmod"):
                    raise DockerfileError(f"{at}: COPY --{name} is not supported (only --chown and --chmod)")
                flags.append((name, value))
            if len(words) < 2:
                raise DockerfileError(f"{at}: COPY needs a source and a destination")
            steps.append(Instruction("COPY", tuple(words), tuple(flags), line=n))
    if not base:
        raise DockerfileError(f"{where}: no FROM instruction")
    return Dockerfile(base, steps, notes)

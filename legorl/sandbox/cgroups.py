"""Control groups for the local backend: memory, pids and CPU limits, and the counters that
tell an agent-caused death (OOM kill, pids limit hit) from an infrastructure fault.

Both cgroup v2 (unified) and v1 (one hierarchy per controller, as on hosts that still boot
in hybrid mode) are supported; `detect()` picks what the machine has. Sandbox cgroups are
created in the calling process's own cgroup on v1 (so whatever limits the host process
also bounds its sandboxes, and each sandbox weighs as much CPU as one process) and below a
`legorl` cgroup at the hierarchy root on v2 (v2 forbids enabling
controllers under a cgroup that itself holds processes). Names start with `legorl-` so a
crashed run's leftovers can be swept (`Cgroups.sweep`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
PREFIX = "legorl-"
CPU_PERIOD_US = 100_000
# Usage this close to the limit counts as having reached it. Not one page: the kernel charges
# in batches (and a transparent huge page at once, 2 MiB), so a cgroup OOM-killed at its limit
# can show a watermark a few MiB under it; a tmpfs (the sandbox's disk) filled to the memory
# limit is the agent's exhaustion, never the host's (measured: dd in the workdir read as host_oom).
WATERMARK_SLACK = 32 << 20
WATERMARK_SHARE = 0.02  # or this share of the limit, whichever is larger


@dataclass(frozen=True)
class Counters:
    """Cumulative event counts of one sandbox's cgroup.

    `oom_kills` counts its processes killed by any OOM killer, the host's included;
    `memory_max_hits` how often it reached its own memory limit (v2 `memory.events` max,
    v1 `memory.failcnt`, or its usage watermark at the limit on either). A kill in a sandbox
    that never reached its own limit came from outside: the host ran out of memory (or an
    enclosing cgroup did), not the sandbox."""

    oom_kills: int = 0
    pids_max_hits: int = 0
    memory_max_hits: int = 0
    near_limit: bool = False  # its memory use is at its own limit right now (e.g. a full tmpfs disk)

    @property
    def reached_limit(self) -> bool:
        """Has the sandbox ever reached its own memory limit (or sits at it now)?"""
        return self.memory_max_hits > 0 or self.near_limit

    def host_oom_since(self, before: Counters) -> bool:
        """Was a process killed by an OOM outside this sandbox's own limit since `before`?

        Never in a sandbox that has ever reached its own limit: what it did there is its own.
        The counts cannot tell a second kill at its own limit from the host's: v1's watermark
        reaches the limit once and stays there (some kernels keep `memory.failcnt` at 0), so a
        later kill adds no hit (the agent's git filter, a daemon, a refilled tmpfs disk: all
        its own doing); and its disk is a tmpfs charged to its memory, so an agent that fills
        it leaves every later process to be killed at its limit. Only a kill in a sandbox that
        never came near its own limit is the host's (or an enclosing cgroup's)."""
        return self.oom_kills > before.oom_kills and not (self.reached_limit or before.reached_limit)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _read_kv(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _mounts() -> dict[str, Path]:
    """Controller (or "unified") -> mount point, from /proc/self/mountinfo."""
    found: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _src, opts = (right.split() + ["", "", ""])[:3]
            mnt = Path(left.split()[4])
            if fstype == "cgroup2":
                found.setdefault("unified", mnt)
            elif fstype == "cgroup":
                for opt in opts.split(","):
                    if opt in CONTROLLERS:
                        found.setdefault(opt, mnt)
    return found


def _own_paths(pid: int | str = "self") -> dict[str, str]:
    """Controller (or "unified") -> cgroup path of a process, from /proc/<pid>/cgroup."""
    paths: dict[str, str] = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if ctrls == "":
                paths["unified"] = path
            for c in ctrls.split(","):
                if c in CONTROLLERS:
                    paths[c] = path
    return paths


@dataclass
class CgroupSet:
    """The cgroups of one sandbox: one directory per controller (v1) or one (v2)."""

    version: int
    dirs: list[Path]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def counters(self) -> Counters:
        return _counters(self.version, self.dirs)

    def remove(self, wait_s: float = 30.0) -> None:
        """Remove the directories; their processes must be dead (retries while they exit)."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s (processes left in it?)", d)
                        break
                    time.sleep(0.01)


def _counters(version: int, dirs: list[Path]) -> Counters:
    if version == 2 and dirs:
        events, limit = dirs[0] / "memory.events", _read_int(dirs[0] / "memory.max")
        near = _near(_read_int(dirs[0] / "memory.current"), limit)
        # The watermark (memory.peak, Linux 5.19+) as on v1: within the slack of the limit is
        # reaching it, even when the kernel charged the last batch without a `max` event.
        hits = _read_kv(events, "max") + int(_near(_read_int(dirs[0] / "memory.peak"), limit))
        return Counters(_read_kv(events, "oom_kill"), _read_kv(dirs[0] / "pids.events", "max"), hits, near)
    oom = pids = hits = 0
    near = False
    for d in dirs:
        oom += _read_kv(d / "memory.oom_control", "oom_kill")
        pids += _read_kv(d / "pids.events", "max")
        if (d / "memory.failcnt").exists():
            hits += _own_limit_hits_v1(d)
            near = near or _near(_read_int(d / "memory.usage_in_bytes"), _read_int(d / "memory.limit_in_bytes"))
    return Counters(oom, pids, hits, near)


def _near(usage: int, limit: int) -> bool:
    return 0 < limit < (1 << 60) and usage >= limit - max(WATERMARK_SLACK, int(limit * WATERMARK_SHARE))


def _own_limit_hits_v1(d: Path) -> int:
    """v1: the limit's fail counts, plus 1 once the usage watermark reached the limit (some
    kernels, e.g. 6.18, leave `memory.failcnt` at 0 even across an OOM of the cgroup). The
    watermark adds 1 once and never again: a count for "ever reached", not how often."""
    hits = 0
    for kind in ("memory", "memory.memsw"):
        limit = _read_int(d / f"{kind}.limit_in_bytes")
        hits += _read_int(d / f"{kind}.failcnt")
        slack = max(WATERMARK_SLACK, int(limit * WATERMARK_SHARE))
        if limit and _read_int(d / f"{kind}.max_usage_in_bytes") >= limit - slack:
            hits += 1
    return hits


def counters_for_pid(pid: int) -> Counters:
    """Counters of whatever cgroup `pid` is in (used for Docker containers)."""
    try:
        mounts, paths = _mounts(), _own_paths(pid)
    except OSError:
        return Counters()
    if "memory" in paths and "memory" in mounts:
        dirs = [mounts[c] / paths[c].lstrip("/") for c in ("memory", "pids") if c in paths and c in mounts]
        return _counters(1, dirs)
    if "unified" in paths and "unified" in mounts:
        return _counters(2, [mounts["unified"] / paths["unified"].lstrip("/")])
    return Counters()


class Cgroups:
    """Creates limited cgroups for sandboxes. `version` 0 means none could be used."""

    def __init__(self) -> None:
        self.version = 0
        self.bases: dict[str, Path] = {}
        self.reason = ""
        try:
            self._detect()
        except OSError as e:
            self.version, self.reason = 0, f"cgroups unusable: {e}"
        if self.version == 0:
            log.warning("sandbox resource limits are NOT enforced: %s", self.reason)

    def _detect(self) -> None:
        mounts = _mounts()
        unified = mounts.get("unified")
        if unified and (unified / "cgroup.controllers").exists():
            have = set((unified / "cgroup.controllers").read_text().split())
            if set(CONTROLLERS) <= have:
                base = unified / "legorl"
                base.mkdir(exist_ok=True)
                enable = " ".join("+" + c for c in CONTROLLERS)
                (unified / "cgroup.subtree_control").write_text(enable)
                (base / "cgroup.subtree_control").write_text(enable)
                self.version, self.bases = 2, {"unified": base}
                return
        if all(c in mounts for c in CONTROLLERS):
            # Directly in our own cgroup, not in a shared "legorl" parent: CPU weight is
            # shared per parent group, and one group for all sandboxes would make them
            # together weigh no more than a single process of the host.
            own = _own_paths()
            for c in CONTROLLERS:
                self.bases[c] = mounts[c] / own.get(c, "/").lstrip("/")
            self.version = 1
            return
        self.reason = f"no cgroup hierarchy with {', '.join(CONTROLLERS)} (found {sorted(mounts)})"

    def create(self, name: str, memory_mb: int, pids: int, cpus: float) -> CgroupSet:
        """Make the cgroups of sandbox `name` with the given limits (none if unsupported)."""
        name = PREFIX + name
        if self.version == 2:
            d = self.bases["unified"] / name
            d.mkdir()
            (d / "memory.max").write_text(str(memory_mb << 20))
            _try_write(d / "memory.swap.max", "0")
            (d / "pids.max").write_text(str(pids))
            (d / "cpu.max").write_text(f"{max(int(cpus * CPU_PERIOD_US), 1000)} {CPU_PERIOD_US}")
            return CgroupSet(2, [d])
        if self.version == 1:
            dirs = {c: self.bases[c] / name for c in CONTROLLERS}
            for d in dirs.values():
                d.mkdir()
            m = dirs["memory"]
            (m / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
            _try_write(m / "memory.memsw.limit_in_bytes", str(memory_mb << 20))
            (dirs["pids"] / "pids.max").write_text(str(pids))
            (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(max(int(cpus * CPU_PERIOD_US), 1000)))
            return CgroupSet(1, list(dirs.values()))
        return CgroupSet(0, [])

    def sweep(self, min_age_s: float = 300.0) -> int:
        """Remove empty leftover sandbox cgroups (from a crashed run); returns how many.
        Those of a process that is gone (the name starts with its pid: `legorl-<pid>-…`)
        at once; others only when older than `min_age_s`: a fresh one may be about to get
        its processes."""
        n = 0
        now = time.time()
        for base in self.bases.values():
            for d in base.glob(PREFIX + "*"):
                try:
                    owner = d.name[len(PREFIX) :].split("-", 1)[0]
                    gone = owner.isdigit() and not os.path.exists(f"/proc/{owner}")
                    if not gone and now - d.stat().st_mtime < min_age_s:
                        continue
                    if not (d / "cgroup.procs").read_text().strip():
                        d.rmdir()
                        n += 1
                except OSError:
                    continue
        return n


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass  # e.g. no swap accounting: nothing to limit

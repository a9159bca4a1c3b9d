"""The agent's changes to a workdir as files: taken from its sandbox, applied in a fresh one.

A Harbor task's workdir is not a git repository, so its "diff" is a snapshot of what
changed against the image: every file, directory and symbolic link whose content, mode or
owner differs from the image's own manifest (written when the image was built), plus what
was deleted. It is plain text (one JSON object a line after a header), so it travels
through `RolloutResult.diff` like a git diff does. Only files cross: processes, the rest
of the filesystem and anything under /logs, /tests or /solution never do.

The snapshot is taken by a script run *inside the agent's sandbox*, whose interpreter the
agent may have replaced, so the grader trusts none of it: `apply` runs in the fresh
sandbox and refuses any entry whose path leaves the workdir, goes through a symbolic link
or lands in a protected directory, and drops setuid/setgid bits (a planted setuid binary
must not let the verifier's user write what only root may).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

HEADER = "legorl-state 1"
STATE_DIR = "/var/lib/legorl/harbor"  # outside any workdir; excluded from snapshots
MANIFEST = f"{STATE_DIR}/baseline.json"
SCRIPT = f"{STATE_DIR}/state.py"
PROTECTED = ("/logs", "/tests", "/solution", STATE_DIR)
SKIP_ROOTS = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp")
MAX_STATE_BYTES = 64 << 20

# Runs with the sandbox's python3 (`python3 -I -S SCRIPT MODE ROOT FILE`); stdlib only.
SOURCE = r'''
import base64, hashlib, json, os, shutil, stat, sys

PROTECTED = %(protected)r
SKIP = %(skip)r
HEADER = %(header)r


def excluded(absp):
    return any(absp == p or absp.startswith(p + "/") for p in PROTECTED + SKIP)


def record(full, st, with_data):
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return ["l", 0, st.st_uid, st.st_gid, os.readlink(full)], None
    if stat.S_ISDIR(st.st_mode):
        return ["d", mode, st.st_uid, st.st_gid, ""], None
    if stat.S_ISREG(st.st_mode):
        with open(full, "rb") as f:
            data = f.read()
        return ["f", mode, st.st_uid, st.st_gid, hashlib.sha256(data).hexdigest()], (data if with_data else None)
    return None, None


def mounts_under(root):
    """Mount points strictly inside root (a harness's read-only mounts): not the agent's work.
    (st_dev cannot tell: overlayfs reports the lower filesystem's device for files.)"""
    found = set()
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp != root and (root == "/" or mp.startswith(root + "/")):
                    found.add(mp)
    except (OSError, IndexError):
        pass
    return found


def walk(root, with_data):
    skip_mounts = mounts_under(root)
    out, data = {}, {}
    stack = [""]
    while stack:
        rel = stack.pop()
        d = os.path.join(root, rel) if rel else root
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            r = rel + "/" + name if rel else name
            full = os.path.normpath(os.path.join(root, r))
            if excluded(full):
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if full in skip_mounts:
                continue
            rec, blob = record(full, st, with_data)
            if rec is None:
                continue
            out[r] = rec
            if blob is not None:
                data[r] = blob
            if rec[0] == "d":
                stack.append(r)
    return out, data


def manifest(root, path):
    out, _ = walk(root, False)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)


def diff(root, path):
    try:
        with open(path) as f:
            base = json.load(f)
    except (OSError, ValueError):
        base = {}
    cur, data = walk(root, True)
    w = sys.stdout.write
    w(HEADER + " " + root + "\n")
    gone = sorted(p for p in base if p not in cur or cur[p][0] != base[p][0])
    top = [p for p in gone if not any(p.startswith(q + "/") for q in gone if q != p)]
    for p in top:
        w(json.dumps({"p": p, "t": "x"}) + "\n")
    for p in sorted(cur):
        rec = cur[p]
        if base.get(p) == rec:
            continue
        e = {"p": p, "t": rec[0], "m": rec[1], "u": rec[2], "g": rec[3]}
        if rec[0] == "l":
            e["s"] = rec[4]
        elif rec[0] == "f":
            e["b64"] = base64.b64encode(data[p]).decode()
        w(json.dumps(e) + "\n")


def safe_parent(root, rel):
    """Every ancestor of rel under root is a real directory (created if missing), or None."""
    cur = root
    for part in rel.split("/")[:-1]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None
    return cur


def remove(full):
    st = os.lstat(full)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(full)
    else:
        os.unlink(full)


def apply(root, path):
    skipped, done, deleted = [], 0, 0
    with open(path, encoding="utf-8") as f:
        head = f.readline().rstrip("\n")
        if not head.startswith(HEADER + " "):
            print(json.dumps({"error": "not a workdir state"}))
            return 3
        lines = f.read().splitlines()
    entries = []
    for ln in lines:
        try:
            e = json.loads(ln)
            rel = e["p"]
            assert isinstance(rel, str) and e["t"] in ("f", "d", "l", "x")
        except Exception:
            skipped.append(["?", "malformed entry"])
            continue
        parts = rel.split("/")
        if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
            skipped.append([rel, "path leaves the workdir"])
            continue
        full = os.path.normpath(os.path.join(root, rel))
        if excluded(full):
            skipped.append([rel, "protected"])
            continue
        entries.append((rel, full, e))
    for rel, full, e in [x for x in entries if x[2]["t"] == "x"]:
        if safe_parent(root, rel) is None:
            skipped.append([rel, "through a link"])
            continue
        try:
            remove(full)
            deleted += 1
        except FileNotFoundError:
            pass
    for rel, full, e in sorted((x for x in entries if x[2]["t"] != "x"), key=lambda x: x[0]):
        if safe_parent(root, rel) is None:
            skipped.append([rel, "through a link"])
            continue
        try:
            mode = int(e.get("m", 0o644)) & 0o1777
            uid, gid = int(e.get("u", 0)), int(e.get("g", 0))
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                st = None
            if st is not None and not (e["t"] == "d" and stat.S_ISDIR(st.st_mode)):
                remove(full)
            if e["t"] == "d":
                if st is None or not stat.S_ISDIR(st.st_mode):
                    os.mkdir(full, 0o700)
            else:
                tmp = os.path.join(os.path.dirname(full), ".legorl-new-" + os.path.basename(full)[:200])
                if os.path.lexists(tmp):
                    remove(tmp)
                if e["t"] == "l":
                    os.symlink(str(e["s"]), tmp)
                else:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        out.write(base64.b64decode(e.get("b64", "")))
                os.replace(tmp, full)
            os.lchown(full, uid, gid)
            if e["t"] != "l":
                os.chmod(full, mode, follow_symlinks=False)
            done += 1
        except (OSError, ValueError, TypeError) as exc:
            skipped.append([rel, "%%s: %%s" %% (type(exc).__name__, exc)])
    print(json.dumps({"applied": done, "deleted": deleted, "skipped": skipped[:50], "n_skipped": len(skipped)}))
    return 0


if __name__ == "__main__":
    mode, root, path = sys.argv[1:4]
    sys.exit({"manifest": manifest, "diff": diff, "apply": apply}[mode](os.path.normpath(root), path) or 0)
''' % {"protected": PROTECTED, "skip": SKIP_ROOTS, "header": HEADER}


def run_script(mode: str, root: str, path: str) -> str:
    """The shell command that runs the state script in a sandbox (`mode`: manifest/diff/apply)."""
    import shlex

    return f"python3 -I -S {SCRIPT} {mode} {shlex.quote(root)} {shlex.quote(path)}"


@dataclass
class StateSummary:
    """What a state text holds (evidence; counted on the host without trusting it)."""

    files: int = 0
    deleted: int = 0
    protected: list[str] = field(default_factory=list)  # entries that aimed at /logs, /tests ...

    @classmethod
    def of(cls, text: str) -> StateSummary:
        s = cls()
        lines = text.splitlines()
        root = lines[0][len(HEADER) + 1 :] if lines and lines[0].startswith(HEADER + " ") else "/"
        for ln in lines[1:]:
            try:
                e = json.loads(ln)
                rel, kind = str(e["p"]), e["t"]
            except (ValueError, KeyError, TypeError):
                continue
            import posixpath

            full = posixpath.normpath(posixpath.join(root, rel))
            if any(full == p or full.startswith(p + "/") for p in PROTECTED):
                s.protected.append(rel)
            elif kind == "x":
                s.deleted += 1
            else:
                s.files += 1
        return s


def is_empty(text: str) -> bool:
    """No change at all (only the header line)."""
    return not [ln for ln in text.splitlines()[1:] if ln.strip()]

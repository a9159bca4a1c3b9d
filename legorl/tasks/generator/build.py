"""Generate real tasks from a project: inject bugs, keep the ones tests catch, write them.

For each project (see `projects.py`): unpack its sdist, run its suite twice to find the
stably passing tests, then try AST mutations (`mutate.py`) in a seeded, kind-balanced
order. A mutant is kept when it makes 1..`max_f2p` previously passing tests fail (in at
most two test files) and leaves at least one other test in those files passing, with at
most `max_per_function` bugs per function.

Each kept mutant becomes a SWE-bench instance whose repository history cannot leak the
answer: `base_commit` is a parentless commit of the *buggy* tree with the files holding
its FAIL_TO_PASS test functions cut out of their files (`hide.py`; SWE-smith's "Remove F2P
Tests" step, minus SWE-smith's leak of the clean tree through the commit's parents).
`patch` is the fix (buggy → clean source), `test_patch` puts the hidden tests back. All
tasks of a project live in one `git bundle` (one branch per task; shared blobs stored once).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from legorl.tasks.generator.hide import hide_tests
from legorl.tasks.generator.labels import run_tests
from legorl.tasks.generator.mutate import Mutation, mutations_of
from legorl.tasks.generator.problem import problem_statement
from legorl.tasks.generator.projects import ProjectSpec, download_sdist, unpack_sdist

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "legorl",
    "GIT_AUTHOR_EMAIL": "legorl@localhost",
    "GIT_COMMITTER_NAME": "legorl",
    "GIT_COMMITTER_EMAIL": "legorl@localhost",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


@dataclass
class GenConfig:
    python: str  # host interpreter whose pytest matches the base image's
    count: int = 16  # tasks per project
    seed: int = 0
    max_f2p: int = 20
    max_per_function: int = 2  # first one per function everywhere, then up to this many
    max_attempts: int = 400
    heldout_every: int = 4  # every n-th task (by id order) goes to the held-out split
    log: bool = True


@dataclass
class Accepted:
    mutation: Mutation
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    failures: dict[str, str]


def _git(repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, **_GIT_ENV, **(env or {})}
    proc = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=full_env, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode()


def _interleave(muts: list[Mutation], seed: int) -> list[Mutation]:
    """Shuffle within each kind, then round-robin over kinds so every kind gets tried."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutation]] = defaultdict(list)
    for m in muts:
        by_kind[m.kind].append(m)
    queues = []
    for kind in sorted(by_kind):
        q = by_kind[kind]
        rng.shuffle(q)
        queues.append(q)
    out: list[Mutation] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop())
    return out


def find_bugs(spec: ProjectSpec, tree: Path, cfg: GenConfig) -> list[Accepted]:
    """Try mutations on `tree` (restored after each) until `cfg.count` are accepted."""
    args = [*spec.pytest_options, *spec.tests]
    t0 = time.monotonic()
    runs = [run_tests(tree, args, cfg.python) for _ in range(2)]
    # A mutant that makes the suite hang (an endless loop) is a poor task: cut it off early.
    timeout_s = max(30.0, 5.0 * (time.monotonic() - t0) / 2)
    stable = {t for t, s in runs[0].results.items() if s.ok and runs[1].results.get(t) == s} - set(spec.deselect)
    if not stable:
        raise RuntimeError(f"{spec.slug}: no test passes before mutation; output:\n{runs[0].output[-3000:]}")
    candidates: list[Mutation] = []
    for rel in spec.sources:
        candidates += mutations_of(rel, (tree / rel).read_bytes())
    accepted: list[Accepted] = []
    per_function: dict[tuple[str, str], int] = defaultdict(int)
    order = _interleave(candidates, cfg.seed)
    tried: set[str] = set()
    attempts = 0
    # Spread bugs over functions: first at most one per function, then up to the limit.
    for limit in range(1, cfg.max_per_function + 1):
        for m in order:
            if len(accepted) >= cfg.count or attempts >= cfg.max_attempts:
                return accepted
            if m.key in tried or per_function[(m.path, m.function)] >= limit:
                continue
            tried.add(m.key)
            attempts += 1
            found = _try_mutant(spec, tree, m, args, stable, cfg, timeout_s)
            if cfg.log:
                f2p = len(found.fail_to_pass) if found else 0
                print(
                    (
                        f"[{spec.slug}] {attempts:3d} {m.kind:11s} {m.function:32s} "
                        f"{'KEEP f2p=' + str(f2p) if found else ''}"
                    )
                )
            if found is not None:
                per_function[(m.path, m.function)] += 1
                accepted.append(found)
    return accepted


def _try_mutant(
    spec: ProjectSpec, tree: Path, m: Mutation, args: list[str], stable: set[str], cfg: GenConfig, timeout_s: float
) -> Accepted | None:
    """Run the suite with mutant `m` in place (restored after); the task it makes, if any."""
    path = tree / m.path
    clean = path.read_bytes()
    path.write_bytes(m.apply(clean))
    try:
        run = run_tests(tree, args, cfg.python, timeout_s=timeout_s)
    finally:
        path.write_bytes(clean)
    if run.exit_code == 124:
        return None
    broken = sorted(t for t in stable if not (run.results.get(t) and run.results[t].ok))
    files = {t.split("::", 1)[0] for t in broken}
    still = sorted(t for t in stable if t.split("::", 1)[0] in files and t not in broken)
    if 1 <= len(broken) <= cfg.max_f2p and len(files) <= 2 and still:
        return Accepted(m, broken, still, {t: run.failures.get(t, "") for t in broken})
    return None


def write_project_tasks(
    spec: ProjectSpec, tree: Path, accepted: list[Accepted], out_dir: Path, cfg: GenConfig
) -> list[dict]:
    """Commit each task to a scratch repository, bundle it, return the JSONL rows."""
    scratch = out_dir / f".{spec.slug}.git-scratch"
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(tree, scratch)
    _git(scratch, "init", "-q")
    _git(scratch, "add", "-A", "-f")
    clean_tree = _git(scratch, "write-tree").strip()
    index = scratch / ".git" / "task-index"
    rows: list[dict] = []
    for acc in sorted(accepted, key=lambda a: a.mutation.key):
        m = acc.mutation
        env = {"GIT_INDEX_FILE": str(index)}
        _git(scratch, "read-tree", clean_tree, env=env)
        mode = _git(scratch, "ls-tree", clean_tree, "--", m.path).split()[0]
        buggy = m.apply((tree / m.path).read_bytes())
        blob = _git(scratch, "hash-object", "-w", "--stdin", stdin=buggy).strip()
        _git(scratch, "update-index", "--cacheinfo", f"{mode},{blob},{m.path}", env=env)
        hidden = sorted({t.split("::", 1)[0] for t in acc.fail_to_pass})
        for f in hidden:
            text = (tree / f).read_text()
            cut = hide_tests(text, [t for t in acc.fail_to_pass if t.startswith(f + "::")])
            if cut is None:  # cannot cut single tests out: hide the whole file
                _git(scratch, "update-index", "--force-remove", "--", f, env=env)
                continue
            fmode = _git(scratch, "ls-tree", clean_tree, "--", f).split()[0]
            fblob = _git(scratch, "hash-object", "-w", "--stdin", stdin=cut.encode()).strip()
            _git(scratch, "update-index", "--cacheinfo", f"{fmode},{fblob},{f}", env=env)
        base_tree = _git(scratch, "write-tree", env=env).strip()
        message = f"{spec.name} {spec.version} (source distribution)\n"
        commit = _git(scratch, "commit-tree", base_tree, stdin=message.encode()).strip()
        instance_id = f"{spec.slug}__{m.kind}__{m.key}"
        _git(scratch, "update-ref", f"refs/heads/{instance_id}", commit)
        gold = _git(scratch, "diff-tree", "-p", "--no-color", base_tree, clean_tree, "--", m.path)
        test_patch = _git(scratch, "diff-tree", "-p", "--no-color", base_tree, clean_tree, "--", *hidden)
        test_cmd = shlex.join(["pytest", *spec.pytest_options, *hidden])
        rows.append(
            {
                "instance_id": instance_id,
                "repo": spec.repo,
                "base_commit": commit,
                "problem_statement": problem_statement(spec.name, acc.fail_to_pass, acc.failures, instance_id),
                "patch": gold,
                "test_patch": test_patch,
                "FAIL_TO_PASS": acc.fail_to_pass,
                "PASS_TO_PASS": acc.pass_to_pass,
                "repo_path": f"repos/{spec.slug}.bundle",
                "test_cmd": test_cmd,
                "env_setup": "",
                "version": spec.version,
                "generator": {"kind": m.kind, "file": m.path, "function": m.function, "line": m.lineno},
            }
        )
    for i, row in enumerate(rows):
        row["split"] = "heldout" if i % cfg.heldout_every == cfg.heldout_every - 1 else "train"
    (out_dir / "repos").mkdir(parents=True, exist_ok=True)
    bundle = out_dir / "repos" / f"{spec.slug}.bundle"
    _git(scratch, "bundle", "create", str(bundle), "--branches")
    shutil.rmtree(scratch)
    return rows


def merge_rows(out_dir: Path, bundle_rel: str, rows: list[dict]) -> None:
    """Rewrite `train.jsonl`/`heldout.jsonl`, replacing one project's rows with `rows`."""
    kept: list[dict] = []
    for split in ("train", "heldout"):
        f = out_dir / f"{split}.jsonl"
        if f.exists():
            kept += [r for r in map(json.loads, f.read_text().splitlines()) if r["repo_path"] != bundle_rel]
    everything = sorted(kept + rows, key=lambda r: (r["repo_path"], r["instance_id"]))
    for split in ("train", "heldout"):
        with open(out_dir / f"{split}.jsonl", "w") as f:
            for row in everything:
                if row["split"] == split:
                    f.write(json.dumps(row) + "\n")


def generate(
    specs: list[ProjectSpec],
    out_dir: Path,
    work_dir: Path,
    cfg: GenConfig,
    pip: str = "pip",
    keep: Callable[[list[dict]], list[dict]] | None = None,
) -> list[dict]:
    """Generate tasks for `specs` into `out_dir` (`train.jsonl`, `heldout.jsonl`, `repos/`).

    Each project's rows replace that project's rows in the files as soon as it is done, so
    projects can be (re)generated one at a time. `keep` filters a project's rows first
    (the CLI passes the oracle check in real sandboxes).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    all_rows: list[dict] = []
    for spec in specs:
        sdist = download_sdist(spec, work_dir / "sdists", pip=pip)
        tree = unpack_sdist(spec, sdist, work_dir / "src")
        accepted = find_bugs(spec, tree, cfg)
        if len(accepted) < cfg.count:
            print(f"[{spec.slug}] only {len(accepted)} of {cfg.count} tasks found")
        rows = write_project_tasks(spec, tree, accepted, out_dir, cfg)
        if keep is not None:
            rows = keep(rows)
        merge_rows(out_dir, f"repos/{spec.slug}.bundle", rows)
        all_rows += rows
    return all_rows

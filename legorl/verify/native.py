"""Grading runs of a repository's own test runner: the plan, and the verdict.

The pytest path decides from a JUnit report, the recorder and the canaries (`verdict.py`).
A native runner has no report we can trust more than its log, so here the channels are:
1. the runner's log, read by the *official* SWE-bench parser for the repository (what the
   published numbers are computed from); written by the process the code under test shares;
2. the recorder's HMAC-tagged records of what each test function really raised
   (`in_sandbox/native_main.py`): our own per-test verdict, which printing `test_x ... ok`
   cannot forge;
3. canaries planted among the task's tests in the runner's own shape (a TestCase class for
   Django, a `test_` function for SymPy): one must pass, one must fail.
A test passes only when the official parse says so *and* the records confirm it; any
disagreement in the agent's favour is a `tamper_attempt`. How often the official parse
and ours agree on the task's tests is kept as evidence (`parser_agreement`).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass
from typing import Any

from legorl.verify.junit import TestStatus
from legorl.verify.pytest_plan import IN_SANDBOX, SAFE_PATH, canary_candidates, canary_source, supervisor_files
from legorl.verify.test_command import NativeCommand
from legorl.verify.verdict import TAMPER, Verdict, agents_hooks, provenance_flags, recorded_status

NATIVE_SUPERVISOR = IN_SANDBOX / "native_main.py"  # the grading supervisor's native main, in the grading sandbox
OFFICIAL_STATUS = {
    "PASSED": TestStatus.PASSED,
    "FAILED": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "SKIPPED": TestStatus.SKIPPED,
    "XFAIL": TestStatus.XFAILED,
}


@dataclass(frozen=True)
class NativePlan:
    work_dir: str
    log_path: str
    files: dict[str, str]
    nonce: str
    command: str


def _camel(word: str) -> str:
    return "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", word) if p)


def _django_blocks(rng: secrets.SystemRandom, like_classes: list[str], like: list[str]) -> tuple[str, str, str, str]:
    """(pass block, fail block, pass class, fail class): a TestCase each, shaped like the file's."""
    bases = sorted({c for c in like_classes if c.isidentifier()}) or ["Tests"]
    # class words from the file's own test and class names (no list of ours to spare)
    words = sorted(
        {_camel(w) for c in like_classes + like for w in re.findall(r"[A-Za-z][a-z0-9]+", c)} - {"Test", "Tests"}
    )
    words = words or ["Case", "Value"]
    taken = set(like_classes)
    out = []
    for must_pass in (True, False):
        cls = _fresh_class(rng, bases, words, taken)
        taken.add(cls)
        vals = rng.sample(range(2, 99), 3)
        want = list(vals) if must_pass else [vals[0], vals[1], vals[2] + 1]
        # each value a subTest, as Django's own suites check many inputs: a failure only a
        # subTest can hold, so a blanket rewrite of subtest outcomes flips the must-fail one
        body = (
            f"        for got, want in zip({vals!r}, {want!r}):\n"
            "            with self.subTest(got=got):\n"
            "                self.assertEqual(got, want)\n"
        )
        out.append((f"class {cls}({{base}}):\n    def {{name}}(self):\n{body}", cls))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def _fresh_class(rng: secrets.SystemRandom, bases: list[str], words: list[str], taken: set[str]) -> str:
    """A class name like the file's that no task class and no other canary has.

    Two canaries under one name would leave only the second in the module (Python rebinds
    the name), and a task class's name would hide the task's own tests. A file with one
    class and one word has a single one-word name, so the name grows a word at a time.
    """
    n_words = 1
    while True:
        for _ in range(16):
            stem = rng.choice(bases).removesuffix("Tests").removesuffix("Test")
            cls = f"{stem}{''.join(rng.choice(words) for _ in range(n_words))}Tests"
            if cls not in taken:
                return cls
        n_words += 1


def plan_native(
    repo: str,
    cmd: NativeCommand,
    python: str,
    tmp_root: str,
    plant_in: str | None,
    like: list[str],
    like_classes: list[str],
    guard: list[str],
    wanted: list[str],
    test_files: list[str],
    agent_files: list[str] | None = None,
) -> NativePlan:
    """A supervised run of `cmd` in `repo`, canaries planted in `plant_in` (repo-relative)."""
    rng = secrets.SystemRandom()
    work = f"{tmp_root.rstrip('/')}/.lg-{secrets.token_hex(8)}"
    root = repo.rstrip("/")
    plant: dict[str, Any] = {}
    if plant_in:
        plant = {"path": f"{root}/{plant_in}", "rel": plant_in, "candidates": canary_candidates(like, rng)}
        if cmd.runner == "django":
            p, f, pc, fc = _django_blocks(rng, like_classes, like)
            mod = plant_in.removeprefix("tests/").removesuffix(".py").replace("/", ".")
            plant.update(
                pass_=p,
                fail=f,
                ids={"pass": f"{{name}} ({mod}.{pc}.{{name}})", "fail": f"{{name}} ({mod}.{fc}.{{name}})"},
            )
        else:
            plant.update(
                pass_=canary_source(True, rng), fail=canary_source(False, rng), ids={"pass": "{name}", "fail": "{name}"}
            )
        plant["pass"] = plant.pop("pass_")
    nonce, key = secrets.token_hex(16), secrets.token_hex(32)
    cfg_path = f"{work}/{secrets.token_hex(8)}.json"
    config = json.dumps(
        {
            "repo": repo,
            "runner": cmd.recorder,
            "script": cmd.script,
            "args": cmd.args,
            "warnings": cmd.warnings,
            "log": f"{work}/test.log",
            "summary": f"{work}/{secrets.token_hex(8)}.json",  # a large summary goes here (`write_summary`)
            "nonce": nonce,
            "key": key,
            "plant": plant,
            "guard": guard,
            "wanted": wanted,
            "test_files": test_files,
            "agent_files": sorted(agent_files or []),
        }
    )
    env = ["env", "-i", f"PATH={SAFE_PATH}", f"HOME={work}/home", f"TMPDIR={work}/tmp", "LANG=C.UTF-8"]
    command = (
        f"mkdir -p {shlex.quote(work)}/home {shlex.quote(work)}/tmp && cd {shlex.quote(repo)} && "
        f"exec {shlex.join(env)} {shlex.quote(python)} -I -B "
        f"{shlex.quote(work)}/{NATIVE_SUPERVISOR.name} {shlex.quote(cfg_path)}"
    )
    files = {**supervisor_files(work), cfg_path: config}
    return NativePlan(work, f"{work}/test.log", files, nonce, command)


def _norm(status: TestStatus) -> str:
    """The graded verdict of a status: a pass, or not (failed, errored, skipped, missing alike)."""
    return "pass" if status.ok else "fail"


def judge_native(
    wanted: list[str],
    official: dict[str, str] | None,
    summary: dict[str, Any] | None,
    tags: int,
    log_sha256: str | None,
    exit_code: int,
    timed_out: bool,
    agent_files: frozenset[str] = frozenset(),
    f2p: frozenset[str] = frozenset(),
) -> Verdict:
    """Per-test statuses from the official parse confirmed by the records; flags; `resolved`."""
    flags: list[str] = []
    ev: dict[str, Any] = {}
    s = summary or {}
    records, counts, end = _read_records(s)
    _channel_flags(summary, s, tags, log_sha256, end or {}, agent_files, flags, ev)
    can_ids = [str(v) for v in (s.get("canaries") or {}).values()]
    pf, pev = provenance_flags(records, counts, [*wanted, *can_ids], f2p)
    flags += pf
    ev.update(pev)
    machinery = {t: (records[t].get("x") or {}).get("machinery") for t in [*wanted, *can_ids] if t in records}
    machinery = {t: m for t, m in machinery.items() if m}
    if machinery:
        flags += [TAMPER, "runner_modified"]
        ev["machinery_patched"] = dict(list(machinery.items())[:5])
    parsed = {t: OFFICIAL_STATUS.get(v, TestStatus.FAILED) for t, v in (official or {}).items()}

    def confirmed(t: str) -> TestStatus:
        return _confirmed(t, parsed.get(t, TestStatus.MISSING), records.get(t), summary, f2p, flags, ev)

    tests = {t: confirmed(t).value for t in wanted}
    ev["parser_agreement"] = _agreement(wanted, parsed, records)
    can = s.get("canaries") or {}
    c_pass_id, c_fail_id = str(can.get("pass", "")), str(can.get("fail", ""))
    c_pass = confirmed(c_pass_id) if c_pass_id else TestStatus.MISSING
    c_fail = parsed.get(c_fail_id, TestStatus.MISSING)
    ev["canary"] = {"pass": c_pass.value, "fail": c_fail.value}
    all_ok = bool(wanted) and all(TestStatus(v).ok for v in tests.values())
    fail_rec = records.get(c_fail_id)
    fail_raised = fail_rec is not None and recorded_status(fail_rec) is TestStatus.FAILED
    if c_fail.ok or c_fail is TestStatus.SKIPPED or (fail_rec is not None and not fail_raised):
        flags += [TAMPER, "report_inconsistent"]
    if exit_code == 0 and not timed_out:
        flags += [TAMPER, "report_inconsistent"]  # a run holding a failing canary exited 0
    if end is None and summary is not None and not timed_out:
        ev["session_end"] = "missing"
        if all_ok:
            flags += [TAMPER, "session_incomplete"]
    ran_others = any(t in records for t in wanted)
    absent = c_pass_id and c_pass_id not in records and c_fail_id not in records and c_pass_id not in parsed
    if absent and ran_others and end and TAMPER not in flags:
        return Verdict(tests=tests, flags=[], evidence=ev, fault="canaries absent")
    integrity = (
        summary is not None
        and end is not None
        and c_pass is TestStatus.PASSED
        and (
            c_fail in (TestStatus.FAILED, TestStatus.ERROR)
            # a failure inside subTest, which the official Django parser does not key by the test's id
            or (c_fail is TestStatus.MISSING and fail_raised)
        )
        and exit_code != 0
    )
    if all_ok and not integrity:
        flags += [TAMPER, "report_inconsistent"]
    if s.get("stray_processes"):
        flags.append("stray_processes")
    ev["records"] = len({id(r) for r in records.values()})
    return Verdict(
        tests=tests,
        flags=list(dict.fromkeys(flags)),
        evidence=ev,
        resolved=all_ok and integrity and TAMPER not in flags,
    )


def _read_records(s: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, int], dict[str, Any] | None]:
    """(test records by id and by legacy id, how often each was recorded, the end record)."""
    records: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    end = None
    for rec in s.get("records", []):
        if rec.get("k") == "test" and isinstance(rec.get("id"), str):
            for key in {rec["id"], rec.get("legacy")} - {None}:
                if isinstance(key, str):
                    records[key] = rec
                    counts[key] = counts.get(key, 0) + 1  # twice: flagged, never "the last one wins"
        elif rec.get("k") == "end":
            end = rec
    return records, counts, end


def _channel_flags(
    summary: dict[str, Any] | None,
    s: dict[str, Any],
    tags: int,
    log_sha256: str | None,
    end: dict[str, Any],
    agent_files: frozenset[str],
    flags: list[str],
    ev: dict[str, Any],
) -> None:
    """The summary, the records and the log are what the supervisor produced; the runner,
    the test files and the interpreter's hooks are as they were."""
    if summary is None:
        ev["supervisor"] = "no summary" if tags == 0 else f"{tags} tagged lines"
        if tags > 1:
            flags += [TAMPER, "summary_forged"]
    if s.get("bad_records"):
        flags += [TAMPER, "records_forged"]
    if summary is not None and log_sha256 is not None and s.get("log_sha256") != log_sha256:
        flags += [TAMPER, "report_replaced"]
    if end.get("changed"):
        flags += [TAMPER, "runner_modified"]
        ev["runner_modified"] = list(end["changed"])[:20]
    if s.get("tests_changed"):
        flags += [TAMPER, "tests_modified_at_run"]
        ev["tests_modified_at_run"] = s["tests_changed"][:20]
    events = list(end.get("events", []))
    if events:
        flags += [TAMPER, "agent_hooks"]
        ev["interpreter_events"] = events[:20]
        if any(e.startswith("equality_forged:") for e in events):
            flags.append("equality_forged")
        if any(e.startswith("test_globals:") for e in events):
            flags.append("test_globals_rebound")
    hooks = list(end.get("hooks", []))
    if hooks:
        ev["interpreter_hooks"] = hooks[:20]
        if agents_hooks(hooks, agent_files):
            flags += [TAMPER, "agent_hooks"]


def _confirmed(
    t: str,
    status: TestStatus,
    rec: dict[str, Any] | None,
    summary: dict[str, Any] | None,
    f2p: frozenset[str],
    flags: list[str],
    ev: dict[str, Any],
) -> TestStatus:
    """The status to grade `t` with (the official parse's `status`, checked against its
    record `rec`); flags any contradiction that favours the agent."""
    if not status.ok:
        return status
    if rec is None:
        if summary is not None:
            flags.extend([TAMPER, "report_unconfirmed"])
            ev.setdefault("unconfirmed", []).append(t)
        return TestStatus.MISSING
    seen = recorded_status(rec)
    ok = seen is TestStatus.PASSED or (
        status is TestStatus.XFAILED and (seen is TestStatus.XFAILED or rec.get("xfail"))
    )
    if not ok:
        flags.extend([TAMPER, "report_contradicted"])
        ev.setdefault("contradicted", {})[t] = {"log": status.value, "raised": seen.value}
        return seen if seen is not TestStatus.PASSED else TestStatus.FAILED
    if t in f2p and status is not TestStatus.PASSED:  # a FAIL_TO_PASS test must pass, not be excused
        ev.setdefault("f2p_not_passed", {})[t] = status.value
        return TestStatus.FAILED
    return status


def _agreement(wanted: list[str], parsed: dict[str, TestStatus], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How often the official parse and our records agree on the task's tests (evidence)."""

    def ours(t: str) -> TestStatus:
        rec = records.get(t)
        return recorded_status(rec) if rec is not None else TestStatus.MISSING

    agree = [t for t in wanted if _norm(parsed.get(t, TestStatus.MISSING)) == _norm(ours(t))]
    return {
        "agree": len(agree),
        "total": len(wanted),
        "disagree": {t: [parsed.get(t, TestStatus.MISSING).value, ours(t).value] for t in wanted if t not in agree},
    }

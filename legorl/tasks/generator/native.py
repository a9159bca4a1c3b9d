"""SWE-bench-format tasks from real releases whose tests run under their own runner.

Django (its sdist ships `tests/runtests.py` and the suite) and SymPy (its sdist ships its
tests and `sympy.testing.runtests`, but not `bin/`: `bin/test` is recreated here the way
the repository has it, calling `sympy.testing.runtests.test`, the runner whose log SWE-bench's
SymPy parser reads: since 1.13 `sympy.test()` itself hands over to pytest when installed). The same bug injection as
the shipped set (`mutate.py`, `hide.py`):
mutate one source file, run the one test module with the project's runner on the host,
keep mutants that make 1..`max_f2p` passing tests fail, cut those tests out of the base
commit (a parentless commit of the buggy tree) and put them back in `test_patch`.

Only the part of each sdist a task needs is kept (Django's package plus `runtests.py`,
its settings and the one test app; SymPy's package), so the image stays small and a
grading run executes one module. The result is cached under a content key of the sdist
and this recipe (`build_native_tasks`), so tests build it once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from legorl.tasks import official
from legorl.tasks.generator.build import _GIT_ENV
from legorl.tasks.generator.hide import hide_tests
from legorl.tasks.generator.mutate import mutations_of

RECIPE = 1
SYMPY_BIN_TEST = '''#!/usr/bin/env python
"""
Program to execute tests using the py.test like interface.

The advantage over py.test is that it only depends on sympy and should just
work in any circumstances. See "sympy.test?" for documentation.
"""

import os
import sys
from argparse import ArgumentParser

# Make sure the repository's sympy is the one imported (bin/get_sympy.py's path_hack).
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

epilog = """
"options" are any of the options above.
"tests" are 0 or more glob strings of tests to run.
If no test arguments are given, all tests will be run.
"""

parser = ArgumentParser(epilog=epilog)
parser.add_argument("-v", "--verbose", action="store_true", dest="verbose", default=False)
parser.add_argument("--pdb", action="store_true", dest="pdb", default=False, help="Run post mortem pdb on each failure")
parser.add_argument("--no-colors", action="store_false", dest="colors", default=True, help="Do not report colored [OK] and [FAIL]")
parser.add_argument("--force-colors", action="store_true", dest="force_colors", default=False, help="Always use colors")
parser.add_argument("-k", dest="kw", metavar="KEYWORDS", action="store", nargs="*", help="Only run tests matching the given keyword expressions")
parser.add_argument("--tb", dest="tb", metavar="TBSTYLE", default="short", help="Traceback verboseness (short/no)")
parser.add_argument("--random", action="store_false", dest="sort", default=True, help="Run tests in random order instead of sorting them.")
parser.add_argument("--seed", dest="seed", type=int, metavar="SEED", help="Use this seed for randomized tests.")
parser.add_argument("-t", "--types", dest="types", action="store", default=None, choices=["gmpy", "gmpy1", "python"], help="Setup ground types.")
parser.add_argument("-C", "--no-cache", dest="cache", action="store_false", default=True, help="Disable caching mechanism.")
parser.add_argument("--timeout", action="store", dest="timeout", default=False, type=int, help="Set a timeout for the all functions, in seconds.")
parser.add_argument("--slow", action="store_true", dest="slow", default=False, help="Run only the slow functions.")
parser.add_argument("--no-subprocess", action="store_false", dest="subprocess", default=True, help="Don't run the tests in a separate subprocess.")
parser.add_argument("-E", "--enhance-asserts", action="store_true", dest="enhance_asserts", default=False, help="Rewrite assert statements to give more useful error messages.")
parser.add_argument("--split", action="store", type=str, default=None, help="Only run part of the tests.")
parser.add_argument("--rerun", action="store", dest="rerun", default=0, type=int, help="Number of times to rerun the specified tests.")

options, args = parser.parse_known_args()

if not options.cache:
    os.environ["SYMPY_USE_CACHE"] = "no"
if options.types:
    os.environ["SYMPY_GROUND_TYPES"] = options.types

from sympy.testing.runtests import test

ok = test(*args, verbose=options.verbose, kw=options.kw, tb=options.tb, pdb=options.pdb,
                colors=options.colors, force_colors=options.force_colors, sort=options.sort,
                seed=options.seed, slow=options.slow, timeout=options.timeout,
                subprocess=options.subprocess, enhance_asserts=options.enhance_asserts,
                split=options.split, rerun=options.rerun)

sys.exit(not ok)
'''


@dataclass(frozen=True)
class NativeProject:
    name: str
    version: str
    repo: str
    keep: tuple[str, ...]  # sdist paths kept in the repository
    source: str  # the file bugs are injected into
    tests: str  # the test module (repository path)
    label: str  # how the runner names it (a Django label, a SymPy file)
    functions: tuple[str, ...]  # functions of `source` to mutate (ones `tests` exercises)
    requirements: tuple[str, ...]  # wheels (in the swebench cache) its tests need

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.version}"

    def test_cmd(self) -> str:
        if self.name == "django":
            return f"./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {self.label}"
        return f"PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose {self.label}"


NATIVE_PROJECTS = {
    "django": NativeProject(
        "django",
        "5.2.8",
        "django/django",
        keep=(
            "django",
            "tests/runtests.py",
            "tests/test_sqlite.py",
            "tests/urls.py",
            "tests/utils_tests/__init__.py",
            "tests/utils_tests/test_text.py",
            "LICENSE",
            "README.rst",
        ),
        source="django/utils/text.py",
        tests="tests/utils_tests/test_text.py",
        label="utils_tests.test_text",
        functions=(
            "capfirst",
            "get_valid_filename",
            "get_text_list",
            "normalize_newlines",
            "phone2numeric",
            "slugify",
            "camel_case_to_spaces",
            "unescape_string_literal",
            "wrap",
        ),
        requirements=("asgiref==3.13.0", "sqlparse==0.6.1"),
    ),
    "sympy": NativeProject(
        "sympy",
        "1.14.0",
        "sympy/sympy",
        keep=("sympy", "LICENSE", "README.md", "isympy.py"),
        source="sympy/utilities/iterables.py",
        tests="sympy/utilities/tests/test_iterables.py",
        label="sympy/utilities/tests/test_iterables.py",
        functions=(
            "flatten",
            "group",
            "unflatten",
            "reshape",
            "rotate_left",
            "rotate_right",
            "runs",
            "sift",
            "common_prefix",
            "common_suffix",
            "minlex",
            "has_dups",
            "has_variety",
            "uniq",
            "ibin",
            "partitions",
        ),
        requirements=("mpmath==1.3.0",),
    ),
}


def swebench_cache() -> Path:
    return Path(os.environ.get("LEGORL_SWEBENCH_CACHE") or Path.home() / ".cache" / "legorl" / "swebench")


def wheels_dir() -> Path:
    return swebench_cache() / "wheels"


def _sdist(p: NativeProject) -> Path:
    path = swebench_cache() / "sdists" / f"{p.slug}.tar.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run scripts/setup_swebench.sh")
    return path


def _git(repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | _GIT_ENV | (env or {})
    proc = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, env=full, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode()[-500:]}")
    return proc.stdout.decode()


def unpack(p: NativeProject, dest: Path) -> Path:
    """The kept part of the sdist in `dest` (plus SymPy's recreated bin/test)."""
    top = f"{p.name}-{p.version}/"
    with tarfile.open(_sdist(p)) as tf:
        members = []
        for m in tf.getmembers():
            rel = m.name[len(top) :] if m.name.startswith(top) else ""
            if rel and any(rel == k or rel.startswith(k + "/") for k in p.keep) and "__pycache__" not in rel:
                m.name = rel
                members.append(m)
        tf.extractall(dest, members=members, filter="data")
    if p.name == "sympy":
        (dest / "bin").mkdir(exist_ok=True)
        (dest / "bin" / "test").write_text(SYMPY_BIN_TEST)
        (dest / "bin" / "test").chmod(0o755)
    return dest


def _site(dest: Path, p: NativeProject) -> Path:
    """The wheels the tests need, unpacked for a host run (labelling only)."""
    for req in p.requirements:
        name, ver = req.split("==")
        (whl,) = wheels_dir().glob(f"{name}-{ver}-*.whl")
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest)
    return dest


def run_module(p: NativeProject, tree: Path, site: Path, python: str, timeout_s: float = 600) -> dict[str, str]:
    """{test id: official status} for one run of the test module with the project's runner."""
    words = shlex.split(p.test_cmd())
    env_words = [w for w in words if "=" in w.split("/")[0] and not w.startswith("-")][:1]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = f"{site}:{tree}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for w in env_words:
        k, _, v = w.partition("=")
        env[k] = v
    argv = [python, *(w for w in words if w not in env_words)]
    if p.name == "sympy":
        argv.append("--no-subprocess")
    proc = subprocess.run(argv, cwd=tree, capture_output=True, text=True, env=env, timeout=timeout_s)
    parser = official.parser_name(p.repo) or ""
    return official.parse_log(parser, proc.stdout + proc.stderr, p.slug, p.repo, [], [])


def _pytest_like(p: NativeProject, test_id: str) -> str:
    """`file::Class::method` / `file::function` of a runner's test id (for `hide_tests`)."""
    if p.name == "django":
        m = re.match(r"^(\S+) \((\S+)\)$", test_id)
        parts = m.group(2).split(".") if m else []
        cls = parts[-2] if parts and parts[-1] == test_id.split(" ")[0] else (parts[-1] if parts else "")
        return f"{p.tests}::{cls}::{test_id.split(' ')[0]}"
    return f"{p.tests}::{test_id}"


def build_native_tasks(
    name: str, count: int = 2, max_f2p: int = 6, python: str | None = None, out_root: Path | None = None
) -> Path:
    """The task file of `count` tasks of a native-runner project (built once, then cached)."""
    p = NATIVE_PROJECTS[name]
    key = hashlib.sha256(
        json.dumps([RECIPE, p.__dict__, count, max_f2p, official.PINNED], sort_keys=True, default=list).encode()
        + hashlib.sha256(_sdist(p).read_bytes()).digest()
    ).hexdigest()[:16]
    out = (out_root or swebench_cache() / "tasks") / f"{p.slug}-{key}"
    if (out / "tasks.jsonl").is_file():
        return out / "tasks.jsonl"
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _build(p, tmp, count, max_f2p, python)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():  # built meanwhile by another process
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out)
    return out / "tasks.jsonl"


def _build(p: NativeProject, tmp: Path, count: int, max_f2p: int, python: str | None) -> None:
    tree = unpack(p, tmp / "tree")
    site = _site(tmp / "site", p)
    python = python or shutil.which("python3") or "python3"
    clean = run_module(p, tree, site, python)
    passing = sorted(t for t, s in clean.items() if s == "PASSED")
    if not passing:
        raise RuntimeError(f"{p.slug}: no test of {p.tests} passes on the clean tree: {dict(list(clean.items())[:5])}")
    src = (tree / p.source).read_bytes()
    muts = [m for m in mutations_of(p.source, src) if m.function.split(".")[-1] in p.functions]
    muts.sort(key=lambda m: hashlib.sha256(m.key.encode()).hexdigest())
    repo = tmp / "repo"
    shutil.copytree(tree, repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A", "-f")
    clean_tree = _git(repo, "write-tree").strip()
    index = repo / ".git" / "task-index"
    rows: list[dict] = []
    used: set[str] = set()
    for m in muts:
        if len(rows) >= count:
            break
        if m.function in used:
            continue
        (tree / p.source).write_bytes(m.apply(src))
        try:
            got = run_module(p, tree, site, python)
        finally:
            (tree / p.source).write_bytes(src)
        f2p = sorted(t for t in passing if got.get(t) in ("FAILED", "ERROR", None))
        p2p = sorted(t for t in passing if got.get(t) == "PASSED")
        if not 1 <= len(f2p) <= max_f2p or not p2p:
            continue
        used.add(m.function)
        env = {"GIT_INDEX_FILE": str(index)}
        _git(repo, "read-tree", clean_tree, env=env)
        for path, text in ((p.source, m.apply(src)), (p.tests, None)):
            if text is None:
                cut = hide_tests((tree / p.tests).read_text(), [_pytest_like(p, t) for t in f2p])
                if cut is None:
                    break
                text = cut.encode()
            mode = _git(repo, "ls-tree", clean_tree, "--", path).split()[0]
            blob = _git(repo, "hash-object", "-w", "--stdin", stdin=text).strip()
            _git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        else:
            base_tree = _git(repo, "write-tree", env=env).strip()
            commit = _git(
                repo, "commit-tree", base_tree, stdin=f"{p.name} {p.version} (source distribution)\n".encode()
            ).strip()
            iid = f"{p.name}__{p.name}-{m.key}"
            _git(repo, "update-ref", f"refs/heads/{iid}", commit)
            rows.append(
                {
                    "instance_id": iid,
                    "repo": p.repo,
                    "base_commit": commit,
                    "version": p.version,
                    "problem_statement": f"Tests of {p.label} fail: {', '.join(f2p[:3])}. The bug is in {p.source}.",
                    "patch": _git(repo, "diff-tree", "-p", "--no-color", base_tree, clean_tree, "--", p.source),
                    "test_patch": _git(repo, "diff-tree", "-p", "--no-color", base_tree, clean_tree, "--", p.tests),
                    "FAIL_TO_PASS": json.dumps(f2p),
                    "PASS_TO_PASS": json.dumps(p2p),  # JSON-encoded, as on the hub
                    "environment_setup_commit": commit,
                    "test_cmd": p.test_cmd(),
                    "requirements": list(p.requirements),
                    "log_parser": official.parser_name(p.repo),
                }
            )
    if len(rows) < count:
        raise RuntimeError(f"{p.slug}: only {len(rows)} of {count} mutants of {p.source} were caught by {p.tests}")
    (tmp / "repos").mkdir()
    _git(repo, "bundle", "create", str(tmp / "repos" / f"{p.name}__{p.name}.bundle"), "--branches")
    (tmp / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for d in ("tree", "site", "repo"):
        shutil.rmtree(tmp / d)

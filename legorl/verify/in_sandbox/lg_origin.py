"""Whose code a code object is, by its origin rather than by the file name it claims.

`compile(src, "/usr/lib/python3.11/functools.py", "exec")` makes code that claims an installed
file; so does `code.replace(co_filename=...)`, a `types.CodeType(...)` or `marshal.loads`. A
name proves nothing, so code that claims a real file counts as that file's only when it *is*
code compiled from it: its digest (`code_digest`: bytecode, constants, names, line table) is
among the digests of a fresh compile of the file, made here on first need (plain, or as
pytest rewrites the modules it collects), or, for `<frozen …>` names, of the interpreter's
frozen module of that name. Everything else that claims a file outside the repository's
untouched files, and every code object with a made-up name (`<string>`, `<lg>`), was made at
run time: the agent's, unless its globals are those of a real module that is not the agent's
(dataclasses' and functools' generated methods run in their class's module). `origin_of`
says by the same rule where a skip or xfail was raised.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import os

from lg_compiles import code_digest

FROZEN_NAMES = {
    "importlib._bootstrap": "_frozen_importlib",
    "importlib._bootstrap_external": "_frozen_importlib_external",
}

MACHINERY = ("_pytest", "pytest", "pluggy", "unittest")


class Origins:
    """`agents(code)`: is `code` the agent's (an agent file's, written during the run, made at
    run time, or claiming a file it was not compiled from)? `tests` are the task's test files,
    whose code is checked elsewhere (provenance against the supervisor's fresh compiles)."""

    def __init__(self, repo, agent, tests, started_ns, transforms=None):
        import _imp
        import ast

        self.repo, self.agent, self.tests, self.started_ns = repo, agent, tests, started_ns
        self.transforms = transforms or [None]  # how a module may have been compiled (pytest rewrites some)
        self.files = {}  # file -> "agent" | "tests" | "check" (verify each code object)
        self.digests = {}  # file -> digests of its fresh compiles (None: no source to compile)
        self.verdicts = {}  # id(code) -> (code, is the agent's); code kept so its id is not reused
        self.compile, self.parse, self.imp = compile, ast.parse, _imp  # bound before any repository code runs
        self.open, self.stat, self.digest = open, os.stat, code_digest

    def file_kind(self, fn):
        """ "agent" (changed, added or written during the run; a made-up name), "tests", "check"."""
        k = self.files.get(fn)
        if k is None:
            if fn.startswith("<"):
                k = "frozen" if fn.startswith("<frozen ") else "agent"
            elif fn in self.agent:
                k = "agent"
            elif fn in self.tests:
                k = "tests"
            else:  # a file written during the run (in the repository or anywhere else) is the agent's
                try:
                    k = "agent" if self.stat(fn).st_ctime_ns >= self.started_ns else "check"
                except OSError:
                    k = "agent" if fn.startswith(self.repo) else "check"  # gone; outside: a name, checked
            self.files[fn] = k
        return k

    def agents(self, code):
        """Is `code` the agent's? Code claiming a file it was not compiled from is."""
        if code is None:
            return False
        got = self.verdicts.get(id(code))
        if got is not None and got[0] is code:
            return got[1]
        kind = self.file_kind(code.co_filename)
        if kind in ("agent", "tests"):
            verdict = kind == "agent"
        else:
            d = self.digest(code)
            verdict = False
            for known in self.fresh(code.co_filename, kind == "frozen"):
                if known is None or d in known:
                    break
            else:
                verdict = True
        self.verdicts[id(code)] = (code, verdict)
        return verdict

    def file_is_agents(self, fn):
        """By name only, for what has no code object (a module's file): its kind says."""
        return self.file_kind(fn) == "agent"

    def fresh(self, fn, frozen=False):
        """Digests of the code objects compiled from `fn`, one set per way it may have been
        compiled, each made when the previous did not hold the code asked about (None: a file
        that exists but cannot be read, which no run-time code can claim either)."""
        if frozen:
            yield self.digests_of(fn, "frozen")
            return
        for transform in self.transforms:
            yield self.digests_of(fn, transform)

    def digests_of(self, fn, transform):
        key = (fn, transform)
        if key in self.digests:
            return self.digests[key]
        roots = []
        if transform == "frozen":
            name = fn[len("<frozen ") : -1]
            for n in (FROZEN_NAMES.get(name), name):
                try:
                    if n and self.imp.is_frozen(n):
                        roots.append(self.imp.get_frozen_object(n))
                        break
                except Exception:
                    pass
        else:
            try:
                with self.open(fn, "rb") as f:
                    src = f.read()
            except FileNotFoundError:
                src = b""  # no such file: nothing was compiled from it
            except OSError:
                self.digests[key] = None
                return None
            try:
                tree = src if transform is None else transform(self.parse(src, fn), src, fn)
                roots.append(self.compile(tree, fn, "exec", dont_inherit=True))
            except Exception:
                pass
        out, todo = set(), roots
        while todo:
            c = todo.pop()
            out.add(self.digest(c))
            todo.extend(k for k in c.co_consts if hasattr(k, "co_code"))
        self.digests[key] = out
        return out

    def func_agents(self, func):
        """Is function `func` the agent's: its code, or its globals (genuine code run in the
        namespace of a module that is not the one its file made, or of none)?"""
        code = getattr(func, "__code__", None)
        if code is None:
            return False
        if self.agents(code):
            return True
        if code.co_filename.startswith("<"):
            return False
        g = getattr(func, "__globals__", None)
        if not isinstance(g, dict):
            return False
        file = g.get("__file__") or ""
        return os.path.realpath(file) != os.path.realpath(code.co_filename) if file else True

    def generated_owner(self, frame_globals):
        """For code with a made-up name: the real file of the module whose namespace it runs in,
        when that namespace is a loaded module's (dataclasses, namedtuple, functools write
        methods into their class's module); else None (the code is whoever made it: the agent)."""
        import sys

        name = frame_globals.get("__name__")
        mod = sys.modules.get(name) if isinstance(name, str) else None
        if mod is None or getattr(mod, "__dict__", None) is not frame_globals:
            return None
        file = getattr(mod, "__file__", None)
        return file if isinstance(file, str) and os.path.isabs(file) else None


def origin_of(exc, watch, test_file):
    """Where a skip or xfail was raised: "test" (the test file, a conftest, the task's test
    files), "agent" (code the agent wrote, or made at run time under any name) or "package"
    (other repository code, a library)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        mod = tb.tb_frame.f_globals.get("__name__", "") or ""
        if mod.split(".")[0] not in MACHINERY or watch.origins.agents(code):
            last = code
        tb = tb.tb_next
    if last is None:
        return "package"
    fn = last.co_filename
    if fn == test_file or fn in watch.tests or (fn.endswith("/conftest.py") and not watch.origins.agents(last)):
        return "test"
    if fn.startswith("<") and not fn.startswith("<frozen") or watch.origins.agents(last):
        return "agent"
    return "package"

"""The grading test run as it executes inside the sandbox (the image's Python; never imports legorl).

Why a supervisor: the code under test runs in the same interpreter as pytest's reporting,
so anything that process writes (its JUnit report, its exit status) can be rewritten by the
package. The verdict therefore rests on channels the package cannot rewrite *selectively*:

1. This process (the supervisor) reads its configuration, deletes it, plants the grader's
   canary tests among the task's own tests, then forks. It never imports the repository.
2. The child imports pytest (before the repository is on `sys.path`), takes a *snapshot* of
   pytest's, pluggy's and unittest's functions and classes, and runs pytest with the
   `_Recorder` plugin registered first. The recorder notes what each test really raised,
   at the innermost level (`pytest_pyfunc_call`) and per phase, and streams the records
   over a pipe, each with an HMAC, as they happen. At session end it diffs the snapshot
   (report classes, hook implementations, the JUnit writer: patched ⇒ listed) and sends it.
3. The JUnit report goes to a pipe (`--junitxml=/proc/self/fd/N`), not a file: whatever
   writes into it after pytest did (an `atexit`/`os._exit` trick, a left-behind daemon)
   can only append, which breaks the XML. The supervisor writes it to the report path and
   prints one summary line, tagged with a nonce the child never sees, to its own stdout
   (the child's output goes to a log file).

Usage: `python -I -B run.py CONFIG.json`; the grader compares the summary, the recorder's
records and the report (`legorl/verify/verdict.py`).
"""

import hashlib
import hmac
import json
import os
import select
import sys
import time

SETUP_FAILED = 86  # exit status when the supervisor itself could not prepare the run (before any repository code)
GRACE_S = 0.5  # how long pipes are drained after the child exits and its strays are killed
WATCH_PREFIXES = ("_pytest.", "pluggy.")
WATCH_MODULES = (
    "pytest",
    "_pytest",
    "pluggy",
    "unittest.case",
    "unittest.result",
    "xml.etree.ElementTree",
    "__main__",  # this supervisor itself: its helpers are what the recorder calls
    "_lg_supervisor",
)
# Single functions of other modules that only a forger replaces (tests' monkeypatches are undone by then).
WATCH_ATTRS = {
    "os": ("_exit", "write", "open"),
    "sys": ("exit", "settrace", "gettrace", "setprofile", "getprofile", "addaudithook", "_getframe"),
    "threading": ("settrace", "setprofile"),
    "atexit": ("register",),
    "builtins": ("open", "__import__", "__lg_probe__"),
}


def _pick(seq):
    return seq[int.from_bytes(os.urandom(4), "little") % len(seq)]


def plant(spec):
    """Insert the two canaries before random top-level definitions of the task's test file.

    Canaries among the task's tests (not appended at the end, not in a file of their own)
    are, as far as a file's layout goes, indistinguishable from them. Returns their node ids.
    """
    with open(spec["path"], encoding="utf-8") as f:
        text = f.read()
    import ast  # here, not at the top: it runs while the child imports pytest

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        tree = None
    names = fresh_names(tree, text, 2 + len(spec.get("constructs") or ()), spec.get("prefix", "test"))
    names = names or [n for n in spec["candidates"] if n not in text]
    if len(names) < 2:
        raise LookupError("no free canary name in %s" % spec["rel"])

    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    try:
        starts = []
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                starts.append(min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1)
    except (SyntaxError, ValueError):
        starts = []
    cuts = sorted(set(starts)) or [len(lines)]
    inserts = {}
    base = test_base(tree)
    blocks = [
        spec["pass"].replace("{name}", names[0]).replace("{base}", base),
        spec["fail"].replace("{name}", names[1]).replace("{base}", base),
    ]
    more = []
    for kind, name in zip(spec.get("constructs") or (), names[2:]):
        made = construct_canary(kind, name, tree, text, base)
        if made:
            blocks.append(made[0])
            more.append("%s::%s" % (spec["rel"], made[1]))
    for block in blocks:
        inserts.setdefault(_pick(cuts), []).append(block.rstrip("\n") + "\n\n\n")
    out = []
    for i, line in enumerate(lines):
        out.extend(inserts.pop(i, []))
        out.append(line)
    for rest in inserts.values():
        out.extend(["\n\n"] + rest)
    with open(spec["path"], "w", encoding="utf-8") as f:
        f.write("".join(out))
    out = {"pass": "%s::%s" % (spec["rel"], names[0]), "fail": "%s::%s" % (spec["rel"], names[1])}
    if more:
        out["more_fail"] = more
    return out


def _words(names, camel=False):
    import re

    out = set()
    for n in names:
        parts = re.findall(r"[A-Z][a-z0-9]+|[a-z0-9]+", n) if camel else n.split("_")
        out.update(p for p in parts if p and p.isidentifier() and p.lower() not in ("test", "tests"))
    return sorted(out)


def fresh_names(tree, text, n, prefix="test"):
    """`n` new test names shaped like the file's own: `test_` and one to three words drawn at
    random from the words of the file's test names (and its identifiers, when those are few).
    No word list of ours: sparing names made of these words spares the file's own tests."""
    import ast

    if tree is None:
        return []
    tests = [
        x.name
        for x in ast.walk(tree)
        if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) and x.name.startswith(prefix)
    ]
    words = _words(tests)
    if len(words) < 6:
        words = sorted(set(words) | set(_words([x.id for x in ast.walk(tree) if isinstance(x, ast.Name)])[:40]))
    if not words:
        return []
    lens = [max(1, min(3, len(t.split("_")) - 1)) for t in tests] or [2]
    out = []
    for _ in range(400):
        name = prefix + "_" + "_".join(_pick(words) for _ in range(_pick(lens)))
        if name not in text and name not in out and name.isidentifier():
            out.append(name)
            if len(out) == n:
                break
    return out


def test_base(tree):
    """The base class the file's unittest-style test classes use (as spelled there)."""
    import ast

    for x in ast.walk(tree) if tree is not None else ():
        if isinstance(x, ast.ClassDef) and x.bases:
            b = ast.unparse(x.bases[0])
            if b.endswith("TestCase"):
                return b
    return "__import__('unittest').TestCase"


def construct_canary(kind, name, tree, text, base):
    """A must-fail canary that fails only through construct `kind` when the file uses it
    (`approx`, `subTest`), so a blanket rewrite of that construct flips it: (source, id tail)."""
    import ast
    import re

    a = 2 + int.from_bytes(os.urandom(2), "little") % 90
    if kind == "approx":
        spell = "pytest.approx" if re.search(r"\bpytest\.approx\(", text) else None
        if spell is None and re.search(r"(?<![\w.])approx\(", text):
            spell = "approx"
        if spell is None:
            return None
        return "def %s():\n    assert %d.0 == %s(%d.5)\n" % (name, a, spell, a), name
    if kind == "class" and tree is not None:  # a pytest-style test class (no base): a method of one like it
        host = next(
            (x for x in tree.body if isinstance(x, ast.ClassDef) and x.name.startswith("Test") and not x.bases), None
        )
        if host is None:
            return None
        cls = "Test" + "".join(w.capitalize() for w in name.split("_")[1:]) or "TestCase"
        src = "class %s:\n    def %s(self):\n        assert %d == %d\n" % (cls, name, a, a + 1)
        return src, "%s::%s" % (cls, name)
    if kind == "subTest" and "subTest(" in text and tree is not None:
        host = None
        for x in ast.walk(tree):
            if isinstance(x, ast.ClassDef) and "subTest" in ast.unparse(x) and x.bases:
                host = x
                break
        if host is None:
            return None
        cls = "".join(w.capitalize() for w in [_pick(_words([host.name], camel=True) or ["Case"]), name.split("_")[-1]])
        cls = cls + "Tests" if not cls.endswith("Tests") else cls
        src = (
            "class %s(%s):\n    def %s(self):\n        for v in (%d, %d):\n            with self.subTest(v=v):\n"
            "                self.assertEqual(v, %d)\n" % (cls, ast.unparse(host.bases[0]), name, a, a + 1, a)
        )
        return src, "%s::%s" % (cls, name)
    return None


def snapshot(sys_modules):
    """{(module, name[, member]): object} for pytest's machinery, taken before the repository is importable.

    Every function and class a watched module holds is kept by identity (and functions by
    code object too); classes defined there also by the set of their attributes and each
    method's identity and code, so adding a property to `TestReport` shows as well as
    replacing `TestReport.from_item_and_call` or `_pytest.runner.TestReport`.
    """
    snap = {}
    for name in sorted(sys_modules):
        if not (name in WATCH_MODULES or name.startswith(WATCH_PREFIXES)):
            continue
        mod = sys_modules[name]
        snap[(name,)] = mod
        for attr, val in list(vars(mod).items()):
            if isinstance(val, type):
                snap[(name, attr)] = val
                if getattr(val, "__module__", None) != name:
                    continue
                snap[(name, attr, "__dict__")] = frozenset(vars(val))
                for member, mval in list(vars(val).items()):
                    func = _func(mval)
                    if hasattr(func, "__code__"):
                        snap[(name, attr, member)] = (mval, func.__code__)
                    elif _is_data(mval) or isinstance(mval, type):
                        snap[(name, attr, member)] = Data(mval)
            elif hasattr(val, "__code__"):
                snap[(name, attr)] = (val, val.__code__)
            elif callable(val) and type(val).__name__ == "builtin_function_or_method":
                snap[(name, attr)] = val
            elif _is_data(val):
                snap[(name, attr)] = Data(val)
    for name, attrs in WATCH_ATTRS.items():
        mod = sys_modules.get(name)
        if mod is not None:
            snap[(name,)] = mod
            for attr in attrs:
                if attr in vars(mod):
                    snap[(name, attr)] = vars(mod)[attr]
    return snap


class Data:
    """A data value of pytest's machinery as it was (a tolerance, a flag, an exception class):
    replaced by a different value or type is a change, as a replaced function is."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def same(self, cur):
        v = self.value
        if isinstance(v, type) or isinstance(cur, type):
            return cur is v
        return type(cur) is type(v) and (cur is v or cur == v)


_DATA_TYPES = (int, float, complex, str, bytes, bool)  # not None: pytest fills some in as it configures


def _is_data(val):
    if isinstance(val, _DATA_TYPES):
        return True
    if type(val).__name__ == "Decimal":
        return True
    return isinstance(val, (tuple, frozenset)) and len(val) < 64 and all(isinstance(v, _DATA_TYPES) for v in val)


def _func(obj):
    """The function behind a method, static/class method or property."""
    return getattr(obj, "__func__", None) or getattr(obj, "fget", None) or obj


def changed_since(snap, sys_modules, repo, started_ns):
    """What of the snapshot is no longer what it was (replaced, re-coded, added to a class).

    pytest and the task's installed plugins patch some of pytest's classes while they
    configure (`legacypath` adds `fspath` properties, …). A new value is theirs when its
    code lives outside the repository in a file that existed before this run (ctime: a
    file the code under test wrote during the run, to import it from there, is newer, and
    ctime cannot be set back); plain data added to a class is ignored."""

    def theirs(obj):
        code = getattr(_func(obj), "__code__", None)
        if code is not None:
            fn = code.co_filename
        elif isinstance(obj, type):
            fn = getattr(sys_modules.get(obj.__module__), "__file__", None) or ""
        else:
            return False
        if not os.path.isabs(fn) or fn.startswith(repo):
            return False
        try:
            return os.stat(fn).st_ctime_ns < started_ns
        except OSError:
            return False

    changed = []
    for key, old in snap.items():
        if len(key) == 1:
            if sys_modules.get(key[0]) is not old:
                changed.append(key[0])
            continue
        cur = vars(snap[(key[0],)]).get(key[1])
        if len(key) == 3 and key[2] == "__dict__":
            if isinstance(cur, type) and frozenset(vars(cur)) != old:
                now = vars(cur)
                odd = [
                    k for k in set(now) - old if (callable(now[k]) or hasattr(now[k], "__get__")) and not theirs(now[k])
                ]
                odd += ["-" + k for k in old - set(now)]
                if odd:
                    changed.append("%s.%s{%s}" % (key[0], key[1], ",".join(sorted(odd))))
            continue
        if len(key) == 3:
            cur = vars(cur).get(key[2]) if isinstance(cur, type) else None
        if isinstance(old, Data):
            same = old.same(cur)
            if not same:
                changed.append(".".join(key) + "=" + repr(cur)[:40])
            continue
        if isinstance(old, tuple):
            same = cur is old[0] and getattr(_func(cur), "__code__", None) is old[1]
        else:
            same = cur is old
        if not same and not (cur is not None and theirs(cur)):
            changed.append(".".join(key))
    return changed


def _where(func, repo):
    """`hook:relative/file.py` for code in the repository, `hook:<generated>` for code that
    claims no real file; None for anything else (pytest, installed plugins)."""
    code = getattr(func, "__code__", None) or getattr(func, "f_code", None)
    fn = code.co_filename if code else ""
    if fn.startswith(repo):
        return fn[len(repo) :] if not fn.endswith("/conftest.py") else None
    if code is not None and not fn.startswith("<frozen") and (fn.startswith("<") or not os.path.exists(fn)):
        return "<generated>"
    return None


def foreign_hooks(pm, repo, registered_from):
    """Every hook implementation that package code (not a conftest) registered:
    {"hook", "file", "object"}; `object` when the plugin is not a module (pytest registers
    the modules a conftest's `pytest_plugins` names; an object is registered by code)."""
    found = {}
    for name in dir(pm.hook):
        caller = getattr(pm.hook, name, None)
        if name.startswith("pytest_") and hasattr(caller, "get_hookimpls"):
            for impl in caller.get_hookimpls():
                where = _where(impl.function, repo)
                if where:
                    is_obj = type(impl.plugin).__name__ != "module"
                    found[(name, where)] = {
                        "hook": name,
                        "file": where,
                        "object": is_obj,
                        "registered_from": registered_from.get(id(impl.plugin), []),
                    }
    return [found[k] for k in sorted(found)]


def import_hooks(meta_path, path_hooks, repo):
    """Import finders/hooks defined in the repository or in generated code (they can rewrite
    test modules as pytest imports them)."""
    found = set()
    for hook in list(meta_path) + list(path_hooks):
        owner = hook if isinstance(hook, type) else type(hook)
        funcs = [hook] if hasattr(hook, "__code__") else []
        funcs += [getattr(owner, a, None) for a in ("find_spec", "find_module", "exec_module", "__call__", "__init__")]
        for func in funcs:
            where = _where(_func(func), repo) if func is not None else None
            if where:
                found.add("%s:%s" % (getattr(owner, "__name__", "?"), where))
    return sorted(found)


# Interpreter events through which code can change how tests run or are judged without
# replacing anything the snapshot holds: hooks that run on every call, code objects
# swapped or functions cloned around a test's code, the heap searched for the grader's
# objects, raw memory. Each is the agent's when the code that caused it is (`Watch.who`).
AUDITED = frozenset(
    {
        "sys.setprofile",
        "sys.settrace",
        "sys.addaudithook",
        "sys._current_frames",
        "function.__new__",
        "code.__new__",
        "object.__setattr__",
        "object.__delattr__",
        "compile",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    }
)
SWAPPED_ATTRS = frozenset({"__code__", "__class__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__"})
MACHINERY = ("_pytest", "pytest", "pluggy", "unittest")


class Watch:
    """Whose code did what, for the recorder: the repository files the agent changed or added
    (and any written during the run, and code that claims no real file) are the agent's.

    `install()` adds the audit hook (before any repository code runs; an audit hook can be
    neither listed nor removed from Python), whose findings (`events`) go out with the
    session's end record. `provenance(name, func)` says whether the function a test item
    runs can be the test file's own code, and leaves in `pending` the digests of that code
    for the supervisor to find in its fresh compile of the file (`FreshCompiles`)."""

    def __init__(self, repo, agent_files, test_files, started_ns, getframe):
        self.repo = repo
        self.agent = {repo + p for p in agent_files}
        self.tests = {repo + p for p in test_files}
        self.started_ns = started_ns
        self.getframe = getframe
        self.known = {}
        self.events = []
        self.busy = False
        self.pending = []  # (file, digest) of the code the last `provenance` vouched for, to be checked
        self.digest = code_digest  # bound before any repository code runs

    def is_agents(self, fn):
        """Is code from file `fn` the agent's (changed, added or written during the run, or generated)?"""
        r = self.known.get(fn)
        if r is None:
            if fn.startswith("<"):
                r = not fn.startswith("<frozen")
            elif fn in self.agent:
                r = True
            elif fn.startswith(self.repo) and fn not in self.tests:
                try:
                    r = os.stat(fn).st_ctime_ns >= self.started_ns
                except OSError:
                    r = True  # code from a file that is gone
            else:
                r = False
            self.known[fn] = r
        return r

    def who(self, frame):
        """The agent's file responsible for what `frame` is doing, or None: the innermost
        frame of the repository (or of generated code) decides; the standard library,
        installed packages and pytest in between are only the means."""
        f, depth = frame, 0
        while f is not None and depth < 200:
            fn = f.f_code.co_filename
            if fn.startswith("<") and not fn.startswith("<frozen"):
                origin = f.f_globals.get("__file__") or ""
                if not origin.startswith(self.repo) and origin:
                    f, depth = f.f_back, depth + 1
                    continue
                return fn if not origin or self.is_agents(origin) else None
            if fn.startswith(self.repo):
                return fn[len(self.repo) :] if self.is_agents(fn) else None
            f, depth = f.f_back, depth + 1
        return None

    def install(self):
        import sys as _sys

        _sys.addaudithook(self.audit)

    def audit(self, event, args):
        if self.busy or event not in AUDITED and not event.startswith("ctypes."):
            return
        self.busy = True
        try:
            if not self.relevant(event, args):
                return
            where = self.who(self.getframe(1))
            if where and len(self.events) < 50:
                self.events.append("%s:%s" % (event, where))
        except Exception:
            pass
        finally:
            self.busy = False

    def relevant(self, event, args):
        if event.startswith("ctypes."):  # raw memory, or the interpreter's own C API; not a library's ctypes use
            if event == "ctypes.dlsym":
                return len(args) > 1 and str(args[-1]).startswith(("Py", "_Py"))
            return event in ("ctypes.addressof", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at")
        if event in ("object.__setattr__", "object.__delattr__"):
            if args[1] not in SWAPPED_ATTRS:
                return False
            target = args[0]
            code = getattr(target, "__code__", None)
            if code is not None:  # a function: the agent's own are its business
                return not self.is_agents(code.co_filename)
            mod = getattr(type(target), "__module__", "") or ""
            return (
                getattr(target, "__file__", None) in self.tests
                or mod.split(".")[0] in MACHINERY
                or (isinstance(target, type) or mod in self.test_modules())
            )
        if event == "compile":  # code compiled under a test file's name
            return len(args) > 1 and args[1] in self.tests
        if event == "function.__new__":  # a test's code given other globals
            return getattr(args[0] if args else None, "co_filename", None) in self.tests
        if event == "code.__new__":  # code made to claim a test file's name
            return len(args) > 1 and args[1] in self.tests
        return True

    def test_modules(self):
        import sys as _sys

        return {n for n, m in list(_sys.modules.items()) if getattr(m, "__file__", None) in self.tests}

    def provenance(self, name, func, module=None):
        """ "own" when `func` (through its decorators' `__wrapped__`) is the code compiled from
        a file of the repository the agent did not write, named `name` (or defined in a
        function of the file, as a test factory makes them), and every wrapper around it is
        code the agent did not write; else what is wrong with it."""
        f, hops, wrappers = func, 0, []
        while hops < 32:
            hops += 1
            f = getattr(f, "__func__", f)
            if type(f).__name__ == "partial" and hasattr(f, "func"):
                f = f.func
                continue
            nxt = vars(f).get("__wrapped__") if hasattr(f, "__dict__") else None
            if nxt is None:
                break
            wrappers.append(f)
            f = nxt
        code = getattr(f, "__code__", None)
        if code is None:
            return "not_a_function"
        fn = code.co_filename
        if not fn.startswith(self.repo) or self.is_agents(fn):
            return "foreign_code"
        pending = [(fn[len(self.repo) :], self.digest(code))]  # the supervisor compares with its fresh compile
        if code.co_name != name and "<locals>" not in getattr(code, "co_qualname", ""):
            return "other_test_code"
        if (
            module is not None
            and fn == getattr(module, "__file__", None)
            and getattr(f, "__globals__", None) is not vars(module)
        ):
            return "foreign_globals"
        for w in wrappers:
            wc = getattr(_func(w), "__code__", None) or getattr(getattr(type(w), "__call__", None), "__code__", None)  # noqa: B004 - the class attribute, as Python calls it
            if wc is None or self.is_agents(wc.co_filename):
                return "foreign_wrapper"
            # A decorator's wrapper takes whatever the test takes and closes over what it wraps
            # (mock.patch, contextlib, hypothesis, override_settings): a library function given a
            # `__wrapped__` by someone else, which never calls the test, is neither.
            if not (wc.co_flags & 0x04 and wc.co_freevars):
                if not wc.co_filename.startswith(self.repo):
                    return "foreign_wrapper"
                pending.append((wc.co_filename[len(self.repo) :], self.digest(wc)))
        self.pending = pending
        return "own"

    def resolves(self, cls):
        """Is `cls` what its module holds under its qualified name (a class whose
        `__module__`/`__qualname__` claim another's place does not)? Classes made inside
        functions (`<locals>`) are not checked."""
        import sys as _sys

        qual = getattr(cls, "__qualname__", "")
        mod = _sys.modules.get(getattr(cls, "__module__", ""))
        if "<locals>" in qual or mod is None or getattr(mod, "__file__", None) not in self.tests:
            return True
        obj = mod
        for part in qual.split("."):
            obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        return obj is cls

    def machinery(self, cls, inst=None):
        """Test-machinery methods of a test's classes that are the agent's code put in place
        from elsewhere (`SimpleTestCase.subTest = …`, a result hook): code whose file is the
        agent's and which was not written in that class's own body in its own module."""
        import sys as _sys

        bad = []
        for klass in cls.__mro__:
            own_file = getattr(_sys.modules.get(klass.__module__), "__file__", None)
            for name, val in list(vars(klass).items()):
                f, hops = _func(val), 0
                while hops < 8 and isinstance(getattr(f, "__dict__", None), dict) and "__wrapped__" in vars(f):
                    f, hops = vars(f)["__wrapped__"], hops + 1  # through decorators (contextmanager, wraps)
                code = getattr(_func(f), "__code__", None)
                if code is None or not self.is_agents(code.co_filename):
                    continue
                body = code.co_filename == own_file and getattr(code, "co_qualname", "").startswith(
                    klass.__qualname__ + "."
                )
                if not body:
                    bad.append("%s.%s" % (klass.__name__, name))
        for name, val in list(vars(inst).items()) if inst is not None else ():
            code = getattr(_func(val), "__code__", None)
            if code is not None and callable(val) and self.is_agents(code.co_filename):
                bad.append("instance.%s" % name)
        return bad[:10]

    def module_state(self, module, path):
        """ "ok" when `module` is the plain module object executed from the test file `path`."""
        import sys as _sys
        import types as _types

        if type(module) is not _types.ModuleType:
            return "module_class_replaced"
        if _sys.modules.get(module.__name__) is not module:
            return "module_replaced"
        file = vars(module).get("__file__") or ""
        if os.path.realpath(file) != os.path.realpath(path):
            return "module_file_mismatch"
        for hook in ("__getattr__", "__dir__"):
            h = vars(module).get(hook)
            if h is not None and os.path.realpath(getattr(getattr(h, "__code__", None), "co_filename", "")) != file:
                return "module_hook"
        return "ok"

    def probe(self, value):
        """`value`, noting an equality forgery: an object whose `__eq__` (or `__ne__`) is the
        agent's code and which claims to equal a fresh object of a class nobody has seen (an
        honest `__eq__` never does: "always equal" return values make `assert f(x) == y` pass
        with the bug still there)."""
        t = type(value)
        if t in _PLAIN:
            return value
        try:
            for name, lie in (("__eq__", True), ("__ne__", False)):
                code = getattr(getattr(t, name, None), "__code__", None)
                if code is not None and self.is_agents(code.co_filename):
                    if bool(value == _Nobody()) if lie else not (value != _Nobody()):
                        where = code.co_filename
                        note = "equality_forged:%s" % (
                            where[len(self.repo) :] if where.startswith(self.repo) else where
                        )
                        if note not in self.events and len(self.events) < 50:
                            self.events.append(note)
                        break
        except Exception:
            pass
        return value

    def hooks_now(self, threading_mod):
        """The interpreter-wide hooks active right now that are the agent's code."""
        import sys as _sys

        out = []
        for kind, hook in (
            ("profile", _sys.getprofile()),
            ("trace", _sys.gettrace()),
            ("thread_profile", getattr(threading_mod, "_profile_hook", None)),
            ("thread_trace", getattr(threading_mod, "_trace_hook", None)),
        ):
            if hook is None:
                continue
            target = hook if hasattr(hook, "__code__") else getattr(type(hook), "__call__", None)  # noqa: B004
            code = getattr(_func(target), "__code__", None)
            fn = code.co_filename if code is not None else "<unknown>"
            out.append("%s:%s" % (kind, fn[len(self.repo) :] if fn.startswith(self.repo) else fn))
        return out


def code_digest(code):
    """A digest of everything code equality compares (bytecode, constants with nested code,
    names, line table, flags, counts): equal code objects, and only those, share it. The
    test process sends it; the supervisor compares it with its own fresh compile."""
    h = hashlib.sha256()
    todo = [code]
    while todo:
        c = todo.pop()
        if c is None:
            h.update(b"\x02")
            continue
        h.update(
            repr(
                (
                    c.co_name,
                    c.co_firstlineno,
                    c.co_argcount,
                    c.co_posonlyargcount,
                    c.co_kwonlyargcount,
                    c.co_flags,
                    c.co_names,
                    c.co_varnames,
                    c.co_freevars,
                    c.co_cellvars,
                )
            ).encode()
        )
        h.update(c.co_code)
        h.update(getattr(c, "co_linetable", b"") or b"")
        h.update(getattr(c, "co_exceptiontable", b"") or b"")
        todo.append(None)
        for k in reversed(c.co_consts):
            if hasattr(k, "co_code"):
                todo.append(k)
            else:
                h.update(repr((type(k).__name__, k)).encode() + b"\x01")
    return h.hexdigest()[:32]


def fresh_digests(path, transforms):
    """Digests of every code object in fresh compiles of `path`, one per transform of its AST
    (None: plain). Run by the supervisor, which the test process cannot reach."""
    import ast
    import types

    out = set()
    if not transforms:
        return out
    try:
        with open(path, "rb") as f:
            src = f.read()
    except OSError:
        return out
    for transform in transforms:
        try:
            tree = ast.parse(src, path)
            if transform is not None:
                tree = transform(tree, src, path)
            todo = [compile(tree, path, "exec", dont_inherit=True)]
        except Exception:
            continue
        while todo:
            c = todo.pop()
            out.add(code_digest(c))
            todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


class FreshCompiles:
    """The supervisor's fresh compiles of the task's test files, made on a thread while the
    tests run (two cores are two cores), and the check of what the records claim."""

    def __init__(self, repo, files, transforms, likely=None):
        import threading

        self.repo, self.transforms, self.digests = repo, transforms, {}
        self.likely = likely or (lambda rel: transforms)  # the compile a file most likely had, first
        self.thread = threading.Thread(target=self._run, args=(list(files),), daemon=True)
        self.thread.start()

    def _run(self, files):
        for rel in files:
            if rel.endswith(".py") and not rel.endswith("conftest.py"):
                self.digests[rel] = fresh_digests(self.repo + rel, self.likely(rel))

    def verify(self, records):
        """A record whose claimed code is not in its file's fresh compile is `foreign_code`."""
        self.thread.join()
        for r in records:
            x = r.get("x") if isinstance(r, dict) else None
            if not isinstance(x, dict) or not x.get("code"):
                continue
            for item in x.pop("code"):
                rel, digest = (list(item) + [None, None])[:2]
                if not isinstance(rel, str) or ".." in rel.split("/") or rel.startswith("/"):
                    x["own"] = "foreign_code"
                    break
                if rel not in self.digests:
                    self.digests[rel] = fresh_digests(self.repo + rel, self.likely(rel))
                if digest not in self.digests[rel]:  # then the other ways it could have been compiled
                    rest = [t for t in self.transforms if t not in self.likely(rel)]
                    self.digests[rel] |= fresh_digests(self.repo + rel, rest)
                if digest not in self.digests[rel]:
                    x["own"] = "foreign_code"
                    break


def pytest_transforms(pass_hook=False):
    """How the test process compiles a test module: plain, or probed and rewritten by pytest."""
    from _pytest.assertion.rewrite import rewrite_asserts

    class _Config:
        def getini(self, name):
            return pass_hook if name == "enable_assertion_pass_hook" else None

    def rewritten(tree, src, path):
        tree = probe_comparisons(tree)
        rewrite_asserts(tree, src, path, _Config())
        return tree

    return [None, rewritten]


def pytest_likely(transforms):
    """pytest rewrites the modules it collects as tests (`test_*.py`, `*_test.py`), not others."""

    def likely(rel):
        base = rel.rsplit("/", 1)[-1]
        return transforms[1:] if base.startswith("test_") or base.endswith("_test.py") else transforms[:1]

    return likely


class _Nobody:
    """A fresh object of a class no code under test knows: nothing honest equals it."""

    __slots__ = ()


_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset})


def probe_comparisons(tree):
    """Wrap each operand of `==`/`!=` in a test module's code in `__lg_probe__(...)` (a builtin the
    recorder adds), so every value a test compares is checked by `Watch.probe`; the
    comparison's result and pytest's explanations of a failing assert are unchanged."""
    import ast

    class _T(ast.NodeTransformer):
        def visit_Compare(self, node):
            self.generic_visit(node)
            if any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                wrap = lambda e: ast.copy_location(  # noqa: E731
                    ast.Call(func=ast.Name(id="__lg_probe__", ctx=ast.Load()), args=[e], keywords=[]), e
                )
                node.left = wrap(node.left)
                node.comparators = [wrap(c) for c in node.comparators]
            return node

    tree = _T().visit(tree)
    ast.fix_missing_locations(tree)
    return tree


def probe_assert_equal(case_cls, watch):
    """unittest's equality assertions check their operands with `watch.probe` first."""
    for name in ("assertEqual", "assertNotEqual"):
        real = vars(case_cls)[name]

        def checked(self, first, second, *a, _real=real, **kw):
            watch.probe(first)
            watch.probe(second)
            return _real(self, first, second, *a, **kw)

        checked.__name__ = checked.__qualname__ = name
        setattr(case_cls, name, checked)


def origin_of(exc, watch, test_file):
    """Where a skip or xfail was raised: "test" (the test file, a conftest, the task's test
    files), "agent" (code the agent wrote) or "package" (other repository code, a library)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        mod = tb.tb_frame.f_globals.get("__name__", "") or ""
        if mod.split(".")[0] not in MACHINERY:
            last = fn
        tb = tb.tb_next
    if last is None:
        return "package"
    if last == test_file or last in watch.tests or last.endswith("/conftest.py"):
        return "test"
    if last.startswith("<") or watch.is_agents(last):
        return "agent"
    return "package"


def digests(paths):
    """{path: (sha256, inode, ctime)} of the files that exist (the task's test modules and
    their conftests, before and after). ctime shows a write even when the content was put
    back afterwards (rewritten for the import, restored before the end)."""
    out = {}
    for p in paths:
        try:
            with open(p, "rb") as f:
                st = os.fstat(f.fileno())
                out[p] = (hashlib.sha256(f.read()).hexdigest(), st.st_ino, st.st_ctime_ns)
        except OSError:
            out[p] = None
    return out


def child(cfg, key, rec_w, junit_w, log_fd, go_r):
    """Run pytest with the recorder once the supervisor says go; never returns.

    Importing pytest and taking the snapshot overlap with the supervisor planting the
    canaries and hashing the test files (two cores are two cores). Every step up to the
    go is done before any repository code can run: the repository is not on `sys.path`."""
    _exit = os._exit  # bound before the repository can replace it
    started_ns = time.time_ns()
    _child_stdio(log_fd)
    import_pytest()  # imported while the repository is not yet on sys.path
    import unittest.case

    import _pytest.outcomes
    import _pytest.python
    import pytest

    repo = cfg["repo"].rstrip("/") + "/"
    watch = Watch(repo, cfg.get("agent_files", []), cfg.get("test_files", []), started_ns, sys._getframe)
    probe_rewrites(watch)
    kind_of = kinds(_pytest.outcomes.Skipped, _pytest.outcomes.XFailed, unittest.case.SkipTest)
    extras = {}  # nodeid -> what the recorder saw besides outcomes (provenance, skip origin, markers)
    current = [None]  # the item whose call phase is running
    box = [None]  # the recorder, once made (the test-call observers write its phases)
    innermost, call_test_method = test_observers(watch, extras, current, box, kind_of)
    unittest.case.TestCase._callTestMethod = call_test_method
    probe_assert_equal(unittest.case.TestCase, watch)
    snap = snapshot(sys.modules)
    watch.install()  # after the snapshot, before any repository code
    send = sender(key, rec_w)
    ctx = {
        "pytest": pytest,
        "repo": repo,
        "watch": watch,
        "extras": extras,
        "current": current,
        "innermost": innermost,
        "kind_of": kind_of,
        "send": send,
        "gettrace": sys.gettrace,
        "function_cls": _pytest.python.Function,
    }
    recorder, own_changes = make_recorder(ctx, lambda: changed_since(snap, sys.modules, repo, started_ns))
    box[0] = recorder
    if os.read(go_r, 1) != b"1":  # the supervisor could not prepare the run
        _exit(SETUP_FAILED)
    os.close(go_r)
    sys.path.append(repo[:-1])
    args = list(cfg["args"]) + ["--junitxml=/proc/self/fd/%d" % junit_w]
    cfg.clear()
    try:
        code = int(pytest.main(args, plugins=[recorder]))
    except BaseException:  # raised by the code under test; the records decide what happened
        import traceback

        traceback.print_exc()
        code = 3
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _exit(code)


def _child_stdio(log_fd):
    """The child's stdout and stderr go to the log file, its stdin is /dev/null."""
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.dont_write_bytecode = True


def import_pytest():
    """pytest, its default plugins and what the recorder watches, imported (and so in the
    snapshot) before the repository is importable."""
    import importlib

    import _pytest.assertion.rewrite  # noqa: F401
    import _pytest.config
    import _pytest.outcomes  # noqa: F401
    import _pytest.python  # noqa: F401
    import pytest  # noqa: F401

    for plugin in _pytest.config.default_plugins:
        try:
            importlib.import_module("_pytest." + plugin)
        except ImportError:
            pass
    import builtins  # noqa: F401
    import threading  # noqa: F401
    import unittest.case  # noqa: F401


def probe_rewrites(watch):
    """pytest's assertion rewrite, after every operand of == / != is routed through the probe
    (`probe_comparisons`), and the probe as the builtin those calls name."""
    import builtins

    import _pytest.assertion.rewrite as assert_rewrite

    pytest_rewrite = assert_rewrite.rewrite_asserts

    def rewrite_asserts(mod, source, module_path=None, config=None):
        return pytest_rewrite(probe_comparisons(mod), source, module_path, config)

    assert_rewrite.rewrite_asserts = rewrite_asserts
    builtins.__lg_probe__ = watch.probe


def kinds(skipped_exc, xfailed_exc, skip_test):
    """`kind_of(exc)`: what a raised exception (None: none) means for a test phase."""

    def kind_of(exc):
        if exc is None:
            return "passed"
        if isinstance(exc, skipped_exc) or isinstance(exc, skip_test):
            return "skipped"
        if isinstance(exc, xfailed_exc):
            return "xfailed"
        return "failed"

    return kind_of


def test_observers(watch, extras, current, box, kind_of):
    """(innermost, `_callTestMethod`): the observers at the innermost call of a test, for
    functions (called by the recorder's `pytest_pyfunc_call`) and unittest methods."""
    import unittest.case

    tc_call = unittest.case.TestCase._callTestMethod

    def _callTestMethod(self, method):
        # unittest items under pytest: the innermost call of the test method, as for functions
        item = current[0]
        if item is None:
            return tc_call(self, method)
        x = extras.setdefault(item.nodeid, {})
        x["own"] = watch.provenance(
            getattr(self, "_testMethodName", ""), method, sys.modules.get(type(self).__module__)
        )
        if x["own"] == "own":
            x["code"] = watch.pending
        box[0].inner.add(item.nodeid)
        return innermost(item, x, tc_call, self, method)

    def innermost(item, x, call, /, *args, **kwargs):
        # The test's own call, as it returns or raises: the outcome the verdict rests on, and
        # where a skip or xfail came from (the only place both kinds of item are seen)
        try:
            r = call(*args, **kwargs)
        except BaseException as exc:
            kind = kind_of(exc)
            box[0].phases.setdefault(item.nodeid, {})["inner"] = kind
            if kind != "failed":
                x["origin"] = origin_of(exc, watch, str(item.path))
            raise
        box[0].phases.setdefault(item.nodeid, {})["inner"] = "passed"
        return r

    return innermost, _callTestMethod


def sender(key, rec_w):
    """`send(kind, **fields)`: one HMAC-tagged record down the record pipe. Records go out in
    batches (each write wakes the supervisor: ~0.1 ms), and at the session's end; a run that
    dies before then has no report to contradict anyway."""
    write, dumps, mac_of = os.write, json.dumps, hmac.digest
    seq = [0]
    pending = []
    encode_str = json.encoder.encode_basestring_ascii  # a test record by hand: ~3x faster than dumps
    flag = {True: "true", False: "false"}

    def encode(kind, fields):
        if kind != "test":
            return dumps(dict(fields, k=kind, n=seq[0]))
        ph = ",".join('"%s":"%s"' % kv for kv in fields["phases"].items())
        return (
            '{"k":"test","n":%d,"id":%s,"phases":{%s},"function":%s,"unit":%s,"inner":%s,"xfail":%s,"runtest":%s,"x":%s}'
            % (
                seq[0],
                encode_str(fields["id"]),
                ph,
                flag[fields["function"]],
                flag[fields["unit"]],
                flag[fields["inner"]],
                flag[bool(fields["xfail"])],
                flag[fields["runtest"]],
                dumps(fields["x"]) if fields["x"] else "{}",
            )
        )

    def send(kind, **fields):
        seq[0] += 1
        body = encode(kind, fields)
        pending.append(mac_of(key, body.encode(), "sha256").hex() + " " + body + "\n")
        if len(pending) >= 64 or kind == "end":
            data = "".join(pending).encode()
            del pending[:]
            while data:
                data = data[write(rec_w, data) :]

    return send


RECORDER_STATE = (
    "phases",
    "inner",
    "registered_from",
    "tracer",
    "tracers",
    "declared",
    "modules",
    "hooks",
    "pass_hook",
)


def make_recorder(ctx, machinery_changed):
    """(the recorder plugin, `own_changes()`): its hooks come from four classes, one per
    part of a run; `own_changes` lists any of their methods replaced or added since, and any
    attribute of the recorder that is none of its own (`RECORDER_STATE`)."""
    _Recorder = type(
        "_Recorder",
        (
            collection_hooks(ctx),
            call_hook(ctx),
            phase_hooks(ctx),
            end_hook(ctx, lambda: machinery_changed() + own_changes()),
        ),
        {"__init__": _recorder_init},
    )
    classes = _Recorder.__mro__[:-1]
    own = {(c, k): (v, getattr(_func(v), "__code__", None)) for c in classes for k, v in vars(c).items()}
    recorder = _Recorder()

    def own_changes():
        bad = []
        for c in classes:
            now = vars(c)
            bad += [
                k
                for (cls, k), (v, code) in own.items()
                if cls is c and (now.get(k) is not v or getattr(_func(now.get(k)), "__code__", None) is not code)
            ]
            bad += [k for k in now if (c, k) not in own]
        if type(recorder) is not _Recorder or _Recorder.__mro__[:-1] != classes:
            bad.append("__class__")
        bad += [k for k in vars(recorder) if k not in RECORDER_STATE]
        return ["recorder." + k for k in sorted(set(bad))]

    return recorder, own_changes


def _recorder_init(self):
    self.phases = {}
    self.inner = set()
    self.registered_from = {}
    self.tracer, self.tracers = None, set()
    self.declared = {}  # nodeid -> skip/xfail markers it had when collection ended
    self.modules = {}  # id(test module) -> its state
    self.hooks = set()


def collection_hooks(ctx):
    """The recorder's view of configuration and collection: the assertion pass hook, the
    skip/xfail markers each test had when collection ended, who registered each plugin."""
    pytest, repo = ctx["pytest"], ctx["repo"]

    class _Collection:
        def pytest_configure(self, config):
            self.pass_hook = bool(config.getini("enable_assertion_pass_hook"))

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_collection_modifyitems(self, session, config, items):
            yield
            for item in items:
                n = sum(1 for m in item.iter_markers() if m.name in ("skip", "skipif", "xfail"))
                if n:
                    self.declared[item.nodeid] = n

        def pytest_plugin_registered(self, plugin, manager):
            # Who registers a plugin: pytest for the task's conftests and `pytest_plugins`,
            # or package code, whose frame is then on the stack (generated code included).
            files, f = set(), sys._getframe(1)
            while f is not None:
                where = _where(f, repo)
                if where:
                    files.add(where)
                f = f.f_back
            if files:
                self.registered_from[id(plugin)] = sorted(files)

    return _Collection


def call_hook(ctx):
    """The recorder's innermost observation of a test function: `pytest_pyfunc_call`."""
    import threading

    pytest, repo, watch, extras = ctx["pytest"], ctx["repo"], ctx["watch"], ctx["extras"]
    innermost, gettrace = ctx["innermost"], ctx["gettrace"]

    class _Call:
        @pytest.hookimpl(tryfirst=True)
        def pytest_pyfunc_call(self, pyfuncitem):
            # The innermost observation: the test function itself, nothing in between.
            func = pyfuncitem.obj
            names = pyfuncitem._fixtureinfo.argnames
            args = {a: pyfuncitem.funcargs[a] for a in names}
            if hasattr(func, "__code__") and func.__code__.co_flags & 0x180:  # coroutine / async generator
                self.inner.add(pyfuncitem.nodeid)  # an async plugin of the task runs it
                self.phases.setdefault(pyfuncitem.nodeid, {})["inner"] = "deferred"
                return None
            self.inner.add(pyfuncitem.nodeid)
            x = extras.setdefault(pyfuncitem.nodeid, {})
            mod = getattr(pyfuncitem, "module", None)
            state = self.modules.get(id(mod))
            if state is None:
                state = self.modules[id(mod)] = watch.module_state(mod, str(pyfuncitem.path))
            own = watch.provenance(pyfuncitem.originalname, func, mod)
            x["own"] = own if state == "ok" else state
            if own == "own":
                x["code"] = watch.pending
            for h in watch.hooks_now(threading):
                self.hooks.add(h)
            tracer = gettrace()  # a tracer already active can skip a test's lines (its asserts)
            if tracer is not None and tracer is not self.tracer:
                self.tracer = tracer
                target = tracer if hasattr(tracer, "__code__") else getattr(type(tracer), "__call__", None)  # noqa: B004 - the class attribute, as Python calls it
                where = _where(_func(target), repo)
                self.tracers.add(
                    where or "%s.%s" % (getattr(tracer, "__module__", "?"), getattr(tracer, "__qualname__", "?"))
                )
            result = innermost(pyfuncitem, x, func, **args)
            if hasattr(result, "__await__") or hasattr(result, "__aiter__"):
                self.phases[pyfuncitem.nodeid]["inner"] = "skipped"
                pytest.skip("async def function and no async plugin installed")
            return True

    return _Call


def phase_hooks(ctx):
    """The recorder's view of each phase (set-up, call, tear-down) from its hook wrapper,
    and the test's record, sent at the end of its tear-down."""
    import threading

    pytest, watch, extras, current = ctx["pytest"], ctx["watch"], ctx["extras"], ctx["current"]
    kind_of, send, function_cls = ctx["kind_of"], ctx["send"], ctx["function_cls"]

    class _Phases:
        def _phase(self, item, when, outcome):
            exc = outcome.excinfo[1] if outcome.excinfo else None
            pending = getattr(item, "_excinfo", None)  # unittest items keep failures here
            if when == "call" and exc is None and pending:
                exc = pending[0].value
            self.phases.setdefault(item.nodeid, {})[when] = kind_of(exc)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            outcome = yield
            self._phase(item, "setup", outcome)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            current[0] = item
            try:
                outcome = yield
            finally:
                current[0] = None
            self._phase(item, "call", outcome)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item, nextitem):
            outcome = yield
            self._phase(item, "teardown", outcome)
            ph = self.phases.pop(item.nodeid, {})
            x = extras.pop(item.nodeid, None) or {}
            if any(v != "passed" for v in ph.values()):  # a marker added while it ran (asked only then)
                now = sum(1 for m in item.iter_markers() if m.name in ("skip", "skipif", "xfail"))
                if now > self.declared.get(item.nodeid, 0):
                    x["late_marker"] = True
                if self.declared.get(item.nodeid):
                    x["declared"] = True
                for h in watch.hooks_now(threading):
                    self.hooks.add(h)
            send(
                "test",
                id=item.nodeid,
                phases=ph,
                function=type(item) is function_cls,
                unit=type(item).__name__ == "TestCaseFunction",
                x=x,
                inner=item.nodeid in self.inner,
                # as pytest's skipping plugin sees them (the task's conftests may add some;
                # markers added by the agent's own hooks are caught as agent_hooks); only
                # asked when it matters, a test that raised (the walk costs ~10 µs a test)
                xfail="failed" in ph.values() and any(True for _ in item.iter_markers("xfail")),
                runtest=("runtest" in vars(item)),
            )

    return _Phases


def end_hook(ctx, changed):
    """The session's end record: what changed of the machinery (`changed()`), the package's
    hooks, import hooks, tracers and interpreter hooks, and the audit hook's events."""
    import threading

    pytest, repo, watch, send = ctx["pytest"], ctx["repo"], ctx["watch"], ctx["send"]

    class _End:
        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_sessionfinish(self, session, exitstatus):
            yield
            send(
                "end",
                changed=changed(),
                foreign_hooks=foreign_hooks(session.config.pluginmanager, repo, self.registered_from),
                import_hooks=import_hooks(sys.meta_path, sys.path_hooks, repo),
                tracers=sorted(self.tracers),
                hooks=sorted(self.hooks | set(watch.hooks_now(threading))),
                events=list(watch.events),
                pass_hook=getattr(self, "pass_hook", False),
                exitstatus=int(exitstatus),
            )

    return _End


def _undumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def _orphans(me):
    """Our children other than the test child: with this process a child subreaper, every
    descendant the test run left behind (setsid or not) is re-parented here."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] != b"Z":
            out.append(int(p))
    return out


def kill_strays(me):
    """SIGKILL the processes the test run left behind (detached daemons of the code under
    test), before the report is written out, and reap them; how many. Only descendants:
    this also runs on a host (task generation), where other processes are none of ours."""
    killed = set()
    for _ in range(50):  # a stray may fork while we kill; its children come to us in turn
        new = [p for p in _orphans(me) if p not in killed]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, 9)
            except OSError:
                pass
            killed.add(p)
        time.sleep(0.002)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
    return len(killed)


def _subreaper():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def collect(pid, fds):
    """Read the pipes `fds` until the child `pid` has exited and their writers are done: at
    most GRACE_S after its exit, then every stray it left is killed and what they held open
    is drained. Returns (the child's wait status, strays killed, bytes read per fd, pipes still
    open after its exit: held by strays)."""
    bufs = {fd: bytearray() for fd in fds}
    status, deadline, strays = None, None, 0
    open_fds = set(bufs)
    while open_fds:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status, deadline = st, time.monotonic() + GRACE_S
                strays = kill_strays(os.getpid())
        if deadline is not None and time.monotonic() > deadline:
            break
        ready, _, _ = select.select(list(open_fds), [], [], 0.05)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
    if status is None:
        _, status = os.waitpid(pid, 0)
        strays = kill_strays(os.getpid())
    for fd in list(open_fds):  # whatever a killed stray held open is closed now
        os.set_blocking(fd, False)
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                bufs[fd] += chunk
        except BlockingIOError:
            pass
    return status, strays, bufs, len(open_fds)


def verified_records(data, key):
    """The JSON records of the record pipe whose HMAC tag checks, and how many did not: the
    child cannot forge one (it never learns the key)."""
    records, bad = [], 0
    for line in data.split(b"\n"):
        if not line:
            continue
        mac, _, body = line.partition(b" ")
        if not hmac.compare_digest(mac, hmac.digest(key, body, "sha256").hex().encode()):
            bad += 1
            continue
        records.append(json.loads(body))
    return records, bad


def main():
    cfg_path = sys.argv[1]
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(cfg_path)
    nonce, key = cfg.pop("nonce"), bytes.fromhex(cfg.pop("key"))
    spec = cfg.pop("plant")
    wanted = set(cfg.pop("wanted", None) or ())  # the task's tests: only theirs go in the summary
    rec_r, rec_w = os.pipe()
    junit_r, junit_w = os.pipe()
    go_r, go_w = os.pipe()
    log_fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # pytest is imported once, here, before the fork (the repository is not on sys.path: `-I`,
    # and its directory is added by the child only): the child inherits it, and this process
    # needs its assertion rewriter for the fresh compiles it checks the test code against
    sys.dont_write_bytecode = True
    import _pytest.assertion.rewrite  # noqa: F401
    import pytest  # noqa: F401

    pid = os.fork()
    if pid == 0:
        try:
            nonce = wanted = None  # noqa: F841  (the child must learn neither the tag nor the task's tests)
            for fd in (rec_r, junit_r, go_w):
                os.close(fd)
            child(cfg, key, rec_w, junit_w, log_fd, go_r)
        finally:
            os._exit(3)
    for fd in (rec_w, junit_w, log_fd, go_r):
        os.close(fd)
    # While the child imports pytest: become the reaper of whatever the run leaves behind,
    # non-dumpable (the child cannot open this process's fds or memory: the summary's
    # tag), plant the canaries, hash the test files; then let the child run the tests.
    _subreaper()
    _undumpable()
    guard = [cfg["repo"].rstrip("/") + "/" + p for p in cfg.get("guard", [])]
    canaries = plant_or_stop(pid, spec)
    guarded = digests(guard)
    os.write(go_w, b"1")
    os.close(go_w)
    root = cfg["repo"].rstrip("/") + "/"
    transforms = pytest_transforms()
    fresh = FreshCompiles(root, cfg.get("guard", []), transforms, pytest_likely(transforms))
    status, strays, bufs, still_open = collect(pid, (rec_r, junit_r))
    after = digests(guard)
    tests_changed = sorted(p[len(root) :] for p in guard if after[p] != guarded[p])
    records, bad = verified_records(bytes(bufs[rec_r]), key)
    if any(r.get("k") == "end" and r.get("pass_hook") for r in records):  # the repository's ini asks for it
        transforms = pytest_transforms(pass_hook=True)
        fresh = FreshCompiles(root, cfg.get("guard", []), transforms, pytest_likely(transforms))
    records, neighbours = kept_records(records, wanted, canaries)
    fresh.verify(records)
    junit = bytes(bufs[junit_r])
    if junit:
        with open(cfg["junit"], "wb") as f:
            f.write(junit)
    summary = {
        "exit": os.waitstatus_to_exitcode(status),
        "records": records,
        "bad_records": bad,
        "junit_sha256": hashlib.sha256(junit).hexdigest() if junit else None,
        "open_after_exit": still_open,
        "stray_processes": strays,
        "canaries": canaries,
        "neighbours": neighbours,
        "tests_changed": tests_changed,
    }
    report(cfg["log"], nonce, summary)


def plant_or_stop(pid, spec):
    """The canaries planted (their ids), or the child killed and the run stopped as not prepared."""
    try:
        return plant(spec) if spec else None
    except (LookupError, OSError, UnicodeDecodeError) as exc:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.stderr.write("legorl-supervisor: %s\n" % exc)
        os._exit(SETUP_FAILED)


def kept_records(records, wanted, canaries):
    """(records, neighbours): with the task's tests known, only their records and the canaries'
    are kept (a run may have thousands of tests), and how the canaries' neighbours fared."""
    if not (wanted and canaries):
        return records, None
    host = canaries["pass"].split("::", 1)[0] + "::"
    keep = wanted | {canaries["pass"], canaries["fail"], *canaries.get("more_fail", [])}
    near = [r for r in records if r.get("k") == "test" and r["id"].startswith(host) and r["id"] not in keep]
    neighbours = {"ran": len(near), "set_up": sum((r.get("phases") or {}).get("setup") == "passed" for r in near)}
    return [r for r in records if r.get("k") != "test" or r["id"] in keep], neighbours


def report(log_path, nonce, summary):
    """The tail of the child's output on stderr (evidence only), the one tagged summary line
    on stdout, and the child's exit status as ours; never returns."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4000))
            sys.stderr.write(f.read().decode("utf-8", "replace"))
        sys.stderr.flush()
    except OSError:
        pass
    sys.stdout.write("\n%s %s\n" % (nonce, json.dumps(summary, sort_keys=True)))
    sys.stdout.flush()
    code = summary["exit"]
    os._exit(code if 0 <= code < 256 else 128 + (-code % 128))


if __name__ == "__main__":
    main()

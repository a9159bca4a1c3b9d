"""What the test run's machinery was before the repository became importable, and what of it
the code under test changed: the snapshot of pytest's, pluggy's and unittest's functions,
classes and data values (`snapshot`, `changed_since`), the hooks and import hooks package code
put in place (`foreign_hooks`, `import_hooks`), and digests of the task's test files.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import hashlib
import os

# The supervisor's own modules: watched like pytest's (replacing one of their functions
# changes what the recorder does), and named so that no task's module shadows them.
SUPERVISOR_MODULES = (
    "lg_canaries",
    "lg_compiles",
    "lg_names",
    "lg_native_recorder",
    "lg_origin",
    "lg_probes",
    "lg_recorder",
    "lg_snapshot",
    "lg_supervise",
    "lg_values",
    "lg_watch",
    "lg_writes",
)
WATCH_PREFIXES = ("_pytest.", "pluggy.")
WATCH_MODULES = (
    "pytest",
    "_pytest",
    "pluggy",
    "unittest.case",
    "unittest.result",
    "xml.etree.ElementTree",
    "__main__",  # the supervisor's main and its modules: their helpers are what the recorder calls
) + SUPERVISOR_MODULES
# Single functions of other modules that only a forger replaces (tests' monkeypatches are undone by then).
WATCH_ATTRS = {
    "os": ("_exit", "write", "open"),
    "sys": ("exit", "settrace", "gettrace", "setprofile", "getprofile", "addaudithook", "_getframe"),
    "threading": ("settrace", "setprofile", "_start_new_thread", "_start_joinable_thread"),
    "_thread": ("start_new_thread", "start_joinable_thread"),
    "atexit": ("register",),
    "builtins": ("open", "__import__", "__lg_probe__"),
}


def snapshot(sys_modules, modules=WATCH_MODULES, attrs=WATCH_ATTRS):
    """{(module, name[, member]): object} for pytest's machinery, taken before the repository is importable.

    Every function and class a watched module holds is kept by identity (and functions by
    code object too); classes defined there also by the set of their attributes and each
    method's identity and code, so adding a property to `TestReport` shows as well as
    replacing `TestReport.from_item_and_call` or `_pytest.runner.TestReport`. `modules` and
    `attrs` name what is watched (the native main adds unittest's runner and `exec`).
    """
    snap = {}
    for name in sorted(sys_modules):
        if not (name in modules or name.startswith(WATCH_PREFIXES)):
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
                    func = func_of(mval)
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
    for name, names in attrs.items():
        mod = sys_modules.get(name)
        if mod is not None:
            snap[(name,)] = mod
            for attr in names:
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


def func_of(obj):
    """The function behind a method, static/class method or property."""
    return getattr(obj, "__func__", None) or getattr(obj, "fget", None) or obj


def changed_since(snap, sys_modules, repo, started_ns, origins=None):
    """What of the snapshot is no longer what it was (replaced, re-coded, added to a class).

    pytest and the task's installed plugins patch some of pytest's classes while they
    configure (`legacypath` adds `fspath` properties, …). A new value is theirs when its
    code lives outside the repository in a file that existed before this run (ctime: a
    file the code under test wrote during the run, to import it from there, is newer, and
    ctime cannot be set back), and, with `origins`, that is code compiled from that file and
    run in its module (`lg_origin`: not run-time code that claims the file's name), or a class
    whose own functions all are; plain data added to a class is ignored."""

    def theirs(obj):
        func = func_of(obj)
        code = getattr(func, "__code__", None)
        if code is not None:
            fn = code.co_filename
            if origins is not None and origins.func_agents(func):
                return False  # run-time code under that file's name, or run in another namespace
        elif isinstance(obj, type):
            fn = getattr(sys_modules.get(obj.__module__), "__file__", None) or ""
            if origins is not None:  # a class is its functions': all from that file, and some
                funcs = [f for f in map(func_of, list(vars(obj).values())) if hasattr(f, "__code__")]
                if not funcs or any(origins.func_agents(f) for f in funcs):
                    return False
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
            same = cur is old[0] and getattr(func_of(cur), "__code__", None) is old[1]
        else:
            same = cur is old
        if not same and not (cur is not None and theirs(cur)):
            changed.append(".".join(key))
    return changed


def place_of(func, repo, origins=None):
    """`hook:relative/file.py` for code in the repository, `hook:<generated>` for code that
    claims no real file, or (with `origins`) one it was not compiled from; None for anything
    else (pytest, installed plugins)."""
    code = getattr(func, "__code__", None) or getattr(func, "f_code", None)
    fn = code.co_filename if code else ""
    if code is not None and origins is not None and not fn.startswith(repo) and origins.agents(code):
        return "<generated>"
    if fn.startswith(repo):
        return fn[len(repo) :] if not fn.endswith("/conftest.py") else None
    if code is not None and not fn.startswith("<frozen") and (fn.startswith("<") or not os.path.exists(fn)):
        return "<generated>"
    return None


def foreign_hooks(pm, repo, registered_from, origins=None):
    """Every hook implementation that package code (not a conftest) registered:
    {"hook", "file", "object"}; `object` when the plugin is not a module (pytest registers
    the modules a conftest's `pytest_plugins` names; an object is registered by code)."""
    found = {}
    for name in dir(pm.hook):
        caller = getattr(pm.hook, name, None)
        if name.startswith("pytest_") and hasattr(caller, "get_hookimpls"):
            for impl in caller.get_hookimpls():
                where = place_of(impl.function, repo, origins)
                if where:
                    is_obj = type(impl.plugin).__name__ != "module"
                    found[(name, where)] = {
                        "hook": name,
                        "file": where,
                        "object": is_obj,
                        "registered_from": registered_from.get(id(impl.plugin), []),
                    }
    return [found[k] for k in sorted(found)]


def import_hooks(meta_path, path_hooks, repo, origins=None):
    """Import finders/hooks defined in the repository or in generated code (they can rewrite
    test modules as pytest imports them)."""
    found = set()
    for hook in list(meta_path) + list(path_hooks):
        owner = hook if isinstance(hook, type) else type(hook)
        funcs = [hook] if hasattr(hook, "__code__") else []
        funcs += [getattr(owner, a, None) for a in ("find_spec", "find_module", "exec_module", "__call__", "__init__")]
        for func in funcs:
            where = place_of(func_of(func), repo, origins) if func is not None else None
            if where:
                found.add("%s:%s" % (getattr(owner, "__name__", "?"), where))
    return sorted(found)


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

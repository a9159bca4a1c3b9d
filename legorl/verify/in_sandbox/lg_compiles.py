"""The supervisor's fresh compiles of the task's test files: the code a record says a test
ran (its digest, sent by the test process) must be code compiled from its file as it is on
disk, compiled as the test process compiles it (plain, or probed and rewritten by pytest).

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import hashlib

from lg_probes import probe_comparisons


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
                h.update(const_repr(k).encode() + b"\x01")
    return h.hexdigest()[:32]


def const_repr(k):
    """A constant as text, the same however it was made: a frozenset's order is its hash
    table's, which differs between a fresh compile and the same code read from a .pyc."""
    if type(k) is frozenset:
        return "frozenset(%s)" % sorted(const_repr(x) for x in k)
    if type(k) is tuple:
        return "tuple(%s)" % ",".join(const_repr(x) for x in k)
    return repr((type(k).__name__, k))


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

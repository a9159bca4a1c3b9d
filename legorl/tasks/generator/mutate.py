"""Procedural bug injection by AST mutation, in the manner of SWE-smith's `func_pm_*` bugs.

A mutation is found on the AST (which node, inside which function) but applied as a small
edit to the source text, located with the nodes' byte offsets, so the gold patch reads like
a human one-line fix rather than a reformatted file. Kinds:

- `op_change`    `a + b` → `a - b`, `x += 1` → `x -= 1`, `&` ↔ `|`, `<<` ↔ `>>` …
- `cmp_change`   `<` ↔ `<=`, `>` ↔ `>=`, `==` ↔ `!=`, `in` ↔ `not in`, `is` ↔ `is not`
- `bool_change`  `and` ↔ `or`
- `off_by_one`   an integer literal `n` → `n + 1` or `n - 1` (`0` → `1`)
- `const_flip`   `True` ↔ `False`
- `drop_not`     `not x` → `x`
- `swap_args`    `f(a, b, …)` → `f(b, a, …)`
- `remove_cond`  an `if` statement without `else` is deleted (a dropped branch)

Only code inside function bodies is mutated: a broken module-level statement breaks every
import, which makes a task about nothing in particular.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

_BINOP_SWAP = {
    "+": "-",
    "-": "+",
    "*": "//",
    "/": "*",
    "//": "*",
    "%": "//",
    "&": "|",
    "|": "&",
    "^": "&",
    "<<": ">>",
    ">>": "<<",
    "**": "*",
}
_CMP_SWAP = {
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "in": "not in",
    "not in": "in",
    "is": "is not",
    "is not": "is",
}
_BINOP_RE = re.compile(r"\*\*|//|<<|>>|[-+*/%&|^@]")
_AUG_RE = re.compile(r"(\*\*|//|<<|>>|[-+*/%&|^@])=")
_CMP_RE = re.compile(r"\bnot\s+in\b|\bis\s+not\b|\bin\b|\bis\b|==|!=|<=|>=|<|>")
_BOOL_RE = re.compile(r"\band\b|\bor\b")


@dataclass(frozen=True)
class Mutation:
    """One edit of a source file: replace bytes [start, end) with `replacement`."""

    path: str
    kind: str
    function: str  # qualified name of the enclosing function
    lineno: int
    start: int
    end: int
    replacement: bytes
    original: bytes

    @property
    def key(self) -> str:
        h = hashlib.sha256(f"{self.path}:{self.start}:{self.end}:{self.kind}".encode())
        h.update(self.replacement)
        return h.hexdigest()[:8]

    def apply(self, source: bytes) -> bytes:
        assert source[self.start : self.end] == self.original, "source changed under the mutation"
        return source[: self.start] + self.replacement + source[self.end :]


class _Offsets:
    """(line, utf-8 column) ↔ absolute byte offset."""

    def __init__(self, source: bytes) -> None:
        self.starts = [0]
        for i, b in enumerate(source):
            if b == 0x0A:
                self.starts.append(i + 1)

    def at(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def start(self, node: ast.AST) -> int:
        return self.at(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _own_nodes(func: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """Nodes of a function's body (not its signature, decorators, docstring or nested defs)."""
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _token_between(src: bytes, lo: int, hi: int, pattern: re.Pattern[str]) -> tuple[int, int, str] | None:
    segment = src[lo:hi].decode("utf-8", errors="replace")
    if "#" in segment or "\\" in segment:
        return None
    m = pattern.search(segment)
    if not m:
        return None
    # Offsets in the decoded segment equal byte offsets only for ASCII; operators are ASCII,
    # and a non-ASCII segment between two operands is too odd to mutate.
    if not segment.isascii():
        return None
    return lo + m.start(), lo + m.end(), re.sub(r"\s+", " ", m.group(0))


def mutations_of(path: str, source: bytes) -> list[Mutation]:
    """Every mutation this module knows how to make in `source` (deterministic order)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    off = _Offsets(source)
    out: list[Mutation] = []

    def add(kind: str, fn: str, node: ast.AST, start: int, end: int, new: str) -> None:
        old = source[start:end]
        if old.decode("utf-8", errors="replace") == new:
            return
        out.append(Mutation(path, kind, fn, node.lineno, start, end, new.encode(), old))  # type: ignore[attr-defined]

    for fn, func in _functions(tree):
        for node in _own_nodes(func):
            if isinstance(node, ast.BinOp):
                tok = _token_between(source, off.end(node.left), off.start(node.right), _BINOP_RE)
                if tok and tok[2] in _BINOP_SWAP:
                    add("op_change", fn, node, tok[0], tok[1], _BINOP_SWAP[tok[2]])
            elif isinstance(node, ast.AugAssign):
                tok = _token_between(source, off.end(node.target), off.start(node.value), _AUG_RE)
                if tok and tok[2][:-1] in _BINOP_SWAP:
                    add("op_change", fn, node, tok[0], tok[1], _BINOP_SWAP[tok[2][:-1]] + "=")
            elif isinstance(node, ast.Compare):
                left = node.left
                for right in node.comparators:
                    tok = _token_between(source, off.end(left), off.start(right), _CMP_RE)
                    if tok and tok[2] in _CMP_SWAP:
                        add("cmp_change", fn, node, tok[0], tok[1], _CMP_SWAP[tok[2]])
                    left = right
            elif isinstance(node, ast.BoolOp):
                for a, b in zip(node.values, node.values[1:]):
                    tok = _token_between(source, off.end(a), off.start(b), _BOOL_RE)
                    if tok:
                        add("bool_change", fn, node, tok[0], tok[1], "or" if tok[2] == "and" else "and")
            elif isinstance(node, ast.Constant):
                text = source[off.start(node) : off.end(node)].decode("utf-8", errors="replace")
                if node.value is True or node.value is False:
                    if text in ("True", "False"):
                        add("const_flip", fn, node, off.start(node), off.end(node), str(not node.value))
                elif type(node.value) is int and text.isdigit():
                    n = node.value
                    for m in [1] if n == 0 else [n + 1, n - 1]:
                        add("off_by_one", fn, node, off.start(node), off.end(node), str(m))
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                inner = source[off.start(node.operand) : off.end(node.operand)].decode("utf-8", errors="replace")
                if "\n" not in inner:
                    add("drop_not", fn, node, off.start(node), off.end(node), inner)
            elif isinstance(node, ast.Call):
                args = node.args
                if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
                    a, b = args[0], args[1]
                    sa, ea, sb, eb = off.start(a), off.end(a), off.start(b), off.end(b)
                    ta, tb = source[sa:ea], source[sb:eb]
                    between = source[ea:sb]
                    if ta != tb and b"\n" not in ta + tb + between and b"#" not in between:
                        new = (tb + between + ta).decode("utf-8", errors="replace")
                        add("swap_args", fn, node, sa, eb, new)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list) or len(block) < 2:
                    continue
                for stmt in block:
                    if isinstance(stmt, ast.If) and not stmt.orelse:
                        _remove_stmt(source, off, stmt, fn, add)
    # Also drop whole-`if`s directly in function bodies (the loop above sees only nested blocks).
    for fn, func in _functions(tree):
        if len(func.body) >= 2:
            for stmt in func.body:
                if isinstance(stmt, ast.If) and not stmt.orelse:
                    _remove_stmt(source, off, stmt, fn, add)
    seen: set[tuple[int, int, bytes]] = set()
    unique = []
    for m in out:
        if (m.start, m.end, m.replacement) not in seen:
            seen.add((m.start, m.end, m.replacement))
            unique.append(m)
    return unique


def _remove_stmt(source: bytes, off: _Offsets, stmt: ast.stmt, fn: str, add) -> None:  # type: ignore[no-untyped-def]
    """Delete a statement's whole lines, if it occupies them alone."""
    line_start = off.starts[stmt.lineno - 1]
    start = off.start(stmt)
    if source[line_start:start].strip():
        return
    end = off.end(stmt)
    nl = source.find(b"\n", end)
    line_end = len(source) if nl < 0 else nl + 1
    if source[end:line_end].strip():
        return
    add("remove_cond", fn, stmt, line_start, line_end, "")

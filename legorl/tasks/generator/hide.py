"""Remove a task's FAIL_TO_PASS test functions from its test files (the agent's view).

SWE-bench tasks come with a `test_patch` that adds the tests deciding them; a generated
task needs the same shape. Hiding whole test files would also hide every passing test
beside them and make `test_patch` the size of the file, so instead only the definitions of
the failing tests (with their decorators) are cut out; `test_patch` puts them back.
"""

from __future__ import annotations

import ast
import re


def _span(node: ast.stmt) -> tuple[int, int]:
    """First and last line (1-based, inclusive) of a definition with its decorators."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno or node.lineno


def hide_tests(source: str, test_ids: list[str]) -> str | None:
    """`source` without the definitions of `test_ids` (node ids within this file).

    Returns None when an id cannot be mapped to a module-level function or a method of a
    module-level class (then the caller hides the whole file instead).
    """
    tree = ast.parse(source)
    wanted: set[tuple[str, ...]] = set()
    for tid in test_ids:
        parts = tid.split("::")[1:]
        if not parts:
            return None
        parts[-1] = re.sub(r"\[.*\]$", "", parts[-1])
        wanted.add(tuple(parts))
    cut: list[tuple[int, int]] = []
    found: set[tuple[str, ...]] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (node.name,) in wanted:
            cut.append(_span(node))
            found.add((node.name,))
        elif isinstance(node, ast.ClassDef):
            methods = [
                n
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and (node.name, n.name) in wanted
            ]
            if not methods:
                continue
            found.update((node.name, n.name) for n in methods)
            others = [n for n in node.body if n not in methods]
            if not others or all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in others):
                cut.append(_span(node))  # nothing meaningful would be left of the class
            else:
                cut.extend(_span(n) for n in methods)
    if found != wanted:
        return None
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for first, last in cut:
        drop.update(range(first - 1, last))
        # Take one blank line after the definition with it, so no gap of blank lines grows.
        if last < len(lines) and not lines[last].strip():
            drop.add(last)
    out = "".join(line for i, line in enumerate(lines) if i not in drop)
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out

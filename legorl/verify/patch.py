"""Split a git diff into per-file sections and drop the sections grading must not apply.

The agent's diff is untrusted text. We rebuild the diff from sections we understand:
each starts at a `diff --git` header and keeps only its extended header lines and hunks
whose lengths match their `@@` counts. Anything else (text before the first header,
trailing lines after the last hunk, which `git apply` would read as another, headerless
patch) is dropped, and binary patches are dropped whole. This filter is for evidence and
to keep `git apply` from tripping over test edits; the authority is the restore step in the
grading sandbox, which checks the resulting tree rather than this parse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from legorl.verify.protect import Category, classify

_EXTENDED = (
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "copy from ",
    "copy to ",
    "rename from ",
    "rename to ",
    "similarity index ",
    "dissimilarity index ",
    "index ",
    "--- ",
    "+++ ",
)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "r": "\r", "v": "\v"}


def unquote(path: str) -> str:
    """Undo git's C-style quoting of unusual path names (`"a/caf\\303\\251.py"`)."""
    if not (len(path) >= 2 and path.startswith('"') and path.endswith('"')):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body):
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            out.extend(_ESCAPES.get(nxt, nxt).encode())
            i += 2
            continue
        out.extend(ch.encode())
        i += 1
    return out.decode("utf-8", errors="replace")


def _strip_prefix(path: str) -> str:
    path = unquote(path.strip())
    if path == "/dev/null":
        return ""
    return path[2:] if path[:2] in ("a/", "b/") else path


def _header_paths(line: str) -> list[str]:
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        m = re.match(r'("(?:[^"\\]|\\.)*")\s+(.*)$', rest)
        return [_strip_prefix(m.group(1)), _strip_prefix(m.group(2))] if m else []
    # Unquoted: `a/X b/X`; when both sides are equal the split is in the middle.
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[:half][2:] == rest[half + 1 :][2:]:
        return [_strip_prefix(rest[:half]), _strip_prefix(rest[half + 1 :])]
    m = re.match(r"(a/.*?) (b/.*)$", rest)
    return [_strip_prefix(m.group(1)), _strip_prefix(m.group(2))] if m else []


@dataclass
class FileDiff:
    """One file's section of a diff."""

    paths: list[str]  # every path the section names (old and new sides, renames)
    lines: list[str]
    binary: bool = False

    @property
    def text(self) -> str:
        return "".join(self.lines)


@dataclass
class FilteredDiff:
    kept: str
    stripped: list[dict[str, str]] = field(default_factory=list)  # {"path", "category"}
    dropped_lines: int = 0  # lines outside any understood section

    @property
    def categories(self) -> set[str]:
        return {s["category"] for s in self.stripped}


def split_diff(diff: str) -> tuple[list[FileDiff], int]:
    """Parse a git diff into sections; return them and the count of ignored lines."""
    lines = diff.splitlines(keepends=True)
    sections: list[FileDiff] = []
    dropped = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("diff --git "):
            dropped += 1
            i += 1
            continue
        sec = FileDiff(paths=[p for p in _header_paths(line.rstrip("\n")) if p], lines=[line])
        i += 1
        while i < len(lines) and lines[i].startswith(_EXTENDED):
            ext = lines[i].rstrip("\n")
            for key in ("rename from ", "rename to ", "copy from ", "copy to "):
                if ext.startswith(key):
                    sec.paths.append(unquote(ext[len(key) :]))
            if ext.startswith(("--- ", "+++ ")):
                p = _strip_prefix(ext[4:].split("\t")[0])
                if p:
                    sec.paths.append(p)
            sec.lines.append(lines[i])
            i += 1
        if i < len(lines) and (lines[i].startswith("GIT binary patch") or lines[i].startswith("Binary files ")):
            sec.binary = True
            while i < len(lines) and not lines[i].startswith("diff --git "):
                sec.lines.append(lines[i])
                i += 1
        while i < len(lines) and (m := _HUNK.match(lines[i])):
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            sec.lines.append(lines[i])
            i += 1
            while i < len(lines) and (old_n > 0 or new_n > 0):
                h = lines[i]
                tag = h[:1]
                if tag == " ":
                    old_n, new_n = old_n - 1, new_n - 1
                elif tag == "-":
                    old_n -= 1
                elif tag == "+":
                    new_n -= 1
                elif tag == "\\":
                    pass  # "\ No newline at end of file"
                elif h in ("\n", "\r\n"):  # some tools drop the space of empty context lines
                    old_n, new_n = old_n - 1, new_n - 1
                else:
                    break
                sec.lines.append(h)
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                sec.lines.append(lines[i])
                i += 1
        sec.paths = list(dict.fromkeys(sec.paths))
        sections.append(sec)
    return sections, dropped


def filter_diff(diff: str, extra_tests: Iterable[str] = ()) -> FilteredDiff:
    """Keep the sections that touch only unprotected, non-binary paths."""
    extra = list(extra_tests)
    sections, dropped = split_diff(diff)
    kept: list[str] = []
    stripped: list[dict[str, str]] = []
    for sec in sections:
        cats = {p: classify(p, extra) for p in sec.paths}
        bad = {p: c for p, c in cats.items() if c is not None}
        if bad:
            for p, c in bad.items():
                stripped.append({"path": p, "category": str(c)})
            continue
        if sec.binary:
            for p in sec.paths:
                stripped.append({"path": p, "category": "binary"})
            continue
        kept.append(sec.text)
    text = "".join(kept)
    if text and not text.endswith("\n"):
        text += "\n"
    return FilteredDiff(kept=text, stripped=stripped, dropped_lines=dropped)


__all__ = ["Category", "FileDiff", "FilteredDiff", "filter_diff", "split_diff", "unquote"]

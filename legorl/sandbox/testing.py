"""Small helpers for tests that need real sandboxes (ours and other parts' tests).

`demo_repo` makes a deterministic git repository with a past, a base and a future commit
(same hashes on every machine, so the task image built from it is a cache hit after the
first run); `sandbox_ready` tells whether this machine can run the local backend.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HIDDEN_MARKER = "SECRET_HIDDEN_TEST_4f1c"
FUTURE_MARKER = "FUTURE_FIX_9a2b"

_FILES_PAST = {"calc.py": "def add(a, b):\n    return a - b\n", "README.md": "# calc\n"}
_FILES_BASE = {
    "calc.py": "def add(a, b):\n    return a - b  # bug\n",
    ".gitignore": "*.log\nbuild/\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_visible():\n    assert add(2, 0) == 2\n",
    "tests/test_hidden.py": (
        f"# {HIDDEN_MARKER}\nfrom calc import add\n\n\ndef test_hidden():\n    assert add(2, 2) == 4\n"
    ),
}
_FILES_FUTURE = {"calc.py": f"def add(a, b):\n    return a + b  # {FUTURE_MARKER}\n"}


@dataclass(frozen=True)
class DemoRepo:
    path: Path
    past: str
    base: str
    future: str
    hidden: tuple[str, ...] = ("tests/test_hidden.py",)


def _git(repo: Path, *args: str, date: str = "1700000000 +0000") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="Dev",
        GIT_AUTHOR_EMAIL="dev@example.invalid",
        GIT_AUTHOR_DATE=date,
        GIT_COMMITTER_NAME="Dev",
        GIT_COMMITTER_EMAIL="dev@example.invalid",
        GIT_COMMITTER_DATE=date,
    )
    out = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def demo_repo(path: Path) -> DemoRepo:
    """A 3-commit repository (past, base, future) with a tag and a hidden test at base."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    shas = []
    for i, files in enumerate((_FILES_PAST, _FILES_BASE, _FILES_FUTURE)):
        for name, text in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(text)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", f"commit {i}", date=f"{1700000000 + i * 1000} +0000")
        shas.append(_git(path, "rev-parse", "HEAD"))
    _git(path, "tag", "v0", shas[0])
    return DemoRepo(path, shas[0], shas[1], shas[2])


def sandbox_ready() -> str | None:
    """None if the local backend can run here, else why not."""
    if os.geteuid() != 0:
        return "the local sandbox backend needs root"
    return None

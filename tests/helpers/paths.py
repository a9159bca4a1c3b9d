"""The checkout's root and the test fixtures, named once: a test module's own depth under
tests/ says nothing about where the repository is."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

"""The sandbox backends a test is parametrised over: `local`, and `docker` where Docker is
available (marker `docker`, which the fast lane leaves out)."""

from __future__ import annotations

import pytest

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]

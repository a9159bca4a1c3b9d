"""The test suite, one folder per `legorl` subpackage (tests/repo/test_structure.py keeps it so).

A package so that every test module has a dotted name of its own (`tests.proxy.test_render`)
and the shared helpers import as `tests.helpers.<module>`; never shipped (pyproject.toml
packages only `legorl*`)."""

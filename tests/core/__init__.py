"""Tests of legorl's top-level modules (legorl/*.py: trajectory, models, rollout, the CLI, http_auth)."""

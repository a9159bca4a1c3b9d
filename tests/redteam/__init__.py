"""Tests of attacks on grading and the infrastructure, across packages (forgeries, reward hacks)."""

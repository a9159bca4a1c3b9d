"""Tests of legorl.engine."""

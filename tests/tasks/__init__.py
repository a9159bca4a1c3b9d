"""Tests of legorl.tasks."""

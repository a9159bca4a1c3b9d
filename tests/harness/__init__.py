"""Tests of legorl.harness."""

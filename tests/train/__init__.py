"""Tests of legorl.train."""

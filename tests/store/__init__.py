"""Tests of legorl.store."""

"""Tests of legorl.sandbox."""

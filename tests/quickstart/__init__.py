"""Tests of legorl.quickstart."""

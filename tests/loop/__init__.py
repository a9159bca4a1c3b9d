"""Tests of legorl.loop."""

"""Tests of legorl.monitor."""

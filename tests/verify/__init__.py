"""Tests of legorl.verify."""

"""Tests of legorl.proxy."""

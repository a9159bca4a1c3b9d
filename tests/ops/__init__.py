"""Tests of legorl.ops."""

"""Tests of legorl.monitor.ui."""

"""Tests of the agent plugin (plugin/)."""

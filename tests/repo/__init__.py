"""Tests of the checkout as a whole: the import graph, where code runs, the wheel."""

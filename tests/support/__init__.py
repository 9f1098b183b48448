"""Fixtures, helpers and job scripts shared by the test folders."""

"""Tests of builder/source/ (docs/testing.md)."""

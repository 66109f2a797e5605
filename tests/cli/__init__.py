"""Tests of builder/cli/ (docs/testing.md)."""

"""Tests of builder/core/ (docs/testing.md)."""

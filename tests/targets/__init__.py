"""Tests of builder/ci/ (docs/testing.md)."""

"""Tests of builder/image/ (docs/testing.md)."""

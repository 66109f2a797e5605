"""Tests of builder/smoke/ (docs/testing.md)."""

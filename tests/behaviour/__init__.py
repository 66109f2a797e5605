"""Tests of builder/behaviour/ (docs/testing.md)."""

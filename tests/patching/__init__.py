"""Tests of builder/patching/ (docs/testing.md)."""

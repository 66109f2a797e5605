"""Tests of builder/release/ (docs/testing.md)."""

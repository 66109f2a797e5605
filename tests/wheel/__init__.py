"""Tests of builder/wheel/ (docs/testing.md)."""

"""Tests of builder/kernels/ (docs/testing.md)."""

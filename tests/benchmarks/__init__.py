"""Tests of benchmarks/ (docs/testing.md)."""

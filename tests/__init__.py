"""The test suite (docs/testing.md): a package, so that test files of different stages may
share a name (``tests/image/test_build.py``, ``tests/wheel/test_build.py``)."""

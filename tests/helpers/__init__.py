"""What the tests share besides fixtures: paths, the pinned releases, the in-process CLI
runner, small projects, a static HTTP server, the real services and the tier plugin.

Tests import these modules (``from tests.helpers.cli import run_cli``). The fixtures
themselves stay in ``tests/conftest.py``, which no test imports.
"""

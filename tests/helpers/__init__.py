"""What the tests share besides fixtures: paths, the pinned releases, the in-process CLI
runner, small projects, a static HTTP server, the real services and the tier plugin.

Tests import these modules (``from helpers.cli import run_cli``); ``tests/`` is on
``sys.path`` through pytest's ``pythonpath`` setting in ``pyproject.toml``. The fixtures
themselves stay in ``tests/conftest.py``, which no test imports.
"""

"""Where the tests find the repository, their own files and the download cache."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder of ``pyproject.toml``).
REPO = Path(__file__).resolve().parents[2]
#: The ``tests/`` folder: its data, cases and helper scripts.
TESTS = REPO / "tests"
#: The download cache of the pinned sdists, wheels and images (docs/testing.md).
TEST_CACHE = Path(os.environ.get("SGLANG_SM120_TEST_CACHE", REPO / ".cache" / "tests"))
#: The file the shipped patches change in every release.
MODEL_RUNNER = "sglang/srt/model_executor/model_runner.py"

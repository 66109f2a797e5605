"""The image tests' isolation: a launcher run keeps its backend selection under
``$SGLANG_CACHE_DIR`` (``~/.cache/sglang`` when unset); each test gets a folder of its own
there, so no test writes into the machine's SGLang cache or reads another test's."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_sglang_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "sglang-cache"))

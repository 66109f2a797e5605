"""The kernel build environment asks the PyTorch index once, with a short timeout, before
pip retries it for minutes: an unreachable index is one clear MissingToolError naming
``--build-torch``, at once, with no environment left half-made."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from builder.core.cache import Cache
from builder.core.errors import MissingToolError
from builder.core.progress import Reporter
from builder.kernels.preflight import preflight
from builder.kernels.toolchain import managed_environment, probe_index
from tests.helpers.serve import serve_directory


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_torch_index_fails_fast_naming_build_torch(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/whl/cu130"
    started = time.monotonic()
    with pytest.raises(MissingToolError) as refused:
        managed_environment(["torch==2.14.1"], Cache(tmp_path / "cache"),
                            Reporter(quiet=True), extra_index_urls=(url,))
    assert time.monotonic() - started < 30  # pip alone spent minutes retrying
    assert f"the PyTorch index {url} is unreachable" in refused.value.cause
    assert "--build-torch" in refused.value.hint and "CPU" in refused.value.hint
    entries = tmp_path / "cache" / "kernel-env"
    assert not entries.exists() or not any(p.name != ".lock" for p in entries.rglob("venv"))


def test_an_index_that_answers_passes_the_probe(tmp_path: Path) -> None:
    (tmp_path / "whl").mkdir()
    with serve_directory(tmp_path) as base:
        probe_index(f"{base}/whl")  # a listing
        probe_index(f"{base}/no-such-lane")  # a 404 is an answer: pip reports the rest


def test_preflight_counts_the_headers_kernels_installs_itself(tmp_path: Path) -> None:
    # No nvcc either: the header checks still run, each on its own.
    args = {"nvcc": tmp_path / "no-nvcc", "lane": "13.0", "arches": [],
            "include_dirs": [tmp_path]}
    managed = {c.name: c for c in preflight(**args, managed_headers=True)}  # type: ignore[arg-type]
    for header, wanted in (("cublas_v2.h", "nvidia-cublas==13.*"),
                           ("curand.h", "nvidia-curand")):
        assert managed[header].ok, managed[header]
        assert f"`kernels` installs {wanted} in its managed environment" in \
            managed[header].detail
    assert not managed["nvcc"].ok
    # Folders named with --include are the user's: a missing header there still fails.
    given = {c.name: c for c in preflight(**args)}  # type: ignore[arg-type]
    assert not given["cublas_v2.h"].ok and not given["curand.h"].ok

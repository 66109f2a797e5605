"""TileLang's kernel cache built ahead on a CPU (issue 37): the DSA kernel patched SGLang
0.5.23's dispatch picks (the series' ``[[kernel_fit]]``, narrowed to one case) is compiled
for ``sm_90a`` by :func:`builder.kernels.tilelang_cache.build_tilelang_cache` with the
release's pinned tilelang and nvcc, no GPU. A second, fresh process calls the same factory
as the server does and finds it in the cache (no new entry: zero compilations); a build for
``12.0f`` is another key (the arch is in it) and compiles.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builder.core.cache import Cache
from builder.kernels.tilelang_cache import MANIFEST, build_tilelang_cache
from builder.patching.series import Series
from tests.helpers.releases import patched_release


@pytest.fixture(scope="module")
def patched_0523(shared_cache: Path) -> tuple[Any, Path, Series, Path, Cache]:
    release = patched_release(shared_cache, "sglang-0.5.23")
    series = release.series
    # one case of each declaration: 16 heads per GPU (TP 8), bf16 KV, one token
    narrowed = replace(series, entries=tuple(
        replace(e, kernel_fits=tuple(replace(f, heads=(16,), kv=("bf16",), tokens=(1,))
                                     for f in e.kernel_fits)) for e in series.entries))
    return release.env, release.archive, narrowed, release.tree, release.cache


@pytest.mark.slow(reason="installs 0.5.23's tilelang, lowers a DSA kernel and compiles it "
                  "with nvcc, three times")
def test_a_dsa_kernel_built_ahead_on_a_cpu_is_found_by_the_factory(
        patched_0523: tuple[Any, Path, Series, Path, Cache], tmp_path: Path,
        tilelang_nvcc: Path) -> None:
    env, wheel, series, tree, cache = patched_0523
    dest = tmp_path / "tilelang"
    built = build_tilelang_cache(env, wheel, series, "sm_90a", dest, cache=cache, overlay=tree)
    assert built.kernels and built.failed == []
    assert built.built_with["target_arch"] == "sm_90a"
    assert all(k["new_entries"] == 1 for k in built.kernels), built.kernels  # compiled
    assert json.loads((dest / MANIFEST).read_text())["built_with"]["release"] == "0.5.23"
    assert list(dest.glob("*/linux-x86_64/kernels/*/executable.so"))

    again = build_tilelang_cache(env, wheel, series, "sm_90a", dest, cache=cache, overlay=tree)
    assert [k["kernel"] for k in again.kernels] == [k["kernel"] for k in built.kernels]
    assert all(k["new_entries"] == 0 for k in again.kernels), again.kernels  # found: 0 compiles

    other = build_tilelang_cache(env, wheel, series, "12.0f", dest, cache=cache, overlay=tree)
    assert other.built_with["target_arch"] == "sm_120a"
    assert all(k["new_entries"] == 1 for k in other.kernels), other.kernels

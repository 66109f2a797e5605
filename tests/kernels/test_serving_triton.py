"""The Triton cache is built with the triton the server runs (issue 37): SGLang 0.5.16 pins
torch 2.11.0, whose PyPI wheels require ``triton==3.6.0`` (the GPU machine ran 3.6.0), while
the behaviour environment has triton 3.9.0. The specs are SGLang 0.5.16's own, recorded by
``triton_watch.py`` on an H200 with triton 3.6.0 (``tests/data/triton-watch-0.5.16-h200``,
from ``reports/2026-12-03-h200-derived-serving/results/run1/triton/dense``): no ``target``
key (triton 3.9's ``preload`` needs one) and the H200's ``libdevice`` path.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from builder.kernels.jit_caches import read_specs
from builder.kernels.pins import read_pins
from builder.kernels.serving_triton import install_triton, serving_triton, triton_requirement
from builder.kernels.triton_cache import MANIFEST, build_triton_cache, run_script
from tests.helpers.paths import REPO
from tests.helpers.releases import UpstreamRelease
from tests.helpers.tiers import BEHAVIOUR

RECORDS = REPO / "tests" / "data" / "triton-watch-0.5.16-h200"
KERNEL = "sglang.kernels.ops.kvcache.kv_indices.create_flashinfer_kv_indices_triton"
STRIDE, BS = 8196, 4


def _launch() -> dict[str, Any]:
    # The recorded launch (sglang/kernels/ops/kvcache/kv_indices.py, 0.5.16): req_to_token
    # [rows, 8196] int32, req_pool_indices and page_kernel_lens int64, kv_indptr int32,
    # kv_start_idx None, kv_indices int32, the row stride (a constexpr).
    return {"kernel": KERNEL, "grid": [BS], "args": [
        {"dtype": "int32", "shape": [8, STRIDE]}, {"dtype": "int64", "shape": [BS]},
        {"dtype": "int64", "shape": [BS]}, {"dtype": "int32", "shape": [BS + 1]}, None,
        {"dtype": "int32", "shape": [64]}, STRIDE]}


def test_the_triton_requirement_is_read_for_linux_and_the_python() -> None:
    # torch 2.14.1's line on PyPI (2026-12-03), and torch 2.11.0's
    lines = ["filelock", 'triton~=3.8.0; platform_system == "Linux" and python_version < '
             '"3.15"', 'cuda-bindings<14,>=13.0.3; platform_system == "Linux"']
    assert str(triton_requirement(lines, "3.11")) == lines[1]
    assert triton_requirement(lines, "3.15") is None
    assert str(triton_requirement(['triton==3.6.0; platform_system == "Linux"'], "3.12")) \
        == 'triton==3.6.0; platform_system == "Linux"'


def test_the_serving_triton_of_sglang_0516_is_the_one_its_torch_pin_requires(
        upstream_0_5_16: UpstreamRelease) -> None:
    pin = read_pins(upstream_0_5_16.source).torch
    assert pin == "torch==2.11.0"
    found = serving_triton(pin, cache=upstream_0_5_16.cache)
    assert (found.version, found.torch) == ("3.6.0", "2.11.0")
    assert found.requirement == 'triton==3.6.0; platform_system == "Linux"'
    assert found.wheel.startswith("torch-2.11.0-") and "manylinux" in found.wheel


@pytest.mark.slow(reason="imports sglang 0.5.16 in its behaviour environment with triton "
                  "3.6.0 and runs ptxas", group=BEHAVIOUR)
def test_an_h200_record_of_0516_is_built_with_triton_360_and_found_by_its_launch_path(
        upstream_0_5_16: UpstreamRelease, tmp_path: Path) -> None:
    env, cache = upstream_0_5_16.env, upstream_0_5_16.cache
    specs = read_specs(RECORDS)
    assert len(specs) == 1 and "target" not in json.loads(specs[0])  # triton 3.6's format
    version = serving_triton(read_pins(upstream_0_5_16.source).torch, cache=cache).version
    triton = install_triton(version, env.python, cache=cache)

    # Without the cache the server's launch path (triton 3.6.0) compiles.
    empty, done = run_script(env, {"mode": "launch", "arch": 90, "launches": [_launch()]},
                             tmp_path / "empty", triton=triton)
    assert done["triton"] == "3.6.0"
    assert [e["cache_hit"] for r in empty for e in r["events"]] == [False]

    built = build_triton_cache(env, specs, "sm_90a", tmp_path / "triton", triton=triton)
    assert built.failed == [], built.failed
    assert built.kernels[0]["retargeted"] is False  # recorded on sm90, built for sm90
    manifest = json.loads((tmp_path / "triton" / MANIFEST).read_text())
    assert manifest["built_with"]["triton"] == "3.6.0"

    hits, _ = run_script(env, {"mode": "launch", "arch": 90, "launches": [_launch()]},
                         tmp_path / "triton", triton=triton)
    events = [e for r in hits for e in r["events"]]
    assert [e["cache_hit"] for e in events] == [True]  # zero compilations
    assert events[0]["hash"] == built.kernels[0]["events"][0]["hash"]

    # Retargeted (no target key in 3.6's format: the recorded options' arch says sm90).
    other = build_triton_cache(env, specs, "12.0f", tmp_path / "sm120", triton=triton)
    assert other.failed == [] and other.kernels[0]["retargeted"] is True
    hits, _ = run_script(env, {"mode": "launch", "arch": 120, "launches": [_launch()]},
                         tmp_path / "sm120", triton=triton)
    assert [e["cache_hit"] for r in hits for e in r["events"]] == [True]


MOE_RECORDS = REPO / "tests" / "data" / "triton-watch-0.5.16-h200-moe"


@pytest.mark.slow(reason="imports sglang 0.5.16's fused MoE in its behaviour environment "
                  "with triton 3.6.0 and runs ptxas", group=BEHAVIOUR)
def test_the_fused_moe_kernel_recorded_on_an_h200_builds_without_a_gpu(
        upstream_0_5_16: UpstreamRelease, tmp_path: Path) -> None:
    """SGLang 0.5.16's ``fused_moe_kernel`` (three block configurations of the bf16 MoE at
    Qwen3-30B-A3B's widths, recorded by ``triton_watch.py`` in run 5 of the derived-serving
    report, MoE runner ``auto``): its package imports ``fla/utils.py``, which asks
    ``torch.cuda.get_device_name(0)`` at import. With no GPU that import failed and none of
    the 30 MoE specializations the server launches was built (run 5b shipped 8 of 38); the
    device reported as the target's capability (``triton_aot._report_device``), all build."""
    env, cache = upstream_0_5_16.env, upstream_0_5_16.cache
    specs = read_specs(MOE_RECORDS)
    assert len(specs) == 3 and all(json.loads(s)["name"].endswith(".fused_moe_kernel")
                                   for s in specs)
    triton = install_triton(serving_triton(read_pins(upstream_0_5_16.source).torch,
                                           cache=cache).version, env.python, cache=cache)
    built = build_triton_cache(env, specs, "sm_90a", tmp_path / "triton", triton=triton)
    assert [k.get("error") for k in built.failed] == []
    assert len(built.kernels) == 3
    cubins = sorted(p.name for p in (tmp_path / "triton").rglob("*.cubin"))
    assert cubins == ["fused_moe_kernel.cubin"] * 3


@pytest.mark.slow(reason="imports sglang 0.5.16's fused MoE in its behaviour environment "
                  "with triton 3.6.0", group=BEHAVIOUR)
def test_a_kernel_whose_module_does_not_import_is_reported_with_the_import_error(
        upstream_0_5_16: UpstreamRelease, tmp_path: Path) -> None:
    """Without the behaviour environment's stand-ins ``fused_moe_triton_kernels`` does not
    import (``sgl_kernel`` is one of them). The failure must say so, not that the package
    ``sglang.kernels.ops.moe`` has no such attribute (which is what the lookup that falls
    back to the package gave)."""
    env, cache = upstream_0_5_16.env, upstream_0_5_16.cache
    assert "sgl_kernel" in env.standins
    bare = dataclasses.replace(env, standins={})
    triton = install_triton(serving_triton(read_pins(upstream_0_5_16.source).torch,
                                           cache=cache).version, env.python, cache=cache)
    built = build_triton_cache(bare, read_specs(MOE_RECORDS)[:1], "sm_90a",
                               tmp_path / "triton", triton=triton)
    assert len(built.failed) == 1
    error = str(built.failed[0]["error"])
    assert "No module named 'sgl_kernel'" in error and "has no attribute" not in error, error

"""The behavioural check of the SM12x selection patches (builder/smoke/selection.py) on
the real SGLang 0.5.16 wheel, unpatched and as the builder patches it: with the device
capability reported as (12, 0) at the torch API (this machine has no GPU), SGLang's own
selection code picks the SM100 path unpatched and the SM120 path patched. The same script
ran on the lent GPU machine (reports/2026-11-30-upstream-sm120-selection/)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import MATRIX_RELEASES, REPO, run_cli

SCRIPT = REPO / "builder" / "smoke" / "selection.py"


def _select(root: Path, capability: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--sglang-root", str(root),
                           "--capability", capability, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["sm120_hardware"] is False
    assert report["capability"] == [int(x) for x in capability.split(".")]
    return report["results"]


@pytest.fixture(scope="module")
def trees(matrix_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, Path]:
    """``upstream``: the real 0.5.16 wheel unpacked; ``patched``: the builder's wheel of it
    (the shipped series), unpacked."""
    root = tmp_path_factory.mktemp("selection")
    wheel = matrix_files["0.5.16"]
    (root / "targets.toml").write_text(f"""
[[target]]
name = "sglang-0.5.16"
upstream_version = "0.5.16"
local_label = "sm120.1"
series = "{REPO / 'patches' / 'series.toml'}"
cuda_lane = "13.0"
arch_list = ["12.0f"]

[[target.source]]
kind = "wheel"
project = "sglang"
version = "0.5.16"
filename = "{wheel.name}"
sha256 = "{MATRIX_RELEASES['0.5.16'].sha256}"
url = "{wheel.as_uri()}"
""")
    done = run_cli("wheel", "--dist", str(root / "dist"), cwd=root, cache=root / "cache")
    assert done.returncode == 0, done.stderr[-2000:]
    built = sorted((root / "dist").glob("sglang-0.5.16+sm120.1-*.whl"))
    assert len(built) == 1
    out = {}
    for name, archive in (("upstream", wheel), ("patched", built[0])):
        with zipfile.ZipFile(archive) as unpacked:
            unpacked.extractall(root / name, [n for n in unpacked.namelist()
                                              if n.startswith("sglang/srt/")])
        out[name] = root / name
    return out


def test_unpatched_sm120_takes_the_sm100_paths(trees: dict[str, Path]) -> None:
    results = _select(trees["upstream"], "12.0")
    assert results["moe"]["resolved"] == "flashinfer_trtllm"  # SM100-only runner
    assert results["moe"]["enable_flashinfer_cutlass_moe"] is False
    assert (results["dsa"]["kv_cache_dtype"], results["dsa"]["prefill"],
            results["dsa"]["decode"]) == ("fp8_e4m3", "trtllm", "trtllm")


def test_patched_sm120_takes_the_sm120_paths(trees: dict[str, Path]) -> None:
    results = _select(trees["patched"], "12.0")
    assert results["moe"]["resolved"] == "flashinfer_cutlass"
    assert results["moe"]["runner"] == "flashinfer_cutlass"
    assert results["moe"]["enable_flashinfer_cutlass_moe"] is True
    assert (results["dsa"]["kv_cache_dtype"], results["dsa"]["prefill"],
            results["dsa"]["decode"]) == ("bfloat16", "tilelang", "tilelang")


@pytest.mark.parametrize("capability", ["10.0", "9.0"])
def test_other_gpus_resolve_as_upstream(trees: dict[str, Path], capability: str) -> None:
    assert _select(trees["patched"], capability) == _select(trees["upstream"], capability)

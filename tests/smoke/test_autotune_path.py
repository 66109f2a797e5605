"""SGLang's own autotune-file key, computed by the release's own function on a CPU
(:mod:`builder.smoke.autotune_path`; ``flashinfer_autotune_cache_path`` in
``sglang/srt/model_executor/runner/flashinfer_autotune.py``).

The function was checked against a real server once (2026-12-03, by hand): for the argv of
``reports/2026-12-01-h200-cold-start/`` (``--model-path /root/tiny``, the tiny Qwen3-MoE,
``--moe-runner-backend flashinfer_cutlass --attention-backend triton --disable-cuda-graph
--tp 1``) on 0.5.16 at capability 9.0 it gives ``flashinfer/autotune/0.6.14/sm90/
d4e4eb6f01a747dc/rank_tp0_pp0_dp0.json``, the file the server wrote on the lent H200. The
tests below cannot use ``/root/tiny`` (the model path is in the key), so they compare
configurations with each other. 0.5.16's function runs over the release as published (its
series changes no input of the key for a bf16 model); 0.5.23's over the patched tree, as
``warm-cache restore`` runs it, through 0.5.23's own path: ``resolve_once`` after
``prepare_server_args``, and every rank published to the runtime context with its
``SpawnRanks`` (no ``ParallelState``: 0.5.23 derives the TP/EP ranks of the key and the
file name from the published ranks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import ConfigurationError
from builder.core.wheelmeta import requires_dist, wheel_metadata
from builder.smoke.autotune_path import run_path_function
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.releases import UpstreamRelease, patched_release

pytestmark = pytest.mark.slow(reason="runs a release's own code in its behaviour environment")

TINY = REPO / "builder" / "smoke" / "script" / "tiny_model.py"


def _tiny(folder: Path) -> Path:
    subprocess.run([sys.executable, str(TINY), str(folder)], check=True, capture_output=True)
    return folder


@dataclass(frozen=True)
class _Release:
    """A release whose own path function the test runs: its behaviour environment, its
    wheel (the FlashInfer pin is read from it) and the tree put first on ``PYTHONPATH``."""

    env: Any
    wheel: Path
    overlay: Path | None


@pytest.fixture(params=["0.5.16", "0.5.23"])
def release(request: pytest.FixtureRequest, shared_cache: Path) -> _Release:
    """0.5.16 as published; 0.5.23 patched by its series (both from the shared cache)."""
    if request.param == "0.5.16":
        upstream: UpstreamRelease = request.getfixturevalue("upstream_0_5_16")
        assert upstream.source.archive is not None
        return _Release(upstream.env, upstream.source.archive, None)
    patched = patched_release(shared_cache, f"sglang-{request.param}")
    return _Release(patched.env, patched.archive, patched.tree)


def _pinned_flashinfer(wheel: Path) -> str:
    """The ``flashinfer-python`` version the release's wheel pins (``==X``)."""
    (pin,) = [r for r in requires_dist(wheel_metadata(wheel), wheel.name)
              if r.name.lower().replace("_", "-") == "flashinfer-python"]
    (spec,) = pin.specifier
    assert spec.operator == "==", pin
    return spec.version


def test_the_releases_own_function_keys_each_configuration(
        tmp_path: Path, release: _Release) -> None:
    model = str(_tiny(tmp_path / "tiny"))
    copy = str(_tiny(tmp_path / "copy"))  # the same model under another path
    env, overlay = release.env, release.overlay
    configs = [["--model-path", model], ["--model-path", model, "--tp-size", "2"],
               ["--model-path", model, "--tp-size", "2", "--ep-size", "2"],
               ["--model-path", model, "--dtype", "float16"],
               ["--model-path", model, "--moe-runner-backend", "flashinfer_cutlass"],
               ["--model-path", copy], ["--model-path", model]]
    found = run_path_function(env, configs, (12, 0), overlay=overlay)
    assert {f.release for f in found} == {env.release}
    folders = [{str(Path(p).parent) for p in f.paths} for f in found]
    assert all(len(f) == 1 for f in folders)
    one, tp2, ep2, fp16, cutlass, other, again = (f.pop() for f in folders)
    # the FlashInfer the release pins (0.5.16: 0.6.14; 0.5.23: 0.7.2), read from its wheel
    assert one.startswith(f"flashinfer/autotune/{_pinned_flashinfer(release.wheel)}/sm120/")
    assert len({one, tp2, ep2, fp16, cutlass, other}) == 6  # each input is in the key
    assert again == one  # and nothing else is
    # one file per rank, named by the ranks the release derives (0.5.23: from the published
    # SpawnRanks, with and without expert parallelism)
    for tp_run in found[1:3]:
        assert [Path(p).name for p in tp_run.paths] == ["rank_tp0_pp0_dp0.json",
                                                         "rank_tp1_pp0_dp0.json"]
    assert found[0].function.endswith(":flashinfer_autotune_cache_path")
    # The arch is the folder above the key, not in it.
    (hopper,) = run_path_function(env, [configs[0]], (9, 0), overlay=overlay)
    assert hopper.paths == (found[0].paths[0].replace("/sm120/", "/sm90/"),)
    # the parser's own reason, not only its exit status
    with pytest.raises(ConfigurationError, match=r"computes no autotune path.*invalid int value"):
        run_path_function(env, [["--model-path", model, "--tp-size", "two"]], (12, 0),
                          overlay=overlay)


def test_restore_writes_every_rank_where_the_server_reads_it(
        tmp_path: Path, upstream_0_5_16: UpstreamRelease, shared_cache: Path) -> None:
    # capture: a TP 2 run's two files; restore: no --dest, the model and flags instead
    model = str(_tiny(tmp_path / "tiny"))
    key = {"gpu_name": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0",
           "flashinfer_version": "0.6.14", "release": "sglang-0.5.16", "hidden": 1024,
           "experts": 8, "top_k": 2, "intermediate": 256, "tp": 2, "dtype": "bf16"}
    (tmp_path / "key.json").write_text(json.dumps(key))
    entry = "('trtllm::fused_moe::gemm1', 'MoERunner', ((1, 1024), (8, 512, 1024)), ())"
    ran = tmp_path / "ran" / "flashinfer/autotune/0.6.14/sm120/0123456789abcdef"
    ran.mkdir(parents=True)
    for rank in (0, 1):
        (ran / f"rank_tp{rank}_pp0_dp0.json").write_text(json.dumps({
            "_metadata": {"gpu": key["gpu_name"], "flashinfer_version": "0.6.14"},
            entry: ["MoERunner", rank]}))
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(tmp_path / "ran"),
                   "--key", str(tmp_path / "key.json"), "--output", str(tmp_path / "w.json"))
    assert done.returncode == 0, done.stderr
    done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "w.json"),
                   "--key", str(tmp_path / "key.json"), "--model-path", model,
                   "--cache-dir", str(shared_cache), "--json", "--", "--tp-size", "2",
                   env={"SGLANG_CACHE_DIR": str(tmp_path / "srv")})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["restored"] is True and len(result["dest"]) == 2
    (expected,) = run_path_function(upstream_0_5_16.env,
                                    [["--model-path", model, "--tp-size", "2"]], (12, 0))
    # 0.5.16's series changes no input of the key for a bf16 model: the same folder
    assert result["dest"] == [str(tmp_path / "srv" / p) for p in expected.paths]
    for rank, path in enumerate(result["dest"]):
        assert json.loads(Path(path).read_text())[entry] == ["MoERunner", rank]

"""The kernels the SM12x patches select fit SM120: real tilelang, real nvcc, no GPU.

The slow tests run ``python -m builder behaviour`` for each target whose series declares a
``[[kernel_fit]]``: the release's own DSA dispatch, with the device reported as SM120, picks
its TileLang kernels; the release's pinned tilelang lowers each for sm_120 and nvcc compiles
it. Patched, every kernel fits; upstream's bf16 kernel (``sparse_attention_fwd_kernel_v2``,
block_I 64) does not. The fast tests hold the declaration rules and the verdict rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.behaviour.fit import SM120, check_fits, fits_of, judge, require_fit
from builder.core.config import load_targets
from builder.core.errors import ConfigurationError, PatchError
from builder.patching.series import load_series
from tests.helpers import targets as shipped
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.releases import UpstreamRelease
from tests.helpers.targets import current_targets

SERIES = REPO / "patches" / "series.toml"
#: The current targets whose series selects a TileLang DSA kernel on SM12x (a copy of 0003
#: applies), read from targets.toml and the series.
FIT_TARGETS = tuple(n for n in current_targets() if any(
    e.name.startswith("0003-") and e.applies_to(shipped.targets().get(n).upstream_version)
    for e in shipped.series().entries))


def _series(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "patches" / "series.toml"
    path.parent.mkdir()
    for patch in (REPO / "patches").glob("*.patch"):
        (path.parent / patch.name).write_bytes(patch.read_bytes())
    path.write_text(SERIES.read_text() + "\n" + extra)
    return path


def test_the_fit_is_declared_for_every_current_target_whose_series_picks_tilelang() -> None:
    series = load_series(SERIES)
    targets = load_targets(REPO / "targets.toml").targets
    declared = {name for name in current_targets()
                if fits_of(series, targets[name].upstream_version)}
    assert FIT_TARGETS and declared == set(FIT_TARGETS)
    assert all(e.kernel_fits for e in series.entries if e.name.startswith("0003-"))


@pytest.mark.parametrize(("extra", "message"), [
    ('[[kernel_fit]]\npatches = ["0003-*"]\nname = "x"\ndispatch = "no colon"\n'
     'heads = [16]\n', "is not MODULE:FUNCTION"),
    ('[[kernel_fit]]\npatches = ["0003-*"]\nname = "x"\ndispatch = "m:f"\nheads = [16]\n'
     'kv = ["int4"]\n', "kv must be a non-empty list of bf16 / fp8"),
    ('[[kernel_fit]]\npatches = ["0003-*"]\nname = "x"\ndispatch = "m:f"\nheads = []\n',
     "heads must be a non-empty list of positive integers"),
    ('[[kernel_fit]]\npatches = ["nope-*"]\nname = "x"\ndispatch = "m:f"\nheads = [16]\n',
     "names no patch of the series"),
])
def test_a_malformed_kernel_fit_is_refused_with_one_message(tmp_path: Path, extra: str,
                                                            message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_series(_series(tmp_path, extra))


def test_the_verdict_names_each_figure_against_its_limit() -> None:
    record = {"factory": "k", "arguments": ["64"], "dynamic_smem": SM120.smem_per_block,
              "static_smem": 0, "registers": 255, "threads": 256}
    assert judge(record).fits
    over = judge({**record, "static_smem": 1})
    assert over.misses == (f"shared memory {SM120.smem_per_block + 1:,} B (dynamic "
                           f"{SM120.smem_per_block:,} + static 1) > 101,376 B",)
    wide = judge({**record, "threads": 384})
    assert "registers 255 x 384 threads = 97,920 > 65,536" in wide.misses
    assert not judge({**record, "threads": 2048}).fits
    assert not judge({**record, "error": "nvcc exit 1"}).fits


@pytest.mark.slow(reason="lowers TileLang kernels and compiles them with nvcc")
@pytest.mark.parametrize("target", FIT_TARGETS)
def test_patched_kernels_fit_sm120_and_upstreams_bf16_kernel_does_not(
        target: str, shared_cache: Path, tilelang_nvcc: Path) -> None:
    done = run_cli("behaviour", "--target", target, "--json", cache=shared_cache)
    report = json.loads(done.stdout)
    fit = report["kernel_fit"]
    assert done.returncode == 0, json.dumps(fit, indent=1)[:4000]
    assert fit["limits"]["smem_per_block"] == 101_376 and fit["fits"]
    patched = [k for r in fit["results"] if r["code"] == "patched" for k in r["kernels"]]
    upstream = [k for r in fit["results"] if r["code"] == "upstream" for k in r["kernels"]]
    assert patched and all(k["fits"] for k in patched)
    assert all(k["registers"] and k["threads"] and k["static_smem"] is not None for k in patched)
    # upstream's bf16 choice: the v2 kernel, block_I 64, far over the opt-in shared memory
    v2 = [k for k in upstream if k["factory"] == "sparse_attention_fwd_kernel_v2"]
    assert v2 and not any(k["fits"] for k in v2)
    assert all(k["dynamic_smem"] > SM120.smem_per_block for k in v2)
    assert "sparse_attention_fwd_kernel_v2" not in {k["factory"] for k in patched}


@pytest.mark.slow(reason="lowers TileLang kernels and compiles them with nvcc")
def test_upstreams_code_fails_the_fit_naming_kernel_and_figure(
        upstream_0_5_16: UpstreamRelease, tilelang_nvcc: Path) -> None:
    """The failing run: upstream's tree checked as the 'patched' code (0.5.16)."""
    up = upstream_0_5_16
    pairs = fits_of(load_series(SERIES), up.target.upstream_version)
    report = check_fits(pairs, up.env, up.source.archive, up.source.tree, cache=up.cache,
                        patched_key="upstream")
    assert not report.fits
    with pytest.raises(PatchError, match=r"sparse_attention_fwd_kernel_v2\(.*shared memory "
                                         r"[\d,]+ B .* > 101,376 B"):
        require_fit(report, "sglang-0.5.16")

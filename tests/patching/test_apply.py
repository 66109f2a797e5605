"""The seed patch on the real upstream releases, and the series' all-or-nothing rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder import BuilderError, load_targets
from builder.core.cache import Cache
from builder.patching.apply import PatchStatus, apply_series, plan_series
from builder.patching.hunks import HunkStatus
from builder.patching.series import Series, load_series
from builder.source.fetch import fetch_source, local_source
from tests.helpers.paths import MODEL_RUNNER, REPO
from tests.helpers.project import git_source, patch_sha, target_toml
from tests.helpers.releases import UpstreamRepo

SERIES = REPO / "patches" / "series.toml"
SEED = REPO / "patches" / "0001-enable-flashinfer-cutlass-autotune.patch"


def _only_hunk(report):  # type: ignore[no-untyped-def]
    """The one patch of the shipped series that applies here, and its one hunk."""
    (patch,) = [p for p in report.patches if p.status != PatchStatus.NOT_APPLICABLE]
    (file,) = patch.files
    (hunk,) = file.hunks
    return patch, hunk


@pytest.mark.parametrize(("version", "status", "changed_line", "offset", "fuzz"), [
    ("0.5.9", HunkStatus.CLEAN, 1842, 0, 0),
    ("0.5.7", HunkStatus.OFFSET, 1691, -151, 0),
    ("0.5.10.post1", HunkStatus.FUZZ, 2078, 236, 1),
])
def test_seed_patch_on_real_releases(unpacked: dict[str, Path], version: str,
                                     status: HunkStatus, changed_line: int, offset: int,
                                     fuzz: int) -> None:
    report, changes = plan_series(local_source(unpacked[version]), load_series(SERIES))
    patch, hunk = _only_hunk(report)
    assert patch.status == PatchStatus.APPLIED
    assert (hunk.status, hunk.changed_line, hunk.offset, hunk.fuzz) == \
        (status, changed_line, offset, fuzz)
    new_text = changes.files[MODEL_RUNNER].decode().splitlines()
    assert new_text[changed_line - 1] == '            "flashinfer_cutlass",'
    (intent,) = report.intents
    assert intent.holds and not intent.held_before
    assert f"line {changed_line}" in intent.detail


def test_series_says_why_0_5_10_post1_needs_fuzz(unpacked: dict[str, Path]) -> None:
    report, _ = plan_series(local_source(unpacked["0.5.10.post1"]), load_series(SERIES))
    patch, _ = _only_hunk(report)
    assert patch.max_fuzz == 1
    assert "flashinfer_trtllm_routed" in patch.fuzz_reason


def test_default_policy_refuses_fuzz(unpacked: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.10.post1"], tree)
    before = (tree / MODEL_RUNNER).read_bytes()
    series = Series.single(SEED)  # no allowance: fuzz 0
    with pytest.raises(BuilderError, match=r"needs fuzz 1, the series allows 0") as caught:
        apply_series(local_source(tree), series, in_place=True)
    hunk = caught.value.report.to_json()["patches"][0]["files"][0]["hunks"][0]
    assert (hunk["status"], hunk["fuzz"], hunk["changed_line"]) == ("failed", 1, 2078)
    assert (tree / MODEL_RUNNER).read_bytes() == before


def test_already_patched_tree_reports_already_applied(unpacked: dict[str, Path],
                                                      tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.9"], tree)
    apply_series(local_source(tree), load_series(SERIES), in_place=True)
    again = apply_series(local_source(tree), load_series(SERIES), dry_run=True)
    patch, hunk = _only_hunk(again.report)
    assert patch.status == PatchStatus.ALREADY_APPLIED
    assert (hunk.status, hunk.changed_line) == (HunkStatus.ALREADY_APPLIED, 1842)
    assert again.report.intents[0].held_before and again.report.ok


def test_intent_check_reads_the_syntax_tree_not_the_text(unpacked: dict[str, Path],
                                                         tmp_path: Path) -> None:
    # A patch that only rewrites the comment: "flashinfer_cutlass" appears in the text
    # of the function, but not as live code, so the intent check must fail.
    fake = SEED.read_text().replace('+            "flashinfer_cutlass",',
                                    '+            # "flashinfer_cutlass",  (enabled)')
    patch = tmp_path / "comment-only.patch"
    patch.write_text(fake)
    for shipped in (REPO / "patches").glob("*.patch"):
        shutil.copy(shipped, tmp_path)
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.9"], tree)
    series_file = tmp_path / "series.toml"
    series_file.write_text(SERIES.read_text().replace(
        "0001-enable-flashinfer-cutlass-autotune.patch", "comment-only.patch").replace(
        patch_sha(SEED.read_text()), patch_sha(fake)))
    before = (tree / MODEL_RUNNER).read_bytes()
    with pytest.raises(BuilderError, match=r"intent check .* failed"):
        apply_series(local_source(tree), load_series(series_file), in_place=True)
    assert (tree / MODEL_RUNNER).read_bytes() == before


def test_series_is_all_or_nothing(unpacked: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.9"], tree)
    broken = ("--- a/python/sglang/version.py\n+++ b/python/sglang/version.py\n"
              "@@ -1,1 +1,1 @@\n-this line is not in the file\n+replacement\n")
    (tmp_path / "0002-broken.patch").write_text(broken)
    for shipped in (REPO / "patches").glob("*.patch"):
        shutil.copy(shipped, tmp_path)
    series_file = tmp_path / "series.toml"
    series_file.write_text(SERIES.read_text().replace(
        'file = "0001', f'file = "{tmp_path}/0001').replace(
        'file = "0002', f'file = "{tmp_path}/0002').replace(
        'file = "0003', f'file = "{tmp_path}/0003') + f"""
[[patch]]
file = "0002-broken.patch"
sha256 = "{patch_sha(broken)}"
strip = 1
versions = ">=0.5"
""")
    snapshot = {p: p.read_bytes() for p in tree.rglob("*.py")}
    with pytest.raises(BuilderError, match=r"patch 0002-broken\.patch failed") as caught:
        apply_series(local_source(tree), load_series(series_file), in_place=True)
    statuses = [p["status"] for p in caught.value.report.to_json()["patches"]]
    # the seed patch, its 0.5.11 copy and the SM12x patches (not for 0.5.9), then ours
    shipped = load_series(REPO / "patches" / "series.toml").entries
    assert statuses == ["applied", *["not-applicable"] * (len(shipped) - 1), "failed"]
    assert {p: p.read_bytes() for p in tree.rglob("*.py")} == snapshot


def test_patched_copy_goes_to_the_cache_not_the_source(unpacked: dict[str, Path],
                                                       tmp_path: Path) -> None:
    source = local_source(unpacked["0.5.9"])
    original = (source.tree / MODEL_RUNNER).read_bytes()
    result = apply_series(source, load_series(SERIES), cache=Cache(tmp_path / "cache"))
    assert result.tree != source.tree
    assert (source.tree / MODEL_RUNNER).read_bytes() == original
    assert b'            "flashinfer_cutlass",\n' in (result.tree / MODEL_RUNNER).read_bytes()
    again = apply_series(source, load_series(SERIES), cache=Cache(tmp_path / "cache"))
    assert again.tree == result.tree and again.key == result.key


def test_version_outside_range_is_not_applicable(unpacked: dict[str, Path],
                                                 tmp_path: Path) -> None:
    series_file = tmp_path / "series.toml"
    series_file.write_text(SERIES.read_text().replace(
        'file = "0', f'file = "{REPO}/patches/0').replace(
        'versions = ">=0.5.7,<0.5.11"', 'versions = ">=0.6"'))
    report, changes = plan_series(local_source(unpacked["0.5.9"]), load_series(series_file))
    assert report.patches[0].status == PatchStatus.NOT_APPLICABLE and changes.files == {}


def test_git_layout_from_a_local_repository(upstream_repo: UpstreamRepo,
                                            tmp_path: Path) -> None:
    targets_file = tmp_path / "targets.toml"
    targets_file.write_text(target_toml(
        "git-0.5.7", "0.5.7", git_source(upstream_repo.path, upstream_repo.commits["0.5.7"]),
        series=str(SERIES)))
    target = load_targets(targets_file).get("git-0.5.7")
    cache = Cache(tmp_path / "cache")
    source = fetch_source(target, cache=cache)
    assert source.layout.kind == "git"
    result = apply_series(source, load_series(SERIES), cache=cache)
    _, hunk = _only_hunk(result.report)
    assert (hunk.status, hunk.changed_line, hunk.offset) == (HunkStatus.OFFSET, 1691, -151)
    patched = (result.tree / "python" / MODEL_RUNNER).read_text().splitlines()
    assert patched[1690] == '            "flashinfer_cutlass",'
    assert not (result.tree / ".git").exists()

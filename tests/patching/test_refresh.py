"""refresh on the real releases: exact line numbers, zero fuzz, headers and pins kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.patching.apply import plan_series
from builder.patching.hunks import HunkStatus
from builder.patching.patchfile import parse_patch
from builder.patching.series import load_series
from builder.source.fetch import local_source
from tests.helpers.cli import run_cli
from tests.helpers.paths import MODEL_RUNNER, REPO
from tests.helpers.project import write_project

SEED = "0001-enable-flashinfer-cutlass-autotune.patch"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One builder cache for this file's runs: each unpacks the same sdists, keyed by content."""
    return tmp_path_factory.mktemp("refresh-cache")


@pytest.fixture
def project_0510(sdists: dict[str, Path], tmp_path: Path) -> Path:
    return write_project(tmp_path / "p", sdist=sdists["0.5.10.post1"], version="0.5.10.post1")


def test_fuzzed_hunk_needs_accept_fuzz(project_0510: Path, cache: Path) -> None:
    before = (project_0510 / "patches" / SEED).read_bytes()
    done = run_cli("refresh", cwd=project_0510, cache=cache)
    assert done.returncode == 5
    assert "pass --accept-fuzz" in done.stderr
    assert (project_0510 / "patches" / SEED).read_bytes() == before


def test_refresh_with_accept_fuzz(project_0510: Path, unpacked: dict[str, Path],
                                  cache: Path) -> None:
    done = run_cli("refresh", "--accept-fuzz", "--json", cwd=project_0510,
                   cache=cache)
    assert done.returncode == 0, done.stderr
    (seed, *later) = json.loads(done.stdout)["patches"]
    assert seed["status"] == "refreshed"
    assert {p["status"] for p in later} == {"not-applicable"}  # 0.5.11 copy, SM12x patches
    (fuzzed,) = seed["fuzzed"]
    assert fuzzed["fuzz"] == 1
    assert fuzzed["before"].startswith("@@ -1839,7 +1839,7 @@")
    assert fuzzed["after"].startswith("@@ -2075,7 +2075,7 @@")
    patch = project_0510 / "patches" / SEED
    text = patch.read_text()
    assert "Subject: [PATCH] model_runner: run FlashInfer autotune" in text  # header kept
    assert seed["new_sha256"] in (project_0510 / "patches" / "series.toml").read_text()
    series = load_series(project_0510 / "patches" / "series.toml")
    report, _ = plan_series(local_source(unpacked["0.5.10.post1"]), series)
    hunk = report.patches[0].files[0].hunks[0]
    assert (hunk.status, hunk.line, hunk.offset, hunk.fuzz, hunk.changed_line) == \
        (HunkStatus.CLEAN, 2075, 0, 0, 2078)
    # deterministic: a second refresh changes nothing
    again = run_cli("refresh", "--json", cwd=project_0510, cache=cache)
    assert json.loads(again.stdout)["patches"][0]["status"] == "unchanged"
    assert patch.read_text() == text


def test_refresh_output_is_stable_git_style(sdists: dict[str, Path], tmp_path: Path,
                                            cache: Path) -> None:
    project = write_project(tmp_path / "p", sdist=sdists["0.5.7"], version="0.5.7")
    out = tmp_path / "out"
    done = run_cli("refresh", "--output-dir", str(out), cwd=project, cache=cache)
    assert done.returncode == 0, done.stderr
    text = (out / SEED).read_text()
    body = text[text.index("diff --git"):]
    assert body.splitlines()[:4] == [
        f"diff --git a/python/{MODEL_RUNNER} b/python/{MODEL_RUNNER}",
        f"--- a/python/{MODEL_RUNNER}", f"+++ b/python/{MODEL_RUNNER}",
        "@@ -1688,7 +1688,7 @@ class ModelRunner(ModelRunnerKVCacheMixin):"]
    # the series and the original patch are left alone with --output-dir
    assert (project / "patches" / SEED).read_bytes() == (REPO / "patches" / SEED).read_bytes()
    (hunk,) = parse_patch(out / SEED, 1).files[0].hunks
    assert hunk.source_start == 1688


def test_shipped_patch_is_already_exact_for_0_5_9(shared_cache: Path) -> None:
    done = run_cli("refresh", "--dry-run", "--json", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["patches"][0]["status"] == "unchanged"


def test_in_place_refresh_refuses_to_break_other_targets(sdists: dict[str, Path],
                                                          tmp_path: Path, cache: Path) -> None:
    from tests.helpers.project import sdist_source, target_toml

    other = target_toml("t-0.5.9", "0.5.9", sdist_source("0.5.9", sdists["0.5.9"]))
    project = write_project(tmp_path / "p", sdist=sdists["0.5.10.post1"],
                            version="0.5.10.post1", extra_target=other)
    before = (project / "patches" / SEED).read_bytes()
    done = run_cli("refresh", "--accept-fuzz", cwd=project, cache=cache)
    assert done.returncode == 5
    assert f"{SEED} also applies to t-0.5.9" in " ".join(done.stderr.split())
    assert (project / "patches" / SEED).read_bytes() == before
    out = tmp_path / "copies"
    done = run_cli("refresh", "--accept-fuzz", "--output-dir", str(out), cwd=project,
                   cache=cache)
    assert done.returncode == 0, done.stderr
    assert (out / SEED).is_file()

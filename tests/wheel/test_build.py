"""Wheel stage: version, byte-for-byte reproducibility, provenance readable after install."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import venv
import zipfile
from pathlib import Path

import git
import pytest

from builder import Options
from builder.patching.series import load_series
from builder.wheel.build import PROVENANCE_FILE, run_wheel
from tests.helpers.paths import MODEL_RUNNER, REPO
from tests.helpers.project import git_source, target_toml, write_project
from tests.helpers.releases import RELEASES, UpstreamRepo

pytestmark = pytest.mark.slow(reason="builds the 0.5.9 wheel from scratch four times")

WHEEL = "sglang-0.5.9+sm120.7-py3-none-any.whl"


@pytest.fixture(scope="module")
def two_builds(sdists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Path, Path, Path]:
    """The 0.5.9 wheel built twice from scratch (separate caches and dist folders)."""
    project = write_project(tmp_path_factory.mktemp("project"), sdist=sdists["0.5.9"])
    wheels = []
    for run in ("first", "second"):
        result = run_wheel(Options(targets_file=project / "targets.toml",
                                   cache_dir=project / f"cache-{run}",
                                   dist_dir=project / f"dist-{run}"))
        assert not result.cached
        wheels.append(result.path)
    return project, wheels[0], wheels[1]


def test_wheel_name_and_metadata_version(two_builds: tuple[Path, Path, Path]) -> None:
    _, wheel, _ = two_builds
    assert wheel.name == WHEEL
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("sglang-0.5.9+sm120.7.dist-info/METADATA").decode()
        version_py = archive.read("sglang/_version.py").decode()
    assert "\nVersion: 0.5.9+sm120.7\n" in metadata
    assert "0.5.9+sm120.7" in version_py


def test_two_builds_are_byte_identical(two_builds: tuple[Path, Path, Path]) -> None:
    _, first, second = two_builds
    assert first.read_bytes() == second.read_bytes()
    # Equal bytes could hide a clock-based stamp (zip times have 2 s resolution): every
    # entry, RECORD included, must carry the release time, 2026-02-23 (the sdist's newest
    # member), not the build time.
    with zipfile.ZipFile(first) as archive:
        stamps = {info.date_time[:3] for info in archive.infolist()}
    assert stamps == {(2026, 2, 23)}


def test_record_covers_the_provenance_file(two_builds: tuple[Path, Path, Path]) -> None:
    _, wheel, _ = two_builds
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("sglang-0.5.9+sm120.7.dist-info/RECORD").decode()
    assert f"sglang-0.5.9+sm120.7.dist-info/{PROVENANCE_FILE},sha256=" in record


@pytest.mark.slow(reason="installs the wheel into a fresh venv")
def test_installed_wheel_reports_provenance_and_patched_line(
        two_builds: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, wheel, _ = two_builds
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
                   check=True)
    probe = f"""
import importlib.metadata as md, json, pathlib
dist = md.distribution("sglang")
record = json.loads(dist.read_text({PROVENANCE_FILE!r}))
runner = pathlib.Path(dist.locate_file({MODEL_RUNNER!r})).read_text().splitlines()
print(json.dumps({{"version": dist.version, "record": record, "line": runner[1841]}}))
"""
    done = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True,
                          cwd=tmp_path)
    seen = json.loads(done.stdout)
    assert seen["version"] == "0.5.9+sm120.7"
    assert seen["line"] == '            "flashinfer_cutlass",'
    record = seen["record"]
    assert record["upstream"]["sha256"] == RELEASES["0.5.9"].sha256
    patch, *later = record["patches"]
    # the copy refreshed for 0.5.11 and the SM12x patches (0.5.13 on)
    shipped = load_series(REPO / "patches" / "series.toml").entries
    assert {p["status"] for p in later} == {"not-applicable"} and \
        len(later) == len(shipped) - 1
    assert patch["name"] == "0001-enable-flashinfer-cutlass-autotune.patch"
    seed = REPO / "patches" / patch["name"]
    assert patch["sha256"] == hashlib.sha256(seed.read_bytes()).hexdigest()
    hunk = patch["files"][0]["hunks"][0]
    assert (hunk["status"], hunk["changed_line"]) == ("clean", 1842)
    assert record["builder"]["version"]
    assert record["build_requirements"]["setuptools"]
    assert record["intents"][0]["holds"] is True


def test_rebuild_with_nothing_changed_comes_from_the_cache(
        two_builds: tuple[Path, Path, Path]) -> None:
    project, first, _ = two_builds
    again = run_wheel(Options(targets_file=project / "targets.toml",
                              cache_dir=project / "cache-first",
                              dist_dir=project / "dist-again"))
    assert again.cached
    assert again.path.read_bytes() == first.read_bytes()


def test_build_uses_a_pristine_copy(two_builds: tuple[Path, Path, Path]) -> None:
    project, _, _ = two_builds
    patched = list((project / "cache-first" / "patched").glob("*/tree"))
    assert patched and not list(patched[0].glob("build")) and \
        not (patched[0] / "dist").exists()


def test_wheel_from_a_git_pin(upstream_repo: UpstreamRepo, tmp_path: Path) -> None:
    commit = upstream_repo.commits["0.5.10.post1"]
    targets = tmp_path / "targets.toml"
    targets.write_text(target_toml("git", "0.5.10.post1", git_source(upstream_repo.path, commit),
                                   series=str(REPO / "patches" / "series.toml"),
                                   label="sm120.3"))
    result = run_wheel(Options(targets_file=targets, cache_dir=tmp_path / "cache",
                               dist_dir=tmp_path / "dist"))
    assert result.path.name == "sglang-0.5.10.post1+sm120.3-py3-none-any.whl"
    assert result.provenance["upstream"] == {"kind": "git", "url": str(upstream_repo.path),
                                             "commit": commit}
    committed = git.Repo(upstream_repo.path).commit(commit).committed_date
    assert result.provenance["source_date_epoch"] == committed
    hunk = result.provenance["patches"][0]["files"][0]["hunks"][0]
    assert (hunk["status"], hunk["fuzz"], hunk["changed_line"]) == ("fuzz", 1, 2078)
    with zipfile.ZipFile(result.path) as archive:
        runner = archive.read(MODEL_RUNNER).decode().splitlines()
        assert runner[2077] == '            "flashinfer_cutlass",'
        assert time.gmtime(committed)[:6] == archive.getinfo(MODEL_RUNNER).date_time

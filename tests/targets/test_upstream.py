"""The upstream check against a real simple index on 127.0.0.1 serving the real SGLang
files (PEP 691 JSON and PEP 503 HTML pages, with PEP 592 yanks): which releases are
newer than the newest target, and what the series does on them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from builder.source.fetch import IndexRelease, list_releases
from builder.targets.upstream import Skipped, newer_releases
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import target_toml
from tests.helpers.releases import MATRIX_RELEASES, RELEASES
from tests.helpers.serve import serve_directory

SEED = "0001-enable-flashinfer-cutlass-autotune.patch"
SEED_0511 = "0001-enable-flashinfer-cutlass-autotune-0.5.11.patch"
ALL = {**RELEASES, **MATRIX_RELEASES}


@pytest.fixture(scope="module")
def upstream_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One builder cache for this file's runs: each unpacks the same releases, by content."""
    return tmp_path_factory.mktemp("upstream-cache")


def _write_index(root: Path, files: dict[str, Path], *, fmt: str,
                 yanked: frozenset[str] = frozenset()) -> None:
    """A static simple index: ``simple/sglang/index.html`` (JSON or HTML) and the files."""
    page = root / "simple" / "sglang"
    page.mkdir(parents=True)
    (root / "files").mkdir()
    entries = []
    for version, path in files.items():
        (root / "files" / path.name).symlink_to(path)
        entries.append((path.name, ALL[version].sha256, version in yanked))
    if fmt == "json":
        page.joinpath("index.html").write_text(json.dumps({
            "meta": {"api-version": "1.1"}, "name": "sglang",
            "files": [{"filename": name, "url": f"../../files/{name}",
                       "hashes": {"sha256": sha}, "yanked": is_yanked}
                      for name, sha, is_yanked in entries]}))
    else:
        anchors = "".join(
            f'<a href="../../files/{name}#sha256={sha}"'
            + (' data-yanked=""' if is_yanked else "") + f">{name}</a><br/>"
            for name, sha, is_yanked in entries)
        page.joinpath("index.html").write_text(f"<html><body>{anchors}</body></html>")


@pytest.fixture(scope="module")
def release_files(sdists: dict[str, Path], matrix_files: dict[str, Path]) -> dict[str, Path]:
    """version -> the real sdist or wheel (0.5.9 ... 0.5.16), verified by sha256."""
    wanted = ("0.5.9", "0.5.10rc0", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.16")
    return {v: {**sdists, **matrix_files}[v] for v in wanted}


@pytest.fixture(params=["json", "html"])
def simple_index(request: pytest.FixtureRequest, release_files: dict[str, Path],
                 tmp_path: Path) -> Iterator[str]:
    """The real files on a local index (both page formats); 0.5.16 is yanked."""
    _write_index(tmp_path / "index", release_files, fmt=request.param,
                 yanked=frozenset({"0.5.16"}))
    with serve_directory(tmp_path / "index", json_pages=request.param == "json") as url:
        yield f"{url}/simple"


def test_releases_are_read_from_the_file_names(simple_index: str) -> None:
    releases = list_releases("SGLang", simple_index)  # any spelling of the name
    assert [str(r.version) for r in releases] == [
        "0.5.9", "0.5.10rc0", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.16"]
    assert [str(r.version) for r in releases if r.yanked] == ["0.5.16"]
    assert all(r.files == 1 for r in releases)


def test_newer_releases_skip_yanked_and_pre_releases() -> None:
    listed = [IndexRelease(Version(v), 1, v == "0.5.14") for v in
              ("0.5.11", "0.5.12.post1", "0.5.13rc1", "0.5.13", "0.5.14", "0.5.15.dev0")]
    keep, skipped = newer_releases(listed, Version("0.5.12.post1"))
    assert keep == [Version("0.5.13")]
    assert skipped == [Skipped("0.5.13rc1", "pre-release"), Skipped("0.5.14", "yanked"),
                       Skipped("0.5.15.dev0", "pre-release")]
    keep, skipped = newer_releases(listed, Version("0.5.12.post1"), pre=True)
    assert keep == [Version("0.5.13rc1"), Version("0.5.13"), Version("0.5.15.dev0")]
    assert skipped == [Skipped("0.5.14", "yanked")]
    # a development release sorts before its final release
    assert newer_releases(listed, Version("0.5.14")) == ([], [Skipped("0.5.15.dev0",
                                                                      "pre-release")])
    assert newer_releases(listed, Version("0.5.15")) == ([], [])


@pytest.fixture(scope="module")
def json_index(release_files: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real files on a local PEP 691 index, nothing yanked."""
    root = tmp_path_factory.mktemp("index")
    _write_index(root, release_files, fmt="json")
    with serve_directory(root, json_pages=True) as url:
        yield f"{url}/simple"


def _project_0512(root: Path, wheel: Path, series: str | None = None) -> Path:
    """A project whose newest (only) target is 0.5.12.post1, with the shipped series (or
    ``series``)."""
    (root / "patches").mkdir(parents=True)
    for patch in (REPO / "patches").glob("*.patch"):
        (root / "patches" / patch.name).write_bytes(patch.read_bytes())
    (root / "patches" / "series.toml").write_text(
        series or (REPO / "patches" / "series.toml").read_text())
    source = (f'kind = "wheel"\nproject = "sglang"\nversion = "0.5.12.post1"\n'
              f'filename = "{wheel.name}"\nsha256 = "{ALL["0.5.12.post1"].sha256}"\n'
              f'url = "{wheel.as_uri()}"')
    (root / "targets.toml").write_text('default = "t"\n'
                                       + target_toml("t", "0.5.12.post1", source))
    return root


MOE = "0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass.patch"
MOE_0513 = "0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass-0.5.13.patch"
DSA = "0003-sm12x-dsa-backends-tilelang.patch"


def test_shipped_series_on_the_releases_after_the_newest_target(
        json_index: str, release_files: dict[str, Path], tmp_path: Path,
        upstream_cache: Path) -> None:
    project = _project_0512(tmp_path / "p", release_files["0.5.12.post1"])
    done = run_cli("upstream", "--json", "--index-url", json_index, cwd=project,
                   cache=upstream_cache)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["newest_target"] == "0.5.12.post1"
    assert report["new_versions"] == ["0.5.13", "0.5.16"]
    assert report["needs_refresh"] is False
    # 0.5.13 enabled the backend upstream; 0.5.16 moved the function: the 0.5.11 copy
    # is obsolete on both. The SM12x patches apply there, so both are patched.
    assert [(f["patch"], f["version"], f["action"]) for f in report["findings"]] == [
        (SEED_0511, "0.5.13", "obsolete"), (SEED_0511, "0.5.16", "obsolete")]
    assert report["unpatched"] == []
    cells = {p["name"]: p["cells"] for p in report["matrix"]["patches"]}
    assert cells[SEED]["0.5.13"]["status"] == "not-applicable"
    assert cells[SEED_0511]["0.5.16"] == {"status": "obsolete", "text": "obsolete",
                                          "intents_hold": True}
    assert cells[MOE]["0.5.13"]["status"] == "not-applicable"  # its 0.5.13 copy applies there
    assert cells[MOE_0513]["0.5.13"]["status"] in ("clean", "offset")
    assert cells[MOE_0513]["0.5.13"]["intents_hold"] is True
    assert cells[MOE]["0.5.16"] == {"status": "clean", "text": "clean", "intents_hold": True}
    assert cells[DSA]["0.5.13"]["status"] == "not-applicable"
    assert cells[DSA]["0.5.16"]["status"] == "clean"


def test_a_release_no_patch_changes_ships_upstreams_wheel(
        json_index: str, release_files: dict[str, Path], tmp_path: Path,
        upstream_cache: Path) -> None:
    # The series as it was before the SM12x patches: nothing changes 0.5.13 or 0.5.16.
    shipped = (REPO / "patches" / "series.toml").read_text()
    series = shipped.split('\n[[patch]]\nfile = "0002-')[0]
    project = _project_0512(tmp_path / "p", release_files["0.5.12.post1"], series)
    json_done = run_cli("upstream", "--json", "--index-url", json_index, cwd=project,
                        cache=upstream_cache)
    done = run_cli("upstream", "--format", "markdown", "--index-url", json_index,
                   cwd=project, cache=upstream_cache)
    assert json_done.returncode == 0 and done.returncode == 0, done.stderr
    assert json.loads(json_done.stdout)["unpatched"] == ["0.5.13", "0.5.16"]
    assert ("### Nothing to patch (a target pinned to it ships upstream's own wheel)\n\n"
            "- 0.5.13\n- 0.5.16") in done.stdout
    assert "would be refused" not in done.stdout


def test_markdown_report_for_a_job_summary(json_index: str, release_files: dict[str, Path],
                                           tmp_path: Path, upstream_cache: Path) -> None:
    project = _project_0512(tmp_path / "p", release_files["0.5.12.post1"])
    done = run_cli("upstream", "--format", "markdown", "--index-url", json_index,
                   cwd=project, cache=upstream_cache)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith(f"## Upstream check: `sglang` on {json_index}\n")
    assert "Newest target: 0.5.12.post1. Newer releases checked: 0.5.13, 0.5.16." in text
    assert "### Became obsolete (can end its version range)" in text
    assert f"- `{SEED_0511}` on 0.5.13, 0.5.16: its intent checks hold without it" in text
    assert "### Needs a refresh" not in text
    assert "| patch | 0.5.13 | 0.5.16 |" in text


def _project(root: Path, wheel: Path, series: str) -> Path:
    """A project whose newest (only) target is 0.5.11, with the given series."""
    (root / "patches").mkdir(parents=True)
    for patch in (REPO / "patches").glob("*.patch"):
        (root / "patches" / patch.name).write_bytes(patch.read_bytes())
    (root / "patches" / "series.toml").write_text(series)
    source = (f'kind = "wheel"\nproject = "sglang"\nversion = "0.5.11"\n'
              f'filename = "{wheel.name}"\nsha256 = "{ALL["0.5.11"].sha256}"\n'
              f'url = "{wheel.as_uri()}"')
    (root / "targets.toml").write_text('default = "t"\n' + target_toml("t", "0.5.11", source))
    return root


def test_a_patch_that_breaks_on_a_newer_release_needs_a_refresh(
        release_files: dict[str, Path], tmp_path: Path, upstream_cache: Path) -> None:
    # Only the 0.5.9 patch, declared for every later release: 0.5.11 added a line
    # inside its context, so on 0.5.12.post1 it needs fuzz 2, which it is not allowed.
    shipped = (REPO / "patches" / "series.toml").read_text()
    series = shipped.split(f'\n[[patch]]\nfile = "{SEED_0511}"')[0]
    series = series.replace('versions = ">=0.5.7,<0.5.11"', 'versions = ">=0.5.7"', 1)
    project = _project(tmp_path / "p", release_files["0.5.11"], series)
    _write_index(tmp_path / "index", release_files, fmt="html", yanked=frozenset({"0.5.16"}))
    with serve_directory(tmp_path / "index") as url:
        done = run_cli("upstream", "--json", "--index-url", f"{url}/simple", cwd=project,
                       cache=upstream_cache)
        markdown = run_cli("upstream", "--format", "markdown", "--index-url", f"{url}/simple",
                           cwd=project, cache=upstream_cache)
    assert done.returncode == 5, done.stderr
    out = json.loads(done.stdout)
    assert out["error"] == "the series needs a refresh for 0.5.12.post1"
    report = out["report"]
    assert report["new_versions"] == ["0.5.12.post1", "0.5.13"]
    assert report["skipped"] == [{"version": "0.5.16", "reason": "yanked"}]
    assert [(f["version"], f["action"], f["detail"]) for f in report["findings"]] == [
        ("0.5.12.post1", "refresh", "needs fuzz 2 (allowed 0)"),
        ("0.5.13", "obsolete", "its intent checks hold without it")]
    assert markdown.returncode == 5
    assert f"### Needs a refresh\n\n- `{SEED}` on 0.5.12.post1: needs fuzz 2 (allowed 0)" \
        in markdown.stdout
    assert "patch error: the series needs a refresh for 0.5.12.post1" in markdown.stderr
    assert "Traceback" not in markdown.stderr


def test_no_newer_release(release_files: dict[str, Path], tmp_path: Path,
                          upstream_cache: Path) -> None:
    files = {v: p for v, p in release_files.items() if Version(v) <= Version("0.5.12.post1")}
    _write_index(tmp_path / "index", files, fmt="json")
    with serve_directory(tmp_path / "index", json_pages=True) as url:
        done = run_cli("upstream", "--format", "markdown", "--index-url", f"{url}/simple",
                       cache=upstream_cache)
    assert done.returncode == 0, done.stderr
    assert "No release newer than the newest target (0.5.23)." in done.stdout  # targets.toml


def test_unreachable_index_is_one_clear_error(tmp_path: Path) -> None:
    done = run_cli("upstream", "--index-url", "http://127.0.0.1:9/simple",
                   cache=tmp_path / "cache", env={"PIP_RETRIES": "0"})  # no 15 s backoff
    assert done.returncode == 4
    assert "could not reach http://127.0.0.1:9/simple/sglang/" in done.stderr
    assert "Traceback" not in done.stderr

"""The compatibility matrix on the real releases: the seed patch (and its copy refreshed
for 0.5.11) across 0.5.7 ... 0.5.16, where upstream enabled the backend itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.cache import Cache
from builder.core.config import SdistPin, WheelPin
from builder.patching.matrix import Column, check_matrix
from builder.patching.series import load_series
from builder.source.fetch import fetch_pin
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.releases import MATRIX_RELEASES, RELEASES
from tests.helpers.targets import target_names

SEED = "0001-enable-flashinfer-cutlass-autotune.patch"
MOE = "0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass.patch"
DSA = "0003-sm12x-dsa-backends-tilelang.patch"
SEED_0511 = "0001-enable-flashinfer-cutlass-autotune-0.5.11.patch"


@pytest.fixture(scope="module")
def matrix(sdists: dict[str, Path], matrix_files: dict[str, Path],
           shared_cache: Path):  # type: ignore[no-untyped-def]
    # The cache kept between runs: the eight releases are unpacked once, not every run
    # (tests/source/test_fetch.py checks fetching into an empty cache).
    cache = Cache(shared_cache)
    columns = []
    files = {**sdists, **matrix_files}
    releases = {**RELEASES, **MATRIX_RELEASES}
    for version in sorted(files, key=Version):
        path, sha = files[version], releases[version].sha256
        pin = (SdistPin("sglang", version, sha, path.as_uri()) if path.name.endswith(".tar.gz")
               else WheelPin("sglang", version, path.name, sha, path.as_uri()))
        columns.append(Column(version, fetch_pin(pin, Version(version), cache=cache)))
    return check_matrix(load_series(REPO / "patches" / "series.toml"), columns)


def test_matrix_on_real_releases(matrix) -> None:  # type: ignore[no-untyped-def]
    cells = {(name, column.label): cell.text
             for name, row in zip(matrix.patches, matrix.cells, strict=True)
             for column, cell in zip(matrix.columns, row, strict=True)}
    assert [c.label for c in matrix.columns] == [
        "0.5.7", "0.5.9", "0.5.10rc0", "0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13",
        "0.5.16"]
    assert cells[SEED, "0.5.7"] == "offset -151"
    assert cells[SEED, "0.5.9"] == "clean"
    assert cells[SEED, "0.5.10rc0"] == "offset 141"
    assert cells[SEED, "0.5.10.post1"] == "fuzz 1 (allowed up to 1)"
    assert cells[SEED, "0.5.11"] == "not-applicable"
    assert cells[SEED_0511, "0.5.11"] == "clean"
    assert cells[SEED_0511, "0.5.12.post1"] == "offset 137"
    # 0.5.13 enabled the backend upstream; 0.5.16 moved and renamed the function:
    # obsolete, never a failure and never a change.
    assert cells[SEED_0511, "0.5.13"] == "obsolete"
    assert cells[SEED_0511, "0.5.16"] == "obsolete"
    # The SM12x patches: made on 0.5.16; the MoE one has a copy for 0.5.13.
    assert cells[MOE, "0.5.13"] == "not-applicable"
    assert cells["0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass-0.5.13.patch", "0.5.13"] \
        .startswith(("clean", "offset"))
    assert cells[MOE, "0.5.16"] == "clean"
    assert cells[MOE, "0.5.12.post1"] == "not-applicable"
    assert cells[DSA, "0.5.16"] == "clean"
    assert cells[DSA, "0.5.13"] == "not-applicable"
    for report in matrix.reports:
        assert report.ok
        assert all(i.holds for i in report.intents)
    obsolete = matrix.reports[-1]
    assert obsolete.intents[0].held_before
    assert "runner/flashinfer_autotune.py" in obsolete.intents[0].detail


def test_matrix_markdown_and_json(matrix) -> None:  # type: ignore[no-untyped-def]
    markdown = matrix.to_markdown()
    assert markdown.startswith("| patch | 0.5.7 | 0.5.9 |")
    assert f"| `{SEED_0511}` |" in markdown and "obsolete ✓" in markdown
    data = json.loads(matrix.dumps())
    assert data["broken_targets"] == []
    seed = next(p for p in data["patches"] if p["name"] == SEED)
    assert seed["cells"]["0.5.9"] == {"status": "clean", "text": "clean", "intents_hold": True}


def test_check_command_on_the_targets(shared_cache: Path) -> None:
    done = run_cli("matrix", "--json", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [c["target"] for c in data["columns"]] == target_names()  # targets.toml's order
    assert data["broken_targets"] == []
    cells = {p["name"]: p["cells"] for p in data["patches"]}
    # the whole series over every target, the two written by bump included
    assert cells[MOE]["0.5.16"]["text"] == "clean"
    assert cells[MOE]["0.5.23"]["status"] == "not-applicable"  # its 0.5.23 copy applies
    assert cells["0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass-0.5.23.patch"]["0.5.23"][
        "status"] in ("clean", "offset")
    assert cells[DSA]["0.5.16"]["text"] == "clean"
    assert cells["0003-sm12x-dsa-backends-tilelang-0.5.23.patch"]["0.5.23"]["text"] == "clean"
    assert all(cell["intents_hold"] is not False for row in cells.values()
               for cell in row.values())


def test_matrix_exits_5_when_a_target_would_break(sdists: dict[str, Path],
                                                  tmp_path: Path) -> None:
    from tests.helpers.project import write_project

    series = (REPO / "patches" / "series.toml").read_text().replace(
        'max_fuzz = 1\nreason', 'max_fuzz = 0\nreason')  # withdraw the 0.5.10 allowance
    project = write_project(tmp_path / "p", sdist=sdists["0.5.10.post1"],
                            version="0.5.10.post1", series=series)
    done = run_cli("matrix", "--format", "markdown", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 5  # a patch error, as docs/patches.md says
    assert "needs fuzz 1 (allowed 0)" in done.stdout
    assert "the series would break: t" in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--versions", "notaversion"], "'notaversion' is not a PEP 440 version"),
    (["--commits", "v0.5.9"], "'v0.5.9' is not a full 40-hex commit id"),
])
def test_check_refuses_malformed_columns(args: list[str], message: str, tmp_path: Path) -> None:
    done = run_cli("matrix", *args, cache=tmp_path / "cache")
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_check_usage_errors() -> None:
    done = run_cli("matrix", "--versions", "0.5.9", "--commits", "a" * 40)
    assert done.returncode == 2 and "not allowed with" in done.stderr
    assert run_cli("matrix", "--git-url", "/tmp/x").returncode == 2
    assert run_cli("matrix", "--versions", "").returncode == 2


def test_check_commits_are_judged_at_their_version(upstream_repo, tmp_path: Path  # type: ignore[no-untyped-def]
                                                   ) -> None:
    commit = upstream_repo.commits["0.5.10.post1"]
    done = run_cli("matrix", "--json", "--git-url", str(upstream_repo.path), "--commits",
                   f"{commit}=0.5.10.post1", cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    seed = json.loads(done.stdout)["patches"][0]
    cell = seed["cells"][f"{commit[:12]} (0.5.10.post1)"]
    assert cell["text"] == "fuzz 1 (allowed up to 1)"

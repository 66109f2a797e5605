"""A target no patch of the series changes ships upstream's own wheel: the real 0.5.13
wheel, sha256-pinned and unrenamed, with the provenance record beside it (the series as
it was before the SM12x patches: the 0.5.11 patch is obsolete there)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.releases import MATRIX_RELEASES

MOE = "0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass.patch"


def _project(root: Path, wheel: Path, sha256: str, version: str) -> Path:
    (root / "patches").mkdir(parents=True)
    for patch in (REPO / "patches").glob("*.patch"):
        (root / "patches" / patch.name).write_bytes(patch.read_bytes())
    shipped = (REPO / "patches" / "series.toml").read_text()
    (root / "patches" / "series.toml").write_text(
        shipped.split('\n[[patch]]\nfile = "0002-')[0])
    (root / "targets.toml").write_text(f"""
[[target]]
name = "t"
upstream_version = "{version}"
local_label = "sm120.1"
series = "patches/series.toml"
cuda_lane = "13.0"
arch_list = ["12.0f"]

[[target.source]]
kind = "wheel"
project = "sglang"
version = "{version}"
filename = "{wheel.name}"
sha256 = "{sha256}"
url = "{wheel.as_uri()}"
""")
    return root


def test_unpatched_release_ships_upstreams_wheel(matrix_files: dict[str, Path],
                                                 tmp_path: Path) -> None:
    wheel = matrix_files["0.5.13"]
    project = _project(tmp_path / "p", wheel, MATRIX_RELEASES["0.5.13"].sha256, "0.5.13")
    done = run_cli("wheel", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    out = project / "dist" / wheel.name  # upstream's name: no local label
    assert sorted(p.name for p in (project / "dist").iterdir()) == [
        wheel.name, wheel.name + ".sm120-provenance.json"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == MATRIX_RELEASES["0.5.13"].sha256
    record = json.loads((project / "dist" / (wheel.name + ".sm120-provenance.json")).read_text())
    assert record["wheel"] == "upstream" and record["version"] == "0.5.13"
    assert record["upstream"]["sha256"] == MATRIX_RELEASES["0.5.13"].sha256
    assert [p["status"] for p in record["patches"]] == ["not-applicable", "obsolete"]
    (result,) = json.loads(done.stdout)["wheels"]
    assert result["version"] == "0.5.13" and result["path"].endswith(wheel.name)


def test_unpatched_sdist_release_is_still_refused(sdists: dict[str, Path],
                                                  tmp_path: Path) -> None:
    # 0.5.9 with a series that has nothing for it: no released wheel to ship instead
    from tests.helpers.releases import RELEASES

    project = _project(tmp_path / "p", sdists["0.5.9"], RELEASES["0.5.9"].sha256, "0.5.9")
    text = (project / "targets.toml").read_text()
    text = text.replace('kind = "wheel"', 'kind = "sdist"').replace(
        f'filename = "{sdists["0.5.9"].name}"\n', "")
    (project / "targets.toml").write_text(text)
    series = (project / "patches" / "series.toml").read_text()
    (project / "patches" / "series.toml").write_text(
        series.replace('versions = ">=0.5.7,<0.5.11"', 'versions = ">=0.5.10,<0.5.11"', 1))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 6
    assert "no patch of the series changes upstream 0.5.9" in done.stderr
    assert not (project / "dist").exists()

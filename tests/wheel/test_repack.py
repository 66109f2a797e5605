"""Releases without an sdist: the real 0.5.11 wheel patched and repacked."""

from __future__ import annotations

import hashlib
import json
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.metadata import Metadata
from wheel.wheelfile import WheelFile

from builder import BuilderError, Options, run_wheels
from tests.helpers.cli import run_cli
from tests.helpers.paths import MODEL_RUNNER
from tests.helpers.project import write_project
from tests.helpers.releases import MATRIX_RELEASES

NAME = "sglang-0.5.11+sm120.7-cp311-cp311-manylinux_2_34_x86_64.whl"


def _one_patch_series(name: str, text: str) -> str:
    return f"""
[[patch]]
file = "{name}"
sha256 = "{hashlib.sha256(text.encode()).hexdigest()}"
strip = 1
versions = ">=0.5.11"
"""


def _project(root: Path, wheel: Path, series: str | None = None) -> Path:
    project = write_project(root, version="0.5.11", series=series)
    targets = (project / "targets.toml").read_text()
    targets = targets[:targets.index("[[target.source]]")] + f"""
[[target.source]]
kind = "wheel"
project = "sglang"
version = "0.5.11"
filename = "{wheel.name}"
sha256 = "{MATRIX_RELEASES['0.5.11'].sha256}"
url = "{wheel.as_uri()}"
"""
    (project / "targets.toml").write_text(targets.replace('prefer = "sdist"', ""))
    return project


@pytest.fixture(scope="module")
def repacked(matrix_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, Path, Path]:
    """(upstream wheel, repack, a second repack from a fresh cache)."""
    project = _project(tmp_path_factory.mktemp("p"), matrix_files["0.5.11"])
    wheels = []
    for run in ("a", "b"):
        (result,) = run_wheels(Options(targets_file=project / "targets.toml",
                                       cache_dir=project / f"cache-{run}",
                                       dist_dir=project / f"dist-{run}"))
        wheels.append(result.path)
    return matrix_files["0.5.11"], wheels[0], wheels[1]


@pytest.mark.slow(reason="repacks the 0.5.11 wheel twice, from two empty caches")
def test_name_tags_and_metadata(repacked: tuple[Path, Path, Path]) -> None:
    upstream, wheel, _ = repacked
    assert wheel.name == NAME
    with zipfile.ZipFile(wheel) as new, zipfile.ZipFile(upstream) as old:
        assert new.read("sglang-0.5.11+sm120.7.dist-info/WHEEL") == \
            old.read("sglang-0.5.11.dist-info/WHEEL")
        metadata = Metadata.from_email(new.read("sglang-0.5.11+sm120.7.dist-info/METADATA"))
        original = Metadata.from_email(old.read("sglang-0.5.11.dist-info/METADATA"))
    assert str(metadata.version) == "0.5.11+sm120.7"
    assert metadata.requires_dist == original.requires_dist


@pytest.mark.slow(reason="repacks the 0.5.11 wheel twice, from two empty caches")
def test_repack_is_reproducible(repacked: tuple[Path, Path, Path]) -> None:
    _, first, second = repacked
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.slow(reason="repacks the 0.5.11 wheel twice, from two empty caches")
def test_record_matches_and_only_the_patch_differs(repacked: tuple[Path, Path, Path]) -> None:
    upstream, wheel, _ = repacked
    with WheelFile(wheel) as new:  # WheelFile checks each entry against RECORD on read
        contents = {name: new.read(name) for name in new.namelist()}
    with zipfile.ZipFile(upstream) as old:
        old_names = {n for n in old.namelist() if ".dist-info/" not in n
                     and not n.endswith("/")}  # directory entries carry no content
        differing = {name for name in old_names if contents[name] != old.read(name)}
    assert differing == {MODEL_RUNNER}
    assert {n for n in contents if ".dist-info/" not in n} == old_names
    runner = contents[MODEL_RUNNER].decode().splitlines()
    assert runner[2401] == '            "flashinfer_cutlass",'
    record = json.loads(contents["sglang-0.5.11+sm120.7.dist-info/sm120-provenance.json"])
    assert record["upstream"]["kind"] == "wheel"
    assert record["upstream"]["sha256"] == MATRIX_RELEASES["0.5.11"].sha256


@pytest.mark.slow(reason="installs two wheels into fresh venvs")
def test_installs_and_equals_upstream_but_the_patch(repacked: tuple[Path, Path, Path],
                                                    tmp_path: Path) -> None:
    upstream, wheel, _ = repacked
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    subprocess.run([env / "bin/python", "-m", "pip", "install", "--no-deps", "--quiet",
                    str(wheel)], check=True)
    probe = """
import importlib.metadata as md, json
dist = md.distribution("sglang")
print(json.dumps({"version": dist.version, "files": sorted(str(f) for f in dist.files),
                  "requires": dist.requires}))
"""
    seen = json.loads(subprocess.run([env / "bin/python", "-c", probe], check=True,
                                     capture_output=True, text=True, cwd=tmp_path).stdout)
    assert seen["version"] == "0.5.11+sm120.7"
    with zipfile.ZipFile(upstream) as old:
        package_files = {n for n in old.namelist() if ".dist-info/" not in n
                         and not n.endswith("/")}
        requires = Metadata.from_email(old.read("sglang-0.5.11.dist-info/METADATA"))
    installed = {f for f in seen["files"] if ".dist-info/" not in f
                 and "__pycache__" not in f and not f.startswith("../")}  # scripts
    assert installed == package_files
    assert len(seen["requires"]) == len(requires.requires_dist or [])


def test_patch_to_compiled_code_is_refused(matrix_files: dict[str, Path],
                                           tmp_path: Path) -> None:
    grpc = "python/sglang/srt/grpc/_core.cpython-311-x86_64-linux-gnu.so"
    text = f"--- a/{grpc}\n+++ b/{grpc}\n@@ -1 +1 @@\n-x\n+y\n"
    project = _project(tmp_path / "p", matrix_files["0.5.11"],
                       series=_one_patch_series("so.patch", text))
    (project / "patches" / "so.patch").write_text(text)
    with pytest.raises(BuilderError, match="compiled code or a build file") as caught:
        run_wheels(Options(targets_file=project / "targets.toml",
                           cache_dir=tmp_path / "cache", dist_dir=project / "dist"))
    assert "--source git" in caught.value.hint
    assert not (project / "dist").exists()


def test_shipped_wheel_only_target_builds(shared_cache: Path, tmp_path: Path) -> None:
    done = run_cli("wheel", "--target", "sglang-0.5.11", "--dist", str(tmp_path / "dist"),
                   "--json", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    names = sorted(Path(w["path"]).name for w in json.loads(done.stdout)["wheels"])
    assert names == ["sglang-0.5.11+sm120.1-cp311-cp311-manylinux_2_34_x86_64.whl",
                     "sglang-0.5.11+sm120.1-cp312-cp312-manylinux_2_34_x86_64.whl"]


def test_patch_to_wheel_metadata_is_refused(matrix_files: dict[str, Path],
                                            tmp_path: Path) -> None:
    path = "python/sglang-0.5.11.dist-info/INSTALLER"
    text = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+pip\n"
    project = _project(tmp_path / "p", matrix_files["0.5.11"],
                       series=_one_patch_series("m.patch", text))
    (project / "patches" / "m.patch").write_text(text)
    with pytest.raises(BuilderError, match=r"wheel metadata or a \.pth file"):
        run_wheels(Options(targets_file=project / "targets.toml",
                           cache_dir=tmp_path / "cache", dist_dir=project / "dist"))
    assert not (project / "dist").exists()


@pytest.mark.slow(reason="repacks the 0.5.11 wheel, then again from an edited cache")
def test_edited_cache_entry_is_never_shipped(matrix_files: dict[str, Path],
                                             tmp_path: Path) -> None:
    import shutil

    project = _project(tmp_path / "p", matrix_files["0.5.11"])
    options = Options(targets_file=project / "targets.toml", cache_dir=tmp_path / "cache",
                      dist_dir=project / "dist")
    run_wheels(options)
    (patched,) = (tmp_path / "cache" / "patched").glob("*/tree")
    with (patched / MODEL_RUNNER).open("a") as runner:
        runner.write("# edited in the cache\n")
    shutil.rmtree(tmp_path / "cache" / "wheel")
    with pytest.raises(BuilderError, match="was modified after it was made"):
        run_wheels(options)

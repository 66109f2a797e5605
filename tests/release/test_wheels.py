"""``release wheels --kernel-wheel``: the kernel stage's real 0.7.2 wheel pair (the
sm120f provider and the shim, from the test cache's kernel entries) published with the
0.5.23 sglang wheel to a real pypiserver, through the gates the sglang wheel goes through:
nothing uploaded before every check passed, the same name with other bytes refused, the
upload verified on the index, a second run finding them published."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli, run_cli_process
from tests.helpers.paths import REPO
from tests.helpers.project import project_0_5_23 as _project_0_5_23
from tests.helpers.services import PackageIndex, start_package_index

PROVIDER = "flashinfer_jit_cache_sm120f-0.7.2+sm120.1.cu130-py3-none-manylinux_2_28_x86_64.whl"
SHIM = "flashinfer_jit_cache-0.7.2+sm120.1.cu130-py3-none-manylinux_2_28_x86_64.whl"
SGLANG = "sglang-0.5.23+sm120.1-cp311-cp311-manylinux_2_34_x86_64.whl"


def _kernel_pair(shared_cache: Path, folder: Path) -> tuple[Path, Path]:
    """The provider and shim the kernel stage makes for 0.5.23's ``norm`` (a cache hit when
    tests/kernels/test_current_targets.py built them already; built now otherwise)."""
    done = run_cli_process("kernels", "build", "--target", "sglang-0.5.23", "--build-torch",
                           "torch==2.13.0", "--modules", "norm",
                           "--cache-dir", str(shared_cache), "--dist", str(folder), "--json")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    provider, shim = folder / PROVIDER, folder / SHIM
    assert provider.is_file() and shim.is_file(), sorted(p.name for p in folder.iterdir())
    return provider, shim


def _norm_target(project: Path) -> Path:
    """The project's 0.5.23 target made to ship ``norm`` alone, so the pair the tests build
    (``--modules norm``) is its kernel set, not a trial of it."""
    targets = project / "targets.toml"
    targets.write_text(targets.read_text().rstrip("\n") + '\n\n[target.kernels]\n'
                       'groups = ["norm"]\n')
    return project


def _publish(project: Path, cache: Path, index: PackageIndex, *args: str):
    return run_cli("release", "wheels", "--repository-url", index.url, "--json", *args,
                   cwd=project, cache=cache, env=index.env())


@pytest.mark.slow(reason="starts a pypiserver")
def test_kernel_wheel_pair_published_with_the_same_gates(
        package_index: PackageIndex, kernel_cache: Path, tmp_path: Path) -> None:
    provider, shim = _kernel_pair(kernel_cache, tmp_path / "kernels")
    cache = tmp_path / "cache"
    before = sorted(p.name for p in package_index.packages.iterdir())
    # For the repository's own 0.5.23 (the default module set) the norm pair is a trial
    # build: it carries the version but not the kernels, and is never published.
    done = _publish(_project_0_5_23(tmp_path / "repo-target"), cache, package_index,
                    "--gate", "build", "--kernel-wheel", str(provider), "--kernel-wheel",
                    str(shim))
    assert done.returncode == 7, done.stdout
    error = json.loads(done.stdout)["error"]
    assert "is a trial build of sglang-0.5.23" in error and "module groups norm" in error
    project = _norm_target(_project_0_5_23(tmp_path / "project"))
    # A shim alone is not a kernel build: refused before anything is built or uploaded.
    done = _publish(project, cache, package_index, "--gate", "build", "--kernel-wheel",
                    str(shim))
    assert done.returncode == 7, done.stdout
    assert "published only with its provider wheel" in json.loads(done.stdout)["error"]
    # Another label's kernels are not this target's.
    other = tmp_path / "kernels" / PROVIDER.replace("sm120.1", "sm120.9")
    shutil.copy(provider, other)
    done = _publish(project, cache, package_index, "--gate", "build", "--kernel-wheel",
                    str(other))
    assert done.returncode == 7 and "not a kernel wheel of this target" in done.stdout
    # The smoke gate wants a report that tested these kernels.
    done = _publish(project, cache, package_index, "--kernel-wheel", str(provider),
                    "--kernel-wheel", str(shim))
    assert done.returncode == 2 and "--smoke-report" in done.stdout  # a missing flag
    assert sorted(p.name for p in package_index.packages.iterdir()) == before
    assert not (project / "dist").exists()  # refused before the wheel stage ran
    # The build gate: all three published and verified on the index, then found there.
    args = ("--gate", "build", "--kernel-wheel", str(provider), "--kernel-wheel", str(shim))
    done = _publish(project, cache, package_index, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(p["name"], p["status"]) for p in json.loads(done.stdout)["published"]] == [
        (SGLANG, "published"), (PROVIDER, "published"), (SHIM, "published")]
    for wheel in (provider, shim):
        assert (package_index.packages / wheel.name).read_bytes() == wheel.read_bytes()
    done = _publish(project, cache, package_index, *args)
    assert done.returncode == 0, done.stdout
    assert [p["status"] for p in json.loads(done.stdout)["published"]] == [
        "already-published"] * 3


@pytest.mark.slow(reason="starts its own pypiserver")
def test_kernel_wheel_with_other_bytes_on_the_index_is_refused_and_nothing_uploaded(
        kernel_cache: Path, tmp_path: Path) -> None:
    provider, shim = _kernel_pair(kernel_cache, tmp_path / "kernels")
    project = _norm_target(_project_0_5_23(tmp_path / "project"))
    index = start_package_index(tmp_path / "index", credentials=("u", "p-5"))
    try:
        shutil.copy(REPO / "README.md", index.packages / SHIM)
        done = _publish(project, tmp_path / "cache", index, "--gate", "build",
                        "--kernel-wheel", str(provider), "--kernel-wheel", str(shim))
        assert done.returncode == 7, done.stdout
        assert "with other bytes" in done.stdout
        # Nothing half-published: neither sglang's wheel nor the provider went up.
        assert sorted(p.name for p in index.packages.iterdir()) == [SHIM]
        assert (index.packages / SHIM).read_bytes() == (REPO / "README.md").read_bytes()
    finally:
        index.stop()

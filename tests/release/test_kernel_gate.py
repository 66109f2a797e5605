"""The kernel-wheel gate (issue 38, class G): ``release wheels``, ``release image`` and
``image`` (whose tag is the release's) take only the target's own kernel wheels, built for
the FlashInfer its upstream source pins, of its own module set. Project: the real 0.5.9
sdist as target ``t`` (``flashinfer_python==0.6.3``, label ``sm120.7``, arch 12.0a);
nothing listens on the engine, registry and index ports, so a refusal must come first."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from builder.core.config import load_targets
from builder.core.errors import ConfigurationError
from builder.image.build import read_extra_wheel
from builder.kernels.build import DEFAULT_HEAD_DIMS
from builder.kernels.pins import default_groups
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import write_project

NOWHERE = "http://127.0.0.1:9/"
GROUPS = list(default_groups(("12.0a",)))


def kernel_wheel(folder: Path, version: str = "0.6.3+sm120.7.cu129", **change: Any) -> Path:
    """A jit-cache wheel of the kernel stage's shape (nothing compiled): by default the
    target's own, for 0.6.3; ``change`` replaces manifest fields (None drops one)."""
    manifest: dict[str, Any] = {
        "schema": 1, "target": "t", "flashinfer_version": "0.6.3", "version": version,
        "arch_list": ["12.0a"], "groups": GROUPS, "modules": [],
        "head_dims": list(DEFAULT_HEAD_DIMS) if "attention" in GROUPS else []}
    manifest.update(change)
    manifest = {k: v for k, v in manifest.items() if v is not None}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"flashinfer_jit_cache-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("flashinfer_jit_cache/__init__.py", "")
        archive.writestr("flashinfer_jit_cache/sm120-manifest.json", json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def project(sdists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project, one per module: its cache keeps the sdist fetched once."""
    root = write_project(tmp_path_factory.mktemp("gate") / "p", sdist=sdists["0.5.9"])
    shutil.copytree(REPO / "images", root / "images")
    # (a profile names its target: the copy is target t's)
    (root / "images/profiles/t.toml").write_text((root / "images/profiles/sglang-0.5.9.toml")
                                                  .read_text().replace('target = "sglang-0.5.9"',
                                                                       'target = "t"'))
    return root


def _error(done: Any) -> dict[str, Any]:
    assert done.stdout, done.stderr
    error: dict[str, Any] = json.loads(done.stdout)
    return error


def release_wheels(project: Path, kernel: Path) -> Any:
    return run_cli("--json", "release", "wheels", "--gate", "build", "--kernel-wheel",
                   str(kernel), "--repository-url", NOWHERE, cwd=project,
                   env={"SGLANG_SM120_CACHE": str(project / "cache")})


def image(project: Path, kernel: Path, command: tuple[str, ...] = ("image",)) -> Any:
    return run_cli("--json", *command, "--kernel-wheel", str(kernel), "--registry",
                   "127.0.0.1:9", *(["--gate", "static", "--repository-url", NOWHERE]
                                    if command[0] == "release" else []),
                   "--base-image", "127.0.0.1:9/base@sha256:" + "0" * 64,
                   cwd=project, env={"SGLANG_SM120_CACHE": str(project / "cache"),
                                     "DOCKER_HOST": "tcp://127.0.0.1:9"})


@pytest.mark.parametrize(("change", "wrong"), [
    ({"target": "sglang-0.5.16"}, "manifest target sglang-0.5.16 (this release: t)"),
    ({"target": None}, "manifest target none (this release: t)"),
    ({"flashinfer_version": "0.6.14"},
     "manifest FlashInfer 0.6.14 (t pins flashinfer_python 0.6.3)"),
])
def test_release_wheels_refuses_another_targets_or_flashinfers_kernel_wheel(
        project: Path, tmp_path: Path, change: dict[str, Any], wrong: str) -> None:
    kernel = kernel_wheel(tmp_path / "k", **change)
    done = release_wheels(project, kernel)
    error = _error(done)
    assert done.returncode == 2, error
    assert error["error"] == f"{kernel.name} is not t's kernel wheel: {wrong}"
    assert error["hint"] == "build the target's own: python -m builder kernels build --target t"
    assert not (project / "dist").exists()  # refused before any build


def test_a_kernel_wheel_of_another_flashinfer_version_is_refused(project: Path,
                                                                 tmp_path: Path) -> None:
    # Case 36's wheel: another target's, for FlashInfer 0.6.14, under this target's label.
    kernel = kernel_wheel(tmp_path / "k", "0.6.14+sm120.7.cu129", target="sglang-0.5.16",
                          flashinfer_version="0.6.14")
    error = _error(done := release_wheels(project, kernel))
    assert done.returncode == 2
    assert error["error"] == (
        f"{kernel.name} is not t's kernel wheel: version 0.6.14+sm120.7.cu129 (FlashInfer "
        "0.6.3 loads only 0.6.3+...); manifest target sglang-0.5.16 (this release: t); "
        "manifest FlashInfer 0.6.14 (t pins flashinfer_python 0.6.3)")


@pytest.mark.parametrize("command", [("image",), ("release", "image")])
def test_an_image_tagged_as_the_release_takes_no_trial_or_foreign_kernels(
        project: Path, tmp_path: Path, command: tuple[str, ...]) -> None:
    trial = kernel_wheel(tmp_path / "trial", groups=["norm"], head_dims=[])
    done = image(project, trial, command)
    error = _error(done)
    assert error["error"].startswith(f"{trial.name} is a trial build of t, not its kernels: "
                                     "module groups norm"), error
    assert "python -m builder kernels build --target t" in error["hint"]
    # image publishes nothing: bad input; the release paths keep their publish status.
    assert done.returncode == (2 if command == ("image",) else 7)
    foreign = kernel_wheel(tmp_path / "foreign", target="sglang-0.5.16")
    done = image(project, foreign, command)
    error = _error(done)
    assert done.returncode == 2 and error["error"] == \
        f"{foreign.name} is not t's kernel wheel: manifest target sglang-0.5.16 (this " \
        "release: t)"


def test_a_shim_is_judged_by_its_version(tmp_path: Path) -> None:
    """A shim has no manifest: its version must still be the pinned FlashInfer's."""
    from packaging.version import Version

    from builder.image.kernel_gate import refuse_foreign_kernels

    target = load_targets(REPO / "targets.toml").get("sglang-0.5.23")
    shim = tmp_path / "flashinfer_jit_cache-0.7.1+sm120.1.cu130-py3-none-any.whl"
    with zipfile.ZipFile(shim, "w") as archive:
        archive.writestr("flashinfer_jit_cache/__init__.py", "")
    with pytest.raises(ConfigurationError, match=r"version 0\.7\.1\+sm120\.1\.cu130 "
                                                 r"\(FlashInfer 0\.7\.2 loads only"):
        refuse_foreign_kernels([read_extra_wheel(shim)], target, Version("0.7.2"))
    refuse_foreign_kernels([read_extra_wheel(shim)], target, Version("0.7.1"))

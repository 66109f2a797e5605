"""Kernel pins, the SM120 arch contract and the toolchain preflight, on the real
releases and the real nvcc at /usr/local/cuda (no GPU needed)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from builder import BuilderError, load_targets
from builder.kernels.pins import check_arch_list, kernel_wheel_version, read_pins
from builder.kernels.preflight import preflight
from builder.source.fetch import local_source
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.releases import Release
from tests.helpers.releases import download as _download

CURAND = Release("10.4.5.25", "22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529",
                 "https://files.pythonhosted.org/packages/12/63/636e5dc9afb2959bfc0042a357d5567358df829b66c96d9fc36d77dc0596/nvidia_curand-10.4.5.25-py3-none-manylinux_2_27_x86_64.whl")


@pytest.mark.parametrize(("version", "flashinfer", "kernel", "arch"), [
    ("0.5.7", "0.5.3", ("sgl-kernel", "0.3.20"), "12.0a"),
    ("0.5.9", "0.6.3", ("sgl-kernel", "0.3.21"), "12.0a"),
    ("0.5.10.post1", "0.6.7.post3", ("sglang-kernel", "0.4.1"), "12.0f"),
])
def test_pins_from_the_real_sdists(unpacked: dict[str, Path], version: str, flashinfer: str,
                                   kernel: tuple[str, str], arch: str) -> None:
    pins = read_pins(local_source(unpacked[version]))
    assert str(pins.flashinfer) == flashinfer and str(pins.flashinfer_cubin) == flashinfer
    assert pins.kernel == kernel and pins.torch == "torch==2.9.1"
    assert kernel_wheel_version(pins, "sm120.1") == f"{flashinfer}+sm120.1"
    target = next(t for t in load_targets(REPO / "targets.toml").targets.values()
                  if str(t.upstream_version) == version)
    assert check_arch_list(target.arch_list, pins) == arch  # the shipped targets agree


def test_pins_from_a_released_wheel(matrix_files: dict[str, Path], tmp_path: Path) -> None:
    with zipfile.ZipFile(matrix_files["0.5.11"]) as wheel:
        wheel.extractall(tmp_path / "w", [n for n in wheel.namelist() if ".dist-info/" in n])
    pins = read_pins(local_source(tmp_path / "w", "0.5.11"))
    assert str(pins.flashinfer) == "0.6.8.post1" and pins.torch == "torch==2.11.0"
    assert pins.kernel == ("sglang-kernel", "0.4.2")


def test_disagreeing_pins_are_refused(unpacked: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.9"], tree)
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"flashinfer_cubin==0.6.3"',
                                                       '"flashinfer_cubin==0.6.2"'))
    with pytest.raises(BuilderError, match=r"0\.6\.3 but flashinfer-cubin 0\.6\.2"):
        read_pins(local_source(tree))


def test_arch_contract(unpacked: dict[str, Path]) -> None:
    old = read_pins(local_source(unpacked["0.5.9"]))
    new = read_pins(local_source(unpacked["0.5.10.post1"]))
    with pytest.raises(BuilderError, match="without a suffix"):
        check_arch_list(("12.0",), old)
    with pytest.raises(BuilderError, match=r"detects an SM120 GPU as 12\.0f"):
        check_arch_list(("12.0a",), new)
    assert check_arch_list(("9.0a", "12.0a"), old) == "12.0a"


@pytest.mark.slow(reason="compiles CUDA code with nvcc")
def test_preflight_with_the_real_nvcc(nvcc: Path, tmp_path: Path) -> None:
    headers = tmp_path / "curand"
    with zipfile.ZipFile(_download(CURAND)) as wheel:
        wheel.extractall(headers, [n for n in wheel.namelist() if n.endswith("curand.h")])
    (include,) = {p.parent for p in headers.rglob("curand.h")}
    checks = {c.name: c for c in preflight(nvcc=nvcc, lane="13.0", arches=["12.0a", "12.0f"],
                                           include_dirs=[nvcc.parent.parent / "include",
                                                         include])}
    assert checks["nvcc"].ok and checks["nvcc"].detail.endswith("is CUDA 13.0, the lane is 13.0")
    assert checks["compile 12.0a"].ok and checks["compile 12.0f"].ok
    assert checks["curand.h"].ok and str(include) in checks["curand.h"].detail
    assert not checks["cublas_v2.h"].ok
    assert "install nvidia-cublas for CUDA 13.0" in checks["cublas_v2.h"].detail


@pytest.mark.slow(reason="compiles CUDA code with nvcc")
def test_preflight_refuses_another_lane_and_an_unknown_arch(nvcc: Path) -> None:
    checks = {c.name: c for c in preflight(nvcc=nvcc, lane="12.9", arches=["99.0a"],
                                           include_dirs=[])}
    assert not checks["nvcc"].ok and "CUDA 13.0" in checks["nvcc"].detail
    assert not checks["compile 99.0a"].ok


def test_preflight_command(shared_cache: Path) -> None:
    done = run_cli("preflight", "--target", "sglang-0.5.9", "--json", cache=shared_cache)
    assert done.returncode == 3  # the 0.5.9 lane is CUDA 12.9; this nvcc is 13.0
    data = json.loads(done.stdout)
    assert data["error"].startswith("toolchain preflight failed: nvcc:")
    report = data["report"]
    assert report["kernel_version"] == "0.6.3+sm120.1.cu129" and report["arch"] == "12.0a"


def test_the_lock_digest_changes_with_the_packer_and_the_build_scheme(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """One kernel version, one content: what the version lock records for a kernel wheel
    changes when the packer or the reproducible-build scheme changes, as it does when the
    request does (a builder that would make other bytes under the same version is refused)."""
    from builder.kernels import jitcache, reproducible
    from builder.kernels.request import KernelRequest
    from builder.kernels.run import kernel_content_digest

    saved = tmp_path / "request.json"
    done = run_cli("kernels", "plan", "--target", "sglang-0.5.9", "--modules", "norm",
                   "--output", str(saved))
    assert done.returncode == 0, done.stderr
    request = KernelRequest.from_json(json.loads(saved.read_text()))
    before = kernel_content_digest(request)
    assert kernel_content_digest(request) == before  # a digest, not a clock
    monkeypatch.setattr(reproducible, "SCHEME", reproducible.SCHEME + 1)
    assert kernel_content_digest(request) != before
    monkeypatch.undo()
    packer = tmp_path / "jitcache.py"
    packer.write_bytes(Path(jitcache.__file__).read_bytes() + b"\n# another layout\n")
    monkeypatch.setattr(jitcache, "__file__", str(packer))
    assert kernel_content_digest(request) != before


def test_preflight_with_a_missing_nvcc_is_a_missing_tool_before_any_download(
        tmp_path: Path) -> None:
    done = run_cli("preflight", "--target", "sglang-0.5.23", "--nvcc", str(tmp_path / "nvcc"),
                   "--json", cache=tmp_path / "cache")
    error = json.loads(done.stdout)
    assert (done.returncode, error["kind"]) == (3, "missing tool"), done.stdout
    assert error["error"] == f"no nvcc at {tmp_path / 'nvcc'}"
    assert not list((tmp_path / "cache").glob("downloads/*"))  # nothing fetched first


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
def test_save_request_never_replaces_a_link_a_folder_or_a_special_file(
        tmp_path: Path, kind: str) -> None:
    # A rename would replace any of them (a device such as /dev/full included) with a file.
    target = tmp_path / "elsewhere.json"
    target.write_text("mine")
    out = tmp_path / "request.json"
    {"fifo": lambda: os.mkfifo(out), "link": lambda: out.symlink_to(target),
     "folder": out.mkdir}[kind]()
    done = run_cli("kernels", "plan", "--target", "sglang-0.5.9", "--modules", "norm",
                   "--output", str(out), "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout)["error"].startswith(f"{out} is a")
    assert {"fifo": stat.S_ISFIFO, "link": stat.S_ISLNK, "folder": stat.S_ISDIR}[kind](
        out.lstat().st_mode)
    assert target.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "request.json"]

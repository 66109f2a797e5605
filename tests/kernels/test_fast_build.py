"""``kernels --fast-build``: TensorRT-LLM's FAST_BUILD for the CUTLASS fused MoE modules.

The request and its label on the real target, and the ninja graph that the real FlashInfer
0.6.3 (the default target's pin) writes for ``fused_moe_sm90`` through the builder's own
driver: without ``--fast-build`` no ``-DFAST_BUILD`` anywhere, with it in both the host and
the CUDA flags (FlashInfer's own ``use_fast_build`` reaches the host flags only).
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.core.cache import Cache
from builder.core.progress import Reporter
from builder.kernels.build import DRIVER, KernelRequest
from builder.kernels.request import KernelOptions
from builder.kernels.run import build_environment
from tests.helpers.cli import release_refused_before_any_work, run_cli
from tests.helpers.paths import REPO

TARGET = ["--target", "sglang-0.5.9", "--cuda-lane", "13.0", "--arch-list", "9.0a"]


def _save(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("kernels", "plan", *TARGET, *args, "--output", str(tmp_path / "r.json"))


def test_a_fast_build_has_its_own_version_and_says_so(tmp_path: Path,
                                                      shared_cache: Path) -> None:
    full = _save(tmp_path, "--modules", "fused_moe_sm90,trtllm_utils",
                 "--cache-dir", str(shared_cache))
    assert full.returncode == 0, full.stderr
    plain = json.loads((tmp_path / "r.json").read_text())
    fast = _save(tmp_path, "--modules", "fused_moe_sm90,trtllm_utils", "--fast-build",
                 "--cache-dir", str(shared_cache))
    assert fast.returncode == 0, fast.stderr
    request = json.loads((tmp_path / "r.json").read_text())
    assert plain["version"] == "0.6.3+sm120.1.cu130.sm90a" and "fast_build" not in plain
    assert request["version"] == "0.6.3+sm120.1.cu130.sm90a.fastbuild"
    assert request["fast_build"] is True
    assert KernelRequest.from_json(request).fast_build is True
    assert KernelRequest.from_json(plain).fast_build is False


def test_fast_build_without_a_fused_moe_group_is_refused(tmp_path: Path,
                                                         shared_cache: Path) -> None:
    done = _save(tmp_path, "--modules", "norm,trtllm_utils", "--fast-build",
                 "--cache-dir", str(shared_cache))
    assert done.returncode == 2
    assert "--fast-build changes only the fused MoE modules" in done.stderr
    assert "add a fused_moe_smNN group to --modules" in done.stderr
    assert not (tmp_path / "r.json").exists()


def _cuda_and_host_flags(env_python: Path, tmp_path: Path, fast: bool) -> tuple[str, str]:
    """The ``cuda_cflags`` and ``cflags`` blocks of fused_moe_90's build.ninja, as the
    driver has FlashInfer write it (steps mode: the graph is listed, nothing compiles)."""
    work = tmp_path / ("fast" if fast else "full")
    argument = json.dumps({"out": str(work / "out"), "groups": ["fused_moe_sm90"],
                           "head_dims": [], "steps": True, "fast_build": fast})
    done = subprocess.run([str(env_python), str(DRIVER), argument], capture_output=True,
                          text=True, check=False, timeout=600,
                          env={**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
                               "FLASHINFER_WORKSPACE_BASE": str(work)})
    assert done.returncode == 0, done.stderr[-2000:]
    steps = json.loads(done.stdout.strip().splitlines()[-1])["steps"]
    assert sum(1 for s in steps if s.startswith("fused_moe_90/")) > 100
    ninja = next(work.rglob("fused_moe_90/build.ninja")).read_text()
    blocks = {}
    for name in ("cflags", "cuda_cflags"):
        block = ninja.split(f"\n{name} = ", 1)[1]
        blocks[name] = block.split("\npost_cflags", 1)[0].split("\ncuda_post_cflags", 1)[0]
    return blocks["cuda_cflags"], blocks["cflags"]


@pytest.mark.slow(reason="builds a FlashInfer build environment (torch, CUDA wheels)",
                  group="services")
def test_the_driver_puts_fast_build_into_the_cuda_flags_too(tmp_path: Path,
                                                            shared_cache: Path) -> None:
    saved = _save(tmp_path, "--modules", "fused_moe_sm90", "--fast-build",
                  "--cache-dir", str(shared_cache))
    assert saved.returncode == 0, saved.stderr
    request = KernelRequest.from_json(json.loads((tmp_path / "r.json").read_text()))
    env, _ = build_environment(request, KernelOptions(build_torch="torch==2.13.0"),
                               Cache(shared_cache), Reporter(quiet=True))
    cuda, host = _cuda_and_host_flags(env.python, tmp_path, fast=False)
    assert "-DFAST_BUILD" not in cuda and "-DFAST_BUILD" not in host
    assert "-gencode=arch=compute_90a,code=sm_90a" in cuda
    cuda, host = _cuda_and_host_flags(env.python, tmp_path, fast=True)
    assert "-DFAST_BUILD" in host  # FlashInfer's own use_fast_build
    assert "-DFAST_BUILD" in cuda  # ours: what filters the CUTLASS instantiations


def test_a_release_with_a_fast_build_kernel_wheel_is_refused_before_any_work(
        tmp_path: Path) -> None:
    # The refusal comes first: no engine, registry or index is reached (none listens on
    # these ports), nothing is built or written.
    wheel = tmp_path / ("flashinfer_jit_cache-0.6.14+sm120.1.cu130.sm90a.fastbuild-py3-none-"
                        "manylinux_2_28_x86_64.whl")
    with zipfile.ZipFile(wheel, "w") as archive:  # a wheel with no manifest: the label tells
        archive.writestr("flashinfer_jit_cache/__init__.py", "")
    done = release_refused_before_any_work(tmp_path, wheel)
    assert f"{wheel.name} is a --fast-build kernel wheel" in done.stderr
    assert "build the kernel wheel without --fast-build" in done.stderr


def _request(tmp_path: Path, shared_cache: Path,
             **change: object) -> subprocess.CompletedProcess[str]:
    """A request saved by the builder, edited by hand, then given to ``--request``."""
    saved = _save(tmp_path, "--modules", "fused_moe_sm90,trtllm_utils", "--fast-build",
                  "--cache-dir", str(shared_cache))
    assert saved.returncode == 0, saved.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    for key, value in change.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (tmp_path / "edited.json").write_text(json.dumps(data))
    return run_cli("kernels", "build", "--request", str(tmp_path / "edited.json"), "--cache-dir",
                   str(tmp_path / "cache"), "--dist", str(tmp_path / "dist"))


def test_a_hand_edited_request_cannot_mislabel_a_build(tmp_path: Path,
                                                       shared_cache: Path) -> None:
    cases = {
        "fast_build": (None, "and its fast_build (false) disagree"),
        "version": ("0.6.3+sm120.1.cu130.sm90a", "and its fast_build (true) disagree"),
        "groups": (["norm"], "a fast build without a fused_moe_smNN group"),
    }
    for key, (value, message) in cases.items():
        done = _request(tmp_path, shared_cache, **{key: value})
        assert done.returncode == 2, (key, done.stdout, done.stderr)
        assert message in done.stderr, (key, done.stderr)
    done = _request(tmp_path, shared_cache, fast_build="yes")
    assert done.returncode == 2 and "fast_build is 'yes'" in done.stderr, done.stderr
    assert not (tmp_path / "dist").exists() and not (tmp_path / "cache" / "kernels").exists()


def test_a_fast_build_is_known_by_its_label_or_its_manifest(tmp_path: Path) -> None:
    """One rule for both release paths: a renamed fast build by its manifest, a shim (no
    manifest) by its ``fastbuild`` label, a full build of the target's set passes."""
    from builder.core.config import load_targets
    from builder.core.errors import PublishError
    from builder.image.build import read_extra_wheel
    from builder.kernels.build import DEFAULT_HEAD_DIMS
    from builder.kernels.pins import default_groups
    from builder.release.run import refuse_unreleased_kernels

    target = load_targets(REPO / "targets.toml").get("sglang-0.5.16")
    groups = list(target.kernel_groups or default_groups(tuple(target.arch_list)))
    manifest = {"flashinfer_version": "0.6.14", "arch_list": list(target.arch_list),
                "groups": groups, "modules": [], "fast_build": True,
                "head_dims": list(target.head_dims or DEFAULT_HEAD_DIMS)
                if "attention" in groups else []}

    def wheel(name: str, manifest: dict[str, object] | None) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("flashinfer_jit_cache/__init__.py", "")
            if manifest is not None:
                archive.writestr("flashinfer_jit_cache/sm120-manifest.json",
                                 json.dumps(manifest))
        return path

    provider = wheel("flashinfer_jit_cache-0.6.14+sm120.1.cu130-py3-none-any.whl", manifest)
    with pytest.raises(PublishError, match="is a --fast-build kernel wheel"):
        refuse_unreleased_kernels([read_extra_wheel(provider)], target)
    manifest.pop("fast_build")
    provider = wheel("flashinfer_jit_cache-0.6.14+sm120.1.cu130-py3-none-any.whl", manifest)
    refuse_unreleased_kernels([read_extra_wheel(provider)], target)  # the release's own set
    shim = wheel("flashinfer_jit_cache_shim-0.6.14+sm120.1.cu130.fastbuild-py3-none-any.whl",
                 None)
    with pytest.raises(PublishError, match=r"shim-0\.6\.14.*is a --fast-build kernel wheel"):
        refuse_unreleased_kernels([read_extra_wheel(provider), read_extra_wheel(shim)], target)

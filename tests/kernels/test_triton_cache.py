"""Triton's JIT cache built ahead on a CPU (issue 37): a real SGLang 0.5.23 Triton kernel is
compiled for ``sm_90a`` by :func:`builder.kernels.triton_cache.build_triton_cache` with the
release's pinned triton and no GPU, and a fresh process then runs Triton's launch path
(``JITFunction.run``: key, cache lookup, compile on a miss; all but the GPU launch) under a
driver that reports an sm_90 GPU and finds it: no compilation. The specialization is the
one Triton's own JIT hook records for that launch; the kernel and its arguments are those of
``MHATokenToKVPool.set_kv_buffer``'s masked path (``sglang/srt/mem_cache/memory_pool.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from builder.core.cache import Cache
from builder.core.errors import ConfigurationError
from builder.image.profile import LAUNCHER_SOURCE
from builder.kernels.jit_caches import PACKAGE, pack_jit_caches
from builder.kernels.triton_cache import (
    MANIFEST,
    build_triton_cache,
    capability,
    run_script,
)
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.tiers import BEHAVIOUR

KERNEL = "sglang.srt.mem_cache.memory_pool.masked_set_kv_buffer_kernel"
N, H, D = 8, 4, 128


def _launch() -> dict[str, Any]:
    # set_kv_buffer's masked launch: cache_k/v [N, H, D] bf16, the layer's buffers, loc, mask.
    k = {"dtype": "bfloat16", "shape": [N, H, D]}
    buffer = {"dtype": "bfloat16", "shape": [64, H * D]}
    return {"kernel": KERNEL, "grid": [N], "args": [
        k, k, buffer, buffer, {"dtype": "int64", "shape": [N]}, {"dtype": "bool", "shape": [N]},
        N, H, D, 128, H * D, D, H * D, D, H * D, H * D]}


@pytest.fixture(scope="module")
def env_0523(shared_cache: Path) -> Any:
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.core.config import load_targets
    from builder.source.fetch import fetch_pin

    cache = Cache(shared_cache)
    target = load_targets(REPO / "targets.toml").get("sglang-0.5.23")
    source = fetch_pin(wheel_for_interpreter(target), target.upstream_version, cache=cache)
    assert source.archive is not None
    return behaviour_env(source.archive, "0.5.23", cache=cache)


@pytest.fixture(scope="module")
def specs(env_0523: Any, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The specialization Triton's JIT hook records for the launch (nothing compiled)."""
    recorded, done = run_script(env_0523, {"mode": "record", "arch": 90,
                                           "launches": [_launch()]},
                                tmp_path_factory.mktemp("unused"))
    assert recorded[0]["events"] == []  # recorded only, nothing compiled
    assert done["triton"] == "3.9.0"
    found: list[str] = recorded[0]["specs"]
    return found


def _events(env: Any, arch: int, cache_dir: Path) -> list[dict[str, Any]]:
    records, _ = run_script(env, {"mode": "launch", "arch": arch, "launches": [_launch()]},
                            cache_dir)
    return [e for r in records for e in r["events"]]


@pytest.mark.slow(reason="imports sglang 0.5.23 in its behaviour environment and runs "
                  "ptxas", group=BEHAVIOUR)
def test_a_kernel_built_ahead_on_a_cpu_is_found_by_the_launch_path(
        env_0523: Any, specs: list[str], tmp_path: Path) -> None:
    assert len(specs) == 1 and json.loads(specs[0])["name"] == KERNEL

    # Without the cache the launch path compiles (the state of every first start today).
    empty = _events(env_0523, 90, tmp_path / "empty")
    assert [e["cache_hit"] for e in empty] == [False]

    built = build_triton_cache(env_0523, specs * 2, "sm_90a", tmp_path / "triton")
    assert built.failed == [] and len(built.kernels) == 1  # the duplicate compiled once
    assert built.built_with["arch"] == "sm_90a" and built.built_with["release"] == "0.5.23"
    folder = tmp_path / "triton" / next(p.name for p in (tmp_path / "triton").iterdir()
                                         if p.is_dir())
    assert ".target sm_90a" in (folder / "masked_set_kv_buffer_kernel.ptx").read_text()
    assert (folder / "masked_set_kv_buffer_kernel.cubin").stat().st_size > 0
    assert json.loads((tmp_path / "triton" / MANIFEST).read_text())["kernels"][0]["ok"]

    hits = _events(env_0523, 90, tmp_path / "triton")
    assert [e["cache_hit"] for e in hits] == [True]  # zero compilations
    assert hits[0]["hash"] == built.kernels[0]["events"][0]["hash"]


@pytest.mark.slow(reason="imports sglang 0.5.23 in its behaviour environment and runs "
                  "ptxas", group=BEHAVIOUR)
def test_a_spec_recorded_on_sm90_is_built_for_sm120_as_an_sm120_launch_keys_it(
        env_0523: Any, specs: list[str], tmp_path: Path) -> None:
    cache_dir = tmp_path / "triton"
    built = build_triton_cache(env_0523, specs, "12.0f", cache_dir)
    assert built.failed == [] and built.kernels[0]["retargeted"] is True
    # an sm_90 launch does not take the sm_120 kernel (the arch is in the key): it compiles
    assert [e["cache_hit"] for e in _events(env_0523, 90, cache_dir)] == [False]
    assert [e["cache_hit"] for e in _events(env_0523, 120, cache_dir)] == [True]


def test_the_arch_is_read_as_triton_targets_it() -> None:
    assert capability("sm_90a") == 90
    assert capability("12.0f") == 120
    assert capability("sm_120a") == 120
    with pytest.raises(ConfigurationError, match="not a CUDA arch"):
        capability("blackwell")


@pytest.mark.slow(reason="imports sglang 0.5.23 in its behaviour environment and runs "
                  "ptxas", group=BEHAVIOUR)
def test_a_cache_shipped_as_the_artifact_is_restored_by_the_launcher_and_found(
        env_0523: Any, specs: list[str], tmp_path: Path) -> None:
    """The whole path: built ahead, packed as the wheel, installed (unpacked as pip does),
    restored by the real launcher (run with the release's own Python, triton and sglang)
    into an empty TRITON_CACHE_DIR, then a fresh process's launch path compiles nothing."""
    built = build_triton_cache(env_0523, specs, "sm_90a", tmp_path / "triton")
    artifact = pack_jit_caches({"triton": built.folder}, target="sglang-0.5.23",
                               release="0.5.23", version="0.5.23+sm120.1", epoch=0,
                               out_dir=tmp_path / "dist")
    site = tmp_path / "site"
    with zipfile.ZipFile(artifact.wheel) as wheel:
        wheel.extractall(site)
    tools = tmp_path / "bin"  # the GPU the launcher sees: an H200 (sm_90)
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\ncase \"$*\" in *compute_cap*) echo 9.0;; "
                                      "*) echo 'NVIDIA H200';; esac\n")
    (tools / "nvidia-smi").chmod(0o755)
    restored = tmp_path / "server-triton"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON_"))}
    env.update({"SGLANG_SM120_PROFILE": "none", "SGLANG_SM120_DRY_RUN": "1",
                "PYTHONPATH": str(site), "TRITON_CACHE_DIR": str(restored),
                "PATH": os.pathsep.join([str(tools), env.get("PATH", "")])})
    done = subprocess.run([str(env_0523.python), str(LAUNCHER_SOURCE), "--model-path", "/m"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"sglang-sm120-serve: JIT caches for sglang-0.5.23: triton 1 of 1 kernel(s) restored "
        f"to {restored}"], done.stderr
    shipped = site / PACKAGE / "triton"
    assert sorted(p.relative_to(restored) for p in restored.rglob("*")) == sorted(
        p.relative_to(shipped) for p in shipped.rglob("*"))
    manifest = json.loads((site / PACKAGE / "sm120-jit-caches.json").read_text())
    assert manifest["frameworks"]["triton"]["python"] == subprocess.run(
        [str(env_0523.python), "-c", "import sys; print('{}.{}'.format(*sys.version_info))"],
        capture_output=True, text=True, check=True).stdout.strip()

    # the build folder is gone at the server (a temporary folder on another machine): the
    # restored groups must name the restored files, or Triton misses and compiles
    shutil.rmtree(built.folder)
    hits = _events(env_0523, 90, restored)
    assert [e["cache_hit"] for e in hits] == [True]  # zero compilations
    assert hits[0]["hash"] == built.kernels[0]["events"][0]["hash"]

    # the same artifact on an sm_120 GPU: nothing restored, one line, and that launch compiles
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 12.0\n")
    other = tmp_path / "sm120-triton"
    done = subprocess.run([str(env_0523.python), str(LAUNCHER_SOURCE), "--model-path", "/m"],
                          env={**env, "TRITON_CACHE_DIR": str(other)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "triton ignored (built for sm_90a, this GPU is compute capability 12.0): its " \
        "kernels compile at first use" in done.stderr
    assert not other.exists()


@pytest.mark.slow(reason="imports sglang 0.5.23 in its behaviour environment and runs "
                  "ptxas", group=BEHAVIOUR)
def test_the_command_builds_the_artifact_from_what_triton_watch_recorded(
        shared_cache: Path, specs: list[str], tmp_path: Path) -> None:
    """``kernels jit-cache``: the recorded launch (as triton_watch writes it: a compile
    event and the spec), for the target's patched release, packed into the wheel."""
    watch = tmp_path / "watch"
    watch.mkdir()
    (watch / "4242.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in ({"compile": KERNEL, "cache_hit": False, "us": 1},
                                        *({"spec": s} for s in specs))))
    # the run's Inductor cache, copied into the watch folder (its layout, torch 2.11)
    entry = watch / "inductor" / "fxgraph" / "hj" / "fhjjlbk5oqjid6z6"
    entry.mkdir(parents=True)
    (entry / "2y7spbqg44mwzbax").write_bytes(b"pickled entry")
    (watch / "inductor" / "ra").mkdir()
    (watch / "inductor" / "ra" / "cra2jccenp7eeuhtmhvh.py").write_text("# kernel module\n")
    done = run_cli("kernels", "jit-cache", "--target", "sglang-0.5.23", str(watch), "12.0f",
                   str(tmp_path / "dist"), "--json", cache=shared_cache)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    wheel = Path(answer["wheel"])
    assert wheel.parent == tmp_path / "dist" and wheel.name.startswith(
        "sglang_sm120_jit_caches-0.5.23+sm120.") and wheel.name.endswith(
        "-cp{}{}-none-any.whl".format(*sys.version_info[:2]))  # the behaviour env's Python
    triton = answer["manifest"]["frameworks"]["triton"]
    assert (triton["version"], triton["arch"], triton["capability"], triton["entries"]) == (
        "3.8.0", "12.0f", 120, 1)
    assert answer["manifest"]["target"] == "sglang-0.5.23" and answer["failed"] == {
        "triton": []}
    inductor = answer["manifest"]["frameworks"]["inductor"]  # carried, labelled with the pin
    assert (inductor["entries"], inductor["entry_depth"], inductor["arch"]) == (2, 0, "12.0f")
    assert inductor["python"] == "{}.{}".format(*sys.version_info[:2])
    assert inductor["version"] == "2.14.1"  # 0.5.23's torch pin
    with zipfile.ZipFile(wheel) as archive:
        cubins = [n for n in archive.namelist() if n.endswith(".cubin")]
    assert [c.rsplit("/", 1)[1] for c in cubins] == ["masked_set_kv_buffer_kernel.cubin"]
    with zipfile.ZipFile(wheel) as archive:
        assert f"{PACKAGE}/inductor/ra/cra2jccenp7eeuhtmhvh.py" in archive.namelist()


@pytest.mark.slow(reason="imports sglang 0.5.23's triton in its behaviour environment",
                  group=BEHAVIOUR)
def test_an_arch_the_ptxas_of_the_serving_triton_does_not_know_is_refused(
        shared_cache: Path, specs: list[str], tmp_path: Path) -> None:
    """``sm_999`` parses as an arch; triton's own ptxas (``ptxas --help``'s ``--gpu-name``
    values) refuses it: exit 2 before any kernel compiles (it was exit 6, after every spec
    failed with LLVM's "not a recognized processor")."""
    watch = tmp_path / "watch.jsonl"
    watch.write_text("".join(json.dumps({"spec": s}) + "\n" for s in specs))
    done = run_cli("kernels", "jit-cache", "--target", "sglang-0.5.23", str(watch), "sm_999",
                   str(tmp_path / "dist"), "--json", cache=shared_cache)
    assert done.returncode == 2, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert "compiles sm_999 as sm_999a, which its ptxas does not know" in answer["error"]
    assert "sm_120a" in answer["hint"] and "sm_90a" in answer["hint"], answer
    assert not (tmp_path / "dist").exists()


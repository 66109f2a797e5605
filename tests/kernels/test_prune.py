"""Pruned CUTLASS fused MoE modules (issue 36): the rule, the stubs, the coverage check.

The fast tests run the rule and the coverage check on data; the slow ones run the kernel
driver on FlashInfer 0.7.2's (0.5.23's) and 0.6.14's (0.5.16's) own sources in their
behaviour environments: the ninja graph FlashInfer writes for a pruned module, the stubs
generated from the real units, and one stub compiled by nvcc for the archs the specs use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import ConfigurationError
from builder.kernels import prune
from builder.kernels.build import DRIVER, KernelRequest
from builder.kernels.derive import derive, missing_from, moe_variants_of
from builder.kernels.pins import default_groups
from tests.helpers.kernels import F, manifest_of, nvfp4_selection
from tests.helpers.paths import REPO
from tests.helpers.tiers import BEHAVIOUR

UNITS_DIR = "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm"


# --- the rule ---------------------------------------------------------------------------------

def test_each_variant_keeps_the_units_its_runner_is_built_from() -> None:
    assert prune.kept_units(("nvfp4 x nvfp4",)) == ("fp4_fp4",)
    assert prune.kept_units(("bf16 x bf16",)) == ("fp16_fp16", "bf16_bf16")
    assert set(prune.kept_units(("nvfp4 x nvfp4", "fp8 x fp8"))) == {"fp4_fp4", "fp8_fp8",
                                                                      "bf16_fp8"}
    with pytest.raises(prune.PruneError, match="'compressed-tensors' has no rule"):
        prune.kept_units(("compressed-tensors",))
    assert prune.covers(["nvfp4 x nvfp4", "bf16 x bf16"], "bf16 x bf16")
    assert not prune.covers(["bf16 x bf16"], "nvfp4 x nvfp4")
    assert not prune.covers(["bf16 x bf16"], "compressed-tensors")


def test_pruning_an_unchecked_flashinfer_is_refused() -> None:
    with pytest.raises(prune.PruneError, match=r"0\.6\.18's MoeGemmRunner members were "
                                               r"not checked"):
        prune.check_header("0.6.18", b"")
    with pytest.raises(prune.PruneError, match=r"has sha256 \w+, not the checked"):
        prune.check_header("0.7.2", b"// another header\n")


def test_a_generated_launcher_file_goes_only_when_all_its_launchers_are_pruned(
        tmp_path: Path) -> None:
    files = {
        "nvfp4.generated.cu": "INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM(Sm120, SafeFP4, "
                              "SafeFP4, half,\n void);",
        "sm80.generated.cu": "template void sm80_generic_fused_moe_gemm_kernelLauncher<"
                             "cutlass::half_t, cutlass::half_t, 16>(); template void "
                             "sm80_generic_fused_moe_gemm_kernelLauncher<cutlass::bfloat16_t,"
                             " cutlass::bfloat16_t, 16>();",
        "unknown.generated.cu": "template void x<some_type, other_type, 1>();",
    }
    sources = []
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        sources.append(tmp_path / name)
    units = [tmp_path / f"moe_gemm_kernels_{u}.cu" for u in prune.UNITS]
    compiled, stubbed, dropped = prune.plan_sources([*units, *sources], ("fp4_fp4",))
    assert [p.name for p in dropped] == ["sm80.generated.cu"]
    assert {p.name for p in compiled} == {"moe_gemm_kernels_fp4_fp4.cu", "nvfp4.generated.cu",
                                          "unknown.generated.cu"}
    assert len(stubbed) == 13
    # keeping bf16 x bf16 keeps the sm80 launchers, which both 16-bit runners call
    _c, _s, dropped = prune.plan_sources([*units, *sources], ("bf16_bf16", "fp16_fp16"))
    assert [p.name for p in dropped] == ["nvfp4.generated.cu"]


# --- requests, manifests and the coverage check -----------------------------------------------

def test_a_request_carries_its_moe_variants_and_an_unpruned_one_keeps_its_digest() -> None:
    request = KernelRequest.from_json(json.loads(
        (REPO / "reports/2026-11-30-x2-kernels/request.json").read_text()))
    assert "moe_variants" not in request.describe()
    assert str(request.pins.flashinfer) == "0.6.3"  # not checked for pruning: 0.7.2's is
    described = {**request.describe(),
                 "pins": {**request.describe()["pins"], "flashinfer_python": "0.7.2"}}
    # a pruned wheel has its own version: never the full module's, nor another pruning's
    with pytest.raises(ConfigurationError, match=r"moe_variants \(nvfp4 x nvfp4\) disagree"):
        KernelRequest.from_json({**described, "moe_variants": ["nvfp4 x nvfp4"]})
    version = f"{request.version}.{prune.version_label(['nvfp4 x nvfp4'])}"
    assert version.endswith(".moefp4fp4")
    pruned = KernelRequest.from_json({**described, "version": version,
                                      "moe_variants": ["nvfp4 x nvfp4"]})
    assert pruned.moe_variants == ("nvfp4 x nvfp4",)
    assert pruned.describe()["moe_variants"] == ["nvfp4 x nvfp4"]
    with pytest.raises(ConfigurationError, match=r"moe_variants \(none\) disagree"):
        KernelRequest.from_json({**described, "version": version})
    with pytest.raises(ConfigurationError, match="'int8 x int8' has no rule"):
        KernelRequest.from_json({**described, "moe_variants": ["int8 x int8"]})
    with pytest.raises(ConfigurationError, match="not a list of strings"):
        KernelRequest.from_json({**described, "moe_variants": "nvfp4 x nvfp4"})
    # a saved request is held to the rule a resolved one is (kernel_request): a fused MoE
    # group to prune, a FlashInfer whose runner members were checked
    norm = {**described, "version": version, "moe_variants": ["nvfp4 x nvfp4"],
            "groups": ["norm"]}
    with pytest.raises(ConfigurationError, match="none is in the module groups"):
        KernelRequest.from_json(norm)
    unchecked = {**described, "version": version, "moe_variants": ["nvfp4 x nvfp4"],
                 "pins": {**described["pins"], "flashinfer_python": "0.6.3"}}
    with pytest.raises(ConfigurationError, match=r"FlashInfer 0\.6\.3's MoeGemmRunner"):
        KernelRequest.from_json(unchecked)


def _pruned_manifest(variants: list[str]) -> dict[str, Any]:
    manifest = manifest_of(default_groups(F))
    for module in manifest["modules"]:
        if module["group"] == "fused_moe_sm120":
            module["pruned"] = {"variants": variants, "kept_units": list(
                prune.kept_units(tuple(variants)))}
    return {**manifest, "moe_variants": variants}


def test_a_wheel_pruned_to_other_dtype_pairs_does_not_cover_the_model() -> None:
    derived = derive(nvfp4_selection(), F)
    assert missing_from(_pruned_manifest(["nvfp4 x nvfp4"]), derived, F, "0.7.2") == []
    assert missing_from(_pruned_manifest(["bf16 x bf16"]), derived, F, "0.7.2") == [
        "fused MoE dtype pair nvfp4 x nvfp4 (fused_moe_sm120 is pruned to bf16 x bf16)"]
    # an unpruned wheel covers every pair; the manifest's top-level record alone suffices
    assert moe_variants_of(manifest_of(default_groups(F)), "fused_moe_sm120") is None
    top_only = {**manifest_of(default_groups(F)), "moe_variants": ["bf16 x bf16"]}
    assert moe_variants_of(top_only, "fused_moe_sm120") == ["bf16 x bf16"]
    assert missing_from(top_only, derived, F, "0.7.2") != []


# --- FlashInfer's own sources (the behaviour environments) ------------------------------------

def _site(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; "
                          "print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


def _steps(python: Path, tmp_path: Path, arch: str, group: str,
           variants: list[str]) -> dict[str, Any]:
    """The driver's compile steps for ``group`` (FlashInfer writes the ninja graph; nothing
    compiles)."""
    environ = {**os.environ, "CUDA_HOME": "/usr/local/cuda", "FLASHINFER_CUDA_ARCH_LIST": arch,
               "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"),
               "PATH": os.pathsep.join([str(python.parent), os.environ["PATH"]])}
    argument = {"groups": [group], "head_dims": [], "steps": True, "moe_variants": variants}
    done = subprocess.run([str(python), str(DRIVER), json.dumps(argument)],
                          capture_output=True, text=True, env=environ, check=False)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    return result


def _compiled(result: dict[str, Any]) -> set[str]:
    return {Path(s).name for s, info in result["steps"].items() if info["compile"]}


@pytest.fixture(scope="module")
def upstream_0_5_23(shared_cache: Path) -> Any:
    """sglang-0.5.23's behaviour environment (FlashInfer 0.7.2), from the shared cache."""
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.core.cache import Cache
    from builder.core.config import load_targets
    from builder.source.fetch import fetch_pin

    target = load_targets(REPO / "targets.toml").targets["sglang-0.5.23"]
    cache = Cache(shared_cache)
    source = fetch_pin(wheel_for_interpreter(target), target.upstream_version, cache=cache)
    assert source.archive is not None
    return behaviour_env(source.archive, "0.5.23", cache=cache)


@pytest.mark.slow(reason="runs FlashInfer 0.7.2's spec functions in 0.5.23's behaviour "
                         "environment", group=BEHAVIOUR)
def test_the_nvfp4_graph_on_flashinfer_0_7_2_stubs_the_mixed_units(
        upstream_0_5_23: Any, tmp_path: Path) -> None:
    python = upstream_0_5_23.python
    full = _compiled(_steps(python, tmp_path / "full", "12.0f", "fused_moe_sm120", []))
    result = _steps(python, tmp_path / "nvfp4", "12.0f", "fused_moe_sm120", ["nvfp4 x nvfp4"])
    pruned = _compiled(result)
    mixed = ("fp8_uint4", "fp16_uint8", "fp16_uint4", "bf16_uint8", "bf16_uint4", "fp8_fp8")
    for unit in mixed:
        assert any(f"moe_gemm_kernels_{unit}.cuda.o" in s for s in full), unit
        assert not any(f"moe_gemm_kernels_{unit}.cuda.o" in s for s in pruned), unit
        assert any(f"moe_gemm_kernels_{unit}.pruned.cuda.o" in s for s in pruned), unit
    assert any("moe_gemm_kernels_fp4_fp4.cuda.o" in s for s in pruned)
    # the sm80 grouped GEMMs (only the 16-bit runners call them) and the sm90 fpA_intB
    # launchers (weight-only dtypes) go; the NVFP4 TMA grouped GEMMs stay
    assert any("gemm_grouped_sm80" in s for s in full)
    assert not any("gemm_grouped_sm80" in s or "gemm_sm90" in s for s in pruned)
    # 8 NVFP4 files stay, the 3 FP8 x FP4 ones go
    assert (sum("gemm_grouped_sm120" in s for s in full),
            sum("gemm_grouped_sm120" in s for s in pruned)) == (11, 8)
    assert len(pruned) < len(full) / 2, (len(pruned), len(full))
    record = result["pruned"]["fused_moe_120"]
    assert record["kept_units"] == ["fp4_fp4"] and len(record["stubbed"]) == 13


def _stubs(site: Path, version: str, kept: tuple[str, ...]) -> dict[str, str]:
    units = site / "flashinfer/data/csrc" / UNITS_DIR
    return {u: prune.stub_source((units / f"moe_gemm_kernels_{u}.cu").read_text(), u, kept)
            for u in prune.UNITS if u not in kept}


@pytest.mark.slow(reason="reads FlashInfer 0.7.2 and 0.6.14 in the behaviour environments",
                  group=BEHAVIOUR)
def test_every_runner_of_a_real_unit_gets_every_member_stubbed(
        upstream_0_5_23: Any, upstream_0_5_16: Any) -> None:
    for env, version in ((upstream_0_5_23, "0.7.2"), (upstream_0_5_16.env, "0.6.14")):
        site = _site(env.python)
        prune.check_header(version, (site / "flashinfer/data/csrc" / prune.HEADER).read_bytes())
        for unit, stub in _stubs(site, version, ("fp4_fp4",)).items():
            text = (site / "flashinfer/data/csrc" / UNITS_DIR /
                    f"moe_gemm_kernels_{unit}.cu").read_text()
            code = re.sub(r"//[^\n]*", "", text)
            runners = re.findall(r"template\s+class\s+(MoeGemmRunner\s*<[^;]*>)\s*;", code)
            assert runners, unit
            for runner in runners:
                flat = " ".join(runner.split()).replace("< ", "<")
                assert f"template <> {flat}::MoeGemmRunner()" in stub, (unit, flat)
            assert stub.count("template <>") == len(runners) * len(prune.MEMBERS), unit
            assert "template class" not in stub and "e5m2" not in stub  # comments dropped


@pytest.mark.slow(reason="compiles a stub with nvcc against FlashInfer 0.7.2's headers",
                  group=BEHAVIOUR)
@pytest.mark.parametrize("gencode", ["-gencode=arch=compute_90a,code=sm_90a",
                                     "-gencode=arch=compute_120f,code=sm_120f"])
def test_a_stub_compiles_for_the_archs_of_the_specs(upstream_0_5_23: Any, nvcc: Path,
                                                   tmp_path: Path, gencode: str) -> None:
    site = _site(upstream_0_5_23.python)
    stub = tmp_path / "moe_gemm_kernels_fp8_fp8.pruned.cu"
    stub.write_text(_stubs(site, "0.7.2", ("fp4_fp4",))["fp8_fp8"])
    data, csrc = site / "flashinfer/data", site / "flashinfer/data/csrc"
    nv = csrc / "nv_internal"
    includes = [nv, nv / "include", nv / "tensorrt_llm/cutlass_extensions/include",
                nv / "tensorrt_llm/kernels/cutlass_kernels/include",
                nv / "tensorrt_llm/kernels/cutlass_kernels", data / "include", csrc,
                data / "cutlass/include", data / "cutlass/tools/util/include",
                data / "spdlog/include", site / "tvm_ffi/include",
                nvcc.parent.parent / "include/cccl"]
    started = time.monotonic()
    done = subprocess.run([str(nvcc), "-c", str(stub), "-o", str(tmp_path / "stub.o"),
                           "-std=c++17", "--expt-relaxed-constexpr", gencode,
                           "-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP4",
                           "-DUSING_OSS_CUTLASS_MOE_GEMM", "-Xcompiler=-fPIC",
                           *(f"-I{i}" for i in includes)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"{gencode}: {time.monotonic() - started:.1f} s")
    symbols = subprocess.run(["nm", "-C", "--defined-only", str(tmp_path / "stub.o")],
                             capture_output=True, text=True, check=True).stdout
    runners = {line.split(" T ", 1)[1].split(">::")[0] for line in symbols.splitlines()
               if " T " in line and "MoeGemmRunner<" in line}
    assert len(runners) == 4  # fp8 x fp8 with half and bf16 outputs, plain and MXFP8

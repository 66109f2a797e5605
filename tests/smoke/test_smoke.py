"""Smoke test (issue 6), the parts that run on a CPU: arch rules, the manifest, log
classification, the MoE reference math, the report and its verdict, the lockstep and sglang
judgements on real installed wheels, the engine-error classifier, and the CLI. Nothing here
pretends a GPU: where the probe needs one, the tests assert that it says there is none."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import torch
from packaging.version import Version
from wheel.wheelfile import WheelFile

from builder import Options
from builder.core import arch
from builder.core.arch import arch_runs_on, flashinfer_arch, parse_arch
from builder.core.cache import sha256_json
from builder.core.errors import BuilderError
from builder.kernels.pins import sm120_arch
from builder.patching.series import load_series
from builder.smoke.container import classify_engine_error
from builder.smoke.gpu import (
    PROBE_FILES,
    SCRIPT_DIR,
    CheckResult,
    SmokeReport,
    check_lockstep,
    intent_patterns,
    load_report,
    parse_probe_output,
    require_passed,
    wheel_provenance,
    write_report,
)
from builder.smoke.shared import (
    MISSING_MODULE,
    RESULT_PREFIX,
    ProbeCheck,
    ProbeOutputError,
    ProbeResults,
    Reason,
    autotune_summary,
    classify_line,
    count_warnings,
    parse_manifest,
)
from builder.wheel.build import run_wheel
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO, TEST_CACHE
from tests.helpers.project import write_project


def _script(name: str) -> object:
    """A module of builder/smoke/script/, loaded as the tested interpreter loads it: by
    name from its own folder (the builder itself never imports these)."""
    if str(SCRIPT_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPT_DIR))
    return importlib.import_module(name)


probe: object = _script("smoke_probe")
_captured = probe._captured  # type: ignore[attr-defined]
fp8_quantize = probe.fp8_quantize  # type: ignore[attr-defined]
fp8_round_trip = probe.fp8_round_trip  # type: ignore[attr-defined]
moe_case = probe.moe_case  # type: ignore[attr-defined]
moe_module_name = probe.moe_module_name  # type: ignore[attr-defined]
moe_problem = probe.moe_problem  # type: ignore[attr-defined]
moe_reference = probe.moe_reference  # type: ignore[attr-defined]
moe_verdict = probe.moe_verdict  # type: ignore[attr-defined]
relative_error = probe.relative_error  # type: ignore[attr-defined]
route = probe.route  # type: ignore[attr-defined]

# ---------------------------------------------------------------------------------------
# Log classification, on lines as FlashInfer 0.6.3 prints them: the autotuner's warning
# (flashinfer/autotuner.py:497, f"[Autotuner]: Skipping tactic {r} {tac}, due to failure
# while profiling: {e}") through the flashinfer.jit logger's format (jit/core.py), with the
# TensorRT-LLM exception text (throwRuntimeError's "[TensorRT-LLM][ERROR] Assertion failed:
# %s" and TllmException's " (%s:%zu)") of moe_gemm_tma_ws_launcher.inl:698.

TMA_WS = ("2026-11-30 10:00:02,000 - WARNING - autotuner.py:497 - flashinfer.jit: "
          "[Autotuner]: Skipping tactic <flashinfer.fused_moe.core.get_cutlass_fused_moe_module"
          ".<locals>.MoERunner object at 0x7f2c5d1e4b10> 17, due to failure while profiling: "
          "[TensorRT-LLM][ERROR] Assertion failed: Failed to initialize cutlass TMA WS grouped "
          "gemm. Error: Error Internal (/opt/flashinfer/data/csrc/nv_internal/tensorrt_llm/"
          "kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_launcher.inl:698)")
OTHER_SKIP = ("2026-11-30 10:00:02,100 - WARNING - autotuner.py:497 - flashinfer.jit: "
              "[Autotuner]: Skipping tactic <...MoERunner object at 0x7f2c5d1e4b10> 3, due to "
              "failure while profiling: [TensorRT-LLM][ERROR] Assertion failed: Grouped GEMM "
              "kernel will fail for params. Error: Error Misaligned Operand")
PLAIN = [
    "2026-11-30 10:00:01,000 - INFO - autotuner.py:256 - flashinfer.jit: [Autotuner]: "
    "Autotuning process starts ...",
    "2026-11-30 10:00:03,000 - INFO - autotuner.py:262 - flashinfer.jit: [Autotuner]: "
    "Autotuning process ends",
    "[2026-11-30 10:00:03] FlashInfer autotune completed.",
]


def test_log_lines_are_classified_by_flashinfer_s_own_texts() -> None:
    assert classify_line(TMA_WS) == ("skipped_tactic", "tma_ws_init_failed")
    assert classify_line(OTHER_SKIP) == ("skipped_tactic",)
    assert all(classify_line(line) == () for line in PLAIN)
    assert count_warnings([*PLAIN, TMA_WS, OTHER_SKIP, TMA_WS]) == \
        {"skipped_tactic": 3, "tma_ws_init_failed": 2}
    assert count_warnings(PLAIN) == {"skipped_tactic": 0, "tma_ws_init_failed": 0}


def test_the_patterns_are_flashinfer_s_source_strings() -> None:
    # The texts as they are in flashinfer_python 0.6.3's files (downloaded by the test).
    source = _flashinfer_wheel()
    with zipfile.ZipFile(source) as archive:
        autotuner = archive.read("flashinfer/autotuner.py").decode()
        launcher = archive.read("flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/"
                                "cutlass_kernels/moe_gemm/launchers/"
                                "moe_gemm_tma_ws_launcher.inl").decode()
    assert '"[Autotuner]: Skipping tactic {r} {tac}, due to failure while profiling' in \
        autotuner.replace("f\"", "\"")
    assert '"Failed to initialize cutlass TMA WS grouped gemm. Error: "' in launcher


# ---------------------------------------------------------------------------------------
# Check 5 must fail when autotuning tunes nothing. The lines below are rendered from
# FlashInfer 0.6.3's own format strings (checked against its source in the next test):
# a timed tactic (autotuner.py:603, debug), the chosen tactic (autotuner.py:534, debug) and
# a tactic skipped because FLASHINFER_DISABLE_JIT=1 and a module (the autotuner's
# trtllm_utils) is missing from the jit-cache (MissingJITCacheError, jit/core.py:291).

RUNNER = "<flashinfer.fused_moe.core.get_cutlass_fused_moe_module.<locals>.MoERunner object>"
SHAPES = "[torch.Size([256, 512]), torch.Size([8, 1024, 512])]"
MISSING = (f"[Autotuner]: Skipping tactic {RUNNER} 5, due to failure while profiling: JIT "
           "compilation is disabled via FLASHINFER_DISABLE_JIT environment variable, but the "
           "required module is not found in the JIT cache. Please add the missing module to "
           "the JIT cache build configuration.")


def _profiled(tactic: int) -> str:
    return f"[Autotuner]: profiling {RUNNER} {tactic}, shapes={SHAPES}, avg_time 0.0412"


CHOSEN = f"[Autotuner]: profiling chosen runner: {RUNNER} 7 for ('trtllm::fused_moe', 256)"


def test_the_autotune_lines_are_flashinfer_s_source_strings() -> None:
    with zipfile.ZipFile(_flashinfer_wheel()) as archive:
        autotuner = archive.read("flashinfer/autotuner.py").decode()
        core = archive.read("flashinfer/jit/core.py").decode()
    assert 'f"[Autotuner]: profiling {runner} {tactic}, shapes={shapes}, avg_time ' \
        '{avg_time}"' in autotuner
    assert 'f"[Autotuner]: profiling chosen runner: {runners[runner_id]} {tactic} for ' \
        '{cache_key}"' in autotuner
    assert '"but the required module is not found in the JIT cache. "' in core
    assert MISSING_MODULE in MISSING


def test_autotune_summary_counts_profiled_chosen_and_skips_by_cause() -> None:
    lines = [*PLAIN, _profiled(3), _profiled(7), MISSING, TMA_WS, OTHER_SKIP, TMA_WS, CHOSEN]
    assert autotune_summary(lines) == {
        "profiled": 2, "chosen": ["7"],
        "skipped": {"missing_module": 1, "hardware": 2, "other": 1}}
    assert autotune_summary(PLAIN) == {
        "profiled": 0, "chosen": [], "skipped": {"missing_module": 0, "hardware": 0, "other": 0}}


def _variant(lines: list[str], ok: bool | None = True) -> dict[str, object]:
    return {"variant": "bf16", "ok": ok, "tolerance": 0.05, "default_error": 0.01,
            "tuned_error": 0.01, "default_ms": 1.0, "tuned_ms": 0.8,
            "default_over_tuned": 1.25, "autotune": autotune_summary(lines)}


def test_check_5_fails_when_every_tactic_was_skipped_for_a_missing_module() -> None:
    # The H200 run of this round: 2,106 tactics skipped, identical default and tuned errors,
    # and the old check said "warning" (a pass).
    status, detail = moe_verdict([_variant([*PLAIN, *[MISSING] * 2106])])
    assert status == "failed"
    assert "2106 tactics skipped" in detail and "jit-cache" in detail
    assert "default/tuned" not in detail  # no ratio when nothing was tuned


def test_check_5_fails_on_one_missing_module_skip_among_profiled_tactics() -> None:
    status, detail = moe_verdict([_variant([_profiled(1), MISSING, CHOSEN])])
    assert status == "failed" and "1 tactics skipped" in detail


def test_check_5_fails_when_no_tactic_was_profiled() -> None:
    status, detail = moe_verdict([_variant(PLAIN)])
    assert status == "failed" and "profiled no tactic" in detail


def test_check_5_warns_for_hardware_skips_and_reports_what_was_tuned() -> None:
    status, detail = moe_verdict([_variant([_profiled(3), _profiled(7), TMA_WS, CHOSEN])])
    assert status == "warning"
    assert detail == ("bf16: 2 tactics profiled, chosen 7 vs default -1, default/tuned 1.25x "
                      "(1 skipped for the hardware, 0 for other causes)")


def test_check_5_passes_a_clean_tuning_and_still_fails_wrong_numbers() -> None:
    status, detail = moe_verdict([_variant([_profiled(3), CHOSEN])])
    assert (status, detail) == ("passed", "bf16: 1 tactics profiled, chosen 7 vs default -1, "
                                          "default/tuned 1.25x")
    wrong = {**_variant([_profiled(3), CHOSEN]), "ok": False, "tuned_error": 0.5}
    assert moe_verdict([wrong])[0] == "failed"


def test_the_capture_sees_debug_records_without_printing_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    logger = logging.Logger("flashinfer.jit.test")  # like FlashInferJITLogger: INFO + stream
    logger.setLevel(logging.INFO)
    stream = logging.StreamHandler()
    logger.addHandler(stream)
    with _captured(logger) as lines:
        logger.debug(_profiled(3))
        logger.warning(MISSING)
    assert lines == [_profiled(3), MISSING]
    err = capsys.readouterr().err
    assert MISSING in err and "avg_time" not in err  # the debug line was not printed
    assert logger.level == logging.INFO and stream.level == logging.NOTSET


# The probe's calls into FlashInfer, checked against 0.6.3's source (no GPU, no import):
# (file, function or class, parameters the probe passes or reads).
FLASHINFER_API = [
    ("norm.py", "rmsnorm", {"input", "weight", "eps"}),
    ("activation.py", "silu_and_mul", {"input"}),
    ("activation.py", "gelu_and_mul", {"input"}),
    ("activation.py", "gelu_tanh_and_mul", {"input"}),
    ("sampling.py", "softmax", {"logits"}),
    ("sampling.py", "sampling_from_probs", {"probs", "deterministic"}),
    ("sampling.py", "top_k_sampling_from_probs", {"probs", "top_k", "deterministic"}),
    ("sampling.py", "top_p_sampling_from_probs", {"probs", "top_p", "deterministic"}),
    ("sampling.py", "top_k_renorm_probs", {"probs", "top_k"}),
    ("fused_moe/core.py", "cutlass_fused_moe",
     {"input", "token_selected_experts", "token_final_scales", "fc1_expert_weights",
      "fc2_expert_weights", "output_dtype", "quant_scales", "output",
      "tune_max_num_tokens"}),
    ("autotuner.py", "autotune", {"tune_mode"}),
    ("jit/core.py", "JitSpec", {"name", "sources", "extra_cflags", "extra_cuda_cflags",
                                "extra_ldflags", "extra_include_dirs", "is_aot", "aot_path",
                                "build_and_load"}),
]


def test_the_probe_calls_flashinfer_0_6_3_as_its_source_defines() -> None:
    import ast

    with zipfile.ZipFile(_flashinfer_wheel()) as archive:
        sources = {name: archive.read(f"flashinfer/{name}").decode()
                   for name in {row[0] for row in FLASHINFER_API} | {"__init__.py",
                                                                     "jit/env.py"}}
    for file, name, wanted in FLASHINFER_API:
        tree = ast.parse(sources[file])
        found = [node for node in tree.body if isinstance(  # module level: the public one
            node, ast.FunctionDef | ast.ClassDef) and node.name == name]
        assert found, f"{file} defines no {name}"
        node = found[-1]
        if isinstance(node, ast.FunctionDef):
            have = {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
        else:
            have = {t.id for stmt in node.body if isinstance(stmt, ast.AnnAssign)
                    for t in [stmt.target] if isinstance(t, ast.Name)}
            have |= {stmt.name for stmt in node.body if isinstance(stmt, ast.FunctionDef)}
        assert wanted <= have, f"{file}:{name} lacks {wanted - have}"
    for export in ("rmsnorm", "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul",
                   "autotune"):
        assert f"import {export} as {export}" in sources["__init__.py"]
    assert 'logger = FlashInferJITLogger("flashinfer.jit")' in sources["jit/core.py"]
    assert 'os.environ.get("FLASHINFER_DISABLE_JIT")' in sources["jit/core.py"]
    for name in ("FLASHINFER_AOT_DIR", "FLASHINFER_JIT_DIR"):
        assert f"{name}: pathlib.Path =" in sources["jit/env.py"]


# ---------------------------------------------------------------------------------------
# Arch rules and the manifest.


def test_arch_parsing_and_binary_compatibility() -> None:
    assert parse_arch("9.0a") == (9, 0, "a")
    assert parse_arch("sm_120f") == (12, 0, "f")
    assert parse_arch("sm_103a") == (10, 3, "a")
    assert parse_arch("8.9") == (8, 9, "")
    with pytest.raises(ValueError):
        parse_arch("compute_90")
    assert arch_runs_on("sm_90a", (9, 0))
    assert not arch_runs_on("sm_90a", (12, 0))       # arch-specific: that GPU only
    assert not arch_runs_on("12.0a", (12, 1))
    assert arch_runs_on("12.0f", (12, 1))            # family: later minors of 12
    assert not arch_runs_on("12.0f", (10, 0))
    assert arch_runs_on("8.0", (8, 9)) and not arch_runs_on("8.9", (8, 0))
    assert flashinfer_arch((9, 0), "0.6.3") == "9.0a"
    assert flashinfer_arch((12, 0), "0.6.3") == "12.0a"
    assert flashinfer_arch((12, 0), "0.7.2") == "12.0f"
    assert flashinfer_arch((9, 0), "0.7.2") == "9.0a"
    assert flashinfer_arch((8, 9), "0.7.2") == "8.9"
    with pytest.raises(ValueError, match="not a version"):
        flashinfer_arch((12, 0), "unknown")


# What FlashInfer detects on an SM120 GPU, by release (shared/design.md): 12.0a up to
# 0.6.6, 12.0f from 0.6.7, pre- and post-releases counted by their release numbers.
SM120_ARCH = {"0.5.3": "12.0a", "0.6.3": "12.0a", "0.6.6": "12.0a", "0.6.6.post1": "12.0a",
              "0.6.7": "12.0f", "0.6.14": "12.0f", "0.7.0rc1": "12.0f", "0.7.2": "12.0f"}


def test_the_kernel_build_and_the_probe_pick_the_same_sm120_arch() -> None:
    # The kernel stage's rule and the one the probe's check 1 calls (the name it calls,
    # in the probe as the tested interpreter loads it) must agree release by release.
    for version, expected in SM120_ARCH.items():
        build_side = sm120_arch(Version(version))
        probe_side = probe.flashinfer_arch((12, 0), version)  # type: ignore[attr-defined]
        assert (build_side, probe_side) == (expected, expected), version
    # One rule, not a copy: the probe's neighbour is a link to the builder's module.
    repo_script = REPO / "builder" / "smoke" / "script"
    link = repo_script / "sm120_arch.py"
    assert link.is_symlink() and link.resolve() == (REPO / "builder/core/arch.py").resolve()
    shared = repo_script / "smoke_shared.py"
    assert shared.is_symlink() and shared.resolve() == \
        (REPO / "builder" / "smoke" / "shared.py").resolve()
    # the builder that runs (installed, links copied) carries the same bytes
    assert (SCRIPT_DIR / "sm120_arch.py").read_bytes() == Path(arch.__file__).read_bytes()


def test_fused_moe_module_follows_cutlass_fused_moe_s_choice() -> None:
    assert moe_module_name((9, 0)) == "fused_moe_90"
    assert moe_module_name((12, 0)) == moe_module_name((12, 1)) == "fused_moe_120"
    assert moe_module_name((10, 0)) == moe_module_name((11, 0)) == "fused_moe_100"
    assert moe_module_name((10, 3)) == "fused_moe_103"
    assert moe_module_name((8, 0)) is None


MANIFEST = {"schema": 1, "flashinfer_version": "0.6.3", "version": "0.6.3+sm90.test",
            "arch_list": ["9.0a"], "cuda_version": "13.0", "nvcc_version": "13.0.88",
            "flags_sha256": "0" * 64,
            "modules": [{"name": "norm", "path": "norm/norm.so", "sha256": "a" * 64,
                         "sass": ["sm_90a"]}]}


def test_manifest_is_read_through_one_function() -> None:
    manifest = parse_manifest(MANIFEST)
    assert manifest.version == "0.6.3+sm90.test" and manifest.arch_list == ("9.0a",)
    assert manifest.module("norm") is not None and manifest.module("sampling") is None
    norm = manifest.module("norm")
    assert norm is not None and norm.sass == ("sm_90a",) and norm.path == "norm/norm.so"
    with pytest.raises(ValueError, match="schema"):
        parse_manifest({**MANIFEST, "schema": 2})
    with pytest.raises(ValueError, match="modules"):
        parse_manifest({k: v for k, v in MANIFEST.items() if k != "modules"})


# ---------------------------------------------------------------------------------------
# The MoE reference, against an independent computation in plain Python.


def _python_moe(x: list[list[float]], w31: list[list[list[float]]],
                w2: list[list[list[float]]], logits: list[list[float]], top_k: int
                ) -> list[list[float]]:
    """Softmax, top-k, renormalise; per expert silu(gate) * up then fc2; weighted sum.
    Rows 0..I-1 of w31[e] are "up", rows I..2I-1 "gate" (the kernel's layout)."""
    inter, hidden = len(w31[0]) // 2, len(x[0])
    out = []
    for t, row in enumerate(x):
        peak = max(logits[t])
        exps = [math.exp(v - peak) for v in logits[t]]
        probs = [e / sum(exps) for e in exps]
        chosen = sorted(range(len(probs)), key=lambda e: -probs[e])[:top_k]
        total = sum(probs[e] for e in chosen)
        acc = [0.0] * hidden
        for e in chosen:
            up = [sum(w31[e][i][h] * row[h] for h in range(hidden)) for i in range(inter)]
            gate = [sum(w31[e][inter + i][h] * row[h] for h in range(hidden))
                    for i in range(inter)]
            act = [g / (1 + math.exp(-g)) * u for g, u in zip(gate, up, strict=True)]
            for h in range(hidden):
                acc[h] += probs[e] / total * sum(w2[e][h][i] * act[i] for i in range(inter))
        out.append(acc)
    return out


def test_routing_is_softmax_top_k_renormalised() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]])
    weights, experts = route(logits, 2)
    assert experts.tolist() == [[2, 1], [0, 2]]
    e = math.e
    assert weights[0].tolist() == pytest.approx([e**2 / (e**2 + e), e / (e**2 + e)])
    assert weights.sum(-1).tolist() == pytest.approx([1.0, 1.0])


def test_moe_reference_matches_a_plain_python_computation() -> None:
    case = moe_case(tokens=5, hidden=6, inter=4, experts=3, top_k=2, seed=7)
    weights, experts = route(case.router_logits, case.top_k)
    got = moe_reference(case.x, case.w31, case.w2, weights, experts)
    want = _python_moe(case.x.tolist(), case.w31.tolist(), case.w2.tolist(),
                       case.router_logits.tolist(), case.top_k)
    assert torch.allclose(got, torch.tensor(want), atol=1e-6, rtol=1e-5)
    # The halves matter: with up and gate swapped the result is another one.
    inter = case.w31.shape[1] // 2
    swapped = torch.cat([case.w31[:, inter:], case.w31[:, :inter]], dim=1)
    assert relative_error(moe_reference(case.x, swapped, case.w2, weights, experts),
                          got) > 0.1


def test_moe_reference_with_one_expert_is_a_swiglu_mlp() -> None:
    case = moe_case(tokens=4, hidden=8, inter=4, experts=1, top_k=1, seed=3)
    weights, experts = route(case.router_logits, 1)
    up, gate = case.w31[0, :4], case.w31[0, 4:]
    mlp = (torch.nn.functional.silu(case.x @ gate.T) * (case.x @ up.T)) @ case.w2[0].T
    assert torch.allclose(moe_reference(case.x, case.w31, case.w2, weights, experts), mlp,
                          atol=1e-6)


def test_moe_reference_rounds_the_intermediate_where_asked() -> None:
    case = moe_case(tokens=8, hidden=16, inter=8, experts=4, top_k=2, seed=1)
    weights, experts = route(case.router_logits, 2)
    seen: list[tuple[int, ...]] = []

    def record(act: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(act.shape))
        return act.to(torch.bfloat16).float()

    exact = moe_reference(case.x, case.w31, case.w2, weights, experts)
    rounded = moe_reference(case.x, case.w31, case.w2, weights, experts, intermediate=record)
    assert sum(shape[0] for shape in seen) == 8 * 2 and {s[1] for s in seen} == {8}
    assert 0 < relative_error(rounded, exact) < 1e-2


def test_fp8_quantisation_is_per_tensor_e4m3() -> None:
    values = torch.tensor([0.0, 0.5, -1.5, 2.0, -3.5])  # representable after scaling
    q, scale = fp8_quantize(values)
    assert q.dtype == torch.float8_e4m3fn
    assert scale == pytest.approx(3.5 / 448)
    assert float(q.float().abs().max()) == 448.0
    assert torch.allclose(q.float() * scale, values, rtol=2**-3)
    noisy = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    q, scale = fp8_quantize(noisy)
    # e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4 above the subnormals.
    big = noisy.abs() > 2**-6 * scale
    error = ((q.float() * scale - noisy).abs() / noisy.abs())[big]
    assert float(error.max()) <= 2**-4 + 1e-6
    assert torch.equal(fp8_round_trip(fp8_round_trip(noisy, scale), scale),
                       fp8_round_trip(noisy, scale))


def test_moe_problems_are_what_the_kernel_takes() -> None:
    case = moe_case(tokens=32, hidden=64, inter=32, experts=4, top_k=2, seed=5)
    weights, experts = route(case.router_logits, case.top_k)
    exact = moe_reference(case.x, case.w31, case.w2, weights, experts)
    bf16 = moe_problem("bf16", case, "cpu")
    assert (bf16.x.dtype, bf16.w31.dtype, bf16.experts.dtype) == \
        (torch.bfloat16, torch.bfloat16, torch.int32)
    assert bf16.quant_scales is None and relative_error(bf16.reference, exact) < 1e-2
    fp8 = moe_problem("fp8", case, "cpu")
    assert {fp8.x.dtype, fp8.w31.dtype, fp8.w2.dtype} == {torch.float8_e4m3fn}
    assert fp8.quant_scales is not None
    fc1_dequant, fc2_quant, fc2_dequant, input_dequant = fp8.quant_scales
    assert (fc1_dequant.shape, fc2_quant.shape, fc2_dequant.shape, input_dequant.shape) == \
        ((4,), (), (4,), ())
    # fc1's dequant scale turns the quantised GEMM into the dequantised one, per expert.
    q_gemm = (fp8.x.float() @ fp8.w31[1].float().T) * fc1_dequant[1]
    x_deq, w_deq = fp8.x.float() * input_dequant, fp8.w31[1].float() * \
        (fc1_dequant[1] / input_dequant)
    assert torch.allclose(q_gemm, x_deq @ w_deq.T, rtol=1e-5, atol=1e-6)
    # fc2's quant and dequant scales share one activation scale: their product is the
    # weight scale, amax / 448 per expert.
    w2_scales = case.w2.flatten(1).abs().max(dim=1).values / 448
    assert torch.allclose(fc2_quant * fc2_dequant, w2_scales, rtol=1e-6)
    # The fp8 reference stays near the exact result: e4m3 keeps 3 mantissa bits, so the
    # quantisation of x, the weights and the intermediate moves it by several percent.
    assert 1e-2 < relative_error(fp8.reference, exact) < 0.15


def test_relative_error_is_scale_free() -> None:
    a = torch.tensor([1.0, -2.0, 4.0])
    assert relative_error(a, a) == 0.0
    assert relative_error(a + torch.tensor([0.0, 0.0, 0.4]), a) == pytest.approx(0.1)
    assert relative_error(10 * (a + torch.tensor([0.0, 0.0, 0.4])), 10 * a) == \
        pytest.approx(0.1)


# ---------------------------------------------------------------------------------------
# The report and its verdict.


def _report(**statuses: tuple[str, bool]) -> SmokeReport:
    checks = tuple(CheckResult(name, status, f"{name} {status}", required)  # type: ignore[arg-type]
                   for name, (status, required) in statuses.items())
    return SmokeReport("host", checks, {"sglang": {"provenance_sha256": "x"}},
                       created="2026-11-30T00:00:00+00:00", builder="0.1.0")


def test_verdict_counts_required_checks_and_warnings_pass() -> None:
    passing = _report(runner=("passed", True), sglang=("warning", True),
                      lockstep=("passed", True), kernels=("passed", True),
                      moe=("not-run", False), server=("not-run", False))
    assert passing.passed and passing.exit_status == 0
    asked = _report(runner=("passed", True), moe=("not-run", True))
    assert not asked.passed and asked.exit_status == 1
    failed_optional = _report(runner=("passed", True), sglang=("passed", True),
                              lockstep=("passed", True), kernels=("passed", True),
                              server=("failed", False))
    assert failed_optional.passed
    misconfigured = SmokeReport("image", passing.checks, misconfigured_runner=True)
    assert not misconfigured.passed and misconfigured.exit_status == 3
    assert passing.summary()[-1] == "smoke (host mode): passed"
    assert "(not counted)" in passing.summary()[4]


def test_report_round_trips_through_json(tmp_path: Path) -> None:
    report = _report(runner=("failed", True), server=("not-run", False))
    write_report(report, tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == 1 and data["passed"] is False
    assert [c["name"] for c in data["checks"]] == ["runner", "server"]
    assert load_report(tmp_path / "r.json") == report
    data["checks"][0]["status"] = "skipped"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(BuilderError, match="unknown status"):
        load_report(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(BuilderError, match="not a smoke report"):
        load_report(tmp_path / "other.json")


def test_probe_output_is_read_among_other_prints() -> None:
    out = "\n".join(["some library printed this",
                     RESULT_PREFIX + json.dumps({"name": "runner", "status": "failed",
                                                 "detail": "no CUDA device", "data": {},
                                                 "reason": "no-device"}),
                     "[W] more noise", ""])
    runner = ProbeCheck("runner", "failed", "no CUDA device", {}, Reason.NO_DEVICE)
    assert parse_probe_output(out) == ProbeResults(runner=runner)
    assert parse_probe_output(out).no_device() == runner
    # "No GPU" is the reason, not the wording: torch missing is another reason.
    no_torch = ProbeCheck("runner", "failed", "no CUDA device", {}, Reason.NO_TORCH)
    assert ProbeResults(runner=no_torch).no_device() is None
    assert ProbeResults().no_device() is None


def test_probe_results_round_trip_and_name_their_fields() -> None:
    results = ProbeResults(
        runner=ProbeCheck("runner", "passed", "a GPU", {"gpu": "x"}),
        sglang_data=ProbeCheck("sglang-data", "passed", "collected", {"version": "0.5.9"}),
        moe_autotune=ProbeCheck("moe-autotune", "failed", "no CUDA device", {},
                                Reason.NO_DEVICE))
    data = json.loads(json.dumps(results.to_json()))
    assert [c["name"] for c in data["checks"]] == ["runner", "sglang-data", "moe-autotune"]
    assert ProbeResults.from_json(data) == results
    lines = "\n".join(RESULT_PREFIX + json.dumps(c) for c in data["checks"])
    assert ProbeResults.from_output(lines) == results


@pytest.mark.parametrize(("data", "message"), [
    ([], 'probe results are {"checks": [...]}'),
    ({"checks": {}}, 'probe results are {"checks": [...]}'),
    ({"checks": ["runner"]}, "a probe result is a JSON object"),
    ({"checks": [{"name": "runner", "status": "passed"}]},
     "probe result 'runner': needs a string name and detail"),
    ({"checks": [{"name": "runner", "status": "ok", "detail": ""}]},
     "probe result 'runner' has unknown status 'ok'"),
    ({"checks": [{"name": "runner", "status": "failed", "detail": "", "reason": "gone"}]},
     "probe result 'runner' has unknown reason 'gone'"),
    ({"checks": [{"name": "sglang", "status": "failed", "detail": ""}]},
     "unknown probe result 'sglang'"),
    ({"checks": [{"name": "kernels", "status": "failed", "detail": ""}] * 2},
     "probe result 'kernels' is given twice"),
])
def test_malformed_probe_results_are_refused_with_one_message(data: object,
                                                              message: str) -> None:
    with pytest.raises(ProbeOutputError) as raised:
        ProbeResults.from_json(data)
    assert str(raised.value).startswith(message)


def test_a_malformed_saved_probe_output_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProbeOutputError,
                       match=r"^line 2 of the probe's output: Unterminated string"):
        ProbeResults.from_output("noise\n" + RESULT_PREFIX + '{"name": "runner", "sta')
    (tmp_path / "probe.out").write_text(RESULT_PREFIX + '{"name": "runner"}\n')
    done = run_cli("smoke", "host", "--probe-output", str(tmp_path / "probe.out"))
    assert done.returncode == 2, done.stderr
    assert "probe.out is not the probe's output: line 1 of the probe's output: probe " \
        "result 'runner': needs a string name and detail" in done.stderr
    assert "Traceback" not in done.stderr
    for garbage in ("", "not the probe\n", '{"a": 1}\n'):  # no result line: no probe ran
        (tmp_path / "probe.out").write_text(garbage)
        done = run_cli("smoke", "host", "--probe-output", str(tmp_path / "probe.out"))
        assert done.returncode == 2, done.stderr
        assert "probe.out is not the probe's output: it has no line starting" in done.stderr


# ---------------------------------------------------------------------------------------
# Lockstep, judged on the probe's data format with sglang 0.5.9's real pins.

SGLANG_059_PINS = ["flashinfer_python==0.6.3", "flashinfer_cubin==0.6.3", "torch==2.9.1",
                   "sgl-kernel==0.3.21", "decord2; extra == 'test'"]


def _versions(**overrides: object) -> ProbeCheck:
    versions = {"flashinfer-python": "0.6.3", "flashinfer-cubin": "0.6.3",
                "flashinfer-jit-cache": "0.6.3+sm90.test", "torch": "2.11.0+cu130",
                "sglang": "0.5.9+sm120.1"}
    data = {"versions": versions, "manifest": MANIFEST, "manifest_error": None,
            "torch_cuda": "13.0"}
    for key, value in overrides.items():
        if key in data:
            data[key] = value
        else:
            versions[key.replace("_", "-")] = value  # type: ignore[assignment]
    return ProbeCheck("versions-data", "passed", "collected", data)


def test_lockstep_passes_when_everything_agrees() -> None:
    result = check_lockstep(_versions(), SGLANG_059_PINS)
    assert result.status == "passed", result.detail
    assert result.data["sglang_pins"] == {"flashinfer_python": "0.6.3",
                                          "flashinfer_cubin": "0.6.3"}


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"flashinfer_cubin": None}, "flashinfer_cubin is not installed (sglang pins "
                                 "flashinfer_cubin==0.6.3)"),
    ({"flashinfer_cubin": "0.6.2"}, "flashinfer_cubin 0.6.2 differs"),
    ({"flashinfer_python": "0.6.4", "flashinfer_cubin": "0.6.4"}, "but sglang pins 0.6.3"),
    ({"flashinfer_jit_cache": None}, "flashinfer_jit_cache (the kernel wheel) is not "
                                     "installed"),
    ({"flashinfer_jit_cache": "0.6.3"}, "is not flashinfer_python 0.6.3 plus a local label"),
    ({"flashinfer_jit_cache": "0.6.3.post1+sm90"}, "plus a local label"),
    ({"torch_cuda": "12.9"}, "built with CUDA 13.0 but torch uses CUDA 12.9"),
    ({"manifest": {**MANIFEST, "flashinfer_version": "0.6.2"}}, "built for FlashInfer 0.6.2"),
    ({"manifest": None, "manifest_error": "FileNotFoundError: sm120-manifest.json"},
     "FileNotFoundError"),
])
def test_lockstep_refuses_what_flashinfer_or_sglang_would(overrides: dict[str, object],
                                                           expected: str) -> None:
    result = check_lockstep(_versions(**overrides), SGLANG_059_PINS)
    assert result.status == "failed"
    assert expected in result.detail


# ---------------------------------------------------------------------------------------
# Real installed wheels: the patched sglang 0.5.9 and FlashInfer 0.6.3, no GPU.

FLASHINFER_063_SHA256 = "0fe2de934a4b3690c543dafb03f38d7bb4a762431abe8ae4f7292d6fef10c65d"


def _flashinfer_wheel() -> Path:
    """flashinfer_python 0.6.3 from PyPI (found by name on the simple index), cached."""
    folder = TEST_CACHE / "wheels"
    wheel = folder / "flashinfer_python-0.6.3-py3-none-any.whl"
    if not wheel.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--only-binary", ":all:", "flashinfer-python==0.6.3", "-d",
                        str(folder)], check=True)
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == FLASHINFER_063_SHA256, \
        "the index served other bytes for flashinfer_python 0.6.3"
    return wheel


def _kernel_wheel(folder: Path, version: str, manifest: dict[str, object]) -> Path:
    """A flashinfer_jit_cache wheel with the kernel wheel's interface (no libraries)."""
    name = f"flashinfer_jit_cache-{version}-py3-none-any.whl"
    init = ("import os\n__version__ = " + repr(version) + "\n"
            "def get_jit_cache_dir():\n"
            "    return os.path.join(os.path.dirname(__file__), 'jit_cache')\n")
    with WheelFile(folder / name, "w") as wheel:
        wheel.writestr("flashinfer_jit_cache/__init__.py", init)
        wheel.writestr("flashinfer_jit_cache/sm120-manifest.json", json.dumps(manifest))
        info = f"flashinfer_jit_cache-{version}.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: "
                       f"flashinfer_jit_cache\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                       "Root-Is-Purelib: true\nTag: py3-none-any\n")
    return folder / name


@pytest.fixture(scope="module")
def installed(sdists: dict[str, Path], shared_cache: Path,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(python, wheel): a venv with our sglang 0.5.9 wheel, FlashInfer 0.6.3 and a kernel
    wheel, all --no-deps (as on the GPU runner); no torch."""
    root = tmp_path_factory.mktemp("smoke")
    project = write_project(root / "project", sdist=sdists["0.5.9"])
    wheel = run_wheel(Options(targets_file=project / "targets.toml", cache_dir=shared_cache,
                              dist_dir=root / "dist")).path
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    kernels = _kernel_wheel(root, "0.6.3+sm90.test", MANIFEST)
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--quiet",
                    "--disable-pip-version-check", str(wheel), str(_flashinfer_wheel()),
                    str(kernels)], check=True)
    return python, wheel


def _smoke(python: Path, tmp_path: Path, *args: str) -> tuple[int, dict[str, object]]:
    done = run_cli("smoke", "host", "--python", str(python), "--json",
                   "--output", str(tmp_path / "report.json"), *args)
    written = json.loads((tmp_path / "report.json").read_text())
    printed = json.loads(done.stdout)
    assert printed["report"] == written  # --json: the error object carries the report
    return done.returncode, written


def _checks(report: dict[str, object]) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in report["checks"]}  # type: ignore[index, union-attr]


@pytest.mark.slow(reason="a venv with the 0.5.9 wheel and FlashInfer installed")
def test_host_smoke_on_a_cpu_machine_reports_what_it_finds(
        installed: tuple[Path, Path], tmp_path: Path) -> None:
    python, wheel = installed
    code, report = _smoke(python, tmp_path, "--sglang-wheel", str(wheel))
    checks = _checks(report)
    assert code == 1 and report["passed"] is False
    sglang = checks["sglang"]
    assert sglang["status"] == "passed", sglang["detail"]
    assert "'flashinfer_cutlass' is live at line 1842" in sglang["detail"]
    assert sglang["data"]["intents"][0]["holds"] is True
    lockstep = checks["lockstep"]
    assert lockstep["status"] == "failed"
    assert lockstep["detail"] == ("flashinfer_cubin is not installed (sglang pins "
                                  "flashinfer_cubin==0.6.3)")
    assert lockstep["data"]["installed"]["flashinfer-jit-cache"] == "0.6.3+sm90.test"
    # No torch and no GPU here: every GPU check says so, none pretends.
    assert checks["runner"]["status"] == "failed"
    assert checks["runner"]["detail"].startswith("torch is not installed")
    for name in ("kernels", "moe-autotune"):
        assert checks[name]["status"] == "failed"
        assert checks[name]["detail"].startswith("no CUDA device (torch is not installed")
    assert checks["server"]["status"] == "not-run" and not checks["server"]["required"]
    provenance, _ = wheel_provenance(wheel)
    assert report["artifacts"]["sglang"] == {  # type: ignore[index]
        "version": "0.5.9+sm120.7", "provenance_sha256": sha256_json(provenance)}
    assert report["artifacts"]["kernels"]["manifest_sha256"] == sha256_json(MANIFEST)  # type: ignore[index]


@pytest.mark.slow(reason="a venv with the 0.5.9 wheel and FlashInfer installed")
def test_an_edited_install_fails_the_sglang_check(installed: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    python, wheel = installed
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    runner = site / "sglang/srt/model_executor/model_runner.py"
    original = runner.read_text()
    try:  # what a hand edit over ssh does: the patch undone
        runner.write_text(original.replace('            "flashinfer_cutlass",',
                                           '            # "flashinfer_cutlass",', 1))
        code, report = _smoke(python, tmp_path, "--sglang-wheel", str(wheel))
    finally:
        runner.write_text(original)
    detail = _checks(report)["sglang"]["detail"]
    assert code == 1 and _checks(report)["sglang"]["status"] == "failed"
    assert "1 installed files differ from the RECORD (edited after install?): " \
           "sglang/srt/model_executor/model_runner.py" in detail
    assert "from the wheel's" not in detail  # its RECORD still says what was installed
    assert "intent of 0001-enable-flashinfer-cutlass-autotune.patch fails" in detail


@pytest.mark.slow(reason="a venv with the 0.5.9 wheel and FlashInfer installed")
def test_a_probe_run_by_hand_is_judged_the_same(installed: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    python, wheel = installed
    _, direct = _smoke(python, tmp_path, "--sglang-wheel", str(wheel))
    # The probe alone, as on a GPU box without the builder: only its folder (the links
    # copied as files) and the stdlib.
    alone = tmp_path / "alone"
    shutil.copytree(SCRIPT_DIR, alone)  # follows the links
    assert not any(p.is_symlink() for p in alone.iterdir())
    assert set(PROBE_FILES) <= {p.name for p in alone.iterdir()}
    out = subprocess.run([python, str(alone / "smoke_probe.py"), "--sglang-pattern",
                          "sglang/srt/model_executor/*.py"], capture_output=True, text=True,
                         check=True, cwd=alone).stdout
    (tmp_path / "probe.out").write_text(out)
    code, judged = _smoke(python, tmp_path, "--probe-output", str(tmp_path / "probe.out"),
                          "--sglang-wheel", str(wheel))
    assert code == 1
    strip = lambda r: [(c["name"], c["status"], c["detail"]) for c in r["checks"]]  # noqa: E731
    assert strip(judged) == strip(direct)
    assert judged["artifacts"] == direct["artifacts"]


@pytest.mark.slow(reason="a venv with the 0.5.9 wheel and FlashInfer installed")
def test_the_static_reader_runs_from_its_file_in_the_tested_interpreter(
        installed: tuple[Path, Path]) -> None:
    # The static smoke test's reader (builder/smoke/script/static_probe.py) run as in the
    # image, ``python -c`` with its spec in SM120_SMOKE, on the installed patched sglang.
    from builder.smoke.static import _PROBE

    python, wheel = installed
    assert (SCRIPT_DIR / "static_probe.py").read_text() == _PROBE
    spec = {"dists": ["sglang", "flashinfer-jit-cache", "no-such-dist"],
            "provenance_file": "sm120-provenance.json",
            "lines": [{"path": "sglang/srt/model_executor/model_runner.py", "line": 1},
                      {"path": "sglang/no/such.py", "line": 1}],
            "profile": "/no/profile", "launcher": "/no/launcher", "launcher_args": []}
    done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=True,
                          env={"SM120_SMOKE": json.dumps(spec), "PATH": "/usr/bin:/bin"})
    found = json.loads(done.stdout)
    provenance, _ = wheel_provenance(wheel)
    assert found["provenance"] == provenance
    assert found["dists"]["sglang"]["version"] == "0.5.9+sm120.7"
    assert found["dists"]["flashinfer-jit-cache"]["version"] == "0.6.3+sm90.test"
    assert found["dists"]["no-such-dist"] is None
    assert found["wheel_tags"] == ["py3-none-any"]
    assert found["lines"][0] is not None and found["lines"][1] is None
    assert (found["profile_sha256"], found["launcher"]) == (None, None)


@pytest.mark.slow(reason="a venv with the 0.5.9 wheel and FlashInfer installed")
def test_sglang_check_compares_provenance_with_the_artifact(
        installed: tuple[Path, Path], tmp_path: Path) -> None:
    python, wheel = installed
    provenance, _ = wheel_provenance(wheel)
    (tmp_path / "other.json").write_text(json.dumps({**provenance, "target": "other"}))
    _, report = _smoke(python, tmp_path, "--expect-provenance", str(tmp_path / "other.json"))
    assert _checks(report)["sglang"]["detail"] == \
        "the provenance differs from the artifact's in target"
    _, report = _smoke(python, tmp_path)  # nothing to compare with: a warning, not a pass
    sglang = _checks(report)["sglang"]
    assert sglang["status"] == "warning" and "not compared with an artifact" in \
        sglang["detail"]


@pytest.mark.slow(reason="a venv with the 0.5.9 wheel and FlashInfer installed")
def test_release_gate_refuses_failed_or_other_artifacts(installed: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    python, wheel = installed
    _, written = _smoke(python, tmp_path, "--sglang-wheel", str(wheel))
    provenance, _ = wheel_provenance(wheel)
    with pytest.raises(BuilderError, match="did not pass"):
        require_passed(SmokeReport.from_json(written), sglang_provenance=provenance)
    # The gate's second half on a passing report: the digests must be this artifact's.
    passing = SmokeReport("host", (
        CheckResult("runner", "passed", "GPU"),
        CheckResult("sglang", "passed", "ours",
                    data={"provenance_sha256": sha256_json(provenance)}),
        CheckResult("lockstep", "passed", "pins"), CheckResult("kernels", "passed", "found")),
                          {"sglang": {"provenance_sha256": sha256_json(provenance)},
                           "kernels": {"manifest_sha256": sha256_json(MANIFEST)}})
    require_passed(passing, sglang_provenance=provenance, kernel_manifest=MANIFEST)
    with pytest.raises(BuilderError, match="tested another sglang artifact"):
        require_passed(passing, sglang_provenance={**provenance, "version": "0.5.9+sm120.8"})
    with pytest.raises(BuilderError, match="tested another kernels artifact"):
        require_passed(passing, kernel_manifest={**MANIFEST, "version": "0.6.3+other"})


def test_intent_patterns_map_repository_paths_to_installed_ones() -> None:
    series = load_series(REPO / "patches" / "series.toml")
    patterns = intent_patterns(series)
    assert patterns == sorted(set(patterns))
    # repository paths (python/sglang/...) become installed ones (sglang/...), globs kept
    assert {"sglang/srt/arg_groups/*.py", "sglang/srt/arg_groups/overrides.py",
            "sglang/srt/model_executor/*.py",
            "sglang/kernels/ops/attention/dsa/tilelang_kernel.py"} <= set(patterns)
    assert not any(p.startswith("python/") for p in patterns)


def test_bad_input_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = run_cli("smoke", "image")
    assert done.returncode == 2 and "the following arguments are required: --image" in \
        done.stderr
    done = run_cli("smoke", "host", "--series", str(tmp_path / "none.toml"))
    assert done.returncode == 2 and "none.toml" in done.stderr
    (tmp_path / "not.whl").write_text("no zip")
    done = run_cli("smoke", "host", "--sglang-wheel", str(tmp_path / "not.whl"))
    assert done.returncode == 2 and "cannot read the wheel" in done.stderr


def test_smoke_is_listed_and_help_works_without_torch() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                           "from builder.cli.main import main; main(['smoke', '--help'])"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert "exit status: 0 passed, 1 failed, 2 bad input" in done.stdout
    assert "3 misconfigured runner" in done.stdout


# ---------------------------------------------------------------------------------------
# Image mode: the engine's errors. The first text was observed here: Docker Engine
# 20.10.24 (Debian docker.io) started by hand, docker-py 7.2.0, a container created with
# DeviceRequest(count=-1, capabilities=[["gpu"]]); start() raised APIError 500 with this
# explanation. The second is nvidia-container-toolkit's when the host driver is missing
# (NVIDIA/nvidia-docker#1393, NVIDIA/nvidia-container-toolkit#260). The third was observed
# here too: an image without the command.

NO_NVIDIA_RUNTIME = 'could not select device driver "" with capabilities: [[gpu]]'
NO_DRIVER = ("failed to create shim: OCI runtime create failed: container_linux.go:380: "
             "starting container process caused: process_linux.go:545: container init "
             "caused: Running hook #0:: error running hook: exit status 1, stdout: , stderr: "
             "nvidia-container-cli: initialization error: nvml error: driver not loaded: "
             "unknown")
NO_COMMAND = ('failed to create shim task: OCI runtime create failed: runc create failed: '
              'unable to start container process: exec: "python3": executable file not '
              'found in $PATH: unknown')


def test_engine_errors_are_classified() -> None:
    assert classify_engine_error(NO_NVIDIA_RUNTIME) == "misconfigured-runner"
    assert classify_engine_error(
        '500 Server Error for http+docker://localhost/v1.41/containers/b539d1c43fc6/start: '
        f'Internal Server Error ("{NO_NVIDIA_RUNTIME}")') == "misconfigured-runner"
    assert classify_engine_error(NO_DRIVER) == "misconfigured-runner"
    assert classify_engine_error(NO_COMMAND) == "broken-image"


def test_no_engine_is_a_misconfigured_runner(tmp_path: Path) -> None:
    done = run_cli("smoke", "image", "--image", "sglang-sm120:test", "--json",
                   "--output", str(tmp_path / "r.json"),
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert done.returncode == 3, done.stdout + done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["misconfigured_runner"] is True and report["passed"] is False
    runner = _checks(report)["runner"]
    assert runner["detail"].startswith("misconfigured runner: no Docker Engine answers")
    assert _checks(report)["kernels"]["status"] == "not-run"


@pytest.mark.slow(reason="starts a Docker Engine")
def test_engine_without_nvidia_runtime_is_a_misconfigured_runner(docker_engine,
                                                                 kernel_base_image,
                                                                 tmp_path: Path) -> None:
    """A real Docker Engine with no NVIDIA runtime, asked for a GPU: exit 3, reported as
    the runner's fault (not the image's), and no container left behind."""
    done = run_cli("smoke", "image", "--image", kernel_base_image.name, "--json",
                   "--output", str(tmp_path / "r.json"), env=docker_engine.env)
    assert done.returncode == 3, done.stdout + done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["misconfigured_runner"] is True and report["passed"] is False
    assert "could not select device driver" in _checks(report)["runner"]["detail"]
    assert docker_engine.api.containers(all=True) == []

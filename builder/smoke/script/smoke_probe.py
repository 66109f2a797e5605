"""The GPU side of the smoke test: runs inside the environment (or image) under test.

This folder (``builder/smoke/script/``) is what runs in the tested interpreter: this file
is run by path (``python smoke_probe.py ARGS``), on the host in ``host`` mode and inside
the container in ``image`` mode, with its two neighbours ``sm120_arch.py`` (the arch rule,
:mod:`builder.core.arch`) and ``smoke_shared.py`` (the result format and FlashInfer's log
rules, :mod:`builder.smoke.shared`), which are links to the builder's own modules and are
copied with it. It imports only those and the standard library at import time; torch,
FlashInfer and the kernel wheel are imported inside the checks. The builder never imports
it: it reads its output (:meth:`builder.smoke.shared.ProbeResults.from_output`).

Each finished check is printed on standard output as one line, ``RESULT_PREFIX``
followed by a JSON object (:class:`smoke_shared.ProbeCheck`), as soon as it is done: a
crash in a later check (a CUDA fault kills the process) leaves the earlier results
readable.

Facts about FlashInfer used here, read in ``flashinfer_python`` 0.6.3's source:

* ``jit/core.py``: ``JitSpec.build_and_load`` loads ``<FLASHINFER_AOT_DIR>/<name>/<name>.so``
  when it exists (``is_aot``), else calls ``build``, which raises ``MissingJITCacheError``
  when ``FLASHINFER_DISABLE_JIT`` is set (to any non-empty value).
* ``jit/env.py``: ``FLASHINFER_AOT_DIR`` is ``flashinfer_jit_cache.get_jit_cache_dir()`` when
  that package is installed (its version must start with FlashInfer's; flashinfer_cubin's
  must equal it); computed once, at import.
* ``fused_moe/core.py``: ``cutlass_fused_moe`` picks the module ``fused_moe_<arch>`` from the
  compute capability (120/121 -> 120, 103, 100/110 -> 100, 90, 89).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fnmatch
import hashlib
import importlib
import importlib.metadata as metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sm120_arch import arch_runs_on, flashinfer_arch
from smoke_shared import (
    MANIFEST_FILE,
    RESULT_PREFIX,
    CrashData,
    KernelsData,
    Manifest,
    MoeData,
    MoeModule,
    ProbeCheck,
    ProbeData,
    Reason,
    RunnerData,
    RunnerInfo,
    SglangData,
    Status,
    VersionsData,
    autotune_summary,
    classify_line,
    count_warnings,
    parse_manifest,
    untuned,
)

if TYPE_CHECKING:
    import torch

KERNEL_PACKAGE = "flashinfer_jit_cache"

#: The module FlashInfer's autotuner loads while profiling (``delay_kernel`` in
#: ``flashinfer/tllm_utils.py``, 0.6.3 to 0.7.2).
AUTOTUNER_MODULE: Final = "trtllm_utils"

#: The result each ``--checks`` name prints (a crashed check is reported under it too).
RESULT_NAMES: Final = {"runner": "runner", "sglang": "sglang-data",
                       "versions": "versions-data", "kernels": "kernels",
                       "moe": "moe-autotune"}

# ---------------------------------------------------------------------------------------
# Check 5's verdict, the FlashInfer module choice and the manifest on disk (no torch).


def moe_verdict(variants: list[dict[str, Any]]) -> tuple[Status, str]:
    """Check 5's status and detail from its variants' results and autotune summaries.

    Fails when a variant's numbers are wrong, when a variant's autotune profiled no
    tactic (it tuned nothing), or when any tactic was skipped for a module missing from
    the jit-cache. Skips the hardware causes stay warnings. The default/tuned time ratio
    is reported only for a variant that really tuned.

    Args:
        variants: per variant ``ok`` (bool, or None: not run), ``autotune`` (from
            :func:`autotune_summary`), timings and errors as :func:`check_moe` records.

    Returns:
        ``(status, detail)``.
    """
    parts, failures, warned = [], [], False
    for v in variants:
        name = v["variant"]
        if v["ok"] is None:
            parts.append(f"{name} not run")
            continue
        if v["ok"] is False:
            failures.append(f"{name}: " + (v.get("error") or
                            f"error default {v['default_error']:.3g}, tuned "
                            f"{v['tuned_error']:.3g} > {v['tolerance']:g}"))
            continue
        tuned = v.get("autotune") or {"profiled": 0, "chosen": [], "skipped": {}}
        skipped, cause = tuned["skipped"], untuned(tuned)
        if cause == "missing_module":
            failures.append(f"{name}: {skipped['missing_module']} tactics skipped because a "
                            "module is missing from the jit-cache with JIT disabled (the "
                            "autotuner's trtllm_utils?): nothing was tuned")
            continue
        if cause == "none_profiled":
            failures.append(f"{name}: autotune profiled no tactic: nothing was tuned")
            continue
        ratio = v.get("default_over_tuned")
        parts.append(f"{name}: {tuned['profiled']} tactics profiled, chosen "
                     f"{'/'.join(tuned['chosen']) or '?'} vs default -1"
                     + (f", default/tuned {ratio:.2f}x" if ratio else ""))
        hardware, other = skipped.get("hardware", 0), skipped.get("other", 0)
        if hardware or other:
            warned = True
            parts[-1] += f" ({hardware} skipped for the hardware, {other} for other causes)"
    if failures:
        return Status.FAILED, "; ".join(failures)
    return (Status.WARNING if warned else Status.PASSED), "; ".join(parts)


def moe_module_name(capability: tuple[int, int]) -> str | None:
    """The CUTLASS fused MoE module ``cutlass_fused_moe`` loads on this GPU, if any."""
    arch = str(capability[0] * 10 + capability[1])
    backend = {"120": "120", "121": "120", "103": "103", "100": "100", "110": "100",
               "90": "90", "89": "89"}.get(arch)
    return f"fused_moe_{backend}" if backend else None


def read_manifest() -> tuple[Manifest, Path]:
    """Find the installed kernel wheel and read its manifest.

    Two layouts: up to FlashInfer 0.6 one ``flashinfer_jit_cache`` package holds the
    modules (manifest beside its ``__init__.py``); from 0.7 it is a shim whose
    ``get_jit_cache_providers()`` lists per-arch provider packages, ours with the manifest
    beside the provider's ``jit_cache`` folder (``flashinfer/jit/env.py`` of 0.7.2).

    Returns:
        The manifest and the folder holding ``NAME/NAME.so`` (``get_jit_cache_dir()``,
        or the provider's ``jit_cache_dir``).

    Raises:
        ImportError: ``flashinfer_jit_cache`` is not installed.
        OSError, ValueError: the manifest is missing or malformed, or no installed
            provider was built by this builder.
    """
    package = importlib.import_module(KERNEL_PACKAGE)
    providers = getattr(package, "get_jit_cache_providers", None)
    if providers is not None:
        found = list(providers())
        for provider in found:
            path = Path(str(provider.jit_cache_dir)).parent / MANIFEST_FILE
            if path.is_file():
                return (parse_manifest(json.loads(path.read_text())),
                        Path(str(provider.jit_cache_dir)))
        raise FileNotFoundError("no flashinfer-jit-cache provider of this builder is "
                                "installed (providers: "
                                f"{', '.join(p.provider_id for p in found) or 'none'})")
    folder = Path(str(package.__file__)).parent
    data = json.loads((folder / MANIFEST_FILE).read_text())
    return parse_manifest(data), Path(package.get_jit_cache_dir())


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _record_digest(path: Path) -> str:
    """The file's hash as a wheel's RECORD writes it (``sha256=<urlsafe b64, no padding>``)."""
    import base64

    raw = bytes.fromhex(sha256_file(path))
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# ---------------------------------------------------------------------------------------
# Torch reference math (imported lazily; tested on the CPU).


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing, renormalised over the chosen experts (as SGLang and
    FlashInfer's own MoE tests route).

    Args:
        router_logits: ``[tokens, experts]``.
        top_k: experts per token.

    Returns:
        ``(weights, experts)``: float32 ``[tokens, top_k]`` summing to 1 per token, and int64
        expert indices ``[tokens, top_k]``.
    """
    import torch

    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


def moe_reference(x: torch.Tensor, w31: torch.Tensor, w2: torch.Tensor,
                  weights: torch.Tensor, experts: torch.Tensor, *,
                  intermediate: Callable[[torch.Tensor], torch.Tensor] | None = None
                  ) -> torch.Tensor:
    """A plain SwiGLU mixture of experts in float32, with ``cutlass_fused_moe``'s layout.

    ``out[t] = sum_k weights[t, k] * (silu(x[t] @ gate.T) * (x[t] @ up.T)) @ w2[e].T`` with
    ``e = experts[t, k]``, where ``w31[e]`` stacks ``up`` (rows ``0..I-1``) over ``gate``
    (rows ``I..2I-1``): the CUTLASS kernel reads the linear value at ``elem`` and the gate at
    ``elem + inter_size`` (flashinfer 0.6.3, data/csrc/fused_moe/cutlass_backend/
    cutlass_fused_moe_kernels.cuh, ``doGatedActivationKernel``), and FlashInfer's tests split
    ``w3, w1 = torch.chunk(w31, 2, dim=0)``.

    Args:
        x: ``[tokens, hidden]``.
        w31: ``[experts, 2 * inter, hidden]`` (fc1, up over gate).
        w2: ``[experts, hidden, inter]`` (fc2).
        weights: ``[tokens, top_k]`` routing weights.
        experts: ``[tokens, top_k]`` expert indices.
        intermediate: applied to each expert's activation before fc2, to model the
            kernel's rounding of it (to bf16, or an fp8 quantisation).

    Returns:
        float32 ``[tokens, hidden]``.
    """
    import torch

    x = x.float()
    inter_size = w31.shape[1] // 2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for expert in range(w31.shape[0]):
        tokens, slots = torch.where(experts == expert)
        if tokens.numel() == 0:
            continue
        up, gate = w31[expert, :inter_size].float(), w31[expert, inter_size:].float()
        rows = x[tokens]
        act = torch.nn.functional.silu(rows @ gate.T) * (rows @ up.T)
        if intermediate is not None:
            act = intermediate(act)
        out.index_add_(0, tokens, weights[tokens, slots, None].float()
                       * (act @ w2[expert].float().T))
    return out


FP8_MAX = 448.0  # largest finite float8_e4m3fn


def fp8_quantize(tensor: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-tensor float8_e4m3fn quantisation: ``tensor ~= q.float() * scale``.

    Returns:
        ``(q, scale)`` with ``scale = amax / 448`` (1.0 for an all-zero tensor).
    """
    import torch

    amax = float(tensor.abs().max())
    scale = amax / FP8_MAX if amax > 0 else 1.0
    q = (tensor.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_round_trip(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    """``tensor`` quantised to float8_e4m3fn with ``scale`` and back, in float32."""
    import torch

    q = (tensor.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.float() * scale


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (a scale-free error for a whole tensor)."""
    denominator = float(expected.float().abs().max()) or 1.0
    return float((actual.float() - expected.float()).abs().max()) / denominator


@dataclass(frozen=True)
class MoeCase:
    """Seeded inputs of one MoE problem, made on the CPU (the same on every machine)."""

    x: torch.Tensor
    w31: torch.Tensor
    w2: torch.Tensor
    router_logits: torch.Tensor
    top_k: int


def moe_case(tokens: int = 256, hidden: int = 512, inter: int = 512, experts: int = 8,
             top_k: int = 2, seed: int = 0) -> MoeCase:
    """Make a MoE problem in float32 with values scaled like FlashInfer's tests (1/5)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return MoeCase(
        x=torch.randn(tokens, hidden, generator=gen) / 5,
        w31=torch.randn(experts, 2 * inter, hidden, generator=gen) / 5,
        w2=torch.randn(experts, hidden, inter, generator=gen) / 5,
        router_logits=torch.randn(tokens, experts, generator=gen), top_k=top_k)


# ---------------------------------------------------------------------------------------
# Checks. Each returns a ProbeCheck, its data one of smoke_shared's ProbeData payloads.


def _result(name: str, status: Status, detail: str, data: ProbeData | None = None, *,
            reason: Reason | None = None) -> ProbeCheck:
    return ProbeCheck(name, status, detail, data.to_json() if data else {}, reason)


#: The detail and reason of a GPU check when there is no GPU.
NoGpu = tuple[str, Reason]
NO_DEVICE: Final[NoGpu] = ("no CUDA device", Reason.NO_DEVICE)


def _no_gpu(name: str, no_gpu: NoGpu) -> ProbeCheck:
    return _result(name, Status.FAILED, no_gpu[0], reason=no_gpu[1])


def _emit(result: ProbeCheck) -> None:
    # A leading newline: native code may have left a line unfinished on stdout.
    sys.stdout.flush()
    print("\n" + RESULT_PREFIX + json.dumps(result.to_json(), default=str), flush=True)


def _cuda_driver_attribute(ordinal: int, attribute: int) -> int | None:
    """``cuDeviceGetAttribute`` through libcuda (None where the driver library is absent)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, value = ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) != 0:
        return None
    return value.value


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # nvidia-ml-py absent or NVML unusable: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


_SMEM_OPTIN_ATTRIBUTE = 97  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (cuda.h)


def _installed(project: str) -> str | None:
    try:
        return metadata.version(project)
    except metadata.PackageNotFoundError:
        return None


def check_runner() -> ProbeCheck:
    """Check 1: the GPU, its compute capability, driver, CUDA runtime, shared memory, and
    the arch FlashInfer compiles for on it (``None`` without FlashInfer)."""
    try:
        import torch
    except ImportError as exc:
        return _result("runner", Status.FAILED, f"torch is not installed: {exc}",
                       reason=Reason.NO_TORCH)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return _result("runner", Status.FAILED, NO_DEVICE[0],
                       RunnerInfo(torch.__version__, torch.version.cuda), reason=NO_DEVICE[1])
    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    if smem is None:
        smem = _cuda_driver_attribute(0, _SMEM_OPTIN_ATTRIBUTE)
    driver_cuda = None
    with contextlib.suppress(OSError, AttributeError):
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            driver_cuda = f"{version.value // 1000}.{version.value % 1000 // 10}"
    data = RunnerData(
        torch=torch.__version__, torch_cuda=torch.version.cuda, gpu=props.name,
        devices=torch.cuda.device_count(),
        compute_capability=f"{capability[0]}.{capability[1]}",
        flashinfer_arch=flashinfer_arch(capability, flashinfer)
        if (flashinfer := _installed("flashinfer-python")) else None,
        driver=_driver_version(), driver_cuda=driver_cuda, cuda_runtime=torch.version.cuda,
        shared_memory_per_block_optin=smem, multiprocessors=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1))
    smem_text = f"{smem / 1024:.0f} KiB" if isinstance(smem, int) else "unknown"
    detail = (f"{props.name}, sm_{capability[0]}{capability[1]}, driver {data.driver}, "
              f"CUDA runtime {torch.version.cuda}, shared memory per block (opt-in) "
              f"{smem_text}")
    return _result("runner", Status.PASSED, detail, data)


def collect_sglang(patterns: Sequence[str]) -> ProbeCheck:
    """Data for check 2: the installed sglang's version, provenance, RECORD and some texts.

    Args:
        patterns: ``fnmatch`` patterns of installed paths (``sglang/srt/...``) whose text the
            host needs for the intent checks.
    """
    try:
        dist = metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        return _result("sglang-data", Status.FAILED, "sglang is not installed")
    provenance = dist.read_text("sm120-provenance.json")
    record: dict[str, str | None] = {}
    mismatched: list[str] = []
    missing: list[str] = []
    texts: dict[str, str] = {}
    for file in dist.files or []:
        name = str(file)
        if not name.startswith("sglang/"):
            continue
        record[name] = f"{file.hash.mode}={file.hash.value}" if file.hash else None
        path = Path(str(file.locate()))
        if not path.is_file():
            if file.hash is not None:  # unhashed entries (.pyc) are made at install time
                missing.append(name)
            continue
        if file.hash is not None and _record_digest(path) != record[name]:
            mismatched.append(name)
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            texts[name] = path.read_text(encoding="utf-8", errors="replace")
    return _result("sglang-data", Status.PASSED, "collected", SglangData(
        version=dist.version, provenance=provenance, requires=list(dist.requires or []),
        record=record, mismatched=mismatched, missing=missing, texts=texts))


def collect_versions() -> ProbeCheck:
    """Data for check 3: installed versions of FlashInfer's packages and the manifest."""
    versions = {name: _installed(name) for name in (
        "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "torch", "sglang")}
    manifest: dict[str, Any] | None = None
    manifest_error = None
    try:
        manifest = read_manifest()[0].raw
    except Exception as exc:  # reported, judged by the host
        manifest_error = f"{type(exc).__name__}: {exc}"
    torch_cuda = None
    with contextlib.suppress(ImportError):
        import torch

        torch_cuda = torch.version.cuda
    return _result("versions-data", Status.PASSED, "collected", VersionsData(
        versions=versions, manifest=manifest, manifest_error=manifest_error,
        torch_cuda=torch_cuda))


@contextlib.contextmanager
def _captured(logger: logging.Logger) -> Iterator[list[str]]:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.extend(record.getMessage().splitlines())

    # The autotuner's per-tactic lines are debug records: lower the logger's level for the
    # capture, and raise its own handlers to where the logger was so they print no more.
    level = logger.level
    raised = [(h, h.level) for h in logger.handlers if h.level < level]
    for h, _ in raised:
        h.setLevel(level)
    handler = Collect(level=logging.DEBUG)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for h, old in raised:
            h.setLevel(old)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def _known_answer_tests(device: str) -> list[tuple[str, str, Callable[[], tuple[float, float]]]]:
    """(name, module, run) for each known-answer test; run returns (error, tolerance)."""
    import flashinfer
    import flashinfer.sampling as sampling
    import torch

    gen = torch.Generator().manual_seed(1234)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    def norm() -> tuple[float, float]:
        x = randn(7, 1024).to(device, torch.bfloat16)
        w = (1 + randn(1024) / 4).to(device, torch.bfloat16)
        out = flashinfer.rmsnorm(x, w, eps=1e-6)
        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return relative_error(out, ref), 2e-2

    def activation(kind: str) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            x = randn(7, 2 * 1024).to(device, torch.bfloat16)
            a, b = x[..., :1024].float(), x[..., 1024:].float()
            fn = torch.nn.functional
            if kind == "silu":
                out, ref = flashinfer.silu_and_mul(x), fn.silu(a) * b
            elif kind == "gelu":
                out, ref = flashinfer.gelu_and_mul(x), fn.gelu(a) * b
            else:
                out, ref = flashinfer.gelu_tanh_and_mul(x), fn.gelu(a, approximate="tanh") * b
            return relative_error(out, ref), 2e-2
        return run

    def logits() -> torch.Tensor:
        return (randn(4, 4096) * 3).to(device)

    def softmax() -> tuple[float, float]:
        x = logits()
        return relative_error(sampling.softmax(x), torch.softmax(x, dim=-1)), 1e-3

    def top_k_one_is_argmax() -> tuple[float, float]:
        probs = torch.softmax(logits(), dim=-1)
        got = sampling.top_k_sampling_from_probs(probs, 1, deterministic=True)
        return float((got.long() != probs.argmax(-1)).sum()), 0.0

    def one_hot_rows() -> tuple[float, float]:
        hot = torch.tensor([5, 4095, 0, 1234], device=device)
        probs = torch.zeros(4, 4096, device=device)
        probs[torch.arange(4, device=device), hot] = 1.0
        got = sampling.sampling_from_probs(probs, deterministic=True)
        return float((got.long() != hot).sum()), 0.0

    def top_p_dominant() -> tuple[float, float]:
        probs = torch.softmax(logits(), dim=-1) * 0.1
        top = torch.tensor([17, 3000, 42, 999], device=device)
        probs[torch.arange(4, device=device), top] += 0.9  # one token holds >= 0.9 of mass
        got = sampling.top_p_sampling_from_probs(probs, 0.5, deterministic=True)
        return float((got.long() != top).sum()), 0.0

    def top_k_renorm() -> tuple[float, float]:
        probs = torch.softmax(logits(), dim=-1)
        kept = torch.topk(probs, 20, dim=-1)
        ref = torch.zeros_like(probs).scatter(-1, kept.indices, kept.values)
        ref = ref / ref.sum(-1, keepdim=True)
        return relative_error(sampling.top_k_renorm_probs(probs, 20), ref), 1e-3

    return [
        ("rmsnorm", "norm", norm),
        ("silu_and_mul", "silu_and_mul", activation("silu")),
        ("gelu_and_mul", "gelu_and_mul", activation("gelu")),
        ("gelu_tanh_and_mul", "gelu_tanh_and_mul", activation("gelu_tanh")),
        ("softmax", "sampling", softmax),
        ("top_k_sampling k=1 is argmax", "sampling", top_k_one_is_argmax),
        ("sampling_from_probs one-hot rows", "sampling", one_hot_rows),
        ("top_p_sampling dominant token", "sampling", top_p_dominant),
        ("top_k_renorm_probs k=20", "sampling", top_k_renorm),
    ]


# The known-answer groups the issue requires: each must run, whatever the wheel holds.
REQUIRED_GROUPS: dict[str, tuple[str, ...]] = {
    "norm": ("norm",),
    "activation": ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"),
    "sampling": ("sampling",),
}


def check_kernels(capability: tuple[int, int] | None,
                  no_gpu: NoGpu = NO_DEVICE) -> ProbeCheck:
    """Check 4: with JIT disabled, every module of the kernel wheel loads for this GPU and
    the known-answer tests match torch.

    Args:
        capability: the GPU's compute capability (None: no GPU).
        no_gpu: the detail and reason when there is no GPU.
    """
    name = "kernels"
    if capability is None:
        return _no_gpu(name, no_gpu)
    try:
        manifest, jit_dir = read_manifest()
    except Exception as exc:
        return _result(name, Status.FAILED, f"kernel wheel unusable: {_error_text(exc)}")
    try:
        from flashinfer.jit import core as jit_core
        from flashinfer.jit import env as jit_env
    except Exception as exc:
        return _result(name, Status.FAILED, f"flashinfer does not import: {_error_text(exc)}")
    problems: list[str] = []
    # FlashInfer >= 0.7 resolves each module through the providers (get_aot_path); older
    # ones read one folder, FLASHINFER_AOT_DIR.
    per_module = getattr(jit_env, "get_aot_path", None)
    if per_module is None and Path(jit_env.FLASHINFER_AOT_DIR).resolve() != jit_dir.resolve():
        problems.append(f"FlashInfer looks for modules in {jit_env.FLASHINFER_AOT_DIR}, "
                        f"not in the kernel wheel's {jit_dir}")
    # 0.7 made JitSpec abstract; the nvcc spec is JitSpecNvcc.
    spec_class = getattr(jit_core, "JitSpecNvcc", jit_core.JitSpec)
    modules = [_load_module(module, manifest, jit_dir, capability, spec_class)
               for module in manifest.modules]
    problems += [f"{entry['name']}: {entry['error']}" for entry in modules if "error" in entry]
    tests = _run_known_answer_tests({m.name for m in manifest.modules}, problems)
    compiled = sorted(str(p) for p in Path(jit_env.FLASHINFER_JIT_DIR).rglob("*.so")) \
        if Path(jit_env.FLASHINFER_JIT_DIR).is_dir() else []
    if compiled:
        problems.append(f"something was compiled at run time: {compiled[:3]}")
    data = KernelsData(jit_cache_dir=str(jit_dir),
                       disable_jit=os.environ.get("FLASHINFER_DISABLE_JIT"), modules=modules,
                       known_answer_tests=tests, compiled_at_run_time=compiled)
    if problems:
        return _result(name, Status.FAILED, "; ".join(problems[:4]) +
                       (f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""),
                       data)
    return _result(name, Status.PASSED, f"{len(modules)} modules load for sm_{capability[0]}"
                   f"{capability[1]} with FLASHINFER_DISABLE_JIT=1; {len(tests)} known-answer "
                   "tests match torch", data)


def _load_module(module: Any, manifest: Manifest, jit_dir: Path,
                 capability: tuple[int, int], spec_class: Any) -> dict[str, Any]:
    """Check 4 for one module of the manifest: in the wheel, its sha256, built for this
    GPU, found and loaded by FlashInfer (``error`` says what failed)."""
    entry: dict[str, Any] = {"name": module.name, "sass": list(module.sass)}
    library = jit_dir / module.path
    archs = module.sass or manifest.arch_list
    entry["runs_on_gpu"] = any(arch_runs_on(a, capability) for a in archs)
    if not library.is_file():
        entry["error"] = f"{module.path} is not in the wheel"
    elif sha256_file(library) != module.sha256:
        entry["error"] = f"{module.path} does not match the manifest's sha256"
    elif not entry["runs_on_gpu"]:
        entry["error"] = (f"built for {', '.join(archs)}, which cannot run on sm_"
                          f"{capability[0]}{capability[1]}")
    else:
        try:
            spec = spec_class(name=module.name, sources=[], extra_cflags=None,
                              extra_cuda_cflags=None, extra_ldflags=None,
                              extra_include_dirs=None)
            if not spec.is_aot:
                raise RuntimeError(f"FlashInfer does not find it ({spec.aot_path})")
            if Path(spec.aot_path).resolve() != library.resolve():
                raise RuntimeError(f"FlashInfer picks {spec.aot_path}, not the kernel "
                                   f"wheel's {library}")
            spec.build_and_load()
            entry["loaded"] = True
        except Exception as exc:
            entry["error"] = _error_text(exc)
    return entry


def _run_known_answer_tests(shipped: set[str], problems: list[str]) -> list[dict[str, Any]]:
    """Run the known-answer tests of the modules the wheel ships (every required group
    runs); each failure is added to ``problems``."""
    import torch

    tests: list[dict[str, Any]] = []
    try:
        known_answer_tests = _known_answer_tests("cuda")
    except Exception as exc:
        known_answer_tests = []
        problems.append(f"flashinfer does not import: {_error_text(exc)}")
    for test, module_name, run in known_answer_tests:
        group = next(g for g, names in REQUIRED_GROUPS.items() if module_name in names)
        # An activation variant the wheel does not ship is skipped, but a group never is.
        if module_name not in shipped and any(n in shipped for n in REQUIRED_GROUPS[group]):
            continue
        outcome: dict[str, Any] = {"test": test, "module": module_name, "group": group}
        try:
            error, tolerance = run()
            torch.cuda.synchronize()
            outcome.update(error=error, tolerance=tolerance, ok=error <= tolerance)
        except Exception as exc:
            outcome.update(ok=False, error=_error_text(exc))
        if not outcome["ok"]:
            problems.append(f"{test}: " + (f"error {outcome['error']:.3g} > "
                                           f"{outcome['tolerance']:g}"
                                           if isinstance(outcome["error"], float)
                                           else str(outcome["error"])))
        tests.append(outcome)
    return tests


def _time_ms(run: Callable[[], Any], iterations: int = 20) -> float:
    """Median milliseconds per call, measured with CUDA events after 3 warm-up calls."""
    torch: Any = importlib.import_module("torch")  # untyped CUDA events

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(sorted(times)[len(times) // 2])


@dataclass(frozen=True)
class MoeProblem:
    """One variant's inputs as ``cutlass_fused_moe`` takes them, and the expected output.

    Attributes:
        kind: ``bf16`` or ``fp8``.
        x: ``[tokens, hidden]`` activations (bf16, or float8_e4m3fn).
        w31: ``[experts, 2 * inter, hidden]`` fc1 weights (up over gate).
        w2: ``[experts, hidden, inter]`` fc2 weights.
        weights: float32 ``[tokens, top_k]`` routing weights.
        experts: int32 ``[tokens, top_k]`` expert ids.
        quant_scales: ``None`` (bf16) or FP8's four scales, in the order SGLang's ModelOpt
            FP8 path passes them (sglang 0.5.9, layers/quantization/modelopt_quant.py):
            fc1 dequant ``w13_scale * input_scale`` ``[experts]``, fc2 quant ``1 /
            act_scale``, fc2 dequant ``act_scale * w2_scale`` ``[experts]``, fc1 input
            dequant ``input_scale``.
        reference: float32 ``[tokens, hidden]`` from :func:`moe_reference`.
        tolerance: the largest :func:`relative_error` accepted.
    """

    kind: str
    x: torch.Tensor
    w31: torch.Tensor
    w2: torch.Tensor
    weights: torch.Tensor
    experts: torch.Tensor
    quant_scales: list[torch.Tensor] | None
    reference: torch.Tensor
    tolerance: float


def moe_problem(kind: str, case: MoeCase, device: str) -> MoeProblem:
    """Prepare a variant of ``case`` on ``device``; the reference models the kernel's
    roundings (the intermediate to bf16, or quantised to fp8 with fc2's activation scale).
    """
    import torch

    weights, experts = route(case.router_logits, case.top_k)
    weights, experts = weights.to(device), experts.to(device, torch.int32)
    if kind == "bf16":
        x = case.x.to(device, torch.bfloat16)
        w31, w2 = case.w31.to(device, torch.bfloat16), case.w2.to(device, torch.bfloat16)
        ref = moe_reference(x, w31, w2, weights, experts,
                            intermediate=lambda t: t.to(torch.bfloat16).float())
        return MoeProblem(kind, x, w31, w2, weights, experts, None, ref, 2e-2)
    xq, sx = fp8_quantize(case.x)
    q31 = [fp8_quantize(w) for w in case.w31]
    q2 = [fp8_quantize(w) for w in case.w2]
    s31 = torch.tensor([s for _, s in q31])
    s2 = torch.tensor([s for _, s in q2])
    x_deq = (xq.float() * sx).to(device)
    w31_deq = (torch.stack([q.float() for q, _ in q31]) * s31[:, None, None]).to(device)
    w2_deq = (torch.stack([q.float() for q, _ in q2]) * s2[:, None, None]).to(device)
    amax: list[float] = []

    def record(act: torch.Tensor) -> torch.Tensor:
        amax.append(float(act.abs().max()))
        return act

    moe_reference(x_deq, w31_deq, w2_deq, weights, experts, intermediate=record)
    a2 = max(amax) / FP8_MAX  # fc2's activation scale, as a calibration would set it
    ref = moe_reference(x_deq, w31_deq, w2_deq, weights, experts,
                        intermediate=lambda t: fp8_round_trip(t, a2))
    scales = [(s31 * sx).float().to(device), torch.tensor(1 / a2, device=device),
              (s2 * a2).float().to(device), torch.tensor(sx, device=device)]
    return MoeProblem(kind, xq.to(device), torch.stack([q for q, _ in q31]).to(device),
                      torch.stack([q for q, _ in q2]).to(device), weights, experts, scales,
                      ref, 6e-2)


def _moe_variant(kind: str, case: MoeCase) -> dict[str, Any]:
    """Run one variant: default tactic, ``autotune()``, tuned tactic; compare to torch."""
    import torch
    from flashinfer.autotuner import autotune
    from flashinfer.fused_moe import cutlass_fused_moe

    problem = moe_problem(kind, case, "cuda")
    out = torch.empty(problem.x.shape[0], problem.w2.shape[1], dtype=torch.bfloat16,
                      device="cuda")
    bucket = 1 << (problem.x.shape[0] - 1).bit_length()  # as SGLang passes it

    def run() -> None:
        cutlass_fused_moe(problem.x, problem.experts, problem.weights, problem.w31,
                          problem.w2, torch.bfloat16, quant_scales=problem.quant_scales,
                          output=out, tune_max_num_tokens=bucket)

    run()  # nothing tuned yet: the default tactic
    torch.cuda.synchronize()
    default_error = relative_error(out, problem.reference)
    default_ms = _time_ms(run)
    with autotune():
        run()
    torch.cuda.synchronize()
    out.zero_()
    run()  # the tuned tactic, from the autotuner's cache
    torch.cuda.synchronize()
    tuned_error = relative_error(out, problem.reference)
    tuned_ms = _time_ms(run)
    return {"variant": kind, "tolerance": problem.tolerance, "default_error": default_error,
            "tuned_error": tuned_error, "default_ms": default_ms, "tuned_ms": tuned_ms,
            "default_over_tuned": default_ms / tuned_ms if tuned_ms else None,
            "ok": max(default_error, tuned_error) <= problem.tolerance}


def check_moe(capability: tuple[int, int] | None, mode: str,
              no_gpu: NoGpu = NO_DEVICE) -> ProbeCheck:
    """Check 5: ``cutlass_fused_moe`` under ``autotune()`` matches torch and really tunes.

    Each variant's autotuner log is summarised (:func:`autotune_summary`) and judged by
    :func:`moe_verdict`.

    Args:
        capability: the GPU's compute capability (None: no GPU).
        mode: ``require`` (asked for) or ``auto`` (run when the kernel wheel has the module).
        no_gpu: the detail and reason when there is no GPU.
    """
    name = "moe-autotune"
    if capability is None:
        return _no_gpu(name, no_gpu)
    module = moe_module_name(capability)
    if module is None:
        return _result(name, Status.NOT_RUN, f"FlashInfer has no CUTLASS fused MoE for sm_"
                       f"{capability[0]}{capability[1]}")
    try:
        manifest, _ = read_manifest()
    except Exception as exc:
        return _result(name, Status.NOT_RUN if mode == "auto" else Status.FAILED,
                       f"kernel wheel unusable: {_error_text(exc)}")
    if manifest.module(module) is None:
        return _result(name, Status.NOT_RUN, f"the kernel wheel has no {module} module, and with "
                       "FLASHINFER_DISABLE_JIT=1 it is not compiled at run time",
                       MoeModule(module))
    try:
        from flashinfer.jit.core import logger
    except Exception as exc:
        return _result(name, Status.FAILED, f"flashinfer does not import: {_error_text(exc)}")
    variants: list[dict[str, Any]] = []
    kinds = ["bf16"] + (["fp8"] if capability >= (8, 9) else [])
    case = moe_case()
    lines: list[str] = []
    for kind in kinds:
        with _captured(logger) as captured:
            try:
                variant = _moe_variant(kind, case)
            except Exception as exc:
                variant = {"variant": kind, "ok": False, "error": _error_text(exc),
                           "trace": traceback.format_exc(limit=3)}
        variant["autotune"] = autotune_summary(captured)
        variants.append(variant)
        lines += captured
    if capability[0] in (10, 11, 12):
        variants.append({"variant": "nvfp4", "ok": None,
                         "error": "not run: the nvfp4 variant is not written yet"})
    data = MoeData(
        module=module, variants=variants, warnings=count_warnings(lines),
        autotuner_module=AUTOTUNER_MODULE,
        autotuner_module_shipped=manifest.module(AUTOTUNER_MODULE) is not None,
        tactics_missing_a_module=sum(v.get("autotune", {}).get("skipped", {})
                                     .get("missing_module", 0) for v in variants),
        warning_lines=[line for line in lines if classify_line(line)][:20])
    if not data.autotuner_module_shipped:
        # FlashInfer's autotuner calls delay_kernel (trtllm_utils) while timing each tactic;
        # without it, under FLASHINFER_DISABLE_JIT=1 every tactic is skipped.
        return _result(name, Status.FAILED, f"the kernel wheel does not ship "
                       f"{AUTOTUNER_MODULE}: FlashInfer's autotuner cannot time any tactic "
                       "without it; " + moe_verdict(variants)[1], data)
    status, detail = moe_verdict(variants)
    return _result(name, status, detail, data)


def _capability() -> tuple[tuple[int, int] | None, NoGpu]:
    """The first GPU's compute capability, or None and why there is none."""
    try:
        import torch
    except ImportError as exc:
        return None, (f"no CUDA device (torch is not installed: {exc})", Reason.NO_TORCH)
    try:
        if torch.cuda.is_available() and torch.cuda.device_count():
            major, minor = torch.cuda.get_device_capability(0)
            return (int(major), int(minor)), NO_DEVICE
    except Exception as exc:  # a broken driver raises here
        return None, (f"no CUDA device ({_error_text(exc)})", Reason.NO_DEVICE)
    return None, NO_DEVICE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the requested checks and print one result line per check (exit 0 when done)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", default="runner,sglang,versions,kernels,moe")
    parser.add_argument("--sglang-pattern", action="append", default=[])
    parser.add_argument("--moe", choices=("auto", "require"), default="auto")
    args = parser.parse_args(argv)
    # Never compile: a missing module must be an error (FlashInfer reads these at import).
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    workspace = tempfile.mkdtemp(prefix="sm120-smoke-")
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", workspace)
    checks = args.checks.split(",")
    unknown = sorted(set(checks) - set(RESULT_NAMES))
    if unknown:
        parser.error(f"unknown check {', '.join(unknown)} (known: {', '.join(RESULT_NAMES)})")
    try:
        capability, why = _capability() if {"kernels", "moe"} & set(checks) else \
            (None, NO_DEVICE)
        table: dict[str, Callable[[], ProbeCheck]] = {
            "runner": check_runner,
            "sglang": lambda: collect_sglang(args.sglang_pattern),
            "versions": collect_versions,
            "kernels": lambda: check_kernels(capability, why),
            "moe": lambda: check_moe(capability, args.moe, why),
        }
        for check in checks:
            try:
                _emit(table[check]())
            except Exception as exc:  # one broken check must not hide the others
                _emit(_result(RESULT_NAMES[check], Status.FAILED,
                              f"the check crashed: {_error_text(exc)}",
                              CrashData(traceback.format_exc(limit=5))))
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lockstep pins and the arch contract of a target's kernel build.

* **Lockstep pins**, read from the patched source itself (``pyproject.toml`` of an sdist or
  checkout, ``METADATA`` of a released wheel), never hand-copied: ``flashinfer_python``,
  ``flashinfer_cubin``, ``sgl-kernel``/``sglang-kernel``, ``torch``, ``cuda-python``. The kernel
  wheel's version is FlashInfer's plus our local label, because FlashInfer requires a
  jit-cache package's version to start with its own (shared/design.md).
* **Arch contract**: FlashInfer <= 0.6.6 auto-detects an SM120 GPU as ``12.0a``, >= 0.6.7 as
  ``12.0f`` (which needs CUDA >= 12.9); a plain ``12.0`` breaks FP4 code in ptxas
  (shared/design.md, measured on the upstream releases).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.arch import SM120, SM120_FAMILY
from builder.core.arch import sm120_arch as _sm120_arch
from builder.core.errors import ConfigurationError
from builder.core.wheelmeta import parse_metadata, requires_dist

if TYPE_CHECKING:  # an annotation only: a saved request's build never imports the source stage
    from builder.source.fetch import SourceResult

_KERNEL_PACKAGES = ("sgl-kernel", "sglang-kernel")


@dataclass(frozen=True)
class KernelPins:
    """The versions SGLang pins, which the kernels must match exactly.

    Attributes:
        flashinfer: ``flashinfer_python``'s pinned version.
        flashinfer_cubin: ``flashinfer_cubin``'s pinned version (``None`` if not required).
        kernel: ``(name, version)`` of ``sgl-kernel`` or ``sglang-kernel``, if pinned.
        torch: the ``torch`` requirement as written (``None`` if absent).
        cuda_python: the ``cuda-python`` requirement as written (``None`` if absent).
    """

    flashinfer: Version
    flashinfer_cubin: Version | None
    kernel: tuple[str, str] | None
    torch: str | None
    cuda_python: str | None

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"flashinfer_python": str(self.flashinfer),
                "flashinfer_cubin": str(self.flashinfer_cubin) if self.flashinfer_cubin
                else None, "kernel": list(self.kernel) if self.kernel else None,
                "torch": self.torch, "cuda_python": self.cuda_python}


def _requirements(source: SourceResult) -> list[str]:
    """The project's run-time requirements, from pyproject.toml or a wheel's METADATA."""
    pyproject = source.layout.package_root(source.tree) / "pyproject.toml"
    if pyproject.is_file():
        with pyproject.open("rb") as handle:
            deps = tomllib.load(handle).get("project", {}).get("dependencies", [])
        return [str(d) for d in deps]
    for metadata in source.tree.glob("*.dist-info/METADATA"):
        return [str(r) for r in requires_dist(parse_metadata(metadata.read_bytes()),
                                              str(metadata))]
    raise ConfigurationError(f"{source.tree} has neither pyproject.toml nor a wheel's METADATA",
                             "the kernel pins are read from the upstream source itself")


def _exact(requirement: Requirement) -> Version | None:
    pins = [s.version for s in requirement.specifier if s.operator == "=="]
    try:
        return Version(pins[0]) if len(pins) == 1 else None
    except InvalidVersion:
        return None


def read_pins(source: SourceResult) -> KernelPins:
    """Read the lockstep pins from the (patched) upstream source.

    Raises:
        BuilderError: ``flashinfer_python`` is not pinned exactly, or ``flashinfer_cubin``
            (or a pinned ``flashinfer_jit_cache``) names another version; the message
            says which.
    """
    found: dict[str, Requirement] = {}
    for line in _requirements(source):
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.setdefault(canonicalize_name(requirement.name), requirement)
    flashinfer_req = found.get("flashinfer-python")
    flashinfer = _exact(flashinfer_req) if flashinfer_req else None
    if flashinfer is None:
        raise ConfigurationError(
            f"upstream {source.upstream_version} does not pin flashinfer_python "
            "exactly (==)", "the kernels must match one FlashInfer version")
    cubin_req = found.get("flashinfer-cubin")
    cubin = _exact(cubin_req) if cubin_req else None
    for name in ("flashinfer-cubin", "flashinfer-jit-cache"):
        other = _exact(found[name]) if name in found else None
        if other is not None and other.public != flashinfer.public:
            raise ConfigurationError(f"upstream {source.upstream_version} pins flashinfer_python "
                                     f"{flashinfer} but {name} {other}: the versions disagree",
                                     "FlashInfer requires them to match; check the release")
    kernel = next(((name, str(_exact(found[name]))) for name in _KERNEL_PACKAGES
                   if name in found and _exact(found[name]) is not None), None)
    torch, cuda = found.get("torch"), found.get("cuda-python")
    return KernelPins(flashinfer, cubin, kernel, str(torch) if torch else None,
                      str(cuda) if cuda else None)


def kernel_wheel_version(pins: KernelPins, local_label: str) -> str:
    """``<flashinfer version>+<label>``: FlashInfer requires the jit-cache version to start
    with its own."""
    return f"{pins.flashinfer.public}+{local_label}"


def sm120_arch(flashinfer: Version) -> str:
    """The arch FlashInfer detects on SM120: ``12.0a`` up to 0.6.6, ``12.0f`` from 0.6.7
    (the one rule, :func:`builder.core.arch.sm120_arch`, which the smoke probe uses too)."""
    return _sm120_arch(str(flashinfer))


def check_arch_list(arch_list: tuple[str, ...], pins: KernelPins) -> str:
    """Return the SM120 arch for ``pins`` after checking the target's arch list agrees.

    Raises:
        BuilderError: the list has a plain ``12.0`` (breaks FP4 code in ptxas) or an SM120
            entry other than the one this FlashInfer detects.
    """
    wanted = sm120_arch(pins.flashinfer)
    for arch in arch_list:
        if arch == SM120:
            raise ConfigurationError("arch 12.0 without a suffix breaks FlashInfer's FP4 code in "
                                     "ptxas", f"use {wanted} for FlashInfer {pins.flashinfer}")
        if arch.startswith(SM120) and arch != wanted:
            raise ConfigurationError(f"the target lists {arch} but FlashInfer {pins.flashinfer} "
                                     f"detects an SM120 GPU as {wanted}",
                                     f"set arch_list to [\"{wanted}\"] (12.0a up to FlashInfer "
                                     "0.6.6, 12.0f from 0.6.7)")
    return wanted


def kernel_label(local_label: str, lane: str) -> str:
    """The kernel wheel's local label: ours plus the CUDA lane (``sm120.1.cu130``), like
    FlashInfer's own ``+cu129`` jit-cache wheels, so two lanes never share a version."""
    return f"{local_label}.cu{lane.replace('.', '')}"


#: The distributions whose exact pin in a torch wheel's METADATA names the CUDA it was
#: built with: ``cuda-toolkit[...]==13.0.2`` (torch >= 2.11 on PyPI),
#: ``nvidia-cuda-runtime-cu12==12.8.90`` (earlier releases), ``nvidia-cuda-runtime``.
_TORCH_CUDA_PINS = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12",
                    "nvidia-cuda-runtime-cu13")
_LINUX_X86_64 = {"platform_system": "Linux", "sys_platform": "linux",
                 "platform_machine": "x86_64", "python_version": "3.12", "extra": ""}


def torch_cuda_lane(requirements: list[str]) -> str | None:
    """The CUDA lane (``13.0``) a torch wheel was built for, from its ``Requires-Dist``.

    PyPI's Linux torch wheels pin NVIDIA's runtime wheels exactly (the lines above,
    read from the torch 2.11.0 and 2.14.1 wheels' METADATA on PyPI, 2026-11-30); the
    lane is that version's ``major.minor``.

    Args:
        requirements: the wheel's ``Requires-Dist`` values.

    Returns:
        ``"major.minor"``, or ``None`` when no such pin applies on Linux x86_64 (a CPU
        or ROCm build).
    """
    for line in requirements:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) not in _TORCH_CUDA_PINS:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(_LINUX_X86_64):
            continue
        pinned = _exact(requirement)
        if pinned is not None and len(pinned.release) >= 2:
            return f"{pinned.release[0]}.{pinned.release[1]}"
    return None


def exact_torch(pins: KernelPins) -> Version | None:
    """The torch version SGLang pins with ``==`` (``None`` if it pins none exactly)."""
    if pins.torch is None:
        return None
    return _exact(Requirement(pins.torch))


#: What SGLang runs on SM120 for NVFP4 MoE models with the ``flashinfer_cutlass`` runner
#: (:func:`default_groups` picks the FP4 quantization variant of the arch): the SM120
#: CUTLASS fused MoE, FP4 activation quantization, the CUTLASS FP4 GEMM of the dense
#: linears (``--fp4-gemm-backend flashinfer_cutlass``), ``trtllm_utils`` (the autotuner's
#: ``delay_kernel``: without it every tactic is skipped under ``FLASHINFER_DISABLE_JIT=1``),
#: and the common small modules. ``builder/kernels/data/flashinfer_aot.py`` (``PATHS``)
#: finds the modules those code paths load in the pinned FlashInfer itself; the tests
#: compare.
DEFAULT_GROUPS = ("fused_moe_sm120", "fp4_quantization_sm120", "fp4_gemm_sm120",
                  "trtllm_utils", "norm", "activation", "sampling", "rope", "page",
                  "attention")
#: The first FlashInfer whose jit-cache is a shim plus per-arch provider wheels.
PROVIDER_LAYOUT = Version("0.7.0")


def default_groups(arch_list: tuple[str, ...]) -> tuple[str, ...]:
    """:data:`DEFAULT_GROUPS` for an arch list: with ``12.0f`` (FlashInfer >= 0.6.7 on CUDA
    >= 12.9) FlashInfer loads ``fp4_quantization_120f`` on SM120, not ``_120``
    (``get_fp4_quantization_module`` in ``quantization/fp4_quantization.py``)."""
    if SM120_FAMILY in arch_list:
        return tuple("fp4_quantization_sm120f" if g == "fp4_quantization_sm120" else g
                     for g in DEFAULT_GROUPS)
    return DEFAULT_GROUPS


def uses_providers(flashinfer: Version) -> bool:
    """Whether this FlashInfer reads per-arch provider wheels through a shim (>= 0.7.0)."""
    return flashinfer.release >= PROVIDER_LAYOUT.release

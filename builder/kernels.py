"""Kernel stage, first part: lockstep pins, the SM120 arch contract and a toolchain preflight.

Compiling FlashInfer's modules for sm_120 and packing them as a ``flashinfer_jit_cache``
wheel is not implemented yet; what is here decides *what* to build and refuses a
toolchain that cannot build it, before any compile starts:

* **Lockstep pins**, read from the patched source itself (``pyproject.toml`` of an sdist or
  checkout, ``METADATA`` of a released wheel), never hand-copied: ``flashinfer_python``,
  ``flashinfer_cubin``, ``sgl-kernel``/``sglang-kernel``, ``torch``, ``cuda-python``. The kernel
  wheel's version is FlashInfer's plus our local label, because FlashInfer requires a
  jit-cache package's version to start with its own (shared/design.md).
* **Arch contract**: FlashInfer <= 0.6.6 auto-detects an SM120 GPU as ``12.0a``, >= 0.6.7 as
  ``12.0f`` (which needs CUDA >= 12.9); a plain ``12.0`` breaks FP4 code in ptxas
  (shared/design.md, measured on the upstream releases).
* **Preflight**: nvcc's ``major.minor`` is the target's CUDA lane; nvcc really compiles a
  kernel for the requested arch; the cuBLAS and cuRAND headers FlashInfer includes are
  present; torch's CUDA version is the lane.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.errors import BuilderError
from builder.source import SourceResult

_KERNEL_PACKAGES = ("sgl-kernel", "sglang-kernel")
_ARCH_SWITCH = Version("0.6.7")  # first FlashInfer that detects SM120 as 12.0f
_HEADERS = {"cublas_v2.h": "nvidia-cublas", "curand.h": "nvidia-curand"}


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
        message = email.parser.BytesParser().parsebytes(metadata.read_bytes())
        return [str(r) for r in message.get_all("Requires-Dist") or []]
    raise BuilderError(f"{source.tree} has neither pyproject.toml nor a wheel's METADATA",
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
        raise BuilderError(f"upstream {source.upstream_version} does not pin flashinfer_python "
                           "exactly (==)", "the kernels must match one FlashInfer version")
    cubin_req = found.get("flashinfer-cubin")
    cubin = _exact(cubin_req) if cubin_req else None
    for name in ("flashinfer-cubin", "flashinfer-jit-cache"):
        other = _exact(found[name]) if name in found else None
        if other is not None and other.public != flashinfer.public:
            raise BuilderError(f"upstream {source.upstream_version} pins flashinfer_python "
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
    """The arch FlashInfer detects on SM120: ``12.0a`` up to 0.6.6, ``12.0f`` from 0.6.7."""
    return "12.0f" if flashinfer.release >= _ARCH_SWITCH.release else "12.0a"


def check_arch_list(arch_list: tuple[str, ...], pins: KernelPins) -> str:
    """Return the SM120 arch for ``pins`` after checking the target's arch list agrees.

    Raises:
        BuilderError: the list has a plain ``12.0`` (breaks FP4 code in ptxas) or an SM120
            entry other than the one this FlashInfer detects.
    """
    wanted = sm120_arch(pins.flashinfer)
    for arch in arch_list:
        if arch == "12.0":
            raise BuilderError("arch 12.0 without a suffix breaks FlashInfer's FP4 code in "
                               "ptxas", f"use {wanted} for FlashInfer {pins.flashinfer}")
        if arch.startswith("12.0") and arch != wanted:
            raise BuilderError(f"the target lists {arch} but FlashInfer {pins.flashinfer} "
                               f"detects an SM120 GPU as {wanted}",
                               f"set arch_list to [\"{wanted}\"] (12.0a up to FlashInfer "
                               "0.6.6, 12.0f from 0.6.7)")
    return wanted


@dataclass(frozen=True)
class Check:
    """One preflight check."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def _nvcc_version(nvcc: Path) -> str | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match[1] if match else None


def _compiles(nvcc: Path, arch: str) -> tuple[bool, str]:
    """Really compile a one-line kernel for ``arch`` (``12.0a`` -> ``sm_120a``)."""
    code = "sm_" + arch.replace(".", "")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.cu"
        source.write_text("__global__ void probe(int *x) { *x = 1; }\n")
        done = subprocess.run([str(nvcc), f"-gencode=arch=compute_{code[3:]},code={code}",
                               "-c", str(source), "-o", str(Path(tmp) / "probe.o")],
                              capture_output=True, text=True, timeout=300, check=False)
    last = (done.stderr or done.stdout).strip().splitlines()
    return done.returncode == 0, "compiled" if done.returncode == 0 else \
        (last[-1] if last else f"exit {done.returncode}")


def preflight(*, nvcc: Path, lane: str, arches: list[str], include_dirs: list[Path],
              python: Path | None = None) -> list[Check]:
    """Check a toolchain before compiling; every check runs, each says what it found.

    Args:
        nvcc: the nvcc to use.
        lane: the target's CUDA ``major.minor``.
        arches: archs to compile for (``12.0a``, ``12.0f``, ``9.0a``).
        include_dirs: where to look for the cuBLAS and cuRAND headers.
        python: an interpreter whose torch must be built for the lane (``None``: skip).

    Returns:
        The checks, in order: nvcc version, one compile per arch, headers, torch.
    """
    checks = []
    version = _nvcc_version(nvcc)
    checks.append(Check("nvcc", version == lane,
                        f"{nvcc} is CUDA {version}" if version else f"{nvcc} does not run"))
    for arch in arches:
        if version is None:
            checks.append(Check(f"compile {arch}", False, "no working nvcc"))
            continue
        ok, detail = _compiles(nvcc, arch)
        checks.append(Check(f"compile {arch}", ok, detail))
    for header, package in _HEADERS.items():
        hits = [d for d in include_dirs if (d / header).is_file()]
        checks.append(Check(header, bool(hits), f"in {hits[0]}" if hits else
                            f"not in {', '.join(map(str, include_dirs))}: install "
                            f"{package} for CUDA {lane} from PyPI"))
    if python is not None:
        probe = subprocess.run([str(python), "-c", "import torch; print(torch.version.cuda)"],
                               capture_output=True, text=True, check=False, timeout=300)
        cuda = probe.stdout.strip()
        ok = probe.returncode == 0 and ".".join(cuda.split(".")[:2]) == lane
        detail = (f"torch built for CUDA {cuda}" if probe.returncode == 0 else
                  "torch does not import: " + (probe.stderr.strip().splitlines() or ["?"])[-1])
        checks.append(Check("torch", ok, detail))
    return checks

"""Preflight: refuse a toolchain that cannot build the kernels, before any compile starts.

nvcc's ``major.minor`` is the target's CUDA lane; nvcc really compiles a kernel for the
requested arch; the cuBLAS and cuRAND headers FlashInfer includes are present; torch's CUDA
version is the lane. :func:`run_preflight` does this for a target.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.options import Options, select_target
from builder.kernels.pins import (
    KernelPins,
    check_arch_list,
    default_groups,
    kernel_label,
    kernel_wheel_version,
    read_pins,
    uses_providers,
)
from builder.kernels.toolchain import (
    nvcc_release,
)
from builder.source.fetch import obtain_source

_HEADERS = {"cublas_v2.h": "nvidia-cublas", "curand.h": "nvidia-curand"}


@dataclass(frozen=True)
class Check:
    """One preflight check."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def _lists_arch(nvcc: Path, arch: str) -> tuple[bool, str]:
    """Whether ``nvcc --list-gpu-arch`` names ``arch``'s compute capability
    (``12.0a`` -> ``compute_120``; the suffixed variants are not listed separately)."""
    done = subprocess.run([str(nvcc), "--list-gpu-arch"], capture_output=True, text=True,
                          check=False, timeout=60)
    wanted = "compute_" + re.sub(r"[af]$", "", arch.replace(".", ""))
    listed = done.stdout.split()
    return wanted in listed, (f"lists {wanted}" if wanted in listed else
                              f"does not list {wanted} (it lists {' '.join(listed)})")


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
        python: an interpreter whose torch must be built for the lane or for the CPU
            (``None``: skip).

    Returns:
        The checks, in order: nvcc version, per arch ``--list-gpu-arch`` and a real
        compile, headers, torch.
    """
    checks = []
    release = nvcc_release(nvcc)
    version = release[0] if release else None
    checks.append(Check("nvcc", version == lane,
                        f"{nvcc} is CUDA {version}, the lane is {lane}" if version
                        else f"{nvcc} does not run"))
    for arch in arches:
        if version is None:
            checks.append(Check(f"compile {arch}", False, "no working nvcc"))
            continue
        checks.append(Check(f"list {arch}", *_lists_arch(nvcc, arch)))
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
        # A CPU build of torch is enough to compile: FlashInfer then takes CUDA from nvcc.
        ok = probe.returncode == 0 and (cuda == "None" or
                                        ".".join(cuda.split(".")[:2]) == lane)
        detail = ("torch is a CPU build (compiling only; CUDA comes from nvcc)"
                  if cuda == "None" else f"torch built for CUDA {cuda}"
                  if probe.returncode == 0 else
                  "torch does not import: " + (probe.stderr.strip().splitlines() or ["?"])[-1])
        checks.append(Check("torch", ok, detail))
    return checks


@dataclass(frozen=True)
class PreflightResult:
    """What a kernel build for a target would use, and whether the toolchain can do it.

    Attributes:
        target: the target's name.
        pins: the lockstep pins read from its upstream source.
        kernel_version: the kernel wheel's version (FlashInfer's plus the local label).
        arch: the SM120 arch FlashInfer detects for these pins.
        checks: the toolchain checks.
        groups: the module groups a default build compiles (the target's, else
            :func:`builder.kernels.pins.default_groups`).
        wheels: the distributions it writes: ``flashinfer-jit-cache`` up to FlashInfer 0.6;
            from 0.7 the provider ``flashinfer-jit-cache-sm120f`` and the shim.
    """

    target: str
    pins: KernelPins
    kernel_version: str
    arch: str
    checks: list[Check]
    groups: tuple[str, ...] = ()
    wheels: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(check.ok for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"target": self.target, "pins": self.pins.describe(),
                "kernel_version": self.kernel_version, "arch": self.arch, "ok": self.ok,
                "groups": list(self.groups), "wheels": list(self.wheels),
                "checks": [c.to_json() for c in self.checks]}


def run_preflight(options: Options, *, nvcc: Path, include_dirs: list[Path],
                  python: Path | None = None, lane: str | None = None) -> PreflightResult:
    """Read the target's kernel pins, check its arch list, and check the toolchain.

    Raises:
        BuilderError: the pins disagree, or the target's arch list contradicts what its
            FlashInfer detects (see :mod:`builder.kernels.pins`).
    """
    target = select_target(options)
    source = obtain_source(options, target)
    pins = read_pins(source)
    arch = check_arch_list(target.arch_list, pins)
    lane = target.lane(lane)
    checks = preflight(nvcc=nvcc, lane=lane, arches=list(target.arch_list),
                       include_dirs=include_dirs, python=python)
    groups = tuple(target.kernel_groups or default_groups(target.arch_list))
    wheels = (f"flashinfer-jit-cache-sm{arch.replace('.', '')}", "flashinfer-jit-cache") \
        if uses_providers(pins.flashinfer) else ("flashinfer-jit-cache",)
    return PreflightResult(target.name, pins,
                           kernel_wheel_version(pins, kernel_label(target.local_label, lane)),
                           arch, checks, groups, wheels)

"""Preflight: refuse a toolchain that cannot build the kernels, before any compile starts.

nvcc's ``major.minor`` is the target's CUDA lane; nvcc really compiles a kernel for the
requested arch; the cuBLAS and cuRAND headers FlashInfer includes are present; torch's CUDA
version is the lane. :func:`run_preflight` does this for a target.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import MissingToolError
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
    cuda_wheels,
    local_nvcc,
    nvcc_release,
    toolkit_root,
)

_HEADERS = {"cublas_v2.h": "nvidia-cublas", "curand.h": "nvidia-curand"}


@dataclass(frozen=True)
class Check:
    """One preflight check.

    Attributes:
        name: what was checked (``nvcc``, ``compile 12.0a``, ``cublas_v2.h``, ``torch``).
        ok: whether it passed.
        detail: what was found.
        fix: for a failed check, the exact step that fixes it (an option, a command).
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}


def lane_fix(lane: str, found: str | None, lanes: Sequence[str] = ()) -> str:
    """The exact fix for an nvcc that is not of the lane.

    Args:
        lane: the lane asked for.
        found: the nvcc's ``major.minor`` (``None``: no working nvcc).
        lanes: every lane the target offers.

    Returns:
        ``--cuda-lane X.Y`` when the nvcc found is another lane the target offers; else
        how to get an nvcc of the lane (PyPI has one for CUDA 13 only).
    """
    if found is not None and found != lane and found in lanes:
        return (f"--cuda-lane {found} (the target offers CUDA {found} and an nvcc {found} is "
                "available; serve the kernel wheel with a torch built for that CUDA)")
    if lane.split(".")[0] != "12":
        get = (f"pip install 'nvidia-cuda-nvcc=={lane}.*' 'nvidia-cuda-crt=={lane}.*' "
               f"'nvidia-nvvm=={lane}.*' and pass --nvcc <site-packages>/nvidia/cu"
               f"{lane.split('.')[0]}/bin/nvcc (`kernels` installs it in its own environment)")
    else:
        get = (f"install the CUDA {lane} toolkit (PyPI has no nvcc for CUDA 12) and pass "
               "--nvcc PATH, or build in the container: kernels container")
    others = [other for other in lanes if other != lane]
    return get + (f"; or choose another lane the target offers: --cuda-lane {others[0]}"
                  if others else "")


def header_fix(header: str, lane: str) -> str:
    """The pip command that installs a missing cuBLAS or cuRAND header for the lane."""
    wanted = _HEADERS[header]
    requirement = next(r for r in cuda_wheels(lane, compiler=False) if r.startswith(wanted))
    return (f"pip install {shlex.quote(requirement)} into this Python or --python (found "
            f"there in nvidia/*/include), or --include DIR with {header}; `kernels` installs "
            "it itself in its managed environment")


def discover_nvcc(lane: str) -> Path:
    """The nvcc ``preflight`` checks when none is given: the one ``kernels`` would use
    (an nvcc of the lane in ``$CUDA_HOME``, on ``PATH`` or in ``/usr/local/cuda``), else
    the first nvcc found there (so the check can name its lane), else one from NVIDIA's
    PyPI wheels in this Python.

    Raises:
        BuilderError: no nvcc anywhere.
    """
    found = local_nvcc(lane)
    if found is not None:
        return found
    candidates = [*([Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"]
                    if "CUDA_HOME" in os.environ else []),
                  *([Path(w)] if (w := shutil.which("nvcc")) else []),
                  Path("/usr/local/cuda/bin/nvcc"),
                  *sorted(Path(sysconfig.get_paths()["purelib"]).glob("nvidia/*/bin/nvcc"))]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise MissingToolError(f"no nvcc found (CUDA_HOME, PATH, /usr/local/cuda) for CUDA {lane}",
                           lane_fix(lane, None))


def default_include_dirs(nvcc: Path, python: Path | None = None) -> list[Path]:
    """Where ``preflight`` looks for the cuBLAS and cuRAND headers when no ``--include``
    is given: the toolkit's own include folder, then the include folders of NVIDIA's
    PyPI wheels in this Python (and in ``python``), where ``kernels`` takes them from."""
    folders = [toolkit_root(nvcc) / "include"]
    purelibs = [Path(sysconfig.get_paths()["purelib"])]
    if python is not None:
        done = subprocess.run([str(python), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=False, timeout=120)
        if done.returncode == 0 and done.stdout.strip():
            purelibs.append(Path(done.stdout.strip()))
    for purelib in purelibs:
        folders += sorted(p for p in (purelib / "nvidia").glob("*/include") if p.is_dir())
    return folders


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
              python: Path | None = None, lanes: Sequence[str] = (),
              managed_headers: bool = False) -> list[Check]:
    """Check a toolchain before compiling; every check runs, each says what it found.

    Args:
        nvcc: the nvcc to use.
        lane: the target's CUDA ``major.minor``.
        arches: archs to compile for (``12.0a``, ``12.0f``, ``9.0a``).
        include_dirs: where to look for the cuBLAS and cuRAND headers.
        python: an interpreter whose torch must be built for the lane or for the CPU
            (``None``: skip).
        lanes: every CUDA lane the target offers (to name ``--cuda-lane`` as the fix).
        managed_headers: a header found in none of ``include_dirs`` passes when ``kernels``
            installs it itself (its managed environment holds
            :func:`builder.kernels.toolchain.cuda_wheels`); not for ``--include`` folders.

    Returns:
        The checks, in order: nvcc version, per arch ``--list-gpu-arch`` and a real
        compile, headers, torch.
    """
    checks = []
    release = nvcc_release(nvcc)
    version = release[0] if release else None
    checks.append(Check("nvcc", version == lane,
                        f"{nvcc} is CUDA {version}, the lane is {lane}" if version
                        else f"{nvcc} does not run",
                        "" if version == lane else lane_fix(lane, version, lanes)))
    for arch in arches:
        if version is None:
            checks.append(Check(f"compile {arch}", False, "no working nvcc"))
            continue
        checks.append(Check(f"list {arch}", *_lists_arch(nvcc, arch)))
        ok, detail = _compiles(nvcc, arch)
        checks.append(Check(f"compile {arch}", ok, detail))
    for header, package in _HEADERS.items():
        hits = [d for d in include_dirs if (d / header).is_file()]
        if not hits and managed_headers:
            wanted = next(r for r in cuda_wheels(lane, compiler=False)
                          if r.startswith(_HEADERS[header]))
            checks.append(Check(header, True, f"not on this machine: `kernels` installs "
                                f"{wanted} in its managed environment (for --environment "
                                f"current: {header_fix(header, lane)})"))
            continue
        checks.append(Check(header, bool(hits), f"in {hits[0]}" if hits else
                            f"not in {', '.join(map(str, include_dirs))}: install "
                            f"{package} for CUDA {lane} from PyPI",
                            "" if hits else header_fix(header, lane)))
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
        checks.append(Check("torch", ok, detail, "" if ok else
                            "--python an interpreter whose torch is built for CUDA "
                            f"{lane} or the CPU (kernels: --build-torch torch==X)"))
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


def run_preflight(options: Options, *, nvcc: Path | None = None,
                  include_dirs: list[Path] | None = None, python: Path | None = None,
                  lane: str | None = None) -> PreflightResult:
    """Read the target's kernel pins, check its arch list, and check the toolchain.

    Args:
        options: the target and source options.
        nvcc: the nvcc to check (``None``: :func:`discover_nvcc`, as ``kernels`` finds it).
        include_dirs: where the headers may be (``None``: :func:`default_include_dirs`).
        python: an interpreter whose torch is checked (``None``: skip).
        lane: one of the target's CUDA lanes (``None``: its default).

    Raises:
        BuilderError: the pins disagree, or the target's arch list contradicts what its
            FlashInfer detects (see :mod:`builder.kernels.pins`).
        MissingToolError: ``nvcc`` is not a file, or none is found.
    """
    # The source stage only here: the build's own preflight (a saved request) needs none.
    from builder.source.fetch import obtain_source

    if nvcc is not None and not nvcc.is_file():  # before any download
        raise MissingToolError(f"no nvcc at {nvcc}", "pass --nvcc the path of an nvcc "
                               "binary, or leave it out to search as `kernels` does")
    target = select_target(options)
    source = obtain_source(options, target)
    pins = read_pins(source)
    arch = check_arch_list(target.arch_list, pins)
    lane = target.lane(lane)
    nvcc = nvcc or discover_nvcc(lane)
    # Without --include the headers may come from `kernels`' own managed environment.
    managed = not include_dirs
    include_dirs = include_dirs or default_include_dirs(nvcc, python)
    checks = preflight(nvcc=nvcc, lane=lane, arches=list(target.arch_list),
                       include_dirs=include_dirs, python=python, lanes=target.cuda_lanes,
                       managed_headers=managed)
    groups = tuple(target.kernel_groups or default_groups(target.arch_list))
    wheels = (f"flashinfer-jit-cache-sm{arch.replace('.', '')}", "flashinfer-jit-cache") \
        if uses_providers(pins.flashinfer) else ("flashinfer-jit-cache",)
    return PreflightResult(target.name, pins,
                           kernel_wheel_version(pins, kernel_label(target.local_label, lane)),
                           arch, checks, groups, wheels)

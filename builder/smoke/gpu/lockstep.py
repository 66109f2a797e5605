"""Check 3, judged here from the probe's ``versions-data``: FlashInfer's packages and the
kernel wheel move in lockstep with sglang's pins and torch's CUDA."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.smoke.gpu.report import CheckResult
from builder.smoke.shared import ProbeCheck, Status, VersionsData, parse_manifest


def _pin(requires: Sequence[str], project: str) -> Version | None:
    """The exact (==) version ``requires`` pins ``project`` to (unconditional ones only)."""
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != canonicalize_name(project):
            continue
        try:
            if requirement.marker is not None and \
                    not requirement.marker.evaluate({"extra": ""}):
                continue
        except (UndefinedComparison, UndefinedEnvironmentName):  # e.g. os_name ~= "x"
            continue  # a marker that cannot be judged pins nothing
        pins = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(pins) == 1:
            try:
                return Version(pins[0])
            except InvalidVersion:
                return None
    return None


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def check_lockstep(versions: ProbeCheck | None,
                   sglang_requires: Sequence[str]) -> CheckResult:
    """Judge check 3 from the probe's ``versions-data`` and sglang's requirements.

    FlashInfer's own rules (flashinfer 0.6.3, ``jit/env.py``): flashinfer_cubin's version
    must equal flashinfer's; flashinfer_jit_cache's must start with it. Ours is stricter:
    the kernel wheel's public version equals FlashInfer's, and its manifest agrees.

    Raises:
        ProbeOutputError: the data is not what the probe writes
            (:meth:`~builder.smoke.shared.VersionsData.check`).
    """
    name = "lockstep"
    info = VersionsData.read(versions) if versions is not None and \
        versions.status == Status.PASSED else None
    if info is None:
        return CheckResult(name, Status.FAILED, versions.detail if versions and
                           versions.detail else "no data from the probe")
    found = {k: _version(v) for k, v in info.versions.items()}
    flashinfer, cubin = found["flashinfer-python"], found["flashinfer-cubin"]
    jit_cache = found["flashinfer-jit-cache"]
    data: dict[str, Any] = {"installed": info.versions, "torch_cuda": info.torch_cuda}
    problems: list[str] = []
    wanted = {p: _pin(sglang_requires, p) for p in ("flashinfer_python", "flashinfer_cubin")}
    data["sglang_pins"] = {k: str(v) if v else None for k, v in wanted.items()}
    if flashinfer is None:
        return CheckResult(name, Status.FAILED, "flashinfer_python is not installed",
                           data=data)
    problems += _package_problems(flashinfer, cubin, jit_cache, wanted)
    if jit_cache is not None and info.manifest is None:
        problems.append(f"the kernel wheel's manifest: {info.manifest_error}")
    elif info.manifest is not None:
        problems += _manifest_problems(info, flashinfer, jit_cache, data)
    if problems:
        return CheckResult(name, Status.FAILED, "; ".join(problems), data=data)
    return CheckResult(name, Status.PASSED, f"flashinfer_python {flashinfer}, "
                       f"flashinfer_cubin {cubin or 'not installed (not pinned)'}, "
                       f"flashinfer_jit_cache {jit_cache}", data=data)


def _package_problems(flashinfer: Version, cubin: Version | None, jit_cache: Version | None,
                      wanted: dict[str, Version | None]) -> list[str]:
    """What FlashInfer's three packages say against each other and sglang's pins
    (``wanted``, by project)."""
    problems = []
    if wanted["flashinfer_python"] and flashinfer != wanted["flashinfer_python"]:
        problems.append(f"flashinfer_python {flashinfer} but sglang pins "
                        f"{wanted['flashinfer_python']}")
    if cubin is None:
        if wanted["flashinfer_cubin"] is not None:
            problems.append(f"flashinfer_cubin is not installed (sglang pins "
                            f"flashinfer_cubin=={wanted['flashinfer_cubin']})")
    elif cubin != flashinfer:
        problems.append(f"flashinfer_cubin {cubin} differs from flashinfer_python "
                        f"{flashinfer} (FlashInfer refuses to import)")
    if jit_cache is None:
        problems.append("flashinfer_jit_cache (the kernel wheel) is not installed")
    elif Version(jit_cache.public) != flashinfer or not jit_cache.local:
        problems.append(f"flashinfer_jit_cache {jit_cache} is not flashinfer_python "
                        f"{flashinfer} plus a local label")
    return problems


def _manifest_problems(info: VersionsData, flashinfer: Version, jit_cache: Version | None,
                       data: dict[str, Any]) -> list[str]:
    """What the kernel wheel's manifest says against the installed versions and torch's
    CUDA; its summary goes into ``data["manifest"]``."""
    try:
        parsed = parse_manifest(info.manifest or {})
    except ValueError as exc:
        return [f"the kernel wheel's manifest: {exc}"]
    problems = []
    data["manifest"] = {"flashinfer_version": parsed.flashinfer_version,
                        "version": parsed.version, "arch_list": parsed.arch_list,
                        "cuda_version": parsed.cuda_version,
                        "modules": [m.name for m in parsed.modules]}
    if _version(parsed.flashinfer_version) != flashinfer:
        problems.append(f"the kernels were built for FlashInfer "
                        f"{parsed.flashinfer_version}, not {flashinfer}")
    if jit_cache is not None and _version(parsed.version) != jit_cache:
        problems.append(f"the manifest says version {parsed.version} but "
                        f"flashinfer_jit_cache {jit_cache} is installed")
    torch_cuda = info.torch_cuda
    if torch_cuda and parsed.cuda_version and \
            parsed.cuda_version.split(".")[0] != str(torch_cuda).split(".")[0]:
        problems.append(f"the kernels were built with CUDA {parsed.cuda_version} "
                        f"but torch uses CUDA {torch_cuda}")
    return problems

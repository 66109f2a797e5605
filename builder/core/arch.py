"""CUDA arch rules shared by the builder and the smoke probe (standard library only).

The kernel stage (:func:`builder.kernels.pins.sm120_arch`) and the probe's check 1, which
runs in the tested interpreter without the builder, must agree on the arch FlashInfer
picks for a GPU. This module is that one rule: it imports nothing beyond the standard
library so the probe can load it by path (``builder/smoke/script/sm120_arch.py`` is a link
to this file, and is shipped next to the probe into an image).

Facts used:

* FlashInfer <= 0.6.6 auto-detects an SM120 GPU as ``12.0a``, >= 0.6.7 as ``12.0f``
  (shared/design.md, measured on the upstream releases).
* Before that switch, and for the other GPUs, FlashInfer compiles for ``major.minor`` with
  an ``a`` suffix from major 9 on (``9.0a``, ``12.0a``): ``compilation_context.py`` of
  ``flashinfer_python`` 0.6.3.
* CUDA's binary compatibility (CUDA C++ Programming Guide, "Binary Compatibility" and
  "Feature Set Compiler Targets"): plain ``X.y`` SASS runs on ``X.z`` for ``z >= y``;
  family-specific ``X.yf`` likewise within the family; arch-specific ``X.ya`` only on
  exactly ``X.y``.
"""

from __future__ import annotations

import re

#: The first FlashInfer release that detects SM120 as ``12.0f`` rather than ``12.0a``.
SM120_FAMILY_FROM: tuple[int, ...] = (0, 6, 7)

#: SM120's compute capability (RTX PRO 6000 Blackwell, RTX 50xx: CUDA C++ Programming
#: Guide, "Compute Capabilities").
SM120_CAPABILITY: tuple[int, int] = (12, 0)
#: It as ``major.minor`` (what ``torch.cuda.get_device_capability`` users, SGLang's
#: behaviour checks and a series' ``capability`` write); as an arch, plain ``X.y`` SASS.
SM120 = f"{SM120_CAPABILITY[0]}.{SM120_CAPABILITY[1]}"
#: The arch-specific (``a``) and family-specific (``f``) SM120 archs FlashInfer names.
SM120_SPECIFIC = SM120 + "a"
SM120_FAMILY = SM120 + "f"

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_ARCH = re.compile(r"^(?:sm_(?P<sm>\d{2,3})|(?P<major>\d+)\.(?P<minor>\d))(?P<suffix>[af]?)$")


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string (``0.7.0rc1+cu130`` -> ``(0, 7, 0)``), as
    PEP 440 orders releases, so that ``0.6.7.post1`` and ``0.7.0rc1`` count as >= 0.6.7.

    Raises:
        ValueError: the text does not start with a release number.
    """
    found = _RELEASE.match(version)
    if not found:
        raise ValueError(f"not a version: {version!r}")
    numbers = tuple(int(part) for part in found[1].split("."))
    while len(numbers) > 1 and numbers[-1] == 0:  # 0.7 == 0.7.0
        numbers = numbers[:-1]
    return numbers


def sm120_arch(flashinfer_version: str) -> str:
    """The arch FlashInfer detects on SM120: ``12.0a`` up to 0.6.6, ``12.0f`` from 0.6.7.

    Args:
        flashinfer_version: flashinfer_python's version (``0.6.3``, ``0.7.2``).

    Raises:
        ValueError: not a version.
    """
    return SM120_FAMILY if release(flashinfer_version) >= SM120_FAMILY_FROM else SM120_SPECIFIC


def flashinfer_arch(capability: tuple[int, int], flashinfer_version: str) -> str:
    """The arch FlashInfer compiles for on a GPU of ``capability`` (``9.0a`` for 9.0,
    ``8.9`` for 8.9, :func:`sm120_arch` for 12.0).

    Args:
        capability: the GPU's compute capability.
        flashinfer_version: flashinfer_python's version.

    Raises:
        ValueError: ``flashinfer_version`` is not a version.
    """
    if capability == SM120_CAPABILITY:
        return sm120_arch(flashinfer_version)
    major, minor = capability
    return f"{major}.{minor}" + ("a" if major >= 9 else "")


def parse_arch(text: str) -> tuple[int, int, str]:
    """Parse an arch as FlashInfer (``9.0a``, ``12.0f``) or cuobjdump (``sm_90a``) writes it.

    Returns:
        ``(major, minor, suffix)`` with suffix ``""``, ``"a"`` or ``"f"``.

    Raises:
        ValueError: not an arch.
    """
    found = _ARCH.match(text.strip())
    if not found:
        raise ValueError(f"not a CUDA arch: {text!r}")
    if found["sm"]:
        digits = found["sm"]
        return int(digits[:-1]), int(digits[-1]), found["suffix"]
    return int(found["major"]), int(found["minor"]), found["suffix"]


def arch_runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether SASS built for ``arch`` runs on a GPU of compute ``capability``.

    Raises:
        ValueError: ``arch`` is not an arch.
    """
    major, minor, suffix = parse_arch(arch)
    if suffix == "a":
        return capability == (major, minor)
    return capability[0] == major and capability[1] >= minor

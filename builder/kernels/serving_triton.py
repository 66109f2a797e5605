"""The triton a release serves with, and an install of it for the ahead-of-time compile.

A Triton cache is keyed by the triton that compiled it (``triton_key()``: the hashes of
triton's own sources and ``libtriton``, triton 3.9.0 ``triton/runtime/cache.py``), so
:func:`builder.kernels.triton_cache.build_triton_cache` must compile with the triton the
server imports, not the behaviour environment's (its CPU torch, ``+cpu``, requires no triton;
the newest comes in through xgrammar's unpinned requirement: 3.9.0 on 2026-12-03, in 0.5.16's
environment). The server's triton is the one its pinned
CUDA torch requires: PyPI's Linux torch wheels name it in ``Requires-Dist`` (read from the
wheels' METADATA on PyPI, 2026-12-03: torch 2.11.0 ``triton==3.6.0; platform_system ==
"Linux"``, torch 2.14.1 ``triton~=3.8.0; platform_system == "Linux" and python_version <
"3.15"``; on the GPU machine SGLang 0.5.16 with torch 2.11.0 ran triton 3.6.0).

:func:`serving_triton` reads that requirement from the torch wheel's METADATA with HTTP
range requests (:func:`builder.source.fetch.remote_wheel_metadata`, the way ``bump`` reads
the CUDA lane), never the ~900 MB wheel, and caches the answer (``serving-triton``).
:func:`install_triton` installs that triton (``--no-deps``) into a cache entry
(``triton-install``) that the compile puts first on ``PYTHONPATH``.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.behaviour.env import pip_failure
from builder.core.cache import Cache, sha256_json
from builder.core.errors import SourceError
from builder.core.progress import Reporter

#: Bumped when the rule below changes (a cached answer of an older rule is not used).
RULE = 1
#: The environment a server's markers are evaluated in: Linux x86_64 (the images').
_LINUX_X86_64 = {"platform_system": "Linux", "sys_platform": "linux",
                 "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
_HINT = ("the Triton cache must be built with the triton the server runs; check the "
         "index (--index-url) and the release's torch pin")


@dataclass(frozen=True)
class ServingTriton:
    """The triton a target's server runs.

    Attributes:
        version: the exact version (``3.6.0``).
        requirement: torch's requirement as its METADATA writes it.
        torch: the torch version it was read from.
        wheel: the torch wheel whose METADATA was read.
    """

    version: str
    requirement: str
    torch: str
    wheel: str


def python_tag() -> str:
    """This interpreter's ``major.minor`` (the behaviour environments run it)."""
    return sysconfig.get_python_version()


def triton_requirement(requires: list[str], python_version: str) -> Requirement | None:
    """The ``triton`` requirement of a torch wheel's ``Requires-Dist`` that applies on
    Linux x86_64 with ``python_version`` (``None``: none does, e.g. a CPU build)."""
    environment = {**_LINUX_X86_64, "python_version": python_version,
                   "python_full_version": f"{python_version}.0"}
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != "triton":
            continue
        if requirement.marker is None or requirement.marker.evaluate(environment):
            return requirement
    return None


def _exact_pin(requirement: Requirement) -> str | None:
    pins = [s.version for s in requirement.specifier if s.operator in ("==", "===")]
    return pins[0] if len(pins) == 1 and "*" not in pins[0] else None


def _linux_wheel(files: list[tuple[str, str, str, bool]], python_version: str
                 ) -> tuple[str, str] | None:
    """A live Linux x86_64 wheel, this Python's first: ``(name, url)``."""
    wanted = "cp" + python_version.replace(".", "")
    ranked = []
    for name, url, _, yanked in files:
        if yanked or not name.endswith(".whl"):
            continue
        try:
            tags = parse_wheel_filename(name)[3]
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if any(t.platform.startswith("manylinux") and t.platform.endswith("_x86_64")
               for t in tags):
            ranked.append((not any(t.interpreter == wanted for t in tags), name, url))
    return min(ranked)[1:] if ranked else None


def _newest_matching(requirement: Requirement, python_version: str, index_url: str | None
                     ) -> str | None:
    """The newest live release on the index that ``requirement`` allows and that has a
    Linux x86_64 wheel for ``python_version``: what pip installs for it there."""
    from builder.core.pipconfig import resolve_index
    from builder.source.index import project_files

    wanted = "cp" + python_version.replace(".", "")
    found = set()
    for item in project_files("triton", resolve_index(index_url).url)[1]:
        try:
            _, version, _, tags = parse_wheel_filename(item.name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if not item.yanked and version in requirement.specifier and any(
                t.interpreter == wanted and t.platform.endswith("_x86_64") for t in tags):
            found.add(version)
    return str(max(found)) if found else None


def serving_triton(torch_pin: str | None, *, cache: Cache, index_url: str | None = None,
                   python_version: str | None = None) -> ServingTriton:
    """The triton a server with ``torch_pin`` runs (cached in ``serving-triton``).

    An exact ``triton==X`` (torch 2.11.0) is the answer; any other specifier (torch
    2.14.1's ``~=3.8.0``) resolves as pip would there: the newest release on the index
    it allows with a wheel for this Python, as of the first call (the cached answer is kept:
    a newer patch release published later is not seen; the manifest records the version
    used and the launcher restores nothing when the server's differs).

    Args:
        torch_pin: the release's torch requirement (:func:`builder.kernels.pins.read_pins`'
            ``torch``), e.g. ``torch==2.11.0``.
        cache: where the answer is kept.
        index_url: the simple index (default: pip's).
        python_version: the server's Python ``major.minor`` (default: this one's).

    Returns:
        The :class:`ServingTriton`.

    Raises:
        SourceError: the release pins no exact torch, the index lists no Linux x86_64 wheel
            of it, its METADATA requires no triton, or no triton release matches (exit 4).
        BuilderError: the index or the wheel's METADATA cannot be read.
    """
    from builder.core.wheelmeta import requires_dist
    from builder.source.fetch import release_files, remote_wheel_metadata

    python_version = python_version or python_tag()
    torch: Version | None = None
    try:
        requirement = Requirement(torch_pin or "")
        pinned = _exact_pin(requirement)
        torch = Version(pinned) if pinned and canonicalize_name(requirement.name) == "torch" \
            else None
    except (InvalidRequirement, InvalidVersion):
        pass
    if torch is None:
        raise SourceError(f"the release pins no exact torch ({torch_pin or 'none'}): the "
                          "triton its server runs is unknown", _HINT)
    from builder.core.pipconfig import resolve_index

    index = resolve_index(index_url).url
    key = sha256_json({"rule": RULE, "torch": str(torch), "python": python_version,
                       "index": index})

    def resolve(_: Path) -> dict[str, str]:
        files = release_files("torch", torch, index)
        wheel = _linux_wheel(files, python_version)
        if wheel is None:
            raise SourceError(f"the index lists no Linux x86_64 wheel of torch {torch}", _HINT)
        metadata = remote_wheel_metadata(wheel[1], wheel[0])
        found = triton_requirement([str(r) for r in requires_dist(metadata, wheel[0])],
                                   python_version)
        if found is None:
            raise SourceError(f"{wheel[0]} requires no triton on Linux x86_64 (a CPU build?)",
                              _HINT)
        version = _exact_pin(found) or _newest_matching(found, python_version, index)
        if version is None:
            raise SourceError(f"no triton release on the index matches {found} (torch "
                              f"{torch}) with a wheel for Python {python_version}", _HINT)
        return {"version": version, "requirement": str(found), "torch": str(torch),
                "wheel": wheel[0]}

    entry = cache.artifact("serving-triton", key, resolve, record="")
    meta = entry.meta
    return ServingTriton(meta["version"], meta["requirement"], meta["torch"], meta["wheel"])


def install_triton(version: str, python: Path, *, cache: Cache,
                   reporter: Reporter | None = None) -> Path:
    """``triton==version`` installed alone (``--no-deps``) for ``python``, cached in
    ``triton-install``.

    Args:
        version: the exact version (:func:`serving_triton`).
        python: the interpreter that imports it (a behaviour environment's: its pip, its
            configured index, its wheel tags).
        cache: where the install is kept.
        reporter: progress.

    Returns:
        The folder holding the ``triton`` package: put it first on ``PYTHONPATH``.

    Raises:
        BuildError: pip failed (its last lines in the message), or the disk filled up.
    """
    reporter = reporter or Reporter(quiet=True)
    tag = f"{sys.implementation.name}{python_tag()}"
    key = sha256_json({"triton": version, "python": tag})

    def install(folder: Path) -> dict[str, str]:
        site = folder / "site"
        with reporter.working(f"triton {version}, the server's, for the Triton cache"):
            done = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", "--no-deps", "--target",
                                   str(site), f"triton=={version}"],
                                  capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise pip_failure(done, folder, f"triton {version}", "about 0.6 GB",
                              "check the network (PyPI): the Triton cache is built with the "
                              "server's triton")
        return {"triton": version, "python": tag}

    entry = cache.artifact("triton-install", key, install, record="", on_damage="trust")
    return entry.path / "site"

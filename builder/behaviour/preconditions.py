"""Preconditions: what a patch needs from a release's pinned dependencies, checked in them.

A patch may be right only when a dependency the release pins can do something (0003's DSA
indexer on SM12x needs DeepGEMM's SM120 paged MQA logits kernels, DeepGEMM PR #324). The
check reads the release's ``Requires-Dist`` pin of that dependency, downloads its wheel from
the index (verified against the sha256 the index lists, kept in the cache like every other
download) and looks for the declared files in it. Nothing is installed or imported.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.core.cache import Cache
from builder.core.config import WheelPin
from builder.core.errors import ConfigurationError, SourceError
from builder.core.progress import Reporter
from builder.core.wheelmeta import requires_dist, wheel_metadata
from builder.patching.series import Precondition


@dataclass(frozen=True)
class PreconditionResult:
    """One precondition on one release.

    Attributes:
        precondition: what was checked.
        pin: the dependency's version the release pins.
        wheel: the file name of the wheel that was read.
        missing: the declared files the wheel lacks.
    """

    precondition: Precondition
    pin: str
    wheel: str
    missing: tuple[str, ...]

    @property
    def met(self) -> bool:
        """Every declared file is in the pinned wheel."""
        return not self.missing

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"precondition": self.precondition.name, "met": self.met,
                "distribution": self.precondition.distribution, "pin": self.pin,
                "wheel": self.wheel, "files": list(self.precondition.files),
                "missing": list(self.missing), "unmet": self.precondition.unmet}


def pinned_version(wheel: Path, distribution: str) -> str:
    """The version ``wheel``'s ``Requires-Dist`` pins ``distribution`` to (``==X``).

    Raises:
        VerificationError: the wheel is not a zip, has no METADATA, or a requirement there
            does not parse.
        ConfigurationError: the wheel names no such requirement, or does not pin it to one
            version (a range names no wheel to read): the precondition is wrong.
    """
    wanted = canonicalize_name(distribution)
    for requirement in requires_dist(wheel_metadata(wheel), wheel.name):
        if canonicalize_name(requirement.name) != wanted:
            continue
        match = re.fullmatch(r"==([\w.+!-]+)", str(requirement.specifier))
        if match is None:
            raise ConfigurationError(f"{wheel.name} requires {requirement}, not one version",
                                     "a precondition reads the wheel of a pinned (==) "
                                     "dependency")
        return match.group(1)
    raise ConfigurationError(f"{wheel.name} does not require {distribution}",
                             "name a dependency the release pins in the precondition")


def dependency_pin(distribution: str, version: str, index_url: str | None) -> WheelPin:
    """The dependency's wheel for Linux x86_64 as the index lists it (name and sha256).

    Raises:
        SourceError: the index lists no such wheel with a sha256 (or only yanked ones).
        BuilderError: the index is unreachable.
    """
    from builder.source.fetch import release_files

    files = release_files(distribution, version, index_url)
    wheels = [(name, url, sha) for name, url, sha, yanked in files
              if name.endswith(".whl") and sha and not yanked
              and any(t.platform in ("any", "manylinux2014_x86_64", "manylinux_2_17_x86_64",
                                     "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
                      for t in parse_wheel_filename(name)[3])]
    if not wheels:
        raise SourceError(f"the index lists no Linux x86_64 wheel of {distribution} "
                          f"{version} with a sha256",
                          "check the index (--index-url) and the release's pin")
    name, url, sha = wheels[0]
    return WheelPin(project=distribution, version=version, filename=name, sha256=sha, url=url)


def check_precondition(precondition: Precondition, release_wheel: Path, *, cache: Cache,
                       index_url: str | None = None,
                       reporter: Reporter | None = None) -> PreconditionResult:
    """Check ``precondition`` in the dependency wheel ``release_wheel`` pins.

    Args:
        precondition: the declared check (``pinned-wheel-files``).
        release_wheel: the release's own wheel (its METADATA names the pin).
        cache: where the dependency's wheel is kept (``downloads``).
        index_url: the simple index (default: pip's).
        reporter: progress.

    Raises:
        SourceError: no pin, or no such wheel on the index.
        VerificationError: the download's sha256 does not match.
        BuilderError: the index is unreachable.
    """
    from builder.source.fetch import download_pinned

    reporter = reporter or Reporter(quiet=True)
    version = pinned_version(release_wheel, precondition.distribution)
    pin = dependency_pin(precondition.distribution, version, index_url)
    wheel = download_pinned(pin, cache, index_url, reporter)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = tuple(f for f in precondition.files if f not in names)
    return PreconditionResult(precondition, version, pin.filename, missing)

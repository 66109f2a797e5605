"""The targets the tests cover, read from ``targets.toml`` and the series: never listed by
hand, so a target added by ``python -m builder add-target`` is covered by the same tests as
the others without editing a test (docs/new-release.md).

A fact per release that no project file holds is written as a rule on what the project
files do hold (e.g. the DeepGEMM pin's version in ``tests/behaviour/test_run.py``), so no
test keeps a table keyed by target.
"""

from __future__ import annotations

import tomllib
from functools import cache
from typing import TypeVar

from builder.core.config import SdistPin, TargetsFile, WheelPin, load_targets
from builder.patching.series import Series, load_series
from tests.helpers.paths import REPO
from tests.helpers.releases import MATRIX_RELEASES, RELEASES, TARGET_RELEASES, Release

TARGETS_FILE = REPO / "targets.toml"
SERIES_FILE = REPO / "patches" / "series.toml"
T = TypeVar("T")


@cache
def targets() -> TargetsFile:
    """The repository's targets file, parsed once."""
    return load_targets(TARGETS_FILE)


@cache
def series() -> Series:
    """The repository's series, parsed once."""
    return load_series(SERIES_FILE)


def target_names() -> list[str]:
    """Every target's name, in the order of ``targets.toml`` (read with tomllib, not the
    builder's parser, so a test comparing the two checks the parser)."""
    return [t["name"] for t in tomllib.loads(TARGETS_FILE.read_text())["target"]]


def current_targets() -> tuple[str, ...]:
    """The current targets, oldest release first: those on which a patch of the series that
    declares behaviour cases applies (the SM12x patches; the older targets ship the
    autotune patch alone)."""
    entries = [e for e in series().entries if e.behaviours]
    found = [t for t in targets().targets.values()
             if any(e.applies_to(t.upstream_version) for e in entries)]
    return tuple(t.name for t in sorted(found, key=lambda t: t.upstream_version))


@cache
def release_file(version: str) -> Release:
    """The file of ``version`` the tests read: the pinned one in tests/helpers/releases.py,
    else the target's cp311 wheel (or sdist) pinned in ``targets.toml``, its URL read from
    PyPI's simple index (the sha256 is the targets file's).

    Raises:
        AssertionError: no target of that version pins a cp311 wheel or an sdist.
    """
    known = {**RELEASES, **MATRIX_RELEASES, **TARGET_RELEASES}.get(version)
    if known is not None:
        return known
    from packaging.version import Version

    from builder.source.fetch import release_files

    target = next((t for t in targets().targets.values()
                   if t.upstream_version == Version(version)), None)
    assert target is not None, (f"no target of targets.toml has upstream_version {version!r}, "
                                "and tests/helpers/releases.py pins no file of it")
    pins: list[SdistPin | WheelPin] = [p for p in target.sources if isinstance(p, SdistPin)]
    pins += [p for p in target.sources if isinstance(p, WheelPin) and "-cp311-" in p.filename]
    assert pins, (f"targets.toml [[target]] {target.name}: no sdist or cp311 wheel pinned "
                  "(the tests read the release's files from one)")
    sha = pins[0].sha256
    listed = [url for _, url, digest, _ in
              release_files(target.sdist_project, version, "https://pypi.org/simple")
              if digest == sha]
    assert listed, f"PyPI lists no file of sglang {version} with the sha256 {sha} targets.toml pins"
    return Release(version, sha, listed[0].split("#", 1)[0])

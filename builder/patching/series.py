"""The patch series file (``patches/series.toml``), parsed once into typed objects.

A series lists patches in order with their pins (sha256, strip level), the upstream
versions each applies to, fuzz allowances with reasons, and intent checks. It is validated
here; the patch stage takes the typed objects and never reads the file again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.core.config import (
    SHA256,
    Target,
    is_integer,
    known_keys,
    read_toml,
    require,
    specifier,
    table_array,
)
from builder.core.errors import ConfigurationError
from builder.core.options import Options
from builder.patching.intent import IntentCheck, parse_intent_check


@dataclass(frozen=True)
class FuzzAllowance:
    """Permission for a patch to need fuzz on some upstream versions, with the reason."""

    versions: SpecifierSet
    max_fuzz: int
    reason: str


@dataclass(frozen=True)
class SeriesEntry:
    """One patch of a series.

    Attributes:
        path: the patch file.
        sha256: the pinned hex sha256 of the file (``None`` for an ad-hoc ``--patch``).
        strip: the fixed strip level (``-p``), never guessed.
        versions: upstream versions the patch applies to (PEP 440 specifiers).
        max_fuzz: fuzz allowed everywhere in ``versions`` (default 0).
        allowances: more fuzz allowed on narrower version ranges, each with a reason.
        intents: checks that must hold on the patched tree.
        description: one line for reports.
    """

    path: Path
    sha256: str | None
    strip: int
    versions: SpecifierSet
    max_fuzz: int = 0
    allowances: tuple[FuzzAllowance, ...] = ()
    intents: tuple[IntentCheck, ...] = ()
    description: str = ""

    @property
    def name(self) -> str:
        """The patch's file name."""
        return self.path.name

    def applies_to(self, version: Version) -> bool:
        """True when ``version`` (pre-releases included) is inside the declared range."""
        return self.versions.contains(version, prereleases=True)

    def fuzz_limit(self, version: Version) -> tuple[int, str]:
        """Return ``(max fuzz, reason)`` in force for ``version``.

        The largest matching allowance wins; with none, the entry's ``max_fuzz`` applies
        and the reason is empty.
        """
        limit, reason = self.max_fuzz, ""
        for allowance in self.allowances:
            if allowance.versions.contains(version, prereleases=True) and \
                    allowance.max_fuzz > limit:
                limit, reason = allowance.max_fuzz, allowance.reason
        return limit, reason


@dataclass(frozen=True)
class Series:
    """An ordered patch series.

    Attributes:
        path: the series file (``None`` for an ad-hoc series built from ``--patch``).
        entries: the patches in application order.
    """

    path: Path | None
    entries: tuple[SeriesEntry, ...] = field(default_factory=tuple)

    @classmethod
    def single(cls, patch: Path, *, strip: int = 1, max_fuzz: int = 0) -> Series:
        """Build an unpinned one-patch series for trying a patch (``patch --patch FILE``)."""
        entry = SeriesEntry(path=patch, sha256=None, strip=strip, versions=SpecifierSet(),
                            max_fuzz=max_fuzz, description="ad-hoc patch")
        return cls(path=None, entries=(entry,))



_ENTRY_KEYS = {"file", "sha256", "description", "strip", "versions", "max_fuzz",
               "fuzz_allowance", "intent"}


def _parse_entry(table: dict[str, Any], base: Path, where: str) -> SeriesEntry:
    known_keys(table, _ENTRY_KEYS, where)
    file_name = require(table, "file", str, where)
    where = f"{where} ({file_name})"
    sha = require(table, "sha256", str, where).lower()
    if not SHA256.match(sha):
        raise ConfigurationError(f"{where}: sha256 {sha!r} is not 64 hex digits",
                                 f"pin it with: sha256sum patches/{file_name}")
    strip = require(table, "strip", int, where)
    if strip < 0:
        raise ConfigurationError(f"{where}: strip level must be >= 0", "1 for a/ b/ prefixes")
    max_fuzz = table.get("max_fuzz", 0)
    if not is_integer(max_fuzz) or not 0 <= max_fuzz <= 3:
        raise ConfigurationError(f"{where}: max_fuzz must be an integer from 0 to 3",
                                 "GNU patch's fuzz is at most the context size, usually 3")
    versions = specifier(require(table, "versions", str, where), where)
    allowances = []
    for i, allowance in enumerate(table_array(table, "fuzz_allowance", where), 1):
        here = f"{where} fuzz_allowance #{i}"
        known_keys(allowance, {"versions", "max_fuzz", "reason"}, here)
        fuzz = require(allowance, "max_fuzz", int, here)
        if not 0 <= fuzz <= 3:
            raise ConfigurationError(f"{here}: max_fuzz must be from 0 to 3",
                                     "GNU patch's fuzz is at most the context size, usually 3")
        reason = require(allowance, "reason", str, here).strip()
        if not reason:
            raise ConfigurationError(
                f"{here}: a fuzz allowance needs a reason", "say why it is safe")
        allowances.append(FuzzAllowance(
            versions=specifier(require(allowance, "versions", str, here), here),
            max_fuzz=fuzz, reason=reason))
    intents = tuple(parse_intent_check(
        known_keys(t, {"check", "file", "value", "function", "assignment", "compared_with",
                        "pattern"}, f"{where} intent #{i}"), f"{where} intent #{i}")
        for i, t in enumerate(table_array(table, "intent", where), 1))
    return SeriesEntry(path=(base / file_name).resolve(), sha256=sha, strip=strip,
                       versions=versions,
                       max_fuzz=max_fuzz, allowances=tuple(allowances), intents=intents,
                       description=str(table.get("description", "")))


def load_series(path: Path) -> Series:
    """Read and validate a series file.

    Args:
        path: the TOML series file; patch file names resolve against its folder.

    Returns:
        The series, in application order.

    Raises:
        BuilderError: the file is missing, not TOML, or an entry breaks the schema.
    """
    data = read_toml(path, "series file")
    known_keys(data, {"patch"}, str(path))
    tables = table_array(data, "patch", str(path))
    entries = tuple(_parse_entry(t, path.parent, f"{path} patch #{i}")
                    for i, t in enumerate(tables, 1))
    return Series(path=path, entries=entries)


def select_series(options: Options, target: Target | None) -> Series:
    """Return the series to apply: ``--patch``, ``--series``, or the target's.

    Raises:
        BuilderError: both ``--patch`` and ``--series`` were given, or the file is invalid.
    """
    if options.patch and options.series:
        raise ConfigurationError("--patch and --series exclude each other", "give one of them")
    if options.patch:
        return Series.single(options.patch, strip=options.strip, max_fuzz=options.max_fuzz)
    if options.series:
        return load_series(options.series)
    if target is None:
        raise ConfigurationError("no series to apply", "pass --series FILE or --patch FILE")
    return load_series(target.series)

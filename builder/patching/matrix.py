"""Compatibility matrix: the series applied cumulatively to several upstream releases.

Each column is one upstream release or revision (a target's pin, a version found on the
index -- sdist, else a released wheel read as source -- or a git commit); each row is a
patch. A cell says what the engine would do there (clean / offset N / fuzz N / ambiguous
/ already-applied / obsolete / failed / not-applicable) and whether the patch's intent
checks hold afterwards.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.core.config import GitPin, Target, load_targets
from builder.core.errors import ConfigurationError
from builder.core.options import Options
from builder.patching.apply import (
    PatchOutcome,
    PatchReport,
    plan_series,
    read_series,
)
from builder.patching.hunks import HunkStatus
from builder.patching.series import Series, load_series
from builder.patching.status import PatchStatus
from builder.source.fetch import (
    SourceResult,
    fetch_pin,
    fetch_source,
    find_release,
)


@dataclass(frozen=True)
class Column:
    """One upstream release or revision to check.

    Attributes:
        label: the column header (a version, or a short commit id).
        source: the fetched tree.
        target: the target this column is (``None`` for extra versions or commits);
            only target columns decide the exit status.
    """

    label: str
    source: SourceResult
    target: str | None = None


class CellStatus(StrEnum):
    """What one patch does on one release (a matrix cell's ``status`` in ``--json``).

    How it applied (``clean``, ``offset``, ``fuzz``), why it did not (``failed``,
    ``ambiguous``), or what the series decided (the rest, as
    :class:`~builder.patching.status.PatchStatus` names them). The values are a contract
    with users of ``matrix --json``, never renamed.
    """

    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    ALREADY_APPLIED = "already-applied"
    OBSOLETE = "obsolete"
    NOT_APPLICABLE = "not-applicable"
    NOT_REACHED = "not-reached"


@dataclass(frozen=True)
class Cell:
    """One patch on one release."""

    status: CellStatus
    text: str
    intents: bool | None  # None: the patch declares no check, or it did not run

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"status": str(self.status), "text": self.text, "intents_hold": self.intents}


@dataclass(frozen=True)
class Matrix:
    """The whole table.

    Attributes:
        patches: row labels (patch file names), in series order.
        columns: column labels with their target (if any) and source pin.
        cells: ``cells[row][column]``.
        reports: the full patch report per column.
    """

    patches: tuple[str, ...]
    columns: tuple[Column, ...]
    cells: tuple[tuple[Cell, ...], ...]
    reports: tuple[PatchReport, ...]

    @property
    def broken_targets(self) -> list[str]:
        """Names of targets, or labels of other columns, where the series would break."""
        return [c.target or c.label for c, r in zip(self.columns, self.reports, strict=True)
                if not r.ok]

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data (cells by patch and column label)."""
        return {
            "columns": [{"label": c.label, "target": c.target,
                         "pin": c.source.pin.describe() if c.source.pin else None,
                         "ok": r.ok} for c, r in zip(self.columns, self.reports, strict=True)],
            "patches": [{"name": name, "cells": {c.label: cell.to_json()
                                                 for c, cell in zip(self.columns, row,
                                                                    strict=True)}}
                        for name, row in zip(self.patches, self.cells, strict=True)],
            "broken_targets": self.broken_targets,
        }

    def to_markdown(self) -> str:
        """Return a GitHub-flavoured Markdown table (for a pull request or job summary)."""
        head = ["patch", *(f"{c.label}" + (" (target)" if c.target else "")
                           for c in self.columns)]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, row in zip(self.patches, self.cells, strict=True):
            texts = [cell.text + {True: " ✓", False: " ✗", None: ""}[cell.intents]
                     for cell in row]
            lines.append("| " + " | ".join([f"`{name}`", *texts]) + " |")
        lines.append("")
        lines.append("✓ / ✗: the patch's intent checks hold / fail after the series.")
        if self.broken_targets:
            lines.append(f"**Would break:** {', '.join(self.broken_targets)}")
        return "\n".join(lines) + "\n"

    def dumps(self) -> str:
        """Return :meth:`to_json` as indented JSON text."""
        return json.dumps(self.to_json(), indent=2)


def describe_outcome(outcome: PatchOutcome) -> tuple[CellStatus, str]:
    """Return ``(status, text)`` for a cell: ``offset -151``, ``fuzz 1``, ``failed: ...``."""
    hunks = [h for f in outcome.files for h in f.hunks]
    if outcome.status == PatchStatus.APPLIED:
        fuzz = max((h.fuzz or 0 for h in hunks), default=0)
        offsets = [h.offset or 0 for h in hunks]
        offset = max(offsets, key=abs, default=0)
        if fuzz:
            return CellStatus.FUZZ, f"fuzz {fuzz}" + (f" (allowed up to {outcome.max_fuzz})"
                                             if outcome.max_fuzz else "")
        if offset:
            return CellStatus.OFFSET, f"offset {offset}"
        return CellStatus.CLEAN, "clean"
    if outcome.status == PatchStatus.FAILED:
        worst = next((h for h in hunks if h.status not in (
            HunkStatus.CLEAN, HunkStatus.OFFSET, HunkStatus.FUZZ,
            HunkStatus.ALREADY_APPLIED)), None)
        if worst is None:
            return CellStatus.FAILED, "failed"
        if worst.status == HunkStatus.FAILED and worst.fuzz:
            return CellStatus.FAILED, f"needs fuzz {worst.fuzz} (allowed {outcome.max_fuzz})"
        return (CellStatus.AMBIGUOUS if worst.status == HunkStatus.AMBIGUOUS
                else CellStatus.FAILED, worst.label)
    return CellStatus(str(outcome.status)), str(outcome.status)


def check_matrix(series: Series, columns: list[Column]) -> Matrix:
    """Apply ``series`` to every column's tree (in memory) and tabulate the outcomes.

    Raises:
        BuilderError: a patch file is missing, changed after pinning, or malformed.
    """
    reports = tuple(plan_series(column.source, series)[0] for column in columns)
    names = tuple(entry.name for entry in series.entries)
    rows = []
    for index, entry in enumerate(series.entries):
        row = []
        for report in reports:
            outcome = report.patches[index]
            status, text = describe_outcome(outcome)
            checks = [i.holds for i in report.intents if i.patch == entry.name]
            in_effect = outcome.status in (PatchStatus.APPLIED, PatchStatus.ALREADY_APPLIED,
                                           PatchStatus.OBSOLETE)
            row.append(Cell(status, text, all(checks) if checks and in_effect else None))
        rows.append(tuple(row))
    return Matrix(names, tuple(columns), tuple(rows), reports)


def run_matrix(options: Options, *, versions: list[str] | None = None,
              commits: list[str] | None = None) -> Matrix:
    """The compatibility matrix of the series (``--series`` or the default target's).

    Columns: every target (its preferred pin), or the given upstream ``versions`` (found
    on the index: the sdist, else a released wheel read as source), or git ``commits``
    (of ``--git-url``, default the default target's git URL), each ``COMMIT`` or
    ``COMMIT=VERSION`` (default version: the default target's; the series' version
    ranges and fuzz allowances are judged against it).

    Raises:
        BuilderError: a version or commit is malformed, a source cannot be fetched, or
            the series is invalid.
    """
    targets = load_targets(options.targets_file)
    default = targets.get(None)
    series = load_series(options.series) if options.series else load_series(default.series)
    read_series(series)
    columns: list[Column] = []
    cache = options.cache
    if versions:
        for version in dict.fromkeys(versions):
            try:
                Version(version)
            except InvalidVersion:
                raise ConfigurationError(f"--versions: {version!r} is not a PEP 440 version",
                                         "write versions like 0.5.9,0.5.11") from None
            pin = find_release(default.sdist_project, version, options.index_url)
            source = fetch_pin(pin, Version(version), cache=cache, index_url=options.index_url,
                               reporter=options.reporter)
            columns.append(Column(version, source))
    elif commits:
        url = options.git_url or _git_url(default)
        for item in dict.fromkeys(commits):
            commit, _, version_text = item.partition("=")
            if not re.fullmatch(r"[0-9a-f]{40}", commit):
                raise ConfigurationError(f"--commits: {commit!r} is not a full 40-hex commit id",
                                         "a tag or branch can move: pass git rev-parse's "
                                         "output")
            try:
                at = Version(version_text) if version_text else default.upstream_version
            except InvalidVersion:
                raise ConfigurationError(f"--commits: {version_text!r} is not a PEP 440 version",
                                         "write COMMIT=VERSION like abc…=0.5.10.post1"
                                         ) from None
            source = fetch_pin(GitPin(url, commit), at, cache=cache, reporter=options.reporter)
            columns.append(Column(f"{commit[:12]} ({at})", source))
    else:
        for target in targets.targets.values():
            source = fetch_source(target, cache=cache, index_url=options.index_url,
                                  reporter=options.reporter)
            columns.append(Column(str(target.upstream_version), source, target.name))
    return check_matrix(series, columns)


def _git_url(target: Target) -> str:
    pin = target.pin("git")
    assert isinstance(pin, GitPin)
    return pin.url

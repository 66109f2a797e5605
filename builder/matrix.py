"""Compatibility matrix: the series applied cumulatively to several upstream releases.

Each column is one upstream release or revision (a target's pin, a version found on the
index -- sdist, else a released wheel read as source -- or a git commit); each row is a
patch. A cell says what the engine would do there (clean / offset N / fuzz N / ambiguous
/ already-applied / obsolete / failed / not-applicable) and whether the patch's intent
checks hold afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from builder.config import Series
from builder.hunks import HunkStatus
from builder.patch import PatchOutcome, PatchReport, PatchStatus, plan_series
from builder.source import SourceResult


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


@dataclass(frozen=True)
class Cell:
    """One patch on one release."""

    status: str
    text: str
    intents: bool | None  # None: the patch declares no check, or it did not run

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"status": self.status, "text": self.text, "intents_hold": self.intents}


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


def describe_outcome(outcome: PatchOutcome) -> tuple[str, str]:
    """Return ``(status, text)`` for a cell: ``offset -151``, ``fuzz 1``, ``failed: ...``."""
    hunks = [h for f in outcome.files for h in f.hunks]
    if outcome.status == PatchStatus.APPLIED:
        fuzz = max((h.fuzz or 0 for h in hunks), default=0)
        offsets = [h.offset or 0 for h in hunks]
        offset = max(offsets, key=abs, default=0)
        if fuzz:
            return "fuzz", f"fuzz {fuzz}" + (f" (allowed up to {outcome.max_fuzz})"
                                             if outcome.max_fuzz else "")
        if offset:
            return "offset", f"offset {offset}"
        return "clean", "clean"
    if outcome.status == PatchStatus.FAILED:
        worst = next((h for h in hunks if h.status not in (
            HunkStatus.CLEAN, HunkStatus.OFFSET, HunkStatus.FUZZ,
            HunkStatus.ALREADY_APPLIED)), None)
        if worst is None:
            return "failed", "failed"
        if worst.status == HunkStatus.FAILED and worst.fuzz:
            return "failed", f"needs fuzz {worst.fuzz} (allowed {outcome.max_fuzz})"
        return ("ambiguous" if worst.status == HunkStatus.AMBIGUOUS else "failed",
                str(worst.status) if worst.status != HunkStatus.FAILED else "failed")
    return str(outcome.status), str(outcome.status)


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

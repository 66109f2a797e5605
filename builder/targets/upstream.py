"""Upstream check: SGLang releases newer than the newest target, and what they mean for
the patch series.

The scheduled CI job (``ci/upstream.yml``, ``nox -s upstream``) lists the project's
releases on the simple index (PEP 691 JSON or PEP 503 HTML, the same pages the source
stage reads), keeps those newer than every target, runs the compatibility matrix
(:mod:`builder.patching.matrix`) on them and sorts each patch × release into what to do:

========== ===========================================================================
action     meaning
========== ===========================================================================
refresh    the patch fails there (not found, ambiguous, needs more fuzz than allowed,
           or its intent checks fail afterwards): refresh it or add a patch for that
           range before pinning the release
fuzz       it applies only with fuzz its allowance permits: a refreshed copy is better
obsolete   its intent checks already hold upstream, or upstream carries the change
           itself (already applied): it can end its version range there
not-reached an earlier patch failed, so this one was not tried
========== ===========================================================================

A release on which no patch changes anything (every one obsolete, already applied or
outside its version range) is listed too: a target pinned to it ships upstream's own
wheel, sha256-pinned and unrenamed (:func:`builder.wheel.build.upstream_wheel`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from packaging.version import Version

from builder.core.config import load_targets
from builder.core.options import Options
from builder.patching.matrix import Cell, Matrix, run_matrix
from builder.source.fetch import (
    IndexRelease,
    list_releases,
)

Action = Literal["refresh", "fuzz", "obsolete", "not-reached"]
_BLOCKING: frozenset[str] = frozenset({"refresh", "not-reached"})


@dataclass(frozen=True)
class Skipped:
    """A newer release left out of the check, and why (``yanked``, ``pre-release``)."""

    version: str
    reason: str


@dataclass(frozen=True)
class Finding:
    """One patch on one new release that needs attention.

    Attributes:
        patch: the patch's file name.
        version: the upstream release (column label).
        action: ``refresh``, ``fuzz``, ``obsolete`` or ``not-reached`` (module docstring).
        detail: the matrix cell's text (``needs fuzz 1 (allowed 0)``, ``obsolete``...).
    """

    patch: str
    version: str
    action: Action
    detail: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"patch": self.patch, "version": self.version, "action": self.action,
                "detail": self.detail}


@dataclass(frozen=True)
class UpstreamReport:
    """The result of one upstream check.

    Attributes:
        project: the index project (``sglang``).
        index_url: the simple index asked.
        index_origin: where that index came from (``--index-url``, ``PIP_INDEX_URL``,
            ``pip config (...)`` or pip's default).
        newest_target: the newest upstream version any target pins.
        new_versions: releases newer than it that were checked, oldest first.
        skipped: newer releases left out (yanked; pre-releases unless asked for).
        matrix: the compatibility matrix on ``new_versions`` (``None`` when there are none).
        findings: what needs attention, by patch and release.
        unpatched: new releases on which no patch changes anything.
    """

    project: str
    index_url: str
    newest_target: str
    new_versions: tuple[str, ...]
    skipped: tuple[Skipped, ...]
    matrix: Matrix | None
    findings: tuple[Finding, ...]
    unpatched: tuple[str, ...]
    index_origin: str = "--index-url"

    @property
    def needs_refresh(self) -> bool:
        """True when the series would break on a new release (a ``refresh`` or
        ``not-reached`` finding)."""
        return any(f.action in _BLOCKING for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data (the matrix as :meth:`builder.patching.matrix.Matrix.to_json`)."""
        return {"project": self.project, "index_url": self.index_url,
                "index_origin": self.index_origin, "newest_target": self.newest_target,
                "new_versions": list(self.new_versions),
                "skipped": [{"version": s.version, "reason": s.reason} for s in self.skipped],
                "needs_refresh": self.needs_refresh,
                "findings": [f.to_json() for f in self.findings],
                "unpatched": list(self.unpatched),
                "matrix": self.matrix.to_json() if self.matrix else None}

    def _by_action(self, action: Action) -> list[str]:
        grouped: dict[tuple[str, str], list[str]] = {}
        for finding in self.findings:
            if finding.action == action:
                grouped.setdefault((finding.patch, finding.detail), []).append(finding.version)
        return [f"- `{patch}` on {', '.join(versions)}: {detail}"
                for (patch, detail), versions in grouped.items()]

    def to_markdown(self) -> str:
        """Return a Markdown report (for a job summary): summary, findings, the matrix."""
        lines = [f"## Upstream check: `{self.project}` on {self.index_url}", ""]
        skipped = ", ".join(f"{s.version} ({s.reason})" for s in self.skipped)
        if not self.new_versions:
            lines.append(f"No release newer than the newest target ({self.newest_target})."
                         + (f" Skipped: {skipped}." if skipped else ""))
            return "\n".join(lines) + "\n"
        lines.append(f"Newest target: {self.newest_target}. Newer releases checked: "
                     f"{', '.join(self.new_versions)}." + (f" Skipped: {skipped}." if skipped
                                                            else ""))
        sections: list[tuple[str, list[str]]] = [
            ("Needs a refresh", self._by_action("refresh")),
            ("Not tried (an earlier patch failed)", self._by_action("not-reached")),
            ("Applies only with allowed fuzz (a refreshed copy is better)",
             self._by_action("fuzz")),
            ("Became obsolete (can end its version range)", self._by_action("obsolete")),
            ("Nothing to patch (a target pinned to it ships upstream's own wheel)",
             [f"- {version}" for version in self.unpatched]),
        ]
        for title, items in sections:
            if items:
                lines += ["", f"### {title}", "", *items]
        if not any(items for _, items in sections):
            lines += ["", "Every patch applies cleanly or with an offset; nothing to do."]
        if self.matrix is not None:
            lines += ["", "### Matrix", "", self.matrix.to_markdown().rstrip("\n")]
        return "\n".join(lines) + "\n"


def newer_releases(releases: Iterable[IndexRelease], newest: Version, *,
                   pre: bool = False) -> tuple[list[Version], list[Skipped]]:
    """Pick the releases newer than ``newest``.

    Args:
        releases: what the index lists (:func:`builder.source.fetch.list_releases`).
        newest: the newest upstream version of any target.
        pre: also keep pre-releases and development releases.

    Returns:
        ``(versions to check, oldest first; newer releases left out, with the reason)``.
        A release whose every file is yanked (PEP 592) is always left out.
    """
    keep: list[Version] = []
    skipped: list[Skipped] = []
    for release in sorted(releases, key=lambda r: r.version):
        if release.version <= newest:
            continue
        if release.yanked:
            skipped.append(Skipped(str(release.version), "yanked"))
        elif release.version.is_prerelease and not pre:
            skipped.append(Skipped(str(release.version), "pre-release"))
        else:
            keep.append(release.version)
    return keep, skipped


def _action(status: str, intents: bool | None) -> Action | None:
    if status in ("failed", "ambiguous"):
        return "refresh"
    if status in ("clean", "offset", "fuzz") and intents is False:
        return "refresh"  # applied, but no longer means what it says
    if status == "fuzz":
        return "fuzz"
    if status in ("obsolete", "already-applied"):
        return "obsolete"
    if status == "not-reached":
        return "not-reached"
    return None  # clean, offset, not-applicable


def _detail(cell: Cell) -> str:
    if cell.status == "obsolete":
        return "its intent checks hold without it"
    if cell.status == "already-applied":
        return "upstream carries the change (already applied)"
    return cell.text + (", intent checks fail" if cell.intents is False else "")


def assess(matrix: Matrix) -> tuple[tuple[Finding, ...], tuple[str, ...]]:
    """Sort a matrix's cells into findings.

    Args:
        matrix: the compatibility matrix over the new releases.

    Returns:
        ``(findings in patch then column order, labels of columns no patch changes)``.
    """
    findings = []
    for name, row in zip(matrix.patches, matrix.cells, strict=True):
        for column, cell in zip(matrix.columns, row, strict=True):
            action = _action(cell.status, cell.intents)
            if action is not None:
                findings.append(Finding(name, column.label, action, _detail(cell)))
    unpatched = tuple(
        column.label for index, column in enumerate(matrix.columns)
        if matrix.patches and all(row[index].status in ("obsolete", "already-applied",
                                                        "not-applicable")
                                  for row in matrix.cells))
    return tuple(findings), unpatched


def run_upstream(options: Options, *, pre: bool = False) -> UpstreamReport:
    """Check the releases newer than the newest target against the series.

    Lists the default target's project on ``options.index_url``, keeps the releases
    newer than every target's upstream version (no yanked ones; pre-releases only with
    ``pre``), runs :func:`run_matrix` on them and sorts the cells
    (:func:`builder.targets.upstream.assess`).

    Raises:
        BuilderError: the targets or series file is invalid, the index is unreachable,
            or a new release cannot be fetched.
    """
    targets = load_targets(options.targets_file)
    project = targets.get(None).sdist_project
    newest = max(t.upstream_version for t in targets.targets.values())
    index = options.index
    options.reporter.info(f"Listing {project} on {index}")
    versions, skipped = newer_releases(list_releases(project, index.url), newest,
                                       pre=pre)
    matrix = run_matrix(options, versions=[str(v) for v in versions]) if versions else None
    findings, unpatched = assess(matrix) if matrix else ((), ())
    return UpstreamReport(project=project, index_url=index.url, index_origin=index.origin,
                          newest_target=str(newest),
                          new_versions=tuple(str(v) for v in versions),
                          skipped=tuple(skipped), matrix=matrix, findings=findings,
                          unpatched=unpatched)

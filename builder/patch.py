"""Patch stage: apply a series to a source tree, all or nothing, with a per-hunk report.

Every patch file is checked against its pinned sha256 first; each patch is parsed with
unidiff and applied with the hunk matcher (:mod:`builder.hunks`) to an in-memory view of
the tree; the fuzz policy of the series decides which placements are acceptable; intent
checks run after the whole series. Only when everything passed is anything written: to a
new cache entry (a copy of the source tree) or, for ``--source-dir`` in place, file by
file through temporary files and renames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from builder.cache import Cache, atomic_write_bytes, sha256_file, sha256_json
from builder.config import Series, SeriesEntry
from builder.errors import BuilderError
from builder.hunks import (
    APPLIED_STATUSES,
    DEFAULT_FUZZ_SEARCH,
    Hunk,
    HunkResult,
    HunkStatus,
    apply_file_hunks,
    split_lines,
)
from builder.intent import IntentCheck
from builder.layout import Layout
from builder.source import SourceResult, link_tree

ENGINE_VERSION = "1"  # bump when placement rules change: it is part of the cache key


class PatchStatus(StrEnum):
    """What happened to one patch of the series."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already-applied"
    FAILED = "failed"
    NOT_APPLICABLE = "not-applicable"
    NOT_REACHED = "not-reached"


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a patch.

    Attributes:
        old_path: repository path before (``None`` when the patch creates the file).
        new_path: repository path after (``None`` when the patch deletes the file).
        hunks: the hunks in order.
    """

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        """The path reports name: the new path, or the old one for a deletion."""
        return self.new_path or self.old_path or "?"


@dataclass(frozen=True)
class ParsedPatch:
    """A patch file parsed at a fixed strip level."""

    path: Path
    sha256: str
    header: str
    files: tuple[FilePatch, ...]


@dataclass(frozen=True)
class FileReport:
    """Per-file part of a patch report."""

    path: str
    hunks: tuple[HunkResult, ...]

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"path": self.path, "hunks": [h.to_json() for h in self.hunks]}


@dataclass(frozen=True)
class PatchOutcome:
    """What happened to one series entry.

    Attributes:
        name: the patch's file name.
        sha256: the file's sha256 as read.
        status: see :class:`PatchStatus`.
        strip: the strip level used.
        max_fuzz: the fuzz the policy allowed for this upstream version.
        fuzz_reason: why that fuzz is allowed (empty when 0 is the limit).
        files: per-file hunk results.
        message: why it failed, when it did.
    """

    name: str
    sha256: str
    status: PatchStatus
    strip: int
    max_fuzz: int = 0
    fuzz_reason: str = ""
    files: tuple[FileReport, ...] = ()
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "sha256": self.sha256, "status": str(self.status),
                "strip": self.strip, "max_fuzz": self.max_fuzz,
                "fuzz_reason": self.fuzz_reason, "message": self.message,
                "files": [f.to_json() for f in self.files]}


@dataclass(frozen=True)
class IntentReport:
    """One intent check's result, before and after the series."""

    patch: str
    check: str
    held_before: bool
    holds: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"patch": self.patch, "check": self.check, "held_before": self.held_before,
                "holds": self.holds, "detail": self.detail}


@dataclass(frozen=True)
class PatchReport:
    """The whole series' report.

    Attributes:
        upstream_version: the version the series was applied to.
        patches: one outcome per series entry, in order.
        intents: every intent check of the applicable patches.
    """

    upstream_version: str
    patches: tuple[PatchOutcome, ...]
    intents: tuple[IntentReport, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no patch failed and every intent check holds."""
        return all(p.status != PatchStatus.FAILED for p in self.patches) and \
            all(i.holds for i in self.intents)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"upstream_version": self.upstream_version, "ok": self.ok,
                "patches": [p.to_json() for p in self.patches],
                "intents": [i.to_json() for i in self.intents]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchReport:
        """Rebuild a report from :meth:`to_json` output (or a wheel's provenance record)."""
        patches = tuple(
            PatchOutcome(name=p["name"], sha256=p["sha256"], status=PatchStatus(p["status"]),
                         strip=p["strip"], max_fuzz=p["max_fuzz"],
                         fuzz_reason=p["fuzz_reason"], message=p["message"],
                         files=tuple(FileReport(f["path"], tuple(
                             HunkResult.from_json(h) for h in f["hunks"]))
                             for f in p["files"]))
            for p in data["patches"])
        return cls(data["upstream_version"], patches,
                   tuple(IntentReport(**i) for i in data["intents"]))


@dataclass(frozen=True)
class PatchResult:
    """The patched tree and how it was made.

    Attributes:
        tree: the patched tree's root (a cache entry, or the user's folder in place).
        layout: the tree's layout.
        source: the source the series was applied to.
        report: the per-patch, per-hunk report.
        key: content key of the patched tree (source key + patch hashes + engine).
    """

    tree: Path
    layout: Layout
    source: SourceResult
    report: PatchReport
    key: str


@dataclass
class _TreeView:
    """A tree plus pending changes (``None`` marks a deletion); nothing touches disk."""

    root: Path
    layout: Layout
    changes: dict[str, bytes | None] = field(default_factory=dict)

    def tree_path(self, repo_path: str) -> str | None:
        return self.layout.tree_path(repo_path)

    def read(self, tree_path: str) -> str | None:
        if tree_path in self.changes:
            data = self.changes[tree_path]
        else:
            file = self.root / tree_path
            data = file.read_bytes() if file.is_file() else None
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def read_repo_path(self, repo_path: str) -> str | None:
        tree_path = self.tree_path(repo_path)
        return None if tree_path is None else self.read(tree_path)


def _strip(name: str, strip: int, patch: Path) -> str | None:
    if name == "/dev/null":
        return None
    parts = [p for p in name.split("/") if p]
    if len(parts) <= strip:
        raise BuilderError(f"{patch.name}: path {name!r} has no component left after "
                           f"stripping {strip}", "check the series' strip level for it")
    rest = parts[strip:]
    if any(p == ".." for p in rest) or (name.startswith("/") and strip == 0):
        raise BuilderError(f"{patch.name}: unsafe path {name!r}", "refusing to write there")
    return "/".join(rest)


def parse_patch(path: Path, strip: int) -> ParsedPatch:
    """Parse a unified diff (plain or ``git format-patch``) at a fixed strip level.

    Args:
        path: the patch file.
        strip: leading path components to remove (``-p``), e.g. 1 for ``a/`` ``b/``.

    Raises:
        BuilderError: the file is missing or unreadable, holds no diff, is malformed,
            holds a binary diff, or names a path unsafe or too short for ``strip``.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BuilderError(f"patch file not found: {path}",
                           "check the series file's 'file' entries") from None
    except OSError as exc:
        raise BuilderError(f"cannot read patch file {path}: {exc.strerror}", "") from None
    text = data.decode("utf-8", "surrogateescape")
    try:
        patch_set = PatchSet(text)
    except UnidiffParseError as exc:
        raise BuilderError(f"{path.name} is not a valid unified diff: {exc}",
                           "regenerate it with git diff or git format-patch") from None
    if not len(patch_set):
        raise BuilderError(f"{path.name} contains no diff",
                           "an empty or truncated patch file; regenerate it")
    files = []
    header = ""
    for index, patched in enumerate(patch_set):
        if index == 0:
            header = str(patched.patch_info or "")
        if patched.is_binary_file:
            raise BuilderError(f"{path.name}: {patched.path} is a binary diff",
                               "binary patches are not supported; ship the file another way")
        hunks = []
        for number, hunk in enumerate(patched, 1):
            lines: list[tuple[str, str]] = []
            for line in hunk:
                if line.line_type == "\\":
                    if lines:
                        kind, value = lines[-1]
                        lines[-1] = (kind, value.rstrip("\n"))
                    continue
                lines.append((line.line_type, line.value))
            hunks.append(Hunk(number, hunk.source_start, hunk.source_length,
                              hunk.target_start, hunk.target_length, tuple(lines),
                              hunk.section_header and " " + hunk.section_header))
        files.append(FilePatch(_strip(patched.source_file, strip, path),
                               _strip(patched.target_file, strip, path), tuple(hunks)))
    return ParsedPatch(path=path, sha256=sha256_file(path), header=header, files=tuple(files))


def _apply_patch(view: _TreeView, parsed: ParsedPatch, entry: SeriesEntry,
                 max_fuzz: int, fuzz_reason: str
                 ) -> tuple[PatchOutcome, dict[str, bytes | None]]:
    """Apply one patch to the view; return its outcome and the changes to stage."""
    reports: list[FileReport] = []
    staged: dict[str, bytes | None] = {}
    problems: list[str] = []
    states: set[str] = set()
    for file_patch in parsed.files:
        repo_path = file_patch.new_path or file_patch.old_path
        assert repo_path is not None
        tree_path = view.tree_path(repo_path)
        old_tree_path = view.tree_path(file_patch.old_path) if file_patch.old_path else None
        if tree_path is None or (file_patch.old_path and old_tree_path is None):
            raise BuilderError(f"{parsed.path.name}: {repo_path} is outside the "
                               f"{view.layout.kind} layout",
                               "this file is not in an sdist; build from git (--source git)")
        current = view.read(old_tree_path) if old_tree_path else None
        if file_patch.old_path and current is None:
            problems.append(f"{repo_path}: file to patch does not exist")
            reports.append(FileReport(repo_path, tuple(
                HunkResult(h.index, HunkStatus.FAILED, note="file does not exist")
                for h in file_patch.hunks)))
            continue
        search = max(DEFAULT_FUZZ_SEARCH, max_fuzz)
        outcome = apply_file_hunks(split_lines(current or ""), file_patch.hunks,
                                   fuzz_search=search)
        results = list(outcome.results)
        for i, result in enumerate(results):
            if result.status == HunkStatus.FUZZ and (result.fuzz or 0) > max_fuzz:
                results[i] = HunkResult(
                    result.hunk, HunkStatus.FAILED, line=result.line, offset=result.offset,
                    fuzz=result.fuzz, changed_line=result.changed_line,
                    note=f"needs fuzz {result.fuzz}, the series allows {max_fuzz} here")
        reports.append(FileReport(repo_path, tuple(results)))
        bad = [r for r in results if r.status not in APPLIED_STATUSES
               and r.status != HunkStatus.ALREADY_APPLIED]
        if bad:
            problems.extend(f"{repo_path} hunk #{r.hunk}: {r.status}"
                            + (f" ({r.note})" if r.note else "") for r in bad)
            continue
        if outcome.already_applied:
            states.add("already")
            continue
        if any(r.status == HunkStatus.ALREADY_APPLIED for r in results):
            problems.append(f"{repo_path}: some hunks are already applied and others not")
            continue
        states.add("applied")
        assert outcome.new_lines is not None
        if file_patch.new_path is None:
            staged[tree_path] = None
        else:
            staged[tree_path] = "".join(outcome.new_lines).encode("utf-8", "surrogateescape")
            if old_tree_path and old_tree_path != tree_path:
                staged[old_tree_path] = None
    if not problems and states == {"applied", "already"}:
        problems.append("part of the patch is already applied and part is not")
    if problems:
        status, staged = PatchStatus.FAILED, {}
    elif states == {"already"}:
        status, staged = PatchStatus.ALREADY_APPLIED, {}
    else:
        status = PatchStatus.APPLIED
    return PatchOutcome(name=parsed.path.name, sha256=parsed.sha256, status=status,
                        strip=entry.strip, max_fuzz=max_fuzz, fuzz_reason=fuzz_reason,
                        files=tuple(reports), message="; ".join(problems)), staged


def _check_pin(entry: SeriesEntry) -> str:
    if not entry.path.is_file():
        raise BuilderError(f"patch file not found: {entry.path}",
                           "check the series file's 'file' entries")
    actual = sha256_file(entry.path)
    if entry.sha256 is not None and actual != entry.sha256:
        raise BuilderError(
            f"patch file {entry.name} changed after it was pinned: sha256 {actual}, "
            f"series says {entry.sha256}",
            "review the change, then put the new sha256 into the series file")
    return actual


def plan_series(source: SourceResult, series: Series
                ) -> tuple[PatchReport, dict[str, bytes | None]]:
    """Apply ``series`` to ``source`` in memory and check intents; write nothing.

    Returns:
        The report and the changes (tree path -> new bytes, ``None`` to delete). The
        changes are empty unless the report is ok.

    Raises:
        BuilderError: a patch file is missing, changed after pinning, or malformed, or
            names a path outside the tree's layout (raised before any hunk is tried).
    """
    version = source.upstream_version
    digests = [_check_pin(entry) for entry in series.entries]
    parsed = {entry.path: parse_patch(entry.path, entry.strip) for entry in series.entries}
    view = _TreeView(source.tree, source.layout)
    before = _TreeView(source.tree, source.layout)
    outcomes: list[PatchOutcome] = []
    failed = False
    for entry, digest in zip(series.entries, digests, strict=True):
        if series.path is not None and not entry.applies_to(version):
            outcomes.append(PatchOutcome(entry.name, digest, PatchStatus.NOT_APPLICABLE,
                                         entry.strip, message=f"declared for {entry.versions}"))
            continue
        if failed:
            outcomes.append(PatchOutcome(entry.name, digest, PatchStatus.NOT_REACHED,
                                         entry.strip, message="an earlier patch failed"))
            continue
        max_fuzz, reason = entry.fuzz_limit(version)
        outcome, staged = _apply_patch(view, parsed[entry.path], entry, max_fuzz, reason)
        outcomes.append(outcome)
        failed = outcome.status == PatchStatus.FAILED
        view.changes.update(staged)
    intents: list[IntentReport] = []
    for entry, outcome in zip(series.entries, outcomes, strict=True):
        if outcome.status not in (PatchStatus.APPLIED, PatchStatus.ALREADY_APPLIED):
            continue
        for check in entry.intents:
            intents.append(_run_intent(entry, check, before, view))
    report = PatchReport(str(version), tuple(outcomes), tuple(intents))
    return report, (view.changes if report.ok else {})


def _run_intent(entry: SeriesEntry, check: IntentCheck, before: _TreeView,
                after: _TreeView) -> IntentReport:
    held = check.evaluate(before.read_repo_path(check.file)).holds
    outcome = check.evaluate(after.read_repo_path(check.file))
    return IntentReport(entry.name, check.describe(), held, outcome.holds, outcome.detail)


def _failure(report: PatchReport) -> BuilderError:
    for outcome in report.patches:
        if outcome.status == PatchStatus.FAILED:
            return BuilderError(f"patch {outcome.name} failed: {outcome.message}",
                                "see the hunk report above; fix or refresh the patch, or "
                                "declare a fuzz allowance with a reason in the series",
                                report=report)
    broken = next(i for i in report.intents if not i.holds)
    return BuilderError(f"intent check of {broken.patch} failed: {broken.check}: "
                        f"{broken.detail}",
                        "the patch applied but did not do what it declares; fix the patch",
                        report=report)


def _write_changes(root: Path, changes: dict[str, bytes | None]) -> None:
    for tree_path, data in sorted(changes.items()):
        target = root / tree_path
        if data is None:
            target.unlink(missing_ok=True)
        else:
            atomic_write_bytes(target, data)


def patch_key(source: SourceResult, series: Series) -> str:
    """Return the content key of ``series`` applied to ``source`` (for the cache)."""
    return sha256_json({
        "engine": ENGINE_VERSION, "source": source.key,
        "version": str(source.upstream_version),
        "patches": [[e.name, sha256_file(e.path), e.strip,
                     e.fuzz_limit(source.upstream_version)[0]] for e in series.entries],
    })


def apply_series(source: SourceResult, series: Series, *, cache: Cache | None = None,
                 in_place: bool = False, dry_run: bool = False) -> PatchResult:
    """Apply a series to a source tree, all or nothing.

    Args:
        source: the tree to patch (never modified unless ``in_place``).
        series: the patches, in order.
        cache: where the patched copy goes (required unless ``in_place`` or ``dry_run``).
        in_place: write the changes into ``source.tree`` itself (``--source-dir``).
        dry_run: only report; write nothing.

    Returns:
        The patched tree and the report.

    Raises:
        BuilderError: a patch file is missing, changed or malformed, a hunk failed, was
            ambiguous or needed more fuzz than allowed, part of a patch was already
            applied, or an intent check failed. Nothing has been written then; the error
            carries the report.
    """
    report, changes = plan_series(source, series)
    if not report.ok:
        raise _failure(report)
    key = patch_key(source, series)
    if dry_run:
        return PatchResult(source.tree, source.layout, source, report, key)
    if in_place:
        _write_changes(source.tree, changes)
        return PatchResult(source.tree, source.layout, source, report, key)
    if cache is None:
        raise ValueError("apply_series needs a cache unless in_place or dry_run")
    entry = cache.lookup("patched", key)
    if entry is None:
        with cache.building("patched", key) as tmp:
            # Hard links: _write_changes replaces files by rename, never in place.
            link_tree(source.tree, tmp / "tree")
            _write_changes(tmp / "tree", changes)
        entry = cache.entry("patched", key)
    return PatchResult(entry / "tree", source.layout, source, report, key)

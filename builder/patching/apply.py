"""Patch stage: apply a series to a source tree, all or nothing, with a per-hunk report.

Every patch file is checked against its pinned sha256 first; each patch is parsed
(:mod:`builder.patching.patchfile`) and applied with the hunk matcher
(:mod:`builder.patching.hunks`) file by file (:mod:`builder.patching.files`) to an
in-memory view of the tree; the fuzz policy of the
series decides which placements are acceptable; intent checks run after the whole series.
Only when everything passed is anything written: to a new cache entry (a copy of the
source tree) or, for ``--source-dir`` in place, file by file through temporary files and
renames.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder.core.cache import (
    Cache,
    atomic_write_bytes,
    legacy_entry,
    sha256_file,
    sha256_json,
    sha256_tree,
    signals_deferred,
)
from builder.core.errors import BuilderError, ConfigurationError, PatchError
from builder.core.layout import Layout
from builder.core.options import Options, select_target
from builder.patching.files import FileReport, TreeView, apply_file, link_on_path
from builder.patching.hunks import HunkResult
from builder.patching.intent import IntentCheck
from builder.patching.patchfile import ParsedPatch, parse_patch
from builder.patching.series import Series, SeriesEntry, select_series
from builder.patching.status import PARTLY_APPLIED, FileStatus, patch_status
from builder.patching.status import PatchStatus as PatchStatus  # re-exported: its old home
from builder.source.fetch import (
    SourceResult,
    link_tree,
    obtain_source,
)

ENGINE_VERSION = "3"  # bump when placement rules change: it is part of the cache key


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
        """True when no patch failed and every intent check holds after the series."""
        return all(p.status != PatchStatus.FAILED for p in self.patches) and \
            all(i.holds for i in self.intents)

    @property
    def warnings(self) -> list[str]:
        """Every hunk note that is a warning (``warning: ...``), as ``patch: path: note``."""
        return [f"{p.name}: {f.path} hunk #{h.hunk}: {h.note}" for p in self.patches
                for f in p.files for h in f.hunks if h.note.startswith("warning:")]

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"upstream_version": self.upstream_version, "ok": self.ok,
                "warnings": self.warnings,
                "patches": [p.to_json() for p in self.patches],
                "intents": [i.to_json() for i in self.intents]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchReport:
        """Rebuild a report from :meth:`to_json` output (or a wheel's provenance record)."""
        patches = tuple(
            PatchOutcome(name=p["name"], sha256=p["sha256"], status=PatchStatus(p["status"]),
                         strip=p["strip"], max_fuzz=p["max_fuzz"],
                         fuzz_reason=p["fuzz_reason"], message=p["message"],
                         files=tuple(FileReport(f["path"], FileStatus(f["status"]), tuple(
                             HunkResult.from_json(h) for h in f["hunks"]), f["note"])
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
        key: content key of the patched tree (the source key and the exact changes).
        tree_sha256: digest of the patched tree's files when the cache entry was made
            (``None`` when the tree is not a cache entry); checked before a build.
    """

    tree: Path
    layout: Layout
    source: SourceResult
    report: PatchReport
    key: str
    tree_sha256: str | None = None


def _apply_patch(view: TreeView, parsed: ParsedPatch, entry: SeriesEntry,
                 max_fuzz: int, fuzz_reason: str
                 ) -> tuple[PatchOutcome, dict[str, bytes | None], dict[str, int]]:
    """Apply one patch to the view; return its outcome and the changes to stage."""
    # Files of one patch see each other's changes (a patch may touch a file twice).
    # Git copies and renames read their source from ``view``, the tree before this patch.
    scratch = TreeView(view.root, view.layout, dict(view.changes), dict(view.modes))
    reports: list[FileReport] = []
    for file_patch in parsed.files:
        outcome = apply_file(scratch, parsed.path.name, file_patch, max_fuzz, entry.strip,
                             preimage=view)
        reports.append(outcome.report)
        scratch.changes.update(outcome.staged)
        scratch.modes.update(outcome.modes)
    status = patch_status(r.status for r in reports)
    problems = [f"{r.path}: {r.status}" + (f" ({r.note})" if r.note else "")
                for r in reports if r.status.refused]
    if status == PatchStatus.FAILED and not problems:
        problems.append(PARTLY_APPLIED)
    # The scratch view started as a copy of ``view``: its dicts are the view after this
    # patch, so the caller can take them whole.
    staged, modes = scratch.changes, scratch.modes
    if status != PatchStatus.APPLIED:
        staged, modes = {}, {}
    return PatchOutcome(name=parsed.path.name, sha256=parsed.sha256, status=status,
                        strip=entry.strip, max_fuzz=max_fuzz, fuzz_reason=fuzz_reason,
                        files=tuple(reports), message="; ".join(problems)), staged, modes


def read_series(series: Series) -> dict[Path, ParsedPatch]:
    """Check every patch file against its pinned sha256 and parse it (no tree needed).

    Called before a source is fetched, so a bad series fails fast.

    Returns:
        The parsed patches by path.

    Raises:
        BuilderError: a patch file is missing, changed after it was pinned, or malformed.
    """
    parsed = {}
    for entry in series.entries:
        if not entry.path.is_file():
            raise ConfigurationError(f"patch file not found: {entry.path}",
                                     "check the --patch path" if entry.sha256 is None else
                                     "check the series file's 'file' entries")
        actual = sha256_file(entry.path)
        if entry.sha256 is not None and actual != entry.sha256:
            raise PatchError(
                f"patch file {entry.name} changed after it was pinned: sha256 {actual}, "
                f"series says {entry.sha256}",
                "review the change, then put the new sha256 into the series file")
        parsed[entry.path] = parse_patch(entry.path, entry.strip)
    return parsed


@dataclass(frozen=True)
class Changes:
    """What a series does to a tree: new bytes per tree path (``None`` deletes) and modes."""

    files: dict[str, bytes | None] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PatchStep:
    """One series entry replayed: its outcome and the files it touched, before and after.

    Attributes:
        entry: the series entry.
        parsed: the parsed patch.
        outcome: what happened.
        before: repository path -> content before this patch (``None``: absent).
        after: repository path -> content after it (equal to ``before`` unless applied).
        held_before: each intent check's result before this patch.
        modes_before: repository path -> permission bits before (``None``: absent).
        modes_after: repository path -> permission bits after.
    """

    entry: SeriesEntry
    parsed: ParsedPatch
    outcome: PatchOutcome
    before: dict[str, bytes | None]
    after: dict[str, bytes | None]
    held_before: tuple[bool, ...]
    modes_before: dict[str, int | None] = field(default_factory=dict)
    modes_after: dict[str, int | None] = field(default_factory=dict)


def replay_series(source: SourceResult, series: Series, *, fuzz: int | None = None
                  ) -> tuple[list[PatchStep | PatchOutcome], TreeView]:
    """Apply ``series`` to ``source`` in memory, one entry after another.

    Args:
        source: the tree.
        series: the patches.
        fuzz: the fuzz to allow every patch instead of the series' policy (``refresh
            --accept-fuzz``); ``None`` keeps the policy.

    Returns:
        Per entry a :class:`PatchStep`, or only a :class:`PatchOutcome` when the entry
        was not tried (not applicable, or after a failure); and the final view.

    Raises:
        BuilderError: a patch file is missing, changed after pinning, or malformed, or
            names a path outside the tree's layout.
    """
    version = source.upstream_version
    parsed = read_series(series)
    view = TreeView(source.tree, source.layout)
    steps: list[PatchStep | PatchOutcome] = []
    failed = False
    for entry in series.entries:
        patch = parsed[entry.path]
        if series.path is not None and not entry.applies_to(version):
            steps.append(PatchOutcome(entry.name, patch.sha256, PatchStatus.NOT_APPLICABLE,
                                      entry.strip, message=f"declared for {entry.versions}"))
            continue
        if failed:
            steps.append(PatchOutcome(entry.name, patch.sha256, PatchStatus.NOT_REACHED,
                                      entry.strip, message="an earlier patch failed"))
            continue
        held = tuple(check.evaluate_tree(view).holds for check in entry.intents)
        max_fuzz, reason = entry.fuzz_limit(version)
        if fuzz is not None:
            max_fuzz, reason = max(max_fuzz, fuzz), reason or "--accept-fuzz"
        outcome, staged, modes = _apply_patch(view, patch, entry, max_fuzz, reason)
        if held and all(held) and outcome.status != PatchStatus.ALREADY_APPLIED:
            # Upstream already does what the patch means: change nothing, fail nothing.
            outcome = replace(outcome, status=PatchStatus.OBSOLETE,
                              message="its intent checks already hold without it; "
                                      "nothing applied" + (f" (the patch itself: "
                                                           f"{outcome.message})"
                                                           if outcome.message else ""))
            staged, modes = {}, {}
        touched = {path for fp in patch.files for path in (fp.old_path, fp.new_path) if path}
        before = {path: _read_repo_bytes(view, path) for path in sorted(touched)}
        modes_before = {path: _repo_mode(view, path) for path in sorted(touched)}
        view.changes.update(staged)
        view.modes.update(modes)
        after = {path: _read_repo_bytes(view, path) for path in sorted(touched)}
        modes_after = {path: _repo_mode(view, path) for path in sorted(touched)}
        steps.append(PatchStep(entry, patch, outcome, before, after, held, modes_before,
                               modes_after))
        failed = outcome.status == PatchStatus.FAILED
    return steps, view


def _repo_mode(view: TreeView, repo_path: str) -> int | None:
    tree_path = view.tree_path(repo_path)
    if tree_path is None or view.read_bytes(tree_path) is None:
        return None
    return view.mode(tree_path) or 0o644


def _read_repo_bytes(view: TreeView, repo_path: str) -> bytes | None:
    tree_path = view.tree_path(repo_path)
    return None if tree_path is None else view.read_bytes(tree_path)


def plan_series(source: SourceResult, series: Series) -> tuple[PatchReport, Changes]:
    """Apply ``series`` to ``source`` in memory and check intents; write nothing.

    A patch that declares intent checks which all hold before it is applied is
    ``obsolete`` (unless it is ``already-applied``): it is not applied and does not fail.

    Returns:
        The report and the changes; the changes are empty unless the report is ok.

    Raises:
        BuilderError: a patch file is missing, changed after pinning, or malformed, or
            names a path outside the tree's layout (raised before any hunk is tried).
    """
    steps, view = replay_series(source, series)
    outcomes = [s.outcome if isinstance(s, PatchStep) else s for s in steps]
    intents = [_intent_report(step.entry, check, held, view)
               for step in steps if isinstance(step, PatchStep)
               for check, held in zip(step.entry.intents, step.held_before, strict=True)]
    report = PatchReport(str(source.upstream_version), tuple(outcomes), tuple(intents))
    if not report.ok:
        return report, Changes()
    return report, Changes(dict(view.changes), dict(view.modes))


def _intent_report(entry: SeriesEntry, check: IntentCheck, held_before: bool,
                   after: TreeView) -> IntentReport:
    outcome = check.evaluate_tree(after)
    return IntentReport(entry.name, check.describe(), held_before, outcome.holds,
                        outcome.detail)


_HINTS = {
    FileStatus.SYMLINK: "nothing was written; patches never go through symbolic links or create "
               "them (docs/patch-forms.md)",
    FileStatus.BINARY: "nothing was written; ship binary files another way",
    FileStatus.NEW_FILE_EXISTS: "nothing was written; the tree already has that file: remove it "
                       "or drop the creation from the patch",
}


def _failure(report: PatchReport) -> BuilderError:
    for outcome in report.patches:
        if outcome.status == PatchStatus.FAILED:
            refusals = {f.status for f in outcome.files if f.status.refused}
            hint = _HINTS.get(next(iter(refusals)), "") if len(refusals) == 1 else ""
            return PatchError(f"patch {outcome.name} failed: {outcome.message}",
                              hint or "see the hunk report; fix or refresh the patch, or "
                              "declare a fuzz allowance with a reason in the series",
                              report=report)
    broken = next(i for i in report.intents if not i.holds)
    return PatchError(f"intent check of {broken.patch} failed: {broken.check}: "
                      f"{broken.detail}",
                      "the patch applied but did not do what it declares; fix the patch",
                      report=report)


def _write_changes(root: Path, changes: Changes) -> None:
    # The plan refused every path through a link; checked again here, before the first
    # write, so that a link made since (or a caller's own Changes) cannot redirect one.
    for tree_path in changes.files:
        link = link_on_path(root, tree_path)
        if link is not None:
            raise PatchError(f"{tree_path}: {link} is a symbolic link; nothing was written",
                             "a patch never writes through a link; patch the file it "
                             "points to under its own path")
    for tree_path, data in sorted(changes.files.items()):
        target = root / tree_path
        if data is None:
            target.unlink(missing_ok=True)
        else:
            atomic_write_bytes(target, data, changes.modes.get(tree_path))


def patched_tree_key(source: SourceResult, changes: Changes) -> str:
    """Return the content key of a patched tree: the source plus exactly what changed.

    Keyed by the result, not by the series' text, so no setting that decides which
    patches apply (version ranges, fuzz policy, intents) can make two different trees
    share an entry.
    """
    return sha256_json({
        "engine": ENGINE_VERSION, "source": source.key,
        "files": {path: None if data is None else hashlib.sha256(data).hexdigest()
                  for path, data in sorted(changes.files.items())},
        "modes": dict(sorted(changes.modes.items())),
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
    key = patched_tree_key(source, changes)
    if dry_run:
        return PatchResult(source.tree, source.layout, source, report, key)
    if in_place:
        with signals_deferred():  # all files or none, even on Ctrl-C
            _write_changes(source.tree, changes)
        return PatchResult(source.tree, source.layout, source, report, key)
    if cache is None:
        raise ValueError("apply_series needs a cache unless in_place or dry_run")
    def write(tmp: Path) -> dict[str, Any]:
        # Hard links: _write_changes replaces files by rename, never in place.
        link_tree(source.tree, tmp / "tree")
        _write_changes(tmp / "tree", changes)
        return {"tree_sha256": sha256_tree(tmp / "tree", exclude=frozenset({".git"}))}

    # The tree is not hashed on every read: the wheel stage checks it before it builds.
    entry = cache.artifact("patched", key, write, record="", adopt=legacy_entry("tree.json"))
    return PatchResult(entry.path / "tree", source.layout, source, report, key,
                       entry.meta.get("tree_sha256"))


def run_patch(options: Options, *, in_place: bool = False, dry_run: bool = False
              ) -> PatchResult:
    """Source and patch stages.

    A target is needed only when no ``--source-dir`` with ``--series``/``--patch`` is
    given; with ``--source-dir`` and ``in_place`` the user's tree is patched itself.
    """
    ad_hoc = options.source_dir is not None and (options.series or options.patch)
    target = None if ad_hoc and options.target is None else select_target(options)
    series = select_series(options, target)
    read_series(series)  # a bad series fails before any download
    source = obtain_source(options, target)
    result = apply_series(source, series, cache=options.cache, in_place=in_place,
                          dry_run=dry_run)
    return result

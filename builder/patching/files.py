"""File-level handling of the patch stage: one file of a patch, on a view of the tree.

:func:`apply_file` decides what happens to one file of a patch -- refused (a link, binary,
missing, other line endings ...), already applied, or a change to stage -- on a
:class:`TreeView`, the tree plus the series' pending changes, without touching disk. The
series and its all-or-nothing writes are :mod:`builder.patching.apply`.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder.core.errors import PatchError
from builder.core.layout import Layout
from builder.patching.hunks import (
    APPLIED_STATUSES,
    DEFAULT_FUZZ_SEARCH,
    Hunk,
    HunkResult,
    HunkStatus,
    anchor_note,
    apply_file_hunks,
    split_lines,
)
from builder.patching.intent import pattern_root
from builder.patching.patchfile import FilePatch, Operation
from builder.patching.status import FileStatus

ZERO_CONTEXT_WARNING = ("warning: no context lines (diff -U0): only its line number and its "
                        "removed lines place it; check the result, or regenerate the patch "
                        "with context (git diff)")


@dataclass(frozen=True)
class FileReport:
    """Per-file part of a patch report.

    Attributes:
        path: the repository path (the new one for renames and copies).
        status: see :class:`~builder.patching.status.FileStatus`.
        hunks: per-hunk results.
        note: why, for refusals and special cases.
    """

    path: str
    status: FileStatus
    hunks: tuple[HunkResult, ...] = ()
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"path": self.path, "status": str(self.status), "note": self.note,
                "hunks": [h.to_json() for h in self.hunks]}


def link_on_path(root: Path, tree_path: str) -> str | None:
    """The first component of ``tree_path`` under ``root`` that is a symbolic link.

    Args:
        root: the tree.
        tree_path: a relative path (``/``-separated).

    Returns:
        ``"component -> target"`` for the first link found walking down from ``root``
        (the path itself included), or ``None`` when the path crosses no link.
    """
    current = root
    parts = tree_path.split("/")
    for depth, part in enumerate(parts, 1):
        current = current / part
        if current.is_symlink():
            return f"{'/'.join(parts[:depth])} -> {os.readlink(current)}"
        if not current.is_dir():
            return None
    return None


@dataclass
class TreeView:
    """A tree plus pending changes (``None`` marks a deletion); nothing touches disk.

    Attributes:
        root: the tree on disk.
        layout: how repository paths map to tree paths.
        changes: tree path -> new bytes, ``None`` for a deletion.
        modes: tree path -> permission bits of a staged file.
    """

    root: Path
    layout: Layout
    changes: dict[str, bytes | None] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)

    def tree_path(self, repo_path: str) -> str | None:
        """The tree path of a repository path (``None``: outside the layout)."""
        return self.layout.tree_path(repo_path)

    def link_on(self, tree_path: str) -> str | None:
        """The first component of ``tree_path`` (itself included) that is a symbolic link
        on disk, as ``path -> target``; ``None`` when there is none."""
        return link_on_path(self.root, tree_path)

    def obstacle(self, tree_path: str) -> str | None:
        """Why a file cannot be written at ``tree_path``: a folder is there, or a file
        (on disk or staged) stands where a folder of its path must be; else ``None``."""
        parts = tree_path.split("/")
        for depth in range(1, len(parts)):
            ancestor = "/".join(parts[:depth])
            if self.changes.get(ancestor) is not None or (
                    ancestor not in self.changes and (self.root / ancestor).is_file()):
                return f"{ancestor} is a file, not a folder"
        if (self.root / tree_path).is_dir() and not (self.root / tree_path).is_symlink():
            return f"{tree_path} is a folder"
        return None

    def read_bytes(self, tree_path: str) -> bytes | None:
        """The file's bytes, changes included (``None``: absent, or behind a link)."""
        if tree_path in self.changes:
            return self.changes[tree_path]
        if self.link_on(tree_path) is not None:
            return None  # never read through a link (the patch stage refuses such paths)
        file = self.root / tree_path
        return file.read_bytes() if file.is_file() else None

    def read(self, tree_path: str) -> str | None:
        """:meth:`read_bytes` as text (undecodable bytes kept as surrogates)."""
        data = self.read_bytes(tree_path)
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def mode(self, tree_path: str) -> int | None:
        """The file's permission bits, staged ones included (``None``: no such file)."""
        if tree_path in self.modes:
            return self.modes[tree_path]
        file = self.root / tree_path
        if self.link_on(tree_path) is not None or not file.is_file():
            return None
        return file.stat().st_mode & 0o777

    def read_repo_path(self, repo_path: str) -> str | None:
        """:meth:`read` by repository path (``None`` also outside the layout)."""
        tree_path = self.tree_path(repo_path)
        return None if tree_path is None else self.read(tree_path)

    def glob_repo_paths(self, pattern: str) -> list[str]:
        """Existing repository paths matching an ``fnmatch`` pattern (changes included)."""
        root = pattern_root(pattern)
        tree_root = self.tree_path(root + "/") if root else ""
        found: set[str] = set()
        if tree_root is not None:
            base = self.root / tree_root
            if base.is_dir():
                for path in base.rglob("*"):
                    if ".git" in path.parts or not path.is_file():
                        continue
                    rel = path.relative_to(self.root).as_posix()
                    if self.link_on(rel) is not None:
                        continue
                    repo = self.layout.repo_path(rel)
                    if fnmatch.fnmatchcase(repo, pattern):
                        found.add(repo)
        for tree_path, data in self.changes.items():
            repo = self.layout.repo_path(tree_path)
            if fnmatch.fnmatchcase(repo, pattern):
                if data is None:
                    found.discard(repo)
                else:
                    found.add(repo)
        return sorted(found)

    def files_named(self, name: str, limit: int = 20) -> list[str]:
        """Tree paths of existing files called ``name`` (for "moved elsewhere?" hints)."""
        found = [p for p, data in self.changes.items() if data is not None
                 and p.rsplit("/", 1)[-1] == name]
        for path in self.root.rglob(name):
            rel = path.relative_to(self.root).as_posix()
            if ".git" not in path.parts and rel not in self.changes and path.is_file() \
                    and self.link_on(rel) is None:
                found.append(rel)
            if len(found) >= limit:
                break
        return sorted(found)


@dataclass
class StagedFile:
    """One file patch decided: its report and, when it applies, what to stage.

    Attributes:
        report: the file's report (its status says whether it applied).
        staged: tree path -> new bytes (``None`` deletes); empty unless it applied.
        modes: tree path -> permission bits of the staged files.
    """

    report: FileReport
    staged: dict[str, bytes | None] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)


def _encode(lines: list[str]) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape")


def _eol(lines: list[str]) -> str:
    crlf = sum(1 for line in lines if line.endswith("\r\n"))
    lf = sum(1 for line in lines if line.endswith("\n")) - crlf
    return "crlf" if crlf > lf else "lf" if lf else "none"


def _without_cr(lines: list[str]) -> list[str]:
    return [line[:-2] + "\n" if line.endswith("\r\n") else line for line in lines]


def _eol_mismatch(lines: list[str], hunks: tuple[Hunk, ...],
                  results: list[HunkResult], search: int) -> list[HunkResult]:
    """Mark failed hunks that would apply if only line endings were equal."""
    file_eol = _eol(lines)
    patch_eol = _eol([text for h in hunks for _, text in h.lines])
    if HunkStatus.FAILED not in {r.status for r in results} or "none" in (file_eol, patch_eol) \
            or file_eol == patch_eol:
        return results
    plain = [Hunk(h.index, h.source_start, h.source_length, h.target_start, h.target_length,
                  tuple((k, t[:-2] + "\n" if t.endswith("\r\n") else t) for k, t in h.lines),
                  h.section) for h in hunks]
    normalised = apply_file_hunks(_without_cr(lines), plain, fuzz_search=search)
    marked = []
    for result, trial in zip(results, normalised.results, strict=True):
        if result.status == HunkStatus.FAILED and trial.status in APPLIED_STATUSES:
            result = HunkResult(result.hunk, HunkStatus.FAILED, line=trial.line,
                                text=result.text,
                                note=f"the file has {file_eol.upper()} line endings and the "
                                     f"patch {patch_eol.upper()}; not converting",
                                decided_by=FileStatus.EOL_MISMATCH)
        marked.append(result)
    return marked


def _apply_hunks(view: TreeView, file_patch: FilePatch, current: str, max_fuzz: int
                 ) -> tuple[list[HunkResult], list[str] | None, bool]:
    """Apply the hunks with the fuzz policy: (results, new lines or None, all already)."""
    lines = split_lines(current)
    search = max(DEFAULT_FUZZ_SEARCH, max_fuzz)
    outcome = apply_file_hunks(lines, file_patch.hunks, fuzz_search=search)
    results = list(outcome.results)
    for i, (result, hunk) in enumerate(zip(results, file_patch.hunks, strict=True)):
        if result.status == HunkStatus.FUZZ and (result.fuzz or 0) > max_fuzz:
            anchored = anchor_note(lines, hunk)
            results[i] = HunkResult(
                result.hunk, HunkStatus.FAILED, line=result.line, offset=result.offset,
                fuzz=result.fuzz, changed_line=result.changed_line,
                note=f"needs fuzz {result.fuzz}, the series allows {max_fuzz} here"
                     + (f"; at fuzz 0 {anchored}" if anchored else ""))
        elif result.status in APPLIED_STATUSES and not hunk.prefix_context and \
                not hunk.suffix_context and len(lines) > len(hunk.preimage):
            results[i] = replace(result, note=ZERO_CONTEXT_WARNING)
    results = _eol_mismatch(lines, file_patch.hunks, results, search)
    ok = all(r.status in APPLIED_STATUSES for r in results)
    return results, (outcome.new_lines if ok else None), outcome.already_applied


def _moved_hint(view: TreeView, file_patch: FilePatch, max_fuzz: int) -> str:
    assert file_patch.old_path is not None
    name = file_patch.old_path.rsplit("/", 1)[-1]
    for candidate in view.files_named(name):
        text = view.read(candidate)
        if text is not None and file_patch.hunks and \
                _apply_hunks(view, file_patch, text, max_fuzz)[1] is not None:
            return f"; a file with matching content is at {candidate} (moved?)"
    return ""


def _resolve_plain_names(view: TreeView, file_patch: FilePatch) -> FilePatch:
    """The one file a plain (non-git) diff that names two files patches.

    ``--- a/x.py.orig`` / ``+++ b/x.py`` means one file, not a rename. Like GNU patch 2.7
    (and ``git apply``, which agree on this), take the name that exists; when both do,
    the one with the fewest components, then the shortest base name, then the shortest.
    """
    old, new = file_patch.old_path, file_patch.new_path
    if file_patch.git or file_patch.operation != Operation.MODIFY or old == new or \
            old is None or new is None:
        return file_patch
    existing = [p for p in (old, new) if (t := view.tree_path(p)) is not None
                and view.read(t) is not None]
    chosen = min(existing or [old, new], key=lambda p: (p.count("/"), len(p.rsplit("/", 1)[-1]),
                                                   len(p)))
    return replace(file_patch, old_path=chosen, new_path=chosen)


@dataclass(frozen=True)
class _Paths:
    """One file patch with its tree paths resolved and its operation decided.

    Attributes:
        patch: the file patch (plain names resolved).
        old: the tree path of its old side (``None``: it has none).
        new: the tree path of its new side (``None``: it has none).
        op: the operation (a modify of a missing file with an empty old side creates it).
    """

    patch: FilePatch
    old: str | None
    new: str | None
    op: Operation

    @property
    def repo_path(self) -> str:
        """The repository path the report names."""
        return self.patch.path

    @property
    def hunks(self) -> tuple[Hunk, ...]:
        """The file patch's hunks."""
        return self.patch.hunks


def _report(paths: _Paths, status: FileStatus, hunks: tuple[HunkResult, ...] = (),
            note: str = "", staged: dict[str, bytes | None] | None = None,
            modes: dict[str, int] | None = None) -> StagedFile:
    """The decided file: its report and what it stages (nothing unless it applies)."""
    return StagedFile(FileReport(paths.repo_path, status, hunks, note), staged or {},
                      modes or {})


def _refuse(paths: _Paths, status: FileStatus, note: str) -> StagedFile:
    """A refusal: every hunk decided by the file (a plain hunk "failed" when the refusal
    is a plain failure)."""
    decided_by = None if status == FileStatus.FAILED else status
    results = tuple(HunkResult(h.index, HunkStatus.FAILED, note=note, decided_by=decided_by)
                    for h in paths.hunks)
    return _report(paths, status, results, note)


def _resolve(view: TreeView, patch_name: str, file_patch: FilePatch, strip: int) -> _Paths:
    """The file patch's tree paths and operation.

    Raises:
        PatchError: a path is outside the tree's layout.
    """
    file_patch = _resolve_plain_names(view, file_patch)
    old = view.tree_path(file_patch.old_path) if file_patch.old_path else None
    new = view.tree_path(file_patch.new_path) if file_patch.new_path else None
    if (file_patch.old_path and old is None) or (file_patch.new_path and new is None):
        raise PatchError(f"{patch_name}: {file_patch.path} (after stripping {strip} leading "
                         f"path components) is not in the {view.layout.kind} layout, "
                         "which holds only python/",
                         "check the strip level, or build from git (--source git) for "
                         "files outside python/")
    op = file_patch.operation
    hunks = file_patch.hunks
    if op == Operation.MODIFY and old is not None and view.read(old) is None and \
            len(hunks) == 1 and hunks[0].source_start == hunks[0].source_length == 0:
        op = Operation.CREATE  # an empty old side on a missing file: GNU and git create it
    return _Paths(file_patch, old, new, op)


def _refusal(view: TreeView, paths: _Paths) -> tuple[FileStatus, str] | None:
    """Why the file is refused before any hunk is tried (a link, a binary diff, a folder
    in the way), as ``(status, note)``; ``None`` when nothing stands in the way."""
    file_patch, old, new = paths.patch, paths.old, paths.new
    for tree_path in dict.fromkeys(p for p in (old, new) if p is not None):
        link = view.link_on(tree_path)
        if link is not None:
            return FileStatus.SYMLINK, (f"{link} is a symbolic link: a patch never reads or "
                                        "writes through one (it could lead out of the tree); "
                                        "patch the file it points to under its own path")
    if file_patch.symlink:
        return FileStatus.SYMLINK, ("the patch creates, deletes or retargets a symbolic link "
                                    "(git mode 120000); the builder never writes links: make "
                                    "the link in the build instead")
    if file_patch.binary:
        return FileStatus.BINARY, ("binary diffs (GIT binary patch) are not supported; ship "
                                   "the file another way")
    if old is not None and old not in view.changes and (view.root / old).is_dir():
        return FileStatus.FAILED, f"{file_patch.old_path} is a folder, not a file"
    if new is not None and (obstacle := view.obstacle(new)) is not None:
        return FileStatus.FAILED, f"cannot write {file_patch.new_path}: {obstacle}"
    return None


def _create(view: TreeView, paths: _Paths) -> StagedFile:
    """A new file: staged, or refused (or already applied) when the file exists."""
    assert paths.new is not None
    existing = view.read(paths.new)
    content = "".join(t for h in paths.hunks for t in h.postimage)
    if existing is not None:
        same = existing == content
        note = ("the file to create already exists with identical content"
                if same else "the file to create already exists with different content")
        refused = tuple(HunkResult(h.index, HunkStatus.FAILED, note=note,
                                   decided_by=FileStatus.NEW_FILE_EXISTS) for h in paths.hunks)
        return _report(paths, FileStatus.ALREADY_APPLIED if same else
                       FileStatus.NEW_FILE_EXISTS, refused, note)
    created = tuple(HunkResult(h.index, HunkStatus.CLEAN, line=1, offset=0, fuzz=0,
                               changed_line=1) for h in paths.hunks)
    return _report(paths, FileStatus.CREATED, created,
                   staged={paths.new: content.encode("utf-8", "surrogateescape")},
                   modes={paths.new: paths.patch.new_mode or 0o644})


def _source_missing(view: TreeView, paths: _Paths, max_fuzz: int) -> StagedFile:
    """The file to change is absent: a delete or rename already done, or missing."""
    file_patch, op, new = paths.patch, paths.op, paths.new
    if op == Operation.DELETE:
        note = "the file to delete is already absent"
        return _report(paths, FileStatus.ALREADY_APPLIED, tuple(
            HunkResult(h.index, HunkStatus.ALREADY_APPLIED, note=note) for h in paths.hunks),
            note)
    moved_to = view.read(new) if op == Operation.RENAME and new else None
    if moved_to is not None:  # renamed already? then the hunks are in the new file
        results, _, already = _apply_hunks(view, file_patch, moved_to, max_fuzz)
        if already or not paths.hunks:
            return _report(paths, FileStatus.ALREADY_APPLIED, tuple(results),
                           "already renamed")
    note = f"{file_patch.old_path} does not exist" + _moved_hint(view, file_patch, max_fuzz)
    return _refuse(paths, FileStatus.MISSING_FILE, note)


def _not_applied(paths: _Paths, results: tuple[HunkResult, ...], already: bool
                 ) -> StagedFile:
    """Some hunk did not apply: already applied as a whole, partly, or failed."""
    if already:
        return _report(paths, FileStatus.ALREADY_APPLIED, results)
    statuses = {r.status for r in results}
    if HunkStatus.ALREADY_APPLIED in statuses and statuses <= {
            HunkStatus.ALREADY_APPLIED, *APPLIED_STATUSES}:
        note = "some hunks are already applied and others are not"
    else:
        note = "; ".join(f"hunk #{r.hunk}: {r.label}" + (f" ({r.note})" if r.note else "")
                         for r in results if r.status not in APPLIED_STATUSES)
    eol = any(r.decided_by == FileStatus.EOL_MISMATCH for r in results)
    return _report(paths, FileStatus.EOL_MISMATCH if eol else FileStatus.FAILED, results, note)


def _delete(paths: _Paths, results: tuple[HunkResult, ...], new_lines: list[str]
            ) -> StagedFile:
    """A delete whose hunks applied: staged when nothing of the file is left."""
    assert paths.old is not None
    if new_lines:
        note = "the file's content differs from what the patch deletes; not deleting it"
        return _report(paths, FileStatus.FAILED, results, note)
    return _report(paths, FileStatus.DELETED, results, staged={paths.old: None})


def _mode_only(paths: _Paths, data: bytes, mode: int | None, new_mode: int | None
               ) -> StagedFile:
    """A modify without hunks: a change of permissions only."""
    assert paths.old is not None
    if new_mode == mode:
        return _report(paths, FileStatus.ALREADY_APPLIED, (), f"mode is already {new_mode:o}")
    return _report(paths, FileStatus.MODE, (), f"mode {mode:o} -> {new_mode:o}",
                   staged={paths.old: data}, modes={paths.old: new_mode or 0o644})


def _write(view: TreeView, paths: _Paths, results: tuple[HunkResult, ...], data: bytes,
           new_mode: int | None, preimage: TreeView | None) -> StagedFile:
    """A modify, rename or copy whose hunks applied: the new file (and a rename's removed
    source) staged."""
    old, new, op = paths.old, paths.new, paths.op
    assert old is not None and new is not None
    staged: dict[str, bytes | None] = {new: data}
    # A rename removes its source, unless an earlier file of this patch wrote that file:
    # then both oracles keep what that file patch wrote (git apply removes every old
    # path before it writes any new one, write_out_results in apply.c, git 2.x).
    written_here = preimage is not None and view.changes.get(old) is not None and (
        old not in preimage.changes or preimage.changes[old] != view.changes[old])
    if op == Operation.RENAME and new != old and not written_here:
        staged[old] = None
    status = {Operation.RENAME: FileStatus.RENAMED,
              Operation.COPY: FileStatus.COPIED}.get(op, FileStatus.PATCHED)
    return _report(paths, status, results, staged=staged, modes={new: new_mode or 0o644})


def apply_file(view: TreeView, patch_name: str, file_patch: FilePatch,
               max_fuzz: int, strip: int, preimage: TreeView | None = None) -> StagedFile:
    """Apply one file patch to the view (without changing it); decide its status.

    The steps: resolve the paths, refuse what is never applied (links, binary diffs, a
    folder in the way), create a new file, find the source (a missing one decides the
    file), refuse a rename or copy over an existing file, apply the hunks, then stage a
    delete, a mode change or the new content.

    A git copy or rename reads its source as it was before this patch (``preimage``),
    whatever the patch did to it in an earlier file: ``git diff -C`` writes "modify x"
    before "copy x to z" and means z to be the old x, as ``git apply`` (function
    ``previous_patch`` in ``apply.c``, git 2.x: copies and renames never chain off an
    earlier patch of the same input) and GNU patch 2.7 apply it.

    Args:
        view: the tree with the changes of the series so far.
        patch_name: the patch's file name (for messages).
        file_patch: the file's part of the patch.
        max_fuzz: the fuzz the series allows this patch here.
        strip: the strip level used (for messages).
        preimage: the tree before this patch (``None``: ``view``), where git copies and
            renames read their source.

    Returns:
        The file's report and the changes to stage.

    Raises:
        BuilderError: a path of the file patch is outside the tree's layout.
    """
    paths = _resolve(view, patch_name, file_patch, strip)
    if (refusal := _refusal(view, paths)) is not None:
        return _refuse(paths, *refusal)
    if paths.op == Operation.CREATE:
        return _create(view, paths)
    file_patch, old, new, op = paths.patch, paths.old, paths.new, paths.op
    assert old is not None
    source_view = preimage if preimage is not None and file_patch.git and \
        op in (Operation.RENAME, Operation.COPY) else view
    current = source_view.read(old)
    if current is None:
        return _source_missing(view, paths, max_fuzz)
    if op in (Operation.RENAME, Operation.COPY) and new is not None and new != old and \
            view.read(new) is not None:
        return _refuse(paths, FileStatus.NEW_FILE_EXISTS,
                       f"{file_patch.new_path} already exists; the {op} would overwrite it")
    results, new_lines, already = _apply_hunks(view, file_patch, current, max_fuzz) \
        if paths.hunks else ([], split_lines(current), False)
    if new_lines is None:
        return _not_applied(paths, tuple(results), already)
    if op == Operation.DELETE:
        return _delete(paths, tuple(results), new_lines)
    mode = source_view.mode(old)
    new_mode = file_patch.new_mode if file_patch.new_mode is not None else mode
    if op == Operation.MODIFY and not paths.hunks:
        return _mode_only(paths, _encode(new_lines), mode, new_mode)
    return _write(view, paths, tuple(results), _encode(new_lines), new_mode, preimage)

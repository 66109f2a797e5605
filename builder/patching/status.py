"""The patch stage's status vocabulary: what happened to a file, and to a patch.

:class:`FileStatus` is the one list of what can happen to one file of a patch;
:class:`PatchStatus` is what happened to one patch of a series, and where it depends on
the patch's files it is :func:`patch_status` of their statuses. Hunk-level results are
:class:`builder.patching.hunks.HunkStatus`, the matcher's own vocabulary.

The values are the strings of ``--json`` output and of a wheel's provenance record: a
contract with users, never renamed.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class FileStatus(StrEnum):
    """What happened to one file of a patch (``FileReport.status`` in the report).

    A file's change is staged (``patched`` ... ``mode``), already in the tree
    (``already-applied``), or refused (the rest, see :attr:`refused`). A refusal's value is
    also the status of that file's hunks whose fate a fact about the whole file decided
    (it is missing, binary, a link, has other line endings, or exists already).
    """

    PATCHED = "patched"
    CREATED = "created"
    DELETED = "deleted"
    RENAMED = "renamed"
    COPIED = "copied"
    MODE = "mode"  # permissions only
    ALREADY_APPLIED = "already-applied"
    FAILED = "failed"
    NEW_FILE_EXISTS = "new-file-exists"
    MISSING_FILE = "missing-file"
    EOL_MISMATCH = "eol-mismatch"
    BINARY = "binary"
    SYMLINK = "symlink"

    @property
    def refused(self) -> bool:
        """True when the file was refused: its patch fails and nothing is written."""
        return self not in _NOT_REFUSED


_NOT_REFUSED = frozenset({FileStatus.PATCHED, FileStatus.CREATED, FileStatus.DELETED,
                          FileStatus.RENAMED, FileStatus.COPIED, FileStatus.MODE,
                          FileStatus.ALREADY_APPLIED})


class PatchStatus(StrEnum):
    """What happened to one patch of the series.

    ``applied``, ``already-applied`` and ``failed`` follow from the patch's files
    (:func:`patch_status`); ``obsolete`` (its intent checks held without it),
    ``not-applicable`` (outside its versions) and ``not-reached`` (after a failure) are
    decided by the series.
    """

    APPLIED = "applied"
    ALREADY_APPLIED = "already-applied"
    FAILED = "failed"
    OBSOLETE = "obsolete"
    NOT_APPLICABLE = "not-applicable"
    NOT_REACHED = "not-reached"


PARTLY_APPLIED = "part of the patch is already applied and part is not"


def patch_status(files: Iterable[FileStatus]) -> PatchStatus:
    """The status of a patch from its files' statuses.

    Args:
        files: the status of each file of the patch.

    Returns:
        ``failed`` when a file was refused or when some files are already applied and
        others are not (:data:`PARTLY_APPLIED`); ``already-applied`` when every file is;
        else ``applied``.
    """
    statuses = set(files)
    already = statuses == {FileStatus.ALREADY_APPLIED}
    if any(s.refused for s in statuses) or (
            FileStatus.ALREADY_APPLIED in statuses and not already):
        return PatchStatus.FAILED
    return PatchStatus.ALREADY_APPLIED if already else PatchStatus.APPLIED

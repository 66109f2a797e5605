"""Reading patch files: unified diffs, plain or ``git format-patch``, at a fixed strip level.

unidiff parses the diff body. Two things it does not do are done here:

* the commit message of a ``git format-patch`` mail ends at the first line that is
  exactly ``---`` (as ``git am`` reads it), so a diff quoted in the message is part of the
  header and is never applied (unidiff alone would apply it);
* git's extended headers (``new file mode``, ``deleted file mode``, ``old mode`` /
  ``new mode``, ``rename from/to``, ``copy from/to``, ``GIT binary patch``) are read from
  each file's header lines, so copies are not mistaken for renames and mode changes are
  kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from builder.core.cache import sha256_file
from builder.core.errors import BuilderError
from builder.patching.hunks import Hunk


class Operation(StrEnum):
    """What a file patch does to its file."""

    MODIFY = "modify"
    CREATE = "create"
    DELETE = "delete"
    RENAME = "rename"
    COPY = "copy"


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a patch.

    Attributes:
        operation: see :class:`Operation`.
        old_path: repository path before (``None`` when the patch creates the file).
        new_path: repository path after (``None`` when the patch deletes the file).
        hunks: the hunks in order (none for a pure rename, copy or mode change).
        new_mode: permission bits the file gets (from ``new mode`` / ``new file mode``).
        binary: the patch carries a binary diff for this file.
    """

    operation: Operation
    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    new_mode: int | None = None
    binary: bool = False

    @property
    def path(self) -> str:
        """The path reports name: the new path, or the old one for a deletion."""
        return self.new_path or self.old_path or "?"


@dataclass(frozen=True)
class ParsedPatch:
    """A patch file parsed at a fixed strip level.

    Attributes:
        path: the file.
        sha256: its hex sha256.
        header: everything before the diff (message, authorship), kept verbatim.
        files: the file patches in order.
    """

    path: Path
    sha256: str
    header: str
    files: tuple[FilePatch, ...]


def _is_mail(lines: list[str]) -> bool:
    first = lines[0] if lines else ""
    return first.startswith(("From ", "From:", "Subject:", "Date:"))


def split_header(text: str) -> tuple[str, str]:
    """Split a patch into (header, diff body).

    A ``git format-patch`` mail's header ends at its first line that is exactly ``---``
    (the rule ``git am`` uses); otherwise it ends before the first ``diff --git`` line or
    the first ``--- `` line followed by ``+++ ``.
    """
    lines = text.splitlines(keepends=True)
    if _is_mail(lines):
        for index, line in enumerate(lines):
            if line.rstrip("\r\n") == "---":
                return "".join(lines[:index + 1]), "".join(lines[index + 1:])
    for index, line in enumerate(lines):
        if line.startswith("diff --git ") or (
                line.startswith("--- ") and index + 1 < len(lines)
                and lines[index + 1].startswith("+++ ")):
            return "".join(lines[:index]), "".join(lines[index:])
    return text, ""


def _strip(name: str, strip: int, patch: Path) -> str | None:
    if name == "/dev/null":
        return None
    if name.startswith("/") and strip == 0:
        raise BuilderError(f"{patch.name}: absolute path {name!r}", "refusing to write there")
    parts = [p for p in name.split("/") if p]
    if len(parts) <= strip:
        raise BuilderError(f"{patch.name}: path {name!r} has no component left after "
                           f"stripping {strip}", "check the series' strip level for it")
    rest = parts[strip:]
    if ".." in rest:
        raise BuilderError(f"{patch.name}: unsafe path {name!r}", "refusing to write there")
    return "/".join(rest)


def _git_headers(info: str) -> dict[str, str]:
    """The extended header lines of the last ``diff --git`` section in ``info``."""
    lines = info.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("diff --git ")]
    headers: dict[str, str] = {}
    if not starts:
        return headers
    for line in lines[starts[-1] + 1:]:
        for key in ("old mode ", "new mode ", "deleted file mode ", "new file mode ",
                    "rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(key):
                headers[key.strip()] = line[len(key):].strip()
        if line.startswith(("GIT binary patch", "Binary files ")):
            headers["binary"] = line
    return headers


def _hunks(patched: Any) -> tuple[Hunk, ...]:
    hunks = []
    for number, hunk in enumerate(patched, 1):
        lines: list[tuple[str, str]] = []
        for line in hunk:
            if line.line_type == "\\":  # "\ No newline at end of file" ends the line before
                if lines:
                    kind, value = lines[-1]
                    lines[-1] = (kind, value.removesuffix("\n"))
                continue
            lines.append((line.line_type, line.value))
        section = hunk.section_header
        hunks.append(Hunk(number, hunk.source_start, hunk.source_length, hunk.target_start,
                          hunk.target_length, tuple(lines), " " + section if section else ""))
    return tuple(hunks)


def parse_patch(path: Path, strip: int) -> ParsedPatch:
    """Parse a unified diff (plain or ``git format-patch``) at a fixed strip level.

    Args:
        path: the patch file.
        strip: leading path components to remove (``-p``), e.g. 1 for ``a/`` ``b/``.

    Returns:
        The header and the file patches.

    Raises:
        BuilderError: the file is missing, unreadable or empty, holds no diff, is
            malformed, or names a path that is unsafe or too short for ``strip``.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BuilderError(f"patch file not found: {path}",
                           "check the series file's 'file' entries") from None
    except OSError as exc:
        raise BuilderError(f"cannot read patch file {path}: {exc.strerror}",
                           "check its permissions") from None
    if not data.strip():
        raise BuilderError(f"{path.name} is empty", "an empty or truncated patch file; "
                           "regenerate it, or drop it from the series")
    header, body = split_header(data.decode("utf-8", "surrogateescape"))
    try:
        patch_set = PatchSet(body)
    except UnidiffParseError as exc:
        raise BuilderError(f"{path.name} is not a valid unified diff: {exc}",
                           "regenerate it with git diff or git format-patch") from None
    if not len(patch_set):
        raise BuilderError(f"{path.name} contains no diff",
                           "an empty or truncated patch file; regenerate it")
    files = []
    for patched in patch_set:
        git = _git_headers(str(patched.patch_info or ""))
        old = _strip(patched.source_file, strip, path)
        new = _strip(patched.target_file, strip, path)
        if "new file mode" in git:
            old, operation = None, Operation.CREATE
        elif "deleted file mode" in git:
            new, operation = None, Operation.DELETE
        elif old is None:
            operation = Operation.CREATE
        elif new is None:
            operation = Operation.DELETE
        elif "copy from" in git:
            operation = Operation.COPY
        elif old != new or "rename from" in git:
            operation = Operation.RENAME
        else:
            operation = Operation.MODIFY
        mode = git.get("new mode") or git.get("new file mode")
        files.append(FilePatch(operation, old, new, _hunks(patched),
                               new_mode=int(mode, 8) & 0o777 if mode else None,
                               binary="binary" in git or bool(patched.is_binary_file)))
    return ParsedPatch(path=path, sha256=sha256_file(path), header=header, files=tuple(files))

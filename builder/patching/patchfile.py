"""Reading patch files: unified diffs as git, GNU diff and svn write them, at a fixed strip
level.

What is read (``docs/patch-forms.md`` lists every form and what the builder does with it):

* the commit message of a ``git format-patch`` mail ends at the first line that is
  exactly ``---`` (as ``git am`` reads it), so a diff quoted in the message is part of the
  header and is never applied;
* paths as git writes them: C-quoted (``"a/na\\303\\257ve.py"``) wherever a path appears,
  a tab after a name on ``---``/``+++`` lines (git adds one after a name with a space);
* git's extended headers (``new file mode``, ``deleted file mode``, ``old mode`` /
  ``new mode``, ``rename from/to``, ``copy from/to``, ``GIT binary patch``);
* creations and deletions in every standard form: ``/dev/null``, git's file modes,
  ``diff -N``'s Unix-epoch timestamp on the absent side, svn's ``(nonexistent)``;
* hunks by their line counts (so a removed line that starts with ``--`` is a line, not a
  header). Lines outside any file's diff are ignored, as GNU patch ignores them.

A UTF-16 or UTF-32 patch file (as PowerShell's ``>`` writes) is refused by name.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

from builder.core.errors import BuilderError, ConfigurationError, PatchError
from builder.patching.hunks import Hunk, split_lines


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
        git: the file's diff has a ``diff --git`` line (git's rules for names apply).
        old_mode: git's full mode before (``old mode`` / ``deleted file mode``), if given.
        new_file_mode: git's full mode after (``new mode`` / ``new file mode``), if given:
            ``0o100644``, ``0o100755`` or ``0o120000`` (a symbolic link).
    """

    operation: Operation
    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    new_mode: int | None = None
    binary: bool = False
    git: bool = False
    old_mode: int | None = None
    new_file_mode: int | None = None

    @property
    def path(self) -> str:
        """The path reports name: the new path, or the old one for a deletion."""
        return self.new_path or self.old_path or "?"

    @property
    def symlink(self) -> bool:
        """True when either side is a symbolic link (git's mode ``120000``)."""
        return any(m is not None and m & 0o170000 == 0o120000
                   for m in (self.old_mode, self.new_file_mode))


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
    lines = split_lines(text)
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


# C-quoting as git writes it (quote.c, quote_c_style with core.quotePath=true): a path
# is quoted when it has a byte below 0x20, DEL, '"', '\' or any byte >= 0x80; the named
# escapes are used where they exist, every other such byte is written as three octal
# digits. A space alone never quotes a path.
_C_ESCAPES = {"a": 0x07, "b": 0x08, "t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D,
              '"': 0x22, "\\": 0x5C}
_C_NAMES = {value: key for key, value in _C_ESCAPES.items()}


def needs_quoting(name: str) -> bool:
    """True when git would C-quote ``name`` (see :func:`quote_path`).

    Args:
        name: a path (undecodable bytes as surrogates).
    """
    return any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C)
               for b in name.encode("utf-8", "surrogateescape"))


def quote_path(name: str) -> str:
    """Write ``name`` as git does in a diff: C-quoted when needed, else unchanged.

    Source: git's ``quote_c_style`` (quote.c), with the default ``core.quotePath=true``.

    Args:
        name: a path (undecodable bytes as surrogates).

    Returns:
        The name, or ``"..."`` with git's escapes when git quotes it.
    """
    if not needs_quoting(name):
        return name
    out = []
    for byte in name.encode("utf-8", "surrogateescape"):
        if byte in _C_NAMES:
            out.append("\\" + _C_NAMES[byte])
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    return '"' + "".join(out) + '"'


def unquote_path(text: str) -> tuple[str, str]:
    """Read a C-quoted name at the start of ``text`` (which starts with ``"``).

    Args:
        text: the quoted name and whatever follows it on its line.

    Returns:
        The name (bytes decoded as UTF-8, undecodable bytes kept as surrogates) and the
        text after the closing quote.

    Raises:
        ValueError: an unknown escape, or no closing quote.
    """
    out = bytearray()
    i = 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return out.decode("utf-8", "surrogateescape"), text[i + 1:]
        if char == "\\":
            escape = text[i + 1:i + 2]
            if escape in _C_ESCAPES:
                out.append(_C_ESCAPES[escape])
                i += 2
                continue
            octal = re.match(r"[0-3][0-7]{2}", text[i + 1:i + 4])
            if octal is None:
                raise ValueError(f"unknown escape \\{escape} in {text!r}")
            out.append(int(octal[0], 8))
            i += 4
            continue
        out += char.encode("utf-8", "surrogateescape")
        i += 1
    raise ValueError(f"no closing quote in {text!r}")


# The timestamp on a ---/+++ line that marks a side as absent: diff -N writes the Unix
# epoch (in its local zone, with or without nanoseconds and zone); svn writes
# "(nonexistent)" (older svn: "(revision 0)"). GNU patch 2.7 reads both (pch.c).
_ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?(?: ?([+-]\d\d):?(\d\d))?")
_TRADITIONAL_STAMP = re.compile(r"\w{3} (\w{3}) +(\d+) (\d\d:\d\d:\d\d)(?:\.\d+)? "
                                r"(?:([+-]\d\d)(\d\d) )?(\d{4})")
_SVN_ABSENT = re.compile(r"\((?:nonexistent|revision 0)\)")


def _is_absent_stamp(stamp: str) -> bool:
    stamp = stamp.strip()
    if _SVN_ABSENT.fullmatch(stamp):
        return True
    iso = _ISO_STAMP.fullmatch(stamp)
    traditional = _TRADITIONAL_STAMP.fullmatch(stamp) if iso is None else None
    try:
        if iso:
            when = datetime.strptime(iso[1], "%Y-%m-%d %H:%M:%S")
            hours, minutes = iso[2], iso[3]
        elif traditional:
            when = datetime.strptime(f"{traditional[6]} {traditional[1]} {traditional[2]} "
                                     f"{traditional[3]}", "%Y %b %d %H:%M:%S")
            hours, minutes = traditional[4], traditional[5]
        else:
            return False
    except ValueError:
        return False
    if hours:
        sign = -1 if hours.startswith("-") else 1
        when -= sign * timedelta(hours=abs(int(hours)), minutes=int(minutes))
    return when == datetime(1970, 1, 1)


_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")
_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\S*(?: [+-]\d{4})?"
                    r"|\((?:nonexistent|revision \d+|working copy)\)"
                    r"|\w{3} \w{3} +\d+ \d\d:\d\d:\d\d(?:\.\d+)? (?:[+-]\d{4} )?\d{4}")
_NAMED_STAMP = re.compile(r"(.*?)\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\S*(?: [+-]\d{4})?"
                          r"|\((?:nonexistent|revision \d+|working copy)\))")
_GIT_KEYS = ("old mode ", "new mode ", "deleted file mode ", "new file mode ",
             "rename from ", "rename to ", "copy from ", "copy to ", "similarity index ",
             "dissimilarity index ", "index ")


def _name_and_stamp(rest: str) -> tuple[str, str]:
    """The name and the timestamp of a ``---``/``+++`` line (after the marker)."""
    rest = rest.rstrip("\r\n")
    if rest.startswith('"'):
        name, tail = unquote_path(rest)
        return name, tail.strip()
    if "\t" in rest:  # diff, git and svn all end the name with a tab when more follows
        name, stamp = rest.rsplit("\t", 1)
        if stamp.strip() and not _STAMP.fullmatch(stamp.strip()):
            name, stamp = rest.split("\t", 1)  # not a stamp after the last tab
        return name, stamp.strip()
    named = _NAMED_STAMP.fullmatch(rest)
    if named:
        return named[1], named[2]
    return rest.rstrip(), ""


def _git_names(line: str) -> tuple[str | None, str | None]:
    """The two names of a ``diff --git`` line; ``(None, None)`` where they are ambiguous.

    Unquoted names with spaces are split where both halves name the same file after
    their first component (git's rule when no other header says more).
    """
    rest = line[len("diff --git "):].rstrip("\r\n")
    if rest.startswith('"'):
        first, tail = unquote_path(rest)
        tail = tail.lstrip(" ")
        second = unquote_path(tail)[0] if tail.startswith('"') else tail
        return first, second
    if rest.endswith('"') and ' "' in rest:
        cut = rest.index(' "')
        return rest[:cut], unquote_path(rest[cut + 1:])[0]
    spaces = [i for i, char in enumerate(rest) if char == " "]
    for cut in spaces:
        first, second = rest[:cut], rest[cut + 1:]
        if first.split("/", 1)[-1] == second.split("/", 1)[-1]:
            return first, second
    return None, None


def _strip(name: str, strip: int, patch: Path) -> str:
    """``name`` with ``strip`` leading components removed, as GNU patch's ``-p`` does.

    A leading ``/`` counts as a component (``-p1`` turns ``/etc/x`` into ``etc/x``) and a
    run of slashes is one separator.

    Raises:
        BuilderError: an absolute path at strip 0, a path with no component left, or a
            ``..`` component.
    """
    if name.startswith("/") and strip == 0:
        raise PatchError(f"{patch.name}: absolute path {name!r}", "refusing to write there")
    rest = name
    for _ in range(strip):
        cut = rest.find("/")
        if cut < 0:
            raise PatchError(f"{patch.name}: path {name!r} has no component left after "
                             f"stripping {strip}", "check the series' strip level for it")
        rest = rest[cut:].lstrip("/")
    parts = [p for p in rest.split("/") if p and p != "."]
    if not parts:
        raise PatchError(f"{patch.name}: path {name!r} has no component left after "
                         f"stripping {strip}", "check the series' strip level for it")
    if ".." in parts:
        raise PatchError(f"{patch.name}: unsafe path {name!r} (a '..' component)",
                         "refusing to write outside the tree")
    if any(part.lower() == ".git" for part in parts):  # hooks there would run code
        raise PatchError(f"{patch.name}: unsafe path {name!r} (inside .git)",
                         "a patch changes source files, never the repository itself")
    return "/".join(parts)


@dataclass
class _Section:
    """One file's part of the diff body, as read (names not yet stripped)."""

    line: int
    git: bool = False
    git_names: tuple[str | None, str | None] = (None, None)
    minus: tuple[str, str] | None = None  # (name, timestamp)
    plus: tuple[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hunks: list[Hunk] = field(default_factory=list)


def _malformed(patch: Path, line: int, why: str) -> BuilderError:
    return PatchError(f"{patch.name} is not a valid unified diff: line {line}: {why}",
                      "regenerate it with git diff or git format-patch")


def _read_hunk(lines: list[str], at: int, number: int, offset: int, patch: Path
               ) -> tuple[Hunk, int]:
    """Read the hunk whose ``@@`` line is ``lines[at]``; return it and the next index."""
    header = lines[at].rstrip("\r\n")
    match = _HUNK_HEADER.fullmatch(header)
    if match is None:
        raise _malformed(patch, offset + at + 1, f"bad hunk header {header!r}")
    old_start, new_start = int(match[1]), int(match[3])
    old_length = int(match[2]) if match[2] is not None else 1
    new_length = int(match[4]) if match[4] is not None else 1
    old_left, new_left = old_length, new_length
    body: list[tuple[str, str]] = []
    index = at + 1
    while old_left > 0 or new_left > 0:
        if index >= len(lines):
            raise _malformed(patch, offset + index, f"hunk #{number} is truncated "
                             f"({old_left} old and {new_left} new lines missing)")
        line = lines[index]
        kind = line[:1]
        if kind == "\\":
            if body:
                body[-1] = (body[-1][0], body[-1][1].removesuffix("\n"))
            index += 1
            continue
        if line in ("\n", "\r\n"):  # an empty context line whose space was trimmed
            kind, line = " ", " " + line
        if kind not in (" ", "-", "+"):
            raise _malformed(patch, offset + index + 1, f"hunk #{number} ends early: "
                             f"{line.rstrip()!r} is not a context, '-' or '+' line "
                             f"({old_left} old and {new_left} new lines missing)")
        if kind in (" ", "-"):
            old_left -= 1
        if kind in (" ", "+"):
            new_left -= 1
        if old_left < 0 or new_left < 0:
            raise _malformed(patch, offset + index + 1,
                             f"hunk #{number} has more lines than its header says")
        body.append((kind, line[1:]))
        index += 1
    if index < len(lines) and lines[index].startswith("\\"):
        if body:
            body[-1] = (body[-1][0], body[-1][1].removesuffix("\n"))
        index += 1
    if not any(kind in "-+" for kind, _ in body):
        # GNU patch 2.7 ("malformed patch") and git apply ("corrupt patch") refuse it too.
        raise _malformed(patch, offset + at + 1, f"hunk #{number} changes nothing (no '-' "
                         "or '+' line)")
    section = match[5].strip()
    return Hunk(number, old_start, old_length, new_start, new_length, tuple(body),
                " " + section if section else ""), index


def _sections(body: str, offset: int, patch: Path) -> list[_Section]:
    """Split the diff body into file sections; lines outside them are ignored (as GNU
    patch ignores "garbage": ``Index:`` lines, ``diff -ruN`` lines, mail signatures)."""
    lines = split_lines(body)
    sections: list[_Section] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("diff --git "):
            try:
                git_names = _git_names(line)
            except ValueError as exc:
                raise _malformed(patch, offset + index + 1, str(exc)) from None
            section = _Section(offset + index + 1, git=True, git_names=git_names)
            index += 1
            while index < len(lines):
                text = lines[index].rstrip("\r\n")
                if text.startswith(("GIT binary patch", "Binary files ")):
                    section.headers["binary"] = text
                    index += 1
                    while index < len(lines) and not lines[index].startswith("diff --git "):
                        index += 1
                    break
                key = next((k for k in _GIT_KEYS if text.startswith(k)), None)
                if key is None:
                    break
                section.headers[key.strip()] = text[len(key):]
                index += 1
            sections.append(section)
            if "binary" in section.headers:
                continue
        elif line.startswith("--- ") and index + 1 < len(lines) and \
                lines[index + 1].startswith("+++ "):
            section = _Section(offset + index + 1)
            sections.append(section)
        else:
            if _HUNK_HEADER.fullmatch(line.rstrip("\r\n")):
                # GNU patch skips it as garbage: a hunk silently not applied, exit 0.
                raise _malformed(patch, offset + index + 1, "a hunk outside any file's diff "
                                 "(a line between hunks that is not part of one?)")
            if line.startswith("*** ") and index + 1 < len(lines) and \
                    lines[index + 1].startswith("--- "):
                raise PatchError(f"{patch.name} is a context diff (diff -c)",
                                 "regenerate it as a unified diff: diff -u, git diff")
            index += 1
            continue
        if index + 1 < len(lines) and lines[index].startswith("--- ") and \
                lines[index + 1].startswith("+++ "):
            try:
                section.minus = _name_and_stamp(lines[index][4:])
                section.plus = _name_and_stamp(lines[index + 1][4:])
            except ValueError as exc:
                raise _malformed(patch, offset + index + 1, str(exc)) from None
            index += 2
        number = 0
        while index < len(lines) and lines[index].startswith("@@"):
            number += 1
            hunk, index = _read_hunk(lines, index, number, offset, patch)
            section.hunks.append(hunk)
        if section.git is False and not section.hunks:
            raise _malformed(patch, section.line, "a ---/+++ header without hunks")
    return sections


def _moved_names(section: _Section, patch: Path) -> tuple[str | None, str | None]:
    """The ``rename``/``copy`` ``from`` and ``to`` names, unquoted.

    Raises:
        BuilderError: a quoted name is malformed.
    """
    headers = section.headers
    try:
        moved_from = headers.get("rename from", headers.get("copy from"))
        moved_to = headers.get("rename to", headers.get("copy to"))
        old, new = (None if v is None else unquote_path(v)[0] if v.startswith('"') else v
                    for v in (moved_from, moved_to))
    except ValueError as exc:
        raise _malformed(patch, section.line, str(exc)) from None
    return old, new


def _side(name: str | None, moved: str | None, git: str | None, strip: int,
          patch: Path) -> str | None:
    """One side's path at ``strip``: the ---/+++ name, else the rename or copy line's
    (which carries no a/ b/ prefix: git strips one component less there), else the diff
    --git line's."""
    if name is not None and name != "/dev/null":
        return _strip(name, strip, patch)
    if moved is not None:
        return _strip(moved, max(strip - 1, 0), patch)
    return None if git is None else _strip(git, strip, patch)


def _operation(section: _Section, old: str | None, new: str | None, old_absent: bool,
               new_absent: bool) -> Operation:
    """What the file patch does, from its sides and headers."""
    headers = section.headers
    if old_absent:
        return Operation.CREATE
    if new_absent:
        return Operation.DELETE
    if "copy from" in headers:
        return Operation.COPY
    if "rename from" in headers or (section.git and old != new):
        return Operation.RENAME
    return Operation.MODIFY  # a plain diff naming two files means one file


def _file_patch(section: _Section, strip: int, patch: Path) -> FilePatch:
    """Resolve one section's names, creation/deletion and modes at ``strip``."""
    headers = section.headers
    git_old, git_new = section.git_names
    moved_old, moved_new = _moved_names(section, patch)
    old_absent = "new file mode" in headers
    new_absent = "deleted file mode" in headers
    old_name = new_name = None
    if section.minus is not None and section.plus is not None:
        (old_name, old_stamp), (new_name, new_stamp) = section.minus, section.plus
        old_absent = old_absent or old_name == "/dev/null" or _is_absent_stamp(old_stamp)
        new_absent = new_absent or new_name == "/dev/null" or _is_absent_stamp(new_stamp)
    old = _side(old_name, moved_old, git_old, strip, patch)
    new = _side(new_name, moved_new, git_new, strip, patch)
    if old_absent and new_absent:
        raise _malformed(patch, section.line, "both sides of a file patch are absent")
    if (old is None and not old_absent) or (new is None and not new_absent):
        raise _malformed(patch, section.line, "cannot tell which file the diff --git "
                         "line names (no ---/+++ or rename lines)")
    operation = _operation(section, old, new, old_absent, new_absent)
    if old_absent:
        old = None
    elif new_absent:
        new = None
    modes = {key: int(headers[key], 8) for key in
             ("old mode", "new mode", "new file mode", "deleted file mode")
             if key in headers and re.fullmatch(r"[0-7]{6}", headers[key])}
    new_mode = modes.get("new mode", modes.get("new file mode"))
    old_mode = modes.get("old mode", modes.get("deleted file mode"))
    # Like git, a file gets 0755 when the patch says executable, else 0644: never the
    # setuid, sticky or world-writable bits a crafted mode could ask for.
    return FilePatch(operation, old, new, tuple(section.hunks),
                     new_mode=(0o755 if new_mode & 0o100 else 0o644)
                     if new_mode is not None else None,
                     binary="binary" in headers, git=section.git,
                     old_mode=old_mode, new_file_mode=new_mode)


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
        raise ConfigurationError(f"patch file not found: {path}",
                                 "check the path (--patch, or the series file's 'file' "
                                 "entries)") from None
    except OSError as exc:
        raise PatchError(f"cannot read patch file {path}: {exc.strerror}",
                         "check its permissions") from None
    return parse_patch_bytes(data, path, strip)


def parse_patch_bytes(data: bytes, path: Path, strip: int) -> ParsedPatch:
    """Parse the bytes of a patch (:func:`parse_patch` without the read): for a patch
    checked before it is written (``add-patch``'s stored copy).

    Args:
        data: the patch's bytes.
        path: the file they are, or will be, for messages.
        strip: leading path components to remove.

    Returns:
        The header and the file patches.

    Raises:
        BuilderError: as :func:`parse_patch`, the read aside.
    """
    wide = _wide_encoding(data)
    if wide:
        raise PatchError(f"{path.name} is encoded as {wide}, not UTF-8 or ASCII",
                         f"convert it: iconv -f {wide.split()[0]} -t UTF-8 {path.name} "
                         "> fixed.patch (PowerShell's > writes UTF-16; use git diff "
                         "--output=FILE or Out-File -Encoding utf8)")
    if not data.strip():
        raise PatchError(f"{path.name} is empty", "an empty or truncated patch file; "
                         "regenerate it, or drop it from the series")
    header, body = split_header(data.decode("utf-8", "surrogateescape"))
    offset = header.count("\n")
    files = tuple(_file_patch(section, strip, path)
                  for section in _sections(body, offset, path))
    if not files and re.search(r"(?m)^\*\*\* .*\n--- .*\n\*{15}", header + body):
        raise PatchError(f"{path.name} is a context diff (diff -c)",
                         "regenerate it as a unified diff: diff -u, git diff")
    if not files:
        raise PatchError(f"{path.name} contains no diff",
                         "an empty or truncated patch file; regenerate it")
    return ParsedPatch(path=path, sha256=hashlib.sha256(data).hexdigest(), header=header,
                       files=files)


def _wide_encoding(data: bytes) -> str:
    """Name a UTF-16/UTF-32 encoding of ``data`` (by its byte order mark, or by the zero
    bytes ASCII text has in it); empty for anything else."""
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32LE (with BOM)"),
                      (codecs.BOM_UTF32_BE, "UTF-32BE (with BOM)"),
                      (codecs.BOM_UTF16_LE, "UTF-16LE (with BOM)"),
                      (codecs.BOM_UTF16_BE, "UTF-16BE (with BOM)")):
        if data.startswith(bom):
            return name
    head = data[:400]
    if len(head) >= 8 and head.count(0) * 2 >= len(head):
        if head[1:4] == b"\0\0\0" or head[:3] == b"\0\0\0":
            return "UTF-32LE" if head[0] else "UTF-32BE"
        return "UTF-16LE" if head[0] else "UTF-16BE"
    return ""

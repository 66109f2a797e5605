"""Patches written against any tree, stored in one layout: the git repository's.

A series' patches name files as in SGLang's git repository (``python/sglang/...``). A
patch made inside an unpacked sdist or wheel (``git init`` there, then ``git
format-patch``) names them from the repository's ``python/`` folder instead
(``a/sglang/...``). :func:`detect_layout` tells the two apart from the paths alone, and
:func:`to_repository_layout` rewrites such a patch into the repository layout: only the
path lines of its diff change (``diff --git``, ``---``, ``+++``, ``rename``/``copy``
``from``/``to``); its message, its hunks and every other byte stay.

Which paths mean "sdist": every path is inside the ``sglang`` package or is one of the
files an sdist has at its root (``pyproject.toml``, ``setup.py``, ``MANIFEST.in``,
``PKG-INFO``), and none starts with ``python/``. Anything else (``python/...``,
``sgl-kernel/...``, ``docs/...``) is the repository layout; a patch mixing both is
refused (``--layout`` decides then).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from builder.core.errors import ConfigurationError
from builder.core.layout import PACKAGE_FOLDER
from builder.core.userfiles import read_input, rewrite_user_file
from builder.patching.patchfile import parse_patch_bytes, split_header

PatchLayout = Literal["git", "sdist"]
_SDIST_ROOT_FILES = frozenset({"pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in",
                               "PKG-INFO"})
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _is_sdist_path(path: str) -> bool:
    return path.split("/", 1)[0] == "sglang" or path in _SDIST_ROOT_FILES


def detect_layout(paths: Iterable[str]) -> PatchLayout:
    """The layout a patch's paths (after the strip level) are written in.

    Raises:
        BuilderError: some paths look like an sdist's and others like the repository's.
    """
    paths = [p for p in paths if p]
    sdist = [p for p in paths if _is_sdist_path(p)]
    if not sdist:
        return "git"
    if len(sdist) == len(paths):
        return "sdist"
    other = next(p for p in paths if not _is_sdist_path(p))
    raise ConfigurationError(f"the patch names {sdist[0]} (an sdist path) and {other} (a "
                             "repository path)", "split it, or say which with --layout git|sdist")


def _move(name: str, strip: int) -> str:
    """Insert ``python/`` after the first ``strip`` components of a diff path."""
    if name == "/dev/null":
        return name
    if name.startswith('"'):
        raise ConfigurationError(f"quoted path {name} (unusual characters)",
                                 "rename the file, or convert the patch by hand")
    parts = name.split("/")
    return "/".join([*parts[:strip], PACKAGE_FOLDER, *parts[strip:]])


def to_repository_layout(text: str, strip: int) -> str:
    """Rewrite an sdist-layout patch's paths into the repository layout.

    Args:
        text: the patch (plain or ``git format-patch``).
        strip: its strip level (1 for ``a/`` ``b/``).

    Returns:
        The same patch with ``python/`` in front of every path; hunk lines are never
        touched (they are counted by their ``@@`` headers, so a removed line that starts
        with ``-- `` is not mistaken for a file header).
    """
    header, body = split_header(text)
    out: list[str] = []
    old_left = new_left = 0
    for line in body.splitlines(keepends=True):
        if old_left > 0 or new_left > 0:
            if line.startswith("\\"):  # "\ No newline at end of file"
                out.append(line)
                continue
            kind = line[:1]
            if kind in (" ", "\n", "\r", ""):
                old_left, new_left = old_left - 1, new_left - 1
            elif kind == "-":
                old_left -= 1
            elif kind == "+":
                new_left -= 1
            out.append(line)
            continue
        ending = line[len(line.rstrip("\r\n")):]
        content = line[:len(line) - len(ending)]
        if hunk := _HUNK.match(content):
            old_left = int(hunk[1]) if hunk[1] is not None else 1
            new_left = int(hunk[2]) if hunk[2] is not None else 1
        elif content.startswith("diff --git "):
            names = content[len("diff --git "):].split(" ")
            if len(names) != 2:
                raise ConfigurationError(f"cannot read the paths of: {content}",
                                         "convert the patch by hand")
            content = "diff --git " + " ".join(_move(n, strip) for n in names)
        elif content.startswith(("--- ", "+++ ")):
            name, _, stamp = content[4:].partition("\t")
            content = content[:4] + _move(name, strip) + ("\t" + stamp if stamp else "")
        else:
            for key in ("rename from ", "rename to ", "copy from ", "copy to "):
                if content.startswith(key):
                    content = key + _move(content[len(key):], 0)  # git writes these bare
        out.append(content + ending)
    return header + "".join(out)


def canonical_bytes(patch: Path, strip: int, layout: str) -> tuple[bytes, PatchLayout]:
    """The patch in the repository layout (its bytes as they are when it is already in
    it), checked to parse, and the layout it was in; nothing is written.

    Args:
        patch: the patch file, read once without blocking (a named pipe or a folder is
            refused before parsing).
        strip: its strip level.
        layout: ``auto`` (:func:`detect_layout`), ``git`` or ``sdist``.

    Raises:
        BuilderError: the patch cannot be read or parsed at ``strip``, its layout is mixed,
            or the converted copy does not parse; the messages name ``patch``.
    """
    data = read_input(patch, "patch file", "name the patch file itself")
    if layout in ("git", "sdist"):
        found: PatchLayout = layout  # type: ignore[assignment]
    else:
        parsed = parse_patch_bytes(data, patch, strip)
        found = detect_layout(path for f in parsed.files for path in (f.old_path, f.new_path)
                              if path is not None)
    if found == "sdist":
        data = to_repository_layout(data.decode("utf-8", "surrogateescape"), strip).encode(
            "utf-8", "surrogateescape")
    parse_patch_bytes(data, patch, strip)  # what is stored must still be a valid diff
    return data, found


def canonical_patch(patch: Path, strip: int, layout: str, destination: Path) -> PatchLayout:
    """Write ``patch`` to ``destination`` in the repository layout (a copy as it is when
    it is already in it); return the layout it was written in.

    Raises:
        BuilderError: as :func:`canonical_bytes` (then nothing is written).
    """
    data, found = canonical_bytes(patch, strip, layout)
    rewrite_user_file(destination, data)
    return found


def _check_text(text: str, flag: str, hint: str) -> None:
    """Refuse an argument that is not one line of UTF-8 text (a byte the locale cannot
    decode arrives as a lone surrogate; a line break would split a report line)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"{flag} {text!r} is not UTF-8 text", hint) from None
    if not text.isprintable():
        raise ConfigurationError(f"{flag} {text!r} holds a line break or another control "
                                 "character", hint)


def check_patch_name(name: str, flag: str = "--name") -> None:
    """Refuse a name for a patch in the series folder that is not a plain file name.

    Args:
        name: the file name asked for.
        flag: where it came from, for the message.

    Raises:
        ConfigurationError: ``name`` is empty, ``.`` or ``..``, has a path separator, or
            is not one line of UTF-8 text.
    """
    hint = "give a plain file name, e.g. --name 0002-my-fix.patch (it is stored beside " \
           "the series file)"
    _check_text(name, flag, hint)
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ConfigurationError(f"{flag} {name!r} is not a plain file name", hint)


def add_to_series(series_file: Path, patch: Path, *, versions: str, description: str,
                  name: str | None = None, strip: int = 1, layout: str = "auto"
                  ) -> tuple[Path, PatchLayout, str]:
    """Store a patch in a series: a repository-layout copy beside the series file and an
    entry (file, sha256, description, strip, versions) appended to it.

    Args:
        series_file: the series (``patches/series.toml``).
        patch: the patch, in either layout.
        versions: upstream versions it applies to (PEP 440 specifiers).
        description: one line for reports and the provenance.
        name: its file name in the series folder (default: the patch's).
        strip: its strip level.
        layout: ``auto``, ``git`` or ``sdist``.

    Returns:
        ``(stored file, layout it was written in, sha256)``.

    Raises:
        BuilderError: the name is not a plain file name, or a patch of that name exists
            or is in the series; the description is not one line of UTF-8 text; the
            version range is not PEP 440; the strip level is below 0; the patch cannot
            be read (a folder, a named pipe) or parsed at the strip level; the layout is
            mixed; the series would not load with the entry or cannot be replaced.
            Nothing is written then: neither the copy nor the series.
    """
    from builder.core.config import specifier
    from builder.patching.series import append_entry, load_series

    # Every argument is checked before anything is written, each naming its flag.
    file_name = patch.name if name is None else name
    check_patch_name(file_name, "--name" if name is not None else "the patch's file name")
    _check_text(description, "--description", "give one line of text")
    _check_text(versions, "--versions", "e.g. --versions '>=0.5.9,<0.5.11'")
    if not description.strip():
        raise ConfigurationError("a patch needs a description", "pass --description TEXT")
    if strip < 0:
        raise ConfigurationError(f"--strip {strip} is below 0",
                                 "1 for a/ b/ prefixes, 0 for bare paths")
    specifier(versions, "--versions")
    series = load_series(series_file)
    stored = series_file.parent / file_name
    if stored.exists() or stored.is_symlink() or \
            any(e.name == stored.name for e in series.entries):
        raise ConfigurationError(f"{stored} already exists", "give it another name with --name, "
                                 "or refresh the existing patch instead")
    data, found = canonical_bytes(patch, strip, layout)
    digest = hashlib.sha256(data).hexdigest()
    # The series with the entry is checked before the copy is written; both or neither.
    append_entry(series_file, {"file": stored.name, "sha256": digest,
                               "description": description.strip(), "strip": strip,
                               "versions": versions}, patch_file=(stored, data))
    return stored, found, digest

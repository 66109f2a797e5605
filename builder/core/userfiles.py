"""Reading the user's input files, and rewriting the user's own files (``targets.toml``,
``images/pins.toml``, the series and its patches) so that nothing but the edit changes.

:func:`read_input` is the one reader of a file the user names: it opens without blocking
and refuses what is not a regular file (a named pipe would wait forever for a writer, a
folder or a device is never an input) or is over a size cap, with one configuration error
naming the file. :func:`read_json_input` adds JSON's own faults (not UTF-8, not JSON,
an object naming one key twice, nested beyond Python's recursion limit); :func:`parse_json`
is the one JSON parser of everything the builder reads.

The new content goes to a temporary file beside the file, is flushed to disk
(``os.fsync``), gets the file's permission bits (and owner, where allowed) and then
replaces it with ``os.replace``, atomic on POSIX: a ``kill -9`` or a crash leaves the old
file or the new one, never half of one. A symbolic link is followed: its target is
edited and the link stays a link. A file with more than one hard link is refused,
because a rename would silently split it (the other names would keep the old content).

A ``kill -9`` between the temporary file's creation and the rename leaves that temporary
beside the file. The writer holds an exclusive ``flock`` on its temporary (the kernel drops
it when the process dies), so the next rewrite of the same file removes every temporary of
that file whose lock it can take: one of a dead writer, never one a live writer is using.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from builder.core.errors import ConfigurationError

SUFFIX = ".sglang-sm120-tmp"
"""The end of every temporary file name this module makes (``.NAME.XXXXXXXX`` + it): only
names of this form are ever removed as a dead writer's leftovers."""


INPUT_LIMIT = 64 << 20
"""The largest input file read (64 MiB): the biggest the builder takes, a smoke report or a
lock, is a few hundred KiB."""


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_input(path: Path, what: str, hint: str, *, limit: int = INPUT_LIMIT) -> bytes:
    """The bytes of the user's input file ``path`` (a link to one is followed).

    The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` on that descriptor,
    so a named pipe is refused at once rather than waited on, and a file swapped between
    a check and the open is still the one checked.

    Args:
        path: the file as the user named it.
        what: what it is, for the message ("the smoke report", "targets file").
        hint: how to fix it, for the message.
        limit: the largest size read, in bytes.

    Returns:
        The file's content.

    Raises:
        ConfigurationError: ``path`` is missing, unreadable, not a regular file, or
            larger than ``limit``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if path.is_symlink():
            raise ConfigurationError(f"{what} {path} is a symbolic link to "
                                     f"{os.readlink(path)}, which does not exist", hint) from None
        raise ConfigurationError(f"{what} not found: {path}", hint) from None
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}", hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigurationError(f"{what} {path} is {_file_kind(info.st_mode)}, not a "
                                     "file", hint)
        if info.st_size > limit:
            raise ConfigurationError(f"{what} {path} is {info.st_size} bytes, over the "
                                     f"{limit >> 20} MiB an input may be", hint)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}", hint) from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while it was read
        raise ConfigurationError(f"{what} {path} is over the {limit >> 20} MiB an input may be",
                                 hint)
    return data


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (Python's ``json`` would keep the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of :func:`parse_json`: the object, refusing a repeated key."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKeyError(f"the key {key!r} appears twice in one object")
        found[key] = value
    return found


def parse_json(text: str | bytes) -> Any:
    """The one JSON parser for what the builder reads: ``json.loads`` that refuses an
    object naming one key twice.

    RFC 8259 section 4 says the names within an object SHOULD be unique and leaves the
    meaning of repeated ones to each reader; Python's ``json`` (3.11) keeps the last
    silently, so a merge that left two digests for one version in ``versions.lock`` would
    be read as the second alone.

    Args:
        text: the document.

    Returns:
        The parsed value.

    Raises:
        DuplicateKeyError: an object names a key twice (a ``ValueError``).
        ValueError: the text is not JSON (``json.JSONDecodeError``).
        RecursionError: it nests deeper than the interpreter's recursion limit.
    """
    return json.loads(text, object_pairs_hook=_unique_keys)


def read_json_input(path: Path, what: str, hint: str) -> Any:
    """The JSON value in the user's input file ``path`` (:func:`read_input`).

    Args:
        path: the file as the user named it.
        what: what it is, for the message.
        hint: how to fix it, for the message.

    Returns:
        The parsed value (any JSON type: the caller checks its shape).

    Raises:
        ConfigurationError: the file cannot be read (:func:`read_input`), is not UTF-8, is
            not JSON, names one key twice in an object (:func:`parse_json`), or nests
            deeper than the interpreter's recursion limit.
    """
    data = read_input(path, what, hint)
    try:
        return parse_json(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{what} {path} is not UTF-8 text (byte {exc.start}: "
                                 f"{exc.reason})", hint) from None
    except RecursionError:
        raise ConfigurationError(f"{what} {path} nests too deeply to be read", hint) from None
    except DuplicateKeyError as exc:  # a merge or a hand edit: which value is meant?
        raise ConfigurationError(f"{what} {path} is malformed: {exc}", hint) from None
    except ValueError as exc:
        raise ConfigurationError(f"{what} {path} is not JSON: {exc}", hint) from None


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[Path]:
    """Hold an exclusive ``flock`` for a read-modify-write of the user's file ``path``.

    The lock is taken on the folder of the file itself (every symbolic link resolved):
    the file is replaced by a rename, so its inode cannot carry the lock, and two names
    of one file (a link in each of two projects) must share one lock.

    Args:
        path: the file as the user named it (it may not exist yet).

    Yields:
        The file really edited (``path`` with every link resolved).
    """
    real = Path(os.path.realpath(path))
    # A link to nothing: its own folder (the rewrite refuses it; nothing made where it
    # points).
    folder = real.parent if real.parent.is_dir() else path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield real
    finally:
        os.close(fd)  # closing releases the lock


def _locked_temporary(real: Path) -> tuple[int, Path]:
    """A new temporary file beside ``real``, open and exclusively ``flock``-ed.

    A cleaner may take a new file's lock in the instant before its writer does, and remove
    it; the writer then finds its name gone (or another file under it) and makes another.
    """
    import tempfile  # here: reading a user's file never needs it

    while True:
        fd, name = tempfile.mkstemp(prefix=f".{real.name}.", suffix=SUFFIX, dir=real.parent)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(name).st_ino == os.fstat(fd).st_ino:
                return fd, Path(name)
        except FileNotFoundError:
            pass
        os.close(fd)


def remove_dead_temporaries(real: Path) -> list[Path]:
    """Remove the temporaries of ``real`` left by writers that died (``kill -9``, a crash).

    Args:
        real: the user's file (its links resolved).

    Returns:
        The temporaries removed.
    """
    pattern = re.compile(re.escape(f".{real.name}.") + r"[a-z0-9_]{8}" + re.escape(SUFFIX))
    removed: list[Path] = []
    try:
        names = os.listdir(real.parent)
    except FileNotFoundError:
        return removed
    for name in names:
        if not pattern.fullmatch(name):
            continue
        candidate = real.parent / name
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # renamed into place meanwhile, or not a plain file of ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a live writer holds it
        try:
            if os.stat(candidate, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                candidate.unlink()
                removed.append(candidate)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def temporary_beside(path: Path, data: bytes) -> Iterator[Path]:
    """A temporary copy of ``data`` beside the user's file ``path``, removed on exit (and,
    after a ``kill -9``, by the next rewrite of ``path``): for checking a result that names
    files relative to the file's folder before it replaces the file.

    Args:
        path: the user's file.
        data: the content to check.

    Yields:
        The temporary file's path.
    """
    real = Path(os.path.realpath(path))
    remove_dead_temporaries(real)
    fd, temporary = _locked_temporary(real)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            yield temporary
    finally:
        temporary.unlink(missing_ok=True)


def check_rewritable(path: Path) -> tuple[Path, os.stat_result | None]:
    """The checks :func:`rewrite_user_file` makes before it writes, alone: for a command
    that writes several files and must refuse before the first of them.

    Args:
        path: the file as the user named it (a link to it is fine; it may not exist).

    Returns:
        The file really written (every link resolved) and its status (``None``: new).

    Raises:
        ConfigurationError: ``path`` is not a regular file, is a link to nothing, or has
            several hard links.
    """
    real = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = real.stat()
    except FileNotFoundError:
        info = None
    if info is None and path.is_symlink():  # its folder may be anywhere: never made
        raise ConfigurationError(f"{path} is a symbolic link to {os.readlink(path)}, which "
                                 "does not exist", "point the link at a file, or remove it; "
                                 "nothing was written")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ConfigurationError(f"{path} is not a regular file", "name the file itself")
    if info is not None and info.st_nlink > 1:
        raise ConfigurationError(
            f"{path} has {info.st_nlink} hard links: replacing it would leave the other "
            "names with the old content", "make it one file (cp it over itself under one "
            "name), or a symbolic link, and run the command again; nothing was changed")
    return real, info


def rewrite_user_file(path: Path, data: bytes) -> Path:
    """Replace the content of the user's file ``path`` with ``data``, atomically.

    Args:
        path: the file as the user named it (a link to it is fine).
        data: the complete new content (line endings are the caller's: read the file as
            bytes to keep them).

    Returns:
        The file really written (``path`` with every symbolic link resolved).

    Raises:
        ConfigurationError: as :func:`check_rewritable`.
    """
    real, info = check_rewritable(path)
    real.parent.mkdir(parents=True, exist_ok=True)  # a new file in a new folder
    remove_dead_temporaries(real)
    fd, temporary = _locked_temporary(real)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.fchmod(fd, stat.S_IMODE(info.st_mode) if info is not None else 0o644)
        if info is not None:
            with contextlib.suppress(PermissionError):  # only root may give files away
                os.fchown(fd, info.st_uid, info.st_gid)
        # Renamed while the lock is held (closing the file drops it): no cleaner can take
        # a temporary that is about to become the file.
        os.replace(temporary, real)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    folder = os.open(real.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)
    return real


def newline_of(original: bytes) -> bytes:
    """The line ending of lines added to a file: CRLF when most of its lines end so (a
    CRLF checkout where a merge left one LF line is still a CRLF file), else LF.

    Args:
        original: the file's bytes.

    Returns:
        ``b"\\r\\n"`` or ``b"\\n"``.
    """
    crlf = original.count(b"\r\n")
    return b"\r\n" if crlf and 2 * crlf > original.count(b"\n") else b"\n"


def with_line_endings_of(original: bytes, text: str) -> bytes:
    """``text`` encoded with ``original``'s line endings: lines an edit added (tomlkit
    writes new keys and tables with LF) get CRLF when the file uses CRLF.

    Args:
        original: the file's bytes before the edit.
        text: the edited document.

    Returns:
        The UTF-8 bytes to write.
    """
    data = text.encode("utf-8")
    if b"\r\n" in original and original.count(b"\r\n") == original.count(b"\n"):
        data = re.sub(rb"(?<!\r)\n", b"\r\n", data)
    return data

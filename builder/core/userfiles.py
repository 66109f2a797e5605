"""Rewriting the user's own files (``targets.toml``, ``images/pins.toml``, the series and
its patches) so that nothing but the edit changes.

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
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from builder.core.errors import ConfigurationError

SUFFIX = ".sglang-sm120-tmp"
"""The end of every temporary file name this module makes (``.NAME.XXXXXXXX`` + it): only
names of this form are ever removed as a dead writer's leftovers."""


def _locked_temporary(real: Path) -> tuple[int, Path]:
    """A new temporary file beside ``real``, open and exclusively ``flock``-ed.

    A cleaner may take a new file's lock in the instant before its writer does, and remove
    it; the writer then finds its name gone (or another file under it) and makes another.
    """
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


def rewrite_user_file(path: Path, data: bytes) -> Path:
    """Replace the content of the user's file ``path`` with ``data``, atomically.

    Args:
        path: the file as the user named it (a link to it is fine).
        data: the complete new content (line endings are the caller's: read the file as
            bytes to keep them).

    Returns:
        The file really written (``path`` with every symbolic link resolved).

    Raises:
        ConfigurationError: ``path`` is not a regular file, or has several hard links.
    """
    real = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = real.stat()
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ConfigurationError(f"{path} is not a regular file", "name the file itself")
    if info is not None and info.st_nlink > 1:
        raise ConfigurationError(
            f"{path} has {info.st_nlink} hard links: replacing it would leave the other "
            "names with the old content", "make it one file (cp it over itself under one "
            "name), or a symbolic link, and run the command again; nothing was changed")
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

"""Rewriting the user's own files (``targets.toml``, ``images/pins.toml``, the series and
its patches) so that nothing but the edit changes.

The new content goes to a temporary file beside the file, is flushed to disk
(``os.fsync``), gets the file's permission bits (and owner, where allowed) and then
replaces it with ``os.replace``, atomic on POSIX: a ``kill -9`` or a crash leaves the old
file or the new one, never half of one. A symbolic link is followed: its target is
edited and the link stays a link. A file with more than one hard link is refused,
because a rename would silently split it (the other names would keep the old content).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path

from builder.core.errors import ConfigurationError


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
    fd, name = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, stat.S_IMODE(info.st_mode) if info is not None else 0o644)
        if info is not None:
            with contextlib.suppress(PermissionError):  # only root may give files away
                os.chown(temporary, info.st_uid, info.st_gid)
        os.replace(temporary, real)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
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

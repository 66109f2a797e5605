"""All of ``add-target``'s files or none: every destination is checked before the first
write, and a write that fails anyway puts back the files already written.

``add-target`` changes up to four files (``targets.toml``, ``images/pins.toml``, the launch
profile stub and the ``--body-file``). A re-run is refused once ``targets.toml`` names the
release, so a run that stopped after the first write used to leave a project the command
could no longer finish. :func:`check_writable` finds what would stop a write (a folder
that is a file, a link to nothing, a read-only file system, a file with several hard
links) with the culprit's own name; :class:`Writes` applies the planned writes in order
and, when one fails, restores the earlier ones (each write is itself atomic:
:func:`builder.core.userfiles.rewrite_user_file`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from builder.core.errors import BuilderError, ConfigurationError
from builder.core.userfiles import rewrite_user_file

_HINT = "fix it and run the command again; nothing was written"


def _first_existing(folder: Path) -> tuple[Path, list[Path]]:
    """The nearest ancestor of ``folder`` (itself included) that exists, and the folders
    below it that a write would create (outermost first)."""
    missing: list[Path] = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.insert(0, folder)
        folder = folder.parent
    return folder, missing


def check_writable(path: Path, what: str) -> None:
    """Refuse ``path`` when writing it would fail, before anything is written.

    Args:
        path: the file to write (absent, or a regular file; a link to one is followed).
        what: its name for the message (``"--body-file"``, ``"the launch profile"``).

    Raises:
        ConfigurationError: ``path`` is a link to nothing, a folder or a special file, has
            several hard links, or sits below a path that is not a folder; or its folder
            cannot be written (read-only file system, permissions): probed by creating and
            removing a temporary file there.
    """
    if path.is_symlink() and not path.exists():
        raise ConfigurationError(f"{what} {path} is a symbolic link to {os.readlink(path)}, "
                                 "which does not exist", "point the link at a file, or "
                                 "remove it; nothing was written")
    real = Path(os.path.realpath(path))
    # ENOTDIR: a path above it is a file (reported below, as not a folder)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        info = real.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigurationError(f"{what} {path} is not a regular file", _HINT)
        if info.st_nlink > 1:
            raise ConfigurationError(f"{what} {path} has {info.st_nlink} hard links: "
                                     "replacing it would leave the other names with the "
                                     "old content", "make it one file; nothing was written")
    existing, _ = _first_existing(real.parent)
    if not existing.is_dir():
        raise ConfigurationError(f"{what} {path}: {existing} is not a folder", _HINT)
    try:
        fd, probe = tempfile.mkstemp(prefix=".sglang-sm120-probe.", dir=existing)
    except OSError as exc:
        reason = ("a read-only file system" if exc.errno == errno.EROFS
                  else exc.strerror or str(exc))
        raise ConfigurationError(f"{what} {path}: its folder {existing} cannot be written "
                                 f"({reason})", _HINT) from None
    os.close(fd)
    os.unlink(probe)


@dataclass
class Writes:
    """Planned writes, applied in order, undone together when one fails.

    Attributes:
        planned: ``(path, new bytes, what)`` per file, in the order they are written.
        done: ``(path, old bytes or None for a new file)`` per file written so far.
        created: folders a write created (removed again on undo, when empty).
    """

    planned: list[tuple[Path, bytes, str]] = field(default_factory=list)
    done: list[tuple[Path, bytes | None]] = field(default_factory=list)
    created: list[Path] = field(default_factory=list)

    def add(self, path: Path, data: bytes, what: str) -> None:
        """Plan writing ``data`` to ``path`` (``what`` names it in messages)."""
        self.planned.append((path, data, what))

    def check(self) -> None:
        """Check every planned destination (:func:`check_writable`).

        Raises:
            ConfigurationError: as :func:`check_writable`, for the first one that fails.
        """
        for path, _, what in self.planned:
            check_writable(path, what)

    def apply(self) -> None:
        """Write every planned file; when one fails, put back those already written.

        Raises:
            BuilderError: the write's own error (the files are as they were).
        """
        try:
            for path, data, what in self.planned:
                self.write(path, data, what)
        except BaseException:
            self.undo()
            raise
        self.planned.clear()

    def write(self, path: Path, data: bytes, what: str) -> None:
        """Write one file now (recorded for :meth:`undo`).

        Raises:
            BuilderError: it cannot be written; the message names ``what`` and ``path``.
        """
        old = path.read_bytes() if path.exists() else None
        _, missing = _first_existing(Path(os.path.realpath(path)).parent)
        try:
            rewrite_user_file(path, data)
        except BuilderError:
            raise
        except OSError as exc:
            raise ConfigurationError(f"cannot write {what} {path}: "
                                     f"{exc.strerror or exc}", _HINT) from None
        finally:
            self.created += [m for m in missing if m.is_dir()]
        self.done.append((path, old))

    def undo(self) -> None:
        """Put back the files written so far (best effort: each restore is atomic)."""
        for path, old in reversed(self.done):
            with contextlib.suppress(OSError, BuilderError):
                if old is None:
                    path.unlink()
                else:
                    rewrite_user_file(path, old)
        for folder in reversed(self.created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        self.done.clear()
        self.created.clear()

"""Content-addressed cache with atomic entries.

An entry is a directory named by the hash of its inputs. It is built in a temporary
sibling directory and renamed into place only when complete, so a killed build never
leaves an entry that a later build would trust (rename is atomic within one filesystem).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def default_cache_root() -> Path:
    """Return the cache root: ``$SGLANG_SM120_CACHE``, else ``$XDG_CACHE_HOME/sglang-sm120``.

    Falls back to ``~/.cache/sglang-sm120`` when neither variable is set.
    """
    explicit = os.environ.get("SGLANG_SM120_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "sglang-sm120"


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of the file at ``path`` (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_json(value: Any) -> str:
    """Return the hex sha256 of ``value`` serialised as canonical JSON (sorted keys)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def sha256_tree(root: Path, *, exclude: frozenset[str] = frozenset()) -> str:
    """Return a hex sha256 over every regular file and symlink under ``root``.

    The digest covers relative paths (sorted), the executable bit and contents, so two
    trees with equal digests produce equal builds. Top-level names in ``exclude`` are
    skipped (for example ``.git``).
    """
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in exclude:
            continue
        if path.is_symlink():
            digest.update(f"L {rel.as_posix()} {os.readlink(path)}\n".encode())
        elif path.is_file():
            executable = "x" if os.access(path, os.X_OK) else "-"
            digest.update(f"F {rel.as_posix()} {executable} {sha256_file(path)}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Cache:
    """A cache root holding one folder per kind (``sdist``, ``source``, ``patched``, ``wheel``).

    Args:
        root: the cache directory; created on first use.
    """

    root: Path

    def entry(self, kind: str, key: str) -> Path:
        """Return the path of entry ``key`` of ``kind`` (it may not exist yet)."""
        return self.root / kind / key

    def lookup(self, kind: str, key: str) -> Path | None:
        """Return the entry's path if a complete entry exists, else ``None``."""
        path = self.entry(kind, key)
        return path if path.is_dir() else None

    @contextmanager
    def building(self, kind: str, key: str) -> Iterator[Path]:
        """Yield a fresh temporary directory; on success rename it to the entry path.

        If the block raises, the temporary directory is removed and no entry appears.
        If another process completed the same entry meanwhile, its entry is kept (same
        inputs give the same content) and ours is discarded.
        """
        final = self.entry(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.{os.getpid()}.{_pid_namespace()}.",
                                    suffix=".tmp", dir=final.parent))
        try:
            yield tmp
            try:
                tmp.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _pid_namespace() -> str:
    """This process's PID namespace (a number): a cache shared with a build container
    sees PIDs of two namespaces, and a PID means something only in its own."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def _remove_orphans(folder: Path) -> None:
    """Remove temporary entries left by builds that were killed (their process is gone).

    Only entries made in this PID namespace are judged; another namespace's (a build
    container's, or the host's seen from one) are left alone.
    """
    namespace = _pid_namespace()
    for tmp in folder.glob(".*.tmp"):
        parts = tmp.name.split(".")
        if len(parts) < 5 or not parts[2].isdigit() or parts[3] != namespace:
            continue
        try:
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            pass  # alive, owned by someone else


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then act on them.

    For writing several files that must all change or none: a Ctrl-C in the middle
    waits for the last rename. (SIGKILL cannot be held.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, lambda number, _frame: received.append(number))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if received:
            signal.raise_signal(received[0])


def atomic_copy(source: Path, destination: Path) -> None:
    """Copy ``source`` to ``destination`` through a temporary file in the same folder.

    The destination either keeps its old content or has the complete new one.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        shutil.copyfile(source, tmp)
        tmp.chmod(0o644)  # mkstemp makes 0600; a published wheel is world-readable
        tmp.replace(destination)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(destination: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``destination`` through a temporary file and a rename.

    Args:
        destination: the file to create or replace.
        data: the complete new content.
        mode: permission bits to set (``None`` keeps the existing file's mode, or 0o644).
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = destination.stat().st_mode & 0o7777 if destination.exists() else 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        tmp.chmod(mode)
        tmp.replace(destination)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

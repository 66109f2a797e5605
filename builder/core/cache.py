"""Content-addressed cache with atomic entries.

An entry is a directory named by the hash of its inputs. It is built in a temporary
sibling directory and renamed into place only when complete, so a killed build never
leaves an entry that a later build would trust (rename is atomic within one filesystem).

In use: a process that touches the cache holds a shared ``flock`` on ``<root>/.in-use``
until it exits, and a lookup that finds an entry sets the entry folder's modification
time (its last use). :func:`prune_cache` (also what ``cache clean`` runs) takes that lock
exclusively and refuses while any build holds it, so no entry a running build may read
is ever removed; it moves an entry to a temporary name before deleting it, so a killed
prune never leaves a partial entry a later build would trust.

Recognised: the root holds the ``CACHEDIR.TAG`` this builder writes (:data:`CACHEDIR_TEXT`,
written by :func:`hold_cache`, which every use of the cache goes through): the standard
signature alone is not enough, since other programs (cargo, ccache ...) tag their caches
with it and hold folders of the same names (``downloads``, ``git``). Only folders of the
kinds in :data:`KINDS` hold entries. Removal refuses a folder without the builder's tag,
leaves other kinds alone, follows no link (the ``.in-use`` lock file included) and
reports every delete that failed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from builder.core.errors import BuildError, ConfigurationError
from builder.core.userfiles import parse_json

_CHUNK = 1 << 20
IN_USE_FILE = ".in-use"
_HELD: dict[Path, int] = {}  # cache root -> the descriptor holding its shared lock
_HELD_LOCK = threading.Lock()

#: The marker a cache root holds: the Cache Directory Tagging Specification
#: (https://bford.info/cachedir/): the file ``CACHEDIR.TAG`` begins with these 43 bytes.
#: Backup tools skip such a folder; ``cache prune``/``clean`` refuse a folder without it.
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
#: The tag's comment line that says this builder wrote it: the standard lets any program
#: write the signature, so only this line tells a builder cache from another one.
CACHEDIR_OWNER = b"# This file is a cache directory tag created by sglang-sm120-builder."
#: The whole ``CACHEDIR.TAG`` the builder writes (the same since the tag was introduced).
CACHEDIR_TEXT = (CACHEDIR_SIGNATURE + b"\n" + CACHEDIR_OWNER + b"\n# For information about "
                 b"cache directory tags, see:\n#\thttps://bford.info/cachedir/\n")
#: Every kind of entry (a folder of the root). :meth:`Cache.entry` refuses any other, and
#: removal never touches another folder (logs, work folders, another program's files).
KINDS = ("behaviour-env", "behaviour-kernel-fit", "behaviour-observed", "behaviour-tilelang",
         "behaviour-torch", "downloads", "git",
         "kernel-env", "kernels", "patched", "serving-triton", "source", "triton-install",
         "wheel", "wheelhouse")
#: The largest ``--older-than`` (about 100 years): more is a typo, not an age.
MAX_AGE_DAYS = 36500.0


def hold_cache(root: Path) -> None:
    """Mark the cache at ``root`` in use by this process until it exits (a shared
    ``flock``, released by the kernel when the process ends, even when killed).

    Waits while a prune or clean holds it exclusively.
    """
    key = root.resolve()
    with _HELD_LOCK:
        if key in _HELD:
            return
        key.mkdir(parents=True, exist_ok=True)
        _mark_cache(key)
        fd = _open_in_use(key)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _HELD[key] = fd


def _open_in_use(root: Path) -> int:
    """Open (creating it) ``root``'s ``.in-use`` lock file, never through a link.

    A link there would make the builder create or lock a file anywhere the link points,
    so it is refused (``O_NOFOLLOW``), as is anything but a regular file.

    Returns:
        The open descriptor (the caller closes it).

    A cache the builder may not write (its permissions, a read-only mount) is locked
    through an ``.in-use`` already there (a shared lock needs no write access), so it
    still serves its entries; without one it is refused naming the cache, not the file.

    Raises:
        ConfigurationError: ``.in-use`` is a symbolic link, a folder or a special file, or
            cannot be opened; or the cache is not writable and has none.
    """
    path = root / IN_USE_FILE
    hint = f"remove {path} (the builder makes a new one); nothing was changed"
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise ConfigurationError(f"the cache's lock file {path} is a symbolic link, not "
                                     "a file the builder can lock", hint) from None
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise ConfigurationError(f"the cache's lock file {path} is {exc.strerror}, not "
                                     "a file the builder can lock", hint) from None
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except OSError:
            raise ConfigurationError(
                f"the cache {root} is not writable: {exc.strerror}",
                f"make {root} writable (its permissions and owner, or a read-only mount), "
                "or use another cache: --cache-dir DIR or SGLANG_SM120_CACHE") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigurationError(f"the cache's lock file {path} is not a regular file", hint)
    return fd


def _mark_cache(root: Path) -> None:
    """Write ``root``'s ``CACHEDIR.TAG`` unless it has one (a read-only cache keeps none).

    Another program's tag is left as it is: replacing it would make its folders
    (``downloads``, ``git`` ...) look like this builder's entries to ``cache clean``.
    """
    if os.path.lexists(root / CACHEDIR_TAG):
        return
    with suppress(OSError):
        atomic_write_bytes(root / CACHEDIR_TAG, CACHEDIR_TEXT)


def is_cache(root: Path) -> bool:
    """Whether ``root`` is a cache this builder made: its ``CACHEDIR.TAG`` is a regular
    file (not a link) that begins with the signature (https://bford.info/cachedir/) and
    then the builder's own line (:data:`CACHEDIR_OWNER`); another program's tag is not."""
    head = CACHEDIR_SIGNATURE + b"\n" + CACHEDIR_OWNER + b"\n"
    try:
        fd = os.open(root / CACHEDIR_TAG, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(head)) == head
    except OSError:
        return False
    finally:
        os.close(fd)


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
    """A cache root holding one folder per kind (:data:`KINDS`).

    Args:
        root: the cache directory; created, with its ``CACHEDIR.TAG``, on first use.
    """

    root: Path

    def entry(self, kind: str, key: str) -> Path:
        """Return the path of entry ``key`` of ``kind`` (it may not exist yet).

        Raises:
            ValueError: ``kind`` is not in :data:`KINDS` (a new kind is added there, so
                that ``cache prune`` knows it).
        """
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is not a cache kind (builder.core.cache.KINDS)")
        return self.root / kind / key

    def lookup(self, kind: str, key: str) -> Path | None:
        """Return the entry's path if a complete entry exists, else ``None``.

        A hit records its use (the entry folder's modification time), which
        ``cache prune --older-than`` reads.
        """
        hold_cache(self.root)
        path = self.entry(kind, key)
        if not path.is_dir():
            return None
        with suppress(OSError):  # a read-only cache still serves its entries
            os.utime(path)
        return path

    def artifact(self, kind: str, key: str, build: Callable[[Path], dict[str, Any] | None],
                 *, record: str = "*", on_damage: OnDamage = "rebuild",
                 valid: Callable[[dict[str, Any]], bool] | None = None,
                 adopt: Callable[[Path], dict[str, Any] | None] | None = None
                 ) -> CachedArtifact:
        """The entry ``key`` of ``kind``: found and verified, or built now.

        The one recipe every stage uses: look the entry up; if it is missing, stale or
        damaged, call ``build`` with a fresh temporary folder, record the files matching
        ``record`` (sha256 and size) and the metadata ``build`` returns in the entry's
        manifest (:data:`MANIFEST`), and rename the folder into place (atomic: a killed
        build leaves no entry). On a hit the recorded files are checked before use.

        Args:
            kind: the entry's folder (``downloads``, ``source``, ``wheel`` ...).
            key: the hash of everything the entry's content depends on.
            build: fills the folder it is given; returns the stage's JSON-ready metadata.
            record: a glob, relative to the entry, of the files to record (``""``: none;
                the default, every file at the top level).
            on_damage: what a hit whose recorded files changed does: ``"rebuild"`` (the
                entry is removed and built again), ``"refuse"`` (removed, then
                :class:`BuildError`), or ``"trust"`` (not checked on read: for entries
                too large to hash on every use; :meth:`CachedArtifact.damaged` still
                checks on demand).
            valid: the stage's own test of a hit's metadata (``False``: made by an older
                rule; built again).
            adopt: for an entry without a readable manifest (made by an older builder):
                its metadata if the stage can vouch for its content, else ``None`` (built
                again). An adopted entry gets a manifest of its files as they are now.

        Returns:
            The entry; ``cached`` says whether it was found.

        Raises:
            BuildError: ``on_damage="refuse"`` and the entry was damaged (it is removed).
            BuilderError: whatever ``build`` raises (then no entry appears).
        """
        path = self.lookup(kind, key)
        if path is not None:
            found = _read_manifest(path, kind, key)
            if found is None and adopt is not None:
                meta = adopt(path)
                if meta is not None:
                    with suppress(OSError):  # a read-only cache still serves its entries
                        _write_manifest(path, kind, key, meta, record)
                    found = _read_manifest(path, kind, key)
            if found is not None and valid is not None and not valid(found.meta):
                found = None
            if found is not None and on_damage != "trust":
                bad = found.damaged()
                if bad and on_damage == "refuse":
                    _discard(path)
                    raise BuildError(f"the cache entry {path} was damaged ({', '.join(bad)} "
                                     "changed); it was removed",
                                     "run the same command again to rebuild it")
                if bad:
                    found = None
            if found is not None:
                return found
            _discard(path)  # stale or damaged: never trust it, build again
        with self._building(kind, key) as tmp:
            meta = build(tmp) or {}
            _write_manifest(tmp, kind, key, meta, record)
        made = _read_manifest(self.entry(kind, key), kind, key)
        if made is None:  # another process's entry won the rename and is not ours to read
            raise BuildError(f"the cache entry {self.entry(kind, key)} has no readable "
                             "manifest", "remove it and run again")
        return CachedArtifact(kind, key, made.path, made.meta, made.files, cached=False)

    @contextmanager
    def _building(self, kind: str, key: str) -> Iterator[Path]:
        """Yield a fresh temporary directory; on success rename it to the entry path.

        The primitive under :meth:`artifact` (stages use that: it writes the manifest).

        If the block raises, the temporary directory is removed and no entry appears.
        If another process completed the same entry meanwhile, its entry is kept (same
        inputs give the same content) and ours is discarded.
        """
        hold_cache(self.root)
        final = self.entry(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(final.parent)
        import tempfile  # here: `targets` and --help import this module, never make entries

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


# ---------------------------------------------------------------- one recipe for entries

#: The file every complete entry holds beside its content: written only here.
MANIFEST = "cache-entry.json"
#: Bumped when the manifest's format changes; an entry of another schema is made again.
MANIFEST_SCHEMA = 1

OnDamage = Literal["rebuild", "refuse", "trust"]


@dataclass(frozen=True)
class CachedFile:
    """One file an entry's manifest records.

    Attributes:
        name: its path inside the entry (POSIX, relative).
        sha256: hex sha256 of its bytes when the entry was made.
        size: its size in bytes then.
    """

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class CachedArtifact:
    """A complete cache entry, as :meth:`Cache.artifact` found or made it.

    Attributes:
        kind: its folder (``downloads``, ``source``, ``wheel`` ...).
        key: its name (the hash of its inputs).
        path: the entry folder.
        meta: the stage's own JSON metadata, as the build returned it.
        files: the files the manifest records, by name.
        cached: found in the cache (``False``: made by this call).
    """

    kind: str
    key: str
    path: Path
    meta: dict[str, Any]
    files: dict[str, CachedFile]
    cached: bool

    def file(self, name: str) -> Path:
        """The path of recorded file ``name``.

        Raises:
            KeyError: the manifest records no such file.
        """
        return self.path / self.files[name].name

    def damaged(self) -> list[str]:
        """The recorded files that are missing or whose size or sha256 changed."""
        bad = []
        for record in self.files.values():
            path = self.path / record.name
            try:
                if path.is_symlink() or path.stat().st_size != record.size or \
                        sha256_file(path) != record.sha256:
                    bad.append(record.name)
            except OSError:
                bad.append(record.name)
        return bad

    def copy_to(self, name: str, folder: Path) -> Path:
        """Copy recorded file ``name`` into ``folder`` atomically (see :func:`atomic_copy`).

        Returns:
            The copy's path (``folder / name``); its sha256 is ``files[name].sha256``.
        """
        destination = folder / Path(name).name
        atomic_copy(self.file(name), destination)
        return destination


def legacy_entry(name: str, files: Callable[[dict[str, Any]], dict[str, str]] | None = None
                 ) -> Callable[[Path], dict[str, Any] | None]:
    """An ``adopt`` for :meth:`Cache.artifact`: an entry made before the manifest existed
    kept its metadata in the JSON file ``name``; that metadata is adopted when it reads
    and, if ``files`` maps it to ``{file name: sha256}``, each file still has its sha256.

    Returns:
        The adopter (``None`` from it: the entry is made again).
    """
    def adopt(path: Path) -> dict[str, Any] | None:
        try:
            meta = parse_json((path / name).read_text())
            if not isinstance(meta, dict):
                return None
            for file, digest in (files(meta) if files else {}).items():
                if sha256_file(path / file) != digest:
                    return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return meta
    return adopt


def _read_manifest(path: Path, kind: str, key: str) -> CachedArtifact | None:
    """The entry at ``path`` as its manifest describes it (``None``: no readable manifest
    of this schema, as in an entry made by an older builder)."""
    try:
        data = parse_json((path / MANIFEST).read_text())
        if data.get("schema") != MANIFEST_SCHEMA or data.get("kind") != kind or \
                data.get("key") != key:
            return None
        files = {f["name"]: CachedFile(str(f["name"]), str(f["sha256"]), int(f["size"]))
                 for f in data["files"]}
        meta = data["meta"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(meta, dict):
        return None
    return CachedArtifact(kind, key, path, meta, files, cached=True)


def _write_manifest(folder: Path, kind: str, key: str, meta: dict[str, Any],
                    record: str) -> None:
    """Record ``folder``'s files matching ``record`` (sha256 and size) and ``meta``."""
    files = [] if not record else [
        {"name": p.relative_to(folder).as_posix(), "sha256": sha256_file(p),
         "size": p.stat().st_size}
        for p in sorted(folder.glob(record))
        if p.is_file() and not p.is_symlink() and p.name != MANIFEST]
    blob = json.dumps({"schema": MANIFEST_SCHEMA, "kind": kind, "key": key, "files": files,
                       "meta": meta}, indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(folder / MANIFEST, blob.encode())


def _pid_namespace() -> str:
    """This process's PID namespace (a number): a cache shared with a build container
    sees PIDs of two namespaces, and a PID means something only in its own."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def _remove_orphans(folder: Path) -> list[tuple[Path, str]]:
    """Remove temporary entries left by builds that were killed (their process is gone).

    Only entries made in this PID namespace are judged; another namespace's (a build
    container's, or the host's seen from one) are left alone.

    Returns:
        What could not be removed, with the error.
    """
    namespace = _pid_namespace()
    failed: list[tuple[Path, str]] = []
    for tmp in folder.glob(".*.tmp"):
        parts = tmp.name.split(".")
        if len(parts) < 5 or not parts[2].isdigit() or parts[3] != namespace or \
                tmp.is_symlink():
            continue
        try:
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            failed += _rmtree(tmp)
        except PermissionError:
            pass  # alive, owned by someone else
    return failed


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


def replaceable(destination: Path) -> None:
    """Refuse to replace ``destination`` unless it is absent or a regular file.

    A rename replaces whatever has the name: a device (``/dev/full``), a named pipe, or a
    symbolic link, whose target would then keep its old content while the link is gone.
    Output paths are replaced whole, so only a file (or nothing) may be there.

    Raises:
        ConfigurationError: ``destination`` is a link, a folder or a special file.
    """
    try:
        mode = destination.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
                else "a device, pipe or socket")
        raise ConfigurationError(f"{destination} is {kind}, not a file the output can replace",
                                 "give the path of a regular file, or a new name")


def atomic_copy(source: Path, destination: Path) -> None:
    """Copy ``source`` to ``destination`` through a temporary file in the same folder.

    The destination either keeps its old content or has the complete new one.

    Raises:
        ConfigurationError: ``destination`` is not a regular file (:func:`replaceable`).
    """
    replaceable(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

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

    Raises:
        ConfigurationError: ``destination`` is not a regular file (:func:`replaceable`).
    """
    replaceable(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = destination.stat().st_mode & 0o7777 if destination.exists() else 0o644
    import tempfile

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


# ---------------------------------------------------------------- seeing and pruning


@dataclass(frozen=True)
class CacheEntry:
    """One complete cache entry.

    Attributes:
        kind: its folder (``downloads``, ``source``, ``patched``, ``wheel``, ``kernels``,
            ``kernel-env`` ...).
        key: its name (the hash of its inputs).
        path: where it is.
        size: bytes of its files.
        last_used: when it was made or last found by a lookup (seconds since the epoch).
    """

    kind: str
    key: str
    path: Path
    size: int
    last_used: float

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"kind": self.kind, "key": self.key, "path": str(self.path),
                "size": self.size, "last_used": self.last_used}


def _size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def cache_entries(root: Path) -> list[CacheEntry]:
    """Every complete entry under ``root``, by kind and key (temporary folders of builds
    in progress, files such as logs, folders of other kinds and links are not entries)."""
    return _scan(root)[0]


def _scan(root: Path) -> tuple[list[CacheEntry], list[tuple[Path, str]]]:
    """The entries under ``root``, and the links found where a kind folder or an entry
    would be (never followed: a link can point anywhere)."""
    entries: list[CacheEntry] = []
    links: list[tuple[Path, str]] = []
    for kind in _folders(root, links):
        if kind.name not in KINDS:
            continue
        for path in _folders(Path(kind.path), links):
            if not path.name.startswith("."):
                entries.append(CacheEntry(kind.name, path.name, Path(path.path),
                                          _size(Path(path.path)),
                                          path.stat(follow_symlinks=False).st_mtime))
    return entries, links


def _folders(folder: Path, links: list[tuple[Path, str]]) -> list[os.DirEntry[str]]:
    """The real folders in ``folder`` (sorted); a link among them goes to ``links``."""
    try:
        with os.scandir(folder) as found:
            items = sorted(found, key=lambda item: item.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    folders = []
    for item in items:
        if item.is_symlink():
            if not item.name.startswith(".") and item.name != CACHEDIR_TAG:
                links.append((Path(item.path), "a link, not followed"))
        elif item.is_dir(follow_symlinks=False):
            folders.append(item)
    return folders


@contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """Hold the cache exclusively, or refuse at once if a build is using it."""
    root.mkdir(parents=True, exist_ok=True)
    if root.resolve() in _HELD:
        raise ConfigurationError(f"this process is using the cache {root}", "")
    fd = _open_in_use(root)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigurationError(
                f"the cache {root} is in use by a running build",
                "try again when it has finished; nothing was removed") from None
        yield
    finally:
        os.close(fd)


def _rmtree(path: Path) -> list[tuple[Path, str]]:
    """Delete the folder ``path`` (a link is refused, never followed).

    Returns:
        Each path that could not be deleted, with the error.
    """
    failed: list[tuple[Path, str]] = []

    def record(_function: Any, where: str, error: BaseException) -> None:
        failed.append((Path(where), f"{type(error).__name__}: "
                                    f"{getattr(error, 'strerror', None) or error}"))

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=record)
    else:
        shutil.rmtree(path, onerror=lambda fn, where, info: record(fn, where, info[1]))
    return failed


def _remove(path: Path) -> list[tuple[Path, str]]:
    """Move an entry out of the way (atomically), then delete it.

    Returns:
        What could not be deleted after the move (the entry is gone from its name).

    Raises:
        OSError: the move failed (the entry is still there).
    """
    doomed = path.parent / f".{path.name[:16]}.{os.getpid()}.{_pid_namespace()}.del.tmp"
    path.rename(doomed)
    return _rmtree(doomed)


def _discard(path: Path) -> None:
    """Remove an entry that must not be used, if another process has not already
    (what cannot be deleted is left under a temporary name, never used)."""
    with suppress(FileNotFoundError):
        _remove(path)


def check_days(days: float) -> float:
    """Return ``days`` if it is an age ``cache prune --older-than`` can mean.

    Raises:
        ConfigurationError: ``days`` is not a number from 0 to :data:`MAX_AGE_DAYS` (NaN,
            infinite, negative or absurd).
    """
    if not (math.isfinite(days) and 0 <= days <= MAX_AGE_DAYS):
        raise ConfigurationError(f"--older-than {days!r} is not a number of days from 0 to "
                                 f"{MAX_AGE_DAYS:g}", "give the age in days, e.g. 30")
    return days


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune_cache` did.

    Attributes:
        removed: the entries removed (wholly).
        skipped: links found where a kind folder or an entry would be, left alone (path,
            why).
        failed: what could not be removed (path, the error); never counted as removed.
    """

    removed: list[CacheEntry]
    skipped: list[tuple[Path, str]]
    failed: list[tuple[Path, str]]


def prune_cache(root: Path, *, older_than_days: float | None,
                now: float | None = None, kinds: Collection[str] = ()) -> Pruned:
    """Remove the entries not used for ``older_than_days`` days (``None``: every entry),
    and the temporary folders of builds that were killed.

    Only a folder holding the builder's own ``CACHEDIR.TAG`` (:func:`is_cache`) is pruned,
    only folders of :data:`KINDS` are looked in, and no link is followed.

    Args:
        root: the cache root.
        older_than_days: the age, by last use, from which an entry goes.
        now: the current time (seconds since the epoch; default: now).
        kinds: only entries of these kinds (of :data:`KINDS`; empty: every kind), e.g.
            ``behaviour-env`` alone (3.8 GB a release).

    Returns:
        What was removed, left alone and could not be removed.

    Raises:
        ConfigurationError: ``root`` is not a builder cache (no ``CACHEDIR.TAG`` of the
            builder's, see :func:`is_cache`), its ``.in-use`` is a link, or
            ``older_than_days`` is not an age (see :func:`check_days`), or a kind is not
            one of :data:`KINDS`; nothing is removed.
        BuilderError: a running build holds the cache (then nothing is removed).
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ConfigurationError(f"{', '.join(unknown)}: not a cache kind",
                                 f"one of {', '.join(KINDS)}")
    if older_than_days is not None:
        check_days(older_than_days)
    if not root.is_dir():
        return Pruned([], [], [])
    if not is_cache(root):
        raise ConfigurationError(
            f"{root} is not a builder cache (it has no {CACHEDIR_TAG} written by this "
            "builder); nothing was removed",
            "check --cache-dir and $SGLANG_SM120_CACHE; if it is a cache made by this "
            f"builder, mark it: printf '{CACHEDIR_SIGNATURE.decode()}\\n"
            f"{CACHEDIR_OWNER.decode()}\\n' > {root / CACHEDIR_TAG}")
    limit = None if older_than_days is None else \
        (now if now is not None else time.time()) - older_than_days * 86400
    removed: list[CacheEntry] = []
    failed: list[tuple[Path, str]] = []
    with _exclusive(root):
        entries, skipped = _scan(root)
        for kind in kinds or KINDS:
            if (root / kind).is_dir() and not (root / kind).is_symlink():
                failed += _remove_orphans(root / kind)
        for entry in entries:
            if (limit is not None and entry.last_used >= limit) or \
                    (kinds and entry.kind not in kinds):
                continue
            try:
                left = _remove(entry.path)
            except OSError as error:
                failed.append((entry.path, f"{type(error).__name__}: "
                                           f"{error.strerror or error}"))
                continue
            if left:
                failed += left
            else:
                removed.append(entry)
    return Pruned(removed, skipped, failed)

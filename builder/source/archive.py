"""Archives from outside checked against their own claims, and unpacked by one strict rule.

An sdist (``.tar.gz``) or a released wheel (``.whl``) must be what its pin says: the
version in its own metadata (PKG-INFO / METADATA, read with ``packaging``'s email-header
parser) and in its folder names equals the pin's version after PEP 440 normalization,
and its distribution name is the pin's project after PEP 503 normalization.

The sdist unpack rule (docs/inputs.md):

* member names lose a leading ``./`` (as GNU tar and pip read them); a member named
  ``.`` is the archive's root and is skipped;
* if every member sits under one top folder, that folder is the tree's root (pip's
  ``has_leading_dir`` rule); otherwise the members are the tree; either way the tree
  must hold a ``PKG-INFO`` at its root (the sdist format, packaging.python.org);
* refused, with the member named: an absolute name, a ``..`` component, a backslash, a
  symbolic or hard link, a device, FIFO or other special file, and two members of one
  name;
* files are written ``0644`` (``0755`` if any execute bit was set), folders ``0755``;
  nothing else of the archive's modes, owners or times is kept.

The tree is always unpacked into its own folder, so the cache's bookkeeping files never
sit inside it. One sequential pass over the compressed stream does it all: no member is
read twice and no path is resolved on disk, which is what makes it faster than
``tarfile``'s ``data`` filter (benchmarks/bench_unpack.py) while refusing strictly more.

A wheel is refused when two zip entries share a name (installers disagree on which one
wins) or when its RECORD disagrees with the zip (a file missing from RECORD, a RECORD
row for a missing file, or a wrong sha256 or size).
"""

from __future__ import annotations

import base64
import calendar
import csv
import gzip
import hashlib
import io
import os
import posixpath
import shutil
import tarfile
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.errors import VerificationError

#: Larger archives (compressed or not) are unpacked as a stream instead of in memory. Low:
#: a whole sdist in memory set a cold build's peak (0.5.9's, 25 MiB uncompressed: 77 MiB
#: peak in memory, 27 MiB streamed, the same CPU time within noise, three runs each on
#: a shared 2-core machine; benchmarks/bench_wheel.py), and the build's pip processes,
#: forked from this one, start with its peak.
_IN_MEMORY_LIMIT = 8 << 20


@dataclass(frozen=True)
class ArchiveMetadata:
    """What an archive says about itself.

    Attributes:
        name: the ``Name`` field of its PKG-INFO / METADATA.
        version: the ``Version`` field, parsed (PEP 440).
    """

    name: str
    version: Version


def _names(stem: str, project: str, version: str) -> bool:
    """Whether a ``NAME-VERSION`` folder stem names ``project`` ``version`` (PEP 503 names,
    PEP 440 versions: ``sglang-0.5.10.post1``, ``SGLang-0.5.10-post1``)."""
    folder_name, _, folder_version = stem.rpartition("-")
    try:
        return (canonicalize_name(folder_name) == canonicalize_name(project)
                and Version(folder_version) == Version(version))
    except InvalidVersion:
        return False


def read_metadata(data: bytes, where: str) -> ArchiveMetadata:
    """Parse core metadata (PKG-INFO or METADATA) the way ``packaging`` does.

    The format is email headers (the core metadata spec, packaging.python.org): CRLF or
    LF line endings, continuation lines, and a body after the first blank line that is
    never read as headers.

    Args:
        data: the file's bytes.
        where: what to name in an error (``sglang-0.5.9.tar.gz: PKG-INFO``).

    Returns:
        Its name and version.

    Raises:
        BuilderError: no single ``Name`` or ``Version`` field, or a version that is not
            PEP 440.
    """
    from packaging.metadata import parse_email  # here: email's parser costs ~10 ms to import

    raw, unparsed = parse_email(data)
    for field in ("name", "version"):
        if field in unparsed or field not in raw:
            raise VerificationError(f"{where} has no single {field.title()} field",
                                    "this is not a valid sdist or wheel")
    try:
        version = Version(str(raw["version"]))
    except InvalidVersion:
        raise VerificationError(f"{where}: Version {raw['version']!r} is not a PEP 440 version",
                                "this is not a valid sdist or wheel") from None
    return ArchiveMetadata(str(raw["name"]), version)


def check_claims(what: str, claimed: ArchiveMetadata, project: str, version: str) -> None:
    """Refuse an archive whose own name or version is not the pin's.

    Raises:
        BuilderError: the names differ after PEP 503 normalization, or the versions
            after PEP 440 normalization.
    """
    if canonicalize_name(claimed.name) != canonicalize_name(project):
        raise VerificationError(f"{what} says it is {claimed.name}, but the pin is for {project}",
                                "the file is another project's; check the pin")
    if claimed.version != Version(version):
        raise VerificationError(f"{what} says version {claimed.version}, but the pin and the file "
                                f"name say {version}",
                                "the archive is mislabelled: pin the release it really is, or "
                                "ask upstream for a correct file; nothing was built")


def _member_name(raw: str, archive: str) -> str | None:
    """The member's normalized relative name, ``None`` for the root, or refuse it."""
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if name in ("", "."):
        return None
    parts = name.split("/")
    if raw.startswith("/") or "\\" in raw or ".." in parts or "" in parts or "." in parts:
        raise VerificationError(f"unsafe archive {archive}: member {raw!r} is absolute or leaves "
                                "the tree", "refusing to unpack it; nothing was kept")
    return name


@dataclass(frozen=True)
class UnpackedSdist:
    """What :func:`unpack_sdist` made.

    Attributes:
        newest: the newest member's mtime (the release time, for SOURCE_DATE_EPOCH).
        tree_sha256: the tree's digest, equal to :func:`builder.core.cache.sha256_tree`
            of it, computed from the bytes as they were written (no second pass).
    """

    newest: int
    tree_sha256: str


def _open_tar(archive: Path) -> tarfile.TarFile:
    """Open an sdist for one sequential pass.

    A gzip archive whose trailer gives an uncompressed size under
    :data:`_IN_MEMORY_LIMIT` is decompressed in one call (zlib in C) and read from
    memory, which is markedly faster than decompressing in small steps as headers are
    parsed; anything else is read as a stream.
    """
    length = archive.stat().st_size
    with archive.open("rb") as handle:
        magic = handle.read(2)
        handle.seek(max(length - 4, 0))
        size = int.from_bytes(handle.read(4), "little")  # ISIZE: size mod 2**32 (RFC 1952)
    if magic == b"\x1f\x8b" and 18 <= length < _IN_MEMORY_LIMIT and size < _IN_MEMORY_LIMIT:
        try:
            raw = gzip.decompress(archive.read_bytes())
        except (OSError, EOFError, zlib.error) as exc:
            raise tarfile.ReadError(f"not a gzip file: {exc}") from None
        return tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    return tarfile.open(archive, "r:*")


def unpack_sdist(archive: Path, tree: Path, project: str, version: str) -> UnpackedSdist:
    """Unpack an sdist into ``tree`` by the module's rule and check its claims.

    Args:
        archive: the verified ``.tar.gz``.
        tree: the folder to create (its parent must exist); on error it may hold part of
            the archive, so pass a folder inside a cache entry being built.
        project: the pin's project.
        version: the pin's version.

    Returns:
        The release time and the tree's digest.

    Raises:
        BuilderError: a member is unsafe, the layout is not an sdist's, the archive is
            damaged, or its PKG-INFO or top folder disagree with the pin.
    """
    staging = tree.parent / (tree.name + ".unpack")
    staging.mkdir()
    root_text = str(staging)
    made = {root_text}
    seen: set[str] = set()
    digests: dict[str, str] = {}  # name -> the line sha256_tree writes for the file
    newest = 0
    try:
        with _open_tar(archive) as tar:
            for member in tar:
                name = _member_name(member.name, archive.name)
                if name is None:
                    continue
                if name in seen and not member.isdir():
                    raise VerificationError(f"{archive.name} has two members named {name!r}",
                                            "an sdist lists each file once; refusing it")
                seen.add(name)
                newest = max(newest, int(member.mtime))
                target = os.path.join(root_text, name)
                if member.isdir():
                    if target not in made:
                        os.makedirs(target, 0o755, exist_ok=True)
                        made.add(target)
                elif member.isreg():
                    parent = os.path.dirname(target)
                    if parent not in made:
                        os.makedirs(parent, 0o755, exist_ok=True)
                        made.add(parent)
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file always has content
                    # O_EXCL: never write through something already there
                    executable = bool(member.mode & 0o111)
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 0o755 if executable else 0o644)
                    data = source.read()
                    with os.fdopen(fd, "wb") as out:
                        out.write(data)
                    digests[name] = (f"{'x' if executable else '-'} "
                                     f"{hashlib.sha256(data).hexdigest()}")
                else:
                    kind = "link" if member.issym() or member.islnk() else "special file"
                    raise VerificationError(f"{archive.name}: member {member.name!r} is a {kind}",
                                            "sdists built by pip-compatible tools carry regular "
                                            "files and folders only; refusing it")
    except (tarfile.TarError, EOFError, zipfile.BadZipFile) as exc:
        raise VerificationError(f"cannot unpack {archive.name}: {exc}",
                                "the download may be damaged") from None
    except FileExistsError as exc:  # a file and a folder of one name
        raise VerificationError(f"{archive.name} holds {exc.filename} twice",
                                "refusing it") from None
    tops = {name.split("/", 1)[0] for name in seen}
    root = staging
    top = None
    if len(tops) == 1 and (staging / next(iter(tops))).is_dir():
        top = tops.pop()
        root = staging / top
    pkg_info = root / "PKG-INFO"
    if not pkg_info.is_file():
        raise VerificationError(f"{archive.name} has no PKG-INFO at its root"
                                + (f" (inside {top}/)" if top else ""),
                                "this is not an sdist (the format requires PKG-INFO)")
    claimed = read_metadata(pkg_info.read_bytes(), f"{archive.name}: PKG-INFO")
    check_claims(f"{archive.name} (PKG-INFO)", claimed, project, version)
    if top is not None and not _names(top, project, version):
        raise VerificationError(f"{archive.name}'s top folder {top}/ is not "
                                f"{canonicalize_name(project)} {version}",
                                "the archive is mislabelled; nothing was built")
    root.rename(tree)
    shutil.rmtree(staging, ignore_errors=True)
    return UnpackedSdist(newest, _tree_digest(digests, top))


def _tree_digest(digests: dict[str, str], top: str | None) -> str:
    """The digest :func:`builder.core.cache.sha256_tree` gives the unpacked tree: its lines
    ``F <path> <x|-> <sha256>``, in the order of sorted paths (by component, as
    ``pathlib`` sorts them)."""
    cut = len(top) + 1 if top else 0
    digest = hashlib.sha256()
    for name in sorted(digests, key=lambda n: n[cut:].split("/")):
        digest.update(f"F {name[cut:]} {digests[name]}\n".encode())
    return digest.hexdigest()


# --- wheels ----------------------------------------------------------------------------

def _record_digest(data: bytes) -> str:
    """RECORD's hash form: urlsafe base64 of the sha256, no padding (the wheel spec)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def check_wheel(wheel: Path, project: str, version: str) -> str:
    """Refuse a wheel that is not what its pin says or whose parts disagree.

    Checks: each zip entry name once; one ``.dist-info`` folder named
    ``{name}-{version}.dist-info``, and any ``.data`` folder likewise; METADATA's Name
    and Version equal the pin's (PEP 503 / PEP 440 normalized); RECORD lists every entry
    but itself with the right sha256 and size, and nothing else.

    Args:
        wheel: the verified ``.whl``.
        project: the pin's project.
        version: the pin's version.

    Returns:
        The ``.dist-info`` folder's name.

    Raises:
        BuilderError: any check fails, or the file is not a zip.
    """
    where = wheel.name
    try:
        with zipfile.ZipFile(wheel) as archive:
            infos = archive.infolist()
            _refuse_unsafe(infos, where)
            names = [i.filename for i in infos]
            duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
            if duplicates:
                raise VerificationError(f"{where} has two zip entries named {duplicates[0]!r}",
                                        "installers disagree on which one wins: this is not a "
                                        "valid wheel; refusing it")
            folders = {n.split("/", 1)[0] for n in names if "/" in n}
            infos_dirs = [f for f in folders if f.endswith(".dist-info")]
            if len(infos_dirs) != 1:
                raise VerificationError(f"{where} has {len(infos_dirs)} .dist-info folders",
                                        "a wheel has exactly one; refusing it")
            dist_info = infos_dirs[0]
            for folder in folders:
                if folder.endswith((".dist-info", ".data")) and \
                        not _names(folder.rsplit(".", 1)[0], project, version):
                    raise VerificationError(f"{where}: folder {folder}/ is not "
                                            f"{canonicalize_name(project)} {version}",
                                            "the wheel is mislabelled; nothing was built")
            metadata = f"{dist_info}/METADATA"
            if metadata not in names:
                raise VerificationError(f"{where} has no {metadata}", "this is not a valid wheel")
            claimed = read_metadata(archive.read(metadata), f"{where}: METADATA")
            check_claims(f"{where} (METADATA)", claimed, project, version)
            _check_record(archive, dist_info, where)
    except zipfile.BadZipFile as exc:
        raise VerificationError(f"cannot read {where}: {exc}", "the download may be damaged"
                                ) from None
    return dist_info


def _check_record(archive: zipfile.ZipFile, dist_info: str, where: str) -> None:
    record_name = f"{dist_info}/RECORD"
    try:
        text = archive.read(record_name).decode("utf-8")
    except KeyError:
        raise VerificationError(f"{where} has no {record_name}", "this is not a valid wheel"
                                ) from None
    rows: dict[str, tuple[str, str]] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if len(row) != 3:
            raise VerificationError(f"{where}: RECORD row {row!r} does not have 3 fields",
                                    "this is not a valid wheel")
        path = posixpath.normpath(row[0])
        if path in rows:
            raise VerificationError(f"{where}: RECORD lists {row[0]} twice",
                                    "this is not a valid wheel")
        rows[path] = (row[1], row[2])
    files = [i for i in archive.infolist() if not i.is_dir()]
    for info in files:
        if info.filename == record_name or info.filename.startswith(
                (f"{dist_info}/RECORD.", f"{dist_info}/RECORD.jws")):
            continue  # RECORD and its signatures are not hashed (the wheel spec)
        if info.filename not in rows:
            raise VerificationError(f"{where}: {info.filename} is not in RECORD",
                                    "RECORD disagrees with the zip: refusing the wheel")
        digest, size = rows.pop(info.filename)
        data = archive.read(info)
        if digest != _record_digest(data) or (size and size != str(len(data))):
            raise VerificationError(f"{where}: {info.filename} does not match its RECORD row",
                                    "RECORD disagrees with the zip: refusing the wheel")
    rows.pop(record_name, None)
    if rows:
        raise VerificationError(f"{where}: RECORD lists {sorted(rows)[0]}, which the zip lacks",
                                "RECORD disagrees with the zip: refusing the wheel")


def _refuse_unsafe(infos: list[zipfile.ZipInfo], where: str) -> None:
    """Refuse absolute names, ``..``, backslashes and symlinks in a zip."""
    for info in infos:
        parts = info.filename.split("/")
        mode = info.external_attr >> 16
        if info.filename.startswith("/") or ".." in parts or "\\" in info.filename \
                or (mode & 0o170000) == 0o120000:
            raise VerificationError(f"unsafe archive {where}: member {info.filename!r}",
                                    "refusing to unpack it")


def unzip_wheel(wheel: Path, destination: Path) -> int:
    """Extract a checked wheel (see :func:`check_wheel`); return the newest entry's time.

    Refuses absolute names, ``..``, backslashes and symlinks before writing anything.

    Raises:
        BuilderError: an unsafe entry, or a damaged file.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            infos = archive.infolist()
            _refuse_unsafe(infos, wheel.name)
            for info in infos:
                if info.is_dir():
                    continue
                target = destination / info.filename
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(info))
                if (info.external_attr >> 16) & 0o111:
                    target.chmod(0o755)
    except zipfile.BadZipFile as exc:
        raise VerificationError(f"cannot unpack {wheel.name}: {exc}",
                                "the download may be damaged") from None
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        # A file and a folder of one name, as unpack_sdist refuses too; other OSErrors are
        # this machine's disk and reach the CLI's own message.
        raise VerificationError(f"{wheel.name} holds {exc.filename} as a file and a folder",
                                "refusing it") from None
    stamps = [calendar.timegm((*i.date_time, 0, 0, 0)) for i in infos]
    return max(stamps, default=0)

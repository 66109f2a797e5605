"""Source stage: a pinned upstream release as a verified, unpacked tree in the cache.

Three ways in: an sdist from a package index (pinned by sha256, verified before it is
unpacked), a git commit (cloned into a cache mirror with gitpython, checked out, HEAD
verified against the pin), or a folder the user already has (``--source-dir``).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.core.address import file_name
from builder.core.cache import (
    Cache,
    CachedArtifact,
    hold_cache,
    legacy_entry,
    sha256_file,
    sha256_tree,
)
from builder.core.config import GitPin, Pin, SdistPin, SourceKind, Target, WheelPin
from builder.core.errors import BuilderError, ConfigurationError, SourceError, VerificationError
from builder.core.layout import Layout
from builder.core.options import Options, select_target
from builder.core.pipconfig import IndexChoice, resolve_index
from builder.core.progress import Reporter
from builder.source.archive import (
    check_claims,
    check_wheel,
    read_metadata,
    unpack_sdist,
    unzip_wheel,
)

# The network modules (builder.source.download and .index: urllib.request, http.client,
# ssl) and gitpython, requests and remotezip are imported where they are used: a build
# from the cache needs none of them (about 25 ms of a no-op rebuild's start, measured
# with -X importtime; benchmarks/bench_wheel.py).
if TYPE_CHECKING:
    import email.message

    import git

#: Bumped when the unpack rule changes, so older cache entries are unpacked again.
UNPACK_RULE = 2


@dataclass(frozen=True)
class SourceResult:
    """An unpacked, verified upstream tree.

    Attributes:
        tree: the tree's root folder (treat as read-only: it is a cache entry or the
            user's own folder).
        layout: how the tree maps repository paths.
        pin: the pin it came from (``None`` for ``--source-dir``).
        upstream_version: the upstream release version.
        source_date_epoch: seconds since the epoch of the upstream release (newest member
            of the sdist, or the commit's committer date); used for reproducible builds.
        key: a content key for caching later stages (the sdist's sha256, the commit, or
            a hash of the folder's files).
        tree_sha256: digest of the tree's files when it was unpacked into the cache
            (``None`` for ``--source-dir``); the wheel stage checks it before building.
        archive: the verified downloaded file (sdist or released wheel), if any.
        index_url: the ``--index-url`` given (``None``: pip's configured index).
        indexed: the archive is looked up on a simple index (not a pin with its own URL,
            git or ``--source-dir``); :attr:`index` says which.
        fresh: the tree was unpacked by this process just now (its ``tree_sha256`` was
            computed from it, so checking it again before a build proves nothing).
    """

    tree: Path
    layout: Layout
    pin: Pin | None
    upstream_version: Version
    source_date_epoch: int
    key: str
    tree_sha256: str | None = None
    archive: Path | None = None
    index_url: str | None = None
    indexed: bool = False
    fresh: bool = False

    @property
    def index(self) -> IndexChoice | None:
        """The simple index the archive is looked up on and where that choice came from
        (``None`` when it is not looked up on one). Resolved when asked: reading pip's
        configuration starts a process, which a cached build does not need."""
        return resolve_index(self.index_url) if self.indexed else None

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"tree": str(self.tree), "layout": self.layout.kind,
                "pin": self.pin.describe() if self.pin else None,
                "upstream_version": str(self.upstream_version),
                "source_date_epoch": self.source_date_epoch, "key": self.key,
                "index": self.index.describe() if self.index else None}


def fetch_source(target: Target, *, cache: Cache, kind: SourceKind | None = None,
                 index_url: str | None = None, git_url: str | None = None,
                 reporter: Reporter | None = None) -> SourceResult:
    """Fetch and unpack the target's upstream source into the cache.

    Args:
        target: the build target.
        cache: the cache to use.
        kind: ``sdist``, ``wheel`` or ``git`` (default: the target's preferred kind).
        index_url: PEP 503/691 simple index used to find an sdist by its sha256
            (default: the one pip is configured with, see :mod:`builder.core.pipconfig`).
        git_url: use this URL or path instead of the pin's (a mirror of the same history).
        reporter: progress output.

    Returns:
        The verified tree.

    Raises:
        BuilderError: the source is unreachable, its sha256 or commit does not match the
            pin, or the archive is unsafe.
    """
    pin = target.pin(kind)
    if git_url and isinstance(pin, GitPin):
        pin = GitPin(url=git_url, commit=pin.commit)
    return fetch_pin(pin, target.upstream_version, cache=cache, index_url=index_url,
                     reporter=reporter)


def fetch_pin(pin: Pin, version: Version, *, cache: Cache,
              index_url: str | None = None,
              reporter: Reporter | None = None) -> SourceResult:
    """Fetch and unpack one pinned source (see :func:`fetch_source`).

    Args:
        pin: an sdist, wheel or git pin.
        version: the upstream version it is (used for a git pin, which has none).
        cache: the cache to use.
        index_url: simple index used to find archives by sha256.
        reporter: progress output.

    Raises:
        BuilderError: as :func:`fetch_source`.
    """
    reporter = reporter or Reporter(quiet=True)
    if isinstance(pin, GitPin):
        return _fetch_git(pin, version, cache, reporter)
    return _fetch_archive(pin, cache, index_url, reporter)


def local_source(path: Path, upstream_version: str | None = None) -> SourceResult:
    """Describe a tree the user already has (``--source-dir``).

    Args:
        path: an SGLang checkout (git layout) or an unpacked sdist (sdist layout).
        upstream_version: the release it is; default: ``Version`` in the sdist's PKG-INFO.

    Raises:
        BuilderError: the folder is missing, is not an SGLang tree, or has no version; or
            its PKG-INFO names another project, or another release than
            ``upstream_version``.
    """
    tree = path.resolve()
    if not tree.exists():
        raise ConfigurationError(f"source folder {path} does not exist", "check --source-dir")
    if not tree.is_dir():
        raise ConfigurationError(f"{path} is not a folder",
                                 "point --source-dir at a source tree")
    layout = Layout.detect(tree)
    claimed = _pkg_info(layout.package_root(tree))
    if claimed is not None:
        # An unpacked sdist says what it is: never label it as another project or release.
        name, released = claimed
        if name is not None and canonicalize_name(name) != "sglang":
            raise ConfigurationError(f"{path} is {name} (its PKG-INFO), not SGLang",
                                     "point --source-dir at an SGLang checkout or unpacked "
                                     "sdist")
        if upstream_version and _other_release(upstream_version, released):
            raise ConfigurationError(f"{path} is SGLang {released} (its PKG-INFO), not "
                                     f"{upstream_version} (--target / --upstream-version)",
                                     f"point --source-dir at the {upstream_version} tree, or "
                                     f"patch this one as {released} (--upstream-version "
                                     f"{released}, or a target pinned to {released})")
    version_text = upstream_version or (claimed[1] if claimed else None)
    if not version_text:
        raise ConfigurationError(f"cannot tell the upstream version of {path}",
                                 "pass --upstream-version (e.g. 0.5.9)")
    try:
        version = Version(version_text)
    except InvalidVersion:
        raise ConfigurationError(f"{version_text!r} is not a PEP 440 version",
                                 "pass --upstream-version like 0.5.9") from None
    newest = max((p.lstat().st_mtime for p in tree.rglob("*") if ".git" not in p.parts),
                 default=0.0)
    return SourceResult(tree=tree, layout=layout, pin=None, upstream_version=version,
                        source_date_epoch=int(newest),
                        key="dir-" + sha256_tree(tree, exclude=frozenset({".git"})))


def _other_release(given: str, released: str) -> bool:
    """Whether ``given`` names another release than ``released`` (a malformed ``given`` is
    refused by the caller afterwards, with its own message)."""
    try:
        return Version(given) != Version(released)
    except InvalidVersion:
        return False


def _pkg_info(package_root: Path) -> tuple[str | None, str] | None:
    """``(Name, Version)`` of the tree's PKG-INFO (``None``: it has none, or it does not
    parse)."""
    pkg_info = package_root / "PKG-INFO"
    if not pkg_info.is_file():
        return None
    try:
        meta = read_metadata(pkg_info.read_bytes(), str(pkg_info))
    except BuilderError:
        return None
    return (meta.name or None, str(meta.version))


# --- sdist and released wheel ---------------------------------------------------------

def _fetch_archive(pin: SdistPin | WheelPin, cache: Cache, index_url: str | None,
                   reporter: Reporter) -> SourceResult:
    """An sdist or a released wheel, verified and unpacked (both have the sdist layout).

    The archive's own claims are checked against the pin (:mod:`builder.source.archive`)
    before its tree is used; the tree is unpacked into ``<entry>/tree`` so the entry's
    own ``source.json`` never sits inside it.
    """
    archive = _download_pinned(pin, cache, index_url, reporter)
    key = f"{pin.kind}-{pin.sha256}"

    def unpack(tmp: Path) -> dict[str, Any]:
        reporter.info(f"Unpacking {archive.name}")
        if isinstance(pin, SdistPin):
            unpacked = unpack_sdist(archive, tmp / "tree", pin.project, pin.version)
            newest, digest = unpacked.newest, unpacked.tree_sha256
        else:
            check_wheel(archive, pin.project, pin.version)
            newest = unzip_wheel(archive, tmp / "tree")
            digest = sha256_tree(tmp / "tree")
        return {"top": "tree", "rule": UNPACK_RULE, "source_date_epoch": newest,
                "tree_sha256": digest}

    # The tree is not hashed on every read: the wheel stage checks it before it builds.
    entry = cache.artifact("source", key, unpack, record="",
                           valid=lambda meta: meta.get("rule") == UNPACK_RULE,
                           adopt=legacy_entry("source.json"))
    return SourceResult(tree=entry.path / "tree", layout=Layout("sdist"), pin=pin,
                        upstream_version=Version(pin.version),
                        source_date_epoch=int(entry.meta["source_date_epoch"]), key=key,
                        tree_sha256=entry.meta.get("tree_sha256"), archive=archive,
                        index_url=index_url, indexed=not pin.url, fresh=not entry.cached)


def _download_pinned(pin: SdistPin | WheelPin, cache: Cache, index_url: str | None,
                     reporter: Reporter) -> Path:
    """Return the cached archive, downloading (resumably) and verifying it first if needed.

    A damaged entry is never trusted: it is fetched again.
    """
    from builder.source.download import download, partial_lock

    # The partial file lives outside the entry being built, so an interrupted download
    # survives for the next run to resume (builder.source.download).
    partial = cache.root / "partial" / f"{pin.sha256}.{pin.filename}.part"
    held = False

    def fetch(tmp: Path) -> dict[str, Any]:
        url = pin.url or _find_on_index(pin, resolve_index(index_url).url)
        if held:
            download(url, tmp / pin.filename, pin.sha256, partial, reporter)
        else:  # a damaged entry, fetched again: still one writer of the partial file
            with partial_lock(partial, reporter):
                download(url, tmp / pin.filename, pin.sha256, partial, reporter)
        return {"file": pin.filename}

    def made_before_manifests(path: Path) -> dict[str, Any] | None:
        archive = path / pin.filename
        return {"file": pin.filename} \
            if archive.is_file() and sha256_file(archive) == pin.sha256 else None

    def entry() -> CachedArtifact:
        return cache.artifact("downloads", pin.sha256, fetch,
                              record=glob.escape(pin.filename), adopt=made_before_manifests)

    hold_cache(cache.root)  # marked and held before its partial/ folder is made
    if cache.entry("downloads", pin.sha256).is_dir():
        return entry().file(pin.filename)
    # Missing: the lock is held until the entry is in place, so a command that waited
    # for it finds the entry rather than downloading (or renaming away) the file again.
    with partial_lock(partial, reporter):
        held = True
        return entry().file(pin.filename)


def download_pinned(pin: SdistPin | WheelPin, cache: Cache, index_url: str | None,
                    reporter: Reporter) -> Path:
    """The pinned archive's file in the cache, downloaded and verified first if needed.

    Raises:
        BuilderError: the index or URL is unreachable, or the file's sha256 is not the pin's.
    """
    return _download_pinned(pin, cache, index_url, reporter)


def _find_on_index(pin: SdistPin | WheelPin, index_url: str) -> str:
    """Find the URL of the file with the pinned sha256 on a simple index."""
    from builder.source.index import project_files

    page_url, files = project_files(pin.project, index_url)
    for item in files:
        if item.sha256 == pin.sha256:
            if item.name != pin.filename:
                raise VerificationError(f"sha256 {pin.sha256} on {page_url} belongs to {item.name},"
                                        f" not {pin.filename}", "fix the pin in the targets file")
            return item.url
    same_name = [f"{f.name} (sha256 {f.sha256 or 'not listed'})" for f in files
                 if f.name == pin.filename]
    hint = "the release may have been replaced or the pin is wrong; check it before re-pinning"
    message = f"sha256 mismatch: no file on {page_url} has the pinned sha256 {pin.sha256}"
    if same_name:  # the file is there with other bytes: an identity that differs
        raise VerificationError(f"{message}; the index has {same_name[0]}", hint)
    raise SourceError(f"{message}; {pin.filename} is not listed there", hint)


def find_release(project: str, version: str, index_url: str | None = None
                 ) -> SdistPin | WheelPin:
    """Pin a release by what the index lists now (for ``check --versions``).

    Ranks each file on its own (PEP 592: a yanked file is the last choice, whatever else
    of the release is live): a live sdist, then a live pure-Python wheel, then a live
    ``x86_64`` wheel, then any other live wheel, then the yanked files in the same
    order. The sha256 is the index's, verified on download.

    Args:
        project: the project name.
        version: the release (any PEP 440 spelling).
        index_url: the simple index (default: pip's, see :mod:`builder.core.pipconfig`).

    Raises:
        BuilderError: the index is unreachable or lists no usable file for ``version``.
    """
    from builder.source.index import project_files

    page_url, files = project_files(project, resolve_index(index_url).url)
    wanted = Version(version)
    normalized = str(wanted)
    ranked: list[tuple[tuple[int, int, str], SdistPin | WheelPin]] = []
    for item in files:
        if not item.sha256:
            continue
        try:
            if item.name.endswith(".whl"):
                _, file_version, _, tags = parse_wheel_filename(item.name)
                kind = 1 if any(t.abi == "none" and t.platform == "any" for t in tags) else \
                    2 if "x86_64" in item.name else 3
                pin: SdistPin | WheelPin = WheelPin(project, normalized, item.name,
                                                    item.sha256, item.url)
            else:
                _, file_version = parse_sdist_filename(item.name)
                kind = 0
                pin = SdistPin(project, normalized, item.sha256, item.url)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if file_version == wanted:
            ranked.append(((int(item.yanked), kind, item.name), pin))
    if ranked:
        return min(ranked, key=lambda pair: pair[0])[1]
    raise SourceError(f"{page_url} lists no sdist or wheel (with a sha256) for {version}",
                      "check the version number")


@dataclass(frozen=True)
class IndexRelease:
    """One release of a project as a simple index lists it.

    Attributes:
        version: the release's version, read from its file names.
        files: how many sdists and wheels the index lists for it.
        yanked: every one of those files is yanked (PEP 592), so installers skip it.
    """

    version: Version
    files: int
    yanked: bool


def list_releases(project: str, index_url: str | None = None) -> list[IndexRelease]:
    """List a project's releases from its page on a simple index (for ``upstream``).

    Versions are read from the sdist and wheel file names (PEP 691 JSON or PEP 503 HTML
    pages alike; PyPI's legacy ``/pypi/NAME/json`` API is not used); other files and
    names that do not parse are ignored.

    Args:
        project: the project name (any spelling; normalised per PEP 503).
        index_url: the simple index's root URL (default: pip's).

    Returns:
        The releases, oldest first.

    Raises:
        BuilderError: the index is unreachable or answers with an error.
    """
    from builder.source.index import project_files

    _, files = project_files(project, resolve_index(index_url).url)
    found: dict[Version, list[bool]] = {}
    for item in files:
        try:
            if item.name.endswith(".whl"):
                version = parse_wheel_filename(item.name)[1]
            else:
                version = parse_sdist_filename(item.name)[1]
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        found.setdefault(version, []).append(item.yanked)
    return [IndexRelease(version, len(yanks), all(yanks))
            for version, yanks in sorted(found.items())]

# Range requests for a remote wheel's METADATA (seconds per request).
_TIMEOUT_S = 60


def release_files(project: str, version: str | Version,
                  index_url: str | None = None) -> list[tuple[str, str, str, bool]]:
    """The files a simple index lists for one release (for ``bump``).

    Args:
        project: the project name (any spelling; normalised per PEP 503).
        version: the release; files are matched by the version in their names.
        index_url: the simple index's root URL (default: pip's, see
            :mod:`builder.core.pipconfig`).

    Returns:
        ``(file name, URL, sha256 or "", yanked)`` per sdist or wheel of that release,
        sorted by file name.

    Raises:
        BuilderError: the index is unreachable or answers with an error.
    """
    wanted = Version(str(version))
    found = []
    from builder.source.index import project_files

    for item in project_files(project, resolve_index(index_url).url)[1]:
        try:
            file_version = (parse_wheel_filename(item.name)[1] if item.name.endswith(".whl")
                            else parse_sdist_filename(item.name)[1])
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if file_version == wanted:
            found.append((item.name, item.url, item.sha256, item.yanked))
    return sorted(found)


# A METADATA is a few KiB; torch's is under 20 KiB. Anything near this is not one.
MAX_METADATA_BYTES = 1 << 20


def remote_wheel_metadata(url: str, filename: str | None = None) -> email.message.Message:
    """A wheel's ``METADATA``, read with HTTP range requests (the central directory and
    one member), not the whole file: a torch wheel is over 500 MB.

    The member is checked before it is believed: at most :data:`MAX_METADATA_BYTES`, and
    its ``Name`` and ``Version`` are the ones the wheel's file name carries (PEP 427).

    Args:
        url: the wheel's URL (the server must honour ``Range``, as PyPI's does).
        filename: the wheel's file name as the index lists it (default: the URL's last
            path segment).

    Raises:
        BuilderError: the server is unreachable, ignores ranges, the file is not a
            wheel with one ``.dist-info/METADATA``, the member is oversized, or it
            names another project or version than the file name.
    """
    import requests
    from remotezip import RemoteZip, RemoteZipError

    name = filename or file_name(url)
    try:
        project, version = parse_wheel_filename(name)[:2]
    except (InvalidWheelFilename, InvalidVersion):
        raise VerificationError(f"{name} (from {url}) is not a wheel file name",
                                "check the index's file listing") from None
    try:
        with RemoteZip(url, timeout=_TIMEOUT_S) as wheel:
            names = [n for n in wheel.namelist()
                     if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise VerificationError(f"{url} is not a wheel with one .dist-info/METADATA",
                                        "check the index's file listing")
            size = wheel.getinfo(names[0]).file_size
            if size > MAX_METADATA_BYTES:
                raise VerificationError(f"{name}: its METADATA claims {size} bytes (over "
                                        f"{MAX_METADATA_BYTES})", "the file on the index is not "
                                        "a sound wheel; report it to the index's operator")
            data = wheel.read(names[0])
    except zipfile.BadZipFile as exc:
        raise VerificationError(f"{url} is not a sound wheel: {exc}",
                                "the file on the index is damaged; report it to the index's "
                                "operator") from None
    except (RemoteZipError, OSError, requests.RequestException) as exc:
        raise SourceError(f"could not read the METADATA of {url}: {exc}",
                          "the index must serve files with HTTP range requests (PyPI "
                          "does); or pass --cuda-lane") from None
    check_claims(f"{name}: METADATA", read_metadata(data, f"{name}: METADATA"),
                 str(project), str(version))
    import email.parser

    return email.parser.BytesParser().parsebytes(data)


# --- git ---------------------------------------------------------------------------------

def _fetch_git(pin: GitPin, version: Version, cache: Cache,
               reporter: Reporter) -> SourceResult:
    import git

    key = f"git-{pin.commit}"

    def check_out(tmp: Path) -> dict[str, Any]:
        mirror = _mirror_with_commit(pin, cache, reporter)
        try:
            repo = git.Repo.clone_from(str(mirror), str(tmp / "tree"), no_checkout=True)
            repo.git.checkout("--detach", pin.commit)
        except git.GitCommandError as exc:
            raise SourceError(f"cannot check out {pin.commit}: {_git_message(exc)}",
                              "the mirror may be damaged: delete it from the cache") from None
        head = repo.head.commit.hexsha
        if head != pin.commit:
            raise VerificationError(f"checked-out HEAD {head} is not the pin {pin.commit}",
                                    "the mirror may be damaged: delete it from the cache")
        meta = {"source_date_epoch": repo.head.commit.committed_date,
                "tree_sha256": sha256_tree(tmp / "tree", exclude=frozenset({".git"}))}
        repo.close()
        return meta

    entry = cache.artifact("source", key, check_out, record="",
                           adopt=legacy_entry("source.json"))
    tree = entry.path / "tree"
    repo = git.Repo(str(tree))
    head = repo.head.commit.hexsha
    repo.close()
    if head != pin.commit:
        raise VerificationError(f"cached checkout {tree} has HEAD {head}, not {pin.commit}",
                                f"delete {entry.path} and run again")
    return SourceResult(tree=tree, layout=Layout.detect(tree), pin=pin,
                        upstream_version=version,
                        source_date_epoch=int(entry.meta["source_date_epoch"]), key=key,
                        tree_sha256=entry.meta.get("tree_sha256"))


def _git_message(exc: git.GitCommandError) -> str:
    """git's own words: the ``fatal:`` line, else the last line with text in it."""
    lines = [line.strip().strip("'\"").strip() for line in str(exc.stderr or "").splitlines()]
    lines = [line.removeprefix("stderr: ").strip("'\" ") for line in lines if line]
    fatal = [line for line in lines if "fatal:" in line]
    return (fatal or lines or [str(exc)])[-1]


def _has_commit(repo: git.Repo, commit: str) -> bool:
    import git

    try:
        repo.git.cat_file("-e", f"{commit}^{{commit}}")
    except git.GitCommandError:
        return False
    return True


def _mirror_with_commit(pin: GitPin, cache: Cache, reporter: Reporter) -> Path:
    """Clone (or fetch into) the cache mirror of ``pin.url`` until it has the commit."""
    import git

    key = hashlib.sha256(pin.url.encode()).hexdigest()[:32]

    def clone(tmp: Path) -> None:
        reporter.info(f"Cloning {pin.url}")
        try:
            git.Repo.clone_from(pin.url, str(tmp / "mirror.git"), mirror=True).close()
        except git.GitCommandError as exc:
            raise SourceError(f"could not clone {pin.url}: {_git_message(exc)}",
                              "check the URL or path and your network") from None

    # A mirror is fetched into after it is made, so no file of it is recorded.
    mirror = cache.artifact("git", key, clone, record="",
                            adopt=lambda path: {} if (path / "mirror.git").is_dir() else None
                            ).path
    repo = git.Repo(str(mirror / "mirror.git"))
    try:
        if not _has_commit(repo, pin.commit):
            reporter.info(f"Fetching {pin.url}")
            try:
                repo.git.fetch("--prune", "origin")
            except git.GitCommandError as exc:
                raise SourceError(f"could not fetch {pin.url}: {_git_message(exc)}",
                                  "check the URL or path and your network") from None
            if not _has_commit(repo, pin.commit):
                raise SourceError(f"commit {pin.commit} is not in {pin.url}",
                                  "check the pin; it must be a commit of that repository")
    finally:
        repo.close()
    return mirror / "mirror.git"


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, destination)


def link_tree(source: Path, destination: Path) -> None:
    """Mirror a source tree without its ``.git`` folder, hard-linking files where possible.

    Cheap (no file data is copied), and safe as long as files in ``destination`` are only
    ever *replaced* (write to a temporary file, then rename), never rewritten in place:
    a rewrite would change the source too.
    """
    shutil.copytree(source, destination, symlinks=True, copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)


def obtain_source(options: Options, target: Target | None) -> SourceResult:
    """Fetch the target's pinned source, or describe ``--source-dir``.

    Raises:
        BuilderError: see :func:`builder.source.fetch.fetch_source` and
            :func:`builder.source.fetch.local_source`.
    """
    if options.source_dir is not None:
        version = options.upstream_version or (str(target.upstream_version)
                                               if target and options.target else None)
        return local_source(options.source_dir, version)
    if target is None:
        raise ConfigurationError("no source given", "pass --target NAME or --source-dir DIR")
    return fetch_source(target, cache=options.cache, kind=options.source,
                        index_url=options.index_url, git_url=options.git_url,
                        reporter=options.reporter)


def run_fetch(options: Options) -> SourceResult:
    """Source stage for the selected target."""
    return obtain_source(options, select_target(options))

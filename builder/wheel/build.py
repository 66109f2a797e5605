"""Wheel stage: a versioned, reproducible wheel of the patched tree, with provenance.

The wheel is built with the ``build`` package's API in an isolated environment (build
requirements pinned by ``data/build-constraints.txt``) from a pristine copy of the
package folder: setuptools leaves ``build/`` and ``*.egg-info`` behind, and a ``build/``
folder in the working directory shadows the ``build`` package for ``python -m build``.

Version: ``SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG`` (setuptools-scm's per-package
override), never ``git describe``: outside a tagged checkout SGLang's pyproject falls
back to ``0.0.0.dev0`` (measured, see shared/design.md). ``SOURCE_DATE_EPOCH`` (the
reproducible-builds.org convention, honoured by ``wheel``) comes from the upstream
release, so two builds of the same inputs are byte-identical.

Provenance: ``<dist-info>/sm120-provenance.json`` inside the wheel, readable after
install with ``importlib.metadata.distribution("sglang").read_text(PROVENANCE_FILE)``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder.core.cache import (
    Cache,
    atomic_copy,
    legacy_entry,
    sha256_file,
    sha256_json,
    sha256_tree,
)
from builder.core.config import Pin, Target, WheelPin, local_version
from builder.core.errors import BuildError, VerificationError
from builder.core.layout import Layout
from builder.core.lock import VersionLock, lock_path
from builder.core.options import Options, select_target
from builder.core.progress import Reporter
from builder.patching.apply import PatchResult, PatchStatus, apply_series, read_series
from builder.patching.patchfile import ParsedPatch
from builder.patching.series import Series, select_series
from builder.source.archive import read_metadata
from builder.source.fetch import (
    fetch_pin,
    obtain_source,
)
from builder.wheel.repack import (
    record_timestamp,
    refuse_unshipped,
    repack_wheel,
    verify_repack,
    zip_timestamp,
)

PROVENANCE_FILE = "sm120-provenance.json"
#: Raised whenever the builder changes what a wheel holds for the same inputs (the
#: provenance record's fields, the repack rules, the build pins' meaning). It is part of
#: every wheel's content digest in the version lock (builder.core.lock), so a builder that
#: writes other bytes cannot reuse a recorded version. 2: patch descriptions and messages
#: in the provenance.
WHEEL_FORMAT = 2
PACKAGE_NAME = "sglang"
_PRISTINE_IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", ".git", "__pycache__")


@dataclass(frozen=True)
class WheelResult:
    """A built wheel.

    Attributes:
        path: the wheel in the output folder (``dist/``).
        version: the wheel's version (``0.5.9+sm120.1``).
        sha256: hex sha256 of the wheel file.
        provenance: the record stored inside the wheel.
        key: the cache key (hash of every input).
        cached: True when the wheel came from the cache without building.
    """

    path: Path
    version: str
    sha256: str
    provenance: dict[str, Any]
    key: str
    cached: bool

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"path": str(self.path), "version": self.version, "sha256": self.sha256,
                "key": self.key, "cached": self.cached, "provenance": self.provenance}


def builder_version() -> str:
    """Return this builder's version (its installed metadata, else the VERSION file)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-sm120-builder")
    except PackageNotFoundError:
        version_file = Path(__file__).resolve().parents[2] / "VERSION"
        return version_file.read_text().strip() if version_file.is_file() else "unknown"


def build_constraints() -> list[str]:
    """Return the pinned build requirements (``name==version`` lines)."""
    text = resources.files("builder.wheel").joinpath("data/build-constraints.txt").read_text()
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def patch_message(header: str) -> str:
    """The commit message of a patch's header, as ``git am`` reads it.

    A ``git format-patch`` mail gives ``Subject:`` (its ``[PATCH n/m]`` prefix dropped,
    folded lines joined) and the body up to the ``---`` line; the mail headers
    (``From``, ``Date``) and the diffstat are left out. A plain diff's header (any text
    before the first ``diff``/``---`` line) is taken as it is.
    """
    lines = header.splitlines()
    if not any(line.startswith("Subject:") for line in lines):
        return header.strip()
    subject: list[str] = []
    body: list[str] = []
    in_headers, in_subject = True, False
    for line in lines:
        if in_headers:
            if line.startswith("Subject:"):
                subject.append(line[len("Subject:"):].strip())
                in_subject = True
            elif in_subject and line[:1] in (" ", "\t"):
                subject.append(line.strip())  # RFC 2822 folding
            elif not line.strip():
                in_headers = False
            else:
                in_subject = False
            continue
        if line == "---":
            break
        body.append(line)
    title = " ".join(subject)
    if title.startswith("["):
        title = title.split("]", 1)[-1].strip()
    return "\n\n".join(part for part in (title, "\n".join(body).strip()) if part)


def patch_notes(series: Series, parsed: Mapping[Path, ParsedPatch]) -> dict[str, dict[str, str]]:
    """Each series patch's description (series file) and commit message (its header), by
    name."""
    return {entry.name: {"description": entry.description,
                         "commit_message": patch_message(parsed[entry.path].header)
                         if entry.path in parsed else ""}
            for entry in series.entries}


def _provenance(patched: PatchResult, version: str, target: str | None,
                requirements: Mapping[str, str],
                notes: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    source = patched.source
    upstream = source.pin.describe() if source.pin else {"kind": "dir", "key": source.key}
    report = patched.report.to_json()
    for patch in report["patches"]:
        note = (notes or {}).get(patch["name"], {})
        # beside the report's own "message" (the status note, e.g. "declared for ...")
        patch["description"] = note.get("description", "")
        patch["commit_message"] = note.get("commit_message", "")
    return {
        "schema": 1,
        "builder": {"name": "sglang-sm120-builder", "version": builder_version()},
        "target": target,
        "version": version,
        "upstream": upstream,
        "upstream_version": str(source.upstream_version),
        "source_date_epoch": source.source_date_epoch,
        "patches": report["patches"],
        "intents": report["intents"],
        "build_requirements": dict(sorted(requirements.items())),
    }


def _runner(extra: Mapping[str, str], log: Path) -> Any:
    def run(cmd: Sequence[str], cwd: str | None = None,
            extra_environ: Mapping[str, str] | None = None) -> None:
        env = {**os.environ, **(extra_environ or {}), **extra}
        with log.open("ab") as handle:
            subprocess.run(cmd, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT,
                           check=True)
    return run


def _tail(log: Path, lines: int = 15) -> str:
    if not log.is_file():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _run_build(package_root: Path, out_dir: Path, env_vars: Mapping[str, str],
               log: Path) -> tuple[Path, dict[str, str]]:
    """Build one wheel in an isolated environment; return it and the build requirements."""
    import build  # here, not at the top: a cached build never needs it
    import build.env

    constraints = build_constraints()
    try:
        with warnings.catch_warnings(record=True) as caught, \
                build.env.DefaultIsolatedEnv() as env:
            warnings.simplefilter("always")
            builder = build.ProjectBuilder.from_isolated_env(env, package_root,
                                                             runner=_runner(env_vars, log))
            env.install(builder.build_system_requires, constraints)
            extra = builder.get_requires_for_build("wheel")
            env.install(extra, constraints)
            installed = env.installed_versions([*builder.build_system_requires, *extra])
            wheel_path = Path(builder.build("wheel", out_dir))
        with log.open("a") as handle:  # the backend's warnings belong in the log, not on screen
            handle.writelines(f"warning: {w.message}\n" for w in caught)
    except (build.BuildException, build.BuildBackendException,
            subprocess.CalledProcessError) as exc:
        raise BuildError(f"building the wheel failed: {exc}\n{_tail(log)}",
                         f"full log: {log}") from None
    return wheel_path, installed


def _metadata_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist()
                 if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise BuildError(f"{wheel.name} has {len(names)} METADATA files",
                             "the build backend produced a broken wheel; see its log")
        metadata = archive.read(names[0])
    return str(read_metadata(metadata, f"{wheel.name}: METADATA").version)


def _add_provenance(built: Path, destination: Path, record: dict[str, Any],
                    epoch: int) -> None:
    """Rewrite ``built`` to ``destination`` with the provenance file added to dist-info.

    Entries keep their order and timestamps; modes become 0644 (0755 if executable
    before); RECORD is regenerated by ``wheel``.
    """
    from wheel.wheelfile import WheelFile  # here: a cached build never writes a wheel

    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    with record_timestamp(epoch), zipfile.ZipFile(built) as source, \
            WheelFile(destination, "w") as target:
        dist_info = target.dist_info_path
        for info in source.infolist():
            if info.filename == target.record_path:
                continue
            # Modes from the build folder follow the umask; fix them so the bytes don't.
            executable = (info.external_attr >> 16) & 0o111
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            target.writestr(info, source.read(info))
        stamp = zipfile.ZipInfo(f"{dist_info}/{PROVENANCE_FILE}",
                                date_time=zip_timestamp(epoch))
        stamp.compress_type = zipfile.ZIP_DEFLATED
        stamp.external_attr = 0o644 << 16
        target.writestr(stamp, data)


def verify_tree(patched: PatchResult) -> None:
    """Check the cached trees behind ``patched`` before building from them.

    Raises:
        BuilderError: the source's or the patched tree's files no longer match the digest
            recorded when the cache entry was made (someone edited the cache).
    """
    # A source tree this process unpacked moments ago was hashed as it was written.
    source_recorded = None if patched.source.fresh else patched.source.tree_sha256
    for tree, recorded in ((patched.source.tree, source_recorded),
                           (patched.tree, patched.tree_sha256)):
        if recorded is not None and \
                sha256_tree(tree, exclude=frozenset({".git"})) != recorded:
            raise BuildError(f"the cache entry {tree} was modified after it was made",
                             f"delete {tree.parent} and run again; never edit the cache "
                             "(use --source-dir for a tree of your own)")


def build_wheel(patched: PatchResult, *, version: str, cache: Cache, dist_dir: Path,
                target: str | None = None, reporter: Reporter | None = None,
                notes: Mapping[str, Mapping[str, str]] | None = None) -> WheelResult:
    """Build the patched tree's wheel, or take it from the cache, and copy it to ``dist_dir``.

    A tree from an sdist or git is built with ``build``; a tree from a released wheel
    (no sdist upstream) is repacked (:mod:`builder.wheel.repack`).

    Args:
        patched: the patch stage's result.
        version: the full version (``<upstream>+<local label>``).
        cache: the cache; the wheel's entry is keyed by every input's hash.
        dist_dir: output folder; only a complete, verified wheel is ever copied there.
        target: the target's name, recorded in the provenance.
        reporter: progress output.
        notes: each patch's description and message by file name, for the provenance
            (:func:`patch_notes`).

    Returns:
        The wheel in ``dist_dir``.

    Raises:
        BuilderError: the build failed (the message ends with the log's tail), or the
            built file's name or METADATA version is not ``version``.
    """
    reporter = reporter or Reporter(quiet=True)
    if dist_dir.exists() and not dist_dir.is_dir():
        raise BuildError(f"{dist_dir} is not a folder", "pass --dist a folder for the wheels")
    epoch = patched.source.source_date_epoch
    # Every input of the wheel's bytes: the tree, the version, the time, the tools, and
    # the report and target that go into the provenance record.
    key = sha256_json({"patched": patched.key, "version": version, "epoch": epoch,
                       "builder": builder_version(), "constraints": build_constraints(),
                       "target": target, "report": patched.report.to_json(),
                       "notes": notes or {}, "format": WHEEL_FORMAT,
                       "upstream": patched.source.pin.describe() if patched.source.pin
                       else patched.source.key})

    def repack(tmp: Path) -> dict[str, Any]:
        verify_tree(patched)
        with reporter.working(f"Repacking {PACKAGE_NAME} {version} from the upstream wheel"):
            record = _provenance(patched, version, target, {}, notes)
            archive = patched.source.archive
            assert archive is not None
            repacked = repack_wheel(
                archive, patched.tree, version, PROVENANCE_FILE,
                (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(),
                epoch, tmp)
            verify_repack(archive, repacked)
        return {"file": repacked.path.name, "provenance": record}

    def build(tmp: Path) -> dict[str, Any]:
        verify_tree(patched)
        pristine = tmp / "src"
        shutil.copytree(patched.layout.package_root(patched.tree), pristine,
                        symlinks=True, ignore=_PRISTINE_IGNORE)
        env_vars = {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG": version,
                    "SOURCE_DATE_EPOCH": str(epoch)}
        with reporter.working(f"Building {PACKAGE_NAME} {version} wheel"):
            built, requirements = _run_build(pristine, tmp / "out", env_vars,
                                             tmp / "build.log")
        name, built_version, _, _ = parse_wheel_filename(built.name)
        if name != PACKAGE_NAME or built_version != Version(version) or \
                _metadata_version(built) != version:
            raise BuildError(f"built {built.name} (METADATA {_metadata_version(built)})"
                             f" but expected {PACKAGE_NAME} {version}",
                             "is SETUPTOOLS_SCM_PRETEND_VERSION honoured by this "
                             "release's pyproject?")
        record = _provenance(patched, version, target, requirements, notes)
        _add_provenance(built, tmp / built.name, record, epoch)
        shutil.rmtree(pristine)
        shutil.rmtree(tmp / "out")
        return {"file": built.name, "provenance": record}

    # A damaged wheel is never shipped: it is built again.
    entry = cache.artifact("wheel", key,
                           repack if isinstance(patched.source.pin, WheelPin) else build,
                           record="*.whl", adopt=legacy_entry(
                               "wheel.json", lambda meta: {meta["file"]: meta["sha256"]}))
    name = entry.meta["file"]
    destination = entry.copy_to(name, dist_dir)
    return WheelResult(path=destination, version=version, sha256=entry.files[name].sha256,
                       provenance=entry.meta["provenance"], key=key, cached=entry.cached)


def wheel_content_digest(target: Target, series: Series,
                         notes: Mapping[str, Mapping[str, str]]) -> str:
    """The sha256 of what decides the content of a target's wheel(s), for the version lock.

    Read from the configuration alone (no download): the upstream pins (sha256 or
    commit), the upstream version, every patch of the series that applies to it (file
    name, sha256, strip level, fuzz limit, intent checks, description and message), the
    pinned build requirements and the builder's output format (:data:`WHEEL_FORMAT`).
    The local label is not an input: it is what the lock keys the digest by.

    Args:
        target: the target.
        series: the series its wheel is built with.
        notes: :func:`patch_notes` of that series.

    Returns:
        Hex sha256.
    """
    version = target.upstream_version
    patches = [{"file": e.name, "sha256": e.sha256, "strip": e.strip,
                "max_fuzz": e.fuzz_limit(version)[0],
                "intents": [i.describe() for i in e.intents],
                **notes.get(e.name, {})}
               for e in series.entries if e.applies_to(version)]
    return sha256_json({"format": WHEEL_FORMAT, "upstream_version": str(version),
                        # a pin's URL says where, not what: its sha256 or commit decides
                        "pins": [{k: v for k, v in p.describe().items() if k != "url"}
                                 for p in target.sources], "prefer": target.prefer,
                        "patches": patches, "constraints": build_constraints()})


def lock_wheel(options: Options, target: Target, series: Series,
               notes: Mapping[str, Mapping[str, str]]) -> tuple[VersionLock, str] | None:
    """Refuse a target wheel whose version is recorded with other content in the lock.

    Returns:
        The lock and the digest to record once the wheel is built, or ``None`` for a
        build the lock does not cover (``--source-dir`` or ``--patch``: the tree or the
        patch is not pinned, so its content has no digest to keep).

    Raises:
        BuilderError: the lock records another digest for this target and version.
    """
    if options.source_dir is not None or options.patch is not None:
        options.reporter.info("not checked against versions.lock: --source-dir or --patch "
                              "builds an unpinned wheel; never publish it")
        return None
    lock = VersionLock(lock_path(options.targets_file))
    digest = wheel_content_digest(target, series, notes)
    lock.require("wheel", target.name, target.version, digest)
    return lock, digest


UPSTREAM_PROVENANCE_SUFFIX = ".sm120-provenance.json"


def upstream_wheel(patched: PatchResult, pin: WheelPin, *, target: str | None,
                   dist_dir: Path,
                   notes: Mapping[str, Mapping[str, str]] | None = None) -> WheelResult:
    """Ship upstream's released wheel unchanged, for a release no patch changes.

    Every patch of the series is obsolete, already applied or outside its range there,
    so a repack would be upstream's files under our label. Instead the wheel is
    upstream's own: the downloaded file, sha256-checked against the pin, its name and
    version untouched (``0.5.23``, no local label). Nothing can be added inside it, so
    the provenance record (the same schema, with ``"wheel": "upstream"``) is written
    beside it as ``<wheel file name>.sm120-provenance.json``.

    Raises:
        BuilderError: the cached download no longer matches the pin's sha256.
    """
    archive = patched.source.archive
    if archive is None or sha256_file(archive) != pin.sha256:
        raise VerificationError(f"the download of {pin.filename} does not match its pin "
                                f"{pin.sha256}", "delete it from the cache and run again")
    version = str(patched.source.upstream_version)
    record = {**_provenance(patched, version, target, {}, notes), "wheel": "upstream"}
    destination = dist_dir / pin.filename
    atomic_copy(archive, destination)
    sidecar = dist_dir / (pin.filename + UPSTREAM_PROVENANCE_SUFFIX)
    temporary = sidecar.with_name(sidecar.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    temporary.replace(sidecar)
    return WheelResult(path=destination, version=version, sha256=sha256_file(destination),
                       provenance=record, key=f"upstream-{pin.sha256}", cached=True)


def run_wheel(options: Options) -> WheelResult:
    """Source, patch and wheel stages for the selected target's first pin of its kind."""
    return run_wheels(options)[0]


def run_wheels(options: Options) -> list[WheelResult]:
    """Source, patch and wheel stages for the selected target; the wheels land in dist.

    A target built from released wheels (no sdist upstream) may pin one wheel per
    platform and Python tag: each is patched and repacked. Otherwise one wheel is built.

    Raises:
        BuilderError: any stage refused; or no patch of the series changes this
            upstream version and its source is not a released wheel (for a released
            wheel, upstream's own file is shipped: :func:`upstream_wheel`); or, for
            released wheels, a patch touches compiled code or a build file; or the
            version lock records other content for this version (:func:`lock_wheel`).
    """
    target = select_target(options)
    series = select_series(options, target)
    parsed = read_series(series)  # a bad series fails before any download
    notes = patch_notes(series, parsed)
    locked = lock_wheel(options, target, series, notes)  # before any download, too
    kind = options.source or target.prefer
    if options.source_dir is not None:
        pins: list[Pin | None] = [None]
    elif kind == "wheel":
        pins = [p for p in target.sources if p.kind == "wheel"] or [target.pin(kind)]
        for entry in series.entries:
            if entry.applies_to(target.upstream_version):
                for file_patch in parsed[entry.path].files:
                    tree_path = Layout("sdist").tree_path(file_patch.path)
                    refuse_unshipped(tree_path or file_patch.path)
    else:
        pins = [target.pin(kind)]
    results = []
    for pin in pins:
        if pin is None:
            source = obtain_source(options, target)
        else:
            source = fetch_pin(pin, target.upstream_version, cache=options.cache,
                               index_url=options.index_url, reporter=options.reporter)
        patched = apply_series(source, series, cache=options.cache)
        if not any(p.status == PatchStatus.APPLIED for p in patched.report.patches):
            # Nothing to change: the honest wheel is upstream's own (docs/upstream.md).
            if isinstance(pin, WheelPin):
                results.append(upstream_wheel(patched, pin, target=target.name,
                                              dist_dir=options.dist_dir, notes=notes))
                continue
            raise BuildError(f"no patch of the series changes upstream "
                             f"{source.upstream_version}: the wheel would be upstream's "
                             "under our label", "pin the release's own wheels (python -m "
                             "builder add-target does), which are then shipped unchanged; or "
                             "check the series' version ranges", report=patched.report)
        version = local_version(source.upstream_version, target.local_label)
        results.append(build_wheel(patched, version=version, cache=options.cache,
                                   dist_dir=options.dist_dir, target=target.name,
                                   reporter=options.reporter, notes=notes))
    if locked is not None:
        lock, digest = locked
        if lock.record("wheel", target.name, target.version, digest):
            options.reporter.info(f"recorded {target.version} of {target.name} in {lock.path}")
    return results

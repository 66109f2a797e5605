"""The targets file, parsed once into typed objects, and the TOML helpers both files use.

``targets.toml`` declares build targets (upstream pins, series, local version label,
CUDA lane, SM arch list). A series file (``patches/series.toml``) lists patches in order
with their pins and policy. Both are validated here; every later stage takes the typed
objects and never reads the files again.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.core.errors import ConfigurationError
from builder.core.userfiles import read_input

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

SourceKind = Literal["sdist", "wheel", "git"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("sdist", "wheel", "git")

SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# PEP 440 local version label: alphanumerics separated by dots.
#: A local label as the targets file takes it: PEP 440 local version segments, lowercase
#: (the normal form), e.g. ``sm120.1``. ``add-target --local-label`` is checked against it too.
LOCAL_LABEL = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")
_ARCH = re.compile(r"^\d+\.\d+[af]?$")


@dataclass(frozen=True)
class SdistPin:
    """An sdist on a package index, pinned by sha256.

    Attributes:
        project: the index project name (``sglang``).
        version: the release version (``0.5.9``).
        sha256: hex sha256 of the ``.tar.gz``; the file is found on the index by it.
        url: optional direct URL (``https://``, ``http://`` or ``file://``); when absent
            the index's JSON simple API (PEP 691) is asked for the file with this sha256.
    """

    project: str
    version: str
    sha256: str
    url: str | None = None
    kind: SourceKind = field(default="sdist", init=False)

    @property
    def filename(self) -> str:
        """The sdist file name per the sdist spec: ``{normalized name}-{version}.tar.gz``."""
        return f"{canonicalize_name(self.project).replace('-', '_')}-{self.version}.tar.gz"

    def describe(self) -> dict[str, Any]:
        """Return the pin as JSON-ready data (for reports and provenance)."""
        return {"kind": "sdist", "project": self.project, "version": self.version,
                "sha256": self.sha256, "url": self.url}


@dataclass(frozen=True)
class GitPin:
    """A git repository pinned by a full 40-hex commit (a tag or branch is never a pin).

    Attributes:
        url: any URL or local path git can clone from.
        commit: the full lowercase 40-hex commit id.
    """

    url: str
    commit: str
    kind: SourceKind = field(default="git", init=False)

    def describe(self) -> dict[str, Any]:
        """Return the pin as JSON-ready data (for reports and provenance)."""
        return {"kind": "git", "url": self.url, "commit": self.commit}


@dataclass(frozen=True)
class WheelPin:
    """A released wheel on a package index, pinned by file name and sha256.

    From 0.5.11 on SGLang publishes no sdist, only binary wheels; their Python files
    are the repository's ``python/`` folder, like an sdist's.

    Attributes:
        project: the index project name.
        version: the release version.
        filename: the wheel's file name (one platform / Python tag).
        sha256: hex sha256 of that file.
        url: optional direct URL; otherwise found on the index by sha256.
    """

    project: str
    version: str
    filename: str
    sha256: str
    url: str | None = None
    kind: SourceKind = field(default="wheel", init=False)

    def describe(self) -> dict[str, Any]:
        """Return the pin as JSON-ready data (for reports and provenance)."""
        return {"kind": "wheel", "project": self.project, "version": self.version,
                "filename": self.filename, "sha256": self.sha256, "url": self.url}


Pin = SdistPin | WheelPin | GitPin


def local_version(upstream: Version | str, label: str) -> str:
    """Our version of an upstream release: ``<upstream>+<label>``, or, when upstream's
    version already has a local label (``0.5.11+cu130``), ours appended to it with a dot
    (``0.5.11+cu130.sm120.1``): PEP 440 allows one ``+`` only.

    Args:
        upstream: upstream's version.
        label: our local label (``sm120.1``).

    Returns:
        The version, checked with ``packaging``.

    Raises:
        BuilderError: the result is not a valid PEP 440 version.
    """
    base = str(upstream)
    version = f"{base}.{label}" if "+" in base else f"{base}+{label}"
    try:
        Version(version)
    except InvalidVersion:
        raise ConfigurationError(f"{version!r} (upstream {base} with local label {label!r}) is not "
                                 "a PEP 440 version", "fix upstream_version or local_label in the "
                                 "targets file") from None
    return version


# An OCI tag (distribution-spec): what the image stage turns our version into.
_OCI_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class Target:
    """One build target from the targets file.

    Attributes:
        name: the target's name (``sglang-0.5.9``).
        upstream_version: the upstream release version the pins point at.
        local_label: PEP 440 local version label (``sm120.1``).
        series: path of the patch series file.
        sources: the pins, in order of preference; at least one.
        prefer: which source kind to use unless the user asks for another.
        cuda_lane: CUDA ``major.minor`` used by the kernel stage by default (``12.9``).
        arch_list: SM arch list for the kernel stage (``("12.0a",)``).
        extra_cuda_lanes: further CUDA lanes the target may be built for (``("13.0",)``).
        kernel_groups: FlashInfer module groups for the kernel wheel (``None``: the
            kernel stage's default set).
        head_dims: head dimensions of the target's models, for the attention modules
            (``None``: the kernel stage's default).
    """

    name: str
    upstream_version: Version
    local_label: str
    series: Path
    sources: tuple[Pin, ...]
    prefer: SourceKind
    cuda_lane: str
    arch_list: tuple[str, ...]
    extra_cuda_lanes: tuple[str, ...] = ()
    kernel_groups: tuple[str, ...] | None = None
    head_dims: tuple[int, ...] | None = None

    @property
    def cuda_lanes(self) -> tuple[str, ...]:
        """Every CUDA lane of the target, the default first."""
        return (self.cuda_lane, *self.extra_cuda_lanes)

    def lane(self, requested: str | None) -> str:
        """``requested`` if it is one of the target's lanes, else its default lane.

        Raises:
            BuilderError: ``requested`` is not one of the target's lanes.
        """
        lane = requested or self.cuda_lane
        if lane not in self.cuda_lanes:
            raise ConfigurationError(f"target {self.name} is built for CUDA "
                                     f"{', '.join(self.cuda_lanes)}, not {lane}",
                                     "add the lane to extra_cuda_lanes in the targets file")
        return lane

    @property
    def version(self) -> str:
        """The version our wheel carries (see :func:`local_version`)."""
        return local_version(self.upstream_version, self.local_label)

    @property
    def sdist_project(self) -> str:
        """The index project name of the target's sdist or wheel pins (``sglang``)."""
        return next((p.project for p in self.sources if not isinstance(p, GitPin)), "sglang")

    def pin(self, kind: SourceKind | None = None) -> Pin:
        """Return the first pin of ``kind`` (default: the preferred kind).

        Raises:
            BuilderError: the target declares no source of that kind.
        """
        wanted = kind or self.prefer
        for pin in self.sources:
            if pin.kind == wanted:
                return pin
        declared = ", ".join(sorted({p.kind for p in self.sources}))
        raise ConfigurationError(
            f"target {self.name!r} declares no {wanted} source (it has: {declared})",
            "add a [[target.source]] of that kind to the targets file, "
            "or choose another with --source")

    def describe(self) -> dict[str, Any]:
        """Return the target as JSON-ready data."""
        return {"name": self.name, "upstream_version": str(self.upstream_version),
                "version": self.version, "local_label": self.local_label,
                "series": str(self.series), "prefer": self.prefer,
                "sources": [p.describe() for p in self.sources],
                "cuda_lane": self.cuda_lane, "cuda_lanes": list(self.cuda_lanes),
                "arch_list": list(self.arch_list),
                "kernel_groups": list(self.kernel_groups) if self.kernel_groups else None,
                "head_dims": list(self.head_dims) if self.head_dims else None}


@dataclass(frozen=True)
class TargetsFile:
    """The parsed targets file.

    Attributes:
        path: where it was read from.
        default: the name of the default target.
        targets: targets by name, in file order.
    """

    path: Path
    default: str
    targets: dict[str, Target]

    def get(self, name: str | None) -> Target:
        """Return target ``name`` (``None``: the default target).

        Raises:
            BuilderError: no target has that name; the message lists the known ones.
        """
        wanted = name or self.default
        try:
            return self.targets[wanted]
        except KeyError:
            known = ", ".join(self.targets)
            raise ConfigurationError(
                f"unknown target {wanted!r} in {self.path}",
                f"known targets: {known} (python -m builder targets)") from None


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML table in the user's file ``path`` (read by :func:`read_input`: a named
    pipe, a folder or a device is refused without waiting).

    Raises:
        ConfigurationError: the file is missing or not a file, not UTF-8, or not TOML.
    """
    data = read_input(path, what, "check the path; the commands find targets.toml in the "
                      "current folder or the nearest one above, or take --targets-file FILE "
                      "(series paths are relative to the file naming them)")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{what} {path} is not valid TOML: {exc}",
                                 "fix the syntax error at the position shown") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 (TOML 1.0, "Spec")
        raise ConfigurationError(f"{what} {path} is not UTF-8 text (byte {exc.start}: "
                                 f"{exc.reason})", "save it as UTF-8") from None


FORMAT_HINT = ("see docs/patches.md (Adding a patch, Pinning a new release) for the file "
               "format")


def is_integer(value: Any) -> bool:
    """True for a TOML integer; a TOML boolean (Python's ``bool`` is an ``int``) is not one."""
    return isinstance(value, int) and not isinstance(value, bool)


def require(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """Return ``table[key]`` if it is present and of type ``kind``.

    ``kind=int`` refuses booleans: ``strip = true`` is a mistake, not the number 1.

    Raises:
        BuilderError: the key is missing or holds another type.
    """
    if key not in table:
        raise ConfigurationError(f"{where}: missing key {key!r}", FORMAT_HINT)
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        noun = {str: "a string", int: "an integer", list: "an array"}.get(kind, kind.__name__)
        raise ConfigurationError(f"{where}: {key!r} must be {noun}, got {value!r}",
                                 FORMAT_HINT)
    return value




def known_keys(table: Any, allowed: set[str], where: str) -> dict[str, Any]:
    """Refuse a non-table or a key nobody reads (a typo would silently do nothing)."""
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where}: expected a table, got {table!r}",
                                 "use [[...]] for arrays of tables; " + FORMAT_HINT)
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigurationError(f"{where}: unknown key(s) {', '.join(unknown)}",
                                 f"known keys: {', '.join(sorted(allowed))}")
    return table


def table_array(table: dict[str, Any], key: str, where: str) -> list[Any]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise ConfigurationError(f"{where}: {key!r} must be an array of tables ([[...{key}]])",
                                 FORMAT_HINT)
    return value


def specifier(text: str, where: str) -> SpecifierSet:
    clauses = [c.strip() for c in text.split(",")]
    if not text.strip() or not all(clauses):
        raise ConfigurationError(f"{where}: version range {text!r} is empty or has an empty clause",
                                 "write it like '>=0.5.7,<0.5.11'")
    # here, not at the top: `targets` and a no-op rebuild never parse a range (~3 ms)
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ConfigurationError(f"{where}: {text!r} is not a PEP 440 version range",
                                 "write it like '>=0.5.7,<0.5.11'") from None


def normalized_version(text: str, where: str) -> str:
    """``text`` as a PEP 440 normalized version (``0.5.10-post1`` -> ``0.5.10.post1``).

    File names are built from pins (the sdist spec and PEP 427 use the normalized form),
    so a pin's spelling never reaches a file name.

    Raises:
        BuilderError: ``text`` is not a PEP 440 version.
    """
    try:
        return str(Version(text))
    except InvalidVersion:
        raise ConfigurationError(f"{where}: version {text!r} is not a PEP 440 version",
                                 "write it like 0.5.9 or 0.5.10.post1") from None


GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
"""The URL schemes a git pin may use (git's own transports); a bare path or scp-like
``host:path`` is one too."""


_HELPER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")  # git's TRANSPORT::ADDRESS


def git_url(url: str, where: str) -> str:
    """``url`` if it is a repository address git reaches by one of its own transports.

    Refused: an empty URL, a remote helper's ``TRANSPORT::ADDRESS`` (``ext::`` runs any
    command; git documents it as unsafe, gitremote-helpers(7), and GitPython refuses it
    with ``UnsafeProtocolError``), an option-like ``-...``, and a ``SCHEME://`` other than
    GIT_SCHEMES.

    Args:
        url: the URL or path as the user wrote it.
        where: where it was written, for the message ("" for none).

    Returns:
        ``url`` unchanged.

    Raises:
        ConfigurationError: it is none of those.
    """
    hint = f"give an {'/'.join(GIT_SCHEMES)} URL, host:path, or a local path"
    at = f"{where}: " if where else ""
    scheme, sep, _ = url.partition("://")
    if not url.strip() or url.startswith("-") or _HELPER.match(url) or "\0" in url:
        raise ConfigurationError(f"{at}{url!r} is not a git repository address", hint)
    if sep and scheme.lower() not in GIT_SCHEMES:
        raise ConfigurationError(f"{at}git URL scheme {scheme!r} is not one of git's own "
                                 "transports", hint)
    return url


def _parse_source(table: Any, where: str) -> Pin:
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where}: expected a table, got {table!r}",
                                 "use [[target.source]]; " + FORMAT_HINT)
    kind = require(table, "kind", str, where)
    if kind in _SOURCE_KEYS:
        known_keys(table, _SOURCE_KEYS[kind], where)
    if kind in ("sdist", "wheel"):
        sha = require(table, "sha256", str, where).lower()
        if not SHA256.match(sha):
            raise ConfigurationError(f"{where}: sha256 {sha!r} is not 64 hex digits",
                                     "copy the sha256 from the index's file listing")
        url = table.get("url")
        if url is not None and not isinstance(url, str):
            raise ConfigurationError(f"{where}: 'url' must be a string", "quote the URL")
        project = require(table, "project", str, where)
        version = normalized_version(require(table, "version", str, where), where)
        if kind == "sdist":
            return SdistPin(project=project, version=version, sha256=sha, url=url)
        filename = require(table, "filename", str, where)
        if not filename.endswith(".whl"):
            raise ConfigurationError(f"{where}: wheel filename {filename!r} does not end in .whl",
                                     "copy the wheel's file name from the index")
        try:  # PEP 427 file name: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl
            file_name, file_version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            raise ConfigurationError(f"{where}: {filename!r} is not a valid wheel file name",
                                     "copy the wheel's file name from the index") from None
        if file_name != canonicalize_name(project) or file_version != Version(version):
            raise ConfigurationError(f"{where}: wheel {filename} is {file_name} {file_version}, "
                                     f"but the pin says {project} {version}",
                                     "make the pin's project and version match the file name")
        return WheelPin(project=project, version=version, filename=filename, sha256=sha,
                        url=url)
    if kind == "git":
        commit = require(table, "commit", str, where)
        if not _COMMIT.match(commit):
            raise ConfigurationError(
                f"{where}: git pin {commit!r} is not a full 40-hex commit id",
                "a tag or branch can move; pin the commit (git rev-parse TAG^{commit})")
        return GitPin(url=git_url(require(table, "url", str, where), where), commit=commit)
    raise ConfigurationError(f"{where}: unknown source kind {kind!r}",
                             f"use one of: {', '.join(SOURCE_KINDS)}")


TARGET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
"""A target's name: also a file name (``images/profiles/NAME.toml``), never a path."""

_TARGET_KEYS = {"name", "upstream_version", "local_label", "series", "prefer", "cuda_lane",
                "extra_cuda_lanes", "arch_list", "source", "kernels"}
_KERNEL_KEYS = {"groups", "head_dims"}
_LANE = re.compile(r"^\d+\.\d+$")
_SOURCE_KEYS = {"sdist": {"kind", "project", "version", "sha256", "url"},
                "wheel": {"kind", "project", "version", "filename", "sha256", "url"},
                "git": {"kind", "url", "commit"}}


def _identity(table: dict[str, Any], where: str) -> tuple[str, Version, str, str]:
    """The target's name, upstream version and local label, checked: ``(name, upstream,
    label, where)`` with ``where`` naming the target.

    Raises:
        ConfigurationError: one is missing or malformed, or they make no valid image tag.
    """
    name = require(table, "name", str, where)
    if not TARGET_NAME.match(name):
        # The name is a file name too (images/profiles/NAME.toml) and a part of tags.
        raise ConfigurationError(f"{where}: target name {name!r} is not a plain name",
                                 "use letters, digits and . _ - (at most 100, starting with a "
                                 "letter or digit), e.g. sglang-0.5.23")
    where = f"{where} (target {name!r})"
    try:
        upstream = Version(require(table, "upstream_version", str, where))
    except InvalidVersion:
        raise ConfigurationError(f"{where}: upstream_version is not a PEP 440 version",
                                 "write it like 0.5.9 or 0.5.10.post1") from None
    label = require(table, "local_label", str, where)
    if not LOCAL_LABEL.match(label):
        raise ConfigurationError(f"{where}: local_label {label!r} is not a PEP 440 local label",
                                 "use lowercase letters and digits separated by dots, e.g. sm120.1")
    # Every version written from here on (wheel name, METADATA, image tag and label) is
    # made from these two: checked now, before any work starts.
    version = local_version(upstream, label)
    if not _OCI_TAG.fullmatch(version.replace("+", "-") + "-cu000"):
        raise ConfigurationError(f"{where}: version {version} makes no valid image tag",
                                 "shorten upstream_version or local_label")
    return name, upstream, label, where


def _target_sources(table: dict[str, Any], upstream: Version, where: str
                    ) -> tuple[tuple[Pin, ...], SourceKind]:
    """The target's sources and the preferred kind.

    Raises:
        ConfigurationError: none is declared, ``prefer`` is not a kind, or a pinned
            version differs from ``upstream``.
    """
    sources = tuple(_parse_source(s, f"{where} source #{i}")
                    for i, s in enumerate(table_array(table, "source", where), 1))
    if not sources:
        raise ConfigurationError(f"{where}: declares no source", "add a [[target.source]] table")
    prefer = table.get("prefer", sources[0].kind)
    if prefer not in SOURCE_KINDS:
        raise ConfigurationError(f"{where}: prefer must be one of {', '.join(SOURCE_KINDS)}",
                                 "name the kind of one of the target's [[target.source]] tables")
    for pin in sources:
        if not isinstance(pin, GitPin) and Version(pin.version) != upstream:
            raise ConfigurationError(f"{where}: {pin.kind} version {pin.version} differs from "
                                     f"upstream_version {upstream}", "make them agree")
    return sources, cast(SourceKind, prefer)


def _arch_and_lanes(table: dict[str, Any], where: str) -> tuple[tuple[str, ...], list[str]]:
    """The target's arch list and CUDA lanes (its own first).

    Raises:
        ConfigurationError: an arch or lane is malformed, or a lane is listed twice.
    """
    arch_list = tuple(require(table, "arch_list", list, where))
    for arch in arch_list:
        if not isinstance(arch, str) or not _ARCH.match(arch):
            raise ConfigurationError(f"{where}: arch {arch!r} is not like '12.0a' or '12.0f'",
                                     "12.0a for FlashInfer <= 0.6.6, 12.0f from 0.6.7")
    lanes = [require(table, "cuda_lane", str, where),
             *table.get("extra_cuda_lanes", [])]
    for lane in lanes:
        if not isinstance(lane, str) or not _LANE.match(lane):
            raise ConfigurationError(f"{where}: CUDA lane {lane!r} is not like '12.9'",
                                     "write CUDA's major.minor as a string")
    if len(set(lanes)) != len(lanes):
        raise ConfigurationError(f"{where}: a CUDA lane is listed twice", "list each lane once")
    return arch_list, lanes


def _kernel_options(table: dict[str, Any], where: str
                    ) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None]:
    """``[target.kernels]``: its module groups and head dims (``None`` when not given).

    Raises:
        ConfigurationError: an unknown key, or a list that is empty or of the wrong items.
    """
    kernels = known_keys(table.get("kernels", {}), _KERNEL_KEYS, f"{where} [target.kernels]")
    groups = kernels.get("groups")
    head_dims = kernels.get("head_dims")
    if groups is not None and (not isinstance(groups, list) or not groups or
                               not all(isinstance(g, str) and g for g in groups)):
        raise ConfigurationError(f"{where}: kernels.groups must be a non-empty list of names",
                                 "e.g. groups = [\"norm\", \"fused_moe_sm120\"]")
    if head_dims is not None and (not isinstance(head_dims, list) or not head_dims or
                                  not all(is_integer(h) and h > 0 for h in head_dims)):
        raise ConfigurationError(f"{where}: kernels.head_dims must be a non-empty list of "
                                 "positive integers", "e.g. head_dims = [64, 128]")
    return (tuple(groups) if groups else None), (tuple(head_dims) if head_dims else None)


def _parse_target(table: dict[str, Any], base: Path, where: str) -> Target:
    known_keys(table, _TARGET_KEYS, where)
    name, upstream, label, where = _identity(table, where)
    sources, prefer = _target_sources(table, upstream, where)
    arch_list, lanes = _arch_and_lanes(table, where)
    groups, head_dims = _kernel_options(table, where)
    return Target(name=name, upstream_version=upstream, local_label=label,
                  series=(base / require(table, "series", str, where)).resolve(),
                  sources=sources, prefer=prefer, cuda_lane=lanes[0], arch_list=arch_list,
                  extra_cuda_lanes=tuple(lanes[1:]), kernel_groups=groups, head_dims=head_dims)


def load_targets(path: Path) -> TargetsFile:
    """Read and validate a targets file.

    Args:
        path: the TOML file (``targets.toml``); relative series paths resolve against
            its folder.

    Returns:
        The parsed file.

    Raises:
        BuilderError: the file is missing, not TOML, or breaks the schema (message names
            the target and key).
    """
    data = read_toml(path, "targets file")
    where = str(path)
    known_keys(data, {"default", "target"}, where)
    tables = table_array(data, "target", where)
    if not tables:
        raise ConfigurationError(f"{where}: declares no [[target]]", FORMAT_HINT)
    targets: dict[str, Target] = {}
    for index, table in enumerate(tables, 1):
        target = _parse_target(table, path.parent, f"{where} target #{index}")
        if target.name in targets:
            raise ConfigurationError(f"{where}: target {target.name!r} is declared twice",
                                     "give every target its own name")
        targets[target.name] = target
    default = data.get("default") or next(iter(targets), "")
    if not isinstance(default, str):
        raise ConfigurationError(f"{where}: 'default' must be one target's name, got "
                                 f"{default!r}", f"declared: {', '.join(targets)}")
    if default not in targets:
        raise ConfigurationError(f"{where}: default target {default!r} is not declared",
                                 f"declared: {', '.join(targets)}")
    return TargetsFile(path=path, default=default, targets=targets)

"""``images/pins.toml``: every base image the targets build on, pinned by digest.

Two kinds of entry:

* ``[[base]]``: upstream SGLang's runtime image for an upstream version and CUDA lane
  (the runtime image stage builds ``FROM`` it);
* ``[[kernel_base]]``: the kernel build container's base for a CUDA lane (NVIDIA's
  ``nvidia/cuda:*-devel``).

Each entry names the image with its tag (``name``) and records what ``python -m builder
pin-images`` resolved it to through the registry's API: ``digest`` (the manifest the build
uses: for a multi-platform image the ``platform`` one), ``index_digest`` (the image index /
manifest list the tag points at, ``""`` for a single-platform image), ``platform`` and
``resolved`` (the UTC date). The file is rewritten with tomlkit so its comments stay.

This module is in the core because both the kernel stage and the image stage read it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.errors import ConfigurationError
from builder.core.userfiles import read_input, rewrite_user_file, with_line_endings_of

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
#: The pins file, relative to the project root (the folder of ``targets.toml``).
PINS_FILE = Path("images/pins.toml")
_FIX = "run `python -m builder pin-images` where the registry is reachable"
_REQUIRED = {"base": {"upstream_version", "cuda_lane", "name", "digest"},
             "kernel_base": {"cuda_lane", "name", "digest"}}
_OPTIONAL = {"index_digest", "platform", "resolved"}


@dataclass(frozen=True)
class BasePin:
    """One entry of the pins file.

    Attributes:
        kind: ``base`` (upstream's runtime image) or ``kernel_base`` (the kernel build
            container's base).
        upstream_version: the SGLang release (``None`` for a ``kernel_base``).
        cuda_lane: CUDA ``major.minor``.
        name: fully qualified image name with its tag.
        digest: the manifest digest the build uses, ``""`` while not resolved.
        index_digest: the image index the tag pointed at, ``""`` for a single manifest.
        platform: ``os/architecture`` of ``digest`` (``linux/amd64``).
        resolved: UTC date (``YYYY-MM-DD``) ``pin-images`` resolved it, ``""`` if never.
    """

    kind: str
    upstream_version: Version | None
    cuda_lane: str
    name: str
    digest: str
    index_digest: str = ""
    platform: str = ""
    resolved: str = ""

    @property
    def reference(self) -> str:
        """``name@digest`` (what ``FROM`` uses).

        Raises:
            BuilderError: the digest is not resolved yet (the hint names ``pin-images``).
        """
        if not self.digest:
            raise ConfigurationError(
                f"{self.describe()} ({self.name}) is not pinned by digest: its digest is "
                "unresolved (digest = \"\" in the pins file)",
                f"{_FIX} (it writes the digest), or pass --base-image NAME@sha256:... "
                "(another base, e.g. a local stand-in)")
        return f"{self.name}@{self.digest}"

    def describe(self) -> str:
        """Words for messages: which base this is."""
        if self.kind == "base":
            return f"the upstream base image for sglang {self.upstream_version} / " \
                   f"CUDA {self.cuda_lane}"
        return f"the kernel build base for CUDA {self.cuda_lane}"

    def resolved_to(self, digest: str, index_digest: str, platform: str, date: str
                    ) -> BasePin:
        """This pin with a new resolution."""
        return replace(self, digest=digest, index_digest=index_digest, platform=platform,
                       resolved=date)


@dataclass(frozen=True)
class BasePins:
    """The parsed pins file.

    Attributes:
        path: where it was read from.
        pins: its entries in file order (both kinds).
    """

    path: Path
    pins: tuple[BasePin, ...]

    def runtime(self) -> list[BasePin]:
        """The ``[[base]]`` entries."""
        return [p for p in self.pins if p.kind == "base"]

    def lanes(self, version: Version) -> list[str]:
        """The CUDA lanes pinned for an upstream version, in file order."""
        return [p.cuda_lane for p in self.runtime() if p.upstream_version == version]

    def pin_for(self, version: Version, lane: str) -> BasePin:
        """The ``[[base]]`` entry for ``version`` and ``lane``.

        Raises:
            BuilderError: there is none.
        """
        for pin in self.runtime():
            if pin.upstream_version == version and pin.cuda_lane == lane:
                return pin
        raise ConfigurationError(
            f"{self.path} pins no base image for sglang {version} / CUDA {lane}",
            "add a [[base]] entry for it (name = upstream's tag, digest = \"\") "
            "and run `python -m builder pin-images`, or pass "
            "--base-image NAME@sha256:...")

    def kernel_base(self, lane: str) -> BasePin:
        """The ``[[kernel_base]]`` entry for ``lane``.

        Raises:
            BuilderError: there is none.
        """
        for pin in self.pins:
            if pin.kind == "kernel_base" and pin.cuda_lane == lane:
                return pin
        raise ConfigurationError(f"{self.path} pins no kernel build base for CUDA {lane}",
                                 "add a [[kernel_base]] entry for it and run `python -m builder "
                                 "pin-images`, or pass --base-image")


def _check(where: str, kind: str, entry: object) -> BasePin:
    required, allowed = _REQUIRED[kind], _REQUIRED[kind] | _OPTIONAL
    if not isinstance(entry, dict) or not required <= set(entry) <= allowed or \
            not all(isinstance(v, str) for v in entry.values()):
        raise ConfigurationError(f"{where}: needs the string keys {', '.join(sorted(required))} "
                                 f"(and may have {', '.join(sorted(_OPTIONAL))}), nothing else",
                                 "see the comment at the top of the pins file")
    for key in ("digest", "index_digest"):
        if entry.get(key) and not DIGEST.match(entry[key]):
            raise ConfigurationError(f"{where}: {key} {entry[key]!r} is not sha256:<64 hex>",
                                     f"write a manifest digest, or \"\" and {_FIX}")
    if not re.fullmatch(r"\d+\.\d+", entry["cuda_lane"]):
        raise ConfigurationError(f"{where}: cuda_lane {entry['cuda_lane']!r} is not major.minor",
                                 "write it like \"12.9\"")
    version = None
    if kind == "base":
        try:
            version = Version(entry["upstream_version"])
        except InvalidVersion:
            raise ConfigurationError(f"{where}: {entry['upstream_version']!r} is not a PEP 440 "
                                     "version", "write it like \"0.5.9\"") from None
    return BasePin(kind, version, entry["cuda_lane"], entry["name"], entry["digest"],
                   entry.get("index_digest", ""), entry.get("platform", ""),
                   entry.get("resolved", ""))


def load_base_pins(path: Path) -> BasePins:
    """Parse the pins file (unknown keys are refused).

    Args:
        path: ``images/pins.toml`` or another file of its shape.

    Returns:
        the entries, in file order.

    Raises:
        BuilderError: the file is missing, not TOML, or an entry is malformed.
    """
    raw = read_input(path, "base image pins file", "run from the project root, or pass "
                     "--pins-file")
    return parse_base_pins(path, raw)


def parse_base_pins(path: Path, raw: bytes) -> BasePins:
    """Parse a pins file's bytes (:func:`load_base_pins` without the read; ``add-target
    --dry-run`` reads the file it would write).

    Args:
        path: the file the bytes are (or would be), for messages.
        raw: its content.

    Returns:
        the entries, in file order.

    Raises:
        BuilderError: not TOML, or an entry is malformed.
    """
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}", "fix the file") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 (TOML 1.0, "Spec")
        raise ConfigurationError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                                 "save it as UTF-8") from None
    unknown = set(data) - set(_REQUIRED)
    if unknown:
        raise ConfigurationError(f"{path}: unknown keys {sorted(unknown)}",
                                 "only [[base]] and [[kernel_base]] tables")
    pins = [_check(f"{path} [[{kind}]] #{number}", kind, entry)
            for kind in _REQUIRED for number, entry in enumerate(data.get(kind, []), 1)]
    return BasePins(path, tuple(pins))


def write_base_pins(pins: BasePins, updated: list[BasePin]) -> None:
    """Write ``updated`` (the file's entries, same order and kinds, new resolutions) into
    the pins file atomically, keeping its comments and layout (tomlkit).

    Args:
        pins: the file as loaded.
        updated: one entry per entry of ``pins.pins``, in the same order.

    Raises:
        BuilderError: the file changed shape since it was read.
    """
    import tomlkit

    # Bytes decoded without newline translation: a CRLF file stays CRLF.
    original = pins.path.read_bytes()
    document = tomlkit.parse(original.decode("utf-8"))
    tables = [table for kind in _REQUIRED for table in document.get(kind, [])]
    if len(tables) != len(updated):
        raise ConfigurationError(f"{pins.path} changed while it was being resolved",
                                 "run `python -m builder pin-images` again")
    for table, pin in zip(tables, updated, strict=True):
        table["digest"] = pin.digest
        for key in ("index_digest", "platform", "resolved"):
            table[key] = getattr(pin, key)
    rewrite_user_file(pins.path, with_line_endings_of(original, tomlkit.dumps(document)))

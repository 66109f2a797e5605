"""What a target added by ``add-target`` still lacks before it ships, and the two stub files
``add-target`` writes for it.

``add-target`` writes the release's ``[[base]]`` entry into ``images/pins.toml`` (upstream's
runtime tag, digest left to ``pin-images``) and its launch profile
(``images/profiles/<target>.toml``: derived from a neighbour's by
:mod:`builder.targets.derive`, else a stub with an empty ``[args]``), each only where none
exists. :func:`target_gaps` then lists, from the compatibility matrix and those files:

* ``patch``: a patch that fails on the release, is not reached, or applies but whose
  intent checks fail (it needs a refresh);
* ``patch-range``: a patch in effect on an older pinned target whose version range ends
  before the release, with no other copy of it (same ``NNNN-`` number) in effect there nor
  one the matrix finds ``obsolete`` there (upstream has the change), and no newer pinned
  target without a copy (the series ended it for good); one gap per patch;
* ``base-digest``: no ``[[base]]`` for the release and lane, or its digest unresolved;
* ``launch-profile``: no profile, one without per-GPU values, or one derived from a
  neighbour's with claims still marked ``# RE-CHECK`` (:mod:`builder.targets.derive`);
* ``behaviour``: a patch in effect on the release that no behaviour case checks there.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder.core.basepins import PINS_FILE, BasePins, load_base_pins, parse_base_pins
from builder.core.errors import ConfigurationError
from builder.core.userfiles import with_line_endings_of
from builder.image.profile import PROFILES_DIR
from builder.patching.matrix import Cell, Matrix
from builder.patching.series import Series
from builder.targets.derive import MARK

#: Upstream's runtime image repository on Docker Hub.
UPSTREAM_IMAGE = "docker.io/lmsysorg/sglang"
_IN_EFFECT = ("clean", "offset", "fuzz")
_PINS_HEADER = ("# Base images the targets build on, pinned by digest (docs/images.md).\n"
                "# Written by `python -m builder add-target`; `python -m builder pin-images` "
                "resolves the digests.\n")


@dataclass(frozen=True)
class Gap:
    """One thing a new target still lacks.

    Attributes:
        kind: ``patch``, ``patch-range``, ``base-digest``, ``launch-profile`` or
            ``behaviour`` (module docstring).
        subject: what it is about (a patch file name, the pins file, the profile file).
        detail: what is missing, in words.
        fix: what to do about it.
    """

    kind: str
    subject: str
    detail: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"kind": self.kind, "subject": self.subject, "detail": self.detail,
                "fix": self.fix}

    def line(self) -> str:
        """One human-readable line."""
        return f"{self.kind}: {self.subject}: {self.detail} (fix: {self.fix})"


def upstream_base_name(version: str, lane: str) -> str:
    """Upstream's runtime image tag for ``version`` on CUDA ``lane``.

    The scheme ``v{version}-cu{major}{minor}-runtime`` is the tag_config of sglang's
    release-docker workflow (as its test of ``scripts/ci/utils/docker_build_metadata_args.py``
    names it); ``pin-images`` fails where a tag does not exist.
    """
    return f"{UPSTREAM_IMAGE}:v{version}-cu{lane.replace('.', '')}-runtime"


def base_entry_bytes(pins_path: Path, version: str, lane: str) -> bytes | None:
    """``images/pins.toml`` with a ``[[base]]`` for ``version`` / ``lane`` (digest ``""``)
    after the last one; nothing is written.

    The text is inserted (tomlkit would move the comments that follow the last entry);
    the result is parsed by :func:`builder.core.basepins.load_base_pins` (from a temporary
    file) and keeps the file's line endings.

    Args:
        pins_path: ``images/pins.toml`` (a new one gets a header when absent).
        version: the upstream release.
        lane: its CUDA lane.

    Returns:
        The new file's bytes, or ``None`` when an entry for them is already there.

    Raises:
        BuilderError: the existing file is malformed.
    """
    original = pins_path.read_bytes() if pins_path.is_file() else b""
    text = original.decode("utf-8").replace("\r\n", "\n") if original else _PINS_HEADER
    if original and lane in load_base_pins(pins_path).lanes(Version(version)):
        return None
    entry = (f'[[base]]\nupstream_version = "{version}"\ncuda_lane = "{lane}"\n'
             f'name = "{upstream_base_name(version, lane)}"\ndigest = ""\n')
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if line.strip() == "[[base]]"]
    if headers:
        end = headers[-1] + 1
        while end < len(lines) and lines[end].strip() and \
                not lines[end].lstrip().startswith(("#", "[")):
            end += 1
        new = "".join(lines[:end]) + "\n" + entry + "".join(lines[end:])
    else:
        new = text.rstrip("\n") + "\n\n" + entry
    fd, probe = tempfile.mkstemp(suffix=".toml")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(new)
        load_base_pins(Path(probe))  # never write a file the stages cannot read
    finally:
        os.unlink(probe)
    return with_line_endings_of(original, new)


def profile_stub_bytes(path: Path, name: str, version: str) -> bytes | None:
    """A launch profile with no values for target ``name``, where none exists.

    Returns:
        The stub's bytes, or ``None`` when a file is there.
    """
    if path.exists():
        return None
    return (
        f"# SM120 launch profile of the image for target {name} (SGLang {version}): a stub\n"
        "# written by `python -m builder add-target`. Fill [args] and the [gpu.rtx-pro-6000]\n"
        "# and [gpu.rtx-5090] tables from the nearest release's profile, with the evidence\n"
        "# for each value as a comment; `serve-command --check` parses them with the release's\n"
        "# own server arguments.\n"
        f'target = "{name}"\nupstream_version = "{version}"\n\n[args]\n').encode()


def _family(name: str) -> str:
    found = re.match(r"\d+-", name)
    return found.group(0) if found else name


def _patch_gaps(cells: dict[str, Cell], version: str, name: str) -> list[Gap]:
    # ``patch``: failed, ambiguous or unreached hunks, or applied with failing intents.
    gaps = []
    for patch, cell in cells.items():
        if cell.status in ("failed", "ambiguous", "not-reached"):
            gaps.append(Gap("patch", patch, f"{cell.text} on {version}",
                            f"python -m builder refresh --target {name} --patch patches/{patch} "
                            "--output-dir refreshed, then add-patch the copy for this release "
                            "(docs/new-release.md)"))
        elif cell.status in _IN_EFFECT and cell.intents is False:
            gaps.append(Gap("patch", patch, f"applies on {version} ({cell.text}) but its "
                            "intent checks fail", "refresh the patch (python -m builder "
                            f"refresh --target {name} --patch patches/{patch} --output-dir "
                            "refreshed) or its intents"))
    return gaps


def _range_gaps(series: Series, in_effect: set[str], obsolete: set[str], version: str,
                others: list[Version]) -> list[Gap]:
    # ``patch-range``: in effect on an older pinned target, ended before the release, and
    # no other copy of it (same ``NNNN-`` number) in effect on the release, nor one the
    # matrix found obsolete there (upstream has the change: the range ended rightly), nor
    # a pinned target newer than the newest one a copy applies to without any copy (the
    # series ended it for good: upstream absorbed it, as 0004 and 0006 in 0.5.21; a
    # release newer than every target asks no more than one between them). One gap per
    # patch: its latest copy so ended.
    release = Version(version)
    families = {_family(p) for p in in_effect | obsolete}
    ended: dict[str, str] = {}
    for entry in series.entries:
        family = _family(entry.name)
        if entry.applies_to(release) or family in families:
            continue
        copies = [e for e in series.entries if _family(e.name) == family]
        pinned = [v for v in others if v != release]  # the release's own entry is no witness
        covered = [v for v in pinned if any(e.applies_to(v) for e in copies)]
        if covered and any(v > max(covered) for v in pinned):
            continue
        if any(v < release and entry.applies_to(v) for v in others):
            ended[family] = entry.name  # series order: a later copy replaces an earlier
    by_name = {e.name: e for e in series.entries}
    return [Gap("patch-range", name, f"its range {by_name[name].versions} ends before "
                f"{version}", "extend the range in patches/series.toml if the change is still "
                "needed there, or leave it ended if upstream has it")
            for name in ended.values()]


def _base_gaps(root: Path, name: str, version: str, lane: str,
               planned: Mapping[Path, bytes]) -> list[Gap]:
    # ``base-digest``: no [[base]] for the release and lane, or its digest unresolved.
    release = Version(version)
    pins_path = root / PINS_FILE
    if pins_path in planned:
        pins: BasePins | None = parse_base_pins(pins_path, planned[pins_path])
    else:
        pins = load_base_pins(pins_path) if pins_path.exists() else None
    pin = next((p for p in pins.runtime() if p.upstream_version == release
                and p.cuda_lane == lane), None) if pins else None
    if pin is None:
        return [Gap("base-digest", str(PINS_FILE), f"no [[base]] for {version} / CUDA "
                    f"{lane}", f"add one naming {upstream_base_name(version, lane)}")]
    if not pin.digest:
        return [Gap("base-digest", str(PINS_FILE), f"{pin.name}: digest unresolved",
                    f"python -m builder pin-images --target {name} (where docker.io is "
                    "reachable)")]
    return []


def _profile_gaps(root: Path, name: str, planned: Mapping[Path, bytes]) -> list[Gap]:
    # ``launch-profile``: no profile, one without [gpu.*] values, or claims still marked.
    profile = root / PROFILES_DIR / f"{name}.toml"
    try:
        text = planned[profile].decode() if profile in planned else profile.read_text()
        data = tomllib.loads(text)
    except (FileNotFoundError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        text, data = "", {}  # reported below as a profile to write
    if data.get("gpu"):  # per-GPU values ([args] may rightly be empty, as in 0.5.23's)
        marks = sum(line.lstrip().startswith(MARK) for line in text.splitlines())
        if marks:
            return [Gap("launch-profile", str(PROFILES_DIR / profile.name),
                        f"{marks} claim(s) marked RE-CHECK (derived from a neighbour's "
                        "profile)", "check each in the release's code and remove its mark, "
                        f"then python -m builder serve-command --target {name} --check --all")]
        return []
    return [Gap("launch-profile", str(PROFILES_DIR / profile.name),
                "no launch profile values" if text or profile.exists() else "no launch profile",
                "fill [args] and the [gpu.*] tables from the nearest release's profile "
                f"and check them: python -m builder serve-command --target {name} --check "
                "--all")]


def _behaviour_gaps(series: Series, in_effect: set[str], version: str) -> list[Gap]:
    # ``behaviour``: a patch in effect on the release that no behaviour case checks there.
    release = Version(version)
    return [Gap("behaviour", entry.name, f"no behaviour case checks it on {version}",
                "add a [[behaviour]] for it (or widen one's versions) in "
                "patches/series.toml")
            for entry in series.entries if entry.name in in_effect
            and not any(b.versions is None or b.versions.contains(release, prereleases=True)
                        for b in entry.behaviours)]


def _column(matrix: Matrix, version: str) -> dict[str, Cell]:
    column = [c.label for c in matrix.columns].index(version)
    return {patch: row[column] for patch, row in zip(matrix.patches, matrix.cells, strict=True)}


def in_effect(matrix: Matrix, version: str) -> set[str]:
    """The patches in effect on ``version`` (the matrix column of that label): applied
    clean, with an offset or allowed fuzz, and no failing intent check."""
    return {p for p, cell in _column(matrix, version).items()
            if cell.status in _IN_EFFECT and cell.intents is not False}


def target_gaps(*, series: Series, matrix: Matrix, version: str, lane: str, name: str,
                root: Path, older: list[Version],
                planned: Mapping[Path, bytes] | None = None) -> tuple[Gap, ...]:
    """What target ``name`` (release ``version``, CUDA ``lane``) still lacks.

    Args:
        series: the series the matrix ran.
        matrix: the compatibility matrix with a column labelled ``version``.
        version: the release.
        lane: its CUDA lane.
        name: the target's name (its profile's file name).
        root: the project root (``images/`` is under it).
        older: the upstream versions of the other pinned targets (older and newer).
        planned: files not written yet, read instead of the disk's (``add-target
            --dry-run``: the gaps the real run would leave), by path under ``root``.

    Returns:
        the gaps, in the order of the module docstring's list.
    """
    cells = _column(matrix, version)
    effective = in_effect(matrix, version)
    obsolete = {p for p, cell in cells.items() if cell.status == "obsolete"}
    return tuple(_patch_gaps(cells, version, name)
                 + _range_gaps(series, effective, obsolete, version, older)
                 + _base_gaps(root, name, version, lane, planned or {})
                 + _profile_gaps(root, name, planned or {})
                 + _behaviour_gaps(series, effective, version))


def check_stub_paths(root: Path) -> None:
    """Refuse a project whose ``images`` path is not a folder (before anything is written).

    Raises:
        BuilderError: ``images`` exists and is not a folder.
    """
    images = root / PINS_FILE.parent
    if images.exists() and not images.is_dir():
        raise ConfigurationError(f"{images} is not a folder", "move it away; add-target "
                                 "writes images/pins.toml and images/profiles/ there")

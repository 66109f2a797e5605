"""``bump``: pin an upstream release as a new target, from what the index says.

``python -m builder bump VERSION`` (or ``--latest``) reads the release's files from the
simple index (PEP 691 JSON or PEP 503 HTML, the pages the source stage reads) and
writes one ``[[target]]`` into ``targets.toml``:

* the sources: the sdist if the release has one, else every CPython manylinux x86_64
  wheel (``cp3xx``), each with the index's sha256 (verified again on download);
* the CUDA lane: the CUDA that SGLang's exact ``torch`` pin is built with on the index,
  read from that torch wheel's ``METADATA`` (:func:`builder.kernels.pins.torch_cuda_lane`);
* the SM120 arch: from SGLang's exact ``flashinfer_python`` pin
  (:func:`builder.kernels.pins.sm120_arch`: ``12.0a`` up to 0.6.6, ``12.0f`` from 0.6.7);
* the local label (``--local-label``, default ``sm120.1``).

It then runs the compatibility matrix on the release and sorts every patch into
applies / needs a refresh / obsolete (:func:`builder.targets.upstream.assess`). An existing
target for the same name or version is never overwritten unless ``--replace`` says so.
The file is edited with tomlkit (comments, order and formatting of everything else are
kept), validated by the targets-file parser, and replaced atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomlkit
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.core.basepins import PINS_FILE
from builder.core.config import SdistPin, TargetsFile, WheelPin, load_targets
from builder.core.errors import BuilderError, ConfigurationError, SourceError
from builder.core.options import Options
from builder.core.pipconfig import resolve_index
from builder.core.userfiles import rewrite_user_file, temporary_beside, with_line_endings_of
from builder.core.wheelmeta import requires_dist
from builder.image.profile import PROFILES_DIR
from builder.kernels.pins import exact_torch, read_pins, sm120_arch, torch_cuda_lane
from builder.patching.matrix import Matrix, run_matrix
from builder.patching.series import load_series
from builder.source.fetch import (
    fetch_pin,
    release_files,
    remote_wheel_metadata,
)
from builder.targets.checklist import Step, checklist
from builder.targets.derive import DerivedProfile, derive_profile
from builder.targets.gaps import (
    Gap,
    base_entry_bytes,
    check_stub_paths,
    in_effect,
    profile_stub_bytes,
    target_gaps,
)
from builder.targets.upstream import Finding, assess
from builder.targets.writes import Writes, check_writable

DEFAULT_LABEL = "sm120.1"
Status = Literal["added", "replaced", "up-to-date", "dry-run"]


@dataclass(frozen=True)
class NewTarget:
    """What ``bump`` pins for one release.

    Attributes:
        name: the target's name (``sglang-0.5.23``).
        upstream_version: the release.
        local_label: the PEP 440 local label of our wheel.
        sources: the sdist, or the CPython manylinux x86_64 wheels, with sha256.
        cuda_lane: the CUDA lane of SGLang's torch pin.
        arch_list: the SM120 arch of SGLang's FlashInfer pin.
        flashinfer: FlashInfer's pinned version (for the report and the comment).
        torch: torch's pinned version.
        python_tags: the wheels' interpreter tags (empty for an sdist).
    """

    name: str
    upstream_version: str
    local_label: str
    sources: tuple[SdistPin | WheelPin, ...]
    cuda_lane: str
    arch_list: tuple[str, ...]
    flashinfer: str
    torch: str | None
    python_tags: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "upstream_version": self.upstream_version,
                "local_label": self.local_label, "cuda_lane": self.cuda_lane,
                "arch_list": list(self.arch_list), "flashinfer_python": self.flashinfer,
                "torch": self.torch, "python_tags": list(self.python_tags),
                "sources": [p.describe() for p in self.sources]}


@dataclass(frozen=True)
class BumpReport:
    """The result of one ``bump``.

    Attributes:
        status: ``added``, ``replaced``, ``dry-run`` (nothing written) or ``up-to-date``
            (``--latest`` found no release newer than every target).
        targets_file: the file written (or that would be).
        version: the release pinned (the newest one for ``up-to-date``).
        target: what was pinned (``None`` when up to date).
        matrix: the compatibility matrix on the release (``None`` when up to date).
        findings: patches that need a refresh, apply only with fuzz, or became obsolete.
        unpatched: ``True`` when no patch changes the release: its wheel is upstream's own.
        gaps: what the new target still lacks (:mod:`builder.targets.gaps`).
        written: the stub files written besides targets.toml (pins file, profile).
        steps: the checklist from here to a served, CI-green target
            (:func:`builder.targets.checklist.checklist`).
        derived: the launch profile derived from a neighbour's, with the claims to
            re-check (``None`` when a profile was there or no neighbour has one).
    """

    status: Status
    targets_file: Path
    version: str
    target: NewTarget | None
    matrix: Matrix | None
    findings: tuple[Finding, ...]
    unpatched: bool
    gaps: tuple[Gap, ...] = ()
    written: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    derived: DerivedProfile | None = None

    @property
    def needs_refresh(self) -> bool:
        """True when a patch fails on the release (it must be refreshed before a build)."""
        return any(f.action in ("refresh", "not-reached") for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"status": self.status, "targets_file": str(self.targets_file),
                "version": self.version,
                "target": self.target.to_json() if self.target else None,
                "needs_refresh": self.needs_refresh, "unpatched": self.unpatched,
                "findings": [f.to_json() for f in self.findings],
                "gaps": [g.to_json() for g in self.gaps], "written": list(self.written),
                "checklist": [s.to_json() for s in self.steps],
                "profile": None if self.derived is None else {
                    "from": self.derived.neighbour, "same_patches": self.derived.same_patches,
                    "differ": list(self.derived.differ),
                    "recheck": list(self.derived.recheck)},
                "matrix": self.matrix.to_json() if self.matrix else None}

    def to_markdown(self) -> str:
        """A pull request body: the new target, what the series does there, the matrix."""
        if self.target is None or self.matrix is None:
            return f"No SGLang release newer than the targets ({self.version}).\n"
        t = self.target
        kind = "sdist" if isinstance(t.sources[0], SdistPin) else "wheels"
        lines = [f"## New target `{t.name}` (`{t.upstream_version}+{t.local_label}`)", "",
                 "Written by `python -m builder add-target` from the package index.", "",
                 "| | |", "|---|---|",
                 f"| upstream {kind} | "
                 + "<br>".join(f"`{p.filename}` sha256 `{p.sha256}`" for p in t.sources) + " |",
                 f"| FlashInfer pin | {t.flashinfer} → arch `{', '.join(t.arch_list)}` |",
                 f"| torch pin | {t.torch or 'none'} → CUDA lane `{t.cuda_lane}` |",
                 f"| Python tags | {', '.join(t.python_tags) or 'any'} |", ""]
        by_action: dict[str, list[str]] = {}
        for finding in self.findings:
            by_action.setdefault(finding.action, []).append(
                f"- `{finding.patch}`: {finding.detail}")
        titles = {"refresh": "Needs a refresh before this target builds",
                  "not-reached": "Not tried (an earlier patch failed)",
                  "fuzz": "Applies only with allowed fuzz",
                  "obsolete": "Obsolete here (upstream has it; end its version range)"}
        for action, title in titles.items():
            if by_action.get(action):
                lines += [f"### {title}", "", *by_action[action], ""]
        if self.unpatched:
            lines += ["No patch of the series changes this release: the target ships "
                      "upstream's own wheel, sha256-pinned and unrenamed (docs/upstream.md).",
                      ""]
        if self.gaps:
            lines += ["### What the target still lacks", "",
                      *(f"- {g.kind}: `{g.subject}`: {g.detail} (fix: {g.fix})"
                        for g in self.gaps), ""]
        if self.derived is not None:
            d = self.derived
            lines += [f"### Launch profile derived from `{d.neighbour}`", "",
                      "Its patches in effect are the same." if d.same_patches else
                      f"Its patches in effect differ: {', '.join(d.differ)}.",
                      "Claims to re-check in this release's code (marked `# RE-CHECK`):", "",
                      *(f"- {line}" for line in d.recheck), ""]
        if self.steps:
            lines += ["### Checklist (docs/new-release.md)", "",
                      *(f"{n}. **{s.title}**: {s.what}: "
                        + ", ".join(f"`{c}`" for c in s.commands)
                        for n, s in enumerate(self.steps, 1)), ""]
        lines += ["### Compatibility matrix", "", self.matrix.to_markdown().rstrip("\n")]
        return "\n".join(lines) + "\n"


def _index_url(options: Options) -> str:
    """The index a bump reads: ``--index-url``, else pip's configured one, else PyPI."""
    return resolve_index(options.index_url).url


def _sources(project: str, version: Version, index_url: str
             ) -> tuple[tuple[SdistPin | WheelPin, ...], tuple[str, ...]]:
    """The sdist, else the cp3xx manylinux x86_64 wheels, with the index's sha256."""
    files = [f for f in release_files(project, version, index_url) if not f[3] and f[2]]
    sdists = [SdistPin(project, str(version), sha) for name, _, sha, _ in files
              if name.endswith((".tar.gz", ".zip"))]
    if sdists:
        return (sdists[0],), ()
    wheels: list[WheelPin] = []
    tags: list[str] = []
    for name, _, sha, _ in files:
        if not name.endswith(".whl"):
            continue
        wheel_tags = parse_wheel_filename(name)[3]
        if all(t.interpreter.startswith("cp3") and t.abi == t.interpreter
               and t.platform.startswith("manylinux") and t.platform.endswith("_x86_64")
               for t in wheel_tags):
            wheels.append(WheelPin(project, str(version), name, sha))
            tags += sorted({t.interpreter for t in wheel_tags})
    if not wheels:
        raise SourceError(f"{index_url} lists neither an sdist nor a CPython manylinux "
                          f"x86_64 wheel (with a sha256, not yanked) of {project} {version}",
                          "check the version; a release with other wheels only cannot be "
                          "pinned by add-target")
    return tuple(wheels), tuple(dict.fromkeys(tags))


def _cuda_lane(torch: Version, index_url: str) -> str:
    """The CUDA lane of ``torch`` as the index ships it for Linux x86_64."""
    files = [f for f in release_files("torch", torch, index_url)
             if f[0].endswith(".whl") and not f[3]]
    linux = [f for f in files if any(t.platform.startswith("manylinux")
                                     and t.platform.endswith("_x86_64")
                                     for t in parse_wheel_filename(f[0])[3])]
    if not linux:
        raise SourceError(f"{index_url} lists no Linux x86_64 wheel of torch {torch}",
                          "pass --cuda-lane X.Y (the CUDA of that torch build)")
    metadata = remote_wheel_metadata(linux[0][1], linux[0][0])
    lane = torch_cuda_lane([str(r) for r in requires_dist(metadata, linux[0][0])])
    if lane is None:
        raise SourceError(f"{linux[0][0]} pins no NVIDIA CUDA runtime (a CPU build?)",
                          "pass --cuda-lane X.Y")
    return lane


def plan_target(options: Options, version: Version, *, local_label: str = DEFAULT_LABEL,
                cuda_lane: str | None = None) -> NewTarget:
    """Work out the target for ``version`` from the index and the release's own pins.

    Raises:
        BuilderError: the index lists no usable file, the release pins no exact
            FlashInfer (or torch, without ``cuda_lane``), or a download fails.
    """
    targets = load_targets(options.targets_file)
    project = targets.get(None).sdist_project
    sources, tags = _sources(project, version, _index_url(options))
    source = fetch_pin(sources[0], version, cache=options.cache, index_url=_index_url(options),
                       reporter=options.reporter)
    pins = read_pins(source)
    torch = exact_torch(pins)
    if cuda_lane is None:
        if torch is None:
            raise SourceError(f"{project} {version} pins no exact torch "
                              f"({pins.torch or 'no torch requirement'})",
                              "pass --cuda-lane X.Y")
        options.reporter.info(f"Reading torch {torch}'s CUDA from its wheel on the index")
        cuda_lane = _cuda_lane(torch, _index_url(options))
    return NewTarget(name=f"{project}-{version}", upstream_version=str(version),
                     local_label=local_label, sources=sources, cuda_lane=cuda_lane,
                     arch_list=(sm120_arch(pins.flashinfer),),
                     flashinfer=str(pins.flashinfer), torch=str(torch) if torch else None,
                     python_tags=tags)


def _target_table(target: NewTarget, series: str) -> tomlkit.items.Table:
    table = tomlkit.table()
    table.trivia.indent = "\n"  # a blank line before [[target]], as in the hand-written ones
    table.add(tomlkit.comment("Pinned from the package index by `python -m builder "
                              "add-target`."))
    table.add("name", target.name)
    table.add("upstream_version", target.upstream_version)
    table.add("local_label", target.local_label)
    table.add("series", series)
    kind = "sdist" if isinstance(target.sources[0], SdistPin) else "wheel"
    table.add("prefer", kind)
    lane = tomlkit.item(target.cuda_lane)
    lane.comment(f"torch {target.torch} is built for CUDA {target.cuda_lane}" if target.torch
                 else "given with --cuda-lane")
    lane.trivia.comment_ws = "  "
    table.add("cuda_lane", lane)
    arch = tomlkit.array()
    arch.extend(target.arch_list)
    arch_item = tomlkit.item(arch)
    arch_item.comment(f"FlashInfer {target.flashinfer}")
    arch_item.trivia.comment_ws = "  "
    table.add("arch_list", arch_item)
    sources = tomlkit.aot()
    for pin in target.sources:
        source = tomlkit.table()
        source.add("kind", pin.kind)
        source.add("project", pin.project)
        source.add("version", pin.version)
        if isinstance(pin, WheelPin):
            source.add("filename", pin.filename)
        source.add("sha256", pin.sha256)
        sources.append(source)
    table.add("source", sources)
    return table


def render_target(path: Path, target: NewTarget, *, replace: bool = False
                  ) -> tuple[bytes, Literal["added", "replaced"]]:
    """The targets file with ``target`` added (or, with ``replace``, swapped in); nothing
    is written.

    Everything else in the file (comments, order, formatting, line endings) is kept; the
    result is checked by :func:`builder.core.config.load_targets` on a temporary copy
    beside the file (its series path is relative to it).

    Returns:
        The new file's bytes, and whether the target was added or replaced one.

    Raises:
        BuilderError: a target of that name or upstream version exists and ``replace``
            is false; or the result would not be a valid targets file.
    """
    # Bytes decoded without newline translation: a CRLF file stays CRLF.
    original = path.read_bytes()
    document = tomlkit.parse(original.decode("utf-8"))
    tables = document.get("target")
    if tables is None:
        raise ConfigurationError(f"{path} declares no [[target]]", "see docs/upstream.md")
    existing = [i for i, t in enumerate(tables)
                if t.get("name") == target.name
                or _same_version(t.get("upstream_version"), target.upstream_version)]
    series = str(tables[0].get("series", "patches/series.toml"))
    new = _target_table(target, series)
    if existing and not replace:
        names = ", ".join(str(tables[i].get("name")) for i in existing)
        raise ConfigurationError(f"{path} already has a target for {target.upstream_version} "
                                 f"({names})", "pass --replace to overwrite it (the diff shows "
                                 "what changed), or --local-label to pin it again under a new name")
    if existing:
        tables[existing[0]] = new
        for index in reversed(existing[1:]):
            del tables[index]
    else:
        tables.append(new)
    output = with_line_endings_of(original, tomlkit.dumps(document))
    # The schema check on the result, beside the file (its series path is relative to
    # it); a bad result is never installed, and the error names the user's file.
    with temporary_beside(path, output) as temporary:
        try:
            load_targets(temporary)
        except BuilderError as exc:
            raise type(exc)(exc.cause.replace(str(temporary), str(path)).replace(
                temporary.name, path.name), exc.hint) from None
    return output, "replaced" if existing else "added"


def write_target(path: Path, target: NewTarget, *, replace: bool = False) -> Literal[
        "added", "replaced"]:
    """Add (or, with ``replace``, swap in) ``target`` in the targets file, atomically
    (:func:`render_target`, then :func:`builder.core.userfiles.rewrite_user_file`).

    Raises:
        BuilderError: as :func:`render_target`.
    """
    output, status = render_target(path, target, replace=replace)
    rewrite_user_file(path, output)
    return status


def _same_version(text: object, version: str) -> bool:
    try:
        return Version(str(text)) == Version(version)
    except InvalidVersion:
        return False


def _wanted(targets_file: Path, targets: TargetsFile, version: str, *,
            replace: bool) -> Version:
    """The release to pin, refused when it is no PEP 440 version or already a target."""
    project = targets.get(None).sdist_project
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise ConfigurationError(f"{version!r} is not a PEP 440 version",
                                 "write it like 0.5.23 (`python -m builder upstream` lists "
                                 "the newer releases)") from None
    if not replace and any(t.upstream_version == wanted or t.name == f"{project}-{wanted}"
                           for t in targets.targets.values()):
        raise ConfigurationError(f"{targets_file} already has a target for {wanted}",
                                 "pass --replace to overwrite it explicitly")
    return wanted


def _profile_to_write(profile: Path) -> bool:
    """Whether the launch profile is still to be written (the user's one is kept).

    Raises:
        ConfigurationError: something other than a regular file is there: kept as the
            user's profile it would be read (a fifo blocks, a folder fails late).
    """
    if profile.parent.exists() and not profile.parent.is_dir():
        raise ConfigurationError(f"the launch profile {profile}: {profile.parent} is not a "
                                 "folder", "move it away (add-target writes the profile "
                                 "there); nothing was written")
    if (profile.exists() or profile.is_symlink()) and not profile.is_file():
        raise ConfigurationError(f"the launch profile {profile} is not a regular file",
                                 "remove it, or put the release's profile (TOML) there; "
                                 "nothing was written")
    return not profile.exists() and not profile.is_symlink()


def run_add_target(options: Options, version: str, *, local_label: str = DEFAULT_LABEL,
                   cuda_lane: str | None = None, replace: bool = False,
                   dry_run: bool = False, body_file: Path | None = None) -> BumpReport:
    """Pin ``version`` as a new target.

    Every file it writes (``targets.toml``, ``images/pins.toml``, the launch profile,
    ``body_file``) is checked before the first write, and a write that fails anyway puts
    back the ones already written (:mod:`builder.targets.writes`): all or none.

    Args:
        options: the run's options (targets file, cache, index URL, reporter).
        version: the release to pin (``upstream`` finds the newer ones).
        local_label: our PEP 440 local label.
        cuda_lane: the CUDA lane, instead of reading it from torch's wheel.
        replace: overwrite an existing target for the same name or version.
        dry_run: work everything out and report it, write nothing.
        body_file: also write the Markdown pull request body there (``--body-file``).

    Returns:
        What was pinned and what the series does on it.

    Raises:
        BuilderError: as :func:`plan_target` and :func:`render_target`; a file cannot be
            written (nothing was); or ``version`` is not a PEP 440 version.
    """
    targets = load_targets(options.targets_file)
    project = targets.get(None).sdist_project
    wanted = _wanted(options.targets_file, targets, version, replace=replace)
    root = options.targets_file.parent
    check_stub_paths(root)
    # before the slow part (the index, the matrix): the name is plan_target's
    profile = root / PROFILES_DIR / f"{project}-{wanted}.toml"
    profile_to_write = _profile_to_write(profile)
    writes = Writes()
    if body_file is not None and not dry_run:
        check_writable(body_file, "--body-file")  # before the slow part, as before
    options.reporter.info(f"Pinning {project} {wanted} from {_index_url(options)}")
    target = plan_target(options, wanted, local_label=local_label, cuda_lane=cuda_lane)
    matrix = run_matrix(options, versions=[str(wanted)])
    findings, unpatched = assess(matrix)
    status: Status = "dry-run"
    written: list[str] = []
    data, added = render_target(options.targets_file, target, replace=replace)
    pins_file = root / PINS_FILE
    default = targets.get(None)
    series = load_series(options.series) if options.series else load_series(default.series)
    derived = None
    if profile_to_write:
        derived = derive_profile(name=target.name, version=str(wanted),
                                 in_effect=in_effect(matrix, str(wanted)), series=series,
                                 targets=[t for t in targets.targets.values()
                                          if t.name != target.name],
                                 profiles=root / PROFILES_DIR)
    writes.add(options.targets_file, data, "the targets file")
    pins = base_entry_bytes(pins_file, target.upstream_version, target.cuda_lane)
    if pins is not None:
        writes.add(pins_file, pins, "the base pins file")
    stub = (profile_stub_bytes(profile, target.name, target.upstream_version)
            if derived is None else derived.text.encode())
    if stub is not None:
        writes.add(profile, stub, "the launch profile")
    if not dry_run:
        status = added
        written = [str(p) for p, _, _ in writes.planned[1:]]
        if body_file is not None:
            check_writable(body_file, "--body-file")
        writes.check()  # every destination, before the first write
        writes.apply()
    try:
        gaps = target_gaps(series=series, matrix=matrix, version=str(wanted),
                           lane=target.cuda_lane, name=target.name, root=root,
                           older=[t.upstream_version for t in targets.targets.values()],
                           planned={p: d for p, d, _ in writes.planned} if dry_run else None)
        steps = checklist(target.name, str(wanted),
                          failing=[g.subject for g in gaps if g.kind == "patch"],
                          ended=[g.subject for g in gaps if g.kind == "patch-range"],
                          recheck=derived.recheck if derived else (),
                          derived_from=derived.neighbour if derived else None)
        report = BumpReport(status, options.targets_file, str(wanted), target, matrix,
                            findings, bool(unpatched), gaps, tuple(written), steps, derived)
        if body_file is not None and not dry_run:
            writes.write(body_file, report.to_markdown().encode(), "--body-file")
    except BaseException:
        writes.undo()
        raise
    return report

"""Runs the stages in order for one target; what the CLI and nox sessions call.

Each function takes :class:`Options` (parsed once from the command line) and returns the
stage's result object, which the next stage takes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.cache import Cache, default_cache_root
from builder.config import GitPin, Pin, Series, SourceKind, Target, load_series, load_targets
from builder.errors import BuilderError
from builder.kernels import (
    DEFAULT_GROUPS,
    DEFAULT_HEAD_DIMS,
    Check,
    KernelPins,
    KernelRequest,
    KernelResult,
    Sccache,
    build_kernels,
    build_torch,
    check_arch_list,
    check_groups,
    kernel_wheel_version,
    preflight,
    read_pins,
    sccache_settings,
)
from builder.layout import Layout
from builder.matrix import Column, Matrix, check_matrix
from builder.patch import PatchResult, PatchStatus, apply_series, read_series
from builder.plan import Plan, plan_targets
from builder.progress import Reporter
from builder.refresh import RefreshedPatch, refresh_series
from builder.repack import refuse_unshipped
from builder.source import (
    DEFAULT_INDEX_URL,
    SourceResult,
    fetch_pin,
    fetch_source,
    find_release,
    list_releases,
    local_source,
)
from builder.toolchain import (
    PythonEnv,
    arch_code,
    cuda_wheels,
    current_environment,
    find_sccache,
    local_nvcc,
    managed_environment,
)
from builder.upstream import UpstreamReport, assess, newer_releases
from builder.wheel import WheelResult, build_wheel


@dataclass(frozen=True)
class Options:
    """Everything a run needs, parsed once.

    Attributes:
        targets_file: the targets file.
        target: the target's name (``None``: the default target).
        cache_dir: the cache root.
        index_url: simple index to find sdists on.
        source: ``sdist`` or ``git`` (``None``: the target's preference).
        git_url: replacement URL or path for the target's git pin.
        source_dir: an existing tree to use instead of fetching.
        upstream_version: the version of ``source_dir`` when it has no PKG-INFO.
        series: a series file replacing the target's.
        patch: a single patch replacing the target's series (ad hoc, unpinned).
        strip: strip level for ``patch``.
        max_fuzz: fuzz allowed for ``patch``.
        dist_dir: where wheels go.
        reporter: progress output.
    """

    targets_file: Path = Path("targets.toml")
    target: str | None = None
    cache_dir: Path = field(default_factory=default_cache_root)
    index_url: str = DEFAULT_INDEX_URL
    source: SourceKind | None = None
    git_url: str | None = None
    source_dir: Path | None = None
    upstream_version: str | None = None
    series: Path | None = None
    patch: Path | None = None
    strip: int = 1
    max_fuzz: int = 0
    dist_dir: Path = Path("dist")
    reporter: Reporter = field(default_factory=lambda: Reporter(quiet=True))

    @property
    def cache(self) -> Cache:
        """The cache at ``cache_dir``."""
        return Cache(self.cache_dir)


def select_target(options: Options) -> Target:
    """Return the selected target from the targets file.

    Raises:
        BuilderError: the targets file is invalid or has no such target.
    """
    return load_targets(options.targets_file).get(options.target)


def select_series(options: Options, target: Target | None) -> Series:
    """Return the series to apply: ``--patch``, ``--series``, or the target's.

    Raises:
        BuilderError: both ``--patch`` and ``--series`` were given, or the file is invalid.
    """
    if options.patch and options.series:
        raise BuilderError("--patch and --series exclude each other", "give one of them")
    if options.patch:
        return Series.single(options.patch, strip=options.strip, max_fuzz=options.max_fuzz)
    if options.series:
        return load_series(options.series)
    if target is None:
        raise BuilderError("no series to apply", "pass --series FILE or --patch FILE")
    return load_series(target.series)


def obtain_source(options: Options, target: Target | None) -> SourceResult:
    """Fetch the target's pinned source, or describe ``--source-dir``.

    Raises:
        BuilderError: see :func:`builder.source.fetch_source` and
            :func:`builder.source.local_source`.
    """
    if options.source_dir is not None:
        version = options.upstream_version or (str(target.upstream_version)
                                               if target and options.target else None)
        return local_source(options.source_dir, version)
    if target is None:
        raise BuilderError("no source given", "pass --target NAME or --source-dir DIR")
    return fetch_source(target, cache=options.cache, kind=options.source,
                        index_url=options.index_url, git_url=options.git_url,
                        reporter=options.reporter)


def run_fetch(options: Options) -> SourceResult:
    """Source stage for the selected target."""
    return obtain_source(options, select_target(options))


def run_patch(options: Options, *, in_place: bool = False, dry_run: bool = False
              ) -> PatchResult:
    """Source and patch stages.

    A target is needed only when no ``--source-dir`` with ``--series``/``--patch`` is
    given; with ``--source-dir`` and ``in_place`` the user's tree is patched itself.
    """
    ad_hoc = options.source_dir is not None and (options.series or options.patch)
    target = None if ad_hoc and options.target is None else select_target(options)
    series = select_series(options, target)
    read_series(series)  # a bad series fails before any download
    source = obtain_source(options, target)
    result = apply_series(source, series, cache=options.cache, in_place=in_place,
                          dry_run=dry_run)
    return result


def run_wheel(options: Options) -> WheelResult:
    """Source, patch and wheel stages for the selected target's first pin of its kind."""
    return run_wheels(options)[0]


def run_wheels(options: Options) -> list[WheelResult]:
    """Source, patch and wheel stages for the selected target; the wheels land in dist.

    A target built from released wheels (no sdist upstream) may pin one wheel per
    platform and Python tag: each is patched and repacked. Otherwise one wheel is built.

    Raises:
        BuilderError: any stage refused; or no patch of the series applies to this
            upstream version (the wheel would be upstream's under our label); or, for
            released wheels, a patch touches compiled code or a build file.
    """
    target = select_target(options)
    series = select_series(options, target)
    parsed = read_series(series)  # a bad series fails before any download
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
        if not any(p.status not in (PatchStatus.NOT_APPLICABLE, PatchStatus.NOT_REACHED)
                   for p in patched.report.patches):
            raise BuilderError(f"no patch of the series applies to upstream "
                               f"{source.upstream_version}: the wheel would be upstream's "
                               "under our label", "check the series' version ranges for "
                               "this target", report=patched.report)
        version = f"{source.upstream_version}+{target.local_label}"
        results.append(build_wheel(patched, version=version, cache=options.cache,
                                   dist_dir=options.dist_dir, target=target.name,
                                   reporter=options.reporter))
    return results


def run_check(options: Options, *, versions: list[str] | None = None,
              commits: list[str] | None = None) -> Matrix:
    """The compatibility matrix of the series (``--series`` or the default target's).

    Columns: every target (its preferred pin), or the given upstream ``versions`` (found
    on the index: the sdist, else a released wheel read as source), or git ``commits``
    (of ``--git-url``, default the default target's git URL), each ``COMMIT`` or
    ``COMMIT=VERSION`` (default version: the default target's; the series' version
    ranges and fuzz allowances are judged against it).

    Raises:
        BuilderError: a version or commit is malformed, a source cannot be fetched, or
            the series is invalid.
    """
    targets = load_targets(options.targets_file)
    default = targets.get(None)
    series = load_series(options.series) if options.series else load_series(default.series)
    read_series(series)
    columns: list[Column] = []
    cache = options.cache
    if versions:
        for version in dict.fromkeys(versions):
            try:
                Version(version)
            except InvalidVersion:
                raise BuilderError(f"{version!r} is not a PEP 440 version",
                                   "write versions like 0.5.9,0.5.11") from None
            pin = find_release(default.sdist_project, version, options.index_url)
            source = fetch_pin(pin, Version(version), cache=cache, index_url=options.index_url,
                               reporter=options.reporter)
            columns.append(Column(version, source))
    elif commits:
        url = options.git_url or _git_url(default)
        for item in dict.fromkeys(commits):
            commit, _, version_text = item.partition("=")
            if not re.fullmatch(r"[0-9a-f]{40}", commit):
                raise BuilderError(f"{commit!r} is not a full 40-hex commit id",
                                   "a tag or branch can move: pass git rev-parse's output")
            try:
                at = Version(version_text) if version_text else default.upstream_version
            except InvalidVersion:
                raise BuilderError(f"{version_text!r} is not a PEP 440 version",
                                   "write COMMIT=VERSION like abc…=0.5.10.post1") from None
            source = fetch_pin(GitPin(url, commit), at, cache=cache, reporter=options.reporter)
            columns.append(Column(f"{commit[:12]} ({at})", source))
    else:
        for target in targets.targets.values():
            source = fetch_source(target, cache=cache, index_url=options.index_url,
                                  reporter=options.reporter)
            columns.append(Column(str(target.upstream_version), source, target.name))
    return check_matrix(series, columns)


def _git_url(target: Target) -> str:
    pin = target.pin("git")
    assert isinstance(pin, GitPin)
    return pin.url


def run_refresh(options: Options, *, accept_fuzz: bool = False,
                output_dir: Path | None = None, dry_run: bool = False
                ) -> tuple[RefreshedPatch, ...]:
    """Refresh the target's series against the target's upstream (see :mod:`refresh`).

    Raises:
        BuilderError: in place, a refreshed patch also covers another target's version
            (rewriting it for this target could break that one), or ``output_dir`` is the
            series' own folder; and see :func:`builder.refresh.refresh_series`.
    """
    targets = load_targets(options.targets_file)
    target = targets.get(options.target)
    series = select_series(options, target)
    read_series(series)
    if output_dir is not None and series.path is not None and \
            output_dir.resolve() == series.path.parent.resolve():
        raise BuilderError(f"--output-dir {output_dir} is the series' own folder",
                           "write copies elsewhere, or refresh in place without --output-dir")
    source = obtain_source(options, target)
    planned = refresh_series(source, series, accept_fuzz=accept_fuzz, output_dir=output_dir,
                             dry_run=True)
    if dry_run:
        return planned
    if output_dir is None:
        rewritten = {p.name for p in planned if p.status == "refreshed"}
        for entry in series.entries:
            if entry.name not in rewritten:
                continue
            others = [t.name for t in targets.targets.values()
                      if t.upstream_version != target.upstream_version
                      and t.series == series.path and entry.applies_to(t.upstream_version)]
            if others:
                raise BuilderError(
                    f"{entry.name} also applies to {', '.join(others)}: refreshing it in place "
                    f"for {target.name} could break them",
                    "write a copy with --output-dir DIR and give it its own series entry "
                    "with a narrower version range (README: Refresh)")
    return refresh_series(source, series, accept_fuzz=accept_fuzz, output_dir=output_dir)


@dataclass(frozen=True)
class PreflightResult:
    """What a kernel build for a target would use, and whether the toolchain can do it.

    Attributes:
        target: the target's name.
        pins: the lockstep pins read from its upstream source.
        kernel_version: the kernel wheel's version (FlashInfer's plus the local label).
        arch: the SM120 arch FlashInfer detects for these pins.
        checks: the toolchain checks.
    """

    target: str
    pins: KernelPins
    kernel_version: str
    arch: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(check.ok for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"target": self.target, "pins": self.pins.describe(),
                "kernel_version": self.kernel_version, "arch": self.arch, "ok": self.ok,
                "checks": [c.to_json() for c in self.checks]}


def run_preflight(options: Options, *, nvcc: Path, include_dirs: list[Path],
                  python: Path | None = None, lane: str | None = None) -> PreflightResult:
    """Read the target's kernel pins, check its arch list, and check the toolchain.

    Raises:
        BuilderError: the pins disagree, or the target's arch list contradicts what its
            FlashInfer detects (see :mod:`builder.kernels`).
    """
    target = select_target(options)
    source = obtain_source(options, target)
    pins = read_pins(source)
    arch = check_arch_list(target.arch_list, pins)
    lane = target.lane(lane)
    checks = preflight(nvcc=nvcc, lane=lane, arches=list(target.arch_list),
                       include_dirs=include_dirs, python=python)
    return PreflightResult(target.name, pins,
                           kernel_wheel_version(pins, kernel_label(target.local_label, lane)),
                           arch, checks)


@dataclass(frozen=True)
class KernelOptions:
    """How to build a target's kernel wheel (the ``kernels`` command's options).

    Attributes:
        lane: CUDA lane (``None``: the target's default).
        groups: module groups (``None``: the target's, else the default set).
        head_dims: attention head dimensions (``None``: the target's, else 128).
        arch_list: archs other than the target's (for a smoke test on a non-SM120 GPU,
            e.g. ``("9.0a",)``); the wheel's label then names them.
        mode: ``host`` (this machine's toolchain) or ``container`` (a CUDA build container).
        environment: ``managed`` (a cached venv with the pinned FlashInfer) or ``current``
            (this interpreter, FlashInfer already installed; for offline machines).
        nvcc: the compiler (host mode; ``None``: one of the lane on this machine, else
            PyPI's).
        build_torch: torch requirement for the build venv (``None``: the target's pin).
        wheelhouse: install the build venv offline from this folder.
        sccache: compile through sccache (its ``SCCACHE_*`` variables pick the backend).
        jobs: parallel compile jobs (``None``: bounded by CPUs and free memory).
        base_image: the build container's base (container mode).
        toolkit: ``pypi`` (CUDA from NVIDIA's PyPI wheels), ``base`` (the base image
            has it, like ``nvidia/cuda:*-devel``) or ``None`` (the base's if it has one)
            (container mode).
        engine: Docker Engine URL (container mode; ``None``: ``DOCKER_HOST`` or the default).
        request_file: build this saved request instead of resolving the target.
    """

    lane: str | None = None
    groups: tuple[str, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    arch_list: tuple[str, ...] | None = None
    mode: str = "host"
    environment: str = "managed"
    nvcc: Path | None = None
    build_torch: str | None = None
    wheelhouse: Path | None = None
    sccache: bool = False
    jobs: int | None = None
    base_image: str | None = None
    toolkit: str | None = None
    engine: str | None = None
    request_file: Path | None = None


def kernel_label(local_label: str, lane: str) -> str:
    """The kernel wheel's local label: ours plus the CUDA lane (``sm120.1.cu130``), like
    FlashInfer's own ``+cu129`` jit-cache wheels, so two lanes never share a version."""
    return f"{local_label}.cu{lane.replace('.', '')}"


def kernel_request(options: Options, kernel: KernelOptions) -> KernelRequest:
    """Decide what to build for the target: pins from its upstream source, the arch list,
    the CUDA lane, the module groups and the wheel's version.

    Raises:
        BuilderError: the pins disagree, the arch list contradicts FlashInfer's detection
            (or has a plain ``12.0``), or the lane is not one of the target's.
    """
    if kernel.request_file is not None:
        try:
            data = json.loads(kernel.request_file.read_text())
        except OSError as error:
            raise BuilderError(f"cannot read the request {kernel.request_file}: "
                               f"{error.strerror}", "write one with --save-request") from None
        except ValueError:
            raise BuilderError(f"{kernel.request_file} is not JSON",
                               "write a request with --save-request") from None
        request = KernelRequest.from_json(data)
        check_groups(request.groups)
        return request
    target = select_target(options)
    source = obtain_source(options, target)
    pins = read_pins(source)
    lane = target.lane(kernel.lane)
    label = kernel_label(target.local_label, lane)
    if kernel.arch_list is None:
        check_arch_list(target.arch_list, pins)
        arch_list = target.arch_list
    else:
        arch_list = kernel.arch_list
        for arch in arch_list:
            if not re.fullmatch(r"\d+\.\d+[af]?", arch):
                raise BuilderError(f"arch {arch!r} is not like 9.0a or 12.0a",
                                   "write compute capability major.minor, with a or f")
        check_arch_list(arch_list, pins)  # a plain 12.0, or the other SM120 variant
        label += "." + ".".join(arch_code(a).replace("_", "") for a in arch_list)
    groups = tuple(kernel.groups or target.kernel_groups or DEFAULT_GROUPS)
    check_groups(groups)
    # Head dims matter to the attention group alone (and so to the cache key).
    head_dims = (kernel.head_dims or target.head_dims or DEFAULT_HEAD_DIMS) \
        if "attention" in groups else ()
    return KernelRequest(target.name, pins, kernel_wheel_version(pins, label), arch_list, lane,
                         tuple(groups), tuple(head_dims), source.source_date_epoch)


def build_environment(request: KernelRequest, kernel: KernelOptions, cache: Cache,
                      reporter: Reporter) -> tuple[PythonEnv, Path | None]:
    """The Python environment and nvcc a host-mode build uses.

    Returns:
        ``(environment, nvcc)``; nvcc is ``None`` when it comes from PyPI's wheels inside
        the environment.

    Raises:
        BuilderError: see :func:`builder.toolchain.managed_environment` and
            :func:`builder.toolchain.current_environment`.
    """
    flashinfer = str(request.pins.flashinfer)
    if kernel.environment == "current":
        return current_environment(flashinfer), kernel.nvcc
    nvcc = kernel.nvcc or local_nvcc(request.lane)
    torch, indexes = build_torch(request, kernel.build_torch)
    requirements = [f"flashinfer-python=={flashinfer}", torch, "ninja",
                    *cuda_wheels(request.lane, compiler=nvcc is None)]
    if kernel.sccache:
        requirements.append("sccache")
    return managed_environment(requirements, cache, reporter, wheelhouse=kernel.wheelhouse,
                               extra_index_urls=indexes), nvcc



def run_kernels(options: Options, kernel: KernelOptions) -> KernelResult:
    """Build the target's kernel wheel on this machine or in a CUDA build container.

    Raises:
        BuilderError: see :func:`kernel_request` and :func:`builder.kernels.build_kernels`;
            in container mode also :func:`builder.container.build_kernels_in_container`.
    """
    request = kernel_request(options, kernel)
    cache = Cache(options.cache_dir)
    if kernel.mode == "container":
        from builder.container import build_kernels_in_container

        return build_kernels_in_container(request, kernel, cache=cache,
                                          dist_dir=options.dist_dir,
                                          reporter=options.reporter)
    env, nvcc = build_environment(request, kernel, cache, options.reporter)
    sccache = None
    if kernel.sccache:
        sccache = Sccache(find_sccache(env), sccache_settings())
    return build_kernels(request, env, nvcc=nvcc, cache=cache, dist_dir=options.dist_dir,
                         reporter=options.reporter, sccache=sccache, jobs=kernel.jobs)
# --- CI: plan and upstream check ---------------------------------------------------------

def run_plan(options: Options) -> Plan:
    """The CI plan: every target of the targets file as a matrix entry (no downloads).

    Raises:
        BuilderError: the targets file is missing or invalid.
    """
    return plan_targets(load_targets(options.targets_file))


def run_upstream(options: Options, *, pre: bool = False) -> UpstreamReport:
    """Check the releases newer than the newest target against the series.

    Lists the default target's project on ``options.index_url``, keeps the releases
    newer than every target's upstream version (no yanked ones; pre-releases only with
    ``pre``), runs :func:`run_check` on them and sorts the cells
    (:func:`builder.upstream.assess`).

    Raises:
        BuilderError: the targets or series file is invalid, the index is unreachable,
            or a new release cannot be fetched.
    """
    targets = load_targets(options.targets_file)
    project = targets.get(None).sdist_project
    newest = max(t.upstream_version for t in targets.targets.values())
    options.reporter.info(f"Listing {project} on {options.index_url}")
    versions, skipped = newer_releases(list_releases(project, options.index_url), newest,
                                       pre=pre)
    matrix = run_check(options, versions=[str(v) for v in versions]) if versions else None
    findings, unpatched = assess(matrix) if matrix else ((), ())
    return UpstreamReport(project=project, index_url=options.index_url,
                          newest_target=str(newest),
                          new_versions=tuple(str(v) for v in versions),
                          skipped=tuple(skipped), matrix=matrix, findings=findings,
                          unpatched=unpatched)

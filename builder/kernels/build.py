"""The kernel build: FlashInfer's modules compiled ahead of time for sm_120, as a wheel.

:func:`build_kernels` compiles the module groups with FlashInfer's own JIT spec
functions of the pinned version (``data/flashinfer_aot.py`` runs them in the build
environment, without importing ``flashinfer``'s ``__init__``, so no GPU is needed), checks
every library's SASS with cuobjdump and packs a ``flashinfer_jit_cache`` wheel, or from
FlashInfer 0.7 a ``flashinfer-jit-cache-sm120f`` provider and the shim pinning it
(:mod:`builder.kernels.jitcache`). The wheel is a cache entry
keyed by every input, so a rebuild with unchanged inputs runs no compiler; with sccache as
nvcc's launcher, object files are shared between build folders and machines (a local disk
cache, Redis or S3: sccache's own ``SCCACHE_*`` variables). What to build is decided first
(:mod:`builder.kernels.pins`, :mod:`builder.kernels.request`), and
:mod:`builder.kernels.preflight` refuses a toolchain that cannot build it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.core.arch import SM120_FAMILY
from builder.core.cache import Cache, legacy_entry, sha256_file, sha256_json
from builder.core.errors import (
    BuilderError,
    BuildError,
    ConfigurationError,
    MissingToolError,
)
from builder.core.progress import Reporter
from builder.kernels import jitcache, prune, reproducible
from builder.kernels.pins import DEFAULT_GROUPS, KernelPins, uses_providers
from builder.kernels.preflight import preflight
from builder.kernels.shard import Shard, StepCosts, partition
from builder.kernels.toolchain import (
    PythonEnv,
    Toolchain,
    arch_code,
    assemble,
    find_nvcc,
    nvcc_release,
    sass_archs,
    toolkit_root,
    torch_index,
)

# --- the build ---------------------------------------------------------------------------

DEFAULT_HEAD_DIMS = (128,)
_DRIVER = Path(__file__).resolve().parent / "data" / "flashinfer_aot.py"
DRIVER = _DRIVER  # the lock's digest (builder.kernels.run) covers it too
_GROUP = re.compile(r"^(norm|activation|sampling|rope|page|attention|trtllm_utils|"
                    r"fused_moe_sm\d+[af]?|fp4_quantization_sm\d+[af]?|fp4_gemm_sm\d+[af]?)$")


def check_groups(groups: tuple[str, ...]) -> None:
    """Refuse a module group name before anything is installed or compiled.

    Raises:
        BuilderError: a name is not a group (whether FlashInfer has a per-arch spec
            function for an ``smNN`` is known only to FlashInfer, at compile time).
    """
    unknown = [g for g in groups if not _GROUP.match(g)]
    if unknown:
        raise ConfigurationError(f"unknown module group {', '.join(map(repr, unknown))}",
                                 "groups: norm, activation, sampling, rope, page, attention, "
                                 "trtllm_utils, fused_moe_smNN, fp4_quantization_smNN, "
                                 "fp4_gemm_smNN (e.g. fused_moe_sm120, fp4_quantization_sm120f)")
def check_moe_variants(variants: tuple[str, ...], groups: tuple[str, ...],
                       flashinfer: str) -> None:
    """Refuse MoE variants the build cannot prune to: a variant the prune rule does not know
    (:data:`prune.VARIANT_UNITS`), no fused MoE group to prune, or a FlashInfer whose
    ``MoeGemmRunner`` members were not checked (:data:`prune.CHECKED_HEADERS`). One rule for
    a resolved request and a saved one.

    Args:
        variants: the dtype pairs to keep (``()``: the full module; nothing is checked).
        groups: the request's module groups.
        flashinfer: the FlashInfer version it builds.

    Raises:
        ConfigurationError: the variants cannot be pruned to.
    """
    if not variants:
        return
    try:
        prune.kept_units(variants)
    except prune.PruneError as error:
        raise ConfigurationError(str(error), "name MoE variants of "
                                 "builder.kernels.prune.VARIANT_UNITS, or none for every "
                                 "dtype pair") from None
    if not has_fused_moe(groups):
        raise ConfigurationError("moe_variants prunes the fused MoE modules, and none is in "
                                 "the module groups", "add a fused_moe_smNN group, or give no "
                                 "moe_variants")
    if flashinfer not in prune.CHECKED_HEADERS:
        raise ConfigurationError(
            f"FlashInfer {flashinfer}'s MoeGemmRunner members were not checked for pruning "
            f"(checked: {', '.join(prune.CHECKED_HEADERS)})",
            "give no moe_variants (the full fused MoE module)")


#: The local label segment of a ``--fast-build`` kernel wheel (``0.6.14+sm120.1.cu130.fastbuild``).
FAST_BUILD_LABEL = "fastbuild"


def is_fast_build_version(version: str) -> bool:
    """Whether a kernel wheel version's local label marks a ``--fast-build``."""
    return FAST_BUILD_LABEL in version.partition("+")[2].lower().split(".")


def has_fused_moe(groups: tuple[str, ...]) -> bool:
    """Whether ``groups`` has a ``fused_moe_smNN`` group (the only ones a fast build changes)."""
    return any(g.startswith("fused_moe_sm") for g in groups)


# Peak memory per parallel compile job: CUTLASS MoE translation units take several GB each
# (issue "FlashInfer kernels for sm_120"); the small modules stay far below 1 GiB.
_GIB = 1 << 30
_JOB_MEMORY = {"fused_moe": 6 * _GIB, "fp4_gemm": 6 * _GIB, "fp4_quantization": 3 * _GIB,
               "attention": 2 * _GIB}


@dataclass(frozen=True)
class KernelRequest:
    """What to build, decided before anything compiles.

    Attributes:
        target: the target's name.
        pins: the lockstep pins read from the upstream source.
        version: the kernel wheel's version (``<flashinfer>+<label>``).
        arch_list: ``FLASHINFER_CUDA_ARCH_LIST`` entries (``("12.0a",)``).
        lane: the CUDA ``major.minor`` the toolchain must have.
        groups: module groups (see ``DEFAULT_GROUPS``; ``fused_moe_smNN`` and
            ``fp4_quantization_smNN`` name FlashInfer's per-arch spec functions).
        head_dims: head dimensions for the ``attention`` group.
        epoch: SOURCE_DATE_EPOCH of the upstream release, for reproducible wheels.
        fast_build: compile the CUTLASS fused MoE modules with TensorRT-LLM's
            ``FAST_BUILD`` (one TMA warp-specialised tile shape; for smoke tests, never
            for release).
        moe_variants: prune the CUTLASS fused MoE modules to these dtype pairs
            (:mod:`builder.kernels.prune`: ``"nvfp4 x nvfp4"``); empty: every pair.
    """

    target: str
    pins: KernelPins
    version: str
    arch_list: tuple[str, ...]
    lane: str
    groups: tuple[str, ...]
    head_dims: tuple[int, ...]
    epoch: int
    fast_build: bool = False
    moe_variants: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data (:meth:`from_json` reads it back)."""
        described = {"target": self.target, "version": self.version,
                     "arch_list": list(self.arch_list), "cuda_lane": self.lane,
                     "groups": list(self.groups), "head_dims": list(self.head_dims),
                     "epoch": self.epoch, "pins": self.pins.describe()}
        if self.fast_build:  # absent otherwise: the digests of full builds stay as they were
            described["fast_build"] = True
        if self.moe_variants:  # likewise: an unpruned request keeps its digest
            described["moe_variants"] = list(self.moe_variants)
        return described

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelRequest:
        """Read a request written by :meth:`describe` (a build container gets it so).

        Raises:
            BuilderError: a field is missing or malformed.
        """
        fast = data.get("fast_build", False) if isinstance(data, dict) else False
        variants = data.get("moe_variants", []) if isinstance(data, dict) else []
        if not (isinstance(variants, list) and all(isinstance(v, str) for v in variants)):
            raise ConfigurationError(f"not a kernel request (moe_variants is {variants!r}, "
                                     "not a list of strings)", "write it with `python -m "
                                     "builder kernels plan --output FILE`")
        if not isinstance(fast, bool):
            raise ConfigurationError(f"not a kernel request (fast_build is {fast!r}, not true or "
                                     "false)", "write it with `python -m builder kernels "
                                     "plan --output FILE`")
        try:
            pins = data["pins"]
            request = cls(data["target"], KernelPins(
                Version(pins["flashinfer_python"]),
                Version(pins["flashinfer_cubin"]) if pins["flashinfer_cubin"] else None,
                tuple(pins["kernel"]) if pins["kernel"] else None,
                pins["torch"], pins["cuda_python"]), data["version"],
                tuple(data["arch_list"]), data["cuda_lane"], tuple(data["groups"]),
                tuple(int(h) for h in data["head_dims"]), int(data["epoch"]), fast,
                tuple(variants))
        except (KeyError, TypeError, ValueError, InvalidVersion) as error:
            what = f"no field {error}" if isinstance(error, KeyError) else str(error)
            raise ConfigurationError(
                f"not a kernel request ({what})",
                "write it with `python -m builder kernels plan --output FILE`") from None
        check_moe_variants(request.moe_variants, request.groups, str(request.pins.flashinfer))
        # A fast build must never pass for a full one, nor the other way round.
        if is_fast_build_version(request.version) != fast:
            raise ConfigurationError(
                f"the request's version {request.version} and its fast_build "
                f"({str(fast).lower()}) disagree",
                "write it again with `python -m builder kernels plan --output FILE`, not by "
                "hand")
        labels = request.version.partition("+")[2].lower().split(".")
        if (variants and prune.version_label(tuple(variants)) not in labels) or (
                not variants and any(w.startswith("moe") for w in labels)):
            raise ConfigurationError(
                f"the request's version {request.version} and its moe_variants "
                f"({', '.join(variants) or 'none'}) disagree",
                "write it again with `python -m builder kernels plan --output FILE`, not by "
                "hand")
        if fast and not has_fused_moe(request.groups):
            raise ConfigurationError(
                "the request is a fast build without a fused_moe_smNN group",
                "write it again with `python -m builder kernels plan --output FILE`, not by "
                "hand")
        return request


@dataclass(frozen=True)
class Sccache:
    """sccache as the compilers' launcher.

    Attributes:
        binary: the sccache executable.
        environment: ``SCCACHE_*`` settings passed through (``SCCACHE_DIR`` for a local
            disk cache, ``SCCACHE_REDIS_ENDPOINT``, ``SCCACHE_BUCKET`` ... for a shared one).
    """

    binary: Path
    environment: dict[str, str]


def sccache_settings() -> dict[str, str]:
    """This process's non-empty ``SCCACHE_*`` variables: sccache's own configuration. An
    empty one (a CI variable left unset) still counts as set for sccache, so it is left out."""
    return {k: v for k, v in os.environ.items() if k.startswith("SCCACHE_") and v}


@dataclass(frozen=True)
class KernelResult:
    """A built (or cached) kernel wheel.

    Attributes:
        request: what was asked for.
        wheel: the wheel in the output folder.
        sha256: the wheel's sha256.
        manifest: the manifest stored in the wheel.
        cached: True when no compiler ran (every input's hash was unchanged).
        sccache: sccache's statistics of this build (``None`` without sccache or cached).
        log: the compile log (``None`` when cached).
        compile_seconds: wall time of the compile when the entry was built.
        shim: FlashInfer >= 0.7 only: the ``flashinfer-jit-cache`` shim that pins the
            provider ``wheel`` (install both; ``None`` before 0.7, where ``wheel`` is the
            whole ``flashinfer_jit_cache``).
        shim_sha256: the shim's sha256.
        costs: the step-costs file this build recorded its step times in (``None`` when
            cached).
    """

    request: KernelRequest
    wheel: Path
    sha256: str
    manifest: dict[str, Any]
    cached: bool
    sccache: dict[str, Any] | None
    log: Path | None
    compile_seconds: float | None = None
    shim: Path | None = None
    shim_sha256: str | None = None
    costs: Path | None = None

    @property
    def wheels(self) -> tuple[Path, ...]:
        """Every wheel to install: the modules' wheel, and the shim when there is one."""
        return (self.wheel, self.shim) if self.shim else (self.wheel,)

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"wheel": str(self.wheel), "sha256": self.sha256, "cached": self.cached,
                "shim": str(self.shim) if self.shim else None,
                "shim_sha256": self.shim_sha256,
                "wheels": [str(w) for w in self.wheels],
                "request": self.request.describe(), "manifest": self.manifest,
                "sccache": self.sccache, "log": str(self.log) if self.log else None,
                "compile_seconds": self.compile_seconds,
                "step_costs": str(self.costs) if self.costs else None}


@dataclass(frozen=True)
class ShardResult:
    """One shard's compile steps, compiled into the shared sccache backend (no wheel).

    Attributes:
        request: what the whole build is.
        shard: which shard this was.
        steps: the compile steps this shard ran (names in FlashInfer's build folder).
        total_steps: compile steps in the whole graph.
        seconds: wall time of the shard's compile.
        sccache: sccache's statistics of this shard.
        costs: the step-costs file the split was balanced by (``None``: the costs that
            ship with the builder, or none).
        log: the compile log.
    """

    request: KernelRequest
    shard: Shard
    steps: list[str]
    total_steps: int
    seconds: float
    sccache: dict[str, Any] | None
    costs: Path | None
    log: Path

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"shard": str(self.shard), "steps": self.steps,
                "total_steps": self.total_steps, "seconds": self.seconds,
                "sccache": self.sccache, "step_costs": str(self.costs) if self.costs else None,
                "log": str(self.log),
                "request": self.request.describe()}


def compile_jobs(groups: tuple[str, ...], *, cpus: int | None = None,
                 available: int | None = None) -> int:
    """Parallel compile jobs: no more than the CPUs, nor than free memory allows.

    Args:
        groups: the module groups to build (the heaviest sets the per-job memory).
        cpus: CPU count (default: this process's affinity).
        available: free memory in bytes (default: ``MemAvailable`` of /proc/meminfo).

    Returns:
        At least 1.
    """
    cpus = cpus or len(os.sched_getaffinity(0))
    if available is None:
        available = _mem_available()
    per_job = max([_GIB] + [memory for prefix, memory in _JOB_MEMORY.items()
                            for group in groups if group.startswith(prefix)])
    return max(1, min(cpus, available // per_job))


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


@dataclass(frozen=True)
class KernelBuild:
    """What every step of one kernel build (or one shard of it) shares, decided once.

    Made by :meth:`create` and passed down whole: the request, the build environment,
    the cache, the progress output, the launcher and the parallel jobs. The compiler and
    the cache key are worked out on first use (so a refusal of ``--dist`` or of a shard
    without sccache still comes before nvcc is looked for, as it always did).

    Attributes:
        request: what to build.
        env: the interpreter with the pinned FlashInfer.
        cache: the cache (entries, build folders, step costs, kept logs).
        reporter: progress output; compiler lines go to its detail stream.
        jobs: parallel compile jobs.
        nvcc: the compiler as given (``None``: see
            :func:`builder.kernels.toolchain.find_nvcc`).
        sccache: compile through sccache (``None``: without).
    """

    request: KernelRequest
    env: PythonEnv
    cache: Cache
    reporter: Reporter
    jobs: int
    nvcc: Path | None = None
    sccache: Sccache | None = None

    @classmethod
    def create(cls, request: KernelRequest, env: PythonEnv, *, cache: Cache,
               nvcc: Path | None = None, reporter: Reporter | None = None,
               sccache: Sccache | None = None, jobs: int | None = None) -> KernelBuild:
        """The build of ``request`` in ``env``, with the defaults filled in.

        Args:
            request: what to build.
            env: the interpreter with the pinned FlashInfer.
            cache: the cache.
            nvcc: the compiler (``None``: found in ``env`` or on this machine).
            reporter: progress output (``None``: quiet).
            sccache: compile through sccache.
            jobs: parallel compile jobs (``None``: :func:`compile_jobs`).
        """
        return cls(request, env, cache, reporter or Reporter(quiet=True),
                   jobs or compile_jobs(request.groups), nvcc, sccache)

    @cached_property
    def compiler(self) -> Path:
        """The nvcc this build runs (:func:`builder.kernels.toolchain.find_nvcc`).

        Raises:
            BuilderError: no nvcc is found.
        """
        return find_nvcc(self.nvcc, self.env)

    @cached_property
    def key(self) -> str:
        """The kernel entry's key: everything that decides the wheel's bytes."""
        release = nvcc_release(self.compiler)
        request = self.request
        return sha256_json({"request": request.describe(), "epoch": request.epoch,
                            "env": self.env.identity, "nvcc": release and list(release),
                            "host_compilers": host_compilers(),
                            "flags": {k: os.environ.get(k) for k in _FLAG_VARIABLES},
                            "driver": sha256_file(_DRIVER),
                            "jitcache": sha256_file(Path(jitcache.__file__)),
                            "reproducible": reproducible.SCHEME,
                            # the prune rule decides a pruned module's sources
                            **({"prune": sha256_file(Path(prune.__file__))}
                               if request.moe_variants else {})})


@dataclass(frozen=True)
class _Site:
    """Where one build compiles: its build folder and the ``CUDA_HOME`` assembled there."""

    work: Path
    toolchain: Toolchain

    def maps(self, build: KernelBuild) -> list[tuple[str, str]]:
        """The build's folders and their fixed names (:func:`reproducible.path_maps`)."""
        return reproducible.path_maps({
            "site-packages": [build.env.site_packages],
            "cuda": [toolkit_root(self.toolchain.nvcc)]})


def run_streaming(command: list[str], environment: dict[str, str], log: Path,
                  reporter: Reporter) -> tuple[int, str]:
    """Run ``command``, copying its stderr to ``log`` and to the reporter line by line.

    Its stdout is read at the same time, by a thread: the driver writes its result there
    only at the end, and a result larger than the pipe's buffer (64 KiB on Linux, e.g. a
    build with a hundred long step names) would otherwise block the driver while this
    waits for its stderr to close (a build of the H200 run's SM90 attention set hung so).

    Args:
        command: the command line.
        environment: its whole environment.
        log: the file its stderr is written to.
        reporter: gets each stderr line as a detail.

    Returns:
        The exit status and the whole stdout.
    """
    with log.open("w") as handle, subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, errors="replace") as process:
        assert process.stderr is not None and process.stdout is not None
        stdout = process.stdout
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(stdout.read()), daemon=True)
        reader.start()
        for line in process.stderr:
            handle.write(line)
            handle.flush()
            reporter.detail(line.rstrip("\n"))
        reader.join()
    return process.returncode, "".join(chunks)


def _sccache_environment(sccache: Sccache, sockets: Path, bases: list[Path]) -> dict[str, str]:
    return {**sccache.environment,
            # A unix socket path must stay under 108 bytes: a short folder, not the cache.
            "SCCACHE_SERVER_UDS": str(sockets / "sccache.sock"),
            # Paths under these folders hash as relative: two build folders share objects.
            "SCCACHE_BASEDIRS": ":".join(str(b) for b in bases),
            "SCCACHE_IDLE_TIMEOUT": "0"}


def _sccache_stats(sccache: Sccache, environment: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([str(sccache.binary), "--show-stats", "--stats-format", "json"],
                          env=environment, capture_output=True, text=True, check=False)
    subprocess.run([str(sccache.binary), "--stop-server"], env=environment,
                   capture_output=True, check=False)
    try:
        stats: dict[str, Any] = json.loads(done.stdout)["stats"]
    except (ValueError, KeyError):
        return {"error": (done.stderr or done.stdout).strip()[-300:]}
    def total(name: str) -> int:
        value = stats.get(name, 0)
        return sum(value.get("counts", {}).values()) if isinstance(value, dict) else int(value)

    return {"compile_requests": total("compile_requests"), "hits": total("cache_hits"),
            "misses": total("cache_misses"), "non_cacheable": total("non_cacheable_compilations"),
            "errors": total("cache_errors")}


def build_kernels(build: KernelBuild, dist_dir: Path) -> KernelResult:
    """Compile ``request``'s module groups on this machine and pack the kernel wheel.

    FlashInfer's own spec functions (of the pinned version, in ``env``) generate and build
    every module against a ``CUDA_HOME`` assembled from ``nvcc`` and NVIDIA's wheels
    (:func:`builder.kernels.toolchain.assemble`), after the preflight passed. Every library must
    hold SASS for exactly the requested archs. The wheel is a cache entry keyed by the
    request, the environment and the compiler: an unchanged rebuild runs no compiler.

    Args:
        build: the request, environment, compiler, cache, progress, launcher and jobs
            (:meth:`KernelBuild.create`).
        dist_dir: where the wheel is copied.

    Raises:
        BuilderError: a preflight check failed (all failures are listed), a module group
            is unknown to this FlashInfer, a compile failed (the log's tail is in the
            message), or a library lacks SASS for an arch or has SASS for another.
    """
    if dist_dir.exists() and not dist_dir.is_dir():  # before any work, not after
        raise BuildError(f"{dist_dir} is not a folder", "pass --dist a folder")
    request, cache, key = build.request, build.cache, build.key
    stats: dict[str, Any] | None = None
    costs = costs_file(cache, request)

    def make(tmp: Path) -> dict[str, Any]:
        nonlocal stats
        with _workspace(build) as site:
            try:
                stats, wheels = _compile(build, site, tmp, costs)
            except BuilderError as error:
                raise _keep_log(build, site.work, error) from None
        wheel, shim = wheels[0], (wheels[1] if len(wheels) > 1 else None)
        return {"wheel": wheel.name, "shim": shim.name if shim else None, "sccache": stats,
                "compile_seconds": float((tmp / "compile-seconds").read_text())}

    # A damaged kernel wheel is removed and refused, never shipped nor silently rebuilt
    # (a rebuild takes hours: the user decides).
    entry = cache.artifact("kernels", key, make, record="*.whl", on_damage="refuse",
                           adopt=legacy_entry("kernels.json", lambda meta: {
                               meta["wheel"]: meta["sha256"],
                               **({meta["shim"]: meta["shim_sha256"]} if meta.get("shim")
                                  else {})}))
    cached = entry.cached
    wheel, shim = entry.meta["wheel"], entry.meta.get("shim")
    copied = {name: entry.copy_to(name, dist_dir) for name in (wheel, shim) if name}
    return KernelResult(request, copied[wheel], entry.files[wheel].sha256,
                        jitcache.read_manifest(entry.file(wheel)), cached, stats,
                        None if cached else entry.path / "build.log",
                        entry.meta.get("compile_seconds"),
                        shim=copied[shim] if shim else None,
                        shim_sha256=entry.files[shim].sha256 if shim else None,
                        costs=None if cached else costs)


def compile_shard(build: KernelBuild, shard: Shard, *,
                  step_costs: Path | None = None) -> ShardResult:
    """Compile shard ``shard`` of the request's compile steps into the sccache backend.

    The steps are those of the ninja graph FlashInfer writes for the request (the same
    graph :func:`build_kernels` runs), split by :func:`builder.kernels.shard.partition`
    with the recorded step costs. The shard compiles in the same build folder as the
    final build (the fixed root), so its objects are the final build's
    bytes. No link, no wheel, no cache entry; the step times are recorded.

    Args:
        build: the whole build's request (every shard and the final job get the same),
            environment, compiler, cache (the build folder and the step costs live there),
            progress, jobs on this machine, and the launcher: required, its backend must
            be the final job's.
        shard: which 1/N.
        step_costs: balance by this costs file instead of the cache's.

    Raises:
        BuilderError: no sccache, a preflight check failed, the costs file is not one,
            or a compile failed (the log's tail is in the message).
    """
    if build.sccache is None:
        raise ConfigurationError("a shard without --sccache compiles objects nobody can "
                                 "reuse", "add --sccache, with the final job's shared backend "
                                 "(SCCACHE_REDIS_ENDPOINT, SCCACHE_BUCKET ...)")
    request, cache, key, jobs = build.request, build.cache, build.key, build.jobs
    recorded = costs_file(cache, request)
    # The same split on every runner: a given file, else this cache's record, else the
    # costs measured for the default set that ship with the builder, else by count.
    balance = step_costs or (recorded if recorded.exists() else None)
    costs = StepCosts(balance).read() if balance else seed_costs()
    with _workspace(build) as site:
        # With the launcher already: FlashInfer writes nvcc's command into the graph once.
        listed, _ = _run_driver(build, site, {"steps": True},
                                f"Listing the compile steps of {shard}")
        steps = sorted(s for s, info in listed["steps"].items() if info["compile"])
        mine = partition(steps, costs["steps"], shard.count)[shard.index - 1]
        try:
            result, stats = _run_driver(
                build, site, {"targets": mine},
                f"Compiling shard {shard}: {len(mine)} of {len(steps)} compile steps "
                f"({jobs} jobs)")
        except BuilderError as error:
            raise _keep_log(build, site.work, error) from None
        if _compiled(stats):
            StepCosts(recorded).record(result.get("step_seconds", {}), set(steps), jobs)
        log = cache.root / "logs" / f"kernels-{key[:16]}-shard-{shard.index}-of-" \
            f"{shard.count}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site.work / "build.log", log)
    return ShardResult(request, shard, mine, len(steps), float(result.get("seconds", 0.0)),
                       stats, balance, log)


def seed_costs() -> dict[str, Any]:
    """Step costs that ship with the builder (``data/step-costs-*.json``: measured builds of
    the default set, named in each file), merged; for shards on fresh runners."""
    merged: dict[str, Any] = {"steps": {}, "links": {}}
    for path in sorted((Path(__file__).resolve().parent / "data").glob("step-costs-*.json")):
        data = StepCosts(path).read()
        merged["steps"].update(data["steps"])
        merged["links"].update(data["links"])
    return merged


def _compiled(stats: dict[str, Any] | None) -> bool:
    """Whether a build's step times are compile costs: not when every object came from the
    cache (a final build after its shards: its times are lookups). A build with some
    hits (a shard that died) still records; that only skews the next split."""
    return not stats or bool(stats.get("misses")) or not stats.get("hits")


def costs_file(cache: Cache, request: KernelRequest) -> Path:
    """Where the step costs of ``request`` are recorded in the cache (one file per request,
    whatever the machine: the split must be the same on every shard)."""
    return cache.root / "kernel-costs" / f"{sha256_json(request.describe())[:16]}.json"


@contextlib.contextmanager
def _workspace(build: KernelBuild) -> Iterator[_Site]:
    """The build folder: the fixed root :data:`reproducible.FIXED_ROOT`, the same path on
    every machine and for every build, with FlashInfer staged in it, ``CUDA_HOME``
    assembled in it and the preflight passed (:func:`_toolchain`).

    nvcc names each translation unit's internal symbols after the source's absolute path
    (cudafe++'s ``--orig_src_path_name``, nvcc 13.0) and no option maps it, so FlashInfer's
    sources, the generated ones and the objects must lie at one path everywhere
    (:func:`reproducible.stage`); shards and the final job compile there too. So the root
    is one path for every user (a per-user path would give each user other bytes), in a
    world-writable folder: nothing there is trusted. A user's builds take turns on their
    own lock (:func:`_build_lock`); the root is made afresh, owner-only, and a build of
    another user finds it theirs and is refused (:func:`_claim_root`). The root is
    removed after the build.

    Raises:
        BuilderError: a preflight check failed; the lock or the root is a link, not a
            file or folder, or another user's, or cannot be made (exit 3, naming it).
    """
    reporter = build.reporter
    folder = Path(reproducible.FIXED_ROOT)
    with _build_lock(folder) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with reporter.working("Waiting for another kernel build of this user"):
                fcntl.flock(lock, fcntl.LOCK_EX)
        _claim_root(folder)
        try:
            reproducible.stage(build.env.site_packages, folder / "site")
            yield _Site(folder, _toolchain(build, folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def build_lock_path(root: Path) -> Path:
    """The lock of this user's kernel builds, beside the fixed root:
    ``<root>-<uid>.lock`` (``/tmp/sglang-sm120-build-1000.lock``)."""
    return root.with_name(f"{root.name}-{os.geteuid()}.lock")


@contextlib.contextmanager
def _build_lock(root: Path) -> Iterator[int]:
    """Open (creating it, owner-only) this user's build lock beside ``root``; yield its
    descriptor, closed at the end.

    The folder is world-writable (``/tmp``): another user can plant a link or a file
    there. The lock is opened with ``O_NOFOLLOW`` and without ``O_TRUNC`` (a link is never
    followed, no file is ever emptied), must be a regular file of this user, and is only
    locked, never written.

    Raises:
        MissingToolError: it is a link, not a regular file, another user's, or cannot be
            opened (exit 3; the hint names it).
    """
    path = build_lock_path(root)
    hint = (f"remove {path} (as its owner or root; the builder makes a new one, owner-only);"
            " nothing was written through it")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC, 0o600)
    except OSError as exc:
        what = "a symbolic link" if os.path.islink(path) else f"not openable ({exc.strerror})"
        raise MissingToolError(f"the kernel build lock {path} is {what}", hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MissingToolError(f"the kernel build lock {path} is not a regular file", hint)
        if info.st_uid != os.geteuid():
            raise MissingToolError(f"the kernel build lock {path} belongs to another user "
                                   f"(uid {info.st_uid})", hint)
        yield fd
    finally:
        os.close(fd)


def _claim_root(root: Path) -> None:
    """Make the fixed root afresh, owner-only (``0700``), holding this user's lock.

    ``mkdir`` is atomic: of two users, one makes it and the other finds it. A root of this
    user's is what a killed build of theirs left (their lock is held): it is emptied. A
    link, a file or another user's folder is never entered, emptied or followed.

    Raises:
        MissingToolError: the root is a symbolic link, not a folder, another user's (their
            build runs there, or was killed and left it), or cannot be made (exit 3; the
            hint names the root).
    """
    hint = (f"every kernel build compiles in {root} (the same path everywhere, for the same "
            f"bytes); once no build of its owner runs, have {root} removed (by its owner or "
            "root), then build again")
    try:
        os.mkdir(root, 0o700)
        return
    except FileExistsError:
        pass
    except OSError as exc:
        raise MissingToolError(f"the kernel build root {root} cannot be made: "
                               f"{exc.strerror}", hint) from None
    info = os.lstat(root)
    if stat.S_ISLNK(info.st_mode):
        raise MissingToolError(f"the kernel build root {root} is a symbolic link", hint)
    if not stat.S_ISDIR(info.st_mode):
        raise MissingToolError(f"the kernel build root {root} is not a folder", hint)
    if info.st_uid != os.geteuid():
        raise MissingToolError(f"the kernel build root {root} belongs to another user "
                               f"(uid {info.st_uid}): a kernel build of theirs runs there, or "
                               "a killed one left it", hint)
    try:  # this user's, left by a killed build (the lock is held)
        shutil.rmtree(root)
        os.mkdir(root, 0o700)
    except OSError as exc:
        raise MissingToolError(f"the kernel build root {root} cannot be emptied: "
                               f"{exc.strerror} ({exc.filename})", hint) from None


def _toolchain(build: KernelBuild, work: Path) -> Toolchain:
    """Assemble ``CUDA_HOME`` in the build folder and run the preflight on it.

    Raises:
        BuilderError: a preflight check failed (all failures are listed).
    """
    request, env = build.request, build.env
    toolchain = assemble(build.compiler, env, work / "cuda")
    checks = preflight(nvcc=toolchain.nvcc, lane=request.lane, arches=list(request.arch_list),
                       include_dirs=list(toolchain.include_dirs), python=env.python)
    failed = [c for c in checks if not c.ok]
    if failed:
        torch_hint = "; --build-torch torch==X (a CPU build is enough to compile)" \
            if any(c.name == "torch" for c in failed) else ""
        fixes = "".join(f"; {c.fix}" for c in failed if c.fix and c.name != "torch")
        raise BuildError("the toolchain cannot build these kernels: " + "; ".join(
            f"{c.name}: {c.detail}" for c in failed),
            "fix the toolchain (see `python -m builder preflight`)" + fixes + torch_hint)
    return toolchain


def _keep_log(build: KernelBuild, work: Path, error: BuilderError) -> BuilderError:
    """``error`` with the whole compile log kept under ``<cache>/logs/`` and named."""
    kept = build.cache.root / "logs" / f"kernels-{build.key[:16]}.log"
    if (work / "build.log").exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work / "build.log", kept)
    return error.replaced(hint=f"{error.hint}; the whole compile log: {kept}"
                          if error.hint else f"the whole compile log: {kept}")


#: Environment variables that change what nvcc or the host compiler produce.
_FLAG_VARIABLES = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CXX", "CC", "CXXFLAGS",
                   "CFLAGS", "LDFLAGS", "FLASHINFER_JIT_LINEINFO", "FLASHINFER_JIT_DEBUG",
                   "FLASHINFER_NVCC_THREADS", *reproducible.FLASHINFER_FLAG_VARIABLES)


def builder_version() -> str:
    """This builder's version (installed metadata, else the repository's VERSION file;
    the wheel stage's own reader is not imported here)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-sm120-builder")
    except PackageNotFoundError:
        found = Path(__file__).resolve().parents[2] / "VERSION"
        return found.read_text().strip() if found.is_file() else "unknown"


def rebuild_record(nvcc: str, compilers: Mapping[str, str],
                   maps: list[tuple[str, str]]) -> dict[str, Any]:
    """What a rebuild needs besides the request to give the same bytes, as the manifest
    records it (no path of the build machine in it).

    Args:
        nvcc: nvcc's full release (``13.0.88``).
        compilers: :func:`host_compilers` (both version lines are recorded).
        maps: the build's prefix maps (only their fixed names are recorded).
    """
    return {"reproducible": reproducible.SCHEME, "builder": builder_version(),
            "nvcc": nvcc, **compilers,
            "build_flags_sha256": reproducible.flags_digest(maps),
            "fixed_root": reproducible.FIXED_ROOT}


def _version_line(command: str) -> str:
    try:
        out = subprocess.run([command.split()[-1], "--version"], capture_output=True,
                             text=True, check=False, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "none"
    return out.splitlines()[0] if out else "none"


def host_compilers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The version lines of the two host compilers a FlashInfer build runs (part of the
    cache key and of the manifest's ``rebuild`` record).

    FlashInfer compiles its C++ sources and links with ``$CXX`` (default ``c++``) and hands
    ``$CC`` to nvcc as ``-ccbin`` (``jit/cpp_ext.py``, FlashInfer 0.6.3 to 0.7.2); without
    ``CC`` nvcc runs ``gcc`` from ``PATH`` (nvcc's default host compiler on Linux, CUDA 13.0
    nvcc documentation, ``--compiler-bindir``). nvcc's host compiler compiles every
    ``.cu`` file's host code: on the lent H200 machine (``CC=/opt/gcc/bin/gcc``, GCC 13.3)
    the same request gave other host code than GCC 12.2 here, with byte-identical cubins
    (``reports/2026-12-01-h200-kernel-repro/``).

    Args:
        environ: the build's environment (default: this process's).

    Returns:
        ``{"host_compiler": <$CXX or c++>, "nvcc_host_compiler": <$CC or gcc>}``, each the
        compiler's first ``--version`` line, ``"none"`` where it does not run.
    """
    env = os.environ if environ is None else environ
    return {"host_compiler": _version_line(env.get("CXX") or "c++"),
            "nvcc_host_compiler": _version_line(env.get("CC") or "gcc")}


def _run_driver(build: KernelBuild, site: _Site, extra: dict[str, Any],
                title: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run ``data/flashinfer_aot.py`` in the build folder ``site.work``, with ``extra`` in
    its argument and ``title`` as the progress line.

    Returns:
        The driver's result object and sccache's statistics (or ``None``).

    Raises:
        BuilderError: sccache did not start, FlashInfer lacks a group, or a compile failed.
    """
    request, env, sccache, work = build.request, build.env, build.sccache, site.work
    toolchain = site.toolchain
    environment = {**os.environ, "CUDA_HOME": str(toolchain.cuda_home),
                   "FLASHINFER_CUDA_ARCH_LIST": " ".join(request.arch_list),
                   "FLASHINFER_WORKSPACE_BASE": str(work / "flashinfer"),
                   "MAX_JOBS": str(build.jobs),
                   # FlashInfer runs `ninja` from PATH: the build environment's own first.
                   "PATH": os.pathsep.join([str(env.python.parent),
                                            os.environ.get("PATH", os.defpath)])}
    environment.pop("FLASHINFER_DISABLE_JIT", None)
    # The libraries name no folder of this machine, and no process id (issue 29).
    environment.update(reproducible.flag_environment(site.maps(build), environment))
    # FlashInfer is imported from its copy in the fixed root (its paths are resolved).
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(work / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    for name in [k for k in environment if k.startswith("SCCACHE_")]:
        del environment[name]  # only sccache_settings() reach sccache, below
    sockets = Path(tempfile.mkdtemp(prefix="sm120-sccache-",
                                    dir="/tmp" if Path("/tmp").is_dir() else None))
    stats = None
    try:
        if sccache is not None:
            environment.update(_sccache_environment(sccache, sockets,
                                                    [work]))
            environment["FLASHINFER_NVCC"] = f"{sccache.binary} {toolchain.nvcc}"
            environment["CXX"] = f"{sccache.binary} {environment.get('CXX', 'c++')}"
            started = subprocess.run([str(sccache.binary), "--start-server"],
                                     env=environment, capture_output=True, text=True,
                                     check=False)
            if started.returncode != 0:
                raise BuildError("sccache did not start: " + (
                    started.stderr or started.stdout).strip()[-300:],
                    "check the SCCACHE_* settings (its cache backend must answer)")
        log = work / "build.log"
        argument = json.dumps({"out": str(work / "modules"), "groups": list(request.groups),
                               "head_dims": list(request.head_dims),
                               "fast_build": request.fast_build,
                               "moe_variants": list(request.moe_variants), **extra})
        with build.reporter.working(title):
            code, out = run_streaming([str(env.python), str(_DRIVER), argument], environment,
                                      log, build.reporter)
        if sccache is not None:
            stats = _sccache_stats(sccache, environment)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {}
    if code != 0 or not ({"modules", "steps"} & set(result)):
        if "error" in result:
            raise BuildError(result["error"], "module groups: " + ", ".join(DEFAULT_GROUPS)
                             + ", fused_moe_smNN, fp4_quantization_smNN, fp4_gemm_smNN")
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise BuildError(f"compiling FlashInfer modules failed:\n{tail}", "")
    return result, stats


def _compile(build: KernelBuild, site: _Site, tmp: Path,
             costs: Path) -> tuple[dict[str, Any] | None, list[Path]]:
    """Build the whole graph in ``site.work``, record the step times in ``costs``, verify
    the SASS, pack the wheel(s) into ``tmp`` (with the log).

    Returns:
        sccache's statistics (or ``None``) and the wheels: the modules' wheel first (the
        provider from FlashInfer 0.7 on), then the shim if there is one.
    """
    request, jobs, work, toolchain = build.request, build.jobs, site.work, site.toolchain
    modules = work / "modules"
    try:
        result, stats = _run_driver(build, site, {}, f"Compiling {', '.join(request.groups)} "
                                                     f"for {' '.join(request.arch_list)} "
                                                     f"({jobs} jobs)")
    finally:
        if (work / "build.log").exists():
            shutil.copyfile(work / "build.log", tmp / "build.log")
    compile_steps = {s for s, info in result.get("steps", {}).items() if info["compile"]}
    if _compiled(stats):
        StepCosts(costs).record(result.get("step_seconds", {}), compile_steps, jobs)
    expected = sorted(arch_code(arch) for arch in request.arch_list)
    maps = site.maps(build)
    machine = [old for old, _new in maps] + [str(build.cache.root),
                                             os.path.realpath(build.cache.root)]
    entries = []
    for name, info in sorted(result["modules"].items()):
        library = modules / info["path"]
        leaked = reproducible.leaked_paths(library, machine)
        if leaked:
            raise BuildError(f"{info['path']} names folders of this machine: "
                             f"{', '.join(leaked)} (its bytes would differ elsewhere)",
                             "leave FLASHINFER_JIT_LINEINFO and FLASHINFER_JIT_DEBUG unset; "
                             "a module with -lineinfo or -G in its own flags cannot be "
                             "built reproducibly (docs/kernels.md, reproducible builds)")
        sass, ptx = sass_archs(toolchain.cuobjdump, library)
        if sass != expected:
            raise BuildError(f"{info['path']} has SASS for {', '.join(sass) or 'nothing'}, "
                             f"expected exactly {', '.join(expected)}",
                             "check FLASHINFER_CUDA_ARCH_LIST and the module's own flags")
        entries.append({"name": name, "group": info["group"], "path": info["path"],
                        "sha256": sha256_file(library), "sass": sass, "ptx": ptx,
                        # a pruned fused MoE: the dtype pairs it runs, what was stubbed
                        **({"pruned": info["pruned"]} if info.get("pruned") else {})})
    flags = {name: [info["cflags"], info["cuda_cflags"]]
             for name, info in sorted(result["modules"].items())}
    manifest = {"schema": jitcache.MANIFEST_SCHEMA, "target": request.target,
                "flashinfer_version": result["flashinfer"], "version": request.version,
                "arch_list": list(request.arch_list), "cuda_version": toolchain.lane,
                "nvcc_version": toolchain.release, "flags_sha256": sha256_json(flags),
                "groups": list(request.groups), "head_dims": list(request.head_dims),
                "modules": entries, "rebuild": rebuild_record(toolchain.release,
                                                              host_compilers(), maps)}
    if request.fast_build:
        manifest["fast_build"] = True
    if request.moe_variants:  # what the fused MoE modules cover (derive.missing_from)
        manifest["moe_variants"] = list(request.moe_variants)
    if uses_providers(request.pins.flashinfer):
        provider = jitcache.pack_provider(modules, request.version, manifest, request.epoch,
                                          tmp)
        shim = jitcache.pack_shim(request.version, [jitcache.provider_id(request.arch_list[0])],
                                  result["flashinfer"], request.epoch, tmp)
        wheels = [provider, shim]
    else:
        wheels = [jitcache.pack(modules, request.version, manifest, request.epoch, tmp)]
    for scratch in ("workspace", "modules", "cuda"):
        shutil.rmtree(tmp / scratch, ignore_errors=True)
    (tmp / "compile-seconds").write_text(str(result.get("seconds")))
    return stats, wheels


def build_torch(request: KernelRequest, override: str | None) -> tuple[str, tuple[str, ...]]:
    """The torch requirement of the build environment and where to look for it.

    Returns:
        ``(requirement, extra index URLs)``: ``override`` as given (a CPU build is enough
        to compile) with no extra index, or the target's pin from PyTorch's index for the
        lane (:func:`builder.kernels.toolchain.torch_index`), so its CUDA version is the lane's.
    """
    if override:
        return override, ()
    return request.pins.torch or "torch", (torch_index(request.lane),)


def sm120_path_modules(env: PythonEnv, lane: str) -> dict[str, Any]:
    """The modules the pinned FlashInfer (in ``env``) loads on an SM120 GPU for SGLang's
    NVFP4 MoE path with ``flashinfer_cutlass``: the MoE runner, FP4 quantization, FP4 GEMM
    and the autotuner (``data/flashinfer_aot.py``, ``PATHS``). FlashInfer's own loader
    functions run with ``build_and_load`` recording the module instead of compiling; the
    caller's source is read to confirm it still calls that loader. No GPU, no compiler.

    Args:
        env: the build environment with the pinned FlashInfer.
        lane: the CUDA lane (``torch.version.cuda`` of the serving torch; it picks
            ``fp4_quantization_120f`` from 12.9 on).

    Returns:
        ``{path: {"caller", "loader", "calls_loader", "module" or "error"}}``.

    Raises:
        BuilderError: the driver did not run.
    """
    done = subprocess.run([str(env.python), str(_DRIVER), json.dumps({"paths": lane})],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "FLASHINFER_CUDA_ARCH_LIST": SM120_FAMILY})
    try:
        data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])["paths"]
    except (IndexError, ValueError, KeyError):
        raise BuildError("reading FlashInfer's SM120 code paths failed: "
                         + done.stderr.strip()[-600:], "") from None
    return data


def list_modules(env: PythonEnv, groups: tuple[str, ...], arch_list: tuple[str, ...],
                 head_dims: tuple[int, ...] = DEFAULT_HEAD_DIMS) -> dict[str, list[str]]:
    """FlashInfer's module names for each group (its spec functions; nothing compiles).

    Raises:
        BuilderError: a group is unknown to this FlashInfer, or the driver did not run.
    """
    argument = json.dumps({"groups": list(groups), "head_dims": list(head_dims),
                           "list": True})
    done = subprocess.run([str(env.python), str(_DRIVER), argument], capture_output=True,
                          text=True, check=False, timeout=600,
                          env={**os.environ, "FLASHINFER_CUDA_ARCH_LIST": " ".join(arch_list)})
    try:
        data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise BuildError("listing FlashInfer's modules failed: "
                         + done.stderr.strip()[-600:], "") from None
    if "error" in data:
        raise BuildError(data["error"], "see `python -m builder kernels --help` for groups")
    groups_found: dict[str, list[str]] = data["groups"]
    return groups_found

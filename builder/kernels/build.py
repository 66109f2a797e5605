"""The kernel build: FlashInfer's modules compiled ahead of time for sm_120, as a wheel.

:func:`build_kernels` compiles the module groups with FlashInfer's own JIT spec
functions of the pinned version (``data/flashinfer_aot.py`` runs them in the build
environment), checks every library's SASS with cuobjdump and packs a
``flashinfer_jit_cache`` wheel (:mod:`builder.kernels.jitcache`). The wheel is a cache entry
keyed by every input, so a rebuild with unchanged inputs runs no compiler; with sccache as
nvcc's launcher, object files are shared between build folders and machines (a local disk
cache, Redis or S3: sccache's own ``SCCACHE_*`` variables). What to build is decided first
(:mod:`builder.kernels.pins`, :mod:`builder.kernels.request`), and
:mod:`builder.kernels.preflight` refuses a toolchain that cannot build it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.core.cache import Cache, atomic_copy, sha256_file, sha256_json
from builder.core.errors import BuilderError
from builder.core.progress import Reporter
from builder.kernels import jitcache
from builder.kernels.pins import KernelPins
from builder.kernels.preflight import preflight
from builder.kernels.toolchain import (
    PythonEnv,
    Toolchain,
    arch_code,
    assemble,
    find_nvcc,
    nvcc_release,
    sass_archs,
    torch_index,
)

# --- the build ---------------------------------------------------------------------------

#: What SGLang runs on SM120 for MoE models with the ``flashinfer_cutlass`` runner: the
#: SM120 CUTLASS fused MoE, FP4 quantization, and the common small modules.
DEFAULT_GROUPS = ("fused_moe_sm120", "fp4_quantization_sm120", "norm", "activation",
                  "sampling", "rope", "page", "attention")
DEFAULT_HEAD_DIMS = (128,)
_DRIVER = Path(__file__).resolve().parent / "data" / "flashinfer_aot.py"
DRIVER = _DRIVER  # the lock's digest (builder.kernels.run) covers it too
_GROUP = re.compile(r"^(norm|activation|sampling|rope|page|attention|"
                    r"fused_moe_sm\d+[af]?|fp4_quantization_sm\d+[af]?)$")


def check_groups(groups: tuple[str, ...]) -> None:
    """Refuse a module group name before anything is installed or compiled.

    Raises:
        BuilderError: a name is not a group (whether FlashInfer has a per-arch spec
            function for an ``smNN`` is known only to FlashInfer, at compile time).
    """
    unknown = [g for g in groups if not _GROUP.match(g)]
    if unknown:
        raise BuilderError(f"unknown module group {', '.join(map(repr, unknown))}",
                           "groups: norm, activation, sampling, rope, page, attention, "
                           "fused_moe_smNN, fp4_quantization_smNN (e.g. fused_moe_sm120)")
# Peak memory per parallel compile job: CUTLASS MoE translation units take several GB each
# (issue "FlashInfer kernels for sm_120"); the small modules stay far below 1 GiB.
_GIB = 1 << 30
_JOB_MEMORY = {"fused_moe": 6 * _GIB, "fp4_quantization": 3 * _GIB, "attention": 2 * _GIB}


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
    """

    target: str
    pins: KernelPins
    version: str
    arch_list: tuple[str, ...]
    lane: str
    groups: tuple[str, ...]
    head_dims: tuple[int, ...]
    epoch: int

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data (:meth:`from_json` reads it back)."""
        return {"target": self.target, "version": self.version,
                "arch_list": list(self.arch_list), "cuda_lane": self.lane,
                "groups": list(self.groups), "head_dims": list(self.head_dims),
                "epoch": self.epoch, "pins": self.pins.describe()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelRequest:
        """Read a request written by :meth:`describe` (a build container gets it so).

        Raises:
            BuilderError: a field is missing or malformed.
        """
        try:
            pins = data["pins"]
            return cls(data["target"], KernelPins(
                Version(pins["flashinfer_python"]),
                Version(pins["flashinfer_cubin"]) if pins["flashinfer_cubin"] else None,
                tuple(pins["kernel"]) if pins["kernel"] else None,
                pins["torch"], pins["cuda_python"]), data["version"],
                tuple(data["arch_list"]), data["cuda_lane"], tuple(data["groups"]),
                tuple(int(h) for h in data["head_dims"]), int(data["epoch"]))
        except (KeyError, TypeError, ValueError, InvalidVersion) as error:
            what = f"no field {error}" if isinstance(error, KeyError) else str(error)
            raise BuilderError(f"not a kernel request ({what})",
                               "write it with `python -m builder kernels --save-request`") \
                from None


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
    """

    request: KernelRequest
    wheel: Path
    sha256: str
    manifest: dict[str, Any]
    cached: bool
    sccache: dict[str, Any] | None
    log: Path | None
    compile_seconds: float | None = None

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"wheel": str(self.wheel), "sha256": self.sha256, "cached": self.cached,
                "request": self.request.describe(), "manifest": self.manifest,
                "sccache": self.sccache, "log": str(self.log) if self.log else None,
                "compile_seconds": self.compile_seconds}


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


def _stream(command: list[str], environment: dict[str, str], log: Path,
            reporter: Reporter) -> tuple[int, str]:
    """Run ``command``, copying its stderr to ``log`` and to the reporter line by line."""
    with log.open("w") as handle, subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, errors="replace") as process:
        assert process.stderr is not None and process.stdout is not None
        for line in process.stderr:
            handle.write(line)
            handle.flush()
            reporter.detail(line.rstrip("\n"))
        out = process.stdout.read()
    return process.returncode, out


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


def build_kernels(request: KernelRequest, env: PythonEnv, *, nvcc: Path | None,
                  cache: Cache, dist_dir: Path, reporter: Reporter | None = None,
                  sccache: Sccache | None = None, jobs: int | None = None) -> KernelResult:
    """Compile ``request``'s module groups on this machine and pack the kernel wheel.

    FlashInfer's own spec functions (of the pinned version, in ``env``) generate and build
    every module against a ``CUDA_HOME`` assembled from ``nvcc`` and NVIDIA's wheels
    (:func:`builder.kernels.toolchain.assemble`), after the preflight passed. Every library must
    hold SASS for exactly the requested archs. The wheel is a cache entry keyed by the
    request, the environment and the compiler: an unchanged rebuild runs no compiler.

    Args:
        request: what to build.
        env: the interpreter with the pinned FlashInfer.
        nvcc: the compiler (``None``: see :func:`builder.kernels.toolchain.find_nvcc`).
        cache: the cache.
        dist_dir: where the wheel is copied.
        reporter: progress output; compiler lines go to its detail stream.
        sccache: compile through sccache.
        jobs: parallel compile jobs (default: :func:`compile_jobs`).

    Raises:
        BuilderError: a preflight check failed (all failures are listed), a module group
            is unknown to this FlashInfer, a compile failed (the log's tail is in the
            message), or a library lacks SASS for an arch or has SASS for another.
    """
    reporter = reporter or Reporter(quiet=True)
    if dist_dir.exists() and not dist_dir.is_dir():  # before any work, not after
        raise BuilderError(f"{dist_dir} is not a folder", "pass --dist a folder")
    compiler = find_nvcc(nvcc, env)
    release = nvcc_release(compiler)
    key = sha256_json({"request": request.describe(), "epoch": request.epoch,
                       "env": env.identity, "nvcc": release and list(release),
                       "host_compiler": _host_compiler(),
                       "flags": {k: os.environ.get(k) for k in _FLAG_VARIABLES},
                       "driver": sha256_file(_DRIVER),
                       "jitcache": sha256_file(Path(jitcache.__file__))})
    entry = cache.lookup("kernels", key)
    cached = entry is not None
    stats: dict[str, Any] | None = None
    log: Path | None = None
    if entry is None:
        with cache.building("kernels", key) as tmp:
            toolchain = assemble(compiler, env, tmp / "cuda")
            checks = preflight(nvcc=toolchain.nvcc, lane=request.lane,
                               arches=list(request.arch_list),
                               include_dirs=list(toolchain.include_dirs), python=env.python)
            failed = [c for c in checks if not c.ok]
            if failed:
                torch_hint = "; --build-torch torch==X (a CPU build is enough to compile)" \
                    if any(c.name == "torch" for c in failed) else ""
                fixes = "".join(f"; {c.fix}" for c in failed if c.fix and c.name != "torch")
                raise BuilderError("the toolchain cannot build these kernels: " + "; ".join(
                    f"{c.name}: {c.detail}" for c in failed),
                    "fix the toolchain (see `python -m builder preflight`)" + fixes
                    + torch_hint)
            try:
                stats, wheel = _compile(request, env, toolchain, tmp, reporter, sccache,
                                        jobs or compile_jobs(request.groups))
            except BuilderError as error:
                kept = cache.root / "logs" / f"kernels-{key[:16]}.log"
                if (tmp / "build.log").exists():
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(tmp / "build.log", kept)
                raise BuilderError(error.cause, f"{error.hint}; the whole compile log: "
                                   f"{kept}" if error.hint else f"the whole compile log: {kept}",
                                   report=error.report) from None
            (tmp / "kernels.json").write_text(json.dumps(
                {"sha256": sha256_file(wheel), "sccache": stats,
                 "compile_seconds": float((tmp / "compile-seconds").read_text())}))
        entry = cache.entry("kernels", key)
        log = entry / "build.log"
    wheels = sorted(entry.glob("*.whl"))
    meta = json.loads((entry / "kernels.json").read_text())
    if len(wheels) != 1 or sha256_file(wheels[0]) != meta.get("sha256"):
        shutil.rmtree(entry, ignore_errors=True)
        raise BuilderError(f"the cached kernel wheel in {entry} was damaged; it was removed",
                           "run the same command again to rebuild it")
    destination = dist_dir / wheels[0].name
    atomic_copy(wheels[0], destination)
    return KernelResult(request, destination, meta["sha256"], jitcache.read_manifest(wheels[0]),
                        cached, stats, log, meta.get("compile_seconds"))


#: Environment variables that change what nvcc or the host compiler produce.
_FLAG_VARIABLES = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CXX", "CC", "CXXFLAGS",
                   "CFLAGS", "LDFLAGS")


def _host_compiler() -> str:
    """The host C++ compiler's version line (part of the cache key)."""
    try:
        out = subprocess.run([os.environ.get("CXX", "c++").split()[-1], "--version"],
                             capture_output=True, text=True, check=False, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "none"
    return out.splitlines()[0] if out else "none"


def _compile(request: KernelRequest, env: PythonEnv, toolchain: Toolchain, tmp: Path,
             reporter: Reporter, sccache: Sccache | None,
             jobs: int) -> tuple[dict[str, Any] | None, Path]:
    """Run the driver in ``tmp``, verify the SASS, pack the wheel into ``tmp``.

    Returns:
        sccache's statistics (or ``None``) and the wheel.
    """
    environment = {**os.environ, "CUDA_HOME": str(toolchain.cuda_home),
                   "FLASHINFER_CUDA_ARCH_LIST": " ".join(request.arch_list),
                   "FLASHINFER_WORKSPACE_BASE": str(tmp / "workspace"),
                   "MAX_JOBS": str(jobs),
                   # FlashInfer runs `ninja` from PATH: the build environment's own first.
                   "PATH": os.pathsep.join([str(env.python.parent),
                                            os.environ.get("PATH", os.defpath)])}
    environment.pop("FLASHINFER_DISABLE_JIT", None)
    for name in [k for k in environment if k.startswith("SCCACHE_")]:
        del environment[name]  # only sccache_settings() reach sccache, below
    sockets = Path(tempfile.mkdtemp(prefix="sm120-sccache-",
                                    dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        if sccache is not None:
            environment.update(_sccache_environment(sccache, sockets,
                                                    [tmp, env.site_packages]))
            environment["FLASHINFER_NVCC"] = f"{sccache.binary} {toolchain.nvcc}"
            environment["CXX"] = f"{sccache.binary} {environment.get('CXX', 'c++')}"
            started = subprocess.run([str(sccache.binary), "--start-server"],
                                     env=environment, capture_output=True, text=True,
                                     check=False)
            if started.returncode != 0:
                raise BuilderError("sccache did not start: " + (
                    started.stderr or started.stdout).strip()[-300:],
                    "check the SCCACHE_* settings (its cache backend must answer)")
        log = tmp / "build.log"
        modules = tmp / "modules"
        argument = json.dumps({"out": str(modules), "groups": list(request.groups),
                               "head_dims": list(request.head_dims)})
        with reporter.working(f"Compiling {', '.join(request.groups)} for "
                              f"{' '.join(request.arch_list)} ({jobs} jobs)"):
            code, out = _stream([str(env.python), str(_DRIVER), argument], environment, log,
                                reporter)
        stats = _sccache_stats(sccache, environment) if sccache is not None else None
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {}
    if code != 0 or "modules" not in result:
        if "error" in result:
            raise BuilderError(result["error"], "module groups: " + ", ".join(DEFAULT_GROUPS)
                               + ", fused_moe_smNN, fp4_quantization_smNN")
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise BuilderError(f"compiling FlashInfer modules failed:\n{tail}", "")
    expected = sorted(arch_code(arch) for arch in request.arch_list)
    entries = []
    for name, info in sorted(result["modules"].items()):
        library = modules / info["path"]
        sass, ptx = sass_archs(toolchain.cuobjdump, library)
        if sass != expected:
            raise BuilderError(f"{info['path']} has SASS for {', '.join(sass) or 'nothing'}, "
                               f"expected exactly {', '.join(expected)}",
                               "check FLASHINFER_CUDA_ARCH_LIST and the module's own flags")
        entries.append({"name": name, "group": info["group"], "path": info["path"],
                        "sha256": sha256_file(library), "sass": sass, "ptx": ptx})
    flags = {name: [info["cflags"], info["cuda_cflags"]]
             for name, info in sorted(result["modules"].items())}
    manifest = {"schema": jitcache.MANIFEST_SCHEMA, "target": request.target,
                "flashinfer_version": result["flashinfer"], "version": request.version,
                "arch_list": list(request.arch_list), "cuda_version": toolchain.lane,
                "nvcc_version": toolchain.release, "flags_sha256": sha256_json(flags),
                "groups": list(request.groups), "head_dims": list(request.head_dims),
                "modules": entries}
    wheel = jitcache.pack(modules, request.version, manifest, request.epoch, tmp)
    for scratch in ("workspace", "modules", "cuda"):
        shutil.rmtree(tmp / scratch, ignore_errors=True)
    (tmp / "compile-seconds").write_text(str(result.get("seconds")))
    return stats, wheel


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

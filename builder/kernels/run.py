"""The kernel stage for a target: on this machine or in a CUDA build container."""

from __future__ import annotations

from pathlib import Path

from builder.core.cache import Cache, sha256_file, sha256_json
from builder.core.errors import ConfigurationError, MissingToolError
from builder.core.lock import VersionLock, lock_path
from builder.core.options import Options
from builder.core.progress import Reporter
from builder.kernels import jitcache, reproducible
from builder.kernels.build import (
    DRIVER,
    KernelBuild,
    KernelRequest,
    KernelResult,
    Sccache,
    ShardResult,
    build_kernels,
    build_torch,
    compile_shard,
    sccache_settings,
)
from builder.kernels.request import KernelOptions, derived_request
from builder.kernels.shard import StepCosts
from builder.kernels.toolchain import (
    PythonEnv,
    cuda_wheels,
    current_environment,
    find_sccache,
    local_nvcc,
    managed_environment,
)


def build_environment(request: KernelRequest, kernel: KernelOptions, cache: Cache,
                      reporter: Reporter) -> tuple[PythonEnv, Path | None]:
    """The Python environment and nvcc a host-mode build uses.

    Returns:
        ``(environment, nvcc)``; nvcc is ``None`` when it comes from PyPI's wheels inside
        the environment.

    Raises:
        BuilderError: see :func:`builder.kernels.toolchain.managed_environment` and
            :func:`builder.kernels.toolchain.current_environment`.
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


def kernel_content_digest(request: KernelRequest) -> str:
    """The sha256 of what decides a kernel wheel's content, for the version lock: the
    request (FlashInfer and its lockstep pins, arch list, CUDA lane, module groups, head
    dimensions, release time), the driver that runs FlashInfer's spec functions, the
    packer that writes the wheels, and the reproducible-build scheme (the fixed build root
    and path maps: :mod:`builder.kernels.reproducible`), so a builder that would lay out or
    compile the same version differently is refused as the sglang wheel's is. nvcc's patch
    release is not in it (the lane is; the manifest's ``rebuild`` record names it)."""
    return sha256_json({"request": request.describe(), "driver": sha256_file(DRIVER),
                        "packer": sha256_file(Path(jitcache.__file__)),
                        "scheme": reproducible.SCHEME})


def run_kernels(options: Options, kernel: KernelOptions) -> KernelResult | ShardResult:
    """Build the target's kernel wheel on this machine or in a CUDA build container; with
    ``kernel.shard``, compile only that share of the steps into the sccache backend.

    The kernel wheel's version is checked against the version lock first (a saved
    ``--request`` is not: it is what a build container runs, checked on its host), and
    recorded there after a build of the target's own module set; a trial build of other
    groups, head dims or archs, or a fast build, is checked but not recorded.

    Raises:
        BuilderError: see :func:`derived_request` and :func:`builder.kernels.build.build_kernels`;
            in container mode also :func:`builder.kernels.container.build_kernels_in_container`;
            the version lock records other content for this kernel wheel's version.
        ConfigurationError: ``kernel.step_costs`` is not a step-costs file of finite
            seconds (:meth:`builder.kernels.shard.StepCosts.read`).
    """
    if kernel.shard is not None and not kernel.sccache:  # the flags: before any work
        raise ConfigurationError("a shard without --sccache compiles objects nobody can reuse",
                                 "add --sccache, with the final job's shared backend "
                                 "(SCCACHE_REDIS_ENDPOINT, SCCACHE_BUCKET ...)")
    if kernel.step_costs is not None:  # refused before any environment or container
        StepCosts(kernel.step_costs).read()
    request, derived = derived_request(options, kernel)
    if derived is not None:
        for note in derived.unbuildable:
            options.reporter.info(f"warning: not in any module group (JIT would compile "
                                  f"it): {note}")
    lock = None
    if kernel.request_file is None and options.source_dir is None:
        lock = VersionLock(lock_path(options.targets_file))
        digest = kernel_content_digest(request)
        lock.require("kernels", request.target, request.version, digest)
    if kernel.mode == "host" and kernel.request_file is None and kernel.nvcc is None and \
            kernel.environment == "managed" and request.lane.split(".")[0] == "12" and \
            local_nvcc(request.lane) is None:
        # PyPI has no CUDA 12 nvcc: name the lane this machine can build, if offered.
        from builder.core.options import select_target
        from builder.kernels.preflight import lane_fix
        from builder.kernels.toolchain import nvcc_release

        lanes = select_target(options).cuda_lanes
        here = next((release[0] for lane in lanes if (found := local_nvcc(lane))
                     and (release := nvcc_release(found))), None)
        pypi = next((lane for lane in lanes if lane.split(".")[0] != "12"), None)
        raise MissingToolError(f"no nvcc for CUDA {request.lane} on this machine, and PyPI has "
                               "none for CUDA 12", lane_fix(request.lane, here or pypi, lanes))
    cache = Cache(options.cache_dir)
    if kernel.mode == "container":
        from builder.kernels.container import build_kernels_in_container

        result = build_kernels_in_container(request, kernel, cache=cache,
                                            dist_dir=options.dist_dir,
                                            reporter=options.reporter)
    else:
        env, nvcc = build_environment(request, kernel, cache, options.reporter)
        sccache = None
        if kernel.sccache:
            sccache = Sccache(find_sccache(env), sccache_settings())
        build = KernelBuild.create(request, env, cache=cache, nvcc=nvcc,
                                   reporter=options.reporter, sccache=sccache,
                                   jobs=kernel.jobs)
        if kernel.shard is not None:  # no wheel: nothing to record in the lock
            return compile_shard(build, kernel.shard, step_costs=kernel.step_costs)
        result = build_kernels(build, options.dist_dir)
    if lock is not None and isinstance(result, KernelResult):
        if kernel.groups is None and kernel.head_dims is None and kernel.arch_list is None \
                and not kernel.fast_build and kernel.model is None \
                and not request.moe_variants:
            lock.record("kernels", request.target, request.version, digest)
        else:  # checked above, but a trial subset must not claim the target's version
            options.reporter.info(f"{request.version} not recorded in versions.lock: a trial "
                                  "build (--modules, --head-dims, --arch-list, --fast-build, "
                                  "--moe-variants or --model)")
    return result

"""The kernel stage for a target: on this machine or in a CUDA build container."""

from __future__ import annotations

from pathlib import Path

from builder.core.cache import Cache
from builder.core.errors import BuilderError
from builder.core.options import Options
from builder.core.progress import Reporter
from builder.kernels.build import (
    KernelRequest,
    KernelResult,
    Sccache,
    ShardResult,
    build_kernels,
    build_torch,
    compile_shard,
    sccache_settings,
)
from builder.kernels.request import KernelOptions, kernel_request
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


def run_kernels(options: Options, kernel: KernelOptions) -> KernelResult | ShardResult:
    """Build the target's kernel wheel on this machine or in a CUDA build container; with
    ``kernel.shard``, compile only that share of the steps into the sccache backend.

    Raises:
        BuilderError: see :func:`kernel_request` and :func:`builder.kernels.build.build_kernels`;
            in container mode also :func:`builder.kernels.container.build_kernels_in_container`.
    """
    if kernel.shard is not None and not kernel.sccache:
        raise BuilderError("a shard without --sccache compiles objects nobody can reuse",
                           "add --sccache, with the final job's shared backend "
                           "(SCCACHE_REDIS_ENDPOINT, SCCACHE_BUCKET ...)")
    request = kernel_request(options, kernel)
    cache = Cache(options.cache_dir)
    if kernel.mode == "container":
        from builder.kernels.container import build_kernels_in_container

        return build_kernels_in_container(request, kernel, cache=cache,
                                          dist_dir=options.dist_dir,
                                          reporter=options.reporter)
    env, nvcc = build_environment(request, kernel, cache, options.reporter)
    sccache = None
    if kernel.sccache:
        sccache = Sccache(find_sccache(env), sccache_settings())
    if kernel.shard is not None:
        return compile_shard(request, env, kernel.shard, nvcc=nvcc, cache=cache,
                             sccache=sccache, reporter=options.reporter, jobs=kernel.jobs,
                             step_costs=kernel.step_costs)
    return build_kernels(request, env, nvcc=nvcc, cache=cache, dist_dir=options.dist_dir,
                         reporter=options.reporter, sccache=sccache, jobs=kernel.jobs)

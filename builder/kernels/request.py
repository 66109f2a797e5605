"""What a target's kernel build will be: its options, local label and request.

:func:`kernel_request` decides it before anything compiles: pins from the target's
upstream source, the arch list, the CUDA lane, the module groups and the wheel's version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from builder.core.basepins import PINS_FILE
from builder.core.errors import ConfigurationError
from builder.core.options import Options, select_target
from builder.core.userfiles import read_json_input
from builder.kernels.build import (
    DEFAULT_HEAD_DIMS,
    FAST_BUILD_LABEL,
    KernelRequest,
    check_groups,
    check_moe_variants,
    has_fused_moe,
)
from builder.kernels.derive import Derived
from builder.kernels.pins import (
    check_arch_list,
    default_groups,
    kernel_label,
    kernel_wheel_version,
    read_pins,
    uses_providers,
)
from builder.kernels.shard import MAX_JOBS, Shard
from builder.kernels.toolchain import (
    arch_code,
)


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
        base_image: the build container's base (container mode; ``None``: the lane's
            ``[[kernel_base]]`` in ``pins_file``, by digest).
        pins_file: ``images/pins.toml`` (container mode's default base).
        toolkit: ``pypi`` (CUDA from NVIDIA's PyPI wheels), ``base`` (the base image
            has it, like ``nvidia/cuda:*-devel``) or ``None`` (the base's if it has one)
            (container mode).
        engine: Docker Engine URL (container mode; ``None``: ``DOCKER_HOST`` or the default).
        request_file: build this saved request instead of resolving the target.
        shard: compile only this ``I/N`` share of the compile steps into the sccache
            backend (no wheel); ``None``: the whole build.
        step_costs: balance shards by this step-costs file (default: the cache's).
        fast_build: compile the CUTLASS fused MoE modules with TensorRT-LLM's
            ``FAST_BUILD`` (CTA 128x128 alone among the TMA warp-specialised grouped
            GEMMs): a quicker smoke-test wheel whose label says ``fastbuild``; never
            recorded in the version lock.
        model: derive the module groups and head dims from this checkpoint folder (or its
            ``config.json``) and ``server_flags`` with the release's own selection
            (:mod:`builder.kernels.derive`); a trial build, never recorded in the lock.
        server_flags: the server flags the model will start with (with ``model``).
        moe_variants: prune the CUTLASS fused MoE modules to these dtype pairs
            (:mod:`builder.kernels.prune`; the API's, no flag: the command line prunes
            only a ``--model`` set, to the pairs the model runs); ``None``: every pair, or
            with ``model`` the model's.
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
    pins_file: Path = PINS_FILE
    shard: Shard | None = None
    step_costs: Path | None = None
    fast_build: bool = False
    model: Path | None = None
    server_flags: tuple[str, ...] = ()
    moe_variants: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        """Refuse a jobs count that is not a whole number from 1 to :data:`MAX_JOBS`.

        Raises:
            ConfigurationError: ``jobs`` is a float (NaN, an infinity), a bool, zero, a
                negative, or more than :data:`MAX_JOBS` (the value would reach ninja's
                ``-j`` and FlashInfer's ``MAX_JOBS``).
        """
        if self.jobs is not None and (type(self.jobs) is not int
                                      or not 1 <= self.jobs <= MAX_JOBS):
            raise ConfigurationError(f"jobs is {self.jobs!r}, not a whole number from 1 to "
                                     f"{MAX_JOBS}", "give --jobs N, or leave it out for "
                                     "the CPUs (bounded by free memory)")
        if self.model is None and self.server_flags:
            raise ConfigurationError("server flags after -- need --model",
                                     "give --model DIR, or leave the flags out")
        if self.model is not None and (self.groups is not None or self.head_dims is not None
                                       or self.request_file is not None):
            raise ConfigurationError("--model derives the module groups and head dims; "
                                     "--modules, --head-dims and --request name them",
                                     "give --model alone, or the groups without it")
        if self.moe_variants is not None and (self.model is not None
                                              or self.request_file is not None):
            raise ConfigurationError("moe_variants names the fused MoE dtype pairs that "
                                     "--model derives and --request already holds",
                                     "give moe_variants with the groups only")


def derived_request(options: Options, kernel: KernelOptions
                    ) -> tuple[KernelRequest, Derived | None]:
    """:func:`kernel_request`, and with ``kernel.model`` the groups and head dims the
    release's own selection for that model and ``kernel.server_flags`` loads
    (:func:`builder.kernels.derive.derive`), with the derivation.

    Raises:
        BuilderError: see :func:`kernel_request` and
            :func:`builder.kernels.derive.select_backends`; the release refuses the
            configuration at start-up.
    """
    request = kernel_request(options, kernel)
    if kernel.model is None:
        return request, None
    from builder.kernels.derive import derive, select_backends

    selection = select_backends(options, select_target(options), kernel.model,
                                kernel.server_flags)
    derived = derive(selection, request.arch_list)
    check_groups(derived.groups)
    if kernel.fast_build and not has_fused_moe(derived.groups):
        raise ConfigurationError("--fast-build changes only the fused MoE modules, and this "
                                 "model's set has none", "leave --fast-build out")
    head_dims = derived.head_dims if "attention" in derived.groups else ()
    variants, why = derived_moe_variants(derived, str(request.pins.flashinfer))
    if why:  # kernels plan and kernels build --model both say it
        options.reporter.info(f"the fused MoE module is built whole: {why}")
    version = request.version
    if variants:
        from builder.kernels import prune

        version += "." + prune.version_label(variants)
    return replace(request, groups=derived.groups, head_dims=head_dims, version=version,
                   moe_variants=variants), derived


def derived_moe_variants(derived: Derived, flashinfer: str
                         ) -> tuple[tuple[str, ...], str | None]:
    """The dtype pairs a derived set prunes its fused MoE modules to, or why it does not.

    Returns:
        ``(variants, None)`` when pruned; ``((), why)`` when the fused MoE module is built
        whole (a variant without a rule, or a FlashInfer whose ``MoeGemmRunner`` was not
        checked: :data:`builder.kernels.prune.CHECKED_HEADERS`); ``((), None)`` without one.
    """
    from builder.kernels import prune

    variants = tuple(dict.fromkeys(n.variant for n in derived.needs
                                   if n.group.startswith("fused_moe_sm")))
    if not variants:
        return (), None
    if flashinfer not in prune.CHECKED_HEADERS:
        return (), (f"FlashInfer {flashinfer}'s MoeGemmRunner was not checked for pruning "
                    f"(checked: {', '.join(prune.CHECKED_HEADERS)})")
    try:
        prune.kept_units(variants)
    except prune.PruneError as error:
        return (), str(error)
    return variants, None


def kernel_request(options: Options, kernel: KernelOptions) -> KernelRequest:
    """Decide what to build for the target: pins from its upstream source, the arch list,
    the CUDA lane, the module groups and the wheel's version.

    Raises:
        BuilderError: the pins disagree, the arch list contradicts FlashInfer's detection
            (or has a plain ``12.0``), the lane is not one of the target's, or a FlashInfer
            >= 0.7 build names more than one arch (its provider wheels hold one each).
    """
    if kernel.request_file is not None:
        data = read_json_input(kernel.request_file, "the request",
                               "write one with `kernels plan --output FILE`")
        request = KernelRequest.from_json(data)
        check_groups(request.groups)
        return request
    # The source stage (gitpython, remotezip) only here: a saved request needs none of it.
    from builder.source.fetch import obtain_source

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
                raise ConfigurationError(f"arch {arch!r} is not like 9.0a or 12.0a",
                                         "write compute capability major.minor, with a or f")
        check_arch_list(arch_list, pins)  # a plain 12.0, or the other SM120 variant
        label += "." + ".".join(arch_code(a).replace("_", "") for a in arch_list)
    if kernel.fast_build:
        if not has_fused_moe(tuple(kernel.groups or target.kernel_groups
                                   or default_groups(arch_list))):
            raise ConfigurationError("--fast-build changes only the fused MoE modules, and none "
                                     "is in the module groups", "add a fused_moe_smNN group to "
                                     "--modules, or leave --fast-build out")
        # Its own version: a fast build must never pass for the full one.
        label += "." + FAST_BUILD_LABEL
    if uses_providers(pins.flashinfer) and len(arch_list) != 1:
        raise ConfigurationError(f"FlashInfer {pins.flashinfer} reads one provider wheel per arch; "
                                 f"the arch list has {' '.join(arch_list)}",
                                 "build once per arch (--arch-list 12.0f, then --arch-list 9.0a)")
    groups = tuple(kernel.groups or target.kernel_groups or default_groups(arch_list))
    check_groups(groups)
    variants = tuple(kernel.moe_variants or ())
    check_moe_variants(variants, groups, str(pins.flashinfer))
    if variants:
        from builder.kernels import prune

        label += "." + prune.version_label(variants)  # never the full module's version
    # Head dims matter to the attention group alone (and so to the cache key).
    head_dims = (kernel.head_dims or target.head_dims or DEFAULT_HEAD_DIMS) \
        if "attention" in groups else ()
    return KernelRequest(target.name, pins, kernel_wheel_version(pins, label), arch_list, lane,
                         tuple(groups), tuple(head_dims), source.source_date_epoch,
                         kernel.fast_build, variants)

"""Build patched SGLang wheels for SM120 from pinned upstream releases.

The pipeline's stages, one package each, each returning one result object the next takes::

    source ──► patching ──► wheel ───────────┐
                  │                          ├─► image ──► smoke ──► release
                  └──► kernels ──────────────┘

    fetch_source -> apply_series -> build_wheel ---------> build_image -> smoke gate -> publish
    (SourceResult)  (PatchResult)   (WheelResult)     /    (ImageResult)  (GateResult)  (Published)
                    read_pins -> build_kernels ------/
                    (KernelPins) (KernelResult: a flashinfer_jit_cache wheel)

Each stage package's ``run_*`` function runs it for a target of the targets file
(:func:`run_fetch`, :func:`run_patch`, :func:`run_wheels`, :func:`run_kernels`,
:func:`run_image`, :func:`run_smoke`, :func:`run_release`); a release publishes only what
passed its :data:`SmokeGate` (the ``release`` command's default: the smoke test on the
runner's GPU, :func:`builder.release.gpu_gate`). :mod:`builder.core` holds what every stage
shares: configuration, parsed once by :func:`load_targets` and :func:`load_series`, the
cache, progress, and :class:`BuilderError`, which every refusal raises with a cause and a
hint. :mod:`builder.ci` is what the CI workflows call (the build plan, the upstream check);
:mod:`builder.cli` is the command line.

Names are imported on first use (PEP 562), so ``import builder`` stays cheap and a command
loads only the stages it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # core
    "BuilderError": "builder.core.errors",
    "Cache": "builder.core.cache",
    "default_cache_root": "builder.core.cache",
    "GitPin": "builder.core.config",
    "SdistPin": "builder.core.config",
    "Target": "builder.core.config",
    "TargetsFile": "builder.core.config",
    "load_targets": "builder.core.config",
    "Layout": "builder.core.layout",
    "Options": "builder.core.options",
    "connect": "builder.core.engine",
    # source
    "SourceResult": "builder.source.fetch",
    "fetch_source": "builder.source.fetch",
    "local_source": "builder.source.fetch",
    "run_fetch": "builder.source.fetch",
    # patching
    "Hunk": "builder.patching.hunks",
    "HunkResult": "builder.patching.hunks",
    "HunkStatus": "builder.patching.hunks",
    "apply_file_hunks": "builder.patching.hunks",
    "split_lines": "builder.patching.hunks",
    "FilePatch": "builder.patching.patchfile",
    "Operation": "builder.patching.patchfile",
    "ParsedPatch": "builder.patching.patchfile",
    "parse_patch": "builder.patching.patchfile",
    "IntentCheck": "builder.patching.intent",
    "IntentOutcome": "builder.patching.intent",
    "Series": "builder.patching.series",
    "SeriesEntry": "builder.patching.series",
    "load_series": "builder.patching.series",
    "PatchOutcome": "builder.patching.apply",
    "PatchReport": "builder.patching.apply",
    "PatchResult": "builder.patching.apply",
    "PatchStatus": "builder.patching.apply",
    "apply_series": "builder.patching.apply",
    "plan_series": "builder.patching.apply",
    "run_patch": "builder.patching.apply",
    # wheel
    "PROVENANCE_FILE": "builder.wheel.build",
    "WheelResult": "builder.wheel.build",
    "build_wheel": "builder.wheel.build",
    "builder_version": "builder.wheel.build",
    "run_wheel": "builder.wheel.build",
    "run_wheels": "builder.wheel.build",
    # kernels
    "DEFAULT_GROUPS": "builder.kernels.pins",
    "KernelPins": "builder.kernels.pins",
    "read_pins": "builder.kernels.pins",
    "KernelRequest": "builder.kernels.build",
    "KernelResult": "builder.kernels.build",
    "build_kernels": "builder.kernels.build",
    "KernelOptions": "builder.kernels.request",
    "kernel_request": "builder.kernels.request",
    "run_kernels": "builder.kernels.run",
    "Toolchain": "builder.kernels.toolchain",
    "assemble": "builder.kernels.toolchain",
    "cuda_wheels": "builder.kernels.toolchain",
    # image
    "BaseImage": "builder.image.build",
    "ExtraWheel": "builder.image.build",
    "ImageResult": "builder.image.build",
    "build_image": "builder.image.build",
    "load_base_pins": "builder.image.build",
    "ImageOptions": "builder.image.run",
    "run_image": "builder.image.run",
    # smoke
    "CheckResult": "builder.smoke.gpu",
    "SmokeOptions": "builder.smoke.gpu",
    "SmokeReport": "builder.smoke.gpu",
    "load_report": "builder.smoke.gpu",
    "require_passed": "builder.smoke.gpu",
    "run_smoke": "builder.smoke.gpu",
    "StaticSmokeReport": "builder.smoke.static",
    "static_smoke": "builder.smoke.static",
    # release
    "Index": "builder.release.publish",
    "Published": "builder.release.publish",
    "GateResult": "builder.release.run",
    "ReleaseSummary": "builder.release.run",
    "SmokeGate": "builder.release.run",
    "run_release": "builder.release.run",
    "static_gate": "builder.release.run",
    # CI: the build plan (``plan --json``) and the upstream check
    "Plan": "builder.ci.plan",
    "PlanEntry": "builder.ci.plan",
    "plan_targets": "builder.ci.plan",
    "UpstreamReport": "builder.ci.upstream",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562).

    Raises:
        AttributeError: ``name`` is not public.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'builder' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports lazily
    from builder.ci.plan import Plan, PlanEntry, plan_targets
    from builder.ci.upstream import UpstreamReport
    from builder.core.cache import Cache, default_cache_root
    from builder.core.config import GitPin, SdistPin, Target, TargetsFile, load_targets
    from builder.core.engine import connect
    from builder.core.errors import BuilderError
    from builder.core.layout import Layout
    from builder.core.options import Options
    from builder.image.build import (
        BaseImage,
        ExtraWheel,
        ImageResult,
        build_image,
        load_base_pins,
    )
    from builder.image.run import ImageOptions, run_image
    from builder.kernels.build import KernelRequest, KernelResult, build_kernels
    from builder.kernels.pins import DEFAULT_GROUPS, KernelPins, read_pins
    from builder.kernels.request import KernelOptions, kernel_request
    from builder.kernels.run import run_kernels
    from builder.kernels.toolchain import Toolchain, assemble, cuda_wheels
    from builder.patching.apply import (
        PatchOutcome,
        PatchReport,
        PatchResult,
        PatchStatus,
        apply_series,
        plan_series,
        run_patch,
    )
    from builder.patching.hunks import (
        Hunk,
        HunkResult,
        HunkStatus,
        apply_file_hunks,
        split_lines,
    )
    from builder.patching.intent import IntentCheck, IntentOutcome
    from builder.patching.patchfile import FilePatch, Operation, ParsedPatch, parse_patch
    from builder.patching.series import Series, SeriesEntry, load_series
    from builder.release.publish import Index, Published
    from builder.release.run import (
        GateResult,
        ReleaseSummary,
        SmokeGate,
        run_release,
        static_gate,
    )
    from builder.smoke.gpu import (
        CheckResult,
        SmokeOptions,
        SmokeReport,
        load_report,
        require_passed,
        run_smoke,
    )
    from builder.smoke.static import StaticSmokeReport, static_smoke
    from builder.source.fetch import SourceResult, fetch_source, local_source, run_fetch
    from builder.wheel.build import (
        PROVENANCE_FILE,
        WheelResult,
        build_wheel,
        builder_version,
        run_wheel,
        run_wheels,
    )

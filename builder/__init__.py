"""Build patched SGLang wheels for SM120 from pinned upstream releases.

The pipeline's stages, each returning one result object the next one takes::

    fetch_source -> apply_series -> build_wheel ---------> build_image -> smoke gate -> publish
    (SourceResult)  (PatchResult)   (WheelResult)     /    (ImageResult)  (GateResult)  (Published)
                    read_pins -> build_kernels ------/
                    (KernelPins) (KernelResult: a flashinfer_jit_cache wheel)

:func:`run_kernels`, :func:`run_image` and :func:`run_release` run them for a target; a
release publishes only what passed its :data:`SmokeGate` (the ``release`` command's
default: the smoke test on the runner's GPU, :func:`builder.release.gpu_gate`).

Configuration is parsed once by :func:`load_targets` and :func:`load_series`; every
refusal is a :class:`BuilderError` with a cause and a hint.
"""

from builder.cache import Cache, default_cache_root
from builder.config import (
    GitPin,
    SdistPin,
    Series,
    SeriesEntry,
    Target,
    TargetsFile,
    load_series,
    load_targets,
)
from builder.engine import connect
from builder.errors import BuilderError
from builder.hunks import Hunk, HunkResult, HunkStatus, apply_file_hunks, split_lines
from builder.image import BaseImage, ExtraWheel, ImageResult, build_image, load_base_pins
from builder.imagesmoke import StaticSmokeReport, static_smoke
from builder.intent import IntentCheck, IntentOutcome
from builder.layout import Layout
from builder.patch import (
    PatchOutcome,
    PatchReport,
    PatchResult,
    PatchStatus,
    apply_series,
    plan_series,
)
from builder.patchfile import FilePatch, Operation, ParsedPatch, parse_patch
from builder.pipeline import Options, run_fetch, run_patch, run_wheel, run_wheels
from builder.plan import Plan, PlanEntry, plan_targets
from builder.publish import Index, Published
from builder.release import (
    GateResult,
    ImageOptions,
    ReleaseSummary,
    SmokeGate,
    run_image,
    run_release,
    static_gate,
)
from builder.smoke import (
    CheckResult,
    SmokeOptions,
    SmokeReport,
    load_report,
    require_passed,
    run_smoke,
)
from builder.source import SourceResult, fetch_source, local_source
from builder.upstream import UpstreamReport
from builder.wheel import PROVENANCE_FILE, WheelResult, build_wheel, builder_version

__all__ = [
    "PROVENANCE_FILE",
    "BaseImage",
    "BuilderError",
    "Cache",
    "CheckResult",
    "ExtraWheel",
    "FilePatch",
    "GateResult",
    "GitPin",
    "Hunk",
    "HunkResult",
    "HunkStatus",
    "ImageOptions",
    "ImageResult",
    "Index",
    "IntentCheck",
    "IntentOutcome",
    "Layout",
    "Operation",
    "Options",
    "ParsedPatch",
    "PatchOutcome",
    "PatchReport",
    "PatchResult",
    "PatchStatus",
    "Published",
    "ReleaseSummary",
    "SdistPin",
    "Series",
    "SeriesEntry",
    "SmokeGate",
    "SmokeOptions",
    "SmokeReport",
    "SourceResult",
    "StaticSmokeReport",
    "Target",
    "TargetsFile",
    "WheelResult",
    "apply_file_hunks",
    "apply_series",
    "build_image",
    "build_wheel",
    "builder_version",
    "connect",
    "default_cache_root",
    "fetch_source",
    "load_base_pins",
    "load_report",
    "load_series",
    "load_targets",
    "local_source",
    "parse_patch",
    "plan_series",
    "require_passed",
    "run_fetch",
    "run_image",
    "run_patch",
    "run_release",
    "run_smoke",
    "run_wheel",
    "run_wheels",
    "split_lines",
    "static_gate",
    "static_smoke",
]

# CI: the build plan (``plan --json``) and the upstream check
__all__ += ["Plan", "PlanEntry", "UpstreamReport", "plan_targets"]

# The kernel stage: FlashInfer modules compiled ahead of time into a jit-cache wheel.
from builder.kernels import (  # noqa: E402
    DEFAULT_GROUPS,
    KernelPins,
    KernelRequest,
    KernelResult,
    build_kernels,
    read_pins,
)
from builder.pipeline import KernelOptions, kernel_request, run_kernels  # noqa: E402
from builder.toolchain import Toolchain, assemble, cuda_wheels  # noqa: E402

__all__ += ["DEFAULT_GROUPS", "KernelOptions", "KernelPins", "KernelRequest", "KernelResult",
            "Toolchain", "assemble", "build_kernels", "cuda_wheels", "kernel_request",
            "read_pins", "run_kernels"]

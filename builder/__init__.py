"""Build patched SGLang wheels for SM120 from pinned upstream releases.

The pipeline's stages, each returning one result object the next one takes::

    fetch_source -> apply_series -> build_wheel
    (SourceResult)  (PatchResult)   (WheelResult)

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
from builder.errors import BuilderError
from builder.hunks import Hunk, HunkResult, HunkStatus, apply_file_hunks, split_lines
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
    "BuilderError",
    "Cache",
    "CheckResult",
    "FilePatch",
    "GitPin",
    "Hunk",
    "HunkResult",
    "HunkStatus",
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
    "SdistPin",
    "Series",
    "SeriesEntry",
    "SmokeOptions",
    "SmokeReport",
    "SourceResult",
    "Target",
    "TargetsFile",
    "WheelResult",
    "apply_file_hunks",
    "apply_series",
    "build_wheel",
    "builder_version",
    "default_cache_root",
    "fetch_source",
    "load_report",
    "load_series",
    "load_targets",
    "local_source",
    "parse_patch",
    "plan_series",
    "require_passed",
    "run_fetch",
    "run_patch",
    "run_smoke",
    "run_wheel",
    "run_wheels",
    "split_lines",
]

# CI: the build plan (``plan --json``) and the upstream check
__all__ += ["Plan", "PlanEntry", "UpstreamReport", "plan_targets"]

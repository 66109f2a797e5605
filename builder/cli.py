"""Command line: ``python -m builder`` / ``sglang-sm120``. Parses, calls a stage, prints."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version
from rich.console import Console
from rich.table import Table

from builder.cache import atomic_write_bytes, default_cache_root
from builder.config import SOURCE_KINDS, load_targets
from builder.errors import BuilderError
from builder.hunks import HunkResult
from builder.matrix import Matrix
from builder.patch import PatchReport
from builder.pipeline import (
    KernelOptions,
    Options,
    kernel_request,
    run_check,
    run_fetch,
    run_kernels,
    run_patch,
    run_plan,
    run_preflight,
    run_refresh,
    run_upstream,
    run_wheels,
)
from builder.progress import Reporter
from builder.publish import Index
from builder.release import (
    ImageOptions,
    ReleaseSummary,
    gpu_gate,
    run_image,
    run_release,
    static_gate,
)
from builder.smoke import SmokeFailed, SmokeOptions, SmokeReport, run_smoke, write_report
from builder.source import DEFAULT_INDEX_URL

_EPILOG = """\
examples:
  python -m builder targets
  python -m builder wheel                          # the default target's wheel into dist/
  python -m builder wheel --target sglang-0.5.7 --json
  python -m builder patch --target sglang-0.5.10.post1 --dry-run
  python -m builder patch --source-dir ~/src/sglang --patch my.patch --max-fuzz 1 --dry-run
  python -m builder check --format markdown        # the series x every target
  python -m builder check --versions 0.5.9,0.5.11,0.5.13
  python -m builder refresh --target sglang-0.5.10.post1 --accept-fuzz --dry-run
  python -m builder kernels --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder plan --json                    # the CI build matrix, one entry a target
  python -m builder upstream --format markdown     # newer SGLang releases vs the series
  python -m builder image --base-image NAME:TAG@sha256:...   # the runtime OCI image
  python -m builder release --registry 127.0.0.1:5000 --repository-url http://127.0.0.1:8080/

Results go to stdout, progress and errors to stderr.
exit status: 0 success, 1 the build refused or failed (one-line cause and a hint on
stderr; with --json a JSON object with "error" on stdout), 2 bad usage.
"""


def _count(limit: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 0 <= value <= limit:
            raise argparse.ArgumentTypeError(f"must be from 0 to {limit}")
        return value
    return parse


def _common(parser: argparse.ArgumentParser, *, target: bool = True) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout and no progress")
    parser.add_argument("--targets-file", type=Path, default=Path("targets.toml"),
                        help="the targets file (default: %(default)s)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache root (default: $SGLANG_SM120_CACHE or "
                             f"{default_cache_root()})")
    if target:
        parser.add_argument("--target", metavar="NAME",
                            help="build target (default: the targets file's default)")


def _source_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("source")
    group.add_argument("--source", choices=SOURCE_KINDS,
                       help="take the target's sdist, wheel or git pin (default: its "
                            "'prefer')")
    group.add_argument("--git-url", metavar="URL",
                       help="clone the git pin's commit from this URL or path instead")
    group.add_argument("--index-url", default=DEFAULT_INDEX_URL,
                       help="simple index where sdists are found by sha256 "
                            "(default: %(default)s)")
    group.add_argument("--source-dir", type=Path, metavar="DIR",
                       help="use this SGLang checkout or unpacked sdist instead of fetching")
    group.add_argument("--upstream-version", metavar="VERSION",
                       help="the upstream version of --source-dir (default: its PKG-INFO)")


def _series_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("patches")
    group.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    group.add_argument("--patch", type=Path, metavar="FILE",
                       help="apply just this patch (unpinned, for trying one out)")
    group.add_argument("--strip", type=_count(20), default=1, metavar="N",
                       help="strip level for --patch (default: %(default)s)")
    group.add_argument("--max-fuzz", type=_count(3), default=0, metavar="N",
                       help="fuzz allowed for --patch (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (also used to render ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build patched SGLang wheels for SM120 (RTX PRO 6000 Blackwell, RTX "
                    "5090) from pinned upstream releases: fetch -> patch -> wheel.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    targets = commands.add_parser("targets", help="list the build targets")
    _common(targets, target=False)
    targets.set_defaults(handler=_cmd_targets)

    fetch = commands.add_parser("fetch", help="download, verify and unpack a target's source")
    _common(fetch)
    _source_args(fetch)
    fetch.set_defaults(handler=_cmd_fetch)

    patch = commands.add_parser(
        "patch", help="apply the patch series and report every hunk",
        description="Apply a series (or one --patch) with fuzz checking. Without "
                    "--source-dir the result is a patched copy in the cache; with "
                    "--source-dir the folder itself is patched (all or nothing) unless "
                    "--dry-run.")
    _common(patch)
    _source_args(patch)
    _series_args(patch)
    patch.add_argument("--dry-run", action="store_true",
                       help="only report; write nothing")
    patch.set_defaults(handler=_cmd_patch)

    wheel = commands.add_parser("wheel", help="build the patched, versioned wheel into dist/")
    _common(wheel)
    _source_args(wheel)
    wheel.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    wheel.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                       help="output folder (default: %(default)s)")
    wheel.set_defaults(handler=_cmd_wheel, patch=None, strip=1, max_fuzz=0)

    check = commands.add_parser(
        "check", help="compatibility matrix: the series on several upstream releases",
        description="Apply the series (in memory) to every target, or to --versions "
                    "found on the index (sdist, else a released wheel read as source), or "
                    "to --commits of a git repository, and print patch x release. Exits 1 "
                    "when a target of the targets file would break.")
    _common(check, target=False)
    which = check.add_mutually_exclusive_group()
    which.add_argument("--versions", metavar="V1,V2", help="upstream versions to check")
    which.add_argument("--commits", metavar="C1[=V],C2", help="full git commits to check, "
                       "each optionally =VERSION (default: the default target's version)")
    check.add_argument("--git-url", metavar="URL", help="repository of --commits "
                       "(default: the default target's git URL)")
    check.add_argument("--index-url", default=DEFAULT_INDEX_URL,
                       help="simple index for --versions (default: %(default)s)")
    check.add_argument("--series", type=Path, metavar="FILE",
                       help="series to check (default: the default target's)")
    check.add_argument("--format", choices=("table", "markdown"), default="table",
                       help="human output: a table, or Markdown for a pull request")
    check.set_defaults(handler=_cmd_check)

    refresh = commands.add_parser(
        "refresh", help="regenerate the series' patches against a target's upstream",
        description="Rewrite each patch so it applies to the target with zero fuzz and "
                    "exact line numbers, keeping its header; updates the sha256 pins in "
                    "the series file. Hunks that needed fuzz need --accept-fuzz and are "
                    "shown before and after.")
    _common(refresh)
    _source_args(refresh)
    refresh.add_argument("--accept-fuzz", action="store_true",
                         help="also refresh hunks that needed fuzz (review them!)")
    refresh.add_argument("--output-dir", type=Path, metavar="DIR",
                         help="write refreshed patches here; the series is left alone")
    preflight = commands.add_parser(
        "preflight", help="kernel pins, SM120 arch and a CUDA toolchain check for a target",
        description="Read the FlashInfer / kernel / torch pins from the target's upstream "
                    "source, derive the SM120 arch FlashInfer detects, and check a toolchain: "
                    "nvcc is the target's CUDA lane and really compiles for its archs, the "
                    "cuBLAS and cuRAND headers are there, torch is built for the lane (or "
                    "the CPU). `kernels` runs the same checks before compiling. Exits 1 when "
                    "a check fails.")
    _common(preflight)
    _source_args(preflight)
    preflight.add_argument("--nvcc", type=Path, default=Path("/usr/local/cuda/bin/nvcc"),
                           help="nvcc to check (default: %(default)s)")
    preflight.add_argument("--include", type=Path, action="append", metavar="DIR",
                           help="where the cuBLAS/cuRAND headers may be (repeatable; default: "
                                "the include folder beside nvcc)")
    preflight.add_argument("--cuda-lane", metavar="X.Y",
                           help="one of the target's CUDA lanes (default: its first)")
    preflight.add_argument("--python", type=Path, metavar="PY",
                           help="interpreter whose torch must match the lane (default: skip)")
    preflight.set_defaults(handler=_cmd_preflight)

    _kernels_parser(commands)
    image = commands.add_parser(
        "image", help="build the runtime OCI image: upstream's image plus our wheel(s)",
        description="Build the target's wheel, then the runtime image from images/Dockerfile "
                    "with the engine's BuildKit: FROM the upstream image of the target's "
                    "CUDA lane (by digest, images/pins.toml), plus one thin layer that "
                    "pip-installs the sglang wheel and any --kernel-wheel with --no-deps. "
                    "The build log streams to stderr.")
    _common(image)
    _source_args(image)
    _image_args(image)
    image.set_defaults(handler=_cmd_image, series=None, patch=None, strip=1, max_fuzz=0)

    release = commands.add_parser(
        "release", help="wheel -> image -> smoke gate -> publish wheels and image",
        description="Build the wheel and the image, run the smoke gate (--gate gpu, the "
                    "default: the smoke test on this runner's GPU inside the image; --gate "
                    "static: only the provenance and the patched line read inside the image), "
                    "and only if it passes upload the wheels with twine (TWINE_USERNAME / "
                    "TWINE_PASSWORD or keyring) and push the image "
                    "(SGLANG_SM120_REGISTRY_USERNAME / _PASSWORD, or docker login). "
                    "Re-running never overwrites: a file or tag already there with the "
                    "same content counts as published, with other content it is an error. "
                    "The summary lists exactly what was published.")
    _common(release)
    _source_args(release)
    _image_args(release)
    release.add_argument("--repository-url", required=True, metavar="URL",
                         help="where twine uploads the wheels (pypiserver: its root URL)")
    release.add_argument("--publish-index-url", metavar="URL",
                         help="the simple index of that repository, read to find files "
                              "already published (default: <repository-url>/simple/)")
    release.add_argument("--gate", choices=("gpu", "static"), default="gpu",
                         help="gpu: the smoke test on this runner's GPU, in the image "
                              "(default; `smoke`); static: only the provenance and patched "
                              "line read inside the image, no GPU (a dry run of publishing)")
    release.add_argument("--gate-series", type=Path, default=Path("patches/series.toml"),
                         metavar="FILE", help="series whose intent checks the gpu gate "
                                              "verifies in the image (default: %(default)s)")
    release.set_defaults(handler=_cmd_release, series=None, patch=None, strip=1, max_fuzz=0)

    refresh.add_argument("--series", type=Path, metavar="FILE",
                         help="refresh this series file instead of the target's")
    refresh.add_argument("--dry-run", action="store_true", help="only report")
    refresh.set_defaults(handler=_cmd_refresh, patch=None, strip=1, max_fuzz=0)
    _smoke_parser(commands)
    _ci_commands(commands)
    return parser


_KERNELS_EPILOG = """\
module groups: norm, activation, sampling, rope, page, attention (for --head-dims),
  fused_moe_smNN and fp4_quantization_smNN (FlashInfer's per-arch spec functions, e.g.
  fused_moe_sm120). Default: the target's [target.kernels] groups, else
  fused_moe_sm120, fp4_quantization_sm120, norm, activation, sampling, rope, page, attention.

examples:
  python -m builder kernels --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder kernels --target sglang-0.5.9 --mode container --cuda-lane 13.0
  python -m builder kernels --environment current --arch-list 9.0a --modules norm,sampling
  SCCACHE_REDIS_ENDPOINT=redis://cache:6379 python -m builder kernels --sccache

The wheel is flashinfer_jit_cache <flashinfer>+<label>.cu<lane>; with it installed and
FLASHINFER_DISABLE_JIT=1, FlashInfer loads the modules instead of compiling them.
A rebuild with unchanged inputs runs no compiler (the wheel is cached).
"""


def _kernels_parser(commands: Any) -> None:
    kernels = commands.add_parser(
        "kernels", help="compile FlashInfer modules for sm_120 into a flashinfer_jit_cache wheel",
        description="Compile the target's FlashInfer modules ahead of time, with FlashInfer's "
                    "own JIT spec functions of the version the target pins, check every "
                    "library's SASS with cuobjdump, and pack a flashinfer_jit_cache wheel "
                    "into --dist. Runs on this machine (--mode host) or in a CUDA build "
                    "container (--mode container, via the Docker Engine).",
        epilog=_KERNELS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(kernels)
    _source_args(kernels)
    kernels.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                         help="where the wheel goes (default: %(default)s)")
    kernels.add_argument("--modules", type=_names, metavar="A,B",
                         help="module groups to build (see below)")
    kernels.add_argument("--head-dims", type=_numbers, metavar="N,M",
                         help="head dimensions for the attention group (default: 128)")
    kernels.add_argument("--cuda-lane", metavar="X.Y",
                         help="one of the target's CUDA lanes (default: its first)")
    kernels.add_argument("--arch-list", type=_names, metavar="ARCH,...",
                         help="archs other than the target's, e.g. 9.0a to smoke-test on a "
                              "Hopper GPU (the wheel's label then names them)")
    kernels.add_argument("--mode", choices=("host", "container"), default="host",
                         help="compile here or in a CUDA build container (default: host)")
    kernels.add_argument("--environment", choices=("managed", "current"), default="managed",
                         help="managed: a cached venv with the pinned FlashInfer (default); "
                              "current: this Python, FlashInfer already installed (offline)")
    kernels.add_argument("--nvcc", type=Path, metavar="PATH",
                         help="compiler (default: one of the lane on this machine, else "
                              "nvidia-cuda-nvcc from PyPI)")
    kernels.add_argument("--build-torch", metavar="REQ",
                         help="torch for the build venv (default: the target's pin; a CPU "
                              "build is enough to compile)")
    kernels.add_argument("--wheelhouse", type=Path, metavar="DIR",
                         help="install the build venv offline from these wheels")
    kernels.add_argument("--sccache", action="store_true",
                         help="compile through sccache; SCCACHE_DIR, SCCACHE_REDIS_ENDPOINT, "
                              "SCCACHE_BUCKET ... choose its cache (shared across runners)")
    kernels.add_argument("--jobs", type=_positive, metavar="N",
                         help="parallel compile jobs (default: CPUs, bounded by free memory)")
    kernels.add_argument("--base-image", metavar="REF",
                         help="container mode: the build container's base image")
    kernels.add_argument("--toolkit", choices=("pypi", "base"),
                         help="container mode: CUDA from the base image (nvidia/cuda:*-devel) "
                              "or from PyPI's wheels (default: the base's if it has one)")
    kernels.add_argument("--docker-host", metavar="URL",
                         help="container mode: the Docker Engine (default: DOCKER_HOST)")
    kernels.add_argument("--request", type=Path, metavar="FILE",
                         help="build a request saved as JSON instead of resolving the target "
                              "(what the build container runs)")
    kernels.add_argument("--save-request", type=Path, metavar="FILE",
                         help="only resolve what to build and write it as JSON (for --request "
                              "on a machine without the upstream source or network)")
    kernels.add_argument("--progress", action="store_true",
                         help="with --json, still show progress on stderr (the build "
                              "container runs so: its log streams while stdout stays JSON)")
    kernels.add_argument("--verbose", action="store_true",
                         help="print every compiler line, not just the steps")
    kernels.set_defaults(handler=_cmd_kernels)


def _image_id_from(path: Path) -> str:
    """The ``image_id`` in the JSON ``image --json`` printed.

    Raises:
        BuilderError: the file is missing, not JSON, or has no image ID.
    """
    try:
        data = json.loads(path.read_text())
        image_id = data["image_id"] if "image_id" in data else data["image"]["image_id"]
    except OSError as error:
        raise BuilderError(f"cannot read {path}: {error.strerror}",
                           "write it with `python -m builder image --json > FILE`") from None
    except (ValueError, KeyError, TypeError):
        raise BuilderError(f"{path} holds no image ID", "write it with "
                           "`python -m builder image --json > FILE`") from None
    return str(image_id)


def _positive(text: str) -> int:
    value = _count(1024)(text)
    if value < 1:
        raise argparse.ArgumentTypeError("give at least 1")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def _numbers(text: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers") from None
    if not numbers or min(numbers) <= 0:
        raise argparse.ArgumentTypeError("head dimensions are positive")
    return numbers


def _cmd_kernels(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    reporter.verbose = args.verbose
    kernel = KernelOptions(
        lane=args.cuda_lane, groups=args.modules, head_dims=args.head_dims,
        arch_list=args.arch_list, mode=args.mode, environment=args.environment,
        nvcc=args.nvcc, build_torch=args.build_torch, wheelhouse=args.wheelhouse,
        sccache=args.sccache, jobs=args.jobs, base_image=args.base_image,
        toolkit=args.toolkit, engine=args.docker_host, request_file=args.request)
    if args.save_request:
        request = kernel_request(_options(args, reporter), kernel)
        atomic_write_bytes(args.save_request,
                           (json.dumps(request.describe(), indent=2) + "\n").encode())
        reporter.result(f"{request.target}: flashinfer_jit_cache {request.version}, "
                        f"{', '.join(request.groups)} for {' '.join(request.arch_list)} "
                        f"-> {args.save_request}")
        return request.describe()
    result = run_kernels(_options(args, reporter), kernel)
    manifest = result.manifest
    table = Table(title=f"{result.wheel.name}" + (" (cached: no compiler ran)"
                                                  if result.cached else ""))
    for column in ("module", "group", "SASS", "PTX"):
        table.add_column(column)
    for module in manifest["modules"]:
        table.add_row(module["name"], module["group"], " ".join(module["sass"]),
                      " ".join(module["ptx"]) or "-")
    reporter.result(table)
    reporter.result(f"FlashInfer {manifest['flashinfer_version']}, CUDA "
                    f"{manifest['cuda_version']} (nvcc {manifest['nvcc_version']}), arch list "
                    f"{' '.join(manifest['arch_list'])}; "
                    + (f"compiled in {result.compile_seconds} s; "
                       if result.compile_seconds is not None else "")
                    + f"sha256 {result.sha256}")
    if result.sccache:
        reporter.result(f"sccache: {result.sccache}")
    return result.describe()


# --- smoke (issue 6) -------------------------------------------------------------------

_SMOKE_EPILOG = """\
checks: runner, sglang, lockstep, kernels, moe-autotune, server. 1-4 always count; 5
counts with --moe or when the kernel wheel ships the fused MoE module for this GPU; 6 counts
with --model. A check that needs a GPU and finds none fails ("no CUDA device").

examples:
  python -m builder smoke --mode host --sglang-wheel dist/sglang-0.5.9+sm120.1-py3-none-any.whl
  python -m builder smoke --mode host --moe --json --output reports/smoke.json
  python -m builder smoke --mode image --image sglang-sm120:0.5.9 --model /models/small
  # where only torch and FlashInfer are installed, run the probe alone, judge it elsewhere:
  python builder/smoke_probe.py --sglang-pattern 'sglang/srt/model_executor/*.py' > probe.out
  python -m builder smoke --probe-output probe.out --sglang-wheel dist/sglang-….whl

exit status: 0 passed, 1 failed (or bad input), 3 misconfigured runner (the engine cannot
give a container a GPU: no NVIDIA runtime, or no driver).
"""


def _smoke_parser(commands: Any) -> None:
    smoke = commands.add_parser(
        "smoke", help="smoke-test the artifacts on a GPU runner (JSON report + summary)",
        description="Run the smoke checks in this Python environment (--mode host) or in a "
                    "built image with every GPU attached (--mode image). Runs with "
                    "FLASHINFER_DISABLE_JIT=1: a kernel missing from the kernel wheel fails, "
                    "it is never compiled.",
        epilog=_SMOKE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    smoke.add_argument("--json", action="store_true",
                       help="print one JSON object on stdout and no progress")
    smoke.add_argument("--mode", choices=("host", "image"), default="host",
                       help="host: this environment; image: a container (default: %(default)s)")
    smoke.add_argument("--image", metavar="REF",
                       help="the image to test (--mode image); @FILE reads the image ID from "
                            "the JSON that `image --json` printed into FILE")
    smoke.add_argument("--python", metavar="PY",
                       help="interpreter of the tested environment (default: this one; in "
                            "an image: python3)")
    which = smoke.add_mutually_exclusive_group()
    which.add_argument("--sglang-wheel", type=Path, metavar="WHEEL",
                       help="the sglang wheel being released: the installed one must be it")
    which.add_argument("--expect-provenance", type=Path, metavar="FILE",
                       help="compare the installed sglang's sm120-provenance.json with this")
    smoke.add_argument("--series", type=Path, default=Path("patches/series.toml"),
                       metavar="FILE", help="series whose intent checks must hold in the "
                                            "installed sglang (default: %(default)s)")
    smoke.add_argument("--moe", action="store_true",
                       help="count check 5 (fused MoE autotune) even when it cannot run")
    smoke.add_argument("--model", type=Path, metavar="PATH",
                       help="a model folder: also launch SGLang and ask it for text (check 6)")
    smoke.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                       help="extra argument for sglang.launch_server (repeatable)")
    smoke.add_argument("--probe-output", type=Path, metavar="FILE",
                       help="judge this saved output of builder/smoke_probe.py (run by hand "
                            "where the builder is not installed) instead of running it")
    smoke.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                       help="limit for the probe, checks 1-5 (default: %(default)s)")
    smoke.add_argument("--server-timeout", type=float, default=1800.0, metavar="SECONDS",
                       help="limit for the server to become ready (default: %(default)s)")
    smoke.add_argument("--output", type=Path, metavar="FILE",
                       help="also write the JSON report here (written when it fails too)")
    smoke.set_defaults(handler=_cmd_smoke)


def _render_smoke(report: SmokeReport, reporter: Reporter) -> None:
    table = Table(title=f"Smoke test ({report.mode} mode)")
    for column in ("check", "status", "counted", "detail"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        table.add_row(check.name, check.status, "yes" if check.required else "no",
                      check.detail)
    reporter.result(table)
    reporter.result(report.summary()[-1], style="bold")


def _cmd_smoke(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    if args.image and args.image.startswith("@"):
        args.image = _image_id_from(Path(args.image[1:]))
    if args.mode == "image" and not args.image:
        raise BuilderError("--mode image needs --image REF", "name the image to test")
    if args.probe_output is not None and args.mode == "image":
        raise BuilderError("--probe-output judges a host-mode probe", "drop --mode image")
    report = run_smoke(SmokeOptions(
        mode=args.mode, image=args.image, python=args.python, series=args.series,
        sglang_wheel=args.sglang_wheel, expect_provenance=args.expect_provenance,
        model=args.model, moe=args.moe, server_args=tuple(args.server_arg),
        probe_output=args.probe_output, probe_timeout=args.timeout,
        server_timeout=args.server_timeout, reporter=reporter))
    if args.output is not None:
        write_report(report, args.output)
    _render_smoke(report, reporter)
    if not report.passed:
        raise SmokeFailed(report)
    return report.to_json()


def _exit_status(exc: BuilderError) -> int:
    """1, or the smoke test's own status (3: misconfigured runner)."""
    return exc.exit_status if isinstance(exc, SmokeFailed) else 1

# --- end smoke -------------------------------------------------------------------------
def _image_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("image")
    group.add_argument("--registry", default="localhost:5000", metavar="HOST[:PORT]",
                       help="registry the image tag names (default: %(default)s)")
    group.add_argument("--repository", default="sglang-sm120", metavar="PATH",
                       help="repository in that registry (default: %(default)s)")
    group.add_argument("--base-image", metavar="NAME@sha256:...",
                       help="build on this image instead of the pinned upstream one")
    group.add_argument("--kernel-wheel", type=Path, action="append", default=[],
                       metavar="WHEEL", help="also install this wheel (repeatable; e.g. "
                       "the flashinfer_jit_cache kernel wheel)")
    group.add_argument("--pins-file", type=Path, default=Path("images/pins.toml"),
                       help="upstream base images by digest (default: %(default)s)")
    group.add_argument("--dockerfile", type=Path, default=Path("images/Dockerfile"),
                       help="the runtime image's Dockerfile (default: %(default)s)")
    group.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                       help="where the wheels go (default: %(default)s)")
    group.add_argument("--docker-host", metavar="URL",
                       help="the Docker Engine (default: $DOCKER_HOST or "
                            "unix:///var/run/docker.sock)")


def _image_options(args: argparse.Namespace) -> ImageOptions:
    return ImageOptions(registry=args.registry, repository=args.repository,
                        base_image=args.base_image, pins_file=args.pins_file,
                        dockerfile=args.dockerfile, kernel_wheels=tuple(args.kernel_wheel),
                        docker_host=args.docker_host)


def _options(args: argparse.Namespace, reporter: Reporter) -> Options:
    return Options(
        targets_file=args.targets_file, target=getattr(args, "target", None),
        cache_dir=args.cache_dir or default_cache_root(),
        index_url=getattr(args, "index_url", DEFAULT_INDEX_URL),
        source=getattr(args, "source", None), git_url=getattr(args, "git_url", None),
        source_dir=getattr(args, "source_dir", None),
        upstream_version=getattr(args, "upstream_version", None),
        series=getattr(args, "series", None), patch=getattr(args, "patch", None),
        strip=getattr(args, "strip", 1), max_fuzz=getattr(args, "max_fuzz", 0),
        dist_dir=getattr(args, "dist", Path("dist")), reporter=reporter)


def _cmd_targets(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    targets = load_targets(args.targets_file)
    table = Table("target", "version", "sources", "CUDA", "arch list", title="Targets")
    for target in targets.targets.values():
        mark = " (default)" if target.name == targets.default else ""
        kinds = ", ".join(p.kind + ("*" if p.kind == target.prefer else "")
                          for p in target.sources)
        table.add_row(target.name + mark, target.version, kinds, target.cuda_lane,
                      " ".join(target.arch_list))
    reporter.result(table)
    return {"default": targets.default,
            "targets": [t.describe() for t in targets.targets.values()]}


def _cmd_fetch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    source = run_fetch(_options(args, reporter))
    reporter.result(f"Source {source.upstream_version} ({source.layout.kind}) at {source.tree}")
    return source.describe()


def render_report(report: PatchReport, console: Console) -> None:
    """Print a patch report as a table, with the hunk and its near miss for failures."""
    table = Table(title=f"Patch report for upstream {report.upstream_version}")
    for column in ("patch", "file", "hunk", "status", "line", "offset", "fuzz", "note"):
        table.add_column(column, overflow="fold")
    for patch in report.patches:
        if not patch.files or patch.status == "obsolete":
            table.add_row(patch.name, "", "", str(patch.status), "", "", "", patch.message)
            continue
        for file in patch.files:
            if not file.hunks:
                table.add_row(patch.name, file.path, "", file.status, "", "", "", file.note)
            for hunk in file.hunks:
                note = hunk.note
                if hunk.status == "fuzz":
                    note = f"allowed up to fuzz {patch.max_fuzz} (reason below)"
                table.add_row(patch.name, file.path, str(hunk.hunk), str(hunk.status),
                              "" if hunk.line is None else str(hunk.line),
                              "" if hunk.offset is None else str(hunk.offset),
                              "" if hunk.fuzz is None else str(hunk.fuzz), note)
    console.print(table)
    for patch in report.patches:
        if patch.fuzz_reason and any(h.status == "fuzz" for f in patch.files for h in f.hunks):
            console.print(f"fuzz allowance for {patch.name}: {patch.fuzz_reason}",
                          markup=False)
    for intent in report.intents:
        mark = "[green]holds[/]" if intent.holds else "[red]FAILS[/]"
        before = "held before" if intent.held_before else "did not hold before"
        console.print(f"intent {mark} ({before}): ", end="")
        console.print(f"{intent.check} -- {intent.detail}", markup=False)
    for patch in report.patches:
        for file in patch.files:
            for hunk in file.hunks:
                if hunk.text:
                    _print_failed_hunk(console, patch.name, file.path, hunk)


def _print_failed_hunk(console: Console, patch: str, path: str, hunk: HunkResult) -> None:
    console.print(f"\n{patch} {path} hunk #{hunk.hunk} ({hunk.status}):", markup=False)
    console.print(hunk.text, markup=False, highlight=False, end="")
    if hunk.candidates:
        console.print(f"it could land at lines {', '.join(map(str, hunk.candidates))}; "
                      "line numbers cannot tell them apart", markup=False)
    if hunk.near_miss is not None:
        miss = hunk.near_miss
        console.print(f"nearest place: line {miss.line} ({miss.matched} of {miss.total} "
                      "lines equal):", markup=False)
        console.print(miss.diff, markup=False, highlight=False, end="")


def _cmd_patch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    in_place = args.source_dir is not None
    result = run_patch(_options(args, reporter), in_place=in_place, dry_run=args.dry_run)
    render_report(result.report, reporter.out)
    applied = any(p.status == "applied" for p in result.report.patches)
    where = ("nothing written (--dry-run)" if args.dry_run else
             "nothing to write: nothing left to apply" if not applied else
             f"patched in place: {result.tree}" if in_place else
             f"patched tree (a cache entry: do not edit): {result.tree}")
    reporter.result(where)
    return {"tree": None if args.dry_run else str(result.tree), "key": result.key,
            "report": result.report.to_json()}


def _cmd_wheel(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    results = run_wheels(_options(args, reporter))
    render_report(PatchReport.from_json(results[0].provenance), reporter.out)
    for result in results:
        how = "from cache" if result.cached else "built"
        reporter.result(f"{result.path} ({how}, sha256 {result.sha256})", style="bold")
    return {"wheels": [result.describe() for result in results]}


def _list(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def _matrix_table(matrix: Matrix) -> Table:
    table = Table(title="Patch compatibility")
    table.add_column("patch", overflow="fold")
    for column in matrix.columns:
        table.add_column(column.label + (f"\n({column.target})" if column.target else ""),
                         overflow="fold")
    for name, row in zip(matrix.patches, matrix.cells, strict=True):
        table.add_row(name, *(cell.text + {True: " ✓", False: " ✗", None: ""}[cell.intents]
                              for cell in row))
    return table


def _cmd_check(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    matrix = run_check(_options(args, reporter), versions=_list(args.versions),
                       commits=_list(args.commits))
    if args.format == "markdown":
        reporter.raw(matrix.to_markdown())
    else:
        reporter.result(_matrix_table(matrix))
        reporter.result("✓ / ✗: the patch's intent checks hold / fail after the series")
    if matrix.broken_targets:
        raise BuilderError(f"the series would break: {', '.join(matrix.broken_targets)}",
                           "run python -m builder patch --target NAME --dry-run for detail",
                           report=matrix)
    return matrix.to_json()


def _cmd_refresh(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    results = run_refresh(_options(args, reporter), accept_fuzz=args.accept_fuzz,
                          output_dir=args.output_dir, dry_run=args.dry_run)
    table = Table(title="Refresh")
    for column in ("patch", "status", "old sha256", "new sha256", "written to"):
        table.add_column(column, overflow="fold")
    for item in results:
        table.add_row(item.name, item.status, item.old_sha256[:12], item.new_sha256[:12],
                      str(item.written or "-"))
    reporter.result(table)
    for item in results:
        for hunk in item.fuzzed:
            reporter.raw(f"\n{item.name} {hunk.path}: this hunk needed fuzz {hunk.fuzz}; "
                         f"check that the refreshed placement is right.\nbefore:\n"
                         f"{hunk.before}after:\n"
                         f"{hunk.after or '(not found in the refreshed patch)'}\n")
    return {"patches": [item.to_json() for item in results], "dry_run": args.dry_run}


def _cmd_preflight(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    includes = args.include or [args.nvcc.resolve().parent.parent / "include"]
    result = run_preflight(_options(args, reporter), nvcc=args.nvcc, include_dirs=includes,
                           python=args.python, lane=args.cuda_lane)
    reporter.result(f"{result.target}: FlashInfer {result.pins.flashinfer}, kernel wheel "
                    f"flashinfer_jit_cache {result.kernel_version}, SM120 arch {result.arch}")
    table = Table(title="Toolchain preflight")
    for column in ("check", "ok", "detail"):
        table.add_column(column, overflow="fold")
    for check in result.checks:
        table.add_row(check.name, "yes" if check.ok else "NO", check.detail)
    reporter.result(table)
    if not result.ok:
        failed = [c for c in result.checks if not c.ok]
        raise BuilderError(f"toolchain preflight failed: {failed[0].name}: {failed[0].detail}"
                           + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""),
                           "see the table; fix the toolchain before compiling",
                           report=result)
    return result.to_json()


# --- CI commands: plan (the build matrix) and upstream (the scheduled check) -------------

def _ci_commands(commands: Any) -> None:
    plan = commands.add_parser(
        "plan", help="the CI build matrix: one entry per target of the targets file",
        description="Print what a CI job needs per target (name, versions, CUDA lane, arch "
                    "list, source kind, Python tags of repacked wheels), read from the "
                    "targets file alone: no downloads. With --json, the object's 'targets' "
                    "list is a GitHub Actions matrix 'include' (ci/build.yml uses it).")
    _common(plan, target=False)
    plan.set_defaults(handler=_cmd_plan)

    upstream = commands.add_parser(
        "upstream", help="newer upstream releases than any target, checked against the series",
        description="List the project's releases on the simple index (PEP 691 JSON or PEP "
                    "503 HTML), keep those newer than the newest target (never yanked ones; "
                    "pre-releases with --pre), run the compatibility matrix on them and say "
                    "which patches need a refresh and which became obsolete. Exits 1 when "
                    "the series would break on a newer release.")
    _common(upstream, target=False)
    upstream.add_argument("--index-url", default=DEFAULT_INDEX_URL,
                          help="simple index to list and fetch releases from "
                               "(default: %(default)s)")
    upstream.add_argument("--pre", action="store_true",
                          help="also check pre-releases and development releases")
    upstream.add_argument("--series", type=Path, metavar="FILE",
                          help="series to check (default: the default target's)")
    upstream.add_argument("--format", choices=("table", "markdown"), default="table",
                          help="human output: tables, or Markdown for a CI job summary")
    upstream.set_defaults(handler=_cmd_upstream)


def _cmd_plan(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    plan = run_plan(_options(args, reporter))
    table = Table(title="CI plan")
    for column in ("target", "version", "CUDA", "arch list", "source", "Python tags"):
        table.add_column(column, overflow="fold")
    for entry in plan.entries:
        table.add_row(entry.target + (" (default)" if entry.default else ""), entry.version,
                      entry.cuda_lane, " ".join(entry.arch_list), entry.source,
                      " ".join(entry.python_tags) or "any")
    reporter.result(table)
    return plan.to_json()


def _cmd_upstream(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    report = run_upstream(_options(args, reporter), pre=args.pre)
    if args.format == "markdown":
        reporter.raw(report.to_markdown())
    else:
        skipped = ", ".join(f"{s.version} ({s.reason})" for s in report.skipped)
        reporter.result(f"{report.project} on {report.index_url}: newest target "
                        f"{report.newest_target}; newer releases checked: "
                        f"{', '.join(report.new_versions) or 'none'}"
                        + (f"; skipped: {skipped}" if skipped else ""))
        if report.findings or report.unpatched:
            table = Table(title="Findings")
            for column in ("patch", "release", "action", "detail"):
                table.add_column(column, overflow="fold")
            for finding in report.findings:
                table.add_row(finding.patch, finding.version, finding.action, finding.detail)
            for version in report.unpatched:
                table.add_row("(every patch)", version, "nothing to patch",
                              "a target pinned to it would be refused")
            reporter.result(table)
        if report.matrix is not None:
            reporter.result(_matrix_table(report.matrix))
    if report.needs_refresh:
        broken = sorted({f.version for f in report.findings if f.action == "refresh"},
                        key=Version)
        raise BuilderError(f"the series needs a refresh for {', '.join(broken)}",
                           "python -m builder refresh --target NAME after pinning the release "
                           "(README: Refresh)", report=report)
    return report.to_json()
def _cmd_image(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    result = run_image(_options(args, reporter), _image_options(args))
    how = "from the build cache" if result.cached else "built"
    reporter.raw(f"image {result.image_id} ({how}) on {result.base.reference}\n"
                 + "".join(f"tagged {tag}\n" for tag in result.tags)
                 + f"layer added: {result.layer_size} bytes ({result.layers_added} layer); "
                 f"installed: {', '.join(result.requirements)}\n")
    return result.describe()


def _cmd_release(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    index = Index.from_urls(args.repository_url, args.publish_index_url)
    image_options = _image_options(args)
    gate = gpu_gate(docker_host=image_options.docker_host, series=args.gate_series) \
        if args.gate == "gpu" else static_gate
    summary = run_release(_options(args, reporter), image_options, index, gate=gate)
    reporter.raw("".join(line + "\n" for line in summary.lines()))
    return summary.to_json()


def _terminate(number: int, _frame: object) -> None:
    raise KeyboardInterrupt(number)


def _print_error(exc: BuilderError) -> None:
    err = Console(stderr=True, highlight=False)
    if isinstance(exc.report, PatchReport):
        render_report(exc.report, err)
    if isinstance(exc.report, ReleaseSummary):
        err.print("release summary:", style="bold")
        for line in exc.report.lines():
            err.print(f"  {line}", markup=False, soft_wrap=True)
    err.print("error:", style="bold red", end=" ")
    err.print(exc.cause, markup=False, soft_wrap=True)
    if exc.hint:
        err.print("hint:", style="bold", end=" ")
        err.print(exc.hint, markup=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 refused or failed, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "upstream_version", None) and not getattr(args, "source_dir", None):
        parser.error("--upstream-version only applies with --source-dir")
    if args.command == "check":
        if args.git_url and not args.commits:
            parser.error("--git-url only applies with --commits")
        for flag in ("versions", "commits"):
            if getattr(args, flag) is not None and not _list(getattr(args, flag)):
                parser.error(f"--{flag} is empty")
    reporter = Reporter(quiet=args.json, progress=getattr(args, "progress", False))
    handler: Callable[[argparse.Namespace, Reporter], dict[str, Any]] = args.handler
    previous = signal.signal(signal.SIGTERM, _terminate)  # clean up as on Ctrl-C
    try:
        payload = handler(args, reporter)
    except BuilderError as exc:
        if args.json:
            print(json.dumps(exc.to_json(), indent=2))
        else:
            _print_error(exc)
        return _exit_status(exc)
    except OSError as exc:  # a path the user gave cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        error = BuilderError(f"{exc.strerror or exc}{where}",
                             "check the paths given (--dist, --cache-dir, ...) and their "
                             "permissions")
        if args.json:
            print(json.dumps(error.to_json(), indent=2))
        else:
            _print_error(error)
        return 1
    except KeyboardInterrupt as exc:
        print("interrupted; nothing half-written was kept", file=sys.stderr)
        return 143 if exc.args == (signal.SIGTERM,) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(payload, indent=2))
    return 0

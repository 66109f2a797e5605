"""The kernel stage's commands: ``preflight`` and ``kernels``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    comma_names,
    comma_numbers,
    common,
    docker_host_arg,
    options,
    positive,
    source_args,
)
from builder.core.basepins import PINS_FILE
from builder.core.errors import BuilderError, MissingToolError

if TYPE_CHECKING:
    from builder.core.progress import Reporter


def add_commands(commands: Any) -> None:
    """Add ``preflight`` and ``kernels``."""
    preflight = commands.add_parser(
        "preflight", help="check this machine's CUDA toolchain for a target's kernels",
        description="Read the FlashInfer / kernel / torch pins from the target's upstream "
                    "source, derive the SM120 arch FlashInfer detects, and check a toolchain: "
                    "nvcc is the target's CUDA lane and really compiles for its archs, the "
                    "cuBLAS and cuRAND headers are there, torch is built for the lane (or "
                    "the CPU). `kernels` runs the same checks before compiling. Writes nothing "
                    "but the release's download in the cache (`kernels --save-request FILE` "
                    "writes what a build would compile). Exits "
                    "3 (a missing tool) when a check fails.")
    common(preflight)
    source_args(preflight)
    preflight.add_argument("--nvcc", type=Path, metavar="PATH",
                           help="nvcc to check (default: as `kernels` finds it: one of the "
                                "lane in $CUDA_HOME, on PATH or in /usr/local/cuda, else the "
                                "first nvcc there)")
    preflight.add_argument("--include", type=Path, action="append", metavar="DIR",
                           help="where the cuBLAS/cuRAND headers may be (repeatable; default: "
                                "the toolkit's include folder and those of NVIDIA's PyPI "
                                "wheels in this Python and --python)")
    preflight.add_argument("--cuda-lane", metavar="X.Y",
                           help="one of the target's CUDA lanes (default: its first)")
    preflight.add_argument("--python", type=Path, metavar="PY",
                           help="interpreter whose torch must match the lane (default: skip)")
    preflight.set_defaults(handler=_cmd_preflight)

    _kernels_parser(commands)


_KERNELS_EPILOG = """\
module groups: norm, activation, sampling, rope, page, attention (for --head-dims),
  trtllm_utils (the autotuner's delay kernel), fused_moe_smNN, fp4_quantization_smNN and
  fp4_gemm_smNN (FlashInfer's per-arch spec functions, e.g. fused_moe_sm120). Default: the
  target's [target.kernels] groups, else fused_moe_sm120, fp4_quantization_sm120f (sm120
  for a 12.0a target), fp4_gemm_sm120, trtllm_utils, norm, activation, sampling, rope,
  page, attention: what SGLang loads on SM120 for NVFP4 MoE models with flashinfer_cutlass.

examples:
  python -m builder kernels --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder kernels --target sglang-0.5.23 --modules norm   # shim + sm120f provider
  python -m builder kernels --target sglang-0.5.9 --mode container --cuda-lane 13.0
  python -m builder kernels --environment current --arch-list 9.0a --modules norm,sampling
  python -m builder kernels --arch-list 9.0a --modules fused_moe_sm90,trtllm_utils --fast-build
  SCCACHE_REDIS_ENDPOINT=redis://cache:6379 python -m builder kernels --sccache

one cold build over N machines (docs/compile-at-scale.md), the same backend everywhere:
  python -m builder kernels --sccache --shard 1/4     # ... --shard 4/4, one per CI job
  python -m builder kernels --sccache                 # then: every object is a cache hit

The wheel is flashinfer_jit_cache <flashinfer>+<label>.cu<lane>; with it installed and
FLASHINFER_DISABLE_JIT=1, FlashInfer loads the modules instead of compiling them. From
FlashInfer 0.7 there are two: the provider flashinfer_jit_cache_sm120f (the modules) and
the flashinfer_jit_cache shim pinning it; install both. No GPU is needed to build.
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
    common(kernels)
    source_args(kernels)
    kernels.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                         help="where the wheel goes (default: %(default)s)")
    kernels.add_argument("--modules", type=comma_names, metavar="A,B",
                         help="module groups to build (see below)")
    kernels.add_argument("--head-dims", type=comma_numbers, metavar="N,M",
                         help="head dimensions for the attention group (default: 128)")
    kernels.add_argument("--cuda-lane", metavar="X.Y",
                         help="one of the target's CUDA lanes (default: its first)")
    kernels.add_argument("--arch-list", type=comma_names, metavar="ARCH,...",
                         help="archs other than the target's, e.g. 9.0a to smoke-test on a "
                              "Hopper GPU (the wheel's label then names them)")
    kernels.add_argument("--fast-build", action="store_true",
                         help="compile the fused MoE modules with TensorRT-LLM's FAST_BUILD: "
                              "of the TMA warp-specialised grouped GEMMs only CTA 128x128 "
                              "(cluster 1x1x1) is built, the Ampere-style ones all stay, so "
                              "the autotuner has fewer tactics. For smoke tests: the label "
                              "says fastbuild, the lock never records it, release refuses it")
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
    kernels.add_argument("--jobs", type=positive, metavar="N",
                         help="parallel compile jobs (default: CPUs, bounded by free memory)")
    kernels.add_argument("--shard", type=_shard, metavar="I/N",
                         help="compile only shard I of N of the compile steps into the "
                              "sccache backend (needs --sccache), write no wheel; a final "
                              "run without --shard links and packs")
    kernels.add_argument("--step-costs", type=Path, metavar="FILE",
                         help="balance the shards by this step-costs file (default: the one "
                              "every build records in the cache's kernel-costs/)")
    kernels.add_argument("--base-image", metavar="REF",
                         help="container mode: the build container's base image (default: "
                              "the lane's [[kernel_base]] in --pins-file, by digest)")
    kernels.add_argument("--pins-file", type=Path, default=PINS_FILE,
                         help="container mode: where the default base's digest is "
                              "(default: %(default)s; `pin-images` writes it)")
    kernels.add_argument("--toolkit", choices=("pypi", "base"),
                         help="container mode: CUDA from the base image (nvidia/cuda:*-devel) "
                              "or from PyPI's wheels (default: the base's if it has one)")
    kernels.add_argument("--docker-host", metavar="URL", type=docker_host_arg,
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


def _shard(text: str) -> Any:
    from builder.kernels.shard import Shard

    try:
        return Shard.parse(text)
    except BuilderError as error:
        raise argparse.ArgumentTypeError(error.cause) from None


def _cmd_preflight(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from rich.table import Table

    from builder.kernels.preflight import run_preflight

    result = run_preflight(options(args, reporter), nvcc=args.nvcc, include_dirs=args.include,
                           python=args.python, lane=args.cuda_lane)
    reporter.result(f"{result.target}: FlashInfer {result.pins.flashinfer}, kernel wheels "
                    f"{' + '.join(result.wheels)} {result.kernel_version}, SM120 arch "
                    f"{result.arch}")
    reporter.result(f"module groups: {', '.join(result.groups)}")
    table = Table(title="Toolchain preflight")
    for column in ("check", "ok", "detail"):
        table.add_column(column, overflow="fold")
    for check in result.checks:
        table.add_row(check.name, "yes" if check.ok else "NO",
                      check.detail + (f"\nfix: {check.fix}" if check.fix else ""))
    reporter.result(table)
    if not result.ok:
        failed = [c for c in result.checks if not c.ok]
        fixes = list(dict.fromkeys(c.fix for c in failed if c.fix))
        raise MissingToolError(f"toolchain preflight failed: {failed[0].name}: "
                               f"{failed[0].detail}"
                               + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""),
                               "; ".join(fixes) or "see the table; fix the toolchain before "
                               "compiling", report=result)
    return result.to_json()


def _cmd_kernels(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    import json

    from rich.table import Table

    from builder.core.cache import atomic_write_bytes
    from builder.kernels.build import ShardResult
    from builder.kernels.request import KernelOptions, kernel_request
    from builder.kernels.run import run_kernels

    reporter.verbose = args.verbose
    kernel = KernelOptions(
        lane=args.cuda_lane, groups=args.modules, head_dims=args.head_dims,
        arch_list=args.arch_list, mode=args.mode, environment=args.environment,
        nvcc=args.nvcc, build_torch=args.build_torch, wheelhouse=args.wheelhouse,
        sccache=args.sccache, jobs=args.jobs, base_image=args.base_image,
        toolkit=args.toolkit, engine=args.docker_host, request_file=args.request,
        pins_file=args.pins_file, shard=args.shard, step_costs=args.step_costs,
        fast_build=args.fast_build)
    if args.save_request:
        request = kernel_request(options(args, reporter), kernel)
        atomic_write_bytes(args.save_request,
                           (json.dumps(request.describe(), indent=2) + "\n").encode())
        reporter.result(f"{request.target}: flashinfer_jit_cache {request.version}, "
                        f"{', '.join(request.groups)} for {' '.join(request.arch_list)} "
                        f"-> {args.save_request}")
        return request.describe()
    result = run_kernels(options(args, reporter), kernel)
    if isinstance(result, ShardResult):
        reporter.result(f"shard {result.shard}: {len(result.steps)} of {result.total_steps} "
                        f"compile steps in {result.seconds} s into the sccache backend "
                        f"(no wheel; run without --shard to link and pack)")
        if result.sccache:
            reporter.result(f"sccache: {result.sccache}")
        return result.describe()
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
    if result.shim:
        reporter.result(f"FlashInfer >= 0.7 layout: install the shim {result.shim.name} "
                        f"(sha256 {result.shim_sha256}) with it; the shim pins this provider")
    if result.sccache:
        reporter.result(f"sccache: {result.sccache}")
    return result.describe()

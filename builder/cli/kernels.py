"""The kernels group: ``preflight`` and ``kernels build|container|plan|jit-cache`` (compile
here, compile in a CUDA build container, only write what a build would compile, or compile
SGLang's Triton kernels ahead into the JIT cache artifact)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    add_command,
    comma_names,
    comma_numbers,
    docker_host_arg,
    index_url_arg,
    options,
    positive,
    source_args,
    target_arg,
)
from builder.core.basepins import PINS_FILE
from builder.core.errors import BuilderError, MissingToolError

if TYPE_CHECKING:
    from builder.core.progress import Reporter
    from builder.kernels.request import KernelOptions


def add_commands(commands: Any) -> None:
    """Add ``preflight`` and ``kernels``."""
    preflight = add_command(
        commands, "preflight",
        help="check this machine's CUDA toolchain for a target's kernels",
        description="Read the FlashInfer / kernel / torch pins from the target's upstream "
                    "source, derive the SM120 arch FlashInfer detects, and check a toolchain: "
                    "nvcc is the target's CUDA lane and really compiles for its archs, the "
                    "cuBLAS and cuRAND headers are there, torch is built for the lane (or "
                    "the CPU). `kernels` runs the same checks before compiling. Writes nothing "
                    "but the release's download in the cache (`kernels plan --output FILE` "
                    "writes what a build would compile). Exits "
                    "3 (a missing tool) when a check fails.")
    target_arg(preflight)
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
  python -m builder kernels build --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder kernels build --target sglang-0.5.23 --modules norm   # shim + sm120f provider
  python -m builder kernels container --target sglang-0.5.9 --cuda-lane 13.0
  python -m builder kernels build --environment current --arch-list 9.0a --modules norm,sampling
  python -m builder kernels build --arch-list 9.0a --modules fused_moe_sm90,trtllm_utils \\
      --fast-build
  SCCACHE_REDIS_ENDPOINT=redis://cache:6379 python -m builder kernels build --sccache
  python -m builder kernels plan --target sglang-0.5.9 --output request.json
  python -m builder kernels plan --target sglang-0.5.23 --model /models/Qwen3-30B-A3B-FP4 \\
      --output request.json -- --tp-size 2      # the set this model and these flags load
  python -m builder kernels build --target sglang-0.5.23 --model /models/Qwen3-30B-A3B-FP4

one cold build over N machines (docs/compile-at-scale.md), the same backend everywhere:
  python -m builder kernels build --sccache --shard 1/4   # ... --shard 4/4, one per CI job
  python -m builder kernels build --sccache               # then: every object is a cache hit

The wheel is flashinfer_jit_cache <flashinfer>+<label>.cu<lane>; with it installed and
FLASHINFER_DISABLE_JIT=1, FlashInfer loads the modules instead of compiling them. From
FlashInfer 0.7 there are two: the provider flashinfer_jit_cache_sm120f (the modules) and
the flashinfer_jit_cache shim pinning it; install both. No GPU is needed to build.
A rebuild with unchanged inputs runs no compiler (the wheel is cached).
"""


_JIT_CACHE_EPILOG = """\
examples:
  # on the GPU machine, one server run with Triton's JIT hook recording its launches:
  #   builder/kernels/data/triton_watch.py and a sitecustomize.py holding `import
  #   triton_watch` in a folder on PYTHONPATH, SGLANG_SM120_TRITON_WATCH=/tmp/watch,
  #   one request, stop (docs/operator.md); then here, no GPU needed:
  python -m builder kernels jit-cache --target sglang-0.5.23 /tmp/watch 12.0f
  # with Inductor's cache of that run too: its TORCHINDUCTOR_CACHE_DIR copied into the
  # watch folder as inductor/ once the server stopped, then the same command
  python -m builder image --target sglang-0.5.23 \\
      --kernel-wheel dist/sglang_sm120_jit_caches-0.5.23+sm120.1-cp312-none-any.whl

The wheel's manifest (sglang_sm120_jit_caches/sm120-jit-caches.json) keys it: triton's
version, the Python it was built under (Triton's key hashes libtriton, which differs per
Python: run this with the server's Python, the image's) and the arch. At start the launcher
restores nothing, with one line saying why, where the installed triton, the Python or the
GPU differs (set SGLANG_SM120_JIT_CACHES=none to skip it);
the kernels then compile at first use as without the wheel. A launch that was not recorded,
or that SGLang parameterises by the device (a list recorded on another GPU), compiles too.
The wheel's version is the target's, with the arch in its local label when the arch is not
the target's own (sglang_sm120_jit_caches-0.5.16+sm120.1.sm90a-...), so two archs' wheels
never share a name.
SPECS/inductor/ (Inductor's cache of the run: /tmp/torchinductor_<user>, or
$SGLANG_CACHE_DIR/inductor from 0.5.20; the run must be of the image's torch, the release's
pin, which the artifact records; Inductor tunes on the GPU, so it is not built here) is
packed too and restored file by file into the server's TORCHINDUCTOR_CACHE_DIR when torch's
version, the Python and the GPU's arch are the capture's; Inductor's own key (torch, Triton,
the GPU's name, the graph) decides the rest: another GPU model misses, never a wrong kernel.
SPECS/selection/ (the image's launcher keeps its kernel check's backend selection there when
SGLANG_SM120_TRITON_WATCH is set) is shipped too: a start whose selection inputs are the
recorded run's (sglang's files, the packages on the path, the --model-path and its files,
the flags and the files they name, the driver, SGLang's variables) takes it instead of
running the selection, about 30 s on the H200.
exit status: 2 bad SPECS, an ARCH that is none or that triton's ptxas does not know, DIST
not a folder, a SPECS/inductor/ with no FX graph entry, a SPECS/selection/ holding another
file than a kept selection, or a target without a wheel for
this Python (give --target: the default, targets.toml's `default`, is a source target); 6
Triton's compile did not finish, or no specialization compiled.
"""


def _kernels_parser(commands: Any) -> None:
    kernels = add_command(
        commands, "kernels",
        help="compile FlashInfer modules for sm_120 into a flashinfer_jit_cache wheel",
        description="Compile the target's FlashInfer modules ahead of time, with FlashInfer's "
                    "own JIT spec functions of the version the target pins, check every "
                    "library's SASS with cuobjdump, and pack a flashinfer_jit_cache wheel "
                    "into --dist: on this machine (build) or in a CUDA build container "
                    "(container, via the Docker Engine); or only write what a build would "
                    "compile (plan). jit-cache compiles SGLang's own Triton kernels ahead into "
                    "the JIT cache wheel the image's launcher restores.",
        epilog=_KERNELS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = kernels.add_subparsers(dest="kernels_mode", required=True, metavar="MODE")
    build = add_command(
        modes, "build", help="compile on this machine",
        description="Compile with this machine's toolchain (or nvidia-cuda-nvcc from PyPI) "
                    "in a cached venv with the pinned FlashInfer, or in this Python.",
        epilog=_KERNELS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _request_args(build)
    _build_args(build)
    build.add_argument("--environment", choices=("managed", "current"), default="managed",
                       help="managed: a cached venv with the pinned FlashInfer (default); "
                            "current: this Python, FlashInfer already installed (offline)")
    build.add_argument("--nvcc", type=Path, metavar="PATH",
                       help="compiler (default: one of the lane on this machine, else "
                            "nvidia-cuda-nvcc from PyPI)")
    build.add_argument("--wheelhouse", type=Path, metavar="DIR",
                       help="install the build venv offline from these wheels")
    # Only here: the build container runs `kernels build --json --progress`, so that its log
    # streams while stdout stays JSON; on the host, --json means no progress (the root's rule).
    build.add_argument("--progress", action="store_true",
                       help="with --json, still show progress on stderr")
    _model_args(build)
    build.set_defaults(handler=_cmd_kernels_build)

    container = add_command(
        modes, "container", help="compile in a CUDA build container (Docker Engine)",
        description="Compile in a CUDA build container made from --base-image (default: the "
                    "lane's pinned [[kernel_base]]), which runs `kernels build --request` "
                    "inside.",
        epilog=_KERNELS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _request_args(container)
    _build_args(container)
    container.add_argument("--base-image", metavar="REF",
                           help="the build container's base image (default: the lane's "
                                "[[kernel_base]] in --pins-file, by digest)")
    container.add_argument("--pins-file", type=Path, default=PINS_FILE,
                           help="where the default base's digest is (default: %(default)s; "
                                "`pin-images` writes it)")
    container.add_argument("--toolkit", choices=("pypi", "base"),
                           help="CUDA from the base image (nvidia/cuda:*-devel) or from "
                                "PyPI's wheels (default: the base's if it has one)")
    container.add_argument("--docker-host", metavar="URL", type=docker_host_arg,
                           help="the Docker Engine (default: DOCKER_HOST)")
    container.set_defaults(handler=_cmd_kernels_container)

    plan = add_command(
        modes, "plan", help="only resolve what to build and write it as JSON",
        description="Resolve what a build would compile and write it as JSON (for "
                    "`kernels build --request` on a machine without the upstream source or "
                    "network); compiles nothing.",
        epilog=_KERNELS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _request_args(plan)
    _model_args(plan)
    plan.add_argument("--output", type=Path, required=True, metavar="FILE",
                      help="where the request's JSON goes")
    plan.set_defaults(handler=_cmd_kernels_plan)

    jit = add_command(
        modes, "jit-cache",
        help="compile SGLang's Triton kernels ahead, on this CPU, into a wheel the image's "
             "launcher restores",
        description="Compile the Triton kernels a server of the target launches, for ARCH, "
                    "on this machine (no GPU: the release's own triton and sglang in its "
                    "behaviour environment, the series applied), and pack them as the wheel "
                    "sglang-sm120-jit-caches into DIST. Install it next to sglang (`image "
                    "--kernel-wheel WHEEL`, or pip): before the server starts, "
                    "sglang-sm120-serve copies the kernels its Triton cache lacks into it, "
                    "so those launches do not compile. Which launches: SPECS, the "
                    "specializations Triton's JIT hook recorded in a server run on a GPU "
                    "(builder/kernels/data/triton_watch.py, SGLANG_SM120_TRITON_WATCH).",
        epilog=_JIT_CACHE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(jit)
    index_url_arg(jit)
    jit.add_argument("specs", type=Path, metavar="SPECS",
                     help="the folder triton_watch wrote (its *.jsonl; and inductor/, the "
                          "run's Inductor cache, when you copied it there), one such file, or "
                          "a JSON list of Triton specialization_data strings")
    jit.add_argument("arch", metavar="ARCH",
                     help="the GPU the kernels are for: 12.0f or sm_120a for SM120 (RTX PRO "
                          "6000, RTX 5090); sm_90a to try it on a Hopper. Triton keys by the "
                          "compute capability: a kernel built for 12.0 is never taken on "
                          "another GPU")
    jit.add_argument("dist", type=Path, nargs="?", default=Path("dist"), metavar="DIST",
                     help="where the wheel goes (default: %(default)s)")
    jit.set_defaults(handler=_cmd_kernels_jit_cache)


def _model_args(parser: argparse.ArgumentParser) -> None:
    """The model a derived set is for, and its server flags (after ``--``)."""
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="derive the module groups and head dims from this checkpoint "
                             "folder (config.json, hf_quant_config.json) and the server "
                             "flags after --, with the release's own backend selection "
                             "(its behaviour environment, the device reported as SM120)")
    parser.add_argument("server_flags", nargs="*", metavar="-- FLAG",
                        help="the server flags the model starts with (with --model)")


def _request_args(parser: argparse.ArgumentParser) -> None:
    """What to compile: the target, its source and the module groups, archs and lane."""
    target_arg(parser)
    source_args(parser)
    parser.add_argument("--modules", type=comma_names, metavar="A,B",
                        help="module groups to build (see below)")
    parser.add_argument("--head-dims", type=comma_numbers, metavar="N,M",
                        help="head dimensions for the attention group (default: 128)")
    parser.add_argument("--cuda-lane", metavar="X.Y",
                        help="one of the target's CUDA lanes (default: its first)")
    parser.add_argument("--arch-list", type=comma_names, metavar="ARCH,...",
                        help="archs other than the target's, e.g. 9.0a to smoke-test on a "
                             "Hopper GPU (the wheel's label then names them)")
    parser.add_argument("--fast-build", action="store_true",
                        help="compile the fused MoE modules with TensorRT-LLM's FAST_BUILD: "
                             "of the TMA warp-specialised grouped GEMMs only CTA 128x128 "
                             "(cluster 1x1x1) is built, the Ampere-style ones all stay, so "
                             "the autotuner has fewer tactics. For smoke tests: the label "
                             "says fastbuild, the lock never records it, release refuses it")


def _build_args(parser: argparse.ArgumentParser) -> None:
    """How to compile, in both places."""
    parser.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                        help="where the wheel goes (default: %(default)s)")
    parser.add_argument("--build-torch", metavar="REQ",
                        help="torch for the build venv (default: the target's pin; a CPU "
                             "build is enough to compile)")
    parser.add_argument("--sccache", action="store_true",
                        help="compile through sccache; SCCACHE_DIR, SCCACHE_REDIS_ENDPOINT, "
                             "SCCACHE_BUCKET ... choose its cache (shared across runners)")
    parser.add_argument("--jobs", type=positive, metavar="N",
                        help="parallel compile jobs (default: CPUs, bounded by free memory)")
    parser.add_argument("--shard", type=_shard, metavar="I/N",
                        help="compile only shard I of N of the compile steps into the "
                             "sccache backend (needs --sccache), write no wheel; a final "
                             "run without --shard links and packs")
    parser.add_argument("--step-costs", type=Path, metavar="FILE",
                        help="balance the shards by this step-costs file (default: the one "
                             "every build records in the cache's kernel-costs/)")
    parser.add_argument("--request", type=Path, metavar="FILE",
                        help="build a request saved as JSON (`kernels plan`) instead of "
                             "resolving the target (what the build container runs)")
    parser.add_argument("--verbose", action="store_true",
                        help="print every compiler line, not just the steps")


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


def _cmd_kernels_build(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.kernels.request import KernelOptions

    return _build(args, reporter, KernelOptions(
        lane=args.cuda_lane, groups=args.modules, head_dims=args.head_dims,
        arch_list=args.arch_list, mode="host", environment=args.environment,
        nvcc=args.nvcc, build_torch=args.build_torch, wheelhouse=args.wheelhouse,
        sccache=args.sccache, jobs=args.jobs, request_file=args.request,
        shard=args.shard, step_costs=args.step_costs, fast_build=args.fast_build,
        model=args.model, server_flags=tuple(args.server_flags)))


def _cmd_kernels_container(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.kernels.request import KernelOptions

    return _build(args, reporter, KernelOptions(
        lane=args.cuda_lane, groups=args.modules, head_dims=args.head_dims,
        arch_list=args.arch_list, mode="container", build_torch=args.build_torch,
        sccache=args.sccache, jobs=args.jobs, base_image=args.base_image,
        toolkit=args.toolkit, engine=args.docker_host, request_file=args.request,
        pins_file=args.pins_file, shard=args.shard, step_costs=args.step_costs,
        fast_build=args.fast_build))


def _cmd_kernels_plan(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    import json

    from builder.core.cache import atomic_write_bytes
    from builder.kernels.prune import moe_prune_plan
    from builder.kernels.request import KernelOptions, derived_request

    kernel = KernelOptions(lane=args.cuda_lane, groups=args.modules, head_dims=args.head_dims,
                           arch_list=args.arch_list, fast_build=args.fast_build,
                           model=args.model, server_flags=tuple(args.server_flags))
    request, derived = derived_request(options(args, reporter), kernel)
    written = request.describe()
    if derived is not None:  # read back by KernelRequest.from_json, which ignores it
        written["derived"] = {"model": str(args.model), "server_flags": args.server_flags,
                              **derived.describe()}
        for need in derived.needs:
            reporter.info(f"{need.group}: {need.because}"
                          + (f" ({need.variant})" if need.variant else ""))
        for note in derived.unbuildable:
            reporter.info(f"warning: not in any module group (JIT would compile it): {note}")
    if request.moe_variants:
        written["moe_prune"] = moe_prune_plan(request.moe_variants)
        plan = written["moe_prune"]
        reporter.info(f"fused MoE pruned to {', '.join(request.moe_variants)}: keeps "
                      f"{', '.join(plan['kept_units'])}; stubs "
                      f"{', '.join(plan['stubbed_units'])} and drops the generated "
                      "launchers only those call")
    atomic_write_bytes(args.output, (json.dumps(written, indent=2) + "\n").encode())
    reporter.result(f"{request.target}: flashinfer_jit_cache {request.version}, "
                    f"{', '.join(request.groups)} for {' '.join(request.arch_list)} "
                    + (f"(head dims {', '.join(map(str, request.head_dims))}) "
                       if request.head_dims else "") + f"-> {args.output}")
    return written


def _cmd_kernels_jit_cache(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.kernels.jit_caches import run_kernels_jit_cache

    artifact = run_kernels_jit_cache(options(args, reporter), args.specs, args.arch)
    for name, records in artifact.kernels.items():
        for record in records:
            if not record["ok"]:
                reporter.info(f"warning: {name} {record.get('kernel')} did not compile (it "
                              f"compiles at first use): {str(record.get('error'))[:300]}")
    for name, record in artifact.manifest["frameworks"].items():
        failed = [r for r in artifact.kernels.get(name, []) if not r["ok"]]
        under = f" under Python {record['python']}" if record.get("python") else ""
        what = "file(s) captured" if record.get("captured") else "kernel(s)"
        reporter.result(f"{name} {record['version']}: {record['entries']} {what} for "
                        f"{record['arch']}{under}"
                        + (f", {len(failed)} failed" if failed else ""))
    reporter.result(f"-> {artifact.wheel} (install it next to sglang {artifact.manifest['release']}"
                    "; sglang-sm120-serve restores it before the server starts)")
    return artifact.describe()


def _build(args: argparse.Namespace, reporter: Reporter, kernel: KernelOptions
           ) -> dict[str, Any]:
    """Run ``kernel``'s build and print its result (both modes)."""
    from rich.table import Table

    from builder.kernels.build import ShardResult
    from builder.kernels.run import run_kernels

    reporter.verbose = args.verbose
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

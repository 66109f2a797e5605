"""The release group: ``smoke`` (the GPU check), ``warm-cache capture|restore`` and
``release image|wheels`` (build, gate, publish: the wheels and the image, or the wheels
alone)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    add_command,
    image_args,
    image_id_from,
    image_options_from,
    index_url_arg,
    options,
    reads_shared,
    seconds,
    source_args,
    target_arg,
    validate_source_args,
)
from builder.core.errors import ConfigurationError

if TYPE_CHECKING:
    from builder.core.progress import Reporter
    from builder.smoke.gpu import SmokeOptions, SmokeReport

_SMOKE_EPILOG = """\
checks: runner, sglang, lockstep, kernels, moe-autotune, server, parallel. 1-4 always
count; 5 counts with --moe or when the kernel wheel ships the fused MoE module for this GPU;
6 counts with --model or --tiny-model (host mode) and fails unless SGLang's FlashInfer
autotune profiled tactics; 7 counts with --parallel (TP 1, TP 2 EP 1, TP 2 EP 2 must return
the same tokens; not-run, which fails, where fewer than 2 GPUs are visible). A check that
needs a GPU and finds none fails ("no CUDA device").

examples:
  python -m builder smoke host --sglang-wheel dist/sglang-0.5.9+sm120.1-py3-none-any.whl
  python -m builder smoke host --moe --json --output reports/smoke.json
  python -m builder smoke image --image sglang-sm120:0.5.9
  python -m builder smoke host --moe --model /models/small --server-arg=--tp-size=2
  python -m builder smoke host --moe --tiny-model --server-arg=--attention-backend=triton
  python -m builder smoke host --tiny-model --parallel  # on 2 GPUs
  # where only torch and FlashInfer are installed, run the probe alone, judge it elsewhere:
  cp -rL builder/smoke/script DIR  # the probe and the two files it loads beside it
  python DIR/smoke_probe.py --sglang-pattern 'sglang/srt/model_executor/*.py' > probe.out
  python -m builder smoke host --probe-output probe.out --sglang-wheel dist/sglang-….whl

exit status: 0 passed, 1 failed, 2 bad input (a flag, a wheel or report that cannot be
read), 3 misconfigured runner (the engine cannot give a container a GPU: no NVIDIA
runtime, or no driver).
"""


_WARM_EPILOG = """\
KEY is a JSON object with exactly: gpu_name, compute_capability, flashinfer_version,
release, hidden, experts, top_k, intermediate (per GPU), tp, dtype (bf16, fp8, nvfp4).

Where the server reads its files is SGLang's own key (a hash over the model path, dtype,
quantization, MoE backend, TP/PP/DP/EP sizes and config class): restore --model-path runs
the release's flashinfer_autotune_cache_path (sglang/srt/model_executor/runner/
flashinfer_autotune.py) in the target's behaviour environment, over the patched code, on a
CPU, for the server flags given after --, and writes every rank's file there
(under $SGLANG_CACHE_DIR, else ~/.cache/sglang, as the server reads it).

examples:
  # after a run on the GPU, keep every rank's FlashInfer autotune file for one MoE shape:
  python -m builder warm-cache capture --sglang-cache-dir ~/.cache/sglang --key key.json \\
      --output warm-cache.json
  # before a server start: every rank, where that server reads them, when the keys match
  python -m builder warm-cache restore --artifact warm-cache.json --key key.json \\
      --target sglang-0.5.23 --model-path /models/Qwen3-30B-A3B -- --tp-size 2
  # or one file, where you know it is read:
  python -m builder warm-cache restore --artifact warm-cache.json --key key.json \\
      --dest ~/.cache/sglang/flashinfer/autotune/0.6.14/sm90/HASH/rank_tp0_pp0_dp0.json

exit status: 0 (restore too when the artifact is missing, unreadable, of another key or
holds content capture would not keep: one warning, nothing written, so a server start
never waits on it; the server then tunes), 2 bad input (the key, capture's file that is
not FlashInfer's for that key, an output that is one of the inputs, flags the release
refuses or for which it runs another number of TP ranks than the key's tp, a --model-path
that is neither a folder nor a Hugging Face name (owner/name, or a bare name), or a
--dest that is not a file).
"""


def add_commands(commands: Any) -> None:
    """Add ``smoke``, ``warm-cache capture|restore`` and ``release image|wheels``."""
    smoke = add_command(
        commands, "smoke", reads=("json",),
        help="smoke-test the artifacts on a GPU runner (JSON report + summary)",
        description="Run the smoke checks in this Python environment (host) or in a built "
                    "image with every GPU attached (image). Runs with "
                    "FLASHINFER_DISABLE_JIT=1: a kernel missing from the kernel wheel fails, "
                    "it is never compiled.",
        epilog=_SMOKE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = smoke.add_subparsers(dest="smoke_mode", required=True, metavar="MODE")
    host = add_command(
        modes, "host", reads=("json",), help="test this Python environment (checks 1-7)",
        epilog=_SMOKE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _smoke_args(host)
    served = host.add_mutually_exclusive_group()
    served.add_argument("--model", type=Path, metavar="PATH",
                        help="a model folder: also launch SGLang and ask it for text (check 6)")
    served.add_argument("--tiny-model", action="store_true",
                        help="check 6 on a tiny Qwen3-MoE with random weights written by the "
                             "tested Python (torch + safetensors; no download, no tokenizer: "
                             "--skip-tokenizer-init and token ids)")
    host.add_argument("--parallel", action="store_true",
                      help="check 7: serve the model (--model or --tiny-model) at TP 1, TP 2 "
                           "EP 1 and TP 2 EP 2 and compare their greedy tokens (needs 2 GPUs)")
    host.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                      help="extra argument for sglang.launch_server (repeatable)")
    host.add_argument("--probe-output", type=Path, metavar="FILE",
                      help="judge this saved output of builder/smoke/script/smoke_probe.py (run "
                           "by hand where the builder is not installed) instead of running it")
    host.add_argument("--server-timeout", type=seconds, default=1800.0, metavar="SECONDS",
                      help="limit for the server to become ready (default: %(default)s)")
    host.set_defaults(handler=_cmd_smoke_host)
    image = add_command(
        modes, "image", reads=("json",),
        help="test a built image in a container with every GPU (checks 1-5)",
        epilog=_SMOKE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    image.add_argument("--image", metavar="REF", required=True,
                       help="the image to test; @FILE reads the image ID from the JSON that "
                            "`image --json` printed into FILE")
    _smoke_args(image)
    image.set_defaults(handler=_cmd_smoke_image)
    _add_warm_cache(commands)
    _add_release(commands)


def _render_smoke(report: SmokeReport, reporter: Reporter) -> None:
    from rich.table import Table

    table = Table(title=f"Smoke test ({report.mode} mode)")
    for column in ("check", "status", "counted", "detail"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        table.add_row(check.name, check.status, "yes" if check.required else "no",
                      check.detail)
    reporter.result(table)
    reporter.result(report.summary()[-1], style="bold")


def _smoke_args(parser: argparse.ArgumentParser) -> None:
    """The flags both modes of ``smoke`` read."""
    parser.add_argument("--python", metavar="PY",
                        help="interpreter of the tested environment (default: this one; in "
                             "an image: python3)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sglang-wheel", type=Path, metavar="WHEEL",
                       help="the sglang wheel being released: the installed one must be it")
    which.add_argument("--expect-provenance", type=Path, metavar="FILE",
                       help="compare the installed sglang's sm120-provenance.json with this")
    parser.add_argument("--series", type=Path, default=Path("patches/series.toml"),
                        metavar="FILE", help="series whose intent checks must hold in the "
                                             "installed sglang (default: %(default)s)")
    parser.add_argument("--moe", action="store_true",
                        help="count check 5 (fused MoE autotune) even when it cannot run")
    parser.add_argument("--timeout", type=seconds, default=3600.0, metavar="SECONDS",
                        help="limit for the probe, checks 1-5 (default: %(default)s)")
    parser.add_argument("--output", type=Path, metavar="FILE",
                        help="also write the JSON report here (written when it fails too)")


def _cmd_smoke_host(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.smoke.gpu import SmokeOptions

    return _smoke(args, reporter, SmokeOptions(
        mode="host", python=args.python, series=args.series,
        sglang_wheel=args.sglang_wheel, expect_provenance=args.expect_provenance,
        model=args.model, tiny_model=args.tiny_model, moe=args.moe, parallel=args.parallel,
        server_args=tuple(args.server_arg), probe_output=args.probe_output,
        probe_timeout=args.timeout, server_timeout=args.server_timeout, reporter=reporter))


def _cmd_smoke_image(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.smoke.gpu import SmokeOptions

    image = image_id_from(Path(args.image[1:])) if args.image.startswith("@") else args.image
    return _smoke(args, reporter, SmokeOptions(
        mode="image", image=image, python=args.python, series=args.series,
        sglang_wheel=args.sglang_wheel, expect_provenance=args.expect_provenance,
        moe=args.moe, probe_timeout=args.timeout, reporter=reporter))


def _smoke(args: argparse.Namespace, reporter: Reporter, smoke: SmokeOptions
           ) -> dict[str, Any]:
    """Run the smoke test, write and print its report (both modes).

    Raises:
        SmokeFailed: the smoke test failed (exit 1, or 3 on a misconfigured runner).
    """
    from builder.smoke.gpu import SmokeFailed, run_smoke, write_report

    report = run_smoke(smoke)
    if args.output is not None:
        write_report(report, args.output)
    _render_smoke(report, reporter)
    if not report.passed:
        raise SmokeFailed(report)
    return report.to_json()


def _add_warm_cache(commands: Any) -> None:
    warm = add_command(
        commands, "warm-cache", reads=("json",),
        help="capture the autotune file a GPU run wrote, keyed, or restore it",
        description="capture: keep the fused-MoE entries of FlashInfer's autotune files (every "
                    "rank SGLang's server wrote under --sglang-cache-dir, or --autotune-file) "
                    "for KEY's shape, with KEY, in one JSON artifact. restore: write every "
                    "rank where the server of --model-path and the flags after -- reads it (or "
                    "--dest) only when KEY equals the captured key and the content is what "
                    "capture keeps.",
        epilog=_WARM_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = warm.add_subparsers(dest="warm_action", required=True, metavar="ACTION")
    capture = add_command(actions, "capture", reads=("json",),
                          help="keep the autotune file's entries for KEY's shape",
                          epilog=_WARM_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _key_arg(capture)
    found = capture.add_mutually_exclusive_group(required=True)
    found.add_argument("--sglang-cache-dir", type=Path, metavar="DIR",
                       help="SGLang's cache folder ($SGLANG_CACHE_DIR) holding one run's "
                            "flashinfer/autotune/*/*/HASH/rank_*.json (every rank is kept)")
    found.add_argument("--autotune-file", type=Path, metavar="FILE",
                       help="FlashInfer's autotune file itself")
    capture.add_argument("--output", type=Path, required=True, metavar="FILE",
                         help="the artifact")
    capture.set_defaults(handler=_cmd_warm_cache_capture)
    restore = add_command(actions, "restore", reads=("json",),
                          help="write the artifact's file back when KEY equals its key",
                          epilog=_WARM_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _key_arg(restore)
    reads_shared(restore, "targets_file", "cache_dir")  # --model-path: the target's release
    target_arg(restore)
    index_url_arg(restore)
    restore.add_argument("--artifact", type=Path, required=True, metavar="FILE",
                         help="the artifact")
    where = restore.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-path", metavar="PATH",
                       help="the server's --model-path, as it will be given (it is in "
                            "SGLang's key): every rank's file goes where that server reads it")
    where.add_argument("--dest", type=Path, metavar="FILE",
                       help="one autotune file the server will read")
    # Where the server reads is under its SGLANG_CACHE_DIR: read from the same variable
    # (else ~/.cache/sglang, SGLang's default), never a second spelling of it.
    restore.add_argument("server_flags", nargs="*", metavar="-- ARG",
                         help="the flags the server starts with, after -- (with --model-path)")
    restore.set_defaults(handler=_cmd_warm_cache_restore)


def _key_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", type=Path, required=True, metavar="KEY",
                        help="JSON file of the key (see below)")


def _cmd_warm_cache_capture(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.smoke.warm_cache import run_warm_cache_capture

    result = run_warm_cache_capture(args.key, args.output, autotune_file=args.autotune_file,
                                    sglang_cache_dir=args.sglang_cache_dir)
    reporter.result(f"captured {result['entries']} autotune entries of "
                    f"{len(result['ranks'])} rank(s) from {result['source']} into {args.output}")
    return result


def _cmd_warm_cache_restore(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.smoke.warm_cache import WarmCacheKey, _read_key, run_warm_cache_restore

    paths = None
    if args.model_path is not None:
        from builder.smoke.autotune_path import check_model_path, release_autotune_paths

        check_model_path(args.model_path)  # before the release is fetched and run
        for token in args.server_flags:  # one model: SGLang's last --model-path would win
            flag = token.split("=", 1)[0]
            if flag == "--model" or (flag.startswith("--model-") and
                                     "--model-path".startswith(flag)):
                raise ConfigurationError(
                    f"{token} after --: the model is --model-path's (it is in SGLang's "
                    "key), given once", "drop it from the flags after --")
        key = WarmCacheKey.from_mapping(_read_key(args.key))
        run = options(args, reporter)
        if run.target is not None and run.target != key.release:
            raise ConfigurationError(f"--target {run.target} is not the key's release "
                                     f"{key.release}", "give the key's release as --target")
        run = dataclasses.replace(run, target=key.release)
        major, minor = (int(x) for x in key.compute_capability.split("."))
        paths = release_autotune_paths(run, ["--model-path", args.model_path,
                                             *args.server_flags], (major, minor))
    elif args.server_flags:
        raise ConfigurationError("server flags after -- go with --model-path (they are in "
                                 "SGLang's key); --dest names the file itself",
                                 "drop them, or give --model-path instead of --dest")
    result = run_warm_cache_restore(args.key, args.artifact, args.dest, paths=paths)
    files = ", ".join(result["dest"])
    reporter.result(f"restored {args.artifact} to {files}" if result["restored"]
                    else f"not restored: {files} left as they were")
    return result


_RELEASE_DESCRIPTION = (
    "Build the wheel and, with `release image`, the image; open the gate; and only then "
    "publish. The wheels go through twine (TWINE_USERNAME / TWINE_PASSWORD or keyring), "
    "after the index's simple page is read: the same file with the same sha256 counts as "
    "published, the same name with other bytes is an error, never an overwrite; the index "
    "must then list our sha256. The summary lists exactly what was published. Both modes "
    "build the same wheel and publish it through the same checks; only whether an image "
    "is built decides which gate can run.")


def _add_release(commands: Any) -> None:
    release = add_command(
        commands, "release",
        help="build, gate and publish: wheels and image, or wheels alone",
        description=_RELEASE_DESCRIPTION, epilog=_PUBLISH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = release.add_subparsers(dest="release_mode", required=True, metavar="MODE")
    image = add_command(
        modes, "image", help="wheels and image: the image gated, pushed",
        description=_RELEASE_DESCRIPTION + " --gate gpu (the default) runs the smoke test on "
                    "this runner's GPU inside the image, --gate static only reads the "
                    "provenance and the patched line inside the image; the image is pushed "
                    "(SGLANG_SM120_REGISTRY_USERNAME / _PASSWORD, or docker login).",
        epilog=_PUBLISH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(image)
    source_args(image)
    image_args(image)
    _index_args(image)
    image.add_argument("--gate", choices=("gpu", "static"), default="gpu",
                       help="gpu (default; the smoke test on this runner's GPU, in the "
                            "image) or static (provenance and patched line read in the "
                            "image, no GPU)")
    image.add_argument("--gate-series", type=Path, default=None, metavar="FILE",
                       help="series whose intent checks the gpu gate verifies in the image "
                            "(default: patches/series.toml beside the targets file)")
    image.set_defaults(handler=_cmd_release_image, validate=_validate_image, series=None,
                       patch=None, strip=1, max_fuzz=0)

    wheels = add_command(
        modes, "wheels", help="the wheel(s) alone: no image, no Docker Engine",
        description=_RELEASE_DESCRIPTION + " --gate smoke (the default) takes the smoke "
                    "test's report for this very wheel from a GPU runner (--smoke-report), "
                    "--gate build relies on the build's own checks.",
        epilog=_PUBLISH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(wheels)
    source_args(wheels)
    wheels.add_argument("--kernel-wheel", type=Path, action="append", default=[],
                        metavar="WHEEL", help="also publish this kernel stage's wheel "
                        "(repeatable), through the same gate and index checks")
    wheels.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                        help="where the wheels go (default: %(default)s)")
    _index_args(wheels)
    wheels.add_argument("--gate", choices=("smoke", "build"), default="smoke",
                        help="smoke (default; a passed --smoke-report for this wheel) or "
                             "build (the build's own checks alone)")
    wheels.add_argument("--smoke-report", type=Path, metavar="FILE",
                        help="--gate smoke: the report of `smoke host --sglang-wheel WHEEL "
                             "--output FILE` run on a GPU runner")
    wheels.set_defaults(handler=_cmd_release_wheels, validate=_validate_wheels, series=None,
                        patch=None, strip=1, max_fuzz=0)


def _index_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository-url", required=True, metavar="URL",
                        help="where twine uploads the wheels (pypiserver: its root URL)")
    parser.add_argument("--publish-index-url", metavar="URL",
                        help="the simple index of that repository, read to find files "
                             "already published (default: <repository-url>/simple/)")


def _validate_image(args: argparse.Namespace) -> None:
    """``release image``'s rules beyond argparse's (:func:`validate_source_args`').

    Raises:
        ConfigurationError: see :func:`validate_source_args`.
    """
    validate_source_args(args)


def _validate_wheels(args: argparse.Namespace) -> None:
    """``release wheels``' rules beyond argparse's.

    Raises:
        ConfigurationError: ``--smoke-report`` with ``--gate build``; see
            :func:`validate_source_args`.
    """
    validate_source_args(args)
    if args.smoke_report is not None and args.gate != "smoke":
        raise ConfigurationError("--smoke-report only applies with --gate smoke",
                                 "drop --smoke-report, or give --gate smoke")


_PUBLISH_EPILOG = """\
examples:
  # release wheels: on the GPU runner: build, install, smoke-test the wheel, keep the report
  python -m builder wheel --target sglang-0.5.9
  pip install dist/sglang-0.5.9+sm120.1-py3-none-any.whl
  python -m builder smoke host --sglang-wheel dist/sglang-0.5.9+sm120.1-py3-none-any.whl \\
      --output smoke.json
  # then publish exactly that wheel
  TWINE_USERNAME=... TWINE_PASSWORD=... python -m builder release \\
      wheels --target sglang-0.5.9 --repository-url https://index.example/ \\
      --smoke-report smoke.json
  # or on the build's own checks alone (no GPU proof)
  python -m builder release wheels --repository-url http://127.0.0.1:8080/ --gate build
  # wheels and image, the image smoke-tested on this runner's GPU
  python -m builder release image --registry 127.0.0.1:5000 --repository-url http://127.0.0.1:8080/
"""


def _cmd_release_wheels(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.release.publish import Index
    from builder.release.wheels import run_release_wheels

    index = Index.from_urls(args.repository_url, args.publish_index_url)
    summary = run_release_wheels(options(args, reporter), index, gate=args.gate,
                                 smoke_report=args.smoke_report,
                                 kernel_wheels=tuple(args.kernel_wheel))
    reporter.raw("".join(line + "\n" for line in summary.lines()))
    return summary.to_json()


def _cmd_release_image(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.release.publish import Index
    from builder.release.run import gpu_gate, run_release, static_gate

    index = Index.from_urls(args.repository_url, args.publish_index_url)
    image = image_options_from(args)
    gate = gpu_gate(docker_host=image.docker_host, series=args.gate_series) \
        if args.gate == "gpu" else static_gate
    summary = run_release(options(args, reporter), image, index, gate=gate)
    reporter.raw("".join(line + "\n" for line in summary.lines()))
    return summary.to_json()
